/*
 * Addressing of paged caches in the ND and NZ layouts (see "paged caches" in
 * include/llmkern.h). One logical entry is (page, slot, head, dim); both layouts map it
 * to an element offset:
 *   ND  [num_blocks, block_size, H, D]   off = p*s0 + s*s1 + h*s2 + d*s3
 *   NZ  [num_blocks, C/T, block_size, T], c = h*D + d, tile T = 16 (2- and 4-byte
 *       dtypes) or 32 (fp8: Ascend's 32-byte fractal for 8-bit types)
 *                                         off = p*s0 + (c/T)*s1 + s*s2 + (c%T)*s3
 * Every kernel that reads or writes a paged cache goes through lk_paged_off (or, on a
 * fast path, the chunk form: 16 consecutive dims of one head starting at a multiple of
 * 16 are contiguous in NZ when s3 == 1, for either tile: half a 32-wide tile row is such
 * a chunk; compute the chunk's offset with lk_paged_off, not (d / 16) * s1).
 */
#ifndef LK_PAGED_H
#define LK_PAGED_H

#include <string.h>

#include "core.h"

typedef struct {
    void *data;
    lk_dtype dtype;
    lk_kv_layout layout;
    int64_t num_blocks, block_size, H, D;
    int64_t s0, s1, s2, s3; /* strides of the 4 physical dims (element units) */
    int64_t tile;           /* NZ tile width: 16, or 32 for 1-byte dtypes (ND: 16, unused) */
} lk_paged;

/* Validate `t` as a paged cache of H heads x D dims in `layout` and fill pc.
 * ND: t is [num_blocks, block_size, H, D] (or, with H == 1, also [num_blocks,
 * block_size, D]); NZ: t is [num_blocks, H*D/16, block_size, 16] with H*D % 16 == 0.
 * Messages name `name`. fp8 caches are rejected (LK_ERR_DTYPE). */
lk_status lk_paged_init(lk_paged *pc, const lk_tensor *t, lk_kv_layout layout, int64_t H,
                        int64_t D, const char *name);
/* lk_paged_init that also accepts fp8 caches; an fp8 NZ cache is [num_blocks, H*D/32,
 * block_size, 32] with H*D % 32 == 0 (tile 32). */
lk_status lk_paged_init8(lk_paged *pc, const lk_tensor *t, lk_kv_layout layout, int64_t H,
                         int64_t D, const char *name);

/* An LK_KV_DS_MLA cache (include/llmkern.h, "fp8_ds_mla caches"): t [num_blocks,
 * block_size, E] or [num_blocks, block_size, 1, E] of 1-byte elements (LK_F8E4M3 /
 * LK_I8), E = lk_ds_entry_bytes(Dl, Dr), Dl a positive multiple of 128, last-dim stride 1,
 * the other strides even and data 2-byte aligned. Filled as two ND views of H = 1:
 * lat = the e4m3 codes (D = Dl, byte strides), rope = the bf16 part (D = Dr, data at
 * byte Dl + Dl / 32 of an entry, strides halved). The f32 scale g of an entry lies at
 * byte Dl + 4 g of the entry (lk_ds_scale). Messages name `name`, a latent dim that is not a
 * positive multiple of 128 `dl_name` (the argument Dl comes from). */
lk_status lk_ds_init(lk_paged *lat, lk_paged *rope, const lk_tensor *t, int64_t Dl, int64_t Dr,
                     const char *name, const char *dl_name);

#define LK_DS_TILE 128 /* latent dims per scale */

/* bytes of an entry of Dl latent and Dr rope dims, or -1 where it overflows */
static inline int64_t lk_ds_entry_bytes(int64_t Dl, int64_t Dr) {
    int64_t r;
    if (Dl < 0 || Dr < 0 || Dr > (INT64_MAX - Dl - Dl / 32) / 2) return -1;
    r = Dl + Dl / 32 + 2 * Dr;
    return r;
}

/* scale g of the entry whose codes start at p (lat part's entry address); unaligned */
static inline float lk_ds_scale(const void *p, int64_t Dl, int64_t g) {
    float s;
    memcpy(&s, (const char *)p + Dl + 4 * g, sizeof s);
    return s;
}

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
    if (pc->tile == 32) return page * pc->s0 + (c >> 5) * pc->s1 + slot * pc->s2 + (c & 31) * pc->s3;
    return page * pc->s0 + (c >> 4) * pc->s1 + slot * pc->s2 + (c & 15) * pc->s3;
}

static inline int64_t lk_paged_slots(const lk_paged *pc) { return pc->num_blocks * pc->block_size; }

#endif
