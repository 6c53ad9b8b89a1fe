/*
 * The fp8 cache operators (since 0.3): lk_reshape_and_cache_flash_fp8 (per-tensor and
 * per-head [H] scales, ND and NZ), lk_concat_and_cache_mla_fp8, lk_gather_cache_fp8,
 * lk_convert_fp8, and lk_swap_blocks / lk_copy_blocks on fp8 caches.
 *
 * Every case runs on every ISA and is compared over the WHOLE allocation of what it
 * writes (written elements, unused slots, padding garbage, guard zones) against an
 * element-by-element expectation built with the scalar converters of src/core (fp8.h
 * through half.h): fp8(x / scale) into fp8, round(f32(q) * scale) out of it. The
 * expectation itself is checked against float64 (docs/numerics.md "fp8": within half an
 * fp8 step of x / scale, +-max beyond the max; out of fp8 within the output dtype's
 * rounding of q * scale). NZ caches (32-wide tiles for fp8) are read back through
 * their physical index and must equal the ND results bit for bit. Grid: page sizes 1, 7,
 * 16, 128; padding slots; strided (padded) views with garbage; empty inputs; bad scales
 * (0, < 0, NaN, inf; wrong shape / dtype) rejected naming the argument, nothing written.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "core/half.h"
#include "testutil.h"

static const int64_t PAGES[4] = {1, 7, 16, 128};

/* element offset of logical (page p, slot s, head h, dim d) of a paged cache view:
 * ND [NB, bs, H, D] (or [NB, bs, D]), NZ [NB, C / tile, bs, tile] */
static int64_t poff(const lk_tensor *t, int nz, int64_t D, int64_t p, int64_t s, int64_t h, int64_t d) {
    if (!nz) {
        if (t->ndim == 3) return p * t->stride[0] + s * t->stride[1] + d * t->stride[2];
        return p * t->stride[0] + s * t->stride[1] + h * t->stride[2] + d * t->stride[3];
    }
    int64_t c = h * D + d, tile = t->shape[3];
    return p * t->stride[0] + (c / tile) * t->stride[1] + s * t->stride[2] + (c % tile) * t->stride[3];
}

/* byte index in the allocation of element offset off */
static size_t bidx(const tu_buf *b, int64_t off) {
    return (size_t)((const unsigned char *)b->t.data - b->base) + (size_t)(off * (int64_t)lk_dtype_size(b->t.dtype));
}

/* a paged cache of H x D entries: ND [NB, bs, H, D] (3-D when H3) or NZ */
static tu_buf cache_alloc(lk_dtype dt, int nz, int64_t NB, int64_t bs, int64_t H, int64_t D, int pad, int H3) {
    int64_t tile = lk_dtype_size(dt) == 1 ? 32 : 16;
    tu_buf b = nz   ? tu_alloc(dt, 4, (int64_t[]){NB, H * D / tile, bs, tile}, pad)
               : H3 ? tu_alloc(dt, 3, (int64_t[]){NB, bs, D}, pad)
                    : tu_alloc(dt, 4, (int64_t[]){NB, bs, H, D}, pad);
    return b;
}

/* distinct slots in [0, nslots), every 5th token padding (-1) */
static int64_t *make_slots(int64_t N, int64_t nslots) {
    int64_t *perm = tu_permutation(nslots);
    int64_t *s = malloc(sizeof(int64_t) * (size_t)(N > 0 ? N : 1));
    for (int64_t t = 0; t < N; t++) s[t] = t % 5 == 3 ? -1 : perm[t];
    free(perm);
    return s;
}

static tu_buf slot_buf(const int64_t *s, int64_t N) {
    tu_buf b = tu_alloc(LK_I64, 1, &N, 1);
    for (int64_t t = 0; t < N; t++) tu_set(&b, t, (double)s[t]);
    return b;
}

/* values of a source: mostly in the range where scale 1 / 32 saturates e4m3 sometimes,
 * a few specials */
static void fill_src(tu_buf *b) {
    int64_t n = tu_numel(b);
    for (int64_t i = 0; i < n; i++) {
        double x = tu_uniform(-12, 12) * pow(2.0, (double)tu_randint(-12, 4));
        int64_t r = tu_randint(0, 199);
        if (r == 0) x = NAN;
        else if (r == 1) x = INFINITY;
        else if (r == 2) x = -INFINITY;
        else if (r == 3) x = 0.0;
        else if (r == 4) x = -0.0;
        tu_set(b, i, x);
    }
}

static tu_buf scale_tensor(int n, const float *v) {
    int64_t s = n;
    tu_buf b = tu_alloc(LK_F32, 1, &s, 2); /* strided, garbage between */
    for (int i = 0; i < n; i++) tu_set(&b, i, v[i]);
    return b;
}

static int names(const char *arg) { return strstr(lk_last_error(), arg) != NULL; }

/* ---------------------------------------------------------------- reshape_and_cache_flash_fp8 */

typedef struct {
    lk_dtype kct, vct, kt, vt;
    int64_t bs, H, Dk, Dv;
    int scale_kind; /* 0 NULL, 1 [1], 2 [H] */
    int pad;
} rc_case;

static const float SC[4] = {0.03125f, 3.7f, 1.0f, 0.25f};

/* expected cache bytes: the snapshot with every written element replaced */
static unsigned char *rc_expect(const tu_buf *c, int nz, const tu_buf *src, const int64_t *slots, int64_t N,
                                const float *sc, int per_head, int *close_ok) {
    unsigned char *w = malloc(c->bytes);
    memcpy(w, c->base, c->bytes);
    int64_t H = src->t.shape[1], D = src->t.shape[2], bs = nz ? c->t.shape[2] : c->t.shape[1];
    lk_dtype dt = c->t.dtype;
    size_t es = lk_dtype_size(dt);
    for (int64_t t = 0; t < N; t++) {
        if (slots[t] < 0) continue;
        for (int64_t h = 0; h < H; h++)
            for (int64_t d = 0; d < D; d++) {
                float x = (float)tu_get(src, (t * H + h) * D + d), s = sc ? sc[per_head ? h : 0] : 1.0f;
                size_t at = bidx(c, poff(&c->t, nz, D, slots[t] / bs, slots[t] % bs, h, d));
                if (lk_is_fp8(dt)) {
                    lk_store_f(w + at, dt, 0, x / s);
                    if (!tu_fp8_close(dt, x, s, lk_load_f(w + at, dt, 0))) *close_ok = 0;
                } else if (dt == src->t.dtype) memcpy(w + at, (const unsigned char *)src->t.data +
                                                                  tu_offset(&src->t, (t * H + h) * D + d) * (int64_t)es,
                                                          es);
                else lk_store_f(w + at, dt, 0, x);
            }
    }
    return w;
}

static void rc_run(const rc_case *cs) {
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    int64_t T = 2 * cs->bs + 5, N = T - 1, NB = (T + cs->bs - 1) / cs->bs + 2, H = cs->H;
    tu_buf k = tu_alloc(cs->kt, 3, (int64_t[]){T, H, cs->Dk}, cs->pad);
    tu_buf v = tu_alloc(cs->vt, 3, (int64_t[]){T, H, cs->Dv}, cs->pad);
    fill_src(&k);
    fill_src(&v);
    int64_t *slots = make_slots(N, NB * cs->bs);
    tu_buf sm = slot_buf(slots, N);
    float ksv[8], vsv[8];
    for (int h = 0; h < H; h++) ksv[h] = SC[(h + 1) % 4], vsv[h] = SC[h % 4] * 2;
    int per_head = cs->scale_kind == 2, ns = per_head ? (int)H : 1;
    tu_buf kst = scale_tensor(ns, ksv), vst = scale_tensor(ns, vsv);
    tu_snapshot(&k), tu_snapshot(&v), tu_snapshot(&sm), tu_snapshot(&kst), tu_snapshot(&vst);
    const float *ksp = cs->scale_kind ? ksv : NULL, *vsp = cs->scale_kind ? vsv : NULL;
    unsigned char *nd_bytes[2] = {NULL, NULL};
    for (int nz = 0; nz < 2; nz++) {
        tu_buf kc = cache_alloc(cs->kct, nz, NB, cs->bs, H, cs->Dk, cs->pad, 0);
        tu_buf vc = cache_alloc(cs->vct, nz, NB, cs->bs, H, cs->Dv, cs->pad, 0);
        int close = 1;
        unsigned char *wk = rc_expect(&kc, nz, &k, slots, N, ksp, per_head, &close);
        unsigned char *wv = rc_expect(&vc, nz, &v, slots, N, vsp, per_head, &close);
        tu_check(close, "fp8 rc kc=%s vc=%s bs=%lld scales=%d: expectation within half an fp8 step of float64",
                 lk_dtype_name(cs->kct), lk_dtype_name(cs->vct), (long long)cs->bs, cs->scale_kind);
        unsigned char *k0 = malloc(kc.bytes), *v0 = malloc(vc.bytes);
        memcpy(k0, kc.base, kc.bytes);
        memcpy(v0, vc.base, vc.bytes);
        for (int ii = 0; ii < nisa; ii++) {
            lk_set_isa(isas[ii]);
            memcpy(kc.base, k0, kc.bytes);
            memcpy(vc.base, v0, vc.bytes);
            lk_status st = lk_reshape_and_cache_flash_fp8(&k.t, &v.t, &kc.t, &vc.t, &sm.t,
                                                          cs->scale_kind ? &kst.t : NULL,
                                                          cs->scale_kind ? &vst.t : NULL, nz ? LK_KV_NZ : LK_KV_ND);
            tu_check(st == LK_OK && !memcmp(kc.base, wk, kc.bytes) && !memcmp(vc.base, wv, vc.bytes),
                     "fp8 rc isa=%s %s kc=%s vc=%s k=%s bs=%lld H=%lld Dk=%lld Dv=%lld scales=%d pad=%d: "
                     "whole caches as expected (%s)",
                     lk_isa_name(isas[ii]), nz ? "NZ" : "ND", lk_dtype_name(cs->kct), lk_dtype_name(cs->vct),
                     lk_dtype_name(cs->kt), (long long)cs->bs, (long long)H, (long long)cs->Dk, (long long)cs->Dv,
                     cs->scale_kind, cs->pad, lk_last_error());
        }
        lk_set_isa(isas[nisa - 1]);
        /* logical contents of the NZ cache equal the ND one's bit for bit */
        size_t per = (size_t)(NB * cs->bs * H * (cs->Dk + cs->Dv)) * 4;
        unsigned char *lg = calloc(per ? per : 1, 1);
        size_t o = 0;
        for (int which = 0; which < 2; which++) {
            tu_buf *c = which ? &vc : &kc;
            int64_t D = which ? cs->Dv : cs->Dk;
            size_t es = lk_dtype_size(c->t.dtype);
            for (int64_t p = 0; p < NB; p++)
                for (int64_t s = 0; s < cs->bs; s++) {
                    int used = 0;
                    for (int64_t t = 0; t < N; t++) used |= slots[t] == p * cs->bs + s;
                    if (!used) continue;
                    for (int64_t h = 0; h < H; h++)
                        for (int64_t d = 0; d < D; d++, o += es)
                            memcpy(lg + o, c->base + bidx(c, poff(&c->t, nz, D, p, s, h, d)), es);
                }
        }
        if (!nz) nd_bytes[0] = lg, nd_bytes[1] = (unsigned char *)(uintptr_t)o;
        else {
            tu_check((size_t)(uintptr_t)nd_bytes[1] == o && !memcmp(nd_bytes[0], lg, o),
                     "fp8 rc kc=%s vc=%s bs=%lld scales=%d: NZ reads equal ND bit for bit", lk_dtype_name(cs->kct),
                     lk_dtype_name(cs->vct), (long long)cs->bs, cs->scale_kind);
            free(lg);
            free(nd_bytes[0]);
        }
        free(wk), free(wv), free(k0), free(v0);
        tu_free(&kc), tu_free(&vc);
    }
    tu_check(tu_intact(&k) && tu_intact(&v) && tu_intact(&sm) && tu_intact(&kst) && tu_intact(&vst),
             "fp8 rc bs=%lld: inputs (and their padding) untouched", (long long)cs->bs);
    free(slots);
    tu_free(&k), tu_free(&v), tu_free(&sm), tu_free(&kst), tu_free(&vst);
}

static void test_rc_grid(void) {
    static const lk_dtype MIX[4][2] = {{LK_F8E4M3, LK_F8E5M2}, {LK_F8E5M2, LK_F8E4M3}, {LK_F8E4M3, LK_BF16},
                                       {LK_F16, LK_F8E4M3}};
    for (int pi = 0; pi < 4; pi++)
        for (int m = 0; m < 4; m++)
            for (int sk = 0; sk < 3; sk++) {
                if (tu_emulated() && (pi != 2 || sk != 2)) continue;
                rc_case cs = {MIX[m][0], MIX[m][1], m & 1 ? LK_F32 : LK_BF16, m & 2 ? LK_F16 : LK_F32,
                              PAGES[pi], 4, 48, 40, sk, (m + sk) & 1};
                tu_seed(100 + (uint64_t)(pi * 16 + m * 4 + sk));
                rc_run(&cs);
            }
    /* one head of 128 dims (long ND runs, two-W steps), one of 32 */
    rc_case a = {LK_F8E4M3, LK_F8E4M3, LK_BF16, LK_BF16, 16, 1, 128, 32, 2, 1};
    rc_run(&a);
    rc_case b = {LK_F8E5M2, LK_F8E5M2, LK_F32, LK_F16, 7, 8, 4, 12, 2, 0};
    rc_run(&b);
}

/* bad scales and shapes: rejected naming the argument, caches untouched */
static void test_rc_bad(void) {
    int64_t T = 4, H = 2, D = 16, NB = 2, bs = 4;
    tu_buf k = tu_alloc(LK_F32, 3, (int64_t[]){T, H, D}, 0), v = tu_alloc(LK_F32, 3, (int64_t[]){T, H, D}, 0);
    fill_src(&k), fill_src(&v);
    int64_t sl[4] = {0, 3, -1, 5};
    tu_buf sm = slot_buf(sl, T);
    tu_buf kc = cache_alloc(LK_F8E4M3, 0, NB, bs, H, D, 1, 0), vc = cache_alloc(LK_F8E5M2, 0, NB, bs, H, D, 1, 0);
    tu_snapshot(&kc), tu_snapshot(&vc);
    float bad[4] = {0.0f, -1.0f, NAN, INFINITY};
    for (int i = 0; i < 4; i++)
        for (int which = 0; which < 2; which++) {
            float vals[2] = {1.0f, bad[i]};
            tu_buf s = scale_tensor(2, vals), good = scale_tensor(2, (float[]){1, 2});
            lk_status st = lk_reshape_and_cache_flash_fp8(&k.t, &v.t, &kc.t, &vc.t, &sm.t, which ? &good.t : &s.t,
                                                          which ? &s.t : &good.t, LK_KV_ND);
            tu_check(st == LK_ERR_VALUE && names(which ? "v_scale[1]" : "k_scale[1]") && tu_intact(&kc) &&
                         tu_intact(&vc),
                     "fp8 rc: %s[1] = %g rejected naming it, nothing written (%s)", which ? "v_scale" : "k_scale",
                     (double)bad[i], lk_last_error());
            tu_free(&s), tu_free(&good);
        }
    tu_buf s3 = scale_tensor(3, (float[]){1, 1, 1});
    tu_check(lk_reshape_and_cache_flash_fp8(&k.t, &v.t, &kc.t, &vc.t, &sm.t, &s3.t, NULL, LK_KV_ND) == LK_ERR_SHAPE &&
                 names("k_scale") && tu_intact(&kc),
             "fp8 rc: k_scale [3] for 2 heads rejected naming it (%s)", lk_last_error());
    tu_buf sb = tu_alloc(LK_BF16, 1, (int64_t[]){1}, 0);
    tu_set(&sb, 0, 1.0);
    tu_check(lk_reshape_and_cache_flash_fp8(&k.t, &v.t, &kc.t, &vc.t, &sm.t, NULL, &sb.t, LK_KV_ND) == LK_ERR_DTYPE &&
                 names("v_scale") && tu_intact(&vc),
             "fp8 rc: bf16 v_scale rejected naming it (%s)", lk_last_error());
    /* NZ fp8 needs C % 32 == 0: H x D = 2 x 8 = 16 */
    tu_buf k8 = tu_alloc(LK_F32, 3, (int64_t[]){T, H, 8}, 0), v8 = tu_alloc(LK_F32, 3, (int64_t[]){T, H, 8}, 0);
    fill_src(&k8), fill_src(&v8);
    tu_buf kz = tu_alloc(LK_F8E4M3, 4, (int64_t[]){NB, 1, bs, 16}, 0), vz = tu_alloc(LK_F8E4M3, 4, (int64_t[]){NB, 1, bs, 16}, 0);
    tu_snapshot(&kz);
    tu_check(lk_reshape_and_cache_flash_fp8(&k8.t, &v8.t, &kz.t, &vz.t, &sm.t, NULL, NULL, LK_KV_NZ) == LK_ERR_SHAPE &&
                 names("k_cache") && tu_intact(&kz),
             "fp8 rc: NZ fp8 cache with C = 16 (16-wide tile) rejected naming k_cache (%s)", lk_last_error());
    tu_check(lk_reshape_and_cache_flash_fp8(&k.t, &v.t, &kc.t, &vc.t, &sm.t, NULL, NULL, (lk_kv_layout)7) ==
                 LK_ERR_VALUE && tu_intact(&kc),
             "fp8 rc: unknown layout rejected (%s)", lk_last_error());
    /* the float-scalar entry: bad scales named too */
    tu_check(lk_reshape_and_cache_flash_scaled(&k.t, &v.t, &kc.t, &vc.t, &sm.t, 1.0f, NAN) == LK_ERR_VALUE &&
                 names("v_scale") && tu_intact(&vc),
             "fp8 rc scaled: v_scale NaN rejected (%s)", lk_last_error());
    /* empty: no tokens, and only padding slots */
    tu_buf e = tu_alloc(LK_I64, 1, (int64_t[]){0}, 0);
    tu_check(lk_reshape_and_cache_flash_fp8(&k.t, &v.t, &kc.t, &vc.t, &e.t, NULL, NULL, LK_KV_ND) == LK_OK && tu_intact(&kc) &&
                 tu_intact(&vc),
             "fp8 rc: empty slot_mapping writes nothing (%s)", lk_last_error());
    int64_t pads[4] = {-1, -1, -1, -1};
    tu_buf sp = slot_buf(pads, 4);
    tu_check(lk_reshape_and_cache_flash_fp8(&k.t, &v.t, &kc.t, &vc.t, &sp.t, NULL, NULL, LK_KV_ND) == LK_OK &&
                 tu_intact(&kc) && tu_intact(&vc),
             "fp8 rc: padding-only slots write nothing (%s)", lk_last_error());
    tu_free(&k), tu_free(&v), tu_free(&sm), tu_free(&kc), tu_free(&vc), tu_free(&s3), tu_free(&sb);
    tu_free(&k8), tu_free(&v8), tu_free(&kz), tu_free(&vz), tu_free(&e), tu_free(&sp);
}

/* ---------------------------------------------------------------- concat_and_cache_mla_fp8 */

static void mla_run(lk_dtype ct, int two, int64_t bs, int scale_kind, int pad) {
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    int64_t T = bs + 6, N = T - 1, NB = (T + bs - 1) / bs + 1, Dl = 64, Dr = 32;
    tu_buf kv = tu_alloc(LK_BF16, 2, (int64_t[]){T, Dl}, pad), pe = tu_alloc(LK_F32, 2, (int64_t[]){T, Dr}, pad);
    fill_src(&kv), fill_src(&pe);
    int64_t *slots = make_slots(N, NB * bs);
    tu_buf sm = slot_buf(slots, N);
    float sv = scale_kind == 2 ? 3.7f : 0.5f;
    tu_buf st = scale_tensor(1, &sv);
    if (scale_kind == 1) st.t.ndim = 0; /* [] */
    float s = scale_kind ? sv : 1.0f;
    unsigned char *lg[2] = {NULL, NULL};
    size_t lgn = 0;
    for (int nz = 0; nz < 2; nz++) {
        tu_buf c0 = cache_alloc(ct, nz, NB, bs, 1, two ? Dl : Dl + Dr, pad, 1);
        tu_buf c1 = two ? cache_alloc(ct, nz, NB, bs, 1, Dr, pad, 1) : (tu_buf){0};
        unsigned char *w0 = malloc(c0.bytes), *w1 = two ? malloc(c1.bytes) : NULL;
        memcpy(w0, c0.base, c0.bytes);
        if (two) memcpy(w1, c1.base, c1.bytes);
        int close = 1;
        for (int64_t t = 0; t < N; t++) {
            if (slots[t] < 0) continue;
            for (int64_t e = 0; e < Dl + Dr; e++) {
                float x = (float)(e < Dl ? tu_get(&kv, t * Dl + e) : tu_get(&pe, t * Dr + e - Dl));
                int in1 = two && e >= Dl;
                tu_buf *c = in1 ? &c1 : &c0;
                int64_t D = two ? (in1 ? Dr : Dl) : Dl + Dr, d = in1 ? e - Dl : e;
                unsigned char *w = in1 ? w1 : w0;
                size_t at = bidx(c, poff(&c->t, nz, D, slots[t] / bs, slots[t] % bs, 0, d));
                lk_store_f(w + at, ct, 0, x / s);
                close &= tu_fp8_close(ct, x, s, lk_load_f(w + at, ct, 0));
            }
        }
        tu_check(close, "fp8 concat %s: expectation within half an fp8 step of float64", lk_dtype_name(ct));
        unsigned char *i0 = malloc(c0.bytes), *i1 = two ? malloc(c1.bytes) : NULL;
        memcpy(i0, c0.base, c0.bytes);
        if (two) memcpy(i1, c1.base, c1.bytes);
        for (int ii = 0; ii < nisa; ii++) {
            lk_set_isa(isas[ii]);
            memcpy(c0.base, i0, c0.bytes);
            if (two) memcpy(c1.base, i1, c1.bytes);
            lk_status r = lk_concat_and_cache_mla_fp8(&kv.t, &pe.t, &c0.t, two ? &c1.t : NULL, &sm.t,
                                                      nz ? LK_KV_NZ : LK_KV_ND, scale_kind ? &st.t : NULL);
            tu_check(r == LK_OK && !memcmp(c0.base, w0, c0.bytes) && (!two || !memcmp(c1.base, w1, c1.bytes)),
                     "fp8 concat isa=%s %s %s %s bs=%lld scale=%d pad=%d: whole caches as expected (%s)",
                     lk_isa_name(isas[ii]), nz ? "NZ" : "ND", two ? "two buffers" : "one buffer", lk_dtype_name(ct),
                     (long long)bs, scale_kind, pad, lk_last_error());
        }
        lk_set_isa(isas[nisa - 1]);
        /* logical entries, ND vs NZ */
        unsigned char *l = malloc((size_t)(N * (Dl + Dr)) + 1);
        size_t o = 0;
        for (int64_t t = 0; t < N; t++) {
            if (slots[t] < 0) continue;
            for (int64_t e = 0; e < Dl + Dr; e++) {
                int in1 = two && e >= Dl;
                tu_buf *c = in1 ? &c1 : &c0;
                int64_t D = two ? (in1 ? Dr : Dl) : Dl + Dr, d = in1 ? e - Dl : e;
                l[o++] = c->base[bidx(c, poff(&c->t, nz, D, slots[t] / bs, slots[t] % bs, 0, d))];
            }
        }
        lg[nz] = l, lgn = o;
        free(w0), free(w1), free(i0), free(i1);
        tu_free(&c0);
        if (two) tu_free(&c1);
    }
    tu_check(!memcmp(lg[0], lg[1], lgn), "fp8 concat %s %s bs=%lld: NZ entries equal ND bit for bit",
             two ? "two buffers" : "one buffer", lk_dtype_name(ct), (long long)bs);
    free(lg[0]), free(lg[1]), free(slots);
    tu_free(&kv), tu_free(&pe), tu_free(&sm), tu_free(&st);
}

static void test_mla(void) {
    for (int pi = 0; pi < 4; pi++)
        for (int two = 0; two < 2; two++)
            for (int sk = 0; sk < 3; sk++) {
                if (tu_emulated() && (pi != 2 || sk != 2)) continue;
                tu_seed(300 + (uint64_t)(pi * 8 + two * 3 + sk));
                mla_run((pi + sk) & 1 ? LK_F8E5M2 : LK_F8E4M3, two, PAGES[pi], sk, (two + sk) & 1);
            }
    /* bad scale; the plain entry still rejects fp8 caches */
    int64_t T = 3;
    tu_buf kv = tu_alloc(LK_F32, 2, (int64_t[]){T, 32}, 0), pe = tu_alloc(LK_F32, 2, (int64_t[]){T, 32}, 0);
    fill_src(&kv), fill_src(&pe);
    int64_t sl[3] = {1, 0, 2};
    tu_buf sm = slot_buf(sl, T);
    tu_buf c = cache_alloc(LK_F8E4M3, 0, 1, 4, 1, 64, 1, 1);
    tu_snapshot(&c);
    float bad[4] = {0.0f, -2.0f, NAN, -INFINITY};
    for (int i = 0; i < 4; i++) {
        tu_buf s = scale_tensor(1, &bad[i]);
        tu_check(lk_concat_and_cache_mla_fp8(&kv.t, &pe.t, &c.t, NULL, &sm.t, LK_KV_ND, &s.t) == LK_ERR_VALUE &&
                     names("scale") && tu_intact(&c),
                 "fp8 concat: scale %g rejected naming it, nothing written (%s)", (double)bad[i], lk_last_error());
        tu_free(&s);
    }
    tu_buf s2 = scale_tensor(2, (float[]){1, 1});
    tu_check(lk_concat_and_cache_mla_fp8(&kv.t, &pe.t, &c.t, NULL, &sm.t, LK_KV_ND, &s2.t) == LK_ERR_SHAPE &&
                 names("scale") && tu_intact(&c),
             "fp8 concat: scale [2] rejected (%s)", lk_last_error());
    tu_check(lk_concat_and_cache_mla(&kv.t, &pe.t, &c.t, NULL, &sm.t, LK_KV_ND) == LK_ERR_DTYPE &&
                 names("kv_c_cache") && tu_intact(&c),
             "concat (plain entry): fp8 cache rejected naming kv_c_cache (%s)", lk_last_error());
    tu_buf e = tu_alloc(LK_I64, 1, (int64_t[]){0}, 0);
    tu_check(lk_concat_and_cache_mla_fp8(&kv.t, &pe.t, &c.t, NULL, &e.t, LK_KV_ND, NULL) == LK_OK && tu_intact(&c),
             "fp8 concat: empty slot_mapping writes nothing (%s)", lk_last_error());
    tu_free(&kv), tu_free(&pe), tu_free(&sm), tu_free(&c), tu_free(&s2), tu_free(&e);
}

/* ---------------------------------------------------------------- gather_cache_fp8 */

/* random fp8 codes, a few NaN / inf codes among them */
static void fill_codes(tu_buf *b) {
    lk_dtype dt = b->t.dtype;
    int64_t n = tu_numel(b);
    for (int64_t i = 0; i < n; i++) {
        unsigned char q = (unsigned char)tu_randint(0, 255);
        if (dt == LK_F8E4M3 && (q & 0x7f) == 0x7f && tu_randint(0, 3)) q ^= 1;
        unsigned char *p = b->t.data;
        p[tu_offset(&b->t, i)] = q;
    }
}

/* with_starts: lk_gather_cache_starts with seq_starts {bs + 1, 3, bs - 1} (token j of
 * request b at position seq_starts[b] + j of its block table; the entries of pages
 * before a request's first position are -1: never looked at) */
static void gather_run(lk_dtype ct, lk_dtype ot, int64_t bs, int H, int scale_kind, int pad, int with_starts) {
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    int64_t D = 96 / H, C = 96, B = 3, lens[3] = {bs + 3, 0, 2 * bs - 1}, maxp = with_starts ? 8 : 4, NB = 8, S = 0;
    int64_t starts[3] = {0, 0, 0};
    if (with_starts) starts[0] = bs + 1, starts[1] = 3, starts[2] = bs - 1;
    for (int b = 0; b < B; b++) S += lens[b];
    tu_buf bt = tu_alloc(LK_I32, 2, (int64_t[]){B, maxp}, 1);
    for (int64_t i = 0; i < B * maxp; i++)
        tu_set(&bt, i, i % maxp < starts[i / maxp] / bs ? -1.0 : (double)tu_randint(0, NB - 1));
    tu_buf sl = tu_alloc(LK_I32, 1, &B, 0), ss = tu_alloc(LK_I32, 1, &B, 1);
    for (int b = 0; b < B; b++) tu_set(&sl, b, (double)lens[b]), tu_set(&ss, b, (double)starts[b]);
    float sv = scale_kind == 2 ? 0.0625f : 3.7f;
    tu_buf st = scale_tensor(1, &sv);
    float s = scale_kind ? sv : 1.0f;
    unsigned char *outs[2] = {NULL, NULL};
    tu_buf nd = cache_alloc(ct, 0, NB, bs, H, D, pad, 0);
    fill_codes(&nd);
    for (int nz = 0; nz < 2; nz++) {
        tu_buf c = nz ? cache_alloc(ct, 1, NB, bs, H, D, pad, 0) : nd;
        if (nz) /* the same logical contents */
            for (int64_t p = 0; p < NB; p++)
                for (int64_t j = 0; j < bs; j++)
                    for (int64_t h = 0; h < H; h++)
                        for (int64_t d = 0; d < D; d++)
                            c.base[bidx(&c, poff(&c.t, 1, D, p, j, h, d))] = nd.base[bidx(&nd, poff(&nd.t, 0, D, p, j, h, d))];
        tu_buf out = tu_alloc(ot, 2, (int64_t[]){S, C}, pad);
        unsigned char *w = malloc(out.bytes);
        memcpy(w, out.base, out.bytes);
        size_t oes = lk_dtype_size(ot);
        int close = 1;
        for (int64_t b = 0, t = 0; b < B; b++)
            for (int64_t j = 0; j < lens[b]; j++, t++) {
                int64_t pos = starts[b] + j, page = (int64_t)tu_get(&bt, b * maxp + pos / bs);
                for (int64_t e = 0; e < C; e++) {
                    size_t at = bidx(&out, tu_offset(&out.t, t * C + e));
                    const unsigned char *q = c.base + bidx(&c, poff(&c.t, nz, D, page, pos % bs, e / D, e % D));
                    if (ot == ct) memcpy(w + at, q, 1);
                    else {
                        float qv = lk_load_f(q, ct, 0);
                        lk_store_f(w + at, ot, 0, qv * s);
                        double want = (double)qv * s, got = lk_load_f(w + at, ot, 0);
                        if (ot == LK_F16 && fabs(want) >= 65520) want = want > 0 ? INFINITY : -INFINITY;
                        if (!(isnan(want) ? isnan(got) : isinf(want) ? got == want
                                                                     : fabs(got - want) <= (ot == LK_F16 ? 0x1p-25 : 1e-40) + fabs(want) * (ot == LK_F32 ? 0x1p-24 : ot == LK_F16 ? 0x1p-11 : 0x1p-8)))
                            close = 0;
                    }
                }
            }
        tu_check(close, "fp8 gather %s -> %s: expectation within the output rounding of q * scale (float64)",
                 lk_dtype_name(ct), lk_dtype_name(ot));
        unsigned char *i0 = malloc(out.bytes);
        memcpy(i0, out.base, out.bytes);
        tu_snapshot(&c);
        for (int ii = 0; ii < nisa; ii++) {
            lk_set_isa(isas[ii]);
            memcpy(out.base, i0, out.bytes);
            lk_kv_layout lay = nz ? LK_KV_NZ : LK_KV_ND;
            const lk_tensor *stp = scale_kind ? &st.t : NULL;
            lk_status r = with_starts ? lk_gather_cache_starts(&out.t, &c.t, &bt.t, &sl.t, &ss.t, lay, stp)
                                      : lk_gather_cache_fp8(&out.t, &c.t, &bt.t, &sl.t, lay, stp);
            tu_check(r == LK_OK && !memcmp(out.base, w, out.bytes) && tu_intact(&c),
                     "fp8 gather%s isa=%s %s %s -> %s bs=%lld H=%d scale=%d pad=%d: whole out as expected (%s)",
                     with_starts ? " (seq_starts)" : "", lk_isa_name(isas[ii]), nz ? "NZ" : "ND", lk_dtype_name(ct),
                     lk_dtype_name(ot), (long long)bs, H, scale_kind, pad, lk_last_error());
        }
        lk_set_isa(isas[nisa - 1]);
        outs[nz] = malloc((size_t)(S * C) * oes + 1);
        for (int64_t i = 0; i < S * C; i++) memcpy(outs[nz] + i * (int64_t)oes, out.base + bidx(&out, tu_offset(&out.t, i)), oes);
        free(w), free(i0);
        tu_free(&out);
        if (nz) tu_free(&c);
    }
    tu_check(!memcmp(outs[0], outs[1], (size_t)(S * C) * lk_dtype_size(ot)),
             "fp8 gather %s -> %s bs=%lld: NZ equals ND bit for bit", lk_dtype_name(ct), lk_dtype_name(ot),
             (long long)bs);
    free(outs[0]), free(outs[1]);
    tu_free(&nd), tu_free(&bt), tu_free(&sl), tu_free(&st), tu_free(&ss);
}

/* seq_starts through a 16-bit cache: equal to lk_gather_cache over the block table
 * shifted by whole pages (starts multiples of bs); NULL seq_starts equal to no starts;
 * and the errors: nothing written */
static void test_gather_starts(void) {
    int64_t bs = 4, B = 2, maxp = 6, NB = 9, C = 24, lens[2] = {9, 5}, pst[2] = {2, 1}, S = 14;
    tu_buf c = cache_alloc(LK_BF16, 0, NB, bs, 1, C, 1, 1);
    tu_fill_uniform(&c, -3, 3);
    tu_buf bt = tu_alloc(LK_I32, 2, (int64_t[]){B, maxp}, 0), bt2 = tu_alloc(LK_I32, 2, (int64_t[]){B, maxp}, 0);
    for (int64_t i = 0; i < B * maxp; i++) tu_set(&bt, i, (double)tu_randint(0, NB - 1)), tu_set(&bt2, i, -1);
    for (int64_t b = 0; b < B; b++)
        for (int64_t p = pst[b]; p < maxp; p++) tu_set(&bt2, b * maxp + p - pst[b], tu_get(&bt, b * maxp + p));
    tu_buf sl = tu_alloc(LK_I32, 1, &B, 0), ss = tu_alloc(LK_I32, 1, &B, 0);
    for (int b = 0; b < B; b++) tu_set(&sl, b, (double)lens[b]), tu_set(&ss, b, (double)(pst[b] * bs));
    tu_buf o1 = tu_alloc(LK_F32, 2, (int64_t[]){S, C}, 1), o2 = tu_alloc(LK_F32, 2, (int64_t[]){S, C}, 1);
    lk_status r1 = lk_gather_cache_starts(&o1.t, &c.t, &bt.t, &sl.t, &ss.t, LK_KV_ND, NULL);
    lk_status r2 = lk_gather_cache(&o2.t, &c.t, &bt2.t, &sl.t, LK_KV_ND);
    tu_check(r1 == LK_OK && r2 == LK_OK && tu_same_bits(&o1, &o2),
             "gather seq_starts (bf16 cache, starts of whole pages) = gather over the shifted block table (%s)",
             lk_last_error());
    r1 = lk_gather_cache_starts(&o1.t, &c.t, &bt2.t, &sl.t, NULL, LK_KV_ND, NULL);
    tu_check(r1 == LK_OK && tu_same_bits(&o1, &o2), "gather_cache_starts with NULL seq_starts = lk_gather_cache (%s)",
             lk_last_error());
    /* errors */
    tu_buf *all[] = {&o1, &c, &bt, &sl, &ss};
    for (int k = 0; k < 5; k++) tu_snapshot(all[k]);
    struct {
        int64_t b, v;
        lk_status want;
        const char *name, *what;
    } E[] = {{0, -1, LK_ERR_INDEX, "seq_starts", "a negative start"},
             {0, maxp * bs - lens[0] + 1, LK_ERR_INDEX, "seq_starts", "start + len one past the block table"},
             {1, maxp * bs, LK_ERR_INDEX, "seq_starts", "start at the block table's end"},
             {1, 2147483647, LK_ERR_INDEX, "seq_starts", "start INT32_MAX"}};
    for (size_t k = 0; k < sizeof E / sizeof E[0]; k++) {
        for (int b = 0; b < B; b++) tu_set(&ss, b, 0);
        ((int32_t *)ss.t.data)[E[k].b * ss.t.stride[0]] = (int32_t)E[k].v;
        tu_snapshot(&ss);
        lk_status r = lk_gather_cache_starts(&o1.t, &c.t, &bt.t, &sl.t, &ss.t, LK_KV_ND, NULL);
        int intact = 1;
        for (int j = 0; j < 5; j++) intact &= tu_intact(all[j]);
        tu_check(r == E[k].want && names(E[k].name) && intact, "gather seq_starts: %s -> %s naming %s, nothing written (%s)",
                 E[k].what, lk_status_str(r), E[k].name, lk_last_error());
    }
    /* the last valid start: the request's last token in the table's last slot */
    for (int b = 0; b < B; b++) tu_set(&ss, b, (double)(maxp * bs - lens[b]));
    tu_check(lk_gather_cache_starts(&o1.t, &c.t, &bt.t, &sl.t, &ss.t, LK_KV_ND, NULL) == LK_OK,
             "gather seq_starts: start + len = max_pages * block_size is valid (%s)", lk_last_error());
    /* a block id of a page read through the start out of range */
    for (int b = 0; b < B; b++) tu_set(&ss, b, 0);
    tu_set(&ss, 1, (double)bs);
    tu_set(&bt, 1 * maxp + 2, (double)NB);
    for (int k = 0; k < 5; k++) tu_snapshot(all[k]);
    lk_status r = lk_gather_cache_starts(&o1.t, &c.t, &bt.t, &sl.t, &ss.t, LK_KV_ND, NULL);
    tu_check(r == LK_ERR_INDEX && names("block_table") && tu_intact(&o1),
             "gather seq_starts: a block id of a page read after the shift out of range -> block_table (%s)",
             lk_last_error());
    tu_set(&bt, 1 * maxp + 0, (double)NB); /* a page before the start: not looked at */
    tu_set(&bt, 1 * maxp + 2, 0);
    tu_check(lk_gather_cache_starts(&o1.t, &c.t, &bt.t, &sl.t, &ss.t, LK_KV_ND, NULL) == LK_OK,
             "gather seq_starts: block_table entries of pages before the start are not looked at (%s)", lk_last_error());
    tu_buf s64 = tu_alloc(LK_I64, 1, &B, 0), s3 = tu_alloc(LK_I32, 1, (int64_t[]){B + 1}, 0);
    tu_snapshot(&o1);
    tu_check(lk_gather_cache_starts(&o1.t, &c.t, &bt.t, &sl.t, &s64.t, LK_KV_ND, NULL) == LK_ERR_DTYPE &&
                 names("seq_starts") && tu_intact(&o1),
             "gather seq_starts: i64 rejected naming it (%s)", lk_last_error());
    tu_check(lk_gather_cache_starts(&o1.t, &c.t, &bt.t, &sl.t, &s3.t, LK_KV_ND, NULL) == LK_ERR_SHAPE &&
                 names("seq_starts") && tu_intact(&o1),
             "gather seq_starts: [B + 1] rejected naming it (%s)", lk_last_error());
    lk_tensor ov = lk_tensor_make(o1.t.data, LK_I32, 1, &B); /* seq_starts over the out */
    tu_check(lk_gather_cache_starts(&o1.t, &c.t, &bt.t, &sl.t, &ov, LK_KV_ND, NULL) == LK_ERR_ALIAS &&
                 names("seq_starts") && tu_intact(&o1),
             "gather seq_starts: overlapping out rejected naming it (%s)", lk_last_error());
    tu_free(&c), tu_free(&bt), tu_free(&bt2), tu_free(&sl), tu_free(&ss), tu_free(&o1), tu_free(&o2), tu_free(&s64),
        tu_free(&s3);
}

static void test_gather(void) {
    static const lk_dtype OT[4] = {LK_F32, LK_BF16, LK_F16, 0};
    for (int pi = 0; pi < 4; pi++)
        for (int o = 0; o < 4; o++)
            for (int sk = 0; sk < 3; sk++) {
                if (tu_emulated() && (pi != 2 || sk != 2)) continue;
                lk_dtype ct = (pi + o) & 1 ? LK_F8E5M2 : LK_F8E4M3;
                tu_seed(500 + (uint64_t)(pi * 16 + o * 3 + sk));
                gather_run(ct, o == 3 ? ct : OT[o], PAGES[pi], o & 1 ? 2 : 1, sk, (o + sk) & 1, 0);
                if (sk == (pi + o) % 3) /* seq_starts: one scale kind per (page size, out) */
                    gather_run(ct, o == 3 ? ct : OT[o], PAGES[pi], o & 1 ? 2 : 1, sk, (o + sk) & 1, 1);
            }
    test_gather_starts();
    /* errors: fp8 out of another cache dtype, bad scale */
    int64_t B = 1, S = 2, bs = 4;
    tu_buf c = cache_alloc(LK_BF16, 0, 2, bs, 1, 32, 0, 1), c8 = cache_alloc(LK_F8E4M3, 0, 2, bs, 1, 32, 0, 1);
    fill_codes(&c8);
    tu_buf o8 = tu_alloc(LK_F8E4M3, 2, (int64_t[]){S, 32}, 0), of = tu_alloc(LK_F32, 2, (int64_t[]){S, 32}, 1);
    tu_buf bt = tu_alloc(LK_I32, 2, (int64_t[]){B, 1}, 0), sl = tu_alloc(LK_I32, 1, &B, 0);
    tu_set(&bt, 0, 1), tu_set(&sl, 0, (double)S);
    tu_snapshot(&o8), tu_snapshot(&of);
    tu_check(lk_gather_cache_fp8(&o8.t, &c.t, &bt.t, &sl.t, LK_KV_ND, NULL) == LK_ERR_DTYPE && names("out") && tu_intact(&o8),
             "fp8 gather: fp8 out of a bf16 cache rejected naming out (%s)", lk_last_error());
    float bad[4] = {0.0f, -1.0f, NAN, INFINITY};
    for (int i = 0; i < 4; i++) {
        tu_buf s = scale_tensor(1, &bad[i]);
        tu_check(lk_gather_cache_fp8(&of.t, &c8.t, &bt.t, &sl.t, LK_KV_ND, &s.t) == LK_ERR_VALUE && names("scale") &&
                     tu_intact(&of),
                 "fp8 gather: scale %g rejected naming it, nothing written (%s)", (double)bad[i], lk_last_error());
        tu_free(&s);
    }
    tu_check(lk_gather_cache(&of.t, &c8.t, &bt.t, &sl.t, LK_KV_ND) == LK_ERR_DTYPE && names("cache") && tu_intact(&of),
             "gather (plain entry): fp8 cache rejected naming cache (%s)", lk_last_error());
    tu_free(&c), tu_free(&c8), tu_free(&o8), tu_free(&of), tu_free(&bt), tu_free(&sl);
}

/* ---------------------------------------------------------------- convert_fp8 */

static void convert_run(lk_dtype ft, lk_dtype qt, int64_t bs, int pad, float s) {
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    int64_t sh[4] = {3, bs, 2, 40};
    for (int dir = 0; dir < 2; dir++) { /* 0: quantize f -> q, 1: dequantize q -> f */
        tu_buf src = tu_alloc(dir ? qt : ft, 4, sh, pad), dst = tu_alloc(dir ? ft : qt, 4, sh, 1 - pad);
        if (dir) fill_codes(&src);
        else fill_src(&src);
        int64_t n = tu_numel(&src);
        unsigned char *w = malloc(dst.bytes);
        memcpy(w, dst.base, dst.bytes);
        int close = 1;
        for (int64_t i = 0; i < n; i++) {
            size_t at = bidx(&dst, tu_offset(&dst.t, i));
            float x = (float)tu_get(&src, i);
            if (dir) {
                lk_store_f(w + at, ft, 0, x * s);
                double want = (double)x * s, got = lk_load_f(w + at, ft, 0);
                double rel = ft == LK_F32 ? 0x1p-24 : ft == LK_F16 ? 0x1p-11 : 0x1p-8;
                if (ft == LK_F16 && fabs(want) >= 65520) want = want > 0 ? INFINITY : -INFINITY; /* f16 overflow */
                if (!(isnan(want) ? isnan(got) : isinf(want) ? got == want : fabs(got - want) <= fabs(want) * rel + (ft == LK_F16 ? 0x1p-25 : 1e-40)))
                    close = 0;
            } else {
                lk_store_f(w + at, qt, 0, x / s);
                close &= tu_fp8_close(qt, x, s, lk_load_f(w + at, qt, 0));
            }
        }
        tu_check(close, "convert_fp8 %s %s: expectation vs float64", lk_dtype_name(src.t.dtype), lk_dtype_name(dst.t.dtype));
        unsigned char *i0 = malloc(dst.bytes);
        memcpy(i0, dst.base, dst.bytes);
        tu_snapshot(&src);
        for (int ii = 0; ii < nisa; ii++) {
            lk_set_isa(isas[ii]);
            memcpy(dst.base, i0, dst.bytes);
            lk_status r = lk_convert_fp8(&dst.t, &src.t, s);
            tu_check(r == LK_OK && !memcmp(dst.base, w, dst.bytes) && tu_intact(&src),
                     "convert_fp8 isa=%s %s -> %s bs=%lld pad=%d scale=%g: whole dst as expected (%s)",
                     lk_isa_name(isas[ii]), lk_dtype_name(src.t.dtype), lk_dtype_name(dst.t.dtype), (long long)bs, pad,
                     (double)s, lk_last_error());
        }
        lk_set_isa(isas[nisa - 1]);
        free(w), free(i0);
        tu_free(&src), tu_free(&dst);
    }
}

static void test_convert(void) {
    static const lk_dtype FT[3] = {LK_F32, LK_F16, LK_BF16};
    static const float S[3] = {1.0f, 0.03125f, 3.7f};
    for (int pi = 0; pi < 4; pi++)
        for (int f = 0; f < 3; f++)
            for (int q = 0; q < 2; q++) {
                if (tu_emulated() && pi != 2) continue;
                tu_seed(700 + (uint64_t)(pi * 8 + f * 2 + q));
                convert_run(FT[f], q ? LK_F8E5M2 : LK_F8E4M3, PAGES[pi], (f + q + pi) & 1, S[(pi + f) % 3]);
            }
    /* a transposed src (non-unit last stride) */
    tu_buf src = tu_alloc_perm(LK_F32, 2, (int64_t[]){5, 33}, (int[]){1, 0}, 0);
    tu_buf d0 = tu_alloc(LK_F8E4M3, 2, (int64_t[]){5, 33}, 0), d1 = tu_alloc(LK_F8E4M3, 2, (int64_t[]){5, 33}, 0);
    fill_src(&src);
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    lk_set_isa(isas[0]);
    lk_convert_fp8(&d0.t, &src.t, 0.5f);
    lk_set_isa(isas[nisa - 1]);
    lk_convert_fp8(&d1.t, &src.t, 0.5f);
    tu_check(tu_same_bits(&d0, &d1), "convert_fp8: transposed src, every ISA as ref");
    /* errors */
    tu_snapshot(&d0);
    float bad[4] = {0.0f, -1.0f, NAN, INFINITY};
    for (int i = 0; i < 4; i++)
        tu_check(lk_convert_fp8(&d0.t, &src.t, bad[i]) == LK_ERR_VALUE && names("scale") && tu_intact(&d0),
                 "convert_fp8: scale %g rejected naming it, nothing written (%s)", (double)bad[i], lk_last_error());
    tu_check(lk_convert_fp8(&d0.t, &d1.t, 1.0f) == LK_ERR_DTYPE && names("dst") && tu_intact(&d0),
             "convert_fp8: fp8 -> fp8 rejected (%s)", lk_last_error());
    tu_buf f2 = tu_alloc(LK_BF16, 2, (int64_t[]){5, 33}, 0), f3 = tu_alloc(LK_F8E4M3, 2, (int64_t[]){5, 32}, 0);
    tu_snapshot(&f2), tu_snapshot(&f3);
    tu_check(lk_convert_fp8(&f2.t, &src.t, 1.0f) == LK_ERR_DTYPE && names("dst") && tu_intact(&f2),
             "convert_fp8: f32 -> bf16 rejected (%s)", lk_last_error());
    tu_check(lk_convert_fp8(&f3.t, &src.t, 1.0f) == LK_ERR_SHAPE && names("dst") && tu_intact(&f3),
             "convert_fp8: shape mismatch rejected (%s)", lk_last_error());
    tu_buf e0 = tu_alloc(LK_F8E4M3, 2, (int64_t[]){0, 4}, 0), e1 = tu_alloc(LK_F32, 2, (int64_t[]){0, 4}, 0);
    tu_check(lk_convert_fp8(&e0.t, &e1.t, 1.0f) == LK_OK, "convert_fp8: empty (%s)", lk_last_error());
    /* 0-d views (rank 0 is a shape like any other): one element each way, every ISA */
    for (int ii = 0; ii < nisa; ii++) {
        lk_set_isa(isas[ii]);
        float x = 3.0f, y = -1.0f;
        uint8_t q = 0xaa;
        lk_tensor tx = lk_tensor_make(&x, LK_F32, 0, NULL), tq = lk_tensor_make(&q, LK_F8E4M3, 0, NULL);
        lk_tensor ty = lk_tensor_make(&y, LK_F32, 0, NULL);
        lk_status r1 = lk_convert_fp8(&tq, &tx, 2.0f), r2 = lk_convert_fp8(&ty, &tq, 2.0f);
        tu_check(r1 == LK_OK && r2 == LK_OK && q == 0x3c && y == 3.0f,
                 "convert_fp8 isa=%s: 0-d f32 3 / 2 -> e4m3 0x3c (1.5) -> f32 3 (got 0x%02x, %g; %s)",
                 lk_isa_name(isas[ii]), q, (double)y, lk_last_error());
    }
    lk_set_isa(isas[nisa - 1]);
    tu_free(&src), tu_free(&d0), tu_free(&d1), tu_free(&f2), tu_free(&f3), tu_free(&e0), tu_free(&e1);
}

/* ---------------------------------------------------------------- block copies */

static void test_blocks(void) {
    int64_t NB = 6, sh[4] = {NB, 7, 2, 24};
    for (int q = 0; q < 2; q++) {
        lk_dtype dt = q ? LK_F8E5M2 : LK_F8E4M3;
        tu_buf src = tu_alloc(dt, 4, sh, q), dst = tu_alloc(dt, 4, sh, 1 - q);
        fill_codes(&src), fill_codes(&dst);
        tu_buf map = tu_alloc(LK_I64, 2, (int64_t[]){3, 2}, 0);
        int64_t m[6] = {4, 0, 1, 5, 1, 2};
        for (int i = 0; i < 6; i++) tu_set(&map, i, (double)m[i]);
        unsigned char *w = malloc(dst.bytes);
        memcpy(w, dst.base, dst.bytes);
        int64_t per = 7 * 2 * 24;
        for (int r = 0; r < 3; r++)
            for (int64_t e = 0; e < per; e++)
                w[bidx(&dst, tu_offset(&dst.t, m[2 * r + 1] * per + e))] = src.base[bidx(&src, tu_offset(&src.t, m[2 * r] * per + e))];
        unsigned char *i0 = malloc(dst.bytes);
        memcpy(i0, dst.base, dst.bytes);
        lk_isa isas[TU_MAX_ISAS];
        int nisa = tu_isas(isas);
        for (int ii = 0; ii < nisa; ii++) {
            lk_set_isa(isas[ii]);
            memcpy(dst.base, i0, dst.bytes);
            lk_status r = lk_swap_blocks(&src.t, &dst.t, &map.t);
            tu_check(r == LK_OK && !memcmp(dst.base, w, dst.bytes), "swap_blocks %s isa=%s: bytes copied, rest intact (%s)",
                     lk_dtype_name(dt), lk_isa_name(isas[ii]), lk_last_error());
            /* copy_blocks within src: blocks 4 -> 0 (0, 5 and 2 are not sources) */
            tu_buf c = tu_alloc(dt, 4, sh, 1);
            fill_codes(&c);
            unsigned char *cw = malloc(c.bytes);
            tu_buf mm = tu_alloc(LK_I32, 2, (int64_t[]){3, 2}, 0);
            int64_t m2[6] = {4, 0, 1, 5, 3, 2};
            for (int i = 0; i < 6; i++) tu_set(&mm, i, (double)m2[i]);
            memcpy(cw, c.base, c.bytes);
            for (int rr = 0; rr < 3; rr++)
                for (int64_t e = 0; e < per; e++)
                    cw[bidx(&c, tu_offset(&c.t, m2[2 * rr + 1] * per + e))] = c.base[bidx(&c, tu_offset(&c.t, m2[2 * rr] * per + e))];
            r = lk_copy_blocks(1, &c.t, &mm.t);
            tu_check(r == LK_OK && !memcmp(c.base, cw, c.bytes), "copy_blocks %s isa=%s: bytes copied (%s)",
                     lk_dtype_name(dt), lk_isa_name(isas[ii]), lk_last_error());
            free(cw);
            tu_free(&c), tu_free(&mm);
        }
        lk_set_isa(isas[nisa - 1]);
        tu_buf other = tu_alloc(q ? LK_F8E4M3 : LK_F8E5M2, 4, sh, 0);
        tu_snapshot(&other);
        tu_check(lk_swap_blocks(&src.t, &other.t, &map.t) == LK_ERR_DTYPE && names("dst") && tu_intact(&other),
                 "swap_blocks: e4m3 vs e5m2 rejected naming dst (%s)", lk_last_error());
        free(w), free(i0);
        tu_free(&src), tu_free(&dst), tu_free(&map), tu_free(&other);
    }
}

int main(void) {
    tu_init();
    test_rc_grid();
    test_rc_bad();
    test_mla();
    test_gather();
    test_convert();
    test_blocks();
    return tu_finish("test_fp8_cache");
}
