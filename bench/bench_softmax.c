/*
 * causal_softmax at attention-score shapes: decode (32 heads x 1 and 16 queries x 4096
 * keys, Llama-3-8B), prefill (8 heads x 512 x 512), and a prefill far beyond the L3
 * (32 heads x 1024 x 1024) for the bandwidth figure; bf16 and f32. Bytes: the visible
 * (unmasked) entries read once, every entry written once.
 */
#include <stdio.h>

#include "bench.h"

typedef struct {
    lk_tensor out, x;
} softmax_ctx;

static void run_softmax(void *p) {
    softmax_ctx *c = p;
    lk_causal_softmax(&c->out, &c->x);
}

static void one_case(int64_t H, int64_t Q, int64_t K, lk_dtype dt) {
    int64_t n = H * Q * K, shape[3] = {H, Q, K};
    void *x = bench_alloc(dt, n, -8, 8), *out = bench_alloc(dt, n, 0, 0), *ref = bench_alloc(dt, n, 0, 0);
    softmax_ctx c;
    c.x = lk_tensor_make(x, dt, 3, shape);
    c.out = lk_tensor_make(out, dt, 3, shape);
    double ms = bench_time_bw(run_softmax, &c);
    lk_tensor tr = lk_tensor_make(ref, dt, 3, shape);
    lk_isa isa = lk_isa_current();
    lk_set_isa(LK_ISA_REF);
    lk_causal_softmax(&tr, &c.x);
    lk_set_isa(isa);
    double err = bench_err_variants(run_softmax, &c, out, ref, dt, n);
    double visible = 0; /* query i sees min(K, i + K - Q + 1) keys (at least 0) */
    for (int64_t i = 0; i < Q; i++) {
        int64_t nv = i + K - Q + 1;
        visible += (double)(nv < 0 ? 0 : nv);
    }
    visible *= (double)H;
    char sh[64];
    snprintf(sh, sizeof sh, "%lld x %lld x %lld", (long long)H, (long long)Q, (long long)K);
    bench_row("causal_softmax", sh, lk_dtype_name(dt), ms,
              (visible + (double)n) * (double)lk_dtype_size(dt), BENCH_BW, err);
    bench_free(x), bench_free(out), bench_free(ref);
}

void bench_softmax(void) {
    bench_section("causal_softmax (bandwidth-bound at large shapes; ceiling = copy bandwidth)");
    const int64_t cases[][3] = {{32, 1, 4096}, {32, 16, 4096}, {8, 512, 512}, {32, 1024, 1024}};
    const lk_dtype dts[] = {LK_BF16, LK_F32};
    for (int d = 0; d < 2; d++)
        for (int c = 0; c < 4; c++) one_case(cases[c][0], cases[c][1], cases[c][2], dts[d]);
}
