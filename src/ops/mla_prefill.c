/*
 * Public entry lk_mla_prefix_prefill: validation of every argument before any store
 * (shapes, dtypes, overlaps, index values), the projection plan, the strategy choice
 * (forced or by the cost model below), the strategy trace, then the strategy
 * (src/cpu/mla/). Contract in include/llmkern.h; maths in src/cpu/mla/.
 *
 *   out[t, h] = sum_j softmax_j(scale * q[t, h] . key_j) value_j over the request's
 *   [prefix | current] keys, bottom-right causal (query i sees prefix keys and current
 *   keys j <= i), with prefix key_j = [W_UK_h c_j | k_pe_j], value_j = W_UV_h c_j.
 */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../core/half.h"
#include "../cpu/mla/mla.h"

/* ---------------------------------------------------------------- trace */

/* Each item ends with the wall time since the previous item (or the call's start),
 * which is the time of the op it names: items are appended when their op is done. */
static _Thread_local char trace_buf[2048];
static _Thread_local size_t trace_len;
static _Thread_local double trace_t;
static _Thread_local int trace_mute; /* waves after the first: ops not listed again */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void trace_reset(void) {
    trace_buf[0] = 0;
    trace_len = 0;
    trace_t = now_s();
}

static void trace_append(const char *fmt, ...) {
    size_t cap = sizeof trace_buf;
    if (trace_len + 1 >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(trace_buf + trace_len, cap - trace_len, fmt, ap);
    va_end(ap);
    if (n > 0) trace_len += (size_t)n < cap - trace_len ? (size_t)n : cap - 1 - trace_len;
}

void lk_mla_trace(const char *fmt, ...) {
    char item[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(item, sizeof item, fmt, ap);
    va_end(ap);
    double t = now_s();
    if (!trace_mute) trace_append("%s%s [%.3f ms]", trace_len ? "; " : "", item, 1e3 * (t - trace_t));
    trace_t = t;
}

const char *lk_mla_last_trace(void) { return trace_buf; }

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

lk_mla_params lk_mla_params_default(float scale) {
    lk_mla_params p = {scale, LK_MLA_AUTO, LK_KV_ND, 1};
    return p;
}

/* ---------------------------------------------------------------- cost model */

/* Predicted single-thread seconds of each strategy, from the shapes only (never the
 * thread count, so the choice, and with it the bits, cannot depend on it). Every term is
 * FLOPs (2 per multiply-add) over an effective rate, R = the prefix projection's rate
 * (sgemm + scatter), or seconds per element:
 *   gather      6e-10 s per cached element read (rows * (Dl + Dr))
 *   project     2 rows Dl H (Dn + Dv) / R                        (rows = prefix pages * bs)
 *   flash, prefix (split / concat): 2 H (Dqk + Dv) Q P / (0.95 R Q / (Q + 110) c), with
 *     c = min(1, sqrt(24 MB / (P H (Dqk + Dv) 4 bytes))) for the packed K/V leaving the L3
 *   flash, causal current part:     2 H (Dqk + Dv) Q (Q + 1) / 2 / (R Q / (Q + 250))
 *   concat copy 3e-9 s per copied float ((P + Q) H (Dqk + Dv))
 *   engine (fused; absorbed's current keys): 2 H (Dqk + Dv) Q (P + (Q + 64) / 2) /
 *     (0.95 R n / (n + 40)), n = Q (absorbed with a prefix: n = the tokens of one unit,
 *     Q / ceil(Q H / 128)); the causal diagonal goes in 64-key chunks: ~64 / 2 wasted
 *     keys per query
 *   absorbed latent engine: 2 H (2 Dl + Dr) Q P / (1.05 R r / (r + 16)), r = min(Q H, 128)
 *   absorb sgemms (per unit, per head, M = its tokens): 2 T' H (Dn Dl + Dl Dv) / (0.6 R)
 * How measured: every strategy's ops timed through the trace on this machine (AMD EPYC
 * Zen 3, 2 cores, OpenBLAS 0.3.21 Zen kernels), one thread, DeepSeek dims (H = 4 and 16,
 * 192 / 128 / 512, page 128, bf16), 14 shapes Q 50..1024, P 0..8192, B 1..16, strategies
 * interleaved in rounds of 5 and medians taken (the machine is shared: its speed drifts
 * by 2x over minutes, so only ratios within a round are used): R = 58 GFLOP/s then, and
 * each op's rate relative to the projection fitted over the shapes (e.g. flash prefix
 * 0.30 R at Q = 50, 0.45-0.6 R at Q = 100, 0.7 R at 256, 0.86-0.92 R at 1024; the latent
 * engine 0.94-1.10 R everywhere; the engine 0.52 R at Q = 50, 0.7 R at 100, 0.9 R at
 * 256+). With these the model picked the fastest strategy, or one within 5% of it, on 13
 * of the 14 shapes (the miss: 9% at Q = 150, P = 1024, the absorbed / fused crossover). */
static double eng_rate(double R, double n) { return 0.95 * R * n / (n + 40); }

lk_mla_strategy lk_mla_choose(const lk_mla_shape *s, double cost[5]) {
    const double R = 58e9;
    double H = (double)s->H, Dqk = (double)(s->Dn + s->Dr), Dv = (double)s->Dv, Dl = (double)s->Dl;
    double E = Dl + (double)s->Dr, rows = (double)s->unique_rows, pre_flash = 0, cur_flash = 0, fused = 0;
    double absorbed = 0, keys = 0, t_abs = 0;
    for (int64_t b = 0; b < s->B; b++) {
        double Q = s->q_len[b], P = s->prefix[b];
        if (Q <= 0) continue;
        keys += P + Q;
        /* flash packs a request's K/V per head into f32 panels: beyond ~24 MiB they fall
         * out of the L3 (measured: 0.69 R at Q = 1024, P = 8192 against 0.92 R at P = 2048) */
        double slab = P * H * (Dqk + Dv) * 4, cache = slab > 24e6 ? sqrt(24e6 / slab) : 1;
        pre_flash += 2 * H * (Dqk + Dv) * Q * P / (0.95 * R * Q / (Q + 110) * cache);
        cur_flash += 2 * H * (Dqk + Dv) * Q * (Q + 1) / 2 / (R * Q / (Q + 250));
        fused += 2 * H * (Dqk + Dv) * Q * (P + (Q + 64) / 2) / eng_rate(R, Q);
        if (P > 0) {
            double r = Q * H < 128 ? Q * H : 128, na = Q / ceil(Q * H / 128); /* tokens per unit */
            absorbed += 2 * H * (2 * Dl + (double)s->Dr) * Q * P / (1.05 * R * r / (r + 16));
            absorbed += 2 * H * (Dqk + Dv) * Q * (Q + 64) / 2 / eng_rate(R, na);
            t_abs += Q;
        } else {
            absorbed += 2 * H * (Dqk + Dv) * Q * (Q + 64) / 2 / eng_rate(R, Q);
        }
    }
    double gather = rows * E * 6e-10;
    double proj = 2 * rows * Dl * H * (double)(s->Dn + s->Dv) / R;
    absorbed += 2 * t_abs * H * (double)(s->Dn * s->Dl + s->Dl * s->Dv) / (0.6 * R) + (rows > 0 ? gather : 0);
    cost[0] = 0;
    cost[LK_MLA_SPLIT_MERGE] = gather + proj + pre_flash + cur_flash;
    cost[LK_MLA_CONCAT] = gather + proj + keys * H * (Dqk + Dv) * 3e-9 + pre_flash + cur_flash;
    cost[LK_MLA_FUSED] = gather + proj + fused;
    cost[LK_MLA_ABSORBED] = absorbed;
    lk_mla_strategy best = LK_MLA_SPLIT_MERGE;
    for (int i = 2; i < 5; i++)
        if (cost[i] < cost[best]) best = (lk_mla_strategy)i;
    return best;
}

/* ---------------------------------------------------------------- validation */

typedef struct {
    int32_t *cu_q, *prefix, *table, *q_len;
} idx_copies;

static void free_copies(idx_copies *c) {
    free(c->cu_q);
    free(c->prefix);
    free(c->table);
    free(c->q_len);
}

/* contiguous int32 copy of a 1-D or 2-D index view (row-major), values clamped to int32 */
static int32_t *copy_index(const lk_tensor *t) {
    int64_t n = lk_numel(t), cols = t->ndim == 2 ? t->shape[1] : n;
    int32_t *c = malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    if (!c) return NULL;
    for (int64_t i = 0; i < n; i++) {
        int64_t off = t->ndim == 2 ? (i / cols) * t->stride[0] + (i % cols) * t->stride[1] : i * t->stride[0];
        int64_t v = lk_load_index(t->data, t->dtype, off);
        c[i] = v > INT32_MAX ? INT32_MAX : v < INT32_MIN ? INT32_MIN : (int32_t)v;
    }
    return c;
}

static lk_status check_shapes(lk_mla_args *a, const lk_tensor *out, const lk_tensor *q,
                              const lk_tensor *k, const lk_tensor *v, const lk_tensor *cu,
                              const lk_tensor *pl, const lk_tensor *bt, const lk_tensor *w,
                              const lk_mla_params *p) {
    lk_status s;
    if (!p) return lk_fail(LK_ERR_NULL, "params: NULL");
    if (!isfinite(p->scale)) return lk_fail(LK_ERR_VALUE, "params.scale: must be finite, got %g", (double)p->scale);
    if ((int)p->strategy < LK_MLA_AUTO || (int)p->strategy > LK_MLA_ABSORBED)
        return lk_fail(LK_ERR_VALUE, "params.strategy: unknown value %d", (int)p->strategy);
    if (p->cache_layout != LK_KV_ND && p->cache_layout != LK_KV_NZ)
        return lk_fail(LK_ERR_VALUE, "params.cache_layout: unknown value %d", (int)p->cache_layout);
    if ((s = lk_check_float(q, "q", 3, 3)) || (s = lk_check_float(k, "k", 3, 3)) ||
        (s = lk_check_float(v, "v", 3, 3)) || (s = lk_check_float(out, "out", 3, 3)) ||
        (s = lk_check_float(w, "kv_b_proj", 2, 2)))
        return s;
    if ((s = lk_check_index(cu, "cu_seqlens_q", 1, 1)) || (s = lk_check_index(pl, "prefix_lens", 1, 1)) ||
        (s = lk_check_index(bt, "block_table", 2, 2)))
        return s;
    int64_t T = q->shape[0], H = q->shape[1], Dqk = q->shape[2], Dv = v->shape[2];
    if (H < 1) return lk_fail(LK_ERR_SHAPE, "q: shape %s needs at least one head", lk_shape_str(q));
    if ((s = lk_check_same_shape(k, "k", q, "q"))) return s;
    if (v->shape[0] != T || v->shape[1] != H)
        return lk_fail(LK_ERR_SHAPE, "v: shape %s does not match q %s in tokens and heads", lk_shape_str(v),
                       lk_shape_str(q));
    if ((s = lk_check_same_shape(out, "out", v, "v"))) return s;
    if (Dv < 1) return lk_fail(LK_ERR_SHAPE, "v: value dim must be >= 1, shape %s", lk_shape_str(v));
    int64_t rows = w->shape[0], Dl = w->shape[1];
    if (rows % H || rows / H <= Dv)
        return lk_fail(LK_ERR_SHAPE, "kv_b_proj: %lld rows are not %lld heads x (Dn + Dv) with Dn >= 1 (Dv = %lld)",
                       (long long)rows, (long long)H, (long long)Dv);
    int64_t Dn = rows / H - Dv, Dr = Dqk - Dn;
    if (Dr < 1)
        return lk_fail(LK_ERR_SHAPE, "q: head dim %lld must exceed kv_b_proj's nope dim Dn = %lld (rope dims >= 1)",
                       (long long)Dqk, (long long)Dn);
    if (Dl < 1) return lk_fail(LK_ERR_SHAPE, "kv_b_proj: latent dim must be >= 1, shape %s", lk_shape_str(w));
    /* sgemm takes int sizes */
    if (rows > INT_MAX / 2 || H * (Dl + Dr + Dv) > INT_MAX / 2)
        return lk_fail(LK_ERR_OVERFLOW, "kv_b_proj: %lld x %lld is beyond OpenBLAS's int sizes", (long long)rows,
                       (long long)Dl);
    if (cu->shape[0] < 1) return lk_fail(LK_ERR_SHAPE, "cu_seqlens_q: needs B + 1 >= 1 entries");
    int64_t B = cu->shape[0] - 1;
    if (pl->shape[0] != B)
        return lk_fail(LK_ERR_SHAPE, "prefix_lens: shape %s, expected [%lld] (cu_seqlens_q has B + 1 entries)",
                       lk_shape_str(pl), (long long)B);
    if (bt->shape[0] != B)
        return lk_fail(LK_ERR_SHAPE, "block_table: shape %s, expected [%lld, max_pages]", lk_shape_str(bt),
                       (long long)B);
    a->T = T, a->H = H, a->Dn = Dn, a->Dr = Dr, a->Dv = Dv, a->Dl = Dl, a->B = B;
    a->max_pages = bt->shape[1];
    return LK_OK;
}

static lk_status check_cache(lk_mla_args *a, const lk_tensor *kvc, const lk_tensor *kpe, lk_kv_layout lay) {
    lk_status s;
    if (!kvc) return lk_fail(LK_ERR_NULL, "kv_c_cache: tensor pointer is NULL");
    a->one_buffer = kpe == NULL;
    if (a->one_buffer) {
        if ((s = lk_paged_init(&a->lat, kvc, lay, 1, a->Dl + a->Dr, "kv_c_cache"))) return s;
        a->rope = a->lat;
    } else {
        if ((s = lk_paged_init(&a->lat, kvc, lay, 1, a->Dl, "kv_c_cache"))) return s;
        if ((s = lk_paged_init(&a->rope, kpe, lay, 1, a->Dr, "k_pe_cache"))) return s;
        if (a->rope.num_blocks != a->lat.num_blocks || a->rope.block_size != a->lat.block_size)
            return lk_fail(LK_ERR_SHAPE, "k_pe_cache: pages (%lld x %lld) differ from kv_c_cache's (%lld x %lld)",
                           (long long)a->rope.num_blocks, (long long)a->rope.block_size,
                           (long long)a->lat.num_blocks, (long long)a->lat.block_size);
    }
    if (a->lat.block_size > INT_MAX / 8)
        return lk_fail(LK_ERR_OVERFLOW, "kv_c_cache: block_size %lld is beyond OpenBLAS's int sizes",
                       (long long)a->lat.block_size);
    /* an empty cache may have block_size 0 ([0, 0, E] is valid): no page exists, and 1
     * keeps the page counts ceil(prefix_lens / block_size) defined */
    if (a->lat.block_size < 1) a->lat.block_size = a->rope.block_size = 1;
    return LK_OK;
}

static lk_status check_overlaps(const lk_tensor *out, const lk_tensor *const *in, const char *const *names, int n) {
    lk_status s;
    if ((s = lk_check_no_self_overlap(out, "out"))) return s;
    for (int i = 0; i < n; i++)
        if (in[i] && (s = lk_check_disjoint(out, "out", in[i], names[i]))) return s;
    return LK_OK;
}

static lk_status check_values(lk_mla_args *a, idx_copies *cp, const lk_tensor *cu, const lk_tensor *pl,
                              const lk_tensor *bt) {
    int64_t B = a->B, maxp = a->max_pages, bs = a->lat.block_size, nb = a->lat.num_blocks;
    if (!(cp->cu_q = copy_index(cu)) || !(cp->prefix = copy_index(pl)) || !(cp->table = copy_index(bt)) ||
        !(cp->q_len = malloc(sizeof(int32_t) * (size_t)(B + 1))))
        return lk_fail(LK_ERR_NOMEM, "out of memory for index copies");
    for (int64_t i = 0; i <= B; i++) {
        if (cp->cu_q[i] < 0)
            return lk_fail(LK_ERR_INDEX, "cu_seqlens_q: entry %lld is negative (%d)", (long long)i, cp->cu_q[i]);
        if (i && cp->cu_q[i] < cp->cu_q[i - 1])
            return lk_fail(LK_ERR_INDEX, "cu_seqlens_q: not non-decreasing at entry %lld (%d after %d)", (long long)i,
                           cp->cu_q[i], cp->cu_q[i - 1]);
    }
    if (cp->cu_q[B] > a->T)
        return lk_fail(LK_ERR_INDEX, "cu_seqlens_q: last entry %d exceeds the %lld tokens of q", cp->cu_q[B],
                       (long long)a->T);
    int64_t cap = bs > 0 && maxp > INT32_MAX / bs ? INT32_MAX : maxp * bs, keys = 0;
    for (int64_t b = 0; b < B; b++) {
        int64_t P = cp->prefix[b];
        cp->q_len[b] = cp->cu_q[b + 1] - cp->cu_q[b];
        if (P < 0 || P > cap)
            return lk_fail(LK_ERR_INDEX,
                           "prefix_lens: request %lld has %lld prefix tokens, block_table holds %lld (%lld pages of %lld)",
                           (long long)b, (long long)P, (long long)cap, (long long)maxp, (long long)bs);
        keys += P + cp->q_len[b];
        for (int64_t j = 0; j < (P + bs - 1) / bs; j++) {
            int32_t pg = cp->table[b * maxp + j];
            if (pg < 0 || pg >= nb)
                return lk_fail(LK_ERR_INDEX, "block_table: entry [%lld, %lld] = %d outside [0, %lld)", (long long)b,
                               (long long)j, pg, (long long)nb);
        }
    }
    if (keys > INT32_MAX)
        return lk_fail(LK_ERR_OVERFLOW, "prefix_lens: %lld keys in the batch exceed int32 offsets", (long long)keys);
    a->cu_q = cp->cu_q, a->prefix = cp->prefix, a->table = cp->table;
    return LK_OK;
}

/* ---------------------------------------------------------------- waves */

/* Requests run in waves of consecutive requests whose projected prefix (G + Kp + Vp,
 * logical rows, so the same with or without dedup) fits wave_bytes (a wave holds one
 * request at least): scratch stays bounded (and below glibc's 32 MiB mmap ceiling, so
 * it is recycled between calls instead of page-faulted in again) and mostly in the L3.
 * A wave is a sub-batch of exact token rows (no padding rows): the strategies run on it
 * unchanged; padding rows are zeroed once at the end. Per-request results do not depend
 * on the waves (the projection group size g is the whole batch's). */
static int64_t wave_bytes = (int64_t)24 << 20;

void lk_mla_set_wave_bytes(int64_t bytes) { wave_bytes = bytes > 0 ? bytes : (int64_t)24 << 20; }

static _Thread_local lk_status wave_status;

static lk_tensor rows_of(const lk_tensor *t, int64_t r0, int64_t n) {
    lk_tensor v = *t;
    v.data = lk_at(t, r0 * t->stride[0]);
    v.shape[0] = n;
    return v;
}

/* count the waves (run = 0) or run them (run = 1; status in wave_status); -1: no memory */
static int64_t run_waves(const lk_mla_args *a, lk_mla_strategy st, int64_t g, int run) {
    int64_t B = a->B, bs = a->lat.block_size, waves = 0;
    int64_t row_bytes = 4 * (a->Dl + a->Dr + a->H * (a->Dn + a->Dr + a->Dv));
    int32_t *cu = run ? malloc(sizeof(int32_t) * (size_t)(B + 1)) : NULL;
    if (run && !cu) return -1;
    wave_status = LK_OK;
    for (int64_t b = 0, b1; b < B && wave_status == LK_OK; b = b1, waves++) {
        int64_t bytes = 0;
        for (b1 = b; b1 < B; b1++) {
            int64_t rb = a->cu_q[b1 + 1] > a->cu_q[b1] ? (a->prefix[b1] + bs - 1) / bs * bs * row_bytes : 0;
            if (b1 > b && bytes + rb > wave_bytes) break;
            bytes += rb;
        }
        if (!run) continue;
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
        if ((wave_status = lk_mla_plan_build(&w, g, &p))) break;
        wave_status = st == LK_MLA_SPLIT_MERGE ? lk_mla_split_merge(&w, &p)
                      : st == LK_MLA_CONCAT    ? lk_mla_concat(&w, &p)
                      : st == LK_MLA_FUSED     ? lk_mla_fused(&w, &p)
                                               : lk_mla_absorbed(&w, &p);
        lk_mla_plan_free(&p);
        trace_mute = 1;
    }
    trace_mute = 0;
    free(cu);
    return waves;
}

lk_status lk_mla_prefix_prefill(const lk_tensor *out, const lk_tensor *q, const lk_tensor *k,
                                const lk_tensor *v, const lk_tensor *cu_seqlens_q,
                                const lk_tensor *prefix_lens, const lk_tensor *block_table,
                                const lk_tensor *kv_c_cache, const lk_tensor *k_pe_cache,
                                const lk_tensor *kv_b_proj, const lk_mla_params *params) {
    lk_clear_error();
    lk_set_op("lk_mla_prefix_prefill");
    trace_reset();
    const lk_tensor *req[9] = {out, q, k, v, cu_seqlens_q, prefix_lens, block_table, kv_c_cache, kv_b_proj};
    const char *names[9] = {"out", "q", "k", "v", "cu_seqlens_q", "prefix_lens", "block_table", "kv_c_cache",
                            "kv_b_proj"};
    for (int i = 0; i < 9; i++)
        if (!req[i]) return lk_fail(LK_ERR_NULL, "%s: tensor pointer is NULL", names[i]);
    lk_mla_args a;
    memset(&a, 0, sizeof a);
    idx_copies cp = {0};
    lk_status s = check_shapes(&a, out, q, k, v, cu_seqlens_q, prefix_lens, block_table, kv_b_proj, params);
    if (!s) s = check_cache(&a, kv_c_cache, k_pe_cache, params->cache_layout);
    if (!s) {
        const lk_tensor *ins[9] = {q, k, v, cu_seqlens_q, prefix_lens, block_table, kv_c_cache, k_pe_cache, kv_b_proj};
        const char *in_names[9] = {"q", "k", "v", "cu_seqlens_q", "prefix_lens", "block_table", "kv_c_cache",
                                   "k_pe_cache", "kv_b_proj"};
        s = check_overlaps(out, ins, in_names, 9);
    }
    if (!s) s = check_values(&a, &cp, cu_seqlens_q, prefix_lens, block_table);
    if (s || lk_numel(out) == 0) {
        free_copies(&cp);
        return s;
    }
    a.out = *out, a.q = *q, a.k = *k, a.v = *v, a.w = *kv_b_proj;
    a.scale = params->scale, a.dedup = params->dedup != 0;
    lk_mla_ws ws;
    memset(&ws, 0, sizeof ws);
    a.ws = &ws;
    int64_t g = lk_mla_plan_g(&a);
    lk_mla_plan plan;
    float *w_owned = NULL;
    s = lk_mla_plan_build(&a, g, &plan);
    if (!s && (s = lk_mla_f32_view(&a.w, &a.w32, &w_owned))) lk_mla_plan_free(&plan);
    if (s) {
        free_copies(&cp);
        return lk_fail(s, "out of memory for the projection plan");
    }
    lk_mla_shape shape = {a.B, a.H, a.Dn, a.Dr, a.Dv, a.Dl, plan.bs, cp.q_len, cp.prefix, plan.pages * plan.bs};
    double cost[5];
    lk_mla_strategy chosen = lk_mla_choose(&shape, cost), st = params->strategy;
    if (st == LK_MLA_AUTO) {
        st = chosen;
        lk_mla_trace("strategy=%s (auto; model ms: split_merge %.3f, concat %.3f, fused %.3f, absorbed %.3f)",
                     lk_mla_strategy_name(st), 1e3 * cost[1], 1e3 * cost[2], 1e3 * cost[3], 1e3 * cost[4]);
    } else {
        lk_mla_trace("strategy=%s (forced)", lk_mla_strategy_name(st));
    }
    int64_t waves = run_waves(&a, st, g, 0);
    lk_mla_trace("plan requests=%lld tokens=%d groups=%lld/%lld pages=%lld g=%lld dedup=%d waves=%lld", (long long)a.B,
                 a.cu_q[a.B] - a.cu_q[0], (long long)plan.n_groups, (long long)plan.n_logical,
                 (long long)plan.pages, (long long)plan.g, a.dedup, (long long)waves);
    lk_mla_plan_free(&plan);
    s = run_waves(&a, st, g, 1) < 0 ? LK_ERR_NOMEM : LK_OK;
    if (!s) s = wave_status;
    if (!s) {
        lk_mla_zero_padding(&a);
        if (waves > 1) lk_mla_trace("waves=%lld (ops listed for the first)", (long long)waves);
    }
    free(w_owned);
    lk_mla_ws_free(&ws);
    free_copies(&cp);
    if (s == LK_ERR_NOMEM && !lk_last_error()[0]) lk_fail(s, "out of memory for scratch buffers");
    if (s) trace_reset();
    return s;
}
