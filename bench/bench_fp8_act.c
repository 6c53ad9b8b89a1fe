/*
 * fp8 activations at LLM shapes (prefill 4096 tokens x hidden 4096, Llama-3-8B, and a
 * decode batch of 16 tokens, whose data stay in cache; the merge at llama3 32 heads x
 * 128): bf16 inputs to e4m3 outputs. One row per op:
 * static / dynamic per-tensor / dynamic per-token scaled_fp8_quant, rms_norm +
 * static quant, fused_add_rms_norm + static quant, rms_norm + dynamic per-token quant,
 * merge_attn_states into fp8; per_token_group_fp8_quant at DeepSeek-V3's hidden size (7168,
 * groups of 128, column-major scales as vLLM allocates them for DeepGEMM; 4096 and 16
 * tokens; f32 scales and UE8M0 ones; int8 codes) and rms_norm_per_block_quant on the same shape (bf16
 * weight, no residual); static_group_scaled_fp8_quant with per-channel
 * scales ([1, 4096]) and 128 x 128 blocks ([32, 32]) on 4096 x 4096; and the int8 quantizers (scaled_int8_quant: static and
 * dynamic per-token, symmetric and with a zero point, bf16 to i8; error: max
 * |code - ref| / (1 + |ref|)); silu_and_mul_quant (static, Llama-3-8B's MLP: [T, 2 x 14336])
 * and silu_and_mul_per_block_quant (DeepSeek-V3's expert MLP: [T, 2 x 2048], groups of 128,
 * column-major scales; e4m3 and i8 out). Bytes: what the op must move once (inputs read, outputs
 * written: a per-tensor dynamic scale reads the input twice but counts it once), set
 * against the read bandwidth probe. Error: max |out - ref| / (1 + |ref|) of the
 * dequantized codes against the reference kernel (0: bit-identical).
 * With --lib every build's kernels are timed (bench_api.h's optional functions: the rows
 * are skipped when a build lacks them), errors against the first build's reference.
 */
#include <stdio.h>
#include <string.h>

#include "bench.h"

enum { Q_STATIC, Q_TENSOR, Q_TOKEN, N_STATIC, N_FUSED, N_TOKEN, M_FP8, NQ };
static const char *QN[NQ] = {"static_scaled_fp8_quant", "dynamic_scaled_fp8_quant",
                             "dynamic_per_token_scaled_fp8_quant", "rms_norm_static_fp8_quant",
                             "fused_add_rms_norm_static_fp8_quant", "rms_norm_dynamic_per_token_quant",
                             "merge_attn_states_scaled"};

typedef struct {
    int op;
    lk_tensor out, x, w, res, scale, scales, b, la, lb;
} q_ctx;

static void run_q(void *p) {
    q_ctx *c = p;
    switch (c->op) {
    case Q_STATIC: (void)lk_static_scaled_fp8_quant(&c->out, &c->x, &c->scale); break;
    case Q_TENSOR: (void)lk_dynamic_scaled_fp8_quant(&c->out, &c->x, &c->scale); break;
    case Q_TOKEN: (void)lk_dynamic_per_token_scaled_fp8_quant(&c->out, &c->x, &c->scales, NULL); break;
    case N_STATIC: (void)lk_rms_norm_static_fp8_quant(&c->out, &c->x, &c->w, &c->scale, 1e-6f); break;
    /* in place on the residual: repeated calls add x each time (values stay bounded for
     * the few hundred calls of a row: |residual| grows linearly) */
    case N_FUSED:
        (void)lk_fused_add_rms_norm_static_fp8_quant(&c->out, &c->x, &c->res, &c->w, &c->scale, 1e-6f);
        break;
    case N_TOKEN: (void)lk_rms_norm_dynamic_per_token_quant(&c->out, &c->x, &c->w, &c->scales, 1e-6f, NULL, NULL); break;
    default: (void)lk_merge_attn_states_scaled(&c->out, NULL, &c->x, &c->la, &c->b, &c->lb, &c->scale); break;
    }
}

static void one_case(int op, int64_t T) {
    int64_t D = 4096, H = 32, HD = 128, n = T * D;
    q_ctx c;
    c.op = op;
    float scale = op == M_FP8 ? 0.01f : 0.02f;
    float *sc = bench_alloc(LK_F32, T, 0, 0);
    void *x = bench_alloc(LK_BF16, n, -3, 3), *out = bench_alloc(LK_F8E4M3, n, 0, 0), *ref = bench_alloc(LK_F8E4M3, n, 0, 0);
    void *w = bench_alloc(LK_BF16, D, 0.5, 1.5), *res = bench_alloc(LK_BF16, n, -1, 1);
    void *b = bench_alloc(LK_BF16, n + 1, -3, 3), *la = bench_alloc(LK_F32, T * H, -3, 3), *lb = bench_alloc(LK_F32, T * H + 1, -3, 3);
    int64_t s2[2] = {T, D}, s3[3] = {T, H, HD};
    int nd = op == M_FP8 ? 3 : 2;
    const int64_t *sh = op == M_FP8 ? s3 : s2;
    c.out = lk_tensor_make(out, LK_F8E4M3, nd, sh);
    c.x = lk_tensor_make(x, LK_BF16, nd, sh);
    c.b = lk_tensor_make(b, LK_BF16, 3, s3);
    c.la = lk_tensor_make(la, LK_F32, 2, (int64_t[]){T, H});
    c.lb = lk_tensor_make(lb, LK_F32, 2, (int64_t[]){T, H});
    c.w = lk_tensor_make(w, LK_BF16, 1, &D);
    c.res = lk_tensor_make(res, LK_BF16, 2, s2);
    c.scale = lk_tensor_make(op == Q_TENSOR ? sc : &scale, LK_F32, 1, (int64_t[]){1});
    c.scales = lk_tensor_make(sc, LK_F32, 1, &T);
    double ms = bench_time(run_q, &c);
    /* error of every variant against the first build's reference kernel on the same
     * inputs (the fused op from a fresh residual each time: the timing loop changed it) */
    void *res0 = bench_alloc(LK_BF16, n, -1, 1);
    q_ctx r = c;
    r.out = lk_tensor_make(ref, LK_F8E4M3, nd, sh);
    lk_isa isa = lk_isa_current();
    if (op == N_FUSED) memcpy(res, res0, (size_t)n * 2);
    lk_set_isa(LK_ISA_REF);
    run_q(&r);
    lk_set_isa(isa);
    double err = 0;
    for (int i = 0; bench_use_variant(i); i++) {
        if (op == N_FUSED) memcpy(res, res0, (size_t)n * 2);
        run_q(&c);
        double e = bench_max_err(out, ref, LK_F8E4M3, n);
        if (e > err) err = e;
    }
    double bytes = (double)n * (2 + 1);
    if (op == N_FUSED) bytes += (double)n * 2 * 2;
    if (op == M_FP8) bytes += (double)n * 2 + (double)T * H * 2 * 4;
    char shp[64];
    if (op == M_FP8) snprintf(shp, sizeof shp, "llama3 T=%lld %lldx%lld", (long long)T, (long long)H, (long long)HD);
    else snprintf(shp, sizeof shp, "%lld x %lld", (long long)T, (long long)D);
    bench_row(QN[op], shp, "bf16->e4m3", ms, bytes, BENCH_READ_BW, err);
    bench_free(sc), bench_free(x), bench_free(out), bench_free(ref), bench_free(w), bench_free(res), bench_free(res0);
    bench_free(b), bench_free(la), bench_free(lb);
}

/* ---- per_token_group_fp8_quant: [T, 7168] bf16 -> e4m3, groups of 128 ---- */

typedef struct {
    int ue8m0, norm;
    lk_tensor out, x, scales, w;
} g_ctx;

static void run_g(void *p) {
    g_ctx *c = p;
    if (c->norm) (void)lk_rms_norm_per_block_quant(&c->out, &c->x, &c->w, &c->scales, 1e-6f, NULL, NULL, 128);
    else (void)lk_per_token_group_fp8_quant(&c->out, &c->x, &c->scales, 128, 1e-10f, c->ue8m0);
}

/* norm: rms_norm_per_block_quant (ue8m0 unused); od: e4m3, or i8 (vLLM's
 * per_token_group_quant_int8) */
static void group_case(int64_t T, int ue8m0, int norm, lk_dtype od) {
    int64_t D = 7168, G = 128, n = T * D, s2[2] = {T, D};
    void *x = bench_alloc(LK_BF16, n, -3, 3), *out = bench_alloc(od, n, 0, 0), *ref = bench_alloc(od, n, 0, 0);
    float *sc = bench_alloc(LK_F32, T * (D / G), 0, 0), *rsc = bench_alloc(LK_F32, T * (D / G), 0, 0);
    void *w = bench_alloc(LK_BF16, D, 0.5, 1.5);
    g_ctx c = {.ue8m0 = ue8m0, .norm = norm};
    c.w = lk_tensor_make(w, LK_BF16, 1, &D);
    c.out = lk_tensor_make(out, od, 2, s2);
    c.x = lk_tensor_make(x, LK_BF16, 2, s2);
    /* column-major: the [T, D / G] view of a [D / G, T] buffer */
    c.scales = (lk_tensor){sc, LK_F32, 2, {T, D / G}, {1, T}};
    double ms = bench_time(run_g, &c);
    g_ctx r = c;
    r.out = lk_tensor_make(ref, od, 2, s2);
    r.scales.data = rsc;
    lk_isa isa = lk_isa_current();
    lk_set_isa(LK_ISA_REF);
    run_g(&r);
    lk_set_isa(isa);
    double err = 0;
    for (int v = 0; bench_use_variant(v); v++) {
        run_g(&c);
        double e = bench_max_err(out, ref, od, n), es = bench_max_err(sc, rsc, LK_F32, T * (D / G));
        if (e > err) err = e;
        if (es > err) err = es;
    }
    char shp[64];
    snprintf(shp, sizeof shp, "%lld x %lld g%lld%s", (long long)T, (long long)D, (long long)G, ue8m0 ? " ue8m0" : "");
    bench_row(norm ? "rms_norm_per_block_quant" : "per_token_group_fp8_quant", shp,
              od == LK_I8 ? "bf16->i8" : "bf16->e4m3", ms,
              (double)n * (2 + 1) + (double)T * (D / G) * 4, BENCH_READ_BW, err);
    bench_free(x), bench_free(out), bench_free(ref), bench_free(sc), bench_free(rsc), bench_free(w);
}

/* ---- static_group_scaled_fp8_quant: [4096, 4096] bf16 -> e4m3, a grid of given scales ---- */

typedef struct {
    lk_tensor out, x, scale;
} sg_ctx;

static void run_sg(void *p) {
    sg_ctx *c = p;
    (void)lk_static_group_scaled_fp8_quant(&c->out, &c->x, &c->scale);
}

static void grid_case(int64_t sm, int64_t sn) {
    int64_t T = 4096, D = 4096, n = T * D, s2[2] = {T, D};
    void *x = bench_alloc(LK_BF16, n, -3, 3), *out = bench_alloc(LK_F8E4M3, n, 0, 0), *ref = bench_alloc(LK_F8E4M3, n, 0, 0);
    float *sc = bench_alloc(LK_F32, sm * sn, 0.01, 0.03);
    sg_ctx c;
    c.out = lk_tensor_make(out, LK_F8E4M3, 2, s2);
    c.x = lk_tensor_make(x, LK_BF16, 2, s2);
    c.scale = lk_tensor_make(sc, LK_F32, 2, (int64_t[]){sm, sn});
    double ms = bench_time(run_sg, &c);
    sg_ctx r = c;
    r.out = lk_tensor_make(ref, LK_F8E4M3, 2, s2);
    lk_isa isa = lk_isa_current();
    lk_set_isa(LK_ISA_REF);
    run_sg(&r);
    lk_set_isa(isa);
    double err = 0;
    for (int v = 0; bench_use_variant(v); v++) {
        run_sg(&c);
        double e = bench_max_err(out, ref, LK_F8E4M3, n);
        if (e > err) err = e;
    }
    char shp[64];
    snprintf(shp, sizeof shp, "%lld x %lld s[%lld,%lld]", (long long)T, (long long)D, (long long)sm, (long long)sn);
    bench_row("static_group_scaled_fp8_quant", shp, "bf16->e4m3", ms, (double)n * (2 + 1) + (double)sm * sn * 4,
              BENCH_READ_BW, err);
    bench_free(x), bench_free(out), bench_free(ref), bench_free(sc);
}

/* ---- int8: scaled_int8_quant's two ops, symmetric and with a zero point ---- */

typedef struct {
    int dynamic, asym;
    lk_tensor out, x, scale, azp, scales, azps;
} i8_ctx;

static void run_i8(void *p) {
    i8_ctx *c = p;
    if (c->dynamic) (void)lk_dynamic_scaled_int8_quant(&c->out, &c->x, &c->scales, c->asym ? &c->azps : NULL);
    else (void)lk_static_scaled_int8_quant(&c->out, &c->x, &c->scale, c->asym ? &c->azp : NULL);
}

static void int8_case(int dynamic, int asym) {
    int64_t T = 4096, D = 4096, n = T * D, s2[2] = {T, D};
    float scale = 0.025f;
    int32_t azp = 3;
    /* int8 buffers allocated as 1-byte fp8 (zero-filled), viewed as i8 */
    void *x = bench_alloc(LK_BF16, n, -3, 3), *out = bench_alloc(LK_F8E4M3, n, 0, 0), *ref = bench_alloc(LK_F8E4M3, n, 0, 0);
    float *sc = bench_alloc(LK_F32, T, 0, 0);
    int32_t *zp = bench_alloc(LK_I32, T, 0, 0);
    i8_ctx c = {.dynamic = dynamic, .asym = asym};
    c.out = lk_tensor_make(out, LK_I8, 2, s2);
    c.x = lk_tensor_make(x, LK_BF16, 2, s2);
    c.scale = lk_tensor_make(&scale, LK_F32, 1, (int64_t[]){1});
    c.azp = lk_tensor_make(&azp, LK_I32, 1, (int64_t[]){1});
    c.scales = lk_tensor_make(sc, LK_F32, 2, (int64_t[]){T, 1});
    c.azps = lk_tensor_make(zp, LK_I32, 2, (int64_t[]){T, 1});
    double ms = bench_time(run_i8, &c);
    i8_ctx r = c;
    r.out = lk_tensor_make(ref, LK_I8, 2, s2);
    lk_isa isa = lk_isa_current();
    lk_set_isa(LK_ISA_REF);
    run_i8(&r);
    lk_set_isa(isa);
    double err = 0;
    for (int v = 0; bench_use_variant(v); v++) {
        run_i8(&c);
        for (int64_t i = 0; i < n; i++) {
            double a = ((const int8_t *)out)[i], b = ((const int8_t *)ref)[i], e = (a > b ? a - b : b - a) / (1.0 + (b < 0 ? -b : b));
            if (e > err) err = e;
        }
    }
    double bytes = (double)n * (2 + 1) + (dynamic ? (double)T * (asym ? 8 : 4) : 0);
    char shp[64];
    snprintf(shp, sizeof shp, "%lld x %lld", (long long)T, (long long)D);
    bench_row(dynamic ? "dynamic_scaled_int8_quant" : "static_scaled_int8_quant", shp, asym ? "bf16->i8 azp" : "bf16->i8",
              ms, bytes, BENCH_READ_BW, err);
    bench_free(x), bench_free(out), bench_free(ref), bench_free(sc), bench_free(zp);
}

/* ---- silu_and_mul + quant: static e4m3 at [T, 2 x 14336], per block at [T, 2 x 2048] ---- */

typedef struct {
    int block;
    lk_tensor out, x, scale, scales;
} aq_ctx;

static void run_aq(void *p) {
    aq_ctx *c = p;
    if (c->block) (void)lk_silu_and_mul_per_block_quant(&c->out, &c->x, &c->scales, NULL, 128);
    else (void)lk_silu_and_mul_quant(&c->out, &c->x, &c->scale);
}

static void act_quant_case(int64_t T, int block, lk_dtype od) {
    int64_t d = block ? 2048 : 14336, G = 128, n = T * d, sx[2] = {T, 2 * d}, so[2] = {T, d}, ng = block ? d / G : 1;
    void *x = bench_alloc(LK_BF16, 2 * n, -4, 4), *out = bench_alloc(od, n, 0, 0), *ref = bench_alloc(od, n, 0, 0);
    float *sc = bench_alloc(LK_F32, T * ng, 0, 0), *rsc = bench_alloc(LK_F32, T * ng, 0, 0), scale = 0.02f;
    aq_ctx c = {.block = block};
    c.x = lk_tensor_make(x, LK_BF16, 2, sx);
    c.out = lk_tensor_make(out, od, 2, so);
    c.scale = (lk_tensor){&scale, LK_F32, 1, {1}, {1}};
    c.scales = (lk_tensor){sc, LK_F32, 2, {T, ng}, {1, T}}; /* column-major: vLLM's transposed scales */
    double ms = bench_time(run_aq, &c);
    aq_ctx r = c;
    r.out = lk_tensor_make(ref, od, 2, so);
    r.scales.data = rsc;
    lk_isa isa = lk_isa_current();
    lk_set_isa(LK_ISA_REF);
    run_aq(&r);
    lk_set_isa(isa);
    double err = 0;
    for (int v = 0; bench_use_variant(v); v++) {
        run_aq(&c);
        double e = bench_max_err(out, ref, od, n), es = block ? bench_max_err(sc, rsc, LK_F32, T * ng) : 0;
        if (e > err) err = e;
        if (es > err) err = es;
    }
    char shp[64], dts[32];
    snprintf(shp, sizeof shp, "%lld x %lld%s", (long long)T, (long long)d, block ? " g128" : "");
    snprintf(dts, sizeof dts, "bf16->%s", od == LK_I8 ? "i8" : "e4m3");
    bench_row(block ? "silu_and_mul_per_block_quant" : "silu_and_mul_quant", shp, dts, ms,
              (double)n * (2 * 2 + 1) + (block ? (double)T * ng * 4 : 0), BENCH_READ_BW, err);
    bench_free(x), bench_free(out), bench_free(ref), bench_free(sc), bench_free(rsc);
}

void bench_fp8_act(void) {
    bench_section("fp8 activations (bandwidth-bound; ceiling = read bandwidth)");
    if (bench_libs_have("lk_static_scaled_fp8_quant", "the fp8 rows"))
        for (int64_t T = 4096; T >= 16; T /= 256) /* prefill; a decode batch (in cache) */
            for (int op = 0; op < NQ; op++) one_case(op, T);
    if (bench_libs_have("lk_per_token_group_fp8_quant", "the per-token-group rows"))
        for (int64_t T = 4096; T >= 16; T /= 256)
            for (int k = 0; k < 3; k++)
                if (k < 2 || bench_libs_have("lk_rms_norm_per_block_quant", "the per-block norm rows"))
                    group_case(T, k == 1, k == 2, LK_F8E4M3);
    if (bench_libs_have("lk_silu_and_mul_per_block_quant", "the per-token-group int8 rows")) /* since the same release */
        for (int64_t T = 4096; T >= 16; T /= 256) group_case(T, 0, 0, LK_I8);
    if (bench_libs_have("lk_static_group_scaled_fp8_quant", "the static grid rows"))
        grid_case(1, 4096), grid_case(32, 32);
    if (bench_libs_have("lk_static_scaled_int8_quant", "the int8 rows"))
        for (int k = 0; k < 4; k++) int8_case(k >> 1, k & 1);
    if (bench_libs_have("lk_silu_and_mul_per_block_quant", "the silu_and_mul + quant rows"))
        for (int64_t T = 4096; T >= 16; T /= 256)
            act_quant_case(T, 0, LK_F8E4M3), act_quant_case(T, 1, LK_F8E4M3), act_quant_case(T, 1, LK_I8);
}
