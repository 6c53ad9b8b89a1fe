/*
 * causal_softmax, every vector ISA (src/cpu/vec/lkv.h, W lanes).
 *
 *   query row i sees keys j < nv(i) = clamp(i + k_len - q_len + 1, 0, k_len)
 *   out[i, j] = exp(x[i, j] - shift) * inv(l) for j < nv, 0 for j >= nv
 *   shift = max visible (0 if -inf), l = sum exp(x - shift); inv(l) = 1 / l, 0 if l = 0
 * Rules (-inf, NaN, +inf, rows that see no key) from src/common/attn_state.h, shared
 * with the reference.
 *
 * Shapes: x, out [..., q_len, k_len], each its own float dtype. Fast path: last-dim
 * stride 1 on x and out, else the reference. Work split: the rows (leading dims x
 * q_len), contiguous chunks per thread (lk_parallel_for). Per row: pass 1 max and NaN
 * test (W lanes, tail lanes -inf; a NaN or +inf row is filled with NaN, so the
 * others only need exp of arguments <= 0, lkv_exp_nonpos), pass 2 exp and f32 sum,
 * keeping exp(x - shift) in f32 (in out itself when out is f32, else in a stack buffer
 * of SOFTMAX_SCRATCH floats; longer rows recompute it, same bits), pass 3 scales by inv
 * and rounds once to out's dtype. out may be x itself: each block is loaded before it
 * is stored.
 */
#include <math.h>
#include <string.h>

#include "../../common/attn_state.h"
#include "../kernels.h"
#include "../vec/lkv.h"

#define SOFTMAX_SCRATCH 8192
/* the pass bodies are inlined into per-dtype wrappers (switches on the dtype with
 * literal cases) so that their loops carry no dtype tests: ~17% less time per row */

/* max of x[0, nv) with NaNs skipped (lkv_max keeps its second operand); *any_nan tells
 * whether one was seen */
LK_ALWAYS_INLINE float row_max(const char *x, lk_dtype dt, int64_t nv, int *any_nan) {
    int64_t es = lk_esize(dt), j = 0;
    lkv_f32 ninf = lkv_set1(-INFINITY), m0 = ninf, m1 = ninf, m2 = ninf, m3 = ninf;
    lkv_m nan = lkv_m_none();
    for (; j + 4 * LKV_W <= nv; j += 4 * LKV_W) {
        lkv_f32 a = lkv_load(x + j * es, dt), b = lkv_load(x + (j + LKV_W) * es, dt);
        lkv_f32 c = lkv_load(x + (j + 2 * LKV_W) * es, dt), d = lkv_load(x + (j + 3 * LKV_W) * es, dt);
        m0 = lkv_max(a, m0), m1 = lkv_max(b, m1);
        m2 = lkv_max(c, m2), m3 = lkv_max(d, m3);
        nan = lkv_m_or(nan, lkv_m_or(lkv_unord(a, b), lkv_unord(c, d)));
    }
    for (; j + LKV_W <= nv; j += LKV_W) {
        lkv_f32 a = lkv_load(x + j * es, dt);
        m0 = lkv_max(a, m0);
        nan = lkv_m_or(nan, lkv_unord(a, a));
    }
    if (j < nv) { /* lanes past the row are 0 from the load, -inf for the max */
        lkv_f32 a = lkv_load_part(x + j * es, dt, nv - j);
        m1 = lkv_max(lkv_blend(ninf, a, lkv_m_first(nv - j)), m1);
        nan = lkv_m_or(nan, lkv_unord(a, a));
    }
    *any_nan = lkv_m_any(nan);
    return lkv_hmax(lkv_max(lkv_max(m0, m1), lkv_max(m2, m3)));
}

/* sum of exp(x[j] - shift) over [0, nv) (arguments <= 0: the row is not NaN); the
 * terms are stored to e (f32) unless NULL */
LK_ALWAYS_INLINE float exp_sum(const char *x, lk_dtype dt, int64_t nv, float shift, float *e) {
    int64_t es = lk_esize(dt), j = 0;
    lkv_f32 sh = lkv_set1(shift), s0 = lkv_zero(), s1 = s0, s2 = s0, s3 = s0;
    for (; j + 4 * LKV_W <= nv; j += 4 * LKV_W) {
        lkv_f32 p0 = lkv_exp_nonpos(lkv_sub(lkv_load(x + j * es, dt), sh));
        lkv_f32 p1 = lkv_exp_nonpos(lkv_sub(lkv_load(x + (j + LKV_W) * es, dt), sh));
        lkv_f32 p2 = lkv_exp_nonpos(lkv_sub(lkv_load(x + (j + 2 * LKV_W) * es, dt), sh));
        lkv_f32 p3 = lkv_exp_nonpos(lkv_sub(lkv_load(x + (j + 3 * LKV_W) * es, dt), sh));
        if (e) {
            lkv_storeu(e + j, p0), lkv_storeu(e + j + LKV_W, p1);
            lkv_storeu(e + j + 2 * LKV_W, p2), lkv_storeu(e + j + 3 * LKV_W, p3);
        }
        s0 = lkv_add(s0, p0), s1 = lkv_add(s1, p1);
        s2 = lkv_add(s2, p2), s3 = lkv_add(s3, p3);
    }
    for (; j + LKV_W <= nv; j += LKV_W) {
        lkv_f32 p = lkv_exp_nonpos(lkv_sub(lkv_load(x + j * es, dt), sh));
        if (e) lkv_storeu(e + j, p);
        s0 = lkv_add(s0, p);
    }
    if (j < nv) {
        lkv_f32 v = lkv_load_part(x + j * es, dt, nv - j);
        lkv_f32 p = lkv_maskz(lkv_m_first(nv - j), lkv_exp_nonpos(lkv_sub(v, sh)));
        if (e) lkv_store_part(e + j, LK_F32, p, nv - j);
        s1 = lkv_add(s1, p);
    }
    return lkv_hsum(lkv_add(lkv_add(s0, s1), lkv_add(s2, s3)));
}

/* out[j] = p_j * inv over [0, nv): p_j = src[j] (f32 exps, recompute = 0) or
 * exp(src[j] - shift) (src = x of dtype st, recompute = 1) */
LK_ALWAYS_INLINE void write_probs(char *orow, lk_dtype ot, const char *src, lk_dtype st, int recompute,
                                  float shift, float inv, int64_t nv) {
    int64_t oes = lk_esize(ot), ses = lk_esize(st), j = 0;
    lkv_f32 sh = lkv_set1(shift), vinv = lkv_set1(inv);
    for (; j + LKV_W <= nv; j += LKV_W) {
        lkv_f32 p = lkv_load(src + j * ses, st);
        if (recompute) p = lkv_exp_nonpos(lkv_sub(p, sh));
        lkv_store(orow + j * oes, ot, lkv_mul(p, vinv));
    }
    if (j < nv) {
        lkv_f32 p = lkv_load_part(src + j * ses, st, nv - j);
        if (recompute) p = lkv_exp_nonpos(lkv_sub(p, sh));
        lkv_store_part(orow + j * oes, ot, lkv_mul(p, vinv), nv - j);
    }
}

/* out[0, n) = value; +0 (the masked part of every row) is all-zero bits in each dtype */
static void fill(char *orow, lk_dtype ot, int64_t n, float value) {
    int64_t oes = lk_esize(ot), j = 0;
    if (value == 0.0f && !signbit(value)) {
        memset(orow, 0, (size_t)(n * oes));
        return;
    }
    lkv_f32 v = lkv_set1(value);
    for (; j + LKV_W <= n; j += LKV_W) lkv_store(orow + j * oes, ot, v);
    if (j < n) lkv_store_part(orow + j * oes, ot, v, n - j);
}

/* passes 1 and 2 for x's dtype, pass 3 (from f32 exps) for out's dtype */
static float max_pass(const char *x, lk_dtype xt, int64_t nv, int *any_nan) {
    switch (xt) {
    case LK_F32: return row_max(x, LK_F32, nv, any_nan);
    case LK_F16: return row_max(x, LK_F16, nv, any_nan);
    default: return row_max(x, LK_BF16, nv, any_nan);
    }
}

static float exp_pass(const char *x, lk_dtype xt, int64_t nv, float shift, float *e) {
    switch (xt) {
    case LK_F32: return exp_sum(x, LK_F32, nv, shift, e);
    case LK_F16: return exp_sum(x, LK_F16, nv, shift, e);
    default: return exp_sum(x, LK_BF16, nv, shift, e);
    }
}

static void scale_pass(char *orow, lk_dtype ot, const float *e, float inv, int64_t nv) {
    switch (ot) {
    case LK_F32: write_probs(orow, LK_F32, (const char *)e, LK_F32, 0, 0.0f, inv, nv); break;
    case LK_F16: write_probs(orow, LK_F16, (const char *)e, LK_F32, 0, 0.0f, inv, nv); break;
    default: write_probs(orow, LK_BF16, (const char *)e, LK_F32, 0, 0.0f, inv, nv); break;
    }
}

/* pass 3 recomputing the exps from x (rows longer than the scratch; not specialised) */
static void recompute_pass(char *orow, lk_dtype ot, const char *x, lk_dtype xt, float shift,
                           float inv, int64_t nv) {
    write_probs(orow, ot, x, xt, 1, shift, inv, nv);
}

static void softmax_rows(void *ctx, int64_t r0, int64_t r1) {
    const lk_softmax_args *a = ctx;
    const lk_tensor *x = &a->x, *out = &a->out;
    int nd = x->ndim;
    int64_t q_len = x->shape[nd - 2], k_len = x->shape[nd - 1];
    int64_t oes = lk_esize(out->dtype);
    float scratch[SOFTMAX_SCRATCH];
    lk_rowit xi, oi;
    lk_rowit_init(&xi, x, 1, r0);
    lk_rowit_init(&oi, out, 1, r0);
    for (int64_t r = r0; r < r1; r++, lk_rowit_next(&xi), lk_rowit_next(&oi)) {
        const char *xr = lk_at(x, xi.off); // [k_len]
        char *orow = lk_at(out, oi.off);   // [k_len]
        int64_t i = r % q_len, nv = i + k_len - q_len + 1;
        if (nv < 0) nv = 0;
        int any_nan;
        float m = nv > 0 ? max_pass(xr, x->dtype, nv, &any_nan) : 0.0f;
        if (nv > 0 && lk_softmax_row_nan(m, any_nan)) {
            fill(orow, out->dtype, nv, NAN);
        } else if (nv > 0) {
            float shift = lk_online_shift(m);
            float *e = out->dtype == LK_F32 ? (float *)orow : nv <= SOFTMAX_SCRATCH ? scratch : NULL;
            float inv = lk_softmax_inv(exp_pass(xr, x->dtype, nv, shift, e));
            if (e) scale_pass(orow, out->dtype, e, inv, nv);
            else recompute_pass(orow, out->dtype, xr, x->dtype, shift, inv, nv);
        }
        fill(orow + nv * oes, out->dtype, k_len - nv, 0.0f);
    }
}

static lk_status causal_softmax(const lk_softmax_args *a) {
    int nd = a->x.ndim;
    int64_t k_len = a->x.shape[nd - 1];
    if ((a->x.stride[nd - 1] != 1 || a->out.stride[nd - 1] != 1) && k_len > 1)
        return lk_ref_causal_softmax(a);
    int64_t bytes = k_len * (lk_esize(a->x.dtype) + lk_esize(a->out.dtype));
    lk_parallel_for(lk_rows(&a->x, 1), bytes, softmax_rows, (void *)a);
    return LK_OK;
}

void LKV_FN(register_softmax)(lk_kernel_table *t) { t->causal_softmax = causal_softmax; }
