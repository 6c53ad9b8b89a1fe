/*
 * reshape_and_cache_flash: every ISA against an independent element-by-element
 * expectation and against ref, compared over the caches' WHOLE allocations (written
 * rows, rows of unused slots, padding garbage and guard zones), so a stray store
 * anywhere fails. Grid: block sizes 1, 7, 16, 128; every source x cache dtype pair and
 * mixed k/v/cache dtypes; Dv != Dk; padding slots (< 0); N < T; i32 and i64 (strided)
 * slot_mapping; cache layouts ND, ND strided, HND (permuted view), FlashInfer
 * [NB, 2, bs, H, D] and [NB, 2, H, bs, D] interleaved k/v views of one buffer, vLLM
 * [2, NB, bs, H, D]; strided and non-unit-last-stride sources; special values (bits of
 * same-dtype copies must survive, NaN included). Also: all three duplicate-check
 * strategies, empty inputs, thread-count independence, the bad-input catalogue.
 */
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "core/half.h"
#include "testutil.h"

enum { L_ND, L_ND_PAD, L_HND, L_HND_PAD, L_FI_NHD, L_FI_HND, L_VLLM, NLAYOUT };
static const char *LAYOUT_NAME[NLAYOUT] = {"ND",        "ND-pad",     "HND",  "HND-pad",
                                           "FI-NHD-kv", "FI-HND-kv", "vLLM-2xNB"};

/* the caches and the storage they live in (one shared buffer or two) */
typedef struct {
    tu_buf kb, vb; /* vb.base == NULL when both views live in kb */
    lk_tensor kc, vc;
} caches;

/* 4-D view of a 5-D buffer with dim `dim` fixed at idx */
static lk_tensor slice5(const tu_buf *b, int dim, int64_t idx) {
    lk_tensor t = b->t;
    t.data = (char *)b->t.data + idx * b->t.stride[dim] * (int64_t)lk_dtype_size(b->t.dtype);
    for (int d = dim; d < 4; d++) {
        t.shape[d] = b->t.shape[d + 1];
        t.stride[d] = b->t.stride[d + 1];
    }
    t.ndim = 4;
    t.shape[4] = t.stride[4] = 0;
    return t;
}

static caches caches_alloc(int layout, lk_dtype kt, lk_dtype vt, int64_t NB, int64_t bs,
                           int64_t H, int64_t Dk, int64_t Dv) {
    caches c;
    memset(&c, 0, sizeof c);
    if ((layout == L_FI_NHD || layout == L_FI_HND || layout == L_VLLM) && (kt != vt || Dk != Dv))
        layout = L_HND_PAD; /* one buffer needs one dtype and one D */
    if (layout == L_FI_NHD || layout == L_FI_HND) {
        int64_t shape[5] = {NB, 2, bs, H, Dk};
        int perm_hnd[5] = {0, 1, 3, 2, 4};
        c.kb = tu_alloc_perm(kt, 5, shape, layout == L_FI_HND ? perm_hnd : NULL, 1);
        c.kc = slice5(&c.kb, 1, 0);
        c.vc = slice5(&c.kb, 1, 1);
    } else if (layout == L_VLLM) {
        c.kb = tu_alloc(kt, 5, (int64_t[]){2, NB, bs, H, Dk}, 0);
        c.kc = slice5(&c.kb, 0, 0);
        c.vc = slice5(&c.kb, 0, 1);
    } else {
        int pad = layout == L_ND_PAD || layout == L_HND_PAD;
        int perm_hnd[4] = {0, 2, 1, 3};
        const int *perm = layout == L_HND || layout == L_HND_PAD ? perm_hnd : NULL;
        c.kb = tu_alloc_perm(kt, 4, (int64_t[]){NB, bs, H, Dk}, perm, pad);
        c.vb = tu_alloc_perm(vt, 4, (int64_t[]){NB, bs, H, Dv}, perm, pad);
        c.kc = c.kb.t;
        c.vc = c.vb.t;
    }
    tu_fill_uniform(&c.kb, -8, 8); /* old cache contents */
    if (c.vb.base) tu_fill_uniform(&c.vb, -8, 8);
    return c;
}

static void caches_free(caches *c) {
    tu_free(&c->kb);
    if (c->vb.base) tu_free(&c->vb);
}

/* where the v buffer's bytes start in a copy (aligned like a malloc'd buffer) */
static size_t v_at(const caches *c) { return (c->kb.bytes + 63) & ~(size_t)63; }

/* copy of the storage bytes (k buffer, then v buffer at v_at) */
static unsigned char *caches_bytes(const caches *c) {
    unsigned char *p = malloc(v_at(c) + (c->vb.base ? c->vb.bytes : 0));
    memcpy(p, c->kb.base, c->kb.bytes);
    if (c->vb.base) memcpy(p + v_at(c), c->vb.base, c->vb.bytes);
    return p;
}

static void caches_restore(caches *c, const unsigned char *p) {
    memcpy(c->kb.base, p, c->kb.bytes);
    if (c->vb.base) memcpy(c->vb.base, p + v_at(c), c->vb.bytes);
}

static int caches_equal(const caches *c, const unsigned char *p) {
    if (memcmp(c->kb.base, p, c->kb.bytes)) return 0;
    return !c->vb.base || !memcmp(c->vb.base, p + v_at(c), c->vb.bytes);
}

/* view re-pointed into the byte copy p of its storage */
static lk_tensor in_copy(const lk_tensor *view, const tu_buf *store, unsigned char *p) {
    lk_tensor t = *view;
    t.data = p + ((unsigned char *)view->data - store->base);
    return t;
}

static int64_t off4(const lk_tensor *t, int64_t a, int64_t b, int64_t c, int64_t d) {
    return a * t->stride[0] + b * t->stride[1] + c * t->stride[2] + d * t->stride[3];
}

/* expectation, element by element: dst[b, o, h, d] = src[t, h, d], the same bits for
 * equal dtypes, else the value (as double, exact for every source dtype) rounded once */

static void expect_token(lk_tensor *dst, const tu_buf *src, int64_t t, int64_t b, int64_t o, float scale) {
    int64_t H = src->t.shape[1], D = src->t.shape[2];
    size_t es = lk_dtype_size(dst->dtype);
    for (int64_t h = 0; h < H; h++)
        for (int64_t d = 0; d < D; d++) {
            int64_t si = (t * H + h) * D + d, doff = off4(dst, b, o, h, d);
            if (src->t.dtype == dst->dtype)
                memcpy((char *)dst->data + doff * (int64_t)es,
                       (const char *)src->t.data + tu_offset(&src->t, si) * (int64_t)es, es);
            else if (lk_is_fp8(dst->dtype)) /* one f32 division, the tested converter */
                lk_store_f(dst->data, dst->dtype, doff, (float)tu_get(src, si) / scale);
            else
                lk_store_f(dst->data, dst->dtype, doff, (float)tu_get(src, si));
        }
}

static unsigned char *expected_bytes(const caches *c, const tu_buf *k, const tu_buf *v,
                                     const int64_t *slots, int64_t N, float ks, float vs) {
    unsigned char *p = caches_bytes(c);
    lk_tensor kc = in_copy(&c->kc, &c->kb, p);
    lk_tensor vc = c->vb.base ? in_copy(&c->vc, &c->vb, p + v_at(c)) : in_copy(&c->vc, &c->kb, p);
    int64_t bs = c->kc.shape[1];
    for (int64_t t = 0; t < N; t++) {
        if (slots[t] < 0) continue;
        expect_token(&kc, k, t, slots[t] / bs, slots[t] % bs, ks);
        expect_token(&vc, v, t, slots[t] / bs, slots[t] % bs, vs);
    }
    return p;
}

/* N slots: distinct values in [0, nslots) except every `every`-th token (padding) */
static int64_t *make_slots(int64_t N, int64_t nslots, int every) {
    int64_t *perm = tu_permutation(nslots);
    int64_t *s = malloc(sizeof(int64_t) * (size_t)(N > 0 ? N : 1));
    for (int64_t t = 0; t < N; t++) s[t] = every && t % every == every - 1 ? -1 - t % 3 : perm[t];
    free(perm);
    return s;
}

static tu_buf slot_buf(const int64_t *s, int64_t N, lk_dtype dt, int pad) {
    tu_buf b = tu_alloc(dt, 1, &N, pad);
    for (int64_t t = 0; t < N; t++) { /* exact integers (a double loses INT64_MAX) */
        int64_t off = tu_offset(&b.t, t);
        if (dt == LK_I64) ((int64_t *)b.t.data)[off] = s[t];
        else ((int32_t *)b.t.data)[off] = (int32_t)s[t];
    }
    return b;
}

/* uniform values plus specials: infinities, -0, NaN, subnormals, f16 overflow, ties;
 * with `snan` also signalling NaNs, whose bits only a same-dtype copy keeps (widening
 * f16 with F16C quiets them, the scalar half.h does not: not compared across ISAs) */
static void fill_source(tu_buf *b, int snan) {
    static const double special[] = {INFINITY, -INFINITY, -0.0, NAN, 3e-8, -1e-40, 7e4,
                                     1.00390625, -65519.0, 1e-5};
    tu_fill_uniform(b, -4, 4);
    int64_t n = tu_numel(b);
    for (int i = 0; i < 10 && i * 7 < n; i++) tu_set(b, i * 7, special[i]);
    for (int i = 0; snan && i < 2 && 3 + i * 11 < n; i++) {
        char *p = (char *)b->t.data + tu_offset(&b->t, 3 + i * 11) * (int64_t)lk_dtype_size(b->t.dtype);
        uint32_t f = i ? 0xff900000u : 0x7f800001u;
        uint16_t h = b->t.dtype == LK_F16 ? (i ? 0xfd00 : 0x7c01) : (i ? 0xff81 : 0x7f81);
        if (b->t.dtype == LK_F32) memcpy(p, &f, 4);
        else memcpy(p, &h, 2);
    }
}

typedef struct {
    lk_dtype kt, vt, kct, vct, it;
    int64_t T, N, H, Dk, Dv, bs;
    int layout, src_pad, slot_pad, every;
    int src_perm; /* sources stored [D, T, H]: last-dim stride != 1 */
    float ks, vs; /* > 0: lk_reshape_and_cache_flash_scaled with these scales */
} kv_case;

/* every written fp8 element of one cache against float64 */
static int fp8_bound_check(const lk_tensor *cache, const tu_buf *src, const int64_t *slots, int64_t N, float scale) {
    if (!lk_is_fp8(cache->dtype)) return 1;
    int64_t H = src->t.shape[1], D = src->t.shape[2], bs = cache->shape[1];
    for (int64_t t = 0; t < N; t++) {
        if (slots[t] < 0) continue;
        for (int64_t h = 0; h < H; h++)
            for (int64_t d = 0; d < D; d++) {
                float q = lk_load_f(cache->data, cache->dtype, off4(cache, slots[t] / bs, slots[t] % bs, h, d));
                if (!tu_fp8_close(cache->dtype, tu_get(src, (t * H + h) * D + d), scale, q)) return 0;
            }
    }
    return 1;
}

static void run_case(const kv_case *cs) {
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    int64_t NB = (2 * cs->N + cs->bs - 1) / cs->bs + 1, nslots = NB * cs->bs;
    int perm_src[3] = {2, 0, 1};
    const int *ps = cs->src_perm ? perm_src : NULL;
    tu_buf k = tu_alloc_perm(cs->kt, 3, (int64_t[]){cs->T, cs->H, cs->Dk}, ps, cs->src_pad);
    tu_buf v = tu_alloc_perm(cs->vt, 3, (int64_t[]){cs->T, cs->H, cs->Dv}, ps, cs->src_pad);
    fill_source(&k, cs->kt == cs->kct);
    fill_source(&v, cs->vt == cs->vct);
    int64_t *slots = make_slots(cs->N, nslots, cs->every);
    tu_buf sm = slot_buf(slots, cs->N, cs->it, cs->slot_pad);
    caches c = caches_alloc(cs->layout, cs->kct, cs->vct, NB, cs->bs, cs->H, cs->Dk, cs->Dv);
    unsigned char *init = caches_bytes(&c);
    unsigned char *want = expected_bytes(&c, &k, &v, slots, cs->N, cs->ks, cs->vs);
    unsigned char *ref = NULL;
    tu_snapshot(&k);
    tu_snapshot(&v);
    tu_snapshot(&sm);
    for (int ii = 0; ii < nisa; ii++) {
        lk_set_isa(isas[ii]);
        caches_restore(&c, init);
        lk_status st = cs->ks > 0 ? lk_reshape_and_cache_flash_scaled(&k.t, &v.t, &c.kc, &c.vc, &sm.t, cs->ks, cs->vs)
                                  : lk_reshape_and_cache_flash(&k.t, &v.t, &c.kc, &c.vc, &sm.t);
        int ok = caches_equal(&c, want);
        if (ii == 0 && (lk_is_fp8(cs->kct) || lk_is_fp8(cs->vct)))
            tu_check(fp8_bound_check(&c.kc, &k, slots, cs->N, cs->ks) && fp8_bound_check(&c.vc, &v, slots, cs->N, cs->vs),
                     "fp8 cache kc=%s vc=%s k_scale=%g v_scale=%g: every element within half an fp8 step of "
                     "x / scale (float64), saturated beyond the max",
                     lk_dtype_name(cs->kct), lk_dtype_name(cs->vct), (double)cs->ks, (double)cs->vs);
        tu_check(st == LK_OK && ok && tu_intact(&k) && tu_intact(&v) && tu_intact(&sm),
                 "cache %s k=%s v=%s kc=%s vc=%s idx=%s T=%lld N=%lld H=%lld Dk=%lld Dv=%lld "
                 "bs=%lld %s src_pad=%d src_perm=%d: %s %s",
                 lk_isa_name(isas[ii]), lk_dtype_name(cs->kt), lk_dtype_name(cs->vt),
                 lk_dtype_name(cs->kct), lk_dtype_name(cs->vct), lk_dtype_name(cs->it),
                 (long long)cs->T, (long long)cs->N, (long long)cs->H, (long long)cs->Dk,
                 (long long)cs->Dv, (long long)cs->bs, LAYOUT_NAME[cs->layout], cs->src_pad,
                 cs->src_perm, lk_status_str(st), ok ? "" : "cache bytes differ from expected");
        if (ii == 0) ref = caches_bytes(&c);
        else
            tu_check(caches_equal(&c, ref), "cache %s vs ref bit-identical (%s bs=%lld)",
                     lk_isa_name(isas[ii]), LAYOUT_NAME[cs->layout], (long long)cs->bs);
    }
    lk_set_isa(lk_isa_best());
    free(init);
    free(want);
    free(ref);
    free(slots);
    caches_free(&c);
    tu_free(&k);
    tu_free(&v);
    tu_free(&sm);
}

static void test_grid(void) {
    const lk_dtype F[3] = {LK_F32, LK_F16, LK_BF16};
    lk_dtype dts[12][4]; /* k, v, k_cache, v_cache */
    int nd = 0;
    for (int s = 0; s < 3; s++)
        for (int c = 0; c < 3; c++) {
            dts[nd][0] = dts[nd][1] = F[s];
            dts[nd][2] = dts[nd][3] = F[c];
            nd++;
        }
    const lk_dtype mixed[3][4] = {{LK_F32, LK_BF16, LK_F16, LK_F32},
                                  {LK_BF16, LK_F16, LK_F32, LK_BF16},
                                  {LK_F16, LK_F32, LK_BF16, LK_F16}};
    memcpy(dts[nd], mixed, sizeof mixed);
    nd += 3;
    const int64_t bss[4] = {1, 7, 16, 128};
    const int64_t hd[3][3] = {{1, 1, 1}, {3, 33, 33}, {2, 40, 24}}; /* H, Dk, Dv */
    int n = 0;
    for (int d = 0; d < nd; d++)
        for (int b = 0; b < 4; b++)
            for (int l = 0; l < NLAYOUT; l++)
                for (int s = 0; s < 3; s++, n++) {
                    kv_case cs = {dts[d][0], dts[d][1], dts[d][2], dts[d][3],
                                  n % 2 ? LK_I32 : LK_I64,
                                  45, n % 3 == 0 ? 45 : 43, hd[s][0], hd[s][1], hd[s][2], bss[b],
                                  l, n % 4 == 1, n % 5 == 2, n % 3 ? 9 : 4, 0, 0, 0};
                    run_case(&cs);
                }
}

/* fp8 caches: e4m3 / e5m2 keys and values, mixed with 16-bit caches, scales 1, 1/32,
 * 3.7 (and the scaled call on 16/32-bit caches, which ignores its scales); every layout
 * (vLLM's interleaved buffers included), page sizes 1, 7, 16, 128, padding slots */
static void test_fp8_grid(void) {
    const lk_dtype dts[6][4] = {{LK_F32, LK_F32, LK_F8E4M3, LK_F8E4M3}, {LK_BF16, LK_BF16, LK_F8E5M2, LK_F8E5M2},
                                {LK_F16, LK_BF16, LK_F8E4M3, LK_F8E5M2}, {LK_BF16, LK_F32, LK_F8E5M2, LK_BF16},
                                {LK_F32, LK_F16, LK_F16, LK_F8E4M3},     {LK_BF16, LK_F16, LK_BF16, LK_F32}};
    const float sc[3][2] = {{1.0f, 1.0f}, {0.03125f, 0.03125f}, {3.7f, 0.25f}};
    const int64_t bss[4] = {1, 7, 16, 128};
    const int64_t hd[3][3] = {{1, 1, 1}, {3, 33, 33}, {2, 40, 24}}; /* H, Dk, Dv */
    int n = 0;
    for (int d = 0; d < 6; d++)
        for (int b = 0; b < 4; b++)
            for (int l = 0; l < NLAYOUT; l++, n++) {
                int s = n % 3;
                kv_case cs = {dts[d][0], dts[d][1], dts[d][2], dts[d][3], n % 2 ? LK_I32 : LK_I64,
                              45, n % 3 == 0 ? 45 : 43, hd[s][0], hd[s][1], hd[s][2], bss[b],
                              l, n % 4 == 1, n % 5 == 2, n % 3 ? 9 : 4, n % 7 == 3,
                              sc[n % 3][0], sc[n % 3][1]};
                run_case(&cs);
            }
}

/* bad scales (0, < 0, NaN, inf) and fp8 caches in the unscaled call: rejected naming
 * the argument, nothing written */
static void test_fp8_bad(void) {
    int64_t T = 4, H = 2, D = 8, NB = 2, bs = 4;
    tu_buf k = tu_alloc(LK_F32, 3, (int64_t[]){T, H, D}, 0), v = tu_alloc(LK_BF16, 3, (int64_t[]){T, H, D}, 0);
    tu_buf kc = tu_alloc(LK_F8E4M3, 4, (int64_t[]){NB, bs, H, D}, 0), vc = tu_alloc(LK_F8E5M2, 4, (int64_t[]){NB, bs, H, D}, 1);
    tu_fill_uniform(&k, -1, 1), tu_fill_uniform(&v, -1, 1), tu_fill_uniform(&kc, -1, 1), tu_fill_uniform(&vc, -1, 1);
    int64_t s_ok[4] = {3, -1, 6, 0};
    tu_buf sm = slot_buf(s_ok, 4, LK_I64, 0);
    const float bad[5] = {0.0f, -0.0f, -1.0f, NAN, INFINITY};
    tu_snapshot(&kc), tu_snapshot(&vc);
    for (int i = 0; i < 5; i++)
        for (int which = 0; which < 2; which++) {
            float ks = which ? 1.0f : bad[i], vs = which ? bad[i] : 1.0f;
            lk_status st = lk_reshape_and_cache_flash_scaled(&k.t, &v.t, &kc.t, &vc.t, &sm.t, ks, vs);
            tu_check(st == LK_ERR_VALUE && strstr(lk_last_error(), which ? "v_scale" : "k_scale") && tu_intact(&kc) &&
                         tu_intact(&vc),
                     "%s = %g rejected, nothing written (%s)", which ? "v_scale" : "k_scale", (double)bad[i],
                     lk_last_error());
        }
    lk_status st = lk_reshape_and_cache_flash(&k.t, &v.t, &kc.t, &vc.t, &sm.t);
    tu_check(st == LK_ERR_DTYPE && strstr(lk_last_error(), "k_cache") && tu_intact(&kc) && tu_intact(&vc),
             "fp8 cache in the unscaled call rejected naming k_cache (%s)", lk_last_error());
    lk_tensor ki = k.t;
    ki.dtype = LK_F8E4M3;
    st = lk_reshape_and_cache_flash_scaled(&ki, &v.t, &kc.t, &vc.t, &sm.t, 1.0f, 1.0f);
    tu_check(st == LK_ERR_DTYPE && strstr(lk_last_error(), "k:") && tu_intact(&kc) && tu_intact(&vc),
             "fp8 source k rejected by the scaled call (%s)", lk_last_error());
    st = lk_reshape_and_cache_flash_scaled(&k.t, &v.t, &kc.t, &vc.t, &sm.t, 0.5f, 2.0f);
    tu_check(st == LK_OK && !tu_intact(&kc), "the same call with valid scales writes (%s)", lk_status_str(st));
    tu_free(&k), tu_free(&v), tu_free(&kc), tu_free(&vc), tu_free(&sm);
}

/* Llama-3-8B kv heads, sources with non-unit last stride (reference fallback on every
 * ISA), sources stored [D, T, H] */
static void test_special_layouts(void) {
    const int layouts[3] = {L_ND, L_HND_PAD, L_FI_HND};
    for (int l = 0; l < 3; l++) {
        kv_case a = {LK_BF16, LK_BF16, LK_BF16, LK_BF16, LK_I64, 70, 67, 8, 128, 128, 16,
                     layouts[l], 0, 0, 11, 0, 0, 0};
        run_case(&a);
        kv_case b = {LK_F32, LK_F32, LK_BF16, LK_BF16, LK_I32, 70, 67, 8, 128, 128, 16,
                     layouts[l], 1, 1, 5, 0, 0, 0};
        run_case(&b);
        kv_case c = {LK_F16, LK_F32, LK_F16, LK_BF16, LK_I64, 9, 9, 3, 5, 6, 7,
                     layouts[l], 0, 0, 0, 1, 0, 0};
        run_case(&c);
    }
    /* >= 8 MiB of cache rows per call: the streaming-store variant of the SIMD kernels,
     * rows at unaligned addresses (padded ND) and per-head rows (HND) */
    kv_case s1 = {LK_F32, LK_F32, LK_F32, LK_F32, LK_I64, 1100, 1090, 8, 128, 128, 16,
                  L_ND_PAD, 0, 0, 50, 0, 0, 0};
    run_case(&s1);
    kv_case s2 = {LK_F32, LK_F32, LK_F32, LK_F32, LK_I32, 1030, 1030, 8, 128, 128, 16,
                  L_HND, 1, 0, 0, 0, 0, 0};
    if (!tu_emulated()) run_case(&s2); /* emulated: the unaligned ND one alone */
    /* Dk = 0: only v is written; MLA-like Dk 576 / Dv 512, one head */
    kv_case z = {LK_F32, LK_F32, LK_F16, LK_F16, LK_I64, 6, 5, 2, 0, 9, 7, L_ND, 0, 0, 0, 0, 0, 0};
    run_case(&z);
    kv_case m = {LK_BF16, LK_BF16, LK_BF16, LK_BF16, LK_I64, 5, 4, 1, 576, 512, 3, L_ND_PAD, 1, 0, 0, 0, 0, 0};
    run_case(&m);
}

/* k and v sliced out of one fused qkv projection [T, (Hq + 2 Hk) D] (how engines pass
 * them), into FlashInfer-interleaved caches; k and v may share a buffer, only the
 * caches are written */
static void test_qkv_slices(void) {
    int64_t T = 21, N = 19, Hq = 4, Hk = 2, D = 16, bs = 5, NB = 9, W = (Hq + 2 * Hk) * D;
    tu_buf qkv = tu_alloc(LK_BF16, 2, (int64_t[]){T, W}, 0);
    fill_source(&qkv, 1);
    lk_tensor k = {(uint16_t *)qkv.t.data + Hq * D, LK_BF16, 3, {T, Hk, D}, {W, D, 1}};
    lk_tensor v = {(uint16_t *)qkv.t.data + (Hq + Hk) * D, LK_BF16, 3, {T, Hk, D}, {W, D, 1}};
    tu_buf buf = tu_alloc(LK_BF16, 5, (int64_t[]){NB, 2, bs, Hk, D}, 0);
    tu_fill_uniform(&buf, -1, 1);
    lk_tensor kc = slice5(&buf, 1, 0), vc = slice5(&buf, 1, 1);
    int64_t *s = make_slots(N, NB * bs, 6);
    tu_buf sm = slot_buf(s, N, LK_I32, 0);
    tu_snapshot(&qkv);
    tu_snapshot(&buf);
    lk_status st = lk_reshape_and_cache_flash(&k, &v, &kc, &vc, &sm.t);
    int ok = st == LK_OK && tu_intact(&qkv);
    for (int64_t t = 0; t < N && ok; t++)
        for (int64_t i = 0; i < Hk * D && ok; i++) {
            int64_t h = i / D, d = i % D;
            if (s[t] < 0) continue;
            const uint16_t *kp = (const uint16_t *)kc.data + off4(&kc, s[t] / bs, s[t] % bs, h, d);
            const uint16_t *vp = (const uint16_t *)vc.data + off4(&vc, s[t] / bs, s[t] % bs, h, d);
            ok = *kp == ((const uint16_t *)qkv.t.data)[t * W + Hq * D + i] &&
                 *vp == ((const uint16_t *)qkv.t.data)[t * W + (Hq + Hk) * D + i];
        }
    tu_check(ok, "k, v sliced from fused qkv into interleaved caches: %s %s", lk_status_str(st),
             lk_last_error());
    free(s);
    tu_free(&qkv), tu_free(&buf), tu_free(&sm);
}

/* a huge sparse cache: the duplicate check sorts instead of using a bitmap */
static void test_sparse_cache(void) {
    int64_t NB = 20000, bs = 7, N = 40;
    tu_buf kc = tu_alloc(LK_F32, 4, (int64_t[]){NB, bs, 1, 1}, 0);
    tu_buf vc = tu_alloc(LK_F32, 4, (int64_t[]){NB, bs, 1, 1}, 0);
    tu_buf k = tu_alloc(LK_F32, 3, (int64_t[]){N, 1, 1}, 0), v = tu_alloc(LK_F32, 3, (int64_t[]){N, 1, 1}, 0);
    tu_fill_uniform(&k, -1, 1);
    tu_fill_uniform(&v, -1, 1);
    int64_t s[40];
    for (int64_t t = 0; t < N; t++) s[t] = (t * 3491 + 17) % (NB * bs);
    s[N - 1] = NB * bs - 1; /* the last slot of the last block */
    tu_buf sm = slot_buf(s, N, LK_I64, 0);
    tu_snapshot(&kc);
    tu_snapshot(&vc);
    lk_status st = lk_reshape_and_cache_flash(&k.t, &v.t, &kc.t, &vc.t, &sm.t);
    int ok = st == LK_OK;
    for (int64_t t = 0; t < N && ok; t++)
        ok = tu_get(&kc, s[t]) == tu_get(&k, t) && tu_get(&vc, s[t]) == tu_get(&v, t);
    tu_check(ok, "sparse cache (140000 slots, 40 tokens): %s", lk_status_str(st));
    s[25] = s[3]; /* duplicate: sort path */
    tu_buf sm2 = slot_buf(s, N, LK_I32, 1);
    memcpy(kc.base, kc.snap, kc.bytes); /* undo the valid call */
    memcpy(vc.base, vc.snap, vc.bytes);
    st = lk_reshape_and_cache_flash(&k.t, &v.t, &kc.t, &vc.t, &sm2.t);
    tu_check(st == LK_ERR_INDEX && strstr(lk_last_error(), "slot_mapping") &&
                 strstr(lk_last_error(), "more than one") && tu_intact(&kc) && tu_intact(&vc),
             "sparse cache duplicate slot rejected, caches untouched (%s)", lk_last_error());
    tu_free(&kc), tu_free(&vc), tu_free(&k), tu_free(&v), tu_free(&sm), tu_free(&sm2);
}

/* results are bitwise identical for 1..4 threads */
static void test_threads(void) {
    int64_t T = 600, H = 8, D = 128, bs = 16, NB = 80;
    tu_buf k = tu_alloc(LK_F32, 3, (int64_t[]){T, H, D}, 0), v = tu_alloc(LK_BF16, 3, (int64_t[]){T, H, D}, 0);
    tu_fill_uniform(&k, -3, 3);
    tu_fill_uniform(&v, -3, 3);
    int64_t *s = make_slots(T, NB * bs, 13);
    tu_buf sm = slot_buf(s, T, LK_I64, 0);
    unsigned char *first = NULL;
    for (int nt = 1; nt <= 4; nt++) {
        lk_set_num_threads(nt);
        tu_buf kc = tu_alloc(LK_BF16, 4, (int64_t[]){NB, bs, H, D}, 0);
        tu_buf vc = tu_alloc_perm(LK_BF16, 4, (int64_t[]){NB, bs, H, D}, (int[]){0, 2, 1, 3}, 0);
        lk_status st = lk_reshape_and_cache_flash(&k.t, &v.t, &kc.t, &vc.t, &sm.t);
        unsigned char *cur = malloc(kc.bytes + vc.bytes);
        memcpy(cur, kc.base, kc.bytes);
        memcpy(cur + kc.bytes, vc.base, vc.bytes);
        if (nt == 1) first = cur;
        else {
            tu_check(st == LK_OK && !memcmp(cur, first, kc.bytes + vc.bytes),
                     "reshape_and_cache_flash bitwise identical with %d threads", nt);
            free(cur);
        }
        tu_free(&kc);
        tu_free(&vc);
    }
    lk_set_num_threads(0);
    free(first);
    free(s);
    tu_free(&k), tu_free(&v), tu_free(&sm);
}

static void test_empty(void) {
    int64_t H = 2, D = 8, NB = 3, bs = 4;
    for (int which = 0; which < 4; which++) {
        /* 0: N = 0 < T; 1: T = N = 0; 2: all slots padding; 3: no blocks, all padding */
        int64_t T = which == 1 ? 0 : 5, N = which < 2 ? 0 : 5, nb = which == 3 ? 0 : NB;
        tu_buf k = tu_alloc(LK_F32, 3, (int64_t[]){T, H, D}, 0), v = tu_alloc(LK_F32, 3, (int64_t[]){T, H, D}, 0);
        tu_fill_uniform(&k, -1, 1);
        tu_fill_uniform(&v, -1, 1);
        tu_buf kc = tu_alloc(LK_BF16, 4, (int64_t[]){nb, bs, H, D}, 1);
        tu_buf vc = tu_alloc(LK_BF16, 4, (int64_t[]){nb, bs, H, D}, 1);
        tu_fill_uniform(&kc, -1, 1);
        tu_fill_uniform(&vc, -1, 1);
        int64_t s[5] = {-1, -1, -5, -1, INT64_MIN};
        tu_buf sm = slot_buf(s, N, LK_I64, 0);
        tu_snapshot(&kc);
        tu_snapshot(&vc);
        lk_status st = lk_reshape_and_cache_flash(&k.t, &v.t, &kc.t, &vc.t, &sm.t);
        tu_check(st == LK_OK && tu_intact(&kc) && tu_intact(&vc),
                 "empty case %d is a no-op: %s %s", which, lk_status_str(st), lk_last_error());
        tu_free(&k), tu_free(&v), tu_free(&kc), tu_free(&vc), tu_free(&sm);
    }
}

/* msg names `arg` as a whole word */
static int names_arg(const char *msg, const char *arg) {
    size_t n = strlen(arg);
    for (const char *p = strstr(msg, arg); p; p = strstr(p + 1, arg)) {
        int before = p == msg || !(isalnum((unsigned char)p[-1]) || p[-1] == '_');
        int after = !(isalnum((unsigned char)p[n]) || p[n] == '_');
        if (before && after) return 1;
    }
    return 0;
}

/* each rule: right status, the message names the op and the argument, nothing written */
static void test_bad_inputs(void) {
    int64_t T = 6, H = 2, D = 8, NB = 3, bs = 4;
    tu_buf k = tu_alloc(LK_F32, 3, (int64_t[]){T, H, D}, 0), v = tu_alloc(LK_F32, 3, (int64_t[]){T, H, D}, 0);
    tu_buf kc = tu_alloc(LK_F32, 4, (int64_t[]){NB, bs, H, D}, 0), vc = tu_alloc(LK_F32, 4, (int64_t[]){NB, bs, H, D}, 0);
    /* one buffer: 2 x cache-sized areas, then a slot_mapping-sized tail */
    tu_buf big = tu_alloc(LK_F32, 1, (int64_t[]){2 * NB * bs * H * D + 64}, 0);
    tu_fill_uniform(&k, -1, 1), tu_fill_uniform(&v, -1, 1), tu_fill_uniform(&kc, -1, 1);
    tu_fill_uniform(&vc, -1, 1), tu_fill_uniform(&big, -1, 1);
    int64_t s_ok[5] = {3, -1, 11, 0, 7};
    tu_buf sm = slot_buf(s_ok, 5, LK_I64, 0);
    int64_t s_range[5] = {3, -1, 11, 12, 7}, s_huge[5] = {3, INT64_MAX, 1, 2, 0};
    int64_t s_dup[5] = {3, -1, 11, 3, 7};
    tu_buf sm_range = slot_buf(s_range, 5, LK_I64, 0), sm_huge = slot_buf(s_huge, 5, LK_I64, 0);
    tu_buf sm_dup = slot_buf(s_dup, 5, LK_I32, 0);
    /* 40 tokens, N > 32: the bitmap path (12 slots can't hold 40, so a 40-slot cache) */
    int64_t T2 = 40;
    tu_buf k2 = tu_alloc(LK_F32, 3, (int64_t[]){T2, H, D}, 0), v2 = tu_alloc(LK_F32, 3, (int64_t[]){T2, H, D}, 0);
    tu_buf kc2 = tu_alloc(LK_F32, 4, (int64_t[]){10, bs, H, D}, 0), vc2 = tu_alloc(LK_F32, 4, (int64_t[]){10, bs, H, D}, 0);
    int64_t s2[40];
    for (int t = 0; t < 40; t++) s2[t] = (t * 7) % 40;
    s2[39] = s2[5];
    tu_buf sm_dup2 = slot_buf(s2, 40, LK_I64, 0);

    struct bad_case {
        const char *what, *arg;
        lk_status want;
        lk_tensor k, v, kc, vc, sm;
    } cases[48];
    int n = 0;
#define CASE(W, A, S, K, V, KC, VC, SM) cases[n++] = (struct bad_case){W, A, S, K, V, KC, VC, SM}
    lk_tensor t;
    CASE("slot beyond the cache", "slot_mapping", LK_ERR_INDEX, k.t, v.t, kc.t, vc.t, sm_range.t);
    CASE("slot INT64_MAX", "slot_mapping", LK_ERR_INDEX, k.t, v.t, kc.t, vc.t, sm_huge.t);
    CASE("duplicate slot (pairwise)", "slot_mapping", LK_ERR_INDEX, k.t, v.t, kc.t, vc.t, sm_dup.t);
    CASE("duplicate slot (bitmap)", "slot_mapping", LK_ERR_INDEX, k2.t, v2.t, kc2.t, vc2.t, sm_dup2.t);
    {
        lk_tensor a = kc.t, b = vc.t;
        a.shape[0] = b.shape[0] = 0;
        CASE("slot in a cache of 0 blocks", "slot_mapping", LK_ERR_INDEX, k.t, v.t, a, b, sm.t);
    }
    t = k.t; t.ndim = 2;
    CASE("k rank 2", "k", LK_ERR_RANK, t, v.t, kc.t, vc.t, sm.t);
    t = kc.t; t.ndim = 3;
    CASE("k_cache rank 3", "k_cache", LK_ERR_RANK, k.t, v.t, t, vc.t, sm.t);
    t = vc.t; t.ndim = 5; t.shape[4] = 1; t.stride[4] = 1;
    CASE("v_cache rank 5", "v_cache", LK_ERR_RANK, k.t, v.t, kc.t, t, sm.t);
    t = sm.t; t.ndim = 2; t.shape[1] = 1; t.stride[1] = 1;
    CASE("slot_mapping rank 2", "slot_mapping", LK_ERR_RANK, k.t, v.t, kc.t, vc.t, t);
    t = v.t; t.shape[0] = 5;
    CASE("v tokens mismatch", "v", LK_ERR_SHAPE, k.t, t, kc.t, vc.t, sm.t);
    t = v.t; t.shape[1] = 1;
    CASE("v heads mismatch", "v", LK_ERR_SHAPE, k.t, t, kc.t, vc.t, sm.t);
    t = kc.t; t.shape[3] = 7;
    CASE("k_cache D mismatch", "k_cache", LK_ERR_SHAPE, k.t, v.t, t, vc.t, sm.t);
    t = kc.t; t.shape[2] = 1;
    CASE("k_cache H mismatch", "k_cache", LK_ERR_SHAPE, k.t, v.t, t, vc.t, sm.t);
    t = vc.t; t.shape[0] = 2;
    CASE("v_cache num_blocks mismatch", "v_cache", LK_ERR_SHAPE, k.t, v.t, kc.t, t, sm.t);
    t = vc.t; t.shape[1] = 2;
    CASE("v_cache block_size mismatch", "v_cache", LK_ERR_SHAPE, k.t, v.t, kc.t, t, sm.t);
    t = vc.t; t.shape[3] = 4;
    CASE("v_cache D mismatch with v", "v_cache", LK_ERR_SHAPE, k.t, v.t, kc.t, t, sm.t);
    {
        lk_tensor a = kc.t, b = vc.t;
        a.shape[1] = b.shape[1] = 0;
        CASE("block_size 0", "k_cache", LK_ERR_SHAPE, k.t, v.t, a, b, sm.t);
    }
    t = sm.t; t.shape[0] = 7;
    CASE("slot_mapping longer than T", "slot_mapping", LK_ERR_SHAPE, k.t, v.t, kc.t, vc.t, t);
    t = sm.t; t.dtype = LK_F32;
    CASE("slot_mapping float dtype", "slot_mapping", LK_ERR_DTYPE, k.t, v.t, kc.t, vc.t, t);
    t = k.t; t.dtype = LK_I32;
    CASE("k int dtype", "k", LK_ERR_DTYPE, t, v.t, kc.t, vc.t, sm.t);
    t = vc.t; t.dtype = (lk_dtype)42;
    CASE("v_cache unknown dtype", "v_cache", LK_ERR_DTYPE, k.t, v.t, kc.t, t, sm.t);
    t = kc.t; t.data = NULL;
    CASE("k_cache NULL data", "k_cache", LK_ERR_NULL, k.t, v.t, t, vc.t, sm.t);
    t = v.t; t.data = NULL;
    CASE("v NULL data", "v", LK_ERR_NULL, k.t, t, kc.t, vc.t, sm.t);
    t = k.t; t.shape[2] = -1;
    CASE("k negative size", "k", LK_ERR_SHAPE, t, v.t, kc.t, vc.t, sm.t);
    t = kc.t; t.stride[0] = INT64_MAX / 4;
    CASE("k_cache stride overflow", "k_cache", LK_ERR_OVERFLOW, k.t, v.t, t, vc.t, sm.t);
    t = kc.t; t.stride[1] = 0;
    CASE("k_cache stride 0 overlaps itself", "k_cache", LK_ERR_ALIAS, k.t, v.t, t, vc.t, sm.t);
    t = vc.t; t.stride[2] = 4;
    CASE("v_cache heads overlap", "v_cache", LK_ERR_ALIAS, k.t, v.t, kc.t, t, sm.t);
    CASE("k_cache is v_cache", "k_cache", LK_ERR_ALIAS, k.t, v.t, kc.t, kc.t, sm.t);
    {
        /* caches inside big: [NB, bs, H, D] at offset 0 and shifted by one element */
        lk_tensor a = kc.t, b = kc.t, kk = k.t, ss = sm.t;
        a.data = big.t.data;
        b.data = (float *)big.t.data + 1;
        CASE("v_cache partially overlaps k_cache", "k_cache", LK_ERR_ALIAS, k.t, v.t, a, b, sm.t);
        /* interleaved views whose per-block rows collide: [NB, 2, bs, H, D] with v
         * starting half a block in */
        lk_tensor ik = kc.t, iv = kc.t;
        ik.data = big.t.data;
        ik.stride[0] = 2 * bs * H * D;
        iv = ik;
        iv.data = (float *)big.t.data + bs * H * D / 2;
        CASE("interleaved caches overlap", "k_cache", LK_ERR_ALIAS, k.t, v.t, ik, iv, sm.t);
        b.data = (float *)big.t.data + NB * bs * H * D;
        kk.data = (float *)big.t.data + 5; /* k inside k_cache */
        CASE("k overlaps k_cache", "k_cache", LK_ERR_ALIAS, kk, v.t, a, b, sm.t);
        kk.data = (float *)big.t.data + NB * bs * H * D + 3; /* k inside v_cache */
        CASE("k overlaps v_cache", "v_cache", LK_ERR_ALIAS, kk, v.t, a, b, sm.t);
        kk.data = (float *)big.t.data + NB * bs * H * D + 3; /* v inside v_cache */
        CASE("v overlaps v_cache", "v_cache", LK_ERR_ALIAS, k.t, kk, a, b, sm.t);
        kk.data = big.t.data;
        CASE("v overlaps k_cache", "k_cache", LK_ERR_ALIAS, k.t, kk, a, b, sm.t);
        ss.data = (float *)big.t.data + 2; /* slot_mapping (i64) inside k_cache */
        ss.dtype = LK_I32;
        CASE("slot_mapping overlaps k_cache", "slot_mapping", LK_ERR_ALIAS, k.t, v.t, a, b, ss);
    }
#undef CASE
    for (int i = 0; i < n; i++) {
        tu_buf *all[] = {&k, &v, &kc, &vc, &big, &sm, &sm_range, &sm_huge, &sm_dup, &k2, &v2, &kc2, &vc2, &sm_dup2};
        for (size_t j = 0; j < sizeof all / sizeof all[0]; j++) tu_snapshot(all[j]);
        lk_status st = lk_reshape_and_cache_flash(&cases[i].k, &cases[i].v, &cases[i].kc, &cases[i].vc, &cases[i].sm);
        const char *msg = lk_last_error();
        int intact = 1;
        for (size_t j = 0; j < sizeof all / sizeof all[0]; j++) intact &= tu_intact(all[j]);
        tu_check(st == cases[i].want && names_arg(msg, cases[i].arg) &&
                     strstr(msg, "lk_reshape_and_cache_flash: ") == msg && intact,
                 "bad input '%s' -> %s (%s)%s", cases[i].what, lk_status_str(st), msg,
                 intact ? "" : " WROTE SOMETHING");
    }
    const char *names[5] = {"k", "v", "k_cache", "v_cache", "slot_mapping"};
    for (int i = 0; i < 5; i++) {
        const lk_tensor *p[5] = {&k.t, &v.t, &kc.t, &vc.t, &sm.t};
        p[i] = NULL;
        lk_status st = lk_reshape_and_cache_flash(p[0], p[1], p[2], p[3], p[4]);
        tu_check(st == LK_ERR_NULL && names_arg(lk_last_error(), names[i]),
                 "NULL %s pointer (%s)", names[i], lk_last_error());
    }
    /* the valid call works and clears the error text */
    lk_status st = lk_reshape_and_cache_flash(&k.t, &v.t, &kc.t, &vc.t, &sm.t);
    tu_check(st == LK_OK && lk_last_error()[0] == 0, "valid call succeeds, clears lk_last_error");
    tu_buf *all[] = {&k, &v, &kc, &vc, &big, &sm, &sm_range, &sm_huge, &sm_dup, &k2, &v2, &kc2, &vc2, &sm_dup2};
    for (size_t j = 0; j < sizeof all / sizeof all[0]; j++) tu_free(all[j]);
}

/* fuzz regression (fuzz_kv_cache): v [2, 2, 0] (Dv = 0, an empty view) whose head stride
 * is 2^62. The kernels still walked v's heads and computed stride * element size and
 * head offsets from the unvalidated strides (signed overflow, UBSan). Every ISA: LK_OK,
 * k copied to its slots, nothing else written. */
static void test_regress_empty_v_huge_stride(void) {
    lk_isa isas[TU_MAX_ISAS];
    int ni = tu_isas(isas);
    float kb[4] = {1, 2, 3, 4};
    uint16_t vb[1] = {0};
    int64_t slots[2] = {3, 0};
    lk_tensor k = lk_tensor_make(kb, LK_F32, 3, (int64_t[]){2, 2, 1});
    lk_tensor v = lk_tensor_make(vb, LK_BF16, 3, (int64_t[]){2, 2, 0});
    v.stride[1] = (int64_t)1 << 62;
    lk_tensor sm = lk_tensor_make(slots, LK_I64, 1, (int64_t[]){2});
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        float kc[1 * 5 * 2 * 1];
        uint16_t vc[1] = {0x7fc1};
        for (int i = 0; i < 10; i++) kc[i] = -7.0f;
        lk_tensor tkc = lk_tensor_make(kc, LK_F32, 4, (int64_t[]){1, 5, 2, 1});
        lk_tensor tvc = lk_tensor_make(vc, LK_BF16, 4, (int64_t[]){1, 5, 2, 0});
        lk_status st = lk_reshape_and_cache_flash(&k, &v, &tkc, &tvc, &sm);
        int ok = st == LK_OK && vc[0] == 0x7fc1;
        for (int i = 0; i < 10; i++) {
            int slot = i / 2, h = i % 2;
            float want = slot == 3 ? kb[h] : slot == 0 ? kb[2 + h] : -7.0f;
            ok &= kc[i] == want;
        }
        tu_check(ok, "regress %s: empty v with a 2^62 head stride (%s)", lk_isa_name(isas[ii]),
                 lk_status_str(st));
    }
    lk_set_isa(lk_isa_best());
}

int main(void) {
    tu_init();
    test_grid();
    test_fp8_grid();
    test_fp8_bad();
    test_special_layouts();
    test_qkv_slices();
    test_sparse_cache();
    test_threads();
    test_empty();
    test_bad_inputs();
    test_regress_empty_v_huge_stride();
    return tu_finish("test_kv_cache");
}
