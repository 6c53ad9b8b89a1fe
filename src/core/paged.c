/* Paged cache validation (see paged.h). */
#include "paged.h"

static lk_status paged_init(lk_paged *pc, const lk_tensor *t, lk_kv_layout layout, int64_t H, int64_t D,
                            const char *name, int fp8_ok) {
    lk_status s;
    lk_status (*check)(const lk_tensor *, const char *, int, int) = fp8_ok ? lk_check_float8 : lk_check_float;
    if (layout != LK_KV_ND && layout != LK_KV_NZ)
        return lk_fail(LK_ERR_VALUE, "layout: unknown value %d", (int)layout);
    if (layout == LK_KV_ND && t && t->ndim == 3 && H == 1) {
        if ((s = check(t, name, 3, 3))) return s;
        if (t->shape[2] != D)
            return lk_fail(LK_ERR_SHAPE, "%s: shape %s: last dim must be %lld", name,
                           lk_shape_str(t), (long long)D);
        *pc = (lk_paged){t->data, t->dtype, layout, t->shape[0], t->shape[1], 1, D,
                         t->stride[0], t->stride[1], 0, t->stride[2], 16};
    } else if (layout == LK_KV_ND) {
        if ((s = check(t, name, 4, 4))) return s;
        if (t->shape[2] != H || t->shape[3] != D)
            return lk_fail(LK_ERR_SHAPE, "%s: shape %s: expected [num_blocks, block_size, %lld, %lld]",
                           name, lk_shape_str(t), (long long)H, (long long)D);
        *pc = (lk_paged){t->data, t->dtype, layout, t->shape[0], t->shape[1], H, D,
                         t->stride[0], t->stride[1], t->stride[2], t->stride[3], 16};
    } else {
        if ((s = check(t, name, 4, 4))) return s;
        int64_t C, T = lk_dtype_size(t->dtype) == 1 ? 32 : 16;
        if (__builtin_mul_overflow(H, D, &C))
            return lk_fail(LK_ERR_OVERFLOW, "%s: heads x dims (%lld x %lld) overflows int64", name, (long long)H,
                           (long long)D);
        if (C % T)
            return lk_fail(LK_ERR_SHAPE, "%s: NZ layout (%s) needs heads * dims (%lld) to be a multiple of %lld",
                           name, lk_dtype_name(t->dtype), (long long)C, (long long)T);
        if (t->shape[1] != C / T || t->shape[3] != T)
            return lk_fail(LK_ERR_SHAPE, "%s: NZ shape %s: expected [num_blocks, %lld, block_size, %lld]",
                           name, lk_shape_str(t), (long long)(C / T), (long long)T);
        *pc = (lk_paged){t->data, t->dtype, layout, t->shape[0], t->shape[2], H, D,
                         t->stride[0], t->stride[1], t->stride[2], t->stride[3], T};
    }
    if (pc->block_size < 1 && pc->num_blocks > 0)
        return lk_fail(LK_ERR_SHAPE, "%s: block_size must be >= 1", name);
    lk_paged_drop_unit_strides(pc);
    return LK_OK;
}

lk_status lk_paged_init(lk_paged *pc, const lk_tensor *t, lk_kv_layout layout, int64_t H,
                        int64_t D, const char *name) {
    return paged_init(pc, t, layout, H, D, name, 0);
}

lk_status lk_paged_init8(lk_paged *pc, const lk_tensor *t, lk_kv_layout layout, int64_t H,
                         int64_t D, const char *name) {
    return paged_init(pc, t, layout, H, D, name, 1);
}

void lk_paged_drop_unit_strides(lk_paged *pc) {
    int nz = pc->layout == LK_KV_NZ;
    if (pc->tile != 32) pc->tile = 16; /* hand-filled (dense K/V) views: the 16-wide default */
    int64_t n1 = nz ? pc->H * pc->D / pc->tile : pc->block_size, n2 = nz ? pc->block_size : pc->H;
    int64_t n3 = nz ? pc->tile : pc->D;
    if (pc->num_blocks == 0 || n1 == 0 || n2 == 0 || n3 == 0) { /* empty: no stride is validated */
        pc->s0 = pc->s1 = pc->s2 = pc->s3 = 0;
        return;
    }
    if (pc->num_blocks <= 1) pc->s0 = 0;
    if (n1 <= 1) pc->s1 = 0;
    if (n2 <= 1) pc->s2 = 0;
    if (n3 <= 1) pc->s3 = 0;
}
