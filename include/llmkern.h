/*
 * llmkern: the operators an LLM inference engine runs around its matrix multiplies.
 *
 * One public header, C11, no dependencies beyond <stdint.h>/<stddef.h>.
 *
 * Conventions (see docs/ops.md for the maths of every operator):
 *  - A tensor is a non-owning strided view: data pointer, dtype, rank, shape and
 *    strides counted in ELEMENTS (the DLPack / PyTorch convention). Strides may be
 *    any value, including 0 for broadcast inputs; outputs must not overlap themselves.
 *  - Every function returns lk_status. On failure nothing has been written and
 *    lk_last_error() returns a thread-local message naming the argument and the rule.
 *  - Arithmetic is f32 (reductions in f32 or wider); each output value is rounded once
 *    to its storage dtype.
 *  - The library never prints, aborts or exits.
 */
#ifndef LLMKERN_H
#define LLMKERN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LLMKERN_VERSION_MAJOR 0
#define LLMKERN_VERSION_MINOR 3
#define LLMKERN_VERSION_PATCH 0
#define LLMKERN_VERSION_STRING "0.3.0"

#if defined(_WIN32) && defined(LLMKERN_SHARED_BUILD)
#define LK_API __declspec(dllexport)
#elif defined(__GNUC__)
#define LK_API __attribute__((visibility("default")))
#else
#define LK_API
#endif

/* ---------------------------------------------------------------- status */

typedef enum lk_status {
    LK_OK = 0,
    LK_ERR_NULL = 1,        /* a required pointer is NULL                         */
    LK_ERR_RANK = 2,        /* wrong number of dimensions                          */
    LK_ERR_SHAPE = 3,       /* shape mismatch between arguments / negative size    */
    LK_ERR_DTYPE = 4,       /* dtype not supported for this argument               */
    LK_ERR_LAYOUT = 5,      /* strides not usable (e.g. required stride 1)         */
    LK_ERR_INDEX = 6,       /* an index tensor holds an out-of-range value         */
    LK_ERR_ALIAS = 7,       /* output overlaps an input or itself where not allowed */
    LK_ERR_OVERFLOW = 8,    /* sizes or offsets overflow int64                      */
    LK_ERR_VALUE = 9,       /* a scalar argument is out of its domain               */
    LK_ERR_UNSUPPORTED = 10,/* valid request this build / CPU cannot serve          */
    LK_ERR_NOMEM = 11       /* scratch allocation failed                            */
} lk_status;

/* Short constant name of a status ("LK_ERR_SHAPE", ...). */
LK_API const char *lk_status_str(lk_status s);
/* Message of the last failed call on this thread ("" if none). Valid until the next
 * call into the library from the same thread. */
LK_API const char *lk_last_error(void);

LK_API const char *lk_version(void);

/* ---------------------------------------------------------------- tensors */

typedef enum lk_dtype {
    LK_F32 = 0,
    LK_F16 = 1,
    LK_BF16 = 2,
    LK_I32 = 3,
    LK_I64 = 4,
    /* 1-byte floats (storage only: the caches of lk_reshape_and_cache_flash_scaled; every
     * other argument rejects them with LK_ERR_DTYPE naming it). f32 -> fp8 rounds to nearest even and
     * saturates to the finite range (inf too); NaN stays NaN; fp8 -> f32 is exact. */
    LK_F8E4M3 = 5, /* OCP float8 e4m3fn: bias 7, max 448, no inf, NaN = S.1111.111 */
    LK_F8E5M2 = 6, /* OCP float8 e5m2: bias 15, max 57344, inf / NaN as IEEE     */
    /* signed 8-bit integer (since 0.3): the quantized output of
     * lk_rms_norm_dynamic_per_token_quant and of the int8 quantizers
     * (lk_static_scaled_int8_quant, lk_dynamic_scaled_int8_quant) only (every other
     * argument rejects it with LK_ERR_DTYPE naming it). f32 -> i8 rounds to nearest even,
     * saturates to [-128, 127]; NaN gives 0. */
    LK_I8 = 7
} lk_dtype;

#define LK_MAX_DIMS 8

typedef struct lk_tensor {
    void *data;                  /* address of element [0, 0, ...]            */
    lk_dtype dtype;
    int32_t ndim;                /* 0 .. LK_MAX_DIMS                           */
    int64_t shape[LK_MAX_DIMS];
    int64_t stride[LK_MAX_DIMS]; /* in elements; any sign                      */
} lk_tensor;

LK_API const char *lk_dtype_name(lk_dtype dt);
LK_API size_t lk_dtype_size(lk_dtype dt); /* 0 for an unknown dtype */

/* Fill a contiguous (row-major) view. Returns the view by value. */
LK_API lk_tensor lk_tensor_make(void *data, lk_dtype dtype, int32_t ndim, const int64_t *shape);

/* ---------------------------------------------------------------- runtime */

typedef enum lk_isa {
    LK_ISA_REF = 0,    /* portable scalar reference                      */
    LK_ISA_AVX2 = 1,   /* AVX2 + FMA + F16C                              */
    LK_ISA_AVX512 = 2, /* AVX-512 F/BW/DQ/VL                              */
    LK_ISA_AVX512BF16 = 3, /* AVX-512 + AVX512_BF16: bf16 attention on dot products */
    LK_ISA_NEON = 4,   /* aarch64 Advanced SIMD (4 x f32)                */
    LK_ISA_AMX = 5     /* avx512bf16 + AMX-TILE / AMX-BF16: mla_decode on bf16 tile products;
                          the other ops as on avx512bf16 (x86; after avx512bf16 in order) */
} lk_isa;

/* Best ISA the CPU and OS support. */
LK_API lk_isa lk_isa_best(void);
/* ISA in use: the best, unless LLMKERN_ISA=ref|avx2|avx512|avx512bf16|amx|neon or lk_set_isa chose one. */
LK_API lk_isa lk_isa_current(void);
/* Force an ISA (process-wide). LK_ERR_UNSUPPORTED if this CPU cannot run it. */
LK_API lk_status lk_set_isa(lk_isa isa);
LK_API const char *lk_isa_name(lk_isa isa);

/* Threads used by the operators (process-wide). n <= 0 restores the default
 * (OMP_NUM_THREADS, else the number of CPUs). Results never depend on it. */
LK_API void lk_set_num_threads(int n);
LK_API int lk_get_num_threads(void);

/* ---------------------------------------------------------------- normalisation */

/* out[..., D] = x * rsqrt(mean(x^2) + eps) * w            (gemma = 0)
 *             = x * rsqrt(mean(x^2) + eps) * (1 + w)      (gemma != 0)
 * x, out: [..., D], same shape, any rank >= 1; w: [D]. out may be x itself
 * (identical view); any other overlap is an error. eps >= 0.
 * w == NULL: no weight (vLLM's `Tensor? weight`): out = x * rsqrt(mean(x^2) + eps),
 * `gemma` is then ignored. Also for lk_fused_add_rms_norm. */
LK_API lk_status lk_rms_norm(const lk_tensor *out, const lk_tensor *x, const lk_tensor *w,
                             float eps, int gemma);

/* residual = round(x + residual); x = rms_norm(residual) (both in place).
 * x, residual: [..., D] same shape; w: [D] or NULL (no weight). */
LK_API lk_status lk_fused_add_rms_norm(const lk_tensor *x, const lk_tensor *residual,
                                       const lk_tensor *w, float eps, int gemma);

/* ---------------------------------------------------------------- activations */

/* x: [..., 2d], out: [..., d]; out = act(x[..., :d]) * x[..., d:] (the first half is
 * the gate), any rank >= 1, leading dims of any strides, every f32/f16/bf16 pairing.
 *   silu(g)      = g / (1 + exp(-g))
 *   gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))  (PyTorch approximate='tanh',
 *                  evaluated as g / (1 + exp(-2u)): no cancellation for any g)
 * act(-inf) = -0 (the limit; so act(-inf) * y = -0 * y), act(+inf) = +inf, NaN propagates.
 * Errors: x's last dim odd or out's shape not x's with the last dim halved (LK_ERR_SHAPE),
 * out overlapping x or itself (LK_ERR_ALIAS). */
LK_API lk_status lk_silu_and_mul(const lk_tensor *out, const lk_tensor *x);
LK_API lk_status lk_gelu_tanh_and_mul(const lk_tensor *out, const lk_tensor *x);

/* More activations, vLLM's names, the same contract as lk_silu_and_mul (every f32/f16/bf16
 * pairing, any strides, f32 arithmetic, one rounding per output). Gated forms, x [..., 2d]
 * -> out [..., d], g = x[..., :d] and u = x[..., d:] unless said:
 *   gelu_and_mul       gelu(g) * u, gelu(g) = 0.5 g (1 + erf(g / sqrt(2))) (exact GELU,
 *                      evaluated as 0.5 g erfc(-g / sqrt(2)): no cancellation for g << 0)
 *   mul_and_silu       g * silu(u) (the activation is on the SECOND half)
 *   fatrelu_and_mul    (g > threshold ? g : 0) * u (a NaN gate gives 0 * u); threshold finite
 *   swigluoai_and_mul  gpt-oss, INTERLEAVED halves g = x[..., 0::2], u = x[..., 1::2]:
 *                      g = min(g, limit), u = clamp(u, -limit, limit),
 *                      out = (u + 1) * g * sigmoid(alpha * g); vLLM's defaults alpha = 1.702,
 *                      limit = 7; alpha and limit finite and > 0 (else LK_ERR_VALUE)
 * Element-wise forms, out shaped like x:
 *   gelu_new, gelu_fast  0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (gelu_fast's
 *                      constant 0.7978845608 is sqrt(2/pi) in f32: the same function),
 *                      evaluated as x / (1 + exp(-2u)) like gelu_tanh
 *   gelu_quick         x * sigmoid(1.702 x)
 * Special values: every activation's limit at -inf is -0 (so act(-inf) * y = -0 * y),
 * +inf gives +inf, NaN propagates (clamps keep a NaN; fatrelu's compare maps it to 0).
 * Errors as lk_silu_and_mul's (odd last dim and out's shape for the gated forms). */
LK_API lk_status lk_gelu_and_mul(const lk_tensor *out, const lk_tensor *x);
LK_API lk_status lk_mul_and_silu(const lk_tensor *out, const lk_tensor *x);
LK_API lk_status lk_fatrelu_and_mul(const lk_tensor *out, const lk_tensor *x, float threshold);
LK_API lk_status lk_swigluoai_and_mul(const lk_tensor *out, const lk_tensor *x, float alpha, float limit);
LK_API lk_status lk_gelu_new(const lk_tensor *out, const lk_tensor *x);
LK_API lk_status lk_gelu_fast(const lk_tensor *out, const lk_tensor *x);
LK_API lk_status lk_gelu_quick(const lk_tensor *out, const lk_tensor *x);

/* ---------------------------------------------------------------- rotary */

/* In place. positions: [T] (i64 or i32), each in [0, max_pos) (else LK_ERR_INDEX, nothing
 * written); q: [T, Hq, D]; k: [T, Hk, D] or NULL;
 * cos_sin_cache: [max_pos, rot] = [cos(0..rot/2) | sin(0..rot/2)], rot even, rot <= D.
 * is_neox: pairs (i, i + rot/2); else GPT-J pairs (2i, 2i + 1); both use cos[i], sin[i]:
 * x' = x*cos - y*sin, y' = y*cos + x*sin. Dims [rot, D) are not touched.
 * q, k and the cache may each be f32/f16/bf16; q and k may have different head counts and
 * may be slices of one fused qkv buffer (any token/head strides); they must not overlap
 * each other, the cache or the positions. */
LK_API lk_status lk_rotary_embedding(const lk_tensor *positions, const lk_tensor *q,
                                     const lk_tensor *k, const lk_tensor *cos_sin_cache,
                                     int is_neox);

/* ---------------------------------------------------------------- KV cache */

/* k: [T, H, Dk], v: [T, H, Dv]; k_cache: [num_blocks, block_size, H, Dk], v_cache:
 * [num_blocks, block_size, H, Dv] (any strides: an HND cache is passed as a permuted
 * view; block_size >= 1; Dv may differ from Dk); slot_mapping: [N <= T] (i64 or i32).
 * Token t < N goes to block slot / block_size, offset slot % block_size; slot < 0 is
 * skipped (padding). A slot >= num_blocks * block_size or used by two tokens is
 * LK_ERR_INDEX. The caches' dtypes may differ from k's and v's (one rounding); equal
 * dtypes copy the bits. The caches must not overlap each other (interleaved views of
 * one [num_blocks, 2, ...] buffer are fine), themselves, k, v or slot_mapping. */
LK_API lk_status lk_reshape_and_cache_flash(const lk_tensor *k, const lk_tensor *v,
                                            const lk_tensor *k_cache, const lk_tensor *v_cache,
                                            const lk_tensor *slot_mapping);

/* lk_reshape_and_cache_flash with per-tensor scales (vLLM's k_scale / v_scale): the
 * caches may also be LK_F8E4M3 / LK_F8E5M2, each element stored as fp8(x / scale) (one
 * f32 division, then round to nearest even saturated to the finite range; NaN stays
 * NaN). A cache of another dtype ignores its scale (vLLM's kv_cache_dtype "auto").
 * k_scale and v_scale must be finite and > 0 (else LK_ERR_VALUE naming it, nothing
 * written). Everything else as lk_reshape_and_cache_flash. */
LK_API lk_status lk_reshape_and_cache_flash_scaled(const lk_tensor *k, const lk_tensor *v,
                                                   const lk_tensor *k_cache, const lk_tensor *v_cache,
                                                   const lk_tensor *slot_mapping, float k_scale,
                                                   float v_scale);

/* Block copies of paged caches (vLLM's swap_blocks / copy_blocks / copy_blocks_mla).
 * A cache is any view whose dim 0 indexes blocks ([num_blocks, block_size, H, D], an MLA
 * cache [num_blocks, block_size, Dl + Dr], an NZ physical view, ...); a block is
 * everything under one dim-0 index, copied bit for bit (any strides; f32/f16/bf16, and
 * since 0.3 the fp8 dtypes LK_F8E4M3 / LK_F8E5M2).
 * block_mapping [N, 2] i64 or i32: row i copies block block_mapping[i, 0] of the source
 * to block block_mapping[i, 1] of the destination.
 * lk_swap_blocks: src [NBs, ...] -> dst [NBd, ...], same dtype, same dims after dim 0;
 * src and dst must not overlap.
 * lk_copy_blocks: n >= 1 caches, each copied within itself (caches[c][dst] =
 * caches[c][src]; key and value caches of every layer are n separate caches); they must
 * not overlap each other. A row mapping a block onto itself leaves it as it is (a
 * no-op, left out of the rules below; since 0.3).
 * Errors before any store: a block index outside its cache (LK_ERR_INDEX, naming
 * block_mapping and the row), a destination block named twice or also a source of the
 * same cache (LK_ERR_INDEX: the copies would depend on their order), shapes / dtypes
 * (LK_ERR_SHAPE / LK_ERR_DTYPE), overlaps (LK_ERR_ALIAS), n < 1 (LK_ERR_VALUE). */
LK_API lk_status lk_swap_blocks(const lk_tensor *src, const lk_tensor *dst, const lk_tensor *block_mapping);
LK_API lk_status lk_copy_blocks(int n, const lk_tensor *caches, const lk_tensor *block_mapping);

/* ---------------------------------------------------------------- attention */

/* out[T, H, D] (+ out_lse[T, H] or NULL) = LSE merge of two partial states
 * (a, lse_a) and (b, lse_b); a, b: [T, H, D]; lse_*: [T, H] f32 (any strides,
 * so a [H, T] buffer is passed as its transpose view).
 *   m = max(lse_a, lse_b); wa = exp(lse_a - m); wb = exp(lse_b - m)
 *   out = (wa * a + wb * b) / (wa + wb); out_lse = m + log(wa + wb)   (f32)
 * A state whose LSE is +inf or -inf is empty (weight 0, its values are not read); all
 * empty: out = 0, out_lse = -inf. A NaN LSE: out = NaN, out_lse = NaN. a, b and out may
 * each be f32/f16/bf16, any strides. out must not overlap the inputs; out_lse must not
 * overlap anything. T * H == 0 does nothing; D == 0 writes only out_lse. */
LK_API lk_status lk_merge_attn_states(const lk_tensor *out, const lk_tensor *out_lse,
                                      const lk_tensor *a, const lk_tensor *lse_a,
                                      const lk_tensor *b, const lk_tensor *lse_b);
/* N-way form: states[i]: [T, H, D], lses[i]: [T, H], n >= 1 (LK_ERR_VALUE otherwise);
 * m = max over the finite LSEs, w_i = exp(lse_i - m), out = sum w_i states_i / sum w_i,
 * out_lse = m + log(sum w_i), same rules as above. */
LK_API lk_status lk_merge_attn_states_n(const lk_tensor *out, const lk_tensor *out_lse, int n,
                                        const lk_tensor *states, const lk_tensor *lses);

/* out[..., q_len, k_len] = softmax over the last dim of x with the bottom-right causal
 * mask (key j visible to query i iff j <= i + k_len - q_len); masked entries are 0,
 * rows that see no key are all 0. out may be x itself (identical view); any other
 * overlap is an error. Rank >= 2, any strides, x and out each f32/f16/bf16.
 * Special values among the visible entries: -inf gets weight 0; all visible -inf gives
 * a row of 0; a NaN or +inf makes the visible part of the row NaN (as torch.softmax). */
LK_API lk_status lk_causal_softmax(const lk_tensor *out, const lk_tensor *x);

/* ---------------------------------------------------------------- paged caches
 *
 * Paged caches come in two layouts:
 *  - LK_KV_ND: a 4-D view [num_blocks, block_size, H, D] with any strides (an HND buffer
 *    [num_blocks, H, block_size, D] is passed as its permuted view).
 *  - LK_KV_NZ: the tiled layout where a page of H heads x D dims (C = H * D, a multiple
 *    of 16) is stored as [C/16, block_size, 16]. The tensor passed is the PHYSICAL view
 *    [num_blocks, C/16, block_size, 16] (any strides); logical (page p, slot s, head h,
 *    dim d) with c = h * D + d lives at [p, c / 16, s, c % 16]. H and D come from the other
 *    arguments (the head dim of q / of the values, or of the tensor written).
 *    fp8 caches (1-byte elements, where an operator takes them) tile 32 wide, as Ascend's
 *    32-byte fractal does for 8-bit types: [num_blocks, C/32, block_size, 32], C a
 *    multiple of 32, (p, s, h, d) at [p, c / 32, s, c % 32].
 * Reads and writes through NZ equal ND bit for bit. */
typedef enum lk_kv_layout {
    LK_KV_ND = 0,
    LK_KV_NZ = 1,
    /* since 0.3: an MLA latent cache of tile-scaled fp8 records (vLLM's kv_cache_dtype
     * "fp8_ds_mla", FlashMLA's "FP8 with scale"; see "fp8_ds_mla caches" below). Taken by
     * lk_concat_and_cache_mla_fp8, lk_concat_and_cache_mla_rope, lk_gather_cache_fp8,
     * lk_gather_cache_starts and lk_mla_decode only; every other function rejects it
     * (LK_ERR_VALUE naming the layout). */
    LK_KV_DS_MLA = 2
} lk_kv_layout;

/* MLA latent cache write: kv_c [T, Dl] and k_pe [T, Dr] go to token slots of
 * - one cache (k_pe_cache == NULL): ND [num_blocks, block_size, Dl + Dr] (latent then
 *   rope; [num_blocks, block_size, 1, Dl + Dr] also accepted), or NZ physical
 *   [num_blocks, (Dl + Dr)/16, block_size, 16];
 * - two caches: kv_c_cache [.., Dl] and k_pe_cache [.., Dr], same layout rules (NZ: Dl
 *   and Dr each a multiple of 16), same num_blocks and block_size, dtypes may differ.
 * slot_mapping [N <= T] i32/i64: token t < N goes to page slot / block_size, slot
 * slot % block_size; slot < 0 is skipped (padding). A slot >= num_blocks * block_size or
 * a slot used twice is LK_ERR_INDEX (checked before any store). Values are rounded
 * once to the cache dtype (same dtype: bit copy). The caches must not overlap the
 * inputs or each other. */
LK_API lk_status lk_concat_and_cache_mla(const lk_tensor *kv_c, const lk_tensor *k_pe,
                                         const lk_tensor *kv_c_cache, const lk_tensor *k_pe_cache,
                                         const lk_tensor *slot_mapping, lk_kv_layout layout);

/* out [sum(seq_lens), C] or [sum(seq_lens), H, D] = the first seq_lens[b] tokens of each
 * request b in logical order: token j of request b is read from page
 * block_table[b, j / block_size], slot j % block_size, of a cache in layout `layout`
 * (ND: [num_blocks, block_size, C] or [num_blocks, block_size, H, D] with H * D = C;
 * NZ: physical [num_blocks, C/16, block_size, 16]). block_table [B, max_pages] i32,
 * seq_lens [B] i32. Tokens past a request's length are never read (a last partial
 * page's tail may hold garbage), and block_table entries past a request's last page are
 * not looked at (may be -1). Errors: out's first dim != sum(seq_lens) (LK_ERR_SHAPE,
 * out); seq_lens[b] < 0 (LK_ERR_INDEX) or > max_pages * block_size (LK_ERR_SHAPE); a
 * block_table entry of a page read outside [0, num_blocks) (LK_ERR_INDEX). out's dtype
 * may differ from the cache's (one rounding); out must not overlap the other arguments. */
LK_API lk_status lk_gather_cache(const lk_tensor *out, const lk_tensor *cache,
                                 const lk_tensor *block_table, const lk_tensor *seq_lens,
                                 lk_kv_layout layout);

/* ---------------------------------------------------------------- fp8 caches (since 0.3)
 *
 * Scales: a scale argument is an lk_tensor of f32, shape [] or [1] (per tensor) or, where
 * said, [H] (per head), any strides, or NULL (every value 1). Each value must be finite
 * and > 0, else LK_ERR_VALUE naming it (e.g. "k_scale[3]"), nothing written. Quantized
 * = fp8(x / scale) (one f32 division, round to nearest even saturated to the finite
 * range, NaN stays NaN), dequantized = f32(q) * scale rounded once to the output dtype.
 * A 16/32-bit cache ignores its scale (vLLM's kv_cache_dtype "auto"). In NZ, an fp8
 * cache is tiled 32 wide: physical [num_blocks, C/32, block_size, 32] with C % 32 == 0
 * (C = heads x dims; 16-/32-bit caches keep the 16-wide tile). Reads through NZ equal
 * ND bit for bit. */

/* lk_reshape_and_cache_flash into caches of any float dtype incl. fp8, ND or NZ (see
 * "paged caches"; ND also [num_blocks, block_size, D] when H = 1), with k_scale /
 * v_scale per tensor or per head [H]: k_cache(slot, h, d) = fp8(k[t, h, d] /
 * k_scale[h]), likewise v. Everything else as lk_reshape_and_cache_flash. */
LK_API lk_status lk_reshape_and_cache_flash_fp8(const lk_tensor *k, const lk_tensor *v,
                                                const lk_tensor *k_cache, const lk_tensor *v_cache,
                                                const lk_tensor *slot_mapping, const lk_tensor *k_scale,
                                                const lk_tensor *v_scale, lk_kv_layout layout);

/* lk_concat_and_cache_mla whose caches may be fp8 (vLLM's concat_and_cache_mla with
 * kv_cache_dtype "fp8" and its per-tensor scale [] / [1] or NULL). */
LK_API lk_status lk_concat_and_cache_mla_fp8(const lk_tensor *kv_c, const lk_tensor *k_pe,
                                             const lk_tensor *kv_c_cache, const lk_tensor *k_pe_cache,
                                             const lk_tensor *slot_mapping, lk_kv_layout layout,
                                             const lk_tensor *scale);

/* Rotary embedding and MLA latent cache write in one call (vLLM's
 * concat_and_cache_mla_rope_fused, which replaces DeepSeek's rotary_emb followed by
 * concat_and_cache_mla):
 *   1. q_pe [T, Hq, Dr] and k_pe [T, Dr] are rotated in place as lk_rotary_embedding
 *      rotates q and k (k_pe is one head), with positions[t] for token t < T;
 *   2. kv_c [T, Dl] and the rotated k_pe are written to the cache(s) as
 *      lk_concat_and_cache_mla_fp8 writes them (slot_mapping [N <= T], slot < 0 skipped,
 *      ND or NZ, one or two caches, fp8 caches with a per-tensor scale or NULL; or one
 *      LK_KV_DS_MLA record cache, see "fp8_ds_mla caches").
 * Every token's q_pe and k_pe is rotated, a padding token's (slot < 0, or t >= N) too.
 * positions [P >= T] i32/i64 (a padded positions buffer: its first T values are used),
 * each in [0, max_pos); cos_sin_cache [max_pos, rot], rot even and <= Dr (dims [rot, Dr)
 * are not rotated). q_pe, k_pe, kv_c and the cache may each be f32/f16/bf16 (the cache
 * also fp8); k_pe's stored value is its rotated value rounded to k_pe's dtype, then
 * quantized as the cache's dtype needs. Every check of both operations, and q_pe against
 * every other argument for overlaps (k_pe and kv_c may be interleaved slices of one
 * buffer), is made before any store; an error leaves every buffer untouched. */
LK_API lk_status lk_concat_and_cache_mla_rope(const lk_tensor *positions, const lk_tensor *q_pe,
                                              const lk_tensor *k_pe, const lk_tensor *kv_c,
                                              const lk_tensor *cos_sin_cache, int is_neox,
                                              const lk_tensor *kv_c_cache, const lk_tensor *k_pe_cache,
                                              const lk_tensor *slot_mapping, lk_kv_layout layout,
                                              const lk_tensor *scale);

/* lk_gather_cache out of a cache that may be fp8 (vLLM's gather_and_maybe_dequant_cache):
 * out = f32(q) * scale rounded to out's dtype (f32/f16/bf16); scale per tensor [] / [1]
 * or NULL. An fp8 out takes a cache of its own dtype only, copied as bits (scale unused;
 * vLLM's cp_gather_cache on uint8 caches). Everything else as lk_gather_cache. */
LK_API lk_status lk_gather_cache_fp8(const lk_tensor *out, const lk_tensor *cache,
                                     const lk_tensor *block_table, const lk_tensor *seq_lens,
                                     lk_kv_layout layout, const lk_tensor *scale);

/* lk_gather_cache_fp8 with vLLM's optional seq_starts (gather_and_maybe_dequant_cache /
 * cp_gather_cache's `seq_starts`): seq_starts [B] i32 or NULL (all 0); token j of request
 * b is read at position p = seq_starts[b] + j of its block table: page
 * block_table[b, p / block_size], slot p % block_size (vLLM's chunked-context gather,
 * any start, not only multiples of block_size). Only the pages of positions
 * [seq_starts[b], seq_starts[b] + seq_lens[b]) are looked at. Errors (nothing written):
 * seq_starts[b] < 0, or seq_starts[b] + seq_lens[b] > max_pages * block_size
 * (LK_ERR_INDEX, seq_starts); its dtype (LK_ERR_DTYPE) or shape (LK_ERR_SHAPE);
 * everything else as lk_gather_cache_fp8. */
LK_API lk_status lk_gather_cache_starts(const lk_tensor *out, const lk_tensor *cache,
                                        const lk_tensor *block_table, const lk_tensor *seq_lens,
                                        const lk_tensor *seq_starts, lk_kv_layout layout,
                                        const lk_tensor *scale);

/* ---------------------------------------------------------------- fp8_ds_mla caches
 *
 * Layout LK_KV_DS_MLA (since 0.3; vLLM's kv_cache_dtype "fp8_ds_mla", FlashMLA's "FP8
 * with scale" cache of DeepSeek-V3.2): one MLA latent cache whose entry (Dl latent +
 * Dr rope dims, Dl a multiple of 128) is a record of E = Dl + Dl / 32 + 2 Dr bytes
 * (DeepSeek's 512 + 64: 656):
 *   bytes [0, Dl)                 the latent dims as e4m3 codes
 *   bytes [Dl, Dl + Dl / 32)      Dl / 128 f32 scales (host byte order), scale g for
 *                                 latent dims [128 g, 128 g + 128)
 *   bytes [Dl + Dl / 32, E)       the rope dims as bf16, not quantized
 * The cache tensor has 1-byte elements (LK_F8E4M3 or LK_I8: vLLM's uint8 buffer):
 * [num_blocks, block_size, E] or [num_blocks, block_size, 1, E], last-dim stride 1,
 * the other strides even and data 2-byte aligned (the bf16 part), else LK_ERR_SHAPE
 * naming the cache. Writing token t (lk_concat_and_cache_mla_fp8, or
 * lk_concat_and_cache_mla_rope after its rotation; kv_c [T, Dl] and k_pe [T, Dr]
 * f32/f16/bf16, k_pe_cache NULL, scale not read: vLLM passes k_scale and ignores it),
 * tile g:
 *   s_g = max(absmax(kv_c[t, 128 g .. 128 g + 127]) / 448, FLT_MIN)   (f32, NaN ignored)
 *   code[d] = e4m3(kv_c[t, d] / s_g)          (one f32 division, the fp8 converter)
 *   rope[r] = bf16(k_pe[t, r])                (bit copy from bf16; rounded once from
 *                                              f16 / f32, where vLLM stores f16 bits
 *                                              that its readers take as bf16)
 * Readers see entry dims as the values
 *   e[d] = f32(code[d]) * s_g   (d < Dl; one f32 multiplication)     e[Dl + r] = rope[r]
 * (a tile holding inf gets s_g = inf and reads back NaN). lk_gather_cache_fp8 /
 * lk_gather_cache_starts with this layout: out [S, Dl + Dr] f32/f16/bf16 = e rounded
 * once to out's dtype (vLLM's cp_gather_and_upconvert_fp8_kv_cache, bf16 out), Dl =
 * 32 (2 C - E) / 31 for out's C = Dl + Dr (LK_ERR_SHAPE if that is not a multiple of
 * 128 with Dr >= 0), scale not read; indices as lk_gather_cache. lk_mla_decode with
 * params.cache_layout LK_KV_DS_MLA: kv_c_cache the record cache, k_pe_cache NULL,
 * Dl from out and Dr from q (E must match), params.k_scale not read; out and lse are bit
 * for bit those of an f32 cache holding the values e on the same ISA, except on the bf16
 * dot-product path (the avx512bf16 row with bf16 q and out, docs/numerics.md), where each
 * tile's score part is its scale times f32 sums of exact bf16 products and P . V takes P
 * times the tile's scale rounded to bf16: within that path's bound of the f32 cache's. */

/* vLLM's convert_fp8: dst and src of one shape (any rank 0..LK_MAX_DIMS, any strides),
 * exactly one of them fp8: src fp8 -> dst f32/f16/bf16 = f32(q) * scale rounded once;
 * src f32/f16/bf16 -> dst fp8 = fp8(x / scale). scale finite and > 0 (LK_ERR_VALUE);
 * dst must not overlap itself or src. */
LK_API lk_status lk_convert_fp8(const lk_tensor *dst, const lk_tensor *src, float scale);

/* ---------------------------------------------------------------- flash attention */

/* ABI: fields are only ever appended, never reordered; lk_attn_params_default() sets
 * every field, so code that starts from it (or zero-initialises the tail with a
 * designated / brace initializer) keeps its meaning when fields are added. A field added
 * changes the struct's size: the library's minor version (and soname, libllmkern.so.0.N)
 * changes with it, so a binary built against an older header keeps loading the library
 * it was built for. alibi_slopes: since 0.2; q_descale, k_descale, v_descale: since 0.3. */
typedef struct lk_attn_params {
    float scale;            /* softmax scale, always explicit (no 1/sqrt(D) default)      */
    int causal;             /* bottom-right causal: sets window_right = 0                  */
    int64_t window_left;    /* keys visible to query i: i + off - left <= j <= i + off + right */
    int64_t window_right;   /* with off = k_len - q_len; -1 = unbounded                     */
    float softcap;          /* > 0: s = softcap * tanh(s / softcap) on the scaled score     */
    lk_kv_layout kv_layout; /* paged K/V only                                               */
    const lk_tensor *alibi_slopes; /* NULL, or f32 [Hq] or [B, Hq] (any strides), finite:   */
                            /* s -= slope[b, h] * |i + off - j| after scale and softcap     */
                            /* (flash-attention's ALiBi)                                    */
    /* ---- fp8 descales (since 0.3) ----
     * NULL (= 1) or f32 (any strides), every value finite and > 0, of shape [] or [1]
     * (per tensor), [Hk] (per KV head) or [B, Hk] (per request and KV head: vLLM's
     * flash-attn q/k/v_descale). They apply to an fp8 (f8e4m3 / f8e5m2) q, k or v:
     * dequantized value = f32(code) * descale, so scores are
     * scale * q_descale * k_descale * (q . k) and out = v_descale * sum_j p_j v_j, applied
     * in the kernel (the cache is never dequantized to a buffer). For a q, k or v that
     * is not fp8 the descale is validated and ignored (vLLM's "auto" cache). */
    const lk_tensor *q_descale, *k_descale, *v_descale;
} lk_attn_params;

/* {scale, causal = 0, window = (-1, -1), softcap = 0, ND, alibi_slopes = NULL,
 *  q/k/v_descale = NULL} */
LK_API lk_attn_params lk_attn_params_default(float scale);

/* Variable-length attention, flash-attention semantics.
 *   out [Tq, Hq, Dv]; lse [Tq, Hq] f32 or NULL (natural log; any strides, so a [Hq, Tq]
 *   buffer is passed as its transpose view); q [Tq, Hq, Dqk]; cu_seqlens_q [B + 1] i32.
 * Dense K/V: k [Tk, Hk, Dqk], v [Tk, Hk, Dv], cu_seqlens_k [B + 1]; seqused_k and
 *   block_table NULL.
 * Paged K/V: k, v caches (see "paged caches": ND [blocks, block_size, Hk, D] or NZ
 *   physical), block_table [B, max_pages] i32, seqused_k [B] i32 key lengths;
 *   cu_seqlens_k NULL.
 * GQA/MQA: query head h reads KV head h / (Hq / Hk). Dqk != Dv allowed. A query row
 * that sees no key gets out = 0 and lse = -inf.
 * fp8 (since 0.3): q, k and v may be f8e4m3 / f8e5m2 (each on its own; out stays
 * f32/f16/bf16), with params.q/k/v_descale; a paged fp8 cache in NZ is
 * [blocks, Hk*D/32, block_size, 32] (the 32-wide tile of 1-byte caches). */
LK_API lk_status lk_flash_attn_varlen(const lk_tensor *out, const lk_tensor *lse,
                                      const lk_tensor *q, const lk_tensor *k, const lk_tensor *v,
                                      const lk_tensor *cu_seqlens_q,
                                      const lk_tensor *cu_seqlens_k, const lk_tensor *seqused_k,
                                      const lk_tensor *block_table, const lk_attn_params *params);

/* lk_flash_attn_varlen writing an fp8 out (since 0.3; vLLM's attention output_scale, the
 * fused form of static_scaled_fp8_quant(attn_out, output_scale)):
 *   out [Tq, Hq, Dv] LK_F8E4M3 / LK_F8E5M2, output_scale [1] or [] f32:
 *   out = fp8(value / output_scale), value = the f32 value a float out would round
 *   (o / l * v_descale), one f32 division, then the saturating round-to-nearest-even
 *   converter (NaN stays NaN, beyond +-max and +-inf give +-max). Rows that see no key
 *   and padding rows get code 0 (and lse = -inf). lse stays f32 (unscaled).
 * output_scale NULL: exactly lk_flash_attn_varlen (out f32/f16/bf16). Errors (nothing
 * written): an fp8 out without output_scale (LK_ERR_NULL naming output_scale); a float
 * out with one (LK_ERR_DTYPE naming out); output_scale not f32 (LK_ERR_DTYPE), not one
 * element (LK_ERR_SHAPE), 0, negative, NaN or inf (LK_ERR_VALUE), overlapping out or lse
 * (LK_ERR_ALIAS); everything else as lk_flash_attn_varlen. */
LK_API lk_status lk_flash_attn_varlen_scaled(const lk_tensor *out, const lk_tensor *lse,
                                             const lk_tensor *q, const lk_tensor *k, const lk_tensor *v,
                                             const lk_tensor *cu_seqlens_q,
                                             const lk_tensor *cu_seqlens_k, const lk_tensor *seqused_k,
                                             const lk_tensor *block_table, const lk_attn_params *params,
                                             const lk_tensor *output_scale);

/* ---------------------------------------------------------------- MLA prefix prefill */

/* How lk_mla_prefix_prefill computes attention over [prefix | current] (see
 * src/cpu/mla/cost.c for the rule behind LK_MLA_AUTO; every strategy gives the same
 * result up to f32 rounding):
 *  - SPLIT_MERGE: gather the prefix latents, project them with kv_b_proj, attention of
 *    the new tokens over the projected prefix (no mask) and over themselves (causal),
 *    then an LSE merge of the two states;
 *  - CONCAT: project the prefix, copy [projected prefix | current k, v] per request into
 *    one buffer, one causal attention;
 *  - FUSED: project the prefix, then one online-softmax pass per query block over the
 *    prefix keys and then the current keys (no merge, no concatenated copy);
 *  - ABSORBED: never project the prefix: q_nope * W_UK against the cached latent (one
 *    shared KV head of Dl + Dr dims), output * W_UV, merged with the causal attention
 *    over the current tokens. Cheapest when new tokens are few per prefix token. */
typedef enum lk_mla_strategy {
    LK_MLA_AUTO = 0,        /* chosen per call from the shapes (a calibrated cost model) */
    LK_MLA_SPLIT_MERGE = 1,
    LK_MLA_CONCAT = 2,
    LK_MLA_FUSED = 3,
    LK_MLA_ABSORBED = 4
} lk_mla_strategy;

typedef struct lk_mla_params {
    float scale;                 /* softmax scale, explicit (MLA's is YaRN-corrected)     */
    lk_mla_strategy strategy;    /* LK_MLA_AUTO or a forced strategy                       */
    lk_kv_layout cache_layout;   /* latent cache layout, ND or NZ (see "paged caches")     */
    int dedup;                   /* != 0: cache pages shared by several requests (same     */
                                 /* block ids) are gathered and projected once             */
    /* ---- fp8 latent caches (since 0.3) ---- */
    float k_scale;               /* per-tensor dequant scale of fp8 caches (vLLM's MLA     */
                                 /* k_scale): entry = f32(code) * k_scale; finite and > 0  */
                                 /* when a cache is fp8, ignored (not read) otherwise      */
} lk_mla_params;

/* {scale, LK_MLA_AUTO, LK_KV_ND, dedup = 1, k_scale = 1} */
LK_API lk_mla_params lk_mla_params_default(float scale);

/* MLA prefill of new tokens over a cached prefix (DeepSeek-V2/V3 attention):
 *   out [T, H, Dv] = attention of q over [prefix | current] per request, bottom-right
 *   causal: query i of request b (q_len tokens, prefix_lens[b] = P cached tokens) sees
 *   every prefix token and current tokens j <= i; rows of tokens outside
 *   [cu_seqlens_q[0], cu_seqlens_q[B]) (padding) are 0.
 * Arguments:
 *   q [T, H, Dn + Dr] = [q_nope | q_rope] of the new tokens; k [T, H, Dn + Dr] = their
 *   [k_nope | k_rope (broadcast over heads)]; v [T, H, Dv];
 *   cu_seqlens_q [B + 1] i32/i64 (non-decreasing, last <= T); prefix_lens [B];
 *   block_table [B, max_pages]: page i of request b's prefix is cache block
 *   block_table[b, i] (only the ceil(P / block_size) pages of a prefix are looked at);
 *   kv_c_cache: the latent cache, one buffer (k_pe_cache NULL) of entries [Dl + Dr]
 *   (latent then rope; ND [num_blocks, block_size, Dl + Dr] or NZ physical
 *   [num_blocks, (Dl + Dr)/16, block_size, 16]) or two buffers kv_c_cache [.., Dl] and
 *   k_pe_cache [.., Dr] (same num_blocks and block_size; see lk_concat_and_cache_mla);
 *   kv_b_proj [H * (Dn + Dv), Dl] (PyTorch Linear weight: latent c projects to
 *   [H, Dn + Dv] per token; k_nope = [..., :Dn], v = [..., Dn:]); params (not NULL).
 * Dims are derived from the shapes: Dv from v, Dl from kv_b_proj, Dn = rows / H - Dv,
 * Dr = q's last dim - Dn (DeepSeek: 128, 64, 128, 512). A prefix key is
 * [W_UK c | k_pe] with the cached rope part shared by all heads, its value W_UV c.
 * fp8 latent caches (since 0.3): kv_c_cache and k_pe_cache may also be LK_F8E4M3 /
 * LK_F8E5M2 (as lk_concat_and_cache_mla writes them; NZ with 1-byte entries uses the
 * 32-wide tile, [num_blocks, (Dl + Dr)/32, block_size, 32]), entry = f32(code) *
 * params.k_scale, every strategy: the codes are widened exactly where the prefix pages
 * are gathered for the GEMMs (bf16 GEMM operands where kv_b_proj, or for absorbed q and
 * out, are bf16), k_scale multiplies the projected keys / values (absorbed: the latent
 * scores and outputs); no dequantized copy of the cache. k_scale <= 0, NaN or inf with
 * an fp8 cache: LK_ERR_VALUE naming params.k_scale, nothing written.
 * Every tensor may be f32/f16/bf16 (independently) with any strides; out must not
 * overlap any input. Errors name the argument (shapes, dtypes, prefix_lens beyond the
 * block table's capacity, block_table entries of used pages outside [0, num_blocks),
 * ...) and nothing is written. Arithmetic is f32; each output value is rounded once.
 * GEMMs run in oneDNN (bf16 x bf16 where both operands are bf16, else f32; f32
 * accumulation), each single-threaded on the calling llmkern worker; no process-wide
 * setting of oneDNN or OpenMP is changed. oneDNN picks its own ISA from the CPU
 * (lk_set_isa / LLMKERN_ISA do not reach it). */
LK_API lk_status lk_mla_prefix_prefill(const lk_tensor *out, const lk_tensor *q, const lk_tensor *k,
                                       const lk_tensor *v, const lk_tensor *cu_seqlens_q,
                                       const lk_tensor *prefix_lens, const lk_tensor *block_table,
                                       const lk_tensor *kv_c_cache, const lk_tensor *k_pe_cache,
                                       const lk_tensor *kv_b_proj, const lk_mla_params *params);

/* What the last lk_mla_prefix_prefill call on this thread did (thread-local, valid until
 * the next call): "strategy=<name> (<auto | forced>) ..." (then "fused instead: ..."
 * where split_merge or concat hands inputs holding an inf or NaN to fused) followed by
 * the internal ops it ran with their sizes, one "; "-separated item each ("" after a
 * failed call). */
LK_API const char *lk_mla_last_trace(void);
/* "auto", "split_merge", "concat", "fused", "absorbed" ("unknown" otherwise) */
LK_API const char *lk_mla_strategy_name(lk_mla_strategy s);


/* ---------------------------------------------------------------- MLA decode */

typedef struct lk_mla_decode_params {
    float scale;               /* softmax scale, explicit                                  */
    int causal;                /* s_q > 1: query i sees keys < cache_seqlens - s_q + i + 1  */
    lk_kv_layout cache_layout; /* latent cache layout: ND, NZ ("paged caches") or DS_MLA  */
    int64_t split_keys;        /* keys per split-KV chunk; 0: lk_mla_decode_plan's choice   */
    /* since 0.3: the dequantization scale of an fp8 latent cache (FlashMLA's descale_k,
     * vLLM's k_scale; per tensor): an fp8 element c stands for f32(c) * k_scale. Read only
     * when a cache buffer is LK_F8E4M3 / LK_F8E5M2; then it must be finite and > 0. */
    float k_scale;
} lk_mla_decode_params;

/* {scale, causal = 0, LK_KV_ND, split_keys = 0, k_scale = 1} */
LK_API lk_mla_decode_params lk_mla_decode_params_default(float scale);

/* Split-KV plan of lk_mla_decode (FlashMLA's get_mla_metadata): *split_keys = the keys
 * per chunk that lk_mla_decode uses for these cache_seqlens [B] (i32/i64, values >= 0)
 * when params.split_keys is 0. It depends only on B and the lengths (never on the
 * thread count): about 64 chunks in the whole batch, each a multiple of 64 keys and at
 * least 512, so a long context with few requests is spread over many threads and a
 * large batch is not split at all. Request b then has ceil(cache_seqlens[b] /
 * *split_keys) chunks (1 when it is empty). Errors: a negative length (LK_ERR_INDEX). */
LK_API lk_status lk_mla_decode_plan(const lk_tensor *cache_seqlens, int64_t *split_keys);

/* MLA decode in latent space (FlashMLA's flash_mla_with_kvcache): absorbed queries
 * against the paged latent cache, every head sharing each cache entry (K = the whole
 * entry of Dl + Dr dims, V = its first Dl dims):
 *   out[b, i, h, :] = sum_j softmax_j(scale * q[b, i, h, :] . e_j) e_j[:Dl]
 *   lse[b, h, i]    = log(sum_j exp(scale * q[b, i, h, :] . e_j))       (natural log, f32)
 * over keys j < cache_seqlens[b], or, with params.causal, j < cache_seqlens[b] - s_q + i + 1
 * (the s_q query tokens are the last s_q cached tokens: multi-token prediction,
 * speculative verification). A row that sees no key (cache_seqlens[b] = 0) gets out = 0
 * and lse = -inf.
 * Arguments:
 *   out [B, s_q, H, Dl]; lse [B, H, s_q] f32 or NULL (any strides: FlashMLA's layout or a
 *   permuted view); q [B, s_q, H, Dl + Dr] (q_nope W_UK | q_rope); cache_seqlens [B] and
 *   block_table [B, max_pages] i32/i64 (token j of request b is in cache page
 *   block_table[b, j / block_size], slot j % block_size); the latent cache: one buffer
 *   kv_c_cache of entries [Dl + Dr] (k_pe_cache NULL; ND [num_blocks, block_size,
 *   Dl + Dr] or [num_blocks, block_size, 1, Dl + Dr], NZ physical [num_blocks,
 *   (Dl + Dr)/16, block_size, 16]) or two buffers kv_c_cache [.., Dl] and k_pe_cache
 *   [.., Dr] as lk_concat_and_cache_mla writes them; params not NULL.
 * Dl comes from out, Dr = q's last dim - Dl (>= 0; >= 1 with two buffers). Each tensor
 * may be f32/f16/bf16 independently; the cache may also be fp8 (since 0.3: LK_F8E4M3 /
 * LK_F8E5M2, both buffers of the same fp8 dtype; NZ physical [num_blocks, (Dl + Dr)/32,
 * block_size, 32], the 32-wide tile of 1-byte caches), each element dequantized in
 * registers as f32(c) * params.k_scale (scores scaled by scale * k_scale, out by
 * k_scale; never a dequantized copy of the cache); out must not overlap any input, lse must not
 * overlap anything. Entries past cache_seqlens[b] are never read (they may hold NaN), and
 * neither are block_table entries past a request's last page.
 * Split-KV: request b's keys go in chunks of params.split_keys (0: lk_mla_decode_plan),
 * each chunk's partial state (m, l, O) computed once for all s_q x H rows, then merged in
 * chunk order with the attention-state rules; the chunks depend only on the arguments,
 * so results are bitwise identical for any thread count.
 * Errors (nothing written): shapes / dtypes / ranks (naming the argument); a length < 0
 * or beyond the block table (max_pages * block_size) (LK_ERR_INDEX, cache_seqlens); a
 * block id of a page read outside [0, num_blocks) (LK_ERR_INDEX, block_table); with
 * causal, 0 < cache_seqlens[b] < s_q (LK_ERR_INDEX, cache_seqlens); params.split_keys < 0
 * or a non-finite scale (LK_ERR_VALUE); with an fp8 cache, k_scale not finite and > 0
 * (LK_ERR_VALUE, params.k_scale), or the two buffers of different dtypes (LK_ERR_DTYPE,
 * k_pe_cache). */
LK_API lk_status lk_mla_decode(const lk_tensor *out, const lk_tensor *lse, const lk_tensor *q,
                               const lk_tensor *kv_c_cache, const lk_tensor *k_pe_cache,
                               const lk_tensor *block_table, const lk_tensor *cache_seqlens,
                               const lk_mla_decode_params *params);

/* ---------------------------------------------------------------- fp8 activations
 * (since 0.3; vLLM's names and argument order). Quantized value q = fp8(y / scale)
 * (one f32 division, then the converter of every fp8 path: round to nearest even,
 * finite values and inf saturated to +-max, NaN kept), dequantized f32(q) * scale.
 * out is LK_F8E4M3 or LK_F8E5M2 (its dtype picks the format; fp8_max 448 / 57344);
 * inputs f32/f16/bf16, [..., D] with any strides; a row is the last dim. Scales are
 * f32 tensors: a per-tensor scale has one element ([1] or []), per-token scales one
 * per row ([rows], [rows, 1], or [..., 1] with input's leading dims). An input scale
 * (static `scale`, `scale_ub`) must be finite and > 0, else LK_ERR_VALUE naming it. Dynamic
 * scales are written by the call:
 *   per tensor: scale = max(absmax(y) / fp8_max, min_scale)
 *   per token:  scale[r] = max(min(absmax(y[r]), scale_ub) / fp8_max, min_scale)
 *   min_scale = 1 / (fp8_max * 512) (vLLM's per-token minimum; also applied per tensor
 *   so that an all-zero input gets a usable scale)
 * absmax ignores NaN elements; an inf element makes the scale inf (its row or tensor
 * then quantizes finite values to 0 and inf to NaN, as vLLM's). Outputs must not overlap
 * the inputs or each other; rows == 0 (or D == 0) writes nothing but the scales of an
 * empty input (per tensor: min_scale; per token: no rows). Results do not depend on the
 * ISA or the thread count (reductions in a fixed order). */

/* out = fp8(input / scale), scale [1] f32 given */
LK_API lk_status lk_static_scaled_fp8_quant(const lk_tensor *out, const lk_tensor *input,
                                            const lk_tensor *scale);
/* scale [1] f32 written (per-tensor dynamic scale), then out = fp8(input / scale) */
LK_API lk_status lk_dynamic_scaled_fp8_quant(const lk_tensor *out, const lk_tensor *input,
                                             const lk_tensor *scale);
/* scales [rows], [rows, 1] or [..., 1] f32 written per row, then out = fp8(input / scales[row]);
 * scale_ub [1] f32 or NULL bounds the absmax */
LK_API lk_status lk_dynamic_per_token_scaled_fp8_quant(const lk_tensor *out, const lk_tensor *input,
                                                       const lk_tensor *scales, const lk_tensor *scale_ub);
/* Static quantization with a grid of given scales (vLLM's static_scaled_fp8_quant with a
 * 1-D or 2-D scale and its group_shape: per channel, per token, or 2-D blocks). input
 * [..., N] with M rows (the leading dims flattened); scale f32 [sm, sn], any strides, sm
 * >= 1 dividing M and sn >= 1 dividing N (else LK_ERR_SHAPE naming scale), every value finite and
 * > 0 (LK_ERR_VALUE naming the element); groups of gm = M / sm rows by gn = N / sn columns:
 *   out[r, c] = fp8(input[r, c] / scale[r / gm, c / gn])
 * ([1, 1]: per tensor; [1, N]: per channel; [M, 1]: per token). Rows of 0 or N == 0 write
 * nothing. */
LK_API lk_status lk_static_group_scaled_fp8_quant(const lk_tensor *out, const lk_tensor *input,
                                                  const lk_tensor *scale);
/* Per-token-group dynamic quantization (vLLM's per_token_group_fp8_quant / Python
 * per_token_group_quant_fp8: the activations of block-fp8 checkpoints such as
 * DeepSeek-V3's, groups of 128). input [..., D] with D a multiple of group_size (>= 1);
 * scales f32, [..., D / group_size] (input's leading dims) or [rows, D / group_size], any
 * strides (vLLM's column-major scales are the transposed view of a [D / G, rows] buffer,
 * TMA-padded rows included), written; per row r and group g (elements g G .. g G + G - 1):
 *   s = max(absmax(group), eps) / fp8_max
 *   scale_ue8m0: s = the smallest power of two >= max(s, 1e-10) (DeepGEMM's UE8M0 scales)
 *   scales[r, g] = s; out[r, i] = fp8(input[r, i] / s)
 * absmax ignores NaN; NaN elements stay NaN (vLLM's clamp turns them into -fp8_max); an
 * inf element makes its group's scale inf (finite values -> 0, inf -> NaN). eps must be
 * finite and >= fp8_max * FLT_MIN (the smallest scale a normal f32), else LK_ERR_VALUE;
 * group_size < 1 (LK_ERR_VALUE) or not dividing D (LK_ERR_SHAPE) names group_size.
 * out may also be LK_I8 (vLLM's per_token_group_quant_int8, block-int8 checkpoints):
 * fp8_max is 127 and out[r, i] = trunc(clamp(input[r, i] / s, -128, 127)), toward zero as
 * vLLM's int8_t(q) cast (not rounded: its other int8 quantizers round to nearest), NaN -> 0
 * (vLLM's clamp gives -128). Since 0.3. */
LK_API lk_status lk_per_token_group_fp8_quant(const lk_tensor *out, const lk_tensor *input,
                                              const lk_tensor *scales, int64_t group_size, float eps,
                                              int scale_ue8m0);
/* RMSNorm then quantization (no gemma form):
 *   y = input * rsqrt(sum(input^2) / D + epsilon) * weight   (f32, weight NULL: 1)
 *   out = fp8(y / scale)                                      scale [1] given
 * The sum of squares is f32 in a fixed order (16 partial sums, lane i % 16, each an FMA
 * chain, then halved pairwise: 8, 4, 2, 1), the same on every ISA. */
LK_API lk_status lk_rms_norm_static_fp8_quant(const lk_tensor *out, const lk_tensor *input,
                                              const lk_tensor *weight, const lk_tensor *scale,
                                              float epsilon);
/* residual = round(input + residual) (in place, residual's dtype; input is not written),
 * then out = fp8(rms_norm(residual) / scale) as above (the norm reads the rounded
 * residual) */
LK_API lk_status lk_fused_add_rms_norm_static_fp8_quant(const lk_tensor *out, const lk_tensor *input,
                                                        const lk_tensor *residual, const lk_tensor *weight,
                                                        const lk_tensor *scale, float epsilon);
/* RMSNorm (over round(input + residual), stored to residual, when residual is not NULL)
 * with dynamic per-token quantization: scales [rows], [rows, 1] or [..., 1] written,
 * scale[r] = max(min(absmax(y[r]), scale_ub) / fp8_max, min_scale), out = fp8(y / scale[r]).
 * out may also be LK_I8 (vLLM's int8 output): scale[r] = max(min(absmax(y[r]), scale_ub)
 * / 127, FLT_EPSILON) (vLLM's int8 minimum; vLLM refuses scale_ub with int8, here it
 * bounds the absmax as for fp8), out = i8(y * (1 / scale[r])) (the reciprocal then a
 * product, as vLLM's int8 kernel; round to nearest even, saturated to [-128, 127], NaN
 * -> 0). */
LK_API lk_status lk_rms_norm_dynamic_per_token_quant(const lk_tensor *out, const lk_tensor *input,
                                                     const lk_tensor *weight, const lk_tensor *scales,
                                                     float epsilon, const lk_tensor *scale_ub,
                                                     const lk_tensor *residual);
/* The same per block of group_size columns (vLLM's rms_norm_per_block_quant: RMSNorm then
 * block-fp8 activations, DeepSeek-V3's groups of 128): scales f32 [..., D / group_size]
 * (input's leading dims) or [rows, D / group_size], any strides (vLLM's
 * is_scale_transposed scales are the transposed view of a [D / group_size, rows] buffer),
 * written per row r and block g: scale[r, g] = max(min(absmax(y[r, block g]), scale_ub) /
 * fp8_max, min_scale) (i8 out: / 127, FLT_EPSILON, as above), then the block's codes as
 * above. group_size < 1 (LK_ERR_VALUE) or not dividing D (LK_ERR_SHAPE) names group_size. */
LK_API lk_status lk_rms_norm_per_block_quant(const lk_tensor *out, const lk_tensor *input,
                                             const lk_tensor *weight, const lk_tensor *scales,
                                             float epsilon, const lk_tensor *scale_ub,
                                             const lk_tensor *residual, int64_t group_size);
/* SiLU-and-mul then quantization (vLLM's silu_and_mul_quant and
 * silu_and_mul_per_block_quant: the activation in front of an fp8 / int8 GEMM). input
 * [..., 2d] f32 / f16 / bf16 (gate = input[..., :d], up = input[..., d:]), out [..., d],
 * any strides; per element, in f32:
 *   y = silu(gate) * up,   silu(g) = g / (1 + exp(-g))   (lk_silu_and_mul's SIMD form,
 *       relative error < 2^-22 where exp(-g) is finite, -0 below g = -88.72 as
 *       lk_silu_and_mul and vLLM's expf form; the same bits on every ISA, but for the sign
 *       of a NaN where gate and up are both NaN (unspecified); silu(-inf) = -0, NaN stays)
 * lk_silu_and_mul_quant: out fp8 (LK_F8E4M3 / LK_F8E5M2) = fp8(y / scale), scale [1] or []
 *   f32, finite and > 0 (static per tensor).
 * lk_silu_and_mul_per_block_quant: per row r and block g of group_size columns (group_size
 *   >= 1 dividing d: LK_ERR_VALUE / LK_ERR_SHAPE naming it), scales f32 [..., d /
 *   group_size] (input's leading dims) or [rows, d / group_size], any strides (vLLM's
 *   is_scale_transposed scales are the transposed view of a [d / group_size, rows] buffer):
 *     scales[r, g] = max(min(absmax(y[r, block g]) / qmax, scale_ub), min_scale)
 *   (absmax ignoring NaN; scale_ub [1] f32 finite > 0, or NULL: none), then the block's
 *   codes: fp8 out: fp8(y / scale), qmax = fp8_max, min_scale = 1 / (fp8_max * 512); i8
 *   out: i8(y / scale) (round to nearest even, saturated to [-128, 127], NaN -> 0), qmax =
 *   127, min_scale = FLT_EPSILON. Note the order: scale_ub bounds the scale here (vLLM's
 *   silu kernel), the absmax in the RMSNorm ops above. */
LK_API lk_status lk_silu_and_mul_quant(const lk_tensor *out, const lk_tensor *input, const lk_tensor *scale);
LK_API lk_status lk_silu_and_mul_per_block_quant(const lk_tensor *out, const lk_tensor *input,
                                                 const lk_tensor *scales, const lk_tensor *scale_ub,
                                                 int64_t group_size);
/* lk_merge_attn_states with an fp8 out (LK_F8E4M3 / LK_F8E5M2) and output_scale [1] f32
 * (vLLM's output_scale): out = fp8(merged / output_scale), everything else as
 * lk_merge_attn_states (the merged f32 value is the one a float out would round).
 * output_scale NULL: exactly lk_merge_attn_states (out f32/f16/bf16); an fp8 out needs
 * output_scale (LK_ERR_NULL naming it), a float out refuses one (LK_ERR_DTYPE naming out);
 * output_scale must be finite and > 0 (LK_ERR_VALUE). */
LK_API lk_status lk_merge_attn_states_scaled(const lk_tensor *out, const lk_tensor *out_lse,
                                             const lk_tensor *a, const lk_tensor *lse_a,
                                             const lk_tensor *b, const lk_tensor *lse_b,
                                             const lk_tensor *output_scale);

/* ---------------------------------------------------------------- int8 activations
 * (since 0.3; vLLM's static_scaled_int8_quant / dynamic_scaled_int8_quant, the ops behind
 * vllm._custom_ops.scaled_int8_quant, with the CUDA kernels' arithmetic). out is LK_I8
 * with input's shape [..., D]; input f32/f16/bf16, any strides; a row is the last dim.
 * Every code is
 *   out = sat8(sat32(rn(v)) + azp)        (azp = 0 when symmetric)
 * with rn = round to nearest, ties to even, on the f32 value v (a NaN v counts as 0),
 * sat32 saturating to int32, the sum exact (64-bit: CUDA's 32-bit add wraps where
 * rn(v) saturates and azp > 0; here it saturates) and sat8 saturating to [-128, 127].
 * v is one f32 operation per element, as vLLM's kernels:
 *   static symmetric:   v = x / scale                          (a division)
 *   static asymmetric:  v = x * (1 / scale)                    (the reciprocal, then a product)
 *   dynamic symmetric:  scales[r] = absmax / 127, v = x * (absmax == 0 ? 0 : 127 / absmax)
 *   dynamic asymmetric: s = (max - min) / 255, scales[r] = s;
 *                       azp[r] = sat32(rn(-128 - min / s)) (NaN -> 0), v = x * (1 / s);
 *                       a row with s == 0 (constant, all-zero) gets scale 0, azp 0, codes 0
 * absmax, min and max are per row, over the f32 values, ignoring NaN (vLLM's fmaxf /
 * fminf); a row without a non-NaN value (all NaN, or D == 0) counts as all-zero: scale
 * 0 (azp 0), codes 0. An inf element makes the dynamic scale inf (then every code is
 * azp: 0 symmetric), and a row whose only non-NaN values are one infinity gets a NaN
 * asymmetric scale (inf - inf), codes 0. Outputs (out, scales, azp) must not overlap
 * the inputs or each other. Results do not depend on the ISA or the thread count. */

/* scale one f32 element ([] or [1]), finite and > 0 (else LK_ERR_VALUE naming it);
 * azp NULL (symmetric) or one i32 element (the zero point added to every code). */
LK_API lk_status lk_static_scaled_int8_quant(const lk_tensor *out, const lk_tensor *input,
                                             const lk_tensor *scale, const lk_tensor *azp);
/* scales written per row: [rows], [rows, 1] (vLLM's) or [..., 1] (input's leading dims,
 * then 1), f32; azp NULL (symmetric), or written per row in one of the same shapes, i32
 * (asymmetric). */
LK_API lk_status lk_dynamic_scaled_int8_quant(const lk_tensor *out, const lk_tensor *input,
                                              const lk_tensor *scales, const lk_tensor *azp);

#ifdef __cplusplus
}
#endif
#endif /* LLMKERN_H */
