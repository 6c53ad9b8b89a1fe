/*
 * MLA latent cache at DeepSeek-V2-Lite shapes (kv_lora 512 + qk_rope 64, one buffer):
 *  - concat_and_cache_mla: decode (1, 16 tokens, each in its own request's page) and
 *    prefill (4096 tokens filling pages in a shuffled pool), page 128 and 16, ND and NZ,
 *    bf16 (and f32 for prefill);
 *  - gather_cache: the 8192-token prefix of 2 requests (4096 each) in shuffled pages,
 *    page 128 and 16, ND and NZ, bf16 and f32;
 *  - one case of each far beyond the L3 (32768 written tokens, a 49152-token prefix) for
 *    the bandwidth ceiling;
 *  - fp8_ds_mla records (LK_KV_DS_MLA, 656 bytes a token): the write from bf16 (4096
 *    tokens, decode's 16) and the gather to bf16 (2 x 4096), page 64 (vLLM's);
 *  - concat_and_cache_mla_rope (rotary on q_pe [T, 16 or 128 heads, 64] and k_pe, then
 *    the cache write; NeoX, bf16 in, a bf16 or e4m3 cache, page 64 ND), decode (16
 *    tokens) and prefill (4096), next to the same work as two calls (rotary_embedding,
 *    then concat_and_cache_mla_fp8) in the same run.
 * Bytes = read + written: tokens x 576 x (source + destination element size) (fp8_ds_mla:
 * 656 bytes a record on the cache side); the rope rows add q_pe and k_pe read and written
 * once.
 * Max error: the whole cache (concat) or out (gather) against the ref kernel (the rope
 * rows: after one call from the starting q_pe / k_pe).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#define DL 512
#define DR 64
#define DC (DL + DR)
#define EDS (DL + DL / 32 + 2 * DR) /* fp8_ds_mla record bytes */

static uint64_t rng = 0x2545f4914f6cdd1dull;
static int64_t rnd(int64_t n) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (int64_t)(rng % (uint64_t)n);
}

/* 0..n-1 shuffled */
static int64_t *shuffled(int64_t n) {
    int64_t *p = malloc(sizeof(int64_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) p[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = rnd(i + 1), x = p[i];
        p[i] = p[j], p[j] = x;
    }
    return p;
}

/* L LK_KV_DS_MLA: [nb, bs, EDS] bytes whatever dt */
static lk_tensor cache_view(void *data, lk_dtype dt, lk_kv_layout L, int64_t nb, int64_t bs) {
    if (L == LK_KV_DS_MLA) return lk_tensor_make(data, LK_F8E4M3, 3, (int64_t[]){nb, bs, EDS});
    return L == LK_KV_NZ ? lk_tensor_make(data, dt, 4, (int64_t[]){nb, DC / 16, bs, 16})
                         : lk_tensor_make(data, dt, 3, (int64_t[]){nb, bs, DC});
}

/* elements of a cache of nb pages of bs entries and the dtype they are compared as */
static int64_t cache_elems(lk_kv_layout L, int64_t nb, int64_t bs) { return nb * bs * (L == LK_KV_DS_MLA ? EDS : DC); }
static lk_dtype cache_dt(lk_dtype dt, lk_kv_layout L) { return L == LK_KV_DS_MLA ? LK_F8E4M3 : dt; }
static const char *layout_name(lk_kv_layout L) { return L == LK_KV_DS_MLA ? "fp8_ds" : L == LK_KV_NZ ? "NZ" : "ND"; }

/* ---------------------------------------------------------------- concat */

typedef struct {
    lk_tensor kv, pe, cache, sm;
    lk_kv_layout L;
} concat_ctx;

static void run_concat(void *p) {
    concat_ctx *c = p;
    if (c->L == LK_KV_DS_MLA) lk_concat_and_cache_mla_fp8(&c->kv, &c->pe, &c->cache, NULL, &c->sm, c->L, NULL);
    else lk_concat_and_cache_mla(&c->kv, &c->pe, &c->cache, NULL, &c->sm, c->L);
}

static void concat_case(int64_t T, int64_t bs, lk_dtype dt, lk_kv_layout L) {
    /* decode: token t is the next token of request t, in its own page; prefill: one
     * request filling ceil(T / bs) pages of a shuffled pool twice that size */
    int decode = T < 64;
    int64_t nb = decode ? 2 * T + 2 : 2 * ((T + bs - 1) / bs) + 2;
    int64_t *pages = shuffled(nb), *slots = malloc(sizeof(int64_t) * (size_t)T);
    for (int64_t t = 0; t < T; t++)
        slots[t] = decode ? pages[t] * bs + rnd(bs) : pages[t / bs] * bs + t % bs;
    void *kv = bench_alloc(dt, T * DL, -2, 2), *pe = bench_alloc(dt, T * DR, -2, 2);
    lk_dtype ct = cache_dt(dt, L);
    int64_t ce = cache_elems(L, nb, bs);
    void *cache = bench_alloc(ct, ce, 0, 0), *ref = bench_alloc(ct, ce, 0, 0);
    concat_ctx c = {lk_tensor_make(kv, dt, 2, (int64_t[]){T, DL}), lk_tensor_make(pe, dt, 2, (int64_t[]){T, DR}),
                    cache_view(cache, dt, L, nb, bs), lk_tensor_make(slots, LK_I64, 1, &T), L};
    double ms = bench_time_bw(run_concat, &c);
    concat_ctx r = c;
    r.cache = cache_view(ref, dt, L, nb, bs);
    lk_isa isa = lk_isa_current();
    lk_set_isa(LK_ISA_REF);
    run_concat(&r);
    lk_set_isa(isa);
    double err = bench_err_variants(run_concat, &c, cache, ref, ct, ce);
    char shape[64];
    snprintf(shape, sizeof shape, "T=%lld %d+%d p%lld %s", (long long)T, DL, DR, (long long)bs, layout_name(L));
    double bytes = L == LK_KV_DS_MLA ? (double)T * (DC * (double)lk_dtype_size(dt) + EDS)
                                     : (double)T * DC * 2 * (double)lk_dtype_size(dt);
    bench_row("concat_and_cache_mla", shape, lk_dtype_name(dt), ms, bytes, BENCH_BW, err);
    bench_free(kv), bench_free(pe), bench_free(cache), bench_free(ref);
    free(pages), free(slots);
}

/* ---------------------------------------------------------------- gather */

typedef struct {
    lk_tensor out, cache, bt, sl;
    lk_kv_layout L;
} gather_ctx;

static void run_gather(void *p) {
    gather_ctx *c = p;
    if (c->L == LK_KV_DS_MLA) lk_gather_cache_fp8(&c->out, &c->cache, &c->bt, &c->sl, c->L, NULL);
    else lk_gather_cache(&c->out, &c->cache, &c->bt, &c->sl, c->L);
}

/* every record of a fp8_ds_mla cache written from random bf16 entries */
static void ds_fill(void *cache, int64_t nb, int64_t bs) {
    int64_t n = nb * bs;
    void *kv = bench_alloc(LK_BF16, n * DL, -2, 2), *pe = bench_alloc(LK_BF16, n * DR, -2, 2);
    int64_t *slots = malloc(sizeof(int64_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) slots[i] = i;
    concat_ctx c = {lk_tensor_make(kv, LK_BF16, 2, (int64_t[]){n, DL}), lk_tensor_make(pe, LK_BF16, 2, (int64_t[]){n, DR}),
                    cache_view(cache, LK_F8E4M3, LK_KV_DS_MLA, nb, bs), lk_tensor_make(slots, LK_I64, 1, &n),
                    LK_KV_DS_MLA};
    run_concat(&c);
    bench_free(kv), bench_free(pe), free(slots);
}

static void gather_case(int64_t per_req, int B, int64_t bs, lk_dtype dt, lk_kv_layout L) {
    int64_t S = per_req * B, mp = (per_req + bs - 1) / bs, nb = B * mp + 2;
    int64_t *pages = shuffled(nb);
    int32_t *bt = malloc(sizeof(int32_t) * (size_t)(B * mp)), *sl = malloc(sizeof(int32_t) * (size_t)B);
    for (int64_t i = 0; i < B * mp; i++) bt[i] = (int32_t)pages[i];
    for (int b = 0; b < B; b++) sl[b] = (int32_t)per_req;
    void *cache = bench_alloc(cache_dt(dt, L), cache_elems(L, nb, bs), -2, 2);
    if (L == LK_KV_DS_MLA) ds_fill(cache, nb, bs);
    void *out = bench_alloc(dt, S * DC, 0, 0), *ref = bench_alloc(dt, S * DC, 0, 0);
    gather_ctx c = {lk_tensor_make(out, dt, 2, (int64_t[]){S, DC}), cache_view(cache, dt, L, nb, bs),
                    lk_tensor_make(bt, LK_I32, 2, (int64_t[]){B, mp}), lk_tensor_make(sl, LK_I32, 1, (int64_t[]){B}), L};
    double ms = bench_time_bw(run_gather, &c);
    gather_ctx r = c;
    r.out = lk_tensor_make(ref, dt, 2, (int64_t[]){S, DC});
    lk_isa isa = lk_isa_current();
    lk_set_isa(LK_ISA_REF);
    run_gather(&r);
    lk_set_isa(isa);
    double err = bench_err_variants(run_gather, &c, out, ref, dt, S * DC);
    char shape[64];
    snprintf(shape, sizeof shape, "%dx%lld %d+%d p%lld %s", B, (long long)per_req, DL, DR, (long long)bs, layout_name(L));
    double bytes = L == LK_KV_DS_MLA ? (double)S * (DC * (double)lk_dtype_size(dt) + EDS)
                                     : (double)S * DC * 2 * (double)lk_dtype_size(dt);
    bench_row("gather_cache", shape, lk_dtype_name(dt), ms, bytes, BENCH_BW, err);
    bench_free(cache), bench_free(out), bench_free(ref);
    free(pages), free(bt), free(sl);
}

/* ---------------------------------------------------------------- concat + rope */

#define MP 8192 /* rows of the cos / sin cache */

typedef struct {
    lk_tensor pos, q, pe, pe3, kv, cs, cache, sm, scale;
    int two_calls;
    const void *q0, *pe0; /* the starting q_pe / k_pe, for run_rope_again */
    size_t qb, pb;
} rope_ctx;

static void run_rope(void *p) {
    rope_ctx *c = p;
    if (c->two_calls) {
        lk_rotary_embedding(&c->pos, &c->q, &c->pe3, &c->cs, 1);
        lk_concat_and_cache_mla_fp8(&c->kv, &c->pe, &c->cache, NULL, &c->sm, LK_KV_ND, &c->scale);
    } else
        lk_concat_and_cache_mla_rope(&c->pos, &c->q, &c->pe, &c->kv, &c->cs, 1, &c->cache, NULL, &c->sm, LK_KV_ND,
                                     &c->scale);
}

/* from the starting q_pe / k_pe (for the error: every variant from the same values) */
static void run_rope_again(void *p) {
    rope_ctx *c = p;
    memcpy(c->q.data, c->q0, c->qb), memcpy(c->pe.data, c->pe0, c->pb);
    run_rope(c);
}

/* rotation angles vary with the position; each timed call rotates q_pe and k_pe again
 * (the values stay bounded: a rotation keeps each pair's norm up to rounding) */
static void rope_case(int64_t T, int64_t Hq, lk_dtype cdt, int two_calls) {
    const int64_t bs = 64, nb = 2 * ((T + bs - 1) / bs) + 2;
    int64_t *pages = shuffled(nb), *slots = malloc(sizeof(int64_t) * (size_t)T), *pos = malloc(sizeof(int64_t) * (size_t)T);
    for (int64_t t = 0; t < T; t++) slots[t] = pages[t / bs] * bs + t % bs, pos[t] = rnd(MP);
    void *q = bench_alloc(LK_BF16, T * Hq * DR, -2, 2), *pe = bench_alloc(LK_BF16, T * DR, -2, 2);
    void *kv = bench_alloc(LK_BF16, T * DL, -2, 2), *cs = bench_alloc(LK_F32, MP * DR, -1, 1);
    void *cache = bench_alloc(cdt, nb * bs * DC, 0, 0), *ref = bench_alloc(cdt, nb * bs * DC, 0, 0);
    void *q0 = bench_alloc(LK_BF16, T * Hq * DR, 0, 0), *pe0 = bench_alloc(LK_BF16, T * DR, 0, 0);
    size_t qb = (size_t)(T * Hq * DR) * 2, pb = (size_t)(T * DR) * 2;
    memcpy(q0, q, qb), memcpy(pe0, pe, pb);
    float sc = 0.0625f;
    rope_ctx c = {lk_tensor_make(pos, LK_I64, 1, &T), lk_tensor_make(q, LK_BF16, 3, (int64_t[]){T, Hq, DR}),
                  lk_tensor_make(pe, LK_BF16, 2, (int64_t[]){T, DR}), lk_tensor_make(pe, LK_BF16, 3, (int64_t[]){T, 1, DR}),
                  lk_tensor_make(kv, LK_BF16, 2, (int64_t[]){T, DL}), lk_tensor_make(cs, LK_F32, 2, (int64_t[]){MP, DR}),
                  lk_tensor_make(cache, cdt, 3, (int64_t[]){nb, bs, DC}), lk_tensor_make(slots, LK_I64, 1, &T),
                  lk_tensor_make(&sc, LK_F32, 1, (int64_t[]){1}), two_calls, q0, pe0, qb, pb};
    double ms = bench_time_bw(run_rope, &c);
    /* the cache (which holds the rotated k_pe) after one call from the starting values */
    rope_ctx r = c;
    r.cache.data = ref;
    lk_isa isa = lk_isa_current();
    lk_set_isa(LK_ISA_REF);
    run_rope_again(&r);
    lk_set_isa(isa);
    double err = bench_err_variants(run_rope_again, &c, cache, ref, cdt, nb * bs * DC);
    char shape[64];
    snprintf(shape, sizeof shape, "T=%lld q %lldx%d %d+%d p%lld", (long long)T, (long long)Hq, DR, DL, DR,
             (long long)bs);
    double bytes = (double)T * ((double)(Hq + 1) * DR * 2 * 2 + DL * 2 + DC * (double)lk_dtype_size(cdt));
    bench_row(two_calls ? "rotary + concat (2 calls)" : "concat_and_cache_mla_rope", shape,
              cdt == LK_BF16 ? "bf16" : "bf16->e4m3", ms, bytes, BENCH_BW, err);
    bench_free(q), bench_free(pe), bench_free(kv), bench_free(cs), bench_free(cache), bench_free(ref);
    bench_free(q0), bench_free(pe0);
    free(pages), free(slots), free(pos);
}

void bench_mla_cache(void) {
    bench_section("concat_and_cache_mla / gather_cache, MLA 512 + 64 (bandwidth-bound; ceiling = copy bandwidth)");
    const int64_t tokens[] = {1, 16, 4096}, pages[] = {128, 16};
    for (int L = 0; L <= 1; L++)
        for (int p = 0; p < 2; p++)
            for (int t = 0; t < 3; t++) {
                concat_case(tokens[t], pages[p], LK_BF16, (lk_kv_layout)L);
                if (tokens[t] == 4096 && (pages[p] == 128 || BENCH.full)) concat_case(4096, pages[p], LK_F32, (lk_kv_layout)L);
            }
    for (int L = 0; L <= 1; L++)
        for (int p = 0; p < 2; p++) {
            gather_case(4096, 2, pages[p], LK_BF16, (lk_kv_layout)L);
            if (pages[p] == 128 || BENCH.full) gather_case(4096, 2, pages[p], LK_F32, (lk_kv_layout)L);
        }
    /* beyond the L3: 36 MiB read + 36 MiB written (concat), 54 + 54 MiB (gather) */
    for (int L = 0; L <= 1; L++) {
        concat_case(32768, 128, LK_BF16, (lk_kv_layout)L);
        gather_case(24576, 2, 128, LK_BF16, (lk_kv_layout)L);
    }
    /* fp8_ds_mla records from / to bf16, vLLM's page 64 */
    concat_case(16, 64, LK_BF16, LK_KV_DS_MLA);
    concat_case(4096, 64, LK_BF16, LK_KV_DS_MLA);
    gather_case(4096, 2, 64, LK_BF16, LK_KV_DS_MLA);
    if (!bench_libs_have("lk_concat_and_cache_mla_rope", "the concat_and_cache_mla_rope rows")) return;
    const int64_t rope_T[] = {16, 4096}, rope_H[] = {16, 128};
    for (int t = 0; t < 2; t++)
        for (int h = 0; h < 2; h++)
            for (int f8 = 0; f8 < 2; f8++)
                for (int two = 0; two < 2; two++) rope_case(rope_T[t], rope_H[h], f8 ? LK_F8E4M3 : LK_BF16, two);
}
