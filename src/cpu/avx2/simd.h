/*
 * AVX2 helpers: load 8 values of any float dtype as f32, store 8 f32 rounded once to
 * the destination dtype (bit-identical to src/core/half.h), partial (tail) versions,
 * and the vectorised maths shared by the AVX2 kernels.
 * Only included by files compiled with -mavx2 -mfma -mf16c.
 */
#ifndef LK_AVX2_SIMD_H
#define LK_AVX2_SIMD_H

#include <immintrin.h>
#include <string.h>

#include "../../core/half.h"

static inline __m256 lk8_load(const void *p, lk_dtype dt) {
    if (dt == LK_F32) return _mm256_loadu_ps((const float *)p);
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (dt == LK_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* f32 -> bf16 round-to-nearest-even without the NaN rule: 8 results in the low 16 bits
 * of each 32-bit lane. Exact for every non-NaN value and for NaNs whose low 16 bits are 0
 * (a bf16 input's NaN, the default NaN of inf * 0 or inf - inf); other NaN payloads can
 * carry into the exponent or sign, so callers use it only where no such NaN can arise. */
static inline __m256i lk8_bf16_bits_nonan(__m256 v) {
    __m256i u = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    return _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
}

/* 16 bf16 values (one 32-byte load) as f32 in even / odd order, without shuffles: the
 * even elements are the low halves of the 32-bit lanes (shifted up), the odd ones the
 * high halves (masked) */
static inline void lk16_bf16_split(__m256i v, __m256 *even, __m256 *odd) {
    *even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    *odd = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u)));
}

/* lk16_bf16_split's inverse: even / odd f32 values rounded as lk8_bf16_bits_nonan (same
 * NaN condition) and put back in element order (even ones shifted down, blended with
 * the odd ones' high halves) */
static inline __m256i lk16_bf16_join_nonan(__m256 even, __m256 odd) {
    __m256i o = _mm256_castps_si256(odd);
    o = _mm256_add_epi32(_mm256_add_epi32(o, _mm256_set1_epi32(0x7fff)),
                         _mm256_and_si256(_mm256_srli_epi32(o, 16), _mm256_set1_epi32(1)));
    return _mm256_blend_epi16(lk8_bf16_bits_nonan(even), o, 0xaa);
}

/* f32 -> bf16 round-to-nearest-even, NaN quieted: 8 results in the low 16 bits of
 * each 32-bit lane */
static inline __m256i lk8_bf16_bits(__m256 v) {
    __m256i u = _mm256_castps_si256(v);
    __m256i r = lk8_bf16_bits_nonan(v);
    __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    __m256 isnan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(nan), isnan));
}

static inline __m128i lk8_to_half(__m256 v, lk_dtype dt) {
    if (dt == LK_F16) return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256i b = lk8_bf16_bits(v);
    return _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
}

static inline void lk8_store(void *p, lk_dtype dt, __m256 v) {
    if (dt == LK_F32) _mm256_storeu_ps((float *)p, v);
    else _mm_storeu_si128((__m128i *)p, lk8_to_half(v, dt));
}

/* non-temporal store of 8 values; p must be 32-byte (f32) / 16-byte (f16, bf16)
 * aligned; the caller issues _mm_sfence() before its results are read */
static inline void lk8_stream(void *p, lk_dtype dt, __m256 v) {
    if (dt == LK_F32) _mm256_stream_ps((float *)p, v);
    else _mm_stream_si128((__m128i *)p, lk8_to_half(v, dt));
}

/* first n (0 <= n < 8) elements; the rest of the vector is 0 */
static inline __m256 lk8_load_part(const void *p, lk_dtype dt, int n) {
    float buf[8] = {0};
    if (dt == LK_F32) {
        memcpy(buf, p, (size_t)n * 4);
        return _mm256_loadu_ps(buf);
    }
    uint16_t h[8] = {0};
    memcpy(h, p, (size_t)n * 2);
    return lk8_load(h, dt);
}

static inline void lk8_store_part(void *p, lk_dtype dt, __m256 v, int n) {
    if (dt == LK_F32) {
        float buf[8];
        _mm256_storeu_ps(buf, v);
        memcpy(p, buf, (size_t)n * 4);
        return;
    }
    uint16_t h[8];
    _mm_storeu_si128((__m128i *)h, lk8_to_half(v, dt));
    memcpy(p, h, (size_t)n * 2);
}

static inline float lk8_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float lk8_hmax(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* exp building blocks shared by the variants below: x = n ln2 + r with |r| <= ln2/2,
 * e^r by a degree-7 polynomial (~2 ulp), then 2^n applied in two halves so n = 128
 * (x up to ln(FLT_MAX)) and n down to -150 stay in the exponent range. */
static inline __m256 lk8_exp_poly(__m256 xc, __m256 *n_out) {
    __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    *n_out = n;
    return _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
}

static inline __m256 lk8_scale_pow2(__m256 p, __m256 n) {
    __m256i ni = _mm256_cvtps_epi32(n);
    __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, _mm256_set1_epi32(127)), 23));
    __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, _mm256_set1_epi32(127)), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

/* exp(x), relative error ~2 ulp over the f32 range; exp(-inf) = 0, exp(+inf) = inf,
 * NaN propagates; x < -87.3 flushes to 0 (the f32 subnormal range is not produced). */
static inline __m256 lk8_exp(__m256 x) {
    const __m256 hi = _mm256_set1_ps(88.72283935546875f), lo = _mm256_set1_ps(-87.3365447504f);
    __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    __m256 over = _mm256_cmp_ps(x, hi, _CMP_GT_OQ);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    __m256 n, p = lk8_exp_poly(_mm256_min_ps(_mm256_max_ps(x, lo), hi), &n);
    p = lk8_scale_pow2(p, n);
    p = _mm256_blendv_ps(p, _mm256_set1_ps(__builtin_inff()), over);
    p = _mm256_andnot_ps(under, p);
    return _mm256_blendv_ps(p, x, nan);
}

/* exp(x) with lk8_exp's polynomial and accuracy but no special-case masks: x is
 * clamped to [-150, 100] and the two-step 2^n scaling then saturates by itself, to
 * +inf for x > 88.72 and through the subnormals to 0 below -87.3 (gradual underflow,
 * where lk8_exp flushes). A NaN x gives 0, not NaN: only for callers whose NaN inputs
 * propagate through another operand (sigmoid-style g / (1 + exp(-g))). ~6 instructions
 * cheaper than lk8_exp, which matters in kernels that are compute-bound on bf16. */
static inline __m256 lk8_exp_nonan(__m256 x) {
    __m256 n, p = lk8_exp_poly(_mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-150.0f)), _mm256_set1_ps(100.0f)), &n);
    return lk8_scale_pow2(p, n);
}

/* exp(x) for x <= 0 (including -inf; no NaN, no +inf), as after a softmax's max
 * subtraction: bit-identical to lk8_exp on that domain with about 2/3 of its work
 * (no overflow or NaN handling, one 2^n scaling since n >= -126). x < -87.3 gives 0. */
static inline __m256 lk8_exp_nonpos(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.3365447504f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    __m256 n, p = lk8_exp_poly(_mm256_max_ps(x, lo), &n);
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

/* 16 bf16 values as two f32 vectors in the in-lane unpack order: *lo holds elements
 * 0-3 and 8-11, *hi holds 4-7 and 12-15. One instruction per 8 values and no
 * cross-lane shuffle, for elementwise kernels; lk8x2_store_bf16 (same rounding as
 * lk8_store) writes such a pair back in memory order. */
static inline void lk8x2_load_bf16(const void *p, __m256 *lo, __m256 *hi) {
    __m256i v = _mm256_loadu_si256((const __m256i *)p), z = _mm256_setzero_si256();
    *lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, v));
    *hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, v));
}

static inline void lk8x2_store_bf16(void *p, __m256 lo, __m256 hi) {
    _mm256_storeu_si256((__m256i *)p, _mm256_packus_epi32(lk8_bf16_bits(lo), lk8_bf16_bits(hi)));
}

#endif
