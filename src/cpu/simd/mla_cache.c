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

void LKV_FN(register_mla_cache)(lk_kernel_table *t) {
    t->concat_and_cache_mla = concat_and_cache_mla;
    t->gather_cache = gather_cache;
}
