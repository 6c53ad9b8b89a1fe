/*
 * rms_norm and fused_add_rms_norm, AVX-512 (F/BW/DQ/VL).
 *
 * Same formula, shapes, rounding points and work split as avx2/rms_norm.c; 16 lanes,
 * masked loads/stores for the row tail. Fast path needs last-dim stride 1 on every
 * operand and w; other layouts go to the reference.
 */
#include <math.h>

#include "../kernels.h"
#include "simd.h"

static inline float sumsq(const char *x, lk_dtype dt, int64_t D, size_t es) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 64 <= D; i += 64) {
        __m512 a = lk16_load(x + i * es, dt, 16), b = lk16_load(x + (i + 16) * es, dt, 16);
        __m512 c = lk16_load(x + (i + 32) * es, dt, 16), d = lk16_load(x + (i + 48) * es, dt, 16);
        s0 = _mm512_fmadd_ps(a, a, s0);
        s1 = _mm512_fmadd_ps(b, b, s1);
        s2 = _mm512_fmadd_ps(c, c, s2);
        s3 = _mm512_fmadd_ps(d, d, s3);
    }
    for (; i < D; i += 16) {
        __m512 a = lk16_load(x + i * es, dt, D - i);
        s0 = _mm512_fmadd_ps(a, a, s0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

static inline void scale_row(char *o, lk_dtype ot, const char *x, lk_dtype xt, const char *w,
                             lk_dtype wt, int64_t D, float inv, int gemma) {
    size_t oes = lk_dtype_size(ot), xes = lk_dtype_size(xt), wes = lk_dtype_size(wt);
    __m512 vinv = _mm512_set1_ps(inv), one = _mm512_set1_ps(gemma ? 1.0f : 0.0f);
    for (int64_t i = 0; i < D; i += 16) {
        __m512 g = _mm512_add_ps(lk16_load(w + i * wes, wt, D - i), one);
        __m512 v = _mm512_mul_ps(_mm512_mul_ps(lk16_load(x + i * xes, xt, D - i), vinv), g);
        lk16_store(o + i * oes, ot, v, D - i);
    }
}

static void rms_rows(void *ctx, int64_t r0, int64_t r1) {
    const lk_rms_norm_args *a = ctx;
    const lk_tensor *x = &a->x, *out = &a->out;
    int64_t D = x->shape[x->ndim - 1];
    size_t xes = lk_dtype_size(x->dtype);
    lk_rowit xi, oi;
    lk_rowit_init(&xi, x, 1, r0);
    lk_rowit_init(&oi, out, 1, r0);
    for (int64_t r = r0; r < r1; r++, lk_rowit_next(&xi), lk_rowit_next(&oi)) {
        const char *xr = lk_at(x, xi.off); // [D]
        char *orow = lk_at(out, oi.off);   // [D]
        float inv = 1.0f / sqrtf(sumsq(xr, x->dtype, D, xes) / (float)D + a->eps);
        scale_row(orow, out->dtype, xr, x->dtype, a->w.data, a->w.dtype, D, inv, a->gemma);
    }
}

lk_status lk_avx512_rms_norm(const lk_rms_norm_args *a) {
    int nd = a->x.ndim;
    if (a->x.stride[nd - 1] != 1 || a->out.stride[nd - 1] != 1 || a->w.stride[0] != 1)
        return lk_ref_rms_norm(a);
    int64_t D = a->x.shape[nd - 1];
    int64_t bytes = D * (int64_t)(lk_dtype_size(a->x.dtype) + lk_dtype_size(a->out.dtype));
    lk_parallel_for(lk_rows(&a->x, 1), bytes, rms_rows, (void *)a);
    return LK_OK;
}

static inline float add_store(char *res, lk_dtype rt, const char *x, lk_dtype xt, int64_t D) {
    size_t res_es = lk_dtype_size(rt), xes = lk_dtype_size(xt);
    __m512 s0 = _mm512_setzero_ps();
    for (int64_t i = 0; i < D; i += 16) {
        __m512 v = _mm512_add_ps(lk16_load(x + i * xes, xt, D - i), lk16_load(res + i * res_es, rt, D - i));
        lk16_store(res + i * res_es, rt, v, D - i);
        v = lk16_load(res + i * res_es, rt, D - i); /* the rounded value */
        s0 = _mm512_fmadd_ps(v, v, s0);
    }
    return _mm512_reduce_add_ps(s0);
}

static void fused_rows(void *ctx, int64_t r0, int64_t r1) {
    const lk_fused_add_rms_norm_args *a = ctx;
    const lk_tensor *x = &a->x, *res = &a->residual;
    int64_t D = x->shape[x->ndim - 1];
    lk_rowit xi, ri;
    lk_rowit_init(&xi, x, 1, r0);
    lk_rowit_init(&ri, res, 1, r0);
    for (int64_t r = r0; r < r1; r++, lk_rowit_next(&xi), lk_rowit_next(&ri)) {
        char *xr = lk_at(x, xi.off);   // [D]
        char *rr = lk_at(res, ri.off); // [D]
        float inv = 1.0f / sqrtf(add_store(rr, res->dtype, xr, x->dtype, D) / (float)D + a->eps);
        scale_row(xr, x->dtype, rr, res->dtype, a->w.data, a->w.dtype, D, inv, a->gemma);
    }
}

lk_status lk_avx512_fused_add_rms_norm(const lk_fused_add_rms_norm_args *a) {
    int nd = a->x.ndim;
    if (a->x.stride[nd - 1] != 1 || a->residual.stride[nd - 1] != 1 || a->w.stride[0] != 1)
        return lk_ref_fused_add_rms_norm(a);
    int64_t D = a->x.shape[nd - 1];
    int64_t bytes = 2 * D * (int64_t)(lk_dtype_size(a->x.dtype) + lk_dtype_size(a->residual.dtype));
    lk_parallel_for(lk_rows(&a->x, 1), bytes, fused_rows, (void *)a);
    return LK_OK;
}
