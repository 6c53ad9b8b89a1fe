/*
 * The fp8 pieces of the SIMD fp8 activation kernels (src/cpu/simd/fp8_quant.c,
 * rms_norm.c, merge.c), over the vector layer:
 *   lkq_store_fp8(p, dt, v, n)  the first n lanes of v as fp8 (dtype dt) at p: the vector
 *                               layer's fp8 store, bit for bit the src/core/fp8.h converter
 *                               the reference uses (tests/vec_check.c)
 *   lkq_absmax(m, v)            lane-wise max(m, |v|), NaN lanes of v ignored
 *   lkq_fp8_row(d, dt, s, st, n, scale)  d[0, n) = s[0, n) where exactly one of the
 *                               dtypes is fp8 and the other f32 / f16 / bf16: into fp8
 *                               fp8(s / scale), out of fp8 round(s * scale) (one IEEE
 *                               division / multiplication, as the references; the cache
 *                               writes, gathers, convert_fp8, scaled_fp8_quant's rows
 *                               and merge's fp8 out)
 *   lkq_row_absmax(x, dt, D)    max |x[i]| over a row of D values of dtype dt (f32, f16,
 *                               bf16), NaN ignored (also the int8 kernels'
 *                               src/cpu/simd/int8_quant.c)
 * The kernels' row loops take their dtypes as literals (LKQ_FP8_OUT below): with a dtype
 * read at run time the vector layer's branches and the fp8 encoder's constants stay
 * inside the loop, per vector.
 */
#ifndef LK_SIMD_FP8_STORE_H
#define LK_SIMD_FP8_STORE_H

#include "../fp8_quant.h"
#include "../vec/lkv.h"

/* F(xd, od): xd the literal of a float dtype xt (f32, f16, bf16), od of an fp8 dtype ot */
#define LKQ_FP8_OUT(xt, ot, F)                                       \
    do {                                                             \
        if ((xt) == LK_BF16) LKQ__OUT(ot, F, LK_BF16);               \
        else if ((xt) == LK_F16) LKQ__OUT(ot, F, LK_F16);            \
        else LKQ__OUT(ot, F, LK_F32);                                \
    } while (0)
#define LKQ__OUT(ot, F, xd)                                          \
    do {                                                             \
        if ((ot) == LK_F8E4M3) F(xd, LK_F8E4M3);                     \
        else F(xd, LK_F8E5M2);                                       \
    } while (0)

LK_ALWAYS_INLINE void lkq_store_fp8(void *p, lk_dtype dt, lkv_f32 v, int64_t n) {
    if (n == LKV_W) lkv_store_f8(p, dt, v);
    else lkv_store_part(p, dt, v, n);
}

/* lkv_max(a, m) gives m where a is NaN on every ISA (x86 max_ps returns its second
 * operand for a NaN; the NEON form is a > m ? a : m) */
LK_ALWAYS_INLINE lkv_f32 lkq_absmax(lkv_f32 m, lkv_f32 v) {
    return lkv_max(lkv_andnot(lkv_set1(-0.0f), v), m);
}

/* lkq_fp8_row with literal dtypes (one of them fp8, the other f32 / f16 / bf16) */
LK_ALWAYS_INLINE void lkq_fp8_row_dt(char *d, lk_dtype dt, const char *s, lk_dtype st, int64_t n, float scale) {
    int64_t des = lk_esize(dt), ses = lk_esize(st), i = 0;
    int q = dt == LK_F8E4M3 || dt == LK_F8E5M2; /* into fp8 */
    lkv_f32 k = lkv_set1(scale);
    for (; i + 2 * LKV_W <= n; i += 2 * LKV_W) {
        lkv_f32 a = lkv_load(s + i * ses, st), b = lkv_load(s + (i + LKV_W) * ses, st);
        lkv_store(d + i * des, dt, q ? lkv_div(a, k) : lkv_mul(a, k));
        lkv_store(d + (i + LKV_W) * des, dt, q ? lkv_div(b, k) : lkv_mul(b, k));
    }
    for (; i < n; i += LKV_W) {
        int64_t m = n - i < LKV_W ? n - i : LKV_W;
        lkv_f32 a = m == LKV_W ? lkv_load(s + i * ses, st) : lkv_load_part(s + i * ses, st, m);
        a = q ? lkv_div(a, k) : lkv_mul(a, k);
        if (m == LKV_W) lkv_store(d + i * des, dt, a);
        else lkv_store_part(d + i * des, dt, a, m);
    }
}

/* the (fp8, float) pair as literals; a pair of two fp8 dtypes is not served (the float
 * side would be read as f32): the callers' validation rules it out */
static inline void lkq_fp8_row(char *d, lk_dtype dt, const char *s, lk_dtype st, int64_t n, float scale) {
#define INTO_FP8(xd, od) lkq_fp8_row_dt(d, od, s, xd, n, scale)
#define FROM_FP8(xd, od) lkq_fp8_row_dt(d, xd, s, od, n, scale)
    if (dt == LK_F8E4M3 || dt == LK_F8E5M2) LKQ_FP8_OUT(st, dt, INTO_FP8);
    else LKQ_FP8_OUT(dt, st, FROM_FP8);
#undef INTO_FP8
#undef FROM_FP8
}

LK_ALWAYS_INLINE float lkq_row_absmax_dt(const char *x, lk_dtype dt, int64_t D) {
    int64_t es = lk_esize(dt), i = 0;
    lkv_f32 m0 = lkv_zero(), m1 = m0;
    for (; i + 2 * LKV_W <= D; i += 2 * LKV_W) {
        m0 = lkq_absmax(m0, lkv_load(x + i * es, dt));
        m1 = lkq_absmax(m1, lkv_load(x + (i + LKV_W) * es, dt));
    }
    if (i + LKV_W <= D) m0 = lkq_absmax(m0, lkv_load(x + i * es, dt)), i += LKV_W;
    if (i < D) m1 = lkq_absmax(m1, lkv_load_part(x + i * es, dt, D - i)); /* zero-filled lanes */
    return lkv_hmax(lkv_max(m0, m1));
}

/* the row's dtype as a literal for the inlined loop (a dtype read per vector costs its
 * branches and constants inside the loop) */
static inline float lkq_row_absmax(const char *x, lk_dtype dt, int64_t D) {
    if (dt == LK_BF16) return lkq_row_absmax_dt(x, LK_BF16, D);
    if (dt == LK_F16) return lkq_row_absmax_dt(x, LK_F16, D);
    return lkq_row_absmax_dt(x, LK_F32, D);
}

#endif
