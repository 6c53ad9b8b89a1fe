/*
 * concat_and_cache_mla and gather_cache: every ISA against the expected cache / output
 * computed here from the layout formulas of include/llmkern.h (the test's own offset
 * code, not src/core/paged.h) and against ref, bit for bit. Page sizes 1, 7, 16, 128;
 * MLA 512 + 64 and odd dims; one and two cache buffers; ND (3-D, 4-D, permuted HND) and
 * NZ; random and prefill-like slot mappings (runs of consecutive slots: the grouped
 * copy paths), padding slots, N < T; mixed dtypes and same-dtype bit copies (NaN
 * payloads); strided views whose padding must stay untouched; requests of length 0, 1,
 * partial last page, exact page multiples and batches mixing them, with the tails of
 * partial pages and unused block_table entries poisoned; NZ == ND bit for bit and NZ
 * placement checked at hand-computed offsets; caches ending exactly at the last used
 * element, followed by an inaccessible page (any read past it faults); outputs of 16+
 * MiB (the non-temporal store paths, aligned and misaligned); thread-count
 * independence; empty inputs; the bad-input catalogue.
 *
 * A whole-allocation memcmp against an expected copy checks the values and that no
 * byte outside the written elements (padding, guard zones, other slots) changed.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/half.h"
#include "testutil.h"

/* ---------------------------------------------------------------- caches in the test */

typedef struct {
    tu_buf b;
    lk_kv_layout layout;
    int64_t nb, bs, H, D;
} tcache;

/* ND: [nb, bs, H*D] (nd4 = 0) or [nb, bs, H, D]; NZ: physical [nb, H*D/16, bs, 16].
 * perm = 1 stores the dims permuted: ND 3-D [nb, C, bs] (dim stride bs), ND 4-D HND
 * [nb, H, bs, D], NZ [nb, C/16, 16, bs] (lane stride bs). */
static tcache make_cache(lk_kv_layout L, lk_dtype dt, int64_t nb, int64_t bs, int64_t H, int64_t D,
                         int nd4, int pad, int perm) {
    tcache c;
    memset(&c, 0, sizeof c);
    c.layout = L, c.nb = nb, c.bs = bs, c.H = H, c.D = D;
    int64_t C = H * D;
    if (L == LK_KV_NZ)
        c.b = tu_alloc_perm(dt, 4, (int64_t[]){nb, C / 16, bs, 16}, perm ? (int[]){0, 1, 3, 2} : NULL, pad);
    else if (nd4)
        c.b = tu_alloc_perm(dt, 4, (int64_t[]){nb, bs, H, D}, perm ? (int[]){0, 2, 1, 3} : NULL, pad);
    else c.b = tu_alloc_perm(dt, 3, (int64_t[]){nb, bs, C}, perm ? (int[]){0, 2, 1} : NULL, pad);
    return c;
}

/* element offset of logical (page p, slot s, head h, dim d), from the header's formulas */
static int64_t tc_off(const tcache *c, int64_t p, int64_t s, int64_t h, int64_t d) {
    const int64_t *st = c->b.t.stride;
    int64_t cc = h * c->D + d;
    if (c->layout == LK_KV_NZ) return p * st[0] + (cc / 16) * st[1] + s * st[2] + (cc % 16) * st[3];
    if (c->b.t.ndim == 4) return p * st[0] + s * st[1] + h * st[2] + d * st[3];
    return p * st[0] + s * st[1] + cc * st[2];
}

static char *tc_ptr(const tcache *c, int64_t p, int64_t s, int64_t h, int64_t d) {
    return (char *)c->b.t.data + tc_off(c, p, s, h, d) * (int64_t)lk_dtype_size(c->b.t.dtype);
}

/* fill every logical element with uniform values (the rest stays NaN garbage) */
static void tc_fill(tcache *c, int64_t used_slots_of_last_page) {
    for (int64_t p = 0; p < c->nb; p++)
        for (int64_t s = 0; s < c->bs; s++) {
            if (p == c->nb - 1 && s >= used_slots_of_last_page) continue;
            for (int64_t h = 0; h < c->H; h++)
                for (int64_t d = 0; d < c->D; d++)
                    lk_store_f(tc_ptr(c, p, s, h, d), c->b.t.dtype, 0, (float)tu_uniform(-4, 4));
        }
}

/* *dst = round(*src): bit copy for the same dtype */
static void put(char *dst, lk_dtype dt, const char *src, lk_dtype st) {
    if (dt == st) memcpy(dst, src, lk_dtype_size(dt));
    else lk_store_f(dst, dt, 0, (float)(double)lk_load_f(src, st, 0));
}

static char *elem(const lk_tensor *t, int64_t off) {
    return (char *)t->data + off * (int64_t)lk_dtype_size(t->dtype);
}

/* prefill-like slots: runs of consecutive slots through pages in shuffled order, with
 * padding tokens and small jumps, so tokens come in groups of consecutive slots that
 * start and end anywhere in a page */
static void prefill_slots(tu_buf *sm, int64_t N, int64_t nb, int64_t bs) {
    int64_t *pages = malloc(sizeof(int64_t) * (size_t)nb), pos = tu_randint(0, bs - 1);
    for (int64_t i = 0; i < nb; i++) pages[i] = i;
    for (int64_t i = nb - 1; i > 0; i--) {
        int64_t j = tu_randint(0, i), x = pages[i];
        pages[i] = pages[j], pages[j] = x;
    }
    for (int64_t i = 0; i < N; i++) {
        if (tu_randint(0, 12) == 0) pos += tu_randint(1, 3);
        if (tu_randint(0, 8) == 0 || pos >= nb * bs) {
            tu_set(sm, i, -1);
            continue;
        }
        tu_set(sm, i, (double)(pages[pos / bs] * bs + pos % bs));
        pos++;
    }
    free(pages);
}

/* ---------------------------------------------------------------- concat_and_cache_mla */

typedef struct {
    lk_kv_layout layout;
    int two;                /* two cache buffers */
    int64_t bs, Dl, Dr, T, N;
    lk_dtype kt, pt, ct, ct2; /* kv_c, k_pe, cache (kv_c_cache), k_pe_cache */
    int pad, perm;
    lk_dtype st;            /* slot_mapping i32/i64 */
    int prefill;            /* prefill-like slots (else random) */
} mla_case;

/* expected caches: the initial ones with every token's entry written */
static void mla_expect(tcache *e1, tcache *e2, const tu_buf *kv, const tu_buf *pe, const tu_buf *sm,
                       int64_t Dl) {
    int64_t N = sm->t.shape[0];
    for (int64_t t = 0; t < N; t++) {
        int64_t slot = (int64_t)tu_get(sm, t);
        if (slot < 0) continue;
        int64_t p = slot / e1->bs, s = slot % e1->bs;
        for (int64_t d = 0; d < Dl; d++)
            put(tc_ptr(e1, p, s, 0, d), e1->b.t.dtype, elem(&kv->t, t * kv->t.stride[0] + d * kv->t.stride[1]),
                kv->t.dtype);
        for (int64_t d = 0; d < pe->t.shape[1]; d++)
            put(e2 ? tc_ptr(e2, p, s, 0, d) : tc_ptr(e1, p, s, 0, Dl + d), (e2 ? e2 : e1)->b.t.dtype,
                elem(&pe->t, t * pe->t.stride[0] + d * pe->t.stride[1]), pe->t.dtype);
    }
}

static void run_mla_case(const mla_case *m) {
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    int64_t nb = 2 * ((m->T + m->bs - 1) / m->bs) + 2;
    tu_buf kv = tu_alloc(m->kt, 2, (int64_t[]){m->T, m->Dl}, m->pad);
    tu_buf pe = tu_alloc(m->pt, 2, (int64_t[]){m->T, m->Dr}, m->pad);
    tu_buf sm = tu_alloc(m->st, 1, (int64_t[]){m->N}, m->pad);
    tu_fill_uniform(&kv, -3, 3);
    tu_fill_uniform(&pe, -3, 3);
    if (m->prefill) prefill_slots(&sm, m->N, nb, m->bs);
    else tu_random_slots(&sm, m->N, nb * m->bs, 1);
    int64_t D1 = m->two ? m->Dl : m->Dl + m->Dr;
    tcache c1 = make_cache(m->layout, m->ct, nb, m->bs, 1, D1, 0, m->pad, m->perm);
    tcache c2 = m->two ? make_cache(m->layout, m->ct2, nb, m->bs, 1, m->Dr, 0, m->pad, m->perm) : c1;
    tc_fill(&c1, m->bs);
    if (m->two) tc_fill(&c2, m->bs);
    tcache e1 = c1, e2 = c2;
    e1.b = tu_clone(&c1.b);
    if (m->two) e2.b = tu_clone(&c2.b);
    mla_expect(&e1, m->two ? &e2 : NULL, &kv, &pe, &sm, m->Dl);
    tu_buf r1 = {0}, r2 = {0};
    for (int ii = 0; ii < nisa; ii++) {
        lk_set_isa(isas[ii]);
        tcache w1 = c1, w2 = c2;
        w1.b = tu_clone(&c1.b);
        if (m->two) w2.b = tu_clone(&c2.b);
        tu_snapshot(&kv), tu_snapshot(&pe), tu_snapshot(&sm);
        lk_status st = lk_concat_and_cache_mla(&kv.t, &pe.t, &w1.b.t, m->two ? &w2.b.t : NULL, &sm.t, m->layout);
        int ok = st == LK_OK && tu_same_alloc(&w1.b, &e1.b) && (!m->two || tu_same_alloc(&w2.b, &e2.b)) &&
                 tu_intact(&kv) && tu_intact(&pe) && tu_intact(&sm);
        tu_check(ok, "concat_and_cache_mla %s %s %s bs=%lld Dl=%lld Dr=%lld T=%lld N=%lld kv_c=%s k_pe=%s cache=%s/%s pad=%d perm=%d prefill=%d %s",
                 lk_isa_name(isas[ii]), m->layout == LK_KV_NZ ? "NZ" : "ND", m->two ? "two" : "one",
                 (long long)m->bs, (long long)m->Dl, (long long)m->Dr, (long long)m->T, (long long)m->N,
                 lk_dtype_name(m->kt), lk_dtype_name(m->pt), lk_dtype_name(m->ct),
                 lk_dtype_name(m->two ? m->ct2 : m->ct), m->pad, m->perm, m->prefill, lk_last_error());
        if (ii == 0) {
            r1 = w1.b;
            r2 = w2.b;
        } else {
            tu_check(tu_same_alloc(&w1.b, &r1) && (!m->two || tu_same_alloc(&w2.b, &r2)),
                     "concat_and_cache_mla %s == ref bit for bit", lk_isa_name(isas[ii]));
            tu_free(&w1.b);
            if (m->two) tu_free(&w2.b);
        }
    }
    lk_set_isa(lk_isa_best());
    tu_free(&r1);
    if (m->two) tu_free(&r2), tu_free(&c2.b), tu_free(&e2.b);
    tu_free(&c1.b), tu_free(&e1.b), tu_free(&kv), tu_free(&pe), tu_free(&sm);
}

static void test_concat_cases(void) {
    const int64_t page[] = {1, 7, 16, 128};
    /* kv_c, k_pe, cache, k_pe_cache */
    const lk_dtype combos[][4] = {{LK_BF16, LK_BF16, LK_BF16, LK_BF16}, {LK_F32, LK_F32, LK_F32, LK_F32},
                                  {LK_F16, LK_F16, LK_F16, LK_F16},     {LK_F32, LK_BF16, LK_F16, LK_BF16},
                                  {LK_BF16, LK_F16, LK_F32, LK_F16}};
    int k = 0;
    for (int L = 0; L <= 1; L++)
        for (int two = 0; two <= 1; two++)
            for (int p = 0; p < 4; p++)
                for (int dims = 0; dims < 2; dims++)
                    for (int c = 0; c < 5; c++)
                        for (int pad = 0; pad <= 1; pad++, k++) {
                            mla_case m = {L ? LK_KV_NZ : LK_KV_ND, two, page[p], 512, 64, 37, 33,
                                          combos[c][0], combos[c][1], combos[c][2], combos[c][3], pad, 0,
                                          k & 1 ? LK_I32 : LK_I64, (k >> 1) & 1};
                            if (dims == 1) { /* odd dims: ND any; NZ one buffer: sum % 16; two: each % 16 */
                                m.Dl = L ? (two ? 16 : 5) : 5;
                                m.Dr = L ? (two ? 48 : 11) : 3;
                                m.T = 9, m.N = 9;
                            }
                            if (page[p] == 128 && dims == 0) m.T = 200, m.N = 150; /* spans 2 pages */
                            if (page[p] == 128 && c != 0 && c != 3) continue; /* time: 2 of the combos */
                            run_mla_case(&m);
                        }
    /* permuted caches (dim / lane stride != 1): the SIMD kernels hand them to ref */
    for (int L = 0; L <= 1; L++)
        for (int two = 0; two <= 1; two++) {
            mla_case m = {L ? LK_KV_NZ : LK_KV_ND, two, 7, 32, 16, 20, 17, LK_BF16, LK_F32, LK_BF16, LK_F16, 1, 1, LK_I64, two};
            run_mla_case(&m);
        }
    /* transposed kv_c (last-dim stride != 1) */
    {
        tu_buf kv = tu_alloc_perm(LK_F32, 2, (int64_t[]){5, 32}, (int[]){1, 0}, 0);
        tu_buf pe = tu_alloc(LK_F32, 2, (int64_t[]){5, 16}, 0);
        tu_buf sm = tu_alloc(LK_I64, 1, (int64_t[]){5}, 0);
        tu_fill_uniform(&kv, -1, 1), tu_fill_uniform(&pe, -1, 1);
        tu_random_slots(&sm, 5, 14, 1);
        tcache c = make_cache(LK_KV_NZ, LK_BF16, 2, 7, 1, 48, 0, 0, 0);
        tc_fill(&c, 7);
        tcache e = c;
        e.b = tu_clone(&c.b);
        mla_expect(&e, NULL, &kv, &pe, &sm, 32);
        lk_status st = lk_concat_and_cache_mla(&kv.t, &pe.t, &c.b.t, NULL, &sm.t, LK_KV_NZ);
        tu_check(st == LK_OK && tu_same_alloc(&c.b, &e.b), "concat_and_cache_mla transposed kv_c view");
        tu_free(&kv), tu_free(&pe), tu_free(&sm), tu_free(&c.b), tu_free(&e.b);
    }
}

/* ---------------------------------------------------------------- gather_cache */

typedef struct {
    lk_kv_layout layout;
    int nd4;      /* ND cache [nb, bs, H, D] (else [nb, bs, C]) */
    int out3;     /* out [S, H, D] (else [S, C]) */
    int64_t bs, H, D;
    int B;
    int64_t lens[8];
    lk_dtype ct, ot;
    int pad, perm;
} gather_case;

/* block table [B, max_pages] with distinct random pages for the pages read, garbage
 * (-1, huge) after them; returns the number of pages used, nb the cache size */
static tu_buf make_block_table(const int64_t *lens, int B, int64_t bs, int64_t *nb, int pad) {
    int64_t max_pages = 1, used = 0;
    for (int b = 0; b < B; b++) {
        int64_t p = (lens[b] + bs - 1) / bs;
        used += p;
        if (p + 1 > max_pages) max_pages = p + 1;
    }
    *nb = used + 2;
    int64_t *perm = tu_permutation(*nb);
    tu_buf bt = tu_alloc(LK_I32, 2, (int64_t[]){B, max_pages}, pad);
    int64_t k = 0;
    for (int b = 0; b < B; b++)
        for (int64_t p = 0; p < max_pages; p++)
            tu_set(&bt, b * max_pages + p, p < (lens[b] + bs - 1) / bs ? (double)perm[k++] : (p & 1 ? -1 : 1e9));
    free(perm);
    return bt;
}

/* expected out: garbage of a fresh out with each token's entry converted */
static void gather_expect(tu_buf *e, const tcache *c, const tu_buf *bt, const int64_t *lens, int B) {
    int64_t t = 0, mp = bt->t.shape[1];
    for (int b = 0; b < B; b++)
        for (int64_t j = 0; j < lens[b]; j++, t++) {
            int64_t page = (int64_t)tu_get(bt, b * mp + j / c->bs);
            for (int64_t h = 0; h < c->H; h++)
                for (int64_t d = 0; d < c->D; d++) {
                    int64_t flat = t * c->H * c->D + h * c->D + d;
                    put(elem(&e->t, tu_offset(&e->t, flat)), e->t.dtype, tc_ptr(c, page, j % c->bs, h, d),
                        c->b.t.dtype);
                }
        }
}

static int has_nan(const tu_buf *o) {
    int64_t n = tu_numel(o);
    for (int64_t i = 0; i < n; i++)
        if (isnan(tu_get(o, i))) return 1;
    return 0;
}

static void run_gather_case(const gather_case *g) {
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    int64_t nb, S = 0, C = g->H * g->D;
    for (int b = 0; b < g->B; b++) S += g->lens[b];
    tu_buf bt = make_block_table(g->lens, g->B, g->bs, &nb, g->pad);
    tu_buf sl = tu_alloc(LK_I32, 1, (int64_t[]){g->B}, g->pad);
    for (int b = 0; b < g->B; b++) tu_set(&sl, b, (double)g->lens[b]);
    tcache c = make_cache(g->layout, g->ct, nb, g->bs, g->H, g->D, g->nd4, g->pad, g->perm);
    /* only the slots the requests use hold values; partial-page tails and unused pages
     * keep the NaN garbage, so reading one shows up as NaN in out */
    int64_t mp = bt.t.shape[1];
    for (int b = 0; b < g->B; b++)
        for (int64_t j = 0; j < g->lens[b]; j++)
            for (int64_t h = 0; h < g->H; h++)
                for (int64_t d = 0; d < g->D; d++)
                    lk_store_f(tc_ptr(&c, (int64_t)tu_get(&bt, b * mp + j / g->bs), j % g->bs, h, d), g->ct, 0,
                               (float)tu_uniform(-4, 4));
    tu_buf eo = g->out3 ? tu_alloc(g->ot, 3, (int64_t[]){S, g->H, g->D}, g->pad)
                        : tu_alloc(g->ot, 2, (int64_t[]){S, C}, g->pad);
    gather_expect(&eo, &c, &bt, g->lens, g->B);
    tu_buf first = {0};
    for (int ii = 0; ii < nisa; ii++) {
        lk_set_isa(isas[ii]);
        tu_buf o = g->out3 ? tu_alloc(g->ot, 3, (int64_t[]){S, g->H, g->D}, g->pad)
                           : tu_alloc(g->ot, 2, (int64_t[]){S, C}, g->pad);
        tu_snapshot(&c.b), tu_snapshot(&bt), tu_snapshot(&sl);
        lk_status st = lk_gather_cache(&o.t, &c.b.t, &bt.t, &sl.t, g->layout);
        int ok = st == LK_OK && tu_same_alloc(&o, &eo) && !has_nan(&o) && tu_intact(&c.b) && tu_intact(&bt) &&
                 tu_intact(&sl);
        tu_check(ok, "gather_cache %s %s%s out%s bs=%lld H=%lld D=%lld B=%d S=%lld cache=%s out=%s pad=%d perm=%d %s",
                 lk_isa_name(isas[ii]), g->layout == LK_KV_NZ ? "NZ" : "ND", g->layout == LK_KV_NZ ? "" : g->nd4 ? "4" : "3",
                 g->out3 ? "3" : "2", (long long)g->bs, (long long)g->H, (long long)g->D, g->B, (long long)S,
                 lk_dtype_name(g->ct), lk_dtype_name(g->ot), g->pad, g->perm, lk_last_error());
        if (ii == 0) first = o;
        else {
            tu_check(tu_same_alloc(&o, &first), "gather_cache %s == ref bit for bit", lk_isa_name(isas[ii]));
            tu_free(&o);
        }
    }
    lk_set_isa(lk_isa_best());
    tu_free(&first), tu_free(&eo), tu_free(&c.b), tu_free(&bt), tu_free(&sl);
}

static void test_gather_cases(void) {
    const int64_t page[] = {1, 7, 16, 128};
    const lk_dtype combos[][2] = {/* cache, out */
                                  {LK_BF16, LK_BF16}, {LK_F32, LK_F32}, {LK_F16, LK_F16},
                                  {LK_BF16, LK_F32},  {LK_F32, LK_F16}, {LK_F16, LK_BF16}};
    /* views: layout, nd4, out3 */
    const int views[][3] = {{LK_KV_ND, 0, 0}, {LK_KV_ND, 1, 1}, {LK_KV_ND, 1, 0},
                            {LK_KV_ND, 0, 1}, {LK_KV_NZ, 0, 0}, {LK_KV_NZ, 0, 1}};
    int k = 0;
    for (int v = 0; v < 6; v++)
        for (int p = 0; p < 4; p++)
            for (int set = 0; set < 5; set++)
                for (int pad = 0; pad <= 1; pad++)
                    for (int cc = 0; cc < 2; cc++, k++) {
                        int64_t bs = page[p];
                        gather_case g = {views[v][0], views[v][1], views[v][2], bs, 1, 576, 1, {0}, 0, 0, pad, 0};
                        const lk_dtype *dt = combos[cc ? 1 + k % 5 : 0];
                        g.ct = dt[0], g.ot = dt[1];
                        if (set & 1) { /* small entries: ND 3 x 11 (33 = 4 x 8 + 1), NZ 2 x 24 */
                            g.H = g.layout == LK_KV_NZ ? 2 : 3;
                            g.D = g.layout == LK_KV_NZ ? 24 : 11;
                        }
                        switch (set) {
                        case 0: g.B = 1, g.lens[0] = 0; break;             /* empty request */
                        case 1: g.B = 1, g.lens[0] = 1; break;             /* one token */
                        case 2: g.B = 1, g.lens[0] = (bs < 128 ? 2 : 1) * bs + 3; break; /* partial last page */
                        case 3: g.B = 2, g.lens[0] = (bs < 128 ? 2 : 1) * bs, g.lens[1] = bs; break; /* exact pages */
                        default: /* mixed batch */
                            g.B = 6;
                            int64_t l[6] = {0, 5, bs, 1, 2 * bs + 1, 0};
                            memcpy(g.lens, l, sizeof l);
                        }
                        if (bs == 128 && set == 4) g.lens[4] = 129;
                        if (bs == 128 && cc == 1 && pad == 0) continue; /* time: mixed dtypes padded only */
                        run_gather_case(&g);
                    }
    /* permuted caches: HND 4-D (fast path, dim stride 1) and dim / lane stride != 1 (ref) */
    const int pviews[][2] = {{LK_KV_ND, 1}, {LK_KV_ND, 0}, {LK_KV_NZ, 0}};
    for (int v = 0; v < 3; v++) {
        gather_case g = {pviews[v][0], pviews[v][1], v == 0, 7, 2, 8, 3, {4, 0, 15}, LK_BF16, LK_F32, 1, 1};
        run_gather_case(&g);
    }
}

/* ---------------------------------------------------------------- NZ == ND */

/* the same tokens written through ND and NZ and gathered back are bit-identical; NZ
 * places them where the header's formula says */
static void test_nz_equals_nd(void) {
    int64_t T = 63, Dl = 512, Dr = 64, C = 576, bs = 7, nb = 9; /* every slot written */
    tu_buf kv = tu_alloc(LK_BF16, 2, (int64_t[]){T, Dl}, 0), pe = tu_alloc(LK_F32, 2, (int64_t[]){T, Dr}, 0);
    tu_buf sm = tu_alloc(LK_I64, 1, (int64_t[]){T}, 0);
    tu_fill_uniform(&kv, -2, 2), tu_fill_uniform(&pe, -2, 2);
    tu_random_slots(&sm, T, nb * bs, 0);
    tu_buf nd = tu_alloc(LK_BF16, 3, (int64_t[]){nb, bs, C}, 0);
    tu_buf nz = tu_alloc(LK_BF16, 4, (int64_t[]){nb, C / 16, bs, 16}, 0);
    lk_status s1 = lk_concat_and_cache_mla(&kv.t, &pe.t, &nd.t, NULL, &sm.t, LK_KV_ND);
    lk_status s2 = lk_concat_and_cache_mla(&kv.t, &pe.t, &nz.t, NULL, &sm.t, LK_KV_NZ);
    /* hand-computed placements: token t at slot, dim c -> ND (p*bs + s)*C + c,
     * NZ ((p*C/16 + c/16)*bs + s)*16 + c%16 on the contiguous buffers */
    const uint16_t *ndb = nd.t.data, *nzb = nz.t.data, *kvb = kv.t.data;
    int ok = s1 == LK_OK && s2 == LK_OK;
    int64_t picks[][2] = {{0, 0}, {0, 15}, {0, 16}, {3, 511}, {7, 512}, {11, 517}, {49, 575}, {20, 100}};
    for (int i = 0; i < 8 && ok; i++) {
        int64_t t = picks[i][0], c = picks[i][1], slot = (int64_t)tu_get(&sm, t), p = slot / bs, s = slot % bs;
        uint16_t want = c < Dl ? kvb[t * Dl + c] : lk_f32_to_bf16(((const float *)pe.t.data)[t * Dr + c - Dl]);
        ok = ndb[(p * bs + s) * C + c] == want && nzb[((p * (C / 16) + c / 16) * bs + s) * 16 + c % 16] == want;
    }
    tu_check(ok, "NZ and ND placement at hand-computed offsets");
    /* one request over all 63 slots, pages in a permuted order */
    int64_t lens[1] = {T};
    tu_buf bt = tu_alloc(LK_I32, 2, (int64_t[]){1, nb}, 0);
    for (int64_t p = 0; p < nb; p++) tu_set(&bt, p, (double)((p * 4) % nb)); /* a permutation (gcd 1) */
    tu_buf sl = tu_alloc(LK_I32, 1, (int64_t[]){1}, 0);
    tu_set(&sl, 0, (double)lens[0]);
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    for (int ii = 0; ii < nisa; ii++) {
        lk_set_isa(isas[ii]);
        tu_buf o1 = tu_alloc(LK_BF16, 2, (int64_t[]){T, C}, 0), o2 = tu_alloc(LK_BF16, 3, (int64_t[]){T, 1, C}, 0);
        s1 = lk_gather_cache(&o1.t, &nd.t, &bt.t, &sl.t, LK_KV_ND);
        s2 = lk_gather_cache(&o2.t, &nz.t, &bt.t, &sl.t, LK_KV_NZ);
        tu_check(s1 == LK_OK && s2 == LK_OK && tu_same_bits(&o1, &o2) && !has_nan(&o1),
                 "%s: gather from NZ == gather from ND, bit for bit", lk_isa_name(isas[ii]));
        tu_free(&o1), tu_free(&o2);
    }
    lk_set_isa(lk_isa_best());
    tu_free(&kv), tu_free(&pe), tu_free(&sm), tu_free(&nd), tu_free(&nz), tu_free(&bt), tu_free(&sl);
}

/* ---------------------------------------------------------------- bit copies */

/* same dtype is a bit copy: signalling NaN payloads and -0 survive both ops on every ISA */
static void test_bit_copy(void) {
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    const lk_dtype dts[3] = {LK_F32, LK_F16, LK_BF16};
    const uint32_t pat[3][4] = {{0x7f800001u, 0xffa00000u, 0x80000000u, 0x3f800001u},
                                {0x7c01u, 0xfd55u, 0x8000u, 0x3c01u},
                                {0x7f81u, 0xff85u, 0x8000u, 0x3f81u}};
    for (int di = 0; di < 3; di++)
        for (int L = 0; L <= 1; L++)
            for (int ii = 0; ii < nisa; ii++) {
                lk_set_isa(isas[ii]);
                lk_dtype dt = dts[di];
                size_t es = lk_dtype_size(dt);
                int64_t T = 3, Dl = 40, Dr = 8, C = 48, bs = 4, nb = 2;
                tu_buf kv = tu_alloc(dt, 2, (int64_t[]){T, Dl}, 0), pe = tu_alloc(dt, 2, (int64_t[]){T, Dr}, 0);
                for (int64_t i = 0; i < T * Dl; i++) memcpy((char *)kv.t.data + i * es, &pat[di][i % 4], es);
                for (int64_t i = 0; i < T * Dr; i++) memcpy((char *)pe.t.data + i * es, &pat[di][(i + 1) % 4], es);
                tu_buf sm = tu_alloc(LK_I32, 1, (int64_t[]){T}, 0);
                for (int64_t i = 0; i < T; i++) tu_set(&sm, i, (double)(5 - 2 * i)); /* 5, 3, 1 */
                tu_buf cache = L ? tu_alloc(dt, 4, (int64_t[]){nb, C / 16, bs, 16}, 0)
                                 : tu_alloc(dt, 3, (int64_t[]){nb, bs, C}, 0);
                lk_status s1 = lk_concat_and_cache_mla(&kv.t, &pe.t, &cache.t, NULL, &sm.t, (lk_kv_layout)L);
                /* gather request: slots 1..5 of pages 0, 1 -> rows 1, 3, 5 are tokens 2, 1, 0 */
                tu_buf bt = tu_alloc(LK_I32, 2, (int64_t[]){1, 2}, 0), sl = tu_alloc(LK_I32, 1, (int64_t[]){1}, 0);
                tu_set(&bt, 0, 0), tu_set(&bt, 1, 1), tu_set(&sl, 0, 6);
                tu_buf o = tu_alloc(dt, 2, (int64_t[]){6, C}, 0);
                lk_status s2 = lk_gather_cache(&o.t, &cache.t, &bt.t, &sl.t, (lk_kv_layout)L);
                int ok = s1 == LK_OK && s2 == LK_OK;
                for (int64_t t = 0; t < T && ok; t++)
                    for (int64_t c = 0; c < C && ok; c++) {
                        const char *want = c < Dl ? (char *)kv.t.data + (t * Dl + c) * es
                                                  : (char *)pe.t.data + (t * Dr + c - Dl) * es;
                        ok = memcmp((char *)o.t.data + ((5 - 2 * t) * C + c) * es, want, es) == 0;
                    }
                tu_check(ok, "%s %s %s: same-dtype copies keep every bit (sNaN payloads, -0)",
                         lk_isa_name(isas[ii]), lk_dtype_name(dt), L ? "NZ" : "ND");
                tu_free(&kv), tu_free(&pe), tu_free(&sm), tu_free(&cache), tu_free(&bt), tu_free(&sl), tu_free(&o);
            }
    lk_set_isa(lk_isa_best());
}

/* ---------------------------------------------------------------- exact allocations */

/* `bytes` whose end is the start of an inaccessible (PROT_NONE) region of >= guard
 * bytes: any access past the end faults, in every build, and no other allocation can
 * sit there (the views' nominal extent reaches into it, so overlap checks stay exact) */
typedef struct {
    char *map;
    size_t body, guard;
} tight_buf;

static void *tight_alloc(tight_buf *g, size_t bytes, size_t guard) {
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    g->body = (bytes + pg - 1) / pg * pg;
    g->guard = (guard + pg - 1) / pg * pg;
    void *p = NULL;
    if (posix_memalign(&p, pg, g->body + g->guard)) abort();
    g->map = p;
    if (mprotect(g->map + g->body, g->guard, PROT_NONE)) abort();
    return g->map + g->body - bytes;
}

static void tight_free(tight_buf *g) {
    mprotect(g->map + g->body, g->guard, PROT_READ | PROT_WRITE);
    free(g->map);
}

/* Caches allocated to end exactly at the last element the op touches: any access past
 * it faults. Gather: one request whose last page is the last block and is partial;
 * concat: the highest slot written is the last slot allocated. */
static void test_tight_allocation(void) {
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    for (int L = 0; L <= 1; L++)
        for (int ii = 0; ii < nisa; ii++) {
            lk_set_isa(isas[ii]);
            int64_t C = 576, bs = 16, nb = 3, len = 2 * bs + 5, r = len - 2 * bs; /* 5 slots of the last page */
            int64_t n_elems = L ? ((nb - 1) * (C / 16) + C / 16 - 1) * bs * 16 + (r - 1) * 16 + 16
                                : ((nb - 1) * bs + r) * C;
            tight_buf g;
            uint16_t *cache = tight_alloc(&g, (size_t)n_elems * 2, (size_t)(bs * C * 2));
            for (int64_t i = 0; i < n_elems; i++) cache[i] = lk_f32_to_bf16((float)tu_uniform(-1, 1));
            if (L) /* NaN in the last page's tail slots (inside the allocation, before its end) */
                for (int64_t k = 0; k < C / 16 - 1; k++)
                    for (int64_t s = r; s < bs; s++)
                        for (int l = 0; l < 16; l++) cache[(((nb - 1) * (C / 16) + k) * bs + s) * 16 + l] = 0x7fc0;
            lk_tensor tc = L ? lk_tensor_make(cache, LK_BF16, 4, (int64_t[]){nb, C / 16, bs, 16})
                             : lk_tensor_make(cache, LK_BF16, 3, (int64_t[]){nb, bs, C});
            int32_t bt[4] = {1, 0, 2, -1}, sl[1] = {(int32_t)len};
            lk_tensor tbt = lk_tensor_make(bt, LK_I32, 2, (int64_t[]){1, 4});
            lk_tensor tsl = lk_tensor_make(sl, LK_I32, 1, (int64_t[]){1});
            tu_buf o = tu_alloc(LK_F32, 2, (int64_t[]){len, C}, 0);
            lk_status st = lk_gather_cache(&o.t, &tc, &tbt, &tsl, (lk_kv_layout)L);
            int ok = st == LK_OK && !has_nan(&o);
            /* last token: page 2 slot r - 1 */
            for (int64_t c = 0; c < C && ok; c++) {
                int64_t off = L ? ((2 * (C / 16) + c / 16) * bs + r - 1) * 16 + c % 16 : (2 * bs + r - 1) * C + c;
                ok = tu_get(&o, (len - 1) * C + c) == (double)lk_bf16_to_f32(cache[off]);
            }
            tu_check(ok, "%s gather %s from a cache ending at the last used slot (%s)", lk_isa_name(isas[ii]),
                     L ? "NZ" : "ND", lk_last_error());
            /* concat into the same tight cache: slots up to the last allocated one */
            int64_t T = 4, slots[4] = {2 * bs + r - 1, 0, -1, bs + 3};
            tu_buf kv = tu_alloc(LK_F32, 2, (int64_t[]){T, 512}, 0), pe = tu_alloc(LK_F32, 2, (int64_t[]){T, 64}, 0);
            tu_fill_uniform(&kv, -1, 1), tu_fill_uniform(&pe, -1, 1);
            lk_tensor tsm = lk_tensor_make(slots, LK_I64, 1, (int64_t[]){T});
            st = lk_concat_and_cache_mla(&kv.t, &pe.t, &tc, NULL, &tsm, (lk_kv_layout)L);
            int64_t last = L ? ((2 * (C / 16) + 35) * bs + r - 1) * 16 + 15 : (2 * bs + r - 1) * C + 575;
            ok = st == LK_OK && cache[last] == lk_f32_to_bf16(((float *)pe.t.data)[63]);
            tu_check(ok, "%s concat %s into a cache ending at the last written slot", lk_isa_name(isas[ii]),
                     L ? "NZ" : "ND");
            tu_free(&o), tu_free(&kv), tu_free(&pe);
            tight_free(&g);
        }
    lk_set_isa(lk_isa_best());
}

/* ---------------------------------------------------------------- large outputs */

/* Outputs of 16 MiB or more take the non-temporal store path: same bits as ref, for a
 * same-dtype and a converting copy, into an aligned and a misaligned (by one element)
 * destination. */
static unsigned char *zalloc64(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes)) abort();
    memset(p, 0, bytes);
    return p;
}

static void test_streaming(void) {
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    int64_t T = 16384, C = 576, bs = 128, nb = T / bs + 1;
    float *kv = malloc(sizeof(float) * (size_t)(T * C));
    for (int64_t i = 0; i < T * C; i++) kv[i] = (float)tu_uniform(-3, 3);
    lk_tensor tkv = {kv, LK_F32, 2, {T, 512}, {C, 1}}, tpe = {kv + 512, LK_F32, 2, {T, 64}, {C, 1}};
    int64_t *slots = malloc(sizeof(int64_t) * (size_t)T);
    for (int64_t t = 0; t < T; t++) slots[t] = ((t / bs + 7) % nb) * bs + t % bs;
    lk_tensor tsm = lk_tensor_make(slots, LK_I64, 1, &T);
    int32_t bt[2][64], sl[2] = {8192, 8192};
    for (int b = 0; b < 2; b++)
        for (int p = 0; p < 64; p++) bt[b][p] = (int32_t)((b * 64 + p + 7) % nb);
    lk_tensor tbt = lk_tensor_make(bt, LK_I32, 2, (int64_t[]){2, 64}), tsl = lk_tensor_make(sl, LK_I32, 1, (int64_t[]){2});
    size_t cache_bytes = (size_t)(nb * bs * C) * 2 + 128, out_bytes = (size_t)(T * C) * 2 + 128;
    for (int L = tu_emulated(); L <= 1; L++) /* emulated: NZ alone (its 32-byte chunk streams) */
        for (int mis = 0; mis <= 1; mis++) {
            unsigned char *rc = NULL, *ro = NULL;
            for (int ii = 0; ii < nisa; ii++) {
                lk_set_isa(isas[ii]);
                unsigned char *cache = zalloc64(cache_bytes), *out = zalloc64(out_bytes);
                /* mis: the cache starts one element off (concat streams misaligned), else out */
                uint16_t *cd = (uint16_t *)(cache + 64) + mis, *od = (uint16_t *)(out + 64) + !mis;
                lk_tensor tc = L ? lk_tensor_make(cd, LK_BF16, 4, (int64_t[]){nb, C / 16, bs, 16})
                                 : lk_tensor_make(cd, LK_BF16, 3, (int64_t[]){nb, bs, C});
                lk_tensor to = lk_tensor_make(od, LK_BF16, 2, (int64_t[]){T, C});
                lk_status s1 = lk_concat_and_cache_mla(&tkv, &tpe, &tc, NULL, &tsm, (lk_kv_layout)L);
                lk_status s2 = lk_gather_cache(&to, &tc, &tbt, &tsl, (lk_kv_layout)L);
                if (ii == 0) {
                    rc = cache, ro = out;
                    tu_check(s1 == LK_OK && s2 == LK_OK, "ref: 18 MiB concat + gather %s %d", L ? "NZ" : "ND", mis);
                    continue;
                }
                tu_check(s1 == LK_OK && s2 == LK_OK && !memcmp(cache, rc, cache_bytes) && !memcmp(out, ro, out_bytes),
                         "%s: 18 MiB concat (f32 -> bf16) + gather (bf16 -> bf16) %s, streamed, %s misaligned, == ref",
                         lk_isa_name(isas[ii]), L ? "NZ" : "ND", mis ? "cache" : "out");
                free(cache), free(out);
            }
            free(rc), free(ro);
        }
    lk_set_isa(lk_isa_best());
    free(kv), free(slots);
}

/* ---------------------------------------------------------------- threads, empty */

static void test_threads(void) {
    int64_t T = 1024, bs = 16, nb = 80, C = 576;
    tu_buf kv = tu_alloc(LK_BF16, 2, (int64_t[]){T, 512}, 0), pe = tu_alloc(LK_BF16, 2, (int64_t[]){T, 64}, 0);
    tu_buf sm = tu_alloc(LK_I32, 1, (int64_t[]){T}, 0);
    tu_fill_uniform(&kv, -2, 2), tu_fill_uniform(&pe, -2, 2);
    tu_random_slots(&sm, T, nb * bs, 1);
    int32_t bt[2][40], sl[2] = {500, 450};
    for (int b = 0; b < 2; b++)
        for (int p = 0; p < 40; p++) bt[b][p] = (int32_t)((b * 40 + p * 7) % nb);
    lk_tensor tbt = lk_tensor_make(bt, LK_I32, 2, (int64_t[]){2, 40}), tsl = lk_tensor_make(sl, LK_I32, 1, (int64_t[]){2});
    for (int L = 0; L <= 1; L++) {
        tu_buf c1 = {0}, o1 = {0};
        tu_buf c0 = L ? tu_alloc(LK_BF16, 4, (int64_t[]){nb, C / 16, bs, 16}, 0)
                      : tu_alloc(LK_BF16, 3, (int64_t[]){nb, bs, C}, 0);
        tu_fill_uniform(&c0, -1, 1);
        for (int nt = 1; nt <= 4; nt++) {
            lk_set_num_threads(nt);
            tu_buf c = tu_clone(&c0);
            tu_buf o = tu_alloc(LK_F32, 2, (int64_t[]){950, C}, 0);
            lk_status s1 = lk_concat_and_cache_mla(&kv.t, &pe.t, &c.t, NULL, &sm.t, (lk_kv_layout)L);
            lk_status s2 = lk_gather_cache(&o.t, &c.t, &tbt, &tsl, (lk_kv_layout)L);
            if (nt == 1) {
                c1 = c, o1 = o;
                tu_check(s1 == LK_OK && s2 == LK_OK, "threads: %s ops succeed", L ? "NZ" : "ND");
                continue;
            }
            tu_check(s1 == LK_OK && s2 == LK_OK && tu_same_alloc(&c, &c1) && tu_same_alloc(&o, &o1),
                     "%s concat + gather bitwise identical with %d threads", L ? "NZ" : "ND", nt);
            tu_free(&c), tu_free(&o);
        }
        tu_free(&c1), tu_free(&o1), tu_free(&c0);
    }
    lk_set_num_threads(0);
    tu_free(&kv), tu_free(&pe), tu_free(&sm);
}

static void test_empty(void) {
    tu_buf kv = tu_alloc(LK_F32, 2, (int64_t[]){3, 16}, 0), pe = tu_alloc(LK_F32, 2, (int64_t[]){3, 16}, 0);
    tu_buf c = tu_alloc(LK_BF16, 3, (int64_t[]){2, 4, 32}, 0);
    tu_fill_uniform(&kv, -1, 1), tu_fill_uniform(&pe, -1, 1), tu_fill_uniform(&c, -1, 1);
    tu_buf sm0 = tu_alloc(LK_I64, 1, (int64_t[]){0}, 0), smp = tu_alloc(LK_I32, 1, (int64_t[]){3}, 0);
    for (int i = 0; i < 3; i++) tu_set(&smp, i, -1 - i);
    tu_snapshot(&c);
    lk_status st = lk_concat_and_cache_mla(&kv.t, &pe.t, &c.t, NULL, &sm0.t, LK_KV_ND);
    tu_check(st == LK_OK && tu_intact(&c), "concat N = 0 is a no-op");
    st = lk_concat_and_cache_mla(&kv.t, &pe.t, &c.t, NULL, &smp.t, LK_KV_ND);
    tu_check(st == LK_OK && tu_intact(&c), "concat all padding slots is a no-op (%s)", lk_last_error());
    lk_tensor c00 = c.t;
    c00.shape[0] = c00.shape[1] = 0; /* a cache of 0 pages of 0 slots */
    st = lk_concat_and_cache_mla(&kv.t, &pe.t, &c00, NULL, &smp.t, LK_KV_ND);
    tu_check(st == LK_OK && tu_intact(&c), "concat all padding into an empty cache is a no-op (%s)", lk_last_error());
    lk_tensor kv0 = kv.t, pe0 = pe.t;
    kv0.shape[0] = pe0.shape[0] = 0;
    st = lk_concat_and_cache_mla(&kv0, &pe0, &c.t, NULL, &sm0.t, LK_KV_ND);
    tu_check(st == LK_OK && tu_intact(&c), "concat T = 0 is a no-op");
    /* gather: B = 0, and requests all empty */
    tu_buf o = tu_alloc(LK_F32, 2, (int64_t[]){0, 32}, 0);
    int32_t bt[2][2] = {{-1, -1}, {5, 9}}, sl[2] = {0, 0};
    lk_tensor tbt = lk_tensor_make(bt, LK_I32, 2, (int64_t[]){2, 2}), tsl = lk_tensor_make(sl, LK_I32, 1, (int64_t[]){2});
    tu_snapshot(&o);
    st = lk_gather_cache(&o.t, &c.t, &tbt, &tsl, LK_KV_ND);
    tu_check(st == LK_OK && tu_intact(&o) && tu_intact(&c), "gather of empty requests is a no-op (%s)", lk_last_error());
    tbt.shape[0] = tsl.shape[0] = 0;
    st = lk_gather_cache(&o.t, &c.t, &tbt, &tsl, LK_KV_ND);
    tu_check(st == LK_OK && tu_intact(&o), "gather B = 0 is a no-op (%s)", lk_last_error());
    tu_free(&kv), tu_free(&pe), tu_free(&c), tu_free(&sm0), tu_free(&smp), tu_free(&o);
}

/* ---------------------------------------------------------------- bad inputs */

static void test_concat_bad(void) {
    int64_t T = 6, bs = 4, nb = 3;
    tu_buf kv = tu_alloc(LK_F32, 2, (int64_t[]){T, 20}, 0), pe = tu_alloc(LK_F32, 2, (int64_t[]){T, 12}, 0);
    tu_buf sm = tu_alloc(LK_I64, 1, (int64_t[]){T}, 0), sm32 = tu_alloc(LK_I32, 1, (int64_t[]){200}, 0);
    tu_buf cbig = tu_alloc(LK_BF16, 3, (int64_t[]){4, 64, 32}, 0);
    tu_buf c = tu_alloc(LK_BF16, 3, (int64_t[]){nb, bs, 32}, 0), nz = tu_alloc(LK_BF16, 4, (int64_t[]){nb, 2, bs, 16}, 0);
    tu_buf c2 = tu_alloc(LK_F16, 3, (int64_t[]){nb, bs, 12}, 0);
    tu_buf big = tu_alloc(LK_F32, 1, (int64_t[]){4096}, 0);
    tu_fill_uniform(&kv, -1, 1), tu_fill_uniform(&pe, -1, 1), tu_fill_uniform(&c, -1, 1);
    tu_fill_uniform(&nz, -1, 1), tu_fill_uniform(&c2, -1, 1), tu_fill_uniform(&big, -1, 1);
    for (int i = 0; i < T; i++) tu_set(&sm, i, i == 2 ? -1 : 2 * i);
    /* 50 padding slots, then 150 distinct slots but the last repeats slot 7 */
    for (int i = 0; i < 200; i++) tu_set(&sm32, i, i < 50 ? -1 : i == 199 ? 7 : i - 50);
    tu_fill_uniform(&cbig, -1, 1);
    struct bad {
        const char *what, *arg;
        lk_status want;
        lk_tensor kv, pe, c1, c2, sm;
        int two;
        lk_kv_layout L;
    } cases[40];
    int n = 0;
#define CASE(W, A, S, KV, PE, C1, C2, SM, TWO, L) cases[n++] = (struct bad){W, A, S, KV, PE, C1, C2, SM, TWO, L}
    lk_tensor t, u;
    t = kv.t; t.ndim = 1;
    CASE("kv_c rank 1", "kv_c", LK_ERR_RANK, t, pe.t, c.t, c.t, sm.t, 0, LK_KV_ND);
    t = kv.t; t.dtype = LK_I32;
    CASE("kv_c int dtype", "kv_c", LK_ERR_DTYPE, t, pe.t, c.t, c.t, sm.t, 0, LK_KV_ND);
    t = kv.t; t.data = NULL;
    CASE("kv_c NULL data", "kv_c", LK_ERR_NULL, t, pe.t, c.t, c.t, sm.t, 0, LK_KV_ND);
    t = kv.t; t.stride[0] = INT64_MAX / 2;
    CASE("kv_c stride overflow", "kv_c", LK_ERR_OVERFLOW, t, pe.t, c.t, c.t, sm.t, 0, LK_KV_ND);
    t = pe.t; t.shape[0] = 5;
    CASE("k_pe tokens != kv_c tokens", "k_pe", LK_ERR_SHAPE, kv.t, t, c.t, c.t, sm.t, 0, LK_KV_ND);
    t = sm.t; t.dtype = LK_F32;
    CASE("slot_mapping f32", "slot_mapping", LK_ERR_DTYPE, kv.t, pe.t, c.t, c.t, t, 0, LK_KV_ND);
    t = sm.t; t.ndim = 2; t.shape[1] = 1; t.stride[1] = 1;
    CASE("slot_mapping rank 2", "slot_mapping", LK_ERR_RANK, kv.t, pe.t, c.t, c.t, t, 0, LK_KV_ND);
    t = kv.t; t.shape[0] = 5; u = pe.t; u.shape[0] = 5;
    CASE("slot_mapping N > T", "slot_mapping", LK_ERR_SHAPE, t, u, c.t, c.t, sm.t, 0, LK_KV_ND);
    t = c.t; t.shape[2] = 31;
    CASE("cache last dim != Dl + Dr", "kv_c_cache", LK_ERR_SHAPE, kv.t, pe.t, t, c.t, sm.t, 0, LK_KV_ND);
    t = c.t; t.dtype = LK_I32;
    CASE("cache int dtype", "kv_c_cache", LK_ERR_DTYPE, kv.t, pe.t, t, c.t, sm.t, 0, LK_KV_ND);
    t = c.t; t.ndim = 2;
    CASE("cache rank 2", "kv_c_cache", LK_ERR_RANK, kv.t, pe.t, t, c.t, sm.t, 0, LK_KV_ND);
    t = c.t; t.stride[0] = 0;
    CASE("cache pages overlap themselves", "kv_c_cache", LK_ERR_ALIAS, kv.t, pe.t, t, c.t, sm.t, 0, LK_KV_ND);
    CASE("bad layout", "layout", LK_ERR_VALUE, kv.t, pe.t, c.t, c.t, sm.t, 0, (lk_kv_layout)7);
    CASE("ND cache passed as NZ", "kv_c_cache", LK_ERR_RANK, kv.t, pe.t, c.t, c.t, sm.t, 0, LK_KV_NZ);
    t = nz.t; t.shape[1] = 3;
    CASE("NZ cache C/16 mismatch", "kv_c_cache", LK_ERR_SHAPE, kv.t, pe.t, t, c.t, sm.t, 0, LK_KV_NZ);
    t = kv.t; t.shape[1] = 19; /* 19 + 12 = 31: not a multiple of 16 */
    CASE("NZ one buffer Dl + Dr % 16", "kv_c_cache", LK_ERR_SHAPE, t, pe.t, nz.t, c.t, sm.t, 0, LK_KV_NZ);
    t = nz.t; t.shape[1] = 1; u = kv.t; u.shape[1] = 16;
    CASE("NZ two buffers Dr % 16", "k_pe_cache", LK_ERR_SHAPE, u, pe.t, t, nz.t, sm.t, 1, LK_KV_NZ);
    t = c.t; t.shape[2] = 20; u = c2.t; u.shape[0] = 2;
    CASE("two caches num_blocks differ", "k_pe_cache", LK_ERR_SHAPE, kv.t, pe.t, t, u, sm.t, 1, LK_KV_ND);
    t = c.t; t.shape[2] = 20; u = c2.t; u.shape[2] = 11;
    CASE("k_pe_cache dim != Dr", "k_pe_cache", LK_ERR_SHAPE, kv.t, pe.t, t, u, sm.t, 1, LK_KV_ND);
    t = c.t; t.shape[2] = 20; u = c.t; u.shape[2] = 12;
    CASE("two caches overlap", "k_pe_cache", LK_ERR_ALIAS, kv.t, pe.t, t, u, sm.t, 1, LK_KV_ND);
    { /* cache over the inputs' memory */
        lk_tensor cb = big.t, kb = big.t;
        cb.ndim = 3, cb.shape[0] = nb, cb.shape[1] = bs, cb.shape[2] = 32, cb.stride[0] = 128, cb.stride[1] = 32, cb.stride[2] = 1;
        cb.dtype = LK_F32;
        kb.ndim = 2, kb.shape[0] = T, kb.shape[1] = 20, kb.stride[0] = 20, kb.stride[1] = 1;
        kb.data = (float *)big.t.data + 300;
        CASE("cache overlaps kv_c", "kv_c_cache", LK_ERR_ALIAS, kb, pe.t, cb, c.t, sm.t, 0, LK_KV_ND);
        lk_tensor sb = big.t;
        sb.dtype = LK_I32, sb.shape[0] = T, sb.data = (float *)big.t.data + 200;
        CASE("cache overlaps slot_mapping", "kv_c_cache", LK_ERR_ALIAS, kv.t, pe.t, cb, c.t, sb, 0, LK_KV_ND);
    }
    t = sm.t;
    CASE("slot beyond the cache", "slot_mapping", LK_ERR_INDEX, kv.t, pe.t, c.t, c.t, t, 0, LK_KV_ND);
    CASE("duplicate slot", "slot_mapping", LK_ERR_INDEX, kv.t, pe.t, c.t, c.t, t, 0, LK_KV_ND);
    t = kv.t; t.shape[0] = 200; t.stride[0] = 0; u = pe.t; u.shape[0] = 200; u.stride[0] = 0;
    CASE("duplicate slot among 150 (heap check)", "slot_mapping", LK_ERR_INDEX, t, u, cbig.t, c.t, sm32.t, 0, LK_KV_ND);
#undef CASE
    /* value edits by case: slot beyond (sm[3] = nb * bs), duplicate (sm[1] = sm[3] = 6) */
    for (int i = 0; i < n; i++) {
        tu_set(&sm, 1, 2);
        tu_set(&sm, 3, 6);
        if (!strcmp(cases[i].what, "slot beyond the cache")) tu_set(&sm, 3, (double)(nb * bs));
        if (!strcmp(cases[i].what, "duplicate slot")) tu_set(&sm, 1, 6);
        tu_buf *all[] = {&kv, &pe, &sm, &sm32, &c, &nz, &c2, &big, &cbig};
        for (int k = 0; k < 9; k++) tu_snapshot(all[k]);
        lk_status st = lk_concat_and_cache_mla(&cases[i].kv, &cases[i].pe, &cases[i].c1,
                                               cases[i].two ? &cases[i].c2 : NULL, &cases[i].sm, cases[i].L);
        const char *msg = lk_last_error();
        int intact = 1;
        for (int k = 0; k < 9; k++) intact &= tu_intact(all[k]);
        tu_check(st == cases[i].want && strstr(msg, cases[i].arg) && strstr(msg, "lk_concat_and_cache_mla") && intact,
                 "concat bad input '%s' -> %s (%s)", cases[i].what, lk_status_str(st), msg);
    }
    tu_set(&sm, 1, 2);
    tu_set(&sm, 3, 6);
    lk_status st = lk_concat_and_cache_mla(&kv.t, NULL, &c.t, NULL, &sm.t, LK_KV_ND);
    tu_check(st == LK_ERR_NULL && strstr(lk_last_error(), "k_pe"), "concat NULL k_pe pointer");
    st = lk_concat_and_cache_mla(&kv.t, &pe.t, &c.t, NULL, &sm.t, LK_KV_ND);
    tu_check(st == LK_OK && lk_last_error()[0] == 0, "concat valid call after the bad ones clears the error");
    tu_buf *all[] = {&kv, &pe, &sm, &sm32, &c, &nz, &c2, &big, &cbig};
    for (int k = 0; k < 9; k++) tu_free(all[k]);
}

static void test_gather_bad(void) {
    int64_t bs = 4, nb = 5, C = 32;
    tu_buf c = tu_alloc(LK_BF16, 3, (int64_t[]){nb, bs, C}, 0), c4 = tu_alloc(LK_BF16, 4, (int64_t[]){nb, bs, 2, 16}, 0);
    tu_buf nz = tu_alloc(LK_BF16, 4, (int64_t[]){nb, 2, bs, 16}, 0);
    tu_buf o = tu_alloc(LK_F32, 2, (int64_t[]){9, C}, 0), o3 = tu_alloc(LK_F32, 3, (int64_t[]){9, 2, 16}, 0);
    tu_buf bt = tu_alloc(LK_I32, 2, (int64_t[]){2, 3}, 0), sl = tu_alloc(LK_I32, 1, (int64_t[]){2}, 0);
    tu_buf bt64 = tu_alloc(LK_I64, 2, (int64_t[]){2, 3}, 0), sl64 = tu_alloc(LK_I64, 1, (int64_t[]){2}, 0);
    tu_fill_uniform(&c, -1, 1), tu_fill_uniform(&c4, -1, 1), tu_fill_uniform(&nz, -1, 1);
    tu_fill_uniform(&o, -1, 1), tu_fill_uniform(&o3, -1, 1);
    int32_t btv[6] = {3, 1, -1, 0, 4, 77}; /* request 0: 5 tokens = pages 3, 1; request 1: 4 tokens = page 0 */
    for (int i = 0; i < 6; i++) tu_set(&bt, i, btv[i]), tu_set(&bt64, i, btv[i]);
    tu_set(&sl, 0, 5), tu_set(&sl, 1, 4), tu_set(&sl64, 0, 5), tu_set(&sl64, 1, 4);
    struct bad {
        const char *what, *arg;
        lk_status want;
        lk_tensor o, c, bt, sl;
        lk_kv_layout L;
        int set_len, len0, set_bt, bt_val; /* value edits applied for this case only */
    } cases[40];
    int n = 0;
#define CASE(W, A, S, O, CC, BT, SL, L) cases[n++] = (struct bad){W, A, S, O, CC, BT, SL, L, 0, 0, 0, 0}
    lk_tensor t;
    t = o.t; t.ndim = 1;
    CASE("out rank 1", "out", LK_ERR_RANK, t, c.t, bt.t, sl.t, LK_KV_ND);
    t = o.t; t.dtype = LK_I64;
    CASE("out int dtype", "out", LK_ERR_DTYPE, t, c.t, bt.t, sl.t, LK_KV_ND);
    t = o.t; t.shape[0] = 10;
    CASE("out rows != sum(seq_lens)", "out", LK_ERR_SHAPE, t, c.t, bt.t, sl.t, LK_KV_ND);
    t = o.t; t.shape[0] = 8;
    CASE("out rows < sum(seq_lens)", "out", LK_ERR_SHAPE, t, c.t, bt.t, sl.t, LK_KV_ND);
    t = o.t; t.shape[1] = 31;
    CASE("out dim != cache dim", "cache", LK_ERR_SHAPE, t, c.t, bt.t, sl.t, LK_KV_ND);
    t = o.t; t.stride[0] = 16;
    CASE("out rows overlap", "out", LK_ERR_ALIAS, t, c.t, bt.t, sl.t, LK_KV_ND);
    t = o.t; t.data = NULL;
    CASE("out NULL data", "out", LK_ERR_NULL, t, c.t, bt.t, sl.t, LK_KV_ND);
    t = c.t; t.ndim = 2;
    CASE("cache rank 2", "cache", LK_ERR_RANK, o.t, t, bt.t, sl.t, LK_KV_ND);
    t = c.t; t.dtype = LK_I32;
    CASE("cache int dtype", "cache", LK_ERR_DTYPE, o.t, t, bt.t, sl.t, LK_KV_ND);
    CASE("out [S, H, D] vs 4-D cache heads", "cache", LK_ERR_SHAPE, o3.t, ((lk_tensor){c4.t.data, LK_BF16, 4, {nb, bs, 4, 8}, {128, 32, 8, 1}}), bt.t, sl.t, LK_KV_ND);
    t = o.t; t.shape[1] = 24; t.stride[0] = 24;
    CASE("out [S, C] vs 4-D cache H x D", "cache", LK_ERR_SHAPE, t, c4.t, bt.t, sl.t, LK_KV_ND);
    t = o3.t; t.shape[2] = 8;
    CASE("out [S, H, D] vs 3-D cache C", "cache", LK_ERR_SHAPE, t, c.t, bt.t, sl.t, LK_KV_ND);
    CASE("bad layout", "layout", LK_ERR_VALUE, o.t, c.t, bt.t, sl.t, (lk_kv_layout)-1);
    t = nz.t; t.shape[3] = 8;
    CASE("NZ lanes != 16", "cache", LK_ERR_SHAPE, o.t, t, bt.t, sl.t, LK_KV_NZ);
    t = o.t; t.shape[1] = 24; t.stride[0] = 24;
    CASE("NZ C % 16", "cache", LK_ERR_SHAPE, t, nz.t, bt.t, sl.t, LK_KV_NZ);
    CASE("block_table i64", "block_table", LK_ERR_DTYPE, o.t, c.t, bt64.t, sl.t, LK_KV_ND);
    CASE("seq_lens i64", "seq_lens", LK_ERR_DTYPE, o.t, c.t, bt.t, sl64.t, LK_KV_ND);
    t = bt.t; t.ndim = 1;
    CASE("block_table rank 1", "block_table", LK_ERR_RANK, o.t, c.t, t, sl.t, LK_KV_ND);
    t = sl.t; t.shape[0] = 1;
    CASE("seq_lens B != block_table B", "seq_lens", LK_ERR_SHAPE, o.t, c.t, bt.t, t, LK_KV_ND);
    { /* out over the cache / the block table */
        lk_tensor ob = c.t;
        ob.ndim = 2, ob.shape[0] = 9, ob.shape[1] = C, ob.stride[0] = C, ob.stride[1] = 1;
        ob.data = (uint16_t *)c.t.data + 100;
        CASE("out overlaps cache", "out", LK_ERR_ALIAS, ob, c.t, bt.t, sl.t, LK_KV_ND);
        lk_tensor bo = bt.t;
        bo.data = o.t.data;
        CASE("out overlaps block_table", "out", LK_ERR_ALIAS, o.t, c.t, bo, sl.t, LK_KV_ND);
    }
    CASE("seq_lens negative", "seq_lens", LK_ERR_INDEX, o.t, c.t, bt.t, sl.t, LK_KV_ND);
    cases[n - 1].set_len = 1, cases[n - 1].len0 = -1;
    CASE("seq_lens beyond max_pages * block_size", "seq_lens", LK_ERR_SHAPE, o.t, c.t, bt.t, sl.t, LK_KV_ND);
    cases[n - 1].set_len = 1, cases[n - 1].len0 = 13;
    CASE("block_table page == num_blocks", "block_table", LK_ERR_INDEX, o.t, c.t, bt.t, sl.t, LK_KV_ND);
    cases[n - 1].set_bt = 1, cases[n - 1].bt_val = (int)nb;
    CASE("block_table page negative", "block_table", LK_ERR_INDEX, o.t, c.t, bt.t, sl.t, LK_KV_NZ);
    cases[n - 1].o = o3.t, cases[n - 1].c = nz.t, cases[n - 1].set_bt = 1, cases[n - 1].bt_val = -1;
#undef CASE
    tu_buf *all[] = {&c, &c4, &nz, &o, &o3, &bt, &sl, &bt64, &sl64};
    for (int i = 0; i < n; i++) {
        tu_set(&sl, 0, cases[i].set_len ? cases[i].len0 : 5);
        tu_set(&bt, 1, cases[i].set_bt ? cases[i].bt_val : 1); /* page 1 of request 0 is read */
        for (int k = 0; k < 9; k++) tu_snapshot(all[k]);
        lk_status st = lk_gather_cache(&cases[i].o, &cases[i].c, &cases[i].bt, &cases[i].sl, cases[i].L);
        const char *msg = lk_last_error();
        int intact = 1;
        for (int k = 0; k < 9; k++) intact &= tu_intact(all[k]);
        tu_check(st == cases[i].want && strstr(msg, cases[i].arg) && strstr(msg, "lk_gather_cache") && intact,
                 "gather bad input '%s' -> %s (%s)", cases[i].what, lk_status_str(st), msg);
    }
    tu_set(&sl, 0, 5), tu_set(&bt, 1, 1);
    lk_status st = lk_gather_cache(&o.t, &c.t, NULL, &sl.t, LK_KV_ND);
    tu_check(st == LK_ERR_NULL && strstr(lk_last_error(), "block_table"), "gather NULL block_table pointer");
    /* entries past a request's pages are not checked: -1 and 77 above are fine */
    st = lk_gather_cache(&o.t, &c.t, &bt.t, &sl.t, LK_KV_ND);
    tu_check(st == LK_OK && lk_last_error()[0] == 0 && !has_nan(&o),
             "gather with garbage block_table entries past the used pages succeeds (%s)", lk_last_error());
    st = lk_gather_cache(&o3.t, &c4.t, &bt.t, &sl.t, LK_KV_ND);
    tu_check(st == LK_OK, "gather out [S, H, D] from a 4-D ND cache (%s)", lk_last_error());
    for (int k = 0; k < 9; k++) tu_free(all[k]);
}

/* fuzz regression (fuzz_mla_cache): a single token whose row stride is 2^62 - 1
 * (kv_c [1, 16]; gather: out [1, 32]). The SIMD copy functions multiplied the row step
 * by the element size (signed overflow, UBSan). The row step of one token is now 0:
 * every ISA gives the bits of the same calls with ordinary strides. */
static void test_regress_single_token_huge_stride(void) {
    float kv[16];
    uint16_t pe[16], c1[3 * 4 * 32], c2[3 * 4 * 32];
    float o1[32], o2[32];
    for (int i = 0; i < 16; i++) kv[i] = 0.25f * (float)i - 2.0f, pe[i] = (uint16_t)(0x3f00 + i);
    int32_t slot[1] = {5}, bt[1][1] = {{1}}, len[1] = {1};
    lk_tensor tkv = lk_tensor_make(kv, LK_F32, 2, (int64_t[]){1, 16});
    lk_tensor tpe = lk_tensor_make(pe, LK_BF16, 2, (int64_t[]){1, 16});
    lk_tensor tsm = lk_tensor_make(slot, LK_I32, 1, (int64_t[]){1});
    lk_tensor tc1 = lk_tensor_make(c1, LK_BF16, 3, (int64_t[]){3, 4, 32});
    lk_tensor tc2 = lk_tensor_make(c2, LK_BF16, 3, (int64_t[]){3, 4, 32});
    lk_tensor tbt = lk_tensor_make(bt, LK_I32, 2, (int64_t[]){1, 1});
    lk_tensor tl = lk_tensor_make(len, LK_I32, 1, (int64_t[]){1});
    lk_tensor to1 = lk_tensor_make(o1, LK_F32, 2, (int64_t[]){1, 32});
    lk_tensor to2 = lk_tensor_make(o2, LK_F32, 2, (int64_t[]){1, 32});
    lk_tensor hkv = tkv, ho2 = to2;
    hkv.stride[0] = ho2.stride[0] = ((int64_t)1 << 62) - 1;
    lk_isa isas[TU_MAX_ISAS];
    int ni = tu_isas(isas);
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        memset(c1, 0, sizeof c1), memset(c2, 0, sizeof c2), memset(o1, 0, sizeof o1), memset(o2, 0, sizeof o2);
        lk_status s1 = lk_concat_and_cache_mla(&tkv, &tpe, &tc1, NULL, &tsm, LK_KV_ND);
        lk_status s2 = lk_concat_and_cache_mla(&hkv, &tpe, &tc2, NULL, &tsm, LK_KV_ND);
        lk_status s3 = lk_gather_cache(&to1, &tc1, &tbt, &tl, LK_KV_ND);
        lk_status s4 = lk_gather_cache(&ho2, &tc2, &tbt, &tl, LK_KV_ND);
        tu_check(s1 == LK_OK && s2 == LK_OK && s3 == LK_OK && s4 == LK_OK && !memcmp(c1, c2, sizeof c1) &&
                     !memcmp(o1, o2, sizeof o1),
                 "regress %s: one token with a 2^62 - 1 row stride (concat %s, gather %s)", lk_isa_name(isas[ii]),
                 lk_status_str(s2), lk_status_str(s4));
    }
    lk_set_isa(lk_isa_best());
    /* the same for an empty k_pe [3, 0] (its strides are never validated), NZ cache */
    uint16_t kv3[3 * 32], n1[3 * 2 * 3 * 16], n2[3 * 2 * 3 * 16];
    float pe0[1];
    for (int i = 0; i < 96; i++) kv3[i] = (uint16_t)(0x3c00 + i);
    int64_t slots2[2] = {8, 6};
    lk_tensor tkv3 = lk_tensor_make(kv3, LK_BF16, 2, (int64_t[]){3, 32});
    lk_tensor tpe0 = lk_tensor_make(pe0, LK_F32, 2, (int64_t[]){3, 0}), hpe0 = tpe0;
    hpe0.stride[0] = ((int64_t)1 << 62) - 1;
    lk_tensor tsm2 = lk_tensor_make(slots2, LK_I64, 1, (int64_t[]){2});
    lk_tensor tn1 = lk_tensor_make(n1, LK_BF16, 4, (int64_t[]){3, 2, 3, 16});
    lk_tensor tn2 = lk_tensor_make(n2, LK_BF16, 4, (int64_t[]){3, 2, 3, 16});
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        memset(n1, 0, sizeof n1), memset(n2, 0, sizeof n2);
        lk_status s1 = lk_concat_and_cache_mla(&tkv3, &tpe0, &tn1, NULL, &tsm2, LK_KV_NZ);
        lk_status s2 = lk_concat_and_cache_mla(&tkv3, &hpe0, &tn2, NULL, &tsm2, LK_KV_NZ);
        tu_check(s1 == LK_OK && s2 == LK_OK && !memcmp(n1, n2, sizeof n1),
                 "regress %s: empty k_pe with a 2^62 - 1 row stride (%s)", lk_isa_name(isas[ii]), lk_status_str(s2));
    }
    lk_set_isa(lk_isa_best());
}

/* fuzz regression (fuzz_mla_cache): gather_cache with an empty out [0, 16] whose strides
 * are 3074457345618258602: the front-end's [S, C] -> [S, H, D] reshape multiplied the
 * unvalidated stride (signed overflow, UBSan); likewise an empty ND cache [0, 2, 32]
 * reshaped to [0, 2, 2, 16]. Both are valid no-op calls. */
static void test_regress_gather_empty_huge_stride(void) {
    float ob[1] = {7.0f}, cb[1] = {0};
    int32_t bt[1] = {0}, len[1] = {0};
    lk_tensor out = lk_tensor_make(ob, LK_F32, 2, (int64_t[]){0, 16});
    out.stride[0] = out.stride[1] = 3074457345618258602;
    lk_tensor cache = lk_tensor_make(cb, LK_F32, 4, (int64_t[]){0, 1, 1, 16});
    lk_tensor tbt = lk_tensor_make(bt, LK_I32, 2, (int64_t[]){0, 1}), tl = lk_tensor_make(len, LK_I32, 1, (int64_t[]){0});
    lk_status s1 = lk_gather_cache(&out, &cache, &tbt, &tl, LK_KV_ND);
    lk_tensor out3 = lk_tensor_make(ob, LK_F32, 3, (int64_t[]){0, 2, 16});
    lk_tensor c3 = lk_tensor_make(cb, LK_F32, 3, (int64_t[]){0, 2, 32});
    c3.stride[2] = 3074457345618258602;
    lk_status s2 = lk_gather_cache(&out3, &c3, &tbt, &tl, LK_KV_ND);
    tu_check(s1 == LK_OK && s2 == LK_OK && ob[0] == 7.0f,
             "regress: gather with empty out / cache and huge strides is a no-op (%s, %s)", lk_status_str(s1),
             lk_status_str(s2));
}

/* fuzz regression (fuzz_mla_cache): two NZ caches, the k_pe one empty ([3, 0, 3, 16],
 * Dr = 0) with slot stride 2^61. Its slot offsets were computed from that unvalidated
 * stride (signed overflow, UBSan); lk_paged_init now zeroes an empty cache's strides.
 * Every ISA gives the bits of the same call with ordinary strides. */
static void test_regress_empty_cache_huge_stride(void) {
    uint16_t kv[5 * 16], c1[3 * 3 * 16], c2[3 * 3 * 16], pe[1], pc[1];
    for (int i = 0; i < 80; i++) kv[i] = (uint16_t)(0x3c00 + 3 * i);
    int32_t slots[4] = {0, 4, 8, 1};
    lk_tensor tkv = lk_tensor_make(kv, LK_F16, 2, (int64_t[]){5, 16});
    lk_tensor tpe = lk_tensor_make(pe, LK_F16, 2, (int64_t[]){5, 0});
    lk_tensor tsm = lk_tensor_make(slots, LK_I32, 1, (int64_t[]){4});
    lk_tensor tc1 = lk_tensor_make(c1, LK_F16, 4, (int64_t[]){3, 1, 3, 16});
    lk_tensor tc2 = lk_tensor_make(c2, LK_F16, 4, (int64_t[]){3, 1, 3, 16});
    lk_tensor tpc = lk_tensor_make(pc, LK_F32, 4, (int64_t[]){3, 0, 3, 16}), hpc = tpc;
    hpc.stride[2] = (int64_t)1 << 61;
    lk_isa isas[TU_MAX_ISAS];
    int ni = tu_isas(isas);
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        memset(c1, 0, sizeof c1), memset(c2, 0, sizeof c2);
        lk_status s1 = lk_concat_and_cache_mla(&tkv, &tpe, &tc1, &tpc, &tsm, LK_KV_NZ);
        lk_status s2 = lk_concat_and_cache_mla(&tkv, &tpe, &tc2, &hpc, &tsm, LK_KV_NZ);
        tu_check(s1 == LK_OK && s2 == LK_OK && !memcmp(c1, c2, sizeof c1),
                 "regress %s: empty NZ k_pe cache with a 2^61 slot stride (%s)", lk_isa_name(isas[ii]),
                 lk_status_str(s2));
        /* empty views may have NULL data: no pointer arithmetic on it (NULL + 0 is UB) */
        lk_tensor npe = tpe, npc = hpc;
        npe.data = NULL, npc.data = NULL;
        memset(c2, 0, sizeof c2);
        s2 = lk_concat_and_cache_mla(&tkv, &npe, &tc2, &npc, &tsm, LK_KV_NZ);
        tu_check(s2 == LK_OK && !memcmp(c1, c2, sizeof c1), "regress %s: empty k_pe and k_pe_cache with NULL data (%s)",
                 lk_isa_name(isas[ii]), lk_status_str(s2));
    }
    lk_set_isa(lk_isa_best());
}

/* fuzz regression (fuzz_mla_rope): one buffer with an empty rope part (Dr = 0) and a
 * latent part of 64 or more (copied token by token): the copy added token offsets to the
 * empty part's NULL cache / row pointers (UBSan: zero offset to a null pointer). Also the
 * reverse (Dl = 0, Dr = 64) and an NZ cache with block_size 1. Every ISA: the rows land
 * in their slots, nothing else written (the UB itself shows under clang's UBSan, as in
 * the fuzz build; gcc's does not flag a null pointer plus an offset). */
static void test_regress_empty_part_token_major(void) {
    enum { T = 3, D = 80 };
    static float src[T * D], cache[4 * 4 * D];
    for (int i = 0; i < T * D; i++) src[i] = (float)(i + 1);
    int32_t slots[T] = {5, 6, 14}; /* 5 and 6: one group of two tokens (ND pages of 4) */
    lk_tensor tsm = lk_tensor_make(slots, LK_I32, 1, (int64_t[]){T});
    lk_isa isas[TU_MAX_ISAS];
    int ni = tu_isas(isas);
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        for (int which = 0; which < 3; which++) { /* 0: Dr = 0; 1: Dl = 0; 2: NZ, block_size 1, Dr = 0 */
            int64_t Dl = which == 1 ? 0 : (which == 2 ? 64 : D), Dr = which == 1 ? 64 : 0, C = Dl + Dr;
            lk_tensor tkv = lk_tensor_make(which == 1 ? NULL : src, LK_F32, 2, (int64_t[]){T, Dl});
            lk_tensor tpe = lk_tensor_make(which == 1 ? src : NULL, LK_F32, 2, (int64_t[]){T, Dr});
            tkv.stride[0] = tpe.stride[0] = C;
            lk_tensor tc = which == 2 ? lk_tensor_make(cache, LK_F32, 4, (int64_t[]){16, C / 16, 1, 16})
                                      : lk_tensor_make(cache, LK_F32, 3, (int64_t[]){4, 4, C});
            memset(cache, 0, sizeof cache);
            lk_status st = lk_concat_and_cache_mla(&tkv, &tpe, &tc, NULL, &tsm, which == 2 ? LK_KV_NZ : LK_KV_ND);
            int ok = st == LK_OK;
            for (int64_t sl = 0; sl < 16; sl++)
                for (int64_t c = 0; c < C; c++) {
                    int64_t t = sl == 5 ? 0 : sl == 6 ? 1 : sl == 14 ? 2 : -1;
                    /* ND slot sl at sl * C + c; NZ (block_size 1) page sl, tile c / 16, at sl * C + c too */
                    float want = t < 0 ? 0.0f : src[t * C + c];
                    ok &= cache[sl * C + c] == want;
                }
            tu_check(ok, "regress %s: one empty part (%s) beside a token-by-token copy (%s)", lk_isa_name(isas[ii]),
                     which == 0 ? "Dr = 0, ND" : which == 1 ? "Dl = 0, ND" : "Dr = 0, NZ block_size 1",
                     lk_status_str(st));
        }
    }
    lk_set_isa(lk_isa_best());
}

int main(void) {
    tu_init();
    test_concat_cases();
    test_gather_cases();
    test_nz_equals_nd();
    test_bit_copy();
    test_tight_allocation();
    test_streaming();
    test_threads();
    test_empty();
    test_concat_bad();
    test_gather_bad();
    test_regress_single_token_huge_stride();
    test_regress_gather_empty_huge_stride();
    test_regress_empty_cache_huge_stride();
    test_regress_empty_part_token_major();
    return tu_finish("test_mla_cache");
}
