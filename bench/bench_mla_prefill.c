/*
 * mla_prefix_prefill: the B x Q x P sweep of the MLA issue (H = 4 heads per rank,
 * QK 192 = 128 + 64, V 128, latent 512, page 128, bf16 everywhere, one-buffer ND cache,
 * every request on its own pages), plus H = 16 at (16, 100, 768), B = 32 alternating
 * prefixes 768 / 0, and B = 10 long mixed queries; then NZ / ND for split + merge.
 *
 * Per case every strategy runs on every variant (library, ISA) in interleaved rounds (one
 * call of each (variant, strategy) per round, so machine noise hits all alike); the row
 * (one per variant) gives each strategy's median ms, its ratio to the best median, auto's
 * choice (from the trace) with the ratio of the chosen strategy's median to the best,
 * auto's own median, and the best strategy's GFLOP/s against the peak of the variant
 * (bench_peak: the FMA peak of its ISA, or the bf16 dot peak where bench_flops_kind
 * says so) measured in the same run: at start-up, and again around the case (the
 * shared machine's speed drifts by 2-3x over minutes); with several variants, the best
 * median over the first variant's (several libraries: over the first library's on the
 * same ISA).
 * JSON: one row per case and strategy (auto too), per variant, against the peak around
 * the case; the NZ / ND table: one row per case and layout, against the start-up peak.
 * FLOPs counted: what the strategy performs, 2 per multiply-add, visible keys only:
 *   projecting strategies: 2 * rows * Dl * H (Dn + Dv)  (rows = prefix pages * 128)
 *                        + 2 * H * (Dqk + Dv) * sum_b Q_b (P_b + (Q_b + 1) / 2)
 *   absorbed:              2 * T * H * (Dn Dl + Dl Dv) + 2 * H * (2 Dl + Dr) * sum_b Q_b P_b
 *                        + 2 * H * (Dqk + Dv) * sum_b Q_b (Q_b + 1) / 2
 * Max error: small cases against the ref ISA (split + merge, float64 attention); the
 * others: the largest difference between strategies (all must agree).
 * fp8 latent caches: the seed's sweep cases (BENCH.md: (1,100,768), (8,100,768),
 * (32,100,768), (128,100,768), (1,1024,8192), (8,1024,8192); two of them by default) with
 * an e4m3 cache (k_scale 1/64, the same value range), every strategy as above, and
 * auto's median over auto's on the bf16 cache, the two timed in interleaved rounds in the
 * same run (per variant).
 * Default: a short subset; --full: every case (a progress line per case on stderr).
 * LLMKERN_MLA_TRACE=1 also prints one traced call per strategy (time per internal op).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"

#define NS 5 /* auto + 4 strategies */
#define H_ 4
#define DN 128
#define DR 64
#define DV 128
#define DL 512
#define BS 128

typedef struct {
    lk_tensor out, q, k, v, cu, pl, bt, cache, w;
    lk_mla_params p;
    void *bufs[9];
    int64_t T, H, B;
    int32_t *qlen, *plen;
} mla_ctx;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* cdt: the latent cache's dtype (LK_BF16, or an fp8 one: codes of the bf16 case's value
 * range / k_scale, k_scale 1/64) */
static void setup_dt(mla_ctx *c, int64_t B, const int32_t *ql, const int32_t *pl, int64_t H, lk_kv_layout lay,
                     lk_dtype cdt) {
    memset(c, 0, sizeof *c);
    int64_t T = 0, pages = 0, maxp = 1, E = DL + DR;
    for (int64_t b = 0; b < B; b++) {
        T += ql[b];
        int64_t np = (pl[b] + BS - 1) / BS;
        pages += np;
        if (np > maxp) maxp = np;
    }
    c->T = T, c->H = H, c->B = B;
    int64_t nb = pages + 1;
    c->bufs[0] = bench_alloc(LK_BF16, T * H * DV, 0, 0);
    c->bufs[1] = bench_alloc(LK_BF16, T * H * (DN + DR), -1, 1);
    c->bufs[2] = bench_alloc(LK_BF16, T * H * (DN + DR), -1, 1);
    c->bufs[3] = bench_alloc(LK_BF16, T * H * DV, -1, 1);
    c->bufs[4] = bench_alloc(LK_I32, B + 1, 0, 0);
    c->bufs[5] = bench_alloc(LK_I32, B, 0, 0);
    c->bufs[6] = bench_alloc(LK_I32, B * maxp, 0, 0);
    int f8 = cdt == LK_F8E4M3 || cdt == LK_F8E5M2;
    c->bufs[7] = f8 ? bench_alloc(cdt, nb * BS * E, -64, 64) : bench_alloc(LK_BF16, nb * BS * E, -1, 1);
    c->bufs[8] = bench_alloc(LK_BF16, H * (DN + DV) * DL, -0.075, 0.075);
    int32_t *cu = c->bufs[4], *plv = c->bufs[5], *bt = c->bufs[6];
    /* every request on its own pages, scattered over the cache (block 0 unused):
     * logical page n of the batch is block 1 + (n * 7919) % pages (7919 is prime) */
    cu[0] = 0;
    for (int64_t b = 0, n = 0; b < B; b++) {
        cu[b + 1] = cu[b] + ql[b];
        plv[b] = pl[b];
        int64_t np = (pl[b] + BS - 1) / BS;
        for (int64_t i = 0; i < maxp; i++) bt[b * maxp + i] = i < np ? (int32_t)(1 + (n + i) * 7919 % pages) : -1;
        n += np;
    }
    c->out = lk_tensor_make(c->bufs[0], LK_BF16, 3, (int64_t[]){T, H, DV});
    c->q = lk_tensor_make(c->bufs[1], LK_BF16, 3, (int64_t[]){T, H, DN + DR});
    c->k = lk_tensor_make(c->bufs[2], LK_BF16, 3, (int64_t[]){T, H, DN + DR});
    c->v = lk_tensor_make(c->bufs[3], LK_BF16, 3, (int64_t[]){T, H, DV});
    c->cu = lk_tensor_make(cu, LK_I32, 1, (int64_t[]){B + 1});
    c->pl = lk_tensor_make(plv, LK_I32, 1, (int64_t[]){B});
    c->bt = lk_tensor_make(bt, LK_I32, 2, (int64_t[]){B, maxp});
    lk_dtype cd = f8 ? cdt : LK_BF16;
    int64_t tl = f8 ? 32 : 16;
    if (lay == LK_KV_NZ) c->cache = lk_tensor_make(c->bufs[7], cd, 4, (int64_t[]){nb, E / tl, BS, tl});
    else c->cache = lk_tensor_make(c->bufs[7], cd, 3, (int64_t[]){nb, BS, E});
    c->w = lk_tensor_make(c->bufs[8], LK_BF16, 2, (int64_t[]){H * (DN + DV), DL});
    /* the defaults spelled out: a --lib build of 0.2 returns lk_mla_params_default's
     * 16-byte struct in registers, 0.3's (k_scale appended) through memory */
    memset(&c->p, 0, sizeof c->p);
    c->p.scale = 0.1147f, c->p.strategy = LK_MLA_AUTO, c->p.cache_layout = LK_KV_ND, c->p.dedup = 1;
    c->p.k_scale = 1.0f;
    c->p.cache_layout = lay;
    if (f8) c->p.k_scale = 1.0f / 64;
    c->qlen = malloc(sizeof(int32_t) * (size_t)B), c->plen = malloc(sizeof(int32_t) * (size_t)B);
    memcpy(c->qlen, ql, sizeof(int32_t) * (size_t)B), memcpy(c->plen, pl, sizeof(int32_t) * (size_t)B);
}

static void setup(mla_ctx *c, int64_t B, const int32_t *ql, const int32_t *pl, int64_t H, lk_kv_layout lay) {
    setup_dt(c, B, ql, pl, H, lay, LK_BF16);
}

static void teardown(mla_ctx *c) {
    for (int i = 0; i < 9; i++) bench_free(c->bufs[i]);
    free(c->qlen), free(c->plen);
}

static double run(mla_ctx *c, lk_mla_strategy st) {
    c->p.strategy = st;
    double t0 = now_s();
    lk_status s = lk_mla_prefix_prefill(&c->out, &c->q, &c->k, &c->v, &c->cu, &c->pl, &c->bt, &c->cache, NULL,
                                        &c->w, &c->p);
    double t = now_s() - t0;
    if (s) {
        fprintf(stderr, "mla_prefill failed: %s\n", lk_last_error());
        exit(1);
    }
    return t;
}

static double flops_of(const mla_ctx *c, lk_mla_strategy st) {
    double f = 0, rows = 0, E = DL + DR;
    for (int64_t b = 0; b < c->B; b++) {
        double Q = c->qlen[b], P = c->plen[b];
        f += 2.0 * c->H * (DN + DR + DV) * Q * (Q + 1) / 2;
        if (st == LK_MLA_ABSORBED) f += 2.0 * c->H * (E + DL) * Q * P;
        else f += 2.0 * c->H * (DN + DR + DV) * Q * P;
        rows += Q > 0 ? ceil(P / BS) * BS : 0;
    }
    if (st == LK_MLA_ABSORBED) f += 2.0 * (double)c->T * c->H * (DN * DL + DL * DV);
    else f += 2.0 * rows * DL * c->H * (DN + DV);
    return f;
}

static lk_mla_strategy auto_choice(mla_ctx *c) {
    run(c, LK_MLA_AUTO);
    const char *tr = lk_mla_last_trace();
    for (int s = 1; s < NS; s++) {
        char want[64];
        snprintf(want, sizeof want, "strategy=%s ", lk_mla_strategy_name((lk_mla_strategy)s));
        if (!strncmp(tr, want, strlen(want))) return (lk_mla_strategy)s;
    }
    return LK_MLA_AUTO;
}

/* max difference between strategies on every variant (against the ref ISA of the first
 * library when small, else against split + merge on the first variant) */
static double check(mla_ctx *c) {
    int64_t n = c->T * c->H * DV;
    double work = 0;
    for (int64_t b = 0; b < c->B; b++) work += (double)c->qlen[b] * (c->plen[b] + c->qlen[b]);
    void *ref = bench_alloc(LK_BF16, n, 0, 0);
    if (work * c->H <= 2e6) {
        lk_isa isa = lk_isa_current();
        lk_set_isa(LK_ISA_REF);
        run(c, LK_MLA_SPLIT_MERGE);
        lk_set_isa(isa);
    } else {
        run(c, LK_MLA_SPLIT_MERGE);
    }
    memcpy(ref, c->out.data, (size_t)n * 2);
    double err = 0;
    for (int i = 0; bench_use_variant(i); i++)
        for (int s = 1; s < NS; s++) {
            run(c, (lk_mla_strategy)s);
            double e = bench_max_err(c->out.data, ref, LK_BF16, n);
            if (e > err) err = e;
        }
    bench_free(ref);
    return err;
}

/* interleaved rounds over (variant, strategy) pairs u = i * NS + s; med[u] = median
 * seconds of strategy s (s = 0: auto) on variant i */
static void time_all(mla_ctx *c, double *med, int rounds) {
    int N = BENCH.nvar * NS;
    double t1[BENCH_MAX_VAR * NS], best1[BENCH_MAX_VAR], *samp = malloc(sizeof(double) * (size_t)(N * rounds));
    for (int i = 0; bench_use_variant(i); i++) {
        for (int s = 0; s < NS; s++) t1[i * NS + s] = run(c, (lk_mla_strategy)s); /* warm-up */
        best1[i] = t1[i * NS + 1];
        for (int s = 2; s < NS; s++)
            if (t1[i * NS + s] < best1[i]) best1[i] = t1[i * NS + s];
    }
    int n[BENCH_MAX_VAR * NS] = {0};
    for (int r = 0; r < rounds; r++)
        for (int j = 0; j < N; j++) {
            int u = (j + r) % N, i = u / NS; /* rotate the order: no pair always runs first */
            /* strategies far off the best get 3 samples at most (they only set ratios) */
            if (r >= 3 && t1[u] > 3 * best1[i]) continue;
            bench_use_variant(i);
            samp[u * rounds + n[u]++] = run(c, (lk_mla_strategy)(u % NS));
        }
    bench_use_variant(BENCH.nvar);
    for (int u = 0; u < N; u++) {
        qsort(samp + u * rounds, (size_t)n[u], sizeof(double), cmpd);
        const double *v = samp + u * rounds;
        med[u] = n[u] % 2 ? v[n[u] / 2] : 0.5 * (v[n[u] / 2 - 1] + v[n[u] / 2]);
    }
    free(samp);
}

static int rounds_for(double t) {
    int r = BENCH.reps;
    if (t > 0.5 && r > 5) r = 5;
    if (t > 2.0 && r > 4) r = 4;
    return r;
}

/* the label column, and the variant column with several variants */
static void print_label(const char *label, const char *var) {
    int w = 6;
    for (int i = 0; i < BENCH.nvar; i++)
        if ((int)strlen(BENCH.var[i].name) > w) w = (int)strlen(BENCH.var[i].name);
    printf("%-18s", label);
    if (BENCH.nvar > 1) printf(" %-*s", w, var);
}

/* fp8 rows: median of auto on the fp8 cache c over auto on the same case with a bf16
 * cache, rounds interleaved, on variant i */
static double fp8_over_bf16(mla_ctx *c, int i, int rounds) {
    mla_ctx b;
    setup(&b, c->B, c->qlen, c->plen, c->H, LK_KV_ND);
    bench_use_variant(i);
    run(c, LK_MLA_AUTO), run(&b, LK_MLA_AUTO); /* warm-up */
    double *t8 = malloc(sizeof(double) * (size_t)rounds), *t16 = malloc(sizeof(double) * (size_t)rounds);
    for (int r = 0; r < rounds; r++) {
        if (r % 2) t16[r] = run(&b, LK_MLA_AUTO), t8[r] = run(c, LK_MLA_AUTO);
        else t8[r] = run(c, LK_MLA_AUTO), t16[r] = run(&b, LK_MLA_AUTO);
    }
    qsort(t8, (size_t)rounds, sizeof(double), cmpd), qsort(t16, (size_t)rounds, sizeof(double), cmpd);
    double q = rounds % 2 ? t8[rounds / 2] / t16[rounds / 2]
                          : (t8[rounds / 2 - 1] + t8[rounds / 2]) / (t16[rounds / 2 - 1] + t16[rounds / 2]);
    free(t8), free(t16);
    teardown(&b);
    return q;
}

static void sweep_case_dt(int64_t B, const int32_t *ql, const int32_t *pl, int64_t H, const char *label,
                          lk_dtype cdt) {
    mla_ctx c;
    int f8 = cdt != LK_BF16;
    setup_dt(&c, B, ql, pl, H, LK_KV_ND, cdt);
    double err = check(&c);
    int K = BENCH.nvar, best[BENCH_MAX_VAR];
    double t = run(&c, LK_MLA_SPLIT_MERGE), med[BENCH_MAX_VAR * NS], pk[BENCH_MAX_ISA], peak[BENCH_MAX_VAR],
           ms[BENCH_MAX_VAR];
    lk_mla_strategy ch[BENCH_MAX_VAR];
    bench_kind kind = bench_flops_kind(LK_BF16);
    for (int i = 0; i < BENCH.nisa; i++) pk[i] = bench_peak_now(kind, BENCH.isa[i]); /* per ISA: the machine's */
    time_all(&c, med, rounds_for(t));
    for (int i = 0; i < BENCH.nisa; i++) pk[i] = 0.5 * (pk[i] + bench_peak_now(kind, BENCH.isa[i]));
    for (int i = 0; i < K; i++) peak[i] = pk[BENCH.var[i].isa];
    for (int i = 0; bench_use_variant(i); i++) {
        const double *m = med + i * NS;
        int b = 1, base = bench_base_variant(i); /* base <= i: its best is known */
        for (int s = 2; s < NS; s++)
            if (m[s] < m[b]) b = s;
        best[i] = b;
        ch[i] = auto_choice(&c);
        double gf = flops_of(&c, (lk_mla_strategy)b) / m[b] / 1e9, pk0 = bench_peak(kind, i);
        print_label(label, BENCH.var[i].name);
        printf(" %8.2f %8.2f %8.2f %8.2f | %4.2f %4.2f %4.2f %4.2f | %-8.8s %4.2f %8.2f %4.2f | %5.1f %3.0f%% %5.1f "
               "%3.0f%% %8.2e",
               1e3 * m[1], 1e3 * m[2], 1e3 * m[3], 1e3 * m[4], m[1] / m[b], m[2] / m[b], m[3] / m[b],
               m[4] / m[b], lk_mla_strategy_name(ch[i]), m[ch[i]] / m[b], 1e3 * m[0], m[0] / m[b], gf,
               pk0 > 0 ? 100 * gf / pk0 : 0, peak[i], peak[i] > 0 ? 100 * gf / peak[i] : 0, err);
        if (K > 1) printf(" %7.2f", m[b] / med[base * NS + best[base]]);
        if (f8) printf(" %7.3f", fp8_over_bf16(&c, i, rounds_for(t)));
        printf("\n");
    }
    fflush(stdout);
    for (int s = 0; s < NS; s++) { /* JSON: one row per strategy, auto (s = 0) last */
        int st = (s + 1) % NS;
        char shape[96], extra[BENCH_MAX_VAR * 48 + 16] = "";
        snprintf(shape, sizeof shape, "%s %s", label, lk_mla_strategy_name((lk_mla_strategy)st));
        for (int i = 0; i < K; i++) {
            ms[i] = 1e3 * med[i * NS + st];
            size_t n = strlen(extra);
            if (!st) snprintf(extra + n, sizeof extra - n, "%s\"%s\": \"%s\"", i ? ", " : ", \"choice\": {",
                              BENCH.var[i].name, lk_mla_strategy_name(ch[i]));
        }
        if (!st) strcat(extra, "}");
        bench_json_row("mla_prefix_prefill", shape, f8 ? "bf16, f8e4m3 cache" : "bf16", "GFLOP/s", ms,
                       flops_of(&c, st ? (lk_mla_strategy)st : ch[0]), peak, err, extra);
    }
    if (getenv("LLMKERN_MLA_TRACE")) /* where the time goes: one traced call per strategy */
        for (int s = 1; s < NS; s++) {
            run(&c, (lk_mla_strategy)s);
            printf("    %s\n", lk_mla_last_trace());
        }
    teardown(&c);
}

static void sweep_case(int64_t B, const int32_t *ql, const int32_t *pl, int64_t H, const char *label) {
    sweep_case_dt(B, ql, pl, H, label, LK_BF16);
}

/* the seed's sweep cases with an fp8 e4m3 latent cache (columns of the bf16 sweep, then
 * auto's median over auto's on a bf16 cache, interleaved) */
static void fp8_sweep(void) {
    static const int32_t cases[][3] = {{1, 100, 768},   {8, 100, 768},  {32, 100, 768},
                                       {128, 100, 768}, {1, 1024, 8192}, {8, 1024, 8192}};
    int n = BENCH.full ? 6 : 2, K = BENCH.nvar;
    printf("\n== mla_prefix_prefill sweep, fp8 e4m3 latent cache (k_scale 1/64; otherwise as above)\n");
    printf("columns: as the bf16 sweep, then auto's median over auto's on the bf16 cache (interleaved rounds, "
           "same run)\n");
    bench_section_name("mla_prefix_prefill sweep fp8");
    print_label("case (B,Q,P)", BENCH.nlib > 1 ? "variant" : "isa");
    printf(" %8s %8s %8s %8s | %4s %4s %4s %4s | %-8s %4s %8s %4s | %5s %4s %5s %4s %8s", "split", "concat", "fused",
           "absorbed", "/bst", "/bst", "/bst", "/bst", "auto", "/bst", "auto ms", "/bst", "GF/s", "pk0", "pk", "pk",
           "max err");
    if (K > 1) printf(" %7s", "/first");
    printf(" %7s\n", "f8/bf16");
    for (int i = 0; i < n; i++) {
        const int32_t *s = cases[i];
        int32_t *ql = malloc(sizeof(int32_t) * (size_t)s[0]), *pl = malloc(sizeof(int32_t) * (size_t)s[0]);
        for (int b = 0; b < s[0]; b++) ql[b] = s[1], pl[b] = s[2];
        char label[64];
        snprintf(label, sizeof label, "(%d,%d,%d) f8", s[0], s[1], s[2]);
        if (BENCH.full) fprintf(stderr, "mla_prefill fp8 sweep [%d/%d] %s\n", i + 1, n, label);
        sweep_case_dt(s[0], ql, pl, H_, label, LK_F8E4M3);
        free(ql), free(pl);
    }
}

static void nz_case(int64_t B, int32_t q, int32_t p) {
    int32_t *ql = malloc(sizeof(int32_t) * (size_t)B), *pl = malloc(sizeof(int32_t) * (size_t)B);
    for (int64_t b = 0; b < B; b++) ql[b] = q, pl[b] = p;
    mla_ctx nd, nz;
    setup(&nd, B, ql, pl, H_, LK_KV_ND);
    setup(&nz, B, ql, pl, H_, LK_KV_NZ);
    double t = run(&nd, LK_MLA_SPLIT_MERGE);
    int rounds = rounds_for(t) + 2, K = BENCH.nvar;
    double *a = malloc(sizeof(double) * (size_t)(K * rounds)), *z = malloc(sizeof(double) * (size_t)(K * rounds));
    for (int i = 0; bench_use_variant(i); i++) run(&nd, LK_MLA_SPLIT_MERGE), run(&nz, LK_MLA_SPLIT_MERGE); /* warm-up */
    for (int r = 0; r < rounds; r++)
        for (int j = 0; j < K; j++) {
            int i = (j + r) % K; /* rotate the order: no variant always runs first */
            bench_use_variant(i);
            a[i * rounds + r] = run(&nd, LK_MLA_SPLIT_MERGE), z[i * rounds + r] = run(&nz, LK_MLA_SPLIT_MERGE);
        }
    bench_use_variant(K);
    char label[64], shape[96];
    snprintf(label, sizeof label, "(%lld,%d,%d)", (long long)B, q, p);
    double ma[BENCH_MAX_VAR], mz[BENCH_MAX_VAR];
    for (int i = 0; i < K; i++) {
        double *ai = a + i * rounds, *zi = z + i * rounds;
        qsort(ai, (size_t)rounds, sizeof(double), cmpd), qsort(zi, (size_t)rounds, sizeof(double), cmpd);
        ma[i] = 1e3 * ai[rounds / 2], mz[i] = 1e3 * zi[rounds / 2];
        print_label(label, BENCH.var[i].name);
        printf(" %9.2f %9.2f %6.3f\n", ma[i], mz[i], mz[i] / ma[i]);
    }
    fflush(stdout);
    double f = flops_of(&nd, LK_MLA_SPLIT_MERGE), peak[BENCH_MAX_VAR];
    for (int i = 0; i < K; i++) peak[i] = bench_peak(bench_flops_kind(LK_BF16), i);
    snprintf(shape, sizeof shape, "%s split_merge ND", label);
    bench_json_row("mla_prefix_prefill", shape, "bf16", "GFLOP/s", ma, f, peak, -1, NULL);
    snprintf(shape, sizeof shape, "%s split_merge NZ", label);
    bench_json_row("mla_prefix_prefill", shape, "bf16", "GFLOP/s", mz, f, peak, -1, NULL);
    teardown(&nd), teardown(&nz);
    free(a), free(z), free(ql), free(pl);
}

void bench_mla_prefill(void) {
    static const int32_t sweep[][3] = {{1, 100, 768},   {2, 100, 768},   {4, 100, 768},   {8, 100, 768},
                                       {16, 100, 768},  {32, 100, 768},  {64, 100, 768},  {128, 100, 768},
                                       {1, 256, 2048},  {4, 256, 2048},  {16, 256, 2048}, {32, 256, 2048},
                                       {1, 1024, 8192}, {4, 1024, 8192}, {8, 1024, 8192}};
    static const int quick[] = {0, 3, 8};
    int n = BENCH.full ? (int)(sizeof sweep / sizeof sweep[0]) : (int)(sizeof quick / sizeof quick[0]);
    int K = BENCH.nvar;
    char first[40];
    snprintf(first, sizeof first, "/%s", BENCH.nlib > 1 ? BENCH.lib[0].name : BENCH.var[0].name);
    printf("\n== mla_prefix_prefill sweep (H=4 per rank, QK 192, V 128, latent 512, page 128, bf16; median ms of "
           "interleaved rounds)\n");
    printf("columns: %smedian ms per strategy | each over the best | auto's choice, its median over the best, auto's "
           "own median ms and over the best | the best's GFLOP/s, %% of the %s peak measured at start-up, the peak "
           "measured around this case and %% of it | max error%s\n",
           K > 1 ? (BENCH.nlib > 1 ? "variant | " : "isa | ") : "",
           bench_flops_kind(LK_BF16) == BENCH_FLOPS_BF16 ? "bf16 dot (avx512; other ISAs: FMA)" : "FMA",
           K == 1 ? "" : BENCH.nlib > 1 ? " | the best median over the first library's on the same ISA"
                                         : " | the best median over the first ISA's");
    bench_section_name("mla_prefix_prefill sweep");
    print_label("case (B,Q,P)", BENCH.nlib > 1 ? "variant" : "isa");
    printf(" %8s %8s %8s %8s | %4s %4s %4s %4s | %-8s %4s %8s %4s | %5s %4s %5s %4s %8s", "split", "concat", "fused",
           "absorbed", "/bst", "/bst", "/bst", "/bst", "auto", "/bst", "auto ms", "/bst", "GF/s", "pk0", "pk", "pk",
           "max err");
    if (K > 1) printf(" %7s", first);
    printf("\n");
    int total = n + (BENCH.full ? 3 : 0);
    for (int i = 0; i < n; i++) {
        const int32_t *s = sweep[BENCH.full ? i : quick[i]];
        int32_t *ql = malloc(sizeof(int32_t) * (size_t)s[0]), *pl = malloc(sizeof(int32_t) * (size_t)s[0]);
        for (int b = 0; b < s[0]; b++) ql[b] = s[1], pl[b] = s[2];
        char label[64];
        snprintf(label, sizeof label, "(%d,%d,%d)", s[0], s[1], s[2]);
        if (BENCH.full) fprintf(stderr, "mla_prefill sweep [%d/%d] %s\n", i + 1, total, label);
        sweep_case(s[0], ql, pl, H_, label);
        free(ql), free(pl);
    }
    if (BENCH.full) {
        int32_t ql[32], pl[32];
        fprintf(stderr, "mla_prefill sweep [%d/%d] H=16 (16,100,768)\n", n + 1, total);
        for (int b = 0; b < 16; b++) ql[b] = 100, pl[b] = 768;
        sweep_case(16, ql, pl, 16, "H16 (16,100,768)");
        fprintf(stderr, "mla_prefill sweep [%d/%d] B=32 prefixes 768/0\n", n + 2, total);
        for (int b = 0; b < 32; b++) ql[b] = 100, pl[b] = b % 2 ? 0 : 768;
        sweep_case(32, ql, pl, H_, "(32,100,768/0)");
        fprintf(stderr, "mla_prefill sweep [%d/%d] B=10 mixed\n", n + 3, total);
        static const int32_t q10[10] = {101, 870, 876, 874, 869, 864, 904, 863, 837, 768};
        static const int32_t p10[10] = {768, 0, 0, 0, 0, 0, 0, 0, 0, 0};
        sweep_case(10, q10, p10, H_, "B10 mixed");
    }
    fp8_sweep();
    printf("\n== mla_prefix_prefill split + merge, NZ / ND cache layout (median ms)\n");
    bench_section_name("mla_prefix_prefill NZ / ND");
    print_label("case (B,Q,P)", BENCH.nlib > 1 ? "variant" : "isa");
    printf(" %9s %9s %6s\n", "ND", "NZ", "NZ/ND");
    static const int32_t nzc[][3] = {{1, 100, 768}, {8, 100, 768}, {32, 100, 768},
                                     {1, 1024, 8192}, {4, 1024, 8192}, {8, 1024, 8192}};
    int nn = BENCH.full ? 6 : 2;
    for (int i = 0; i < nn; i++) {
        if (BENCH.full) fprintf(stderr, "mla_prefill NZ/ND [%d/%d]\n", i + 1, nn);
        nz_case(nzc[i][0], nzc[i][1], nzc[i][2]);
    }
}
