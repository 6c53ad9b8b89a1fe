/*
 * The extra activations (gelu_and_mul, mul_and_silu, fatrelu_and_mul, swigluoai_and_mul,
 * gelu_new, gelu_fast, gelu_quick): every ISA against a float64 computation and against
 * ref; odd sizes, ranks 1..3, strided views with garbage padding and transposed views,
 * every x/out dtype pair, large values (exp overflow), special values (inf, NaN, -0),
 * empty inputs, thread-count independence and the bad-input catalogue.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

enum { GELU, MULSILU, FATRELU, SWIGLU, GNEW, GFAST, GQUICK, NOPS };
static const char *NAMES[NOPS] = {"lk_gelu_and_mul", "lk_mul_and_silu", "lk_fatrelu_and_mul", "lk_swigluoai_and_mul",
                                  "lk_gelu_new", "lk_gelu_fast", "lk_gelu_quick"};
static const float THRESH = 0.3f, ALPHA = 1.702f, LIMIT = 7.0f;

static int gated(int op) { return op <= SWIGLU; }

static lk_status call(int op, const lk_tensor *out, const lk_tensor *x) {
    switch (op) {
    case GELU: return lk_gelu_and_mul(out, x);
    case MULSILU: return lk_mul_and_silu(out, x);
    case FATRELU: return lk_fatrelu_and_mul(out, x, THRESH);
    case SWIGLU: return lk_swigluoai_and_mul(out, x, ALPHA, LIMIT);
    case GNEW: return lk_gelu_new(out, x);
    case GFAST: return lk_gelu_fast(out, x);
    default: return lk_gelu_quick(out, x);
    }
}

/* float64, the literal formulas (the -inf limits as documented) */
static double sig64(double g, double x) { return g == -INFINITY ? -0.0 : g / (1.0 + exp(x)); }
static double value64(int op, const double *xr, int64_t d, int64_t i) {
    switch (op) {
    case GELU: {
        double g = xr[i];
        return (g == -INFINITY ? -0.0 : 0.5 * g * erfc(-g / sqrt(2.0))) * xr[d + i];
    }
    case MULSILU: return xr[i] * sig64(xr[d + i], -xr[d + i]);
    case FATRELU: return (xr[i] > THRESH ? xr[i] : 0.0) * xr[d + i];
    case SWIGLU: {
        double g = xr[2 * i], u = xr[2 * i + 1];
        g = g > LIMIT ? LIMIT : g;
        u = u > LIMIT ? LIMIT : u < -LIMIT ? -LIMIT : u;
        return (u + 1.0) * sig64(g, -(double)ALPHA * g);
    }
    case GNEW: {
        double g = xr[i];
        if (g == -INFINITY) return -0.0;
        double u = sqrt(2.0 / 3.14159265358979323846) * (g + 0.044715 * g * g * g);
        return g / (1.0 + exp(-2.0 * u)); /* = 0.5 g (1 + tanh(u)), without its cancellation */
    }
    case GFAST: {
        double g = xr[i];
        if (g == -INFINITY) return -0.0;
        double u = 0.7978845608 * g * (1.0 + 0.044715 * g * g);
        return g / (1.0 + exp(-2.0 * u));
    }
    default: return sig64(xr[i], -1.702 * xr[i]);
    }
}

static tu_tolerance vs_ref_tol(lk_dtype ot) {
    tu_tolerance t = {1e-6, 1e-6};
    if (ot == LK_F16) t.atol = t.rtol = 1e-3;
    if (ot == LK_BF16) t.atol = t.rtol = 8e-3;
    return t;
}

/* one case: x of shape xs (its last dim the op's input width), filled in [-r, r) */
static void run_case(int op, int nd, const int64_t *xs, lk_dtype xt, lk_dtype ot, int pad, int transposed, double r) {
    int64_t os[3];
    memcpy(os, xs, sizeof(int64_t) * (size_t)nd);
    if (gated(op)) os[nd - 1] = xs[nd - 1] / 2;
    int perm[3] = {1, 0, 2};
    tu_buf x = transposed && nd >= 2 ? tu_alloc_perm(xt, nd, xs, perm, pad) : tu_alloc(xt, nd, xs, pad);
    tu_fill_uniform(&x, -r, r);
    int64_t n = 1, w = xs[nd - 1], d = os[nd - 1];
    for (int k = 0; k < nd; k++) n *= os[k];
    double *xv = tu_values(&x), *want = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t row = 0; d && row < n / d; row++)
        for (int64_t i = 0; i < d; i++) want[row * d + i] = value64(op, xv + row * w, d, i);
    lk_isa isas[TU_MAX_ISAS];
    int ni = tu_isas(isas);
    double *refv = NULL;
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        tu_buf o = tu_alloc(ot, nd, os, pad);
        tu_snapshot(&o);
        lk_status s = call(op, &o.t, &x.t);
        double *got = tu_values(&o);
        tu_check(s == LK_OK && tu_outside_intact(&o), "%s %s x=%s out=%s: status %s, outside intact",
                 NAMES[op], lk_isa_name(isas[ii]), lk_dtype_name(xt), lk_dtype_name(ot), lk_status_str(s));
        tu_tolerance tol = tu_tol(ot);
        if (xt != LK_F32 && ot == LK_F32) tol.atol = tol.rtol = 1e-5;
        double e = tu_err(got, want, n, tol);
        tu_check(e <= 1.0, "%s %s x=%s out=%s vs f64: err %g", NAMES[op], lk_isa_name(isas[ii]), lk_dtype_name(xt),
                 lk_dtype_name(ot), e);
        if (!refv) refv = got;
        else {
            e = tu_err(got, refv, n, vs_ref_tol(ot));
            tu_check(e <= 1.0, "%s %s vs ref x=%s out=%s: err %g", NAMES[op], lk_isa_name(isas[ii]), lk_dtype_name(xt),
                     lk_dtype_name(ot), e);
            free(got);
        }
        tu_free(&o);
    }
    lk_set_isa(lk_isa_best());
    free(refv), free(xv), free(want);
    tu_free(&x);
}

static void test_grid(void) {
    static const lk_dtype DT[3] = {LK_F32, LK_F16, LK_BF16};
    static const int64_t W[] = {2, 6, 34, 66, 130, 4098};
    for (int op = 0; op < NOPS; op++)
        for (int xi = 0; xi < 3; xi++)
            for (int oi = 0; oi < 3; oi++)
                for (unsigned wi = 0; wi < sizeof W / sizeof W[0]; wi++) {
                    int64_t w = W[wi] + (gated(op) ? 0 : wi % 2); /* odd widths for element-wise */
                    if (w > 200 && (xi != oi || op % 2)) continue;   /* the long row: a few cases */
                    int64_t xs[3] = {3, 2, w};
                    int nd = 1 + (int)((wi + op) % 3);
                    if (nd == 1) xs[0] = w;
                    else if (nd == 2) xs[1] = w;
                    run_case(op, nd, xs, DT[xi], DT[oi], (int)(wi % 2), nd >= 2 && wi == 2, 6.0);
                }
    /* large values cross the exp overflow points; a transposed view takes the reference */
    for (int op = 0; op < NOPS; op++) {
        int64_t xs[2] = {5, 40};
        run_case(op, 2, xs, LK_F32, LK_F32, 1, 0, 120.0);
        run_case(op, 2, xs, LK_BF16, LK_BF16, 0, 1, 20.0);
    }
}

/* inf, NaN and signed zeros on every ISA: the documented limits */
static void test_special(void) {
    lk_isa isas[TU_MAX_ISAS];
    int ni = tu_isas(isas);
    const float ninf = -INFINITY, pinf = INFINITY, nan = NAN;
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        for (int op = 0; op < NOPS; op++) {
            enum { N = 40 };
            float x[2 * N], out[N];
            for (int i = 0; i < 2 * N; i++) x[i] = 1.5f;
            int64_t xw = gated(op) ? 2 * N : N;
            /* element 0: gate -inf; 1: gate +inf; 2: gate NaN; 3: gate -0 */
            float gv[4] = {ninf, pinf, nan, -0.0f};
            for (int k = 0; k < 4; k++) {
                if (op == SWIGLU) x[2 * k] = gv[k];
                else if (op == MULSILU) x[N + k] = gv[k]; /* the activation's input is the second half */
                else x[k] = gv[k];
            }
            lk_tensor tx = lk_tensor_make(x, LK_F32, 1, (int64_t[]){xw}), to = lk_tensor_make(out, LK_F32, 1, (int64_t[]){N});
            lk_status s = call(op, &to, &tx);
            int ok = s == LK_OK;
            /* -inf: the limit -0 (times the other factor 1.5 or 2.5 = -0); fatrelu: 0 */
            if (op == FATRELU) ok &= out[0] == 0.0f && out[1] == pinf && out[2] == 0.0f && out[3] == 0.0f;
            else if (op == MULSILU) ok &= out[0] == 0.0f && signbit(out[0]) && out[1] == pinf && isnan(out[2]);
            else if (op == SWIGLU) ok &= out[0] == 0.0f && signbit(out[0]) && isfinite(out[1]) && isnan(out[2]);
            else ok &= out[0] == 0.0f && signbit(out[0]) && out[1] == pinf && isnan(out[2]);
            if (op != FATRELU && op != SWIGLU) ok &= out[3] == 0.0f && signbit(out[3]);
            tu_check(ok, "%s %s special values: %g %g %g %g", NAMES[op], lk_isa_name(isas[ii]), out[0], out[1], out[2],
                     out[3]);
        }
    }
    lk_set_isa(lk_isa_best());
}

/* bitwise identical for 1..4 threads */
static void test_threads(void) {
    for (int op = 0; op < NOPS; op++) {
        int64_t xs[2] = {64, gated(op) ? 2 * 3000 : 3000}, os[2] = {64, 3000};
        tu_buf x = tu_alloc(LK_BF16, 2, xs, 0);
        tu_fill_uniform(&x, -8, 8);
        tu_buf first = tu_alloc(LK_F16, 2, os, 0);
        lk_set_num_threads(1);
        call(op, &first.t, &x.t);
        int same = 1;
        for (int t = 2; t <= 4; t++) {
            tu_buf o = tu_alloc(LK_F16, 2, os, 0);
            lk_set_num_threads(t);
            call(op, &o.t, &x.t);
            same &= tu_same_bits(&o, &first);
            tu_free(&o);
        }
        lk_set_num_threads(0);
        tu_check(same, "%s: 1..4 threads bitwise identical", NAMES[op]);
        tu_free(&x), tu_free(&first);
    }
}

static void test_bad_inputs(void) {
    for (int op = 0; op < NOPS; op++) {
        int64_t w = gated(op) ? 16 : 8;
        tu_buf x = tu_alloc(LK_F32, 2, (int64_t[]){3, w}, 0), o = tu_alloc(LK_F32, 2, (int64_t[]){3, 8}, 0);
        tu_buf bad = tu_alloc(LK_F32, 2, (int64_t[]){3, 9}, 0), xi = tu_alloc(LK_I32, 2, (int64_t[]){3, w}, 0);
        tu_fill_uniform(&x, -1, 1);
        tu_snapshot(&x), tu_snapshot(&o), tu_snapshot(&bad);
        struct {
            const lk_tensor *out, *x;
            lk_status want;
            const char *arg;
        } cs[] = {{&bad.t, &x.t, LK_ERR_SHAPE, "out"}, {&o.t, &xi.t, LK_ERR_DTYPE, "x"},
                  {NULL, &x.t, LK_ERR_NULL, "out"}, {&o.t, NULL, LK_ERR_NULL, "x"}};
        for (unsigned c = 0; c < sizeof cs / sizeof cs[0]; c++) {
            lk_status s = call(op, cs[c].out, cs[c].x);
            const char *m = lk_last_error();
            tu_check(s == cs[c].want && strstr(m, NAMES[op]) && strstr(m, cs[c].arg) && tu_intact(&x) && tu_intact(&o) &&
                         tu_intact(&bad),
                     "%s bad case %u -> %s (%s)", NAMES[op], c, lk_status_str(s), m);
        }
        if (gated(op)) { /* odd last dim */
            lk_tensor t = x.t;
            t.shape[1] = 15;
            lk_status s = call(op, &o.t, &t);
            tu_check(s == LK_ERR_SHAPE && strstr(lk_last_error(), "x") && tu_intact(&o), "%s odd last dim (%s)",
                     NAMES[op], lk_last_error());
        }
        /* out overlapping x */
        lk_tensor ov = x.t;
        ov.shape[1] = 8;
        lk_status s = call(op, &ov, &x.t);
        tu_check(s == LK_ERR_ALIAS && tu_intact(&x), "%s out overlaps x -> %s", NAMES[op], lk_status_str(s));
        /* empty input: nothing to do */
        lk_tensor e0 = x.t, e1 = o.t;
        e0.shape[0] = e1.shape[0] = 0;
        s = call(op, &e1, &e0);
        tu_check(s == LK_OK && tu_intact(&o), "%s empty -> %s", NAMES[op], lk_status_str(s));
        tu_free(&x), tu_free(&o), tu_free(&bad), tu_free(&xi);
    }
    /* scalar attributes */
    tu_buf x = tu_alloc(LK_F32, 1, (int64_t[]){8}, 0), o = tu_alloc(LK_F32, 1, (int64_t[]){4}, 0);
    tu_fill_uniform(&x, -1, 1);
    tu_snapshot(&o);
    struct {
        lk_status s;
        const char *arg;
    } sc[] = {{lk_fatrelu_and_mul(&o.t, &x.t, NAN), "threshold"}, {lk_fatrelu_and_mul(&o.t, &x.t, INFINITY), "threshold"},
              {lk_swigluoai_and_mul(&o.t, &x.t, 0.0f, 7.0f), "alpha"}, {lk_swigluoai_and_mul(&o.t, &x.t, NAN, 7.0f), "alpha"},
              {lk_swigluoai_and_mul(&o.t, &x.t, 1.702f, -1.0f), "limit"},
              {lk_swigluoai_and_mul(&o.t, &x.t, 1.702f, INFINITY), "limit"}};
    for (unsigned c = 0; c < sizeof sc / sizeof sc[0]; c++)
        tu_check(sc[c].s == LK_ERR_VALUE && tu_intact(&o), "bad scalar %s -> %s", sc[c].arg, lk_status_str(sc[c].s));
    lk_fatrelu_and_mul(&o.t, &x.t, NAN);
    tu_check(strstr(lk_last_error(), "threshold") != NULL, "threshold named (%s)", lk_last_error());
    lk_swigluoai_and_mul(&o.t, &x.t, 1.0f, 0.0f);
    tu_check(strstr(lk_last_error(), "limit") != NULL, "limit named (%s)", lk_last_error());
    tu_free(&x), tu_free(&o);
}

int main(void) {
    tu_init();
    test_grid();
    test_special();
    test_threads();
    test_bad_inputs();
    return tu_finish("test_act_ext");
}
