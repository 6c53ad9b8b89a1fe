/*
 * fp8 activations: lk_static_scaled_fp8_quant, lk_dynamic_scaled_fp8_quant,
 * lk_dynamic_per_token_scaled_fp8_quant, lk_per_token_group_fp8_quant,
 * lk_static_group_scaled_fp8_quant, lk_rms_norm_static_fp8_quant,
 * lk_fused_add_rms_norm_static_fp8_quant, lk_rms_norm_dynamic_per_token_quant,
 * lk_rms_norm_per_block_quant and lk_merge_attn_states_scaled.
 *
 * Every ISA against ref bit for bit over the outputs' WHOLE allocations (written
 * elements, padding garbage, guard zones) and the scales; ref against float64: every
 * dequantized element within half an fp8 step of the float64 value / scale (plus the
 * f32 computation's relative slack for the norms and the merge, docs/numerics.md), or
 * +-max beyond the max; dynamic scales against the float64 formula. Grid: input dtypes
 * f32 / f16 / bf16 x out e4m3 / e5m2, D = 1, 3, 7, 16, 33, 130, 4097, rows 1..5,
 * contiguous and strided (padding garbage) views, a non-unit last stride (the reference
 * fallback), [rows] and [rows, 1] scales, scale_ub, residual dtypes, weightless norms;
 * the int8 out of the per-token norm on the same grid (within half an integer step of
 * the float64 value / scale, scales max(absmax / 127, FLT_EPSILON)) and its converter.
 * Per-token-group quant: the same two comparisons (every scale exactly the f32 formula
 * max(absmax, eps) / fp8_max; with UE8M0 the smallest power of two >= max(s, 1e-10),
 * checked to be a power of two >= s and < 2 s, or 2^-33 when clamped; each group's absmax
 * element at the max code) over input dtypes x out dtypes (e4m3, e5m2, and i8: vLLM's
 * per_token_group_quant_int8, fp8_max 127, codes trunc(clamp(x / s, -128, 127)) equal to
 * that rule written out independently and within [0, 1) toward zero of the float64 value
 * / scale, so a rounded code fails; the absmax element at +-127 or +-126), group sizes 1,
 * 3, 7, 16, 128 (D = G, 3 G, odd rows 33 / 3, 33 / 33, 51 / 17, 4097 / 241, and
 * DeepSeek-V3's 7168 / 128), rows 1..5, contiguous / padded / transposed
 * (reference fallback) inputs and outs, 3-D inputs [2, 3, D] with [2, 3, ng] or flat
 * [6, ng] scales, row-major, padded and column-major scales (vLLM's transposed view of a
 * [ng, rows padded to 4] buffer, padding intact), UE8M0 on and off, eps 1e-10, its
 * minimum fp8_max * FLT_MIN, and a large eps (1) that dominates. The i8 out's rules per
 * ISA by their codes (2.7 -> 2, -2.7 -> -2, -0.5 -> 0, +-127, NaN -> 0, an inf group all
 * 0, an all-zero group eps / 127) and its converter lk_q_i8_trunc (saturation at 127 /
 * -128, out of the op's reach); threads, empty inputs, scale forms and errors (eps >= 127
 * FLT_MIN, shape, overlaps) with i8 outs too.
 * Static quant on a grid of given scales [sm, sn] (groups of M / sm rows x N / sn
 * columns): the same two comparisons (float64: x / scale[r / gm, c / gn]; inputs intact)
 * over input dtypes x out dtypes with scales per tensor [1, 1], per channel [1, N] (the
 * vector path; N = 1, 7, 16, 33, 130, 4097: every tail), per token [M, 1], per element
 * [M, N], 2-D blocks [M / 2, N / 128] (N = 256), column groups of 2, 3, 5 (element by
 * element), 8, 15, 16, 17, 32 (around W = 8 / 16), 128 with rows in groups of 1, 2 or all;
 * every third element at an fp8 tie times its scale (any change of the f32 division
 * moves codes); rows 1..5, 3-D [2, 3, N], the group_case layouts; scales contiguous,
 * padded, transposed and with column stride 2 (per channel NOT read as vectors: the
 * element path's bits); every form, negative strides, a zero row stride, the per-element
 * expansion, 3-D / 1-D inputs and lk_static_scaled_fp8_quant ([1, 1]) agreeing bitwise;
 * NaN / inf / beyond-max codes on each path and the extreme valid scales FLT_MAX and
 * FLT_TRUE_MIN.
 * RMSNorm with scales per block of G columns (lk_rms_norm_per_block_quant): the same two
 * comparisons (every block scale within the norms' relative slack of the float64
 * max(min(absmax_block(y64), scale_ub) / max, min_scale), codes within half a step (+ the
 * slack) of y64 / scale, the i8 out's rules, residual = round(x + residual)) over input /
 * residual / weight dtypes (mixed) x e4m3 / e5m2 / i8 outs, G = 1, 7, 16, 64, 128 with D =
 * G, 3 G (and 7168 / 128), rows 1..5, the group_case layouts plus a transposed residual,
 * 3-D inputs with [2, 3, ng] and flat scales, padded and column-major scales, with and
 * without residual, weight (NULL) and scale_ub, a block a 64th of the others and an
 * all-zero block; specials (a NaN row, an inf row, a NaN and an inf weight: every ISA
 * equal up to the sign of NaN codes, docs/numerics.md); group_size = D giving exactly
 * lk_rms_norm_dynamic_per_token_quant's bits; the scale forms agreeing, 1-4 threads,
 * empty inputs and its error catalogue (group_size < 1 or not dividing D, epsilon,
 * scale_ub, scales' dtype / shapes / overlaps with every other argument).
 * Also: NaN / inf / saturation (per group: NaN ignored by the absmax and kept, an inf
 * makes the group's scale inf, all-zero and all-NaN groups get eps / fp8_max), empty
 * inputs (the grid's scale still validated), thread-count independence (1-4 threads,
 * bitwise) and the bad-input catalogue (status, message naming the argument, every
 * buffer intact; the grid: NULLs, scale ranks 0 / 1 / 3, dims not dividing or 0, a bad
 * value named "scale[i, j]" by its logical position, dtypes, overlaps).
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/half.h"
#include "cpu/fp8_quant.h"
#include "testutil.h"

static lk_isa isas[TU_MAX_ISAS];
static int ni;

static const lk_dtype FP8[2] = {LK_F8E4M3, LK_F8E5M2};
/* LK_I8 (the int8 out of rms_norm_dynamic_per_token_quant): 127 and FLT_EPSILON, vLLM's */
static double fmax8(lk_dtype dt) { return dt == LK_F8E4M3 ? 448.0 : dt == LK_I8 ? 127.0 : 57344.0; }
static float min_scale(lk_dtype dt) { return dt == LK_I8 ? FLT_EPSILON : 1.0f / ((float)fmax8(dt) * 512.0f); }

/* i8 q vs y = float64 value / scale: within half a step (plus rel |y|) of y clamped to
 * [-128, 127]; NaN -> 0 */
static int i8_close(double y, double q, double rel) {
    if (isnan(y)) return q == 0;
    double c = y > 127 ? 127 : y < -128 ? -128 : y;
    return q == rint(q) && q >= -128 && q <= 127 && fabs(q - c) <= 0.5 + fabs(y) * rel + 1e-9;
}

/* q (dequantized / scale: the fp8 value) vs y = float64 value / scale: within half an fp8
 * step of y (2^(e - 3) e4m3, 2^(e - 2) e5m2, subnormal steps 2^-9 / 2^-16) plus rel |y|,
 * or +-max where |y| reaches the max, NaN for NaN */
static int fp8_close(lk_dtype dt, double y, float q, double rel) {
    double mx = fmax8(dt);
    if (isnan(y)) return isnan(q);
    int M = dt == LK_F8E4M3 ? 3 : 2, emin = dt == LK_F8E4M3 ? -6 : -14;
    int e = y == 0 ? emin : (int)floor(log2(fabs(y)));
    if (e < emin) e = emin;
    double half = ldexp(1.0, e - M - 1) * (1 + 1e-6) + fabs(y) * rel;
    if (fabs(y) * (1 - rel) >= mx) return fabs(q) == mx && (q < 0) == (y < 0);
    if (fabs(y) > mx) return fabs(q) >= mx * (1 - 0.125) && (q < 0) == (y < 0);
    return fabs((double)q - y) <= half && (y == 0 || q == 0 || (q < 0) == (y < 0));
}

static lk_tensor one_scale(float *v) { return lk_tensor_make(v, LK_F32, 1, (int64_t[]){1}); }


/* input values: uniform in [-amp, amp], a few zeros, and specials when asked */
static void fill_x(tu_buf *x, double amp, int specials) {
    tu_fill_uniform(x, -amp, amp);
    int64_t n = tu_numel(x);
    if (n > 2) tu_set(x, n / 2, 0.0);
    if (specials && n > 5) {
        tu_set(x, 1, NAN);
        tu_set(x, 3, amp * 1e6); /* saturates under a static scale */
    }
}

/* ---------------------------------------------------------------- scaled_fp8_quant */

enum { Q_STATIC, Q_TENSOR, Q_TOKEN };
static const char *QNAME[3] = {"static", "per-tensor", "per-token"};

static lk_status quant_call(int mode, const lk_tensor *out, const lk_tensor *x, const lk_tensor *scale,
                            const lk_tensor *ub) {
    if (mode == Q_STATIC) return lk_static_scaled_fp8_quant(out, x, scale);
    if (mode == Q_TENSOR) return lk_dynamic_scaled_fp8_quant(out, x, scale);
    return lk_dynamic_per_token_scaled_fp8_quant(out, x, scale, ub);
}

static void quant_case(int mode, lk_dtype xt, lk_dtype ot, int64_t R, int64_t D, int layout, int scale2d,
                       float ubv, int specials) {
    tu_buf x = tu_alloc_rows(xt, R, D, layout), out = tu_alloc_rows(ot, R, D, layout == 2 ? 1 : layout);
    fill_x(&x, 3.0, specials);
    tu_buf sc = mode == Q_TOKEN ? tu_alloc(LK_F32, scale2d ? 2 : 1, (int64_t[]){R, 1}, 1)
                                : tu_alloc(LK_F32, 1, (int64_t[]){1}, 0);
    if (mode == Q_STATIC) tu_set(&sc, 0, 0.0137);
    float ubs = ubv;
    lk_tensor ub = one_scale(&ubs);
    tu_snapshot(&out);
    tu_saved o0 = tu_save(&out), s0 = tu_save(&sc);
    tu_saved oref = {0}, sref = {0};
    int okall = 1, f64 = 1;
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        tu_restore(&out, &o0);
        tu_restore(&sc, &s0);
        lk_status s = quant_call(mode, &out.t, &x.t, &sc.t, ubv > 0 ? &ub : NULL);
        if (!tu_check(s == LK_OK, "%s quant %s: %s", lk_isa_name(isas[ii]), QNAME[mode], lk_last_error())) continue;
        if (ii == 0) {
            oref = tu_save(&out), sref = tu_save(&sc);
            /* ref vs float64 */
            f64 &= tu_outside_intact(&out);
            double tmax = 0;
            for (int64_t r = 0; r < R; r++)
                for (int64_t i = 0; i < D; i++) {
                    double v = tu_get(&x, r * D + i);
                    if (!isnan(v) && fabs(v) > tmax) tmax = fabs(v);
                }
            for (int64_t r = 0; r < R; r++) {
                float scale;
                if (mode == Q_TOKEN) {
                    double m = 0;
                    for (int64_t i = 0; i < D; i++) {
                        double v = fabs(tu_get(&x, r * D + i));
                        if (v > m) m = v;
                    }
                    if (ubv > 0 && m > ubv) m = ubv;
                    float want = (float)m / (float)fmax8(ot);
                    if (want < min_scale(ot)) want = min_scale(ot);
                    scale = (float)tu_get(&sc, r);
                    f64 &= scale == want;
                } else if (mode == Q_TENSOR) {
                    float want = (float)tmax / (float)fmax8(ot);
                    if (want < min_scale(ot)) want = min_scale(ot);
                    scale = (float)tu_get(&sc, 0);
                    f64 &= scale == want;
                } else scale = (float)tu_get(&sc, 0);
                for (int64_t i = 0; i < D; i++) {
                    double v = tu_get(&x, r * D + i);
                    f64 &= fp8_close(ot, v / scale, (float)tu_get(&out, r * D + i), 0);
                }
            }
        } else
            okall &= tu_same(&out, &oref) && tu_same(&sc, &sref);
    }
    tu_check(f64, "quant %s %s -> %s R=%lld D=%lld layout=%d%s%s: ref within half an fp8 step of float64, scale "
             "as the formula", QNAME[mode], lk_dtype_name(xt), lk_dtype_name(ot), (long long)R, (long long)D, layout,
             ubv > 0 ? " scale_ub" : "", specials ? " specials" : "");
    tu_check(okall, "quant %s %s -> %s R=%lld D=%lld layout=%d: every ISA bit-identical to ref (whole allocations)",
             QNAME[mode], lk_dtype_name(xt), lk_dtype_name(ot), (long long)R, (long long)D, layout);
    free(o0.bytes), free(s0.bytes), free(oref.bytes), free(sref.bytes);
    tu_free(&x), tu_free(&out), tu_free(&sc);
}

static void test_quant_grid(void) {
    static const int64_t DS[] = {1, 3, 7, 16, 33, 130, 4097};
    for (int m = 0; m < 3; m++)
        for (int xi = 0; xi < 3; xi++)
            for (int oi = 0; oi < 2; oi++)
                for (int di = 0; di < 7; di++)
                    for (int layout = 0; layout < 3; layout++) {
                        int64_t D = DS[di], R = D > 1000 ? 2 : 1 + (di + layout) % 5;
                        quant_case(m, TU_FLOAT_DTYPES[xi], FP8[oi], R, D, layout, (di & 1), 0, 0);
                    }
    /* scale_ub below and above the absmax; specials */
    for (int oi = 0; oi < 2; oi++) {
        quant_case(Q_TOKEN, LK_F32, FP8[oi], 4, 40, 0, 1, 1.5f, 0);
        quant_case(Q_TOKEN, LK_BF16, FP8[oi], 4, 40, 1, 0, 100.0f, 0);
        for (int m = 0; m < 3; m++) quant_case(m, LK_F32, FP8[oi], 3, 37, 0, 1, 0, 1);
    }
}

/* NaN stays NaN, inf saturates (static); per token, an inf makes the row's scale inf:
 * finite values 0, the inf NaN; NaN is ignored by the absmax */
static void test_quant_specials(void) {
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        const char *isa = lk_isa_name(isas[ii]);
        for (int oi = 0; oi < 2; oi++) {
            lk_dtype ot = FP8[oi];
            float x[2][40];
            uint8_t q[2][40];
            float s = 0.5f, sc[2];
            for (int i = 0; i < 40; i++) x[0][i] = x[1][i] = (float)(i % 7) - 3.0f;
            x[0][5] = NAN, x[0][6] = -NAN, x[0][7] = INFINITY, x[0][8] = -INFINITY, x[0][9] = 1e30f, x[0][10] = -0.0f;
            x[1][5] = NAN, x[1][6] = INFINITY;
            lk_tensor tx = lk_tensor_make(x, LK_F32, 2, (int64_t[]){2, 40});
            lk_tensor tq = lk_tensor_make(q, ot, 2, (int64_t[]){2, 40});
            lk_tensor ts = one_scale(&s);
            lk_static_scaled_fp8_quant(&tq, &tx, &ts);
            uint8_t mx = ot == LK_F8E4M3 ? 0x7e : 0x7b;
            int ok = q[0][5] == 0x7f && q[0][6] == 0xff && q[0][7] == mx && q[0][8] == (0x80 | mx) &&
                     q[0][9] == mx && q[0][10] == 0x80;
            tu_check(ok, "%s static quant -> %s: NaN kept with its sign, +-inf and 1e30 saturate to +-max, -0 -> 0x80",
                     isa, lk_dtype_name(ot));
            lk_tensor tsc = lk_tensor_make(sc, LK_F32, 1, (int64_t[]){2});
            lk_dynamic_per_token_scaled_fp8_quant(&tq, &tx, &tsc, NULL);
            ok = isinf(sc[0]) && sc[0] > 0 && (q[0][7] & 0x7f) == 0x7f && q[0][0] == 0x80 && q[0][4] == 0 && isinf(sc[1]);
            /* inf / inf is the default NaN: its sign is the CPU's (x86 negative, ARM positive) */
            tu_check(ok, "%s per-token quant -> %s: an inf row gets scale inf (finite values 0, inf NaN)", isa,
                     lk_dtype_name(ot));
            for (int i = 0; i < 40; i++) x[1][i] = (float)(i % 7) - 3.0f;
            x[1][5] = NAN;
            lk_dynamic_per_token_scaled_fp8_quant(&tq, &tx, &tsc, NULL);
            ok = sc[1] == 3.0f / (float)fmax8(ot) && q[1][5] == 0x7f;
            tu_check(ok, "%s per-token quant -> %s: NaN ignored by the absmax, quantized to NaN", isa,
                     lk_dtype_name(ot));
            float z[40] = {0};
            lk_tensor tz = lk_tensor_make(z, LK_F32, 2, (int64_t[]){1, 40});
            lk_tensor tq1 = lk_tensor_make(q, ot, 2, (int64_t[]){1, 40});
            lk_dynamic_scaled_fp8_quant(&tq1, &tz, &ts);
            ok = s == min_scale(ot) && q[0][0] == 0 && q[0][39] == 0;
            tu_check(ok, "%s per-tensor quant -> %s: an all-zero input gets min_scale = 1 / (fp8_max * 512), zeros", isa,
                     lk_dtype_name(ot));
        }
    }
}

/* ---------------------------------------------------------------- rms_norm + quant */

enum { N_STATIC, N_FUSED, N_TOKEN, N_TOKEN_RES };
static const char *NNAME[4] = {"rms_norm_static", "fused_add_rms_norm_static", "rms_norm_per_token",
                               "rms_norm_per_token+residual"};

static lk_status norm_call(int kind, const lk_tensor *out, const lk_tensor *x, const lk_tensor *w,
                           const lk_tensor *res, const lk_tensor *scale, float eps, const lk_tensor *ub) {
    switch (kind) {
    case N_STATIC: return lk_rms_norm_static_fp8_quant(out, x, w, scale, eps);
    case N_FUSED: return lk_fused_add_rms_norm_static_fp8_quant(out, x, res, w, scale, eps);
    default: return lk_rms_norm_dynamic_per_token_quant(out, x, w, scale, eps, ub, kind == N_TOKEN_RES ? res : NULL);
    }
}

static void norm_case(int kind, lk_dtype xt, lk_dtype rt, lk_dtype wt, lk_dtype ot, int64_t R, int64_t D,
                      int layout, int weightless, float ubv) {
    int has_res = kind == N_FUSED || kind == N_TOKEN_RES, tok = kind >= N_TOKEN;
    tu_buf x = tu_alloc_rows(xt, R, D, layout), out = tu_alloc_rows(ot, R, D, layout == 2 ? 0 : layout);
    tu_buf res = tu_alloc_rows(rt, R, D, layout == 1 ? 0 : layout);
    tu_buf w = tu_alloc(wt, 1, &D, 1);
    fill_x(&x, 2.0, 0);
    tu_fill_uniform(&res, -2, 2);
    tu_fill_uniform(&w, -1.5, 1.5);
    tu_buf sc = tok ? tu_alloc(LK_F32, 2, (int64_t[]){R, 1}, 1) : tu_alloc(LK_F32, 1, (int64_t[]){1}, 0);
    if (!tok) tu_set(&sc, 0, 0.011);
    float ubs = ubv, eps = 1e-5f;
    lk_tensor ub = one_scale(&ubs);
    double *res0 = tu_values(&res);
    tu_snapshot(&out), tu_snapshot(&res);
    tu_saved o0 = tu_save(&out), s0 = tu_save(&sc), r0 = tu_save(&res), oref = {0}, sref = {0}, rref = {0};
    int okall = 1, f64 = 1;
    double rel = 1e-5 + 3e-8 * (double)D;
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        tu_restore(&out, &o0), tu_restore(&sc, &s0), tu_restore(&res, &r0);
        lk_status s = norm_call(kind, &out.t, &x.t, weightless ? NULL : &w.t, &res.t, &sc.t, eps, ubv > 0 ? &ub : NULL);
        if (!tu_check(s == LK_OK, "%s %s: %s", lk_isa_name(isas[ii]), NNAME[kind], lk_last_error())) continue;
        if (ii > 0) {
            okall &= tu_same(&out, &oref) && tu_same(&sc, &sref) && tu_same(&res, &rref);
            continue;
        }
        oref = tu_save(&out), sref = tu_save(&sc), rref = tu_save(&res);
        f64 &= tu_outside_intact(&out) && tu_outside_intact(&res);
        for (int64_t r = 0; r < R; r++) {
            double *v = malloc(sizeof(double) * (size_t)(D ? D : 1)), ss = 0, m = 0;
            for (int64_t i = 0; i < D; i++) {
                double xv = tu_get(&x, r * D + i);
                if (has_res) {
                    float sum = (float)(xv + res0[r * D + i]);
                    v[i] = lk_round_to(rt, sum);
                    f64 &= tu_get(&res, r * D + i) == v[i]; /* residual = round(x + residual) */
                } else v[i] = xv;
                ss += v[i] * v[i];
            }
            double inv = 1.0 / sqrt(ss / (double)D + eps);
            for (int64_t i = 0; i < D; i++) {
                v[i] = v[i] * inv * (weightless ? 1.0 : tu_get(&w, i));
                if (fabs(v[i]) > m) m = fabs(v[i]);
            }
            double scale = tu_get(&sc, tok ? r : 0);
            if (tok) {
                double want = (ubv > 0 && m > ubv ? ubv : m) / fmax8(ot);
                if (want < min_scale(ot)) want = min_scale(ot);
                f64 &= fabs(scale - want) <= want * (rel + 1e-7);
            }
            for (int64_t i = 0; i < D; i++)
                f64 &= ot == LK_I8 ? i8_close(v[i] / scale, tu_get(&out, r * D + i), rel)
                                   : fp8_close(ot, v[i] / scale, (float)tu_get(&out, r * D + i), rel);
            free(v);
        }
    }
    tu_check(f64, "%s %s (res %s, w %s%s) -> %s R=%lld D=%lld layout=%d%s: ref within half an fp8 step (+ f32 "
             "slack) of float64, residual = round(x + residual), scales as the formula", NNAME[kind],
             lk_dtype_name(xt), lk_dtype_name(rt), lk_dtype_name(wt), weightless ? ", none" : "", lk_dtype_name(ot),
             (long long)R, (long long)D, layout, ubv > 0 ? " scale_ub" : "");
    tu_check(okall, "%s %s -> %s R=%lld D=%lld layout=%d: every ISA bit-identical to ref (out, scales, residual)",
             NNAME[kind], lk_dtype_name(xt), lk_dtype_name(ot), (long long)R, (long long)D, layout);
    free(res0), free(o0.bytes), free(s0.bytes), free(r0.bytes), free(oref.bytes), free(sref.bytes), free(rref.bytes);
    tu_free(&x), tu_free(&out), tu_free(&res), tu_free(&w), tu_free(&sc);
}

static void test_norm_grid(void) {
    static const int64_t DS[] = {1, 3, 7, 16, 33, 130, 4097};
    for (int k = 0; k < 4; k++)
        for (int xi = 0; xi < 3; xi++)
            for (int oi = 0; oi < 2; oi++)
                for (int di = 0; di < 7; di++)
                    for (int layout = 0; layout < 3; layout++) {
                        int64_t D = DS[di], R = D > 1000 ? 2 : 1 + (di + layout) % 5;
                        lk_dtype xt = TU_FLOAT_DTYPES[xi], rt = TU_FLOAT_DTYPES[(xi + di) % 3];
                        lk_dtype wt = TU_FLOAT_DTYPES[(xi + layout) % 3];
                        norm_case(k, xt, rt, wt, FP8[oi], R, D, layout, di == 2, 0);
                    }
    for (int oi = 0; oi < 2; oi++) {
        norm_case(N_TOKEN, LK_BF16, LK_BF16, LK_BF16, FP8[oi], 4, 64, 0, 0, 0.5f);
        norm_case(N_TOKEN_RES, LK_F16, LK_F32, LK_F32, FP8[oi], 3, 72, 1, 0, 0.25f);
    }
    /* the int8 out of the per-token form (vLLM's torch.int8 out) */
    for (int k = N_TOKEN; k <= N_TOKEN_RES; k++)
        for (int xi = 0; xi < 3; xi++)
            for (int di = 0; di < 7; di++)
                for (int layout = 0; layout < 3; layout++) {
                    int64_t D = DS[di], R = D > 1000 ? 2 : 1 + (di + layout) % 5;
                    lk_dtype xt = TU_FLOAT_DTYPES[xi], rt = TU_FLOAT_DTYPES[(xi + di) % 3];
                    lk_dtype wt = TU_FLOAT_DTYPES[(xi + layout) % 3];
                    norm_case(k, xt, rt, wt, LK_I8, R, D, layout, di == 2, 0);
                }
    norm_case(N_TOKEN, LK_BF16, LK_BF16, LK_BF16, LK_I8, 4, 64, 0, 0, 0.5f);
    norm_case(N_TOKEN_RES, LK_F16, LK_F32, LK_F32, LK_I8, 3, 72, 1, 0, 0.25f);
}

/* the f32 -> int8 converter of the int8 out: nearest, ties to even, saturated, NaN 0 */
static void test_i8_convert(void) {
    static const float V[] = {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 0.49999997f, 126.5f, 127.49f, 127.5f, 1e9f,
                              -127.5f, -128.5f, -1e9f, INFINITY, -INFINITY, NAN, -0.0f, 3.7f, -3.7f};
    static const int W[] = {0, 2, 2, 0, -2, -2, 0, 126, 127, 127, 127, -128, -128, -128, 127, -128, 0, 0, 4, -4};
    int ok = 1;
    for (size_t i = 0; i < sizeof V / sizeof V[0]; i++) ok &= lk_q_i8(V[i]) == W[i];
    tu_check(ok, "f32 -> i8: ties to even (0.5 -> 0, 1.5 -> 2, 2.5 -> 2), saturation to [-128, 127] (inf too), NaN -> 0");
}

/* ---------------------------------------------------------------- merge with an fp8 out */

static void merge_case(lk_dtype st, lk_dtype ot, int64_t T, int64_t H, int64_t D, int pad, int empties) {
    int64_t s3[3] = {T, H, D};
    tu_buf out = tu_alloc(ot, 3, s3, pad), a = tu_alloc(st, 3, s3, pad), b = tu_alloc(LK_F32, 3, s3, 0);
    tu_buf la = tu_alloc(LK_F32, 2, s3, pad), lb = tu_alloc(LK_F32, 2, s3, 0), lo = tu_alloc(LK_F32, 2, s3, 1);
    tu_fill_uniform(&a, -3, 3), tu_fill_uniform(&b, -3, 3);
    tu_fill_uniform(&la, -4, 4), tu_fill_uniform(&lb, -4, 4);
    if (empties && T * H >= 3) {
        tu_set(&la, 0, -INFINITY);
        tu_set(&lb, 1, INFINITY);
        tu_set(&la, 2, -INFINITY), tu_set(&lb, 2, -INFINITY);
    }
    float scv = 0.02f;
    lk_tensor sc = one_scale(&scv);
    tu_snapshot(&out);
    tu_saved o0 = tu_save(&out), l0 = tu_save(&lo), oref = {0}, lref = {0};
    int okall = 1, f64 = 1;
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        tu_restore(&out, &o0), tu_restore(&lo, &l0);
        lk_status s = lk_merge_attn_states_scaled(&out.t, &lo.t, &a.t, &la.t, &b.t, &lb.t, &sc);
        if (!tu_check(s == LK_OK, "%s merge_scaled: %s", lk_isa_name(isas[ii]), lk_last_error())) continue;
        if (ii > 0) {
            okall &= tu_same(&out, &oref) && tu_same(&lo, &lref);
            continue;
        }
        oref = tu_save(&out), lref = tu_save(&lo);
        f64 &= tu_outside_intact(&out);
        for (int64_t r = 0; r < T * H; r++) {
            double ea = tu_get(&la, r), eb = tu_get(&lb, r);
            double wa = isinf(ea) ? 0 : 1, wb = isinf(eb) ? 0 : 1, m = -INFINITY;
            if (wa) m = ea;
            if (wb && eb > m) m = eb;
            if (wa) wa = exp(ea - m);
            if (wb) wb = exp(eb - m);
            for (int64_t d = 0; d < D; d++) {
                double y = wa + wb > 0 ? (wa * tu_get(&a, r * D + d) + wb * tu_get(&b, r * D + d)) / (wa + wb) : 0;
                f64 &= fp8_close(ot, y / scv, (float)tu_get(&out, r * D + d), 1e-5);
            }
        }
    }
    tu_check(f64, "merge_scaled %s -> %s T=%lld H=%lld D=%lld pad=%d%s: ref within half an fp8 step of float64",
             lk_dtype_name(st), lk_dtype_name(ot), (long long)T, (long long)H, (long long)D, pad,
             empties ? " empty states" : "");
    tu_check(okall, "merge_scaled %s -> %s T=%lld H=%lld D=%lld: every ISA bit-identical to ref", lk_dtype_name(st),
             lk_dtype_name(ot), (long long)T, (long long)H, (long long)D);
    free(o0.bytes), free(l0.bytes), free(oref.bytes), free(lref.bytes);
    tu_free(&out), tu_free(&a), tu_free(&b), tu_free(&la), tu_free(&lb), tu_free(&lo);
}

static void test_merge_grid(void) {
    static const int64_t DS[] = {1, 7, 33, 128, 300};
    for (int si = 0; si < 3; si++)
        for (int oi = 0; oi < 2; oi++)
            for (int di = 0; di < 5; di++) merge_case(TU_FLOAT_DTYPES[si], FP8[oi], 1 + di % 3, 2 + si, DS[di], di & 1, di > 1);
}

/* ---------------------------------------------------------------- threads, empty, errors */

static void test_threads(void) {
    int64_t R = 64, D = 4096;
    tu_buf x = tu_alloc(LK_BF16, 2, (int64_t[]){R, D}, 0), res = tu_alloc(LK_BF16, 2, (int64_t[]){R, D}, 0);
    tu_buf out = tu_alloc(LK_F8E4M3, 2, (int64_t[]){R, D}, 0), w = tu_alloc(LK_BF16, 1, &D, 0);
    tu_buf sc = tu_alloc(LK_F32, 1, &R, 0);
    tu_fill_uniform(&x, -3, 3), tu_fill_uniform(&res, -3, 3), tu_fill_uniform(&w, -1, 1);
    tu_saved r0 = tu_save(&res);
    tu_buf o8 = tu_alloc(LK_I8, 2, (int64_t[]){R, D}, 0);
    for (int op = 0; op < 5; op++) {
        tu_saved first[3] = {{0}};
        int ok = 1;
        for (int th = 1; th <= 4; th++) {
            lk_set_num_threads(th);
            tu_restore(&res, &r0);
            /* garbage in the outputs: a run that skips a write cannot pass on the last one's */
            tu_fill_uniform(&out, -1, 1), tu_fill_uniform(&o8, -1, 1);
            if (op >= 1 && op <= 3) tu_fill_uniform(&sc, -1, 1); /* the ops that write sc */
            float s1 = 0.01f;
            lk_tensor one = one_scale(&s1);
            lk_status s = op == 0 ? lk_dynamic_scaled_fp8_quant(&out.t, &x.t, &one)
                        : op == 1 ? lk_dynamic_per_token_scaled_fp8_quant(&out.t, &x.t, &sc.t, NULL)
                        : op == 2 ? lk_rms_norm_dynamic_per_token_quant(&out.t, &x.t, &w.t, &sc.t, 1e-6f, NULL, &res.t)
                        : op == 3 ? lk_rms_norm_dynamic_per_token_quant(&o8.t, &x.t, &w.t, &sc.t, 1e-6f, NULL, &res.t)
                                  : lk_fused_add_rms_norm_static_fp8_quant(&out.t, &x.t, &res.t, &w.t, &one, 1e-6f);
            tu_buf *o = op == 3 ? &o8 : &out;
            ok &= s == LK_OK;
            if (th == 1) first[0] = tu_save(o), first[1] = tu_save(&sc), first[2] = tu_save(&res);
            else ok &= tu_same(o, &first[0]) && tu_same(&sc, &first[1]) && tu_same(&res, &first[2]);
        }
        lk_set_num_threads(0);
        tu_check(ok, "fp8 activation op %d: 1-4 threads bitwise identical (out, scales, residual)", op);
        for (int k = 0; k < 3; k++) free(first[k].bytes);
    }
    free(r0.bytes);
    tu_free(&x), tu_free(&res), tu_free(&out), tu_free(&w), tu_free(&sc), tu_free(&o8);
}

static void test_empty(void) {
    float s = 1.0f, sc[2] = {-5, -5}, dummy = 7;
    uint8_t q[4] = {9, 9, 9, 9};
    lk_tensor x0 = lk_tensor_make(&dummy, LK_F32, 2, (int64_t[]){0, 8}), o0 = lk_tensor_make(q, LK_F8E4M3, 2, (int64_t[]){0, 8});
    lk_tensor one = one_scale(&s), s0 = lk_tensor_make(sc, LK_F32, 1, (int64_t[]){0});
    int ok = lk_static_scaled_fp8_quant(&o0, &x0, &one) == LK_OK && lk_dynamic_per_token_scaled_fp8_quant(&o0, &x0, &s0, NULL) == LK_OK &&
             lk_rms_norm_dynamic_per_token_quant(&o0, &x0, NULL, &s0, 1e-6f, NULL, NULL) == LK_OK &&
             lk_fused_add_rms_norm_static_fp8_quant(&o0, &x0, &x0, NULL, &one, 1e-6f) == LK_OK && q[0] == 9;
    tu_check(ok, "fp8 activations: 0 rows is valid and writes nothing");
    ok = lk_dynamic_scaled_fp8_quant(&o0, &x0, &one) == LK_OK && s == 1.0f / (448.0f * 512.0f);
    tu_check(ok, "dynamic per-tensor quant of an empty input writes min_scale");
    lk_tensor x2 = lk_tensor_make(&dummy, LK_F32, 2, (int64_t[]){2, 0}), o2 = lk_tensor_make(q, LK_F8E5M2, 2, (int64_t[]){2, 0});
    lk_tensor s2 = lk_tensor_make(sc, LK_F32, 1, (int64_t[]){2});
    ok = lk_dynamic_per_token_scaled_fp8_quant(&o2, &x2, &s2, NULL) == LK_OK && sc[0] == 1.0f / (57344.0f * 512.0f) &&
         sc[1] == sc[0];
    sc[0] = sc[1] = -5;
    ok &= lk_rms_norm_dynamic_per_token_quant(&o2, &x2, NULL, &s2, 1e-6f, NULL, NULL) == LK_OK && sc[0] == sc[1] &&
          sc[0] == 1.0f / (57344.0f * 512.0f);
    sc[0] = sc[1] = -5;
    lk_tensor o28 = lk_tensor_make(q, LK_I8, 2, (int64_t[]){2, 0});
    ok &= lk_rms_norm_dynamic_per_token_quant(&o28, &x2, NULL, &s2, 1e-6f, NULL, NULL) == LK_OK && sc[0] == sc[1] &&
          sc[0] == FLT_EPSILON && q[0] == 9;
    tu_check(ok, "per-token quant of rows with D = 0: every row's scale is min_scale (i8: FLT_EPSILON), nothing else "
             "written");
}

/* per-token scales of a 3-D input: [rows], [rows, 1] (vLLM's [numel / D, 1]) and the
 * leading dims and 1 give the same bits (quantizer and norm) */
static void test_scale_shapes(void) {
    enum { A = 2, B = 3, D = 24 };
    float x[A][B][D], sc[3][A * B];
    uint8_t q[3][A][B][D];
    for (int a = 0; a < A; a++)
        for (int b = 0; b < B; b++)
            for (int i = 0; i < D; i++) x[a][b][i] = (float)((a * 5 + b * 7 + i * 3) % 13) - 6.0f;
    lk_tensor tx = lk_tensor_make(x, LK_F32, 3, (int64_t[]){A, B, D});
    static const int NDS[3] = {1, 2, 3};
    static const int64_t SH[3][3] = {{A * B}, {A * B, 1}, {A, B, 1}};
    int ok = 1;
    for (int op = 0; op < 2; op++) {
        for (int f = 0; f < 3; f++) {
            lk_tensor tq = lk_tensor_make(q[f], LK_F8E4M3, 3, (int64_t[]){A, B, D});
            lk_tensor ts = lk_tensor_make(sc[f], LK_F32, NDS[f], SH[f]);
            ok &= (op ? lk_rms_norm_dynamic_per_token_quant(&tq, &tx, NULL, &ts, 1e-6f, NULL, NULL)
                      : lk_dynamic_per_token_scaled_fp8_quant(&tq, &tx, &ts, NULL)) == LK_OK;
        }
        ok &= !memcmp(q[0], q[1], sizeof q[0]) && !memcmp(q[0], q[2], sizeof q[0]) &&
              !memcmp(sc[0], sc[1], sizeof sc[0]) && !memcmp(sc[0], sc[2], sizeof sc[0]);
    }
    tu_check(ok, "per-token fp8 quant of a 3-D input: scales [rows], [rows, 1] and [A, B, 1] give the same bits");
}

/* every buffer intact and the status / message as expected */
static void expect(lk_status got, lk_status want, const char *name, tu_buf **bufs, int nb, const char *what) {
    int intact = 1;
    for (int k = 0; k < nb; k++) intact &= tu_intact(bufs[k]);
    const char *msg = lk_last_error();
    tu_check(got == want && strstr(msg, name) != NULL && intact, "%s: %s (want %s naming %s) \"%s\"%s", what,
             lk_status_str(got), lk_status_str(want), name, msg, intact ? "" : ", buffers changed");
}

static void test_errors(void) {
    int64_t R = 3, D = 20;
    tu_buf x = tu_alloc(LK_F16, 2, (int64_t[]){R, D}, 0), out = tu_alloc(LK_F8E4M3, 2, (int64_t[]){R, D}, 0);
    tu_buf res = tu_alloc(LK_F16, 2, (int64_t[]){R, D}, 0), w = tu_alloc(LK_F32, 1, &D, 0);
    tu_buf sc = tu_alloc(LK_F32, 1, (int64_t[]){1}, 0), scs = tu_alloc(LK_F32, 2, (int64_t[]){R, 1}, 0);
    tu_buf bfo = tu_alloc(LK_BF16, 2, (int64_t[]){R, D}, 0), sc16 = tu_alloc(LK_F16, 1, (int64_t[]){1}, 0);
    tu_buf ub = tu_alloc(LK_F32, 1, (int64_t[]){1}, 0), bad3 = tu_alloc(LK_F32, 1, (int64_t[]){R + 1}, 0);
    tu_fill_uniform(&x, -1, 1), tu_fill_uniform(&res, -1, 1), tu_fill_uniform(&w, -1, 1);
    tu_set(&ub, 0, 2.0);
    tu_buf *all[] = {&x, &out, &res, &w, &sc, &scs, &bfo, &sc16, &ub, &bad3};
    int nb = 10;
    static const float BAD[4] = {0.0f, -1.0f, NAN, INFINITY};
    for (int k = 0; k < 4; k++) {
        tu_set(&sc, 0, BAD[k]);
        tu_set(&ub, 0, BAD[k]);
        for (int b = 0; b < nb; b++) tu_snapshot(all[b]);
        char what[96];
        snprintf(what, sizeof what, "scale %g", (double)BAD[k]);
        expect(lk_static_scaled_fp8_quant(&out.t, &x.t, &sc.t), LK_ERR_VALUE, "scale", all, nb, what);
        expect(lk_rms_norm_static_fp8_quant(&out.t, &x.t, &w.t, &sc.t, 1e-6f), LK_ERR_VALUE, "scale", all, nb, what);
        expect(lk_fused_add_rms_norm_static_fp8_quant(&out.t, &x.t, &res.t, &w.t, &sc.t, 1e-6f), LK_ERR_VALUE, "scale",
               all, nb, what);
        expect(lk_dynamic_per_token_scaled_fp8_quant(&out.t, &x.t, &scs.t, &ub.t), LK_ERR_VALUE, "scale_ub", all, nb, what);
        expect(lk_rms_norm_dynamic_per_token_quant(&out.t, &x.t, &w.t, &scs.t, 1e-6f, &ub.t, &res.t), LK_ERR_VALUE,
               "scale_ub", all, nb, what);
    }
    tu_set(&sc, 0, 0.5);
    tu_set(&ub, 0, 2.0);
    for (int b = 0; b < nb; b++) tu_snapshot(all[b]);
    expect(lk_static_scaled_fp8_quant(&bfo.t, &x.t, &sc.t), LK_ERR_DTYPE, "out", all, nb, "bf16 out");
    expect(lk_static_scaled_fp8_quant(&out.t, &x.t, &sc16.t), LK_ERR_DTYPE, "scale", all, nb, "f16 scale");
    lk_tensor o8 = out.t; /* the int8 out: the per-token norm's only */
    o8.dtype = LK_I8;
    expect(lk_static_scaled_fp8_quant(&o8, &x.t, &sc.t), LK_ERR_DTYPE, "out", all, nb, "i8 out (static quant)");
    expect(lk_dynamic_per_token_scaled_fp8_quant(&o8, &x.t, &scs.t, NULL), LK_ERR_DTYPE, "out", all, nb,
           "i8 out (per-token quant)");
    expect(lk_rms_norm_static_fp8_quant(&o8, &x.t, &w.t, &sc.t, 1e-6f), LK_ERR_DTYPE, "out", all, nb,
           "i8 out (static norm quant)");
    expect(lk_fused_add_rms_norm_static_fp8_quant(&o8, &x.t, &res.t, &w.t, &sc.t, 1e-6f), LK_ERR_DTYPE, "out", all,
           nb, "i8 out (fused static norm quant)");
    lk_tensor x8 = x.t;
    x8.dtype = LK_I8;
    expect(lk_rms_norm_dynamic_per_token_quant(&o8, &x8, &w.t, &scs.t, 1e-6f, NULL, NULL), LK_ERR_DTYPE, "input", all,
           nb, "i8 input");
    expect(lk_rms_norm_dynamic_per_token_quant(&o8, &x.t, &w.t, &bad3.t, 1e-6f, NULL, NULL), LK_ERR_SHAPE, "scales",
           all, nb, "i8 out, scales [R + 1]");
    expect(lk_static_scaled_fp8_quant(&out.t, &out.t, &sc.t), LK_ERR_DTYPE, "input", all, nb, "fp8 input");
    expect(lk_dynamic_scaled_fp8_quant(&out.t, &x.t, &scs.t), LK_ERR_SHAPE, "scale", all, nb, "[R, 1] per-tensor scale");
    expect(lk_dynamic_per_token_scaled_fp8_quant(&out.t, &x.t, &bad3.t, NULL), LK_ERR_SHAPE, "scales", all, nb,
           "scales [R + 1]");
    expect(lk_rms_norm_dynamic_per_token_quant(&out.t, &x.t, &w.t, &bad3.t, 1e-6f, NULL, NULL), LK_ERR_SHAPE, "scales",
           all, nb, "norm scales [R + 1]");
    expect(lk_rms_norm_static_fp8_quant(&out.t, &x.t, &w.t, &sc.t, -1.0f), LK_ERR_VALUE, "epsilon", all, nb, "eps < 0");
    expect(lk_rms_norm_static_fp8_quant(&out.t, &x.t, &bad3.t, &sc.t, 1e-6f), LK_ERR_SHAPE, "weight", all, nb,
           "weight [R + 1]");
    lk_tensor xr = x.t; /* residual aliasing the input */
    expect(lk_fused_add_rms_norm_static_fp8_quant(&out.t, &x.t, &xr, &w.t, &sc.t, 1e-6f), LK_ERR_ALIAS, "residual", all,
           nb, "residual = input");
    lk_tensor s0 = scs.t;
    s0.stride[0] = 0;
    expect(lk_dynamic_per_token_scaled_fp8_quant(&out.t, &x.t, &s0, NULL), LK_ERR_ALIAS, "scales", all, nb,
           "scales with a zero stride");
    lk_tensor sx = lk_tensor_make(x.t.data, LK_F32, 1, (int64_t[]){R}); /* scales over the input */
    expect(lk_dynamic_per_token_scaled_fp8_quant(&out.t, &x.t, &sx, NULL), LK_ERR_ALIAS, "scales", all, nb,
           "scales overlapping input");
    /* an input scale overlapping a written tensor (its value valid: 0.5) */
    const float half = 0.5f;
    memcpy(out.t.data, &half, sizeof half), memcpy(res.t.data, &half, sizeof half);
    for (int b = 0; b < nb; b++) tu_snapshot(all[b]);
    lk_tensor so = lk_tensor_make(out.t.data, LK_F32, 1, (int64_t[]){1});
    lk_tensor sr = lk_tensor_make(res.t.data, LK_F32, 0, NULL);
    expect(lk_static_scaled_fp8_quant(&out.t, &x.t, &so), LK_ERR_ALIAS, "scale", all, nb, "scale in out");
    expect(lk_dynamic_per_token_scaled_fp8_quant(&out.t, &x.t, &scs.t, &so), LK_ERR_ALIAS, "scale_ub", all, nb,
           "scale_ub in out");
    expect(lk_rms_norm_static_fp8_quant(&out.t, &x.t, &w.t, &so, 1e-6f), LK_ERR_ALIAS, "scale", all, nb,
           "norm scale in out");
    expect(lk_fused_add_rms_norm_static_fp8_quant(&out.t, &x.t, &res.t, &w.t, &sr, 1e-6f), LK_ERR_ALIAS,
           "residual and scale", all, nb, "norm scale in residual");
    expect(lk_rms_norm_dynamic_per_token_quant(&out.t, &x.t, &w.t, &scs.t, 1e-6f, &so, NULL), LK_ERR_ALIAS,
           "out and scale_ub", all, nb, "norm scale_ub in out");
    expect(lk_rms_norm_dynamic_per_token_quant(&out.t, &x.t, &w.t, &scs.t, 1e-6f, &sr, &res.t), LK_ERR_ALIAS,
           "residual and scale_ub", all, nb, "norm scale_ub in residual");
    expect(lk_static_scaled_fp8_quant(NULL, &x.t, &sc.t), LK_ERR_NULL, "out", all, nb, "NULL out");
    /* merge */
    int64_t s3[3] = {2, 2, 8};
    tu_buf mo = tu_alloc(LK_F8E5M2, 3, s3, 0), ma = tu_alloc(LK_F32, 3, s3, 0), ml = tu_alloc(LK_F32, 2, s3, 0);
    tu_buf mf = tu_alloc(LK_F16, 3, s3, 0);
    tu_fill_uniform(&ma, -1, 1), tu_fill_uniform(&ml, -1, 1);
    tu_buf *mall[] = {&mo, &ma, &ml, &mf, &sc};
    for (int k = 0; k < 4; k++) {
        tu_set(&sc, 0, BAD[k]);
        for (int b = 0; b < 5; b++) tu_snapshot(mall[b]);
        expect(lk_merge_attn_states_scaled(&mo.t, NULL, &ma.t, &ml.t, &ma.t, &ml.t, &sc.t), LK_ERR_VALUE, "output_scale",
               mall, 5, "merge output_scale bad");
    }
    tu_set(&sc, 0, 0.5);
    for (int b = 0; b < 5; b++) tu_snapshot(mall[b]);
    expect(lk_merge_attn_states_scaled(&mo.t, NULL, &ma.t, &ml.t, &ma.t, &ml.t, NULL), LK_ERR_NULL, "output_scale", mall,
           5, "merge fp8 out without output_scale");
    expect(lk_merge_attn_states_scaled(&mf.t, NULL, &ma.t, &ml.t, &ma.t, &ml.t, &sc.t), LK_ERR_DTYPE, "out", mall, 5,
           "merge f16 out with output_scale");
    expect(lk_merge_attn_states(&mo.t, NULL, &ma.t, &ml.t, &ma.t, &ml.t), LK_ERR_DTYPE, "out", mall, 5,
           "plain merge into an fp8 out");
    int ok = lk_merge_attn_states_scaled(&mf.t, NULL, &ma.t, &ml.t, &ma.t, &ml.t, NULL) == LK_OK;
    tu_check(ok, "merge_scaled without output_scale into a float out: the plain merge");
    for (int b = 0; b < nb; b++) tu_free(all[b]);
    tu_free(&mo), tu_free(&ma), tu_free(&ml), tu_free(&mf);
}

/* ---------------------------------------------------------------- per-token-group quant */

/* the smallest power of two >= v (v > 0 finite), by doubling / halving in float64 */
static double pow2_at_least(double v) {
    double p = 1.0;
    while (p < v) p *= 2;
    while (p / 2 >= v) p /= 2;
    return p;
}

/* the out dtypes of the per-token-group op: e4m3, e5m2, and i8 (vLLM's
 * per_token_group_quant_int8) */
static const lk_dtype GOUT[3] = {LK_F8E4M3, LK_F8E5M2, LK_I8};

/* the i8 code of x under scale s, by the contract's rule written out independently of
 * the library: one f32 division, NaN -> 0, clamped to [-128, 127], then toward zero
 * (truncf; an inf scale: finite -> 0, inf / inf = NaN -> 0) */
static double i8_trunc_f32(float x, float s) {
    volatile float q = x / s; /* one f32 division, not contracted or kept wider */
    if (isnan(q)) return 0;
    if (q > 127.0f) q = 127.0f;
    if (q < -128.0f) q = -128.0f;
    return (double)truncf(q);
}

/* q vs y = float64 value / scale: an integer in [-128, 127] no farther from zero than y
 * clamped (a rounded code is not: it moves past y for fractions >= 1/2) and less than 1
 * (plus the f32 division's 2^-23 |y|) toward zero from it; NaN -> 0 */
static int i8_trunc_close(double y, double q) {
    if (isnan(y)) return q == 0;
    double c = y > 127 ? 127 : y < -128 ? -128 : y, slack = fabs(c) * 0x1p-23;
    return q == rint(q) && q >= -128 && q <= 127 && fabs(q) <= fabs(c) + slack && fabs(q - c) < 1 + slack &&
           (q == 0 || (q < 0) == (c < 0));
}

/* input layouts of group_case: 0 contiguous, 1 padded strides, 2 input's last stride != 1
 * (stored transposed: the reference fallback), 3 contiguous input, out stored transposed
 * (the fallback through out), 4 3-D [2, 3, D] contiguous, 5 3-D padded.
 * scales forms: 0 [rows, ng] / [2, 3, ng] contiguous, 1 the same padded, 2 column-major
 * (vLLM's: the transposed view of a [ng, rows padded to a multiple of 4] buffer; 3-D:
 * flat [6, ng]), 3 (3-D only) flat [6, ng] padded */
enum { GX_LAYOUTS = 6, GS_FORMS = 4 };

static tu_buf group_scales(int64_t rows, int64_t ng, int three, int sl) {
    int64_t rp = (rows + 3) / 4 * 4;
    if (sl == 2) return tu_alloc_perm(LK_F32, 2, (int64_t[]){rows, ng}, (int[]){1, 0}, (int)(rp - rows));
    if (three && sl < 2) return tu_alloc(LK_F32, 3, (int64_t[]){2, 3, ng}, sl);
    return tu_alloc(LK_F32, 2, (int64_t[]){rows, ng}, sl != 0);
}

/* flat index of the first element of group k (row k / ng, group k % ng) */
static int64_t group_at(int64_t k, int64_t D, int64_t G) { return k / (D / G) * D + k % (D / G) * G; }

static void group_case(lk_dtype xt, lk_dtype ot, int64_t R, int64_t D, int64_t G, int xl, int sl, int ue8m0,
                       float eps, double amp, int specials) {
    int three = xl >= 4;
    int64_t rows = three ? 6 : R, ng = D / G;
    tu_buf x, out;
    if (three) {
        x = tu_alloc(xt, 3, (int64_t[]){2, 3, D}, xl == 5);
        out = tu_alloc(ot, 3, (int64_t[]){2, 3, D}, xl == 4);
    } else {
        x = tu_alloc_rows(xt, R, D, xl == 3 ? 0 : xl);
        out = tu_alloc_rows(ot, R, D, xl == 3 ? 2 : xl == 2 ? 1 : xl);
    }
    tu_buf sc = group_scales(rows, ng, three, sl);
    fill_x(&x, amp, 0);
    int64_t ngroups = rows * ng;
    if (specials) {
        /* a NaN; group 1 holds +inf, group 2 is all zero (+-0), group 3 all NaN, group 4 -inf
         * and a NaN; the last group's elements at +-amp / 3 (all but one): its absmax
         * element quantizes to the max code */
        tu_set(&x, 1, NAN);
        for (int64_t k = 1; k < 5 && k < ngroups; k++) {
            int64_t at = group_at(k, D, G);
            for (int64_t i = 0; i < G && (k == 2 || k == 3); i++) tu_set(&x, at + i, k == 3 ? NAN : i % 2 ? -0.0 : 0.0);
            if (k == 1) tu_set(&x, at + G / 2, INFINITY);
            if (k == 4) tu_set(&x, at + G - 1, -INFINITY), tu_set(&x, at, NAN);
        }
        if (ngroups > 5) {
            int64_t at = group_at(ngroups - 1, D, G);
            for (int64_t i = 0; i < G; i++) tu_set(&x, at + i, i % 3 ? amp / 3 : -amp / 3);
            tu_set(&x, at + G / 2, -amp);
        }
    }
    tu_snapshot(&out), tu_snapshot(&sc);
    tu_saved o0 = tu_save(&out), s0 = tu_save(&sc), oref = {0}, sref = {0};
    int okall = 1, f64 = 1, scales_ok = 1;
    float fm = (float)fmax8(ot);
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        tu_restore(&out, &o0), tu_restore(&sc, &s0);
        lk_status s = lk_per_token_group_fp8_quant(&out.t, &x.t, &sc.t, G, eps, ue8m0);
        if (!tu_check(s == LK_OK, "%s group quant: %s", lk_isa_name(isas[ii]), lk_last_error())) continue;
        if (ii > 0) {
            okall &= tu_same(&out, &oref) && tu_same(&sc, &sref);
            continue;
        }
        oref = tu_save(&out), sref = tu_save(&sc);
        f64 &= tu_outside_intact(&out) && tu_outside_intact(&sc);
        for (int64_t k = 0; k < ngroups; k++) {
            int64_t at = group_at(k, D, G), am = -1;
            double m = 0;
            for (int64_t i = 0; i < G; i++) {
                double v = fabs(tu_get(&x, at + i));
                if (v > m) m = v, am = at + i; /* NaN ignored */
            }
            /* the contract's f32 formula; absmax (a value of x, 0 or inf) is exact in f32 */
            float want = ((float)m > eps ? (float)m : eps) / fm, got = (float)tu_get(&sc, k);
            if (ue8m0 && !isinf(want)) {
                double p = pow2_at_least(want > 1e-10 ? want : 1e-10);
                int e;
                double mant = frexp(got, &e);
                scales_ok &= mant == 0.5 && got >= want && (want < 1e-10 ? got == ldexp(1.0, -33) : got < 2.0 * want);
                want = (float)p;
            }
            scales_ok &= got == want;
            for (int64_t i = 0; i < G; i++) {
                double v = tu_get(&x, at + i);
                if (ot == LK_I8) {
                    double q = tu_get(&out, at + i);
                    f64 &= q == i8_trunc_f32((float)v, got) && i8_trunc_close(v / got, q);
                } else
                    f64 &= fp8_close(ot, v / got, (float)tu_get(&out, at + i), 0);
            }
            /* without UE8M0 the absmax element lands on +-max (with UE8M0 it is at most max);
             * i8: +-127, or +-126 where the f32 division gives 127 (1 - 2^-24) rounded down
             * (the scale m / 127 rounded up), truncated */
            if (!ue8m0 && am >= 0 && (float)m > eps && !isinf(m))
                f64 &= ot == LK_I8 ? fabs(tu_get(&out, am)) >= 126 : fabs(tu_get(&out, am)) == fmax8(ot);
        }
    }
    tu_check(f64 && scales_ok, "group quant %s -> %s R=%lld D=%lld G=%lld layout=%d scales=%d%s eps=%g amp=%g%s: ref "
             "within half an fp8 step of float64 (absmax elements at the max code), scales as the f32 formula%s, "
             "padding intact", lk_dtype_name(xt), lk_dtype_name(ot), (long long)rows, (long long)D, (long long)G, xl,
             sl, ue8m0 ? " ue8m0" : "", (double)eps, amp, specials ? " specials" : "",
             ue8m0 ? " rounded up to a power of two (< 2 s, or 2^-33 when clamped)" : "");
    tu_check(okall, "group quant %s -> %s R=%lld D=%lld G=%lld layout=%d scales=%d%s: every ISA bit-identical to ref "
             "(whole allocations)", lk_dtype_name(xt), lk_dtype_name(ot), (long long)rows, (long long)D, (long long)G,
             xl, sl, ue8m0 ? " ue8m0" : "");
    free(o0.bytes), free(s0.bytes), free(oref.bytes), free(sref.bytes);
    tu_free(&x), tu_free(&out), tu_free(&sc);
}

static void test_group_grid(void) {
    static const int64_t GS[] = {1, 3, 7, 16, 128};
    for (int xi = 0; xi < 3; xi++)
        for (int oi = 0; oi < 3; oi++)
            for (int gi = 0; gi < 5; gi++)
                for (int k = 0; k < 2; k++)
                    for (int xl = 0; xl < GX_LAYOUTS; xl++)
                        for (int sl = 0; sl < (xl >= 4 ? 4 : 3); sl++) {
                            int64_t G = GS[gi], D = k ? 3 * G : G, R = 1 + (gi + k + xl + sl) % 5;
                            int ue = (xl + sl + k + oi) & 1;
                            group_case(TU_FLOAT_DTYPES[xi], GOUT[oi], R, D, G, xl, sl, ue, 1e-10f, 3.0, 0);
                        }
    /* odd rows: one group of 33 (G = D), 11 of 3, 3 of 17 (around the vector widths), 17
     * of 241 (D 4097: long groups with a tail) */
    static const int64_t ODD[4][3] = {{5, 33, 33}, {2, 33, 3}, {3, 51, 17}, {2, 4097, 241}};
    for (int xi = 0; xi < 3; xi++)
        for (int oi = 0; oi < 3; oi++)
            for (int c = 0; c < 4; c++)
                for (int ue = 0; ue < 2; ue++)
                    group_case(TU_FLOAT_DTYPES[xi], GOUT[oi], ODD[c][0], ODD[c][1], ODD[c][2],
                               (c + ue + xi) % GX_LAYOUTS, (c + oi) % 3, ue, 1e-10f, 3.0, 0);
    /* DeepSeek-V3's activations: D 7168, groups of 128 (e4m3; e5m2 and the block-int8
     * checkpoints' i8 once each) */
    for (int xi = 0; xi < 3; xi++)
        for (int sl = 0; sl < 3; sl++)
            for (int ue = 0; ue < 2; ue++)
                if (!tu_emulated() || (xi == 2 && sl == 2))
                    group_case(TU_FLOAT_DTYPES[xi], LK_F8E4M3, 2 + sl, 7168, 128, sl == 1, sl, ue, 1e-10f, 3.0, 0);
    group_case(LK_BF16, LK_F8E5M2, 3, 7168, 128, 0, 2, 1, 1e-10f, 3.0, 0);
    for (int sl = 0; sl < 3; sl++)
        group_case(TU_FLOAT_DTYPES[2 - sl], LK_I8, 2 + sl, 7168, 128, sl == 1, sl, sl == 1, 1e-10f, 3.0, 0);
    /* a large eps dominating some groups (amp 1.5) or all of them (amp 0.5: s = eps / fp8_max) */
    for (int oi = 0; oi < 3; oi++)
        for (int ue = 0; ue < 2; ue++) {
            group_case(LK_F32, GOUT[oi], 3, 21, 7, 0, 2, ue, 1.0f, 1.5, 0);
            group_case(LK_BF16, GOUT[oi], 4, 48, 16, 1, 1, ue, 1.0f, 0.5, 0);
            group_case(LK_F16, GOUT[oi], 5, 8, 1, 4, 3, ue, 1.0f, 1.5, 0);
        }
    /* specials; eps at its minimum fp8_max * FLT_MIN (an all-zero group: scale FLT_MIN) */
    for (int xi = 0; xi < 3; xi++)
        for (int oi = 0; oi < 3; oi++)
            for (int ue = 0; ue < 2; ue++) {
                lk_dtype xt = TU_FLOAT_DTYPES[xi], ot = GOUT[oi];
                float lo = (float)fmax8(ot) * FLT_MIN;
                group_case(xt, ot, 2, 48, 16, 0, 0, ue, 1e-10f, 3.0, 1);
                group_case(xt, ot, 3, 21, 7, 1, 2, ue, lo, 3.0, 1);
                group_case(xt, ot, 2, 6, 1, 4, 2, ue, 1e-10f, 3.0, 1);
                group_case(xt, ot, 4, 256, 128, 2, 1, ue, lo, 3.0, 1);
            }
}

/* the group rules by their codes, per ISA: NaN ignored by the absmax and kept; an inf
 * makes the group's scale inf (finite -> signed 0, the inf -> NaN); an all-zero group gets
 * eps / fp8_max and zero codes; UE8M0 rounds up to a power of two, a tiny scale to 2^-33 */
static void test_group_specials(void) {
    enum { G = 20, NG = 3 };
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        const char *isa = lk_isa_name(isas[ii]);
        for (int oi = 0; oi < 2; oi++) {
            lk_dtype ot = FP8[oi];
            float fm = (float)fmax8(ot), x[G * NG], sc[NG];
            uint8_t q[G * NG], mx = ot == LK_F8E4M3 ? 0x7e : 0x7b;
            for (int i = 0; i < G * NG; i++) x[i] = (float)(i % 5) - 2.0f; /* -2 .. 2 */
            x[3] = NAN, x[4] = -NAN, x[7] = 3.0f, x[8] = -3.0f;         /* group 0: absmax 3 */
            x[G + 5] = INFINITY, x[G + 6] = -0.0f;                       /* group 1: inf */
            for (int i = 2 * G; i < 3 * G; i++) x[i] = i % 2 ? -0.0f : 0.0f; /* group 2: zero */
            lk_tensor tx = lk_tensor_make(x, LK_F32, 2, (int64_t[]){1, G * NG});
            lk_tensor tq = lk_tensor_make(q, ot, 2, (int64_t[]){1, G * NG});
            lk_tensor ts = lk_tensor_make(sc, LK_F32, 2, (int64_t[]){1, NG});
            lk_status s = lk_per_token_group_fp8_quant(&tq, &tx, &ts, G, 1e-10f, 0);
            int ok = s == LK_OK && sc[0] == 3.0f / fm && q[3] == 0x7f && q[4] == 0xff && q[7] == mx &&
                     q[8] == (0x80 | mx);
            tu_check(ok, "%s group quant -> %s: NaN ignored by the absmax and kept with its sign, the absmax at the "
                     "max code", isa, lk_dtype_name(ot));
            ok = isinf(sc[1]) && sc[1] > 0 && (q[G + 5] & 0x7f) == 0x7f && q[G + 6] == 0x80;
            for (int i = G; i < 2 * G; i++)
                if (i != G + 5) ok &= q[i] == (x[i] < 0 || signbit(x[i]) ? 0x80 : 0x00);
            tu_check(ok, "%s group quant -> %s: an inf makes its group's scale inf (finite -> signed 0, the inf -> "
                     "NaN)", isa, lk_dtype_name(ot));
            ok = sc[2] == 1e-10f / fm;
            for (int i = 2 * G; i < 3 * G; i++) ok &= q[i] == (i % 2 ? 0x80 : 0x00);
            tu_check(ok, "%s group quant -> %s: an all-zero group gets eps / fp8_max, codes +-0", isa,
                     lk_dtype_name(ot));
            s = lk_per_token_group_fp8_quant(&tq, &tx, &ts, G, 1e-10f, 1);
            ok = s == LK_OK && sc[0] == pow2_at_least(3.0 / fm) && isinf(sc[1]) && sc[2] == ldexpf(1.0f, -33);
            for (int i = 2 * G; i < 3 * G; i++) ok &= q[i] == (i % 2 ? 0x80 : 0x00);
            tu_check(ok, "%s group quant -> %s, ue8m0: 3 / fp8_max rounded up to a power of two, inf kept, a zero "
                     "group's eps / fp8_max clamped to 1e-10 then 2^-33", isa, lk_dtype_name(ot));
        }
    }
}

/* lk_q_i8_trunc, the converter of the i8 group out (the reference's; the SIMD rows must
 * give its codes): clamped to [-128, 127], then toward zero; NaN -> 0. Through the op the
 * clamp is out of reach (|x / s| <= 127 (1 + 2^-23) for s >= absmax / 127), so its
 * saturation is checked here */
static void test_i8_trunc_convert(void) {
    static const float V[] = {2.7f, -2.7f, -0.5f, 0.5f, 0.99999994f, -0.99999994f, 126.99999f, 127.0f, 127.5f,
                              127.99999f, 128.0f, 1e9f, INFINITY, -127.0f, -127.5f, -127.99999f, -128.0f, -128.5f,
                              -129.0f, -1e9f, -INFINITY, NAN, -NAN, -0.0f, 1.5f, 2.5f, -1.5f, -2.5f, FLT_TRUE_MIN,
                              -FLT_MIN, 64.99999f, -100.75f};
    static const int W[] = {2,    -2,   0,    0,    0,    0, 126, 127, 127, 127, 127, 127, 127, -127, -127, -127,
                            -128, -128, -128, -128, -128, 0, 0,   0,   1,   2,   -1,  -2,  0,   0,    64,   -100};
    int ok = sizeof V / sizeof V[0] == sizeof W / sizeof W[0];
    for (size_t i = 0; i < sizeof V / sizeof V[0]; i++) {
        ok &= lk_q_i8_trunc(V[i]) == W[i];
        if (!isnan(V[i])) ok &= lk_q_i8_trunc(V[i]) == (int)i8_trunc_f32(V[i], 1.0f);
    }
    tu_check(ok, "f32 -> i8 toward zero (2.7 -> 2, -2.7 -> -2, -0.5 -> 0, 126.99999 -> 126), saturated to [-128, "
             "127] (127.5, 128, inf -> 127; -128, -128.5, -inf -> -128; -127.5 -> -127), NaN -> 0");
}

/* the i8 out's rules by their codes, per ISA (a [2, 80] f32 input, groups of 20: a full
 * vector and a tail on either width, both rows alike):
 *   group 0: absmax 127, so s = 127 / 127 = 1 (ue8m0 too): 2.7 -> 2, -2.7 -> -2, -0.5 ->
 *     0, 0.99999994 -> 0, +-127 -> +-127, 126.99999 -> 126, 3.5 -> 3, -1.5 -> -1, NaN -> 0
 *     (rounding would give 3, -3, 1, 127, 4, -2 there)
 *   group 1: an inf and a -inf: scale inf, every code 0 (finite / inf = 0, inf / inf = NaN)
 *   group 2: all +-0: scale eps / 127 (ue8m0: 1e-10 -> 2^-33), codes 0
 *   group 3: absmax 200: s = 200 / 127 (codes: the f32 division, truncated), ue8m0 s = 2
 *     (7 -> 3, 5 -> 2, 3 -> 1, -199 -> -99, 11 -> 5: rounding gives 4, 2, 2, -100, 6) */
static void test_group_specials_i8(void) {
    enum { G = 20, NG = 4, R = 2, D = G * NG };
    static const float G0[G] = {2.7f, -2.7f, -0.5f, 0.5f, 0.99999994f, -0.99999994f, 127.0f, -127.0f, 126.99999f,
                                -126.99999f, NAN, -NAN, -0.0f, 1.0f, -1.0f, 3.5f, -3.5f, 2.5f, -1.5f, 64.5f};
    static const int W0[G] = {2, -2, 0, 0, 0, 0, 127, -127, 126, -126, 0, 0, 0, 1, -1, 3, -3, 2, -1, 64};
    static const float G3[G] = {200.0f, 7.0f, -7.0f, 5.0f, 3.0f, -3.0f, 1.0f, -1.0f, 0.75f, -199.0f,
                                13.0f,  9.0f, 11.0f, -11.0f, 101.0f, -101.0f, 2.5f, 150.0f, -150.0f, NAN};
    static const int W3U[G] = {100, 3, -3, 2, 1, -1, 0, 0, 0, -99, 6, 4, 5, -5, 50, -50, 1, 75, -75, 0};
    float x[R][D];
    for (int r = 0; r < R; r++)
        for (int i = 0; i < G; i++) {
            x[r][i] = G0[i];
            x[r][G + i] = i == 5 ? INFINITY : i == 9 ? -INFINITY : i == 11 ? NAN : (float)(i % 7) - 3.3f;
            x[r][2 * G + i] = i % 2 ? -0.0f : 0.0f;
            x[r][3 * G + i] = G3[i];
        }
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        const char *isa = lk_isa_name(isas[ii]);
        for (int ue = 0; ue < 2; ue++) {
            int8_t q[R][D];
            float sc[R][NG];
            memset(q, 0x5a, sizeof q), memset(sc, 0xff, sizeof sc);
            lk_tensor tx = lk_tensor_make(x, LK_F32, 2, (int64_t[]){R, D});
            lk_tensor tq = lk_tensor_make(q, LK_I8, 2, (int64_t[]){R, D});
            lk_tensor ts = lk_tensor_make(sc, LK_F32, 2, (int64_t[]){R, NG});
            int ok0 = lk_per_token_group_fp8_quant(&tq, &tx, &ts, G, 1e-10f, ue) == LK_OK, ok1 = ok0, ok2 = ok0,
                ok3 = ok0;
            for (int r = 0; r < R; r++) {
                ok0 &= sc[r][0] == 1.0f;
                ok1 &= isinf(sc[r][1]) && sc[r][1] > 0;
                ok2 &= sc[r][2] == (ue ? ldexpf(1.0f, -33) : 1e-10f / 127.0f);
                ok3 &= sc[r][3] == (ue ? 2.0f : 200.0f / 127.0f);
                for (int i = 0; i < G; i++) {
                    ok0 &= q[r][i] == W0[i];
                    ok1 &= q[r][G + i] == 0;
                    ok2 &= q[r][2 * G + i] == 0;
                    ok3 &= q[r][3 * G + i] == (ue ? W3U[i] : (int)i8_trunc_f32(G3[i], 200.0f / 127.0f));
                }
            }
            tu_check(ok0, "%s group quant -> i8%s: absmax 127 gives scale 1; codes truncated toward zero (2.7 -> 2, "
                     "-2.7 -> -2, -0.5 -> 0, 126.99999 -> 126, 3.5 -> 3, -1.5 -> -1), +-127 kept, NaN -> 0 and "
                     "ignored by the absmax", isa, ue ? " ue8m0" : "");
            tu_check(ok1, "%s group quant -> i8%s: an inf makes the group's scale inf, every code 0 (finite -> 0, "
                     "+-inf -> NaN -> 0)", isa, ue ? " ue8m0" : "");
            tu_check(ok2, "%s group quant -> i8%s: an all-zero group gets eps / 127 (ue8m0: 2^-33), codes 0", isa,
                     ue ? " ue8m0" : "");
            tu_check(ok3, "%s group quant -> i8%s: absmax 200, scale %s, codes x / scale truncated (7 -> 3, 11 -> 5, "
                     "-199 -> -99 with scale 2)", isa, ue ? " ue8m0" : "", ue ? "2" : "200 / 127");
        }
    }
}

/* 1-4 threads bitwise identical (row-major and column-major scales, UE8M0 on and off), on
 * every ISA; 64 rows of 4096 (groups of 128) and 7 rows of 7168 */
static void test_group_threads(void) {
    for (int sh = 0; sh < 4; sh++) {
        int64_t R = sh & 1 ? 7 : 64, D = sh & 1 ? 7168 : 4096, G = 128;
        lk_dtype ot = sh < 2 ? LK_F8E4M3 : LK_I8;
        tu_buf x = tu_alloc(LK_BF16, 2, (int64_t[]){R, D}, 0), out = tu_alloc(ot, 2, (int64_t[]){R, D}, 0);
        tu_fill_uniform(&x, -3, 3);
        for (int ii = 0; ii < ni; ii++) {
            lk_set_isa(isas[ii]);
            for (int v = 0; v < 4; v++) {
                tu_buf sc = group_scales(R, D / G, 0, v & 1 ? 2 : 0);
                tu_saved first[2] = {{0}};
                int ok = 1;
                for (int th = 1; th <= 4; th++) {
                    lk_set_num_threads(th);
                    tu_fill_uniform(&out, -1, 1), tu_fill_uniform(&sc, -1, 1); /* garbage: every byte rewritten */
                    ok &= lk_per_token_group_fp8_quant(&out.t, &x.t, &sc.t, G, 1e-10f, v >> 1) == LK_OK;
                    if (th == 1) first[0] = tu_save(&out), first[1] = tu_save(&sc);
                    else ok &= tu_same(&out, &first[0]) && tu_same(&sc, &first[1]);
                }
                lk_set_num_threads(0);
                tu_check(ok, "%s group quant -> %s R=%lld D=%lld G=128 %s scales%s: 1-4 threads bitwise identical "
                         "(out, scales)", lk_isa_name(isas[ii]), lk_dtype_name(ot), (long long)R, (long long)D,
                         v & 1 ? "column-major" : "row-major", v >> 1 ? " ue8m0" : "");
                free(first[0].bytes), free(first[1].bytes);
                tu_free(&sc);
            }
        }
        tu_free(&x), tu_free(&out);
    }
}

/* no rows, or D == 0: LK_OK, nothing written (out and scales intact) */
static void test_group_empty(void) {
    static const int64_t SH[4][3] = {{0, 8}, {2, 0}, {0, 3, 16}, {2, 3, 0}};
    static const int ND[4] = {2, 2, 3, 3};
    int ok = 1;
    for (int c = 0; c < 4; c++) {
        int nd = ND[c];
        int64_t sshape[3] = {SH[c][0], SH[c][1], SH[c][2]};
        sshape[nd - 1] = SH[c][nd - 1] / 8;
        tu_buf x = tu_alloc(LK_BF16, nd, SH[c], 1), out = tu_alloc(LK_F8E4M3, nd, SH[c], 1);
        tu_buf o8 = tu_alloc(LK_I8, nd, SH[c], 1), sc = tu_alloc(LK_F32, nd, sshape, 1);
        tu_snapshot(&x), tu_snapshot(&out), tu_snapshot(&o8), tu_snapshot(&sc);
        for (int ii = 0; ii < ni; ii++) {
            lk_set_isa(isas[ii]);
            ok &= lk_per_token_group_fp8_quant(&out.t, &x.t, &sc.t, 8, 1e-10f, ii & 1) == LK_OK && tu_intact(&x) &&
                  tu_intact(&out) && tu_intact(&sc);
            ok &= lk_per_token_group_fp8_quant(&o8.t, &x.t, &sc.t, 8, 127.0f * FLT_MIN, !(ii & 1)) == LK_OK &&
                  tu_intact(&x) && tu_intact(&o8) && tu_intact(&sc);
        }
        /* a flat [rows, 0] for the 3-D input with D == 0; an empty view's strides are
         * unconstrained (stride +-2^62 on its rows): spreading them over the
         * input's leading dims must not overflow (the sanitizer builds abort on one) */
        if (c == 3) {
            tu_buf sf = tu_alloc(LK_F32, 2, (int64_t[]){6, 0}, 0);
            tu_snapshot(&sf);
            ok &= lk_per_token_group_fp8_quant(&out.t, &x.t, &sf.t, 5, 1e-10f, 0) == LK_OK && tu_intact(&sf) &&
                  tu_intact(&out);
            for (int k = 0; k < 2; k++) {
                lk_tensor big = sf.t;
                big.stride[0] = k ? -((int64_t)1 << 62) : (int64_t)1 << 62;
                ok &= lk_per_token_group_fp8_quant(&out.t, &x.t, &big, 5, 1e-10f, 0) == LK_OK && tu_intact(&sf);
            }
            tu_free(&sf);
        }
        tu_free(&x), tu_free(&out), tu_free(&o8), tu_free(&sc);
    }
    tu_check(ok, "group quant of empty inputs (0 rows, D == 0; 2-D and 3-D; e4m3 and i8 outs): LK_OK, nothing "
             "written");
}

/* a 3-D input: scales [2, 3, ng], flat [6, ng], padded, column-major give the same bits
 * (values per (row, group)); a 1-D input: [ng] and [1, ng]; e5m2 and i8 outs */
static void test_group_scale_shapes(void) {
    enum { A = 2, B = 3, D = 96, G = 16, NG = D / G };
    for (int oi = 0; oi < 2; oi++) {
        lk_dtype ot = oi ? LK_I8 : LK_F8E5M2;
        tu_buf x = tu_alloc(LK_F16, 3, (int64_t[]){A, B, D}, 0), out = tu_alloc(ot, 3, (int64_t[]){A, B, D}, 0);
        tu_fill_uniform(&x, -4, 4);
        tu_buf ref = group_scales(A * B, NG, 1, 0);
        int ok = lk_per_token_group_fp8_quant(&out.t, &x.t, &ref.t, G, 1e-10f, 0) == LK_OK;
        tu_saved o0 = tu_save(&out);
        for (int sl = 1; sl < GS_FORMS; sl++) {
            tu_buf sc = group_scales(A * B, NG, 1, sl);
            memset(out.t.data, 0, (size_t)(A * B * D));
            ok &= lk_per_token_group_fp8_quant(&out.t, &x.t, &sc.t, G, 1e-10f, 0) == LK_OK && tu_same(&out, &o0);
            for (int64_t k = 0; k < A * B * NG; k++) ok &= tu_get(&sc, k) == tu_get(&ref, k);
            tu_free(&sc);
        }
        /* the 1-D input's rows */
        float s1[NG], s2[1][NG];
        uint8_t q1[D], q2[D];
        lk_tensor x1 = x.t, o1 = lk_tensor_make(q1, ot, 1, (int64_t[]){D}), o2 = o1;
        x1.ndim = 1, x1.shape[0] = D, x1.stride[0] = 1;
        o2.data = q2;
        lk_tensor t1 = lk_tensor_make(s1, LK_F32, 1, (int64_t[]){NG});
        lk_tensor t2 = lk_tensor_make(s2, LK_F32, 2, (int64_t[]){1, NG});
        ok &= lk_per_token_group_fp8_quant(&o1, &x1, &t1, G, 1e-10f, 1) == LK_OK &&
              lk_per_token_group_fp8_quant(&o2, &x1, &t2, G, 1e-10f, 1) == LK_OK && !memcmp(q1, q2, D) &&
              !memcmp(s1, s2, sizeof s1);
        tu_check(ok, "group quant -> %s of a 3-D input: scales [2, 3, ng], flat [6, ng], padded and column-major "
                 "give the same bits; a 1-D input: [ng] and [1, ng]", lk_dtype_name(ot));
        free(o0.bytes);
        tu_free(&x), tu_free(&out), tu_free(&ref);
    }
}

/* expect() with the message starting "<op>: <name>" */
static void op_expect(const char *op, lk_status got, lk_status want, const char *name, tu_buf **bufs, int nb,
                      const char *what) {
    char pre[96];
    snprintf(pre, sizeof pre, "%s: %s", op, name);
    int named = !strncmp(lk_last_error(), pre, strlen(pre));
    expect(got, want, named ? name : "(a message starting with the op and the argument)", bufs, nb, what);
}
#define gexpect(...) op_expect("lk_per_token_group_fp8_quant", __VA_ARGS__)

static void test_group_errors(void) {
    int64_t R = 3, D = 20, G = 4, NG = D / G;
    tu_buf x = tu_alloc(LK_BF16, 2, (int64_t[]){R, D}, 0), out = tu_alloc(LK_F8E4M3, 2, (int64_t[]){R, D}, 0);
    tu_buf sc = tu_alloc(LK_F32, 2, (int64_t[]){R, NG}, 0), o5 = tu_alloc(LK_F8E5M2, 2, (int64_t[]){R, D}, 0);
    tu_buf sc16 = tu_alloc(LK_F16, 2, (int64_t[]){R, NG}, 0), ob = tu_alloc(LK_BF16, 2, (int64_t[]){R, D}, 0);
    tu_buf big = tu_alloc(LK_F32, 2, (int64_t[]){7, 6}, 0), o8 = tu_alloc(LK_I8, 2, (int64_t[]){R, D}, 0);
    tu_buf x3 = tu_alloc(LK_BF16, 3, (int64_t[]){2, 3, D}, 0), o3 = tu_alloc(LK_F8E4M3, 3, (int64_t[]){2, 3, D}, 0);
    tu_fill_uniform(&x, -1, 1), tu_fill_uniform(&x3, -1, 1);
    tu_buf *all[] = {&x, &out, &sc, &o5, &sc16, &ob, &big, &o8, &x3, &o3};
    int nb = 10;
    for (int b = 0; b < nb; b++) tu_snapshot(all[b]);
    const float e = 1e-10f;
    gexpect(lk_per_token_group_fp8_quant(NULL, &x.t, &sc.t, G, e, 0), LK_ERR_NULL, "out", all, nb, "group: NULL out");
    gexpect(lk_per_token_group_fp8_quant(&out.t, NULL, &sc.t, G, e, 0), LK_ERR_NULL, "input", all, nb,
            "group: NULL input");
    gexpect(lk_per_token_group_fp8_quant(&out.t, &x.t, NULL, G, e, 0), LK_ERR_NULL, "scales", all, nb,
            "group: NULL scales");
    lk_tensor nd = sc.t;
    nd.data = NULL;
    gexpect(lk_per_token_group_fp8_quant(&out.t, &x.t, &nd, G, e, 0), LK_ERR_NULL, "scales", all, nb,
            "group: scales with NULL data");
    /* group_size */
    gexpect(lk_per_token_group_fp8_quant(&out.t, &x.t, &sc.t, 0, e, 0), LK_ERR_VALUE, "group_size", all, nb,
            "group_size 0");
    gexpect(lk_per_token_group_fp8_quant(&out.t, &x.t, &sc.t, -1, e, 1), LK_ERR_VALUE, "group_size", all, nb,
            "group_size -1");
    gexpect(lk_per_token_group_fp8_quant(&out.t, &x.t, &sc.t, INT64_MIN, e, 0), LK_ERR_VALUE, "group_size", all, nb,
            "group_size INT64_MIN");
    gexpect(lk_per_token_group_fp8_quant(&out.t, &x.t, &sc.t, 8, e, 0), LK_ERR_SHAPE, "group_size", all, nb,
            "group_size 8 not dividing D 20");
    gexpect(lk_per_token_group_fp8_quant(&out.t, &x.t, &sc.t, 3, e, 0), LK_ERR_SHAPE, "group_size", all, nb,
            "group_size 3 not dividing D 20");
    gexpect(lk_per_token_group_fp8_quant(&out.t, &x.t, &sc.t, 40, e, 0), LK_ERR_SHAPE, "group_size", all, nb,
            "group_size 40 > D 20");
    gexpect(lk_per_token_group_fp8_quant(&out.t, &x.t, &sc.t, INT64_MAX, e, 0), LK_ERR_SHAPE, "group_size", all, nb,
            "group_size INT64_MAX");
    /* eps: finite and >= fp8_max * FLT_MIN (448 FLT_MIN e4m3, 57344 FLT_MIN e5m2) */
    const float lo4 = 448.0f * FLT_MIN, lo5 = 57344.0f * FLT_MIN;
    const float BAD[] = {0.0f, -0.0f, -1.0f, NAN, -NAN, INFINITY, -INFINITY, nextafterf(lo4, 0.0f), FLT_MIN,
                         FLT_TRUE_MIN};
    for (size_t k = 0; k < sizeof BAD / sizeof BAD[0]; k++) {
        char what[96];
        snprintf(what, sizeof what, "group: eps %g (e4m3 out)", (double)BAD[k]);
        gexpect(lk_per_token_group_fp8_quant(&out.t, &x.t, &sc.t, G, BAD[k], k & 1), LK_ERR_VALUE, "eps", all, nb,
                what);
    }
    gexpect(lk_per_token_group_fp8_quant(&o5.t, &x.t, &sc.t, G, nextafterf(lo5, 0.0f), 0), LK_ERR_VALUE, "eps", all,
            nb, "group: eps just below 57344 FLT_MIN (e5m2 out)");
    gexpect(lk_per_token_group_fp8_quant(&o5.t, &x.t, &sc.t, G, lo4, 0), LK_ERR_VALUE, "eps", all, nb,
            "group: eps 448 FLT_MIN (e5m2 out: below its bound)");
    /* scales */
    gexpect(lk_per_token_group_fp8_quant(&out.t, &x.t, &sc16.t, G, e, 0), LK_ERR_DTYPE, "scales", all, nb,
            "group: f16 scales");
    lk_tensor si = sc.t;
    si.dtype = LK_I32;
    gexpect(lk_per_token_group_fp8_quant(&out.t, &x.t, &si, G, e, 0), LK_ERR_DTYPE, "scales", all, nb,
            "group: i32 scales");
    static const int64_t BADSH[][3] = {{3, 6}, {4, 5}, {2, 5}, {5, 3}, {15}, {3, 5, 1}, {1, 3, 5}, {3, 1}};
    static const int BADND[] = {2, 2, 2, 2, 1, 3, 3, 2};
    for (size_t k = 0; k < sizeof BADND / sizeof BADND[0]; k++) {
        lk_tensor t = lk_tensor_make(big.t.data, LK_F32, BADND[k], BADSH[k]);
        char what[96];
        snprintf(what, sizeof what, "group: scales %s for input [3, 20] G 4", lk_shape_str(&t));
        gexpect(lk_per_token_group_fp8_quant(&out.t, &x.t, &t, G, e, 0), LK_ERR_SHAPE, "scales", all, nb, what);
    }
    /* scales of the 3-D input: [2, 3, ng] and [6, ng] only */
    static const int64_t BAD3[][3] = {{3, 2, 5}, {2, 3, 1}, {6, 5, 1}, {30}, {2, 15}, {1, 6, 5}};
    static const int BAD3ND[] = {3, 3, 3, 1, 2, 3};
    for (size_t k = 0; k < sizeof BAD3ND / sizeof BAD3ND[0]; k++) {
        lk_tensor t = lk_tensor_make(big.t.data, LK_F32, BAD3ND[k], BAD3[k]);
        char what[96];
        snprintf(what, sizeof what, "group: scales %s for input [2, 3, 20] G 4", lk_shape_str(&t));
        gexpect(lk_per_token_group_fp8_quant(&o3.t, &x3.t, &t, G, e, 0), LK_ERR_SHAPE, "scales", all, nb, what);
    }
    lk_tensor s0 = sc.t;
    s0.stride[0] = 0;
    gexpect(lk_per_token_group_fp8_quant(&out.t, &x.t, &s0, G, e, 0), LK_ERR_ALIAS, "scales", all, nb,
            "group: scales with a zero stride");
    lk_tensor so = lk_tensor_make(out.t.data, LK_F32, 2, (int64_t[]){R, NG}); /* 60 bytes over out's 60 */
    gexpect(lk_per_token_group_fp8_quant(&out.t, &x.t, &so, G, e, 0), LK_ERR_ALIAS, "scales", all, nb,
            "group: scales overlapping out");
    lk_tensor sx = lk_tensor_make((char *)x.t.data + 8, LK_F32, 2, (int64_t[]){R, NG});
    gexpect(lk_per_token_group_fp8_quant(&out.t, &x.t, &sx, G, e, 0), LK_ERR_ALIAS, "scales", all, nb,
            "group: scales overlapping input");
    /* out / input */
    gexpect(lk_per_token_group_fp8_quant(&ob.t, &x.t, &sc.t, G, e, 0), LK_ERR_DTYPE, "out", all, nb, "group: bf16 out");
    /* (an i8 out is accepted: vLLM's per_token_group_quant_int8), and the dtype message says so */
    tu_check(strstr(lk_last_error(), "or i8") != NULL, "group: the bf16 out's message names i8 among the outs (%s)",
             lk_last_error());
    /* the i8 out's own rules: eps >= 127 FLT_MIN, its shape, its overlaps */
    const float lo8 = 127.0f * FLT_MIN;
    gexpect(lk_per_token_group_fp8_quant(&o8.t, &x.t, &sc.t, G, nextafterf(lo8, 0.0f), 0), LK_ERR_VALUE, "eps", all,
            nb, "group: eps just below 127 FLT_MIN (i8 out)");
    gexpect(lk_per_token_group_fp8_quant(&o8.t, &x.t, &sc.t, G, FLT_MIN, 1), LK_ERR_VALUE, "eps", all, nb,
            "group: eps FLT_MIN (i8 out)");
    gexpect(lk_per_token_group_fp8_quant(&o8.t, &x.t, &sc.t, G, NAN, 0), LK_ERR_VALUE, "eps", all, nb,
            "group: eps NaN (i8 out)");
    lk_tensor o8n = o8.t;
    o8n.shape[1] = 16;
    gexpect(lk_per_token_group_fp8_quant(&o8n, &x.t, &sc.t, G, e, 0), LK_ERR_SHAPE, "out", all, nb,
            "group: i8 out [3, 16] for input [3, 20]");
    lk_tensor o8x = lk_tensor_make((char *)x.t.data + 2, LK_I8, 2, (int64_t[]){R, D});
    gexpect(lk_per_token_group_fp8_quant(&o8x, &x.t, &sc.t, G, e, 0), LK_ERR_ALIAS, "out", all, nb,
            "group: i8 out overlapping input");
    lk_tensor s8 = lk_tensor_make(o8.t.data, LK_F32, 2, (int64_t[]){R, NG}); /* 60 bytes over the i8 out's 60 */
    gexpect(lk_per_token_group_fp8_quant(&o8.t, &x.t, &s8, G, e, 0), LK_ERR_ALIAS, "scales", all, nb,
            "group: scales overlapping the i8 out");
    gexpect(lk_per_token_group_fp8_quant(&o8.t, &x.t, &sc.t, 7, e, 0), LK_ERR_SHAPE, "group_size", all, nb,
            "group: i8 out, group_size 7 not dividing D 20");
    gexpect(lk_per_token_group_fp8_quant(&o8.t, &o8.t, &sc.t, G, e, 0), LK_ERR_DTYPE, "input", all, nb,
            "group: i8 input");
    gexpect(lk_per_token_group_fp8_quant(&out.t, &out.t, &sc.t, G, e, 0), LK_ERR_DTYPE, "input", all, nb,
            "group: fp8 input");
    gexpect(lk_per_token_group_fp8_quant(&o3.t, &x.t, &sc.t, G, e, 0), LK_ERR_SHAPE, "out", all, nb,
            "group: out [2, 3, 20] for input [3, 20]");
    lk_tensor on = out.t;
    on.shape[1] = 16;
    gexpect(lk_per_token_group_fp8_quant(&on, &x.t, &sc.t, G, e, 0), LK_ERR_SHAPE, "out", all, nb,
            "group: out [3, 16] for input [3, 20]");
    lk_tensor ox = lk_tensor_make(x.t.data, LK_F8E4M3, 2, (int64_t[]){R, D});
    gexpect(lk_per_token_group_fp8_quant(&ox, &x.t, &sc.t, G, e, 0), LK_ERR_ALIAS, "out", all, nb,
            "group: out overlapping input");
    /* the valid calls, for contrast: the bounds themselves pass */
    lk_tensor s1 = lk_tensor_make(big.t.data, LK_F32, 2, (int64_t[]){R, 1}); /* G = D: one group */
    int ok = lk_per_token_group_fp8_quant(&out.t, &x.t, &sc.t, G, lo4, 1) == LK_OK &&
             lk_per_token_group_fp8_quant(&o5.t, &x.t, &sc.t, G, lo5, 0) == LK_OK &&
             lk_per_token_group_fp8_quant(&out.t, &x.t, &s1, D, FLT_MAX, 0) == LK_OK &&
             tu_get(&big, 0) == FLT_MAX / 448.0f;
    ok &= lk_per_token_group_fp8_quant(&o8.t, &x.t, &sc.t, G, lo8, 1) == LK_OK &&
          lk_per_token_group_fp8_quant(&o8.t, &x.t, &s1, D, FLT_MAX, 0) == LK_OK && tu_get(&big, 0) == FLT_MAX / 127.0f;
    for (int64_t i = 0; i < R * D; i++) ok &= tu_get(&o8, i) == 0; /* x / (FLT_MAX / 127): |.| < 1 */
    tu_check(ok, "group quant: eps = fp8_max * FLT_MIN (127 FLT_MIN for i8) and FLT_MAX accepted, G = D accepted (%s)",
             lk_last_error());
    for (int b = 0; b < nb; b++) tu_free(all[b]);
}

/* ---------------------------------------------------------------- static grid quant */

/* lk_static_group_scaled_fp8_quant: out[r, c] = fp8(x[r, c] / scale[r / gm, c / gn]) with
 * a given [sm, sn] grid (gm = M / sm, gn = N / sn). Scale forms of sgrid_scales: 0
 * contiguous, 1 padded rows (column stride 1: the per-channel vector path still applies),
 * 2 transposed (the view of an [sn, sm] buffer with padded rows: column stride sm + 3),
 * 3 column stride 2 (every other column of an [sm, 2 sn] buffer: per-channel scales NOT
 * read as a vector, the element path must give the same bits). Input layouts as
 * group_case's (0 contiguous, 1 padded, 2 input transposed, 3 out transposed, 4 3-D
 * [2, 3, N], 5 3-D padded). */
enum { SG_XL = 6, SG_FORMS = 4 };

static tu_buf sgrid_scales(int64_t sm, int64_t sn, int sl) {
    if (sl == 2) return tu_alloc_perm(LK_F32, 2, (int64_t[]){sm, sn}, (int[]){1, 0}, 3);
    if (sl == 3) { /* the view's inview map keeps the whole buffer: only tu_intact is used */
        tu_buf b = tu_alloc(LK_F32, 2, (int64_t[]){sm, 2 * sn}, 0);
        b.t.shape[1] = sn, b.t.stride[1] = 2;
        return b;
    }
    return tu_alloc(LK_F32, 2, (int64_t[]){sm, sn}, sl == 1);
}

/* scales log-uniform in [2^-7, 2^-2] (distinct per group: a wrong group's scale shows) */
static void sgrid_fill(tu_buf *sc) {
    for (int64_t k = 0, n = tu_numel(sc); k < n; k++) tu_set(sc, k, exp2(tu_uniform(-7.0, -2.0)));
}

static void sgrid_case(lk_dtype xt, lk_dtype ot, int64_t R, int64_t N, int64_t gm, int64_t gn, int xl, int sl,
                       int specials) {
    int three = xl >= 4;
    int64_t M = three ? 6 : R, sm = M / gm, sn = N / gn;
    tu_buf x, out;
    if (three) {
        x = tu_alloc(xt, 3, (int64_t[]){2, 3, N}, xl == 5);
        out = tu_alloc(ot, 3, (int64_t[]){2, 3, N}, xl == 4);
    } else {
        x = tu_alloc_rows(xt, R, N, xl == 3 ? 0 : xl);
        out = tu_alloc_rows(ot, R, N, xl == 3 ? 2 : xl == 2 ? 1 : xl);
    }
    tu_buf sc = sgrid_scales(sm, sn, sl);
    sgrid_fill(&sc);
    fill_x(&x, 3.0, 0);
    /* every third element at an fp8 tie times its scale (exact in f32 up to x's rounding):
     * x / s lands on the tie or an f32 step beside it, so any change of the f32 division
     * (a reciprocal product, another scale) moves codes */
    for (int64_t i = 2, n = M * N, mb = ot == LK_F8E4M3 ? 3 : 2; i < n; i += 3) {
        double t = ldexp(1.0 + ((double)tu_randint(0, (1 << mb) - 1) + 0.5) / (1 << mb), (int)tu_randint(-3, 6));
        tu_set(&x, i, (tu_rand() & 1 ? -t : t) * tu_get(&sc, i / N / gm * sn + i % N / gn));
    }
    if (specials) /* spread over rows, groups and vector lanes */
        for (int64_t i = 0, n = M * N; i < n; i++) {
            int k = (int)(i % 13);
            if (k == 1) tu_set(&x, i, i % 2 ? -NAN : NAN);
            if (k == 4) tu_set(&x, i, INFINITY);
            if (k == 6) tu_set(&x, i, -INFINITY);
            if (k == 8) tu_set(&x, i, 3e6);
            if (k == 10) tu_set(&x, i, -3e6);
            if (k == 12) tu_set(&x, i, -0.0);
        }
    tu_snapshot(&x), tu_snapshot(&out), tu_snapshot(&sc);
    tu_saved o0 = tu_save(&out), oref = {0};
    int okall = 1, f64 = 1;
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        tu_restore(&out, &o0);
        lk_status s = lk_static_group_scaled_fp8_quant(&out.t, &x.t, &sc.t);
        if (!tu_check(s == LK_OK, "%s grid quant: %s", lk_isa_name(isas[ii]), lk_last_error())) continue;
        int inputs = tu_intact(&x) && tu_intact(&sc);
        if (ii > 0) {
            okall &= inputs && tu_same(&out, &oref);
            continue;
        }
        oref = tu_save(&out);
        f64 &= inputs && tu_outside_intact(&out);
        for (int64_t r = 0; r < M; r++)
            for (int64_t c = 0; c < N; c++) {
                double v = tu_get(&x, r * N + c), s8 = tu_get(&sc, r / gm * sn + c / gn);
                f64 &= fp8_close(ot, v / s8, (float)tu_get(&out, r * N + c), 0);
            }
    }
    tu_check(f64, "grid quant %s -> %s M=%lld N=%lld scale [%lld, %lld] (groups %lld x %lld) layout=%d scales=%d%s: "
             "ref within half an fp8 step of float64 x / scale[r / gm, c / gn] (+-max beyond it), inputs and "
             "padding intact", lk_dtype_name(xt), lk_dtype_name(ot), (long long)M, (long long)N, (long long)sm,
             (long long)sn, (long long)gm, (long long)gn, xl, sl, specials ? " specials" : "");
    tu_check(okall, "grid quant %s -> %s M=%lld N=%lld scale [%lld, %lld] layout=%d scales=%d%s: every ISA "
             "bit-identical to ref (whole allocations), inputs intact", lk_dtype_name(xt), lk_dtype_name(ot),
             (long long)M, (long long)N, (long long)sm, (long long)sn, xl, sl, specials ? " specials" : "");
    free(o0.bytes), free(oref.bytes);
    tu_free(&x), tu_free(&out), tu_free(&sc);
}

static void test_sgrid_grid(void) {
    /* per tensor [1, 1], per channel [1, N], per token [M, 1], per element [M, N]; N = 1,
     * 7, 16, 33, 130, 4097: every tail length of the per-channel vectors (W 8 and 16) */
    static const int64_t NS[] = {1, 7, 16, 33, 130, 4097};
    for (int xi = 0; xi < 3; xi++)
        for (int oi = 0; oi < 2; oi++)
            for (int n = 0; n < 6; n++)
                for (int kind = 0; kind < 4; kind++)
                    for (int xl = 0; xl < SG_XL; xl++) {
                        int64_t N = NS[n], R = N > 1000 ? 2 : 1 + (n + kind + xl) % 5, M = xl >= 4 ? 6 : R;
                        if (N > 1000 && tu_emulated() && (xi != 2 || kind != 1)) continue;
                        int64_t gm = kind < 2 ? M : 1, gn = kind == 0 || kind == 2 ? N : 1;
                        if (N > 1000 && (xl == 3 || xl == 5)) continue;
                        /* every scale form for the per-channel and per-element grids (N <
                         * 1000), one (rotating) for the others */
                        for (int sl = 0; sl < SG_FORMS; sl++)
                            if ((kind & 1 && N < 1000) || sl == (n + xl + xi + kind) % SG_FORMS)
                                sgrid_case(TU_FLOAT_DTYPES[xi], FP8[oi], R, N, gm, gn, xl, sl, 0);
                    }
    /* 2-D blocks, N = 256 in groups of 128 columns: [M / 2, 2] (2-D, R 2 and 4; 3-D: 3
     * rows of groups of 2) and [2, 2] (3-D: groups of 3 rows) */
    for (int xi = 0; xi < 3; xi++)
        for (int oi = 0; oi < 2; oi++)
            for (int xl = 0; xl < SG_XL; xl++)
                for (int sl = 0; sl < SG_FORMS; sl++) {
                    int64_t R = 2 + 2 * ((xl + sl) & 1), M = xl >= 4 ? 6 : R;
                    sgrid_case(TU_FLOAT_DTYPES[xi], FP8[oi], R, 256, 2, 128, xl, sl, 0);
                    if (xl >= 4) sgrid_case(TU_FLOAT_DTYPES[xi], FP8[oi], R, 256, M / 2, 128, xl, sl, 0);
                }
    /* column groups of 2, 3, 5 (element by element), 8 (>= W on avx2, < W on avx512), 15,
     * 16, 17, 32 around the vector widths, 128; N = gn (one group: the whole row), 3 gn,
     * 7 gn; rows in groups of 1 or all of them */
    static const int64_t GN[] = {2, 3, 5, 8, 15, 16, 17, 32, 128};
    static const int64_t MULT[] = {1, 3, 7};
    for (int xi = 0; xi < 3; xi++)
        for (int oi = 0; oi < 2; oi++)
            for (int g = 0; g < 9; g++)
                for (int k = 0; k < 3; k++)
                    for (int xl = 0; xl < SG_XL; xl++) {
                        int64_t gn = GN[g], N = gn * MULT[k], R = 1 + (g + k + xl) % 5, M = xl >= 4 ? 6 : R;
                        int sl = (g + k + xl + xi) % SG_FORMS;
                        int64_t gm = (g + xl + oi) % 3 == 0 ? M : (g + xl + oi) % 3 == 1 ? 1 : (M % 2 ? 1 : 2);
                        sgrid_case(TU_FLOAT_DTYPES[xi], FP8[oi], R, N, gm, gn, xl, sl, 0);
                    }
    /* specials (NaN, +-inf, +-3e6, -0 in every few elements) on each path */
    for (int xi = 0; xi < 3; xi++)
        for (int oi = 0; oi < 2; oi++)
            for (int sl = 0; sl < SG_FORMS; sl++) {
                lk_dtype xt = TU_FLOAT_DTYPES[xi], ot = FP8[oi];
                sgrid_case(xt, ot, 3, 1, 3, 1, sl, sl, 1);     /* per tensor, N = 1 */
                sgrid_case(xt, ot, 3, 41, 3, 1, sl, sl, 1);    /* per channel */
                sgrid_case(xt, ot, 4, 40, 2, 5, sl + 1, sl, 1); /* groups of 5 columns */
                sgrid_case(xt, ot, 2, 96, 1, 32, 4, sl, 1);    /* groups of 32 columns */
                sgrid_case(xt, ot, 5, 37, 1, 37, 0, sl, 1);    /* per token */
                sgrid_case(xt, ot, 2, 19, 1, 1, 5, sl, 1);     /* per element */
            }
}

/* the grid's rules by their codes, per ISA: NaN kept with its sign, +-inf and beyond-max
 * saturate to +-max, -0 -> 0x80, on the per-channel vector path, the element path
 * (column stride 2) and the group path (groups of 20); extreme valid scales: FLT_MAX
 * (every finite value -> +-0) and FLT_TRUE_MIN (a subnormal scale: nonzero values
 * saturate, zeros stay zero) */
static void test_sgrid_specials(void) {
    enum { R = 2, N = 40 };
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        const char *isa = lk_isa_name(isas[ii]);
        for (int oi = 0; oi < 2; oi++) {
            lk_dtype ot = FP8[oi];
            uint8_t mx = ot == LK_F8E4M3 ? 0x7e : 0x7b;
            float x[R][N], sbuf[2 * R * N];
            uint8_t q[R][N];
            for (int r = 0; r < R; r++)
                for (int i = 0; i < N; i++) x[r][i] = (float)(i % 7) - 3.0f;
            for (int r = 0; r < R; r++) {
                int b = 9 * r + 1; /* spots in different lanes on each row */
                x[r][b] = NAN, x[r][b + 1] = -NAN, x[r][b + 2] = INFINITY, x[r][b + 3] = -INFINITY,
                x[r][b + 4] = 1e30f, x[r][b + 5] = -1e30f, x[r][b + 6] = -0.0f, x[r][b + 7] = 0.0f;
            }
            lk_tensor tx = lk_tensor_make(x, LK_F32, 2, (int64_t[]){R, N});
            lk_tensor tq = lk_tensor_make(q, ot, 2, (int64_t[]){R, N});
            for (int path = 0; path < 3; path++) {
                /* 0: [1, N] contiguous (vector), 1: [1, N] column stride 2 (element), 2: [2, 2] */
                lk_tensor ts = path == 2 ? lk_tensor_make(sbuf, LK_F32, 2, (int64_t[]){2, 2})
                                         : lk_tensor_make(sbuf, LK_F32, 2, (int64_t[]){1, N});
                if (path == 1) ts.stride[1] = 2;
                for (int k = 0; k < 2 * R * N; k++) sbuf[k] = 0.5f;
                memset(q, 0x11, sizeof q);
                lk_status s = lk_static_group_scaled_fp8_quant(&tq, &tx, &ts);
                int ok = s == LK_OK;
                for (int r = 0; r < R; r++) {
                    int b = 9 * r + 1;
                    ok &= q[r][b] == 0x7f && q[r][b + 1] == 0xff && q[r][b + 2] == mx && q[r][b + 3] == (0x80 | mx) &&
                          q[r][b + 4] == mx && q[r][b + 5] == (0x80 | mx) && q[r][b + 6] == 0x80 && q[r][b + 7] == 0;
                    for (int i = 0; i < N; i++)
                        if (i < b || i > b + 7)
                            ok &= q[r][i] == (ot == LK_F8E4M3 ? lk_f32_to_f8e4m3(x[r][i] / 0.5f)
                                                              : lk_f32_to_f8e5m2(x[r][i] / 0.5f));
                }
                tu_check(ok, "%s grid quant -> %s, %s: NaN kept with its sign, +-inf and +-1e30 -> +-max, -0 -> 0x80, "
                         "the rest fp8(x / 0.5) (%s)", isa, lk_dtype_name(ot),
                         path == 0 ? "per-channel vector path" : path == 1 ? "element path (column stride 2)"
                                                                            : "groups of 20 columns",
                         lk_status_str(s));
            }
            /* extreme valid scales: per channel, even columns FLT_MAX, odd FLT_TRUE_MIN */
            for (int path = 0; path < 2; path++) {
                lk_tensor ts = lk_tensor_make(sbuf, LK_F32, 2, (int64_t[]){1, N});
                if (path) ts.stride[1] = 2;
                for (int i = 0; i < N; i++) sbuf[i * (path + 1)] = i % 2 ? FLT_TRUE_MIN : FLT_MAX;
                lk_status s = lk_static_group_scaled_fp8_quant(&tq, &tx, &ts);
                int ok = s == LK_OK;
                for (int r = 0; r < R; r++)
                    for (int i = 0; i < N; i++) {
                        float v = x[r][i];
                        uint8_t want = isnan(v) ? (signbit(v) ? 0xff : 0x7f)
                                     : v == 0 ? (signbit(v) ? 0x80 : 0x00)
                                     : i % 2 ? (v < 0 ? 0x80 | mx : mx)
                                     : isinf(v) ? (v < 0 ? 0x80 | mx : mx) : (v < 0 ? 0x80 : 0x00);
                        ok &= q[r][i] == want;
                    }
                tu_check(ok, "%s grid quant -> %s, %s: scale FLT_MAX (finite -> signed 0, inf -> +-max) and "
                         "FLT_TRUE_MIN (nonzero -> +-max, +-0 kept) accepted (%s)", isa, lk_dtype_name(ot),
                         path ? "element path" : "vector path", lk_status_str(s));
            }
        }
    }
}

/* the same logical grid in every form (sgrid_scales' four, negative column and row
 * strides) gives the same bits, and matches its per-element expansion [M, N] (the
 * per-channel vector path) and, for [1, 1], lk_static_scaled_fp8_quant; a 3-D input
 * [2, 3, N] gives the 2-D [6, N] bits, a 1-D input [N] (with sm = 1) row 0's; a [2, sn]
 * scale with row stride 0 (one row read twice) gives the [1, sn] bits; on every ISA */
static void test_sgrid_scale_forms(void) {
    enum { M = 6, N = 48 };
    static const int64_t GRID[][2] = {{6, 48}, {1, 1}, {2, 3}, {3, 16}, {6, 1}, {1, 48}, {2, 24}, {3, 2}, {1, 6}};
    tu_buf x = tu_alloc(LK_F16, 2, (int64_t[]){M, N}, 0), out = tu_alloc(LK_F8E4M3, 2, (int64_t[]){M, N}, 0);
    tu_buf ex = tu_alloc(LK_F32, 2, (int64_t[]){M, N}, 0);
    tu_fill_uniform(&x, -3, 3);
    lk_tensor x3 = x.t, o3 = out.t;
    x3.ndim = o3.ndim = 3;
    x3.shape[0] = o3.shape[0] = 2, x3.shape[1] = o3.shape[1] = 3, x3.shape[2] = o3.shape[2] = N;
    x3.stride[0] = o3.stride[0] = 3 * N, x3.stride[1] = o3.stride[1] = N, x3.stride[2] = o3.stride[2] = 1;
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        for (size_t g = 0; g < sizeof GRID / sizeof GRID[0]; g++) {
            int64_t gm = GRID[g][0], gn = GRID[g][1], sm = M / gm, sn = N / gn;
            int ok = 1;
            tu_buf sc[SG_FORMS];
            for (int sl = 0; sl < SG_FORMS; sl++) sc[sl] = sgrid_scales(sm, sn, sl);
            sgrid_fill(&sc[0]);
            for (int sl = 1; sl < SG_FORMS; sl++)
                for (int64_t k = 0; k < sm * sn; k++) tu_set(&sc[sl], k, tu_get(&sc[0], k));
            for (int64_t r = 0; r < M; r++)
                for (int64_t c = 0; c < N; c++) tu_set(&ex, r * N + c, tu_get(&sc[0], r / gm * sn + c / gn));
            ok &= lk_static_group_scaled_fp8_quant(&out.t, &x.t, &ex.t) == LK_OK;
            tu_saved want = tu_save(&out);
            for (int sl = 0; sl < SG_FORMS; sl++) {
                memset(out.t.data, 0x33, M * N);
                ok &= lk_static_group_scaled_fp8_quant(&out.t, &x.t, &sc[sl].t) == LK_OK && tu_same(&out, &want);
                memset(out.t.data, 0x33, M * N);
                ok &= lk_static_group_scaled_fp8_quant(&o3, &x3, &sc[sl].t) == LK_OK && tu_same(&out, &want);
            }
            if (sm * sn == 1) {
                memset(out.t.data, 0x33, M * N);
                lk_tensor s1 = lk_tensor_make(sc[0].t.data, LK_F32, 1, (int64_t[]){1});
                ok &= lk_static_scaled_fp8_quant(&out.t, &x.t, &s1) == LK_OK && tu_same(&out, &want);
            }
            { /* negative strides: columns reversed in memory (the element path), then rows too */
                tu_buf rb = tu_alloc(LK_F32, 2, (int64_t[]){sm, sn}, 0);
                lk_tensor rv = rb.t;
                rv.data = (float *)rb.t.data + sn - 1, rv.stride[1] = -1;
                for (int64_t r = 0; r < sm; r++)
                    for (int64_t c = 0; c < sn; c++)
                        ((float *)rv.data)[r * sn - c] = (float)tu_get(&sc[0], r * sn + c);
                memset(out.t.data, 0x33, M * N);
                ok &= lk_static_group_scaled_fp8_quant(&out.t, &x.t, &rv) == LK_OK && tu_same(&out, &want);
                rv.data = (float *)rv.data + (sm - 1) * sn, rv.stride[0] = -sn;
                for (int64_t r = 0; r < sm; r++)
                    for (int64_t c = 0; c < sn; c++)
                        ((float *)rv.data)[-r * sn - c] = (float)tu_get(&sc[0], r * sn + c);
                memset(out.t.data, 0x33, M * N);
                ok &= lk_static_group_scaled_fp8_quant(&out.t, &x.t, &rv) == LK_OK && tu_same(&out, &want);
                tu_free(&rb);
            }
            if (sm == 1) { /* a 1-D input (one row): row 0's bits */
                lk_tensor x1 = x.t, o1 = out.t;
                x1.ndim = o1.ndim = 1, x1.shape[0] = o1.shape[0] = N, x1.stride[0] = o1.stride[0] = 1;
                memset(out.t.data, 0x33, M * N);
                ok &= lk_static_group_scaled_fp8_quant(&o1, &x1, &sc[0].t) == LK_OK &&
                      !memcmp(out.t.data, want.bytes + ((unsigned char *)out.t.data - out.base), N);
            }
            if (sm == 1 && M % 2 == 0) { /* [2, sn] with row stride 0: rows of 3 read the one row */
                lk_tensor sb = sc[0].t;
                sb.shape[0] = 2, sb.stride[0] = 0;
                memset(out.t.data, 0x33, M * N);
                ok &= lk_static_group_scaled_fp8_quant(&out.t, &x.t, &sb) == LK_OK && tu_same(&out, &want);
            }
            free(want.bytes);
            for (int sl = 0; sl < SG_FORMS; sl++) tu_free(&sc[sl]);
            tu_check(ok, "%s grid quant f16 [6, 48] -> e4m3, scale [%lld, %lld]: every scale form (contiguous, "
                     "padded, transposed, column stride 2, negative strides%s), the per-element expansion "
                     "[6, 48], a 3-D input%s give the same bits", lk_isa_name(isas[ii]), (long long)sm,
                     (long long)sn, sm == 1 ? ", row stride 0" : "",
                     sm * sn == 1 ? ", a 1-D input, lk_static_scaled_fp8_quant" : sm == 1 ? ", a 1-D input" : "");
        }
    }
    tu_free(&x), tu_free(&out), tu_free(&ex);
}

/* 1-4 threads bitwise identical, and every ISA's bits the reference's, on 64 rows of
 * 4096 (bf16 -> e4m3): per tensor, per channel (contiguous and column stride 2), per
 * token, per element, blocks of 2 x 128, groups of 4 columns by 8 rows, of 16 by 64 */
static void test_sgrid_threads(void) {
    enum { R = 64, N = 4096 };
    static const int64_t G[][3] = {{R, N, 0}, {R, 1, 0}, {R, 1, 3}, {1, N, 0}, {1, 1, 0},
                                   {2, 128, 0}, {8, 4, 0}, {64, 16, 2}};
    tu_buf x = tu_alloc(LK_BF16, 2, (int64_t[]){R, N}, 0), out = tu_alloc(LK_F8E4M3, 2, (int64_t[]){R, N}, 0);
    tu_fill_uniform(&x, -3, 3);
    for (size_t g = 0; g < sizeof G / sizeof G[0]; g++) {
        int64_t gm = G[g][0], gn = G[g][1];
        tu_buf sc = sgrid_scales(R / gm, N / gn, (int)G[g][2]);
        sgrid_fill(&sc);
        tu_saved ref = {0};
        int ok = 1;
        for (int ii = 0; ii < ni; ii++) {
            lk_set_isa(isas[ii]);
            for (int th = 1; th <= 4; th++) {
                lk_set_num_threads(th);
                memset(out.t.data, 0x5a, R * N);
                ok &= lk_static_group_scaled_fp8_quant(&out.t, &x.t, &sc.t) == LK_OK;
                if (ii == 0 && th == 1) ref = tu_save(&out);
                else ok &= tu_same(&out, &ref);
            }
            lk_set_num_threads(0);
        }
        tu_check(ok, "grid quant R=%d N=%d scale [%lld, %lld] form %d: 1-4 threads on every ISA bitwise the "
                 "reference's", R, N, (long long)(R / gm), (long long)(N / gn), (int)G[g][2]);
        free(ref.bytes);
        tu_free(&sc);
    }
    tu_free(&x), tu_free(&out);
}

/* no rows or N == 0: LK_OK, nothing written, on every ISA (the scale still validated:
 * sm, sn >= 1 dividing M, N, values finite and > 0) */
static void test_sgrid_empty(void) {
    static const struct {
        int nd;
        int64_t x[3], s[2];
    } C[] = {{2, {0, 8}, {1, 2}}, {2, {0, 8}, {1, 1}}, {2, {0, 8}, {3, 8}}, {2, {2, 0}, {2, 1}},
             {2, {2, 0}, {1, 5}}, {3, {0, 3, 16}, {1, 4}}, {3, {2, 3, 0}, {6, 3}}, {3, {2, 3, 0}, {3, 1}}};
    for (size_t c = 0; c < sizeof C / sizeof C[0]; c++) {
        tu_buf x = tu_alloc(LK_BF16, C[c].nd, C[c].x, 1), out = tu_alloc(LK_F8E5M2, C[c].nd, C[c].x, 1);
        tu_buf sc = tu_alloc(LK_F32, 2, C[c].s, 1);
        sgrid_fill(&sc);
        tu_snapshot(&x), tu_snapshot(&out), tu_snapshot(&sc);
        for (int ii = 0; ii < ni; ii++) {
            lk_set_isa(isas[ii]);
            lk_status s = lk_static_group_scaled_fp8_quant(&out.t, &x.t, &sc.t);
            tu_check(s == LK_OK && tu_intact(&x) && tu_intact(&out) && tu_intact(&sc),
                     "%s grid quant of an empty input %s, scale %s: LK_OK, nothing written (%s)",
                     lk_isa_name(isas[ii]), lk_shape_str(&x.t), lk_shape_str(&sc.t), lk_last_error());
        }
        /* validation first: a bad value, or an sm of 0, is refused even with nothing to do */
        tu_set(&sc, tu_numel(&sc) - 1, -1.0);
        tu_snapshot(&sc);
        lk_status s = lk_static_group_scaled_fp8_quant(&out.t, &x.t, &sc.t);
        tu_check(s == LK_ERR_VALUE && strstr(lk_last_error(), "scale[") && tu_intact(&out),
                 "grid quant of an empty input %s, scale %s holding -1: LK_ERR_VALUE (%s)", lk_shape_str(&x.t),
                 lk_shape_str(&sc.t), lk_last_error());
        lk_tensor s0 = sc.t;
        s0.shape[0] = 0;
        s = lk_static_group_scaled_fp8_quant(&out.t, &x.t, &s0);
        tu_check(s == LK_ERR_SHAPE && strstr(lk_last_error(), ": scale:") && tu_intact(&out),
                 "grid quant of an empty input %s, scale %s: LK_ERR_SHAPE (%s)", lk_shape_str(&x.t),
                 lk_shape_str(&s0), lk_last_error());
        tu_free(&x), tu_free(&out), tu_free(&sc);
    }
}

#define sexpect(...) op_expect("lk_static_group_scaled_fp8_quant", __VA_ARGS__)

static void test_sgrid_errors(void) {
    enum { R = 4, N = 20 };
    tu_buf x = tu_alloc(LK_BF16, 2, (int64_t[]){R, N}, 0), out = tu_alloc(LK_F8E4M3, 2, (int64_t[]){R, N}, 0);
    tu_buf sc = tu_alloc(LK_F32, 2, (int64_t[]){4, 5}, 0);
    tu_buf sct = tu_alloc_perm(LK_F32, 2, (int64_t[]){4, 5}, (int[]){1, 0}, 1); /* transposed, padded */
    tu_buf sc16 = tu_alloc(LK_F16, 2, (int64_t[]){4, 5}, 0), big = tu_alloc(LK_F32, 1, (int64_t[]){256}, 0);
    tu_buf ob = tu_alloc(LK_BF16, 2, (int64_t[]){R, N}, 0), o8 = tu_alloc(LK_I8, 2, (int64_t[]){R, N}, 0);
    tu_buf o3 = tu_alloc(LK_F8E4M3, 3, (int64_t[]){2, 2, N}, 0), xf = tu_alloc(LK_F32, 2, (int64_t[]){R, N}, 0);
    tu_fill_uniform(&x, -1, 1), tu_fill_uniform(&sc16, 0.1, 1), tu_fill_uniform(&xf, 0.25, 1);
    sgrid_fill(&sc), sgrid_fill(&big);
    for (int64_t k = 0; k < 20; k++) tu_set(&sct, k, tu_get(&sc, k));
    tu_buf *all[] = {&x, &out, &sc, &sct, &sc16, &big, &ob, &o8, &o3, &xf};
    int nb = 10;
    for (int b = 0; b < nb; b++) tu_snapshot(all[b]);
    sexpect(lk_static_group_scaled_fp8_quant(NULL, &x.t, &sc.t), LK_ERR_NULL, "out", all, nb, "grid: NULL out");
    sexpect(lk_static_group_scaled_fp8_quant(&out.t, NULL, &sc.t), LK_ERR_NULL, "input", all, nb, "grid: NULL input");
    sexpect(lk_static_group_scaled_fp8_quant(&out.t, &x.t, NULL), LK_ERR_NULL, "scale", all, nb, "grid: NULL scale");
    lk_tensor nd = sc.t;
    nd.data = NULL;
    sexpect(lk_static_group_scaled_fp8_quant(&out.t, &x.t, &nd), LK_ERR_NULL, "scale", all, nb,
            "grid: scale with NULL data");
    /* rank: 2 dims only ([] and [1] per-tensor scales, [N] per-channel, [1, 1, 1]) */
    static const int64_t RK[][3] = {{0}, {1}, {20}, {1, 1, 1}, {4, 5, 1}};
    static const int RKND[] = {0, 1, 1, 3, 3};
    for (int k = 0; k < 5; k++) {
        lk_tensor t = lk_tensor_make(big.t.data, LK_F32, RKND[k], RK[k]);
        char what[96];
        snprintf(what, sizeof what, "grid: scale of %d dims %s", RKND[k], lk_shape_str(&t));
        sexpect(lk_static_group_scaled_fp8_quant(&out.t, &x.t, &t), LK_ERR_RANK, "scale", all, nb, what);
    }
    /* shape: sm not dividing M = 4, sn not dividing N = 20, either 0 */
    static const int64_t BADSH[][2] = {{3, 5}, {4, 3}, {8, 20}, {4, 40}, {5, 1},
                                       {1, 6}, {0, 5}, {4, 0}, {0, 0}, {3, 7}};
    for (size_t k = 0; k < sizeof BADSH / sizeof BADSH[0]; k++) {
        lk_tensor t = lk_tensor_make(big.t.data, LK_F32, 2, BADSH[k]);
        char what[96];
        snprintf(what, sizeof what, "grid: scale %s for input [4, 20]", lk_shape_str(&t));
        sexpect(lk_static_group_scaled_fp8_quant(&out.t, &x.t, &t), LK_ERR_SHAPE, "scale", all, nb, what);
    }
    /* 3-D input [2, 2, 20]: M = 4 rows */
    lk_tensor x3 = x.t;
    x3.ndim = 3, x3.shape[0] = 2, x3.shape[1] = 2, x3.shape[2] = N;
    x3.stride[0] = 2 * N, x3.stride[1] = N, x3.stride[2] = 1;
    lk_tensor t3 = lk_tensor_make(big.t.data, LK_F32, 2, (int64_t[]){3, 5});
    sexpect(lk_static_group_scaled_fp8_quant(&o3.t, &x3, &t3), LK_ERR_SHAPE, "scale", all, nb,
            "grid: scale [3, 5] for input [2, 2, 20] (4 rows)");
    /* values: 0, -0, negative, NaN, inf, at a position; the message names the element */
    static const float BAD[] = {0.0f, -0.0f, -1.0f, -FLT_TRUE_MIN, NAN, -NAN, INFINITY, -INFINITY};
    static const int64_t POS[][2] = {{0, 0}, {2, 3}, {3, 4}, {1, 0}};
    for (size_t k = 0; k < sizeof BAD / sizeof BAD[0]; k++)
        for (int p = 0; p < 4; p++)
            for (int tr = 0; tr < 2; tr++) { /* contiguous and transposed: the logical position */
                tu_buf *b = tr ? &sct : &sc;
                int64_t i = POS[p][0], j = POS[p][1], at = i * 5 + j;
                double keep = tu_get(b, at);
                tu_set(b, at, BAD[k]);
                for (int q = 0; q < nb; q++) tu_snapshot(all[q]);
                char name[32], what[96];
                snprintf(name, sizeof name, "scale[%lld, %lld]", (long long)i, (long long)j);
                snprintf(what, sizeof what, "grid: %s %s = %g", tr ? "transposed" : "contiguous", name, (double)BAD[k]);
                sexpect(lk_static_group_scaled_fp8_quant(&out.t, &x.t, &b->t), LK_ERR_VALUE, name, all, nb, what);
                tu_set(b, at, keep);
            }
    for (int b = 0; b < nb; b++) tu_snapshot(all[b]);
    /* a [1, 1] and a [4, 1] grid: the element named with its index 0 */
    tu_set(&big, 0, NAN);
    tu_snapshot(&big);
    lk_tensor t11 = lk_tensor_make(big.t.data, LK_F32, 2, (int64_t[]){1, 1});
    sexpect(lk_static_group_scaled_fp8_quant(&out.t, &x.t, &t11), LK_ERR_VALUE, "scale[0, 0]", all, nb,
            "grid: [1, 1] scale NaN");
    lk_tensor t41 = lk_tensor_make((float *)big.t.data + 1, LK_F32, 2, (int64_t[]){4, 1});
    tu_set(&big, 3, 0.0);
    tu_snapshot(&big);
    sexpect(lk_static_group_scaled_fp8_quant(&out.t, &x.t, &t41), LK_ERR_VALUE, "scale[2, 0]", all, nb,
            "grid: [4, 1] scale 0 at row 2");
    sgrid_fill(&big);
    for (int b = 0; b < nb; b++) tu_snapshot(all[b]);
    /* dtypes */
    sexpect(lk_static_group_scaled_fp8_quant(&out.t, &x.t, &sc16.t), LK_ERR_DTYPE, "scale", all, nb, "grid: f16 scale");
    lk_tensor sbf = sc16.t;
    sbf.dtype = LK_BF16;
    sexpect(lk_static_group_scaled_fp8_quant(&out.t, &x.t, &sbf), LK_ERR_DTYPE, "scale", all, nb, "grid: bf16 scale");
    lk_tensor si = sc.t;
    si.dtype = LK_I32;
    sexpect(lk_static_group_scaled_fp8_quant(&out.t, &x.t, &si), LK_ERR_DTYPE, "scale", all, nb, "grid: i32 scale");
    sexpect(lk_static_group_scaled_fp8_quant(&ob.t, &x.t, &sc.t), LK_ERR_DTYPE, "out", all, nb, "grid: bf16 out");
    sexpect(lk_static_group_scaled_fp8_quant(&o8.t, &x.t, &sc.t), LK_ERR_DTYPE, "out", all, nb, "grid: i8 out");
    sexpect(lk_static_group_scaled_fp8_quant(&out.t, &out.t, &sc.t), LK_ERR_DTYPE, "input", all, nb, "grid: fp8 input");
    /* out's shape, overlaps */
    sexpect(lk_static_group_scaled_fp8_quant(&o3.t, &x.t, &sc.t), LK_ERR_SHAPE, "out", all, nb,
            "grid: out [2, 2, 20] for input [4, 20]");
    lk_tensor on = out.t;
    on.shape[1] = 16;
    sexpect(lk_static_group_scaled_fp8_quant(&on, &x.t, &sc.t), LK_ERR_SHAPE, "out", all, nb,
            "grid: out [4, 16] for input [4, 20]");
    lk_tensor ox = lk_tensor_make(x.t.data, LK_F8E4M3, 2, (int64_t[]){R, N});
    sexpect(lk_static_group_scaled_fp8_quant(&ox, &x.t, &sc.t), LK_ERR_ALIAS, "out", all, nb,
            "grid: out overlapping input");
    lk_tensor o0 = out.t;
    o0.stride[0] = 0;
    sexpect(lk_static_group_scaled_fp8_quant(&o0, &x.t, &sc.t), LK_ERR_ALIAS, "out", all, nb,
            "grid: out with a zero stride");
    /* a scale inside out (its values valid: 0.5 as bytes in out's first 16 bytes) */
    const float half[4] = {0.5f, 0.5f, 0.5f, 0.5f};
    memcpy(out.t.data, half, sizeof half);
    for (int b = 0; b < nb; b++) tu_snapshot(all[b]);
    lk_tensor so = lk_tensor_make(out.t.data, LK_F32, 2, (int64_t[]){2, 2});
    sexpect(lk_static_group_scaled_fp8_quant(&out.t, &x.t, &so), LK_ERR_ALIAS, "out and scale", all, nb,
            "grid: scale overlapping out");
    lk_tensor so1 = lk_tensor_make((char *)out.t.data + 4 * N - 4, LK_F32, 2, (int64_t[]){1, 1});
    memcpy(so1.data, half, 4);
    for (int b = 0; b < nb; b++) tu_snapshot(all[b]);
    sexpect(lk_static_group_scaled_fp8_quant(&out.t, &x.t, &so1), LK_ERR_ALIAS, "out and scale", all, nb,
            "grid: [1, 1] scale in out's last bytes");
    /* valid, for contrast: a scale inside the (f32, read-only) input */
    lk_tensor sx = lk_tensor_make(xf.t.data, LK_F32, 2, (int64_t[]){2, 4});
    lk_tensor oo = out.t;
    int ok = lk_static_group_scaled_fp8_quant(&oo, &xf.t, &sx) == LK_OK && tu_intact(&xf);
    tu_check(ok, "grid quant: a scale inside the input (both read only) is accepted (%s)", lk_last_error());
    for (int b = 0; b < nb; b++) tu_free(all[b]);
}

/* ---------------------------------------------------------------- rms_norm per block quant */

/* input layouts of block_case: those of group_case (0 contiguous, 1 padded, 2 input
 * transposed, 3 out transposed: the reference fallback, 4 / 5 3-D [2, 3, D] contiguous /
 * padded), and 6: x and out contiguous, the residual transposed (the fallback through the
 * residual). Scales forms as group_case's (group_scales). Flags: */
enum { BX_LAYOUTS = 7, B_RES = 1, B_NOW = 2, B_SPEC = 4 };
static const lk_dtype QOUT[3] = {LK_F8E4M3, LK_F8E5M2, LK_I8};

/* fp8 code bytes equal up to the sign of a NaN code (the norms' NaN signs are
 * unspecified, docs/numerics.md); i8 and every other byte exactly */
static int same_codes(const tu_buf *b, const tu_saved *s, lk_dtype ot) {
    for (size_t k = 0; k < s->n; k++) {
        unsigned u = b->base[k], v = s->bytes[k];
        if (u == v) continue;
        if (ot == LK_I8 || (u ^ v) != 0x80) return 0;
        if (ot == LK_F8E4M3 ? (u & 0x7f) != 0x7f : (u & 0x7c) != 0x7c || !(u & 3)) return 0;
    }
    return 1;
}

/* the residual layout of block_case's input layout xl (2-D) */
static int block_res_layout(int xl) { return xl == 6 ? 2 : xl == 0 || xl == 2 ? 1 : 0; }

static void block_case(lk_dtype xt, lk_dtype rt, lk_dtype wt, lk_dtype ot, int64_t R, int64_t D, int64_t G, int xl,
                       int sl, int flags, float ubv) {
    int three = xl == 4 || xl == 5, has_res = flags & B_RES, now = flags & B_NOW, spec = flags & B_SPEC;
    int64_t rows = three ? 6 : R, ng = D / G;
    tu_buf x, out, res;
    if (three) {
        x = tu_alloc(xt, 3, (int64_t[]){2, 3, D}, xl == 5);
        out = tu_alloc(ot, 3, (int64_t[]){2, 3, D}, xl == 4);
        res = tu_alloc(rt, 3, (int64_t[]){2, 3, D}, xl == 4);
    } else {
        x = tu_alloc_rows(xt, R, D, xl == 3 || xl == 6 ? 0 : xl);
        out = tu_alloc_rows(ot, R, D, xl == 3 ? 2 : xl == 2 ? 1 : xl == 6 ? 0 : xl);
        res = tu_alloc_rows(rt, R, D, block_res_layout(xl));
    }
    tu_buf w = tu_alloc(wt, 1, &D, xl & 1), sc = group_scales(rows, ng, three, sl);
    fill_x(&x, 2.0, 0);
    tu_fill_uniform(&res, -2, 2);
    tu_fill_uniform(&w, -1.5, 1.5);
    /* blocks of very different absmax: row 0's block 1 a 64th of the rest, the last row's
     * block 2 all zero (v = 0: input and residual 0) */
    if (ng >= 2)
        for (int64_t i = G; i < 2 * G; i++) tu_set(&x, i, tu_get(&x, i) / 64), tu_set(&res, i, tu_get(&res, i) / 64);
    if (ng >= 3 && rows >= 2)
        for (int64_t i = (rows - 1) * D + 2 * G; i < (rows - 1) * D + 3 * G; i++)
            tu_set(&x, i, 0.0), tu_set(&res, i, 0.0);
    if (spec) {
        /* a NaN in row 0 (block 0): the row NaN; an inf in row 1 (its last block): inv = 0;
         * weights: NaN at element 0 (block 0), inf in block 1 (y +-inf there: scale inf,
         * or scale_ub / fp8_max) */
        tu_set(&x, G / 2, NAN);
        if (rows >= 2) tu_set(&x, 2 * D - 1, INFINITY);
        if (!now && ng >= 2) tu_set(&w, 0, NAN), tu_set(&w, G + G / 2, INFINITY);
    }
    float ubs = ubv, eps = 1e-5f;
    lk_tensor ub = one_scale(&ubs);
    double *res0 = tu_values(&res);
    tu_snapshot(&x), tu_snapshot(&w), tu_snapshot(&out), tu_snapshot(&res), tu_snapshot(&sc);
    tu_saved o0 = tu_save(&out), s0 = tu_save(&sc), r0 = tu_save(&res), oref = {0}, sref = {0}, rref = {0};
    int okall = 1, f64 = 1, inputs = 1;
    double rel = 1e-5 + 3e-8 * (double)D, fm = fmax8(ot);
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        tu_restore(&out, &o0), tu_restore(&sc, &s0), tu_restore(&res, &r0);
        lk_status s = lk_rms_norm_per_block_quant(&out.t, &x.t, now ? NULL : &w.t, &sc.t, eps, ubv > 0 ? &ub : NULL,
                                                  has_res ? &res.t : NULL, G);
        if (!tu_check(s == LK_OK, "%s rms_norm_per_block_quant: %s", lk_isa_name(isas[ii]), lk_last_error())) continue;
        inputs &= tu_intact(&x) && tu_intact(&w);
        if (ii > 0) {
            okall &= (spec ? same_codes(&out, &oref, ot) : tu_same(&out, &oref)) && tu_same(&sc, &sref) &&
                     tu_same(&res, &rref);
            continue;
        }
        oref = tu_save(&out), sref = tu_save(&sc), rref = tu_save(&res);
        f64 &= tu_outside_intact(&out) && tu_outside_intact(&res) && tu_outside_intact(&sc);
        if (!has_res) f64 &= tu_intact(&res);
        double *v = malloc(sizeof(double) * (size_t)(D ? D : 1));
        for (int64_t r = 0; r < rows; r++) {
            double ss = 0;
            for (int64_t i = 0; i < D; i++) {
                double xv = tu_get(&x, r * D + i);
                if (has_res) {
                    float sum = (float)(xv + res0[r * D + i]);
                    v[i] = lk_round_to(rt, sum);
                    double got = tu_get(&res, r * D + i); /* residual = round(x + residual) */
                    f64 &= isnan(v[i]) ? isnan(got) : got == v[i];
                } else v[i] = xv;
                ss += v[i] * v[i];
            }
            double inv = 1.0 / sqrt(ss / (double)D + eps);
            for (int64_t i = 0; i < D; i++) v[i] = v[i] * inv * (now ? 1.0 : tu_get(&w, i));
            for (int64_t g = 0; g < ng; g++) {
                double m = 0, scale = tu_get(&sc, r * ng + g);
                for (int64_t i = g * G; i < g * G + G; i++)
                    if (fabs(v[i]) > m) m = fabs(v[i]); /* NaN ignored */
                double want = (ubv > 0 && m > ubv ? ubv : m) / fm;
                if (want < min_scale(ot)) want = min_scale(ot);
                f64 &= isinf(want) ? scale == want : fabs(scale - want) <= want * (rel + 1e-7);
                for (int64_t i = g * G; i < g * G + G; i++)
                    f64 &= ot == LK_I8 ? i8_close(v[i] / scale, tu_get(&out, r * D + i), rel)
                                       : fp8_close(ot, v[i] / scale, (float)tu_get(&out, r * D + i), rel);
            }
        }
        free(v);
    }
    char cfg[200];
    snprintf(cfg, sizeof cfg, "rms_norm_per_block_quant %s (res %s, w %s) -> %s R=%lld D=%lld G=%lld layout=%d "
             "scales=%d%s%s", lk_dtype_name(xt), has_res ? lk_dtype_name(rt) : "none",
             now ? "none" : lk_dtype_name(wt), lk_dtype_name(ot), (long long)rows, (long long)D, (long long)G, xl, sl,
             ubv > 0 ? " scale_ub" : "", spec ? " specials" : "");
    tu_check(f64, "%s: ref within half a step (+ f32 slack) of float64, block scales as the float64 formula, "
             "residual = round(x + residual), padding intact", cfg);
    tu_check(okall && inputs, "%s: every ISA bit-identical to ref (out, scales, residual: whole allocations)%s, "
             "input and weight intact", cfg, spec ? " up to NaN code signs" : "");
    free(res0), free(o0.bytes), free(s0.bytes), free(r0.bytes), free(oref.bytes), free(sref.bytes), free(rref.bytes);
    tu_free(&x), tu_free(&out), tu_free(&res), tu_free(&w), tu_free(&sc);
}

static void test_block_grid(void) {
    static const int64_t GS[] = {1, 7, 16, 64, 128};
    int c = 0;
    for (int xi = 0; xi < 3; xi++)
        for (int oi = 0; oi < 3; oi++)
            for (int gi = 0; gi < 5; gi++)
                for (int k = 0; k < 2; k++)
                    for (int xl = 0; xl < BX_LAYOUTS; xl++)
                        for (int sl = 0; sl < (xl == 4 || xl == 5 ? 4 : 3); sl++, c++) {
                            int64_t G = GS[gi], D = k ? 3 * G : G, R = 1 + c % 5;
                            lk_dtype xt = TU_FLOAT_DTYPES[xi], rt = TU_FLOAT_DTYPES[(xi + gi + k) % 3];
                            lk_dtype wt = TU_FLOAT_DTYPES[(xi + xl + sl) % 3];
                            int flags = (xl == 6 || c % 2 ? B_RES : 0) | (c % 7 == 3 ? B_NOW : 0);
                            float ub = c % 5 == 2 ? 0.5f : c % 5 == 4 ? 100.0f : 0.0f;
                            block_case(xt, rt, wt, QOUT[oi], R, D, G, xl, sl, flags, ub);
                        }
    /* DeepSeek-V3's hidden size: D 7168 in blocks of 128 */
    for (int xi = 0; xi < 3; xi++)
        if (!tu_emulated() || xi == 2)
            block_case(TU_FLOAT_DTYPES[xi], TU_FLOAT_DTYPES[(xi + 1) % 3], TU_FLOAT_DTYPES[(xi + 2) % 3], QOUT[xi],
                       2 + xi, 7168, 128, xi == 1, xi, B_RES, xi == 0 ? 0.75f : 0.0f);
    /* specials: a NaN row, an inf row, a NaN and an inf weight (blocks 0, 1) */
    for (int xi = 0; xi < 3; xi++)
        for (int oi = 0; oi < 3; oi++) {
            lk_dtype xt = TU_FLOAT_DTYPES[xi], rt = TU_FLOAT_DTYPES[(xi + 1) % 3], ot = QOUT[oi];
            block_case(xt, rt, LK_F32, ot, 3, 48, 16, 0, 2, B_RES | B_SPEC, 0);
            block_case(xt, rt, LK_BF16, ot, 4, 21, 7, 2, 1, B_SPEC, 0);
            block_case(xt, rt, LK_F16, ot, 3, 40, 20, 1, 0, B_SPEC, 1.0f);
            block_case(xt, rt, LK_F32, ot, 6, 128, 64, 4, 3, B_RES | B_SPEC, 0);
            block_case(xt, rt, LK_F32, ot, 3, 256, 128, 6, 2, B_RES | B_NOW | B_SPEC, 0);
        }
}

/* group_size == D: exactly lk_rms_norm_dynamic_per_token_quant's bits (out, scales,
 * residual), per ISA */
static void test_block_as_token(void) {
    static const struct {
        lk_dtype xt, rt, wt, ot;
        int64_t R, D;
        int layout, flags;
        float ub;
    } C[] = {
        {LK_BF16, LK_BF16, LK_BF16, LK_F8E4M3, 4, 64, 0, B_RES, 0.5f},
        {LK_F16, LK_F32, LK_F32, LK_I8, 3, 72, 1, B_RES, 0.25f},
        {LK_F32, LK_F32, LK_F16, LK_F8E5M2, 5, 33, 2, B_NOW, 0},
        {LK_F32, LK_BF16, LK_BF16, LK_I8, 2, 4097, 0, B_RES, 0},
        {LK_F16, LK_F16, LK_BF16, LK_F8E4M3, 1, 7, 1, B_RES | B_SPEC, 0},
        {LK_BF16, LK_F32, LK_F32, LK_I8, 3, 130, 0, B_SPEC, 3.0f},
    };
    for (size_t c = 0; c < sizeof C / sizeof C[0]; c++) {
        int64_t R = C[c].R, D = C[c].D;
        tu_buf x = tu_alloc_rows(C[c].xt, R, D, C[c].layout), res = tu_alloc_rows(C[c].rt, R, D, C[c].layout);
        tu_buf w = tu_alloc(C[c].wt, 1, &D, 0), o[2], s[2];
        for (int k = 0; k < 2; k++)
            o[k] = tu_alloc_rows(C[c].ot, R, D, C[c].layout), s[k] = tu_alloc(LK_F32, 2, (int64_t[]){R, 1}, 1);
        fill_x(&x, 2.0, C[c].flags & B_SPEC);
        tu_fill_uniform(&res, -2, 2), tu_fill_uniform(&w, -1.5, 1.5);
        tu_snapshot(&o[1]), tu_snapshot(&s[1]);
        tu_saved r0 = tu_save(&res), r1 = {0};
        float ubs = C[c].ub;
        lk_tensor ub = one_scale(&ubs);
        const lk_tensor *tw = C[c].flags & B_NOW ? NULL : &w.t, *tub = ubs > 0 ? &ub : NULL;
        const lk_tensor *tr = C[c].flags & B_RES ? &res.t : NULL;
        for (int ii = 0; ii < ni; ii++) {
            lk_set_isa(isas[ii]);
            tu_restore(&res, &r0);
            lk_status st = lk_rms_norm_dynamic_per_token_quant(&o[0].t, &x.t, tw, &s[0].t, 1e-6f, tub, tr);
            r1 = tu_save(&res);
            tu_restore(&res, &r0);
            lk_status sb = lk_rms_norm_per_block_quant(&o[1].t, &x.t, tw, &s[1].t, 1e-6f, tub, tr, D);
            int ok = st == LK_OK && sb == LK_OK && tu_same(&res, &r1) && tu_same_bits(&o[0], &o[1]) &&
                     tu_same_bits(&s[0], &s[1]) && tu_outside_intact(&o[1]) && tu_outside_intact(&s[1]);
            tu_check(ok, "%s rms_norm_per_block_quant %s (res %s, w %s) -> %s R=%lld D=%lld layout=%d%s%s, "
                     "group_size = D: the per-token op's bits (out, scales, residual)", lk_isa_name(isas[ii]),
                     lk_dtype_name(C[c].xt), tr ? lk_dtype_name(C[c].rt) : "none", tw ? lk_dtype_name(C[c].wt) : "none",
                     lk_dtype_name(C[c].ot), (long long)R, (long long)D, C[c].layout, tub ? " scale_ub" : "",
                     C[c].flags & B_SPEC ? " specials" : "");
            free(r1.bytes);
        }
        free(r0.bytes);
        tu_free(&x), tu_free(&res), tu_free(&w);
        for (int k = 0; k < 2; k++) tu_free(&o[k]), tu_free(&s[k]);
    }
}

/* 1-4 threads bitwise identical on every ISA: 64 rows of 4096 in blocks of 128 with a
 * residual; e4m3 out with row-major scales, i8 out with column-major scales and scale_ub */
static void test_block_threads(void) {
    int64_t R = 64, D = 4096, G = 128;
    tu_buf x = tu_alloc(LK_BF16, 2, (int64_t[]){R, D}, 0), res = tu_alloc(LK_BF16, 2, (int64_t[]){R, D}, 0);
    tu_buf w = tu_alloc(LK_F32, 1, &D, 0);
    tu_fill_uniform(&x, -3, 3), tu_fill_uniform(&res, -3, 3), tu_fill_uniform(&w, -1, 1);
    tu_saved r0 = tu_save(&res);
    float ubv = 1.0f;
    lk_tensor ub = one_scale(&ubv);
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        for (int v = 0; v < 2; v++) {
            tu_buf out = tu_alloc(v ? LK_I8 : LK_F8E4M3, 2, (int64_t[]){R, D}, 0);
            tu_buf sc = group_scales(R, D / G, 0, 2 * v);
            tu_saved first[3] = {{0}}, o0 = tu_save(&out), s0 = tu_save(&sc); /* garbage: every run writes all */
            int ok = 1;
            for (int th = 1; th <= 4; th++) {
                lk_set_num_threads(th);
                tu_restore(&res, &r0), tu_restore(&out, &o0), tu_restore(&sc, &s0);
                ok &= lk_rms_norm_per_block_quant(&out.t, &x.t, &w.t, &sc.t, 1e-6f, v ? &ub : NULL, &res.t, G) == LK_OK;
                if (th == 1) first[0] = tu_save(&out), first[1] = tu_save(&sc), first[2] = tu_save(&res);
                else ok &= tu_same(&out, &first[0]) && tu_same(&sc, &first[1]) && tu_same(&res, &first[2]);
            }
            lk_set_num_threads(0);
            tu_check(ok, "%s rms_norm_per_block_quant R=64 D=4096 G=128 %s: 1-4 threads bitwise identical (out, "
                     "scales, residual)", lk_isa_name(isas[ii]), v ? "i8, column-major scales, scale_ub" : "e4m3");
            for (int k = 0; k < 3; k++) free(first[k].bytes);
            free(o0.bytes), free(s0.bytes);
            tu_free(&out), tu_free(&sc);
        }
    }
    free(r0.bytes);
    tu_free(&x), tu_free(&res), tu_free(&w);
}

/* no rows, or D == 0 (no blocks): LK_OK, nothing written (out, scales, residual intact) */
static void test_block_empty(void) {
    static const int64_t SH[4][3] = {{0, 8}, {2, 0}, {0, 3, 16}, {2, 3, 0}};
    static const int ND[4] = {2, 2, 3, 3};
    int ok = 1;
    for (int c = 0; c < 4; c++) {
        int nd = ND[c];
        int64_t sshape[3] = {SH[c][0], SH[c][1], SH[c][2]};
        sshape[nd - 1] = SH[c][nd - 1] / 8;
        tu_buf x = tu_alloc(LK_F16, nd, SH[c], 1), res = tu_alloc(LK_F32, nd, SH[c], 1);
        tu_buf w = tu_alloc(LK_F32, 1, &SH[c][nd - 1], 0), sc = tu_alloc(LK_F32, nd, sshape, 1);
        tu_snapshot(&x), tu_snapshot(&res), tu_snapshot(&w), tu_snapshot(&sc);
        float ubv = 2.0f;
        lk_tensor ub = one_scale(&ubv);
        for (int ii = 0; ii < ni; ii++) {
            lk_set_isa(isas[ii]);
            for (int oi = 0; oi < 3; oi++) {
                tu_buf out = tu_alloc(QOUT[oi], nd, SH[c], 1);
                tu_snapshot(&out);
                ok &= lk_rms_norm_per_block_quant(&out.t, &x.t, &w.t, &sc.t, 1e-6f, &ub, &res.t, 8) == LK_OK &&
                      lk_rms_norm_per_block_quant(&out.t, &x.t, NULL, &sc.t, 1e-6f, NULL, NULL, 8) == LK_OK &&
                      tu_intact(&x) && tu_intact(&out) && tu_intact(&sc) && tu_intact(&res) && tu_intact(&w);
                /* a flat [rows, 0] for the 3-D input with D == 0, also with strides +-2^62 on
                 * its rows (an empty view's strides are unchecked: no overflow spreading them) */
                if (c == 3) {
                    tu_buf sf = tu_alloc(LK_F32, 2, (int64_t[]){6, 0}, 0);
                    tu_snapshot(&sf);
                    ok &= lk_rms_norm_per_block_quant(&out.t, &x.t, NULL, &sf.t, 1e-6f, NULL, &res.t, 5) == LK_OK &&
                          tu_intact(&sf) && tu_intact(&out);
                    for (int k = 0; k < 2; k++) {
                        lk_tensor big = sf.t;
                        big.stride[0] = k ? -((int64_t)1 << 62) : (int64_t)1 << 62;
                        ok &= lk_rms_norm_per_block_quant(&out.t, &x.t, NULL, &big, 1e-6f, NULL, NULL, 5) == LK_OK &&
                              tu_intact(&sf) && tu_intact(&out);
                    }
                    tu_free(&sf);
                }
                tu_free(&out);
            }
        }
        tu_free(&x), tu_free(&res), tu_free(&w), tu_free(&sc);
    }
    tu_check(ok, "rms_norm_per_block_quant of empty inputs (0 rows, D == 0; 2-D and 3-D; fp8 and i8 outs): LK_OK, "
             "nothing written");
}

/* a 3-D input: scales [2, 3, ng], flat [6, ng], padded, column-major give the same bits
 * (values per (row, block)); a 1-D input: [ng] and [1, ng] */
static void test_block_scale_shapes(void) {
    enum { A = 2, B = 3, D = 96, G = 16, NG = D / G };
    tu_buf x = tu_alloc(LK_F16, 3, (int64_t[]){A, B, D}, 0), out = tu_alloc(LK_F8E5M2, 3, (int64_t[]){A, B, D}, 0);
    tu_buf res = tu_alloc(LK_BF16, 3, (int64_t[]){A, B, D}, 0), w = tu_alloc(LK_BF16, 1, (int64_t[]){D}, 0);
    tu_fill_uniform(&x, -4, 4), tu_fill_uniform(&res, -4, 4), tu_fill_uniform(&w, -1, 1);
    tu_saved r0 = tu_save(&res);
    tu_buf ref = group_scales(A * B, NG, 1, 0);
    int ok = lk_rms_norm_per_block_quant(&out.t, &x.t, &w.t, &ref.t, 1e-6f, NULL, &res.t, G) == LK_OK;
    tu_saved o0 = tu_save(&out), r1 = tu_save(&res);
    for (int sl = 1; sl < GS_FORMS; sl++) {
        tu_buf sc = group_scales(A * B, NG, 1, sl);
        memset(out.t.data, 0, (size_t)(A * B * D));
        tu_restore(&res, &r0);
        ok &= lk_rms_norm_per_block_quant(&out.t, &x.t, &w.t, &sc.t, 1e-6f, NULL, &res.t, G) == LK_OK &&
              tu_same(&out, &o0) && tu_same(&res, &r1);
        for (int64_t k = 0; k < A * B * NG; k++) ok &= tu_get(&sc, k) == tu_get(&ref, k);
        tu_free(&sc);
    }
    /* the 1-D input's one row, i8 out */
    float s1[NG], s2[1][NG];
    int8_t q1[D], q2[D];
    lk_tensor x1 = x.t, o1 = lk_tensor_make(q1, LK_I8, 1, (int64_t[]){D}), o2 = o1;
    x1.ndim = 1, x1.shape[0] = D, x1.stride[0] = 1;
    o2.data = q2;
    lk_tensor t1 = lk_tensor_make(s1, LK_F32, 1, (int64_t[]){NG});
    lk_tensor t2 = lk_tensor_make(s2, LK_F32, 2, (int64_t[]){1, NG});
    ok &= lk_rms_norm_per_block_quant(&o1, &x1, &w.t, &t1, 1e-6f, NULL, NULL, G) == LK_OK &&
          lk_rms_norm_per_block_quant(&o2, &x1, &w.t, &t2, 1e-6f, NULL, NULL, G) == LK_OK && !memcmp(q1, q2, D) &&
          !memcmp(s1, s2, sizeof s1);
    tu_check(ok, "rms_norm_per_block_quant of a 3-D input: scales [2, 3, ng], flat [6, ng], padded and column-major "
             "give the same bits (out, scales, residual); a 1-D input: [ng] and [1, ng]");
    free(o0.bytes), free(r0.bytes), free(r1.bytes);
    tu_free(&x), tu_free(&out), tu_free(&res), tu_free(&w), tu_free(&ref);
}

#define bexpect(...) op_expect("lk_rms_norm_per_block_quant", __VA_ARGS__)

static void test_block_errors(void) {
    int64_t R = 3, D = 20, G = 4, NG = D / G;
    tu_buf x = tu_alloc(LK_BF16, 2, (int64_t[]){R, D}, 0), out = tu_alloc(LK_F8E4M3, 2, (int64_t[]){R, D}, 0);
    tu_buf res = tu_alloc(LK_F32, 2, (int64_t[]){R, D}, 0), w = tu_alloc(LK_BF16, 1, &D, 0);
    tu_buf sc = tu_alloc(LK_F32, 2, (int64_t[]){R, NG}, 0), sc16 = tu_alloc(LK_F16, 2, (int64_t[]){R, NG}, 0);
    tu_buf ob = tu_alloc(LK_BF16, 2, (int64_t[]){R, D}, 0), big = tu_alloc(LK_F32, 2, (int64_t[]){7, 6}, 0);
    tu_buf x3 = tu_alloc(LK_BF16, 3, (int64_t[]){2, 3, D}, 0), o3 = tu_alloc(LK_F8E4M3, 3, (int64_t[]){2, 3, D}, 0);
    tu_buf ub = tu_alloc(LK_F32, 1, (int64_t[]){1}, 0), ub16 = tu_alloc(LK_F16, 1, (int64_t[]){1}, 0);
    tu_buf o8 = tu_alloc(LK_I8, 2, (int64_t[]){R, D}, 0);
    tu_fill_uniform(&x, -1, 1), tu_fill_uniform(&res, -1, 1), tu_fill_uniform(&w, -1, 1), tu_fill_uniform(&x3, -1, 1);
    tu_set(&ub, 0, 2.0), tu_set(&ub16, 0, 2.0);
    tu_buf *all[] = {&x, &out, &res, &w, &sc, &sc16, &ob, &big, &x3, &o3, &ub, &ub16, &o8};
    int nb = 13;
    for (int b = 0; b < nb; b++) tu_snapshot(all[b]);
    const float e = 1e-6f;
#define BQ(o, xx, ww, s, ep, u, r, g) lk_rms_norm_per_block_quant(o, xx, ww, s, ep, u, r, g)
    bexpect(BQ(NULL, &x.t, &w.t, &sc.t, e, &ub.t, &res.t, G), LK_ERR_NULL, "out", all, nb, "block: NULL out");
    bexpect(BQ(&out.t, NULL, &w.t, &sc.t, e, &ub.t, &res.t, G), LK_ERR_NULL, "input", all, nb, "block: NULL input");
    bexpect(BQ(&out.t, &x.t, &w.t, NULL, e, &ub.t, &res.t, G), LK_ERR_NULL, "scales", all, nb, "block: NULL scales");
    lk_tensor nd = sc.t;
    nd.data = NULL;
    bexpect(BQ(&out.t, &x.t, &w.t, &nd, e, NULL, NULL, G), LK_ERR_NULL, "scales", all, nb,
            "block: scales with NULL data");
    /* group_size (the i8 out too) */
    static const int64_t BADG[] = {0, -1, -128, INT64_MIN};
    for (size_t k = 0; k < sizeof BADG / sizeof BADG[0]; k++) {
        char what[96];
        snprintf(what, sizeof what, "block: group_size %lld", (long long)BADG[k]);
        bexpect(BQ(k & 1 ? &o8.t : &out.t, &x.t, &w.t, &sc.t, e, &ub.t, &res.t, BADG[k]), LK_ERR_VALUE, "group_size",
                all, nb, what);
    }
    static const int64_t NDIV[] = {8, 3, 40, 21, INT64_MAX};
    for (size_t k = 0; k < sizeof NDIV / sizeof NDIV[0]; k++) {
        char what[96];
        snprintf(what, sizeof what, "block: group_size %lld not dividing D 20", (long long)NDIV[k]);
        bexpect(BQ(k & 1 ? &o8.t : &out.t, &x.t, &w.t, &sc.t, e, NULL, &res.t, NDIV[k]), LK_ERR_SHAPE, "group_size",
                all, nb, what);
    }
    /* epsilon */
    static const float BADE[] = {-1.0f, -FLT_MIN, NAN, INFINITY, -INFINITY};
    for (size_t k = 0; k < sizeof BADE / sizeof BADE[0]; k++) {
        char what[96];
        snprintf(what, sizeof what, "block: epsilon %g", (double)BADE[k]);
        bexpect(BQ(&out.t, &x.t, &w.t, &sc.t, BADE[k], NULL, &res.t, G), LK_ERR_VALUE, "epsilon", all, nb, what);
    }
    /* scale_ub: finite and > 0, f32, one element */
    static const float BADU[] = {0.0f, -1.0f, NAN, INFINITY};
    for (size_t k = 0; k < sizeof BADU / sizeof BADU[0]; k++) {
        tu_set(&ub, 0, BADU[k]);
        tu_snapshot(&ub);
        char what[96];
        snprintf(what, sizeof what, "block: scale_ub %g", (double)BADU[k]);
        bexpect(BQ(k & 1 ? &o8.t : &out.t, &x.t, &w.t, &sc.t, e, &ub.t, &res.t, G), LK_ERR_VALUE, "scale_ub", all,
                nb, what);
    }
    tu_set(&ub, 0, 2.0);
    tu_snapshot(&ub);
    bexpect(BQ(&out.t, &x.t, &w.t, &sc.t, e, &ub16.t, &res.t, G), LK_ERR_DTYPE, "scale_ub", all, nb,
            "block: f16 scale_ub");
    lk_tensor ub2 = lk_tensor_make(sc16.t.data, LK_F32, 1, (int64_t[]){2});
    bexpect(BQ(&out.t, &x.t, &w.t, &sc.t, e, &ub2, &res.t, G), LK_ERR_SHAPE, "scale_ub", all, nb,
            "block: scale_ub [2]");
    /* scales: dtype, shapes, self overlap, overlaps */
    bexpect(BQ(&out.t, &x.t, &w.t, &sc16.t, e, NULL, NULL, G), LK_ERR_DTYPE, "scales", all, nb, "block: f16 scales");
    lk_tensor si = sc.t;
    si.dtype = LK_I32;
    bexpect(BQ(&o8.t, &x.t, &w.t, &si, e, NULL, NULL, G), LK_ERR_DTYPE, "scales", all, nb, "block: i32 scales");
    static const int64_t BADSH[][3] = {{3, 6}, {4, 5}, {2, 5}, {5, 3}, {15}, {3, 5, 1}, {1, 3, 5}, {3, 1}, {3}};
    static const int BADND[] = {2, 2, 2, 2, 1, 3, 3, 2, 1};
    for (size_t k = 0; k < sizeof BADND / sizeof BADND[0]; k++) {
        lk_tensor t = lk_tensor_make(big.t.data, LK_F32, BADND[k], BADSH[k]);
        char what[96];
        snprintf(what, sizeof what, "block: scales %s for input [3, 20] G 4", lk_shape_str(&t));
        bexpect(BQ(k & 1 ? &o8.t : &out.t, &x.t, &w.t, &t, e, NULL, &res.t, G), LK_ERR_SHAPE, "scales", all, nb, what);
    }
    static const int64_t BAD3[][3] = {{3, 2, 5}, {2, 3, 1}, {6, 5, 1}, {30}, {2, 15}, {1, 6, 5}, {6}, {6, 1}};
    static const int BAD3ND[] = {3, 3, 3, 1, 2, 3, 1, 2};
    for (size_t k = 0; k < sizeof BAD3ND / sizeof BAD3ND[0]; k++) {
        lk_tensor t = lk_tensor_make(big.t.data, LK_F32, BAD3ND[k], BAD3[k]);
        char what[96];
        snprintf(what, sizeof what, "block: scales %s for input [2, 3, 20] G 4", lk_shape_str(&t));
        bexpect(BQ(&o3.t, &x3.t, NULL, &t, e, NULL, NULL, G), LK_ERR_SHAPE, "scales", all, nb, what);
    }
    lk_tensor s0 = sc.t;
    s0.stride[0] = 0;
    bexpect(BQ(&out.t, &x.t, &w.t, &s0, e, NULL, NULL, G), LK_ERR_ALIAS, "scales", all, nb,
            "block: scales with a zero stride");
    lk_tensor so = lk_tensor_make(out.t.data, LK_F32, 2, (int64_t[]){R, NG}); /* 60 bytes over out's 60 */
    bexpect(BQ(&out.t, &x.t, &w.t, &so, e, NULL, NULL, G), LK_ERR_ALIAS, "scales", all, nb,
            "block: scales overlapping out");
    lk_tensor sx = lk_tensor_make((char *)x.t.data + 8, LK_F32, 2, (int64_t[]){R, NG});
    bexpect(BQ(&out.t, &x.t, &w.t, &sx, e, NULL, NULL, G), LK_ERR_ALIAS, "scales", all, nb,
            "block: scales overlapping input");
    lk_tensor sw = lk_tensor_make((char *)w.t.data + 4, LK_F32, 2, (int64_t[]){1, NG}); /* w: 40 bytes */
    lk_tensor x1 = x.t, o1 = out.t;
    x1.shape[0] = o1.shape[0] = 1;
    bexpect(BQ(&o1, &x1, &w.t, &sw, e, NULL, NULL, G), LK_ERR_ALIAS, "scales", all, nb,
            "block: scales overlapping weight");
    lk_tensor sr = lk_tensor_make((char *)res.t.data + 100, LK_F32, 2, (int64_t[]){R, NG});
    bexpect(BQ(&out.t, &x.t, &w.t, &sr, e, NULL, &res.t, G), LK_ERR_ALIAS, "scales", all, nb,
            "block: scales overlapping residual");
    lk_tensor su = lk_tensor_make((char *)sc.t.data + 4 * 7, LK_F32, 1, (int64_t[]){1}); /* scale_ub in scales */
    memcpy(su.data, &(float){2.0f}, 4);
    for (int b = 0; b < nb; b++) tu_snapshot(all[b]);
    bexpect(BQ(&out.t, &x.t, &w.t, &sc.t, e, &su, &res.t, G), LK_ERR_ALIAS, "scales", all, nb,
            "block: scale_ub inside scales");
    /* scale_ub inside a written tensor (its value valid: 2) */
    memcpy(out.t.data, &(float){2.0f}, 4), memcpy(res.t.data, &(float){2.0f}, 4);
    for (int b = 0; b < nb; b++) tu_snapshot(all[b]);
    lk_tensor uo = lk_tensor_make(out.t.data, LK_F32, 1, (int64_t[]){1});
    lk_tensor ur = lk_tensor_make(res.t.data, LK_F32, 0, NULL);
    bexpect(BQ(&out.t, &x.t, &w.t, &sc.t, e, &uo, NULL, G), LK_ERR_ALIAS, "out and scale_ub", all, nb,
            "block: scale_ub in out");
    bexpect(BQ(&out.t, &x.t, &w.t, &sc.t, e, &ur, &res.t, G), LK_ERR_ALIAS, "residual and scale_ub", all, nb,
            "block: scale_ub in residual");
    /* out, input, weight, residual */
    bexpect(BQ(&ob.t, &x.t, &w.t, &sc.t, e, NULL, NULL, G), LK_ERR_DTYPE, "out", all, nb, "block: bf16 out");
    bexpect(BQ(&out.t, &out.t, &w.t, &sc.t, e, NULL, NULL, G), LK_ERR_DTYPE, "input", all, nb, "block: fp8 input");
    lk_tensor x8 = x.t;
    x8.dtype = LK_I8;
    bexpect(BQ(&o8.t, &x8, &w.t, &sc.t, e, NULL, NULL, G), LK_ERR_DTYPE, "input", all, nb, "block: i8 input");
    bexpect(BQ(&o3.t, &x.t, &w.t, &sc.t, e, NULL, NULL, G), LK_ERR_SHAPE, "out", all, nb,
            "block: out [2, 3, 20] for input [3, 20]");
    lk_tensor ox = lk_tensor_make(x.t.data, LK_F8E4M3, 2, (int64_t[]){R, D});
    bexpect(BQ(&ox, &x.t, &w.t, &sc.t, e, NULL, NULL, G), LK_ERR_ALIAS, "out", all, nb, "block: out overlapping input");
    lk_tensor w2 = lk_tensor_make(big.t.data, LK_F32, 1, (int64_t[]){D + 1});
    bexpect(BQ(&out.t, &x.t, &w2, &sc.t, e, NULL, NULL, G), LK_ERR_SHAPE, "weight", all, nb, "block: weight [21]");
    lk_tensor w8 = w.t;
    w8.dtype = LK_F8E4M3;
    bexpect(BQ(&out.t, &x.t, &w8, &sc.t, e, NULL, NULL, G), LK_ERR_DTYPE, "weight", all, nb, "block: fp8 weight");
    lk_tensor xr = x.t;
    bexpect(BQ(&out.t, &x.t, &w.t, &sc.t, e, NULL, &xr, G), LK_ERR_ALIAS, "residual", all, nb,
            "block: residual = input");
    lk_tensor r3 = res.t;
    r3.shape[1] = 16;
    bexpect(BQ(&out.t, &x.t, &w.t, &sc.t, e, NULL, &r3, G), LK_ERR_SHAPE, "residual", all, nb,
            "block: residual [3, 16] for input [3, 20]");
    lk_tensor r0s = res.t;
    r0s.stride[0] = 0;
    bexpect(BQ(&out.t, &x.t, &w.t, &sc.t, e, NULL, &r0s, G), LK_ERR_ALIAS, "residual", all, nb,
            "block: residual with a zero stride");
#undef BQ
    /* the valid calls, for contrast: G = D (one block: scales [R, 1]), G = 1, epsilon 0 */
    lk_tensor s1 = lk_tensor_make(big.t.data, LK_F32, 2, (int64_t[]){R, 1});
    lk_tensor sg = lk_tensor_make(big.t.data, LK_F32, 2, (int64_t[]){R, D});
    tu_buf sbig = tu_alloc(LK_F32, 2, (int64_t[]){R, D}, 0);
    sg.data = sbig.t.data;
    int ok = lk_rms_norm_per_block_quant(&out.t, &x.t, &w.t, &s1, e, NULL, NULL, D) == LK_OK &&
             lk_rms_norm_per_block_quant(&o8.t, &x.t, NULL, &sg, 0.0f, &ub.t, &res.t, 1) == LK_OK;
    tu_check(ok, "rms_norm_per_block_quant: G = D, G = 1 with epsilon 0 accepted (%s)", lk_last_error());
    tu_free(&sbig);
    for (int b = 0; b < nb; b++) tu_free(all[b]);
}

int main(void) {
    tu_init();
    ni = tu_isas(isas);
    test_quant_grid();
    test_quant_specials();
    test_norm_grid();
    test_i8_convert();
    test_merge_grid();
    test_threads();
    test_empty();
    test_scale_shapes();
    test_errors();
    test_group_grid();
    test_group_specials();
    test_i8_trunc_convert();
    test_group_specials_i8();
    test_group_threads();
    test_group_empty();
    test_group_scale_shapes();
    test_group_errors();
    test_sgrid_grid();
    test_sgrid_specials();
    test_sgrid_scale_forms();
    test_sgrid_threads();
    test_sgrid_empty();
    test_sgrid_errors();
    test_block_grid();
    test_block_as_token();
    test_block_threads();
    test_block_empty();
    test_block_scale_shapes();
    test_block_errors();
    lk_set_isa(isas[ni - 1]);
    return tu_finish("test_fp8_act");
}
