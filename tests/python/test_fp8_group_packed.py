"""DeepGEMM's UE8M0-packed per-token-group scales: vLLM's raw op
per_token_group_fp8_quant_packed(input, output_q, output_s_packed, group_size, eps, fp8_min,
fp8_max) (its C++ per_token_group_quant_8bit_packed) and its Python
per_token_group_quant_fp8_packed_for_deepgemm(x, group_size, ...) -> (x_q, x_s_packed),
against an independent NumPy reference:
  s = 2^ceil(log2(max(max(absmax(group), eps) / fp8_max, 1e-10)))   (float64 log2 / ceil)
  exponent byte = ceil(log2(...)) + 127 (inf: 255)
  word [r, j] = sum_i byte(r, 4 j + i) << 8 i, bytes past the last group 0
the codes bit for bit those of per_token_group_fp8_quant(..., scale_ue8m0=True) and of
fp8(x / s) (int8: trunc(clamp(x / s))). Group counts 1..8 (not multiples of 4), row counts
not multiples of 4 (the TMA padding of vLLM's strided buffer untouched), 3-D inputs, int8
outputs, f32 / f16 / bf16 inputs, NumPy and torch, the wrapper's layout, torch.ops, and
the error cases (the argument named, nothing written)."""
import numpy as np
import pytest

import llmkern as lk
from helpers import torch_or_skip

ml = pytest.importorskip("ml_dtypes")
E4, BF16 = ml.float8_e4m3fn, ml.bfloat16
SENT = np.int32(-0x21524111)  # 0xDEADBEEF
QSENT = 0x5A


# ---------------------------------------------------------------- reference


def make_x(rng, shape, gs, xdt):
    """Groups of magnitudes 1e-3 .. 1e3, the first group all zero, one group whose absmax
    / 448 is exactly a power of two (its scale stays)."""
    ng = shape[-1] // gs
    mag = 10.0 ** rng.uniform(-3, 3, shape[:-1] + (ng, 1))
    x = (rng.standard_normal(shape[:-1] + (ng, gs)) * mag).reshape(shape)
    flat = x.reshape(-1, shape[-1])
    flat[0, :gs] = 0.0
    if flat.shape[0] > 1 or ng > 1:
        r, g = (1, 0) if flat.shape[0] > 1 else (0, 1)
        flat[r, g * gs:(g + 1) * gs] = 0.5
        flat[r, g * gs] = -448.0 * 2.0 ** -4  # scale exactly 2^-4
    return flat.reshape(shape).astype(xdt)


def ref(x, gs, eps, fmax):
    """(scales f32 [mn, G], exponent bytes [mn, G]) of x [..., K]."""
    x = np.asarray(x).astype(np.float32)
    K = x.shape[-1]
    a = np.abs(x.reshape(-1, K // gs, gs).astype(np.float64))
    am = np.fmax.reduce(a, axis=-1, initial=0.0).astype(np.float32)
    s = np.maximum(am, np.float32(eps)) / np.float32(fmax)  # one f32 division
    s = np.maximum(s.astype(np.float64), 1e-10)
    with np.errstate(over="ignore"):
        k = np.ceil(np.log2(s))
        p2 = np.exp2(k).astype(np.float32)
    byte = np.where(np.isinf(s), 255, k + 127).astype(np.int64)
    return p2, byte


def ref_words(byte):
    mn, G = byte.shape
    kp = (G + 3) // 4
    w = np.zeros((mn, kp), np.int64)
    for g in range(G):
        w[:, g // 4] += byte[:, g] << (8 * (g % 4))
    return w.astype(np.uint32).view(np.int32)


def ref_codes(x, s, gs, qdt):
    x = np.asarray(x).astype(np.float32).reshape(s.shape[0], -1)
    with np.errstate(invalid="ignore", divide="ignore"):
        y = x / np.repeat(s, gs, axis=-1)
    if qdt == np.int8:
        return np.trunc(np.clip(np.nan_to_num(y, nan=0.0), -128, 127)).astype(np.int8).view(np.uint8)
    return np.clip(y, -448.0, 448.0).astype(E4).view(np.uint8)


def vllm_packed(mn, kp, fill=SENT):
    """vLLM's allocation: empty_strided((mn, kp), (1, tma_aligned_mn)); here the
    transposed view of a [kp, tma] buffer filled with a sentinel (returned too)."""
    tma = (mn + 3) // 4 * 4
    buf = np.full((kp, tma), fill, np.int32)
    return buf[:, :mn].T, buf


def codes(q):
    if hasattr(q, "detach"):
        import torch
        return q.contiguous().view(torch.uint8).numpy()
    return np.asarray(q).view(np.uint8)


def check(x, q, packed, gs, qdt=E4, eps=1e-10):
    """codes and words against the reference and against per_token_group_fp8_quant's
    UE8M0 codes (the binding's own path, bit for bit)."""
    xs = x.float().numpy() if hasattr(x, "detach") else np.asarray(x)
    fmax = 127.0 if qdt == np.int8 else 448.0
    s, byte = ref(xs, gs, eps, fmax)
    got = packed.numpy() if hasattr(packed, "detach") else np.asarray(packed)
    np.testing.assert_array_equal(got, ref_words(byte))
    want = ref_codes(xs, s, gs, qdt)
    np.testing.assert_array_equal(codes(q).reshape(want.shape), want)
    q2 = np.zeros(xs.shape, qdt)
    s2 = np.zeros(xs.shape[:-1] + (xs.shape[-1] // gs,), np.float32)
    lk.per_token_group_fp8_quant(x, q2, s2, gs, eps, -fmax if qdt == E4 else -128.0, fmax, True)  # x's own dtype
    np.testing.assert_array_equal(codes(q).reshape(-1), q2.view(np.uint8).reshape(-1))
    np.testing.assert_array_equal(s2.reshape(s.shape), s)


# ---------------------------------------------------------------- NumPy, the raw op


@pytest.mark.parametrize("xdt", [np.float32, np.float16, BF16])
@pytest.mark.parametrize("ng", [1, 2, 3, 4, 5, 7, 8])
@pytest.mark.parametrize("mn", [1, 5, 8])
def test_raw_numpy(rng, mn, ng, xdt):
    gs = 16
    x = make_x(rng, (mn, ng * gs), gs, xdt)
    kp = (ng + 3) // 4
    out_s, buf = vllm_packed(mn, kp)
    q = np.full(x.shape, QSENT, np.uint8).view(E4)
    lk.per_token_group_fp8_quant_packed(x, q, out_s, gs, 1e-10, -448.0, 448.0)
    check(x, q, out_s, gs)
    assert np.all(buf[:, mn:] == SENT)  # TMA padding rows: never written
    if ng % 4:  # the bytes past the last group are 0
        top = out_s[:, -1].view(np.uint32) >> np.uint32(8 * (ng % 4))
        assert np.all(top == 0)


def test_byte_order():
    """One row of 5 groups with known scales: group 4 j in word j's low byte."""
    gs = 4
    am = np.array([448.0, 896.0, 448.0 / 8, 448.0 * 2 ** 10, 448.0 * 3], np.float32)  # 1, 2, 2^-3, 2^10, 3 -> 4
    x = np.repeat(am, gs).reshape(1, -1) * np.tile([1, -0.5, 0.25, 0], 5).astype(np.float32)
    out = np.zeros((1, 2), np.int32)
    lk.per_token_group_fp8_quant_packed(x, np.zeros(x.shape, E4), out, gs, 1e-10, -448.0, 448.0)
    w = out.view(np.uint32)
    assert w[0, 0] == (127 | 128 << 8 | 124 << 16 | 137 << 24)
    assert w[0, 1] == 129


def test_3d_and_int8(rng):
    gs = 32
    x = make_x(rng, (2, 3, 5 * gs), gs, np.float32)
    out_s, buf = vllm_packed(6, 2)
    q = np.zeros(x.shape, E4)
    lk.per_token_group_fp8_quant_packed(x, q, out_s, gs, 1e-10, -448.0, 448.0)
    check(x, q, out_s, gs)
    assert np.all(buf[:, 6:] == SENT)
    qi = np.full(x.shape, 99, np.int8)  # int8 codes, vLLM's kernel's other output
    out_i, buf_i = vllm_packed(6, 2)
    lk.per_token_group_fp8_quant_packed(x, qi, out_i, gs, 1e-10, -128.0, 127.0)
    check(x, qi, out_i, gs, qdt=np.int8)
    assert np.all(buf_i[:, 6:] == SENT)


def test_any_strides(rng):
    """A row-major [mn, kp] output, a strided input: the same words and codes."""
    gs = 16
    base = make_x(rng, (5, 16 * gs), gs, np.float32)
    x = base[:, ::2]  # 8 groups of strided elements
    ref_s, _ = vllm_packed(5, 2)
    rq = np.zeros(x.shape, E4)
    lk.per_token_group_fp8_quant_packed(np.ascontiguousarray(x), rq, ref_s, gs, 1e-10, -448.0, 448.0)
    out, q = np.full((5, 2), SENT, np.int32), np.zeros(x.shape, E4)
    lk.per_token_group_fp8_quant_packed(x, q, out, gs, 1e-10, -448.0, 448.0)
    np.testing.assert_array_equal(out, ref_s)
    np.testing.assert_array_equal(q.view(np.uint8), rq.view(np.uint8))
    check(x, q, out, gs)


def test_special_values():
    gs = 4
    x = np.array([[0, 0, 0, 0,                      # all zero: max(eps / 448, 1e-10) -> 2^-33
                   1, np.inf, -2, 0,                # inf: scale inf, exponent 255
                   1, np.nan, -2, 0.5,              # NaN ignored by the absmax: 2 / 448 -> 2^-7
                   3e38, 0, 0, 1]], np.float32)     # huge absmax: 2^120
    out = np.zeros((1, 1), np.int32)
    q = np.zeros(x.shape, E4)
    lk.per_token_group_fp8_quant_packed(x, q, out, gs, 1e-10, -448.0, 448.0)
    b = out.view(np.uint32)[0, 0]
    assert [(b >> (8 * i)) & 0xFF for i in range(4)] == [127 - 33, 255, 127 - 7, 127 + 120]
    check(x, q, out, gs)


def test_empty():
    out = np.zeros((0, 1), np.int32)
    lk.per_token_group_fp8_quant_packed(np.zeros((0, 64), np.float32), np.zeros((0, 64), E4), out, 16, 1e-10,
                                        -448.0, 448.0)
    out = np.full((3, 0), SENT, np.int32)
    lk.per_token_group_fp8_quant_packed(np.zeros((3, 0), np.float32), np.zeros((3, 0), E4), out, 16, 1e-10,
                                        -448.0, 448.0)


# ---------------------------------------------------------------- the wrapper (NumPy)


@pytest.mark.parametrize("shape,gs", [((5, 7 * 128), 128), ((2, 3, 3 * 16), 16), ((8, 64), 16), ((1, 16), 16)])
def test_wrapper_numpy(rng, shape, gs):
    x = make_x(rng, shape, gs, np.float32)
    q, s = lk.per_token_group_quant_fp8_packed_for_deepgemm(x, gs)
    mn = int(np.prod(shape[:-1]))
    kp, tma = (shape[-1] // gs + 3) // 4, (mn + 3) // 4 * 4
    assert q.dtype == E4 and q.shape == shape
    assert s.dtype == np.int32 and s.shape == (mn, kp) and s.strides == (4, 4 * tma)
    root = s.base
    assert root.size == kp * tma and np.all(root[:, mn:] == 0)  # padding: zeros
    check(x, q, s, gs)
    out_s, _ = vllm_packed(mn, kp)
    q2 = np.zeros(shape, E4)
    lk.per_token_group_fp8_quant_packed(x, q2, out_s, gs, 1e-10, -448.0, 448.0)
    np.testing.assert_array_equal(s, out_s)
    np.testing.assert_array_equal(q.view(np.uint8), q2.view(np.uint8))
    q3, s3 = lk.per_token_group_quant_fp8_packed_for_deepgemm(x, gs, eps=1e-10, use_ue8m0=True)
    np.testing.assert_array_equal(s3, s)


def test_wrapper_out_q(rng):
    x = make_x(rng, (2, 3, 64), 16, np.float32)
    want_q, want_s = lk.per_token_group_quant_fp8_packed_for_deepgemm(x, 16)
    flat = np.zeros((6, 64), E4)  # vLLM: out_q viewed as x (view_as)
    q, s = lk.per_token_group_quant_fp8_packed_for_deepgemm(x, 16, out_q=flat)
    assert q.shape == x.shape and np.shares_memory(q, flat)
    np.testing.assert_array_equal(flat.view(np.uint8).reshape(x.shape), want_q.view(np.uint8))
    np.testing.assert_array_equal(s, want_s)
    u8 = np.zeros(x.shape, np.uint8)  # a uint8 buffer: e4m3
    q, s = lk.per_token_group_quant_fp8_packed_for_deepgemm(x, 16, out_q=u8)
    assert q is u8
    np.testing.assert_array_equal(u8, want_q.view(np.uint8))


# ---------------------------------------------------------------- torch


@pytest.mark.parametrize("xdt", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape,gs", [((5, 7 * 16), 16), ((2, 3, 5 * 32), 32), ((4, 128), 128)])
def test_torch_raw_and_ops(rng, shape, gs, xdt):
    torch = torch_or_skip()
    import llmkern.torch  # noqa: F401
    x = torch.from_numpy(make_x(rng, shape, gs, np.float32)).to(getattr(torch, xdt))
    mn = int(np.prod(shape[:-1]))
    kp, tma = (shape[-1] // gs + 3) // 4, (mn + 3) // 4 * 4
    for call in (lk.per_token_group_fp8_quant_packed, torch.ops.llmkern.per_token_group_fp8_quant_packed):
        s = torch.empty_strided((mn, kp), (1, tma), dtype=torch.int32)
        store = s.as_strided((s.untyped_storage().nbytes() // 4,), (1,), 0)
        store.fill_(int(SENT))
        q = torch.empty(shape, dtype=torch.float8_e4m3fn)
        call(x, q, s, gs, 1e-10, -448.0, 448.0)
        check(x, q, s, gs)
        touched = torch.zeros(store.shape, dtype=torch.bool)
        touched.as_strided((mn, kp), (1, tma)).fill_(True)
        assert torch.all(store[~touched] == int(SENT))  # padding rows untouched
    qi = torch.zeros(shape, dtype=torch.int8)
    si = torch.zeros(mn, kp, dtype=torch.int32)
    torch.ops.llmkern.per_token_group_fp8_quant_packed(x, qi, si, gs, 1e-10, -128.0, 127.0)
    check(x, qi, si, gs, qdt=np.int8)


@pytest.mark.parametrize("shape,gs", [((5, 7 * 16), 16), ((2, 3, 3 * 16), 16), ((8, 256), 128)])
def test_torch_wrapper(rng, shape, gs):
    torch = torch_or_skip()
    x = torch.from_numpy(make_x(rng, shape, gs, np.float32)).to(torch.bfloat16)
    q, s = lk.per_token_group_quant_fp8_packed_for_deepgemm(x, gs)
    mn = int(np.prod(shape[:-1]))
    kp, tma = (shape[-1] // gs + 3) // 4, (mn + 3) // 4 * 4
    assert isinstance(q, torch.Tensor) and q.dtype == torch.float8_e4m3fn and q.shape == x.shape
    assert s.dtype == torch.int32 and tuple(s.shape) == (mn, kp) and s.stride() == (1, tma)
    store = s.as_strided((s.untyped_storage().nbytes() // 4,), (1,), 0)
    touched = torch.zeros(store.shape, dtype=torch.bool)
    touched.as_strided((mn, kp), (1, tma)).fill_(True)
    assert torch.all(store[~touched] == 0)  # the padding rows within the storage: zeros
    check(x, q, s, gs)
    out_q = torch.zeros(mn, shape[-1], dtype=torch.float8_e4m3fn)  # flat out_q: viewed as x
    q2, s2 = lk.per_token_group_quant_fp8_packed_for_deepgemm(x, gs, out_q=out_q)
    assert q2.shape == x.shape and q2.data_ptr() == out_q.data_ptr()
    assert torch.equal(q2.view(torch.uint8), q.view(torch.uint8)) and torch.equal(s2, s)


# ---------------------------------------------------------------- errors


def _args(rng, mn=5, ng=6, gs=16):
    x = make_x(rng, (mn, ng * gs), gs, np.float32)
    q = np.full(x.shape, QSENT, np.uint8).view(E4)
    return x, q


def _untouched(q, *bufs):
    assert np.all(q.view(np.uint8) == QSENT)
    for b in bufs:
        assert np.all(b == SENT)


def test_packed_errors(rng):
    x, q = _args(rng)
    bad = [
        (np.full((5, 2), 1.0, np.float32), TypeError, "output_s_packed: dtype float32, expected int32"),
        (np.full((5, 2), SENT, np.int64), TypeError, "output_s_packed: dtype int64"),
        (np.full((5, 2), SENT, np.uint32), TypeError, "output_s_packed: dtype uint32"),
        (np.full((5, 2), SENT, np.dtype(">i4")), TypeError, "output_s_packed: dtype"),
        (np.full(10, SENT, np.int32), ValueError, "output_s_packed: 1 dims"),
        (np.full((1, 5, 2), SENT, np.int32), ValueError, "output_s_packed: 3 dims"),
        (np.full((5, 3), SENT, np.int32), ValueError, r"output_s_packed: shape \(5, 3\), expected \[5, 2\]"),
        (np.full((5, 6), SENT, np.int32), ValueError, r"output_s_packed: shape \(5, 6\), expected \[5, 2\]"),
        (np.full((8, 2), SENT, np.int32), ValueError, r"output_s_packed: shape \(8, 2\)"),
        ([[0, 0]] * 5, TypeError, "output_s_packed: expected a NumPy array"),
    ]
    for out, exc, text in bad:
        before = np.array(out, copy=True)
        with pytest.raises(exc, match=text):
            lk.per_token_group_fp8_quant_packed(x, q, out, 16, 1e-10, -448.0, 448.0)
        _untouched(q)
        np.testing.assert_array_equal(np.asarray(out), before)
    ro = np.full((5, 2), SENT, np.int32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="output_s_packed: the array is read-only"):
        lk.per_token_group_fp8_quant_packed(x, q, ro, 16, 1e-10, -448.0, 448.0)
    _untouched(q)


def test_overlap_errors(rng):
    """output_s_packed sharing bytes with output_q or input: LK_ERR_ALIAS naming both,
    nothing written (the packing runs after the C call, so it would overwrite codes)."""
    x, q = _args(rng)
    qb = q.view(np.uint8)
    inq = qb.reshape(-1)[:40].view(np.int32).reshape(5, 2)  # the first 40 bytes of output_q
    with pytest.raises(lk.LlmkernError, match="output_s_packed and output_q overlap") as e:
        lk.per_token_group_fp8_quant_packed(x, q, inq, 16, 1e-10, -448.0, 448.0)
    assert e.value.status == "LK_ERR_ALIAS"
    _untouched(q)
    xb = x.copy()
    inx = x.reshape(-1)[:10].view(np.int32).reshape(5, 2)
    with pytest.raises(lk.LlmkernError, match="output_s_packed and input overlap"):
        lk.per_token_group_fp8_quant_packed(x, q, inx, 16, 1e-10, -448.0, 448.0)
    _untouched(q)
    np.testing.assert_array_equal(x, xb)
    # a separate buffer right after output_q's bytes is fine
    buf = np.full(q.size + 40, QSENT, np.uint8)
    q2 = buf[:q.size].view(E4).reshape(q.shape)
    after = buf[q.size:].view(np.int32).reshape(5, 2)
    lk.per_token_group_fp8_quant_packed(x, q2, after, 16, 1e-10, -448.0, 448.0)
    want = np.full((5, 2), SENT, np.int32)
    lk.per_token_group_fp8_quant_packed(x, q, want, 16, 1e-10, -448.0, 448.0)
    np.testing.assert_array_equal(after, want)


def test_other_errors(rng):
    x, q = _args(rng)
    out = np.full((5, 2), SENT, np.int32)
    # group_size not dividing K (C's check, before any store), bad values
    for gs, status in ((5, "LK_ERR_SHAPE"), (0, "LK_ERR_VALUE"), (-16, "LK_ERR_VALUE")):
        with pytest.raises(lk.LlmkernError) as e:
            lk.per_token_group_fp8_quant_packed(x, q, out, gs, 1e-10, -448.0, 448.0)
        assert e.value.status == status and "group_size: %d" % gs in str(e.value)
        _untouched(q, out)
    with pytest.raises(lk.LlmkernError, match="group_size: 5 does not divide x's last dim"):
        lk.per_token_group_quant_fp8_packed_for_deepgemm(x, 5)
    with pytest.raises(TypeError, match="group_size"):
        lk.per_token_group_fp8_quant_packed(x, q, out, 16.0, 1e-10, -448.0, 448.0)
    # output_q: e5m2 / f32 refused here, a wrong shape by C (naming output_q)
    for bad_q, exc, text in ((np.zeros(x.shape, ml.float8_e5m2), TypeError, "output_q: dtype float8_e5m2"),
                             (np.zeros(x.shape, np.float32), TypeError, "output_q: dtype float32"),
                             (np.zeros((5, 64), E4), lk.LlmkernError, "output_q")):
        with pytest.raises(exc, match=text):
            lk.per_token_group_fp8_quant_packed(x, bad_q, out, 16, 1e-10, -448.0, 448.0)
        assert not bad_q.view(np.uint8).any()
        _untouched(q, out)
    # fp8_min / fp8_max: output_q's own range only
    for lo, hi, qq in ((-240.0, 240.0, q), (-128.0, 127.0, q), (-448.0, 448.0, np.zeros(x.shape, np.int8))):
        with pytest.raises(ValueError, match="fp8_min, fp8_max"):
            lk.per_token_group_fp8_quant_packed(x, qq, out, 16, 1e-10, lo, hi)
        _untouched(q, out)
    # eps out of range: C's check, nothing written
    with pytest.raises(lk.LlmkernError, match="eps"):
        lk.per_token_group_fp8_quant_packed(x, q, out, 16, 0.0, -448.0, 448.0)
    _untouched(q, out)
    with pytest.raises(lk.LlmkernError, match="input"):
        lk.per_token_group_fp8_quant_packed(x.astype(np.int32), q, out, 16, 1e-10, -448.0, 448.0)
    _untouched(q, out)


def test_wrapper_errors(rng):
    x, _ = _args(rng)
    with pytest.raises(ValueError, match="use_ue8m0: False"):
        lk.per_token_group_quant_fp8_packed_for_deepgemm(x, 16, use_ue8m0=False)
    for bad in (np.zeros(x.shape, ml.float8_e5m2), np.zeros(x.shape, np.int8)):
        with pytest.raises(TypeError, match="out_q: dtype"):
            lk.per_token_group_quant_fp8_packed_for_deepgemm(x, 16, out_q=bad)
        assert not bad.view(np.uint8).any()
    with pytest.raises(ValueError, match="out_q: shape"):
        lk.per_token_group_quant_fp8_packed_for_deepgemm(x, 16, out_q=np.zeros((5, 95), E4))
    with pytest.raises(ValueError, match="out_q: shape"):  # viewing it as x would need a copy
        lk.per_token_group_quant_fp8_packed_for_deepgemm(x, 16, out_q=np.zeros(x.shape, E4).T)
    with pytest.raises(ValueError, match="x: a 0-d input"):
        lk.per_token_group_quant_fp8_packed_for_deepgemm(np.float32(1.0) * np.ones(()), 16)


def test_torch_errors(rng):
    torch = torch_or_skip()
    import llmkern.torch  # noqa: F401
    x = torch.from_numpy(make_x(rng, (5, 96), 16, np.float32))
    q = torch.full((5, 96), QSENT, dtype=torch.uint8).view(torch.float8_e4m3fn)
    for out, exc, text in ((torch.full((5, 2), 7.0), TypeError, "output_s_packed: dtype torch.float32"),
                           (torch.full((5, 2), 7, dtype=torch.int64), TypeError, "output_s_packed: dtype torch.int64"),
                           (torch.full((5, 3), 7, dtype=torch.int32), ValueError, "output_s_packed: shape"),
                           (torch.full((10,), 7, dtype=torch.int32), ValueError, "output_s_packed: 1 dims")):
        for call in (lk.per_token_group_fp8_quant_packed, torch.ops.llmkern.per_token_group_fp8_quant_packed):
            with pytest.raises(exc, match=text):
                call(x, q, out, 16, 1e-10, -448.0, 448.0)
            assert torch.all(out == 7) and torch.all(q.view(torch.uint8) == QSENT)
    out = torch.full((5, 2), 7, dtype=torch.int32)
    with pytest.raises(lk.LlmkernError, match="group_size: 5"):
        torch.ops.llmkern.per_token_group_fp8_quant_packed(x, q, out, 5, 1e-10, -448.0, 448.0)
    assert torch.all(out == 7) and torch.all(q.view(torch.uint8) == QSENT)
    with pytest.raises(ValueError, match="use_ue8m0"):
        lk.per_token_group_quant_fp8_packed_for_deepgemm(x, 16, use_ue8m0=False)


def test_exported():
    for n in ("per_token_group_fp8_quant_packed", "per_token_group_quant_fp8_packed_for_deepgemm"):
        assert n in lk.__all__ and callable(getattr(lk, n))
