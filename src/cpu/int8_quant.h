/*
 * The scalar pieces of the int8 activation quantizers (vLLM's static_scaled_int8_quant /
 * dynamic_scaled_int8_quant) shared by the reference kernel (src/cpu/ref/int8_quant.c)
 * and the SIMD source (src/cpu/simd/int8_quant.c), so that every ISA computes the same
 * bits:
 *   lk_i8q_row               a row's parameters: v = x / f (div) or x * f, zero point azp
 *   lk_i8q_code(v, azp)      sat8(sat32(rn(v)) + azp): NaN v -> 0, rn ties to even (rintf
 *                            in the default rounding mode, which the library never
 *                            changes), the sum exact in 64 bits
 *   lk_i8q_bounds(azp, ..)   the range [lo, hi] of int32 t with t + azp in [-128, 127]:
 *                            sat8(t + azp) = clamp(t, lo, hi) + azp (the SIMD form)
 *   lk_i8q_sym(absmax, ..)   dynamic symmetric: scale = absmax / 127,
 *                            f = absmax == 0 ? 0 : 127 / absmax (vLLM's)
 *   lk_i8q_asym(mn, mx, ..)  dynamic asymmetric: s = (mx - mn) / 255,
 *                            azp = sat32(rn(-128 - mn / s)) (NaN -> 0), f = 1 / s; a row
 *                            without a non-NaN value (mn > mx) counts as all-zero, and
 *                            s == 0 gives scale +0, azp 0, f 0 (codes 0)
 *   lk_i8q_minmax_fold       min / max steps ignoring NaN (vLLM's fminf / fmaxf)
 * The f32 operations are the ones vLLM's CUDA kernels perform (see include/llmkern.h).
 */
#ifndef LK_INT8_QUANT_H
#define LK_INT8_QUANT_H

#include <math.h>
#include <stdint.h>

#include "kernels.h"

typedef struct {
    float f;     /* the divisor (div) or the factor */
    int div;     /* 1: v = x / f (static symmetric, vLLM's division); 0: v = x * f */
    int32_t azp; /* 0 when symmetric */
} lk_i8q_row;

/* sat32(rn(v)): NaN -> 0, saturated to int32 (CUDA's cvt.rni.sat.s32.f32) */
static inline int64_t lk_i8q_sat32(float v) {
    if (!(v == v)) return 0;
    if (v >= 2147483648.0f) return INT32_MAX;
    if (v <= -2147483648.0f) return INT32_MIN;
    return (int64_t)rintf(v); /* |v| < 2^31: rintf(v) is an int32 value */
}

static inline int8_t lk_i8q_code(float v, int32_t azp) {
    int64_t t = lk_i8q_sat32(v) + azp;
    return (int8_t)(t > 127 ? 127 : t < -128 ? -128 : t);
}

static inline void lk_i8q_bounds(int32_t azp, int32_t *lo, int32_t *hi) {
    int64_t l = -128 - (int64_t)azp, h = 127 - (int64_t)azp;
    *lo = (int32_t)(l < INT32_MIN ? INT32_MIN : l);
    *hi = (int32_t)(h > INT32_MAX ? INT32_MAX : h);
}

static inline void lk_i8q_sym(float absmax, float *scale, lk_i8q_row *p) {
    *scale = absmax / 127.0f;
    p->f = absmax == 0.0f ? 0.0f : 127.0f / absmax;
    p->div = 0;
    p->azp = 0;
}

static inline void lk_i8q_asym(float mn, float mx, float *scale, lk_i8q_row *p) {
    if (mn > mx) mn = mx = 0.0f; /* no non-NaN value */
    float s = (mx - mn) / 255.0f;
    p->div = 0;
    if (s == 0.0f) { /* +0 whatever the zeros' signs (the folds' order may pick -0) */
        *scale = 0.0f, p->f = 0.0f, p->azp = 0;
        return;
    }
    *scale = s;
    p->azp = (int32_t)lk_i8q_sat32(-128.0f - mn / s);
    p->f = 1.0f / s;
}

/* min / max steps: a NaN v is ignored (the comparisons are false) */
static inline void lk_i8q_minmax_fold(float *mn, float *mx, float v) {
    if (v < *mn) *mn = v;
    if (v > *mx) *mx = v;
}

#endif
