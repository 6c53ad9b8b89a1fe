/*
 * Fuzz harness: lk_reshape_and_cache_flash (see fuzz_common.h for the checks). Input:
 * T, H, Dk, Dv, num_blocks, block_size (0 too), N <= T (or N > T), dtypes, cache layouts
 * (any permutation: NHD, HND, ...), k and v caches interleaved in one [NB, 2, ...]
 * buffer, or one view; slot_mapping i32/i64 with padding (-1 and other negatives),
 * injected out-of-range values and duplicates. The harness re-validates the stored
 * slots (>= num_blocks * block_size or a slot used twice must be rejected). Caches are
 * compared with the ref kernel bit for bit (copies and one rounding). A third of the
 * inputs call lk_reshape_and_cache_flash_scaled instead: fp8 caches (e4m3 / e5m2, either
 * or both), scales from a list with bad ones (0, < 0, NaN, inf: rejected); another
 * third call lk_reshape_and_cache_flash_fp8: scale tensors ([1], per head [H], a wrong
 * length, NULL; values from the same list), ND or NZ caches (NZ physical [NB, C / tile,
 * bs, tile], tile 32 for fp8, 16 else; widths that are not a multiple: rejected).
 */
#include <float.h>
#include <math.h>

#include "fuzz_common.h"

typedef struct {
    int k, v, kc, vc, sm;
    int scaled; /* 1: the float-scale entry; 2: the _fp8 entry */
    float ks, vs;
    int kst, vst, layout;
} kv_attrs;


/* fz_view_new for an argument that takes fp8: its rare retype to fp8 is no error of its
 * own (the op decides; the input is then just not clean) */
static int view8(fz_world *w, fz_in *in, const char *name, lk_dtype dt, int nd, const int64_t *shape, int role) {
    int vi = fz_view_new(w, in, name, dt, nd, shape, role);
    fz_view *v = &w->v[vi];
    if (v->bad && fz_is_fp8(v->t.dtype) && !fz_view_invalid(&v->t)) {
        v->bad = 0, w->must_fail = 0, w->clean = 0; /* the earlier expectations assumed dt */
    }
    return vi;
}

static const float SC[] = {1.0f, 0.03125f, 3.7f, 1e-30f, 1e30f, 0.0f, -1.0f, NAN, INFINITY};

/* a scale tensor of n values (f32 [n]; [1] may be [] too), or -1 (NULL) */
static int scale_view(fz_world *w, fz_in *in, const char *name, int64_t H) {
    unsigned k = fz_u8(in) % 8;
    if (k == 0) return -1;
    int64_t n = k <= 2 ? 1 : k <= 6 ? H : H + 1;
    if (n != 1 && n != H) fz_fail_expected(w, "scale of neither 1 nor H values");
    int vi = fz_view_new(w, in, name, LK_F32, 1, &n, FZ_IN);
    if (k == 1 && !w->v[vi].bad) w->v[vi].t.ndim = 0; /* [] */
    if (!fz_usable(w, vi)) return vi;
    float *d = w->v[vi].t.data;
    for (int64_t i = 0; i < n; i++) d[fz_off(&w->v[vi].t, i)] = SC[fz_u8(in) % 9];
    for (int64_t i = 0; i < n; i++) { /* judged from the stored values (a view may broadcast) */
        float x = d[fz_off(&w->v[vi].t, i)];
        if (!(x > 0 && x <= FLT_MAX)) fz_fail_expected(w, "scale not finite > 0");
    }
    return vi;
}

static lk_status call(const fz_world *w, const void *ap) {
    const kv_attrs *a = ap;
    if (a->scaled == 2)
        return lk_reshape_and_cache_flash_fp8(fz_t(w, a->k), fz_t(w, a->v), fz_t(w, a->kc), fz_t(w, a->vc),
                                              fz_t(w, a->sm), fz_t(w, a->kst), fz_t(w, a->vst),
                                              (lk_kv_layout)a->layout);
    if (a->scaled)
        return lk_reshape_and_cache_flash_scaled(fz_t(w, a->k), fz_t(w, a->v), fz_t(w, a->kc), fz_t(w, a->vc),
                                                 fz_t(w, a->sm), a->ks, a->vs);
    return lk_reshape_and_cache_flash(fz_t(w, a->k), fz_t(w, a->v), fz_t(w, a->kc), fz_t(w, a->vc),
                                      fz_t(w, a->sm));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_in in = {data, size, 0};
    fz_world w;
    fz_init(&w, &in, "lk_reshape_and_cache_flash");
    kv_attrs a = {-1, -1, -1, -1, -1, 0, 1.0f, 1.0f, -1, -1, LK_KV_ND};
    int64_t T = fz_dim(&in, 8), H = fz_dim(&in, 3), Dk = fz_dim(&in, 20), Dv = fz_dim(&in, 20);
    int64_t NB = fz_dim(&in, 5), bs = fz_dim(&in, 5), N = fz_range(&in, 0, T);
    int bs0 = bs == 0; /* rejected; by the _fp8 entry only with blocks (an empty cache may have bs 0) */
    if (fz_chance(&in, 6)) {
        N = T + 1;
        fz_fail_expected(&w, "more slots than tokens");
    }
    lk_dtype kt = fz_ftype(&in), vt = fz_ftype(&in), kct = fz_ftype(&in), vct = fz_ftype(&in);
    unsigned pick = fz_u8(&in) % 3;
    if (pick == 2) { /* the _fp8 entry */
        w.op = "lk_reshape_and_cache_flash_fp8";
        a.scaled = 2;
        static const lk_dtype CT[5] = {LK_F32, LK_F16, LK_BF16, LK_F8E4M3, LK_F8E5M2};
        kct = CT[fz_u8(&in) % 5], vct = CT[fz_u8(&in) % 5];
        if (fz_u8(&in) % 3 == 0) { /* NZ: widths mostly multiples of 32 */
            a.layout = LK_KV_NZ;
            if (fz_u8(&in) % 8) {
                H = 1 + (int64_t)(fz_u8(&in) % 2);
                Dk = 16 * fz_range(&in, 0, 2), Dv = 16 * fz_range(&in, 0, 2);
            }
            for (int i = 0; i < 2; i++) {
                int64_t D = i ? Dv : Dk, tile = lk_dtype_size(i ? vct : kct) == 1 ? 32 : 16;
                if (H * D % tile) fz_fail_expected(&w, "NZ width not a multiple of the tile");
            }
        }
        a.kst = scale_view(&w, &in, "k_scale", H);
        a.vst = scale_view(&w, &in, "v_scale", H);
        if (fz_chance(&in, 8)) {
            a.layout = 5;
            fz_fail_expected(&w, "unknown layout");
        }
    } else if ((a.scaled = pick == 0)) {
        static const float sc[] = {1.0f, 0.03125f, 3.7f, 1e-30f, 1e30f, 0.0f, -1.0f, NAN, INFINITY};
        unsigned f = fz_u8(&in);
        if (f & 1) kct = f & 2 ? LK_F8E5M2 : LK_F8E4M3;
        if (f & 4) vct = f & 8 ? LK_F8E5M2 : LK_F8E4M3;
        a.ks = sc[fz_u8(&in) % 9];
        a.vs = sc[fz_u8(&in) % 9];
        if (!(a.ks > 0 && a.ks <= FLT_MAX)) fz_fail_expected(&w, "k_scale not finite > 0");
        if (!(a.vs > 0 && a.vs <= FLT_MAX)) fz_fail_expected(&w, "v_scale not finite > 0");
    }
    if (bs0 && (a.scaled != 2 || NB > 0)) fz_fail_expected(&w, "block_size 0");
    if (bs0 && a.scaled == 2 && NB == 0) w.clean = 0;
    unsigned mode = fz_u8(&in) % 5;
    if (a.layout != LK_KV_ND) mode = 2 + mode % 3; /* separate NZ caches */
    if (mode <= 1) Dv = Dk, vct = kct;
    int64_t kshape[3] = {T, H, Dk}, vshape[3] = {T, H, Dv};
    if (fz_chance(&in, 6)) {
        vshape[fz_u8(&in) & 1] += 1;
        fz_fail_expected(&w, "v's [T, H] differ from k's");
    }
    a.k = fz_view_new(&w, &in, "k", kt, 3, kshape, FZ_IN);
    a.v = fz_view_new(&w, &in, "v", vt, 3, vshape, FZ_IN);
    int64_t kcs[4] = {NB, bs, H, Dk}, vcs[4] = {NB, bs, H, Dv};
    if (mode == 0) { /* one [NB, 2, bs, H, D] buffer: k_cache = [:, 0], v_cache = [:, 1] */
        int64_t ps[5] = {NB, 2, bs, H, Dk};
        int p = fz_view_new(&w, &in, "kv_cache", kct, 5, ps, FZ_NONE);
        a.kc = fz_view_select(&w, p, "k_cache", 1, 0, FZ_OUT);
        a.vc = fz_view_select(&w, p, "v_cache", 1, 1, FZ_OUT);
    } else if (mode == 1) { /* v_cache is k_cache */
        a.kc = a.scaled ? view8(&w, &in, "k_cache", kct, 4, kcs, FZ_OUT) : fz_view_new(&w, &in, "k_cache", kct, 4, kcs, FZ_OUT);
        a.vc = fz_view_alias(&w, a.kc, "v_cache", FZ_OUT);
        w.v[a.vc].inplace_of = -1;
    } else {
        if (fz_chance(&in, 6)) {
            vcs[fz_u8(&in) % 3] += 1;
            fz_fail_expected(&w, "v_cache's [NB, bs, H] differ from k_cache's");
        }
        if (a.layout == LK_KV_NZ) { /* physical [NB, C / tile, bs, tile] */
            int64_t tk = lk_dtype_size(kct) == 1 ? 32 : 16, tv = lk_dtype_size(vct) == 1 ? 32 : 16;
            int64_t zk[4] = {NB, H * Dk / tk, bs, tk}, zv[4] = {vcs[0], H * Dv / tv, vcs[1], tv};
            if (vcs[2] != H) zv[1] += 1;
            a.kc = view8(&w, &in, "k_cache", kct, 4, zk, FZ_OUT);
            a.vc = view8(&w, &in, "v_cache", vct, 4, zv, FZ_OUT);
        } else if (a.scaled) {
            a.kc = view8(&w, &in, "k_cache", kct, 4, kcs, FZ_OUT);
            a.vc = view8(&w, &in, "v_cache", vct, 4, vcs, FZ_OUT);
        } else {
            a.kc = fz_view_new(&w, &in, "k_cache", kct, 4, kcs, FZ_OUT);
            a.vc = fz_view_new(&w, &in, "v_cache", vct, 4, vcs, FZ_OUT);
        }
    }
    a.sm = fz_view_new(&w, &in, "slot_mapping", fz_u8(&in) & 1 ? LK_I64 : LK_I32, 1, &N, FZ_IDX);
    /* valid slots: distinct, from a shuffled [0, NB * bs), with padding */
    int64_t nslots = NB * bs, sv[9];
    int64_t perm[25];
    for (int64_t i = 0; i < nslots; i++) perm[i] = i;
    for (int64_t i = nslots - 1; i > 0; i--) {
        int64_t j = (int64_t)(fz_next(&w.rng) % (uint64_t)(i + 1)), x = perm[i];
        perm[i] = perm[j], perm[j] = x;
    }
    unsigned pad = fz_u8(&in);
    for (int64_t i = 0; i < N; i++)
        sv[i] = (i < nslots && (fz_next(&w.rng) & 255) >= pad / 2) ? perm[i] : -1 - (int64_t)(fz_next(&w.rng) % 3);
    if (N >= 2 && fz_chance(&in, 16)) sv[fz_range(&in, 0, N - 1)] = sv[fz_range(&in, 0, N - 1)];
    fz_idx_fill(&w, &in, a.sm, sv, N, nslots);
    fz_check_slots(&w, a.sm, N, nslots);
    fz_fill(&w, a.k, -4, 4);
    fz_fill(&w, a.v, -4, 4);
    if (fz_chance(&in, 4)) {
        unsigned k = fz_u8(&in) % 5;
        if (k == 0) a.k = -1;
        else if (k == 1) a.v = -1;
        else if (k == 2) a.kc = -1;
        else if (k == 3) a.vc = -1;
        else a.sm = -1;
        fz_fail_expected(&w, "NULL tensor pointer");

    }
    fz_run(&w, call, &a);
    fz_free(&w);
    return 0;
}
