/*
 * Vector layer, AVX-512 F/BW/DQ/VL: 16 f32 lanes, 32 registers, opmask tails. The
 * primitives that src/cpu/vec/lkv.h builds on (see there for the contract of each);
 * included only through lkv.h, by the SIMD sources compiled with -mavx512f -mavx512bw
 * -mavx512dq -mavx512vl -mavx2 -mfma -mf16c -DLKV_AVX512.
 *
 * bf16 stores use the integer round-to-nearest-even of src/core/half.h, not
 * VCVTNEPS2BF16 (which flushes subnormal inputs to zero and would differ from ref).
 */
#ifndef LKV_AVX512_H
#define LKV_AVX512_H

#include <immintrin.h>

#include "../../core/half.h"

#define LKV_W 16               /* f32 lanes */
#define LKV_MR 12              /* attention micro-kernel rows (2 vectors each: 24 of 32 zmm) */
#define LKV_FN(name) lk_avx512_##name

typedef __m512 lkv_f32;
typedef __m512i lkv_i32;
typedef __mmask16 lkv_m;
typedef __m512i lkv_bits;      /* 64 raw bytes */

/* ---- f32 arithmetic ---- */
static inline lkv_f32 lkv_zero(void) { return _mm512_setzero_ps(); }
static inline lkv_f32 lkv_set1(float x) { return _mm512_set1_ps(x); }
static inline lkv_f32 lkv_loadu(const float *p) { return _mm512_loadu_ps(p); }
static inline void lkv_storeu(float *p, lkv_f32 v) { _mm512_storeu_ps(p, v); }
static inline lkv_f32 lkv_add(lkv_f32 a, lkv_f32 b) { return _mm512_add_ps(a, b); }
static inline lkv_f32 lkv_sub(lkv_f32 a, lkv_f32 b) { return _mm512_sub_ps(a, b); }
static inline lkv_f32 lkv_mul(lkv_f32 a, lkv_f32 b) { return _mm512_mul_ps(a, b); }
static inline lkv_f32 lkv_div(lkv_f32 a, lkv_f32 b) { return _mm512_div_ps(a, b); }
static inline lkv_f32 lkv_fma(lkv_f32 a, lkv_f32 b, lkv_f32 c) { return _mm512_fmadd_ps(a, b, c); }
static inline lkv_f32 lkv_fnma(lkv_f32 a, lkv_f32 b, lkv_f32 c) { return _mm512_fnmadd_ps(a, b, c); }
static inline lkv_f32 lkv_max(lkv_f32 a, lkv_f32 b) { return _mm512_max_ps(a, b); }
static inline lkv_f32 lkv_min(lkv_f32 a, lkv_f32 b) { return _mm512_min_ps(a, b); }
static inline lkv_f32 lkv_and(lkv_f32 a, lkv_f32 b) { return _mm512_and_ps(a, b); }
static inline lkv_f32 lkv_or(lkv_f32 a, lkv_f32 b) { return _mm512_or_ps(a, b); }
static inline lkv_f32 lkv_andnot(lkv_f32 a, lkv_f32 b) { return _mm512_andnot_ps(a, b); }
static inline lkv_f32 lkv_round(lkv_f32 a) {
    return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
static inline float lkv_hsum(lkv_f32 v) { return _mm512_reduce_add_ps(v); }
static inline float lkv_hmax(lkv_f32 v) {
    __m256 s8 = _mm256_max_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* ---- int32 lanes ---- */
static inline lkv_i32 lkv_as_i32(lkv_f32 v) { return _mm512_castps_si512(v); }
static inline lkv_f32 lkv_as_f32(lkv_i32 v) { return _mm512_castsi512_ps(v); }
static inline lkv_i32 lkv_cvt_i32(lkv_f32 v) { return _mm512_cvtps_epi32(v); }
static inline lkv_i32 lkv_i32_set1(int x) { return _mm512_set1_epi32(x); }
static inline lkv_i32 lkv_i32_add(lkv_i32 a, lkv_i32 b) { return _mm512_add_epi32(a, b); }
static inline lkv_i32 lkv_i32_sub(lkv_i32 a, lkv_i32 b) { return _mm512_sub_epi32(a, b); }
static inline lkv_i32 lkv_i32_and(lkv_i32 a, lkv_i32 b) { return _mm512_and_si512(a, b); }
#define lkv_i32_slli(v, n) _mm512_slli_epi32((v), (n))
#define lkv_i32_srli(v, n) _mm512_srli_epi32((v), (n))
#define lkv_i32_srai(v, n) _mm512_srai_epi32((v), (n))

/* ---- lane masks ---- */
static inline lkv_m lkv_lt(lkv_f32 a, lkv_f32 b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
static inline lkv_m lkv_gt(lkv_f32 a, lkv_f32 b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
static inline lkv_m lkv_unord(lkv_f32 a, lkv_f32 b) { return _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q); }
static inline lkv_m lkv_m_none(void) { return 0; }
static inline lkv_m lkv_m_or(lkv_m a, lkv_m b) { return (lkv_m)(a | b); }
static inline int lkv_m_any(lkv_m m) { return m != 0; }
static inline lkv_m lkv_m_first(int64_t n) { return n >= 16 ? (lkv_m)0xffff : (lkv_m)((1u << n) - 1u); }
static inline lkv_f32 lkv_blend(lkv_f32 a, lkv_f32 b, lkv_m m) { return _mm512_mask_blend_ps(m, a, b); }
static inline lkv_f32 lkv_maskz(lkv_m m, lkv_f32 a) { return _mm512_maskz_mov_ps(m, a); }
static inline lkv_f32 lkv_zero_where(lkv_m m, lkv_f32 a) { return _mm512_maskz_mov_ps((lkv_m)~m, a); }

/* ---- f16 / bf16 <-> f32 ---- */
static inline lkv_f32 lkv_load_f16(const void *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
static inline lkv_f32 lkv_load_bf16(const void *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

static inline lkv_i32 lkv_bf16_bits_nonan(lkv_f32 v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    return _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
}

static inline lkv_i32 lkv_bf16_bits(lkv_f32 v) {
    __m512i nan = _mm512_or_si512(_mm512_srli_epi32(_mm512_castps_si512(v), 16), _mm512_set1_epi32(0x40));
    return _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), lkv_bf16_bits_nonan(v), nan);
}

static inline __m256i lkv__half(lkv_f32 v, lk_dtype dt) {
    if (dt == LK_F16) return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm512_cvtepi32_epi16(lkv_bf16_bits(v));
}
static inline void lkv_store_f16(void *p, lkv_f32 v) { _mm256_storeu_si256((__m256i *)p, lkv__half(v, LK_F16)); }
static inline void lkv_store_bf16(void *p, lkv_f32 v) { _mm256_storeu_si256((__m256i *)p, lkv__half(v, LK_BF16)); }

/* non-temporal stores; p aligned to the store's width (64 bytes f32, 32 bytes f16/bf16) */
static inline void lkv_stream_f32(float *p, lkv_f32 v) { _mm512_stream_ps(p, v); }
static inline void lkv_stream_half(void *p, lk_dtype dt, lkv_f32 v) { _mm256_stream_si256((__m256i *)p, lkv__half(v, dt)); }
static inline void lkv_sfence(void) { _mm_sfence(); }

/* first n (0 <= n <= W) elements, masked */
static inline lkv_f32 lkv_load_part(const void *p, lk_dtype dt, int64_t n) {
    __mmask16 m = lkv_m_first(n);
    if (dt == LK_F32) return _mm512_maskz_loadu_ps(m, p);
    __m256i h = _mm256_maskz_loadu_epi16(m, p);
    if (dt == LK_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
static inline void lkv_store_part(void *p, lk_dtype dt, lkv_f32 v, int64_t n) {
    __mmask16 m = lkv_m_first(n);
    if (dt == LK_F32) _mm512_mask_storeu_ps(p, m, v);
    else _mm256_mask_storeu_epi16(p, m, lkv__half(v, dt));
}

/* ---- 2W bf16 values per load in even / odd order ---- */
static inline void lkv_bf16_split(lkv_bits v, lkv_f32 *even, lkv_f32 *odd) {
    *even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    *odd = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xffff0000u)));
}
static inline lkv_bits lkv_bf16_join_nonan(lkv_f32 even, lkv_f32 odd) {
    __m512i o = _mm512_castps_si512(odd);
    o = _mm512_add_epi32(_mm512_add_epi32(o, _mm512_set1_epi32(0x7fff)),
                         _mm512_and_si512(_mm512_srli_epi32(o, 16), _mm512_set1_epi32(1)));
    return _mm512_mask_blend_epi16((__mmask32)0xaaaaaaaau, lkv_bf16_bits_nonan(even), o);
}

static inline lkv_bits lkv_bf16_join_exact(lkv_f32 even, lkv_f32 odd) {
    return _mm512_mask_blend_epi16((__mmask32)0xaaaaaaaau, _mm512_srli_epi32(_mm512_castps_si512(even), 16),
                                   _mm512_castps_si512(odd));
}

/* ---- raw bytes ---- */
#define LKV_BYTES 64
static inline lkv_bits lkv_bits_loadu(const void *p) { return _mm512_loadu_si512(p); }
static inline void lkv_bits_storeu(void *p, lkv_bits v) { _mm512_storeu_si512(p, v); }
static inline void lkv_bits_stream(void *p, lkv_bits v) { _mm512_stream_si512((void *)p, v); } /* 64-byte aligned */

/* 32 raw bytes (an NZ chunk of 16-bit values) */
typedef __m256i lkv_c32;
static inline lkv_c32 lkv_c32_loadu(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline void lkv_c32_storeu(void *p, lkv_c32 v) { _mm256_storeu_si256((__m256i *)p, v); }
static inline void lkv_c32_stream(void *p, lkv_c32 v) { _mm256_stream_si256((__m256i *)p, v); } /* 32-byte aligned */

/* ---- shuffles ---- */

/* GPT-J pairs (see avx2.h): per 128-bit lane L, x and y hold pairs 2L, 2L+1, 8+2L, 9+2L;
 * lkv_pair_order puts a plain vector's 64-bit units in the order 0 4 1 5 2 6 3 7 */
static inline void lkv_deinterleave(lkv_f32 v0, lkv_f32 v1, lkv_f32 *x, lkv_f32 *y) {
    *x = _mm512_shuffle_ps(v0, v1, _MM_SHUFFLE(2, 0, 2, 0));
    *y = _mm512_shuffle_ps(v0, v1, _MM_SHUFFLE(3, 1, 3, 1));
}
static inline void lkv_interleave(lkv_f32 x, lkv_f32 y, lkv_f32 *v0, lkv_f32 *v1) {
    *v0 = _mm512_unpacklo_ps(x, y);
    *v1 = _mm512_unpackhi_ps(x, y);
}
static inline lkv_f32 lkv_pair_order(lkv_f32 v) {
    return _mm512_castpd_ps(_mm512_permutexvar_pd(_mm512_setr_epi64(0, 4, 1, 5, 2, 6, 3, 7), _mm512_castps_pd(v)));
}

/* a to pa and b to pb, both of dtype dt: bf16 with one pack and one permute */
static inline void lkv_store2(void *pa, void *pb, lk_dtype dt, lkv_f32 a, lkv_f32 b) {
    if (dt != LK_BF16) {
        if (dt == LK_F32) _mm512_storeu_ps(pa, a), _mm512_storeu_ps(pb, b);
        else lkv_store_f16(pa, a), lkv_store_f16(pb, b);
        return;
    }
    __m512i ab = _mm512_packus_epi32(lkv_bf16_bits(a), lkv_bf16_bits(b)); /* per 128 bits: a 4, b 4 */
    ab = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), ab);
    _mm256_storeu_si256((__m256i *)pa, _mm512_castsi512_si256(ab));
    _mm256_storeu_si256((__m256i *)pb, _mm512_extracti64x4_epi64(ab, 1));
}

/* W x W transpose of r[0..W) in place: 4x4 blocks within 128-bit lanes, then lanes */
static inline void lkv_transpose(lkv_f32 *r) {
    __m512 t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        u[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44), u[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xee);
        u[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44), u[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    /* u[4q + k] lane L holds element 4L + k of rows 4q .. 4q + 3 */
    for (int k = 0; k < 4; k++) {
        __m512 v = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x88), w = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xdd);
        __m512 v2 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x88), w2 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xdd);
        r[k] = _mm512_shuffle_f32x4(v, v2, 0x88), r[8 + k] = _mm512_shuffle_f32x4(v, v2, 0xdd);
        r[4 + k] = _mm512_shuffle_f32x4(w, w2, 0x88), r[12 + k] = _mm512_shuffle_f32x4(w, w2, 0xdd);
    }
}

#endif
