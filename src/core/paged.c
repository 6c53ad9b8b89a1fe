/* Paged cache validation (see paged.h). */
#include "paged.h"

static lk_status paged_init(lk_paged *pc, const lk_tensor *t, lk_kv_layout layout, int64_t H, int64_t D,
                            const char *name, int fp8_ok) {
    lk_status s;
    lk_status (*check)(const lk_tensor *, const char *, int, int) = fp8_ok ? lk_check_float8 : lk_check_float;
    if (layout == LK_KV_DS_MLA)
        return lk_fail(LK_ERR_VALUE, "layout: LK_KV_DS_MLA (fp8_ds_mla) is an MLA latent cache format, taken by "
                       "lk_concat_and_cache_mla_fp8 / _rope, lk_gather_cache_fp8 / _starts and lk_mla_decode only");
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

lk_status lk_ds_init(lk_paged *lat, lk_paged *rope, const lk_tensor *t, int64_t Dl, int64_t Dr,
                     const char *name, const char *dl_name) {
    lk_status s;
    if (!t) return lk_fail(LK_ERR_NULL, "%s: tensor pointer is NULL", name);
    if ((s = lk_check_view(t, name, 3, 4))) return s;
    if (t->dtype != LK_F8E4M3 && t->dtype != LK_I8)
        return lk_fail(LK_ERR_DTYPE, "%s: dtype %s: an fp8_ds_mla cache holds bytes (f8e4m3 or i8 elements)", name,
                       lk_dtype_name(t->dtype));
    if (Dl < LK_DS_TILE || Dl % LK_DS_TILE)
        return lk_fail(LK_ERR_SHAPE, "%s: latent dim %lld: fp8_ds_mla needs a positive multiple of %d (cache %s)",
                       dl_name, (long long)Dl, LK_DS_TILE, name);
    int64_t E = lk_ds_entry_bytes(Dl, Dr), last = t->ndim - 1;
    if (E < 0) return lk_fail(LK_ERR_OVERFLOW, "%s: entry size overflows int64", name);
    if (t->shape[last] != E || (t->ndim == 4 && t->shape[2] != 1))
        return lk_fail(LK_ERR_SHAPE, "%s: shape %s: fp8_ds_mla entries of %lld latent + %lld rope dims need "
                       "[num_blocks, block_size, %lld] (or [.., 1, %lld]) bytes", name, lk_shape_str(t), (long long)Dl,
                       (long long)Dr, (long long)E, (long long)E);
    int64_t nb = t->shape[0], bs = t->shape[1], s0 = nb > 1 ? t->stride[0] : 0, s1 = bs > 1 ? t->stride[1] : 0;
    int empty = nb == 0 || bs == 0;
    if (!empty && t->stride[last] != 1)
        return lk_fail(LK_ERR_SHAPE, "%s: last-dim stride %lld: an fp8_ds_mla entry must be contiguous (stride 1)",
                       name, (long long)t->stride[last]);
    if (!empty && ((s0 | s1) & 1 || (uintptr_t)t->data & 1))
        return lk_fail(LK_ERR_SHAPE, "%s: fp8_ds_mla entries must be 2-byte aligned (even strides and address) "
                       "for their bf16 rope part", name);
    if (bs < 1 && nb > 0) return lk_fail(LK_ERR_SHAPE, "%s: block_size must be >= 1", name);
    *lat = (lk_paged){t->data, LK_F8E4M3, LK_KV_ND, nb, bs, 1, Dl, s0, s1, 0, 1, 16};
    char *rp = t->data ? (char *)t->data + Dl + Dl / 32 : NULL; /* no offset on a NULL (empty) view */
    *rope = (lk_paged){rp, LK_BF16, LK_KV_ND, nb, bs, 1, Dr, s0 / 2, s1 / 2, 0, 1, 16};
    lk_paged_drop_unit_strides(lat);
    lk_paged_drop_unit_strides(rope);
    return LK_OK;
}
