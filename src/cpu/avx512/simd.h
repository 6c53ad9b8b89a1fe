/*
 * AVX-512 helpers (F/BW/DQ/VL): 16-wide typed load/store with masks for tails,
 * bit-identical rounding to src/core/half.h, and vectorised maths.
 * bf16 stores use the integer round-to-nearest-even rather than VCVTNEPS2BF16, which
 * flushes subnormal inputs to zero and would differ from the reference bits.
 * Only included by files compiled with -mavx512f -mavx512bw -mavx512dq -mavx512vl.
 */
#ifndef LK_AVX512_SIMD_H
#define LK_AVX512_SIMD_H

#include <immintrin.h>

#include "../../core/half.h"

static inline __mmask16 lk16_mask(int64_t n) {
    return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u);
}

/* load min(n, 16) elements (n >= 16: full vector); lanes past n are 0 */
static inline __m512 lk16_load(const void *p, lk_dtype dt, int64_t n) {
    __mmask16 m = lk16_mask(n);
    if (dt == LK_F32) return _mm512_maskz_loadu_ps(m, p);
    __m256i h = _mm256_maskz_loadu_epi16(m, p);
    if (dt == LK_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* bf16 bits of v rounded to nearest even, NaN quieted, in the low half of each lane */
static inline __m512i lk16_bf16_bits(__m512 v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    __m512i nan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), r, nan);
}

static inline __m256i lk16_to_half(__m512 v, lk_dtype dt) {
    if (dt == LK_F16) return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm512_cvtepi32_epi16(lk16_bf16_bits(v));
}

/* store min(n, 16) elements */
static inline void lk16_store(void *p, lk_dtype dt, __m512 v, int64_t n) {
    __mmask16 m = lk16_mask(n);
    if (dt == LK_F32) _mm512_mask_storeu_ps(p, m, v);
    else _mm256_mask_storeu_epi16(p, m, lk16_to_half(v, dt));
}

/* non-temporal store of 16 values; p must be 64-byte (f32) / 32-byte (f16, bf16)
 * aligned; the caller issues _mm_sfence() before its results are read */
static inline void lk16_stream(void *p, lk_dtype dt, __m512 v) {
    if (dt == LK_F32) _mm512_stream_ps((float *)p, v);
    else _mm256_stream_si256((__m256i *)p, lk16_to_half(v, dt));
}

/* exp building blocks shared by the variants below (see avx2/simd.h) */
static inline __m512 lk16_exp_poly(__m512 xc, __m512 *n_out) {
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    *n_out = n;
    return _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
}

static inline __m512 lk16_scale_pow2(__m512 p, __m512 n) {
    __m512i ni = _mm512_cvtps_epi32(n);
    __m512i n1 = _mm512_srai_epi32(ni, 1), n2 = _mm512_sub_epi32(ni, n1);
    __m512 s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n1, _mm512_set1_epi32(127)), 23));
    __m512 s2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n2, _mm512_set1_epi32(127)), 23));
    return _mm512_mul_ps(_mm512_mul_ps(p, s1), s2);
}

/* exp(x): same algorithm and limits as lk8_exp in avx2/simd.h */
static inline __m512 lk16_exp(__m512 x) {
    const __m512 hi = _mm512_set1_ps(88.72283935546875f), lo = _mm512_set1_ps(-87.3365447504f);
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    __mmask16 over = _mm512_cmp_ps_mask(x, hi, _CMP_GT_OQ);
    __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    __m512 n, p = lk16_exp_poly(_mm512_min_ps(_mm512_max_ps(x, lo), hi), &n);
    p = lk16_scale_pow2(p, n);
    p = _mm512_mask_blend_ps(over, p, _mm512_set1_ps(__builtin_inff()));
    p = _mm512_maskz_mov_ps((__mmask16)~under, p);
    return _mm512_mask_blend_ps(nan, p, x);
}

/* exp(x) with lk16_exp's polynomial and accuracy but no special-case masks: same
 * contract as lk8_exp_nonan in avx2/simd.h (x clamped to [-150, 100], saturates to
 * +inf / gradual underflow to 0 by itself; a NaN x gives 0, the caller propagates NaN). */
static inline __m512 lk16_exp_nonan(__m512 x) {
    __m512 n, p = lk16_exp_poly(_mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-150.0f)), _mm512_set1_ps(100.0f)), &n);
    return lk16_scale_pow2(p, n);
}

/* exp(x) for x <= 0 (including -inf; no NaN, no +inf): same as lk8_exp_nonpos in
 * avx2/simd.h, bit-identical to lk16_exp on that domain. x < -87.3 gives 0. */
static inline __m512 lk16_exp_nonpos(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.3365447504f);
    __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    __m512 n, p = lk16_exp_poly(_mm512_max_ps(x, lo), &n);
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mov_ps((__mmask16)~under, _mm512_mul_ps(p, _mm512_castsi512_ps(e)));
}

/* 32 bf16 values as two f32 vectors in the in-lane unpack order (*lo: elements 0-3,
 * 8-11, 16-19, 24-27; *hi: the other four of each 8), as lk8x2_load_bf16; the store
 * (same rounding as lk16_store) writes such a pair back in memory order. */
static inline void lk16x2_load_bf16(const void *p, __m512 *lo, __m512 *hi) {
    __m512i v = _mm512_loadu_si512(p), z = _mm512_setzero_si512();
    *lo = _mm512_castsi512_ps(_mm512_unpacklo_epi16(z, v));
    *hi = _mm512_castsi512_ps(_mm512_unpackhi_epi16(z, v));
}

static inline void lk16x2_store_bf16(void *p, __m512 lo, __m512 hi) {
    _mm512_storeu_si512(p, _mm512_packus_epi32(lk16_bf16_bits(lo), lk16_bf16_bits(hi)));
}

#endif
