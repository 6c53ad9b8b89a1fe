/*
 * Fuzz harness: lk_silu_and_mul and lk_gelu_tanh_and_mul (see fuzz_common.h for the
 * checks). Input: op, rank, shape (odd last dims too), dtypes, layouts, out and x in one
 * buffer (disjoint column ranges of shared rows, or overlapping), value range (up to
 * +-100 to cross the exp overflow points), rare shape mismatches and NULL pointers.
 */
#include "fuzz_common.h"

typedef struct {
    int gelu, out, x;
} act_attrs;

static lk_status call(const fz_world *w, const void *ap) {
    const act_attrs *a = ap;
    return a->gelu ? lk_gelu_tanh_and_mul(fz_t(w, a->out), fz_t(w, a->x))
                   : lk_silu_and_mul(fz_t(w, a->out), fz_t(w, a->x));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_in in = {data, size, 0};
    fz_world w;
    fz_init(&w, &in, "activation");
    act_attrs a = {0, -1, -1};
    a.gelu = fz_u8(&in) & 1;
    w.op = a.gelu ? "lk_gelu_tanh_and_mul" : "lk_silu_and_mul";
    int nd = 1 + (int)(fz_u8(&in) % 3);
    int64_t xs[3] = {1, 1, 1}, os[3];
    for (int k = 0; k < nd - 1; k++) xs[k] = fz_dim(&in, 4);
    int64_t d = fz_dim(&in, 40);
    xs[nd - 1] = 2 * d;
    if (fz_chance(&in, 8)) { /* odd last dim */
        xs[nd - 1] += 1;
        fz_fail_expected(&w, "x's last dim is odd");
    }
    memcpy(os, xs, sizeof os);
    os[nd - 1] = d;
    if (fz_chance(&in, 8)) {
        os[fz_u8(&in) % (unsigned)nd] += 1;
        fz_fail_expected(&w, "out's shape is not x's with the last dim halved");
    }
    lk_dtype xt = fz_ftype(&in), ot = fz_ftype(&in);
    unsigned alias = fz_u8(&in) % 6;
    if (alias == 0 && !w.must_fail) {
        /* one buffer [..., 3d]: x = columns [0, 2d), out = [2d, 3d) (disjoint) or
         * [d, 2d) (overlapping x's second half) */
        int64_t ps[3];
        memcpy(ps, xs, sizeof ps);
        ps[nd - 1] = 3 * d;
        int p = fz_view_new(&w, &in, "parent", xt, nd, ps, FZ_NONE);
        a.x = fz_view_narrow(&w, p, "x", nd - 1, 0, 2 * d, FZ_IN);
        a.out = fz_view_narrow(&w, p, "out", nd - 1, fz_u8(&in) & 1 ? 2 * d : d, d, FZ_OUT);
    } else {
        a.x = fz_view_new(&w, &in, "x", xt, nd, xs, FZ_IN);
        a.out = fz_view_new(&w, &in, "out", ot, nd, os, FZ_OUT);
    }
    static const double R[4] = {4, 12, 100, 1};
    double r = R[fz_u8(&in) % 4];
    fz_fill(&w, a.x, -r, r);
    fz_tol(&w, a.out, 1e-6); /* the test suite's vs-ref tolerance for f32 */
    if (fz_chance(&in, 4)) {
        if (fz_u8(&in) & 1) a.x = -1;
        else a.out = -1;
        fz_fail_expected(&w, "NULL tensor pointer");
    }
    fz_run(&w, call, &a);
    fz_free(&w);
    return 0;
}
