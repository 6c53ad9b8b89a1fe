/*
 * Public entry point lk_convert_fp8 (vLLM's convert_fp8, since 0.3): validation before
 * any store, then the convert_fp8 kernel of the ISA in use. Contract in
 * include/llmkern.h.
 *
 *   src fp8, dst f32/f16/bf16:  dst[i] = round(f32(src[i]) * scale)   (dequantize)
 *   src f32/f16/bf16, dst fp8:  dst[i] = fp8(f32(src[i]) / scale)     (quantize)
 *
 * Shapes: dst and src of one shape, rank 1..LK_MAX_DIMS, any strides (a cache is
 * converted whole, its padding untouched). Exactly one of them fp8 (else LK_ERR_DTYPE
 * naming dst); scale finite and > 0 (LK_ERR_VALUE); dst must not overlap itself or src
 * (LK_ERR_ALIAS). Nothing is written on an error.
 */
#include "../cpu/kernels.h"

lk_status lk_convert_fp8(const lk_tensor *dst, const lk_tensor *src, float scale) {
    lk_clear_error();
    lk_set_op("lk_convert_fp8");
    if (!dst || !src) return lk_fail(LK_ERR_NULL, "%s: tensor pointer is NULL", !dst ? "dst" : "src");
    lk_status s;
    if ((s = lk_check_float8(dst, "dst", 0, LK_MAX_DIMS))) return s;
    if ((s = lk_check_float8(src, "src", 0, LK_MAX_DIMS))) return s;
    if (lk_is_fp8(dst->dtype) == lk_is_fp8(src->dtype))
        return lk_fail(LK_ERR_DTYPE, "dst: dtype %s with src %s: exactly one of them must be fp8 (f8e4m3, f8e5m2)",
                       lk_dtype_name(dst->dtype), lk_dtype_name(src->dtype));
    if (dst->ndim != src->ndim)
        return lk_fail(LK_ERR_SHAPE, "dst: shape %s does not match src %s", lk_shape_str(dst), lk_shape_str(src));
    if ((s = lk_check_same_shape(dst, "dst", src, "src"))) return s;
    if ((s = lk_scale_check_value(scale, "scale"))) return s;
    if ((s = lk_check_no_self_overlap(dst, "dst"))) return s;
    if ((s = lk_check_disjoint(dst, "dst", src, "src"))) return s;
    if (lk_numel(dst) == 0) return LK_OK;
    lk_convert_fp8_args a = {*dst, *src, scale};
    if (dst->ndim == 0) { /* a 0-d view: the kernels' rows of one element */
        a.dst.ndim = a.src.ndim = 1;
        a.dst.shape[0] = a.src.shape[0] = 1;
        a.dst.stride[0] = a.src.stride[0] = 1;
    }
    return lk_kernels()->convert_fp8(&a);
}
