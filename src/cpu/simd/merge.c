/*
 * merge_attn_states (N-way; the 2-way op is n = 2), every vector ISA (src/cpu/vec/lkv.h,
 * W lanes).
 *
 *   per (t, h): m = max finite lse_i; c_i = exp(lse_i - m) / sum_k exp(lse_k - m)
 *   out[t, h, :] = sum_i c_i * states_i[t, h, :];  out_lse[t, h] = m + log(sum ...)
 * The per-row weights, out_lse and the -inf / NaN rules are scalar and shared with the
 * reference (src/cpu/merge_row.h over src/common/attn_state.h); only the D-long
 * weighted sum is vectorised.
 *
 * Shapes: out, states_i [T, H, D] (each its own float dtype); lses_i, out_lse [T, H]
 * f32, any strides. Fast path: last-dim stride 1 on out and every state, else the
 * reference. Work split: the T * H (token, head) rows, contiguous chunks per thread
 * (lk_parallel_for). Per row the non-empty states are taken in groups of up to
 * LK_MERGE_GROUP and summed in registers 4W lanes at a time, in state order, with FMA;
 * more non-empty states go through an f32 tile of MERGE_TILE elements, one group at a
 * time (same order, same result). One rounding per output element. bf16 states into a
 * bf16 out in one group take 2W elements per load in even / odd lanes (shift
 * and mask in, round and blend out: no conversions, packs or NaN blends): about half
 * the instructions of the general loop. Outputs of LK_STREAM_MIN_BYTES or more are
 * written with non-temporal stores where rows are aligned to the vector width and a
 * multiple of twice it (no read-for-ownership: llama3 T = 4096 bf16 at 2 threads ~10 -> 11-12 GB/s;
 * a software prefetch of the rows ahead measured no gain).
 * An fp8 out (lk_merge_attn_states_scaled): every row goes through the f32 tile (same
 * sums), then fp8(tile / out_scale) per element (fp8_store.h): bit-identical to the
 * reference, whose sum is the same FMA chain.
 */
#include <math.h>

#include "../merge_row.h"
#include "../vec/lkv.h"
#include "fp8_store.h"

#define MERGE_TILE 256

/* elements [d0, d0 + len) of the row: v = (first ? 0 : tile) + sum_k c_k * p_k, then
 * stored rounded to out (last) or kept in the f32 tile (tile[j] holds element d0 + j).
 * sdt: the dtype of every state of the group, or -1 for mixed dtypes (each state's own);
 * inlined with literal ot and sdt (accumulate below) so the loops carry no dtype tests */
LK_ALWAYS_INLINE void accumulate_body(const lk_merge_group *g, int64_t d0, int64_t len, float *tile, int first,
                                      int last, int stream, char *orow, lk_dtype ot, int sdt) {
    int64_t oes = lk_esize(ot), j = 0;
    if (ot == LK_BF16 && sdt == LK_BF16 && first && last) /* bf16 -> bf16, one group */
        for (; j + 2 * LKV_W <= len; j += 2 * LKV_W) { /* 2W per load: even / odd lanes */
            lkv_f32 ve = lkv_zero(), vo = ve;
            for (int k = 0; k < g->n; k++) {
                lkv_f32 c = lkv_set1(g->c[k]), xe, xo;
                lkv_bf16_load_eo(g->p[k] + (d0 + j) * 2, &xe, &xo);
                ve = lkv_fma(c, xe, ve);
                vo = lkv_fma(c, xo, vo);
            }
            /* every NaN here is a bf16 input's (quieted by the fma) or the default one:
             * its low 16 bits are 0, so the rounding needs no NaN branch */
            lkv_bf16_store_eo_nonan(orow + (d0 + j) * 2, ve, vo, stream);
        }
    for (; j + 4 * LKV_W <= len; j += 4 * LKV_W) {
        lkv_f32 v0, v1, v2, v3;
        if (first) v0 = v1 = v2 = v3 = lkv_zero();
        else {
            v0 = lkv_loadu(tile + j), v1 = lkv_loadu(tile + j + LKV_W);
            v2 = lkv_loadu(tile + j + 2 * LKV_W), v3 = lkv_loadu(tile + j + 3 * LKV_W);
        }
        for (int k = 0; k < g->n; k++) {
            lkv_f32 c = lkv_set1(g->c[k]);
            const char *p = g->p[k] + (d0 + j) * g->es[k];
            lk_dtype dt = sdt < 0 ? g->dt[k] : (lk_dtype)sdt;
            int64_t es = g->es[k];
            v0 = lkv_fma(c, lkv_load(p, dt), v0);
            v1 = lkv_fma(c, lkv_load(p + LKV_W * es, dt), v1);
            v2 = lkv_fma(c, lkv_load(p + 2 * LKV_W * es, dt), v2);
            v3 = lkv_fma(c, lkv_load(p + 3 * LKV_W * es, dt), v3);
        }
        if (last) {
            char *o = orow + (d0 + j) * oes;
            if (stream) {
                lkv_stream(o, ot, v0), lkv_stream(o + LKV_W * oes, ot, v1);
                lkv_stream(o + 2 * LKV_W * oes, ot, v2), lkv_stream(o + 3 * LKV_W * oes, ot, v3);
            } else {
                lkv_store(o, ot, v0), lkv_store(o + LKV_W * oes, ot, v1);
                lkv_store(o + 2 * LKV_W * oes, ot, v2), lkv_store(o + 3 * LKV_W * oes, ot, v3);
            }
        } else {
            lkv_storeu(tile + j, v0), lkv_storeu(tile + j + LKV_W, v1);
            lkv_storeu(tile + j + 2 * LKV_W, v2), lkv_storeu(tile + j + 3 * LKV_W, v3);
        }
    }
    for (; j + LKV_W <= len; j += LKV_W) {
        lkv_f32 v = first ? lkv_zero() : lkv_loadu(tile + j);
        for (int k = 0; k < g->n; k++) {
            lk_dtype dt = sdt < 0 ? g->dt[k] : (lk_dtype)sdt;
            lkv_f32 x = lkv_load(g->p[k] + (d0 + j) * g->es[k], dt);
            v = lkv_fma(lkv_set1(g->c[k]), x, v);
        }
        if (last) lkv_store(orow + (d0 + j) * oes, ot, v);
        else lkv_storeu(tile + j, v);
    }
    if (j < len) {
        int64_t w = len - j;
        lkv_f32 v = first ? lkv_zero() : lkv_load_part(tile + j, LK_F32, w);
        for (int k = 0; k < g->n; k++) {
            lk_dtype dt = sdt < 0 ? g->dt[k] : (lk_dtype)sdt;
            lkv_f32 x = lkv_load_part(g->p[k] + (d0 + j) * g->es[k], dt, w);
            v = lkv_fma(lkv_set1(g->c[k]), x, v);
        }
        if (last) lkv_store_part(orow + (d0 + j) * oes, ot, v, w);
        else lkv_store_part(tile + j, LK_F32, v, w);
    }
}

LK_ALWAYS_INLINE void accumulate_out(const lk_merge_group *g, int64_t d0, int64_t len,
                                     float *tile, int first, int last, int stream, char *orow,
                                     lk_dtype ot, int sdt) {
    switch (sdt) {
    case LK_F32: accumulate_body(g, d0, len, tile, first, last, stream, orow, ot, LK_F32); break;
    case LK_F16: accumulate_body(g, d0, len, tile, first, last, stream, orow, ot, LK_F16); break;
    case LK_BF16: accumulate_body(g, d0, len, tile, first, last, stream, orow, ot, LK_BF16); break;
    default: accumulate_body(g, d0, len, tile, first, last, stream, orow, ot, -1); break;
    }
}

/* accumulate_body specialised for out's dtype and the group's common state dtype */
static void accumulate(const lk_merge_group *g, int64_t d0, int64_t len, float *tile, int first,
                       int last, int stream, char *orow, lk_dtype ot) {
    int sdt = g->n > 0 ? (int)g->dt[0] : LK_F32;
    for (int k = 1; k < g->n; k++)
        if ((int)g->dt[k] != sdt) sdt = -1;
    switch (ot) {
    case LK_F32: accumulate_out(g, d0, len, tile, first, last, stream, orow, LK_F32, sdt); break;
    case LK_F16: accumulate_out(g, d0, len, tile, first, last, stream, orow, LK_F16, sdt); break;
    default: accumulate_out(g, d0, len, tile, first, last, stream, orow, LK_BF16, sdt); break;
    }
}

/* the whole row set to value (0 for an all-empty row, NaN for a NaN LSE) */
static void fill_row(char *orow, lk_dtype ot, int64_t D, float value) {
    int64_t oes = lk_esize(ot), j = 0;
    lkv_f32 v = lkv_set1(value);
    for (; j + LKV_W <= D; j += LKV_W) lkv_store(orow + j * oes, ot, v);
    if (j < D) lkv_store_part(orow + j * oes, ot, v, D - j);
}

/* fp8 out: row (t, h) summed into the f32 tile MERGE_TILE elements at a time, each
 * chunk then stored as fp8(value / out_scale) */
static void merge_row_fp8(const lk_merge_args *a, const lk_merge_row *row, int64_t t, int64_t h, char *orow) {
    int64_t D = a->out.shape[2];
    float tile[MERGE_TILE];
    for (int64_t d0 = 0; d0 < D; d0 += MERGE_TILE) {
        int64_t len = D - d0 < MERGE_TILE ? D - d0 : MERGE_TILE;
        if (row->kind != LK_MERGE_NORMAL) {
            float v = row->kind == LK_MERGE_NAN ? NAN : 0.0f;
            for (int64_t k = 0; k < len; k++) tile[k] = v;
        } else {
            lk_merge_group g;
            int i = 0, first = 1, last;
            do {
                lk_merge_next_group(a, row, t, h, &i, &g);
                last = i >= a->n;
                accumulate(&g, d0, len, tile, first, 0, 0, NULL, LK_F32);
                first = 0;
            } while (!last);
        }
        lkq_fp8_row(orow + d0, a->out.dtype, (const char *)tile, LK_F32, len, a->out_scale);
    }
}

typedef struct {
    const lk_merge_args *a;
    int stream;    /* out of LK_STREAM_MIN_BYTES or more: non-temporal stores where aligned */
} merge_ctx;

static void merge_rows(void *ctx, int64_t r0, int64_t r1) {
    const merge_ctx *mc = ctx;
    const lk_merge_args *a = mc->a;
    const lk_tensor *out = &a->out;
    int64_t H = out->shape[1], D = out->shape[2];
    int64_t t = r0 / H, h = r0 % H;
    for (int64_t r = r0; r < r1; r++, h = h + 1 == H ? 0 : h + 1, t += h == 0) {
        lk_merge_row row;
        lk_merge_row_init(&row, a, t, h); /* also writes out_lse[t, h] */
        if (D == 0) continue;
        char *orow = lk_merge_row_ptr(out, t, h); // [D]
        if (out->dtype == LK_F8E4M3 || out->dtype == LK_F8E5M2) {
            merge_row_fp8(a, &row, t, h, orow);
            continue;
        }
        /* whole vector stores: the row and every 4W- (or 2W-) element block aligned */
        int stream = mc->stream && ((uintptr_t)orow & (LKV_BYTES - 1)) == 0 &&
                     (D * lk_esize(out->dtype)) % (2 * LKV_BYTES) == 0;
        if (row.kind != LK_MERGE_NORMAL) {
            fill_row(orow, out->dtype, D, row.kind == LK_MERGE_NAN ? NAN : 0.0f);
            continue;
        }
        lk_merge_group g;
        int i = 0;
        lk_merge_next_group(a, &row, t, h, &i, &g);
        if (i >= a->n) { /* every non-empty state in one group: registers only */
            accumulate(&g, 0, D, NULL, 1, 1, stream, orow, out->dtype);
            continue;
        }
        float tile[MERGE_TILE];
        for (int64_t d0 = 0; d0 < D; d0 += MERGE_TILE) {
            int64_t len = D - d0 < MERGE_TILE ? D - d0 : MERGE_TILE;
            int first = 1, last;
            i = 0;
            do {
                lk_merge_next_group(a, &row, t, h, &i, &g);
                last = i >= a->n;
                accumulate(&g, d0, len, tile, first, last, last && stream, orow, out->dtype);
                first = 0;
            } while (!last);
        }
    }
    if (mc->stream) lkv_sfence(); /* this thread's streamed stores, before the join */
}

static lk_status merge_attn_states(const lk_merge_args *a) {
    int64_t D = a->out.shape[2];
    int64_t bytes = D * lk_esize(a->out.dtype) + 4;
    int fast = a->out.stride[2] == 1 || D <= 1;
    for (int i = 0; i < a->n; i++) {
        fast &= a->states[i].stride[2] == 1 || D <= 1;
        bytes += D * lk_esize(a->states[i].dtype) + 4;
    }
    if (!fast) return lk_ref_merge_attn_states(a);
    int64_t rows = a->out.shape[0] * a->out.shape[1];
    merge_ctx mc = {a, rows * D * lk_esize(a->out.dtype) >= LK_STREAM_MIN_BYTES};
    lk_parallel_for(rows, bytes, merge_rows, &mc);
    return LK_OK;
}

void LKV_FN(register_merge)(lk_kernel_table *t) { t->merge_attn_states = merge_attn_states; }
