/*
 * reshape_and_cache_flash, scalar reference.
 *
 *   for t < N with slot = slot_mapping[t] >= 0, b = slot / bs, o = slot % bs:
 *     k_cache[b, o, h, d] = round(k[t, h, d]),  v_cache[b, o, h, d] = round(v[t, h, d])
 *
 * Shapes: k [T, H, Dk], v [T, H, Dv], k_cache [NB, bs, H, Dk], v_cache [NB, bs, H, Dv],
 * slot_mapping [N], every stride honoured. Same dtype: the element's bits are copied
 * (NaN payloads included); otherwise one rounding f32 -> cache dtype (f16 and bf16
 * widen to f32 exactly). An fp8 cache stores fp8(x / scale) (one f32 division, then the
 * saturating converter of src/core/fp8.h). No threads; slots were validated (in range,
 * distinct).
 */
#include <string.h>

#include "../../core/half.h"
#include "../kernels.h"

/* dst[b, o, :, :] = src[t, :, :] */
static void copy_token(const lk_tensor *dst, const lk_tensor *src, int64_t t, int64_t b,
                       int64_t o, float scale) {
    int64_t H = src->shape[1], D = src->shape[2];
    if (D == 0) return; /* k or v is empty (Dk or Dv = 0): its strides were never validated */
    int64_t es = (int64_t)lk_dtype_size(src->dtype), ss = src->stride[2], ds = dst->stride[3];
    int fp8 = dst->dtype == LK_F8E4M3 || dst->dtype == LK_F8E5M2;
    for (int64_t h = 0; h < H; h++) {
        const char *s = lk_at(src, t * src->stride[0] + h * src->stride[1]); // [D] stride ss
        char *d = lk_at(dst, b * dst->stride[0] + o * dst->stride[1] + h * dst->stride[2]); // [D] stride ds
        for (int64_t i = 0; i < D; i++) {
            if (src->dtype == dst->dtype) memcpy(d + i * ds * es, s + i * ss * es, (size_t)es);
            else if (fp8) lk_store_f(d, dst->dtype, i * ds, lk_load_f(s, src->dtype, i * ss) / scale);
            else lk_store_f(d, dst->dtype, i * ds, lk_load_f(s, src->dtype, i * ss));
        }
    }
}

lk_status lk_ref_reshape_and_cache_flash(const lk_cache_args *a) {
    const lk_tensor *sm = &a->slot_mapping; // [N]
    int64_t N = sm->shape[0], bs = a->k_cache.shape[1];
    for (int64_t t = 0; t < N; t++) {
        int64_t slot = lk_load_index(sm->data, sm->dtype, t * sm->stride[0]);
        if (slot < 0) continue; /* padding */
        copy_token(&a->k_cache, &a->k, t, slot / bs, slot % bs, a->k_scale);
        copy_token(&a->v_cache, &a->v, t, slot / bs, slot % bs, a->v_scale);
    }
    return LK_OK;
}

/* ---------------------------------------------------------------- paged caches (fp8)
 *
 *   cache(slot / bs, slot % bs, h, d) = fp8(x[t, h, d] / scale(h))   fp8 cache
 *                                     = round(x[t, h, d])            other dtypes
 *
 * for k and v alike; every cache element addressed through lk_paged_off (ND or NZ, any
 * strides), so NZ and ND hold the same values bit for bit. */

/* entry (page, o) of pc = src[t, :, :] */
static void put_token(const lk_paged *pc, const lk_tensor *src, const lk_scale *sc, int64_t t, int64_t page,
                      int64_t o) {
    int64_t H = src->shape[1], D = src->shape[2];
    if (D == 0) return; /* strides of an empty k / v were never validated */
    size_t es = lk_dtype_size(pc->dtype);
    int fp8 = pc->dtype == LK_F8E4M3 || pc->dtype == LK_F8E5M2;
    for (int64_t h = 0; h < H; h++) {
        float scale = lk_scale_at(sc, 0, h);
        for (int64_t d = 0; d < D; d++) {
            int64_t co = lk_paged_off(pc, page, o, h, d); // cache element
            int64_t so = t * src->stride[0] + h * src->stride[1] + d * src->stride[2];
            if (src->dtype == pc->dtype) memcpy((char *)pc->data + co * (int64_t)es, lk_at(src, so), es);
            else if (fp8) lk_store_f(pc->data, pc->dtype, co, lk_load_f(src->data, src->dtype, so) / scale);
            else lk_store_f(pc->data, pc->dtype, co, lk_load_f(src->data, src->dtype, so));
        }
    }
}

lk_status lk_ref_reshape_and_cache_paged(const lk_cache8_args *a) {
    const lk_tensor *sm = &a->slot_mapping; // [N]
    int64_t N = sm->shape[0], bs = a->kc.block_size;
    for (int64_t t = 0; t < N; t++) {
        int64_t slot = lk_load_index(sm->data, sm->dtype, t * sm->stride[0]);
        if (slot < 0) continue; /* padding */
        put_token(&a->kc, &a->k, &a->ks, t, slot / bs, slot % bs);
        put_token(&a->vc, &a->v, &a->vs, t, slot / bs, slot % bs);
    }
    return LK_OK;
}
