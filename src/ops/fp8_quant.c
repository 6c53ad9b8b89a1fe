/*
 * Public entry points of the fp8 activation quantizers (vLLM's static_scaled_fp8_quant,
 * with a per-tensor scale or a grid of them, dynamic_scaled_fp8_quant,
 * dynamic_per_token_scaled_fp8_quant, per_token_group_fp8_quant):
 * validation before any store, then the fp8_quant kernel of the ISA in use. Contract in
 * include/llmkern.h.
 *
 *   out[..., D] fp8 = fp8(x[..., D] / scale)
 *   static: scale [1] given, or a given grid [M / gm, D / gn] read as scale[r / gm, c / gn];
 *   per tensor: scale [1] = max(absmax(x) / fp8_max, min_scale) written first;
 *   per token: scales[r] = max(min(absmax(x[r]), scale_ub) / fp8_max, min_scale) per row r;
 *   per token group: scales[r, g] = max(absmax(x[r, gG:gG+G]), eps) / fp8_max (ue8m0:
 *   rounded up to a power of two) per row r and group g; an i8 out: / 127, codes
 *   trunc(clamp(x / scale, -128, 127)).
 *
 * Also the scale / fp8-output checks the fused rms_norm + quant ops (src/ops/rms_norm.c)
 * and the merge with an fp8 output (src/ops/merge.c) share (src/cpu/fp8_quant.h).
 */
#include <float.h>
#include <math.h>

#include "../cpu/fp8_quant.h"

lk_status lk_q_check_out_i8(const lk_tensor *out, const char *name, int i8) {
    lk_status s = lk_check_view(out, name, 1, LK_MAX_DIMS);
    if (s) return s;
    if (!lk_is_fp8(out->dtype) && !(i8 && out->dtype == LK_I8))
        return lk_fail(LK_ERR_DTYPE, "%s: dtype %s not supported (the quantized output is f8e4m3 or f8e5m2%s)",
                       name, lk_dtype_name(out->dtype), i8 ? ", or i8" : "");
    return lk_check_no_self_overlap(out, name);
}

lk_status lk_q_check_out(const lk_tensor *out, const char *name) { return lk_q_check_out_i8(out, name, 0); }

static lk_status scale_view(const lk_tensor *t, const char *name) {
    lk_status s = lk_check_view(t, name, 0, LK_MAX_DIMS);
    if (s) return s;
    if (t->dtype != LK_F32)
        return lk_fail(LK_ERR_DTYPE, "%s: dtype %s not supported (scales are f32)", name, lk_dtype_name(t->dtype));
    if (lk_numel(t) != 1)
        return lk_fail(LK_ERR_SHAPE, "%s: shape %s, expected one element ([1]: a per-tensor scale)", name,
                       lk_shape_str(t));
    return LK_OK;
}

/* an input scale: the shared fp8 scale rules (src/core/core.h), one value (per tensor) */
lk_status lk_q_scale_in(const lk_tensor *t, const char *name, float *v) {
    lk_scale sc;
    lk_status s = lk_scale_init(&sc, t, -1, 1, name);
    if (s) return s;
    *v = lk_scale_at(&sc, 0, 0);
    return LK_OK;
}

lk_status lk_q_scale_out(const lk_tensor *t, const char *name) { return scale_view(t, name); }

lk_status lk_q_scales_out(const lk_tensor *t, const char *name, const lk_tensor *x, lk_tensor *view) {
    return lk_q_rows_out(t, name, x, view, LK_F32);
}

/* *view = t, a flat [rows, k] (or [rows]) view of per-row values of x [..., D], as x's
 * leading dims and k (column stride ks). With no values (rows or k 0) the view's strides
 * are unchecked: use 0; else every partial product is at most s0 * rows, within the view's
 * validated extent (rows >= 2) or s0 itself (rows == 1) */
static void spread_rows(const lk_tensor *t, const lk_tensor *x, int64_t k, int64_t ks, lk_tensor *view) {
    int nd = x->ndim;
    int64_t rows = lk_rows(x, 1), st = rows > 0 && k > 0 ? t->stride[0] : 0;
    *view = *t;
    view->ndim = nd;
    view->shape[nd - 1] = k;
    view->stride[nd - 1] = ks;
    for (int d = nd - 2; d >= 0; d--) {
        view->shape[d] = x->shape[d];
        view->stride[d] = x->shape[d] > 1 ? st : 0;
        if (d > 0) st *= x->shape[d];
    }
}

lk_status lk_q_rows_out(const lk_tensor *t, const char *name, const lk_tensor *x, lk_tensor *view, lk_dtype dt) {
    lk_status s = lk_check_view(t, name, 1, LK_MAX_DIMS);
    if (s) return s;
    if (t->dtype != dt)
        return lk_fail(LK_ERR_DTYPE, "%s: dtype %s not supported (%s are %s)", name, lk_dtype_name(t->dtype),
                       dt == LK_F32 ? "scales" : "zero points", lk_dtype_name(dt));
    int nd = x->ndim, ok;
    int64_t rows = lk_rows(x, 1);
    /* flat: [rows], or [rows, 1] whatever x's rank (vLLM allocates [numel / D, 1]) */
    int flat = t->ndim == 1 || (t->ndim == 2 && t->shape[0] == rows && t->shape[1] == 1);
    if (t->ndim == 1) ok = t->shape[0] == rows;
    else if (flat) ok = 1;
    else {
        ok = t->ndim == nd && t->shape[nd - 1] == 1;
        for (int d = 0; ok && d < nd - 1; d++) ok = t->shape[d] == x->shape[d];
    }
    if (!ok)
        return lk_fail(LK_ERR_SHAPE, "%s: shape %s, expected [%lld], [%lld, 1] or the input's leading dims and 1 "
                       "(one value per row of input %s)", name, lk_shape_str(t), (long long)rows, (long long)rows,
                       lk_shape_str(x));
    if ((s = lk_check_no_self_overlap(t, name))) return s;
    if (flat) spread_rows(t, x, 1, 0, view); /* [rows] (or [rows, 1]) as x's leading dims + [1] */
    else *view = *t;
    return LK_OK;
}

lk_status lk_q_fill_scales(const lk_tensor *view, float v) {
    lk_rowit si;
    lk_rowit_init(&si, view, 1, 0);
    for (int64_t r = 0, n = lk_rows(view, 1); r < n; r++, lk_rowit_next(&si)) ((float *)view->data)[si.off] = v;
    return LK_OK;
}

/* i8: out may be LK_I8 (the per-token-group op) */
static lk_status check_common(const lk_fp8_quant_args *a, int i8) {
    lk_status s;
    if ((s = lk_check_float(&a->x, "input", 1, LK_MAX_DIMS))) return s;
    if ((s = lk_q_check_out_i8(&a->out, "out", i8))) return s;
    if ((s = lk_check_same_shape(&a->out, "out", &a->x, "input"))) return s;
    return lk_check_disjoint(&a->out, "out", &a->x, "input");
}

static lk_status run(const lk_fp8_quant_args *a) {
    if (lk_numel(&a->x) == 0) {
        if (a->mode == LK_Q_TENSOR) *a->scale_out = lk_q_scale(0.0f, INFINITY, a->out.dtype);
        return LK_OK;
    }
    return lk_kernels()->fp8_quant(a);
}

lk_status lk_static_scaled_fp8_quant(const lk_tensor *out, const lk_tensor *input, const lk_tensor *scale) {
    lk_clear_error();
    lk_set_op("lk_static_scaled_fp8_quant");
    if (!out || !input || !scale)
        return lk_fail(LK_ERR_NULL, "%s: tensor pointer is NULL", !out ? "out" : !input ? "input" : "scale");
    lk_fp8_quant_args a = {.out = *out, .x = *input, .mode = LK_Q_STATIC, .ub = INFINITY};
    lk_status s = check_common(&a, 0);
    if (!s) s = lk_q_scale_in(scale, "scale", &a.scale);
    if (!s) s = lk_check_disjoint(&a.out, "out", scale, "scale"); /* read at validation; not overwritten */
    if (s) return s;
    return run(&a);
}

lk_status lk_dynamic_scaled_fp8_quant(const lk_tensor *out, const lk_tensor *input, const lk_tensor *scale) {
    lk_clear_error();
    lk_set_op("lk_dynamic_scaled_fp8_quant");
    if (!out || !input || !scale)
        return lk_fail(LK_ERR_NULL, "%s: tensor pointer is NULL", !out ? "out" : !input ? "input" : "scale");
    lk_fp8_quant_args a = {.out = *out, .x = *input, .mode = LK_Q_TENSOR, .ub = INFINITY};
    lk_status s;
    if ((s = check_common(&a, 0))) return s;
    if ((s = lk_q_scale_out(scale, "scale"))) return s;
    if ((s = lk_check_disjoint(scale, "scale", &a.out, "out"))) return s;
    if ((s = lk_check_disjoint(scale, "scale", &a.x, "input"))) return s;
    a.scale_out = scale->data;
    return run(&a);
}

lk_status lk_dynamic_per_token_scaled_fp8_quant(const lk_tensor *out, const lk_tensor *input,
                                                const lk_tensor *scales, const lk_tensor *scale_ub) {
    lk_clear_error();
    lk_set_op("lk_dynamic_per_token_scaled_fp8_quant");
    if (!out || !input || !scales)
        return lk_fail(LK_ERR_NULL, "%s: tensor pointer is NULL", !out ? "out" : !input ? "input" : "scales");
    lk_fp8_quant_args a = {.out = *out, .x = *input, .mode = LK_Q_TOKEN, .ub = INFINITY};
    lk_status s;
    if ((s = check_common(&a, 0))) return s;
    if ((s = lk_q_scales_out(scales, "scales", &a.x, &a.scales))) return s;
    if ((s = lk_check_disjoint(scales, "scales", &a.out, "out"))) return s;
    if ((s = lk_check_disjoint(scales, "scales", &a.x, "input"))) return s;
    if (scale_ub) {
        if ((s = lk_q_scale_in(scale_ub, "scale_ub", &a.ub))) return s;
        if ((s = lk_check_disjoint(scales, "scales", scale_ub, "scale_ub"))) return s;
        if ((s = lk_check_disjoint(&a.out, "out", scale_ub, "scale_ub"))) return s;
    }
    if (lk_rows(&a.x, 1) == 0) return LK_OK;
    /* rows of D == 0 (the views touch no element: row addresses are never formed) */
    if (lk_numel(&a.x) == 0) return lk_q_fill_scales(&a.scales, lk_q_scale(0.0f, a.ub, a.out.dtype));
    return lk_kernels()->fp8_quant(&a);
}

lk_status lk_q_groups_out(const lk_tensor *t, const lk_tensor *x, int64_t ng, lk_tensor *view) {
    lk_status s = lk_check_view(t, "scales", 1, LK_MAX_DIMS);
    if (s) return s;
    if (t->dtype != LK_F32)
        return lk_fail(LK_ERR_DTYPE, "scales: dtype %s not supported (scales are f32)", lk_dtype_name(t->dtype));
    int nd = x->ndim, ok = t->ndim == nd && t->shape[nd - 1] == ng;
    int64_t rows = lk_rows(x, 1);
    for (int d = 0; ok && d < nd - 1; d++) ok = t->shape[d] == x->shape[d];
    int flat = !ok && t->ndim == 2 && t->shape[0] == rows && t->shape[1] == ng;
    if (!ok && !flat)
        return lk_fail(LK_ERR_SHAPE, "scales: shape %s, expected [%lld, %lld] or the input's leading dims and %lld "
                       "(one scale per group of each row of input %s)", lk_shape_str(t), (long long)rows,
                       (long long)ng, (long long)ng, lk_shape_str(x));
    if ((s = lk_check_no_self_overlap(t, "scales"))) return s;
    if (flat) spread_rows(t, x, ng, t->stride[1], view); /* [rows, ng] as x's leading dims + [ng] */
    else *view = *t;
    return LK_OK;
}

lk_status lk_per_token_group_fp8_quant(const lk_tensor *out, const lk_tensor *input, const lk_tensor *scales,
                                       int64_t group_size, float eps, int scale_ue8m0) {
    lk_clear_error();
    lk_set_op("lk_per_token_group_fp8_quant");
    if (!out || !input || !scales)
        return lk_fail(LK_ERR_NULL, "%s: tensor pointer is NULL", !out ? "out" : !input ? "input" : "scales");
    lk_fp8_quant_args a = {.out = *out, .x = *input, .mode = LK_Q_GROUP, .ub = INFINITY, .group = group_size,
                           .eps = eps, .ue8m0 = scale_ue8m0 != 0};
    lk_status s;
    if ((s = check_common(&a, 1))) return s;
    int64_t D = a.x.shape[a.x.ndim - 1];
    if (group_size < 1)
        return lk_fail(LK_ERR_VALUE, "group_size: %lld, expected >= 1", (long long)group_size);
    if (D % group_size)
        return lk_fail(LK_ERR_SHAPE, "group_size: %lld does not divide input's last dim %lld (input %s)",
                       (long long)group_size, (long long)D, lk_shape_str(&a.x));
    float lo = lk_q_max(a.out.dtype) * FLT_MIN;
    if (!(eps >= lo) || !(eps < INFINITY))
        return lk_fail(LK_ERR_VALUE, "eps: %.9g, expected finite and >= %s * FLT_MIN = %.9g (the smallest "
                       "scale a normal f32)", (double)eps, a.out.dtype == LK_I8 ? "127" : "fp8_max", (double)lo);
    if ((s = lk_q_groups_out(scales, &a.x, D / group_size, &a.gscales))) return s;
    if ((s = lk_check_disjoint(scales, "scales", &a.out, "out"))) return s;
    if ((s = lk_check_disjoint(scales, "scales", &a.x, "input"))) return s;
    if (lk_numel(&a.x) == 0) return LK_OK; /* no rows, or D == 0: no groups */
    return lk_kernels()->fp8_quant(&a);
}

lk_status lk_static_group_scaled_fp8_quant(const lk_tensor *out, const lk_tensor *input, const lk_tensor *scale) {
    lk_clear_error();
    lk_set_op("lk_static_group_scaled_fp8_quant");
    if (!out || !input || !scale)
        return lk_fail(LK_ERR_NULL, "%s: tensor pointer is NULL", !out ? "out" : !input ? "input" : "scale");
    lk_fp8_quant_args a = {.out = *out, .x = *input, .mode = LK_Q_STATIC_GRID, .ub = INFINITY};
    lk_status s;
    if ((s = check_common(&a, 0))) return s;
    if ((s = lk_check_view(scale, "scale", 2, 2))) return s;
    int64_t M = lk_rows(&a.x, 1), N = a.x.shape[a.x.ndim - 1], sm = scale->shape[0], sn = scale->shape[1];
    if (sm < 1 || sn < 1 || M % sm || N % sn)
        return lk_fail(LK_ERR_SHAPE, "scale: shape %s does not split input's %lld rows x %lld columns into groups "
                       "(expected [rows / group_m, columns / group_n], input %s)", lk_shape_str(scale),
                       (long long)M, (long long)N, lk_shape_str(&a.x));
    if ((s = lk_scale_init(&a.grid, scale, sm, sn, "scale"))) return s; /* f32, every value finite and > 0 */
    if ((s = lk_check_disjoint(&a.out, "out", scale, "scale"))) return s;
    if (lk_numel(&a.x) == 0) return LK_OK;
    a.gm = M / sm, a.group = N / sn;
    return lk_kernels()->fp8_quant(&a);
}
