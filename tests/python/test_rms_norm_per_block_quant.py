"""RMSNorm with dynamic per-block quantization (vLLM's rms_norm_per_block_quant: the norm
before block-fp8 GEMMs, DeepSeek-V3's groups of 128): the raw op
rms_norm_per_block_quant_into(result, input, weight, scale, epsilon, scale_ub, residual,
group_size, is_scale_transposed) (torch.ops._C's argument order; torch.ops.llmkern's too)
and vLLM's allocating wrapper rms_norm_per_block_quant(input, weight, epsilon, quant_dtype,
[1, group_size], scale_ub, residual, is_scale_transposed) -> (out, scales), against a NumPy
float64 reference of the contract (include/llmkern.h, docs/numerics.md "fp8 activations"):
  v = input, or round(input + residual) (stored to residual)
  y = v / sqrt(mean(v^2) + epsilon) * weight
  scale[r, g] = max(min(absmax(y[r, block g]), scale_ub) / qmax, min_scale)
      fp8: qmax = fp8_max, min_scale = 1 / (fp8_max * 512); int8: 127, FLT_EPSILON
  q = fp8(y / scale) / i8(y * (1 / scale))
scales within the norms' relative slack 1e-5 + 3e-8 D of the float64 value, codes within
half a step of y64 / scale plus that slack; bit for bit: the per-token op when group_size
== D, the scales of coarser groups (the max of the finer ones, an exact f32 identity), row-
major against column-major scales, NumPy against torch, every ISA and thread count.
f32 / f16 / bf16 inputs, e4m3 / e5m2 / int8 outputs, group sizes 64 and 128, D up to 7168,
2-D and 3-D inputs, with and without residual, weight and scale_ub; vLLM's transposed
scales (is_scale_transposed); the error cases."""
import numpy as np
import pytest

import llmkern as lk
from helpers import torch_or_skip, usable_isas

ml = pytest.importorskip("ml_dtypes")
E4, E5, BF16 = ml.float8_e4m3fn, ml.float8_e5m2, ml.bfloat16
I8 = np.int8
QMAX = {E4: 448.0, E5: 57344.0, I8: 127.0}
MIN_SCALE = {E4: 1.0 / (448.0 * 512.0), E5: 1.0 / (57344.0 * 512.0), I8: 2.0 ** -23}
FMT = {E4: (3, -6), E5: (2, -14)}  # mantissa bits, exponent of the smallest normal
EPS = 1e-6
SENTINEL = -7.0
TORCH_Q = {"float8_e4m3fn": E4, "float8_e5m2": E5, "int8": I8}


# ---------------------------------------------------------------- reference


def blocks(a, G):
    a = np.asarray(a)
    return a.reshape(a.shape[:-1] + (a.shape[-1] // G, G))


def rel_slack(D):
    """the norms' relative slack (docs/numerics.md): f32 sum of squares, products"""
    return 1e-5 + 3e-8 * D


def ref_v(x, res):
    """the normed input: x, or round(x + res) in res's dtype (what residual holds after)"""
    if res is None:
        return np.asarray(x)
    return (np.asarray(x).astype(np.float32) + np.asarray(res).astype(np.float32)).astype(np.asarray(res).dtype)


def ref_y(v, w, eps=EPS):
    v = np.asarray(v).astype(np.float64)
    y = v / np.sqrt((v * v).mean(-1, keepdims=True) + eps)
    return y if w is None else y * np.asarray(w).astype(np.float64)


def ref_scales(y, G, qdt, ub=None):
    """float64 scales y.shape[:-1] + (D // G,)"""
    am = np.abs(blocks(y, G)).max(-1) if y.shape[-1] else np.zeros(y.shape[:-1] + (0,))
    if ub is not None:
        am = np.minimum(am, float(np.float32(ub)))
    return np.maximum(am / QMAX[qdt], MIN_SCALE[qdt])


def half_step(t, dt):
    """half the fp8 step at |t| (subnormals: the smallest normal's step)"""
    mb, emin = FMT[dt]
    e = np.floor(np.log2(np.maximum(np.abs(t), 2.0 ** emin)))
    return 2.0 ** (e - mb - 1)


def codes_f64(q, qdt):
    q = np.asarray(q)
    if qdt is I8:
        return q.astype(np.float64)
    return q.view(qdt).astype(np.float64)


def check(x, w, res_in, res_out, q, s, G, qdt, ub=None):
    """q, s (and the residual written, res_out) against the float64 reference of x, w,
    res_in (NumPy values as stored); s may be flat [rows, D / G]."""
    D = x.shape[-1]
    rel = rel_slack(D)
    v = ref_v(x, res_in)
    if res_in is not None:
        np.testing.assert_array_equal(np.asarray(res_out).view(np.uint8), np.asarray(v).view(np.uint8))
    y = ref_y(v, w)
    s64 = ref_scales(y, G, qdt, ub)
    s = np.asarray(s).reshape(s64.shape)
    assert s.dtype == np.float32
    assert np.all(np.abs(s.astype(np.float64) - s64) <= (rel + 2.0 ** -23) * s64), np.abs(s / s64 - 1).max()
    # codes: within half a step of y64 / scale (the op's scale) plus the norms' slack
    se = np.repeat(s.astype(np.float64), G, axis=-1)
    t = y / se
    qmax = QMAX[qdt]
    tc = np.clip(t, -qmax if qdt is not I8 else -128.0, qmax)
    got = codes_f64(q, qdt)
    assert got.shape == x.shape
    if qdt is I8:
        bound = 0.5 + rel * np.abs(t)
    else:
        bound = half_step(np.abs(tc) * (1 + rel), qdt) * (1 + 1e-6) + rel * np.abs(t)
    err = np.abs(got - tc)
    assert np.all(err <= bound), (err - bound).max()
    # a block not held at the minimum scale reaches +-qmax: its absmax, or past scale_ub
    # saturation (int8: -128 too)
    full = s64 > MIN_SCALE[qdt] * (1 + 2 * rel)
    qm = np.abs(blocks(got, G)).max(-1) if D else np.zeros(s64.shape)
    am = np.abs(blocks(y, G)).max(-1) if D else np.zeros(s64.shape)
    held = np.zeros(s64.shape, bool) if ub is None else am > float(np.float32(ub)) * (1 + rel)
    np.testing.assert_array_equal(qm[full & ~held], qmax)
    assert np.all((qm[full & held] == qmax) | ((qdt is I8) & (qm[full & held] == 128)))
    return s64


def make_x(rng, shape, G, xdt, zero_block=True):
    """Gaussian blocks of magnitudes 1e-2 .. 1e2 (one scale each; the small ones end at the
    minimum scale), one all-zero block."""
    ng = shape[-1] // G
    mag = 10.0 ** rng.uniform(-2, 2, shape[:-1] + (ng, 1))
    x = (rng.standard_normal(shape[:-1] + (ng, G)) * mag).reshape(shape)
    if zero_block:
        x.reshape(-1)[:G] = 0.0
    return x.astype(xdt)


def make_case(rng, shape, G, xdt, weight, residual):
    x = make_x(rng, shape, G, xdt)
    w = (1 + 0.2 * rng.standard_normal(shape[-1])).astype(xdt) if weight else None
    res = None
    if residual:
        res = make_x(rng, shape, G, xdt, zero_block=False) * xdt(0.5)
        res.reshape(-1)[:G] = 0  # keep the zero block
    return x, w, res


def median_ub(x, w, res, G, qdt):
    """a scale_ub that binds about half the blocks"""
    y = ref_y(ref_v(x, res), w)
    return float(np.float32(np.median(np.abs(blocks(y, G)).max(-1))))


def to_np(t):
    """NumPy values of a torch tensor (bf16 as ml_dtypes' bfloat16, float8 as ml_dtypes')."""
    import torch
    name = str(t.dtype).replace("torch.", "")
    if name == "bfloat16":
        return t.view(torch.int16).numpy().view(BF16)
    if name in ("float8_e4m3fn", "float8_e5m2"):
        return t.view(torch.uint8).numpy().view(TORCH_Q[name])
    return t.numpy()


# ---------------------------------------------------------------- NumPy


@pytest.mark.parametrize("ub", [False, True])
@pytest.mark.parametrize("weight", [True, False])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("qdt", [E4, E5, I8])
@pytest.mark.parametrize("xdt", [np.float32, np.float16, BF16])
@pytest.mark.parametrize("G", [64, 128])
@pytest.mark.parametrize("shape", [(5, 7168), (2, 3, 512)])
def test_numpy(rng, shape, G, xdt, qdt, residual, weight, ub):
    x, w, res = make_case(rng, shape, G, xdt, weight, residual)
    res0 = None if res is None else res.copy()
    ubv = median_ub(x, w, res, G, qdt) if ub else None
    scale_ub = None if ubv is None else np.array([ubv], np.float32)
    rows, ng = int(np.prod(shape[:-1])), shape[-1] // G
    q, s = lk.rms_norm_per_block_quant(x, w, EPS, qdt, [1, G], scale_ub, res)
    assert q.dtype == qdt and q.shape == x.shape
    assert s.dtype == np.float32 and s.shape == (rows, ng) and s.flags.c_contiguous
    check(x, w, res0, res, q, s, G, qdt, ubv)
    # the raw op into given buffers, [..., D / G] scales, scale_ub a number: the same bits
    q2 = np.full(shape, 3, qdt if qdt is I8 else np.uint8).view(qdt)
    s2 = np.full(shape[:-1] + (ng,), SENTINEL, np.float32)
    r2 = None if res0 is None else res0.copy()
    lk.ops.rms_norm_per_block_quant_into(q2, x, w, s2, EPS, ubv, r2, G, False)
    np.testing.assert_array_equal(q2.view(np.uint8), q.view(np.uint8))
    np.testing.assert_array_equal(s2.reshape(rows, ng), s)
    if res is not None:
        np.testing.assert_array_equal(r2.view(np.uint8), res.view(np.uint8))
    # vLLM's transposed scales: the same values
    r3 = None if res0 is None else res0.copy()
    q3, s3 = lk.rms_norm_per_block_quant(x, w, EPS, qdt, (1, G), scale_ub, r3, is_scale_transposed=True)
    assert s3.shape == (rows, ng) and tuple(st // 4 for st in s3.strides) == (1, rows)
    np.testing.assert_array_equal(s3, s)
    np.testing.assert_array_equal(q3.view(np.uint8), q.view(np.uint8))


@pytest.mark.parametrize("qdt", [E4, E5, I8])
@pytest.mark.parametrize("xdt", [np.float32, np.float16, BF16])
@pytest.mark.parametrize("D", [64, 128, 7168])
def test_group_size_D_is_per_token(rng, D, xdt, qdt):
    """group_size == D: the per-token op's bits (scales, codes, residual)."""
    x, w, res = make_case(rng, (6, D), 64, xdt, True, True)
    for ub in (None, np.array([median_ub(x, w, res, D, qdt)], np.float32)):
        r1, r2 = res.copy(), res.copy()
        q1, s1 = lk.rms_norm_per_block_quant(x, w, EPS, qdt, [1, D], ub, r1)
        q2, s2 = lk.rms_norm_dynamic_per_token_quant(x, w, EPS, qdt, ub, r2)
        assert s1.shape == s2.shape == (6, 1)
        np.testing.assert_array_equal(s1, s2)
        np.testing.assert_array_equal(q1.view(np.uint8), q2.view(np.uint8))
        np.testing.assert_array_equal(r1.view(np.uint8), r2.view(np.uint8))
        check(x, w, res, r1, q1, s1, D, qdt, None if ub is None else float(ub[0]))


@pytest.mark.parametrize("qdt", [E4, I8])
@pytest.mark.parametrize("xdt", [np.float32, BF16])
def test_coarser_groups_exact(rng, xdt, qdt):
    """One y for every group size: a coarser block's scale is exactly the max of its finer
    blocks' (max and the f32 division are monotone), and the finer block holding that max
    has the same codes."""
    T, D = 7, 1024
    x, w, _ = make_case(rng, (T, D), 64, xdt, True, False)
    ub = np.array([median_ub(x, w, None, 128, qdt)], np.float32)
    for scale_ub in (None, ub):
        res = {G: lk.rms_norm_per_block_quant(x, w, EPS, qdt, [1, G], scale_ub) for G in (64, 128, 256, D)}
        for fine, coarse in ((64, 128), (128, 256), (64, D)):
            qf, sf = res[fine]
            qc, sc = res[coarse]
            k = coarse // fine
            np.testing.assert_array_equal(sc, sf.reshape(T, -1, k).max(-1))
            qfb = blocks(qf.view(np.uint8), coarse).reshape(T, D // coarse, k, fine)
            qcb = blocks(qc.view(np.uint8), coarse).reshape(T, D // coarse, k, fine)
            arg = sf.reshape(T, -1, k).argmax(-1)
            for r in range(T):
                for b in range(D // coarse):
                    np.testing.assert_array_equal(qcb[r, b, arg[r, b]], qfb[r, b, arg[r, b]])


def test_transposed_scale_forms(rng):
    """The raw op's scale layouts: vLLM's transposed view of a [D / G, rows] buffer (a
    padded one too: the padding survives), that buffer itself with the flag (taken as its
    transposed view), row-major scales with the flag; a column-major scale without the flag
    raises ValueError before any store."""
    T, D, G = 6, 1024, 128
    ng = D // G
    x, w, res = make_case(rng, (T, D), G, np.float32, True, True)
    want_q, want_s = lk.rms_norm_per_block_quant(x, w, EPS, E4, [1, G], None, res.copy())

    def run(scale, flag):
        q = np.zeros((T, D), E4)
        r = res.copy()
        lk.ops.rms_norm_per_block_quant_into(q, x, w, scale, EPS, None, r, G, flag)
        np.testing.assert_array_equal(q.view(np.uint8), want_q.view(np.uint8))
        np.testing.assert_array_equal(r, ref_v(x, res))

    buf = np.full((ng, T + 2), SENTINEL, np.float32)  # padded rows, as TMA-aligned buffers
    run(buf[:, :T].T, True)
    np.testing.assert_array_equal(buf[:, :T].T, want_s)
    assert np.all(buf[:, T:] == SENTINEL)
    buf = np.full((ng, T), SENTINEL, np.float32)
    run(buf, True)  # [D / G, rows] with the flag: its transposed view
    np.testing.assert_array_equal(buf.T, want_s)
    rm = np.full((T, ng), SENTINEL, np.float32)
    run(rm, True)  # row-major with the flag: the strides decide
    np.testing.assert_array_equal(rm, want_s)
    # rows == D / G: [8, 8] is [rows, D / G] whatever the flag (no transposition)
    x8, w8, _ = make_case(rng, (8, 8 * G), G, np.float32, True, False)
    wq, ws = lk.rms_norm_per_block_quant(x8, w8, EPS, E4, [1, G])
    for flag in (False, True):
        sq = np.full((8, 8), SENTINEL, np.float32)
        lk.ops.rms_norm_per_block_quant_into(np.zeros(x8.shape, E4), x8, w8, sq, EPS, None, None, G, flag)
        np.testing.assert_array_equal(sq, ws)
    # without the flag: vLLM refuses an outer stride > 1
    q = np.full((T, D), 5, np.uint8)
    buf = np.full((ng, T), SENTINEL, np.float32)
    r = res.copy()
    with pytest.raises(ValueError, match=r"scale: shape \[6, 8\] with strides \[1, 6\].*is_scale_transposed=True"):
        lk.ops.rms_norm_per_block_quant_into(q, x, w, buf.T, EPS, None, r, G, False)
    assert np.all(q == 5) and np.all(buf == SENTINEL) and np.array_equal(r, res)
    with pytest.raises(lk.LlmkernError) as e:  # the [D / G, rows] buffer without the flag: C's shape error
        lk.ops.rms_norm_per_block_quant_into(q, x, w, buf, EPS, None, r, G, False)
    assert e.value.status == "LK_ERR_SHAPE" and "scale: shape [8, 6]" in str(e.value)
    # one block per row (D / G == 1): any stride of the size-1 dim is fine
    x1 = make_x(rng, (T, G), G, np.float32)
    s1 = np.full((1, T), SENTINEL, np.float32)
    lk.ops.rms_norm_per_block_quant_into(np.zeros((T, G), E4), x1, None, s1.T, EPS, None, None, G, False)
    np.testing.assert_array_equal(s1.T, lk.rms_norm_per_block_quant(x1, None, EPS, E4, [1, G])[1])


def test_3d_input_scale_forms(rng):
    """[B, S, D]: scales [B, S, D / G] (input's leading dims), [B * S, D / G] (vLLM's flat
    form) and, with the flag, [D / G, B * S] / its transposed view."""
    B, S, D, G = 2, 3, 512, 64
    x, w, res = make_case(rng, (B, S, D), G, np.float16, True, True)
    want_q, want_s = lk.rms_norm_per_block_quant(x, w, EPS, E5, [1, G], None, res.copy())
    assert want_s.shape == (B * S, D // G)
    check(x, w, res, ref_v(x, res), want_q, want_s, G, E5)
    for scale, flag, get in ((np.zeros((B, S, D // G), np.float32), False, lambda s: s.reshape(B * S, -1)),
                             (np.zeros((B * S, D // G), np.float32), False, lambda s: s),
                             (np.zeros((D // G, B * S), np.float32), True, lambda s: s.T),
                             (np.zeros((D // G, B * S), np.float32).T, True, lambda s: s)):
        q = np.zeros(x.shape, E5)
        lk.ops.rms_norm_per_block_quant_into(q, x, w, scale, EPS, None, res.copy(), G, flag)
        np.testing.assert_array_equal(q.view(np.uint8), want_q.view(np.uint8))
        np.testing.assert_array_equal(get(scale), want_s)
    q, s = lk.rms_norm_per_block_quant(x, w, EPS, E5, [1, G], None, res.copy(), True)
    assert s.shape == (B * S, D // G) and tuple(st // 4 for st in s.strides) == (1, B * S)
    np.testing.assert_array_equal(s, want_s)


def test_strided_input(rng):
    """a column slice and a last-dim stride of 2 give the contiguous input's bits"""
    base = make_x(rng, (5, 2048), 128, np.float32)
    for x in (base[:, 512:1536], base[:, ::2]):
        q, s = lk.rms_norm_per_block_quant(x, None, EPS, E4, [1, 128])
        rq, rs = lk.rms_norm_per_block_quant(np.ascontiguousarray(x), None, EPS, E4, [1, 128])
        np.testing.assert_array_equal(q.view(np.uint8), rq.view(np.uint8))
        np.testing.assert_array_equal(s, rs)
        check(x, None, None, None, q, s, 128, E4)


def test_every_isa_and_thread_count(rng):
    x, w, res = make_case(rng, (33, 7168), 128, BF16, True, True)
    prev, nthr = lk.isa(), lk.get_num_threads()
    isas = usable_isas(lk)
    got = []
    try:
        for name in isas:
            lk.set_isa(name)
            for n in (1, 0):
                lk.set_num_threads(n)
                for qdt in (E4, I8):
                    r = res.copy()
                    q, s = lk.rms_norm_per_block_quant(x, w, EPS, qdt, [1, 128], None, r, True)
                    got.append((name, n, qdt, q.view(np.uint8).copy(), s.copy(), r))
    finally:
        lk.set_isa(prev)
        lk.set_num_threads(nthr)
    for name, n, qdt, q, s, r in got:
        first = [g for g in got if g[2] is qdt][0]
        assert np.array_equal(q, first[3]) and np.array_equal(s, first[4]), (name, n, qdt)
        assert np.array_equal(r.view(np.uint16), first[5].view(np.uint16))
    for qdt in (E4, I8):
        first = [g for g in got if g[2] is qdt][0]
        check(x, w, res, first[5], first[3].view(qdt) if qdt is not I8 else first[3].view(I8), first[4], 128, qdt)


def test_uint8_result_and_names(rng):
    """a uint8 result buffer is e4m3; quant_dtype by name; exported"""
    x, w, _ = make_case(rng, (3, 256), 64, np.float32, True, False)
    want_q, want_s = lk.rms_norm_per_block_quant(x, w, EPS, "float8_e4m3fn", [1, 64])
    assert want_q.dtype == E4
    u8, s = np.zeros((3, 256), np.uint8), np.zeros((3, 4), np.float32)
    lk.ops.rms_norm_per_block_quant_into(u8, x, w, s, EPS, None, None, 64, False)
    np.testing.assert_array_equal(u8, want_q.view(np.uint8))
    np.testing.assert_array_equal(s, want_s)
    q8, _ = lk.rms_norm_per_block_quant(x, w, EPS, "int8", [1, 64])
    assert q8.dtype == np.int8
    assert "rms_norm_per_block_quant" in lk.__all__ and lk.rms_norm_per_block_quant is lk.ops.rms_norm_per_block_quant


def test_empty():
    for qdt in (E4, I8):
        for flag in (False, True):
            q, s = lk.rms_norm_per_block_quant(np.zeros((0, 256), np.float32), None, EPS, qdt, [1, 128],
                                               is_scale_transposed=flag)
            assert q.shape == (0, 256) and s.shape == (0, 2)
            q, s = lk.rms_norm_per_block_quant(np.zeros((3, 0), np.float32), None, EPS, qdt, [1, 128],
                                               is_scale_transposed=flag)
            assert q.shape == (3, 0) and s.shape == (3, 0)


def test_special_blocks():
    """an all-zero row (every block at the minimum scale, codes 0) and a row whose second
    block is held at the minimum (values far below the row's RMS)"""
    G = 64
    x = np.zeros((3, 2 * G), np.float32)
    x[1, :G] = np.linspace(-4, 4, G)
    x[1, G:] = 1e-6
    x[2] = np.tile([1.0, -2.0], G)
    for qdt in (E4, E5, I8):
        q, s = lk.rms_norm_per_block_quant(x, None, EPS, qdt, [1, G])
        assert np.all(s[0] == np.float32(MIN_SCALE[qdt])) and not q[0].view(np.uint8).any()
        assert s[1, 1] == np.float32(MIN_SCALE[qdt])
        check(x, None, None, None, q, s, G, qdt)
        assert codes_f64(q, qdt)[2, 1] == -QMAX[qdt]


# ---------------------------------------------------------------- errors


def test_group_size_errors(rng):
    x, w, res = make_case(rng, (4, 256), 64, np.float32, True, True)
    for G, status, text in ((0, "LK_ERR_VALUE", "group_size: 0, expected >= 1"),
                            (-64, "LK_ERR_VALUE", "group_size: -64, expected >= 1"),
                            (48, "LK_ERR_SHAPE",
                             "group_size: 48 does not divide input's last dim 256 (input [4, 256])"),
                            (512, "LK_ERR_SHAPE", "group_size: 512 does not divide")):
        q = np.full(x.shape, 7, np.uint8)
        sc = np.full((4, 4), SENTINEL, np.float32)
        r = res.copy()
        with pytest.raises(lk.LlmkernError) as e:
            lk.ops.rms_norm_per_block_quant_into(q, x, w, sc, EPS, None, r, G, False)
        assert e.value.status == status and text in str(e.value), str(e.value)
        assert "lk_rms_norm_per_block_quant" in str(e.value)
        assert np.all(q == 7) and np.all(sc == SENTINEL) and np.array_equal(r, res)  # validated before any store
        for flag in (False, True):
            with pytest.raises(lk.LlmkernError) as e:
                lk.rms_norm_per_block_quant(x, w, EPS, E4, [1, G], None, r, flag)
            assert e.value.status == status and text in str(e.value)
        assert np.array_equal(r, res)
    for bad in (64.0, True, None, "64"):
        with pytest.raises(TypeError, match="group_size"):
            lk.ops.rms_norm_per_block_quant_into(np.zeros(x.shape, E4), x, w, np.zeros((4, 4), np.float32), EPS,
                                                 None, None, bad, False)
    for bad in (64, [64], [1, 64, 1], [1, 64.0], None):
        with pytest.raises(TypeError, match=r"group_size: .*expected a block shape \[1, group_size\]"):
            lk.rms_norm_per_block_quant(x, w, EPS, E4, bad)
    for bad in ([2, 64], [64, 64], (0, 64), [-1, 64]):
        with pytest.raises(ValueError, match=r"group_size: .*expected \[1, group_size\]"):
            lk.rms_norm_per_block_quant(x, w, EPS, E4, bad)


def test_argument_errors(rng):
    x, w, res = make_case(rng, (4, 256), 64, np.float32, True, True)
    q, sc = np.zeros(x.shape, E4), np.zeros((4, 4), np.float32)
    cases = [
        (dict(scale=np.zeros((4, 3), np.float32)), "LK_ERR_SHAPE", "scale: shape [4, 3], expected [4, 4]"),
        (dict(scale=np.zeros((2, 2, 4), np.float32)), "LK_ERR_SHAPE", "scale: shape [2, 2, 4]"),
        (dict(scale=np.zeros((4, 4), np.float16)), "LK_ERR_DTYPE", "scale: dtype f16"),
        (dict(scale=None), "LK_ERR_NULL", "scale: tensor pointer is NULL"),
        (dict(result=np.zeros(x.shape, np.float32)), "LK_ERR_DTYPE", "result: dtype f32"),
        (dict(result=np.zeros((4, 128), E4)), "LK_ERR_SHAPE", "result"),
        (dict(input=np.zeros((4, 256), np.int32)), "LK_ERR_DTYPE", "input"),
        (dict(weight=np.ones(128, np.float32)), "LK_ERR_SHAPE", "weight: shape [128]"),
        (dict(residual=np.zeros((4, 128), np.float32)), "LK_ERR_SHAPE", "residual"),
        (dict(epsilon=-1.0), "LK_ERR_VALUE", "epsilon"),
        (dict(scale_ub=0.0), "LK_ERR_VALUE", "scale_ub"),
        (dict(scale_ub=np.array([np.nan], np.float32)), "LK_ERR_VALUE", "scale_ub"),
        (dict(scale_ub=np.array([1.0, 2.0], np.float32)), "LK_ERR_SHAPE", "scale_ub"),
    ]
    for kw, status, text in cases:
        a = dict(result=q, input=x, weight=w, scale=sc, epsilon=EPS, scale_ub=None, residual=res.copy())
        a.update(kw)
        with pytest.raises(lk.LlmkernError) as e:
            lk.ops.rms_norm_per_block_quant_into(a["result"], a["input"], a["weight"], a["scale"], a["epsilon"],
                                                 a["scale_ub"], a["residual"], 64, False)
        assert e.value.status == status and text in str(e.value), (kw, str(e.value))
        assert "lk_rms_norm_per_block_quant" in str(e.value)
    assert not q.view(np.uint8).any() and not sc.any()
    ro = np.zeros(x.shape, E4)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="result: the array is read-only"):
        lk.ops.rms_norm_per_block_quant_into(ro, x, w, sc, EPS, None, None, 64, False)
    ros = np.zeros((4, 4), np.float32)
    ros.flags.writeable = False
    with pytest.raises(ValueError, match="scale: the array is read-only"):
        lk.ops.rms_norm_per_block_quant_into(q, x, w, ros, EPS, None, None, 64, False)
    with pytest.raises(NotImplementedError, match="quant_dtype"):
        lk.rms_norm_per_block_quant(x, w, EPS, np.int16, [1, 64])
    with pytest.raises(lk.LlmkernError) as e:  # the wrapper: the raw op's names
        lk.rms_norm_per_block_quant(x, w, EPS, E4, [1, 64], residual=np.zeros((4, 128), np.float32))
    assert e.value.status == "LK_ERR_SHAPE" and "residual" in str(e.value)


# ---------------------------------------------------------------- torch


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("qdt", ["float8_e4m3fn", "float8_e5m2", "int8"])
@pytest.mark.parametrize("xdt", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape,G", [((5, 7168), 128), ((2, 3, 512), 64)])
def test_torch(rng, shape, G, xdt, qdt, residual, transposed):
    torch = torch_or_skip()
    tdt = getattr(torch, xdt)
    x, w, res = make_case(rng, shape, G, np.float32, True, residual)
    xt, wt = torch.from_numpy(x).to(tdt), torch.from_numpy(w).to(tdt)
    rt = None if res is None else torch.from_numpy(res).to(tdt)
    r0 = None if rt is None else to_np(rt).copy()
    ubv = median_ub(to_np(xt), to_np(wt), r0, G, TORCH_Q[qdt])
    fq = getattr(torch, qdt)
    q, s = lk.rms_norm_per_block_quant(xt, wt, EPS, fq, [1, G], torch.tensor([ubv]), rt, transposed)
    rows, ng = int(np.prod(shape[:-1])), shape[-1] // G
    assert isinstance(q, torch.Tensor) and q.dtype == fq and q.shape == xt.shape
    assert isinstance(s, torch.Tensor) and s.dtype == torch.float32 and tuple(s.shape) == (rows, ng)
    assert s.stride() == ((1, rows) if transposed else (ng, 1))
    check(to_np(xt), to_np(wt), r0, None if rt is None else to_np(rt), to_np(q), s.numpy(), G, TORCH_Q[qdt], ubv)
    # the NumPy path on the same values: the same bits
    rn = None if r0 is None else r0.copy()
    nq, ns = lk.rms_norm_per_block_quant(to_np(xt), to_np(wt), EPS, TORCH_Q[qdt], [1, G], ubv, rn, transposed)
    np.testing.assert_array_equal(to_np(q).view(np.uint8), nq.view(np.uint8))
    np.testing.assert_array_equal(s.numpy(), ns)


def test_torch_raw_op_as_vllm_calls_it(rng):
    """torch.ops._C's argument order through the binding and torch.ops.llmkern: vLLM's
    column-major scales (torch.empty(D / G, T).transpose(0, 1)), row-major ones, the
    [D / G, T] buffer with the flag; the ValueError without it."""
    torch = torch_or_skip()
    import llmkern.torch  # noqa: F401
    T, D, G = 9, 7168, 128
    x, w, res = make_case(rng, (T, D), G, np.float32, True, True)
    xt, wt, rt = (torch.from_numpy(a).to(torch.bfloat16) for a in (x, w, res))
    want_q, want_s = lk.rms_norm_per_block_quant(xt, wt, EPS, torch.float8_e4m3fn, [1, G], None, rt.clone())
    want_r = rt.clone()
    lk.rms_norm_per_block_quant(xt, wt, EPS, torch.float8_e4m3fn, [1, G], None, want_r)
    for call in (lk.ops.rms_norm_per_block_quant_into, torch.ops.llmkern.rms_norm_per_block_quant):
        for make_s, flag, get in ((lambda: torch.empty(D // G, T).transpose(0, 1), True, lambda s: s),
                                  (lambda: torch.empty(T, D // G), False, lambda s: s),
                                  (lambda: torch.empty(D // G, T), True, lambda s: s.t())):
            q, s, r = torch.empty(T, D, dtype=torch.float8_e4m3fn), make_s(), rt.clone()
            call(q, xt, wt, s, EPS, None, r, G, flag)
            assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
            assert torch.equal(get(s), want_s) and torch.equal(r, want_r)
    q8 = torch.empty(T, D, dtype=torch.int8)
    s8 = torch.empty(D // G, T).transpose(0, 1)
    torch.ops.llmkern.rms_norm_per_block_quant(q8, xt, wt, s8, EPS, torch.tensor([1.0]), None, G, True)
    check(to_np(xt), to_np(wt), None, None, q8.numpy(), s8.numpy(), G, I8, 1.0)
    s = torch.full((D // G, T), SENTINEL)
    q = torch.zeros(T, D, dtype=torch.float8_e4m3fn)
    r = rt.clone()
    for call in (lk.ops.rms_norm_per_block_quant_into, torch.ops.llmkern.rms_norm_per_block_quant):
        with pytest.raises(ValueError, match="is_scale_transposed=True"):
            call(q, xt, wt, s.t(), EPS, None, r, G, False)
    assert torch.all(s == SENTINEL) and not q.view(torch.uint8).any() and torch.equal(r, rt)
    with pytest.raises(lk.LlmkernError) as e:
        torch.ops.llmkern.rms_norm_per_block_quant(q, xt, wt, s.t(), EPS, None, r, 100, True)
    assert e.value.status == "LK_ERR_SHAPE" and "group_size: 100" in str(e.value)


def test_torch_compile_fullgraph(rng):
    torch = torch_or_skip()
    import llmkern.torch  # noqa: F401
    T, D, G = 4, 512, 128

    def f(x, w, res):
        q = torch.empty(T, D, dtype=torch.float8_e4m3fn)
        s = torch.empty(D // G, T).transpose(0, 1)
        torch.ops.llmkern.rms_norm_per_block_quant(q, x, w, s, EPS, None, res, G, True)
        return q.view(torch.uint8).to(torch.int32), s * 2.0, res

    x, w, res = (torch.from_numpy(a) for a in make_case(rng, (T, D), G, np.float32, True, True))
    want = f(x, w, res.clone())
    got = torch.compile(f, fullgraph=True)(x, w, res.clone())
    for g_, w_ in zip(got, want):
        assert torch.equal(g_, w_)


@pytest.mark.parametrize("shape", [(7, 256), (1, 128), (8, 384), (2, 5, 256), (3, 1, 128)])
def test_tma_aligned_scales(rng, shape):
    """vLLM's tma_alignment=4 with is_scale_transposed: scales input.shape[:-2] + (m, D / G),
    column-major per [m, D / G] matrix with its columns m4 = m rounded up to 4 apart (strides
    (1, m4), or (m4 D / G, 1, m4) for 3-D input: vLLM's empty_strided); values bit for bit
    those of the row-major scales, codes the same; NumPy and torch."""
    G = 128
    ng, m = shape[-1] // G, shape[-2]
    m4 = (m + 3) // 4 * 4
    want_st = (1, m4) if len(shape) == 2 else (m4 * ng, 1, m4)
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    w = rng.uniform(0.5, 1.5, shape[-1]).astype(np.float32)
    o, s = lk.rms_norm_per_block_quant(x, w, EPS, E4, [1, G], is_scale_transposed=True, tma_alignment=4)
    o0, s0 = lk.rms_norm_per_block_quant(x, w, EPS, E4, [1, G])
    assert s.shape == shape[:-1] + (ng,) and tuple(e // 4 for e in s.strides) == want_st
    assert np.array_equal(s.reshape(-1, ng), s0) and np.array_equal(o.view(np.uint8), o0.view(np.uint8))
    torch = torch_or_skip()
    xt, wt = torch.from_numpy(x).to(torch.bfloat16), torch.from_numpy(w).to(torch.bfloat16)
    o, s = lk.rms_norm_per_block_quant(xt, wt, EPS, torch.float8_e4m3fn, [1, G], scale_ub=None,
                                       is_scale_transposed=True, tma_alignment=4)
    o0, s0 = lk.rms_norm_per_block_quant(xt, wt, EPS, torch.float8_e4m3fn, [1, G])
    assert tuple(s.shape) == shape[:-1] + (ng,) and s.stride() == want_st
    assert torch.equal(s.reshape(-1, ng), s0) and torch.equal(o.view(torch.uint8), o0.view(torch.uint8))


def test_tma_alignment_values(rng):
    """tma_alignment: 0 or 4 (vLLM asserts it), ignored without is_scale_transposed"""
    x = rng.standard_normal((5, 128)).astype(np.float32)
    w = np.ones(128, np.float32)
    o, s = lk.rms_norm_per_block_quant(x, w, EPS, E4, [1, 128], tma_alignment=4)
    assert s.shape == (5, 1) and s.strides == (4, 4)
    for bad in (1, 2, 8, -4, True):
        with pytest.raises(ValueError, match="tma_alignment"):
            lk.rms_norm_per_block_quant(x, w, EPS, E4, [1, 128], is_scale_transposed=True, tma_alignment=bad)
