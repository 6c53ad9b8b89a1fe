/*
 * convert_fp8, scalar reference.
 *
 *   dst fp8:  dst[i] = fp8(f32(src[i]) / scale)        (src f32/f16/bf16)
 *   src fp8:  dst[i] = round(f32(src[i]) * scale)      (dst f32/f16/bf16)
 *
 * Shapes: dst, src [..., n] of one shape, every stride honoured (rows of the last dim
 * walked with lk_rowit). One f32 operation, then the one rounding of src/core/half.h
 * (fp8: the saturating converter of src/core/fp8.h). No threads.
 */
#include "../../core/half.h"
#include "../kernels.h"

lk_status lk_ref_convert_fp8(const lk_convert_fp8_args *a) {
    const lk_tensor *d = &a->dst, *s = &a->src; // [..., n]
    int last = d->ndim - 1, quant = d->dtype == LK_F8E4M3 || d->dtype == LK_F8E5M2;
    int64_t n = d->shape[last], rows = lk_rows(d, 1), ds = d->stride[last], ss = s->stride[last];
    lk_rowit id, is;
    lk_rowit_init(&id, d, 1, 0);
    lk_rowit_init(&is, s, 1, 0);
    for (int64_t r = 0; r < rows; r++, lk_rowit_next(&id), lk_rowit_next(&is))
        for (int64_t i = 0; i < n; i++) {
            float x = lk_load_f(s->data, s->dtype, is.off + i * ss);
            lk_store_f(d->data, d->dtype, id.off + i * ds, quant ? x / a->scale : x * a->scale);
        }
    return LK_OK;
}
