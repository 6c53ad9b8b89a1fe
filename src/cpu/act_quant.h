/*
 * The scalar pieces of silu_and_mul_quant / silu_and_mul_per_block_quant shared by the
 * reference (src/cpu/ref/act_quant.c) and the SIMD source (src/cpu/simd/act_quant.c), so
 * that every ISA computes the same bits:
 *   lk_aq_silu(g)            silu(g) = g / (1 + exp(-g)) exactly as the SIMD kernels'
 *                            act_core computes it (src/cpu/simd/act_core.h, precise path),
 *                            one lane: the same f32 operations in the same order (fmaf for
 *                            each fma, min / max returning the second operand when either
 *                            is NaN, as MINPS / MAXPS and the NEON forms): relative error < 2^-22 from
 *                            exact; silu(-inf) = -0, silu(+inf) = +inf, NaN stays NaN
 *   lk_aq_y(g, u)            y = silu(g) * u (one f32 product)
 *   lk_aq_block_scale(m, ub, dt)  max(min(m / qmax, ub), min_scale) (vLLM's silu block
 *                            scale: scale_ub bounds the scale, not the absmax)
 *   lk_aq_code(p, dt, i, y, s)  element i = fp8(y / s) or i8(y / s) (one f32 division,
 *                            then the fp8.h converter or lk_q_i8)
 */
#ifndef LK_ACT_QUANT_H
#define LK_ACT_QUANT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "fp8_quant.h"

static inline float lk_aq_max(float a, float b) { return a > b ? a : b; }
static inline float lk_aq_min(float a, float b) { return a < b ? a : b; }

/* act_core(g, silu, precise) lane by lane: constants and operation order as there (s =
 * -1: silu works on v = -x = min(g, G_MAX)) */
static inline float lk_aq_silu(float g) {
    const float shifter = 12582912.0f + 126.0f, s = -1.0f, log2e = 1.44269504088896341f;
    g = lk_aq_max(-88.75f, g); /* SILU_G_MIN */
    float v = lk_aq_min(g, 87.3f); /* SILU_G_MAX */
    float t = fmaf(v, s * log2e, shifter);
    float n = t - shifter;
    float r = fmaf(n, -s * 0.693359375f, v);
    r = fmaf(n, -s * -2.12194440e-4f, r);
    float q = s * 2 * 1.9875691500e-4f;
    q = fmaf(q, r, 2 * 1.3981999507e-3f);
    q = fmaf(q, r, s * 2 * 8.3334519073e-3f);
    q = fmaf(q, r, 2 * 4.1665795894e-2f);
    q = fmaf(q, r, s * 2 * 1.6666665459e-1f);
    q = fmaf(q, r, 2 * 5.0000001201e-1f);
    float p = fmaf(q, r * r, fmaf(r, s * 2.0f, 2.0f));
    uint32_t u;
    memcpy(&u, &t, 4);
    u <<= 23; /* 2^(n - 1) from t's low mantissa bits */
    float sc;
    memcpy(&sc, &u, 4);
    return g / fmaf(p, sc, 1.0f);
}

static inline float lk_aq_y(float g, float u) { return lk_aq_silu(g) * u; }

static inline float lk_aq_block_scale(float absmax, float ub, lk_dtype dt) {
    float s = absmax / lk_q_max(dt), lo = dt == LK_I8 ? FLT_EPSILON : 1.0f / (lk_q_max(dt) * 512.0f);
    s = s < ub ? s : ub; /* absmax is never NaN; ub is +inf without one */
    return s > lo ? s : lo;
}

static inline void lk_aq_code(void *p, lk_dtype dt, int64_t i, float y, float s) {
    if (dt == LK_I8) ((int8_t *)p)[i] = lk_q_i8(y / s);
    else lk_q_store(p, dt, i, y / s);
}

#endif
