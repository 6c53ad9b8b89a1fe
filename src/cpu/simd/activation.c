/*
 * silu_and_mul and gelu_tanh_and_mul, every vector ISA (src/cpu/vec/lkv.h, W lanes).
 *
 *   out[r, i] = act(x[r, i]) * x[r, d + i],   i < d   (the first half is the gate)
 *   silu(g)      = g / (1 + exp(-g))
 *   gelu_tanh(g) = 0.5 g (1 + tanh(u)) = g / (1 + exp(-2u)),  -2u = g (K0 + K1 g^2)
 *
 * Same formulas, special values and rounding points as ref/activation.c (see there for
 * why gelu uses the sigmoid form: no cancellation for tiny or very negative gates).
 * act_core (act_core.h) computes the sigmoid denominator in base 2 without compares or
 * blends (clamps chosen so that exp's overflow and underflow fall out of the arithmetic,
 * see there), then a true IEEE division (not rcp): f32 and the mixed dtype pairs within 2
 * units of 2^-23 relative of exact; bf16 -> bf16 with a shorter reduction and polynomial, still the
 * reference's bf16 or its neighbour for every bf16 gate.
 *
 * Shapes: x [..., 2d], out [..., d]. Fast path needs last-dim stride 1 on x and out;
 * other layouts go to the reference. Work split: units of (row, block of BLK columns),
 * contiguous ranges of units per thread (lk_parallel_for), so a single decode row of
 * 14336 still spreads over threads; every output is computed the same way whatever
 * the split. Per unit one streaming loop, 2W columns per iteration, specialised per
 * (x, out) dtype pair. bf16 -> bf16 takes 2W values per load in even / odd
 * order (shifts and masks, no shuffles), loads the next block before storing this one
 * (x and out are often equal modulo 4 KiB, and a load after a store to such an address
 * stalls), and rounds without the NaN branch (every NaN here comes from a bf16 input
 * or is the default NaN, so its low 16 bits are 0 and the rounding add cannot carry).
 * Outputs of LK_STREAM_MIN_BYTES or more are written with non-temporal stores (no
 * read-for-ownership), and there the loops also prefetch PF_AHEAD bytes ahead of both
 * input streams (while the core computes, the hardware prefetcher alone falls behind
 * at 2 threads: bf16 +10-20%, f32 +5-8% beyond L3). bf16 is compute-bound on 2 AVX2
 * cores (~0.45 ns per value per core in cache, 55-75% of the copy bandwidth beyond L3);
 * f32 is close to memory-bound (75-95%); AVX-512 halves the instructions per value.
 */
#include <string.h>

#include "../kernels.h"
#include "act_core.h"

#define BLK 4096      /* columns per work unit */
#define PF_AHEAD 2048 /* bytes prefetched ahead of the loops on streamed (beyond-cache) data */

static inline lkv_f32 act_mul(lkv_f32 g, lkv_f32 y, int gelu) { return lkv_mul(act_core(g, gelu, 0), y); }

/* 2W bf16 outputs from 2W gates and 2W ups in even / odd order (lkv_bf16_split); the
 * rounding has no NaN branch (see the block comment) */
static inline lkv_bits act_bf16(lkv_bits gv, lkv_bits uv, int gelu) {
    lkv_f32 ge, go, ue, uo;
    lkv_bf16_split(gv, &ge, &go);
    lkv_bf16_split(uv, &ue, &uo);
    return lkv_bf16_join_nonan(lkv_mul(act_core(ge, gelu, 1), ue), lkv_mul(act_core(go, gelu, 1), uo));
}

/* prefetch PF_AHEAD bytes ahead the 64-byte lines that start in bytes [b, b + span) of
 * gate and up (one prefetch per line and stream) */
LK_ALWAYS_INLINE void prefetch_ahead(const char *gate, const char *up, int64_t b, int64_t span) {
    for (int64_t o = (b + 63) & ~(int64_t)63; o < b + span; o += 64) {
        lkv_prefetch((const char *)((uintptr_t)gate + (uintptr_t)(o + PF_AHEAD)));
        lkv_prefetch((const char *)((uintptr_t)up + (uintptr_t)(o + PF_AHEAD)));
    }
}

LK_ALWAYS_INLINE void store_bits(char *o, lkv_bits r, int stream) {
    if (stream) lkv_bits_stream(o, r);
    else lkv_bits_storeu(o, r);
}

/* bf16 -> bf16: o[i] = act(gate[i]) * up[i], i < n, 2W per step; the last n % 2W go
 * through a zero-padded copy so that every element is computed the same way.
 * Software-pipelined: the next block is loaded before this one is stored, so a load
 * never follows a store to an address equal modulo 4 KiB (x and out are often both
 * page-aligned; such a 4K-aliased load waits for the store). */
LK_ALWAYS_INLINE void act_seg_bf16(char *o, const char *gate, const char *up, int64_t n, int gelu, int stream) {
    const int64_t V = 2 * LKV_W; /* values per step */
    int64_t i = 0;
    if (n >= V) {
        lkv_bits gv = lkv_bits_loadu(gate), uv = lkv_bits_loadu(up);
        for (; i + 2 * V <= n; i += V) {
            if (stream) prefetch_ahead(gate, up, i * 2, V * 2);
            lkv_bits r = act_bf16(gv, uv, gelu);
            gv = lkv_bits_loadu(gate + (i + V) * 2);
            uv = lkv_bits_loadu(up + (i + V) * 2);
            store_bits(o + i * 2, r, stream);
        }
        store_bits(o + i * 2, act_bf16(gv, uv, gelu), stream);
        i += V;
    }
    if (i < n) {
        uint16_t gb[2 * LKV_W] = {0}, ub[2 * LKV_W] = {0}, ob[2 * LKV_W];
        memcpy(gb, gate + i * 2, (size_t)(n - i) * 2);
        memcpy(ub, up + i * 2, (size_t)(n - i) * 2);
        lkv_bits_storeu(ob, act_bf16(lkv_bits_loadu(gb), lkv_bits_loadu(ub), gelu));
        memcpy(o + i * 2, ob, (size_t)(n - i) * 2);
    }
}

/* o[i] = act(gate[i]) * up[i], i < n. Always inlined with constant dtypes (see
 * act_seg_any) so the loop carries no dtype branches. */
LK_ALWAYS_INLINE void act_seg(char *o, lk_dtype ot, const char *gate, const char *up, lk_dtype xt, int64_t n,
                              int gelu, int stream) {
    int64_t oes = lk_esize(ot), xes = lk_esize(xt), i = 0;
    for (; i + 2 * LKV_W <= n; i += 2 * LKV_W) {
        if (stream) prefetch_ahead(gate, up, i * xes, 2 * LKV_W * xes);
        lkv_f32 g0 = lkv_load(gate + i * xes, xt), g1 = lkv_load(gate + (i + LKV_W) * xes, xt);
        lkv_f32 y0 = lkv_load(up + i * xes, xt), y1 = lkv_load(up + (i + LKV_W) * xes, xt);
        if (stream) {
            lkv_stream(o + i * oes, ot, act_mul(g0, y0, gelu));
            lkv_stream(o + (i + LKV_W) * oes, ot, act_mul(g1, y1, gelu));
        } else {
            lkv_store(o + i * oes, ot, act_mul(g0, y0, gelu));
            lkv_store(o + (i + LKV_W) * oes, ot, act_mul(g1, y1, gelu));
        }
    }
    for (; i < n; i += LKV_W) {
        int64_t m = n - i < LKV_W ? n - i : LKV_W;
        lkv_f32 g = lkv_load_part(gate + i * xes, xt, m), y = lkv_load_part(up + i * xes, xt, m);
        lkv_store_part(o + i * oes, ot, act_mul(g, y, gelu), m);
    }
}

LK_ALWAYS_INLINE void act_seg_any(char *o, lk_dtype ot, const char *gate, const char *up, lk_dtype xt, int64_t n,
                                  int gelu, int stream) {
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

LK_ALWAYS_INLINE void act_range(const act_ctx *c, int64_t u0, int64_t u1, int gelu) {
    const lk_tensor *x = &c->a->x, *out = &c->a->out;
    int64_t d = out->shape[out->ndim - 1], nblk = c->nblk, blk = u0 % nblk;
    int64_t xes = lk_esize(x->dtype), oes = lk_esize(out->dtype);
    lk_rowit xi, oi;
    lk_rowit_init(&xi, x, 1, u0 / nblk);
    lk_rowit_init(&oi, out, 1, u0 / nblk);
    for (int64_t u = u0; u < u1; u++) {
        const char *xr = lk_at(x, xi.off); // [2d]: gate [0, d), up [d, 2d)
        char *orow = lk_at(out, oi.off);   // [d]
        int64_t c0 = blk * BLK, n = d - c0 < BLK ? d - c0 : BLK;
        char *o = orow + c0 * oes;
        act_seg_any(o, out->dtype, xr + c0 * xes, xr + (d + c0) * xes, x->dtype, n, gelu,
                    c->stream && ((uintptr_t)o & (LKV_BYTES - 1)) == 0);
        if (++blk == nblk) {
            blk = 0;
            lk_rowit_next(&xi);
            lk_rowit_next(&oi);
        }
    }
    if (c->stream) lkv_sfence(); /* this thread's streamed stores, before the join */
}

static void silu_range(void *ctx, int64_t u0, int64_t u1) { act_range(ctx, u0, u1, 0); }
static void gelu_range(void *ctx, int64_t u0, int64_t u1) { act_range(ctx, u0, u1, 1); }

static void run(const lk_act_args *a, lk_range_fn fn) {
    int64_t d = a->out.shape[a->out.ndim - 1], oes = lk_esize(a->out.dtype);
    act_ctx c = {a, (d + BLK - 1) / BLK, lk_rows(&a->out, 1) * d * oes >= LK_STREAM_MIN_BYTES};
    int64_t len = d < BLK ? d : BLK;
    int64_t bytes = len * (2 * lk_esize(a->x.dtype) + oes);
    lk_parallel_for(lk_rows(&a->out, 1) * c.nblk, bytes, fn, &c);
}

static int fast_layout(const lk_act_args *a) {
    int nd = a->x.ndim;
    return a->x.stride[nd - 1] == 1 && a->out.stride[nd - 1] == 1;
}

static lk_status silu_and_mul(const lk_act_args *a) {
    if (!fast_layout(a)) return lk_ref_silu_and_mul(a);
    run(a, silu_range);
    return LK_OK;
}

static lk_status gelu_tanh_and_mul(const lk_act_args *a) {
    if (!fast_layout(a)) return lk_ref_gelu_tanh_and_mul(a);
    run(a, gelu_range);
    return LK_OK;
}

void LKV_FN(register_activation)(lk_kernel_table *t) {
    t->silu_and_mul = silu_and_mul;
    t->gelu_tanh_and_mul = gelu_tanh_and_mul;
}
