/*
 * Public entries lk_mla_decode and lk_mla_decode_plan: validation of every argument
 * (shapes, dtypes, overlaps, index values) before any store, contiguous int32 copies of
 * the index tensors, the split-KV plan, then the kernel of the ISA in use. Contract in
 * include/llmkern.h; maths in docs/ops.md.
 *
 *   out[b, i, h] = sum_j softmax_j(scale * q[b, i, h] . e_j) e_j[:Dl],  lse[b, h, i]
 *   keys j < cache_seqlens[b] (causal: j < cache_seqlens[b] - s_q + i + 1)
 *
 * fp8 caches (both buffers one fp8 dtype): entries dequantized as f32(c) * k_scale inside
 * the kernels (scores scaled by scale * k_scale, outputs by k_scale). fp8_ds_mla caches
 * (LK_KV_DS_MLA): the record buffer as two parts (lk_ds_init), latent dims f32(c) * the
 * tile's scale, rope dims bf16.
 *
 * Split-KV plan (mla_split_keys): about MLA_SPLIT_UNITS chunks over the whole batch,
 * each a multiple of 64 keys and at least MLA_SPLIT_MIN; it depends only on B and the
 * lengths, so the kernels' results never depend on the thread count.
 */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/half.h"
#include "../cpu/kernels.h"

#define MLA_SPLIT_UNITS 64
#define MLA_SPLIT_MIN 512

lk_mla_decode_params lk_mla_decode_params_default(float scale) {
    lk_mla_decode_params p = {scale, 0, LK_KV_ND, 0, 1.0f};
    return p;
}

static int64_t mla_split_keys(const int32_t *seqlens, int64_t B) {
    int64_t total = 0;
    for (int64_t b = 0; b < B; b++) total += seqlens[b];
    int64_t s = (total + MLA_SPLIT_UNITS - 1) / MLA_SPLIT_UNITS;
    s = (s + 63) / 64 * 64;
    return s < MLA_SPLIT_MIN ? MLA_SPLIT_MIN : s;
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

lk_status lk_mla_decode_plan(const lk_tensor *cache_seqlens, int64_t *split_keys) {
    lk_clear_error();
    lk_set_op("lk_mla_decode_plan");
    if (!cache_seqlens) return lk_fail(LK_ERR_NULL, "cache_seqlens: tensor pointer is NULL");
    if (!split_keys) return lk_fail(LK_ERR_NULL, "split_keys: pointer is NULL");
    lk_status s = lk_check_index(cache_seqlens, "cache_seqlens", 1, 1);
    if (s) return s;
    int32_t *len = copy_index(cache_seqlens);
    if (!len) return lk_fail(LK_ERR_NOMEM, "out of memory for index copies");
    int64_t B = cache_seqlens->shape[0];
    for (int64_t b = 0; b < B; b++)
        if (len[b] < 0) {
            s = lk_fail(LK_ERR_INDEX, "cache_seqlens: request %lld has a negative length (%d)", (long long)b, len[b]);
            free(len);
            return s;
        }
    *split_keys = mla_split_keys(len, B);
    free(len);
    return LK_OK;
}

static lk_status check_shapes(lk_mla_decode_args *a, const lk_tensor *out, const lk_tensor *lse,
                              const lk_tensor *q, const lk_tensor *bt, const lk_tensor *sl,
                              const lk_mla_decode_params *p) {
    lk_status s;
    if (!p) return lk_fail(LK_ERR_NULL, "params: NULL");
    if (!isfinite(p->scale)) return lk_fail(LK_ERR_VALUE, "params.scale: must be finite, got %g", (double)p->scale);
    if (p->cache_layout != LK_KV_ND && p->cache_layout != LK_KV_NZ && p->cache_layout != LK_KV_DS_MLA)
        return lk_fail(LK_ERR_VALUE, "params.cache_layout: unknown value %d", (int)p->cache_layout);
    if (p->split_keys < 0)
        return lk_fail(LK_ERR_VALUE, "params.split_keys: must be >= 0 (0: planned), got %lld", (long long)p->split_keys);
    if ((s = lk_check_float(q, "q", 4, 4)) || (s = lk_check_float(out, "out", 4, 4))) return s;
    if ((s = lk_check_index(bt, "block_table", 2, 2)) || (s = lk_check_index(sl, "cache_seqlens", 1, 1))) return s;
    int64_t B = q->shape[0], s_q = q->shape[1], H = q->shape[2], E = q->shape[3], Dl = out->shape[3];
    if (out->shape[0] != B || out->shape[1] != s_q || out->shape[2] != H)
        return lk_fail(LK_ERR_SHAPE, "out: shape %s does not match q %s in batch, tokens and heads",
                       lk_shape_str(out), lk_shape_str(q));
    if (Dl < 1) return lk_fail(LK_ERR_SHAPE, "out: latent dim must be >= 1, shape %s", lk_shape_str(out));
    if (E < Dl)
        return lk_fail(LK_ERR_SHAPE, "q: head dim %lld is below out's latent dim %lld (q is [.., Dl + Dr])",
                       (long long)E, (long long)Dl);
    if (lse) {
        if ((s = lk_check_view(lse, "lse", 3, 3))) return s;
        if (lse->dtype != LK_F32) return lk_fail(LK_ERR_DTYPE, "lse: must be f32, got %s", lk_dtype_name(lse->dtype));
        if (lse->shape[0] != B || lse->shape[1] != H || lse->shape[2] != s_q)
            return lk_fail(LK_ERR_SHAPE, "lse: shape %s, expected [%lld, %lld, %lld] ([B, H, s_q])",
                           lk_shape_str(lse), (long long)B, (long long)H, (long long)s_q);
    }
    if (sl->shape[0] != B)
        return lk_fail(LK_ERR_SHAPE, "cache_seqlens: shape %s, expected [%lld]", lk_shape_str(sl), (long long)B);
    if (bt->shape[0] != B)
        return lk_fail(LK_ERR_SHAPE, "block_table: shape %s, expected [%lld, max_pages]", lk_shape_str(bt),
                       (long long)B);
    if (s_q > INT32_MAX || H > INT32_MAX / (s_q > 0 ? s_q : 1) || E > INT32_MAX / 64)
        return lk_fail(LK_ERR_OVERFLOW, "q: shape %s is beyond the kernels' int sizes", lk_shape_str(q));
    a->B = B, a->s_q = s_q, a->H = H, a->Dl = Dl, a->Dr = E - Dl;
    a->max_pages = bt->shape[1];
    return LK_OK;
}

static lk_status check_cache(lk_mla_decode_args *a, const lk_tensor *kvc, const lk_tensor *kpe, lk_kv_layout lay,
                             float k_scale) {
    lk_status s;
    a->one_buffer = kpe == NULL;
    a->kscale = 1.0f;
    a->ds = lay == LK_KV_DS_MLA;
    if (a->ds) { /* one buffer of records, seen as two parts: codes (scaled per tile) and bf16 */
        if (kpe) return lk_fail(LK_ERR_VALUE, "k_pe_cache: an fp8_ds_mla cache is one buffer of records (pass NULL)");
        if ((s = lk_ds_init(&a->lat, &a->rope, kvc, a->Dl, a->Dr, "kv_c_cache", "out"))) return s;
        a->one_buffer = 0; /* params.k_scale is not read */
    } else if (a->one_buffer) {
        if ((s = lk_paged_init8(&a->lat, kvc, lay, 1, a->Dl + a->Dr, "kv_c_cache"))) return s;
        a->rope = a->lat;
    } else {
        if (a->Dr < 1)
            return lk_fail(LK_ERR_SHAPE, "k_pe_cache: two buffers need rope dims (q's head dim %lld = out's %lld)",
                           (long long)(a->Dl + a->Dr), (long long)a->Dl);
        if ((s = lk_paged_init8(&a->lat, kvc, lay, 1, a->Dl, "kv_c_cache"))) return s;
        if ((s = lk_paged_init8(&a->rope, kpe, lay, 1, a->Dr, "k_pe_cache"))) return s;
        if ((lk_is_fp8(a->lat.dtype) || lk_is_fp8(a->rope.dtype)) && a->rope.dtype != a->lat.dtype)
            return lk_fail(LK_ERR_DTYPE, "k_pe_cache: %s, an fp8 latent cache needs both buffers of one dtype "
                           "(kv_c_cache is %s)", lk_dtype_name(a->rope.dtype), lk_dtype_name(a->lat.dtype));
        if (a->rope.num_blocks != a->lat.num_blocks || a->rope.block_size != a->lat.block_size)
            return lk_fail(LK_ERR_SHAPE, "k_pe_cache: pages (%lld x %lld) differ from kv_c_cache's (%lld x %lld)",
                           (long long)a->rope.num_blocks, (long long)a->rope.block_size,
                           (long long)a->lat.num_blocks, (long long)a->lat.block_size);
    }
    if (lk_is_fp8(a->lat.dtype) && !a->ds) { /* one dequantization scale for both buffers */
        if ((s = lk_scale_check_value(k_scale, "params.k_scale"))) return s;
        a->kscale = k_scale;
    }
    /* an empty cache may have block_size 0: no page exists, 1 keeps page counts defined */
    if (a->lat.block_size < 1) a->lat.block_size = a->rope.block_size = 1;
    return LK_OK;
}

static lk_status check_overlaps(const lk_tensor *w, const char *wn, const lk_tensor *const *in,
                                const char *const *names, int n) {
    lk_status s;
    if ((s = lk_check_no_self_overlap(w, wn))) return s;
    for (int i = 0; i < n; i++)
        if (in[i] && (s = lk_check_disjoint(w, wn, in[i], names[i]))) return s;
    return LK_OK;
}

static lk_status check_values(lk_mla_decode_args *a, int32_t *len, const int32_t *table) {
    int64_t maxp = a->max_pages, bs = a->lat.block_size, nb = a->lat.num_blocks;
    int64_t cap = maxp > INT32_MAX / bs ? INT32_MAX : maxp * bs;
    for (int64_t b = 0; b < a->B; b++) {
        int64_t n = len[b];
        if (n < 0 || n > cap)
            return lk_fail(LK_ERR_INDEX, "cache_seqlens: request %lld has %lld tokens, block_table holds %lld "
                           "(%lld pages of %lld)", (long long)b, (long long)n, (long long)cap, (long long)maxp,
                           (long long)bs);
        if (a->causal && n > 0 && n < a->s_q)
            return lk_fail(LK_ERR_INDEX, "cache_seqlens: request %lld has %lld tokens, fewer than its %lld causal "
                           "queries (the queries are the last s_q cached tokens)", (long long)b, (long long)n,
                           (long long)a->s_q);
        for (int64_t j = 0; j < (n + bs - 1) / bs; j++) {
            int32_t pg = table[b * maxp + j];
            if (pg < 0 || pg >= nb)
                return lk_fail(LK_ERR_INDEX, "block_table: entry [%lld, %lld] = %d outside [0, %lld)", (long long)b,
                               (long long)j, pg, (long long)nb);
        }
    }
    return LK_OK;
}

lk_status lk_mla_decode(const lk_tensor *out, const lk_tensor *lse, const lk_tensor *q,
                        const lk_tensor *kv_c_cache, const lk_tensor *k_pe_cache,
                        const lk_tensor *block_table, const lk_tensor *cache_seqlens,
                        const lk_mla_decode_params *params) {
    lk_clear_error();
    lk_set_op("lk_mla_decode");
    const lk_tensor *req[5] = {out, q, kv_c_cache, block_table, cache_seqlens};
    const char *names[5] = {"out", "q", "kv_c_cache", "block_table", "cache_seqlens"};
    for (int i = 0; i < 5; i++)
        if (!req[i]) return lk_fail(LK_ERR_NULL, "%s: tensor pointer is NULL", names[i]);
    lk_mla_decode_args a;
    memset(&a, 0, sizeof a);
    lk_status s = check_shapes(&a, out, lse, q, block_table, cache_seqlens, params);
    if (!s) a.causal = params->causal != 0;
    if (!s) s = check_cache(&a, kv_c_cache, k_pe_cache, params->cache_layout, params->k_scale);
    const lk_tensor *ins[5] = {q, kv_c_cache, k_pe_cache, block_table, cache_seqlens};
    const char *in_names[5] = {"q", "kv_c_cache", "k_pe_cache", "block_table", "cache_seqlens"};
    if (!s) s = check_overlaps(out, "out", ins, in_names, 5);
    if (!s && lse) {
        s = check_overlaps(lse, "lse", ins, in_names, 5);
        if (!s) s = lk_check_disjoint(lse, "lse", out, "out");
    }
    if (s) return s;
    int32_t *len = copy_index(cache_seqlens), *table = copy_index(block_table);
    if (!len || !table) s = lk_fail(LK_ERR_NOMEM, "out of memory for index copies");
    if (!s) s = check_values(&a, len, table);
    if (!s && lk_numel(out) > 0) {
        a.out = *out, a.q = *q;
        if (lse) a.lse = *lse;
        a.has_lse = lse != NULL;
        a.seqlens = len, a.table = table;
        a.scale = params->scale;
        a.split = params->split_keys > 0 ? params->split_keys : mla_split_keys(len, a.B);
        s = lk_kernels()->mla_decode(&a);
        if (s == LK_ERR_NOMEM && !lk_last_error()[0]) lk_fail(s, "out of memory for scratch buffers");
    }
    free(len);
    free(table);
    return s;
}
