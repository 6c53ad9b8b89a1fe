/*
 * MLA prefix prefill: internal interface between the driver (driver.c: the kernel
 * table's mla_prefix_prefill entry, run on arguments src/ops/mla_prefill.c validated:
 * plan, strategy choice by cost.c, waves) and the strategies, which are compositions of
 * the kernel table's flash_attn / merge_attn_states / gather_cache and the oneDNN GEMMs
 * of gemm.c, plus one kernel of their own (the fused online-softmax pass). Each step
 * appends an item to the call's trace (src/core/trace.h).
 *
 * Shapes: T tokens, H heads, Dn nope + Dr rope query/key dims (Dqk = Dn + Dr), Dv value
 * dims, Dl latent dims, B requests, bs cache block size. E = Dl + Dr is one cache entry.
 *
 * Shared pipeline of the projecting strategies (split_merge, concat, fused):
 *   plan    (lk_mla_plan_build)  group each request's prefix pages into projection
 *            groups of g pages; with dedup, groups with the same block ids are one
 *            unique group; every unique group gets `pages` consecutive pages of the
 *            "uniform" buffers below (page p holds rows [p * bs, (p + 1) * bs)), and
 *            ptable maps (request, logical page) to them;
 *   gather  (lk_mla_gather)      G [pages * bs, E] of dtype gdt (bf16 when the cache and
 *            kv_b_proj are bf16, else f32) = the cache entries of every unique page
 *            through the gather_cache kernel (rows past a group's used length are 0);
 *   project (lk_mla_project)     one GEMM per unique group, M = pages * bs (the same call
 *            for the same group whatever the batch, so dedup on/off and any thread count
 *            give the same bits):  [rows, H * (Dn + Dv)] f32 = G[:, :Dl] . wp^T (bf16 x
 *            bf16 or f32 x f32), then Kp = [k_nope | G[:, Dl:]] (Dqk per head) and Vp
 *            (Dv per head), f32, token-major [pages * bs, H, D] for the flash_attn
 *            strategies or head-major [H, pages * bs, D] for the online engine (its
 *            GEMMs read one head's keys with unit row stride: oneDNN's f32 GEMM with B^T
 *            rows 3072 floats apart ran at 70 GFLOP/s against 101 with 192, Zen 4).
 * The driver runs a batch in waves of consecutive requests (about 24 MiB of projected
 * prefix each; the strategies see a wave as their batch, with exact token rows), reusing
 * the workspace buffers (lk_mla_ws) from wave to wave. Attention: split / concat call
 * the kernel table's flash_attn; fused / absorbed run the online-softmax engine of
 * online.c (oneDNN f32 tiles, or bf16 for absorbed's latent attention on bf16 data, +
 * the kernel table's mla_softmax_block).
 */
#ifndef LK_MLA_H
#define LK_MLA_H

#include <stdatomic.h>

#include "../../core/trace.h"
#include "../kernels.h"

/* reusable scratch of one call: the big buffers keep their memory across the waves
 * of requests (no page faults again each wave); freed at the end of the call */
#define LK_MLA_WS_SLOTS 4
typedef struct {
    void *p[LK_MLA_WS_SLOTS];
    size_t n[LK_MLA_WS_SLOTS];
} lk_mla_ws;

/* validated arguments (src/ops/mla_prefill.c's output; kernels.h names the struct) */
typedef struct lk_mla_args {
    lk_tensor out;          /* [T, H, Dv] */
    lk_tensor q, k;         /* [T, H, Dn + Dr] */
    lk_tensor v;            /* [T, H, Dv] */
    lk_tensor w;            /* kv_b_proj [H * (Dn + Dv), Dl] */
    /* GEMM operands, made once per call by the driver (lk_mla_weights) for its strategy */
    lk_dtype gdt;           /* gathered prefix G: LK_BF16 (projection in bf16) or LK_F32 */
    lk_tensor wp;           /* projection weight [H (Dn + Dv), Dl]: w itself when it is bf16
                               (with gdt bf16) or usable f32, else an f32 copy */
    lk_tensor wuk, wuv;     /* absorbed: W_UK [H, Dn, Dl] (w's bf16 rows when q and w are
                               bf16, else f32), W_UV [H, Dv, Dl] f32 */
    lk_paged lat;           /* latent cache, H = 1; D = Dl + Dr (one buffer) or Dl */
    lk_paged rope;          /* two buffers: rope cache, H = 1, D = Dr; one buffer: = lat */
    int one_buffer;         /* rope dims are [Dl, Dl + Dr) of lat's entries */
    const int32_t *cu_q;    /* [B + 1] */
    const int32_t *prefix;  /* [B] */
    const int32_t *table;   /* [B, max_pages] row-major */
    int64_t max_pages;
    int64_t B, T, H, Dn, Dr, Dv, Dl;
    float scale;
    float lat_scale;        /* k_scale when lat is fp8, else 1: G's latent columns hold the
                               fp8 codes' values, the consumers multiply by it */
    float rope_scale;       /* the same for the rope part (rope's dtype) */
    int dedup;
    lk_mla_ws *ws;          /* the driver's; slots: 0 gathered prefix, 1 / 2 projected K / V, 3 strategy's own */
} lk_mla_args;

/* slot's buffer of at least `bytes` (contents undefined), NULL when out of memory */
void *lk_mla_ws_get(const lk_mla_args *a, int slot, size_t bytes);
void lk_mla_ws_free(lk_mla_ws *ws);

/* 1 if one of the n elements of dtype dt at p (stride s elements) is inf or NaN (fp8 e4m3:
 * its NaN code); vectorised where s == 1 (common.c) */
int lk_mla_span_nonfinite(const void *p, lk_dtype dt, int64_t n, int64_t s);

/* ---------------------------------------------------------------- plan */

typedef struct {
    int64_t bs, g;           /* block size, pages per projection group */
    int64_t n_groups;        /* unique groups; [0, n_full) hold only full pages */
    int64_t n_full;
    int64_t n_logical;       /* groups over all requests before dedup */
    int64_t pages;           /* pages of the uniform buffers */
    int64_t *gp_pages;       /* [n_groups] pages of the group */
    int64_t *gp_used;        /* [n_groups] cache rows read (max over the requests using it) */
    int64_t *gp_page0;       /* [n_groups] first uniform page */
    int64_t *gp_ids;         /* [n_groups] offset of its block ids in args->table */
    int32_t *ptable;         /* [B, max_pages] uniform page of (request, logical page) */
} lk_mla_plan;

/* pages per projection group for the whole batch: about 512 rows per GEMM, but ~8
 * groups at least when there are enough pages; from the logical page count, so the
 * same with or without dedup */
int64_t lk_mla_plan_g(const lk_mla_args *a);
lk_status lk_mla_plan_build(const lk_mla_args *a, int64_t g, lk_mla_plan *p);
void lk_mla_plan_free(lk_mla_plan *p);

/* ---------------------------------------------------------------- shared steps */

/* row-major GEMM C[M, N] f32 = A . op(B) (+ C when accumulate), op(B) = B^T when trans_b,
 * A and B both of dtype dt (LK_F32 or LK_BF16); single-threaded on the calling thread
 * (gemm.c, oneDNN). LK_ERR_NOMEM / LK_ERR_UNSUPPORTED when oneDNN fails. */
lk_status lk_mla_gemm(lk_dtype dt, int trans_b, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda,
                      const void *B, int64_t ldb, int accumulate, float *C, int64_t ldc);
/* 1 when oneDNN has vector kernels for the bf16 GEMMs on this CPU (else they would be
 * its reference loops, and bf16 operands go to the f32 GEMM) */
int lk_mla_gemm_bf16(void);
/* first failure among a step's parallel units: s kept unless one is already there */
static inline void lk_mla_note(atomic_int *first, lk_status s) {
    int none = LK_OK;
    if (s) atomic_compare_exchange_strong(first, &none, (int)s);
}

/* A view of t usable as a GEMM operand of dtype dt: unit last-dim stride, every other
 * stride in [last dim, INT_MAX] (rows and heads do not overlap) */
int lk_mla_gemm_usable(const lk_tensor *t, lk_dtype dt);
/* An f32 view of t usable as a GEMM operand: t itself when it already is one, else a
 * contiguous copy made here (*owned, free() it). NULL *owned and LK_OK when t is usable
 * as is. */
lk_status lk_mla_f32_view(const lk_tensor *t, lk_tensor *view, float **owned);
/* t [T, H, D] (any float dtype and strides) as f32 head-major [H, T, D] (*out, free() it):
 * one head's rows with unit row stride for the online engine's GEMMs */
lk_status lk_mla_heads_f32(const lk_tensor *t, float **out);
/* 1 when the projecting strategies' projection runs in bf16: bf16 latent and rope caches,
 * kv_b_proj usable as a bf16 operand, oneDNN bf16 kernels on this CPU */
int lk_mla_proj_bf16(const lk_mla_args *a);
/* 1 when absorbed's latent attention runs on bf16 operands (G, Qa, P bf16): q, the
 * latent and rope caches and out bf16, oneDNN bf16 kernels on this CPU */
int lk_mla_lat_bf16(const lk_mla_args *a);
/* how flash_attn over the new tokens runs on the ISA avx512bf16 (lk_mla_shape.cur_bf16):
 * 1 Q.K^T on bf16 dot products (q, k bf16), 2 P.V too as long as it writes out itself
 * (v and out bf16 as well); 0 else */
int lk_mla_cur_bf16(const lk_mla_args *a);
/* the GEMM operands of strategy st (a->gdt, wp, wuk, wuv), copies in owned[0..1] */
lk_status lk_mla_weights(lk_mla_args *a, lk_mla_strategy st, float *owned[2]);

/* G [pages * bs, E] of dtype gdt */
lk_status lk_mla_gather(const lk_mla_args *a, const lk_mla_plan *p, lk_dtype gdt, void *G);
/* Kp / Vp token-major [pages * bs, H, Dqk / Dv], or head-major [H, pages * bs, ..] */
lk_status lk_mla_project(const lk_mla_args *a, const lk_mla_plan *p, const void *G, int head_major, float *Kp,
                         float *Vp);
/* gather + project into Kp / Vp (workspace slots 0-2, owned by the call) */
lk_status lk_mla_project_prefix(const lk_mla_args *a, const lk_mla_plan *p, int head_major, float **Kp,
                                float **Vp);

/* flash_attn of the new tokens over themselves (causal) -> out [T, H, Dv] (any view) and,
 * if lse != NULL, lse [T, H] f32 contiguous */
lk_status lk_mla_attn_current(const lk_mla_args *a, const lk_tensor *out, float *lse);
/* out = LSE merge of (o1, lse1) and (o2, lse2), all [T, H, (Dv)] f32 contiguous */
lk_status lk_mla_merge(const lk_mla_args *a, float *o1, float *lse1, float *o2, float *lse2);
/* Qs [nq, Dqk] = scale * q[t0 + r, h, :] (any dtype / strides) */
void lk_mla_load_q(const lk_mla_args *a, int64_t t0, int64_t nq, int64_t h, float *Qs);
/* out[t0 + r, h, :] = O[r] * lk_softmax_inv(st[r].l), rows ldo apart, rounded once */
void lk_mla_store_rows(const lk_mla_args *a, int64_t t0, int64_t nq, int64_t h, const float *O, int64_t ldo,
                       const lk_online_state *st);
/* zero the out rows outside [cu_q[0], cu_q[B]) */
void lk_mla_zero_padding(const lk_mla_args *a);

/* ---------------------------------------------------------------- online engine */

#define LK_MLA_KB 256 /* keys per block of the online engine */
#define LK_MLA_KD 64  /* keys per block on a causal diagonal */

/* keys n rows of the engine's dtype: K rows ldk elements apart, V rows ldv apart;
 * causal: key c visible to query row r iff c <= lim0 + r */
typedef struct {
    const void *K, *V;
    int64_t ldk, ldv, n;
    int causal;
    int64_t lim0;
} lk_mla_segment;

/* A unit's segment array lives in its float scratch after float and lk_online_state
 * arrays of data-dependent lengths: its start is rounded up to the struct's alignment,
 * and scratch sizes add LK_MLA_SEG_SLACK bytes for that. */
#define LK_MLA_SEG_SLACK _Alignof(lk_mla_segment)
static inline lk_mla_segment *lk_mla_seg_align(void *p) {
    uintptr_t al = _Alignof(lk_mla_segment);
    return (lk_mla_segment *)(((uintptr_t)p + al - 1) & ~(al - 1));
}

/* online softmax of nq rows Q [nq, Dqk] (rows ldq apart, already scaled) over the
 * prefix runs pre[0, npre) (one logical key sequence, no mask) and then, if cur != NULL,
 * the causal segment cur: O [nq, Dv] f32 (rows ldo apart) = unnormalised sum p_j v_j,
 * st = the rows' states (init: start from O = 0 and empty states; else continue from
 * the given ones). Q, K, V of dtype dt: LK_F32, or LK_BF16 (only when
 * lk_mla_gemm_bf16(); P then rounded to bf16). Scratch: S [nq, LK_MLA_KB] f32, P16
 * [nq, LK_MLA_KB] (bf16 only, else unused), panel [LK_MLA_KB, Dqk + Dv] of dt. online.c.
 * Returns the first GEMM failure (LK_OK). */
lk_status lk_mla_online_attn(lk_dtype dt, const void *Q, int64_t ldq, int64_t nq, int64_t Dqk, int64_t Dv,
                             const lk_mla_segment *pre, int64_t npre, const lk_mla_segment *cur, float *S,
                             uint16_t *P16, void *panel, float *O, int64_t ldo, lk_online_state *st, int init);
/* request b's prefix as segments (runs of consecutive uniform pages) of the uniform
 * buffers K (rows ldk elements of dt apart) and V (ldv): at most ceil(P / bs) segments;
 * returns the count */
int64_t lk_mla_prefix_segments(const lk_mla_args *a, const lk_mla_plan *p, int64_t b, lk_dtype dt, const void *K,
                               int64_t ldk, const void *V, int64_t ldv, lk_mla_segment *seg);

/* ---------------------------------------------------------------- strategies */

lk_status lk_mla_split_merge(const lk_mla_args *a, const lk_mla_plan *p);
lk_status lk_mla_concat(const lk_mla_args *a, const lk_mla_plan *p);
lk_status lk_mla_fused(const lk_mla_args *a, const lk_mla_plan *p);
lk_status lk_mla_absorbed(const lk_mla_args *a, const lk_mla_plan *p);

#endif
