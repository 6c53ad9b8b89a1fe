/*
 * Public entry lk_mla_prefix_prefill: validation of every argument before any store
 * (shapes, dtypes, overlaps, index values) into the lk_mla_args of src/cpu/mla/mla.h,
 * then the kernel table's mla_prefix_prefill (src/cpu/mla/driver.c: plan, strategy
 * choice, waves, strategies). Contract in include/llmkern.h; maths in src/cpu/mla/.
 *
 *   out[t, h] = sum_j softmax_j(scale * q[t, h] . key_j) value_j over the request's
 *   [prefix | current] keys, bottom-right causal (query i sees prefix keys and current
 *   keys j <= i), with prefix key_j = [W_UK_h c_j | k_pe_j], value_j = W_UV_h c_j.
 * The call's trace (src/core/trace.h) starts here: lk_mla_last_trace() returns it.
 */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/half.h"
#include "../core/trace.h"
#include "../cpu/mla/mla.h"

const char *lk_mla_last_trace(void) { return lk_trace_text(); }

lk_mla_params lk_mla_params_default(float scale) {
    lk_mla_params p = {scale, LK_MLA_AUTO, LK_KV_ND, 1, 1.0f};
    return p;
}

/* ---------------------------------------------------------------- validation */

typedef struct {
    int32_t *cu_q, *prefix, *table; /* [B + 1], [B], [B, max_pages] */
} idx_copies;

static void free_copies(idx_copies *c) {
    free(c->cu_q);
    free(c->prefix);
    free(c->table);
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
    if (p->cache_layout == LK_KV_DS_MLA)
        return lk_fail(LK_ERR_VALUE, "params.cache_layout: LK_KV_DS_MLA (fp8_ds_mla) records are not read by the "
                       "prefill: gather them (lk_gather_cache_fp8) to a bf16 buffer first");
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
    /* GEMM sizes and leading dims stay within int (and the int32 page tables) */
    if (rows > INT_MAX / 2 || H * (Dl + Dr + Dv) > INT_MAX / 2)
        return lk_fail(LK_ERR_OVERFLOW, "kv_b_proj: %lld x %lld is beyond the GEMMs' int sizes", (long long)rows,
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

static lk_status check_cache(lk_mla_args *a, const lk_tensor *kvc, const lk_tensor *kpe, const lk_mla_params *p) {
    lk_status s;
    lk_kv_layout lay = p->cache_layout;
    if (!kvc) return lk_fail(LK_ERR_NULL, "kv_c_cache: tensor pointer is NULL");
    a->one_buffer = kpe == NULL;
    if (a->one_buffer) {
        if ((s = lk_paged_init8(&a->lat, kvc, lay, 1, a->Dl + a->Dr, "kv_c_cache"))) return s;
        a->rope = a->lat;
    } else {
        if ((s = lk_paged_init8(&a->lat, kvc, lay, 1, a->Dl, "kv_c_cache"))) return s;
        if ((s = lk_paged_init8(&a->rope, kpe, lay, 1, a->Dr, "k_pe_cache"))) return s;
        if (a->rope.num_blocks != a->lat.num_blocks || a->rope.block_size != a->lat.block_size)
            return lk_fail(LK_ERR_SHAPE, "k_pe_cache: pages (%lld x %lld) differ from kv_c_cache's (%lld x %lld)",
                           (long long)a->rope.num_blocks, (long long)a->rope.block_size,
                           (long long)a->lat.num_blocks, (long long)a->lat.block_size);
    }
    /* fp8 parts: the consumers scale the codes' values by k_scale (read only then: a 0.2
     * caller's struct has no such field, and it has no fp8 caches) */
    a->lat_scale = a->rope_scale = 1.0f;
    if (lk_is_fp8(a->lat.dtype) || lk_is_fp8(a->rope.dtype)) {
        if ((s = lk_scale_check_value(p->k_scale, "params.k_scale"))) return s;
        if (lk_is_fp8(a->lat.dtype)) a->lat_scale = p->k_scale;
        if (lk_is_fp8(a->rope.dtype)) a->rope_scale = p->k_scale;
    }
    if (a->lat.block_size > INT_MAX / 8)
        return lk_fail(LK_ERR_OVERFLOW, "kv_c_cache: block_size %lld is beyond the GEMMs' int sizes",
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
    if (!(cp->cu_q = copy_index(cu)) || !(cp->prefix = copy_index(pl)) || !(cp->table = copy_index(bt)))
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
        if (P < 0 || P > cap)
            return lk_fail(LK_ERR_INDEX,
                           "prefix_lens: request %lld has %lld prefix tokens, block_table holds %lld (%lld pages of %lld)",
                           (long long)b, (long long)P, (long long)cap, (long long)maxp, (long long)bs);
        keys += P + (cp->cu_q[b + 1] - cp->cu_q[b]);
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

lk_status lk_mla_prefix_prefill(const lk_tensor *out, const lk_tensor *q, const lk_tensor *k,
                                const lk_tensor *v, const lk_tensor *cu_seqlens_q,
                                const lk_tensor *prefix_lens, const lk_tensor *block_table,
                                const lk_tensor *kv_c_cache, const lk_tensor *k_pe_cache,
                                const lk_tensor *kv_b_proj, const lk_mla_params *params) {
    lk_clear_error();
    lk_set_op("lk_mla_prefix_prefill");
    lk_trace_reset();
    const lk_tensor *req[9] = {out, q, k, v, cu_seqlens_q, prefix_lens, block_table, kv_c_cache, kv_b_proj};
    const char *names[9] = {"out", "q", "k", "v", "cu_seqlens_q", "prefix_lens", "block_table", "kv_c_cache",
                            "kv_b_proj"};
    for (int i = 0; i < 9; i++)
        if (!req[i]) return lk_fail(LK_ERR_NULL, "%s: tensor pointer is NULL", names[i]);
    lk_mla_args a;
    memset(&a, 0, sizeof a);
    idx_copies cp = {0};
    lk_status s = check_shapes(&a, out, q, k, v, cu_seqlens_q, prefix_lens, block_table, kv_b_proj, params);
    if (!s) s = check_cache(&a, kv_c_cache, k_pe_cache, params);
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
    s = lk_kernels()->mla_prefix_prefill(&a, params->strategy);
    free_copies(&cp);
    if (s == LK_ERR_NOMEM && !lk_last_error()[0]) lk_fail(s, "out of memory for scratch buffers");
    if (s) lk_trace_reset();
    return s;
}
