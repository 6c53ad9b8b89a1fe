/*
 * Exact scalar f16 / bf16 <-> f32 conversion, and typed scalar load/store.
 *
 * f32 -> f16 and f32 -> bf16 round to nearest, ties to even, with subnormals,
 * overflow to inf, and NaN kept quiet with its sign and top mantissa bits:
 *   f16 NaN  = sign | 0x7e00 | (mantissa >> 13)    (what VCVTPS2PH produces)
 *   bf16 NaN = (bits >> 16) | 0x0040
 * The SIMD paths produce the same bits (tests check all 2^32 patterns against
 * the hardware converter where present).
 */
#ifndef LK_HALF_H
#define LK_HALF_H

#include <stdint.h>
#include <string.h>

#include "fp8.h"
#include "llmkern.h"

static inline uint32_t lk_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float lk_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float lk_bf16_to_f32(uint16_t h) { return lk_bits_f32((uint32_t)h << 16); }

static inline uint16_t lk_f32_to_bf16(float f) {
    uint32_t u = lk_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float lk_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) /* inf, or NaN made quiet as VCVTPH2PS does */
        return lk_bits_f32(sign | 0x7f800000u | ((man ? man | 0x200u : 0u) << 13));
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24 is exact in f32 */
        float v = (float)man * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return lk_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

static inline uint16_t lk_f32_to_f16(float f) {
    uint32_t u = lk_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: inf */
    if (a >= 0x38800000u) {                                 /* normal f16 range */
        uint32_t r = a - 0x38000000u;                       /* rebias exponent 127 -> 15 */
        r += 0xfffu + ((r >> 13) & 1u);
        return (uint16_t)(sign | (r >> 13));
    }
    if (a < 0x33000000u) return sign; /* below half the smallest subnormal: 0 */
    /* subnormal: value = m * 2^(e-150) with implicit bit; result = round(value * 2^24) */
    {
        uint32_t e = a >> 23;
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e; /* 14 .. 24 */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
}

/* Typed scalar access for reference code: element i of a buffer of dtype dt. */
static inline float lk_load_f(const void *p, lk_dtype dt, int64_t i) {
    switch (dt) {
    case LK_F32: return ((const float *)p)[i];
    case LK_F16: return lk_f16_to_f32(((const uint16_t *)p)[i]);
    case LK_BF16: return lk_bf16_to_f32(((const uint16_t *)p)[i]);
    case LK_F8E4M3: return lk_f8e4m3_to_f32(((const uint8_t *)p)[i]);
    case LK_F8E5M2: return lk_f8e5m2_to_f32(((const uint8_t *)p)[i]);
    default: return 0.0f;
    }
}

static inline void lk_store_f(void *p, lk_dtype dt, int64_t i, float v) {
    switch (dt) {
    case LK_F32: ((float *)p)[i] = v; break;
    case LK_F16: ((uint16_t *)p)[i] = lk_f32_to_f16(v); break;
    case LK_BF16: ((uint16_t *)p)[i] = lk_f32_to_bf16(v); break;
    case LK_F8E4M3: ((uint8_t *)p)[i] = lk_f32_to_f8e4m3(v); break;
    case LK_F8E5M2: ((uint8_t *)p)[i] = lk_f32_to_f8e5m2(v); break;
    default: break;
    }
}

/* Round v to dtype dt and back (what a store followed by a load gives). */
static inline float lk_round_to(lk_dtype dt, float v) {
    switch (dt) {
    case LK_F16: return lk_f16_to_f32(lk_f32_to_f16(v));
    case LK_BF16: return lk_bf16_to_f32(lk_f32_to_bf16(v));
    case LK_F8E4M3: return lk_f8e4m3_to_f32(lk_f32_to_f8e4m3(v));
    case LK_F8E5M2: return lk_f8e5m2_to_f32(lk_f32_to_f8e5m2(v));
    default: return v;
    }
}

static inline int64_t lk_load_index(const void *p, lk_dtype dt, int64_t i) {
    return dt == LK_I64 ? ((const int64_t *)p)[i] : (int64_t)((const int32_t *)p)[i];
}

#endif
