/*
 * Public entry points lk_silu_and_mul_quant and lk_silu_and_mul_per_block_quant (vLLM's
 * silu_and_mul_quant and silu_and_mul_per_block_quant): validation before any store, then
 * the act_quant kernel of the ISA in use. Contract in include/llmkern.h.
 *
 *   y = silu(input[..., :d]) * input[..., d:]   (f32), input [..., 2d], out [..., d]
 *   static:    out = fp8(y / scale), scale [1] given
 *   per block: scales[r, g] = max(min(absmax(y[r, block g]) / qmax, scale_ub), min_scale),
 *              out = q(y / scales[r, g]) (fp8 or i8)
 */
#include <math.h>

#include "../cpu/act_quant.h"

/* input float [..., 2d], out fp8 (or i8 when i8) [..., d], disjoint */
static lk_status check_io(const lk_act_quant_args *a, int i8) {
    lk_status s;
    const lk_tensor *x = &a->x, *out = &a->out;
    if ((s = lk_check_float(x, "input", 1, LK_MAX_DIMS))) return s;
    if ((s = lk_q_check_out_i8(out, "out", i8))) return s;
    int nd = x->ndim;
    if (x->shape[nd - 1] % 2)
        return lk_fail(LK_ERR_SHAPE, "input: last dim of shape %s must be even ([..., 2d]: gate, then up)",
                       lk_shape_str(x));
    if (out->ndim != nd) return lk_fail(LK_ERR_RANK, "out: expected %d dims like input, got %d", nd, (int)out->ndim);
    int same = out->shape[nd - 1] == x->shape[nd - 1] / 2;
    for (int d = 0; same && d < nd - 1; d++) same = out->shape[d] == x->shape[d];
    if (!same)
        return lk_fail(LK_ERR_SHAPE, "out: shape %s must be input's %s with the last dim halved", lk_shape_str(out),
                       lk_shape_str(x));
    return lk_check_disjoint(out, "out", x, "input");
}

lk_status lk_silu_and_mul_quant(const lk_tensor *out, const lk_tensor *input, const lk_tensor *scale) {
    lk_clear_error();
    lk_set_op("lk_silu_and_mul_quant");
    if (!out || !input || !scale)
        return lk_fail(LK_ERR_NULL, "%s: tensor pointer is NULL", !out ? "out" : !input ? "input" : "scale");
    lk_act_quant_args a = {.out = *out, .x = *input, .ub = INFINITY};
    lk_status s = check_io(&a, 0);
    if (!s) s = lk_q_scale_in(scale, "scale", &a.scale);
    if (!s) s = lk_check_disjoint(&a.out, "out", scale, "scale"); /* read at validation; not overwritten */
    if (s) return s;
    if (lk_numel(&a.out) == 0) return LK_OK;
    return lk_kernels()->act_quant(&a);
}

lk_status lk_silu_and_mul_per_block_quant(const lk_tensor *out, const lk_tensor *input, const lk_tensor *scales,
                                          const lk_tensor *scale_ub, int64_t group_size) {
    lk_clear_error();
    lk_set_op("lk_silu_and_mul_per_block_quant");
    if (!out || !input || !scales)
        return lk_fail(LK_ERR_NULL, "%s: tensor pointer is NULL", !out ? "out" : !input ? "input" : "scales");
    lk_act_quant_args a = {.out = *out, .x = *input, .group = group_size, .ub = INFINITY};
    lk_status s;
    if ((s = check_io(&a, 1))) return s;
    int64_t d = a.out.shape[a.out.ndim - 1];
    if (group_size < 1) return lk_fail(LK_ERR_VALUE, "group_size: %lld, expected >= 1", (long long)group_size);
    if (d % group_size)
        return lk_fail(LK_ERR_SHAPE, "group_size: %lld does not divide out's last dim %lld (input %s, out %s)",
                       (long long)group_size, (long long)d, lk_shape_str(&a.x), lk_shape_str(&a.out));
    if ((s = lk_q_groups_out(scales, &a.x, d / group_size, &a.scales))) return s;
    if ((s = lk_check_disjoint(scales, "scales", &a.out, "out"))) return s;
    if ((s = lk_check_disjoint(scales, "scales", &a.x, "input"))) return s;
    if (scale_ub) {
        if ((s = lk_q_scale_in(scale_ub, "scale_ub", &a.ub))) return s;
        if ((s = lk_check_disjoint(scales, "scales", scale_ub, "scale_ub"))) return s;
        if ((s = lk_check_disjoint(&a.out, "out", scale_ub, "scale_ub"))) return s;
    }
    if (lk_numel(&a.out) == 0) return LK_OK; /* no rows, or d == 0: no blocks */
    return lk_kernels()->act_quant(&a);
}
