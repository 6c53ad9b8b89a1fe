/*
 * silu_and_mul and gelu_tanh_and_mul, AVX2 + FMA + F16C.
 *
 *   out[r, i] = act(x[r, i]) * x[r, d + i],   i < d   (the first half is the gate)
 *   silu(g)      = g / (1 + exp(-g))
 *   gelu_tanh(g) = 0.5 g (1 + tanh(u)) = g / (1 + exp(-2u)),  -2u = g (K0 + K1 g^2)
 *
 * Same formulas, special values and rounding points as ref/activation.c (see there for
 * why gelu uses the sigmoid form: no cancellation for tiny or very negative gates). exp
 * is exp_denom8 (lk8_exp's polynomial, ~2 ulp, on [-87, 88.72] with 2^n added to the
 * exponent bits, +inf above), the division is a true IEEE division (not rcp), so every
 * output is within a few f32 ulp of the exact value. act(-inf) = -0: the gate is
 * clamped to >= -FLT_MAX first (max_ps keeps a NaN gate, since it returns its second
 * operand when either is NaN), and -FLT_MAX / inf = -0.
 *
 * Shapes: x [..., 2d], out [..., d]. Fast path needs last-dim stride 1 on x and out;
 * other layouts go to the reference. Work split: units of (row, block of BLK columns),
 * contiguous ranges of units per thread (lk_parallel_for), so a single decode row of
 * 14336 still spreads over threads; every output is computed the same way whatever
 * the split. Per unit one streaming loop, 16 columns per iteration, specialised per
 * (x, out) dtype pair. bf16 -> bf16 loads 16 values in the in-lane unpack order
 * (lk8x2_load_bf16, no cross-lane conversions), loads the next block before storing
 * this one (x and out are often equal modulo 4 KiB, and a load after a store to such an
 * address stalls), and rounds without the NaN branch (every NaN here comes from a bf16
 * input or is the default NaN, so its low 16 bits are 0 and the rounding add cannot
 * carry). Outputs of LK_STREAM_MIN_BYTES or more are written with non-temporal stores
 * (no read-for-ownership). bf16 stays compute-bound on 2 AVX2 cores (~0.8 ns per value
 * per core: about 60% of the copy bandwidth); f32 is memory-bound.
 */
#include <float.h>
#include <string.h>

#include "../kernels.h"
#include "simd.h"

#define BLK 4096 /* columns per work unit */

/* exp(x) for the sigmoid denominators: lk8_exp's polynomial (plain Horner), x clamped to
 * [-87, 88.72] so that 2^n is applied by adding n to the exponent bits (the result stays
 * normal: n >= -126 comes with r >= 0.33, so p > 1), n from the 1.5 * 2^23 rounding
 * trick (its low mantissa bits hold n), and x > 88.72 gives +inf. x < -87 gives
 * exp(-87) ~ 1.6e-38 instead of a smaller value: 1 + e is 1 either way. A NaN x gives
 * exp(-87) (max_ps returns its second operand): callers propagate NaN through g. */
static inline __m256 exp_denom8(__m256 x) {
    const __m256 shifter = _mm256_set1_ps(12582912.0f); /* 1.5 * 2^23 */
    __m256 over = _mm256_cmp_ps(x, _mm256_set1_ps(88.72283935546875f), _CMP_GT_OQ);
    __m256 xc = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.72283935546875f));
    __m256 t = _mm256_fmadd_ps(xc, _mm256_set1_ps(1.44269504088896341f), shifter);
    __m256 n = _mm256_sub_ps(t, shifter);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f); /* plain Horner down to the constant 1 */
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_add_epi32(_mm256_castps_si256(p), _mm256_slli_epi32(_mm256_castps_si256(t), 23));
    return _mm256_blendv_ps(_mm256_castsi256_ps(e), _mm256_set1_ps(__builtin_inff()), over);
}

static inline __m256 silu8(__m256 g) {
    g = _mm256_max_ps(_mm256_set1_ps(-FLT_MAX), g);
    __m256 e = exp_denom8(_mm256_xor_ps(g, _mm256_set1_ps(-0.0f)));
    return _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

static inline __m256 gelu_tanh8(__m256 g) {
    g = _mm256_max_ps(_mm256_set1_ps(-FLT_MAX), g);
    __m256 k = _mm256_fmadd_ps(_mm256_mul_ps(g, g), _mm256_set1_ps(-0.0713548162726f),
                               _mm256_set1_ps(-1.59576912160573f));
    __m256 e = exp_denom8(_mm256_mul_ps(g, k)); /* exp(-2u) */
    return _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

static inline __m256 act8(__m256 g, __m256 y, int gelu) {
    return _mm256_mul_ps(gelu ? gelu_tanh8(g) : silu8(g), y);
}

/* act(g) for the bf16 -> bf16 path, about a third fewer instructions than silu8 /
 * gelu_tanh8 and a much shorter dependency chain (this path is compute-bound):
 * act = g / (1 + 2^y), y = -g log2(e) (silu) or g (K0 + K1 g^2) log2(e) (gelu).
 * y = n + f with n = rint(y) from the 1.5 * 2^23 shifter (its low mantissa bits hold
 * n + 126, shifted into the exponent field they make 2^(n-1)), f = y - n exact, 2^f by
 * a degree-5 polynomial (relative error 1.5e-7) whose coefficients carry a factor 2.
 * Range: y >= -126 (clamped; 2^(n-1) is then 0 and the denominator 1, as in f32 anyway).
 * Above, the gate is clamped from below at G_MIN, a value where exp overflows f32 but
 * y < 128.5, so n <= 128, and 2 p 2^127 overflows to inf whenever y >= 128: act = -0
 * exactly where expf overflows, act(-inf) = -0, no compare or blend. max_ps returns
 * its second operand when either is NaN: a NaN gate stays NaN through the clamp (and
 * the numerator), its y = NaN is clamped to -126. The rounding of y adds a relative
 * error of |y| 2^-24 ln 2 (6e-7 at |g| = 10): act is within ~1e-6 of exact for
 * realistic gates, 5e-6 near the overflow edge, so the bf16 result is the reference's
 * or its neighbour (test_activation compares every bf16 gate with the reference). */
#define SILU_G_MIN (-88.75f)   /* y = 128.04 */
#define GELU_G_MIN (-10.0684f) /* y = 128.25 */
static inline __m256 act8_bf16(__m256 g, int gelu) {
    const __m256 shifter = _mm256_set1_ps(12582912.0f + 126.0f);
    __m256 y;
    g = _mm256_max_ps(_mm256_set1_ps(gelu ? GELU_G_MIN : SILU_G_MIN), g);
    if (gelu) {
        __m256 k = _mm256_fmadd_ps(_mm256_mul_ps(g, g), _mm256_set1_ps(-0.0713548162726f * 1.44269504088896341f),
                                   _mm256_set1_ps(-1.59576912160573f * 1.44269504088896341f));
        y = _mm256_mul_ps(g, k);
    } else {
        y = _mm256_mul_ps(g, _mm256_set1_ps(-1.44269504088896341f));
    }
    y = _mm256_max_ps(y, _mm256_set1_ps(-126.0f));
    __m256 t = _mm256_add_ps(y, shifter);
    __m256 f = _mm256_sub_ps(y, _mm256_sub_ps(t, shifter)), f2 = _mm256_mul_ps(f, f);
    __m256 sc = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(t), 23));
    __m256 a = _mm256_fmadd_ps(_mm256_set1_ps(2 * 0.6931469440460205f), f, _mm256_set1_ps(2 * 1.0000001192092896f));
    __m256 b = _mm256_fmadd_ps(_mm256_set1_ps(2 * 0.05550713464617729f), f, _mm256_set1_ps(2 * 0.24022120237350464f));
    __m256 c = _mm256_fmadd_ps(_mm256_set1_ps(2 * 0.00132764654699713f), f, _mm256_set1_ps(2 * 0.009675541892647743f));
    __m256 p = _mm256_fmadd_ps(_mm256_fmadd_ps(c, f2, b), f2, a);
    return _mm256_div_ps(g, _mm256_fmadd_ps(p, sc, _mm256_set1_ps(1.0f)));
}

/* 16 bf16 outputs from 16 gates and 16 ups in even / odd order: the even elements are
 * the low halves of the 32-bit lanes (shifted up, they are the f32 values), the odd
 * ones the high halves (masked); the rounded results go back the same way (even ones
 * shifted down, blended with the odd ones' high halves), so no shuffles. The rounding
 * has no NaN branch (see the block comment). */
static inline __m256i act16_bf16(__m256i gv, __m256i uv, int gelu) {
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
    __m256 ge = _mm256_castsi256_ps(_mm256_slli_epi32(gv, 16)), go = _mm256_castsi256_ps(_mm256_and_si256(gv, hi));
    __m256 ue = _mm256_castsi256_ps(_mm256_slli_epi32(uv, 16)), uo = _mm256_castsi256_ps(_mm256_and_si256(uv, hi));
    __m256i e = _mm256_castps_si256(_mm256_mul_ps(act8_bf16(ge, gelu), ue));
    __m256i o = _mm256_castps_si256(_mm256_mul_ps(act8_bf16(go, gelu), uo));
    __m256i one = _mm256_set1_epi32(1), half = _mm256_set1_epi32(0x7fff);
    e = _mm256_add_epi32(_mm256_add_epi32(e, half), _mm256_and_si256(_mm256_srli_epi32(e, 16), one));
    o = _mm256_add_epi32(_mm256_add_epi32(o, half), _mm256_and_si256(_mm256_srli_epi32(o, 16), one));
    return _mm256_blend_epi16(_mm256_srli_epi32(e, 16), o, 0xaa);
}

/* bf16 -> bf16: o[i] = act(gate[i]) * up[i], i < n, 16 per step; the last n % 16 go
 * through a zero-padded copy so that every element is computed the same way.
 * Software-pipelined: the next block is loaded before this one is stored, so a load
 * never follows a store to an address equal modulo 4 KiB (x and out are often both
 * page-aligned; such a 4K-aliased load waits for the store). */
static inline __attribute__((always_inline)) void act_seg_bf16(char *o, const char *gate,
                                                               const char *up, int64_t n,
                                                               int gelu, int stream) {
    int64_t i = 0;
    if (n >= 16) {
        __m256i gv = _mm256_loadu_si256((const __m256i *)gate), uv = _mm256_loadu_si256((const __m256i *)up);
        for (; i + 32 <= n; i += 16) {
            __m256i r = act16_bf16(gv, uv, gelu);
            gv = _mm256_loadu_si256((const __m256i *)(gate + (i + 16) * 2));
            uv = _mm256_loadu_si256((const __m256i *)(up + (i + 16) * 2));
            if (stream) _mm256_stream_si256((__m256i *)(o + i * 2), r);
            else _mm256_storeu_si256((__m256i *)(o + i * 2), r);
        }
        __m256i r = act16_bf16(gv, uv, gelu);
        if (stream) _mm256_stream_si256((__m256i *)(o + i * 2), r);
        else _mm256_storeu_si256((__m256i *)(o + i * 2), r);
        i += 16;
    }
    if (i < n) {
        uint16_t gb[16] = {0}, ub[16] = {0}, ob[16];
        memcpy(gb, gate + i * 2, (size_t)(n - i) * 2);
        memcpy(ub, up + i * 2, (size_t)(n - i) * 2);
        _mm256_storeu_si256((__m256i *)ob, act16_bf16(_mm256_loadu_si256((const __m256i *)gb),
                                                      _mm256_loadu_si256((const __m256i *)ub), gelu));
        memcpy(o + i * 2, ob, (size_t)(n - i) * 2);
    }
}

/* o[i] = act(gate[i]) * up[i], i < n. Always inlined with constant dtypes (see
 * act_seg_any) so the loop carries no dtype branches. */
static inline __attribute__((always_inline)) void act_seg(char *o, lk_dtype ot, const char *gate,
                                                          const char *up, lk_dtype xt, int64_t n,
                                                          int gelu, int stream) {
    size_t oes = ot == LK_F32 ? 4 : 2, xes = xt == LK_F32 ? 4 : 2;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 g0 = lk8_load(gate + i * xes, xt), g1 = lk8_load(gate + (i + 8) * xes, xt);
        __m256 y0 = lk8_load(up + i * xes, xt), y1 = lk8_load(up + (i + 8) * xes, xt);
        if (stream) {
            lk8_stream(o + i * oes, ot, act8(g0, y0, gelu));
            lk8_stream(o + (i + 8) * oes, ot, act8(g1, y1, gelu));
        } else {
            lk8_store(o + i * oes, ot, act8(g0, y0, gelu));
            lk8_store(o + (i + 8) * oes, ot, act8(g1, y1, gelu));
        }
    }
    for (; i < n; i += 8) {
        int m = n - i < 8 ? (int)(n - i) : 8;
        __m256 g = lk8_load_part(gate + i * xes, xt, m), y = lk8_load_part(up + i * xes, xt, m);
        lk8_store_part(o + i * oes, ot, act8(g, y, gelu), m);
    }
}

static inline __attribute__((always_inline)) void act_seg_any(char *o, lk_dtype ot,
                                                              const char *gate, const char *up,
                                                              lk_dtype xt, int64_t n, int gelu, int stream) {
    switch (xt * 3 + ot) {
    case LK_F32 * 3 + LK_F32: act_seg(o, LK_F32, gate, up, LK_F32, n, gelu, stream); break;
    case LK_F32 * 3 + LK_F16: act_seg(o, LK_F16, gate, up, LK_F32, n, gelu, stream); break;
    case LK_F32 * 3 + LK_BF16: act_seg(o, LK_BF16, gate, up, LK_F32, n, gelu, stream); break;
    case LK_F16 * 3 + LK_F32: act_seg(o, LK_F32, gate, up, LK_F16, n, gelu, stream); break;
    case LK_F16 * 3 + LK_F16: act_seg(o, LK_F16, gate, up, LK_F16, n, gelu, stream); break;
    case LK_F16 * 3 + LK_BF16: act_seg(o, LK_BF16, gate, up, LK_F16, n, gelu, stream); break;
    case LK_BF16 * 3 + LK_F32: act_seg(o, LK_F32, gate, up, LK_BF16, n, gelu, stream); break;
    case LK_BF16 * 3 + LK_F16: act_seg(o, LK_F16, gate, up, LK_BF16, n, gelu, stream); break;
    default: act_seg_bf16(o, gate, up, n, gelu, stream); break;
    }
}

typedef struct {
    const lk_act_args *a;
    int64_t nblk; /* column blocks per row */
    int stream;   /* non-temporal stores (outputs of LK_STREAM_MIN_BYTES or more) */
} act_ctx;

static inline __attribute__((always_inline)) void act_range(const act_ctx *c, int64_t u0,
                                                            int64_t u1, int gelu) {
    const lk_tensor *x = &c->a->x, *out = &c->a->out;
    int64_t d = out->shape[out->ndim - 1], nblk = c->nblk, blk = u0 % nblk;
    size_t xes = lk_dtype_size(x->dtype), oes = lk_dtype_size(out->dtype);
    lk_rowit xi, oi;
    lk_rowit_init(&xi, x, 1, u0 / nblk);
    lk_rowit_init(&oi, out, 1, u0 / nblk);
    for (int64_t u = u0; u < u1; u++) {
        const char *xr = lk_at(x, xi.off); // [2d]: gate [0, d), up [d, 2d)
        char *orow = lk_at(out, oi.off);   // [d]
        int64_t c0 = blk * BLK, n = d - c0 < BLK ? d - c0 : BLK;
        char *o = orow + c0 * oes;
        act_seg_any(o, out->dtype, xr + c0 * xes, xr + (d + c0) * xes, x->dtype, n, gelu,
                    c->stream && ((uintptr_t)o & 31) == 0);
        if (++blk == nblk) {
            blk = 0;
            lk_rowit_next(&xi);
            lk_rowit_next(&oi);
        }
    }
    if (c->stream) _mm_sfence(); /* this thread's streamed stores, before the join */
}

static void silu_range(void *ctx, int64_t u0, int64_t u1) { act_range(ctx, u0, u1, 0); }
static void gelu_range(void *ctx, int64_t u0, int64_t u1) { act_range(ctx, u0, u1, 1); }

static void run(const lk_act_args *a, lk_range_fn fn) {
    int64_t d = a->out.shape[a->out.ndim - 1];
    size_t oes = lk_dtype_size(a->out.dtype);
    act_ctx c = {a, (d + BLK - 1) / BLK, lk_rows(&a->out, 1) * d * (int64_t)oes >= LK_STREAM_MIN_BYTES};
    int64_t len = d < BLK ? d : BLK;
    int64_t bytes = len * (int64_t)(2 * lk_dtype_size(a->x.dtype) + lk_dtype_size(a->out.dtype));
    lk_parallel_for(lk_rows(&a->out, 1) * c.nblk, bytes, fn, &c);
}

static int fast_layout(const lk_act_args *a) {
    int nd = a->x.ndim;
    return a->x.stride[nd - 1] == 1 && a->out.stride[nd - 1] == 1;
}

lk_status lk_avx2_silu_and_mul(const lk_act_args *a) {
    if (!fast_layout(a)) return lk_ref_silu_and_mul(a);
    run(a, silu_range);
    return LK_OK;
}

lk_status lk_avx2_gelu_tanh_and_mul(const lk_act_args *a) {
    if (!fast_layout(a)) return lk_ref_gelu_tanh_and_mul(a);
    run(a, gelu_range);
    return LK_OK;
}
