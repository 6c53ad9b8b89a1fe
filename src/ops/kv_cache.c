/*
 * Public entry point lk_reshape_and_cache_flash: validation (before any store), then
 * the kernel of the ISA in use. Contract in include/llmkern.h.
 *
 *   k_cache[slot / bs, slot % bs, h, d] = round(k[t, h, d])   for t < N, slot >= 0
 *   v_cache[slot / bs, slot % bs, h, d] = round(v[t, h, d])   (slot = slot_mapping[t])
 *
 * Shapes: k [T, H, Dk], v [T, H, Dv]; k_cache [NB, bs, H, Dk], v_cache [NB, bs, H, Dv]
 * (any strides: an HND buffer is a permuted view, k and v caches may be interleaved
 * views of one buffer); slot_mapping [N <= T] i32/i64.
 *
 * Everything that could make the result depend on thread timing is rejected here:
 * a slot outside [0, NB * bs) or used by two tokens is LK_ERR_INDEX, caches overlapping
 * each other, themselves, k, v or slot_mapping are LK_ERR_ALIAS. The duplicate check
 * needs scratch proportional to N (or to the cache's slot count when that is small);
 * LK_ERR_NOMEM if it cannot be allocated. Nothing is written on any error.
 *
 * lk_reshape_and_cache_flash_scaled also takes fp8 caches (k_cache[...] = fp8(k / k_scale),
 * likewise v) with finite scales > 0. lk_reshape_and_cache_flash_fp8 takes scale tensors
 * (per tensor or per head [H]) and ND or NZ caches (src/core/paged.h; an fp8 NZ cache is
 * tiled 32 wide). Both hand fp8 caches (and every cache of the _fp8 entry) to the paged
 * kernel (reshape_and_cache_paged: every cache element addressed through lk_paged_off);
 * 16/32-bit ND caches of the other entries take reshape_and_cache_flash.
 */
#include <stdlib.h>

#include "../core/half.h"
#include "../cpu/kernels.h"

/* at or below this many used slots, duplicates are found by pairwise comparison */
#define SMALL_N 32
/* a bitmap of the cache's slots is used while it costs at most this many bits per
 * used slot; sparser caches sort a copy of the slots instead */
#define BITMAP_BITS_PER_SLOT 512

static int cmp_i64(const void *pa, const void *pb) {
    int64_t a = *(const int64_t *)pa, b = *(const int64_t *)pb;
    return a < b ? -1 : a > b;
}

static lk_status dup_slot(int64_t slot) {
    return lk_fail(LK_ERR_INDEX, "slot_mapping: slot %lld is used by more than one token",
                   (long long)slot);
}

/* every slot in [-inf, nslots), each slot >= 0 at most once */
static lk_status check_slots(const lk_tensor *sm, int64_t nslots, int64_t NB, int64_t bs) {
    int64_t N = sm->shape[0], st = sm->stride[0], used = 0;
    for (int64_t t = 0; t < N; t++) {
        int64_t s = lk_load_index(sm->data, sm->dtype, t * st);
        if (s >= nslots)
            return lk_fail(LK_ERR_INDEX,
                           "slot_mapping: slot %lld of token %lld is beyond the cache "
                           "(%lld blocks x %lld = %lld slots)",
                           (long long)s, (long long)t, (long long)NB, (long long)bs,
                           (long long)nslots);
        used += s >= 0;
    }
    if (used <= 1) return LK_OK;
    if (used <= SMALL_N) {
        int64_t v[SMALL_N];
        int n = 0;
        for (int64_t t = 0; t < N; t++) {
            int64_t s = lk_load_index(sm->data, sm->dtype, t * st);
            if (s < 0) continue;
            for (int i = 0; i < n; i++)
                if (v[i] == s) return dup_slot(s);
            v[n++] = s;
        }
        return LK_OK;
    }
    if (nslots / BITMAP_BITS_PER_SLOT <= used) {
        uint64_t *bits = calloc((size_t)(nslots / 64 + 1), sizeof *bits); /* [nslots] bits */
        if (!bits)
            return lk_fail(LK_ERR_NOMEM, "slot_mapping: no memory for the duplicate check");
        for (int64_t t = 0; t < N; t++) {
            int64_t s = lk_load_index(sm->data, sm->dtype, t * st);
            if (s < 0) continue;
            uint64_t m = (uint64_t)1 << (s & 63);
            if (bits[s >> 6] & m) {
                free(bits);
                return dup_slot(s);
            }
            bits[s >> 6] |= m;
        }
        free(bits);
        return LK_OK;
    }
    int64_t *v = malloc((size_t)used * sizeof *v); /* [used] */
    if (!v) return lk_fail(LK_ERR_NOMEM, "slot_mapping: no memory for the duplicate check");
    int64_t n = 0;
    for (int64_t t = 0; t < N; t++) {
        int64_t s = lk_load_index(sm->data, sm->dtype, t * st);
        if (s >= 0) v[n++] = s;
    }
    qsort(v, (size_t)n, sizeof *v, cmp_i64);
    for (int64_t i = 1; i < n; i++)
        if (v[i] == v[i - 1]) {
            int64_t s = v[i];
            free(v);
            return dup_slot(s);
        }
    free(v);
    return LK_OK;
}

static int is_fp8(lk_dtype dt) { return dt == LK_F8E4M3 || dt == LK_F8E5M2; }

/* a cache: f32/f16/bf16, or fp8 where the call has scales */
static lk_status check_cache_view(const lk_tensor *t, const char *name, int fp8_ok) {
    if (fp8_ok && t && lk_dtype_size(t->dtype) && is_fp8(t->dtype)) return lk_check_view(t, name, 4, 4);
    lk_status s = lk_check_float(t, name, 4, 4);
    if (s == LK_ERR_DTYPE && fp8_ok)
        return lk_fail(LK_ERR_DTYPE, "%s: dtype %s not supported (f32, f16, bf16, f8e4m3, f8e5m2)", name,
                       lk_dtype_name(t->dtype));
    return s;
}

static lk_status check_cache(const lk_cache_args *a, int fp8_ok) {
    const lk_tensor *k = &a->k, *v = &a->v, *kc = &a->k_cache, *vc = &a->v_cache;
    const lk_tensor *sm = &a->slot_mapping;
    lk_status s;
    if ((s = lk_check_float(k, "k", 3, 3))) return s;
    if ((s = lk_check_float(v, "v", 3, 3))) return s;
    if ((s = check_cache_view(kc, "k_cache", fp8_ok))) return s;
    if ((s = check_cache_view(vc, "v_cache", fp8_ok))) return s;
    if ((s = lk_check_index(sm, "slot_mapping", 1, 1))) return s;
    if (v->shape[0] != k->shape[0] || v->shape[1] != k->shape[1])
        return lk_fail(LK_ERR_SHAPE, "v: shape %s does not match k %s in [T, H]", lk_shape_str(v),
                       lk_shape_str(k));
    if (kc->shape[2] != k->shape[1] || kc->shape[3] != k->shape[2])
        return lk_fail(LK_ERR_SHAPE, "k_cache: shape %s does not match k %s in [H, D]",
                       lk_shape_str(kc), lk_shape_str(k));
    if (kc->shape[1] < 1)
        return lk_fail(LK_ERR_SHAPE, "k_cache: block_size must be >= 1, shape %s",
                       lk_shape_str(kc));
    if (vc->shape[0] != kc->shape[0] || vc->shape[1] != kc->shape[1] ||
        vc->shape[2] != kc->shape[2])
        return lk_fail(LK_ERR_SHAPE,
                       "v_cache: shape %s does not match k_cache %s in [num_blocks, block_size, H]",
                       lk_shape_str(vc), lk_shape_str(kc));
    if (vc->shape[3] != v->shape[2])
        return lk_fail(LK_ERR_SHAPE, "v_cache: shape %s does not match v %s in D",
                       lk_shape_str(vc), lk_shape_str(v));
    if (sm->shape[0] > k->shape[0])
        return lk_fail(LK_ERR_SHAPE, "slot_mapping: %lld slots for %lld tokens (need N <= T)",
                       (long long)sm->shape[0], (long long)k->shape[0]);
    if ((s = lk_check_no_self_overlap(kc, "k_cache"))) return s;
    if ((s = lk_check_no_self_overlap(vc, "v_cache"))) return s;
    if ((s = lk_check_disjoint(kc, "k_cache", vc, "v_cache"))) return s;
    if ((s = lk_check_disjoint(kc, "k_cache", k, "k"))) return s;
    if ((s = lk_check_disjoint(kc, "k_cache", v, "v"))) return s;
    if ((s = lk_check_disjoint(vc, "v_cache", k, "k"))) return s;
    if ((s = lk_check_disjoint(vc, "v_cache", v, "v"))) return s;
    if ((s = lk_check_disjoint(kc, "k_cache", sm, "slot_mapping"))) return s;
    if ((s = lk_check_disjoint(vc, "v_cache", sm, "slot_mapping"))) return s;
    /* NB * bs cannot overflow: lk_check_view multiplied the shape out */
    return check_slots(sm, kc->shape[0] * kc->shape[1], kc->shape[0], kc->shape[1]);
}

/* both entry points: validation (scales, then tensors; fp8 caches only when `fp8`),
 * nothing written on an error; fp8 caches take the paged kernel (reshape_and_cache_paged) */
static lk_status cache_write(const char *op, const lk_tensor *k, const lk_tensor *v, const lk_tensor *k_cache,
                             const lk_tensor *v_cache, const lk_tensor *slot_mapping, float k_scale, float v_scale,
                             int fp8) {
    lk_clear_error();
    lk_set_op(op);
    if (!k || !v || !k_cache || !v_cache || !slot_mapping)
        return lk_fail(LK_ERR_NULL, "%s: tensor pointer is NULL",
                       !k         ? "k"
                       : !v       ? "v"
                       : !k_cache ? "k_cache"
                       : !v_cache ? "v_cache"
                                  : "slot_mapping");
    if (!(k_scale > 0.0f && k_scale <= 3.40282347e38f))
        return lk_fail(LK_ERR_VALUE, "k_scale: %g, must be finite and > 0", (double)k_scale);
    if (!(v_scale > 0.0f && v_scale <= 3.40282347e38f))
        return lk_fail(LK_ERR_VALUE, "v_scale: %g, must be finite and > 0", (double)v_scale);
    lk_cache_args a = {*k, *v, *k_cache, *v_cache, *slot_mapping, k_scale, v_scale};
    lk_status s = check_cache(&a, fp8);
    if (s) return s;
    if (slot_mapping->shape[0] == 0 || k->shape[1] == 0 || (k->shape[2] == 0 && v->shape[2] == 0))
        return LK_OK;
    if (is_fp8(k_cache->dtype) || is_fp8(v_cache->dtype)) { /* the paged kernel on ND views */
        lk_cache8_args p = {.k = *k, .v = *v, .slot_mapping = *slot_mapping};
        const lk_tensor *c[2] = {k_cache, v_cache};
        lk_paged *pc[2] = {&p.kc, &p.vc};
        for (int i = 0; i < 2; i++) {
            *pc[i] = (lk_paged){0};
            pc[i]->data = c[i]->data, pc[i]->dtype = c[i]->dtype, pc[i]->layout = LK_KV_ND;
            pc[i]->num_blocks = c[i]->shape[0], pc[i]->block_size = c[i]->shape[1];
            pc[i]->H = c[i]->shape[2], pc[i]->D = c[i]->shape[3];
            pc[i]->s0 = c[i]->stride[0], pc[i]->s1 = c[i]->stride[1];
            pc[i]->s2 = c[i]->stride[2], pc[i]->s3 = c[i]->stride[3];
            pc[i]->tile = 16; /* ND: unused */
            lk_paged_drop_unit_strides(pc[i]);
        }
        p.ks = (lk_scale){&k_scale, 0, 0};
        p.vs = (lk_scale){&v_scale, 0, 0};
        return lk_kernels()->reshape_and_cache_paged(&p);
    }
    return lk_kernels()->reshape_and_cache_flash(&a);
}

lk_status lk_reshape_and_cache_flash(const lk_tensor *k, const lk_tensor *v, const lk_tensor *k_cache,
                                     const lk_tensor *v_cache, const lk_tensor *slot_mapping) {
    return cache_write("lk_reshape_and_cache_flash", k, v, k_cache, v_cache, slot_mapping, 1.0f, 1.0f, 0);
}

lk_status lk_reshape_and_cache_flash_scaled(const lk_tensor *k, const lk_tensor *v, const lk_tensor *k_cache,
                                            const lk_tensor *v_cache, const lk_tensor *slot_mapping,
                                            float k_scale, float v_scale) {
    return cache_write("lk_reshape_and_cache_flash_scaled", k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale,
                       1);
}

/* ---------------------------------------------------------------- fp8 entry (since 0.3) */

static lk_status check_cache8(lk_cache8_args *a, const lk_tensor *kc, const lk_tensor *vc, const lk_tensor *kst,
                              const lk_tensor *vst, lk_kv_layout layout) {
    const lk_tensor *k = &a->k, *v = &a->v, *sm = &a->slot_mapping;
    lk_status s;
    if ((s = lk_check_float(k, "k", 3, 3))) return s;
    if ((s = lk_check_float(v, "v", 3, 3))) return s;
    if ((s = lk_check_index(sm, "slot_mapping", 1, 1))) return s;
    if (v->shape[0] != k->shape[0] || v->shape[1] != k->shape[1])
        return lk_fail(LK_ERR_SHAPE, "v: shape %s does not match k %s in [T, H]", lk_shape_str(v),
                       lk_shape_str(k));
    if (sm->shape[0] > k->shape[0])
        return lk_fail(LK_ERR_SHAPE, "slot_mapping: %lld slots for %lld tokens (need N <= T)",
                       (long long)sm->shape[0], (long long)k->shape[0]);
    int64_t H = k->shape[1];
    if ((s = lk_paged_init8(&a->kc, kc, layout, H, k->shape[2], "k_cache"))) return s;
    if ((s = lk_paged_init8(&a->vc, vc, layout, H, v->shape[2], "v_cache"))) return s;
    if (a->kc.block_size < 1 && a->kc.num_blocks > 0)
        return lk_fail(LK_ERR_SHAPE, "k_cache: block_size must be >= 1, shape %s", lk_shape_str(kc));
    if (a->vc.num_blocks != a->kc.num_blocks || a->vc.block_size != a->kc.block_size)
        return lk_fail(LK_ERR_SHAPE, "v_cache: shape %s does not match k_cache %s in num_blocks and block_size",
                       lk_shape_str(vc), lk_shape_str(kc));
    if ((s = lk_scale_init(&a->ks, kst, -1, H, "k_scale"))) return s;
    if ((s = lk_scale_init(&a->vs, vst, -1, H, "v_scale"))) return s;
    if ((s = lk_check_no_self_overlap(kc, "k_cache"))) return s;
    if ((s = lk_check_no_self_overlap(vc, "v_cache"))) return s;
    if ((s = lk_check_disjoint(kc, "k_cache", vc, "v_cache"))) return s;
    const lk_tensor *in[3] = {k, v, sm};
    const char *inn[3] = {"k", "v", "slot_mapping"};
    for (int i = 0; i < 3; i++) {
        if ((s = lk_check_disjoint(kc, "k_cache", in[i], inn[i]))) return s;
        if ((s = lk_check_disjoint(vc, "v_cache", in[i], inn[i]))) return s;
    }
    for (int i = 0; i < 2; i++) {
        const lk_tensor *st = i ? vst : kst;
        if (!st) continue;
        if ((s = lk_check_disjoint(kc, "k_cache", st, i ? "v_scale" : "k_scale"))) return s;
        if ((s = lk_check_disjoint(vc, "v_cache", st, i ? "v_scale" : "k_scale"))) return s;
    }
    int64_t NB = a->kc.num_blocks, bs = a->kc.block_size;
    return check_slots(sm, NB * bs, NB, bs);
}

lk_status lk_reshape_and_cache_flash_fp8(const lk_tensor *k, const lk_tensor *v, const lk_tensor *k_cache,
                                         const lk_tensor *v_cache, const lk_tensor *slot_mapping,
                                         const lk_tensor *k_scale, const lk_tensor *v_scale, lk_kv_layout layout) {
    lk_clear_error();
    lk_set_op("lk_reshape_and_cache_flash_fp8");
    if (!k || !v || !k_cache || !v_cache || !slot_mapping)
        return lk_fail(LK_ERR_NULL, "%s: tensor pointer is NULL",
                       !k         ? "k"
                       : !v       ? "v"
                       : !k_cache ? "k_cache"
                       : !v_cache ? "v_cache"
                                  : "slot_mapping");
    lk_cache8_args a;
    a.k = *k, a.v = *v, a.slot_mapping = *slot_mapping;
    lk_status s = check_cache8(&a, k_cache, v_cache, k_scale, v_scale, layout);
    if (s) return s;
    if (slot_mapping->shape[0] == 0 || k->shape[1] == 0 || (k->shape[2] == 0 && v->shape[2] == 0))
        return LK_OK;
    return lk_kernels()->reshape_and_cache_paged(&a);
}
