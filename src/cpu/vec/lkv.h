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
 *   int lanes   lkv_as_i32 as_f32 cvt_i32 (round to nearest) i32_set1 add sub and
 *               slli srli srai
 *   masks       lkv_lt gt unord m_none m_or m_any m_first(n) blend(a, b, m) (m ? b : a)
 *               maskz(m, a) (m ? a : 0) zero_where(m, a) (m ? 0 : a)
 *   f16 / bf16  lkv_load_f16 load_bf16 store_f16 store_bf16 (round to nearest even,
 *               bit-identical to src/core/half.h, NaN quieted), lkv_bf16_bits (the bf16
 *               bits in each lane's low half) and _nonan (no NaN rule: exact for every
 *               value but NaNs whose low 16 bits are not 0)
 *   tails       lkv_load_part(p, dt, n) (lanes >= n are 0), lkv_store_part (writes n)
 *   raw bytes   lkv_bits_loadu storeu stream (LKV_BYTES), lkv_c32_loadu storeu stream
 *               (32 bytes: one NZ chunk of 16-bit values)
 *   streaming   lkv_stream_f32, lkv_stream_half (aligned to the store's width),
 *               lkv_bits_stream / lkv_c32_stream (aligned to their size), lkv_sfence
 *   even / odd  lkv_bf16_split: 2W bf16 values of one lkv_bits as f32 in two vectors,
 *               elements 2i and 2i + 1 of the memory order in lane i (no shuffles);
 *               lkv_bf16_join_nonan: the inverse, rounded as lkv_bf16_bits_nonan
 *   built here  lkv_load / lkv_store / lkv_stream (any float dtype), lkv_bf16_load_eo /
 *               lkv_bf16_store_eo_nonan, lkv_copy_bytes, lkv_exp / _nonan / _nonpos
 *   shuffles    lkv_deinterleave / lkv_interleave (even and odd elements of 2W values,
 *               in the lane order lkv_pair_order gives a plain vector), lkv_store2 (two
 *               vectors of one dtype to two addresses), lkv_transpose (W x W)
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

/* ---- typed loads / stores (dt a literal after inlining: the branches fold) ---- */

static inline lkv_f32 lkv_load(const void *p, lk_dtype dt) {
    if (dt == LK_F32) return lkv_loadu((const float *)p);
    return dt == LK_F16 ? lkv_load_f16(p) : lkv_load_bf16(p);
}

static inline void lkv_store(void *p, lk_dtype dt, lkv_f32 v) {
    if (dt == LK_F32) lkv_storeu((float *)p, v);
    else if (dt == LK_F16) lkv_store_f16(p, v);
    else lkv_store_bf16(p, v);
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

/* exp(x) for x <= 0 (-inf included; no NaN, no +inf), as after a softmax's max
 * subtraction: bit-identical to lkv_exp there with about 2/3 of its work (one 2^n
 * scaling since n >= -126). x < -87.3 gives 0. */
static inline lkv_f32 lkv_exp_nonpos(lkv_f32 x) {
    const lkv_f32 lo = lkv_set1(-87.3365447504f);
    lkv_m under = lkv_lt(x, lo);
    lkv_f32 n, p = lkv_exp_poly(lkv_max(x, lo), &n);
    lkv_f32 e = lkv_as_f32(lkv_i32_slli(lkv_i32_add(lkv_cvt_i32(n), lkv_i32_set1(127)), 23));
    return lkv_zero_where(under, lkv_mul(p, e));
}

#endif
