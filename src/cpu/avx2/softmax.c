/*
 * causal_softmax, AVX2 + FMA + F16C.
 *
 *   query row i sees keys j < nv(i) = clamp(i + k_len - q_len + 1, 0, k_len)
 *   out[i, j] = exp(x[i, j] - shift) * inv(l) for j < nv, 0 for j >= nv
 *   shift = max visible (0 if -inf), l = sum exp(x - shift); inv(l) = 1 / l, 0 if l = 0
 * Rules (-inf, NaN, +inf, rows that see no key) from src/common/attn_state.h, shared
 * with the reference.
 *
 * Shapes: x, out [..., q_len, k_len], each its own float dtype. Fast path: last-dim
 * stride 1 on x and out, else the reference. Work split: the rows (leading dims x
 * q_len), contiguous chunks per thread (lk_parallel_for). Per row: pass 1 max and NaN
 * test (lk8 lanes, tail lanes -inf; a NaN or +inf row is filled with NaN, so the
 * others only need exp of arguments <= 0, lk8_exp_nonpos), pass 2 exp and f32 sum,
 * keeping exp(x - shift) in f32 (in out itself when out is f32, else in a stack buffer
 * of SOFTMAX_SCRATCH floats; longer rows recompute it, same bits), pass 3 scales by inv
 * and rounds once to out's dtype. out may be x itself: each block is loaded before it
 * is stored.
 */
#include <math.h>
#include <string.h>

#include "../../common/attn_state.h"
#include "../kernels.h"
#include "simd.h"

#define SOFTMAX_SCRATCH 8192
/* the pass bodies are inlined into per-dtype wrappers (switches on the dtype with
 * literal cases) so that their loops carry no dtype tests: ~17% less time per row */
#define LK_ALWAYS_INLINE static inline __attribute__((always_inline))

/* element size of a validated float dtype; inline, so literal dtypes fold */
static inline size_t float_size(lk_dtype dt) { return dt == LK_F32 ? 4 : 2; }

/* lanes [0, n) all ones */
static inline __m256 lanes_below(int n) {
    __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx));
}

/* max of x[0, nv) with NaNs skipped (MAXPS keeps its second operand); *any_nan tells
 * whether one was seen */
LK_ALWAYS_INLINE float row_max(const char *x, lk_dtype dt, int64_t nv, int *any_nan) {
    size_t es = float_size(dt);
    __m256 ninf = _mm256_set1_ps(-INFINITY), m0 = ninf, m1 = ninf, m2 = ninf, m3 = ninf;
    __m256 nan = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 32 <= nv; j += 32) {
        __m256 a = lk8_load(x + j * es, dt), b = lk8_load(x + (j + 8) * es, dt);
        __m256 c = lk8_load(x + (j + 16) * es, dt), d = lk8_load(x + (j + 24) * es, dt);
        m0 = _mm256_max_ps(a, m0), m1 = _mm256_max_ps(b, m1);
        m2 = _mm256_max_ps(c, m2), m3 = _mm256_max_ps(d, m3);
        __m256 ab = _mm256_cmp_ps(a, b, _CMP_UNORD_Q), cd = _mm256_cmp_ps(c, d, _CMP_UNORD_Q);
        nan = _mm256_or_ps(nan, _mm256_or_ps(ab, cd));
    }
    for (; j + 8 <= nv; j += 8) {
        __m256 a = lk8_load(x + j * es, dt);
        m0 = _mm256_max_ps(a, m0);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
    }
    if (j < nv) { /* lanes past the row are 0 from the load, -inf for the max */
        int w = (int)(nv - j);
        __m256 a = lk8_load_part(x + j * es, dt, w);
        m1 = _mm256_max_ps(_mm256_blendv_ps(ninf, a, lanes_below(w)), m1);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
    }
    *any_nan = _mm256_movemask_ps(nan) != 0;
    return lk8_hmax(_mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
}

/* sum of exp(x[j] - shift) over [0, nv) (arguments <= 0: the row is not NaN); the
 * terms are stored to e (f32) unless NULL */
LK_ALWAYS_INLINE float exp_sum(const char *x, lk_dtype dt, int64_t nv, float shift, float *e) {
    size_t es = float_size(dt);
    __m256 sh = _mm256_set1_ps(shift), s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t j = 0;
    for (; j + 32 <= nv; j += 32) {
        __m256 p0 = lk8_exp_nonpos(_mm256_sub_ps(lk8_load(x + j * es, dt), sh));
        __m256 p1 = lk8_exp_nonpos(_mm256_sub_ps(lk8_load(x + (j + 8) * es, dt), sh));
        __m256 p2 = lk8_exp_nonpos(_mm256_sub_ps(lk8_load(x + (j + 16) * es, dt), sh));
        __m256 p3 = lk8_exp_nonpos(_mm256_sub_ps(lk8_load(x + (j + 24) * es, dt), sh));
        if (e) {
            _mm256_storeu_ps(e + j, p0), _mm256_storeu_ps(e + j + 8, p1);
            _mm256_storeu_ps(e + j + 16, p2), _mm256_storeu_ps(e + j + 24, p3);
        }
        s0 = _mm256_add_ps(s0, p0), s1 = _mm256_add_ps(s1, p1);
        s2 = _mm256_add_ps(s2, p2), s3 = _mm256_add_ps(s3, p3);
    }
    for (; j + 8 <= nv; j += 8) {
        __m256 p = lk8_exp_nonpos(_mm256_sub_ps(lk8_load(x + j * es, dt), sh));
        if (e) _mm256_storeu_ps(e + j, p);
        s0 = _mm256_add_ps(s0, p);
    }
    if (j < nv) {
        int w = (int)(nv - j);
        __m256 v = lk8_load_part(x + j * es, dt, w);
        __m256 p = _mm256_and_ps(lk8_exp_nonpos(_mm256_sub_ps(v, sh)), lanes_below(w));
        if (e) lk8_store_part(e + j, LK_F32, p, w);
        s1 = _mm256_add_ps(s1, p);
    }
    return lk8_hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
}

/* out[j] = p_j * inv over [0, nv): p_j = src[j] (f32 exps, recompute = 0) or
 * exp(src[j] - shift) (src = x of dtype st, recompute = 1) */
LK_ALWAYS_INLINE void write_probs(char *orow, lk_dtype ot, const char *src, lk_dtype st,
                                  int recompute, float shift, float inv, int64_t nv) {
    size_t oes = float_size(ot), ses = float_size(st);
    __m256 sh = _mm256_set1_ps(shift), vinv = _mm256_set1_ps(inv);
    int64_t j = 0;
    for (; j + 8 <= nv; j += 8) {
        __m256 p = lk8_load(src + j * ses, st);
        if (recompute) p = lk8_exp_nonpos(_mm256_sub_ps(p, sh));
        lk8_store(orow + j * oes, ot, _mm256_mul_ps(p, vinv));
    }
    if (j < nv) {
        int w = (int)(nv - j);
        __m256 p = lk8_load_part(src + j * ses, st, w);
        if (recompute) p = lk8_exp_nonpos(_mm256_sub_ps(p, sh));
        lk8_store_part(orow + j * oes, ot, _mm256_mul_ps(p, vinv), w);
    }
}

/* out[0, n) = value; +0 (the masked part of every row) is all-zero bits in each dtype */
static void fill(char *orow, lk_dtype ot, int64_t n, float value) {
    size_t oes = float_size(ot);
    if (value == 0.0f && !signbit(value)) {
        memset(orow, 0, (size_t)n * oes);
        return;
    }
    __m256 v = _mm256_set1_ps(value);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) lk8_store(orow + j * oes, ot, v);
    if (j < n) lk8_store_part(orow + j * oes, ot, v, (int)(n - j));
}

/* passes 1 and 2 for x's dtype, pass 3 (from f32 exps) for out's dtype */
static float max_pass(const char *x, lk_dtype xt, int64_t nv, int *any_nan) {
    switch (xt) {
    case LK_F32: return row_max(x, LK_F32, nv, any_nan);
    case LK_F16: return row_max(x, LK_F16, nv, any_nan);
    default: return row_max(x, LK_BF16, nv, any_nan);
    }
}

static float exp_pass(const char *x, lk_dtype xt, int64_t nv, float shift, float *e) {
    switch (xt) {
    case LK_F32: return exp_sum(x, LK_F32, nv, shift, e);
    case LK_F16: return exp_sum(x, LK_F16, nv, shift, e);
    default: return exp_sum(x, LK_BF16, nv, shift, e);
    }
}

static void scale_pass(char *orow, lk_dtype ot, const float *e, float inv, int64_t nv) {
    switch (ot) {
    case LK_F32: write_probs(orow, LK_F32, (const char *)e, LK_F32, 0, 0.0f, inv, nv); break;
    case LK_F16: write_probs(orow, LK_F16, (const char *)e, LK_F32, 0, 0.0f, inv, nv); break;
    default: write_probs(orow, LK_BF16, (const char *)e, LK_F32, 0, 0.0f, inv, nv); break;
    }
}

/* pass 3 recomputing the exps from x (rows longer than the scratch; not specialised) */
static void recompute_pass(char *orow, lk_dtype ot, const char *x, lk_dtype xt, float shift,
                           float inv, int64_t nv) {
    write_probs(orow, ot, x, xt, 1, shift, inv, nv);
}

static void softmax_rows(void *ctx, int64_t r0, int64_t r1) {
    const lk_softmax_args *a = ctx;
    const lk_tensor *x = &a->x, *out = &a->out;
    int nd = x->ndim;
    int64_t q_len = x->shape[nd - 2], k_len = x->shape[nd - 1];
    size_t oes = float_size(out->dtype);
    float scratch[SOFTMAX_SCRATCH];
    lk_rowit xi, oi;
    lk_rowit_init(&xi, x, 1, r0);
    lk_rowit_init(&oi, out, 1, r0);
    for (int64_t r = r0; r < r1; r++, lk_rowit_next(&xi), lk_rowit_next(&oi)) {
        const char *xr = lk_at(x, xi.off); // [k_len]
        char *orow = lk_at(out, oi.off);   // [k_len]
        int64_t i = r % q_len, nv = i + k_len - q_len + 1;
        if (nv < 0) nv = 0;
        int any_nan;
        float m = nv > 0 ? max_pass(xr, x->dtype, nv, &any_nan) : 0.0f;
        if (nv > 0 && lk_softmax_row_nan(m, any_nan)) {
            fill(orow, out->dtype, nv, NAN);
        } else if (nv > 0) {
            float shift = lk_online_shift(m);
            float *e = out->dtype == LK_F32 ? (float *)orow : nv <= SOFTMAX_SCRATCH ? scratch : NULL;
            float inv = lk_softmax_inv(exp_pass(xr, x->dtype, nv, shift, e));
            if (e) scale_pass(orow, out->dtype, e, inv, nv);
            else recompute_pass(orow, out->dtype, xr, x->dtype, shift, inv, nv);
        }
        fill(orow + nv * oes, out->dtype, k_len - nv, 0.0f);
    }
}

lk_status lk_avx2_causal_softmax(const lk_softmax_args *a) {
    int nd = a->x.ndim;
    int64_t k_len = a->x.shape[nd - 1];
    if ((a->x.stride[nd - 1] != 1 || a->out.stride[nd - 1] != 1) && k_len > 1)
        return lk_ref_causal_softmax(a);
    int64_t bytes = k_len * (int64_t)(lk_dtype_size(a->x.dtype) + lk_dtype_size(a->out.dtype));
    lk_parallel_for(lk_rows(&a->x, 1), bytes, softmax_rows, (void *)a);
    return LK_OK;
}
