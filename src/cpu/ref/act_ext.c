/*
 * The extra activations (vLLM's names), scalar reference. d = out's last dim.
 *
 *   gelu_and_mul       out[i] = gelu(x[i]) * x[d + i]       gelu(g) = 0.5 g erfc(-g / sqrt 2)
 *   mul_and_silu       out[i] = x[i] * silu(x[d + i])       (the gate is the second half)
 *   fatrelu_and_mul    out[i] = (x[i] > threshold ? x[i] : 0) * x[d + i]
 *   swigluoai_and_mul  g = min(x[2i], limit), u = clamp(x[2i + 1], -limit, limit),
 *                      out[i] = (u + 1) * g * sigmoid(alpha g)     (interleaved halves)
 *   gelu_new, gelu_fast out[i] = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
 *                      = x / (1 + exp(-2u)) (one formula: their constants agree in f32)
 *   gelu_quick         out[i] = x * sigmoid(1.702 x) = x / (1 + exp(-1.702 x))
 *
 * Formulas and special values in act_ext_math.h. f32 arithmetic, one rounding to out's
 * dtype per element. Shapes: gated forms x [..., 2d], out [..., d]; element-wise forms
 * x, out [..., d]; leading dims walked as rows, any strides. No threads.
 */
#include "../../core/half.h"
#include "../act_ext_math.h"
#include "../kernels.h"

/* the value of output element i of a row (xr: x's row, xs its last-dim stride) */
static float ext_value(const lk_act_ext_args *a, const void *xr, int64_t xs, int64_t d, int64_t i) {
    lk_dtype dt = a->x.dtype;
    switch (a->kind) {
    case LK_ACT_GELU_ERF_MUL:
        return lk_act_gelu_erf(lk_load_f(xr, dt, i * xs)) * lk_load_f(xr, dt, (d + i) * xs);
    case LK_ACT_MUL_SILU:
        return lk_load_f(xr, dt, i * xs) * lk_act_silu(lk_load_f(xr, dt, (d + i) * xs));
    case LK_ACT_FATRELU_MUL: {
        float g = lk_load_f(xr, dt, i * xs);
        return (g > a->p0 ? g : 0.0f) * lk_load_f(xr, dt, (d + i) * xs);
    }
    case LK_ACT_SWIGLUOAI_MUL:
        return lk_act_swigluoai(lk_load_f(xr, dt, 2 * i * xs), lk_load_f(xr, dt, (2 * i + 1) * xs), a->p0, a->p1);
    case LK_ACT_GELU_NEW: return lk_act_gelu_tanh(lk_load_f(xr, dt, i * xs));
    default: return lk_act_gelu_quick(lk_load_f(xr, dt, i * xs)); /* LK_ACT_GELU_QUICK */
    }
}

lk_status lk_ref_act_ext(const lk_act_ext_args *a) {
    const lk_tensor *x = &a->x, *out = &a->out;
    int nd = x->ndim;
    int64_t d = out->shape[nd - 1], rows = lk_rows(out, 1);
    int64_t xs = x->stride[nd - 1], os = out->stride[nd - 1];
    lk_rowit xi, oi;
    lk_rowit_init(&xi, x, 1, 0);
    lk_rowit_init(&oi, out, 1, 0);
    for (int64_t r = 0; r < rows; r++, lk_rowit_next(&xi), lk_rowit_next(&oi)) {
        const void *xr = lk_at(x, xi.off); // [2d] or [d] stride xs
        void *orow = lk_at(out, oi.off);   // [d] stride os
        for (int64_t i = 0; i < d; i++) lk_store_f(orow, out->dtype, i * os, ext_value(a, xr, xs, d, i));
    }
    return LK_OK;
}
