/*
 * silu_and_mul_quant (static per tensor) and silu_and_mul_per_block_quant, every vector
 * ISA (src/cpu/vec/lkv.h, W lanes).
 *
 *   y[r, i] = silu(x[r, i]) * x[r, d + i]        f32 (act_core's precise silu, one product)
 *   static:    out[r, i] = fp8(y[r, i] / scale)
 *   per block: s = scales[r, g] = lk_aq_block_scale(absmax(y[r, block g]), ub, out dtype),
 *              out[r, i] = fp8(y[r, i] / s) or i8(y[r, i] / s)
 *
 * Shapes: x [..., 2d], out [..., d], scales [..., d / G]. Fast path: last-dim stride 1 on
 * x and out, else the reference. Work split: units of (row, run of columns: CB columns
 * for the static op, whole blocks of about as many for the per-block one), contiguous
 * ranges of units per thread (lk_parallel_for), so one decode row spreads over threads.
 * Per block: y computed once into a stack buffer of YB floats (with its absmax), then
 * quantized from there (one f32 division per element, the fp8.h encoder or i8's
 * round-to-nearest-even in vectors); a block longer than YB computes y twice, once for
 * the absmax and once for the codes, the same bits both times. The silu is act_core's
 * (src/cpu/simd/act_core.h), which the reference mirrors lane by lane (lk_aq_silu), the
 * absmax a max (exact in any order), the rest one operation per element: results are
 * bit-identical to the reference on every ISA and thread count.
 */
#include "../../core/half.h"
#include "../act_quant.h"
#include "act_core.h"
#include "fp8_store.h"

#define CB 4096 /* columns per work unit (static op; the per-block op's runs of blocks) */
#define YB 1024 /* floats of y buffered per block */

typedef struct {
    const lk_act_quant_args *a;
    int64_t per_row; /* units per row */
    int64_t cols;    /* columns per unit (a multiple of the group for the per-block op) */
} aq_ctx;

/* y[0, n) = silu(gate[i]) * up[i] (f32, to yb), returns the lanes' absmax (NaN ignored;
 * lanes past n are 0) */
LK_ALWAYS_INLINE lkv_f32 y_span(float *yb, const char *gp, const char *up, lk_dtype xd, int64_t n) {
    int64_t es = lk_esize(xd), i = 0;
    lkv_f32 m = lkv_zero();
    for (; i + LKV_W <= n; i += LKV_W) {
        lkv_f32 y = lkv_mul(act_core(lkv_load(gp + i * es, xd), 0, 0), lkv_load(up + i * es, xd));
        lkv_storeu(yb + i, y);
        m = lkq_absmax(m, y);
    }
    if (i < n) {
        lkv_f32 y = lkv_mul(act_core(lkv_load_part(gp + i * es, xd, n - i), 0, 0), lkv_load_part(up + i * es, xd, n - i));
        lkv_store_part(yb + i, LK_F32, y, n - i);
        m = lkq_absmax(m, y); /* the zero lanes give silu(0) * 0 = 0 */
    }
    return m;
}

/* o[0, n) = q(yb[i] / s): fp8 (the shared row converter) or i8 (NaN -> 0, clamped, then
 * rounded to nearest even: the codes of lk_q_i8) */
LK_ALWAYS_INLINE void q_span(char *o, lk_dtype od, const float *yb, int64_t n, float s) {
    if (od != LK_I8) {
        lkq_fp8_row_dt(o, od, (const char *)yb, LK_F32, n, s);
        return;
    }
    lkv_f32 k = lkv_set1(s);
    lkv_i32 byte = lkv_i32_set1(0xff);
    for (int64_t i = 0; i < n; i += LKV_W) {
        int64_t m = n - i < LKV_W ? n - i : LKV_W;
        lkv_f32 v = lkv_div(m == LKV_W ? lkv_loadu(yb + i) : lkv_load_part(yb + i, LK_F32, m), k);
        v = lkv_zero_where(lkv_unord(v, v), v);
        lkv_i32 c = lkv_i32_and(lkv_cvt_i32(lkv_min(lkv_max(v, lkv_set1(-128.0f)), lkv_set1(127.0f))), byte);
        if (m == LKV_W) lkv_u8_store(o + i, c);
        else lkv_u8_store_part(o + i, c, m);
    }
}

/* columns [c0, c1) of one row with literal dtypes: gate gp, up = gp + d, out o (each from
 * column 0), scales sr (stride sst; the per-block op) */
LK_ALWAYS_INLINE void run_cols(const lk_act_quant_args *a, const char *gp, lk_dtype xd, char *o, lk_dtype od,
                               float *sr, int64_t sst, int64_t c0, int64_t c1) {
    int64_t d = a->out.shape[a->out.ndim - 1], es = lk_esize(xd), G = a->group ? a->group : YB;
    const char *up = gp + d * es;
    float yb[YB];
    for (int64_t j = c0; j < c1; j += G) {
        int64_t n = c1 - j < G ? c1 - j : G; /* static: runs of YB */
        float s = a->scale;
        if (a->group && n <= YB) {
            s = lk_aq_block_scale(lkv_hmax(y_span(yb, gp + j * es, up + j * es, xd, n)), a->ub, od);
            sr[j / G * sst] = s;
            q_span(o + j, od, yb, n, s);
            continue;
        }
        if (a->group) { /* a block longer than YB: its absmax first */
            lkv_f32 m = lkv_zero();
            for (int64_t k = 0; k < n; k += YB)
                m = lkv_max(y_span(yb, gp + (j + k) * es, up + (j + k) * es, xd, n - k < YB ? n - k : YB), m);
            s = lk_aq_block_scale(lkv_hmax(m), a->ub, od);
            sr[j / G * sst] = s;
        }
        for (int64_t k = 0; k < n; k += YB) {
            int64_t nk = n - k < YB ? n - k : YB;
            y_span(yb, gp + (j + k) * es, up + (j + k) * es, xd, nk);
            q_span(o + j + k, od, yb, nk, s);
        }
    }
}

static void run_units(void *ctx, int64_t u0, int64_t u1) {
    const aq_ctx *c = ctx;
    const lk_act_quant_args *a = c->a;
    const lk_tensor *x = &a->x, *out = &a->out;
    int nd = out->ndim;
    int64_t d = out->shape[nd - 1], sst = a->group ? a->scales.stride[nd - 1] : 0;
    lk_dtype xd = x->dtype, od = out->dtype;
    for (int64_t u = u0; u < u1; u++) {
        int64_t r = u / c->per_row, c0 = u % c->per_row * c->cols, c1 = c0 + c->cols < d ? c0 + c->cols : d;
        lk_rowit xi, oi, si;
        lk_rowit_init(&xi, x, 1, r);
        lk_rowit_init(&oi, out, 1, r);
        const char *gp = lk_at(x, xi.off); // [2d]: gate [0, d), up [d, 2d)
        char *o = lk_at(out, oi.off);      // [d]
        float *sr = NULL;                  // [d / G] stride sst
        if (a->group) lk_rowit_init(&si, &a->scales, 1, r), sr = (float *)a->scales.data + si.off;
#define RUN_COLS(xt, ot) run_cols(a, gp, xt, o, ot, sr, sst, c0, c1)
#define RUN_OUT(xt)                                   \
    do {                                              \
        if (od == LK_F8E4M3) RUN_COLS(xt, LK_F8E4M3); \
        else if (od == LK_F8E5M2) RUN_COLS(xt, LK_F8E5M2); \
        else RUN_COLS(xt, LK_I8);                     \
    } while (0)
        if (xd == LK_BF16) RUN_OUT(LK_BF16);
        else if (xd == LK_F16) RUN_OUT(LK_F16);
        else RUN_OUT(LK_F32);
#undef RUN_OUT
#undef RUN_COLS
    }
}

static lk_status act_quant(const lk_act_quant_args *a) {
    int nd = a->out.ndim;
    if (a->x.stride[nd - 1] != 1 || a->out.stride[nd - 1] != 1) return lk_ref_act_quant(a);
    int64_t d = a->out.shape[nd - 1], G = a->group;
    aq_ctx c = {a, 0, G ? (G >= CB ? G : CB / G * G) : CB};
    c.per_row = (d + c.cols - 1) / c.cols;
    int64_t n = lk_rows(&a->out, 1) * c.per_row;
    lk_parallel_for(n, c.cols * (2 * lk_esize(a->x.dtype) + 1), run_units, &c);
    return LK_OK;
}

void LKV_FN(register_act_quant)(lk_kernel_table *t) { t->act_quant = act_quant; }
