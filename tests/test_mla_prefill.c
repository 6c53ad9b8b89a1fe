/*
 * mla_prefix_prefill: every strategy (split + merge, concat, fused, absorbed, auto) on
 * every ISA against a float64 dense prefix-first computation (per request: project each
 * prefix latent with kv_b_proj, keys [k_nope | k_pe], then softmax over [prefix | current]
 * with the bottom-right causal mask) and against the ref ISA's result. Page sizes 1, 7,
 * 128; heads 2, 4, 16 and one small 128-head case; query lengths 1 .. 257; prefixes
 * 0 .. 2048 (also not a multiple of the page size); batches mixing empty and non-empty
 * prefixes and empty requests; padding tokens (rows must be exactly 0); strided and
 * permuted q / k / v / out / caches / weight whose garbage must stay untouched; unused
 * cache slots hold NaN (reading one would poison the output); f32 / f16 / bf16 and mixed
 * dtypes; one- and two-buffer caches; NZ == ND bit for bit; shared-prefix dedup == no
 * dedup bit for bit; thread-count determinism; the strategy trace (each forced strategy
 * runs only its own ops, auto picks what lk_mla_choose says); the bad-input catalogue.
 * Tolerances (atol = rtol) by out dtype: f32 5e-5, f16 3e-3, bf16 2e-2.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/half.h"
#include "cpu/mla/mla_test.h"
#include "testutil.h"

#define MAXB 40

typedef struct {
    int B;
    int64_t ql[MAXB], pl[MAXB];
    int pad_tokens;               /* extra q rows after the last request */
    int64_t H, Dn, Dr, Dv, Dl;
    int bs;
    lk_kv_layout layout;
    int two;                      /* two-buffer cache */
    int share;                    /* requests b > 0 reuse request 0's first `share` pages */
    lk_dtype qt, ct, wt, ot;      /* q/k/v, cache, kv_b_proj, out */
    int pad;                      /* strided views */
    int qperm;                    /* q stored [H, T, D] (permuted view) */
    int ref_isa;                  /* also run the ref ISA (slow for big shapes) */
    int no_ref;                   /* skip the float64 reference (shape-only checks) */
    float ks;                     /* fp8 caches: k_scale (0: 1); entries stored as fp8(x / ks) */
    int rope16;                   /* two buffers: the rope cache is bf16 (the latent one ct) */
    const char *name;
} mcase;

typedef struct {
    tu_buf q, k, v, out, cu, pl, bt, cache, cache2, w;
    double *want; /* [T, H, Dv] */
    int64_t T, nb, maxp;
} mbufs;

static const lk_mla_strategy STRATS[5] = {LK_MLA_AUTO, LK_MLA_SPLIT_MERGE, LK_MLA_CONCAT, LK_MLA_FUSED,
                                          LK_MLA_ABSORBED};

static int is_f8(lk_dtype dt) { return dt == LK_F8E4M3 || dt == LK_F8E5M2; }
static float kscale(const mcase *c) { return c->ks > 0 ? c->ks : 1.0f; }
/* dtype of the rope part's buffer (part 1 of a two-buffer cache) */
static lk_dtype part_dt(const mcase *c, int part) { return part && c->two && c->rope16 ? LK_BF16 : c->ct; }
/* NZ tile width: 32 for 1-byte entries, else 16 */
static int64_t tile_of(lk_dtype dt) { return is_f8(dt) ? 32 : 16; }

/* flat logical index of entry dim d (of a D-dim entry) of (page, slot) in a cache buf of dt */
static int64_t cidx(const mcase *c, lk_dtype dt, int64_t page, int64_t slot, int64_t d, int64_t D) {
    int64_t tl = tile_of(dt);
    if (c->layout == LK_KV_NZ) return ((page * (D / tl) + d / tl) * c->bs + slot) * tl + d % tl;
    return (page * c->bs + slot) * D + d;
}

static tu_buf alloc_cache(const mcase *c, lk_dtype dt, int64_t nb, int64_t D) {
    int64_t tl = tile_of(dt);
    if (c->layout == LK_KV_NZ) return tu_alloc(dt, 4, (int64_t[]){nb, D / tl, c->bs, tl}, c->pad);
    return tu_alloc(dt, 3, (int64_t[]){nb, c->bs, D}, c->pad);
}

/* logical entry dim d (of Dl + Dr) of (page, slot) */
static double *centry(const mcase *c, double *cv, double *cv2, int64_t page, int64_t slot, int64_t d) {
    int64_t E = c->Dl + c->Dr;
    if (!c->two) return cv + cidx(c, c->ct, page, slot, d, E);
    return d < c->Dl ? cv + cidx(c, c->ct, page, slot, d, c->Dl)
                     : cv2 + cidx(c, part_dt(c, 1), page, slot, d - c->Dl, c->Dr);
}

/* store logical value x into a cache buffer of dt: fp8 buffers get fp8(x / k_scale)
 * (src/core/fp8.h through lk_store_f, after one f32 division, as the cache writes do) */
static void cset(const mcase *c, tu_buf *b, int64_t i, double x) {
    if (is_f8(b->t.dtype) && !isnan(x)) x = (float)x / kscale(c);
    tu_set(b, i, x);
}

/* the dequantized values of a cache buffer (fp8: f32(code) * k_scale, in double) */
static double *cvalues(const mcase *c, const tu_buf *b) {
    double *v = tu_values(b);
    for (int64_t i = 0; is_f8(b->t.dtype) && i < tu_numel(b); i++) v[i] *= (double)kscale(c);
    return v;
}

static float scale_of(const mcase *c) { return (float)(1.0 / sqrt((double)(c->Dn + c->Dr))); }

static void build(const mcase *c, mbufs *z) {
    memset(z, 0, sizeof *z);
    int64_t B = c->B, H = c->H, Dqk = c->Dn + c->Dr, Dv = c->Dv, Dl = c->Dl, E = Dl + c->Dr, bs = c->bs;
    int64_t T = c->pad_tokens;
    for (int b = 0; b < B; b++) T += c->ql[b];
    z->T = T;
    z->q = c->qperm ? tu_alloc_perm(c->qt, 3, (int64_t[]){T, H, Dqk}, (int[]){1, 0, 2}, c->pad)
                    : tu_alloc(c->qt, 3, (int64_t[]){T, H, Dqk}, c->pad);
    z->k = tu_alloc(c->qt, 3, (int64_t[]){T, H, Dqk}, c->pad);
    z->v = tu_alloc(c->qt, 3, (int64_t[]){T, H, Dv}, c->pad);
    z->out = tu_alloc(c->ot, 3, (int64_t[]){T, H, Dv}, c->pad);
    tu_fill_uniform(&z->q, -1, 1), tu_fill_uniform(&z->k, -1, 1), tu_fill_uniform(&z->v, -1, 1);
    double wa = 1.7 / sqrt((double)Dl);
    z->w = tu_alloc(c->wt, 2, (int64_t[]){H * (c->Dn + Dv), Dl}, c->pad);
    tu_fill_uniform(&z->w, -wa, wa);
    /* pages: request b's logical page i is perm[first[b] + i], except shared ones */
    int64_t maxp = 1, total = 0, np[MAXB], first[MAXB];
    for (int b = 0; b < B; b++) {
        np[b] = (c->pl[b] + bs - 1) / bs;
        if (np[b] > maxp) maxp = np[b];
        first[b] = total;
        total += np[b];
    }
    maxp += 1; /* a spare column of garbage */
    int64_t nb = total + 3;
    z->nb = nb, z->maxp = maxp;
    int64_t *perm = malloc(sizeof(int64_t) * (size_t)nb);
    for (int64_t i = 0; i < nb; i++) perm[i] = i;
    for (int64_t i = nb - 1; i > 0; i--) {
        int64_t j = tu_randint(0, i), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    z->cu = tu_alloc(LK_I32, 1, (int64_t[]){B + 1}, 0);
    z->pl = tu_alloc(LK_I32, 1, (int64_t[]){B}, 0);
    z->bt = tu_alloc(LK_I32, 2, (int64_t[]){B, maxp}, 0);
    int64_t acc = 0;
    for (int b = 0; b <= B; b++) {
        tu_set(&z->cu, b, (double)acc);
        if (b == B) break;
        acc += c->ql[b];
        tu_set(&z->pl, b, (double)c->pl[b]);
        for (int64_t i = 0; i < maxp; i++) {
            double id = -1;
            if (i < np[b]) id = (double)perm[b && i < c->share && i < np[0] ? first[0] + i : first[b] + i];
            tu_set(&z->bt, b * maxp + i, id);
        }
    }
    /* caches: NaN everywhere, random values in every slot some prefix uses (drawn in
     * logical order, so ND and NZ builds from one seed hold the same values) */
    z->cache = alloc_cache(c, c->ct, nb, c->two ? Dl : E);
    if (c->two) z->cache2 = alloc_cache(c, part_dt(c, 1), nb, c->Dr);
    for (int64_t i = 0; i < tu_numel(&z->cache); i++) tu_set(&z->cache, i, NAN);
    for (int64_t i = 0; c->two && i < tu_numel(&z->cache2); i++) tu_set(&z->cache2, i, NAN);
    int64_t *used = calloc((size_t)nb, sizeof(int64_t));
    for (int b = 0; b < B; b++)
        for (int64_t i = 0; i < np[b]; i++) {
            int64_t page = (int64_t)tu_get(&z->bt, b * maxp + i), u = c->pl[b] - i * bs < bs ? c->pl[b] - i * bs : bs;
            if (u > used[page]) used[page] = u;
        }
    for (int64_t p = 0; p < nb; p++)
        for (int64_t s = 0; s < used[p]; s++)
            for (int64_t d = 0; d < E; d++) {
                double x = tu_uniform(-1, 1);
                if (!c->two) cset(c, &z->cache, cidx(c, c->ct, p, s, d, E), x);
                else if (d < Dl) cset(c, &z->cache, cidx(c, c->ct, p, s, d, Dl), x);
                else cset(c, &z->cache2, cidx(c, part_dt(c, 1), p, s, d - Dl, c->Dr), x);
            }
    free(used);
    free(perm);
    z->want = calloc((size_t)(T * H * Dv + 1), sizeof(double));
    if (c->no_ref) return;
    /* float64 reference */
    double *qv = tu_values(&z->q), *kv = tu_values(&z->k), *vv = tu_values(&z->v), *wv = tu_values(&z->w);
    double *cv = cvalues(c, &z->cache), *cv2 = c->two ? cvalues(c, &z->cache2) : NULL;
    double scale = scale_of(c);
    int64_t q0 = 0;
    for (int b = 0; b < B; b++) {
        int64_t P = c->pl[b], Q = c->ql[b], N = P + Q;
        double *K = malloc(sizeof(double) * (size_t)(N * H * Dqk + 1)), *V = malloc(sizeof(double) * (size_t)(N * H * Dv + 1));
        double *lat = malloc(sizeof(double) * (size_t)E);
        for (int64_t j = 0; j < P; j++) {
            int64_t page = (int64_t)tu_get(&z->bt, b * maxp + j / bs);
            for (int64_t d = 0; d < E; d++) lat[d] = *centry(c, cv, cv2, page, j % bs, d);
            for (int64_t h = 0; h < H; h++) {
                for (int64_t e = 0; e < c->Dn + Dv; e++) {
                    double s = 0;
                    const double *wr = wv + (h * (c->Dn + Dv) + e) * Dl;
                    for (int64_t l = 0; l < Dl; l++) s += wr[l] * lat[l];
                    if (e < c->Dn) K[(j * H + h) * Dqk + e] = s;
                    else V[(j * H + h) * Dv + e - c->Dn] = s;
                }
                for (int64_t d = 0; d < c->Dr; d++) K[(j * H + h) * Dqk + c->Dn + d] = lat[Dl + d];
            }
        }
        for (int64_t j = 0; j < Q; j++) {
            memcpy(K + (P + j) * H * Dqk, kv + (q0 + j) * H * Dqk, sizeof(double) * (size_t)(H * Dqk));
            memcpy(V + (P + j) * H * Dv, vv + (q0 + j) * H * Dv, sizeof(double) * (size_t)(H * Dv));
        }
        double *s = malloc(sizeof(double) * (size_t)(N + 1));
        for (int64_t i = 0; i < Q; i++)
            for (int64_t h = 0; h < H; h++) {
                int64_t vis = P + i + 1;
                double m = -INFINITY, l = 0;
                for (int64_t j = 0; j < vis; j++) {
                    double dot = 0;
                    for (int64_t d = 0; d < Dqk; d++) dot += qv[((q0 + i) * H + h) * Dqk + d] * K[(j * H + h) * Dqk + d];
                    s[j] = dot * scale;
                    if (s[j] > m) m = s[j];
                }
                for (int64_t j = 0; j < vis; j++) l += (s[j] = exp(s[j] - m));
                double *o = z->want + ((q0 + i) * H + h) * Dv;
                for (int64_t j = 0; j < vis; j++)
                    for (int64_t d = 0; d < Dv; d++) o[d] += s[j] / l * V[(j * H + h) * Dv + d];
            }
        free(s), free(K), free(V), free(lat);
        q0 += Q;
    }
    free(qv), free(kv), free(vv), free(wv), free(cv), free(cv2);
}

static void free_bufs(mbufs *z) {
    tu_free(&z->q), tu_free(&z->k), tu_free(&z->v), tu_free(&z->out), tu_free(&z->cu);
    tu_free(&z->pl), tu_free(&z->bt), tu_free(&z->cache), tu_free(&z->cache2), tu_free(&z->w);
    free(z->want);
}

static lk_mla_params params_of(const mcase *c, lk_mla_strategy st) {
    lk_mla_params p = lk_mla_params_default(scale_of(c));
    p.strategy = st;
    p.cache_layout = c->layout;
    p.k_scale = is_f8(c->ct) ? kscale(c) : 12345.0f; /* read only for fp8 caches */
    return p;
}

static lk_status call_p(const mcase *c, mbufs *z, const lk_mla_params *p) {
    return lk_mla_prefix_prefill(&z->out.t, &z->q.t, &z->k.t, &z->v.t, &z->cu.t, &z->pl.t, &z->bt.t, &z->cache.t,
                                 c->two ? &z->cache2.t : NULL, &z->w.t, p);
}

static lk_status call(const mcase *c, mbufs *z, lk_mla_strategy st) {
    lk_mla_params p = params_of(c, st);
    return call_p(c, z, &p);
}

static tu_tolerance mla_tol(lk_dtype ot) {
    tu_tolerance t = tu_tol(ot);
    if (ot == LK_F32) t.atol = t.rtol = 5e-5; /* f32 sums over 10^3 keys and latent dims */
    if (ot == LK_F16) t.atol = t.rtol = 3e-3;
    if (ot == LK_BF16) t.atol = t.rtol = 2e-2;
    return t;
}

/* the unused second cache of a one-buffer case is an empty tu_buf */
static void snap(tu_buf *b) {
    if (b->base) tu_snapshot(b);
}

static int intact(const tu_buf *b) { return !b->base || tu_intact(b); }

static void snapshot_all(mbufs *z) {
    snap(&z->q), snap(&z->k), snap(&z->v), snap(&z->out), snap(&z->cu);
    snap(&z->pl), snap(&z->bt), snap(&z->cache), snap(&z->cache2), snap(&z->w);
}

static int inputs_intact(const mbufs *z) {
    return intact(&z->q) && intact(&z->k) && intact(&z->v) && intact(&z->cu) && intact(&z->pl) &&
           intact(&z->bt) && intact(&z->cache) && intact(&z->cache2) && intact(&z->w);
}

/* padding rows (after the last request) exactly 0 */
static int padding_zero(const mcase *c, const mbufs *z, const double *got) {
    int64_t t0 = z->T - c->pad_tokens;
    for (int64_t i = t0 * c->H * c->Dv; i < z->T * c->H * c->Dv; i++)
        if (got[i] != 0.0) return 0;
    return 1;
}

/* every ISA x every strategy vs the float64 reference, and vs the ref ISA */
static void run_case(const mcase *c) {
    mbufs z;
    build(c, &z);
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    int64_t n = z.T * c->H * c->Dv;
    double *first[5] = {0};
    for (int ii = 0; ii < nisa; ii++) {
        if (isas[ii] == LK_ISA_REF && !c->ref_isa) continue;
        lk_set_isa(isas[ii]);
        for (int si = 0; si < 5; si++) {
            snapshot_all(&z);
            lk_status st = call(c, &z, STRATS[si]);
            double *got = tu_values(&z.out);
            double e = tu_err(got, z.want, n, mla_tol(c->ot));
            int ok_tr = si == 0 ? strstr(lk_mla_last_trace(), "(auto") != NULL
                                : strncmp(lk_mla_last_trace() + 9, lk_mla_strategy_name(STRATS[si]),
                                          strlen(lk_mla_strategy_name(STRATS[si]))) == 0;
            if (STRATS[si] == LK_MLA_ABSORBED && strstr(lk_mla_last_trace(), "latent_attn")) {
                /* the latent attention on bf16 operands exactly when lk_mla_lat_bf16 says */
                int lat16 = c->qt == LK_BF16 && (c->ct == LK_BF16 || is_f8(c->ct)) && c->ot == LK_BF16 &&
                            lk_mla_gemm_bf16();
                ok_tr &= strstr(lk_mla_last_trace(), lat16 ? "mqa bf16" : "mqa f32") != NULL;
            }
            int intact = inputs_intact(&z) && tu_outside_intact(&z.out);
            tu_check(st == LK_OK && e <= 1 && intact && padding_zero(c, &z, got) && ok_tr,
                     "mla %s %s %s: B=%d H=%lld D=%lld+%lld/%lld/%lld bs=%d %s%s %s/%s%s/%s/%s err=%.3g intact=%d %s",
                     lk_isa_name(isas[ii]), lk_mla_strategy_name(STRATS[si]), c->name, c->B, (long long)c->H,
                     (long long)c->Dn, (long long)c->Dr, (long long)c->Dv, (long long)c->Dl, c->bs,
                     c->layout == LK_KV_NZ ? "NZ" : "ND", c->two ? " two-buffer" : "", lk_dtype_name(c->qt),
                     lk_dtype_name(c->ct), c->rope16 ? "+bf16" : "", lk_dtype_name(c->wt), lk_dtype_name(c->ot), e,
                     intact,
                     st ? lk_last_error() : lk_mla_last_trace());
            if (!first[si]) {
                first[si] = got;
            } else {
                tu_tolerance t = mla_tol(c->ot);
                t.atol = t.rtol = c->ot == LK_F32 ? 2e-5 : c->ot == LK_F16 ? 1e-3 : 8e-3;
                tu_check(tu_err(got, first[si], n, t) <= 1, "mla %s vs ref %s %s", lk_isa_name(isas[ii]),
                         lk_mla_strategy_name(STRATS[si]), c->name);
                free(got);
            }
        }
    }
    for (int si = 0; si < 5; si++) free(first[si]);
    lk_set_isa(lk_isa_best());
    free_bufs(&z);
}

static mcase small_case(void) {
    mcase c;
    memset(&c, 0, sizeof c);
    c.B = 1, c.ql[0] = 5, c.pl[0] = 9;
    c.H = 2, c.Dn = 16, c.Dr = 16, c.Dv = 16, c.Dl = 32;
    c.bs = 7;
    c.qt = c.ct = c.wt = c.ot = LK_F32;
    c.ref_isa = 1;
    c.name = "small";
    return c;
}

static void set_batch(mcase *c, int B, const int64_t *ql, const int64_t *pl) {
    c->B = B;
    for (int b = 0; b < B; b++) c->ql[b] = ql[b], c->pl[b] = pl[b];
}

static void test_grid(void) {
    mcase c = small_case();
    c.ql[0] = 1, c.pl[0] = 0, c.name = "one token, no prefix";
    run_case(&c);
    c = small_case();
    c.name = "one request, partial page";
    run_case(&c);
    c = small_case();
    set_batch(&c, 4, (int64_t[]){5, 1, 33, 2}, (int64_t[]){0, 13, 40, 7});
    c.H = 4, c.pad_tokens = 3, c.layout = LK_KV_NZ, c.pad = 1, c.qt = c.ct = c.wt = c.ot = LK_BF16;
    c.name = "mixed prefixes, padding, NZ, strided, bf16";
    run_case(&c);
    c = small_case();
    set_batch(&c, 3, (int64_t[]){3, 0, 4}, (int64_t[]){6, 11, 1});
    c.bs = 1, c.H = 16, c.two = 1, c.qt = LK_F16, c.ct = LK_BF16, c.wt = LK_F32, c.ot = LK_F16;
    c.name = "page size 1, 16 heads, two buffers, empty request, mixed dtypes";
    run_case(&c);
    c = small_case();
    set_batch(&c, 3, (int64_t[]){257, 3, 64}, (int64_t[]){2048, 5, 0});
    c.bs = 128, c.H = 2, c.layout = LK_KV_NZ, c.two = 1, c.qt = LK_F16, c.ct = LK_F16, c.wt = LK_BF16, c.ot = LK_F32;
    c.ref_isa = 0;
    c.name = "q 257 over prefix 2048, NZ two buffers";
    run_case(&c);
    c = small_case();
    set_batch(&c, 2, (int64_t[]){3, 2}, (int64_t[]){5, 9});
    c.H = 128, c.qt = LK_BF16, c.ct = LK_F32, c.wt = LK_F16, c.ot = LK_BF16, c.pad_tokens = 1, c.qperm = 1;
    c.name = "128 heads (small), q permuted view";
    run_case(&c);
    c = small_case();
    set_batch(&c, 5, (int64_t[]){1, 129, 2, 17, 1}, (int64_t[]){129, 0, 127, 128, 1000});
    c.bs = 128, c.H = 4, c.pad = 1, c.qt = LK_F32, c.ct = LK_BF16, c.wt = LK_BF16, c.ot = LK_F32;
    c.ref_isa = 0;
    c.name = "page 128 boundaries, strided";
    run_case(&c);
    /* DeepSeek-V2-Lite dims (one rank of TP = 4, and a 16-head rank) */
    c = small_case();
    set_batch(&c, 3, (int64_t[]){1, 33, 70}, (int64_t[]){0, 130, 300});
    c.H = 4, c.Dn = 128, c.Dr = 64, c.Dv = 128, c.Dl = 512, c.bs = 128, c.layout = LK_KV_NZ;
    c.qt = c.ct = c.wt = c.ot = LK_BF16;
    c.name = "DeepSeek dims, 4 heads, NZ";
    run_case(&c);
    c = small_case();
    set_batch(&c, 1, (int64_t[]){20}, (int64_t[]){129});
    c.H = 16, c.Dn = 128, c.Dr = 64, c.Dv = 128, c.Dl = 512, c.bs = 128, c.two = 1, c.pad = 1;
    c.qt = LK_BF16, c.ct = LK_BF16, c.wt = LK_BF16, c.ot = LK_F16;
    c.ref_isa = 0;
    c.name = "DeepSeek dims, 16 heads, two buffers, strided";
    run_case(&c);
}

/* result of one call (best ISA) as doubles */
static double *result(const mcase *c, mbufs *z, const lk_mla_params *p, lk_status *st) {
    *st = call_p(c, z, p);
    return tu_values(&z->out);
}

static int same(const double *a, const double *b, int64_t n) {
    return !memcmp(a, b, sizeof(double) * (size_t)n);
}

/* NZ and ND caches holding the same logical values give the same bits */
static void test_nz_nd(void) {
    for (int k = 0; k < 6; k++) { /* bf16, fp8 e4m3, fp8 e5m2 (32-wide NZ tile) x one / two buffers */
        int two = k & 1;
        mcase c = small_case();
        set_batch(&c, 3, (int64_t[]){9, 1, 40}, (int64_t[]){23, 0, 70});
        c.bs = 16, c.H = 4, c.two = two, c.qt = c.ct = c.wt = c.ot = LK_BF16;
        if (k >= 2) c.ct = k < 4 ? LK_F8E4M3 : LK_F8E5M2, c.Dr = 32, c.ks = 0.3f;
        mbufs nd, nz;
        tu_seed(77);
        build(&c, &nd);
        c.layout = LK_KV_NZ;
        tu_seed(77);
        build(&c, &nz);
        int64_t n = nd.T * c.H * c.Dv;
        for (int si = 0; si < 5; si++) {
            lk_status s1, s2;
            lk_mla_params p = params_of(&c, STRATS[si]);
            p.cache_layout = LK_KV_ND;
            double *a = result(&c, &nd, &p, &s1);
            p.cache_layout = LK_KV_NZ;
            double *b = result(&c, &nz, &p, &s2);
            tu_check(s1 == LK_OK && s2 == LK_OK && same(a, b, n), "mla NZ == ND bitwise, %s, %s, %s",
                     lk_mla_strategy_name(STRATS[si]), two ? "two buffers" : "one buffer", lk_dtype_name(c.ct));
            free(a), free(b);
        }
        free_bufs(&nd), free_bufs(&nz);
    }
}

/* requests sharing leading pages: dedup on == off bit for bit, and fewer groups */
static void test_dedup(void) {
    for (int k = 0; k < 4; k++) { /* pages 7 and 128, bf16 and fp8 (e4m3 at 7, e5m2 at 128) caches */
        int bs = k & 1 ? 128 : 7;
        mcase c = small_case();
        set_batch(&c, 4, (int64_t[]){6, 11, 3, 20}, bs == 7 ? (int64_t[]){40, 30, 47, 12} : (int64_t[]){600, 520, 700, 260});
        c.bs = bs, c.share = 4, c.H = 4, c.qt = c.ct = c.wt = LK_BF16, c.ot = LK_F32;
        if (k >= 2) c.ct = bs == 7 ? LK_F8E4M3 : LK_F8E5M2, c.ks = 0.7f;
        mbufs z;
        build(&c, &z);
        int64_t n = z.T * c.H * c.Dv;
        for (int si = 1; si < 5; si++) { /* auto may choose differently: fewer rows to project */
            lk_status s1, s2;
            lk_mla_params p = params_of(&c, STRATS[si]);
            p.dedup = 0;
            double *a = result(&c, &z, &p, &s1);
            char tr_off[2048];
            strcpy(tr_off, lk_mla_last_trace());
            p.dedup = 1;
            double *b = result(&c, &z, &p, &s2);
            double e = tu_err(b, z.want, n, mla_tol(c.ot));
            /* "groups=U/L": with dedup U < L */
            long long u1 = 0, l1 = 0, u2 = 0, l2 = 0;
            const char *g1 = strstr(tr_off, "groups="), *g2 = strstr(lk_mla_last_trace(), "groups=");
            int parsed = g1 && g2 && sscanf(g1, "groups=%lld/%lld", &u1, &l1) == 2 &&
                         sscanf(g2, "groups=%lld/%lld", &u2, &l2) == 2;
            tu_check(s1 == LK_OK && s2 == LK_OK && same(a, b, n) && e <= 1 && parsed && u1 == l1 && u2 < l2,
                     "mla dedup == no dedup bitwise, %s, bs=%d %s (groups %lld/%lld vs %lld/%lld) err=%.3g",
                     lk_mla_strategy_name(STRATS[si]), bs, lk_dtype_name(c.ct), u1, l1, u2, l2, e);
            free(a), free(b);
        }
        free_bufs(&z);
    }
}

/* the batch in waves of one request each gives the same bits as one wave */
static void test_waves(void) {
    mcase c = small_case();
    set_batch(&c, 4, (int64_t[]){9, 5, 30, 6}, (int64_t[]){40, 0, 100, 13});
    c.H = 4, c.bs = 16, c.pad_tokens = 2, c.qt = c.ct = c.wt = LK_BF16, c.ot = LK_F32;
    mbufs z;
    build(&c, &z);
    int64_t n = z.T * c.H * c.Dv;
    for (int si = 1; si < 5; si++) {
        lk_status s1, s2;
        lk_mla_params p = params_of(&c, STRATS[si]);
        double *a = result(&c, &z, &p, &s1);
        lk_mla_set_wave_bytes(1);
        double *b = result(&c, &z, &p, &s2);
        lk_mla_set_wave_bytes(0);
        double e = tu_err(b, z.want, n, mla_tol(c.ot));
        tu_check(s1 == LK_OK && s2 == LK_OK && same(a, b, n) && e <= 1 && padding_zero(&c, &z, b) &&
                     strstr(lk_mla_last_trace(), "waves=4") != NULL,
                 "mla waves of one request == one wave, %s: %s", lk_mla_strategy_name(STRATS[si]), lk_mla_last_trace());
        free(a), free(b);
    }
    free_bufs(&z);
}

/* 1, 2, 3, 4 threads give the same bits */
static void test_threads(void) {
    mcase c = small_case();
    set_batch(&c, 3, (int64_t[]){100, 37, 300}, (int64_t[]){700, 256, 0});
    if (tu_emulated()) /* fewer rows, still several units and pages per request */
        set_batch(&c, 3, (int64_t[]){30, 7, 60}, (int64_t[]){200, 129, 0});
    c.H = 4, c.Dn = 128, c.Dr = 64, c.Dv = 128, c.Dl = 512, c.bs = 128, c.pad_tokens = 2;
    c.qt = c.ct = c.wt = c.ot = LK_BF16;
    mbufs z;
    build(&c, &z);
    int64_t n = z.T * c.H * c.Dv;
    int keep = lk_get_num_threads();
    for (int si = 1; si < 5; si++) {
        double *base = NULL;
        int ok = 1;
        for (int nt = 1; nt <= 4; nt++) {
            lk_set_num_threads(nt);
            lk_status st;
            lk_mla_params p = params_of(&c, STRATS[si]);
            double *got = result(&c, &z, &p, &st);
            ok &= st == LK_OK;
            if (!base) {
                base = got;
                ok &= tu_err(got, z.want, n, mla_tol(c.ot)) <= 1;
            } else {
                ok &= same(base, got, n);
                free(got);
            }
        }
        tu_check(ok, "mla threads 1..4 bitwise, %s", lk_mla_strategy_name(STRATS[si]));
        free(base);
    }
    lk_set_num_threads(keep);
    free_bufs(&z);
}

/* each forced strategy runs only its own ops; auto picks what lk_mla_choose says */
static void test_trace(void) {
    static const char *ops[5][4] = {
        {0},
        {"gather", "project", "flash_prefix", "merge"},
        {"gather", "project", "concat_copy", "flash_concat"},
        {"gather", "project", "fused_attn", 0},
        {"gather", "latent_attn", 0, 0},
    };
    static const char *all_ops[] = {"flash_prefix", "concat_copy", "flash_concat", "fused_attn", "latent_attn",
                                    "merge", "project", "gather", "flash_current"};
    mcase c = small_case();
    set_batch(&c, 2, (int64_t[]){4, 9}, (int64_t[]){20, 0});
    mbufs z;
    build(&c, &z);
    for (int si = 1; si < 5; si++) {
        call(&c, &z, STRATS[si]);
        const char *tr = lk_mla_last_trace();
        int ok = 1;
        for (size_t o = 0; o < sizeof all_ops / sizeof *all_ops; o++) {
            int mine = 0;
            for (int k = 0; k < 4; k++) mine |= ops[si][k] && !strcmp(ops[si][k], all_ops[o]);
            if (!strcmp(all_ops[o], "flash_current")) mine = STRATS[si] == LK_MLA_SPLIT_MERGE;
            if (!strcmp(all_ops[o], "gather")) mine = 1; /* every strategy reads the prefix */
            if (mine != (strstr(tr, all_ops[o]) != NULL)) ok = 0;
        }
        tu_check(ok, "mla trace %s runs only its own ops: %s", lk_mla_strategy_name(STRATS[si]), tr);
    }
    free_bufs(&z);
    /* auto: the trace's choice is lk_mla_choose's on the same shape, and the rule's
     * extremes: few new tokens over a long prefix -> absorbed; long queries -> projected */
    struct {
        int B;
        int64_t ql, pl, H;
        int want; /* 0: any; else the strategy expected */
    } shapes[] = {{1, 1, 2048, 4, LK_MLA_ABSORBED}, {2, 4, 1024, 4, LK_MLA_ABSORBED},
                  {1, 1024, 1024, 4, -1},           {3, 300, 900, 4, -1},
                  {4, 100, 768, 4, 0},              {1, 256, 0, 4, 0}};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        mcase d = small_case();
        d.B = shapes[i].B;
        for (int b = 0; b < d.B; b++) d.ql[b] = shapes[i].ql, d.pl[b] = shapes[i].pl;
        d.H = shapes[i].H, d.Dn = 128, d.Dr = 64, d.Dv = 128, d.Dl = 512, d.bs = 128, d.ref_isa = 0;
        d.qt = d.ct = d.wt = d.ot = LK_BF16;
        d.no_ref = 1;
        mbufs y;
        build(&d, &y);
        lk_status st = call(&d, &y, LK_MLA_AUTO);
        const char *tr = lk_mla_last_trace();
        long long pages = -1;
        const char *pg = strstr(tr, "pages=");
        if (pg) sscanf(pg, "pages=%lld", &pages);
        int32_t ql[MAXB], pl[MAXB];
        for (int b = 0; b < d.B; b++) ql[b] = (int32_t)d.ql[b], pl[b] = (int32_t)d.pl[b];
        lk_mla_shape sh = {d.B, d.H, d.Dn, d.Dr, d.Dv, d.Dl, d.bs, ql, pl, pages * d.bs, lk_mla_gemm_bf16(),
                           lk_mla_gemm_bf16(), 2 * (lk_isa_current() == LK_ISA_AVX512BF16), 0};
        double cost[5];
        lk_mla_strategy want = lk_mla_choose(&sh, cost);
        char expect[64];
        snprintf(expect, sizeof expect, "strategy=%s (auto", lk_mla_strategy_name(want));
        int rule_ok = shapes[i].want == 0 || (shapes[i].want > 0 ? (int)want == shapes[i].want : want != LK_MLA_ABSORBED);
        tu_check(st == LK_OK && strstr(tr, expect) == tr && rule_ok,
                 "mla auto B=%d q=%lld p=%lld H=%lld picks %s: %s", d.B, (long long)d.ql[0], (long long)d.pl[0],
                 (long long)d.H, lk_mla_strategy_name(want), tr);
        free_bufs(&y);
        /* an fp8 cache: the model with its gather term (common to every strategy) picks the same */
        d.ct = LK_F8E4M3, d.ks = 0.5f;
        build(&d, &y);
        st = call(&d, &y, LK_MLA_AUTO);
        tr = lk_mla_last_trace();
        sh.f8_dims = d.Dl + d.Dr;
        lk_mla_strategy want8 = lk_mla_choose(&sh, cost);
        tu_check(st == LK_OK && strstr(tr, expect) == tr && want8 == want,
                 "mla auto over an fp8 cache B=%d q=%lld p=%lld picks %s as over bf16: %s", d.B, (long long)d.ql[0],
                 (long long)d.pl[0], lk_mla_strategy_name(want8), tr);
        free_bufs(&y);
    }
}

/* T = 0 (nothing written), B = 0 with padding rows (all zero), requests without tokens */
static void test_empty(void) {
    mcase c = small_case();
    c.B = 0, c.pad_tokens = 0;
    mbufs z;
    build(&c, &z);
    snapshot_all(&z);
    tu_check(call(&c, &z, LK_MLA_AUTO) == LK_OK && tu_intact(&z.out) && inputs_intact(&z), "mla T = 0 is a no-op");
    free_bufs(&z);
    c.pad_tokens = 3;
    build(&c, &z);
    for (int si = 0; si < 5; si++) {
        snapshot_all(&z);
        lk_status st = call(&c, &z, STRATS[si]);
        double *got = tu_values(&z.out);
        tu_check(st == LK_OK && padding_zero(&c, &z, got) && tu_outside_intact(&z.out) && inputs_intact(&z),
                 "mla B = 0 with 3 padding rows -> zeros (%s)", lk_mla_strategy_name(STRATS[si]));
        free(got);
    }
    free_bufs(&z);
    c = small_case();
    set_batch(&c, 2, (int64_t[]){0, 0}, (int64_t[]){9, 3});
    c.pad_tokens = 2;
    build(&c, &z);
    for (int si = 0; si < 5; si++) {
        lk_status st = call(&c, &z, STRATS[si]);
        double *got = tu_values(&z.out);
        tu_check(st == LK_OK && padding_zero(&c, &z, got), "mla requests without new tokens (%s)",
                 lk_mla_strategy_name(STRATS[si]));
        free(got);
    }
    free_bufs(&z);
}

static void test_bad_inputs(void) {
    mcase c = small_case();
    set_batch(&c, 2, (int64_t[]){3, 4}, (int64_t[]){20, 5});
    c.bs = 4, c.H = 2;
    mbufs z;
    build(&c, &z);
    lk_mla_params p = params_of(&c, LK_MLA_AUTO);
    struct {
        const char *what, *arg;
        lk_status want;
    } r;
    call(&c, &z, LK_MLA_AUTO); /* a trace to be cleared by the failures */
#define EXPECT(W, A, S, CALL)                                                                              \
    do {                                                                                                   \
        r.what = W, r.arg = A, r.want = S;                                                                 \
        snapshot_all(&z);                                                                                  \
        lk_status st_ = CALL;                                                                              \
        tu_check(st_ == r.want && strstr(lk_last_error(), r.arg) && tu_intact(&z.out) && inputs_intact(&z) && \
                     lk_mla_last_trace()[0] == 0,                                                          \
                 "mla bad input '%s' -> %s (%s)", r.what, lk_status_str(st_), lk_last_error());            \
    } while (0)
#define MLA(...) lk_mla_prefix_prefill(__VA_ARGS__)
#define GOOD &z.out.t, &z.q.t, &z.k.t, &z.v.t, &z.cu.t, &z.pl.t, &z.bt.t, &z.cache.t, NULL, &z.w.t
    EXPECT("params NULL", "params", LK_ERR_NULL, MLA(GOOD, NULL));
    EXPECT("out NULL", "out", LK_ERR_NULL, MLA(NULL, &z.q.t, &z.k.t, &z.v.t, &z.cu.t, &z.pl.t, &z.bt.t, &z.cache.t, NULL, &z.w.t, &p));
    EXPECT("kv_b_proj NULL", "kv_b_proj", LK_ERR_NULL, MLA(&z.out.t, &z.q.t, &z.k.t, &z.v.t, &z.cu.t, &z.pl.t, &z.bt.t, &z.cache.t, NULL, NULL, &p));
    lk_mla_params pb = p;
    pb.scale = NAN;
    EXPECT("scale NaN", "scale", LK_ERR_VALUE, MLA(GOOD, &pb));
    pb = p;
    pb.strategy = (lk_mla_strategy)9;
    EXPECT("unknown strategy", "strategy", LK_ERR_VALUE, MLA(GOOD, &pb));
    pb = p;
    pb.cache_layout = (lk_kv_layout)5;
    EXPECT("unknown layout", "cache_layout", LK_ERR_VALUE, MLA(GOOD, &pb));
    lk_tensor t = z.q.t;
    t.ndim = 2;
    EXPECT("q rank 2", "q", LK_ERR_RANK, MLA(&z.out.t, &t, &z.k.t, &z.v.t, &z.cu.t, &z.pl.t, &z.bt.t, &z.cache.t, NULL, &z.w.t, &p));
    t = z.q.t;
    t.dtype = LK_I32;
    EXPECT("q int32", "q", LK_ERR_DTYPE, MLA(&z.out.t, &t, &z.k.t, &z.v.t, &z.cu.t, &z.pl.t, &z.bt.t, &z.cache.t, NULL, &z.w.t, &p));
    t = z.q.t;
    t.data = NULL;
    EXPECT("q data NULL", "q", LK_ERR_NULL, MLA(&z.out.t, &t, &z.k.t, &z.v.t, &z.cu.t, &z.pl.t, &z.bt.t, &z.cache.t, NULL, &z.w.t, &p));
    t = z.q.t;
    t.stride[0] = INT64_MAX / 4;
    EXPECT("q stride overflow", "q", LK_ERR_OVERFLOW, MLA(&z.out.t, &t, &z.k.t, &z.v.t, &z.cu.t, &z.pl.t, &z.bt.t, &z.cache.t, NULL, &z.w.t, &p));
    t = z.k.t;
    t.shape[2] -= 1;
    EXPECT("k head dim mismatch", "k", LK_ERR_SHAPE, MLA(&z.out.t, &z.q.t, &t, &z.v.t, &z.cu.t, &z.pl.t, &z.bt.t, &z.cache.t, NULL, &z.w.t, &p));
    t = z.v.t;
    t.shape[0] -= 1;
    EXPECT("v tokens mismatch", "v", LK_ERR_SHAPE, MLA(&z.out.t, &z.q.t, &z.k.t, &t, &z.cu.t, &z.pl.t, &z.bt.t, &z.cache.t, NULL, &z.w.t, &p));
    t = z.out.t;
    t.shape[2] -= 1;
    EXPECT("out dim mismatch", "out", LK_ERR_SHAPE, MLA(&t, &z.q.t, &z.k.t, &z.v.t, &z.cu.t, &z.pl.t, &z.bt.t, &z.cache.t, NULL, &z.w.t, &p));
    t = z.w.t;
    t.shape[0] -= 1;
    EXPECT("kv_b_proj rows not H x (Dn + Dv)", "kv_b_proj", LK_ERR_SHAPE, MLA(&z.out.t, &z.q.t, &z.k.t, &z.v.t, &z.cu.t, &z.pl.t, &z.bt.t, &z.cache.t, NULL, &t, &p));
    t = z.w.t;
    t.shape[1] -= 1; /* latent dim no longer matches the cache entry */
    EXPECT("kv_b_proj latent dim vs cache", "kv_c_cache", LK_ERR_SHAPE, MLA(&z.out.t, &z.q.t, &z.k.t, &z.v.t, &z.cu.t, &z.pl.t, &z.bt.t, &z.cache.t, NULL, &t, &p));
    lk_tensor qs = z.q.t, ks = z.k.t; /* head dim = Dn: no rope dims */
    qs.shape[2] = ks.shape[2] = c.Dn;
    EXPECT("no rope dims", "q", LK_ERR_SHAPE, MLA(&z.out.t, &qs, &ks, &z.v.t, &z.cu.t, &z.pl.t, &z.bt.t, &z.cache.t, NULL, &z.w.t, &p));
    t = z.cu.t;
    t.dtype = LK_F32;
    EXPECT("cu_seqlens_q float", "cu_seqlens_q", LK_ERR_DTYPE, MLA(&z.out.t, &z.q.t, &z.k.t, &z.v.t, &t, &z.pl.t, &z.bt.t, &z.cache.t, NULL, &z.w.t, &p));
    t = z.pl.t;
    t.shape[0] = 1;
    EXPECT("prefix_lens length", "prefix_lens", LK_ERR_SHAPE, MLA(&z.out.t, &z.q.t, &z.k.t, &z.v.t, &z.cu.t, &t, &z.bt.t, &z.cache.t, NULL, &z.w.t, &p));
    t = z.bt.t;
    t.shape[0] = 1;
    EXPECT("block_table rows", "block_table", LK_ERR_SHAPE, MLA(&z.out.t, &z.q.t, &z.k.t, &z.v.t, &z.cu.t, &z.pl.t, &t, &z.cache.t, NULL, &z.w.t, &p));
    int32_t *cu = z.cu.t.data, *pl = z.pl.t.data, *bt = z.bt.t.data;
    int32_t keep = cu[1];
    cu[1] = 9;
    EXPECT("cu_seqlens_q decreasing", "cu_seqlens_q", LK_ERR_INDEX, MLA(GOOD, &p));
    cu[1] = keep;
    keep = cu[2];
    cu[2] = 100;
    EXPECT("cu_seqlens_q beyond q", "cu_seqlens_q", LK_ERR_INDEX, MLA(GOOD, &p));
    cu[2] = keep;
    keep = pl[1];
    pl[1] = -1;
    EXPECT("prefix_lens negative", "prefix_lens", LK_ERR_INDEX, MLA(GOOD, &p));
    pl[1] = (int32_t)(z.maxp * c.bs + 1);
    EXPECT("prefix_lens beyond the table", "prefix_lens", LK_ERR_INDEX, MLA(GOOD, &p));
    pl[1] = keep;
    keep = bt[0];
    bt[0] = (int32_t)z.nb;
    EXPECT("block_table entry out of range", "block_table", LK_ERR_INDEX, MLA(GOOD, &p));
    bt[0] = -1;
    EXPECT("block_table entry negative", "block_table", LK_ERR_INDEX, MLA(GOOD, &p));
    bt[0] = keep;
    t = z.cache.t;
    t.shape[2] += 1;
    EXPECT("cache entry size", "kv_c_cache", LK_ERR_SHAPE,
           MLA(&z.out.t, &z.q.t, &z.k.t, &z.v.t, &z.cu.t, &z.pl.t, &z.bt.t, &t, NULL, &z.w.t, &p));
    pb = p;
    pb.cache_layout = LK_KV_NZ;
    EXPECT("ND cache passed as NZ", "kv_c_cache", LK_ERR_RANK, MLA(GOOD, &pb));
    lk_tensor lat = z.cache.t, pe = z.cache.t; /* two views of the one buffer */
    lat.shape[2] = c.Dl, pe.shape[2] = c.Dr, pe.shape[0] -= 1;
    pe.data = (char *)pe.data + lk_dtype_size(pe.dtype) * (size_t)c.Dl;
    EXPECT("two caches, block counts differ", "k_pe_cache", LK_ERR_SHAPE,
           MLA(&z.out.t, &z.q.t, &z.k.t, &z.v.t, &z.cu.t, &z.pl.t, &z.bt.t, &lat, &pe, &z.w.t, &p));
    EXPECT("out aliases v", "out", LK_ERR_ALIAS,
           MLA(&z.v.t, &z.q.t, &z.k.t, &z.v.t, &z.cu.t, &z.pl.t, &z.bt.t, &z.cache.t, NULL, &z.w.t, &p));
    t = z.out.t;
    t.stride[0] = 0;
    EXPECT("out overlaps itself", "out", LK_ERR_ALIAS,
           MLA(&t, &z.q.t, &z.k.t, &z.v.t, &z.cu.t, &z.pl.t, &z.bt.t, &z.cache.t, NULL, &z.w.t, &p));
    lk_tensor oc = z.out.t; /* out laid over the cache */
    oc.data = z.cache.t.data, oc.dtype = z.cache.t.dtype;
    EXPECT("out overlaps the cache", "kv_c_cache", LK_ERR_ALIAS,
           MLA(&oc, &z.q.t, &z.k.t, &z.v.t, &z.cu.t, &z.pl.t, &z.bt.t, &z.cache.t, NULL, &z.w.t, &p));
#undef GOOD
#undef MLA
#undef EXPECT
    free_bufs(&z);
}

/* ---------------------------------------------------------------- fp8 latent caches */

/* fp8 caches (e4m3 / e5m2, stored as fp8(x / k_scale) by the scalar converter) against
 * the float64 reference of the dequantized entries f32(code) * k_scale, every strategy
 * and ISA: page sizes 1, 7, 16, 128, ND and NZ (32-wide tile), one and two buffers (also
 * an fp8 latent part with a bf16 rope part), empty prefixes and requests, padding rows,
 * strided views with garbage, the bf16 and f32 GEMM paths */
static void test_fp8_grid(void) {
    mcase c = small_case();
    c.ct = LK_F8E4M3, c.ks = 0.37f;
    c.name = "fp8 e4m3, k_scale 0.37, page 7, f32";
    run_case(&c);
    c = small_case();
    set_batch(&c, 3, (int64_t[]){3, 0, 4}, (int64_t[]){6, 11, 1});
    c.bs = 1, c.H = 16, c.two = 1, c.qt = LK_F16, c.ct = LK_F8E5M2, c.wt = LK_F32, c.ot = LK_F16, c.ks = 1.0f / 64;
    c.name = "fp8 e5m2, k_scale 1/64, page 1, two buffers, empty request";
    run_case(&c);
    c = small_case();
    set_batch(&c, 4, (int64_t[]){5, 1, 33, 2}, (int64_t[]){0, 13, 40, 7});
    c.Dr = 32, c.H = 4, c.bs = 16, c.pad_tokens = 3, c.layout = LK_KV_NZ, c.pad = 1;
    c.qt = c.wt = c.ot = LK_BF16, c.ct = LK_F8E4M3, c.ks = 0.05f;
    c.name = "fp8 e4m3 NZ 32-wide tile, page 16, strided, padding, bf16";
    run_case(&c);
    c = small_case();
    set_batch(&c, 3, (int64_t[]){4, 9, 1}, (int64_t[]){0, 0, 0});
    c.ct = LK_F8E5M2, c.ks = 2.5f, c.qt = c.wt = c.ot = LK_BF16, c.pad_tokens = 1;
    c.name = "fp8 e5m2, every prefix empty";
    run_case(&c);
    c = small_case();
    set_batch(&c, 3, (int64_t[]){3, 5, 2}, (int64_t[]){20, 0, 9});
    c.two = 1, c.rope16 = 1, c.ct = LK_F8E4M3, c.ks = 0.2f, c.qt = c.wt = c.ot = LK_BF16, c.pad = 1;
    c.name = "fp8 e4m3 latent part with a bf16 rope part, strided";
    run_case(&c);
    /* DeepSeek-V2-Lite dims */
    c = small_case();
    set_batch(&c, 3, (int64_t[]){1, 33, 70}, (int64_t[]){0, 130, 300});
    c.H = 4, c.Dn = 128, c.Dr = 64, c.Dv = 128, c.Dl = 512, c.bs = 128, c.layout = LK_KV_NZ;
    c.qt = c.wt = c.ot = LK_BF16, c.ct = LK_F8E4M3, c.ks = 0.013f;
    c.ref_isa = 0;
    c.name = "fp8 e4m3 DeepSeek dims, 4 heads, NZ, page 128";
    run_case(&c);
    if (tu_emulated()) return; /* under qemu: the 4-head DeepSeek case above is enough */
    c = small_case();
    set_batch(&c, 2, (int64_t[]){20, 3}, (int64_t[]){129, 257});
    c.H = 16, c.Dn = 128, c.Dr = 64, c.Dv = 128, c.Dl = 512, c.bs = 128, c.two = 1, c.layout = LK_KV_NZ;
    c.qt = c.wt = LK_BF16, c.ct = LK_F8E5M2, c.ot = LK_F32, c.ks = 0.004f;
    c.ref_isa = 0;
    c.name = "fp8 e5m2 DeepSeek dims, 16 heads, NZ two buffers, page 128, f32 out";
    run_case(&c);
}

/* a copy of an fp8 cache buffer as a bf16 one holding its dequantized values (exact for
 * a power-of-two k_scale), ND only (same logical indices) */
static tu_buf dequant_bf16(const mcase *c, const tu_buf *b, int64_t nb, int64_t D) {
    tu_buf d = alloc_cache(c, LK_BF16, nb, D);
    for (int64_t i = 0; i < tu_numel(b); i++) tu_set(&d, i, tu_get(b, i) * (double)kscale(c));
    return d;
}

/* fp8 with a power-of-two k_scale == a bf16 cache of the dequantized values, bit for bit,
 * every strategy (the codes are widened exactly and the scale is exact), for both
 * formats, one and two buffers, the bf16 and f32 GEMM paths */
static void test_fp8_equiv(void) {
    for (int k = 0; k < 4; k++) {
        mcase c = small_case();
        set_batch(&c, 3, (int64_t[]){9, 1, 40}, (int64_t[]){23, 0, 70});
        c.bs = 16, c.H = 4, c.two = k & 1, c.ct = k & 2 ? LK_F8E5M2 : LK_F8E4M3, c.ks = k & 2 ? 0.25f : 1.0f / 64;
        c.qt = c.wt = c.ot = k < 2 ? LK_BF16 : LK_F32;
        mbufs z;
        build(&c, &z);
        int64_t n = z.T * c.H * c.Dv;
        tu_buf b1 = dequant_bf16(&c, &z.cache, z.nb, c.two ? c.Dl : c.Dl + c.Dr), b2 = {0};
        if (c.two) b2 = dequant_bf16(&c, &z.cache2, z.nb, c.Dr);
        for (int si = 0; si < 5; si++) {
            lk_status s1, s2;
            lk_mla_params p = params_of(&c, STRATS[si]);
            double *a = result(&c, &z, &p, &s1);
            double e = tu_err(a, z.want, n, mla_tol(c.ot));
            s2 = lk_mla_prefix_prefill(&z.out.t, &z.q.t, &z.k.t, &z.v.t, &z.cu.t, &z.pl.t, &z.bt.t, &b1.t,
                                       c.two ? &b2.t : NULL, &z.w.t, &p);
            double *b = tu_values(&z.out);
            tu_check(s1 == LK_OK && s2 == LK_OK && same(a, b, n) && e <= 1,
                     "mla fp8 %s k_scale %g == bf16 cache of the dequantized values bitwise, %s, %s, %s err=%.3g",
                     lk_dtype_name(c.ct), (double)c.ks, lk_mla_strategy_name(STRATS[si]),
                     c.two ? "two buffers" : "one buffer", lk_dtype_name(c.qt), e);
            free(a), free(b);
        }
        tu_free(&b1), tu_free(&b2);
        free_bufs(&z);
    }
}

/* bad k_scale with an fp8 cache: LK_ERR_VALUE naming params.k_scale, nothing written;
 * ignored with 16/32-bit caches; fp8 where no fp8 is taken; the NZ tile of 1-byte caches */
static void test_fp8_bad(void) {
    mcase c = small_case();
    set_batch(&c, 2, (int64_t[]){3, 4}, (int64_t[]){20, 5});
    c.bs = 4, c.Dr = 32, c.ct = LK_F8E4M3, c.ks = 0.5f;
    mbufs z;
    build(&c, &z);
    static const float bad[] = {0.0f, -1.0f, -0.0f, NAN, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        for (int si = 0; si < 5; si++) {
            lk_mla_params p = params_of(&c, STRATS[si]);
            p.k_scale = bad[i];
            snapshot_all(&z);
            lk_status st = call_p(&c, &z, &p);
            tu_check(st == LK_ERR_VALUE && strstr(lk_last_error(), "params.k_scale") && tu_intact(&z.out) &&
                         inputs_intact(&z) && lk_mla_last_trace()[0] == 0,
                     "mla fp8 k_scale %g -> LK_ERR_VALUE naming params.k_scale (%s: %s)", (double)bad[i],
                     lk_status_str(st), lk_last_error());
        }
    /* fp8 q / k / v / out / kv_b_proj are not taken */
    const char *names[5] = {"q", "k", "v", "out", "kv_b_proj"};
    for (int i = 0; i < 5; i++) {
        lk_tensor t[5] = {z.q.t, z.k.t, z.v.t, z.out.t, z.w.t};
        t[i].dtype = LK_F8E5M2;
        lk_mla_params p = params_of(&c, LK_MLA_AUTO);
        snapshot_all(&z);
        lk_status st = lk_mla_prefix_prefill(&t[3], &t[0], &t[1], &t[2], &z.cu.t, &z.pl.t, &z.bt.t, &z.cache.t, NULL,
                                             &t[4], &p);
        tu_check(st == LK_ERR_DTYPE && strstr(lk_last_error(), names[i]) && tu_intact(&z.out) && inputs_intact(&z),
                 "mla fp8 %s -> LK_ERR_DTYPE (%s)", names[i], lk_last_error());
    }
    free_bufs(&z);
    /* a 1-byte NZ cache in 16-wide tiles (the 2-byte form) is not an fp8 NZ cache */
    c.layout = LK_KV_NZ;
    build(&c, &z);
    int64_t E = c.Dl + c.Dr;
    tu_buf t16 = tu_alloc(LK_F8E4M3, 4, (int64_t[]){z.nb, E / 16, c.bs, 16}, 0);
    lk_mla_params p = params_of(&c, LK_MLA_AUTO);
    snapshot_all(&z);
    lk_status st = lk_mla_prefix_prefill(&z.out.t, &z.q.t, &z.k.t, &z.v.t, &z.cu.t, &z.pl.t, &z.bt.t, &t16.t, NULL,
                                         &z.w.t, &p);
    tu_check(st == LK_ERR_SHAPE && strstr(lk_last_error(), "kv_c_cache") && tu_intact(&z.out),
             "mla fp8 NZ cache in 16-wide tiles -> LK_ERR_SHAPE (%s)", lk_last_error());
    tu_free(&t16);
    free_bufs(&z);
    /* k_scale is not read for a bf16 cache (any value, as vLLM's "auto") */
    c = small_case();
    c.ct = LK_BF16;
    build(&c, &z);
    p = params_of(&c, LK_MLA_AUTO);
    p.k_scale = NAN;
    st = call_p(&c, &z, &p);
    double *got = tu_values(&z.out);
    tu_check(st == LK_OK && tu_err(got, z.want, z.T * c.H * c.Dv, mla_tol(c.ot)) <= 1,
             "mla k_scale NaN ignored with a bf16 cache (%s)", st ? lk_last_error() : "ok");
    free(got);
    free_bufs(&z);
}

/* Bugs found by fuzzing (fuzz/fuzz_mla_prefill.c), each with the input shape that hit it */
static void test_fuzz_regressions(void) {
    /* 1. an empty cache of block_size 0 (valid with num_blocks 0): ceil(P / block_size)
     *    divided by zero in the validation (SIGFPE) */
    mcase c = small_case();
    set_batch(&c, 2, (int64_t[]){3, 2}, (int64_t[]){0, 0});
    mbufs z;
    build(&c, &z);
    lk_tensor empty = z.cache.t;
    empty.shape[0] = 0, empty.shape[1] = 0;
    int64_t n = z.T * c.H * c.Dv;
    for (int si = 0; si < 5; si++) {
        lk_mla_params p = params_of(&c, STRATS[si]);
        lk_status st = lk_mla_prefix_prefill(&z.out.t, &z.q.t, &z.k.t, &z.v.t, &z.cu.t, &z.pl.t, &z.bt.t, &empty, NULL,
                                             &z.w.t, &p);
        double *got = tu_values(&z.out);
        double e = tu_err(got, z.want, n, mla_tol(c.ot));
        tu_check(st == LK_OK && e <= 1, "mla fuzz regression: cache [0, 0, E] with empty prefixes, %s (%s) err=%.3g",
                 lk_mla_strategy_name(STRATS[si]), st ? lk_last_error() : "ok", e);
        free(got);
    }
    ((int32_t *)z.pl.t.data)[1] = 1;
    snapshot_all(&z);
    lk_mla_params p0 = params_of(&c, LK_MLA_AUTO);
    lk_status st = lk_mla_prefix_prefill(&z.out.t, &z.q.t, &z.k.t, &z.v.t, &z.cu.t, &z.pl.t, &z.bt.t, &empty, NULL,
                                         &z.w.t, &p0);
    tu_check(st == LK_ERR_INDEX && tu_intact(&z.out) && inputs_intact(&z),
             "mla fuzz regression: cache [0, 0, E] with a prefix -> LK_ERR_INDEX (%s: %s)", lk_status_str(st),
             lk_last_error());
    free_bufs(&z);

    /* 2. absorbed: the segment array followed float arrays of odd total length in the
     *    unit scratch (misaligned lk_mla_segment, UBSan) */
    c = small_case();
    set_batch(&c, 1, (int64_t[]){3}, (int64_t[]){10});
    c.H = 3, c.Dn = 7, c.Dr = 8, c.Dv = 5, c.Dl = 6, c.bs = 2;
    c.name = "fuzz regression: odd scratch lengths (H 3, Dl 6, Dr 8, Dv 5)";
    run_case(&c);

    /* 3. absorbed: the current tokens' q rows [tok, Dn + Dr] were loaded into the latent
     *    query area [H tok, Dl + Dr], smaller when H (Dl + Dr) < Dn + Dr: the overflow
     *    clobbered the rows' online-softmax states */
    c = small_case();
    set_batch(&c, 2, (int64_t[]){4, 3}, (int64_t[]){11, 5});
    c.H = 1, c.Dn = 16, c.Dr = 4, c.Dv = 8, c.Dl = 2, c.bs = 2;
    c.name = "fuzz regression: latent dim below the nope dim (H 1, Dl 2, Dn 16)";
    run_case(&c);

    /* 4. a huge stride on a size-1 head dim of k / v (valid: never multiplied by an
     *    index > 0) overflowed the causal attention's byte steps (UBSan; its decode
     *    path of the current tokens, every request <= 4 of them) */
    c = small_case();
    set_batch(&c, 2, (int64_t[]){2, 3}, (int64_t[]){3, 9});
    c.H = 1;
    build(&c, &z);
    z.k.t.stride[1] = (int64_t)1 << 61, z.v.t.stride[1] = (int64_t)1 << 61;
    n = z.T * c.H * c.Dv;
    for (int si = 0; si < 5; si++) {
        lk_status s2 = call(&c, &z, STRATS[si]);
        double *got = tu_values(&z.out);
        double e = tu_err(got, z.want, n, mla_tol(c.ot));
        tu_check(s2 == LK_OK && e <= 1, "mla fuzz regression: k / v head stride 2^61 with one head, %s (%s) err=%.3g",
                 lk_mla_strategy_name(STRATS[si]), s2 ? lk_last_error() : "ok", e);
        free(got);
    }
    free_bufs(&z);

    /* 5. a wave of requests without tokens starting at row T (cu_seqlens_q = [1, 1], one
     *    padding row first): its row views were made before the empty wave was skipped,
     *    base T times the (unbounded, size-1) token stride overflowed (UBSan) */
    c = small_case();
    set_batch(&c, 1, (int64_t[]){0}, (int64_t[]){9});
    c.pad_tokens = 1;
    build(&c, &z);
    tu_set(&z.cu, 0, 1), tu_set(&z.cu, 1, 1);
    z.q.t.stride[0] = z.k.t.stride[0] = z.v.t.stride[0] = z.out.t.stride[0] = -INT64_MAX;
    for (int si = 0; si < 5; si++) {
        snapshot_all(&z);
        lk_status s2 = call(&c, &z, STRATS[si]);
        double *got = tu_values(&z.out);
        tu_check(s2 == LK_OK && padding_zero(&c, &z, got) && inputs_intact(&z),
                 "mla fuzz regression: one padding row first, token stride -INT64_MAX, %s (%s)",
                 lk_mla_strategy_name(STRATS[si]), s2 ? lk_last_error() : "ok");
        free(got);
    }
    free_bufs(&z);
}

int main(void) {
    tu_init();
    test_grid();
    test_nz_nd();
    test_dedup();
    test_threads();
    test_waves();
    test_trace();
    test_empty();
    test_bad_inputs();
    test_fuzz_regressions();
    test_fp8_grid();
    test_fp8_equiv();
    test_fp8_bad();
    return tu_finish("test_mla_prefill");
}
