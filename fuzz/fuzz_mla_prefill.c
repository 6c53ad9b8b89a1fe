/*
 * Fuzz harness: lk_mla_prefix_prefill (see fuzz_common.h for the checks). Input: batch
 * (0..3 requests), per-request new-token and prefix lengths, padding rows, heads, the
 * nope / rope / value / latent dims (0 too), one- or two-buffer latent caches in ND
 * (3-D, or 4-D with one head) or NZ physical views (widths that are and are not
 * multiples of 16), block size and page count (0 too), a block table with unused tail
 * entries, shape mismatches between every pair of arguments the contract ties together
 * (q/k, v/out, kv_b_proj rows vs heads and dims, cu_seqlens_q vs prefix_lens vs
 * block_table, the two caches' pages), params (scale, strategy, cache layout, dedup;
 * out-of-domain values too, NULL), out aliasing q or v, NULL tensors; fp8 latent caches
 * (e4m3 / e5m2, either or both buffers, NZ in 32-wide tiles, widths that are not
 * multiples of 32 too) with params.k_scale (bad values too: 0, < 0, NaN, inf, which fail
 * only when a cache is fp8). Index tensors
 * i32/i64 with injected bad values (validated here from the stored values:
 * cu_seqlens_q negative / decreasing / beyond q's rows, prefix_lens negative or beyond
 * the block table's capacity, block_table entries of used pages outside
 * [0, num_blocks)). The validity of every shape is derived here with the library's own
 * rules (dims come from the shapes: Dv from v, Dl from kv_b_proj, Dn = rows / H - Dv,
 * Dr = q's head dim - Dn), so a valid input must be accepted and an invalid one
 * rejected.
 *
 * Checks beyond fz_run's: cache slots that no prefix uses (the tail of a partial last
 * page, pages no request looks at) hold NaN, so after a successful call on finite
 * inputs every output value must be finite (a read of an unused slot would poison it);
 * padding rows (outside [cu_seqlens_q[0], cu_seqlens_q[B])) must be exactly 0. out is
 * compared with the ref ISA within the test suite's vs-ref tolerance (f32 widened to
 * 1e-4: sums over latent dims and keys in a different order).
 */
#include "fuzz_common.h"

typedef struct {
    int out, q, k, v, cu, pl, bt, c0, c1, w, null_params;
    lk_mla_params p;
} mla_attrs;

static lk_status last_status;

static lk_status call(const fz_world *w, const void *ap) {
    const mla_attrs *a = ap;
    last_status = lk_mla_prefix_prefill(fz_t(w, a->out), fz_t(w, a->q), fz_t(w, a->k), fz_t(w, a->v),
                                        fz_t(w, a->cu), fz_t(w, a->pl), fz_t(w, a->bt), fz_t(w, a->c0),
                                        fz_t(w, a->c1), fz_t(w, a->w), a->null_params ? NULL : &a->p);
    if (getenv("FZ_VERBOSE")) fprintf(stderr, "%s: %s %s\n", lk_isa_name(lk_isa_current()), lk_status_str(last_status),
                                      last_status ? lk_last_error() : lk_mla_last_trace());
    return last_status;
}

/* NZ tile width of a cache of dt: 32 for 1-byte entries */
static int64_t tile_of(lk_dtype dt) { return fz_is_fp8(dt) ? 32 : 16; }

/* a latent cache view of `width` entry dims, of dtype f8 (0: a 16/32-bit one from the
 * input): ND [NB, bs, width] (or [NB, bs, 1, width] with h4), NZ [NB, width / tl, bs,
 * tl] (tl = 32 for fp8, else 16; width / tl rounded down: a width that is not a multiple
 * of tl gives a view the library must reject). fz_view_new's rare wrong-kind dtype may
 * be fp8, which the caches take (since 0.3): such a view is not bad here. */
static int cache_view(fz_world *w, fz_in *in, const char *name, int nz, int64_t NB, int64_t bs, int64_t width,
                      int h4, lk_dtype f8) {
    lk_dtype dt = f8 ? f8 : fz_ftype(in);
    int keep_fail = w->must_fail, keep_clean = w->clean, vi;
    const char *keep_why = w->why_fail;
    if (nz) {
        int64_t tl = tile_of(dt), s[4] = {NB, width / tl, bs, tl};
        vi = fz_view_new(w, in, name, dt, 4, s, FZ_IN);
    } else if (h4) {
        int64_t s[4] = {NB, bs, 1, width};
        vi = fz_view_new(w, in, name, dt, 4, s, FZ_IN);
    } else {
        int64_t s[3] = {NB, bs, width};
        vi = fz_view_new(w, in, name, dt, 3, s, FZ_IN);
    }
    fz_view *v = &w->v[vi];
    if (v->bad && fz_is_fp8(v->t.dtype) && !fz_view_invalid(&v->t)) { /* retyped to fp8: valid */
        v->bad = 0;
        w->must_fail = keep_fail, w->clean = keep_clean, w->why_fail = keep_why;
    }
    return vi;
}

/* the library's rule for a latent cache view of `width` entry dims; its pages in *nb,
 * *bs. 0: rejected */
static int cache_ok(const lk_tensor *t, int nz, int64_t width, int64_t *nb, int64_t *bs) {
    if (nz) {
        int64_t tl = tile_of(t->dtype);
        if (t->ndim != 4 || width % tl || t->shape[1] != width / tl || t->shape[3] != tl) return 0;
        *nb = t->shape[0], *bs = t->shape[2];
    } else if (t->ndim == 3) {
        if (t->shape[2] != width) return 0;
        *nb = t->shape[0], *bs = t->shape[1];
    } else {
        if (t->ndim != 4 || t->shape[2] != 1 || t->shape[3] != width) return 0;
        *nb = t->shape[0], *bs = t->shape[1];
    }
    return !(*bs < 1 && *nb > 0);
}

/* logical flat index of entry dim d of (page, slot) in a cache view of `width` dims,
 * NZ tiles tl wide */
static int64_t cache_flat(int nz, int64_t tl, int64_t bs, int64_t width, int64_t page, int64_t slot, int64_t d) {
    if (nz) return ((page * (width / tl) + d / tl) * bs + slot) * tl + d % tl;
    return (page * bs + slot) * width + d;
}

/* fz_fill for an fp8 view (fz_fill fills 16/32-bit floats only): the stored codes of
 * uniform values in [lo, hi) and, at the input's rate, special values */
static void fill8(fz_world *w, int vi, double lo, double hi) {
    fz_view *v = &w->v[vi];
    if (!fz_usable(w, vi) || !fz_is_fp8(v->t.dtype)) return;
    for (int64_t i = 0; i < fz_numel(&v->t); i++) {
        float x = fz_unif(&w->rng) < w->special_rate ? fz_special(&w->rng) : (float)(lo + (hi - lo) * fz_unif(&w->rng));
        lk_store_f(v->t.data, v->t.dtype, fz_off(&v->t, i), x);
    }
}

static int cmp_i64(const void *x, const void *y) {
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return (a > b) - (a < b);
}

/* no two elements of t share memory (broadcast or "wild" layouts may alias) */
static int injective(const lk_tensor *t) {
    int64_t n = fz_numel(t);
    int64_t *off = malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; i < n; i++) off[i] = fz_off(t, i);
    qsort(off, (size_t)n, sizeof(int64_t), cmp_i64);
    int ok = 1;
    for (int64_t i = 1; i < n && ok; i++) ok = off[i] != off[i - 1];
    free(off);
    return ok;
}

/* NaN in every slot of cache view vi that no prefix reads (used[page] slots are read);
 * 0 if the view's layout aliases elements (then nothing is poisoned) */
static int poison_unused(fz_world *w, int vi, int nz, int64_t NB, int64_t bs, int64_t width, const int64_t *used) {
    if (vi < 0 || !fz_usable(w, vi)) return 1;
    const lk_tensor *t = &w->v[vi].t;
    if (!injective(t)) return 0;
    for (int64_t p = 0; p < NB; p++)
        for (int64_t s = used[p]; s < bs; s++)
            for (int64_t d = 0; d < width; d++)
                lk_store_f(t->data, t->dtype, fz_off(t, cache_flat(nz, tile_of(t->dtype), bs, width, p, s, d)), NAN);
    return 1;
}

static double val(const fz_world *w, int vi, int64_t flat) {
    const lk_tensor *t = &w->v[vi].t;
    return (double)lk_load_f(t->data, t->dtype, fz_off(t, flat));
}

/* a cache entry dim as the contract reads it: fp8 codes times k_scale */
static double cval(const fz_world *w, int vi, const mla_attrs *a, int nz, int64_t bs, int64_t width, int64_t page,
                   int64_t slot, int64_t d) {
    lk_dtype dt = w->v[vi].t.dtype;
    double x = val(w, vi, cache_flat(nz, tile_of(dt), bs, width, page, slot, d));
    return fz_is_fp8(dt) ? x * (double)a->p.k_scale : x;
}

/* The contract computed independently in float64 from the stored values (the ref ISA
 * shares the strategies' code, so a bug there would pass the ISA comparison): per
 * request b and head h, query i sees the prefix keys [W_UK_h c_j | k_pe_j] with values
 * W_UV_h c_j (c_j, k_pe_j: the cache entry of prefix token j) and the current keys
 * 0..i. out must match within tol * (1 + |want|) with tol relative to the largest |value|
 * seen (out is a convex combination of the values; f32 scores of up to a few hundred
 * carry ~1e-4 relative error into the weights). Finite inputs only. */
static void check_dense(fz_world *w, const mla_attrs *a, int nz, int64_t Dl, int64_t Dr, int64_t B, int64_t bs,
                        int64_t maxp) {
    const lk_tensor *q = &w->v[a->q].t, *o = &w->v[a->out].t;
    int64_t H = q->shape[1], Dqk = q->shape[2], Dn = Dqk - Dr, Dv = w->v[a->v].t.shape[2], E = Dl + Dr;
    double tol = o->dtype == LK_F32 ? 2e-3 : o->dtype == LK_F16 ? 4e-3 : 2e-2;
    double *lat = malloc(sizeof(double) * (size_t)E);
    for (int64_t b = 0; b < B; b++) {
        int64_t q0 = fz_idx_get(w, a->cu, b), Q = fz_idx_get(w, a->cu, b + 1) - q0, P = fz_idx_get(w, a->pl, b);
        if (Q <= 0) continue;
        int64_t N = P + Q;
        double *K = malloc(sizeof(double) * (size_t)(N * Dqk)), *V = malloc(sizeof(double) * (size_t)(N * Dv));
        double *s = malloc(sizeof(double) * (size_t)N);
        for (int64_t h = 0; h < H; h++) {
            for (int64_t j = 0; j < N; j++) {
                double *kj = K + j * Dqk, *vj = V + j * Dv;
                if (j < P) {
                    int64_t page = fz_idx_get(w, a->bt, b * maxp + j / bs), slot = j % bs;
                    for (int64_t d = 0; d < E; d++)
                        lat[d] = a->c1 < 0 ? cval(w, a->c0, a, nz, bs, E, page, slot, d)
                                 : d < Dl ? cval(w, a->c0, a, nz, bs, Dl, page, slot, d)
                                          : cval(w, a->c1, a, nz, bs, Dr, page, slot, d - Dl);
                    for (int64_t e = 0; e < Dn + Dv; e++) {
                        double acc = 0;
                        for (int64_t l = 0; l < Dl; l++) acc += val(w, a->w, (h * (Dn + Dv) + e) * Dl + l) * lat[l];
                        if (e < Dn) kj[e] = acc;
                        else vj[e - Dn] = acc;
                    }
                    for (int64_t d = 0; d < Dr; d++) kj[Dn + d] = lat[Dl + d];
                } else {
                    int64_t t = q0 + j - P;
                    for (int64_t d = 0; d < Dqk; d++) kj[d] = val(w, a->k, (t * H + h) * Dqk + d);
                    for (int64_t d = 0; d < Dv; d++) vj[d] = val(w, a->v, (t * H + h) * Dv + d);
                }
            }
            for (int64_t i = 0; i < Q; i++) {
                int64_t vis = P + i + 1;
                double m = -INFINITY, l = 0, vmax = 1;
                for (int64_t j = 0; j < vis; j++) {
                    double dot = 0;
                    for (int64_t d = 0; d < Dqk; d++) dot += val(w, a->q, ((q0 + i) * H + h) * Dqk + d) * K[j * Dqk + d];
                    s[j] = dot * (double)a->p.scale;
                    if (s[j] > m) m = s[j];
                    for (int64_t d = 0; d < Dv; d++) vmax = fmax(vmax, fabs(V[j * Dv + d]));
                }
                for (int64_t j = 0; j < vis; j++) l += (s[j] = exp(s[j] - m));
                for (int64_t d = 0; d < Dv; d++) {
                    double want = 0;
                    for (int64_t j = 0; j < vis; j++) want += s[j] / l * V[j * Dv + d];
                    double got = val(w, a->out, ((q0 + i) * H + h) * Dv + d);
                    if (!(fabs(got - want) <= tol * vmax * (1 + fabs(want))))
                        fz_report(w, "out[token %lld, head %lld, %lld] = %.9g, float64 contract %.9g (tol %g)",
                                  (long long)(q0 + i), (long long)h, (long long)d, got, want, tol * vmax);
                }
            }
        }
        free(K), free(V), free(s);
    }
    free(lat);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_in in = {data, size, 0};
    fz_world w;
    fz_init(&w, &in, "lk_mla_prefix_prefill");
    mla_attrs a;
    memset(&a, 0, sizeof a);
    a.c1 = -1;
    int64_t B = fz_range(&in, 0, 3), ql[3] = {0}, pl[3] = {0}, T = 0;
    for (int64_t b = 0; b < B; b++) {
        ql[b] = fz_range(&in, 0, 4), pl[b] = fz_range(&in, 0, 12);
        T += ql[b];
    }
    T += fz_range(&in, 0, 2); /* padding rows: out 0 */
    int nz = fz_u8(&in) % 3 == 2, two = fz_u8(&in) & 1;
    int drop_c1 = two && fz_chance(&in, 8); /* two-buffer widths, k_pe_cache NULL: judged by the cache rules */
    /* fp8 caches: f8a the latent (or only) buffer's, f8b the rope buffer's (0: 16/32-bit) */
    unsigned f8sel = fz_u8(&in) % 8;
    lk_dtype f8a = f8sel < 2 ? LK_F8E4M3 : f8sel < 4 ? LK_F8E5M2 : (lk_dtype)0;
    lk_dtype f8b = f8sel == 4 ? LK_F8E5M2 : f8sel < 4 && !(fz_u8(&in) % 4) ? (lk_dtype)0 : f8a;
    int64_t tw = f8a || f8b ? 32 : 16; /* NZ widths in multiples of the tile (32 for fp8) */
    int64_t H = 1 + (int64_t)(fz_u8(&in) % 3), Dv = fz_dim(&in, 8), Dn = fz_dim(&in, 8), Dr, Dl;
    if (nz && two) {
        Dl = tw * (1 + (int64_t)(fz_u8(&in) % 2)), Dr = tw;
        if (fz_chance(&in, 12)) Dr = 8; /* not a multiple of the tile */
    } else if (nz) {
        int64_t E = tw * (1 + (int64_t)(fz_u8(&in) % 2));
        Dr = 1 + (int64_t)(fz_u8(&in) % 8), Dl = E - Dr;
        if (fz_chance(&in, 12)) Dl += 1; /* Dl + Dr not a multiple of 16 */
    } else {
        Dl = fz_dim(&in, 16), Dr = fz_dim(&in, 8);
    }
    int64_t bs = fz_dim(&in, 5), NB = fz_dim(&in, 6), maxp = 0;
    for (int64_t b = 0; b < B; b++)
        if (bs > 0 && (pl[b] + bs - 1) / bs > maxp) maxp = (pl[b] + bs - 1) / bs;
    maxp += fz_range(&in, 0, 1);
    int64_t Dqk = Dn + Dr, rows = H * (Dn + Dv);

    /* shapes, each maybe off by one from what the contract ties it to (judged below) */
    unsigned skew = fz_u8(&in) < 48 ? fz_u8(&in) % 12 : 99;
    int64_t qs[3] = {T, H, Dqk}, ks[3] = {T, H, Dqk}, vs[3] = {T, H, Dv}, os[3] = {T, H, Dv};
    int64_t ws[2] = {rows, Dl}, nb1 = B + 1, nbp = B, ts[2] = {B, maxp};
    if (skew == 0) qs[1] = 0;                               /* no heads */
    if (skew == 1) ks[1 + fz_u8(&in) % 2] += 1;             /* k differs from q */
    if (skew == 2) vs[fz_u8(&in) % 2] += 1;                 /* v's tokens / heads differ */
    if (skew == 3) os[fz_u8(&in) % 3] += 1;                 /* out differs from v */
    if (skew == 4) ws[0] += fz_u8(&in) & 1 ? 1 : -1;        /* rows vs heads x (Dn + Dv) */
    if (skew == 5) ws[0] += H * (fz_u8(&in) & 1 ? 1 : -1);  /* Dn one more / less: Dr changes */
    if (skew == 6) nb1 = B;                                 /* cu_seqlens_q one short */
    if (skew == 7) nbp += 1;                                /* prefix_lens one long */
    if (skew == 8) ts[0] += 1;                              /* block_table rows */
    lk_dtype qt = fz_ftype(&in), kt = fz_ftype(&in), vt = fz_ftype(&in), ot = fz_ftype(&in);
    a.q = fz_view_new(&w, &in, "q", qt, 3, qs, FZ_IN);
    a.k = fz_view_new(&w, &in, "k", kt, 3, ks, FZ_IN);
    a.v = fz_view_new(&w, &in, "v", vt, 3, vs, FZ_IN);
    unsigned alias = fz_u8(&in) % 16;
    if (alias == 0 && fz_usable(&w, a.q)) { /* out is q (its own shape: judged by the rules) */
        a.out = fz_view_alias(&w, a.q, "out", FZ_OUT);
        w.v[a.out].inplace_of = -1;
    } else if (alias == 1 && fz_usable(&w, a.v)) { /* out is v */
        a.out = fz_view_alias(&w, a.v, "out", FZ_OUT);
        w.v[a.out].inplace_of = -1;
    } else {
        a.out = fz_view_new(&w, &in, "out", ot, 3, os, FZ_OUT);
    }
    fz_tol(&w, a.out, 1e-4);
    w.v[a.out].nonfinite_any = 1; /* an inf among the inputs: double vs f32 paths differ */
    a.w = fz_view_new(&w, &in, "kv_b_proj", fz_ftype(&in), 2, ws, FZ_IN);
    a.cu = fz_view_new(&w, &in, "cu_seqlens_q", fz_u8(&in) & 1 ? LK_I64 : LK_I32, 1, &nb1, FZ_IDX);
    a.pl = fz_view_new(&w, &in, "prefix_lens", fz_u8(&in) & 1 ? LK_I64 : LK_I32, 1, &nbp, FZ_IDX);
    a.bt = fz_view_new(&w, &in, "block_table", fz_u8(&in) & 1 ? LK_I64 : LK_I32, 2, ts, FZ_IDX);
    int h4 = !nz && fz_chance(&in, 64);
    if (two) {
        a.c0 = cache_view(&w, &in, "kv_c_cache", nz, NB, bs, Dl, h4, f8a);
        int64_t NB1 = NB, bs1 = bs;
        if (skew == 9) NB1 += 1;
        if (skew == 10) bs1 += 1;
        if (!drop_c1) a.c1 = cache_view(&w, &in, "k_pe_cache", nz, NB1, bs1, Dr, 0, f8b);
    } else {
        a.c0 = cache_view(&w, &in, "kv_c_cache", nz, NB, bs, Dl + Dr + (skew == 9), h4, f8a);
    }

    /* index values: a valid pattern, maybe one corrupted entry */
    int64_t cq[4] = {0}, tv[3 * 13], used[8] = {0};
    for (int64_t b = 0; b < B; b++) cq[b + 1] = cq[b] + ql[b];
    if (T > cq[B] && fz_u8(&in) & 1) /* padding rows first instead of last */
        for (int64_t b = 0; b <= B; b++) cq[b] += T - cq[B];
    fz_idx_fill(&w, &in, a.cu, cq, nb1, T + 1);
    fz_idx_fill(&w, &in, a.pl, pl, nbp < 3 ? nbp : 3, maxp * bs + 1);
    for (int64_t i = 0; i < B * maxp; i++) tv[i] = NB ? (int64_t)(fz_next(&w.rng) % (uint64_t)NB) : 0;
    if (B >= 2 && maxp >= 1 && fz_u8(&in) & 1) tv[maxp] = tv[0]; /* a shared first page (dedup) */
    fz_idx_fill(&w, &in, a.bt, tv, B * maxp, NB);

    /* params */
    a.p = lk_mla_params_default(0.25f);
    static const float SC[8] = {0.25f, 0.5f, 1.0f, 0.0f, -0.3f, 0.125f, NAN, INFINITY};
    unsigned si = fz_u8(&in) % 8;
    a.p.scale = SC[si];
    if (si >= 6) fz_fail_expected(&w, "scale not finite");
    unsigned st = fz_u8(&in) % 16;
    a.p.strategy = st < 15 ? (lk_mla_strategy)(st % 5) : (lk_mla_strategy)(fz_u8(&in) & 1 ? 5 : -1);
    if (st == 15) fz_fail_expected(&w, "unknown strategy");
    a.p.cache_layout = nz ? LK_KV_NZ : LK_KV_ND;
    if (fz_chance(&in, 4)) a.p.cache_layout = (lk_kv_layout)7, fz_fail_expected(&w, "unknown cache layout");
    a.p.dedup = fz_u8(&in) & 1;
    static const float KS[8] = {0.5f, 1.0f, 0.03125f, 3.0f, 0.0f, -1.0f, NAN, INFINITY};
    unsigned ki = fz_u8(&in) % 16;
    a.p.k_scale = KS[ki < 4 ? ki : ki < 12 ? ki % 4 : ki - 8];
    int bad_ks = !(a.p.k_scale > 0.0f && isfinite(a.p.k_scale)); /* judged below: only with an fp8 cache */
    if (fz_chance(&in, 3)) a.null_params = 1, fz_fail_expected(&w, "NULL params");
    if (fz_chance(&in, 4)) {
        int *req[9] = {&a.out, &a.q, &a.k, &a.v, &a.cu, &a.pl, &a.bt, &a.c0, &a.w};
        *req[fz_u8(&in) % 9] = -1;
        fz_fail_expected(&w, "NULL tensor pointer");
    }

    /* the library's shape rules, on the views as built (a bad view fails anyway) */
    int any_bad = 0;
    for (int i = 0; i < w.nv; i++) any_bad |= w.v[i].bad;
    int required_null = a.out < 0 || a.q < 0 || a.k < 0 || a.v < 0 || a.cu < 0 || a.pl < 0 || a.bt < 0 || a.c0 < 0 ||
                        a.w < 0;
    int shapes_ok = 0;
    int64_t cNB = 0, cbs = 0, cmaxp = 0, cB = 0;
    int64_t lDl = 0, lDr = 0;
    if (!any_bad && !required_null && !a.null_params) {
        const lk_tensor *q = &w.v[a.q].t, *k = &w.v[a.k].t, *v = &w.v[a.v].t, *o = &w.v[a.out].t;
        const lk_tensor *wt = &w.v[a.w].t, *cu = &w.v[a.cu].t, *pt = &w.v[a.pl].t, *bt = &w.v[a.bt].t;
        int ok = q->shape[1] >= 1;
        for (int d = 0; d < 3; d++) ok &= k->shape[d] == q->shape[d] && o->shape[d] == v->shape[d];
        ok &= v->shape[0] == q->shape[0] && v->shape[1] == q->shape[1] && v->shape[2] >= 1;
        int64_t lH = q->shape[1] >= 1 ? q->shape[1] : 1, lDv = v->shape[2], lrows = wt->shape[0];
        lDl = wt->shape[1];
        ok &= lrows % lH == 0 && lrows / lH > lDv;
        int64_t lDn = lrows / lH - lDv;
        lDr = q->shape[2] - lDn;
        ok &= lDr >= 1 && lDl >= 1 && cu->shape[0] >= 1;
        cB = cu->shape[0] - 1;
        ok &= pt->shape[0] == cB && bt->shape[0] == cB;
        cmaxp = bt->shape[1];
        if (ok && a.p.cache_layout != LK_KV_ND && a.p.cache_layout != LK_KV_NZ) ok = 0;
        if (ok && a.c1 < 0) {
            ok = cache_ok(&w.v[a.c0].t, nz, lDl + lDr, &cNB, &cbs);
        } else if (ok) {
            int64_t nb2, bs2;
            ok = cache_ok(&w.v[a.c0].t, nz, lDl, &cNB, &cbs) && cache_ok(&w.v[a.c1].t, nz, lDr, &nb2, &bs2) &&
                 nb2 == cNB && bs2 == cbs;
        }
        int f8 = fz_is_fp8(w.v[a.c0].t.dtype) || (a.c1 >= 0 && fz_is_fp8(w.v[a.c1].t.dtype));
        if (ok && f8 && bad_ks) fz_fail_expected(&w, "k_scale bad with an fp8 cache");
        if (!ok) fz_fail_expected(&w, "shapes break the contract");
        shapes_ok = ok;
    }
    /* index values, from the stored values (views may broadcast) */
    if (shapes_ok) {
        int64_t Tq = w.v[a.q].t.shape[0];
        for (int64_t i = 0; i <= cB; i++) {
            int64_t c = fz_idx_get(&w, a.cu, i);
            if (c < 0 || (i && c < fz_idx_get(&w, a.cu, i - 1)) || c > Tq)
                fz_fail_expected(&w, "bad cu_seqlens_q entry");
        }
        for (int64_t b = 0; b < cB; b++) {
            int64_t P = fz_idx_get(&w, a.pl, b);
            if (P < 0 || P > cmaxp * cbs) {
                fz_fail_expected(&w, "prefix_lens beyond the block table");
                continue;
            }
            for (int64_t j = 0; cbs > 0 && j < (P + cbs - 1) / cbs; j++) {
                int64_t pg = fz_idx_get(&w, a.bt, b * cmaxp + j);
                if (pg < 0 || pg >= cNB) {
                    fz_fail_expected(&w, "block_table entry outside the cache");
                    continue;
                }
                int64_t u = P - j * cbs < cbs ? P - j * cbs : cbs;
                if (pg < 8 && u > used[pg]) used[pg] = u;
            }
        }
    }
    int fills[6] = {a.q, a.k, a.v, a.c0, a.c1, a.w}; /* -1: a NULL argument */
    for (int i = 0; i < 6; i++)
        if (fills[i] >= 0) fz_fill(&w, fills[i], i == 5 ? -0.5 : -2, i == 5 ? 0.5 : 2);
    double kss = a.p.k_scale > 0.0f && isfinite(a.p.k_scale) ? (double)a.p.k_scale : 1.0;
    for (int i = 3; i < 5; i++) /* fp8 caches: codes of [-2, 2) / k_scale (dequantized: [-2, 2)) */
        if (fills[i] >= 0) fill8(&w, fills[i], -2 / kss, 2 / kss);
    /* unused slots: NaN (only where the pages are known: a valid input) */
    int valid = shapes_ok && !w.must_fail, poisoned = valid && cNB <= 8;
    if (poisoned) {
        if (a.c1 < 0) {
            poisoned = poison_unused(&w, a.c0, nz, cNB, cbs, lDl + lDr, used);
        } else { /* both checked first: poisoning one must not depend on the other */
            poisoned = injective(&w.v[a.c0].t) && injective(&w.v[a.c1].t);
            if (poisoned) {
                poison_unused(&w, a.c0, nz, cNB, cbs, lDl, used);
                poison_unused(&w, a.c1, nz, cNB, cbs, lDr, used);
            }
        }
    }
    if (getenv("FZ_VERBOSE"))
        fprintf(stderr, "params: scale %g strategy %d layout %d dedup %d null %d k_scale %g; two %d\n",
                (double)a.p.scale, (int)a.p.strategy, (int)a.p.cache_layout, a.p.dedup, a.null_params,
                (double)a.p.k_scale, a.c1 >= 0);
    last_status = LK_ERR_VALUE;
    fz_run(&w, call, &a);
    /* after fz_run: w holds the SIMD ISA's results, last_status the ref call's (equal) */
    if (last_status == LK_OK && valid && fz_usable(&w, a.out)) {
        const lk_tensor *o = &w.v[a.out].t;
        int64_t per_row = o->shape[1] * o->shape[2], r0 = fz_idx_get(&w, a.cu, 0), r1 = fz_idx_get(&w, a.cu, cB);
        for (int64_t i = 0; i < fz_numel(o); i++) {
            double x = (double)lk_load_f(o->data, o->dtype, fz_off(o, i));
            int64_t row = i / per_row;
            if (row < r0 || row >= r1) {
                if (x != 0.0) fz_report(&w, "padding row %lld of out holds %g, not 0", (long long)row, x);
            } else if (poisoned && w.special_rate == 0.0 && !isfinite(x)) {
                fz_report(&w, "out[%lld] = %g from finite inputs (an unused cache slot was read?)", (long long)i, x);
            }
        }
    }
    if (last_status == LK_OK && valid && w.special_rate == 0.0 && fz_usable(&w, a.out))
        check_dense(&w, &a, nz, lDl, lDr, cB, cbs, cmaxp);
    fz_free(&w);
    return 0;
}
