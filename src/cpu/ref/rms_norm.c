/*
 * rms_norm, scalar reference.
 *
 *   out[r, i] = x[r, i] * rsqrt(sum_i(x[r, i]^2) / D + eps) * g(w[i]),
 *   g(w) = w, or 1 + w with `gemma` (Gemma's checkpoints store w - 1).
 *
 * Shapes: x, out [..., D] (leading dims walked as rows, any strides); w [D].
 * The sum of squares is accumulated in double; everything else in f32; one rounding
 * to out's dtype per element. out may be x itself: each row is read completely
 * before it is written. No threads.
 */
#include <math.h>

#include "../../core/half.h"
#include "../kernels.h"

lk_status lk_ref_rms_norm(const lk_rms_norm_args *a) {
    const lk_tensor *x = &a->x, *out = &a->out, *w = &a->w;
    int nd = x->ndim;
    int64_t D = x->shape[nd - 1], rows = lk_rows(x, 1);
    int64_t xs = x->stride[nd - 1], os = out->stride[nd - 1], ws = w->stride[0];
    lk_rowit xi, oi;
    lk_rowit_init(&xi, x, 1, 0);
    lk_rowit_init(&oi, out, 1, 0);
    for (int64_t r = 0; r < rows; r++, lk_rowit_next(&xi), lk_rowit_next(&oi)) {
        const void *xr = lk_at(x, xi.off); // [D] stride xs
        void *orow = lk_at(out, oi.off);   // [D] stride os
        double ss = 0.0;
        for (int64_t i = 0; i < D; i++) {
            double v = lk_load_f(xr, x->dtype, i * xs);
            ss += v * v;
        }
        float inv = 1.0f / sqrtf((float)(ss / (double)D) + a->eps);
        for (int64_t i = 0; i < D; i++) {
            float wv = lk_load_f(w->data, w->dtype, i * ws);
            if (a->gemma) wv += 1.0f;
            lk_store_f(orow, out->dtype, i * os, lk_load_f(xr, x->dtype, i * xs) * inv * wv);
        }
    }
    return LK_OK;
}
