/*
 * reshape_and_cache_flash, every vector ISA (src/cpu/vec/lkv.h, W lanes).
 *
 *   k_cache[slot / bs, slot % bs, h, d] = round(k[t, h, d])   for t < N, slot >= 0
 *   v_cache[slot / bs, slot % bs, h, d] = round(v[t, h, d])   (slot = slot_mapping[t])
 *
 * Shapes: k [T, H, Dk], v [T, H, Dv], k_cache [NB, bs, H, Dk], v_cache [NB, bs, H, Dv],
 * slot_mapping [N]. Fast path needs last-dim stride 1 (or D <= 1) on all four tensors;
 * other layouts go to the reference. Work split: tokens, contiguous chunks per thread
 * (lk_parallel_for); slots were validated distinct, so tokens write disjoint rows.
 * Per token and tensor: one H*D row when both source and cache hold [H, D] contiguous
 * (ND caches), else H rows of D (HND caches, strided heads). A row is a byte copy when
 * source and cache share a dtype (bit-exact), else a load-as-f32 / round-once store,
 * 2W elements per step plus a partial tail.
 *
 * Variants of the byte copy: memcpy, or, when one call writes at least
 * LK_KV_STREAM_BYTES of cache rows (long prefill), streaming stores. Rows land at
 * random slots, so with ordinary stores every row starts with read-for-ownership
 * misses the prefetchers cannot predict; streaming stores skip them (1.6-1.7x measured
 * on Zen3 at 4096+ tokens) at the price of leaving the rows out of cache, which only
 * matters below the last-level cache size, hence the threshold.
 */
#include <string.h>

#include "fp8_store.h"

/* cache bytes written by one call from which same-dtype rows use streaming stores */
#define LK_KV_STREAM_BYTES ((int64_t)8 << 20)

typedef struct {
    const lk_cache_args *a;
    int stream; /* same-dtype rows with streaming stores */
} cache_ctx;

/* d[0, n) = round(s[0, n)) */
static inline void copy_row(char *d, lk_dtype dt, const char *s, lk_dtype st, int64_t n, int stream) {
    if (dt == st) {
        if (stream) lkv_copy_bytes(d, s, (size_t)(n * lk_esize(dt)), 1);
        else memcpy(d, s, (size_t)(n * lk_esize(dt)));
        return;
    }
    int64_t des = lk_esize(dt), ses = lk_esize(st), i = 0;
    for (; i + 2 * LKV_W <= n; i += 2 * LKV_W) {
        lkv_f32 a = lkv_load(s + i * ses, st), b = lkv_load(s + (i + LKV_W) * ses, st);
        lkv_store(d + i * des, dt, a);
        lkv_store(d + (i + LKV_W) * des, dt, b);
    }
    for (; i + LKV_W <= n; i += LKV_W) lkv_store(d + i * des, dt, lkv_load(s + i * ses, st));
    if (i < n) lkv_store_part(d + i * des, dt, lkv_load_part(s + i * ses, st, n - i), n - i);
}

/* dst[b, o, :, :] = src[t, :, :]; last-dim strides are 1 (or D <= 1) */
static inline void copy_token(const lk_tensor *dst, const lk_tensor *src, int64_t t, int64_t b,
                              int64_t o, int stream) {
    int64_t H = src->shape[1], D = src->shape[2];
    if (D == 0) return; /* k or v is empty (Dk or Dv = 0): its strides were never validated */
    const char *s = lk_at(src, t * src->stride[0]);                // [H, D]
    char *d = lk_at(dst, b * dst->stride[0] + o * dst->stride[1]); // [H, D]
    if (H == 1 || (src->stride[1] == D && dst->stride[2] == D)) {
        copy_row(d, dst->dtype, s, src->dtype, H * D, stream);
        return;
    }
    int64_t sh = src->stride[1] * lk_esize(src->dtype), dh = dst->stride[2] * lk_esize(dst->dtype);
    for (int64_t h = 0; h < H; h++)
        copy_row(d + h * dh, dst->dtype, s + h * sh, src->dtype, D, stream);
}

static void cache_tokens(void *ctx, int64_t t0, int64_t t1) {
    const cache_ctx *c = ctx;
    const lk_cache_args *a = c->a;
    const lk_tensor *sm = &a->slot_mapping; // [N]
    int64_t bs = a->k_cache.shape[1];
    for (int64_t t = t0; t < t1; t++) {
        int64_t slot = lk_load_index(sm->data, sm->dtype, t * sm->stride[0]);
        if (slot < 0) continue; /* padding */
        copy_token(&a->k_cache, &a->k, t, slot / bs, slot % bs, c->stream);
        copy_token(&a->v_cache, &a->v, t, slot / bs, slot % bs, c->stream);
    }
    if (c->stream) lkv_sfence(); /* streamed rows visible before the threads join */
}

static int unit_last(const lk_tensor *t) {
    return t->shape[t->ndim - 1] <= 1 || t->stride[t->ndim - 1] == 1;
}

static lk_status reshape_and_cache_flash(const lk_cache_args *a) {
    if (!unit_last(&a->k) || !unit_last(&a->v) || !unit_last(&a->k_cache) ||
        !unit_last(&a->v_cache))
        return lk_ref_reshape_and_cache_flash(a);
    int64_t N = a->slot_mapping.shape[0], H = a->k.shape[1];
    int64_t Dk = a->k.shape[2], Dv = a->v.shape[2];
    int64_t wbytes = H * (Dk * lk_esize(a->k_cache.dtype) + Dv * lk_esize(a->v_cache.dtype)); /* per token */
    int64_t rbytes = H * (Dk * lk_esize(a->k.dtype) + Dv * lk_esize(a->v.dtype));
    cache_ctx c = {a, wbytes >= LK_KV_STREAM_BYTES / N};
    lk_parallel_for(N, rbytes + wbytes, cache_tokens, &c);
    return LK_OK;
}

/* ---------------------------------------------------------------- paged caches (fp8)
 *
 * reshape_and_cache_paged (formula in ref/kv_cache.c): sources with last-dim stride 1
 * (or D <= 1) and caches with unit element stride s3 (or one element per run); others go
 * to the reference. Per token and head, the entry is written in runs where both sides
 * advance by one element: a whole head in ND, the rest of a tile row in NZ (16 wide, 32
 * for 1-byte caches). A run into an fp8 cache is W lanes loaded as f32, divided by the
 * head's scale (IEEE division, as the reference) and stored through lkv_store (round to
 * nearest even, saturating: bit-identical to src/core/fp8.h); same dtype is a byte copy;
 * else one rounding. Work split: tokens over threads as above (distinct slots). */

/* d[0, n) = fp8(s[0, n) / scale) into an fp8 dt, else round(s[0, n)) */
static inline void put_run(char *d, lk_dtype dt, const char *s, lk_dtype st, int64_t n, float scale) {
    if (dt != LK_F8E4M3 && dt != LK_F8E5M2) {
        copy_row(d, dt, s, st, n, 0);
        return;
    }
    lkq_fp8_row(d, dt, s, st, n, scale);
}

/* entry (page, o) of pc = src[t, :, :] */
static inline void put_token(const lk_paged *pc, const lk_tensor *src, const lk_scale *sc, int64_t t, int64_t page,
                             int64_t o) {
    int64_t H = src->shape[1], D = src->shape[2], ces = lk_esize(pc->dtype), ses = lk_esize(src->dtype);
    if (D == 0) return; /* strides of an empty k / v were never validated */
    int nz = pc->layout == LK_KV_NZ;
    for (int64_t h = 0; h < H; h++) {
        float scale = lk_scale_at(sc, 0, h);
        const char *s = (const char *)src->data + (t * src->stride[0] + h * src->stride[1]) * ses; // [D]
        for (int64_t d = 0, n; d < D; d += n) {
            int64_t c = h * pc->D + d;
            n = nz ? pc->tile - c % pc->tile : D - d;
            if (n > D - d) n = D - d;
            put_run((char *)pc->data + lk_paged_off(pc, page, o, h, d) * ces, pc->dtype, s + d * ses, src->dtype, n,
                    scale);
        }
    }
}

static void paged_tokens(void *ctx, int64_t t0, int64_t t1) {
    const lk_cache8_args *a = ctx;
    const lk_tensor *sm = &a->slot_mapping; // [N]
    int64_t bs = a->kc.block_size;
    for (int64_t t = t0; t < t1; t++) {
        int64_t slot = lk_load_index(sm->data, sm->dtype, t * sm->stride[0]);
        if (slot < 0) continue; /* padding */
        put_token(&a->kc, &a->k, &a->ks, t, slot / bs, slot % bs);
        put_token(&a->vc, &a->v, &a->vs, t, slot / bs, slot % bs);
    }
}

/* runs of pc are unit-stride (s3 == 1), or every run is one element */
static int unit_runs(const lk_paged *pc) {
    int64_t run = pc->layout == LK_KV_NZ ? (pc->tile < pc->D ? pc->tile : pc->D) : pc->D;
    return pc->s3 == 1 || run <= 1;
}

static lk_status reshape_and_cache_paged(const lk_cache8_args *a) {
    if (!unit_last(&a->k) || !unit_last(&a->v) || !unit_runs(&a->kc) || !unit_runs(&a->vc))
        return lk_ref_reshape_and_cache_paged(a);
    int64_t N = a->slot_mapping.shape[0], H = a->k.shape[1], Dk = a->k.shape[2], Dv = a->v.shape[2];
    int64_t bytes = H * (Dk * (lk_esize(a->kc.dtype) + lk_esize(a->k.dtype)) +
                         Dv * (lk_esize(a->vc.dtype) + lk_esize(a->v.dtype))); /* per token */
    lk_parallel_for(N, bytes, paged_tokens, (void *)a);
    return LK_OK;
}

void LKV_FN(register_kv_cache)(lk_kernel_table *t) {
    t->reshape_and_cache_flash = reshape_and_cache_flash;
    t->reshape_and_cache_paged = reshape_and_cache_paged;
}
