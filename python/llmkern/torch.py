"""torch custom ops: `import llmkern.torch` registers every llmkern operator with
torch.library under the `llmkern` namespace (torch.ops.llmkern.<name>).

Schemas are vLLM's `_C` / `_C_cache_ops` ones where vLLM has the op (the same argument
names, order, defaults and mutation marks: `Tensor!` is written in place), so a model that
calls torch.ops._C.rms_norm(...) can call torch.ops.llmkern.rms_norm(...) instead; the
flash-attention entry points, MLA prefix prefill, and FlashMLA's decode
flash_mla_with_kvcache (FlashMLA's argument order with descale_q / descale_k / is_fp8_kvcache /
indices, then llmkern's kv_layout / k_pe_cache / kv_cache_dtype;
tile_scheduler_metadata / num_splits may be None: planned inside the op) with its planning
call get_mla_metadata are functional ops returning new tensors (get_mla_metadata's outputs
have static shapes, [1, 8] and [B + 1] int32, so it traces like the others). Every op has
a fake (meta) implementation, so it traces under torch.compile(fullgraph=True) and passes
torch.library.opcheck. The CPU implementations are the binding's functions
(python/llmkern/ops.py): nothing is copied, errors raise llmkern.LlmkernError.

Not registered as custom ops: set_num_threads / set_isa and the other runtime settings,
and mla_last_trace (a record of the last mla_prefix_prefill call, not an operator): plain
Python functions of the package.
"""
import torch

from . import ops as _ops

LIB = torch.library.Library("llmkern", "DEF")
OPS = []  # the names registered, in order


def _none_fake(*args, **kwargs):
    return None


def _register(name, schema, impl, fake=None):
    LIB.define(name + schema)
    LIB.impl(name, impl, "CPU")
    torch.library.register_fake("llmkern::" + name, fake or _none_fake, lib=LIB)
    OPS.append(name)


# ---------------------------------------------------------------- normalisation, activations

_register("rms_norm", "(Tensor! result, Tensor input, Tensor? weight, float epsilon) -> ()",
          lambda result, input, weight, epsilon: _ops.rms_norm(result, input, weight, epsilon))
_register("fused_add_rms_norm", "(Tensor! input, Tensor! residual, Tensor? weight, float epsilon) -> ()",
          lambda input, residual, weight, epsilon: _ops.fused_add_rms_norm(input, residual, weight, epsilon))
_register("gemma_rms_norm", "(Tensor! result, Tensor input, Tensor weight, float epsilon) -> ()",
          lambda result, input, weight, epsilon: _ops.gemma_rms_norm(result, input, weight, epsilon))
_register("gemma_fused_add_rms_norm", "(Tensor! input, Tensor! residual, Tensor weight, float epsilon) -> ()",
          lambda input, residual, weight, epsilon: _ops.gemma_fused_add_rms_norm(input, residual, weight, epsilon))

_register("silu_and_mul", "(Tensor! result, Tensor input) -> ()", lambda result, input: _ops.silu_and_mul(result, input))
for _name in ("mul_and_silu", "gelu_and_mul", "gelu_tanh_and_mul", "gelu_new", "gelu_fast", "gelu_quick"):
    _register(_name, "(Tensor! out, Tensor input) -> ()",
              (lambda f: lambda out, input: f(out, input))(getattr(_ops, _name)))
_register("fatrelu_and_mul", "(Tensor! out, Tensor input, float threshold) -> ()",
          lambda out, input, threshold: _ops.fatrelu_and_mul(out, input, threshold))
_register("swigluoai_and_mul", "(Tensor! out, Tensor input, float alpha=1.702, float limit=7.0) -> ()",
          lambda out, input, alpha=1.702, limit=7.0: _ops.swigluoai_and_mul(out, input, alpha, limit))

# ---------------------------------------------------------------- rotary, caches

_register("rotary_embedding",
          "(Tensor positions, Tensor! query, Tensor!? key, int head_size, Tensor cos_sin_cache, bool is_neox) -> ()",
          lambda positions, query, key, head_size, cos_sin_cache, is_neox:
          _ops.rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox))
_register("reshape_and_cache_flash",
          "(Tensor key, Tensor value, Tensor! key_cache, Tensor! value_cache, Tensor slot_mapping, "
          "str kv_cache_dtype, Tensor k_scale, Tensor v_scale) -> ()",
          lambda key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale:
          _ops.reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
                                       k_scale, v_scale))
_register("concat_and_cache_mla",
          "(Tensor kv_c, Tensor k_pe, Tensor! kv_cache, Tensor slot_mapping, str kv_cache_dtype, Tensor scale) -> ()",
          lambda kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale:
          _ops.concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale))
_register("concat_and_cache_mla_rope_fused",
          "(Tensor positions, Tensor! q_pe, Tensor! k_pe, Tensor kv_c, Tensor cos_sin_cache, bool is_neox, "
          "Tensor slot_mapping, Tensor! kv_cache, str kv_cache_dtype, Tensor kv_cache_scale) -> ()",
          lambda positions, q_pe, k_pe, kv_c, cos_sin_cache, is_neox, slot_mapping, kv_cache, kv_cache_dtype,
          kv_cache_scale:
          _ops.concat_and_cache_mla_rope_fused(positions, q_pe, k_pe, kv_c, cos_sin_cache, is_neox, slot_mapping,
                                               kv_cache, kv_cache_dtype, kv_cache_scale))
_register("gather_cache",
          "(Tensor src_cache, Tensor! dst, Tensor block_table, Tensor cu_seq_lens, int batch_size, "
          "Tensor? seq_starts=None) -> ()",
          lambda src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts=None:
          _ops.gather_cache(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts))
# fp8 caches (since 0.3)
_register("gather_and_maybe_dequant_cache",
          "(Tensor src_cache, Tensor! dst, Tensor block_table, Tensor cu_seq_lens, int batch_size, "
          "str kv_cache_dtype, Tensor scale, Tensor? seq_starts=None) -> ()",
          lambda src_cache, dst, block_table, cu_seq_lens, batch_size, kv_cache_dtype, scale, seq_starts=None:
          _ops.gather_and_maybe_dequant_cache(src_cache, dst, block_table, cu_seq_lens, batch_size, kv_cache_dtype,
                                              scale, seq_starts))
_register("cp_gather_cache",
          "(Tensor src_cache, Tensor! dst, Tensor block_table, Tensor cu_seq_lens, int batch_size, "
          "Tensor? seq_starts=None) -> ()",
          lambda src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts=None:
          _ops.cp_gather_cache(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts))
# fp8_ds_mla records (DeepSeek-V3.2) dequantized into a workspace (vLLM's _C_cache_ops schema)
_register("cp_gather_and_upconvert_fp8_kv_cache",
          "(Tensor src_cache, Tensor! dst, Tensor block_table, Tensor seq_lens, Tensor workspace_starts, "
          "int batch_size) -> ()",
          lambda src_cache, dst, block_table, seq_lens, workspace_starts, batch_size:
          _ops.cp_gather_and_upconvert_fp8_kv_cache(src_cache, dst, block_table, seq_lens, workspace_starts,
                                                    batch_size))
_register("convert_fp8", "(Tensor! dst_cache, Tensor src_cache, float scale, str kv_cache_dtype) -> ()",
          lambda dst_cache, src_cache, scale, kv_cache_dtype: _ops.convert_fp8(dst_cache, src_cache, scale,
                                                                              kv_cache_dtype))
_register("swap_blocks", "(Tensor src, Tensor! dst, Tensor block_mapping) -> ()",
          lambda src, dst, block_mapping: _ops.swap_blocks(src, dst, block_mapping))
_register("copy_blocks", "(Tensor(a!)[] key_caches, Tensor[](b!) value_caches, Tensor block_mapping) -> ()",
          lambda key_caches, value_caches, block_mapping: _ops.copy_blocks(key_caches, value_caches, block_mapping))
_register("copy_blocks_mla", "(Tensor(a!)[] kv_caches, Tensor block_mapping) -> ()",
          lambda kv_caches, block_mapping: _ops.copy_blocks_mla(kv_caches, block_mapping))

# ---------------------------------------------------------------- fp8 activations (vLLM's _C schemas)

_register("static_scaled_fp8_quant",
          "(Tensor! result, Tensor input, Tensor scale, int[]? group_shape=None) -> ()",
          lambda result, input, scale, group_shape=None: _ops.static_scaled_fp8_quant(result, input, scale,
                                                                                      group_shape))
_register("dynamic_scaled_fp8_quant", "(Tensor! result, Tensor input, Tensor! scale) -> ()",
          lambda result, input, scale: _ops.dynamic_scaled_fp8_quant(result, input, scale))
_register("dynamic_per_token_scaled_fp8_quant", "(Tensor! result, Tensor input, Tensor! scale, Tensor? scale_ub) -> ()",
          lambda result, input, scale, scale_ub: _ops.dynamic_per_token_scaled_fp8_quant(result, input, scale, scale_ub))
_register("per_token_group_fp8_quant",
          "(Tensor input, Tensor! output_q, Tensor! output_s, int group_size, float eps, float fp8_min, "
          "float fp8_max, bool scale_ue8m0, bool dummy_is_scale_transposed, bool dummy_is_tma_aligned) -> ()",
          lambda input, output_q, output_s, group_size, eps, fp8_min, fp8_max, scale_ue8m0, transposed, tma:
          _ops.per_token_group_fp8_quant(input, output_q, output_s, group_size, eps, fp8_min, fp8_max, scale_ue8m0))
# DeepGEMM's UE8M0-packed scales: int32 [mn, ceil(G / 4)], vLLM's TMA-aligned strides (1, padded mn)
_register("per_token_group_fp8_quant_packed",
          "(Tensor input, Tensor! output_q, Tensor! output_s_packed, int group_size, float eps, float fp8_min, "
          "float fp8_max) -> ()",
          lambda input, output_q, output_s_packed, group_size, eps, fp8_min, fp8_max:
          _ops.per_token_group_fp8_quant_packed(input, output_q, output_s_packed, group_size, eps, fp8_min, fp8_max))
_register("rms_norm_static_fp8_quant", "(Tensor! result, Tensor input, Tensor weight, Tensor scale, float epsilon) -> ()",
          lambda result, input, weight, scale, epsilon: _ops.rms_norm_static_fp8_quant(result, input, weight, scale,
                                                                                       epsilon))
_register("fused_add_rms_norm_static_fp8_quant",
          "(Tensor! result, Tensor input, Tensor! residual, Tensor weight, Tensor scale, float epsilon) -> ()",
          lambda result, input, residual, weight, scale, epsilon:
          _ops.fused_add_rms_norm_static_fp8_quant(result, input, residual, weight, scale, epsilon))
_register("rms_norm_dynamic_per_token_quant",
          "(Tensor! result, Tensor input, Tensor weight, Tensor! scale, float epsilon, Tensor? scale_ub, "
          "Tensor!? residual) -> ()",
          lambda result, input, weight, scale, epsilon, scale_ub, residual:
          _ops.rms_norm_dynamic_per_token_quant_into(result, input, weight, scale, epsilon, scale_ub, residual))
_register("rms_norm_per_block_quant",
          "(Tensor! result, Tensor input, Tensor weight, Tensor! scale, float epsilon, Tensor? scale_ub, "
          "Tensor!? residual, int group_size, bool is_scale_transposed) -> ()",
          lambda result, input, weight, scale, epsilon, scale_ub, residual, group_size, is_scale_transposed:
          _ops.rms_norm_per_block_quant_into(result, input, weight, scale, epsilon, scale_ub, residual, group_size,
                                             is_scale_transposed))
_register("silu_and_mul_quant", "(Tensor! result, Tensor input, Tensor scale) -> ()",
          lambda result, input, scale: _ops.silu_and_mul_quant(result, input, scale))
_register("silu_and_mul_per_block_quant",
          "(Tensor! out, Tensor input, Tensor! scales, int group_size, Tensor? scale_ub=None, "
          "bool is_scale_transposed=False) -> ()",
          lambda out, input, scales, group_size, scale_ub=None, is_scale_transposed=False:
          _ops.silu_and_mul_per_block_quant_into(out, input, scales, group_size, scale_ub, is_scale_transposed))

# ---------------------------------------------------------------- int8 activations (vLLM's _C schemas)

_register("static_scaled_int8_quant", "(Tensor! result, Tensor input, Tensor scale, Tensor? azp) -> ()",
          lambda result, input, scale, azp: _ops.static_scaled_int8_quant(result, input, scale, azp))
_register("dynamic_scaled_int8_quant", "(Tensor! result, Tensor input, Tensor! scale, Tensor!? azp) -> ()",
          lambda result, input, scale, azp: _ops.dynamic_scaled_int8_quant(result, input, scale, azp))
# block-int8 activations: vLLM's op of this name (the binding's per_token_group_quant_int8_into;
# llmkern.per_token_group_quant_int8 is vLLM's Python function of int8_utils)
_register("per_token_group_quant_int8",
          "(Tensor input, Tensor! output_q, Tensor! output_s, int group_size, float eps, float int8_min, "
          "float int8_max) -> ()",
          lambda input, output_q, output_s, group_size, eps, int8_min, int8_max:
          _ops.per_token_group_quant_int8_into(input, output_q, output_s, group_size, eps, int8_min, int8_max))

# ---------------------------------------------------------------- attention

_register("merge_attn_states",
          "(Tensor! output, Tensor!? output_lse, Tensor prefix_output, Tensor prefix_lse, Tensor suffix_output, "
          "Tensor suffix_lse, int? prefill_tokens_with_context=None, Tensor? output_scale=None) -> ()",
          lambda output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse,
          prefill_tokens_with_context=None, output_scale=None:
          _ops.merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse,
                                 prefill_tokens_with_context, output_scale))
_register("causal_softmax", "(Tensor! out, Tensor x) -> ()", lambda out, x: _ops.causal_softmax(out, x))


_FP8_TORCH = (torch.float8_e4m3fn, torch.float8_e5m2)


def _is_f8(t, kv_cache_dtype="auto"):
    """an fp8 tensor, or a uint8 cache read as fp8 (kv_cache_dtype 'fp8*')"""
    return t.dtype in _FP8_TORCH or (t.dtype == torch.uint8 and kv_cache_dtype != "auto")


def _varlen_dv(q, k, v, block_table, kv_layout, kv_cache_dtype="auto"):
    if block_table is not None and kv_layout == "NZ":  # [blocks, C/T, bs, T], C = Hk * D, T 32 for fp8
        kt, vt = (32 if _is_f8(x, kv_cache_dtype) else 16 for x in (k, v))
        hk = k.shape[1] * kt // q.shape[-1]
        return v.shape[1] * vt // hk
    return v.shape[-1]


def _out_dtype(q, v, kv_cache_dtype="auto", output_scale=None):
    """out is allocated like q; for an fp8 q like v, or bf16 when v is fp8 too; with an
    output_scale float8_e4m3fn (vLLM's fused output quantization)"""
    if output_scale is not None:
        return torch.float8_e4m3fn
    if q.dtype not in _FP8_TORCH:
        return q.dtype
    return torch.bfloat16 if _is_f8(v, kv_cache_dtype) else v.dtype


def _varlen_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k=None, block_table=None, softmax_scale=None,
                 causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, kv_layout="ND",
                 q_descale=None, k_descale=None, v_descale=None, kv_cache_dtype="auto", output_scale=None):
    out, lse = _ops.flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, 0, 0, softmax_scale=softmax_scale,
                                           causal=causal, window_size=tuple(window_size), softcap=softcap,
                                           alibi_slopes=alibi_slopes, block_table=block_table,
                                           return_softmax_lse=True, seqused_k=seqused_k, kv_layout=kv_layout,
                                           q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
                                           kv_cache_dtype=kv_cache_dtype, output_scale=output_scale)
    return out, lse


def _varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k=None, block_table=None, softmax_scale=None,
                 causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, kv_layout="ND",
                 q_descale=None, k_descale=None, v_descale=None, kv_cache_dtype="auto", output_scale=None):
    dv = _varlen_dv(q, k, v, block_table, kv_layout, kv_cache_dtype)
    return (q.new_empty((q.shape[0], q.shape[1], dv), dtype=_out_dtype(q, v, kv_cache_dtype, output_scale)),
            q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32))


_register("flash_attn_varlen_func",
          "(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor? cu_seqlens_k, Tensor? seqused_k=None, "
          "Tensor? block_table=None, float? softmax_scale=None, bool causal=False, int[] window_size=[-1, -1], "
          "float softcap=0.0, Tensor? alibi_slopes=None, str kv_layout=\"ND\", Tensor? q_descale=None, "
          "Tensor? k_descale=None, Tensor? v_descale=None, str kv_cache_dtype=\"auto\", "
          "Tensor? output_scale=None) -> (Tensor, Tensor)",
          _varlen_impl, _varlen_fake)


def _kvcache_impl(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None,
                  cache_batch_idx=None, block_table=None, softmax_scale=None, causal=False, window_size=(-1, -1),
                  softcap=0.0, rotary_interleaved=True, alibi_slopes=None, q_descale=None, k_descale=None,
                  v_descale=None, kv_cache_dtype="auto", output_scale=None):
    out, lse = _ops.flash_attn_with_kvcache(
        q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, None, block_table,
        softmax_scale, causal, tuple(window_size), softcap, rotary_interleaved, alibi_slopes,
        return_softmax_lse=True, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
        kv_cache_dtype=kv_cache_dtype, output_scale=output_scale)
    return out, lse.contiguous()


def _kvcache_fake(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None,
                  cache_batch_idx=None, block_table=None, softmax_scale=None, causal=False, window_size=(-1, -1),
                  softcap=0.0, rotary_interleaved=True, alibi_slopes=None, q_descale=None, k_descale=None,
                  v_descale=None, kv_cache_dtype="auto", output_scale=None):
    B, sq, Hq = q.shape[0], q.shape[1], q.shape[2]
    return (q.new_empty((B, sq, Hq, v_cache.shape[-1]), dtype=_out_dtype(q, v_cache, kv_cache_dtype, output_scale)),
            q.new_empty((B, Hq, sq), dtype=torch.float32))


_register("flash_attn_with_kvcache",
          "(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor? k=None, Tensor? v=None, "
          "Tensor? rotary_cos=None, Tensor? rotary_sin=None, Tensor? cache_seqlens=None, "
          "Tensor? cache_batch_idx=None, Tensor? block_table=None, float? softmax_scale=None, bool causal=False, "
          "int[] window_size=[-1, -1], float softcap=0.0, bool rotary_interleaved=True, "
          "Tensor? alibi_slopes=None, Tensor? q_descale=None, Tensor? k_descale=None, Tensor? v_descale=None, "
          "str kv_cache_dtype=\"auto\", Tensor? output_scale=None) -> (Tensor, Tensor)",
          _kvcache_impl, _kvcache_fake)


def _mla_impl(q, k, v, cu_seqlens_q, prefix_lens, block_table, kv_cache, kv_b_proj, softmax_scale, kv_layout="ND",
              strategy="auto", k_pe_cache=None, dedup=True, kv_cache_dtype="auto", k_scale=None):
    return _ops.mla_prefix_prefill(q, k, v, cu_seqlens_q, prefix_lens, block_table, kv_cache, kv_b_proj,
                                   softmax_scale, kv_layout=kv_layout, strategy=strategy, k_pe_cache=k_pe_cache,
                                   dedup=dedup, kv_cache_dtype=kv_cache_dtype, k_scale=k_scale)


def _mla_fake(q, k, v, cu_seqlens_q, prefix_lens, block_table, kv_cache, kv_b_proj, softmax_scale, kv_layout="ND",
              strategy="auto", k_pe_cache=None, dedup=True, kv_cache_dtype="auto", k_scale=None):
    return q.new_empty((q.shape[0], q.shape[1], v.shape[-1]))


# kv_cache_dtype / k_scale (fp8 latent caches, as vLLM passes them: a uint8 or float8 cache
# and the layer's one-element k_scale tensor)
_register("mla_prefix_prefill",
          "(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor prefix_lens, Tensor block_table, "
          "Tensor kv_cache, Tensor kv_b_proj, float softmax_scale, str kv_layout=\"ND\", str strategy=\"auto\", "
          "Tensor? k_pe_cache=None, bool dedup=True, str kv_cache_dtype=\"auto\", Tensor? k_scale=None) -> Tensor",
          _mla_impl, _mla_fake)



def _mla_decode_impl(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata, num_splits,
                     softmax_scale=None, causal=False, descale_q=None, descale_k=None, is_fp8_kvcache=False,
                     indices=None, kv_layout="ND", k_pe_cache=None, kv_cache_dtype="auto"):
    return _ops.flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                                       num_splits, softmax_scale, causal, descale_q, descale_k, is_fp8_kvcache,
                                       indices, kv_layout=kv_layout, k_pe_cache=k_pe_cache,
                                       kv_cache_dtype=kv_cache_dtype)


def _mla_decode_fake(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata, num_splits,
                     softmax_scale=None, causal=False, descale_q=None, descale_k=None, is_fp8_kvcache=False,
                     indices=None, kv_layout="ND", k_pe_cache=None, kv_cache_dtype="auto"):
    B, sq, H = q.shape[0], q.shape[1], q.shape[2]
    return q.new_empty((B, sq, H, head_dim_v)), q.new_empty((B, H, sq), dtype=torch.float32)


_register("flash_mla_with_kvcache",
          "(Tensor q, Tensor k_cache, Tensor? block_table, Tensor? cache_seqlens, int head_dim_v, "
          "Tensor? tile_scheduler_metadata, Tensor? num_splits, float? softmax_scale=None, bool causal=False, "
          "Tensor? descale_q=None, Tensor? descale_k=None, bool is_fp8_kvcache=False, Tensor? indices=None, "
          "str kv_layout=\"ND\", Tensor? k_pe_cache=None, str kv_cache_dtype=\"auto\") -> (Tensor, Tensor)",
          _mla_decode_impl, _mla_decode_fake)


def _mla_metadata_fake(cache_seqlens, num_heads_per_head_k, num_heads_k):
    return (cache_seqlens.new_empty((1, 8), dtype=torch.int32),
            cache_seqlens.new_empty((cache_seqlens.shape[0] + 1,), dtype=torch.int32))


_register("get_mla_metadata", "(Tensor cache_seqlens, int num_heads_per_head_k, int num_heads_k) -> (Tensor, Tensor)",
          lambda cache_seqlens, num_heads_per_head_k, num_heads_k:
          _ops.get_mla_metadata(cache_seqlens, num_heads_per_head_k, num_heads_k),
          _mla_metadata_fake)

ops = torch.ops.llmkern
