/*
 * rms_norm and fused_add_rms_norm, every vector ISA (src/cpu/vec/lkv.h, W lanes).
 *
 *   out = x * rsqrt(mean(x^2) + eps) * g,  g = w or 1 + w (gemma)
 *   fused: residual = round(x + residual); x = rms_norm(residual)
 *
 * Shapes: x, out, residual [..., D]; w [D]. Fast path needs last-dim stride 1 on every
 * operand and w (or w's stride 0: a broadcast weight, copied once, which is how the
 * weightless form arrives); other layouts go to the reference. g is converted to f32 once per call
 * when there are 16 rows or more (unless w is f32 and not gemma with f32 / f16 rows, or
 * bf16 with bf16 rows). Work split: rows, contiguous chunks per thread (lk_parallel_for).
 * Per row, pass 1 accumulates squares in 4 x W f32 lanes, pass 2 re-reads the row (from
 * L1/L2) and writes it; one rounding per output element.
 * Outputs beyond LK_STREAM_MIN_BYTES whose rows are aligned use non-temporal stores.
 * For inputs that size, pass 2 also prefetches the next row (prefetch_next), so its DRAM
 * read overlaps this row's arithmetic instead of following it. bf16 rows take 2W values
 * per load in even / odd order (shifts and masks, no shuffles) in pass 1 and in pass 2
 * (scale_row_bf16) with bf16 weights (split the same way, any row count) or finite
 * f16 / f32 weights (copied once in that order).
 */
#include <math.h>
#include <stdlib.h>

#include "../../core/half.h"
#include "../kernels.h"
#include "../vec/lkv.h"
#include "fp8_store.h"

typedef struct {
    const lk_tensor *x, *out; /* [..., D]; fused: x = residual (input), out = x (output) */
    const char *w;            /* [D] weights, dtype wt: w itself or its f32 copy */
    lk_dtype wt;
    float one;                /* 1 for gemma unless folded into the f32 copy */
    float eps;
    int stream;
    int prefetch;             /* prefetch the next row during pass 2 (big inputs only) */
    const float *g_eo;        /* bf16 rows: the f32 copy in even / odd order per 2W when it
                                 holds no inf or NaN, else NULL */
} rows_ctx;

static inline float sumsq(const char *x, lk_dtype dt, int64_t D) {
    int64_t es = lk_esize(dt), i = 0;
    lkv_f32 s0 = lkv_zero(), s1 = s0, s2 = s0, s3 = s0;
    if (dt == LK_BF16) /* 2W per load: even elements shifted up, odd ones masked */
        for (; i + 4 * LKV_W <= D; i += 4 * LKV_W) {
            lkv_f32 a, b, c, d;
            lkv_bf16_load_eo(x + i * 2, &a, &b);
            lkv_bf16_load_eo(x + (i + 2 * LKV_W) * 2, &c, &d);
            s0 = lkv_fma(a, a, s0), s1 = lkv_fma(b, b, s1);
            s2 = lkv_fma(c, c, s2), s3 = lkv_fma(d, d, s3);
        }
    for (; i + 4 * LKV_W <= D; i += 4 * LKV_W) {
        lkv_f32 a = lkv_load(x + i * es, dt), b = lkv_load(x + (i + LKV_W) * es, dt);
        lkv_f32 c = lkv_load(x + (i + 2 * LKV_W) * es, dt), d = lkv_load(x + (i + 3 * LKV_W) * es, dt);
        s0 = lkv_fma(a, a, s0), s1 = lkv_fma(b, b, s1);
        s2 = lkv_fma(c, c, s2), s3 = lkv_fma(d, d, s3);
    }
    for (; i + LKV_W <= D; i += LKV_W) {
        lkv_f32 a = lkv_load(x + i * es, dt);
        s0 = lkv_fma(a, a, s0);
    }
    if (i < D) {
        lkv_f32 a = lkv_load_part(x + i * es, dt, D - i);
        s1 = lkv_fma(a, a, s1);
    }
    return lkv_hsum(lkv_add(lkv_add(s0, s1), lkv_add(s2, s3)));
}

/* Row prefetch: pass 2 works on a row already in L1/L2, so without help no DRAM read is
 * in flight while it runs. pf[0..npf) are the next row's inputs (dtype xt, same length):
 * one line of each is prefetched per 64 bytes of x processed, so the next row streams in
 * while this one is scaled and stored. */
LK_ALWAYS_INLINE void prefetch_next(const char *const *pf, int npf, int64_t byte) {
    if ((byte & 63) == 0)
        for (int k = 0; k < npf; k++) lkv_prefetch(pf[k] + byte);
}

/* o[i] = x[i] * inv * (w[i] + one) for the whole vectors of the row; returns the count
 * done. Software-pipelined: the next vector's loads are issued before this one's store,
 * so a load never waits on the store just before it to an address equal modulo 4 KiB
 * (out and x or w that far apart make every W-th load alias the previous store: ~1.3x
 * on 16 x 4096 f32 with W = 16). */
LK_ALWAYS_INLINE int64_t scale_vecs(char *o, lk_dtype ot, const char *x, lk_dtype xt, const char *w, lk_dtype wt,
                                    lkv_f32 vone, lkv_f32 vinv, int64_t D, int stream, const char *const *pf,
                                    int npf) {
    int64_t oes = lk_esize(ot), xes = lk_esize(xt), wes = lk_esize(wt), i = 0;
    if (D < LKV_W) return 0;
    lkv_f32 xv = lkv_load(x, xt), wv = lkv_load(w, wt);
    for (;; i += LKV_W) {
        if (npf) prefetch_next(pf, npf, i * xes); /* the byte offset meets every multiple of 64 */
        lkv_f32 v = lkv_mul(lkv_mul(xv, vinv), lkv_add(wv, vone));
        int more = i + 2 * LKV_W <= D;
        if (more) xv = lkv_load(x + (i + LKV_W) * xes, xt), wv = lkv_load(w + (i + LKV_W) * wes, wt);
        if (stream) lkv_stream(o + i * oes, ot, v);
        else lkv_store(o + i * oes, ot, v);
        if (!more) return i + LKV_W;
    }
}

/* o[i] = x[i] * inv * (w[i] + one); w is the f32 copy g when one was made */
LK_ALWAYS_INLINE void scale_row_any(char *o, lk_dtype ot, const char *x, lk_dtype xt, const char *w, lk_dtype wt,
                                    float one, int64_t D, float inv, int stream, const char *const *pf, int npf) {
    int64_t oes = lk_esize(ot), xes = lk_esize(xt), wes = lk_esize(wt), i;
    lkv_f32 vinv = lkv_set1(inv), vone = lkv_set1(one);
    /* three copies of one loop, unswitched by hand on npf and stream: one loop with the
     * two tests inside measured ~5-15% slower (GCC does not unswitch it) */
    if (npf) i = scale_vecs(o, ot, x, xt, w, wt, vone, vinv, D, stream, pf, npf);
    else if (stream) i = scale_vecs(o, ot, x, xt, w, wt, vone, vinv, D, 1, pf, 0);
    else i = scale_vecs(o, ot, x, xt, w, wt, vone, vinv, D, 0, pf, 0);
    if (i < D) {
        lkv_f32 g = lkv_add(lkv_load_part(w + i * wes, wt, D - i), vone);
        lkv_f32 v = lkv_mul(lkv_mul(lkv_load_part(x + i * xes, xt, D - i), vinv), g);
        lkv_store_part(o + i * oes, ot, v, D - i);
    }
}

/* bf16 in and out: 2W values per load in even / odd order, the weights either bf16
 * (wbf16: split the same way, plus one) or the f32 copy in the same order per 2W
 * (g_eo); results joined back the same way: no shuffles. Rounding without the NaN branch
 * (lkv_bf16_join_nonan), which needs every NaN to have its low 16 bits clear: with bf16
 * x and weights every NaN carries a bf16 payload or is the default NaN; the f32 copy
 * (from f32 or f16 weights, any payload) is only used when it holds no NaN or inf and
 * inv is finite and > 0. Returns the number of values done (a multiple of 2W). */
/* one step of scale_row_bf16: the 2W results of x's values a, b (even / odd) at i */
LK_ALWAYS_INLINE void scale_step_bf16(lkv_f32 *ra, lkv_f32 *rb, lkv_f32 a, lkv_f32 b, const char *w, int wbf16,
                                      lkv_f32 vone, lkv_f32 vinv, int64_t i) {
    lkv_f32 ga, gb;
    if (wbf16) {
        lkv_bf16_load_eo(w + i * 2, &ga, &gb);
        ga = lkv_add(ga, vone), gb = lkv_add(gb, vone);
    } else {
        ga = lkv_loadu((const float *)w + i);
        gb = lkv_loadu((const float *)w + i + LKV_W);
    }
    *ra = lkv_mul(lkv_mul(a, vinv), ga);
    *rb = lkv_mul(lkv_mul(b, vinv), gb);
}

LK_ALWAYS_INLINE int64_t scale_row_bf16(char *o, const char *x, const char *w, int wbf16, float one, int64_t D,
                                        float inv, int stream, const char *const *pf, int npf) {
    const int64_t V = 2 * LKV_W; /* values per step */
    lkv_f32 vinv = lkv_set1(inv), vone = lkv_set1(one), a, b, ra, rb;
    if (D < V) return 0;
    /* software-pipelined as scale_vecs: the next step's loads before this step's store */
    lkv_bf16_load_eo(x, &a, &b);
    int64_t i = 0;
    for (; i + 2 * V <= D; i += V) {
        if (npf) prefetch_next(pf, npf, i * 2);
        scale_step_bf16(&ra, &rb, a, b, w, wbf16, vone, vinv, i);
        lkv_bf16_load_eo(x + (i + V) * 2, &a, &b);
        lkv_bf16_store_eo_nonan(o + i * 2, ra, rb, stream);
    }
    if (npf) prefetch_next(pf, npf, i * 2);
    scale_step_bf16(&ra, &rb, a, b, w, wbf16, vone, vinv, i);
    lkv_bf16_store_eo_nonan(o + i * 2, ra, rb, stream);
    return i + V;
}

/* the loop specialised for the common all-same-dtype cases (constant dtypes let the
 * compiler drop the per-vector dtype branches), generic otherwise */
static void scale_row(char *o, lk_dtype ot, const char *x, lk_dtype xt, const char *w, lk_dtype wt, float one,
                      const float *g_eo, int64_t D, float inv, int stream, const char *const *pf, int npf) {
    int64_t done = 0;
    if (xt == LK_BF16 && ot == LK_BF16 && wt == LK_BF16)
        done = scale_row_bf16(o, x, w, 1, one, D, inv, stream, pf, npf);
    else if (xt == LK_BF16 && ot == LK_BF16 && g_eo && isfinite(inv) && inv > 0.0f)
        done = scale_row_bf16(o, x, (const char *)g_eo, 0, 0.0f, D, inv, stream, pf, npf);
    if (done) {
        o += done * 2;
        x += done * 2;
        w += done * lk_esize(wt);
        D -= done;
        if (D == 0) return;
        stream = 0; /* the tail is less than 2W values: plain stores */
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
        int st = c->stream && ((uintptr_t)orow & (LKV_BYTES - 1)) == 0;
        scale_row(orow, out->dtype, xr, x->dtype, c->w, c->wt, c->one, c->g_eo, D, inv, st, pf,
                  c->prefetch && r + 1 < r1);
    }
    if (c->stream) lkv_sfence();
}

/* Weights as used by scale_row: for many rows, converted once to f32 with the gemma 1
 * folded in (owned[0] is that copy, to free); for a few rows, and bf16 weights of bf16
 * rows, w as it is. For bf16 rows and finite f16 / f32 weights also the copy in
 * scale_row_bf16's even / odd order (owned[1]): per block of 2W, the W even elements,
 * then the W odd ones; the last D % 2W as they are. */
static lk_status set_weights(rows_ctx *c, const lk_tensor *w, int gemma, int64_t rows, int bf16, float **owned) {
    owned[0] = owned[1] = NULL;
    c->w = w->data;
    c->wt = w->dtype;
    c->one = gemma ? 1.0f : 0.0f;
    c->g_eo = NULL;
    /* a broadcast weight (stride 0: the weightless form) is always copied */
    if (w->stride[0] == 1 &&
        (rows < 16 || (w->dtype == LK_F32 && !gemma && !bf16) || (bf16 && w->dtype == LK_BF16)))
        return LK_OK;
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
    for (; i + 2 * LKV_W <= D; i += 2 * LKV_W)
        for (int k = 0; k < LKV_W; k++) eo[i + k] = g[i + 2 * k], eo[i + LKV_W + k] = g[i + 2 * k + 1];
    for (; i < D; i++) eo[i] = g[i];
    c->g_eo = eo;
    return LK_OK;
}

static lk_status rms_norm(const lk_rms_norm_args *a) {
    int nd = a->x.ndim;
    if (a->x.stride[nd - 1] != 1 || a->out.stride[nd - 1] != 1 || (a->w.stride[0] != 1 && a->w.stride[0] != 0))
        return lk_ref_rms_norm(a);
    int64_t D = a->x.shape[nd - 1], rows = lk_rows(&a->x, 1), oes = lk_esize(a->out.dtype);
    float *owned[2];
    rows_ctx c = {&a->x, &a->out, NULL, LK_F32, 0.0f, a->eps, 0, 0, NULL};
    int bf16 = a->x.dtype == LK_BF16 && a->out.dtype == LK_BF16;
    if (set_weights(&c, &a->w, a->gemma, rows, bf16, owned)) return LK_ERR_NOMEM;
    /* stream only when whole rows are multiples of the vector width and the output is big
     * and does not alias the input (in place keeps the lines in cache anyway) */
    c.stream = rows * D * oes >= LK_STREAM_MIN_BYTES && (D * oes) % LKV_BYTES == 0 && a->out.data != a->x.data;
    int64_t bytes = D * (lk_esize(a->x.dtype) + oes);
    c.prefetch = rows * bytes >= LK_STREAM_MIN_BYTES;
    lk_parallel_for(rows, bytes, rms_rows, &c);
    free(owned[0]);
    free(owned[1]);
    return LK_OK;
}

/* residual = round(x + residual) stored; returns sum of squares of the rounded values */
static inline float add_store(char *res, lk_dtype rt, const char *x, lk_dtype xt, int64_t D) {
    int64_t res_es = lk_esize(rt), xes = lk_esize(xt), i = 0;
    lkv_f32 s0 = lkv_zero(), s1 = s0;
    if (rt == LK_BF16 && xt == LK_BF16)
        /* 2W per step in even / odd order; the sum of two bf16 values is NaN only with a
         * bf16 input's payload or the default NaN (inf - inf), whose low 16 bits are 0, so
         * the rounding needs no NaN branch; the rounded values are squared from registers */
        for (; i + 2 * LKV_W <= D; i += 2 * LKV_W) {
            lkv_f32 xa, xb, ra, rb;
            lkv_bf16_load_eo(x + i * 2, &xa, &xb);
            lkv_bf16_load_eo(res + i * 2, &ra, &rb);
            lkv_bits r = lkv_bf16_join_nonan(lkv_add(xa, ra), lkv_add(xb, rb));
            lkv_f32 a, b;
            lkv_bits_storeu(res + i * 2, r);
            lkv_bf16_split(r, &a, &b); /* the rounded values */
            s0 = lkv_fma(a, a, s0), s1 = lkv_fma(b, b, s1);
        }
    for (; i + 2 * LKV_W <= D; i += 2 * LKV_W) {
        lkv_f32 a = lkv_add(lkv_load(x + i * xes, xt), lkv_load(res + i * res_es, rt));
        lkv_f32 b = lkv_add(lkv_load(x + (i + LKV_W) * xes, xt), lkv_load(res + (i + LKV_W) * res_es, rt));
        lkv_store(res + i * res_es, rt, a);
        lkv_store(res + (i + LKV_W) * res_es, rt, b);
        a = lkv_load(res + i * res_es, rt); /* the rounded value */
        b = lkv_load(res + (i + LKV_W) * res_es, rt);
        s0 = lkv_fma(a, a, s0), s1 = lkv_fma(b, b, s1);
    }
    for (; i < D; i += LKV_W) {
        int64_t n = D - i < LKV_W ? D - i : LKV_W;
        lkv_f32 a = lkv_add(lkv_load_part(x + i * xes, xt, n), lkv_load_part(res + i * res_es, rt, n));
        lkv_store_part(res + i * res_es, rt, a, n);
        a = lkv_load_part(res + i * res_es, rt, n);
        s0 = lkv_fma(a, a, s0);
    }
    return lkv_hsum(lkv_add(s0, s1));
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
        int npf = c->prefetch && r + 1 < r1 && lk_esize(x->dtype) <= lk_esize(res->dtype) ? 2 : 0;
        scale_row(xr, x->dtype, rr, res->dtype, c->w, c->wt, c->one, c->g_eo, D, inv, 0, pf, npf);
    }
}

static lk_status fused_add_rms_norm(const lk_fused_add_rms_norm_args *a) {
    int nd = a->x.ndim;
    if (a->x.stride[nd - 1] != 1 || a->residual.stride[nd - 1] != 1 ||
        (a->w.stride[0] != 1 && a->w.stride[0] != 0))
        return lk_ref_fused_add_rms_norm(a);
    int64_t D = a->x.shape[nd - 1], rows = lk_rows(&a->x, 1);
    float *owned[2];
    rows_ctx c = {&a->residual, &a->x, NULL, LK_F32, 0.0f, a->eps, 0, 0, NULL};
    int bf16 = a->x.dtype == LK_BF16 && a->residual.dtype == LK_BF16;
    if (set_weights(&c, &a->w, a->gemma, rows, bf16, owned)) return LK_ERR_NOMEM;
    int64_t bytes = 2 * D * (lk_esize(a->x.dtype) + lk_esize(a->residual.dtype));
    c.prefetch = rows * bytes >= LK_STREAM_MIN_BYTES;
    lk_parallel_for(rows, bytes, fused_rows, &c);
    free(owned[0]);
    free(owned[1]);
    return LK_OK;
}

/* ---------------------------------------------------------------- fp8-quantizing forms
 *
 *   v = x, or round(x + residual) stored to residual; ss = sum v^2 in the fixed order of
 *   src/cpu/fp8_quant.h (element i in lane i % 16: 16 / W vectors of FMA chains, stored and
 *   halved 8, 4, 2, 1 in scalar); y = (v * inv) * g; out = fp8(y / scale), the scale
 *   static or per row from absmax(y) (a second pass over the row recomputes y), or per
 *   block of G columns (all the row's block scales, then its codes); an i8 out (per row
 *   or block) = i8(y * (1 / scale)), the products in vectors, the rounding scalar.
 * The reference computes each of these steps with the same f32 operations in the same
 * order, so the bits agree on every ISA and thread count. Fast path: last-dim stride 1
 * on x, out and residual (w any: copied to f32 once); else the reference. Work split:
 * rows, contiguous chunks per thread. */

#define SS_VECS (LK_SS_LANES / LKV_W)

typedef struct {
    const lk_rms_norm_quant_args *a;
    const float *g; /* [D] f32 weights */
} quant_ctx;

/* v of the row's elements [i, i + n) (n <= W), with the residual add and store */
LK_ALWAYS_INLINE lkv_f32 quant_v(const char *x, lk_dtype xt, char *res, lk_dtype rt, int64_t i, int64_t n) {
    int64_t xes = lk_esize(xt);
    lkv_f32 v = n == LKV_W ? lkv_load(x + i * xes, xt) : lkv_load_part(x + i * xes, xt, n);
    if (!res) return v;
    int64_t res_es = lk_esize(rt);
    char *p = res + i * res_es;
    if (n == LKV_W) {
        lkv_store(p, rt, lkv_add(v, lkv_load(p, rt)));
        return lkv_load(p, rt); /* the rounded value */
    }
    lkv_store_part(p, rt, lkv_add(v, lkv_load_part(p, rt, n)), n);
    return lkv_load_part(p, rt, n);
}

LK_ALWAYS_INLINE float quant_sumsq_dt(const char *x, lk_dtype xt, char *res, lk_dtype rt, int64_t D) {
    lkv_f32 acc[SS_VECS];
    for (int k = 0; k < SS_VECS; k++) acc[k] = lkv_zero();
    int64_t i = 0;
    for (; i + LK_SS_LANES <= D; i += LK_SS_LANES)
        for (int k = 0; k < SS_VECS; k++) {
            lkv_f32 v = quant_v(x, xt, res, rt, i + k * LKV_W, LKV_W);
            acc[k] = lkv_fma(v, v, acc[k]);
        }
    for (int k = 0; k < SS_VECS && i + k * LKV_W < D; k++) { /* the last < 16: zero lanes add 0 */
        int64_t n = D - (i + k * LKV_W);
        lkv_f32 v = quant_v(x, xt, res, rt, i + k * LKV_W, n < LKV_W ? n : LKV_W);
        acc[k] = lkv_fma(v, v, acc[k]);
    }
    float s[LK_SS_LANES];
    for (int k = 0; k < SS_VECS; k++) lkv_storeu(s + k * LKV_W, acc[k]);
    return lk_ss_reduce(s);
}

/* the dtypes of x and of the residual (res NULL: none) as literals (fp8_store.h) */
#define SUMSQ_RT(xd) \
    (!res ? quant_sumsq_dt(x, xd, NULL, xd, D) \
     : rt == LK_BF16 ? quant_sumsq_dt(x, xd, res, LK_BF16, D) \
     : rt == LK_F16 ? quant_sumsq_dt(x, xd, res, LK_F16, D) : quant_sumsq_dt(x, xd, res, LK_F32, D))
static float quant_sumsq(const char *x, lk_dtype xt, char *res, lk_dtype rt, int64_t D) {
    return xt == LK_BF16 ? SUMSQ_RT(LK_BF16) : xt == LK_F16 ? SUMSQ_RT(LK_F16) : SUMSQ_RT(LK_F32);
}
#undef SUMSQ_RT

LK_ALWAYS_INLINE float quant_absmax_dt(const char *v, lk_dtype vt, const float *g, float inv, int64_t D) {
    int64_t es = lk_esize(vt), i = 0;
    lkv_f32 vinv = lkv_set1(inv), m = lkv_zero();
    for (; i + LKV_W <= D; i += LKV_W)
        m = lkq_absmax(m, lkv_mul(lkv_mul(lkv_load(v + i * es, vt), vinv), lkv_loadu(g + i)));
    if (i < D)
        m = lkq_absmax(m, lkv_mul(lkv_mul(lkv_load_part(v + i * es, vt, D - i), vinv),
                                  lkv_load_part(g + i, LK_F32, D - i)));
    return lkv_hmax(m);
}

static float quant_absmax(const char *v, lk_dtype vt, const float *g, float inv, int64_t D) {
    if (vt == LK_BF16) return quant_absmax_dt(v, LK_BF16, g, inv, D);
    if (vt == LK_F16) return quant_absmax_dt(v, LK_F16, g, inv, D);
    return quant_absmax_dt(v, LK_F32, g, inv, D);
}

/* i8 out: y * (1 / s) in vectors, each lane then rounded by the scalar converter the
 * reference uses (lk_q_i8) */
static void quant_store_i8(int8_t *o, const char *v, lk_dtype vt, const float *g, float inv, float s, int64_t D) {
    int64_t es = lk_esize(vt), i = 0;
    lkv_f32 vinv = lkv_set1(inv), vrs = lkv_set1(1.0f / s);
    float t[LKV_W];
    for (; i < D; i += LKV_W) {
        int64_t n = D - i < LKV_W ? D - i : LKV_W;
        lkv_f32 x = n == LKV_W ? lkv_load(v + i * es, vt) : lkv_load_part(v + i * es, vt, n);
        lkv_f32 gv = n == LKV_W ? lkv_loadu(g + i) : lkv_load_part(g + i, LK_F32, n);
        lkv_storeu(t, lkv_mul(lkv_mul(lkv_mul(x, vinv), gv), vrs));
        for (int64_t k = 0; k < n; k++) o[i + k] = lk_q_i8(t[k]);
    }
}

LK_ALWAYS_INLINE void quant_store_fp8(char *o, lk_dtype ot, const char *v, lk_dtype vt, const float *g, float inv,
                                      float s, int64_t D) {
    int64_t es = lk_esize(vt), i = 0;
    lkv_f32 vinv = lkv_set1(inv), vs = lkv_set1(s);
    for (; i + LKV_W <= D; i += LKV_W) {
        lkv_f32 y = lkv_mul(lkv_mul(lkv_load(v + i * es, vt), vinv), lkv_loadu(g + i));
        lkq_store_fp8(o + i, ot, lkv_div(y, vs), LKV_W);
    }
    if (i < D) {
        lkv_f32 y = lkv_mul(lkv_mul(lkv_load_part(v + i * es, vt, D - i), vinv), lkv_load_part(g + i, LK_F32, D - i));
        lkq_store_fp8(o + i, ot, lkv_div(y, vs), D - i);
    }
}

static void quant_store(char *o, lk_dtype ot, const char *v, lk_dtype vt, const float *g, float inv, float s,
                        int64_t D) {
    if (ot == LK_I8) {
        quant_store_i8((int8_t *)o, v, vt, g, inv, s, D);
        return;
    }
#define QSTORE(vd, od) quant_store_fp8(o, od, v, vd, g, inv, s, D)
    LKQ_FP8_OUT(vt, ot, QSTORE);
#undef QSTORE
}

static void quant_rows(void *ctx, int64_t r0, int64_t r1) {
    const quant_ctx *c = ctx;
    const lk_rms_norm_quant_args *a = c->a;
    const lk_tensor *x = &a->x, *out = &a->out, *res = &a->residual;
    int64_t D = x->shape[x->ndim - 1];
    lk_rowit xi, oi, ri, si;
    lk_rowit_init(&xi, x, 1, r0);
    lk_rowit_init(&oi, out, 1, r0);
    if (a->has_residual) lk_rowit_init(&ri, res, 1, r0);
    if (a->mode == LK_Q_TOKEN) lk_rowit_init(&si, &a->scales, 1, r0);
    for (int64_t r = r0; r < r1; r++, lk_rowit_next(&xi), lk_rowit_next(&oi)) {
        const char *xr = lk_at(x, xi.off); // [D]
        char *orow = lk_at(out, oi.off);   // [D]
        char *rr = NULL;                   // [D]
        if (a->has_residual) rr = lk_at(res, ri.off), lk_rowit_next(&ri);
        const char *vr = rr ? rr : xr;
        lk_dtype vt = rr ? res->dtype : x->dtype;
        float inv = lk_q_inv_rms(quant_sumsq(xr, x->dtype, rr, res->dtype, D), D, a->eps), s = a->scale;
        if (a->group) { /* per block of G columns: the row's scales, then its codes */
            int64_t G = a->group, gst = a->scales.stride[a->scales.ndim - 1], ves = lk_esize(vt);
            float *sr = (float *)a->scales.data + si.off; // [D / G] stride gst
            for (int64_t g = 0; g < D / G; g++)
                sr[g * gst] = lk_q_scale(quant_absmax(vr + g * G * ves, vt, c->g + g * G, inv, G), a->ub, out->dtype);
            for (int64_t g = 0; g < D / G; g++)
                quant_store(orow + g * G, out->dtype, vr + g * G * ves, vt, c->g + g * G, inv, sr[g * gst], G);
            lk_rowit_next(&si);
            continue;
        }
        if (a->mode == LK_Q_TOKEN) {
            s = lk_q_scale(quant_absmax(vr, vt, c->g, inv, D), a->ub, out->dtype);
            ((float *)a->scales.data)[si.off] = s;
            lk_rowit_next(&si);
        }
        quant_store(orow, out->dtype, vr, vt, c->g, inv, s, D);
    }
}

static lk_status rms_norm_quant(const lk_rms_norm_quant_args *a) {
    int nd = a->x.ndim;
    if (a->x.stride[nd - 1] != 1 || a->out.stride[nd - 1] != 1 ||
        (a->has_residual && a->residual.stride[nd - 1] != 1))
        return lk_ref_rms_norm_quant(a);
    int64_t D = a->x.shape[nd - 1], rows = lk_rows(&a->x, 1);
    float *g = malloc(sizeof(float) * (size_t)(D > 0 ? D : 1));
    if (!g) return LK_ERR_NOMEM;
    /* exact f32 copy of w (no + 0.0f: a -0 weight stays -0, as the reference reads it) */
    for (int64_t i = 0; i < D; i++) g[i] = lk_load_f(a->w.data, a->w.dtype, i * a->w.stride[0]);
    quant_ctx c = {a, g};
    int64_t bytes = D * (lk_esize(a->x.dtype) + 1 + (a->has_residual ? 2 * lk_esize(a->residual.dtype) : 0));
    lk_parallel_for(rows, bytes, quant_rows, &c);
    free(g);
    return LK_OK;
}

void LKV_FN(register_rms_norm)(lk_kernel_table *t) {
    t->rms_norm = rms_norm;
    t->fused_add_rms_norm = fused_add_rms_norm;
    t->rms_norm_quant = rms_norm_quant;
}
