"""Static fp8 quantization with vLLM's full static_scaled_fp8_quant semantics (scale 0-D /
one element: per tensor; 1-D with group_shape: per channel or per token; 2-D [sm, sn]:
groups of M / sm rows by N / sn columns, group_shape inferred or checked), through the raw
op, scaled_fp8_quant and torch.ops.llmkern: NumPy (ml_dtypes float8, uint8 buffers) and
torch, f32 / f16 / bf16 inputs of 2 and 3 dims, e4m3 / e5m2, strided scales and inputs,
every ISA. Reference: ml_dtypes' / torch's conversion of the f32 quotient x / s (bit for
bit; NaN stays NaN) and float64 (within half an fp8 step). Errors: the binding's
ValueError / TypeError for what vLLM checks in Python-visible shapes, the C message
(LlmkernError) for divisibility, dtypes and bad scale values."""
import numpy as np
import pytest

import llmkern as lk
from helpers import torch_or_skip, usable_isas

ml = pytest.importorskip("ml_dtypes")
E4, E5, BF16 = ml.float8_e4m3fn, ml.float8_e5m2, ml.bfloat16
FMAX = {E4: 448.0, E5: 57344.0}
FMT = {E4: (3, -6), E5: (2, -14)}  # mantissa bits, exponent of the smallest normal
SENTINEL = 0x5A  # an fp8 code that no test input quantizes to by chance in every cell


# ---------------------------------------------------------------- reference


def full_scale(s2, M, N):
    """The [M, N] f32 scale of each element from a [sm, sn] grid (groups of M / sm x N / sn)."""
    s2 = np.asarray(s2, np.float32)
    sm, sn = s2.shape
    return np.repeat(np.repeat(s2, M // sm, axis=0), N // sn, axis=1)


def ref_codes(x2, sf, dt):
    """uint8 codes of fp8(f32(x) / s): the f32 quotient, clipped to the finite range
    (saturation), converted by ml_dtypes (round to nearest even); NaN stays NaN."""
    with np.errstate(invalid="ignore", over="ignore"):
        y = np.asarray(x2, np.float32) / sf
    assert y.dtype == np.float32
    m = np.float32(FMAX[dt])
    return np.clip(y, -m, m).astype(dt).view(np.uint8)


def assert_codes(got, want, dt):
    """Equal codes; NaN (same sign) where the reference is NaN (the payload not compared:
    e5m2 has several NaN codes)."""
    got, want = np.asarray(got).view(np.uint8), np.asarray(want).view(np.uint8)
    gnan = np.isnan(got.view(dt).astype(np.float32))
    wnan = np.isnan(want.view(dt).astype(np.float32))
    np.testing.assert_array_equal(gnan, wnan)
    np.testing.assert_array_equal(got[~gnan], want[~wnan])
    np.testing.assert_array_equal(got[gnan] & 0x80, want[wnan] & 0x80)


def assert_half_step(q2, x2, sf, dt):
    """float64: |q * s - x| <= half an fp8 step at x / s (times s), plus the f32 quotient's
    rounding; |x / s| beyond fp8_max: q = +-fp8_max. Finite x only."""
    x = np.asarray(x2, np.float64)
    s = sf.astype(np.float64)
    q = np.asarray(q2).astype(np.float64)
    y = x / np.where(np.isfinite(x), s, 1.0)
    ok = np.isfinite(y) & (np.abs(y) <= FMAX[dt])
    sat = np.isfinite(y) & (np.abs(y) > FMAX[dt] * (1 + 2.0 ** -20))
    mb, emin = FMT[dt]
    e = np.floor(np.log2(np.maximum(np.abs(y[ok]), 2.0 ** emin)))
    half = 2.0 ** (e - mb - 1)
    err = np.abs(q[ok] * s[ok] - x[ok])
    assert np.all(err <= (half * (1 + 2.0 ** -20) + np.abs(y[ok]) * 2.0 ** -22) * s[ok])
    np.testing.assert_array_equal(q[sat], np.sign(y[sat]) * FMAX[dt])
    np.testing.assert_array_equal(np.isnan(q), np.isnan(x))


def np_of(t):
    """A NumPy copy of a torch tensor (float8: its codes; bf16: as f32), arrays as they are."""
    if not hasattr(t, "detach"):
        return np.asarray(t)
    import torch
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return t.view(torch.uint8).numpy().view(E4 if t.dtype == torch.float8_e4m3fn else E5)
    return t.detach().float().numpy()


def check(out, x, s2, dt):
    """out (fp8, NumPy or torch) = fp8(x / s) with s from the [sm, sn] grid s2 over x's
    [M, N] rows x columns: bit for bit against ml_dtypes, and within half a step in float64."""
    xs = np_of(x).astype(np.float32)
    N = xs.shape[-1]
    x2 = xs.reshape(-1, N)
    sf = full_scale(np_of(s2), x2.shape[0], N)
    q = np_of(out).view(np.uint8).reshape(-1, N).view(dt)
    assert_codes(q, ref_codes(x2, sf, dt), dt)
    assert_half_step(q.astype(np.float32), x2, sf, dt)


def make_x(rng, shape, xdt):
    """Gaussian values of magnitudes 1e-3 .. 1e1 by row, a zero, a few beyond the fp8 range
    once divided by the test scales (saturation), NaN and +-inf."""
    x = rng.standard_normal(shape) * 10.0 ** rng.uniform(-3, 1, shape[:-1] + (1,))
    f = x.reshape(-1)
    f[0], f[1], f[2], f[3], f[4] = 0.0, 6e4, -6e4, np.nan, np.inf
    f[-1] = -np.inf
    return x.astype(xdt)


def make_scales(rng, shape):
    """f32 scales 1e-3 .. 1, so that some quotients saturate and some are subnormal."""
    return (10.0 ** rng.uniform(-3, 0, shape)).astype(np.float32)


def fp8_empty(shape, dt):
    out = np.empty(shape, dt)
    out.view(np.uint8)[...] = SENTINEL
    return out


# ---------------------------------------------------------------- per tensor


@pytest.mark.parametrize("form", ["number", "0d", "1", "11", "111"])
@pytest.mark.parametrize("group_shape", [None, (-1, -1), [1, 128]])
def test_per_tensor_forms(rng, form, group_shape):
    x = make_x(rng, (6, 256), np.float32)
    v = np.float32(0.03)
    scale = {"number": v, "0d": np.array(v), "1": np.array([v]), "11": np.array([[v]]),
             "111": np.array([[[v]]])}[form]
    out = fp8_empty(x.shape, E4)
    lk.static_scaled_fp8_quant(out, x, scale, group_shape)  # group_shape ignored, as in vLLM
    check(out, x, np.array([[v]]), E4)
    q, s = lk.scaled_fp8_quant(x, scale, group_shape=group_shape)
    assert s is scale
    assert np.array_equal(q.view(np.uint8), out.view(np.uint8))


def test_per_tensor_torch(rng):
    torch = torch_or_skip()
    x = torch.from_numpy(make_x(rng, (2, 3, 128), np.float32)).to(torch.bfloat16)
    for scale in (torch.tensor(0.05), torch.tensor([0.05]), torch.tensor([[0.05]])):
        out = torch.empty(x.shape, dtype=torch.float8_e5m2)
        lk.static_scaled_fp8_quant(out, x, scale)
        check(out, x, np.array([[0.05]], np.float32), E5)
        want = (x.float() / scale.reshape(()).item()).clamp(-57344, 57344).to(torch.float8_e5m2)
        ok = ~torch.isnan(x)
        assert torch.equal(out.view(torch.uint8)[ok], want.view(torch.uint8)[ok])


# ---------------------------------------------------------------- grids (NumPy)

M, N = 12, 384  # rows (after flattening) and columns of the NumPy cases

# (name, scale shape, group_shape, the [sm, sn] grid the scale stands for)
CASES = [
    ("per_channel_1d", (N,), (-1, 1), (1, N)),
    ("per_channel_1d_rows", (N,), (M, 1), (1, N)),
    ("per_channel_2d", (1, N), None, (1, N)),
    ("per_channel_2d_gs", (1, N), (-1, 1), (1, N)),
    ("channel_groups_1d", (N // 128,), (-1, 128), (1, N // 128)),
    ("channel_groups_1d_small", (N // 4,), (-1, 4), (1, N // 4)),
    ("per_token_1d", (M,), (1, -1), (M, 1)),
    ("per_token_1d_cols", (M,), (1, N), (M, 1)),
    ("per_token_2d", (M, 1), None, (M, 1)),
    ("per_token_2d_gs", (M, 1), [1, -1], (M, 1)),
    ("token_groups_1d", (M // 3,), (3, -1), (M // 3, 1)),
    ("blocks_1x128", (M, N // 128), None, (M, N // 128)),
    ("blocks_1x128_gs", (M, N // 128), (1, 128), (M, N // 128)),
    ("blocks_4x128_gs", (M // 4, N // 128), (4, 128), (M // 4, N // 128)),
    ("blocks_2x2", (M // 2, N // 2), None, (M // 2, N // 2)),
    ("blocks_3x8_gs", (M // 3, N // 8), (3, 8), (M // 3, N // 8)),
    ("blocks_whole_rows_gs", (1, N // 128), (-1, 128), (1, N // 128)),
    ("blocks_whole_cols_gs", (M // 4, 1), (4, -1), (M // 4, 1)),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dt", [E4, E5])
@pytest.mark.parametrize("xdt", [np.float32, np.float16, BF16])
@pytest.mark.parametrize("lead", [(M,), (3, 4)], ids=["2d", "3d"])
def test_grid_numpy(rng, case, dt, xdt, lead):
    _, sshape, gs, grid = case
    x = make_x(rng, lead + (N,), xdt)
    scale = make_scales(rng, sshape)
    out = fp8_empty(x.shape, dt)
    lk.static_scaled_fp8_quant(out, x, scale, gs)
    check(out, x, scale.reshape(grid), dt)
    # scaled_fp8_quant: a new e4m3 output, the scale returned as given
    q, s = lk.scaled_fp8_quant(x, scale, group_shape=gs)
    assert s is scale and q.dtype == E4 and q.shape == x.shape
    check(q, x, scale.reshape(grid), E4)
    # a uint8 buffer: e4m3 codes
    if dt is E4:
        buf = np.full(x.shape, SENTINEL, np.uint8)
        lk.static_scaled_fp8_quant(buf, x, scale, gs)
        assert np.array_equal(buf, out.view(np.uint8))


def test_square_input_group_shape_decides(rng):
    """M == N: a 1-D scale is per channel or per token only by group_shape (why vLLM
    requires it)."""
    x = make_x(rng, (64, 64), np.float32)
    v = make_scales(rng, (64,))
    a, b = fp8_empty(x.shape, E4), fp8_empty(x.shape, E4)
    lk.static_scaled_fp8_quant(a, x, v, (-1, 1))
    lk.static_scaled_fp8_quant(b, x, v, (1, -1))
    check(a, x, v.reshape(1, 64), E4)
    check(b, x, v.reshape(64, 1), E4)
    assert not np.array_equal(a.view(np.uint8), b.view(np.uint8))


def test_vllm_block_shape(rng):
    """DeepSeek-style activations: [tokens, 7168] with [tokens, 56] scales, groups 1 x 128."""
    x = make_x(rng, (5, 7168), BF16)
    scale = make_scales(rng, (5, 56))
    q, s = lk.scaled_fp8_quant(x, scale, group_shape=(1, 128))
    check(q, x, scale, E4)
    q2, _ = lk.scaled_fp8_quant(x, scale)
    assert np.array_equal(q.view(np.uint8), q2.view(np.uint8))


def test_strided_scales_numpy(rng):
    x = make_x(rng, (M, N), np.float32)
    # 2-D transposed (column-major, as a [sn, sm] buffer's .T)
    base = make_scales(rng, (N // 128, M))
    out = fp8_empty(x.shape, E4)
    lk.static_scaled_fp8_quant(out, x, base.T)
    check(out, x, base.T, E4)
    # 2-D with a padded row stride and a column step
    big = make_scales(rng, (M // 2, 2 * (N // 64) + 3))
    sc = big[:, 1:1 + 2 * (N // 64):2]
    lk.static_scaled_fp8_quant(out, x, sc, (2, 64))
    check(out, x, sc, E4)
    # 1-D with a step, and reversed
    big = make_scales(rng, (3 * N,))
    for sc in (big[::3], big[N - 1::-1], big[::-3][:N]):
        lk.static_scaled_fp8_quant(out, x, sc, (-1, 1))
        check(out, x, sc.reshape(1, N), E4)
    for sc in (big[:2 * M:2], big[M - 1::-1]):
        lk.static_scaled_fp8_quant(out, x, sc, (1, -1))
        check(out, x, sc.reshape(M, 1), E4)
    # 2-D with negative strides
    sc = make_scales(rng, (M // 4, N // 32))
    for v in (sc[::-1], sc[:, ::-1], sc[::-1, ::-1]):
        lk.static_scaled_fp8_quant(out, x, v, (4, 32))
        check(out, x, v, E4)
    # a broadcast (stride 0) per-channel row
    sc = np.broadcast_to(make_scales(rng, (1, N)), (M, N))
    lk.static_scaled_fp8_quant(out, x, sc)
    check(out, x, sc, E4)


def test_strided_input_numpy(rng):
    """Rows of a wider buffer and a column step (the reference path) give the same codes."""
    big = make_x(rng, (M, 2 * N + 8), np.float16)
    scale = make_scales(rng, (M // 2, N // 128))
    for x in (big[:, 8:8 + N], big[:, ::2][:, :N]):
        out = fp8_empty((M, N), E5)
        lk.static_scaled_fp8_quant(out, x, scale, (2, 128))
        check(out, x, scale, E5)
    wide = fp8_empty((M, 2 * N), E4)
    x = big[:, :N]
    lk.static_scaled_fp8_quant(wide[:, ::2], x, scale)
    check(wide[:, ::2], x, scale, E4)
    assert np.all(wide.view(np.uint8)[:, 1::2] == SENTINEL)


# (input shape, grids): the small one runs on one thread; the large one (90 rows of 1024)
# is split over the threads, at row 45 for two (inside a group of 2 rows)
ISA_CASES = [((M, N), [(1, N), (M, 1), (M, N // 128), (M // 2, N // 4), (M // 3, N // 2), (1, N // 8), (M, N)]),
             ((90, 1024), [(1, 1024), (90, 1), (45, 8), (9, 256), (90, 64), (6, 1024)])]


@pytest.mark.parametrize("shape,grids", ISA_CASES, ids=["small", "threads"])
def test_every_isa_and_thread_count(rng, shape, grids):
    """Per-channel (vector of scales), wide and narrow groups: every ISA and thread count
    gives the reference's codes."""
    x = make_x(rng, shape, BF16)
    prev, nthr = lk.isa(), lk.get_num_threads()
    isas = usable_isas(lk)
    try:
        for grid in grids:
            scale = make_scales(rng, grid)
            for sc in (scale, np.ascontiguousarray(scale.T).T):
                for dt in (E4, E5):
                    want = None
                    for name in isas:
                        lk.set_isa(name)
                        for n in (1, 0):
                            lk.set_num_threads(n)
                            out = fp8_empty(x.shape, dt)
                            lk.static_scaled_fp8_quant(out, x, sc)
                            if want is None:
                                check(out, x, scale, dt)
                                want = out.view(np.uint8).copy()
                            assert np.array_equal(out.view(np.uint8), want), (grid, name, n, dt)
    finally:
        lk.set_isa(prev)
        lk.set_num_threads(nthr)


def test_empty_inputs():
    """No rows (or no columns): nothing written, the scale shapes of the empty grid accepted."""
    for x, scale, gs in ((np.zeros((0, 256), np.float32), np.ones(256, np.float32), (-1, 1)),
                         (np.zeros((0, 256), np.float32), np.ones(0, np.float32), (1, -1)),
                         (np.zeros((0, 256), np.float32), np.ones((0, 2), np.float32), None),
                         (np.zeros((0, 256), np.float32), np.ones((3, 2), np.float32), None),
                         (np.zeros((2, 0, 256), np.float32), np.ones((0, 2), np.float32), None),
                         (np.zeros((4, 0), np.float32), np.ones((4, 0), np.float32), None),
                         (np.zeros((4, 0), np.float32), np.ones(4, np.float32), (1, -1))):
        out = np.empty(x.shape, E4)
        lk.static_scaled_fp8_quant(out, x, scale, gs)
    with pytest.raises(lk.LlmkernError) as e:  # the scale still has finite, > 0 values
        lk.static_scaled_fp8_quant(np.empty((0, 256), E4), np.zeros((0, 256), np.float32),
                                   np.zeros(256, np.float32), (-1, 1))
    assert e.value.status == "LK_ERR_VALUE" and "scale[0, 0]" in str(e.value)


# ---------------------------------------------------------------- torch


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("xdt", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("dt", ["float8_e4m3fn", "float8_e5m2"])
def test_grid_torch(rng, case, xdt, dt):
    torch = torch_or_skip()
    _, sshape, gs, grid = case
    tdt, ndt = getattr(torch, dt), (E4 if dt == "float8_e4m3fn" else E5)
    x = torch.from_numpy(make_x(rng, (3, 4, N), np.float32)).to(getattr(torch, xdt))
    scale = torch.from_numpy(make_scales(rng, sshape))
    out = torch.empty(x.shape, dtype=tdt)
    lk.static_scaled_fp8_quant(out, x, scale, None if gs is None else list(gs))
    check(out, x, scale.reshape(grid).numpy(), ndt)
    # torch's own conversion of the f32 quotient (saturated), bit for bit off NaN
    sf = torch.from_numpy(full_scale(scale.reshape(grid).numpy(), M, N)).reshape(x.shape)
    want = (x.float() / sf).clamp(-FMAX[ndt], FMAX[ndt]).to(tdt)
    ok = ~torch.isnan(x)
    assert torch.equal(out.view(torch.uint8)[ok], want.view(torch.uint8)[ok])
    # the registered custom op (vLLM's _C schema)
    import llmkern.torch  # noqa: F401
    out2 = torch.empty(x.shape, dtype=tdt)
    torch.ops.llmkern.static_scaled_fp8_quant(out2, x, scale, None if gs is None else list(gs))
    assert torch.equal(out2.view(torch.uint8), out.view(torch.uint8))
    q, s = lk.scaled_fp8_quant(x, scale, group_shape=gs)
    assert s is scale and q.dtype == torch.float8_e4m3fn
    check(q, x, scale.reshape(grid).numpy(), E4)


def test_strided_scales_torch(rng):
    torch = torch_or_skip()
    x = torch.from_numpy(make_x(rng, (M, N), np.float32)).to(torch.float16)
    base = torch.from_numpy(make_scales(rng, (N // 128, M)))
    out = torch.empty(M, N, dtype=torch.float8_e4m3fn)
    lk.static_scaled_fp8_quant(out, x, base.t())  # column-major [M, N / 128]
    check(out, x, base.t().numpy(), E4)
    lk.static_scaled_fp8_quant(out, x, base.t(), [1, 128])
    check(out, x, base.t().numpy(), E4)
    big = torch.from_numpy(make_scales(rng, (2 * N,)))
    lk.static_scaled_fp8_quant(out, x, big[::2], [-1, 1])
    check(out, x, big[::2].reshape(1, N).numpy(), E4)
    lk.static_scaled_fp8_quant(out, x, big[1:2 * M:2], [1, -1])
    check(out, x, big[1:2 * M:2].reshape(M, 1).numpy(), E4)


# ---------------------------------------------------------------- errors


def _err(exc_type, fn, match=None):
    with pytest.raises(exc_type, match=match) as e:
        fn()
    return e.value


def test_shape_errors(rng):
    x = make_x(rng, (M, N), np.float32)
    out = fp8_empty(x.shape, E4)

    def q(scale, gs=None):
        return lambda: lk.static_scaled_fp8_quant(out, x, scale, gs)

    ones = lambda *s: np.ones(s, np.float32)  # noqa: E731
    # 1-D without group_shape: per channel or per token is ambiguous
    _err(ValueError, q(ones(N)), r"scale: shape \[384\]; a 1-D scale needs group_shape")
    _err(ValueError, lambda: lk.scaled_fp8_quant(x, ones(M)), "needs group_shape")
    # 1-D length != (M / gm) * (N / gn)
    _err(ValueError, q(ones(N - 1), (-1, 1)), r"scale: 383 values, group_shape \(-1, 1\) .* makes 1 x 384 = 384")
    _err(ValueError, q(ones(N), (1, -1)), r"scale: 384 values.*makes 12 x 1 = 12 groups")
    _err(ValueError, q(ones(N // 64), (-1, 128)), "makes 1 x 3 = 3 groups")
    # 1-D whose groups make a grid with both dims > 1
    _err(ValueError, q(ones(M * (N // 128)), (1, 128)), r"makes a 12 x 3 grid of groups.*2-D \[12, 3\] scale")
    # group sizes that do not divide their dim
    _err(ValueError, q(ones(N // 100), (-1, 100)), r"groups of 100 columns do not divide input \[12, 384\]")
    _err(ValueError, q(ones(2), (5, -1)), "groups of 5 rows do not divide")
    # an explicit group_shape that is not the 2-D scale's groups
    _err(ValueError, q(ones(M, N // 128), (1, 64)),
         r"group_shape: \(1, 64\) does not match the groups of scale \[12, 3\] .*groups of 1 x 128")
    _err(ValueError, q(ones(M, N // 128), (-1, 128)), "groups of 1 x 128")
    _err(ValueError, q(ones(1, N), (1, 1)), "groups of 12 x 1")
    _err(ValueError, lambda: lk.scaled_fp8_quant(x, ones(M // 2, N // 128), group_shape=(1, 128)), "groups of 2 x 128")
    # 3-D (and more) scales
    _err(ValueError, q(ones(2, M // 2, N // 128)), r"scale: shape \[2, 6, 3\]; .* not 3-D")
    _err(ValueError, q(ones(1, 1, 2, 2), (1, 128)), "not 4-D")
    # malformed group_shape (also with a per-tensor scale)
    for gs in ((1, 2, 3), (0, -1), (-2, 1), (1,)):
        _err(ValueError, q(ones(N), gs), "group_shape")
        _err(ValueError, q(np.float32(0.5), gs), "group_shape")
    for gs in ((1.0, -1), ("a", "b"), 5, (True, 1)):
        _err(TypeError, q(ones(N), gs), "group_shape")
    # 2-D grids that do not split the input: the C message
    for sc in (ones(5, N // 128), ones(M, 5), ones(0, 3), ones(M, 0), ones(2 * M, 3)):
        e = _err(lk.LlmkernError, q(sc))
        assert e.status == "LK_ERR_SHAPE" and "scale: shape [%d, %d] does not split input's 12 rows x 384" % sc.shape \
            in str(e), str(e)
    assert np.all(out.view(np.uint8) == SENTINEL)  # nothing written


@pytest.mark.parametrize("bad", [0.0, -0.5, float("nan"), float("inf"), -float("inf")])
def test_bad_scale_values(rng, bad):
    x = make_x(rng, (M, N), np.float32)
    out = fp8_empty(x.shape, E4)
    sc = np.full((M // 2, N // 128), 0.5, np.float32)
    sc[4, 2] = bad
    e = _err(lk.LlmkernError, lambda: lk.static_scaled_fp8_quant(out, x, sc))
    assert e.status == "LK_ERR_VALUE" and "lk_static_group_scaled_fp8_quant: scale[4, 2]: value" in str(e), str(e)
    e = _err(lk.LlmkernError, lambda: lk.static_scaled_fp8_quant(out, x, sc.T.copy().T, (2, 128)))
    assert "scale[4, 2]" in str(e)
    # 1-D: named as the [1, n] / [n, 1] grid they stand for
    v = np.full(N, 0.5, np.float32)
    v[7] = bad
    e = _err(lk.LlmkernError, lambda: lk.static_scaled_fp8_quant(out, x, v, (-1, 1)))
    assert e.status == "LK_ERR_VALUE" and "scale[0, 7]" in str(e), str(e)
    v = np.full(M, 0.5, np.float32)
    v[3] = bad
    e = _err(lk.LlmkernError, lambda: lk.static_scaled_fp8_quant(out, x, v, (1, -1)))
    assert "scale[3, 0]" in str(e), str(e)
    assert np.all(out.view(np.uint8) == SENTINEL)


def test_scale_dtypes(rng):
    """Scales are f32 on every path: other float dtypes are refused as the per-tensor path
    refuses them (the C message for f16 / bf16, the binding's TypeError for float64 NumPy)."""
    x = make_x(rng, (M, N), np.float32)
    out = fp8_empty(x.shape, E4)
    for sc, gs in ((np.full(1, 0.5, np.float16), None), (np.full(N, 0.5, np.float16), (-1, 1)),
                   (np.full((M, 3), 0.5, BF16), None)):
        e = _err(lk.LlmkernError, lambda: lk.static_scaled_fp8_quant(out, x, sc, gs))
        assert e.status == "LK_ERR_DTYPE" and "scale: dtype" in str(e), str(e)
    for sc, gs in ((np.full(1, 0.5), None), (np.full(N, 0.5), (-1, 1)), (np.full((M, 3), 0.5), None)):
        _err(TypeError, lambda: lk.static_scaled_fp8_quant(out, x, sc, gs), "scale: dtype float64")
    assert np.all(out.view(np.uint8) == SENTINEL)


def test_out_and_input_errors(rng):
    """out / input checks stay C's (named as in the per-tensor op)."""
    x = make_x(rng, (M, N), np.float32)
    sc = np.ones((M, 3), np.float32)
    e = _err(lk.LlmkernError, lambda: lk.static_scaled_fp8_quant(np.empty((M, N), np.float32), x, sc))
    assert e.status == "LK_ERR_DTYPE" and "out: dtype f32" in str(e)
    e = _err(lk.LlmkernError, lambda: lk.static_scaled_fp8_quant(np.empty((M, N - 1), E4), x, sc))
    assert e.status == "LK_ERR_SHAPE" and "out" in str(e)
    _err(ValueError, lambda: lk.static_scaled_fp8_quant(np.empty((M, N), E4), x, np.ones(N, np.float32)),
         "group_shape")
    ro = np.empty((M, N), E4)
    ro.flags.writeable = False
    _err(ValueError, lambda: lk.static_scaled_fp8_quant(ro, x, sc), "read-only")


def test_errors_torch(rng):
    torch = torch_or_skip()
    import llmkern.torch  # noqa: F401
    x = torch.randn(M, N)
    out = torch.empty(M, N, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="needs group_shape"):
        torch.ops.llmkern.static_scaled_fp8_quant(out, x, torch.ones(N))
    with pytest.raises(ValueError, match="does not match the groups"):
        torch.ops.llmkern.static_scaled_fp8_quant(out, x, torch.ones(M, 3), [1, 64])
    with pytest.raises(ValueError, match="not 3-D"):
        lk.static_scaled_fp8_quant(out, x, torch.ones(2, 2, 2))
    sc = torch.ones(M, 3)
    sc[5, 1] = float("nan")
    with pytest.raises(lk.LlmkernError, match=r"scale\[5, 1\]: value nan"):
        lk.static_scaled_fp8_quant(out, x, sc)
    with pytest.raises(lk.LlmkernError, match="scale: dtype bf16"):
        lk.static_scaled_fp8_quant(out, x, torch.ones(N, dtype=torch.bfloat16), [-1, 1])
