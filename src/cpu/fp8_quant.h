/*
 * The scalar pieces of the fp8 activation ops shared by the reference kernels and the
 * SIMD sources, so that every ISA computes the same bits:
 *   lk_q_store(p, dt, i, v)   element i of an fp8 row = fp8(v) (the src/core/fp8.h
 *                             converter)
 *   lk_q_max(dt)              fp8_max: 448 (e4m3fn), 57344 (e5m2)
 *   lk_q_scale(absmax, ub, dt) the dynamic scale max(min(absmax, ub) / fp8_max, min_scale),
 *                             min_scale = 1 / (fp8_max * 512) (vLLM's)
 *   lk_ss_reduce(s)           the fixed-order sum of the LK_SS_LANES partial sums of
 *                             squares (element i in lane i % 16, each lane an FMA chain in
 *                             element order): pairwise halving 8, 4, 2, 1
 *   lk_q_absmax_fold(m, v)    absmax step ignoring NaN (vLLM's fmaxf)
 *   lk_q_group_scale(absmax, eps, ue8m0, dt)  per-token-group scale max(absmax, eps) /
 *                             fp8_max, with ue8m0 the smallest power of two >= max(it, 1e-10)
 * and the int8 output of rms_norm_dynamic_per_token_quant (LK_I8, vLLM's int8 rules):
 *   lk_q_max(LK_I8) = 127, lk_q_scale's min_scale = FLT_EPSILON for LK_I8,
 *   lk_q_i8(v)                round to nearest even, saturate to [-128, 127], NaN -> 0
 *   lk_q_quant(p, dt, i, y, s, rs) element i = fp8(y / s), or i8(y * rs) with rs = 1 / s
 *                             (vLLM multiplies int8 values by the reciprocal)
 * and the int8 output of per_token_group_fp8_quant (vLLM's per_token_group_quant_int8):
 *   lk_q_i8_trunc(v)          clamped to [-128, 127], then toward zero (vLLM's int8_t(q)
 *                             cast of the clamped value); NaN -> 0
 */
#ifndef LK_FP8_QUANT_H
#define LK_FP8_QUANT_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../core/fp8.h"
#include "kernels.h"

#define LK_SS_LANES 16

static inline void lk_q_store(void *p, lk_dtype dt, int64_t i, float v) {
    ((uint8_t *)p)[i] = dt == LK_F8E4M3 ? lk_f32_to_f8e4m3(v) : lk_f32_to_f8e5m2(v);
}

static inline float lk_q_max(lk_dtype dt) { return dt == LK_F8E4M3 ? 448.0f : dt == LK_I8 ? 127.0f : 57344.0f; }

static inline float lk_q_scale(float absmax, float ub, lk_dtype dt) {
    float m = absmax < ub ? absmax : ub; /* absmax is never NaN; ub is +inf without one */
    float s = m / lk_q_max(dt), lo = dt == LK_I8 ? FLT_EPSILON : 1.0f / (lk_q_max(dt) * 512.0f);
    return s > lo ? s : lo;
}

/* f32 -> int8: nearest, ties to even (rintf in the default rounding mode, which the
 * library never changes), saturated; NaN -> 0 (CUDA's cvt.rni.sat.s8.f32) */
static inline int8_t lk_q_i8(float v) {
    if (!(v == v)) return 0;
    if (v >= 127.0f) return 127;
    if (v <= -128.0f) return -128;
    return (int8_t)rintf(v);
}

static inline int8_t lk_q_i8_trunc(float v) {
    if (!(v == v)) return 0;
    if (v >= 127.0f) return 127;
    if (v <= -128.0f) return -128;
    return (int8_t)v; /* |v| < 128: the conversion truncates */
}

static inline void lk_q_quant(void *p, lk_dtype dt, int64_t i, float y, float s, float rs) {
    if (dt == LK_I8) ((int8_t *)p)[i] = lk_q_i8(y * rs);
    else lk_q_store(p, dt, i, y / s);
}

static inline float lk_q_absmax_fold(float m, float v) {
    float a = fabsf(v);
    return a > m ? a : m; /* false for NaN: ignored */
}

/* the smallest power of two >= s, for a normal s > 0 or +inf (a power of two: mantissa
 * bits 0; else the next exponent, 2^128 = +inf past the largest binade) */
static inline float lk_q_pow2_ceil(float s) {
    uint32_t u;
    memcpy(&u, &s, 4);
    if (u & 0x7fffffu) u = (u & 0x7f800000u) + 0x00800000u;
    memcpy(&s, &u, 4);
    return s;
}

static inline float lk_q_group_scale(float absmax, float eps, int ue8m0, lk_dtype dt) {
    float s = (absmax > eps ? absmax : eps) / lk_q_max(dt);
    return ue8m0 ? lk_q_pow2_ceil(s > 1e-10f ? s : 1e-10f) : s;
}

static inline float lk_ss_reduce(float *s) {
    for (int w = LK_SS_LANES / 2; w >= 1; w /= 2)
        for (int k = 0; k < w; k++) s[k] = s[k] + s[k + w];
    return s[0];
}

/* 1 / sqrt(ss / D + eps): the row's inverse RMS from the reduced sum of squares */
static inline float lk_q_inv_rms(float ss, int64_t D, float eps) { return 1.0f / sqrtf(ss / (float)D + eps); }

/* ---- validation shared by the front-ends (src/ops/fp8_quant.c) ---- */

/* out: fp8 dtype (or LK_I8 when i8), 1..LK_MAX_DIMS dims, no self overlap */
lk_status lk_q_check_out(const lk_tensor *out, const char *name);
lk_status lk_q_check_out_i8(const lk_tensor *out, const char *name, int i8);
/* an input scale: f32, one element ([1] or []), finite and > 0; its value to *v */
lk_status lk_q_scale_in(const lk_tensor *t, const char *name, float *v);
/* a written per-tensor scale: f32, one element */
lk_status lk_q_scale_out(const lk_tensor *t, const char *name);
/* written per-row scales of x [..., D]: [rows], [rows, 1] or [..., 1] (x's leading dims),
 * f32, no self overlap; *view = the [..., 1] form (the one the kernels walk) */
lk_status lk_q_scales_out(const lk_tensor *t, const char *name, const lk_tensor *x, lk_tensor *view);
/* the same for written per-row values of dtype dt (f32 scales, i32 zero points) */
lk_status lk_q_rows_out(const lk_tensor *t, const char *name, const lk_tensor *x, lk_tensor *view, lk_dtype dt);
/* written per-(row, group) scales "scales" of x [..., D]: f32 [..., ng] (x's leading dims)
 * or [rows, ng], any strides, no self overlap; *view = the [..., ng] form */
lk_status lk_q_groups_out(const lk_tensor *t, const lk_tensor *x, int64_t ng, lk_tensor *view);
/* every per-row scale of view (the [..., 1] form) = v: rows of D == 0, no kernel call */
lk_status lk_q_fill_scales(const lk_tensor *view, float v);

#endif
