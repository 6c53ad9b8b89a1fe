/*
 * scaled_int8_quant (static / dynamic per token, symmetric / asymmetric), every vector
 * ISA (src/cpu/vec/lkv.h, W lanes).
 *
 *   out[r, i] = sat8(sat32(rn(v)) + azp),  v = x[r, i] / scale (static symmetric) or
 *   x[r, i] * f; the row parameters (f, azp, the written scale) from the shared scalar
 *   code of src/cpu/int8_quant.h, over the row's absmax (symmetric) or min and max
 *   (asymmetric), NaN ignored.
 *
 * Shapes: x, out [..., D]; scales, azps [..., 1]. Fast path: last-dim stride 1 on x and
 * out, else the reference. Work split: rows, contiguous chunks per thread
 * (lk_parallel_for); a dynamic row is reduced then quantized by the same thread.
 * Codes in vectors: v (one f32 division or product, as the reference's), NaN lanes
 * zeroed, then rounded by lkv_cvt_i32 (to nearest, ties to even); symmetric (azp 0):
 * clamped to [-128, 127] in f32 first; asymmetric: clamped to [-2^31, 2^31 - 128] in f32
 * first, lanes >= 2^31 then set to INT32_MAX (sat32), clamped to [lo, hi] and azp added
 * in int32 (lk_i8q_bounds: the value of the reference's 64-bit sum, saturated).
 * The reductions are a max / min (exact in any order; zero signs never reach a result,
 * see lk_i8q_asym): results are bit-identical to the reference on every ISA and thread
 * count.
 */
#include "../int8_quant.h"
#include "fp8_store.h"

enum { M_DIV, M_MUL, M_AZP }; /* x / f (azp 0), x * f (azp 0), x * f with a zero point */

typedef struct {
    float f;
    int32_t azp, lo, hi;
} qrow;

/* the codes of v (W lanes) as int32 in [-128, 127] */
LK_ALWAYS_INLINE lkv_i32 codes(lkv_f32 v, int mode, const qrow *q) {
    v = lkv_zero_where(lkv_unord(v, v), v);
    if (mode != M_AZP) /* clamping before the rounding conversion gives the same codes */
        return lkv_cvt_i32(lkv_min(lkv_max(v, lkv_set1(-128.0f)), lkv_set1(127.0f)));
    lkv_f32 top = lkv_set1(2147483520.0f); /* the largest f32 below 2^31 */
    lkv_m big = lkv_gt(v, top);            /* v >= 2^31: sat32 gives INT32_MAX */
    lkv_i32 t = lkv_cvt_i32(lkv_min(lkv_max(v, lkv_set1(-2147483648.0f)), top));
    t = lkv_i32_blend(t, lkv_i32_set1(INT32_MAX), big);
    t = lkv_i32_min(t, lkv_i32_set1(q->hi));
    lkv_i32 lo = lkv_i32_set1(q->lo);
    t = lkv_i32_blend(t, lo, lkv_i32_gt(lo, t));
    return lkv_i32_add(t, lkv_i32_set1(q->azp));
}

LK_ALWAYS_INLINE void quant_span(int8_t *o, const char *x, lk_dtype xt, int64_t D, int mode, const qrow *q) {
    int64_t es = lk_esize(xt), i = 0;
    lkv_f32 f = lkv_set1(q->f);
    lkv_i32 byte = lkv_i32_set1(0xff); /* the low byte of each lane (lkv_u8_store) */
    for (; i + LKV_W <= D; i += LKV_W) {
        lkv_f32 x0 = lkv_load(x + i * es, xt);
        lkv_f32 v = mode == M_DIV ? lkv_div(x0, f) : lkv_mul(x0, f);
        lkv_u8_store(o + i, lkv_i32_and(codes(v, mode, q), byte));
    }
    if (i < D) {
        lkv_f32 x0 = lkv_load_part(x + i * es, xt, D - i);
        lkv_f32 v = mode == M_DIV ? lkv_div(x0, f) : lkv_mul(x0, f);
        lkv_u8_store_part(o + i, lkv_i32_and(codes(v, mode, q), byte), D - i);
    }
}

/* one row: the mode and input dtype as literals for the inlined body */
static void quant_row(int8_t *o, const char *x, lk_dtype xt, int64_t D, const lk_i8q_row *p) {
    qrow q = {p->f, p->azp, 0, 0};
    lk_i8q_bounds(p->azp, &q.lo, &q.hi);
    int mode = p->div ? M_DIV : p->azp ? M_AZP : M_MUL;
#define QROW_DT(dt)                                                  \
    do {                                                             \
        if (mode == M_DIV) quant_span(o, x, dt, D, M_DIV, &q);       \
        else if (mode == M_MUL) quant_span(o, x, dt, D, M_MUL, &q);  \
        else quant_span(o, x, dt, D, M_AZP, &q);                     \
    } while (0)
    if (xt == LK_F32) QROW_DT(LK_F32);
    else if (xt == LK_F16) QROW_DT(LK_F16);
    else QROW_DT(LK_BF16);
#undef QROW_DT
}

/* min and max of a row, NaN ignored (lkv_min / lkv_max return the second operand where
 * the first is NaN, on every ISA); +inf / -inf when the row has no non-NaN value */
static void row_minmax(const char *x, lk_dtype dt, int64_t D, float *mn, float *mx) {
    int64_t es = lk_esize(dt), i = 0;
    lkv_f32 lo = lkv_set1(INFINITY), hi = lkv_set1(-INFINITY);
    for (; i + LKV_W <= D; i += LKV_W) {
        lkv_f32 v = lkv_load(x + i * es, dt);
        lo = lkv_min(v, lo);
        hi = lkv_max(v, hi);
    }
    if (i < D) { /* lanes past the row: NaN, ignored */
        lkv_f32 v = lkv_blend(lkv_set1(NAN), lkv_load_part(x + i * es, dt, D - i), lkv_m_first(D - i));
        lo = lkv_min(v, lo);
        hi = lkv_max(v, hi);
    }
    *mx = lkv_hmax(hi);
    *mn = -lkv_hmax(lkv_sub(lkv_zero(), lo)); /* min = -max(-x), exact */
}

static void quant_rows(void *ctx, int64_t r0, int64_t r1) {
    const lk_int8_quant_args *a = ctx;
    const lk_tensor *x = &a->x, *out = &a->out;
    int64_t D = x->shape[x->ndim - 1];
    lk_rowit xi, oi, si, zi;
    lk_rowit_init(&xi, x, 1, r0);
    lk_rowit_init(&oi, out, 1, r0);
    if (a->dynamic) lk_rowit_init(&si, &a->scales, 1, r0);
    if (a->dynamic && a->asym) lk_rowit_init(&zi, &a->azps, 1, r0);
    lk_i8q_row p = {a->scale, !a->asym, a->azp};
    if (!a->dynamic && a->asym) p.f = 1.0f / a->scale; /* as the reference */
    for (int64_t r = r0; r < r1; r++, lk_rowit_next(&xi), lk_rowit_next(&oi)) {
        const char *xr = lk_at(x, xi.off); // [D]
        int8_t *orow = lk_at(out, oi.off); // [D]
        if (a->dynamic) {
            float sc;
            if (a->asym) {
                float mn, mx;
                row_minmax(xr, x->dtype, D, &mn, &mx);
                lk_i8q_asym(mn, mx, &sc, &p);
                ((int32_t *)a->azps.data)[zi.off] = p.azp;
                lk_rowit_next(&zi);
            } else lk_i8q_sym(lkq_row_absmax(xr, x->dtype, D), &sc, &p);
            ((float *)a->scales.data)[si.off] = sc;
            lk_rowit_next(&si);
        }
        quant_row(orow, xr, x->dtype, D, &p);
    }
}

static lk_status int8_quant(const lk_int8_quant_args *a) {
    int nd = a->x.ndim;
    if (a->x.stride[nd - 1] != 1 || a->out.stride[nd - 1] != 1) return lk_ref_int8_quant(a);
    int64_t D = a->x.shape[nd - 1];
    lk_parallel_for(lk_rows(&a->x, 1), D * (lk_esize(a->x.dtype) + 1) + 8, quant_rows, (void *)a);
    return LK_OK;
}

void LKV_FN(register_int8_quant)(lk_kernel_table *t) { t->int8_quant = int8_quant; }
