/*
 * silu_and_mul / gelu_tanh_and_mul at LLM MLP shapes: x [T, 2 * I] -> out [T, I],
 * decode (T = 1, 16) and prefill (T = 4096), I = 14336 (Llama-3-8B; also Gemma-2-9B,
 * whose GeGLU is the gelu_tanh case) and I = 10944 (DeepSeek-V2-Lite dense MLP), bf16
 * and f32. Bytes: x read once + out written once (3 T I elements). The error column
 * compares the output of each variant with the reference kernel on the same inputs, over the
 * first min(T, 256) rows (the scalar reference over all 4096 rows would take longer
 * than the timing itself).
 */
#include <stdio.h>
#include <stdlib.h>

#include "bench.h"

typedef struct {
    lk_tensor out, x;
    int gelu;
} act_ctx;

static void run_act(void *p) {
    act_ctx *c = p;
    if (c->gelu) lk_gelu_tanh_and_mul(&c->out, &c->x);
    else lk_silu_and_mul(&c->out, &c->x);
}

#define CHECK_ROWS 256

static void one_case(int64_t T, int64_t I, lk_dtype dt) {
    int64_t n = T * I, R = T < CHECK_ROWS ? T : CHECK_ROWS;
    void *x = bench_alloc(dt, 2 * n, -6, 6), *out = NULL;
    /* out is written in full by the warm-up call: skip bench_alloc's scalar fill */
    if (posix_memalign(&out, 64, (size_t)n * lk_dtype_size(dt))) {
        fprintf(stderr, "bench: out of memory\n");
        exit(1);
    }
    void *ref = bench_alloc(dt, R * I, 0, 0);
    act_ctx c;
    c.x = lk_tensor_make(x, dt, 2, (int64_t[]){T, 2 * I});
    c.out = lk_tensor_make(out, dt, 2, (int64_t[]){T, I});
    lk_tensor xr = lk_tensor_make(x, dt, 2, (int64_t[]){R, 2 * I}); /* first R rows */
    lk_tensor tr = lk_tensor_make(ref, dt, 2, (int64_t[]){R, I});
    for (int gelu = 0; gelu <= 1; gelu++) {
        c.gelu = gelu;
        double ms = bench_time_bw(run_act, &c);
        lk_isa isa = lk_isa_current();
        lk_set_isa(LK_ISA_REF);
        if (gelu) lk_gelu_tanh_and_mul(&tr, &xr);
        else lk_silu_and_mul(&tr, &xr);
        lk_set_isa(isa);
        double err = bench_err_variants(run_act, &c, out, ref, dt, R * I);
        char shape[64];
        snprintf(shape, sizeof shape, "%lld x %lld -> %lld", (long long)T, (long long)(2 * I),
                 (long long)I);
        bench_row(gelu ? "gelu_tanh_and_mul" : "silu_and_mul", shape, lk_dtype_name(dt), ms,
                  (double)n * 3 * (double)lk_dtype_size(dt), BENCH_BW, err);
    }
    bench_free(x), bench_free(out), bench_free(ref);
}

void bench_activation(void) {
    bench_section("silu_and_mul / gelu_tanh_and_mul (bandwidth-bound; ceiling = copy bandwidth)");
    const int64_t tokens[] = {1, 16, 4096};
    const int64_t inter[] = {14336, 10944};
    const lk_dtype dts[] = {LK_BF16, LK_F32};
    for (int d = 0; d < 2; d++)
        for (int h = 0; h < 2; h++)
            for (int t = 0; t < 3; t++) one_case(tokens[t], inter[h], dts[d]);
}
