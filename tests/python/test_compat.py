"""Engine compatibility: the argument forms vLLM and flash-attention use, called exactly
as they write them, against float64 NumPy references; bad inputs raise naming the
argument and leave every buffer unchanged."""
import math

import numpy as np
import pytest

import llmkern as lk
from helpers import NP_DTYPES, close, f64, rand, rope_ref, torch_or_skip
from test_attention import paged_from_dense, ref_attention, ref_merge, varlen_inputs
from test_rope_cache import cos_sin, ref_rope


def ref_rms(x, w, eps):
    x = f64(x)
    r = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
    return r if w is None else r * f64(w)


def snap(*xs):
    return [np.array(f64(x), copy=True) for x in xs]


def unchanged(before, *xs):
    return all(np.array_equal(b, f64(x), equal_nan=True) for b, x in zip(before, xs))


# ---------------------------------------------------------------- 1. weightless RMSNorm


@pytest.mark.parametrize("dt", NP_DTYPES)
def test_rms_norm_weight_none(rng, dt):
    x = rand(rng, (5, 96), dt)
    out = np.empty_like(x)
    lk.rms_norm(out, x, None, 1e-6)  # vLLM: rms_norm(out, input, None, epsilon)
    close(out, ref_rms(x, None, 1e-6))
    ones = np.ones(96, np.float32)
    o2 = np.empty_like(x)
    lk.rms_norm(o2, x, ones, 1e-6)
    assert np.array_equal(out, o2)  # bit for bit the product with a weight of ones


@pytest.mark.parametrize("dt", NP_DTYPES)
def test_fused_add_rms_norm_weight_none(rng, dt):
    x, res = rand(rng, (40, 72), dt), rand(rng, (40, 72), dt)
    want_res = (f64(x) + f64(res)).astype(dt)
    want_x = ref_rms(want_res, None, 1e-5)
    lk.fused_add_rms_norm(x, res, None, 1e-5)  # vLLM: fused_add_rms_norm(input, residual, None, eps)
    assert np.array_equal(res, want_res)
    close(x, want_x)


def test_rms_norm_weight_none_torch_bf16_and_bad_out(rng):
    torch = torch_or_skip()
    x = torch.randn(3, 64).to(torch.bfloat16)
    out = torch.empty_like(x)
    lk.rms_norm(out, x, None, 1e-6)
    close(out, ref_rms(x, None, 1e-6))
    bad = torch.full((3, 63), 7.0, dtype=torch.bfloat16)
    with pytest.raises(lk.LlmkernError) as e:
        lk.rms_norm(bad, x, None, 1e-6)
    assert "out" in str(e.value) and e.value.status == "LK_ERR_SHAPE"
    assert torch.all(bad == 7.0)


# ---------------------------------------------------------------- 2. batched rotary


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("four_d", [False, True])
def test_rotary_batched(rng, neox, four_d):
    B, S, Hq, Hk, D, rot, P = 2, 3, 4, 2, 16, 16, 32
    pos = rng.integers(0, P, (B, S)).astype(np.int64)
    cache = cos_sin(P, rot, np.float32)
    if four_d:  # [B, S, H, D]
        q, k = rand(rng, (B, S, Hq, D), np.float32), rand(rng, (B, S, Hk, D), np.float32)
    else:  # [B, S, H * D], column slices of one fused qkv buffer
        qkv = rand(rng, (B, S, (Hq + 2 * Hk) * D), np.float32)
        q, k = qkv[..., :Hq * D], qkv[..., Hq * D:(Hq + Hk) * D]
    want_q = ref_rope(pos.reshape(-1), q.reshape(B * S, -1), D, cache, neox).reshape(q.shape)
    want_k = ref_rope(pos.reshape(-1), k.reshape(B * S, -1), D, cache, neox).reshape(k.shape)
    lk.rotary_embedding(pos, q, k, D, cache, neox)
    close(q, want_q)
    close(k, want_k)


def test_rotary_batched_torch_key_none(rng):
    torch = torch_or_skip()
    B, S, H, D, P = 2, 5, 3, 32, 64
    pos = torch.randint(0, P, (B, S))
    cache = torch.from_numpy(cos_sin(P, D, np.float32))
    q = torch.randn(B, S, H * D).to(torch.bfloat16)
    want = ref_rope(pos.reshape(-1).numpy(), q.reshape(B * S, -1), D, cache, True).reshape(B, S, -1)
    lk.rotary_embedding(pos, q, None, D, cache, True)
    close(q, want)


def test_rotary_batched_errors(rng):
    B, S, H, D, P = 2, 3, 2, 8, 16
    cache = cos_sin(P, D, np.float32)
    q = rand(rng, (B, S, H * D), np.float32)
    before = snap(q)
    with pytest.raises(lk.LlmkernError) as e:  # a position outside the cache
        lk.rotary_embedding(np.array([[0, 1, 2], [3, 4, 99]]), q, None, D, cache, True)
    assert "positions" in str(e.value) and e.value.status == "LK_ERR_INDEX"
    with pytest.raises(lk.LlmkernError) as e:  # positions [B, S] but q of another batch
        lk.rotary_embedding(np.zeros((3, 3), np.int64), q, None, D, cache, True)
    assert "lk_rotary_embedding" in str(e.value)
    with pytest.raises(ValueError, match="query"):  # [B, S] dims that cannot merge
        lk.rotary_embedding(np.zeros((B, S), np.int64), rand(rng, (S, B, H * D), np.float32).transpose(1, 0, 2),
                            None, D, cache, True)
    with pytest.raises(ValueError, match="query"):  # positions [B, S] with a 2-D query
        lk.rotary_embedding(np.zeros((B, S), np.int64), q[0], None, D, cache, True)
    assert unchanged(before, q)


# ---------------------------------------------------------------- 3. "auto" ignores scales


def test_reshape_and_cache_flash_auto_scales(rng):
    torch = torch_or_skip()
    T, H, D, NB, BS = 6, 4, 16, 5, 4
    key, value = torch.randn(T, H, D), torch.randn(T, H, D)
    kc, vc = torch.zeros(NB, BS, H, D), torch.zeros(NB, BS, H, D)
    slots = torch.tensor([3, 0, 17, -1, 9, 8])
    for ks, vs in ((torch.tensor(0.25), torch.tensor([2.0])), (torch.rand(H) + 0.5, torch.rand(H) + 0.5),
                   (0.5, 3.0)):
        kc.zero_(), vc.zero_()
        lk.reshape_and_cache_flash(key, value, kc, vc, slots, "auto", ks, vs)
        for t, s in enumerate(slots.tolist()):
            if s >= 0:
                assert torch.equal(kc[s // BS, s % BS], key[t]) and torch.equal(vc[s // BS, s % BS], value[t])
    before = snap(kc, vc)
    with pytest.raises(ValueError, match="k_scale"):  # neither one element nor [H]
        lk.reshape_and_cache_flash(key, value, kc, vc, slots, "auto", torch.ones(H + 1), torch.ones(H))
    with pytest.raises(ValueError, match="v_scale"):
        lk.reshape_and_cache_flash(key, value, kc, vc, slots, "auto", torch.ones(1), torch.ones(2, H))
    with pytest.raises(NotImplementedError, match="kv_cache_dtype"):
        lk.reshape_and_cache_flash(key, value, kc, vc, slots, "int8", torch.ones(1), torch.ones(1))
    assert unchanged(before, kc, vc)


def test_concat_and_cache_mla_auto_scale(rng):
    T, Dl, Dr, NB, BS = 4, 32, 16, 3, 4
    kv_c, k_pe = rand(rng, (T, Dl), np.float32), rand(rng, (T, Dr), np.float32)
    cache = np.zeros((NB, BS, Dl + Dr), np.float32)
    slots = np.array([5, 0, -1, 11], np.int64)
    lk.concat_and_cache_mla(kv_c, k_pe, cache, slots, "auto", np.array([0.125], np.float32))
    for t, s in enumerate(slots):
        if s >= 0:
            assert np.array_equal(cache[s // BS, s % BS], np.concatenate([kv_c[t], k_pe[t]]))
    before = snap(cache)
    with pytest.raises(ValueError, match="scale"):
        lk.concat_and_cache_mla(kv_c, k_pe, cache, slots, "auto", np.ones(2, np.float32))
    assert unchanged(before, cache)


# ---------------------------------------------------------------- 4. flash-attention 2's paged form


@pytest.mark.parametrize("dt", NP_DTYPES)
def test_flash_attn_block_table_cu_seqlens_k(rng, dt):
    q_lens, k_lens = [1, 3, 2], [9, 3, 0]
    q, k, v, cu_q, cu_k = varlen_inputs(rng, dt, q_lens, k_lens)
    kc, vc, table = paged_from_dense(rng, k, v, k_lens, cu_k[:-1], BS=4, NB=7)
    # flash-attention 2: paged K/V with the key lengths in cu_seqlens_k
    out, lse, probs = lk.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, max(q_lens), max(k_lens),
                                                causal=True, return_attn_probs=True, block_table=table)
    assert probs is None and lse.shape == (q.shape[1], q.shape[0])
    want, want_lse = ref_attention(q, k, v, cu_q, k_lens, cu_k[:-1], 1 / math.sqrt(32), True, (-1, -1), 0.0)
    close(out, want, 2.0)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-4, atol=1e-4)
    # vLLM's form (seqused_k, no cu_seqlens_k) gives the same bits
    o2 = lk.flash_attn_varlen_func(q, kc, vc, cu_q, None, 3, 9, causal=True, block_table=table,
                                   seqused_k=np.array(k_lens, np.int32))
    assert np.array_equal(out, o2)


def test_flash_attn_return_attn_probs_dense_torch(rng):
    torch = torch_or_skip()
    q, k, v, cu_q, cu_k = varlen_inputs(rng, np.float32, [3, 2], [4, 5])
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
    r = lk.flash_attn_varlen_func(tq, tk, tv, torch.from_numpy(cu_q), torch.from_numpy(cu_k), 3, 5,
                                  dropout_p=0.0, causal=True, return_attn_probs=True)
    assert len(r) == 3 and r[2] is None
    want, want_lse = ref_attention(q, k, v, cu_q, [4, 5], cu_k[:-1], 1 / math.sqrt(32), True, (-1, -1), 0.0)
    close(r[0], want, 2.0)
    np.testing.assert_allclose(r[1].numpy(), want_lse, rtol=1e-4, atol=1e-4)


def test_flash_attn_block_table_cu_seqlens_k_errors(rng):
    q, k, v, cu_q, cu_k = varlen_inputs(rng, np.float32, [2, 1], [3, 4])
    kc, vc, table = paged_from_dense(rng, k, v, [3, 4], cu_k[:-1], BS=2, NB=6)
    out = np.full((3, 4, 32), 5.0, np.float32)
    with pytest.raises(ValueError, match="cu_seqlens_k"):  # decreasing
        lk.flash_attn_varlen_func(q, kc, vc, cu_q, np.array([0, 3, 2], np.int32), 2, 4, block_table=table, out=out)
    with pytest.raises(lk.LlmkernError) as e:  # lengths beyond the block table's pages
        lk.flash_attn_varlen_func(q, kc, vc, cu_q, np.array([0, 3, 40], np.int32), 2, 4, block_table=table, out=out)
    assert "seqused_k" in str(e.value)
    assert np.all(out == 5.0)


# ---------------------------------------------------------------- 7. merge_attn_states forms


def test_merge_prefill_tokens_with_context_and_output_lse(rng):
    torch = torch_or_skip()
    T, H, D, N = 7, 3, 32, 4
    p_out, s_out = torch.randn(T, H, D).half(), torch.randn(T, H, D).half()
    p_lse, s_lse = torch.randn(H, T), torch.randn(H, T)
    p_lse[:, N:] = float("nan")  # tokens >= N have no prefix state: never read
    s_lse[1, N + 1] = -float("inf")  # copied as it is
    output = torch.empty(T, H, D, dtype=torch.half)
    output_lse = torch.empty(H, T)
    lk.merge_attn_states(output=output, prefix_output=p_out, prefix_lse=p_lse, suffix_output=s_out,
                         suffix_lse=s_lse, output_lse=output_lse, prefill_tokens_with_context=N)
    want, want_lse = ref_merge(p_out[:N], p_lse[:, :N], s_out[:N], s_lse[:, :N])
    close(output[:N], want)
    np.testing.assert_allclose(output_lse[:, :N].numpy(), want_lse, rtol=1e-6, atol=1e-6)
    assert torch.equal(output[N:], s_out[N:])
    assert torch.equal(output_lse[:, N:], s_lse[:, N:])
    # None: every token merges (the plain call)
    o2 = torch.empty_like(output)
    lk.merge_attn_states(o2[:N], p_out[:N], p_lse[:, :N], s_out[:N], s_lse[:, :N], prefill_tokens_with_context=None)
    assert torch.equal(o2[:N], output[:N])


@pytest.mark.parametrize("n", [0, 5])
def test_merge_prefill_tokens_edges_numpy(rng, n):
    T, H, D = 5, 2, 8
    a, b = rand(rng, (T, H, D), np.float32), rand(rng, (T, H, D), np.float32)
    la, lb = rand(rng, (H, T), np.float32), rand(rng, (H, T), np.float32)
    out, out_lse = np.empty((T, H, D), np.float16), np.empty((H, T), np.float32)
    lk.merge_attn_states(out, a, la, b, lb, out_lse, prefill_tokens_with_context=n)
    want, want_lse = ref_merge(a, la, b, lb)
    close(out[:n], want[:n])
    assert np.array_equal(out[n:], b[n:].astype(np.float16)) and np.array_equal(out_lse[:, n:], lb[:, n:])


def test_merge_prefill_tokens_errors(rng):
    T, H, D = 4, 2, 8
    a, b = rand(rng, (T, H, D), np.float32), rand(rng, (T, H, D), np.float32)
    la, lb = rand(rng, (H, T), np.float32), rand(rng, (H, T), np.float32)
    out, out_lse = np.full((T, H, D), 3.0, np.float32), np.full((H, T), 3.0, np.float32)
    before = snap(out, out_lse)
    for n in (-1, 5, 1.5, True):
        with pytest.raises(ValueError, match="prefill_tokens_with_context"):
            lk.merge_attn_states(out, a, la, b, lb, out_lse, prefill_tokens_with_context=n)
    with pytest.raises(ValueError, match="suffix_lse"):
        lk.merge_attn_states(out, a, la, b, lb[:, :3], out_lse, prefill_tokens_with_context=2)
    with pytest.raises(lk.LlmkernError) as e:  # a head count that differs, found by C
        lk.merge_attn_states(out, a, la, b[:, :1], lb, out_lse, prefill_tokens_with_context=2)
    assert "lk_merge_attn_states" in str(e.value)
    with pytest.raises(lk.LlmkernError) as e:
        lk.merge_attn_states(out, a, la, b, lb.astype(np.float16), out_lse, prefill_tokens_with_context=2)
    assert e.value.status == "LK_ERR_DTYPE"
    assert unchanged(before, out, out_lse)


# ---------------------------------------------------------------- 5. more activations


def _sig(g, x):
    with np.errstate(over="ignore"):
        return np.where(g == -np.inf, -0.0, g / (1.0 + np.exp(x)))


def ref_act(name, x, threshold=0.0, alpha=1.702, limit=7.0):
    from math import erf
    x = f64(x)
    d = x.shape[-1] // 2
    g, u = x[..., :d], x[..., d:]
    if name == "gelu_and_mul":
        return 0.5 * g * (1 + np.vectorize(erf)(g / math.sqrt(2))) * u
    if name == "mul_and_silu":
        return g * _sig(u, -u)
    if name == "fatrelu_and_mul":
        return np.where(g > threshold, g, 0.0) * u
    if name == "swigluoai_and_mul":
        g, u = np.minimum(x[..., 0::2], limit), np.clip(x[..., 1::2], -limit, limit)
        return (u + 1) * _sig(g, -alpha * g)
    if name == "gelu_new":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    if name == "gelu_fast":
        return 0.5 * x * (1 + np.tanh(0.7978845608 * x * (1 + 0.044715 * x * x)))
    return _sig(x, -1.702 * x)  # gelu_quick: x * sigmoid(1.702 x)


GATED = ["gelu_and_mul", "mul_and_silu", "fatrelu_and_mul", "swigluoai_and_mul"]
ELEMENTWISE = ["gelu_new", "gelu_fast", "gelu_quick"]


@pytest.mark.parametrize("name", GATED + ELEMENTWISE)
@pytest.mark.parametrize("dt", NP_DTYPES)
def test_activations_numpy(rng, name, dt):
    x = rand(rng, (7, 2 * 45), dt, 3.0)[:, ::1]
    xs = np.concatenate([x, rand(rng, (7, 6), dt)], axis=1)[:, :90]  # rows strided
    d = 45 if name in GATED else 90
    out = np.empty((7, d), dt)
    getattr(lk, name)(out, xs)  # vLLM: ops.<name>(out, x)
    close(out, ref_act(name, xs))


def test_activations_vllm_calls_torch(rng):
    torch = torch_or_skip()
    x = torch.randn(5, 3, 2 * 64) * 4
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        xx = x.to(dt)
        d = xx.shape[-1] // 2
        out = torch.empty(xx.shape[:-1] + (d,), dtype=dt)
        lk.fatrelu_and_mul(out, xx, 0.5)  # fatrelu_and_mul(out, x, threshold)
        close(out, ref_act("fatrelu_and_mul", xx, threshold=0.5))
        lk.swigluoai_and_mul(out, xx, 1.702, 7.0)  # swigluoai_and_mul(out, x, alpha, limit)
        close(out, ref_act("swigluoai_and_mul", xx))
        lk.swigluoai_and_mul(out, xx)
        close(out, ref_act("swigluoai_and_mul", xx))
        lk.gelu_and_mul(out, xx)
        close(out, ref_act("gelu_and_mul", xx))
        lk.mul_and_silu(out, xx)
        close(out, ref_act("mul_and_silu", xx))
        o2 = torch.empty_like(xx)
        for name in ELEMENTWISE:
            getattr(lk, name)(o2, xx)
            close(o2, ref_act(name, xx))


def test_activations_bad_inputs(rng):
    x = rand(rng, (3, 16), np.float32)
    out = np.full((3, 8), 4.0, np.float32)
    for name in GATED:
        with pytest.raises(lk.LlmkernError) as e:
            getattr(lk, name)(np.empty((3, 9), np.float32), x)
        assert ("lk_" + name) in str(e.value) and "out" in str(e.value) and e.value.status == "LK_ERR_SHAPE"
        with pytest.raises(lk.LlmkernError) as e:
            getattr(lk, name)(out, x[:, :15])
        assert "input: last dim" in str(e.value)  # vLLM's name, not C's x
    for name in ELEMENTWISE:
        with pytest.raises(lk.LlmkernError) as e:
            getattr(lk, name)(out, x)
        assert "out" in str(e.value) and e.value.status == "LK_ERR_SHAPE"
    with pytest.raises(lk.LlmkernError) as e:
        lk.fatrelu_and_mul(out, x, float("nan"))
    assert "threshold" in str(e.value) and e.value.status == "LK_ERR_VALUE"
    with pytest.raises(lk.LlmkernError) as e:
        lk.swigluoai_and_mul(out, x, 1.702, -7.0)
    assert "limit" in str(e.value)
    with pytest.raises(lk.LlmkernError) as e:
        lk.swigluoai_and_mul(out, x, 0.0, 7.0)
    assert "alpha" in str(e.value)
    assert np.all(out == 4.0)


# ---------------------------------------------------------------- 6. cache management


def test_swap_blocks_torch(rng):
    torch = torch_or_skip()
    src = torch.randn(8, 16, 2, 32).to(torch.bfloat16)
    dst = torch.randn(5, 16, 2, 32).to(torch.bfloat16)
    mapping = torch.tensor([[7, 0], [2, 4], [3, 1]], dtype=torch.int64)
    want = dst.clone()
    for s, d in mapping.tolist():
        want[d] = src[s]
    lk.swap_blocks(src, dst, mapping)  # vLLM: swap_blocks(src, dst, block_mapping)
    assert torch.equal(dst, want)


@pytest.mark.parametrize("dt", NP_DTYPES)
def test_copy_blocks_numpy(rng, dt):
    L_, NB = 2, 6
    kcs = [rand(rng, (NB, 4, 2, 8), dt) for _ in range(L_)]
    vcs = [rand(rng, (NB, 2, 4, 8), dt).transpose(0, 2, 1, 3) for _ in range(L_)]  # HND views
    mapping = np.array([[0, 3], [0, 4], [1, 5]], np.int64)
    want_k, want_v = [k.copy() for k in kcs], [v.copy() for v in vcs]
    for s, d in mapping:
        for w in want_k + want_v:
            w[d] = w[s]
    lk.copy_blocks(kcs, vcs, mapping)  # vLLM: copy_blocks(key_caches, value_caches, block_mapping)
    assert all(np.array_equal(a, b) for a, b in zip(kcs + vcs, want_k + want_v))


def test_copy_blocks_mla_and_errors(rng):
    kv = [rand(rng, (5, 4, 576 // 8), np.float32) for _ in range(3)]
    mapping = np.array([[1, 4], [0, 2]], np.int32)
    want = [c.copy() for c in kv]
    for s, d in mapping:
        for w in want:
            w[d] = w[s]
    lk.copy_blocks_mla(kv, mapping)
    assert all(np.array_equal(a, b) for a, b in zip(kv, want))
    before = snap(*kv)
    for bad, what in ((np.array([[1, 5]]), "destination block 5"), (np.array([[0, 2], [1, 2]]), "more than once"),
                      (np.array([[0, 2], [2, 3]]), "both a destination and a source"), (np.array([[-1, 2]]), "source")):
        with pytest.raises(lk.LlmkernError) as e:
            lk.copy_blocks_mla(kv, bad)
        assert "block_mapping" in str(e.value) and what in str(e.value) and e.value.status == "LK_ERR_INDEX"
    with pytest.raises(lk.LlmkernError) as e:
        lk.swap_blocks(kv[0], kv[1], np.array([[0, 9]]))
    assert "block_mapping" in str(e.value) and "lk_swap_blocks" in str(e.value)
    with pytest.raises(lk.LlmkernError) as e:
        lk.swap_blocks(kv[0], kv[1].astype(np.float16), np.array([[0, 1]]))
    assert "dst" in str(e.value) and e.value.status == "LK_ERR_DTYPE"
    with pytest.raises(ValueError, match="value_caches"):
        lk.copy_blocks(kv[:2], kv[2:], mapping)
    assert unchanged(before, *kv)


# ---------------------------------------------------------------- 8. flash_attn_with_kvcache, ALiBi


def ref_decode(q, kseq, vseq, scale, causal, window=(-1, -1), softcap=0.0, slopes=None):
    """q [sq, Hq, D], kseq/vseq [L, Hk, D] (the request's whole key sequence) -> out, lse [Hq, sq]."""
    q, kseq, vseq = f64(q), f64(kseq), f64(vseq)
    sq, Hq, _ = q.shape
    L_, Hk = kseq.shape[:2]
    out, lse = np.zeros((sq, Hq, vseq.shape[2])), np.full((Hq, sq), -np.inf)
    off = L_ - sq
    i, j = np.arange(sq)[:, None], np.arange(L_)[None, :]
    vis = np.ones((sq, L_), bool)
    left, right = window
    if causal:
        right = 0
    if left >= 0:
        vis &= j >= i + off - left
    if right >= 0:
        vis &= j <= i + off + right
    for h in range(Hq):
        kh = h // (Hq // Hk)
        s = q[:, h] @ kseq[:, kh].T * scale
        if softcap > 0:
            s = softcap * np.tanh(s / softcap)
        if slopes is not None:
            s = s - slopes[h] * np.abs(i + off - j)
        s = np.where(vis, s, -np.inf)
        m = s.max(axis=1, keepdims=True)
        ok = np.isfinite(m[:, 0])
        e = np.where(vis, np.exp(s - np.where(np.isfinite(m), m, 0)), 0)
        tot = e.sum(axis=1, keepdims=True)
        out[ok, h] = (e @ vseq[:, kh])[ok] / tot[ok]
        lse[h, ok] = (m[:, 0] + np.log(np.where(tot[:, 0] > 0, tot[:, 0], 1)))[ok]
    return out, lse


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("rotary", [None, True, False])
def test_flash_attn_with_kvcache(rng, paged, rotary, causal):
    torch = torch_or_skip()
    B, sq, Hq, Hk, D, S = 3, 2, 4, 2, 32, 24
    q = torch.randn(B, sq, Hq, D)
    k_new, v_new = torch.randn(B, sq, Hk, D), torch.randn(B, sq, Hk, D)
    seqlens = torch.tensor([5, 0, 17], dtype=torch.int32)
    if paged:
        bs, NB = 4, 20
        k_cache, v_cache = torch.randn(NB, bs, Hk, D), torch.randn(NB, bs, Hk, D)
        block_table = torch.from_numpy(rng.permutation(NB)[:B * 6].reshape(B, 6).astype(np.int32))
        batch_idx = None
    else:
        k_cache, v_cache = torch.randn(4, S, Hk, D), torch.randn(4, S, Hk, D)
        block_table, batch_idx = None, torch.tensor([2, 0, 3], dtype=torch.int32)
    cos = sin = None
    if rotary is not None:
        ang = torch.arange(64)[:, None] * (1e-2 * torch.arange(1, 9)[None, :])
        cos, sin = torch.cos(ang), torch.sin(ang)  # rotary_dim 16 of D = 32
    k0, v0, q0, kn0 = k_cache.clone(), v_cache.clone(), q.clone(), k_new.clone()
    out, lse = lk.flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new, rotary_cos=cos, rotary_sin=sin,
                                          cache_seqlens=seqlens, cache_batch_idx=batch_idx, block_table=block_table,
                                          causal=causal, rotary_interleaved=bool(rotary), return_softmax_lse=True)
    assert out.shape == (B, sq, Hq, D) and lse.shape == (B, Hq, sq)
    assert torch.equal(q, q0) and torch.equal(k_new, kn0)  # inputs not modified
    for b in range(B):
        n = int(seqlens[b])

        def seq(cache):
            if paged:
                bs_ = cache.shape[1]
                return torch.cat([cache[block_table[b, p]] for p in range(6)])[: n + sq]
            return cache[batch_idx[b]][: n + sq]
        kn = k_new[b]
        qb = q[b]
        if rotary is not None:
            kn = rope_ref(kn, n + np.arange(sq), cos, sin, rotary)
            # q at cache_seqlens + i when causal (or local), else every query at cache_seqlens
            qb = rope_ref(qb, n + (np.arange(sq) if causal else np.zeros(sq, np.int64)), cos, sin, rotary)
        kseq, vseq = seq(k_cache), seq(v_cache)
        close(kseq[n:], f64(kn))  # appended (and rotated) at cache_seqlens
        assert torch.equal(vseq[n:], v_new[b])
        old = seq(k0)
        assert torch.equal(kseq[:n], old[:n])
        want, want_lse = ref_decode(qb, kseq, vseq, 1 / math.sqrt(D), causal)
        close(out[b], want, 2.0)
        np.testing.assert_allclose(lse[b].numpy(), want_lse, rtol=1e-4, atol=1e-4)


def test_flash_attn_with_kvcache_argument_checks(rng):
    """flash-attention's own checks: rotary needs an append, an append needs cache_seqlens;
    out's head dim against v_cache's, rotary tables covering the positions; nothing written."""
    B, sq, H, D = 2, 1, 2, 16
    q = rand(rng, (B, sq, H, D), np.float32)
    kc, vc = rand(rng, (B, 8, H, D), np.float32), rand(rng, (B, 8, H, D), np.float32)
    kn, vn = rand(rng, (B, 1, H, D), np.float32), rand(rng, (B, 1, H, D), np.float32)
    ang = np.arange(8)[:, None] * 0.1 * np.arange(1, D // 2 + 1)[None, :]
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    k0, v0 = kc.copy(), vc.copy()
    lens = np.array([3, 6], np.int32)
    with pytest.raises(ValueError, match="rotary_cos: with rotary cos / sin the new k and v"):
        lk.flash_attn_with_kvcache(q, kc, vc, rotary_cos=cos, rotary_sin=sin, cache_seqlens=lens)
    with pytest.raises(ValueError, match="cache_seqlens: required with new k and v"):
        lk.flash_attn_with_kvcache(q, kc, vc, kn, vn)
    with pytest.raises(ValueError, match="rotary_cos: 6 rows, the rotary positions reach 7"):
        lk.flash_attn_with_kvcache(q, kc, vc, kn, vn, cos[:6], sin[:6], cache_seqlens=lens)
    out = np.full((B, sq, H, D + 1), 5.0, np.float32)
    with pytest.raises(ValueError, match="out: shape .*last dim must be v_cache's head dim 16"):
        lk.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens, out=out)
    assert np.array_equal(kc, k0) and np.array_equal(vc, v0) and np.all(out == 5.0)
    with pytest.raises(lk.LlmkernError, match="window_size: values must be >= -1"):
        lk.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, window_size=(-2, -2))


def test_flash_attn_with_kvcache_no_append_alibi_window(rng):
    torch = torch_or_skip()
    B, sq, Hq, Hk, D, S = 2, 1, 4, 1, 16, 40
    q = torch.randn(B, sq, Hq, D).to(torch.bfloat16)
    k_cache, v_cache = torch.randn(B, S, Hk, D).to(torch.bfloat16), torch.randn(B, S, Hk, D).to(torch.bfloat16)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    out = lk.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=torch.tensor([33, 7], dtype=torch.int32),
                                     window_size=(8, 0), softcap=10.0, alibi_slopes=slopes)
    for b, n in enumerate((33, 7)):
        want, _ = ref_decode(q[b], k_cache[b, :n], v_cache[b, :n], 1 / 4.0, False, (8, 0), 10.0, f64(slopes))
        close(out[b], want, 2.0)


def test_flash_attn_with_kvcache_errors_restore_cache(rng):
    torch = torch_or_skip()
    B, sq, Hq, Hk, D, S = 2, 3, 2, 2, 8, 10
    q = torch.randn(B, sq, Hq, D)
    k_cache, v_cache = torch.randn(B, S, Hk, D), torch.randn(B, S, Hk, D)
    k_new, v_new = torch.randn(B, sq, Hk, D), torch.randn(B, sq, Hk, D)
    k0, v0 = k_cache.clone(), v_cache.clone()
    out = torch.full((B, sq, Hq, D), 9.0)
    with pytest.raises(lk.LlmkernError) as e:  # bad ALiBi shape: found after the append, which is undone
        lk.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=2,
                                   alibi_slopes=torch.ones(Hq + 1), out=out)
    assert "alibi_slopes" in str(e.value) and e.value.status == "LK_ERR_SHAPE"
    with pytest.raises(ValueError, match="cache_seqlens"):  # 8 + 3 > 10 slots
        lk.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=torch.tensor([1, 8]), out=out)
    with pytest.raises(ValueError, match="cache_batch_idx"):
        lk.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=0,
                                   cache_batch_idx=torch.tensor([0, 2]), out=out)
    with pytest.raises(NotImplementedError, match="cache_leftpad"):
        lk.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=2, cache_leftpad=torch.zeros(2))
    assert torch.equal(k_cache, k0) and torch.equal(v_cache, v0) and torch.all(out == 9.0)


@pytest.mark.parametrize("shape", ["h", "bh"])
def test_flash_attn_varlen_alibi(rng, shape):
    q, k, v, cu_q, cu_k = varlen_inputs(rng, np.float32, [3, 1, 5], [6, 9, 5])
    slopes = (0.5 ** np.arange(1, 5)).astype(np.float32)
    al = slopes if shape == "h" else np.stack([slopes, slopes * 2, slopes / 2])
    out = lk.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 9, causal=True, alibi_slopes=al)
    for b in range(3):
        sl = f64(al if shape == "h" else al[b])
        want, _ = ref_decode(q[cu_q[b]:cu_q[b + 1]], k[cu_k[b]:cu_k[b + 1]], v[cu_k[b]:cu_k[b + 1]],
                             1 / math.sqrt(32), True, slopes=sl)
        close(out[cu_q[b]:cu_q[b + 1]], want, 2.0)
    o = np.full_like(out, 3.0)
    for bad, status in ((np.ones(5, np.float32), "LK_ERR_SHAPE"), (np.ones((2, 4), np.float32), "LK_ERR_SHAPE"),
                        (np.ones(4, np.float16), "LK_ERR_DTYPE"), (np.array([1, np.nan, 1, 1], np.float32), "LK_ERR_VALUE")):
        with pytest.raises(lk.LlmkernError) as e:
            lk.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 9, alibi_slopes=bad, out=o)
        assert "alibi_slopes" in str(e.value) and e.value.status == status
    assert np.all(o == 3.0)


def test_vllm_flash_attn_keywords(rng):
    """vLLM's vllm_flash_attn call: keywords only (max_seqlen_q before cu_seqlens_q in its
    signature), scheduling hints accepted, sinks / q_v refused naming the argument (fp8 descales: test_fp8_attention.py)."""
    q, k, v, cu_q, cu_k = varlen_inputs(rng, np.float32, [2, 3], [4, 5])
    kc, vc, table = paged_from_dense(rng, k, v, [4, 5], cu_k[:-1], BS=4, NB=5)
    out = np.empty_like(q)
    lk.flash_attn_varlen_func(q=q, k=kc, v=vc, out=out, cu_seqlens_q=cu_q, max_seqlen_q=3,
                              seqused_k=np.array([4, 5], np.int32), max_seqlen_k=5, softmax_scale=0.2,
                              causal=True, alibi_slopes=None, window_size=(-1, -1), block_table=table,
                              softcap=0.0, scheduler_metadata=None, fa_version=2, q_descale=None,
                              k_descale=None, v_descale=None, num_splits=0, cu_seqlens_k=None)
    want, _ = ref_attention(q, k, v, cu_q, [4, 5], cu_k[:-1], 0.2, True, (-1, -1), 0.0)
    close(out, want, 2.0)
    for kw in ("s_aux", "q_v"):
        with pytest.raises(NotImplementedError, match=kw):
            lk.flash_attn_varlen_func(q, kc, vc, cu_q, None, 3, 5, block_table=table,
                                      seqused_k=np.array([4, 5], np.int32), **{kw: np.ones(1, np.float32)})
    # output_scale quantizes into an fp8 output (tests/python/test_fp8_act.py); a float
    # output refuses it, naming it
    with pytest.raises(lk.LlmkernError, match="output_scale"):
        lk.merge_attn_states(out, q, np.zeros((4, 5), np.float32), q, np.zeros((4, 5), np.float32),
                             output_scale=np.ones(1, np.float32))
