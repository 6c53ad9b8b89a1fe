"""Per-token-group fp8 quantization (block-fp8 activations, DeepSeek-V3's groups of 128):
vLLM's raw op per_token_group_fp8_quant(input, output_q, output_s, group_size, eps,
fp8_min, fp8_max, scale_ue8m0) and its Python per_token_group_quant_fp8(x, group_size, ...)
-> (x_q, x_s), against a NumPy reference of the contract (include/llmkern.h):
  s = max(absmax(group), eps) / fp8_max        f32 division (absmax ignoring NaN)
  ue8m0: s = the smallest power of two >= max(s, 1e-10)
  x_q = fp8(x / s)                             one f32 division, round to nearest even
scales exactly, codes bit for bit (ml_dtypes' / torch's own conversion) and, in float64,
dequantized within half an fp8 step. 2-D and 3-D inputs, group sizes 1 / 16 / 128, D = 7168,
f32 / f16 / bf16 inputs, e4m3 / e5m2 outputs, vLLM's row-major, column-major and
TMA-aligned scale layouts (the padding of the scale buffer untouched), NumPy arrays and
torch tensors, strided inputs, every ISA, special values and the error cases."""
import numpy as np
import pytest

import llmkern as lk
from helpers import torch_or_skip, usable_isas

ml = pytest.importorskip("ml_dtypes")
E4, E5, BF16 = ml.float8_e4m3fn, ml.float8_e5m2, ml.bfloat16
FMAX = {E4: 448.0, E5: 57344.0}
FMT = {E4: (3, -6), E5: (2, -14)}  # mantissa bits, exponent of the smallest normal
SENTINEL = -7.0


# ---------------------------------------------------------------- reference


def groups(a, G):
    a = np.asarray(a)
    return a.reshape(a.shape[:-1] + (a.shape[-1] // G, G))


def ref_scales(x, G, eps, dt, ue8m0):
    """f32 scales x.shape[:-1] + (D // G,) of the contract."""
    a = np.abs(groups(np.asarray(x, np.float64), G))
    am = np.fmax.reduce(a, axis=-1, initial=0.0).astype(np.float32)  # NaN ignored; exact (f32/f16/bf16 values)
    s = np.maximum(am, np.float32(eps)) / np.float32(FMAX[dt])  # one f32 division
    assert s.dtype == np.float32
    if ue8m0:
        s = np.maximum(s, np.float32(1e-10))
        m, e = np.frexp(s.astype(np.float64))
        p2 = np.where(m == 0.5, s.astype(np.float64), np.ldexp(1.0, e))
        s = np.where(np.isfinite(s), p2, s).astype(np.float32)
    return s


def expand(s, G):
    return np.repeat(np.asarray(s), G, axis=-1)


def ref_codes(x, s, G, dt):
    """uint8 codes of fp8(f32(x) / s) (ml_dtypes' round to nearest even; |y| <= fp8_max up
    to f32 rounding, clipped)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        y = np.asarray(x, np.float32) / expand(s, G)
    m = np.float32(FMAX[dt])
    return np.clip(y, -m, m).astype(dt).view(np.uint8)


def assert_codes(got, want, dt):
    """Equal codes; NaN where the reference is NaN (its sign / payload code not compared)."""
    got = np.asarray(got).view(np.uint8)
    gnan, wnan = np.isnan(got.view(dt).astype(np.float32)), np.isnan(want.view(dt).astype(np.float32))
    np.testing.assert_array_equal(gnan, wnan)
    np.testing.assert_array_equal(got[~gnan], want[~wnan])


def assert_half_step(q, x, s, G, dt):
    """float64: |q * s - x| <= half an fp8 step (at x / s) * s, plus the f32 quotient's
    rounding; finite values only."""
    x = np.asarray(x, np.float64)
    se = expand(s, G).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        y = x / se
    ok = np.isfinite(y) & np.isfinite(se)
    mb, emin = FMT[dt]
    e = np.floor(np.log2(np.maximum(np.abs(y[ok]), 2.0 ** emin)))
    half = 2.0 ** (e - mb - 1)
    deq = np.asarray(q).astype(np.float64)[ok] * se[ok]
    err = np.abs(deq - x[ok])
    assert np.all(err <= (half * (1 + 2.0 ** -20) + np.abs(y[ok]) * 2.0 ** -22) * se[ok])


def check(x, q, s, G, eps, dt, ue8m0):
    """q, s (NumPy or torch) against the reference of x."""
    x, q, s = (t.float().numpy() if hasattr(t, "detach") and "float8" not in str(t.dtype) else t for t in (x, q, s))
    if hasattr(q, "detach"):  # torch float8 -> codes
        import torch
        q = q.view(torch.uint8).numpy().view(dt)
    xs = np.asarray(x).astype(np.float32)
    want_s = ref_scales(xs, G, eps, dt, ue8m0)
    np.testing.assert_array_equal(np.asarray(s), want_s)
    assert_codes(q, ref_codes(xs, want_s, G, dt), dt)
    assert_half_step(np.asarray(q).view(dt).astype(np.float32), xs, want_s, G, dt)
    if not ue8m0:  # each group's absmax (when >= eps, finite) lands on +-fp8_max
        am = np.fmax.reduce(np.abs(groups(xs, G)), axis=-1, initial=0.0)
        full = np.isfinite(am) & (am >= eps)
        qm = np.fmax.reduce(np.abs(groups(np.asarray(q).view(dt).astype(np.float32), G)), axis=-1, initial=0.0)
        np.testing.assert_array_equal(qm[full], FMAX[dt])


def make_x(rng, shape, G, xdt):
    """Gaussian groups of magnitudes 1e-3 .. 1e3 (one scale each), one all-zero group."""
    ng = shape[-1] // G
    mag = 10.0 ** rng.uniform(-3, 3, shape[:-1] + (ng, 1))
    x = (rng.standard_normal(shape[:-1] + (ng, G)) * mag).reshape(shape)
    x.reshape(-1)[:G] = 0.0
    return x.astype(xdt)


def root(a):
    """The NumPy array owning a view's memory."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def tma_rows(m):
    return (m + 3) // 4 * 4


# ---------------------------------------------------------------- NumPy


@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize("xdt", [np.float32, np.float16, BF16])
@pytest.mark.parametrize("dt", [E4, E5])
@pytest.mark.parametrize("G", [1, 16, 128])
@pytest.mark.parametrize("shape", [(5, 7168), (2, 3, 256)])
def test_numpy(rng, shape, G, dt, xdt, ue8m0):
    x = make_x(rng, shape, G, xdt)
    q, s = lk.per_token_group_quant_fp8(x, G, dtype=dt, use_ue8m0=ue8m0)
    assert q.dtype == dt and q.shape == x.shape
    assert s.dtype == np.float32 and s.shape == shape[:-1] + (shape[-1] // G,) and s.flags.c_contiguous
    check(x, q, s, G, 1e-10, dt, ue8m0)
    # the raw op, vLLM's argument order, into given buffers: the same bits
    q2, s2 = np.zeros(shape, dt), np.full(s.shape, SENTINEL, np.float32)
    lk.per_token_group_fp8_quant(x, q2, s2, G, 1e-10, -FMAX[dt], FMAX[dt], ue8m0)
    np.testing.assert_array_equal(q2.view(np.uint8), q.view(np.uint8))
    np.testing.assert_array_equal(s2, s)


def test_defaults(rng):
    x = make_x(rng, (4, 512), 128, np.float32)
    q, s = lk.per_token_group_quant_fp8(x, 128)  # e4m3, eps 1e-10, no ue8m0, row-major
    assert q.dtype == E4 and s.shape == (4, 4)
    check(x, q, s, 128, 1e-10, E4, False)
    assert "per_token_group_fp8_quant" in lk.__all__ and "per_token_group_quant_fp8" in lk.__all__


@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.parametrize("shape,G", [((5, 7168), 128), ((7, 64), 16), ((2, 3, 256), 16), ((1, 32), 1)])
def test_column_major_numpy(rng, shape, G, tma):
    x = make_x(rng, shape, G, np.float32)
    ref_q, ref_s = lk.per_token_group_quant_fp8(x, G)
    q, s = lk.per_token_group_quant_fp8(x, G, column_major_scales=True, tma_aligned_scales=tma)
    m, ng = shape[-2], shape[-1] // G
    mp = tma_rows(m) if tma else m
    assert s.shape == ref_s.shape
    # vLLM's layout: stride 1 along the rows, a padded row count between groups
    want = (1, mp) if len(shape) == 2 else (ng * mp, 1, mp)
    assert tuple(st // 4 for st in s.strides) == want
    np.testing.assert_array_equal(s, ref_s)
    np.testing.assert_array_equal(q.view(np.uint8), ref_q.view(np.uint8))
    buf = root(s).reshape(shape[:-2] + (ng, mp))
    assert buf.size == int(np.prod(shape[:-2], dtype=np.int64)) * ng * mp
    assert np.all(buf[..., m:] == 0)  # padding rows: never written


@pytest.mark.parametrize("tma", [False, True])
def test_column_major_raw_op(rng, tma):
    """output_s built as vLLM does (a [D / G, rows (padded)] buffer, transposed), padding
    filled with a sentinel that must survive."""
    T, D, G = 6, 7168, 128
    x = make_x(rng, (T, D), G, np.float32)
    mp = tma_rows(T) if tma else T
    buf = np.full((D // G, mp), SENTINEL, np.float32)
    out_s = buf[:, :T].T
    q = np.zeros((T, D), E4)
    lk.per_token_group_fp8_quant(x, q, out_s, G, 1e-10, -448.0, 448.0, True)
    check(x, q, out_s, G, 1e-10, E4, True)
    assert np.all(buf[:, T:] == SENTINEL)
    # [rows, D / G] scales for a 3-D input (vLLM's flat form)
    x3 = make_x(rng, (2, 3, 256), 16, np.float16)
    q3, s3 = np.zeros(x3.shape, E5), np.zeros((6, 16), np.float32)
    lk.per_token_group_fp8_quant(x3, q3, s3, 16, 1e-10, -57344.0, 57344.0)
    check(x3, q3, s3.reshape(2, 3, 16), 16, 1e-10, E5, False)


def test_out_q_and_uint8(rng):
    x = make_x(rng, (3, 256), 16, np.float32)
    ref_q, ref_s = lk.per_token_group_quant_fp8(x, 16, dtype=E5)
    out = np.zeros((3, 256), E5)  # its own dtype when dtype is None
    q, s = lk.per_token_group_quant_fp8(x, 16, out_q=out)
    assert q is out and np.array_equal(out.view(np.uint8), ref_q.view(np.uint8)) and np.array_equal(s, ref_s)
    u8 = np.zeros((3, 256), np.uint8)  # a uint8 buffer: the dtype asked for (None: e4m3)
    q, s = lk.per_token_group_quant_fp8(x, 16, dtype="float8_e5m2", out_q=u8)
    assert q is u8 and np.array_equal(u8, ref_q.view(np.uint8)) and np.array_equal(s, ref_s)
    q, s = lk.per_token_group_quant_fp8(x, 16, out_q=u8)
    check(x, u8.view(E4), s, 16, 1e-10, E4, False)
    u8[...] = 0  # the raw op: uint8 output_q is e4m3, fp8_min / fp8_max must be its range
    lk.per_token_group_fp8_quant(x, u8, np.zeros((3, 16), np.float32), 16, 1e-10, -448.0, 448.0)
    check(x, u8.view(E4), s, 16, 1e-10, E4, False)
    with pytest.raises(TypeError, match="out_q"):
        lk.per_token_group_quant_fp8(x, 16, dtype=E5, out_q=np.zeros((3, 256), E4))
    with pytest.raises(NotImplementedError, match="dtype"):
        lk.per_token_group_quant_fp8(x, 16, dtype=np.int8)


def test_strided_input(rng):
    """Any strides: a column slice (row stride > D) and a last-dim stride of 2 (the
    reference kernel) give the contiguous input's bits."""
    base = make_x(rng, (5, 1024), 128, np.float32)
    for x in (base[:, 256:768], base[:, ::2]):
        q, s = lk.per_token_group_quant_fp8(x, 128, use_ue8m0=True)
        rq, rs = lk.per_token_group_quant_fp8(np.ascontiguousarray(x), 128, use_ue8m0=True)
        np.testing.assert_array_equal(q.view(np.uint8), rq.view(np.uint8))
        np.testing.assert_array_equal(s, rs)
        check(x, q, s, 128, 1e-10, E4, True)


def test_every_isa_and_thread_count(rng):
    x = make_x(rng, (33, 7168), 128, BF16)
    prev, nthr = lk.isa(), lk.get_num_threads()
    isas = usable_isas(lk)
    got = []
    try:
        for name in isas:
            lk.set_isa(name)
            for n in (1, 0):
                lk.set_num_threads(n)
                for ue8m0 in (False, True):
                    q, s = lk.per_token_group_quant_fp8(x, 128, use_ue8m0=ue8m0, column_major_scales=True)
                    got.append((name, n, ue8m0, q.view(np.uint8).copy(), s.copy()))
    finally:
        lk.set_isa(prev)
        lk.set_num_threads(nthr)
    for name, n, ue8m0, q, s in got:
        check(x, q.view(E4), s, 128, 1e-10, E4, ue8m0)
        r = [g for g in got if g[2] == ue8m0][0]
        assert np.array_equal(q, r[3]) and np.array_equal(s, r[4]), (name, n, ue8m0)


@pytest.mark.parametrize("dt", [E4, E5])
@pytest.mark.parametrize("ue8m0", [False, True])
def test_special_values(dt, ue8m0):
    G = 8
    x = np.array([
        [0, 0, 0, 0, 0, 0, 0, 0],                      # absmax 0: s = eps / fp8_max
        [1, np.nan, -2, 0.5, 0, -0.0, 3, -4],            # NaN ignored by the absmax, kept
        [1, np.inf, -2, 0.5, 0, -0.0, 3, -4],            # inf: s inf, finite -> 0, inf -> NaN
        [np.nan] * 8,                                   # all NaN: absmax 0
        [1e-30, -1e-30, 0, 0, 0, 0, 0, 0],              # absmax < eps
        [2 ** -8, 0, 0, 0, 0, 0, 0, 1.0],               # UE8M0: 1 / 448 -> 2^-8
    ], np.float32)
    eps = 1e-10
    q, s = lk.per_token_group_quant_fp8(x, G, eps=eps, dtype=dt, use_ue8m0=ue8m0)
    check(x, q, s, G, eps, dt, ue8m0)
    s = s[:, 0]
    if ue8m0:
        assert s[0] == s[4] == np.float32(2.0 ** -33)  # max(eps / fp8_max, 1e-10) rounded up
    else:
        assert s[0] == s[3] == s[4] == np.float32(eps) / np.float32(FMAX[dt])
    assert np.isinf(s[2])
    qf = q.astype(np.float32)
    assert np.isnan(qf[1, 1]) and np.all(~np.isnan(np.delete(qf[1], 1)))
    assert np.all(qf[2, [0, 2, 3, 4, 5, 6, 7]] == 0) and np.isnan(qf[2, 1])
    assert q.view(np.uint8)[1, 5] == 0x80 and q.view(np.uint8)[1, 4] == 0  # -0 keeps its sign
    assert np.all(np.isnan(qf[3]))


def test_eps(rng):
    x = make_x(rng, (3, 64), 16, np.float32)
    x[1, :16] = 1e-6  # below eps: the group's scale is eps / fp8_max
    q, s = lk.per_token_group_quant_fp8(x, 16, eps=1e-4)
    check(x, q, s, 16, 1e-4, E4, False)
    assert s[1, 0] == np.float32(1e-4) / np.float32(448)
    lo = float(np.float32(448.0) * np.finfo(np.float32).tiny)  # the smallest eps accepted
    q, s = lk.per_token_group_quant_fp8(x, 16, eps=lo)
    check(x, q, s, 16, lo, E4, False)
    for bad in (0.0, -1.0, lo / 2, float("nan"), float("inf")):
        out = np.full(x.shape, 7, np.uint8)
        sc = np.full((3, 4), SENTINEL, np.float32)
        with pytest.raises(lk.LlmkernError) as e:
            lk.per_token_group_fp8_quant(x, out, sc, 16, bad, -448.0, 448.0)
        assert e.value.status == "LK_ERR_VALUE" and "eps:" in str(e.value)
        assert np.all(out == 7) and np.all(sc == SENTINEL)  # validated before any store
        with pytest.raises(lk.LlmkernError, match="eps: .*expected finite"):
            lk.per_token_group_quant_fp8(x, 16, eps=bad)


def test_empty():
    q, s = lk.per_token_group_quant_fp8(np.zeros((0, 256), np.float32), 128, column_major_scales=True,
                                        tma_aligned_scales=True)
    assert q.shape == (0, 256) and s.shape == (0, 2)
    q, s = lk.per_token_group_quant_fp8(np.zeros((3, 0), np.float32), 128)
    assert q.shape == (3, 0) and s.shape == (3, 0)


# ---------------------------------------------------------------- errors


def test_group_size_errors(rng):
    x = make_x(rng, (4, 256), 16, np.float32)
    for G, status in ((0, "LK_ERR_VALUE"), (-16, "LK_ERR_VALUE"), (5, "LK_ERR_SHAPE"), (512, "LK_ERR_SHAPE")):
        out = np.full(x.shape, 7, np.uint8)
        sc = np.full((4, 16), SENTINEL, np.float32)
        with pytest.raises(lk.LlmkernError) as e:
            lk.per_token_group_fp8_quant(x, out, sc, G, 1e-10, -448.0, 448.0)
        assert e.value.status == status and "group_size: %d" % G in str(e.value)
        assert "lk_per_token_group_fp8_quant" in str(e.value)
        assert np.all(out == 7) and np.all(sc == SENTINEL)
        with pytest.raises(lk.LlmkernError) as e:
            lk.per_token_group_quant_fp8(x, G, column_major_scales=True, tma_aligned_scales=True)
        assert e.value.status == status and "group_size: %d" % G in str(e.value)
    with pytest.raises(lk.LlmkernError, match=r"does not divide x's last dim 256 \(x \[4, 256\]\)"):
        lk.per_token_group_quant_fp8(x, 5)  # the Python function's names
    for bad in (16.0, True, None):
        with pytest.raises(TypeError, match="group_size"):
            lk.per_token_group_quant_fp8(x, bad)


def test_fp8_range_errors(rng):
    x = make_x(rng, (2, 64), 16, np.float32)
    sc = np.full((2, 4), SENTINEL, np.float32)
    for out, lo, hi in ((np.zeros((2, 64), E4), -57344.0, 57344.0), (np.zeros((2, 64), E5), -448.0, 448.0),
                        (np.zeros((2, 64), E4), -240.0, 240.0), (np.zeros((2, 64), E4), 0.0, 448.0),
                        (np.zeros((2, 64), E4), -448.0, 447.0), (np.zeros((2, 64), np.uint8), -57344.0, 57344.0)):
        with pytest.raises(ValueError, match="fp8_min, fp8_max: .*only the range of output_q's dtype"):
            lk.per_token_group_fp8_quant(x, out, sc, 16, 1e-10, lo, hi)
        assert not out.view(np.uint8).any() and np.all(sc == SENTINEL)
    lk.per_token_group_fp8_quant(x, np.zeros((2, 64), E5), sc, 16, 1e-10, -57344.0, 57344.0)
    lk.per_token_group_fp8_quant(x, np.zeros((2, 64), E4), sc, 16, 1e-10, np.float32(-448), np.float64(448))


def test_argument_errors(rng):
    x = make_x(rng, (4, 256), 16, np.float32)
    q = np.zeros(x.shape, E4)
    cases = [
        (dict(output_s=np.zeros((4, 15), np.float32)), "LK_ERR_SHAPE", "output_s: shape [4, 15]"),
        (dict(output_s=np.zeros((4, 16), np.float16)), "LK_ERR_DTYPE", "output_s: dtype f16"),
        (dict(output_q=np.zeros(x.shape, np.float32)), "LK_ERR_DTYPE", "output_q: dtype f32"),
        (dict(output_q=np.zeros((4, 128), E4)), "LK_ERR_SHAPE", "output_q"),
        (dict(input=np.zeros((4, 256), np.int32)), "LK_ERR_DTYPE", "input"),
    ]
    for kw, status, text in cases:
        a = dict(input=x, output_q=q, output_s=np.zeros((4, 16), np.float32))
        a.update(kw)
        with pytest.raises(lk.LlmkernError) as e:
            lk.per_token_group_fp8_quant(a["input"], a["output_q"], a["output_s"], 16, 1e-10, -448.0, 448.0)
        assert e.value.status == status and text in str(e.value), str(e.value)
    with pytest.raises(lk.LlmkernError) as e:  # the Python function names out_q
        lk.per_token_group_quant_fp8(x, 16, out_q=np.zeros((4, 128), E4))
    assert e.value.status == "LK_ERR_SHAPE" and "out_q" in str(e.value)
    ro = np.zeros(x.shape, E4)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="output_q: the array is read-only"):
        lk.per_token_group_fp8_quant(x, ro, np.zeros((4, 16), np.float32), 16, 1e-10, -448.0, 448.0)
    with pytest.raises(ValueError, match="column_major_scales"):
        lk.per_token_group_quant_fp8(np.ones(256, np.float32), 16, column_major_scales=True)
    q1, s1 = lk.per_token_group_quant_fp8(np.ones(256, np.float32), 16)  # 1-D, row-major: fine
    assert s1.shape == (16,) and np.all(s1 == np.float32(1) / np.float32(448))


# ---------------------------------------------------------------- torch


@pytest.mark.parametrize("layout", ["row", "col", "tma"])
@pytest.mark.parametrize("shape,G", [((5, 7168), 128), ((2, 3, 256), 16), ((7, 48), 1)])
@pytest.mark.parametrize("xdt", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("dt", ["float8_e4m3fn", "float8_e5m2"])
def test_torch(rng, shape, G, xdt, dt, layout):
    torch = torch_or_skip()
    x = torch.from_numpy(make_x(rng, shape, G, np.float32)).to(getattr(torch, xdt))
    fdt, ndt = getattr(torch, dt), {"float8_e4m3fn": E4, "float8_e5m2": E5}[dt]
    ue8m0 = layout == "tma"  # DeepGEMM's combination
    q, s = lk.per_token_group_quant_fp8(x, G, dtype=fdt, column_major_scales=layout != "row",
                                        tma_aligned_scales=layout == "tma", use_ue8m0=ue8m0)
    assert isinstance(q, torch.Tensor) and q.dtype == fdt and q.shape == x.shape
    assert s.dtype == torch.float32 and tuple(s.shape) == shape[:-1] + (shape[-1] // G,)
    m, ng = shape[-2], shape[-1] // G
    mp = tma_rows(m) if layout == "tma" else m
    if layout == "row":
        assert s.is_contiguous()
    else:  # as vLLM allocates them
        assert s.stride() == ((1, mp) if len(shape) == 2 else (ng * mp, 1, mp))
        lead = int(np.prod(shape[:-2], dtype=np.int64))
        flat = s.as_strided((lead * ng * mp,), (1,), 0).view(lead, ng, mp)
        assert s.untyped_storage().nbytes() == 4 * lead * ng * mp
        assert torch.all(flat[..., m:] == 0)  # padding never written
    check(x, q, s, G, 1e-10, ndt, ue8m0)
    # torch's own conversion of the same f32 quotients
    want = (x.float() / s.repeat_interleave(G, -1)).clamp(-FMAX[ndt], FMAX[ndt]).to(fdt)
    assert torch.equal(q.view(torch.uint8), want.view(torch.uint8))


def test_torch_raw_op_as_vllm_calls_it(rng):
    torch = torch_or_skip()
    T, D, G = 9, 7168, 128
    x = torch.from_numpy(make_x(rng, (T, D), G, np.float32)).to(torch.bfloat16)
    for fdt, ndt in ((torch.float8_e4m3fn, E4), (torch.float8_e5m2, E5)):
        fi = torch.finfo(fdt)
        q = torch.empty(T, D, dtype=fdt)
        mp = tma_rows(T)
        # TMA-aligned column-major scales: vLLM's empty_strided((T, D // G), (1, mp)), here
        # inside a full [D // G, mp] buffer whose padding must survive
        buf = torch.full((D // G, mp), SENTINEL)
        s = buf[:, :T].t()
        assert s.stride() == (1, mp)
        lk.per_token_group_fp8_quant(x, q, s, G, 1e-10, fi.min, fi.max, True)
        check(x, q, s, G, 1e-10, ndt, True)
        assert torch.all(buf[:, T:] == SENTINEL)
        s2 = torch.empty_strided((T, D // G), (1, mp), dtype=torch.float32)  # vLLM's exact allocation
        q2 = torch.empty(T, D, dtype=fdt)
        # newer vLLM's schema: two trailing dummy bools (the layout is output_s's strides)
        lk.per_token_group_fp8_quant(x, q2, s2, G, 1e-10, fi.min, fi.max, True, True, True)
        assert torch.equal(s2, s) and torch.equal(q2.view(torch.uint8), q.view(torch.uint8))
        other = torch.finfo(torch.float8_e5m2 if fdt == torch.float8_e4m3fn else torch.float8_e4m3fn)
        with pytest.raises(ValueError, match="only the range of output_q's dtype is supported: %s" % str(fdt)[6:]):
            lk.per_token_group_fp8_quant(x, q, s, G, 1e-10, other.min, other.max, False)
    u8 = torch.zeros(T, D, dtype=torch.uint8)  # uint8: e4m3
    s = torch.empty(T, D // G)
    lk.per_token_group_fp8_quant(x, u8, s, G, 1e-10, -448.0, 448.0)
    check(x, u8.numpy().view(E4), s, G, 1e-10, E4, False)
    with pytest.raises(lk.LlmkernError) as e:
        lk.per_token_group_fp8_quant(x, q, s, 3, 1e-10, fi.min, fi.max)
    assert e.value.status == "LK_ERR_SHAPE" and "group_size: 3" in str(e.value)
    with pytest.raises(lk.LlmkernError, match="eps: 0"):
        lk.per_token_group_quant_fp8(x, G, eps=0.0)


def test_torch_out_q(rng):
    torch = torch_or_skip()
    x = torch.from_numpy(make_x(rng, (4, 256), 128, np.float16))
    out = torch.zeros(4, 256, dtype=torch.float8_e5m2)
    q, s = lk.per_token_group_quant_fp8(x, 128, out_q=out)
    assert q is out and isinstance(s, torch.Tensor)
    check(x, out, s, 128, 1e-10, E5, False)
