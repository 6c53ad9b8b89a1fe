/*
 * rms_norm / fused_add_rms_norm at LLM shapes: decode (1, 16 tokens), prefill (4096
 * tokens), hidden 4096 (Llama-3-8B), 8192 (Llama-3-70B), 2048 (DeepSeek-V2-Lite), and
 * the Qwen3 QK-norm over strided head views (BENCH.md). Bytes: 1 read + 1 write per
 * element (fused: 2 reads + 2 writes), weights once.
 */
#include <stdio.h>

#include "bench.h"

typedef struct {
    lk_tensor out, x, w, res;
    int fused;
} rms_ctx;

static void run_rms(void *p) {
    rms_ctx *c = p;
    if (c->fused) lk_fused_add_rms_norm(&c->x, &c->res, &c->w, 1e-6f, 0);
    else lk_rms_norm(&c->out, &c->x, &c->w, 1e-6f, 0);
}

static void one_case(int64_t T, int64_t D, lk_dtype dt, int fused) {
    int64_t n = T * D;
    void *x = bench_alloc(dt, n, -2, 2), *out = bench_alloc(dt, n, 0, 0);
    void *res = bench_alloc(dt, n, -2, 2), *w = bench_alloc(dt, D, 0.5, 1.5);
    rms_ctx c;
    c.x = lk_tensor_make(x, dt, 2, (int64_t[]){T, D});
    c.out = lk_tensor_make(out, dt, 2, (int64_t[]){T, D});
    c.res = lk_tensor_make(res, dt, 2, (int64_t[]){T, D});
    c.w = lk_tensor_make(w, dt, 1, &D);
    c.fused = fused;
    double err;
    if (!fused) {
        double ms = bench_time_bw(run_rms, &c);
        void *ref = bench_alloc(dt, n, 0, 0);
        lk_tensor tr = lk_tensor_make(ref, dt, 2, (int64_t[]){T, D});
        lk_isa isa = lk_isa_current();
        lk_set_isa(LK_ISA_REF);
        lk_rms_norm(&tr, &c.x, &c.w, 1e-6f, 0);
        lk_set_isa(isa);
        err = bench_err_variants(run_rms, &c, out, ref, dt, n);
        bench_free(ref);
        char shape[64];
        snprintf(shape, sizeof shape, "%lld x %lld", (long long)T, (long long)D);
        bench_row("rms_norm", shape, lk_dtype_name(dt), ms,
                  (double)n * 2 * (double)lk_dtype_size(dt), BENCH_BW, err);
    } else {
        /* repeated in-place calls keep values bounded (residual grows by x each call,
         * x is renormalised): time first, then check one call per variant from fresh inputs */
        double ms = bench_time_bw(run_rms, &c);
        void *x2 = bench_alloc(dt, n, -2, 2), *r2 = bench_alloc(dt, n, -2, 2);
        void *x3 = bench_alloc(dt, n, -2, 2), *r3 = bench_alloc(dt, n, -2, 2);
        lk_tensor tx2 = lk_tensor_make(x2, dt, 2, (int64_t[]){T, D}), tr2 = lk_tensor_make(r2, dt, 2, (int64_t[]){T, D});
        lk_tensor tx3 = lk_tensor_make(x3, dt, 2, (int64_t[]){T, D}), tr3 = lk_tensor_make(r3, dt, 2, (int64_t[]){T, D});
        lk_isa isa = lk_isa_current();
        lk_set_isa(LK_ISA_REF);
        lk_fused_add_rms_norm(&tx3, &tr3, &c.w, 1e-6f, 0);
        lk_set_isa(isa);
        err = 0;
        for (int i = 0; bench_use_variant(i); i++) {
            if (i) { /* fresh inputs again */
                bench_free(x2), bench_free(r2);
                tx2.data = x2 = bench_alloc(dt, n, -2, 2), tr2.data = r2 = bench_alloc(dt, n, -2, 2);
            }
            lk_fused_add_rms_norm(&tx2, &tr2, &c.w, 1e-6f, 0);
            double e = bench_max_err(x2, x3, dt, n), e2 = bench_max_err(r2, r3, dt, n);
            if (e2 > e) e = e2;
            if (e > err) err = e;
        }
        bench_free(x2), bench_free(r2), bench_free(x3), bench_free(r3);
        char shape[64];
        snprintf(shape, sizeof shape, "%lld x %lld", (long long)T, (long long)D);
        bench_row("fused_add_rms_norm", shape, lk_dtype_name(dt), ms,
                  (double)n * 4 * (double)lk_dtype_size(dt), BENCH_BW, err);
    }
    bench_free(x), bench_free(out), bench_free(res), bench_free(w);
}

/* Qwen3-style QK-norm: qkv[S, 4096] f16, q = [:, 0:2048] as [S, 16, 128], k = [:, 2048:3072]
 * as [S, 8, 128]; out contiguous or back into the strided view (in place) */
typedef struct {
    lk_tensor q, k, qo, ko, w;
} qk_ctx;

static void run_qk(void *p) {
    qk_ctx *c = p;
    lk_rms_norm(&c->qo, &c->q, &c->w, 1e-6f, 0);
    lk_rms_norm(&c->ko, &c->k, &c->w, 1e-6f, 0);
}

static void run_q(void *p) {
    qk_ctx *c = p;
    lk_rms_norm(&c->qo, &c->q, &c->w, 1e-6f, 0);
}

static void qk_case(int64_t S, int strided_out) {
    void *qkv = bench_alloc(LK_F16, S * 4096, -2, 2), *w = bench_alloc(LK_F16, 128, 0.5, 1.5);
    void *qo = bench_alloc(LK_F16, S * 2048, 0, 0), *ko = bench_alloc(LK_F16, S * 1024, 0, 0);
    qk_ctx c;
    c.q = (lk_tensor){qkv, LK_F16, 3, {S, 16, 128}, {4096, 128, 1}};
    c.k = (lk_tensor){(uint16_t *)qkv + 2048, LK_F16, 3, {S, 8, 128}, {4096, 128, 1}};
    c.w = lk_tensor_make(w, LK_F16, 1, (int64_t[]){128});
    if (strided_out) {
        c.qo = c.q;
        c.ko = c.k;
    } else {
        c.qo = lk_tensor_make(qo, LK_F16, 3, (int64_t[]){S, 16, 128});
        c.ko = lk_tensor_make(ko, LK_F16, 3, (int64_t[]){S, 8, 128});
    }
    /* error: one contiguous-output call per variant against ref before timing (in place changes q) */
    void *rq = bench_alloc(LK_F16, S * 2048, 0, 0), *tq = bench_alloc(LK_F16, S * 2048, 0, 0);
    lk_tensor trq = lk_tensor_make(rq, LK_F16, 3, (int64_t[]){S, 16, 128});
    lk_tensor ttq = lk_tensor_make(tq, LK_F16, 3, (int64_t[]){S, 16, 128});
    lk_isa isa = lk_isa_current();
    lk_set_isa(LK_ISA_REF);
    lk_rms_norm(&trq, &c.q, &c.w, 1e-6f, 0);
    lk_set_isa(isa);
    qk_ctx cq = c;
    cq.qo = ttq;
    double err = bench_err_variants(run_q, &cq, tq, rq, LK_F16, S * 2048);
    double ms = bench_time_bw(run_qk, &c);
    char shape[64];
    snprintf(shape, sizeof shape, "S=%lld q16+k8 x128 %s", (long long)S, strided_out ? "strd" : "cont");
    bench_row("qk_norm (q+k)", shape, "f16", ms, (double)S * 3072 * 2 * 2, BENCH_BW, err);
    bench_free(qkv), bench_free(w), bench_free(qo), bench_free(ko), bench_free(rq), bench_free(tq);
}

void bench_rms_norm(void) {
    bench_section("rms_norm / fused_add_rms_norm (bandwidth-bound; ceiling = copy bandwidth)");
    const int64_t tokens[] = {1, 16, 4096};
    const int64_t hidden[] = {2048, 4096, 8192};
    const lk_dtype dts[] = {LK_BF16, LK_F32};
    for (int f = 0; f <= 1; f++)
        for (int d = 0; d < 2; d++)
            for (int h = 0; h < 3; h++)
                for (int t = 0; t < 3; t++) {
                    if (!BENCH.full && hidden[h] == 2048 && tokens[t] != 4096) continue;
                    one_case(tokens[t], hidden[h], dts[d], f);
                }
    const int64_t S[] = {1, 36, 333};
    for (int s = 0; s < 3; s++)
        for (int so = 0; so <= 1; so++) qk_case(S[s], so);
}
