/*
 * scaled_fp8_quant (static per tensor or on a grid of scales, dynamic per tensor, dynamic
 * per token) and per_token_group_fp8_quant, scalar reference.
 *
 *   out[r, i] = fp8(x[r, i] / s)          one f32 division, then the fp8.h converter
 *   static:     s = the given scale
 *   per tensor: s = max(absmax(x) / fp8_max, min_scale), written to *scale_out first
 *   per token:  s = scales[r] = max(min(absmax(x[r]), ub) / fp8_max, min_scale)
 *   grid:       s = scale[r / gm, i / gn] (given) for element i of row r
 *   per group:  s = gscales[r, g] = lk_q_group_scale(absmax(x[r, gG:gG+G]), eps, ue8m0)
 *               for the elements of group g (G = group elements); an i8 out:
 *               out[r, i] = lk_q_i8_trunc(x[r, i] / s) (fp8_max 127)
 * absmax ignores NaN (src/cpu/fp8_quant.h). Shapes: x, out [..., D] (rows walked in
 * row-major order, any strides); scales [..., 1]; gscales [..., D / G]; the grid
 * [rows / gm, D / gn]. No threads.
 */
#include "../../core/half.h"
#include "../fp8_quant.h"

/* absmax of row xr [D] (stride xs) */
static float row_absmax(const void *xr, lk_dtype dt, int64_t xs, int64_t D) {
    float m = 0.0f;
    for (int64_t i = 0; i < D; i++) m = lk_q_absmax_fold(m, lk_load_f(xr, dt, i * xs));
    return m;
}

lk_status lk_ref_fp8_quant(const lk_fp8_quant_args *a) {
    const lk_tensor *x = &a->x, *out = &a->out;
    int nd = x->ndim;
    int64_t D = x->shape[nd - 1], rows = lk_rows(x, 1), xs = x->stride[nd - 1], os = out->stride[nd - 1];
    lk_rowit xi, oi, si;
    float s = a->scale;
    if (a->mode == LK_Q_TENSOR) {
        float m = 0.0f;
        lk_rowit_init(&xi, x, 1, 0);
        for (int64_t r = 0; r < rows; r++, lk_rowit_next(&xi)) {
            float rm = row_absmax(lk_at(x, xi.off), x->dtype, xs, D);
            m = rm > m ? rm : m;
        }
        s = *a->scale_out = lk_q_scale(m, INFINITY, out->dtype);
    }
    lk_rowit_init(&xi, x, 1, 0);
    lk_rowit_init(&oi, out, 1, 0);
    if (a->mode == LK_Q_TOKEN) lk_rowit_init(&si, &a->scales, 1, 0);
    if (a->mode == LK_Q_GROUP) lk_rowit_init(&si, &a->gscales, 1, 0);
    for (int64_t r = 0; r < rows; r++, lk_rowit_next(&xi), lk_rowit_next(&oi)) {
        const void *xr = lk_at(x, xi.off); // [D] stride xs
        void *orow = lk_at(out, oi.off);   // [D] stride os
        if (a->mode == LK_Q_STATIC_GRID) {
            for (int64_t i = 0; i < D; i++)
                lk_q_store(orow, out->dtype, i * os,
                           lk_load_f(xr, x->dtype, i * xs) / lk_scale_at(&a->grid, r / a->gm, i / a->group));
            continue;
        }
        if (a->mode == LK_Q_GROUP) {
            const lk_tensor *gs = &a->gscales; // [..., D / G]
            int64_t G = a->group, gst = gs->stride[gs->ndim - 1];
            for (int64_t g = 0; g < D / G; g++) {
                const char *xg = (const char *)xr + g * G * xs * lk_esize(x->dtype); // [G] stride xs
                s = lk_q_group_scale(row_absmax(xg, x->dtype, xs, G), a->eps, a->ue8m0, out->dtype);
                ((float *)gs->data)[si.off + g * gst] = s;
                for (int64_t i = g * G; i < g * G + G; i++) {
                    float v = lk_load_f(xr, x->dtype, i * xs) / s;
                    if (out->dtype == LK_I8) ((int8_t *)orow)[i * os] = lk_q_i8_trunc(v);
                    else lk_q_store(orow, out->dtype, i * os, v);
                }
            }
            lk_rowit_next(&si);
            continue;
        }
        if (a->mode == LK_Q_TOKEN) {
            s = lk_q_scale(row_absmax(xr, x->dtype, xs, D), a->ub, out->dtype);
            ((float *)a->scales.data)[si.off] = s;
            lk_rowit_next(&si);
        }
        for (int64_t i = 0; i < D; i++) lk_q_store(orow, out->dtype, i * os, lk_load_f(xr, x->dtype, i * xs) / s);
    }
    return LK_OK;
}
