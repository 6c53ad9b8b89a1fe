/*
 * Public entry points lk_concat_and_cache_mla and lk_gather_cache: validation (before
 * any store, including every index value the kernel will use), then the kernel of the
 * ISA in use. Contracts in include/llmkern.h ("paged caches"), maths in docs/ops.md.
 *
 *   concat_and_cache_mla: cache[slot_mapping[t]] = round([kv_c[t] | k_pe[t]]), t < N,
 *     slot < 0 skipped; kv_c [T, Dl], k_pe [T, Dr]; one cache (entry Dl + Dr) or two
 *     (entries Dl and Dr), ND or NZ (see src/core/paged.h).
 *   gather_cache: out[sum(seq_lens[:b]) + j] = round(cache entry of token j of request
 *     b) for j < seq_lens[b]; token j is in page block_table[b, j / block_size], slot
 *     j % block_size.
 *
 * Index rules (errors name the argument, nothing is written):
 *   slot_mapping: slot >= num_blocks * block_size -> LK_ERR_INDEX; two tokens with the
 *     same slot -> LK_ERR_INDEX (the result would depend on thread timing).
 *   seq_lens: < 0 -> LK_ERR_INDEX; > max_pages * block_size -> LK_ERR_SHAPE (does not
 *     fit the block table); sum must equal out's first dim (LK_ERR_SHAPE naming out).
 *   block_table: entries of pages that are read must be in [0, num_blocks)
 *     (LK_ERR_INDEX); entries past a request's last page are not looked at.
 *
 * The _fp8 entry points (since 0.3) also take fp8 caches (src/core/paged.h:
 * lk_paged_init8, NZ tiles 32 wide) and a per-tensor scale: concat stores
 * fp8(x / scale), gather reads f32(q) * scale; a gather into an fp8 out copies bits out
 * of a cache of the same dtype. lk_gather_cache_starts adds vLLM's seq_starts: token j
 * of request b is at position p = seq_starts[b] + j (page block_table[b, p / block_size],
 * slot p % block_size); seq_starts < 0 or past the block table with the request's length
 * -> LK_ERR_INDEX.
 *
 * lk_concat_and_cache_mla_rope (vLLM's concat_and_cache_mla_rope_fused) validates the
 * fp8 concat's arguments and rotary_embedding's (q = q_pe [T, Hq, Dr], k = k_pe as
 * [T, 1, Dr], positions narrowed to its first T values), then the driver
 * src/cpu/mla_cache_rope.c rotates q_pe and k_pe in place and writes the cache.
 */
#include <stdlib.h>
#include <string.h>

#include "../core/half.h"
#include "../cpu/kernels.h"

/* ---------------------------------------------------------------- concat_and_cache_mla */

/* slots in [-inf, num_slots), no slot >= 0 twice. Duplicates: an open-addressing hash
 * set of the slots seen (O(N), 2-4x N entries; on the stack for small N). */
static lk_status check_slots(const lk_tensor *sm, int64_t num_slots) {
    int64_t N = sm->shape[0], used = 0;
    for (int64_t i = 0; i < N; i++) {
        int64_t slot = lk_load_index(sm->data, sm->dtype, i * sm->stride[0]);
        if (slot >= num_slots)
            return lk_fail(LK_ERR_INDEX, "slot_mapping: slot_mapping[%lld] = %lld is beyond the cache (%lld slots)",
                           (long long)i, (long long)slot, (long long)num_slots);
        used += slot >= 0;
    }
    if (used < 2) return LK_OK;
    int bits = 7;
    while (((int64_t)1 << bits) < 2 * used) bits++;
    int64_t cap = (int64_t)1 << bits, stack[128];
    int64_t *set = bits == 7 ? stack : malloc((size_t)cap * sizeof(int64_t));
    if (!set) return lk_fail(LK_ERR_NOMEM, "slot_mapping: no memory for the duplicate check (%lld slots)",
                             (long long)used);
    memset(set, 0xff, (size_t)cap * sizeof(int64_t)); /* -1: empty */
    int64_t dup = -1;
    for (int64_t i = 0; i < N && dup < 0; i++) {
        int64_t slot = lk_load_index(sm->data, sm->dtype, i * sm->stride[0]);
        if (slot < 0) continue;
        uint64_t h = ((uint64_t)slot * 0x9e3779b97f4a7c15ull) >> (64 - bits);
        while (set[h] >= 0 && set[h] != slot) h = (h + 1) & (uint64_t)(cap - 1);
        if (set[h] == slot) dup = slot;
        set[h] = slot;
    }
    if (set != stack) free(set);
    if (dup >= 0)
        return lk_fail(LK_ERR_INDEX, "slot_mapping: slot %lld appears more than once", (long long)dup);
    return LK_OK;
}

/* fp8: the caches may be fp8 (lk_paged_init8) */
static lk_status paged_init(int fp8, lk_paged *pc, const lk_tensor *t, lk_kv_layout layout, int64_t H, int64_t D,
                            const char *name) {
    return fp8 ? lk_paged_init8(pc, t, layout, H, D, name) : lk_paged_init(pc, t, layout, H, D, name);
}

static lk_status check_mla(lk_mla_cache_args *a, const lk_tensor *kv_c_cache,
                           const lk_tensor *k_pe_cache, lk_kv_layout layout, int fp8) {
    lk_status s;
    if ((s = lk_check_float(&a->kv_c, "kv_c", 2, 2))) return s;
    if ((s = lk_check_float(&a->k_pe, "k_pe", 2, 2))) return s;
    if (a->k_pe.shape[0] != a->kv_c.shape[0])
        return lk_fail(LK_ERR_SHAPE, "k_pe: shape %s: first dim must equal kv_c's (%lld tokens)",
                       lk_shape_str(&a->k_pe), (long long)a->kv_c.shape[0]);
    if ((s = lk_check_index(&a->slot_mapping, "slot_mapping", 1, 1))) return s;
    if (a->slot_mapping.shape[0] > a->kv_c.shape[0])
        return lk_fail(LK_ERR_SHAPE, "slot_mapping: %lld slots for %lld tokens (need N <= T)",
                       (long long)a->slot_mapping.shape[0], (long long)a->kv_c.shape[0]);
    int64_t Dl = a->kv_c.shape[1], Dr = a->k_pe.shape[1];
    a->ds = layout == LK_KV_DS_MLA;
    if (a->ds) { /* one record buffer: the codes part and the bf16 part (lk_ds_init) */
        if (!fp8)
            return lk_fail(LK_ERR_VALUE, "layout: LK_KV_DS_MLA (fp8_ds_mla) caches are written by "
                           "lk_concat_and_cache_mla_fp8");
        if (k_pe_cache)
            return lk_fail(LK_ERR_VALUE, "k_pe_cache: an fp8_ds_mla cache is one buffer of records (pass NULL)");
        if ((s = lk_ds_init(&a->kv_c_cache, &a->k_pe_cache, kv_c_cache, Dl, Dr, "kv_c_cache", "kv_c"))) return s;
        a->pe_c0 = 0;
    } else if (k_pe_cache) {
        if ((s = paged_init(fp8, &a->kv_c_cache, kv_c_cache, layout, 1, Dl, "kv_c_cache"))) return s;
        if ((s = paged_init(fp8, &a->k_pe_cache, k_pe_cache, layout, 1, Dr, "k_pe_cache"))) return s;
        if (a->k_pe_cache.num_blocks != a->kv_c_cache.num_blocks ||
            a->k_pe_cache.block_size != a->kv_c_cache.block_size)
            return lk_fail(LK_ERR_SHAPE, "k_pe_cache: shape %s: num_blocks and block_size must match kv_c_cache %s",
                           lk_shape_str(k_pe_cache), lk_shape_str(kv_c_cache));
        a->pe_c0 = 0;
    } else {
        if (Dl > INT64_MAX - Dr) return lk_fail(LK_ERR_OVERFLOW, "k_pe: Dl + Dr overflows int64");
        if ((s = paged_init(fp8, &a->kv_c_cache, kv_c_cache, layout, 1, Dl + Dr, "kv_c_cache"))) return s;
        a->k_pe_cache = a->kv_c_cache;
        a->pe_c0 = Dl;
    }
    const lk_tensor *caches[2] = {kv_c_cache, k_pe_cache};
    const char *cn[2] = {"kv_c_cache", "k_pe_cache"};
    for (int i = 0; i < 2 && caches[i]; i++) {
        if ((s = lk_check_no_self_overlap(caches[i], cn[i]))) return s;
        if ((s = lk_check_disjoint(caches[i], cn[i], &a->kv_c, "kv_c"))) return s;
        if ((s = lk_check_disjoint(caches[i], cn[i], &a->k_pe, "k_pe"))) return s;
        if ((s = lk_check_disjoint(caches[i], cn[i], &a->slot_mapping, "slot_mapping"))) return s;
    }
    if (k_pe_cache && (s = lk_check_disjoint(kv_c_cache, "kv_c_cache", k_pe_cache, "k_pe_cache")))
        return s;
    return check_slots(&a->slot_mapping, lk_paged_slots(&a->kv_c_cache));
}

/* check_mla and the per-tensor scale (NULL: 1), which the caches must not overlap */
static lk_status check_concat(lk_mla_cache_args *a, const lk_tensor *kv_c_cache, const lk_tensor *k_pe_cache,
                              lk_kv_layout layout, int fp8, const lk_tensor *scale) {
    lk_status s = check_mla(a, kv_c_cache, k_pe_cache, layout, fp8);
    if (s) return s;
    a->scale = 1.0f;
    if (a->ds) return LK_OK; /* the records carry their own scales; `scale` is not read */
    lk_scale sc = {0};
    if ((s = lk_scale_init(&sc, scale, -1, 1, "scale"))) return s;
    if (scale) {
        const lk_tensor *caches[2] = {kv_c_cache, k_pe_cache};
        const char *cn[2] = {"kv_c_cache", "k_pe_cache"};
        for (int i = 0; i < 2 && caches[i]; i++)
            if ((s = lk_check_disjoint(caches[i], cn[i], scale, "scale"))) return s;
    }
    a->scale = lk_scale_at(&sc, 0, 0);
    return LK_OK;
}

static lk_status concat(const char *op, const lk_tensor *kv_c, const lk_tensor *k_pe, const lk_tensor *kv_c_cache,
                        const lk_tensor *k_pe_cache, const lk_tensor *slot_mapping, lk_kv_layout layout, int fp8,
                        const lk_tensor *scale) {
    lk_clear_error();
    lk_set_op(op);
    if (!kv_c || !k_pe || !kv_c_cache || !slot_mapping)
        return lk_fail(LK_ERR_NULL, "%s: tensor pointer is NULL",
                       !kv_c ? "kv_c" : !k_pe ? "k_pe" : !kv_c_cache ? "kv_c_cache" : "slot_mapping");
    lk_mla_cache_args a;
    a.kv_c = *kv_c;
    a.k_pe = *k_pe;
    a.slot_mapping = *slot_mapping;
    lk_status s = check_concat(&a, kv_c_cache, k_pe_cache, layout, fp8, scale);
    if (s) return s;
    if (a.slot_mapping.shape[0] == 0 || a.kv_c.shape[1] + a.k_pe.shape[1] == 0) return LK_OK;
    return a.ds ? lk_kernels()->concat_and_cache_mla_ds(&a) : lk_kernels()->concat_and_cache_mla(&a);
}

lk_status lk_concat_and_cache_mla(const lk_tensor *kv_c, const lk_tensor *k_pe, const lk_tensor *kv_c_cache,
                                  const lk_tensor *k_pe_cache, const lk_tensor *slot_mapping, lk_kv_layout layout) {
    return concat("lk_concat_and_cache_mla", kv_c, k_pe, kv_c_cache, k_pe_cache, slot_mapping, layout, 0, NULL);
}

lk_status lk_concat_and_cache_mla_fp8(const lk_tensor *kv_c, const lk_tensor *k_pe, const lk_tensor *kv_c_cache,
                                      const lk_tensor *k_pe_cache, const lk_tensor *slot_mapping, lk_kv_layout layout,
                                      const lk_tensor *scale) {
    return concat("lk_concat_and_cache_mla_fp8", kv_c, k_pe, kv_c_cache, k_pe_cache, slot_mapping, layout, 1,
                  scale);
}

/* ---------------------------------------------------------------- concat_and_cache_mla_rope */

/* what the rope step adds to the concat checks: q_pe, positions (P >= T, the first T
 * used), cos_sin_cache, and the overlaps of the buffers it writes (q_pe, k_pe) and of
 * the caches with the arguments only it reads */
static lk_status check_rope(lk_mla_cache_rope_args *a, const lk_tensor *positions, const lk_tensor *q_pe,
                            const lk_tensor *cos_sin_cache, const lk_tensor *kv_c_cache,
                            const lk_tensor *k_pe_cache, const lk_tensor *scale) {
    lk_status s;
    const lk_tensor *kv_c = &a->cache.kv_c, *k_pe = &a->cache.k_pe, *sm = &a->cache.slot_mapping;
    if ((s = lk_check_index(positions, "positions", 1, 1))) return s;
    int64_t T = q_pe->shape[0];
    if (kv_c->shape[0] != T)
        return lk_fail(LK_ERR_SHAPE, "kv_c: shape %s: first dim must equal q_pe's (%lld tokens)",
                       lk_shape_str(kv_c), (long long)T);
    if (positions->shape[0] < T)
        return lk_fail(LK_ERR_SHAPE, "positions: shape %s: %lld values for %lld tokens (q_pe's first dim)",
                       lk_shape_str(positions), (long long)positions->shape[0], (long long)T);
    if (k_pe->shape[1] != q_pe->shape[2])
        return lk_fail(LK_ERR_SHAPE, "k_pe: shape %s: last dim must equal q_pe's head dim (%lld)",
                       lk_shape_str(k_pe), (long long)q_pe->shape[2]);
    lk_rotary_args *r = &a->rope;
    r->positions = *positions;
    r->positions.shape[0] = T;
    r->q = *q_pe;
    r->k = *k_pe; /* [T, Dr] as [T, 1, Dr] */
    r->k.ndim = 3;
    r->k.shape[2] = k_pe->shape[1], r->k.stride[2] = k_pe->stride[1];
    r->k.shape[1] = 1, r->k.stride[1] = 0;
    r->has_k = 1;
    r->cos_sin = *cos_sin_cache;
    if ((s = lk_rotary_check(r, "q_pe", "k_pe"))) return s;
    /* written: q_pe, k_pe, the caches; the rotary check covered q_pe / k_pe against each
     * other, cos_sin_cache and the first T positions, the concat check the caches against
     * kv_c, k_pe, slot_mapping, scale */
    /* positions as passed (its tail past T too, as the caches below) */
    if ((s = lk_check_disjoint(q_pe, "q_pe", positions, "positions"))) return s;
    if ((s = lk_check_disjoint(k_pe, "k_pe", positions, "positions"))) return s;
    if ((s = lk_check_disjoint(q_pe, "q_pe", kv_c, "kv_c"))) return s;
    if ((s = lk_check_disjoint(q_pe, "q_pe", sm, "slot_mapping"))) return s;
    if ((s = lk_check_disjoint(k_pe, "k_pe", kv_c, "kv_c"))) return s;
    if ((s = lk_check_disjoint(k_pe, "k_pe", sm, "slot_mapping"))) return s;
    if (scale && !a->cache.ds) { /* fp8_ds_mla: scale is not read (nor validated) */
        if ((s = lk_check_disjoint(q_pe, "q_pe", scale, "scale"))) return s;
        if ((s = lk_check_disjoint(k_pe, "k_pe", scale, "scale"))) return s;
    }
    const lk_tensor *caches[2] = {kv_c_cache, k_pe_cache};
    const char *cn[2] = {"kv_c_cache", "k_pe_cache"};
    for (int i = 0; i < 2 && caches[i]; i++) {
        if ((s = lk_check_disjoint(caches[i], cn[i], q_pe, "q_pe"))) return s;
        if ((s = lk_check_disjoint(caches[i], cn[i], positions, "positions"))) return s;
        if ((s = lk_check_disjoint(caches[i], cn[i], cos_sin_cache, "cos_sin_cache"))) return s;
    }
    return LK_OK;
}

lk_status lk_concat_and_cache_mla_rope(const lk_tensor *positions, const lk_tensor *q_pe, const lk_tensor *k_pe,
                                       const lk_tensor *kv_c, const lk_tensor *cos_sin_cache, int is_neox,
                                       const lk_tensor *kv_c_cache, const lk_tensor *k_pe_cache,
                                       const lk_tensor *slot_mapping, lk_kv_layout layout, const lk_tensor *scale) {
    lk_clear_error();
    lk_set_op("lk_concat_and_cache_mla_rope");
    const lk_tensor *req[7] = {positions, q_pe, k_pe, kv_c, cos_sin_cache, kv_c_cache, slot_mapping};
    const char *rn[7] = {"positions", "q_pe", "k_pe", "kv_c", "cos_sin_cache", "kv_c_cache", "slot_mapping"};
    for (int i = 0; i < 7; i++)
        if (!req[i]) return lk_fail(LK_ERR_NULL, "%s: tensor pointer is NULL", rn[i]);
    lk_mla_cache_rope_args a;
    a.cache.kv_c = *kv_c;
    a.cache.k_pe = *k_pe;
    a.cache.slot_mapping = *slot_mapping;
    lk_status s;
    if ((s = lk_check_float(q_pe, "q_pe", 3, 3))) return s;
    if ((s = check_concat(&a.cache, kv_c_cache, k_pe_cache, layout, 1, scale))) return s;
    if ((s = check_rope(&a, positions, q_pe, cos_sin_cache, kv_c_cache, k_pe_cache, scale))) return s;
    a.rope.is_neox = is_neox != 0;
    a.do_rope = q_pe->shape[0] > 0 && cos_sin_cache->shape[1] > 0;
    a.do_cache = a.cache.slot_mapping.shape[0] > 0 && a.cache.kv_c.shape[1] + a.cache.k_pe.shape[1] > 0;
    if (!a.do_rope && !a.do_cache) return LK_OK;
    return lk_kernels()->concat_and_cache_mla_rope(&a);
}

/* ---------------------------------------------------------------- gather_cache */

/* a * b, or 0 where it overflows: only reachable for a stride that is never used (an
 * empty view's, whose strides lk_check_view does not bound) */
static int64_t stride_mul(int64_t a, int64_t b) {
    int64_t r;
    return __builtin_mul_overflow(a, b, &r) ? 0 : r;
}

/* entry shape (H, D) of the cache as out sees it, and out / an ND cache as views of
 * that shape: out [S, C] -> [S, H, D]; ND cache [nb, bs, C] -> [nb, bs, H, D] */
static lk_status entry_views(lk_tensor *out, lk_tensor *cache, lk_kv_layout layout, int64_t *H,
                             int64_t *D, int fp8) {
    lk_status s;
    if ((s = (fp8 ? lk_check_float8 : lk_check_float)(out, "out", 2, 3))) return s;
    if ((s = (fp8 ? lk_check_float8 : lk_check_float)(cache, "cache", 3, 4))) return s;
    if (lk_is_fp8(out->dtype) && out->dtype != cache->dtype)
        return lk_fail(LK_ERR_DTYPE, "out: dtype %s needs a cache of the same dtype (bit copy), cache is %s",
                       lk_dtype_name(out->dtype), lk_dtype_name(cache->dtype));
    int64_t C;
    if (out->ndim == 3) {
        *H = out->shape[1], *D = out->shape[2];
        if (__builtin_mul_overflow(*H, *D, &C))
            return lk_fail(LK_ERR_OVERFLOW, "out: shape %s: heads x dims overflows int64", lk_shape_str(out));
    } else if (layout == LK_KV_ND && cache->ndim == 4) {
        *H = cache->shape[2], *D = cache->shape[3], C = *H * *D; /* fits: cache passed its checks */
        if (C != out->shape[1])
            return lk_fail(LK_ERR_SHAPE, "cache: shape %s: heads x dims must equal out's last dim (%lld)",
                           lk_shape_str(cache), (long long)out->shape[1]);
    } else *H = 1, *D = C = out->shape[1];
    if (out->ndim == 2) { /* [S, C] as [S, H, D] */
        out->ndim = 3;
        out->shape[1] = *H, out->shape[2] = *D;
        out->stride[2] = out->stride[1];
        out->stride[1] = stride_mul(*D, out->stride[1]);
    }
    if (layout == LK_KV_ND && cache->ndim == 3 && *H != 1) { /* [nb, bs, C] as [nb, bs, H, D] */
        if (cache->shape[2] != C)
            return lk_fail(LK_ERR_SHAPE, "cache: shape %s: last dim must be %lld (out's heads x dims)",
                           lk_shape_str(cache), (long long)C);
        cache->ndim = 4;
        cache->shape[2] = *H, cache->shape[3] = *D;
        cache->stride[3] = cache->stride[2];
        cache->stride[2] = stride_mul(*D, cache->stride[2]);
    }
    return LK_OK;
}

/* an LK_KV_DS_MLA cache and out [S, Dl + Dr] (as [S, 1, Dl + Dr]); Dl from out's last dim C
 * and the cache's entry bytes E = Dl + Dl / 32 + 2 Dr: Dl = 32 (2 C - E) / 31 */
static lk_status ds_views(lk_gather_cache_args *a, lk_tensor *out, const lk_tensor *cache, int fp8) {
    lk_status s;
    if (!fp8)
        return lk_fail(LK_ERR_VALUE, "layout: LK_KV_DS_MLA (fp8_ds_mla) caches are read by lk_gather_cache_fp8 / "
                       "lk_gather_cache_starts");
    if ((s = lk_check_float(out, "out", 2, 2))) return s;
    if ((s = lk_check_view(cache, "cache", 3, 4))) return s;
    if (lk_dtype_size(cache->dtype) != 1)
        return lk_fail(LK_ERR_DTYPE, "cache: dtype %s: an fp8_ds_mla cache holds bytes (f8e4m3 or i8 elements)",
                       lk_dtype_name(cache->dtype));
    int64_t C = out->shape[1], E = cache->shape[cache->ndim - 1], Dl = -1;
    if (C <= INT64_MAX / 64 && 2 * C >= E && (2 * C - E) * 32 % 31 == 0) Dl = (2 * C - E) * 32 / 31;
    if (Dl < LK_DS_TILE || Dl % LK_DS_TILE || Dl > C)
        return lk_fail(LK_ERR_SHAPE, "out: shape %s: %lld dims do not fit the fp8_ds_mla cache %s (entries of "
                       "Dl + Dl / 32 + 2 Dr bytes for Dl + Dr dims, Dl a positive multiple of %d)", lk_shape_str(out),
                       (long long)C, lk_shape_str(cache), LK_DS_TILE);
    if ((s = lk_ds_init(&a->cache, &a->rope, cache, Dl, C - Dl, "cache", "out"))) return s;
    out->ndim = 3; /* [S, C] as [S, 1, C] */
    out->shape[2] = C, out->shape[1] = 1;
    out->stride[2] = out->stride[1], out->stride[1] = 0;
    a->ds = 1;
    return LK_OK;
}

static lk_status check_gather(lk_gather_cache_args *a, lk_tensor cache, lk_kv_layout layout, int fp8,
                              const lk_tensor *starts) {
    lk_status s;
    int64_t H = 0, D = 0;
    lk_tensor out_user = a->out;
    a->ds = 0;
    if (layout == LK_KV_DS_MLA) {
        if ((s = ds_views(a, &a->out, &cache, fp8))) return s;
    } else {
        if ((s = entry_views(&a->out, &cache, layout, &H, &D, fp8))) return s;
        if ((s = paged_init(fp8, &a->cache, &cache, layout, H, D, "cache"))) return s;
    }
    const lk_tensor *bt = &a->block_table, *sl = &a->seq_lens;
    if ((s = lk_check_view(bt, "block_table", 2, 2))) return s;
    if (bt->dtype != LK_I32)
        return lk_fail(LK_ERR_DTYPE, "block_table: dtype %s not supported (i32)", lk_dtype_name(bt->dtype));
    if ((s = lk_check_view(sl, "seq_lens", 1, 1))) return s;
    if (sl->dtype != LK_I32)
        return lk_fail(LK_ERR_DTYPE, "seq_lens: dtype %s not supported (i32)", lk_dtype_name(sl->dtype));
    if (sl->shape[0] != bt->shape[0])
        return lk_fail(LK_ERR_SHAPE, "seq_lens: shape %s: must be [B] with B = block_table's first dim (%lld)",
                       lk_shape_str(sl), (long long)bt->shape[0]);
    if ((s = lk_check_no_self_overlap(&out_user, "out"))) return s;
    if ((s = lk_check_disjoint(&out_user, "out", &cache, "cache"))) return s;
    if ((s = lk_check_disjoint(&out_user, "out", bt, "block_table"))) return s;
    if ((s = lk_check_disjoint(&out_user, "out", sl, "seq_lens"))) return s;
    a->starts = NULL, a->starts_stride = 0;
    if (starts) { /* seq_starts [B] i32 */
        if ((s = lk_check_view(starts, "seq_starts", 1, 1))) return s;
        if (starts->dtype != LK_I32)
            return lk_fail(LK_ERR_DTYPE, "seq_starts: dtype %s not supported (i32)", lk_dtype_name(starts->dtype));
        if (starts->shape[0] != bt->shape[0])
            return lk_fail(LK_ERR_SHAPE, "seq_starts: shape %s: must be [B] with B = block_table's first dim (%lld)",
                           lk_shape_str(starts), (long long)bt->shape[0]);
        if ((s = lk_check_disjoint(&out_user, "out", starts, "seq_starts"))) return s;
        a->starts = starts->data, a->starts_stride = starts->stride[0];
    }
    int64_t B = bt->shape[0], max_pages = bt->shape[1], bs = a->cache.block_size, cap, total = 0;
    if (__builtin_mul_overflow(max_pages, bs, &cap)) cap = INT64_MAX;
    const int32_t *btd = bt->data, *sld = sl->data;
    for (int64_t b = 0; b < B; b++) {
        int64_t len = sld[b * sl->stride[0]], st = lk_gather_start(a, b);
        if (len < 0)
            return lk_fail(LK_ERR_INDEX, "seq_lens: seq_lens[%lld] = %lld is negative", (long long)b,
                           (long long)len);
        if (len > cap)
            return lk_fail(LK_ERR_SHAPE, "seq_lens: seq_lens[%lld] = %lld exceeds block_table's %lld pages x block_size %lld",
                           (long long)b, (long long)len, (long long)max_pages, (long long)bs);
        if (st < 0)
            return lk_fail(LK_ERR_INDEX, "seq_starts: seq_starts[%lld] = %lld is negative", (long long)b,
                           (long long)st);
        if (st > cap - len) /* both in [0, cap]: no overflow */
            return lk_fail(LK_ERR_INDEX, "seq_starts: seq_starts[%lld] = %lld with seq_lens[%lld] = %lld reads "
                           "beyond block_table's %lld pages x block_size %lld", (long long)b, (long long)st,
                           (long long)b, (long long)len, (long long)max_pages, (long long)bs);
        if (__builtin_add_overflow(total, len, &total))
            return lk_fail(LK_ERR_OVERFLOW, "seq_lens: sum(seq_lens) overflows int64");
        /* the pages of positions st .. st + len - 1 */
        int64_t p0 = len ? st / bs : 0, pages = len ? (st + len - 1) / bs + 1 : 0;
        for (int64_t p = p0; p < pages; p++) {
            int64_t blk = btd[b * bt->stride[0] + p * bt->stride[1]];
            if (blk < 0 || blk >= a->cache.num_blocks)
                return lk_fail(LK_ERR_INDEX, "block_table: block_table[%lld, %lld] = %lld is outside [0, %lld)",
                               (long long)b, (long long)p, (long long)blk, (long long)a->cache.num_blocks);
        }
    }
    if (a->out.shape[0] != total)
        return lk_fail(LK_ERR_SHAPE, "out: shape %s: first dim must be sum(seq_lens) = %lld",
                       lk_shape_str(&out_user), (long long)total);
    return LK_OK;
}

static lk_status gather(const char *op, const lk_tensor *out, const lk_tensor *cache, const lk_tensor *block_table,
                        const lk_tensor *seq_lens, lk_kv_layout layout, int fp8, const lk_tensor *scale,
                        const lk_tensor *seq_starts) {
    lk_clear_error();
    lk_set_op(op);
    if (!out || !cache || !block_table || !seq_lens)
        return lk_fail(LK_ERR_NULL, "%s: tensor pointer is NULL",
                       !out ? "out" : !cache ? "cache" : !block_table ? "block_table" : "seq_lens");
    lk_gather_cache_args a;
    a.out = *out;
    a.block_table = *block_table;
    a.seq_lens = *seq_lens;
    lk_status s = check_gather(&a, *cache, layout, fp8, seq_starts);
    if (s) return s;
    a.scale = 1.0f;
    if (!a.ds) { /* fp8_ds_mla records carry their own scales: `scale` is not read */
        lk_scale sc = {0};
        if ((s = lk_scale_init(&sc, scale, -1, 1, "scale"))) return s;
        if (scale && (s = lk_check_disjoint(out, "out", scale, "scale"))) return s;
        a.scale = lk_scale_at(&sc, 0, 0);
    }
    if (lk_numel(&a.out) == 0) return LK_OK;
    return a.ds ? lk_kernels()->gather_cache_ds(&a) : lk_kernels()->gather_cache(&a);
}

lk_status lk_gather_cache(const lk_tensor *out, const lk_tensor *cache, const lk_tensor *block_table,
                          const lk_tensor *seq_lens, lk_kv_layout layout) {
    return gather("lk_gather_cache", out, cache, block_table, seq_lens, layout, 0, NULL, NULL);
}

lk_status lk_gather_cache_fp8(const lk_tensor *out, const lk_tensor *cache, const lk_tensor *block_table,
                              const lk_tensor *seq_lens, lk_kv_layout layout, const lk_tensor *scale) {
    return gather("lk_gather_cache_fp8", out, cache, block_table, seq_lens, layout, 1, scale, NULL);
}

lk_status lk_gather_cache_starts(const lk_tensor *out, const lk_tensor *cache, const lk_tensor *block_table,
                                 const lk_tensor *seq_lens, const lk_tensor *seq_starts, lk_kv_layout layout,
                                 const lk_tensor *scale) {
    return gather("lk_gather_cache_starts", out, cache, block_table, seq_lens, layout, 1, scale, seq_starts);
}
