/*
 * Vector layer, AVX2 + FMA + F16C: 8 f32 lanes. The primitives that src/cpu/vec/lkv.h
 * builds on (see there for the contract of each); included only through lkv.h, by the
 * SIMD sources compiled with -mavx2 -mfma -mf16c -DLKV_AVX2.
 *
 * Tails (lkv_load_part / lkv_store_part) go through a small stack buffer. bf16 rounding
 * is the integer round-to-nearest-even of src/core/half.h, NaNs quieted the same way.
 */
#ifndef LKV_AVX2_H
#define LKV_AVX2_H

#include <immintrin.h>
#include <string.h>

#include "../../core/half.h"

#define LKV_W 8                /* f32 lanes */
#define LKV_MR 6               /* attention micro-kernel rows (2 vectors each: 12 of 16 ymm) */
#define LKV_FN(name) lk_avx2_##name

typedef __m256 lkv_f32;
typedef __m256i lkv_i32;
typedef __m256 lkv_m;          /* lane mask: all ones / all zeros per lane */
typedef __m256i lkv_bits;      /* 32 raw bytes */

/* ---- f32 arithmetic ---- */
static inline lkv_f32 lkv_zero(void) { return _mm256_setzero_ps(); }
static inline lkv_f32 lkv_set1(float x) { return _mm256_set1_ps(x); }
static inline lkv_f32 lkv_loadu(const float *p) { return _mm256_loadu_ps(p); }
static inline void lkv_storeu(float *p, lkv_f32 v) { _mm256_storeu_ps(p, v); }
static inline lkv_f32 lkv_add(lkv_f32 a, lkv_f32 b) { return _mm256_add_ps(a, b); }
static inline lkv_f32 lkv_sub(lkv_f32 a, lkv_f32 b) { return _mm256_sub_ps(a, b); }
static inline lkv_f32 lkv_mul(lkv_f32 a, lkv_f32 b) { return _mm256_mul_ps(a, b); }
static inline lkv_f32 lkv_div(lkv_f32 a, lkv_f32 b) { return _mm256_div_ps(a, b); }
static inline lkv_f32 lkv_fma(lkv_f32 a, lkv_f32 b, lkv_f32 c) { return _mm256_fmadd_ps(a, b, c); }
static inline lkv_f32 lkv_fnma(lkv_f32 a, lkv_f32 b, lkv_f32 c) { return _mm256_fnmadd_ps(a, b, c); }
static inline lkv_f32 lkv_max(lkv_f32 a, lkv_f32 b) { return _mm256_max_ps(a, b); }
static inline lkv_f32 lkv_min(lkv_f32 a, lkv_f32 b) { return _mm256_min_ps(a, b); }
static inline lkv_f32 lkv_and(lkv_f32 a, lkv_f32 b) { return _mm256_and_ps(a, b); }
static inline lkv_f32 lkv_or(lkv_f32 a, lkv_f32 b) { return _mm256_or_ps(a, b); }
static inline lkv_f32 lkv_andnot(lkv_f32 a, lkv_f32 b) { return _mm256_andnot_ps(a, b); }
static inline lkv_f32 lkv_round(lkv_f32 a) {
    return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

static inline float lkv_hsum(lkv_f32 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float lkv_hmax(lkv_f32 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* ---- int32 lanes ---- */
static inline lkv_i32 lkv_as_i32(lkv_f32 v) { return _mm256_castps_si256(v); }
static inline lkv_f32 lkv_as_f32(lkv_i32 v) { return _mm256_castsi256_ps(v); }
static inline lkv_i32 lkv_cvt_i32(lkv_f32 v) { return _mm256_cvtps_epi32(v); }
static inline lkv_i32 lkv_i32_set1(int x) { return _mm256_set1_epi32(x); }
static inline lkv_i32 lkv_i32_add(lkv_i32 a, lkv_i32 b) { return _mm256_add_epi32(a, b); }
static inline lkv_i32 lkv_i32_sub(lkv_i32 a, lkv_i32 b) { return _mm256_sub_epi32(a, b); }
static inline lkv_i32 lkv_i32_and(lkv_i32 a, lkv_i32 b) { return _mm256_and_si256(a, b); }
#define lkv_i32_slli(v, n) _mm256_slli_epi32((v), (n))
#define lkv_i32_srli(v, n) _mm256_srli_epi32((v), (n))
#define lkv_i32_srai(v, n) _mm256_srai_epi32((v), (n))

/* ---- lane masks ---- */
static inline lkv_m lkv_lt(lkv_f32 a, lkv_f32 b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
static inline lkv_m lkv_gt(lkv_f32 a, lkv_f32 b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
static inline lkv_m lkv_unord(lkv_f32 a, lkv_f32 b) { return _mm256_cmp_ps(a, b, _CMP_UNORD_Q); }
static inline lkv_m lkv_m_none(void) { return _mm256_setzero_ps(); }
static inline lkv_m lkv_m_or(lkv_m a, lkv_m b) { return _mm256_or_ps(a, b); }
static inline int lkv_m_any(lkv_m m) { return _mm256_movemask_ps(m) != 0; }
static inline lkv_m lkv_m_first(int64_t n) { /* lanes [0, n) */
    __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n < 8 ? n : 8)), idx));
}
static inline lkv_f32 lkv_blend(lkv_f32 a, lkv_f32 b, lkv_m m) { return _mm256_blendv_ps(a, b, m); }
static inline lkv_f32 lkv_maskz(lkv_m m, lkv_f32 a) { return _mm256_and_ps(m, a); }
static inline lkv_f32 lkv_zero_where(lkv_m m, lkv_f32 a) { return _mm256_andnot_ps(m, a); }

/* ---- f16 / bf16 <-> f32 ---- */
static inline lkv_f32 lkv_load_f16(const void *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline lkv_f32 lkv_load_bf16(const void *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

/* f32 -> bf16 round-to-nearest-even without the NaN rule, in the low 16 bits of each
 * lane: exact for every non-NaN value and for NaNs whose low 16 bits are 0 */
static inline lkv_i32 lkv_bf16_bits_nonan(lkv_f32 v) {
    __m256i u = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    return _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
}

/* the same with NaNs quieted as lk_f32_to_bf16 */
static inline lkv_i32 lkv_bf16_bits(lkv_f32 v) {
    __m256i nan = _mm256_or_si256(_mm256_srli_epi32(_mm256_castps_si256(v), 16), _mm256_set1_epi32(0x40));
    return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(lkv_bf16_bits_nonan(v)), _mm256_castsi256_ps(nan),
                                                _mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
}

static inline __m128i lkv__half(lkv_f32 v, lk_dtype dt) {
    if (dt == LK_F16) return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256i b = lkv_bf16_bits(v);
    return _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
}
static inline void lkv_store_f16(void *p, lkv_f32 v) { _mm_storeu_si128((__m128i *)p, lkv__half(v, LK_F16)); }
static inline void lkv_store_bf16(void *p, lkv_f32 v) { _mm_storeu_si128((__m128i *)p, lkv__half(v, LK_BF16)); }

/* non-temporal stores; p aligned to the store's width (32 bytes f32, 16 bytes f16/bf16) */
static inline void lkv_stream_f32(float *p, lkv_f32 v) { _mm256_stream_ps(p, v); }
static inline void lkv_stream_half(void *p, lk_dtype dt, lkv_f32 v) { _mm_stream_si128((__m128i *)p, lkv__half(v, dt)); }
static inline void lkv_sfence(void) { _mm_sfence(); }

/* first n (0 <= n <= W) elements; the other lanes are 0 / not written */
static inline lkv_f32 lkv_load_part(const void *p, lk_dtype dt, int64_t n) {
    if (dt == LK_F32) {
        float buf[8] = {0};
        memcpy(buf, p, (size_t)n * 4);
        return _mm256_loadu_ps(buf);
    }
    uint16_t h[8] = {0};
    memcpy(h, p, (size_t)n * 2);
    return dt == LK_F16 ? lkv_load_f16(h) : lkv_load_bf16(h);
}
static inline void lkv_store_part(void *p, lk_dtype dt, lkv_f32 v, int64_t n) {
    if (dt == LK_F32) {
        float buf[8];
        _mm256_storeu_ps(buf, v);
        memcpy(p, buf, (size_t)n * 4);
        return;
    }
    uint16_t h[8];
    _mm_storeu_si128((__m128i *)h, lkv__half(v, dt));
    memcpy(p, h, (size_t)n * 2);
}

/* ---- 2W bf16 values per load in even / odd order (one 32-bit lane holds elements 2i,
 * 2i + 1): the even ones shifted up, the odd ones masked, no shuffles ---- */
static inline void lkv_bf16_split(lkv_bits v, lkv_f32 *even, lkv_f32 *odd) {
    *even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    *odd = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u)));
}
/* inverse, rounded as lkv_bf16_bits_nonan: even results shifted down, blended with the
 * odd ones' high halves */
static inline lkv_bits lkv_bf16_join_nonan(lkv_f32 even, lkv_f32 odd) {
    __m256i o = _mm256_castps_si256(odd);
    o = _mm256_add_epi32(_mm256_add_epi32(o, _mm256_set1_epi32(0x7fff)),
                         _mm256_and_si256(_mm256_srli_epi32(o, 16), _mm256_set1_epi32(1)));
    return _mm256_blend_epi16(lkv_bf16_bits_nonan(even), o, 0xaa);
}

/* even / odd values that are bf16 already (low 16 bits 0) back in element order, exact */
static inline lkv_bits lkv_bf16_join_exact(lkv_f32 even, lkv_f32 odd) {
    return _mm256_blend_epi16(_mm256_srli_epi32(_mm256_castps_si256(even), 16), _mm256_castps_si256(odd), 0xaa);
}

/* ---- raw bytes ---- */
#define LKV_BYTES 32
static inline lkv_bits lkv_bits_loadu(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline void lkv_bits_storeu(void *p, lkv_bits v) { _mm256_storeu_si256((__m256i *)p, v); }
static inline void lkv_bits_stream(void *p, lkv_bits v) { _mm256_stream_si256((__m256i *)p, v); } /* p 32-byte aligned */

/* 32 raw bytes (an NZ chunk of 16-bit values) */
typedef __m256i lkv_c32;
static inline lkv_c32 lkv_c32_loadu(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline void lkv_c32_storeu(void *p, lkv_c32 v) { _mm256_storeu_si256((__m256i *)p, v); }
static inline void lkv_c32_stream(void *p, lkv_c32 v) { _mm256_stream_si256((__m256i *)p, v); } /* 32-byte aligned */

/* ---- shuffles ---- */

/* GPT-J pairs: x = even, y = odd elements of the 2W values v0 | v1, in the lane order
 * that lkv_pair_order gives a plain vector (shufps: pairs 0 1 4 5 2 3 6 7);
 * lkv_interleave is the inverse */
static inline void lkv_deinterleave(lkv_f32 v0, lkv_f32 v1, lkv_f32 *x, lkv_f32 *y) {
    *x = _mm256_shuffle_ps(v0, v1, _MM_SHUFFLE(2, 0, 2, 0));
    *y = _mm256_shuffle_ps(v0, v1, _MM_SHUFFLE(3, 1, 3, 1));
}
static inline void lkv_interleave(lkv_f32 x, lkv_f32 y, lkv_f32 *v0, lkv_f32 *v1) {
    *v0 = _mm256_unpacklo_ps(x, y);
    *v1 = _mm256_unpackhi_ps(x, y);
}
static inline lkv_f32 lkv_pair_order(lkv_f32 v) {
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(v), _MM_SHUFFLE(3, 1, 2, 0)));
}

/* a to pa and b to pb, both of dtype dt: bf16 with one pack and one permute */
static inline void lkv_store2(void *pa, void *pb, lk_dtype dt, lkv_f32 a, lkv_f32 b) {
    if (dt != LK_BF16) {
        if (dt == LK_F32) _mm256_storeu_ps(pa, a), _mm256_storeu_ps(pb, b);
        else lkv_store_f16(pa, a), lkv_store_f16(pb, b);
        return;
    }
    __m256i ab = _mm256_packus_epi32(lkv_bf16_bits(a), lkv_bf16_bits(b)); /* a0-3 b0-3 | a4-7 b4-7 */
    ab = _mm256_permute4x64_epi64(ab, _MM_SHUFFLE(3, 1, 2, 0));
    _mm_storeu_si128((__m128i *)pa, _mm256_castsi256_si128(ab));
    _mm_storeu_si128((__m128i *)pb, _mm256_extracti128_si256(ab, 1));
}

/* W x W transpose of r[0..W) in place */
static inline void lkv_transpose(lkv_f32 *r) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20), r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20), r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31), r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31), r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

#endif
