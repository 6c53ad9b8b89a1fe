/*
 * mla_decode: DeepSeek dims (latent 512 + rope 64, one cache buffer, page 64, bf16 q,
 * cache and out), B in {1, 8, 64} requests x cache {4096, 32768} tokens x H {16, 128}
 * heads x s_q {1, 2} (s_q = 2 causal); planned split-KV. The default run takes the rows
 * with B x cache <= 32768 (12 rows); --full adds the other 12 (B = 8 x 32768, B = 64:
 * up to 2.4 GB of cache and ~1 TFLOP a call).
 * Columns per row: median ms, GFLOP/s of the work 2 B s_q H K (576 + 512) (causal:
 * over the visible keys), GB/s of the cache read once (B K 576 x 2 bytes, plus q and
 * out), the bound on this machine (flops: time at the f32 FMA peak of the variant's ISA,
 * or at the bf16 dot peak where the kernel runs on bf16 dot products; bytes: the read
 * bandwidth; both measured at start-up in the same run), which of the two it is, the
 * time over the bound (and over the bound at the f32 FMA peak), then the same inputs through flash_attn_varlen (K = the entry,
 * V = a view of its first 512 dims, paged, GQA of H query heads over 1 KV head) and its
 * time over ours. Max error: the reference kernel on request 0, head 0 (all its s_q
 * rows, all keys), against those rows of the timed output.
 * fp8 rows: every s_q = 1 row again over an fp8 e4m3 cache (k_scale 1/16; GB/s and the
 * bytes bound count one byte per element), right after its bf16 row in the same run, then
 * over an fp8_ds_mla cache (LK_KV_DS_MLA: 656-byte records written from bf16 values by
 * lk_concat_and_cache_mla_fp8; the bytes count 656 per entry); no composition column
 * (flash_attn_varlen has no fp8 cache path here).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "core/core.h" /* lk_cpu_prefer_fma */

#define DL 512
#define DR 64
#define E (DL + DR)
#define PAGE 64
#define EDS (DL + DL / 32 + 2 * DR) /* fp8_ds_mla record bytes: 656 */

typedef struct {
    lk_tensor out, lse, q, cache, table, lens;
    lk_mla_decode_params p;
    /* the flash_attn_varlen composition */
    lk_tensor fout, flse, fq, fk, fv, cuq;
    lk_attn_params fp;
} dec_ctx;

static void run_dec(void *vc) {
    dec_ctx *c = vc;
    lk_status s = lk_mla_decode(&c->out, &c->lse, &c->q, &c->cache, NULL, &c->table, &c->lens, &c->p);
    if (s) fprintf(stderr, "mla_decode failed: %s\n", lk_last_error());
}

static void run_fa(void *vc) {
    dec_ctx *c = vc;
    lk_status s = lk_flash_attn_varlen(&c->fout, &c->flse, &c->fq, &c->fk, &c->fv, &c->cuq, NULL, &c->lens, &c->table,
                                       &c->fp);
    if (s) fprintf(stderr, "flash_attn_varlen failed: %s\n", lk_last_error());
}

/* request 0, head 0 through the reference kernel, against those rows of out */
static double check_head0(dec_ctx *c, int64_t s_q, int64_t H) {
    lk_tensor q = c->q, lens = c->lens, table = c->table;
    q.shape[0] = 1, q.shape[2] = 1;
    lens.shape[0] = 1, table.shape[0] = 1;
    void *ref = bench_alloc(LK_BF16, s_q * DL, 0, 0);
    lk_tensor tref = lk_tensor_make(ref, LK_BF16, 4, (int64_t[]){1, s_q, 1, DL});
    lk_isa isa = lk_isa_current();
    lk_set_isa(LK_ISA_REF);
    lk_status s = lk_mla_decode(&tref, NULL, &q, &c->cache, NULL, &table, &lens, &c->p);
    lk_set_isa(isa);
    double err = s ? INFINITY : 0;
    for (int i = 0; s == LK_OK && bench_use_variant(i); i++) {
        run_dec(c);
        for (int64_t r = 0; r < s_q; r++) {
            double e = bench_max_err((const char *)c->out.data + r * H * DL * 2, (const char *)ref + r * DL * 2, LK_BF16, DL);
            if (e > err) err = e;
        }
    }
    bench_free(ref);
    return err;
}

/* kdt: the cache's dtype (bf16, or fp8 e4m3 with k_scale: then the composition is not
 * run, flash_attn_varlen having no fp8 path here) */
/* variant i's flops ceiling: the tile peak on amx; the f32 FMA peak on avx512bf16 where
 * lk_cpu_prefer_fma (its kernel takes FMAs there) */
static double dec_peak(bench_kind kind, int i) {
    if (bench_tile_peak(i) > 0) return bench_tile_peak(i);
    if (BENCH.isa[BENCH.var[i].isa] == LK_ISA_AVX512BF16 && lk_cpu_prefer_fma()) kind = BENCH_FLOPS;
    return bench_peak(kind, i);
}

/* an fp8_ds_mla cache [nb, PAGE, 1, EDS] holding records of random bf16 entries in [-1, 1] */
static void *ds_cache(int64_t nb) {
    int64_t n = nb * PAGE;
    void *rec = bench_alloc(LK_F8E4M3, n * EDS, 0, 0), *kv = bench_alloc(LK_BF16, n * DL, -1, 1);
    void *pe = bench_alloc(LK_BF16, n * DR, -1, 1);
    int64_t *slots = bench_alloc(LK_I64, n, 0, 0);
    for (int64_t i = 0; i < n; i++) slots[i] = i;
    lk_tensor tkv = lk_tensor_make(kv, LK_BF16, 2, (int64_t[]){n, DL}), tpe = lk_tensor_make(pe, LK_BF16, 2, (int64_t[]){n, DR});
    lk_tensor tc = lk_tensor_make(rec, LK_F8E4M3, 4, (int64_t[]){nb, PAGE, 1, EDS});
    lk_tensor ts = lk_tensor_make(slots, LK_I64, 1, (int64_t[]){n});
    if (lk_concat_and_cache_mla_fp8(&tkv, &tpe, &tc, NULL, &ts, LK_KV_DS_MLA, NULL))
        fprintf(stderr, "fp8_ds_mla cache write failed: %s\n", lk_last_error());
    bench_free(kv), bench_free(pe), bench_free(slots);
    return rec;
}

/* kdt: the cache's dtype; ds: an fp8_ds_mla cache (kdt LK_F8E4M3 as its byte type) */
static void dec_case(int64_t B, int64_t K, int64_t H, int64_t s_q, lk_dtype kdt, int ds) {
    int fp8 = kdt == LK_F8E4M3 || kdt == LK_F8E5M2;
    dec_ctx c;
    memset(&c, 0, sizeof c);
    int64_t pages = (K + PAGE - 1) / PAGE, nb = B * pages, R = B * s_q;
    void *q = bench_alloc(LK_BF16, R * H * E, -1, 1), *out = bench_alloc(LK_BF16, R * H * DL, 0, 0);
    void *cache = ds ? ds_cache(nb) : bench_alloc(kdt, nb * PAGE * E, fp8 ? -16 : -1, fp8 ? 16 : 1);
    void *fout = bench_alloc(LK_BF16, R * H * DL, 0, 0);
    float *lse = bench_alloc(LK_F32, R * H, 0, 0), *flse = bench_alloc(LK_F32, R * H, 0, 0);
    int32_t *lens = bench_alloc(LK_I32, B, 0, 0), *table = bench_alloc(LK_I32, B * pages, 0, 0);
    int32_t *cuq = bench_alloc(LK_I32, B + 1, 0, 0);
    for (int64_t b = 0; b < B; b++) lens[b] = (int32_t)K;
    for (int64_t b = 0; b <= B; b++) cuq[b] = (int32_t)(b * s_q);
    /* pages of a request scattered through the pool */
    for (int64_t b = 0; b < B; b++)
        for (int64_t p = 0; p < pages; p++) table[b * pages + p] = (int32_t)((p * B + b) % nb);
    c.q = lk_tensor_make(q, LK_BF16, 4, (int64_t[]){B, s_q, H, E});
    c.out = lk_tensor_make(out, LK_BF16, 4, (int64_t[]){B, s_q, H, DL});
    c.lse = lk_tensor_make(lse, LK_F32, 3, (int64_t[]){B, H, s_q});
    c.cache = lk_tensor_make(cache, kdt, 4, (int64_t[]){nb, PAGE, 1, ds ? EDS : E});
    c.table = lk_tensor_make(table, LK_I32, 2, (int64_t[]){B, pages});
    c.lens = lk_tensor_make(lens, LK_I32, 1, (int64_t[]){B});
    float scale = (float)(1.0 / sqrt((double)E));
    c.p = lk_mla_decode_params_default(scale);
    c.p.causal = s_q > 1;
    if (fp8) c.p.k_scale = 1.0f / 16; /* codes in [-16, 16]: values in [-1, 1] */
    if (ds) c.p.cache_layout = LK_KV_DS_MLA;
    /* composition: the same bytes as [R, H, E] queries, K = cache, V = its first 512 dims */
    c.fq = lk_tensor_make(q, LK_BF16, 3, (int64_t[]){R, H, E});
    c.fout = lk_tensor_make(fout, LK_BF16, 3, (int64_t[]){R, H, DL});
    c.flse = lk_tensor_make(flse, LK_F32, 2, (int64_t[]){R, H});
    c.fk = c.cache;
    c.fv = c.cache;
    c.fv.shape[3] = DL;
    c.cuq = lk_tensor_make(cuq, LK_I32, 1, (int64_t[]){B + 1});
    c.fp = lk_attn_params_default(scale);
    c.fp.causal = s_q > 1;

    double ms = bench_time(run_dec, &c);
    double t[BENCH_MAX_VAR];
    for (int i = 0; i < BENCH.nvar; i++) t[i] = i ? BENCH.row_ms[i] : ms;
    double fms = fp8 ? NAN : bench_time(run_fa, &c);
    double ft[BENCH_MAX_VAR];
    for (int i = 0; i < BENCH.nvar; i++) ft[i] = fp8 ? NAN : i ? BENCH.row_ms[i] : fms;
    double err = check_head0(&c, s_q, H);

    /* work: visible keys per query row (causal: K - s_q + i + 1) */
    double vis = 0;
    for (int64_t i = 0; i < s_q; i++) vis += (double)(s_q > 1 ? K - s_q + i + 1 : K);
    double flops = 2.0 * (double)B * vis * (double)H * (E + DL);
    double bytes = (double)B * K * (ds ? EDS : E * (fp8 ? 1 : 2)) + (double)R * H * (E + DL) * 2 + (double)R * H * 4;
    bench_kind kind = bench_flops_kind(LK_BF16);
    char shape[64];
    snprintf(shape, sizeof shape, "B=%lld %lldx%lld %lldh p%d%s", (long long)B, (long long)s_q, (long long)K, (long long)H,
             PAGE, ds ? " fp8_ds" : fp8 ? " fp8" : "");
    for (int i = 0; i < BENCH.nvar; i++) {
        double peak = dec_peak(kind, i);
        double tf = peak > 0 ? flops / (peak * 1e9) : 0, tb = bytes / (BENCH.read_gbs * 1e9);
        double bound = tf > tb ? tf : tb;
        /* the same against the f32 FMA peak alone (the bound of the f32 path) */
        double p32 = bench_peak(BENCH_FLOPS, i), tf32 = p32 > 0 ? flops / (p32 * 1e9) : 0;
        double bound32 = tf32 > tb ? tf32 : tb;
        printf("%-18s %-26s %-10s %9.2f %8.1f %7.1f | %-5s %9.2f %5.2f %5.2f | %9.2f %5.2f\n", "mla_decode", shape,
               BENCH.nvar > 1 ? BENCH.var[i].name : ds ? "ds_mla" : fp8 ? "e4m3" : "bf16", t[i], flops / (t[i] * 1e-3) / 1e9,
               bytes / (t[i] * 1e-3) / 1e9, tf > tb ? "flops" : "bytes", bound * 1e3, t[i] * 1e-3 / bound,
               t[i] * 1e-3 / bound32, ft[i], ft[i] / t[i]);
    }
    if (BENCH.nvar == 1) printf("%-18s %-26s max err %.2e\n", "", "", err);
    fflush(stdout);
    double ceil[BENCH_MAX_VAR];
    for (int i = 0; i < BENCH.nvar; i++) ceil[i] = dec_peak(kind, i);
    char extra[512];
    int n = snprintf(extra, sizeof extra, ", \"gbs\": [");
    for (int i = 0; i < BENCH.nvar; i++)
        n += snprintf(extra + n, sizeof extra - (size_t)n, "%s%.3f", i ? ", " : "", bytes / (t[i] * 1e-3) / 1e9);
    n += snprintf(extra + n, sizeof extra - (size_t)n, "], \"read_gbs\": %.3f, \"bytes\": %.0f, \"flash_attn_ms\": [",
                  BENCH.read_gbs, bytes);
    for (int i = 0; i < BENCH.nvar; i++)
        n += isnan(ft[i]) ? snprintf(extra + n, sizeof extra - (size_t)n, "%snull", i ? ", " : "")
                          : snprintf(extra + n, sizeof extra - (size_t)n, "%s%.4f", i ? ", " : "", ft[i]);
    snprintf(extra + n, sizeof extra - (size_t)n, "]");
    bench_json_row("mla_decode", shape, ds ? "fp8_ds_mla" : fp8 ? "f8e4m3" : "bf16", "GFLOP/s", t, flops, ceil, err,
                   extra);
    bench_free(q), bench_free(out), bench_free(cache), bench_free(fout), bench_free(lse), bench_free(flse);
    bench_free(lens), bench_free(table), bench_free(cuq);
}

void bench_mla_decode(void) {
    printf("\n== mla_decode (latent 512 + 64, page 64, bf16; planned split-KV; s_q = 2 causal)\n");
    printf("columns: median ms, GFLOP/s, GB/s (cache read once) | bound: flops (time at the %s peak) or bytes (at the "
           "read bandwidth, %.1f GB/s), its ms, time / bound, time / the bound at the f32 FMA peak | flash_attn_varlen "
           "composition ms, its time / ours\n",
           bench_flops_kind(LK_BF16) == BENCH_FLOPS_BF16 ? "amx bf16 tile (amx), bf16 dot (avx512bf16) or f32 FMA" : "f32 FMA",
           BENCH.read_gbs);
    bench_section_name("mla_decode");
    if (!bench_libs_have("lk_mla_decode", "mla_decode rows")) return;
    static const int64_t Bs[3] = {1, 8, 64}, Ks[2] = {4096, 32768}, Hs[2] = {16, 128};
    for (int bi = 0; bi < 3; bi++)
        for (int ki = 0; ki < 2; ki++) {
            if (!BENCH.full && Bs[bi] * Ks[ki] > 32768) continue;
            for (int hi = 0; hi < 2; hi++)
                for (int64_t s_q = 1; s_q <= 2; s_q++) {
                    dec_case(Bs[bi], Ks[ki], Hs[hi], s_q, LK_BF16, 0);
                    /* the same row over an fp8 e4m3 cache and an fp8_ds_mla one (s_q = 1 rows), in the
                     * same run */
                    if (s_q == 1) dec_case(Bs[bi], Ks[ki], Hs[hi], s_q, LK_F8E4M3, 0);
                    if (s_q == 1) dec_case(Bs[bi], Ks[ki], Hs[hi], s_q, LK_F8E4M3, 1);
                }
        }
}
