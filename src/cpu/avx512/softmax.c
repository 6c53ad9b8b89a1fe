/*
 * causal_softmax, AVX-512 (F/BW/DQ/VL).
 *
 * Same formula, rules (src/common/attn_state.h), shapes, work split and passes as
 * avx2/softmax.c: per row max + NaN test (NaN rows filled with NaN), exp
 * (lk16_exp_nonpos) + f32 sum keeping the exps in f32 (out itself when f32, else a
 * stack buffer of SOFTMAX_SCRATCH floats, longer rows recompute), then scale and round
 * once; 16 lanes, masked loads/stores for the tail.
 * Fast path: last-dim stride 1 on x and out, else the reference. out may be x itself.
 */
#include <math.h>
#include <string.h>

#include "../../common/attn_state.h"
#include "../kernels.h"
#include "simd.h"

#define SOFTMAX_SCRATCH 8192
/* the pass bodies are inlined into per-dtype wrappers (switches on the dtype with
 * literal cases) so that their loops carry no dtype tests */
#define LK_ALWAYS_INLINE static inline __attribute__((always_inline))

/* element size of a validated float dtype; inline, so literal dtypes fold */
static inline size_t float_size(lk_dtype dt) { return dt == LK_F32 ? 4 : 2; }

/* max of x[0, nv) with NaNs skipped (VMAXPS keeps its second operand); *any_nan tells
 * whether one was seen */
LK_ALWAYS_INLINE float row_max(const char *x, lk_dtype dt, int64_t nv, int *any_nan) {
    size_t es = float_size(dt);
    __m512 ninf = _mm512_set1_ps(-INFINITY), m0 = ninf, m1 = ninf, m2 = ninf, m3 = ninf;
    __mmask16 nan = 0;
    int64_t j = 0;
    for (; j + 64 <= nv; j += 64) {
        __m512 a = lk16_load(x + j * es, dt, 16), b = lk16_load(x + (j + 16) * es, dt, 16);
        __m512 c = lk16_load(x + (j + 32) * es, dt, 16), d = lk16_load(x + (j + 48) * es, dt, 16);
        m0 = _mm512_max_ps(a, m0), m1 = _mm512_max_ps(b, m1);
        m2 = _mm512_max_ps(c, m2), m3 = _mm512_max_ps(d, m3);
        nan |= _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(c, d, _CMP_UNORD_Q);
    }
    for (; j < nv; j += 16) { /* lanes past the row: 0 from the load, skipped by the mask */
        __mmask16 k = lk16_mask(nv - j);
        __m512 a = lk16_load(x + j * es, dt, nv - j);
        m0 = _mm512_mask_max_ps(m0, k, a, m0);
        nan |= _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
    }
    *any_nan = nan != 0;
    return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3)));
}

/* sum of exp(x[j] - shift) over [0, nv) (arguments <= 0: the row is not NaN); the
 * terms are stored to e (f32) unless NULL */
LK_ALWAYS_INLINE float exp_sum(const char *x, lk_dtype dt, int64_t nv, float shift, float *e) {
    size_t es = float_size(dt);
    __m512 sh = _mm512_set1_ps(shift), s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t j = 0;
    for (; j + 64 <= nv; j += 64) {
        __m512 p0 = lk16_exp_nonpos(_mm512_sub_ps(lk16_load(x + j * es, dt, 16), sh));
        __m512 p1 = lk16_exp_nonpos(_mm512_sub_ps(lk16_load(x + (j + 16) * es, dt, 16), sh));
        __m512 p2 = lk16_exp_nonpos(_mm512_sub_ps(lk16_load(x + (j + 32) * es, dt, 16), sh));
        __m512 p3 = lk16_exp_nonpos(_mm512_sub_ps(lk16_load(x + (j + 48) * es, dt, 16), sh));
        if (e) {
            _mm512_storeu_ps(e + j, p0), _mm512_storeu_ps(e + j + 16, p1);
            _mm512_storeu_ps(e + j + 32, p2), _mm512_storeu_ps(e + j + 48, p3);
        }
        s0 = _mm512_add_ps(s0, p0), s1 = _mm512_add_ps(s1, p1);
        s2 = _mm512_add_ps(s2, p2), s3 = _mm512_add_ps(s3, p3);
    }
    for (; j < nv; j += 16) {
        __mmask16 k = lk16_mask(nv - j);
        __m512 p = _mm512_maskz_mov_ps(k, lk16_exp_nonpos(_mm512_sub_ps(lk16_load(x + j * es, dt, nv - j), sh)));
        if (e) lk16_store(e + j, LK_F32, p, nv - j);
        s0 = _mm512_add_ps(s0, p);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

/* out[j] = p_j * inv over [0, nv): p_j = src[j] (f32 exps, recompute = 0) or
 * exp(src[j] - shift) (src = x of dtype st, recompute = 1) */
LK_ALWAYS_INLINE void write_probs(char *orow, lk_dtype ot, const char *src, lk_dtype st,
                                  int recompute, float shift, float inv, int64_t nv) {
    size_t oes = float_size(ot), ses = float_size(st);
    __m512 sh = _mm512_set1_ps(shift), vinv = _mm512_set1_ps(inv);
    for (int64_t j = 0; j < nv; j += 16) {
        __m512 p = lk16_load(src + j * ses, st, nv - j);
        if (recompute) p = lk16_exp_nonpos(_mm512_sub_ps(p, sh));
        lk16_store(orow + j * oes, ot, _mm512_mul_ps(p, vinv), nv - j);
    }
}

/* out[0, n) = value; +0 (the masked part of every row) is all-zero bits in each dtype */
static void fill(char *orow, lk_dtype ot, int64_t n, float value) {
    size_t oes = float_size(ot);
    if (value == 0.0f && !signbit(value)) {
        memset(orow, 0, (size_t)n * oes);
        return;
    }
    __m512 v = _mm512_set1_ps(value);
    for (int64_t j = 0; j < n; j += 16) lk16_store(orow + j * oes, ot, v, n - j);
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

lk_status lk_avx512_causal_softmax(const lk_softmax_args *a) {
    int nd = a->x.ndim;
    int64_t k_len = a->x.shape[nd - 1];
    if ((a->x.stride[nd - 1] != 1 || a->out.stride[nd - 1] != 1) && k_len > 1)
        return lk_ref_causal_softmax(a);
    int64_t bytes = k_len * (int64_t)(lk_dtype_size(a->x.dtype) + lk_dtype_size(a->out.dtype));
    lk_parallel_for(lk_rows(&a->x, 1), bytes, softmax_rows, (void *)a);
    return LK_OK;
}
