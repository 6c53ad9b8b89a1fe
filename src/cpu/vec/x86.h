/*
 * Vector layer, x86: AVX2 + FMA + F16C (-DLKV_AVX2: 8 f32 lanes, 16 ymm registers) and
 * AVX-512 F/BW/DQ/VL (-DLKV_AVX512: 16 lanes, 32 zmm registers, opmask tails). The
 * primitives that src/cpu/vec/lkv.h builds on (see there for the contract of each);
 * included only through lkv.h, by the SIMD sources compiled with the ISA's flags.
 *
 * Most primitives are the same instruction at both widths: LKV_X(op) names it
 * (_mm256_op / _mm512_op), LKV_SI(op) its integer form (_mm256_op_si256 /
 * _mm512_op_si512). Lane masks, tails, conversions to 16 bits and the shuffles differ
 * and are written per width. bf16 rounding is the integer round-to-nearest-even of
 * src/core/half.h, NaNs quieted the same way (not VCVTNEPS2BF16, which flushes
 * subnormal inputs to zero).
 */
#ifndef LKV_X86_H
#define LKV_X86_H

#if defined(LKV_EMULATE) /* test builds: AVX-512 emulated on AVX2 (x86_emu.h) */
#include "x86_emu.h"
#else
#include <immintrin.h>
#endif
#include <string.h>

#include "../../core/half.h"

#define LKV_X_(prefix, op) LKV_X__(prefix, op)
#define LKV_X__(prefix, op) prefix##op
#if defined(LKV_AVX512)
#define LKV_W 16  /* f32 lanes */
#define LKV_MR 12 /* attention micro-kernel rows, 2 vectors each: 24 of 32 zmm accumulate */
#if defined(LKV_AMX) /* AVX-512 + AVX512_BF16 + AMX tiles: mla_decode's tile path */
#define LKV_FN(name) lk_amx_##name
#elif defined(LKV_BF16DOT) /* AVX-512 + AVX512_BF16: the kernels that use bf16 dot products */
#define LKV_FN(name) lk_avx512bf16_##name
#else
#define LKV_FN(name) lk_avx512_##name
#endif
#define LKV_X(op) LKV_X_(_mm512_, op)
#define LKV_SI(op) _mm512_##op##_si512
#define LKV_CASTSI_PS castsi512_ps
#define LKV_CMP(a, b, pred) _mm512_cmp_ps_mask((a), (b), (pred))
typedef __m512 lkv_f32;
typedef __m512i lkv_i32;
typedef __mmask16 lkv_m;  /* lane mask: one bit per lane */
typedef __m256i lkv_half; /* W 16-bit values */
#else
#define LKV_W 8
#define LKV_MR 6  /* 2 vectors each: 12 of 16 ymm accumulate */
#define LKV_FN(name) lk_avx2_##name
#define LKV_X(op) LKV_X_(_mm256_, op)
#define LKV_SI(op) _mm256_##op##_si256
#define LKV_CASTSI_PS castsi256_ps
#define LKV_CMP(a, b, pred) _mm256_cmp_ps((a), (b), (pred))
typedef __m256 lkv_f32;
typedef __m256i lkv_i32;
typedef __m256 lkv_m;     /* lane mask: all ones / all zeros per lane */
typedef __m128i lkv_half;
#endif
#define LKV_BYTES (4 * LKV_W)
typedef lkv_i32 lkv_bits; /* LKV_BYTES raw bytes */
typedef __m256i lkv_c32;  /* 32 raw bytes (an NZ chunk of 16-bit values) */

/* ---- f32 arithmetic ---- */
static inline lkv_f32 lkv_zero(void) { return LKV_X(setzero_ps)(); }
static inline lkv_f32 lkv_set1(float x) { return LKV_X(set1_ps)(x); }
static inline lkv_f32 lkv_loadu(const float *p) { return LKV_X(loadu_ps)(p); }
static inline void lkv_storeu(float *p, lkv_f32 v) { LKV_X(storeu_ps)(p, v); }
static inline lkv_f32 lkv_add(lkv_f32 a, lkv_f32 b) { return LKV_X(add_ps)(a, b); }
static inline lkv_f32 lkv_sub(lkv_f32 a, lkv_f32 b) { return LKV_X(sub_ps)(a, b); }
static inline lkv_f32 lkv_mul(lkv_f32 a, lkv_f32 b) { return LKV_X(mul_ps)(a, b); }
static inline lkv_f32 lkv_div(lkv_f32 a, lkv_f32 b) { return LKV_X(div_ps)(a, b); }
static inline lkv_f32 lkv_fma(lkv_f32 a, lkv_f32 b, lkv_f32 c) { return LKV_X(fmadd_ps)(a, b, c); }
static inline lkv_f32 lkv_fnma(lkv_f32 a, lkv_f32 b, lkv_f32 c) { return LKV_X(fnmadd_ps)(a, b, c); }
static inline lkv_f32 lkv_max(lkv_f32 a, lkv_f32 b) { return LKV_X(max_ps)(a, b); }
static inline lkv_f32 lkv_min(lkv_f32 a, lkv_f32 b) { return LKV_X(min_ps)(a, b); }
static inline lkv_f32 lkv_and(lkv_f32 a, lkv_f32 b) { return LKV_X(and_ps)(a, b); }
static inline lkv_f32 lkv_or(lkv_f32 a, lkv_f32 b) { return LKV_X(or_ps)(a, b); }
static inline lkv_f32 lkv_andnot(lkv_f32 a, lkv_f32 b) { return LKV_X(andnot_ps)(a, b); }
static inline lkv_m lkv_lt(lkv_f32 a, lkv_f32 b) { return LKV_CMP(a, b, _CMP_LT_OQ); }
static inline lkv_m lkv_gt(lkv_f32 a, lkv_f32 b) { return LKV_CMP(a, b, _CMP_GT_OQ); }
static inline lkv_m lkv_unord(lkv_f32 a, lkv_f32 b) { return LKV_CMP(a, b, _CMP_UNORD_Q); }

/* ---- int32 lanes, raw bytes ---- */
static inline lkv_i32 lkv_as_i32(lkv_f32 v) { return LKV_SI(castps)(v); }
static inline lkv_f32 lkv_as_f32(lkv_i32 v) { return LKV_X(LKV_CASTSI_PS)(v); }
static inline lkv_i32 lkv_cvt_i32(lkv_f32 v) { return LKV_X(cvtps_epi32)(v); }
static inline lkv_i32 lkv_cvtt_i32(lkv_f32 v) { return LKV_X(cvttps_epi32)(v); }
static inline lkv_i32 lkv_i32_set1(int x) { return LKV_X(set1_epi32)(x); }
static inline lkv_i32 lkv_i32_add(lkv_i32 a, lkv_i32 b) { return LKV_X(add_epi32)(a, b); }
static inline lkv_i32 lkv_i32_sub(lkv_i32 a, lkv_i32 b) { return LKV_X(sub_epi32)(a, b); }
static inline lkv_i32 lkv_i32_and(lkv_i32 a, lkv_i32 b) { return LKV_SI(and)(a, b); }
#define lkv_i32_slli(v, n) LKV_X(slli_epi32)((v), (n))
#define lkv_i32_srli(v, n) LKV_X(srli_epi32)((v), (n))
#define lkv_i32_srai(v, n) LKV_X(srai_epi32)((v), (n))
static inline lkv_i32 lkv_i32_or(lkv_i32 a, lkv_i32 b) { return LKV_SI(or)(a, b); }
static inline lkv_i32 lkv_i32_min(lkv_i32 a, lkv_i32 b) { return LKV_X(min_epi32)(a, b); } /* signed */
static inline lkv_f32 lkv_i32_cvt_f32(lkv_i32 v) { return LKV_X(cvtepi32_ps)(v); }
static inline lkv_bits lkv_bits_loadu(const void *p) { return LKV_SI(loadu)((const void *)p); }
static inline void lkv_bits_storeu(void *p, lkv_bits v) { LKV_SI(storeu)((void *)p, v); }
static inline void lkv_bits_stream(void *p, lkv_bits v) { LKV_SI(stream)((void *)p, v); } /* LKV_BYTES aligned */
static inline lkv_c32 lkv_c32_loadu(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline void lkv_c32_storeu(void *p, lkv_c32 v) { _mm256_storeu_si256((__m256i *)p, v); }
static inline void lkv_c32_stream(void *p, lkv_c32 v) { _mm256_stream_si256((__m256i *)p, v); } /* 32-byte aligned */
static inline void lkv_sfence(void) { _mm_sfence(); }
#if defined(LKV_AVX512)
static inline lkv_half lkv__load_half(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline void lkv__store_half(void *p, lkv_half v) { _mm256_storeu_si256((__m256i *)p, v); }
static inline void lkv__stream_half(void *p, lkv_half v) { _mm256_stream_si256((__m256i *)p, v); }
#else
static inline lkv_half lkv__load_half(const void *p) { return _mm_loadu_si128((const __m128i *)p); }
static inline void lkv__store_half(void *p, lkv_half v) { _mm_storeu_si128((__m128i *)p, v); }
static inline void lkv__stream_half(void *p, lkv_half v) { _mm_stream_si128((__m128i *)p, v); }
#endif

/* f32 -> bf16 round-to-nearest-even without the NaN rule, in the low 16 bits of each
 * lane: exact for every non-NaN value and for NaNs whose low 16 bits are 0 */
static inline lkv_i32 lkv_bf16_bits_nonan(lkv_f32 v) {
    lkv_i32 u = lkv_as_i32(v), lsb = lkv_i32_and(lkv_i32_srli(u, 16), lkv_i32_set1(1));
    return lkv_i32_srli(lkv_i32_add(lkv_i32_add(u, lkv_i32_set1(0x7fff)), lsb), 16);
}

/* the rounding of lkv_bf16_bits_nonan kept in the high half (low half garbage) */
static inline lkv_i32 lkv__bf16_high_nonan(lkv_f32 v) {
    lkv_i32 u = lkv_as_i32(v);
    return lkv_i32_add(lkv_i32_add(u, lkv_i32_set1(0x7fff)), lkv_i32_and(lkv_i32_srli(u, 16), lkv_i32_set1(1)));
}

/* 2W bf16 values of one lkv_bits in even / odd order (element 2i is the low half of lane
 * i, 2i + 1 the high half): the even ones shifted up, the odd ones masked */
static inline void lkv_bf16_split(lkv_bits v, lkv_f32 *even, lkv_f32 *odd) {
    *even = lkv_as_f32(lkv_i32_slli(v, 16));
    *odd = lkv_as_f32(lkv_i32_and(v, lkv_i32_set1((int)0xffff0000u)));
}

static inline lkv_f32 lkv_load_f16(const void *p) { return LKV_X(cvtph_ps)(lkv__load_half(p)); }
static inline lkv_f32 lkv_load_bf16(const void *p) {
    return lkv_as_f32(lkv_i32_slli(LKV_X(cvtepu16_epi32)(lkv__load_half(p)), 16));
}

/* max of 8 lanes */
static inline float lkv__hmax8(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

#if defined(LKV_AVX512) /* ------------------------------------------------ AVX-512 */

/* sum of 16 lanes as a tree: halves, quarters, then pairs (the order of GCC's
 * _mm512_reduce_add_ps, written out so that lkv_hsum4 can match it bit for bit) */
static inline float lkv_hsum(lkv_f32 v) {
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_add_ps(q, _mm_permute_ps(q, 0x4e));
    return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
}
/* lane g (0..3) = lkv_hsum of a, b, c, d with the same additions in the same order, the
 * four trees side by side in one vector */
static inline __m128 lkv_hsum4(lkv_f32 a, lkv_f32 b, lkv_f32 c, lkv_f32 d) {
    __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xee));
    __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xee));
    __m512 q = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xdd));
    q = _mm512_add_ps(q, _mm512_permute_ps(q, 0x4e));
    q = _mm512_add_ps(q, _mm512_permute_ps(q, 0xb1));
    __m512i lane0 = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(lane0, q));
}
static inline float lkv_hmax(lkv_f32 v) {
    return lkv__hmax8(_mm256_max_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
}
static inline lkv_f32 lkv_round(lkv_f32 a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline lkv_m lkv_m_none(void) { return 0; }
static inline lkv_m lkv_m_or(lkv_m a, lkv_m b) { return (lkv_m)(a | b); }
static inline int lkv_m_any(lkv_m m) { return m != 0; }
static inline lkv_m lkv_m_first(int64_t n) { return n >= 16 ? (lkv_m)0xffff : (lkv_m)((1u << n) - 1u); }
static inline lkv_f32 lkv_blend(lkv_f32 a, lkv_f32 b, lkv_m m) { return _mm512_mask_blend_ps(m, a, b); }
static inline lkv_f32 lkv_maskz(lkv_m m, lkv_f32 a) { return _mm512_maskz_mov_ps(m, a); }
static inline lkv_f32 lkv_zero_where(lkv_m m, lkv_f32 a) { return _mm512_maskz_mov_ps((lkv_m)~m, a); }
static inline lkv_m lkv_i32_gt(lkv_i32 a, lkv_i32 b) { return _mm512_cmpgt_epi32_mask(a, b); } /* signed */
static inline lkv_i32 lkv_i32_blend(lkv_i32 a, lkv_i32 b, lkv_m m) { return _mm512_mask_blend_epi32(m, a, b); }
/* W bytes zero-extended into the lanes / the low byte of each lane stored (W bytes);
 * _part: the first n (0 <= n <= W), other lanes 0 / not written */
static inline lkv_i32 lkv_u8_load(const void *p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)); }
static inline lkv_i32 lkv_u8_load_part(const void *p, int64_t n) {
    return _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(lkv_m_first(n), p));
}
static inline void lkv_u8_store(void *p, lkv_i32 v) { _mm_storeu_si128((__m128i *)p, _mm512_cvtepi32_epi8(v)); }
static inline void lkv_u8_store_part(void *p, lkv_i32 v, int64_t n) { _mm512_mask_cvtepi32_storeu_epi8(p, lkv_m_first(n), v); }

static inline lkv_i32 lkv_bf16_bits(lkv_f32 v) { /* NaNs quieted as lk_f32_to_bf16 */
    __m512i nan = _mm512_or_si512(_mm512_srli_epi32(_mm512_castps_si512(v), 16), _mm512_set1_epi32(0x40));
    return _mm512_mask_blend_epi32(lkv_unord(v, v), lkv_bf16_bits_nonan(v), nan);
}
static inline lkv_half lkv__half(lkv_f32 v, lk_dtype dt) {
    if (dt == LK_F16) return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm512_cvtepi32_epi16(lkv_bf16_bits(v));
}

/* first n (0 <= n <= W) elements, masked; other lanes 0 / not written */
static inline lkv_f32 lkv__load_part_fh(const void *p, lk_dtype dt, int64_t n) {
    __mmask16 m = lkv_m_first(n);
    if (dt == LK_F32) return _mm512_maskz_loadu_ps(m, p);
    __m256i h = _mm256_maskz_loadu_epi16(m, p);
    return dt == LK_F16 ? _mm512_cvtph_ps(h) : lkv_as_f32(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
static inline void lkv__store_part_fh(void *p, lk_dtype dt, lkv_f32 v, int64_t n) {
    __mmask16 m = lkv_m_first(n);
    if (dt == LK_F32) _mm512_mask_storeu_ps(p, m, v);
    else _mm256_mask_storeu_epi16(p, m, lkv__half(v, dt));
}

static inline lkv_bits lkv__blend_odd16(lkv_i32 even_low, lkv_i32 odd_high) {
    return _mm512_mask_blend_epi16((__mmask32)0xaaaaaaaau, even_low, odd_high);
}

/* GPT-J pairs: per 128-bit lane L, x and y hold pairs 2L, 2L+1, 8+2L, 9+2L;
 * lkv_pair_order puts a plain vector's 64-bit units in the order 0 4 1 5 2 6 3 7 */
static inline lkv_f32 lkv_pair_order(lkv_f32 v) {
    return _mm512_castpd_ps(_mm512_permutexvar_pd(_mm512_setr_epi64(0, 4, 1, 5, 2, 6, 3, 7), _mm512_castps_pd(v)));
}
/* bf16 pack of a and b back in memory order: a to the low 32 bytes, b to the high */
static inline lkv_bits lkv__pack2_bf16(lkv_f32 a, lkv_f32 b) {
    __m512i ab = _mm512_packus_epi32(lkv_bf16_bits(a), lkv_bf16_bits(b)); /* per 128 bits: a 4, b 4 */
    return _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), ab);
}
static inline lkv_half lkv__low_half(lkv_bits v) { return _mm512_castsi512_si256(v); }
static inline lkv_half lkv__high_half(lkv_bits v) { return _mm512_extracti64x4_epi64(v, 1); }

/* the transpose's last stage: u[4q + k] lane L holds element 4L + k of rows 4q .. 4q + 3;
 * row i of the result gathers lane i / 4 of u[i % 4], u[4 + i % 4], u[8 + ..], u[12 + ..] */
static inline void lkv__transpose_lanes(const lkv_f32 *u, lkv_f32 *r) {
    for (int k = 0; k < 4; k++) {
        __m512 v = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x88), w = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xdd);
        __m512 v2 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x88), w2 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xdd);
        r[k] = _mm512_shuffle_f32x4(v, v2, 0x88), r[8 + k] = _mm512_shuffle_f32x4(v, v2, 0xdd);
        r[4 + k] = _mm512_shuffle_f32x4(w, w2, 0x88), r[12 + k] = _mm512_shuffle_f32x4(w, w2, 0xdd);
    }
}

/* fp8 -> f32 through f16 words for 2W codes (AVX2's lkv_load2_f8_raw, below, at twice the
 * width: one 32-byte load, VPMOV(S|Z)XBW, VCVTPH2PS of each half): e5m2 as its f16 high
 * byte, e4m3 as value / 256 with its NaN code finite (1.875); codes [0, W) in a, [W, 2W) in
 * b; with nan not NULL the codes also folded into *nan (lkv_e4m3_nan_found, below) */
static inline void lkv_load2_f8_raw(const void *p, lk_dtype dt, lkv_f32 *a, lkv_f32 *b, lkv_c32 *nan) {
    __m256i c = _mm256_loadu_si256((const __m256i *)p);
    if (nan) *nan = _mm256_max_epu8(*nan, _mm256_or_si256(c, _mm256_set1_epi8((char)0x80)));
    __m512i h = dt == LK_F8E5M2 ? _mm512_slli_epi16(_mm512_cvtepu8_epi16(c), 8)
                                : _mm512_and_si512(_mm512_slli_epi16(_mm512_cvtepi8_epi16(c), 7),
                                                   _mm512_set1_epi16((short)0xbfff));
    *a = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
    *b = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
}
/* out[g] = s * (the sum of the lanes of a, b, c, d), g = 0..3 (lkv_hsum4's trees) */
static inline void lkv_hsum4_store(float *out, float s, lkv_f32 a, lkv_f32 b, lkv_f32 c, lkv_f32 d) {
    _mm_storeu_ps(out, _mm_mul_ps(lkv_hsum4(a, b, c, d), _mm_set1_ps(s)));
}

#else /* ------------------------------------------------------------------- AVX2 */

static inline float lkv_hsum(lkv_f32 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
static inline float lkv_hmax(lkv_f32 v) { return lkv__hmax8(v); }
static inline lkv_f32 lkv_round(lkv_f32 a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
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
static inline lkv_m lkv_i32_gt(lkv_i32 a, lkv_i32 b) { return _mm256_castsi256_ps(_mm256_cmpgt_epi32(a, b)); } /* signed */
static inline lkv_i32 lkv_i32_blend(lkv_i32 a, lkv_i32 b, lkv_m m) {
    return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(b), m));
}
/* W bytes zero-extended into the lanes / the low byte (0..255) of each lane stored (W
 * bytes); _part: the first n (0 <= n <= W), other lanes 0 / not written */
static inline lkv_i32 lkv_u8_load(const void *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }
static inline lkv_i32 lkv_u8_load_part(const void *p, int64_t n) {
    uint8_t b[8] = {0};
    memcpy(b, p, (size_t)n);
    return lkv_u8_load(b);
}
static inline __m128i lkv__u8_pack(lkv_i32 v) {
    __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    return _mm_packus_epi16(w, w);
}
static inline void lkv_u8_store(void *p, lkv_i32 v) { _mm_storel_epi64((__m128i *)p, lkv__u8_pack(v)); }
static inline void lkv_u8_store_part(void *p, lkv_i32 v, int64_t n) {
    uint8_t b[16];
    _mm_storeu_si128((__m128i *)b, lkv__u8_pack(v));
    memcpy(p, b, (size_t)n);
}

static inline lkv_i32 lkv_bf16_bits(lkv_f32 v) { /* NaNs quieted as lk_f32_to_bf16 */
    __m256i nan = _mm256_or_si256(_mm256_srli_epi32(_mm256_castps_si256(v), 16), _mm256_set1_epi32(0x40));
    return _mm256_castps_si256(lkv_blend(lkv_as_f32(lkv_bf16_bits_nonan(v)), lkv_as_f32(nan), lkv_unord(v, v)));
}
static inline lkv_half lkv__half(lkv_f32 v, lk_dtype dt) {
    if (dt == LK_F16) return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256i b = lkv_bf16_bits(v);
    return _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
}

/* first n (0 <= n <= W) elements through a small stack buffer; other lanes 0 / not written */
static inline lkv_f32 lkv__load_part_fh(const void *p, lk_dtype dt, int64_t n) {
    if (dt == LK_F32) {
        float buf[8] = {0};
        memcpy(buf, p, (size_t)n * 4);
        return _mm256_loadu_ps(buf);
    }
    uint16_t h[8] = {0};
    memcpy(h, p, (size_t)n * 2);
    return dt == LK_F16 ? lkv_load_f16(h) : lkv_load_bf16(h);
}
static inline void lkv__store_part_fh(void *p, lk_dtype dt, lkv_f32 v, int64_t n) {
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

static inline lkv_bits lkv__blend_odd16(lkv_i32 even_low, lkv_i32 odd_high) {
    return _mm256_blend_epi16(even_low, odd_high, 0xaa);
}

/* GPT-J pairs: shufps leaves x and y in the pair order 0 1 4 5 2 3 6 7 */
static inline lkv_f32 lkv_pair_order(lkv_f32 v) {
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(v), _MM_SHUFFLE(3, 1, 2, 0)));
}
static inline lkv_bits lkv__pack2_bf16(lkv_f32 a, lkv_f32 b) {
    __m256i ab = _mm256_packus_epi32(lkv_bf16_bits(a), lkv_bf16_bits(b)); /* a0-3 b0-3 | a4-7 b4-7 */
    return _mm256_permute4x64_epi64(ab, _MM_SHUFFLE(3, 1, 2, 0));
}
static inline lkv_half lkv__low_half(lkv_bits v) { return _mm256_castsi256_si128(v); }
static inline lkv_half lkv__high_half(lkv_bits v) { return _mm256_extracti128_si256(v, 1); }

/* fp8 -> f32 through F16C (LKV_F8_F16C: lkv.h's lkv_load_f8 uses it): W codes at p as W
 * f16 words, then VCVTPH2PS (exact, f16 subnormals included; MXCSR's DAZ is not applied).
 * e5m2 is an f16's high byte (inf and NaN codes too: an f16 NaN converts with its payload
 * shifted up and quieted, as src/core/fp8.h's). e4m3: the code sign-extended and shifted
 * left 7 puts its 7 magnitude bits under f16's exponent bias (S.0EEEE.MMM0000000, the
 * copy of the sign in bit 14 masked off): the f16 is value / 256 exactly, normal and
 * subnormal codes alike, except the NaN code S.1111.111, which reads as 1.875.
 * lkv_load2_f8_raw stops there (2W codes from one 16-byte load, the f32 of those f16s in
 * two vectors: callers scale by 256 and treat the NaN code themselves; e4m3's 16 codes
 * widened at once); lkv__f8_load_f16c turns the NaN code's f16 into the quiet NaN
 * S.11111.1000000000 (its f32 is sign | 0x7fc00000, fp8.h's) and multiplies by 256. */
#define LKV_F8_F16C 1
static inline __m128i lkv__f8_half(__m128i c, lk_dtype dt) {
    if (dt == LK_F8E5M2) return _mm_unpacklo_epi8(_mm_setzero_si128(), c);
    return _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(c), 7), _mm_set1_epi16((short)0xbfff));
}
/* codes [0, W) at p in a, [W, 2W) in b; with nan not NULL the codes also folded into *nan
 * (lkv_e4m3_nan_found, below) */
static inline void lkv_load2_f8_raw(const void *p, lk_dtype dt, lkv_f32 *a, lkv_f32 *b, lkv_c32 *nan) {
    __m128i c = _mm_loadu_si128((const __m128i *)p);
    if (dt == LK_F8E5M2) {
        *a = _mm256_cvtph_ps(lkv__f8_half(c, dt));
        *b = _mm256_cvtph_ps(_mm_unpackhi_epi8(_mm_setzero_si128(), c));
        return;
    }
    __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(c), 7), _mm256_set1_epi16((short)0xbfff));
    if (nan) *nan = _mm256_max_epu16(*nan, _mm256_add_epi16(h, h)); /* lkv_e4m3_nan_found's words */
    *a = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    *b = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}
static inline lkv_f32 lkv__f8_load_f16c(__m128i c, lk_dtype dt) {
    __m128i h = lkv__f8_half(c, dt);
    if (dt == LK_F8E5M2) return _mm256_cvtph_ps(h);
    /* 0x3f80 ^ 0x4180 = 0x7e00: the NaN code's magnitude becomes f16's quiet NaN */
    __m128i nan = _mm_cmpeq_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7fff)), _mm_set1_epi16(0x3f80));
    h = _mm_xor_si128(h, _mm_and_si128(nan, _mm_set1_epi16(0x4180)));
    return _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
}

/* lane g (0..3) of the result = out[g] = s * (the sum of the lanes of a, b, c, d): pairs
 * within 128-bit lanes by unpacks, then the two halves */
static inline void lkv_hsum4_store(float *out, float s, lkv_f32 a, lkv_f32 b, lkv_f32 c, lkv_f32 d) {
    __m256 ab = _mm256_add_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b)); /* a02 b02 a13 b13 */
    __m256 cd = _mm256_add_ps(_mm256_unpacklo_ps(c, d), _mm256_unpackhi_ps(c, d));
    __m256 t = _mm256_add_ps(_mm256_shuffle_ps(ab, cd, 0x44), _mm256_shuffle_ps(ab, cd, 0xee));
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    _mm_storeu_ps(out, _mm_mul_ps(r, _mm_set1_ps(s)));
}

/* the transpose's last stage (see the AVX-512 one): lanes of u[k] and u[4 + k] */
static inline void lkv__transpose_lanes(const lkv_f32 *u, lkv_f32 *r) {
    for (int k = 0; k < 4; k++) r[k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x20), r[4 + k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x31);
}

#endif /* ---------------------------------------------------------------- both */

/* e4m3 NaN codes (S.1111.111) among the codes lkv_load2_f8_raw reads: from
 * *nan = lkv_c32_zero() it keeps, on AVX-512, the byte-wise max of (code | 0x80), which is
 * 0xff exactly where some code read was 0x7f or 0xff; on AVX2 the word-wise max of twice
 * the code's f16 word (S.0EEEE.MMM0000000 doubled drops the sign: 0x7f00 for the NaN
 * code, at most 0x7e00 for the others; a byte-wise fold there cost 4 instructions per 16
 * codes, this one 2). lkv_e4m3_nan_found(*nan) tells that */
static inline lkv_c32 lkv_c32_zero(void) { return _mm256_setzero_si256(); }
static inline int lkv_e4m3_nan_found(lkv_c32 acc) {
#if LKV_W == 16
    return _mm256_movemask_epi8(_mm256_cmpeq_epi8(acc, _mm256_set1_epi8(-1))) != 0;
#else
    return _mm256_movemask_epi8(_mm256_cmpeq_epi16(acc, _mm256_set1_epi16(0x7f00))) != 0;
#endif
}

#if defined(LKV_BF16DOT) /* ------------------------ AVX512_BF16 (-mavx512bf16) */
/* acc[i] += a[2i] b[2i] + a[2i + 1] b[2i + 1]: 2W bf16 values of a and b as W pairs, the
 * products exact, summed into the f32 lanes (VDPBF16PS: round to nearest even, denormal
 * inputs and outputs as 0) */
static inline lkv_f32 lkv_dot2(lkv_f32 acc, lkv_bits a, lkv_bits b) {
    return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}
/* lo, hi (W f32 each) as 2W bf16 in that order, round to nearest even (VCVTNE2PS2BF16:
 * denormals to 0, NaN quieted) */
static inline lkv_bits lkv_bf16_pack_rne(lkv_f32 lo, lkv_f32 hi) { return (lkv_bits)_mm512_cvtne2ps_pbh(hi, lo); }
/* the 16-bit elements of a and b interleaved: lo = a0 b0 a1 b1 .. a(W-1) b(W-1), hi =
 * aW bW .. a(2W-1) b(2W-1) */
static inline void lkv_zip16(lkv_bits a, lkv_bits b, lkv_bits *lo, lkv_bits *hi) {
    static const uint16_t idx[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                     8,  40, 9,  41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
    __m512i il = _mm512_loadu_si512(idx);
    *lo = _mm512_permutex2var_epi16(a, il, b);
    *hi = _mm512_permutex2var_epi16(a, _mm512_add_epi16(il, _mm512_set1_epi16(16)), b);
}
static inline lkv_bits lkv_bits_set1(uint32_t w) { return _mm512_set1_epi32((int)w); }
/* the first n (0 <= n <= 2W) 16-bit values at p, the rest 0 */
static inline lkv_bits lkv_bits_load16(const void *p, int64_t n) {
    return _mm512_maskz_loadu_epi16(n >= 32 ? ~(__mmask32)0 : (((__mmask32)1 << n) - 1), p);
}
/* lo | hi as one vector */
static inline lkv_bits lkv_bits_join32(lkv_c32 lo, lkv_c32 hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }

/* fp8 -> bf16 tables: the low and high bytes of lk_f32_to_bf16(lk_f8e4m3_to_f32(code)) /
 * lk_f8e5m2_to_f32 for the magnitudes code = 0..127 (every fp8 value is a bf16 value;
 * test_vec_avx512bf16 checks all 256 codes against the scalar converters) */
static const uint8_t lkv__f8bf_e4m3_lo[128] = {
    0x00, 0x00, 0x80, 0xc0, 0x00, 0x20, 0x40, 0x60, 0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xc0};
static const uint8_t lkv__f8bf_e4m3_hi[128] = {
    0x00, 0x3b, 0x3b, 0x3b, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c,
    0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d,
    0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e,
    0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f,
    0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40,
    0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41,
    0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42,
    0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x7f};
static const uint8_t lkv__f8bf_e5m2_lo[128] = {
    0x00, 0x80, 0x00, 0x40, 0x80, 0xa0, 0xc0, 0xe0, 0x00, 0x20, 0x40, 0x60, 0x80, 0xa0, 0xc0, 0xe0,
    0x00, 0x20, 0x40, 0x60, 0x80, 0xa0, 0xc0, 0xe0, 0x00, 0x20, 0x40, 0x60, 0x80, 0xa0, 0xc0, 0xe0,
    0x00, 0x20, 0x40, 0x60, 0x80, 0xa0, 0xc0, 0xe0, 0x00, 0x20, 0x40, 0x60, 0x80, 0xa0, 0xc0, 0xe0,
    0x00, 0x20, 0x40, 0x60, 0x80, 0xa0, 0xc0, 0xe0, 0x00, 0x20, 0x40, 0x60, 0x80, 0xa0, 0xc0, 0xe0,
    0x00, 0x20, 0x40, 0x60, 0x80, 0xa0, 0xc0, 0xe0, 0x00, 0x20, 0x40, 0x60, 0x80, 0xa0, 0xc0, 0xe0,
    0x00, 0x20, 0x40, 0x60, 0x80, 0xa0, 0xc0, 0xe0, 0x00, 0x20, 0x40, 0x60, 0x80, 0xa0, 0xc0, 0xe0,
    0x00, 0x20, 0x40, 0x60, 0x80, 0xa0, 0xc0, 0xe0, 0x00, 0x20, 0x40, 0x60, 0x80, 0xa0, 0xc0, 0xe0,
    0x00, 0x20, 0x40, 0x60, 0x80, 0xa0, 0xc0, 0xe0, 0x00, 0x20, 0x40, 0x60, 0x80, 0xe0, 0xc0, 0xe0};
static const uint8_t lkv__f8bf_e5m2_hi[128] = {
    0x00, 0x37, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38, 0x39, 0x39, 0x39, 0x39, 0x39, 0x39, 0x39, 0x39,
    0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3a, 0x3b, 0x3b, 0x3b, 0x3b, 0x3b, 0x3b, 0x3b, 0x3b,
    0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d,
    0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f,
    0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41,
    0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43,
    0x44, 0x44, 0x44, 0x44, 0x44, 0x44, 0x44, 0x44, 0x45, 0x45, 0x45, 0x45, 0x45, 0x45, 0x45, 0x45,
    0x46, 0x46, 0x46, 0x46, 0x46, 0x46, 0x46, 0x46, 0x47, 0x47, 0x47, 0x47, 0x7f, 0x7f, 0x7f, 0x7f};
static const uint8_t lkv__f8bf_zip[64] = {
    0,  64, 1,  65, 2,  66, 3,  67, 4,  68, 5,  69, 6,  70, 7,  71, 8,  72, 9,  73, 10, 74,
    11, 75, 12, 76, 13, 77, 14, 78, 15, 79, 16, 80, 17, 81, 18, 82, 19, 83, 20, 84, 21, 85,
    22, 86, 23, 87, 24, 88, 25, 89, 26, 90, 27, 91, 28, 92, 29, 93, 30, 94, 31, 95};
/* 32 fp8 codes (LK_F8E4M3 / LK_F8E5M2) -> their 32 bf16 values, in order, exact: two
 * 128-entry byte lookups of the magnitude (VPERMI2B, AVX512_VBMI: part of the avx512bf16
 * row) for the low and high bytes, the code's sign ORed into the high byte, the bytes
 * zipped into words (4 instructions for 32 values) */
static inline lkv_bits lkv_f8_to_bf16(__m256i codes, lk_dtype dt) {
    const uint8_t *lo = dt == LK_F8E4M3 ? lkv__f8bf_e4m3_lo : lkv__f8bf_e5m2_lo;
    const uint8_t *hi = dt == LK_F8E4M3 ? lkv__f8bf_e4m3_hi : lkv__f8bf_e5m2_hi;
    __m512i c = _mm512_zextsi256_si512(codes);
    __m512i l = _mm512_permutex2var_epi8(_mm512_loadu_si512(lo), c, _mm512_loadu_si512(lo + 64));
    __m512i h = _mm512_permutex2var_epi8(_mm512_loadu_si512(hi), c, _mm512_loadu_si512(hi + 64));
    h = _mm512_ternarylogic_epi32(h, c, _mm512_set1_epi8((char)0x80), 0xf8); /* h | (c & 0x80) */
    return _mm512_permutex2var_epi8(l, _mm512_loadu_si512(lkv__f8bf_zip), h);
}
/* 64 fp8 codes -> their 64 bf16 values in two vectors, exact, in the order of the in-lane
 * byte unpack (3 instructions per 32 values, for dot products whose other operand is
 * arranged alike): in 128-bit lane L (0..3), *w0 holds the values of codes 16 L + i and
 * *w1 those of codes 16 L + 8 + i, i = 0..7 */
static inline void lkv_f8_to_bf16_x2(__m512i c, lk_dtype dt, lkv_bits *w0, lkv_bits *w1) {
    const uint8_t *lo = dt == LK_F8E4M3 ? lkv__f8bf_e4m3_lo : lkv__f8bf_e5m2_lo;
    const uint8_t *hi = dt == LK_F8E4M3 ? lkv__f8bf_e4m3_hi : lkv__f8bf_e5m2_hi;
    __m512i l = _mm512_permutex2var_epi8(_mm512_loadu_si512(lo), c, _mm512_loadu_si512(lo + 64));
    __m512i h = _mm512_permutex2var_epi8(_mm512_loadu_si512(hi), c, _mm512_loadu_si512(hi + 64));
    h = _mm512_ternarylogic_epi32(h, c, _mm512_set1_epi8((char)0x80), 0xf8); /* h | (c & 0x80) */
    *w0 = _mm512_unpacklo_epi8(l, h);
    *w1 = _mm512_unpackhi_epi8(l, h);
}
#endif

#if defined(LKV_AMX) /* ------------------------------------ AMX tiles (palette 1) */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16]; /* bytes per row of tile t */
    uint8_t rows[16];
} lkv_amx_cfg;

/* LDTILECFG of the whole 64-byte cfg. Not the _tile_loadconfig intrinsic: gcc 12 declares
 * its memory operand as 8 bytes, so once inlined the stores to colsb / rows could be
 * dropped as dead and a stale configuration loaded (#GP, or #UD at the first tile op) */
static inline void lkv_amx_load_config(const lkv_amx_cfg *cfg) { __asm__ volatile("ldtilecfg %0" ::"m"(*cfg)); }

/* palette 1, tiles 0-7 of 16 rows x 64 bytes (the caller narrows some, then loads it) */
static inline void lkv_amx_cfg_init(lkv_amx_cfg *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->palette = 1;
    for (int t = 0; t < 8; t++) cfg->colsb[t] = 64, cfg->rows[t] = 16;
}
#endif

static inline void lkv_store_f16(void *p, lkv_f32 v) { lkv__store_half(p, lkv__half(v, LK_F16)); }
static inline void lkv_store_bf16(void *p, lkv_f32 v) { lkv__store_half(p, lkv__half(v, LK_BF16)); }
/* non-temporal W 16-bit values; p aligned to 2W bytes */
static inline void lkv_stream_half(void *p, lk_dtype dt, lkv_f32 v) { lkv__stream_half(p, lkv__half(v, dt)); }
#if defined(LKV_AVX512) /* two 32-byte halves: ~5% faster than one 64-byte store on Zen 4
                         * (merge 4096 x 16 x 512 f32, in-process A/B; bf16 rows, which
                         * stream lkv_bits, measured the other way) */
static inline void lkv_stream_f32(float *p, lkv_f32 v) {
    _mm256_stream_ps(p, _mm512_castps512_ps256(v));
    _mm256_stream_ps(p + 8, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}
#else
static inline void lkv_stream_f32(float *p, lkv_f32 v) { LKV_X(stream_ps)(p, v); } /* p LKV_BYTES aligned */
#endif

/* lkv_bf16_split's inverse, rounded as lkv_bf16_bits_nonan: the even results shifted
 * down, blended with the odd ones' high halves */
static inline lkv_bits lkv_bf16_join_nonan(lkv_f32 even, lkv_f32 odd) {
    return lkv__blend_odd16(lkv_bf16_bits_nonan(even), lkv__bf16_high_nonan(odd));
}
/* W x W transpose of r[0..W) in place: 4 x 4 transposes within 128-bit lanes, then
 * across lanes */
static inline void lkv_transpose(lkv_f32 *r) {
    lkv_f32 t[LKV_W], u[LKV_W];
    for (int i = 0; i < LKV_W; i += 2) t[i] = LKV_X(unpacklo_ps)(r[i], r[i + 1]), t[i + 1] = LKV_X(unpackhi_ps)(r[i], r[i + 1]);
    for (int i = 0; i < LKV_W; i += 4) {
        u[i] = LKV_X(shuffle_ps)(t[i], t[i + 2], 0x44), u[i + 1] = LKV_X(shuffle_ps)(t[i], t[i + 2], 0xee);
        u[i + 2] = LKV_X(shuffle_ps)(t[i + 1], t[i + 3], 0x44), u[i + 3] = LKV_X(shuffle_ps)(t[i + 1], t[i + 3], 0xee);
    }
    lkv__transpose_lanes(u, r);
}

/* GPT-J pairs: x = even, y = odd elements of the 2W values v0 | v1, in the lane order
 * that lkv_pair_order gives a plain vector; lkv_interleave is the inverse */
static inline void lkv_deinterleave(lkv_f32 v0, lkv_f32 v1, lkv_f32 *x, lkv_f32 *y) {
    *x = LKV_X(shuffle_ps)(v0, v1, _MM_SHUFFLE(2, 0, 2, 0));
    *y = LKV_X(shuffle_ps)(v0, v1, _MM_SHUFFLE(3, 1, 3, 1));
}
static inline void lkv_interleave(lkv_f32 x, lkv_f32 y, lkv_f32 *v0, lkv_f32 *v1) {
    *v0 = LKV_X(unpacklo_ps)(x, y);
    *v1 = LKV_X(unpackhi_ps)(x, y);
}

/* a to pa and b to pb, both of dtype dt: bf16 with one pack and one permute */
static inline void lkv_store2(void *pa, void *pb, lk_dtype dt, lkv_f32 a, lkv_f32 b) {
    if (dt == LK_F32) {
        lkv_storeu(pa, a), lkv_storeu(pb, b);
    } else if (dt == LK_F16) {
        lkv_store_f16(pa, a), lkv_store_f16(pb, b);
    } else {
        lkv_bits ab = lkv__pack2_bf16(a, b);
        lkv__store_half(pa, lkv__low_half(ab));
        lkv__store_half(pb, lkv__high_half(ab));
    }
}

#endif
