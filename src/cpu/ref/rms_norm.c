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
#include "../fp8_quant.h"
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

/*
 * rms_norm + fp8 quantization (static scale, or dynamic per token), with an optional
 * residual add, scalar reference:
 *
 *   v[r, i]   = x[r, i], or round_res(x[r, i] + residual[r, i]) stored to residual
 *   ss        = the 16-lane fixed-order f32 sum of v^2 (src/cpu/fp8_quant.h: lane i % 16,
 *               fmaf chains, halving reduction), the order every ISA uses
 *   y[r, i]   = (v[r, i] * (1 / sqrt(ss / D + eps))) * w[i]                      (f32)
 *   scale     = static, or max(min(absmax(y[r]), ub) / fp8_max, min_scale) -> scales[r]
 *               (with a group G: the same per block of G columns -> scales[r, g])
 *   out[r, i] = fp8(y[r, i] / scale), or (i8 out, per token: fp8_max 127, min_scale
 *               FLT_EPSILON) i8(y[r, i] * (1 / scale))
 * Shapes: x, residual, out [..., D] (any strides); w [D] (stride 0: no weight);
 * scales [..., 1], or [..., D / G] per block. No threads.
 */
lk_status lk_ref_rms_norm_quant(const lk_rms_norm_quant_args *a) {
    const lk_tensor *x = &a->x, *out = &a->out, *w = &a->w, *res = &a->residual;
    int nd = x->ndim;
    int64_t D = x->shape[nd - 1], rows = lk_rows(x, 1);
    int64_t xs = x->stride[nd - 1], os = out->stride[nd - 1], ws = w->stride[0];
    int64_t rs = a->has_residual ? res->stride[nd - 1] : 0;
    lk_rowit xi, oi, ri, si;
    lk_rowit_init(&xi, x, 1, 0);
    lk_rowit_init(&oi, out, 1, 0);
    if (a->has_residual) lk_rowit_init(&ri, res, 1, 0);
    if (a->mode == LK_Q_TOKEN) lk_rowit_init(&si, &a->scales, 1, 0);
    for (int64_t r = 0; r < rows; r++, lk_rowit_next(&xi), lk_rowit_next(&oi)) {
        const void *xr = lk_at(x, xi.off); // [D] stride xs
        void *orow = lk_at(out, oi.off);   // [D] stride os
        void *rr = NULL;                   // [D] stride rs
        if (a->has_residual) rr = lk_at(res, ri.off), lk_rowit_next(&ri);
        const void *vr = rr ? rr : xr;     /* the normalised row: v */
        lk_dtype vt = rr ? res->dtype : x->dtype;
        int64_t vs = rr ? rs : xs;
        float ss[LK_SS_LANES] = {0};
        for (int64_t i = 0; i < D; i++) {
            float v = lk_load_f(xr, x->dtype, i * xs);
            if (rr) {
                v = lk_round_to(res->dtype, v + lk_load_f(rr, res->dtype, i * rs));
                lk_store_f(rr, res->dtype, i * rs, v);
            }
            ss[i % LK_SS_LANES] = fmaf(v, v, ss[i % LK_SS_LANES]);
        }
        float inv = lk_q_inv_rms(lk_ss_reduce(ss), D, a->eps), s = a->scale;
        if (a->group) { /* per block of G columns: scale [r, g], then the block's codes */
            int64_t G = a->group, gst = a->scales.stride[a->scales.ndim - 1];
            for (int64_t g = 0; g < D / G; g++) {
                float m = 0.0f;
                for (int64_t i = g * G; i < g * G + G; i++)
                    m = lk_q_absmax_fold(m, lk_load_f(vr, vt, i * vs) * inv * lk_load_f(w->data, w->dtype, i * ws));
                s = lk_q_scale(m, a->ub, out->dtype);
                ((float *)a->scales.data)[si.off + g * gst] = s;
                float rs = 1.0f / s;
                for (int64_t i = g * G; i < g * G + G; i++) {
                    float y = lk_load_f(vr, vt, i * vs) * inv * lk_load_f(w->data, w->dtype, i * ws);
                    lk_q_quant(orow, out->dtype, i * os, y, s, rs);
                }
            }
            lk_rowit_next(&si);
            continue;
        }
        if (a->mode == LK_Q_TOKEN) {
            float m = 0.0f;
            for (int64_t i = 0; i < D; i++)
                m = lk_q_absmax_fold(m, lk_load_f(vr, vt, i * vs) * inv * lk_load_f(w->data, w->dtype, i * ws));
            s = lk_q_scale(m, a->ub, out->dtype);
            ((float *)a->scales.data)[si.off] = s;
            lk_rowit_next(&si);
        }
        float rs = 1.0f / s; /* i8 out: y * rs (vLLM's int8 form) */
        for (int64_t i = 0; i < D; i++) {
            float y = lk_load_f(vr, vt, i * vs) * inv * lk_load_f(w->data, w->dtype, i * ws);
            lk_q_quant(orow, out->dtype, i * os, y, s, rs);
        }
    }
    return LK_OK;
}
