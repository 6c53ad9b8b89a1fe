"""fp8 activations with vLLM's signatures: scaled_fp8_quant (static, dynamic per tensor,
dynamic per token with scale_ub, num_token_padding, output given), the raw custom ops
(static_ / dynamic_ / dynamic_per_token_scaled_fp8_quant), rms_norm_static_fp8_quant,
fused_add_rms_norm_static_fp8_quant, rms_norm_dynamic_per_token_quant (fp8 and int8 outs) and
merge_attn_states(..., output_scale). NumPy (ml_dtypes float8 arrays, uint8 buffers) and
torch (float8_e4m3fn / float8_e5m2) against ml_dtypes' / torch's own conversion of
f32(y) / f32(scale) (bitwise within the finite range) and float64; bad scales."""
import numpy as np
import pytest

import llmkern as lk
from helpers import torch_or_skip

ml = pytest.importorskip("ml_dtypes")
E4, E5 = ml.float8_e4m3fn, ml.float8_e5m2
FMAX = {E4: 448.0, E5: 57344.0}


def codes(y, dt):
    """uint8 codes of fp8(y) for f32 y inside the finite range (clipped: saturation)."""
    m = np.float32(FMAX[dt])
    return np.clip(np.asarray(y, np.float32), -m, m).astype(dt).view(np.uint8)


def dyn_scale(absmax, dt):
    s = np.float32(absmax) / np.float32(FMAX[dt])
    return max(s, np.float32(1.0) / np.float32(FMAX[dt] * 512.0))


@pytest.mark.parametrize("dt", [E4, E5])
@pytest.mark.parametrize("xdt", [np.float32, np.float16])
def test_static_dynamic_numpy(rng, dt, xdt):
    x = (rng.standard_normal((7, 130)) * 3).astype(xdt)
    xf = x.astype(np.float32)
    out = np.empty(x.shape, dt)
    lk.static_scaled_fp8_quant(out, x, np.array([0.02], np.float32))
    np.testing.assert_array_equal(out.view(np.uint8), codes(xf / np.float32(0.02), dt))
    sc = np.zeros(1, np.float32)
    lk.dynamic_scaled_fp8_quant(out, x, sc)
    assert sc[0] == dyn_scale(np.abs(xf).max(), dt)
    np.testing.assert_array_equal(out.view(np.uint8), codes(xf / sc[0], dt))
    # float64: dequantized within half an fp8 step (relative 2^-4 e4m3, 2^-3 e5m2)
    deq = out.astype(np.float64) * sc[0]
    rel = 2.0 ** -4 if dt is E4 else 2.0 ** -3
    small = np.abs(x.astype(np.float64)) < sc[0] * (2.0 ** -6 if dt is E4 else 2.0 ** -14)
    assert np.all((np.abs(deq - xf) <= rel * np.abs(xf) * 1.0001) | small)


@pytest.mark.parametrize("dt", [E4, E5])
def test_per_token_scale_ub_numpy(rng, dt):
    x = (rng.standard_normal((5, 64)) * 4).astype(np.float32)
    x[2] = 0
    out = np.empty(x.shape, dt)
    sc = np.empty((5, 1), np.float32)
    lk.dynamic_per_token_scaled_fp8_quant(out, x, sc, np.array([3.0], np.float32))
    for r in range(5):
        want = dyn_scale(min(np.abs(x[r]).max(), 3.0), dt)
        assert sc[r, 0] == want
        np.testing.assert_array_equal(out[r].view(np.uint8), codes(x[r] / want, dt))


def test_scaled_fp8_quant_wrapper_numpy(rng):
    x = (rng.standard_normal((6, 40)) * 2).astype(np.float32)
    q, s = lk.scaled_fp8_quant(x)
    assert q.dtype == E4 and s.shape == (1,) and s[0] == dyn_scale(np.abs(x).max(), E4)
    q, s = lk.scaled_fp8_quant(x, use_per_token_if_dynamic=True)
    assert s.shape == (6, 1)
    q, s2 = lk.scaled_fp8_quant(x, np.array([0.01], np.float32), num_token_padding=10)
    assert q.shape == (10, 40)
    np.testing.assert_array_equal(q[:6].view(np.uint8), codes(x / np.float32(0.01), E4))
    out = np.zeros((6, 40), np.uint8)  # a uint8 buffer: e4m3
    q, _ = lk.scaled_fp8_quant(x, 0.5, output=out)
    assert q is out
    np.testing.assert_array_equal(out, codes(x / np.float32(0.5), E4))


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_scales(rng, bad):
    x = rng.standard_normal((3, 16)).astype(np.float32)
    out = np.full(x.shape, 7, np.uint8)
    with pytest.raises(lk.LlmkernError, match="scale"):
        lk.static_scaled_fp8_quant(out, x, np.array([bad], np.float32))
    with pytest.raises(lk.LlmkernError, match="scale_ub"):
        lk.dynamic_per_token_scaled_fp8_quant(out, x, np.empty(3, np.float32), np.array([bad], np.float32))
    with pytest.raises(lk.LlmkernError, match="scale"):
        lk.rms_norm_static_fp8_quant(out, x, None, bad, 1e-6)
    assert np.all(out == 7)


def ref_norm(x, w, eps):
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w.astype(np.float64)


@pytest.mark.parametrize("dt", [E4, E5])
def test_rms_norm_quant_numpy(rng, dt):
    T, D, eps, s = 5, 96, 1e-6, np.float32(0.01)
    x = rng.standard_normal((T, D)).astype(np.float32)
    w = (1 + 0.2 * rng.standard_normal(D)).astype(np.float32)
    res = rng.standard_normal((T, D)).astype(np.float32)
    out = np.empty((T, D), dt)
    lk.rms_norm_static_fp8_quant(out, x, w, s, eps)
    y = ref_norm(x, w, eps) / s
    step = 2.0 ** -3 if dt is E4 else 2.0 ** -2
    assert np.all(np.abs(out.astype(np.float64) - y) <= np.abs(y) * step * 0.5 * 1.001 + 2 ** -9)
    res0 = res.copy()
    lk.fused_add_rms_norm_static_fp8_quant(out, x, res, w, s, eps)
    np.testing.assert_array_equal(res, x + res0)  # residual = input + residual; input unchanged
    y = ref_norm(res, w, eps) / s
    assert np.all(np.abs(out.astype(np.float64) - y) <= np.abs(y) * step * 0.5 * 1.001 + 2 ** -9)
    res = res0.copy()
    q, sc = lk.rms_norm_dynamic_per_token_quant(x, w, eps, dt, scale_ub=None, residual=res)
    assert q.dtype == dt and sc.shape == (T, 1)
    y = ref_norm(x + res0, w, eps)
    want = np.maximum(np.abs(y).max(-1) / FMAX[dt], 1 / (FMAX[dt] * 512))
    np.testing.assert_allclose(sc[:, 0], want, rtol=1e-5)
    with pytest.raises(NotImplementedError):
        lk.rms_norm_dynamic_per_token_quant(x, w, eps, np.int16)


def i8_ref(y32, sc):
    """vLLM's int8 codes of f32 y under per-row f32 scales: y * (1 / scale) in f32, round
    half to even, saturated to [-128, 127]."""
    rs = (np.float32(1) / sc.astype(np.float32)).astype(np.float32)
    return np.clip(np.rint((y32 * rs).astype(np.float32)), -128, 127).astype(np.int8)


@pytest.mark.parametrize("xdt", [np.float32, np.float16])
@pytest.mark.parametrize("residual", [False, True])
def test_rms_norm_dynamic_per_token_int8_numpy(rng, xdt, residual):
    T, D, eps = 6, 100, 1e-6
    x = (rng.standard_normal((T, D)) * 2).astype(xdt)
    w = (1 + 0.2 * rng.standard_normal(D)).astype(xdt)
    res = rng.standard_normal((T, D)).astype(xdt) if residual else None
    res0 = None if res is None else res.copy()
    q, sc = lk.rms_norm_dynamic_per_token_quant(x, w, eps, np.int8, residual=res)
    assert q.dtype == np.int8 and q.shape == (T, D) and sc.shape == (T, 1)
    v = x.astype(np.float64) if res is None else (x.astype(np.float32) + res0.astype(np.float32)).astype(xdt)
    if res is not None:
        np.testing.assert_array_equal(res, v)  # residual = round(input + residual)
    y = ref_norm(np.asarray(v, np.float64), w, eps)
    want = np.maximum(np.abs(y).max(-1) / 127.0, np.finfo(np.float32).eps)
    np.testing.assert_allclose(sc[:, 0], want, rtol=1e-5)
    # within half a step (plus f32 slack) of the float64 value / scale; |q| reaches 127
    yq = y / sc.astype(np.float64)
    assert np.all(np.abs(q.astype(np.float64) - yq) <= 0.5 + 1e-4 * np.abs(yq))
    assert np.all(np.abs(q).max(-1) == 127)
    # the raw op into a given int8 buffer ([rows] scales), the same bits
    out, sc1 = np.full((T, D), 99, np.int8), np.zeros(T, np.float32)
    if res is not None:
        res[...] = res0
    lk.ops.rms_norm_dynamic_per_token_quant_into(out, x, w, sc1, eps, residual=res)
    np.testing.assert_array_equal(out, q)
    np.testing.assert_array_equal(sc1, sc[:, 0])


def test_rms_norm_int8_rounding_numpy():
    # weightless rows: y = x * inv with inv ~ 1; the codes equal vLLM's f32 formula
    # y * (1 / scale) rounded half to even, from the returned scales
    x = np.tile(np.array([1.0, -1.0, 0.5, 0.25, -0.125, 0.75, 1e-3, -0.999], np.float32), (3, 5))
    x[1] *= 3
    x[2, 0] = 0
    q, sc = lk.rms_norm_dynamic_per_token_quant(x, None, 1e-6, "int8")
    y = ref_norm(x.astype(np.float64), np.ones(x.shape[1]), 1e-6).astype(np.float32)
    assert np.all(np.abs(q.astype(np.int32) - i8_ref(y, sc).astype(np.int32)) <= 1)
    assert q[0, 0] == 127 and q[0, 1] == -127


def test_rms_norm_int8_errors(rng):
    x = rng.standard_normal((3, 16)).astype(np.float32)
    out, sc = np.zeros((3, 16), np.int8), np.zeros((3, 1), np.float32)
    with pytest.raises(lk.LlmkernError) as e:  # only the per-token norm takes an int8 out
        lk.static_scaled_fp8_quant(out, x, 0.5)
    assert e.value.status == "LK_ERR_DTYPE" and "out" in str(e.value)
    with pytest.raises(lk.LlmkernError) as e:
        lk.ops.rms_norm_dynamic_per_token_quant_into(out, x, None, np.zeros((4, 1), np.float32), 1e-6)
    assert e.value.status == "LK_ERR_SHAPE" and "scale" in str(e.value)
    assert not out.any()


def test_torch(rng):
    torch = torch_or_skip()
    x = torch.from_numpy((rng.standard_normal((4, 80)) * 3).astype(np.float32)).to(torch.bfloat16)
    q, s = lk.scaled_fp8_quant(x)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32
    want = (x.float() / s).clamp(-448, 448).to(torch.float8_e4m3fn)
    assert torch.equal(q.view(torch.uint8), want.view(torch.uint8))
    q, s = lk.scaled_fp8_quant(x, use_per_token_if_dynamic=True, scale_ub=torch.tensor([2.0]))
    m = x.float().abs().amax(-1, keepdim=True).clamp(max=2.0) / 448
    assert torch.equal(s, torch.maximum(m, torch.tensor(1 / (448 * 512.0))))
    out = torch.empty(4, 80, dtype=torch.float8_e5m2)
    lk.static_scaled_fp8_quant(out, x, torch.tensor([0.5]))
    want = (x.float() / 0.5).to(torch.float8_e5m2)
    assert torch.equal(out.view(torch.uint8), want.view(torch.uint8))
    w = torch.ones(80, dtype=torch.bfloat16)
    res = torch.randn(4, 80).to(torch.bfloat16)
    res0 = res.clone()
    out = torch.empty(4, 80, dtype=torch.float8_e4m3fn)
    lk.fused_add_rms_norm_static_fp8_quant(out, x, res, w, torch.tensor([0.02]), 1e-6)
    assert torch.equal(res, x + res0)
    q, sc = lk.rms_norm_dynamic_per_token_quant(x, w, 1e-6, torch.float8_e4m3fn)
    assert q.dtype == torch.float8_e4m3fn and sc.shape == (4, 1)
    q8, sc8 = lk.rms_norm_dynamic_per_token_quant(x, w, 1e-6, torch.int8)
    assert q8.dtype == torch.int8 and sc8.shape == (4, 1)
    y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
    torch.testing.assert_close(sc8, torch.clamp(y.abs().amax(-1, keepdim=True) / 127, min=2.0 ** -23), rtol=1e-5,
                               atol=0)
    assert (q8.int() - torch.round(y / sc8).clamp(-128, 127).int()).abs().max() <= 1


@pytest.mark.parametrize("tokens_with_context", [None, 3])
def test_merge_output_scale(rng, tokens_with_context):
    torch = torch_or_skip()
    T, H, D = 5, 4, 32
    pa = torch.randn(T, H, D)
    pb = torch.randn(T, H, D)
    la = torch.randn(H, T)
    lb = torch.randn(H, T)
    out = torch.empty(T, H, D, dtype=torch.float8_e4m3fn)
    scale = torch.tensor([0.01])
    lk.merge_attn_states(out, pa, la, pb, lb, prefill_tokens_with_context=tokens_with_context, output_scale=scale)
    ref = torch.empty(T, H, D)
    lk.merge_attn_states(ref, pa, la, pb, lb, prefill_tokens_with_context=tokens_with_context)
    want = (ref / 0.01).clamp(-448, 448).to(torch.float8_e4m3fn)
    # the same f32 merge quantized: equal codes except where the float out's own rounding
    # of the merged value sits exactly at an fp8 tie (not in this data)
    assert torch.equal(out.view(torch.uint8), want.view(torch.uint8))
    with pytest.raises(lk.LlmkernError, match="output_scale"):
        lk.merge_attn_states(out, pa, la, pb, lb, output_scale=torch.tensor([0.0]))
