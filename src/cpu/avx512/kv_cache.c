/*
 * reshape_and_cache_flash, AVX-512 (F/BW/DQ/VL). Mirrors avx2/kv_cache.c: same shapes,
 * layouts, work split, rounding and streaming-store threshold; 16 lanes with a masked
 * tail for conversions, 64-byte streaming stores.
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
 * 32 elements per step plus a masked tail.
 *
 * Variants of the byte copy: memcpy, or, when one call writes at least
 * LK_KV_STREAM_BYTES of cache rows (long prefill), streaming stores: rows land at
 * random slots, so ordinary stores start every row with read-for-ownership misses
 * (see avx2/kv_cache.c for the measurement and the threshold's reason).
 */
#include <string.h>

#include "../kernels.h"
#include "simd.h"

/* cache bytes written by one call from which same-dtype rows use streaming stores */
#define LK_KV_STREAM_BYTES ((int64_t)8 << 20)

typedef struct {
    const lk_cache_args *a;
    int stream; /* same-dtype rows with streaming stores */
} cache_ctx;

/* d[0, n) = s[0, n): streaming stores for the 64-byte aligned body */
static inline void copy_bytes_stream(char *d, const char *s, size_t n) {
    size_t head = (size_t)(-(uintptr_t)d & 63), i = 0;
    if (head > n) head = n;
    memcpy(d, s, head);
    d += head, s += head, n -= head;
    for (; i + 256 <= n; i += 256) {
        __m512i x0 = _mm512_loadu_si512(s + i), x1 = _mm512_loadu_si512(s + i + 64);
        __m512i x2 = _mm512_loadu_si512(s + i + 128), x3 = _mm512_loadu_si512(s + i + 192);
        _mm512_stream_si512((void *)(d + i), x0);
        _mm512_stream_si512((void *)(d + i + 64), x1);
        _mm512_stream_si512((void *)(d + i + 128), x2);
        _mm512_stream_si512((void *)(d + i + 192), x3);
    }
    for (; i + 64 <= n; i += 64) _mm512_stream_si512((void *)(d + i), _mm512_loadu_si512(s + i));
    memcpy(d + i, s + i, n - i);
}

/* d[0, n) = round(s[0, n)) */
static inline void copy_row(char *d, lk_dtype dt, const char *s, lk_dtype st, int64_t n,
                            int stream) {
    if (dt == st) {
        if (stream) copy_bytes_stream(d, s, (size_t)n * lk_dtype_size(dt));
        else memcpy(d, s, (size_t)n * lk_dtype_size(dt));
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
                              int64_t o, int stream) {
    int64_t H = src->shape[1], D = src->shape[2];
    if (D == 0) return; /* k or v is empty (Dk or Dv = 0): its strides were never validated */
    const char *s = lk_at(src, t * src->stride[0]);                // [H, D]
    char *d = lk_at(dst, b * dst->stride[0] + o * dst->stride[1]); // [H, D]
    if (H == 1 || (src->stride[1] == D && dst->stride[2] == D)) {
        copy_row(d, dst->dtype, s, src->dtype, H * D, stream);
        return;
    }
    int64_t sh = src->stride[1] * (int64_t)lk_dtype_size(src->dtype);
    int64_t dh = dst->stride[2] * (int64_t)lk_dtype_size(dst->dtype);
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
    if (c->stream) _mm_sfence(); /* streamed rows visible before the threads join */
}

static int unit_last(const lk_tensor *t) {
    return t->shape[t->ndim - 1] <= 1 || t->stride[t->ndim - 1] == 1;
}

lk_status lk_avx512_reshape_and_cache_flash(const lk_cache_args *a) {
    if (!unit_last(&a->k) || !unit_last(&a->v) || !unit_last(&a->k_cache) ||
        !unit_last(&a->v_cache))
        return lk_ref_reshape_and_cache_flash(a);
    int64_t N = a->slot_mapping.shape[0], H = a->k.shape[1];
    int64_t Dk = a->k.shape[2], Dv = a->v.shape[2];
    int64_t wbytes = H * (Dk * (int64_t)lk_dtype_size(a->k_cache.dtype) +
                          Dv * (int64_t)lk_dtype_size(a->v_cache.dtype)); /* per token */
    int64_t rbytes = H * (Dk * (int64_t)lk_dtype_size(a->k.dtype) +
                          Dv * (int64_t)lk_dtype_size(a->v.dtype));
    cache_ctx c = {a, wbytes >= LK_KV_STREAM_BYTES / N};
    lk_parallel_for(N, rbytes + wbytes, cache_tokens, &c);
    return LK_OK;
}
