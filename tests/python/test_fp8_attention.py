"""flash_attn_varlen_func / flash_attn_with_kvcache (and the llmkern.torch ops) over fp8
q / K / V with q_descale, k_descale, v_descale (vLLM's names): uint8 caches viewed through
kv_cache_dtype, ml_dtypes float8 arrays, torch float8 tensors; descales as numbers,
[1], [Hk] and vLLM's expanded [num_seqs, Hk]; against a float64 attention of the
dequantized values (code * descale), paged and dense, and bad descales. fp8 outs with
output_scale (vLLM's fused output quantization): float64 within one code, the unfused form
bit for bit, allocation, uint8 outs, bad scales, torch and the custom ops."""
import math

import numpy as np
import pytest

import llmkern as lk
from helpers import rope_ref, torch_or_skip


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
    """flash_attn_with_kvcache over float8 caches with descales (no append)"""
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


# ---------------------------------------------------------------- appends to fp8 caches


def quantize(x32, descale, kv):
    """the reference fp8 converter: uint8 codes of fp8(f32(x) / f32(descale)), saturated"""
    m = np.float32(57344.0 if kv == "fp8_e5m2" else 448.0)
    return np.clip(np.asarray(x32, np.float32) / np.float32(descale), -m, m).astype(f8_type(kv)).view(np.uint8)


def within_half_step(codes_, y, kv, rel):
    """the fp8 values of codes_ within half an fp8 step of y (float64), plus rel |y|"""
    M, emin = (2, -14) if kv == "fp8_e5m2" else (3, -6)
    e = np.floor(np.log2(np.maximum(np.abs(y), 2.0 ** emin)))
    return np.all(np.abs(deq(codes_, kv) - y) <= 2.0 ** (e - M - 1) * (1 + 1e-6) + rel * np.abs(y))


def descale_table(form, B, Hk, base):
    """[B, Hk] float64 descales and the argument: a number, per KV head [Hk], or [B, Hk]
    with a row per request"""
    if form == "number":
        return np.full((B, Hk), np.float64(np.float32(base))), float(base)
    if form == "heads":
        a = (base * (1 + 0.5 * np.arange(Hk))).astype(np.float32)
        return np.broadcast_to(a.astype(np.float64), (B, Hk)).copy(), a
    a = (base * (1 + 0.25 * np.arange(B * Hk)).reshape(B, Hk)).astype(np.float32)
    return a.astype(np.float64), a


def kvcache_append_case(rng, torch, paged, rotary, kv, typed, form, kdt=None):
    """One flash_attn_with_kvcache call appending k, v (2 tokens per request) to fp8
    caches with descales, checked against the reference converter and a float64
    attention over the dequantized cache; returns nothing (asserts)."""
    B, sq, s_new, Hq, Hk, D = 3, 2, 2, 4, 2, 32
    seqlens = np.array([5, 0, 17], np.int32)
    if paged:
        bs, NB, P = 4, 20, 6
        shape = (NB, bs, Hk, D)
        table = rng.permutation(NB)[:B * P].reshape(B, P).astype(np.int32)
        bidx = None
    else:
        shape, table, bidx = (4, 24, Hk, D), None, np.array([2, 0, 3], np.int32)
    kcu, vcu = codes(rng, shape, kv), codes(rng, shape, kv)
    q = rng.standard_normal((B, sq, Hq, D)).astype(np.float32)
    kn, vn = (rng.standard_normal((B, s_new, Hk, D)) * 2).astype(np.float32), rng.standard_normal((B, s_new, Hk, D)).astype(np.float32)
    kd, ka = descale_table(form, B, Hk, 0.5)
    vd, va = descale_table(form, B, Hk, 2.0)
    cos = sin = None
    if rotary is not None:
        ang = np.arange(64)[:, None] * (1e-2 * np.arange(1, 9)[None, :])
        cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)  # rotary_dim 16 of 32
    k0, v0 = kcu.copy(), vcu.copy()
    t = (lambda a: torch.from_numpy(a)) if torch is not None else (lambda a: a)
    kc_u8, vc_u8 = t(kcu), t(vcu)
    if typed:  # float8 caches (torch float8 / ml_dtypes), kv_cache_dtype 'auto'
        f8 = (getattr(torch, "float8_e5m2" if kv == "fp8_e5m2" else "float8_e4m3fn") if torch is not None
              else f8_type(kv))
        kc, vc, kvd = kc_u8.view(f8), vc_u8.view(f8), "auto"
    else:
        kc, vc, kvd = kc_u8, vc_u8, kv
    qa, kna, vna = t(q), t(kn), t(vn)
    if kdt is not None:
        kna, vna = kna.to(kdt), vna.to(kdt)
    targ = (lambda a: None if a is None else t(np.ascontiguousarray(a)) if isinstance(a, np.ndarray) else a)
    out, lse = lk.flash_attn_with_kvcache(qa, kc, vc, k=kna, v=vna, rotary_cos=targ(cos), rotary_sin=targ(sin),
                                          cache_seqlens=t(seqlens), cache_batch_idx=targ(bidx),
                                          block_table=targ(table), causal=True,
                                          rotary_interleaved=bool(rotary), return_softmax_lse=True,
                                          k_descale=targ(ka), v_descale=targ(va), kv_cache_dtype=kvd)
    out = out.float().numpy() if torch is not None else out
    kcn, vcn = (kc_u8.numpy(), vc_u8.numpy()) if torch is not None else (kcu, vcu)
    knf = kna.float().numpy() if torch is not None else kn  # the new values as passed (bf16-rounded)
    vnf = vna.float().numpy() if torch is not None else vn

    def seq(c, b):
        n = seqlens[b] + s_new
        if paged:
            return np.concatenate([c[p] for p in table[b]])[:n]
        return c[bidx[b]][:n]
    touched = np.zeros(shape[:2], bool)
    for b in range(B):
        n = int(seqlens[b])
        for j in range(n, n + s_new):  # the slots of the append
            touched[(table[b, j // bs], j % bs) if paged else (bidx[b], j)] = True
        ks, vs = seq(kcn, b), seq(vcn, b)
        assert np.array_equal(ks[:n], seq(k0, b)[:n]) and np.array_equal(vs[:n], seq(v0, b)[:n])
        # the appended codes: the reference converter of x / descale (per KV head)
        np.testing.assert_array_equal(vs[n:], quantize(vnf[b], vd[b][None, :, None], kv))
        if rotary is None:
            np.testing.assert_array_equal(ks[n:], quantize(knf[b], kd[b][None, :, None], kv))
        else:  # rotated in the input dtype first: half an fp8 step (+ that rounding) of the float64 rotation
            y = rope_ref(knf[b], n + np.arange(s_new), cos, sin, rotary) / kd[b][None, :, None]
            assert within_half_step(ks[n:], y, kv, 2.0 ** -8 if kdt is not None else 1e-5)
        # attention over the dequantized cache (the codes as stored) against float64
        qb = q[b].astype(np.float64) if rotary is None else rope_ref(q[b], n + np.arange(sq), cos, sin, rotary)
        want = ref_attn(qb, [deq(ks, kv)], [deq(vs, kv)], np.array([0, sq]), [n + s_new], np.float64(np.float32(1 / math.sqrt(D))), True,
                        np.ones((1, Hk)), kd[b:b + 1], vd[b:b + 1])
        assert np.abs(out[b] - want).max() <= 3e-5 * (1 + np.abs(want).max())
    # slots outside the append untouched
    assert np.array_equal(kcn[~touched], k0[~touched]) and np.array_equal(vcn[~touched], v0[~touched])
    lse = lse.numpy() if torch is not None else lse
    assert lse.shape == (B, Hq, sq) and np.isfinite(lse).all()


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("rotary", [None, True, False])
@pytest.mark.parametrize("cache", ["float8_e4m3fn", "uint8_fp8_e5m2"])
@pytest.mark.parametrize("form", ["number", "heads", "rows"])
def test_torch_kvcache_append_fp8(rng, paged, rotary, cache, form):
    """new k, v appended to fp8 caches (torch float8, or uint8 with kv_cache_dtype) as
    fp8(x / descale): descales per tensor, per KV head, or one row per request"""
    torch = torch_or_skip()
    ml()
    kv = "fp8_e5m2" if cache.endswith("e5m2") else "fp8"
    kvcache_append_case(rng, torch, paged, rotary, kv, cache.startswith("float8"), form)


@pytest.mark.parametrize("rotary", [None, False])
def test_torch_kvcache_append_fp8_bf16(rng, rotary):
    """bf16 new k, v (rotated in bf16) into a float8_e4m3fn paged cache"""
    torch = torch_or_skip()
    ml()
    kvcache_append_case(rng, torch, True, rotary, "fp8", True, "heads", kdt=torch.bfloat16)


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("cache", ["uint8_fp8", "uint8_fp8_e4m3", "ml_dtypes_e5m2"])
@pytest.mark.parametrize("form", ["number", "rows"])
def test_numpy_kvcache_append_fp8(rng, paged, cache, form):
    """the same on NumPy: uint8 caches with kv_cache_dtype 'fp8' / 'fp8_e4m3', ml_dtypes
    float8_e5m2 arrays; rotary (GPT-J pairs) on the paged cases"""
    ml()
    kv = "fp8_e5m2" if cache.endswith("e5m2") else "fp8"
    kvcache_append_case(rng, None, paged, True if paged else None, kv, cache.startswith("ml_dtypes"), form)


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_kvcache_append_fp8_errors_restore_cache(rng, lib):
    """an error found after the append (a bad ALiBi shape) puts the fp8 bytes back; bad
    descales are refused before it (named, status as the attention's), nothing written"""
    ml()
    torch = torch_or_skip() if lib == "torch" else None
    B, sq, Hq, Hk, D, S = 2, 1, 2, 2, 16, 8
    kcu, vcu = codes(rng, (B, S, Hk, D), "fp8"), codes(rng, (B, S, Hk, D), "fp8")
    k0, v0 = kcu.copy(), vcu.copy()
    t = (lambda a: torch.from_numpy(np.ascontiguousarray(a))) if torch is not None else (lambda a: a)
    if torch is not None:
        kc, vc, kvd = t(kcu).view(torch.float8_e4m3fn), t(vcu).view(torch.float8_e4m3fn), "auto"
        kcu_, vcu_ = kc.view(torch.uint8), vc.view(torch.uint8)
    else:
        kc, vc, kvd = kcu, vcu, "fp8"
        kcu_, vcu_ = kcu, vcu
    q = t(rng.standard_normal((B, sq, Hq, D)).astype(np.float32))
    kn, vn = t(rng.standard_normal((B, 3, Hk, D)).astype(np.float32)), t(rng.standard_normal((B, 3, Hk, D)).astype(np.float32))
    out = t(np.full((B, sq, Hq, D), 9.0, np.float32))
    lens = t(np.array([2, 5], np.int32))
    kd = t(np.array([[0.5, 0.25], [1.0, 2.0]], np.float32))  # rows differ: one write per request

    def unchanged():
        a = kcu_.numpy() if torch is not None else kcu_
        b = vcu_.numpy() if torch is not None else vcu_
        return np.array_equal(a, k0) and np.array_equal(b, v0) and (np.asarray(out) == 9.0).all()

    cases = [(dict(k_descale=kd, v_descale=1.5, alibi_slopes=t(np.ones(Hq + 1, np.float32))), "LK_ERR_SHAPE",
              "alibi_slopes"),
             (dict(k_descale=1.0, v_descale=t(np.array([1.0, np.nan], np.float32))), "LK_ERR_VALUE", "v_descale"),
             (dict(k_descale=t(np.array([[0.5, -1.0], [1.0, 2.0]], np.float32))), "LK_ERR_VALUE", "k_descale[0, 1]"),
             (dict(k_descale=t(np.ones((B + 1, Hk), np.float32))), "LK_ERR_SHAPE", "k_descale"),
             (dict(v_descale=t(np.ones(Hk, np.float16))), "LK_ERR_DTYPE", "v_descale"),
             (dict(k_descale=0.0), "LK_ERR_VALUE", "k_descale")]
    for kw, status, name in cases:
        with pytest.raises(lk.LlmkernError) as e:
            lk.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens, causal=True, out=out,
                                       kv_cache_dtype=kvd, **kw)
        assert e.value.status == status and name in str(e.value), str(e.value)
        assert unchanged()
    with pytest.raises(ValueError, match="cache_seqlens"):  # 6 + 3 > 8 slots
        lk.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=t(np.array([2, 6], np.int32)), out=out,
                                   kv_cache_dtype=kvd)
    assert unchanged()
    # the same call with good descales appends
    lk.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens, causal=True, out=out, kv_cache_dtype=kvd,
                               k_descale=kd, v_descale=1.5)
    got = kcu_.numpy() if torch is not None else kcu_
    knp = kn.numpy() if torch is not None else kn
    np.testing.assert_array_equal(got[1, 5:8], quantize(knp[1], np.array([1.0, 2.0])[None, :, None], "fp8"))
    np.testing.assert_array_equal(got[0, 2:5], quantize(knp[0], np.array([0.5, 0.25])[None, :, None], "fp8"))


# ---------------------------------------------------------------- fp8 out (output_scale)
# vLLM's fused output quantization: out = fp8(attention / output_scale). Compared with a
# float64 attention quantized by ml_dtypes' converter (clipped: the saturation), within
# one code, and bit for bit with the unfused form: the f32 out of the same call divided by
# output_scale in f32 and converted by ml_dtypes / torch (both round to nearest even).

FMAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}


def f8_codes(y, t):
    """uint8 codes of fp8(y), y f32 (or float64 rounded to f32 first), clipped to the
    finite range as the converter saturates"""
    m = np.float32(FMAX[np.dtype(t).name])
    return np.clip(np.asarray(y, np.float32), -m, m).astype(t).view(np.uint8)


def code_order(c):
    """sign-magnitude codes as ordered integers (+0 and -0 both 0)"""
    c = np.asarray(c, np.int32)
    return np.where(c & 0x80, -(c & 0x7f), c & 0x7f)


def assert_within_one_code(got_codes, want64, osc, t):
    """each code within one code of the codes of [w - e, w + e], w = want64 / osc, e the
    f32 attention tolerance 3e-5 (1 + |want64|) in output_scale units"""
    w = want64 / osc
    e = 3e-5 * (1 + np.abs(want64)) / osc
    o, lo, hi = code_order(got_codes), code_order(f8_codes(w - e, t)), code_order(f8_codes(w + e, t))
    assert np.all((o >= lo - 1) & (o <= hi + 1))


def paged_case(rng, kls, qls, Hq=8, Hk=2, D=64, bs=16):
    """f32 q and paged f32 K/V (uniform in [-1, 1), unused slots random too), with the
    float64 K / V per request for ref_attn"""
    B = len(kls)
    cu_q = np.concatenate([[0], np.cumsum(qls)]).astype(np.int32)
    pages = [(k + bs - 1) // bs for k in kls]
    NB = sum(pages) + 2
    kc = rng.uniform(-1, 1, (NB, bs, Hk, D)).astype(np.float32)
    vc = rng.uniform(-1, 1, (NB, bs, Hk, D)).astype(np.float32)
    perm = rng.permutation(NB)
    table = np.full((B, max(pages) + 1), -1, np.int32)
    K, V, nxt = [], [], 0
    for b in range(B):
        table[b, :pages[b]] = perm[nxt:nxt + pages[b]]
        idx = [(perm[nxt + j // bs], j % bs) for j in range(kls[b])]
        K.append(np.array([kc[p, s] for p, s in idx], np.float64).reshape(kls[b], Hk, D))
        V.append(np.array([vc[p, s] for p, s in idx], np.float64).reshape(kls[b], Hk, D))
        nxt += pages[b]
    q = rng.uniform(-1, 1, (cu_q[-1], Hq, D)).astype(np.float32)
    return q, kc, vc, cu_q, table, K, V


@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("qls", [[1, 1, 2], [3, 9, 20]])  # decode (GQA 4) and prefill
@pytest.mark.parametrize("scale_form", ["number", "one", "zero_d"])
def test_attn_output_scale_numpy(rng, fmt, qls, scale_form):
    t = getattr(ml(), fmt)
    kls = [40, 0, 530]  # request 1 sees no key: code 0
    B, Hq, Hk, D = 3, 8, 2, 64
    q, kc, vc, cu_q, table, K, V = paged_case(rng, kls, qls, Hq, Hk, D)
    osc = np.float32(0.0125)
    sarg = {"number": float(osc), "one": np.array([osc], np.float32), "zero_d": np.array(osc, np.float32)}[scale_form]
    kw = dict(softmax_scale=0.125, causal=True, block_table=table, seqused_k=np.array(kls, np.int32))
    out, lse = lk.flash_attn_varlen_func(q, kc, vc, cu_q, None, max(qls), max(kls), return_softmax_lse=True,
                                         out=np.empty((cu_q[-1], Hq, D), t), output_scale=sarg, **kw)
    assert out.dtype == t and lse.dtype == np.float32
    f32, lse32 = lk.flash_attn_varlen_func(q, kc, vc, cu_q, None, max(qls), max(kls), return_softmax_lse=True, **kw)
    # the unfused form, bit for bit; lse unscaled
    np.testing.assert_array_equal(out.view(np.uint8), f8_codes(f32 / osc, t))
    np.testing.assert_array_equal(lse, lse32)
    # float64
    ones = np.ones((B, Hk))
    want = ref_attn(q.astype(np.float64), K, V, cu_q, kls, 0.125, True, ones, ones, ones)
    assert_within_one_code(out.view(np.uint8), want, np.float64(osc), t)
    assert (out.view(np.uint8)[cu_q[1]:cu_q[2]] == 0).all() and np.isneginf(lse[:, cu_q[1]:cu_q[2]]).all()
    # the codes spread over several binades (|attention| / 0.0125 up to about 80)
    assert len(np.unique(out.view(np.uint8))) > 50


def test_attn_output_scale_allocates_and_uint8(rng):
    """out None with output_scale: an e4m3 out (ml_dtypes float8_e4m3fn); a uint8 out is
    taken as e4m3, as merge_attn_states(output_scale=) takes its output"""
    t = ml().float8_e4m3fn
    q = rng.uniform(-1, 1, (5, 4, 32)).astype(np.float32)
    k = rng.uniform(-1, 1, (9, 2, 32)).astype(np.float32)
    v = rng.uniform(-4, 4, (9, 2, 32)).astype(np.float32)
    cq, ck = np.array([0, 2, 5], np.int32), np.array([0, 4, 9], np.int32)
    a = lk.flash_attn_varlen_func(q, k, v, cq, ck, 3, 5, causal=True, output_scale=0.02)
    assert a.dtype == t and a.shape == (5, 4, 32)
    u8 = np.full((5, 4, 32), 0x55, np.uint8)
    r = lk.flash_attn_varlen_func(q, k, v, cq, ck, 3, 5, causal=True, output_scale=0.02, out=u8)
    assert r is u8
    np.testing.assert_array_equal(u8, a.view(np.uint8))
    f32 = lk.flash_attn_varlen_func(q, k, v, cq, ck, 3, 5, causal=True)
    np.testing.assert_array_equal(u8, f8_codes(f32 / np.float32(0.02), t))
    # a tiny scale saturates every value to +-448 (0x7e / 0xfe)
    sat = lk.flash_attn_varlen_func(q, k, v, cq, ck, 3, 5, causal=True, output_scale=1e-30)
    assert set(np.unique(sat.view(np.uint8))) <= {0x7e, 0xfe}


@pytest.mark.parametrize("bad, err", [(0.0, "output_scale"), (-1.0, "output_scale"), (float("nan"), "output_scale"),
                                      (float("inf"), "output_scale"), (np.ones(2, np.float32), "output_scale"),
                                      (np.ones(1, np.float16), "output_scale")])
def test_attn_output_scale_bad_named_nothing_written(rng, bad, err):
    t = ml().float8_e4m3fn
    q = rng.uniform(-1, 1, (3, 2, 16)).astype(np.float32)
    k = rng.uniform(-1, 1, (4, 1, 16)).astype(np.float32)
    cq, ck = np.array([0, 3], np.int32), np.array([0, 4], np.int32)
    out = np.full((3, 2, 16), 0x55, np.uint8).view(t)
    with pytest.raises((lk.LlmkernError, TypeError), match=err):
        lk.flash_attn_varlen_func(q, k, k, cq, ck, 3, 4, out=out, output_scale=bad)
    assert (out.view(np.uint8) == 0x55).all()


def test_attn_output_scale_out_dtype_rules(rng):
    """an fp8 out needs output_scale; a float out refuses one (both named, nothing written)"""
    t = ml().float8_e4m3fn
    q = rng.uniform(-1, 1, (3, 2, 16)).astype(np.float32)
    k = rng.uniform(-1, 1, (4, 1, 16)).astype(np.float32)
    cq, ck = np.array([0, 3], np.int32), np.array([0, 4], np.int32)
    o8 = np.full((3, 2, 16), 0x55, np.uint8).view(t)
    with pytest.raises(lk.LlmkernError, match="out"):
        lk.flash_attn_varlen_func(q, k, k, cq, ck, 3, 4, out=o8)
    assert (o8.view(np.uint8) == 0x55).all()
    of = np.full((3, 2, 16), 7.0, np.float32)
    with pytest.raises(lk.LlmkernError, match="out: dtype f32 with output_scale"):
        lk.flash_attn_varlen_func(q, k, k, cq, ck, 3, 4, out=of, output_scale=0.5)
    assert (of == 7.0).all()


@pytest.mark.parametrize("paged", [False, True])
def test_kvcache_output_scale_numpy(rng, paged):
    """flash_attn_with_kvcache(output_scale=): its own f32 result quantized, bit for bit;
    a uint8 out taken as e4m3; the appended slots written as without output_scale"""
    t = ml().float8_e5m2
    B, Hq, Hk, D, S = 2, 8, 2, 32, 24
    q = rng.uniform(-1, 1, (B, 2, Hq, D)).astype(np.float32)
    kn, vn = rng.uniform(-1, 1, (B, 1, Hk, D)).astype(np.float32), rng.uniform(-1, 1, (B, 1, Hk, D)).astype(np.float32)
    if paged:
        kc, vc = rng.uniform(-1, 1, (6, 8, Hk, D)).astype(np.float32), rng.uniform(-1, 1, (6, 8, Hk, D)).astype(np.float32)
        extra = {"block_table": np.array([[4, 1, 2], [0, 5, 3]], np.int32)}
    else:
        kc, vc = rng.uniform(-1, 1, (B, S, Hk, D)).astype(np.float32), rng.uniform(-1, 1, (B, S, Hk, D)).astype(np.float32)
        extra = {}
    lens = np.array([11, 3], np.int32)
    kc2, vc2 = kc.copy(), vc.copy()
    f32 = lk.flash_attn_with_kvcache(q, kc2, vc2, kn, vn, cache_seqlens=lens, causal=True, **extra)
    o8 = np.empty((B, 2, Hq, D), t)
    r, lse = lk.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens, causal=True, out=o8,
                                        return_softmax_lse=True, output_scale=np.array([0.05], np.float32), **extra)
    assert r is o8 and lse.dtype == np.float32
    np.testing.assert_array_equal(o8.view(np.uint8), f8_codes(f32 / np.float32(0.05), t))
    np.testing.assert_array_equal(kc, kc2)
    np.testing.assert_array_equal(vc, vc2)
    u8 = np.empty((B, 2, Hq, D), np.uint8)
    lk.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens + 1, causal=True, out=u8, output_scale=0.05, **extra)
    np.testing.assert_array_equal(u8, f8_codes(f32 / np.float32(0.05), ml().float8_e4m3fn))
    a = lk.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens + 1, causal=True, output_scale=0.05, **extra)
    assert a.dtype == ml().float8_e4m3fn
    np.testing.assert_array_equal(a.view(np.uint8), u8)


@pytest.mark.parametrize("ot", ["float8_e4m3fn", "float8_e5m2"])
def test_torch_attn_output_scale(rng, ot):
    """torch: float8 outs (given, or allocated e4m3 by the custom ops) with an output_scale
    tensor, bit for bit torch's own conversion of the f32 out / output_scale, fp8 K/V with
    descales; flash_attn_with_kvcache too; float64 within one code"""
    torch = torch_or_skip()
    import llmkern.torch  # noqa: F401
    t8 = getattr(torch, ot)
    B, Hq, Hk, D, bs, NB = 2, 8, 2, 64, 16, 6
    kcu = torch.from_numpy(codes(rng, (NB, bs, Hk, D), "fp8"))
    vcu = torch.from_numpy(codes(rng, (NB, bs, Hk, D), "fp8"))
    kc, vc = kcu.view(torch.float8_e4m3fn), vcu.view(torch.float8_e4m3fn)
    table = torch.tensor([[3, 1, 5], [0, 2, 4]], dtype=torch.int32)
    used = torch.tensor([40, 33], dtype=torch.int32)
    for ql in (1, 6):  # decode, prefill
        cu = torch.tensor([0, ql, 2 * ql], dtype=torch.int32)
        q = torch.from_numpy(rng.uniform(-1, 1, (2 * ql, Hq, D)).astype(np.float32)).to(torch.bfloat16)
        kw = dict(softmax_scale=0.125, causal=True, block_table=table, seqused_k=used, k_descale=0.8, v_descale=1.5)
        osc = torch.tensor([0.01])
        out = torch.empty(2 * ql, Hq, D, dtype=t8)
        lk.flash_attn_varlen_func(q, kc, vc, cu, None, ql, 40, out=out, output_scale=osc, **kw)
        f32 = lk.flash_attn_varlen_func(q, kc, vc, cu, None, ql, 40, out=torch.empty(2 * ql, Hq, D), **kw)
        m = FMAX[ot]
        want = (f32 / osc).clamp(-m, m).to(t8)
        assert torch.equal(out.view(torch.uint8), want.view(torch.uint8))
        K = [deq(np.concatenate([kcu.numpy()[p] for p in table[b].tolist()])[:used[b]], "fp8") for b in range(B)]
        V = [deq(np.concatenate([vcu.numpy()[p] for p in table[b].tolist()])[:used[b]], "fp8") for b in range(B)]
        ones = np.ones((B, Hk))
        w64 = ref_attn(q.float().numpy().astype(np.float64), K, V, cu.numpy(), used.tolist(), 0.125, True,
                       ones, ones * np.float32(0.8), ones * np.float32(1.5))
        assert_within_one_code(out.view(torch.uint8).numpy(), w64, 0.01, getattr(ml(), ot))
        # the custom op: an e4m3 out allocated, the same codes as the binding's e4m3 out
        o3, lse3 = torch.ops.llmkern.flash_attn_varlen_func(q, kc, vc, cu, None, used, table, 0.125, True, [-1, -1],
                                                            0.0, None, "ND", None, torch.tensor([0.8]),
                                                            torch.tensor([1.5]), "auto", osc)
        assert o3.dtype == torch.float8_e4m3fn and lse3.dtype == torch.float32
        e4 = lk.flash_attn_varlen_func(q, kc, vc, cu, None, ql, 40, output_scale=osc, **kw)
        assert e4.dtype == torch.float8_e4m3fn
        assert torch.equal(o3.view(torch.uint8), e4.view(torch.uint8))
    # flash_attn_with_kvcache, dense f32 cache
    q4 = torch.from_numpy(rng.uniform(-1, 1, (2, 1, 4, 32)).astype(np.float32))
    k4 = torch.from_numpy(rng.uniform(-1, 1, (2, 12, 1, 32)).astype(np.float32))
    lens = torch.tensor([12, 5], dtype=torch.int32)
    f32 = lk.flash_attn_with_kvcache(q4, k4, k4, cache_seqlens=lens, causal=True)
    o8 = torch.empty(2, 1, 4, 32, dtype=t8)
    lk.flash_attn_with_kvcache(q4, k4, k4, cache_seqlens=lens, causal=True, out=o8, output_scale=torch.tensor([0.01]))
    want = (f32 / 0.01).clamp(-FMAX[ot], FMAX[ot]).to(t8)
    assert torch.equal(o8.view(torch.uint8), want.view(torch.uint8))
    o5, _ = torch.ops.llmkern.flash_attn_with_kvcache(q4, k4, k4, cache_seqlens=lens, causal=True,
                                                      output_scale=torch.tensor([0.01]))
    assert o5.dtype == torch.float8_e4m3fn
    with pytest.raises(lk.LlmkernError, match="output_scale"):
        lk.flash_attn_with_kvcache(q4, k4, k4, cache_seqlens=lens, out=o8, output_scale=torch.tensor([-1.0]))
