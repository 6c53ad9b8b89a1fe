/*
 * scaled_int8_quant (static / dynamic per token, symmetric / asymmetric), scalar reference.
 *
 *   out[r, i] = sat8(sat32(rn(v)) + azp)     v = x[r, i] / scale (static symmetric),
 *                                            else x[r, i] * f (one f32 product)
 *   static:  scale, azp given (f = 1 / scale when asymmetric)
 *   dynamic: per row r, symmetric: scales[r] = absmax / 127, f = 127 / absmax (0 if 0);
 *            asymmetric: s = (max - min) / 255 = scales[r], azps[r] = sat32(rn(-128 -
 *            min / s)), f = 1 / s
 * absmax / min / max ignore NaN; the row parameters and the code converter are the shared
 * scalar pieces of src/cpu/int8_quant.h. Shapes: x, out [..., D] (rows walked in
 * row-major order, any strides); scales, azps [..., 1]. No threads.
 */
#include "../../core/half.h"
#include "../fp8_quant.h"
#include "../int8_quant.h"

lk_status lk_ref_int8_quant(const lk_int8_quant_args *a) {
    const lk_tensor *x = &a->x, *out = &a->out;
    int nd = x->ndim;
    int64_t D = x->shape[nd - 1], rows = lk_rows(x, 1), xs = x->stride[nd - 1], os = out->stride[nd - 1];
    lk_rowit xi, oi, si, zi;
    lk_i8q_row p = {a->scale, !a->asym, a->azp};
    if (!a->dynamic && a->asym) p.f = 1.0f / a->scale; /* static asymmetric: the reciprocal, as vLLM's */
    lk_rowit_init(&xi, x, 1, 0);
    lk_rowit_init(&oi, out, 1, 0);
    if (a->dynamic) lk_rowit_init(&si, &a->scales, 1, 0);
    if (a->dynamic && a->asym) lk_rowit_init(&zi, &a->azps, 1, 0);
    for (int64_t r = 0; r < rows; r++, lk_rowit_next(&xi), lk_rowit_next(&oi)) {
        const void *xr = lk_at(x, xi.off); // [D] stride xs
        int8_t *orow = lk_at(out, oi.off); // [D] stride os
        if (a->dynamic) {
            float sc;
            if (a->asym) {
                float mn = INFINITY, mx = -INFINITY;
                for (int64_t i = 0; i < D; i++) lk_i8q_minmax_fold(&mn, &mx, lk_load_f(xr, x->dtype, i * xs));
                lk_i8q_asym(mn, mx, &sc, &p);
                ((int32_t *)a->azps.data)[zi.off] = p.azp;
                lk_rowit_next(&zi);
            } else {
                float m = 0.0f;
                for (int64_t i = 0; i < D; i++) m = lk_q_absmax_fold(m, lk_load_f(xr, x->dtype, i * xs));
                lk_i8q_sym(m, &sc, &p);
            }
            ((float *)a->scales.data)[si.off] = sc;
            lk_rowit_next(&si);
        }
        for (int64_t i = 0; i < D; i++) {
            float v = lk_load_f(xr, x->dtype, i * xs);
            orow[i * os] = lk_i8q_code(p.div ? v / p.f : v * p.f, p.azp);
        }
    }
    return LK_OK;
}
