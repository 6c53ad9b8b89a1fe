/*
 * flash_attn_varlen, every vector ISA (src/cpu/vec/lkv.h, W lanes): tiled flash attention
 * with online softmax.
 *
 * Maths (per request b, query i, query head h, KV head kh = h / G, G = Hq / Hk):
 *   s_j = scale * q_i . k_j (softcap: c * tanh(s / c)), keys j in i's window;
 *   with ALiBi slopes s_j -= slope * |i + k_len - q_len - j| (lk_attn_alibi_add);
 *   out_i = sum_j exp(s_j - m) v_j / l,  l = sum_j exp(s_j - m),  lse = m + log(l).
 *
 * Prefill path, unit = (request, KV head, query tile). A query tile holds `qt` tokens
 * times the G query heads of the KV head, M = qt * G rows (r = t * G + g), so one K/V
 * tile converted to f32 serves every row of the tile and every head of the GQA group.
 * For each key tile of KB keys that some row of the unit can see:
 *   Kt  [KB/PW][Dqk][PW]  K tile transposed into PW-key panels (W x W register transposes)
 *   Vp  [Dvp/PW][KB][PW]  V tile in PW-dim panels
 *   S   [Mp][KB] = Qs [Mp][Dqk] . Kt      (MR x PW register-blocked FMA micro-kernel)
 *   with PW = 2W panels and MR = LKV_MR rows (AVX2 6 x 16: 12 of 16 ymm accumulators;
 *   AVX-512 12 x 32: 24 of 32 zmm, 14 loads per 24 FMAs)
 *   boundary tiles are masked by index (fully hidden tiles are never visited, fully
 *   visible ones are not masked), online softmax per row (running max m, sum l, O
 *   rescaled by exp(m_old - m_new)), then O [Mp][Dvp] += P . Vp (same micro-kernel).
 * The scale is folded into Qs. exp is the polynomial lkv_exp.
 *
 * Decode path (queries that are few compared to keys): unit = (request, key chunk of
 * DECODE_CHUNK keys), every head of the request at once, walking the chunk's keys in
 * memory order (slot-major within a page, heads inside), so a paged cache is read as
 * the contiguous pages it is. Keys go in blocks of DB: the block's scores for all heads,
 * one online-softmax update per head, then P.V four keys per pass over O. The G query
 * heads of a KV head go four at a time (dot_rows4 / axpy4_rows4: each K and V row loaded
 * and converted once for the four, the same sums per head as one at a time); on the
 * AVX512_BF16 build with bf16 q and k the scores come from bf16 pairs (dot16_rows, the
 * scale applied to the score; four heads' sums reduced side by side by lkv_hsum4, the
 * same additions as one at a time), and with bf16 v and out, when the query heads per
 * KV head are a multiple of 4, P is rounded to bf16 and P.V runs on bf16 pairs too
 * (pv16_rows: two keys' V rows zipped into pairs of one dim,
 * the block's sum kept in registers and added to O once), as the prefill's pv16 path;
 * else P stays f32. The common GQA shape (4 query heads per KV head x 128 dims, bf16 / fp8
 * K and V, bf16 out, no softcap or ALiBi) has its own block loop (decode_row_g4): scores
 * stored key-major and the online softmax run over 16 heads per vector (no horizontal
 * max / sum / scalar exp per head and block), fp8 K scored two keys per vector and eight
 * keys per pass (no horizontal sum per key), the rescale folded into P.V's add to O, V
 * rows paired by in-lane unpacks (fp8: 64 codes widened at a time), the next block's K
 * rows prefetched into L2 while scoring and its V rows during P.V (two per key pair, so
 * the prefetches spread over the block). On AVX2 and AVX-512 the same shape on f32 FMAs
 * (on AVX512_BF16 builds only for fp8 K / V that no bf16 loop takes, or for every dtype
 * where lk_cpu_prefer_fma: Intel, whose VDPBF16PS runs at half the FMAs' rate; the
 * prefill tiles then stay f32 too) covers any GQA group
 * (heads of a KV head in groups of 4, then 2, then 1), head dims multiples of 2W, any K /
 * V dtype (decode_row_g4f: K / V converted once per group, fp8 through f16 words with
 * e4m3 read as value / 256, P kept in f32; AVX-512 with 4 heads: two keys per pass in the
 * scores and 64 dims per pass in P.V, 16 FMA chains); with one head per KV head only for fp8.
 * The AMX build runs fp8 K / V with a bf16 out on tile products instead, groups of 3 to
 * 16 heads (decode_row_amx, below decode_row_g4). Elsewhere, while a block is scored the next
 * block's K and V rows are prefetched into L2. The prefetch runs past the chunk's end
 * (pf_hi: the row's last key), and units go to threads in runs of consecutive chunks
 * (lk_parallel_runs), so a chunk's first block is mostly prefetched too. Each unit
 * leaves per-(query, head) partial states (m, l, O) which are then combined in chunk
 * order with the attention-state rules. Chunks depend only on the key length, so results
 * do not depend on the thread count.
 *
 * fp8 q / K / V (docs/ops.md, "fp8 q / K / V"): the descales fold into the score scale
 * (qk_scale: scale * q_descale * k_descale per request and KV head) and the output
 * (store_out_row's v_descale); on the AVX512_BF16 build fp8 rows are widened to bf16 in
 * registers (f8_to_bf16) and take the bf16 dot-product paths, elsewhere they are loaded
 * through the vector layer's fp8 -> f32 conversion (AVX2's GQA loop: lkv_load2_f8_raw).
 * fp8 NZ tiles are 32 wide (TILE). An fp8 out (lk_flash_attn_varlen_scaled) is written
 * only by store_out_row (fp8(value / out_scale), lkv_store's fp8 form) and
 * zero_padding_rows (code 0); P stays f32 for it (the bf16 P.V paths need a bf16 out).
 *
 * Layouts served: K/V dims with unit stride (dense, paged ND, paged NZ with head dims
 * a multiple of 16, 32 for fp8), head dims a multiple of 8 (a last partial vector where
 * W = 16); anything else goes to the reference.
 * Threads: units handed out dynamically (lk_parallel_units; decode: lk_parallel_runs)
 * with per-thread scratch allocated up front.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/attn_state.h"
#include "../kernels.h"
#include "../vec/lkv.h"

#define KB 64        /* keys per tile */
#define MR LKV_MR    /* micro-kernel rows */
#define PW (2 * LKV_W) /* panel width: micro-kernel columns */
#define ROWS 60      /* target rows (tokens x group heads) of a query tile */
#define DECODE_CHUNK 512
/* builds with the f32 GQA decode loop (decode_row_g4f): every x86 one (with bf16 dot
 * products, for the fp8 K / V that none of their bf16 loops takes) */
#if defined(LKV_AVX2) || defined(LKV_AVX512)
#define DECODE_G4F 1
#endif

/* ------------------------------------------------------------------ micro-kernel */

/* C[MR][PW] (+)= A[MR][K] . B[K][PW]; A rows lda apart, B packed PW wide, C ldc apart.
 * The loops over the MR rows are unrolled: the 2 MR accumulators live in registers. */
static inline void mk(int64_t K, const float *A, int64_t lda, const float *B, float *C, int64_t ldc,
                      int accumulate) {
    lkv_f32 c0[MR], c1[MR];
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++) {
        c0[r] = accumulate ? lkv_loadu(C + r * ldc) : lkv_zero();
        c1[r] = accumulate ? lkv_loadu(C + r * ldc + LKV_W) : lkv_zero();
    }
    for (int64_t k = 0; k < K; k++) {
        lkv_f32 b0 = lkv_loadu(B + k * PW), b1 = lkv_loadu(B + k * PW + LKV_W);
#pragma GCC unroll 16
        for (int r = 0; r < MR; r++) {
            lkv_f32 a = lkv_set1(A[r * lda + k]);
            c0[r] = lkv_fma(a, b0, c0[r]);
            c1[r] = lkv_fma(a, b1, c1[r]);
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++) {
        lkv_storeu(C + r * ldc, c0[r]);
        lkv_storeu(C + r * ldc + LKV_W, c1[r]);
    }
}

/* ------------------------------------------------------------------ loading */

/* K/V rows are read in tiles of TILE(es) dims, `cs` elements apart: NZ's tiles (16 wide,
 * 32 for 1-byte fp8 caches), cs = s1; an ND row is contiguous, cs = TILE(es). The fp8
 * tile keeps 16 consecutive dims from a multiple of 16 contiguous, as every vector load
 * here needs. */
#define TILE(es) ((es) == 1 ? 32 : 16)

/* element offset of dim d of a K/V row of `es`-byte elements starting at `base` */
static inline int64_t dim_off(int64_t base, int64_t cs, int64_t d, int64_t es) {
    return es == 1 ? base + (d >> 5) * cs + (d & 31) : base + (d >> 4) * cs + (d & 15);
}

/* byte offset of dim d (a multiple of W) of a K/V row of `es`-byte elements */
static inline int64_t chunk_off(int64_t d, int64_t cs, int64_t es) { return dim_off(0, cs, d, es) * es; }

static inline int64_t chunk_stride(const lk_paged *c) {
    return c->layout == LK_KV_NZ ? c->s1 : TILE(lk_esize(c->dtype));
}

/* W dims of a K/V row from element offset off (n < W: the first n, the rest 0) */
static inline lkv_f32 load_at(const lk_paged *c, int64_t off, int64_t n) {
    const char *p = (const char *)c->data + off * lk_esize(c->dtype);
    return n >= LKV_W ? lkv_load(p, c->dtype) : lkv_load_part(p, c->dtype, n);
}

/* marks a tile row past the last key; element offsets of real keys may be negative
 * (negative strides), but never INT64_MIN (lk_check_view bounds them by 2^62) */
#define NO_KEY INT64_MIN

/* Kt[p][d][jj % PW] = K[j0 + jj][d] for jj < kb, 0 for kb <= jj < KB */
static void load_k_tile(const lk_attn_args *a, int64_t b, int64_t kh, int64_t j0, int64_t kb, float *Kt) {
    const lk_paged *c = &a->kc;
    int64_t D = a->Dqk, cs = chunk_stride(c), es = lk_esize(c->dtype);
    for (int64_t g = 0; g < KB; g += LKV_W) {
        int64_t base[LKV_W];
        for (int r = 0; r < LKV_W; r++) base[r] = g + r < kb ? lk_attn_key_off(a, c, b, j0 + g + r, kh, 0) : NO_KEY;
        float *dst = Kt + (g / PW) * D * PW + (g % PW);
        for (int64_t d = 0; d < D; d += LKV_W) {
            int64_t n = D - d < LKV_W ? D - d : LKV_W;
            lkv_f32 rw[LKV_W];
            for (int r = 0; r < LKV_W; r++) rw[r] = base[r] != NO_KEY ? load_at(c, dim_off(base[r], cs, d, es), n) : lkv_zero();
            lkv_transpose(rw);
            for (int k = 0; k < n; k++) lkv_storeu(dst + (d + k) * PW, rw[k]);
        }
    }
}

/* Vp[d / PW][jj][d % PW] = V[j0 + jj][d] (panels `ps` floats apart); zero for jj >= kb
 * and Dv <= d < Dvp */
static void load_v_tile(const lk_attn_args *a, int64_t b, int64_t kh, int64_t j0, int64_t kb, int64_t Dvp,
                        int64_t ps, float *Vp) {
    const lk_paged *c = &a->vc;
    int64_t D = a->Dv, cs = chunk_stride(c), es = lk_esize(c->dtype);
    for (int64_t jj = 0; jj < KB; jj++) {
        int64_t base = jj < kb ? lk_attn_key_off(a, c, b, j0 + jj, kh, 0) : NO_KEY;
        for (int64_t d = 0; d < Dvp; d += LKV_W) {
            lkv_f32 v = base != NO_KEY && d < D ? load_at(c, dim_off(base, cs, d, es), D - d) : lkv_zero();
            lkv_storeu(Vp + (d / PW) * ps + jj * PW + (d % PW), v);
        }
    }
}

/* the score scale of request b, KV head kh: scale * q_descale * k_descale (1 for
 * tensors that are not fp8) */
static inline float qk_scale(const lk_attn_args *a, int64_t b, int64_t kh) {
    return a->scale * lk_attn_desc(&a->qd, b, kh) * lk_attn_desc(&a->kd, b, kh);
}

/* Qs[r][d] = scale * q[token, head, d] */
static void load_q_row(const lk_attn_args *a, int64_t t, int64_t h, float scale, float *dst) {
    const lk_tensor *q = &a->q;
    int64_t off = t * q->stride[0] + h * q->stride[1], D = a->Dqk;
    lkv_f32 sc = lkv_set1(scale);
    if (q->stride[2] == 1) {
        int64_t es = lk_esize(q->dtype);
        const char *p = (const char *)q->data + off * es;
        int64_t d = 0;
        for (; d + LKV_W <= D; d += LKV_W) lkv_storeu(dst + d, lkv_mul(sc, lkv_load(p + d * es, q->dtype)));
        for (; d < D; d++) dst[d] = scale * lk_load_f(p, q->dtype, d);
    } else {
        for (int64_t d = 0; d < D; d++) dst[d] = scale * lk_load_f(q->data, q->dtype, off + d * q->stride[2]);
    }
}

/* out[t, h] = vd * o / l (vd: the v_descale of the row's request and KV head); an fp8
 * out (lk_flash_attn_varlen_scaled) gets fp8(that f32 value / out_scale): one f32
 * division, then the vector layer's fp8 store (bit for bit src/core/fp8.h's converter,
 * which the scalar tail and strided rows use) */
static void store_out_row(const lk_attn_args *a, int64_t t, int64_t h, const float *o,
                          lk_online_state st, float vd) {
    const lk_tensor *out = &a->out;
    float inv = lk_softmax_inv(st.l) * vd;
    /* every visible score -inf (l = 0): zeros, never NaN, even where a zero weight met an
     * infinite V value in the accumulator (0 * inf) */
    lkv_m keep = lkv_m_first(st.l == 0.0f ? 0 : LKV_W);
    int64_t off = t * out->stride[0] + h * out->stride[1], D = a->Dv;
    if (lk_is_fp8(out->dtype)) {
        float os = a->out_scale;
        if (out->stride[2] == 1) {
            char *p = (char *)out->data + off; /* 1-byte elements */
            lkv_f32 vi = lkv_set1(inv), vs = lkv_set1(os);
            int64_t d = 0;
            for (; d + LKV_W <= D; d += LKV_W)
                lkv_store(p + d, out->dtype, lkv_div(lkv_maskz(keep, lkv_mul(lkv_loadu(o + d), vi)), vs));
            for (; d < D; d++) lk_store_f(p, out->dtype, d, (st.l == 0.0f ? 0.0f : o[d] * inv) / os);
        } else {
            for (int64_t d = 0; d < D; d++)
                lk_store_f(out->data, out->dtype, off + d * out->stride[2], (st.l == 0.0f ? 0.0f : o[d] * inv) / os);
        }
    } else if (out->stride[2] == 1) {
        int64_t es = lk_esize(out->dtype);
        char *p = (char *)out->data + off * es;
        lkv_f32 vi = lkv_set1(inv);
        int64_t d = 0;
        for (; d + LKV_W <= D; d += LKV_W)
            lkv_store(p + d * es, out->dtype, lkv_maskz(keep, lkv_mul(lkv_loadu(o + d), vi)));
        for (; d < D; d++) lk_store_f(p, out->dtype, d, st.l == 0.0f ? 0.0f : o[d] * inv);
    } else {
        for (int64_t d = 0; d < D; d++)
            lk_store_f(out->data, out->dtype, off + d * out->stride[2], st.l == 0.0f ? 0.0f : o[d] * inv);
    }
    if (a->has_lse)
        ((float *)a->lse.data)[t * a->lse.stride[0] + h * a->lse.stride[1]] = lk_online_lse(st);
}

/* ------------------------------------------------------------------ softmax pieces */

/* softcap * tanh(x / softcap) for W lanes: tanh(y) = sign(y) (1 - e) / (1 + e), e = exp(-2|y|) */
static inline lkv_f32 softcap_v(lkv_f32 x, float cap) {
    lkv_f32 y = lkv_mul(x, lkv_set1(1.0f / cap)), neg0 = lkv_set1(-0.0f), one = lkv_set1(1.0f);
    lkv_f32 sign = lkv_and(y, neg0);
    lkv_f32 e = lkv_exp(lkv_mul(lkv_andnot(neg0, y), lkv_set1(-2.0f)));
    lkv_f32 t = lkv_div(lkv_sub(one, e), lkv_add(one, e));
    return lkv_mul(lkv_or(t, sign), lkv_set1(cap));
}

/* the online-softmax step of one block of n scores (a multiple of W) of one row:
 * block max, st rescaled to it, s = exp(s - shift) in place, l += their sum; returns
 * alpha = exp(m_old - m_new), by which the caller rescales its accumulator */
static float online_block(float *s, int64_t n, lk_online_state *st) {
    lkv_f32 mx = lkv_set1(-INFINITY), sum = lkv_zero();
    for (int64_t j = 0; j < n; j += LKV_W) mx = lkv_max(mx, lkv_loadu(s + j));
    float alpha = lk_online_rescale(st, lkv_hmax(mx));
    lkv_f32 vm = lkv_set1(lk_online_shift(st->m));
    for (int64_t j = 0; j < n; j += LKV_W) {
        lkv_f32 e = lkv_exp_nonpos(lkv_sub(lkv_loadu(s + j), vm)); /* <= 0 or NaN */
        lkv_storeu(s + j, e);
        sum = lkv_add(sum, e);
    }
    lk_online_add(st, lkv_hsum(sum));
    return alpha;
}

/* ------------------------------------------------------------------ prefill path
 * Requests are processed in groups whose packed K/V fit PACK_BUDGET bytes: phase 1
 * converts each (request, KV head) "slab" of the group once into f32 panels
 *   Kt [kpad/PW][Dqk][PW] and Vp [Dvp/PW][kpad][PW]   (kpad = k_len rounded up to KB),
 * phase 2 runs the (request, KV head, query tile) units over those panels. */

#define PACK_BUDGET ((int64_t)64 << 20)

typedef struct {
    const lk_attn_args *a;
    int64_t qt, G, Mp, Dvp;
    int64_t *slab_b, *slab_kh, *slab_off; /* [n_slabs] request, KV head, float offset */
    int64_t *tile_slab, *tile_j0;         /* pack units */
    int64_t *unit_slab, *unit_t0;         /* compute units */
    float *pack;                          /* packed K/V of the group */
    char *scratch;                        /* per thread */
    size_t scratch_bytes;
    int qk16, pv16;                       /* LKV_BF16DOT builds: Q.K^T / P.V on bf16 pairs */
} prefill_ctx;

static inline int64_t kpad_of(int64_t k_len) { return (k_len + KB - 1) / KB * KB; }

#if defined(LKV_BF16DOT)
/* ---- the bf16 dot-product path (AVX512_BF16), for bf16 q, k and v ----
 * Q.K^T and P.V on pairs of bf16 values (lkv_dot2: two exact products per f32 lane,
 * summed in f32), same tiles, softmax and stores as the f32 path:
 *   Qb [Mp][Dqk]        bf16, q as it is (the scale multiplies the f32 scores)
 *   Kb [kpad/PW][Dqk/2][PW]  32-bit words = pairs of consecutive dims of one key
 *   Vb [Dvp/PW][kpad/2][PW]  words = one dim of two consecutive keys
 *   Pb [Mp][KB/2]       P rounded to bf16 (round to nearest even) before P.V, as GPU
 *                       flash attention does: the one extra rounding of this path,
 *                       taken only for a bf16 out (else P.V in f32 on the f32 Vp)
 * Packing is a 32-bit transpose of K rows and a 16-bit zip of pairs of V rows. */

/* C[MR][PW] (+)= A . B over K2 pairs: A rows of pairs lda words apart, B [K2][PW] words;
 * without accumulate C = scale * A . B */
static inline void mk2(int64_t K2, const uint32_t *A, int64_t lda, const uint32_t *B, float *C, int64_t ldc,
                       int accumulate, float scale) {
    lkv_f32 c0[MR], c1[MR];
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++) {
        c0[r] = accumulate ? lkv_loadu(C + r * ldc) : lkv_zero();
        c1[r] = accumulate ? lkv_loadu(C + r * ldc + LKV_W) : lkv_zero();
    }
    for (int64_t k = 0; k < K2; k++) {
        lkv_bits b0 = lkv_bits_loadu(B + k * PW), b1 = lkv_bits_loadu(B + k * PW + LKV_W);
#pragma GCC unroll 16
        for (int r = 0; r < MR; r++) {
            lkv_bits a = lkv_bits_set1(A[r * lda + k]);
            c0[r] = lkv_dot2(c0[r], a, b0);
            c1[r] = lkv_dot2(c1[r], a, b1);
        }
    }
    lkv_f32 vs = lkv_set1(scale);
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++) {
        lkv_storeu(C + r * ldc, accumulate ? c0[r] : lkv_mul(c0[r], vs));
        lkv_storeu(C + r * ldc + LKV_W, accumulate ? c1[r] : lkv_mul(c1[r], vs));
    }
}

/* 2W bf16 values of the row at q from dim d (m of them, a multiple of 8; the rest 0;
 * zeros without a read when q is NULL or m is 0) */
LK_ALWAYS_INLINE lkv_bits row16_load(const char *q, int64_t d, int64_t m, int64_t cs) {
    if (!q || m <= 0) return lkv_bits_load16(q, 0);
    if (cs == 16) return lkv_bits_load16(q + 2 * d, m);
    return lkv_bits_join32(lkv_c32_loadu(q + chunk_off(d, cs, 2)),
                           m > 16 ? lkv_c32_loadu(q + chunk_off(d + 16, cs, 2)) : _mm256_setzero_si256());
}

/* ---- fp8 rows on the bf16 path: every e4m3 / e5m2 value is a bf16 value, so a row of
 * codes is widened to bf16 bits in registers (lkv_f8_to_bf16: two byte-table lookups and
 * a zip; no dequantized copy) and feeds the same dot products; the descales multiply the
 * f32 scores and outputs. */
static inline lkv_bits f8_to_bf16(__m256i codes, lk_dtype dt) { return lkv_f8_to_bf16(codes, dt); }

/* row16_load for a row of fp8 codes at p: 2W = 32 dims from d (m of them, a multiple of
 * 8; the rest 0), 32-dim tiles cs bytes apart (cs == 32: a contiguous ND row); d is a
 * multiple of 32 wherever the tiles are not contiguous */
LK_ALWAYS_INLINE lkv_bits row16_load_f8(const char *p, int64_t d, int64_t m, int64_t cs, lk_dtype dt) {
    if (!p || m <= 0) return lkv_bits_load16(p, 0);
    const char *q = p + dim_off(0, cs, d, 1);
    __m256i c = m >= 32 ? _mm256_loadu_si256((const __m256i *)q) : _mm256_maskz_loadu_epi8((__mmask32)((1u << m) - 1u), q);
    return f8_to_bf16(c, dt);
}

/* 2W dims of a bf16 or fp8 row (dt constant after inlining) */
LK_ALWAYS_INLINE lkv_bits rowdt_load(const char *p, int64_t d, int64_t m, int64_t cs, lk_dtype dt) {
    return dt == LK_BF16 ? row16_load(p, d, m, cs) : row16_load_f8(p, d, m, cs, dt);
}

/* row16_load of the K/V row at element offset base of cache c (bf16 or fp8) */
static inline lkv_bits load_pairs(const lk_paged *c, int64_t base, int64_t cs, int64_t d, int64_t n) {
    if (c->dtype == LK_BF16) return row16_load((const char *)c->data + 2 * base, d, n, cs);
    return row16_load_f8((const char *)c->data + base, d, n, cs, c->dtype);
}

/* a bf16-path operand: bf16, or fp8 (widened exactly) */
static inline int bf16_operand(lk_dtype dt) { return dt == LK_BF16 || lk_is_fp8(dt); }

/* Kb tile: word (d2, jj % PW) of panel jj / PW = dims 2 d2, 2 d2 + 1 of key j0 + jj; 0
 * for jj >= kb */
static void load_k_tile_bf16(const lk_attn_args *a, int64_t b, int64_t kh, int64_t j0, int64_t kb, uint32_t *Kb) {
    const lk_paged *c = &a->kc;
    int64_t D = a->Dqk, D2 = D / 2, cs = chunk_stride(c);
    for (int64_t g = 0; g < KB; g += LKV_W) {
        int64_t base[LKV_W];
        for (int r = 0; r < LKV_W; r++) base[r] = g + r < kb ? lk_attn_key_off(a, c, b, j0 + g + r, kh, 0) : NO_KEY;
        uint32_t *dst = Kb + (g / PW) * D2 * PW + (g % PW);
        for (int64_t d2 = 0; d2 < D2; d2 += LKV_W) {
            int64_t n = D2 - d2 < LKV_W ? D2 - d2 : LKV_W;
            lkv_f32 rw[LKV_W]; /* W words of each key, moved as f32 bits */
            for (int r = 0; r < LKV_W; r++)
                rw[r] = base[r] != NO_KEY ? lkv_as_f32(load_pairs(c, base[r], cs, 2 * d2, 2 * n)) : lkv_zero();
            lkv_transpose(rw);
            for (int k = 0; k < n; k++) lkv_storeu((float *)(dst + (d2 + k) * PW), rw[k]);
        }
    }
}

/* Vb tile: word (jj / 2, d % PW) of panel d / PW = dim d of keys j0 + jj, j0 + jj + 1 (jj
 * even); 0 for keys >= kb and dims >= Dv */
static void load_v_tile_bf16(const lk_attn_args *a, int64_t b, int64_t kh, int64_t j0, int64_t kb, int64_t Dvp,
                             int64_t ps, uint32_t *Vb) {
    const lk_paged *c = &a->vc;
    int64_t D = a->Dv, cs = chunk_stride(c);
    for (int64_t jj = 0; jj < KB; jj += 2) {
        int64_t b0 = jj < kb ? lk_attn_key_off(a, c, b, j0 + jj, kh, 0) : NO_KEY;
        int64_t b1 = jj + 1 < kb ? lk_attn_key_off(a, c, b, j0 + jj + 1, kh, 0) : NO_KEY;
        for (int64_t d = 0; d < Dvp; d += PW) {
            int64_t n = D - d < PW ? D - d : PW;
            lkv_bits v0 = b0 != NO_KEY && n > 0 ? load_pairs(c, b0, cs, d, n) : lkv_bits_load16(Vb, 0);
            lkv_bits v1 = b1 != NO_KEY && n > 0 ? load_pairs(c, b1, cs, d, n) : lkv_bits_load16(Vb, 0);
            lkv_bits lo, hi;
            lkv_zip16(v0, v1, &lo, &hi);
            uint32_t *dst = Vb + (d / PW) * ps + (jj / 2) * PW;
            lkv_bits_storeu(dst, lo);
            lkv_bits_storeu(dst + LKV_W, hi);
        }
    }
}

/* Qb row = q[token, head, :] as bf16 bits (an fp8 q widened: exact) */
static void load_q_row_bf16(const lk_attn_args *a, int64_t t, int64_t h, uint16_t *dst) {
    const lk_tensor *q = &a->q;
    if (q->dtype != LK_BF16) {
        int64_t off = t * q->stride[0] + h * q->stride[1];
        for (int64_t d = 0; d < a->Dqk; d++) {
            float f = lk_load_f(q->data, q->dtype, off + d * q->stride[2]);
            uint32_t u;
            memcpy(&u, &f, 4);
            dst[d] = (uint16_t)(u >> 16);
        }
        return;
    }
    const uint16_t *p = (const uint16_t *)q->data + t * q->stride[0] + h * q->stride[1];
    if (q->stride[2] == 1) memcpy(dst, p, sizeof(uint16_t) * (size_t)a->Dqk);
    else
        for (int64_t d = 0; d < a->Dqk; d++) dst[d] = p[d * q->stride[2]];
}

/* 1 if a V value of the tile's keys (Vb panels) is inf or NaN */
static int tile_nonfinite_bf16(const uint32_t *Vb, int64_t kpad, int64_t j0, int64_t k_len, int64_t Dvp) {
    int64_t kb = k_len - j0 < KB ? k_len - j0 : KB;
    lkv_f32 acc = lkv_zero(), zero = lkv_zero(), e, o;
    for (int64_t p = 0; p < Dvp / PW; p++) {
        const uint32_t *v = Vb + p * (kpad / 2) * PW + (j0 / 2) * PW;
        for (int64_t i = 0; i < (kb + 1) / 2 * PW; i += LKV_W) {
            lkv_bf16_split(lkv_bits_loadu(v + i), &e, &o);
            acc = lkv_add(acc, lkv_add(lkv_mul(e, zero), lkv_mul(o, zero)));
        }
    }
    return lkv_m_any(lkv_unord(acc, acc));
}

/* O[r] += sum over the keys j of the tile that row r sees of P[r][j] V[j] (f32 P, keys in
 * order): the Vb words' low halves hold even keys, high halves odd ones */
static void pv_visible_only_bf16(const float *S, const uint32_t *Vb, float *O, const int64_t *lo, const int64_t *hi,
                                 int64_t M, int64_t j0, int64_t kpad, int64_t Dvp) {
    for (int64_t r = 0; r < M; r++) {
        int64_t j_lo = lo[r] > j0 ? lo[r] : j0, j_hi = hi[r] < j0 + KB - 1 ? hi[r] : j0 + KB - 1;
        const float *s = S + r * KB; // [KB] probabilities of row r
        for (int64_t p = 0; p < Dvp / PW; p++) {
            float *o = O + r * Dvp + p * PW;
            lkv_f32 c0 = lkv_loadu(o), c1 = lkv_loadu(o + LKV_W), e0, o0, e1, o1;
            for (int64_t j = j_lo; j <= j_hi; j++) {
                const uint32_t *v = Vb + p * (kpad / 2) * PW + (j / 2) * PW; // [PW] dims of keys j & ~1, j | 1
                lkv_f32 w = lkv_set1(s[j - j0]);
                lkv_bf16_split(lkv_bits_loadu(v), &e0, &o0);
                lkv_bf16_split(lkv_bits_loadu(v + LKV_W), &e1, &o1);
                c0 = lkv_fma(w, j & 1 ? o0 : e0, c0);
                c1 = lkv_fma(w, j & 1 ? o1 : e1, c1);
            }
            lkv_storeu(o, c0), lkv_storeu(o + LKV_W, c1);
        }
    }
}
#endif

static void pack_unit(void *vctx, int64_t u, int tid) {
    (void)tid;
    prefill_ctx *c = vctx;
    const lk_attn_args *a = c->a;
    int64_t sl = c->tile_slab[u], b = c->slab_b[sl], kh = c->slab_kh[sl], j0 = c->tile_j0[u];
    int64_t k_len = a->k_len[b], kpad = kpad_of(k_len), kb = k_len - j0 < KB ? k_len - j0 : KB;
    float *Kt = c->pack + c->slab_off[sl];   // [kpad/PW][Dqk][PW]
    float *Vp = Kt + kpad * a->Dqk;         // [Dvp/PW][kpad][PW]
#if defined(LKV_BF16DOT)
    /* the bf16 path: Kb [kpad/PW][Dqk/2][PW] words at the slab's start, Vb
     * [Dvp/PW][kpad/2][PW] words at Vp's place */
    if (c->qk16) load_k_tile_bf16(a, b, kh, j0, kb, (uint32_t *)Kt + j0 * a->Dqk / 2);
    else load_k_tile(a, b, kh, j0, kb, Kt + j0 * a->Dqk);
    if (c->pv16) load_v_tile_bf16(a, b, kh, j0, kb, c->Dvp, kpad / 2 * PW, (uint32_t *)Vp + j0 / 2 * PW);
    else load_v_tile(a, b, kh, j0, kb, c->Dvp, kpad * PW, Vp + j0 * PW);
    return;
#endif
    load_k_tile(a, b, kh, j0, kb, Kt + j0 * a->Dqk);
    load_v_tile(a, b, kh, j0, kb, c->Dvp, kpad * PW, Vp + j0 * PW);
}

/* Masked keys inside a key tile get P = 0, and the P.V product multiplies them anyway:
 * 0 * inf = NaN would let an infinite V value of a key a row cannot see (a future token
 * under the causal mask, a key outside the window) poison that row. Tiles that mask
 * some key for some row and hold a non-finite V value take a P.V that skips the masked
 * keys (rare: finite V never needs it). */

/* 1 if some row r < M does not see every key of the tile [j0, min(j0 + KB, k_len)) */
static int masks_keys(const int64_t *lo, const int64_t *hi, int64_t M, int64_t j0, int64_t k_len) {
    int64_t last = j0 + KB < k_len ? j0 + KB - 1 : k_len - 1;
    for (int64_t r = 0; r < M; r++)
        if (lo[r] > j0 || hi[r] < last) return 1;
    return 0;
}

/* 1 if a V value of the tile's keys (packed panels Vp [Dvp/PW][kpad][PW]) is inf or NaN */
static int tile_nonfinite(const float *Vp, int64_t kpad, int64_t j0, int64_t k_len, int64_t Dvp) {
    int64_t kb = k_len - j0 < KB ? k_len - j0 : KB;
    lkv_f32 acc = lkv_zero(), zero = lkv_zero();
    for (int64_t p = 0; p < Dvp / PW; p++) {
        const float *v = Vp + p * kpad * PW + j0 * PW;
        for (int64_t i = 0; i < kb * PW; i += LKV_W) acc = lkv_add(acc, lkv_mul(lkv_loadu(v + i), zero));
    }
    return lkv_m_any(lkv_unord(acc, acc));
}

/* O[r] += sum over the keys j of the tile that row r sees of P[r][j] V[j] (keys in order) */
static void pv_visible_only(const float *S, const float *Vp, float *O, const int64_t *lo, const int64_t *hi,
                            int64_t M, int64_t j0, int64_t kpad, int64_t Dvp) {
    for (int64_t r = 0; r < M; r++) {
        int64_t j_lo = lo[r] > j0 ? lo[r] : j0, j_hi = hi[r] < j0 + KB - 1 ? hi[r] : j0 + KB - 1;
        const float *s = S + r * KB; // [KB] probabilities of row r
        for (int64_t p = 0; p < Dvp / PW; p++) {
            float *o = O + r * Dvp + p * PW;
            lkv_f32 c0 = lkv_loadu(o), c1 = lkv_loadu(o + LKV_W);
            for (int64_t j = j_lo; j <= j_hi; j++) {
                const float *v = Vp + p * kpad * PW + j * PW; // [PW] dims of key j
                lkv_f32 w = lkv_set1(s[j - j0]);
                c0 = lkv_fma(w, lkv_loadu(v), c0);
                c1 = lkv_fma(w, lkv_loadu(v + LKV_W), c1);
            }
            lkv_storeu(o, c0), lkv_storeu(o + LKV_W, c1);
        }
    }
}

static void prefill_unit(void *vctx, int64_t u, int tid) {
    prefill_ctx *c = vctx;
    const lk_attn_args *a = c->a;
    int64_t sl = c->unit_slab[u], b = c->slab_b[sl], kh = c->slab_kh[sl], t0 = c->unit_t0[u], G = c->G;
    int64_t q0 = a->cu_q[b], q_len = a->cu_q[b + 1] - q0, k_len = a->k_len[b], kpad = kpad_of(k_len);
    int64_t nt = q_len - t0 < c->qt ? q_len - t0 : c->qt; /* tokens in this tile */
    int64_t M = nt * G, Mp = (M + MR - 1) / MR * MR, Dqk = a->Dqk, Dvp = c->Dvp;
    const float *Kt = c->pack + c->slab_off[sl];                        // [kpad/PW][Dqk][PW]
    const float *Vp = Kt + kpad * Dqk;                                  // [Dvp/PW][kpad][PW]
    float *Qs = (float *)(c->scratch + (size_t)tid * c->scratch_bytes); // [Mp][Dqk]
    float *S = Qs + c->Mp * Dqk;                                        // [Mp][KB]
    float *O = S + c->Mp * KB;                                          // [Mp][Dvp]
    lk_online_state *st = (lk_online_state *)(O + c->Mp * Dvp);        // [Mp]
    int64_t *lo = (int64_t *)(st + c->Mp), *hi = lo + c->Mp;            // [Mp] per row
#if defined(LKV_BF16DOT)
    uint16_t *Qb = (uint16_t *)Qs;                                      // [Mp][Dqk] bf16
    uint32_t *Pb = (uint32_t *)(hi + c->Mp);                            // [Mp][KB/2] pairs
    const uint32_t *Kb = (const uint32_t *)Kt, *Vb = (const uint32_t *)Vp;
#endif
    int64_t jmin = k_len, jmax = -1;
    for (int64_t t = 0; t < nt; t++) {
        int64_t l0, h0;
        lk_attn_window(a, t0 + t, q_len, k_len, &l0, &h0);
        for (int64_t g = 0; g < G; g++) {
            int64_t r = t * G + g;
            lo[r] = l0, hi[r] = h0;
#if defined(LKV_BF16DOT)
            if (c->qk16) load_q_row_bf16(a, q0 + t0 + t, kh * G + g, Qb + r * Dqk);
            else
#endif
            load_q_row(a, q0 + t0 + t, kh * G + g, qk_scale(a, b, kh), Qs + r * Dqk);
        }
        if (l0 <= h0) {
            if (l0 < jmin) jmin = l0;
            if (h0 > jmax) jmax = h0;
        }
    }
    for (int64_t r = M; r < Mp; r++) memset(Qs + r * Dqk, 0, sizeof(float) * (size_t)Dqk);
#if defined(LKV_BF16DOT)
    for (int64_t r = M; r < Mp && c->qk16; r++) memset(Qb + r * Dqk, 0, sizeof(uint16_t) * (size_t)Dqk);
#endif
    memset(O, 0, sizeof(float) * (size_t)(Mp * Dvp));
    for (int64_t r = 0; r < Mp; r++) st[r] = lk_online_init();
    for (int64_t j0 = jmin >= 0 ? jmin / KB * KB : 0; j0 <= jmax; j0 += KB) {
        const float *Ktile = Kt + j0 * Dqk; /* KB / PW panels of [Dqk][PW] */
#if defined(LKV_BF16DOT)
        if (c->qk16)
            for (int64_t r = 0; r < Mp; r += MR)
                for (int64_t p = 0; p < KB / PW; p++)
                    mk2(Dqk / 2, (const uint32_t *)(Qb + r * Dqk), Dqk / 2, Kb + j0 * Dqk / 2 + p * (Dqk / 2) * PW,
                        S + r * KB + p * PW, KB, 0, qk_scale(a, b, kh));
        else
#endif
        for (int64_t r = 0; r < Mp; r += MR)
            for (int64_t p = 0; p < KB / PW; p++)
                mk(Dqk, Qs + r * Dqk, Dqk, Ktile + p * Dqk * PW, S + r * KB + p * PW, KB, 0);
        for (int64_t r = 0; r < Mp; r++) {
            float *s = S + r * KB;
            if (r >= M || hi[r] < j0 || lo[r] > j0 + KB - 1 || lo[r] > hi[r]) {
                memset(s, 0, sizeof(float) * KB); /* row sees nothing here: P = 0 */
                continue;
            }
            if (a->softcap > 0)
                for (int jj = 0; jj < KB; jj += LKV_W) lkv_storeu(s + jj, softcap_v(lkv_loadu(s + jj), a->softcap));
            if (a->alibi) /* row r: token t0 + r / G, head kh * G + r % G */
                lk_attn_alibi_add(a, b, kh * G + r % G, t0 + r / G, q_len, k_len, j0, KB, s);
            if (lo[r] > j0 || hi[r] < j0 + KB - 1)
                for (int64_t jj = 0; jj < KB; jj++)
                    if (j0 + jj < lo[r] || j0 + jj > hi[r]) s[jj] = -INFINITY;
            float alpha = online_block(s, KB, &st[r]);
            if (alpha != 1.0f) {
                lkv_f32 va = lkv_set1(alpha);
                float *o = O + r * Dvp;
                for (int64_t d = 0; d < Dvp; d += LKV_W) lkv_storeu(o + d, lkv_mul(lkv_loadu(o + d), va));
            }
        }
#if defined(LKV_BF16DOT)
        if (c->pv16) {
            if (masks_keys(lo, hi, M, j0, k_len) && tile_nonfinite_bf16(Vb, kpad, j0, k_len, Dvp)) {
                pv_visible_only_bf16(S, Vb, O, lo, hi, M, j0, kpad, Dvp);
                continue;
            }
            for (int64_t r = 0; r < Mp; r++)
                for (int64_t jj = 0; jj < KB; jj += 2 * LKV_W)
                    lkv_bits_storeu(Pb + r * (KB / 2) + jj / 2,
                                    lkv_bf16_pack_rne(lkv_loadu(S + r * KB + jj), lkv_loadu(S + r * KB + jj + LKV_W)));
            for (int64_t r = 0; r < Mp; r += MR)
                for (int64_t p = 0; p < Dvp / PW; p++)
                    mk2(KB / 2, Pb + r * (KB / 2), KB / 2, Vb + p * (kpad / 2) * PW + (j0 / 2) * PW, O + r * Dvp + p * PW,
                        Dvp, 1, 1.0f);
            continue;
        }
#endif
        if (masks_keys(lo, hi, M, j0, k_len) && tile_nonfinite(Vp, kpad, j0, k_len, Dvp))
            pv_visible_only(S, Vp, O, lo, hi, M, j0, kpad, Dvp);
        else
            for (int64_t r = 0; r < Mp; r += MR)
                for (int64_t p = 0; p < Dvp / PW; p++)
                    mk(KB, S + r * KB, KB, Vp + p * kpad * PW + j0 * PW, O + r * Dvp + p * PW, Dvp, 1);
    }
    for (int64_t t = 0; t < nt; t++)
        for (int64_t g = 0; g < G; g++) {
            int64_t r = t * G + g;
            store_out_row(a, q0 + t0 + t, kh * G + g, O + r * Dvp, st[r], lk_attn_desc(&a->vd, b, kh));
        }
}

/* run phase 1 and 2 for the slabs [s0, s1) (already laid out from float offset 0) */
static void run_group(prefill_ctx *c, int64_t s0, int64_t s1, int nt) {
    const lk_attn_args *a = c->a;
    int64_t n_pack = 0, n_units = 0;
    for (int64_t sl = s0; sl < s1; sl++) {
        int64_t b = c->slab_b[sl], ql = a->cu_q[b + 1] - a->cu_q[b];
        for (int64_t j0 = 0; j0 < a->k_len[b]; j0 += KB) c->tile_slab[n_pack] = sl, c->tile_j0[n_pack++] = j0;
        /* longest units (last query tiles: most visible keys under causal masks) first */
        for (int64_t t0 = ql > 0 ? (ql - 1) / c->qt * c->qt : -1; t0 >= 0; t0 -= c->qt)
            c->unit_slab[n_units] = sl, c->unit_t0[n_units++] = t0;
    }
    lk_parallel_units(n_pack, nt, pack_unit, c);
    lk_parallel_units(n_units, nt, prefill_unit, c);
}

static lk_status run_prefill(const lk_attn_args *a) {
    int64_t G = a->Hq / a->Hk, qt = ROWS / G > 0 ? ROWS / G : 1;
    int64_t Mp = (qt * G + MR - 1) / MR * MR, Dvp = (a->Dv + PW - 1) / PW * PW;
    int64_t n_slabs = 0, max_tiles = 0, max_units = 0, max_slab = 0;
    for (int64_t b = 0; b < a->B; b++) {
        int64_t ql = a->cu_q[b + 1] - a->cu_q[b];
        if (ql == 0) continue;
        n_slabs += a->Hk;
        max_tiles += a->Hk * (kpad_of(a->k_len[b]) / KB);
        max_units += a->Hk * ((ql + qt - 1) / qt);
        int64_t sz = kpad_of(a->k_len[b]) * (a->Dqk + Dvp);
        if (sz > max_slab) max_slab = sz;
    }
    if (n_slabs == 0) return LK_OK;
    int64_t budget = PACK_BUDGET / (int64_t)sizeof(float);
    if (budget < max_slab) budget = max_slab;
    size_t floats = (size_t)(Mp * a->Dqk + Mp * KB + Mp * Dvp) + 6 * (size_t)Mp + 16 + (size_t)(Mp * KB / 2);
    size_t bytes = (floats * sizeof(float) + 63) / 64 * 64;
    int nt = lk_plan_units(max_units);
    prefill_ctx c;
    memset(&c, 0, sizeof c);
    c.a = a, c.qt = qt, c.G = G, c.Mp = Mp, c.Dvp = Dvp, c.scratch_bytes = bytes;
#if defined(LKV_BF16DOT)
    /* Q.K^T on bf16 pairs whenever q and k are bf16: the products are exact, only the
     * order of the f32 sums changes. P.V on bf16 pairs, which rounds P to bf16, only for
     * bf16 v into a bf16 out, where that rounding stays within the output's own (see
     * docs/numerics.md); any other out keeps P in f32 */
    c.qk16 = bf16_operand(a->q.dtype) && bf16_operand(a->kc.dtype); /* fp8 widened to bf16 exactly */
    /* f32 FMAs where the dot products run at half their rate (lk_cpu_prefer_fma: 1x2048^2
     * causal, 32/8 heads x 128, bf16, Emerald Rapids: 1.63x faster; the amx row too, whose
     * prefill has no tile path) */
    c.qk16 = c.qk16 && !lk_cpu_prefer_fma();
    c.pv16 = c.qk16 && bf16_operand(a->vc.dtype) && a->out.dtype == LK_BF16;
#endif
    int64_t *ix = malloc(sizeof(int64_t) * (size_t)(3 * n_slabs + 2 * max_tiles + 2 * max_units + 1));
    void *scratch = NULL, *pack = NULL;
    lk_status st = LK_ERR_NOMEM;
    int64_t total = 0;
    for (int64_t b = 0; b < a->B; b++)
        if (a->cu_q[b + 1] > a->cu_q[b]) total += a->Hk * kpad_of(a->k_len[b]) * (a->Dqk + Dvp);
    if (budget > total) budget = total;
    if (ix && !posix_memalign(&scratch, 64, bytes * (size_t)nt) &&
        !posix_memalign(&pack, 64, sizeof(float) * (size_t)(budget > 0 ? budget : 1))) {
        c.slab_b = ix, c.slab_kh = ix + n_slabs, c.slab_off = ix + 2 * n_slabs;
        c.tile_slab = ix + 3 * n_slabs, c.tile_j0 = c.tile_slab + max_tiles;
        c.unit_slab = c.tile_j0 + max_tiles, c.unit_t0 = c.unit_slab + max_units;
        c.pack = pack, c.scratch = scratch;
        /* slabs in (request, KV head) order; a group ends where the budget is full */
        int64_t sl = 0, g0 = 0, used = 0;
        for (int64_t b = 0; b < a->B; b++) {
            if (a->cu_q[b + 1] == a->cu_q[b]) continue;
            int64_t sz = kpad_of(a->k_len[b]) * (a->Dqk + Dvp);
            for (int64_t kh = 0; kh < a->Hk; kh++) {
                if (used + sz > budget) {
                    run_group(&c, g0, sl, nt);
                    g0 = sl, used = 0;
                }
                c.slab_b[sl] = b, c.slab_kh[sl] = kh, c.slab_off[sl] = used;
                used += sz, sl++;
            }
        }
        run_group(&c, g0, sl, nt);
        st = LK_OK;
    }
    free(scratch), free(pack), free(ix);
    return st;
}

/* ------------------------------------------------------------------ decode path */

typedef struct {
    const lk_attn_args *a;
    int64_t *unit_b, *unit_c;  /* [n_units] request, chunk index */
    int64_t *state_base;       /* [B] first state row of request b: rows (chunk, i, h) */
    lk_online_state *st;       /* [rows] */
    float *st_o;               /* [rows][Dv] unnormalised outputs */
    float *qbuf;               /* per thread [q_len_max * Hq][Dqk] */
    int64_t qbuf_stride;
    float *sbuf;               /* per thread [Hq][DB] scores / probabilities */
    int qk16;                  /* LKV_BF16DOT builds, q and k bf16: q . k on bf16 pairs (qbuf
                                  then holds q's bf16 rows, the scale applied to the score) */
    int pv16;                  /* and v, out bf16: P rounded to bf16, P.V on bf16 pairs */
    int g4;                    /* pv16 with 4 query heads per KV head x 128 dims, no softcap or
                                  ALiBi: key-major scores, softmax over heads (decode_row_g4) */
    int g4f;                   /* DECODE_G4F: head dims multiples of 2W, no softcap or ALiBi, and
                                  2+ query heads per KV head or fp8 K / V: decode_row_g4f */
    int amx;                   /* AMX build: decode_row_amx (bf16 / fp8 q, fp8 K and V, bf16
                                  out, 3 to 16 query heads per KV head, dims multiples of 64) */
    int64_t sbuf_floats;       /* per thread, in sbuf */
} decode_ctx;

#define DB 16     /* keys per decode block */
/* per-thread score buffer: [Hq][DB] f32 scores, then [Hq][DB / 2] bf16-pair words of P
 * (pv16) and one vector of slack for the last head's 64-byte store */
#define SBUF_FLOATS(Hq) (HQP(Hq) * (DB + DB / 2 + 3) + 16)
#define HQP(Hq) (((Hq) + 15) / 16 * 16) /* heads rounded up to 16 (key-major rows of the g4 path) */

/* software prefetch: while a block of DB keys is scored, the next block's K and V rows
 * are prefetched into L2, a whole block ahead (a hardware prefetcher stops at each 4 KiB
 * page and each scattered cache page; per-row L1 prefetches a few rows ahead left the
 * loop stalled on DRAM, and cost more instructions than they saved once L2 is ahead).
 * The g4f loops spread them among the loads of the current block (a K row per key
 * of 4 heads, else a line per piece of 2W dims; V a line per piece), never many rows at
 * once: a burst of tens of prefetches fills the miss buffers and the loads behind it
 * wait (GQA bf16 decode 12 % faster spread out) */

/* out[jj] = the byte offset of head 0, dim 0 of key j0 + jj of request b in cache c, jj < n
 * (lk_attn_key_off with one division per call: the page and slot walked key by key) */
static void key_offsets(const lk_attn_args *a, const lk_paged *c, int64_t b, int64_t j0, int64_t n, int64_t *out) {
    /* head 0, dim 0 of slot s of page p: p s0 + s ss (lk_paged_off with h = d = 0) */
    const int64_t es = lk_esize(c->dtype), ss = c->layout == LK_KV_ND ? c->s1 : c->s2;
    if (!a->table) {
        for (int64_t jj = 0; jj < n; jj++) out[jj] = (a->k_start[b] + j0 + jj) * ss * es;
        return;
    }
    const int64_t bs = c->block_size;
    const int32_t *tab = a->table + b * a->table_stride;
    int64_t pi = j0 / bs, slot = j0 % bs, base = n > 0 ? tab[pi] * c->s0 : 0;
    for (int64_t jj = 0; jj < n; jj++) {
        out[jj] = (base + slot * ss) * es;
        if (++slot == bs && jj + 1 < n) slot = 0, base = tab[++pi] * c->s0;
    }
}

/* elements between consecutive heads of one key (ND: s2; NZ: a head is D/TILE chunks) */
static inline int64_t head_step(const lk_paged *c) {
    return c->layout == LK_KV_NZ ? (c->D / TILE(lk_esize(c->dtype))) * c->s1 : c->s2;
}


/* prefetch a K/V row of D dims of `es` bytes in 16-dim chunks `cs` elements apart
 * (cs == 16: contiguous ND row) into L2 */
static inline void prefetch_row_l2(const char *p, int64_t cs, int64_t D, int64_t es) {
    if (cs == TILE(es)) {
        for (int64_t off = 0; off < D * es; off += 64) lkv_prefetch_l2(p + off);
    } else {
        for (int64_t c = 0; c < D / TILE(es); c++) lkv_prefetch_l2(p + c * cs * es);
    }
}

/* q . k over D dims of a row at p, dtype constant after inlining */
LK_ALWAYS_INLINE float dot_row(const float *q, const char *p, int64_t cs, int64_t D, lk_dtype dt) {
    int64_t es = lk_esize(dt), d = 0;
    lkv_f32 s0 = lkv_zero(), s1 = s0;
    for (; d + 2 * LKV_W <= D; d += 2 * LKV_W) {
        s0 = lkv_fma(lkv_loadu(q + d), lkv_load(p + chunk_off(d, cs, es), dt), s0);
        s1 = lkv_fma(lkv_loadu(q + d + LKV_W), lkv_load(p + chunk_off(d + LKV_W, cs, es), dt), s1);
    }
    if (d + LKV_W <= D) s0 = lkv_fma(lkv_loadu(q + d), lkv_load(p + chunk_off(d, cs, es), dt), s0), d += LKV_W;
    if (d < D)
        s1 = lkv_fma(lkv_load_part(q + d, LK_F32, D - d), lkv_load_part(p + chunk_off(d, cs, es), dt, D - d), s1);
    return lkv_hsum(lkv_add(s0, s1));
}

/* dot_row for 4 query rows q + g qs (g < 4) against one key row: the key loaded and
 * converted once for the 4 (GQA heads sharing a KV head); per row the same sums in the
 * same order as dot_row, so the same bits */
LK_ALWAYS_INLINE void dot_rows4(const float *q, int64_t qs, const char *p, int64_t cs, int64_t D, lk_dtype dt,
                                float *out) {
    int64_t es = lk_esize(dt), d = 0;
    lkv_f32 s0[4], s1[4];
    for (int g = 0; g < 4; g++) s0[g] = s1[g] = lkv_zero();
    for (; d + 2 * LKV_W <= D; d += 2 * LKV_W) {
        lkv_f32 k0 = lkv_load(p + chunk_off(d, cs, es), dt), k1 = lkv_load(p + chunk_off(d + LKV_W, cs, es), dt);
        for (int g = 0; g < 4; g++) {
            s0[g] = lkv_fma(lkv_loadu(q + g * qs + d), k0, s0[g]);
            s1[g] = lkv_fma(lkv_loadu(q + g * qs + d + LKV_W), k1, s1[g]);
        }
    }
    if (d + LKV_W <= D) {
        lkv_f32 k0 = lkv_load(p + chunk_off(d, cs, es), dt);
        for (int g = 0; g < 4; g++) s0[g] = lkv_fma(lkv_loadu(q + g * qs + d), k0, s0[g]);
        d += LKV_W;
    }
    if (d < D) {
        lkv_f32 k1 = lkv_load_part(p + chunk_off(d, cs, es), dt, D - d);
        for (int g = 0; g < 4; g++) s1[g] = lkv_fma(lkv_load_part(q + g * qs + d, LK_F32, D - d), k1, s1[g]);
    }
    for (int g = 0; g < 4; g++) out[g] = lkv_hsum(lkv_add(s0[g], s1[g]));
}

#if defined(LKV_BF16DOT)
/* out[g os] = scale * (q_g . k) (softcap cap > 0: cap tanh(. / cap)) for n (1 or 4) bf16
 * query rows q + g qs against one bf16 key row at p (16-dim chunks cs elements apart), on
 * bf16 pairs (VDPBF16PS: the products exact, f32 sums) */
LK_ALWAYS_INLINE void dot16_rows(const uint16_t *q, int64_t qs, const char *p, int64_t cs, int64_t D, int n,
                                 float scale, float cap, float *out, int64_t os, lk_dtype dt) {
    lkv_f32 s0[4], s1[4];
#pragma GCC unroll 4
    for (int g = 0; g < n; g++) s0[g] = s1[g] = lkv_zero();
    int64_t d = 0;
    for (; d + 4 * LKV_W <= D; d += 4 * LKV_W) { /* two vectors of 2W dims: even ones to s0, odd to s1 */
        lkv_bits k0 = rowdt_load(p, d, 2 * LKV_W, cs, dt), k1 = rowdt_load(p, d + 2 * LKV_W, 2 * LKV_W, cs, dt);
#pragma GCC unroll 4
        for (int g = 0; g < n; g++) {
            s0[g] = lkv_dot2(s0[g], lkv_bits_loadu(q + g * qs + d), k0);
            s1[g] = lkv_dot2(s1[g], lkv_bits_loadu(q + g * qs + d + 2 * LKV_W), k1);
        }
    }
    for (; d < D; d += 2 * LKV_W) { /* the last < 4W dims (a multiple of 8), same parity rule */
        int64_t m = D - d < 2 * LKV_W ? D - d : 2 * LKV_W;
        lkv_bits k = rowdt_load(p, d, m, cs, dt);
        int odd = (d / (2 * LKV_W)) % 2;
#pragma GCC unroll 4
        for (int g = 0; g < n; g++) {
            lkv_bits qv = lkv_bits_load16(q + g * qs + d, m);
            if (odd) s1[g] = lkv_dot2(s1[g], qv, k);
            else s0[g] = lkv_dot2(s0[g], qv, k);
        }
    }
    if (n == 4 && !(cap > 0)) { /* the four lanes stored from the register (no round trip) */
        __m128 r = _mm_mul_ps(_mm_set1_ps(scale), lkv_hsum4(lkv_add(s0[0], s1[0]), lkv_add(s0[1], s1[1]),
                                                            lkv_add(s0[2], s1[2]), lkv_add(s0[3], s1[3])));
        _mm_store_ss(out, r);
        _mm_store_ss(out + os, _mm_movehdup_ps(r));
        _mm_store_ss(out + 2 * os, _mm_movehl_ps(r, r));
        _mm_store_ss(out + 3 * os, _mm_permute_ps(r, 0xff));
        return;
    }
    for (int g = 0; g < n; g++) {
        float x = scale * lkv_hsum(lkv_add(s0[g], s1[g]));
        out[g * os] = cap > 0 ? cap * tanhf(x / cap) : x;
    }
}

/* scores16_block for the common shape of 4 query heads per KV head x 128 dims without
 * softcap: KV heads outer, the 4 heads' q rows held in 16 registers over the block's
 * keys (not reloaded per key); per score the same sums in the same order as dot16_rows,
 * so the same bits */
LK_ALWAYS_INLINE void scores16_g4d128(const lk_attn_args *a, const uint16_t *q16, const int64_t *kbase,
                                      const int64_t *vbase, int64_t nb, int64_t nk, int64_t kcs, int64_t vcs,
                                      int64_t khs, int64_t vhs, float *sc, int64_t b, lk_dtype kt) {
    const int64_t Hk = a->Hk, ves = lk_esize(a->vc.dtype), kes = lk_esize(kt);
    const char *kd = (const char *)a->kc.data, *vd = (const char *)a->vc.data;
    for (int64_t kh = 0; kh < Hk; kh++) {
        const uint16_t *qh = q16 + kh * 4 * 128;
        lkv_bits qv[4][4];
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++)
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) qv[g][c] = lkv_bits_loadu(qh + g * 128 + c * 32);
        const float scale = qk_scale(a, b, kh);
        float *out = sc + kh * 4 * DB;
        for (int64_t jj = 0; jj < nb; jj++) {
            const char *kp = kd + kbase[jj] + kh * khs;
            if (DB + jj < nk) {
                prefetch_row_l2(kd + kbase[DB + jj] + kh * khs, kcs, 128, kes);
                prefetch_row_l2(vd + vbase[DB + jj] + kh * vhs, vcs, a->Dv, ves);
            }
            lkv_bits k0 = rowdt_load(kp, 0, 32, kcs, kt), k1 = rowdt_load(kp, 32, 32, kcs, kt);
            lkv_bits k2 = rowdt_load(kp, 64, 32, kcs, kt), k3 = rowdt_load(kp, 96, 32, kcs, kt);
            lkv_f32 s[4];
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                lkv_f32 s0 = lkv_dot2(lkv_dot2(lkv_zero(), qv[g][0], k0), qv[g][2], k2);
                lkv_f32 s1 = lkv_dot2(lkv_dot2(lkv_zero(), qv[g][1], k1), qv[g][3], k3);
                s[g] = lkv_add(s0, s1);
            }
            __m128 r = _mm_mul_ps(_mm_set1_ps(scale), lkv_hsum4(s[0], s[1], s[2], s[3]));
            _mm_store_ss(out + jj, r);
            _mm_store_ss(out + DB + jj, _mm_movehdup_ps(r));
            _mm_store_ss(out + 2 * DB + jj, _mm_movehl_ps(r, r));
            _mm_store_ss(out + 3 * DB + jj, _mm_permute_ps(r, 0xff));
        }
    }
}

/* sc[h][jj] = the scores of the block's nb keys (row offsets kbase, in bytes) for every
 * head on bf16 pairs, heads in fours (softcap applied); the next block's K and V rows
 * (kbase / vbase [nb, nk)) prefetched into L2 on the way. kcs / vcs: chunk strides
 * (constant 16 for ND rows after inlining) */
LK_ALWAYS_INLINE void scores16_block(const lk_attn_args *a, const uint16_t *q16, const int64_t *kbase,
                                     const int64_t *vbase, int64_t nb, int64_t nk, int64_t kcs, int64_t vcs,
                                     int64_t khs, int64_t vhs, float *sc, int64_t b, lk_dtype kt) {
    const int64_t Hk = a->Hk, G = a->Hq / Hk, D = a->Dqk, Dv = a->Dv, ves = lk_esize(a->vc.dtype), kes = lk_esize(kt);
    const float cap = a->softcap;
    const char *kd = (const char *)a->kc.data, *vd = (const char *)a->vc.data;
    for (int64_t jj = 0; jj < nb; jj++)
        for (int64_t kh = 0; kh < Hk; kh++) {
            const char *kp = kd + kbase[jj] + kh * khs;
            const float scale = qk_scale(a, b, kh);
            if (DB + jj < nk) {
                prefetch_row_l2(kd + kbase[DB + jj] + kh * khs, kcs, D, kes);
                prefetch_row_l2(vd + vbase[DB + jj] + kh * vhs, vcs, Dv, ves);
            }
            for (int64_t g = 0; g < G;) {
                int64_t h = kh * G + g, n = G - g >= 4 ? 4 : 1;
                if (n == 4) dot16_rows(q16 + h * D, D, kp, kcs, D, 4, scale, cap, sc + h * DB + jj, DB, kt);
                else dot16_rows(q16 + h * D, D, kp, kcs, D, 1, scale, cap, sc + h * DB + jj, DB, kt);
                g += n;
            }
        }
}

/* ---- GQA groups of 4 heads x 128 dims, bf16 / fp8 K and V, bf16 out, V dims a multiple
 * of 64 (no softcap, no ALiBi): decode_row_g4.
 * - scores stored key-major, S[j][h] (HQP(Hq) floats a row); bf16 K: each q . k one chain
 *   of four bf16-pair dot products, the four heads' sums reduced side by side (lkv_hsum4,
 *   scores_g4_rows); fp8 K: two keys per vector, 32 codes of each widened at a time,
 *   eight keys per pass (scores_g4, q rows in g4_qdim's order);
 * - the online softmax over 16 heads per vector with no horizontal step: block max,
 *   alpha = exp(m_old - m_new) and l for 16 heads at once (the rules of lk_online_rescale /
 *   _shift / _add; l summed key by key);
 * - P rounded to bf16 pairs pw [DB/2][HQP] (word = keys 2p, 2p + 1 of one head), then
 *   O = alpha O + P.V in one pass per 64 dims, the rescale folded into the block's add;
 * - V rows paired by in-lane unpacks (fp8: the codes of two rows interleaved, then widened
 *   64 at a time by lkv_f8_to_bf16_x2), so O's dims are kept in the unpacks' order within
 *   each 64 (g4_dim) and put back in order at the end of the row. */

/* the dim held at position pos (< 64) of a 64-dim block of O on the g4 path: position
 * 16 i + 4 L + k of accumulator i, 128-bit lane L */
static inline int g4_dim(int pos, int f8) {
    int i = pos / 16, L = pos / 4 % 4, k = pos % 4;
    return f8 ? 16 * L + 4 * i + k : 32 * (i / 2) + 8 * L + 4 * (i % 2) + k;
}
/* the q dim at word i (< 32) of 32-dim block t of a q row ordered for scores_g4 over fp8
 * K: block t = two 256-bit halves h (the q pieces that meet lkv_f8_to_bf16_x2's w0 and
 * w1), each holding dims 32 t + 16 L + 8 h + k at word 8 L + k (L < 2, k < 8) */
static inline int g4_qdim(int i) { return (i & ~24) | (i & 8) << 1 | (i & 16) >> 1; }

/* 64 fp8 codes of the row at p from dim d0 (a multiple of 64), 32-dim tiles cs bytes apart
 * (cs == 32: contiguous); zeros without a read when p is NULL */
LK_ALWAYS_INLINE __m512i codes64(const char *p, int64_t d0, int64_t cs) {
    if (!p) return _mm512_setzero_si512();
    if (cs == 32) return _mm512_loadu_si512(p + d0);
    return lkv_bits_join32(lkv_c32_loadu(p + (d0 >> 5) * cs), lkv_c32_loadu(p + ((d0 >> 5) + 1) * cs));
}

/* S[jj][4 kh + g] = scale_kh * (q_{4 kh + g} . k_jj) (scores16_g4d128's loop, key-major)
 * for the block's nb bf16 K rows (softmax_g4 reads no row past nb), one key at a time,
 * the next block's K rows (kbase [DB, nk)) prefetched into L2 (its V rows: in pv_g4).
 * The 4 heads' q rows stay in 16 registers over the block; each q . k is one chain of
 * four bf16-pair dot products, the 4 heads' sums reduced side by side (lkv_hsum4) and
 * stored as one 4-float row piece. bf16 K keeps this loop: scores_g4's key pairs ran it 8 % faster in L2 / L3
 * but 2-6 % slower from DRAM (8 x 4096 keys, Zen 5). */
LK_ALWAYS_INLINE void scores_g4_rows(const lk_attn_args *a, const uint16_t *q16, const int64_t *kbase, int64_t nb,
                                     int64_t nk, int64_t kcs, int64_t khs, float *S, int64_t sr, int64_t b,
                                     const char *vd, const int64_t *vbase, lk_dtype kt) {
    (void)vd, (void)vbase; /* scores_g4's arguments; bf16 V's rows are prefetched in pv_g4 only */
    const int64_t Hk = a->Hk, kes = lk_esize(kt);
    const char *kd = (const char *)a->kc.data;
    for (int64_t kh = 0; kh < Hk; kh++) {
        const uint16_t *qh = q16 + kh * 4 * 128;
        lkv_bits qv[4][4];
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++)
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) qv[g][c] = lkv_bits_loadu(qh + g * 128 + c * 32);
        const __m128 vs = _mm_set1_ps(qk_scale(a, b, kh));
        float *out = S + 4 * kh;
        for (int64_t jj = 0; jj < nb; jj++) {
            const char *kp = kd + kbase[jj] + kh * khs;
            if (DB + jj < nk) prefetch_row_l2(kd + kbase[DB + jj] + kh * khs, kcs, 128, kes);
            lkv_bits k[4];
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) k[c] = row16_load(kp, 32 * c, 32, kcs);
            lkv_f32 s[4];
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++)
                s[g] = lkv_dot2(lkv_dot2(lkv_dot2(lkv_dot2(lkv_zero(), qv[g][0], k[0]), qv[g][1], k[1]), qv[g][2], k[2]),
                                qv[g][3], k[3]);
            _mm_storeu_ps(out + jj * sr, _mm_mul_ps(vs, lkv_hsum4(s[0], s[1], s[2], s[3])));
        }
    }
}

/* the four lanes of each 128-bit lane L of a0..a3 summed: lane L, element g = the sum of
 * lane L of a_g (in-lane shuffles only) */
static inline __m512 lane_sums4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
    __m512 x = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
    __m512 y = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
    return _mm512_add_ps(_mm512_shuffle_ps(x, y, 0x44), _mm512_shuffle_ps(x, y, 0xee));
}

/* scores_g4_rows for fp8 K: two keys per vector, one in each 256-bit half (32 codes of
 * each widened by lkv_f8_to_bf16_x2 into two vectors), eight keys per pass, so that no
 * horizontal sum is taken per key: each accumulator holds one key pair and one head, its
 * 128-bit lanes 0-1 the first key's partial sums, 2-3 the second's (lane_sums4, then one
 * cross-lane add). q rows in g4_qdim's order, each 256-bit piece stored twice (both
 * halves of one 512-bit load: on Zen 4 a broadcast load takes a shuffle slot beside the
 * dot products, a plain load none; the whole decode 2-4 % fewer cycles per key and KV
 * head in L2). Keys past nb reread row nb - 1 (softmax_g4 reads no score past nb); the
 * next block's K rows are prefetched two per 32-dim step, and so are its V rows where vd
 * is not NULL (V laid out as K: vd + vbase[DB + r] + kh khs; prefetched again in pv_g4:
 * from DRAM on a Zen 4, 1 thread 5-7 % faster than in pv_g4 only, 2 threads 0.94-1.02x;
 * the orders tried: docs/ops.md, Zen 4 paragraph). Zen 5, 4 x 128, against
 * scores_g4_rows on the same codes: the e4m3 loop alone 11.7 vs 18.4 cycles per key and
 * KV head in L1; the whole decode 6-7 % (e4m3) and 13-15 % (e5m2) faster with K / V in
 * L2 / L3 (8 x 256 keys, 1 and 2 threads), unchanged within the noise from DRAM (8 x 4096
 * keys, 2 threads). */
LK_ALWAYS_INLINE void scores_g4(const lk_attn_args *a, const uint16_t *q16, const int64_t *kbase, int64_t nb,
                                int64_t nk, int64_t kcs, int64_t khs, float *S, int64_t sr, int64_t b,
                                const char *vd, const int64_t *vbase, lk_dtype kt) {
    const int64_t Hk = a->Hk;
    const char *kd = (const char *)a->kc.data;
    for (int64_t kh = 0; kh < Hk; kh++) {
        const uint16_t *qh = q16 + kh * 4 * 256; /* [4 heads][4 tiles][2 halves][32 words] */
        const __m512 vs = _mm512_set1_ps(qk_scale(a, b, kh));
        for (int64_t j0 = 0; j0 < nb; j0 += 8) {
            const char *p[8];
            for (int x = 0; x < 8; x++) p[x] = kd + kbase[j0 + x < nb ? j0 + x : nb - 1] + kh * khs;
            lkv_f32 acc[4][4]; /* [key pair][head] */
#pragma GCC unroll 4
            for (int x = 0; x < 4; x++)
#pragma GCC unroll 4
                for (int g = 0; g < 4; g++) acc[x][g] = lkv_zero();
#pragma GCC unroll 4
            for (int t = 0; t < 4; t++) {
                for (int64_t r = j0 + 2 * t; r < j0 + 2 * t + 2 && DB + r < nk; r++) {
                    prefetch_row_l2(kd + kbase[DB + r] + kh * khs, kcs, 128, 1);
                    if (vd) prefetch_row_l2(vd + vbase[DB + r] + kh * khs, kcs, 128, 1);
                }
                lkv_bits w[4][2];
#pragma GCC unroll 4
                for (int x = 0; x < 4; x++) /* 32-code tile t */
                    lkv_f8_to_bf16_x2(lkv_bits_join32(lkv_c32_loadu(p[2 * x] + t * kcs), lkv_c32_loadu(p[2 * x + 1] + t * kcs)),
                                      kt, &w[x][0], &w[x][1]);
#pragma GCC unroll 4
                for (int g = 0; g < 4; g++)
#pragma GCC unroll 2
                    for (int h = 0; h < 2; h++) {
                        lkv_bits qq = _mm512_loadu_si512(qh + (g * 8 + 2 * t + h) * 32);
#pragma GCC unroll 4
                        for (int x = 0; x < 4; x++) acc[x][g] = lkv_dot2(acc[x][g], qq, w[x][h]);
                    }
            }
#pragma GCC unroll 4
            for (int x = 0; x < 4; x++) {
                __m512 z = lane_sums4(acc[x][0], acc[x][1], acc[x][2], acc[x][3]);
                z = _mm512_mul_ps(vs, _mm512_add_ps(z, _mm512_shuffle_f32x4(z, z, 0xb1)));
                _mm_storeu_ps(S + (j0 + 2 * x) * sr + 4 * kh, _mm512_castps512_ps128(z));
                _mm_storeu_ps(S + (j0 + 2 * x + 1) * sr + 4 * kh, _mm512_extractf32x4_ps(z, 2));
            }
        }
    }
}

/* the g4 scores per K dtype, each out of line (its registers its own: inlined into the
 * per-dtype decode copies it slowed their other loops, e.g. MHA e4m3 by 3 %), ND rows
 * (kcs = TILE) a constant */
#define SCORES_G4_FN(name, fn, dt)                                                                     \
    static __attribute__((noinline)) void name(const lk_attn_args *a, const uint16_t *q16,             \
                                               const int64_t *kbase, int64_t nb, int64_t nk, int64_t kcs, \
                                               int64_t khs, float *S, int64_t sr, int64_t b, const char *vd, \
                                               const int64_t *vbase) {                                   \
        if (kcs == TILE(lk_esize(dt)))                                                                 \
            fn(a, q16, kbase, nb, nk, TILE(lk_esize(dt)), khs, S, sr, b, vd, vbase, dt);               \
        else fn(a, q16, kbase, nb, nk, kcs, khs, S, sr, b, vd, vbase, dt);                             \
    }
SCORES_G4_FN(scores_g4_bf16, scores_g4_rows, LK_BF16)
SCORES_G4_FN(scores_g4_e4m3, scores_g4, LK_F8E4M3)
SCORES_G4_FN(scores_g4_e5m2, scores_g4, LK_F8E5M2)

/* the online-softmax step of one block for 16 heads at a time: M, L [sr] the states'
 * m and l, S [DB][sr] scores (times cs [sr] where cs is not NULL; rows past nb read as
 * -inf) -> P = exp(s - shift) rounded to bf16 pairs pw [DB/2][sr], A [sr] alpha =
 * exp(m_old - m_new) (1 where m is unchanged) */
LK_ALWAYS_INLINE void softmax_g4(const float *S, int64_t sr, int64_t nb, float *M, float *L, float *A,
                                 uint32_t *pw, const float *cs) {
    static const uint16_t zip[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                     8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __m512i iz = _mm512_loadu_si512(zip);
    const int64_t np = (nb + 1) / 2;
    for (int64_t h = 0; h < sr; h += LKV_W) {
        const lkv_f32 c = cs ? lkv_loadu(cs + h) : lkv_set1(1.0f);
#define S_AT(jj) (cs ? lkv_mul(lkv_loadu(S + (jj) * sr + h), c) : lkv_loadu(S + (jj) * sr + h))
        lkv_f32 bmax = S_AT(0);
        for (int64_t jj = 1; jj < nb; jj++) bmax = lkv_max(bmax, S_AT(jj));
        lkv_f32 m = lkv_loadu(M + h), mn = lkv_max(m, bmax);
        mn = lkv_blend(mn, lkv_set1(NAN), lkv_unord(m, bmax)); /* lk_nanmax */
        __mmask16 same = _mm512_cmp_ps_mask(mn, m, _CMP_EQ_OQ);
        lkv_f32 alpha = lkv_blend(lkv_exp(lkv_sub(m, mn)), lkv_set1(1.0f), same);
        lkv_f32 shift = lkv_zero_where(_mm512_cmp_ps_mask(mn, lkv_set1(-INFINITY), _CMP_EQ_OQ), mn);
        lkv_f32 l = lkv_mul(lkv_loadu(L + h), alpha);
        for (int64_t p = 0; p < np; p++) {
            /* s - shift <= 0, or NaN (propagated) */
            lkv_f32 p0 = lkv_exp_nonpos(lkv_sub(S_AT(2 * p), shift));
            lkv_f32 p1 = 2 * p + 1 < nb ? lkv_exp_nonpos(lkv_sub(S_AT(2 * p + 1), shift)) : lkv_zero();
            l = lkv_add(lkv_add(l, p0), p1);
            lkv_bits_storeu(pw + p * sr + h, _mm512_permutexvar_epi16(iz, (__m512i)lkv_bf16_pack_rne(p0, p1)));
        }
#undef S_AT
        lkv_storeu(M + h, mn), lkv_storeu(L + h, l), lkv_storeu(A + h, alpha);
    }
}

/* the V rows va, vb (vb NULL: zeros) paired for dims [d0, d0 + 64): w[i] lane 4 L + k =
 * (va, vb) at dim d0 + g4_dim(16 i + 4 L + k) */
LK_ALWAYS_INLINE void v_pairs_g4(const char *va, const char *vb, int64_t d0, int64_t cs, lk_dtype dt, lkv_bits *w) {
    if (dt == LK_BF16) {
        lkv_bits a0 = row16_load(va, d0, 32, cs), a1 = row16_load(va, d0 + 32, 32, cs);
        lkv_bits b0 = row16_load(vb, d0, 32, cs), b1 = row16_load(vb, d0 + 32, 32, cs);
        w[0] = _mm512_unpacklo_epi16(a0, b0), w[1] = _mm512_unpackhi_epi16(a0, b0);
        w[2] = _mm512_unpacklo_epi16(a1, b1), w[3] = _mm512_unpackhi_epi16(a1, b1);
    } else {
        __m512i ca = codes64(va, d0, cs), cb = codes64(vb, d0, cs);
        lkv_f8_to_bf16_x2(_mm512_unpacklo_epi8(ca, cb), dt, &w[0], &w[1]);
        lkv_f8_to_bf16_x2(_mm512_unpackhi_epi8(ca, cb), dt, &w[2], &w[3]);
    }
}

/* o_g = A[g] o_g + sum over the block's key pairs p of P_g[2p, 2p + 1] . V[2p, 2p + 1] for
 * the 4 heads g of one KV head: o_g = o + g D in g4_dim order, P_g word p at pw[p sr + g],
 * V rows v[2p], v[2p + 1] (NULL past the block: zeros), 16-dim chunks cs elements apart */
LK_ALWAYS_INLINE void pv_g4(float *o, const uint32_t *pw, int64_t sr, const float *A, const char *const *v,
                            int64_t npairs, int64_t cs, int64_t D, lk_dtype dt, const char *const *vn, int64_t nn) {
    for (int64_t d0 = 0; d0 < D; d0 += 64) {

        lkv_f32 acc[4][4];
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++)
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) acc[g][i] = lkv_zero();
        for (int64_t p = 0; p < npairs; p++) {
            if (d0 == 0) /* the next block's V rows vn [nn] into L2 again, two per key pair */
                for (int64_t q = 2 * p; q < 2 * p + 2 && q < nn; q++) prefetch_row_l2(vn[q], cs, D, lk_esize(dt));
            lkv_bits w[4];
            v_pairs_g4(v[2 * p], v[2 * p + 1], d0, cs, dt, w);
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                lkv_bits pp = lkv_bits_set1(pw[p * sr + g]);
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++) acc[g][i] = lkv_dot2(acc[g][i], pp, w[i]);
            }
        }
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            lkv_f32 al = lkv_set1(A[g]);
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                float *oi = o + g * D + d0 + 16 * i;
                lkv_storeu(oi, lkv_fma(lkv_loadu(oi), al, acc[g][i]));
            }
        }
    }
}

/* the states' m and l out of M, L [Hq], and O's dims back in order (g4_dim): output
 * vector m of each 64 dims gathered from the four by two two-source permutes and a
 * blend (index e of vector m: position pos with g4_dim(pos) = 16 m + e) */
static inline void g4_finish(lk_online_state *st, float *o, const float *M, const float *L, int64_t Hq, int64_t Dv,
                             lk_dtype vt) {
    int32_t pos_of[64];
    for (int pos = 0; pos < 64; pos++) pos_of[g4_dim(pos, vt != LK_BF16)] = pos;
    __m512i ix[4];
    __mmask16 hi[4];
    for (int m = 0; m < 4; m++) {
        const __m512i p = _mm512_loadu_si512(pos_of + 16 * m);
        ix[m] = _mm512_and_si512(p, _mm512_set1_epi32(31));
        hi[m] = _mm512_cmpge_epi32_mask(p, _mm512_set1_epi32(32));
    }
    for (int64_t h = 0; h < Hq; h++) {
        st[h].m = M[h], st[h].l = L[h];
        for (int64_t d0 = 0; d0 < Dv; d0 += 64) {
            float *oh = o + h * Dv + d0;
            __m512 t0 = _mm512_loadu_ps(oh), t1 = _mm512_loadu_ps(oh + 16);
            __m512 t2 = _mm512_loadu_ps(oh + 32), t3 = _mm512_loadu_ps(oh + 48);
#pragma GCC unroll 4
            for (int m = 0; m < 4; m++)
                _mm512_storeu_ps(oh + 16 * m, _mm512_mask_blend_ps(hi[m], _mm512_permutex2var_ps(t0, ix[m], t1),
                                                                  _mm512_permutex2var_ps(t2, ix[m], t3)));
        }
    }
}

/* the keys [lo, hi] of one query row of request b on the g4 path (rows of keys up to
 * pf_hi >= hi prefetched): states st [Hq], o [Hq][Dv] (zeros on entry), q16 [Hq][128]
 * bf16 rows with room for twice as many after them (fp8 K: scores_g4's q layout) */
LK_ALWAYS_INLINE void decode_row_g4(decode_ctx *c, int64_t b, int64_t lo, int64_t hi, int64_t pf_hi,
                                    lk_online_state *st, float *o, uint16_t *q16, float *sc, lk_dtype kt, lk_dtype vt) {
    const lk_attn_args *a = c->a;
    const int64_t Hq = a->Hq, Hk = a->Hk, Dv = a->Dv, sr = HQP(Hq);
    const int64_t kcs = chunk_stride(&a->kc), vcs = chunk_stride(&a->vc), kes = lk_esize(kt), ves = lk_esize(vt);
    const int64_t khs = head_step(&a->kc) * kes, vhs = head_step(&a->vc) * ves;
    float *S = sc, *M = S + DB * sr, *L = M + sr, *A = L + sr; // S [DB][sr], M, L, A [sr]
    uint32_t *pw = (uint32_t *)(A + sr);                        // [DB / 2][sr]
    if (kt != LK_BF16) { /* q in scores_g4's fp8 order (g4_qdim, within each 32 dims), each
                          * 16-word half twice: qp [Hq][4][2][32] */
        uint16_t *qp = q16 + Hq * 128, ix[32];
        for (int i = 0; i < 32; i++) ix[i] = (uint16_t)g4_qdim(i);
        const __m512i iq = _mm512_loadu_si512(ix);
        for (int64_t h = 0; h < Hq; h++)
            for (int t = 0; t < 4; t++) {
                __m512i x = _mm512_permutexvar_epi16(iq, _mm512_loadu_si512(q16 + h * 128 + 32 * t));
                _mm512_storeu_si512(qp + h * 256 + 64 * t, _mm512_shuffle_i64x2(x, x, 0x44));
                _mm512_storeu_si512(qp + h * 256 + 64 * t + 32, _mm512_shuffle_i64x2(x, x, 0xee));
            }
        q16 = qp;
    }
    for (int64_t h = 0; h < sr; h += LKV_W) lkv_storeu(M + h, lkv_set1(-INFINITY)), lkv_storeu(L + h, lkv_zero());
    /* fp8 K: V's next rows prefetched with K's where laid out alike (scores_g4) */
    const char *vd = kt != LK_BF16 && vt == kt && vcs == kcs && vhs == khs && Dv == 128 ? (const char *)a->vc.data : NULL;
    for (int64_t jb = lo; jb <= hi; jb += DB) {
        int64_t nb = hi - jb + 1 < DB ? hi - jb + 1 : DB;
        int64_t kbase[2 * DB], vbase[2 * DB], nk = pf_hi - jb + 1 < 2 * DB ? pf_hi - jb + 1 : 2 * DB;
        key_offsets(a, &a->kc, b, jb, nk, kbase);
        key_offsets(a, &a->vc, b, jb, nk, vbase);
        if (kt == LK_BF16) scores_g4_bf16(a, q16, kbase, nb, nk, kcs, khs, S, sr, b, NULL, vbase);
        else if (kt == LK_F8E4M3) scores_g4_e4m3(a, q16, kbase, nb, nk, kcs, khs, S, sr, b, vd, vbase);
        else scores_g4_e5m2(a, q16, kbase, nb, nk, kcs, khs, S, sr, b, vd, vbase);
        softmax_g4(S, sr, nb, M, L, A, pw, NULL);
        int64_t np = (nb + 1) / 2;
        for (int64_t kh = 0; kh < Hk; kh++) {
            const char *vp[DB];
            for (int64_t jj = 0; jj < DB; jj++) vp[jj] = jj < nb ? (const char *)a->vc.data + vbase[jj] + kh * vhs : NULL;
            const char *vn[DB]; /* the next block's V rows of this KV head, prefetched into L2 */
            for (int64_t jj = DB; jj < nk; jj++) vn[jj - DB] = (const char *)a->vc.data + vbase[jj] + kh * vhs;
            if (vcs == TILE(ves)) pv_g4(o + 4 * kh * Dv, pw + 4 * kh, sr, A + 4 * kh, vp, np, TILE(ves), Dv, vt, vn, nk - DB);
            else pv_g4(o + 4 * kh * Dv, pw + 4 * kh, sr, A + 4 * kh, vp, np, vcs, Dv, vt, vn, nk - DB);
        }
    }
    g4_finish(st, o, M, L, Hq, Dv, vt);
}

#if defined(LKV_AMX)
/* ---- the AMX build's decode block loop (decode_row_amx): GQA groups of 3 to 16
 * query heads per KV head, fp8 K and V, head dims multiples of 64, bf16 out, no
 * softcap or ALiBi. decode_row_g4's steps with both products on tiles (palette 1;
 * TDPBF16PS C[M][N] f32 += over the pairs k of A[i][k] . B[k][j], up to 16 rows of 64
 * bytes; amx_config sizes each tile), in blocks of DA keys:
 *   Kb  [DA][Dqk] bf16     the block's K rows of one KV head (fp8 widened 64 codes at a
 *                          time by lkv_f8_to_bf16_x2, in its order)
 *   Qa  [Hk][Dqk/32][16][G] words  the G query rows of each KV head as B tiles: pair k of
 *                          a 32-dim piece x column g, in Kb's order
 *   S   [DA][sr] f32       C = Kb (A, 16 keys x 32 dims) . Qa: 16 keys x G columns per
 *                          tile, stored at column G kh (rows past the block read as -inf)
 *   then softmax_g4 over the heads in the vector lanes (S times the heads' scales as read),
 *   P rounded to bf16 pairs pw [DA/2][sr], transposed to Pt [sr][16] (16 pairs per head);
 *   Vb  [Dv/16][16][16] words  the block's V rows of one KV head as pairs (v_pairs_g4: two
 *                          keys' values of one dim per word, keys past the block 0; O's
 *                          dims in g4_dim order)
 *   O   += Pt (A, the KV head's G rows) . Vb: G rows x 16 dims a tile, one product per 16
 *          dims and block, added to alpha O in vector registers.
 * A tile product costs the same whatever the rows and columns used (Sapphire Rapids
 * class: ~18.5 cycles at 16, 4 or 1 rows), and one takes 1 KiB of K or V in bf16, so the
 * cost follows the K / V bytes, not the heads: 32 keys x 128 dims of one KV head are 8
 * products (K and V) against 128 VDPBF16PS for 4 heads on the register path. The tile
 * configuration is
 * loaded per query row and chunk and released at its end. */
#define DA 32
/* per-thread floats: S, M, L, A, CS, pw, Pt, Qa, Kb, Vb, Ot (all multiples of 16) */
#define AMX_FLOATS(Hq, Hk, Dqk, Dv) \
    (HQP(Hq) * (DA + 4 + DA / 2 + 16) + (Hq) * (Dqk) / 2 + DA * (Dqk) / 2 + (Dv) * 16 + 512 + 16)

/* tiles 0, 1: S, 16 keys x G columns; 2, 3: Kb (16 keys x 32 dims) or Vb (16 pairs x 16
 * dims); 4: Qa (16 pairs x G columns); 5, 6: O, G rows x 16 dims; 7: Pt, G rows x 16 pairs.
 * Only the G heads' rows and columns are loaded and stored (a tile store costs by rows:
 * 16 x 64 bytes ~5 ns here) */
static void amx_config(int64_t G) {
    lkv_amx_cfg cfg;
    lkv_amx_cfg_init(&cfg);
    cfg.colsb[0] = cfg.colsb[1] = cfg.colsb[4] = (uint16_t)(4 * G);
    cfg.rows[5] = cfg.rows[6] = cfg.rows[7] = (uint8_t)G;
    lkv_amx_load_config(&cfg);
}

/* the dim of word i (< 32) of vector c (< 2) that lkv_f8_to_bf16_x2 makes of 64 fp8 codes */
static inline int x2_dim(int c, int i) { return 16 * (i / 8) + 8 * c + i % 8; }

/* one K row of Dqk fp8 codes at p (32-dim tiles cs bytes apart) as bf16 in Kb's order
 * (lkv_f8_to_bf16_x2's per 64 dims: position i of a 64 holds dim x2_dim(i / 32, i % 32));
 * a zero row when p is NULL */
LK_ALWAYS_INLINE void amx_k_row(uint16_t *dst, const char *p, int64_t Dqk, int64_t cs, lk_dtype kt) {
    for (int64_t d0 = 0; d0 < Dqk; d0 += 64) {
        lkv_bits k0, k1;
        lkv_f8_to_bf16_x2(codes64(p, d0, cs), kt, &k0, &k1);
        lkv_bits_storeu(dst + d0, k0);
        lkv_bits_storeu(dst + d0 + 32, k1);
    }
}

LK_ALWAYS_INLINE void decode_row_amx(decode_ctx *c, int64_t b, int64_t lo, int64_t hi, int64_t pf_hi,
                                     lk_online_state *st, float *o, const uint16_t *q16, float *sc, lk_dtype kt,
                                     lk_dtype vt, const int64_t G, const int64_t Dqk, const int64_t Dv,
                                     const int64_t kcs, const int64_t vcs) {
    const lk_attn_args *a = c->a;
    const int64_t Hq = a->Hq, Hk = a->Hk, sr = HQP(Hq), TQ = Dqk / 32;
    const int64_t kes = lk_esize(kt), ves = lk_esize(vt);
    const int64_t khs = head_step(&a->kc) * kes, vhs = head_step(&a->vc) * ves;
    float *S = sc, *M = S + DA * sr, *L = M + sr, *A = L + sr, *CS = A + sr; // S [DA][sr]; M, L, A, CS [sr]
    uint32_t *pw = (uint32_t *)(CS + sr);                                  // [DA / 2][sr]
    uint32_t *Pt = pw + DA / 2 * sr;                                       // [sr][16]
    uint32_t *Qa = Pt + sr * 16;                                           // [Hk][TQ][16][G]
    uint16_t *Kb = (uint16_t *)(Qa + Hq * Dqk / 2);                        // [DA][Dqk]
    uint32_t *Vb = (uint32_t *)(Kb + DA * Dqk);                            // [Dv / 16][16][16]
    float *Ot = (float *)(Vb + Dv * 16);                                   // [2][16][16]
    const char *kd = (const char *)a->kc.data, *vd = (const char *)a->vc.data;
    /* Qa: every query row's words (dim pairs in Kb's order: 64 dims at a time permuted by
     * one VPERMI2W per 32 words) into column g of its KV head */
    uint16_t perm[64];
    for (int i = 0; i < 64; i++) perm[i] = (uint16_t)x2_dim(i / 32, i % 32);
    const __m512i pm0 = _mm512_loadu_si512(perm), pm1 = _mm512_loadu_si512(perm + 32);
    for (int64_t h = 0; h < Hq; h++) {
        const uint16_t *q = q16 + h * Dqk;
        uint32_t *col = Qa + (h / G) * TQ * 16 * G + h % G, qw[32];
        for (int64_t d0 = 0; d0 < Dqk; d0 += 64) { /* words w = d0 / 2 + i: piece w / 16, pair w % 16 */
            __m512i q0 = _mm512_loadu_si512(q + d0), q1 = _mm512_loadu_si512(q + d0 + 32);
            _mm512_storeu_si512(qw, _mm512_permutex2var_epi16(q0, pm0, q1));
            _mm512_storeu_si512(qw + 16, _mm512_permutex2var_epi16(q0, pm1, q1));
            for (int64_t i = 0; i < 32; i++) col[(d0 / 2 + i) * G] = qw[i];
        }
    }
    memset(S, 0, sizeof(float) * (size_t)(DA * sr)); /* columns no tile writes, once */
    for (int64_t h = 0; h < sr; h++) {
        M[h] = -INFINITY, L[h] = 0.0f;
        CS[h] = h < Hq ? qk_scale(a, b, h / G) : 0.0f;
    }
    amx_config(G);
    for (int64_t jb = lo; jb <= hi; jb += DA) {
        int64_t nb = hi - jb + 1 < DA ? hi - jb + 1 : DA, np = (nb + 1) / 2;
        int64_t kbase[2 * DA], vbase[2 * DA], nk = pf_hi - jb + 1 < 2 * DA ? pf_hi - jb + 1 : 2 * DA;
        key_offsets(a, &a->kc, b, jb, nk, kbase);
        key_offsets(a, &a->vc, b, jb, nk, vbase);
        /* S = K . q for every KV head; the next block's K rows into L2 meanwhile */
        for (int64_t kh = 0; kh < Hk; kh++) {
            for (int64_t jj = 0; jj < DA; jj++) {
                if (DA + jj < nk) prefetch_row_l2(kd + kbase[DA + jj] + kh * khs, kcs, Dqk, kes);
                const char *kp = jj < nb ? kd + kbase[jj] + kh * khs : NULL;
                if (kp || kh == 0) amx_k_row(Kb + jj * Dqk, kp, Dqk, kcs, kt);
            }
            _tile_zero(0);
            _tile_zero(1);
            for (int64_t t = 0; t < TQ; t++) {
                _tile_loadd(2, Kb + 32 * t, Dqk * 2);
                _tile_loadd(3, Kb + 16 * Dqk + 32 * t, Dqk * 2);
                _tile_loadd(4, Qa + (kh * TQ + t) * 16 * G, 4 * G);
                _tile_dpbf16ps(0, 2, 4);
                _tile_dpbf16ps(1, 3, 4);
            }
            _tile_stored(0, S + G * kh, sr * 4);
            _tile_stored(1, S + 16 * sr + G * kh, sr * 4);
        }
        softmax_g4(S, sr, nb, M, L, A, pw, CS); /* S times the heads' scales, rows past nb -inf */
        /* Pt [h][p] = pw [p][h]: 16 pairs x 16 heads at a time (pairs past the block 0) */
        for (int64_t h0 = 0; h0 < Hq; h0 += LKV_W) {
            lkv_f32 v[LKV_W];
            for (int64_t p = 0; p < LKV_W; p++) v[p] = p < np ? lkv_loadu((const float *)pw + p * sr + h0) : lkv_zero();
            lkv_transpose(v);
            for (int64_t i = 0; i < LKV_W; i++) lkv_storeu((float *)Pt + (h0 + i) * 16, v[i]);
        }
        /* O = alpha O + P . V per KV head; the next block's V rows into L2, two per pair */
        for (int64_t kh = 0; kh < Hk; kh++) {
            for (int64_t p = 0; p < 16; p++) {
                for (int64_t q = DA + 2 * p; q < DA + 2 * p + 2 && q < nk; q++)
                    prefetch_row_l2(vd + vbase[q] + kh * vhs, vcs, Dv, ves);
                const char *va = 2 * p < nb ? vd + vbase[2 * p] + kh * vhs : NULL;
                const char *vb = 2 * p + 1 < nb ? vd + vbase[2 * p + 1] + kh * vhs : NULL;
                for (int64_t d0 = 0; d0 < Dv; d0 += 64) {
                    lkv_bits w[4];
                    v_pairs_g4(va, vb, d0, vcs, vt, w);
                    for (int i = 0; i < 4; i++) lkv_bits_storeu(Vb + ((d0 / 16 + i) * 16 + p) * 16, w[i]);
                }
            }
            _tile_loadd(7, Pt + G * kh * 16, 64);
            for (int64_t j = 0; j < Dv / 16; j += 2) {
                _tile_zero(5);
                _tile_zero(6);
                _tile_loadd(2, Vb + j * 256, 64);
                _tile_loadd(3, Vb + (j + 1) * 256, 64);
                _tile_dpbf16ps(5, 7, 2);
                _tile_dpbf16ps(6, 7, 3);
                _tile_stored(5, Ot, 64);
                _tile_stored(6, Ot + 256, 64);
                for (int64_t g = 0; g < G; g++) {
                    int64_t h = kh * G + g;
                    lkv_f32 al = lkv_set1(A[h]);
                    float *oh = o + h * Dv + 16 * j;
                    lkv_storeu(oh, lkv_fma(lkv_loadu(oh), al, lkv_loadu(Ot + g * 16)));
                    lkv_storeu(oh + 16, lkv_fma(lkv_loadu(oh + 16), al, lkv_loadu(Ot + 256 + g * 16)));
                }
            }
        }
    }
    _tile_release();
    g4_finish(st, o, M, L, Hq, Dv, vt);
}

/* decode_row_amx with the common shape's sizes as constants (4 query heads per KV head,
 * 128 dims, ND rows), so that its row loops unroll, else read from the arguments; out of
 * line per fp8 pair (its registers its own). e4m3, 8 x 256 keys, 1 thread: 1.10-1.50x
 * faster than with the sizes read from the arguments, and 2-4 % from leaving the per-dtype
 * decode copies */
LK_ALWAYS_INLINE void amx_row(decode_ctx *c, int64_t b, int64_t lo, int64_t hi, int64_t pf_hi, lk_online_state *st,
                              float *o, const uint16_t *q16, float *sc, lk_dtype kt, lk_dtype vt) {
    const lk_attn_args *a = c->a;
    const int64_t G = a->Hq / a->Hk, kcs = chunk_stride(&a->kc), vcs = chunk_stride(&a->vc);
    if (G == 4 && a->Dqk == 128 && a->Dv == 128 && kcs == 32 && vcs == 32)
        decode_row_amx(c, b, lo, hi, pf_hi, st, o, q16, sc, kt, vt, 4, 128, 128, 32, 32);
    else
        decode_row_amx(c, b, lo, hi, pf_hi, st, o, q16, sc, kt, vt, G, a->Dqk, a->Dv, kcs, vcs);
}
#define AMX_ROW_ARGS                                                                                \
    decode_ctx *c, int64_t b, int64_t lo, int64_t hi, int64_t pf_hi, lk_online_state *st, float *o, \
        const uint16_t *q16, float *sc
static __attribute__((noinline)) void amx_row_e4m3(AMX_ROW_ARGS) {
    amx_row(c, b, lo, hi, pf_hi, st, o, q16, sc, LK_F8E4M3, LK_F8E4M3);
}
static __attribute__((noinline)) void amx_row_e5m2(AMX_ROW_ARGS) {
    amx_row(c, b, lo, hi, pf_hi, st, o, q16, sc, LK_F8E5M2, LK_F8E5M2);
}
static __attribute__((noinline)) void amx_row_any(AMX_ROW_ARGS, lk_dtype kt, lk_dtype vt) {
    amx_row(c, b, lo, hi, pf_hi, st, o, q16, sc, kt, vt);
}
#undef AMX_ROW_ARGS
#endif

/* o + i W (i < 4, dims < D) += acc[i] */
LK_ALWAYS_INLINE void add_out4(float *o, int64_t D, lkv_f32 a0, lkv_f32 a1, lkv_f32 a2, lkv_f32 a3) {
    lkv_f32 acc[4] = {a0, a1, a2, a3};
    for (int i = 0; i < 4 && i * LKV_W < D; i++) {
        float *oi = o + i * LKV_W;
        if (D - i * LKV_W >= LKV_W) lkv_storeu(oi, lkv_add(lkv_loadu(oi), acc[i]));
        else lkv_store_part(oi, LK_F32, lkv_add(lkv_load_part(oi, LK_F32, D - i * LKV_W), acc[i]), D - i * LKV_W);
    }
}

/* o_g[0, D) += sum over the block's keys j of P_g[j] V[j] for n (1 or 4) heads g: o_g =
 * o + g os, P_g = pw + g ps as bf16 pairs (word p = keys 2p, 2p + 1), V rows v[2p],
 * v[2p + 1] (NULL past the block end: zeros, never read) with 16-dim chunks cs elements
 * apart. Passes of 4W dims: each pair of rows zipped once into pairs of one dim
 * (lkv_zip16), 4 f32 accumulators per head, the block's sum added to o once. */
LK_ALWAYS_INLINE void pv16_rows(float *o, int64_t os, const uint32_t *pw, int64_t ps, const char *const *v,
                                int64_t npairs, int64_t cs, int64_t D, int n, lk_dtype dt) {
    for (int64_t d0 = 0; d0 < D; d0 += 4 * LKV_W) {
        int64_t m0 = D - d0 < 2 * LKV_W ? D - d0 : 2 * LKV_W, m1 = D - d0 - m0 < 2 * LKV_W ? D - d0 - m0 : 2 * LKV_W;
        lkv_f32 c0[4], c1[4], c2[4], c3[4];
#pragma GCC unroll 4
        for (int g = 0; g < n; g++) c0[g] = c1[g] = c2[g] = c3[g] = lkv_zero();
        for (int64_t p = 0; p < npairs; p++) {
            lkv_bits lo0, hi0, lo1, hi1;
            lkv_zip16(rowdt_load(v[2 * p], d0, m0, cs, dt), rowdt_load(v[2 * p + 1], d0, m0, cs, dt), &lo0, &hi0);
            lkv_zip16(rowdt_load(v[2 * p], d0 + 2 * LKV_W, m1, cs, dt), rowdt_load(v[2 * p + 1], d0 + 2 * LKV_W, m1, cs, dt),
                      &lo1, &hi1);
#pragma GCC unroll 4
            for (int g = 0; g < n; g++) {
                lkv_bits w = lkv_bits_set1(pw[g * ps + p]);
                c0[g] = lkv_dot2(c0[g], w, lo0);
                c1[g] = lkv_dot2(c1[g], w, hi0);
                c2[g] = lkv_dot2(c2[g], w, lo1);
                c3[g] = lkv_dot2(c3[g], w, hi1);
            }
        }
#pragma GCC unroll 4
        for (int g = 0; g < n; g++) add_out4(o + g * os + d0, D - d0, c0[g], c1[g], c2[g], c3[g]);
    }
}
#endif

/* o += w0 v0 + w1 v1 + w2 v2 + w3 v3 (rows of D dims, 16-dim chunks cs apart) */
LK_ALWAYS_INLINE void axpy4_row(float *o, const float *w, const char *const *v, int64_t cs, int64_t D, lk_dtype dt) {
    int64_t es = lk_esize(dt), d = 0;
    lkv_f32 w0 = lkv_set1(w[0]), w1 = lkv_set1(w[1]), w2 = lkv_set1(w[2]), w3 = lkv_set1(w[3]);
    for (; d + LKV_W <= D; d += LKV_W) {
        int64_t off = chunk_off(d, cs, es);
        lkv_f32 acc = lkv_loadu(o + d);
        acc = lkv_fma(w0, lkv_load(v[0] + off, dt), acc);
        acc = lkv_fma(w1, lkv_load(v[1] + off, dt), acc);
        acc = lkv_fma(w2, lkv_load(v[2] + off, dt), acc);
        acc = lkv_fma(w3, lkv_load(v[3] + off, dt), acc);
        lkv_storeu(o + d, acc);
    }
    if (d < D) {
        int64_t off = chunk_off(d, cs, es), n = D - d;
        lkv_f32 acc = lkv_load_part(o + d, LK_F32, n);
        acc = lkv_fma(w0, lkv_load_part(v[0] + off, dt, n), acc);
        acc = lkv_fma(w1, lkv_load_part(v[1] + off, dt, n), acc);
        acc = lkv_fma(w2, lkv_load_part(v[2] + off, dt, n), acc);
        acc = lkv_fma(w3, lkv_load_part(v[3] + off, dt, n), acc);
        lkv_store_part(o + d, LK_F32, acc, n);
    }
}

/* axpy4_row for 4 output rows o + g Dv (g < 4) with weights w[4 g, 4 g + 4) over the
 * same 4 value rows: each value vector loaded and converted once for the 4; per row
 * the same operations in the same order as axpy4_row */
LK_ALWAYS_INLINE void axpy4_rows4(float *o, const float *w, const char *const *v, int64_t cs, int64_t D,
                                  lk_dtype dt) {
    int64_t es = lk_esize(dt), d = 0;
    for (; d + LKV_W <= D; d += LKV_W) {
        int64_t off = chunk_off(d, cs, es);
        lkv_f32 v0 = lkv_load(v[0] + off, dt), v1 = lkv_load(v[1] + off, dt);
        lkv_f32 v2 = lkv_load(v[2] + off, dt), v3 = lkv_load(v[3] + off, dt);
        for (int g = 0; g < 4; g++) {
            const float *wg = w + 4 * g;
            lkv_f32 acc = lkv_loadu(o + g * D + d);
            acc = lkv_fma(lkv_set1(wg[0]), v0, acc);
            acc = lkv_fma(lkv_set1(wg[1]), v1, acc);
            acc = lkv_fma(lkv_set1(wg[2]), v2, acc);
            acc = lkv_fma(lkv_set1(wg[3]), v3, acc);
            lkv_storeu(o + g * D + d, acc);
        }
    }
    if (d < D) {
        int64_t off = chunk_off(d, cs, es), n = D - d;
        lkv_f32 v0 = lkv_load_part(v[0] + off, dt, n), v1 = lkv_load_part(v[1] + off, dt, n);
        lkv_f32 v2 = lkv_load_part(v[2] + off, dt, n), v3 = lkv_load_part(v[3] + off, dt, n);
        for (int g = 0; g < 4; g++) {
            const float *wg = w + 4 * g;
            lkv_f32 acc = lkv_load_part(o + g * D + d, LK_F32, n);
            acc = lkv_fma(lkv_set1(wg[0]), v0, acc);
            acc = lkv_fma(lkv_set1(wg[1]), v1, acc);
            acc = lkv_fma(lkv_set1(wg[2]), v2, acc);
            acc = lkv_fma(lkv_set1(wg[3]), v3, acc);
            lkv_store_part(o + g * D + d, LK_F32, acc, n);
        }
    }
}

/* o += w0 v0 + ... for the n < 4 keys left at a block end (padding them with weight 0
 * would turn an infinite V value into NaN: 0 * inf) */
LK_ALWAYS_INLINE void axpyn_row(float *o, const float *w, const char *const *v, int n, int64_t cs, int64_t D,
                                lk_dtype dt) {
    int64_t es = lk_esize(dt);
    for (int64_t d = 0; d < D; d += LKV_W) {
        int64_t off = chunk_off(d, cs, es), m = D - d < LKV_W ? D - d : LKV_W;
        lkv_f32 acc = lkv_load_part(o + d, LK_F32, m);
        for (int k = 0; k < n; k++) acc = lkv_fma(lkv_set1(w[k]), lkv_load_part(v[k] + off, dt, m), acc);
        lkv_store_part(o + d, LK_F32, acc, m);
    }
}

/* o[0, D) *= alpha */
static void scale_row(float *o, int64_t D, float alpha) {
    lkv_f32 va = lkv_set1(alpha);
    int64_t d = 0;
    for (; d + LKV_W <= D; d += LKV_W) lkv_storeu(o + d, lkv_mul(lkv_loadu(o + d), va));
    if (d < D) lkv_store_part(o + d, LK_F32, lkv_mul(lkv_load_part(o + d, LK_F32, D - d), va), D - d);
}

#if defined(DECODE_G4F)
/* ---- the f32 GQA block loop (AVX2 and AVX-512; with AVX512_BF16 for fp8 K / V where
 * neither bf16 P.V loop nor the tiles apply): decode_row_g4's shape on f32 FMAs
 * The query heads of a KV head go in groups of 4, then 2, then 1 (group_size); head dims
 * multiples of 2W. Per block of DB keys, KV head and group: each K row converted once for
 * the group (2W dims per step into two vectors, q read from L1; a group of 4: one key at
 * a time, 2 accumulators a head; of 2 or 1: 12 / ng keys at a time, one accumulator per
 * key and head, so that 12 FMA chains hide the FMA latency), the sums reduced side by
 * side (lkv_hsum4_store) into key-major scores S[j][h]; one online-softmax step over
 * W heads per vector (P kept in f32, in S); then per 4 / ng pieces of 2W dims of V the
 * group's 8 accumulators start from alpha * O and take every key of the block (V
 * converted once for the group), stored once. Row dims are converted in the order of
 * load2_raw: on AVX2 bf16 even / odd within 2W dims (q permuted alike once per row, O put
 * back at the row's end), else in order. fp8 K/V through f16 words (lkv_load2_f8_raw,
 * 2W codes: one 32-dim tile on AVX-512): e4m3 is read as value / 256, the
 * scores and O multiplied back by 256 (exact), and its NaN code, which reads as a finite
 * value, found per block and KV head by maxima of the codes as they are converted
 * (lkv_load2_f8_raw) and put in afterwards: a NaN
 * in K makes the key's scores NaN for the KV head's heads, a NaN in V dim d makes O's dim
 * d NaN for them, whatever the weight, as the reference's sums do. */

/* element e (< 2W) of the two vectors of load2_raw is dim g4f_dim(e) of the 2W */
static inline int g4f_dim(int e, lk_dtype dt) {
    return dt == LK_BF16 && LKV_W == 8 ? (e < LKV_W ? 2 * e : 2 * (e - LKV_W) + 1) : e;
}

/* dims [d0, d0 + 2W) of the K/V row at `row` (tiles cs elements apart) as two f32 vectors,
 * in g4f_dim order; e4m3 / 256 with its NaN code finite, its codes folded into *nan
 * (lkv_e4m3_nan_found's maxima). 2W fp8 codes are one tile, as are AVX2's 16 dims
 * of a wider dtype; AVX-512's 32 such dims are two */
LK_ALWAYS_INLINE void load2_raw(const char *row, int64_t d0, int64_t cs, lk_dtype dt, lkv_f32 *a, lkv_f32 *b,
                                lkv_c32 *nan) {
    const int64_t es = lk_esize(dt);
    const char *p = row + chunk_off(d0, cs, es);
    if (lk_is_fp8(dt)) lkv_load2_f8_raw(p, dt, a, b, dt == LK_F8E4M3 ? nan : NULL);
    else if (dt == LK_BF16 && LKV_W == 8) lkv_bf16_load_eo(p, a, b);
    else *a = lkv_load(p, dt), *b = lkv_load(row + chunk_off(d0 + LKV_W, cs, es), dt);
}

/* whether dim d of the fp8 row at p (32-code tiles cs bytes apart) is an e4m3 NaN code,
 * and whether any of its D dims is (byte by byte: the rare block where the folded check
 * found one) */
static inline int e4m3_nan_at(const char *p, int64_t cs, int64_t d) {
    return (p[dim_off(0, cs, d, 1)] & 0x7f) == 0x7f;
}
static int row_e4m3_nan(const char *p, int64_t cs, int64_t D) {
    for (int64_t d = 0; d < D; d++)
        if (e4m3_nan_at(p, cs, d)) return 1;
    return 0;
}

/* the heads of a KV head go in groups of 4, then one of 2, then one of 1 (G = 7: 4 + 2 +
 * 1): ng of the group starting at head g0 of the G */
static inline int group_size(int64_t G, int64_t g0) { return G - g0 >= 4 ? 4 : G - g0 >= 2 ? 2 : 1; }

/* whether dim d of a row (16-dim chunks cs elements apart) starts a 64-byte line of it:
 * the lines a prefetch_row_l2 of the row takes */
static inline int starts_line(int64_t d, int64_t cs, int64_t es) {
    return cs == TILE(es) ? d * es % 64 == 0 : d % TILE(es) == 0;
}

/* the lines of the 2W dims from d0 of the row at `row` that start a line (starts_line) into L2 */
LK_ALWAYS_INLINE void prefetch_piece(const char *row, int64_t d0, int64_t cs, int64_t es) {
    for (int64_t d = d0; d < d0 + 2 * LKV_W; d += LKV_W)
        if (starts_line(d, cs, es)) lkv_prefetch_l2(row + chunk_off(d, cs, es));
}

/* S[t][g] (rows sr apart) = f * q_g . k_t for the ng (2 or 1) heads of q (rows D apart) and
 * the nk keys of k (2W-dim pieces at chunk offsets, cs elements apart): one accumulator
 * per (key, head), ng * nk of them (12 at most: FMA chains enough to hide its latency);
 * the next block's rows kn [nn] of these keys prefetched into L2 a line per piece (see
 * "software prefetch" above) */
LK_ALWAYS_INLINE void scores_keys(const float *q, int64_t D, int ng, int nk, const char *const *k, int64_t cs,
                                  lk_dtype kt, float f, float *S, int64_t sr, const char *const *kn, int64_t nn,
                                  lkv_c32 *nan) {
    const int64_t es = lk_esize(kt);
    lkv_f32 acc[12]; /* all zeroed: the last lkv_hsum4_store may read unused ones */
#pragma GCC unroll 12
    for (int i = 0; i < 12; i++) acc[i] = lkv_zero();
    for (int64_t d0 = 0; d0 < D; d0 += 2 * LKV_W) {
#pragma GCC unroll 12
        for (int t = 0; t < nk; t++) {
            if (t < nn) prefetch_piece(kn[t], d0, cs, es);
            lkv_f32 k0, k1;
            load2_raw(k[t], d0, cs, kt, &k0, &k1, nan);
#pragma GCC unroll 4
            for (int g = 0; g < ng; g++) {
                acc[t * ng + g] = lkv_fma(lkv_loadu(q + g * D + d0), k0, acc[t * ng + g]);
                acc[t * ng + g] = lkv_fma(lkv_loadu(q + g * D + d0 + LKV_W), k1, acc[t * ng + g]);
            }
        }
    }
    float r[12]; /* 4 (key, head) sums at a time, i = t ng + g */
#pragma GCC unroll 3
    for (int i = 0; i < ng * nk; i += 4) lkv_hsum4_store(r + i, f, acc[i], acc[i + 1], acc[i + 2], acc[i + 3]);
    for (int i = 0; i < ng * nk; i++) S[(i / ng) * sr + i % ng] = r[i];
}

/* scores_keys over the keys [jj, nb) of a block nk at a time while nk are left (the next
 * block's rows kn [nn] of those keys prefetched into L2 as it goes); the first key not done */
LK_ALWAYS_INLINE int64_t scores_keys_from(const float *q, int64_t D, int ng, int nk, const char *const *k, int64_t nb,
                                          int64_t cs, lk_dtype kt, float f, float *S, int64_t sr,
                                          const char *const *kn, int64_t nn, int64_t jj, lkv_c32 *nan) {
    for (; jj + nk <= nb; jj += nk) scores_keys(q, D, ng, nk, k + jj, cs, kt, f, S + jj * sr, sr, kn + jj, nn - jj, nan);
    return jj;
}

/* S[jj][h0 + g] = scores of the block's nb keys for the ng (4, 2 or 1) heads h0 + g, K rows
 * k [nb] (2W-dim pieces at chunk offsets, cs elements apart); the next block's rows kn
 * [nn] prefetched into L2, one per key. 4 heads: one key at a time, two accumulators per
 * head (the halves of each 2W); fewer: 12 / ng keys at a time, then 4 / ng, then one, by
 * scores_keys (a key's sums are the same in each). */
LK_ALWAYS_INLINE void scores_group(const float *q, int64_t D, int ng, const char *const *k, int64_t nb, int64_t cs,
                                   lk_dtype kt, float f, float *S, int64_t sr, const char *const *kn, int64_t nn,
                                   lkv_c32 *nan) {
    const int64_t es = lk_esize(kt);
    if (ng < 4) {
        int64_t jj = scores_keys_from(q, D, ng, 12 / ng, k, nb, cs, kt, f, S, sr, kn, nn, 0, nan);
        jj = scores_keys_from(q, D, ng, 4 / ng, k, nb, cs, kt, f, S, sr, kn, nn, jj, nan);
        scores_keys_from(q, D, ng, 1, k, nb, cs, kt, f, S, sr, kn, nn, jj, nan);
        return;
    }
    int64_t jj = 0;
    for (; LKV_W == 16 && jj + 2 <= nb; jj += 2) { /* AVX-512: two keys a pass, 16 FMA chains */
        if (jj < nn) prefetch_row_l2(kn[jj], cs, D, es);
        if (jj + 1 < nn) prefetch_row_l2(kn[jj + 1], cs, D, es);
        lkv_f32 acc[2][4][2];
#pragma GCC unroll 8
        for (int g = 0; g < 8; g++) acc[g / 4][g % 4][0] = acc[g / 4][g % 4][1] = lkv_zero();
        for (int64_t d0 = 0; d0 < D; d0 += 2 * LKV_W) {
            lkv_f32 k0, k1, k2, k3;
            load2_raw(k[jj], d0, cs, kt, &k0, &k1, nan);
            load2_raw(k[jj + 1], d0, cs, kt, &k2, &k3, nan);
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                lkv_f32 q0 = lkv_loadu(q + g * D + d0), q1 = lkv_loadu(q + g * D + d0 + LKV_W);
                acc[0][g][0] = lkv_fma(q0, k0, acc[0][g][0]);
                acc[0][g][1] = lkv_fma(q1, k1, acc[0][g][1]);
                acc[1][g][0] = lkv_fma(q0, k2, acc[1][g][0]);
                acc[1][g][1] = lkv_fma(q1, k3, acc[1][g][1]);
            }
        }
#pragma GCC unroll 2
        for (int t = 0; t < 2; t++)
            lkv_hsum4_store(S + (jj + t) * sr, f, lkv_add(acc[t][0][0], acc[t][0][1]), lkv_add(acc[t][1][0], acc[t][1][1]),
                            lkv_add(acc[t][2][0], acc[t][2][1]), lkv_add(acc[t][3][0], acc[t][3][1]));
    }
    for (; jj < nb; jj++) { /* the last, odd key */
        if (jj < nn) prefetch_row_l2(kn[jj], cs, D, es);
        lkv_f32 acc[4][2];
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) acc[g][0] = acc[g][1] = lkv_zero();
        for (int64_t d0 = 0; d0 < D; d0 += 2 * LKV_W) {
            lkv_f32 k0, k1;
            load2_raw(k[jj], d0, cs, kt, &k0, &k1, nan);
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                acc[g][0] = lkv_fma(lkv_loadu(q + g * D + d0), k0, acc[g][0]);
                acc[g][1] = lkv_fma(lkv_loadu(q + g * D + d0 + LKV_W), k1, acc[g][1]);
            }
        }
        lkv_hsum4_store(S + jj * sr, f, lkv_add(acc[0][0], acc[0][1]), lkv_add(acc[1][0], acc[1][1]),
                        lkv_add(acc[2][0], acc[2][1]), lkv_add(acc[3][0], acc[3][1]));
    }
}

/* S[jj][h] = scores of the block's nb keys for every head (K rows kbase [nb], the next
 * block's [nb, nk) prefetched into L2), q rows qs [Hq][D] scaled and in g4f_dim order */
LK_ALWAYS_INLINE void scores_g4f(const lk_attn_args *a, const float *qs, const int64_t *kbase, int64_t nb,
                                 int64_t nk, int64_t kcs, int64_t khs, float *S, int64_t sr, lk_dtype kt) {
    const int64_t Hk = a->Hk, G = a->Hq / Hk, D = a->Dqk;
    const char *kd = (const char *)a->kc.data;
    const float f = kt == LK_F8E4M3 ? 256.0f : 1.0f;
    for (int64_t kh = 0; kh < Hk; kh++) {
        const char *kp[DB], *kn[DB];
        lkv_c32 m = lkv_c32_zero(); /* e4m3: maxima of every code read (load2_raw) */
        for (int64_t jj = 0; jj < nb; jj++) kp[jj] = kd + kbase[jj] + kh * khs;
        for (int64_t jj = DB; jj < nk; jj++) kn[jj - DB] = kd + kbase[jj] + kh * khs;
        for (int64_t g0 = 0; g0 < G;) {
            int ng = group_size(G, g0);
            int64_t h0 = kh * G + g0, nn = g0 == 0 ? nk - DB : 0;
            if (ng == 4) scores_group(qs + h0 * D, D, 4, kp, nb, kcs, kt, f, S + h0, sr, kn, nn, &m);
            else if (ng == 2) scores_group(qs + h0 * D, D, 2, kp, nb, kcs, kt, f, S + h0, sr, kn, nn, &m);
            else scores_group(qs + h0 * D, D, 1, kp, nb, kcs, kt, f, S + h0, sr, kn, nn, &m);
            g0 += ng;
        }
        if (kt == LK_F8E4M3) { /* a NaN code among the block's K rows (folded as they were read) */
            if (lkv_e4m3_nan_found(m))
                for (int64_t jj = 0; jj < nb; jj++)
                    if (row_e4m3_nan(kp[jj], kcs, D))
                        for (int64_t g = 0; g < G; g++) S[jj * sr + kh * G + g] = NAN;
        }
    }
}

/* the online-softmax step of one block for W heads at a time (softmax_g4's rules), heads
 * [0, hw): S [DB][sr] scores of the nb keys -> P = exp(s - shift) in place, M, L [sr] the
 * states' m and l, A [sr] alpha = exp(m_old - m_new) (1 where m is unchanged) */
LK_ALWAYS_INLINE void softmax_g4f(float *S, int64_t sr, int64_t hw, int64_t nb, float *M, float *L, float *A) {
    for (int64_t h = 0; h < hw; h += LKV_W) {
        lkv_f32 bmax = lkv_loadu(S + h);
        for (int64_t jj = 1; jj < nb; jj++) bmax = lkv_max(bmax, lkv_loadu(S + jj * sr + h));
        lkv_f32 m = lkv_loadu(M + h), mn = lkv_max(m, bmax);
        mn = lkv_blend(mn, lkv_set1(NAN), lkv_unord(m, bmax)); /* lk_nanmax */
        lkv_m changed = lkv_m_or(lkv_gt(mn, m), lkv_unord(mn, m));
        lkv_f32 alpha = lkv_blend(lkv_set1(1.0f), lkv_exp(lkv_sub(m, mn)), changed);
        lkv_f32 shift = lkv_zero_where(lkv_lt(mn, lkv_set1(-FLT_MAX)), mn); /* lk_online_shift */
        lkv_f32 l = lkv_mul(lkv_loadu(L + h), alpha);
        for (int64_t jj = 0; jj < nb; jj++) {
            lkv_f32 p = lkv_exp_nonpos(lkv_sub(lkv_loadu(S + jj * sr + h), shift)); /* <= 0 or NaN */
            l = lkv_add(l, p);
            lkv_storeu(S + jj * sr + h, p);
        }
        lkv_storeu(M + h, mn), lkv_storeu(L + h, l), lkv_storeu(A + h, alpha);
    }
}

/* o_g[d0, d0 + nd 2W) = A[g] o_g + sum_j P[j][g] v_j there, for the ng heads g of o (rows
 * D apart), nd 2W-dim pieces from d0: ng * nd * 2 accumulators (8: FMA chains enough to
 * hide its latency); P rows sr apart, V rows v [nb] (pieces at chunk offsets, cs elements
 * apart); the lines of the next block's V rows vn [nn] that these pieces cover prefetched
 * into L2 as the keys go (see "software prefetch" above) */
LK_ALWAYS_INLINE void pv_pieces(float *o, int64_t D, int ng, int nd, int64_t d0, const float *P, int64_t sr,
                                const lkv_f32 *al, const char *const *v, int64_t nb, int64_t cs, lk_dtype dt,
                                const char *const *vn, int64_t nn, lkv_c32 *nan) {
    const int64_t es = lk_esize(dt);
    lkv_f32 acc[16];
#pragma GCC unroll 16
    for (int i = 0; i < 2 * ng * nd; i++) /* i = (g nd + c) 2 + half */
        acc[i] = lkv_mul(lkv_loadu(o + (i / (2 * nd)) * D + d0 + (i % (2 * nd)) * LKV_W), al[i / (2 * nd)]);
    for (int64_t jj = 0; jj < nb; jj++) {
#pragma GCC unroll 4
        for (int c = 0; c < nd; c++) {
            if (jj < nn) prefetch_piece(vn[jj], d0 + c * 2 * LKV_W, cs, es);
            lkv_f32 v0, v1;
            load2_raw(v[jj], d0 + c * 2 * LKV_W, cs, dt, &v0, &v1, nan);
#pragma GCC unroll 4
            for (int g = 0; g < ng; g++) {
                lkv_f32 p = lkv_set1(P[jj * sr + g]);
                acc[(g * nd + c) * 2] = lkv_fma(p, v0, acc[(g * nd + c) * 2]);
                acc[(g * nd + c) * 2 + 1] = lkv_fma(p, v1, acc[(g * nd + c) * 2 + 1]);
            }
        }
    }
#pragma GCC unroll 16
    for (int i = 0; i < 2 * ng * nd; i++) lkv_storeu(o + (i / (2 * nd)) * D + d0 + (i % (2 * nd)) * LKV_W, acc[i]);
}

/* o_g = A[g] o_g + sum_j P[j][g] v_j for the ng (4, 2 or 1) heads g of o (rows D apart,
 * g4f_dim order): 4 / ng pieces of 2W dims at a time, then one */
LK_ALWAYS_INLINE void pv_g4f(float *o, int64_t D, int ng, const float *P, int64_t sr, const float *A,
                             const char *const *v, int64_t nb, int64_t cs, lk_dtype dt, const char *const *vn,
                             int64_t nn, lkv_c32 *nan) {
    const int nd = ng == 4 && LKV_W == 16 ? 2 : 4 / ng; /* AVX-512, 4 heads: 2 pieces, 16 FMA chains */
    lkv_f32 al[4];
#pragma GCC unroll 4
    for (int g = 0; g < ng; g++) al[g] = lkv_set1(A[g]);
    int64_t d0 = 0;
    for (; d0 + nd * 2 * LKV_W <= D; d0 += nd * 2 * LKV_W)
        pv_pieces(o, D, ng, nd, d0, P, sr, al, v, nb, cs, dt, vn, nn, nan);
    for (; d0 < D; d0 += 2 * LKV_W) pv_pieces(o, D, ng, 1, d0, P, sr, al, v, nb, cs, dt, vn, nn, nan);
}

/* the P.V step of one block for every KV head of the g4f path (decode_row_g4f): o [Hq][Dv]
 * (g4f_dim order) = A o + P . V, P in S [DB][sr]; V rows at vbase [nk] (the next block's
 * [DB, nk) prefetched), 16-dim chunks cs elements apart (TILE: ND, a constant) */
LK_ALWAYS_INLINE void pv_heads_g4f(const lk_attn_args *a, float *o, const float *S, int64_t sr, const float *A,
                                   const int64_t *vbase, int64_t nb, int64_t nk, int64_t cs, int64_t vhs, lk_dtype vt) {
    const int64_t Hk = a->Hk, G = a->Hq / Hk, Dv = a->Dv;
    const char *vd = (const char *)a->vc.data;
    for (int64_t kh = 0; kh < Hk; kh++) {
        const char *vp[DB], *vn[DB];
        lkv_c32 m = lkv_c32_zero(); /* e4m3: maxima of every code read (load2_raw) */
        for (int64_t jj = 0; jj < nb; jj++) vp[jj] = vd + vbase[jj] + kh * vhs;
        for (int64_t jj = DB; jj < nk; jj++) vn[jj - DB] = vd + vbase[jj] + kh * vhs;
        for (int64_t g0 = 0; g0 < G;) {
            int ng = group_size(G, g0);
            int64_t h0 = kh * G + g0, nn = g0 == 0 ? nk - DB : 0;
            if (ng == 4) pv_g4f(o + h0 * Dv, Dv, 4, S + h0, sr, A + h0, vp, nb, cs, vt, vn, nn, &m);
            else if (ng == 2) pv_g4f(o + h0 * Dv, Dv, 2, S + h0, sr, A + h0, vp, nb, cs, vt, vn, nn, &m);
            else pv_g4f(o + h0 * Dv, Dv, 1, S + h0, sr, A + h0, vp, nb, cs, vt, vn, nn, &m);
            g0 += ng;
        }
        if (vt == LK_F8E4M3) { /* NaN codes of V (folded as read): those dims NaN for the KV head's heads */
            if (lkv_e4m3_nan_found(m))
                for (int64_t jj = 0; jj < nb; jj++)
                    for (int64_t d = 0; d < Dv; d++)
                        if (e4m3_nan_at(vp[jj], cs, d))
                            for (int64_t g = 0; g < G; g++) o[(kh * G + g) * Dv + d] = NAN;
        }
    }
}

/* the keys [lo, hi] of one query row of request b on the g4f path (rows of keys up to
 * pf_hi >= hi prefetched): states st [Hq], o [Hq][Dv] (zeros on entry), qs [Hq][Dqk] the
 * scaled q rows (permuted here in place) */
LK_ALWAYS_INLINE void decode_row_g4f(decode_ctx *c, int64_t b, int64_t lo, int64_t hi, int64_t pf_hi,
                                     lk_online_state *st, float *o, float *qs, float *sc, lk_dtype kt, lk_dtype vt) {
    const lk_attn_args *a = c->a;
    const int64_t Hq = a->Hq, Dqk = a->Dqk, Dv = a->Dv, sr = HQP(Hq);
    const int64_t hw = (Hq + LKV_W - 1) / LKV_W * LKV_W;
    const int64_t kcs = chunk_stride(&a->kc), vcs = chunk_stride(&a->vc), kes = lk_esize(kt), ves = lk_esize(vt);
    const int64_t khs = head_step(&a->kc) * kes, vhs = head_step(&a->vc) * ves;
    float *S = sc, *M = S + DB * sr, *L = M + sr, *A = L + sr; // S [DB][sr], M, L, A [sr]
    if (kt == LK_BF16) /* q in load2_raw's order of K */
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t d0 = 0; d0 < Dqk; d0 += 2 * LKV_W) {
                float t[2 * LKV_W], *qh = qs + h * Dqk + d0;
                memcpy(t, qh, sizeof t);
                for (int e = 0; e < 2 * LKV_W; e++) qh[e] = t[g4f_dim(e, kt)];
            }
    for (int64_t i = 0; i < DB * sr; i++) S[i] = 0.0f;
    for (int64_t h = 0; h < sr; h++) M[h] = -INFINITY, L[h] = 0.0f, A[h] = 1.0f;
    for (int64_t jb = lo; jb <= hi; jb += DB) {
        int64_t nb = hi - jb + 1 < DB ? hi - jb + 1 : DB;
        int64_t kbase[2 * DB], vbase[2 * DB], nk = pf_hi - jb + 1 < 2 * DB ? pf_hi - jb + 1 : 2 * DB;
        key_offsets(a, &a->kc, b, jb, nk, kbase);
        key_offsets(a, &a->vc, b, jb, nk, vbase);
        if (kcs == TILE(kes)) scores_g4f(a, qs, kbase, nb, nk, TILE(kes), khs, S, sr, kt);
        else scores_g4f(a, qs, kbase, nb, nk, kcs, khs, S, sr, kt);
        softmax_g4f(S, sr, hw, nb, M, L, A);
        if (vcs == TILE(ves)) pv_heads_g4f(a, o, S, sr, A, vbase, nb, nk, TILE(ves), vhs, vt);
        else pv_heads_g4f(a, o, S, sr, A, vbase, nb, nk, vcs, vhs, vt);
    }
    const float vf = vt == LK_F8E4M3 ? 256.0f : 1.0f;
    for (int64_t h = 0; h < Hq; h++) {
        st[h].m = M[h], st[h].l = L[h];
        for (int64_t d0 = 0; d0 < Dv; d0 += 2 * LKV_W) { /* O's dims back in order, e4m3's 256 */
            float t[2 * LKV_W], *oh = o + h * Dv + d0;
            memcpy(t, oh, sizeof t);
            for (int e = 0; e < 2 * LKV_W; e++) oh[g4f_dim(e, vt)] = t[e] * vf;
        }
    }
}
#endif

/* One chunk of keys for every head of one request: keys in blocks of DB, scores of the
 * block for all heads (keys in memory order, heads inside), one online-softmax update
 * per head and block, then P.V four keys at a time. */
static inline __attribute__((always_inline)) void decode_chunk(decode_ctx *c, int64_t b, int64_t ch,
                                                               int tid, lk_dtype kt, lk_dtype vt) {
    const lk_attn_args *a = c->a;
    int64_t q0 = a->cu_q[b], q_len = a->cu_q[b + 1] - q0, k_len = a->k_len[b];
    int64_t Hq = a->Hq, Hk = a->Hk, G = Hq / Hk, Dqk = a->Dqk, Dv = a->Dv;
    int64_t j0 = ch * DECODE_CHUNK, j1 = j0 + DECODE_CHUNK < k_len ? j0 + DECODE_CHUNK : k_len;
    int64_t kcs = chunk_stride(&a->kc), vcs = chunk_stride(&a->vc), kes = lk_esize(kt), ves = lk_esize(vt);
    int64_t khs = head_step(&a->kc) * kes, vhs = head_step(&a->vc) * ves; /* bytes between heads */
    float *qs = c->qbuf + (size_t)tid * (size_t)c->qbuf_stride; // [Hq][Dqk]
    float *sc = c->sbuf + (size_t)tid * (size_t)c->sbuf_floats; // [Hq][DB] (+ pv16 words)
    for (int64_t i = 0; i < q_len; i++) {
        int64_t lo, hi;
        lk_attn_window(a, i, q_len, k_len, &lo, &hi);
        /* the last key whose rows the block loops prefetch: the row's, so that the
         * chunk's last block prefetches the next chunk's first keys (its thread's next
         * unit, mostly: lk_parallel_runs) */
        int64_t pf_hi = hi;
        if (lo < j0) lo = j0;
        if (hi > j1 - 1) hi = j1 - 1;
        int64_t row0 = c->state_base[b] + (ch * q_len + i) * Hq;
        lk_online_state *st = c->st + row0;
        float *o = c->st_o + row0 * Dv;
        for (int64_t h = 0; h < Hq; h++) {
            st[h] = lk_online_init();
            memset(o + h * Dv, 0, sizeof(float) * (size_t)Dv);
#if defined(LKV_BF16DOT)
            if (c->qk16) {
                load_q_row_bf16(a, q0 + i, h, (uint16_t *)qs + h * Dqk);
                continue;
            }
#endif
            load_q_row(a, q0 + i, h, qk_scale(a, b, h / G), qs + h * Dqk);
        }
        /* each block loop only where its flag can be set for these dtypes (run_decode):
         * constants in the per-dtype copies, so that the others leave them out */
#if defined(LKV_AMX)
        if (lk_is_fp8(kt) && lk_is_fp8(vt) && c->amx) {
            if (kt == LK_F8E4M3 && vt == LK_F8E4M3) amx_row_e4m3(c, b, lo, hi, pf_hi, st, o, (const uint16_t *)qs, sc);
            else if (kt == LK_F8E5M2 && vt == LK_F8E5M2) amx_row_e5m2(c, b, lo, hi, pf_hi, st, o, (const uint16_t *)qs, sc);
            else amx_row_any(c, b, lo, hi, pf_hi, st, o, (const uint16_t *)qs, sc, kt, vt);
            continue;
        }
#endif
#if defined(LKV_BF16DOT)
        if (bf16_operand(kt) && bf16_operand(vt) && c->g4) {
            decode_row_g4(c, b, lo, hi, pf_hi, st, o, (uint16_t *)qs, sc, kt, vt);
            continue;
        }
#endif
#if defined(DECODE_G4F)
        if (c->g4f) {
            decode_row_g4f(c, b, lo, hi, pf_hi, st, o, qs, sc, kt, vt);
            continue;
        }
#endif
        for (int64_t jb = lo; jb <= hi; jb += DB) {
            int64_t nb = hi - jb + 1 < DB ? hi - jb + 1 : DB;
            /* row offsets of head 0 of this block's keys and the next block's (prefetch):
             * the page lookup and divisions once per key, not per (key, head) */
            int64_t kbase[2 * DB], vbase[2 * DB], nk = pf_hi - jb + 1 < 2 * DB ? pf_hi - jb + 1 : 2 * DB;
            key_offsets(a, &a->kc, b, jb, nk, kbase);
            key_offsets(a, &a->vc, b, jb, nk, vbase);
#if defined(LKV_BF16DOT)
            if (c->qk16 && G == 4 && Dqk == 128 && !(a->softcap > 0) && (kt == LK_BF16 || lk_is_fp8(kt))) {
                const uint16_t *q16 = (const uint16_t *)qs;
                if (kcs == TILE(kes)) scores16_g4d128(a, q16, kbase, vbase, nb, nk, TILE(kes), vcs, khs, vhs, sc, b, kt);
                else scores16_g4d128(a, q16, kbase, vbase, nb, nk, kcs, vcs, khs, vhs, sc, b, kt);
            } else if (c->qk16 && kt == LK_BF16) {
                const uint16_t *q16 = (const uint16_t *)qs;
                if (kcs == 16) scores16_block(a, q16, kbase, vbase, nb, nk, 16, vcs, khs, vhs, sc, b, LK_BF16);
                else scores16_block(a, q16, kbase, vbase, nb, nk, kcs, vcs, khs, vhs, sc, b, LK_BF16);
            } else if (c->qk16 && lk_is_fp8(kt)) { /* fp8 K widened to bf16 in registers */
                const uint16_t *q16 = (const uint16_t *)qs;
                if (kcs == 32) scores16_block(a, q16, kbase, vbase, nb, nk, 32, vcs, khs, vhs, sc, b, kt);
                else scores16_block(a, q16, kbase, vbase, nb, nk, kcs, vcs, khs, vhs, sc, b, kt);
            } else
#endif
            for (int64_t jj = 0; jj < nb; jj++)
                for (int64_t kh = 0; kh < Hk; kh++) {
                    const char *kp = (const char *)a->kc.data + kbase[jj] + kh * khs;
                    if (DB + jj < nk) { /* the next block's K and V rows into L2 */
                        prefetch_row_l2((const char *)a->kc.data + kbase[DB + jj] + kh * khs, kcs, Dqk, kes);
                        prefetch_row_l2((const char *)a->vc.data + vbase[DB + jj] + kh * vhs, vcs, Dv, ves);
                    }
                    for (int64_t g = 0; g < G;) {
                        int64_t h = kh * G + g, n = G - g >= 4 ? 4 : 1;
                        float s[4];
                        if (n == 4) dot_rows4(qs + h * Dqk, Dqk, kp, kcs, Dqk, kt, s);
                        else s[0] = dot_row(qs + h * Dqk, kp, kcs, Dqk, kt);
                        for (int64_t i = 0; i < n; i++) {
                            if (a->softcap > 0) s[i] = a->softcap * tanhf(s[i] / a->softcap);
                            sc[(h + i) * DB + jj] = s[i];
                        }
                        g += n;
                    }
                }
            for (int64_t h = 0; h < Hq; h++) {
                float *sh = sc + h * DB;
                if (a->alibi) lk_attn_alibi_add(a, b, h, i, q_len, k_len, jb, nb, sh);
                for (int64_t jj = nb; jj < DB; jj++) sh[jj] = -INFINITY;
                float alpha = online_block(sh, DB, &st[h]);
                if (alpha != 1.0f) scale_row(o + h * Dv, Dv, alpha);
            }
#if defined(LKV_BF16DOT)
            if (c->pv16 && (vt == LK_BF16 || lk_is_fp8(vt))) {
                /* P rounded to bf16 pairs, then P.V on bf16 pairs per KV head */
                uint32_t *pw = (uint32_t *)(sc + Hq * DB); // [Hq][DB / 2] (+ DB / 2 words of slack)
                for (int64_t h = 0; h < Hq; h++)
                    lkv_bits_storeu(pw + h * (DB / 2), lkv_bf16_pack_rne(lkv_loadu(sc + h * DB), lkv_zero()));
                for (int64_t kh = 0; kh < Hk; kh++) {
                    const char *vp[DB];
                    for (int64_t jj = 0; jj < DB; jj++)
                        vp[jj] = jj < nb ? (const char *)a->vc.data + vbase[jj] + kh * vhs : NULL;
                    for (int64_t g = 0; g < G;) {
                        int64_t h = kh * G + g, n = G - g >= 4 ? 4 : 1;
                        float *oh = o + h * Dv;
                        const uint32_t *ph = pw + h * (DB / 2);
                        int64_t np = (nb + 1) / 2;
                        if (n == 4 && vcs == TILE(ves)) pv16_rows(oh, Dv, ph, DB / 2, vp, np, TILE(ves), Dv, 4, vt);
                        else if (n == 4) pv16_rows(oh, Dv, ph, DB / 2, vp, np, vcs, Dv, 4, vt);
                        else pv16_rows(oh, Dv, ph, DB / 2, vp, np, vcs, Dv, 1, vt);
                        g += n;
                    }
                }
                continue;
            }
#endif
            for (int64_t jj = 0; jj < nb; jj += 4)
                for (int64_t kh = 0; kh < Hk; kh++) {
                    const char *vp[4];
                    for (int k = 0; k < 4; k++) /* past the block end: a valid row with weight 0 */
                        vp[k] = (const char *)a->vc.data + vbase[jj + k < nb ? jj + k : jj] + kh * vhs;
                    for (int64_t g = 0; g < G;) {
                        int64_t h = kh * G + g, n = G - g >= 4 && jj + 4 <= nb ? 4 : 1;
                        float w[16] = {0};
                        for (int64_t i = 0; i < n; i++)
                            for (int k = 0; k < 4; k++) w[4 * i + k] = jj + k < nb ? sc[(h + i) * DB + jj + k] : 0.0f;
                        if (n == 4) axpy4_rows4(o + h * Dv, w, vp, vcs, Dv, vt);
                        else if (jj + 4 <= nb) axpy4_row(o + h * Dv, w, vp, vcs, Dv, vt);
                        else axpyn_row(o + h * Dv, w, vp, (int)(nb - jj), vcs, Dv, vt);
                        g += n;
                    }
                }
        }
    }
}

/* one function per K/V dtype pair: each instantiation of decode_chunk gets its own
 * register allocation (all of them inlined into one caller, GCC 12 kept the bf16 score
 * accumulators on the stack: 1.5x slower at D = 576, 16-128 heads per KV head) */
#define DECODE_CHUNK_FN(NAME, KT, VT)                                                          \
    static __attribute__((noinline)) void NAME(decode_ctx *c, int64_t b, int64_t ch, int tid) { \
        decode_chunk(c, b, ch, tid, KT, VT);                                                   \
    }
DECODE_CHUNK_FN(decode_chunk_bf16, LK_BF16, LK_BF16)
DECODE_CHUNK_FN(decode_chunk_f16, LK_F16, LK_F16)
DECODE_CHUNK_FN(decode_chunk_f32, LK_F32, LK_F32)
DECODE_CHUNK_FN(decode_chunk_e4m3, LK_F8E4M3, LK_F8E4M3)
DECODE_CHUNK_FN(decode_chunk_e5m2, LK_F8E5M2, LK_F8E5M2)
#undef DECODE_CHUNK_FN
static __attribute__((noinline)) void decode_chunk_any(decode_ctx *c, int64_t b, int64_t ch, int tid, lk_dtype kt,
                                                       lk_dtype vt) {
    decode_chunk(c, b, ch, tid, kt, vt);
}

static void decode_unit(void *vctx, int64_t u, int tid) {
    decode_ctx *c = vctx;
    int64_t b = c->unit_b[u], ch = c->unit_c[u];
    lk_dtype kt = c->a->kc.dtype, vt = c->a->vc.dtype;
    if (kt == LK_BF16 && vt == LK_BF16) decode_chunk_bf16(c, b, ch, tid);
    else if (kt == LK_F16 && vt == LK_F16) decode_chunk_f16(c, b, ch, tid);
    else if (kt == LK_F32 && vt == LK_F32) decode_chunk_f32(c, b, ch, tid);
    else if (kt == LK_F8E4M3 && vt == LK_F8E4M3) decode_chunk_e4m3(c, b, ch, tid);
    else if (kt == LK_F8E5M2 && vt == LK_F8E5M2) decode_chunk_e5m2(c, b, ch, tid);
    else decode_chunk_any(c, b, ch, tid, kt, vt);
}

/* ------------------------------------------------------------------ driver */

static int simd_layout_ok(const lk_attn_args *a) {
    const lk_paged *k = &a->kc, *v = &a->vc;
    if (a->Dqk % 8 || a->Dv % 8 || k->s3 != 1 || v->s3 != 1) return 0;
    if (k->layout == LK_KV_NZ && (a->Dqk % TILE(lk_esize(k->dtype)) || a->Dv % TILE(lk_esize(v->dtype)))) return 0;
    return 1;
}

/* rows outside every request: out = 0 (an fp8 out: code 0, fp8(0 / out_scale)), lse = -inf */
static void zero_padding_rows(const lk_attn_args *a) {
    const lk_tensor *out = &a->out;
    for (int64_t t = 0; t < a->q.shape[0]; t++) {
        if (t >= a->cu_q[0] && t < a->cu_q[a->B]) continue;
        for (int64_t h = 0; h < a->Hq; h++) {
            for (int64_t d = 0; d < a->Dv; d++)
                lk_store_f(out->data, out->dtype, t * out->stride[0] + h * out->stride[1] + d * out->stride[2], 0.0f);
            if (a->has_lse) ((float *)a->lse.data)[t * a->lse.stride[0] + h * a->lse.stride[1]] = -INFINITY;
        }
    }
}

/* decode path when queries are few compared to keys: q_len <= 4 for every request */
static int use_decode(const lk_attn_args *a) {
    int64_t keys = 0;
    for (int64_t b = 0; b < a->B; b++) {
        if (a->cu_q[b + 1] - a->cu_q[b] > 4) return 0;
        keys += a->k_len[b];
    }
    return keys > 0;
}

/* bytes of memory on a 64-byte boundary, or NULL */
static void *alloc_lines(size_t bytes) {
    void *p = NULL;
    return posix_memalign(&p, 64, bytes ? bytes : 64) ? NULL : p;
}

static lk_status run_decode(const lk_attn_args *a) {
    int64_t B = a->B, n_units = 0, rows = 0, qmax = 1;
    int64_t *state_base = malloc(sizeof(int64_t) * (size_t)(B + 1));
    if (!state_base) return LK_ERR_NOMEM;
    for (int64_t b = 0; b < B; b++) {
        int64_t ql = a->cu_q[b + 1] - a->cu_q[b], nch = (a->k_len[b] + DECODE_CHUNK - 1) / DECODE_CHUNK;
        if (ql == 0) nch = 0;
        if (nch == 0 && ql > 0) nch = 1; /* empty key range: one empty chunk gives 0 / -inf */
        state_base[b] = rows;
        rows += nch * ql * a->Hq;
        n_units += nch;
        if (ql > qmax) qmax = ql;
    }
    int nt = lk_plan_units(n_units);
    decode_ctx c = {a, malloc(sizeof(int64_t) * (size_t)(n_units + 1)), malloc(sizeof(int64_t) * (size_t)(n_units + 1)),
                    state_base, malloc(sizeof(lk_online_state) * (size_t)(rows + 1)),
                    alloc_lines(sizeof(float) * (size_t)(rows * a->Dv + 1)), NULL, (qmax * a->Hq * a->Dqk + 15) / 16 * 16,
                    NULL, 0, 0, 0, 0, 0, 0};
#if defined(LKV_BF16DOT)
    c.qk16 = bf16_operand(a->q.dtype) && bf16_operand(a->kc.dtype); /* fp8 widened to bf16 exactly */
    /* P.V on bf16 pairs pays where four query heads share each zipped V pair (GQA groups
     * of 4k); with one head per KV head its 4 accumulator chains are latency-bound and
     * the f32 P.V measured faster (MHA B=8 x 4096 x 32 h: 1.07-1.11x slower) */
    c.pv16 = c.qk16 && bf16_operand(a->vc.dtype) && a->out.dtype == LK_BF16 && (a->Hq / a->Hk) % 4 == 0;
    c.g4 = c.pv16 && a->Hq == 4 * a->Hk && a->Dqk == 128 && a->Dv % 64 == 0 && !(a->softcap > 0) && !a->alibi;
    /* decode_row_g4 over fp8 K: its q rows (Hq x 128 words), then scores_g4's copy (twice that) */
    if (c.g4 && lk_is_fp8(a->kc.dtype) && c.qbuf_stride < 3 * a->Hq * 64) c.qbuf_stride = 3 * a->Hq * 64;
#endif
    c.sbuf_floats = SBUF_FLOATS(a->Hq);
#if defined(LKV_AMX)
    /* fp8 K and V only: with bf16 ones the register paths measured faster (GQA 32/8 x 128,
     * B=8 x 4096: 5.0 against 5.3 ms; MHA 32 heads: 24.2 against 32.3 ms); 3 or more
     * query heads per KV head: a tile product costs the same for any, and with 1 or 2
     * the f32 loop was faster (Emerald Rapids, e4m3, 32 heads, B=8 x 2048, 2 threads, same
     * process: 1 per KV head 1.07-1.66x, 2 per KV head 0.95-1.40x; 3 per KV head the
     * tiles 1.2-1.6x faster) */
    c.amx = c.qk16 && lk_is_fp8(a->kc.dtype) && lk_is_fp8(a->vc.dtype) && a->out.dtype == LK_BF16 &&
            a->Hq / a->Hk >= 3 && a->Hq / a->Hk <= 16 &&
            a->Dqk % 64 == 0 && a->Dv % 64 == 0 && !(a->softcap > 0) && !a->alibi;
    if (c.amx) c.sbuf_floats = AMX_FLOATS(a->Hq, a->Hk, a->Dqk, a->Dv);
#endif
#if defined(DECODE_G4F)
    /* one query head per KV head with 16 / 32-bit K and V: the row-by-row path measured
     * as fast (B=8 x 4096 x 32 h bf16: 18.6 / 21.1 ms against 20.9 / 22.2 on this loop) */
    c.g4f = (a->Hq / a->Hk >= 2 || lk_is_fp8(a->kc.dtype) || lk_is_fp8(a->vc.dtype)) && a->Dqk % (2 * LKV_W) == 0 &&
            a->Dv % (2 * LKV_W) == 0 && !(a->softcap > 0) && !a->alibi;
#if defined(LKV_BF16DOT)
    if (lk_cpu_prefer_fma()) {
        /* every K / V dtype on f32 FMAs where bf16 dot products run at half their rate
         * (lk_cpu_prefer_fma; the tiles stay) */
        c.g4f = c.g4f && !c.amx;
        if (c.g4f) c.qk16 = c.pv16 = c.g4 = 0;
    } else {
        /* fp8 K / V that neither bf16 P.V loop nor the tiles take (groups of heads not a
         * multiple of 4, or a float out) */
        c.g4f = c.g4f && !c.pv16 && !c.amx && (lk_is_fp8(a->kc.dtype) || lk_is_fp8(a->vc.dtype));
        if (c.g4f) c.qk16 = 0; /* q rows in f32 */
    }
#endif
#endif
    c.qbuf = alloc_lines(sizeof(float) * (size_t)(nt * c.qbuf_stride));
    c.sbuf = alloc_lines(sizeof(float) * (size_t)(nt * c.sbuf_floats)); /* tile rows and vectors on cache lines */
    lk_status st = LK_ERR_NOMEM;
    if (c.unit_b && c.unit_c && c.st && c.st_o && c.qbuf && c.sbuf) {
        int64_t u = 0;
        for (int64_t b = 0; b < B; b++) {
            int64_t ql = a->cu_q[b + 1] - a->cu_q[b];
            int64_t nch = ql ? (a->k_len[b] + DECODE_CHUNK - 1) / DECODE_CHUNK : 0;
            if (ql && !nch) nch = 1;
            for (int64_t k = 0; k < nch; k++) c.unit_b[u] = b, c.unit_c[u] = k, u++;
        }
        lk_parallel_runs(n_units, nt, decode_unit, &c);
        /* combine chunk states in chunk order per (request, query, head) */
        for (int64_t b = 0; b < B; b++) {
            int64_t q0 = a->cu_q[b], ql = a->cu_q[b + 1] - q0;
            int64_t nch = ql ? (a->k_len[b] + DECODE_CHUNK - 1) / DECODE_CHUNK : 0;
            if (ql && !nch) nch = 1;
            for (int64_t i = 0; i < ql; i++)
                for (int64_t h = 0; h < a->Hq; h++) {
                    int64_t r0 = state_base[b] + i * a->Hq + h, step = ql * a->Hq;
                    lk_online_state acc = c.st[r0];
                    float *o = c.st_o + r0 * a->Dv;
                    for (int64_t k = 1; k < nch; k++) {
                        /* fold chunk k's state (m_k, l_k, O_k) into acc: rescale acc to the
                         * joint max, then add chunk k scaled from its own shift */
                        lk_online_state sk = c.st[r0 + k * step];
                        float *ok = c.st_o + (r0 + k * step) * a->Dv;
                        float alpha = lk_online_rescale(&acc, sk.m);
                        float w = sk.l == 0.0f ? 0.0f : expf(lk_online_shift(sk.m) - lk_online_shift(acc.m));
                        lk_online_add(&acc, sk.l * w);
                        lkv_f32 va = lkv_set1(alpha), vw = lkv_set1(w);
                        for (int64_t d = 0; d < a->Dv; d += LKV_W) {
                            int64_t n = a->Dv - d < LKV_W ? a->Dv - d : LKV_W;
                            lkv_f32 v = lkv_fma(vw, lkv_load_part(ok + d, LK_F32, n), lkv_mul(va, lkv_load_part(o + d, LK_F32, n)));
                            lkv_store_part(o + d, LK_F32, v, n);
                        }
                    }
                    store_out_row(a, q0 + i, h, o, acc, lk_attn_desc(&a->vd, b, h / (a->Hq / a->Hk)));
                }
        }
        st = LK_OK;
    }
    free(c.unit_b), free(c.unit_c), free(state_base), free(c.st), free(c.st_o);
    free(c.qbuf), free(c.sbuf);
    return st;
}

static lk_status flash_attn(const lk_attn_args *a) {
    if (!simd_layout_ok(a)) return lk_ref_flash_attn(a);
    lk_status st = use_decode(a) ? run_decode(a) : run_prefill(a);
    if (st == LK_OK) zero_padding_rows(a);
    return st;
}

void LKV_FN(register_attention)(lk_kernel_table *t) { t->flash_attn = flash_attn; }

#if defined(LKV_BF16DOT)
/* the registration of the AVX512_BF16 row (src/cpu/dispatch.c): its table is the AVX-512
 * one, with this build of flash_attn, whose prefill takes the bf16 dot-product path when
 * q, k and v are bf16; the AMX row's (the same source with LKV_AMX) adds decode_row_amx */
void LKV_FN(register)(lk_kernel_table *t);
void LKV_FN(register)(lk_kernel_table *t) { LKV_FN(register_attention)(t); }
#endif
