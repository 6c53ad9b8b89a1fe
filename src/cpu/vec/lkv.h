/*
 * The vector layer: what the SIMD sources (src/cpu/simd/) are written against, once for
 * every vector ISA. A SIMD source is compiled once per ISA with that ISA's flags and its
 * macro (-DLKV_AVX2, -DLKV_AVX512, -DLKV_NEON), which selects the primitives below; everything else
 * here is built on those primitives and is the same for every ISA.
 *
 * Per ISA (src/cpu/vec/<arch>.h; x86.h serves AVX2 and AVX-512, neon.h aarch64): LKV_W f32 lanes of lkv_f32, int lanes lkv_i32, lane
 * masks lkv_m, LKV_BYTES raw bytes lkv_bits; LKV_MR (attention micro-kernel rows) and
 * LKV_FN(name) (the one generated name: a source's registration function).
 *   arithmetic  lkv_zero set1 loadu storeu add sub mul div fma (a b + c) fnma (c - a b)
 *               max min (x86 rule: a > b ? a : b, so a NaN in a yields b) and or andnot
 *               round (to nearest even) hsum hmax
 *   int lanes   lkv_as_i32 as_f32 cvt_i32 (round to nearest) cvtt_i32 (toward zero) i32_set1 add sub and
 *               slli srli srai
 *   masks       lkv_lt gt unord m_none m_or m_any m_first(n) blend(a, b, m) (m ? b : a)
 *               maskz(m, a) (m ? a : 0) zero_where(m, a) (m ? 0 : a)
 *   f16 / bf16  lkv_load_f16 load_bf16 store_f16 store_bf16 (round to nearest even,
 *               bit-identical to src/core/half.h, NaN quieted), lkv_bf16_bits (the bf16
 *               bits in each lane's low half) and _nonan (no NaN rule: exact for every
 *               value but NaNs whose low 16 bits are not 0)
 *   int lanes+  lkv_i32_or min (signed) gt (signed, a mask) blend(a, b, m) cvt_f32
 *   bytes       lkv_u8_load / _part (W bytes zero-extended into the lanes), lkv_u8_store /
 *               _part (the low byte of each lane)
 *   tails       lkv__load_part_fh / lkv__store_part_fh (f32/f16/bf16; lkv_load_part and
 *               lkv_store_part below add fp8)
 *   raw bytes   lkv_bits_loadu storeu stream (LKV_BYTES), lkv_c32_loadu storeu stream
 *               (32 bytes: one NZ chunk of 16-bit values)
 *   streaming   lkv_stream_f32, lkv_stream_half (aligned to the store's width),
 *               lkv_bits_stream / lkv_c32_stream (aligned to their size), lkv_sfence
 *   even / odd  lkv_bf16_split: 2W bf16 values of one lkv_bits as f32 in two vectors,
 *               elements 2i and 2i + 1 of the memory order in lane i (no shuffles);
 *               lkv_bf16_join_nonan: the inverse, rounded as lkv_bf16_bits_nonan
 *   built here  lkv_load / lkv_store / lkv_load_part / lkv_store_part / lkv_stream (any
 *               float dtype; fp8 through lkv_load_f8 / lkv_store_f8, bit-identical to
 *               src/core/fp8.h; lkv_stream not for fp8), lkv_bf16_load_eo /
 *               lkv_bf16_store_eo_nonan, lkv_copy_bytes, lkv_exp / _nonan / _nonpos
 *   shuffles    lkv_deinterleave / lkv_interleave (even and odd elements of 2W values,
 *               in the lane order lkv_pair_order gives a plain vector), lkv_store2 (two
 *               vectors of one dtype to two addresses), lkv_transpose (W x W)
 *   x86 only    lkv_load2_f8_raw (2W fp8 codes through f16 words, e4m3 as value / 256
 *               with its NaN code finite; the codes also folded into an lkv_c32 from
 *               lkv_c32_zero, where lkv_e4m3_nan_found tells an e4m3 NaN code among
 *               them), lkv_hsum4_store (four vectors' lane sums, scaled, to 4 floats)
 *
 * Rules for SIMD sources: compute in f32, convert at loads and stores through these
 * helpers; keep every function static (the only external symbol of a source is its
 * LKV_FN registration function); no intrinsics outside src/cpu/vec/ except the rare
 * kernel built for one instruction.
 */
#ifndef LKV_H
#define LKV_H

#if defined(LKV_AVX2) || defined(LKV_AVX512)
#include "x86.h"
#elif defined(LKV_NEON)
#include "neon.h"
#else
#error "a SIMD source is compiled with one of -DLKV_AVX2, -DLKV_AVX512, -DLKV_NEON"
#endif

#include <string.h>

#include "../../core/core.h"

/* ---- fp8 (e4m3fn, e5m2) <-> f32, bit-identical to src/core/fp8.h ----
 * decode: the code's exponent and mantissa placed under the f32 exponent bias (normal
 * codes), subnormal codes as man * 2^-9 / 2^-16 (an exact int -> float conversion and
 * multiply: no f32 subnormal is formed, so DAZ / FTZ do not matter), the NaN (and e5m2
 * inf) codes blended in, then the sign.
 * encode: |x| below the format's smallest normal rounds with one f32 addition of
 * 2^(e_min - M + 23) (the sum's ulp is the fp8 subnormal step: round to nearest even
 * under the default rounding mode, which no kernel changes); normal magnitudes round
 * the f32 bits (rebias, add half an fp8 ulp - 1 + the kept lsb, shift) and saturate to
 * the largest finite code (inf too); NaN gives the all-ones magnitude; then the sign. */
static inline lkv_f32 lkv__f8_decode(lkv_i32 c, lk_dtype dt) {
    lkv_i32 sign = lkv_i32_slli(lkv_i32_and(c, lkv_i32_set1(0x80)), 24), em = lkv_i32_and(c, lkv_i32_set1(0x7f));
    lkv_i32 v;
    if (dt == LK_F8E4M3) {
        v = lkv_i32_add(lkv_i32_slli(em, 20), lkv_i32_set1(120 << 23));
        lkv_f32 sub = lkv_mul(lkv_i32_cvt_f32(em), lkv_set1(0.001953125f)); /* used where em < 8 */
        v = lkv_i32_blend(v, lkv_as_i32(sub), lkv_i32_gt(lkv_i32_set1(8), em));
        v = lkv_i32_blend(v, lkv_i32_set1(0x7fc00000), lkv_i32_gt(em, lkv_i32_set1(0x7e)));
    } else {
        v = lkv_i32_add(lkv_i32_slli(em, 21), lkv_i32_set1(112 << 23));
        lkv_f32 sub = lkv_mul(lkv_i32_cvt_f32(em), lkv_set1(1.52587890625e-5f)); /* em < 4 */
        v = lkv_i32_blend(v, lkv_as_i32(sub), lkv_i32_gt(lkv_i32_set1(4), em));
        lkv_i32 special = lkv_i32_or(lkv_i32_set1(0x7f800000), lkv_i32_slli(lkv_i32_and(em, lkv_i32_set1(3)), 21));
        special = lkv_i32_or(special, lkv_i32_blend(lkv_i32_set1(0), lkv_i32_set1(0x400000), lkv_i32_gt(em, lkv_i32_set1(0x7c))));
        v = lkv_i32_blend(v, special, lkv_i32_gt(em, lkv_i32_set1(0x7b)));
    }
    return lkv_as_f32(lkv_i32_or(v, sign));
}

static inline lkv_i32 lkv__f8_encode(lkv_f32 x, lk_dtype dt) {
    const int e4 = dt == LK_F8E4M3, M = e4 ? 3 : 2, B = e4 ? 7 : 15, sh = 23 - M;
    const int maxc = e4 ? 0x7e : 0x7b;
    lkv_i32 u = lkv_as_i32(x);
    lkv_i32 sign = lkv_i32_and(lkv_i32_srli(u, 24), lkv_i32_set1(0x80));
    lkv_i32 a = lkv_i32_and(u, lkv_i32_set1(0x7fffffff));
    lkv_f32 magic = lkv_set1(e4 ? 16384.0f : 128.0f); /* 2^(1 - B - M + 23) */
    lkv_i32 qs = lkv_i32_sub(lkv_as_i32(lkv_add(lkv_as_f32(a), magic)), lkv_as_i32(magic));
    lkv_i32 r = lkv_i32_sub(a, lkv_i32_set1((127 - B) << 23));
    r = lkv_i32_add(r, lkv_i32_add(lkv_i32_set1((1 << (sh - 1)) - 1), lkv_i32_and(lkv_i32_srli(r, sh), lkv_i32_set1(1))));
    r = lkv_i32_min(lkv_i32_srli(r, sh), lkv_i32_set1(maxc));
    lkv_i32 q = lkv_i32_blend(qs, r, lkv_i32_gt(a, lkv_i32_set1(((128 - B) << 23) - 1)));
    q = lkv_i32_blend(q, lkv_i32_set1(0x7f), lkv_i32_gt(a, lkv_i32_set1(0x7f800000)));
    return lkv_i32_or(q, sign);
}

/* W fp8 values of dtype dt (LK_F8E4M3 / LK_F8E5M2) at p, as f32 (exact); the store rounds
 * as lk_f32_to_f8e4m3 / e5m2 */
#if defined(LKV_F8_F16C) /* AVX2: through f16 words (x86.h), the same bits */
static inline lkv_f32 lkv_load_f8(const void *p, lk_dtype dt) {
    return lkv__f8_load_f16c(_mm_loadl_epi64((const __m128i *)p), dt);
}
static inline lkv_f32 lkv__load_part_f8(const void *p, lk_dtype dt, int64_t n) {
    uint8_t b[8] = {0};
    memcpy(b, p, (size_t)n);
    return lkv_load_f8(b, dt);
}
#else
static inline lkv_f32 lkv_load_f8(const void *p, lk_dtype dt) { return lkv__f8_decode(lkv_u8_load(p), dt); }
static inline lkv_f32 lkv__load_part_f8(const void *p, lk_dtype dt, int64_t n) {
    return lkv__f8_decode(lkv_u8_load_part(p, n), dt);
}
#endif
static inline void lkv_store_f8(void *p, lk_dtype dt, lkv_f32 v) { lkv_u8_store(p, lkv__f8_encode(v, dt)); }

/* ---- typed loads / stores (dt a literal after inlining: the branches fold) ---- */

static inline lkv_f32 lkv_load(const void *p, lk_dtype dt) {
    if (dt == LK_F32) return lkv_loadu((const float *)p);
    if (dt == LK_F8E4M3 || dt == LK_F8E5M2) return lkv_load_f8(p, dt);
    return dt == LK_F16 ? lkv_load_f16(p) : lkv_load_bf16(p);
}

static inline void lkv_store(void *p, lk_dtype dt, lkv_f32 v) {
    if (dt == LK_F32) lkv_storeu((float *)p, v);
    else if (dt == LK_F8E4M3 || dt == LK_F8E5M2) lkv_store_f8(p, dt, v);
    else if (dt == LK_F16) lkv_store_f16(p, v);
    else lkv_store_bf16(p, v);
}

/* first n (0 <= n <= W) elements; other lanes 0 / not written */
static inline lkv_f32 lkv_load_part(const void *p, lk_dtype dt, int64_t n) {
    if (dt == LK_F8E4M3 || dt == LK_F8E5M2) return lkv__load_part_f8(p, dt, n);
    return lkv__load_part_fh(p, dt, n);
}

static inline void lkv_store_part(void *p, lk_dtype dt, lkv_f32 v, int64_t n) {
    if (dt == LK_F8E4M3 || dt == LK_F8E5M2) lkv_u8_store_part(p, lkv__f8_encode(v, dt), n);
    else lkv__store_part_fh(p, dt, v, n);
}

/* non-temporal store of W values; p aligned to W elements of dt; lkv_sfence before the
 * results are read by another thread */
static inline void lkv_stream(void *p, lk_dtype dt, lkv_f32 v) {
    if (dt == LK_F32) lkv_stream_f32((float *)p, v);
    else lkv_stream_half(p, dt, v);
}

/* 2W bf16 values at p in even / odd order (lkv_bf16_split) */
static inline void lkv_bf16_load_eo(const void *p, lkv_f32 *even, lkv_f32 *odd) {
    lkv_bf16_split(lkv_bits_loadu(p), even, odd);
}

/* the inverse, rounded without the NaN rule; stream: non-temporal (p LKV_BYTES aligned) */
static inline void lkv_bf16_store_eo_nonan(void *p, lkv_f32 even, lkv_f32 odd, int stream) {
    lkv_bits r = lkv_bf16_join_nonan(even, odd);
    if (stream) lkv_bits_stream(p, r);
    else lkv_bits_storeu(p, r);
}

/* d[0, n) = s[0, n) bit for bit in 32-byte moves, 4 per step (the same on every ISA:
 * as fast as wider moves for copies, and runs of 32 bytes or a few times that, NZ chunks
 * and k_pe rows, are not left to memcpy); stream: non-temporal stores from the first
 * 32-byte boundary of d (lkv_sfence before the results are read elsewhere) */
LK_ALWAYS_INLINE void lkv__copy32(char *d, const char *s, size_t n, int stream) {
    size_t i = 0;
    for (; i + 128 <= n; i += 128) {
        lkv_c32 a = lkv_c32_loadu(s + i), b = lkv_c32_loadu(s + i + 32);
        lkv_c32 c = lkv_c32_loadu(s + i + 64), e = lkv_c32_loadu(s + i + 96);
        if (stream) {
            lkv_c32_stream(d + i, a), lkv_c32_stream(d + i + 32, b);
            lkv_c32_stream(d + i + 64, c), lkv_c32_stream(d + i + 96, e);
        } else {
            lkv_c32_storeu(d + i, a), lkv_c32_storeu(d + i + 32, b);
            lkv_c32_storeu(d + i + 64, c), lkv_c32_storeu(d + i + 96, e);
        }
    }
    for (; i + 32 <= n; i += 32)
        if (stream) lkv_c32_stream(d + i, lkv_c32_loadu(s + i));
        else lkv_c32_storeu(d + i, lkv_c32_loadu(s + i));
    memcpy(d + i, s + i, n - i);
}

static inline void lkv_copy_bytes(char *d, const char *s, size_t n, int stream) {
    if (!stream) {
        lkv__copy32(d, s, n, 0);
        return;
    }
    size_t head = (size_t)(-(uintptr_t)d & 31);
    if (head > n) head = n;
    memcpy(d, s, head);
    lkv__copy32(d + head, s + head, n - head, 1);
}

/* prefetch into L1 / L2 (a hint: any address is safe) */
#define lkv_prefetch(p) __builtin_prefetch((const void *)(p), 0, 3)
#define lkv_prefetch_l2(p) __builtin_prefetch((const void *)(p), 0, 2)

/* ---- exp ----
 * x = n ln2 + r with |r| <= ln2/2 (Cody-Waite, two constants), e^r by a degree-7
 * polynomial (~2 ulp), then 2^n applied in two halves so that n = 128 (x up to
 * ln(FLT_MAX)) and n down to -150 stay in the exponent range. */
static inline lkv_f32 lkv_exp_poly(lkv_f32 xc, lkv_f32 *n_out) {
    lkv_f32 n = lkv_round(lkv_mul(xc, lkv_set1(1.44269504088896341f)));
    lkv_f32 r = lkv_fnma(n, lkv_set1(0.693359375f), xc);
    r = lkv_fnma(n, lkv_set1(-2.12194440e-4f), r);
    lkv_f32 p = lkv_set1(1.9875691500e-4f);
    p = lkv_fma(p, r, lkv_set1(1.3981999507e-3f));
    p = lkv_fma(p, r, lkv_set1(8.3334519073e-3f));
    p = lkv_fma(p, r, lkv_set1(4.1665795894e-2f));
    p = lkv_fma(p, r, lkv_set1(1.6666665459e-1f));
    p = lkv_fma(p, r, lkv_set1(5.0000001201e-1f));
    *n_out = n;
    return lkv_fma(p, lkv_mul(r, r), lkv_add(r, lkv_set1(1.0f)));
}

static inline lkv_f32 lkv_scale_pow2(lkv_f32 p, lkv_f32 n) {
    lkv_i32 ni = lkv_cvt_i32(n), n1 = lkv_i32_srai(ni, 1), n2 = lkv_i32_sub(ni, n1), bias = lkv_i32_set1(127);
    lkv_f32 s1 = lkv_as_f32(lkv_i32_slli(lkv_i32_add(n1, bias), 23));
    lkv_f32 s2 = lkv_as_f32(lkv_i32_slli(lkv_i32_add(n2, bias), 23));
    return lkv_mul(lkv_mul(p, s1), s2);
}

/* exp(x), relative error ~2 ulp over the f32 range; exp(-inf) = 0, exp(+inf) = inf,
 * NaN propagates; x < -87.3 flushes to 0 (no subnormal results) */
static inline lkv_f32 lkv_exp(lkv_f32 x) {
    const lkv_f32 hi = lkv_set1(88.72283935546875f), lo = lkv_set1(-87.3365447504f);
    lkv_m nan = lkv_unord(x, x), over = lkv_gt(x, hi), under = lkv_lt(x, lo);
    lkv_f32 n, p = lkv_exp_poly(lkv_min(lkv_max(x, lo), hi), &n);
    p = lkv_scale_pow2(p, n);
    p = lkv_blend(p, lkv_set1(__builtin_inff()), over);
    p = lkv_zero_where(under, p);
    return lkv_blend(p, x, nan);
}

/* exp(x) with lkv_exp's polynomial and accuracy but no special-case masks: x clamped to
 * [-150, 100], and the two-step 2^n scaling saturates by itself, to +inf above 88.72 and
 * through the subnormals to 0 below -87.3. A NaN x gives 0, not NaN: only for callers
 * whose NaN inputs propagate through another operand (g / (1 + exp(-g))). */
static inline lkv_f32 lkv_exp_nonan(lkv_f32 x) {
    lkv_f32 n, p = lkv_exp_poly(lkv_min(lkv_max(x, lkv_set1(-150.0f)), lkv_set1(100.0f)), &n);
    return lkv_scale_pow2(p, n);
}

/* exp(x) for x <= 0 (-inf included; no +inf), as after a softmax's max subtraction:
 * bit-identical to lkv_exp there with about 2/3 of its work (one 2^n scaling since
 * n >= -126). x < -87.3 gives 0; a NaN x gives NaN (lkv_max(lo, x) keeps it). */
static inline lkv_f32 lkv_exp_nonpos(lkv_f32 x) {
    const lkv_f32 lo = lkv_set1(-87.3365447504f);
    lkv_m under = lkv_lt(x, lo);
    lkv_f32 n, p = lkv_exp_poly(lkv_max(lo, x), &n);
    lkv_f32 e = lkv_as_f32(lkv_i32_slli(lkv_i32_add(lkv_cvt_i32(n), lkv_i32_set1(127)), 23));
    return lkv_zero_where(under, lkv_mul(p, e));
}

#endif
