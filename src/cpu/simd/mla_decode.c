/*
 * mla_decode, every vector ISA (src/cpu/vec/lkv.h, W lanes): absorbed MLA attention of
 * R = s_q * H query rows per request (row r = i * H + h) over the paged latent cache,
 * all rows sharing each entry e_j (K = e_j, E = Dl + Dr dims; V = e_j[:Dl]).
 *
 * Unit = (request b, split chunk of a->split keys): every entry of the chunk is read and
 * converted once, in blocks of KB keys, and serves all R rows through two register-
 * blocked GEMM micro-kernels with the rows in the vector lanes:
 *   Qt  [E][Rp]    scale * q transposed (rows in lanes, Rp = R rounded up to W), stored
 *                  as panels of PW = 2W rows [E][PW], once per unit (W x W transposes)
 *   Kf  [KB][Ep]   the block's entries as f32 rows (dims past E zero, keys past the
 *                  block's end zero: never read from the cache)
 *   S   [KB][Rp]   = Kf . Qt      (mk: MR keys x PW rows per tile, k over E dims)
 *                  masked (keys past the chunk, causal limits per lane), then the
 *                  online-softmax step per row, vectorised across the rows' lanes:
 *                  m' = max(m, block max), alpha = exp(m - m'), P = exp(S - shift(m')),
 *                  l = alpha l + sum P (the rules of src/common/attn_state.h)
 *   O   [Dlp][Rp]  = alpha O + Kf[:, :Dlp]^T . P  (mk again: MR dims x PW rows per tile,
 *                  k over the block's keys, alpha folded into the accumulator load)
 * MR = LKV_MR (6 on AVX2: 12 accumulators of 16 ymm; 12 on AVX-512: 24 of 32 zmm).
 * The bf16 path (AVX512_BF16, below) runs the same chunk on bf16 pairs; for R <= W its
 * small-R kernels keep the rows out of the lanes (4 rows x 6 keys per score tile, O
 * row-major in 4 rows x 6 vectors of dims), the choice depending only on R. Where
 * lk_cpu_prefer_fma (Intel: VDPBF16PS at half the FMAs' rate) the avx512bf16 row takes
 * the f32 path instead.
 * The AMX build (the amx row, LKV_AMX) runs the bf16 path's inputs on tile products for
 * any R instead (run_chunk_amx below: 256-key blocks, entries read in place as tile
 * operands for both products).
 * fp8 caches (e4m3 / e5m2, NZ tile 32): codes loaded as they are (f32 path on x86:
 * lkv_load2_f8_raw, e4m3 as value / 256 with the 256 in kmul, a row with the NaN code
 * again by lkv_load; NEON: lkv_load; bf16 path: exact bf16 rows in the block copy; on
 * the AMX path with Dl a multiple of 64, 64 codes at a time in lkv_f8_to_bf16_x2's
 * order, q's rows and O's dims taken in the same order: x2_dim), scores scaled by
 * scale * kscale and the output by kscale (a->kscale, 1 for other caches).
 * fp8_ds_mla records (a->ds): the f32 path: each key's tiles of 128 codes loaded exactly
 * and multiplied by their scale in the block copy, the rope part from bf16 (kmul 1): the
 * block holds the values an f32 cache of them would give. The bf16 path (not AMX): Kb
 * holds the codes' exact bf16 values and Ks [KB][G] the keys' G = Dl / 128 tile scales;
 * a score is sum over tiles g of s_g (q_g . c_g) (each tile's f32 sums times its scale,
 * in tile order) plus q_r . rope; P . V takes, for the dims of tile g, its own P16_g =
 * bf16(P s_g) (G of them). A block holding a scale beyond DS_NEAR (or inf / NaN) takes
 * f32 products instead (scores_exact, pv_visible_only): the bf16 products flush partial
 * sums below 2^-126, which such a scale would make count.
 * A chunk's state (m, l, O) is the output (requests with one chunk: out = O / l, lse =
 * m + log l, rows transposed back) or a slot of the split-KV states, merged afterwards
 * per request in chunk order (lk_online_rescale: the same rule as flash_attn's chunks).
 * Chunks depend only on the arguments (a->split), so results do not depend on the
 * thread count.
 *
 * Masked keys: a causal row's hidden keys get P = 0; where such a key's V holds an inf
 * or NaN (0 * inf), that block's P.V is done row by row over the visible keys only.
 * Layouts served: q, out and cache entries with unit last-dim stride (ND or NZ); others
 * go to the reference. Threads: units handed out dynamically (lk_parallel_units), the
 * merge split over requests (lk_parallel_for).
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/attn_state.h"
#include "../kernels.h"
#include "../vec/lkv.h"

#define MR LKV_MR        /* micro-kernel rows (keys or dims) */
#if defined(LKV_AVX2) || defined(LKV_AVX512)
#define F8_RAW 1         /* the f32 path widens fp8 by lkv_load2_f8_raw: e4m3 as value / 256 */
#endif
#define PW (2 * LKV_W)   /* micro-kernel columns (query rows) */
#define KB (8 * LKV_MR)  /* keys per block: AVX2 48, AVX-512 96 */

static inline int64_t rup(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
static inline int64_t min64(int64_t x, int64_t y) { return x < y ? x : y; }

/* ------------------------------------------------------------------ micro-kernel */

/* C[MR][nv W] = (acc ? alpha * C : 0) + sum_k A(m, k) B[k][0, nv W), A(m, k) = A[m am + k ak],
 * B rows ldb apart, C rows ldc apart; nv (1 or 2), acc and am literal after inlining */
LK_ALWAYS_INLINE void mk(int64_t K, const float *A, int64_t am, int64_t ak, const float *B, int64_t ldb, float *C,
                         int64_t ldc, int nv, int acc, const float *alpha) {
    lkv_f32 c0[MR], c1[MR];
    if (acc) {
        lkv_f32 a0 = lkv_loadu(alpha), a1 = nv == 2 ? lkv_loadu(alpha + LKV_W) : a0;
        for (int m = 0; m < MR; m++) {
            c0[m] = lkv_mul(lkv_loadu(C + m * ldc), a0);
            c1[m] = nv == 2 ? lkv_mul(lkv_loadu(C + m * ldc + LKV_W), a1) : lkv_zero();
        }
    } else {
        for (int m = 0; m < MR; m++) c0[m] = c1[m] = lkv_zero();
    }
    for (int64_t k = 0; k < K; k++) {
        const float *ap = A + k * ak, *bp = B + k * ldb;
        lkv_f32 b0 = lkv_loadu(bp), b1 = nv == 2 ? lkv_loadu(bp + LKV_W) : b0;
        for (int m = 0; m < MR; m++) {
            lkv_f32 av = lkv_set1(ap[m * am]);
            c0[m] = lkv_fma(av, b0, c0[m]);
            if (nv == 2) c1[m] = lkv_fma(av, b1, c1[m]);
        }
    }
    for (int m = 0; m < MR; m++) {
        lkv_storeu(C + m * ldc, c0[m]);
        if (nv == 2) lkv_storeu(C + m * ldc + LKV_W, c1[m]);
    }
}

/* ------------------------------------------------------------------ context */

typedef struct {
    const lk_mla_decode_args *a;
    int64_t E, Ep, Dlp, R, Rp;
    int bf16;                  /* LKV_BF16DOT builds, q, cache and out bf16: run_chunk16 */
    int64_t E2, L16, V2;       /* bf16 path: words per q row, bf16 per Kb row, words per Vp row */
    int small;                 /* bf16 path, R <= W: the small-R kernels, O row-major [Rp][Dlo] */
    int amx;                   /* AMX builds, the bf16 path's inputs: run_chunk_amx, O row-major */
    int rowo;                  /* small or amx: O row-major [Rp][Dlo] */
    int64_t Dlq, V2s, Dlo;     /* O's dims (Dl rounded to 2W), Vp's and O's row strides */
    int64_t E2a;               /* amx: words per row of a q panel (E rounded up to 32, halved) */
    float kmul;                /* the cache's scale as the path's scores and O see it: kscale,
                                * times 256 where the f32 path reads e4m3 as value / 256 */
    int64_t E64;               /* amx, fp8 cache, Dl a multiple of 64: Kb's, Qa's and O's
                                * positions [0, E64) in x2_dim's order, else 0 */
    int64_t *unit_b, *unit_k;  /* [n_units] request, chunk index */
    int64_t *nsplit, *slot0;   /* [B] chunks of request b, its first state slot (-1: none) */
    float *st;                 /* [slots][slot_floats]: m [Rp], l [Rp], O [Dlp][Rp] */
    int64_t slot_floats;
    float *scratch;            /* per thread [scratch_floats] */
    int64_t scratch_floats;
} dec_ctx;

/* Qt panels = scale * q[b] transposed: panel p (rows [p PW, p PW + pw)) is [E][pw] */
static void load_q(const dec_ctx *c, int64_t b, float *Qt) {
    const lk_mla_decode_args *a = c->a;
    const lk_tensor *q = &a->q;
    int64_t E = c->E, R = c->R, H = a->H, es = lk_esize(q->dtype);
    lkv_f32 sc = lkv_set1(a->scale * c->kmul);
    for (int64_t r0 = 0; r0 < c->Rp; r0 += LKV_W) {
        int64_t p = r0 / PW, pw = min64(PW, c->Rp - p * PW), col = r0 - p * PW;
        float *panel = Qt + p * PW * E;
        const char *row[LKV_W];
        for (int k = 0; k < LKV_W; k++) {
            int64_t r = r0 + k;
            row[k] = r < R ? (const char *)q->data + (b * q->stride[0] + (r / H) * q->stride[1] + (r % H) * q->stride[2]) * es
                           : NULL;
        }
        for (int64_t d0 = 0; d0 < E; d0 += LKV_W) {
            int64_t n = min64(LKV_W, E - d0);
            lkv_f32 v[LKV_W];
            for (int k = 0; k < LKV_W; k++)
                v[k] = !row[k] ? lkv_zero() : n == LKV_W ? lkv_load(row[k] + d0 * es, q->dtype)
                                                         : lkv_load_part(row[k] + d0 * es, q->dtype, n);
            lkv_transpose(v);
            for (int64_t k = 0; k < n; k++) lkv_storeu(panel + (d0 + k) * pw + col, lkv_mul(v[k], sc));
        }
    }
}

/* dim d's element offset in an entry of tiles of tl dims cs elements apart (ND: tl = cs
 * = 16, contiguous; NZ: the tile 16 or 32 and s1) */
static inline int64_t tile_off(int64_t d, int64_t tl, int64_t cs) { return (d / tl) * cs + d % tl; }

/* dims [d0, n) of one cache part (tiles of tl dims cs elements apart) from p into the f32
 * row dst, times mul (fp8: the codes' values, the scale applied to scores and out); full
 * W stores where they stay inside the row's Ep, else the tail is stored part-wise */
LK_ALWAYS_INLINE void load_part_row(float *dst, const char *p, int64_t tl, int64_t cs, int64_t d0, int64_t n,
                                    int64_t room, lk_dtype dt, float mul) {
    int64_t es = lk_esize(dt);
    for (int64_t d = d0; d < n; d += LKV_W) {
        int64_t m = min64(LKV_W, n - d);
        const char *src = p + tile_off(d, tl, cs) * es;
        lkv_f32 v = m == LKV_W ? lkv_load(src, dt) : lkv_load_part(src, dt, m);
        if (mul != 1.0f) v = lkv_mul(v, lkv_set1(mul));
        if (d + LKV_W <= room) lkv_storeu(dst + d, v);
        else lkv_store_part(dst + d, LK_F32, v, m);
    }
}

static inline int64_t chunk_stride(const lk_paged *c) { return c->layout == LK_KV_NZ ? c->s1 : 16; }
static inline int64_t chunk_tile(const lk_paged *c) { return c->layout == LK_KV_NZ ? c->tile : 16; }

#if defined(F8_RAW)
/* load_part_row for fp8 codes: 2W a load through f16 words (lkv_load2_f8_raw; 2W codes lie
 * in one tile), the rest W at a time by lkv_load; e4m3 as value / 256 throughout (c->kmul
 * has the 256), and where its NaN code was read (lkv_e4m3_nan_found) the row again by lkv_load */
LK_ALWAYS_INLINE void load_part_row_f8(float *dst, const char *p, int64_t tl, int64_t cs, int64_t n, int64_t room,
                                       lk_dtype dt) {
    const int e4 = dt == LK_F8E4M3;
    lkv_c32 nan = lkv_c32_zero();
    int64_t d = 0;
    for (; d + 2 * LKV_W <= n; d += 2 * LKV_W) {
        lkv_f32 a, b;
        lkv_load2_f8_raw(p + tile_off(d, tl, cs), dt, &a, &b, e4 ? &nan : NULL);
        lkv_storeu(dst + d, a);
        lkv_storeu(dst + d + LKV_W, b);
    }
    if (e4 && lkv_e4m3_nan_found(nan)) d = 0;
    load_part_row(dst, p, tl, cs, d, n, room, dt, e4 ? 1.0f / 256 : 1.0f);
}
#endif

/* Kf rows [0, nb) = entries of keys j0 .. j0 + nb of request b as f32 (dims [E, Ep) are
 * zero from the unit's start), rows [nb, nbp) zero */
LK_ALWAYS_INLINE void load_block(const dec_ctx *c, int64_t b, int64_t j0, int64_t nb, int64_t nbp, float *Kf,
                                 lk_dtype lt, lk_dtype rt) {
    const lk_mla_decode_args *a = c->a;
    int64_t Ep = c->Ep, bs = a->lat.block_size, les = lk_esize(lt), res = lk_esize(rt);
    int64_t lcs = chunk_stride(&a->lat), rcs = chunk_stride(&a->rope);
    int64_t nl = a->one_buffer ? c->E : a->Dl;
    const int32_t *tab = a->table + b * a->max_pages;
    for (int64_t jj = 0, page = 0, slot = bs; jj < nb; jj++, slot++) {
        if (slot == bs) page = tab[(j0 + jj) / bs], slot = (j0 + jj) % bs; /* one division a page */
        float *dst = Kf + jj * Ep;
        const char *lp = (const char *)a->lat.data + lk_paged_off(&a->lat, page, slot, 0, 0) * les;
        const char *rp = a->one_buffer ? NULL : (const char *)a->rope.data + lk_paged_off(&a->rope, page, slot, 0, 0) * res;
        if (a->ds) { /* fp8_ds_mla: each tile's codes times its scale (one product), then the bf16 part */
            for (int64_t g = 0; g < a->Dl / LK_DS_TILE; g++) {
                float sc = lk_ds_scale(lp, a->Dl, g), *dg = dst + g * LK_DS_TILE;
#if defined(F8_RAW)
                /* codes / 256 by the raw widening, times 256 s: (c / 256)(256 s) = c s exactly
                 * (both factors exact: c / 256 >= 2^-17, 256 s finite), so the same product */
                if (sc * 256.0f <= FLT_MAX) {
                    load_part_row_f8(dg, lp + g * LK_DS_TILE, 16, 16, LK_DS_TILE, Ep - g * LK_DS_TILE, LK_F8E4M3);
                    lkv_f32 k = lkv_set1(sc * 256.0f);
                    for (int64_t d = 0; d < LK_DS_TILE; d += LKV_W) lkv_storeu(dg + d, lkv_mul(lkv_loadu(dg + d), k));
                    continue;
                }
#endif
                load_part_row(dg, lp + g * LK_DS_TILE, 16, 16, 0, LK_DS_TILE, Ep - g * LK_DS_TILE, LK_F8E4M3, sc);
            }
            load_part_row(dst + a->Dl, rp, 16, 16, 0, a->Dr, Ep - a->Dl, LK_BF16, 1.0f);
            continue;
        }
#if defined(F8_RAW)
        if (lk_is_fp8(lt)) { /* rt == lt */
            load_part_row_f8(dst, lp, chunk_tile(&a->lat), lcs, nl, Ep, lt);
            if (rp) load_part_row_f8(dst + a->Dl, rp, chunk_tile(&a->rope), rcs, a->Dr, Ep - a->Dl, rt);
            continue;
        }
#endif
        load_part_row(dst, lp, chunk_tile(&a->lat), lcs, 0, nl, Ep, lt, 1.0f);
        if (rp) load_part_row(dst + a->Dl, rp, chunk_tile(&a->rope), rcs, 0, a->Dr, Ep - a->Dl, rt, 1.0f);
    }
    for (int64_t jj = nb; jj < nbp; jj++) memset(Kf + jj * Ep, 0, sizeof(float) * (size_t)Ep);
}

/* any inf or NaN among dims [0, D) of rows [j0, j1) of Kf */
static int rows_nonfinite(const float *Kf, int64_t Ep, int64_t j0, int64_t j1, int64_t D) {
    for (int64_t j = j0; j < j1; j++)
        for (int64_t d = 0; d < D; d++) {
            float x = Kf[j * Ep + d];
            if (!isfinite(x)) return 1;
        }
    return 0;
}

/* ------------------------------------------------------------------ one chunk */

/* per-lane visible keys of the block [j0, j0 + nb) (lim, as floats) from the rows'
 * limits Lr; returns the smallest over the R real rows */
static int64_t block_limits(const int64_t *Lr, int64_t R, int64_t Rp, int64_t j0, int64_t nb, float *lim) {
    int64_t minlim = nb;
    for (int64_t r = 0; r < Rp; r++) {
        int64_t v = Lr[r] - j0;
        v = v < 0 ? 0 : v > nb ? nb : v;
        lim[r] = (float)v;
        if (r < R && v < minlim) minlim = v;
    }
    return minlim;
}

/* S [nbp][Rp] = scale * S masked (key jj >= lim of a lane: -inf), then the online-softmax
 * step of every row (lanes): m' = max(m, block max), alpha = exp(m - m') (1 where m
 * does not change), S = P = exp(S - shift(m')), l = alpha l + sum P */
static void softmax_block(float *S, int64_t Rp, int64_t nbp, const float *lim, float scale, float *m, float *l,
                          float *alpha) {
    const lkv_f32 ninf = lkv_set1(-INFINITY), one = lkv_set1(1.0f), sc = lkv_set1(scale);
    for (int64_t v = 0; v < Rp; v += LKV_W) {
        lkv_f32 lv = lkv_loadu(lim + v), bmax = ninf;
        for (int64_t jj = 0; jj < nbp; jj++) {
            lkv_f32 x = lkv_blend(ninf, lkv_mul(lkv_loadu(S + jj * Rp + v), sc), lkv_lt(lkv_set1((float)jj), lv));
            lkv_storeu(S + jj * Rp + v, x);
            bmax = lkv_max(x, bmax); /* NaN scores skipped here; they make l NaN below */
        }
        lkv_f32 mo = lkv_loadu(m + v), mn = lkv_max(bmax, mo);
        lkv_f32 al = lkv_blend(one, lkv_exp(lkv_sub(mo, mn)), lkv_lt(mo, mn));
        lkv_f32 sh = lkv_zero_where(lkv_lt(mn, lkv_set1(-FLT_MAX)), mn), sum = lkv_zero();
        for (int64_t jj = 0; jj < nbp; jj++) {
            lkv_f32 p = lkv_exp_nonpos(lkv_sub(lkv_loadu(S + jj * Rp + v), sh)); /* <= 0 or NaN */
            lkv_storeu(S + jj * Rp + v, p);
            sum = lkv_add(sum, p);
        }
        lkv_storeu(l + v, lkv_fma(lkv_loadu(l + v), al, sum));
        lkv_storeu(m + v, mn);
        lkv_storeu(alpha + v, al);
    }
}

/* position d's place in O's row of the AMX path: each 32 positions as their 16 even then
 * 16 odd ones */
static inline int64_t perm32(int64_t d) { return (d & ~(int64_t)31) + (d & 1) * 16 + ((d & 31) >> 1); }

/* P.V row by row over each lane's visible keys only, V(jj, d) = vrow(jj)[d] (f32 Kf rows
 * or bf16 Kb rows; with ks, fp8_ds_mla codes, times the key's tile scale ks[jj G + d / 128]
 * in f32): for blocks where a key hidden from some row has an inf or NaN value, on the AMX
 * path for blocks with an inf or NaN score, and for fp8_ds_mla blocks with a scale beyond
 * DS_NEAR; perm: O's dims in the order of perm32 */
static void pv_visible_only(const float *S, int64_t Rp, const float *lim, const float *Kf, const uint16_t *Kb,
                            int64_t rs, int64_t Dlp, int first, const float *alpha, float *O, int64_t od, int64_t orr,
                            int perm, const float *ks, int64_t G) {
    for (int64_t r = 0; r < Rp; r++) {
        int64_t vis = (int64_t)lim[r];
        for (int64_t d = 0; d < Dlp; d++) {
            /* O[d][r]: od = Rp, orr = 1; row-major O[r][d]: od = 1, orr = Dlq */
            float *o = O + (perm ? perm32(d) : d) * od + r * orr;
            float acc = first ? 0.0f : *o * alpha[r];
            for (int64_t jj = 0; jj < vis; jj++) {
                float v = Kf ? Kf[jj * rs + d] : lk_bits_f32((uint32_t)Kb[jj * rs + d] << 16);
                acc += S[jj * Rp + r] * (ks ? v * ks[jj * G + d / LK_DS_TILE] : v);
            }
            *o = acc;
        }
    }
}

/* The chunk [k0, k1) of request b for all R rows; state into m, l [Rp], O [Dlp][Rp]. */
LK_ALWAYS_INLINE void run_chunk(const dec_ctx *c, int64_t b, int64_t k0, int64_t k1, float *scr, float *m, float *l,
                                float *O, lk_dtype lt, lk_dtype rt) {
    const lk_mla_decode_args *a = c->a;
    int64_t E = c->E, Ep = c->Ep, Dlp = c->Dlp, R = c->R, Rp = c->Rp;
    float *Qt = scr;                  // [E][Rp] as panels
    float *Kf = Qt + E * Rp;          // [KB][Ep]
    float *S = Kf + KB * Ep;          // [KB][Rp]
    float *alpha = S + KB * Rp;       // [Rp]
    float *lim = alpha + Rp;          // [Rp] visible keys of each row in the block
    const int64_t *Lr = (const int64_t *)(lim + Rp); // [Rp] causal limit of each row (keys < Lr)
    load_q(c, b, Qt);
    for (int64_t jj = 0; jj < KB; jj++)
        if (Ep > E) memset(Kf + jj * Ep + E, 0, sizeof(float) * (size_t)(Ep - E));
    for (int64_t j0 = k0; j0 < k1; j0 += KB) {
        int first = j0 == k0;
        int64_t nb = min64(KB, k1 - j0), nbp = rup(nb, MR), minlim = block_limits(Lr, R, Rp, j0, nb, lim);
        load_block(c, b, j0, nb, nbp, Kf, lt, rt);
        /* S = Kf . Qt */
        for (int64_t p0 = 0; p0 < Rp; p0 += PW) {
            const float *panel = Qt + p0 * E;
            if (Rp - p0 >= PW)
                for (int64_t m0 = 0; m0 < nbp; m0 += MR) mk(E, Kf + m0 * Ep, Ep, 1, panel, PW, S + m0 * Rp + p0, Rp, 2, 0, NULL);
            else
                for (int64_t m0 = 0; m0 < nbp; m0 += MR)
                    mk(E, Kf + m0 * Ep, Ep, 1, panel, LKV_W, S + m0 * Rp + p0, Rp, 1, 0, NULL);
        }
        softmax_block(S, Rp, nbp, lim, 1.0f, m, l, alpha);
        /* O = alpha O + Kf[:, :Dlp]^T . P */
        if (minlim < nb && rows_nonfinite(Kf, Ep, minlim, nb, a->Dl)) {
            pv_visible_only(S, Rp, lim, Kf, NULL, Ep, Dlp, first, alpha, O, Rp, 1, 0, NULL, 0);
            continue;
        }
        for (int64_t p0 = 0; p0 < Rp; p0 += PW) {
            int two = Rp - p0 >= PW;
            for (int64_t m0 = 0; m0 < Dlp; m0 += MR) {
                float *C = O + m0 * Rp + p0;
                if (first && two) mk(nbp, Kf + m0, 1, Ep, S + p0, Rp, C, Rp, 2, 0, NULL);
                else if (first) mk(nbp, Kf + m0, 1, Ep, S + p0, Rp, C, Rp, 1, 0, NULL);
                else if (two) mk(nbp, Kf + m0, 1, Ep, S + p0, Rp, C, Rp, 2, 1, alpha + p0);
                else mk(nbp, Kf + m0, 1, Ep, S + p0, Rp, C, Rp, 1, 1, alpha + p0);
            }
        }
    }
}

#if defined(LKV_BF16DOT)
/* ---- the bf16 dot-product path (AVX512_BF16), for bf16 q, cache and out ----
 * The same chunk on pairs of bf16 values (lkv_dot2: two exact products per f32 lane):
 *   Qb  [E2][Rp] words   q's bf16 pairs (dims 2k, 2k + 1) transposed, as panels; the
 *                        scale multiplies the f32 scores
 *   Kb  [KB][L16] bf16   the block's entries as they are (copied: pages, NZ chunks and
 *                        two buffers become plain rows)
 *   S = Kb . Qb          (mk2 over E2 pairs), softmax_block as above (P f32, l f32)
 *   P16 [KB/2][Rp] words P rounded to bf16 (round to nearest even, as the bf16 flash
 *                        attention path), keys 2k and 2k + 1 paired
 *   Vp  [KB/2][V2] words V's pairs of keys 2k, 2k + 1 per dim (lkv_zip16 of two rows)
 *   O = alpha O + Vp . P16  (mk2 over the block's key pairs)
 * mk2: C[mr][nv W] = (acc ? alpha * C : 0) + sum_k A(m, k) . B[k] as pairs (mk's shape);
 * post 1: C = ks[m kst] sum, 2: C = C + ks[m kst] sum (one FMA), 3: C = C + sum (the
 * fp8_ds_mla tiles' scaled scores); mr <= MR, nv, acc, mr, post literal after inlining */
LK_ALWAYS_INLINE void mk2(int64_t K, const uint32_t *A, int64_t am, int64_t ak, const uint32_t *B, int64_t ldb,
                          float *C, int64_t ldc, int nv, int acc, const float *alpha, int mr, const float *ks,
                          int64_t kst, int post) {
    lkv_f32 c0[MR], c1[MR];
    if (acc) {
        lkv_f32 a0 = lkv_loadu(alpha), a1 = nv == 2 ? lkv_loadu(alpha + LKV_W) : a0;
        for (int m = 0; m < mr; m++) {
            c0[m] = lkv_mul(lkv_loadu(C + m * ldc), a0);
            c1[m] = nv == 2 ? lkv_mul(lkv_loadu(C + m * ldc + LKV_W), a1) : lkv_zero();
        }
    } else {
        for (int m = 0; m < mr; m++) c0[m] = c1[m] = lkv_zero();
    }
    for (int64_t k = 0; k < K; k++) {
        const uint32_t *ap = A + k * ak, *bp = B + k * ldb;
        lkv_bits b0 = lkv_bits_loadu(bp), b1 = nv == 2 ? lkv_bits_loadu(bp + LKV_W) : b0;
        for (int m = 0; m < mr; m++) {
            lkv_bits av = lkv_bits_set1(ap[m * am]);
            c0[m] = lkv_dot2(c0[m], av, b0);
            if (nv == 2) c1[m] = lkv_dot2(c1[m], av, b1);
        }
    }
    for (int m = 0; m < mr; m++) {
        lkv_f32 f = post == 1 || post == 2 ? lkv_set1(ks[m * kst]) : lkv_zero();
        for (int v = 0; v < nv; v++) {
            lkv_f32 x = v ? c1[m] : c0[m];
            float *cp = C + m * ldc + v * LKV_W;
            if (post == 1) x = lkv_mul(x, f);
            else if (post == 2) x = lkv_fma(x, f, lkv_loadu(cp));
            else if (post == 3) x = lkv_add(x, lkv_loadu(cp));
            lkv_storeu(cp, x);
        }
    }
}

/* O rows [m0, m0 + mr) of one panel (C, Rp floats apart) = (first ? 0 : alpha O) + the np
 * key pairs of Vp (rows V2 words apart, from dim m0) times the panel's P16 words; first,
 * two (2 vectors of rows) and mr literal after inlining */
LK_ALWAYS_INLINE void pv_rows(int64_t np, const uint32_t *Vp, int64_t V2, const uint32_t *P, int64_t Rp, float *C,
                              int first, int two, const float *alpha, int mr) {
    if (first && two) mk2(np, Vp, 1, V2, P, Rp, C, Rp, 2, 0, NULL, mr, NULL, 0, 0);
    else if (first) mk2(np, Vp, 1, V2, P, Rp, C, Rp, 1, 0, NULL, mr, NULL, 0, 0);
    else if (two) mk2(np, Vp, 1, V2, P, Rp, C, Rp, 2, 1, alpha, mr, NULL, 0, 0);
    else mk2(np, Vp, 1, V2, P, Rp, C, Rp, 1, 1, alpha, mr, NULL, 0, 0);
}

/* the dim at position i (< 64) of a group of 64 widened by lkv_f8_to_bf16_x2: positions
 * 0-31 (its w0) hold dims 16 L + t, positions 32-63 (w1) dims 16 L + 8 + t, L the 128-bit
 * lane and t < 8. With E64 (the AMX path's fp8 caches) every whole group of a Kb / Qa row
 * below E64 is in this order, and through perm32 so are O's rows. */
static inline int64_t x2_dim(int64_t i) { return (i & 32 ? 8 : 0) + 16 * ((i & 31) >> 3) + (i & 7); }

/* Qb panels: words of q[b]'s bf16 pairs, transposed (W x W transposes of 32-bit words):
 * panels of pwmax rows (the last one narrower), e2 words per row of a panel (pairs past
 * E zero) */
static void load_q16(const dec_ctx *c, int64_t b, uint32_t *Qb, int64_t pwmax, int64_t e2) {
    const lk_mla_decode_args *a = c->a;
    __m512i x2_idx[2]; /* the dims of positions [32 h, 32 h + 32) of a group of 64 (x2_dim) */
    for (int h = 0; h < 2; h++) {
        uint16_t ix[32];
        for (int i = 0; i < 32; i++) ix[i] = (uint16_t)x2_dim(32 * h + i);
        x2_idx[h] = _mm512_loadu_si512(ix);
    }
    const lk_tensor *q = &a->q;
    int64_t E = c->E, R = c->R, H = a->H;
    for (int64_t r0 = 0; r0 < c->Rp; r0 += LKV_W) {
        int64_t p = r0 / pwmax, pw = min64(pwmax, c->Rp - p * pwmax), col = r0 - p * pwmax;
        uint32_t *panel = Qb + p * pwmax * e2;
        const uint16_t *row[LKV_W];
        for (int k = 0; k < LKV_W; k++) {
            int64_t r = r0 + k;
            row[k] = r < R ? (const uint16_t *)q->data + b * q->stride[0] + (r / H) * q->stride[1] + (r % H) * q->stride[2]
                           : NULL;
        }
        for (int64_t w0 = 0; w0 < e2; w0 += LKV_W) {
            int64_t n = min64(LKV_W, e2 - w0), ne = min64(2 * LKV_W, E - 2 * w0); /* words, bf16 values */
            lkv_f32 v[LKV_W];
            for (int k = 0; k < LKV_W; k++) {
                uint16_t tmp[2 * LKV_W] = {0};
                if (row[k] && 2 * w0 < c->E64) { /* positions in x2_dim's order (whole groups: ne = 2W) */
                    const uint16_t *g = row[k] + (2 * w0 & ~(int64_t)63);
                    v[k] = lkv_as_f32(_mm512_permutex2var_epi16(lkv_bits_loadu(g), x2_idx[(w0 >> 4) & 1],
                                                                 lkv_bits_loadu(g + 32)));
                } else if (row[k] && ne == 2 * LKV_W) v[k] = lkv_as_f32(lkv_bits_loadu(row[k] + 2 * w0));
                else {
                    if (row[k] && ne > 0) memcpy(tmp, row[k] + 2 * w0, sizeof(uint16_t) * (size_t)ne);
                    v[k] = lkv_as_f32(lkv_bits_loadu(tmp));
                }
            }
            lkv_transpose(v); /* shuffles only: the bits move unchanged */
            for (int64_t k = 0; k < n; k++) lkv_bits_storeu(panel + (w0 + k) * pw + col, lkv_as_i32(v[k]));
        }
    }
}

/* prefetcht1 as an asm statement: GCC 12 drops the __builtin_prefetch loops below (no
 * prefetch instruction was emitted for them at -O1 and above) */
static inline void pf_l2(const char *p) { __asm__ volatile("prefetcht1 %0" : : "m"(*p)); }

/* bytes [0, n) at p into L2, one prefetch per 64 bytes */
static inline void pf_range(const char *p, int64_t n) {
    for (int64_t o = 0; o < n; o += 64) pf_l2(p + o);
}

/* slots [slot, slot + m) of page `page` of one cache part (D dims per entry) into L2: one
 * range per page (ND rows back to back) or per 16-dim chunk (NZ), else per slot */
static inline void prefetch_slots(const lk_paged *pc, int64_t page, int64_t slot, int64_t m, int64_t D) {
    int64_t es = lk_esize(pc->dtype);
    const char *base = (const char *)pc->data + lk_paged_off(pc, page, slot, 0, 0) * es;
    if (pc->layout == LK_KV_ND) {
        if (pc->s1 == D) pf_range(base, m * D * es);
        else
            for (int64_t i = 0; i < m; i++) pf_range(base + i * pc->s1 * es, D * es);
        return;
    }
    for (int64_t d = 0; d < D; d += pc->tile) {
        const char *cp = base + (d / pc->tile) * pc->s1 * es;
        if (pc->s2 == pc->tile) pf_range(cp, m * pc->tile * es);
        else
            for (int64_t i = 0; i < m; i++) pf_range(cp + i * pc->s2 * es, pc->tile * es);
    }
}

/* keys [j, j + n) below kend of request b into L2: the next block's entries, a few keys
 * at a time between the micro-kernel calls of this block (spread over the block's work,
 * not issued in one burst) */
static void prefetch_keys(const dec_ctx *c, int64_t b, int64_t j, int64_t n, int64_t kend) {
    const lk_mla_decode_args *a = c->a;
    int64_t bs = a->lat.block_size;
    const int32_t *tab = a->table + b * a->max_pages;
    if (j + n > kend) n = kend - j;
    for (int64_t pi = n > 0 ? j / bs : 0, slot = n > 0 ? j % bs : 0; n > 0; pi++, slot = 0) {
        int64_t m = min64(n, bs - slot);
        prefetch_slots(&a->lat, tab[pi], slot, m, a->one_buffer ? c->E : a->ds ? a->Dl + a->Dl / 32 : a->Dl); /* ds: + scales */
        if (!a->one_buffer) prefetch_slots(&a->rope, tab[pi], slot, m, a->Dr);
        n -= m;
    }
}

/* dst[0, min(n, 32)) = the bf16 values of the fp8 codes at p (exact, the bits lkv_load +
 * lk_f32_to_bf16 give: lkv_f8_to_bf16) */
static inline void f8_to_bf16(uint16_t *dst, const uint8_t *p, int64_t n, lk_dtype dt) {
    __mmask32 m = n >= 32 ? ~(__mmask32)0 : (((__mmask32)1 << n) - 1);
    _mm512_mask_storeu_epi16(dst, m, lkv_f8_to_bf16(_mm256_maskz_loadu_epi8(m, p), dt));
}

/* dst[0, n) = the bf16 values of one part of an entry's fp8 codes at p (tiles of tl = 16
 * or 32 dims cs codes apart: 32 dims contiguous), exact. x2 (n64 > 0): dims [0, n64) in
 * groups of 64 by lkv_f8_to_bf16_x2, each stored in its order (position i of a group
 * holds dim x2_dim(i)); the rest in order, 32 at a time. dt literal after inlining. */
LK_ALWAYS_INLINE void f8_part_to_bf16(uint16_t *dst, const uint8_t *p, int64_t n, int64_t n64, int64_t tl,
                                      int64_t cs, lk_dtype dt) {
    int sh = tl == 32 ? 5 : 4;
    int64_t d = 0;
    for (; d < n64; d += 64) {
        __m512i codes = tl == cs ? _mm512_loadu_si512(p + d)
                                 : lkv_bits_join32(lkv_c32_loadu(p + (d >> sh) * cs),
                                                   lkv_c32_loadu(p + ((d + 32) >> sh) * cs));
        lkv_bits w0, w1;
        lkv_f8_to_bf16_x2(codes, dt, &w0, &w1);
        lkv_bits_storeu(dst + d, w0);
        lkv_bits_storeu(dst + d + 32, w1);
    }
    for (; d + 32 <= n; d += 32) lkv_bits_storeu(dst + d, lkv_f8_to_bf16(lkv_c32_loadu(p + (d >> sh) * cs), dt));
    if (d < n) f8_to_bf16(dst + d, p + (d >> sh) * cs, n - d, dt);
}

/* the largest tile scale the bf16 products of fp8_ds_mla records take: past it (or inf,
 * NaN) a score's partial sums that VDPBF16PS flushes to 0 (below 2^-126) could matter once
 * scaled, so such a block takes f32 products (scores_exact, pv_visible_only) */
#define DS_NEAR 0x1p64f

/* Kb rows [0, nb) = the bf16 entries of keys j0 .. j0 + nb (elements [E, L16) stay zero
 * from the unit's start), rows [nb, nbp) zero. fp8_ds_mla (Ks: [KB][G]): the codes' values
 * in Kb, the keys' tile scales in Ks (rows [nb, nbp) 0); returns 1 where a key of the block
 * has a scale beyond DS_NEAR in magnitude, inf or NaN */
static int load_block16(const dec_ctx *c, int64_t b, int64_t j0, int64_t nb, int64_t nbp, uint16_t *Kb, float *Ks) {
    const lk_mla_decode_args *a = c->a;
    int64_t L16 = c->L16, bs = a->lat.block_size;
    const int32_t *tab = a->table + b * a->max_pages;
    const lk_paged *part[2] = {&a->lat, &a->rope};
    int64_t n[2] = {a->one_buffer ? c->E : a->Dl, a->one_buffer ? 0 : a->Dr}, at[2] = {0, a->Dl};
    int64_t G = a->Dl / LK_DS_TILE;
    int far = 0;
    for (int64_t jj = 0, page = 0, slot = bs; jj < nb; jj++, slot++) {
        if (slot == bs) page = tab[(j0 + jj) / bs], slot = (j0 + jj) % bs; /* one division a page */
        for (int k = 0; k < 2; k++) {
            if (!n[k]) continue;
            const lk_paged *pc = part[k];
            uint16_t *dst = Kb + jj * L16 + at[k];
            if (lk_is_fp8(pc->dtype)) { /* fp8 -> bf16 is exact: the codes' values, as bf16 */
                const uint8_t *b8 = (const uint8_t *)pc->data + lk_paged_off(pc, page, slot, 0, 0);
                for (int64_t g = 0; Ks && g < G; g++) {
                    float sc = lk_ds_scale(b8, a->Dl, g);
                    Ks[jj * G + g] = sc;
                    far |= !(fabsf(sc) <= DS_NEAR);
                }
                int64_t tl = chunk_tile(pc), cs = chunk_stride(pc), n64 = c->E64 ? n[k] / 64 * 64 : 0;
                if (pc->dtype == LK_F8E4M3) f8_part_to_bf16(dst, b8, n[k], n64, tl, cs, LK_F8E4M3);
                else f8_part_to_bf16(dst, b8, n[k], n64, tl, cs, LK_F8E5M2);
                continue;
            }
            const uint16_t *src = (const uint16_t *)pc->data + lk_paged_off(pc, page, slot, 0, 0);
            if (pc->layout == LK_KV_ND) lkv_copy_bytes((char *)dst, (const char *)src, sizeof(uint16_t) * (size_t)n[k], 0);
            else
                for (int64_t d = 0; d < n[k]; d += 16) lkv_c32_storeu((char *)(dst + d), lkv_c32_loadu(src + (d >> 4) * pc->s1));
        }
    }
    for (int64_t jj = nb; jj < nbp; jj++) {
        memset(Kb + jj * L16, 0, sizeof(uint16_t) * (size_t)L16);
        for (int64_t g = 0; Ks && g < G; g++) Ks[jj * G + g] = 0.0f;
    }
    return far;
}

/* S[jj][r] (jj < nbp, r < Rp) = q_r . e_jj as a float64 sum rounded once, e_jj the values an
 * f32 cache of the records holds (f32(code) * scale, the bf16 rope) from Kb and Ks; 0 past
 * nb and R: the scores of a block of fp8_ds_mla records with a scale beyond DS_NEAR */
static void scores_exact(const dec_ctx *c, int64_t b, const uint16_t *Kb, const float *Ks, int64_t nb, int64_t nbp,
                         float *S) {
    const lk_mla_decode_args *a = c->a;
    const lk_tensor *q = &a->q;
    int64_t E = c->E, L16 = c->L16, Rp = c->Rp, H = a->H, G = a->Dl / LK_DS_TILE;
    for (int64_t jj = 0; jj < nbp; jj++)
        for (int64_t r = 0; r < Rp; r++) {
            double acc = 0;
            if (jj < nb && r < c->R) {
                const uint16_t *qr =
                    (const uint16_t *)q->data + b * q->stride[0] + (r / H) * q->stride[1] + (r % H) * q->stride[2];
                for (int64_t e = 0; e < E; e++) {
                    float v = lk_bits_f32((uint32_t)Kb[jj * L16 + e] << 16);
                    if (e < a->Dl) v *= Ks[jj * G + e / LK_DS_TILE];
                    acc += (double)lk_bits_f32((uint32_t)qr[e] << 16) * v;
                }
            }
            S[jj * Rp + r] = (float)acc;
        }
}

static int rows_nonfinite16(const uint16_t *Kb, int64_t L16, int64_t j0, int64_t j1, int64_t D) {
    for (int64_t j = j0; j < j1; j++)
        for (int64_t d = 0; d < D; d++)
            if ((Kb[j * L16 + d] & 0x7f80) == 0x7f80) return 1;
    return 0;
}

/* ---- small R (R <= W: one vector of rows would give one broadcast per dot product) ----
 * Each loaded vector serves several rows and keys instead:
 *   Qs  [Rp][L16] bf16   q[b]'s rows as they are (rows past R and dims past E zero)
 *   S   [KB][Rp]         qk16_small: 4 rows x 6 keys per tile, both operands vectors of
 *                        2W dims (VDPBF16PS), 24 accumulators reduced by lkv_hsum4 (one
 *                        tree per score, in a fixed order; fp8_ds_mla: 3 keys at a
 *                        time, 12 accumulators and 12 tile totals, one FMA a tile, the
 *                        rope's sums added last); softmax_block and P16 as above
 *   O   [Rp][Dlq] f32    row-major: pv16_small, 4 rows x nv (6, 4 or 2) vectors of W dims
 *                        per tile: P16's word of (key pair, row) broadcast, Vp's pairs
 *                        loaded as vectors (Vp rows V2s = Dlq + W words apart: no 2 KiB
 *                        aliasing of the rows in L1) */
/* acc[i][j] += Qs row i . key row j (j < nk, 6 or 3, literal after inlining) over dims
 * [d0, d1), 2W at a time (the rows end at E) */
LK_ALWAYS_INLINE void qk16_span(const uint16_t *Qs, const uint16_t *const *kr, int64_t L16, int64_t d0, int64_t d1,
                                int64_t E, lkv_f32 acc[4][6], int nk) {
    for (int64_t d = d0; d < d1; d += 2 * LKV_W) {
        lkv_bits k[6];
        if (d + 2 * LKV_W <= E)
            for (int j = 0; j < nk; j++) k[j] = lkv_bits_loadu(kr[j] + d);
        else /* the rows end at E (cache rows read in place): the tail masked */
            for (int j = 0; j < nk; j++) k[j] = lkv_bits_load16(kr[j] + d, E - d);
        for (int i = 0; i < 4; i++) {
            lkv_bits qv = lkv_bits_loadu(Qs + i * L16 + d);
            for (int j = 0; j < nk; j++) acc[i][j] = lkv_dot2(acc[i][j], qv, k[j]);
        }
    }
}

/* S[j][0, 4) = the 4 rows' scores of the 6 keys kr[j]; fp8_ds_mla (ks: the keys' G tile
 * scales, G apart): 3 keys at a time, each tile's 12 accumulators times the keys' scales
 * into 12 totals (one FMA a tile, all in registers), then the rope's sums added */
LK_ALWAYS_INLINE void qk16_small(const uint16_t *Qs, const uint16_t *const *kr, int64_t L16, int64_t E, float *S,
                                  int64_t Rp, const float *ks, int64_t G, int64_t Dl) {
    lkv_f32 acc[4][6];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 6; j++) acc[i][j] = lkv_zero();
    if (!ks) {
        qk16_span(Qs, kr, L16, 0, E, E, acc, 6);
    } else {
        for (int h = 0; h < 6; h += 3) {
            lkv_f32 a[4][6], t[4][3];
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 3; j++) a[i][j] = t[i][j] = lkv_zero();
            for (int64_t g = 0; g < G; g++) {
                qk16_span(Qs, kr + h, L16, g * LK_DS_TILE, (g + 1) * LK_DS_TILE, E, a, 3);
                for (int j = 0; j < 3; j++) {
                    lkv_f32 f = lkv_set1(ks[(h + j) * G + g]);
                    for (int i = 0; i < 4; i++) t[i][j] = g ? lkv_fma(a[i][j], f, t[i][j]) : lkv_mul(a[i][j], f), a[i][j] = lkv_zero();
                }
            }
            qk16_span(Qs, kr + h, L16, Dl, E, E, a, 3);
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 3; j++) acc[i][h + j] = Dl < E ? lkv_add(t[i][j], a[i][j]) : t[i][j];
        }
    }
    for (int j = 0; j < 6; j++) _mm_storeu_ps(S + j * Rp, lkv_hsum4(acc[0][j], acc[1][j], acc[2][j], acc[3][j]));
}

/* O[i][v W, v W + W) (rows i < 4 ldo apart, v < nv) = (first ? 0 : alpha[i] O) + sum over the
 * np key pairs k of P16[k Rp + i] . Vp[k V2s + v W] */
LK_ALWAYS_INLINE void pv16_small(int64_t np, const uint32_t *P16, int64_t Rp, const uint32_t *Vp, int64_t V2s, float *O,
                                 int64_t ldo, int nv, int first, const float *alpha) {
    lkv_f32 c[4][6];
    for (int i = 0; i < 4; i++) {
        lkv_f32 al = lkv_set1(first ? 0.0f : alpha[i]);
        for (int v = 0; v < nv; v++) c[i][v] = first ? lkv_zero() : lkv_mul(lkv_loadu(O + i * ldo + v * LKV_W), al);
    }
    for (int64_t k = 0; k < np; k++) {
        lkv_bits vv[6];
        for (int v = 0; v < nv; v++) vv[v] = lkv_bits_loadu(Vp + k * V2s + v * LKV_W);
        for (int i = 0; i < 4; i++) {
            lkv_bits w = lkv_bits_set1(P16[k * Rp + i]);
            for (int v = 0; v < nv; v++) c[i][v] = lkv_dot2(c[i][v], w, vv[v]);
        }
    }
    for (int i = 0; i < 4; i++)
        for (int v = 0; v < nv; v++) lkv_storeu(O + i * ldo + v * LKV_W, c[i][v]);
}

/* Qs rows = q[b]'s bf16 rows (dims [E, L16) and rows [R, Rp) zero) */
static void load_q16_small(const dec_ctx *c, int64_t b, uint16_t *Qs) {
    const lk_mla_decode_args *a = c->a;
    const lk_tensor *q = &a->q;
    int64_t E = c->E, L16 = c->L16, H = a->H;
    memset(Qs, 0, sizeof(uint16_t) * (size_t)(c->Rp * L16));
    for (int64_t r = 0; r < c->R; r++)
        memcpy(Qs + r * L16, (const uint16_t *)q->data + b * q->stride[0] + (r / H) * q->stride[1] + (r % H) * q->stride[2],
               sizeof(uint16_t) * (size_t)E);
}

LK_ALWAYS_INLINE void run_chunk16(const dec_ctx *c, int64_t b, int64_t k0, int64_t k1, float *scr, float *m, float *l,
                                  float *O, int small, int ds) {
    const lk_mla_decode_args *a = c->a;
    int64_t E2 = c->E2, L16 = c->L16, Dlp = c->Dlp, R = c->R, Rp = c->Rp, G = ds ? a->Dl / LK_DS_TILE : 1;
    int64_t V2 = small ? c->Dlq : c->V2, V2s = small ? c->V2s : c->V2, Rq = rup(R, 4);
    uint32_t *Qb = (uint32_t *)scr;                 // [E2][Rp] words as panels; small: Qs [Rp][L16] bf16
    uint16_t *Qs = (uint16_t *)scr;
    uint16_t *Kb = small ? Qs + Rp * L16 : (uint16_t *)(Qb + E2 * Rp); // [KB][L16] bf16 (small: + a zero row)
    float *S = (float *)(Kb + (KB + small) * L16);  // [KB][Rp]
    uint32_t *P16 = (uint32_t *)(S + KB * Rp);      // [G][KB/2][Rp] words (ds: one per tile)
    uint32_t *Vp = P16 + G * (KB / 2) * Rp;         // [KB/2][V2s] words
    float *Ks = (float *)(Vp + KB / 2 * V2s);       // ds: [KB][G] the block's tile scales
    float *alpha = Ks + (ds ? KB * G : 0);          // [Rp]
    float *lim = alpha + Rp;                        // [Rp]
    const int64_t *Lr = (const int64_t *)(lim + Rp); // [Rp]
    if (small) {
        load_q16_small(c, b, Qs);
        memset(S, 0, sizeof(float) * (size_t)(KB * Rp)); /* lanes [Rq, Rp) stay 0 (masked) */
    } else {
        load_q16(c, b, Qb, PW, c->E2);
    }
    for (int64_t jj = 0; jj < KB && L16 > c->E; jj++) memset(Kb + jj * L16 + c->E, 0, sizeof(uint16_t) * (size_t)(L16 - c->E));
    /* small R over a bf16 ND one-buffer cache: the entries are read in place (rows of E
     * contiguous values), not copied; keys past the block's end read the zero row */
    const lk_paged *lat = &a->lat;
    int direct = small && a->one_buffer && lat->layout == LK_KV_ND && lat->dtype == LK_BF16;
    const uint16_t *rows[KB], *zrow = Kb + KB * L16;
    if (small) memset(Kb + KB * L16, 0, sizeof(uint16_t) * (size_t)L16);
    for (int64_t j0 = k0; j0 < k1; j0 += KB) {
        int first = j0 == k0, far = 0;
        int64_t nb = min64(KB, k1 - j0), nbp = rup(nb, MR), minlim = block_limits(Lr, R, Rp, j0, nb, lim);
        if (direct) {
            const int32_t *tab = a->table + b * a->max_pages;
            for (int64_t jj = 0; jj < nbp; jj++) {
                int64_t j = j0 + jj;
                rows[jj] = jj < nb ? (const uint16_t *)lat->data +
                                         lk_paged_off(lat, tab[j / lat->block_size], j % lat->block_size, 0, 0)
                                   : zrow;
            }
        } else {
            far = load_block16(c, b, j0, nb, nbp, Kb, ds ? Ks : NULL);
            for (int64_t jj = 0; jj < nbp; jj++) rows[jj] = Kb + jj * L16;
        }
        if (ds && far) { /* a scale beyond the bf16 products: this block in f32 */
            scores_exact(c, b, Kb, Ks, nb, nbp, S);
            softmax_block(S, Rp, nbp, lim, a->scale * c->kmul, m, l, alpha);
            if (small) pv_visible_only(S, Rp, lim, NULL, Kb, L16, c->Dlq, first, alpha, O, 1, c->Dlq, 0, Ks, G);
            else pv_visible_only(S, Rp, lim, NULL, Kb, L16, Dlp, first, alpha, O, Rp, 1, 0, Ks, G);
            continue;
        }
        if (small) {
            for (int64_t m0 = 0; m0 < nbp; m0 += 6) { /* nbp is a multiple of MR, of 6 */
                prefetch_keys(c, b, j0 + KB + m0, 6, k1);
                for (int64_t r0 = 0; r0 < Rq; r0 += 4)
                    qk16_small(Qs + r0 * L16, rows + m0, L16, c->E, S + m0 * Rp + r0, Rp, ds ? Ks + m0 * G : NULL, G, a->Dl);
            }
        } else {
            for (int64_t m0 = 0; m0 < KB; m0 += MR) prefetch_keys(c, b, j0 + KB + m0, MR, k1);
            for (int64_t p0 = 0; p0 < Rp; p0 += PW) {
                const uint32_t *panel = Qb + p0 * E2, *A = (const uint32_t *)Kb;
                int64_t pw = Rp - p0 >= PW ? PW : LKV_W, T2 = LK_DS_TILE / 2, R2 = a->Dl / 2; /* pairs */
                for (int64_t m0 = 0; m0 < nbp; m0 += MR) {
                    const uint32_t *Am = A + m0 * (L16 / 2);
                    float *C = S + m0 * Rp + p0;
                    if (!ds && pw == PW) mk2(E2, Am, L16 / 2, 1, panel, PW, C, Rp, 2, 0, NULL, MR, NULL, 0, 0);
                    else if (!ds) mk2(E2, Am, L16 / 2, 1, panel, LKV_W, C, Rp, 1, 0, NULL, MR, NULL, 0, 0);
                    /* fp8_ds_mla: each tile's sums times the keys' scales, in tile order, then the rope's */
                    for (int64_t g = 0; ds && g < G; g++) {
                        const float *ks = Ks + m0 * G + g;
                        if (pw == PW) mk2(T2, Am + g * T2, L16 / 2, 1, panel + g * T2 * PW, PW, C, Rp, 2, 0, NULL, MR, ks, G, g ? 2 : 1);
                        else mk2(T2, Am + g * T2, L16 / 2, 1, panel + g * T2 * LKV_W, LKV_W, C, Rp, 1, 0, NULL, MR, ks, G, g ? 2 : 1);
                    }
                    if (ds && E2 > R2 && pw == PW) mk2(E2 - R2, Am + R2, L16 / 2, 1, panel + R2 * PW, PW, C, Rp, 2, 0, NULL, MR, NULL, 0, 3);
                    else if (ds && E2 > R2) mk2(E2 - R2, Am + R2, L16 / 2, 1, panel + R2 * LKV_W, LKV_W, C, Rp, 1, 0, NULL, MR, NULL, 0, 3);
                }
            }
        }
        softmax_block(S, Rp, nbp, lim, a->scale * c->kmul, m, l, alpha);
        if (direct && minlim < nb) load_block16(c, b, j0, nb, nbp, Kb, NULL); /* for the check (and the fallback) */
        if (minlim < nb && rows_nonfinite16(Kb, L16, minlim, nb, a->Dl)) {
            if (small) pv_visible_only(S, Rp, lim, NULL, Kb, L16, c->Dlq, first, alpha, O, 1, c->Dlq, 0, ds ? Ks : NULL, G);
            else pv_visible_only(S, Rp, lim, NULL, Kb, L16, Dlp, first, alpha, O, Rp, 1, 0, ds ? Ks : NULL, G);
            continue;
        }
        /* P16 (ds: one per tile, P times the key's tile scale, then rounded), Vp: keys paired
         * (nbp is even: MR is) */
        for (int64_t jp = 0; jp < nbp / 2; jp++) {
            for (int64_t g = 0; g < G; g++)
                for (int64_t v = 0; v < Rp; v += LKV_W) {
                    lkv_f32 x0 = lkv_loadu(S + 2 * jp * Rp + v), x1 = lkv_loadu(S + (2 * jp + 1) * Rp + v);
                    if (ds) x0 = lkv_mul(x0, lkv_set1(Ks[2 * jp * G + g])), x1 = lkv_mul(x1, lkv_set1(Ks[(2 * jp + 1) * G + g]));
                    lkv_i32 lo = lkv_bf16_bits(x0), hi = lkv_bf16_bits(x1);
                    lkv_bits_storeu(P16 + (g * (KB / 2) + jp) * Rp + v,
                                    lkv_as_i32(lkv_or(lkv_as_f32(lo), lkv_as_f32(lkv_i32_slli(hi, 16)))));
                }
            const uint16_t *r0 = rows[2 * jp], *r1 = rows[2 * jp + 1];
            for (int64_t d = 0; d < V2; d += 2 * LKV_W) {
                lkv_bits zl, zh, x0, x1;
                if (d + 2 * LKV_W <= c->E) x0 = lkv_bits_loadu(r0 + d), x1 = lkv_bits_loadu(r1 + d);
                else x0 = lkv_bits_load16(r0 + d, c->E - d), x1 = lkv_bits_load16(r1 + d, c->E - d);
                lkv_zip16(x0, x1, &zl, &zh);
                lkv_bits_storeu(Vp + jp * V2s + d, zl);
                lkv_bits_storeu(Vp + jp * V2s + d + LKV_W, zh);
            }
        }
        if (small) {
            int64_t Dlq = c->Dlq;
            if (ds) { /* per tile its P16, 2 x 4 vectors of dims (Dlq = Dl) */
                for (int64_t d0 = 0; d0 < Dlq; d0 += 4 * LKV_W)
                    for (int64_t r0 = 0; r0 < Rq; r0 += 4)
                        pv16_small(nbp / 2, P16 + d0 / LK_DS_TILE * (KB / 2) * Rp + r0, Rp, Vp + d0, V2s, O + r0 * Dlq + d0,
                                   Dlq, 4, first, alpha + r0);
                continue;
            }
            for (int64_t d0 = 0; d0 < Dlq; d0 += 6 * LKV_W) {
                int64_t nv = min64(6, (Dlq - d0) / LKV_W); /* 6, 4 or 2: Dlq is a multiple of 2W */
                for (int64_t r0 = 0; r0 < Rq; r0 += 4) {
                    float *C = O + r0 * Dlq + d0;
                    const uint32_t *pw = P16 + r0, *vp = Vp + d0;
                    if (nv == 6) pv16_small(nbp / 2, pw, Rp, vp, V2s, C, Dlq, 6, first, alpha + r0);
                    else if (nv == 4) pv16_small(nbp / 2, pw, Rp, vp, V2s, C, Dlq, 4, first, alpha + r0);
                    else pv16_small(nbp / 2, pw, Rp, vp, V2s, C, Dlq, 2, first, alpha + r0);
                }
            }
            continue;
        }
        for (int64_t p0 = 0; p0 < Rp; p0 += PW) {
            int two = Rp - p0 >= PW;
            for (int64_t m0 = 0; !ds && m0 < Dlp; m0 += MR) pv_rows(nbp / 2, Vp + m0, V2, P16 + p0, Rp, O + m0 * Rp + p0, first, two, alpha + p0, MR);
            /* ds (Dlp = Dl): blocks of MR dims inside each tile, its P16; the last LK_DS_TILE % MR */
            for (int64_t m0 = 0; ds && m0 < Dlp; m0 += MR) {
                int64_t g = m0 / LK_DS_TILE, end = (g + 1) * LK_DS_TILE;
                const uint32_t *Pg = P16 + g * (KB / 2) * Rp + p0;
                if (m0 + MR <= end) pv_rows(nbp / 2, Vp + m0, V2, Pg, Rp, O + m0 * Rp + p0, first, two, alpha + p0, MR);
                else pv_rows(nbp / 2, Vp + m0, V2, Pg, Rp, O + m0 * Rp + p0, first, two, alpha + p0, LK_DS_TILE % MR), m0 = end - MR;
            }
        }
    }
}
#endif

#if defined(LKV_AMX)
/* ---- the AMX path (AMX-TILE + AMX-BF16), for the bf16 path's inputs, any R ----
 * Tiles of 16 rows x 64 bytes (palette 1); TDPBF16PS: C[16][16] f32 += sum over 16 pairs
 * k of A[i][2k] B[k][j][0] + A[i][2k + 1] B[k][j][1]. Blocks of KA keys:
 *   Qa  [Rp/16][E2a][16] words  q[b]'s bf16 pairs, panels of 16 rows (load_q16): B tiles
 *                        of 16 pairs x 16 rows
 *   S   [KA][Rp] f32     C tiles of 16 keys x 16 rows: A = 16 entries x 32 dims, read in
 *                        place from a bf16 ND one-buffer cache (a full block whose 16-key
 *                        groups each lie in one page), else from the Kb copy
 *                        (load_block16: pages, NZ, two buffers, fp8 widened); B = Qa;
 *                        then softmax_block as the other paths
 *   Pe, Po [Rp][KA] words  P rounded to bf16 in the low (Pe) or high (Po) half of a word,
 *                        the other half 0, rows row-major (16 x 16 word transposes)
 *   O   [Rp][Dlo] f32    row-major, each 32 dims stored as their 16 even then 16 odd dims
 *                        (perm32; finalize puts them back): with the entries' rows as B
 *                        tiles in place (16 keys x 32 dims = 16 pairs of dims), A = Pe
 *                        gives the even dims of a 32-dim chunk, A = Po the odd ones; no
 *                        re-layout of V, two tile products per chunk instead of one
 * fp8 caches with Dl a multiple of 64 (E64 > 0): Kb's rows hold positions, not dims, in
 * [0, E64): each group of 64 as lkv_f8_to_bf16_x2 leaves it (2 shuffles per 32 codes
 * instead of 3 in order); Qa's rows are gathered in the same order (load_q16), so S is
 * unchanged, and "dims" of O above are positions, put back by finalize (x2_dim).
 * Rows whose alpha is not 1 are rescaled in O in place before the block's products; O's
 * tiles (4 per 64 dims) stay in tile registers over the block's keys. The tile
 * configuration is loaded per chunk and released at its end (the tile state is the
 * calling thread's and left initialised). */
#define KA 256

static void amx_config(void) {
    lkv_amx_cfg cfg;
    lkv_amx_cfg_init(&cfg);
    lkv_amx_load_config(&cfg);
}

/* S[16 kg ..][16 g ..] for key groups kg, kg + 1 (A rows at ka[k] + t 64 bytes, kst[k]
 * bytes apart) and row panels g (and g + 1 when two): TE dim tiles of 32 */
static void qk_tiles(const char *const *ka, const int64_t *kst, const uint32_t *Qa, int64_t E2a, int64_t TE, int two,
                     float *S, int64_t Rp) {
    _tile_zero(0);
    _tile_zero(1);
    if (two) {
        _tile_zero(2);
        _tile_zero(3);
    }
    const uint32_t *q1 = Qa + 16 * E2a;
    for (int64_t t = 0; t < TE; t++) {
        _tile_loadd(4, ka[0] + t * 64, kst[0]);
        _tile_loadd(5, ka[1] + t * 64, kst[1]);
        _tile_loadd(6, Qa + t * 256, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 5, 6);
        if (two) {
            _tile_loadd(7, q1 + t * 256, 64);
            _tile_dpbf16ps(2, 4, 7);
            _tile_dpbf16ps(3, 5, 7);
        }
    }
    _tile_stored(0, S, Rp * 4);
    _tile_stored(1, S + 16 * Rp, Rp * 4);
    if (two) {
        _tile_stored(2, S + 16, Rp * 4);
        _tile_stored(3, S + 16 * Rp + 16, Rp * 4);
    }
}

/* O[16 rows][d0, d0 + 32 nc) (nc 1 or 2 chunks of 32 dims in perm32 order, rows ldo floats
 * apart) = (first ? 0 : O) + sum over the key groups kg < KG of Pe / Po . V, V's rows of
 * group kg at va[kg] + d0 (bf16 elements), vst[kg] bytes apart */
static void pv_tiles(const uint32_t *Pe, const uint32_t *Po, int64_t PA, const char *const *va, const int64_t *vst,
                     int64_t d0, int64_t KG, float *O, int64_t ldo, int nc, int first) {
    if (first) {
        _tile_zero(0);
        _tile_zero(1);
        if (nc > 1) {
            _tile_zero(2);
            _tile_zero(3);
        }
    } else {
        _tile_loadd(0, O, ldo * 4);
        _tile_loadd(1, O + 16, ldo * 4);
        if (nc > 1) {
            _tile_loadd(2, O + 32, ldo * 4);
            _tile_loadd(3, O + 48, ldo * 4);
        }
    }
    for (int64_t kg = 0; kg < KG; kg++) {
        const char *v = va[kg] + d0 * 2;
        _tile_loadd(4, Pe + kg * 16, PA * 4);
        _tile_loadd(5, Po + kg * 16, PA * 4);
        _tile_loadd(6, v, vst[kg]);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 5, 6);
        if (nc > 1) {
            _tile_loadd(7, v + 64, vst[kg]);
            _tile_dpbf16ps(2, 4, 7);
            _tile_dpbf16ps(3, 5, 7);
        }
    }
    _tile_stored(0, O, ldo * 4);
    _tile_stored(1, O + 16, ldo * 4);
    if (nc > 1) {
        _tile_stored(2, O + 32, ldo * 4);
        _tile_stored(3, O + 48, ldo * 4);
    }
}

/* any inf or NaN among the first n rows of S [.][Rp] (Rp a multiple of 16) */
static int scores_nonfinite(const float *S, int64_t n, int64_t Rp) {
    __mmask16 any = 0;
    for (int64_t i = 0; i < n * Rp; i += 16) any |= _mm512_fpclass_ps_mask(_mm512_loadu_ps(S + i), 0x99); /* NaN, +-inf */
    return any != 0;
}

LK_ALWAYS_INLINE void run_chunk_amx(const dec_ctx *c, int64_t b, int64_t k0, int64_t k1, float *scr, float *m, float *l,
                                    float *O) {
    const lk_mla_decode_args *a = c->a;
    int64_t E = c->E, E2a = c->E2a, L16 = c->L16, Dlq = c->Dlq, Dlo = c->Dlo, R = c->R, Rp = c->Rp;
    int64_t TE = E2a / 16;
    uint32_t *Qa = (uint32_t *)scr;                  // [Rp/16][E2a][16] words
    uint16_t *Kb = (uint16_t *)(Qa + Rp * E2a);      // [KA][L16] bf16
    float *S = (float *)(Kb + KA * L16);             // [KA][Rp]
    uint32_t *Pe = (uint32_t *)(S + KA * Rp);        // [Rp][KA] words
    uint32_t *Po = Pe + Rp * KA;                     // [Rp][KA] words
    float *alpha = (float *)(Po + Rp * KA);          // [Rp]
    float *lim = alpha + Rp;                         // [Rp]
    const int64_t *Lr = (const int64_t *)(lim + Rp); // [Rp]
    load_q16(c, b, Qa, 16, E2a);
    for (int64_t jj = 0; jj < KA && L16 > E; jj++) memset(Kb + jj * L16 + E, 0, sizeof(uint16_t) * (size_t)(L16 - E));
    const lk_paged *lat = &a->lat;
    int direct = a->one_buffer && lat->layout == LK_KV_ND && lat->dtype == LK_BF16 && E % 32 == 0 &&
                 lat->block_size % 16 == 0;
    const int32_t *tab = a->table + b * a->max_pages;
    const char *ka[KA / 16];
    int64_t kst[KA / 16];
    amx_config();
    for (int64_t j0 = k0; j0 < k1; j0 += KA) {
        int first = j0 == k0;
        int64_t nb = min64(KA, k1 - j0), nbp = rup(nb, 32);
        block_limits(Lr, R, Rp, j0, nb, lim);
        int in_place = direct && nb == KA && j0 % 16 == 0;
        if (in_place) {
            for (int64_t g = 0; g < KA / 16; g++) {
                int64_t j = j0 + 16 * g;
                ka[g] = (const char *)((const uint16_t *)lat->data +
                                       lk_paged_off(lat, tab[j / lat->block_size], j % lat->block_size, 0, 0));
                kst[g] = lat->s1 * 2;
            }
        } else {
            load_block16(c, b, j0, nb, nbp, Kb, NULL);
            for (int64_t g = 0; g < nbp / 16; g++) ka[g] = (const char *)(Kb + 16 * g * L16), kst[g] = L16 * 2;
        }
        /* S = K . Qa^T, 32 keys x 32 rows per call; the next block into L2 meanwhile */
        for (int64_t kg = 0; kg < nbp / 16; kg += 2) {
            prefetch_keys(c, b, j0 + KA + 8 * kg, 16, k1);
            for (int64_t g = 0; g < Rp / 16; g += 2)
                qk_tiles(ka + kg, kst + kg, Qa + g * 16 * E2a, E2a, TE, g + 1 < Rp / 16, S + kg * 16 * Rp + g * 16, Rp);
        }
        /* an inf or NaN in an entry (V is part of K: every row's score of that key is then
         * inf or NaN, q . e summing an infinite product) takes the row-by-row products over
         * the visible keys instead: in the tile products P's zero half would meet the
         * neighbouring dim's inf. Overflowing scores take it too (exact, slower). */
        int nonfinite = scores_nonfinite(S, nb, Rp);
        softmax_block(S, Rp, nbp, lim, a->scale * c->kmul, m, l, alpha);
        if (nonfinite) {
            if (in_place) load_block16(c, b, j0, nb, nbp, Kb, NULL);
            pv_visible_only(S, Rp, lim, NULL, Kb, L16, Dlq, first, alpha, O, 1, Dlo, 1, NULL, 0);
            continue;
        }
        /* Pe, Po: 16 keys x 16 rows at a time, transposed */
        for (int64_t kg = 0; kg < nbp / 16; kg++)
            for (int64_t g = 0; g < Rp; g += 16) {
                lkv_f32 v[16];
                for (int i = 0; i < 16; i++) v[i] = lkv_as_f32(lkv_bf16_bits(lkv_loadu(S + (16 * kg + i) * Rp + g)));
                lkv_transpose(v);
                for (int i = 0; i < 16; i++) {
                    lkv_bits_storeu(Pe + (g + i) * KA + 16 * kg, lkv_as_i32(v[i]));
                    lkv_bits_storeu(Po + (g + i) * KA + 16 * kg, lkv_i32_slli(lkv_as_i32(v[i]), 16));
                }
            }
        /* O: rows whose maximum moved rescaled, then += P . V */
        for (int64_t r = 0; !first && r < R; r++) {
            if (alpha[r] == 1.0f) continue;
            lkv_f32 al = lkv_set1(alpha[r]);
            for (int64_t d = 0; d < Dlq; d += 16) lkv_storeu(O + r * Dlo + d, lkv_mul(lkv_loadu(O + r * Dlo + d), al));
        }
        for (int64_t g = 0; g < Rp; g += 16)
            for (int64_t d0 = 0; d0 < Dlq; d0 += 64)
                pv_tiles(Pe + g * KA, Po + g * KA, KA, ka, kst, d0, nbp / 16, O + g * Dlo + d0, Dlo, Dlq - d0 >= 64 ? 2 : 1,
                         first);
    }
    _tile_release();
}
#endif

/* out[b] = O / l (rows transposed back; +0 where l = 0), lse[b] = m + log l */
static void finalize(const dec_ctx *c, int64_t b, const float *m, const float *l, const float *O) {
    const lk_mla_decode_args *a = c->a;
    const lk_tensor *o = &a->out;
    int64_t R = c->R, Rp = c->Rp, H = a->H, Dl = a->Dl, es = lk_esize(o->dtype);
    for (int64_t r = 0; c->rowo && r < R; r++) { /* O row-major [Rp][Dlo] */
        char *dst = (char *)o->data + (b * o->stride[0] + (r / H) * o->stride[1] + (r % H) * o->stride[2]) * es;
        lkv_f32 inv = lkv_set1(l[r] == 0.0f ? 0.0f : lk_softmax_inv(l[r]) * c->kmul);
#if defined(LKV_AMX)
        /* a chunk of the AMX path's O back in dim order: 32 positions (perm32), or with
         * E64 a group of 64 (Dl a multiple of 64: every group whole) */
        float un[64];
        int64_t g = c->E64 ? 64 : 32;
#endif
        for (int64_t d0 = 0; d0 < Dl; d0 += LKV_W) {
            const float *src = O + r * c->Dlo + d0;
#if defined(LKV_AMX)
            if (c->amx && d0 % g == 0) {
                for (int i = 0; i < g; i++) un[g == 64 ? x2_dim(i) : i] = src[perm32(i)];
            }
            if (c->amx) src = un + d0 % g;
#endif
            lkv_f32 x = l[r] == 0.0f ? lkv_zero() : lkv_mul(lkv_loadu(src), inv);
            if (Dl - d0 >= LKV_W) lkv_store(dst + d0 * es, o->dtype, x);
            else lkv_store_part(dst + d0 * es, o->dtype, x, Dl - d0);
        }
    }
    for (int64_t r0 = 0; !c->rowo && r0 < R; r0 += LKV_W) {
        for (int64_t d0 = 0; d0 < Dl; d0 += LKV_W) {
            lkv_f32 v[LKV_W];
            for (int k = 0; k < LKV_W; k++) v[k] = lkv_loadu(O + (d0 + k) * Rp + r0);
            lkv_transpose(v);
            int64_t n = min64(LKV_W, Dl - d0);
            for (int64_t i = 0; i < LKV_W && r0 + i < R; i++) {
                int64_t r = r0 + i;
                char *dst = (char *)o->data + (b * o->stride[0] + (r / H) * o->stride[1] + (r % H) * o->stride[2] + d0) * es;
                lkv_f32 x = l[r] == 0.0f ? lkv_zero() : lkv_mul(v[i], lkv_set1(lk_softmax_inv(l[r]) * c->kmul));
                if (n == LKV_W) lkv_store(dst, o->dtype, x);
                else lkv_store_part(dst, o->dtype, x, n);
            }
        }
    }
    if (a->has_lse)
        for (int64_t r = 0; r < R; r++) {
            lk_online_state s = {m[r], l[r]};
            ((float *)a->lse.data)[b * a->lse.stride[0] + (r % H) * a->lse.stride[1] + (r / H) * a->lse.stride[2]] =
                lk_online_lse(s);
        }
}

#if defined(LKV_BF16DOT)
/* fp8_ds_mla records on the bf16 path, compiled apart: inlined into chunk_unit they cost
 * the bf16 cache's small-R decode ~6 % there (same run, B=8 x 4096 keys, 16 heads) */
static __attribute__((noinline)) void run_chunk16_ds(const dec_ctx *c, int64_t b, int64_t k0, int64_t k1, float *scr,
                                                     float *m, float *l, float *O) {
    if (c->small) run_chunk16(c, b, k0, k1, scr, m, l, O, 1, 1);
    else run_chunk16(c, b, k0, k1, scr, m, l, O, 0, 1);
}
#endif

static void chunk_unit(void *vctx, int64_t u, int tid) {
    dec_ctx *c = vctx;
    const lk_mla_decode_args *a = c->a;
    int64_t b = c->unit_b[u], k = c->unit_k[u], n = a->seqlens[b];
    int64_t k0 = k * a->split, k1 = min64(n, k0 + a->split);
    float *scr = c->scratch + (size_t)tid * (size_t)c->scratch_floats, *m, *l, *O;
    if (c->nsplit[b] > 1) {
        m = c->st + (size_t)(c->slot0[b] + k) * (size_t)c->slot_floats;
    } else {
        m = scr + c->scratch_floats - c->slot_floats;
    }
    l = m + c->Rp, O = l + c->Rp;
    /* the rows' causal limits (keys < Lr), after the path's buffers (see scratch_of) */
    int64_t *Lr = (int64_t *)(scr + c->scratch_floats - c->slot_floats - 2 * c->Rp);
    for (int64_t r = 0; r < c->Rp; r++) {
        m[r] = -INFINITY, l[r] = 0.0f;
        Lr[r] = r < c->R ? lk_mla_dec_limit(a, b, r / a->H) : 0;
    }
    lk_dtype lt = a->lat.dtype, rt = a->rope.dtype;
    if (k1 <= k0) memset(O, 0, sizeof(float) * (size_t)(c->slot_floats - 2 * c->Rp));
#if defined(LKV_AMX)
    else if (c->amx) run_chunk_amx(c, b, k0, k1, scr, m, l, O);
#endif
#if defined(LKV_BF16DOT)
    else if (c->bf16 && a->ds) run_chunk16_ds(c, b, k0, k1, scr, m, l, O);
    else if (c->bf16 && c->small) run_chunk16(c, b, k0, k1, scr, m, l, O, 1, 0);
    else if (c->bf16) run_chunk16(c, b, k0, k1, scr, m, l, O, 0, 0);
#endif
    else if (lt == LK_BF16 && rt == LK_BF16) run_chunk(c, b, k0, k1, scr, m, l, O, LK_BF16, LK_BF16);
    else if (lt == LK_F16 && rt == LK_F16) run_chunk(c, b, k0, k1, scr, m, l, O, LK_F16, LK_F16);
    else if (lt == LK_F32 && rt == LK_F32) run_chunk(c, b, k0, k1, scr, m, l, O, LK_F32, LK_F32);
    else if (a->ds) run_chunk(c, b, k0, k1, scr, m, l, O, LK_F8E4M3, LK_BF16); /* fp8_ds_mla records */
    else if (lt == LK_F8E4M3) run_chunk(c, b, k0, k1, scr, m, l, O, LK_F8E4M3, LK_F8E4M3); /* rt == lt */
    else if (lt == LK_F8E5M2) run_chunk(c, b, k0, k1, scr, m, l, O, LK_F8E5M2, LK_F8E5M2);
    else run_chunk(c, b, k0, k1, scr, m, l, O, lt, rt);
    if (c->nsplit[b] == 1) finalize(c, b, m, l, O);
}

/* requests [b0, b1): fold chunks 1 .. ns - 1 into chunk 0 in order, then the output */
static void merge_range(void *vctx, int64_t b0, int64_t b1) {
    dec_ctx *c = vctx;
    int64_t Rp = c->Rp, Dlp = c->Dlp;
    float al[LKV_W], w[LKV_W];
    for (int64_t b = b0; b < b1; b++) {
        if (c->nsplit[b] < 2) continue;
        float *m = c->st + (size_t)c->slot0[b] * (size_t)c->slot_floats, *l = m + Rp, *O = l + Rp;
        for (int64_t k = 1; k < c->nsplit[b]; k++) {
            const float *mk_ = m + k * c->slot_floats, *lk = mk_ + Rp, *Ok = lk + Rp;
            for (int64_t v = 0; v < Rp; v += LKV_W) {
                for (int i = 0; i < LKV_W; i++) {
                    lk_online_state acc = {m[v + i], l[v + i]}, sk = {mk_[v + i], lk[v + i]};
                    al[i] = lk_online_rescale(&acc, sk.m);
                    w[i] = sk.l == 0.0f ? 0.0f : expf(lk_online_shift(sk.m) - lk_online_shift(acc.m));
                    lk_online_add(&acc, sk.l * w[i]);
                    m[v + i] = acc.m, l[v + i] = acc.l;
                }
                if (c->rowo) { /* O row-major [Rp][Dlo]: the same operations per element */
                    for (int i = 0; i < LKV_W; i++)
                        for (int64_t d = 0; d < c->Dlq; d += LKV_W) {
                            float *o = O + (v + i) * c->Dlo + d;
                            lkv_storeu(o, lkv_fma(lkv_set1(w[i]), lkv_loadu(Ok + (v + i) * c->Dlo + d),
                                                  lkv_mul(lkv_set1(al[i]), lkv_loadu(o))));
                        }
                    continue;
                }
                lkv_f32 va = lkv_loadu(al), vw = lkv_loadu(w);
                for (int64_t d = 0; d < Dlp; d++)
                    lkv_storeu(O + d * Rp + v, lkv_fma(vw, lkv_loadu(Ok + d * Rp + v), lkv_mul(va, lkv_loadu(O + d * Rp + v))));
            }
        }
        finalize(c, b, m, l, O);
    }
}

/* ------------------------------------------------------------------ driver */

static int simd_layout_ok(const lk_mla_decode_args *a) {
    if (a->q.stride[3] != 1 && a->q.shape[3] > 1) return 0;
    if (a->out.stride[3] != 1 && a->out.shape[3] > 1) return 0;
    if (a->lat.s3 != 1 && a->lat.D > 1) return 0;
    if (!a->one_buffer && a->rope.s3 != 1 && a->rope.D > 1) return 0;
    return 1;
}

static lk_status mla_decode(const lk_mla_decode_args *a) {
    if (!simd_layout_ok(a)) return lk_ref_mla_decode(a);
    dec_ctx c;
    memset(&c, 0, sizeof c);
    c.a = a;
    c.E = a->Dl + a->Dr;
    c.R = a->s_q * a->H;
    c.Rp = rup(c.R, LKV_W);
    c.Dlp = rup(rup(a->Dl, LKV_W), MR);
    c.Ep = rup(c.E > c.Dlp ? c.E : c.Dlp, LKV_W);
    c.slot_floats = (2 + c.Dlp) * c.Rp;
    /* f32 path: Qt, Kf, S, alpha, lim; then Lr (int64: 2 floats each), one state for
     * 1-chunk units */
    c.scratch_floats = c.E * c.Rp + KB * c.Ep + KB * c.Rp + 2 * c.Rp;
#if defined(LKV_BF16DOT)
    c.bf16 = a->q.dtype == LK_BF16 && a->out.dtype == LK_BF16 &&
             ((a->lat.dtype == LK_BF16 && a->rope.dtype == LK_BF16) || lk_is_fp8(a->lat.dtype));
#if defined(LKV_AMX)
    c.bf16 = c.bf16 && !a->ds; /* fp8_ds_mla records: the f32 path (no per-tile scales in the tiles) */
#else
    /* f32 FMAs where the dot products run at half their rate (lk_cpu_prefer_fma: Emerald
     * Rapids, same run, avx512bf16 against avx512: B=8 1x4096 128 heads 59.2 against 34.5
     * ms; 2x4096 16 heads 17.6 against 12.7); the amx row keeps its tiles */
    c.bf16 = c.bf16 && !lk_cpu_prefer_fma();
#endif
    if (c.bf16) { /* Qb, Kb, S, P16, Vp, alpha, lim (4-byte units) */
        if (a->ds) c.Dlp = a->Dl, c.slot_floats = (2 + c.Dlp) * c.Rp; /* O's dims: whole tiles */
        c.E2 = (c.E + 1) / 2;
        c.L16 = rup(c.E > c.Dlp ? c.E : c.Dlp, 2 * LKV_W);
        c.V2 = rup(c.Dlp, 2 * LKV_W);
        c.scratch_floats = c.E2 * c.Rp + KB * c.L16 / 2 + KB * c.Rp + KB / 2 * c.Rp + KB / 2 * c.V2 + 2 * c.Rp;
        c.small = c.R <= LKV_W;
        if (c.small) { /* Qs, Kb, S, P16, Vp (rows V2s apart), alpha, lim; O [Rp][Dlq] */
            c.Dlq = rup(a->Dl, 2 * LKV_W);
            c.V2s = c.Dlq + LKV_W;
            c.Dlo = c.Dlq;
            c.scratch_floats = c.Rp * c.L16 / 2 + (KB + 1) * c.L16 / 2 + KB * c.Rp + KB / 2 * c.Rp + KB / 2 * c.V2s + 2 * c.Rp;
            if (c.Dlq > c.Dlp) c.slot_floats = (2 + c.Dlq) * c.Rp;
        }
        if (a->ds) /* a P16 per tile, Ks */
            c.scratch_floats += (a->Dl / LK_DS_TILE - 1) * (KB / 2) * c.Rp + KB * (a->Dl / LK_DS_TILE);
#if defined(LKV_AMX)
        /* Qa, Kb, S, Pe, Po, alpha, lim; O [Rp][Dlo] (dims in perm32 order) */
        c.amx = 1, c.small = 0;
        c.E2a = 16 * ((c.E + 31) / 32);
        c.E64 = lk_is_fp8(a->lat.dtype) && a->Dl % 64 == 0 ? c.E / 64 * 64 : 0;
        c.Dlq = rup(a->Dl, 32);
        c.Dlo = c.Dlq + 16;
        c.scratch_floats = c.Rp * c.E2a + KA * c.L16 / 2 + KA * c.Rp + 2 * c.Rp * KA + 2 * c.Rp;
        c.slot_floats = (2 + (c.Dlo > c.Dlp ? c.Dlo : c.Dlp)) * c.Rp;
#endif
        c.rowo = c.small || c.amx;
    }
#endif
    c.scratch_floats += 2 * c.Rp + c.slot_floats;
    c.kmul = a->kscale;
#if defined(F8_RAW)
    if (!c.bf16 && a->lat.dtype == LK_F8E4M3 && !a->ds) c.kmul *= 256.0f; /* run_chunk's Kf: e4m3 / 256 */
#endif
    /* the buffers 64-byte aligned: every part above is a multiple of W floats (Rp, Ep,
     * L16 / 2, V2, V2s, E2a are), so on AVX-512 every buffer starts on a cache line (tile
     * rows and vectors that do not straddle lines) */
    int64_t B = a->B, n_units = 0, slots = 0;
    c.nsplit = malloc(sizeof(int64_t) * (size_t)(2 * B + 1));
    if (!c.nsplit) return LK_ERR_NOMEM;
    c.slot0 = c.nsplit + B;
    for (int64_t b = 0; b < B; b++) {
        int64_t ns = a->seqlens[b] / a->split + (a->seqlens[b] % a->split != 0); /* no overflow at any split */
        c.nsplit[b] = ns < 1 ? 1 : ns;
        c.slot0[b] = c.nsplit[b] > 1 ? slots : -1;
        if (c.nsplit[b] > 1) slots += c.nsplit[b];
        n_units += c.nsplit[b];
    }
    int nt = lk_plan_units(n_units);
    c.unit_b = malloc(sizeof(int64_t) * (size_t)(2 * n_units));
    void *st_mem = NULL, *scr_mem = NULL;
    if (posix_memalign(&st_mem, 64, sizeof(float) * (size_t)(slots * c.slot_floats + 16))) st_mem = NULL;
    if (posix_memalign(&scr_mem, 64, sizeof(float) * (size_t)(nt * c.scratch_floats))) scr_mem = NULL;
    c.st = st_mem, c.scratch = scr_mem;
    lk_status st = LK_ERR_NOMEM;
    if (c.unit_b && c.st && c.scratch) {
        c.unit_k = c.unit_b + n_units;
        int64_t u = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t k = 0; k < c.nsplit[b]; k++) c.unit_b[u] = b, c.unit_k[u] = k, u++;
        lk_parallel_units(n_units, nt, chunk_unit, &c);
        if (slots) lk_parallel_for(B, (int64_t)sizeof(float) * slots * c.slot_floats / (B > 0 ? B : 1), merge_range, &c);
        st = LK_OK;
    }
    free(c.nsplit), free(c.unit_b), free(c.st), free(c.scratch);
    return st;
}

void LKV_FN(register_mla_decode)(lk_kernel_table *t) { t->mla_decode = mla_decode; }
