/* TEMPORARY stand-ins for the shared fp8 infrastructure (lk_scale, lk_check_float8,
 * lk_is_fp8, lk_paged_init8); removed when those land in src/core. */
#ifndef LK_FP8_ATTN_SHIM_H
#define LK_FP8_ATTN_SHIM_H
#include <math.h>
#include "../core/core.h"
#include "../core/paged.h"

static inline int lk_is_fp8(lk_dtype dt) { return dt == LK_F8E4M3 || dt == LK_F8E5M2; }
static inline lk_status lk_check_float8(const lk_tensor *t, const char *name, int min_nd, int max_nd) {
    lk_status s = lk_check_view(t, name, min_nd, max_nd);
    if (s) return s;
    if (t->dtype != LK_F32 && t->dtype != LK_F16 && t->dtype != LK_BF16 && !lk_is_fp8(t->dtype))
        return lk_fail(LK_ERR_DTYPE, "%s: dtype %s not supported (f32, f16, bf16, f8e4m3, f8e5m2)", name,
                       lk_dtype_name(t->dtype));
    return LK_OK;
}
typedef struct { const float *p; int64_t sb, sh; } lk_scale;
static inline float lk_scale_at(const lk_scale *s, int64_t b, int64_t h) { return s->p[b * s->sb + h * s->sh]; }
static const float lk_shim_one = 1.0f;
static inline lk_status lk_scale_init(lk_scale *s, const lk_tensor *t, int64_t B, int64_t H, const char *name) {
    *s = (lk_scale){&lk_shim_one, 0, 0};
    if (!t) return LK_OK;
    lk_status st = lk_check_view(t, name, 0, 2);
    if (st) return st;
    if (t->dtype != LK_F32) return lk_fail(LK_ERR_DTYPE, "%s: must be f32, got %s", name, lk_dtype_name(t->dtype));
    int64_t nb = 1, nh = 1, sb = 0, sh = 0;
    if (t->ndim == 1 && t->shape[0] == 1) ;
    else if (t->ndim == 1 && t->shape[0] == H) nh = H, sh = t->stride[0];
    else if (t->ndim == 2 && B >= 0 && t->shape[0] == B && t->shape[1] == H) nb = B, nh = H, sb = t->stride[0], sh = t->stride[1];
    else if (t->ndim != 0)
        return lk_fail(LK_ERR_SHAPE, "%s: shape %s, expected [], [1], [%lld] or [%lld, %lld]", name, lk_shape_str(t),
                       (long long)H, (long long)B, (long long)H);
    const float *p = t->data;
    for (int64_t b = 0; b < nb; b++)
        for (int64_t h = 0; h < nh; h++) {
            float v = p[b * sb + h * sh];
            if (!(v > 0) || isinf(v))
                return lk_fail(LK_ERR_VALUE, "%s[%lld]: value %g must be finite and > 0", name,
                               (long long)(b * nh + h), (double)v);
        }
    *s = (lk_scale){p, sb, sh};
    return LK_OK;
}
/* ND fp8 caches only until the 32-wide NZ tile lands in paged.h */
static inline lk_status lk_paged_init8(lk_paged *pc, const lk_tensor *t, lk_kv_layout layout, int64_t H,
                                       int64_t D, const char *name) {
    if (!t || !lk_is_fp8(t->dtype)) return lk_paged_init(pc, t, layout, H, D, name);
    if (layout == LK_KV_NZ) return lk_fail(LK_ERR_DTYPE, "%s: fp8 NZ caches not yet", name);
    lk_tensor c = *t;
    c.dtype = LK_BF16;
    lk_status s = lk_paged_init(pc, &c, layout, H, D, name);
    pc->dtype = t->dtype;
    return s;
}
#endif
