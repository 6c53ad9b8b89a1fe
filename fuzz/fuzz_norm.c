/*
 * Fuzz harness: lk_rms_norm and lk_fused_add_rms_norm (see fuzz_common.h for the
 * checks). Input: op, rank, shape, dtypes of every operand, layouts, aliasing (out = x
 * in place, out and x slices of one buffer, overlapping slices), eps and gemma, rare
 * shape mismatches and NULL tensor pointers; w NULL (no weight) is a valid call.
 */
#include "fuzz_common.h"

typedef struct {
    int fused, x, out, w, res;
    float eps;
    int gemma;
} norm_attrs;

static lk_status call(const fz_world *w, const void *ap) {
    const norm_attrs *a = ap;
    if (!a->fused)
        return lk_rms_norm(fz_t(w, a->out), fz_t(w, a->x), fz_t(w, a->w), a->eps, a->gemma);
    return lk_fused_add_rms_norm(fz_t(w, a->x), fz_t(w, a->res), fz_t(w, a->w), a->eps, a->gemma);
}

static const lk_dtype FT[3] = {LK_F32, LK_F16, LK_BF16};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_in in = {data, size, 0};
    fz_world w;
    fz_init(&w, &in, "norm");
    norm_attrs a = {0, -1, -1, -1, -1, 0.0f, 0};
    a.fused = fz_u8(&in) & 1;
    w.op = a.fused ? "lk_fused_add_rms_norm" : "lk_rms_norm";
    int nd = 1 + (int)(fz_u8(&in) % 3);
    int64_t shape[3] = {1, 1, 1};
    for (int d = 0; d < nd - 1; d++) shape[d] = fz_dim(&in, 5);
    shape[nd - 1] = fz_dim(&in, 70);
    int64_t D = shape[nd - 1];
    lk_dtype xt = FT[fz_u8(&in) % 3], ot = FT[fz_u8(&in) % 3], wt = FT[fz_u8(&in) % 3];
    unsigned alias = fz_u8(&in) % 8;
    if (!a.fused) {
        if (alias == 1 || alias == 2) { /* slices of one buffer: disjoint or overlapping */
            int64_t ps[4] = {2};
            for (int d = 0; d < nd; d++) ps[d + 1] = shape[d];
            if (alias == 2) ps[0] = 1, ps[1] = shape[0] + 1;
            int p = fz_view_new(&w, &in, "parent", xt, nd + 1, ps, FZ_NONE);
            if (alias == 1) {
                a.x = fz_view_select(&w, p, "x", 0, 0, FZ_IN);
                a.out = fz_view_select(&w, p, "out", 0, 1, FZ_OUT);
            } else {
                int q = fz_view_select(&w, p, "parent2", 0, 0, FZ_NONE);
                a.x = fz_view_narrow(&w, q, "x", 0, 0, shape[0], FZ_IN);
                a.out = fz_view_narrow(&w, q, "out", 0, 1, shape[0], FZ_OUT);
            }
        } else {
            a.x = fz_view_new(&w, &in, "x", xt, nd, shape, FZ_IN);
            if (alias == 0) { /* in place: out is x */
                a.out = fz_view_alias(&w, a.x, "out", FZ_OUT);
            } else {
                int64_t os[3] = {shape[0], shape[1], shape[2]};
                if (fz_chance(&in, 8)) { /* shape mismatch */
                    os[fz_u8(&in) % (unsigned)nd] += 1;
                    fz_fail_expected(&w, "out shape differs from x");
                }
                a.out = fz_view_new(&w, &in, "out", ot, nd, os, FZ_OUT);
            }
        }
        w.v[a.out].inplace_of = a.x; /* out may be x itself (the identical view) */
        fz_tol(&w, a.out, 1e-5);
        fz_fill(&w, a.x, -4, 4);
    } else {
        a.x = fz_view_new(&w, &in, "x", xt, nd, shape, FZ_OUT);
        if (alias == 0) {
            a.res = fz_view_alias(&w, a.x, "residual", FZ_OUT); /* x and residual one buffer */
            w.v[a.res].inplace_of = -1;                        /* not an allowed pair */
        } else {
            int64_t rs[3] = {shape[0], shape[1], shape[2]};
            if (fz_chance(&in, 8)) {
                rs[fz_u8(&in) % (unsigned)nd] += 1;
                fz_fail_expected(&w, "residual shape differs from x");
            }
            a.res = fz_view_new(&w, &in, "residual", ot, nd, rs, FZ_OUT);
        }
        fz_tol(&w, a.x, 1e-5);
        fz_fill(&w, a.x, -4, 4);
        fz_fill(&w, a.res, -4, 4);
        /* residual = round(x + residual): the same value on every ISA (a NaN's sign and
         * payload are not specified for computed values) */
        fz_tol(&w, a.res, 0.0);
        if (w.v[a.res].t.dtype != LK_F32) w.v[a.res].atol = w.v[a.res].rtol = 0.0;
    }
    int noweight = fz_chance(&in, 6); /* w NULL: the weightless form (valid) */
    int64_t ws = D;
    if (!noweight && fz_chance(&in, 8)) {
        ws = D + (fz_u8(&in) & 1 ? 1 : -1);
        if (ws < 0) ws = 1;
        if (ws != D) fz_fail_expected(&w, "w shape differs from D");
    }
    if (noweight) {
        a.w = -1;
    } else if (alias == 3 && a.fused && fz_usable(&w, a.x)) { /* w slice of x's buffer: x is written, must be rejected */
        a.w = fz_view_alias(&w, a.x, "w", FZ_IN);
        w.v[a.w].inplace_of = -1;
        w.v[a.w].t.ndim = 1;
        w.v[a.w].t.shape[0] = shape[nd - 1];
        w.v[a.w].t.stride[0] = w.v[a.x].t.stride[nd - 1];
    } else {
        a.w = fz_view_new(&w, &in, "w", wt, 1, &ws, FZ_IN);
        fz_fill(&w, a.w, -2, 2);
    }
    static const float EPS[8] = {1e-6f, 1e-5f, 0.0f, 0.5f, 1e-6f, -1e-6f, NAN, INFINITY};
    unsigned e = fz_u8(&in) % 8;
    a.eps = EPS[e];
    if (e >= 5) fz_fail_expected(&w, "eps out of domain");
    a.gemma = (int)(fz_u8(&in) % 3); /* any non-zero value means gemma */
    if (fz_chance(&in, 4)) { /* a NULL tensor pointer */
        int k = (int)(fz_u8(&in) % 2);
        if (k == 0) a.x = -1;
        else if (a.fused) a.res = -1;
        else a.out = -1;
        fz_fail_expected(&w, "NULL tensor pointer");
    }
    fz_run(&w, call, &a);
    fz_free(&w);
    return 0;
}
