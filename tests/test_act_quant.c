/*
 * SiLU-and-mul then quantization: lk_silu_and_mul_quant (static per-tensor scale, fp8 out)
 * and lk_silu_and_mul_per_block_quant (dynamic scales per block of group_size columns,
 * fp8 or i8 out).
 *
 * Every ISA against ref bit for bit over the outputs' WHOLE allocations (written
 * elements, padding garbage, guard zones) and the scales; ref against float64
 * (y64 = g / (1 + exp(-g)) * u in double, the tolerances derived at REL_Y below): every
 * block scale within REL_S (3.6e-7) of max(min(absmax(y64) / qmax, scale_ub), min_scale)
 * (exactly scale_ub or min_scale where those bind with a margin), every code within half
 * a step (+ REL_Q |t|) of t = y64 / scale (fp8: the format's step, +-max where |t| reaches
 * the max, signed zeros kept; i8: |q - clamp(t)| <= 0.5 + REL_Q |clamp(t)|), each block's
 * absmax element at the max code. Every layout's result also equals (logically, bit for
 * bit) the contiguous call's on the best ISA.
 * Grid: input dtypes f32 / f16 / bf16 x outs e4m3 / e5m2 (/ i8 per block); d = 1 .. 8200;
 * group sizes 1, 2, 3, 7, 11, 16, 17, 64, 100, 128 and d itself, groups of 1000 and 1024
 * (the SIMD kernel's y buffer) and above it (1025, 1040, 2048, 3000: its two-pass path, d =
 * 6144 in blocks of 2048 among them); layouts: contiguous, padded (garbage in the
 * padding), input stored transposed (last stride != 1: the reference fallback), out stored
 * transposed (the fallback through out), 3-D [2, 3, *] contiguous / padded, 1-D; scales
 * [rows, ng] / [2, 3, ng] / [ng], padded, column-major (vLLM's is_scale_transposed: the
 * transposed view of a [ng, rows padded to 4] buffer) and flat [rows, ng] padded
 * (the 3-D inputs' flattened leading dims); scale_ub none, binding some blocks, binding
 * none, below min_scale (the floor wins); an all-zero block, a block a 64th of the rest,
 * a block at 1e-7 (scale min_scale, nonzero codes); the static op's scale [] and [1].
 * Also: special values on every ISA through the same comparisons (NaN gate or up, +-inf
 * gates and ups, gates beyond the clamps -88.75 / 87.3, inf y making a block's scale inf
 * or scale_ub, all-NaN and all-zero blocks; static: saturation), equal to ref up to the
 * sign of NaN codes; explicit codes for the static op's e4m3 / e5m2 saturation, the
 * limits and subnormal gates / scales; the reference's silu mirror against the SIMD silu
 * over 2^19 gates spread over all f32 bit patterns; the scale forms agreeing bit for bit;
 * negative and zero row strides; 1-4 threads bitwise identical on every ISA (a single row
 * of 14336 split inside the row, two-pass blocks); empty inputs (still validated); the
 * bad-input catalogue of both ops (status, message starting with the op and the argument,
 * every buffer bit-identical afterwards).
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "core/fp8.h"
#include "core/half.h"
#include "cpu/act_quant.h"
#include "testutil.h"

static lk_isa isas[TU_MAX_ISAS];
static int ni;

static const lk_dtype FP8[2] = {LK_F8E4M3, LK_F8E5M2};
static const lk_dtype QOUT[3] = {LK_F8E4M3, LK_F8E5M2, LK_I8};

static double qmax(lk_dtype dt) { return dt == LK_F8E4M3 ? 448.0 : dt == LK_I8 ? 127.0 : 57344.0; }
/* the contract's floor: 1 / (fp8_max * 512) in f32 (vLLM's), FLT_EPSILON for i8 */
static float min_scale(lk_dtype dt) { return dt == LK_I8 ? FLT_EPSILON : 1.0f / ((float)qmax(dt) * 512.0f); }

/* Tolerances against float64. The kernel's y is f32:
 *   silu32 = silu(g) (1 + d1), |d1| <= 2 * 2^-23  (act_core's precise silu: "within 2
 *            ulp", relative units of 2^-23, src/cpu/simd/act_core.h; test_activation's
 *            accuracy test measures it; over every 97th f32 gate in [-88.7, 88.7] it is
 *            at most 1.7 * 2^-23)
 *   y32    = silu32 * u (1 + d2), |d2| <= 2^-24   (one f32 product)
 * so |y32 / y64 - 1| <= (1 + 2^-22)(1 + 2^-24) - 1 < 2^-22 + 2^-24 + 2^-45 = REL_Y
 * (2.99e-7), for y64 in f32's normal range (the grid keeps it there). The absmax of a
 * block is a max of such values, so max|y32| is within REL_Y of max|y64| (max is
 * monotone), and the scale absmax / qmax is one more f32 division (2^-24):
 *   |s32 / (absmax64 / qmax) - 1| <= REL_Y + 2^-24 (+ 2^-40 for the cross terms) = REL_S
 * (3.6e-7: well inside a 1e-6 relative budget); min with scale_ub and max with
 * min_scale move a value by at most the same relative amount (both 1-Lipschitz in the
 * relative sense), and where they bind with a margin the scale is exactly the bound.
 * Each code is fp8(t32) / i8(t32), t32 = y32 / s32 rounded once: compared with
 * t64 = y64 / s32 (the scale the kernel wrote), |t32 / t64 - 1| <= REL_Y + 2^-24 = REL_Q,
 * so the fp8 value lies within half an fp8 step of t32, i.e. within half a step (x
 * (1 + 1e-6) at a binade edge) + REL_Q |t64| of t64, and the i8 code within 0.5 +
 * REL_Q |clamp(t64)| of clamp(t64). */
#define REL_Y (0x1p-22 + 0x1p-24 + 0x1p-45)
#define REL_Q (REL_Y + 0x1p-24 + 0x1p-40)
#define REL_S REL_Q

/* float64 silu with the documented limits: NaN stays, silu(-inf) = -0 (the kernels clamp
 * the gate at -88.75, where 1 + exp(-g) overflows f32: -0 as expf's overflow gives), and
 * -0 wherever exp(-g) is beyond the f32 range (g < -88.72); silu(+inf) = +inf (the exp
 * argument is clamped at 87.3: the denominator is exactly 1 beyond it) */
static double silu64(double g) {
    if (isnan(g)) return g;
    double e = exp(-g);
    if (e > FLT_MAX) return -0.0;
    return g / (1.0 + e);
}

/* i8 q vs t (float64): within 0.5 + rel |t| of t clamped to [-128, 127]; NaN -> 0 */
static int i8_close(double t, double q, double rel) {
    if (isnan(t)) return q == 0;
    double c = t > 127 ? 127 : t < -128 ? -128 : t;
    return q == rint(q) && q >= -128 && q <= 127 && fabs(q - c) <= 0.5 + fabs(c) * rel + 1e-9;
}

/* fp8 value q vs t (float64): within half an fp8 step of t (2^(e - 3) e4m3, 2^(e - 2)
 * e5m2, subnormal steps 2^-9 / 2^-16) plus rel |t|, or +-max where |t| reaches the max,
 * NaN for NaN; a zero t gives the zero of its sign, a nonzero t never the opposite sign */
static int fp8_close(lk_dtype dt, double t, float q, double rel) {
    double mx = qmax(dt);
    if (isnan(t)) return isnan(q);
    if (isnan(q) || isinf(q)) return 0;
    if (t == 0) return q == 0 && !signbit(q) == !signbit(t);
    int M = dt == LK_F8E4M3 ? 3 : 2, emin = dt == LK_F8E4M3 ? -6 : -14;
    int e = (int)floor(log2(fabs(t)));
    if (e < emin) e = emin;
    double half = ldexp(1.0, e - M - 1) * (1 + 1e-6) + fabs(t) * rel;
    if ((q < 0) != (t < 0) && !(q == 0 && !signbit(q) == !signbit(t))) return 0;
    if (fabs(t) * (1 - rel) >= mx) return fabs(q) == mx;
    if (fabs(t) > mx) return fabs(q) >= mx * (1 - 0.125);
    return fabs((double)q - t) <= half;
}

static int code_close(lk_dtype ot, double t, double q) {
    return ot == LK_I8 ? i8_close(t, q, REL_Q) : fp8_close(ot, t, (float)q, REL_Q);
}

static lk_tensor one_scale(float *v) { return lk_tensor_make(v, LK_F32, 1, (int64_t[]){1}); }

/* fp8 code bytes equal up to the sign of a NaN code (the sign of a NaN computed from NaN
 * operands is unspecified, docs/numerics.md); i8 and every other byte exactly */
static int same_codes(const tu_buf *b, const tu_saved *s, lk_dtype ot) {
    for (size_t k = 0; k < s->n; k++) {
        unsigned u = b->base[k], v = s->bytes[k];
        if (u == v) continue;
        if (ot == LK_I8 || (u ^ v) != 0x80 || !b->inview[k]) return 0;
        if (ot == LK_F8E4M3 ? (u & 0x7f) != 0x7f : (u & 0x7c) != 0x7c || !(u & 3)) return 0;
    }
    return 1;
}

/* two views' logical elements bit for bit, fp8 NaN codes up to their sign when nan_sign */
static int same_logical(const tu_buf *a, const tu_buf *b, int nan_sign) {
    lk_dtype dt = a->t.dtype;
    size_t es = lk_dtype_size(dt);
    if (tu_numel(a) != tu_numel(b) || dt != b->t.dtype) return 0;
    for (int64_t i = 0; i < tu_numel(a); i++) {
        const unsigned char *pa = (const unsigned char *)a->t.data + tu_offset(&a->t, i) * (int64_t)es;
        const unsigned char *pb = (const unsigned char *)b->t.data + tu_offset(&b->t, i) * (int64_t)es;
        if (!memcmp(pa, pb, es)) continue;
        if (!nan_sign || es != 1 || (*pa ^ *pb) != 0x80 || !isnan(lk_load_f(pa, dt, 0))) return 0;
    }
    return 1;
}

/* the logical elements of src copied bit for bit into dst (same dtype and numel) */
static void copy_bits(tu_buf *dst, const tu_buf *src) {
    size_t es = lk_dtype_size(src->t.dtype);
    for (int64_t i = 0; i < tu_numel(src); i++)
        memcpy((char *)dst->t.data + tu_offset(&dst->t, i) * (int64_t)es,
               (const char *)src->t.data + tu_offset(&src->t, i) * (int64_t)es, es);
}

/* ---------------------------------------------------------------- one case */

/* layouts: 0 contiguous; 1 padded strides (garbage in the padding); 2 input stored
 * transposed (last stride != 1: the reference fallback), out padded; 3 input contiguous,
 * out stored transposed (the fallback through out); 4 / 5 3-D [2, 3, *] contiguous /
 * padded (6 rows); 6 1-D (one row) */
enum { L_CONTIG, L_PAD, L_XT, L_OT, L_3D, L_3DPAD, L_1D, N_LAYOUTS };
/* scales forms: 0 [rows, ng] ([2, 3, ng] 3-D, [ng] 1-D) contiguous; 1 the same padded; 2
 * column-major (the transposed view of a [ng, rows padded to a multiple of 4] buffer,
 * vLLM's is_scale_transposed), flat [rows, ng]; 3 flat [rows, ng] padded (3-D: the
 * flattened leading dims; 1-D: [1, ng]) */
enum { N_SFORMS = 4 };
enum { OP_STATIC, OP_BLOCK };

typedef struct {
    int op;
    lk_dtype xt, ot;
    int64_t R, D, G; /* rows of the 2-D layouts, d, group_size (per block) */
    int xl, sl;
    float ub;        /* per block: > 0 passes scale_ub */
    float scale;     /* static */
    int scale0d;     /* static: scale [] instead of [1] */
    double gamp, uamp;
    int spec;        /* special values (spec_fill) */
} aq_cfg;

static int is3(const aq_cfg *c) { return c->xl == L_3D || c->xl == L_3DPAD; }
static int64_t nrows(const aq_cfg *c) { return is3(c) ? 6 : c->xl == L_1D ? 1 : c->R; }
static int64_t grp(const aq_cfg *c) { return c->op == OP_BLOCK ? c->G : c->D; }

static void alloc_io(const aq_cfg *c, tu_buf *x, tu_buf *out) {
    int64_t R = c->R, D = c->D;
    switch (c->xl) {
    case L_CONTIG:
    case L_PAD:
        *x = tu_alloc(c->xt, 2, (int64_t[]){R, 2 * D}, c->xl == L_PAD);
        *out = tu_alloc(c->ot, 2, (int64_t[]){R, D}, c->xl == L_PAD);
        break;
    case L_XT:
        *x = tu_alloc_rows(c->xt, R, 2 * D, 2);
        *out = tu_alloc(c->ot, 2, (int64_t[]){R, D}, 1);
        break;
    case L_OT:
        *x = tu_alloc(c->xt, 2, (int64_t[]){R, 2 * D}, 0);
        *out = tu_alloc_rows(c->ot, R, D, 2);
        break;
    case L_3D:
    case L_3DPAD:
        *x = tu_alloc(c->xt, 3, (int64_t[]){2, 3, 2 * D}, c->xl == L_3DPAD);
        *out = tu_alloc(c->ot, 3, (int64_t[]){2, 3, D}, c->xl == L_3DPAD);
        break;
    default:
        *x = tu_alloc(c->xt, 1, (int64_t[]){2 * D}, 0);
        *out = tu_alloc(c->ot, 1, &D, 0);
    }
}

static tu_buf alloc_scales(const aq_cfg *c) {
    int64_t rows = nrows(c), ng = c->D / c->G;
    if (c->sl == 2) {
        int64_t rp = (rows + 3) / 4 * 4;
        return tu_alloc_perm(LK_F32, 2, (int64_t[]){rows, ng}, (int[]){1, 0}, (int)(rp - rows));
    }
    if (c->sl < 2 && c->xl == L_1D) return tu_alloc(LK_F32, 1, &ng, c->sl);
    if (c->sl < 2 && is3(c)) return tu_alloc(LK_F32, 3, (int64_t[]){2, 3, ng}, c->sl);
    return tu_alloc(LK_F32, 2, (int64_t[]){rows, ng}, c->sl != 0);
}

/* gate of (row r, column i) at flat index r * 2D + i, its up value at r * 2D + D + i */
static void set_gu(tu_buf *x, int64_t D, int64_t r, int64_t i, double g, double u) {
    tu_set(x, r * 2 * D + i, g);
    tu_set(x, r * 2 * D + D + i, u);
}

/* random gates in [-gamp, gamp], ups in [-uamp, uamp]; a zero gate; blocks of very
 * different absmax: row 0's block 1 a 64th of the rest, the last row's block 2 all zero
 * (ups +-0), row 1's block 3 at 1e-7 (a scale floored at min_scale, nonzero codes) */
static void fill_input(const aq_cfg *c, tu_buf *x) {
    int64_t rows = nrows(c), D = c->D, G = grp(c), ng = G ? D / G : 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < D; i++) set_gu(x, D, r, i, tu_uniform(-c->gamp, c->gamp), tu_uniform(-c->uamp, c->uamp));
    if (D > 2) tu_set(x, D / 2, 0.0);
    for (int64_t i = 0; ng >= 2 && i < G; i++) tu_set(x, D + G + i, tu_get(x, D + G + i) / 64);
    for (int64_t i = 0; ng >= 3 && rows >= 2 && i < G; i++)
        tu_set(x, (rows - 1) * 2 * D + D + 2 * G + i, i % 2 ? -0.0 : 0.0);
    for (int64_t i = 0; ng >= 4 && rows >= 2 && i < G; i++) tu_set(x, 2 * D + D + 3 * G + i, tu_get(x, 2 * D + D + 3 * G + i) * 1e-7);
}

/* special values in three segments of L columns of the first three rows (L = G for the
 * per-block op: blocks 0, 1, 2; d / 3 for the static one; L >= 8):
 *  row 0: segment 0 a NaN gate and a NaN up among finite values (NaN ignored by the
 *         absmax, NaN codes / i8 0); segment 1 gates -inf (ups 2, -3, 0: -0, +0, -0), -100
 *         and -89 (beyond the -88.75 clamp: -0 * u), 88 and 100 (beyond the 87.3 clamp:
 *         exactly g * u); segment 2 a +inf gate (y +inf: scale inf, or scale_ub)
 *  row 1: segment 0 all gates NaN (scale min_scale, every code NaN / 0); segment 1 all ups
 *         +-0 (scale min_scale, signed zero codes); segment 2 gate -inf with up +inf (NaN)
 *         and up -inf (y -inf: scale inf)
 *  row 2: segment 0 gate +inf with up 0 (NaN) and up -2 (y -inf); segment 1 gates in
 *         [80, 100] (silu = g); segment 2 gates in [-88.5, -87.5] (y ~ 1e-37: the floor) */
static void spec_fill(const aq_cfg *c, tu_buf *x) {
    int64_t D = c->D, rows = nrows(c), L = c->op == OP_BLOCK ? c->G : D / 3, b1 = L, b2 = 2 * L;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < D; i++) set_gu(x, D, r, i, tu_uniform(-4, 4), tu_uniform(-2, 2));
    set_gu(x, D, 0, 1, NAN, 0.5), set_gu(x, D, 0, 2, 0.7, NAN);
    set_gu(x, D, 0, b1 + 3, -INFINITY, 2.0), set_gu(x, D, 0, b1 + 4, -INFINITY, -3.0);
    set_gu(x, D, 0, b1 + 5, -INFINITY, 0.0), set_gu(x, D, 0, b1 + 6, -100.0, 2.0);
    set_gu(x, D, 0, b1 + 7, -89.0, -1.0), set_gu(x, D, 0, b1 + 0, 88.0, 0.25), set_gu(x, D, 0, b1 + 1, 100.0, -0.5);
    set_gu(x, D, 0, b2 + 2, INFINITY, 1.5);
    for (int64_t i = 0; i < L; i++) {
        set_gu(x, D, 1, i, -NAN, 1.0);
        set_gu(x, D, 1, b1 + i, tu_uniform(-4, 4), i % 2 ? -0.0 : 0.0);
        set_gu(x, D, 2, b1 + i, tu_uniform(80, 100), tu_uniform(-1, 1));
        set_gu(x, D, 2, b2 + i, tu_uniform(-88.5, -87.5), tu_uniform(1, 2));
    }
    set_gu(x, D, 1, b2 + 1, -INFINITY, INFINITY), set_gu(x, D, 1, b2 + 3, 1.0, -INFINITY);
    set_gu(x, D, 2, 0, INFINITY, 0.0), set_gu(x, D, 2, 3, INFINITY, -2.0);
}

static lk_status call_op(const aq_cfg *c, const lk_tensor *out, const lk_tensor *x, const lk_tensor *sc, const lk_tensor *ub) {
    if (c->op == OP_STATIC) return lk_silu_and_mul_quant(out, x, sc);
    return lk_silu_and_mul_per_block_quant(out, x, sc, ub, c->G);
}

/* ref's out and scales against float64 (the tolerances above); why: the first miss */
static int check_f64(const aq_cfg *c, const tu_buf *x, const tu_buf *out, const tu_buf *sc, char *why, size_t wn) {
    int64_t rows = nrows(c), D = c->D, G = grp(c), ng = G ? D / G : 0;
    double qm = qmax(c->ot), lo = min_scale(c->ot), ub = c->ub > 0 ? c->ub : INFINITY;
    double *y = malloc(sizeof(double) * (size_t)(G ? G : 1));
    int ok = 1;
    for (int64_t r = 0; r < rows && ok; r++)
        for (int64_t b = 0; b < ng && ok; b++) {
            double m = 0, s;
            int64_t am = -1;
            for (int64_t i = 0; i < G; i++) {
                int64_t col = b * G + i;
                y[i] = silu64(tu_get(x, r * 2 * D + col)) * tu_get(x, r * 2 * D + D + col);
                if (fabs(y[i]) > m) m = fabs(y[i]), am = i; /* NaN ignored */
            }
            if (c->op == OP_STATIC) s = c->scale;
            else {
                s = tu_get(sc, r * ng + b);
                double raw = m / qm, want = fmax(fmin(raw, ub), lo);
                int sok = isinf(want) ? s == want : fabs(s - want) <= REL_S * want;
                if (raw * (1 - REL_S) > ub && ub >= lo) sok &= s == (float)ub;  /* scale_ub binds: exactly it */
                if (fmin(raw, ub) * (1 + REL_S) < lo) sok &= s == (float)lo;    /* the floor binds: exactly it */
                /* an unbounded block's absmax element lands on +-qmax: t = qmax (1 +- REL_Q) */
                if (am >= 0 && isfinite(m) && raw * (1 + REL_S) < ub && raw * (1 - REL_S) > lo)
                    sok &= fabs(tu_get(out, r * D + b * G + am)) == qm;
                if (!sok) {
                    snprintf(why, wn, "row %lld block %lld: scale %.9g, want %.9g (absmax64 %.9g)", (long long)r,
                             (long long)b, s, want, m);
                    ok = 0;
                }
            }
            for (int64_t i = 0; i < G && ok; i++) {
                double q = tu_get(out, r * D + b * G + i);
                if (!code_close(c->ot, y[i] / s, q)) {
                    snprintf(why, wn, "row %lld col %lld: code %.9g for y64 / s = %.9g (g %.9g u %.9g s %.9g)",
                             (long long)r, (long long)(b * G + i), q, y[i] / s, tu_get(x, r * 2 * D + b * G + i),
                             tu_get(x, r * 2 * D + D + b * G + i), s);
                    ok = 0;
                }
            }
        }
    free(y);
    return ok;
}

static void run_case(const aq_cfg *c) {
    tu_buf x, out, sc;
    alloc_io(c, &x, &out);
    int64_t rows = nrows(c), D = c->D, ng = c->op == OP_BLOCK ? D / c->G : 0;
    if (c->op == OP_BLOCK) sc = alloc_scales(c);
    else {
        sc = tu_alloc(LK_F32, c->scale0d ? 0 : 1, (int64_t[]){1}, 0);
        tu_set(&sc, 0, c->scale);
    }
    if (c->spec) spec_fill(c, &x);
    else fill_input(c, &x);
    float ubv = c->ub;
    lk_tensor ub = one_scale(&ubv);
    const lk_tensor *tub = c->op == OP_BLOCK && c->ub > 0 ? &ub : NULL;
    tu_snapshot(&x), tu_snapshot(&out), tu_snapshot(&sc);
    tu_saved o0 = tu_save(&out), s0 = tu_save(&sc), oref = {0}, sref = {0};
    int okall = 1, f64 = 1, intact = 1;
    char why[256] = "";
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        tu_restore(&out, &o0), tu_restore(&sc, &s0);
        lk_status s = call_op(c, &out.t, &x.t, &sc.t, tub);
        if (!tu_check(s == LK_OK, "%s silu_and_mul quant: %s", lk_isa_name(isas[ii]), lk_last_error())) continue;
        intact &= tu_intact(&x) && (c->op == OP_BLOCK || tu_intact(&sc));
        if (ii > 0) {
            okall &= (c->spec ? same_codes(&out, &oref, c->ot) : tu_same(&out, &oref)) && tu_same(&sc, &sref);
            continue;
        }
        oref = tu_save(&out), sref = tu_save(&sc);
        f64 &= tu_outside_intact(&out) && tu_outside_intact(&sc);
        if (!f64) snprintf(why, sizeof why, "padding or guard bytes written");
        f64 = f64 && check_f64(c, &x, &out, &sc, why, sizeof why);
    }
    /* the same values contiguous ([rows, 2d] -> [rows, d], scales [rows, ng]) on the best
     * ISA: logically the same bits */
    tu_buf xc = tu_alloc(c->xt, 2, (int64_t[]){rows, 2 * D}, 0), oc = tu_alloc(c->ot, 2, (int64_t[]){rows, D}, 0);
    tu_buf scc = c->op == OP_BLOCK ? tu_alloc(LK_F32, 2, (int64_t[]){rows, ng}, 0) : sc;
    copy_bits(&xc, &x);
    lk_set_isa(isas[ni - 1]);
    if (oref.bytes) tu_restore(&out, &oref), tu_restore(&sc, &sref);
    int contig = call_op(c, &oc.t, &xc.t, &scc.t, tub) == LK_OK && same_logical(&oc, &out, c->spec) &&
                 (c->op == OP_STATIC || same_logical(&scc, &sc, 0));
    char cfg[220], form[48];
    if (c->op == OP_BLOCK) snprintf(form, sizeof form, "G=%lld layout=%d scales=%d", (long long)c->G, c->xl, c->sl);
    else snprintf(form, sizeof form, "scale=%g%s layout=%d", (double)c->scale, c->scale0d ? " []" : " [1]", c->xl);
    snprintf(cfg, sizeof cfg, "silu_and_mul_%s %s -> %s rows=%lld d=%lld %s%s%s",
             c->op == OP_STATIC ? "quant" : "per_block_quant", lk_dtype_name(c->xt), lk_dtype_name(c->ot),
             (long long)rows, (long long)D, form, tub ? " scale_ub" : "", c->spec ? " specials" : "");
    tu_check(f64, "%s: ref within half a step (+ REL_Q) of float64, scales as the float64 formula (REL_S, exact "
             "where scale_ub or min_scale bind), absmax elements at the max code, padding intact%s%s", cfg,
             why[0] ? ": " : "", why);
    tu_check(okall && intact, "%s: every ISA bit-identical to ref (out and scales: whole allocations)%s, input intact",
             cfg, c->spec ? " up to NaN code signs" : "");
    tu_check(contig, "%s: the contiguous call on %s gives the same bits", cfg, lk_isa_name(isas[ni - 1]));
    free(o0.bytes), free(s0.bytes), free(oref.bytes), free(sref.bytes);
    if (c->op == OP_BLOCK) tu_free(&scc);
    tu_free(&x), tu_free(&out), tu_free(&sc), tu_free(&xc), tu_free(&oc);
}

/* ---------------------------------------------------------------- grids */

static float ub_choice(int k, lk_dtype ot) {
    switch (k % 4) {
    case 1: return 1.0f / (float)qmax(ot);   /* binds blocks with absmax > 1 */
    case 2: return 100.0f / (float)qmax(ot); /* binds none */
    case 3: return min_scale(ot) / 4;        /* below the floor: min_scale wins */
    default: return 0;                       /* none */
    }
}

static void test_block_grid(void) {
    static const int64_t DG[][2] = {{1, 1},     {3, 1},      {3, 3},      {7, 7},      {14, 2},     {17, 17},
                                    {33, 3},    {33, 11},    {100, 2},    {100, 100},  {129, 3},    {112, 16},
                                    {192, 64},  {384, 128},  {1000, 1000}, {1024, 1024}, {1025, 1025}, {2048, 2048},
                                    {3000, 3000}, {6144, 2048}, {4224, 128}, {7168, 128}};
    int n = (int)(sizeof DG / sizeof DG[0]), k = 0;
    for (int xi = 0; xi < 3; xi++)
        for (int oi = 0; oi < 3; oi++)
            for (int p = 0; p < n; p++, k++) {
                int64_t D = DG[p][0], G = DG[p][1];
                if (tu_emulated() && D > 1000 && (xi != 2 || oi != 0)) continue;
                int xl = k % N_LAYOUTS;
                if (D >= 4096 && (xl == L_3D || xl == L_3DPAD)) xl = L_PAD;
                aq_cfg c = {.op = OP_BLOCK, .xt = TU_FLOAT_DTYPES[xi], .ot = QOUT[oi], .R = D > 1000 ? 2 : 2 + k % 4,
                            .D = D, .G = G, .xl = xl, .sl = k % 3 + (k % 7 == 4), .ub = ub_choice(k / 3, QOUT[oi]),
                            .gamp = 6, .uamp = 3};
                run_case(&c);
            }
    /* every layout x scales form x out dtype: d 48 in blocks of 16, d 2080 in blocks of
     * 1040 (the two-pass path) */
    for (int big = 0; big < 2; big++)
        for (int oi = 0; oi < 3; oi++)
            for (int xl = 0; xl < N_LAYOUTS; xl++)
                for (int sl = 0; sl < N_SFORMS; sl++, k++) {
                    if (big && (sl & 1)) continue;
                    aq_cfg c = {.op = OP_BLOCK, .xt = TU_FLOAT_DTYPES[(xl + sl + oi) % 3], .ot = QOUT[oi], .R = 3,
                                .D = big ? 2080 : 48, .G = big ? 1040 : 16, .xl = xl, .sl = sl,
                                .ub = ub_choice(k, QOUT[oi]), .gamp = 6, .uamp = 3};
                    run_case(&c);
                }
    /* gates far out (the exp near its clamps) and tiny / large up values */
    for (int oi = 0; oi < 3; oi++) {
        aq_cfg c = {.op = OP_BLOCK, .xt = LK_F32, .ot = QOUT[oi], .R = 3, .D = 96, .G = 32, .gamp = 80, .uamp = 1e3};
        run_case(&c);
        c.gamp = 0.01, c.uamp = 1e-3, c.xt = LK_BF16, c.sl = 2;
        run_case(&c);
    }
}

static void test_static_grid(void) {
    static const int64_t DS[] = {1, 3, 7, 17, 33, 100, 129, 1000, 1025, 2048, 4097, 8200};
    int k = 0;
    for (int xi = 0; xi < 3; xi++)
        for (int oi = 0; oi < 2; oi++)
            for (int di = 0; di < 12; di++, k++) {
                int64_t D = DS[di];
                if ((tu_emulated() || D > 8192) && D > 1000 && (xi != 2 || oi != 0)) continue;
                int xl = k % N_LAYOUTS;
                /* scales: y / s up to ~18 / s: 0.0137 saturates e4m3 for |y| > 6.1 */
                aq_cfg c = {.op = OP_STATIC, .xt = TU_FLOAT_DTYPES[xi], .ot = FP8[oi], .R = D > 1000 ? 2 : 2 + k % 4,
                            .D = D, .G = 0, .xl = xl, .scale = k % 3 == 0 ? 0.0137f : k % 3 == 1 ? 1.0f : 3e-4f,
                            .scale0d = k & 1, .gamp = 6, .uamp = 3};
                run_case(&c);
            }
}

/* special values through the same comparisons: every ISA against ref up to NaN code
 * signs, ref against the float64 rules (silu64's limits; NaN ignored by the absmax; an
 * inf absmax giving scale inf, or scale_ub; y / inf = +-0, inf / inf = NaN) */
static void test_specials(void) {
    static const int64_t DG[][2] = {{48, 16}, {24, 8}, {3120, 1040}};
    for (int xi = 0; xi < 3; xi++)
        for (int oi = 0; oi < 3; oi++)
            for (int p = 0; p < 3; p++)
                for (int u = 0; u < 2; u++) {
                    if (p == 2 && xi != oi) continue; /* the two-pass blocks: one input dtype per out */
                    aq_cfg c = {.op = OP_BLOCK, .xt = TU_FLOAT_DTYPES[xi], .ot = QOUT[oi], .R = 3, .D = DG[p][0],
                                .G = DG[p][1], .xl = p == 1 ? L_XT : u ? L_PAD : L_CONTIG, .sl = u ? 2 : 0,
                                .ub = u ? 1.0f / (float)qmax(QOUT[oi]) : 0, .spec = 1};
                    run_case(&c);
                    if (oi < 2 && u == 0) {
                        aq_cfg s = c;
                        s.op = OP_STATIC, s.scale = p ? 0.25f : 1e-3f, s.scale0d = p == 1;
                        run_case(&s);
                    }
                }
}

/* explicit rule checks per ISA on a row of d = 40 (one block of 40 / two of 20): the
 * codes documented in include/llmkern.h for the clamps and the limits, and the static
 * op's saturation of e4m3 / e5m2 */
#define CONV(ot, v) ((ot) == LK_F8E4M3 ? lk_f32_to_f8e4m3(v) : lk_f32_to_f8e5m2(v))
static void test_rules(void) {
    enum { D = 40 };
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        const char *isa = lk_isa_name(isas[ii]);
        for (int oi = 0; oi < 2; oi++) {
            lk_dtype ot = FP8[oi];
            uint8_t mx = oi ? 0x7b : 0x7e;
            float x[2 * D], s = 1.0f;
            uint8_t q[D];
            for (int i = 0; i < D; i++) x[i] = 1.0f, x[D + i] = 1.0f;
            /* saturation: y = 100 u (silu(100) = 100 exactly): e4m3 beyond 448, e5m2 beyond 57344 */
            x[0] = 100.0f, x[D + 0] = 5.0f;       /* 500: e4m3 max; e5m2 512 */
            x[1] = 100.0f, x[D + 1] = -1000.0f;   /* -1e5: -max in both */
            x[2] = 100.0f, x[D + 2] = 590.0f;     /* 59000: e5m2 rounds to max (below max + half step) */
            x[3] = 100.0f, x[D + 3] = 4.6f;       /* 460: e4m3 448 */
            x[4] = INFINITY, x[D + 4] = -2.0f;    /* -inf: -max */
            x[5] = NAN;                            /* NaN: the NaN code */
            x[6] = -INFINITY, x[D + 6] = 2.0f;    /* -0 * 2: 0x80 */
            x[7] = -INFINITY, x[D + 7] = -2.0f;   /* -0 * -2: +0 */
            x[8] = -89.0f, x[D + 8] = 3.0f;       /* beyond the clamp: -0 */
            x[9] = 88.0f, x[D + 9] = 0.5f;        /* silu(88) = 88 exactly: 44 */
            x[10] = -INFINITY, x[D + 10] = INFINITY; /* -0 * inf: NaN */
            lk_tensor tx = lk_tensor_make(x, LK_F32, 2, (int64_t[]){1, 2 * D});
            lk_tensor tq = lk_tensor_make(q, ot, 2, (int64_t[]){1, D}), ts = one_scale(&s);
            memset(q, 0x33, sizeof q);
            lk_status st = lk_silu_and_mul_quant(&tq, &tx, &ts);
            int nan5 = oi ? (q[5] & 0x7c) == 0x7c && (q[5] & 3) : (q[5] & 0x7f) == 0x7f;
            int nan10 = oi ? (q[10] & 0x7c) == 0x7c && (q[10] & 3) : (q[10] & 0x7f) == 0x7f;
            /* e4m3: 500 and 460 -> 448 (0x7e); e5m2: 500 -> 512 (0x60), 460 -> 448 (0x5f); 44:
             * e4m3 0x63, e5m2 a tie between 40 and 48 -> 48 (0x52); the scalar converter agrees */
            uint8_t c500 = oi ? 0x60 : mx, c460 = oi ? 0x5f : mx, c44 = oi ? 0x52 : 0x63;
            int conv = c500 == CONV(ot, 500.0f) && c460 == CONV(ot, 460.0f) && c44 == CONV(ot, 44.0f);
            int ok = st == LK_OK && conv && q[0] == c500 && q[1] == (0x80 | mx) && q[2] == mx && q[3] == c460 &&
                     q[4] == (0x80 | mx) && nan5 && q[6] == 0x80 && q[7] == 0x00 && q[8] == 0x80 && q[9] == c44 &&
                     nan10;
            tu_check(ok, "%s silu_and_mul_quant -> %s: beyond-max and -inf y saturate to +-max (e5m2 512 kept), NaN "
                     "code, silu(-inf) = -0 (times +-2: 0x80 / 0x00, times inf: NaN), silu(-89) = -0, silu(88) = 88 "
                     "(%02x %02x %02x %02x %02x %02x %02x %02x %02x %02x %02x)", isa, lk_dtype_name(ot), q[0], q[1],
                     q[2], q[3], q[4], q[5], q[6], q[7], q[8], q[9], q[10]);
            /* subnormals (no flush to zero on any path): gate 2^-130 -> silu 2^-131 exactly (the
             * denominator is 2), times 3; a subnormal scale 2^-136 (valid: finite, > 0): 96 */
            float xs[2 * D], sub = 0x1p-136f;
            for (int i = 0; i < D; i++) xs[i] = 0x1p-130f, xs[D + i] = 3.0f;
            lk_tensor txs = lk_tensor_make(xs, LK_F32, 2, (int64_t[]){1, 2 * D}), tsub = one_scale(&sub);
            st = lk_silu_and_mul_quant(&tq, &txs, &tsub);
            ok = st == LK_OK;
            for (int i = 0; i < D; i++) ok &= q[i] == CONV(ot, 96.0f);
            tu_check(ok, "%s silu_and_mul_quant -> %s: subnormal gates and a subnormal scale (2^-130 * 3 / 2 / 2^-136 "
                     "= 96) are not flushed (%02x)", isa, lk_dtype_name(ot), q[0]);
        }
    }
}

/* the reference's silu (lk_aq_silu, src/cpu/act_quant.h) against the SIMD act_core it
 * mirrors, over 2^19 gates spread over every f32 bit pattern (subnormals, NaN, +-inf, the
 * clamps' neighbourhoods): lk_silu_and_mul's f32 path (act_core's precise silu times up = 1)
 * bit for bit on every SIMD ISA (NaN-ness for NaN), and lk_silu_and_mul_per_block_quant with
 * G = 1 (each scale |y| / 57344, or min_scale) on every ISA equal to ref's scales */
static void test_silu_mirror(void) {
    enum { C = 1024 };
    const int64_t RR = tu_emulated() ? 64 : 512, N = RR * C; /* emulated: 2^16 gates */
    float *x = malloc(sizeof(float) * 2 * N), *y = malloc(sizeof(float) * N), *sc = malloc(sizeof(float) * N);
    float *sref = malloc(sizeof(float) * N);
    uint8_t *q = malloc(N);
    for (int64_t k = 0; k < N; k++) {
        uint32_t b = (uint32_t)k * (uint32_t)(0x100000000ull / (uint64_t)N - 1) + 977u;
        memcpy(&x[k / C * 2 * C + k % C], &b, 4);
        x[k / C * 2 * C + C + k % C] = 1.0f;
    }
    lk_tensor tx = lk_tensor_make(x, LK_F32, 2, (int64_t[]){RR, 2 * C}), ty = lk_tensor_make(y, LK_F32, 2, (int64_t[]){RR, C});
    lk_tensor tq = lk_tensor_make(q, LK_F8E5M2, 2, (int64_t[]){RR, C}), ts = lk_tensor_make(sc, LK_F32, 2, (int64_t[]){RR, C});
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        int64_t bad = -1, sbad = -1;
        lk_status s1 = isas[ii] == LK_ISA_REF ? LK_OK : lk_silu_and_mul(&ty, &tx);
        for (int64_t k = 0; isas[ii] != LK_ISA_REF && k < N && bad < 0; k++) {
            float g = x[k / C * 2 * C + k % C], w = lk_aq_silu(g);
            if (isnan(w) ? !isnan(y[k]) : memcmp(&w, &y[k], 4) != 0) bad = k;
        }
        lk_status s2 = lk_silu_and_mul_per_block_quant(&tq, &tx, &ts, NULL, 1);
        if (ii == 0) memcpy(sref, sc, sizeof(float) * N);
        for (int64_t k = 0; k < N && sbad < 0; k++)
            if (memcmp(&sc[k], &sref[k], 4)) sbad = k;
        float gb = bad >= 0 ? x[bad / C * 2 * C + bad % C] : 0, gs = sbad >= 0 ? x[sbad / C * 2 * C + sbad % C] : 0;
        tu_check(s1 == LK_OK && s2 == LK_OK && bad < 0 && sbad < 0,
                 "%s: %lld gates over every f32 bit pattern: silu_and_mul's f32 silu bit for bit lk_aq_silu (the "
                 "reference's mirror)%s, per-block scales with G = 1 ref's bits (first silu miss at g = %.9g: %.9g vs "
                 "%.9g; first scale miss at g = %.9g)", lk_isa_name(isas[ii]), (long long)N,
                 isas[ii] == LK_ISA_REF ? " (n/a on ref)" : "", (double)gb, bad >= 0 ? (double)y[bad] : 0.0, bad >= 0 ? (double)lk_aq_silu(gb) : 0.0, (double)gs);
    }
    free(x), free(y), free(sc), free(sref), free(q);
}

/* ---------------------------------------------------------------- scale forms, strides */

/* a 3-D input: scales [2, 3, ng], flat [6, ng], padded, column-major give the same bits;
 * a 1-D input: [ng] and [1, ng]; the static op: scale [] and [1] */
static void test_scale_forms(void) {
    enum { A = 2, B = 3, D = 96, G = 16, NG = D / G };
    for (int oi = 0; oi < 3; oi++) {
        lk_dtype ot = QOUT[oi];
        tu_buf x = tu_alloc(LK_F16, 3, (int64_t[]){A, B, 2 * D}, 0), out = tu_alloc(ot, 3, (int64_t[]){A, B, D}, 0);
        tu_fill_uniform(&x, -4, 4);
        tu_buf ref = tu_alloc(LK_F32, 3, (int64_t[]){A, B, NG}, 0);
        int ok = lk_silu_and_mul_per_block_quant(&out.t, &x.t, &ref.t, NULL, G) == LK_OK;
        tu_saved o0 = tu_save(&out);
        for (int f = 0; f < 4; f++) {
            tu_buf sc = f == 0   ? tu_alloc(LK_F32, 3, (int64_t[]){A, B, NG}, 1)
                        : f == 1 ? tu_alloc(LK_F32, 2, (int64_t[]){A * B, NG}, 0)
                        : f == 2 ? tu_alloc(LK_F32, 2, (int64_t[]){A * B, NG}, 1)
                                 : tu_alloc_perm(LK_F32, 2, (int64_t[]){A * B, NG}, (int[]){1, 0}, 2);
            tu_snapshot(&sc);
            memset(out.t.data, 0, (size_t)(A * B * D));
            ok &= lk_silu_and_mul_per_block_quant(&out.t, &x.t, &sc.t, NULL, G) == LK_OK && tu_same(&out, &o0) &&
                  tu_outside_intact(&sc);
            for (int64_t k = 0; k < A * B * NG; k++) ok &= tu_get(&sc, k) == tu_get(&ref, k);
            tu_free(&sc);
        }
        float s1[NG], s2[1][NG];
        uint8_t q1[D], q2[D];
        lk_tensor x1 = x.t, o1 = lk_tensor_make(q1, ot, 1, (int64_t[]){D}), o2 = o1;
        x1.ndim = 1, x1.shape[0] = 2 * D, x1.stride[0] = 1;
        o2.data = q2;
        lk_tensor t1 = lk_tensor_make(s1, LK_F32, 1, (int64_t[]){NG}), t2 = lk_tensor_make(s2, LK_F32, 2, (int64_t[]){1, NG});
        ok &= lk_silu_and_mul_per_block_quant(&o1, &x1, &t1, NULL, G) == LK_OK &&
              lk_silu_and_mul_per_block_quant(&o2, &x1, &t2, NULL, G) == LK_OK && !memcmp(q1, q2, D) &&
              !memcmp(s1, s2, sizeof s1) && !memcmp(q1, out.t.data, D) && !memcmp(s1, ref.t.data, sizeof s1);
        tu_check(ok, "silu_and_mul_per_block_quant -> %s of a 3-D input: scales [2, 3, ng], padded, flat [6, ng], "
                 "flat padded and column-major give the same bits; a 1-D input: [ng] and [1, ng] (its first row's)",
                 lk_dtype_name(ot));
        if (oi < 2) {
            float v = 0.03f;
            lk_tensor s0 = lk_tensor_make(&v, LK_F32, 0, NULL), s1t = one_scale(&v);
            ok = lk_silu_and_mul_quant(&out.t, &x.t, &s0) == LK_OK;
            memcpy(o0.bytes, out.base, o0.n);
            memset(out.t.data, 0, (size_t)(A * B * D));
            ok &= lk_silu_and_mul_quant(&out.t, &x.t, &s1t) == LK_OK && tu_same(&out, &o0);
            tu_check(ok, "silu_and_mul_quant -> %s: scale [] and [1] give the same bits", lk_dtype_name(ot));
        }
        free(o0.bytes);
        tu_free(&x), tu_free(&out), tu_free(&ref);
    }
}

/* negative row strides (rows read and written bottom-up) and a zero row stride on the
 * input (every row the same): the contiguous call's bits, per ISA */
static void test_strides(void) {
    enum { R = 5, D = 72, G = 24, NG = D / G };
    tu_buf x = tu_alloc(LK_BF16, 2, (int64_t[]){R, 2 * D}, 0);
    tu_fill_uniform(&x, -5, 5);
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        for (int oi = 0; oi < 3; oi++) {
            lk_dtype ot = QOUT[oi];
            uint8_t o1[R][D], o2[R][D], o3[R][D];
            float s1[R][NG], s2[R][NG], s3[R][NG], v = 0.02f;
            lk_tensor t1 = lk_tensor_make(o1, ot, 2, (int64_t[]){R, D}), ts1 = lk_tensor_make(s1, LK_F32, 2, (int64_t[]){R, NG});
            lk_tensor t2 = lk_tensor_make(o2[R - 1], ot, 2, (int64_t[]){R, D});
            lk_tensor ts2 = lk_tensor_make(s2[R - 1], LK_F32, 2, (int64_t[]){R, NG});
            lk_tensor xr = x.t;
            xr.data = (char *)x.t.data + (R - 1) * 2 * D * 2;
            xr.stride[0] = -2 * D, t2.stride[0] = -D, ts2.stride[0] = -NG;
            int fp8 = oi < 2, ok;
            if (fp8) {
                lk_tensor sv = one_scale(&v);
                ok = lk_silu_and_mul_quant(&t1, &x.t, &sv) == LK_OK && lk_silu_and_mul_quant(&t2, &xr, &sv) == LK_OK &&
                     !memcmp(o1, o2, sizeof o1);
            } else ok = 1;
            ok &= lk_silu_and_mul_per_block_quant(&t1, &x.t, &ts1, NULL, G) == LK_OK &&
                  lk_silu_and_mul_per_block_quant(&t2, &xr, &ts2, NULL, G) == LK_OK && !memcmp(o1, o2, sizeof o1) &&
                  !memcmp(s1, s2, sizeof s1);
            /* zero row stride: row 2 broadcast */
            lk_tensor xb = x.t, t3 = lk_tensor_make(o3, ot, 2, (int64_t[]){R, D});
            lk_tensor ts3 = lk_tensor_make(s3, LK_F32, 2, (int64_t[]){R, NG});
            xb.data = (char *)x.t.data + 2 * 2 * D * 2, xb.stride[0] = 0;
            ok &= lk_silu_and_mul_per_block_quant(&t3, &xb, &ts3, NULL, G) == LK_OK;
            for (int r = 0; r < R; r++) ok &= !memcmp(o3[r], o1[2], D) && !memcmp(s3[r], s1[2], sizeof s3[r]);
            tu_check(ok, "%s silu_and_mul%s -> %s: negative row strides give the contiguous bits, a zero input row "
                     "stride repeats one row", lk_isa_name(isas[ii]), fp8 ? "_quant and _per_block_quant" : "_per_block_quant",
                     lk_dtype_name(ot));
        }
    }
    tu_free(&x);
}

/* ---------------------------------------------------------------- threads */

/* 1-4 threads bitwise identical on every ISA, garbage in the outputs before each run (a
 * run that skips a write cannot pass on the previous one's): 32 rows of 4096 (static;
 * per block G = 128 row-major e4m3, column-major i8 with scale_ub), one row of 14336
 * (units split inside the row: static, G = 128, G = 7168 two-pass), 4 rows of 6144 in
 * blocks of 2048 (two-pass) */
static void test_threads(void) {
    static const struct {
        int64_t R, D, G;
        lk_dtype ot;
        int colmajor, ub;
    } C[] = {{32, 4096, 0, LK_F8E4M3, 0, 0},     {32, 4096, 128, LK_F8E4M3, 0, 0}, {32, 4096, 128, LK_I8, 1, 1},
             {1, 14336, 0, LK_F8E5M2, 0, 0},     {1, 14336, 128, LK_I8, 0, 0},     {1, 14336, 7168, LK_F8E4M3, 1, 1},
             {4, 6144, 2048, LK_F8E5M2, 0, 0}};
    float ubv = 0.01f;
    lk_tensor ub = one_scale(&ubv);
    for (size_t k = 0; k < sizeof C / sizeof C[0]; k++) {
        int64_t R = C[k].R, D = C[k].D, G = C[k].G, ng = G ? D / G : 1;
        if (tu_emulated() && k % 3) continue;
        tu_buf x = tu_alloc(LK_BF16, 2, (int64_t[]){R, 2 * D}, 0), out = tu_alloc(C[k].ot, 2, (int64_t[]){R, D}, 0);
        tu_buf sc = C[k].colmajor ? tu_alloc_perm(LK_F32, 2, (int64_t[]){R, ng}, (int[]){1, 0}, 3)
                                  : tu_alloc(LK_F32, 2, (int64_t[]){R, ng}, 0);
        tu_fill_uniform(&x, -6, 6);
        float s1 = 0.01f;
        lk_tensor one = one_scale(&s1);
        for (int ii = 0; ii < ni; ii++) {
            lk_set_isa(isas[ii]);
            tu_saved first[2] = {{0}};
            int ok = 1;
            for (int th = 1; th <= 4; th++) {
                lk_set_num_threads(th);
                tu_fill_uniform(&out, -1, 1);
                if (G) tu_fill_uniform(&sc, -1, 1); /* the static op has none */
                lk_status s = G ? lk_silu_and_mul_per_block_quant(&out.t, &x.t, &sc.t, C[k].ub ? &ub : NULL, G)
                                : lk_silu_and_mul_quant(&out.t, &x.t, &one);
                ok &= s == LK_OK;
                if (th == 1) first[0] = tu_save(&out), first[1] = tu_save(&sc);
                else ok &= tu_same(&out, &first[0]) && tu_same(&sc, &first[1]);
            }
            lk_set_num_threads(0);
            tu_check(ok, "%s silu_and_mul_%s R=%lld d=%lld G=%lld -> %s%s%s: 1-4 threads bitwise identical (out, "
                     "scales)", lk_isa_name(isas[ii]), G ? "per_block_quant" : "quant", (long long)R, (long long)D,
                     (long long)(G ? G : D), lk_dtype_name(C[k].ot),
                     C[k].colmajor ? " column-major scales" : "", C[k].ub ? " scale_ub" : "");
            free(first[0].bytes), free(first[1].bytes);
        }
        tu_free(&x), tu_free(&out), tu_free(&sc);
    }
}

/* ---------------------------------------------------------------- empty */

/* no rows, or d == 0 (no blocks): LK_OK, nothing written; the arguments still validated
 * (a bad scale / group_size on an empty input is refused) */
static void test_empty(void) {
    static const int64_t SH[4][3] = {{0, 8}, {2, 0}, {0, 3, 8}, {2, 3, 0}};
    static const int ND[4] = {2, 2, 3, 3};
    int ok = 1, valid = 1;
    for (int c = 0; c < 4; c++) {
        int nd = ND[c];
        int64_t xs[3] = {SH[c][0], SH[c][1], SH[c][2]}, ss[3] = {SH[c][0], SH[c][1], SH[c][2]};
        xs[nd - 1] *= 2;
        ss[nd - 1] /= 4;
        tu_buf x = tu_alloc(LK_F16, nd, xs, 1), sc = tu_alloc(LK_F32, nd, ss, 1), ubb = tu_alloc(LK_F32, 1, (int64_t[]){1}, 0);
        tu_set(&ubb, 0, 0.5);
        tu_snapshot(&x), tu_snapshot(&sc), tu_snapshot(&ubb);
        for (int ii = 0; ii < ni; ii++) {
            lk_set_isa(isas[ii]);
            for (int oi = 0; oi < 3; oi++) {
                tu_buf out = tu_alloc(QOUT[oi], nd, SH[c], 1);
                tu_snapshot(&out);
                float v = 0.5f, bad = 0.0f;
                lk_tensor tv = one_scale(&v), tb = one_scale(&bad);
                ok &= lk_silu_and_mul_per_block_quant(&out.t, &x.t, &sc.t, &ubb.t, 4) == LK_OK &&
                      lk_silu_and_mul_per_block_quant(&out.t, &x.t, &sc.t, NULL, 4) == LK_OK;
                if (oi < 2) ok &= lk_silu_and_mul_quant(&out.t, &x.t, &tv) == LK_OK;
                ok &= tu_intact(&x) && tu_intact(&out) && tu_intact(&sc) && tu_intact(&ubb);
                valid &= lk_silu_and_mul_per_block_quant(&out.t, &x.t, &sc.t, &tb, 4) == LK_ERR_VALUE &&
                         lk_silu_and_mul_per_block_quant(&out.t, &x.t, &sc.t, NULL, 0) == LK_ERR_VALUE &&
                         (oi == 2 ? lk_silu_and_mul_quant(&out.t, &x.t, &tv) == LK_ERR_DTYPE
                                  : lk_silu_and_mul_quant(&out.t, &x.t, &tb) == LK_ERR_VALUE) &&
                         tu_intact(&out) && tu_intact(&sc);
                tu_free(&out);
            }
        }
        tu_free(&x), tu_free(&sc), tu_free(&ubb);
    }
    tu_check(ok, "silu_and_mul quant ops of empty inputs (0 rows, d == 0; 2-D and 3-D; e4m3 / e5m2 / i8): LK_OK, "
             "nothing written");
    tu_check(valid, "silu_and_mul quant ops of empty inputs: a bad scale / scale_ub / group_size or an i8 static out "
             "still refused, nothing written");
}

/* ---------------------------------------------------------------- errors */

static void expect(lk_status got, lk_status want, const char *name, tu_buf **bufs, int nb, const char *what) {
    int intact = 1;
    for (int k = 0; k < nb; k++) intact &= tu_intact(bufs[k]);
    const char *msg = lk_last_error();
    tu_check(got == want && strstr(msg, name) != NULL && intact, "%s: %s (want %s naming %s) \"%s\"%s", what,
             lk_status_str(got), lk_status_str(want), name, msg, intact ? "" : ", buffers changed");
}

/* expect() with the message starting "<op>: <name>" */
static void op_expect(const char *op, lk_status got, lk_status want, const char *name, tu_buf **bufs, int nb,
                      const char *what) {
    char pre[96];
    snprintf(pre, sizeof pre, "%s: %s", op, name);
    int named = !strncmp(lk_last_error(), pre, strlen(pre));
    expect(got, want, named ? name : "(a message starting with the op and the argument)", bufs, nb, what);
}
#define bexpect(...) op_expect("lk_silu_and_mul_per_block_quant", __VA_ARGS__)
#define sexpect(...) op_expect("lk_silu_and_mul_quant", __VA_ARGS__)

static void test_errors(void) {
    int64_t R = 3, D = 20, G = 4, NG = D / G;
    tu_buf x = tu_alloc(LK_BF16, 2, (int64_t[]){R, 2 * D}, 0), out = tu_alloc(LK_F8E4M3, 2, (int64_t[]){R, D}, 0);
    tu_buf o8 = tu_alloc(LK_I8, 2, (int64_t[]){R, D}, 0), of = tu_alloc(LK_F32, 2, (int64_t[]){R, D}, 0);
    tu_buf sc = tu_alloc(LK_F32, 2, (int64_t[]){R, NG}, 0), sc16 = tu_alloc(LK_F16, 2, (int64_t[]){R, NG}, 0);
    tu_buf big = tu_alloc(LK_F32, 2, (int64_t[]){7, 8}, 0), s1 = tu_alloc(LK_F32, 1, (int64_t[]){1}, 0);
    tu_buf x3 = tu_alloc(LK_BF16, 3, (int64_t[]){2, 3, 2 * D}, 0), o3 = tu_alloc(LK_F8E4M3, 3, (int64_t[]){2, 3, D}, 0);
    tu_buf ub = tu_alloc(LK_F32, 1, (int64_t[]){1}, 0), ub16 = tu_alloc(LK_F16, 1, (int64_t[]){1}, 0);
    tu_buf xo = tu_alloc(LK_F32, 2, (int64_t[]){R, 2 * D - 1}, 0);
    tu_fill_uniform(&x, -1, 1), tu_fill_uniform(&x3, -1, 1), tu_fill_uniform(&xo, -1, 1);
    tu_set(&ub, 0, 2.0), tu_set(&ub16, 0, 2.0), tu_set(&s1, 0, 0.5);
    tu_buf *all[] = {&x, &out, &o8, &of, &sc, &sc16, &big, &s1, &x3, &o3, &ub, &ub16, &xo};
    int nb = 13;
    for (int b = 0; b < nb; b++) tu_snapshot(all[b]);
#define BQ(o, xx, s, u, g) lk_silu_and_mul_per_block_quant(o, xx, s, u, g)
#define SQ(o, xx, s) lk_silu_and_mul_quant(o, xx, s)
    /* NULLs */
    bexpect(BQ(NULL, &x.t, &sc.t, &ub.t, G), LK_ERR_NULL, "out", all, nb, "block: NULL out");
    bexpect(BQ(&out.t, NULL, &sc.t, &ub.t, G), LK_ERR_NULL, "input", all, nb, "block: NULL input");
    bexpect(BQ(&out.t, &x.t, NULL, &ub.t, G), LK_ERR_NULL, "scales", all, nb, "block: NULL scales");
    sexpect(SQ(NULL, &x.t, &s1.t), LK_ERR_NULL, "out", all, nb, "static: NULL out");
    sexpect(SQ(&out.t, NULL, &s1.t), LK_ERR_NULL, "input", all, nb, "static: NULL input");
    sexpect(SQ(&out.t, &x.t, NULL), LK_ERR_NULL, "scale", all, nb, "static: NULL scale");
    lk_tensor nd = sc.t, nx = x.t, no = out.t, ns = s1.t, nu = ub.t;
    nd.data = NULL, nx.data = NULL, no.data = NULL, ns.data = NULL, nu.data = NULL;
    bexpect(BQ(&out.t, &x.t, &nd, NULL, G), LK_ERR_NULL, "scales", all, nb, "block: scales with NULL data");
    bexpect(BQ(&out.t, &nx, &sc.t, NULL, G), LK_ERR_NULL, "input", all, nb, "block: input with NULL data");
    bexpect(BQ(&no, &x.t, &sc.t, NULL, G), LK_ERR_NULL, "out", all, nb, "block: out with NULL data");
    bexpect(BQ(&out.t, &x.t, &sc.t, &nu, G), LK_ERR_NULL, "scale_ub", all, nb, "block: scale_ub with NULL data");
    sexpect(SQ(&out.t, &x.t, &ns), LK_ERR_NULL, "scale", all, nb, "static: scale with NULL data");
    /* dtypes */
    lk_tensor xi = x.t, x8 = x.t;
    xi.dtype = LK_I32, x8.dtype = LK_F8E4M3;
    bexpect(BQ(&out.t, &xi, &sc.t, NULL, G), LK_ERR_DTYPE, "input", all, nb, "block: i32 input");
    bexpect(BQ(&o8.t, &x8, &sc.t, NULL, G), LK_ERR_DTYPE, "input", all, nb, "block: fp8 input");
    sexpect(SQ(&out.t, &xi, &s1.t), LK_ERR_DTYPE, "input", all, nb, "static: i32 input");
    sexpect(SQ(&out.t, &x8, &s1.t), LK_ERR_DTYPE, "input", all, nb, "static: fp8 input");
    bexpect(BQ(&of.t, &x.t, &sc.t, NULL, G), LK_ERR_DTYPE, "out", all, nb, "block: f32 out");
    sexpect(SQ(&of.t, &x.t, &s1.t), LK_ERR_DTYPE, "out", all, nb, "static: f32 out");
    sexpect(SQ(&o8.t, &x.t, &s1.t), LK_ERR_DTYPE, "out", all, nb, "static: i8 out (fp8 only)");
    bexpect(BQ(&out.t, &x.t, &sc16.t, NULL, G), LK_ERR_DTYPE, "scales", all, nb, "block: f16 scales");
    lk_tensor si = sc.t;
    si.dtype = LK_I32;
    bexpect(BQ(&o8.t, &x.t, &si, NULL, G), LK_ERR_DTYPE, "scales", all, nb, "block: i32 scales");
    bexpect(BQ(&out.t, &x.t, &sc.t, &ub16.t, G), LK_ERR_DTYPE, "scale_ub", all, nb, "block: f16 scale_ub");
    lk_tensor s16 = lk_tensor_make(ub16.t.data, LK_F16, 1, (int64_t[]){1});
    sexpect(SQ(&out.t, &x.t, &s16), LK_ERR_DTYPE, "scale", all, nb, "static: f16 scale");
    /* input's last dim odd; out's shape and rank */
    lk_tensor oo = lk_tensor_make(out.t.data, LK_F8E4M3, 2, (int64_t[]){R, D - 1});
    bexpect(BQ(&oo, &xo.t, &sc.t, NULL, 1), LK_ERR_SHAPE, "input", all, nb, "block: input [3, 39]");
    sexpect(SQ(&oo, &xo.t, &s1.t), LK_ERR_SHAPE, "input", all, nb, "static: input [3, 39]");
    static const int64_t BADO[][3] = {{3, 21}, {3, 40}, {2, 20}, {4, 20}, {3, 10}};
    for (size_t k = 0; k < sizeof BADO / sizeof BADO[0]; k++) {
        lk_tensor t = lk_tensor_make(big.t.data, k & 1 ? LK_I8 : LK_F8E5M2, 2, BADO[k]);
        char what[96];
        snprintf(what, sizeof what, "block: out %s for input [3, 40]", lk_shape_str(&t));
        bexpect(BQ(&t, &x.t, &sc.t, NULL, 1), LK_ERR_SHAPE, "out", all, nb, what);
        t.dtype = LK_F8E4M3;
        snprintf(what, sizeof what, "static: out %s for input [3, 40]", lk_shape_str(&t));
        sexpect(SQ(&t, &x.t, &s1.t), LK_ERR_SHAPE, "out", all, nb, what);
    }
    lk_tensor o1d = lk_tensor_make(out.t.data, LK_F8E4M3, 1, (int64_t[]){R * D});
    bexpect(BQ(&o1d, &x.t, &sc.t, NULL, G), LK_ERR_RANK, "out", all, nb, "block: out [60] for input [3, 40]");
    sexpect(SQ(&o3.t, &x.t, &s1.t), LK_ERR_RANK, "out", all, nb, "static: out [2, 3, 20] for input [3, 40]");
    bexpect(BQ(&out.t, &x3.t, &sc.t, NULL, G), LK_ERR_RANK, "out", all, nb, "block: out [3, 20] for input [2, 3, 40]");
    lk_tensor x0 = lk_tensor_make(x.t.data, LK_BF16, 0, NULL);
    sexpect(SQ(&out.t, &x0, &s1.t), LK_ERR_RANK, "input", all, nb, "static: 0-d input");
    /* group_size */
    static const int64_t BADG[] = {0, -1, -128, INT64_MIN};
    for (size_t k = 0; k < sizeof BADG / sizeof BADG[0]; k++) {
        char what[96];
        snprintf(what, sizeof what, "block: group_size %lld", (long long)BADG[k]);
        bexpect(BQ(k & 1 ? &o8.t : &out.t, &x.t, &sc.t, &ub.t, BADG[k]), LK_ERR_VALUE, "group_size", all, nb, what);
    }
    static const int64_t NDIV[] = {3, 8, 40, 21, INT64_MAX};
    for (size_t k = 0; k < sizeof NDIV / sizeof NDIV[0]; k++) {
        char what[96];
        snprintf(what, sizeof what, "block: group_size %lld not dividing d 20", (long long)NDIV[k]);
        bexpect(BQ(k & 1 ? &o8.t : &out.t, &x.t, &sc.t, NULL, NDIV[k]), LK_ERR_SHAPE, "group_size", all, nb, what);
    }
    /* scales of a wrong shape (ng = 5) */
    static const int64_t BADSH[][3] = {{3, 6}, {4, 5}, {2, 5}, {5, 3}, {15}, {3, 5, 1}, {1, 3, 5}, {3, 1}, {3}, {5}};
    static const int BADND[] = {2, 2, 2, 2, 1, 3, 3, 2, 1, 1};
    for (size_t k = 0; k < sizeof BADND / sizeof BADND[0]; k++) {
        lk_tensor t = lk_tensor_make(big.t.data, LK_F32, BADND[k], BADSH[k]);
        char what[96];
        snprintf(what, sizeof what, "block: scales %s for input [3, 40] G 4", lk_shape_str(&t));
        bexpect(BQ(k & 1 ? &o8.t : &out.t, &x.t, &t, NULL, G), LK_ERR_SHAPE, "scales", all, nb, what);
    }
    static const int64_t BAD3[][3] = {{3, 2, 5}, {2, 3, 1}, {6, 5, 1}, {30}, {2, 15}, {1, 6, 5}, {6}, {6, 1}};
    static const int BAD3ND[] = {3, 3, 3, 1, 2, 3, 1, 2};
    for (size_t k = 0; k < sizeof BAD3ND / sizeof BAD3ND[0]; k++) {
        lk_tensor t = lk_tensor_make(big.t.data, LK_F32, BAD3ND[k], BAD3[k]);
        char what[96];
        snprintf(what, sizeof what, "block: scales %s for input [2, 3, 40] G 4", lk_shape_str(&t));
        bexpect(BQ(&o3.t, &x3.t, &t, NULL, G), LK_ERR_SHAPE, "scales", all, nb, what);
    }
    /* static scale: shape, values; scale_ub: shape, values */
    static const int64_t BADS[][2] = {{2}, {1, 1}, {0}};
    static const int BADSND[] = {1, 2, 1};
    for (size_t k = 0; k < 3; k++) {
        lk_tensor t = lk_tensor_make(big.t.data, LK_F32, BADSND[k], BADS[k]);
        char what[96];
        snprintf(what, sizeof what, "static: scale %s", lk_shape_str(&t));
        sexpect(SQ(&out.t, &x.t, &t), LK_ERR_SHAPE, "scale", all, nb, what);
        snprintf(what, sizeof what, "block: scale_ub %s", lk_shape_str(&t));
        bexpect(BQ(&out.t, &x.t, &sc.t, &t, G), LK_ERR_SHAPE, "scale_ub", all, nb, what);
    }
    static const float BADV[] = {0.0f, -0.0f, -1.0f, NAN, INFINITY, -INFINITY};
    for (size_t k = 0; k < sizeof BADV / sizeof BADV[0]; k++) {
        tu_set(&s1, 0, BADV[k]), tu_set(&ub, 0, BADV[k]);
        tu_snapshot(&s1), tu_snapshot(&ub);
        char what[96];
        snprintf(what, sizeof what, "static: scale %g", (double)BADV[k]);
        sexpect(SQ(k & 1 ? &out.t : &o3.t, k & 1 ? &x.t : &x3.t, &s1.t), LK_ERR_VALUE, "scale", all, nb, what);
        lk_tensor s0 = lk_tensor_make(s1.t.data, LK_F32, 0, NULL);
        snprintf(what, sizeof what, "static: scale [] %g", (double)BADV[k]);
        sexpect(SQ(&out.t, &x.t, &s0), LK_ERR_VALUE, "scale", all, nb, what);
        snprintf(what, sizeof what, "block: scale_ub %g", (double)BADV[k]);
        bexpect(BQ(k & 1 ? &o8.t : &out.t, &x.t, &sc.t, &ub.t, G), LK_ERR_VALUE, "scale_ub", all, nb, what);
    }
    tu_set(&s1, 0, 0.5), tu_set(&ub, 0, 2.0);
    tu_snapshot(&s1), tu_snapshot(&ub);
    /* overlaps */
    lk_tensor ox = lk_tensor_make(x.t.data, LK_F8E4M3, 2, (int64_t[]){R, D});
    bexpect(BQ(&ox, &x.t, &sc.t, NULL, G), LK_ERR_ALIAS, "out", all, nb, "block: out overlapping input");
    sexpect(SQ(&ox, &x.t, &s1.t), LK_ERR_ALIAS, "out", all, nb, "static: out overlapping input");
    lk_tensor ou = lk_tensor_make((char *)x.t.data + 2 * (2 * D - 2), LK_I8, 2, (int64_t[]){R, D}); /* the last up values */
    bexpect(BQ(&ou, &x.t, &sc.t, NULL, G), LK_ERR_ALIAS, "out", all, nb, "block: out overlapping input's up half");
    lk_tensor o0s = out.t;
    o0s.stride[0] = 0;
    bexpect(BQ(&o0s, &x.t, &sc.t, NULL, G), LK_ERR_ALIAS, "out", all, nb, "block: out with a zero row stride");
    sexpect(SQ(&o0s, &x.t, &s1.t), LK_ERR_ALIAS, "out", all, nb, "static: out with a zero row stride");
    lk_tensor o0c = out.t;
    o0c.stride[1] = 0;
    sexpect(SQ(&o0c, &x.t, &s1.t), LK_ERR_ALIAS, "out", all, nb, "static: out with a zero column stride");
    lk_tensor s0s = sc.t;
    s0s.stride[0] = 0;
    bexpect(BQ(&out.t, &x.t, &s0s, NULL, G), LK_ERR_ALIAS, "scales", all, nb, "block: scales with a zero stride");
    lk_tensor so = lk_tensor_make(out.t.data, LK_F32, 2, (int64_t[]){R, NG}); /* 60 bytes over out's 60 */
    bexpect(BQ(&out.t, &x.t, &so, NULL, G), LK_ERR_ALIAS, "scales", all, nb, "block: scales overlapping out");
    lk_tensor sx = lk_tensor_make((char *)x.t.data + 8, LK_F32, 2, (int64_t[]){R, NG});
    bexpect(BQ(&out.t, &x.t, &sx, NULL, G), LK_ERR_ALIAS, "scales", all, nb, "block: scales overlapping input");
    /* scale_ub inside scales / out, the static scale inside out (their values valid: 2, 0.5) */
    lk_tensor su = lk_tensor_make((char *)sc.t.data + 4 * 7, LK_F32, 1, (int64_t[]){1});
    memcpy(su.data, &(float){2.0f}, 4);
    memcpy(out.t.data, &(float){0.5f}, 4);
    for (int b = 0; b < nb; b++) tu_snapshot(all[b]);
    bexpect(BQ(&out.t, &x.t, &sc.t, &su, G), LK_ERR_ALIAS, "scales", all, nb, "block: scale_ub inside scales");
    lk_tensor uo = lk_tensor_make(out.t.data, LK_F32, 0, NULL);
    bexpect(BQ(&out.t, &x.t, &sc.t, &uo, G), LK_ERR_ALIAS, "out", all, nb, "block: scale_ub inside out");
    sexpect(SQ(&out.t, &x.t, &uo), LK_ERR_ALIAS, "out", all, nb, "static: scale inside out");
#undef BQ
#undef SQ
    /* the valid calls, for contrast: G = d (scales [3, 1]), G = 1, scale_ub inside the
     * input (read only), a zero row stride on the input, the static scale inside the input */
    tu_buf sg = tu_alloc(LK_F32, 2, (int64_t[]){R, D}, 0), sd = tu_alloc(LK_F32, 2, (int64_t[]){R, 1}, 0);
    lk_tensor ux = lk_tensor_make(x3.t.data, LK_F32, 1, (int64_t[]){1});
    memcpy(ux.data, &(float){2.0f}, 4);
    lk_tensor xz = x.t;
    xz.stride[0] = 0;
    lk_tensor s6 = lk_tensor_make(big.t.data, LK_F32, 2, (int64_t[]){6, 1});
    int ok = lk_silu_and_mul_per_block_quant(&out.t, &x.t, &sd.t, NULL, D) == LK_OK &&
             lk_silu_and_mul_per_block_quant(&o8.t, &x.t, &sg.t, &ub.t, 1) == LK_OK &&
             lk_silu_and_mul_per_block_quant(&o3.t, &x3.t, &s6, &ux, D) == LK_OK &&
             lk_silu_and_mul_per_block_quant(&out.t, &xz, &sc.t, &ub.t, G) == LK_OK &&
             lk_silu_and_mul_quant(&o3.t, &x3.t, &ux) == LK_OK;
    tu_check(ok, "silu_and_mul quant ops: G = d, G = 1, scale_ub / scale inside the input, a zero input row stride "
             "accepted (%s)", lk_last_error());
    tu_free(&sg), tu_free(&sd);
    for (int b = 0; b < nb; b++) tu_free(all[b]);
}

int main(void) {
    tu_init();
    ni = tu_isas(isas);
    test_block_grid();
    test_static_grid();
    test_specials();
    test_rules();
    test_silu_mirror();
    test_scale_forms();
    test_strides();
    test_threads();
    test_empty();
    test_errors();
    lk_set_isa(isas[ni - 1]);
    return tu_finish("test_act_quant");
}
