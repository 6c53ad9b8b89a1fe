/*
 * The scalar fp8 converters (src/core/fp8.h) against a float64 model of the formats:
 *
 *   decode   all 256 codes of each format, bit for bit (the sign of zero included; NaN
 *            codes give a NaN of the code's sign; e5m2 +-inf)
 *   encode   every code's value back to the code; every rounding midpoint between
 *            adjacent codes (ties to even) and its two f32 neighbours; saturation (the
 *            max, beyond it, FLT_MAX, inf); NaN of either sign and any payload; -0;
 *            f32 subnormals and the fp8 subnormal boundaries; a structured sweep of f32
 *            patterns over the formats' exponent range and random f32 bit patterns, all
 *            against the model (nearest code by value, ties to the even code, saturated)
 *   dtypes   lk_dtype_size / lk_dtype_name / typed load and store, and the float-view
 *            check rejecting fp8 by the argument's name
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "core/fp8.h"
#include "core/half.h"
#include "testutil.h"

typedef struct {
    const char *name;
    lk_dtype dt;
    int E, M, B;
    int has_inf;   /* e5m2: S.11111.00 is inf, S.11111.xx NaN; e4m3fn: S.1111.111 NaN only */
    uint8_t maxc;  /* largest finite code (magnitude) */
    uint8_t nanc;  /* the NaN code produced (magnitude) */
    double maxv;
} fmt;

static const fmt FMTS[2] = {
    {"e4m3fn", LK_F8E4M3, 4, 3, 7, 0, 0x7e, 0x7f, 448.0},
    {"e5m2", LK_F8E5M2, 5, 2, 15, 1, 0x7b, 0x7f, 57344.0},
};

static uint8_t enc(const fmt *f, float x) { return f->dt == LK_F8E4M3 ? lk_f32_to_f8e4m3(x) : lk_f32_to_f8e5m2(x); }
static float dec(const fmt *f, uint8_t c) { return f->dt == LK_F8E4M3 ? lk_f8e4m3_to_f32(c) : lk_f8e5m2_to_f32(c); }

static uint32_t bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static float from_bits(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* model: 0 finite (value in *v), 1 inf, 2 NaN */
static int model_decode(const fmt *f, uint8_t c, double *v) {
    *v = NAN;
    int s = c >> 7, e = (c >> f->M) & ((1 << f->E) - 1), m = c & ((1 << f->M) - 1);
    int emax = (1 << f->E) - 1;
    if (e == emax && (f->has_inf || m == (1 << f->M) - 1)) {
        if (f->has_inf && m == 0) {
            *v = s ? -INFINITY : INFINITY;
            return 1;
        }
        return 2;
    }
    double a = e == 0 ? ldexp((double)m, 1 - f->B - f->M) : ldexp(1.0 + ldexp((double)m, -f->M), e - f->B);
    *v = s ? -a : a;
    return 0;
}

/* model: the code of x (nearest finite value, ties to the even code, saturated) */
static uint8_t model_encode(const fmt *f, float xf) {
    if (isnan(xf)) return (uint8_t)((signbit(xf) ? 0x80 : 0) | f->nanc);
    uint8_t s = signbit(xf) ? 0x80 : 0;
    double x = fabs((double)xf), lo_v, hi_v;
    if (x >= f->maxv) return (uint8_t)(s | f->maxc);
    int lo = 0, hi = f->maxc; /* codes 0..maxc increase in value: value(lo) <= x < value(hi) */
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        double v;
        model_decode(f, (uint8_t)mid, &v);
        if (v <= x) lo = mid;
        else hi = mid;
    }
    model_decode(f, (uint8_t)lo, &lo_v);
    model_decode(f, (uint8_t)hi, &hi_v);
    double d1 = x - lo_v, d2 = hi_v - x; /* exact: a few dozen bits each */
    int c = d1 < d2 ? lo : d2 < d1 ? hi : (lo & 1) ? hi : lo;
    return (uint8_t)(s | c);
}

/* encode x, compare with want; counts a failure and remembers the first */
typedef struct {
    int n, bad;
    char first[200];
} tally;

static void want_code(tally *t, const fmt *f, float x, uint8_t want, const char *what) {
    uint8_t got = enc(f, x);
    t->n++;
    if (got != want && t->bad++ == 0)
        snprintf(t->first, sizeof t->first, "%s: x = %a (0x%08x) -> 0x%02x, want 0x%02x", what, (double)x, bits(x), got,
                 want);
}

static void report(const tally *t, const fmt *f, const char *what) {
    tu_check(t->bad == 0 && t->n > 0, "%s %s: %d of %d wrong%s%s", f->name, what, t->bad, t->n, t->bad ? "; first " : "",
             t->bad ? t->first : "");
}

static void test_decode(const fmt *f) {
    tally t = {0};
    for (int c = 0; c < 256; c++) {
        double v;
        int kind = model_decode(f, (uint8_t)c, &v);
        float got = dec(f, (uint8_t)c);
        int ok = kind == 2 ? isnan(got) && !!signbit(got) == (c >> 7) : bits(got) == bits((float)v);
        t.n++;
        if (!ok && t.bad++ == 0)
            snprintf(t.first, sizeof t.first, "code 0x%02x -> %a, want %a%s", c, (double)got, v, kind == 2 ? " (NaN)" : "");
    }
    report(&t, f, "decode all 256 codes");
    /* fixed points of the format's definition */
    tu_check(dec(f, f->maxc) == (float)f->maxv && dec(f, (uint8_t)(0x80 | f->maxc)) == -(float)f->maxv,
             "%s max = %g", f->name, f->maxv);
    tu_check(dec(f, 0x01) == ldexpf(1.0f, 1 - f->B - f->M) && bits(dec(f, 0x80)) == 0x80000000u,
             "%s smallest subnormal 2^%d, 0x80 = -0", f->name, 1 - f->B - f->M);
    if (f->has_inf) tu_check(isinf(dec(f, 0x7c)) && dec(f, 0xfc) < 0, "%s 0x7c / 0xfc = +-inf", f->name);
}

static void test_encode_codes(const fmt *f) {
    tally t = {0};
    for (int c = 0; c < 256; c++) {
        double v;
        int kind = model_decode(f, (uint8_t)c, &v);
        uint8_t s = (uint8_t)(c & 0x80);
        uint8_t want = kind == 0 ? (uint8_t)c : kind == 1 ? (uint8_t)(s | f->maxc) : (uint8_t)(s | f->nanc);
        want_code(&t, f, dec(f, (uint8_t)c), want, "code's value");
    }
    report(&t, f, "encode every code's value (inf saturates, NaN keeps its sign)");
}

static void test_midpoints(const fmt *f) {
    tally t = {0}, tm = {0};
    for (int sgn = 0; sgn < 2; sgn++)
        for (int c = 0; c < f->maxc; c++) {
            double a, b;
            model_decode(f, (uint8_t)c, &a);
            model_decode(f, (uint8_t)(c + 1), &b);
            float mid = (float)((a + b) / 2); /* M + 2 significant bits: exact in f32 */
            float below = nextafterf(mid, 0.0f), above = nextafterf(mid, INFINITY);
            uint8_t s = sgn ? 0x80 : 0, even = (uint8_t)((c & 1) ? c + 1 : c);
            if (sgn) mid = -mid, below = -below, above = -above;
            want_code(&t, f, mid, (uint8_t)(s | even), "midpoint");
            want_code(&t, f, below, (uint8_t)(s | c), "below the midpoint");
            want_code(&t, f, above, (uint8_t)(s | (c + 1)), "above the midpoint");
            want_code(&tm, f, mid, model_encode(f, mid), "model");
        }
    report(&t, f, "every midpoint between adjacent codes ties to even; its neighbours round to the nearer");
    report(&tm, f, "midpoints agree with the model");
}

static void test_specials(const fmt *f) {
    tally t = {0};
    float mx = (float)f->maxv, step = ldexpf(1.0f, (int)log2(f->maxv) - f->M); /* spacing at the max */
    float beyond[] = {mx, nextafterf(mx, INFINITY), mx + step / 2, mx + step, 2 * mx, 1e30f, FLT_MAX, INFINITY};
    for (unsigned i = 0; i < sizeof beyond / sizeof beyond[0]; i++) {
        want_code(&t, f, beyond[i], f->maxc, "saturation");
        want_code(&t, f, -beyond[i], (uint8_t)(0x80 | f->maxc), "saturation");
    }
    report(&t, f, "saturation to +-max (max, just beyond, half a step and a step beyond, FLT_MAX, inf)");
    tally tn = {0};
    uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0x7fffffffu, 0x7fa00000u, 0x7f812345u};
    for (unsigned i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        want_code(&tn, f, from_bits(nans[i]), f->nanc, "NaN");
        want_code(&tn, f, from_bits(nans[i] | 0x80000000u), (uint8_t)(0x80 | f->nanc), "-NaN");
    }
    report(&tn, f, "NaN (quiet, signalling, payloads) stays NaN with its sign");
    tally tz = {0};
    float sub = ldexpf(1.0f, 1 - f->B - f->M); /* smallest fp8 subnormal */
    want_code(&tz, f, 0.0f, 0x00, "+0");
    want_code(&tz, f, -0.0f, 0x80, "-0");
    want_code(&tz, f, from_bits(1), 0x00, "smallest f32 subnormal");
    want_code(&tz, f, from_bits(0x807fffffu), 0x80, "largest negative f32 subnormal");
    want_code(&tz, f, FLT_MIN, 0x00, "FLT_MIN");
    want_code(&tz, f, sub / 2, 0x00, "half the smallest subnormal (tie to 0)");
    want_code(&tz, f, -sub / 2, 0x80, "-half the smallest subnormal");
    want_code(&tz, f, nextafterf(sub / 2, 1.0f), 0x01, "just above half the smallest subnormal");
    want_code(&tz, f, sub * 1.5f, 0x02, "1.5 x smallest subnormal (tie to 2)");
    want_code(&tz, f, sub * 2.5f, 0x02, "2.5 x smallest subnormal (tie to 2)");
    /* the largest subnormal rounding up into the smallest normal */
    float big_sub = sub * (float)((1 << f->M) - 1), min_norm = sub * (float)(1 << f->M);
    want_code(&tz, f, (big_sub + min_norm) / 2, (uint8_t)(1 << f->M), "between the largest subnormal and the smallest normal");
    want_code(&tz, f, nextafterf(min_norm, 0.0f), (uint8_t)(1 << f->M), "just below the smallest normal");
    report(&tz, f, "zeros, f32 subnormals, fp8 subnormal boundaries");
}

/* structured sweep: every f32 exponent from 3 below the smallest subnormal to 2 above the
 * max, every pattern of the top 11 mantissa bits, low bits in a few sticky patterns; then
 * random f32 patterns (any exponent) and random values in the format's range */
static void test_sweep(const fmt *f) {
    tally t = {0};
    int elo = 127 + (1 - f->B - f->M) - 3, ehi = 127 + (int)log2(f->maxv) + 2;
    const uint32_t low[] = {0x000u, 0x001u, 0x7ffu, 0x800u, 0x801u, 0xfffu};
    for (int sgn = 0; sgn < 2; sgn++)
        for (int e = elo; e <= ehi; e++)
            for (uint32_t top = 0; top < (1u << 11); top++)
                for (unsigned l = 0; l < sizeof low / sizeof low[0]; l++) {
                    uint32_t u = ((uint32_t)sgn << 31) | ((uint32_t)e << 23) | (top << 12) | low[l];
                    float x = from_bits(u);
                    want_code(&t, f, x, model_encode(f, x), "sweep");
                }
    report(&t, f, "sweep over the format's exponent range vs the model");
    tally tr = {0};
    tu_seed(0xf8f8u + (uint64_t)f->dt);
    for (int i = 0; i < 400000; i++) {
        float x = from_bits((uint32_t)tu_rand());
        want_code(&tr, f, x, model_encode(f, x), "random pattern");
        float y = (float)tu_uniform(-1.2 * f->maxv, 1.2 * f->maxv) * (i & 1 ? 1.0f : ldexpf(1.0f, -(int)(tu_rand() % 24)));
        want_code(&tr, f, y, model_encode(f, y), "random value");
    }
    report(&tr, f, "random f32 patterns and values vs the model");
}

static void test_dtypes(void) {
    tu_check(lk_dtype_size(LK_F8E4M3) == 1 && lk_dtype_size(LK_F8E5M2) == 1, "fp8 dtype sizes are 1");
    tu_check(!strcmp(lk_dtype_name(LK_F8E4M3), "f8e4m3") && !strcmp(lk_dtype_name(LK_F8E5M2), "f8e5m2"),
             "fp8 dtype names");
    tu_check(LK_F32 == 0 && LK_F16 == 1 && LK_BF16 == 2 && LK_I32 == 3 && LK_I64 == 4 && LK_F8E4M3 == 5 &&
                 LK_F8E5M2 == 6,
             "dtype values are stable (appended, nothing renumbered)");
    uint8_t buf[4] = {0};
    lk_store_f(buf, LK_F8E4M3, 1, 3.3f);
    lk_store_f(buf, LK_F8E5M2, 2, -3.3f);
    tu_check(buf[0] == 0 && buf[1] == lk_f32_to_f8e4m3(3.3f) && buf[2] == lk_f32_to_f8e5m2(-3.3f) && buf[3] == 0,
             "lk_store_f writes one byte of fp8");
    tu_check(lk_load_f(buf, LK_F8E4M3, 1) == 3.25f && lk_load_f(buf, LK_F8E5M2, 2) == -3.5f &&
                 lk_round_to(LK_F8E4M3, 3.3f) == 3.25f,
             "lk_load_f / lk_round_to read fp8 (3.3 -> 3.25 e4m3, -3.5 e5m2)");
    int64_t shape[2] = {3, 5};
    uint8_t data[15];
    for (int k = 0; k < 2; k++) {
        lk_dtype dt = k ? LK_F8E5M2 : LK_F8E4M3;
        lk_tensor v = lk_tensor_make(data, dt, 2, shape);
        tu_check(lk_check_view(&v, "cache", 2, 2) == LK_OK && lk_view_extent(&v).hi - lk_view_extent(&v).lo == 15,
                 "%s view: valid, 15 bytes", lk_dtype_name(dt));
        lk_status s = lk_check_float(&v, "k_cache", 2, 2);
        tu_check(s == LK_ERR_DTYPE && strstr(lk_last_error(), "k_cache") && strstr(lk_last_error(), lk_dtype_name(dt)),
                 "%s rejected by the float check naming the argument (%s)", lk_dtype_name(dt), lk_last_error());
        s = lk_check_index(&v, "block_table", 2, 2);
        tu_check(s == LK_ERR_DTYPE && strstr(lk_last_error(), "block_table"), "%s rejected by the index check (%s)",
                 lk_dtype_name(dt), lk_last_error());
    }
}

int main(void) {
    tu_init();
    for (int k = 0; k < 2; k++) {
        test_decode(&FMTS[k]);
        test_encode_codes(&FMTS[k]);
        test_midpoints(&FMTS[k]);
        test_specials(&FMTS[k]);
        test_sweep(&FMTS[k]);
    }
    test_dtypes();
    return tu_finish("test_fp8");
}
