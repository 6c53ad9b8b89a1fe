/*
 * merge_attn_states (2-way) and merge_attn_states_n (N-way): every ISA against a float64
 * merge and against ref. The +-inf / NaN LSE rules exhaustively (every state finite,
 * -inf, +inf or NaN, all combinations for n = 1..3, empty states' outputs filled with
 * NaN so that reading them would show), huge LSE differences and magnitudes, N = 1, 2,
 * 3, 5 and > 16 (the grouped path), D = 1, 7, 128, 512, transposed ([H, T] storage) and
 * padded LSE views, strided states with garbage padding, every dtype and mixed dtypes,
 * D = 0 (only out_lse), empty inputs, thread-count independence, the 2-way form equal
 * to the N-way form, the attn_state.h helpers (merge weights, online softmax), and the
 * bad-input catalogue.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/attn_state.h"
#include "testutil.h"

#define MAXN 40

static const int PERM_D_OUTER[3] = {0, 2, 1};

/* LSE category of state i in row r: 0 finite, 1 -inf, 2 +inf, 3 NaN */
typedef double (*lse_fn)(int i, int64_t row, int n);

typedef struct {
    int n;
    int64_t T, H, D;
    lk_dtype sdt[MAXN], odt;
    int pad;        /* padded (strided) states and out */
    int d_outer;    /* stored [T, D, H] (last-dim stride != 1, ref path): 1 even states,
                       2 even states and out, 3 out only */
    int lse_mode;   /* 0 contiguous [T, H]; 1 transposed view of [H, T]; 2 transposed + pad */
    int with_lse;   /* pass out_lse */
    lse_fn lse;     /* value of lses[i][row] */
    double lo, hi;  /* state values */
} mcase;

static double lse_random(int i, int64_t row, int n) {
    (void)i, (void)row, (void)n;
    return tu_uniform(-6, 6);
}

/* every combination of {finite, -inf, +inf, NaN} over the n states, one per row */
static double lse_exhaustive(int i, int64_t row, int n) {
    (void)n;
    int64_t cat = row;
    for (int k = 0; k < i; k++) cat /= 4;
    switch (cat % 4) {
    case 1: return -INFINITY;
    case 2: return INFINITY;
    case 3: return NAN;
    default: return tu_uniform(-4, 4);
    }
}

/* mostly finite, some empty, for the many-state path */
static double lse_sparse(int i, int64_t row, int n) {
    (void)n;
    if ((i * 7 + row * 3) % 5 == 0) return (i + row) % 2 ? -INFINITY : INFINITY;
    return tu_uniform(-10, 10);
}

/* huge magnitudes and differences: exp(lse) or exp(lse_a - lse_b) overflow f32 */
static double lse_huge(int i, int64_t row, int n) {
    (void)n;
    static const double v[][3] = {{1e4, 1e4 - 0.5, -1e4},   {88.0, -88.0, 0.0},
                                  {3e38, -3e38, 1e38},       {-3e38, -3e38, -3e38},
                                  {1e30, 1e30 + 1e24, -1e30}, {-1e4, -1e4 + 3, -1e4 - 3},
                                  {100.0, 0.0, -100.0},      {-87.5, -87.4, 87.5}};
    return v[row % 8][i % 3];
}

/* float64 merge of row r: values vals[i][r * D + d] */
static void merge64(const mcase *c, double **vals, double **lses, double *want, double *want_lse) {
    int64_t R = c->T * c->H;
    for (int64_t r = 0; r < R; r++) {
        double m = -INFINITY;
        int nan = 0;
        for (int i = 0; i < c->n; i++) {
            double l = lses[i][r];
            if (isnan(l)) nan = 1;
            else if (!isinf(l) && l > m) m = l;
        }
        double wsum = 0;
        if (!nan && m != -INFINITY)
            for (int i = 0; i < c->n; i++)
                if (!isinf(lses[i][r])) wsum += exp(lses[i][r] - m);
        want_lse[r] = nan ? NAN : m == -INFINITY ? -INFINITY : m + log(wsum);
        for (int64_t d = 0; d < c->D; d++) {
            double acc = 0;
            if (nan) acc = NAN;
            else if (m != -INFINITY)
                for (int i = 0; i < c->n; i++)
                    if (!isinf(lses[i][r])) acc += exp(lses[i][r] - m) / wsum * vals[i][r * c->D + d];
            want[r * c->D + d] = acc;
        }
    }
}

static tu_buf alloc_lse(const mcase *c) {
    int64_t shape[2] = {c->T, c->H};
    if (c->lse_mode == 0) return tu_alloc(LK_F32, 2, shape, 0);
    return tu_alloc_perm(LK_F32, 2, shape, (int[]){1, 0}, c->lse_mode == 2 ? 1 : 0);
}

/* the SIMD-vs-ref tolerance: f32 sums in a different order / FMA; 1 ulp of a 16-bit out */
static tu_tolerance vs_ref_tol(lk_dtype dt) {
    tu_tolerance t = tu_tol(dt);
    if (dt == LK_F16) t.atol = t.rtol = 1e-3;
    if (dt == LK_BF16) t.atol = t.rtol = 8e-3;
    return t;
}

static void run_case(const mcase *c, const char *what) {
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    int n = c->n;
    int64_t T = c->T, H = c->H, D = c->D, R = T * H, shape[3] = {T, H, D};
    tu_buf st[MAXN], ls[MAXN];
    double *vals[MAXN], *lvals[MAXN];
    for (int i = 0; i < n; i++) {
        st[i] = tu_alloc_perm(c->sdt[i], 3, shape, (c->d_outer == 1 || c->d_outer == 2) && i % 2 == 0 ? PERM_D_OUTER : NULL, c->pad);
        tu_fill_uniform(&st[i], c->lo, c->hi);
        ls[i] = alloc_lse(c);
        for (int64_t r = 0; r < R; r++) tu_set(&ls[i], r, c->lse(i, r, n));
        lvals[i] = tu_values(&ls[i]);
        /* an empty state's output is garbage: NaN there must not reach out */
        for (int64_t r = 0; r < R; r++)
            if (isinf(lvals[i][r]))
                for (int64_t d = 0; d < D; d++) tu_set(&st[i], r * D + d, NAN);
        vals[i] = tu_values(&st[i]);
    }
    double *want = malloc(sizeof(double) * (size_t)(R * D + 1)), *want_lse = malloc(sizeof(double) * (size_t)(R + 1));
    merge64(c, vals, lvals, want, want_lse);
    lk_tensor sv[MAXN], lv[MAXN];
    for (int i = 0; i < n; i++) sv[i] = st[i].t, lv[i] = ls[i].t;
    double *ref_out = NULL;
    tu_buf ref_lse = alloc_lse(c);
    for (int ii = 0; ii < nisa; ii++) {
        lk_set_isa(isas[ii]);
        tu_buf o = tu_alloc_perm(c->odt, 3, shape, c->d_outer >= 2 ? PERM_D_OUTER : NULL, c->pad);
        tu_buf ol = alloc_lse(c);
        tu_snapshot(&o);
        tu_snapshot(&ol);
        lk_status s = n == 2 && ii % 2 == 0
                          ? lk_merge_attn_states(&o.t, c->with_lse ? &ol.t : NULL, &sv[0], &lv[0], &sv[1], &lv[1])
                          : lk_merge_attn_states_n(&o.t, c->with_lse ? &ol.t : NULL, n, sv, lv);
        double *got = tu_values(&o), *got_lse = tu_values(&ol);
        double e = tu_err(got, want, R * D, tu_tol(c->odt));
        double el = c->with_lse ? tu_err(got_lse, want_lse, R, tu_tol(LK_F32)) : 0.0;
        int lse_ok = c->with_lse ? el <= 1 && tu_outside_intact(&ol) : tu_intact(&ol);
        tu_check(s == LK_OK && e <= 1 && lse_ok && tu_outside_intact(&o),
                 "%s %s n=%d [%lld,%lld,%lld] s0=%s out=%s pad=%d lse_mode=%d err=%.3g lse_err=%.3g %s",
                 what, lk_isa_name(isas[ii]), n, (long long)T, (long long)H, (long long)D,
                 lk_dtype_name(c->sdt[0]), lk_dtype_name(c->odt), c->pad, c->lse_mode, e, el,
                 lk_last_error());
        if (ii == 0) {
            ref_out = got;
            got = NULL;
            if (c->with_lse)
                for (int64_t r = 0; r < R; r++) tu_set(&ref_lse, r, got_lse[r]);
        } else {
            double e2 = tu_err(got, ref_out, R * D, vs_ref_tol(c->odt));
            /* the LSE comes from the same scalar code on every ISA: bit-identical */
            int lse_same = !c->with_lse || tu_same_bits(&ol, &ref_lse);
            tu_check(e2 <= 1 && lse_same, "%s %s vs ref n=%d D=%lld err=%.3g lse_same=%d", what,
                     lk_isa_name(isas[ii]), n, (long long)D, e2, lse_same);
        }
        free(got);
        free(got_lse);
        tu_free(&o);
        tu_free(&ol);
    }
    lk_set_isa(lk_isa_best());
    free(ref_out);
    tu_free(&ref_lse);
    for (int i = 0; i < n; i++) {
        tu_free(&st[i]);
        tu_free(&ls[i]);
        free(vals[i]);
        free(lvals[i]);
    }
    free(want);
    free(want_lse);
}

static mcase base_case(int n, int64_t T, int64_t H, int64_t D, lk_dtype sdt, lk_dtype odt) {
    mcase c;
    memset(&c, 0, sizeof c);
    c.n = n, c.T = T, c.H = H, c.D = D, c.odt = odt;
    for (int i = 0; i < MAXN; i++) c.sdt[i] = sdt;
    c.with_lse = 1;
    c.lse = lse_random;
    c.lo = -3, c.hi = 3;
    return c;
}

/* N = 1, 2, 3, 5; D = 1, 7, 128, 512; dtypes; strided states; LSE layouts */
static void test_grid(void) {
    static const int NS[] = {1, 2, 3, 5};
    static const int64_t DS[] = {1, 7, 128, 512};
    /* state dtype pattern, out dtype; pattern 3 = mixed (state i gets dtype (i + k) % 3) */
    static const struct {
        int pattern;
        lk_dtype odt;
    } dts[] = {{0, LK_F32}, {1, LK_F16}, {2, LK_BF16}, {3, LK_F32}, {3, LK_F16}, {3, LK_BF16}};
    for (int ni = 0; ni < 4; ni++)
        for (int di = 0; di < 4; di++)
            for (int k = 0; k < 6; k++)
                for (int pad = 0; pad <= 1; pad++) {
                    mcase c = base_case(NS[ni], 3, 5, DS[di], LK_F32, dts[k].odt);
                    for (int i = 0; i < c.n; i++)
                        c.sdt[i] = TU_FLOAT_DTYPES[dts[k].pattern == 3 ? (i + k) % 3 : dts[k].pattern];
                    c.pad = pad;
                    c.lse_mode = (int)((ni + di + k + pad) % 3);
                    c.with_lse = (di + k) % 4 != 3;
                    run_case(&c, "grid");
                }
}

static void test_rules(void) {
    /* every finite/-inf/+inf/NaN combination: 4^n rows */
    for (int n = 1; n <= 3; n++)
        for (int k = 0; k < 3; k++) {
            int64_t R = n == 1 ? 4 : n == 2 ? 16 : 64;
            mcase c = base_case(n, R, 1, k == 2 ? 33 : 7, TU_FLOAT_DTYPES[k], TU_FLOAT_DTYPES[k]);
            c.lse = lse_exhaustive;
            c.lse_mode = k; /* contiguous, transposed, padded transposed */
            c.pad = k == 1;
            run_case(&c, "rules");
        }
    /* huge LSE magnitudes and differences: no overflow, no NaN */
    for (int n = 2; n <= 3; n++) {
        mcase c = base_case(n, 8, 2, 19, LK_F32, LK_F32);
        c.lse = lse_huge;
        run_case(&c, "huge-lse");
        c = base_case(n, 4, 4, 40, LK_BF16, LK_F16);
        c.lse = lse_huge;
        run_case(&c, "huge-lse");
    }
    /* both empty gives exactly 0 and -inf */
    {
        int64_t shape[3] = {2, 3, 9};
        tu_buf a = tu_alloc(LK_BF16, 3, shape, 0), b = tu_alloc(LK_F32, 3, shape, 0);
        tu_buf la = tu_alloc(LK_F32, 2, shape, 0), lb = tu_alloc(LK_F32, 2, shape, 0);
        tu_buf o = tu_alloc(LK_F16, 3, shape, 1), ol = tu_alloc(LK_F32, 2, shape, 1);
        for (int64_t r = 0; r < 6; r++) {
            tu_set(&la, r, r % 2 ? INFINITY : -INFINITY);
            tu_set(&lb, r, r % 3 ? -INFINITY : INFINITY);
        }
        lk_status s = lk_merge_attn_states(&o.t, &ol.t, &a.t, &la.t, &b.t, &lb.t);
        int ok = s == LK_OK;
        for (int64_t i = 0; i < 54; i++) ok &= tu_get(&o, i) == 0.0 && !signbit(tu_get(&o, i));
        for (int64_t r = 0; r < 6; r++) ok &= tu_get(&ol, r) == -INFINITY;
        tu_check(ok, "both states empty -> out +0 and lse -inf (garbage states not read)");
        tu_free(&a), tu_free(&b), tu_free(&la), tu_free(&lb), tu_free(&o), tu_free(&ol);
    }
}

/* more than 16 non-empty states: the grouped path, one and several D tiles */
static void test_many_states(void) {
    static const int NS[] = {17, 20, 37};
    static const int64_t DS[] = {7, 128, 600};
    for (int ni = 0; ni < 3; ni++)
        for (int di = 0; di < 3; di++) {
            mcase c = base_case(NS[ni], 2, 3, DS[di], LK_F32, di == 1 ? LK_BF16 : LK_F32);
            for (int i = 0; i < c.n; i++) c.sdt[i] = TU_FLOAT_DTYPES[i % 3];
            c.lse = di == 2 ? lse_sparse : lse_random;
            c.pad = di == 0;
            c.lse_mode = di;
            run_case(&c, "many");
        }
}

/* states or out with last-dim stride != 1: every ISA falls back to the reference */
/* outputs of 16 MiB or more take non-temporal stores on aligned rows (AVX2): bf16,
 * f16 and f32 outs of 2049 x 32 x 128, contiguous and padded (rows off 32 bytes) */
static void test_streamed_out(void) {
    static const lk_dtype SD[] = {LK_BF16, LK_F32, LK_BF16, LK_BF16};
    static const lk_dtype OD[] = {LK_BF16, LK_F32, LK_F16, LK_BF16};
    for (int k = 0; k < (tu_emulated() ? 1 : 4); k++) { /* emulated: the bf16 case alone */
        mcase c = base_case(2, 2049, 32, 128, SD[k], OD[k]);
        c.pad = k == 3;
        run_case(&c, "streamed out");
    }
}

static void test_noncontiguous(void) {
    for (int mode = 1; mode <= 3; mode++)
        for (int n = 2; n <= 3; n++) {
            mcase c = base_case(n, 3, 4, 13, LK_BF16, mode == 1 ? LK_F32 : LK_F16);
            c.sdt[1] = LK_F32;
            c.d_outer = mode;
            c.pad = n == 3;
            c.lse_mode = 1;
            run_case(&c, "noncontig");
        }
}

/* the 2-way public function equals the N-way one with n = 2, bit for bit */
static void test_two_way_is_n_way(void) {
    int64_t shape[3] = {7, 6, 72};
    tu_buf a = tu_alloc(LK_BF16, 3, shape, 0), b = tu_alloc(LK_F16, 3, shape, 1);
    tu_buf la = tu_alloc(LK_F32, 2, shape, 0), lb = tu_alloc_perm(LK_F32, 2, shape, (int[]){1, 0}, 0);
    tu_fill_uniform(&a, -2, 2);
    tu_fill_uniform(&b, -2, 2);
    tu_fill_uniform(&la, -5, 5);
    tu_fill_uniform(&lb, -5, 5);
    tu_buf o1 = tu_alloc(LK_BF16, 3, shape, 0), o2 = tu_alloc(LK_BF16, 3, shape, 0);
    tu_buf l1 = tu_alloc(LK_F32, 2, shape, 0), l2 = tu_alloc(LK_F32, 2, shape, 0);
    lk_status s1 = lk_merge_attn_states(&o1.t, &l1.t, &a.t, &la.t, &b.t, &lb.t);
    lk_tensor sv[2] = {a.t, b.t}, lv[2] = {la.t, lb.t};
    lk_status s2 = lk_merge_attn_states_n(&o2.t, &l2.t, 2, sv, lv);
    tu_check(s1 == LK_OK && s2 == LK_OK && tu_same_bits(&o1, &o2) && tu_same_bits(&l1, &l2),
             "2-way form is the N-way kernel with n = 2");
    tu_free(&a), tu_free(&b), tu_free(&la), tu_free(&lb);
    tu_free(&o1), tu_free(&o2), tu_free(&l1), tu_free(&l2);
}

/* the 2-way form: out and out_lse bitwise identical for 1..4 threads and a repeated
 * call */
static void test_threads_2way(void) {
    int64_t shape[3] = {64, 32, 128};
    tu_buf a = tu_alloc(LK_BF16, 3, shape, 0), b = tu_alloc(LK_F16, 3, shape, 0);
    tu_buf la = tu_alloc(LK_F32, 2, shape, 0), lb = tu_alloc_perm(LK_F32, 2, shape, (int[]){1, 0}, 0);
    tu_fill_uniform(&a, -2, 2), tu_fill_uniform(&b, -2, 2), tu_fill_uniform(&la, -4, 4), tu_fill_uniform(&lb, -4, 4);
    tu_buf o1 = tu_alloc(LK_BF16, 3, shape, 0), l1 = tu_alloc(LK_F32, 2, shape, 0);
    lk_set_num_threads(1);
    lk_merge_attn_states(&o1.t, &l1.t, &a.t, &la.t, &b.t, &lb.t);
    for (int nt = 1; nt <= 4; nt++) { /* nt = 1: a repeated call */
        tu_buf o = tu_alloc(LK_BF16, 3, shape, 0), l = tu_alloc(LK_F32, 2, shape, 0);
        lk_set_num_threads(nt);
        lk_status st = lk_merge_attn_states(&o.t, &l.t, &a.t, &la.t, &b.t, &lb.t);
        tu_check(st == LK_OK && tu_same_bits(&o, &o1) && tu_same_bits(&l, &l1),
                 "merge 2-way bitwise identical with %d threads%s", nt, nt == 1 ? " (repeated call)" : "");
        tu_free(&o), tu_free(&l);
    }
    lk_set_num_threads(0);
    tu_free(&a), tu_free(&b), tu_free(&la), tu_free(&lb), tu_free(&o1), tu_free(&l1);
}

static void test_threads(void) {
    int64_t shape[3] = {64, 32, 128};
    tu_buf st[3], ls[3];
    lk_tensor sv[3], lv[3];
    for (int i = 0; i < 3; i++) {
        st[i] = tu_alloc(LK_BF16, 3, shape, 0);
        ls[i] = tu_alloc_perm(LK_F32, 2, shape, (int[]){1, 0}, 0);
        tu_fill_uniform(&st[i], -2, 2);
        tu_fill_uniform(&ls[i], -4, 4);
        sv[i] = st[i].t, lv[i] = ls[i].t;
    }
    tu_buf o1 = tu_alloc(LK_BF16, 3, shape, 0), l1 = tu_alloc(LK_F32, 2, shape, 0);
    lk_set_num_threads(1);
    lk_merge_attn_states_n(&o1.t, &l1.t, 3, sv, lv);
    for (int nt = 2; nt <= 4; nt++) {
        tu_buf o = tu_alloc(LK_BF16, 3, shape, 0), l = tu_alloc(LK_F32, 2, shape, 0);
        lk_set_num_threads(nt);
        lk_merge_attn_states_n(&o.t, &l.t, 3, sv, lv);
        tu_check(tu_same_bits(&o, &o1) && tu_same_bits(&l, &l1),
                 "merge bitwise identical with %d threads", nt);
        tu_free(&o), tu_free(&l);
    }
    lk_set_num_threads(0);
    for (int i = 0; i < 3; i++) tu_free(&st[i]), tu_free(&ls[i]);
    tu_free(&o1), tu_free(&l1);
}

static void test_empty(void) {
    static const int64_t shapes[][3] = {{0, 4, 8}, {3, 0, 8}, {3, 4, 0}};
    for (int k = 0; k < 3; k++)
        for (int with_lse = 0; with_lse <= 1; with_lse++) {
            const int64_t *shape = shapes[k];
            tu_buf a = tu_alloc(LK_F32, 3, shape, 0), b = tu_alloc(LK_F32, 3, shape, 0);
            tu_buf la = tu_alloc(LK_F32, 2, shape, 0), lb = tu_alloc(LK_F32, 2, shape, 0);
            tu_buf o = tu_alloc(LK_F32, 3, shape, 0), ol = tu_alloc(LK_F32, 2, shape, 0);
            tu_fill_uniform(&la, -1, 1);
            tu_fill_uniform(&lb, -1, 1);
            tu_snapshot(&o);
            tu_snapshot(&ol);
            lk_status s = lk_merge_attn_states(&o.t, with_lse ? &ol.t : NULL, &a.t, &la.t, &b.t, &lb.t);
            int ok = s == LK_OK && tu_intact(&o);
            if (k == 2 && with_lse) { /* D = 0: out_lse is still the merged LSE */
                double *va = tu_values(&la), *vb = tu_values(&lb);
                for (int64_t r = 0; r < 12; r++) {
                    double m = va[r] > vb[r] ? va[r] : vb[r];
                    double want = m + log(exp(va[r] - m) + exp(vb[r] - m));
                    ok &= fabs(tu_get(&ol, r) - want) <= 1e-6;
                }
                ok &= tu_outside_intact(&ol);
                free(va), free(vb);
            } else {
                ok &= tu_intact(&ol);
            }
            tu_check(ok, "empty [%lld,%lld,%lld] out_lse=%d: no-op (D = 0 writes only out_lse)",
                     (long long)shape[0], (long long)shape[1], (long long)shape[2], with_lse);
            tu_free(&a), tu_free(&b), tu_free(&la), tu_free(&lb), tu_free(&o), tu_free(&ol);
        }
}

/* the attn_state.h helpers on their own */
static void test_attn_state(void) {
    /* merge weights of a contiguous LSE array agree with the strided step functions */
    float lse[4] = {1.0f, -INFINITY, 3.0f, INFINITY}, c[4], lo;
    lk_merge_kind k = lk_merge_weights(lse, 4, c, &lo);
    double w0 = exp(1.0 - 3.0), w2 = 1.0, ws = w0 + w2;
    tu_check(k == LK_MERGE_NORMAL && fabs(c[0] - w0 / ws) < 1e-7 && c[1] == 0 && fabs(c[2] - 1 / ws) < 1e-7 &&
                 c[3] == 0 && fabs(lo - (3.0 + log(ws))) < 1e-6,
             "lk_merge_weights: finite / -inf / +inf");
    float e2[2] = {-INFINITY, INFINITY}, n2[2] = {2.0f, NAN};
    k = lk_merge_weights(e2, 2, c, &lo);
    tu_check(k == LK_MERGE_EMPTY && lo == -INFINITY && c[0] == 0 && c[1] == 0, "lk_merge_weights: all empty");
    k = lk_merge_weights(n2, 2, c, &lo);
    tu_check(k == LK_MERGE_NAN && isnan(lo), "lk_merge_weights: NaN propagates");

    /* online softmax over blocks equals the direct softmax; -inf blocks first */
    for (int trial = 0; trial < 6; trial++) {
        enum { NS = 57 };
        float s[NS];
        double v[NS];
        for (int j = 0; j < NS; j++) {
            s[j] = (float)tu_uniform(-20, 20);
            v[j] = tu_uniform(-1, 1);
        }
        if (trial >= 1)
            for (int j = 0; j < 20; j++) s[j] = -INFINITY; /* masked prefix */
        if (trial == 2)
            for (int j = 0; j < NS; j++) s[j] = -INFINITY; /* nothing visible */
        if (trial == 3) s[40] = NAN;
        if (trial == 4) s[5] = 88.0f, s[50] = -88.0f;
        if (trial == 5) s[30] = 1e30f; /* exp(s) overflows f32 without the shift */
        lk_online_state st = lk_online_init();
        double acc = 0;
        for (int j0 = 0; j0 < NS; j0 += 8) {
            int j1 = j0 + 8 < NS ? j0 + 8 : NS;
            float bmax = -INFINITY;
            for (int j = j0; j < j1; j++) bmax = lk_nanmax(bmax, s[j]);
            acc *= lk_online_rescale(&st, bmax);
            float sh = lk_online_shift(st.m), psum = 0;
            for (int j = j0; j < j1; j++) {
                float p = expf(s[j] - sh);
                psum += p;
                acc += p * v[j];
            }
            lk_online_add(&st, psum);
        }
        double o = acc * lk_softmax_inv(st.l), lse = lk_online_lse(st);
        /* float64 direct */
        double m = -INFINITY, l = 0, a = 0;
        int nan = 0;
        for (int j = 0; j < NS; j++) {
            if (isnan(s[j])) nan = 1;
            else if (s[j] > m) m = s[j];
        }
        for (int j = 0; j < NS && m != -INFINITY; j++) l += exp(s[j] - m), a += exp(s[j] - m) * v[j];
        double want_o = nan ? NAN : m == -INFINITY ? 0 : a / l;
        double want_lse = nan ? NAN : m == -INFINITY ? -INFINITY : m + log(l);
        int ok = nan ? isnan(o) && isnan(lse)
                     : fabs(o - want_o) <= 1e-5 && (isinf(want_lse) ? lse == want_lse
                                                                     : fabs(lse - want_lse) <= 1e-5 * (1 + fabs(want_lse)));
        tu_check(ok, "online softmax trial %d: o=%g (want %g) lse=%g (want %g)", trial, o, want_o, lse, want_lse);
    }
}

/* every rule of the common contract: status, message names the argument, nothing written */
static void test_bad_inputs(void) {
    int64_t shape[3] = {4, 2, 8};
    tu_buf a = tu_alloc(LK_F32, 3, shape, 0), b = tu_alloc(LK_BF16, 3, shape, 0);
    tu_buf la = tu_alloc(LK_F32, 2, shape, 0), lb = tu_alloc(LK_F32, 2, shape, 0);
    tu_buf o = tu_alloc(LK_F32, 3, shape, 0), ol = tu_alloc(LK_F32, 2, shape, 0);
    tu_buf big = tu_alloc(LK_F32, 1, (int64_t[]){256}, 0);
    tu_buf *all[] = {&a, &b, &la, &lb, &o, &ol, &big};
    for (int i = 0; i < 7; i++) tu_fill_uniform(all[i], -1, 1);
    struct bad_case {
        const char *what, *arg;
        lk_status want;
        lk_tensor out, out_lse, a, lse_a, b, lse_b;
    } cases[40];
    int n = 0;
#define CASE(W, A, S, O, OL, AA, LA, BB, LB) cases[n++] = (struct bad_case){W, A, S, O, OL, AA, LA, BB, LB}
    lk_tensor t, u;
    t = o.t; t.ndim = 2;
    CASE("out rank 2", "out", LK_ERR_RANK, t, ol.t, a.t, la.t, b.t, lb.t);
    t = a.t; t.ndim = 4; t.shape[3] = 1; t.stride[3] = 1;
    CASE("a rank 4", "a", LK_ERR_RANK, o.t, ol.t, t, la.t, b.t, lb.t);
    t = b.t; t.shape[2] = 7;
    CASE("b shape mismatch", "b", LK_ERR_SHAPE, o.t, ol.t, a.t, la.t, t, lb.t);
    t = la.t; t.shape[1] = 3;
    CASE("lse_a shape mismatch", "lse_a", LK_ERR_SHAPE, o.t, ol.t, a.t, t, b.t, lb.t);
    t = la.t; t.ndim = 3; t.shape[2] = 1; t.stride[2] = 1;
    CASE("lse_a rank 3", "lse_a", LK_ERR_RANK, o.t, ol.t, a.t, t, b.t, lb.t);
    t = lb.t; t.dtype = LK_BF16;
    CASE("lse_b bf16", "lse_b", LK_ERR_DTYPE, o.t, ol.t, a.t, la.t, b.t, t);
    t = o.t; t.dtype = LK_I32;
    CASE("out int dtype", "out", LK_ERR_DTYPE, t, ol.t, a.t, la.t, b.t, lb.t);
    t = a.t; t.dtype = LK_I64;
    CASE("a int dtype", "a", LK_ERR_DTYPE, o.t, ol.t, t, la.t, b.t, lb.t);
    t = b.t; t.dtype = (lk_dtype)42;
    CASE("b unknown dtype", "b", LK_ERR_DTYPE, o.t, ol.t, a.t, la.t, t, lb.t);
    t = ol.t; t.shape[0] = 5;
    CASE("out_lse shape mismatch", "out_lse", LK_ERR_SHAPE, o.t, t, a.t, la.t, b.t, lb.t);
    t = ol.t; t.dtype = LK_F16;
    CASE("out_lse f16", "out_lse", LK_ERR_DTYPE, o.t, t, a.t, la.t, b.t, lb.t);
    t = a.t; t.data = NULL;
    CASE("a NULL data", "a", LK_ERR_NULL, o.t, ol.t, t, la.t, b.t, lb.t);
    t = lb.t; t.data = NULL;
    CASE("lse_b NULL data", "lse_b", LK_ERR_NULL, o.t, ol.t, a.t, la.t, b.t, t);
    t = o.t; t.shape[1] = -2;
    CASE("out negative size", "out", LK_ERR_SHAPE, t, ol.t, a.t, la.t, b.t, lb.t);
    t = b.t; t.stride[0] = INT64_MAX / 2;
    CASE("b stride overflow", "b", LK_ERR_OVERFLOW, o.t, ol.t, a.t, la.t, t, lb.t);
    t = la.t; t.stride[1] = INT64_MAX / 3;
    CASE("lse_a stride overflow", "lse_a", LK_ERR_OVERFLOW, o.t, ol.t, a.t, t, b.t, lb.t);
    t = o.t; t.stride[0] = 0;
    CASE("out stride 0 overlaps itself", "out", LK_ERR_ALIAS, t, ol.t, a.t, la.t, b.t, lb.t);
    t = ol.t; t.stride[1] = 0;
    CASE("out_lse overlaps itself", "out_lse", LK_ERR_ALIAS, o.t, t, a.t, la.t, b.t, lb.t);
    t = a.t; t.dtype = LK_F32;
    CASE("out is a", "out", LK_ERR_ALIAS, t, ol.t, a.t, la.t, b.t, lb.t);
    t = b.t;
    CASE("out is b", "out", LK_ERR_ALIAS, t, ol.t, a.t, la.t, b.t, lb.t);
    /* carved from one buffer: out [4,2,8] at big[0..64), lse_a [4,2] at big[60..68) */
    t = big.t; t.ndim = 3; t.shape[0] = 4, t.shape[1] = 2, t.shape[2] = 8;
    t.stride[0] = 16, t.stride[1] = 8, t.stride[2] = 1;
    u = big.t; u.ndim = 2; u.shape[0] = 4, u.shape[1] = 2; u.stride[0] = 2, u.stride[1] = 1;
    u.data = (float *)big.t.data + 60;
    CASE("out overlaps lse_a", "out", LK_ERR_ALIAS, t, ol.t, a.t, u, b.t, lb.t);
    CASE("out_lse overlaps out", "out_lse", LK_ERR_ALIAS, t, u, a.t, la.t, b.t, lb.t);
    CASE("out_lse is lse_b", "out_lse", LK_ERR_ALIAS, o.t, lb.t, a.t, la.t, b.t, lb.t);
    u.data = (float *)big.t.data + 100;
    t.data = (float *)big.t.data + 96;
    CASE("out_lse inside state a", "out_lse", LK_ERR_ALIAS, o.t, u, t, la.t, b.t, lb.t);
#undef CASE
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < 7; k++) tu_snapshot(all[k]);
        lk_status s = lk_merge_attn_states(&cases[i].out, &cases[i].out_lse, &cases[i].a,
                                           &cases[i].lse_a, &cases[i].b, &cases[i].lse_b);
        const char *msg = lk_last_error();
        int intact = 1;
        for (int k = 0; k < 7; k++) intact &= tu_intact(all[k]);
        tu_check(s == cases[i].want && strstr(msg, cases[i].arg) && strstr(msg, "lk_merge_attn_states") && intact,
                 "bad input '%s' -> %s (%s)", cases[i].what, lk_status_str(s), msg);
    }
    /* NULL pointers, n, and N-way argument names */
    for (int k = 0; k < 7; k++) tu_snapshot(all[k]);
    lk_status s = lk_merge_attn_states(NULL, &ol.t, &a.t, &la.t, &b.t, &lb.t);
    tu_check(s == LK_ERR_NULL && strstr(lk_last_error(), "out"), "NULL out (%s)", lk_last_error());
    s = lk_merge_attn_states(&o.t, &ol.t, &a.t, &la.t, &b.t, NULL);
    tu_check(s == LK_ERR_NULL && strstr(lk_last_error(), "lse_b"), "NULL lse_b (%s)", lk_last_error());
    lk_tensor sv[3] = {a.t, b.t, a.t}, lv[3] = {la.t, lb.t, la.t};
    s = lk_merge_attn_states_n(&o.t, &ol.t, 0, sv, lv);
    tu_check(s == LK_ERR_VALUE && strstr(lk_last_error(), "n:") && strstr(lk_last_error(), "lk_merge_attn_states_n"),
             "n = 0 -> %s (%s)", lk_status_str(s), lk_last_error());
    s = lk_merge_attn_states_n(&o.t, &ol.t, -3, NULL, NULL);
    tu_check(s == LK_ERR_VALUE && strstr(lk_last_error(), "n:"), "n = -3 -> %s", lk_status_str(s));
    s = lk_merge_attn_states_n(&o.t, &ol.t, 3, NULL, lv);
    tu_check(s == LK_ERR_NULL && strstr(lk_last_error(), "states"), "NULL states array (%s)", lk_last_error());
    s = lk_merge_attn_states_n(&o.t, &ol.t, 3, sv, NULL);
    tu_check(s == LK_ERR_NULL && strstr(lk_last_error(), "lses"), "NULL lses array (%s)", lk_last_error());
    sv[2].shape[2] = 9;
    s = lk_merge_attn_states_n(&o.t, &ol.t, 3, sv, lv);
    tu_check(s == LK_ERR_SHAPE && strstr(lk_last_error(), "states[2]"), "states[2] shape (%s)", lk_last_error());
    sv[2].shape[2] = 8;
    lv[1].dtype = LK_F16;
    s = lk_merge_attn_states_n(&o.t, &ol.t, 3, sv, lv);
    tu_check(s == LK_ERR_DTYPE && strstr(lk_last_error(), "lses[1]"), "lses[1] dtype (%s)", lk_last_error());
    lv[1].dtype = LK_F32;
    {
        lk_tensor sv12[12], lv12[12];
        for (int i = 0; i < 12; i++) sv12[i] = a.t, lv12[i] = la.t;
        lv12[11].shape[0] = 3;
        s = lk_merge_attn_states_n(&o.t, &ol.t, 12, sv12, lv12);
        tu_check(s == LK_ERR_SHAPE && strstr(lk_last_error(), "lses[11]:"), "lses[11] shape (%s)", lk_last_error());
    }
    s = lk_merge_attn_states_n(&o.t, &ol.t, 3, sv, lv);
    tu_check(s == LK_OK && lk_last_error()[0] == 0, "valid N-way call clears lk_last_error");
    int intact = 1;
    for (int k = 0; k < 4; k++) intact &= tu_intact(all[k]); /* a, b, la, lb */
    intact &= tu_intact(&big);
    tu_check(intact, "inputs untouched by the calls above");
    for (int k = 0; k < 7; k++) tu_free(all[k]);
}

int main(void) {
    tu_init();
    test_attn_state();
    test_rules();
    test_grid();
    test_many_states();
    test_noncontiguous();
    test_streamed_out();
    test_two_way_is_n_way();
    test_threads();
    test_threads_2way();
    test_empty();
    test_bad_inputs();
    return tu_finish("test_merge");
}
