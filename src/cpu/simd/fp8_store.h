/*
 * The fp8 pieces of the SIMD fp8 activation kernels (src/cpu/simd/fp8_quant.c,
 * rms_norm.c, merge.c), over the vector layer:
 *   lkq_store_fp8(p, dt, v, n)  the first n lanes of v as fp8 (dtype dt) at p, bit for bit
 *                               the src/core/fp8.h converter
 *   lkq_absmax(m, v)            lane-wise max(m, |v|), NaN lanes of v ignored
 * Until the vector layer stores fp8 itself, the store converts lane by lane through the
 * scalar converter (the same function the reference uses).
 */
#ifndef LK_SIMD_FP8_STORE_H
#define LK_SIMD_FP8_STORE_H

#include "../fp8_quant.h"
#include "../vec/lkv.h"

LK_ALWAYS_INLINE void lkq_store_fp8(void *p, lk_dtype dt, lkv_f32 v, int64_t n) {
    float t[LKV_W];
    uint8_t *q = p;
    lkv_storeu(t, v);
    if (dt == LK_F8E4M3)
        for (int64_t k = 0; k < n; k++) q[k] = lk_f32_to_f8e4m3(t[k]);
    else
        for (int64_t k = 0; k < n; k++) q[k] = lk_f32_to_f8e5m2(t[k]);
}

/* lkv_max(a, m) gives m where a is NaN on every ISA (x86 max_ps returns its second
 * operand for a NaN; the NEON form is a > m ? a : m) */
LK_ALWAYS_INLINE lkv_f32 lkq_absmax(lkv_f32 m, lkv_f32 v) {
    return lkv_max(lkv_andnot(lkv_set1(-0.0f), v), m);
}

#endif
