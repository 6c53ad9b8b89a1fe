/*
 * The public functions the bench calls, reached through a table of function pointers:
 * one table for the statically linked library, one per --lib build (dlopen'ed,
 * RTLD_LOCAL, each function taken with dlsym). bench_api points at the current table;
 * bench_use_variant (bench.h) switches it with the variant, so every lk_ call of the
 * bench files goes to the library of the variant being timed.
 *
 * Adding a call to the bench: its name in BENCH_API (the table) and in the #define list
 * below (the redirection); a name in BENCH_API without its #define fails to compile
 * (the check after the list). Functions that older builds lack go in BENCH_API_OPT: a
 * --lib build without one still loads (its entry NULL), and the rows that call it check
 * bench_libs_have first. A function in neither list is the linked build's alone (with
 * --lib every variant would time that build, at the variant's ISA). Include llmkern.h
 * before this file, never after.
 */
#ifndef LK_BENCH_API_H
#define LK_BENCH_API_H

#include "llmkern.h"

#define BENCH_API(X)             \
    X(lk_last_error)             \
    X(lk_version)                \
    X(lk_dtype_name)             \
    X(lk_dtype_size)             \
    X(lk_tensor_make)            \
    X(lk_isa_best)               \
    X(lk_isa_current)            \
    X(lk_set_isa)                \
    X(lk_isa_name)               \
    X(lk_set_num_threads)        \
    X(lk_get_num_threads)        \
    X(lk_rms_norm)               \
    X(lk_fused_add_rms_norm)     \
    X(lk_silu_and_mul)           \
    X(lk_gelu_tanh_and_mul)      \
    X(lk_rotary_embedding)       \
    X(lk_reshape_and_cache_flash) \
    X(lk_merge_attn_states)      \
    X(lk_causal_softmax)         \
    X(lk_concat_and_cache_mla)   \
    X(lk_gather_cache)           \
    X(lk_attn_params_default)    \
    X(lk_flash_attn_varlen)      \
    X(lk_mla_params_default)     \
    X(lk_mla_prefix_prefill)     \
    X(lk_mla_last_trace)         \
    X(lk_mla_strategy_name)

/* since 0.3 */
#define BENCH_API_OPT(X)                       \
    X(lk_flash_attn_varlen_scaled)             \
    X(lk_mla_decode_params_default)            \
    X(lk_mla_decode)                           \
    X(lk_static_scaled_fp8_quant)              \
    X(lk_dynamic_scaled_fp8_quant)             \
    X(lk_dynamic_per_token_scaled_fp8_quant)   \
    X(lk_rms_norm_static_fp8_quant)            \
    X(lk_fused_add_rms_norm_static_fp8_quant)  \
    X(lk_rms_norm_dynamic_per_token_quant)     \
    X(lk_merge_attn_states_scaled)             \
    X(lk_static_scaled_int8_quant)             \
    X(lk_dynamic_scaled_int8_quant)            \
    X(lk_per_token_group_fp8_quant)            \
    X(lk_static_group_scaled_fp8_quant)        \
    X(lk_rms_norm_per_block_quant)             \
    X(lk_silu_and_mul_quant)                   \
    X(lk_silu_and_mul_per_block_quant)         \
    X(lk_concat_and_cache_mla_fp8)             \
    X(lk_concat_and_cache_mla_rope)

#define BENCH_API_MEMBER(f) __typeof__(f) *f;
typedef struct {
    BENCH_API(BENCH_API_MEMBER)
    BENCH_API_OPT(BENCH_API_MEMBER)
} bench_api_table;
#undef BENCH_API_MEMBER

/* the current variant's library; at start-up the statically linked one */
extern const bench_api_table *bench_api;
/* sets the statically linked library's ISA (for its functions that the bench calls directly) */
void bench_linked_set_isa(lk_isa isa);

/* a library's table from the shared object at `path`; 0, or -1 with a message on stderr */
int bench_api_open(const char *path, bench_api_table *t);

/* whether table t has the function `name` (a name of BENCH_API_OPT; any other: 1) */
int bench_api_has(const bench_api_table *t, const char *name);

#ifndef BENCH_API_DIRECT
#define lk_last_error (bench_api->lk_last_error)
#define lk_version (bench_api->lk_version)
#define lk_dtype_name (bench_api->lk_dtype_name)
#define lk_dtype_size (bench_api->lk_dtype_size)
#define lk_tensor_make (bench_api->lk_tensor_make)
#define lk_isa_best (bench_api->lk_isa_best)
#define lk_isa_current (bench_api->lk_isa_current)
#define lk_set_isa (bench_api->lk_set_isa)
#define lk_isa_name (bench_api->lk_isa_name)
#define lk_set_num_threads (bench_api->lk_set_num_threads)
#define lk_get_num_threads (bench_api->lk_get_num_threads)
#define lk_rms_norm (bench_api->lk_rms_norm)
#define lk_fused_add_rms_norm (bench_api->lk_fused_add_rms_norm)
#define lk_silu_and_mul (bench_api->lk_silu_and_mul)
#define lk_gelu_tanh_and_mul (bench_api->lk_gelu_tanh_and_mul)
#define lk_rotary_embedding (bench_api->lk_rotary_embedding)
#define lk_reshape_and_cache_flash (bench_api->lk_reshape_and_cache_flash)
#define lk_merge_attn_states (bench_api->lk_merge_attn_states)
#define lk_causal_softmax (bench_api->lk_causal_softmax)
#define lk_concat_and_cache_mla (bench_api->lk_concat_and_cache_mla)
#define lk_gather_cache (bench_api->lk_gather_cache)
#define lk_attn_params_default (bench_api->lk_attn_params_default)
#define lk_flash_attn_varlen (bench_api->lk_flash_attn_varlen)
#define lk_mla_params_default (bench_api->lk_mla_params_default)
#define lk_mla_prefix_prefill (bench_api->lk_mla_prefix_prefill)
#define lk_mla_last_trace (bench_api->lk_mla_last_trace)
#define lk_mla_strategy_name (bench_api->lk_mla_strategy_name)
#define lk_flash_attn_varlen_scaled (bench_api->lk_flash_attn_varlen_scaled)
#define lk_mla_decode_params_default (bench_api->lk_mla_decode_params_default)
#define lk_mla_decode (bench_api->lk_mla_decode)
#define lk_static_scaled_fp8_quant (bench_api->lk_static_scaled_fp8_quant)
#define lk_dynamic_scaled_fp8_quant (bench_api->lk_dynamic_scaled_fp8_quant)
#define lk_dynamic_per_token_scaled_fp8_quant (bench_api->lk_dynamic_per_token_scaled_fp8_quant)
#define lk_per_token_group_fp8_quant (bench_api->lk_per_token_group_fp8_quant)
#define lk_static_group_scaled_fp8_quant (bench_api->lk_static_group_scaled_fp8_quant)
#define lk_rms_norm_per_block_quant (bench_api->lk_rms_norm_per_block_quant)
#define lk_silu_and_mul_quant (bench_api->lk_silu_and_mul_quant)
#define lk_silu_and_mul_per_block_quant (bench_api->lk_silu_and_mul_per_block_quant)
#define lk_concat_and_cache_mla_fp8 (bench_api->lk_concat_and_cache_mla_fp8)
#define lk_concat_and_cache_mla_rope (bench_api->lk_concat_and_cache_mla_rope)
#define lk_rms_norm_static_fp8_quant (bench_api->lk_rms_norm_static_fp8_quant)
#define lk_fused_add_rms_norm_static_fp8_quant (bench_api->lk_fused_add_rms_norm_static_fp8_quant)
#define lk_rms_norm_dynamic_per_token_quant (bench_api->lk_rms_norm_dynamic_per_token_quant)
#define lk_merge_attn_states_scaled (bench_api->lk_merge_attn_states_scaled)
#define lk_static_scaled_int8_quant (bench_api->lk_static_scaled_int8_quant)
#define lk_dynamic_scaled_int8_quant (bench_api->lk_dynamic_scaled_int8_quant)

/* every name of BENCH_API is redirected: its expansion is longer than the name */
#define BENCH_API_STR_(x) #x
#define BENCH_API_STR(x) BENCH_API_STR_(x)
#define BENCH_API_CHECK(f) _Static_assert(sizeof BENCH_API_STR(f) > sizeof #f, #f " has no #define in bench_api.h");
BENCH_API(BENCH_API_CHECK)
BENCH_API_OPT(BENCH_API_CHECK)
#undef BENCH_API_CHECK
#endif

#endif
