/*
 * The extra activations (gelu_and_mul, mul_and_silu, fatrelu_and_mul, swigluoai_and_mul,
 * gelu_new / gelu_fast, gelu_quick), every vector ISA (src/cpu/vec/lkv.h, W lanes).
 * Formulas, shapes and special values as ref/act_ext.c and act_ext_math.h.
 *
 * Sigmoid forms act(g) = g / (1 + exp(x)) with lkv_exp (~2 ulp) and a true IEEE
 * division, the g = -inf lanes set to -0 (the limit); the exponent argument is formed
 * with the reference's operations in its order (no fma), so results are within a few
 * f32 ulp of the reference (test_act_ext). gelu_and_mul's erfc is evaluated per lane
 * with the reference's scalar formula (the vector layer has no erf), so that kind equals
 * the reference bit for bit; the product with u is vectorised. swigluoai's interleaved
 * pairs are split per block of W into two f32 arrays before the vector arithmetic.
 *
 * Fast path: last-dim stride 1 on x and out; other layouts go to the reference. Work
 * split: units of (row, block of BLK outputs), contiguous ranges of units per thread
 * (lk_parallel_for); every output is computed the same way whatever the split.
 */
#include <float.h>

#include "../../core/half.h"
#include "../act_ext_math.h"
#include "../kernels.h"
#include "../vec/lkv.h"

#define BLK 2048 /* outputs per work unit */

static inline lkv_f32 v_sig(lkv_f32 g, lkv_f32 x) {
    lkv_f32 r = lkv_div(g, lkv_add(lkv_set1(1.0f), lkv_exp(x)));
    return lkv_blend(r, lkv_set1(-0.0f), lkv_lt(g, lkv_set1(-FLT_MAX)));
}

/* W (or n < W) outputs from the gate / first values a and the up / second values b */
static inline lkv_f32 v_value(const lk_act_ext_args *p, lkv_f32 a, lkv_f32 b) {
    switch (p->kind) {
    case LK_ACT_GELU_ERF_MUL: {
        float ga[LKV_W];
        lkv_storeu(ga, a);
        for (int k = 0; k < LKV_W; k++) ga[k] = lk_act_gelu_erf(ga[k]);
        return lkv_mul(lkv_loadu(ga), b);
    }
    case LK_ACT_MUL_SILU: return lkv_mul(a, v_sig(b, lkv_sub(lkv_zero(), b)));
    case LK_ACT_FATRELU_MUL: return lkv_mul(lkv_maskz(lkv_gt(a, lkv_set1(p->p0)), a), b);
    case LK_ACT_SWIGLUOAI_MUL: {
        lkv_f32 lim = lkv_set1(p->p1);
        lkv_f32 g = lkv_min(lim, a);                                       /* NaN stays */
        lkv_f32 u = lkv_max(lkv_set1(-p->p1), lkv_min(lim, b));            /* NaN stays */
        return lkv_mul(lkv_add(u, lkv_set1(1.0f)), v_sig(g, lkv_mul(lkv_set1(-p->p0), g)));
    }
    case LK_ACT_GELU_NEW:
        return v_sig(a, lkv_mul(a, lkv_add(lkv_set1(LK_GELU_K0), lkv_mul(lkv_set1(LK_GELU_K1), lkv_mul(a, a)))));
    default: return v_sig(a, lkv_mul(lkv_set1(-1.702f), a)); /* LK_ACT_GELU_QUICK */
    }
}

/* outputs [c0, c0 + n) of one row: xr the row of x, o the row of out */
static void seg(const lk_act_ext_args *p, char *o, const char *xr, int64_t d, int64_t c0, int64_t n) {
    lk_dtype xt = p->x.dtype, ot = p->out.dtype;
    int64_t xes = lk_esize(xt), oes = lk_esize(ot);
    int gated = p->kind < LK_ACT_GELU_NEW, inter = p->kind == LK_ACT_SWIGLUOAI_MUL;
    for (int64_t i = c0; i < c0 + n; i += LKV_W) {
        int64_t m = c0 + n - i < LKV_W ? c0 + n - i : LKV_W;
        lkv_f32 a, b = lkv_zero();
        if (inter) { /* pairs (2i, 2i + 1) split into two f32 arrays */
            float ga[LKV_W] = {0}, ua[LKV_W] = {0};
            for (int64_t k = 0; k < m; k++) {
                ga[k] = lk_load_f(xr, xt, 2 * (i + k));
                ua[k] = lk_load_f(xr, xt, 2 * (i + k) + 1);
            }
            a = lkv_loadu(ga), b = lkv_loadu(ua);
        } else if (m == LKV_W) {
            a = lkv_load(xr + i * xes, xt);
            if (gated) b = lkv_load(xr + (d + i) * xes, xt);
        } else {
            a = lkv_load_part(xr + i * xes, xt, m);
            if (gated) b = lkv_load_part(xr + (d + i) * xes, xt, m);
        }
        lkv_f32 r = v_value(p, a, b);
        if (m == LKV_W) lkv_store(o + i * oes, ot, r);
        else lkv_store_part(o + i * oes, ot, r, m);
    }
}

typedef struct {
    const lk_act_ext_args *a;
    int64_t nblk; /* blocks per row */
} ext_ctx;

static void ext_range(void *ctx, int64_t u0, int64_t u1) {
    const ext_ctx *c = ctx;
    const lk_tensor *x = &c->a->x, *out = &c->a->out;
    int64_t d = out->shape[out->ndim - 1], blk = u0 % c->nblk;
    lk_rowit xi, oi;
    lk_rowit_init(&xi, x, 1, u0 / c->nblk);
    lk_rowit_init(&oi, out, 1, u0 / c->nblk);
    for (int64_t u = u0; u < u1; u++) {
        const char *xr = lk_at(x, xi.off); // [2d] or [d]
        char *orow = lk_at(out, oi.off);   // [d]
        int64_t c0 = blk * BLK;
        seg(c->a, orow, xr, d, c0, d - c0 < BLK ? d - c0 : BLK);
        if (++blk == c->nblk) {
            blk = 0;
            lk_rowit_next(&xi);
            lk_rowit_next(&oi);
        }
    }
}

static lk_status act_ext(const lk_act_ext_args *a) {
    int nd = a->x.ndim;
    if (a->x.stride[nd - 1] != 1 || a->out.stride[nd - 1] != 1) return lk_ref_act_ext(a);
    int64_t d = a->out.shape[nd - 1];
    ext_ctx c = {a, (d + BLK - 1) / BLK};
    int64_t len = d < BLK ? d : BLK;
    int64_t bytes = len * (2 * lk_esize(a->x.dtype) + lk_esize(a->out.dtype)) * 8; /* exp-bound: weigh as more bytes */
    lk_parallel_for(lk_rows(&a->out, 1) * c.nblk, bytes, ext_range, &c);
    return LK_OK;
}

void LKV_FN(register_act_ext)(lk_kernel_table *t) { t->act_ext = act_ext; }
