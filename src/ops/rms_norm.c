/*
 * Public entry points lk_rms_norm and lk_fused_add_rms_norm, and their fp8-quantizing
 * forms (vLLM's rms_norm_static_fp8_quant, fused_add_rms_norm_static_fp8_quant,
 * rms_norm_dynamic_per_token_quant, rms_norm_per_block_quant (the dynamic scales per
 * block of group_size columns); one kernel entry, rms_norm_quant): validation
 * (before any store), then the kernel of the ISA in use. Contract in include/llmkern.h.
 */
#include <math.h>

#include "../cpu/fp8_quant.h"
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

/* ---------------------------------------------------------------- fp8-quantizing forms
 * out [..., D] fp8 = fp8(rms_norm(input or round(input + residual)) / scale); argument
 * names as vLLM's (input, weight, residual, scale / scales, scale_ub, epsilon). The
 * dynamic per-token form also writes an i8 out: i8(y * (1 / scale)), scale from 127. */

/* i8: out may be LK_I8 (the dynamic per-token form) */
static lk_status check_norm_quant(lk_rms_norm_quant_args *a, const lk_tensor *w, const lk_tensor *residual, int i8) {
    lk_status s;
    if ((s = lk_check_float(&a->x, "input", 1, LK_MAX_DIMS))) return s;
    if ((s = lk_q_check_out_i8(&a->out, "out", i8))) return s;
    if ((s = lk_check_same_shape(&a->out, "out", &a->x, "input"))) return s;
    int64_t D = a->x.shape[a->x.ndim - 1];
    if (w) {
        if ((s = lk_check_float(w, "weight", 1, 1))) return s;
        if (w->shape[0] != D)
            return lk_fail(LK_ERR_SHAPE, "weight: shape %s does not match last dim of input (%lld)", lk_shape_str(w),
                           (long long)D);
        a->w = *w;
    } else a->w = unit_weight(D);
    if (!(a->eps >= 0.0f) || isinf(a->eps))
        return lk_fail(LK_ERR_VALUE, "epsilon: must be finite and >= 0, got %g", (double)a->eps);
    if ((s = lk_check_disjoint(&a->out, "out", &a->x, "input"))) return s;
    if ((s = lk_check_disjoint(&a->out, "out", &a->w, "weight"))) return s;
    if (residual) {
        a->residual = *residual;
        a->has_residual = 1;
        if ((s = lk_check_float(residual, "residual", 1, LK_MAX_DIMS))) return s;
        if ((s = lk_check_same_shape(residual, "residual", &a->x, "input"))) return s;
        if ((s = lk_check_no_self_overlap(residual, "residual"))) return s;
        if ((s = lk_check_disjoint(residual, "residual", &a->x, "input"))) return s;
        if ((s = lk_check_disjoint(residual, "residual", &a->w, "weight"))) return s;
        if ((s = lk_check_disjoint(&a->out, "out", residual, "residual"))) return s;
    }
    return LK_OK;
}

/* the tensors the call writes (out; residual when given) must not overlap an input scale t
 * (read once at validation, but the caller's value would be overwritten) */
static lk_status check_scale_disjoint(const lk_rms_norm_quant_args *a, const lk_tensor *t, const char *name) {
    lk_status s = lk_check_disjoint(&a->out, "out", t, name);
    if (!s && a->has_residual) s = lk_check_disjoint(&a->residual, "residual", t, name);
    return s;
}

lk_status lk_rms_norm_static_fp8_quant(const lk_tensor *out, const lk_tensor *input, const lk_tensor *weight,
                                       const lk_tensor *scale, float epsilon) {
    lk_clear_error();
    lk_set_op("lk_rms_norm_static_fp8_quant");
    if (!out || !input || !scale)
        return lk_fail(LK_ERR_NULL, "%s: tensor pointer is NULL", !out ? "out" : !input ? "input" : "scale");
    lk_rms_norm_quant_args a = {.out = *out, .x = *input, .eps = epsilon, .mode = LK_Q_STATIC, .ub = INFINITY};
    lk_status s = check_norm_quant(&a, weight, NULL, 0);
    if (!s) s = lk_q_scale_in(scale, "scale", &a.scale);
    if (!s) s = check_scale_disjoint(&a, scale, "scale");
    if (s) return s;
    if (lk_numel(input) == 0) return LK_OK;
    return lk_kernels()->rms_norm_quant(&a);
}

lk_status lk_fused_add_rms_norm_static_fp8_quant(const lk_tensor *out, const lk_tensor *input,
                                                 const lk_tensor *residual, const lk_tensor *weight,
                                                 const lk_tensor *scale, float epsilon) {
    lk_clear_error();
    lk_set_op("lk_fused_add_rms_norm_static_fp8_quant");
    if (!out || !input || !residual || !scale)
        return lk_fail(LK_ERR_NULL, "%s: tensor pointer is NULL",
                       !out ? "out" : !input ? "input" : !residual ? "residual" : "scale");
    lk_rms_norm_quant_args a = {.out = *out, .x = *input, .eps = epsilon, .mode = LK_Q_STATIC, .ub = INFINITY};
    lk_status s = check_norm_quant(&a, weight, residual, 0);
    if (!s) s = lk_q_scale_in(scale, "scale", &a.scale);
    if (!s) s = check_scale_disjoint(&a, scale, "scale");
    if (s) return s;
    if (lk_numel(input) == 0) return LK_OK;
    return lk_kernels()->rms_norm_quant(&a);
}

/* the dynamic forms: per token (!blocked) and per block of group columns (blocked) */
static lk_status norm_dynamic(const lk_tensor *out, const lk_tensor *input, const lk_tensor *weight,
                              const lk_tensor *scales, float epsilon, const lk_tensor *scale_ub,
                              const lk_tensor *residual, int blocked, int64_t group) {
    if (!out || !input || !scales)
        return lk_fail(LK_ERR_NULL, "%s: tensor pointer is NULL", !out ? "out" : !input ? "input" : "scales");
    lk_rms_norm_quant_args a = {.out = *out, .x = *input, .eps = epsilon, .mode = LK_Q_TOKEN, .ub = INFINITY,
                                .group = blocked ? group : 0};
    lk_status s;
    if ((s = check_norm_quant(&a, weight, residual, 1))) return s;
    int64_t D = a.x.shape[a.x.ndim - 1];
    if (blocked) {
        if (group < 1) return lk_fail(LK_ERR_VALUE, "group_size: %lld, expected >= 1", (long long)group);
        if (D % group)
            return lk_fail(LK_ERR_SHAPE, "group_size: %lld does not divide input's last dim %lld (input %s)",
                           (long long)group, (long long)D, lk_shape_str(&a.x));
        s = lk_q_groups_out(scales, &a.x, D / group, &a.scales);
    } else s = lk_q_scales_out(scales, "scales", &a.x, &a.scales);
    if (s) return s;
    if ((s = lk_check_disjoint(scales, "scales", &a.out, "out"))) return s;
    if ((s = lk_check_disjoint(scales, "scales", &a.x, "input"))) return s;
    if ((s = lk_check_disjoint(scales, "scales", &a.w, "weight"))) return s;
    if (residual && (s = lk_check_disjoint(scales, "scales", residual, "residual"))) return s;
    if (scale_ub) {
        if ((s = lk_q_scale_in(scale_ub, "scale_ub", &a.ub))) return s;
        if ((s = lk_check_disjoint(scales, "scales", scale_ub, "scale_ub"))) return s;
        if ((s = check_scale_disjoint(&a, scale_ub, "scale_ub"))) return s;
    }
    if (lk_rows(input, 1) == 0) return LK_OK;
    /* rows of D == 0 (the views touch no element: row addresses are never formed); per
     * block they have no blocks */
    if (lk_numel(input) == 0)
        return blocked ? LK_OK : lk_q_fill_scales(&a.scales, lk_q_scale(0.0f, a.ub, a.out.dtype));
    return lk_kernels()->rms_norm_quant(&a);
}

lk_status lk_rms_norm_dynamic_per_token_quant(const lk_tensor *out, const lk_tensor *input, const lk_tensor *weight,
                                              const lk_tensor *scales, float epsilon, const lk_tensor *scale_ub,
                                              const lk_tensor *residual) {
    lk_clear_error();
    lk_set_op("lk_rms_norm_dynamic_per_token_quant");
    return norm_dynamic(out, input, weight, scales, epsilon, scale_ub, residual, 0, 0);
}

lk_status lk_rms_norm_per_block_quant(const lk_tensor *out, const lk_tensor *input, const lk_tensor *weight,
                                      const lk_tensor *scales, float epsilon, const lk_tensor *scale_ub,
                                      const lk_tensor *residual, int64_t group_size) {
    lk_clear_error();
    lk_set_op("lk_rms_norm_per_block_quant");
    return norm_dynamic(out, input, weight, scales, epsilon, scale_ub, residual, 1, group_size);
}
