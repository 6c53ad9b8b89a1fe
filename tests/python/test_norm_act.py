"""rms_norm, fused_add_rms_norm (and the Gemma forms), silu_and_mul, gelu_tanh_and_mul
against float64 NumPy references: every NumPy dtype and mixed dtypes, strided views,
in-place, bf16 through torch, C errors surfacing as LlmkernError."""
import math

import numpy as np
import pytest

import llmkern as lk
from helpers import NP_DTYPES, close, f64, rand, torch_or_skip

EPS = 1e-6


def ref_rms(x, w, eps, gemma):
    x = f64(x)
    w = f64(w)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * ((1.0 + w) if gemma else w)


def ref_silu_mul(x):
    x = f64(x)
    d = x.shape[-1] // 2
    g = x[..., :d]
    return g / (1.0 + np.exp(-g)) * x[..., d:]


def ref_gelu_mul(x):
    x = f64(x)
    d = x.shape[-1] // 2
    g = x[..., :d]
    u = math.sqrt(2.0 / math.pi) * (g + 0.044715 * g ** 3)
    return 0.5 * g * (1.0 + np.tanh(u)) * x[..., d:]


@pytest.mark.parametrize("gemma", [False, True])
@pytest.mark.parametrize("xdt", NP_DTYPES)
@pytest.mark.parametrize("wdt", NP_DTYPES)
def test_rms_norm(rng, gemma, xdt, wdt):
    x = rand(rng, (7, 33), xdt)
    w = rand(rng, (33,), wdt)
    out = np.full((7, 33), np.nan, xdt)
    fn = lk.gemma_rms_norm if gemma else lk.rms_norm
    assert fn(out, x, w, EPS) is None
    close(out, ref_rms(x, w, EPS, gemma))


def test_rms_norm_strided_and_in_place(rng):
    # rows of a wider buffer, a transposed (column-strided) input, and out = input
    buf = rand(rng, (5, 100), np.float32)
    x = buf[:, 10:74]
    w = rand(rng, (64,), np.float32)
    out_buf = np.full((5, 200), 7.0, np.float32)
    out = out_buf[:, ::2][:, :64]
    lk.rms_norm(out, x, w, EPS)
    close(out, ref_rms(x, w, EPS, False))
    assert np.all(out_buf[:, 1::2] == 7.0) and np.all(out_buf[:, 128:] == 7.0)

    xt = rand(rng, (64, 6), np.float16).T  # element strides (1, 6)
    o2 = np.empty((6, 64), np.float16)
    lk.rms_norm(o2, xt, w, EPS)
    close(o2, ref_rms(xt, w, EPS, False))

    y = rand(rng, (3, 2, 64), np.float32)
    want = ref_rms(y, w, EPS, False)
    lk.rms_norm(y, y, w, EPS)
    close(y, want)


def test_rms_norm_writes_the_given_buffer(rng):
    x = rand(rng, (4, 16), np.float32)
    w = rand(rng, (16,), np.float32)
    out = np.zeros((4, 16), np.float32)
    before = out.__array_interface__["data"][0]
    lk.rms_norm(out, x, w, EPS)
    assert out.__array_interface__["data"][0] == before
    assert np.all(out != 0)
    close(out, ref_rms(x, w, EPS, False))


def test_rms_norm_errors(rng):
    x = rand(rng, (4, 64), np.float32)
    out = np.full((4, 64), 3.0, np.float32)
    with pytest.raises(lk.LlmkernError) as e:
        lk.rms_norm(out, x, np.ones(63, np.float32), EPS)
    assert e.value.status == "LK_ERR_SHAPE"
    assert "lk_rms_norm" in str(e.value) and "weight: shape [63] does not match last dim of input (64)" in str(e.value)
    assert isinstance(e.value, RuntimeError)
    assert np.all(out == 3.0)  # nothing written
    with pytest.raises(lk.LlmkernError) as e:
        lk.rms_norm(out, x, np.ones(64, np.float32), -1.0)
    assert e.value.status == "LK_ERR_VALUE" and "eps" in str(e.value)
    with pytest.raises(lk.LlmkernError) as e:  # out overlapping x (not identical)
        buf = np.zeros((4, 65), np.float32)
        lk.rms_norm(buf[:, 1:], buf[:, :64], np.ones(64, np.float32), EPS)
    assert e.value.status == "LK_ERR_ALIAS"


@pytest.mark.parametrize("gemma", [False, True])
@pytest.mark.parametrize("dt", NP_DTYPES)
def test_fused_add_rms_norm(rng, gemma, dt):
    x = rand(rng, (5, 48), dt)
    res = rand(rng, (5, 48), dt)
    w = rand(rng, (48,), np.float32)
    xi, ri = x.__array_interface__["data"][0], res.__array_interface__["data"][0]
    new_res = (f64(x) + f64(res)).astype(dt)  # residual is rounded to its dtype first
    want = ref_rms(new_res, w, EPS, gemma)
    fn = lk.gemma_fused_add_rms_norm if gemma else lk.fused_add_rms_norm
    fn(x, res, w, EPS)
    assert np.array_equal(res, new_res)
    close(x, want)
    assert x.__array_interface__["data"][0] == xi and res.__array_interface__["data"][0] == ri


def test_fused_add_rms_norm_strided(rng):
    buf = rand(rng, (6, 2, 32), np.float32)
    x, res = buf[:, 0], buf[:, 1]  # interleaved rows of one buffer
    w = rand(rng, (32,), np.float32)
    new_res = f64(x) + f64(res)
    want = ref_rms(new_res, w, EPS, False)
    lk.fused_add_rms_norm(x, res, w, EPS)
    close(buf[:, 1], new_res)
    close(buf[:, 0], want)


def test_fused_add_rms_norm_error(rng):
    x = rand(rng, (2, 8), np.float32)
    with pytest.raises(lk.LlmkernError) as e:
        lk.fused_add_rms_norm(x, rand(rng, (3, 8), np.float32), np.ones(8, np.float32), EPS)
    assert "lk_fused_add_rms_norm" in str(e.value) and "residual" in str(e.value)


@pytest.mark.parametrize("act", ["silu", "gelu"])
@pytest.mark.parametrize("xdt", NP_DTYPES)
@pytest.mark.parametrize("odt", NP_DTYPES)
def test_act_and_mul(rng, act, xdt, odt):
    x = rand(rng, (3, 5, 2 * 37), xdt, 3.0)
    out = np.empty((3, 5, 37), odt)
    fn, ref = (lk.silu_and_mul, ref_silu_mul) if act == "silu" else (lk.gelu_tanh_and_mul, ref_gelu_mul)
    fn(out, x)
    close(out, ref(x))


def test_act_strided_and_errors(rng):
    x = rand(rng, (16, 40), np.float32)[::2]  # every other row
    out_buf = np.zeros((8, 50), np.float32)
    out = out_buf[:, 5:25]
    lk.silu_and_mul(out, x)
    close(out, ref_silu_mul(x))
    assert np.all(out_buf[:, :5] == 0) and np.all(out_buf[:, 25:] == 0)
    with pytest.raises(lk.LlmkernError) as e:
        lk.silu_and_mul(np.empty((8, 21), np.float32), x)
    assert e.value.status == "LK_ERR_SHAPE" and "lk_silu_and_mul" in str(e.value)
    with pytest.raises(lk.LlmkernError) as e:
        lk.gelu_tanh_and_mul(np.empty((8, 10), np.float32), rand(rng, (8, 21), np.float32))
    assert e.value.status == "LK_ERR_SHAPE" and "lk_gelu_tanh_and_mul" in str(e.value)


@pytest.mark.parametrize("dt", ["float32", "float16", "bfloat16"])
def test_torch_norm_act(rng, dt):
    torch = torch_or_skip()
    tdt = getattr(torch, dt)
    x = torch.from_numpy(rand(rng, (6, 64), np.float32)).to(tdt)
    w = torch.from_numpy(rand(rng, (64,), np.float32)).to(tdt)
    out = torch.empty_like(x)
    lk.rms_norm(out, x, w, EPS)
    close(out, ref_rms(x, w, EPS, False))
    lk.gemma_rms_norm(out, x, w, EPS)
    close(out, ref_rms(x, w, EPS, True))
    # fused, in place, on a non-contiguous slice
    buf = torch.from_numpy(rand(rng, (6, 2, 64), np.float32)).to(tdt)
    xs, rs = buf[:, 0], buf[:, 1]
    new_res = (xs.float() + rs.float()).to(tdt)
    want = ref_rms(new_res, w, EPS, False)
    lk.fused_add_rms_norm(xs, rs, w, EPS)
    assert torch.equal(buf[:, 1], new_res)
    close(buf[:, 0], want)
    xa = torch.from_numpy(rand(rng, (4, 128), np.float32, 3.0)).to(tdt)
    o = torch.empty((4, 64), dtype=tdt)
    lk.silu_and_mul(o, xa)
    close(o, ref_silu_mul(xa))
    lk.gelu_tanh_and_mul(o, xa)
    close(o, ref_gelu_mul(xa))
    # and against torch's own functions
    F = torch.nn.functional
    torch.testing.assert_close(o.float(), (F.gelu(xa[:, :64].float(), approximate="tanh") * xa[:, 64:].float()).to(tdt).float(),
                               rtol=TORCH_RTOL[dt], atol=TORCH_RTOL[dt])


TORCH_RTOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


def test_torch_mixed_bf16_weights_f32(rng):
    torch = torch_or_skip()
    x = torch.from_numpy(rand(rng, (3, 32), np.float32)).to(torch.bfloat16)
    w = torch.from_numpy(rand(rng, (32,), np.float32))
    out = torch.empty((3, 32), dtype=torch.float32)
    lk.rms_norm(out, x, w, EPS)
    np.testing.assert_allclose(out.numpy(), ref_rms(x, w, EPS, False), rtol=1e-5, atol=1e-5)


def test_error_messages_name_python_arguments(rng):
    """C's x / w / eps / q / k / out / a are given as vLLM's argument names"""
    x = rand(rng, (4, 16), np.float32)
    out = np.zeros((4, 16), np.float32)
    with pytest.raises(lk.LlmkernError, match="lk_rms_norm: epsilon: must be finite and >= 0"):
        lk.rms_norm(out, x, np.ones(16, np.float32), -1.0)
    with pytest.raises(lk.LlmkernError, match="input and residual overlap"):
        lk.fused_add_rms_norm(x, x, np.ones(16, np.float32), EPS)
    with pytest.raises(lk.LlmkernError, match=r"query: shape \[4, 1, 16\] has 4 tokens"):
        lk.rotary_embedding(np.arange(3), x.copy(), None, 16, np.ones((8, 16), np.float32), True)
    st, lse = rand(rng, (3, 2, 16), np.float32), np.zeros((2, 3), np.float32)
    with pytest.raises(lk.LlmkernError, match="output and prefix_output overlap"):
        lk.merge_attn_states(st, st, lse, rand(rng, (3, 2, 16), np.float32), lse)
