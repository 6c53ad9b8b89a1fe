/*
 * causal_softmax, scalar reference.
 *
 *   off = k_len - q_len; query row i sees keys j < nv(i) = clamp(i + off + 1, 0, k_len)
 *   m = max_{j < nv} x[i, j]; a NaN or +inf among them: out[i, j < nv] = NaN
 *   shift = m, or 0 if m = -inf; l = sum_{j < nv} exp(x[i, j] - shift)
 *   out[i, j] = exp(x[i, j] - shift) * inv(l) for j < nv, 0 for j >= nv
 * with inv(l) = 1 / l, or 0 when l = 0 (no visible key, or all visible entries -inf:
 * the row is all 0, never NaN). Rules in src/common/attn_state.h.
 *
 * Shapes: x, out [..., q_len, k_len] (leading dims and q_len walked as rows, any
 * strides, each its own float dtype). The sum is accumulated in double; one rounding
 * to out's dtype per element. out may be x itself: each element is read before it is
 * written. No threads.
 */
#include <math.h>

#include "../../common/attn_state.h"
#include "../../core/half.h"
#include "../kernels.h"

lk_status lk_ref_causal_softmax(const lk_softmax_args *a) {
    const lk_tensor *x = &a->x, *out = &a->out;
    int nd = x->ndim;
    int64_t q_len = x->shape[nd - 2], k_len = x->shape[nd - 1], rows = lk_rows(x, 1);
    int64_t xs = x->stride[nd - 1], os = out->stride[nd - 1];
    lk_rowit xi, oi;
    lk_rowit_init(&xi, x, 1, 0);
    lk_rowit_init(&oi, out, 1, 0);
    for (int64_t r = 0; r < rows; r++, lk_rowit_next(&xi), lk_rowit_next(&oi)) {
        const void *xr = lk_at(x, xi.off); // [k_len] stride xs
        void *orow = lk_at(out, oi.off);   // [k_len] stride os
        int64_t i = r % q_len, nv = i + k_len - q_len + 1;
        if (nv < 0) nv = 0;
        float m = -INFINITY;
        int any_nan = 0;
        for (int64_t j = 0; j < nv; j++) {
            float v = lk_load_f(xr, x->dtype, j * xs);
            if (isnan(v)) any_nan = 1;
            else if (v > m) m = v;
        }
        if (lk_softmax_row_nan(m, any_nan)) {
            for (int64_t j = 0; j < nv; j++) lk_store_f(orow, out->dtype, j * os, NAN);
        } else {
            float shift = lk_online_shift(m);
            double l = 0.0;
            for (int64_t j = 0; j < nv; j++) l += expf(lk_load_f(xr, x->dtype, j * xs) - shift);
            float inv = lk_softmax_inv((float)l);
            for (int64_t j = 0; j < nv; j++) {
                float p = expf(lk_load_f(xr, x->dtype, j * xs) - shift);
                lk_store_f(orow, out->dtype, j * os, p * inv);
            }
        }
        for (int64_t j = nv; j < k_len; j++) lk_store_f(orow, out->dtype, j * os, 0.0f);
    }
    return LK_OK;
}
