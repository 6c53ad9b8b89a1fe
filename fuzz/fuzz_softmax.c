/*
 * Fuzz harness: lk_causal_softmax (see fuzz_common.h for the checks). Input: rank 2..4,
 * q_len, k_len (q_len > k_len too: rows that see no key), dtypes, layouts, in place /
 * one buffer / overlapping, values with specials (NaN, +-inf rows), rare mismatches.
 */
#include "fuzz_common.h"

typedef struct {
    int out, x;
} sm_attrs;

static lk_status call(const fz_world *w, const void *ap) {
    const sm_attrs *a = ap;
    return lk_causal_softmax(fz_t(w, a->out), fz_t(w, a->x));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_in in = {data, size, 0};
    fz_world w;
    fz_init(&w, &in, "lk_causal_softmax");
    sm_attrs a = {-1, -1};
    int nd = 2 + (int)(fz_u8(&in) % 3);
    int64_t shape[4] = {1, 1, 1, 1};
    for (int k = 0; k < nd - 2; k++) shape[k] = fz_dim(&in, 3);
    shape[nd - 2] = fz_dim(&in, 12);
    shape[nd - 1] = fz_dim(&in, 40);
    lk_dtype xt = fz_ftype(&in), ot = fz_ftype(&in);
    unsigned alias = fz_u8(&in) % 6;
    if (alias == 0) {
        a.x = fz_view_new(&w, &in, "x", xt, nd, shape, FZ_IN);
        a.out = fz_view_alias(&w, a.x, "out", FZ_OUT);
    } else if (alias == 1) { /* slices of one buffer: disjoint, or shifted by one row */
        int64_t ps[5] = {2};
        for (int k = 0; k < nd; k++) ps[k + 1] = shape[k];
        int shift = fz_u8(&in) & 1;
        if (shift) ps[0] = 1, ps[nd - 1] += 1;
        int p = fz_view_new(&w, &in, "parent", xt, nd + 1, ps, FZ_NONE);
        if (!shift) {
            a.x = fz_view_select(&w, p, "x", 0, 0, FZ_IN);
            a.out = fz_view_select(&w, p, "out", 0, 1, FZ_OUT);
        } else {
            int q = fz_view_select(&w, p, "parent2", 0, 0, FZ_NONE);
            a.x = fz_view_narrow(&w, q, "x", nd - 2, 0, shape[nd - 2], FZ_IN);
            a.out = fz_view_narrow(&w, q, "out", nd - 2, 1, shape[nd - 2], FZ_OUT);
        }
    } else {
        a.x = fz_view_new(&w, &in, "x", xt, nd, shape, FZ_IN);
        int64_t os[4];
        memcpy(os, shape, sizeof os);
        if (fz_chance(&in, 8)) {
            os[fz_u8(&in) % (unsigned)nd] += 1;
            fz_fail_expected(&w, "out's shape differs from x's");
        }
        a.out = fz_view_new(&w, &in, "out", ot, nd, os, FZ_OUT);
    }
    w.v[a.out].inplace_of = a.x;
    fz_fill(&w, a.x, -8, 8);
    fz_tol(&w, a.out, 1e-5);
    if (fz_chance(&in, 4)) {
        if (fz_u8(&in) & 1) a.x = -1;
        else a.out = -1;
        fz_fail_expected(&w, "NULL tensor pointer");
    }
    fz_run(&w, call, &a);
    fz_free(&w);
    return 0;
}
