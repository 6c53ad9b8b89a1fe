/*
 * The CPU kernel table and the argument structs the op front-ends (src/ops/) pass to
 * kernels after validation. A kernel may assume its arguments passed the op's check
 * function: shapes agree, indices are in range, outputs do not overlap inputs except
 * where the op allows it. Kernels return LK_OK or LK_ERR_NOMEM (before any store).
 *
 * One entry per op. dispatch.c fills one table per ISA: the reference table from ref/,
 * then each vector ISA's table starts as a copy of the previous one and its registration
 * function (src/cpu/simd/register.c, compiled once per ISA) overrides the entries its
 * SIMD sources provide. A SIMD kernel handles the layouts it is fast on and calls the
 * ref kernel for the rest (e.g. a last-dim stride != 1).
 */
#ifndef LK_KERNELS_H
#define LK_KERNELS_H

#include "../core/core.h"
#include "../common/attn_state.h"
#include "../core/paged.h"

typedef struct {
    lk_tensor out, x, w; /* out, x: [..., D]; w: [D] */
    float eps;
    int gemma;
} lk_rms_norm_args;

typedef struct {
    lk_tensor x, residual, w; /* x, residual: [..., D]; w: [D] */
    float eps;
    int gemma;
} lk_fused_add_rms_norm_args;

typedef struct {
    lk_tensor out, x; /* out: [..., d]; x: [..., 2d] */
} lk_act_args;

/* the extra activations (src/ops/act_ext.c): one table entry, `kind` says which */
typedef enum {
    LK_ACT_GELU_ERF_MUL = 0, /* gelu_and_mul */
    LK_ACT_MUL_SILU,         /* mul_and_silu */
    LK_ACT_FATRELU_MUL,      /* fatrelu_and_mul, p0 = threshold */
    LK_ACT_SWIGLUOAI_MUL,    /* swigluoai_and_mul, p0 = alpha, p1 = limit */
    LK_ACT_GELU_NEW,         /* gelu_new and gelu_fast (element-wise) */
    LK_ACT_GELU_QUICK        /* gelu_quick (element-wise) */
} lk_act_kind;

typedef struct {
    lk_tensor out, x; /* out: [..., d]; x: [..., 2d] (gated kinds) or [..., d] */
    lk_act_kind kind;
    float p0, p1;
} lk_act_ext_args;

/* swap_blocks / copy_blocks (src/ops/block_copy.c): for every cache pair c < n and
 * every mapping row i, block dst[c][map[i, 1]] = block src[c][map[i, 0]] (dim 0 indexes
 * blocks; the rest of each block is copied as it is, same dtype: bits). Validated: the
 * indices in range, no destination block twice, no destination block also a source of
 * the same cache, the tensors disjoint, so the copies are independent. */
typedef struct {
    int n;                    /* cache pairs */
    const lk_tensor *src;     /* n x [NBs, ...] */
    const lk_tensor *dst;     /* n x [NBd, ...]; copy_blocks: the same tensors as src */
    const int64_t *map;       /* [npairs, 2] (src block, dst block), a contiguous copy */
    int64_t npairs;
} lk_block_copy_args;

typedef struct {
    lk_tensor positions;  /* [T] i32/i64, validated in [0, max_pos) */
    lk_tensor q;          /* [T, Hq, D] */
    lk_tensor k;          /* [T, Hk, D]; ignored if !has_k */
    lk_tensor cos_sin;    /* [max_pos, rot] */
    int has_k;
    int is_neox;
} lk_rotary_args;

/* The front-end's validation of rotary arguments (src/ops/rotary.c), shared by
 * lk_rotary_embedding and lk_concat_and_cache_mla_rope; qn / kn name q and k in the
 * messages. */
lk_status lk_rotary_check(const lk_rotary_args *a, const char *qn, const char *kn);

typedef struct {
    lk_tensor k, v;             /* [T, H, D] */
    lk_tensor k_cache, v_cache; /* [num_blocks, block_size, H, D] */
    lk_tensor slot_mapping;     /* [N], validated < num_blocks * block_size */
    float k_scale, v_scale;     /* fp8 caches: stored = fp8(x / scale); else unused */
} lk_cache_args;

typedef struct {
    lk_tensor out;            /* [T, H, D] */
    lk_tensor out_lse;        /* [T, H] f32; ignored if !has_out_lse */
    int has_out_lse;
    int n;                    /* >= 1 */
    const lk_tensor *states;  /* n x [T, H, D] */
    const lk_tensor *lses;    /* n x [T, H] f32 */
    float out_scale;          /* fp8 out: stored fp8(merged / out_scale); else 1, unused */
} lk_merge_args;

typedef struct {
    lk_tensor out, x; /* [..., q_len, k_len] */
} lk_softmax_args;

/* ---- fp8 activations (src/ops/fp8_quant.c, src/ops/rms_norm.c, src/cpu/fp8_quant.h) ---- */
typedef enum {
    LK_Q_STATIC = 0,  /* scale given */
    LK_Q_TENSOR,      /* dynamic per tensor: scale written */
    LK_Q_TOKEN,       /* dynamic per token (row): scales written */
    LK_Q_GROUP,       /* dynamic per token group: scales written per (row, group) */
    LK_Q_STATIC_GRID  /* given scales per block of gm rows x group columns */
} lk_quant_mode;

/* scaled_fp8_quant: out = fp8(x / scale) */
typedef struct {
    lk_tensor out, x;  /* out fp8, x float: [..., D] */
    lk_quant_mode mode;
    float scale;       /* LK_Q_STATIC: the validated scale */
    float *scale_out;  /* LK_Q_TENSOR: where the scale goes */
    lk_tensor scales;  /* LK_Q_TOKEN: [rows] f32 view (a [..., 1] view flattened) */
    float ub;          /* LK_Q_TOKEN: scale_ub, or +inf without one */
    lk_tensor gscales; /* LK_Q_GROUP: [..., D / group] f32 view (x's leading dims) */
    int64_t group;     /* LK_Q_GROUP, LK_Q_STATIC_GRID: columns per group, divides D */
    int64_t gm;        /* LK_Q_STATIC_GRID: rows per group, divides the row count */
    lk_scale grid;     /* LK_Q_STATIC_GRID: the validated [rows / gm, D / group] scales */
    float eps;         /* LK_Q_GROUP: absmax floor */
    int ue8m0;         /* LK_Q_GROUP: scales rounded up to powers of two */
} lk_fp8_quant_args;

/* scaled_int8_quant (src/ops/int8_quant.c, src/cpu/int8_quant.h): out = sat8(sat32(rn(v))
 * + azp), v = x / scale (static symmetric) or x * mul (the others) */
typedef struct {
    lk_tensor out, x;  /* out i8, x float: [..., D] */
    int dynamic;       /* 0: static (scale, azp given); 1: per row (scales, azps written) */
    int asym;          /* with a zero point (static: azp; dynamic: azps written) */
    float scale;       /* static: the validated scale */
    int32_t azp;       /* static asymmetric: the zero point */
    lk_tensor scales;  /* dynamic: [..., 1] f32 view (a [rows] view reshaped) */
    lk_tensor azps;    /* dynamic asymmetric: [..., 1] i32 view */
} lk_int8_quant_args;

/* silu_and_mul + quant (src/ops/act_quant.c, src/cpu/act_quant.h): y = silu(x[..., :d]) *
 * x[..., d:] (f32, lk_aq_silu), out = q(y / s) */
typedef struct {
    lk_tensor out, x;  /* out fp8 / i8 [..., d]; x [..., 2d] */
    int64_t group;     /* 0: static per tensor (scale); else columns per block (divides d) */
    float scale;       /* group == 0: the given scale */
    lk_tensor scales;  /* group > 0: [..., d / group] f32, written */
    float ub;          /* group > 0: scale_ub or +inf */
} lk_act_quant_args;

/* the rms_norm + quant ops: y = x_or_residual * inv_rms * w; out = fp8(y / scale) */
typedef struct {
    lk_tensor out, x, w;  /* out fp8 [..., D]; x [..., D]; w [D] (stride 0: no weight) */
    lk_tensor residual;   /* [..., D]; ignored if !has_residual */
    int has_residual;
    float eps;
    lk_quant_mode mode;   /* LK_Q_STATIC or LK_Q_TOKEN */
    float scale;          /* LK_Q_STATIC */
    lk_tensor scales;     /* LK_Q_TOKEN: [..., 1] f32, or [..., D / group] with group */
    float ub;             /* LK_Q_TOKEN: scale_ub or +inf */
    int64_t group;        /* LK_Q_TOKEN: columns per scale (divides D), 0: the whole row */
} lk_rms_norm_quant_args;

/* flash_attn_varlen. Dense K/V are described as paged caches too: one "page" per
 * request starting at cu_seqlens_k[b] (kc.s1 = row stride), so kernels see one addressing
 * scheme: key j of request b, head h, dim d is at lk_attn_key_off(). */
typedef struct {
    lk_tensor out;         /* [Tq, Hq, Dv] */
    lk_tensor lse;         /* [Tq, Hq] f32; ignored if !has_lse */
    lk_tensor q;           /* [Tq, Hq, Dqk] */
    lk_paged kc, vc;       /* K [.., Hk, Dqk], V [.., Hk, Dv] */
    const int32_t *cu_q;   /* [B + 1] (contiguous copy made by the front-end) */
    const int32_t *k_start;/* dense: [B] first key row of each request; NULL when paged */
    const int32_t *k_len;  /* [B] key length of each request */
    const int32_t *table;  /* paged: [B, max_pages] (row stride table_stride); else NULL */
    int64_t table_stride;
    int64_t B, Hq, Hk, Dqk, Dv;
    float scale, softcap;
    int64_t wl, wr;        /* window; -1 unbounded; causal already folded into wr = 0 */
    int has_lse;
    const float *alibi;    /* NULL, or ALiBi slopes: request b, head h at alibi[b * alibi_bstride + h] */
    int64_t alibi_bstride; /* Hq ([B, Hq] slopes) or 0 ([Hq]) */
    /* ---- fp8 q / K / V (since 0.3): descales of request b, KV head kh at
     * lk_scale_at(&qd, b, kh); 1 for a q, K or V that is not fp8. Scores are
     * scale * qd * kd * (q . k) on the fp8 codes' values, out = vd * sum_j p_j v_j.
     * A zero-initialised lk_scale (p NULL: internal callers such as the MLA strategies)
     * reads as 1 (lk_attn_desc). */
    lk_scale qd, kd, vd;
    /* ---- fp8 out (since 0.3, lk_flash_attn_varlen_scaled): every out element is stored
     * fp8(value / out_scale), value the f32 vd * o / l a float out would round (one f32
     * division, then the src/core/fp8.h converter; the SIMD stores through lkv_store,
     * bit-identical). Read only when out is fp8 (internal callers leave it 0). */
    float out_scale;
} lk_attn_args;

/* descale of request b, KV head kh (1 where s->p is NULL) */
static inline float lk_attn_desc(const lk_scale *s, int64_t b, int64_t kh) {
    return s->p ? lk_scale_at(s, b, kh) : 1.0f;
}

/* ALiBi: s[jj] -= slope * |i + k_len - q_len - (j0 + jj)| for keys j0 .. j0 + n - 1 of
 * query i of request b, head h (f32; the SIMD kernels' one place for it) */
static inline void lk_attn_alibi_add(const lk_attn_args *a, int64_t b, int64_t h, int64_t i, int64_t q_len,
                                     int64_t k_len, int64_t j0, int64_t n, float *s) {
    float slope = a->alibi[b * a->alibi_bstride + h];
    int64_t pos = i + k_len - q_len - j0;
    for (int64_t jj = 0; jj < n; jj++) s[jj] -= slope * (float)(pos > jj ? pos - jj : jj - pos);
}

/* element offset of (request b, key j, kv head h, dim d) in kc or vc */
static inline int64_t lk_attn_key_off(const lk_attn_args *a, const lk_paged *c, int64_t b,
                                      int64_t j, int64_t h, int64_t d) {
    if (!a->table) return lk_paged_off(c, 0, a->k_start[b] + j, h, d);
    int64_t page = a->table[b * a->table_stride + j / c->block_size];
    return lk_paged_off(c, page, j % c->block_size, h, d);
}

/* visible key range [*lo, *hi] of query i of a request (q_len, k_len); empty if lo > hi */
static inline void lk_attn_window(const lk_attn_args *a, int64_t i, int64_t q_len, int64_t k_len,
                                  int64_t *lo, int64_t *hi) {
    int64_t off = k_len - q_len;
    *lo = a->wl < 0 ? 0 : i + off - a->wl;
    *hi = a->wr < 0 ? k_len - 1 : i + off + a->wr;
    if (*lo < 0) *lo = 0;
    if (*hi > k_len - 1) *hi = k_len - 1;
}

/* concat_and_cache_mla. Each part copies a source row [n] into dims [c0, c0 + n) of the
 * (H = 1) entry of its cache: one buffer: both parts in the same cache (c0 = 0 and Dl);
 * two buffers: each part in its own cache at c0 = 0. */
typedef struct {
    lk_tensor kv_c;         /* [T, Dl] */
    lk_tensor k_pe;         /* [T, Dr] */
    lk_paged kv_c_cache;    /* entry [Dl + Dr] (one buffer) or [Dl] */
    lk_paged k_pe_cache;    /* entry [Dr]; one buffer: a copy of kv_c_cache */
    int64_t pe_c0;          /* first entry dim of k_pe: Dl (one buffer) or 0 */
    lk_tensor slot_mapping; /* [N <= T] i32/i64, validated: < num_blocks * block_size, no duplicates */
    float scale;            /* fp8 caches: stored = fp8(x / scale); else unused (1) */
    int ds;                 /* LK_KV_DS_MLA (lk_ds_init): kv_c_cache = the codes part (scales at
                             * byte Dl of an entry), k_pe_cache = the bf16 part, pe_c0 = 0;
                             * concat_and_cache_mla_ds only */
} lk_mla_cache_args;

/* concat_and_cache_mla_rope: rope (q = q_pe, k = k_pe as [T, 1, Dr]) first, then cache
 * (whose k_pe is the same buffer, read after the rotation) */
typedef struct {
    lk_rotary_args rope;
    lk_mla_cache_args cache;
    int do_rope, do_cache; /* 0: that step has nothing to do (empty) */
} lk_mla_cache_rope_args;

/* gather_cache: out[t] = the entry of token j of request b (t = sum(seq_lens[:b]) + j),
 * read at position p = start_b + j of the request's block table (page p / block_size,
 * slot p % block_size) */
typedef struct {
    lk_tensor out;         /* [sum(seq_lens), H, D] (a 2-D [S, C] out is passed as [S, H, D]) */
    lk_paged cache;        /* entries H x D */
    lk_tensor block_table; /* [B, max_pages] i32, validated for every page read */
    lk_tensor seq_lens;    /* [B] i32, validated: start_b + seq_lens[b] <= max_pages * block_size */
    float scale;           /* fp8 cache, float out: out = f32(q) * scale; else unused (1) */
    const int32_t *starts; /* [B] (element stride starts_stride) start_b >= 0; NULL: all 0 */
    int64_t starts_stride;
    int ds;                /* LK_KV_DS_MLA: cache = the codes part (D = Dl, scales at byte Dl of
                            * an entry), rope = the bf16 part (D = Dr); out [S, 1, Dl + Dr];
                            * gather_cache_ds only */
    lk_paged rope;
} lk_gather_cache_args;

/* start_b of request b */
static inline int64_t lk_gather_start(const lk_gather_cache_args *a, int64_t b) {
    return a->starts ? a->starts[b * a->starts_stride] : 0;
}

/* ---- fp8 caches (src/ops/kv_cache.c, src/ops/convert_fp8.c) ---- */

/* reshape_and_cache_flash into paged caches (lk_reshape_and_cache_flash_fp8, and the
 * fp8 caches of the other two entry points): any float cache dtype, ND or NZ */
typedef struct {
    lk_tensor k, v;         /* [T, H, Dk], [T, H, Dv] f32/f16/bf16 */
    lk_paged kc, vc;        /* entries H x Dk, H x Dv */
    lk_tensor slot_mapping; /* [N <= T], validated: < num_blocks * block_size, no duplicates */
    lk_scale ks, vs;        /* fp8 cache: stored = fp8(x / scale(0, h)); else unused */
} lk_cache8_args;

/* convert_fp8: dst = fp8(src / scale) or round(f32(src) * scale); one of them fp8 */
typedef struct {
    lk_tensor dst, src; /* same shape, validated */
    float scale;
} lk_convert_fp8_args;

/* Shared by the SIMD mla cache kernels (src/cpu/mla_cache_common.c): the copy of one
 * token is, per part (concat: kv_c and k_pe; gather: one), a list of runs, stretches of
 * entry dims where both the cache and the row advance by one element. The driver
 * splits tokens over threads, groups up to LK_COPY_GROUP tokens that sit in
 * consecutive slots of one page, and calls the ISA's copy function once per group. */
#define LK_COPY_GROUP 32
typedef struct {
    int64_t coff, roff, len; /* cache offset from the entry base, row offset, elements */
} lk_copy_run;
typedef struct {
    char *cache;             /* entry (page, slot, 0, 0) of the group's first token */
    lk_dtype ct;
    int64_t cstep;           /* elements from one slot's entry to the next */
    char *row;               /* the first token's row (concat: kv_c / k_pe; gather: out) */
    lk_dtype rt;
    int64_t rstep;           /* elements from one row to the next */
    const lk_copy_run *runs;
    int64_t nruns;
} lk_copy_part;
typedef struct {
    lk_copy_part part[2];
    int nparts;
    int64_t ntok;     /* tokens in the group */
    int to_cache;     /* 1: row -> cache (concat); 0: cache -> row (gather) */
    int token_major;  /* long runs (ND): token by token, each token's parts and runs in
                         order; else (NZ) run by run across the tokens */
    int stream;       /* large output: non-temporal stores where aligned */
    int fence;        /* then sfence: the driver ends every thread's range with a call
                         {nparts = 0, ntok = 0, stream = fence = 1} */
    float scale;      /* fp8 caches (since 0.3): into fp8 x / scale, out of fp8 into a
                         float row q * scale (an fp8 row of the cache's dtype: bytes) */
} lk_copy_group;
typedef void (*lk_copy_runs_fn)(const lk_copy_group *g);
lk_status lk_mla_cache_drive(const lk_mla_cache_args *a, lk_copy_runs_fn copy);
lk_status lk_gather_cache_drive(const lk_gather_cache_args *a, lk_copy_runs_fn copy);

/* mla_softmax_block: the online-softmax step of one key block in the fused MLA prefill
 * (src/cpu/mla/fused.c), for nq query rows. Row r: when causal, scores S[r, c] with
 * c > lim0 + r are masked (-inf); then with the block max (NaN if a visible score is NaN
 * or +inf: the row becomes NaN, as attn_state.h's softmax rules say)
 *   alpha = lk_online_rescale(&st[r], max), S[r, :kb] = exp(S - lk_online_shift(m)),
 *   lk_online_add(&st[r], sum), O[r, :Dv] *= alpha (skipped when alpha == 1).
 * P16 != NULL (the bf16 engine): the weights go there instead, rounded to bf16 (RNE),
 * rows ldp apart, and S is left as scratch. */
typedef struct {
    float *S;             /* [nq, kb], rows lds apart */
    int64_t lds, nq, kb;
    int causal;
    int64_t lim0;         /* causal: column c visible to row r iff c <= lim0 + r */
    lk_online_state *st;  /* [nq] */
    float *O;             /* [nq, Dv], rows ldo apart */
    int64_t ldo, Dv;
    uint16_t *P16;        /* NULL, or [nq, kb] bf16, rows ldp apart */
    int64_t ldp;
} lk_mla_softmax_args;

/* mla_decode: validated arguments (src/ops/mla_decode.c). Rows of a request are
 * r = i * H + h (query i of s_q, head h); entry dim e < Dl + Dr of token j of request b
 * is at lk_mla_dec_off(). */
typedef struct {
    lk_tensor out;           /* [B, s_q, H, Dl] */
    lk_tensor lse;           /* [B, H, s_q] f32; ignored if !has_lse */
    int has_lse;
    lk_tensor q;             /* [B, s_q, H, Dl + Dr] */
    lk_paged lat;            /* H = 1; entries [Dl + Dr] (one buffer) or [Dl] */
    lk_paged rope;           /* two buffers: entries [Dr]; one buffer: a copy of lat */
    int one_buffer;
    const int32_t *seqlens;  /* [B], validated in [0, max_pages * block_size] */
    const int32_t *table;    /* [B, max_pages] row-major, validated for every page read */
    int64_t max_pages;
    int64_t B, s_q, H, Dl, Dr;
    float scale;
    int causal;
    int64_t split;           /* keys per split-KV chunk, >= 1 */
    float kscale;            /* fp8 caches: params.k_scale (scores * scale * kscale, out * kscale); else 1 */
    int ds;                  /* LK_KV_DS_MLA: lat = the e4m3 codes, rope = the bf16 part (two buffers);
                              * latent dim d of an entry = f32(code) * lk_ds_scale(entry, Dl, d / 128),
                              * kscale 1 */
} lk_mla_decode_args;

/* element offset, in lat (e < Dl or one buffer) or rope, of entry dim e of key j of b */
static inline int64_t lk_mla_dec_off(const lk_mla_decode_args *a, int64_t b, int64_t j, int64_t e) {
    int64_t bs = a->lat.block_size, page = a->table[b * a->max_pages + j / bs];
    if (a->one_buffer || e < a->Dl) return lk_paged_off(&a->lat, page, j % bs, 0, e);
    return lk_paged_off(&a->rope, page, j % bs, 0, e - a->Dl);
}

/* keys visible to query i of request b: [0, lk_mla_dec_limit) */
static inline int64_t lk_mla_dec_limit(const lk_mla_decode_args *a, int64_t b, int64_t i) {
    int64_t n = a->seqlens[b];
    if (!a->causal) return n;
    n = n - a->s_q + i + 1;
    return n < 0 ? 0 : n;
}

/* mla_prefix_prefill: the validated arguments (src/cpu/mla/mla.h) */
struct lk_mla_args;

typedef struct {
    lk_isa isa;
    lk_status (*rms_norm)(const lk_rms_norm_args *a);
    lk_status (*fused_add_rms_norm)(const lk_fused_add_rms_norm_args *a);
    lk_status (*silu_and_mul)(const lk_act_args *a);
    lk_status (*gelu_tanh_and_mul)(const lk_act_args *a);
    lk_status (*rotary_embedding)(const lk_rotary_args *a);
    lk_status (*reshape_and_cache_flash)(const lk_cache_args *a);
    lk_status (*merge_attn_states)(const lk_merge_args *a);
    lk_status (*causal_softmax)(const lk_softmax_args *a);
    lk_status (*flash_attn)(const lk_attn_args *a);
    lk_status (*concat_and_cache_mla)(const lk_mla_cache_args *a);
    lk_status (*gather_cache)(const lk_gather_cache_args *a);
    lk_status (*mla_softmax_block)(const lk_mla_softmax_args *a);
    lk_status (*mla_prefix_prefill)(const struct lk_mla_args *a, lk_mla_strategy strategy);
    lk_status (*act_ext)(const lk_act_ext_args *a);
    lk_status (*block_copy)(const lk_block_copy_args *a);
    lk_status (*mla_decode)(const lk_mla_decode_args *a);
    lk_status (*reshape_and_cache_paged)(const lk_cache8_args *a); /* fp8 caches */
    lk_status (*convert_fp8)(const lk_convert_fp8_args *a);         /* fp8 caches */
    /* fp8 activations */
    lk_status (*fp8_quant)(const lk_fp8_quant_args *a);
    lk_status (*rms_norm_quant)(const lk_rms_norm_quant_args *a);
    lk_status (*int8_quant)(const lk_int8_quant_args *a); /* int8 activations */
    lk_status (*act_quant)(const lk_act_quant_args *a);   /* silu_and_mul + quant */
    lk_status (*concat_and_cache_mla_rope)(const lk_mla_cache_rope_args *a);
    lk_status (*concat_and_cache_mla_ds)(const lk_mla_cache_args *a); /* LK_KV_DS_MLA caches */
    lk_status (*gather_cache_ds)(const lk_gather_cache_args *a);
} lk_kernel_table;

/* Table of the ISA in use. */
const lk_kernel_table *lk_kernels(void);

/* ---- ref/ ---- */
lk_status lk_ref_rms_norm(const lk_rms_norm_args *a);
lk_status lk_ref_fused_add_rms_norm(const lk_fused_add_rms_norm_args *a);
lk_status lk_ref_silu_and_mul(const lk_act_args *a);
lk_status lk_ref_gelu_tanh_and_mul(const lk_act_args *a);
lk_status lk_ref_rotary_embedding(const lk_rotary_args *a);
lk_status lk_ref_reshape_and_cache_flash(const lk_cache_args *a);
lk_status lk_ref_merge_attn_states(const lk_merge_args *a);
lk_status lk_ref_causal_softmax(const lk_softmax_args *a);
lk_status lk_ref_flash_attn(const lk_attn_args *a);
lk_status lk_ref_concat_and_cache_mla(const lk_mla_cache_args *a);
lk_status lk_ref_gather_cache(const lk_gather_cache_args *a);
lk_status lk_ref_concat_and_cache_mla_ds(const lk_mla_cache_args *a);
lk_status lk_ref_gather_cache_ds(const lk_gather_cache_args *a);
lk_status lk_ref_mla_softmax_block(const lk_mla_softmax_args *a);
lk_status lk_ref_act_ext(const lk_act_ext_args *a);
lk_status lk_ref_block_copy(const lk_block_copy_args *a);
lk_status lk_ref_mla_decode(const lk_mla_decode_args *a);
lk_status lk_ref_reshape_and_cache_paged(const lk_cache8_args *a); /* fp8 caches */
lk_status lk_ref_convert_fp8(const lk_convert_fp8_args *a);         /* fp8 caches */
/* fp8 activations */
lk_status lk_ref_fp8_quant(const lk_fp8_quant_args *a);
lk_status lk_ref_rms_norm_quant(const lk_rms_norm_quant_args *a);
lk_status lk_ref_int8_quant(const lk_int8_quant_args *a); /* int8 activations */
lk_status lk_ref_act_quant(const lk_act_quant_args *a);
/* every ISA: src/cpu/mla/driver.c over the table's own kernels */
lk_status lk_mla_prefill_drive(const struct lk_mla_args *a, lk_mla_strategy strategy);
/* every ISA: src/cpu/mla_cache_rope.c, the table's rotary and concat kernels in turn */
lk_status lk_mla_cache_rope_drive(const lk_mla_cache_rope_args *a);

#endif
