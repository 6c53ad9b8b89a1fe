/*
 * causal_softmax: every ISA against a float64 softmax and against ref; the bottom-right
 * causal mask with q_len < k_len, q_len = k_len, q_len > k_len (rows that see no key are
 * all 0) and q_len = 1; k_len 1, 7, 33, 4097 and rows longer than the SIMD scratch
 * buffer; rank 2, 3, 4; strided views with garbage padding, transposed (last-dim stride
 * != 1) views, in place; every dtype and mixed dtypes; the -inf / NaN / +inf rules;
 * empty inputs; thread-count independence; the bad-input catalogue.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* float64 causal softmax of rows x[rows][k_len], query index = row % q_len.
 * Rules: masked -> 0; no visible key or all visible -inf -> 0; a visible NaN or +inf
 * -> the visible part is NaN. */
static void softmax64(double *want, const double *x, int64_t rows, int64_t q_len, int64_t k_len) {
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + r * k_len;
        double *wr = want + r * k_len;
        int64_t nv = r % q_len + k_len - q_len + 1;
        if (nv < 0) nv = 0;
        double m = -INFINITY;
        int bad = 0;
        for (int64_t j = 0; j < nv; j++) {
            if (isnan(xr[j]) || xr[j] == INFINITY) bad = 1;
            else if (xr[j] > m) m = xr[j];
        }
        double l = 0;
        for (int64_t j = 0; j < nv && m != -INFINITY; j++) l += exp(xr[j] - m);
        for (int64_t j = 0; j < k_len; j++)
            wr[j] = j >= nv ? 0.0 : bad ? NAN : m == -INFINITY ? 0.0 : exp(xr[j] - m) / l;
    }
}

/* "[2, 3, 5]" (a few rotating buffers) */
static const char *shape_str(const lk_tensor *t) {
    static char bufs[4][96];
    static int which;
    char *b = bufs[which++ & 3];
    int k = snprintf(b, 96, "[");
    for (int d = 0; d < t->ndim && k < 80; d++) k += snprintf(b + k, (size_t)(96 - k), d ? ", %lld" : "%lld", (long long)t->shape[d]);
    snprintf(b + k, (size_t)(96 - k), "]");
    return b;
}

/* the SIMD-vs-ref tolerance: exp polynomial vs expf, f32 sums in another order */
static tu_tolerance vs_ref_tol(lk_dtype dt) {
    tu_tolerance t = tu_tol(dt);
    if (dt == LK_F16) t.atol = t.rtol = 1e-3;
    if (dt == LK_BF16) t.atol = t.rtol = 8e-3;
    return t;
}

typedef void (*fill_fn)(tu_buf *x, int64_t rows, int64_t q_len, int64_t k_len);

static void fill_random(tu_buf *x, int64_t rows, int64_t q_len, int64_t k_len) {
    (void)rows, (void)q_len, (void)k_len;
    tu_fill_uniform(x, -8, 8);
}

/* special values, by row: -inf entries, all visible -inf, a visible NaN, a visible
 * +inf, NaN / +inf only in the masked part (must not matter), huge values */
static void fill_special(tu_buf *x, int64_t rows, int64_t q_len, int64_t k_len) {
    tu_fill_uniform(x, -8, 8);
    for (int64_t r = 0; r < rows; r++) {
        int64_t nv = r % q_len + k_len - q_len + 1;
        if (nv > k_len) nv = k_len;
        if (nv <= 0) {
            for (int64_t j = 0; j < k_len; j++) tu_set(x, r * k_len + j, NAN); /* never read */
            continue;
        }
        int64_t j = tu_randint(0, nv - 1);
        switch (r % 7) {
        case 0:
            for (int64_t k = 0; k < nv; k += 2) tu_set(x, r * k_len + k, -INFINITY);
            break;
        case 1:
            for (int64_t k = 0; k < nv; k++) tu_set(x, r * k_len + k, -INFINITY);
            break;
        case 2: tu_set(x, r * k_len + j, NAN); break;
        case 3: tu_set(x, r * k_len + j, INFINITY); break;
        case 4:
            for (int64_t k = nv; k < k_len; k++) tu_set(x, r * k_len + k, k % 2 ? NAN : INFINITY);
            break;
        case 5:
            for (int64_t k = 0; k < nv; k++) tu_set(x, r * k_len + k, tu_uniform(-60000, 60000));
            break;
        default: tu_set(x, r * k_len + j, 3e4); break; /* one dominant entry */
        }
    }
}

typedef struct {
    int ndim;
    int64_t shape[4];
    lk_dtype xt, ot;
    int pad, inplace, transposed;
    fill_fn fill;
} scase;

static void run_case(const scase *c, const char *what) {
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    int nd = c->ndim;
    int64_t q_len = c->shape[nd - 2], k_len = c->shape[nd - 1];
    int64_t n = 1;
    for (int d = 0; d < nd; d++) n *= c->shape[d];
    int64_t rows = k_len ? n / k_len : 0;
    int perm[4] = {0, 1, 2, 3};
    if (c->transposed) perm[nd - 2] = nd - 1, perm[nd - 1] = nd - 2;
    tu_buf x = tu_alloc_perm(c->xt, nd, c->shape, perm, c->pad);
    c->fill(&x, rows, q_len, k_len);
    double *xv = tu_values(&x), *want = malloc(sizeof(double) * (size_t)(n + 1));
    softmax64(want, xv, rows, q_len, k_len);
    double *ref = NULL;
    for (int ii = 0; ii < nisa; ii++) {
        lk_set_isa(isas[ii]);
        tu_buf o = tu_alloc_perm(c->inplace ? c->xt : c->ot, nd, c->shape, perm, c->pad);
        if (c->inplace)
            for (int64_t i = 0; i < n; i++) tu_set(&o, i, xv[i]);
        tu_snapshot(&o);
        tu_snapshot(&x);
        lk_status s = lk_causal_softmax(&o.t, c->inplace ? &o.t : &x.t);
        double *got = tu_values(&o);
        lk_dtype ot = c->inplace ? c->xt : c->ot;
        double e = tu_err(got, want, n, tu_tol(ot));
        tu_check(s == LK_OK && e <= 1 && tu_outside_intact(&o) && tu_intact(&x),
                 "%s %s %s x=%s out=%s pad=%d inplace=%d transposed=%d err=%.3g %s", what,
                 lk_isa_name(isas[ii]), shape_str(&x.t), lk_dtype_name(c->xt), lk_dtype_name(ot),
                 c->pad, c->inplace, c->transposed, e, lk_last_error());
        if (ii == 0) {
            ref = got;
            got = NULL;
        } else {
            double e2 = tu_err(got, ref, n, vs_ref_tol(ot));
            tu_check(e2 <= 1, "%s %s vs ref %s err=%.3g", what, lk_isa_name(isas[ii]),
                     shape_str(&x.t), e2);
        }
        free(got);
        tu_free(&o);
    }
    lk_set_isa(lk_isa_best());
    free(ref);
    free(xv);
    free(want);
    tu_free(&x);
}

static void test_grid(void) {
    /* [B, q_len, k_len] */
    static const int64_t QK[][2] = {{1, 1}, {1, 7}, {3, 7}, {7, 7}, {9, 4}, {1, 33}, {5, 33},
                                    {33, 33}, {40, 33}, {1, 4097}, {3, 4097}, {2, 8}, {4, 100}};
    static const lk_dtype combos[][2] = {{LK_F32, LK_F32},  {LK_F16, LK_F16},  {LK_BF16, LK_BF16},
                                         {LK_BF16, LK_F32}, {LK_F32, LK_BF16}, {LK_F16, LK_BF16}};
    for (int s = 0; s < (int)(sizeof QK / sizeof QK[0]); s++)
        for (int k = 0; k < 6; k++)
            for (int mode = 0; mode < 4; mode++) { /* 0 plain, 1 padded, 2 in place, 3 in place padded */
                scase c;
                memset(&c, 0, sizeof c);
                c.ndim = 3;
                c.shape[0] = QK[s][1] > 1000 ? 1 : 2;
                c.shape[1] = QK[s][0], c.shape[2] = QK[s][1];
                c.xt = combos[k][0], c.ot = combos[k][1];
                c.pad = mode & 1;
                c.inplace = mode >= 2;
                if (c.inplace && c.xt != c.ot) continue;
                c.fill = fill_random;
                run_case(&c, "grid");
            }
}

static void test_shapes(void) {
    scase c;
    memset(&c, 0, sizeof c);
    c.fill = fill_random;
    /* rank 2 and rank 4 */
    c.ndim = 2, c.shape[0] = 6, c.shape[1] = 10, c.xt = LK_BF16, c.ot = LK_F16;
    run_case(&c, "rank2");
    c.ndim = 4, c.shape[0] = 2, c.shape[1] = 3, c.shape[2] = 5, c.shape[3] = 19, c.pad = 1;
    run_case(&c, "rank4");
    /* transposed [k_len, q_len] storage (last-dim stride != 1): reference path */
    c.ndim = 3, c.shape[0] = 2, c.shape[1] = 6, c.shape[2] = 11, c.pad = 0, c.transposed = 1;
    c.xt = LK_F32, c.ot = LK_BF16;
    run_case(&c, "transposed");
    c.inplace = 1, c.pad = 1;
    run_case(&c, "transposed");
    /* rows longer than the SIMD scratch (exps recomputed), in place and not */
    c.transposed = 0, c.inplace = 0, c.pad = 0;
    c.shape[0] = 1, c.shape[1] = 3, c.shape[2] = 9001, c.xt = LK_BF16, c.ot = LK_BF16;
    run_case(&c, "long");
    c.inplace = 1, c.xt = LK_F16;
    run_case(&c, "long");
    c.inplace = 0, c.xt = LK_F32, c.ot = LK_F32;
    run_case(&c, "long");
    /* decode: q_len = 1 */
    c.ndim = 3, c.shape[0] = 5, c.shape[1] = 1, c.shape[2] = 300, c.xt = LK_BF16, c.ot = LK_BF16;
    run_case(&c, "decode");
}

static void test_special(void) {
    static const int64_t QK[][2] = {{14, 14}, {21, 9}, {7, 40}, {14, 300}};
    for (int s = 0; s < 4; s++)
        for (int k = 0; k < 3; k++)
            for (int inplace = 0; inplace <= 1; inplace++) {
                scase c;
                memset(&c, 0, sizeof c);
                c.ndim = 3, c.shape[0] = 1, c.shape[1] = QK[s][0], c.shape[2] = QK[s][1];
                c.xt = TU_FLOAT_DTYPES[k], c.ot = TU_FLOAT_DTYPES[(k + inplace) % 3];
                c.inplace = inplace, c.pad = s % 2;
                c.fill = fill_special;
                run_case(&c, "special");
            }
    /* a row that sees no key is exactly +0, never NaN */
    int64_t shape[2] = {5, 3};
    tu_buf x = tu_alloc(LK_F32, 2, shape, 0), o = tu_alloc(LK_BF16, 2, shape, 0);
    tu_fill_uniform(&x, -1, 1);
    lk_status s = lk_causal_softmax(&o.t, &x.t);
    int ok = s == LK_OK;
    for (int64_t i = 0; i < 6; i++) ok &= tu_get(&o, i) == 0 && !signbit(tu_get(&o, i));
    tu_check(ok, "q_len > k_len: the first q_len - k_len rows are +0");
    tu_free(&x), tu_free(&o);
}

static void test_threads(void) {
    int64_t shape[3] = {8, 256, 512};
    tu_buf x = tu_alloc(LK_BF16, 3, shape, 0), o1 = tu_alloc(LK_BF16, 3, shape, 0);
    tu_fill_uniform(&x, -8, 8);
    lk_set_num_threads(1);
    lk_causal_softmax(&o1.t, &x.t);
    for (int nt = 2; nt <= 4; nt++) {
        tu_buf o = tu_alloc(LK_BF16, 3, shape, 0);
        lk_set_num_threads(nt);
        lk_causal_softmax(&o.t, &x.t);
        tu_check(tu_same_bits(&o, &o1), "causal_softmax bitwise identical with %d threads", nt);
        tu_free(&o);
    }
    lk_set_num_threads(0);
    tu_free(&x), tu_free(&o1);
}

static void test_empty(void) {
    static const int64_t shapes[][3] = {{0, 4, 4}, {3, 0, 5}, {3, 5, 0}};
    for (int k = 0; k < 3; k++) {
        tu_buf x = tu_alloc(LK_F32, 3, shapes[k], 0), o = tu_alloc(LK_F32, 3, shapes[k], 0);
        tu_snapshot(&o);
        lk_status s = lk_causal_softmax(&o.t, &x.t);
        tu_check(s == LK_OK && tu_intact(&o), "causal_softmax empty %s is a no-op", shape_str(&x.t));
        tu_free(&x), tu_free(&o);
    }
}

static void test_bad_inputs(void) {
    int64_t shape[3] = {2, 4, 16};
    tu_buf x = tu_alloc(LK_F32, 3, shape, 0), o = tu_alloc(LK_F32, 3, shape, 0);
    tu_buf big = tu_alloc(LK_F32, 1, (int64_t[]){256}, 0);
    tu_fill_uniform(&x, -1, 1);
    tu_fill_uniform(&o, -1, 1);
    tu_fill_uniform(&big, -1, 1);
    struct bad_case {
        const char *what, *arg;
        lk_status want;
        lk_tensor out, x;
    } cases[24];
    int n = 0;
#define CASE(W, A, S, O, X) cases[n++] = (struct bad_case){W, A, S, O, X}
    lk_tensor t, u;
    t = x.t; t.ndim = 1;
    CASE("x rank 1", "x", LK_ERR_RANK, o.t, t);
    t = o.t; t.ndim = 9;
    CASE("out rank 9", "out", LK_ERR_RANK, t, x.t);
    t = o.t; t.shape[1] = 3;
    CASE("out shape mismatch", "out", LK_ERR_SHAPE, t, x.t);
    t = x.t; t.dtype = LK_I32;
    CASE("x int dtype", "x", LK_ERR_DTYPE, o.t, t);
    t = o.t; t.dtype = LK_I64;
    CASE("out int dtype", "out", LK_ERR_DTYPE, t, x.t);
    t = x.t; t.data = NULL;
    CASE("x NULL data", "x", LK_ERR_NULL, o.t, t);
    t = x.t; t.shape[2] = -1;
    CASE("x negative size", "x", LK_ERR_SHAPE, o.t, t);
    t = x.t; t.stride[1] = INT64_MAX / 4;
    CASE("x stride overflow", "x", LK_ERR_OVERFLOW, o.t, t);
    t = o.t; t.stride[2] = 0;
    CASE("out stride 0 overlaps itself", "out", LK_ERR_ALIAS, t, x.t);
    /* one buffer: x = big[0..128) as [2, 4, 16]; out shifted by one element */
    t = big.t; t.ndim = 3; t.shape[0] = 2, t.shape[1] = 4, t.shape[2] = 16;
    t.stride[0] = 64, t.stride[1] = 16, t.stride[2] = 1;
    u = t; u.data = (float *)big.t.data + 1;
    CASE("out partially overlaps x", "out", LK_ERR_ALIAS, u, t);
    u = t; u.stride[0] = 1, u.stride[1] = 2, u.stride[2] = 8; /* same data, other strides */
    CASE("out same buffer, other strides", "out", LK_ERR_ALIAS, u, t);
    u = t; u.dtype = LK_F16;
    CASE("out same data, other dtype", "out", LK_ERR_ALIAS, u, t);
#undef CASE
    for (int i = 0; i < n; i++) {
        tu_snapshot(&x);
        tu_snapshot(&o);
        tu_snapshot(&big);
        lk_status s = lk_causal_softmax(&cases[i].out, &cases[i].x);
        const char *msg = lk_last_error();
        tu_check(s == cases[i].want && strstr(msg, cases[i].arg) && strstr(msg, "lk_causal_softmax") &&
                     tu_intact(&x) && tu_intact(&o) && tu_intact(&big),
                 "bad input '%s' -> %s (%s)", cases[i].what, lk_status_str(s), msg);
    }
    lk_status s = lk_causal_softmax(NULL, &x.t);
    tu_check(s == LK_ERR_NULL && strstr(lk_last_error(), "out"), "NULL out (%s)", lk_last_error());
    s = lk_causal_softmax(&o.t, NULL);
    tu_check(s == LK_ERR_NULL && strstr(lk_last_error(), "x"), "NULL x (%s)", lk_last_error());
    s = lk_causal_softmax(&o.t, &x.t);
    tu_check(s == LK_OK && lk_last_error()[0] == 0, "successful call clears lk_last_error");
    tu_free(&x), tu_free(&o), tu_free(&big);
}

/* fuzz regression (fuzz_softmax): x, out [2, 1, 40] whose size-1 dim has stride
 * INT64_MAX (valid: a size-1 dim adds no offset). lk_rowit_next added that stride to the
 * running offset (signed overflow, UBSan). Every ISA must give the bits of the same
 * call with an ordinary stride. */
static void test_regress_huge_stride_size1(void) {
    int64_t shape[3] = {2, 1, 40};
    lk_isa isas[TU_MAX_ISAS];
    int ni = tu_isas(isas);
    tu_buf x = tu_alloc(LK_F32, 3, shape, 0);
    tu_fill_uniform(&x, -4, 4);
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        tu_buf o1 = tu_alloc(LK_F32, 3, shape, 0), o2 = tu_alloc(LK_F32, 3, shape, 0);
        lk_status s1 = lk_causal_softmax(&o1.t, &x.t);
        lk_tensor xv = x.t, ov = o2.t;
        xv.stride[1] = ov.stride[1] = INT64_MAX;
        lk_status s2 = lk_causal_softmax(&ov, &xv);
        tu_check(s1 == LK_OK && s2 == LK_OK && tu_same_bits(&o1, &o2),
                 "regress %s: size-1 dim with stride INT64_MAX (%s)", lk_isa_name(isas[ii]),
                 lk_status_str(s2));
        tu_free(&o1), tu_free(&o2);
    }
    lk_set_isa(lk_isa_best());
    tu_free(&x);
}

/* fuzz regression (fuzz_softmax, fuzz_activation): x [1, 2, 1] with dim-1 stride
 * INT64_MAX: the span (shape - 1) * stride is exactly INT64_MAX and lk_check_view's
 * span + 1 overflowed (UBSan) before the byte check. Must be LK_ERR_OVERFLOW naming x,
 * nothing written. */
static void test_regress_span_int64_max(void) {
    int64_t shape[3] = {1, 2, 1};
    tu_buf x = tu_alloc(LK_F16, 3, shape, 0), o = tu_alloc(LK_F32, 3, shape, 0);
    tu_fill_uniform(&x, -1, 1);
    tu_snapshot(&x), tu_snapshot(&o);
    lk_tensor xv = x.t;
    xv.stride[1] = INT64_MAX;
    lk_status st = lk_causal_softmax(&o.t, &xv);
    tu_check(st == LK_ERR_OVERFLOW && strstr(lk_last_error(), "x:") && tu_intact(&x) && tu_intact(&o),
             "regress: span of exactly INT64_MAX elements -> %s (%s)", lk_status_str(st), lk_last_error());
    tu_free(&x), tu_free(&o);
}

int main(void) {
    tu_init();
    test_grid();
    test_shapes();
    test_special();
    test_threads();
    test_empty();
    test_bad_inputs();
    test_regress_huge_stride_size1();
    test_regress_span_int64_max();
    return tu_finish("test_softmax");
}
