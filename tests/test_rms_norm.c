/*
 * rms_norm and fused_add_rms_norm: every ISA against a float64 computation and
 * against ref; odd sizes, strided views with garbage padding, in-place, mixed dtypes,
 * Gemma form, empty inputs, thread-count independence, and the bad-input catalogue.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static const int64_t SIZES[][2] = {{1, 1}, {3, 7}, {7, 33}, {2, 4097}, {5, 128}, {33, 64}, {17, 37}, {4, 8192}};
#define NSIZES (int)(sizeof SIZES / sizeof SIZES[0])

/* float64 rms_norm of row-major rows x[R][D] into want */
static void rms64(double *want, const double *x, const double *w, int64_t R, int64_t D,
                  double eps, int gemma) {
    for (int64_t r = 0; r < R; r++) {
        double ss = 0;
        for (int64_t i = 0; i < D; i++) ss += x[r * D + i] * x[r * D + i];
        double inv = 1.0 / sqrt(ss / (double)D + eps);
        for (int64_t i = 0; i < D; i++)
            want[r * D + i] = x[r * D + i] * inv * (gemma ? 1.0 + w[i] : w[i]);
    }
}

/* round a double array to dtype dt as a store would */
static void round_to(double *v, int64_t n, lk_dtype dt) {
    for (int64_t i = 0; i < n; i++) {
        tu_buf tmp = tu_alloc(dt, 1, (int64_t[]){1}, 0);
        tu_set(&tmp, 0, v[i]);
        v[i] = tu_get(&tmp, 0);
        tu_free(&tmp);
    }
}

static void test_rms_norm_cases(void) {
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    const lk_dtype combos[][3] = {/* x, w, out */
                                  {LK_F32, LK_F32, LK_F32},   {LK_F16, LK_F16, LK_F16},
                                  {LK_BF16, LK_BF16, LK_BF16}, {LK_BF16, LK_F32, LK_BF16},
                                  {LK_F16, LK_BF16, LK_F32},  {LK_F32, LK_F16, LK_BF16}};
    for (int c = 0; c < 6; c++)
        for (int s = 0; s < NSIZES; s++)
            for (int pad = 0; pad <= 1; pad++)
                for (int mode = 0; mode < 3; mode++) { /* 0 out, 1 in place, 2 gemma */
                    lk_dtype xt = combos[c][0], wt = combos[c][1], ot = combos[c][2];
                    if (mode == 1 && ot != xt) continue;
                    int64_t R = SIZES[s][0], D = SIZES[s][1], shape[2] = {R, D};
                    tu_buf x = tu_alloc(xt, 2, shape, pad), w = tu_alloc(wt, 1, &D, pad);
                    tu_fill_uniform(&x, -2, 2);
                    tu_fill_uniform(&w, -1.5, 1.5);
                    double *xv = tu_values(&x), *wv = tu_values(&w);
                    double *want = malloc(sizeof(double) * R * D);
                    int gemma = mode == 2;
                    rms64(want, xv, wv, R, D, 1e-6, gemma);
                    tu_buf ref = tu_alloc(ot, 2, shape, 0);
                    for (int ii = 0; ii < nisa; ii++) {
                        lk_set_isa(isas[ii]);
                        tu_buf o = mode == 1 ? tu_alloc(xt, 2, shape, pad) : tu_alloc(ot, 2, shape, pad);
                        if (mode == 1) /* in place: out is x's copy */
                            for (int64_t i = 0; i < R * D; i++) tu_set(&o, i, xv[i]);
                        tu_snapshot(&o);
                        lk_status st = lk_rms_norm(&o.t, mode == 1 ? &o.t : &x.t, &w.t, 1e-6f, gemma);
                        double *got = tu_values(&o);
                        double e = tu_err(got, want, R * D, tu_tol(ot));
                        tu_check(st == LK_OK && e <= 1.0 && tu_outside_intact(&o),
                                 "rms_norm %s x=%s w=%s out=%s [%lld,%lld] pad=%d mode=%d err=%.3g %s",
                                 lk_isa_name(isas[ii]), lk_dtype_name(xt), lk_dtype_name(wt),
                                 lk_dtype_name(ot), (long long)R, (long long)D, pad, mode, e,
                                 lk_last_error());
                        if (ii == 0) {
                            for (int64_t i = 0; i < R * D; i++) tu_set(&ref, i, got[i]);
                        } else {
                            double *rv = tu_values(&ref);
                            /* SIMD vs ref: f32 sums in other order; 1 ulp of the out dtype */
                            tu_tolerance t = tu_tol(ot);
                            if (ot != LK_F32) t.atol = t.rtol = (ot == LK_F16 ? 1e-3 : 8e-3);
                            double e2 = tu_err(got, rv, R * D, t);
                            tu_check(e2 <= 1.0, "rms_norm %s vs ref [%lld,%lld] %s err=%.3g",
                                     lk_isa_name(isas[ii]), (long long)R, (long long)D,
                                     lk_dtype_name(ot), e2);
                            free(rv);
                        }
                        free(got);
                        tu_free(&o);
                    }
                    lk_set_isa(lk_isa_best());
                    tu_free(&ref);
                    tu_free(&x);
                    tu_free(&w);
                    free(xv);
                    free(wv);
                    free(want);
                }
}

/* Qwen3 QK-norm: q = qkv[:, 0:2048] as [S, 16, 128], normalised per head row, written
 * back into the same strided view (in place) and into a contiguous output */
static void test_qk_norm_strided(void) {
    int64_t S = 37, W = 4096;
    tu_buf qkv = tu_alloc(LK_F16, 2, (int64_t[]){S, W}, 0);
    tu_buf w = tu_alloc(LK_F16, 1, (int64_t[]){128}, 0);
    tu_fill_uniform(&qkv, -3, 3);
    tu_fill_uniform(&w, 0.5, 1.5);
    double *all = tu_values(&qkv), *wv = tu_values(&w);
    lk_tensor q = {qkv.t.data, LK_F16, 3, {S, 16, 128}, {W, 128, 1}};
    double *xin = malloc(sizeof(double) * S * 2048), *want = malloc(sizeof(double) * S * 2048);
    for (int64_t s = 0; s < S; s++)
        for (int64_t i = 0; i < 2048; i++) xin[s * 2048 + i] = all[s * W + i];
    rms64(want, xin, wv, S * 16, 128, 1e-6, 0);
    tu_buf out = tu_alloc(LK_F16, 3, (int64_t[]){S, 16, 128}, 0);
    lk_status st = lk_rms_norm(&out.t, &q, &w.t, 1e-6f, 0);
    double *got = tu_values(&out);
    tu_check(st == LK_OK && tu_err(got, want, S * 2048, tu_tol(LK_F16)) <= 1,
             "qk-norm strided view -> contiguous");
    tu_snapshot(&qkv);
    st = lk_rms_norm(&q, &q, &w.t, 1e-6f, 0); /* in place into the strided view */
    double *after = tu_values(&qkv);
    int ok = st == LK_OK;
    for (int64_t s = 0; s < S && ok; s++)
        for (int64_t i = 0; i < W && ok; i++) {
            double v = after[s * W + i];
            if (i < 2048) ok = fabs(v - want[s * 2048 + i]) <= 2e-3 * (1 + fabs(want[s * 2048 + i]));
            else ok = memcmp(&v, &all[s * W + i], sizeof v) == 0; /* k and v untouched */
        }
    tu_check(ok, "qk-norm in place into strided view, rest of qkv untouched");
    free(after);
    free(got);
    free(xin);
    free(want);
    free(all);
    free(wv);
    tu_free(&out);
    tu_free(&qkv);
    tu_free(&w);
}

/* transposed view: last-dim stride != 1 goes through the reference path on every ISA */
static void test_transposed(void) {
    int64_t shape[2] = {9, 21};
    tu_buf x = tu_alloc_perm(LK_BF16, 2, shape, (int[]){1, 0}, 1);
    tu_buf w = tu_alloc(LK_F32, 1, &shape[1], 0);
    tu_fill_uniform(&x, -1, 1);
    tu_fill_uniform(&w, -1, 1);
    double *xv = tu_values(&x), *wv = tu_values(&w), want[9 * 21];
    rms64(want, xv, wv, 9, 21, 1e-5, 1);
    tu_buf o = tu_alloc_perm(LK_F32, 2, shape, (int[]){1, 0}, 2);
    tu_snapshot(&o);
    lk_status st = lk_rms_norm(&o.t, &x.t, &w.t, 1e-5f, 1);
    double *got = tu_values(&o);
    tu_check(st == LK_OK && tu_err(got, want, 9 * 21, tu_tol(LK_F32)) <= 1 && tu_outside_intact(&o),
             "rms_norm transposed views (last-dim stride != 1)");
    free(got);
    free(xv);
    free(wv);
    tu_free(&x);
    tu_free(&w);
    tu_free(&o);
}

static void test_fused(void) {
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    const lk_dtype combos[][3] = {/* x, residual, w */
                                  {LK_F32, LK_F32, LK_F32}, {LK_F16, LK_F16, LK_F16},
                                  {LK_BF16, LK_BF16, LK_BF16}, {LK_BF16, LK_F32, LK_BF16},
                                  {LK_F16, LK_BF16, LK_F32}};
    for (int c = 0; c < 5; c++)
        for (int s = 0; s < NSIZES; s++)
            for (int pad = 0; pad <= 1; pad++)
                for (int gemma = 0; gemma <= 1; gemma++) {
                    lk_dtype xt = combos[c][0], rt = combos[c][1], wt = combos[c][2];
                    int64_t R = SIZES[s][0], D = SIZES[s][1], shape[2] = {R, D};
                    tu_buf x0 = tu_alloc(xt, 2, shape, 0), r0 = tu_alloc(rt, 2, shape, 0);
                    tu_buf w = tu_alloc(wt, 1, &D, 0);
                    tu_fill_uniform(&x0, -2, 2);
                    tu_fill_uniform(&r0, -2, 2);
                    tu_fill_uniform(&w, -1, 1);
                    double *xv = tu_values(&x0), *rv = tu_values(&r0), *wv = tu_values(&w);
                    double *sum = malloc(sizeof(double) * R * D), *want = malloc(sizeof(double) * R * D);
                    for (int64_t i = 0; i < R * D; i++) sum[i] = xv[i] + rv[i];
                    round_to(sum, R * D, rt); /* the stored residual */
                    rms64(want, sum, wv, R, D, 1e-6, gemma);
                    double *first_x = NULL, *first_r = NULL;
                    for (int ii = 0; ii < nisa; ii++) {
                        lk_set_isa(isas[ii]);
                        tu_buf x = tu_alloc(xt, 2, shape, pad), r = tu_alloc(rt, 2, shape, pad);
                        for (int64_t i = 0; i < R * D; i++) {
                            tu_set(&x, i, xv[i]);
                            tu_set(&r, i, rv[i]);
                        }
                        tu_snapshot(&x);
                        tu_snapshot(&r);
                        lk_status st = lk_fused_add_rms_norm(&x.t, &r.t, &w.t, 1e-6f, gemma);
                        double *gx = tu_values(&x), *gr = tu_values(&r);
                        double ex = tu_err(gx, want, R * D, tu_tol(xt));
                        /* the residual is exactly round(x + residual) on every ISA */
                        int rexact = memcmp(gr, sum, sizeof(double) * R * D) == 0;
                        tu_check(st == LK_OK && ex <= 1 && rexact && tu_outside_intact(&x) &&
                                     tu_outside_intact(&r),
                                 "fused_add_rms_norm %s x=%s res=%s w=%s [%lld,%lld] pad=%d gemma=%d err=%.3g res_exact=%d",
                                 lk_isa_name(isas[ii]), lk_dtype_name(xt), lk_dtype_name(rt),
                                 lk_dtype_name(wt), (long long)R, (long long)D, pad, gemma, ex, rexact);
                        if (ii == 0) {
                            first_x = gx;
                            first_r = gr;
                        } else {
                            tu_tolerance t = tu_tol(xt);
                            if (xt != LK_F32) t.atol = t.rtol = (xt == LK_F16 ? 1e-3 : 8e-3);
                            tu_check(tu_err(gx, first_x, R * D, t) <= 1,
                                     "fused_add_rms_norm %s vs ref [%lld,%lld]", lk_isa_name(isas[ii]),
                                     (long long)R, (long long)D);
                            free(gx);
                            free(gr);
                        }
                        tu_free(&x);
                        tu_free(&r);
                    }
                    lk_set_isa(lk_isa_best());
                    free(first_x);
                    free(first_r);
                    free(xv);
                    free(rv);
                    free(wv);
                    free(sum);
                    free(want);
                    tu_free(&x0);
                    tu_free(&r0);
                    tu_free(&w);
                }
}

/* results are bitwise identical for 1..4 threads */
static void test_threads(void) {
    int64_t shape[2] = {301, 4096};
    tu_buf x = tu_alloc(LK_BF16, 2, shape, 0), w = tu_alloc(LK_BF16, 1, &shape[1], 0);
    tu_fill_uniform(&x, -2, 2);
    tu_fill_uniform(&w, -2, 2);
    tu_buf o1 = tu_alloc(LK_BF16, 2, shape, 0);
    lk_set_num_threads(1);
    lk_rms_norm(&o1.t, &x.t, &w.t, 1e-6f, 0);
    for (int nt = 2; nt <= 4; nt++) {
        tu_buf o = tu_alloc(LK_BF16, 2, shape, 0);
        lk_set_num_threads(nt);
        lk_rms_norm(&o.t, &x.t, &w.t, 1e-6f, 0);
        tu_check(tu_same_bits(&o, &o1), "rms_norm bitwise identical with %d threads", nt);
        tu_free(&o);
    }
    lk_set_num_threads(0);
    tu_free(&x);
    tu_free(&w);
    tu_free(&o1);
}

/* fused_add_rms_norm: both outputs (x and residual) bitwise identical for 1..4 threads
 * and a repeated call */
static void test_threads_fused(void) {
    int64_t shape[2] = {301, 4096};
    tu_buf x0 = tu_alloc(LK_BF16, 2, shape, 0), r0 = tu_alloc(LK_F32, 2, shape, 0);
    tu_buf w = tu_alloc(LK_BF16, 1, &shape[1], 0);
    tu_fill_uniform(&x0, -2, 2), tu_fill_uniform(&r0, -2, 2), tu_fill_uniform(&w, -1, 1);
    size_t xb = x0.bytes, rb = r0.bytes;
    unsigned char *x1 = malloc(xb), *r1 = malloc(rb);
    for (int nt = 1; nt <= 5; nt++) { /* 5: a repeated 1-thread call */
        tu_buf x = tu_alloc(LK_BF16, 2, shape, 0), r = tu_alloc(LK_F32, 2, shape, 0);
        memcpy(x.base, x0.base, xb), memcpy(r.base, r0.base, rb);
        lk_set_num_threads(nt == 5 ? 1 : nt);
        lk_status st = lk_fused_add_rms_norm(&x.t, &r.t, &w.t, 1e-6f, 1);
        if (nt == 1) memcpy(x1, x.base, xb), memcpy(r1, r.base, rb);
        else
            tu_check(st == LK_OK && !memcmp(x.base, x1, xb) && !memcmp(r.base, r1, rb),
                     "fused_add_rms_norm bitwise identical with %d threads%s", nt == 5 ? 1 : nt,
                     nt == 5 ? " (repeated call)" : "");
        tu_free(&x), tu_free(&r);
    }
    lk_set_num_threads(0);
    free(x1), free(r1);
    tu_free(&x0), tu_free(&r0), tu_free(&w);
}

static void test_empty(void) {
    int64_t shape[2] = {0, 128};
    tu_buf x = tu_alloc(LK_F32, 2, shape, 0), w = tu_alloc(LK_F32, 1, &shape[1], 0);
    tu_buf o = tu_alloc(LK_F32, 2, shape, 0);
    tu_snapshot(&o);
    lk_status st = lk_rms_norm(&o.t, &x.t, &w.t, 1e-6f, 0);
    tu_check(st == LK_OK && tu_intact(&o), "rms_norm 0 rows is a no-op");
    st = lk_fused_add_rms_norm(&o.t, &x.t, &w.t, 1e-6f, 0);
    tu_check(st == LK_OK && tu_intact(&o), "fused_add_rms_norm 0 rows is a no-op");
    tu_free(&x);
    tu_free(&w);
    tu_free(&o);
}

/* each rule of the common contract: right status, message names the argument, nothing written */
static void test_bad_inputs(void) {
    int64_t shape[2] = {4, 16};
    tu_buf x = tu_alloc(LK_F32, 2, shape, 0), w = tu_alloc(LK_F32, 1, &shape[1], 0);
    tu_buf o = tu_alloc(LK_F32, 2, shape, 0), big = tu_alloc(LK_F32, 1, (int64_t[]){128}, 0);
    tu_fill_uniform(&x, -1, 1);
    tu_fill_uniform(&w, -1, 1);
    tu_fill_uniform(&o, -1, 1);
    tu_fill_uniform(&big, -1, 1);
    struct bad_case {
        const char *what, *arg;
        lk_status want;
        lk_tensor out, x, w;
        float eps;
    } cases[32];
    int n = 0;
#define CASE(W, A, S, O, X, WW, E) cases[n++] = (struct bad_case){W, A, S, O, X, WW, E}
    lk_tensor t;
    CASE("eps negative", "eps", LK_ERR_VALUE, o.t, x.t, w.t, -1.0f);
    CASE("eps NaN", "eps", LK_ERR_VALUE, o.t, x.t, w.t, NAN);
    t = w.t; t.shape[0] = 15;
    CASE("w shape mismatch", "w", LK_ERR_SHAPE, o.t, x.t, t, 1e-6f);
    t = w.t; t.ndim = 2; t.shape[1] = 1; t.stride[1] = 1;
    CASE("w rank 2", "w", LK_ERR_RANK, o.t, x.t, t, 1e-6f);
    t = o.t; t.shape[0] = 3;
    CASE("out shape mismatch", "out", LK_ERR_SHAPE, t, x.t, w.t, 1e-6f);
    t = x.t; t.ndim = 0;
    CASE("x rank 0", "x", LK_ERR_RANK, o.t, t, w.t, 1e-6f);
    t = x.t; t.ndim = 9;
    CASE("x rank 9", "x", LK_ERR_RANK, o.t, t, w.t, 1e-6f);
    t = x.t; t.dtype = LK_I32;
    CASE("x int dtype", "x", LK_ERR_DTYPE, o.t, t, w.t, 1e-6f);
    t = o.t; t.dtype = (lk_dtype)77;
    CASE("out unknown dtype", "out", LK_ERR_DTYPE, t, x.t, w.t, 1e-6f);
    t = x.t; t.data = NULL;
    CASE("x NULL data", "x", LK_ERR_NULL, o.t, t, w.t, 1e-6f);
    t = x.t; t.shape[0] = -1;
    CASE("x negative size", "x", LK_ERR_SHAPE, o.t, t, w.t, 1e-6f);
    t = x.t; t.stride[0] = INT64_MAX / 2;
    CASE("x stride overflow", "x", LK_ERR_OVERFLOW, o.t, t, w.t, 1e-6f);
    t = o.t; t.stride[0] = 0;
    CASE("out stride 0 overlaps itself", "out", LK_ERR_ALIAS, t, x.t, w.t, 1e-6f);
    t = o.t; t.stride[0] = 8;
    CASE("out rows overlap", "out", LK_ERR_ALIAS, t, x.t, w.t, 1e-6f);
    { /* out = x shifted by one element: partial overlap */
        lk_tensor xo = big.t, oo = big.t;
        xo.ndim = oo.ndim = 2;
        xo.shape[0] = oo.shape[0] = 4;
        xo.shape[1] = oo.shape[1] = 16;
        xo.stride[0] = oo.stride[0] = 16;
        xo.stride[1] = oo.stride[1] = 1;
        oo.data = (float *)big.t.data + 1;
        CASE("out partially overlaps x", "out", LK_ERR_ALIAS, oo, xo, w.t, 1e-6f);
        lk_tensor ww = big.t;
        ww.shape[0] = 16;
        CASE("out overlaps w", "out", LK_ERR_ALIAS, xo, x.t, ww, 1e-6f);
    }
#undef CASE
    for (int i = 0; i < n; i++) {
        tu_snapshot(&x);
        tu_snapshot(&w);
        tu_snapshot(&o);
        tu_snapshot(&big);
        lk_status st = lk_rms_norm(&cases[i].out, &cases[i].x, &cases[i].w, cases[i].eps, 0);
        const char *msg = lk_last_error();
        tu_check(st == cases[i].want && strstr(msg, cases[i].arg) && strstr(msg, "lk_rms_norm") &&
                     tu_intact(&x) && tu_intact(&w) && tu_intact(&o) && tu_intact(&big),
                 "bad input '%s' -> %s (%s)", cases[i].what, lk_status_str(st), msg);
    }
    lk_status st = lk_rms_norm(NULL, &x.t, &w.t, 1e-6f, 0);
    tu_check(st == LK_ERR_NULL && strstr(lk_last_error(), "out"), "NULL out pointer");
    /* fused: x and residual the same buffer is an alias error */
    tu_snapshot(&x);
    st = lk_fused_add_rms_norm(&x.t, &x.t, &w.t, 1e-6f, 0);
    tu_check(st == LK_ERR_ALIAS && tu_intact(&x), "fused: x and residual alias -> %s (%s)",
             lk_status_str(st), lk_last_error());
    lk_tensor t2 = w.t;
    t2.shape[0] = 17;
    st = lk_fused_add_rms_norm(&x.t, &o.t, &t2, 1e-6f, 0);
    tu_check(st == LK_ERR_SHAPE && strstr(lk_last_error(), "w") && tu_intact(&x),
             "fused: w shape mismatch (%s)", lk_last_error());
    /* a valid call clears the error text */
    st = lk_rms_norm(&o.t, &x.t, &w.t, 1e-6f, 0);
    tu_check(st == LK_OK && lk_last_error()[0] == 0, "successful call clears lk_last_error");
    tu_free(&x);
    tu_free(&w);
    tu_free(&o);
    tu_free(&big);
}

/* fuzz regression (fuzz_norm): an empty out [5, 0, 46] whose dim-0 stride is 2^61.
 * lk_view_extent multiplied (shape - 1) * stride of the dims before the zero dim
 * (signed overflow, reported by UBSan in the sanitizer build). Empty views touch
 * nothing and their strides are not checked: LK_OK, nothing written. */
static void test_regress_empty_huge_stride(void) {
    int64_t shape[3] = {5, 0, 46};
    uint16_t xb[1] = {0};
    float ob[1] = {0};
    tu_buf w = tu_alloc(LK_F32, 1, &shape[2], 0);
    tu_fill_uniform(&w, -1, 1);
    lk_tensor x = lk_tensor_make(xb, LK_BF16, 3, shape), o = lk_tensor_make(ob, LK_F32, 3, shape);
    o.stride[0] = (int64_t)1 << 61;
    lk_status st = lk_rms_norm(&o, &x, &w.t, 1e-6f, 0);
    tu_check(st == LK_OK && ob[0] == 0.0f, "regress: empty out with a 2^61 stride is a no-op (%s)",
             lk_status_str(st));
    st = lk_fused_add_rms_norm(&o, &x, &w.t, 1e-6f, 0);
    tu_check(st == LK_OK && ob[0] == 0.0f, "regress: fused, empty x with a 2^61 stride is a no-op (%s)",
             lk_status_str(st));
    tu_free(&w);
}

/* fuzz regression (fuzz_norm): x and residual [1, 1, 13] interleaved in one buffer
 * (columns 0 and 1 of [13, 2]) with a size-1 dim-0 stride of 3074457345618258602:
 * views_disjoint computed stride * element size for the row period (signed overflow,
 * UBSan). Single rows are now compared directly: the call is valid and gives the bits
 * of the same call with ordinary strides; x and residual as one view is LK_ERR_ALIAS. */
static void test_regress_disjoint_huge_stride(void) {
    float buf[2][13 * 2], wb[13];
    for (int i = 0; i < 26; i++) buf[0][i] = buf[1][i] = (float)(i % 7) - 3.0f;
    for (int i = 0; i < 13; i++) wb[i] = 0.5f + 0.1f * (float)i;
    lk_tensor w = lk_tensor_make(wb, LK_F32, 1, (int64_t[]){13});
    lk_tensor x[2], r[2];
    for (int k = 0; k < 2; k++) {
        x[k] = lk_tensor_make(&buf[k][0], LK_F32, 3, (int64_t[]){1, 1, 13});
        r[k] = lk_tensor_make(&buf[k][1], LK_F32, 3, (int64_t[]){1, 1, 13});
        x[k].stride[2] = r[k].stride[2] = 2;
    }
    x[1].stride[0] = r[1].stride[0] = 3074457345618258602;
    lk_status s0 = lk_fused_add_rms_norm(&x[0], &r[0], &w, 1e-6f, 0);
    lk_status s1 = lk_fused_add_rms_norm(&x[1], &r[1], &w, 1e-6f, 0);
    tu_check(s0 == LK_OK && s1 == LK_OK && memcmp(buf[0], buf[1], sizeof buf[0]) == 0,
             "regress: interleaved x/residual with a huge size-1 stride (%s)", lk_status_str(s1));
    float keep[26];
    memcpy(keep, buf[1], sizeof keep);
    s1 = lk_fused_add_rms_norm(&x[1], &x[1], &w, 1e-6f, 0);
    tu_check(s1 == LK_ERR_ALIAS && memcmp(keep, buf[1], sizeof keep) == 0,
             "regress: x and residual one view with a huge size-1 stride -> %s", lk_status_str(s1));
}

/* first i where got[i] and ref[i] differ in class (NaN, inf of a sign, finite) or, both
 * finite, by more than one bf16 ulp; -1 if none */
static int64_t first_special_mismatch(const double *got, const double *ref, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        int same = isnan(got[i]) ? isnan(ref[i])
                   : isinf(got[i]) ? got[i] == ref[i]
                   : !isnan(ref[i]) && !isinf(ref[i]) && fabs(got[i] - ref[i]) <= 8e-3 * (1 + fabs(ref[i]));
        if (!same) return i;
    }
    return -1;
}

/* Special values through the bf16 fast path (16 rows or more, f32 weight copy): rows
 * holding an inf, a NaN, all zeros (eps 0: 0 * inf) or overflowing squares, and weights
 * holding inf / NaN, must give the reference's NaN and inf positions on every ISA, the
 * finite values within one bf16 ulp. */
static void test_special_values(void) {
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    const int64_t R = 20, D = 40, shape[2] = {R, D};
    for (int wcase = 0; wcase < 3; wcase++) /* finite weights, an inf weight, an f16 NaN weight */
        for (int ei = 0; ei < 2; ei++) {
            float eps = ei ? 1e-6f : 0.0f;
            /* contiguous: the SIMD fast path */
            tu_buf x = tu_alloc(LK_BF16, 2, shape, 0), w = tu_alloc(wcase == 2 ? LK_F16 : LK_BF16, 1, &D, 0);
            tu_fill_uniform(&x, -2, 2);
            tu_fill_uniform(&w, -1.5, 1.5);
            tu_set(&x, 3 * D + 5, INFINITY);
            tu_set(&x, 5 * D + 39, NAN);
            for (int64_t i = 0; i < D; i++) tu_set(&x, 7 * D + i, 0.0);
            tu_set(&x, 9 * D + 17, 3e38);
            tu_set(&x, 11 * D + 0, -INFINITY);
            if (wcase == 1) tu_set(&w, 33, INFINITY);
            /* an f16 NaN with every payload bit set: 0x7fffe000 as f32, which rounding to
             * bf16 without the NaN rule would carry into the sign (-0) */
            if (wcase == 2) ((uint16_t *)w.t.data)[2] = 0x7fff;
            double *ref = NULL;
            for (int ii = 0; ii < nisa; ii++) {
                lk_set_isa(isas[ii]);
                tu_buf o = tu_alloc(LK_BF16, 2, shape, 0);
                tu_snapshot(&o);
                lk_status st = lk_rms_norm(&o.t, &x.t, &w.t, eps, 0);
                double *got = tu_values(&o);
                if (ii == 0) {
                    ref = got;
                } else {
                    int64_t bad = first_special_mismatch(got, ref, R * D);
                    tu_check(st == LK_OK && bad < 0 && tu_outside_intact(&o),
                             "rms_norm bf16 special values %s wcase=%d eps=%g: element %lld got %g ref %g",
                             lk_isa_name(isas[ii]), wcase, eps, (long long)bad,
                             bad < 0 ? 0.0 : got[bad], bad < 0 ? 0.0 : ref[bad]);
                    free(got);
                }
                tu_free(&o);
            }
            /* the rules themselves (docs/ops.md): a NaN row is all NaN; eps 0 zero row NaN */
            tu_check(isnan(ref[5 * D]) && isnan(ref[5 * D + 39]) && (ei || isnan(ref[7 * D + 1])) &&
                         (!ei || ref[7 * D + 1] == 0.0) && isnan(ref[3 * D + 5]) && ref[3 * D + 6] == 0.0,
                     "rms_norm bf16 special values ref rules wcase=%d eps=%g", wcase, eps);
            free(ref);
            tu_free(&x);
            tu_free(&w);
        }
}

/* Fewer than 16 rows (no weight copy: bf16 weights are split in registers) and
 * bf16 weights holding a NaN with every payload bit set and an inf, gemma or not,
 * eps 0 or not: NaN and inf positions as ref's, finite values within one bf16 ulp. */
static void test_special_values_few_rows(void) {
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    const int64_t R = 4, D = 40, shape[2] = {R, D};
    for (int gemma = 0; gemma <= 1; gemma++)
        for (int ei = 0; ei < 2; ei++) {
            float eps = ei ? 1e-6f : 0.0f;
            tu_buf x = tu_alloc(LK_BF16, 2, shape, 0), w = tu_alloc(LK_BF16, 1, &D, 0);
            tu_fill_uniform(&x, -2, 2);
            tu_fill_uniform(&w, -1.5, 1.5);
            tu_set(&x, 1 * D + 5, INFINITY);
            tu_set(&x, 2 * D + 39, NAN);
            for (int64_t i = 0; i < D; i++) tu_set(&x, 3 * D + i, 0.0);
            ((uint16_t *)w.t.data)[2] = 0x7fff; /* NaN, every payload bit set */
            tu_set(&w, 33, INFINITY);
            double *ref = NULL;
            for (int ii = 0; ii < nisa; ii++) {
                lk_set_isa(isas[ii]);
                tu_buf o = tu_alloc(LK_BF16, 2, shape, 0);
                lk_status st = lk_rms_norm(&o.t, &x.t, &w.t, eps, gemma);
                double *got = tu_values(&o);
                if (ii == 0) {
                    ref = got;
                } else {
                    int64_t bad = first_special_mismatch(got, ref, R * D);
                    tu_check(st == LK_OK && bad < 0,
                             "rms_norm bf16 few rows special values %s gemma=%d eps=%g: element %lld",
                             lk_isa_name(isas[ii]), gemma, eps, (long long)bad);
                    free(got);
                }
                tu_free(&o);
            }
            /* NaN weight: NaN; inf weight: inf (row 0 is finite and non-zero); the inf row
             * has inv = 0, so inf * 0 = NaN there; the NaN row is NaN */
            tu_check(isnan(ref[2]) && isinf(ref[33]) && isnan(ref[1 * D + 5]) && isnan(ref[2 * D + 39]),
                     "rms_norm bf16 few rows special values ref rules gemma=%d eps=%g", gemma, eps);
            lk_set_isa(lk_isa_best());
            free(ref);
            tu_free(&x);
            tu_free(&w);
        }
}

/* The same through the fused bf16 path (16-wide add with rounding from registers): the
 * stored residual is bit-identical to ref's on every ISA, inf + -inf and NaN included. */
static void test_special_values_fused(void) {
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    const int64_t R = 20, D = 40, shape[2] = {R, D};
    tu_buf x0 = tu_alloc(LK_BF16, 2, shape, 0), r0 = tu_alloc(LK_BF16, 2, shape, 0), w = tu_alloc(LK_BF16, 1, &D, 0);
    tu_fill_uniform(&x0, -2, 2);
    tu_fill_uniform(&r0, -2, 2);
    tu_fill_uniform(&w, -1.5, 1.5);
    tu_set(&x0, 3 * D + 5, INFINITY), tu_set(&r0, 3 * D + 5, -INFINITY); /* NaN */
    tu_set(&x0, 5 * D + 33, NAN);
    tu_set(&r0, 8 * D + 2, -INFINITY);
    tu_set(&x0, 9 * D + 17, 3e38), tu_set(&r0, 9 * D + 17, 3e38); /* overflows to inf */
    ((uint16_t *)r0.t.data)[12 * D + 20] = 0xffff; /* a full-payload negative NaN */
    tu_buf rx = tu_alloc(LK_BF16, 2, shape, 0), rr = tu_alloc(LK_BF16, 2, shape, 0);
    for (int ii = 0; ii < nisa; ii++) {
        lk_set_isa(isas[ii]);
        tu_buf x = tu_alloc(LK_BF16, 2, shape, 0), r = tu_alloc(LK_BF16, 2, shape, 0);
        memcpy(x.t.data, x0.t.data, (size_t)(R * D * 2));
        memcpy(r.t.data, r0.t.data, (size_t)(R * D * 2));
        lk_status st = lk_fused_add_rms_norm(&x.t, &r.t, &w.t, 1e-6f, 0);
        if (ii == 0) {
            memcpy(rx.t.data, x.t.data, (size_t)(R * D * 2));
            memcpy(rr.t.data, r.t.data, (size_t)(R * D * 2));
            tu_check(st == LK_OK && isnan(tu_get(&r, 3 * D + 5)) && isnan(tu_get(&x, 3 * D)) &&
                         ((uint16_t *)r.t.data)[12 * D + 20] == 0xffff && isinf(tu_get(&r, 9 * D + 17)),
                     "fused_add_rms_norm bf16 special values ref rules");
        } else {
            double *got = tu_values(&x), *want = tu_values(&rx);
            int64_t bad = first_special_mismatch(got, want, R * D);
            free(got), free(want);
            tu_check(st == LK_OK && memcmp(r.t.data, rr.t.data, (size_t)(R * D * 2)) == 0 && bad < 0,
                     "fused_add_rms_norm bf16 special values %s: residual bitwise, x element %lld",
                     lk_isa_name(isas[ii]), (long long)bad);
        }
        tu_free(&x), tu_free(&r);
    }
    tu_free(&x0), tu_free(&r0), tu_free(&w), tu_free(&rx), tu_free(&rr);
}

/* w == NULL (weightless RMSNorm): bit for bit the call with a weight of ones, on every
 * ISA, for few rows (raw weight path) and many (the f32 copy), every x dtype, gemma
 * ignored; the fused form likewise */
static void test_weightless(void) {
    lk_isa isas[8];
    int ni = tu_isas(isas);
    static const lk_dtype DT[3] = {LK_F32, LK_F16, LK_BF16};
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        for (int di = 0; di < 3; di++)
            for (int R = 3; R <= 40; R += 37) {
                int64_t D = 77, s[2] = {R, D};
                tu_buf x = tu_alloc(DT[di], 2, s, 1), o1 = tu_alloc(DT[di], 2, s, 0), o2 = tu_alloc(DT[di], 2, s, 1);
                tu_buf ones = tu_alloc(LK_F32, 1, &D, 0);
                tu_fill_uniform(&x, -3, 3);
                for (int64_t i = 0; i < D; i++) tu_set(&ones, i, 1.0);
                lk_status s1 = lk_rms_norm(&o1.t, &x.t, &ones.t, 1e-6f, 0);
                lk_status s2 = lk_rms_norm(&o2.t, &x.t, NULL, 1e-6f, 1);
                tu_check(s1 == LK_OK && s2 == LK_OK && tu_same_bits(&o1, &o2), "weightless rms_norm %s %s R=%d",
                         lk_isa_name(isas[ii]), lk_dtype_name(DT[di]), R);
                /* against float64 */
                double *xv = tu_values(&x), *ov = tu_values(&o2), err = 0;
                for (int r = 0; r < R; r++) {
                    double ss = 0;
                    for (int64_t i = 0; i < D; i++) ss += xv[r * D + i] * xv[r * D + i];
                    double inv = 1.0 / sqrt(ss / (double)D + 1e-6);
                    for (int64_t i = 0; i < D; i++) {
                        double want = xv[r * D + i] * inv, e = fabs(ov[r * D + i] - want) / (fabs(want) + 1e-3);
                        if (e > err) err = e;
                    }
                }
                tu_check(err <= tu_tol(DT[di]).rtol, "weightless rms_norm vs f64 %s %s: %g", lk_isa_name(isas[ii]),
                         lk_dtype_name(DT[di]), err);
                free(xv);
                free(ov);
                /* fused: residual and x updated like the call with ones */
                tu_buf xa = tu_alloc(DT[di], 2, s, 0), ra = tu_alloc(LK_F32, 2, s, 1);
                tu_buf xb = tu_alloc(DT[di], 2, s, 1), rb = tu_alloc(LK_F32, 2, s, 0);
                tu_fill_uniform(&xa, -2, 2);
                tu_fill_uniform(&ra, -2, 2);
                for (int64_t i = 0; i < R * D; i++) tu_set(&xb, i, tu_get(&xa, i)), tu_set(&rb, i, tu_get(&ra, i));
                s1 = lk_fused_add_rms_norm(&xa.t, &ra.t, &ones.t, 1e-5f, 0);
                s2 = lk_fused_add_rms_norm(&xb.t, &rb.t, NULL, 1e-5f, 0);
                tu_check(s1 == LK_OK && s2 == LK_OK && tu_same_bits(&xa, &xb) && tu_same_bits(&ra, &rb),
                         "weightless fused_add_rms_norm %s %s R=%d", lk_isa_name(isas[ii]), lk_dtype_name(DT[di]), R);
                tu_free(&xa), tu_free(&ra), tu_free(&xb), tu_free(&rb);
                tu_free(&x), tu_free(&o1), tu_free(&o2), tu_free(&ones);
            }
    }
    lk_set_isa(lk_isa_best());
    /* a bad x with w NULL still names x, nothing written */
    int64_t s[2] = {2, 8}, s3[2] = {2, 9};
    tu_buf x = tu_alloc(LK_F32, 2, s, 0), o = tu_alloc(LK_F32, 2, s3, 0);
    tu_snapshot(&o);
    lk_status st = lk_rms_norm(&o.t, &x.t, NULL, 1e-6f, 0);
    tu_check(st == LK_ERR_SHAPE && strstr(lk_last_error(), "out") && tu_intact(&o), "weightless bad out -> %s (%s)",
             lk_status_str(st), lk_last_error());
    tu_free(&x), tu_free(&o);
}

int main(void) {
    tu_init();
    test_rms_norm_cases();
    test_qk_norm_strided();
    test_transposed();
    test_fused();
    test_threads();
    test_threads_fused();
    test_special_values();
    test_special_values_few_rows();
    test_special_values_fused();
    test_empty();
    test_bad_inputs();
    test_weightless();
    test_regress_empty_huge_stride();
    test_regress_disjoint_huge_stride();
    return tu_finish("test_rms_norm");
}
