/*
 * silu_and_mul and gelu_tanh_and_mul, scalar reference.
 *
 *   out[r, i] = act(x[r, i]) * x[r, d + i],   i < d   (the first half is the gate)
 *   silu(g)      = g / (1 + exp(-g))
 *   gelu_tanh(g) = 0.5 g (1 + tanh(u)),  u = sqrt(2/pi) (g + 0.044715 g^3)
 *                = g / (1 + exp(-2u))                 (0.5 (1 + tanh(u)) = sigmoid(2u))
 *
 * The sigmoid form of gelu_tanh has no cancellation anywhere: 1 + tanh(u) computed
 * directly loses all digits for u << 0, and 1 - 2/(exp(2u) + 1) loses them near 0.
 * -2u is evaluated as g * (K0 + K1 g^2) with K0 = -2 sqrt(2/pi), K1 = 0.044715 K0.
 *
 * Special values (the limits, where the literal formula would give inf/inf):
 * act(-inf) = -0, act(+inf) = +inf, act(NaN) = NaN, act(-0) = -0; the product then
 * follows IEEE (act(-inf) * y = -0 * y, NaN for y = +-inf). Arithmetic in f32, one
 * rounding to out's dtype per element. Where exp(-g) resp. exp(-2u) overflows f32
 * (g < -88.7 for silu, g < -10.1 for gelu) act(g) is -0, although the exact value
 * (below 4e-37 in magnitude) would still be a tiny f32; every ISA does the same.
 *
 * Shapes: x [..., 2d], out [..., d], leading dims walked as rows, any strides. No threads.
 */
#include <math.h>

#include "../../core/half.h"
#include "../kernels.h"

#define GELU_K0 (-1.59576912160573f)  /* -2 sqrt(2/pi) */
#define GELU_K1 (-0.0713548162726f)   /* -2 sqrt(2/pi) * 0.044715 */

static float silu(float g) {
    if (g == -INFINITY) return -0.0f;
    return g / (1.0f + expf(-g));
}

static float gelu_tanh(float g) {
    if (g == -INFINITY) return -0.0f;
    return g / (1.0f + expf(g * (GELU_K0 + GELU_K1 * (g * g))));
}

static void act_and_mul(const lk_act_args *a, float (*act)(float)) {
    const lk_tensor *x = &a->x, *out = &a->out;
    int nd = x->ndim;
    int64_t d = out->shape[nd - 1], rows = lk_rows(out, 1);
    int64_t xs = x->stride[nd - 1], os = out->stride[nd - 1];
    lk_rowit xi, oi;
    lk_rowit_init(&xi, x, 1, 0);
    lk_rowit_init(&oi, out, 1, 0);
    for (int64_t r = 0; r < rows; r++, lk_rowit_next(&xi), lk_rowit_next(&oi)) {
        const void *xr = lk_at(x, xi.off); // [2d] stride xs: gate [0, d), up [d, 2d)
        void *orow = lk_at(out, oi.off);   // [d] stride os
        for (int64_t i = 0; i < d; i++) {
            float g = lk_load_f(xr, x->dtype, i * xs);
            float y = lk_load_f(xr, x->dtype, (d + i) * xs);
            lk_store_f(orow, out->dtype, i * os, act(g) * y);
        }
    }
}

lk_status lk_ref_silu_and_mul(const lk_act_args *a) {
    act_and_mul(a, silu);
    return LK_OK;
}

lk_status lk_ref_gelu_tanh_and_mul(const lk_act_args *a) {
    act_and_mul(a, gelu_tanh);
    return LK_OK;
}
