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

/* o[i] = act(gate[i]) * up[i], i < n. Always inlined with constant dtypes (see
 * act_seg_any) so the loop carries no dtype branches. */
static inline __attribute__((always_inline)) void act_seg(char *o, lk_dtype ot, const char *gate,
                                                          const char *up, lk_dtype xt, int64_t n,
                                                          int gelu, int stream) {
    size_t oes = ot == LK_F32 ? 4 : 2, xes = xt == LK_F32 ? 4 : 2;
    int64_t i = 0;
    if (xt == LK_BF16 && ot == LK_BF16 && n >= 16) { /* lane order does not matter elementwise */
        /* software-pipelined: the next block is loaded before this one is stored, so a
         * load never follows a store to an address equal modulo 4 KiB (x and out are
         * often both page-aligned; such a 4K-aliased load waits for the store) */
        __m256 g0, g1, y0, y1;
        lk8x2_load_bf16(gate, &g0, &g1);
        lk8x2_load_bf16(up, &y0, &y1);
        for (; i + 32 <= n; i += 16) {
            __m256i r = _mm256_packus_epi32(lk8_bf16_bits_nonan(act8(g0, y0, gelu)), lk8_bf16_bits_nonan(act8(g1, y1, gelu)));
            lk8x2_load_bf16(gate + (i + 16) * 2, &g0, &g1);
            lk8x2_load_bf16(up + (i + 16) * 2, &y0, &y1);
            if (stream) _mm256_stream_si256((__m256i *)(o + i * 2), r);
            else _mm256_storeu_si256((__m256i *)(o + i * 2), r);
        }
        __m256i r = _mm256_packus_epi32(lk8_bf16_bits_nonan(act8(g0, y0, gelu)), lk8_bf16_bits_nonan(act8(g1, y1, gelu)));
        if (stream) _mm256_stream_si256((__m256i *)(o + i * 2), r);
        else _mm256_storeu_si256((__m256i *)(o + i * 2), r);
        i += 16;
    }
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
    default: act_seg(o, LK_BF16, gate, up, LK_BF16, n, gelu, stream); break;
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
