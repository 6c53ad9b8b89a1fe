/*
 * int8 activations: lk_static_scaled_int8_quant and lk_dynamic_scaled_int8_quant (vLLM's
 * scaled_int8_quant), symmetric and asymmetric.
 *
 * Every ISA against ref bit for bit over the outputs' WHOLE allocations (written
 * elements, padding garbage, guard zones), scales and zero points included; ref against
 * float64: every code within half an integer step of clamp(x / scale + azp) (plus the f32
 * division's or reciprocal product's relative 1e-6 of |x / scale|), NaN giving azp (0
 * symmetric); dynamic scales and zero points exactly the f32 formulas of the exact
 * absmax / min / max (vLLM's arithmetic: absmax / 127, (max - min) / 255,
 * rn(-128 - min / s)). Grid: the four paths x input dtypes f32 / f16 / bf16, D = 1, 3, 7,
 * 16, 33, 130, 4097, rows 1..5, contiguous and strided (padding garbage) views, a non-unit
 * last stride (the reference fallback), [rows] and [rows, 1] scales / zero points.
 * Also: the code converter (ties to even, saturation, the int32 stage of the asymmetric
 * form, NaN), special rows (all-zero, constant, all-NaN, NaN and inf elements), empty
 * inputs, thread-count independence (1-4 threads, bitwise) and the bad-input catalogue
 * (status, message naming the argument, every buffer intact).
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/int8_quant.h"
#include "testutil.h"

static lk_isa isas[TU_MAX_ISAS];
static int ni;

enum { S_SYM, S_ASYM, D_SYM, D_ASYM, NPATH };
static const char *PN[NPATH] = {"static sym", "static asym", "dynamic sym", "dynamic asym"};

static lk_status quant_call(int path, const lk_tensor *out, const lk_tensor *x, const lk_tensor *sc,
                            const lk_tensor *azp) {
    if (path == S_SYM) return lk_static_scaled_int8_quant(out, x, sc, NULL);
    if (path == S_ASYM) return lk_static_scaled_int8_quant(out, x, sc, azp);
    return lk_dynamic_scaled_int8_quant(out, x, sc, path == D_ASYM ? azp : NULL);
}

/* code q vs y = float64 x / scale and zero point azp: within half a step (plus rel |y|) of
 * clamp(y + azp); a NaN y gives clamp(azp) */
static int code_close(double y, double azp, double q, double rel) {
    double c = isnan(y) ? azp : y + azp;
    c = c > 127 ? 127 : c < -128 ? -128 : c;
    double slack = isnan(y) ? 0 : 0.5 + fabs(y) * rel + 1e-9;
    return q == rint(q) && q >= -128 && q <= 127 && fabs(q - c) <= slack;
}


/* ---------------------------------------------------------------- the grid */

/* float64 / f32-formula check of the reference's results of one call */
static int check_f64(int path, const tu_buf *x, const tu_buf *out, const tu_buf *sc, const tu_buf *zp, float scale,
                     int32_t azp, int64_t R, int64_t D) {
    int ok = 1;
    for (int64_t r = 0; r < R; r++) {
        double s = scale, z = path == S_ASYM ? azp : 0;
        if (path == D_SYM) {
            float m = 0;
            for (int64_t i = 0; i < D; i++) {
                float v = fabsf((float)tu_get(x, r * D + i));
                if (v > m) m = v;
            }
            float want = m / 127.0f;
            ok &= (float)tu_get(sc, r) == want;
            s = m == 0 ? 0 : (double)m / 127.0;
        } else if (path == D_ASYM) {
            float mn = INFINITY, mx = -INFINITY;
            for (int64_t i = 0; i < D; i++) {
                float v = (float)tu_get(x, r * D + i);
                if (v < mn) mn = v;
                if (v > mx) mx = v;
            }
            if (mn > mx) mn = mx = 0;
            float want = (mx - mn) / 255.0f;
            int32_t wz = 0;
            if (want != 0) {
                float zf = rintf(-128.0f - mn / want);
                wz = isnan(zf) ? 0 : zf >= 2147483648.0f ? INT32_MAX : zf <= -2147483648.0f ? INT32_MIN : (int32_t)zf;
            }
            ok &= (float)tu_get(sc, r) == want && tu_get(zp, r) == wz;
            s = want, z = wz;
            if (want != 0 && isfinite(mn) && isfinite(mx)) /* the row's min and max at the ends of the range */
                ok &= fabs((double)mn / want + wz + 128) <= 1.0 + 1e-5 * fabs(mn / want) &&
                      fabs((double)mx / want + wz - 127) <= 1.0 + 1e-5 * fabs(mx / want);
        }
        for (int64_t i = 0; i < D; i++) {
            double v = tu_get(x, r * D + i), q = tu_get(out, r * D + i);
            if (s == 0) ok &= q == 0; /* a dynamic all-zero / constant row */
            else ok &= code_close(v / s, z, q, 1e-6);
        }
    }
    return ok;
}

static void quant_case(int path, lk_dtype xt, int64_t R, int64_t D, int layout, int scale2d, int specials) {
    tu_buf x = tu_alloc_rows(xt, R, D, layout), out = tu_alloc_rows(LK_I8, R, D, layout == 2 ? 1 : layout);
    tu_fill_uniform(&x, -3, 3);
    int64_t n = R * D;
    if (n > 2) tu_set(&x, n / 2, 0.0);
    if (path == D_ASYM && R > 1 && D > 4) /* an off-centre row: the zero point far from 0 */
        for (int64_t i = 0; i < D; i++) tu_set(&x, D + i, 5.0 + tu_get(&x, D + i));
    if (specials && n > 5) tu_set(&x, 1, NAN), tu_set(&x, 3, 1e6);
    int dyn = path >= D_SYM;
    tu_buf sc = dyn ? tu_alloc(LK_F32, scale2d ? 2 : 1, (int64_t[]){R, 1}, 1) : tu_alloc(LK_F32, 1, (int64_t[]){1}, 0);
    tu_buf zp = dyn ? tu_alloc(LK_I32, scale2d ? 2 : 1, (int64_t[]){R, 1}, 1) : tu_alloc(LK_I32, 1, (int64_t[]){1}, 0);
    float scale = 0.0137f;
    int32_t azp = path == S_ASYM ? -37 + (int32_t)(D % 50) : 0;
    if (!dyn) tu_set(&sc, 0, scale), tu_set(&zp, 0, azp);
    tu_snapshot(&out), tu_snapshot(&sc), tu_snapshot(&zp);
    tu_saved o0 = tu_save(&out), s0 = tu_save(&sc), z0 = tu_save(&zp), oref = {0}, sref = {0}, zref = {0};
    int okall = 1, f64 = 1;
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        tu_restore(&out, &o0), tu_restore(&sc, &s0), tu_restore(&zp, &z0);
        lk_status s = quant_call(path, &out.t, &x.t, &sc.t, &zp.t);
        if (!tu_check(s == LK_OK, "%s int8 quant %s: %s", lk_isa_name(isas[ii]), PN[path], lk_last_error())) continue;
        if (ii > 0) {
            okall &= tu_same(&out, &oref) && tu_same(&sc, &sref) && tu_same(&zp, &zref);
            continue;
        }
        oref = tu_save(&out), sref = tu_save(&sc), zref = tu_save(&zp);
        f64 &= tu_outside_intact(&out) && tu_outside_intact(&sc) && tu_outside_intact(&zp);
        if (!dyn) f64 &= tu_intact(&sc) && tu_intact(&zp);
        if (path == D_SYM) f64 &= tu_intact(&zp);
        f64 &= check_f64(path, &x, &out, &sc, &zp, scale, azp, R, D);
    }
    tu_check(f64, "int8 quant %s %s R=%lld D=%lld layout=%d%s%s: ref within half a step of float64, scales / zero "
             "points as the formulas, nothing else written", PN[path], lk_dtype_name(xt), (long long)R, (long long)D,
             layout, scale2d ? " [R, 1]" : "", specials ? " specials" : "");
    tu_check(okall, "int8 quant %s %s R=%lld D=%lld layout=%d: every ISA bit-identical to ref (whole allocations)",
             PN[path], lk_dtype_name(xt), (long long)R, (long long)D, layout);
    free(o0.bytes), free(s0.bytes), free(z0.bytes), free(oref.bytes), free(sref.bytes), free(zref.bytes);
    tu_free(&x), tu_free(&out), tu_free(&sc), tu_free(&zp);
}

static void test_grid(void) {
    static const int64_t DS[] = {1, 3, 7, 16, 33, 130, 4097};
    for (int p = 0; p < NPATH; p++)
        for (int xi = 0; xi < 3; xi++)
            for (int di = 0; di < 7; di++)
                for (int layout = 0; layout < 3; layout++) {
                    int64_t D = DS[di], R = D > 1000 ? 2 : 1 + (di + layout) % 5;
                    quant_case(p, TU_FLOAT_DTYPES[xi], R, D, layout, di & 1, 0);
                }
    for (int p = 0; p < NPATH; p++) quant_case(p, LK_F32, 3, 37, p & 1, 1, 1);
}

/* ---------------------------------------------------------------- converter and specials */

/* the code converter: ties to even, saturation, NaN, the int32 stage of the zero point */
static void test_code(void) {
    static const float V[] = {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 0.49999997f, 126.5f, 127.5f, -128.5f, 1e9f,
                              -1e9f, INFINITY, -INFINITY, NAN, -0.0f};
    static const int W[] = {0, 2, 2, 0, -2, -2, 0, 126, 127, -128, 127, -128, 127, -128, 0, 0};
    int ok = 1;
    for (size_t i = 0; i < sizeof V / sizeof V[0]; i++) ok &= lk_i8q_code(V[i], 0) == W[i];
    /* asymmetric: sat32(rn(v)) + azp in 64 bits, then sat8 */
    ok &= lk_i8q_code(2.5f, 3) == 5 && lk_i8q_code(NAN, -20) == -20 && lk_i8q_code(NAN, 1000) == 127;
    ok &= lk_i8q_code(1e30f, INT32_MIN) == -1 && lk_i8q_code(3e9f, INT32_MAX) == 127;
    ok &= lk_i8q_code(-1e30f, INT32_MAX) == -1 && lk_i8q_code(2147483520.0f, -2147483600) == -80;
    tu_check(ok, "int8 code: ties to even, saturation to [-128, 127] (inf too), NaN -> 0 + azp, sat32 before the "
             "zero point, the sum exact");
}

/* special rows on every ISA (D = 40: full vectors and a tail) */
static void test_specials(void) {
    enum { R = 6, D = 40 };
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        const char *isa = lk_isa_name(isas[ii]);
        float x[R][D], s1 = 0.5f, sc[R];
        int8_t q[R][D];
        int32_t z1 = 10, zp[R];
        lk_tensor tx = lk_tensor_make(x, LK_F32, 2, (int64_t[]){R, D}), tq = lk_tensor_make(q, LK_I8, 2, (int64_t[]){R, D});
        lk_tensor ts1 = lk_tensor_make(&s1, LK_F32, 1, (int64_t[]){1}), tz1 = lk_tensor_make(&z1, LK_I32, 1, (int64_t[]){1});
        lk_tensor tsc = lk_tensor_make(sc, LK_F32, 1, (int64_t[]){R}), tzp = lk_tensor_make(zp, LK_I32, 1, (int64_t[]){R});
        /* static: x / 0.5; ties to even (0.25 / 0.5 = 0.5 -> 0, 0.75 -> 2, 1.25 -> 2), saturation,
         * NaN -> 0, -0 -> 0 */
        for (int r = 0; r < R; r++)
            for (int i = 0; i < D; i++) x[r][i] = (float)(i % 9) - 4.0f;
        x[0][0] = 0.25f, x[0][1] = 0.75f, x[0][2] = 1.25f, x[0][3] = INFINITY, x[0][4] = -INFINITY, x[0][5] = 1e30f,
        x[0][6] = NAN, x[0][7] = -0.0f, x[0][8] = 63.75f, x[0][9] = -64.25f;
        lk_static_scaled_int8_quant(&tq, &tx, &ts1, NULL);
        int ok = q[0][0] == 0 && q[0][1] == 2 && q[0][2] == 2 && q[0][3] == 127 && q[0][4] == -128 && q[0][5] == 127 &&
                 q[0][6] == 0 && q[0][7] == 0 && q[0][8] == 127 && q[0][9] == -128 && q[1][0] == -8 && q[5][D - 1] == -2;
        tu_check(ok, "%s static_scaled_int8_quant: ties to even, +-inf and beyond-range saturate, NaN and -0 -> 0", isa);
        /* static asymmetric, azp 10: x * (1 / 0.5) rounded, + 10, saturated; NaN -> 10 */
        lk_static_scaled_int8_quant(&tq, &tx, &ts1, &tz1);
        ok = q[0][0] == 10 && q[0][1] == 12 && q[0][2] == 12 && q[0][3] == 127 && q[0][4] == -128 && q[0][5] == 127 &&
             q[0][6] == 10 && q[0][7] == 10 && q[0][8] == 127 && q[0][9] == -118 && q[1][0] == 2;
        tu_check(ok, "%s static_scaled_int8_quant (azp 10): codes + azp, saturated after the add, NaN -> azp", isa);
        /* the int32 stage: scale 1, azp -2147483600: 2147483520 -> -80, >= 2^31 -> INT32_MAX + azp = 47,
         * -1e10 -> -128; azp INT32_MAX: -2^31 -> -1, 0 -> 127 */
        s1 = 1.0f, z1 = -2147483600;
        x[1][0] = 2147483520.0f, x[1][1] = 2147483648.0f, x[1][2] = 3e9f, x[1][3] = -1e10f, x[1][4] = NAN;
        lk_static_scaled_int8_quant(&tq, &tx, &ts1, &tz1);
        ok = q[1][0] == -80 && q[1][1] == 47 && q[1][2] == 47 && q[1][3] == -128 && q[1][4] == -128;
        z1 = INT32_MAX;
        x[1][0] = -2147483648.0f, x[1][1] = -3e9f, x[1][2] = 0.0f, x[1][3] = 1e30f;
        lk_static_scaled_int8_quant(&tq, &tx, &ts1, &tz1);
        ok &= q[1][0] == -1 && q[1][1] == -1 && q[1][2] == 127 && q[1][3] == 127 && q[1][4] == 127;
        tu_check(ok, "%s static_scaled_int8_quant: round(x / scale) saturates to int32 before the zero point, the sum "
                 "saturates (no wrap)", isa);
        /* dynamic: row 0 NaN ignored by the absmax / min / max; row 1 all zero; row 2 constant;
         * row 3 all NaN; row 4 an inf; row 5 values -3..5 (asym: min -3, max 5) */
        for (int r = 0; r < R; r++)
            for (int i = 0; i < D; i++) x[r][i] = (float)(i % 9) - 3.0f;
        x[0][5] = NAN;
        for (int i = 0; i < D; i++) x[1][i] = i % 2 ? 0.0f : -0.0f, x[2][i] = 2.5f, x[3][i] = NAN;
        x[4][7] = INFINITY;
        lk_dynamic_scaled_int8_quant(&tq, &tx, &tsc, NULL);
        ok = sc[0] == 5.0f / 127.0f && q[0][5] == 0 && q[0][8] == 127 && q[0][0] == (int8_t)rintf(-3.0f * (127.0f / 5.0f));
        ok &= sc[1] == 0.0f && sc[3] == 0.0f && sc[2] == 2.5f / 127.0f && isinf(sc[4]);
        for (int i = 0; i < D; i++) ok &= q[1][i] == 0 && q[3][i] == 0 && q[4][i] == 0 && q[2][i] == 127;
        tu_check(ok, "%s dynamic_scaled_int8_quant: NaN ignored by the absmax and coded 0; all-zero and all-NaN rows "
                 "scale 0, codes 0; an inf row scale inf, codes 0", isa);
        lk_dynamic_scaled_int8_quant(&tq, &tx, &tsc, &tzp);
        float s5 = 8.0f / 255.0f;
        int32_t z5 = (int32_t)rintf(-128.0f + 3.0f / s5);
        ok = sc[5] == s5 && zp[5] == z5 && sc[0] == s5 && zp[0] == z5 && q[0][5] == z5 && q[5][0] == -128 &&
             q[5][8] == 127;
        ok &= sc[1] == 0.0f && !signbit(sc[1]) && zp[1] == 0 && sc[2] == 0.0f && zp[2] == 0 && sc[3] == 0.0f && zp[3] == 0;
        ok &= isinf(sc[4]) && zp[4] == -128;
        for (int i = 0; i < D; i++) ok &= q[1][i] == 0 && q[2][i] == 0 && q[3][i] == 0 && q[4][i] == -128;
        tu_check(ok, "%s dynamic_scaled_int8_quant (asym): min -> -128, max -> 127, NaN -> azp; all-zero, constant "
                 "and all-NaN rows scale +0, azp 0, codes 0; an inf row scale inf, azp -128, codes azp", isa);
        /* one infinity as the only non-NaN value: s = NaN (inf - inf), azp 0, codes 0 */
        for (int i = 0; i < D; i++) x[3][i] = i == 4 ? INFINITY : NAN;
        lk_dynamic_scaled_int8_quant(&tq, &tx, &tsc, &tzp);
        ok = isnan(sc[3]) && zp[3] == 0;
        for (int i = 0; i < D; i++) ok &= q[3][i] == 0;
        tu_check(ok, "%s dynamic_scaled_int8_quant (asym): a row of one infinity and NaN: scale NaN, azp 0, codes 0",
                 isa);
    }
}

/* ---------------------------------------------------------------- threads, empty, errors */

static void test_threads(void) {
    int64_t R = 96, D = 4096;
    tu_buf x = tu_alloc(LK_BF16, 2, (int64_t[]){R, D}, 0), out = tu_alloc(LK_I8, 2, (int64_t[]){R, D}, 0);
    tu_buf sc = tu_alloc(LK_F32, 1, &R, 0), zp = tu_alloc(LK_I32, 1, &R, 0);
    tu_fill_uniform(&x, -3, 3);
    for (int64_t i = 0; i < D; i++) tu_set(&x, 5 * D + i, 4.0 + tu_get(&x, 5 * D + i));
    float s1 = 0.02f;
    int32_t z1 = 5;
    lk_tensor one = lk_tensor_make(&s1, LK_F32, 1, (int64_t[]){1}), tz = lk_tensor_make(&z1, LK_I32, 1, (int64_t[]){1});
    for (int path = 0; path < NPATH; path++) {
        tu_saved first[3] = {{0}};
        int ok = 1;
        for (int th = 1; th <= 4; th++) {
            lk_set_num_threads(th);
            lk_status s = path < D_SYM ? quant_call(path, &out.t, &x.t, &one, &tz) : quant_call(path, &out.t, &x.t, &sc.t, &zp.t);
            ok &= s == LK_OK;
            if (th == 1) first[0] = tu_save(&out), first[1] = tu_save(&sc), first[2] = tu_save(&zp);
            else ok &= tu_same(&out, &first[0]) && tu_same(&sc, &first[1]) && tu_same(&zp, &first[2]);
        }
        lk_set_num_threads(0);
        tu_check(ok, "int8 quant %s: 1-4 threads bitwise identical (out, scales, zero points)", PN[path]);
        for (int k = 0; k < 3; k++) free(first[k].bytes);
    }
    tu_free(&x), tu_free(&out), tu_free(&sc), tu_free(&zp);
}

static void test_empty(void) {
    float s = 1.0f, sc[2] = {-5, -5}, dummy = 7;
    int32_t z = 3, zp[2] = {-7, -7};
    int8_t q[4] = {9, 9, 9, 9};
    lk_tensor x0 = lk_tensor_make(&dummy, LK_F32, 2, (int64_t[]){0, 8}), o0 = lk_tensor_make(q, LK_I8, 2, (int64_t[]){0, 8});
    lk_tensor one = lk_tensor_make(&s, LK_F32, 1, (int64_t[]){1}), tz = lk_tensor_make(&z, LK_I32, 1, (int64_t[]){1});
    lk_tensor s0 = lk_tensor_make(sc, LK_F32, 1, (int64_t[]){0}), z0 = lk_tensor_make(zp, LK_I32, 1, (int64_t[]){0});
    int ok = lk_static_scaled_int8_quant(&o0, &x0, &one, NULL) == LK_OK &&
             lk_static_scaled_int8_quant(&o0, &x0, &one, &tz) == LK_OK &&
             lk_dynamic_scaled_int8_quant(&o0, &x0, &s0, NULL) == LK_OK &&
             lk_dynamic_scaled_int8_quant(&o0, &x0, &s0, &z0) == LK_OK && q[0] == 9 && sc[0] == -5 && zp[0] == -7;
    tu_check(ok, "int8 quant: 0 rows is valid and writes nothing");
    lk_tensor x2 = lk_tensor_make(&dummy, LK_F32, 2, (int64_t[]){2, 0}), o2 = lk_tensor_make(q, LK_I8, 2, (int64_t[]){2, 0});
    lk_tensor s2 = lk_tensor_make(sc, LK_F32, 2, (int64_t[]){2, 1}), z2 = lk_tensor_make(zp, LK_I32, 1, (int64_t[]){2});
    ok = lk_static_scaled_int8_quant(&o2, &x2, &one, &tz) == LK_OK && q[0] == 9;
    ok &= lk_dynamic_scaled_int8_quant(&o2, &x2, &s2, &z2) == LK_OK && sc[0] == 0 && sc[1] == 0 && zp[0] == 0 &&
          zp[1] == 0 && q[0] == 9;
    sc[0] = sc[1] = -5;
    ok &= lk_dynamic_scaled_int8_quant(&o2, &x2, &s2, NULL) == LK_OK && sc[0] == 0 && sc[1] == 0 && q[0] == 9;
    tu_check(ok, "int8 quant of rows with D = 0: every row's scale 0 (and zero point 0), no code written");
}

/* per-row scales / zero points of a 3-D input: [rows], [rows, 1] (vLLM's) and [A, B, 1]
 * give the same bits; [A, B] is refused */
static void test_row_shapes(void) {
    enum { A = 2, B = 3, D = 37 };
    float x[A][B][D], sc[3][A * B];
    int8_t q[3][A][B][D];
    int32_t zp[3][A * B];
    for (int a = 0; a < A; a++)
        for (int b = 0; b < B; b++)
            for (int i = 0; i < D; i++) x[a][b][i] = (float)((a * 7 + b * 3 + i * 5) % 11) - 4.0f + 0.25f * (float)b;
    lk_tensor tx = lk_tensor_make(x, LK_F32, 3, (int64_t[]){A, B, D});
    static const int NDS[3] = {1, 2, 3};
    static const int64_t SH[3][3] = {{A * B}, {A * B, 1}, {A, B, 1}};
    int ok = 1;
    for (int f = 0; f < 3; f++) {
        lk_tensor tq = lk_tensor_make(q[f], LK_I8, 3, (int64_t[]){A, B, D});
        lk_tensor ts = lk_tensor_make(sc[f], LK_F32, NDS[f], SH[f]), tz = lk_tensor_make(zp[f], LK_I32, NDS[f], SH[f]);
        ok &= lk_dynamic_scaled_int8_quant(&tq, &tx, &ts, &tz) == LK_OK;
    }
    ok &= !memcmp(q[0], q[1], sizeof q[0]) && !memcmp(q[0], q[2], sizeof q[0]) && !memcmp(sc[0], sc[1], sizeof sc[0]) &&
          !memcmp(sc[0], sc[2], sizeof sc[0]) && !memcmp(zp[0], zp[1], sizeof zp[0]) && !memcmp(zp[0], zp[2], sizeof zp[0]);
    lk_tensor tq = lk_tensor_make(q[0], LK_I8, 3, (int64_t[]){A, B, D});
    lk_tensor bad = lk_tensor_make(sc[0], LK_F32, 2, (int64_t[]){A, B});
    ok &= lk_dynamic_scaled_int8_quant(&tq, &tx, &bad, NULL) == LK_ERR_SHAPE && strstr(lk_last_error(), "scales");
    tu_check(ok, "int8 quant of a 3-D input: scales / azp [rows], [rows, 1] and [A, B, 1] give the same bits, [A, B] "
             "refused");
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
    tu_buf x = tu_alloc(LK_F16, 2, (int64_t[]){R, D}, 0), out = tu_alloc(LK_I8, 2, (int64_t[]){R, D}, 0);
    tu_buf sc = tu_alloc(LK_F32, 1, (int64_t[]){1}, 0), scs = tu_alloc(LK_F32, 2, (int64_t[]){R, 1}, 0);
    tu_buf z1 = tu_alloc(LK_I32, 1, (int64_t[]){1}, 0), zs = tu_alloc(LK_I32, 1, (int64_t[]){R}, 0);
    tu_buf f8o = tu_alloc(LK_F8E4M3, 2, (int64_t[]){R, D}, 0), sc16 = tu_alloc(LK_F16, 1, (int64_t[]){1}, 0);
    tu_buf z64 = tu_alloc(LK_I64, 1, (int64_t[]){1}, 0), bad3 = tu_alloc(LK_F32, 1, (int64_t[]){R + 1}, 0);
    tu_buf zbad = tu_alloc(LK_I32, 1, (int64_t[]){R + 1}, 0), z2 = tu_alloc(LK_I32, 1, (int64_t[]){2}, 0);
    tu_fill_uniform(&x, -1, 1);
    tu_set(&z1, 0, 4);
    tu_buf *all[] = {&x, &out, &sc, &scs, &z1, &zs, &f8o, &sc16, &z64, &bad3, &zbad, &z2};
    int nb = 12;
    static const float BAD[4] = {0.0f, -1.0f, NAN, INFINITY};
    for (int k = 0; k < 4; k++) {
        tu_set(&sc, 0, BAD[k]);
        for (int b = 0; b < nb; b++) tu_snapshot(all[b]);
        char what[96];
        snprintf(what, sizeof what, "scale %g", (double)BAD[k]);
        expect(lk_static_scaled_int8_quant(&out.t, &x.t, &sc.t, NULL), LK_ERR_VALUE, "scale", all, nb, what);
        expect(lk_static_scaled_int8_quant(&out.t, &x.t, &sc.t, &z1.t), LK_ERR_VALUE, "scale", all, nb, what);
    }
    tu_set(&sc, 0, 0.5);
    for (int b = 0; b < nb; b++) tu_snapshot(all[b]);
    expect(lk_static_scaled_int8_quant(NULL, &x.t, &sc.t, NULL), LK_ERR_NULL, "out", all, nb, "NULL out");
    expect(lk_static_scaled_int8_quant(&out.t, NULL, &sc.t, NULL), LK_ERR_NULL, "input", all, nb, "NULL input");
    expect(lk_static_scaled_int8_quant(&out.t, &x.t, NULL, NULL), LK_ERR_NULL, "scale", all, nb, "NULL scale");
    expect(lk_dynamic_scaled_int8_quant(&out.t, &x.t, NULL, NULL), LK_ERR_NULL, "scales", all, nb, "NULL scales");
    expect(lk_static_scaled_int8_quant(&f8o.t, &x.t, &sc.t, NULL), LK_ERR_DTYPE, "out", all, nb, "fp8 out");
    expect(lk_dynamic_scaled_int8_quant(&f8o.t, &x.t, &scs.t, NULL), LK_ERR_DTYPE, "out", all, nb, "fp8 out (dynamic)");
    lk_tensor x8 = x.t;
    x8.dtype = LK_I8;
    expect(lk_static_scaled_int8_quant(&out.t, &x8, &sc.t, NULL), LK_ERR_DTYPE, "input", all, nb, "i8 input");
    expect(lk_static_scaled_int8_quant(&out.t, &f8o.t, &sc.t, NULL), LK_ERR_DTYPE, "input", all, nb, "fp8 input");
    expect(lk_static_scaled_int8_quant(&out.t, &x.t, &sc16.t, NULL), LK_ERR_DTYPE, "scale", all, nb, "f16 scale");
    expect(lk_static_scaled_int8_quant(&out.t, &x.t, &bad3.t, NULL), LK_ERR_SHAPE, "scale", all, nb, "scale [R + 1]");
    expect(lk_static_scaled_int8_quant(&out.t, &x.t, &sc.t, &sc.t), LK_ERR_DTYPE, "azp", all, nb, "f32 azp");
    expect(lk_static_scaled_int8_quant(&out.t, &x.t, &sc.t, &z64.t), LK_ERR_DTYPE, "azp", all, nb, "i64 azp");
    expect(lk_static_scaled_int8_quant(&out.t, &x.t, &sc.t, &z2.t), LK_ERR_SHAPE, "azp", all, nb, "azp [2]");
    lk_tensor o2 = out.t;
    o2.shape[1] = D - 1;
    expect(lk_static_scaled_int8_quant(&o2, &x.t, &sc.t, NULL), LK_ERR_SHAPE, "out", all, nb, "out [R, D - 1]");
    expect(lk_dynamic_scaled_int8_quant(&out.t, &x.t, &bad3.t, NULL), LK_ERR_SHAPE, "scales", all, nb, "scales [R + 1]");
    expect(lk_dynamic_scaled_int8_quant(&out.t, &x.t, &zs.t, NULL), LK_ERR_DTYPE, "scales", all, nb, "i32 scales");
    expect(lk_dynamic_scaled_int8_quant(&out.t, &x.t, &scs.t, &zbad.t), LK_ERR_SHAPE, "azp", all, nb, "azp [R + 1]");
    expect(lk_dynamic_scaled_int8_quant(&out.t, &x.t, &scs.t, &scs.t), LK_ERR_DTYPE, "azp", all, nb, "f32 azp (dynamic)");
    lk_tensor za = lk_tensor_make(scs.t.data, LK_I32, 1, (int64_t[]){R}); /* azp over the scales */
    expect(lk_dynamic_scaled_int8_quant(&out.t, &x.t, &scs.t, &za), LK_ERR_ALIAS, "azp", all, nb, "azp overlapping scales");
    lk_tensor zx = lk_tensor_make(x.t.data, LK_I32, 1, (int64_t[]){R}); /* azp over the input */
    expect(lk_dynamic_scaled_int8_quant(&out.t, &x.t, &scs.t, &zx), LK_ERR_ALIAS, "azp", all, nb, "azp overlapping input");
    lk_tensor sx = lk_tensor_make(x.t.data, LK_F32, 1, (int64_t[]){R}); /* scales over the input */
    expect(lk_dynamic_scaled_int8_quant(&out.t, &x.t, &sx, NULL), LK_ERR_ALIAS, "scales", all, nb, "scales overlapping input");
    lk_tensor z0s = zs.t;
    z0s.stride[0] = 0;
    expect(lk_dynamic_scaled_int8_quant(&out.t, &x.t, &scs.t, &z0s), LK_ERR_ALIAS, "azp", all, nb, "azp with a zero stride");
    lk_tensor ox = x.t; /* out over the input */
    ox.dtype = LK_I8;
    expect(lk_static_scaled_int8_quant(&ox, &x.t, &sc.t, NULL), LK_ERR_ALIAS, "out", all, nb, "out overlapping input");
    lk_tensor os = lk_tensor_make(sc.t.data, LK_I8, 2, (int64_t[]){1, 1}); /* out over the scale (1 x 1 input) */
    lk_tensor x11 = x.t;
    x11.shape[0] = x11.shape[1] = 1;
    expect(lk_static_scaled_int8_quant(&os, &x11, &sc.t, NULL), LK_ERR_ALIAS, "out", all, nb, "out overlapping scale");
    for (int b = 0; b < nb; b++) tu_free(all[b]);
}

int main(void) {
    tu_init();
    ni = tu_isas(isas);
    test_grid();
    test_code();
    test_specials();
    test_threads();
    test_empty();
    test_row_shapes();
    test_errors();
    lk_set_isa(isas[ni - 1]);
    return tu_finish("test_int8_quant");
}
