/*
 * flash_attn_varlen: prefill 1 x 2048 x 2048 causal (16 heads x 128; 32 q / 8 kv heads),
 * the MLA shape (192/128, 16 heads, 2048 prefix + 512 new tokens), and decode 1 query x
 * 4096 keys x 32 heads x 128, paged (page 16), batch 1 and 8.
 * Prefill rows: GFLOP/s of effective work 4 * Sq * Sk * D * H (causal-halved) against the
 * FMA peak of each ISA, or for all-bf16 inputs the bf16 dot peak where bench_flops_kind
 * says so. Decode rows: GB/s of K/V read against the read bandwidth.
 * Max error: the reference on a sub-problem whose rows are rows of each variant's output (the
 * last 32 queries of the first KV head's query heads, over all keys: bottom-right causal
 * alignment makes them identical rows).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bench.h"

typedef struct {
    lk_tensor out, q, k, v, cuq, cuk, used, table;
    int paged;
    lk_attn_params p;
} attn_ctx;

static void run_attn(void *vc) {
    attn_ctx *c = vc;
    lk_flash_attn_varlen(&c->out, NULL, &c->q, &c->k, &c->v, &c->cuq, c->paged ? NULL : &c->cuk,
                         c->paged ? &c->used : NULL, c->paged ? &c->table : NULL, &c->p);
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
    lk_status s = lk_flash_attn_varlen(&tref, NULL, &q, &k, &v, &tcuq, c->paged ? NULL : &tcuk,
                                       c->paged ? &tused : NULL, c->paged ? &table : NULL, &c->p);
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
                         lk_dtype kvt, const char *label) {
    /* one request: S new queries over P + S keys, causal (bottom-right) */
    int64_t Sk = P + S;
    attn_ctx c;
    memset(&c, 0, sizeof c);
    void *q = bench_alloc(LK_BF16, S * Hq * Dqk, -1, 1), *out = bench_alloc(LK_BF16, S * Hq * Dv, 0, 0);
    void *k = bench_alloc(kvt, Sk * Hk * Dqk, -1, 1), *v = bench_alloc(kvt, Sk * Hk * Dv, -1, 1);
    int32_t cuq[2] = {0, (int32_t)S}, cuk[2] = {0, (int32_t)Sk};
    c.q = lk_tensor_make(q, LK_BF16, 3, (int64_t[]){S, Hq, Dqk});
    c.out = lk_tensor_make(out, LK_BF16, 3, (int64_t[]){S, Hq, Dv});
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
    bench_row("flash_attn prefill", shape, lk_dtype_name(kvt), ms, flops, bench_flops_kind(kvt), err);
    bench_free(q), bench_free(out), bench_free(k), bench_free(v);
}

static void decode_case(int64_t B, int64_t K, int64_t H, int64_t Hk, int64_t D, int64_t bs) {
    attn_ctx c;
    memset(&c, 0, sizeof c);
    c.paged = 1;
    int64_t pages = (K + bs - 1) / bs, nb = B * pages;
    void *q = bench_alloc(LK_BF16, B * H * D, -1, 1), *out = bench_alloc(LK_BF16, B * H * D, 0, 0);
    void *k = bench_alloc(LK_BF16, nb * bs * Hk * D, -1, 1), *v = bench_alloc(LK_BF16, nb * bs * Hk * D, -1, 1);
    int32_t *cuq = bench_alloc(LK_I32, B + 1, 0, 0), *used = bench_alloc(LK_I32, B, 0, 0);
    int32_t *table = bench_alloc(LK_I32, B * pages, 0, 0);
    for (int64_t b = 0; b <= B; b++) cuq[b] = (int32_t)b;
    for (int64_t b = 0; b < B; b++) used[b] = (int32_t)K;
    /* pages of a request scattered: stride through the pool */
    for (int64_t b = 0; b < B; b++)
        for (int64_t p = 0; p < pages; p++) table[b * pages + p] = (int32_t)((p * B + b) % nb);
    c.q = lk_tensor_make(q, LK_BF16, 3, (int64_t[]){B, H, D});
    c.out = lk_tensor_make(out, LK_BF16, 3, (int64_t[]){B, H, D});
    c.k = lk_tensor_make(k, LK_BF16, 4, (int64_t[]){nb, bs, Hk, D});
    c.v = lk_tensor_make(v, LK_BF16, 4, (int64_t[]){nb, bs, Hk, D});
    c.cuq = lk_tensor_make(cuq, LK_I32, 1, (int64_t[]){B + 1});
    c.used = lk_tensor_make(used, LK_I32, 1, (int64_t[]){B});
    c.table = lk_tensor_make(table, LK_I32, 2, (int64_t[]){B, pages});
    c.p = lk_attn_params_default((float)(1.0 / sqrt((double)D)));
    c.p.alibi_slopes = NULL; /* a 0.1 build (--lib) returns the struct without this field */
    c.p.causal = 1;
    double ms = bench_time(run_attn, &c);
    double err = check_tail(&c, 1, K, H, Hk, D, 1);
    char shape[64], heads[32];
    if (Hk == H) snprintf(heads, sizeof heads, "%lldh", (long long)H);
    else snprintf(heads, sizeof heads, "%lld/%lldh", (long long)H, (long long)Hk);
    snprintf(shape, sizeof shape, "B=%lld 1x%lld x%s x%lld p%lld", (long long)B, (long long)K, heads, (long long)D,
             (long long)bs);
    bench_row("flash_attn decode", shape, "bf16", ms, (double)B * K * Hk * D * 2 * 2, BENCH_READ_BW, err);
    bench_free(q), bench_free(out), bench_free(k), bench_free(v), bench_free(cuq), bench_free(used), bench_free(table);
}

void bench_attention(void) {
    bench_section(bench_flops_kind(LK_BF16) == BENCH_FLOPS_BF16
                      ? "flash_attn_varlen (prefill: ceiling = bf16 dot peak for bf16 K/V on avx512, else f32 "
                        "FMA peak; decode: ceiling = read bandwidth)"
                      : "flash_attn_varlen (prefill: ceiling = f32 FMA peak; decode: ceiling = read bandwidth)");
    prefill_case(2048, 0, 16, 16, 128, 128, LK_BF16, "1x2048^2 c 16h x128");
    prefill_case(2048, 0, 16, 16, 128, 128, LK_F16, "1x2048^2 c 16h x128");
    prefill_case(2048, 0, 32, 8, 128, 128, LK_BF16, "1x2048^2 c 32/8h x128");
    prefill_case(512, 2048, 16, 16, 192, 128, LK_BF16, "MLA 512+2048p 16h 192/128");
    decode_case(1, 4096, 32, 32, 128, 16);
    decode_case(8, 4096, 32, 32, 128, 16);
    decode_case(8, 4096, 32, 8, 128, 16); /* GQA, Llama-3-8B's heads */
}
