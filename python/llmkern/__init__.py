"""llmkern: Python binding of the llmkern C kernel library (CPU LLM-inference operators).

A thin ctypes layer: NumPy arrays and torch CPU tensors are passed zero-copy as strided
views; signatures follow vLLM's custom ops and flash-attention. The shared library is
found through $LLMKERN_LIB (file or directory), the copy installed with the package, or
the repository's build/ directory.
"""
from ._lib import LlmkernError, lib_path
from .ops import (
    best_isa,
    causal_softmax,
    concat_and_cache_mla,
    concat_and_cache_mla_rope_fused,
    flash_attn_varlen_func,
    flash_mla_with_kvcache,
    fused_add_rms_norm,
    gather_cache,
    gelu_tanh_and_mul,
    gemma_fused_add_rms_norm,
    gemma_rms_norm,
    get_mla_metadata,
    get_num_threads,
    isa,
    merge_attn_states,
    mla_last_trace,
    mla_prefix_prefill,
    reshape_and_cache_flash,
    rms_norm,
    rotary_embedding,
    set_isa,
    set_num_threads,
    silu_and_mul,
    version,
)
from .ops import copy_blocks, copy_blocks_mla, swap_blocks  # noqa: E402  (cache management)
from .ops import flash_attn_with_kvcache  # noqa: E402
from .ops import convert_fp8, cp_gather_cache, gather_and_maybe_dequant_cache  # noqa: E402  (fp8 caches)
from .ops import cp_gather_and_upconvert_fp8_kv_cache  # noqa: E402  (fp8_ds_mla caches)
from .ops import (  # vLLM's other activations
    fatrelu_and_mul,
    gelu_and_mul,
    gelu_fast,
    gelu_new,
    gelu_quick,
    mul_and_silu,
    swigluoai_and_mul,
)

from .ops import (  # fp8 activations (vLLM's names)
    dynamic_per_token_scaled_fp8_quant,
    dynamic_scaled_fp8_quant,
    fused_add_rms_norm_static_fp8_quant,
    per_token_group_fp8_quant,
    per_token_group_fp8_quant_packed,
    per_token_group_quant_fp8,
    per_token_group_quant_fp8_packed_for_deepgemm,
    rms_norm_dynamic_per_token_quant,
    rms_norm_per_block_quant,
    rms_norm_static_fp8_quant,
    scaled_fp8_quant,
    silu_and_mul_per_block_quant,
    silu_and_mul_quant,
    static_scaled_fp8_quant,
)
from .ops import (  # int8 activations (vLLM's names)
    dynamic_scaled_int8_quant,
    per_token_group_quant_int8,
    per_token_group_quant_int8_into,
    scaled_int8_quant,
    static_scaled_int8_quant,
)

__version__ = "0.3.0"

__all__ = [
    "LlmkernError", "lib_path", "rms_norm", "fused_add_rms_norm", "gemma_rms_norm",
    "gemma_fused_add_rms_norm", "silu_and_mul", "gelu_tanh_and_mul", "rotary_embedding",
    "reshape_and_cache_flash", "concat_and_cache_mla", "concat_and_cache_mla_rope_fused",
    "gather_cache", "merge_attn_states",
    "flash_attn_varlen_func", "mla_prefix_prefill", "mla_last_trace", "causal_softmax", "set_num_threads",
    "get_num_threads", "isa", "best_isa", "set_isa", "version",
    "gelu_and_mul", "mul_and_silu", "fatrelu_and_mul", "swigluoai_and_mul", "gelu_new", "gelu_fast",
    "gelu_quick", "swap_blocks", "copy_blocks", "copy_blocks_mla", "flash_attn_with_kvcache",
    "flash_mla_with_kvcache", "get_mla_metadata",
    "convert_fp8", "cp_gather_cache", "gather_and_maybe_dequant_cache",  # fp8 caches
    "cp_gather_and_upconvert_fp8_kv_cache",  # fp8_ds_mla caches
    # fp8 activations
    "scaled_fp8_quant", "static_scaled_fp8_quant", "dynamic_scaled_fp8_quant",
    "dynamic_per_token_scaled_fp8_quant", "rms_norm_static_fp8_quant",
    "fused_add_rms_norm_static_fp8_quant", "rms_norm_dynamic_per_token_quant",
    "per_token_group_fp8_quant", "per_token_group_quant_fp8", "rms_norm_per_block_quant",
    "per_token_group_fp8_quant_packed", "per_token_group_quant_fp8_packed_for_deepgemm",
    "silu_and_mul_quant", "silu_and_mul_per_block_quant",
    # int8 activations
    "scaled_int8_quant", "static_scaled_int8_quant", "dynamic_scaled_int8_quant",
    "per_token_group_quant_int8", "per_token_group_quant_int8_into",
]
