/*
 * AVX-512 emulated on an AVX2 CPU, for test builds only (cmake -DLLMKERN_EMULATE_AVX512=ON;
 * `make test`'s sanitizer build on CPUs without AVX-512): x86.h includes this instead of
 * <immintrin.h> when a source is compiled with -DLKV_EMULATE, so that the avx512 and
 * avx512bf16 rows' kernels run, against the scalar reference and under the sanitizers, on
 * any x86-64 CPU with AVX2. Correctness only: an emulated kernel's speed means nothing.
 *
 * SIMDe (SIMD Everywhere, Debian's libsimde-dev) provides most of AVX-512F/BW/DQ/VL and
 * VBMI under the intrinsics' own names (native aliases). Written below, one lane at a
 * time to each instruction's documented semantics: the intrinsics the packaged SIMDe
 * lacks, and VDPBF16PS (whose rounding SIMDe does not follow). The masked loads and
 * stores touch only the enabled elements, as the instructions do (a kernel's tail may end
 * at the last byte of a buffer, and the sanitizers see every element touched).
 */
#ifndef LKV_X86_EMU_H
#define LKV_X86_EMU_H

#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

/* lanes in and out of a vector: copies, never type punning */
#define LKV_EMU_GET(arr, v) memcpy((arr), &(v), sizeof(v))
#define LKV_EMU_SET(v, arr) memcpy(&(v), (arr), sizeof(v))

/* ---- masked loads and stores: only the elements whose mask bit is set are touched ---- */
#define LKV_EMU_MASKZ_LOAD(name, vt, et, n, mt)                                                    \
    static inline vt name(mt k, void const *p) {                                                  \
        et e[n];                                                                                  \
        for (int i = 0; i < (n); i++) {                                                           \
            e[i] = 0;                                                                             \
            if ((k >> i) & 1) memcpy(&e[i], (const char *)p + (size_t)i * sizeof(et), sizeof(et)); \
        }                                                                                         \
        vt r;                                                                                     \
        LKV_EMU_SET(r, e);                                                                        \
        return r;                                                                                 \
    }
#define LKV_EMU_MASK_STORE(name, vt, et, n, mt)                                           \
    static inline void name(void *p, mt k, vt a) {                                       \
        et e[n];                                                                         \
        LKV_EMU_GET(e, a);                                                               \
        for (int i = 0; i < (n); i++)                                                    \
            if ((k >> i) & 1) memcpy((char *)p + (size_t)i * sizeof(et), &e[i], sizeof(et)); \
    }
LKV_EMU_MASKZ_LOAD(lkv_emu_mm512_maskz_loadu_ps, __m512, float, 16, __mmask16)
LKV_EMU_MASKZ_LOAD(lkv_emu_mm512_maskz_loadu_epi16, __m512i, uint16_t, 32, __mmask32)
LKV_EMU_MASKZ_LOAD(lkv_emu_mm256_maskz_loadu_epi16, __m256i, uint16_t, 16, __mmask16)
LKV_EMU_MASKZ_LOAD(lkv_emu_mm256_maskz_loadu_epi8, __m256i, uint8_t, 32, __mmask32)
LKV_EMU_MASKZ_LOAD(lkv_emu_mm_maskz_loadu_epi8, __m128i, uint8_t, 16, __mmask16)
LKV_EMU_MASK_STORE(lkv_emu_mm512_mask_storeu_ps, __m512, float, 16, __mmask16)
LKV_EMU_MASK_STORE(lkv_emu_mm512_mask_storeu_epi16, __m512i, uint16_t, 32, __mmask32)
LKV_EMU_MASK_STORE(lkv_emu_mm256_mask_storeu_epi16, __m256i, uint16_t, 16, __mmask16)
#undef _mm512_maskz_loadu_ps
#define _mm512_maskz_loadu_ps lkv_emu_mm512_maskz_loadu_ps
#undef _mm512_maskz_loadu_epi16
#define _mm512_maskz_loadu_epi16 lkv_emu_mm512_maskz_loadu_epi16
#undef _mm256_maskz_loadu_epi16
#define _mm256_maskz_loadu_epi16 lkv_emu_mm256_maskz_loadu_epi16
#undef _mm256_maskz_loadu_epi8
#define _mm256_maskz_loadu_epi8 lkv_emu_mm256_maskz_loadu_epi8
#undef _mm_maskz_loadu_epi8
#define _mm_maskz_loadu_epi8 lkv_emu_mm_maskz_loadu_epi8
#undef _mm512_mask_storeu_ps
#define _mm512_mask_storeu_ps lkv_emu_mm512_mask_storeu_ps
#undef _mm512_mask_storeu_epi16
#define _mm512_mask_storeu_epi16 lkv_emu_mm512_mask_storeu_epi16
#undef _mm256_mask_storeu_epi16
#define _mm256_mask_storeu_epi16 lkv_emu_mm256_mask_storeu_epi16

/* VPMOVDB with a mask: the low byte of each enabled 32-bit lane */
static inline void lkv_emu_mm512_mask_cvtepi32_storeu_epi8(void *p, __mmask16 k, __m512i a) {
    int32_t e[16];
    LKV_EMU_GET(e, a);
    for (int i = 0; i < 16; i++)
        if ((k >> i) & 1) ((uint8_t *)p)[i] = (uint8_t)e[i];
}
#undef _mm512_mask_cvtepi32_storeu_epi8
#define _mm512_mask_cvtepi32_storeu_epi8 lkv_emu_mm512_mask_cvtepi32_storeu_epi8
static inline void lkv_emu_mm512_stream_si512(void *p, __m512i a) { memcpy(p, &a, sizeof a); }
#undef _mm512_stream_si512
#define _mm512_stream_si512 lkv_emu_mm512_stream_si512

/* ---- conversions ---- */
/* a conversion lane by lane: out lane i = conv(lane i of a), 16 lanes */
#define LKV_EMU_CVT16(name, rt, ret, at, aet, conv) \
    static inline rt name(at a) {                   \
        aet e[16];                                  \
        ret r[16];                                  \
        LKV_EMU_GET(e, a);                          \
        for (int i = 0; i < 16; i++) r[i] = conv(e[i]); \
        rt v;                                       \
        LKV_EMU_SET(v, r);                          \
        return v;                                   \
    }
/* VCVTPS2DQ: f32 -> int32 under the current rounding mode (nearest even: no kernel changes
 * it); NaN and out-of-range values give the integer indefinite 0x80000000 */
static inline int32_t lkv_emu_f32_i32(float f) {
    float x = nearbyintf(f);
    return (x >= -2147483648.0f && x < 2147483648.0f) ? (int32_t)x : INT32_MIN;
}
#define LKV_EMU_AS(t) (t) /* C's conversion: int32 -> f32 rounds as VCVTDQ2PS; to narrower ints truncates as VPMOV*; widening zero-extends */
LKV_EMU_CVT16(lkv_emu_mm512_cvtps_epi32, __m512i, int32_t, __m512, float, lkv_emu_f32_i32)
LKV_EMU_CVT16(lkv_emu_mm512_cvtepi32_ps, __m512, float, __m512i, int32_t, LKV_EMU_AS(float))        /* VCVTDQ2PS */
LKV_EMU_CVT16(lkv_emu_mm512_cvtepi32_epi16, __m256i, uint16_t, __m512i, int32_t, LKV_EMU_AS(uint16_t)) /* VPMOVDW */
LKV_EMU_CVT16(lkv_emu_mm512_cvtepi32_epi8, __m128i, uint8_t, __m512i, int32_t, LKV_EMU_AS(uint8_t))   /* VPMOVDB */
LKV_EMU_CVT16(lkv_emu_mm512_cvtepu16_epi32, __m512i, int32_t, __m256i, uint16_t, LKV_EMU_AS(int32_t)) /* VPMOVZXWD */
LKV_EMU_CVT16(lkv_emu_mm512_cvtepu8_epi32, __m512i, int32_t, __m128i, uint8_t, LKV_EMU_AS(int32_t))   /* VPMOVZXBD */
/* VPMOVZXBW: 32 bytes zero-extended to 32 words */
static inline __m512i lkv_emu_mm512_cvtepu8_epi16(__m256i a) {
    uint8_t e[32];
    uint16_t r[32];
    LKV_EMU_GET(e, a);
    for (int i = 0; i < 32; i++) r[i] = e[i];
    __m512i v;
    LKV_EMU_SET(v, r);
    return v;
}
/* VCVTPH2PS / VCVTPS2PH: the two 256-bit halves through F16C (the same rounding and NaN
 * rules); imm is the rounding control, a constant at every call */
static inline __m512 lkv_emu_mm512_cvtph_ps(__m256i a) {
    __m128i h[2];
    __m256 r[2];
    LKV_EMU_GET(h, a);
    r[0] = _mm256_cvtph_ps(h[0]);
    r[1] = _mm256_cvtph_ps(h[1]);
    __m512 v;
    LKV_EMU_SET(v, r);
    return v;
}
#undef _mm512_cvtepi32_ps
#define _mm512_cvtepi32_ps lkv_emu_mm512_cvtepi32_ps
#undef _mm512_cvtps_epi32
#define _mm512_cvtps_epi32 lkv_emu_mm512_cvtps_epi32
#undef _mm512_cvtepi32_epi16
#define _mm512_cvtepi32_epi16 lkv_emu_mm512_cvtepi32_epi16
#undef _mm512_cvtepi32_epi8
#define _mm512_cvtepi32_epi8 lkv_emu_mm512_cvtepi32_epi8
#undef _mm512_cvtepu16_epi32
#define _mm512_cvtepu16_epi32 lkv_emu_mm512_cvtepu16_epi32
#undef _mm512_cvtepu8_epi32
#define _mm512_cvtepu8_epi32 lkv_emu_mm512_cvtepu8_epi32
#undef _mm512_cvtepu8_epi16
#define _mm512_cvtepu8_epi16 lkv_emu_mm512_cvtepu8_epi16
#undef _mm512_cvtph_ps
#define _mm512_cvtph_ps lkv_emu_mm512_cvtph_ps
#undef _mm512_cvtps_ph
#define _mm512_cvtps_ph(a, imm)                                                          \
    __extension__({                                                                     \
        __m256 lkv_emu_f_[2];                                                           \
        __m128i lkv_emu_h_[2];                                                          \
        __m512 lkv_emu_a_ = (a);                                                        \
        LKV_EMU_GET(lkv_emu_f_, lkv_emu_a_);                                            \
        lkv_emu_h_[0] = _mm256_cvtps_ph(lkv_emu_f_[0], (imm));                          \
        lkv_emu_h_[1] = _mm256_cvtps_ph(lkv_emu_f_[1], (imm));                          \
        __m256i lkv_emu_r_;                                                             \
        LKV_EMU_SET(lkv_emu_r_, lkv_emu_h_);                                            \
        lkv_emu_r_;                                                                     \
    })

/* VCVTNE2PS2BF16 (AVX512_BF16): bf16 of b in the low 16 elements, of a in the high 16;
 * round to nearest even, subnormal inputs and outputs flushed to zero (the instruction
 * ignores MXCSR), NaN quieted */
static inline uint16_t lkv_emu_bf16_rne_daz(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0) return (uint16_t)((u >> 16) & 0x8000u); /* zero / subnormal */
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline __m512bh lkv_emu_mm512_cvtne2ps_pbh(__m512 a, __m512 b) {
    float fa[16], fb[16];
    uint16_t r[32];
    LKV_EMU_GET(fa, a);
    LKV_EMU_GET(fb, b);
    for (int i = 0; i < 16; i++) {
        r[i] = lkv_emu_bf16_rne_daz(fb[i]);
        r[16 + i] = lkv_emu_bf16_rne_daz(fa[i]);
    }
    __m512bh v;
    LKV_EMU_SET(v, r);
    return v;
}
#undef _mm512_cvtne2ps_pbh
#define _mm512_cvtne2ps_pbh lkv_emu_mm512_cvtne2ps_pbh

/* VDPBF16PS (AVX512_BF16), as the instruction's pseudocode has it: per f32 lane, the odd
 * pair's product added first, then the even pair's, each addition rounded to nearest
 * even; subnormal inputs (bf16 values and the accumulator) read as 0 and subnormal
 * results flushed to 0, keeping their sign. (The packaged SIMDe's adds the even product
 * first and keeps subnormals.) */
static inline float lkv_emu_daz(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
    memcpy(&x, &u, 4);
    return x;
}
static inline float lkv_emu_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return lkv_emu_daz(x);
}
static inline __m512 lkv_emu_mm512_dpbf16_ps(__m512 acc, __m512bh a, __m512bh b) {
    float s[16];
    uint16_t ea[32], eb[32];
    LKV_EMU_GET(s, acc);
    LKV_EMU_GET(ea, a);
    LKV_EMU_GET(eb, b);
    for (int i = 0; i < 16; i++) {
        float t = lkv_emu_daz(s[i]);
        t = lkv_emu_daz(t + lkv_emu_bf16(ea[2 * i + 1]) * lkv_emu_bf16(eb[2 * i + 1]));
        s[i] = lkv_emu_daz(t + lkv_emu_bf16(ea[2 * i]) * lkv_emu_bf16(eb[2 * i]));
    }
    __m512 v;
    LKV_EMU_SET(v, s);
    return v;
}
#undef _mm512_dpbf16_ps
#define _mm512_dpbf16_ps lkv_emu_mm512_dpbf16_ps

/* ---- shifts and shuffles ---- */
/* VPSRAD by an immediate: counts above 31 fill with the sign */
static inline __m512i lkv_emu_mm512_srai_epi32(__m512i a, unsigned imm) {
    int32_t e[16];
    LKV_EMU_GET(e, a);
    for (int i = 0; i < 16; i++) e[i] = e[i] < 0 ? ~(~e[i] >> (imm > 31 ? 31 : imm)) : e[i] >> (imm > 31 ? 31 : imm);
    __m512i v;
    LKV_EMU_SET(v, e);
    return v;
}
/* VPERMILPS by an immediate: within each 128-bit lane, element i takes element imm[2i+1:2i] */
static inline __m512 lkv_emu_mm512_permute_ps(__m512 a, unsigned imm) {
    float e[16], r[16];
    LKV_EMU_GET(e, a);
    for (int i = 0; i < 16; i++) r[i] = e[(i & ~3) | ((imm >> (2 * (i & 3))) & 3)];
    __m512 v;
    LKV_EMU_SET(v, r);
    return v;
}
/* VSHUFF32X4: 128-bit lanes 0, 1 from a and 2, 3 from b, each chosen by two bits of imm */
static inline __m512 lkv_emu_mm512_shuffle_f32x4(__m512 a, __m512 b, unsigned imm) {
    float e[2][16], r[16];
    LKV_EMU_GET(e[0], a);
    LKV_EMU_GET(e[1], b);
    for (int l = 0; l < 4; l++) memcpy(r + 4 * l, e[l >> 1] + 4 * ((imm >> (2 * l)) & 3), 16);
    __m512 v;
    LKV_EMU_SET(v, r);
    return v;
}
static inline __m512i lkv_emu_mm512_zextsi256_si512(__m256i a) {
    __m256i h[2] = {a, _mm256_setzero_si256()};
    __m512i v;
    LKV_EMU_SET(v, h);
    return v;
}
#undef _mm512_srai_epi32
#define _mm512_srai_epi32 lkv_emu_mm512_srai_epi32
#undef _mm512_permute_ps
#define _mm512_permute_ps lkv_emu_mm512_permute_ps
#undef _mm512_shuffle_f32x4
#define _mm512_shuffle_f32x4 lkv_emu_mm512_shuffle_f32x4
#undef _mm512_zextsi256_si512
#define _mm512_zextsi256_si512 lkv_emu_mm512_zextsi256_si512

#endif
