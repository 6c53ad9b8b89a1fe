/*
 * Scalar formulas of the extra activations (act_ext), shared by the reference
 * (ref/act_ext.c) and the per-lane parts of the SIMD source (simd/act_ext.c) so that
 * both compute them the same way. f32 arithmetic; each returns the activation before
 * the product with the other half and before the one rounding to out's dtype.
 *
 * Sigmoid forms act(g) = g / (1 + exp(x)) (x = -g, -1.702 g, -alpha g or gelu's
 * g (K0 + K1 g^2) = -2u) take their limit at g = -inf: -0 (the literal formula gives
 * -inf / inf); for finite g where exp(x) overflows the quotient is -0 as well.
 * gelu (erf): 0.5 g erfc(-g / sqrt(2)), equal to 0.5 g (1 + erf(g / sqrt(2))) but
 * without the cancellation of 1 + erf for g << 0; gelu(-inf) = -0.
 */
#ifndef LK_ACT_EXT_MATH_H
#define LK_ACT_EXT_MATH_H

#include <math.h>

#define LK_GELU_K0 (-1.59576912160573f) /* -2 sqrt(2/pi) (gelu_new; gelu_fast's 0.7978845608 rounds to the same f32) */
#define LK_GELU_K1 (-0.0713548162726f)  /* -2 sqrt(2/pi) * 0.044715 */
#define LK_SQRT1_2 0.70710678118654752f

static inline float lk_sig_form(float g, float x) {
    if (g == -INFINITY) return -0.0f;
    return g / (1.0f + expf(x));
}
static inline float lk_act_silu(float g) { return lk_sig_form(g, -g); }
static inline float lk_act_gelu_tanh(float g) { return lk_sig_form(g, g * (LK_GELU_K0 + LK_GELU_K1 * (g * g))); }
static inline float lk_act_gelu_quick(float g) { return lk_sig_form(g, -1.702f * g); }
static inline float lk_act_gelu_erf(float g) {
    if (g == -INFINITY) return -0.0f;
    return 0.5f * g * erfcf(-g * LK_SQRT1_2);
}
/* swigluoai: gate clamped from above at limit, up to [-limit, limit] (NaN stays NaN);
 * (u + 1) * g * sigmoid(alpha g) */
static inline float lk_act_swigluoai(float g, float u, float alpha, float limit) {
    g = g > limit ? limit : g;
    u = u > limit ? limit : u < -limit ? -limit : u;
    return (u + 1.0f) * lk_sig_form(g, -alpha * g);
}

#endif
