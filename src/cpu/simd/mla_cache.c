/*
 * concat_and_cache_mla and gather_cache, every vector ISA (src/cpu/vec/lkv.h, W lanes).
 *
 *   concat: cache(slot_mapping[t]) = round([kv_c[t] | k_pe[t]]);  gather: out[t] =
 *   round(cache entry of token t) (formulas and shapes in ref/mla_cache.c).
 *
 * Fast path: unit stride along the copied dims on both sides (source / out last-dim
 * stride 1, cache dim stride 1: ND rows or NZ 16-element chunks); other layouts go to
 * the reference. The token loop, its split over threads, the grouping of tokens in
 * consecutive slots and the run table (contiguous stretches of each entry) are shared
 * in mla_cache_common.c; this file copies one group's runs: same dtype = vector moves
 * (bit copy), else W lanes converted through f32 with one rounding (lkv.h,
 * bit-identical to half.h). Large outputs use non-temporal stores
 * where the destination is aligned. fp8 caches (since 0.3): into fp8 the lanes are
 * divided by the scale before the fp8 store, out of fp8 multiplied by it after the exact
 * fp8 load (one IEEE operation, as the reference; fp8 stores bit-identical to fp8.h);
 * they take the per-run path (not copy_4x16) and ordinary stores.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fp8_store.h"

static inline int is_fp8(lk_dtype dt) { return dt == LK_F8E4M3 || dt == LK_F8E5M2; }

/* dst[i] = round(src[i]) (into fp8: fp8(src[i] / scale); out of fp8: round(src[i] *
 * scale)), i < n, contiguous; stream: non-temporal when dst is aligned (not fp8) */
static inline void convert(char *dst, lk_dtype dt, const char *src, lk_dtype st, int64_t n, int stream,
                           float scale) {
    int64_t des = lk_esize(dt), ses = lk_esize(st), i = 0;
    if (is_fp8(dt) || is_fp8(st)) {
        lkq_fp8_row(dst, dt, src, st, n, scale);
        return;
    }
    if (stream && ((uintptr_t)dst & (uintptr_t)(LKV_W * des - 1)) == 0)
        for (; i + LKV_W <= n; i += LKV_W) lkv_stream(dst + i * des, dt, lkv_load(src + i * ses, st));
    for (; i + LKV_W <= n; i += LKV_W) lkv_store(dst + i * des, dt, lkv_load(src + i * ses, st));
    if (i < n) lkv_store_part(dst + i * des, dt, lkv_load_part(src + i * ses, st, n - i), n - i);
}

LK_ALWAYS_INLINE void put32(char *d, lkv_c32 v, int stream) {
    if (stream) lkv_c32_stream(d, v);
    else lkv_c32_storeu(d, v);
}

/* 4 runs of 16 elements (4 NZ chunks) for every token of the group, each token's loads
 * issued before its stores. The chunks of one token share their address bits 0-11
 * (chunk stride = block_size x 16 elements, 4 KiB for page 128 in 16-bit), so a
 * run-by-run loop has about a quarter of its loads 4K-alias a store still in flight
 * (3-4x slower on Zen 3); batching 4 runs cuts that to a few percent. Into an NZ
 * cache, 16-bit chunks of 2 consecutive slots make one 64-byte line: they are stored
 * back to back, so a streamed line is complete at once (about 20% faster at 16+ MiB). */
static inline void copy_4x16(const lk_copy_group *g, const lk_copy_part *q, const lk_copy_run *runs) {
    int64_t ces = lk_esize(q->ct), res = lk_esize(q->rt);
    lk_dtype dt = g->to_cache ? q->ct : q->rt, st = g->to_cache ? q->rt : q->ct;
    int64_t des = lk_esize(dt), ses = lk_esize(st);
    int64_t db = (g->to_cache ? q->cstep : q->rstep) * des, sb = (g->to_cache ? q->rstep : q->cstep) * ses;
    /* streamed stores are 32 bytes (bit copies) or W elements (conversions) */
    uintptr_t al = (uintptr_t)(dt != st && LKV_W * des > 32 ? LKV_W * des : 32) - 1;
    char *d[4];
    const char *s[4];
    int stream = g->stream && !(db & (int64_t)al);
    for (int k = 0; k < 4; k++) {
        char *cp = q->cache + runs[k].coff * ces, *rp = q->row + runs[k].roff * res;
        d[k] = g->to_cache ? cp : rp;
        s[k] = g->to_cache ? rp : cp;
        stream &= !((uintptr_t)d[k] & al);
    }
    /* token i's chunks are at d[k] + od, s[k] + os: four fixed bases and two scalar
     * offsets (incrementing the four pointers themselves let the compiler pack them into
     * a vector register and extract each one per access: ~20% slower on AVX-512) */
    int64_t i = 0, od = 0, os = 0;
    if (dt == st && des == 2 && db == 32) /* into NZ: 2 tokens fill a line, store them together */
        for (; i + 2 <= g->ntok; i += 2, od += 2 * db, os += 2 * sb) {
            lkv_c32 v[8];
            for (int k = 0; k < 4; k++) v[2 * k] = lkv_c32_loadu(s[k] + os), v[2 * k + 1] = lkv_c32_loadu(s[k] + os + sb);
            for (int k = 0; k < 4; k++) put32(d[k] + od, v[2 * k], stream), put32(d[k] + od + 32, v[2 * k + 1], stream);
        }
    if (dt != st) /* W lanes through f32, one rounding */
        for (; i < g->ntok; i++, od += db, os += sb) {
            lkv_f32 v[4][16 / LKV_W];
            for (int k = 0; k < 4; k++)
                for (int e = 0; e < 16 / LKV_W; e++) v[k][e] = lkv_load(s[k] + os + e * LKV_W * ses, st);
            for (int k = 0; k < 4; k++)
                for (int e = 0; e < 16 / LKV_W; e++)
                    if (stream) lkv_stream(d[k] + od + e * LKV_W * des, dt, v[k][e]);
                    else lkv_store(d[k] + od + e * LKV_W * des, dt, v[k][e]);
        }
    else if (des == 2) /* 32 bytes a chunk */
        for (; i < g->ntok; i++, od += db, os += sb) {
            lkv_c32 v[4];
            for (int k = 0; k < 4; k++) v[k] = lkv_c32_loadu(s[k] + os);
            for (int k = 0; k < 4; k++) put32(d[k] + od, v[k], stream);
        }
    else /* f32: 64 bytes a chunk */
        for (; i < g->ntok; i++, od += db, os += sb) {
            lkv_c32 v[8];
            for (int k = 0; k < 4; k++) v[2 * k] = lkv_c32_loadu(s[k] + os), v[2 * k + 1] = lkv_c32_loadu(s[k] + os + 32);
            for (int k = 0; k < 4; k++) put32(d[k] + od, v[2 * k], stream), put32(d[k] + od + 32, v[2 * k + 1], stream);
        }
}

/* one run of n elements of one token */
static inline void copy_run(char *cp, lk_dtype ct, char *rp, lk_dtype rt, int64_t n, int to_cache, int stream,
                            float scale) {
    if (ct == rt) lkv_copy_bytes(to_cache ? cp : rp, to_cache ? rp : cp, (size_t)(n * lk_esize(ct)), stream);
    else if (to_cache) convert(cp, ct, rp, rt, n, stream, scale);
    else convert(rp, rt, cp, ct, n, stream, scale);
}

/* one group of tokens (see lk_copy_group) */
static void copy_runs(const lk_copy_group *g) {
    if (g->token_major)
        for (int64_t i = 0; i < g->ntok; i++)
            for (int p = 0; p < g->nparts; p++) {
                const lk_copy_part *q = &g->part[p];
                if (!q->nruns) continue; /* an empty part: cache and row may be NULL */
                int64_t ces = lk_esize(q->ct), res = lk_esize(q->rt);
                char *cp = q->cache + i * q->cstep * ces, *rp = q->row + i * q->rstep * res;
                for (int64_t r = 0; r < q->nruns; r++)
                    copy_run(cp + q->runs[r].coff * ces, q->ct, rp + q->runs[r].roff * res, q->rt, q->runs[r].len,
                             g->to_cache, g->stream, g->scale);
            }
    else
        for (int p = 0; p < g->nparts; p++) {
            const lk_copy_part *q = &g->part[p];
            const lk_copy_run *runs = q->runs;
            int64_t ces = lk_esize(q->ct), res = lk_esize(q->rt), cb = q->cstep * ces, rb = q->rstep * res;
            int wide = ces >= 2 && res >= 2; /* copy_4x16 moves 16-/32-bit chunks only */
            for (int64_t r = 0; r < q->nruns; r++) {
                if (wide && runs[r].len == 16 && r + 4 <= q->nruns && runs[r + 1].len == 16 && runs[r + 2].len == 16 &&
                    runs[r + 3].len == 16) {
                    copy_4x16(g, q, runs + r);
                    r += 3;
                    continue;
                }
                char *cp = q->cache + runs[r].coff * ces, *rp = q->row + runs[r].roff * res;
                for (int64_t i = 0; i < g->ntok; i++, cp += cb, rp += rb)
                    copy_run(cp, q->ct, rp, q->rt, runs[r].len, g->to_cache, g->stream, g->scale);
            }
        }
    if (g->fence) lkv_sfence();
}

static lk_status concat_and_cache_mla(const lk_mla_cache_args *a) {
    if (a->kv_c.stride[1] != 1 || a->k_pe.stride[1] != 1 || a->kv_c_cache.s3 != 1 ||
        a->k_pe_cache.s3 != 1)
        return lk_ref_concat_and_cache_mla(a);
    return lk_mla_cache_drive(a, copy_runs);
}

static lk_status gather_cache(const lk_gather_cache_args *a) {
    if (a->out.stride[2] != 1 || a->cache.s3 != 1) return lk_ref_gather_cache(a);
    return lk_gather_cache_drive(a, copy_runs);
}

/* ---------------------------------------------------------------- fp8_ds_mla records */

/* dst[0, n) = src[0, n) as bf16 / out's dtype: a bit copy for the same dtype (the
 * reference's memcpy), else one rounding */
static inline void ds_rope(char *dst, lk_dtype dt, const char *src, lk_dtype st, int64_t n) {
    if (dt == st) memcpy(dst, src, (size_t)(n * lk_esize(dt)));
    else convert(dst, dt, src, st, n, 0, 1.0f);
}

/* tokens [t0, t1) of the write: per 128-dim tile s = max(absmax / 448, FLT_MIN) (NaN
 * ignored: lkq_row_absmax), codes fp8(x / s) (lkq_fp8_row), then the rope part */
static void ds_write_range(void *ctx, int64_t t0, int64_t t1) {
    const lk_mla_cache_args *a = ctx;
    const lk_tensor *sm = &a->slot_mapping, *x = &a->kv_c, *pe = &a->k_pe; // [N], [T, Dl], [T, Dr]
    const lk_paged *lat = &a->kv_c_cache, *rope = &a->k_pe_cache;
    int64_t bs = lat->block_size, Dl = x->shape[1], Dr = pe->shape[1];
    int64_t xes = lk_esize(x->dtype), pes = lk_esize(pe->dtype);
    for (int64_t t = t0; t < t1; t++) {
        int64_t slot = lk_load_index(sm->data, sm->dtype, t * sm->stride[0]);
        if (slot < 0) continue; /* padding token */
        char *e = (char *)lat->data + lk_paged_off(lat, slot / bs, slot % bs, 0, 0);
        const char *xr = (const char *)x->data + t * x->stride[0] * xes;
        for (int64_t g = 0; g < Dl / LK_DS_TILE; g++) {
            const char *xt = xr + g * LK_DS_TILE * xes;
            float sc = fmaxf(lkq_row_absmax(xt, x->dtype, LK_DS_TILE) / 448.0f, FLT_MIN);
            memcpy(e + Dl + 4 * g, &sc, sizeof sc);
            lkq_fp8_row(e + g * LK_DS_TILE, LK_F8E4M3, xt, x->dtype, LK_DS_TILE, sc);
        }
        if (Dr)
            ds_rope((char *)rope->data + lk_paged_off(rope, slot / bs, slot % bs, 0, 0) * 2, LK_BF16,
                    (const char *)pe->data + t * pe->stride[0] * pes, pe->dtype, Dr);
    }
}

static lk_status concat_and_cache_mla_ds(const lk_mla_cache_args *a) {
    if ((a->kv_c.stride[1] != 1 && a->kv_c.shape[1] > 1) || (a->k_pe.stride[1] != 1 && a->k_pe.shape[1] > 1))
        return lk_ref_concat_and_cache_mla_ds(a);
    int64_t Dl = a->kv_c.shape[1], Dr = a->k_pe.shape[1];
    int64_t bytes = Dl * lk_esize(a->kv_c.dtype) + Dr * lk_esize(a->k_pe.dtype) + lk_ds_entry_bytes(Dl, Dr);
    lk_parallel_for(a->slot_mapping.shape[0], bytes, ds_write_range, (void *)a);
    return LK_OK;
}

typedef struct {
    const lk_gather_cache_args *a;
    const int64_t *cum; /* [B + 1] first out row of each request */
} ds_gather_ctx;

/* out rows [r0, r1) of the gather: each tile's codes times its scale (lkq_fp8_row), then
 * the rope part */
static void ds_gather_range(void *vctx, int64_t r0, int64_t r1) {
    const ds_gather_ctx *c = vctx;
    const lk_gather_cache_args *a = c->a;
    const lk_paged *lat = &a->cache, *rope = &a->rope; // codes [.., Dl], bf16 [.., Dr]
    const lk_tensor *out = &a->out, *bt = &a->block_table; // [S, 1, Dl + Dr], [B, max_pages] i32
    const int32_t *btd = bt->data;
    int64_t B = bt->shape[0], bs = lat->block_size, Dl = lat->D, Dr = rope->D, oes = lk_esize(out->dtype);
    int64_t lo = 0, hi = B; /* request of row r0: the last b with cum[b] <= r0 */
    while (hi - lo > 1) {
        int64_t mid = (lo + hi) / 2;
        if (c->cum[mid] <= r0) lo = mid;
        else hi = mid;
    }
    for (int64_t b = lo, r = r0; r < r1; b++) {
        int64_t st = lk_gather_start(a, b);
        for (int64_t j = r - c->cum[b]; r < r1 && r < c->cum[b + 1]; j++, r++) {
            int64_t p = st + j, page = btd[b * bt->stride[0] + (p / bs) * bt->stride[1]], s = p % bs;
            const char *e = (const char *)lat->data + lk_paged_off(lat, page, s, 0, 0);
            char *o = (char *)out->data + r * out->stride[0] * oes;
            for (int64_t g = 0; g < Dl / LK_DS_TILE; g++)
                lkq_fp8_row(o + g * LK_DS_TILE * oes, out->dtype, e + g * LK_DS_TILE, LK_F8E4M3, LK_DS_TILE,
                            lk_ds_scale(e, Dl, g));
            if (Dr)
                ds_rope(o + Dl * oes, out->dtype, (const char *)rope->data + lk_paged_off(rope, page, s, 0, 0) * 2,
                        LK_BF16, Dr);
        }
    }
}

static lk_status gather_cache_ds(const lk_gather_cache_args *a) {
    if (a->out.stride[2] != 1 && a->out.shape[2] > 1) return lk_ref_gather_cache_ds(a);
    int64_t B = a->block_table.shape[0];
    int64_t *cum = malloc(sizeof(int64_t) * (size_t)(B + 1));
    if (!cum) return lk_fail(LK_ERR_NOMEM, "out of memory for the gather's row index (%lld requests)", (long long)B);
    cum[0] = 0;
    for (int64_t b = 0; b < B; b++) cum[b + 1] = cum[b] + ((const int32_t *)a->seq_lens.data)[b * a->seq_lens.stride[0]];
    ds_gather_ctx c = {a, cum};
    int64_t Dl = a->cache.D, Dr = a->rope.D;
    lk_parallel_for(cum[B], (Dl + Dr) * lk_esize(a->out.dtype) + lk_ds_entry_bytes(Dl, Dr), ds_gather_range, &c);
    free(cum);
    return LK_OK;
}

void LKV_FN(register_mla_cache)(lk_kernel_table *t) {
    t->concat_and_cache_mla = concat_and_cache_mla;
    t->gather_cache = gather_cache;
    t->concat_and_cache_mla_ds = concat_and_cache_mla_ds;
    t->gather_cache_ds = gather_cache_ds;
}
