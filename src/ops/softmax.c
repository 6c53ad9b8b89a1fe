/*
 * Public entry point lk_causal_softmax: validation (before any store), then the kernel
 * of the ISA in use. Contract in include/llmkern.h, -inf / NaN rules in
 * src/common/attn_state.h.
 *
 *   out[..., i, j] = exp(x[..., i, j] - m_i) / sum_{j' visible} exp(x[..., i, j'] - m_i)
 *                    for j <= i + k_len - q_len (bottom-right causal mask), else 0
 * x, out: [..., q_len, k_len], rank >= 2, same shape, any strides, each its own float
 * dtype. out may be x itself (identical view); any other overlap is an error.
 */
#include "../cpu/kernels.h"

static lk_status check_softmax(const lk_softmax_args *a) {
    lk_status s;
    if ((s = lk_check_float(&a->x, "x", 2, LK_MAX_DIMS))) return s;
    if ((s = lk_check_float(&a->out, "out", 2, LK_MAX_DIMS))) return s;
    if ((s = lk_check_same_shape(&a->out, "out", &a->x, "x"))) return s;
    if ((s = lk_check_no_self_overlap(&a->out, "out"))) return s;
    if (!lk_same_view(&a->out, &a->x) && (s = lk_check_disjoint(&a->out, "out", &a->x, "x")))
        return s;
    return LK_OK;
}

lk_status lk_causal_softmax(const lk_tensor *out, const lk_tensor *x) {
    lk_clear_error();
    lk_set_op("lk_causal_softmax");
    if (!out || !x) return lk_fail(LK_ERR_NULL, "%s: tensor pointer is NULL", !out ? "out" : "x");
    lk_softmax_args a = {*out, *x};
    lk_status s = check_softmax(&a);
    if (s) return s;
    if (lk_numel(x) == 0) return LK_OK;
    return lk_kernels()->causal_softmax(&a);
}
