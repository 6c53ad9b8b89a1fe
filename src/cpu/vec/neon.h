/*
 * Vector layer, aarch64 Advanced SIMD (-DLKV_NEON: 4 f32 lanes, 32 128-bit v registers).
 * The primitives that src/cpu/vec/lkv.h builds on (see there for the contract of each);
 * included only through lkv.h, by the SIMD sources compiled for NEON. Advanced SIMD is
 * part of every aarch64 CPU (ARMv8.0), so nothing here needs more than -march=armv8-a.
 *
 * What differs from x86.h:
 *  - max / min keep the x86 rule (a > b ? a : b: a NaN in a gives b, equal zeros give b)
 *    with a compare and a bit select, not FMAX / FMIN (which return the NaN);
 *  - f16 <-> f32 is FCVTL / FCVTN, half <-> single conversions of ARMv8.0 Advanced SIMD
 *    (the ARMv8.2 FP16 extension, HWCAP fphp / asimdhp, adds half-precision arithmetic,
 *    which no kernel uses): round to nearest even under the default FPCR (Linux starts
 *    processes with RMode = RN, FZ = 0, DN = 0, AHP = 0), subnormals kept, NaNs quieted
 *    with their top mantissa bits, i.e. the bits of src/core/half.h (test_vec_neon
 *    checks 17M f32 patterns and every 16-bit one);
 *  - bf16 is the integer round-to-nearest-even of src/core/half.h, as on x86 (BFCVTN of
 *    FEAT_BF16 is optional and not used);
 *  - lane masks are all-ones / all-zeros lanes (uint32x4_t), tails go through a small
 *    stack buffer like AVX2's;
 *  - a plain vector is already in pair order (UZP1 / UZP2 deinterleave in memory order),
 *    so lkv_pair_order is the identity;
 *  - streaming stores: the 32-byte moves (lkv_c32_stream: NZ chunks, cache copies) are
 *    STNP pairs, the 16-byte ones plain stores; lkv_sfence is DMB ISHST.
 */
#ifndef LKV_NEON_H
#define LKV_NEON_H

#include <arm_neon.h>
#include <string.h>

#include "../../core/half.h"

#define LKV_W 4   /* f32 lanes */
#define LKV_MR 12 /* attention micro-kernel rows, 2 vectors each: 24 of 32 v registers accumulate */
#define LKV_FN(name) lk_neon_##name
#define LKV_BYTES (4 * LKV_W)
typedef float32x4_t lkv_f32;
typedef int32x4_t lkv_i32;
typedef uint32x4_t lkv_m;   /* lane mask: all ones / all zeros per lane */
typedef int32x4_t lkv_bits; /* LKV_BYTES raw bytes */
typedef uint8x16x2_t lkv_c32; /* 32 raw bytes (an NZ chunk of 16-bit values) */

/* ---- f32 arithmetic ---- */
static inline lkv_f32 lkv_zero(void) { return vdupq_n_f32(0.0f); }
static inline lkv_f32 lkv_set1(float x) { return vdupq_n_f32(x); }
static inline lkv_f32 lkv_loadu(const float *p) { return vld1q_f32(p); }
static inline void lkv_storeu(float *p, lkv_f32 v) { vst1q_f32(p, v); }
static inline lkv_f32 lkv_add(lkv_f32 a, lkv_f32 b) { return vaddq_f32(a, b); }
static inline lkv_f32 lkv_sub(lkv_f32 a, lkv_f32 b) { return vsubq_f32(a, b); }
static inline lkv_f32 lkv_mul(lkv_f32 a, lkv_f32 b) { return vmulq_f32(a, b); }
static inline lkv_f32 lkv_div(lkv_f32 a, lkv_f32 b) { return vdivq_f32(a, b); }
static inline lkv_f32 lkv_fma(lkv_f32 a, lkv_f32 b, lkv_f32 c) { return vfmaq_f32(c, a, b); }
static inline lkv_f32 lkv_fnma(lkv_f32 a, lkv_f32 b, lkv_f32 c) { return vfmsq_f32(c, a, b); }
static inline lkv_m lkv_lt(lkv_f32 a, lkv_f32 b) { return vcltq_f32(a, b); }
static inline lkv_m lkv_gt(lkv_f32 a, lkv_f32 b) { return vcgtq_f32(a, b); }
static inline lkv_m lkv_unord(lkv_f32 a, lkv_f32 b) { return vmvnq_u32(vandq_u32(vceqq_f32(a, a), vceqq_f32(b, b))); }
static inline lkv_f32 lkv_blend(lkv_f32 a, lkv_f32 b, lkv_m m) { return vbslq_f32(m, b, a); }
static inline lkv_f32 lkv_max(lkv_f32 a, lkv_f32 b) { return vbslq_f32(vcgtq_f32(a, b), a, b); }
static inline lkv_f32 lkv_min(lkv_f32 a, lkv_f32 b) { return vbslq_f32(vcltq_f32(a, b), a, b); }
static inline lkv_f32 lkv__bitop(uint32x4_t r) { return vreinterpretq_f32_u32(r); }
#define LKV__U(v) vreinterpretq_u32_f32(v)
static inline lkv_f32 lkv_and(lkv_f32 a, lkv_f32 b) { return lkv__bitop(vandq_u32(LKV__U(a), LKV__U(b))); }
static inline lkv_f32 lkv_or(lkv_f32 a, lkv_f32 b) { return lkv__bitop(vorrq_u32(LKV__U(a), LKV__U(b))); }
static inline lkv_f32 lkv_andnot(lkv_f32 a, lkv_f32 b) { return lkv__bitop(vbicq_u32(LKV__U(b), LKV__U(a))); } /* ~a & b */
static inline lkv_f32 lkv_round(lkv_f32 a) { return vrndnq_f32(a); }
static inline float lkv_hsum(lkv_f32 v) { return vaddvq_f32(v); }
/* max of the 4 lanes in the order of x86's last stage (lanes 0 / 2 and 1 / 3, then the two) */
static inline float lkv_hmax(lkv_f32 v) {
    lkv_f32 s = lkv_max(v, vextq_f32(v, v, 2));
    return vgetq_lane_f32(lkv_max(s, vdupq_laneq_f32(s, 1)), 0);
}

/* ---- masks ---- */
static inline lkv_m lkv_m_none(void) { return vdupq_n_u32(0); }
static inline lkv_m lkv_m_or(lkv_m a, lkv_m b) { return vorrq_u32(a, b); }
static inline int lkv_m_any(lkv_m m) { return vmaxvq_u32(m) != 0; }
static inline lkv_m lkv_m_first(int64_t n) { /* lanes [0, n) */
    static const int32_t idx[4] = {0, 1, 2, 3};
    return vcltq_s32(vld1q_s32(idx), vdupq_n_s32((int32_t)(n < 4 ? n : 4)));
}
static inline lkv_f32 lkv_maskz(lkv_m m, lkv_f32 a) { return lkv__bitop(vandq_u32(m, LKV__U(a))); }
static inline lkv_f32 lkv_zero_where(lkv_m m, lkv_f32 a) { return lkv__bitop(vbicq_u32(LKV__U(a), m)); }

/* ---- int32 lanes, raw bytes ---- */
static inline lkv_i32 lkv_as_i32(lkv_f32 v) { return vreinterpretq_s32_f32(v); }
static inline lkv_f32 lkv_as_f32(lkv_i32 v) { return vreinterpretq_f32_s32(v); }
static inline lkv_i32 lkv_cvt_i32(lkv_f32 v) { return vcvtnq_s32_f32(v); } /* nearest, ties to even */
static inline lkv_i32 lkv_cvtt_i32(lkv_f32 v) { return vcvtq_s32_f32(v); }  /* toward zero */
static inline lkv_i32 lkv_i32_set1(int x) { return vdupq_n_s32(x); }
static inline lkv_i32 lkv_i32_add(lkv_i32 a, lkv_i32 b) { return vaddq_s32(a, b); }
static inline lkv_i32 lkv_i32_sub(lkv_i32 a, lkv_i32 b) { return vsubq_s32(a, b); }
static inline lkv_i32 lkv_i32_and(lkv_i32 a, lkv_i32 b) { return vandq_s32(a, b); }
/* shift counts are constants: 0..31 left, 1..32 right */
#define lkv_i32_slli(v, n) vshlq_n_s32((v), (n))
#define lkv_i32_srli(v, n) vreinterpretq_s32_u32(vshrq_n_u32(vreinterpretq_u32_s32(v), (n)))
#define lkv_i32_srai(v, n) vshrq_n_s32((v), (n))
static inline lkv_i32 lkv_i32_or(lkv_i32 a, lkv_i32 b) { return vorrq_s32(a, b); }
static inline lkv_i32 lkv_i32_min(lkv_i32 a, lkv_i32 b) { return vminq_s32(a, b); } /* signed */
static inline lkv_f32 lkv_i32_cvt_f32(lkv_i32 v) { return vcvtq_f32_s32(v); }
static inline lkv_m lkv_i32_gt(lkv_i32 a, lkv_i32 b) { return vcgtq_s32(a, b); } /* signed */
static inline lkv_i32 lkv_i32_blend(lkv_i32 a, lkv_i32 b, lkv_m m) { return vbslq_s32(m, b, a); }
/* W bytes zero-extended into the lanes / the low byte (0..255) of each lane stored (W
 * bytes); _part: the first n (0 <= n <= W), other lanes 0 / not written */
static inline lkv_i32 lkv_u8_load_part(const void *p, int64_t n) {
    uint8_t b[8] = {0};
    memcpy(b, p, (size_t)n);
    return vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(vmovl_u8(vld1_u8(b)))));
}
static inline lkv_i32 lkv_u8_load(const void *p) {
    uint32_t w;
    memcpy(&w, p, 4);
    return vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(vmovl_u8(vcreate_u8(w)))));
}
static inline void lkv_u8_store_part(void *p, lkv_i32 v, int64_t n) {
    uint16x4_t h = vmovn_u32(vreinterpretq_u32_s32(v));
    uint8_t b[8];
    vst1_u8(b, vmovn_u16(vcombine_u16(h, h)));
    memcpy(p, b, (size_t)n);
}
static inline void lkv_u8_store(void *p, lkv_i32 v) {
    uint16x4_t h = vmovn_u32(vreinterpretq_u32_s32(v));
    uint32_t w = vget_lane_u32(vreinterpret_u32_u8(vmovn_u16(vcombine_u16(h, h))), 0);
    memcpy(p, &w, 4);
}
/* raw bytes through byte loads and stores: any alignment */
static inline lkv_bits lkv_bits_loadu(const void *p) { return vreinterpretq_s32_u8(vld1q_u8((const uint8_t *)p)); }
static inline void lkv_bits_storeu(void *p, lkv_bits v) { vst1q_u8((uint8_t *)p, vreinterpretq_u8_s32(v)); }
static inline void lkv_bits_stream(void *p, lkv_bits v) { lkv_bits_storeu(p, v); }
static inline lkv_c32 lkv_c32_loadu(const void *p) { return vld1q_u8_x2((const uint8_t *)p); }
static inline void lkv_c32_storeu(void *p, lkv_c32 v) { vst1q_u8_x2((uint8_t *)p, v); }
static inline void lkv_c32_stream(void *p, lkv_c32 v) { /* 32-byte aligned: one non-temporal pair */
    __asm__ volatile("stnp %q1, %q2, [%0]" : : "r"(p), "w"(v.val[0]), "w"(v.val[1]) : "memory");
}
static inline void lkv_sfence(void) { __asm__ volatile("dmb ishst" : : : "memory"); }

/* ---- f16 / bf16 ---- */
static inline uint16x4_t lkv__load_half(const void *p) { return vreinterpret_u16_u8(vld1_u8((const uint8_t *)p)); }
static inline void lkv__store_half(void *p, uint16x4_t v) { vst1_u8((uint8_t *)p, vreinterpret_u8_u16(v)); }

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
static inline lkv_i32 lkv_bf16_bits(lkv_f32 v) { /* NaNs quieted as lk_f32_to_bf16 */
    lkv_i32 nan = vorrq_s32(lkv_i32_srli(lkv_as_i32(v), 16), lkv_i32_set1(0x40));
    return vbslq_s32(lkv_unord(v, v), nan, lkv_bf16_bits_nonan(v));
}
static inline uint16x4_t lkv__half(lkv_f32 v, lk_dtype dt) {
    if (dt == LK_F16) return vreinterpret_u16_f16(vcvt_f16_f32(v));
    return vmovn_u32(vreinterpretq_u32_s32(lkv_bf16_bits(v)));
}

/* 2W bf16 values of one lkv_bits in even / odd order (element 2i is the low half of lane
 * i, 2i + 1 the high half): the even ones shifted up, the odd ones masked */
static inline void lkv_bf16_split(lkv_bits v, lkv_f32 *even, lkv_f32 *odd) {
    *even = lkv_as_f32(lkv_i32_slli(v, 16));
    *odd = lkv_as_f32(lkv_i32_and(v, lkv_i32_set1((int)0xffff0000u)));
}
/* the inverse, rounded as lkv_bf16_bits_nonan: the even results' low halves, the odd
 * ones' high halves */
static inline lkv_bits lkv_bf16_join_nonan(lkv_f32 even, lkv_f32 odd) {
    return vbslq_s32(vdupq_n_u32(0xffff0000u), lkv__bf16_high_nonan(odd), lkv_bf16_bits_nonan(even));
}

static inline lkv_f32 lkv_load_f16(const void *p) { return vcvt_f32_f16(vreinterpret_f16_u16(lkv__load_half(p))); }
static inline lkv_f32 lkv_load_bf16(const void *p) { return vreinterpretq_f32_u32(vshll_n_u16(lkv__load_half(p), 16)); }
static inline void lkv_store_f16(void *p, lkv_f32 v) { lkv__store_half(p, lkv__half(v, LK_F16)); }
static inline void lkv_store_bf16(void *p, lkv_f32 v) { lkv__store_half(p, lkv__half(v, LK_BF16)); }

/* ---- tails: first n (0 <= n <= W) elements through a small stack buffer; other lanes 0
 * / not written ---- */
static inline lkv_f32 lkv__load_part_fh(const void *p, lk_dtype dt, int64_t n) {
    if (dt == LK_F32) {
        float buf[4] = {0};
        memcpy(buf, p, (size_t)n * 4);
        return vld1q_f32(buf);
    }
    uint16_t h[4] = {0};
    memcpy(h, p, (size_t)n * 2);
    return dt == LK_F16 ? lkv_load_f16(h) : lkv_load_bf16(h);
}
static inline void lkv__store_part_fh(void *p, lk_dtype dt, lkv_f32 v, int64_t n) {
    if (dt == LK_F32) {
        float buf[4];
        vst1q_f32(buf, v);
        memcpy(p, buf, (size_t)n * 4);
        return;
    }
    uint16_t h[4];
    vst1_u16(h, lkv__half(v, dt));
    memcpy(p, h, (size_t)n * 2);
}

/* ---- streaming (plain stores at this width) ---- */
static inline void lkv_stream_f32(float *p, lkv_f32 v) { vst1q_f32(p, v); }
static inline void lkv_stream_half(void *p, lk_dtype dt, lkv_f32 v) { lkv__store_half(p, lkv__half(v, dt)); }

/* ---- shuffles ---- */
/* GPT-J pairs: UZP1 / UZP2 give the even / odd elements in memory order, so the pair
 * order of a plain vector is itself */
static inline lkv_f32 lkv_pair_order(lkv_f32 v) { return v; }
static inline void lkv_deinterleave(lkv_f32 v0, lkv_f32 v1, lkv_f32 *x, lkv_f32 *y) {
    *x = vuzp1q_f32(v0, v1);
    *y = vuzp2q_f32(v0, v1);
}
static inline void lkv_interleave(lkv_f32 x, lkv_f32 y, lkv_f32 *v0, lkv_f32 *v1) {
    *v0 = vzip1q_f32(x, y);
    *v1 = vzip2q_f32(x, y);
}

/* a to pa and b to pb, both of dtype dt */
static inline void lkv_store2(void *pa, void *pb, lk_dtype dt, lkv_f32 a, lkv_f32 b) {
    if (dt == LK_F32) {
        vst1q_f32(pa, a), vst1q_f32(pb, b);
    } else {
        lkv__store_half(pa, lkv__half(a, dt));
        lkv__store_half(pb, lkv__half(b, dt));
    }
}

/* 4 x 4 transpose of r[0..4) in place: TRN1 / TRN2 of row pairs, then their 64-bit halves */
static inline void lkv_transpose(lkv_f32 *r) {
    float64x2_t t0 = vreinterpretq_f64_f32(vtrn1q_f32(r[0], r[1])), t1 = vreinterpretq_f64_f32(vtrn2q_f32(r[0], r[1]));
    float64x2_t t2 = vreinterpretq_f64_f32(vtrn1q_f32(r[2], r[3])), t3 = vreinterpretq_f64_f32(vtrn2q_f32(r[2], r[3]));
    r[0] = vreinterpretq_f32_f64(vzip1q_f64(t0, t2)), r[1] = vreinterpretq_f32_f64(vzip1q_f64(t1, t3));
    r[2] = vreinterpretq_f32_f64(vzip2q_f64(t0, t2)), r[3] = vreinterpretq_f32_f64(vzip2q_f64(t1, t3));
}

#undef LKV__U
#endif
