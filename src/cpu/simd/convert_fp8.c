/*
 * convert_fp8, every vector ISA (src/cpu/vec/lkv.h, W lanes).
 *
 *   dst fp8:  dst[i] = fp8(f32(src[i]) / scale);  src fp8:  dst[i] = round(f32(src[i]) * scale)
 *
 * Shapes: dst, src [..., n] of one shape. Fast path: last-dim stride 1 on both (or
 * n == 1); other layouts go to the reference. Per row: W lanes loaded as f32 (fp8 loads
 * exact), one IEEE division / multiplication by the broadcast scale (as the reference),
 * one rounding store through lkv_store (fp8: round to nearest even, saturating; all
 * bit-identical to src/core/half.h and fp8.h), partial tail. Work split: rows,
 * contiguous chunks per thread (lk_parallel_for); rows are disjoint.
 */
#include "fp8_store.h"

static void convert_rows(void *ctx, int64_t r0, int64_t r1) {
    const lk_convert_fp8_args *a = ctx;
    const lk_tensor *d = &a->dst, *s = &a->src; // [..., n]
    int64_t n = d->shape[d->ndim - 1];
    lk_rowit id, is;
    lk_rowit_init(&id, d, 1, r0);
    lk_rowit_init(&is, s, 1, r0);
    for (int64_t r = r0; r < r1; r++, lk_rowit_next(&id), lk_rowit_next(&is))
        lkq_fp8_row(lk_at(d, id.off), d->dtype, lk_at(s, is.off), s->dtype, n, a->scale);
}

static lk_status convert_fp8(const lk_convert_fp8_args *a) {
    const lk_tensor *d = &a->dst, *s = &a->src;
    int last = d->ndim - 1;
    if (d->shape[last] > 1 && (d->stride[last] != 1 || s->stride[last] != 1)) return lk_ref_convert_fp8(a);
    int64_t n = d->shape[last];
    lk_parallel_for(lk_rows(d, 1), n * (lk_esize(d->dtype) + lk_esize(s->dtype)), convert_rows, (void *)a);
    return LK_OK;
}

void LKV_FN(register_convert_fp8)(lk_kernel_table *t) { t->convert_fp8 = convert_fp8; }
