/*
 * concat_and_cache_mla and gather_cache, scalar reference.
 *
 *   concat_and_cache_mla: for t < N with slot = slot_mapping[t] >= 0,
 *     page = slot / block_size, s = slot % block_size:
 *       kv_c_cache(page, s, 0, d)         = round(kv_c[t, d]),  d < Dl
 *       k_pe_cache(page, s, 0, pe_c0 + d) = round(k_pe[t, d]),  d < Dr
 *   gather_cache: for request b, token j < seq_lens[b], t = sum(seq_lens[:b]) + j:
 *       out[t, h, d] = round(cache(block_table[b, p / block_size], p % block_size, h, d))
 *     with p = start_b + j (seq_starts; 0 without)
 *
 * Every cache element is addressed through lk_paged_off, so ND and NZ (and any strides)
 * take the same loops. round() is the one conversion to the destination dtype; same
 * dtype is a bit copy (NaN payloads kept). fp8 caches (since 0.3): concat stores
 * fp8(x / scale), gather reads f32(q) * scale (one f32 operation, then the rounding).
 * fp8_ds_mla caches (LK_KV_DS_MLA, include/llmkern.h): per token and tile g of 128
 * latent dims
 *   write:  s_g = max(absmax(tile) / 448, FLT_MIN), code = e4m3(x / s_g), rope = bf16(k_pe)
 *   gather: out = round(f32(code) * s_g) | round(rope)
 * (absmax ignores NaN; lk_ds_scale reads the record's scales). No threads.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "../../core/half.h"
#include "../kernels.h"

static inline int is_fp8(lk_dtype dt) { return dt == LK_F8E4M3 || dt == LK_F8E5M2; }

/* dst[doff] = round(src[soff]); into fp8: fp8(src / scale); out of fp8: round(src * scale) */
static inline void copy_elem(void *dst, lk_dtype dt, int64_t doff, const void *src, lk_dtype st,
                             int64_t soff, float scale) {
    size_t es = lk_dtype_size(dt);
    if (dt == st) memcpy((char *)dst + doff * (int64_t)es, (const char *)src + soff * (int64_t)es, es);
    else if (is_fp8(dt)) lk_store_f(dst, dt, doff, lk_load_f(src, st, soff) / scale);
    else if (is_fp8(st)) lk_store_f(dst, dt, doff, lk_load_f(src, st, soff) * scale);
    else lk_store_f(dst, dt, doff, lk_load_f(src, st, soff));
}

/* row t of src [T, n] into dims [c0, c0 + n) of the H = 1 entry (page, s) of pc */
static void write_entry(const lk_paged *pc, int64_t page, int64_t s, int64_t c0,
                        const lk_tensor *src, int64_t t, float scale) {
    int64_t n = src->shape[1];
    for (int64_t d = 0; d < n; d++)
        copy_elem(pc->data, pc->dtype, lk_paged_off(pc, page, s, 0, c0 + d), src->data, src->dtype,
                  t * src->stride[0] + d * src->stride[1], scale);
}

lk_status lk_ref_concat_and_cache_mla(const lk_mla_cache_args *a) {
    const lk_tensor *sm = &a->slot_mapping; // [N]
    int64_t N = sm->shape[0], bs = a->kv_c_cache.block_size;
    for (int64_t t = 0; t < N; t++) {
        int64_t slot = lk_load_index(sm->data, sm->dtype, t * sm->stride[0]);
        if (slot < 0) continue; /* padding token */
        write_entry(&a->kv_c_cache, slot / bs, slot % bs, 0, &a->kv_c, t, a->scale);        // kv_c [T, Dl]
        write_entry(&a->k_pe_cache, slot / bs, slot % bs, a->pe_c0, &a->k_pe, t, a->scale); // k_pe [T, Dr]
    }
    return LK_OK;
}

lk_status lk_ref_gather_cache(const lk_gather_cache_args *a) {
    const lk_paged *pc = &a->cache;          // pages of H x D entries
    const lk_tensor *out = &a->out;          // [S, H, D]
    const lk_tensor *bt = &a->block_table;   // [B, max_pages] i32
    const lk_tensor *sl = &a->seq_lens;      // [B] i32
    const int32_t *btd = bt->data, *sld = sl->data;
    int64_t B = bt->shape[0], bs = pc->block_size, t = 0;
    for (int64_t b = 0; b < B; b++) {
        int64_t len = sld[b * sl->stride[0]], st = lk_gather_start(a, b);
        for (int64_t j = 0; j < len; j++, t++) {
            int64_t p = st + j; /* position in the request's block table */
            int64_t page = btd[b * bt->stride[0] + (p / bs) * bt->stride[1]], s = p % bs;
            for (int64_t h = 0; h < pc->H; h++)
                for (int64_t d = 0; d < pc->D; d++)
                    copy_elem(out->data, out->dtype,
                              t * out->stride[0] + h * out->stride[1] + d * out->stride[2], pc->data,
                              pc->dtype, lk_paged_off(pc, page, s, h, d), a->scale);
        }
    }
    return LK_OK;
}

/* ---------------------------------------------------------------- fp8_ds_mla */

/* scale of tile g of row t of kv_c [T, Dl]: max(absmax / 448, FLT_MIN), NaN ignored */
static float ds_tile_scale(const lk_tensor *x, int64_t t, int64_t g) {
    float m = 0.0f;
    for (int64_t d = g * LK_DS_TILE; d < (g + 1) * LK_DS_TILE; d++) {
        float v = fabsf(lk_load_f(x->data, x->dtype, t * x->stride[0] + d * x->stride[1]));
        if (v > m) m = v; /* false for NaN */
    }
    return fmaxf(m / 448.0f, FLT_MIN);
}

lk_status lk_ref_concat_and_cache_mla_ds(const lk_mla_cache_args *a) {
    const lk_tensor *sm = &a->slot_mapping, *x = &a->kv_c, *pe = &a->k_pe; // [N], [T, Dl], [T, Dr]
    const lk_paged *lat = &a->kv_c_cache, *rope = &a->k_pe_cache;
    int64_t N = sm->shape[0], bs = lat->block_size, Dl = x->shape[1], Dr = pe->shape[1];
    for (int64_t t = 0; t < N; t++) {
        int64_t slot = lk_load_index(sm->data, sm->dtype, t * sm->stride[0]);
        if (slot < 0) continue; /* padding token */
        char *e = (char *)lat->data + lk_paged_off(lat, slot / bs, slot % bs, 0, 0);
        for (int64_t g = 0; g < Dl / LK_DS_TILE; g++) {
            float sc = ds_tile_scale(x, t, g);
            memcpy(e + Dl + 4 * g, &sc, sizeof sc);
            for (int64_t d = g * LK_DS_TILE; d < (g + 1) * LK_DS_TILE; d++)
                lk_store_f(e, LK_F8E4M3, d, lk_load_f(x->data, x->dtype, t * x->stride[0] + d * x->stride[1]) / sc);
        }
        for (int64_t r = 0; r < Dr; r++)
            copy_elem(rope->data, LK_BF16, lk_paged_off(rope, slot / bs, slot % bs, 0, r), pe->data, pe->dtype,
                      t * pe->stride[0] + r * pe->stride[1], 1.0f);
    }
    return LK_OK;
}

lk_status lk_ref_gather_cache_ds(const lk_gather_cache_args *a) {
    const lk_paged *lat = &a->cache, *rope = &a->rope; // codes [.., Dl], bf16 [.., Dr]
    const lk_tensor *out = &a->out;                    // [S, 1, Dl + Dr]
    const lk_tensor *bt = &a->block_table;             // [B, max_pages] i32
    const lk_tensor *sl = &a->seq_lens;                // [B] i32
    const int32_t *btd = bt->data, *sld = sl->data;
    int64_t B = bt->shape[0], bs = lat->block_size, Dl = lat->D, Dr = rope->D, t = 0;
    for (int64_t b = 0; b < B; b++) {
        int64_t len = sld[b * sl->stride[0]], st = lk_gather_start(a, b);
        for (int64_t j = 0; j < len; j++, t++) {
            int64_t p = st + j;
            int64_t page = btd[b * bt->stride[0] + (p / bs) * bt->stride[1]], s = p % bs;
            const char *e = (const char *)lat->data + lk_paged_off(lat, page, s, 0, 0);
            for (int64_t d = 0; d < Dl; d++)
                lk_store_f(out->data, out->dtype, t * out->stride[0] + d * out->stride[2],
                           lk_load_f(e, LK_F8E4M3, d) * lk_ds_scale(e, Dl, d / LK_DS_TILE));
            for (int64_t r = 0; r < Dr; r++)
                copy_elem(out->data, out->dtype, t * out->stride[0] + (Dl + r) * out->stride[2], rope->data,
                          LK_BF16, lk_paged_off(rope, page, s, 0, r), 1.0f);
        }
    }
    return LK_OK;
}
