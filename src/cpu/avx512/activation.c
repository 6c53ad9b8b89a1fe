/*
 * silu_and_mul and gelu_tanh_and_mul, AVX-512 (F/BW/DQ/VL).
 *
 *   out[r, i] = act(x[r, i]) * x[r, d + i],   i < d   (the first half is the gate)
 *   silu(g)      = g / (1 + exp(-g))
 *   gelu_tanh(g) = 0.5 g (1 + tanh(u)) = g / (1 + exp(-2u)),  -2u = g (K0 + K1 g^2)
 *
 * Same formulas, special values, rounding points and work split as avx2/activation.c
 * (units of (row, block of BLK columns)); 16 lanes, lk16_exp_nonan, IEEE division,
 * 32 columns per iteration, bf16 -> bf16 in the in-lane unpack order
 * (lk16x2_load_bf16), masked loads/stores for the tail. Fast path needs last-dim
 * stride 1 on x and out; other layouts go to the reference.
 */
#include <float.h>

#include "../kernels.h"
#include "simd.h"

#define BLK 4096 /* columns per work unit */

static inline __m512 silu16(__m512 g) {
    g = _mm512_max_ps(_mm512_set1_ps(-FLT_MAX), g); /* -inf -> -FLT_MAX; NaN kept */
    __m512 e = lk16_exp_nonan(_mm512_xor_ps(g, _mm512_set1_ps(-0.0f)));
    return _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

static inline __m512 gelu_tanh16(__m512 g) {
    g = _mm512_max_ps(_mm512_set1_ps(-FLT_MAX), g);
    __m512 k = _mm512_fmadd_ps(_mm512_mul_ps(g, g), _mm512_set1_ps(-0.0713548162726f),
                               _mm512_set1_ps(-1.59576912160573f));
    __m512 e = lk16_exp_nonan(_mm512_mul_ps(g, k)); /* exp(-2u) */
    return _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

static inline __m512 act16(__m512 g, __m512 y, int gelu) {
    return _mm512_mul_ps(gelu ? gelu_tanh16(g) : silu16(g), y);
}

/* o[i] = act(gate[i]) * up[i], i < n. Always inlined with constant dtypes (see
 * act_seg_any) so the loop carries no dtype branches. */
static inline __attribute__((always_inline)) void act_seg(char *o, lk_dtype ot, const char *gate,
                                                          const char *up, lk_dtype xt, int64_t n,
                                                          int gelu) {
    size_t oes = ot == LK_F32 ? 4 : 2, xes = xt == LK_F32 ? 4 : 2;
    int64_t i = 0;
    if (xt == LK_BF16 && ot == LK_BF16) { /* lane order does not matter elementwise */
        for (; i + 32 <= n; i += 32) {
            __m512 g0, g1, y0, y1;
            lk16x2_load_bf16(gate + i * 2, &g0, &g1);
            lk16x2_load_bf16(up + i * 2, &y0, &y1);
            lk16x2_store_bf16(o + i * 2, act16(g0, y0, gelu), act16(g1, y1, gelu));
        }
    }
    for (; i + 32 <= n; i += 32) {
        __m512 g0 = lk16_load(gate + i * xes, xt, 16), g1 = lk16_load(gate + (i + 16) * xes, xt, 16);
        __m512 y0 = lk16_load(up + i * xes, xt, 16), y1 = lk16_load(up + (i + 16) * xes, xt, 16);
        lk16_store(o + i * oes, ot, act16(g0, y0, gelu), 16);
        lk16_store(o + (i + 16) * oes, ot, act16(g1, y1, gelu), 16);
    }
    for (; i < n; i += 16) {
        __m512 g = lk16_load(gate + i * xes, xt, n - i), y = lk16_load(up + i * xes, xt, n - i);
        lk16_store(o + i * oes, ot, act16(g, y, gelu), n - i);
    }
}

static inline __attribute__((always_inline)) void act_seg_any(char *o, lk_dtype ot,
                                                              const char *gate, const char *up,
                                                              lk_dtype xt, int64_t n, int gelu) {
    switch (xt * 3 + ot) {
    case LK_F32 * 3 + LK_F32: act_seg(o, LK_F32, gate, up, LK_F32, n, gelu); break;
    case LK_F32 * 3 + LK_F16: act_seg(o, LK_F16, gate, up, LK_F32, n, gelu); break;
    case LK_F32 * 3 + LK_BF16: act_seg(o, LK_BF16, gate, up, LK_F32, n, gelu); break;
    case LK_F16 * 3 + LK_F32: act_seg(o, LK_F32, gate, up, LK_F16, n, gelu); break;
    case LK_F16 * 3 + LK_F16: act_seg(o, LK_F16, gate, up, LK_F16, n, gelu); break;
    case LK_F16 * 3 + LK_BF16: act_seg(o, LK_BF16, gate, up, LK_F16, n, gelu); break;
    case LK_BF16 * 3 + LK_F32: act_seg(o, LK_F32, gate, up, LK_BF16, n, gelu); break;
    case LK_BF16 * 3 + LK_F16: act_seg(o, LK_F16, gate, up, LK_BF16, n, gelu); break;
    default: act_seg(o, LK_BF16, gate, up, LK_BF16, n, gelu); break;
    }
}

typedef struct {
    const lk_act_args *a;
    int64_t nblk; /* column blocks per row */
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
        act_seg_any(orow + c0 * oes, out->dtype, xr + c0 * xes, xr + (d + c0) * xes, x->dtype, n,
                    gelu);
        if (++blk == nblk) {
            blk = 0;
            lk_rowit_next(&xi);
            lk_rowit_next(&oi);
        }
    }
}

static void silu_range(void *ctx, int64_t u0, int64_t u1) { act_range(ctx, u0, u1, 0); }
static void gelu_range(void *ctx, int64_t u0, int64_t u1) { act_range(ctx, u0, u1, 1); }

static void run(const lk_act_args *a, lk_range_fn fn) {
    int64_t d = a->out.shape[a->out.ndim - 1];
    act_ctx c = {a, (d + BLK - 1) / BLK};
    int64_t len = d < BLK ? d : BLK;
    int64_t bytes = len * (int64_t)(2 * lk_dtype_size(a->x.dtype) + lk_dtype_size(a->out.dtype));
    lk_parallel_for(lk_rows(&a->out, 1) * c.nblk, bytes, fn, &c);
}

static int fast_layout(const lk_act_args *a) {
    int nd = a->x.ndim;
    return a->x.stride[nd - 1] == 1 && a->out.stride[nd - 1] == 1;
}

lk_status lk_avx512_silu_and_mul(const lk_act_args *a) {
    if (!fast_layout(a)) return lk_ref_silu_and_mul(a);
    run(a, silu_range);
    return LK_OK;
}

lk_status lk_avx512_gelu_tanh_and_mul(const lk_act_args *a) {
    if (!fast_layout(a)) return lk_ref_gelu_tanh_and_mul(a);
    run(a, gelu_range);
    return LK_OK;
}
