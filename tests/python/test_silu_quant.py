"""SiLU-and-mul then quantization (vLLM's silu_and_mul_quant and silu_and_mul_per_block_quant:
the activation in front of an fp8 / int8 GEMM): the raw ops silu_and_mul_quant(out, input,
scale) and silu_and_mul_per_block_quant_into(out, input, scales, group_size, scale_ub,
is_scale_transposed) (torch.ops._C's argument order; torch.ops.llmkern's too) and vLLM's
allocating wrapper silu_and_mul_per_block_quant(input, group_size, quant_dtype, scale_ub,
is_scale_transposed) -> (out, scales), against an independent NumPy float64 reference of
the contract (include/llmkern.h, "SiLU-and-mul then quantization"):
  y = g / (1 + exp(-g)) * u        g = input[..., :d], u = input[..., d:] (values as stored)
  static:    q = fp8(y / scale)
  per block: scales[r, b] = max(min(absmax(y[r, block b]) / qmax, scale_ub), min_scale)
             fp8: qmax = fp8_max, min_scale = 1 / (fp8_max * 512); int8: 127, FLT_EPSILON
             q = fp8(y / scales[r, b]) / i8(y / scales[r, b])
scales within 1e-6 relative of the float64 value (y is f32 within a few ulp), codes within
one fp8 step (int8: 0.5 + 2e-6 |t|) of t = y64 / scale clipped to the output's range, with
the op's own scale; a block whose scale is neither bounded by scale_ub nor held at the
minimum reaches +-qmax exactly. Bit for bit: every usable ISA and thread count, NumPy
against torch, row-major against column-major scales, the raw op against the wrapper, a
strided input against its contiguous copy, a coarser group's scale against the max of the
finer ones. f32 / f16 / bf16 inputs, e4m3 / e5m2 / int8 outputs (uint8 buffers as e4m3),
group sizes 64 and 128 (vLLM's) and any divisor of d; vLLM's transposed scales; the
torch.ops forms positional and by keyword; the error cases, each naming its argument."""
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
SREL = 1e-6  # scales: relative to the float64 value
SENTINEL = -7.0
TORCH_Q = {"float8_e4m3fn": E4, "float8_e5m2": E5, "int8": I8}


# ---------------------------------------------------------------- reference


def blocks(a, G):
    a = np.asarray(a)
    return a.reshape(a.shape[:-1] + (a.shape[-1] // G, G))


def ref_y(x):
    """float64 y = silu(gate) * up of x [..., 2d] (values as stored)"""
    v = np.asarray(x).astype(np.float64)
    d = v.shape[-1] // 2
    g, u = v[..., :d], v[..., d:]
    with np.errstate(over="ignore", invalid="ignore"):
        silu = np.where(np.isneginf(g), -0.0, g / (1.0 + np.exp(-g)))  # silu(-inf) = -0 (the limit)
    return silu * u


def raw_scales(y, G, qdt):
    """absmax / qmax per block, float64 (NaN ignored)"""
    if y.shape[-1] == 0:
        return np.zeros(y.shape[:-1] + (0,))
    a = np.abs(blocks(y, G))
    return np.where(np.isnan(a), 0.0, a).max(-1) / QMAX[qdt]


def ref_scales(y, G, qdt, ub=None):
    s = raw_scales(y, G, qdt)
    if ub is not None:
        s = np.minimum(s, float(np.float32(ub)))
    return np.maximum(s, float(np.float32(MIN_SCALE[qdt])))


def fp8_step(t, dt):
    """the fp8 step at |t| (subnormals: the smallest normal's step)"""
    mb, emin = FMT[dt]
    e = np.floor(np.log2(np.maximum(np.abs(t), 2.0 ** emin)))
    return 2.0 ** (e - mb)


def codes_f64(q, qdt):
    q = np.asarray(q)
    if qdt is I8:
        return q.astype(np.float64)
    return q.view(qdt).astype(np.float64)


def check_codes(y, se, q, qdt):
    """codes q against t = y / se (se: the op's scale per element, float64)"""
    with np.errstate(invalid="ignore", divide="ignore"):
        t = y / se
    got = codes_f64(q, qdt)
    assert got.shape == y.shape
    nan = np.isnan(t)
    if qdt is I8:
        assert np.all(got[nan] == 0)
        tc = np.clip(t[~nan], -128.0, 127.0)
        bound = 0.5 + 2e-6 * np.abs(t[~nan])
    else:
        assert np.all(np.isnan(got[nan]))
        tc = np.clip(t[~nan], -QMAX[qdt], QMAX[qdt])
        bound = fp8_step(tc, qdt)
    err = np.abs(got[~nan] - tc)
    assert np.all(err <= bound), (err - bound).max()
    return got


def check_block(x, q, s, G, qdt, ub=None):
    """the per-block op's q, s (s may be flat [rows, d / G] or a transposed view) against
    the float64 reference of x"""
    y = ref_y(x)
    s64 = ref_scales(y, G, qdt, ub)
    s = np.asarray(s).reshape(s64.shape)
    assert s.dtype == np.float32
    fin = np.isfinite(s64)
    assert np.array_equal(np.isinf(s), ~fin)
    assert np.all(np.abs(s[fin].astype(np.float64) - s64[fin]) <= SREL * s64[fin]), np.abs(s[fin] / s64[fin] - 1).max()
    got = check_codes(y, np.repeat(s.astype(np.float64), G, axis=-1), q, qdt)
    # a block whose scale is absmax / qmax reaches +-qmax; one bounded by scale_ub saturates
    # (int8: -128 too)
    if y.shape[-1]:
        r = raw_scales(y, G, qdt)
        full = (r > MIN_SCALE[qdt] * (1 + 1e-5)) & np.isfinite(r)
        held = np.zeros(r.shape, bool) if ub is None else r > float(np.float32(ub)) * (1 + 1e-5)
        free = full & ~held if ub is None else full & (r < float(np.float32(ub)) * (1 - 1e-5))
        qm = np.abs(blocks(np.where(np.isnan(got), 0, got), G)).max(-1)
        np.testing.assert_array_equal(qm[free], QMAX[qdt])
        assert np.all((qm[held] == QMAX[qdt]) | ((qdt is I8) & (qm[held] == 128)))
    return s64


def check_static(x, q, scale, qdt):
    y = ref_y(x)
    check_codes(y, np.full(y.shape, float(np.float32(scale))), q, qdt)


def make_x(rng, shape, G, xdt, zero_block=True):
    """input [..., 2d]: gate and up Gaussian with per-block magnitudes 1e-2 .. 1e2 (the
    small ones end at the minimum scale), the first block of row 0 all-zero (up = 0)"""
    d = shape[-1] // 2
    ng = d // G
    lead = tuple(shape[:-1])
    halves = []
    for _ in range(2):
        mag = 10.0 ** rng.uniform(-2, 2, lead + (ng, 1))
        halves.append((rng.standard_normal(lead + (ng, G)) * mag).reshape(lead + (d,)))
    x = np.concatenate(halves, -1)
    if zero_block:
        x.reshape(-1, 2 * d)[0, d:d + G] = 0.0
    return x.astype(xdt)


def median_ub(x, G, qdt):
    """a scale_ub that binds about half the blocks"""
    return float(np.float32(np.median(raw_scales(ref_y(x), G, qdt))))


def to_np(t):
    """NumPy values of a torch tensor (bf16 as ml_dtypes' bfloat16, float8 as ml_dtypes')."""
    import torch
    name = str(t.dtype).replace("torch.", "")
    if name == "bfloat16":
        return t.view(torch.int16).numpy().view(BF16)
    if name in ("float8_e4m3fn", "float8_e5m2"):
        return t.view(torch.uint8).numpy().view(TORCH_Q[name])
    return t.numpy()


def u8(q):
    return np.asarray(q).view(np.uint8)


# ---------------------------------------------------------------- NumPy: per block


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("ub", [False, True])
@pytest.mark.parametrize("qdt", [E4, E5, I8])
@pytest.mark.parametrize("xdt", [np.float32, np.float16, BF16])
@pytest.mark.parametrize("G", [64, 128])
@pytest.mark.parametrize("shape", [(5, 2 * 1024), (2, 3, 2 * 512)])
def test_numpy_per_block(rng, shape, G, xdt, qdt, ub, transposed):
    x = make_x(rng, shape, G, xdt)
    ubv = median_ub(x, G, qdt) if ub else None
    scale_ub = None if ubv is None else np.array([ubv], np.float32)
    d = shape[-1] // 2
    rows, ng = int(np.prod(shape[:-1])), d // G
    q, s = lk.silu_and_mul_per_block_quant(x, G, qdt, scale_ub, transposed)
    assert q.dtype == qdt and q.shape == shape[:-1] + (d,)
    assert s.dtype == np.float32 and s.shape == (rows, ng)
    assert tuple(st // 4 for st in s.strides) == ((1, rows) if transposed else (ng, 1))
    check_block(x, q, s, G, qdt, ubv)
    # the raw op into given buffers, [..., d / G] scales, scale_ub a number: the same bits
    q2 = np.full(q.shape, 3, np.uint8).view(qdt)
    s2 = np.full(shape[:-1] + (ng,), SENTINEL, np.float32)
    lk.ops.silu_and_mul_per_block_quant_into(q2, x, s2, G, ubv, False)
    np.testing.assert_array_equal(u8(q2), u8(q))
    np.testing.assert_array_equal(s2.reshape(rows, ng), s)
    # the other scale layout: the same values
    q3, s3 = lk.silu_and_mul_per_block_quant(x, G, qdt, ubv, not transposed)
    np.testing.assert_array_equal(s3, s)
    np.testing.assert_array_equal(u8(q3), u8(q))


@pytest.mark.parametrize("qdt", [E4, E5, I8])
@pytest.mark.parametrize("d,G", [(1, 1), (35, 5), (35, 7), (48, 3), (200, 8), (96, 96), (7168, 128), (7168, 7168)])
def test_any_group_size(rng, d, G, qdt):
    """group sizes other than vLLM's 64 / 128: any divisor of d (SIMD tails, one block per
    row, blocks of one element)"""
    x = make_x(rng, (9, 2 * d), G, np.float32)
    for ub in (None, median_ub(x, G, qdt)):
        q, s = lk.silu_and_mul_per_block_quant(x, G, qdt, ub)
        assert s.shape == (9, d // G)
        check_block(x, q, s, G, qdt, ub)


@pytest.mark.parametrize("qdt", [E4, I8])
@pytest.mark.parametrize("xdt", [np.float32, BF16])
def test_coarser_groups_exact(rng, xdt, qdt):
    """One y for every group size: a coarser block's scale is exactly the max of its finer
    blocks' (max, min and the f32 division are monotone), and the finer block holding that
    max has the same codes."""
    T, d = 7, 1024
    x = make_x(rng, (T, 2 * d), 64, xdt)
    for ub in (None, median_ub(x, 128, qdt)):
        res = {G: lk.silu_and_mul_per_block_quant(x, G, qdt, ub) for G in (64, 128, 256, d)}
        for fine, coarse in ((64, 128), (128, 256), (64, d)):
            qf, sf = res[fine]
            qc, sc = res[coarse]
            k = coarse // fine
            np.testing.assert_array_equal(sc, sf.reshape(T, -1, k).max(-1))
            qfb = blocks(u8(qf), coarse).reshape(T, d // coarse, k, fine)
            qcb = blocks(u8(qc), coarse).reshape(T, d // coarse, k, fine)
            arg = sf.reshape(T, -1, k).argmax(-1)
            for r in range(T):
                for b in range(d // coarse):
                    np.testing.assert_array_equal(qcb[r, b, arg[r, b]], qfb[r, b, arg[r, b]])


def test_transposed_scale_forms(rng):
    """The raw op's scale layouts: vLLM's transposed view of a [d / G, rows] buffer (a
    padded one too: the padding survives), that buffer itself with the flag (taken as its
    transposed view), row-major scales with the flag; a column-major scale without the flag
    raises ValueError before any store (vLLM would write it row-major)."""
    T, d, G = 6, 1024, 128
    ng = d // G
    x = make_x(rng, (T, 2 * d), G, np.float16)
    want_q, want_s = lk.silu_and_mul_per_block_quant(x, G, E4)

    def run(scales, flag):
        q = np.zeros((T, d), E4)
        lk.ops.silu_and_mul_per_block_quant_into(q, x, scales, G, None, flag)
        np.testing.assert_array_equal(u8(q), u8(want_q))

    buf = np.full((ng, T + 2), SENTINEL, np.float32)  # padded rows, as TMA-aligned buffers
    run(buf[:, :T].T, True)
    np.testing.assert_array_equal(buf[:, :T].T, want_s)
    assert np.all(buf[:, T:] == SENTINEL)
    buf = np.full((ng, T), SENTINEL, np.float32)
    run(buf, True)  # [d / G, rows] with the flag: its transposed view
    np.testing.assert_array_equal(buf.T, want_s)
    rm = np.full((T, ng), SENTINEL, np.float32)
    run(rm, True)  # row-major with the flag: the strides decide
    np.testing.assert_array_equal(rm, want_s)
    # rows == d / G: [8, 8] is [rows, d / G] whatever the flag (no transposition)
    x8 = make_x(rng, (8, 2 * 8 * G), G, np.float32)
    wq, ws = lk.silu_and_mul_per_block_quant(x8, G, E4)
    for flag in (False, True):
        sq = np.full((8, 8), SENTINEL, np.float32)
        lk.ops.silu_and_mul_per_block_quant_into(np.zeros((8, 8 * G), E4), x8, sq, G, None, flag)
        np.testing.assert_array_equal(sq, ws)
    # without the flag: refused, nothing written
    q = np.full((T, d), 5, np.uint8)
    buf = np.full((ng, T), SENTINEL, np.float32)
    with pytest.raises(ValueError, match=r"scales: shape \[6, 8\] with strides \[1, 6\].*is_scale_transposed=True"):
        lk.ops.silu_and_mul_per_block_quant_into(q, x, buf.T, G, None, False)
    assert np.all(q == 5) and np.all(buf == SENTINEL)
    with pytest.raises(lk.LlmkernError) as e:  # the [d / G, rows] buffer without the flag: C's shape error
        lk.ops.silu_and_mul_per_block_quant_into(q, x, buf, G, None, False)
    assert e.value.status == "LK_ERR_SHAPE" and "scales: shape [8, 6]" in str(e.value)
    assert np.all(q == 5) and np.all(buf == SENTINEL)
    # one block per row (d / G == 1): any stride of the size-1 dim is fine
    x1 = make_x(rng, (T, 2 * G), G, np.float32)
    s1 = np.full((1, T), SENTINEL, np.float32)
    lk.ops.silu_and_mul_per_block_quant_into(np.zeros((T, G), E4), x1, s1.T, G, None, False)
    np.testing.assert_array_equal(s1.T, lk.silu_and_mul_per_block_quant(x1, G, E4)[1])


def test_3d_input_scale_forms(rng):
    """[B, S, 2d]: out [B, S, d]; scales [B, S, d / G] (input's leading dims), [B * S, d / G]
    (vLLM's flat form) and, with the flag, [d / G, B * S] / its transposed view."""
    B, S, d, G = 2, 3, 512, 64
    x = make_x(rng, (B, S, 2 * d), G, np.float16)
    want_q, want_s = lk.silu_and_mul_per_block_quant(x, G, E5)
    assert want_q.shape == (B, S, d) and want_s.shape == (B * S, d // G)
    check_block(x, want_q, want_s, G, E5)
    for scales, flag, get in ((np.zeros((B, S, d // G), np.float32), False, lambda s: s.reshape(B * S, -1)),
                              (np.zeros((B * S, d // G), np.float32), False, lambda s: s),
                              (np.zeros((d // G, B * S), np.float32), True, lambda s: s.T),
                              (np.zeros((d // G, B * S), np.float32).T, True, lambda s: s)):
        q = np.zeros((B, S, d), E5)
        lk.ops.silu_and_mul_per_block_quant_into(q, x, scales, G, None, flag)
        np.testing.assert_array_equal(u8(q), u8(want_q))
        np.testing.assert_array_equal(get(scales), want_s)


def test_strided_input_and_out(rng):
    """a column slice, a last-dim stride of 2 and a reversed-rows input give the contiguous
    input's bits; a strided out (a column slice of a wider buffer) too, for both ops"""
    base = make_x(rng, (5, 4096), 128, np.float32)
    for x in (base[:, 1024:3072], base[:, ::2], base[::-1, :2048]):
        xc = np.ascontiguousarray(x)
        for qdt in (E4, I8):
            q, s = lk.silu_and_mul_per_block_quant(x, 128, qdt)
            rq, rs = lk.silu_and_mul_per_block_quant(xc, 128, qdt)
            np.testing.assert_array_equal(u8(q), u8(rq))
            np.testing.assert_array_equal(s, rs)
            check_block(x, q, s, 128, qdt)
            wide = np.zeros((5, 3 * 1024), np.uint8).view(qdt) if qdt is not I8 else np.zeros((5, 3 * 1024), I8)
            sw = np.full((5, 16), SENTINEL, np.float32)
            lk.ops.silu_and_mul_per_block_quant_into(wide[:, 1024:2048], x, sw[:, :8], 128)
            np.testing.assert_array_equal(u8(wide[:, 1024:2048]), u8(rq))
            assert not u8(wide[:, :1024]).any() and not u8(wide[:, 2048:]).any()
            np.testing.assert_array_equal(sw[:, :8], rs)
            assert np.all(sw[:, 8:] == SENTINEL)
        sq, rsq = np.zeros((5, 1024), E4), np.zeros((5, 1024), E4)
        lk.silu_and_mul_quant(sq, x, 0.05)
        lk.silu_and_mul_quant(rsq, xc, 0.05)
        np.testing.assert_array_equal(u8(sq), u8(rsq))


# ---------------------------------------------------------------- NumPy: static


@pytest.mark.parametrize("odt", [E4, E5, np.uint8])
@pytest.mark.parametrize("xdt", [np.float32, np.float16, BF16])
@pytest.mark.parametrize("shape", [(7, 2 * 1024), (2, 3, 2 * 200), (4, 2)])
def test_numpy_static(rng, shape, xdt, odt):
    """out = fp8(y / scale) (a uint8 out is e4m3); the scale chosen so that some codes
    saturate; every scale form gives the same bits"""
    x = make_x(rng, shape, 1, xdt)
    qdt = E4 if odt is np.uint8 else odt
    y = ref_y(x)
    scale = float(np.float32(np.abs(y).max() / QMAX[qdt] / 4))  # the largest quarter saturates
    d = shape[-1] // 2
    q = np.full(shape[:-1] + (d,), 3, np.uint8).view(odt)
    lk.silu_and_mul_quant(q, x, scale)
    check_static(x, u8(q).view(qdt), scale, qdt)
    assert np.any(np.abs(codes_f64(u8(q).view(qdt), qdt)) == QMAX[qdt])
    for form in (np.float32(scale), np.array([scale], np.float32), np.array(scale, np.float32),
                 np.array([[scale]], np.float32)):
        q2 = np.zeros(q.shape, odt)
        lk.silu_and_mul_quant(q2, x, form)
        np.testing.assert_array_equal(u8(q2), u8(q))


def test_static_matches_per_block_at_that_scale(rng):
    """the static op with scale s gives the per-block op's codes where its scale is s (one
    block per row, each row's own static call)"""
    x = make_x(rng, (6, 2 * 512), 512, np.float32)
    for qdt in (E4, E5):
        q, s = lk.silu_and_mul_per_block_quant(x, 512, qdt)
        for r in range(6):
            qs = np.zeros((1, 512), qdt)
            lk.silu_and_mul_quant(qs, x[r:r + 1], s[r, 0])
            np.testing.assert_array_equal(u8(qs)[0], u8(q)[r])


def test_special_values():
    """NaN in gate or up: NaN codes (int8: 0), ignored by the absmax; an all-zero row: the
    minimum scale, codes 0; silu(-inf) * u = -0; an inf y: scale inf (finite values -> 0,
    inf -> NaN / int8 0), or with scale_ub its bound (inf saturates)"""
    G, d = 16, 64
    x = np.zeros((4, 2 * d), np.float32)
    x[1, :d] = np.linspace(-4, 4, d)
    x[1, d:] = 1.5
    x[1, 3] = np.nan          # gate NaN, block 0
    x[1, d + 20] = np.nan     # up NaN, block 1
    x[1, 40] = -np.inf        # silu(-inf) = -0, block 2
    x[2, :d] = np.tile([1.0, -2.0], d // 2)
    x[2, d:] = 3.0
    x[2, 50] = np.inf         # y = inf in block 3
    x[3, :d] = 1e-3           # tiny: held at the minimum scale
    x[3, d:] = 1e-3
    for qdt in (E4, E5, I8):
        q, s = lk.silu_and_mul_per_block_quant(x, G, qdt)
        c = codes_f64(q, qdt)
        ms = np.float32(MIN_SCALE[qdt])
        assert np.all(s[0] == ms) and not u8(q)[0].any()
        assert np.all(s[3] == ms)
        if qdt is I8:
            assert c[1, 3] == 0 and c[1, 20] == 0 and c[2, 50] == 0
        else:
            assert np.isnan(c[1, 3]) and np.isnan(c[1, 20]) and np.isnan(c[2, 50])
        assert c[1, 40] == 0
        assert np.isinf(s[2, 3]) and np.all(np.isfinite(s[2, :3]))
        assert np.all(c[2, 48:64][np.arange(16) != 2] == 0)
        check_block(x[:2], q[:2], s[:2], G, qdt)
        ub = 0.05
        qb, sb = lk.silu_and_mul_per_block_quant(x, G, qdt, ub)
        assert sb[2, 3] == np.float32(ub) and codes_f64(qb, qdt)[2, 50] == QMAX[qdt]
        check_block(x[:2], qb[:2], sb[:2], G, qdt, ub)
    # static: NaN stays NaN, inf saturates, silu(-inf) = -0
    q = np.zeros((4, d), E4)
    lk.silu_and_mul_quant(q, x, 0.01)
    c = codes_f64(q, E4)
    assert np.isnan(c[1, 3]) and np.isnan(c[1, 20]) and c[1, 40] == 0 and c[2, 50] == 448.0
    assert u8(q)[1, 40] == 0x80  # -0: silu(-inf) = -0 times up > 0


def test_empty():
    for qdt in (E4, I8):
        for flag in (False, True):
            q, s = lk.silu_and_mul_per_block_quant(np.zeros((0, 256), np.float32), 128, qdt, None, flag)
            assert q.shape == (0, 128) and s.shape == (0, 1)
            q, s = lk.silu_and_mul_per_block_quant(np.zeros((3, 0), np.float32), 128, qdt, None, flag)
            assert q.shape == (3, 0) and s.shape == (3, 0)
    lk.silu_and_mul_quant(np.zeros((0, 8), E4), np.zeros((0, 16), np.float32), 1.0)


def test_every_isa_and_thread_count(rng):
    """every usable ISA and thread count: the same bits (both ops, every output dtype,
    SIMD-width and odd group sizes, a strided input)"""
    base = make_x(rng, (33, 2 * 7168), 128, BF16)
    cases = [(base, 128), (make_x(rng, (7, 2 * 200), 8, np.float32), 8),
             (make_x(rng, (5, 2 * 35), 5, np.float16), 5),
             (make_x(rng, (9, 4 * 96), 96, np.float32)[:, ::2], 96)]
    prev, nthr = lk.isa(), lk.get_num_threads()
    isas = usable_isas(lk)
    got = {}
    try:
        for name in isas:
            lk.set_isa(name)
            for n in (1, 0):
                lk.set_num_threads(n)
                for ci, (x, G) in enumerate(cases):
                    ub = median_ub(x, G, E4)
                    for qdt in (E4, E5, I8):
                        for u in (None, ub):
                            q, s = lk.silu_and_mul_per_block_quant(x, G, qdt, u, True)
                            got.setdefault(("block", ci, qdt, u), []).append((name, n, u8(q).copy(), s.copy()))
                    for qdt in (E4, E5):
                        q = np.zeros(x.shape[:-1] + (x.shape[-1] // 2,), qdt)
                        lk.silu_and_mul_quant(q, x, ub * 3)
                        got.setdefault(("static", ci, qdt, None), []).append((name, n, u8(q).copy(), None))
    finally:
        lk.set_isa(prev)
        lk.set_num_threads(nthr)
    assert len(isas) >= 1
    for key, runs in got.items():
        assert len(runs) == 2 * len(isas)
        first = runs[0]
        for name, n, q, s in runs[1:]:
            assert np.array_equal(q, first[2]), (key, name, n)
            assert s is None or np.array_equal(s, first[3]), (key, name, n)
        kind, ci, qdt, u = key
        x, G = cases[ci]
        if kind == "block":
            check_block(x, first[2].view(qdt), first[3], G, qdt, u)
        else:
            check_static(x, first[2].view(qdt), median_ub(x, G, E4) * 3, qdt)


def test_uint8_out_and_names(rng):
    """a uint8 out buffer is e4m3 (both ops); quant_dtype by name; exported"""
    x = make_x(rng, (3, 512), 64, np.float32)
    want_q, want_s = lk.silu_and_mul_per_block_quant(x, 64, "float8_e4m3fn")
    assert want_q.dtype == E4
    b, s = np.zeros((3, 256), np.uint8), np.zeros((3, 4), np.float32)
    lk.ops.silu_and_mul_per_block_quant_into(b, x, s, 64)
    np.testing.assert_array_equal(b, u8(want_q))
    np.testing.assert_array_equal(s, want_s)
    q8, _ = lk.silu_and_mul_per_block_quant(x, 64, "int8")
    q5, _ = lk.silu_and_mul_per_block_quant(x, 64, "float8_e5m2")
    assert q8.dtype == np.int8 and q5.dtype == E5
    sb, sf = np.zeros((3, 256), np.uint8), np.zeros((3, 256), E4)
    lk.silu_and_mul_quant(sb, x, 0.01)
    lk.silu_and_mul_quant(sf, x, 0.01)
    np.testing.assert_array_equal(sb, u8(sf))
    for name in ("silu_and_mul_quant", "silu_and_mul_per_block_quant"):
        assert name in lk.__all__ and getattr(lk, name) is getattr(lk.ops, name)


# ---------------------------------------------------------------- errors


def expect(status, texts, op, call):
    with pytest.raises(lk.LlmkernError) as e:
        call()
    msg = str(e.value)
    assert e.value.status == status, msg
    for t in ([texts] if isinstance(texts, str) else texts):
        assert t in msg, (t, msg)
    assert op in msg, msg
    return msg


def test_group_size_errors(rng):
    x = make_x(rng, (4, 512), 64, np.float32)
    for G, status, text in ((0, "LK_ERR_VALUE", "group_size: 0, expected >= 1"),
                            (-64, "LK_ERR_VALUE", "group_size: -64, expected >= 1"),
                            (48, "LK_ERR_SHAPE", "group_size: 48 does not divide out's last dim 256"),
                            (512, "LK_ERR_SHAPE", "group_size: 512 does not divide")):
        q = np.full((4, 256), 7, np.uint8)
        sc = np.full((4, 4), SENTINEL, np.float32)
        expect(status, text, "lk_silu_and_mul_per_block_quant",
               lambda: lk.ops.silu_and_mul_per_block_quant_into(q, x, sc, G, None, False))
        assert np.all(q == 7) and np.all(sc == SENTINEL)  # validated before any store
        for flag in (False, True):
            expect(status, text, "lk_silu_and_mul_per_block_quant",
                   lambda: lk.silu_and_mul_per_block_quant(x, G, E4, None, flag))
    for bad in (64.0, True, None, "64", [1, 64]):
        with pytest.raises(TypeError, match="group_size"):
            lk.ops.silu_and_mul_per_block_quant_into(np.zeros((4, 256), E4), x, np.zeros((4, 4), np.float32), bad)
        with pytest.raises(TypeError, match="group_size"):
            lk.silu_and_mul_per_block_quant(x, bad, E4)


def test_per_block_argument_errors(rng):
    x = make_x(rng, (4, 512), 64, np.float32)
    q, sc = np.zeros((4, 256), E4), np.zeros((4, 4), np.float32)
    cases = [
        (dict(scales=np.zeros((4, 3), np.float32)), "LK_ERR_SHAPE", "scales: shape [4, 3], expected [4, 4]"),
        (dict(scales=np.zeros((2, 2, 4), np.float32)), "LK_ERR_SHAPE", "scales: shape [2, 2, 4]"),
        (dict(scales=np.zeros((4, 4), np.float16)), "LK_ERR_DTYPE", "scales: dtype f16"),
        (dict(scales=None), "LK_ERR_NULL", "scales: tensor pointer is NULL"),
        (dict(out=np.zeros((4, 256), np.float32)), "LK_ERR_DTYPE", "out: dtype f32"),
        (dict(out=np.zeros((4, 512), E4)), "LK_ERR_SHAPE", "out: shape [4, 512]"),
        (dict(out=np.zeros((4, 2, 128), E4)), "LK_ERR_RANK", "out"),
        (dict(out=None), "LK_ERR_NULL", "out: tensor pointer is NULL"),
        (dict(input=np.zeros((4, 512), np.int32)), "LK_ERR_DTYPE", "input"),
        (dict(input=np.zeros((4, 511), np.float32)), "LK_ERR_SHAPE", "input: last dim of shape [4, 511] must be even"),
        (dict(input=None), "LK_ERR_NULL", "input: tensor pointer is NULL"),
        (dict(scale_ub=0.0), "LK_ERR_VALUE", "scale_ub"),
        (dict(scale_ub=-1.0), "LK_ERR_VALUE", "scale_ub"),
        (dict(scale_ub=float("inf")), "LK_ERR_VALUE", "scale_ub"),
        (dict(scale_ub=np.array([np.nan], np.float32)), "LK_ERR_VALUE", "scale_ub"),
        (dict(scale_ub=np.array([1.0, 2.0], np.float32)), "LK_ERR_SHAPE", "scale_ub"),
        (dict(scale_ub=np.array([1.0], np.float16)), "LK_ERR_DTYPE", "scale_ub"),
    ]
    for kw, status, text in cases:
        a = dict(out=q, input=x, scales=sc, scale_ub=None)
        a.update(kw)
        expect(status, text, "lk_silu_and_mul_per_block_quant",
               lambda: lk.ops.silu_and_mul_per_block_quant_into(a["out"], a["input"], a["scales"], 64, a["scale_ub"]))
    assert not u8(q).any() and not sc.any()
    # overlaps: out / scales over input, scales over out
    buf = make_x(rng, (4, 512), 64, np.float32)
    expect("LK_ERR_ALIAS", ["scales", "input"], "lk_silu_and_mul_per_block_quant",
           lambda: lk.ops.silu_and_mul_per_block_quant_into(q, buf, buf[:, :4], 64))
    raw = np.zeros(4 * 256 + 64, np.uint8)
    expect("LK_ERR_ALIAS", ["scales", "out"], "lk_silu_and_mul_per_block_quant",
           lambda: lk.ops.silu_and_mul_per_block_quant_into(raw[:1024].reshape(4, 256), x,
                                                             raw[:64].view(np.float32).reshape(4, 4), 64))
    ro = np.zeros((4, 256), E4)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="out: the array is read-only"):
        lk.ops.silu_and_mul_per_block_quant_into(ro, x, sc, 64)
    ros = np.zeros((4, 4), np.float32)
    ros.flags.writeable = False
    with pytest.raises(ValueError, match="scales: the array is read-only"):
        lk.ops.silu_and_mul_per_block_quant_into(q, x, ros, 64)
    for bad in (np.int16, "float16", "float8_e4m3fnuz"):
        with pytest.raises(NotImplementedError, match="quant_dtype"):
            lk.silu_and_mul_per_block_quant(x, 64, bad)
    expect("LK_ERR_SHAPE", "input: last dim of shape [4, 511] must be even", "lk_silu_and_mul_per_block_quant",
           lambda: lk.silu_and_mul_per_block_quant(np.zeros((4, 511), np.float32), 64, E4))
    expect("LK_ERR_VALUE", "scale_ub", "lk_silu_and_mul_per_block_quant",
           lambda: lk.silu_and_mul_per_block_quant(x, 64, I8, 0.0))


def test_static_argument_errors(rng):
    x = make_x(rng, (4, 512), 64, np.float32)
    q = np.zeros((4, 256), E4)
    cases = [
        (dict(scale=0.0), "LK_ERR_VALUE", "scale[0]: value 0 must be finite and > 0"),
        (dict(scale=-0.5), "LK_ERR_VALUE", "scale"),
        (dict(scale=float("nan")), "LK_ERR_VALUE", "scale"),
        (dict(scale=float("inf")), "LK_ERR_VALUE", "scale"),
        (dict(scale=np.array([1.0, 2.0], np.float32)), "LK_ERR_SHAPE", "scale"),
        (dict(scale=np.array([1.0], np.float16)), "LK_ERR_DTYPE", "scale"),
        (dict(scale=None), "LK_ERR_NULL", "scale: tensor pointer is NULL"),
        (dict(out=np.zeros((4, 256), np.int8)), "LK_ERR_DTYPE", "out: dtype i8"),
        (dict(out=np.zeros((4, 256), np.float16)), "LK_ERR_DTYPE", "out: dtype f16"),
        (dict(out=np.zeros((4, 512), E4)), "LK_ERR_SHAPE", "out: shape [4, 512]"),
        (dict(out=np.zeros((5, 256), E4)), "LK_ERR_SHAPE", "out: shape [5, 256]"),
        (dict(input=np.zeros((4, 511), np.float32)), "LK_ERR_SHAPE", "input: last dim of shape [4, 511] must be even"),
        (dict(input=np.zeros((4, 512), np.int32)), "LK_ERR_DTYPE", "input"),
        (dict(input=np.zeros((), np.float32)), "LK_ERR_RANK", "input"),
    ]
    for kw, status, text in cases:
        a = dict(out=q, input=x, scale=0.05)
        a.update(kw)
        expect(status, text, "lk_silu_and_mul_quant", lambda: lk.silu_and_mul_quant(a["out"], a["input"], a["scale"]))
    assert not u8(q).any()
    buf = make_x(rng, (4, 512), 64, np.float32)
    expect("LK_ERR_ALIAS", ["out", "input"], "lk_silu_and_mul_quant",
           lambda: lk.silu_and_mul_quant(buf.view(np.uint8)[:, :256], buf, 0.05))
    ro = np.zeros((4, 256), E4)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="out: the array is read-only"):
        lk.silu_and_mul_quant(ro, x, 0.05)


# ---------------------------------------------------------------- torch


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("ub", [False, True])
@pytest.mark.parametrize("qdt", ["float8_e4m3fn", "float8_e5m2", "int8"])
@pytest.mark.parametrize("xdt", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape,G", [((5, 2 * 7168), 128), ((2, 3, 2 * 512), 64)])
def test_torch_per_block(rng, shape, G, xdt, qdt, ub, transposed):
    torch = torch_or_skip()
    tdt = getattr(torch, xdt)
    xt = torch.from_numpy(make_x(rng, shape, G, np.float32)).to(tdt)
    xn = to_np(xt)
    ubv = median_ub(xn, G, TORCH_Q[qdt]) if ub else None
    fq = getattr(torch, qdt)
    q, s = lk.silu_and_mul_per_block_quant(xt, G, fq, None if ubv is None else torch.tensor([ubv]), transposed)
    d = shape[-1] // 2
    rows, ng = int(np.prod(shape[:-1])), d // G
    assert isinstance(q, torch.Tensor) and q.dtype == fq and tuple(q.shape) == shape[:-1] + (d,)
    assert isinstance(s, torch.Tensor) and s.dtype == torch.float32 and tuple(s.shape) == (rows, ng)
    assert s.stride() == ((1, rows) if transposed else (ng, 1))
    check_block(xn, to_np(q), s.numpy(), G, TORCH_Q[qdt], ubv)
    # the NumPy path on the same values: the same bits
    nq, ns = lk.silu_and_mul_per_block_quant(xn, G, TORCH_Q[qdt], ubv, transposed)
    np.testing.assert_array_equal(u8(to_np(q)), u8(nq))
    np.testing.assert_array_equal(s.numpy(), ns)


@pytest.mark.parametrize("odt", ["float8_e4m3fn", "float8_e5m2", "uint8"])
@pytest.mark.parametrize("xdt", ["float32", "float16", "bfloat16"])
def test_torch_static(rng, xdt, odt):
    torch = torch_or_skip()
    import llmkern.torch  # noqa: F401
    T, d = 6, 1024
    xt = torch.from_numpy(make_x(rng, (T, 2 * d), 1, np.float32)).to(getattr(torch, xdt))
    xn = to_np(xt)
    qdt = E4 if odt == "uint8" else TORCH_Q[odt]
    scale = float(np.float32(np.abs(ref_y(xn)).max() / QMAX[qdt] / 4))
    want = np.zeros((T, d), qdt)
    lk.silu_and_mul_quant(want, xn, scale)
    check_static(xn, want, scale, qdt)
    for form in (torch.tensor([scale]), torch.tensor(scale), torch.tensor([[scale]]), scale):
        q = torch.zeros(T, d, dtype=getattr(torch, odt))
        lk.silu_and_mul_quant(q, xt, form)
        assert np.array_equal(q.view(torch.uint8).numpy(), u8(want))
    for call in (lambda q: torch.ops.llmkern.silu_and_mul_quant(q, xt, torch.tensor([scale])),
                 lambda q: torch.ops.llmkern.silu_and_mul_quant(result=q, input=xt, scale=torch.tensor([scale])),
                 lambda q: lk.silu_and_mul_quant(out=q, input=xt, scale=torch.tensor([scale]))):
        q = torch.zeros(T, d, dtype=getattr(torch, odt))
        call(q)
        assert np.array_equal(q.view(torch.uint8).numpy(), u8(want))


def test_torch_raw_op_as_vllm_calls_it(rng):
    """vLLM's call forms through the binding and torch.ops.llmkern, positional and by
    keyword, with the schema's defaults: column-major scales (torch.empty(d / G, T).t(), as
    vLLM's wrapper allocates them with is_scale_transposed), row-major ones, the [d / G, T]
    buffer with the flag; a uint8 out as e4m3; the ValueError without the flag."""
    torch = torch_or_skip()
    import llmkern.torch  # noqa: F401
    T, d, G = 9, 7168, 128
    xt = torch.from_numpy(make_x(rng, (T, 2 * d), G, np.float32)).to(torch.bfloat16)
    ub = torch.tensor([median_ub(to_np(xt), G, E4)])
    for scale_ub in (None, ub):
        want_q, want_s = lk.silu_and_mul_per_block_quant(xt, G, torch.float8_e4m3fn, scale_ub)
        ops = torch.ops.llmkern.silu_and_mul_per_block_quant
        forms = [
            lambda q, s, f: lk.ops.silu_and_mul_per_block_quant_into(q, xt, s, G, scale_ub, f),
            lambda q, s, f: ops(q, xt, s, G, scale_ub, f),
            lambda q, s, f: ops(out=q, input=xt, scales=s, group_size=G, scale_ub=scale_ub, is_scale_transposed=f),
            lambda q, s, f: lk.ops.silu_and_mul_per_block_quant_into(out=q, input=xt, scales=s, group_size=G,
                                                                     scale_ub=scale_ub, is_scale_transposed=f),
            lambda q, s, f: torch.ops.llmkern.silu_and_mul_per_block_quant.default(q, xt, s, G, scale_ub, f),
        ]
        if scale_ub is None:  # the schema's defaults: scale_ub=None, is_scale_transposed=False
            forms.append(lambda q, s, f: ops(q, xt, s, G) if not f else ops(q, xt, s, G, is_scale_transposed=True))
        for call in forms:
            for make_s, flag, get in ((lambda: torch.empty(d // G, T).t(), True, lambda s: s),
                                      (lambda: torch.empty(T, d // G), False, lambda s: s),
                                      (lambda: torch.empty(d // G, T), True, lambda s: s.t())):
                for odt in (torch.float8_e4m3fn, torch.uint8):
                    q, s = torch.empty(T, d, dtype=odt), make_s()
                    call(q, s, flag)
                    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
                    assert torch.equal(get(s), want_s)
    q8 = torch.empty(T, d, dtype=torch.int8)
    s8 = torch.empty(d // G, T).t()
    torch.ops.llmkern.silu_and_mul_per_block_quant(q8, xt, s8, G, torch.tensor([1.0]), True)
    check_block(to_np(xt), q8.numpy(), s8.numpy(), G, I8, 1.0)
    s = torch.full((d // G, T), SENTINEL)
    q = torch.zeros(T, d, dtype=torch.float8_e4m3fn)
    for call in (lk.ops.silu_and_mul_per_block_quant_into, torch.ops.llmkern.silu_and_mul_per_block_quant):
        with pytest.raises(ValueError, match="scales: .*is_scale_transposed=True"):
            call(q, xt, s.t(), G, None, False)
    assert torch.all(s == SENTINEL) and not q.view(torch.uint8).any()
    with pytest.raises(lk.LlmkernError) as e:
        torch.ops.llmkern.silu_and_mul_per_block_quant(q, xt, s.t(), 100, None, True)
    assert e.value.status == "LK_ERR_SHAPE" and "group_size: 100" in str(e.value)
    with pytest.raises(lk.LlmkernError) as e:
        torch.ops.llmkern.silu_and_mul_quant(q, xt, torch.tensor([0.0]))
    assert e.value.status == "LK_ERR_VALUE" and "scale" in str(e.value)
    with pytest.raises(lk.LlmkernError) as e:
        torch.ops.llmkern.silu_and_mul_quant(torch.empty(T, d, dtype=torch.int8), xt, torch.tensor([1.0]))
    assert e.value.status == "LK_ERR_DTYPE" and "out: dtype i8" in str(e.value)


def test_torch_wrapper_as_vllm(rng):
    """vLLM's wrapper call: silu_and_mul_per_block_quant(input, group_size, quant_dtype,
    scale_ub=None, is_scale_transposed=False), positional and by keyword"""
    torch = torch_or_skip()
    T, d, G = 4, 256, 64
    xt = torch.from_numpy(make_x(rng, (T, 2 * d), G, np.float32)).to(torch.float16)
    ub = torch.tensor([0.01])
    a = lk.silu_and_mul_per_block_quant(xt, G, torch.float8_e4m3fn, ub, True)
    b = lk.silu_and_mul_per_block_quant(input=xt, group_size=G, quant_dtype=torch.float8_e4m3fn, scale_ub=ub,
                                        is_scale_transposed=True)
    assert torch.equal(a[0].view(torch.uint8), b[0].view(torch.uint8)) and torch.equal(a[1], b[1])
    assert a[1].stride() == b[1].stride() == (1, T)
    c = lk.silu_and_mul_per_block_quant(xt, G, torch.int8)
    assert c[0].dtype == torch.int8 and c[1].stride() == (d // G, 1)
    check_block(to_np(xt), c[0].numpy(), c[1].numpy(), G, I8)


def test_torch_compile_fullgraph(rng):
    torch = torch_or_skip()
    import llmkern.torch  # noqa: F401
    T, d, G = 4, 512, 128

    def f(x, scale):
        q = torch.empty(T, d, dtype=torch.float8_e4m3fn)
        s = torch.empty(d // G, T).transpose(0, 1)
        torch.ops.llmkern.silu_and_mul_per_block_quant(q, x, s, G, None, True)
        q2 = torch.empty(T, d, dtype=torch.float8_e4m3fn)
        torch.ops.llmkern.silu_and_mul_quant(q2, x, scale)
        return q.view(torch.uint8).to(torch.int32), s * 2.0, q2.view(torch.uint8).to(torch.int32)

    x = torch.from_numpy(make_x(rng, (T, 2 * d), G, np.float32))
    scale = torch.tensor([0.05])
    want = f(x, scale)
    got = torch.compile(f, fullgraph=True)(x, scale)
    for g_, w_ in zip(got, want):
        assert torch.equal(g_, w_)
