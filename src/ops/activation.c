/*
 * Public entry points lk_silu_and_mul and lk_gelu_tanh_and_mul: validation (before any
 * store), then the kernel of the ISA in use. Contract in include/llmkern.h.
 *
 *   out[..., i] = act(x[..., i]) * x[..., d + i],  i < d,  x: [..., 2d], out: [..., d]
 *
 * Rules checked: x and out are float views of the same rank >= 1; x's last dim is even;
 * out's shape is x's with the last dim halved; out does not overlap itself nor x.
 */
#include "../cpu/kernels.h"

static lk_status check_act(const lk_act_args *a) {
    lk_status s;
    const lk_tensor *x = &a->x, *out = &a->out;
    if ((s = lk_check_float(x, "x", 1, LK_MAX_DIMS))) return s;
    if ((s = lk_check_float(out, "out", 1, LK_MAX_DIMS))) return s;
    int nd = x->ndim;
    if (x->shape[nd - 1] % 2)
        return lk_fail(LK_ERR_SHAPE, "x: last dim of shape %s must be even ([..., 2d])",
                       lk_shape_str(x));
    if (out->ndim != nd)
        return lk_fail(LK_ERR_RANK, "out: expected %d dims like x, got %d", nd, (int)out->ndim);
    int same = out->shape[nd - 1] == x->shape[nd - 1] / 2;
    for (int d = 0; same && d < nd - 1; d++) same = out->shape[d] == x->shape[d];
    if (!same)
        return lk_fail(LK_ERR_SHAPE, "out: shape %s must be x's %s with the last dim halved",
                       lk_shape_str(out), lk_shape_str(x));
    if ((s = lk_check_no_self_overlap(out, "out"))) return s;
    if ((s = lk_check_disjoint(out, "out", x, "x"))) return s;
    return LK_OK;
}

/* shared front-end of both activations; `op` names the public function */
static lk_status act_entry(const char *op, const lk_tensor *out, const lk_tensor *x, int gelu) {
    lk_clear_error();
    lk_set_op(op);
    if (!out || !x) return lk_fail(LK_ERR_NULL, "%s: tensor pointer is NULL", !out ? "out" : "x");
    lk_act_args a = {*out, *x};
    lk_status s = check_act(&a);
    if (s) return s;
    if (lk_numel(out) == 0) return LK_OK;
    const lk_kernel_table *k = lk_kernels();
    return gelu ? k->gelu_tanh_and_mul(&a) : k->silu_and_mul(&a);
}

lk_status lk_silu_and_mul(const lk_tensor *out, const lk_tensor *x) {
    return act_entry("lk_silu_and_mul", out, x, 0);
}

lk_status lk_gelu_tanh_and_mul(const lk_tensor *out, const lk_tensor *x) {
    return act_entry("lk_gelu_tanh_and_mul", out, x, 1);
}
