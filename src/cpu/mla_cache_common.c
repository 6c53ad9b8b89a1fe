/*
 * The ISA-independent half of the SIMD concat_and_cache_mla and gather_cache kernels
 * (src/cpu/simd/mla_cache.c, compiled per vector ISA, supplies the copy of one group of
 * tokens).
 *
 * Run table: the copy of one token's entry dims [c0, c0 + n) is the same for every
 * token relative to the entry's base, because lk_paged_off(p, s, h, d) ==
 * lk_paged_off(p, s, 0, 0) + lk_paged_off(0, 0, h, d) in both layouts. The table lists
 * the maximal stretches where both the cache (through lk_paged_off) and the row advance
 * by one element: ND with packed heads gives one run per entry, ND with padded heads one
 * per head, NZ one per tile-row chunk (16 dims, 32 for fp8 caches; or one per entry
 * when block_size is 1 and the chunks are packed). It is built once per call.
 *
 * Groups: tokens in consecutive slots of one page (a prefill, every page of a gather)
 * are handed to the copy function together. Short runs (NZ) are copied run by run
 * across the group: the group's 16-dim chunks are adjacent (slot stride 16), so lines
 * are written / read whole instead of 32 bytes at a time 4 KiB apart (which thrashes
 * one L1 set). Long runs (ND) go token by token, so a token's whole entry ([latent |
 * rope] in one buffer) is written before the next one's, in address order.
 *
 * Outputs of LK_STREAM_MIN_BYTES or more are written with non-temporal stores (they
 * would not stay in the last-level cache; streaming skips the read-for-ownership),
 * with one sfence at the end of each thread's range.
 *
 * Work split: tokens (concat: the N slot_mapping entries; gather: the sum(seq_lens)
 * output rows), contiguous chunks per thread through lk_parallel_for; groups never
 * cross a chunk. Tokens write disjoint elements (slots are unique, output rows are
 * distinct), so results do not depend on the thread count.
 */
#include <stdlib.h>

#include "../core/half.h"
#include "kernels.h"

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* runs of entry dims [c0, c0 + n) of pc against a row whose element i lives at
 * (i / rD) * rs_h + (i % rD) * rs_d; runs must hold n entries; returns the count.
 * Walks unit-stride pieces (the rest of a head / NZ chunk / row head), not elements. */
static int64_t build_runs(lk_copy_run *runs, const lk_paged *pc, int64_t c0, int64_t n, int64_t rD,
                          int64_t rs_h, int64_t rs_d) {
    int64_t nr = 0;
    for (int64_t i = 0, step; i < n; i += step) {
        int64_t c = c0 + i, h = c / pc->D, d = c % pc->D;
        int64_t co = lk_paged_off(pc, 0, 0, h, d), ro = (i / rD) * rs_h + (i % rD) * rs_d;
        step = pc->s3 != 1 ? 1 : pc->layout == LK_KV_NZ ? pc->tile - c % pc->tile : pc->D - d;
        step = min64(min64(step, rs_d != 1 ? 1 : rD - i % rD), n - i);
        if (nr && runs[nr - 1].coff + runs[nr - 1].len == co && runs[nr - 1].roff + runs[nr - 1].len == ro)
            runs[nr - 1].len += step;
        else runs[nr++] = (lk_copy_run){co, ro, step};
    }
    return nr;
}

/* long runs: token-major order (see the top) */
static int long_runs(int64_t elems, int64_t nruns) { return elems >= 64 * nruns; }

/* after a range's streamed stores: one sfence, not one per copy call (which would wait
 * for every token's lines to reach memory) */
static void fence(lk_copy_runs_fn copy, int stream) {
    if (!stream) return;
    lk_copy_group f = {0};
    f.stream = f.fence = 1;
    copy(&f);
}

/* ---------------------------------------------------------------- concat_and_cache_mla */

typedef struct {
    const lk_mla_cache_args *a;
    lk_copy_runs_fn copy;
    lk_copy_group proto; /* parts with runs, steps and dtypes; pointers set per group */
    int64_t ces[2], res[2];
} mla_ctx;

static void mla_range(void *ctx, int64_t t0, int64_t t1) {
    const mla_ctx *c = ctx;
    const lk_mla_cache_args *a = c->a;
    const lk_tensor *sm = &a->slot_mapping; // [N]
    const lk_paged *pcs[2] = {&a->kv_c_cache, &a->k_pe_cache};
    const lk_tensor *src[2] = {&a->kv_c, &a->k_pe}; // [T, Dl], [T, Dr]
    const void *smd = sm->data;
    int64_t bs = a->kv_c_cache.block_size, ss = sm->stride[0];
    lk_dtype sdt = sm->dtype;
    lk_copy_group g = c->proto;
    for (int64_t t = t0; t < t1; t += g.ntok) {
        int64_t slot = lk_load_index(smd, sdt, t * ss);
        g.ntok = 1;
        if (slot < 0) continue; /* padding */
        int64_t page = slot / bs, s = slot % bs;
        while (g.ntok < LK_COPY_GROUP && t + g.ntok < t1 && s + g.ntok < bs &&
               lk_load_index(smd, sdt, (t + g.ntok) * ss) == slot + g.ntok)
            g.ntok++;
        for (int p = 0; p < 2; p++) {
            if (!g.part[p].nruns) continue; /* empty part: its data may be NULL */
            g.part[p].cache = (char *)pcs[p]->data + lk_paged_off(pcs[p], page, s, 0, 0) * c->ces[p];
            g.part[p].row = (char *)src[p]->data + t * g.part[p].rstep * c->res[p];
        }
        c->copy(&g);
    }
    fence(c->copy, g.stream);
}

lk_status lk_mla_cache_drive(const lk_mla_cache_args *a, lk_copy_runs_fn copy) {
    int64_t Dl = a->kv_c.shape[1], Dr = a->k_pe.shape[1];
    lk_copy_run *runs = malloc((size_t)(Dl + Dr + 1) * sizeof(lk_copy_run));
    if (!runs) return LK_ERR_NOMEM;
    mla_ctx c;
    c.a = a;
    c.copy = copy;
    const lk_paged *pcs[2] = {&a->kv_c_cache, &a->k_pe_cache};
    const lk_tensor *src[2] = {&a->kv_c, &a->k_pe};
    int64_t c0[2] = {0, a->pe_c0}, n[2] = {Dl, Dr}, bytes = 0, written = 0, nruns = 0;
    lk_copy_group *g = &c.proto;
    *g = (lk_copy_group){0};
    g->nparts = 2;
    g->to_cache = 1;
    g->scale = a->scale;
    for (int p = 0; p < 2; p++) {
        c.ces[p] = (int64_t)lk_dtype_size(pcs[p]->dtype);
        c.res[p] = (int64_t)lk_dtype_size(src[p]->dtype);
        lk_copy_run *r = runs + (p ? Dl : 0);
        /* row step 0 for a single token or an empty part (Dl or Dr = 0): those strides are
         * unvalidated (maybe huge) and the copy functions multiply them */
        int64_t rstep = src[p]->shape[0] > 1 && n[p] > 0 ? src[p]->stride[0] : 0;
        g->part[p] = (lk_copy_part){NULL, pcs[p]->dtype, lk_paged_off(pcs[p], 0, 1, 0, 0), NULL, src[p]->dtype,
                                    rstep, r, build_runs(r, pcs[p], c0[p], n[p], n[p] + 1, 0, src[p]->stride[1])};
        nruns += g->part[p].nruns;
        bytes += n[p] * (c.ces[p] + c.res[p]);
        written += n[p] * c.ces[p];
    }
    g->token_major = long_runs(Dl + Dr, nruns);
    g->stream = a->slot_mapping.shape[0] * written >= LK_STREAM_MIN_BYTES;
    lk_parallel_for(a->slot_mapping.shape[0], bytes, mla_range, &c);
    free(runs);
    return LK_OK;
}

/* ---------------------------------------------------------------- gather_cache */

typedef struct {
    const lk_gather_cache_args *a;
    lk_copy_runs_fn copy;
    lk_copy_group proto;
    int64_t ces, oes;
} gather_ctx;

static void gather_range(void *ctx, int64_t t0, int64_t t1) {
    const gather_ctx *c = ctx;
    const lk_gather_cache_args *a = c->a;
    const lk_paged *pc = &a->cache;
    const lk_tensor *out = &a->out;           // [S, H, D]
    const int32_t *btd = a->block_table.data; // [B, max_pages]
    const int32_t *sld = a->seq_lens.data;    // [B]
    int64_t bt0 = a->block_table.stride[0], bt1 = a->block_table.stride[1];
    int64_t sl0 = a->seq_lens.stride[0], bs = pc->block_size;
    lk_copy_group g = c->proto;
    /* request b and token j of output row t0; st: the request's start position */
    int64_t b = 0, j = t0, len = sld[0];
    while (j >= len) {
        j -= len;
        len = sld[++b * sl0];
    }
    int64_t st = lk_gather_start(a, b);
    for (int64_t t = t0; t < t1; t += g.ntok, j += g.ntok) {
        while (j == len) { /* next non-empty request */
            j = 0;
            len = sld[++b * sl0];
            st = lk_gather_start(a, b);
        }
        /* tokens j .. j + ntok - 1: consecutive slots of one page, from position st + j */
        int64_t s = (st + j) % bs;
        g.ntok = min64(min64(LK_COPY_GROUP, len - j), min64(bs - s, t1 - t));
        int64_t page = btd[b * bt0 + ((st + j) / bs) * bt1];
        g.part[0].cache = (char *)pc->data + lk_paged_off(pc, page, s, 0, 0) * c->ces;
        g.part[0].row = (char *)out->data + t * out->stride[0] * c->oes;
        c->copy(&g);
    }
    fence(c->copy, g.stream);
}

lk_status lk_gather_cache_drive(const lk_gather_cache_args *a, lk_copy_runs_fn copy) {
    const lk_paged *pc = &a->cache;
    int64_t C = pc->H * pc->D;
    lk_copy_run *runs = malloc((size_t)(C + 1) * sizeof(lk_copy_run));
    if (!runs) return LK_ERR_NOMEM;
    gather_ctx c;
    c.a = a;
    c.copy = copy;
    c.ces = (int64_t)lk_dtype_size(pc->dtype);
    c.oes = (int64_t)lk_dtype_size(a->out.dtype);
    lk_copy_group *g = &c.proto;
    *g = (lk_copy_group){0};
    g->nparts = 1;
    g->scale = a->scale;
    int64_t rstep = a->out.shape[0] > 1 ? a->out.stride[0] : 0; /* as in concat */
    g->part[0] = (lk_copy_part){NULL, pc->dtype, lk_paged_off(pc, 0, 1, 0, 0), NULL, a->out.dtype, rstep,
                                runs, build_runs(runs, pc, 0, C, pc->D, a->out.stride[1], a->out.stride[2])};
    g->token_major = long_runs(C, g->part[0].nruns);
    g->stream = a->out.shape[0] * C * c.oes >= LK_STREAM_MIN_BYTES;
    lk_parallel_for(a->out.shape[0], C * (c.ces + c.oes), gather_range, &c);
    free(runs);
    return LK_OK;
}
