/*
 * merge_attn_states at LLM shapes: decode (1, 16 tokens) and prefill (4096 tokens),
 * Llama-3-8B attention (32 heads x head 128) and DeepSeek-V2-Lite MLA (16 heads x v
 * head 128, and x 512 for the absorbed latent-space output), bf16 and f32 states and
 * output. LSEs in vLLM's [H, T] storage, passed as the transposed [T, H] view; out_lse
 * written. Bytes: 2 states + 2 LSEs read, out + out_lse written.
 */
#include <stdio.h>

#include "bench.h"

typedef struct {
    lk_tensor out, out_lse, a, lse_a, b, lse_b;
} merge_ctx;

static void run_merge(void *p) {
    merge_ctx *c = p;
    lk_merge_attn_states(&c->out, &c->out_lse, &c->a, &c->lse_a, &c->b, &c->lse_b);
}

/* [T, H] view of an [H, T] f32 buffer */
static lk_tensor lse_view(void *p, int64_t T, int64_t H) {
    lk_tensor t = lk_tensor_make(p, LK_F32, 2, (int64_t[]){T, H});
    t.stride[0] = 1;
    t.stride[1] = T;
    return t;
}

static void one_case(int64_t T, int64_t H, int64_t D, lk_dtype dt, const char *model) {
    int64_t n = T * H * D;
    int64_t shape[3] = {T, H, D};
    /* one more element for b and lse_b: bench_alloc seeds by count, a and b must differ */
    void *a = bench_alloc(dt, n, -2, 2), *b = bench_alloc(dt, n + 1, -2, 2);
    void *out = bench_alloc(dt, n, 0, 0), *ref = bench_alloc(dt, n, 0, 0);
    void *la = bench_alloc(LK_F32, T * H, -3, 3), *lb = bench_alloc(LK_F32, T * H + 1, -3, 3);
    void *lo = bench_alloc(LK_F32, T * H, 0, 0);
    merge_ctx c;
    c.out = lk_tensor_make(out, dt, 3, shape);
    c.a = lk_tensor_make(a, dt, 3, shape);
    c.b = lk_tensor_make(b, dt, 3, shape);
    c.lse_a = lse_view(la, T, H);
    c.lse_b = lse_view(lb, T, H);
    c.out_lse = lse_view(lo, T, H);
    double ms = bench_time_bw(run_merge, &c);
    lk_tensor tr = lk_tensor_make(ref, dt, 3, shape);
    lk_isa isa = lk_isa_current();
    lk_set_isa(LK_ISA_REF);
    lk_merge_attn_states(&tr, NULL, &c.a, &c.lse_a, &c.b, &c.lse_b);
    lk_set_isa(isa);
    double err = bench_err_variants(run_merge, &c, out, ref, dt, n);
    char sh[64];
    snprintf(sh, sizeof sh, "%s T=%lld %lldx%lld", model, (long long)T, (long long)H, (long long)D);
    double bytes = (double)n * 3 * (double)lk_dtype_size(dt) + (double)T * H * 3 * 4;
    bench_row("merge_attn_states", sh, lk_dtype_name(dt), ms, bytes, BENCH_BW, err);
    bench_free(a), bench_free(b), bench_free(out), bench_free(ref);
    bench_free(la), bench_free(lb), bench_free(lo);
}

void bench_merge(void) {
    bench_section("merge_attn_states (bandwidth-bound; ceiling = copy bandwidth)");
    const int64_t tokens[] = {1, 16, 4096};
    const struct {
        int64_t H, D;
        const char *model;
    } heads[] = {{32, 128, "llama3"}, {16, 128, "dsv2l"}, {16, 512, "dsv2l-lat"}};
    const lk_dtype dts[] = {LK_BF16, LK_F32};
    for (int d = 0; d < 2; d++)
        for (int h = 0; h < 3; h++)
            for (int t = 0; t < 3; t++)
                one_case(tokens[t], heads[h].H, heads[h].D, dts[d], heads[h].model);
}
