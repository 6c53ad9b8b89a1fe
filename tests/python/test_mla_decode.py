"""flash_mla_with_kvcache / get_mla_metadata (FlashMLA's signatures) against a float64
computation of latent attention: NumPy and torch (bf16), ND and NZ, one and two cache
buffers, s_q = 2 causal, NaN in unused cache slots, empty requests, explicit splits,
errors."""
import numpy as np
import pytest

import llmkern as lk
from helpers import close, f64, ref_mla, to_nz, torch_or_skip


def make(rng, lens, sq=1, h=4, dl=64, dr=16, bs=16, dtype=np.float32):
    """paged cache [blocks, bs, 1, E] (unused slots NaN), block_table, logical entries"""
    e = dl + dr
    pages = [(n + bs - 1) // bs for n in lens]
    nb = sum(pages) + 2
    perm = rng.permutation(nb)
    maxp = max(pages + [1]) + 1
    bt = np.full((len(lens), maxp), -1, np.int32)
    cache = np.full((nb, bs, 1, e), np.nan, dtype)
    entries, k = [], 0
    for b, n in enumerate(lens):
        bt[b, :pages[b]] = perm[k:k + pages[b]]
        k += pages[b]
        ent = rng.uniform(-1, 1, (n, e)).astype(dtype)
        for j in range(n):
            cache[bt[b, j // bs], j % bs, 0] = ent[j]
        entries.append(f64(ent))
    q = rng.uniform(-1, 1, (len(lens), sq, h, e)).astype(dtype)
    return q, cache, bt, np.array(lens, np.int32), entries


@pytest.mark.parametrize("causal,sq", [(False, 1), (True, 2), (False, 3)])
@pytest.mark.parametrize("layout", ["ND", "NZ"])
def test_numpy_f32(rng, causal, sq, layout):
    lens = [37, 0, 130, 2]
    q, cache, bt, sl, ent = make(rng, lens, sq=sq)
    meta, ns = lk.get_mla_metadata(sl, sq * 4, 1)
    assert meta.shape == (1, 8) and meta.dtype == np.int32 and meta[0, 0] >= 512
    assert ns.shape == (5,) and ns[0] == 0 and list(np.diff(ns)) == [1, 1, 1, 1]
    kc = to_nz(cache[:, :, 0]) if layout == "NZ" else cache
    out, lse = lk.flash_mla_with_kvcache(q, kc, bt, sl, 64, meta, ns, softmax_scale=0.2, causal=causal,
                                         kv_layout=layout)
    want, want_lse = ref_mla(f64(q), ent, lens, 64, 0.2, causal)
    assert out.shape == (4, sq, 4, 64) and lse.shape == (4, 4, sq)
    assert np.isfinite(out).all()  # NaN tails never read
    close(out, want)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=1e-5)
    assert (out[1] == 0).all() and np.isneginf(lse[1]).all()  # 0 cached tokens


def test_two_buffers_split_and_default_scale(rng):
    lens = [300, 65]
    q, cache, bt, sl, ent = make(rng, lens, h=3)
    kv, pe = np.ascontiguousarray(cache[:, :, 0, :64]), np.ascontiguousarray(cache[:, :, 0, 64:])
    meta = np.zeros((1, 8), np.int32)
    meta[0, 0] = 64  # a forced split: 5 and 2 chunks
    out, lse = lk.flash_mla_with_kvcache(q, kv, bt, sl, 64, meta, None, k_pe_cache=pe)
    want, want_lse = ref_mla(f64(q), ent, lens, 64, 80 ** -0.5, False)
    close(out, want)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=1e-5)
    out2, _ = lk.flash_mla_with_kvcache(q, kv, bt, sl, 64, None, None, k_pe_cache=pe)
    close(out2, want)


def test_threads_bitwise(rng):
    q, cache, bt, sl, _ = make(rng, [1500, 700], sq=2, h=8)
    meta, ns = lk.get_mla_metadata(sl, 16, 1)
    outs = []
    for n in (1, 2, 3, 4):
        lk.set_num_threads(n)
        outs.append(lk.flash_mla_with_kvcache(q, cache, bt, sl, 64, meta, ns, causal=True))
    lk.set_num_threads(0)
    for o, l in outs[1:]:
        assert np.array_equal(o, outs[0][0]) and np.array_equal(l, outs[0][1])


def test_torch_bf16(rng):
    torch = torch_or_skip()
    lens = [200, 1]
    q, cache, bt, sl, _ = make(rng, lens, h=16, dl=512, dr=64, bs=64)
    tq = torch.from_numpy(q).to(torch.bfloat16)
    tc = torch.from_numpy(cache).to(torch.bfloat16)
    tsl, tbt = torch.from_numpy(sl), torch.from_numpy(bt)
    meta, ns = lk.get_mla_metadata(tsl, 16, 1)
    assert isinstance(meta, torch.Tensor) and meta.dtype == torch.int32 and ns.dtype == torch.int32
    out, lse = lk.flash_mla_with_kvcache(tq, tc, tbt, tsl, 512, meta, ns, causal=False)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32 and out.shape == (2, 1, 16, 512)
    ent = [f64(tc.float().numpy()[bt[b, np.arange(n) // 64], np.arange(n) % 64, 0]) for b, n in enumerate(lens)]
    want, want_lse = ref_mla(f64(tq), ent, lens, 512, 576 ** -0.5, False)
    close(out, want)
    np.testing.assert_allclose(lse.numpy(), want_lse, rtol=1e-4, atol=1e-4)


def test_errors(rng):
    q, cache, bt, sl, _ = make(rng, [20, 3], sq=2)
    out = np.zeros((2, 2, 4, 64), np.float32)
    keep = out.copy()
    bad = sl.copy()
    bad[0] = 1000  # beyond the block table
    with pytest.raises(lk.LlmkernError) as e:
        lk.flash_mla_with_kvcache(q, cache, bt, bad, 64, None, None, out=out)
    assert e.value.status == "LK_ERR_INDEX" and "cache_seqlens" in str(e.value)
    bad = sl.copy()
    bad[1] = 1  # fewer tokens than causal queries
    with pytest.raises(lk.LlmkernError) as e:
        lk.flash_mla_with_kvcache(q, cache, bt, bad, 64, None, None, causal=True, out=out)
    assert e.value.status == "LK_ERR_INDEX"
    bt2 = bt.copy()
    bt2[0, 0] = 99
    with pytest.raises(lk.LlmkernError) as e:
        lk.flash_mla_with_kvcache(q, cache, bt2, sl, 64, None, None, out=out)
    assert "block_table" in str(e.value)
    for dv in (32, 65, 1000):  # head_dim_v must be out's last dim
        with pytest.raises(ValueError, match="out: shape .*head_dim_v = %d" % dv):
            lk.flash_mla_with_kvcache(q, cache, bt, sl, dv, None, None, out=out)
    with pytest.raises(lk.LlmkernError, match=r"tile_scheduler_metadata\[0\]\[0\] \(split_keys\): must be >= 0"):
        lk.flash_mla_with_kvcache(q, cache, bt, sl, 64, np.array([[-5, 0]], np.int32), None, out=out)
    assert np.array_equal(out, keep)
    with pytest.raises(lk.LlmkernError):
        lk.get_mla_metadata(np.array([3, -1], np.int32), 4, 1)


# ---------------------------------------------------------------- fp8 latent caches

def _fp8_cache(rng, lens, fmt, ks, h=4, dl=64, dr=32, bs=16):
    """make()'s cache quantized to fp8: codes = fp8(x / ks) (ml_dtypes, round to nearest
    even, saturating as vLLM); the logical entries are the dequantized codes * ks"""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    dt = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}[fmt]
    q, cache, bt, sl, _ = make(rng, lens, h=h, dl=dl, dr=dr, bs=bs)
    lim = float(ml_dtypes.finfo(dt).max)
    codes = np.where(np.isnan(cache), np.nan, np.clip(cache / ks, -lim, lim)).astype(dt)
    deq = codes.astype(np.float64) * ks
    ent = [deq[bt[b, np.arange(n) // bs], np.arange(n) % bs, 0] for b, n in enumerate(lens)]
    return q, codes, bt, sl, ent


def to_nz32(nd):
    """ND page cache [num_blocks, block_size, C] -> the fp8 NZ buffer [num_blocks, C/32,
    block_size, 32] (1-byte caches: 32-wide tiles)"""
    nb, bs = nd.shape[:2]
    c = int(np.prod(nd.shape[2:]))
    return np.ascontiguousarray(nd.reshape(nb, bs, c // 32, 32).transpose(0, 2, 1, 3))


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("form", ["typed", "uint8", "nz"])
def test_numpy_fp8(rng, fmt, form):
    lens = [37, 0, 130]
    ks = 0.03
    q, codes, bt, sl, ent = _fp8_cache(rng, lens, fmt, ks)
    kw = {}
    kc = codes
    if form == "uint8":
        kc = codes.view(np.uint8)
        kw["kv_cache_dtype"] = "fp8" if fmt == "e4m3" else "fp8_e5m2"
    elif form == "nz":
        kc = to_nz32(codes[:, :, 0])
        kw["kv_layout"] = "NZ"
    out, lse = lk.flash_mla_with_kvcache(q, kc, bt, sl, 64, None, None, softmax_scale=0.2, descale_k=ks, **kw)
    want, want_lse = ref_mla(f64(q), ent, lens, 64, 0.2, False)
    assert np.isfinite(out).all()  # NaN codes in unused slots never read
    close(out, want)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=1e-5)
    assert (out[1] == 0).all() and np.isneginf(lse[1]).all()


def test_fp8_descale_q_two_buffers_causal(rng):
    lens = [70, 5]
    q, codes, bt, sl, ent = _fp8_cache(rng, lens, "e4m3", 0.05)
    kv, pe = np.ascontiguousarray(codes[:, :, 0, :64]), np.ascontiguousarray(codes[:, :, 0, 64:])
    q2 = q[:, :1].repeat(2, axis=1)
    out, lse = lk.flash_mla_with_kvcache(q2, kv.view(np.uint8), bt, sl, 64, None, None, 0.1, True, 2.0,
                                         np.array([0.05], np.float32), True, k_pe_cache=pe.view(np.uint8))
    want, want_lse = ref_mla(f64(q2), ent, lens, 64, 0.2, True)  # descale_q 2 doubles the scores
    close(out, want)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=1e-5)


def test_fp8_errors(rng):
    q, codes, bt, sl, _ = _fp8_cache(rng, [20, 3], "e4m3", 0.05)
    with pytest.raises(TypeError, match="k_cache"):  # a uint8 cache needs its fp8 dtype
        lk.flash_mla_with_kvcache(q, codes.view(np.uint8), bt, sl, 64, None, None)
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="descale_k: value"):
            lk.flash_mla_with_kvcache(q, codes, bt, sl, 64, None, None, descale_k=bad)
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        lk.flash_mla_with_kvcache(q, codes.view(np.uint8), bt, sl, 64, None, None, kv_cache_dtype="int8")


def test_torch_fp8(rng):
    torch = torch_or_skip()
    lens = [200, 1]
    q, codes, bt, sl, ent = _fp8_cache(rng, lens, "e4m3", 0.02, h=16, dl=512, dr=64, bs=64)
    tq = torch.from_numpy(q).to(torch.bfloat16)
    tc = torch.from_numpy(codes.view(np.uint8)).view(torch.float8_e4m3fn)
    tsl, tbt = torch.from_numpy(sl), torch.from_numpy(bt)
    meta, ns = lk.get_mla_metadata(tsl, 16, 1)
    ks = torch.tensor([0.02], dtype=torch.float32)
    out, lse = lk.flash_mla_with_kvcache(tq, tc, tbt, tsl, 512, meta, ns, descale_k=ks)
    assert out.dtype == torch.bfloat16 and out.shape == (2, 1, 16, 512)
    want, want_lse = ref_mla(f64(tq), ent, lens, 512, 576 ** -0.5, False)
    close(out, want)
    np.testing.assert_allclose(lse.numpy(), want_lse, rtol=1e-4, atol=1e-4)
    out8, _ = lk.flash_mla_with_kvcache(tq, tc.view(torch.uint8), tbt, tsl, 512, meta, ns, descale_k=ks,
                                        kv_cache_dtype="fp8_e4m3")
    assert torch.equal(out8, out)
