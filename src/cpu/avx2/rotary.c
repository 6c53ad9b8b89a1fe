/*
 * rotary_embedding, AVX2 + FMA + F16C.
 *
 *   c = cache[pos[t], i], s = cache[pos[t], rot/2 + i]       for i in [0, rot/2)
 *   NeoX  pair (x, y) = (row[i], row[i + rot/2]);  GPT-J pair (x, y) = (row[2i], row[2i + 1])
 *   x' = x*c - y*s;  y' = y*c + x*s
 * Products are rounded to f32, then subtracted / added: no FMA (the op is memory-bound;
 * the ISO C build mode keeps the compiler from contracting), so every ISA matches
 * ref/rotary.c bit for bit and the tests compare them bitwise.
 *
 * Shapes: positions [T]; q [T, Hq, D]; k [T, Hk, D] (optional); cos_sin [max_pos, rot].
 * Fast path needs last-dim stride 1 on q, k and the cache; token and head strides are
 * free (q and k may be slices of one fused qkv buffer). Other layouts go to the reference.
 *
 * Work split: tokens, contiguous ranges per thread (lk_parallel_for). Per token the
 * cache row is converted to f32 once into a staging block of up to CHUNK pairs, then
 * every head of q and k is rotated from it (rot/2 > CHUNK is done in CHUNK pieces).
 * Rows whose rotated parts are short scattered runs (DeepSeek's q_pe = q[..., 128:192],
 * k_pe inside kv_a) are software-prefetched one token ahead: measured 2-3x on bf16.
 * Other inputs of LK_STREAM_MIN_BYTES or more prefetch, with each row, the row about
 * PF_AHEAD bytes of work later (into L1): the loop reads and writes in place, and
 * without it the loads of the next rows wait on memory while the core computes
 * (Llama-3-8B T = 4096 bf16 at 2 threads: 16 -> 21 GB/s, medians of alternating runs).
 *
 * Variants:
 *  - NeoX: x and y are two contiguous half-rows; 8 pairs per step, plain vector maths.
 *    bf16 q/k whose staged cos/sin hold no NaN: 16 pairs per step in lk8x2_load_bf16's
 *    in-lane order (cos/sin staged a second time in that order), rounded without the
 *    NaN branch and stored with one pack per 16 values: about twice the values per
 *    instruction of the 8-pair path, which left bf16 short of memory speed.
 *  - GPT-J: 16 interleaved values v0, v1 are split in-lane with shufps into x (even)
 *    and y (odd); shufps leaves the pairs in the lane order 0 1 4 5 | 2 3 6 7, so the
 *    staged cos/sin are stored in that same order (one vpermpd per 8 pairs per token,
 *    not per head), and unpcklps/unpckhps put x', y' back into v0, v1 order.
 *    bf16 q/k whose staged cos/sin hold no NaN: one 32-byte load is 8 pairs, each in
 *    one 32-bit lane; x (low half) shifted up and y (high half) masked are f32 values
 *    in plain pair order (cos/sin staged a second time in that order), and the rounded
 *    results go back as x' shifted down blended with y': no shuffles, no pack.
 */
#include "../kernels.h"
#include "simd.h"

#define CHUNK 256     /* pairs per staging block (multiple of 8) */
#define PF_AHEAD 2048 /* bytes of work the prefetch runs ahead on large inputs */

typedef struct {
    float c[CHUNK], s[CHUNK]; /* f32 cos / sin of pairs [i0, i0 + n), zero-padded to 8 */
    /* bf16 NeoX fast path: the same values per 16 pairs in lk8x2_load_bf16's in-lane
     * order (pairs 0-3 8-11 | 4-7 12-15), and whether the staged values hold no NaN */
    float cu[CHUNK], su[CHUNK];
    int nan_free;
} cs_block;

/* 8-pair order produced by the GPT-J shufps split: pairs 0 1 4 5 2 3 6 7 */
static inline __m256 gptj_lane_order(__m256 v) {
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(v), _MM_SHUFFLE(3, 1, 2, 0)));
}

/* stage cache pairs [i0, i0 + n) of row cs (cos at [0, half), sin at [half, 2 half)) */
static void stage(cs_block *b, const char *cs, lk_dtype dt, int64_t half, int64_t i0, int64_t n,
                  int gptj, int natural) {
    size_t es = lk_dtype_size(dt);
    const char *pc = cs + i0 * es, *ps = cs + (half + i0) * es; // [n] each
    for (int64_t j = 0; j < n; j += 8) {
        int m = n - j < 8 ? (int)(n - j) : 8;
        __m256 c = m == 8 ? lk8_load(pc + j * es, dt) : lk8_load_part(pc + j * es, dt, m);
        __m256 s = m == 8 ? lk8_load(ps + j * es, dt) : lk8_load_part(ps + j * es, dt, m);
        if (natural) { /* GPT-J bf16: cu / su in plain pair order */
            _mm256_storeu_ps(b->cu + j, c);
            _mm256_storeu_ps(b->su + j, s);
        }
        if (gptj) {
            c = gptj_lane_order(c);
            s = gptj_lane_order(s);
        }
        _mm256_storeu_ps(b->c + j, c);
        _mm256_storeu_ps(b->s + j, s);
    }
}

/* b->nan_free: the staged cos / sin of [0, n) hold no NaN */
static void check_nan(cs_block *b, int64_t n) {
    __m256 bad = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; j += 8) {
        __m256 c = _mm256_loadu_ps(b->c + j), s = _mm256_loadu_ps(b->s + j);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(c, s, _CMP_UNORD_Q));
    }
    b->nan_free = _mm256_movemask_ps(bad) == 0;
}

/* NeoX bf16: the in-lane order copy (cu, su) of whole 16-pair groups */
static void stage_unpacked(cs_block *b, int64_t n) {
    for (int64_t j = 0; j + 16 <= n; j += 16)
        for (int k = 0; k < 4; k++) {
            b->cu[j + k] = b->c[j + k], b->cu[j + 4 + k] = b->c[j + 8 + k];
            b->cu[j + 8 + k] = b->c[j + 4 + k], b->cu[j + 12 + k] = b->c[j + 12 + k];
            b->su[j + k] = b->s[j + k], b->su[j + 4 + k] = b->s[j + 8 + k];
            b->su[j + 8 + k] = b->s[j + 4 + k], b->su[j + 12 + k] = b->s[j + 12 + k];
        }
}

static inline size_t es_of(lk_dtype dt) { return dt == LK_F32 ? 4 : 2; }

/* store a (8 values) to pa and b to pb, rounded once to dt; for bf16 one pack and one
 * permute serve both vectors (lk8_store would pack each half on its own) */
static inline void store2(void *pa, void *pb, lk_dtype dt, __m256 a, __m256 b) {
    if (dt != LK_BF16) {
        lk8_store(pa, dt, a);
        lk8_store(pb, dt, b);
        return;
    }
    __m256i ab = _mm256_packus_epi32(lk8_bf16_bits(a), lk8_bf16_bits(b)); /* a0-3 b0-3 | a4-7 b4-7 */
    ab = _mm256_permute4x64_epi64(ab, _MM_SHUFFLE(3, 1, 2, 0));             /* a0-7 | b0-7 */
    _mm_storeu_si128((__m128i *)pa, _mm256_castsi256_si128(ab));
    _mm_storeu_si128((__m128i *)pb, _mm256_extracti128_si256(ab, 1));
}

/* x' = x*c - y*s, y' = y*c + x*s on 8 pairs */
static inline void rot8(__m256 *x, __m256 *y, const float *c, const float *s) {
    __m256 vc = _mm256_loadu_ps(c), vs = _mm256_loadu_ps(s);
    __m256 xo = _mm256_sub_ps(_mm256_mul_ps(*x, vc), _mm256_mul_ps(*y, vs));
    __m256 yo = _mm256_add_ps(_mm256_mul_ps(*y, vc), _mm256_mul_ps(*x, vs));
    *x = xo;
    *y = yo;
}

/* NeoX: pairs (i, half + i) for i in [i0, i0 + n) of one head row */
static inline void rot_neox(char *row, lk_dtype dt, int64_t half, int64_t i0, int64_t n,
                            const cs_block *b) {
    size_t es = es_of(dt);
    char *px = row + i0 * es, *py = row + (half + i0) * es; // [n] each
    int64_t j = 0;
    if (dt == LK_BF16 && b->nan_free) /* 16 pairs per step, in-lane order, no permutes */
        for (; j + 16 <= n; j += 16) {
            __m256 x0, x1, y0, y1;
            lk8x2_load_bf16(px + j * 2, &x0, &x1);
            lk8x2_load_bf16(py + j * 2, &y0, &y1);
            rot8(&x0, &y0, b->cu + j, b->su + j);
            rot8(&x1, &y1, b->cu + j + 8, b->su + j + 8);
            _mm256_storeu_si256((__m256i *)(px + j * 2), _mm256_packus_epi32(lk8_bf16_bits_nonan(x0), lk8_bf16_bits_nonan(x1)));
            _mm256_storeu_si256((__m256i *)(py + j * 2), _mm256_packus_epi32(lk8_bf16_bits_nonan(y0), lk8_bf16_bits_nonan(y1)));
        }
    for (; j + 8 <= n; j += 8) {
        __m256 x = lk8_load(px + j * es, dt), y = lk8_load(py + j * es, dt);
        rot8(&x, &y, b->c + j, b->s + j);
        store2(px + j * es, py + j * es, dt, x, y);
    }
    if (j < n) {
        int m = (int)(n - j);
        __m256 x = lk8_load_part(px + j * es, dt, m), y = lk8_load_part(py + j * es, dt, m);
        rot8(&x, &y, b->c + j, b->s + j);
        lk8_store_part(px + j * es, dt, x, m);
        lk8_store_part(py + j * es, dt, y, m);
    }
}

/* GPT-J on 16 interleaved values v0 = row[0..8), v1 = row[8..16) (8 pairs) */
static inline void rot8_gptj(__m256 *v0, __m256 *v1, const float *c, const float *s) {
    __m256 x = _mm256_shuffle_ps(*v0, *v1, _MM_SHUFFLE(2, 0, 2, 0)); /* pairs 0 1 4 5 | 2 3 6 7 */
    __m256 y = _mm256_shuffle_ps(*v0, *v1, _MM_SHUFFLE(3, 1, 3, 1));
    rot8(&x, &y, c, s);
    *v0 = _mm256_unpacklo_ps(x, y);
    *v1 = _mm256_unpackhi_ps(x, y);
}

/* GPT-J: pairs (2i, 2i + 1) for i in [i0, i0 + n) of one head row */
static inline void rot_gptj(char *row, lk_dtype dt, int64_t i0, int64_t n, const cs_block *b) {
    size_t es = es_of(dt);
    char *p = row + 2 * i0 * es; // [2n]
    int64_t j = 0;
    if (dt == LK_BF16 && b->nan_free) { /* 8 pairs per 32-byte load: x even, y odd halves */
        for (; j + 8 <= n; j += 8) {
            __m256 x, y;
            lk16_bf16_split(_mm256_loadu_si256((const __m256i *)(p + 4 * j)), &x, &y);
            rot8(&x, &y, b->cu + j, b->su + j);
            _mm256_storeu_si256((__m256i *)(p + 4 * j), lk16_bf16_join_nonan(x, y));
        }
    }
    for (; j + 8 <= n; j += 8) {
        char *p0 = p + 2 * j * es, *p1 = p0 + 8 * es;
        __m256 v0 = lk8_load(p0, dt), v1 = lk8_load(p1, dt);
        rot8_gptj(&v0, &v1, b->c + j, b->s + j);
        store2(p0, p1, dt, v0, v1);
    }
    if (j < n) {
        int m = (int)(2 * (n - j)); /* values left: 2 .. 14 */
        char *p0 = p + 2 * j * es, *p1 = p0 + 8 * es;
        __m256 v0 = m >= 8 ? lk8_load(p0, dt) : lk8_load_part(p0, dt, m);
        __m256 v1 = m > 8 ? lk8_load_part(p1, dt, m - 8) : _mm256_setzero_ps();
        rot8_gptj(&v0, &v1, b->c + j, b->s + j);
        if (m >= 8) lk8_store(p0, dt, v0);
        else lk8_store_part(p0, dt, v0, m);
        if (m > 8) lk8_store_part(p1, dt, v1, m - 8);
    }
}

/* pairs [i0, i0 + n) of every head of x[t] (x: [T, H, D]); inlined once per dtype so
 * the dtype tests in the load/store helpers fold away. `ahead`: with each row, prefetch
 * the same part of the row about PF_AHEAD bytes of work later (A heads on, in this
 * token or the next: any token and head strides) */
static inline __attribute__((always_inline)) void
rotate_heads_dt(const lk_tensor *x, lk_dtype dt, int64_t t, int64_t half, int64_t i0, int64_t n,
                const cs_block *b, int is_neox, int ahead) {
    int64_t H = x->shape[1], bytes = 2 * n * (int64_t)es_of(dt); /* this chunk's part of a row */
    if (H <= 0 || n <= 0) return;
    int64_t A = ahead ? PF_AHEAD / bytes + 1 : 0, ht = t + A / H, hh = A % H; /* row t, h + A */
    for (int64_t h = 0; h < H; h++) {
        char *row = lk_at(x, t * x->stride[0] + h * x->stride[1]); // [D]
        if (ahead && ht < x->shape[0]) {
            const char *p = (const char *)lk_at(x, ht * x->stride[0] + hh * x->stride[1]) + i0 * (int64_t)es_of(dt);
            for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch(p + o, _MM_HINT_T0);
        }
        if (++hh == H) hh = 0, ht++;
        if (is_neox) rot_neox(row, dt, half, i0, n, b);
        else rot_gptj(row, dt, i0, n, b);
    }
}

static void rotate_heads(const lk_tensor *x, int64_t t, int64_t half, int64_t i0, int64_t n,
                         const cs_block *b, int is_neox, int ahead) {
    if (x->dtype == LK_F32) rotate_heads_dt(x, LK_F32, t, half, i0, n, b, is_neox, ahead);
    else if (x->dtype == LK_F16) rotate_heads_dt(x, LK_F16, t, half, i0, n, b, is_neox, ahead);
    else rotate_heads_dt(x, LK_BF16, t, half, i0, n, b, is_neox, ahead);
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
    int bf16_neox; /* q and k are bf16, NeoX: stage the in-lane order copy too */
    int bf16_gptj; /* q and k are bf16, GPT-J: stage the plain order copy too */
    int ahead;     /* LK_STREAM_MIN_BYTES or more of q and k: prefetch PF_AHEAD ahead */
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
            stage(&b, row, cs->dtype, half, i0, n, !a->is_neox, rc->bf16_gptj);
            b.nan_free = 0;
            if (rc->bf16_neox) stage_unpacked(&b, n);
            if (rc->bf16_neox || rc->bf16_gptj) check_nan(&b, n);
            rotate_heads(&a->q, t, half, i0, n, &b, a->is_neox, rc->ahead && !rc->prefetch_q);
            if (a->has_k) rotate_heads(&a->k, t, half, i0, n, &b, a->is_neox, rc->ahead && !rc->prefetch_k);
        }
    }
}

lk_status lk_avx2_rotary_embedding(const lk_rotary_args *a) {
    if (a->q.stride[2] != 1 || (a->has_k && a->k.stride[2] != 1) || a->cos_sin.stride[1] != 1)
        return lk_ref_rotary_embedding(a);
    int64_t rot = a->cos_sin.shape[1];
    int64_t bytes = rot * (int64_t)lk_dtype_size(a->cos_sin.dtype) +
                    2 * rot * a->q.shape[1] * (int64_t)lk_dtype_size(a->q.dtype);
    if (a->has_k) bytes += 2 * rot * a->k.shape[1] * (int64_t)lk_dtype_size(a->k.dtype);
    rotary_ctx rc = {a, wants_prefetch(&a->q, rot), a->has_k && wants_prefetch(&a->k, rot),
                     a->is_neox && a->q.dtype == LK_BF16 && (!a->has_k || a->k.dtype == LK_BF16) &&
                         rot / 2 >= 16,
                     !a->is_neox && a->q.dtype == LK_BF16 && (!a->has_k || a->k.dtype == LK_BF16),
                     a->positions.shape[0] * (bytes - rot * (int64_t)lk_dtype_size(a->cos_sin.dtype)) >=
                         LK_STREAM_MIN_BYTES};
    lk_parallel_for(a->positions.shape[0], bytes, rotary_tokens, &rc);
    return LK_OK;
}
