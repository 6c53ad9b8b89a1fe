/*
 * mla_decode: every ISA against a float64 computation of the formula (per request, row
 * and head: scores over the visible cache entries, softmax, P . e[:Dl], lse) from the
 * test's own copy of the logical entries and the layout formulas of include/llmkern.h,
 * and against ref. DeepSeek dims (512 + 64) on page sizes 1, 16, 64, 128 and odd dims;
 * one and two cache buffers, ND (3-D, 4-D) and NZ, NZ == ND bit for bit; cache_seqlens
 * 0, 1, partial pages, page multiples; s_q 1..4 with and without causal; H 1..128;
 * f32 / f16 / bf16 and mixed; strided q, out and cache with garbage padding, lse as a
 * permuted view; every unused cache slot and block_table entry poisoned (NaN, -1);
 * split-KV forced and planned (results within tolerance of one chunk, bitwise for
 * 1-4 threads); lk_mla_decode_plan; the end-to-end path (concat_and_cache_mla ->
 * mla_prefix_prefill over a cached prefix -> decode one token at a time and s_q = 2
 * causal) against dense float64 attention in latent space; the bad-input catalogue.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/half.h"
#include "testutil.h"

typedef struct {
    int B;
    int64_t len[8];
    int64_t s_q, H, Dl, Dr;
    int causal;
    int64_t bs;
    lk_kv_layout layout;
    int two;            /* two cache buffers */
    int nd4;            /* ND one buffer as [nb, bs, 1, E] */
    lk_dtype qt, ct, rt, ot; /* q, latent cache, rope cache (two buffers), out */
    int pad;            /* strided views */
    int lse_perm;       /* lse stored [B, s_q, H] (a permuted view) */
    int no_lse;
    int64_t split;      /* params.split_keys */
    float ks;           /* params.k_scale (0: 1); fp8 caches store fp8(x / ks) */
    const char *name;
} dcase;

typedef struct {
    tu_buf q, out, lse, kv, pe, bt, sl;
    double *E;          /* [B][maxlen][Dl + Dr] logical entries (as stored) */
    double *want, *want_lse; /* [B][s_q][H][Dl], [B][H][s_q] */
    int64_t maxlen, maxp, nb;
    float scale;
} dbufs;

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static int is_fp8(lk_dtype dt) { return dt == LK_F8E4M3 || dt == LK_F8E5M2; }
/* NZ tile: 32 for the 1-byte fp8 caches, else 16 */
static int64_t tile_of(lk_dtype dt) { return is_fp8(dt) ? 32 : 16; }

/* flat logical index of entry dim e (of D) at (page, slot) in a cache buffer of dtype dt */
static int64_t cidx(const dcase *c, int64_t page, int64_t slot, int64_t e, int64_t D, lk_dtype dt) {
    int64_t T = tile_of(dt);
    if (c->layout == LK_KV_NZ) return ((page * (D / T) + e / T) * c->bs + slot) * T + e % T;
    return (page * c->bs + slot) * D + e;
}

static tu_buf alloc_cache(const dcase *c, int64_t nb, int64_t D, lk_dtype dt, int nd4) {
    int64_t T = tile_of(dt);
    if (c->layout == LK_KV_NZ) return tu_alloc(dt, 4, (int64_t[]){nb, D / T, c->bs, T}, c->pad);
    if (nd4) return tu_alloc(dt, 4, (int64_t[]){nb, c->bs, 1, D}, c->pad);
    return tu_alloc(dt, 3, (int64_t[]){nb, c->bs, D}, c->pad);
}

static void fill_nan(tu_buf *b) {
    for (int64_t i = 0; i < tu_numel(b); i++) tu_set(b, i, NAN);
}

static void build(const dcase *c, dbufs *z, uint64_t seed) {
    memset(z, 0, sizeof *z);
    tu_seed(seed);
    int64_t B = c->B, E = c->Dl + c->Dr, pages = 0;
    z->maxlen = 1;
    for (int b = 0; b < B; b++) {
        if (c->len[b] > z->maxlen) z->maxlen = c->len[b];
        pages += ceil_div(c->len[b], c->bs);
    }
    z->maxp = ceil_div(z->maxlen, c->bs) + 1; /* one unused column (-1) */
    z->nb = pages + 3;                        /* three pages no request uses (NaN) */
    z->scale = (float)(1.5 / sqrt((double)E));
    z->q = tu_alloc(c->qt, 4, (int64_t[]){B, c->s_q, c->H, E}, c->pad);
    tu_fill_uniform(&z->q, -1, 1);
    z->out = tu_alloc(c->ot, 4, (int64_t[]){B, c->s_q, c->H, c->Dl}, c->pad);
    if (c->lse_perm) z->lse = tu_alloc_perm(LK_F32, 3, (int64_t[]){B, c->H, c->s_q}, (int[]){0, 2, 1}, c->pad);
    else z->lse = tu_alloc(LK_F32, 3, (int64_t[]){B, c->H, c->s_q}, c->pad);
    if (c->two) {
        z->kv = alloc_cache(c, z->nb, c->Dl, c->ct, 0);
        z->pe = alloc_cache(c, z->nb, c->Dr, c->rt, 0);
        fill_nan(&z->pe);
    } else {
        z->kv = alloc_cache(c, z->nb, E, c->ct, c->nd4);
    }
    fill_nan(&z->kv);
    z->bt = tu_alloc(LK_I32, 2, (int64_t[]){B, z->maxp}, c->pad);
    z->sl = tu_alloc(LK_I32, 1, (int64_t[]){B}, c->pad);
    /* pages: a random permutation of [0, nb) */
    int64_t *perm = tu_permutation(z->nb);
    z->E = malloc(sizeof(double) * (size_t)(B * z->maxlen * E));
    int64_t next = 0;
    for (int b = 0; b < B; b++) {
        tu_set(&z->sl, b, (double)c->len[b]);
        for (int64_t p = 0; p < z->maxp; p++) {
            int used = p < ceil_div(c->len[b], c->bs);
            tu_set(&z->bt, b * z->maxp + p, used ? (double)perm[next++] : -1.0);
        }
        for (int64_t j = 0; j < c->len[b]; j++) {
            int64_t page = (int64_t)tu_get(&z->bt, b * z->maxp + j / c->bs), slot = j % c->bs;
            for (int64_t e = 0; e < E; e++) {
                /* fp8: stored fp8(x / ks) by the scalar converter (lk_store_f -> fp8.h),
                 * the logical entry is the dequantized f32(code) * ks */
                double v = tu_uniform(-1, 1), ks = c->ks > 0 ? c->ks : 1.0;
                tu_buf *buf = c->two && e >= c->Dl ? &z->pe : &z->kv;
                int64_t at = c->two && e >= c->Dl ? cidx(c, page, slot, e - c->Dl, c->Dr, c->rt)
                                                  : cidx(c, page, slot, e, c->two ? c->Dl : E, c->ct);
                double q8 = is_fp8(buf->t.dtype) ? ks : 1.0;
                tu_set(buf, at, v / q8);
                v = tu_get(buf, at) * q8;
                z->E[(b * z->maxlen + j) * E + e] = v;
            }
        }
    }
    free(perm);
    /* float64 reference */
    tu_mla_decode_ref(&z->q, z->E, c->len, B, c->s_q, c->H, E, c->Dl, z->maxlen, (double)z->scale, c->causal, &z->want,
                      &z->want_lse, NULL);
}

static void free_bufs(dbufs *z) {
    tu_buf *all[7] = {&z->q, &z->out, &z->lse, &z->kv, &z->pe, &z->bt, &z->sl};
    for (int i = 0; i < 7; i++)
        if (all[i]->base) tu_free(all[i]);
    free(z->E), free(z->want), free(z->want_lse);
}

static lk_mla_decode_params params_of(const dcase *c, const dbufs *z) {
    lk_mla_decode_params p = lk_mla_decode_params_default(z->scale);
    p.causal = c->causal, p.cache_layout = c->layout, p.split_keys = c->split;
    if (c->ks > 0) p.k_scale = c->ks;
    return p;
}

static lk_status run(const dcase *c, dbufs *z) {
    lk_mla_decode_params p = params_of(c, z);
    return lk_mla_decode(&z->out.t, c->no_lse ? NULL : &z->lse.t, &z->q.t, &z->kv.t, c->two ? &z->pe.t : NULL,
                         &z->bt.t, &z->sl.t, &p);
}

static double simd_tol(lk_dtype dt) { return dt == LK_F32 ? 3e-5 : dt == LK_F16 ? 1e-3 : 8e-3; }

/* every ISA vs float64 and vs ref; outside the views untouched; inputs intact */
static void check_case(const dcase *c0) {
    dcase cc = *c0, *c = &cc; /* causal: a request's length is 0 or >= s_q */
    for (int b = 0; b < c->B; b++)
        if (c->causal && c->len[b] > 0 && c->len[b] < c->s_q) c->len[b] = c->s_q;
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    dbufs z;
    build(c, &z, 1234 + (uint64_t)c->H * 7 + (uint64_t)c->bs);
    int64_t nout = tu_numel(&z.out), nl = tu_numel(&z.lse);
    double *ref = NULL, *ref_lse = NULL;
    tu_buf *ins[5] = {&z.q, &z.kv, &z.pe, &z.bt, &z.sl};
    for (int i = 0; i < 5; i++)
        if (ins[i]->base) tu_snapshot(ins[i]);
    tu_snapshot(&z.out), tu_snapshot(&z.lse);
    for (int k = 0; k < nisa; k++) {
        lk_set_isa(isas[k]);
        lk_status st = run(c, &z);
        if (!tu_check(st == LK_OK, "%s [%s]: status %s (%s)", c->name, lk_isa_name(isas[k]), lk_status_str(st),
                      lk_last_error()))
            continue;
        double *got = tu_values(&z.out), *gl = tu_values(&z.lse);
        tu_tolerance tol = tu_tol(c->ot);
        double e = tu_err(got, z.want, nout, tol);
        tu_check(e <= 1, "%s [%s]: out vs float64 err %.3g", c->name, lk_isa_name(isas[k]), e);
        if (!c->no_lse) {
            double el = tu_err(gl, z.want_lse, nl, (tu_tolerance){1e-4, 1e-4});
            tu_check(el <= 1, "%s [%s]: lse vs float64 err %.3g", c->name, lk_isa_name(isas[k]), el);
        } else {
            tu_check(tu_intact(&z.lse), "%s [%s]: lse untouched when NULL", c->name, lk_isa_name(isas[k]));
        }
        tu_check(tu_outside_intact(&z.out) && tu_outside_intact(&z.lse), "%s [%s]: nothing written outside out / lse",
                 c->name, lk_isa_name(isas[k]));
        int intact = 1;
        for (int i = 0; i < 5; i++)
            if (ins[i]->base) intact &= tu_intact(ins[i]);
        tu_check(intact, "%s [%s]: inputs intact", c->name, lk_isa_name(isas[k]));
        if (isas[k] == LK_ISA_REF) {
            ref = got, ref_lse = gl;
            continue;
        }
        if (ref) {
            double es = tu_err(got, ref, nout, (tu_tolerance){simd_tol(c->ot), simd_tol(c->ot)});
            double els = c->no_lse ? 0 : tu_err(gl, ref_lse, nl, (tu_tolerance){1e-4, 1e-4});
            tu_check(es <= 1 && els <= 1, "%s [%s]: vs ref err %.3g, lse %.3g", c->name, lk_isa_name(isas[k]), es, els);
        }
        free(got), free(gl);
    }
    free(ref), free(ref_lse);
    lk_set_isa(lk_isa_best());
    free_bufs(&z);
}

static dcase base_case(void) {
    dcase c;
    memset(&c, 0, sizeof c);
    c.B = 3, c.len[0] = 37, c.len[1] = 130, c.len[2] = 1;
    c.s_q = 1, c.H = 4, c.Dl = 512, c.Dr = 64, c.bs = 16;
    c.qt = c.ct = c.rt = c.ot = LK_BF16;
    c.name = "base";
    return c;
}

static void test_grid(void) {
    char names[64][96];
    int n = 0;
    /* page sizes, both layouts, one and two buffers */
    int64_t bss[4] = {1, 16, 64, 128};
    for (int i = 0; i < 4; i++)
        for (int L = 0; L < 2; L++)
            for (int two = 0; two < 2; two++) {
                dcase c = base_case();
                c.bs = bss[i], c.layout = L ? LK_KV_NZ : LK_KV_ND, c.two = two;
                c.len[1] = bss[i] == 128 ? 300 : 130;
                snprintf(names[n], sizeof names[n], "page %lld %s %s", (long long)bss[i], L ? "NZ" : "ND",
                         two ? "two buffers" : "one buffer");
                c.name = names[n++];
                check_case(&c);
            }
    /* lengths 0 / 1 / partial / multiples, s_q 1..4 with and without causal */
    for (int sq = 1; sq <= 4; sq++)
        for (int causal = 0; causal < 2; causal++) {
            dcase c = base_case();
            c.B = 5, c.len[0] = 0, c.len[1] = 4, c.len[2] = 64, c.len[3] = 77, c.len[4] = 203;
            c.s_q = sq, c.causal = causal, c.H = 3, c.ot = LK_F32;
            snprintf(names[n], sizeof names[n], "s_q %d %s, lengths 0/4/64/77/203", sq, causal ? "causal" : "full");
            c.name = names[n++];
            check_case(&c);
        }
    /* heads 1 .. 128 */
    int64_t hs[5] = {1, 7, 16, 33, 128};
    for (int i = 0; i < 5; i++) {
        dcase c = base_case();
        c.H = hs[i], c.len[1] = hs[i] >= 33 ? 70 : 130, c.s_q = hs[i] == 33 ? 2 : 1, c.causal = hs[i] == 33;
        snprintf(names[n], sizeof names[n], "H %lld", (long long)hs[i]);
        c.name = names[n++];
        check_case(&c);
    }
    /* dtypes */
    lk_dtype dts[3] = {LK_F32, LK_F16, LK_BF16};
    for (int i = 0; i < 3; i++) {
        dcase c = base_case();
        c.qt = c.ct = c.ot = dts[i];
        snprintf(names[n], sizeof names[n], "all %s", lk_dtype_name(dts[i]));
        c.name = names[n++];
        check_case(&c);
    }
    dcase c = base_case();
    c.qt = LK_F32, c.ct = LK_BF16, c.rt = LK_F16, c.ot = LK_F16, c.two = 1, c.name = "mixed q f32 / cache bf16+f16 / out f16";
    check_case(&c);
    /* strided views, lse permuted, no lse, 4-D ND cache */
    c = base_case(), c.pad = 1, c.lse_perm = 1, c.s_q = 2, c.causal = 1, c.name = "strided q/out/cache, lse permuted";
    check_case(&c);
    c = base_case(), c.pad = 1, c.two = 1, c.layout = LK_KV_NZ, c.name = "strided NZ two buffers";
    check_case(&c);
    c = base_case(), c.no_lse = 1, c.nd4 = 1, c.name = "no lse, ND [nb, bs, 1, E]";
    check_case(&c);
    /* odd dims (tails of every vector loop), Dr = 0 */
    c = base_case(), c.Dl = 20, c.Dr = 13, c.H = 5, c.s_q = 3, c.causal = 1, c.ot = LK_F32, c.ct = LK_F32, c.qt = LK_F32;
    c.name = "Dl 20 Dr 13 f32";
    check_case(&c);
    c = base_case(), c.Dl = 27, c.Dr = 5, c.H = 9, c.two = 1, c.bs = 7, c.name = "Dl 27 Dr 5 two buffers page 7";
    check_case(&c);
    c = base_case(), c.Dl = 16, c.Dr = 0, c.H = 2, c.name = "Dl 16 Dr 0 (K = V)";
    check_case(&c);
    c = base_case(), c.Dl = 48, c.Dr = 16, c.layout = LK_KV_NZ, c.two = 1, c.H = 17, c.name = "Dl 48 Dr 16 NZ two";
    check_case(&c);
    /* split-KV forced: chunk ends inside pages and blocks, causal rows seeing nothing of
     * the last chunk */
    c = base_case(), c.split = 64, c.B = 2, c.len[0] = 300, c.len[1] = 129, c.s_q = 4, c.causal = 1, c.H = 6;
    c.name = "split 64, causal s_q 4";
    check_case(&c);
    c = base_case(), c.split = 100, c.B = 1, c.len[0] = 1001, c.H = 16, c.ot = LK_F32, c.name = "split 100, 1001 keys";
    check_case(&c);
    c = base_case(), c.split = 1, c.B = 2, c.len[0] = 5, c.len[1] = 0, c.s_q = 2, c.causal = 1, c.ot = LK_F32;
    c.name = "split 1";
    check_case(&c);
    c = base_case(), c.split = INT64_MAX, c.B = 2, c.len[0] = 13, c.len[1] = 130; /* one chunk, no overflow */
    c.name = "split INT64_MAX";
    check_case(&c);
}

/* NZ gives ND's bits on every ISA (one and two buffers, split or not) */
static void test_nz_equals_nd(void) {
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    for (int two = 0; two < 2; two++)
        for (int split = 0; split < 2; split++) {
            dcase nd = base_case();
            nd.two = two, nd.split = split ? 64 : 0, nd.s_q = 2, nd.causal = 1, nd.H = 8, nd.ot = LK_F32, nd.len[2] = 2;
            dcase nz = nd;
            nz.layout = LK_KV_NZ;
            dbufs a, b;
            build(&nd, &a, 99), build(&nz, &b, 99);
            for (int k = 0; k < nisa; k++) {
                lk_set_isa(isas[k]);
                lk_status s1 = run(&nd, &a), s2 = run(&nz, &b);
                tu_check(s1 == LK_OK && s2 == LK_OK && tu_same_bits(&a.out, &b.out) && tu_same_bits(&a.lse, &b.lse),
                         "NZ == ND bitwise [%s] %s%s", lk_isa_name(isas[k]), two ? "two buffers" : "one buffer",
                         split ? ", split 64" : "");
            }
            free_bufs(&a), free_bufs(&b);
        }
    lk_set_isa(lk_isa_best());
}

/* outputs bitwise identical for 1..4 threads and repeated calls, planned and forced splits */
static void test_threads(void) {
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    for (int variant = 0; variant < 2; variant++) {
        dcase c = base_case();
        c.B = 2, c.len[0] = 1500, c.len[1] = 700, c.H = 16, c.s_q = 2, c.causal = 1, c.ot = LK_F32;
        c.split = variant ? 96 : 0;
        dbufs z;
        build(&c, &z, 5);
        for (int k = 0; k < nisa; k++) {
            lk_set_isa(isas[k]);
            lk_set_num_threads(1);
            run(&c, &z);
            double *o1 = tu_values(&z.out), *l1 = tu_values(&z.lse);
            int same = 1;
            for (int nt = 1; nt <= 4; nt++) {
                lk_set_num_threads(nt);
                for (int rep = 0; rep < 2; rep++) {
                    lk_status st = run(&c, &z);
                    double *o = tu_values(&z.out), *l = tu_values(&z.lse);
                    same &= st == LK_OK && !memcmp(o, o1, sizeof(double) * (size_t)tu_numel(&z.out)) &&
                            !memcmp(l, l1, sizeof(double) * (size_t)tu_numel(&z.lse));
                    free(o), free(l);
                }
            }
            tu_check(same, "threads 1..4 bitwise [%s] %s", lk_isa_name(isas[k]), variant ? "split 96" : "planned split");
            free(o1), free(l1);
        }
        free_bufs(&z);
    }
    lk_set_num_threads(0);
    lk_set_isa(lk_isa_best());
}

static void test_plan(void) {
    int32_t v[4] = {32768, 0, 0, 0};
    lk_tensor t = lk_tensor_make(v, LK_I32, 1, (int64_t[]){1});
    int64_t sk = -1;
    lk_status st = lk_mla_decode_plan(&t, &sk);
    tu_check(st == LK_OK && sk == 512, "plan B = 1, 32768 keys: %lld keys per chunk", (long long)sk);
    int64_t big[64];
    for (int i = 0; i < 64; i++) big[i] = 4096;
    lk_tensor t64 = lk_tensor_make(big, LK_I64, 1, (int64_t[]){64});
    st = lk_mla_decode_plan(&t64, &sk);
    tu_check(st == LK_OK && sk == 4096, "plan B = 64, 4096 keys: no split (%lld)", (long long)sk);
    v[0] = 4096;
    t.shape[0] = 1;
    st = lk_mla_decode_plan(&t, &sk);
    tu_check(st == LK_OK && sk == 512, "plan B = 1, 4096 keys: at least 512 (%lld)", (long long)sk);
    t.shape[0] = 0;
    st = lk_mla_decode_plan(&t, &sk);
    tu_check(st == LK_OK && sk == 512, "plan B = 0");
    v[0] = 5, v[1] = -1, t.shape[0] = 2;
    sk = 7;
    st = lk_mla_decode_plan(&t, &sk);
    tu_check(st == LK_ERR_INDEX && strstr(lk_last_error(), "cache_seqlens") && sk == 7, "plan negative length rejected");
    st = lk_mla_decode_plan(NULL, &sk);
    tu_check(st == LK_ERR_NULL, "plan NULL cache_seqlens");
    st = lk_mla_decode_plan(&t, NULL);
    tu_check(st == LK_ERR_NULL && strstr(lk_last_error(), "split_keys"), "plan NULL split_keys");
}

/* ---------------------------------------------------------------- bad inputs */

static void expect_bad(const dcase *c, dbufs *z, lk_status want, const char *arg, const char *what,
                       const lk_mla_decode_params *pp, const lk_tensor *lse_over) {
    tu_buf *all[7] = {&z->q, &z->out, &z->lse, &z->kv, &z->pe, &z->bt, &z->sl};
    for (int i = 0; i < 7; i++)
        if (all[i]->base) tu_snapshot(all[i]);
    lk_mla_decode_params p = pp ? *pp : params_of(c, z);
    lk_status st = lk_mla_decode(&z->out.t, lse_over ? lse_over : &z->lse.t, &z->q.t, &z->kv.t, c->two ? &z->pe.t : NULL,
                                 &z->bt.t, &z->sl.t, &p);
    int intact = 1;
    for (int i = 0; i < 7; i++)
        if (all[i]->base) intact &= tu_intact(all[i]);
    tu_check(st == want && strstr(lk_last_error(), arg) && intact, "bad input rejected: %s (%s; %s)", what,
             lk_status_str(st), lk_last_error());
}

static void test_bad(void) {
    dcase c = base_case();
    c.s_q = 2, c.causal = 1;
    dbufs z;
    build(&c, &z, 3);
    /* length beyond the block table */
    tu_set(&z.sl, 0, (double)(z.maxp * c.bs + 1));
    expect_bad(&c, &z, LK_ERR_INDEX, "cache_seqlens", "cache_seqlens beyond the block table", NULL, NULL);
    tu_set(&z.sl, 0, -1);
    expect_bad(&c, &z, LK_ERR_INDEX, "cache_seqlens", "negative cache_seqlens", NULL, NULL);
    tu_set(&z.sl, 0, 37);
    /* s_q > length with causal (request 2 has 1 token) */
    expect_bad(&c, &z, LK_ERR_INDEX, "cache_seqlens", "s_q > cache_seqlens with causal", NULL, NULL);
    tu_set(&z.sl, 2, 2);
    int64_t pg = (int64_t)tu_get(&z.bt, 1);
    tu_set(&z.bt, 1, (double)z.nb);
    expect_bad(&c, &z, LK_ERR_INDEX, "block_table", "block id = num_blocks", NULL, NULL);
    tu_set(&z.bt, 1, -1);
    expect_bad(&c, &z, LK_ERR_INDEX, "block_table", "block id -1 in a used page", NULL, NULL);
    tu_set(&z.bt, 1, (double)pg);
    /* valid now (request 2 uses 2 tokens of its page) */
    lk_mla_decode_params p = params_of(&c, &z);
    lk_status st = lk_mla_decode(&z.out.t, &z.lse.t, &z.q.t, &z.kv.t, NULL, &z.bt.t, &z.sl.t, &p);
    tu_check(st == LK_OK, "restored case runs (%s)", lk_last_error());
    p.scale = NAN;
    expect_bad(&c, &z, LK_ERR_VALUE, "params.scale", "NaN scale", &p, NULL);
    p = params_of(&c, &z), p.split_keys = -1;
    expect_bad(&c, &z, LK_ERR_VALUE, "params.split_keys", "negative split_keys", &p, NULL);
    p = params_of(&c, &z), p.cache_layout = (lk_kv_layout)7;
    expect_bad(&c, &z, LK_ERR_VALUE, "cache_layout", "unknown layout", &p, NULL);
    /* shapes */
    lk_tensor keep = z.out.t;
    z.out.t.shape[3] = 577;
    expect_bad(&c, &z, LK_ERR_SHAPE, "q", "out wider than q", NULL, NULL);
    z.out.t = keep, z.out.t.shape[2] = 3;
    expect_bad(&c, &z, LK_ERR_SHAPE, "out", "out heads differ", NULL, NULL);
    z.out.t = keep;
    lk_tensor lse2 = z.lse.t;
    lse2.shape[2] = 1;
    expect_bad(&c, &z, LK_ERR_SHAPE, "lse", "lse shape", NULL, &lse2);
    lse2 = z.lse.t, lse2.dtype = LK_BF16;
    expect_bad(&c, &z, LK_ERR_DTYPE, "lse", "lse not f32", NULL, &lse2);
    keep = z.kv.t, z.kv.t.shape[2] = 575;
    expect_bad(&c, &z, LK_ERR_SHAPE, "kv_c_cache", "cache entry width", NULL, NULL);
    z.kv.t = keep, z.kv.t.dtype = LK_I32;
    expect_bad(&c, &z, LK_ERR_DTYPE, "kv_c_cache", "cache dtype", NULL, NULL);
    z.kv.t = keep;
    keep = z.bt.t, z.bt.t.dtype = LK_F32;
    expect_bad(&c, &z, LK_ERR_DTYPE, "block_table", "block_table dtype", NULL, NULL);
    z.bt.t = keep, z.bt.t.shape[0] = 2;
    expect_bad(&c, &z, LK_ERR_SHAPE, "block_table", "block_table rows", NULL, NULL);
    z.bt.t = keep;
    keep = z.sl.t, z.sl.t.shape[0] = 4;
    expect_bad(&c, &z, LK_ERR_SHAPE, "cache_seqlens", "cache_seqlens size", NULL, NULL);
    z.sl.t = keep;
    keep = z.q.t, z.q.t.ndim = 3;
    expect_bad(&c, &z, LK_ERR_RANK, "q", "q rank", NULL, NULL);
    z.q.t = keep;
    /* overlaps: out over q, lse over out */
    lk_tensor oq = z.q.t;
    oq.shape[3] = 512, oq.dtype = z.q.t.dtype;
    keep = z.out.t, z.out.t = oq;
    expect_bad(&c, &z, LK_ERR_ALIAS, "out", "out overlapping q", NULL, NULL);
    z.out.t = keep;
    lse2 = z.lse.t, lse2.data = z.out.t.data;
    lse2.dtype = LK_F32;
    expect_bad(&c, &z, LK_ERR_ALIAS, "lse", "lse overlapping out", NULL, &lse2);
    /* NULLs */
    st = lk_mla_decode(&z.out.t, NULL, &z.q.t, NULL, NULL, &z.bt.t, &z.sl.t, &p);
    tu_check(st == LK_ERR_NULL && strstr(lk_last_error(), "kv_c_cache"), "NULL kv_c_cache");
    st = lk_mla_decode(&z.out.t, NULL, &z.q.t, &z.kv.t, NULL, &z.bt.t, &z.sl.t, NULL);
    tu_check(st == LK_ERR_NULL && strstr(lk_last_error(), "params"), "NULL params");
    free_bufs(&z);
    /* two buffers with Dr = 0 */
    c = base_case(), c.two = 1, c.Dr = 16;
    build(&c, &z, 4);
    keep = z.q.t, z.q.t.shape[3] = 512;
    expect_bad(&c, &z, LK_ERR_SHAPE, "k_pe_cache", "two buffers without rope dims", NULL, NULL);
    z.q.t = keep;
    keep = z.pe.t, z.pe.t.shape[0] = z.nb - 1;
    expect_bad(&c, &z, LK_ERR_SHAPE, "k_pe_cache", "k_pe_cache pages differ", NULL, NULL);
    z.pe.t = keep;
    free_bufs(&z);
}

/* empty batch / no heads: nothing written */
static void test_empty(void) {
    dcase c = base_case();
    c.B = 0;
    dbufs z;
    build(&c, &z, 8);
    tu_snapshot(&z.out), tu_snapshot(&z.lse);
    lk_status st = run(&c, &z);
    tu_check(st == LK_OK && tu_intact(&z.out) && tu_intact(&z.lse), "B = 0 does nothing");
    free_bufs(&z);
}

/* ---------------------------------------------------------------- end to end */

/* A sequence of N tokens with latents c_t [Dl] and rope keys k_pe_t [Dr], queries
 * q_t [H, Dn + Dr], kv_b_proj W [H (Dn + Dv), Dl]. The prefix [0, P) is written with
 * concat_and_cache_mla, mla_prefix_prefill runs tokens [P, P + T) over it (their own
 * k, v projected here), then each later token is written to the cache and decoded
 * (absorbed queries [q_nope W_UK | q_pe]), the last two together with s_q = 2 causal.
 * Every output is checked against float64 attention over the whole sequence so far in
 * latent space: o_lat = softmax(scale q_abs . [c | k_pe]) . c, prefill out = W_UV o_lat. */
static void test_end_to_end(void) {
    enum { H = 4, Dn = 16, Dr = 16, Dv = 16, Dl = 64, E = Dl + Dr, BS = 16, P = 37, T = 5, N = P + T + 6 + 2 };
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    tu_seed(77);
    static float c[N][Dl], kpe[N][Dr], q[N][H][Dn + Dr], W[H * (Dn + Dv)][Dl];
    for (int t = 0; t < N; t++) {
        for (int d = 0; d < Dl; d++) c[t][d] = (float)tu_uniform(-1, 1);
        for (int d = 0; d < Dr; d++) kpe[t][d] = (float)tu_uniform(-1, 1);
        for (int h = 0; h < H; h++)
            for (int d = 0; d < Dn + Dr; d++) q[t][h][d] = (float)tu_uniform(-1, 1);
    }
    for (int r = 0; r < H * (Dn + Dv); r++)
        for (int d = 0; d < Dl; d++) W[r][d] = (float)tu_uniform(-0.3, 0.3);
    float scale = 0.2f;
    /* absorbed queries in float64 (and their f32 copy for the decode) */
    static double qa[N][H][E];
    static float qa32[N][H][E];
    for (int t = 0; t < N; t++)
        for (int h = 0; h < H; h++) {
            for (int l = 0; l < Dl; l++) {
                double s = 0;
                for (int n = 0; n < Dn; n++) s += (double)q[t][h][n] * W[h * (Dn + Dv) + n][l];
                qa[t][h][l] = s;
            }
            for (int d = 0; d < Dr; d++) qa[t][h][Dl + d] = q[t][h][Dn + d];
            for (int e = 0; e < E; e++) qa32[t][h][e] = (float)qa[t][h][e];
        }
    /* float64 latent output of token t (query of token t over keys [0, t]) */
    static double olat[N][H][Dl];
    for (int t = 0; t < N; t++)
        for (int h = 0; h < H; h++) {
            double s[N], m = -INFINITY, l = 0;
            for (int j = 0; j <= t; j++) {
                double d = 0;
                for (int e = 0; e < Dl; e++) d += qa[t][h][e] * c[j][e];
                for (int e = 0; e < Dr; e++) d += qa[t][h][Dl + e] * kpe[j][e];
                s[j] = d * scale;
                if (s[j] > m) m = s[j];
            }
            for (int e = 0; e < Dl; e++) olat[t][h][e] = 0;
            for (int j = 0; j <= t; j++) {
                double p = exp(s[j] - m);
                l += p;
                for (int e = 0; e < Dl; e++) olat[t][h][e] += p * c[j][e];
            }
            for (int e = 0; e < Dl; e++) olat[t][h][e] /= l;
        }
    for (int L = 0; L < 2; L++)
        for (int k = 0; k < nisa; k++) {
            lk_set_isa(isas[k]);
            lk_kv_layout lay = L ? LK_KV_NZ : LK_KV_ND;
            int64_t NB = 8;
            float *cache = malloc(sizeof(float) * NB * BS * E);
            for (int64_t i = 0; i < NB * BS * E; i++) cache[i] = NAN;
            lk_tensor tc = lay == LK_KV_NZ ? lk_tensor_make(cache, LK_F32, 4, (int64_t[]){NB, E / 16, BS, 16})
                                           : lk_tensor_make(cache, LK_F32, 3, (int64_t[]){NB, BS, E});
            int32_t table[1][4] = {{5, 2, 7, 0}};
            lk_tensor tt = lk_tensor_make(table, LK_I32, 2, (int64_t[]){1, 4});
            /* write tokens [t0, t1) */
#define WRITE(t0, t1)                                                                                       \
    do {                                                                                                    \
        int64_t slots[N];                                                                                   \
        for (int tw_ = (t0); tw_ < (t1); tw_++) slots[tw_ - (t0)] = table[0][tw_ / BS] * BS + tw_ % BS;                 \
        lk_tensor kc = lk_tensor_make(&c[t0][0], LK_F32, 2, (int64_t[]){(t1) - (t0), Dl});                  \
        lk_tensor kp = lk_tensor_make(&kpe[t0][0], LK_F32, 2, (int64_t[]){(t1) - (t0), Dr});                \
        lk_tensor ts = lk_tensor_make(slots, LK_I64, 1, (int64_t[]){(t1) - (t0)});                          \
        lk_status ws = lk_concat_and_cache_mla(&kc, &kp, &tc, NULL, &ts, lay);                              \
        tu_check(ws == LK_OK, "e2e write tokens %d..%d (%s)", (int)(t0), (int)(t1), lk_last_error());      \
    } while (0)
            WRITE(0, P);
            /* prefill of [P, P + T): their k = [W_UK c | k_pe], v = W_UV c */
            static float kk[T][H][Dn + Dr], vv[T][H][Dv], oo[T][H][Dv];
            for (int t = 0; t < T; t++)
                for (int h = 0; h < H; h++) {
                    for (int n = 0; n < Dn + Dv; n++) {
                        double s = 0;
                        for (int l = 0; l < Dl; l++) s += (double)W[h * (Dn + Dv) + n][l] * c[P + t][l];
                        if (n < Dn) kk[t][h][n] = (float)s;
                        else vv[t][h][n - Dn] = (float)s;
                    }
                    for (int d = 0; d < Dr; d++) kk[t][h][Dn + d] = kpe[P + t][d];
                }
            lk_tensor tq = lk_tensor_make(&q[P][0][0], LK_F32, 3, (int64_t[]){T, H, Dn + Dr});
            lk_tensor tk = lk_tensor_make(kk, LK_F32, 3, (int64_t[]){T, H, Dn + Dr});
            lk_tensor tv = lk_tensor_make(vv, LK_F32, 3, (int64_t[]){T, H, Dv});
            lk_tensor to = lk_tensor_make(oo, LK_F32, 3, (int64_t[]){T, H, Dv});
            int32_t cu[2] = {0, T}, pl[1] = {P};
            lk_tensor tcu = lk_tensor_make(cu, LK_I32, 1, (int64_t[]){2}), tpl = lk_tensor_make(pl, LK_I32, 1, (int64_t[]){1});
            lk_tensor tw = lk_tensor_make(W, LK_F32, 2, (int64_t[]){H * (Dn + Dv), Dl});
            lk_mla_params mp = lk_mla_params_default(scale);
            mp.cache_layout = lay;
            lk_status st = lk_mla_prefix_prefill(&to, &tq, &tk, &tv, &tcu, &tpl, &tt, &tc, NULL, &tw, &mp);
            double err = 0;
            for (int t = 0; t < T; t++)
                for (int h = 0; h < H; h++)
                    for (int d = 0; d < Dv; d++) {
                        double w = 0;
                        for (int l = 0; l < Dl; l++) w += W[h * (Dn + Dv) + Dn + d][l] * olat[P + t][h][l];
                        double e = fabs(oo[t][h][d] - w) / (1e-4 + 1e-4 * fabs(w));
                        if (!(e <= err)) err = e;
                    }
            tu_check(st == LK_OK && err <= 1, "e2e %s [%s]: prefill over the cached prefix vs float64 (err %.3g)",
                     L ? "NZ" : "ND", lk_isa_name(isas[k]), err);
            WRITE(P, P + T);
            /* decode one token at a time, then the last two with s_q = 2 causal */
            int ok = 1;
            double worst = 0;
            for (int t = P + T; t < N; t++) {
                int sq = t >= N - 2 ? 2 : 1;
                if (sq == 2 && t == N - 1) break;
                WRITE(t, t + sq);
                int32_t len[1] = {t + sq};
                float out[2][H][Dl], lse[H][2];
                lk_tensor tq2 = lk_tensor_make(&qa32[t][0][0], LK_F32, 4, (int64_t[]){1, sq, H, E});
                lk_tensor to2 = lk_tensor_make(out, LK_F32, 4, (int64_t[]){1, sq, H, Dl});
                lk_tensor tl = lk_tensor_make(lse, LK_F32, 3, (int64_t[]){1, H, sq});
                lk_tensor ts = lk_tensor_make(len, LK_I32, 1, (int64_t[]){1});
                lk_mla_decode_params dp = lk_mla_decode_params_default(scale);
                dp.cache_layout = lay, dp.causal = sq == 2;
                dp.split_keys = t % 2 ? 16 : 0; /* every other step split into pages */
                st = lk_mla_decode(&to2, &tl, &tq2, &tc, NULL, &tt, &ts, &dp);
                ok &= st == LK_OK;
                for (int i = 0; i < sq; i++)
                    for (int h = 0; h < H; h++)
                        for (int d = 0; d < Dl; d++) {
                            double w = olat[t + i][h][d], e = fabs(out[i][h][d] - w) / (1e-5 + 1e-5 * fabs(w));
                            if (!(e <= worst)) worst = e;
                        }
                if (sq == 2) t++;
            }
            tu_check(ok && worst <= 1, "e2e %s [%s]: decode steps and s_q = 2 causal vs float64 (err %.3g)",
                     L ? "NZ" : "ND", lk_isa_name(isas[k]), worst);
#undef WRITE
            free(cache);
        }
    lk_set_isa(lk_isa_best());
}

/* ---------------------------------------------------------------- fp8 caches */

/* e4m3 / e5m2 latent caches (written with the scalar converter of src/core/fp8.h, every
 * value x stored as fp8(x / k_scale)): every ISA against float64 over the dequantized
 * entries f32(code) * k_scale and against ref (the kernels' arithmetic tolerance: the
 * entries are exact in bf16 and f32, docs/numerics.md), on the grid of the bf16 caches;
 * NZ (32-wide tile) == ND bitwise; 1-4 threads bitwise; bad scales. */
static void test_fp8(void) {
    static char names[96][112];
    int n = 0;
    lk_dtype f8[2] = {LK_F8E4M3, LK_F8E5M2};
    int64_t bss[4] = {1, 16, 64, 128};
    for (int f = 0; f < 2; f++) {
        const char *fn = lk_dtype_name(f8[f]);
        for (int i = 0; i < 4; i++)
            for (int L = 0; L < 2; L++)
                for (int two = 0; two < 2; two++) {
                    dcase c = base_case();
                    c.ct = c.rt = f8[f], c.ks = f ? 0.004f : 0.05f; /* small codes reach the subnormals */
                    c.bs = bss[i], c.layout = L ? LK_KV_NZ : LK_KV_ND, c.two = two;
                    c.len[1] = bss[i] == 128 ? 300 : 130;
                    c.H = i == 1 ? 16 : 4; /* R = 16: the small-R kernels; 4: padded rows */
                    snprintf(names[n], sizeof names[n], "%s page %lld %s %s", fn, (long long)bss[i], L ? "NZ" : "ND",
                             two ? "two buffers" : "one buffer");
                    c.name = names[n++];
                    check_case(&c);
                }
        for (int sq = 1; sq <= 4; sq++)
            for (int causal = 0; causal < 2; causal++) {
                dcase c = base_case();
                c.ct = c.rt = f8[f], c.ks = 0.02f;
                c.B = 5, c.len[0] = 0, c.len[1] = 4, c.len[2] = 64, c.len[3] = 77, c.len[4] = 203;
                c.s_q = sq, c.causal = causal, c.H = sq == 4 ? 9 : 3, c.ot = sq % 2 ? LK_BF16 : LK_F32;
                snprintf(names[n], sizeof names[n], "%s s_q %d %s, lengths 0/4/64/77/203", fn, sq, causal ? "causal" : "full");
                c.name = names[n++];
                check_case(&c);
            }
        dcase c = base_case();
        c.ct = c.rt = f8[f], c.ks = 0.03f, c.H = 33, c.s_q = 2, c.causal = 1, c.len[1] = 70, c.split = 64;
        snprintf(names[n], sizeof names[n], "%s H 33 s_q 2 causal (R > W), split 64", fn);
        c.name = names[n++];
        check_case(&c);
        c = base_case(), c.ct = c.rt = f8[f], c.ks = 1.5f, c.qt = c.ot = LK_F32, c.H = 16;
        snprintf(names[n], sizeof names[n], "%s q/out f32 (the f32 path), k_scale 1.5", fn);
        c.name = names[n++];
        check_case(&c);
        c = base_case(), c.ct = c.rt = f8[f], c.ks = 0.1f, c.qt = LK_F16, c.ot = LK_BF16, c.pad = 1, c.lse_perm = 1;
        c.s_q = 2, c.causal = 1, c.layout = f ? LK_KV_NZ : LK_KV_ND;
        snprintf(names[n], sizeof names[n], "%s strided q/out/cache %s, q f16", fn, f ? "NZ" : "ND");
        c.name = names[n++];
        check_case(&c);
        c = base_case(), c.ct = c.rt = f8[f], c.ks = 0.25f, c.Dl = 32, c.Dr = 32, c.H = 5, c.bs = 7, c.two = 1;
        c.layout = LK_KV_NZ, c.s_q = 3, c.causal = 1;
        snprintf(names[n], sizeof names[n], "%s Dl 32 Dr 32 NZ two buffers page 7", fn);
        c.name = names[n++];
        check_case(&c);
        c = base_case(), c.ct = f8[f], c.ks = 0.5f, c.Dl = 20, c.Dr = 13, c.H = 3, c.nd4 = 1;
        snprintf(names[n], sizeof names[n], "%s Dl 20 Dr 13 ND [nb, bs, 1, E]", fn);
        c.name = names[n++];
        check_case(&c);
        /* Dl a multiple of 64 with a rope part that is not (the amx row widens whole
         * groups of 64 dims out of order, the rest in order) */
        c = base_case(), c.ct = c.rt = f8[f], c.ks = 0.25f, c.Dl = 128, c.Dr = 72, c.H = 5, c.bs = 7, c.two = 1;
        c.s_q = 2, c.causal = 1;
        snprintf(names[n], sizeof names[n], "%s Dl 128 Dr 72 two buffers page 7", fn);
        c.name = names[n++];
        check_case(&c);
        c = base_case(), c.ct = f8[f], c.ks = 0.125f, c.Dl = 64, c.Dr = 96, c.H = 20, c.layout = LK_KV_NZ;
        snprintf(names[n], sizeof names[n], "%s Dl 64 Dr 96 NZ one buffer, 20 heads", fn);
        c.name = names[n++];
        check_case(&c);
    }
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    /* one cached key: out = its dequantized entry exactly (p = 1, l = 1), every finite
     * code of the format in the latent dims (values compared: -0 comes out +0), k_scale 1
     * and 0.5; bf16 q/out (the bf16 dot
     * path's fp8 -> bf16 conversion) and f32 (lkv_load's) */
    for (int f = 0; f < 2; f++) {
        enum { DLc = 256, DRc = 32, Ec = DLc + DRc };
        static uint8_t cache[2][Ec];
        static uint16_t qb[2][Ec], ob[2][DLc];
        static float qf[2][Ec], of[2][DLc];
        for (int e = 0; e < Ec; e++) {
            int code = e < DLc ? e : 0x30 + e % 7;
            int special = f ? (code & 0x7f) >= 0x7c : (code & 0x7f) == 0x7f;
            cache[1][e] = (uint8_t)(special ? 0x38 : code), cache[0][e] = 0x7f; /* page 0 unused (NaN) */
            qf[0][e] = qf[1][e] = (float)(e % 5) * 0.125f, qb[0][e] = qb[1][e] = lk_f32_to_bf16(qf[0][e]);
        }
        int32_t len[2] = {1, 1}, tab[2][1] = {{1}, {1}};
        lk_tensor tc = lk_tensor_make(cache, f8[f], 3, (int64_t[]){2, 1, Ec});
        lk_tensor tt = lk_tensor_make(tab, LK_I32, 2, (int64_t[]){2, 1}), tl = lk_tensor_make(len, LK_I32, 1, (int64_t[]){2});
        for (int k = 0; k < nisa; k++)
            for (int ksi = 0; ksi < 2; ksi++) {
                lk_set_isa(isas[k]);
                float ks = ksi ? 0.5f : 1.0f;
                lk_mla_decode_params p = lk_mla_decode_params_default(0.01f);
                p.k_scale = ks;
                lk_tensor q16 = lk_tensor_make(qb, LK_BF16, 4, (int64_t[]){2, 1, 1, Ec});
                lk_tensor o16 = lk_tensor_make(ob, LK_BF16, 4, (int64_t[]){2, 1, 1, DLc});
                lk_tensor q32 = lk_tensor_make(qf, LK_F32, 4, (int64_t[]){2, 1, 1, Ec});
                lk_tensor o32 = lk_tensor_make(of, LK_F32, 4, (int64_t[]){2, 1, 1, DLc});
                lk_status s1 = lk_mla_decode(&o16, NULL, &q16, &tc, NULL, &tt, &tl, &p);
                lk_status s2 = lk_mla_decode(&o32, NULL, &q32, &tc, NULL, &tt, &tl, &p);
                int ok = s1 == LK_OK && s2 == LK_OK;
                for (int b = 0; b < 2; b++)
                    for (int d = 0; d < DLc; d++) {
                        uint8_t cd = cache[1][d];
                        float want = (f ? lk_f8e5m2_to_f32(cd) : lk_f8e4m3_to_f32(cd)) * ks;
                        ok &= lk_bf16_to_f32(ob[b][d]) == want && of[b][d] == want; /* -0 gives +0 (0 + p * -0) */
                    }
                tu_check(ok, "%s single key [%s] k_scale %g: out = every finite code's value exactly", lk_dtype_name(f8[f]),
                         lk_isa_name(isas[k]), (double)ks);
                /* the special codes in a used entry (q 0 there): e4m3 NaN, e5m2 +-inf and NaN
                 * make the score NaN (0 * inf), so every row of the request is NaN */
                for (int sc = 0; sc < (f ? 4 : 1); sc++) {
                    uint8_t keep8 = cache[1][5];
                    cache[1][5] = (uint8_t)(f ? (sc < 2 ? 0x7c : 0x7d + sc - 2) | (sc & 1 ? 0x80 : 0) : 0xff);
                    s1 = lk_mla_decode(&o16, NULL, &q16, &tc, NULL, &tt, &tl, &p);
                    s2 = lk_mla_decode(&o32, NULL, &q32, &tc, NULL, &tt, &tl, &p);
                    int nan = s1 == LK_OK && s2 == LK_OK;
                    for (int d = 0; d < DLc; d++) nan &= isnan(lk_bf16_to_f32(ob[0][d])) && isnan(of[1][d]);
                    tu_check(nan, "%s single key [%s]: special code 0x%02x in a used entry makes its rows NaN",
                             lk_dtype_name(f8[f]), lk_isa_name(isas[k]), cache[1][5]);
                    cache[1][5] = keep8;
                }
            }
    }
    lk_set_isa(lk_isa_best());
    /* NZ (tile 32) == ND bitwise, and 1..4 threads bitwise, on every ISA */
    for (int f = 0; f < 2; f++)
        for (int two = 0; two < 2; two++) {
            dcase nd = base_case();
            nd.ct = nd.rt = f8[f], nd.ks = 0.07f, nd.two = two, nd.split = two ? 64 : 0, nd.s_q = 2, nd.causal = 1;
            nd.H = 8, nd.len[2] = 2, nd.ot = two ? LK_F32 : LK_BF16;
            dcase nz = nd;
            nz.layout = LK_KV_NZ;
            dbufs a, b;
            build(&nd, &a, 98), build(&nz, &b, 98);
            for (int k = 0; k < nisa; k++) {
                lk_set_isa(isas[k]);
                lk_status s1 = run(&nd, &a), s2 = run(&nz, &b);
                int same = s1 == LK_OK && s2 == LK_OK && tu_same_bits(&a.out, &b.out) && tu_same_bits(&a.lse, &b.lse);
                double *o1 = tu_values(&b.out);
                for (int nt = 1; nt <= 4; nt++) {
                    lk_set_num_threads(nt);
                    lk_status st = run(&nz, &b);
                    double *o = tu_values(&b.out);
                    same &= st == LK_OK && !memcmp(o, o1, sizeof(double) * (size_t)tu_numel(&b.out));
                    free(o);
                }
                lk_set_num_threads(0);
                free(o1);
                tu_check(same, "%s NZ == ND bitwise, threads 1..4 [%s] %s", lk_dtype_name(f8[f]), lk_isa_name(isas[k]),
                         two ? "two buffers, split 64" : "one buffer");
            }
            free_bufs(&a), free_bufs(&b);
        }
    lk_set_isa(lk_isa_best());
    /* bad scales (nothing written), mixed buffers, the 16-wide NZ tile on an fp8 cache */
    dcase c = base_case();
    c.ct = c.rt = LK_F8E4M3, c.ks = 0.05f;
    dbufs z;
    build(&c, &z, 6);
    float bad[4] = {0.0f, -1.0f, NAN, INFINITY};
    for (int i = 0; i < 4; i++) {
        lk_mla_decode_params p = params_of(&c, &z);
        p.k_scale = bad[i];
        char what[64];
        snprintf(what, sizeof what, "fp8 cache, k_scale %g", (double)bad[i]);
        expect_bad(&c, &z, LK_ERR_VALUE, "params.k_scale", what, &p, NULL);
    }
    lk_tensor keep = z.kv.t;
    /* the fp8 cache's bytes read as a bf16 cache of 288-wide entries */
    z.kv.t.shape[2] = 576 / 2, z.kv.t.dtype = LK_BF16, z.kv.t.stride[0] /= 2, z.kv.t.stride[1] /= 2;
    lk_mla_decode_params p = params_of(&c, &z);
    p.k_scale = 0.0f; /* not read for a bf16 cache */
    lk_tensor q2 = z.q.t, o2 = z.out.t;
    q2.shape[3] = 288, o2.shape[3] = 256;
    lk_status st = lk_mla_decode(&o2, NULL, &q2, &z.kv.t, NULL, &z.bt.t, &z.sl.t, &p);
    tu_check(st == LK_OK, "k_scale not read for a bf16 cache (%s)", lk_last_error());
    z.kv.t = keep;
    free_bufs(&z);
    c = base_case(), c.ct = LK_F8E4M3, c.rt = LK_BF16, c.two = 1, c.ks = 0.05f;
    build(&c, &z, 7);
    expect_bad(&c, &z, LK_ERR_DTYPE, "k_pe_cache", "fp8 kv_c_cache with a bf16 k_pe_cache", NULL, NULL);
    free_bufs(&z);
    c = base_case(), c.ct = LK_F8E5M2, c.ks = 0.05f, c.layout = LK_KV_NZ;
    build(&c, &z, 8);
    keep = z.kv.t;
    z.kv.t.shape[1] = 576 / 16, z.kv.t.shape[3] = 16; /* the 16-wide tile of 2-byte caches */
    z.kv.t.stride[2] = 16, z.kv.t.stride[1] = 16 * c.bs;
    z.kv.t.shape[0] = keep.shape[0] / 2;
    expect_bad(&c, &z, LK_ERR_SHAPE, "kv_c_cache", "fp8 NZ cache with 16-wide tiles", NULL, NULL);
    z.kv.t = keep;
    free_bufs(&z);
}

/* the paths the avx512bf16 row chooses by lk_cpu_prefer_fma (the bf16 dot products or
 * f32 FMAs), run once more with the other choice by tu_other_fma_form */
static void other_fma_form(void) {
    test_fp8();
    test_grid();
    test_nz_equals_nd();
}

int main(void) {
    tu_init();
    other_fma_form(); /* with the CPU's lk_cpu_prefer_fma answer here, the other at the end */
    test_threads();
    test_plan();
    test_bad();
    test_empty();
    test_end_to_end();
    tu_other_fma_form(other_fma_form);
    return tu_finish("test_mla_decode");
}
