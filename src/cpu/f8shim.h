/* TEMPORARY stand-in for the contract's core.h scale helpers until main has them. */
#ifndef LK_F8SHIM_H
#define LK_F8SHIM_H
#include <math.h>
#include "../core/core.h"
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
static inline lk_status lk_scale_check_value(float v, const char *name) {
    if (!(v > 0.0f && v <= 3.40282347e38f))
        return lk_fail(LK_ERR_VALUE, "%s: value %g must be finite and > 0", name, (double)v);
    return LK_OK;
}
static inline lk_status lk_scale_init(lk_scale *s, const lk_tensor *t, int64_t B, int64_t H, const char *name) {
    static const float one = 1.0f;
    if (!t) { *s = (lk_scale){&one, 0, 0}; return LK_OK; }
    lk_status st = lk_check_view(t, name, 0, 2);
    if (st) return st;
    if (t->dtype != LK_F32) return lk_fail(LK_ERR_DTYPE, "%s: dtype %s not supported (f32)", name, lk_dtype_name(t->dtype));
    int64_t n = lk_numel(t);
    if (t->ndim == 0 || (t->ndim == 1 && t->shape[0] == 1)) *s = (lk_scale){t->data, 0, 0};
    else if (t->ndim == 1 && t->shape[0] == H) *s = (lk_scale){t->data, 0, t->stride[0]};
    else if (t->ndim == 2 && B >= 0 && t->shape[0] == B && t->shape[1] == H) *s = (lk_scale){t->data, t->stride[0], t->stride[1]};
    else return lk_fail(LK_ERR_SHAPE, "%s: shape %s, expected [], [1] or [%lld]", name, lk_shape_str(t), (long long)H);
    (void)n;
    int64_t nb = s->sb ? B : 1, nh = s->sh ? H : 1;
    for (int64_t b = 0; b < nb; b++)
        for (int64_t h = 0; h < nh; h++) {
            float v = lk_scale_at(s, b, h);
            if (!(v > 0.0f && v <= 3.40282347e38f))
                return lk_fail(LK_ERR_VALUE, "%s[%lld]: value %g must be finite and > 0", name, (long long)(b * nh + h), (double)v);
        }
    return LK_OK;
}
#include "../core/paged.h"
static inline lk_status lk_paged_init8(lk_paged *pc, const lk_tensor *t, lk_kv_layout layout, int64_t H, int64_t D, const char *name) {
    if (t && layout == LK_KV_ND && lk_dtype_size(t->dtype) == 1) {
        lk_tensor u = *t; u.dtype = LK_BF16;
        lk_status s = lk_paged_init(pc, &u, layout, H, D, name);
        pc->dtype = t->dtype;
        return s;
    }
    return lk_paged_init(pc, t, layout, H, D, name);
}
#define PTILE(pc) 16 /* TEMPORARY */
#endif
