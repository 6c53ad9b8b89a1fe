/*
 * MLA prefix prefill, the driver: the kernel table's mla_prefix_prefill entry, run on
 * the arguments src/ops/mla_prefill.c validated (a->ws unset; the driver owns the
 * workspace of the call).
 *
 *   plan     the projection plan of the whole batch (lk_mla_plan_build with the batch's
 *            group size g): its unique pages feed the cost model and the trace
 *   choose   strategy = the forced one, or lk_mla_choose (cost.c) on the shape; split_merge
 *            and concat hand inputs with an inf or NaN in q, k or a used cache entry to
 *            fused (inputs_nonfinite: the contract for keys of weight 0)
 *   weights  the GEMM operands of the strategy (lk_mla_weights): kv_b_proj as it is where
 *            a GEMM takes it (bf16 or f32), else one f32 copy for the call
 *   waves    requests in waves of consecutive requests, each run by the strategy as
 *            its own batch with its own plan (same g), the workspace reused
 *   padding  out rows outside [cu_q[0], cu_q[B]) set to 0
 * Trace items (src/core/trace.h): "strategy=<name> (auto; model ms: ...)" or
 * "(forced)", "plan requests=.. tokens=.. groups=../.. pages=.. g=.. dedup=.. waves=..",
 * the strategy's ops of the first wave, and "waves=<n> (ops listed for the first)"
 * when there are several. Work split: inside the strategies; waves run one after the
 * other.
 */
#include <stdlib.h>
#include <string.h>

#include "cost.h"
#include "mla.h"

const char *lk_mla_strategy_name(lk_mla_strategy s) {
    switch (s) {
    case LK_MLA_AUTO: return "auto";
    case LK_MLA_SPLIT_MERGE: return "split_merge";
    case LK_MLA_CONCAT: return "concat";
    case LK_MLA_FUSED: return "fused";
    case LK_MLA_ABSORBED: return "absorbed";
    }
    return "unknown";
}

/* ---------------------------------------------------------------- waves */

/* Requests run in waves of consecutive requests whose projected prefix (G + Kp + Vp,
 * logical rows, so the same with or without dedup) fits wave_bytes (a wave holds one
 * request at least): scratch stays bounded (and below glibc's 32 MiB mmap ceiling, so
 * it is recycled between calls instead of page-faulted in again) and mostly in the L3.
 * A wave is a sub-batch of exact token rows (no padding rows): the strategies run on it
 * unchanged; padding rows are zeroed once at the end. Per-request results do not depend
 * on the waves (the projection group size g is the whole batch's). The budget is
 * process-wide; tests set it through mla_test.h. */
#define WAVE_BYTES_DEFAULT ((int64_t)24 << 20)
static int64_t wave_bytes = WAVE_BYTES_DEFAULT;

void lk_mla_set_wave_bytes(int64_t bytes) { wave_bytes = bytes > 0 ? bytes : WAVE_BYTES_DEFAULT; }

static lk_tensor rows_of(const lk_tensor *t, int64_t r0, int64_t n) {
    lk_tensor v = *t;
    v.data = lk_at(t, r0 * t->stride[0]);
    v.shape[0] = n;
    return v;
}

/* Count the waves (status NULL) or run them with strategy st (*status: the first
 * failure, or LK_OK); returns the number of waves, -1 when out of memory. */
static int64_t run_waves(const lk_mla_args *a, lk_mla_strategy st, int64_t g, lk_status *status) {
    int64_t B = a->B, bs = a->lat.block_size, waves = 0;
    int64_t row_bytes = 4 * (a->Dl + a->Dr + a->H * (a->Dn + a->Dr + a->Dv));
    int32_t *cu = status ? malloc(sizeof(int32_t) * (size_t)(B + 1)) : NULL; /* [wave's B + 1] */
    if (status && !cu) return -1;
    lk_status s = LK_OK;
    for (int64_t b = 0, b1; b < B && s == LK_OK; b = b1, waves++) {
        int64_t bytes = 0;
        for (b1 = b; b1 < B; b1++) {
            int64_t rb = a->cu_q[b1 + 1] > a->cu_q[b1] ? (a->prefix[b1] + bs - 1) / bs * bs * row_bytes : 0;
            if (b1 > b && bytes + rb > wave_bytes) break;
            bytes += rb;
        }
        if (!status) continue;
        lk_mla_args w = *a;
        int64_t base = a->cu_q[b];
        w.B = b1 - b, w.T = a->cu_q[b1] - base;
        for (int64_t i = 0; i <= w.B; i++) cu[i] = a->cu_q[b + i] - (int32_t)base;
        w.cu_q = cu, w.prefix = a->prefix + b, w.table = a->table + b * a->max_pages;
        /* a wave without tokens may start at row T (past the views): no row views then,
         * base * stride[0] is only bounded for base < T */
        if (w.T == 0) continue;
        w.out = rows_of(&a->out, base, w.T), w.q = rows_of(&a->q, base, w.T);
        w.k = rows_of(&a->k, base, w.T), w.v = rows_of(&a->v, base, w.T);
        lk_mla_plan p;
        if ((s = lk_mla_plan_build(&w, g, &p))) break;
        s = st == LK_MLA_SPLIT_MERGE ? lk_mla_split_merge(&w, &p)
            : st == LK_MLA_CONCAT    ? lk_mla_concat(&w, &p)
            : st == LK_MLA_FUSED     ? lk_mla_fused(&w, &p)
                                     : lk_mla_absorbed(&w, &p);
        lk_mla_plan_free(&p);
        lk_trace_mute(1);
    }
    lk_trace_mute(0);
    free(cu);
    if (status) *status = s;
    return waves;
}

/* ---------------------------------------------------------------- special values */

/* 1 if an inf or NaN is in a row of t [T, H, D] of the batch's tokens */
static int rows_nonfinite(const lk_mla_args *a, const lk_tensor *t) {
    const char *base = t->data;
    int64_t es = (int64_t)lk_dtype_size(t->dtype);
    for (int64_t i = a->cu_q[0]; i < a->cu_q[a->B]; i++)
        for (int64_t h = 0; h < a->H; h++)
            if (lk_mla_span_nonfinite(base + (i * t->stride[0] + h * t->stride[1]) * es, t->dtype, t->shape[2], t->stride[2]))
                return 1;
    return 0;
}

/* 1 if an inf or NaN is in the D dims of slot `slot` of page `page` of cache c */
static int entry_nonfinite(const lk_paged *c, int64_t page, int64_t slot) {
    int64_t es = (int64_t)lk_dtype_size(c->dtype), step = c->layout == LK_KV_NZ ? c->tile : c->D;
    for (int64_t d = 0; d < c->D; d += step)
        if (lk_mla_span_nonfinite((const char *)c->data + lk_paged_off(c, page, slot, 0, d) * es, c->dtype,
                           c->D - d < step ? c->D - d : step, c->s3))
            return 1;
    return 0;
}

/* 1 if q, k or a used cache entry holds an inf or NaN: then a score can be -inf (or the
 * cache's values infinite) with a non-finite value in its key's V. The contract lets no
 * value of a key of weight 0 reach a row; fused and absorbed skip such keys in P V, the
 * flash_attn kernels under split_merge and concat would multiply 0 by it. */
static int inputs_nonfinite(const lk_mla_args *a) {
    if (rows_nonfinite(a, &a->q) || rows_nonfinite(a, &a->k)) return 1;
    int64_t bs = a->lat.block_size;
    for (int64_t b = 0; b < a->B; b++)
        for (int64_t j = 0; j < a->prefix[b]; j++) {
            int64_t page = a->table[b * a->max_pages + j / bs];
            if (entry_nonfinite(&a->lat, page, j % bs) || (!a->one_buffer && entry_nonfinite(&a->rope, page, j % bs)))
                return 1;
        }
    return 0;
}

/* ---------------------------------------------------------------- entry */

lk_status lk_mla_prefill_drive(const lk_mla_args *in, lk_mla_strategy strategy) {
    lk_mla_args a = *in;
    lk_mla_ws ws;
    memset(&ws, 0, sizeof ws);
    a.ws = &ws;
    int64_t g = lk_mla_plan_g(&a);
    lk_mla_plan plan;
    float *w_owned[2] = {NULL, NULL};
    int32_t *q_len = malloc(sizeof(int32_t) * (size_t)(a.B + 1)); /* [B] */
    lk_status s = q_len ? lk_mla_plan_build(&a, g, &plan) : LK_ERR_NOMEM;
    if (s) {
        free(q_len);
        return lk_fail(s, "out of memory for the projection plan");
    }
    for (int64_t b = 0; b < a.B; b++) q_len[b] = a.cu_q[b + 1] - a.cu_q[b];
    lk_mla_shape shape = {a.B, a.H, a.Dn, a.Dr, a.Dv, a.Dl, plan.bs, q_len, a.prefix, plan.pages * plan.bs,
                          lk_mla_proj_bf16(&a), lk_mla_lat_bf16(&a),
                          lk_mla_cur_bf16(&a), 0};
    if (lk_is_fp8(a.lat.dtype)) shape.f8_dims += a.one_buffer ? a.Dl + a.Dr : a.Dl;
    if (!a.one_buffer && lk_is_fp8(a.rope.dtype)) shape.f8_dims += a.Dr;
    double cost[5];
    lk_mla_strategy chosen = lk_mla_choose(&shape, cost), st = strategy;
    free(q_len);
    if (st == LK_MLA_AUTO) {
        st = chosen;
        lk_trace_item("strategy=%s (auto; model ms: split_merge %.3f, concat %.3f, fused %.3f, absorbed %.3f)",
                      lk_mla_strategy_name(st), 1e3 * cost[1], 1e3 * cost[2], 1e3 * cost[3], 1e3 * cost[4]);
    } else {
        lk_trace_item("strategy=%s (forced)", lk_mla_strategy_name(st));
    }
    if ((st == LK_MLA_SPLIT_MERGE || st == LK_MLA_CONCAT) && inputs_nonfinite(&a)) {
        lk_trace_item("fused instead: inf or NaN in q, k or the cache (see docs/numerics.md)");
        st = LK_MLA_FUSED;
    }
    if ((s = lk_mla_weights(&a, st, w_owned))) {
        lk_mla_plan_free(&plan);
        free(w_owned[0]), free(w_owned[1]);
        return lk_fail(s, "out of memory for the f32 copy of kv_b_proj");
    }
    int64_t waves = run_waves(&a, st, g, NULL);
    lk_trace_item("plan requests=%lld tokens=%d groups=%lld/%lld pages=%lld g=%lld dedup=%d waves=%lld",
                  (long long)a.B, a.cu_q[a.B] - a.cu_q[0], (long long)plan.n_groups, (long long)plan.n_logical,
                  (long long)plan.pages, (long long)plan.g, a.dedup, (long long)waves);
    lk_mla_plan_free(&plan);
    if (run_waves(&a, st, g, &s) < 0) s = LK_ERR_NOMEM;
    if (!s) {
        lk_mla_zero_padding(&a);
        if (waves > 1) lk_trace_item("waves=%lld (ops listed for the first)", (long long)waves);
    }
    free(w_owned[0]), free(w_owned[1]);
    lk_mla_ws_free(&ws);
    if (s == LK_ERR_UNSUPPORTED) return lk_fail(s, "oneDNN failed in a GEMM of the MLA prefill");
    return s;
}
