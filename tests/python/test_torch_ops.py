"""llmkern.torch: every operator registered with torch.library under `llmkern`, with
vLLM's schemas; torch.library.opcheck on each (schema / mutation marks, fake tensors,
autograd registration, AOT dispatch) and a model calling them under
torch.compile(fullgraph=True) on the CPU, against the eager results; FlashMLA's decode
(get_mla_metadata + flash_mla_with_kvcache, bf16 / f32, s_q 1 and 2 causal, ND paged
cache; the sparse form with indices is opchecked here, tested in test_flash_mla_sparse.py)
bit for bit against the binding's call, eager and compiled."""
import math

import numpy as np
import pytest

from helpers import close, f64, torch_or_skip

torch = torch_or_skip()
import llmkern as lk  # noqa: E402
import llmkern.torch as lkt  # noqa: E402

OPS = torch.ops.llmkern
G = torch.Generator().manual_seed(7)


def rn(*shape, dt=torch.float32):
    return torch.randn(*shape, generator=G).to(dt)


def cos_sin(P, rot):
    inv = 1.0 / 10000 ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    ang = torch.arange(P, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cat([torch.cos(ang), torch.sin(ang)], dim=1).float()


def cases():
    """(op name, args, kwargs) for every registered op."""
    T, D, H, Hk = 5, 64, 4, 2
    x = rn(T, 2 * D, dt=torch.bfloat16)
    c = []
    c.append(("rms_norm", (torch.empty(T, D), rn(T, D), rn(D), 1e-6), {}))
    c.append(("rms_norm", (torch.empty(T, D), rn(T, D), None, 1e-6), {}))
    c.append(("fused_add_rms_norm", (rn(T, D), rn(T, D), rn(D), 1e-6), {}))
    c.append(("gemma_rms_norm", (torch.empty(T, D), rn(T, D), rn(D), 1e-6), {}))
    c.append(("gemma_fused_add_rms_norm", (rn(T, D), rn(T, D), rn(D), 1e-6), {}))
    for name in ("silu_and_mul", "mul_and_silu", "gelu_and_mul", "gelu_tanh_and_mul"):
        c.append((name, (torch.empty(T, D, dtype=torch.bfloat16), x), {}))
    c.append(("fatrelu_and_mul", (torch.empty(T, D, dtype=torch.bfloat16), x, 0.1), {}))
    c.append(("swigluoai_and_mul", (torch.empty(T, D, dtype=torch.bfloat16), x), {"alpha": 1.702, "limit": 7.0}))
    for name in ("gelu_new", "gelu_fast", "gelu_quick"):
        c.append((name, (torch.empty(T, 2 * D, dtype=torch.bfloat16), x), {}))
    c.append(("rotary_embedding", (torch.randint(0, 32, (T,)), rn(T, H * D), rn(T, Hk * D), D, cos_sin(32, D), True), {}))
    c.append(("rotary_embedding", (torch.randint(0, 32, (T,)), rn(T, H * D), None, D, cos_sin(32, D), False), {}))
    NB, bs = 4, 4
    c.append(("reshape_and_cache_flash", (rn(T, Hk, D), rn(T, Hk, D), torch.zeros(NB, bs, Hk, D), torch.zeros(NB, bs, Hk, D),
                                          torch.tensor([3, 0, 9, -1, 15]), "auto", torch.tensor(1.0), torch.tensor(1.0)), {}))
    c.append(("concat_and_cache_mla", (rn(T, 32), rn(T, 16), torch.zeros(NB, bs, 48), torch.tensor([3, 0, 9, -1, 15]),
                                       "auto", torch.tensor(1.0)), {}))
    c.append(("gather_cache", (rn(NB, bs, 48), torch.zeros(9, 48), torch.tensor([[1, 2], [3, 0]], dtype=torch.int32),
                               torch.tensor([0, 6, 9], dtype=torch.int32), 2), {}))
    c.append(("swap_blocks", (rn(NB, bs, Hk, D), torch.zeros(NB, bs, Hk, D), torch.tensor([[0, 3], [2, 1]])), {}))
    # fp8 caches (uint8 buffers as vLLM allocates them)
    u8 = torch.randint(0, 120, (NB, bs, 48), dtype=torch.uint8)
    c.append(("reshape_and_cache_flash", (rn(T, Hk, D), rn(T, Hk, D), torch.zeros(NB, bs, Hk, D, dtype=torch.uint8),
                                          torch.zeros(NB, bs, Hk, D, dtype=torch.uint8), torch.tensor([3, 0, 9, -1, 15]),
                                          "fp8", torch.tensor([0.5, 2.0]), torch.tensor(1.0)), {}))
    c.append(("concat_and_cache_mla", (rn(T, 32), rn(T, 16), torch.zeros(NB, bs, 48, dtype=torch.uint8),
                                       torch.tensor([3, 0, 9, -1, 15]), "fp8_e5m2", torch.tensor([0.25])), {}))
    # rotary on q_pe / k_pe + the latent cache write (positions longer than T, a padding slot)
    c.append(("concat_and_cache_mla_rope_fused", (torch.randint(0, 32, (T + 2,)), rn(T, H, 16), rn(T, 16), rn(T, 32),
                                                  cos_sin(32, 16), True, torch.tensor([3, 0, 9, -1, 15]),
                                                  torch.zeros(NB, bs, 48), "auto", torch.tensor([1.0])), {}))
    c.append(("concat_and_cache_mla_rope_fused", (torch.randint(0, 32, (T,)), rn(T, H, 16), rn(T, 16), rn(T, 32),
                                                  cos_sin(32, 16), False, torch.tensor([3, 0, 9, -1, 15]),
                                                  torch.zeros(NB, bs, 48, dtype=torch.uint8), "fp8",
                                                  torch.tensor([0.5])), {}))
    c.append(("gather_and_maybe_dequant_cache", (u8, torch.zeros(9, 48, dtype=torch.bfloat16),
                                                 torch.tensor([[1, 2], [3, 0]], dtype=torch.int32),
                                                 torch.tensor([0, 6, 9], dtype=torch.int32), 2, "fp8",
                                                 torch.tensor([0.5])), {}))
    c.append(("cp_gather_cache", (u8, torch.zeros(9, 48, dtype=torch.uint8), torch.tensor([[1, 2], [3, 0]], dtype=torch.int32),
                                  torch.tensor([0, 6, 9], dtype=torch.int32), 2), {}))
    # fp8_ds_mla records (DeepSeek-V3.2): uint8 [NB, bs, E = 128 + 128 / 32 + 2 * 16], dst [tokens, 144] bf16
    ds = torch.zeros(NB, bs, 164, dtype=torch.uint8)
    lk.concat_and_cache_mla(rn(T, 128), rn(T, 16), ds, torch.tensor([3, 0, 9, -1, 15]), "fp8_ds_mla", None)
    c.append(("cp_gather_and_upconvert_fp8_kv_cache", (ds, torch.zeros(9, 144, dtype=torch.bfloat16),
                                                       torch.tensor([[1, 2], [3, 0]], dtype=torch.int32),
                                                       torch.tensor([6, 3], dtype=torch.int32),
                                                       torch.tensor([0, 6], dtype=torch.int32), 2), {}))
    c.append(("convert_fp8", (torch.zeros(NB, bs, 48), u8, 2.0, "fp8"), {}))
    c.append(("convert_fp8", (torch.zeros(NB, bs, 48, dtype=torch.uint8), rn(NB, bs, 48), 0.5, "fp8_e5m2"), {}))
    c.append(("copy_blocks", ([rn(NB, bs, Hk, D), rn(NB, bs, Hk, D)], [rn(NB, bs, Hk, D), rn(NB, bs, Hk, D)],
                              torch.tensor([[0, 3], [1, 2]])), {}))
    c.append(("copy_blocks_mla", ([rn(NB, bs, 48)], torch.tensor([[0, 3]])), {}))
    c.append(("merge_attn_states", (torch.empty(T, H, D), torch.empty(H, T), rn(T, H, D), rn(H, T), rn(T, H, D), rn(H, T)),
              {"prefill_tokens_with_context": 3}))
    c.append(("merge_attn_states", (torch.empty(T, H, D), None, rn(T, H, D), rn(H, T), rn(T, H, D), rn(H, T)), {}))
    c.append(("merge_attn_states", (torch.empty(T, H, D, dtype=torch.float8_e4m3fn), None, rn(T, H, D), rn(H, T),
                                    rn(T, H, D), rn(H, T)), {"output_scale": torch.tensor([0.05])}))
    c.append(("causal_softmax", (torch.empty(2, 3, 7), rn(2, 3, 7)), {}))
    # fp8 activations
    f8 = torch.float8_e4m3fn
    c.append(("static_scaled_fp8_quant", (torch.empty(T, D, dtype=f8), rn(T, D), torch.tensor([0.02])), {}))
    c.append(("static_scaled_fp8_quant", (torch.empty(T, D, dtype=f8), rn(T, D), torch.tensor([[0.02]]), [-1, -1]), {}))
    c.append(("static_scaled_fp8_quant", (torch.empty(T, D, dtype=f8), rn(T, D), rn(D).abs() + 0.01, [-1, 1]), {}))
    c.append(("static_scaled_fp8_quant", (torch.empty(T, D, dtype=f8), rn(T, D), rn(T).abs() + 0.01, [1, -1]), {}))
    c.append(("static_scaled_fp8_quant", (torch.empty(T, D, dtype=f8), rn(T, D), rn(T, D // 32).abs() + 0.01), {}))
    c.append(("dynamic_scaled_fp8_quant", (torch.empty(T, D, dtype=f8), rn(T, D), torch.zeros(1)), {}))
    c.append(("dynamic_per_token_scaled_fp8_quant", (torch.empty(T, D, dtype=torch.float8_e5m2), rn(T, D),
                                                     torch.empty(T, 1), torch.tensor([2.0])), {}))
    # column-major scales, as vLLM allocates them for DeepGEMM
    c.append(("per_token_group_fp8_quant", (rn(T, D), torch.empty(T, D, dtype=f8), torch.empty(D // 16, T).t(), 16,
                                            1e-10, -448.0, 448.0, True, True, False), {}))
    # DeepGEMM's UE8M0-packed scales: int32 [T, ceil(G / 4)] with vLLM's TMA-aligned strides
    # (1, T padded to 4); an int8 output with a row-major one (its mutations schema-checked)
    c.append(("per_token_group_fp8_quant_packed", (rn(T, 96), torch.empty(T, 96, dtype=f8),
                                                   torch.empty_strided((T, 2), (1, 8), dtype=torch.int32), 16,
                                                   1e-10, -448.0, 448.0), {}))
    c.append(("per_token_group_fp8_quant_packed", (rn(2, 3, 80, dt=torch.bfloat16),
                                                   torch.empty(2, 3, 80, dtype=torch.int8),
                                                   torch.empty(6, 2, dtype=torch.int32), 16, 1e-10, -128.0, 127.0), {}))
    c.append(("rms_norm_static_fp8_quant", (torch.empty(T, D, dtype=f8), rn(T, D), rn(D), torch.tensor([0.02]), 1e-6), {}))
    c.append(("fused_add_rms_norm_static_fp8_quant", (torch.empty(T, D, dtype=f8), rn(T, D), rn(T, D), rn(D),
                                                      torch.tensor([0.02]), 1e-6), {}))
    c.append(("rms_norm_dynamic_per_token_quant", (torch.empty(T, D, dtype=f8), rn(T, D), rn(D), torch.empty(T, 1), 1e-6,
                                                   None, rn(T, D)), {}))
    # per-block scales: vLLM's column-major ones (the transposed view of a [D / G, T] buffer)
    # and row-major ones with an int8 result and scale_ub
    c.append(("rms_norm_per_block_quant", (torch.empty(T, D, dtype=f8), rn(T, D), rn(D), torch.empty(D // 16, T).t(),
                                           1e-6, None, rn(T, D), 16, True), {}))
    c.append(("rms_norm_per_block_quant", (torch.empty(T, D, dtype=torch.int8), rn(T, D, dt=torch.bfloat16),
                                           rn(D, dt=torch.bfloat16), torch.empty(T, D // 32), 1e-6,
                                           torch.tensor([1.5]), None, 32, False), {}))
    # SiLU-and-mul then quantization: static fp8; per block with vLLM's column-major scales,
    # and row-major ones with an int8 out, scale_ub and the schema's defaults
    c.append(("silu_and_mul_quant", (torch.empty(T, D, dtype=f8), x, torch.tensor([0.02])), {}))
    c.append(("silu_and_mul_per_block_quant", (torch.empty(T, D, dtype=f8), x, torch.empty(D // 16, T).t(), 16,
                                               None, True), {}))
    c.append(("silu_and_mul_per_block_quant", (torch.empty(T, D, dtype=torch.int8), x, torch.empty(T, D // 32), 32),
              {"scale_ub": torch.tensor([1.5])}))
    # int8 activations
    i8 = torch.int8
    c.append(("static_scaled_int8_quant", (torch.empty(T, D, dtype=i8), rn(T, D), torch.tensor([0.02]), None), {}))
    c.append(("static_scaled_int8_quant", (torch.empty(T, D, dtype=i8), rn(T, D), torch.tensor([0.02]),
                                           torch.tensor([3], dtype=torch.int32)), {}))
    c.append(("dynamic_scaled_int8_quant", (torch.empty(T, D, dtype=i8), rn(T, D), torch.empty(T, 1), None), {}))
    c.append(("dynamic_scaled_int8_quant", (torch.empty(T, D, dtype=i8), rn(T, D), torch.empty(T, 1),
                                            torch.empty(T, 1, dtype=torch.int32)), {}))
    # per token group (block-int8): vLLM's column-major scales (the transposed view of a
    # [D / G, T] buffer), and row-major ones with bf16 input and keyword arguments
    c.append(("per_token_group_quant_int8", (rn(T, D), torch.empty(T, D, dtype=i8), torch.empty(D // 16, T).t(), 16,
                                             1e-10, -128.0, 127.0), {}))
    c.append(("per_token_group_quant_int8", (rn(T, D, dt=torch.bfloat16), torch.empty(T, D, dtype=i8)),
              {"output_s": torch.empty(T, D // 32), "group_size": 32, "eps": 1e-10, "int8_min": -128.0,
               "int8_max": 127.0}))
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    c.append(("flash_attn_varlen_func", (rn(T, H, D), rn(T, Hk, D), rn(T, Hk, D), cu, cu),
              {"causal": True, "alibi_slopes": torch.tensor([0.5, 0.25, 0.125, 0.0625])}))
    kc, vc = rn(6, bs, Hk, D), rn(6, bs, Hk, D)
    c.append(("flash_attn_varlen_func", (rn(T, H, D), kc, vc, cu, None),
              {"seqused_k": torch.tensor([7, 3], dtype=torch.int32), "block_table": torch.tensor([[4, 1], [0, 5]], dtype=torch.int32),
               "causal": True, "window_size": [4, 0]}))
    c.append(("flash_attn_varlen_func", (rn(T, H, D), rn(T, Hk, D), rn(T, Hk, D), cu, cu),
              {"causal": True, "output_scale": torch.tensor([0.05])}))  # fp8 out (e4m3)
    c.append(("flash_attn_with_kvcache", (rn(2, 1, H, D), rn(3, 16, Hk, D), rn(3, 16, Hk, D)),
              {"k": rn(2, 1, Hk, D), "v": rn(2, 1, Hk, D), "cache_seqlens": torch.tensor([5, 0], dtype=torch.int32),
               "cache_batch_idx": torch.tensor([2, 0], dtype=torch.int32), "causal": True,
               "rotary_cos": torch.cos(torch.arange(32.0)[:, None] * 0.1 * torch.arange(1, 9)[None, :]),
               "rotary_sin": torch.sin(torch.arange(32.0)[:, None] * 0.1 * torch.arange(1, 9)[None, :])}))
    Hm, Dn, Dr, Dv, Dl = 2, 16, 16, 16, 32
    c.append(("mla_prefix_prefill", (rn(3, Hm, Dn + Dr), rn(3, Hm, Dn + Dr), rn(3, Hm, Dv), torch.tensor([0, 2, 3], dtype=torch.int32),
                                     torch.tensor([5, 0], dtype=torch.int32), torch.tensor([[1, 2], [0, 0]], dtype=torch.int32),
                                     rn(4, 4, Dl + Dr), rn(Hm * (Dn + Dv), Dl) * 0.2, 0.2), {}))
    for dt in (torch.bfloat16, torch.float32):
        for sq, causal in ((1, False), (2, True)):
            c.append(("flash_mla_with_kvcache", mla_decode_args(dt, sq), {"causal": causal}))
    c.append(("flash_mla_with_kvcache", mla_decode_args(torch.float32, 1)[:5] + (None, None), {}))  # planned in the op
    sparse = torch.tensor([[[3, -1, 17, 3]], [[-1, -1, -1, -1]], [[0, 23, 5, -1]]], dtype=torch.int32)
    c.append(("flash_mla_with_kvcache", mla_decode_args(torch.bfloat16, 1)[:2] + (None, None, 32, None, None),
              {"indices": sparse}))  # FlashMLA's sparse decode: block_table / cache_seqlens None
    c.append(("get_mla_metadata", (torch.tensor([37, 0, 700], dtype=torch.int32), 8, 1), {}))
    return c


def mla_decode_args(dt, sq, H=4, Dl=32, Dr=16, bs=4):
    """FlashMLA decode inputs: q [B, s_q, H, Dl + Dr], ND paged cache [blocks, bs, 1, Dl + Dr],
    block_table [B, 3], cache_seqlens [B] (one request empty), planned metadata."""
    lens = torch.tensor([7, 0, 10], dtype=torch.int32)
    table = torch.tensor([[5, 2, -1], [-1, -1, -1], [0, 3, 1]], dtype=torch.int32)
    meta, splits = lk.get_mla_metadata(lens, sq * H, 1)
    return (rn(3, sq, H, Dl + Dr, dt=dt), rn(6, bs, 1, Dl + Dr, dt=dt), table, lens, Dl, meta, splits)


def test_every_op_registered():
    names = {n for n, _, _ in cases()}
    assert names == set(lkt.OPS)
    for n in lkt.OPS:
        assert hasattr(OPS, n)


VLLM_SCHEMAS = {  # as vLLM's csrc/torch_bindings.cpp / cache ops define them
    "rms_norm": "rms_norm(Tensor! result, Tensor input, Tensor? weight, float epsilon) -> ()",
    "fused_add_rms_norm": "fused_add_rms_norm(Tensor! input, Tensor! residual, Tensor? weight, float epsilon) -> ()",
    "silu_and_mul": "silu_and_mul(Tensor! result, Tensor input) -> ()",
    "mul_and_silu": "mul_and_silu(Tensor! out, Tensor input) -> ()",
    "gelu_and_mul": "gelu_and_mul(Tensor! out, Tensor input) -> ()",
    "gelu_tanh_and_mul": "gelu_tanh_and_mul(Tensor! out, Tensor input) -> ()",
    "fatrelu_and_mul": "fatrelu_and_mul(Tensor! out, Tensor input, float threshold) -> ()",
    "swigluoai_and_mul": "swigluoai_and_mul(Tensor! out, Tensor input, float alpha=1.702, float limit=7.0) -> ()",
    "gelu_new": "gelu_new(Tensor! out, Tensor input) -> ()",
    "gelu_fast": "gelu_fast(Tensor! out, Tensor input) -> ()",
    "gelu_quick": "gelu_quick(Tensor! out, Tensor input) -> ()",
    "rotary_embedding": "rotary_embedding(Tensor positions, Tensor! query, Tensor!? key, int head_size, "
                        "Tensor cos_sin_cache, bool is_neox) -> ()",
    "reshape_and_cache_flash": "reshape_and_cache_flash(Tensor key, Tensor value, Tensor! key_cache, "
                               "Tensor! value_cache, Tensor slot_mapping, str kv_cache_dtype, Tensor k_scale, "
                               "Tensor v_scale) -> ()",
    "concat_and_cache_mla": "concat_and_cache_mla(Tensor kv_c, Tensor k_pe, Tensor! kv_cache, Tensor slot_mapping, "
                            "str kv_cache_dtype, Tensor scale) -> ()",
    "concat_and_cache_mla_rope_fused": "concat_and_cache_mla_rope_fused(Tensor positions, Tensor! q_pe, Tensor! k_pe, "
                                       "Tensor kv_c, Tensor cos_sin_cache, bool is_neox, Tensor slot_mapping, "
                                       "Tensor! kv_cache, str kv_cache_dtype, Tensor kv_cache_scale) -> ()",
    "swap_blocks": "swap_blocks(Tensor src, Tensor! dst, Tensor block_mapping) -> ()",
    "copy_blocks": "copy_blocks(Tensor(a!)[] key_caches, Tensor[](b!) value_caches, Tensor block_mapping) -> ()",
    "copy_blocks_mla": "copy_blocks_mla(Tensor(a!)[] kv_caches, Tensor block_mapping) -> ()",
    "convert_fp8": "convert_fp8(Tensor! dst_cache, Tensor src_cache, float scale, str kv_cache_dtype) -> ()",
    "gather_and_maybe_dequant_cache": "gather_and_maybe_dequant_cache(Tensor src_cache, Tensor! dst, "
                                      "Tensor block_table, Tensor cu_seq_lens, int batch_size, "
                                      "str kv_cache_dtype, Tensor scale, Tensor? seq_starts=None) -> ()",
    "cp_gather_and_upconvert_fp8_kv_cache": "cp_gather_and_upconvert_fp8_kv_cache(Tensor src_cache, Tensor! dst, "
                                            "Tensor block_table, Tensor seq_lens, Tensor workspace_starts, "
                                            "int batch_size) -> ()",
    "static_scaled_fp8_quant": "static_scaled_fp8_quant(Tensor! result, Tensor input, Tensor scale, "
                               "int[]? group_shape=None) -> ()",
    "dynamic_scaled_fp8_quant": "dynamic_scaled_fp8_quant(Tensor! result, Tensor input, Tensor! scale) -> ()",
    "dynamic_per_token_scaled_fp8_quant": "dynamic_per_token_scaled_fp8_quant(Tensor! result, Tensor input, "
                                          "Tensor! scale, Tensor? scale_ub) -> ()",
    "per_token_group_fp8_quant": "per_token_group_fp8_quant(Tensor input, Tensor! output_q, Tensor! output_s, "
                                 "int group_size, float eps, float fp8_min, float fp8_max, bool scale_ue8m0, "
                                 "bool dummy_is_scale_transposed, bool dummy_is_tma_aligned) -> ()",
    "per_token_group_fp8_quant_packed": "per_token_group_fp8_quant_packed(Tensor input, Tensor! output_q, "
                                        "Tensor! output_s_packed, int group_size, float eps, float fp8_min, "
                                        "float fp8_max) -> ()",
    "rms_norm_static_fp8_quant": "rms_norm_static_fp8_quant(Tensor! result, Tensor input, Tensor weight, "
                                 "Tensor scale, float epsilon) -> ()",
    "fused_add_rms_norm_static_fp8_quant": "fused_add_rms_norm_static_fp8_quant(Tensor! result, Tensor input, "
                                           "Tensor! residual, Tensor weight, Tensor scale, float epsilon) -> ()",
    "rms_norm_dynamic_per_token_quant": "rms_norm_dynamic_per_token_quant(Tensor! result, Tensor input, "
                                        "Tensor weight, Tensor! scale, float epsilon, Tensor? scale_ub, "
                                        "Tensor!? residual) -> ()",
    "rms_norm_per_block_quant": "rms_norm_per_block_quant(Tensor! result, Tensor input, Tensor weight, "
                                "Tensor! scale, float epsilon, Tensor? scale_ub, Tensor!? residual, "
                                "int group_size, bool is_scale_transposed) -> ()",
    "silu_and_mul_quant": "silu_and_mul_quant(Tensor! result, Tensor input, Tensor scale) -> ()",
    "silu_and_mul_per_block_quant": "silu_and_mul_per_block_quant(Tensor! out, Tensor input, Tensor! scales, "
                                    "int group_size, Tensor? scale_ub=None, bool is_scale_transposed=False) -> ()",
    "static_scaled_int8_quant": "static_scaled_int8_quant(Tensor! result, Tensor input, Tensor scale, "
                                "Tensor? azp) -> ()",
    "dynamic_scaled_int8_quant": "dynamic_scaled_int8_quant(Tensor! result, Tensor input, Tensor! scale, "
                                 "Tensor!? azp) -> ()",
    "per_token_group_quant_int8": "per_token_group_quant_int8(Tensor input, Tensor! output_q, Tensor! output_s, "
                                  "int group_size, float eps, float int8_min, float int8_max) -> ()",
}


def _args(schema):
    return [(a.name, str(a.type), bool(a.alias_info and a.alias_info.is_write), a.default_value)
            for a in schema.arguments], [str(r.type) for r in schema.returns]


@pytest.mark.parametrize("name", sorted(VLLM_SCHEMAS))
def test_schemas_as_vllm(name):
    got = getattr(OPS, name).default._schema
    assert _args(got) == _args(torch._C.parse_schema(VLLM_SCHEMAS[name]))


@pytest.mark.parametrize("i", range(len(cases())))
def test_opcheck(i):
    name, args, kwargs = cases()[i]
    utils = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    if any(isinstance(a, torch.Tensor) and a.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) for a in args):
        # test_schema compares the mutated arguments with arithmetic torch's CPU kernels
        # lack for float8 ("mul_cpu_reduced_float"); the mutation marks of the fp8 ops are
        # checked by test_schemas_as_vllm, the outputs by tests/python/test_fp8_act.py
        utils = utils[1:]
    torch.library.opcheck(getattr(OPS, name).default, args, kwargs, test_utils=utils)


def test_ops_match_binding():
    x = rn(6, 128, dt=torch.bfloat16)
    a, b = torch.empty(6, 64, dtype=torch.bfloat16), torch.empty(6, 64, dtype=torch.bfloat16)
    OPS.swigluoai_and_mul(a, x, 1.702, 7.0)
    lk.swigluoai_and_mul(b, x)
    assert torch.equal(a, b)


@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("sq,causal", [(1, False), (2, True)])
def test_mla_decode_op_matches_binding(dt, sq, causal):
    args = mla_decode_args(dt, sq)
    meta, splits = OPS.get_mla_metadata(args[3], sq * 4, 1)
    want_meta, want_splits = lk.get_mla_metadata(args[3], sq * 4, 1)
    assert torch.equal(meta, want_meta) and torch.equal(splits, want_splits)
    o, lse = OPS.flash_mla_with_kvcache(*args, causal=causal)
    wo, wlse = lk.flash_mla_with_kvcache(*args, causal=causal)
    assert o.dtype == dt and o.shape == (3, sq, 4, 32) and lse.dtype == torch.float32 and lse.shape == (3, 4, sq)
    assert torch.equal(o.view(torch.int16) if dt == torch.bfloat16 else o.view(torch.int32),
                       wo.view(torch.int16) if dt == torch.bfloat16 else wo.view(torch.int32))
    assert torch.equal(lse, wlse)  # -inf rows of the empty request compare equal
    assert torch.isinf(lse[1]).all() and not torch.isnan(lse).any()


def test_mla_decode_torch_compile_fullgraph():
    """The planning call and the decode inside one compiled graph, against the eager binding."""
    def decode(q, k_cache, table, lens):
        meta, splits = torch.ops.llmkern.get_mla_metadata(lens, q.shape[1] * q.shape[2], 1)
        o, lse = torch.ops.llmkern.flash_mla_with_kvcache(q, k_cache, table, lens, 32, meta, splits, causal=True)
        return o * 2.0, lse

    args = mla_decode_args(torch.float32, 2)
    want_o, want_lse = lk.flash_mla_with_kvcache(*args, causal=True)
    got_o, got_lse = torch.compile(decode, fullgraph=True)(*args[:4])
    assert torch.equal(got_o, want_o * 2.0) and torch.equal(got_lse, want_lse)


class Block(torch.nn.Module):
    """A decoder block's worth of llmkern calls: norm, rotary, cache write, attention,
    merge, activation, residual norm."""

    def __init__(self, H=4, Hk=2, D=32):
        super().__init__()
        self.H, self.Hk, self.D = H, Hk, D
        self.w = torch.nn.Parameter(torch.rand(H * D) + 0.5, requires_grad=False)
        self.register_buffer("cs", cos_sin(64, D))

    def forward(self, x, res, pos, k_cache, v_cache, slots, cu, seqused, table):
        H, Hk, D = self.H, self.Hk, self.D
        T = x.shape[0]
        h = torch.empty_like(x)
        torch.ops.llmkern.rms_norm(h, x, self.w, 1e-6)
        q = h.clone()
        k = h[:, : Hk * D].clone()
        v = h[:, Hk * D: 2 * Hk * D].clone()
        torch.ops.llmkern.rotary_embedding(pos, q, k, D, self.cs, True)
        one = torch.ones(())
        torch.ops.llmkern.reshape_and_cache_flash(k.view(T, Hk, D), v.view(T, Hk, D), k_cache, v_cache, slots,
                                                  "auto", one, one)
        o, lse = torch.ops.llmkern.flash_attn_varlen_func(q.view(T, H, D), k_cache, v_cache, cu, None,
                                                          seqused_k=seqused, block_table=table, causal=True)
        merged = torch.empty_like(o)
        torch.ops.llmkern.merge_attn_states(merged, None, o, lse, o, lse)
        g = torch.empty(T, H * D // 2)
        torch.ops.llmkern.silu_and_mul(g, merged.reshape(T, H * D))
        y = torch.cat([g, g], dim=1)
        torch.ops.llmkern.fused_add_rms_norm(y, res, None, 1e-6)
        return y, res


def test_torch_compile_fullgraph():
    H, Hk, D, bs = 4, 2, 32, 4
    m = Block(H, Hk, D)

    def inputs():
        g = torch.Generator().manual_seed(3)
        T = 6
        return (torch.randn(T, H * D, generator=g), torch.randn(T, H * D, generator=g), torch.tensor([0, 1, 2, 0, 1, 2]),
                torch.zeros(4, bs, Hk, D), torch.zeros(4, bs, Hk, D), torch.tensor([8, 9, 10, 4, 5, 6]),
                torch.tensor([0, 3, 6], dtype=torch.int32), torch.tensor([3, 3], dtype=torch.int32),
                torch.tensor([[2], [1]], dtype=torch.int32))

    want = m(*inputs())
    a = inputs()
    got = torch.compile(m, fullgraph=True)(*a)
    for g_, w_ in zip(got, want):
        torch.testing.assert_close(g_, w_, rtol=1e-5, atol=1e-5)
    assert torch.count_nonzero(a[3]) > 0  # the cache write happened in the compiled graph
