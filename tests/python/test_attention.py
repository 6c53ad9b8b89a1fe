"""merge_attn_states (vLLM's [heads, tokens] LSE), causal_softmax, flash_attn_varlen_func
(dense varlen, paged ND/NZ, GQA, masks, softcap, LSE) and mla_prefix_prefill against
float64 NumPy references."""
import math

import numpy as np
import pytest

import llmkern as lk
from helpers import NP_DTYPES, close, f64, rand, to_nz, torch_or_skip

# ---------------------------------------------------------------- merge_attn_states


def ref_merge(a, la, b, lb):
    """a, b [T, H, D]; la, lb [H, T] -> out [T, H, D], lse [H, T] (SPEC rules)."""
    a, b, la, lb = f64(a), f64(b), f64(la), f64(lb)
    fa, fb = np.isfinite(la), np.isfinite(lb)
    m = np.maximum(np.where(fa, la, -np.inf), np.where(fb, lb, -np.inf))
    ms = np.where(np.isfinite(m), m, 0.0)
    wa = np.where(fa, np.exp(np.where(fa, la, 0) - ms), 0.0)
    wb = np.where(fb, np.exp(np.where(fb, lb, 0) - ms), 0.0)
    s = wa + wb
    with np.errstate(invalid="ignore", divide="ignore"):
        out = (wa.T[..., None] * np.where(fa.T[..., None], a, 0) + wb.T[..., None] * np.where(fb.T[..., None], b, 0)) / s.T[..., None]
        lse = m + np.log(s)
    out = np.where(s.T[..., None] > 0, out, 0.0)
    lse = np.where(s > 0, lse, -np.inf)
    return out, lse


@pytest.mark.parametrize("sdt", NP_DTYPES)
@pytest.mark.parametrize("odt", NP_DTYPES)
def test_merge_attn_states(rng, sdt, odt):
    T, H, D = 6, 3, 20
    a, b = rand(rng, (T, H, D), sdt), rand(rng, (T, H, D), sdt)
    la, lb = rand(rng, (H, T), np.float32, 2.0), rand(rng, (H, T), np.float32, 2.0)
    la[0, 1] = -np.inf  # an empty prefix state
    lb[2, 3] = -np.inf
    la[1, 4] = lb[1, 4] = -np.inf  # both empty
    out = np.full((T, H, D), np.nan, odt)
    out_lse = np.full((H, T), np.nan, np.float32)
    lk.merge_attn_states(out, a, la, b, lb, out_lse)
    want, want_lse = ref_merge(a, la, b, lb)
    close(out, want)
    np.testing.assert_allclose(out_lse, want_lse, rtol=1e-6, atol=1e-6)
    assert np.all(out[4, 1] == 0) and out_lse[1, 4] == -np.inf
    out2 = np.empty((T, H, D), odt)
    lk.merge_attn_states(out2, a, la, b, lb)  # output_lse None
    assert np.array_equal(out, out2)


def test_merge_attn_states_strided_and_errors(rng):
    T, H, D = 4, 2, 8
    buf = rand(rng, (T, 2, H, D), np.float32)
    a, b = buf[:, 0], buf[:, 1]
    lse_buf = rand(rng, (2, H, T), np.float32)  # [2, H, T]: two LSEs in one buffer
    la, lb = lse_buf[0], lse_buf[1]
    out = np.empty((T, H, D), np.float32)
    lk.merge_attn_states(out, a, la, b, lb)
    close(out, ref_merge(a, la, b, lb)[0])
    with pytest.raises(lk.LlmkernError) as e:
        lk.merge_attn_states(out, a, la[:, :3], b, lb)  # prefix_lse of the wrong length
    assert "lk_merge_attn_states" in str(e.value) and "prefix_lse" in str(e.value)  # vLLM's name, not C's lse_a
    with pytest.raises(lk.LlmkernError) as e:
        lk.merge_attn_states(out, a, la.astype(np.float16), b, lb)
    assert e.value.status == "LK_ERR_DTYPE"


def test_merge_attn_states_torch_bf16(rng):
    torch = torch_or_skip()
    T, H, D = 5, 4, 64
    a = torch.from_numpy(rand(rng, (T, H, D), np.float32)).to(torch.bfloat16)
    b = torch.from_numpy(rand(rng, (T, H, D), np.float32)).to(torch.bfloat16)
    la, lb = torch.randn(H, T), torch.randn(H, T)
    out = torch.empty((T, H, D), dtype=torch.bfloat16)
    out_lse = torch.empty((H, T))
    lk.merge_attn_states(out, a, la, b, lb, out_lse)
    want, want_lse = ref_merge(a, la, b, lb)
    close(out, want)
    np.testing.assert_allclose(out_lse.numpy(), want_lse, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- causal_softmax


def ref_causal_softmax(x):
    x = f64(x)
    q, k = x.shape[-2:]
    vis = np.arange(k)[None, :] <= np.arange(q)[:, None] + (k - q)
    s = np.where(vis, x, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.where(vis, np.exp(s - m), 0.0)
    tot = e.sum(axis=-1, keepdims=True)
    return np.where(tot > 0, e / np.where(tot > 0, tot, 1.0), 0.0)


@pytest.mark.parametrize("dt", NP_DTYPES)
def test_causal_softmax(rng, dt):
    x = rand(rng, (2, 3, 5, 9), dt, 3.0)
    out = np.empty_like(x)
    lk.causal_softmax(out, x)
    close(out, ref_causal_softmax(x))
    xt = rand(rng, (9, 5), dt).T  # non-contiguous [5, 9], and q_len > k_len rows
    o2 = np.empty((5, 9), np.float32)
    lk.causal_softmax(o2, xt)
    close(o2, ref_causal_softmax(xt))
    x2 = rand(rng, (6, 4), np.float32)
    want = ref_causal_softmax(x2)
    lk.causal_softmax(x2, x2)  # in place
    close(x2, want)
    assert np.all(x2[:2] == 0)  # rows that see no key
    with pytest.raises(lk.LlmkernError) as e:
        lk.causal_softmax(np.empty((5, 8), np.float32), xt)
    assert "lk_causal_softmax" in str(e.value) and e.value.status == "LK_ERR_SHAPE"


# ---------------------------------------------------------------- flash_attn_varlen_func


def ref_attention(q, k, v, cu_q, k_lens, k_starts, scale, causal, window, softcap):
    """Dense float64 reference. k, v [Tk, Hk, D] rows of request b start at k_starts[b]."""
    q, k, v = f64(q), f64(k), f64(v)
    Tq, Hq, _ = q.shape
    Hk, Dv = k.shape[1], v.shape[2]
    out = np.zeros((Tq, Hq, Dv))
    lse = np.full((Hq, Tq), -np.inf)
    left, right = window
    if causal:
        right = 0
    for b in range(len(cu_q) - 1):
        q0, q1 = int(cu_q[b]), int(cu_q[b + 1])
        lq, lk_ = q1 - q0, int(k_lens[b])
        kb = k[k_starts[b]:k_starts[b] + lk_]
        vb = v[k_starts[b]:k_starts[b] + lk_]
        off = lk_ - lq
        i = np.arange(lq)[:, None]
        j = np.arange(lk_)[None, :]
        vis = np.ones((lq, lk_), bool)
        if left >= 0:
            vis &= j >= i + off - left
        if right >= 0:
            vis &= j <= i + off + right
        for h in range(Hq):
            kh = h // (Hq // Hk)
            s = q[q0:q1, h] @ kb[:, kh].T * scale
            if softcap > 0:
                s = softcap * np.tanh(s / softcap)
            s = np.where(vis, s, -np.inf)
            m = s.max(axis=1, keepdims=True) if lk_ else np.full((lq, 1), -np.inf)
            ms = np.where(np.isfinite(m), m, 0.0)
            e = np.where(vis, np.exp(s - ms), 0.0)
            tot = e.sum(axis=1, keepdims=True)
            ok = tot[:, 0] > 0
            out[q0:q1, h][ok] = (e @ vb[:, kh])[ok] / tot[ok]
            lse[h, q0:q1][ok] = (ms + np.log(np.where(tot > 0, tot, 1.0)))[ok, 0]
    return out, lse


def varlen_inputs(rng, dt, q_lens, k_lens, Hq=4, Hk=2, Dqk=32, Dv=32):
    cu_q = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(k_lens)]).astype(np.int32)
    q = rand(rng, (cu_q[-1], Hq, Dqk), dt)
    k = rand(rng, (cu_k[-1], Hk, Dqk), dt)
    v = rand(rng, (cu_k[-1], Hk, Dv), dt)
    return q, k, v, cu_q, cu_k


@pytest.mark.parametrize("dt", NP_DTYPES)
@pytest.mark.parametrize("causal,window,softcap", [(False, (-1, -1), 0.0), (True, (-1, -1), 0.0),
                                                   (True, (3, -1), 0.0), (False, (2, 1), 5.0)])
def test_flash_attn_dense(rng, dt, causal, window, softcap):
    q_lens, k_lens = [3, 1, 0, 6], [5, 1, 4, 4]  # incl. an empty request and q_len > k_len
    q, k, v, cu_q, cu_k = varlen_inputs(rng, dt, q_lens, k_lens)
    out, lse = lk.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(q_lens), max(k_lens),
                                         causal=causal, window_size=window, softcap=softcap,
                                         return_softmax_lse=True)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert lse.dtype == np.float32 and lse.shape == (q.shape[1], q.shape[0])
    want, want_lse = ref_attention(q, k, v, cu_q, k_lens, cu_k[:-1], 1 / math.sqrt(32),
                                   causal, window, softcap)
    close(out, want, 2.0)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-4, atol=1e-4)


def test_flash_attn_out_given_mla_dims_and_scale(rng):
    # Dqk != Dv (MLA 192/128 shape, scaled down), MQA, explicit scale, out passed in
    q, k, v, cu_q, cu_k = varlen_inputs(rng, np.float32, [4, 2], [4, 7], Hq=4, Hk=1, Dqk=48, Dv=16)
    out_buf = np.full((q.shape[0], 4, 20), 7.0, np.float32)
    out = out_buf[:, :, 2:18]
    r = lk.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 4, 7, softmax_scale=0.3, causal=True, out=out)
    assert r is out
    assert np.all(out_buf[..., :2] == 7.0) and np.all(out_buf[..., 18:] == 7.0)
    want, _ = ref_attention(q, k, v, cu_q, [4, 7], cu_k[:-1], 0.3, True, (-1, -1), 0.0)
    close(out, want, 2.0)


def test_flash_attn_noncontiguous_qkv(rng):
    # q, k, v as head slices of one fused [T, 3, H, D] buffer (self-attention prefill)
    T, H, D = 9, 2, 16
    qkv = rand(rng, (T, 3, H, D), np.float32)
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    cu = np.array([0, 4, 9], np.int32)
    out = lk.flash_attn_varlen_func(q, k, v, cu, cu, 5, 5, causal=True)
    want, _ = ref_attention(q, k, v, cu, [4, 5], cu[:-1], 1 / math.sqrt(D), True, (-1, -1), 0.0)
    close(out, want, 2.0)


def paged_from_dense(rng, k, v, k_lens, k_starts, BS, NB):
    """Scatter each request's keys into random pages: ND caches + block_table."""
    Hk, Dqk, Dv = k.shape[1], k.shape[2], v.shape[2]
    kc = rand(rng, (NB, BS, Hk, Dqk), k.dtype)  # garbage in unused slots
    vc = rand(rng, (NB, BS, Hk, Dv), v.dtype)
    maxp = max(1, max((n + BS - 1) // BS for n in k_lens))
    perm = rng.permutation(NB)
    table = np.zeros((len(k_lens), maxp), np.int32)
    used = 0
    for b, n in enumerate(k_lens):
        for p in range((n + BS - 1) // BS):
            table[b, p] = perm[used]
            used += 1
        for t in range(n):
            kc[table[b, t // BS], t % BS] = k[k_starts[b] + t]
            vc[table[b, t // BS], t % BS] = v[k_starts[b] + t]
    return kc, vc, table


@pytest.mark.parametrize("layout", ["ND", "NZ"])
@pytest.mark.parametrize("dt", NP_DTYPES)
def test_flash_attn_paged(rng, layout, dt):
    q_lens, k_lens = [1, 3, 2], [9, 3, 0]  # decode, chunked prefill, empty KV
    q, k, v, cu_q, cu_k = varlen_inputs(rng, dt, q_lens, k_lens, Hq=4, Hk=2, Dqk=32, Dv=16)
    kc, vc, table = paged_from_dense(rng, k, v, k_lens, cu_k[:-1], BS=4, NB=7)
    if layout == "NZ":
        kc, vc = to_nz(kc), to_nz(vc)
    seqused = np.array(k_lens, np.int32)
    out, lse = lk.flash_attn_varlen_func(q, kc, vc, cu_q, None, 3, 9, causal=True,
                                         return_softmax_lse=True, block_table=table,
                                         seqused_k=seqused, kv_layout=layout)
    assert out.shape == (q.shape[0], 4, 16)
    want, want_lse = ref_attention(q, k, v, cu_q, k_lens, cu_k[:-1], 1 / math.sqrt(32), True,
                                   (-1, -1), 0.0)
    close(out, want, 2.0)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-4, atol=1e-4)
    assert np.all(out[cu_q[2]:] == 0) and np.all(lse[:, cu_q[2]:] == -np.inf)


def test_flash_attn_errors(rng):
    q, k, v, cu_q, cu_k = varlen_inputs(rng, np.float32, [2], [3])
    kc, vc, table = paged_from_dense(rng, k, v, [3], [0], BS=2, NB=3)
    with pytest.raises(lk.LlmkernError) as e:  # paged without seqused_k
        lk.flash_attn_varlen_func(q, kc, vc, cu_q, None, 2, 3, block_table=table)
    assert e.value.status == "LK_ERR_NULL" and "seqused_k" in str(e.value)
    assert "lk_flash_attn_varlen" in str(e.value)
    with pytest.raises(lk.LlmkernError) as e:  # a page index outside the cache
        lk.flash_attn_varlen_func(q, kc, vc, cu_q, None, 2, 3, block_table=table + 5,
                                  seqused_k=np.array([3], np.int32))
    assert e.value.status == "LK_ERR_INDEX" and "block_table" in str(e.value)
    with pytest.raises(lk.LlmkernError) as e:
        lk.flash_attn_varlen_func(q, k, v, cu_q, np.array([0, 4], np.int32), 2, 4)
    assert "cu_seqlens_k" in str(e.value)
    with pytest.raises(ValueError, match=r"out: shape \(2, 4, 31\), last dim must be v's head dim 32"):
        lk.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 2, 3, out=np.empty((2, 4, 31), np.float32))
    with pytest.raises(lk.LlmkernError) as e:  # tokens wrong: C's check, named as out
        lk.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 2, 3, out=np.empty((3, 4, 32), np.float32))
    assert e.value.status == "LK_ERR_SHAPE" and "out" in str(e.value)
    for kw in ({"dropout_p": 0.1},):
        with pytest.raises(NotImplementedError):
            lk.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 2, 3, **kw)
    with pytest.raises(ValueError, match="layout"):
        lk.flash_attn_varlen_func(q, kc, vc, cu_q, None, 2, 3, block_table=table,
                                  seqused_k=np.array([3], np.int32), kv_layout="HND")


@pytest.mark.parametrize("dt", ["float32", "bfloat16"])
def test_flash_attn_torch(rng, dt):
    torch = torch_or_skip()
    tdt = getattr(torch, dt)
    q, k, v, cu_q, cu_k = varlen_inputs(rng, np.float32, [5, 3], [5, 8], Hq=4, Hk=2, Dqk=64, Dv=64)
    tq, tk, tv = (torch.from_numpy(a).to(tdt) for a in (q, k, v))
    out, lse = lk.flash_attn_varlen_func(tq, tk, tv, torch.from_numpy(cu_q), torch.from_numpy(cu_k),
                                         5, 8, causal=True, return_softmax_lse=True)
    assert isinstance(out, torch.Tensor) and out.dtype == tdt and lse.dtype == torch.float32
    assert lse.shape == (4, 8)
    want, want_lse = ref_attention(tq, tk, tv, cu_q, [5, 8], cu_k[:-1], 1 / 8.0, True, (-1, -1), 0.0)
    close(out, want, 2.0)
    np.testing.assert_allclose(lse.numpy(), want_lse, rtol=1e-4, atol=1e-4)
    # torch's SDPA on request 1 (bottom-right causal: 3 queries over 8 keys)
    F = torch.nn.functional
    qq = tq[5:].float().transpose(0, 1)
    kk = tk[5:].float().repeat_interleave(2, dim=1).transpose(0, 1)
    vv = tv[5:].float().repeat_interleave(2, dim=1).transpose(0, 1)
    mask = torch.ones(3, 8, dtype=torch.bool).tril(diagonal=5)
    ref = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask).transpose(0, 1)
    tol = 1e-4 if dt == "float32" else 3e-2
    torch.testing.assert_close(out[5:].float(), ref, rtol=tol, atol=tol)


# ---------------------------------------------------------------- mla_prefix_prefill


def ref_mla_prefill(q, k, v, cu_q, prefix_lens, block_table, nd_cache, w, dl, scale):
    """Dense reference: per request, keys/values = [projected prefix | current]."""
    q, k, v, nd_cache, w = f64(q), f64(k), f64(v), f64(nd_cache), f64(w)
    H, Dv = v.shape[1], v.shape[2]
    dn = w.shape[0] // H - Dv
    bs = nd_cache.shape[1]
    ks, vs, k_lens, k_starts = [], [], [], []
    start = 0
    for b in range(len(cu_q) - 1):
        P = int(prefix_lens[b])
        t = np.arange(P)
        ent = nd_cache[block_table[b, t // bs], t % bs]  # [P, Dl + Dr]
        proj = (ent[:, :dl] @ w.T).reshape(P, H, dn + Dv)
        kpe = np.broadcast_to(ent[:, None, dl:], (P, H, ent.shape[1] - dl))
        kb = np.concatenate([np.concatenate([proj[..., :dn], kpe], axis=2), k[cu_q[b]:cu_q[b + 1]]])
        vb = np.concatenate([proj[..., dn:], v[cu_q[b]:cu_q[b + 1]]])
        ks.append(kb)
        vs.append(vb)
        k_lens.append(len(kb))
        k_starts.append(start)
        start += len(kb)
    return ref_attention(q, np.concatenate(ks), np.concatenate(vs), cu_q, k_lens, k_starts,
                         scale, True, (-1, -1), 0.0)[0]


def mla_inputs(rng, dt, H=2, Dn=16, Dr=16, Dv=16, Dl=32, BS=4):
    q_lens, prefix_lens = [3, 2, 1], np.array([5, 0, 9], np.int32)
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    T = int(cu[-1])
    q = rand(rng, (T, H, Dn + Dr), dt)
    k = rand(rng, (T, H, Dn + Dr), dt)
    k[:, 1, Dn:] = k[:, 0, Dn:]  # k_rope is shared by the heads
    v = rand(rng, (T, H, Dv), dt)
    nd = rand(rng, (7, BS, Dl + Dr), dt)
    table = np.array([[6, 2, 0], [0, 0, 0], [1, 3, 5]], np.int32)
    w = rand(rng, (H * (Dn + Dv), Dl), dt, 1.0 / math.sqrt(Dl))
    return q, k, v, cu, prefix_lens, table, nd, w, Dl


def _need_mla_prefill():
    from helpers import c_op_missing
    if c_op_missing("mla_prefix_prefill"):
        pytest.skip("lk_mla_prefix_prefill is not in this libllmkern")


@pytest.mark.parametrize("strategy", ["auto", "split_merge", "concat", "fused", "absorbed"])
@pytest.mark.parametrize("layout", ["ND", "NZ"])
def test_mla_prefix_prefill(rng, strategy, layout):
    _need_mla_prefill()
    q, k, v, cu, plens, table, nd, w, dl = mla_inputs(rng, np.float32)
    cache = to_nz(nd) if layout == "NZ" else nd
    out = lk.mla_prefix_prefill(q, k, v, cu, plens, table, cache, w, 0.2, kv_layout=layout,
                                strategy=strategy)
    assert out.shape == (q.shape[0], 2, 16) and out.dtype == np.float32
    close(out, ref_mla_prefill(q, k, v, cu, plens, table, nd, w, dl, 0.2), 20.0)
    trace = lk.mla_last_trace()
    assert trace.startswith("strategy=") and (strategy == "auto" or strategy in trace)


def test_mla_prefix_prefill_f16_out_given_and_errors(rng):
    _need_mla_prefill()
    q, k, v, cu, plens, table, nd, w, dl = mla_inputs(rng, np.float16)
    out = np.full((q.shape[0], 2, 16), np.nan, np.float16)
    assert lk.mla_prefix_prefill(q, k, v, cu, plens, table, nd, w, 0.2, out=out) is out
    close(out, ref_mla_prefill(q, k, v, cu, plens, table, nd, w, dl, 0.2), 2.0)
    with pytest.raises(lk.LlmkernError) as e:  # a prefix longer than its block table row
        lk.mla_prefix_prefill(q, k, v, cu, np.array([5, 0, 13], np.int32), table, nd, w, 0.2)
    assert "lk_mla_prefix_prefill" in str(e.value) and "prefix_lens" in str(e.value)
    with pytest.raises(ValueError, match="strategy"):
        lk.mla_prefix_prefill(q, k, v, cu, plens, table, nd, w, 0.2, strategy="magic")


def test_mla_prefix_prefill_missing_c_raises_not_implemented(monkeypatch):
    """Against a library without lk_mla_prefix_prefill (older build) the binding raises
    NotImplementedError naming it."""
    from llmkern import _lib
    monkeypatch.setattr(_lib, "mla_prefix_prefill", _lib._missing("lk_mla_prefix_prefill"))
    z = np.zeros((1, 1, 8), np.float32)
    with pytest.raises(NotImplementedError, match="lk_mla_prefix_prefill"):
        lk.mla_prefix_prefill(z, z, z, np.array([0, 1], np.int32), np.zeros(1, np.int32),
                              np.zeros((1, 1), np.int32), np.zeros((1, 1, 8), np.float32),
                              np.zeros((16, 4), np.float32), 0.1)
