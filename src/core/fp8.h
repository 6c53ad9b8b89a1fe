/*
 * Exact scalar fp8 <-> f32 conversion: the reference every fp8 path is checked against.
 *
 *   format   bits (S.E.M)  bias  max finite            smallest subnormal  inf   NaN
 *   e4m3fn   1.4.3         7     448   = 0x7e (1.75*2^8)  2^-9 = 0x01        none  S.1111.111
 *   e5m2     1.5.2         15    57344 = 0x7b (1.75*2^15) 2^-16 = 0x01       S.11111.00  S.11111.xx
 *
 * f32 -> fp8: round to nearest, ties to even (subnormals included), then saturate: a
 * finite value whose rounding lies beyond the max, and +-inf, give +-max (vLLM's and
 * FlashInfer's convention, the CUDA __NV_SATFINITE one). NaN gives S.1111.111 (e4m3fn)
 * or S.11111.11 (e5m2), the sign kept. -0 gives 0x80.
 * fp8 -> f32 is exact (every fp8 value is an f32 value); e5m2 inf stays inf, NaN codes
 * give a quiet f32 NaN with the sign.
 */
#ifndef LK_FP8_H
#define LK_FP8_H

#include <stdint.h>
#include <string.h>

static inline uint32_t lk_fp8_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float lk_fp8_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* f32 -> fp8 with E exponent bits, M mantissa bits, bias B, largest finite code maxc
 * (magnitude) and NaN code nanc (magnitude). */
static inline uint8_t lk_f32_to_fp8_fmt(float f, int M, int B, uint32_t maxc, uint32_t nanc) {
    uint32_t u = lk_fp8_f32_bits(f);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint8_t)(sign | nanc);
    if (a == 0x7f800000u) return (uint8_t)(sign | maxc);
    uint32_t e = a >> 23;
    if (e >= (uint32_t)(128 - B)) { /* normal in fp8 (or beyond: saturated below) */
        uint32_t sh = (uint32_t)(23 - M);
        uint32_t r = a - ((uint32_t)(127 - B) << 23); /* rebias exponent 127 -> B */
        r += (1u << (sh - 1u)) - 1u + ((r >> sh) & 1u);
        r >>= sh;
        return (uint8_t)(sign | (r > maxc ? maxc : r));
    }
    /* subnormal in fp8: result = round(value / 2^(1 - B - M)), value = m * 2^(e - 150) */
    uint32_t sh = (uint32_t)(151 - B - M) - e; /* >= 24 - M */
    if (e == 0 || sh > 24u) return sign; /* below half the smallest subnormal (or f32 subnormal) */
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    uint32_t q = m >> sh, rem = m & ((1u << sh) - 1u), half = 1u << (sh - 1u);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint8_t)(sign | q); /* q = 2^M is the smallest normal code: still right */
}

static inline uint8_t lk_f32_to_f8e4m3(float f) { return lk_f32_to_fp8_fmt(f, 3, 7, 0x7eu, 0x7fu); }
static inline uint8_t lk_f32_to_f8e5m2(float f) { return lk_f32_to_fp8_fmt(f, 2, 15, 0x7bu, 0x7fu); }

static inline float lk_f8e4m3_to_f32(uint8_t c) {
    uint32_t sign = (uint32_t)(c & 0x80u) << 24;
    uint32_t exp = (c >> 3) & 0xfu, man = c & 0x7u;
    if (exp == 0xf && man == 0x7) return lk_fp8_bits_f32(sign | 0x7fc00000u);
    if (exp == 0) { /* zero or subnormal: man * 2^-9, exact */
        float v = (float)man * 0.001953125f;
        return sign ? -v : v;
    }
    return lk_fp8_bits_f32(sign | ((exp + 120u) << 23) | (man << 20));
}

static inline float lk_f8e5m2_to_f32(uint8_t c) {
    uint32_t sign = (uint32_t)(c & 0x80u) << 24;
    uint32_t exp = (c >> 2) & 0x1fu, man = c & 0x3u;
    if (exp == 0x1f) return lk_fp8_bits_f32(sign | 0x7f800000u | (man ? 0x400000u | (man << 21) : 0u));
    if (exp == 0) { /* zero or subnormal: man * 2^-16, exact */
        float v = (float)man * 1.52587890625e-5f;
        return sign ? -v : v;
    }
    return lk_fp8_bits_f32(sign | ((exp + 112u) << 23) | (man << 21));
}

#endif
