/*
 * rotary_embedding at LLM shapes: decode (1, 16 tokens) and prefill (4096 tokens),
 * bf16 and f32 (q, k and the cache in the same dtype), positions random over an
 * 8192-row cache (i64).
 *  - Llama-3-8B: q [T, 32, 128] + k [T, 8, 128], rot 128, NeoX; also q and k as slices of
 *    the fused qkv[T, 6144] projection output (T = 4096).
 *  - DeepSeek-V2-Lite rope part (MLA qk_rope 64): q [T, 16, 64] GPT-J-style interleaved +
 *    k [T, 1, 64]; also as the real slices q[T, 16, 192][..., 128:] and kv_a[T, 576][:, 512:]
 *    (T = 4096).
 * Bytes: the rotated elements of q and k read + written, the cache rows read (T x rot).
 * The cache holds true cos/sin values so repeated in-place timing calls stay bounded.
 * Max error: one call from the same inputs on each variant and on ref.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "core/half.h"

#define MAX_POS 8192

typedef struct {
    lk_tensor pos, q, k, cache;
    int neox;
} rope_ctx;

static void run_rope(void *p) {
    rope_ctx *c = p;
    lk_rotary_embedding(&c->pos, &c->q, &c->k, &c->cache, c->neox);
}

static void *make_cache(lk_dtype dt, int64_t rot) {
    void *cache = bench_alloc(dt, MAX_POS * rot, 0, 0);
    for (int64_t p = 0; p < MAX_POS; p++)
        for (int64_t i = 0; i < rot / 2; i++) {
            double a = (double)p * pow(10000.0, -2.0 * (double)i / (double)rot);
            lk_store_f(cache, dt, p * rot + i, (float)cos(a));
            lk_store_f(cache, dt, p * rot + rot / 2 + i, (float)sin(a));
        }
    return cache;
}

/* q, k: views into buf (which holds `n` elements); the row printed as `label` */
static void one_case(const char *label, void *buf, int64_t n, lk_tensor q, lk_tensor k,
                     int64_t rot, int neox) {
    lk_dtype dt = q.dtype;
    int64_t T = q.shape[0];
    size_t es = lk_dtype_size(dt);
    void *cache = make_cache(dt, rot), *pos = bench_alloc(LK_I64, T, 0, MAX_POS);
    rope_ctx c = {lk_tensor_make(pos, LK_I64, 1, &T), q, k,
                  lk_tensor_make(cache, dt, 2, (int64_t[]){MAX_POS, rot}), neox};
    /* error: one call on copies of buf, each variant vs ref */
    void *b1 = bench_alloc(dt, n, 0, 0), *b2 = bench_alloc(dt, n, 0, 0);
    memcpy(b2, buf, (size_t)n * es);
    rope_ctx c1 = c, c2 = c;
    c1.q.data = (char *)b1 + ((char *)q.data - (char *)buf);
    c1.k.data = (char *)b1 + ((char *)k.data - (char *)buf);
    c2.q.data = (char *)b2 + ((char *)q.data - (char *)buf);
    c2.k.data = (char *)b2 + ((char *)k.data - (char *)buf);
    lk_isa isa = lk_isa_current();
    lk_set_isa(LK_ISA_REF);
    run_rope(&c2);
    lk_set_isa(isa);
    double err = 0;
    for (int i = 0; bench_use_variant(i); i++) {
        memcpy(b1, buf, (size_t)n * es);
        run_rope(&c1);
        double e = bench_max_err(b1, b2, dt, n);
        if (e > err) err = e;
    }
    double ms = bench_time_bw(run_rope, &c);
    double bytes = (double)T * (double)rot *
                   (2.0 * (double)(q.shape[1] + k.shape[1]) * (double)es + (double)es);
    bench_row(neox ? "rotary (neox)" : "rotary (gptj)", label, lk_dtype_name(dt), ms, bytes,
              BENCH_BW, err);
    bench_free(b1), bench_free(b2), bench_free(cache), bench_free(pos);
}

/* separate contiguous q [T, Hq, D] and k [T, Hk, D] in one allocation */
static void contiguous_case(const char *model, int64_t T, int64_t Hq, int64_t Hk, int64_t D,
                            lk_dtype dt, int neox) {
    int64_t nq = T * Hq * D, n = nq + T * Hk * D;
    void *buf = bench_alloc(dt, n, -2, 2);
    lk_tensor q = lk_tensor_make(buf, dt, 3, (int64_t[]){T, Hq, D});
    lk_tensor k = lk_tensor_make((char *)buf + nq * (int64_t)lk_dtype_size(dt), dt, 3,
                                 (int64_t[]){T, Hk, D});
    char label[64];
    snprintf(label, sizeof label, "%s T=%lld q%lld+k%lld x%lld", model, (long long)T,
             (long long)Hq, (long long)Hk, (long long)D);
    one_case(label, buf, n, q, k, D, neox);
    bench_free(buf);
}

/* Llama-3-8B: q, k as slices of qkv[T, (32 + 8 + 8) * 128] */
static void llama_qkv_case(int64_t T, lk_dtype dt) {
    int64_t W = 48 * 128, n = T * W;
    void *buf = bench_alloc(dt, n, -2, 2);
    size_t es = lk_dtype_size(dt);
    lk_tensor q = {buf, dt, 3, {T, 32, 128}, {W, 128, 1}};
    lk_tensor k = {(char *)buf + 32 * 128 * es, dt, 3, {T, 8, 128}, {W, 128, 1}};
    char label[64];
    snprintf(label, sizeof label, "L3-8B T=%lld qkv slices", (long long)T);
    one_case(label, buf, n, q, k, 128, 1);
    bench_free(buf);
}

/* DeepSeek-V2-Lite: q_pe = q[T, 16, 192][..., 128:192], k_pe = kv_a[T, 576][:, 512:576]
 * (one allocation: q first, then kv_a) */
static void dsv2_slices_case(int64_t T, lk_dtype dt) {
    int64_t nq = T * 16 * 192, n = nq + T * 576;
    void *buf = bench_alloc(dt, n, -2, 2);
    size_t es = lk_dtype_size(dt);
    lk_tensor q = {(char *)buf + 128 * es, dt, 3, {T, 16, 64}, {16 * 192, 192, 1}};
    lk_tensor k = {(char *)buf + (nq + 512) * (int64_t)es, dt, 3, {T, 1, 64}, {576, 64, 1}};
    char label[64];
    snprintf(label, sizeof label, "DSV2L T=%lld q_pe/k_pe slices", (long long)T);
    one_case(label, buf, n, q, k, 64, 0);
    bench_free(buf);
}

void bench_rotary(void) {
    bench_section("rotary_embedding (bandwidth-bound; ceiling = copy bandwidth)");
    const int64_t tokens[] = {1, 16, 4096};
    const lk_dtype dts[] = {LK_BF16, LK_F32};
    for (int d = 0; d < 2; d++)
        for (int t = 0; t < 3; t++) contiguous_case("L3-8B", tokens[t], 32, 8, 128, dts[d], 1);
    for (int d = 0; d < 2; d++) llama_qkv_case(4096, dts[d]);
    for (int d = 0; d < 2; d++)
        for (int t = 0; t < 3; t++) contiguous_case("DSV2L", tokens[t], 16, 1, 64, dts[d], 0);
    for (int d = 0; d < 2; d++) dsv2_slices_case(4096, dts[d]);
}
