"""int8 activations with vLLM's signatures: scaled_int8_quant (static / dynamic per token,
symmetric / asymmetric) and the raw custom ops static_scaled_int8_quant /
dynamic_scaled_int8_quant, on NumPy arrays and torch tensors. Two references:
- vLLM's CUDA arithmetic redone in NumPy (the f32 operations of the kernels, rounding half
  to even, the int32 stage of the zero point): codes, scales and zero points bit for bit;
- float64: every code within half a step (plus the f32 division / product's 1e-6) of
  clamp(x / scale + azp), the dynamic scales and zero points within f32 rounding of the
  float64 formulas, a row's min and max at the ends of [-128, 127].
Also special values, strided inputs, empty inputs and the errors (nothing written)."""
import numpy as np
import pytest

import llmkern as lk
from helpers import torch_or_skip

F32 = np.float32


def _sat32(v):
    """vLLM's float_to_int32_rn on f32 v: rn (half to even), saturated, NaN -> 0; int64"""
    v = np.asarray(v, F32)
    r = np.rint(np.where(np.isnan(v), F32(0), v)).astype(np.float64)
    return np.clip(r, -2.0 ** 31, 2.0 ** 31 - 1).astype(np.int64)


@np.errstate(invalid="ignore")  # inf * 0 in an inf row: NaN, coded 0
def vllm_int8(x, scale=None, azp=None, symmetric=True):
    """(codes int8, scale, azp) of vLLM's kernels over f32 x [..., D] (numpy, f32 ops)."""
    x = np.asarray(x, F32)
    if scale is not None:
        s = F32(np.asarray(scale, F32).reshape(-1)[0])
        if azp is None:
            return np.clip(_sat32(x / s), -128, 127).astype(np.int8), scale, None
        z = int(np.asarray(azp).reshape(-1)[0])
        return np.clip(_sat32(x * (F32(1) / s)) + z, -128, 127).astype(np.int8), scale, azp
    rows = x.reshape(-1, x.shape[-1])
    q = np.empty(rows.shape, np.int8)
    sc = np.zeros((rows.shape[0], 1), F32)
    zp = np.zeros((rows.shape[0], 1), np.int32)
    for r, row in enumerate(rows):
        v = row[~np.isnan(row)]
        if symmetric:
            m = F32(np.abs(v).max()) if v.size else F32(0)
            sc[r] = m / F32(127)
            f = F32(0) if m == 0 else F32(127) / m
            q[r] = np.clip(_sat32(row * f), -128, 127)
            continue
        mn, mx = (F32(v.min()), F32(v.max())) if v.size else (F32(0), F32(0))
        s = (mx - mn) / F32(255)
        if s == 0:
            q[r] = 0
            continue
        sc[r] = s
        zp[r] = _sat32(F32(-128) - mn / s)
        q[r] = np.clip(_sat32(row * (F32(1) / s)) + int(zp[r, 0]), -128, 127)
    return q.reshape(x.shape), sc, (None if symmetric else zp)


def check_f64(x, q, scale, azp):
    """float64: q within half a step (+ 1e-6 |x / scale|) of clamp(x / scale + azp); NaN -> azp."""
    x = np.asarray(x, np.float64).reshape(-1, np.shape(x)[-1])
    q = np.asarray(q, np.float64).reshape(x.shape)
    s = np.broadcast_to(np.asarray(scale, np.float64).reshape(-1, 1), (x.shape[0], 1))
    z = np.zeros_like(s) if azp is None else np.broadcast_to(np.asarray(azp, np.float64).reshape(-1, 1), s.shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(s == 0, 0.0, x / s)
    want = np.clip(np.where(np.isnan(y), z, y + z), -128, 127)
    slack = np.where(np.isnan(y), 0.0, 0.5 + 1e-6 * np.abs(y) + 1e-9)
    assert np.all(np.abs(q - want) <= slack)


@pytest.mark.parametrize("xdt", [np.float32, np.float16])
@pytest.mark.parametrize("azp", [None, 7, -100])
def test_static_numpy(rng, xdt, azp):
    x = (rng.standard_normal((5, 3, 133)) * 2).astype(xdt)
    x[0, 0, :4] = [0.125, 0.375, -0.125, 1e4]  # ties at x / 0.25: 0.5 -> 0, 1.5 -> 2, -0.5 -> 0; saturation
    scale = np.array([0.25], F32)
    q, s, z = lk.scaled_int8_quant(x, scale, None if azp is None else np.array([azp], np.int32),
                                   symmetric=azp is None)
    assert q.dtype == np.int8 and q.shape == x.shape and s is scale and (z is None) == (azp is None)
    want, _, _ = vllm_int8(x, scale, z)
    np.testing.assert_array_equal(q, want)
    check_f64(x, q, scale, azp)
    if azp is None:
        assert list(q[0, 0, :4]) == [0, 2, 0, 127]


@pytest.mark.parametrize("xdt", [np.float32, np.float16])
@pytest.mark.parametrize("symmetric", [True, False])
def test_dynamic_numpy(rng, xdt, symmetric):
    x = (rng.standard_normal((2, 7, 301)) * 3).astype(xdt)
    x[0, 1] += 6  # off-centre rows: zero points far from 0
    x[1, 2] = 0  # an all-zero row
    x[1, 3] = 1.5  # a constant row
    q, sc, zp = lk.scaled_int8_quant(x, symmetric=symmetric)
    assert q.dtype == np.int8 and sc.shape == (14, 1) and sc.dtype == F32
    assert (zp is None) == symmetric and (symmetric or (zp.shape == (14, 1) and zp.dtype == np.int32))
    wq, ws, wz = vllm_int8(x, symmetric=symmetric)
    np.testing.assert_array_equal(q, wq)
    np.testing.assert_array_equal(sc, ws)
    if not symmetric:
        np.testing.assert_array_equal(zp, wz)
    # float64 formulas and codes
    rows = x.reshape(14, 301).astype(np.float64)
    if symmetric:
        np.testing.assert_allclose(sc[:, 0], np.abs(rows).max(-1) / 127, rtol=2e-7)
        assert np.all(np.abs(q.reshape(14, 301)).max(-1)[np.abs(rows).max(-1) > 0] == 127)
    else:
        s64 = (rows.max(-1) - rows.min(-1)) / 255
        np.testing.assert_allclose(sc[:, 0], s64, rtol=4e-7)
        live = s64 > 0
        assert np.all(np.abs(zp[live, 0] - (-128 - rows.min(-1)[live] / s64[live])) <= 0.5 + 1e-4)
        assert np.all(q.reshape(14, 301).min(-1)[live] <= -127) and np.all(q.reshape(14, 301).max(-1)[live] >= 126)
    check_f64(x, q, sc, zp)
    r = 7 + 2  # the all-zero row: scale 0 (azp 0), codes 0; the constant row likewise when asymmetric
    assert sc[r, 0] == 0 and not q.reshape(14, 301)[r].any()
    if not symmetric:
        assert sc[r + 1, 0] == 0 and zp[r, 0] == 0 and zp[r + 1, 0] == 0 and not q.reshape(14, 301)[r + 1].any()


@pytest.mark.parametrize("symmetric", [True, False])
def test_specials_numpy(rng, symmetric):
    x = rng.standard_normal((4, 40)).astype(F32)
    x[0, 3] = np.nan  # ignored by absmax / min / max, coded 0 (azp)
    x[1, :] = np.nan  # no value: scale 0 (azp 0), codes 0
    x[2, 7] = np.inf  # scale inf: codes 0 (symmetric) / azp = -128
    q, sc, zp = lk.scaled_int8_quant(x, symmetric=symmetric)
    wq, ws, wz = vllm_int8(x, symmetric=symmetric)
    np.testing.assert_array_equal(q, wq)
    np.testing.assert_array_equal(sc, ws)
    assert q[0, 3] == (0 if symmetric else zp[0, 0]) and sc[1, 0] == 0 and not q[1].any() and np.isinf(sc[2, 0])
    assert np.all(q[2] == (0 if symmetric else -128))
    qs, _, _ = lk.scaled_int8_quant(x, np.array([0.5], F32))  # static: NaN -> 0, +-inf saturate
    assert qs[0, 3] == 0 and qs[2, 7] == 127 and not qs[1].any()


def test_static_int32_stage():
    # the zero point is added to round(x / scale) saturated to int32, the sum saturated
    x = np.array([[2147483520.0, 2.0 ** 31, 3e9, -1e10, np.nan, 0.0, -2.0 ** 31, 1e30]], F32)
    q, _, _ = lk.scaled_int8_quant(x, np.array([1.0], F32), np.array([-2147483600], np.int32), symmetric=False)
    assert list(q[0]) == [-80, 47, 47, -128, -128, -128, -128, 47]
    q, _, _ = lk.scaled_int8_quant(x, 1.0, 2 ** 31 - 1, symmetric=False)  # numbers: one-element arrays
    assert list(q[0]) == [127, 127, 127, -1, 127, 127, -1, 127]


def test_raw_ops_strided(rng):
    base = (rng.standard_normal((6, 2, 100)) * 2).astype(F32)
    x = base[::2, 1, 3:90]  # strided rows and columns
    out = np.full((3, 87), 55, np.int8)
    lk.static_scaled_int8_quant(out, x, np.array([0.03], F32))
    np.testing.assert_array_equal(out, vllm_int8(x, np.array([0.03], F32))[0])
    sc, zp = np.zeros(3, F32), np.zeros(3, np.int32)  # [rows] forms
    lk.dynamic_scaled_int8_quant(out, x, sc, zp)
    wq, ws, wz = vllm_int8(x, symmetric=False)
    np.testing.assert_array_equal(out, wq)
    np.testing.assert_array_equal(sc, ws[:, 0])
    np.testing.assert_array_equal(zp, wz[:, 0])
    big = np.zeros((3, 200), np.int8)  # a strided out
    lk.dynamic_scaled_int8_quant(big[:, ::2][:, :87], x, sc)
    np.testing.assert_array_equal(big[:, ::2][:, :87], vllm_int8(x)[0])
    assert not big[:, 1::2].any()


def test_empty():
    q, sc, zp = lk.scaled_int8_quant(np.zeros((0, 16), F32), symmetric=False)
    assert q.shape == (0, 16) and sc.shape == (0, 1) and zp.shape == (0, 1)
    q, sc, zp = lk.scaled_int8_quant(np.zeros((3, 0), F32), symmetric=False)
    assert q.shape == (3, 0) and not sc.any() and not zp.any()


def test_errors(rng):
    x = rng.standard_normal((3, 16)).astype(F32)
    with pytest.raises(ValueError, match="azp"):
        lk.scaled_int8_quant(x, np.array([0.5], F32), symmetric=False)
    with pytest.raises(ValueError, match="azp"):
        lk.scaled_int8_quant(x, np.array([0.5], F32), np.array([3], np.int32))
    out = np.full((3, 16), 9, np.int8)
    for bad in (0.0, -1.0, np.nan, np.inf):
        with pytest.raises(lk.LlmkernError) as e:
            lk.static_scaled_int8_quant(out, x, np.array([bad], F32))
        assert e.value.status == "LK_ERR_VALUE" and "scale" in str(e.value)
    with pytest.raises(lk.LlmkernError) as e:
        lk.static_scaled_int8_quant(out, x, 0.5, np.array([1.0], F32))
    assert e.value.status == "LK_ERR_DTYPE" and "azp" in str(e.value)
    sc, zp = np.full((3, 1), 7, F32), np.full((4, 1), 7, np.int32)
    with pytest.raises(lk.LlmkernError) as e:
        lk.dynamic_scaled_int8_quant(out, x, sc, zp)
    assert e.value.status == "LK_ERR_SHAPE" and "azp" in str(e.value)
    with pytest.raises(lk.LlmkernError) as e:
        lk.static_scaled_int8_quant(np.zeros((3, 16), np.float32), x, 0.5)
    assert e.value.status == "LK_ERR_DTYPE" and "out" in str(e.value)
    assert np.all(out == 9) and np.all(sc == 7) and np.all(zp == 7)


def test_torch(rng):
    torch = torch_or_skip()
    x = torch.from_numpy((rng.standard_normal((3, 5, 96)) * 3).astype(F32)).to(torch.bfloat16)
    xf = x.float().numpy()
    for symmetric in (True, False):
        q, sc, zp = lk.scaled_int8_quant(x, symmetric=symmetric)
        assert q.dtype == torch.int8 and q.shape == x.shape and sc.dtype == torch.float32 and sc.shape == (15, 1)
        wq, ws, wz = vllm_int8(xf, symmetric=symmetric)
        np.testing.assert_array_equal(q.numpy(), wq)
        np.testing.assert_array_equal(sc.numpy(), ws)
        if symmetric:
            assert zp is None
        else:
            assert zp.dtype == torch.int32 and zp.shape == (15, 1)
            np.testing.assert_array_equal(zp.numpy(), wz)
        check_f64(xf, q.numpy(), sc.numpy(), None if zp is None else zp.numpy())
    s, z = torch.tensor([0.04]), torch.tensor([-5], dtype=torch.int32)
    q, s2, z2 = lk.scaled_int8_quant(x, s, z, symmetric=False)
    assert s2 is s and z2 is z
    np.testing.assert_array_equal(q.numpy(), vllm_int8(xf, s.numpy(), z.numpy())[0])
    # the torch custom ops (vLLM's _C schemas)
    import llmkern.torch  # noqa: F401
    out, scs, azs = torch.empty(3, 5, 96, dtype=torch.int8), torch.empty(15, 1), torch.empty(15, 1, dtype=torch.int32)
    torch.ops.llmkern.dynamic_scaled_int8_quant(out, x, scs, azs)
    wq, ws, wz = vllm_int8(xf, symmetric=False)
    np.testing.assert_array_equal(out.numpy(), wq)
    np.testing.assert_array_equal(azs.numpy(), wz)
    torch.ops.llmkern.static_scaled_int8_quant(out, x, s, None)
    np.testing.assert_array_equal(out.numpy(), vllm_int8(xf, s.numpy())[0])
