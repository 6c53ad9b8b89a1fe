/*
 * flash_attn_varlen, AVX2 + FMA + F16C: tiled flash attention with online softmax.
 *
 * Maths (per request b, query i, query head h, KV head kh = h / G, G = Hq / Hk):
 *   s_j = scale * q_i . k_j (softcap: c * tanh(s / c)), keys j in i's window;
 *   out_i = sum_j exp(s_j - m) v_j / l,  l = sum_j exp(s_j - m),  lse = m + log(l).
 *
 * Prefill path, unit = (request, KV head, query tile). A query tile holds `qt` tokens
 * times the G query heads of the KV head, M = qt * G rows (r = t * G + g), so one K/V
 * tile converted to f32 serves every row of the tile and every head of the GQA group.
 * For each key tile of KB keys that some row of the unit can see:
 *   Kt  [KB/16][Dqk][16]  K tile transposed into 16-key panels (8x8 register transposes)
 *   Vp  [Dvp/16][KB][16]  V tile in 16-dim panels
 *   S   [Mp][KB] = Qs [Mp][Dqk] . Kt      (6x16 register-blocked FMA micro-kernel)
 *   boundary tiles are masked by index (fully hidden tiles are never visited, fully
 *   visible ones are not masked), online softmax per row (running max m, sum l, O
 *   rescaled by exp(m_old - m_new)), then O [Mp][Dvp] += P . Vp (same micro-kernel).
 * The scale is folded into Qs. exp is the polynomial lk8_exp.
 *
 * Decode path (queries that are few compared to keys): unit = (request, key chunk of
 * DECODE_CHUNK keys), every head of the request at once, walking the chunk's keys in
 * memory order (slot-major within a page, heads inside), so a paged cache is read as
 * the contiguous pages it is. Keys go in blocks of DB: the block's scores for all heads,
 * one online-softmax update per head, then P.V four keys per pass over O. Each unit
 * leaves per-(query, head) partial states (m, l, O) which are then combined in chunk
 * order with the attention-state rules. Chunks depend only on the key length, so results
 * do not depend on the thread count.
 *
 * Layouts served: K/V dims with unit stride (dense, paged ND, paged NZ with head dims
 * a multiple of 16), head dims a multiple of 8; anything else goes to the reference.
 * Threads: units handed out dynamically (lk_parallel_units) with per-thread scratch
 * allocated up front.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/attn_state.h"
#include "../kernels.h"
#include "simd.h"

#define KB 64        /* keys per tile */
#define MR 6         /* micro-kernel rows */
#define ROWS 60      /* target rows (tokens x group heads) of a query tile */
#define DECODE_CHUNK 512

/* ------------------------------------------------------------------ micro-kernel */

/* C[6][16] (+)= A[6][K] . B[K][16]; A rows lda apart, B packed 16 wide, C ldc apart */
static inline void mk_6x16(int64_t K, const float *A, int64_t lda, const float *B, float *C,
                           int64_t ldc, int accumulate) {
    __m256 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
    if (accumulate) {
        c00 = _mm256_loadu_ps(C), c01 = _mm256_loadu_ps(C + 8);
        c10 = _mm256_loadu_ps(C + ldc), c11 = _mm256_loadu_ps(C + ldc + 8);
        c20 = _mm256_loadu_ps(C + 2 * ldc), c21 = _mm256_loadu_ps(C + 2 * ldc + 8);
        c30 = _mm256_loadu_ps(C + 3 * ldc), c31 = _mm256_loadu_ps(C + 3 * ldc + 8);
        c40 = _mm256_loadu_ps(C + 4 * ldc), c41 = _mm256_loadu_ps(C + 4 * ldc + 8);
        c50 = _mm256_loadu_ps(C + 5 * ldc), c51 = _mm256_loadu_ps(C + 5 * ldc + 8);
    } else {
        c00 = c01 = c10 = c11 = c20 = c21 = c30 = c31 = c40 = c41 = c50 = c51 = _mm256_setzero_ps();
    }
    const float *a0 = A, *a1 = A + lda, *a2 = A + 2 * lda, *a3 = A + 3 * lda, *a4 = A + 4 * lda,
                *a5 = A + 5 * lda;
    for (int64_t k = 0; k < K; k++) {
        __m256 b0 = _mm256_load_ps(B + k * 16), b1 = _mm256_load_ps(B + k * 16 + 8), a;
        a = _mm256_broadcast_ss(a0 + k);
        c00 = _mm256_fmadd_ps(a, b0, c00), c01 = _mm256_fmadd_ps(a, b1, c01);
        a = _mm256_broadcast_ss(a1 + k);
        c10 = _mm256_fmadd_ps(a, b0, c10), c11 = _mm256_fmadd_ps(a, b1, c11);
        a = _mm256_broadcast_ss(a2 + k);
        c20 = _mm256_fmadd_ps(a, b0, c20), c21 = _mm256_fmadd_ps(a, b1, c21);
        a = _mm256_broadcast_ss(a3 + k);
        c30 = _mm256_fmadd_ps(a, b0, c30), c31 = _mm256_fmadd_ps(a, b1, c31);
        a = _mm256_broadcast_ss(a4 + k);
        c40 = _mm256_fmadd_ps(a, b0, c40), c41 = _mm256_fmadd_ps(a, b1, c41);
        a = _mm256_broadcast_ss(a5 + k);
        c50 = _mm256_fmadd_ps(a, b0, c50), c51 = _mm256_fmadd_ps(a, b1, c51);
    }
    _mm256_storeu_ps(C, c00), _mm256_storeu_ps(C + 8, c01);
    _mm256_storeu_ps(C + ldc, c10), _mm256_storeu_ps(C + ldc + 8, c11);
    _mm256_storeu_ps(C + 2 * ldc, c20), _mm256_storeu_ps(C + 2 * ldc + 8, c21);
    _mm256_storeu_ps(C + 3 * ldc, c30), _mm256_storeu_ps(C + 3 * ldc + 8, c31);
    _mm256_storeu_ps(C + 4 * ldc, c40), _mm256_storeu_ps(C + 4 * ldc + 8, c41);
    _mm256_storeu_ps(C + 5 * ldc, c50), _mm256_storeu_ps(C + 5 * ldc + 8, c51);
}

/* ------------------------------------------------------------------ loading */

/* element offset of dim d of a K/V row starting at `base` (unit lane stride; NZ rows are
 * 16-dim chunks `cs` apart, ND rows contiguous: cs = 16) */
static inline int64_t dim_off(int64_t base, int64_t cs, int64_t d) { return base + (d >> 4) * cs + (d & 15); }

static inline int64_t chunk_stride(const lk_paged *c) { return c->layout == LK_KV_NZ ? c->s1 : 16; }

static inline __m256 load8_at(const lk_paged *c, int64_t off) {
    return lk8_load((const char *)c->data + off * lk_esize(c->dtype), c->dtype);
}

/* 8x8 transpose of r0..r7 in place */
static inline void transpose8(__m256 *r) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20), r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20), r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31), r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31), r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* marks a tile row past the last key; element offsets of real keys may be negative
 * (negative strides), but never INT64_MIN (lk_check_view bounds them by 2^62) */
#define NO_KEY INT64_MIN

/* Kt[p][d][jj % 16] = K[j0 + jj][d] for jj < kb, 0 for kb <= jj < KB */
static void load_k_tile(const lk_attn_args *a, int64_t b, int64_t kh, int64_t j0, int64_t kb,
                        float *Kt) {
    const lk_paged *c = &a->kc;
    int64_t D = a->Dqk, cs = chunk_stride(c);
    for (int64_t g = 0; g < KB; g += 8) {
        int64_t base[8];
        for (int r = 0; r < 8; r++)
            base[r] = g + r < kb ? lk_attn_key_off(a, c, b, j0 + g + r, kh, 0) : NO_KEY;
        float *dst = Kt + (g / 16) * D * 16 + (g % 16);
        for (int64_t d = 0; d < D; d += 8) {
            __m256 r8[8];
            for (int r = 0; r < 8; r++)
                r8[r] = base[r] != NO_KEY ? load8_at(c, dim_off(base[r], cs, d)) : _mm256_setzero_ps();
            transpose8(r8);
            for (int k = 0; k < 8; k++) _mm256_store_ps(dst + (d + k) * 16, r8[k]);
        }
    }
}

/* Vp[d / 16][jj][d % 16] = V[j0 + jj][d] (panels `ps` floats apart); zero for jj >= kb
 * and Dv <= d < Dvp */
static void load_v_tile(const lk_attn_args *a, int64_t b, int64_t kh, int64_t j0, int64_t kb,
                        int64_t Dvp, int64_t ps, float *Vp) {
    const lk_paged *c = &a->vc;
    int64_t D = a->Dv, cs = chunk_stride(c);
    for (int64_t jj = 0; jj < KB; jj++) {
        int64_t base = jj < kb ? lk_attn_key_off(a, c, b, j0 + jj, kh, 0) : NO_KEY;
        for (int64_t d = 0; d < Dvp; d += 8) {
            __m256 v = base != NO_KEY && d < D ? load8_at(c, dim_off(base, cs, d)) : _mm256_setzero_ps();
            _mm256_store_ps(Vp + (d / 16) * ps + jj * 16 + (d % 16), v);
        }
    }
}

/* Qs[r][d] = scale * q[token, head, d] */
static void load_q_row(const lk_attn_args *a, int64_t t, int64_t h, float *dst) {
    const lk_tensor *q = &a->q;
    int64_t off = t * q->stride[0] + h * q->stride[1], D = a->Dqk;
    __m256 sc = _mm256_set1_ps(a->scale);
    if (q->stride[2] == 1) {
        int64_t es = lk_esize(q->dtype);
        const char *p = (const char *)q->data + off * es;
        int64_t d = 0;
        for (; d + 8 <= D; d += 8) _mm256_storeu_ps(dst + d, _mm256_mul_ps(sc, lk8_load(p + d * es, q->dtype)));
        for (; d < D; d++) dst[d] = a->scale * lk_load_f(p, q->dtype, d);
    } else {
        for (int64_t d = 0; d < D; d++) dst[d] = a->scale * lk_load_f(q->data, q->dtype, off + d * q->stride[2]);
    }
}

static void store_out_row(const lk_attn_args *a, int64_t t, int64_t h, const float *o,
                          lk_online_state st) {
    const lk_tensor *out = &a->out;
    float inv = lk_softmax_inv(st.l);
    /* every visible score -inf (l = 0): zeros, never NaN, even where a zero weight met an
     * infinite V value in the accumulator (0 * inf) */
    __m256 keep = _mm256_castsi256_ps(_mm256_set1_epi32(st.l == 0.0f ? 0 : -1));
    int64_t off = t * out->stride[0] + h * out->stride[1], D = a->Dv;
    if (out->stride[2] == 1) {
        int64_t es = lk_esize(out->dtype);
        char *p = (char *)out->data + off * es;
        __m256 vi = _mm256_set1_ps(inv);
        int64_t d = 0;
        for (; d + 8 <= D; d += 8)
            lk8_store(p + d * es, out->dtype, _mm256_and_ps(keep, _mm256_mul_ps(_mm256_loadu_ps(o + d), vi)));
        for (; d < D; d++) lk_store_f(p, out->dtype, d, st.l == 0.0f ? 0.0f : o[d] * inv);
    } else {
        for (int64_t d = 0; d < D; d++)
            lk_store_f(out->data, out->dtype, off + d * out->stride[2], st.l == 0.0f ? 0.0f : o[d] * inv);
    }
    if (a->has_lse)
        ((float *)a->lse.data)[t * a->lse.stride[0] + h * a->lse.stride[1]] = lk_online_lse(st);
}

/* ------------------------------------------------------------------ softmax pieces */

/* softcap * tanh(x / softcap) for 8 lanes: tanh(y) = sign(y) (1 - e) / (1 + e), e = exp(-2|y|) */
static inline __m256 softcap8(__m256 x, float cap) {
    __m256 y = _mm256_mul_ps(x, _mm256_set1_ps(1.0f / cap));
    __m256 sign = _mm256_and_ps(y, _mm256_set1_ps(-0.0f));
    __m256 e = lk8_exp(_mm256_mul_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), y), _mm256_set1_ps(-2.0f)));
    __m256 t = _mm256_div_ps(_mm256_sub_ps(_mm256_set1_ps(1.0f), e), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
    return _mm256_mul_ps(_mm256_or_ps(t, sign), _mm256_set1_ps(cap));
}

/* ------------------------------------------------------------------ prefill path
 * Requests are processed in groups whose packed K/V fit PACK_BUDGET bytes: phase 1
 * converts each (request, KV head) "slab" of the group once into f32 panels
 *   Kt [kpad/16][Dqk][16] and Vp [Dvp/16][kpad][16]   (kpad = k_len rounded up to KB),
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
} prefill_ctx;

static inline int64_t kpad_of(int64_t k_len) { return (k_len + KB - 1) / KB * KB; }

static void pack_unit(void *vctx, int64_t u, int tid) {
    (void)tid;
    prefill_ctx *c = vctx;
    const lk_attn_args *a = c->a;
    int64_t sl = c->tile_slab[u], b = c->slab_b[sl], kh = c->slab_kh[sl], j0 = c->tile_j0[u];
    int64_t k_len = a->k_len[b], kpad = kpad_of(k_len), kb = k_len - j0 < KB ? k_len - j0 : KB;
    float *Kt = c->pack + c->slab_off[sl];   // [kpad/16][Dqk][16]
    float *Vp = Kt + kpad * a->Dqk;         // [Dvp/16][kpad][16]
    load_k_tile(a, b, kh, j0, kb, Kt + j0 * a->Dqk);
    load_v_tile(a, b, kh, j0, kb, c->Dvp, kpad * 16, Vp + j0 * 16);
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

/* 1 if a V value of the tile's keys (packed panels Vp [Dvp/16][kpad][16]) is inf or NaN */
static int tile_nonfinite(const float *Vp, int64_t kpad, int64_t j0, int64_t k_len, int64_t Dvp) {
    int64_t kb = k_len - j0 < KB ? k_len - j0 : KB;
    __m256 acc = _mm256_setzero_ps(), zero = _mm256_setzero_ps();
    for (int64_t p = 0; p < Dvp / 16; p++) {
        const float *v = Vp + p * kpad * 16 + j0 * 16;
        for (int64_t i = 0; i < kb * 16; i += 8) acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_load_ps(v + i), zero));
    }
    return _mm256_movemask_ps(_mm256_cmp_ps(acc, acc, _CMP_UNORD_Q)) != 0;
}

/* O[r] += sum over the keys j of the tile that row r sees of P[r][j] V[j] (keys in order) */
static void pv_visible_only(const float *S, const float *Vp, float *O, const int64_t *lo,
                            const int64_t *hi, int64_t M, int64_t j0, int64_t kpad, int64_t Dvp) {
    for (int64_t r = 0; r < M; r++) {
        int64_t j_lo = lo[r] > j0 ? lo[r] : j0, j_hi = hi[r] < j0 + KB - 1 ? hi[r] : j0 + KB - 1;
        const float *s = S + r * KB; // [KB] probabilities of row r
        for (int64_t p = 0; p < Dvp / 16; p++) {
            float *o = O + r * Dvp + p * 16;
            __m256 c0 = _mm256_loadu_ps(o), c1 = _mm256_loadu_ps(o + 8);
            for (int64_t j = j_lo; j <= j_hi; j++) {
                const float *v = Vp + p * kpad * 16 + j * 16; // [16] dims of key j
                __m256 w = _mm256_set1_ps(s[j - j0]);
                c0 = _mm256_fmadd_ps(w, _mm256_load_ps(v), c0);
                c1 = _mm256_fmadd_ps(w, _mm256_load_ps(v + 8), c1);
            }
            _mm256_storeu_ps(o, c0), _mm256_storeu_ps(o + 8, c1);
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
    const float *Kt = c->pack + c->slab_off[sl];                        // [kpad/16][Dqk][16]
    const float *Vp = Kt + kpad * Dqk;                                  // [Dvp/16][kpad][16]
    float *Qs = (float *)(c->scratch + (size_t)tid * c->scratch_bytes); // [Mp][Dqk]
    float *S = Qs + c->Mp * Dqk;                                        // [Mp][KB]
    float *O = S + c->Mp * KB;                                          // [Mp][Dvp]
    lk_online_state *st = (lk_online_state *)(O + c->Mp * Dvp);        // [Mp]
    int64_t *lo = (int64_t *)(st + c->Mp), *hi = lo + c->Mp;            // [Mp] per row
    int64_t jmin = k_len, jmax = -1;
    for (int64_t t = 0; t < nt; t++) {
        int64_t l0, h0;
        lk_attn_window(a, t0 + t, q_len, k_len, &l0, &h0);
        for (int64_t g = 0; g < G; g++) {
            int64_t r = t * G + g;
            lo[r] = l0, hi[r] = h0;
            load_q_row(a, q0 + t0 + t, kh * G + g, Qs + r * Dqk);
        }
        if (l0 <= h0) {
            if (l0 < jmin) jmin = l0;
            if (h0 > jmax) jmax = h0;
        }
    }
    for (int64_t r = M; r < Mp; r++) memset(Qs + r * Dqk, 0, sizeof(float) * (size_t)Dqk);
    memset(O, 0, sizeof(float) * (size_t)(Mp * Dvp));
    for (int64_t r = 0; r < Mp; r++) st[r] = lk_online_init();
    for (int64_t j0 = jmin >= 0 ? jmin / KB * KB : 0; j0 <= jmax; j0 += KB) {
        const float *Ktile = Kt + j0 * Dqk; /* 4 panels of [Dqk][16] */
        for (int64_t r = 0; r < Mp; r += MR)
            for (int64_t p = 0; p < KB / 16; p++)
                mk_6x16(Dqk, Qs + r * Dqk, Dqk, Ktile + p * Dqk * 16, S + r * KB + p * 16, KB, 0);
        for (int64_t r = 0; r < Mp; r++) {
            float *s = S + r * KB;
            if (r >= M || hi[r] < j0 || lo[r] > j0 + KB - 1 || lo[r] > hi[r]) {
                memset(s, 0, sizeof(float) * KB); /* row sees nothing here: P = 0 */
                continue;
            }
            if (a->softcap > 0)
                for (int jj = 0; jj < KB; jj += 8) _mm256_storeu_ps(s + jj, softcap8(_mm256_loadu_ps(s + jj), a->softcap));
            if (lo[r] > j0 || hi[r] < j0 + KB - 1)
                for (int64_t jj = 0; jj < KB; jj++)
                    if (j0 + jj < lo[r] || j0 + jj > hi[r]) s[jj] = -INFINITY;
            __m256 mx = _mm256_set1_ps(-INFINITY);
            for (int jj = 0; jj < KB; jj += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(s + jj));
            float alpha = lk_online_rescale(&st[r], lk8_hmax(mx));
            __m256 vm = _mm256_set1_ps(lk_online_shift(st[r].m)), sum = _mm256_setzero_ps();
            for (int jj = 0; jj < KB; jj += 8) {
                __m256 e = lk8_exp(_mm256_sub_ps(_mm256_loadu_ps(s + jj), vm));
                _mm256_storeu_ps(s + jj, e);
                sum = _mm256_add_ps(sum, e);
            }
            lk_online_add(&st[r], lk8_hsum(sum));
            if (alpha != 1.0f) {
                __m256 va = _mm256_set1_ps(alpha);
                float *o = O + r * Dvp;
                for (int64_t d = 0; d < Dvp; d += 8) _mm256_storeu_ps(o + d, _mm256_mul_ps(_mm256_loadu_ps(o + d), va));
            }
        }
        if (masks_keys(lo, hi, M, j0, k_len) && tile_nonfinite(Vp, kpad, j0, k_len, Dvp))
            pv_visible_only(S, Vp, O, lo, hi, M, j0, kpad, Dvp);
        else
            for (int64_t r = 0; r < Mp; r += MR)
                for (int64_t p = 0; p < Dvp / 16; p++)
                    mk_6x16(KB, S + r * KB, KB, Vp + p * kpad * 16 + j0 * 16, O + r * Dvp + p * 16, Dvp, 1);
    }
    for (int64_t t = 0; t < nt; t++)
        for (int64_t g = 0; g < G; g++) {
            int64_t r = t * G + g;
            store_out_row(a, q0 + t0 + t, kh * G + g, O + r * Dvp, st[r]);
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
    int64_t Mp = (qt * G + MR - 1) / MR * MR, Dvp = (a->Dv + 15) / 16 * 16;
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
    size_t floats = (size_t)(Mp * a->Dqk + Mp * KB + Mp * Dvp) + 6 * (size_t)Mp + 16;
    size_t bytes = (floats * sizeof(float) + 63) / 64 * 64;
    int nt = lk_plan_units(max_units);
    prefill_ctx c;
    memset(&c, 0, sizeof c);
    c.a = a, c.qt = qt, c.G = G, c.Mp = Mp, c.Dvp = Dvp, c.scratch_bytes = bytes;
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
} decode_ctx;

#define DB 16     /* keys per decode block */

/* software prefetch distance in K/V rows along the traversal order: a few KiB ahead
 * (measured: a dot-product loop over 256-byte rows streams at ~5.5 GB/s per core
 * without it, ~8-9 GB/s with 1-4 KiB, and gains nothing at 16 KiB and beyond) */
#ifndef PF_ROWS
#define PF_ROWS 8
#endif

/* elements between consecutive heads of one key (ND: s2; NZ: a head is D/16 chunks) */
static inline int64_t head_step(const lk_paged *c) {
    return c->layout == LK_KV_NZ ? (c->D / 16) * c->s1 : c->s2;
}

/* q . k over D dims of a row at p (16-dim chunks cs elements apart), dtype constant
 * after inlining */
static inline __attribute__((always_inline)) float dot_row(const float *q, const char *p, int64_t cs,
                                                            int64_t D, lk_dtype dt) {
    int64_t es = lk_esize(dt);
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    for (int64_t d = 0; d < D; d += 16, p += cs * es) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), lk8_load(p, dt), s0);
        if (d + 8 < D) s1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), lk8_load(p + 8 * es, dt), s1);
    }
    return lk8_hsum(_mm256_add_ps(s0, s1));
}

/* prefetch a K/V row of D dims of `es` bytes in 16-dim chunks `cs` elements apart
 * (cs == 16: contiguous ND row) */
static inline void prefetch_row(const char *p, int64_t cs, int64_t D, int64_t es) {
    if (cs == 16) {
        for (int64_t off = 0; off < D * es; off += 64) _mm_prefetch(p + off, _MM_HINT_T0);
    } else {
        for (int64_t c = 0; c < D / 16; c++) _mm_prefetch(p + c * cs * es, _MM_HINT_T0);
    }
}

/* o += w0 v0 + w1 v1 + w2 v2 + w3 v3 (rows of D dims, 16-dim chunks cs apart) */
static inline __attribute__((always_inline)) void axpy4_row(float *o, const float *w, const char *const *v,
                                                             int64_t cs, int64_t D, lk_dtype dt) {
    int64_t es = lk_esize(dt);
    __m256 w0 = _mm256_set1_ps(w[0]), w1 = _mm256_set1_ps(w[1]), w2 = _mm256_set1_ps(w[2]), w3 = _mm256_set1_ps(w[3]);
    for (int64_t d = 0; d < D; d += 8) {
        int64_t off = ((d >> 4) * cs + (d & 15)) * es;
        __m256 acc = _mm256_loadu_ps(o + d);
        acc = _mm256_fmadd_ps(w0, lk8_load(v[0] + off, dt), acc);
        acc = _mm256_fmadd_ps(w1, lk8_load(v[1] + off, dt), acc);
        acc = _mm256_fmadd_ps(w2, lk8_load(v[2] + off, dt), acc);
        acc = _mm256_fmadd_ps(w3, lk8_load(v[3] + off, dt), acc);
        _mm256_storeu_ps(o + d, acc);
    }
}

/* o += w0 v0 + ... for the n < 4 keys left at a block end (padding them with weight 0
 * would turn an infinite V value into NaN: 0 * inf) */
static inline __attribute__((always_inline)) void axpyn_row(float *o, const float *w, const char *const *v, int n,
                                                             int64_t cs, int64_t D, lk_dtype dt) {
    int64_t es = lk_esize(dt);
    for (int64_t d = 0; d < D; d += 8) {
        int64_t off = ((d >> 4) * cs + (d & 15)) * es;
        __m256 acc = _mm256_loadu_ps(o + d);
        for (int k = 0; k < n; k++) acc = _mm256_fmadd_ps(_mm256_set1_ps(w[k]), lk8_load(v[k] + off, dt), acc);
        _mm256_storeu_ps(o + d, acc);
    }
}

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
    float *sc = c->sbuf + (size_t)tid * (size_t)(Hq * DB);       // [Hq][DB]
    for (int64_t i = 0; i < q_len; i++) {
        int64_t lo, hi;
        lk_attn_window(a, i, q_len, k_len, &lo, &hi);
        if (lo < j0) lo = j0;
        if (hi > j1 - 1) hi = j1 - 1;
        int64_t row0 = c->state_base[b] + (ch * q_len + i) * Hq;
        lk_online_state *st = c->st + row0;
        float *o = c->st_o + row0 * Dv;
        for (int64_t h = 0; h < Hq; h++) {
            st[h] = lk_online_init();
            memset(o + h * Dv, 0, sizeof(float) * (size_t)Dv);
            load_q_row(a, q0 + i, h, qs + h * Dqk);
        }
        for (int64_t jb = lo; jb <= hi; jb += DB) {
            int64_t nb = hi - jb + 1 < DB ? hi - jb + 1 : DB;
            /* row offsets of head 0 of this block's keys and the next block's (prefetch):
             * the page lookup and divisions once per key, not per (key, head) */
            int64_t kbase[2 * DB], vbase[2 * DB], nk = hi - jb + 1 < 2 * DB ? hi - jb + 1 : 2 * DB;
            for (int64_t jj = 0; jj < nk; jj++) {
                kbase[jj] = lk_attn_key_off(a, &a->kc, b, jb + jj, 0, 0) * kes;
                vbase[jj] = lk_attn_key_off(a, &a->vc, b, jb + jj, 0, 0) * ves;
            }
            int64_t pj = 0, ph = PF_ROWS; /* prefetch cursor: PF_ROWS rows ahead in (key, head) order */
            while (ph >= Hk) ph -= Hk, pj++;
            for (int64_t jj = 0; jj < nb; jj++)
                for (int64_t kh = 0; kh < Hk; kh++) {
                    const char *kp = (const char *)a->kc.data + kbase[jj] + kh * khs;
                    if (pj < nk) prefetch_row((const char *)a->kc.data + kbase[pj] + ph * khs, kcs, Dqk, kes);
                    if (++ph == Hk) ph = 0, pj++;
                    for (int64_t g = 0; g < G; g++) {
                        int64_t h = kh * G + g;
                        float s = dot_row(qs + h * Dqk, kp, kcs, Dqk, kt);
                        if (a->softcap > 0) s = a->softcap * tanhf(s / a->softcap);
                        sc[h * DB + jj] = s;
                    }
                }
            for (int64_t h = 0; h < Hq; h++) {
                float *sh = sc + h * DB, bmax = -INFINITY;
                for (int64_t jj = nb; jj < DB; jj++) sh[jj] = -INFINITY;
                __m256 s0 = _mm256_loadu_ps(sh), s1 = _mm256_loadu_ps(sh + 8);
                bmax = lk8_hmax(_mm256_max_ps(s0, s1));
                float alpha = lk_online_rescale(&st[h], bmax);
                __m256 shift = _mm256_set1_ps(lk_online_shift(st[h].m));
                s0 = lk8_exp(_mm256_sub_ps(s0, shift)), s1 = lk8_exp(_mm256_sub_ps(s1, shift));
                _mm256_storeu_ps(sh, s0), _mm256_storeu_ps(sh + 8, s1);
                lk_online_add(&st[h], lk8_hsum(_mm256_add_ps(s0, s1)));
                if (alpha != 1.0f) {
                    __m256 va = _mm256_set1_ps(alpha);
                    for (int64_t d = 0; d < Dv; d += 8)
                        _mm256_storeu_ps(o + h * Dv + d, _mm256_mul_ps(_mm256_loadu_ps(o + h * Dv + d), va));
                }
            }
            for (int64_t jj = 0; jj < nb; jj += 4)
                for (int64_t kh = 0; kh < Hk; kh++) {
                    const char *vp[4];
                    /* prefetch the same 4 keys PF_ROWS / 4 heads ahead (or the next group's) */
                    int64_t ph = kh + PF_ROWS / 4, pj = jj;
                    if (ph >= Hk) ph -= Hk, pj += 4;
                    for (int k = 0; k < 4; k++) { /* past the block end: a valid row with weight 0 */
                        vp[k] = (const char *)a->vc.data + vbase[jj + k < nb ? jj + k : jj] + kh * vhs;
                        if (pj + k < nk) prefetch_row((const char *)a->vc.data + vbase[pj + k] + ph * vhs, vcs, Dv, ves);
                    }
                    for (int64_t g = 0; g < G; g++) {
                        int64_t h = kh * G + g;
                        float w[4];
                        for (int k = 0; k < 4; k++) w[k] = jj + k < nb ? sc[h * DB + jj + k] : 0.0f;
                        if (jj + 4 <= nb) axpy4_row(o + h * Dv, w, vp, vcs, Dv, vt);
                        else axpyn_row(o + h * Dv, w, vp, (int)(nb - jj), vcs, Dv, vt);
                    }
                }
        }
    }
}

static void decode_unit(void *vctx, int64_t u, int tid) {
    decode_ctx *c = vctx;
    int64_t b = c->unit_b[u], ch = c->unit_c[u];
    lk_dtype kt = c->a->kc.dtype, vt = c->a->vc.dtype;
    if (kt == LK_BF16 && vt == LK_BF16) decode_chunk(c, b, ch, tid, LK_BF16, LK_BF16);
    else if (kt == LK_F16 && vt == LK_F16) decode_chunk(c, b, ch, tid, LK_F16, LK_F16);
    else if (kt == LK_F32 && vt == LK_F32) decode_chunk(c, b, ch, tid, LK_F32, LK_F32);
    else decode_chunk(c, b, ch, tid, kt, vt);
}

/* ------------------------------------------------------------------ driver */

static int simd_layout_ok(const lk_attn_args *a) {
    const lk_paged *k = &a->kc, *v = &a->vc;
    if (a->Dqk % 8 || a->Dv % 8 || k->s3 != 1 || v->s3 != 1) return 0;
    if (k->layout == LK_KV_NZ && (a->Dqk % 16 || a->Dv % 16)) return 0;
    return 1;
}

/* rows outside every request: out = 0, lse = -inf */
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
                    malloc(sizeof(float) * (size_t)(rows * a->Dv + 1)), NULL, qmax * a->Hq * a->Dqk, NULL};
    c.qbuf = malloc(sizeof(float) * (size_t)(nt * c.qbuf_stride));
    c.sbuf = malloc(sizeof(float) * (size_t)(nt * a->Hq * DB));
    lk_status st = LK_ERR_NOMEM;
    if (c.unit_b && c.unit_c && c.st && c.st_o && c.qbuf && c.sbuf) {
        int64_t u = 0;
        for (int64_t b = 0; b < B; b++) {
            int64_t ql = a->cu_q[b + 1] - a->cu_q[b];
            int64_t nch = ql ? (a->k_len[b] + DECODE_CHUNK - 1) / DECODE_CHUNK : 0;
            if (ql && !nch) nch = 1;
            for (int64_t k = 0; k < nch; k++) c.unit_b[u] = b, c.unit_c[u] = k, u++;
        }
        lk_parallel_units(n_units, nt, decode_unit, &c);
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
                        __m256 va = _mm256_set1_ps(alpha), vw = _mm256_set1_ps(w);
                        for (int64_t d = 0; d < a->Dv; d += 8)
                            _mm256_storeu_ps(o + d, _mm256_fmadd_ps(vw, _mm256_loadu_ps(ok + d), _mm256_mul_ps(va, _mm256_loadu_ps(o + d))));
                    }
                    store_out_row(a, q0 + i, h, o, acc);
                }
        }
        st = LK_OK;
    }
    free(c.unit_b), free(c.unit_c), free(state_base), free(c.st), free(c.st_o);
    free(c.qbuf), free(c.sbuf);
    return st;
}

lk_status lk_avx2_flash_attn(const lk_attn_args *a) {
    if (!simd_layout_ok(a)) return lk_ref_flash_attn(a);
    lk_status st = use_decode(a) ? run_decode(a) : run_prefill(a);
    if (st == LK_OK) zero_padding_rows(a);
    return st;
}
