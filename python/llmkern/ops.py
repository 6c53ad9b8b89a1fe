"""The operators, with vLLM's custom-op and flash-attention signatures (argument names and
order). Each function maps its arguments onto one C call; the C side validates shapes,
dtypes, index values and overlaps and its message becomes an LlmkernError. Python checks
only what C cannot see: the device, the Python-only arguments (kv_cache_dtype, scales,
head_size reshapes) and read-only NumPy outputs. Nothing is copied.
"""
import math

import numpy as np

from . import _lib as L
from ._lib import LlmkernError  # noqa: F401  (re-exported)

_view, _out, _tview = L.view, L.out_view, L.transposed_view
_raise = L.raise_status

# ---------------------------------------------------------------- normalisation


def rms_norm(out, input, weight, epsilon):
    """out = input * rsqrt(mean(input^2) + epsilon) * weight (last dim); out may be input."""
    s = L.rms_norm(_out(out, "out"), _view(input, "input"), _view(weight, "weight"), epsilon, 0)
    if s:
        _raise(s)


def fused_add_rms_norm(input, residual, weight, epsilon):
    """residual = input + residual; input = rms_norm(residual) (both in place)."""
    s = L.fused_add_rms_norm(_out(input, "input"), _out(residual, "residual"),
                             _view(weight, "weight"), epsilon, 0)
    if s:
        _raise(s)


def gemma_rms_norm(out, input, weight, epsilon):
    """Gemma's form: out = input * rsqrt(mean(input^2) + epsilon) * (1 + weight)."""
    s = L.rms_norm(_out(out, "out"), _view(input, "input"), _view(weight, "weight"), epsilon, 1)
    if s:
        _raise(s)


def gemma_fused_add_rms_norm(input, residual, weight, epsilon):
    s = L.fused_add_rms_norm(_out(input, "input"), _out(residual, "residual"),
                             _view(weight, "weight"), epsilon, 1)
    if s:
        _raise(s)


# ---------------------------------------------------------------- activations


def silu_and_mul(out, input):
    """out[..., d] = silu(input[..., :d]) * input[..., d:]."""
    s = L.silu_and_mul(_out(out, "out"), _view(input, "input"))
    if s:
        _raise(s)


def gelu_tanh_and_mul(out, input):
    """out[..., d] = gelu_tanh(input[..., :d]) * input[..., d:]."""
    s = L.gelu_tanh_and_mul(_out(out, "out"), _view(input, "input"))
    if s:
        _raise(s)


# ---------------------------------------------------------------- rotary


def _heads_view(x, head_size, name):
    """vLLM passes q/k as [T, H * head_size]: the [T, H, head_size] view of the same memory.
    A 3-D [T, H, head_size] tensor (and any other rank, for C to judge) passes as it is;
    vLLM's batched [B, S, H * head_size] form is not mapped (refused: last dim != head_size)."""
    L._writable(x, name)
    p, dt, shape, st = L.info(x, name)
    if len(shape) == 2:
        if shape[1] % head_size:
            raise ValueError("%s: last dim %d is not a multiple of head_size %d"
                             % (name, shape[1], head_size))
        shape = (shape[0], shape[1] // head_size, head_size)
        st = (st[0], st[1] * head_size, st[1])
    elif len(shape) == 3 and shape[2] != head_size:
        raise ValueError("%s: head dim %d (shape %s) is not head_size %d"
                         % (name, shape[2], tuple(shape), head_size))
    return L.pack(p, dt, shape, st, name)


def rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox):
    """In place. positions [T]; query [T, Hq * head_size] or [T, Hq, head_size]; key likewise
    or None; cos_sin_cache [max_pos, rot] = [cos | sin]; is_neox: NeoX or GPT-J pairs."""
    if head_size < 1:
        raise ValueError("head_size: must be >= 1, got %r" % (head_size,))
    k = None if key is None else _heads_view(key, head_size, "key")
    s = L.rotary_embedding(_view(positions, "positions"), _heads_view(query, head_size, "query"),
                           k, _view(cos_sin_cache, "cos_sin_cache"), is_neox)
    if s:
        _raise(s)


# ---------------------------------------------------------------- KV cache


def _check_auto(kv_cache_dtype):
    if kv_cache_dtype != "auto":
        raise NotImplementedError("kv_cache_dtype=%r: only 'auto' (cache in its own dtype) is "
                                  "supported; fp8 caches are not" % (kv_cache_dtype,))


def _check_unit_scale(scale, name):
    if scale is None:
        return
    v = scale.item() if hasattr(scale, "item") else scale
    if v != 1.0:
        raise NotImplementedError("%s: %r; with kv_cache_dtype='auto' the cache is not scaled, "
                                  "so the scale must be 1.0 or None" % (name, v))


def _layout(layout):
    try:
        return L.LAYOUTS[layout]
    except (KeyError, TypeError):
        raise ValueError("layout: %r, expected 'ND' or 'NZ'" % (layout,)) from None


def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
                            k_scale=None, v_scale=None):
    """key, value [T, H, D] -> key_cache, value_cache [num_blocks, block_size, H, D] at
    slot_mapping [N <= T] (slot < 0 skipped)."""
    _check_auto(kv_cache_dtype)
    _check_unit_scale(k_scale, "k_scale")
    _check_unit_scale(v_scale, "v_scale")
    s = L.reshape_and_cache_flash(_view(key, "key"), _view(value, "value"),
                                  _out(key_cache, "key_cache"), _out(value_cache, "value_cache"),
                                  _view(slot_mapping, "slot_mapping"))
    if s:
        _raise(s)


def concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale=None,
                         layout="ND", k_pe_cache=None):
    """MLA latent cache write: kv_c [T, Dl] and k_pe [T, Dr] -> kv_cache, one buffer
    ND [num_blocks, block_size, Dl + Dr] or NZ physical [num_blocks, (Dl + Dr)/16,
    block_size, 16]. With k_pe_cache given, kv_cache holds only the latent part."""
    _check_auto(kv_cache_dtype)
    _check_unit_scale(scale, "scale")
    s = L.concat_and_cache_mla(_view(kv_c, "kv_c"), _view(k_pe, "k_pe"), _out(kv_cache, "kv_cache"),
                               _out(k_pe_cache, "k_pe_cache"), _view(slot_mapping, "slot_mapping"),
                               _layout(layout))
    if s:
        _raise(s)


def _to_numpy(x):
    if L.is_torch(x):
        L.info(x, "cu_seq_lens")  # device / dtype check
        return x.numpy()
    return np.asarray(x)


def gather_cache(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts=None,
                 layout="ND"):
    """vLLM's gather_cache: request b's first cu_seq_lens[b+1] - cu_seq_lens[b] tokens,
    read through block_table[b], go to dst[cu_seq_lens[b]:cu_seq_lens[b+1]]."""
    if seq_starts is not None:
        raise NotImplementedError("seq_starts: gathering from an offset into each request is "
                                  "not supported by lk_gather_cache")
    cu = _to_numpy(cu_seq_lens)[:batch_size + 1]
    seq_lens = np.ascontiguousarray(np.diff(cu), dtype=np.int32)
    first, last = (int(cu[0]), int(cu[-1])) if len(cu) else (0, 0)
    s = L.gather_cache(_out(dst[first:last], "dst"), _view(src_cache, "src_cache"),
                       _view(block_table[:batch_size], "block_table"),
                       _view(seq_lens, "seq_lens"), _layout(layout))
    if s:
        _raise(s)


# ---------------------------------------------------------------- attention


def merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse,
                      output_lse=None):
    """output [T, H, D] = LSE merge of (prefix_output, prefix_lse) and (suffix_output,
    suffix_lse); LSEs [H, T] f32 as in vLLM (passed to C as their [T, H] transposes)."""
    s = L.merge_attn_states(_out(output, "output"), _tview(output_lse, "output_lse", True),
                            _view(prefix_output, "prefix_output"), _tview(prefix_lse, "prefix_lse"),
                            _view(suffix_output, "suffix_output"), _tview(suffix_lse, "suffix_lse"))
    if s:
        _raise(s)


def causal_softmax(out, x):
    """out[..., q, k] = softmax of x over the last dim with the bottom-right causal mask."""
    s = L.causal_softmax(_out(out, "out"), _view(x, "x"))
    if s:
        _raise(s)


def _empty(like, shape, f32=False):
    """A new array on the same side (NumPy or torch) as `like`."""
    if L.is_torch(like):
        import torch
        return torch.empty(shape, dtype=torch.float32 if f32 else like.dtype)
    return np.empty(shape, dtype=np.float32 if f32 else like.dtype)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None, *,
                           return_softmax_lse=False, out=None, seqused_k=None, kv_layout="ND"):
    """flash-attention's varlen attention. q [Tq, Hq, Dqk]; dense k [Tk, Hk, Dqk],
    v [Tk, Hk, Dv] with cu_seqlens_k, or paged caches with block_table [B, pages] and
    seqused_k [B] (cu_seqlens_k None; kv_layout 'ND' or 'NZ'). Returns out [Tq, Hq, Dv]
    (allocated like q when None), or (out, lse [Hq, Tq] f32) with return_softmax_lse.
    max_seqlen_* are accepted for compatibility and not needed; deterministic is
    ignored (results never depend on the thread count)."""
    if dropout_p:
        raise NotImplementedError("dropout_p: only 0.0 (inference) is supported")
    if alibi_slopes is not None:
        raise NotImplementedError("alibi_slopes: ALiBi is not supported")
    if return_attn_probs:
        raise NotImplementedError("return_attn_probs: the attention matrix is never formed")
    lay = _layout(kv_layout)
    dqk = q.shape[-1]
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(dqk)
    if out is None or return_softmax_lse:
        if len(q.shape) != 3:
            raise ValueError("q: shape %s, expected [total_q, num_heads, head_dim]" % (tuple(q.shape),))
        tq, hq = q.shape[0], q.shape[1]
    if out is None:
        dv = v.shape[-1]
        if block_table is not None and lay == 1:  # NZ: [blocks, C/16, bs, 16], C = Hk * D
            hk = k.shape[1] * 16 // dqk
            dv = v.shape[1] * 16 // hk if hk else dqk
        out = _empty(q, (tq, hq, dv))
    lse = _empty(q, (hq, tq), f32=True) if return_softmax_lse else None
    wl, wr = (-1, -1) if window_size is None else window_size
    params = L.attn_params(softmax_scale, 1 if causal else 0, wl, wr, softcap, lay)
    s = L.flash_attn_varlen(_out(out, "out"), _tview(lse, "lse"), _view(q, "q"), _view(k, "k"),
                            _view(v, "v"), _view(cu_seqlens_q, "cu_seqlens_q"),
                            _view(cu_seqlens_k, "cu_seqlens_k"), _view(seqused_k, "seqused_k"),
                            _view(block_table, "block_table"), params)
    if s:
        _raise(s)
    return (out, lse) if return_softmax_lse else out


def mla_prefix_prefill(q, k, v, cu_seqlens_q, prefix_lens, block_table, kv_cache, kv_b_proj,
                       softmax_scale, out=None, kv_layout="ND", strategy="auto",
                       k_pe_cache=None, dedup=True):
    """MLA prefill of new tokens over a cached prefix (DeepSeek-V2/V3 attention).
    q, k [T, H, Dn + Dr] (k = [k_nope | k_rope broadcast]), v [T, H, Dv] of the new
    tokens; cu_seqlens_q [B + 1]; prefix_lens [B]; block_table [B, max_pages];
    kv_cache: the latent cache, one buffer of [Dl + Dr] entries (ND [blocks, block_size,
    Dl + Dr] or NZ physical [blocks, (Dl + Dr)/16, block_size, 16]) or, with k_pe_cache,
    the [.., Dl] part; kv_b_proj [H * (Dn + Dv), Dl] (torch Linear weight); softmax_scale
    explicit. strategy: 'auto', 'split_merge', 'concat', 'fused', 'absorbed'. Returns
    out [T, H, Dv] (allocated like q when None). mla_last_trace() tells what ran.
    NotImplementedError where the loaded library lacks lk_mla_prefix_prefill."""
    try:
        strat = L.MLA_STRATEGIES[strategy]
    except (KeyError, TypeError):
        raise ValueError("strategy: %r, expected one of %s"
                         % (strategy, ", ".join(L.MLA_STRATEGIES))) from None
    lay = _layout(kv_layout)
    if out is None:
        if len(q.shape) != 3:
            raise ValueError("q: shape %s, expected [num_tokens, num_heads, head_dim]" % (tuple(q.shape),))
        out = _empty(q, (q.shape[0], q.shape[1], v.shape[-1]))
    params = L.mla_params(softmax_scale, strat, lay, 1 if dedup else 0)
    s = L.mla_prefix_prefill(_out(out, "out"), _view(q, "q"), _view(k, "k"), _view(v, "v"),
                             _view(cu_seqlens_q, "cu_seqlens_q"), _view(prefix_lens, "prefix_lens"),
                             _view(block_table, "block_table"), _view(kv_cache, "kv_cache"),
                             _view(k_pe_cache, "k_pe_cache"), _view(kv_b_proj, "kv_b_proj"), params)
    if s:
        _raise(s)
    return out


def mla_last_trace():
    """What the last mla_prefix_prefill call on this thread ran ("strategy=... ; ...")."""
    return L.mla_last_trace().decode()


# ---------------------------------------------------------------- runtime


def set_num_threads(n):
    """Threads used by the operators; n <= 0 restores the default. Results never depend on it."""
    L.set_num_threads(int(n))


def get_num_threads():
    return L.get_num_threads()


def isa():
    """Name of the instruction set in use: 'ref', 'avx2', 'avx512', 'avx512bf16' (x86) or 'neon'
    (aarch64)."""
    return L.isa_name(L.isa_current()).decode()


def best_isa():
    return L.isa_name(L.isa_best()).decode()


def set_isa(name):
    """Force an instruction set ('ref', 'avx2', 'avx512', 'avx512bf16', 'neon' or 'best'); LlmkernError
    (LK_ERR_UNSUPPORTED) where this CPU lacks it."""
    if name == "best":
        code = L.isa_best()
    else:
        try:
            code = L.ISAS[name]
        except (KeyError, TypeError):
            raise ValueError("isa: %r, expected one of %s or 'best'" % (name, ", ".join(map(repr, L.ISAS)))) from None
    s = L.set_isa(code)
    if s:
        _raise(s)


def version():
    """Version of the loaded C library."""
    return L.version().decode()
