/*
 * silu_and_mul and gelu_tanh_and_mul: every ISA against a float64 computation and
 * against ref; odd sizes, ranks 1..4, strided views with garbage padding, permuted and
 * transposed views, every x/out dtype combination, x and out interleaved in one fused
 * buffer, special values (inf, NaN, signed zeros), relative accuracy of tiny and large
 * gates in f32, empty inputs, thread-count independence and the bad-input catalogue.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/half.h"
#include "testutil.h"

#define SQRT_2_OVER_PI 0.79788456080286535588

typedef lk_status (*act_fn)(const lk_tensor *out, const lk_tensor *x);
static const act_fn OPS[2] = {lk_silu_and_mul, lk_gelu_tanh_and_mul};
static const char *OP_NAMES[2] = {"lk_silu_and_mul", "lk_gelu_tanh_and_mul"};

/* float64 activations, the literal formulas. act(-inf) = -0 is the documented limit
 * (the formulas give NaN there). Literal gelu loses digits for very negative gates
 * (1 + tanh(u) cancels), so accuracy tests away from that range use gelu64_sigmoid. */
static double silu64(double g) { return g == -INFINITY ? -0.0 : g / (1.0 + exp(-g)); }
static double gelu64(double g) {
    if (g == -INFINITY) return -0.0;
    double u = SQRT_2_OVER_PI * (g + 0.044715 * g * g * g);
    return 0.5 * g * (1.0 + tanh(u));
}
static double gelu64_sigmoid(double g) {
    double u = SQRT_2_OVER_PI * (g + 0.044715 * g * g * g);
    return g / (1.0 + exp(-2.0 * u));
}
static double act64(int gelu, double g) { return gelu ? gelu64(g) : silu64(g); }

/* want[r, i] = act(x[r, i]) * x[r, d + i] over row-major values x[R][2d] */
static void act_mul64(double *want, const double *x, int64_t R, int64_t d, int gelu) {
    for (int64_t r = 0; r < R; r++)
        for (int64_t i = 0; i < d; i++)
            want[r * d + i] = act64(gelu, x[r * 2 * d + i]) * x[r * 2 * d + d + i];
}

/* SIMD vs ref: exp differs by ~2 f32 ulp; for f16/bf16 outputs 1 ulp of the out dtype */
static tu_tolerance vs_ref_tol(lk_dtype ot) {
    tu_tolerance t = {1e-6, 1e-6};
    if (ot == LK_F16) t.atol = t.rtol = 1e-3;
    if (ot == LK_BF16) t.atol = t.rtol = 8e-3;
    return t;
}

/* Runs op `gelu` on every ISA: x (filled) -> a fresh out view made by mk_out, checks
 * against want (float64) with the out dtype's tolerance, the ISA results against ref,
 * and that nothing outside out's view was written. */
typedef tu_buf (*mk_out_fn)(lk_dtype dt, const int64_t *shape, void *arg);
static void run_all_isas(const char *what, int gelu, const tu_buf *x, lk_dtype ot,
                         const int64_t *oshape, mk_out_fn mk, void *arg, const double *want,
                         int64_t n) {
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    double *first = NULL;
    for (int ii = 0; ii < nisa; ii++) {
        lk_set_isa(isas[ii]);
        tu_buf o = mk(ot, oshape, arg);
        tu_snapshot(&o);
        lk_status st = OPS[gelu](&o.t, &x->t);
        double *got = tu_values(&o);
        double e = tu_err(got, want, n, tu_tol(ot));
        tu_check(st == LK_OK && e <= 1.0 && tu_outside_intact(&o),
                 "%s %s %s x=%s out=%s err=%.3g %s", OP_NAMES[gelu], lk_isa_name(isas[ii]), what,
                 lk_dtype_name(x->t.dtype), lk_dtype_name(ot), e, lk_last_error());
        if (ii == 0) {
            first = got;
        } else {
            double e2 = tu_err(got, first, n, vs_ref_tol(ot));
            tu_check(e2 <= 1.0, "%s %s vs ref %s out=%s err=%.3g", OP_NAMES[gelu],
                     lk_isa_name(isas[ii]), what, lk_dtype_name(ot), e2);
            free(got);
        }
        tu_free(&o);
    }
    lk_set_isa(lk_isa_best());
    free(first);
}

static tu_buf mk_padded(lk_dtype dt, const int64_t *shape, void *arg) {
    int *p = arg; /* {ndim, pad} */
    return tu_alloc(dt, p[0], shape, p[1]);
}

static const int64_t SIZES[][2] = {{1, 1},  {3, 7},   {7, 33},  {2, 4097},
                                   {5, 128}, {33, 64}, {1, 9000}, {3, 8200}};
#define NSIZES (int)(sizeof SIZES / sizeof SIZES[0])

/* 2-D [R, 2d] -> [R, d], every x/out dtype pair, contiguous and padded */
static void test_cases(void) {
    for (int gelu = 0; gelu <= 1; gelu++)
        for (int xi = 0; xi < 3; xi++)
            for (int oi = 0; oi < 3; oi++)
                for (int s = 0; s < NSIZES; s++)
                    for (int pad = 0; pad <= 1; pad++) {
                        lk_dtype xt = TU_FLOAT_DTYPES[xi], ot = TU_FLOAT_DTYPES[oi];
                        int64_t R = SIZES[s][0], d = SIZES[s][1];
                        int64_t xshape[2] = {R, 2 * d}, oshape[2] = {R, d};
                        tu_buf x = tu_alloc(xt, 2, xshape, pad);
                        tu_fill_uniform(&x, -8, 8);
                        double *xv = tu_values(&x), *want = malloc(sizeof(double) * R * d);
                        act_mul64(want, xv, R, d, gelu);
                        char what[64];
                        snprintf(what, sizeof what, "[%lld,%lld] pad=%d", (long long)R,
                                 (long long)(2 * d), pad);
                        int arg[2] = {2, pad};
                        run_all_isas(what, gelu, &x, ot, oshape, mk_padded, arg, want, R * d);
                        free(xv);
                        free(want);
                        tu_free(&x);
                    }
}

/* outputs of 16 MiB or more: non-temporal stores on 32-byte aligned blocks, and the
 * bf16 loop's prefetch; rows 32-byte aligned (contiguous) and not (padded) */
static void test_streamed_out(void) {
    static const struct { int gelu, pad; lk_dtype dt; int64_t R; } C[] = {
        {0, 0, LK_BF16, 2049}, {1, 1, LK_BF16, 2049}, {0, 0, LK_F32, 1025}};
    for (int k = tu_emulated() ? 2 : 0; k < 3; k++) { /* emulated: the f32 case alone */
        int64_t R = C[k].R, d = 4112, xshape[2] = {R, 2 * d}, oshape[2] = {R, d};
        tu_buf x = tu_alloc(C[k].dt, 2, xshape, C[k].pad);
        tu_fill_uniform(&x, -8, 8);
        double *xv = tu_values(&x), *want = malloc(sizeof(double) * R * d);
        act_mul64(want, xv, R, d, C[k].gelu);
        char what[64];
        snprintf(what, sizeof what, "streamed [%lld,%lld] pad=%d", (long long)R, (long long)(2 * d),
                 C[k].pad);
        int arg[2] = {2, C[k].pad};
        run_all_isas(what, C[k].gelu, &x, C[k].dt, oshape, mk_padded, arg, want, R * d);
        free(xv);
        free(want);
        tu_free(&x);
    }
}

/* rank 1, 3 and 4, padded; rank 3 with permuted leading dims (last-dim stride 1, fast
 * path with a non-monotone row walk) */
static tu_buf mk_perm3(lk_dtype dt, const int64_t *shape, void *arg) {
    (void)arg;
    return tu_alloc_perm(dt, 3, shape, (int[]){1, 0, 2}, 1);
}

static void test_ranks(void) {
    const int64_t shapes[][4] = {{66, 0, 0, 0}, {2, 3, 46, 0}, {2, 1, 3, 34}, {3, 5, 2, 0}};
    const int nds[] = {1, 3, 4, 3};
    for (int gelu = 0; gelu <= 1; gelu++)
        for (int k = 0; k < 4; k++) {
            int nd = nds[k];
            int64_t xshape[4], oshape[4];
            memcpy(xshape, shapes[k], sizeof xshape);
            memcpy(oshape, shapes[k], sizeof oshape);
            oshape[nd - 1] /= 2;
            int64_t d = oshape[nd - 1], R = 1;
            for (int i = 0; i < nd - 1; i++) R *= xshape[i];
            int perm = k == 3;
            tu_buf x = perm ? tu_alloc_perm(LK_BF16, 3, xshape, (int[]){1, 0, 2}, 1)
                            : tu_alloc(LK_BF16, nd, xshape, 1);
            tu_fill_uniform(&x, -6, 6);
            double *xv = tu_values(&x), *want = malloc(sizeof(double) * R * d);
            act_mul64(want, xv, R, d, gelu);
            int arg[2] = {nd, 1};
            run_all_isas(perm ? "rank 3 permuted" : nd == 1 ? "rank 1" : nd == 3 ? "rank 3" : "rank 4",
                         gelu, &x, LK_F32, oshape, perm ? mk_perm3 : mk_padded, arg, want, R * d);
            free(xv);
            free(want);
            tu_free(&x);
        }
}

/* transposed 2-D views: last-dim stride != 1 goes through the reference on every ISA */
static tu_buf mk_transposed(lk_dtype dt, const int64_t *shape, void *arg) {
    (void)arg;
    return tu_alloc_perm(dt, 2, shape, (int[]){1, 0}, 2);
}

static void test_transposed(void) {
    int64_t R = 9, d = 21, xshape[2] = {R, 2 * d}, oshape[2] = {R, d};
    for (int gelu = 0; gelu <= 1; gelu++) {
        tu_buf x = tu_alloc_perm(LK_F16, 2, xshape, (int[]){1, 0}, 1);
        tu_fill_uniform(&x, -5, 5);
        double *xv = tu_values(&x), want[9 * 21];
        act_mul64(want, xv, R, d, gelu);
        run_all_isas("transposed views", gelu, &x, LK_BF16, oshape, mk_transposed, NULL, want, R * d);
        free(xv);
        tu_free(&x);
    }
}

/* vLLM layout: one buffer [T, 3d]; x = [:, 0:2d], out = [:, 2d:3d] (interleaved rows,
 * disjoint bytes: allowed); the x columns stay untouched */
static void test_fused_buffer(void) {
    int64_t T = 5, d = 40, W = 3 * d;
    for (int gelu = 0; gelu <= 1; gelu++) {
        tu_buf buf = tu_alloc(LK_F32, 2, (int64_t[]){T, W}, 0);
        tu_fill_uniform(&buf, -4, 4);
        double *all = tu_values(&buf), xv[5 * 80], want[5 * 40];
        for (int64_t t = 0; t < T; t++)
            for (int64_t i = 0; i < 2 * d; i++) xv[t * 2 * d + i] = all[t * W + i];
        act_mul64(want, xv, T, d, gelu);
        lk_tensor x = {buf.t.data, LK_F32, 2, {T, 2 * d}, {W, 1}};
        lk_tensor out = {(float *)buf.t.data + 2 * d, LK_F32, 2, {T, d}, {W, 1}};
        lk_status st = OPS[gelu](&out, &x);
        double *after = tu_values(&buf);
        int ok = st == LK_OK;
        for (int64_t t = 0; t < T && ok; t++)
            for (int64_t i = 0; i < W && ok; i++) {
                double v = after[t * W + i];
                if (i >= 2 * d) ok = fabs(v - want[t * d + i - 2 * d]) <= 1e-5 * (1 + fabs(v));
                else ok = memcmp(&v, &all[t * W + i], sizeof v) == 0;
            }
        tu_check(ok, "%s x and out interleaved in one [T, 3d] buffer (%s)", OP_NAMES[gelu],
                 lk_last_error());
        free(all);
        free(after);
        tu_free(&buf);
    }
}

/* same class (NaN / inf / zero) and sign; finite non-zero values within tolerance */
static int same_special(double got, double want, tu_tolerance tol) {
    if (isnan(want) || isnan(got)) return isnan(want) && isnan(got);
    if (isinf(want) || isinf(got)) return got == want;
    if (want == 0 || got == 0) return got == want && signbit(got) == signbit(want);
    return fabs(got - want) <= tol.atol + tol.rtol * fabs(want);
}

/* every gate x every up value, one row: act(-inf) = -0 (so -0 * y), act(+inf) = inf,
 * NaN propagates, signed zeros, huge gates, the band where exp(-g) is near the f32
 * overflow (silu(-88.5) ~ -3e-37 is still a normal f32; gelu(-10.5) is -0); 98 columns
 * cover the unrolled, single-vector and tail paths of every ISA */
static void test_special_values(void) {
    const double gates[] = {-INFINITY, INFINITY, NAN,   -0.0,   0.0,   1e-30, -1e-30,
                            3.5,       -3.5,     1e30,  -1e30,  -200.0, -88.5, -10.5};
    const double ups[] = {1.0, -1.0, 0.0, -0.0, INFINITY, -INFINITY, NAN};
    enum { ng = 14, nu = 7 };
    int64_t d = ng * nu, xshape[2] = {1, 2 * d}, oshape[2] = {1, d};
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    for (int gelu = 0; gelu <= 1; gelu++)
        for (int di = 0; di < 3; di++) {
            lk_dtype dt = TU_FLOAT_DTYPES[di];
            tu_buf x = tu_alloc(dt, 2, xshape, 0);
            for (int a = 0; a < ng; a++)
                for (int b = 0; b < nu; b++) {
                    tu_set(&x, a * nu + b, gates[a]);
                    tu_set(&x, d + a * nu + b, ups[b]);
                }
            double *xv = tu_values(&x), want[ng * nu];
            for (int64_t i = 0; i < d; i++) { /* f32 semantics: act rounded to f32 first */
                float act = (float)act64(gelu, xv[i]);
                want[i] = lk_round_to(dt, act * (float)xv[d + i]);
            }
            for (int ii = 0; ii < nisa; ii++) {
                lk_set_isa(isas[ii]);
                tu_buf o = tu_alloc(dt, 2, oshape, 0);
                lk_status st = OPS[gelu](&o.t, &x.t);
                double *got = tu_values(&o);
                int bad = -1;
                for (int64_t i = 0; i < d && bad < 0; i++)
                    if (!same_special(got[i], want[i], tu_tol(dt))) bad = (int)i;
                char why[128] = "";
                if (bad >= 0)
                    snprintf(why, sizeof why, ": g=%g y=%g gives %g, want %g", xv[bad],
                             xv[d + bad], got[bad], want[bad]);
                tu_check(st == LK_OK && bad < 0, "%s %s %s special values%s", OP_NAMES[gelu],
                         lk_isa_name(isas[ii]), lk_dtype_name(dt), why);
                free(got);
                tu_free(&o);
            }
            lk_set_isa(lk_isa_best());
            free(xv);
            tu_free(&x);
        }
}

/* Relative accuracy in f32 with up = 1 (out = act(g)), in units of 2^-23 ("ulp"):
 *  - tiny gates |g| in [1e-30, 1e-2] against the literal float64 formulas (a
 *    cancellation would show up as relative error): within 2 ulp;
 *  - the full range where the result is a normal f32: silu g in [-87, 87] (the f32
 *    argument -g is exact: within 2 ulp), gelu g in [-9.5, 10] against the float64
 *    sigmoid form (the literal float64 formula itself cancels for g << 0). There -2u
 *    is computed in f32 and rounded, so exp(-2u) carries a relative error of about
 *    an ulp times |2u| (up to ~85): 2 ulp + 2 ulp * |2u|. A 1 + tanh(u) evaluation in
 *    f32 fails this by orders of magnitude for g < -3. */
static void test_accuracy(void) {
    enum { N = 4000 };
    const double ulp = 1.0 / 8388608.0; /* 2^-23 */
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    for (int gelu = 0; gelu <= 1; gelu++)
        for (int range = 0; range <= 1; range++) {
            tu_buf x = tu_alloc(LK_F32, 2, (int64_t[]){1, 2 * N}, 0);
            for (int64_t i = 0; i < N; i++) {
                double g;
                if (range == 0) g = (tu_rand() & 1 ? 1 : -1) * pow(10.0, tu_uniform(-30, -2));
                else g = gelu ? tu_uniform(-9.5, 10) : tu_uniform(-87, 87);
                tu_set(&x, i, g);
                tu_set(&x, N + i, 1.0);
            }
            double *xv = tu_values(&x);
            for (int ii = 0; ii < nisa; ii++) {
                lk_set_isa(isas[ii]);
                tu_buf o = tu_alloc(LK_F32, 2, (int64_t[]){1, N}, 0);
                lk_status st = OPS[gelu](&o.t, &x.t);
                double *got = tu_values(&o), worst = 0, worst_g = 0;
                for (int64_t i = 0; i < N; i++) {
                    double g = xv[i];
                    double want = range == 0 ? act64(gelu, g) : gelu ? gelu64_sigmoid(g) : silu64(g);
                    double two_u = 2 * SQRT_2_OVER_PI * fabs(g + 0.044715 * g * g * g);
                    double tol = 2 * ulp + (gelu ? 2 * ulp * two_u : 0);
                    double e = fabs(got[i] - want) / fabs(want) / tol;
                    if (isnan(e) || e > worst) worst = isnan(e) ? INFINITY : e, worst_g = g;
                }
                tu_check(st == LK_OK && worst <= 1.0,
                         "%s %s relative accuracy, %s gates: worst %.3g of tolerance (g=%.9g)",
                         OP_NAMES[gelu], lk_isa_name(isas[ii]), range == 0 ? "tiny" : "full-range",
                         worst, worst_g);
                free(got);
                tu_free(&o);
            }
            lk_set_isa(lk_isa_best());
            free(xv);
            tu_free(&x);
        }
}

/* Every bf16 gate (all 65536 bit patterns: zeros, subnormals, the overflow edges,
 * infinities, NaNs) times three ups (1, -2.75 and random values), bf16 -> bf16, every
 * ISA against ref, bit by bit: NaN where ref has NaN, otherwise the same bits or, for
 * finite non-zero results of the same sign, the neighbouring bf16 (the SIMD exp and
 * the reference expf differ by ~1e-6 relative; the bf16 path of AVX2 uses its own
 * shorter exp). Neighbours must stay rare: at most 0.5% of the outputs. */
static int bf16_class(uint16_t b) { /* 0 finite non-zero, 1 zero, 2 inf, 3 NaN */
    if ((b & 0x7f80) == 0x7f80) return (b & 0x7f) ? 3 : 2;
    return (b & 0x7fff) ? 0 : 1;
}

static void test_every_bf16_gate(void) {
    enum { N = 65536, R = 3 };
    uint16_t *x = malloc(sizeof(uint16_t) * R * 2 * N), *want = malloc(sizeof(uint16_t) * R * N),
             *got = malloc(sizeof(uint16_t) * R * N);
    for (int r = 0; r < R; r++)
        for (int i = 0; i < N; i++) {
            x[r * 2 * N + i] = (uint16_t)i;
            uint16_t u = r == 0 ? 0x3f80 /* 1 */ : r == 1 ? 0xc030 /* -2.75 */
                                                           : lk_f32_to_bf16((float)tu_uniform(-4, 4));
            x[r * 2 * N + N + i] = u;
        }
    lk_tensor xt = lk_tensor_make(x, LK_BF16, 2, (int64_t[]){R, 2 * N});
    lk_tensor wt = lk_tensor_make(want, LK_BF16, 2, (int64_t[]){R, N});
    lk_tensor gt = lk_tensor_make(got, LK_BF16, 2, (int64_t[]){R, N});
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    for (int gelu = 0; gelu <= 1; gelu++) {
        lk_set_isa(LK_ISA_REF);
        OPS[gelu](&wt, &xt);
        for (int ii = 1; ii < nisa; ii++) {
            lk_set_isa(isas[ii]);
            memset(got, 0xa5, sizeof(uint16_t) * R * N);
            lk_status st = OPS[gelu](&gt, &xt);
            int64_t bad = -1, near = 0;
            for (int64_t k = 0; k < (int64_t)R * N && bad < 0; k++) {
                uint16_t a = got[k], b = want[k];
                int ca = bf16_class(a), cb = bf16_class(b);
                if (cb == 3 ? ca == 3 : a == b) continue;
                int d = (int)(a & 0x7fff) - (int)(b & 0x7fff);
                if (ca == 0 && cb == 0 && (a & 0x8000) == (b & 0x8000) && (d == 1 || d == -1)) near++;
                else bad = k;
            }
            tu_check(st == LK_OK && bad < 0 && near * 200 <= (int64_t)R * N,
                     "%s %s every bf16 gate: %lld neighbours of %d%s", OP_NAMES[gelu],
                     lk_isa_name(isas[ii]), (long long)near, R * N,
                     bad < 0 ? "" : " (a result differs by more than one bf16)");
            if (bad >= 0)
                fprintf(stderr, "  gate 0x%04x up 0x%04x: got 0x%04x want 0x%04x\n",
                        (unsigned)(bad % N), (unsigned)x[(bad / N) * 2 * N + N + bad % N],
                        (unsigned)got[bad], (unsigned)want[bad]);
        }
    }
    lk_set_isa(lk_isa_best());
    free(x), free(want), free(got);
}

/* bitwise identical for 1..4 threads: many rows, and one decode row split in blocks */
static void test_threads(void) {
    const int64_t shapes[][2] = {{301, 4096}, {1, 14336}};
    for (int gelu = 0; gelu <= 1; gelu++)
        for (int s = 0; s < 2; s++) {
            int64_t R = shapes[s][0], d = shapes[s][1];
            tu_buf x = tu_alloc(LK_BF16, 2, (int64_t[]){R, 2 * d}, 0);
            tu_fill_uniform(&x, -8, 8);
            tu_buf o1 = tu_alloc(LK_BF16, 2, (int64_t[]){R, d}, 0);
            lk_set_num_threads(1);
            OPS[gelu](&o1.t, &x.t);
            for (int nt = 2; nt <= 4; nt++) {
                tu_buf o = tu_alloc(LK_BF16, 2, (int64_t[]){R, d}, 0);
                lk_set_num_threads(nt);
                lk_status st = OPS[gelu](&o.t, &x.t);
                tu_check(st == LK_OK && tu_same_bits(&o, &o1),
                         "%s [%lld,%lld] bitwise identical with %d threads", OP_NAMES[gelu],
                         (long long)R, (long long)(2 * d), nt);
                tu_free(&o);
            }
            lk_set_num_threads(0);
            tu_free(&x);
            tu_free(&o1);
        }
}

static void test_empty(void) {
    const int64_t xs[][2] = {{0, 64}, {4, 0}};
    for (int gelu = 0; gelu <= 1; gelu++)
        for (int k = 0; k < 2; k++) {
            int64_t oshape[2] = {xs[k][0], xs[k][1] / 2};
            tu_buf x = tu_alloc(LK_F32, 2, xs[k], 0), o = tu_alloc(LK_F32, 2, oshape, 0);
            tu_snapshot(&x);
            tu_snapshot(&o);
            lk_status st = OPS[gelu](&o.t, &x.t);
            tu_check(st == LK_OK && tu_intact(&o) && tu_intact(&x), "%s x [%lld,%lld] is a no-op",
                     OP_NAMES[gelu], (long long)xs[k][0], (long long)xs[k][1]);
            tu_free(&x);
            tu_free(&o);
        }
}

/* each rule: right status, message names the op and the argument, nothing written */
static void test_bad_inputs(void) {
    int64_t xshape[2] = {4, 32}, oshape[2] = {4, 16};
    tu_buf x = tu_alloc(LK_F32, 2, xshape, 0), o = tu_alloc(LK_F32, 2, oshape, 0);
    tu_buf big = tu_alloc(LK_F32, 1, (int64_t[]){256}, 0);
    tu_fill_uniform(&x, -1, 1);
    tu_fill_uniform(&o, -1, 1);
    tu_fill_uniform(&big, -1, 1);
    struct bad_case {
        const char *what, *arg;
        lk_status want;
        lk_tensor out, x;
    } cases[32];
    int n = 0;
#define CASE(W, A, S, O, X) cases[n++] = (struct bad_case){W, A, S, O, X}
    lk_tensor t;
    t = x.t; t.ndim = 0;
    CASE("x rank 0", "x", LK_ERR_RANK, o.t, t);
    t = x.t; t.ndim = 9;
    CASE("x rank 9", "x", LK_ERR_RANK, o.t, t);
    t = o.t; t.ndim = 0;
    CASE("out rank 0", "out", LK_ERR_RANK, t, x.t);
    t = o.t; t.ndim = 3; t.shape[2] = 1; t.stride[2] = 1;
    CASE("out rank differs from x", "out", LK_ERR_RANK, t, x.t);
    t = x.t; t.shape[1] = 31;
    CASE("x last dim odd", "x", LK_ERR_SHAPE, o.t, t);
    t = o.t; t.shape[1] = 15;
    CASE("out last dim not half of x", "out", LK_ERR_SHAPE, t, x.t);
    t = o.t; t.shape[1] = 32; t.stride[0] = 32;
    CASE("out last dim equal to x's", "out", LK_ERR_SHAPE, t, x.t);
    t = o.t; t.shape[0] = 3;
    CASE("out leading dim mismatch", "out", LK_ERR_SHAPE, t, x.t);
    t = x.t; t.dtype = LK_I32;
    CASE("x int dtype", "x", LK_ERR_DTYPE, o.t, t);
    t = o.t; t.dtype = LK_I64;
    CASE("out int dtype", "out", LK_ERR_DTYPE, t, x.t);
    t = o.t; t.dtype = (lk_dtype)77;
    CASE("out unknown dtype", "out", LK_ERR_DTYPE, t, x.t);
    t = x.t; t.data = NULL;
    CASE("x NULL data", "x", LK_ERR_NULL, o.t, t);
    t = o.t; t.data = NULL;
    CASE("out NULL data", "out", LK_ERR_NULL, t, x.t);
    t = x.t; t.shape[0] = -1;
    CASE("x negative size", "x", LK_ERR_SHAPE, o.t, t);
    t = x.t; t.stride[0] = INT64_MAX / 2;
    CASE("x stride overflow", "x", LK_ERR_OVERFLOW, o.t, t);
    t = o.t; t.stride[1] = INT64_MIN;
    CASE("out stride INT64_MIN", "out", LK_ERR_OVERFLOW, t, x.t);
    t = o.t; t.stride[0] = 0;
    CASE("out stride 0 overlaps itself", "out", LK_ERR_ALIAS, t, x.t);
    t = o.t; t.stride[0] = 8;
    CASE("out rows overlap", "out", LK_ERR_ALIAS, t, x.t);
    { /* x and out inside one buffer */
        lk_tensor xb = {big.t.data, LK_F32, 2, {4, 32}, {32, 1}};
        lk_tensor ob = {big.t.data, LK_F32, 2, {4, 16}, {32, 1}};
        CASE("out is x's gate half (in place)", "out", LK_ERR_ALIAS, ob, xb);
        ob.data = (float *)big.t.data + 16;
        CASE("out is x's up half", "out", LK_ERR_ALIAS, ob, xb);
        ob.data = (float *)big.t.data + 120; /* contiguous [4, 16] starting inside x */
        ob.stride[0] = 16;
        CASE("out partially overlaps x", "out", LK_ERR_ALIAS, ob, xb);
    }
#undef CASE
    for (int gelu = 0; gelu <= 1; gelu++) {
        for (int i = 0; i < n; i++) {
            tu_snapshot(&x);
            tu_snapshot(&o);
            tu_snapshot(&big);
            lk_status st = OPS[gelu](&cases[i].out, &cases[i].x);
            const char *msg = lk_last_error();
            char arg1[16], arg2[16]; /* "out: rule" or "out and x overlap" */
            snprintf(arg1, sizeof arg1, ": %s:", cases[i].arg);
            snprintf(arg2, sizeof arg2, ": %s and ", cases[i].arg);
            tu_check(st == cases[i].want && (strstr(msg, arg1) || strstr(msg, arg2)) &&
                         strstr(msg, OP_NAMES[gelu]) &&
                         tu_intact(&x) && tu_intact(&o) && tu_intact(&big),
                     "%s bad input '%s' -> %s (%s)", OP_NAMES[gelu], cases[i].what,
                     lk_status_str(st), msg);
        }
        lk_status st = OPS[gelu](NULL, &x.t);
        tu_check(st == LK_ERR_NULL && strstr(lk_last_error(), "out"), "%s NULL out pointer",
                 OP_NAMES[gelu]);
        st = OPS[gelu](&o.t, NULL);
        tu_check(st == LK_ERR_NULL && strstr(lk_last_error(), "x:"), "%s NULL x pointer",
                 OP_NAMES[gelu]);
        /* a valid call clears the error text */
        st = OPS[gelu](&o.t, &x.t);
        tu_check(st == LK_OK && lk_last_error()[0] == 0, "%s success clears lk_last_error",
                 OP_NAMES[gelu]);
    }
    tu_free(&x);
    tu_free(&o);
    tu_free(&big);
}

int main(void) {
    tu_init();
    test_cases();
    test_ranks();
    test_transposed();
    test_fused_buffer();
    test_special_values();
    test_accuracy();
    test_every_bf16_gate();
    test_threads();
    test_streamed_out();
    test_empty();
    test_bad_inputs();
    return tu_finish("test_activation");
}
