/*
 * silu_and_mul_quant (static per tensor) and silu_and_mul_per_block_quant, scalar
 * reference.
 *
 *   y[r, i] = silu(x[r, i]) * x[r, d + i]        f32, lk_aq_silu (src/cpu/act_quant.h)
 *   static:    out[r, i] = fp8(y[r, i] / scale)
 *   per block: s = scales[r, g] = lk_aq_block_scale(absmax(y[r, gG:gG+G]), ub, out dtype),
 *              out[r, i] = q(y[r, i] / s) for the elements of block g (fp8 or i8)
 * absmax ignores NaN. Shapes: x [..., 2d], out [..., d], scales [..., d / G] (rows walked
 * in row-major order, any strides). Each block's y is computed twice (absmax, codes): the
 * same bits both times. No threads.
 */
#include "../../core/half.h"
#include "../act_quant.h"

lk_status lk_ref_act_quant(const lk_act_quant_args *a) {
    const lk_tensor *x = &a->x, *out = &a->out;
    int nd = x->ndim;
    int64_t d = out->shape[nd - 1], rows = lk_rows(out, 1), xs = x->stride[nd - 1], os = out->stride[nd - 1];
    int64_t G = a->group ? a->group : d, gst = a->group ? a->scales.stride[nd - 1] : 0;
    lk_rowit xi, oi, si;
    lk_rowit_init(&xi, x, 1, 0);
    lk_rowit_init(&oi, out, 1, 0);
    if (a->group) lk_rowit_init(&si, &a->scales, 1, 0);
    for (int64_t r = 0; r < rows; r++, lk_rowit_next(&xi), lk_rowit_next(&oi)) {
        const void *xr = lk_at(x, xi.off); // [2d] stride xs: gate [0, d), up [d, 2d)
        void *orow = lk_at(out, oi.off);   // [d] stride os
        for (int64_t g0 = 0; g0 < d; g0 += G) {
            float s = a->scale;
            if (a->group) {
                float m = 0.0f;
                for (int64_t i = g0; i < g0 + G; i++)
                    m = lk_q_absmax_fold(m, lk_aq_y(lk_load_f(xr, x->dtype, i * xs), lk_load_f(xr, x->dtype, (d + i) * xs)));
                s = lk_aq_block_scale(m, a->ub, out->dtype);
                ((float *)a->scales.data)[si.off + g0 / G * gst] = s;
            }
            for (int64_t i = g0; i < g0 + G; i++)
                lk_aq_code(orow, out->dtype, i * os,
                           lk_aq_y(lk_load_f(xr, x->dtype, i * xs), lk_load_f(xr, x->dtype, (d + i) * xs)), s);
        }
        if (a->group) lk_rowit_next(&si);
    }
    return LK_OK;
}
