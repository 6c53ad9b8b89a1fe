"""Per-token-group int8 quantization (block-int8 activations): vLLM's custom op
per_token_group_quant_int8(input, output_q, output_s, group_size, eps, int8_min, int8_max)
(the binding's per_token_group_quant_int8_into; torch.ops.llmkern.per_token_group_quant_int8)
and its Python function per_token_group_quant_int8(x, group_size, eps, dtype) -> (x_q, x_s),
against a NumPy reference of the contract (include/llmkern.h) computed in f32 only:
  s = max(absmax(group), eps) / 127            one f32 division (absmax ignoring NaN)
  x_q = trunc(clip(f32(x) / s, -128, 127))     one f32 division, toward zero, NaN -> 0
scales and codes bit for bit. f32 / f16 / bf16 inputs, group sizes 1 / 16 / 128, 2-D and
3-D inputs, row-major, [rows, D / G] and column-major (transposed view) scales, NumPy arrays
and torch tensors, strided inputs, every usable ISA and thread count, special values, the
truncation (2.7 -> 2, not rounded), the error cases (nothing written) and the torch.ops
call forms."""
import numpy as np
import pytest

import llmkern as lk
from helpers import torch_or_skip, usable_isas

ml = pytest.importorskip("ml_dtypes")
BF16 = ml.bfloat16
SENTINEL = -7.0
FLT_MIN = np.finfo(np.float32).tiny


# ---------------------------------------------------------------- reference (f32 only)


def groups(a, G):
    return a.reshape(a.shape[:-1] + (a.shape[-1] // G, G))


def ref(x, G, eps=1e-10):
    """(codes int8, scales f32) of the contract for x (any float dtype, values exact in f32)."""
    xf = np.asarray(x).astype(np.float32)
    am = np.fmax.reduce(np.abs(groups(xf, G)), axis=-1, initial=np.float32(0))  # NaN ignored
    assert am.dtype == np.float32
    s = np.maximum(am, np.float32(eps)) / np.float32(127)
    assert s.dtype == np.float32
    with np.errstate(invalid="ignore", divide="ignore"):
        y = xf / np.repeat(s, G, axis=-1)
    assert y.dtype == np.float32
    y = np.where(np.isnan(y), np.float32(0), y)
    q = np.trunc(np.clip(y, np.float32(-128), np.float32(127))).astype(np.int8)
    return q, s


def np_of(t):
    """NumPy view / copy of a result (torch tensors through .numpy())."""
    if hasattr(t, "detach"):
        return t.detach().float().numpy() if t.is_floating_point() else t.detach().numpy()
    return np.asarray(t)


def assert_ref(x, q, s, G, eps=1e-10):
    xn = np_of(x) if not hasattr(x, "detach") else x.detach().float().numpy()
    want_q, want_s = ref(xn, G, eps)
    qn, sn = np_of(q), np_of(s)
    assert qn.dtype == np.int8 and sn.dtype == np.float32
    np.testing.assert_array_equal(sn.reshape(want_s.shape), want_s)
    np.testing.assert_array_equal(qn, want_q)


def make_x(rng, shape, G, xdt):
    """Gaussian groups of magnitudes 1e-3 .. 1e3 (one scale each), one all-zero group."""
    ng = shape[-1] // G
    mag = 10.0 ** rng.uniform(-3, 3, shape[:-1] + (ng, 1))
    x = (rng.standard_normal(shape[:-1] + (ng, G)) * mag).reshape(shape)
    x.reshape(-1)[:G] = 0.0
    return x.astype(xdt)


def root(a):
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


SHAPES = [((5, 7168), 128), ((2, 3, 256), 16), ((7, 48), 1), ((1, 32), 32)]


# ---------------------------------------------------------------- NumPy


@pytest.mark.parametrize("xdt", [np.float32, np.float16, BF16])
@pytest.mark.parametrize("shape,G", SHAPES)
def test_numpy(rng, shape, G, xdt):
    x = make_x(rng, shape, G, xdt)
    q, s = lk.per_token_group_quant_int8(x, G)
    assert isinstance(q, np.ndarray) and q.dtype == np.int8 and q.shape == x.shape and q.flags.c_contiguous
    assert s.dtype == np.float32 and s.shape == shape[:-1] + (shape[-1] // G,) and s.flags.c_contiguous
    assert_ref(x, q, s, G)
    assert np.abs(q.astype(np.int32)).max() <= 127  # -128 needs x / s below -128: never (|x| <= absmax)
    # the raw op, vLLM's argument order, into given buffers: the same bits
    q2, s2 = np.full(shape, 99, np.int8), np.full(s.shape, SENTINEL, np.float32)
    lk.per_token_group_quant_int8_into(x, q2, s2, G, 1e-10, -128.0, 127.0)
    np.testing.assert_array_equal(q2, q)
    np.testing.assert_array_equal(s2, s)
    # [rows, D / G] scales for any input rank (vLLM's flat form)
    rows = int(np.prod(shape[:-1]))
    q3, s3 = np.zeros(shape, np.int8), np.zeros((rows, shape[-1] // G), np.float32)
    lk.per_token_group_quant_int8_into(x, q3, s3, G, 1e-10, -128, 127)
    np.testing.assert_array_equal(q3, q)
    np.testing.assert_array_equal(s3, s.reshape(rows, -1))


@pytest.mark.parametrize("xdt", [np.float32, np.float16, BF16])
@pytest.mark.parametrize("shape,G", [((5, 7168), 128), ((7, 64), 16), ((6, 256), 1), ((3, 32), 32)])
def test_column_major_raw_op(rng, shape, G, xdt):
    """output_s the transposed view of a [D / G, rows (padded to a multiple of 4)] buffer,
    as vLLM allocates column-major scales; the padding (a sentinel) survives."""
    T, D = shape
    x = make_x(rng, shape, G, xdt)
    mp = (T + 3) // 4 * 4
    buf = np.full((D // G, mp), SENTINEL, np.float32)
    out_s = buf[:, :T].T
    assert out_s.strides == (4, 4 * mp)
    q = np.zeros(shape, np.int8)
    lk.per_token_group_quant_int8_into(x, q, out_s, G, 1e-10, -128.0, 127.0)
    assert_ref(x, q, out_s, G)
    assert np.all(buf[:, T:] == SENTINEL)
    rq, rs = lk.per_token_group_quant_int8(x, G)
    np.testing.assert_array_equal(out_s, rs)
    np.testing.assert_array_equal(q, rq)


def test_defaults_and_exports(rng):
    x = make_x(rng, (4, 512), 128, np.float32)
    q, s = lk.per_token_group_quant_int8(x, 128)  # eps 1e-10, int8
    assert_ref(x, q, s, 128)
    for dt in (np.int8, "int8", np.dtype(np.int8)):
        q2, s2 = lk.per_token_group_quant_int8(x, 128, 1e-10, dt)
        np.testing.assert_array_equal(q2, q)
        np.testing.assert_array_equal(s2, s)
    for name in ("per_token_group_quant_int8", "per_token_group_quant_int8_into"):
        assert name in lk.__all__ and callable(getattr(lk, name))


def test_truncation_not_rounding():
    """A group of absmax 127 has scale exactly 1: the codes are the values truncated toward
    zero (vLLM's int8_t cast), visibly unlike round-to-nearest."""
    v = np.array([127, 2.7, -2.7, 2.5, -2.5, 0.9, -0.9, 126.99, -126.5, 3.5, -3.5, 1.0, -1.0, 0.49, -0.0, -127],
                 np.float32)
    q, s = lk.per_token_group_quant_int8(v[None, :], 16)
    assert s[0, 0] == np.float32(1.0)
    want = np.array([127, 2, -2, 2, -2, 0, 0, 126, -126, 3, -3, 1, -1, 0, 0, -127], np.int8)
    np.testing.assert_array_equal(q[0], want)
    assert not np.array_equal(q[0], np.rint(v).astype(np.int8))  # rounding would differ
    assert q[0, 1] == 2 and q[0, 2] == -2  # 2.7 -> 2, -2.7 -> -2
    # against llmkern's per-token int8 quantizer, which rounds (vLLM's dynamic_scaled_int8_quant)
    r = np.zeros((1, 16), np.int8)
    lk.dynamic_scaled_int8_quant(r, v[None, :], np.zeros((1, 1), np.float32))
    assert r[0, 1] == 3 and r[0, 2] == -3
    # f16 / bf16 inputs of the same values give the same codes where the values are exact
    for dt in (np.float16, BF16):
        xv = np.array([[127, 2.75, -2.75, 0.5, -0.5, 63.5, -63.5, 1.5]], dt)
        q, s = lk.per_token_group_quant_int8(xv, 8)
        assert s[0, 0] == 1.0
        np.testing.assert_array_equal(q[0], np.array([127, 2, -2, 0, 0, 63, -63, 1], np.int8))


def test_clamp_at_127():
    """Where f32(absmax / 127) rounds down, absmax / s exceeds 127 in f32: clamped to 127
    (and -absmax to -127; -128 is never reached)."""
    cands = np.float32(1.0) + np.arange(1, 20000, dtype=np.float32) * np.float32(2.0 ** -23)
    over = cands[cands / (cands / np.float32(127)) > np.float32(127)]
    assert over.size > 0
    a = over[0]
    x = np.array([[a, -a, a / 2, 0]], np.float32)
    q, s = lk.per_token_group_quant_int8(x, 4)
    assert s[0, 0] == a / np.float32(127) and a / s[0, 0] > 127
    np.testing.assert_array_equal(q[0], ref(x, 4)[0][0])
    assert q[0, 0] == 127 and q[0, 1] == -127


def test_special_values():
    G = 8
    inf, nan = np.inf, np.nan
    x = np.array([
        [0, 0, 0, 0, 0, 0, 0, 0],                      # absmax 0: s = eps / 127
        [1, nan, -2, 0.5, 0, -0.0, 3, -4],             # NaN ignored by the absmax, code 0
        [1, inf, -2, 0.5, 0, -0.0, 3, -4],             # inf: s inf, finite -> 0, inf / inf NaN -> 0
        [1, -inf, -2, 0.5, 0, -0.0, 3, -4],            # -inf the same
        [nan] * 8,                                     # all NaN: absmax 0, s = eps / 127, codes 0
        [1e-30, -1e-30, 0, 0, 0, 0, 0, 0],             # absmax < eps: s = eps / 127, |codes| < 1 -> 0
        [127, -127, 1e30, 0, 0, 0, 0, 0],              # a large group: s = 1e30 / 127
        [6e4, -6e4, 3e4, -1, 0, 0, 0, 0],              # f16's range
    ], np.float32)
    eps = 1e-10
    q, s = lk.per_token_group_quant_int8(x, G, eps=eps)
    assert_ref(x, q, s, G, eps)
    s = s[:, 0]
    e = np.float32(eps) / np.float32(127)
    assert s[0] == s[4] == s[5] == e
    assert np.isinf(s[2]) and np.isinf(s[3]) and s[2] > 0 and s[3] > 0
    assert np.all(q[0] == 0) and np.all(q[4] == 0) and np.all(q[5] == 0)
    np.testing.assert_array_equal(q[1], [31, 0, -63, 15, 0, 0, 95, -127])  # NaN -> 0 (vLLM's clamp: -128)
    assert np.all(q[2] == 0) and np.all(q[3] == 0)
    assert q[6, 2] == 127 and q[6, 0] == 0 and q[6, 1] == 0
    assert q[7, 0] == 127 and q[7, 1] == -127 and q[7, 2] == 63 and q[7, 3] == 0
    for xdt in (np.float16, BF16):  # the same through the half-precision loads
        with np.errstate(over="ignore"):  # 1e30 -> inf in f16: the row then has an inf
            xh = x.astype(xdt)
        qh, sh = lk.per_token_group_quant_int8(xh, G, eps=eps)
        assert_ref(xh, qh, sh, G, eps)


def test_strided_input(rng):
    """Any strides (vLLM asserts a contiguous x): a column slice and a last-dim stride of 2
    give the contiguous input's bits."""
    base = make_x(rng, (5, 1024), 128, np.float32)
    for x in (base[:, 256:768], base[:, ::2], base[::2, :512]):
        q, s = lk.per_token_group_quant_int8(x, 128)
        rq, rs = lk.per_token_group_quant_int8(np.ascontiguousarray(x), 128)
        np.testing.assert_array_equal(q, rq)
        np.testing.assert_array_equal(s, rs)
        assert_ref(x, q, s, 128)


def test_every_isa_and_thread_count(rng):
    isas = usable_isas(lk)
    prev, nthr = lk.isa(), lk.get_num_threads()
    xs = {dt: make_x(rng, (33, 7168), 128, dt) for dt in (np.float32, np.float16, BF16)}
    xs["g16"] = make_x(rng, (9, 7, 96), 16, BF16)
    xs["g1"] = make_x(rng, (17, 40), 1, np.float32)
    # special values inside vector-width blocks
    sp = make_x(rng, (4, 256), 32, np.float32)
    sp[0, 5], sp[1, 40], sp[2, 77], sp[3, 200:232] = np.nan, np.inf, -np.inf, np.nan
    xs["special"] = sp
    G = {"g16": 16, "g1": 1, "special": 32}
    got = []
    try:
        for name in isas:
            lk.set_isa(name)
            for n in (1, 0):
                lk.set_num_threads(n)
                for k, x in xs.items():
                    g = G.get(k, 128)
                    q, s = lk.per_token_group_quant_int8(x, g)
                    lead = x.shape[:-1]
                    rows = int(np.prod(lead))
                    buf = np.full((x.shape[-1] // g, rows + 3), SENTINEL, np.float32)
                    q2 = np.zeros(x.shape, np.int8)
                    lk.per_token_group_quant_int8_into(x, q2, buf[:, :rows].T, g, 1e-10, -128.0, 127.0)
                    assert np.all(buf[:, rows:] == SENTINEL)
                    got.append((name, n, k, q.copy(), s.copy(), q2, buf[:, :rows].T.copy()))
    finally:
        lk.set_isa(prev)
        lk.set_num_threads(nthr)
    assert len(got) == 2 * len(isas) * len(xs)
    first = {}
    for name, n, k, q, s, q2, s2 in got:
        x = xs[k]
        g = G.get(k, 128)
        if k not in first:
            assert_ref(x, q, s, g)
            first[k] = (q, s)
        rq, rs = first[k]
        assert np.array_equal(q, rq) and np.array_equal(s, rs), (name, n, k)
        assert np.array_equal(q2, rq) and np.array_equal(s2, rs.reshape(s2.shape)), (name, n, k)


def test_eps(rng):
    x = make_x(rng, (3, 64), 16, np.float32)
    x[1, :16] = 1e-6  # below eps: the group's scale is eps / 127
    q, s = lk.per_token_group_quant_int8(x, 16, eps=1e-4)
    assert_ref(x, q, s, 16, 1e-4)
    assert s[1, 0] == np.float32(1e-4) / np.float32(127) and np.all(q[1, :16] == 1)  # 1e-6 * 127 / 1e-4 = 1.27
    lo = float(np.float32(127.0) * FLT_MIN)  # the smallest eps accepted (127 * FLT_MIN)
    q, s = lk.per_token_group_quant_int8(x, 16, eps=lo)
    assert_ref(x, q, s, 16, lo)
    z = np.zeros((1, 16), np.float32)
    q, s = lk.per_token_group_quant_int8(z, 16, eps=lo)
    assert s[0, 0] == np.float32(lo) / np.float32(127) and s[0, 0] >= FLT_MIN and np.all(q == 0)
    for bad in (0.0, -1.0, lo / 2, float("nan"), float("inf"), -float("inf")):
        out = np.full(x.shape, 7, np.int8)
        sc = np.full((3, 4), SENTINEL, np.float32)
        with pytest.raises(lk.LlmkernError) as e:
            lk.per_token_group_quant_int8_into(x, out, sc, 16, bad, -128.0, 127.0)
        assert e.value.status == "LK_ERR_VALUE" and "eps:" in str(e.value)
        assert np.all(out == 7) and np.all(sc == SENTINEL)  # validated before any store
        with pytest.raises(lk.LlmkernError, match="eps: .*expected finite"):
            lk.per_token_group_quant_int8(x, 16, eps=bad)
    for bad in ("1e-10", None, [1e-10], True):
        out = np.full(x.shape, 7, np.int8)
        with pytest.raises(TypeError, match="eps"):
            lk.per_token_group_quant_int8_into(x, out, np.zeros((3, 4), np.float32), 16, bad, -128.0, 127.0)
        assert np.all(out == 7)
        with pytest.raises(TypeError, match="eps"):
            lk.per_token_group_quant_int8(x, 16, eps=bad)


def test_empty():
    q, s = lk.per_token_group_quant_int8(np.zeros((0, 256), np.float32), 128)
    assert q.shape == (0, 256) and q.dtype == np.int8 and s.shape == (0, 2)
    q, s = lk.per_token_group_quant_int8(np.zeros((3, 0), np.float32), 128)
    assert q.shape == (3, 0) and s.shape == (3, 0)
    out_s = np.zeros((2, 0), np.float32).T  # column-major, no rows
    lk.per_token_group_quant_int8_into(np.zeros((0, 256), np.float16), np.zeros((0, 256), np.int8), out_s, 128,
                                       1e-10, -128.0, 127.0)


# ---------------------------------------------------------------- errors


def test_range_errors(rng):
    """int8_min / int8_max must be int8's own range (-128, 127): vLLM passes
    float(iinfo.min), float(iinfo.max); any other pair raises before any store."""
    x = make_x(rng, (2, 64), 16, np.float32)
    for lo, hi in ((-127.0, 127.0), (-128.0, 128.0), (-448.0, 448.0), (0.0, 127.0), (-128.0, 126.0),
                   (127.0, -128.0), (float("nan"), 127.0), (-128.0, float("inf"))):
        out, sc = np.full((2, 64), 5, np.int8), np.full((2, 4), SENTINEL, np.float32)
        with pytest.raises(ValueError, match=r"int8_min, int8_max: .*only the range of output_q's dtype is "
                                             r"supported: int8 \(-128.0, 127.0\)"):
            lk.per_token_group_quant_int8_into(x, out, sc, 16, 1e-10, lo, hi)
        assert np.all(out == 5) and np.all(sc == SENTINEL)
    for lo, hi in (("-128", 127.0), (None, 127.0), (-128.0, [127])):
        with pytest.raises(TypeError, match="int8_min, int8_max"):
            lk.per_token_group_quant_int8_into(x, np.zeros((2, 64), np.int8), np.zeros((2, 4), np.float32), 16,
                                               1e-10, lo, hi)
    # ints and NumPy numbers of the right values are fine
    out, sc = np.zeros((2, 64), np.int8), np.zeros((2, 4), np.float32)
    lk.per_token_group_quant_int8_into(x, out, sc, 16, np.float32(1e-10), np.int8(-128), np.float64(127))
    assert_ref(x, out, sc, 16)


def test_fp8_raw_op_with_int8_out(rng):
    """per_token_group_fp8_quant takes an int8 output_q too (vLLM's kernel dispatches on it):
    the same codes, fp8_min / fp8_max then -128 / 127 (else ValueError, nothing written)."""
    x = make_x(rng, (3, 256), 32, np.float32)
    rq, rs = lk.per_token_group_quant_int8(x, 32)
    out, sc = np.zeros((3, 256), np.int8), np.zeros((3, 8), np.float32)
    lk.per_token_group_fp8_quant(x, out, sc, 32, 1e-10, -128.0, 127.0)
    np.testing.assert_array_equal(out, rq)
    np.testing.assert_array_equal(sc, rs)
    for lo, hi in ((-448.0, 448.0), (-127.0, 127.0), (0.0, 0.0)):
        out, sc = np.full((3, 256), 5, np.int8), np.full((3, 8), SENTINEL, np.float32)
        with pytest.raises(ValueError, match=r"fp8_min, fp8_max: .*only the range of output_q's dtype is "
                                             r"supported: int8 \(-128.0, 127.0\)"):
            lk.per_token_group_fp8_quant(x, out, sc, 32, 1e-10, lo, hi)
        assert np.all(out == 5) and np.all(sc == SENTINEL)


def test_group_size_errors(rng):
    x = make_x(rng, (4, 256), 16, np.float32)
    for G, status in ((0, "LK_ERR_VALUE"), (-16, "LK_ERR_VALUE"), (5, "LK_ERR_SHAPE"), (512, "LK_ERR_SHAPE"),
                      (3, "LK_ERR_SHAPE")):
        out = np.full(x.shape, 7, np.int8)
        sc = np.full((4, 16), SENTINEL, np.float32)
        with pytest.raises(lk.LlmkernError) as e:
            lk.per_token_group_quant_int8_into(x, out, sc, G, 1e-10, -128.0, 127.0)
        assert e.value.status == status and "group_size: %d" % G in str(e.value)
        assert np.all(out == 7) and np.all(sc == SENTINEL)
        with pytest.raises(lk.LlmkernError) as e:
            lk.per_token_group_quant_int8(x, G)
        assert e.value.status == status and "group_size: %d" % G in str(e.value)
    # a last dim group_size does not divide: refused (no padded last group), the message
    # with the Python function's names
    with pytest.raises(lk.LlmkernError, match=r"group_size: 48 does not divide x's last dim 200 \(x \[4, 200\]\)"):
        lk.per_token_group_quant_int8(np.ones((4, 200), np.float32), 48)
    with pytest.raises(lk.LlmkernError, match=r"group_size: 5 does not divide input's last dim 256"):
        lk.per_token_group_quant_int8_into(x, np.zeros(x.shape, np.int8), np.zeros((4, 51), np.float32), 5,
                                           1e-10, -128.0, 127.0)
    for bad in (16.0, True, None, "16", np.float32(16)):
        with pytest.raises(TypeError, match="group_size"):
            lk.per_token_group_quant_int8(x, bad)
        with pytest.raises(TypeError, match="group_size"):
            lk.per_token_group_quant_int8_into(x, np.zeros(x.shape, np.int8), np.zeros((4, 16), np.float32), bad,
                                               1e-10, -128.0, 127.0)
    q, s = lk.per_token_group_quant_int8(x, np.int64(16))  # NumPy ints are ints
    assert_ref(x, q, s, 16)


def test_argument_errors(rng):
    x = make_x(rng, (4, 256), 16, np.float32)
    q = np.zeros(x.shape, np.int8)
    cases = [
        (dict(output_s=np.zeros((4, 15), np.float32)), "LK_ERR_SHAPE", "output_s: shape [4, 15]"),
        (dict(output_s=np.zeros((16, 4), np.float32)), "LK_ERR_SHAPE", "output_s: shape [16, 4]"),
        (dict(output_s=np.zeros((4, 16), np.float16)), "LK_ERR_DTYPE", "output_s: dtype f16"),
        (dict(output_q=np.zeros((4, 128), np.int8)), "LK_ERR_SHAPE", "output_q"),
        (dict(input=np.zeros((4, 256), np.int32)), "LK_ERR_DTYPE", "input"),
    ]
    for kw, status, text in cases:
        a = dict(input=x, output_q=q, output_s=np.full((4, 16), SENTINEL, np.float32))
        a.update(kw)
        with pytest.raises(lk.LlmkernError) as e:
            lk.per_token_group_quant_int8_into(a["input"], a["output_q"], a["output_s"], 16, 1e-10, -128.0, 127.0)
        assert e.value.status == status and text in str(e.value), str(e.value)
        assert "lk_per_token_group_fp8_quant" in str(e.value)
        assert not q.any()
    # output_q must be int8: fp8 / uint8 / float outputs are per_token_group_fp8_quant's or wrong
    for bad in (np.zeros(x.shape, ml.float8_e4m3fn), np.zeros(x.shape, np.uint8), np.zeros(x.shape, np.float32)):
        sc = np.full((4, 16), SENTINEL, np.float32)
        with pytest.raises(TypeError, match="output_q: dtype .*expected int8"):
            lk.per_token_group_quant_int8_into(x, bad, sc, 16, 1e-10, -128.0, 127.0)
        assert not bad.view(np.uint8).any() and np.all(sc == SENTINEL)
    ro = np.zeros(x.shape, np.int8)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="output_q: the array is read-only"):
        lk.per_token_group_quant_int8_into(x, ro, np.zeros((4, 16), np.float32), 16, 1e-10, -128.0, 127.0)
    # overlapping outputs
    buf = np.zeros(4 * 256 + 64, np.int8)
    with pytest.raises(lk.LlmkernError):
        lk.per_token_group_quant_int8_into(x, buf[:1024].reshape(4, 256), buf[:256].view(np.float32).reshape(4, 16),
                                           16, 1e-10, -128.0, 127.0)
    for dt in (np.float32, np.uint8, "float8_e4m3fn", ml.float8_e4m3fn, "int4"):
        with pytest.raises(NotImplementedError, match="dtype"):
            lk.per_token_group_quant_int8(x, 16, dtype=dt)


# ---------------------------------------------------------------- torch


@pytest.mark.parametrize("layout", ["row", "flat", "col"])
@pytest.mark.parametrize("shape,G", SHAPES)
@pytest.mark.parametrize("xdt", ["float32", "float16", "bfloat16"])
def test_torch(rng, shape, G, xdt, layout):
    torch = torch_or_skip()
    import llmkern.torch  # noqa: F401  (registers torch.ops.llmkern)
    x = torch.from_numpy(make_x(rng, shape, G, np.float32)).to(getattr(torch, xdt))
    q, s = lk.per_token_group_quant_int8(x, G, dtype=torch.int8)
    assert isinstance(q, torch.Tensor) and q.dtype == torch.int8 and q.shape == x.shape and q.is_contiguous()
    assert s.dtype == torch.float32 and tuple(s.shape) == shape[:-1] + (shape[-1] // G,) and s.is_contiguous()
    assert_ref(x, q, s, G)
    # torch's own arithmetic on the same f32 quotients: vLLM's Triton clamp(.).to(int8)
    want = (x.float() / s.repeat_interleave(G, -1)).clamp(-128, 127).to(torch.int8)
    assert torch.equal(q, want)
    # the custom op with vLLM's schema, into the scale layout asked for
    rows, ng = int(np.prod(shape[:-1])), shape[-1] // G
    if layout == "row":
        out_s = torch.full(shape[:-1] + (ng,), SENTINEL)
    elif layout == "flat":
        out_s = torch.full((rows, ng), SENTINEL)
    else:  # vLLM's column-major scales: the transposed view of a [D / G, rows] buffer
        buf = torch.full((ng, rows + 2), SENTINEL)
        out_s = buf[:, :rows].t()
        assert out_s.stride() == (1, rows + 2)
    out_q = torch.full(shape, 99, dtype=torch.int8)
    torch.ops.llmkern.per_token_group_quant_int8(x, out_q, out_s, G, 1e-10, -128.0, 127.0)
    assert torch.equal(out_q, q) and torch.equal(out_s.reshape(s.shape), s)
    if layout == "col":
        assert torch.all(buf[:, rows:] == SENTINEL)


def test_torch_op_call_forms(rng):
    """torch.ops.llmkern.per_token_group_quant_int8 positional and keyword, as vLLM's
    int8_utils calls torch.ops._C.per_token_group_quant_int8; the binding's raw function
    the same; errors raised through the dispatcher with nothing written."""
    torch = torch_or_skip()
    import llmkern.torch  # noqa: F401
    op = torch.ops.llmkern.per_token_group_quant_int8
    T, D, G = 9, 7168, 128
    x = torch.from_numpy(make_x(rng, (T, D), G, np.float32)).to(torch.bfloat16)
    rq, rs = lk.per_token_group_quant_int8(x, G)
    ii = torch.iinfo(torch.int8)
    forms = [
        lambda q, s: op(x, q, s, G, 1e-10, float(ii.min), float(ii.max)),
        lambda q, s: op(input=x, output_q=q, output_s=s, group_size=G, eps=1e-10, int8_min=-128.0,
                        int8_max=127.0),
        lambda q, s: op(x, q, s, G, 1e-10, int8_min=-128.0, int8_max=127.0),
        lambda q, s: op.default(x, q, s, G, 1e-10, -128.0, 127.0),
        lambda q, s: lk.per_token_group_quant_int8_into(x, q, s, G, 1e-10, ii.min, ii.max),
        lambda q, s: lk.per_token_group_quant_int8_into(input=x, output_q=q, output_s=s, group_size=G, eps=1e-10,
                                                        int8_min=-128.0, int8_max=127.0),
    ]
    for f in forms:
        q = torch.zeros(T, D, dtype=torch.int8)
        s = torch.empty_strided((T, D // G), (1, T), dtype=torch.float32)  # column-major
        assert f(q, s) is None
        assert torch.equal(q, rq) and torch.equal(s, rs)
    q, s = torch.full((T, D), 3, dtype=torch.int8), torch.full((T, D // G), SENTINEL)
    with pytest.raises(ValueError, match="int8_min, int8_max"):
        op(x, q, s, G, 1e-10, -127.0, 127.0)
    with pytest.raises(lk.LlmkernError, match="group_size: 3"):
        op(x, q, s, 3, 1e-10, -128.0, 127.0)
    with pytest.raises(lk.LlmkernError, match="eps: 0"):
        op(x, q, s, G, 0.0, -128.0, 127.0)
    with pytest.raises(TypeError, match="output_q"):
        op(x, torch.zeros(T, D, dtype=torch.float8_e4m3fn), s, G, 1e-10, -128.0, 127.0)
    assert torch.all(q == 3) and torch.all(s == SENTINEL)
    with pytest.raises(NotImplementedError, match="dtype"):
        lk.per_token_group_quant_int8(x, G, dtype=torch.uint8)


def test_torch_compile_fullgraph(rng):
    torch = torch_or_skip()
    import llmkern.torch  # noqa: F401
    T, D, G = 6, 256, 64

    def f(x):
        q = torch.empty(x.shape, dtype=torch.int8)
        s = torch.empty(x.shape[-1] // G, x.shape[0]).t()
        torch.ops.llmkern.per_token_group_quant_int8(x, q, s, G, 1e-10, -128.0, 127.0)
        return q.float() * s.repeat_interleave(G, -1)  # dequantized

    x = torch.from_numpy(make_x(rng, (T, D), G, np.float32))
    want = f(x)
    got = torch.compile(f, fullgraph=True)(x)
    assert torch.equal(got, want)
    q, s = lk.per_token_group_quant_int8(x, G)
    assert torch.equal(want, q.float() * s.repeat_interleave(G, -1))
