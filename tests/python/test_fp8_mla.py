"""mla_prefix_prefill over fp8 latent caches (vLLM's kv_cache_dtype "fp8" / "fp8_e4m3" /
"fp8_e5m2" with a per-tensor k_scale): uint8 caches as vLLM allocates them, ml_dtypes
float8 arrays and torch float8 tensors (kv_cache_dtype "auto"), the llmkern.torch op;
against a float64 dense computation over the dequantized entries f32(code) * k_scale,
every strategy; NZ (32-wide tile) == ND bit for bit; bad k_scale and mismatched dtypes."""
import math

import numpy as np
import pytest

import llmkern as lk
from helpers import c_op_missing, torch_or_skip

STRATEGIES = ["auto", "split_merge", "concat", "fused", "absorbed"]


def ml_or_skip():
    return pytest.importorskip("ml_dtypes")


def need_op():
    if c_op_missing("mla_prefix_prefill"):
        pytest.skip("lk_mla_prefix_prefill is not in this libllmkern")


def fp8_np(kv):
    ml = ml_or_skip()
    return ml.float8_e5m2 if kv == "fp8_e5m2" else ml.float8_e4m3fn


def inputs(rng, H=2, Dn=16, Dr=32, Dv=16, Dl=32, BS=4):
    """q, k, v, cu, prefix_lens, table, a float cache [7, BS, Dl + Dr] and w, float32."""
    q_lens, prefix_lens = [3, 2, 1], np.array([5, 0, 9], np.int32)
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    T = int(cu[-1])
    q = rng.standard_normal((T, H, Dn + Dr)).astype(np.float32)
    k = rng.standard_normal((T, H, Dn + Dr)).astype(np.float32)
    k[:, 1:, Dn:] = k[:, :1, Dn:]
    v = rng.standard_normal((T, H, Dv)).astype(np.float32)
    x = rng.uniform(-1, 1, (7, BS, Dl + Dr)).astype(np.float32)
    table = np.array([[6, 2, 0], [0, 0, 0], [1, 3, 5]], np.int32)
    w = (rng.standard_normal((H * (Dn + Dv), Dl)) / math.sqrt(Dl)).astype(np.float32)
    return q, k, v, cu, prefix_lens, table, x, w, Dl


def quantize(x, ks, kv):
    """uint8 codes of fp8(f32(x) / f32(ks)) (round to nearest even, values in range)."""
    return (x / np.float32(ks)).astype(fp8_np(kv)).view(np.uint8)


def dequant(codes, ks, kv):
    return codes.view(fp8_np(kv)).astype(np.float64) * ks


def ref(q, k, v, cu, plens, table, ent_all, w, dl, scale):
    """float64 dense computation: per request keys [W_UK c | k_pe] then its own tokens,
    bottom-right causal."""
    q, k, v, w = (np.asarray(a, np.float64) for a in (q, k, v, w))
    H, Dv = v.shape[1], v.shape[2]
    dn = w.shape[0] // H - Dv
    bs = ent_all.shape[1]
    out = np.zeros((q.shape[0], H, Dv))
    for b in range(len(cu) - 1):
        P, q0, q1 = int(plens[b]), int(cu[b]), int(cu[b + 1])
        t = np.arange(P)
        ent = ent_all[table[b, t // bs], t % bs]
        proj = (ent[:, :dl] @ w.T).reshape(P, H, dn + Dv)
        kp = np.concatenate([proj[..., :dn], np.broadcast_to(ent[:, None, dl:], (P, H, ent.shape[1] - dl))], 2)
        K = np.concatenate([kp, k[q0:q1]])
        V = np.concatenate([proj[..., dn:], v[q0:q1]])
        for i in range(q1 - q0):
            s = np.einsum("hd,jhd->hj", q[q0 + i], K[:P + i + 1]) * scale
            p = np.exp(s - s.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            out[q0 + i] = np.einsum("hj,jhd->hd", p, V[:P + i + 1])
    return out


def to_nz32(nd):
    """ND [nb, bs, C] -> the fp8 NZ buffer [nb, C/32, bs, 32]."""
    nb, bs, c = nd.shape
    return np.ascontiguousarray(nd.reshape(nb, bs, c // 32, 32).transpose(0, 2, 1, 3))


def check(out, want, tol=5e-5):
    np.testing.assert_allclose(np.asarray(out, np.float64), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("kv", ["fp8", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_numpy_uint8_cache(rng, kv, strategy):
    need_op()
    q, k, v, cu, plens, table, x, w, dl = inputs(rng)
    ks = 0.037
    codes = quantize(x, ks, kv)
    want = ref(q, k, v, cu, plens, table, dequant(codes, ks, kv), w, dl, 0.2)
    out = lk.mla_prefix_prefill(q, k, v, cu, plens, table, codes, w, 0.2, strategy=strategy,
                                kv_cache_dtype=kv, k_scale=ks)
    check(out, want)
    assert strategy == "auto" or strategy in lk.mla_last_trace()
    # NZ (32-wide tile for 1-byte entries) gives the same bits
    nz = lk.mla_prefix_prefill(q, k, v, cu, plens, table, to_nz32(codes), w, 0.2, strategy=strategy,
                               kv_layout="NZ", kv_cache_dtype=kv, k_scale=np.array([ks], np.float32))
    assert np.array_equal(out, nz)


@pytest.mark.parametrize("kv", ["fp8_e4m3", "fp8_e5m2"])
def test_ml_dtypes_cache_two_buffers(rng, kv):
    need_op()
    q, k, v, cu, plens, table, x, w, dl = inputs(rng)
    ks = 2.0
    codes = quantize(x, ks, kv)
    lat, pe = codes.view(fp8_np(kv))[..., :dl], codes.view(fp8_np(kv))[..., dl:]  # strided views
    want = ref(q, k, v, cu, plens, table, dequant(codes, ks, kv), w, dl, 0.2)
    for strategy in STRATEGIES:
        out = lk.mla_prefix_prefill(q, k, v, cu, plens, table, lat, w, 0.2, strategy=strategy,
                                    k_pe_cache=pe, k_scale=ks)  # kv_cache_dtype "auto": the arrays' dtype
        check(out, want)
        out2 = lk.mla_prefix_prefill(q, k, v, cu, plens, table, lat, w, 0.2, strategy=strategy,
                                     k_pe_cache=pe, k_scale=ks, kv_cache_dtype=kv)
        assert np.array_equal(out, out2)


def test_bad_scale_and_dtype(rng):
    need_op()
    q, k, v, cu, plens, table, x, w, dl = inputs(rng)
    codes = quantize(x, 0.5, "fp8")
    out = np.full((q.shape[0], 2, 16), 7.0, np.float32)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError) as e:
            lk.mla_prefix_prefill(q, k, v, cu, plens, table, codes, w, 0.2, out=out, kv_cache_dtype="fp8",
                                  k_scale=bad)
        assert "k_scale" in str(e.value)
        assert np.all(out == 7.0)  # nothing written
    with pytest.raises(TypeError, match="kv_cache"):  # an e4m3 array passed as e5m2
        lk.mla_prefix_prefill(q, k, v, cu, plens, table, codes.view(fp8_np("fp8")), w, 0.2,
                              kv_cache_dtype="fp8_e5m2", k_scale=0.5)
    with pytest.raises(NotImplementedError, match="kv_cache_dtype"):
        lk.mla_prefix_prefill(q, k, v, cu, plens, table, codes, w, 0.2, kv_cache_dtype="int8")
    with pytest.raises(ValueError, match="k_scale"):  # per-tensor only
        lk.mla_prefix_prefill(q, k, v, cu, plens, table, codes, w, 0.2, kv_cache_dtype="fp8",
                              k_scale=np.ones(2, np.float32))
    # a uint8 cache with "auto" is not a float cache
    with pytest.raises((lk.LlmkernError, TypeError)):
        lk.mla_prefix_prefill(q, k, v, cu, plens, table, codes, w, 0.2)


@pytest.mark.parametrize("kv", ["fp8", "fp8_e5m2"])
def test_torch_caches_and_op(rng, kv):
    need_op()
    torch = torch_or_skip()
    import llmkern.torch  # noqa: F401  (registers torch.ops.llmkern)
    q, k, v, cu, plens, table, x, w, dl = inputs(rng)
    ks = 0.11
    codes = quantize(x, ks, kv)
    want = ref(q, k, v, cu, plens, table, dequant(codes, ks, kv), w, dl, 0.2)
    T = [torch.from_numpy(a) for a in (q, k, v, cu, plens, table)]
    tw = torch.from_numpy(w).to(torch.bfloat16)
    want_bf = ref(q, k, v, cu, plens, table, dequant(codes, ks, kv), tw.double().numpy(), dl, 0.2)
    tks = torch.tensor([ks], dtype=torch.float32)
    u8 = torch.from_numpy(codes.copy())
    f8 = u8.view(torch.float8_e5m2 if kv == "fp8_e5m2" else torch.float8_e4m3fn)
    for strategy in STRATEGIES:
        a = lk.mla_prefix_prefill(*T, u8, torch.from_numpy(w), 0.2, strategy=strategy, kv_cache_dtype=kv,
                                  k_scale=tks)
        check(a.numpy(), want)
        b = lk.mla_prefix_prefill(*T, f8, torch.from_numpy(w), 0.2, strategy=strategy, k_scale=tks)
        assert torch.equal(a, b)
        # bf16 weight: the projection on bf16 operands (the fp8 codes widen to bf16 exactly)
        c = torch.ops.llmkern.mla_prefix_prefill(*T, u8, tw, 0.2, strategy=strategy, kv_cache_dtype=kv,
                                                 k_scale=tks)
        check(c.numpy(), want_bf, 2e-4)
