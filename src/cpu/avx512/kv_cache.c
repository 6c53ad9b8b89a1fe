/*
 * reshape_and_cache_flash, AVX-512 (F/BW/DQ/VL).
 *
 *   k_cache[slot / bs, slot % bs, h, d] = round(k[t, h, d])   for t < N, slot >= 0
 *   v_cache[slot / bs, slot % bs, h, d] = round(v[t, h, d])   (slot = slot_mapping[t])
 *
 * Same shapes, layouts, work split and rounding as avx2/kv_cache.c: tokens across
 * threads, one H*D row per token and tensor when [H, D] is contiguous on both sides,
 * else H rows of D; memcpy for equal dtypes, else 16-lane convert with a masked tail.
 * Fast path needs last-dim stride 1 (or D <= 1) on all four tensors; other layouts go
 * to the reference.
 */
#include <string.h>

#include "../kernels.h"
#include "simd.h"

/* d[0, n) = round(s[0, n)) */
static inline void copy_row(char *d, lk_dtype dt, const char *s, lk_dtype st, int64_t n) {
    if (dt == st) {
        memcpy(d, s, (size_t)n * lk_dtype_size(dt));
        return;
    }
    size_t des = lk_dtype_size(dt), ses = lk_dtype_size(st);
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 a = lk16_load(s + i * ses, st, 16), b = lk16_load(s + (i + 16) * ses, st, 16);
        lk16_store(d + i * des, dt, a, 16);
        lk16_store(d + (i + 16) * des, dt, b, 16);
    }
    for (; i < n; i += 16) lk16_store(d + i * des, dt, lk16_load(s + i * ses, st, n - i), n - i);
}

/* dst[b, o, :, :] = src[t, :, :]; last-dim strides are 1 (or D <= 1) */
static inline void copy_token(const lk_tensor *dst, const lk_tensor *src, int64_t t, int64_t b,
                              int64_t o) {
    int64_t H = src->shape[1], D = src->shape[2];
    const char *s = lk_at(src, t * src->stride[0]);                      // [H, D]
    char *d = lk_at(dst, b * dst->stride[0] + o * dst->stride[1]);       // [H, D]
    if (H == 1 || (src->stride[1] == D && dst->stride[2] == D)) {
        copy_row(d, dst->dtype, s, src->dtype, H * D);
        return;
    }
    int64_t sh = src->stride[1] * (int64_t)lk_dtype_size(src->dtype);
    int64_t dh = dst->stride[2] * (int64_t)lk_dtype_size(dst->dtype);
    for (int64_t h = 0; h < H; h++) copy_row(d + h * dh, dst->dtype, s + h * sh, src->dtype, D);
}

static void cache_tokens(void *ctx, int64_t t0, int64_t t1) {
    const lk_cache_args *a = ctx;
    const lk_tensor *sm = &a->slot_mapping; // [N]
    int64_t bs = a->k_cache.shape[1];
    for (int64_t t = t0; t < t1; t++) {
        int64_t slot = lk_load_index(sm->data, sm->dtype, t * sm->stride[0]);
        if (slot < 0) continue; /* padding */
        copy_token(&a->k_cache, &a->k, t, slot / bs, slot % bs);
        copy_token(&a->v_cache, &a->v, t, slot / bs, slot % bs);
    }
}

static int unit_last(const lk_tensor *t) {
    return t->shape[t->ndim - 1] <= 1 || t->stride[t->ndim - 1] == 1;
}

lk_status lk_avx512_reshape_and_cache_flash(const lk_cache_args *a) {
    if (!unit_last(&a->k) || !unit_last(&a->v) || !unit_last(&a->k_cache) || !unit_last(&a->v_cache))
        return lk_ref_reshape_and_cache_flash(a);
    int64_t H = a->k.shape[1], Dk = a->k.shape[2], Dv = a->v.shape[2];
    int64_t bytes = H * (Dk * (int64_t)(lk_dtype_size(a->k.dtype) + lk_dtype_size(a->k_cache.dtype)) +
                         Dv * (int64_t)(lk_dtype_size(a->v.dtype) + lk_dtype_size(a->v_cache.dtype)));
    lk_parallel_for(a->slot_mapping.shape[0], bytes, cache_tokens, (void *)a);
    return LK_OK;
}
