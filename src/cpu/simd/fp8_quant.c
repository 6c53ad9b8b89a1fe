/*
 * scaled_fp8_quant (static per tensor or on a grid of scales, dynamic per tensor, dynamic
 * per token) and per_token_group_fp8_quant, every vector ISA (src/cpu/vec/lkv.h, W lanes).
 *
 *   out[r, i] = fp8(x[r, i] / s)
 *   static: s given; grid: s = scale[r / gm, i / gn] given;
 *   per tensor: s = max(absmax(x) / fp8_max, min_scale);
 *   per token: s = scales[r] = max(min(absmax(x[r]), ub) / fp8_max, min_scale)
 *   per token group (G elements): s = gscales[r, g] = lk_q_group_scale(absmax of the
 *   group, eps, ue8m0) for the elements of group g; an i8 out: trunc(clamp(x / s, -128,
 *   127)), NaN -> 0 (lk_q_i8_trunc, in vectors)
 *
 * Shapes: x, out [..., D]; scales [..., 1]; gscales [..., D / G]; the grid [rows / gm,
 * D / gn]. Fast path: last-dim stride 1 on x and out, else the reference. Work split:
 * rows, contiguous chunks per thread (lk_parallel_for). Per tensor: pass 1 writes each
 * row's absmax to a scratch array (threads over rows), the max of those is taken in row
 * order on the calling thread, pass 2 quantizes. Per token group: each row's group
 * scales first (written to gscales), then its codes (the scales read back; the row stays
 * in L1 between the two). The absmax is a max (exact, so any order gives the same bits);
 * the quantization is one f32 division per element and the fp8.h converter
 * (src/cpu/simd/fp8_store.h): results are bit-identical to the reference on every ISA
 * and thread count.
 */
#include <stdlib.h>

#include "../../core/half.h"
#include "fp8_store.h"

typedef struct {
    const lk_fp8_quant_args *a;
    float s;        /* static / per tensor: the scale */
    float *rowmax;  /* per tensor, pass 1: [rows] */
} quant_ctx;

static void absmax_rows(void *ctx, int64_t r0, int64_t r1) {
    const quant_ctx *c = ctx;
    const lk_tensor *x = &c->a->x;
    int64_t D = x->shape[x->ndim - 1];
    lk_rowit xi;
    lk_rowit_init(&xi, x, 1, r0);
    for (int64_t r = r0; r < r1; r++, lk_rowit_next(&xi)) c->rowmax[r] = lkq_row_absmax(lk_at(x, xi.off), x->dtype, D);
}

/* one grid row with literal dtypes: groups of gn >= W columns (or the whole row) one
 * scale each; per-channel scales (gn == 1, contiguous) a vector of them per vector of
 * x; other small groups element by element */
LK_ALWAYS_INLINE void grid_row_dt(char *orow, lk_dtype od, const char *xr, lk_dtype xd, int64_t D,
                                  const lk_fp8_quant_args *a, int64_t sr) {
    const lk_scale *g = &a->grid;
    int64_t gn = a->group, xes = lk_esize(xd);
    if (gn >= LKV_W || gn == D) {
        for (int64_t j = 0; j < D / gn; j++)
            lkq_fp8_row_dt(orow + j * gn, od, xr + j * gn * xes, xd, gn, lk_scale_at(g, sr, j));
    } else if (gn == 1 && g->sh == 1) {
        const char *sc = (const char *)(g->p + sr * g->sb); // [D] f32
        for (int64_t i = 0; i < D; i += LKV_W) {
            int64_t m = D - i < LKV_W ? D - i : LKV_W;
            lkv_f32 v = m == LKV_W ? lkv_load(xr + i * xes, xd) : lkv_load_part(xr + i * xes, xd, m);
            lkv_f32 k = m == LKV_W ? lkv_load(sc + i * 4, LK_F32) : lkv_load_part(sc + i * 4, LK_F32, m);
            lkq_store_fp8(orow + i, od, lkv_div(v, k), m); /* zero lanes past m: not stored */
        }
    } else {
        for (int64_t i = 0; i < D; i++) lk_q_store(orow, od, i, lk_load_f(xr, xd, i) / lk_scale_at(g, sr, i / gn));
    }
}

/* o[0, n) = trunc(clamp(x / s, -128, 127)) (NaN -> 0): lk_q_i8_trunc's codes */
LK_ALWAYS_INLINE void i8_trunc_row(int8_t *o, const char *x, lk_dtype xd, int64_t n, float s) {
    int64_t es = lk_esize(xd);
    lkv_f32 k = lkv_set1(s);
    lkv_i32 byte = lkv_i32_set1(0xff);
    for (int64_t i = 0; i < n; i += LKV_W) {
        int64_t m = n - i < LKV_W ? n - i : LKV_W;
        lkv_f32 v = lkv_div(m == LKV_W ? lkv_load(x + i * es, xd) : lkv_load_part(x + i * es, xd, m), k);
        v = lkv_zero_where(lkv_unord(v, v), v);
        lkv_i32 c = lkv_i32_and(lkv_cvtt_i32(lkv_min(lkv_max(v, lkv_set1(-128.0f)), lkv_set1(127.0f))), byte);
        if (m == LKV_W) lkv_u8_store(o + i, c);
        else lkv_u8_store_part(o + i, c, m);
    }
}

/* one row's groups of G with literal dtypes, in two passes over the row (in L1 between
 * them): the scales sr[g] (stride gst), then the codes, so that one group's absmax
 * reduction and scale division do not wait on the previous group's quantization */
LK_ALWAYS_INLINE void group_row_dt(char *orow, lk_dtype od, const char *xr, lk_dtype xd, int64_t D, int64_t G,
                                   float *sr, int64_t gst, const lk_fp8_quant_args *a) {
    int64_t xes = lk_esize(xd);
    for (int64_t g = 0; g < D / G; g++)
        sr[g * gst] = lk_q_group_scale(lkq_row_absmax_dt(xr + g * G * xes, xd, G), a->eps, a->ue8m0, od);
    for (int64_t g = 0; g < D / G; g++) {
        if (od == LK_I8) i8_trunc_row((int8_t *)orow + g * G, xr + g * G * xes, xd, G, sr[g * gst]);
        else lkq_fp8_row_dt(orow + g * G, od, xr + g * G * xes, xd, G, sr[g * gst]);
    }
}

static void quant_rows(void *ctx, int64_t r0, int64_t r1) {
    const quant_ctx *c = ctx;
    const lk_fp8_quant_args *a = c->a;
    const lk_tensor *x = &a->x, *out = &a->out;
    int64_t D = x->shape[x->ndim - 1];
    lk_rowit xi, oi, si;
    lk_rowit_init(&xi, x, 1, r0);
    lk_rowit_init(&oi, out, 1, r0);
    if (a->mode == LK_Q_TOKEN) lk_rowit_init(&si, &a->scales, 1, r0);
    if (a->mode == LK_Q_GROUP) lk_rowit_init(&si, &a->gscales, 1, r0);
    for (int64_t r = r0; r < r1; r++, lk_rowit_next(&xi), lk_rowit_next(&oi)) {
        const char *xr = lk_at(x, xi.off); // [D]
        char *orow = lk_at(out, oi.off);   // [D]
        float s = c->s;
        if (a->mode == LK_Q_STATIC_GRID) {
#define GRID_ROW(xd, od) grid_row_dt(orow, od, xr, xd, D, a, r / a->gm)
            LKQ_FP8_OUT(x->dtype, out->dtype, GRID_ROW);
#undef GRID_ROW
            continue;
        }
        if (a->mode == LK_Q_GROUP) {
            const lk_tensor *gs = &a->gscales; // [..., D / G]
            int64_t G = a->group, gst = gs->stride[gs->ndim - 1];
            float *sr = (float *)gs->data + si.off; // [D / G] stride gst
#define GROUP_ROW(xd, od) group_row_dt(orow, od, xr, xd, D, G, sr, gst, a)
            if (out->dtype == LK_I8) { /* int8 codes (vLLM's per_token_group_quant_int8) */
                if (x->dtype == LK_BF16) GROUP_ROW(LK_BF16, LK_I8);
                else if (x->dtype == LK_F16) GROUP_ROW(LK_F16, LK_I8);
                else GROUP_ROW(LK_F32, LK_I8);
            } else LKQ_FP8_OUT(x->dtype, out->dtype, GROUP_ROW);
#undef GROUP_ROW
            lk_rowit_next(&si);
            continue;
        }
        if (a->mode == LK_Q_TOKEN) {
            s = lk_q_scale(lkq_row_absmax(xr, x->dtype, D), a->ub, out->dtype);
            ((float *)a->scales.data)[si.off] = s;
            lk_rowit_next(&si);
        }
        lkq_fp8_row(orow, out->dtype, xr, x->dtype, D, s); /* fp8(x / s) */
    }
}

static lk_status fp8_quant(const lk_fp8_quant_args *a) {
    int nd = a->x.ndim;
    if (a->x.stride[nd - 1] != 1 || a->out.stride[nd - 1] != 1) return lk_ref_fp8_quant(a);
    int64_t D = a->x.shape[nd - 1], rows = lk_rows(&a->x, 1), bytes = D * (lk_esize(a->x.dtype) + 1) + 4;
    quant_ctx c = {a, a->scale, NULL};
    if (a->mode == LK_Q_TENSOR) {
        if (!(c.rowmax = malloc(sizeof(float) * (size_t)(rows > 0 ? rows : 1)))) return LK_ERR_NOMEM;
        lk_parallel_for(rows, D * lk_esize(a->x.dtype), absmax_rows, &c);
        float m = 0.0f;
        for (int64_t r = 0; r < rows; r++) m = c.rowmax[r] > m ? c.rowmax[r] : m;
        free(c.rowmax);
        c.s = *a->scale_out = lk_q_scale(m, INFINITY, a->out.dtype);
    }
    lk_parallel_for(rows, bytes, quant_rows, &c);
    return LK_OK;
}

void LKV_FN(register_fp8_quant)(lk_kernel_table *t) { t->fp8_quant = fp8_quant; }
