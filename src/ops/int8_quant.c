/*
 * Public entry points of the int8 activation quantizers (vLLM's static_scaled_int8_quant
 * and dynamic_scaled_int8_quant, the ops behind vllm._custom_ops.scaled_int8_quant):
 * validation before any store, then the int8_quant kernel of the ISA in use. Contract
 * in include/llmkern.h; the arithmetic in src/cpu/int8_quant.h.
 *
 *   out[..., D] i8 = sat8(sat32(rn(v)) + azp)
 *   static:  v = x / scale (symmetric) or x * (1 / scale) (azp given)
 *   dynamic: per row, scales[r] (and azp[r]) written from the row's absmax (symmetric)
 *            or min and max (asymmetric), v = x * f
 */
#include "../cpu/fp8_quant.h"
#include "../cpu/int8_quant.h"

static lk_status check_common(const lk_int8_quant_args *a) {
    lk_status s;
    if ((s = lk_check_float(&a->x, "input", 1, LK_MAX_DIMS))) return s;
    if ((s = lk_check_view(&a->out, "out", 1, LK_MAX_DIMS))) return s;
    if (a->out.dtype != LK_I8)
        return lk_fail(LK_ERR_DTYPE, "%s: dtype %s not supported (the int8 quantizers write i8)", "out",
                       lk_dtype_name(a->out.dtype));
    if ((s = lk_check_no_self_overlap(&a->out, "out"))) return s;
    if ((s = lk_check_same_shape(&a->out, "out", &a->x, "input"))) return s;
    return lk_check_disjoint(&a->out, "out", &a->x, "input");
}

lk_status lk_static_scaled_int8_quant(const lk_tensor *out, const lk_tensor *input, const lk_tensor *scale,
                                      const lk_tensor *azp) {
    lk_clear_error();
    lk_set_op("lk_static_scaled_int8_quant");
    if (!out || !input || !scale)
        return lk_fail(LK_ERR_NULL, "%s: tensor pointer is NULL", !out ? "out" : !input ? "input" : "scale");
    lk_int8_quant_args a = {.out = *out, .x = *input};
    lk_status s;
    if ((s = check_common(&a))) return s;
    if ((s = lk_q_scale_in(scale, "scale", &a.scale))) return s;
    if ((s = lk_check_disjoint(&a.out, "out", scale, "scale"))) return s;
    if (azp) {
        if ((s = lk_check_view(azp, "azp", 0, LK_MAX_DIMS))) return s;
        if (azp->dtype != LK_I32)
            return lk_fail(LK_ERR_DTYPE, "azp: dtype %s not supported (the zero point is i32)",
                           lk_dtype_name(azp->dtype));
        if (lk_numel(azp) != 1)
            return lk_fail(LK_ERR_SHAPE, "azp: shape %s, expected one element ([1]: a per-tensor zero point)",
                           lk_shape_str(azp));
        if ((s = lk_check_disjoint(&a.out, "out", azp, "azp"))) return s;
        a.asym = 1;
        a.azp = *(const int32_t *)azp->data;
    }
    if (lk_numel(&a.x) == 0) return LK_OK;
    return lk_kernels()->int8_quant(&a);
}

lk_status lk_dynamic_scaled_int8_quant(const lk_tensor *out, const lk_tensor *input, const lk_tensor *scales,
                                       const lk_tensor *azp) {
    lk_clear_error();
    lk_set_op("lk_dynamic_scaled_int8_quant");
    if (!out || !input || !scales)
        return lk_fail(LK_ERR_NULL, "%s: tensor pointer is NULL", !out ? "out" : !input ? "input" : "scales");
    lk_int8_quant_args a = {.out = *out, .x = *input, .dynamic = 1};
    lk_status s;
    if ((s = check_common(&a))) return s;
    if ((s = lk_q_scales_out(scales, "scales", &a.x, &a.scales))) return s;
    if ((s = lk_check_disjoint(scales, "scales", &a.out, "out"))) return s;
    if ((s = lk_check_disjoint(scales, "scales", &a.x, "input"))) return s;
    if (azp) {
        if ((s = lk_q_rows_out(azp, "azp", &a.x, &a.azps, LK_I32))) return s;
        if ((s = lk_check_disjoint(azp, "azp", &a.out, "out"))) return s;
        if ((s = lk_check_disjoint(azp, "azp", &a.x, "input"))) return s;
        if ((s = lk_check_disjoint(azp, "azp", scales, "scales"))) return s;
        a.asym = 1;
    }
    int64_t rows = lk_rows(&a.x, 1);
    if (rows == 0) return LK_OK;
    if (lk_numel(&a.x) == 0) { /* rows of D == 0: all-zero rows (the views' rows are never formed) */
        lk_rowit si, zi;
        lk_rowit_init(&si, &a.scales, 1, 0);
        if (a.asym) lk_rowit_init(&zi, &a.azps, 1, 0);
        for (int64_t r = 0; r < rows; r++, lk_rowit_next(&si)) {
            ((float *)a.scales.data)[si.off] = 0.0f;
            if (a.asym) ((int32_t *)a.azps.data)[zi.off] = 0, lk_rowit_next(&zi);
        }
        return LK_OK;
    }
    return lk_kernels()->int8_quant(&a);
}
