"""fp8_ds_mla caches (DeepSeek-V3.2; vLLM's kv_cache_dtype "fp8_ds_mla", FlashMLA's "FP8
with scale"): one record of E = Dl + Dl / 32 + 2 Dr bytes per token (Dl e4m3 codes, Dl / 128
f32 tile scales, Dr bf16 rope values; 656 for 512 + 64). Against a NumPy reference of the
format written here: concat_and_cache_mla's bytes exactly (f32 / f16 / bf16 inputs, NumPy
and torch, block sizes 1 / 16 / 64, padding slots, N < T, strided inputs, the cache forms,
vLLM's test_concat_and_cache_ds_mla grid, NaN / inf / zero / tiny tiles);
cp_gather_and_upconvert_fp8_kv_cache and gather_and_maybe_dequant_cache equal to the
reference dequantization rounded once (vLLM's workspace_starts, gaps and reordered starts,
untouched rows, errors that leave dst as it was); flash_mla_with_kvcache on a record cache
bit for bit that of an f32 cache of the values and within the output dtype's tolerance of a
float64 attention; the torch ops; errors naming the arguments."""
import random

import numpy as np
import pytest

import llmkern as lk
from llmkern import ops
from helpers import close, f64, ref_mla, torch_or_skip

ml = pytest.importorskip("ml_dtypes")
E4, BF16 = ml.float8_e4m3fn, ml.bfloat16
FLT_MIN = np.float32(np.finfo(np.float32).tiny)
U = {2: np.uint16, 4: np.uint32}  # bit views for exact comparisons


def rec_bytes(dl, dr):
    return dl + dl // 32 + 2 * dr


def f32_of(x):
    """The values as stored, as f32 (exact from f32 / f16 / bf16), NumPy or torch."""
    if hasattr(x, "detach"):
        return x.detach().float().numpy()
    return np.asarray(x).astype(np.float32)


def ref_records(kv_c, k_pe):
    """The records [T, E] (uint8) of kv_c [T, Dl], k_pe [T, Dr]: per 128-dim tile g
    s_g = max(f32(absmax / 448), FLT_MIN) (NaN ignored), codes = e4m3(f32(x / s_g)) (round
    to nearest even, saturated to +-448, NaN kept), then the scales' bytes, then
    bf16(k_pe) (round to nearest even)."""
    x, r = f32_of(kv_c), f32_of(k_pe)
    t, dl = x.shape
    tiles = x.reshape(t, dl // 128, 128)
    a = np.abs(tiles)
    amax = np.where(np.isnan(a), np.float32(-np.inf), a).max(axis=2)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        s = np.maximum(amax / np.float32(448.0), FLT_MIN).astype(np.float32)
        q = tiles / s[:, :, None]  # one f32 division
    q = np.clip(q, -448.0, 448.0).astype(np.float32)  # NaN stays NaN; ml_dtypes would give NaN past 464
    codes = q.astype(E4).view(np.uint8).reshape(t, dl)
    scales = np.ascontiguousarray(s).view(np.uint8).reshape(t, dl // 32)
    rope = np.ascontiguousarray(r.astype(BF16)).view(np.uint8).reshape(t, -1)
    return np.concatenate([codes, scales, rope], axis=1)


def ref_values(recs, dl):
    """[..., E] records -> their entries' f32 values [..., Dl + Dr]: f32(code) * s_g (one f32
    multiplication), the rope dims as bf16."""
    r = np.ascontiguousarray(recs).view(np.uint8)
    lead, e = r.shape[:-1], r.shape[-1]
    r = r.reshape(-1, e)
    codes = r[:, :dl].view(E4).astype(np.float32).reshape(-1, dl // 128, 128)
    s = np.ascontiguousarray(r[:, dl:dl + dl // 32]).view(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        lat = (codes * s[:, :, None]).reshape(-1, dl)
    rope = np.ascontiguousarray(r[:, dl + dl // 32:]).view(BF16).astype(np.float32)
    return np.concatenate([lat, rope], axis=1).reshape(lead + (dl + rope.shape[1],))


def bits(x):
    """An exact-comparison view (NumPy or torch, any float dtype)."""
    if hasattr(x, "detach"):
        import torch
        return x.contiguous().view({2: torch.int16, 4: torch.int32}[x.element_size()]).numpy()
    x = np.ascontiguousarray(x)
    return x.view(U[x.itemsize])


def as_dtype(vals, like_dtype):
    """f32 values rounded once to a NumPy / ml_dtypes dtype."""
    return vals.astype(like_dtype)


def tile_spread(rng, t, dl, dr, dtype, spread=3.0):
    """kv_c [t, dl] with tiles of magnitudes 10^[-spread, spread] (one all-zero tile, and in
    f32 one tiny tile whose absmax / 448 is below FLT_MIN), k_pe [t, dr]."""
    x = rng.standard_normal((t, dl // 128, 128)) * 10.0 ** rng.uniform(-spread, spread, (t, dl // 128, 1))
    x[0, 0] = 0.0
    if dtype == np.float32 and t > 1:
        x[1, -1] *= 1e-36 / np.abs(x[1, -1]).max()
    kv_c = x.reshape(t, dl).astype(dtype)
    k_pe = (rng.standard_normal((t, dr)) * 3).astype(dtype)
    return kv_c, k_pe


def written(cache0, recs, slots, n):
    """cache0 with the records of tokens t < n whose slot >= 0 stored."""
    want = cache0.copy()
    bs = cache0.shape[1]
    flat = want.reshape(cache0.shape[0] * bs, -1)
    for t in range(n):
        if slots[t] >= 0:
            flat[slots[t]] = recs[t]
    return want


# ---------------------------------------------------------------- writes


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16])
@pytest.mark.parametrize("bs", [1, 16, 64])
def test_write_numpy(rng, dtype, bs):
    T, N, DL, DR = 9, 7, 256, 32
    E = rec_bytes(DL, DR)
    nb = (T + bs - 1) // bs + 1
    kv_c, k_pe = tile_spread(rng, T, DL, DR, dtype)
    cache = rng.integers(0, 256, (nb, bs, E), dtype=np.uint8)
    cache0 = cache.copy()
    slots = rng.permutation(nb * bs)[:N].astype(np.int64)
    slots[3] = -1  # padding
    lk.concat_and_cache_mla(kv_c, k_pe, cache, slots, "fp8_ds_mla", None)
    want = written(cache0, ref_records(kv_c, k_pe), slots, N)
    assert np.array_equal(cache, want)
    # strided views of one wider buffer (row stride != Dl), slot_mapping int32
    buf = np.zeros((T, DL + DR + 40), dtype)
    buf[:, 8:8 + DL], buf[:, DL + 24:DL + 24 + DR] = kv_c, k_pe
    cache2 = cache0.copy()
    lk.concat_and_cache_mla(buf[:, 8:8 + DL], buf[:, DL + 24:DL + 24 + DR], cache2, slots.astype(np.int32),
                            "fp8_ds_mla", 1.0)
    assert np.array_equal(cache2, want)


def test_write_element_strided_and_forms(rng):
    T, DL, DR, NB, BS = 5, 128, 16, 3, 4
    E = rec_bytes(DL, DR)
    kv_c, k_pe = tile_spread(rng, T, DL, DR, np.float32)
    slots = np.array([4, 0, 11, -1, 7])
    base = np.zeros((NB, BS, E), np.uint8)
    lk.concat_and_cache_mla(kv_c, k_pe, base, slots, "fp8_ds_mla", None)
    assert np.array_equal(base, written(np.zeros_like(base), ref_records(kv_c, k_pe), slots, T))
    # element stride 2 and a transposed k_pe
    wide = np.zeros((T, 2 * DL), np.float32)
    wide[:, ::2] = kv_c
    pe_t = np.ascontiguousarray(k_pe.T).T
    c = np.zeros_like(base)
    lk.concat_and_cache_mla(wide[:, ::2], pe_t, c, slots, "fp8_ds_mla", None)
    assert np.array_equal(c, base)
    # FlashMLA's [blocks, page, 1, E], float8_e4m3fn and int8 buffers, scale forms (ignored)
    for cache, scale in ((np.zeros((NB, BS, 1, E), np.uint8), np.array(0.5, np.float32)),
                         (np.zeros((NB, BS, E), E4), np.array([3.0], np.float32)),
                         (np.zeros((NB, BS, E), np.int8), np.float32(2.0))):
        lk.concat_and_cache_mla(kv_c, k_pe, cache, slots, "fp8_ds_mla", scale)
        assert np.array_equal(cache.view(np.uint8).reshape(base.shape), base)


def test_write_specials():
    DL, DR = 128, 16
    x = np.linspace(-3, 3, 4 * DL, dtype=np.float32).reshape(4, DL)
    x[0, 5], x[0, 7] = np.nan, -0.0  # NaN ignored by the absmax
    x[1, 9] = np.inf  # the tile's scale is inf: it reads back NaN
    x[2] = np.nan  # no finite value: scale FLT_MIN
    x[3, :] = 0.0
    x[3, 1] = 7e-39  # subnormal input, its quotient a small e4m3 value
    pe = np.ones((4, DR), np.float32) * np.float32(1.00390625)  # bf16 rounding: a tie, to even
    c = np.zeros((1, 4, rec_bytes(DL, DR)), np.uint8)
    lk.concat_and_cache_mla(x, pe, c, np.arange(4), "fp8_ds_mla", None)
    want = ref_records(x, pe)
    got = c[0]
    nan = np.isnan(want[:, :DL].view(E4).astype(np.float32))
    assert nan[0, 5] and nan[1, 9] and nan[2].all()
    assert np.array_equal(got[:, :DL][~nan], want[:, :DL][~nan])
    assert np.all(got[:, :DL][nan] & 0x7F == 0x7F)  # e4m3's NaN, either sign
    assert np.array_equal(got[:, DL:], want[:, DL:])
    s = np.ascontiguousarray(got[:, DL:DL + DL // 32]).view(np.float32)[:, 0]
    assert s[0] == np.float32(3.0) / np.float32(448) and np.isinf(s[1]) and s[2] == FLT_MIN and s[3] == FLT_MIN
    assert got[0, 7] == 0x80  # -0.0
    vals = ref_values(got, DL)
    assert np.isnan(vals[1, :DL]).all() and np.isnan(vals[2, :DL]).all()
    assert np.all(vals[:, DL:] == 1.0)  # 1 + 2^-8 rounds to even in bf16


@pytest.mark.parametrize("dtname", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("block_size", [16, 64])
def test_write_torch_vllm_grid(dtname, block_size):
    """vLLM's test_concat_and_cache_ds_mla: kv_lora_rank 512, rope 64, 42 tokens, 8 blocks,
    a uint8 cache of 656-byte entries; here against the reference bytes exactly."""
    torch = torch_or_skip()
    dtype = getattr(torch, dtname)
    kv_lora_rank, rope, num_tokens, num_blocks = 512, 64, 42, 8
    random.seed(0)
    g = torch.Generator().manual_seed(0)
    slot_mapping = torch.tensor(random.sample(range(num_blocks * block_size), num_tokens), dtype=torch.long)
    kv_c = torch.randn(num_tokens, kv_lora_rank, generator=g).to(dtype)
    k_pe = torch.randn(num_tokens, rope, generator=g).to(dtype)
    entry = kv_lora_rank + 4 * 4 + 2 * rope
    assert entry == 656
    kv_cache = torch.zeros(num_blocks, block_size, entry, dtype=torch.uint8)
    lk.concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, "fp8_ds_mla", torch.tensor(1.0))
    want = written(np.zeros((num_blocks, block_size, entry), np.uint8), ref_records(kv_c, k_pe),
                   slot_mapping.numpy(), num_tokens)
    assert np.array_equal(kv_cache.numpy(), want)
    # vLLM's views of one entry: scales at float32 [128:132], rope at bf16 [264:]
    s0 = int(slot_mapping[0])
    rec = kv_cache[s0 // block_size, s0 % block_size]
    tiles = kv_c[0].float().reshape(4, 128).abs().amax(1) / 448.0
    assert torch.equal(rec.view(torch.float32)[128:132], tiles)
    assert torch.equal(rec.view(torch.bfloat16)[264:], k_pe[0].to(torch.bfloat16))
    # a float8_e4m3fn cache, and the registered op
    import llmkern.torch  # noqa: F401
    f8 = torch.zeros(num_blocks, block_size, entry, dtype=torch.float8_e4m3fn)
    torch.ops.llmkern.concat_and_cache_mla(kv_c, k_pe, f8, slot_mapping, "fp8_ds_mla", torch.tensor(1.0))
    assert torch.equal(f8.view(torch.uint8), kv_cache)


def test_write_errors(rng):
    T, DL, DR = 3, 128, 16
    E = rec_bytes(DL, DR)
    kv_c, k_pe = tile_spread(rng, T, DL, DR, np.float32)
    slots = np.array([0, 1, 2])
    c = np.full((2, 4, E), 9, np.uint8)
    with pytest.raises(ValueError, match="layout: 'NZ'"):
        lk.concat_and_cache_mla(kv_c, k_pe, c, slots, "fp8_ds_mla", None, layout="NZ")
    with pytest.raises(ValueError, match="k_pe_cache"):
        lk.concat_and_cache_mla(kv_c, k_pe, c, slots, "fp8_ds_mla", None, k_pe_cache=np.zeros((2, 4, DR), np.uint8))
    with pytest.raises(ValueError, match="scale"):
        lk.concat_and_cache_mla(kv_c, k_pe, c, slots, "fp8_ds_mla", np.ones(3, np.float32))
    with pytest.raises(TypeError, match="kv_cache: dtype float32"):
        lk.concat_and_cache_mla(kv_c, k_pe, np.zeros((2, 4, E), np.float32), slots, "fp8_ds_mla", None)
    with pytest.raises(TypeError, match="kv_cache"):
        lk.concat_and_cache_mla(kv_c, k_pe, np.zeros((2, 4, E), ml.float8_e5m2), slots, "fp8_ds_mla", None)
    with pytest.raises(lk.LlmkernError, match="kv_cache") as e:  # E - 2 bytes
        lk.concat_and_cache_mla(kv_c, k_pe, np.zeros((2, 4, E - 2), np.uint8), slots, "fp8_ds_mla", None)
    assert e.value.status == "LK_ERR_SHAPE"
    with pytest.raises(lk.LlmkernError):  # Dl = 64: not a multiple of 128
        lk.concat_and_cache_mla(kv_c[:, :64], k_pe, np.zeros((2, 4, rec_bytes(64, DR)), np.uint8), slots,
                                "fp8_ds_mla", None)
    with pytest.raises(lk.LlmkernError, match="slot_mapping"):
        lk.concat_and_cache_mla(kv_c, k_pe, c, np.array([0, 8, 1]), "fp8_ds_mla", None)
    ro = c.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="kv_cache: the array is read-only"):
        lk.concat_and_cache_mla(kv_c, k_pe, ro, slots, "fp8_ds_mla", None)
    assert np.all(c == 9)


# ---------------------------------------------------------------- gathers


def ds_cache(rng, lens, dl=128, dr=16, bs=4, dtype=np.float32, spare=2, spread=3.0):
    """A record cache (random bytes in the slots no request uses), block_table [B, maxp]
    (-1 past each request's pages), and each request's record rows in logical order."""
    e = rec_bytes(dl, dr)
    pages = [(n + bs - 1) // bs for n in lens]
    nb = sum(pages) + spare
    perm = rng.permutation(nb)
    maxp = max(pages + [1]) + 1
    bt = np.full((len(lens), maxp), -1, np.int32)
    cache = rng.integers(0, 256, (nb, bs, e), dtype=np.uint8)
    recs, k = [], 0
    for b, n in enumerate(lens):
        bt[b, :pages[b]] = perm[k:k + pages[b]]
        k += pages[b]
        kv_c, k_pe = tile_spread(rng, max(n, 1), dl, dr, dtype, spread)
        r = ref_records(kv_c, k_pe)[:n]
        for j in range(n):
            cache[bt[b, j // bs], j % bs] = r[j]
        recs.append(r)
    return cache, bt, np.array(lens, np.int32), recs


@pytest.mark.parametrize("dt", [np.float32, np.float16, BF16])
def test_upconvert_numpy(rng, dt):
    lens = [5, 0, 17, 3]
    cache, bt, sl, recs = ds_cache(rng, lens)
    C = 144
    want = [as_dtype(ref_values(r, 128), dt) for r in recs]
    cases = [np.array([0, 5, 5, 22], np.int32),  # vLLM's: the running sum
             np.array([3, 8, 8, 25], np.int32),  # the running sum from an offset
             np.array([30, 0, 8, 2], np.int32),  # gaps, another order, an empty request anywhere
             np.array([26, 40, 0, 20], np.int32)]  # the empty request at the end
    for ws in cases:
        dst = np.full((40, C), -7.0, np.float32).astype(dt)
        ops.cp_gather_and_upconvert_fp8_kv_cache(cache, dst, bt, sl, ws, 4)
        covered = np.zeros(40, bool)
        for b, n in enumerate(lens):
            assert np.array_equal(bits(dst[ws[b]:ws[b] + n]), bits(want[b]))
            covered[ws[b]:ws[b] + n] = True
        assert np.all(dst[~covered].astype(np.float32) == -7.0)  # sentinel rows untouched
    # batch_size < B: only the first requests
    dst = np.full((40, C), -7.0, np.float32).astype(dt)
    ops.cp_gather_and_upconvert_fp8_kv_cache(cache, dst, bt, sl, cases[2], 1)
    assert np.array_equal(bits(dst[30:35]), bits(want[0]))
    assert np.all(dst[:30].astype(np.float32) == -7.0) and np.all(dst[35:].astype(np.float32) == -7.0)
    # [blocks, page, 1, E] and float8_e4m3fn caches read the same
    for c in (cache[:, :, None, :], cache.view(E4)):
        d2 = np.full((40, C), -7.0, np.float32).astype(dt)
        ops.cp_gather_and_upconvert_fp8_kv_cache(c, d2, bt, sl, cases[2], 1)
        assert np.array_equal(bits(d2), bits(dst))


def test_upconvert_specials_read_back():
    DL, DR = 128, 16
    x = np.ones((2, DL), np.float32)
    x[0, 3] = np.inf
    c = np.zeros((1, 2, rec_bytes(DL, DR)), np.uint8)
    lk.concat_and_cache_mla(x, np.ones((2, DR), np.float32), c, np.arange(2), "fp8_ds_mla", None)
    dst = np.zeros((2, DL + DR), np.float32)
    ops.cp_gather_and_upconvert_fp8_kv_cache(c, dst, np.zeros((1, 1), np.int32), np.array([2], np.int32),
                                             np.array([0], np.int32), 1)
    assert np.isnan(dst[0, :DL]).all() and np.all(dst[1, :DL] == 1.0) and np.all(dst[:, DL:] == 1.0)


def test_upconvert_errors(rng):
    lens = [5, 0, 17, 3]
    cache, bt, sl, _ = ds_cache(rng, lens)
    dst = np.full((40, 144), -7.0, np.float32)

    def fails(exc, match, *args, **kw):
        a = dict(src_cache=cache, dst=dst, block_table=bt, seq_lens=sl,
                 workspace_starts=np.array([0, 5, 5, 22], np.int32), batch_size=4)
        a.update(kw)
        with pytest.raises(exc, match=match) as e:
            ops.cp_gather_and_upconvert_fp8_kv_cache(**a)
        assert np.all(dst == -7.0)  # nothing written
        return e.value

    fails(ValueError, r"workspace_starts: the rows of requests 0 \[0, 5\) and 2 \[2, 19\) overlap",
          workspace_starts=np.array([0, 30, 2, 30], np.int32))
    fails(ValueError, "workspace_starts: the rows of requests 2 .* and 3 .* overlap",
          workspace_starts=np.array([30, 0, 0, 16], np.int32))
    fails(IndexError, r"workspace_starts: workspace_starts\[2\] = 30: request 2's rows \[30, 47\) are outside dst's 40",
          workspace_starts=np.array([0, 5, 30, 22], np.int32))
    fails(IndexError, "workspace_starts", workspace_starts=np.array([-1, 5, 5, 22], np.int32))
    for name in ("block_table", "seq_lens", "workspace_starts"):
        kw = {"block_table": bt, "seq_lens": sl, "workspace_starts": np.array([0, 5, 5, 22], np.int32)}
        fails(TypeError, "%s: dtype int64, expected int32" % name, **{name: kw[name].astype(np.int64)})
    for bad in (5, -1, 2.0, None):
        fails(ValueError, "batch_size", batch_size=bad)
    fails(ValueError, "dst: shape", dst=dst.reshape(40, 12, 12))
    fails(TypeError, "src_cache: dtype float32", src_cache=cache.astype(np.float32))
    for ws in ([0, 5, 5, 22], [30, 0, 8, 2]):  # not [rows, Dl + Dr] of these records: one call, one per request
        e = fails(lk.LlmkernError, "dst", dst=dst[:, :140], workspace_starts=np.array(ws, np.int32))
        assert e.status == "LK_ERR_SHAPE"
    bt2 = bt.copy()
    bt2[2, 4] = cache.shape[0]  # a page request 2 reads (tokens 16..)
    for ws in ([0, 5, 5, 22], [30, 0, 8, 2]):  # one call, and one call per request
        e = fails(lk.LlmkernError, "block_table", block_table=bt2, workspace_starts=np.array(ws, np.int32))
        assert e.status == "LK_ERR_INDEX"
    sl2 = sl.copy()
    sl2[3] = bt.shape[1] * 4 + 1
    fails(lk.LlmkernError, r"seq_lens\[3\]", seq_lens=sl2, workspace_starts=np.array([0, 5, 5, 22], np.int32),
          dst=np.full((60, 144), -7.0, np.float32))
    sl2[3] = -1
    fails(lk.LlmkernError, r"seq_lens\[3\] = -1", seq_lens=sl2)
    ro = dst.copy()
    ro.flags.writeable = False
    fails(ValueError, "dst: the array is read-only", dst=ro)


def test_upconvert_dst_overlapping_cache(rng):
    cache, bt, sl, _ = ds_cache(rng, [5, 3])
    buf = np.zeros(cache.nbytes + 10 * 144 * 4, np.uint8)
    c = buf[:cache.nbytes].reshape(cache.shape)
    c[...] = cache
    dst = buf[cache.nbytes - 2 * 576:cache.nbytes + 8 * 576].view(np.float32).reshape(10, 144)  # 2 rows in the cache
    keep = buf.copy()
    for ws in ([0, 5], [5, 0]):
        with pytest.raises(lk.LlmkernError, match="overlap") as e:
            ops.cp_gather_and_upconvert_fp8_kv_cache(c, dst, bt, sl, np.array(ws, np.int32), 2)
        assert e.value.status == "LK_ERR_ALIAS" and np.array_equal(buf, keep)


def test_upconvert_torch_vllm_and_op(rng):
    """vLLM's shapes: uint8 [num_blocks, 64, 656] records written by concat_and_cache_mla
    from bf16, dst bf16 [tot_tokens, 576], the registered op with vLLM's schema."""
    torch = torch_or_skip()
    import llmkern.torch as lkt  # noqa: F401
    lens, bs = [70, 1, 130], 64
    pages = [(n + bs - 1) // bs for n in lens]
    nb = sum(pages) + 1
    perm = rng.permutation(nb)
    bt = np.zeros((3, max(pages)), np.int32)
    slots, k = [], 0
    for b, n in enumerate(lens):
        bt[b, :pages[b]] = perm[k:k + pages[b]]
        k += pages[b]
        slots += [int(bt[b, j // bs]) * bs + j % bs for j in range(n)]
    g = torch.Generator().manual_seed(1)
    kv_c = torch.randn(len(slots), 512, generator=g).to(torch.bfloat16)
    k_pe = torch.randn(len(slots), 64, generator=g).to(torch.bfloat16)
    cache = torch.zeros(nb, bs, 656, dtype=torch.uint8)
    lk.concat_and_cache_mla(kv_c, k_pe, cache, torch.tensor(slots), "fp8_ds_mla", torch.tensor(1.0))
    tbt, tsl = torch.from_numpy(bt), torch.tensor(lens, dtype=torch.int32)
    ws = torch.tensor([0, 70, 71], dtype=torch.int32)
    dst = torch.full((201, 576), -7.0, dtype=torch.bfloat16)
    torch.ops.llmkern.cp_gather_and_upconvert_fp8_kv_cache(cache, dst, tbt, tsl, ws, 3)
    want = torch.from_numpy(ref_values(ref_records(kv_c, k_pe), 512)).to(torch.bfloat16)
    assert torch.equal(dst.view(torch.int16), want.view(torch.int16))
    assert torch.equal(dst[:, 512:], k_pe)  # the rope dims as stored
    # e4m3: within half a step (2^-4 relative; 2^-10 s below the normal range), bf16 on top
    np.testing.assert_allclose(f64(dst[:, :512]), f64(kv_c), rtol=2 ** -4 + 2 ** -8,
                               atol=float(kv_c.float().abs().max()) / 448 * 2 ** -9)
    # vLLM's schema; opcheck (schema / mutation marks, fake tensors, autograd, AOT dispatch)
    schema = ("cp_gather_and_upconvert_fp8_kv_cache(Tensor src_cache, Tensor! dst, Tensor block_table, "
              "Tensor seq_lens, Tensor workspace_starts, int batch_size) -> ()")
    got = torch.ops.llmkern.cp_gather_and_upconvert_fp8_kv_cache.default._schema
    parse = torch._C.parse_schema(schema)
    assert [(a.name, str(a.type), bool(a.alias_info and a.alias_info.is_write)) for a in got.arguments] == \
        [(a.name, str(a.type), bool(a.alias_info and a.alias_info.is_write)) for a in parse.arguments]
    assert "cp_gather_and_upconvert_fp8_kv_cache" in lkt.OPS
    torch.library.opcheck(torch.ops.llmkern.cp_gather_and_upconvert_fp8_kv_cache.default,
                          (cache, torch.zeros(201, 576, dtype=torch.bfloat16), tbt, tsl, ws, 3))
    # reordered starts through the op
    ws2 = torch.tensor([131, 130, 0], dtype=torch.int32)
    d2 = torch.full((201, 576), -7.0, dtype=torch.bfloat16)
    torch.ops.llmkern.cp_gather_and_upconvert_fp8_kv_cache(cache, d2, tbt, tsl, ws2, 3)
    assert torch.equal(d2[131:201], dst[:70]) and torch.equal(d2[130], dst[70]) and torch.equal(d2[:130], dst[71:])


def test_gather_and_maybe_dequant_ds(rng):
    lens = [6, 9]
    cache, bt, sl, recs = ds_cache(rng, [10, 13])
    cu = np.array([0, 6, 15], np.int32)
    starts = np.array([3, 2], np.int32)  # chunked context: token j of request b at position starts[b] + j
    dst = np.full((16, 144), -7.0, np.float32)
    lk.gather_and_maybe_dequant_cache(cache, dst, bt, cu, 2, "fp8_ds_mla", None, starts)
    for b in range(2):
        want = ref_values(recs[b][starts[b]:starts[b] + lens[b]], 128)
        assert np.array_equal(bits(dst[cu[b]:cu[b + 1]]), bits(want))
    assert np.all(dst[15] == -7.0)
    h = np.zeros((15, 144), np.float16)  # without seq_starts, f16 out, vLLM's token_to_seq form
    lk.gather_and_maybe_dequant_cache(cache, h, bt, cu, np.array([0] * 6 + [1] * 9, np.int32), 15, "fp8_ds_mla",
                                      np.float32(1.0))
    want = np.concatenate([ref_values(recs[0][:6], 128), ref_values(recs[1][:9], 128)]).astype(np.float16)
    assert np.array_equal(bits(h), bits(want))
    with pytest.raises(ValueError, match="layout"):
        lk.gather_and_maybe_dequant_cache(cache, h, bt, cu, 2, "fp8_ds_mla", None, layout="NZ")
    with pytest.raises(TypeError, match="src_cache"):
        lk.gather_and_maybe_dequant_cache(cache.astype(np.float32), h, bt, cu, 2, "fp8_ds_mla", None)


# ---------------------------------------------------------------- FlashMLA decode


def f32_twin(cache, dl):
    """The f32 cache [blocks, page, 1, Dl + Dr] of the records' values (whatever the unused
    slots' random bytes decode to, NaN included)."""
    return ref_values(cache, dl)[:, :, None, :]


@pytest.mark.parametrize("dt,sq,causal", [(np.float32, 1, False), (np.float32, 2, True), (np.float16, 1, False)])
def test_flash_mla_numpy(rng, dt, sq, causal):
    lens, H, DL, DR = [37, 0, 130], 4, 128, 16
    cache, bt, sl, recs = ds_cache(rng, lens, dl=DL, dr=DR, bs=16, spread=0.3)
    q = rng.uniform(-1, 1, (3, sq, H, DL + DR)).astype(dt)
    twin = f32_twin(cache, DL)
    want_o, want_l = lk.flash_mla_with_kvcache(q, twin, bt, sl, DL, None, None, softmax_scale=0.2, causal=causal)
    meta, ns = lk.get_mla_metadata(sl, sq * H, 1)
    forms = [(cache[:, :, None, :], dict(is_fp8_kvcache=True)), (cache, dict(kv_cache_dtype="fp8_ds_mla")),
             (cache.view(E4)[:, :, None, :], dict(is_fp8_kvcache=True)),
             (cache.view(np.int8), dict(kv_cache_dtype="fp8_ds_mla", descale_q=1.0))]
    for c, kw in forms:
        o, lse = lk.flash_mla_with_kvcache(q, c, bt, sl, DL, meta, ns, softmax_scale=0.2, causal=causal, **kw)
        assert o.dtype == dt and o.shape == (3, sq, H, DL) and lse.shape == (3, H, sq)
        assert np.array_equal(bits(o), bits(want_o)) and np.array_equal(bits(lse), bits(want_l))
    assert np.isfinite(o).all() and (o[1] == 0).all() and np.isneginf(lse[1]).all()
    ent = [ref_values(r, DL).astype(np.float64) for r in recs]
    ref_o, ref_l = ref_mla(f64(q), ent, lens, DL, 0.2, causal)
    close(o, ref_o)
    np.testing.assert_allclose(np.where(np.isinf(lse), 0, lse), np.where(np.isinf(ref_l), 0, ref_l),
                               rtol=1e-5, atol=1e-5)
    # descale_q multiplies the scores as for the other caches
    o2, _ = lk.flash_mla_with_kvcache(q, cache, bt, sl, DL, None, None, softmax_scale=0.1, causal=causal,
                                      descale_q=2.0, kv_cache_dtype="fp8_ds_mla")
    assert np.array_equal(bits(o2), bits(want_o))


def test_flash_mla_torch_bf16_512(rng):
    torch = torch_or_skip()
    import llmkern.torch  # noqa: F401
    lens, H, bs = [200, 1], 16, 64
    cache, bt, sl, recs = ds_cache(rng, lens, dl=512, dr=64, bs=bs, spread=0.3)
    tq = torch.from_numpy(rng.uniform(-1, 1, (2, 1, H, 576)).astype(np.float32)).to(torch.bfloat16)
    tc, tbt, tsl = torch.from_numpy(cache[:, :, None, :].copy()), torch.from_numpy(bt), torch.from_numpy(sl)
    meta, ns = lk.get_mla_metadata(tsl, H, 1)
    o, lse = lk.flash_mla_with_kvcache(tq, tc, tbt, tsl, 512, meta, ns, is_fp8_kvcache=True)
    assert o.dtype == torch.bfloat16 and o.shape == (2, 1, H, 512)
    twin = torch.from_numpy(f32_twin(cache, 512))
    wo, wl = lk.flash_mla_with_kvcache(tq, twin, tbt, tsl, 512, meta, ns)
    ent = [ref_values(r, 512).astype(np.float64) for r in recs]
    if lk.isa() == "avx512bf16":  # bf16 q and out: the bf16 dot products (docs/numerics.md), not the f32 cache's bits
        emax, a, b = max(np.abs(e).max() for e in ent), o.float().numpy(), wo.float().numpy()
        assert (np.abs(a - b) <= 2.0 ** -8 * (emax + 2 * np.abs(b))).all()  # P s and both outs rounded to bf16
        np.testing.assert_allclose(lse.numpy(), wl.numpy(), rtol=1e-5, atol=1e-5)
    else:
        assert torch.equal(o.view(torch.int16), wo.view(torch.int16)) and torch.equal(lse, wl)
    ref_o, ref_l = ref_mla(f64(tq), ent, lens, 512, 576 ** -0.5, False)
    close(o, ref_o)
    np.testing.assert_allclose(lse.numpy(), ref_l, rtol=1e-4, atol=1e-4)
    # the registered op, both spellings
    for kw in (dict(kv_cache_dtype="fp8_ds_mla"), dict(is_fp8_kvcache=True)):
        oo, ll = torch.ops.llmkern.flash_mla_with_kvcache(tq, tc, tbt, tsl, 512, meta, ns, **kw)
        assert torch.equal(oo.view(torch.int16), o.view(torch.int16)) and torch.equal(ll, lse)


def test_flash_mla_errors_and_per_tensor_meaning(rng):
    lens, H, DL, DR = [20, 3], 2, 128, 16
    cache, bt, sl, _ = ds_cache(rng, lens, dl=DL, dr=DR, bs=16)
    q = rng.uniform(-1, 1, (2, 1, H, DL + DR)).astype(np.float32)
    out = np.full((2, 1, H, DL), 7.0, np.float32)

    def fails(exc, match, c=cache, **kw):
        with pytest.raises(exc, match=match):
            lk.flash_mla_with_kvcache(q, c, bt, sl, DL, None, None, out=out, **kw)
        assert np.all(out == 7.0)

    fails(ValueError, r"k_cache: last dim 162, expected E = .* = 164", c=cache[..., :-2], kv_cache_dtype="fp8_ds_mla")
    fails(ValueError, "descale_k: must be None", descale_k=1.0, kv_cache_dtype="fp8_ds_mla")
    fails(ValueError, "descale_k: must be None", descale_k=np.array([0.5], np.float32), is_fp8_kvcache=True)
    fails(ValueError, "k_pe_cache: must be None", k_pe_cache=np.zeros((cache.shape[0], 16, DR), np.uint8),
          kv_cache_dtype="fp8_ds_mla")
    fails(ValueError, "kv_layout: 'NZ'", kv_layout="NZ", kv_cache_dtype="fp8_ds_mla")
    fails(TypeError, "k_cache: dtype float32", c=ref_values(cache, DL), kv_cache_dtype="fp8_ds_mla")
    fails(TypeError, "k_cache: dtype float8_e5m2", c=cache.view(ml.float8_e5m2), kv_cache_dtype="fp8_ds_mla")
    fails(ValueError, "kv_cache_dtype", kv_cache_dtype="fp8_ds")
    odd = np.zeros((cache.shape[0], 16, 166), np.uint8)[:, :, 1:165]  # the bf16 part not 2-byte aligned
    fails(lk.LlmkernError, "k_cache", c=odd, kv_cache_dtype="fp8_ds_mla")
    # is_fp8_kvcache=True with a last dim equal to q's head dim keeps its per-tensor e4m3 meaning
    codes = rng.integers(0, 120, (cache.shape[0], 16, 1, DL + DR), dtype=np.uint8)
    a, _ = lk.flash_mla_with_kvcache(q, codes, bt, sl, DL, None, None, is_fp8_kvcache=True, descale_k=0.5)
    b, _ = lk.flash_mla_with_kvcache(q, codes.view(E4), bt, sl, DL, None, None, descale_k=0.5)
    assert np.array_equal(a, b)
    # an explicit 'fp8' kv_cache_dtype never reads records (a 164-byte entry is not q's 144)
    with pytest.raises(lk.LlmkernError):
        lk.flash_mla_with_kvcache(q, cache, bt, sl, DL, None, None, kv_cache_dtype="fp8", out=out)
    assert np.all(out == 7.0)
