/*
 * rms_norm and fused_add_rms_norm, AVX2 + FMA + F16C.
 *
 *   out = x * rsqrt(mean(x^2) + eps) * g,  g = w or 1 + w (gemma)
 *   fused: residual = round(x + residual); x = rms_norm(residual)
 *
 * Shapes: x, out, residual [..., D]; w [D]. Fast path needs last-dim stride 1 on every
 * operand and w; other layouts go to the reference. g is converted to f32 once per call
 * when there are 16 rows or more (unless w is f32 and not gemma with f32 / f16 rows, or
 * bf16 with bf16 rows). Work split: rows, contiguous chunks per thread (lk_parallel_for).
 * Per row, pass 1 accumulates squares in 4 x 8 f32 lanes, pass 2 re-reads the row (from
 * L1/L2) and writes it; one rounding per output element.
 * Outputs beyond LK_STREAM_MIN_BYTES whose rows are aligned use non-temporal stores.
 * For inputs that size, pass 2 also prefetches the next row (prefetch_next), so its DRAM
 * read overlaps this row's arithmetic instead of following it. bf16 rows take 16 values
 * per 32-byte load in even / odd order (shifts and masks, no shuffles) in pass 1 and in
 * pass 2 (scale_row_bf16) with bf16 weights (split the same way, any row count) or
 * finite f16 / f32 weights (copied once in that order).
 */
#include <math.h>
#include <stdlib.h>

#include "../kernels.h"
#include "simd.h"

typedef struct {
    const lk_tensor *x, *out; /* [..., D]; fused: x = residual (input), out = x (output) */
    const char *w;            /* [D] weights, dtype wt: w itself or its f32 copy */
    lk_dtype wt;
    float one;                /* 1 for gemma unless folded into the f32 copy */
    float eps;
    int stream;
    int prefetch;             /* prefetch the next row during pass 2 (big inputs only) */
    const float *g_eo;        /* bf16 rows: the f32 copy in even / odd order per 16 when it
                                 holds no inf or NaN, else NULL */
} rows_ctx;

static inline float sumsq(const char *x, lk_dtype dt, int64_t D) {
    size_t es = lk_dtype_size(dt);
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    if (dt == LK_BF16) { /* 16 per load: even elements shifted up, odd ones masked */
        for (; i + 32 <= D; i += 32) {
            __m256 a, b, c, d;
            lk16_bf16_split(_mm256_loadu_si256((const __m256i *)(x + i * 2)), &a, &b);
            lk16_bf16_split(_mm256_loadu_si256((const __m256i *)(x + i * 2 + 32)), &c, &d);
            s0 = _mm256_fmadd_ps(a, a, s0);
            s1 = _mm256_fmadd_ps(b, b, s1);
            s2 = _mm256_fmadd_ps(c, c, s2);
            s3 = _mm256_fmadd_ps(d, d, s3);
        }
    }
    for (; i + 32 <= D; i += 32) {
        __m256 a = lk8_load(x + i * es, dt), b = lk8_load(x + (i + 8) * es, dt);
        __m256 c = lk8_load(x + (i + 16) * es, dt), d = lk8_load(x + (i + 24) * es, dt);
        s0 = _mm256_fmadd_ps(a, a, s0);
        s1 = _mm256_fmadd_ps(b, b, s1);
        s2 = _mm256_fmadd_ps(c, c, s2);
        s3 = _mm256_fmadd_ps(d, d, s3);
    }
    for (; i + 8 <= D; i += 8) {
        __m256 a = lk8_load(x + i * es, dt);
        s0 = _mm256_fmadd_ps(a, a, s0);
    }
    if (i < D) {
        __m256 a = lk8_load_part(x + i * es, dt, (int)(D - i));
        s1 = _mm256_fmadd_ps(a, a, s1);
    }
    return lk8_hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
}

/* Row prefetch: pass 2 works on a row already in L1/L2, so without help no DRAM read is
 * in flight while it runs. pf[0..npf) are the next row's inputs (dtype xt, same length):
 * one line of each is prefetched per 64 bytes of x processed, so the next row streams in
 * while this one is scaled and stored. */
static inline __attribute__((always_inline)) void prefetch_next(const char *const *pf, int npf,
                                                                int64_t byte) {
    if ((byte & 63) == 0)
        for (int k = 0; k < npf; k++) _mm_prefetch(pf[k] + byte, _MM_HINT_T0);
}

/* o[i] = x[i] * inv * (w[i] + one); w is the f32 copy g when one was made */
static inline __attribute__((always_inline)) void scale_row_any(char *o, lk_dtype ot, const char *x, lk_dtype xt, const char *w,
                             lk_dtype wt, float one, int64_t D, float inv, int stream,
                             const char *const *pf, int npf) {
    size_t oes = lk_dtype_size(ot), xes = lk_dtype_size(xt), wes = lk_dtype_size(wt);
    __m256 vinv = _mm256_set1_ps(inv), vone = _mm256_set1_ps(one);
    int64_t i = 0;
    /* three copies of one loop, unswitched by hand on npf and stream: one loop with the
     * two tests inside measured ~5-15% slower (GCC does not unswitch it) */
    if (npf) /* prefetch_next's byte offset must meet every multiple of 64 */
        for (; i + 8 <= D; i += 8) {
            prefetch_next(pf, npf, i * (int64_t)xes);
            __m256 g = _mm256_add_ps(lk8_load(w + i * wes, wt), vone);
            __m256 v = _mm256_mul_ps(_mm256_mul_ps(lk8_load(x + i * xes, xt), vinv), g);
            if (stream) lk8_stream(o + i * oes, ot, v);
            else lk8_store(o + i * oes, ot, v);
        }
    if (stream)
        for (; i + 8 <= D; i += 8) {
            __m256 g = _mm256_add_ps(lk8_load(w + i * wes, wt), vone);
            lk8_stream(o + i * oes, ot, _mm256_mul_ps(_mm256_mul_ps(lk8_load(x + i * xes, xt), vinv), g));
        }
    for (; i + 8 <= D; i += 8) {
        __m256 g = _mm256_add_ps(lk8_load(w + i * wes, wt), vone);
        lk8_store(o + i * oes, ot, _mm256_mul_ps(_mm256_mul_ps(lk8_load(x + i * xes, xt), vinv), g));
    }
    if (i < D) {
        int n = (int)(D - i);
        __m256 g = _mm256_add_ps(lk8_load_part(w + i * wes, wt, n), vone);
        __m256 v = _mm256_mul_ps(_mm256_mul_ps(lk8_load_part(x + i * xes, xt, n), vinv), g);
        lk8_store_part(o + i * oes, ot, v, n);
    }
}

/* bf16 in and out: 16 values per 32-byte load, the even elements shifted up and the
 * odd ones masked (they are then f32 values); the weights either bf16 (wbf16: split
 * the same way, plus one) or the f32 copy in the same even / odd order per 16 (g_eo);
 * the rounded results go back the same way (even ones shifted down, blended with the
 * odd ones' high halves): no shuffles. Rounding without the NaN branch
 * (lk8_bf16_bits_nonan's), which needs every NaN to have its low 16 bits clear: with
 * bf16 x and weights every NaN carries a bf16 payload or is the default NaN; the f32
 * copy (from f32 or f16 weights, any payload) is only used when it holds no NaN or
 * inf and inv is finite and > 0. Returns the number of values done (a multiple of 16). */
static inline __attribute__((always_inline)) int64_t
scale_row_bf16(char *o, const char *x, const char *w, int wbf16, float one, int64_t D, float inv,
               int stream, const char *const *pf, int npf) {
    __m256 vinv = _mm256_set1_ps(inv), vone = _mm256_set1_ps(one);
    int64_t i = 0;
    for (; i + 16 <= D; i += 16) {
        if (npf) prefetch_next(pf, npf, i * 2);
        __m256 a, b, ga, gb;
        lk16_bf16_split(_mm256_loadu_si256((const __m256i *)(x + i * 2)), &a, &b);
        if (wbf16) {
            lk16_bf16_split(_mm256_loadu_si256((const __m256i *)(w + i * 2)), &ga, &gb);
            ga = _mm256_add_ps(ga, vone);
            gb = _mm256_add_ps(gb, vone);
        } else {
            ga = _mm256_loadu_ps((const float *)w + i);
            gb = _mm256_loadu_ps((const float *)w + i + 8);
        }
        __m256i r = lk16_bf16_join_nonan(_mm256_mul_ps(_mm256_mul_ps(a, vinv), ga),
                                         _mm256_mul_ps(_mm256_mul_ps(b, vinv), gb));
        if (stream) _mm256_stream_si256((__m256i *)(o + i * 2), r);
        else _mm256_storeu_si256((__m256i *)(o + i * 2), r);
    }
    return i;
}

/* the loop specialised for the common all-same-dtype cases (constant dtypes let the
 * compiler drop the per-vector dtype branches), generic otherwise */
static void scale_row(char *o, lk_dtype ot, const char *x, lk_dtype xt, const char *w,
                      lk_dtype wt, float one, const float *g_eo, int64_t D, float inv, int stream,
                      const char *const *pf, int npf) {
    int64_t done = 0;
    if (xt == LK_BF16 && ot == LK_BF16 && wt == LK_BF16)
        done = scale_row_bf16(o, x, w, 1, one, D, inv, stream, pf, npf);
    else if (xt == LK_BF16 && ot == LK_BF16 && g_eo && isfinite(inv) && inv > 0.0f)
        done = scale_row_bf16(o, x, (const char *)g_eo, 0, 0.0f, D, inv, stream, pf, npf);
    if (done) {
        o += done * 2;
        x += done * 2;
        w += done * (int64_t)lk_dtype_size(wt);
        D -= done;
        if (D == 0) return;
        stream = 0; /* the tail is less than 16 values: plain stores */
    }
    if (ot == xt && wt == xt) {
        if (xt == LK_BF16) scale_row_any(o, LK_BF16, x, LK_BF16, w, LK_BF16, one, D, inv, stream, pf, npf);
        else if (xt == LK_F16) scale_row_any(o, LK_F16, x, LK_F16, w, LK_F16, one, D, inv, stream, pf, npf);
        else scale_row_any(o, LK_F32, x, LK_F32, w, LK_F32, one, D, inv, stream, pf, npf);
    } else if (ot == xt && wt == LK_F32) {
        if (xt == LK_BF16) scale_row_any(o, LK_BF16, x, LK_BF16, w, LK_F32, one, D, inv, stream, pf, npf);
        else if (xt == LK_F16) scale_row_any(o, LK_F16, x, LK_F16, w, LK_F32, one, D, inv, stream, pf, npf);
        else scale_row_any(o, LK_F32, x, LK_F32, w, LK_F32, one, D, inv, stream, pf, npf);
    } else {
        scale_row_any(o, ot, x, xt, w, wt, one, D, inv, stream, pf, npf);
    }
}

static void rms_rows(void *ctx, int64_t r0, int64_t r1) {
    const rows_ctx *c = ctx;
    const lk_tensor *x = c->x, *out = c->out;
    int64_t D = x->shape[x->ndim - 1];
    lk_rowit xi, oi, ni; /* ni: one row ahead of xi, for the prefetch */
    lk_rowit_init(&xi, x, 1, r0);
    lk_rowit_init(&oi, out, 1, r0);
    ni = xi;
    for (int64_t r = r0; r < r1; r++, lk_rowit_next(&xi), lk_rowit_next(&oi)) {
        const char *xr = lk_at(x, xi.off); // [D]
        char *orow = lk_at(out, oi.off);   // [D]
        lk_rowit_next(&ni);
        const char *pf[1] = {lk_at(x, ni.off)}; // [D], the next row (unused after the last)
        float inv = 1.0f / sqrtf(sumsq(xr, x->dtype, D) / (float)D + c->eps);
        int st = c->stream && ((uintptr_t)orow & 31) == 0;
        scale_row(orow, out->dtype, xr, x->dtype, c->w, c->wt, c->one, c->g_eo, D, inv, st, pf,
                  c->prefetch && r + 1 < r1);
    }
    if (c->stream) _mm_sfence();
}

/* Weights as used by scale_row: for many rows, converted once to f32 with the gemma 1
 * folded in (owned[0] is that copy, to free); for a few rows, and bf16 weights of bf16
 * rows, w as it is. For bf16 rows and finite f16 / f32 weights also the copy in
 * scale_row_bf16's even / odd order (owned[1]):
 * per block of 16, the 8 even elements, then the 8 odd ones; the last D % 16 as they are. */
static lk_status set_weights(rows_ctx *c, const lk_tensor *w, int gemma, int64_t rows, int bf16,
                             float **owned) {
    owned[0] = owned[1] = NULL;
    c->w = w->data;
    c->wt = w->dtype;
    c->one = gemma ? 1.0f : 0.0f;
    c->g_eo = NULL;
    if (rows < 16 || (w->dtype == LK_F32 && !gemma && !bf16) || (bf16 && w->dtype == LK_BF16)) return LK_OK;
    if (!(owned[0] = lk_weights_f32(w, gemma))) return LK_ERR_NOMEM;
    const float *g = owned[0];
    c->w = (const char *)g;
    c->wt = LK_F32;
    c->one = 0.0f;
    int64_t D = w->shape[0];
    int finite = 1;
    for (int64_t i = 0; i < D; i++) finite &= isfinite(g[i]) != 0;
    if (!bf16 || !finite) return LK_OK;
    if (!(owned[1] = malloc(sizeof(float) * (size_t)(D > 0 ? D : 1)))) {
        free(owned[0]);
        owned[0] = NULL;
        return LK_ERR_NOMEM;
    }
    float *eo = owned[1];
    int64_t i = 0;
    for (; i + 16 <= D; i += 16)
        for (int k = 0; k < 8; k++) eo[i + k] = g[i + 2 * k], eo[i + 8 + k] = g[i + 2 * k + 1];
    for (; i < D; i++) eo[i] = g[i];
    c->g_eo = eo;
    return LK_OK;
}

lk_status lk_avx2_rms_norm(const lk_rms_norm_args *a) {
    int nd = a->x.ndim;
    if (a->x.stride[nd - 1] != 1 || a->out.stride[nd - 1] != 1 || a->w.stride[0] != 1)
        return lk_ref_rms_norm(a);
    int64_t D = a->x.shape[nd - 1], rows = lk_rows(&a->x, 1);
    size_t oes = lk_dtype_size(a->out.dtype);
    float *owned[2];
    rows_ctx c = {&a->x, &a->out, NULL, LK_F32, 0.0f, a->eps, 0, 0, NULL};
    int bf16 = a->x.dtype == LK_BF16 && a->out.dtype == LK_BF16;
    if (set_weights(&c, &a->w, a->gemma, rows, bf16, owned)) return LK_ERR_NOMEM;
    /* stream only when whole rows are multiples of 32 bytes and the output is big and
     * does not alias the input (in place keeps the lines in cache anyway) */
    c.stream = rows * D * (int64_t)oes >= LK_STREAM_MIN_BYTES && (D * (int64_t)oes) % 32 == 0 &&
               a->out.data != a->x.data;
    int64_t bytes = D * (int64_t)(lk_dtype_size(a->x.dtype) + oes);
    c.prefetch = rows * bytes >= LK_STREAM_MIN_BYTES;
    lk_parallel_for(rows, bytes, rms_rows, &c);
    free(owned[0]);
    free(owned[1]);
    return LK_OK;
}

/* residual = round(x + residual) stored; returns sum of squares of the rounded values */
static inline float add_store(char *res, lk_dtype rt, const char *x, lk_dtype xt, int64_t D) {
    size_t res_es = lk_dtype_size(rt), xes = lk_dtype_size(xt);
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    int64_t i = 0;
    if (rt == LK_BF16 && xt == LK_BF16)
        /* 16 per step in the in-lane order; the sum of two bf16 values is NaN only with a
         * bf16 input's payload or the default NaN (inf - inf), whose low 16 bits are 0, so
         * the rounding needs no NaN branch; the rounded values are squared from registers */
        for (; i + 16 <= D; i += 16) {
            __m256 xa, xb, ra, rb;
            lk8x2_load_bf16(x + i * 2, &xa, &xb);
            lk8x2_load_bf16(res + i * 2, &ra, &rb);
            __m256i ha = lk8_bf16_bits_nonan(_mm256_add_ps(xa, ra)), hb = lk8_bf16_bits_nonan(_mm256_add_ps(xb, rb));
            _mm256_storeu_si256((__m256i *)(res + i * 2), _mm256_packus_epi32(ha, hb));
            __m256 a = _mm256_castsi256_ps(_mm256_slli_epi32(ha, 16)), b = _mm256_castsi256_ps(_mm256_slli_epi32(hb, 16));
            s0 = _mm256_fmadd_ps(a, a, s0);
            s1 = _mm256_fmadd_ps(b, b, s1);
        }
    for (; i + 16 <= D; i += 16) {
        __m256 a = _mm256_add_ps(lk8_load(x + i * xes, xt), lk8_load(res + i * res_es, rt));
        __m256 b = _mm256_add_ps(lk8_load(x + (i + 8) * xes, xt), lk8_load(res + (i + 8) * res_es, rt));
        lk8_store(res + i * res_es, rt, a);
        lk8_store(res + (i + 8) * res_es, rt, b);
        a = lk8_load(res + i * res_es, rt); /* the rounded value */
        b = lk8_load(res + (i + 8) * res_es, rt);
        s0 = _mm256_fmadd_ps(a, a, s0);
        s1 = _mm256_fmadd_ps(b, b, s1);
    }
    for (; i < D; i += 8) {
        int n = D - i < 8 ? (int)(D - i) : 8;
        __m256 a = _mm256_add_ps(lk8_load_part(x + i * xes, xt, n), lk8_load_part(res + i * res_es, rt, n));
        lk8_store_part(res + i * res_es, rt, a, n);
        a = lk8_load_part(res + i * res_es, rt, n);
        s0 = _mm256_fmadd_ps(a, a, s0);
    }
    return lk8_hsum(_mm256_add_ps(s0, s1));
}

static void fused_rows(void *ctx, int64_t r0, int64_t r1) {
    const rows_ctx *c = ctx;
    const lk_tensor *res = c->x, *x = c->out;
    int64_t D = x->shape[x->ndim - 1];
    lk_rowit xi, ri, nx, nr; /* nx, nr: one row ahead, for the prefetch */
    lk_rowit_init(&xi, x, 1, r0);
    lk_rowit_init(&ri, res, 1, r0);
    nx = xi;
    nr = ri;
    for (int64_t r = r0; r < r1; r++, lk_rowit_next(&xi), lk_rowit_next(&ri)) {
        char *xr = lk_at(x, xi.off);   // [D]
        char *rr = lk_at(res, ri.off); // [D]
        lk_rowit_next(&nx);
        lk_rowit_next(&nr);
        const char *pf[2] = {lk_at(res, nr.off), lk_at(x, nx.off)}; // [D] each, next row
        float inv = 1.0f / sqrtf(add_store(rr, res->dtype, xr, x->dtype, D) / (float)D + c->eps);
        /* prefetch_next steps by the residual's element size: both rows are covered
         * when x's elements are not larger */
        int npf = c->prefetch && r + 1 < r1 && lk_dtype_size(x->dtype) <= lk_dtype_size(res->dtype) ? 2 : 0;
        scale_row(xr, x->dtype, rr, res->dtype, c->w, c->wt, c->one, c->g_eo, D, inv, 0, pf, npf);
    }
}

lk_status lk_avx2_fused_add_rms_norm(const lk_fused_add_rms_norm_args *a) {
    int nd = a->x.ndim;
    if (a->x.stride[nd - 1] != 1 || a->residual.stride[nd - 1] != 1 || a->w.stride[0] != 1)
        return lk_ref_fused_add_rms_norm(a);
    int64_t D = a->x.shape[nd - 1], rows = lk_rows(&a->x, 1);
    float *owned[2];
    rows_ctx c = {&a->residual, &a->x, NULL, LK_F32, 0.0f, a->eps, 0, 0, NULL};
    int bf16 = a->x.dtype == LK_BF16 && a->residual.dtype == LK_BF16;
    if (set_weights(&c, &a->w, a->gemma, rows, bf16, owned)) return LK_ERR_NOMEM;
    int64_t bytes = 2 * D * (int64_t)(lk_dtype_size(a->x.dtype) + lk_dtype_size(a->residual.dtype));
    c.prefetch = rows * bytes >= LK_STREAM_MIN_BYTES;
    lk_parallel_for(rows, bytes, fused_rows, &c);
    free(owned[0]);
    free(owned[1]);
    return LK_OK;
}
