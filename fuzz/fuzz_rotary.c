/*
 * Fuzz harness: lk_rotary_embedding (see fuzz_common.h for the checks). Input: T, head
 * counts, head dim, rotary dim (odd / too large too), max_pos, NeoX or GPT-J, k present
 * or NULL, q and k as separate buffers, slices of one fused qkv buffer, overlapping
 * slices or one view; positions i32/i64 with injected out-of-range values (validated
 * here from the stored values: any position outside [0, max_pos) must be rejected).
 * Results are compared with the ref kernel by value, exactly (the kernels claim the
 * ref's bits; a NaN's sign and payload are not specified).
 */
#include "fuzz_common.h"

typedef struct {
    int pos, q, k, cs, neox;
} rot_attrs;

static lk_status call(const fz_world *w, const void *ap) {
    const rot_attrs *a = ap;
    return lk_rotary_embedding(fz_t(w, a->pos), fz_t(w, a->q), fz_t(w, a->k), fz_t(w, a->cs), a->neox);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_in in = {data, size, 0};
    fz_world w;
    fz_init(&w, &in, "lk_rotary_embedding");
    rot_attrs a = {-1, -1, -1, -1, 0};
    int64_t T = fz_dim(&in, 6), Hq = fz_dim(&in, 4), Hk = fz_dim(&in, 4), D = fz_dim(&in, 40);
    int64_t rot = 2 * fz_range(&in, 0, D / 2), max_pos = fz_dim(&in, 8);
    if (fz_chance(&in, 8)) {
        rot = fz_u8(&in) & 1 ? rot + 1 : D + 2;
        fz_fail_expected(&w, "rotary dim odd or > head dim");
    }
    int has_k = fz_u8(&in) % 4 != 0;
    a.neox = (int)(fz_u8(&in) % 3); /* any non-zero value means NeoX */
    lk_dtype qt = fz_ftype(&in), kt = fz_ftype(&in), ct = fz_ftype(&in);
    unsigned mode = fz_u8(&in) % 6;
    int64_t qs[3] = {T, Hq, D}, ks[3] = {T, Hk, D};
    if (has_k && mode == 1) { /* fused qkv [T, Hq + 2 Hk, D]: q, k slices (disjoint) */
        int64_t ps[3] = {T, Hq + 2 * Hk, D};
        int p = fz_view_new(&w, &in, "qkv", qt, 3, ps, FZ_NONE);
        a.q = fz_view_narrow(&w, p, "q", 1, 0, Hq, FZ_OUT);
        a.k = fz_view_narrow(&w, p, "k", 1, Hq, Hk, FZ_OUT);
    } else if (has_k && mode == 2 && Hq > 0) { /* overlapping head ranges */
        int64_t ps[3] = {T, Hq + Hk, D};
        int p = fz_view_new(&w, &in, "qkv", qt, 3, ps, FZ_NONE);
        a.q = fz_view_narrow(&w, p, "q", 1, 0, Hq, FZ_OUT);
        a.k = fz_view_narrow(&w, p, "k", 1, Hq - 1, Hk, FZ_OUT);
    } else if (has_k && mode == 3) { /* k is q */
        a.q = fz_view_new(&w, &in, "q", qt, 3, qs, FZ_OUT);
        a.k = fz_view_alias(&w, a.q, "k", FZ_OUT);
        w.v[a.k].inplace_of = -1;
    } else {
        if (fz_chance(&in, 8)) {
            qs[0] += 1;
            fz_fail_expected(&w, "q's tokens differ from positions'");
        }
        a.q = fz_view_new(&w, &in, "q", qt, 3, qs, FZ_OUT);
        if (has_k) a.k = fz_view_new(&w, &in, "k", kt, 3, ks, FZ_OUT);
    }
    int64_t cs_shape[2] = {max_pos, rot};
    a.cs = fz_view_new(&w, &in, "cos_sin_cache", ct, 2, cs_shape, FZ_IN);
    int64_t pt = T;
    a.pos = fz_view_new(&w, &in, "positions", fz_u8(&in) & 1 ? LK_I64 : LK_I32, 1, &pt, FZ_IDX);
    int64_t pv[6];
    for (int64_t t = 0; t < T; t++) pv[t] = max_pos ? (int64_t)(fz_next(&w.rng) % (uint64_t)max_pos) : 0;
    fz_idx_fill(&w, &in, a.pos, pv, T, max_pos);
    if (fz_usable(&w, a.pos))
        for (int64_t t = 0; t < T; t++) {
            int64_t v = fz_idx_get(&w, a.pos, t);
            if (v < 0 || v >= max_pos) fz_fail_expected(&w, "position out of range");
        }
    fz_fill(&w, a.q, -4, 4);
    if (a.k >= 0) fz_fill(&w, a.k, -4, 4);
    fz_fill(&w, a.cs, -1, 1);
    fz_tol(&w, a.q, 0.0);
    w.v[a.q].atol = w.v[a.q].rtol = 0.0;
    if (a.k >= 0) {
        fz_tol(&w, a.k, 0.0);
        w.v[a.k].atol = w.v[a.k].rtol = 0.0;
    }
    if (fz_chance(&in, 4)) {
        unsigned k = fz_u8(&in) % 3;
        if (k == 0) a.pos = -1;
        else if (k == 1) a.q = -1;
        else a.cs = -1;
        fz_fail_expected(&w, "NULL tensor pointer");
    }
    fz_run(&w, call, &a);
    fz_free(&w);
    return 0;
}
