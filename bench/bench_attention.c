/*
 * flash_attn_varlen: prefill 1 x 2048 x 2048 causal (16 heads x 128; 32 q / 8 kv heads),
 * the MLA shape (192/128, 16 heads, 2048 prefix + 512 new tokens), and decode 1 query x
 * 4096 keys x 32 heads x 128, paged (page 16), batch 1 and 8; fp8 (e4m3 / e5m2) caches
 * beside bf16 ones (decode rows count fp8 bytes), a prefill row writing an fp8 out
 * (flash_attn_varlen_scaled, marked ">f8") and the fp8 vs bf16 decode A/B.
 * Prefill rows: GFLOP/s of effective work 4 * Sq * Sk * D * H (causal-halved) against the
 * FMA peak of each ISA, or for all-bf16 inputs the bf16 dot peak where bench_flops_kind
 * says so. Decode rows: GB/s of K/V read against the read bandwidth.
 * Max error: the reference on a sub-problem whose rows are rows of each variant's output (the
 * last 32 queries of the first KV head's query heads, over all keys: bottom-right causal
 * alignment makes them identical rows).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "core/core.h"

typedef struct {
    lk_tensor out, q, k, v, cuq, cuk, used, table;
    int paged;
    lk_attn_params p;
    const lk_tensor *oscale; /* fp8 out: its output_scale (lk_flash_attn_varlen_scaled), else NULL */
} attn_ctx;

/* lk_flash_attn_varlen, or with c->oscale its _scaled form; the latter is called directly,
 * not through bench_api (a --lib variant times this build's) */
static lk_status attn_call(const attn_ctx *c, const lk_tensor *out, const lk_tensor *q, const lk_tensor *k,
                           const lk_tensor *v, const lk_tensor *cuq, const lk_tensor *cuk, const lk_tensor *used,
                           const lk_tensor *table) {
    const lk_tensor *ck = c->paged ? NULL : cuk, *u = c->paged ? used : NULL, *t = c->paged ? table : NULL;
    if (c->oscale) return lk_flash_attn_varlen_scaled(out, NULL, q, k, v, cuq, ck, u, t, &c->p, c->oscale);
    return lk_flash_attn_varlen(out, NULL, q, k, v, cuq, ck, u, t, &c->p);
}

static void run_attn(void *vc) {
    attn_ctx *c = vc;
    (void)attn_call(c, &c->out, &c->q, &c->k, &c->v, &c->cuq, &c->cuk, &c->used, &c->table);
}

/* max error over the variants of the output's last `rows` queries of request 0 (heads
 * of KV head 0) against the reference on that sub-problem */
static double check_tail(attn_ctx *c, int64_t q_len, int64_t k_len, int64_t Hq, int64_t Hk,
                         int64_t Dv, int64_t rows) {
    int64_t G = Hq / Hk;
    if (rows > q_len) rows = q_len;
    lk_tensor q = c->q, k = c->k, v = c->v, out = c->out;
    q.data = (char *)q.data + (q_len - rows) * q.stride[0] * (int64_t)lk_dtype_size(q.dtype);
    q.shape[0] = rows, q.shape[1] = G;
    out.data = (char *)out.data + (q_len - rows) * out.stride[0] * (int64_t)lk_dtype_size(out.dtype);
    out.shape[0] = rows, out.shape[1] = G;
    if (!c->paged) k.shape[1] = v.shape[1] = 1;
    else k.shape[2] = v.shape[2] = 1;
    void *ref = bench_alloc(out.dtype, rows * G * Dv, 0, 0);
    lk_tensor tref = lk_tensor_make(ref, out.dtype, 3, (int64_t[]){rows, G, Dv});
    int32_t cuq[2] = {0, (int32_t)rows}, cuk[2] = {0, (int32_t)k_len}, used[1] = {(int32_t)k_len};
    lk_tensor tcuq = lk_tensor_make(cuq, LK_I32, 1, (int64_t[]){2});
    lk_tensor tcuk = lk_tensor_make(cuk, LK_I32, 1, (int64_t[]){2});
    lk_tensor tused = lk_tensor_make(used, LK_I32, 1, (int64_t[]){1});
    lk_tensor table = c->table;
    table.shape[0] = 1;
    lk_isa isa = lk_isa_current();
    lk_set_isa(LK_ISA_REF);
    lk_status s = attn_call(c, &tref, &q, &k, &v, &tcuq, &tcuk, &tused, &table);
    lk_set_isa(isa);
    double err = 0;
    if (s != LK_OK) {
        fprintf(stderr, "reference failed: %s\n", lk_last_error());
        err = INFINITY;
    }
    /* the whole problem once per variant, compared row by row: the timed rows are
     * strided by the full head count */
    for (int i = 0; s == LK_OK && bench_use_variant(i); i++) {
        run_attn(c);
        for (int64_t r = 0; r < rows; r++) {
            const char *tr = (const char *)out.data + r * out.stride[0] * (int64_t)lk_dtype_size(out.dtype);
            const char *rr = (const char *)ref + r * G * Dv * (int64_t)lk_dtype_size(out.dtype);
            double e = bench_max_err(tr, rr, out.dtype, G * Dv);
            if (e > err) err = e;
        }
    }
    bench_free(ref);
    return err;
}

static void prefill_case(int64_t S, int64_t P, int64_t Hq, int64_t Hk, int64_t Dqk, int64_t Dv,
                         lk_dtype kvt, lk_dtype outt, const char *label) {
    /* one request: S new queries over P + S keys, causal (bottom-right); out of outt (fp8:
     * lk_flash_attn_varlen_scaled with output_scale 1 / 64, out ~ [-1, 1] in codes up to 64) */
    int64_t Sk = P + S;
    attn_ctx c;
    memset(&c, 0, sizeof c);
    void *q = bench_alloc(LK_BF16, S * Hq * Dqk, -1, 1), *out = bench_alloc(outt, S * Hq * Dv, 0, 0);
    void *k = bench_alloc(kvt, Sk * Hk * Dqk, -1, 1), *v = bench_alloc(kvt, Sk * Hk * Dv, -1, 1);
    int32_t cuq[2] = {0, (int32_t)S}, cuk[2] = {0, (int32_t)Sk};
    c.q = lk_tensor_make(q, LK_BF16, 3, (int64_t[]){S, Hq, Dqk});
    c.out = lk_tensor_make(out, outt, 3, (int64_t[]){S, Hq, Dv});
    float os = 1.0f / 64;
    lk_tensor tos = lk_tensor_make(&os, LK_F32, 0, NULL);
    if (outt == LK_F8E4M3 || outt == LK_F8E5M2) c.oscale = &tos; /* 0.3: only for the fp8-out row */
    c.k = lk_tensor_make(k, kvt, 3, (int64_t[]){Sk, Hk, Dqk});
    c.v = lk_tensor_make(v, kvt, 3, (int64_t[]){Sk, Hk, Dv});
    c.cuq = lk_tensor_make(cuq, LK_I32, 1, (int64_t[]){2});
    c.cuk = lk_tensor_make(cuk, LK_I32, 1, (int64_t[]){2});
    c.p = lk_attn_params_default((float)(1.0 / sqrt((double)Dqk)));
    c.p.alibi_slopes = NULL; /* a 0.1 build (--lib) returns the struct without this field */
    c.p.causal = 1;
    double ms = bench_time(run_attn, &c);
    double err = check_tail(&c, S, Sk, Hq, Hk, Dv, 32);
    /* effective flops: QK and PV over the visible (causal) pairs */
    double pairs = (double)S * (double)P + (double)S * (double)(S + 1) / 2;
    double flops = 2.0 * pairs * (double)(Dqk + Dv) * (double)Hq;
    char shape[64];
    snprintf(shape, sizeof shape, "%s", label);
    /* q is bf16: the kind follows K / V's dtype */
    /* fp8 K / V take the bf16 dot path where bf16 ones do (widened exactly) */
    lk_dtype kind_dt = kvt == LK_F8E4M3 || kvt == LK_F8E5M2 ? LK_BF16 : kvt;
    if (lk_cpu_prefer_fma()) kind_dt = LK_F32; /* the kernels take f32 FMAs on this CPU */
    bench_row("flash_attn prefill", shape, lk_dtype_name(kvt), ms, flops, bench_flops_kind(kind_dt), err);
    bench_free(q), bench_free(out), bench_free(k), bench_free(v);
}

/* a paged decode problem: B requests of 1 query over K keys, H / Hk heads x D, pages of
 * bs slots scattered through the pool, K/V caches of kvt (fp8: per-tensor descales) */
typedef struct {
    attn_ctx c;
    void *q, *out, *k, *v;
    int32_t *cuq, *used, *table;
    float kd, vd;
    lk_tensor tkd, tvd;
} decode_prob;

static void decode_make(decode_prob *d, int64_t B, int64_t K, int64_t H, int64_t Hk, int64_t D, int64_t bs,
                        lk_dtype kvt) {
    memset(d, 0, sizeof *d);
    attn_ctx *c = &d->c;
    c->paged = 1;
    int64_t pages = (K + bs - 1) / bs, nb = B * pages;
    int f8 = kvt == LK_F8E4M3 || kvt == LK_F8E5M2;
    d->q = bench_alloc(LK_BF16, B * H * D, -1, 1), d->out = bench_alloc(LK_BF16, B * H * D, 0, 0);
    /* fp8: codes of x / 0.25 for x in [-1, 1) (the quantized range of a real cache) */
    d->k = bench_alloc(kvt, nb * bs * Hk * D, f8 ? -4 : -1, f8 ? 4 : 1);
    d->v = bench_alloc(kvt, nb * bs * Hk * D, f8 ? -4 : -1, f8 ? 4 : 1);
    d->cuq = bench_alloc(LK_I32, B + 1, 0, 0), d->used = bench_alloc(LK_I32, B, 0, 0);
    d->table = bench_alloc(LK_I32, B * pages, 0, 0);
    for (int64_t b = 0; b <= B; b++) d->cuq[b] = (int32_t)b;
    for (int64_t b = 0; b < B; b++) d->used[b] = (int32_t)K;
    /* pages of a request scattered: stride through the pool */
    for (int64_t b = 0; b < B; b++)
        for (int64_t p = 0; p < pages; p++) d->table[b * pages + p] = (int32_t)((p * B + b) % nb);
    c->q = lk_tensor_make(d->q, LK_BF16, 3, (int64_t[]){B, H, D});
    c->out = lk_tensor_make(d->out, LK_BF16, 3, (int64_t[]){B, H, D});
    c->k = lk_tensor_make(d->k, kvt, 4, (int64_t[]){nb, bs, Hk, D});
    c->v = lk_tensor_make(d->v, kvt, 4, (int64_t[]){nb, bs, Hk, D});
    c->cuq = lk_tensor_make(d->cuq, LK_I32, 1, (int64_t[]){B + 1});
    c->used = lk_tensor_make(d->used, LK_I32, 1, (int64_t[]){B});
    c->table = lk_tensor_make(d->table, LK_I32, 2, (int64_t[]){B, pages});
    c->p = lk_attn_params_default((float)(1.0 / sqrt((double)D)));
    c->p.alibi_slopes = NULL; /* a 0.1 build (--lib) returns the struct without this field */
    c->p.causal = 1;
    if (f8) { /* 0.3 fields: set only for the fp8 rows, which need a 0.3 library */
        d->kd = d->vd = 0.25f;
        d->tkd = lk_tensor_make(&d->kd, LK_F32, 0, NULL), d->tvd = lk_tensor_make(&d->vd, LK_F32, 0, NULL);
        c->p.k_descale = &d->tkd, c->p.v_descale = &d->tvd;
    }
}

static void decode_free(decode_prob *d) {
    bench_free(d->q), bench_free(d->out), bench_free(d->k), bench_free(d->v);
    bench_free(d->cuq), bench_free(d->used), bench_free(d->table);
}

static void decode_shape(char *shape, size_t n, int64_t B, int64_t K, int64_t H, int64_t Hk, int64_t D, int64_t bs) {
    char heads[32];
    if (Hk == H) snprintf(heads, sizeof heads, "%lldh", (long long)H);
    else snprintf(heads, sizeof heads, "%lld/%lldh", (long long)H, (long long)Hk);
    snprintf(shape, n, "B=%lld 1x%lld x%s x%lld p%lld", (long long)B, (long long)K, heads, (long long)D, (long long)bs);
}

static void decode_case(int64_t B, int64_t K, int64_t H, int64_t Hk, int64_t D, int64_t bs, lk_dtype kvt) {
    decode_prob d;
    decode_make(&d, B, K, H, Hk, D, bs, kvt);
    double ms = bench_time(run_attn, &d.c);
    double err = check_tail(&d.c, 1, K, H, Hk, D, 1);
    char shape[64];
    decode_shape(shape, sizeof shape, B, K, H, Hk, D, bs);
    /* bytes read: the K and V caches in their own element size (fp8: 1 byte) */
    double bytes = (double)B * K * Hk * D * 2 * (double)lk_dtype_size(kvt);
    bench_row("flash_attn decode", shape, lk_dtype_name(kvt), ms, bytes, BENCH_READ_BW, err);
    decode_free(&d);
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* fp8 vs bf16 caches of the same decode problem, in-process A/B on each ISA of --isa:
 * calls alternate (bf16, fp8, read probe, bf16, ...) on the first variant, medians of
 * each; the fp8 read rate counts fp8 bytes. It is set against the read probes taken
 * between the calls (the start-up probe's figure drifts away on a shared machine: the
 * same build's fp8 decode measured 2.0 and 3.1 ms a few minutes apart), as the median
 * of the per-round ratios fp8 rate / probe rate, and against the start-up probe */
static void decode_ab_fp8(int64_t B, int64_t K, int64_t H, int64_t Hk, int64_t D, int64_t bs, lk_dtype f8) {
    enum { REPS = 15 };
    decode_prob a, b;
    decode_make(&a, B, K, H, Hk, D, bs, LK_BF16);
    decode_make(&b, B, K, H, Hk, D, bs, f8);
    char shape[64];
    decode_shape(shape, sizeof shape, B, K, H, Hk, D, bs);
    double bytes = (double)B * K * Hk * D * 2;
    lk_isa prev = lk_isa_current();
    for (int vi = 0; vi < BENCH.nisa; vi++) {
        lk_set_isa(BENCH.isa[vi]);
        double ta[REPS], tb[REPS], pr[REPS], fr[REPS];
        run_attn(&a.c), run_attn(&b.c); /* warm-up */
        for (int r = 0; r < REPS; r++) {
            double t0 = now_ms();
            run_attn(&a.c);
            double t1 = now_ms();
            run_attn(&b.c);
            ta[r] = t1 - t0, tb[r] = now_ms() - t1;
            pr[r] = bench_read_probe();
            fr[r] = pr[r] > 0 ? bytes / tb[r] * 1e-6 / pr[r] : 0;
        }
        qsort(ta, REPS, sizeof(double), cmp_d), qsort(tb, REPS, sizeof(double), cmp_d);
        qsort(pr, REPS, sizeof(double), cmp_d), qsort(fr, REPS, sizeof(double), cmp_d);
        double ma = ta[REPS / 2], mb = tb[REPS / 2];
        /* the compute floor: 4 flops per (query head, key, dim) (q . k and p v) at the
         * ISA's f32 FMA peak, or its bf16 dot peak where the decode runs on bf16 pairs (not
         * where lk_cpu_prefer_fma)
         * (amx: the fp8 decode's tile products, at the tile peak) */
        lk_isa isa = BENCH.isa[vi];
        double peak = isa == LK_ISA_AMX && BENCH.amx_gflops > 0 ? BENCH.amx_gflops
                      : (isa == LK_ISA_AVX512BF16 && !lk_cpu_prefer_fma()) || isa == LK_ISA_AMX ? BENCH.bf16_gflops
                                                                      : BENCH.isa_fma[vi];
        double flops = 4.0 * (double)B * K * H * D;
        printf("  A/B %s %s vs bf16 on %s (%d alternating reps, medians; min-max): bf16 %.3f ms (%.3f-%.3f), "
               "%s %.3f ms (%.3f-%.3f): %.2fx faster; %s reads %.1f GB/s = %.0f %% of the read probes between the "
               "calls (median %.1f GB/s; per-round ratio median %.0f %%, %.0f-%.0f %%), %.0f %% of the start-up probe "
               "(%.1f GB/s); floors: %s bytes at the start-up probe %.3f ms, bf16 bytes %.3f ms, flops at %.0f "
               "GFLOP/s %.3f ms\n",
               shape, lk_dtype_name(f8), lk_isa_name(BENCH.isa[vi]), REPS, ma, ta[0], ta[REPS - 1], lk_dtype_name(f8),
               mb, tb[0], tb[REPS - 1], ma / mb, lk_dtype_name(f8), bytes / mb * 1e-6,
               pr[REPS / 2] > 0 ? 100.0 * bytes / mb * 1e-6 / pr[REPS / 2] : 0, pr[REPS / 2], 100.0 * fr[REPS / 2],
               100.0 * fr[0], 100.0 * fr[REPS - 1], 100.0 * bytes / mb * 1e-6 / BENCH.read_gbs, BENCH.read_gbs,
               lk_dtype_name(f8),
               bytes / BENCH.read_gbs * 1e-6, 2 * bytes / BENCH.read_gbs * 1e-6, peak,
               peak > 0 ? flops / peak * 1e-6 : 0.0);
    }
    lk_set_isa(prev);
    decode_free(&a), decode_free(&b);
}

void bench_attention(void) {
    bench_section(bench_flops_kind(LK_BF16) == BENCH_FLOPS_BF16
                      ? "flash_attn_varlen (prefill: ceiling = bf16 dot peak for bf16 K/V on avx512, else f32 "
                        "FMA peak; decode: ceiling = read bandwidth)"
                      : "flash_attn_varlen (prefill: ceiling = f32 FMA peak; decode: ceiling = read bandwidth)");
    prefill_case(2048, 0, 16, 16, 128, 128, LK_BF16, LK_BF16, "1x2048^2 c 16h x128");
    prefill_case(2048, 0, 16, 16, 128, 128, LK_F16, LK_BF16, "1x2048^2 c 16h x128");
    prefill_case(2048, 0, 32, 8, 128, 128, LK_BF16, LK_BF16, "1x2048^2 c 32/8h x128");
    prefill_case(512, 2048, 16, 16, 192, 128, LK_BF16, LK_BF16, "MLA 512+2048p 16h 192/128");
    decode_case(1, 4096, 32, 32, 128, 16, LK_BF16);
    decode_case(8, 4096, 32, 32, 128, 16, LK_BF16);
    decode_case(8, 4096, 32, 8, 128, 16, LK_BF16); /* GQA, Llama-3-8B's heads */
    /* ---- fp8 KV caches (e4m3 / e5m2, per-tensor descales): decode rows beside bf16's, a
     * prefill row, and the in-process fp8 vs bf16 A/B of the GQA decode */
    decode_case(8, 4096, 32, 8, 128, 16, LK_F8E4M3);
    decode_case(8, 4096, 32, 8, 128, 16, LK_F8E5M2);
    decode_case(8, 4096, 32, 32, 128, 16, LK_F8E4M3);
    prefill_case(2048, 0, 32, 8, 128, 128, LK_F8E4M3, LK_BF16, "1x2048^2 c 32/8h x128");
    /* the same with an fp8 out (flash_attn_varlen_scaled: out / output_scale to e4m3) */
    if (bench_libs_have("lk_flash_attn_varlen_scaled", "the fp8-out prefill row"))
        prefill_case(2048, 0, 32, 8, 128, 128, LK_F8E4M3, LK_F8E4M3, "1x2048^2 c 32/8h x128 >f8");
    decode_ab_fp8(8, 4096, 32, 8, 128, 16, LK_F8E4M3);
}
