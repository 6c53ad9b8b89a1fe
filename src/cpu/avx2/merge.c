/*
 * merge_attn_states (N-way; the 2-way op is n = 2), AVX2 + FMA + F16C.
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
 * LK_MERGE_GROUP and summed in registers 32 lanes at a time, in state order, with FMA;
 * more non-empty states go through an f32 tile of MERGE_TILE elements, one group at a
 * time (same order, same result). One rounding per output element. bf16 states into a
 * bf16 out in one group take 16 elements per 32-byte load in even / odd lanes (shift
 * and mask in, round and blend out: no conversions, packs or NaN blends): about half
 * the instructions of the general loop. Outputs of LK_STREAM_MIN_BYTES or more are
 * written with non-temporal stores where rows are 32-byte aligned and a multiple of 64
 * bytes (no read-for-ownership: llama3 T = 4096 bf16 at 2 threads ~10 -> 11-12 GB/s;
 * a software prefetch of the rows ahead measured no gain).
 */
#include <math.h>

#include "../merge_row.h"
#include "simd.h"

#define MERGE_TILE 256
#define LK_ALWAYS_INLINE static inline __attribute__((always_inline))

/* elements [d0, d0 + len) of the row: v = (first ? 0 : tile) + sum_k c_k * p_k, then
 * stored rounded to out (last) or kept in the f32 tile (tile[j] holds element d0 + j).
 * sdt: the dtype of every state of the group, or -1 for mixed dtypes (each state's own);
 * inlined with literal ot and sdt (accumulate below) so the loops carry no dtype tests */
LK_ALWAYS_INLINE void accumulate_body(const lk_merge_group *g, int64_t d0, int64_t len,
                                      float *tile, int first, int last, int stream, char *orow,
                                      lk_dtype ot, int sdt) {
    size_t oes = (size_t)lk_merge_es(ot);
    int64_t j = 0;
    if (ot == LK_BF16 && sdt == LK_BF16 && first && last) /* bf16 -> bf16, one group */
        for (; j + 16 <= len; j += 16) { /* 16 per 32-byte load: even / odd lanes */
            __m256 ve = _mm256_setzero_ps(), vo = ve;
            for (int k = 0; k < g->n; k++) {
                __m256 c = _mm256_set1_ps(g->c[k]), xe, xo;
                lk16_bf16_split(_mm256_loadu_si256((const __m256i *)(g->p[k] + (d0 + j) * 2)), &xe, &xo);
                ve = _mm256_fmadd_ps(c, xe, ve);
                vo = _mm256_fmadd_ps(c, xo, vo);
            }
            /* every NaN here is a bf16 input's (quieted by the fma) or the default one:
             * its low 16 bits are 0, so the rounding needs no NaN branch */
            __m256i r = lk16_bf16_join_nonan(ve, vo);
            if (stream) _mm256_stream_si256((__m256i *)(orow + (d0 + j) * 2), r);
            else _mm256_storeu_si256((__m256i *)(orow + (d0 + j) * 2), r);
        }
    for (; j + 32 <= len; j += 32) {
        __m256 v0, v1, v2, v3;
        if (first) v0 = v1 = v2 = v3 = _mm256_setzero_ps();
        else {
            v0 = _mm256_loadu_ps(tile + j), v1 = _mm256_loadu_ps(tile + j + 8);
            v2 = _mm256_loadu_ps(tile + j + 16), v3 = _mm256_loadu_ps(tile + j + 24);
        }
        for (int k = 0; k < g->n; k++) {
            __m256 c = _mm256_set1_ps(g->c[k]);
            const char *p = g->p[k] + (d0 + j) * g->es[k];
            lk_dtype dt = sdt < 0 ? g->dt[k] : (lk_dtype)sdt;
            int es = g->es[k];
            v0 = _mm256_fmadd_ps(c, lk8_load(p, dt), v0);
            v1 = _mm256_fmadd_ps(c, lk8_load(p + 8 * es, dt), v1);
            v2 = _mm256_fmadd_ps(c, lk8_load(p + 16 * es, dt), v2);
            v3 = _mm256_fmadd_ps(c, lk8_load(p + 24 * es, dt), v3);
        }
        if (last) {
            char *o = orow + (d0 + j) * oes;
            if (stream) {
                lk8_stream(o, ot, v0), lk8_stream(o + 8 * oes, ot, v1);
                lk8_stream(o + 16 * oes, ot, v2), lk8_stream(o + 24 * oes, ot, v3);
            } else {
                lk8_store(o, ot, v0), lk8_store(o + 8 * oes, ot, v1);
                lk8_store(o + 16 * oes, ot, v2), lk8_store(o + 24 * oes, ot, v3);
            }
        } else {
            _mm256_storeu_ps(tile + j, v0), _mm256_storeu_ps(tile + j + 8, v1);
            _mm256_storeu_ps(tile + j + 16, v2), _mm256_storeu_ps(tile + j + 24, v3);
        }
    }
    for (; j + 8 <= len; j += 8) {
        __m256 v = first ? _mm256_setzero_ps() : _mm256_loadu_ps(tile + j);
        for (int k = 0; k < g->n; k++) {
            lk_dtype dt = sdt < 0 ? g->dt[k] : (lk_dtype)sdt;
            __m256 x = lk8_load(g->p[k] + (d0 + j) * g->es[k], dt);
            v = _mm256_fmadd_ps(_mm256_set1_ps(g->c[k]), x, v);
        }
        if (last) lk8_store(orow + (d0 + j) * oes, ot, v);
        else _mm256_storeu_ps(tile + j, v);
    }
    if (j < len) {
        int w = (int)(len - j);
        __m256 v = first ? _mm256_setzero_ps() : lk8_load_part(tile + j, LK_F32, w);
        for (int k = 0; k < g->n; k++) {
            lk_dtype dt = sdt < 0 ? g->dt[k] : (lk_dtype)sdt;
            __m256 x = lk8_load_part(g->p[k] + (d0 + j) * g->es[k], dt, w);
            v = _mm256_fmadd_ps(_mm256_set1_ps(g->c[k]), x, v);
        }
        if (last) lk8_store_part(orow + (d0 + j) * oes, ot, v, w);
        else lk8_store_part(tile + j, LK_F32, v, w);
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
    size_t oes = (size_t)lk_merge_es(ot);
    __m256 v = _mm256_set1_ps(value);
    int64_t j = 0;
    for (; j + 8 <= D; j += 8) lk8_store(orow + j * oes, ot, v);
    if (j < D) lk8_store_part(orow + j * oes, ot, v, (int)(D - j));
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
        /* whole 32-byte stores: the row and every 32- (or 16-) element block aligned */
        int stream = mc->stream && ((uintptr_t)orow & 31) == 0 && (D * lk_merge_es(out->dtype)) % 64 == 0;
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
    if (mc->stream) _mm_sfence(); /* this thread's streamed stores, before the join */
}

lk_status lk_avx2_merge_attn_states(const lk_merge_args *a) {
    int64_t D = a->out.shape[2];
    int64_t bytes = D * lk_merge_es(a->out.dtype) + 4;
    int fast = a->out.stride[2] == 1 || D <= 1;
    for (int i = 0; i < a->n; i++) {
        fast &= a->states[i].stride[2] == 1 || D <= 1;
        bytes += D * lk_merge_es(a->states[i].dtype) + 4;
    }
    if (!fast) return lk_ref_merge_attn_states(a);
    int64_t rows = a->out.shape[0] * a->out.shape[1];
    merge_ctx mc = {a, rows * D * lk_merge_es(a->out.dtype) >= LK_STREAM_MIN_BYTES};
    lk_parallel_for(rows, bytes, merge_rows, &mc);
    return LK_OK;
}
