/*
 * Fuzz harness: the extra activations lk_gelu_and_mul, lk_mul_and_silu,
 * lk_fatrelu_and_mul, lk_swigluoai_and_mul (gated: x [..., 2d] -> out [..., d]) and
 * lk_gelu_new, lk_gelu_fast, lk_gelu_quick (element-wise) (see fuzz_common.h for the
 * checks). Input: op, rank, shape (odd last dims too), dtypes, layouts, out and x in one
 * buffer (disjoint column ranges of shared rows, or overlapping), value range (up to
 * +-100 to cross the exp overflow points), the scalar attributes (bad ones rare), rare
 * shape mismatches and NULL pointers.
 */
#include "fuzz_common.h"

enum { GELU, MULSILU, FATRELU, SWIGLU, GNEW, GFAST, GQUICK, NOPS };
static const char *NAMES[NOPS] = {"lk_gelu_and_mul", "lk_mul_and_silu", "lk_fatrelu_and_mul", "lk_swigluoai_and_mul",
                                  "lk_gelu_new", "lk_gelu_fast", "lk_gelu_quick"};

typedef struct {
    int op, out, x;
    float p0, p1;
} act_attrs;

static lk_status call(const fz_world *w, const void *ap) {
    const act_attrs *a = ap;
    const lk_tensor *o = fz_t(w, a->out), *x = fz_t(w, a->x);
    switch (a->op) {
    case GELU: return lk_gelu_and_mul(o, x);
    case MULSILU: return lk_mul_and_silu(o, x);
    case FATRELU: return lk_fatrelu_and_mul(o, x, a->p0);
    case SWIGLU: return lk_swigluoai_and_mul(o, x, a->p0, a->p1);
    case GNEW: return lk_gelu_new(o, x);
    case GFAST: return lk_gelu_fast(o, x);
    default: return lk_gelu_quick(o, x);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_in in = {data, size, 0};
    fz_world w;
    fz_init(&w, &in, "act_ext");
    act_attrs a = {0, -1, -1, 0.0f, 0.0f};
    a.op = (int)(fz_u8(&in) % NOPS);
    int gated = a.op <= SWIGLU;
    w.op = NAMES[a.op];
    static const float P[8] = {0.0f, 0.5f, -1.0f, 1.702f, 7.0f, 3.0f, NAN, INFINITY};
    unsigned p0 = fz_u8(&in) % 8, p1 = fz_u8(&in) % 8;
    a.p0 = P[p0], a.p1 = P[p1];
    if (a.op == FATRELU && p0 >= 6) fz_fail_expected(&w, "threshold not finite");
    if (a.op == SWIGLU && (p0 >= 6 || !(a.p0 > 0.0f))) fz_fail_expected(&w, "alpha not finite and > 0");
    if (a.op == SWIGLU && (p1 >= 6 || !(a.p1 > 0.0f))) fz_fail_expected(&w, "limit not finite and > 0");
    int nd = 1 + (int)(fz_u8(&in) % 3);
    int64_t xs[3] = {1, 1, 1}, os[3];
    for (int k = 0; k < nd - 1; k++) xs[k] = fz_dim(&in, 4);
    int64_t d = fz_dim(&in, 40);
    xs[nd - 1] = gated ? 2 * d : d;
    if (gated && fz_chance(&in, 8)) { /* odd last dim */
        xs[nd - 1] += 1;
        fz_fail_expected(&w, "x's last dim is odd");
    }
    memcpy(os, xs, sizeof os);
    os[nd - 1] = d;
    if (fz_chance(&in, 8)) {
        os[fz_u8(&in) % (unsigned)nd] += 1;
        fz_fail_expected(&w, "out's shape is not x's (last dim halved when gated)");
    }
    lk_dtype xt = fz_ftype(&in), ot = fz_ftype(&in);
    unsigned alias = fz_u8(&in) % 6;
    if (alias == 0 && !w.must_fail) {
        /* one buffer [..., w + d] (w = x's width): x = columns [0, w), out = [w, w + d)
         * (disjoint) or [w - d, w) (overlapping x's end) */
        int64_t ps[3], xw = xs[nd - 1];
        memcpy(ps, xs, sizeof ps);
        ps[nd - 1] = xw + d;
        int p = fz_view_new(&w, &in, "parent", xt, nd, ps, FZ_NONE);
        a.x = fz_view_narrow(&w, p, "x", nd - 1, 0, xw, FZ_IN);
        a.out = fz_view_narrow(&w, p, "out", nd - 1, fz_u8(&in) & 1 ? xw : xw - d, d, FZ_OUT);
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
