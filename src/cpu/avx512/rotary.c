/*
 * rotary_embedding, AVX-512 (F/BW/DQ/VL).
 *
 * Same formula, shapes, rounding (no FMA: bit-identical to ref/rotary.c), fast-path
 * condition, work split and software prefetch of short-run rows as avx2/rotary.c;
 * 16 pairs per step, masked loads/stores for the row tail.
 *
 * GPT-J: 32 interleaved values v0, v1 are split in-lane with vshufps into x (even) and
 * y (odd); per 128-bit lane L that holds pairs 2L, 2L+1, 8+2L, 9+2L, i.e. pair order
 * 0 1 8 9 | 2 3 10 11 | 4 5 12 13 | 6 7 14 15. The staged cos/sin are stored in that
 * order (one vpermpd per 16 pairs per token), and vunpcklps/vunpckhps restore v0, v1.
 */
#include "../kernels.h"
#include "simd.h"

#define CHUNK 256 /* pairs per staging block (multiple of 16) */

typedef struct {
    float c[CHUNK], s[CHUNK]; /* f32 cos / sin of pairs [i0, i0 + n), zero-padded to 16 */
} cs_block;

/* 16-pair order produced by the GPT-J vshufps split: 64-bit units 0 4 1 5 2 6 3 7 */
static inline __m512 gptj_lane_order(__m512 v) {
    const __m512i idx = _mm512_setr_epi64(0, 4, 1, 5, 2, 6, 3, 7);
    return _mm512_castpd_ps(_mm512_permutexvar_pd(idx, _mm512_castps_pd(v)));
}

/* stage cache pairs [i0, i0 + n) of row cs (cos at [0, half), sin at [half, 2 half)) */
static void stage(cs_block *b, const char *cs, lk_dtype dt, int64_t half, int64_t i0, int64_t n,
                  int gptj) {
    size_t es = lk_dtype_size(dt);
    const char *pc = cs + i0 * es, *ps = cs + (half + i0) * es; // [n] each
    for (int64_t j = 0; j < n; j += 16) {
        __m512 c = lk16_load(pc + j * es, dt, n - j), s = lk16_load(ps + j * es, dt, n - j);
        if (gptj) {
            c = gptj_lane_order(c);
            s = gptj_lane_order(s);
        }
        _mm512_storeu_ps(b->c + j, c);
        _mm512_storeu_ps(b->s + j, s);
    }
}

static inline size_t es_of(lk_dtype dt) { return dt == LK_F32 ? 4 : 2; }

/* x' = x*c - y*s, y' = y*c + x*s on 16 pairs */
static inline void rot16(__m512 *x, __m512 *y, const float *c, const float *s) {
    __m512 vc = _mm512_loadu_ps(c), vs = _mm512_loadu_ps(s);
    __m512 xo = _mm512_sub_ps(_mm512_mul_ps(*x, vc), _mm512_mul_ps(*y, vs));
    __m512 yo = _mm512_add_ps(_mm512_mul_ps(*y, vc), _mm512_mul_ps(*x, vs));
    *x = xo;
    *y = yo;
}

/* NeoX: pairs (i, half + i) for i in [i0, i0 + n) of one head row */
static inline void rot_neox(char *row, lk_dtype dt, int64_t half, int64_t i0, int64_t n,
                            const cs_block *b) {
    size_t es = es_of(dt);
    char *px = row + i0 * es, *py = row + (half + i0) * es; // [n] each
    for (int64_t j = 0; j < n; j += 16) {
        __m512 x = lk16_load(px + j * es, dt, n - j), y = lk16_load(py + j * es, dt, n - j);
        rot16(&x, &y, b->c + j, b->s + j);
        lk16_store(px + j * es, dt, x, n - j);
        lk16_store(py + j * es, dt, y, n - j);
    }
}

/* GPT-J on 32 interleaved values v0 = row[0..16), v1 = row[16..32) (16 pairs) */
static inline void rot16_gptj(__m512 *v0, __m512 *v1, const float *c, const float *s) {
    __m512 x = _mm512_shuffle_ps(*v0, *v1, _MM_SHUFFLE(2, 0, 2, 0));
    __m512 y = _mm512_shuffle_ps(*v0, *v1, _MM_SHUFFLE(3, 1, 3, 1));
    rot16(&x, &y, c, s);
    *v0 = _mm512_unpacklo_ps(x, y);
    *v1 = _mm512_unpackhi_ps(x, y);
}

/* GPT-J: pairs (2i, 2i + 1) for i in [i0, i0 + n) of one head row */
static inline void rot_gptj(char *row, lk_dtype dt, int64_t i0, int64_t n, const cs_block *b) {
    size_t es = es_of(dt);
    char *p = row + 2 * i0 * es; // [2n]
    for (int64_t j = 0; j < n; j += 16) {
        int64_t m = 2 * (n - j); /* values left; >= 32 is a full step */
        char *p0 = p + 2 * j * es, *p1 = p0 + 16 * es;
        __m512 v0 = lk16_load(p0, dt, m);
        __m512 v1 = m > 16 ? lk16_load(p1, dt, m - 16) : _mm512_setzero_ps();
        rot16_gptj(&v0, &v1, b->c + j, b->s + j);
        lk16_store(p0, dt, v0, m);
        if (m > 16) lk16_store(p1, dt, v1, m - 16);
    }
}

/* pairs [i0, i0 + n) of every head of x[t] (x: [T, H, D]); inlined once per dtype so
 * the dtype tests in the load/store helpers fold away */
static inline __attribute__((always_inline)) void
rotate_heads_dt(const lk_tensor *x, lk_dtype dt, int64_t t, int64_t half, int64_t i0, int64_t n,
                const cs_block *b, int is_neox) {
    for (int64_t h = 0; h < x->shape[1]; h++) {
        char *row = lk_at(x, t * x->stride[0] + h * x->stride[1]); // [D]
        if (is_neox) rot_neox(row, dt, half, i0, n, b);
        else rot_gptj(row, dt, i0, n, b);
    }
}

static void rotate_heads(const lk_tensor *x, int64_t t, int64_t half, int64_t i0, int64_t n,
                         const cs_block *b, int is_neox) {
    if (x->dtype == LK_F32) rotate_heads_dt(x, LK_F32, t, half, i0, n, b, is_neox);
    else if (x->dtype == LK_F16) rotate_heads_dt(x, LK_F16, t, half, i0, n, b, is_neox);
    else rotate_heads_dt(x, LK_BF16, t, half, i0, n, b, is_neox);
}

/* Rows whose rotated bytes form short runs in memory (q_pe inside q, partial rotary,
 * a single k head in a wide kv buffer) defeat the hardware stream prefetchers and leave
 * the loop waiting on one miss after another; those get a software prefetch (into L2)
 * of the next token's rows. Long contiguous runs are left to the hardware. */
static int wants_prefetch(const lk_tensor *x, int64_t rot) {
    int64_t H = x->shape[1], run = rot;
    if (H == 1 || x->stride[1] == rot) {
        run = H * rot;
        if (x->shape[0] == 1 || x->stride[0] == run) return 0; /* one stream */
    }
    return run * (int64_t)es_of(x->dtype) < 4096;
}

static void prefetch_token(const lk_tensor *x, int64_t t, int64_t rot) {
    int64_t bytes = rot * (int64_t)es_of(x->dtype);
    for (int64_t h = 0; h < x->shape[1]; h++) {
        const char *row = lk_at(x, t * x->stride[0] + h * x->stride[1]); // [D]
        for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch(row + o, _MM_HINT_T1);
        _mm_prefetch(row + bytes - 1, _MM_HINT_T1);
    }
}

typedef struct {
    const lk_rotary_args *a;
    int prefetch_q, prefetch_k;
} rotary_ctx;

static void rotary_tokens(void *ctx, int64_t t0, int64_t t1) {
    const rotary_ctx *rc = ctx;
    const lk_rotary_args *a = rc->a;
    const lk_tensor *p = &a->positions, *cs = &a->cos_sin;
    int64_t half = cs->shape[1] / 2;
    cs_block b;
    for (int64_t t = t0; t < t1; t++) {
        int64_t pos = lk_load_index(p->data, p->dtype, t * p->stride[0]);
        const char *row = lk_at(cs, pos * cs->stride[0]); // [rot]
        if (t + 1 < t1 && rc->prefetch_q) prefetch_token(&a->q, t + 1, 2 * half);
        if (t + 1 < t1 && rc->prefetch_k) prefetch_token(&a->k, t + 1, 2 * half);
        for (int64_t i0 = 0; i0 < half; i0 += CHUNK) {
            int64_t n = half - i0 < CHUNK ? half - i0 : CHUNK;
            stage(&b, row, cs->dtype, half, i0, n, !a->is_neox);
            rotate_heads(&a->q, t, half, i0, n, &b, a->is_neox);
            if (a->has_k) rotate_heads(&a->k, t, half, i0, n, &b, a->is_neox);
        }
    }
}

lk_status lk_avx512_rotary_embedding(const lk_rotary_args *a) {
    if (a->q.stride[2] != 1 || (a->has_k && a->k.stride[2] != 1) || a->cos_sin.stride[1] != 1)
        return lk_ref_rotary_embedding(a);
    int64_t rot = a->cos_sin.shape[1];
    int64_t bytes = rot * (int64_t)lk_dtype_size(a->cos_sin.dtype) +
                    2 * rot * a->q.shape[1] * (int64_t)lk_dtype_size(a->q.dtype);
    if (a->has_k) bytes += 2 * rot * a->k.shape[1] * (int64_t)lk_dtype_size(a->k.dtype);
    rotary_ctx rc = {a, wants_prefetch(&a->q, rot), a->has_k && wants_prefetch(&a->k, rot)};
    lk_parallel_for(a->positions.shape[0], bytes, rotary_tokens, &rc);
    return LK_OK;
}
