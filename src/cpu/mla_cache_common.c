/*
 * The ISA-independent half of the SIMD concat_and_cache_mla and gather_cache kernels
 * (src/cpu/avx2/mla_cache.c, src/cpu/avx512/mla_cache.c supply the copy of one token).
 *
 * Run table: the copy of one token's entry dims [c0, c0 + n) is the same for every
 * token relative to the entry's base, because lk_paged_off(p, s, h, d) ==
 * lk_paged_off(p, s, 0, 0) + lk_paged_off(0, 0, h, d) in both layouts. The table lists
 * the maximal stretches where both the cache (through lk_paged_off) and the row advance
 * by one element: ND with packed heads gives one run per entry, ND with padded heads one
 * per head, NZ one per 16-dim chunk (or one per entry when block_size is 1 and the
 * chunks are packed). It is built once per call, O(n).
 *
 * Groups: tokens in consecutive slots of one page (a prefill, every page of a gather)
 * are handed to the copy function together, which copies run by run across the group:
 * in NZ the group's 16-dim chunks are adjacent (slot stride 16), so lines are written /
 * read whole instead of 32 bytes at a time 4 KiB apart (which thrashes one L1 set).
 *
 * Outputs of LK_STREAM_MIN_BYTES or more are written with non-temporal stores (they
 * would not stay in the last-level cache; streaming skips the read-for-ownership).
 *
 * Work split: tokens (concat: the N slot_mapping entries; gather: the sum(seq_lens)
 * output rows), contiguous chunks per thread through lk_parallel_for; groups never
 * cross a chunk. Tokens write disjoint elements (slots are unique, output rows are
 * distinct), so results do not depend on the thread count.
 */
#include <stdlib.h>

#include "../core/half.h"
#include "kernels.h"

/* runs of entry dims [c0, c0 + n) of pc against a row whose element i lives at
 * (i / rD) * rs_h + (i % rD) * rs_d; runs must hold n entries; returns the count */
static int64_t build_runs(lk_copy_run *runs, const lk_paged *pc, int64_t c0, int64_t n, int64_t rD,
                          int64_t rs_h, int64_t rs_d) {
    int64_t nr = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t c = c0 + i;
        int64_t co = lk_paged_off(pc, 0, 0, c / pc->D, c % pc->D);
        int64_t ro = (i / rD) * rs_h + (i % rD) * rs_d;
        if (nr && runs[nr - 1].coff + runs[nr - 1].len == co && runs[nr - 1].roff + runs[nr - 1].len == ro)
            runs[nr - 1].len++;
        else runs[nr++] = (lk_copy_run){co, ro, 1};
    }
    return nr;
}

/* ---------------------------------------------------------------- concat_and_cache_mla */

typedef struct {
    const lk_mla_cache_args *a;
    lk_copy_runs_fn copy;
    const lk_copy_run *runs[2];
    int64_t nruns[2];
    int stream;
} mla_ctx;

static void mla_range(void *ctx, int64_t t0, int64_t t1) {
    const mla_ctx *c = ctx;
    const lk_mla_cache_args *a = c->a;
    const lk_tensor *sm = &a->slot_mapping;               // [N]
    const lk_paged *pcs[2] = {&a->kv_c_cache, &a->k_pe_cache};
    const lk_tensor *src[2] = {&a->kv_c, &a->k_pe};       // [T, Dl], [T, Dr]
    int64_t bs = a->kv_c_cache.block_size;
    for (int64_t t = t0, g; t < t1; t += g) {
        int64_t slot = lk_load_index(sm->data, sm->dtype, t * sm->stride[0]);
        g = 1;
        if (slot < 0) continue; /* padding */
        int64_t s = slot % bs;
        while (g < LK_COPY_GROUP && t + g < t1 && s + g < bs &&
               lk_load_index(sm->data, sm->dtype, (t + g) * sm->stride[0]) == slot + g)
            g++;
        for (int p = 0; p < 2; p++) {
            const lk_paged *pc = pcs[p];
            char *entry = (char *)pc->data + lk_paged_off(pc, slot / bs, s, 0, 0) *
                                                 (int64_t)lk_dtype_size(pc->dtype);
            char *row = lk_at(src[p], t * src[p]->stride[0]);
            lk_copy_group grp = {entry, pc->dtype, lk_paged_off(pc, 0, 1, 0, 0), row, src[p]->dtype,
                                 src[p]->stride[0], g, 1, c->stream};
            c->copy(&grp, c->runs[p], c->nruns[p]);
        }
    }
}

lk_status lk_mla_cache_drive(const lk_mla_cache_args *a, lk_copy_runs_fn copy) {
    int64_t Dl = a->kv_c.shape[1], Dr = a->k_pe.shape[1];
    lk_copy_run *runs = malloc((size_t)(Dl + Dr + 1) * sizeof(lk_copy_run));
    if (!runs) return LK_ERR_NOMEM;
    mla_ctx c = {a, copy, {runs, runs + Dl}, {0, 0}, 0};
    c.nruns[0] = build_runs(runs, &a->kv_c_cache, 0, Dl, Dl + 1, 0, a->kv_c.stride[1]);
    c.nruns[1] = build_runs(runs + Dl, &a->k_pe_cache, a->pe_c0, Dr, Dr + 1, 0, a->k_pe.stride[1]);
    int64_t bytes = Dl * (int64_t)(lk_dtype_size(a->kv_c.dtype) + lk_dtype_size(a->kv_c_cache.dtype)) +
                    Dr * (int64_t)(lk_dtype_size(a->k_pe.dtype) + lk_dtype_size(a->k_pe_cache.dtype));
    int64_t written = a->slot_mapping.shape[0] * (Dl * (int64_t)lk_dtype_size(a->kv_c_cache.dtype) +
                                                  Dr * (int64_t)lk_dtype_size(a->k_pe_cache.dtype));
    c.stream = written >= LK_STREAM_MIN_BYTES;
    lk_parallel_for(a->slot_mapping.shape[0], bytes, mla_range, &c);
    free(runs);
    return LK_OK;
}

/* ---------------------------------------------------------------- gather_cache */

typedef struct {
    const lk_gather_cache_args *a;
    lk_copy_runs_fn copy;
    const lk_copy_run *runs;
    int64_t nruns;
    int stream;
} gather_ctx;

static void gather_range(void *ctx, int64_t t0, int64_t t1) {
    const gather_ctx *c = ctx;
    const lk_gather_cache_args *a = c->a;
    const lk_paged *pc = &a->cache;
    const lk_tensor *out = &a->out;                          // [S, H, D]
    const int32_t *btd = a->block_table.data;                // [B, max_pages]
    const int32_t *sld = a->seq_lens.data;                   // [B]
    int64_t bt0 = a->block_table.stride[0], bt1 = a->block_table.stride[1];
    int64_t sl0 = a->seq_lens.stride[0], bs = pc->block_size, ces = (int64_t)lk_dtype_size(pc->dtype);
    /* request b and token j of output row t0 */
    int64_t b = 0, j = t0, len = sld[0];
    while (j >= len) {
        j -= len;
        len = sld[++b * sl0];
    }
    int64_t cstep = lk_paged_off(pc, 0, 1, 0, 0);
    for (int64_t t = t0, g; t < t1; t += g, j += g) {
        while (j == len) { /* next non-empty request */
            j = 0;
            len = sld[++b * sl0];
        }
        /* tokens j .. j + g - 1: consecutive slots of one page */
        int64_t s = j % bs;
        g = LK_COPY_GROUP;
        if (g > len - j) g = len - j;
        if (g > bs - s) g = bs - s;
        if (g > t1 - t) g = t1 - t;
        int64_t page = btd[b * bt0 + (j / bs) * bt1];
        char *entry = (char *)pc->data + lk_paged_off(pc, page, s, 0, 0) * ces;
        lk_copy_group grp = {entry, pc->dtype, cstep, lk_at(out, t * out->stride[0]), out->dtype,
                             out->stride[0], g, 0, c->stream};
        c->copy(&grp, c->runs, c->nruns);
    }
}

lk_status lk_gather_cache_drive(const lk_gather_cache_args *a, lk_copy_runs_fn copy) {
    const lk_paged *pc = &a->cache;
    int64_t C = pc->H * pc->D;
    lk_copy_run *runs = malloc((size_t)(C + 1) * sizeof(lk_copy_run));
    if (!runs) return LK_ERR_NOMEM;
    gather_ctx c = {a, copy, runs, 0, 0};
    c.nruns = build_runs(runs, pc, 0, C, pc->D, a->out.stride[1], a->out.stride[2]);
    int64_t bytes = C * (int64_t)(lk_dtype_size(pc->dtype) + lk_dtype_size(a->out.dtype));
    c.stream = a->out.shape[0] * C * (int64_t)lk_dtype_size(a->out.dtype) >= LK_STREAM_MIN_BYTES;
    lk_parallel_for(a->out.shape[0], bytes, gather_range, &c);
    free(runs);
    return LK_OK;
}
