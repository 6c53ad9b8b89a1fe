/*
 * fused_add_rms_norm, scalar reference.
 *
 *   residual[r, i] = round_res(x[r, i] + residual[r, i])          (stored first)
 *   x[r, i]        = round_x(residual[r, i] * rsqrt(mean(residual[r]^2) + eps) * g(w[i]))
 *
 * The norm reads the ROUNDED residual (what was stored), as vLLM does. Shapes: x,
 * residual [..., D] (rows, any strides); w [D]. Both updated in place. No threads.
 */
#include <math.h>

#include "../../core/half.h"
#include "../kernels.h"

lk_status lk_ref_fused_add_rms_norm(const lk_fused_add_rms_norm_args *a) {
    const lk_tensor *x = &a->x, *res = &a->residual, *w = &a->w;
    int nd = x->ndim;
    int64_t D = x->shape[nd - 1], rows = lk_rows(x, 1);
    int64_t xs = x->stride[nd - 1], rs = res->stride[nd - 1], ws = w->stride[0];
    lk_rowit xi, ri;
    lk_rowit_init(&xi, x, 1, 0);
    lk_rowit_init(&ri, res, 1, 0);
    for (int64_t r = 0; r < rows; r++, lk_rowit_next(&xi), lk_rowit_next(&ri)) {
        void *xr = lk_at(x, xi.off);   // [D] stride xs
        void *rr = lk_at(res, ri.off); // [D] stride rs
        double ss = 0.0;
        for (int64_t i = 0; i < D; i++) {
            float s = lk_load_f(xr, x->dtype, i * xs) + lk_load_f(rr, res->dtype, i * rs);
            s = lk_round_to(res->dtype, s);
            lk_store_f(rr, res->dtype, i * rs, s);
            ss += (double)s * s;
        }
        float inv = 1.0f / sqrtf((float)(ss / (double)D) + a->eps);
        for (int64_t i = 0; i < D; i++) {
            float wv = lk_load_f(w->data, w->dtype, i * ws);
            if (a->gemma) wv += 1.0f;
            lk_store_f(xr, x->dtype, i * xs, lk_load_f(rr, res->dtype, i * rs) * inv * wv);
        }
    }
    return LK_OK;
}
