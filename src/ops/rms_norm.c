/*
 * Public entry points lk_rms_norm and lk_fused_add_rms_norm: validation (before any
 * store), then the kernel of the ISA in use. Contract in include/llmkern.h.
 */
#include <math.h>

#include "../cpu/kernels.h"

/* w == NULL (weightless RMSNorm): the kernels see a broadcast view of 1.0 (stride 0),
 * so out = x * rsqrt(mean(x^2) + eps) * 1, bit for bit the product without a weight */
static float lk_unit_weight = 1.0f;

static lk_tensor unit_weight(int64_t D) {
    lk_tensor w = lk_tensor_make(&lk_unit_weight, LK_F32, 1, (int64_t[]){D});
    w.stride[0] = 0;
    return w;
}

static lk_status check_weight(const lk_tensor *w, int64_t D, float eps) {
    lk_status s = lk_check_float(w, "w", 1, 1);
    if (s) return s;
    if (w->shape[0] != D)
        return lk_fail(LK_ERR_SHAPE, "w: shape %s does not match last dim of x (%lld)",
                       lk_shape_str(w), (long long)D);
    if (!(eps >= 0.0f) || isinf(eps))
        return lk_fail(LK_ERR_VALUE, "eps: must be finite and >= 0, got %g", (double)eps);
    return LK_OK;
}

static lk_status check_rms_norm(const lk_rms_norm_args *a) {
    lk_status s;
    if ((s = lk_check_float(&a->x, "x", 1, LK_MAX_DIMS))) return s;
    if ((s = lk_check_float(&a->out, "out", 1, LK_MAX_DIMS))) return s;
    if ((s = lk_check_same_shape(&a->out, "out", &a->x, "x"))) return s;
    if ((s = check_weight(&a->w, a->x.shape[a->x.ndim - 1], a->eps))) return s;
    if ((s = lk_check_no_self_overlap(&a->out, "out"))) return s;
    if (!lk_same_view(&a->out, &a->x) && (s = lk_check_disjoint(&a->out, "out", &a->x, "x")))
        return s;
    if ((s = lk_check_disjoint(&a->out, "out", &a->w, "w"))) return s;
    return LK_OK;
}

lk_status lk_rms_norm(const lk_tensor *out, const lk_tensor *x, const lk_tensor *w, float eps,
                      int gemma) {
    lk_clear_error();
    lk_set_op("lk_rms_norm");
    if (!out || !x) return lk_fail(LK_ERR_NULL, "%s: tensor pointer is NULL", !out ? "out" : "x");
    lk_rms_norm_args a = {*out, *x, {0}, eps, w ? gemma : 0};
    if (w) a.w = *w;
    else if (x->ndim >= 1 && x->ndim <= LK_MAX_DIMS) a.w = unit_weight(x->shape[x->ndim - 1]);
    lk_status s = check_rms_norm(&a);
    if (s) return s;
    if (lk_numel(x) == 0) return LK_OK;
    return lk_kernels()->rms_norm(&a);
}

static lk_status check_fused(const lk_fused_add_rms_norm_args *a) {
    lk_status s;
    if ((s = lk_check_float(&a->x, "x", 1, LK_MAX_DIMS))) return s;
    if ((s = lk_check_float(&a->residual, "residual", 1, LK_MAX_DIMS))) return s;
    if ((s = lk_check_same_shape(&a->residual, "residual", &a->x, "x"))) return s;
    if ((s = check_weight(&a->w, a->x.shape[a->x.ndim - 1], a->eps))) return s;
    if ((s = lk_check_no_self_overlap(&a->x, "x"))) return s;
    if ((s = lk_check_no_self_overlap(&a->residual, "residual"))) return s;
    if ((s = lk_check_disjoint(&a->x, "x", &a->residual, "residual"))) return s;
    if ((s = lk_check_disjoint(&a->x, "x", &a->w, "w"))) return s;
    if ((s = lk_check_disjoint(&a->residual, "residual", &a->w, "w"))) return s;
    return LK_OK;
}

lk_status lk_fused_add_rms_norm(const lk_tensor *x, const lk_tensor *residual, const lk_tensor *w,
                                float eps, int gemma) {
    lk_clear_error();
    lk_set_op("lk_fused_add_rms_norm");
    if (!x || !residual)
        return lk_fail(LK_ERR_NULL, "%s: tensor pointer is NULL", !x ? "x" : "residual");
    lk_fused_add_rms_norm_args a = {*x, *residual, {0}, eps, w ? gemma : 0};
    if (w) a.w = *w;
    else if (x->ndim >= 1 && x->ndim <= LK_MAX_DIMS) a.w = unit_weight(x->shape[x->ndim - 1]);
    lk_status s = check_fused(&a);
    if (s) return s;
    if (lk_numel(x) == 0) return LK_OK;
    return lk_kernels()->fused_add_rms_norm(&a);
}
