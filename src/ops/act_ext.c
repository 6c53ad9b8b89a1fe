/*
 * Public entry points of the extra activations (vLLM's names): lk_gelu_and_mul,
 * lk_mul_and_silu, lk_fatrelu_and_mul, lk_swigluoai_and_mul (gated: x [..., 2d] ->
 * out [..., d]) and lk_gelu_new, lk_gelu_fast, lk_gelu_quick (element-wise: out shaped
 * like x). Validation before any store, then the act_ext kernel of the ISA in use.
 * Contract in include/llmkern.h, maths in ref/act_ext.c.
 *
 * Rules checked: x and out are float views of the same rank >= 1; gated: x's last dim
 * even and out's shape x's with the last dim halved; element-wise: the same shape; out
 * does not overlap itself nor x; threshold finite; alpha finite and > 0, limit finite
 * and > 0.
 */
#include <math.h>

#include "../cpu/kernels.h"

static lk_status check_ext(const lk_act_ext_args *a, int gated) {
    lk_status s;
    const lk_tensor *x = &a->x, *out = &a->out;
    if ((s = lk_check_float(x, "x", 1, LK_MAX_DIMS))) return s;
    if ((s = lk_check_float(out, "out", 1, LK_MAX_DIMS))) return s;
    int nd = x->ndim;
    if (gated && x->shape[nd - 1] % 2)
        return lk_fail(LK_ERR_SHAPE, "x: last dim of shape %s must be even ([..., 2d])", lk_shape_str(x));
    if (out->ndim != nd) return lk_fail(LK_ERR_RANK, "out: expected %d dims like x, got %d", nd, (int)out->ndim);
    int same = out->shape[nd - 1] == (gated ? x->shape[nd - 1] / 2 : x->shape[nd - 1]);
    for (int d = 0; same && d < nd - 1; d++) same = out->shape[d] == x->shape[d];
    if (!same)
        return lk_fail(LK_ERR_SHAPE, gated ? "out: shape %s must be x's %s with the last dim halved"
                                           : "out: shape %s must be x's %s",
                       lk_shape_str(out), lk_shape_str(x));
    if (a->kind == LK_ACT_FATRELU_MUL && !isfinite(a->p0))
        return lk_fail(LK_ERR_VALUE, "threshold: must be finite, got %g", (double)a->p0);
    if (a->kind == LK_ACT_SWIGLUOAI_MUL) {
        if (!isfinite(a->p0) || !(a->p0 > 0.0f))
            return lk_fail(LK_ERR_VALUE, "alpha: must be finite and > 0, got %g", (double)a->p0);
        if (!isfinite(a->p1) || !(a->p1 > 0.0f))
            return lk_fail(LK_ERR_VALUE, "limit: must be finite and > 0, got %g", (double)a->p1);
    }
    if ((s = lk_check_no_self_overlap(out, "out"))) return s;
    if ((s = lk_check_disjoint(out, "out", x, "x"))) return s;
    return LK_OK;
}

static lk_status ext_entry(const char *op, const lk_tensor *out, const lk_tensor *x, lk_act_kind kind, float p0,
                           float p1) {
    lk_clear_error();
    lk_set_op(op);
    if (!out || !x) return lk_fail(LK_ERR_NULL, "%s: tensor pointer is NULL", !out ? "out" : "x");
    lk_act_ext_args a = {*out, *x, kind, p0, p1};
    lk_status s = check_ext(&a, kind < LK_ACT_GELU_NEW);
    if (s) return s;
    if (lk_numel(out) == 0) return LK_OK;
    return lk_kernels()->act_ext(&a);
}

lk_status lk_gelu_and_mul(const lk_tensor *out, const lk_tensor *x) {
    return ext_entry("lk_gelu_and_mul", out, x, LK_ACT_GELU_ERF_MUL, 0.0f, 0.0f);
}
lk_status lk_mul_and_silu(const lk_tensor *out, const lk_tensor *x) {
    return ext_entry("lk_mul_and_silu", out, x, LK_ACT_MUL_SILU, 0.0f, 0.0f);
}
lk_status lk_fatrelu_and_mul(const lk_tensor *out, const lk_tensor *x, float threshold) {
    return ext_entry("lk_fatrelu_and_mul", out, x, LK_ACT_FATRELU_MUL, threshold, 0.0f);
}
lk_status lk_swigluoai_and_mul(const lk_tensor *out, const lk_tensor *x, float alpha, float limit) {
    return ext_entry("lk_swigluoai_and_mul", out, x, LK_ACT_SWIGLUOAI_MUL, alpha, limit);
}
lk_status lk_gelu_new(const lk_tensor *out, const lk_tensor *x) {
    return ext_entry("lk_gelu_new", out, x, LK_ACT_GELU_NEW, 0.0f, 0.0f);
}
lk_status lk_gelu_fast(const lk_tensor *out, const lk_tensor *x) {
    return ext_entry("lk_gelu_fast", out, x, LK_ACT_GELU_NEW, 0.0f, 0.0f);
}
lk_status lk_gelu_quick(const lk_tensor *out, const lk_tensor *x) {
    return ext_entry("lk_gelu_quick", out, x, LK_ACT_GELU_QUICK, 0.0f, 0.0f);
}
