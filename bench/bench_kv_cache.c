/*
 * reshape_and_cache_flash at Llama-3-8B shapes (8 kv heads x 128, block 16): decode
 * (1, 16 tokens) and prefill (4096 tokens; 16384 to sit far beyond the L3), bf16 and
 * f32 (k/v and cache in the same dtype: a row copy), and f32 k/v into a bf16 cache
 * (16384 only with --full).
 * Slots are random and distinct in a cache holding 2x the blocks the tokens need.
 * Bytes: k + v read (their dtype) + the cache rows written (the cache's dtype).
 * Error: max over both whole caches (and the variants) against the reference kernel on the
 * same inputs.
 */
#include <stdio.h>

#include "bench.h"

typedef struct {
    lk_tensor k, v, kc, vc, sm;
} cache_ctx;

static void run_cache(void *p) {
    cache_ctx *c = p;
    lk_reshape_and_cache_flash(&c->k, &c->v, &c->kc, &c->vc, &c->sm);
}

static void one_case(int64_t T, lk_dtype kt, lk_dtype ct) {
    const int64_t H = 8, D = 128, bs = 16;
    int64_t NB = 2 * ((T + bs - 1) / bs), nslots = NB * bs, cn = nslots * H * D;
    void *k = bench_alloc(kt, T * H * D, -2, 2), *v = bench_alloc(kt, T * H * D, -2, 2);
    void *kc = bench_alloc(ct, cn, 0, 0), *vc = bench_alloc(ct, cn, 0, 0);
    int64_t *all = bench_alloc(LK_I64, nslots, 0, 0); /* random distinct slots: shuffle */
    uint64_t s = 0x2545f4914f6cdd1dull;
    for (int64_t i = 0; i < nslots; i++) all[i] = i;
    for (int64_t i = nslots - 1; i > 0; i--) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        int64_t j = (int64_t)(s % (uint64_t)(i + 1)), x = all[i];
        all[i] = all[j], all[j] = x;
    }
    cache_ctx c;
    c.k = lk_tensor_make(k, kt, 3, (int64_t[]){T, H, D});
    c.v = lk_tensor_make(v, kt, 3, (int64_t[]){T, H, D});
    c.kc = lk_tensor_make(kc, ct, 4, (int64_t[]){NB, bs, H, D});
    c.vc = lk_tensor_make(vc, ct, 4, (int64_t[]){NB, bs, H, D});
    c.sm = lk_tensor_make(all, LK_I64, 1, &T);
    double ms = bench_time_bw(run_cache, &c);
    void *rk = bench_alloc(ct, cn, 0, 0), *rv = bench_alloc(ct, cn, 0, 0);
    cache_ctx r = c;
    r.kc.data = rk;
    r.vc.data = rv;
    lk_isa isa = lk_isa_current();
    lk_set_isa(LK_ISA_REF);
    run_cache(&r);
    lk_set_isa(isa);
    double err = 0;
    for (int i = 0; bench_use_variant(i); i++) {
        run_cache(&c);
        double e = bench_max_err(kc, rk, ct, cn), e2 = bench_max_err(vc, rv, ct, cn);
        if (e2 > e) e = e2;
        if (e > err) err = e;
    }
    char shape[64], dt[32];
    snprintf(shape, sizeof shape, "T=%lld 8x128 blk16", (long long)T);
    snprintf(dt, sizeof dt, kt == ct ? "%s" : "%s->%s", lk_dtype_name(kt), lk_dtype_name(ct));
    double bytes = 2.0 * (double)(T * H * D) * (double)(lk_dtype_size(kt) + lk_dtype_size(ct));
    bench_row("reshape_and_cache_flash", shape, dt, ms, bytes, BENCH_BW, err);
    bench_free(k), bench_free(v), bench_free(kc), bench_free(vc), bench_free(all);
    bench_free(rk), bench_free(rv);
}

void bench_kv_cache(void) {
    bench_section("reshape_and_cache_flash (bandwidth-bound; ceiling = copy bandwidth)");
    const int64_t tokens[] = {1, 16, 4096, 16384};
    const lk_dtype pairs[][2] = {{LK_BF16, LK_BF16}, {LK_F32, LK_F32}, {LK_F32, LK_BF16}};
    for (int p = 0; p < 3; p++)
        for (int t = 0; t < 4; t++) {
            if (!BENCH.full && p == 2 && tokens[t] > 4096) continue;
            one_case(tokens[t], pairs[p][0], pairs[p][1]);
        }
}
