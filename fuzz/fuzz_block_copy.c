/*
 * Fuzz harness: lk_swap_blocks and lk_copy_blocks (see fuzz_common.h for the checks).
 * Input: op, block counts of source and destination (0 too), rank and dims of a block
 * (1-D caches too), dtypes (a differing destination dtype rarely), layouts (any
 * permutation, padding, negative strides), two caches for copy_blocks (or one view
 * passed twice), block_mapping [N, 2] i32/i64 with injected out-of-range values,
 * duplicate destinations and (copy) destinations that are also sources. The harness
 * re-validates the stored mapping; caches are compared with the ref kernel bit for bit.
 * Dtypes include e4m3 / e5m2 (fp8 caches are copied as bytes, since 0.3).
 */
#include "fuzz_common.h"


/* a cache dtype: f32 / f16 / bf16 / e4m3 / e5m2 */
static lk_dtype btype(fz_in *in) {
    static const lk_dtype BT[5] = {LK_F32, LK_F16, LK_BF16, LK_F8E4M3, LK_F8E5M2};
    return BT[fz_u8(in) % 5];
}

/* fz_view_new for a cache: its rare retype to fp8 is no error of its own (fp8 caches are
 * copied too; the input is then just not clean) */
static int view8(fz_world *w, fz_in *in, const char *name, lk_dtype dt, int nd, const int64_t *shape, int role) {
    int vi = fz_view_new(w, in, name, dt, nd, shape, role);
    fz_view *v = &w->v[vi];
    if (v->bad && fz_is_fp8(v->t.dtype) && !fz_view_invalid(&v->t))
        v->bad = 0, w->must_fail = 0, w->clean = 0; /* the earlier expectations assumed dt */
    return vi;
}

/* random bytes in an fp8 view (fz_fill fills float views only) */
static void fill8(fz_world *w, int vi) {
    if (vi < 0 || !fz_usable(w, vi) || !fz_is_fp8(w->v[vi].t.dtype)) return;
    int64_t n = fz_numel(&w->v[vi].t);
    for (int64_t i = 0; i < n; i++) ((unsigned char *)w->v[vi].t.data)[fz_off(&w->v[vi].t, i)] = (unsigned char)fz_next(&w->rng);
}

typedef struct {
    int copy, src, dst, c1, bm;
} bc_attrs;

static lk_status call(const fz_world *w, const void *ap) {
    const bc_attrs *a = ap;
    if (!a->copy) return lk_swap_blocks(fz_t(w, a->src), fz_t(w, a->dst), fz_t(w, a->bm));
    if (a->dst < 0 || a->c1 < 0) return lk_copy_blocks(2, NULL, fz_t(w, a->bm));
    lk_tensor c[2] = {w->v[a->dst].t, w->v[a->c1].t};
    return lk_copy_blocks(2, c, fz_t(w, a->bm));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_in in = {data, size, 0};
    fz_world w;
    fz_init(&w, &in, "block_copy");
    bc_attrs a = {0, -1, -1, -1, -1};
    a.copy = fz_u8(&in) & 1;
    w.op = a.copy ? "lk_copy_blocks" : "lk_swap_blocks";
    int64_t NBs = fz_dim(&in, 6), NBd = a.copy ? NBs : fz_dim(&in, 6);
    int bnd = (int)(fz_u8(&in) % 3); /* dims after dim 0 */
    int64_t shape[4] = {NBs, fz_dim(&in, 4), fz_dim(&in, 3), fz_dim(&in, 9)};
    lk_dtype st = btype(&in), dt = st;
    if (!a.copy && fz_chance(&in, 8)) {
        dt = btype(&in);
        if (dt != st) fz_fail_expected(&w, "dst dtype differs from src's");
    }
    int64_t dshape[4] = {NBd, shape[1], shape[2], shape[3]};
    if (!a.copy && bnd > 0 && fz_chance(&in, 8)) {
        dshape[1 + fz_u8(&in) % (unsigned)bnd] += 1;
        fz_fail_expected(&w, "dst's block dims differ from src's");
    }
    if (a.copy) {
        a.dst = view8(&w, &in, "caches[0]", st, 1 + bnd, shape, FZ_OUT);
        if (fz_chance(&in, 8)) {
            a.c1 = fz_view_alias(&w, a.dst, "caches[1]", FZ_OUT); /* one cache twice: overlap */
            w.v[a.c1].inplace_of = -1;
        } else {
            int64_t s1[3] = {NBs, fz_dim(&in, 5), fz_dim(&in, 40)};
            a.c1 = view8(&w, &in, "caches[1]", btype(&in), 1 + (int)(fz_u8(&in) % 3), s1, FZ_OUT);
        }
    } else {
        a.src = view8(&w, &in, "src", st, 1 + bnd, shape, FZ_IN);
        a.dst = view8(&w, &in, "dst", dt, 1 + bnd, dshape, FZ_OUT);
    }
    /* valid: copy: sources in the lower half, distinct destinations in the upper half;
     * swap: any sources, distinct destinations (N clamped so that the pattern exists;
     * bad values come from fz_idx_fill and the injections below) */
    int64_t vals[12], perm[6];
    int64_t lo = a.copy ? NBd / 2 : 0, nd = NBd - lo, nsrc = a.copy ? NBd / 2 : NBs;
    int64_t N = fz_dim(&in, 6);
    if (N > nd) N = nd;
    if (nsrc == 0) N = 0;
    int64_t bms[2] = {N, 2};
    a.bm = fz_view_new(&w, &in, "block_mapping", fz_u8(&in) & 1 ? LK_I64 : LK_I32, 2, bms, FZ_IDX);
    for (int64_t i = 0; i < nd; i++) perm[i] = lo + i;
    for (int64_t i = nd - 1; i > 0; i--) {
        int64_t j = (int64_t)(fz_next(&w.rng) % (uint64_t)(i + 1)), x = perm[i];
        perm[i] = perm[j], perm[j] = x;
    }
    for (int64_t i = 0; i < N; i++) {
        vals[2 * i] = (int64_t)(fz_next(&w.rng) % (uint64_t)(nsrc ? nsrc : 1));
        vals[2 * i + 1] = perm[i];
    }
    if (N >= 2 && fz_chance(&in, 16)) vals[2 * fz_range(&in, 0, N - 1) + 1] = vals[2 * fz_range(&in, 0, N - 1) + 1];
    if (a.copy && N >= 1 && fz_chance(&in, 16)) vals[2 * fz_range(&in, 0, N - 1)] = vals[2 * fz_range(&in, 0, N - 1) + 1];
    int64_t rows = N;
    if (fz_usable(&w, a.bm)) fz_idx_fill(&w, &in, a.bm, vals, 2 * rows, NBd);
    if (fz_usable(&w, a.bm)) {
        int64_t nbs_lim = a.copy ? NBd : NBs;
        if (a.copy && fz_usable(&w, a.c1) && w.v[a.c1].t.ndim >= 1 && w.v[a.c1].t.shape[0] < nbs_lim)
            nbs_lim = w.v[a.c1].t.shape[0];
        int64_t nbd_lim = a.copy ? nbs_lim : NBd;
        for (int64_t i = 0; i < rows; i++) {
            int64_t s = fz_idx_get(&w, a.bm, 2 * i), d = fz_idx_get(&w, a.bm, 2 * i + 1);
            if (s < 0 || s >= nbs_lim || d < 0 || d >= nbd_lim) fz_fail_expected(&w, "block index outside its cache");
            if (a.copy && s == d) continue; /* a block onto itself: a no-op, out of the rules */
            for (int64_t j = 0; j < rows; j++) {
                int64_t sj = fz_idx_get(&w, a.bm, 2 * j), dj = fz_idx_get(&w, a.bm, 2 * j + 1);
                if (a.copy && sj == dj) continue;
                if (j < i && dj == d) fz_fail_expected(&w, "destination twice");
                if (a.copy && sj == d) fz_fail_expected(&w, "destination is a source");
            }
        }
    }
    if (a.src >= 0) fz_fill(&w, a.src, -4, 4);
    if (a.dst >= 0) fz_fill(&w, a.dst, -4, 4);
    if (a.c1 >= 0) fz_fill(&w, a.c1, -4, 4);
    fill8(&w, a.src), fill8(&w, a.dst), fill8(&w, a.c1);
    if (fz_chance(&in, 4)) {
        unsigned k = fz_u8(&in) % 3;
        if (k == 0 && !a.copy) a.src = -1;
        else if (k <= 1) a.dst = -1;
        else a.bm = -1;
        fz_fail_expected(&w, "NULL tensor pointer");
    }
    fz_run(&w, call, &a);
    fz_free(&w);
    return 0;
}
