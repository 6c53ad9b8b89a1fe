"""flash_attn_varlen_func / flash_attn_with_kvcache (and the llmkern.torch ops) over fp8
q / K / V with q_descale, k_descale, v_descale (vLLM's names): uint8 caches viewed through
kv_cache_dtype, ml_dtypes float8 arrays, torch float8 tensors; descales as numbers,
[1], [Hk] and vLLM's expanded [num_seqs, Hk]; against a float64 attention of the
dequantized values (code * descale), paged and dense, and bad descales."""
import math

import numpy as np
import pytest

import llmkern as lk
from helpers import torch_or_skip


def ml():
    return pytest.importorskip("ml_dtypes")


def f8_type(kv):
    m = ml()
    return m.float8_e5m2 if kv == "fp8_e5m2" else m.float8_e4m3fn


def codes(rng, shape, kv):
    """random fp8 codes of x in [-3, 3) (finite) as uint8"""
    return (rng.uniform(-3, 3, shape).astype(np.float32)).astype(f8_type(kv)).view(np.uint8)


def deq(c, kv):
    return c.view(f8_type(kv)).astype(np.float64)


def ref_attn(q, K, V, cu_q, kls, scale, causal, qd, kd, vd):
    """q [T, Hq, D] float64 (already dequantized); K, V lists per request [k_len, Hk, D]
    float64 codes; qd / kd / vd [B, Hk] float64 descales (q's applied here)"""
    T, Hq, D = q.shape
    B = len(kls)
    Hk = K[0].shape[1] if B else 1
    G = Hq // Hk
    out = np.zeros((T, Hq, V[0].shape[2] if B else D))
    for b in range(B):
        q0, q1 = cu_q[b], cu_q[b + 1]
        kl, ql = kls[b], q1 - q0
        for i in range(ql):
            for h in range(Hq):
                kh = h // G
                s = (K[b][:, kh, :] * kd[b, kh]) @ (q[q0 + i, h] * qd[b, kh]) * scale
                if causal:
                    s[np.arange(kl) > i + kl - ql] = -np.inf
                if not np.isfinite(s).any():
                    continue
                p = np.exp(s - s.max())
                out[q0 + i, h] = (p / p.sum()) @ (V[b][:, kh, :] * vd[b, kh])
    return out


def descale_forms(val, B, Hk, form):
    """a per-(request, KV head) float64 table and the argument as vLLM could pass it"""
    if form == "number":
        return np.full((B, Hk), np.float64(np.float32(val))), float(val)
    if form == "one":
        return np.full((B, Hk), np.float64(np.float32(val))), np.array([val], np.float32)
    if form == "heads":
        a = (val * (1 + 0.25 * np.arange(Hk))).astype(np.float32)
        return np.broadcast_to(a.astype(np.float64), (B, Hk)).copy(), a
    a = np.float32(val) * np.ones((1, 1), np.float32)  # vLLM: layer._k_scale.expand(B, Hk)
    return np.full((B, Hk), np.float64(np.float32(val))), np.broadcast_to(a, (B, Hk))


@pytest.mark.parametrize("kv", ["fp8", "fp8_e5m2"])
@pytest.mark.parametrize("bs", [1, 7, 16])
@pytest.mark.parametrize("form", ["number", "one", "heads", "expanded"])
def test_numpy_paged_uint8(rng, kv, bs, form):
    B, Hq, Hk, D = 3, 8, 2, 64
    kls = [40, 0, 17]
    qls = [1, 1, 2]
    cu_q = np.concatenate([[0], np.cumsum(qls)]).astype(np.int32)
    pages = [(k + bs - 1) // bs for k in kls]
    NB = sum(pages) + 2
    kc = rng.integers(0, 256, (NB, bs, Hk, D), dtype=np.uint8)  # garbage in unused slots
    vc = rng.integers(0, 256, (NB, bs, Hk, D), dtype=np.uint8)
    perm = rng.permutation(NB)
    table = np.full((B, max(pages) + 1), -1, np.int32)
    K, V, nxt = [], [], 0
    for b in range(B):
        kb, vb = codes(rng, (kls[b], Hk, D), kv), codes(rng, (kls[b], Hk, D), kv)
        for j in range(kls[b]):
            pg = perm[nxt + j // bs]
            kc[pg, j % bs], vc[pg, j % bs] = kb[j], vb[j]
        table[b, :pages[b]] = perm[nxt:nxt + pages[b]]
        nxt += pages[b]
        K.append(deq(kb, kv)), V.append(deq(vb, kv))
    q = rng.uniform(-1, 1, (cu_q[-1], Hq, D)).astype(np.float32)
    kd, ka = descale_forms(1.3, B, Hk, form)
    vd, va = descale_forms(0.4, B, Hk, form)
    qd = np.ones((B, Hk))
    scale = 1 / math.sqrt(D)
    out = lk.flash_attn_varlen_func(q, kc, vc, cu_q, None, 2, max(kls), softmax_scale=scale, causal=True,
                                    block_table=table, seqused_k=np.array(kls, np.int32), kv_cache_dtype=kv,
                                    k_descale=ka, v_descale=va)
    want = ref_attn(q.astype(np.float64), K, V, cu_q, kls, np.float64(np.float32(scale)), True, qd, kd, vd)
    assert np.abs(out - want).max() <= 3e-5 * (1 + np.abs(want).max())


@pytest.mark.parametrize("kv", ["fp8_e4m3", "fp8_e5m2"])
def test_ml_dtypes_dense_fp8_q(rng, kv):
    """dense K / V and q as float8 arrays (no kv_cache_dtype needed), q_descale too"""
    T, Hq, Hk, D = 9, 4, 2, 32
    cu = np.array([0, 4, 9], np.int32)
    qc, kc, vc = codes(rng, (T, Hq, D), kv), codes(rng, (T, Hk, D), kv), codes(rng, (T, Hk, D), kv)
    t = f8_type(kv)
    qd, kd, vd = np.float32(0.5), np.float32(0.7), np.float32(2.0)
    out = lk.flash_attn_varlen_func(qc.view(t), kc.view(t), vc.view(t), cu, cu, 5, 5, causal=True,
                                    q_descale=qd, k_descale=kd, v_descale=vd)
    assert out.dtype == np.float32
    ones = np.ones((2, Hk))
    K = [deq(kc[0:4], kv), deq(kc[4:9], kv)]
    V = [deq(vc[0:4], kv), deq(vc[4:9], kv)]
    want = ref_attn(deq(qc, kv), K, V, cu, [4, 5], np.float64(np.float32(1 / math.sqrt(D))), True,
                    ones * qd, ones * kd, ones * vd)
    assert np.abs(out - want).max() <= 3e-5 * (1 + np.abs(want).max())


def test_descales_ignored_without_fp8(rng):
    """vLLM passes k/v_descale (1.0) for 'auto' caches too: validated, not applied"""
    q = rng.standard_normal((3, 2, 16)).astype(np.float32)
    k = rng.standard_normal((5, 1, 16)).astype(np.float32)
    v = rng.standard_normal((5, 1, 16)).astype(np.float32)
    cq, ck = np.array([0, 3], np.int32), np.array([0, 5], np.int32)
    a = lk.flash_attn_varlen_func(q, k, v, cq, ck, 3, 5, causal=True)
    b = lk.flash_attn_varlen_func(q, k, v, cq, ck, 3, 5, causal=True, k_descale=3.0, v_descale=0.5)
    assert np.array_equal(a, b)
    with pytest.raises(lk.LlmkernError, match="k_descale"):
        lk.flash_attn_varlen_func(q, k, v, cq, ck, 3, 5, k_descale=-1.0)


@pytest.mark.parametrize("bad, err", [(0.0, "v_descale"), (float("nan"), "v_descale"),
                                      (np.ones(3, np.float32), "v_descale"), (np.ones(2, np.float64), "v_descale")])
def test_bad_descales_named_nothing_written(rng, bad, err):
    kc = codes(rng, (2, 4, 2, 32), "fp8")
    q = rng.standard_normal((2, 4, 32)).astype(np.float32)
    out = np.full((2, 4, 32), 7.0, np.float32)
    table = np.array([[0], [1]], np.int32)
    with pytest.raises((lk.LlmkernError, TypeError), match=err):
        lk.flash_attn_varlen_func(q, kc, kc.copy(), np.array([0, 1, 2], np.int32), None, 1, 4, block_table=table,
                                  seqused_k=np.array([4, 3], np.int32), kv_cache_dtype="fp8", out=out,
                                  k_descale=1.0, v_descale=bad)
    assert (out == 7.0).all()


def test_uint8_cache_needs_the_kv_dtype(rng):
    kc = codes(rng, (1, 4, 1, 16), "fp8")
    q = rng.standard_normal((1, 1, 16)).astype(np.float32)
    with pytest.raises((lk.LlmkernError, TypeError, ValueError)):
        lk.flash_attn_varlen_func(q, kc, kc, np.array([0, 1], np.int32), None, 1, 4,
                                  block_table=np.zeros((1, 1), np.int32), seqused_k=np.array([4], np.int32))
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        lk.flash_attn_varlen_func(q, kc, kc, np.array([0, 1], np.int32), None, 1, 4,
                                  block_table=np.zeros((1, 1), np.int32), seqused_k=np.array([4], np.int32),
                                  kv_cache_dtype="int8")


@pytest.mark.parametrize("kvdt", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("layout", ["ND", "NZ"])
def test_torch_vllm_call(rng, kvdt, layout):
    """vLLM's call: caches viewed as torch float8, descales expanded to [num_seqs, Hk],
    out given; NZ (32-wide fp8 tiles) equals ND bit for bit; the custom op agrees"""
    torch = torch_or_skip()
    import llmkern.torch  # noqa: F401
    B, Hq, Hk, D, bs, NB = 2, 8, 2, 64, 16, 6
    f8 = getattr(torch, kvdt)
    kv = "fp8_e5m2" if kvdt == "float8_e5m2" else "fp8"
    kcu = torch.from_numpy(codes(rng, (NB, bs, Hk, D), kv))
    vcu = torch.from_numpy(codes(rng, (NB, bs, Hk, D), kv))
    q = torch.from_numpy(rng.uniform(-1, 1, (B, Hq, D)).astype(np.float32)).to(torch.bfloat16)
    table = torch.tensor([[3, 1, 5], [0, 2, 4]], dtype=torch.int32)
    used = torch.tensor([40, 33], dtype=torch.int32)
    cu = torch.tensor([0, 1, 2], dtype=torch.int32)
    kd = torch.tensor([0.8], dtype=torch.float32).expand(B, Hk)
    vd = torch.tensor([1.5], dtype=torch.float32).expand(B, Hk)

    def nz(c):  # [NB, bs, Hk, D] -> [NB, Hk*D/32, bs, 32]
        return c.reshape(NB, bs, Hk * D // 32, 32).permute(0, 2, 1, 3).contiguous()

    kc, vc = (kcu.view(f8), vcu.view(f8)) if layout == "ND" else (nz(kcu).view(f8), nz(vcu).view(f8))
    out = torch.empty(B, Hq, D, dtype=torch.bfloat16)
    lk.flash_attn_varlen_func(q, kc, vc, cu, None, 1, 40, softmax_scale=0.125, causal=True, block_table=table,
                              seqused_k=used, out=out, k_descale=kd, v_descale=vd, kv_layout=layout)
    # float64 reference of the dequantized values
    K = [deq(np.concatenate([kcu.numpy()[p] for p in table[b].tolist()])[:used[b]], kv) for b in range(B)]
    V = [deq(np.concatenate([vcu.numpy()[p] for p in table[b].tolist()])[:used[b]], kv) for b in range(B)]
    ones = np.ones((B, Hk))
    want = ref_attn(q.float().numpy().astype(np.float64), K, V, cu.numpy(), used.tolist(), 0.125, True,
                    ones, ones * np.float32(0.8), ones * 1.5)
    assert np.abs(out.float().numpy() - want).max() <= 2 ** -7 * (1 + np.abs(want).max())
    # the uint8 buffers with kv_cache_dtype, and the custom op: the same bits
    u8 = (kcu, vcu) if layout == "ND" else (nz(kcu), nz(vcu))
    out2 = lk.flash_attn_varlen_func(q, u8[0], u8[1], cu, None, 1, 40, softmax_scale=0.125, causal=True,
                                     block_table=table, seqused_k=used, k_descale=kd, v_descale=vd,
                                     kv_layout=layout, kv_cache_dtype=kv)
    assert torch.equal(out, out2)
    o3, _ = torch.ops.llmkern.flash_attn_varlen_func(q, kc, vc, cu, None, used, table, 0.125, True, [-1, -1], 0.0,
                                                     None, layout, None, kd, vd, "auto")
    assert torch.equal(out, o3)


def test_torch_kvcache_fp8(rng):
    """flash_attn_with_kvcache over float8 caches with descales; appends refused"""
    torch = torch_or_skip()
    B, Hq, Hk, D, S = 2, 4, 1, 32, 12
    kcu = torch.from_numpy(codes(rng, (B, S, Hk, D), "fp8"))
    vcu = torch.from_numpy(codes(rng, (B, S, Hk, D), "fp8"))
    q = torch.from_numpy(rng.uniform(-1, 1, (B, 1, Hq, D)).astype(np.float32))
    lens = torch.tensor([12, 5], dtype=torch.int32)
    out = lk.flash_attn_with_kvcache(q, kcu.view(torch.float8_e4m3fn), vcu.view(torch.float8_e4m3fn),
                                     cache_seqlens=lens, causal=True, k_descale=0.5, v_descale=2.0)
    K = [deq(kcu.numpy()[b, :lens[b]], "fp8") for b in range(B)]
    V = [deq(vcu.numpy()[b, :lens[b]], "fp8") for b in range(B)]
    ones = np.ones((B, Hk))
    want = ref_attn(q.numpy().reshape(B, Hq, D).astype(np.float64), K, V, np.array([0, 1, 2]), lens.tolist(),
                    np.float64(np.float32(1 / math.sqrt(D))), True, ones, ones * 0.5, ones * 2.0)
    assert np.abs(out.numpy().reshape(B, Hq, D) - want).max() <= 3e-5 * (1 + np.abs(want).max())
    with pytest.raises(NotImplementedError, match="fp8"):
        lk.flash_attn_with_kvcache(q, kcu, vcu, k=q[:, :, :1], v=q[:, :, :1], cache_seqlens=lens,
                                   kv_cache_dtype="fp8", k_descale=1.0)
