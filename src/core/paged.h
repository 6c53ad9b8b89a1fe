/*
 * Addressing of paged caches in the ND and NZ layouts (see "paged caches" in
 * include/llmkern.h). One logical entry is (page, slot, head, dim); both layouts map it
 * to an element offset:
 *   ND  [num_blocks, block_size, H, D]   off = p*s0 + s*s1 + h*s2 + d*s3
 *   NZ  [num_blocks, C/16, block_size, 16], c = h*D + d
 *                                         off = p*s0 + (c/16)*s1 + s*s2 + (c%16)*s3
 * Every kernel that reads or writes a paged cache goes through lk_paged_off (or, on a
 * fast path, the chunk form: 16 consecutive dims of one head starting at a multiple of
 * 16 are contiguous in NZ when s3 == 1).
 */
#ifndef LK_PAGED_H
#define LK_PAGED_H

#include "core.h"

typedef struct {
    void *data;
    lk_dtype dtype;
    lk_kv_layout layout;
    int64_t num_blocks, block_size, H, D;
    int64_t s0, s1, s2, s3; /* strides of the 4 physical dims (element units) */
} lk_paged;

/* Validate `t` as a paged cache of H heads x D dims in `layout` and fill pc.
 * ND: t is [num_blocks, block_size, H, D] (or, with H == 1, also [num_blocks,
 * block_size, D]); NZ: t is [num_blocks, H*D/16, block_size, 16] with H*D % 16 == 0.
 * Messages name `name`. */
lk_status lk_paged_init(lk_paged *pc, const lk_tensor *t, lk_kv_layout layout, int64_t H,
                        int64_t D, const char *name);

/* Zero the strides of physical dims of size <= 1, and every stride of an empty cache.
 * Such a dim is never stepped, and lk_check_view does not bound its stride (a size-1 dim
 * adds no offset, an empty view touches nothing), so kernels that multiply strides (byte
 * steps, chunk strides, slot offsets) would overflow on a huge one. lk_paged_init
 * applies it; callers filling an lk_paged by hand (dense K/V) do too. */
void lk_paged_drop_unit_strides(lk_paged *pc);

static inline int64_t lk_paged_off(const lk_paged *pc, int64_t page, int64_t slot, int64_t h,
                                   int64_t d) {
    if (pc->layout == LK_KV_ND) return page * pc->s0 + slot * pc->s1 + h * pc->s2 + d * pc->s3;
    int64_t c = h * pc->D + d;
    return page * pc->s0 + (c >> 4) * pc->s1 + slot * pc->s2 + (c & 15) * pc->s3;
}

static inline int64_t lk_paged_slots(const lk_paged *pc) { return pc->num_blocks * pc->block_size; }

#endif
