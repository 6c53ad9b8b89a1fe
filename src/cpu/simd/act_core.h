/*
 * act_core: the sigmoid-form activations g / (1 + exp(x)) of the SIMD activation kernels
 * (src/cpu/simd/activation.c) over the vector layer, shared with the fused activation +
 * quantization kernels (src/cpu/simd/act_quant.c), whose reference mirrors the precise
 * silu lane by lane (lk_aq_silu, src/cpu/act_quant.h).
 */
#ifndef LK_SIMD_ACT_CORE_H
#define LK_SIMD_ACT_CORE_H

#include "../vec/lkv.h"

/* act(g) = g / (1 + exp(x)), x = -g (silu) or g (K0 + K1 g^2) (gelu, = -2u), for
 * every dtype path; `fast` selects the bf16 -> bf16 variant. Both work in base 2 with
 * the 1.5 * 2^23 shifter: t = x log2(e) + shifter rounds to n = rint(x log2(e)) and
 * holds n + 126 in its low mantissa bits, which shifted into the exponent field make
 * 2^(n-1); the polynomial carries the other factor 2. No compare or blend:
 *  - the gate is clamped from below at G_MIN, where exp(x) overflows f32 but
 *    x log2(e) < 128.5: n <= 128, and whenever exp(x) overflows (x log2(e) >= 128 or
 *    so) 2 p 2^127 is +inf, the denominator too, and act = -0, exactly as expf's
 *    overflow gives; act(-inf) = -0 the same way;
 *  - the exponent's argument is clamped from above at G_MAX (x is decreasing in g),
 *    where x log2(e) > -126.5: n >= -126, 2^(n-1) is 0 when n = -126 and the
 *    denominator 1, which 1 + exp(x) is in f32 anyway;
 *  - lkv_max / lkv_min return their second operand when either is NaN: a NaN gate stays
 *    NaN in the numerator, and its exponent argument becomes G_MAX.
 * Precise (f32 and the other dtype pairs): x = n ln2 + r by Cody-Waite (two
 * constants, r exact to f32), e^r by lkv_exp's polynomial (~1 ulp), one rounding in the
 * denominator's fma, a true IEEE division: act within 2 ulp of exact (test_activation's
 * accuracy test). Fast (bf16 -> bf16, where this op is compute-bound): k = x / g in
 * base 2 (-log2(e), or gelu's K0 + K1 g^2 rounded once), t = fma(g, k, shifter) and
 * f = fma(g, k, -n) = x log2(e) - n with one rounding, 2^f by a degree-5 polynomial
 * (relative error 1.5e-7) in Horner form: ~20 vector instructions per W values. The
 * error of log2(e) in f32 (1.3e-8 relative; for gelu also k's rounding) adds at most
 * |x log2(e)| 6e-8 relative (under 8e-6 even at the overflow edge), so the bf16 result
 * is the reference's or its neighbour (test_activation compares every bf16 gate with
 * the reference, bit by bit). */
#define SILU_G_MIN (-88.75f)   /* x log2(e) = 128.04 */
#define GELU_G_MIN (-10.0684f) /* x log2(e) = 128.25 */
#define SILU_G_MAX 87.3f       /* x log2(e) = -125.95 (precise path: the same bound on x) */
#define GELU_G_MAX 9.99f       /* x log2(e) = -125.64 */
#define LOG2E 1.44269504088896341f
#define GELU_K0 (-1.59576912160573f) /* -2 sqrt(2/pi) */
#define GELU_K1 (-0.0713548162726f)  /* -2 sqrt(2/pi) * 0.044715 */
static inline lkv_f32 act_core(lkv_f32 g, int gelu, int fast) {
    const lkv_f32 shifter = lkv_set1(12582912.0f + 126.0f), two = lkv_set1(2.0f);
    g = lkv_max(lkv_set1(gelu ? GELU_G_MIN : SILU_G_MIN), g);
    lkv_f32 t, p;
    if (fast) {
        lkv_f32 gy = lkv_min(g, lkv_set1(gelu ? GELU_G_MAX : SILU_G_MAX));
        lkv_f32 k = gelu ? lkv_fma(lkv_mul(gy, gy), lkv_set1(GELU_K1 * LOG2E), lkv_set1(GELU_K0 * LOG2E))
                         : lkv_set1(-LOG2E);
        t = lkv_fma(gy, k, shifter);                        /* n + shifter */
        lkv_f32 f = lkv_fma(gy, k, lkv_sub(shifter, t)); /* x log2(e) - n */
        p = lkv_fma(lkv_set1(2 * 0.00132764654699713f), f, lkv_set1(2 * 0.009675541892647743f));
        p = lkv_fma(p, f, lkv_set1(2 * 0.05550713464617729f));
        p = lkv_fma(p, f, lkv_set1(2 * 0.24022120237350464f));
        p = lkv_fma(p, f, lkv_set1(2 * 0.6931469440460205f));
        p = lkv_fma(p, f, lkv_set1(2 * 1.0000001192092896f));
    } else {
        /* silu works on -x = min(g, G_MAX) with the odd coefficients negated;
         * gelu on x clamped to >= -87.3 (the same bound) */
        const float s = gelu ? 1.0f : -1.0f;
        lkv_f32 v = gelu ? lkv_max(lkv_mul(g, lkv_fma(lkv_mul(g, g), lkv_set1(GELU_K1), lkv_set1(GELU_K0))),
                                   lkv_set1(-SILU_G_MAX))
                         : lkv_min(g, lkv_set1(SILU_G_MAX));
        t = lkv_fma(v, lkv_set1(s * LOG2E), shifter);
        lkv_f32 n = lkv_sub(t, shifter); /* r = x - n ln2 = s (v - s n ln2) */
        lkv_f32 r = lkv_fma(n, lkv_set1(-s * 0.693359375f), v);
        r = lkv_fma(n, lkv_set1(-s * -2.12194440e-4f), r);
        /* 2 e^r = 2 (1 + r + r^2 q(r)) with lkv_exp's q; r stands for s r here */
        lkv_f32 q = lkv_set1(s * 2 * 1.9875691500e-4f);
        q = lkv_fma(q, r, lkv_set1(2 * 1.3981999507e-3f));
        q = lkv_fma(q, r, lkv_set1(s * 2 * 8.3334519073e-3f));
        q = lkv_fma(q, r, lkv_set1(2 * 4.1665795894e-2f));
        q = lkv_fma(q, r, lkv_set1(s * 2 * 1.6666665459e-1f));
        q = lkv_fma(q, r, lkv_set1(2 * 5.0000001201e-1f));
        p = lkv_fma(q, lkv_mul(r, r), lkv_fma(r, lkv_set1(s * 2.0f), two));
    }
    lkv_f32 sc = lkv_as_f32(lkv_i32_slli(lkv_as_i32(t), 23));
    return lkv_div(g, lkv_fma(p, sc, lkv_set1(1.0f)));
}

#endif
