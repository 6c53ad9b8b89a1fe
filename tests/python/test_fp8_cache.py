"""fp8 caches (kv_cache_dtype "fp8" / "fp8_e4m3" / "fp8_e5m2"): reshape_and_cache_flash
(per-tensor and per-head scales, ND and NZ), concat_and_cache_mla, gather_and_maybe_dequant_cache
/ cp_gather_cache, convert_fp8, swap_blocks / copy_blocks; uint8 caches as vLLM allocates
them, ml_dtypes float8 arrays and torch float8 tensors, against ml_dtypes' / torch's own
f32 -> fp8 conversion of x / scale (round to nearest even: bitwise within the finite
range) and against float64; saturation, NaN, bad scales."""
import numpy as np
import pytest

import llmkern as lk
from helpers import torch_or_skip

MAX = {"fp8": 448.0, "fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}
MAXCODE = {"fp8": 0x7E, "fp8_e4m3": 0x7E, "fp8_e5m2": 0x7B}


def ml_or_skip():
    return pytest.importorskip("ml_dtypes")


def np_fp8(kv):
    ml = ml_or_skip()
    return ml.float8_e5m2 if kv == "fp8_e5m2" else ml.float8_e4m3fn


def expect_codes(x, scale, kv):
    """uint8 codes of fp8(f32(x) / f32(scale)), saturated to the finite range (beyond it
    round to nearest even gives +-max too; NaN stays NaN)."""
    y = np.asarray(x, np.float32) / np.float32(scale)
    y = np.clip(y, -MAX[kv], MAX[kv])
    return y.astype(np_fp8(kv)).view(np.uint8)


@pytest.mark.parametrize("kv", ["fp8", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("bs", [1, 7, 16])
def test_numpy_uint8_caches(rng, kv, bs):
    T, H, D, NB = 9, 3, 40, 4
    ks, vs = 0.05, 2.5
    key = np.clip(rng.standard_normal((T, H, D)) * 4, -20, 20).astype(np.float32)
    value = (rng.standard_normal((T, H, D)) * 40).astype(np.float16)
    kc = rng.integers(0, 256, (NB, bs, H, D), dtype=np.uint8)
    vc = rng.integers(0, 256, (NB, bs, H, D), dtype=np.uint8)
    slots = rng.permutation(NB * bs)[:T].astype(np.int64)
    slots[2] = -1
    kc0, vc0 = kc.copy(), vc.copy()
    lk.reshape_and_cache_flash(key, value, kc, vc, slots, kv, ks, vs)
    wk, wv = kc0.copy(), vc0.copy()
    for t, s in enumerate(slots):
        if s >= 0:
            wk[s // bs, s % bs] = expect_codes(key[t], ks, kv)
            wv[s // bs, s % bs] = expect_codes(value[t], vs, kv)
            # float64: dequantized within half an fp8 step (relative 2^-4 e4m3, 2^-3 e5m2)
            deq = kc[s // bs, s % bs].view(np_fp8(kv)).astype(np.float64) * ks
            rel = 2.0 ** -4 if kv != "fp8_e5m2" else 2.0 ** -3
            np.testing.assert_allclose(deq, key[t].astype(np.float64), rtol=rel * 1.0001, atol=ks * 2.0 ** -9)
    assert np.array_equal(kc, wk) and np.array_equal(vc, wv)


@pytest.mark.parametrize("kv", ["fp8_e4m3", "fp8_e5m2"])
def test_numpy_fp8_dtype_caches_and_specials(kv):
    fp8 = np_fp8(kv)
    T, H, D, NB, BS = 2, 1, 6, 1, 2
    key = np.array([[[1e9, -np.inf, np.nan, -0.0, 1e-30, 3.0]]] * T, np.float32)
    value = key.copy()
    kc = np.zeros((NB, BS, H, D), fp8)
    vc = np.zeros((NB, BS, H, D), fp8)
    lk.reshape_and_cache_flash(key, value, kc, vc, np.array([1, 0], np.int32), kv, 1.0, 0.5)
    codes = kc.view(np.uint8)[0, 1, 0]
    m = MAXCODE[kv]
    assert codes[0] == m and codes[1] == 0x80 | m  # saturated, inf too
    assert np.isnan(kc[0, 1, 0, 2].astype(np.float32))
    assert codes[3] == 0x80 and codes[4] == 0 and kc[0, 1, 0, 5].astype(np.float32) == 3.0
    assert vc[0, 0, 0, 5].astype(np.float32) == 6.0  # 3.0 / 0.5
    with pytest.raises(TypeError, match="key_cache"):  # e4m3 cache for e5m2 (or back)
        other = np.zeros((NB, BS, H, D), np_fp8("fp8_e5m2" if kv == "fp8_e4m3" else "fp8_e4m3"))
        lk.reshape_and_cache_flash(key, value, other, vc, np.array([1, 0]), kv, 1.0, 1.0)


def test_bad_scales_nothing_written(rng):
    T, H, D, NB, BS = 3, 2, 8, 2, 4
    key = rng.standard_normal((T, H, D)).astype(np.float32)
    kc = np.zeros((NB, BS, H, D), np.uint8)
    vc = np.zeros((NB, BS, H, D), np.uint8)
    slots = np.array([0, 5, 2])
    for ks, vs, name in ((0.0, 1.0, "k_scale"), (-1.0, 1.0, "k_scale"), (1.0, float("nan"), "v_scale"),
                         (1.0, float("inf"), "v_scale")):
        with pytest.raises(lk.LlmkernError, match=name):
            lk.reshape_and_cache_flash(key, key, kc, vc, slots, "fp8", ks, vs)
    bad_head = np.array([1.0, -1.0], np.float32)  # per head: the second one bad
    with pytest.raises(lk.LlmkernError, match=r"k_scale\[1\]"):
        lk.reshape_and_cache_flash(key, key, kc, vc, slots, "fp8", bad_head, 1.0)
    with pytest.raises(lk.LlmkernError, match="k_scale"):  # neither one element nor [H]
        lk.reshape_and_cache_flash(key, key, kc, vc, slots, "fp8", np.ones(H + 1, np.float32), 1.0)
    with pytest.raises(ValueError, match="v_scale"):
        lk.reshape_and_cache_flash(key, key, kc, vc, slots, "fp8", 1.0, None)
    assert not kc.any() and not vc.any()


@pytest.mark.parametrize("kv", ["fp8", "fp8_e5m2"])
def test_torch_caches(rng, kv):
    torch = torch_or_skip()
    T, H, D, NB, BS = 7, 4, 32, 3, 16
    tdt = torch.float8_e5m2 if kv == "fp8_e5m2" else torch.float8_e4m3fn
    key = torch.randn(T, H, D, dtype=torch.bfloat16) * 3
    value = torch.randn(T, H, D)
    slots = torch.tensor([3, 0, 17, -1, 9, 8, 40])
    ks, vs = torch.tensor([0.125]), torch.tensor(0.75)
    for typed in (False, True):  # vLLM's uint8 buffers, then float8 tensors
        kc = torch.zeros(NB, BS, H, D, dtype=torch.uint8)
        vc = torch.zeros(NB, BS, H, D, dtype=torch.uint8)
        lk.reshape_and_cache_flash(key, value, kc.view(tdt) if typed else kc, vc.view(tdt) if typed else vc,
                                   slots, kv, ks, vs)
        for t, s in enumerate(slots.tolist()):
            if s < 0:
                continue
            wk = (key[t].float() / ks.float()).to(tdt).view(torch.uint8)
            wv = (value[t] / vs).to(tdt).view(torch.uint8)
            assert torch.equal(kc[s // BS, s % BS], wk) and torch.equal(vc[s // BS, s % BS], wv)
        assert not kc[0, 1].any() and not vc[0, 1].any()  # slot 1: no token


# ---------------------------------------------------------------- per-head scales, NZ


def nz_logical(c, H, D):
    """[NB, C/32, bs, 32] physical -> [NB, bs, H, D] logical"""
    NB, _, bs, tile = c.shape
    return c.transpose(0, 2, 1, 3).reshape(NB, bs, H * D).reshape(NB, bs, H, D)


@pytest.mark.parametrize("kv", ["fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("bs", [1, 7, 16, 128])
def test_per_head_scales_nd_nz(rng, kv, bs):
    T, H, D = 10, 4, 24
    NB = T // bs + 2
    key = (rng.standard_normal((T, H, D)) * 8).astype(np.float32)
    value = (rng.standard_normal((T, H, D)) * 0.1).astype(np.float32)
    ks = np.array([0.5, 0.03125, 2.0, 3.7], np.float32)
    vs = np.array([1.0, 0.001, 0.25, 9.0], np.float32)
    slots = rng.permutation(NB * bs)[:T].astype(np.int64)
    slots[4] = -1
    nd = [rng.integers(0, 256, (NB, bs, H, D), dtype=np.uint8) for _ in range(2)]
    nz = [rng.integers(0, 256, (NB, H * D // 32, bs, 32), dtype=np.uint8) for _ in range(2)]
    nz0 = [c.copy() for c in nz]
    want = [c.copy() for c in nd]
    lk.reshape_and_cache_flash(key, value, nd[0], nd[1], slots, kv, ks, vs)
    lk.reshape_and_cache_flash(key, value, nz[0], nz[1], slots, kv, ks, vs, layout="NZ")
    for t, s in enumerate(slots):
        if s < 0:
            continue
        for h in range(H):
            want[0][s // bs, s % bs, h] = expect_codes(key[t, h], ks[h], kv)
            want[1][s // bs, s % bs, h] = expect_codes(value[t, h], vs[h], kv)
    for i in range(2):
        assert np.array_equal(nd[i], want[i])
        got = nz_logical(nz[i], H, D)
        used = np.zeros(NB * bs, bool)
        used[slots[slots >= 0]] = True
        used = used.reshape(NB, bs)
        assert np.array_equal(got[used], nd[i][used])  # NZ equals ND bit for bit
        assert np.array_equal(got[~used], nz_logical(nz0[i], H, D)[~used])  # nothing else written


def test_torch_per_head_scales():
    torch = torch_or_skip()
    T, H, D, NB, BS = 5, 2, 16, 2, 8
    key, value = torch.randn(T, H, D, dtype=torch.float16) * 50, torch.randn(T, H, D)
    ks, vs = torch.tensor([0.25, 4.0]), torch.tensor([1.0, 0.5])
    kc = torch.zeros(NB, BS, H, D, dtype=torch.uint8)
    vc = torch.zeros(NB, BS, H, D, dtype=torch.float8_e4m3fn)
    slots = torch.tensor([0, 3, 9, -1, 15])
    lk.reshape_and_cache_flash(key, value, kc, vc, slots, "fp8", ks, vs)
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            wk = (key[t].float() / ks[:, None]).to(torch.float8_e4m3fn).view(torch.uint8)
            wv = (value[t] / vs[:, None]).to(torch.float8_e4m3fn).view(torch.uint8)
            assert torch.equal(kc[s // BS, s % BS], wk) and torch.equal(vc.view(torch.uint8)[s // BS, s % BS], wv)


# ---------------------------------------------------------------- MLA


@pytest.mark.parametrize("kv", ["fp8", "fp8_e5m2"])
@pytest.mark.parametrize("bs", [1, 16])
def test_concat_and_cache_mla_fp8(rng, kv, bs):
    T, Dl, Dr = 6, 64, 32
    NB = T // bs + 2
    kv_c = (rng.standard_normal((T, Dl)) * 3).astype(np.float32)
    k_pe = rng.standard_normal((T, Dr)).astype(np.float32)
    slots = rng.permutation(NB * bs)[:T].astype(np.int64)
    slots[1] = -1
    scale = np.array([0.125], np.float32)
    nd = rng.integers(0, 256, (NB, bs, Dl + Dr), dtype=np.uint8)
    nz = rng.integers(0, 256, (NB, (Dl + Dr) // 32, bs, 32), dtype=np.uint8)
    want = nd.copy()
    lk.concat_and_cache_mla(kv_c, k_pe, nd, slots, kv, scale)
    lk.concat_and_cache_mla(kv_c, k_pe, nz, slots, kv, scale, layout="NZ")
    for t, s in enumerate(slots):
        if s >= 0:
            want[s // bs, s % bs] = expect_codes(np.concatenate([kv_c[t], k_pe[t]]), scale[0], kv)
    assert np.array_equal(nd, want)
    got = nz_logical(nz, 1, Dl + Dr)[:, :, 0]
    for s in slots[slots >= 0]:
        assert np.array_equal(got[s // bs, s % bs], nd[s // bs, s % bs])
    with pytest.raises(lk.LlmkernError, match="scale"):
        lk.concat_and_cache_mla(kv_c, k_pe, nd, slots, kv, np.array([0.0], np.float32))


def test_concat_and_cache_mla_fp8_torch():
    torch = torch_or_skip()
    T, Dl, Dr, NB, BS = 4, 32, 32, 2, 4
    kv_c, k_pe = torch.randn(T, Dl, dtype=torch.bfloat16), torch.randn(T, Dr, dtype=torch.bfloat16)
    cache = torch.zeros(NB, BS, Dl + Dr, dtype=torch.uint8)
    slots = torch.tensor([7, 2, 0, 5])
    scale = torch.tensor(0.5)
    lk.concat_and_cache_mla(kv_c, k_pe, cache, slots, "fp8", scale)
    for t, s in enumerate(slots.tolist()):
        w = (torch.cat([kv_c[t], k_pe[t]]).float() / scale).to(torch.float8_e4m3fn).view(torch.uint8)
        assert torch.equal(cache[s // BS, s % BS], w)


# ---------------------------------------------------------------- gather


@pytest.mark.parametrize("kv", ["fp8", "fp8_e5m2"])
@pytest.mark.parametrize("odt", [np.float32, np.float16])
@pytest.mark.parametrize("form", ["batch_size", "token_to_seq"])
def test_gather_and_maybe_dequant_cache(rng, kv, odt, form):
    NB, bs, C = 6, 16, 96
    cache = rng.integers(0, 256, (NB, bs, C), dtype=np.uint8)
    if kv != "fp8_e5m2":
        cache[(cache & 0x7F) == 0x7F] = 0  # no NaN codes (compared with ==)
    else:
        cache[(cache & 0x7C) == 0x7C] = 0
    lens = [20, 0, 33]
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    bt = np.array([[3, 1, 0], [5, 5, 5], [2, 4, 0]], np.int32)
    scale = np.array([0.25], np.float32)
    dst = np.full((cu[-1] + 2, C), 7, odt)
    if form == "batch_size":
        lk.gather_and_maybe_dequant_cache(cache, dst, bt, cu, 3, kv, scale)
    else:
        tts = np.repeat(np.arange(3), lens).astype(np.int32)
        lk.gather_and_maybe_dequant_cache(cache, dst, bt, cu, tts, int(cu[-1]), kv, scale, None)
    q = cache.view(np_fp8(kv)).astype(np.float32)
    for b in range(3):
        for j in range(lens[b]):
            w = (q[bt[b, j // bs], j % bs] * scale[0]).astype(odt)
            assert np.array_equal(dst[cu[b] + j], w)
    assert (dst[cu[-1]:] == 7).all()


@pytest.mark.parametrize("layout", ["ND", "NZ"])
def test_gather_and_maybe_dequant_cache_seq_starts(rng, layout):
    NB, bs, C = 7, 4, 64
    cache = rng.integers(0, 256, (NB, bs, C), dtype=np.uint8)
    cache[(cache & 0x7F) == 0x7F] = 0  # no NaN codes (compared with ==)
    src = cache.reshape(NB, bs, C // 32, 32).transpose(0, 2, 1, 3).copy() if layout == "NZ" else cache
    lens, starts = [6, 0, 3], np.array([5, 2, 9], np.int32)  # offsets inside pages
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    bt = np.array([[-1, 3, 1], [6, 6, 6], [-1, -1, 2]], np.int32)  # pages before a start: not read
    scale = np.array([0.5], np.float32)
    for form in ("batch_size", "token_to_seq"):
        dst = np.full((cu[-1] + 1, C), 9, np.float32)
        if form == "batch_size":
            lk.gather_and_maybe_dequant_cache(src, dst, bt, cu, 3, "fp8", scale, starts, layout=layout)
        else:
            tts = np.repeat(np.arange(3), lens).astype(np.int32)
            lk.gather_and_maybe_dequant_cache(src, dst, bt, cu, tts, int(cu[-1]), "fp8", scale, starts,
                                              layout=layout)
        q = cache.view(np_fp8("fp8")).astype(np.float32)
        for b in range(3):
            for j in range(lens[b]):
                p = starts[b] + j
                assert np.array_equal(dst[cu[b] + j], q[bt[b, p // bs], p % bs] * scale[0])
        assert (dst[cu[-1]:] == 9).all()
    # a start whose request runs past its block table (3 pages x 4): rejected, nothing written
    dst = np.full((cu[-1], C), 9, np.float32)
    with pytest.raises(lk.LlmkernError) as e:
        lk.gather_and_maybe_dequant_cache(src, dst, bt, cu, 3, "fp8", scale, np.array([7, 0, 9], np.int32),
                                          layout=layout)
    assert e.value.status == "LK_ERR_INDEX" and "seq_starts" in str(e.value)
    assert (dst == 9).all()
    with pytest.raises(lk.LlmkernError, match="seq_starts"):
        lk.gather_and_maybe_dequant_cache(src, dst, bt, cu, 3, "fp8", scale, np.array([-1, 0, 0], np.int32),
                                          layout=layout)
    assert (dst == 9).all()


def test_cp_gather_cache_uint8_and_torch():
    torch = torch_or_skip()
    NB, bs, C = 4, 8, 64
    cache = torch.randint(0, 256, (NB, bs, C), dtype=torch.uint8)
    cu = torch.tensor([0, 10, 13], dtype=torch.int32)
    bt = torch.tensor([[2, 0], [3, 1]], dtype=torch.int32)
    dst = torch.zeros(13, C, dtype=torch.uint8)
    lk.cp_gather_cache(cache, dst, bt, cu, 2)
    for b, (lo, hi) in enumerate(((0, 10), (10, 13))):
        for j in range(hi - lo):
            assert torch.equal(dst[lo + j], cache[bt[b, j // bs], j % bs])
    starts = torch.tensor([3, 13], dtype=torch.int32)  # torch seq_starts, byte copy
    dst2 = torch.zeros(13, C, dtype=torch.uint8)
    lk.cp_gather_cache(cache, dst2, bt, cu, 2, starts)
    for b, (lo, hi) in enumerate(((0, 10), (10, 13))):
        for j in range(hi - lo):
            p = int(starts[b]) + j
            assert torch.equal(dst2[lo + j], cache[bt[b, p // bs], p % bs])
    out = torch.zeros(13, C, dtype=torch.bfloat16)
    lk.gather_and_maybe_dequant_cache(cache, out, bt, cu, 2, "fp8", torch.tensor([2.0]))
    want = (cache[bt[0, 0], 3].view(torch.float8_e4m3fn).float() * 2.0).to(torch.bfloat16)
    assert torch.equal(out[3], want) or torch.isnan(want).any()


# ---------------------------------------------------------------- convert_fp8


@pytest.mark.parametrize("kv", ["fp8", "fp8_e4m3", "fp8_e5m2"])
def test_convert_fp8_numpy(rng, kv):
    x = (rng.standard_normal((3, 7, 2, 40)) * 30).astype(np.float32)
    q = np.zeros(x.shape, np.uint8)
    lk.convert_fp8(q, x, 0.5, kv)
    assert np.array_equal(q, expect_codes(x, 0.5, kv))
    back = np.zeros(x.shape, np.float32)
    lk.convert_fp8(back, q, 0.5, kv)
    assert np.array_equal(back, q.view(np_fp8(kv)).astype(np.float32) * np.float32(0.5))
    with pytest.raises(lk.LlmkernError, match="scale"):
        lk.convert_fp8(q, x, float("nan"), kv)
    with pytest.raises(lk.LlmkernError, match="output: dtype f32 with input f32"):  # f32 -> f32, fp8 kv_dtype
        lk.convert_fp8(back, x, 1.0, kv)


def test_convert_fp8_torch():
    torch = torch_or_skip()
    x = torch.randn(4, 16, 8, 32, dtype=torch.bfloat16) * 100
    q = torch.empty(x.shape, dtype=torch.uint8)
    lk.convert_fp8(q, x, 2.0, "fp8")
    assert torch.equal(q, (x.float() / 2.0).to(torch.float8_e4m3fn).view(torch.uint8))
    out = torch.empty(x.shape, dtype=torch.float16)
    lk.convert_fp8(out, q.view(torch.float8_e4m3fn), 2.0, "fp8")
    assert torch.equal(out, (q.view(torch.float8_e4m3fn).float() * 2.0).half())
    y = torch.empty(x.shape, dtype=torch.float32)
    lk.convert_fp8(y, x, 1.0, "auto")
    assert torch.equal(y, x.float())


# ---------------------------------------------------------------- block copies


def test_swap_and_copy_blocks_uint8(rng):
    src = rng.integers(0, 256, (6, 16, 2, 32), dtype=np.uint8)
    dst = rng.integers(0, 256, (6, 16, 2, 32), dtype=np.uint8)
    want = dst.copy()
    m = np.array([[4, 0], [1, 5]], np.int64)
    want[0], want[5] = src[4], src[1]
    lk.swap_blocks(src, dst, m)
    assert np.array_equal(dst, want)
    kc, vc = src.copy(), dst.copy()
    wk, wv = kc.copy(), vc.copy()
    wk[0], wk[5], wv[0], wv[5] = kc[4], kc[1], vc[4], vc[1]
    lk.copy_blocks([kc], [vc], m)
    assert np.array_equal(kc, wk) and np.array_equal(vc, wv)
    ml = ml_or_skip()
    mla = [src.reshape(6, 16, 64).copy().view(ml.float8_e5m2)]
    w = mla[0].view(np.uint8).copy()
    w[0], w[5] = w[4], w[1]
    lk.copy_blocks_mla(mla, m)
    assert np.array_equal(mla[0].view(np.uint8), w)


# ---------------------------------------------------------------- the scale helper


def test_scale_arg_both_kinds():
    """ops._scale_arg serves the lk_tensor scales (cache writes, gathers) and the scalar
    f32 ones (MLA prefill k_scale, FlashMLA descale_q / descale_k) with one set of rules
    and messages."""
    from llmkern import ops
    with pytest.raises(ValueError, match="k_scale: required with an fp8 kv_cache_dtype"):
        ops._scale_arg(None, "k_scale")
    with pytest.raises(ValueError, match="k_scale: required with an fp8 kv_cache_dtype"):
        ops._scale_arg(None, "k_scale", scalar=True)
    assert ops._scale_arg(None, "scale", required=False) == (None, None)
    assert ops._scale_arg(None, "descale_k", required=False, scalar=True) == 1.0
    keep, v = ops._scale_arg(2.0, "scale")
    assert keep.dtype == np.float32 and keep.shape == () and keep == 2.0 and isinstance(v, bytes)
    arr = np.array([0.25], np.float32)
    keep, v = ops._scale_arg(arr, "scale")
    assert keep is arr
    assert ops._scale_arg(3, "k_scale", scalar=True) == 3.0
    assert ops._scale_arg(arr, "k_scale", scalar=True) == 0.25
    assert ops._scale_arg(np.array(0.5, np.float32), "k_scale", scalar=True) == 0.5
    with pytest.raises(ValueError, match=r"descale_k: shape \(2,\), expected one element \(a per-tensor scale\)"):
        ops._scale_arg(np.ones(2, np.float32), "descale_k", scalar=True)
    # through the public calls: the same messages
    k = np.ones((2, 1, 32), np.float32)
    cache = np.zeros((1, 4, 1, 32), np.uint8)
    with pytest.raises(ValueError, match="k_scale: required with an fp8 kv_cache_dtype"):
        lk.reshape_and_cache_flash(k, k, cache, cache.copy(), np.array([0, 1]), "fp8", None, 1.0)
    assert not cache.any()
