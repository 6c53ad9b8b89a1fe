/*
 * fp8 activations: lk_static_scaled_fp8_quant, lk_dynamic_scaled_fp8_quant,
 * lk_dynamic_per_token_scaled_fp8_quant, lk_rms_norm_static_fp8_quant,
 * lk_fused_add_rms_norm_static_fp8_quant, lk_rms_norm_dynamic_per_token_quant and
 * lk_merge_attn_states_scaled.
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
 * Also: NaN / inf / saturation, empty inputs, thread-count independence (1-4 threads,
 * bitwise) and the bad-input catalogue (status, message naming the argument, every
 * buffer intact).
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
    lk_set_isa(isas[ni - 1]);
    return tu_finish("test_fp8_act");
}
