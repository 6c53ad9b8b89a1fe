/*
 * rotary_embedding: every ISA against a float64 computation and bit for bit against
 * ref (the kernels round the same products in the same order); NeoX and GPT-J, partial
 * rotary (rot < D), q only, q + k with GQA head counts, head dims 64/80/128/256 and odd
 * ones, rot/2 not a multiple of the vector width, rot/2 beyond one staging block,
 * odd token counts, strided views with garbage padding, q and k as slices of one fused
 * qkv buffer, a transposed view (reference fallback), a negative token stride, every dtype and mixed dtypes,
 * i32/i64 (and strided) positions, empty inputs, thread-count independence, and the
 * bad-input catalogue (incl. an out-of-range position on the last token).
 *
 * Integrity: after every call, every byte of every buffer except the rotated elements
 * q/k[.., .., 0:rot) must equal what was there before (non-rotated dims, the v part of
 * qkv, padding garbage, guard zones).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/half.h"
#include "testutil.h"

enum { L_CONTIG, L_PAD, L_FUSED, L_TRANSPOSED, NLAYOUTS };
static const char *LAYOUT_NAME[NLAYOUTS] = {"contig", "pad", "qkv", "transp"};

typedef struct {
    int64_t T, Hq, Hk, D, rot; /* Hk < 0: no k */
    int neox;
    lk_dtype qt, kt, ct, pt;
    int layout;
} rcase;

/* q, k views and the one or two buffers behind them */
typedef struct {
    tu_buf qb, kb; /* kb unused (base NULL) for L_FUSED or no k */
    lk_tensor q, k;
} qk_mem;

static qk_mem make_qk(const rcase *c) {
    qk_mem m;
    memset(&m, 0, sizeof m);
    int64_t T = c->T, D = c->D, Hk = c->Hk > 0 ? c->Hk : 0;
    if (c->layout == L_FUSED) {
        /* qkv[T, (Hq + 2 Hk) D] (+1 pad column); q = heads [0, Hq), k = the next Hk */
        int64_t W = (c->Hq + 2 * Hk) * D;
        m.qb = tu_alloc(c->qt, 2, (int64_t[]){T, W}, 1);
        int64_t ld = m.qb.t.stride[0];
        m.q = (lk_tensor){m.qb.t.data, c->qt, 3, {T, c->Hq, D}, {ld, D, 1}};
        m.k = (lk_tensor){(char *)m.qb.t.data + c->Hq * D * lk_dtype_size(c->qt), c->kt, 3,
                          {T, Hk, D}, {ld, D, 1}};
        tu_fill_uniform(&m.qb, -2, 2);
        return m;
    }
    const int perm[3] = {2, 0, 1}; /* transposed: D outermost, last-dim stride != 1 */
    const int *pp = c->layout == L_TRANSPOSED ? perm : NULL;
    int pad = c->layout == L_CONTIG ? 0 : 1;
    m.qb = tu_alloc_perm(c->qt, 3, (int64_t[]){T, c->Hq, D}, pp, pad);
    m.q = m.qb.t;
    tu_fill_uniform(&m.qb, -2, 2);
    if (c->Hk >= 0) {
        m.kb = tu_alloc_perm(c->kt, 3, (int64_t[]){T, Hk, D}, pp, pad);
        m.k = m.kb.t;
        tu_fill_uniform(&m.kb, -2, 2);
    }
    return m;
}

static void free_qk(qk_mem *m) {
    tu_free(&m->qb);
    if (m->kb.base) tu_free(&m->kb);
}

/* a second qk_mem with the same layout and the same bytes as m */
static qk_mem clone_qk(const rcase *c, const qk_mem *m) {
    qk_mem n = make_qk(c);
    memcpy(n.qb.base, m->qb.base, m->qb.bytes);
    if (m->kb.base) memcpy(n.kb.base, m->kb.base, m->kb.bytes);
    return n;
}

static double view_get(const lk_tensor *x, int64_t t, int64_t h, int64_t d) {
    return lk_load_f(x->data, x->dtype, t * x->stride[0] + h * x->stride[1] + d * x->stride[2]);
}

/* logical values of a [T, H, D] view, row-major */
static double *view_values(const lk_tensor *x) {
    int64_t T = x->shape[0], H = x->shape[1], D = x->shape[2];
    double *v = malloc(sizeof(double) * (size_t)(T * H * D > 0 ? T * H * D : 1));
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t d = 0; d < D; d++) v[(t * H + h) * D + d] = view_get(x, t, h, d);
    return v;
}

/* mark the bytes of x[.., .., 0:rot) that lie in buffer b */
static void mark_rot(unsigned char *may, const tu_buf *b, const lk_tensor *x, int64_t rot) {
    if (!x || !x->data) return;
    size_t es = lk_dtype_size(x->dtype);
    for (int64_t t = 0; t < x->shape[0]; t++)
        for (int64_t h = 0; h < x->shape[1]; h++)
            for (int64_t d = 0; d < rot; d++) {
                const unsigned char *p = (const unsigned char *)x->data +
                    (t * x->stride[0] + h * x->stride[1] + d * x->stride[2]) * (int64_t)es;
                if (p >= b->base && p < b->base + b->bytes) memset(may + (p - b->base), 1, es);
            }
}

/* every byte of b other than the rotated elements of x and y equals the snapshot */
static int only_rot_changed(const tu_buf *b, const lk_tensor *x, const lk_tensor *y, int64_t rot) {
    unsigned char *may = calloc(b->bytes, 1);
    mark_rot(may, b, x, rot);
    mark_rot(may, b, y, rot);
    int ok = 1;
    for (size_t i = 0; i < b->bytes && ok; i++) ok = may[i] || b->base[i] == b->snap[i];
    free(may);
    return ok;
}

/* positions: [T] values in [0, max_pos); strided (a column of [T, 2]) when `strided` */
static tu_buf make_positions(lk_dtype pt, int64_t T, int64_t max_pos, int strided, lk_tensor *view) {
    tu_buf b = tu_alloc(pt, 2, (int64_t[]){T, 2}, 0);
    for (int64_t i = 0; i < 2 * T; i++) tu_set(&b, i, (double)tu_randint(0, max_pos - 1));
    *view = (lk_tensor){b.t.data, pt, 1, {T}, {strided ? 2 : 1}};
    return b;
}

/* the cos / sin cache; layout 0 contiguous, 1 padded rows, 2 transposed (stride 1 along
 * max_pos) */
static tu_buf make_cache(lk_dtype ct, int64_t max_pos, int64_t rot, int layout) {
    return tu_cos_sin(ct, max_pos, rot, layout != 0, layout == 2);
}

/* float64 rotation of x[T, H, D] (row-major values) in place, rot dims only */
static void rope64(double *x, int64_t T, int64_t H, int64_t D, int64_t rot, int neox,
                   const int64_t *pos, const tu_buf *cache) {
    int64_t half = rot / 2;
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++) {
            double *r = x + (t * H + h) * D;
            for (int64_t i = 0; i < half; i++) {
                double c = tu_get(cache, pos[t] * rot + i), s = tu_get(cache, pos[t] * rot + half + i);
                int64_t ix = neox ? i : 2 * i, iy = neox ? i + half : 2 * i + 1;
                double xv = r[ix], yv = r[iy];
                r[ix] = xv * c - yv * s;
                r[iy] = yv * c + xv * s;
            }
        }
}

/* max error of the rotated dims of view x against want (row-major [T, H, D]) */
static double rot_err(const lk_tensor *x, const double *want, int64_t rot) {
    int64_t T = x->shape[0], H = x->shape[1], D = x->shape[2];
    double *got = view_values(x), worst = 0;
    tu_tolerance tol = tu_tol(x->dtype);
    for (int64_t r = 0; r < T * H; r++) {
        double e = tu_err(got + r * D, want + r * D, rot, tol);
        if (e > worst) worst = e;
    }
    free(got);
    return worst;
}

static int nrun;

static void run_case(const rcase *c) {
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    int has_k = c->Hk >= 0;
    int64_t max_pos = 97;
    qk_mem m0 = make_qk(c);
    lk_tensor pv;
    tu_buf pb = make_positions(c->pt, c->T, max_pos, c->layout != L_CONTIG, &pv);
    tu_buf cb = make_cache(c->ct, max_pos, c->rot,
                           c->layout == L_PAD ? 1 : c->layout == L_TRANSPOSED ? 2 : 0);
    int64_t *pos = malloc(sizeof(int64_t) * (size_t)(c->T + 1));
    for (int64_t t = 0; t < c->T; t++) pos[t] = lk_load_index(pv.data, pv.dtype, t * pv.stride[0]);
    double *wq = view_values(&m0.q), *wk = has_k ? view_values(&m0.k) : NULL;
    rope64(wq, c->T, c->Hq, c->D, c->rot, c->neox, pos, &cb);
    if (has_k) rope64(wk, c->T, c->Hk, c->D, c->rot, c->neox, pos, &cb);
    qk_mem ref;
    memset(&ref, 0, sizeof ref);
    char what[200];
    snprintf(what, sizeof what, "%s T=%lld Hq=%lld Hk=%lld D=%lld rot=%lld q=%s k=%s cache=%s pos=%s %s",
             c->neox ? "neox" : "gptj", (long long)c->T, (long long)c->Hq, (long long)c->Hk,
             (long long)c->D, (long long)c->rot, lk_dtype_name(c->qt), lk_dtype_name(c->kt),
             lk_dtype_name(c->ct), lk_dtype_name(c->pt), LAYOUT_NAME[c->layout]);
    for (int ii = 0; ii < nisa; ii++) {
        lk_set_isa(isas[ii]);
        qk_mem m = clone_qk(c, &m0);
        tu_snapshot(&m.qb);
        if (m.kb.base) tu_snapshot(&m.kb);
        tu_snapshot(&pb);
        tu_snapshot(&cb);
        lk_status st = lk_rotary_embedding(&pv, &m.q, has_k ? &m.k : NULL, &cb.t, c->neox);
        const lk_tensor *kp = has_k ? &m.k : NULL;
        int intact = only_rot_changed(&m.qb, &m.q, kp, c->rot) && tu_intact(&pb) && tu_intact(&cb);
        if (m.kb.base) intact = intact && only_rot_changed(&m.kb, kp, NULL, c->rot);
        double eq = rot_err(&m.q, wq, c->rot), ek = has_k ? rot_err(&m.k, wk, c->rot) : 0;
        tu_check(st == LK_OK && intact && eq <= 1 && ek <= 1,
                 "rotary %s %s: status %s, only rotated dims written %d, err q %.3g k %.3g %s",
                 lk_isa_name(isas[ii]), what, lk_status_str(st), intact, eq, ek, lk_last_error());
        if (ii == 0) {
            ref = m;
        } else {
            int same = memcmp(m.qb.base, ref.qb.base, m.qb.bytes) == 0 &&
                       (!m.kb.base || memcmp(m.kb.base, ref.kb.base, m.kb.bytes) == 0);
            tu_check(same, "rotary %s bit-identical to ref: %s", lk_isa_name(isas[ii]), what);
            free_qk(&m);
        }
        nrun++;
    }
    lk_set_isa(lk_isa_best());
    free_qk(&ref);
    free_qk(&m0);
    tu_free(&pb);
    tu_free(&cb);
    free(pos);
    free(wq);
    free(wk);
}

static void test_cases(void) {
    /* T, Hq, Hk, D, rot */
    static const int64_t shapes[][5] = {
        {1, 32, 8, 128, 128},  /* Llama-3-8B decode, GQA 32/8 */
        {3, 4, 2, 128, 64},    /* partial rotary 64 of 128 */
        {7, 3, 1, 80, 32},     /* partial rotary 32 of 80 */
        {33, 2, 1, 64, 64},    /* odd T */
        {3, 2, -1, 256, 256},  /* q only, D 256 */
        {5, 2, 1, 256, 128},
        {33, 16, 1, 64, 64},   /* DeepSeek-V2-Lite rope part */
        {7, 1, 1, 10, 6},      /* rot/2 = 3: tails only */
        {3, 2, 3, 40, 36},     /* rot/2 = 18: two steps + tail, Hk > Hq */
        {4, 2, 1, 2, 2},       /* one pair */
        {1, 1, 1, 31, 30},     /* odd D */
        {2, 1, 2, 640, 600},   /* rot/2 = 300 > one staging block of 256 pairs */
    };
    /* q, k, cache */
    static const lk_dtype dts[][3] = {{LK_F32, LK_F32, LK_F32},    {LK_F16, LK_F16, LK_F16},
                                      {LK_BF16, LK_BF16, LK_BF16}, {LK_BF16, LK_BF16, LK_F32},
                                      {LK_F16, LK_BF16, LK_F32},   {LK_F32, LK_BF16, LK_F16}};
    int n = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int neox = 0; neox <= 1; neox++)
            for (int d = 0; d < 6; d++)
                for (int layout = 0; layout < NLAYOUTS; layout++) {
                    rcase c = {shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], shapes[s][4],
                               neox, dts[d][0], dts[d][1], dts[d][2], (n++ & 1) ? LK_I32 : LK_I64,
                               layout};
                    if (layout == L_FUSED && (c.Hk < 0 || c.qt != c.kt)) continue;
                    if (layout == L_TRANSPOSED && d != 3 && d != 4) continue; /* ref path: a few */
                    run_case(&c);
                }
}

/* bitwise identical for 1..4 threads, on a shape large enough to go parallel, and
 * identical to ref there too */
static void test_threads(void) {
    for (int neox = 0; neox <= 1; neox++) {
        rcase c = {301, 32, 8, 128, 128, neox, LK_BF16, LK_BF16, LK_F32, LK_I64, L_FUSED};
        qk_mem m0 = make_qk(&c);
        lk_tensor pv;
        tu_buf pb = make_positions(LK_I64, c.T, 4096, 0, &pv);
        tu_buf cb = make_cache(LK_F32, 4096, 128, 0);
        qk_mem first = clone_qk(&c, &m0);
        lk_set_num_threads(1);
        lk_rotary_embedding(&pv, &first.q, &first.k, &cb.t, neox);
        for (int nt = 2; nt <= 4; nt++) {
            qk_mem m = clone_qk(&c, &m0);
            lk_set_num_threads(nt);
            lk_status st = lk_rotary_embedding(&pv, &m.q, &m.k, &cb.t, neox);
            tu_check(st == LK_OK && memcmp(m.qb.base, first.qb.base, m.qb.bytes) == 0,
                     "rotary %s bitwise identical with %d threads", neox ? "neox" : "gptj", nt);
            free_qk(&m);
        }
        qk_mem r = clone_qk(&c, &m0);
        lk_set_isa(LK_ISA_REF);
        lk_rotary_embedding(&pv, &r.q, &r.k, &cb.t, neox);
        lk_set_isa(lk_isa_best());
        tu_check(memcmp(r.qb.base, first.qb.base, r.qb.bytes) == 0,
                 "rotary %s large parallel case identical to ref", neox ? "neox" : "gptj");
        lk_set_num_threads(0);
        free_qk(&r);
        free_qk(&first);
        free_qk(&m0);
        tu_free(&pb);
        tu_free(&cb);
    }
}

/* q with a negative token stride (tokens stored in reverse) equals the contiguous call
 * with the positions reversed, bit for bit, on every ISA */
/* q + k of 16 MiB or more take the prefetch of the rows ahead (AVX2): bitwise equal to
 * ref, contiguous and as slices of one fused qkv buffer, NeoX and GPT-J, bf16 and f32 */
static void test_large_inputs(void) {
    for (int k = 0; k < (tu_emulated() ? 1 : 4); k++) { /* emulated: GPT-J bf16 contiguous alone */
        int neox = k % 2, layout = k < 2 ? L_CONTIG : L_FUSED;
        lk_dtype dt = k == 3 ? LK_F32 : LK_BF16;
        rcase c = {2049, 32, 8, 128, 128, neox, dt, dt, LK_F32, LK_I64, layout};
        qk_mem m0 = make_qk(&c);
        lk_tensor pv;
        tu_buf pb = make_positions(LK_I64, c.T, 8192, 0, &pv);
        tu_buf cb = make_cache(LK_F32, 8192, 128, 0);
        qk_mem a = clone_qk(&c, &m0), r = clone_qk(&c, &m0);
        lk_status st = lk_rotary_embedding(&pv, &a.q, &a.k, &cb.t, neox);
        lk_set_isa(LK_ISA_REF);
        lk_rotary_embedding(&pv, &r.q, &r.k, &cb.t, neox);
        lk_set_isa(lk_isa_best());
        int same = memcmp(a.qb.base, r.qb.base, a.qb.bytes) == 0 &&
                   (!a.kb.base || memcmp(a.kb.base, r.kb.base, a.kb.bytes) == 0);
        tu_check(st == LK_OK && same, "rotary %s %s %s [2049, 32 + 8, 128] identical to ref",
                 neox ? "neox" : "gptj", LAYOUT_NAME[layout], lk_dtype_name(dt));
        free_qk(&a), free_qk(&r), free_qk(&m0);
        tu_free(&pb), tu_free(&cb);
    }
}

static void test_negative_stride(void) {
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    int64_t T = 9, H = 3, D = 48;
    tu_buf cache = make_cache(LK_F32, 64, 32, 0);
    tu_buf pos = tu_alloc(LK_I32, 1, &T, 0), rpos = tu_alloc(LK_I32, 1, &T, 0);
    for (int64_t t = 0; t < T; t++) {
        int64_t v = tu_randint(0, 63);
        tu_set(&pos, t, (double)v);
        tu_set(&rpos, T - 1 - t, (double)v);
    }
    for (int ii = 0; ii < nisa; ii++)
        for (int neox = 0; neox <= 1; neox++) {
            lk_set_isa(isas[ii]);
            tu_buf a = tu_alloc(LK_BF16, 3, (int64_t[]){T, H, D}, 0), b = tu_alloc(LK_BF16, 3, (int64_t[]){T, H, D}, 0);
            tu_fill_uniform(&a, -2, 2);
            memcpy(b.base, a.base, a.bytes);
            lk_tensor rev = a.t;
            rev.data = (uint16_t *)a.t.data + (T - 1) * H * D;
            rev.stride[0] = -H * D;
            lk_status s1 = lk_rotary_embedding(&pos.t, &rev, NULL, &cache.t, neox);
            lk_status s2 = lk_rotary_embedding(&rpos.t, &b.t, NULL, &cache.t, neox);
            tu_check(s1 == LK_OK && s2 == LK_OK && memcmp(a.base, b.base, a.bytes) == 0,
                     "rotary %s %s negative token stride == reversed positions", lk_isa_name(isas[ii]),
                     neox ? "neox" : "gptj");
            tu_free(&a);
            tu_free(&b);
        }
    lk_set_isa(lk_isa_best());
    tu_free(&cache);
    tu_free(&pos);
    tu_free(&rpos);
}

/* T = 0, no heads, rot = 0: no-ops that write nothing (positions still validated) */
static void test_empty(void) {
    tu_buf q = tu_alloc(LK_F32, 3, (int64_t[]){3, 2, 8}, 0), k = tu_alloc(LK_F32, 3, (int64_t[]){3, 0, 8}, 0);
    tu_buf cache = make_cache(LK_F32, 16, 8, 0), cache0 = tu_alloc(LK_F32, 2, (int64_t[]){16, 0}, 0);
    tu_buf pos = tu_alloc(LK_I64, 1, (int64_t[]){3}, 0);
    tu_fill_uniform(&q, -1, 1);
    for (int i = 0; i < 3; i++) tu_set(&pos, i, i + 1);
    tu_snapshot(&q);
    tu_snapshot(&k);
    lk_tensor q0 = q.t, k0 = k.t, p0 = pos.t;
    q0.shape[0] = k0.shape[0] = p0.shape[0] = 0;
    lk_status st = lk_rotary_embedding(&p0, &q0, &k0, &cache.t, 1);
    tu_check(st == LK_OK && tu_intact(&q) && tu_intact(&k), "rotary T = 0 is a no-op (%s)", lk_last_error());
    lk_tensor qh = q.t;
    qh.shape[1] = 0;
    st = lk_rotary_embedding(&pos.t, &qh, &k.t, &cache.t, 0);
    tu_check(st == LK_OK && tu_intact(&q) && tu_intact(&k), "rotary Hq = Hk = 0 is a no-op (%s)", lk_last_error());
    for (int neox = 0; neox <= 1; neox++) { /* q rotated, k has no heads: same as ref */
        tu_buf q1 = tu_alloc(LK_F32, 3, (int64_t[]){3, 2, 8}, 0), q2 = tu_alloc(LK_F32, 3, (int64_t[]){3, 2, 8}, 0);
        memcpy(q1.base, q.base, q.bytes), memcpy(q2.base, q.base, q.bytes);
        st = lk_rotary_embedding(&pos.t, &q1.t, &k.t, &cache.t, neox);
        lk_set_isa(LK_ISA_REF);
        lk_status st2 = lk_rotary_embedding(&pos.t, &q2.t, &k.t, &cache.t, neox);
        lk_set_isa(lk_isa_best());
        tu_check(st == LK_OK && st2 == LK_OK && memcmp(q1.base, q2.base, q1.bytes) == 0 && tu_intact(&k),
                 "rotary %s with Hk = 0 rotates q as ref (%s)", neox ? "neox" : "gptj", lk_last_error());
        tu_free(&q1), tu_free(&q2);
    }
    st = lk_rotary_embedding(&pos.t, &q.t, NULL, &cache0.t, 1);
    tu_check(st == LK_OK && tu_intact(&q), "rotary rot = 0 is a no-op (%s)", lk_last_error());
    tu_set(&pos, 2, 16);
    st = lk_rotary_embedding(&pos.t, &q.t, NULL, &cache0.t, 1);
    tu_check(st == LK_ERR_INDEX && tu_intact(&q), "rotary rot = 0 still checks positions -> %s",
             lk_status_str(st));
    tu_free(&q);
    tu_free(&k);
    tu_free(&cache);
    tu_free(&cache0);
    tu_free(&pos);
}

/* each rule: right status, message names the op and the argument, nothing written */
static void test_bad_inputs(void) {
    int64_t T = 4, Hq = 4, Hk = 2, D = 16, rot = 16, max_pos = 32;
    tu_buf q = tu_alloc(LK_F32, 3, (int64_t[]){T, Hq, D}, 0), k = tu_alloc(LK_BF16, 3, (int64_t[]){T, Hk, D}, 0);
    tu_buf cache = make_cache(LK_F32, max_pos, rot, 0);
    tu_buf pos = tu_alloc(LK_I32, 1, &T, 0);
    tu_buf big = tu_alloc(LK_F32, 1, (int64_t[]){4096}, 0);
    tu_fill_uniform(&q, -1, 1);
    tu_fill_uniform(&k, -1, 1);
    tu_fill_uniform(&big, -1, 1);
    for (int i = 0; i < T; i++) tu_set(&pos, i, 3 * i);
    tu_buf bad_last = tu_alloc(LK_I64, 1, &T, 0), bad_neg = tu_alloc(LK_I32, 1, &T, 0);
    for (int i = 0; i < T; i++) {
        tu_set(&bad_last, i, i == T - 1 ? max_pos : i); /* only the last token is bad */
        tu_set(&bad_neg, i, i == 1 ? -1 : i);
    }
    struct bad_case {
        const char *what, *needle;
        lk_status want;
        lk_tensor p, q, k, c;
        int has_k;
    } cases[40];
    int n = 0;
#define CASE(W, N, S, P, Q, K, C) cases[n++] = (struct bad_case){W, N, S, P, Q, K, C, 1}
    lk_tensor t;
    t = pos.t; t.ndim = 2; t.shape[1] = 1; t.stride[1] = 1;
    CASE("positions rank 2", ": positions:", LK_ERR_RANK, t, q.t, k.t, cache.t);
    t = pos.t; t.dtype = LK_F32;
    CASE("positions float dtype", ": positions:", LK_ERR_DTYPE, t, q.t, k.t, cache.t);
    t = pos.t; t.shape[0] = 3;
    CASE("q tokens != positions", ": q:", LK_ERR_SHAPE, t, q.t, k.t, cache.t);
    t = q.t; t.ndim = 2;
    CASE("q rank 2", ": q:", LK_ERR_RANK, pos.t, t, k.t, cache.t);
    t = q.t; t.dtype = LK_I32;
    CASE("q int dtype", ": q:", LK_ERR_DTYPE, pos.t, t, k.t, cache.t);
    t = q.t; t.data = NULL;
    CASE("q NULL data", ": q:", LK_ERR_NULL, pos.t, t, k.t, cache.t);
    t = q.t; t.shape[1] = -1;
    CASE("q negative size", ": q:", LK_ERR_SHAPE, pos.t, t, k.t, cache.t);
    t = q.t; t.stride[0] = INT64_MAX / 2;
    CASE("q stride overflow", ": q:", LK_ERR_OVERFLOW, pos.t, t, k.t, cache.t);
    t = q.t; t.stride[0] = 0;
    CASE("q token stride 0 overlaps itself", ": q:", LK_ERR_ALIAS, pos.t, t, k.t, cache.t);
    t = q.t; t.stride[1] = D / 2;
    CASE("q heads overlap", ": q:", LK_ERR_ALIAS, pos.t, t, k.t, cache.t);
    t = k.t; t.ndim = 4; t.shape[3] = 1; t.stride[3] = 1;
    CASE("k rank 4", ": k:", LK_ERR_RANK, pos.t, q.t, t, cache.t);
    t = k.t; t.dtype = (lk_dtype)77;
    CASE("k unknown dtype", ": k:", LK_ERR_DTYPE, pos.t, q.t, t, cache.t);
    t = k.t; t.shape[0] = T + 1;
    CASE("k tokens != positions", ": k:", LK_ERR_SHAPE, pos.t, q.t, t, cache.t);
    t = k.t; t.shape[2] = D - 2;
    CASE("k head dim != q head dim", ": k:", LK_ERR_SHAPE, pos.t, q.t, t, cache.t);
    t = cache.t; t.ndim = 1;
    CASE("cache rank 1", ": cos_sin_cache:", LK_ERR_RANK, pos.t, q.t, k.t, t);
    t = cache.t; t.dtype = LK_I64;
    CASE("cache int dtype", ": cos_sin_cache:", LK_ERR_DTYPE, pos.t, q.t, k.t, t);
    t = cache.t; t.shape[1] = rot - 1;
    CASE("rot odd", ": cos_sin_cache:", LK_ERR_SHAPE, pos.t, q.t, k.t, t);
    t = cache.t; t.shape[0] = 8; t.shape[1] = D + 2; t.stride[0] = D + 2;
    CASE("rot > D", ": cos_sin_cache:", LK_ERR_SHAPE, pos.t, q.t, k.t, t);
    CASE("position == max_pos on the last token", ": positions:", LK_ERR_INDEX, bad_last.t, q.t, k.t, cache.t);
    CASE("position -1", ": positions:", LK_ERR_INDEX, bad_neg.t, q.t, k.t, cache.t);
    t = cache.t; t.shape[0] = 9; /* positions go up to 9 */
    CASE("position beyond a shorter cache", ": positions:", LK_ERR_INDEX, pos.t, q.t, k.t, t);
    { /* overlaps inside one f32 buffer */
        lk_tensor qb = {big.t.data, LK_F32, 3, {T, Hq, D}, {Hq * D, D, 1}};
        lk_tensor kb = qb;
        kb.shape[1] = Hk;
        kb.data = (float *)big.t.data + 5; /* partially overlaps q */
        CASE("k partially overlaps q", ": q and k overlap", LK_ERR_ALIAS, pos.t, qb, kb, cache.t);
        CASE("k is q", ": q and k overlap", LK_ERR_ALIAS, pos.t, qb, qb, cache.t);
        /* fused qkv, but k's heads run into the next token's q */
        lk_tensor q2 = {big.t.data, LK_F32, 3, {T, Hq, D}, {(Hq + Hk) * D, D, 1}};
        lk_tensor k2 = {(float *)big.t.data + Hq * D, LK_F32, 3, {T, Hk + 1, D}, {(Hq + Hk) * D, D, 1}};
        CASE("qkv slices: k runs into q of the next token", ": q and k overlap", LK_ERR_ALIAS,
             pos.t, q2, k2, cache.t);
        lk_tensor cb = {(float *)big.t.data + T * Hq * D - 8, LK_F32, 2, {8, rot}, {rot, 1}};
        CASE("q overlaps the cache", ": q and cos_sin_cache overlap", LK_ERR_ALIAS, pos.t, qb, k.t, cb);
        lk_tensor kc = {(float *)big.t.data + T * Hq * D + 8, LK_F32, 3, {T, Hk, D}, {Hk * D, D, 1}};
        lk_tensor cc = {(float *)big.t.data + T * Hq * D + 16, LK_F32, 2, {8, rot}, {rot, 1}};
        CASE("k overlaps the cache", ": k and cos_sin_cache overlap", LK_ERR_ALIAS, pos.t, qb, kc, cc);
        lk_tensor pk = {(float *)big.t.data + T * Hq * D + 8, LK_I32, 1, {T}, {1}};
        CASE("k overlaps positions", ": k and positions overlap", LK_ERR_ALIAS, pk, qb, kc, cache.t);
        lk_tensor pq = {big.t.data, LK_I32, 1, {T}, {1}};
        CASE("q overlaps positions", ": q and positions overlap", LK_ERR_ALIAS, pq, qb, k.t, cache.t);
    }
    cases[n++] = (struct bad_case){"q only: q overlaps the cache", ": q and cos_sin_cache overlap",
                                   LK_ERR_ALIAS, pos.t, q.t, k.t,
                                   (lk_tensor){q.t.data, LK_F32, 2, {2, rot}, {rot, 1}}, 0};
#undef CASE
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    for (int ii = 0; ii < nisa; ii++) {
        lk_set_isa(isas[ii]);
        for (int i = 0; i < n; i++) {
            tu_buf *all[] = {&q, &k, &cache, &pos, &big, &bad_last, &bad_neg};
            for (int b = 0; b < 7; b++) tu_snapshot(all[b]);
            lk_status st = lk_rotary_embedding(&cases[i].p, &cases[i].q, cases[i].has_k ? &cases[i].k : NULL,
                                               &cases[i].c, i & 1);
            const char *msg = lk_last_error();
            int intact = 1;
            for (int b = 0; b < 7; b++) intact = intact && tu_intact(all[b]);
            tu_check(st == cases[i].want && strstr(msg, "lk_rotary_embedding") &&
                         strstr(msg, cases[i].needle) && intact,
                     "%s bad input '%s' -> %s (%s)", lk_isa_name(isas[ii]), cases[i].what,
                     lk_status_str(st), msg);
        }
    }
    lk_set_isa(lk_isa_best());
    lk_status st = lk_rotary_embedding(NULL, &q.t, &k.t, &cache.t, 1);
    tu_check(st == LK_ERR_NULL && strstr(lk_last_error(), "positions"), "NULL positions pointer");
    st = lk_rotary_embedding(&pos.t, NULL, &k.t, &cache.t, 1);
    tu_check(st == LK_ERR_NULL && strstr(lk_last_error(), ": q:"), "NULL q pointer");
    st = lk_rotary_embedding(&pos.t, &q.t, &k.t, NULL, 1);
    tu_check(st == LK_ERR_NULL && strstr(lk_last_error(), "cos_sin_cache"), "NULL cache pointer");
    /* a valid call clears the error text */
    st = lk_rotary_embedding(&pos.t, &q.t, &k.t, &cache.t, 1);
    tu_check(st == LK_OK && lk_last_error()[0] == 0, "successful call clears lk_last_error");
    tu_free(&q);
    tu_free(&k);
    tu_free(&cache);
    tu_free(&pos);
    tu_free(&big);
    tu_free(&bad_last);
    tu_free(&bad_neg);
}

/* NaN and inf through the bf16 NeoX and GPT-J fast paths: a cos/sin entry that is a NaN with every
 * payload bit set (f32 0x7fffffff, f16 0x7fff: rounding it to bf16 without the NaN rule
 * would carry into the sign), NaN and inf in q and k; every ISA bit-identical to ref. */
static void test_special_values(void) {
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    const int64_t T = 5, Hq = 3, Hk = 2, D = 128, P = 8;
    for (int neox = 0; neox <= 1; neox++)
    for (int ct = 0; ct < 3; ct++) {
        lk_dtype cdt = ct == 0 ? LK_F32 : ct == 1 ? LK_F16 : LK_BF16;
        tu_buf pos = tu_alloc(LK_I64, 1, (int64_t[]){T}, 0), cache = tu_alloc(cdt, 2, (int64_t[]){P, D}, 0);
        for (int64_t t = 0; t < T; t++) ((int64_t *)pos.t.data)[t] = (t * 3) % P;
        tu_fill_uniform(&cache, -1, 1);
        /* position 3 (token 1): cos of pair 5 is a full-payload NaN; position 6 (token 2):
         * sin of pair 40 is +inf */
        if (cdt == LK_F32) ((uint32_t *)cache.t.data)[3 * D + 5] = 0x7fffffffu;
        else ((uint16_t *)cache.t.data)[3 * D + 5] = 0x7fff;
        tu_set(&cache, 6 * D + 64 + 40, INFINITY);
        tu_buf q0 = tu_alloc(LK_BF16, 3, (int64_t[]){T, Hq, D}, 0), k0 = tu_alloc(LK_BF16, 3, (int64_t[]){T, Hk, D}, 0);
        tu_fill_uniform(&q0, -2, 2);
        tu_fill_uniform(&k0, -2, 2);
        tu_set(&q0, 3 * Hq * D + 1 * D + 7, NAN);        /* token 3 */
        tu_set(&k0, 4 * Hk * D + 0 * D + 70, -INFINITY); /* token 4 */
        tu_buf rq = tu_alloc(LK_BF16, 3, (int64_t[]){T, Hq, D}, 0), rk = tu_alloc(LK_BF16, 3, (int64_t[]){T, Hk, D}, 0);
        for (int ii = 0; ii < nisa; ii++) {
            lk_set_isa(isas[ii]);
            tu_buf q = tu_alloc(LK_BF16, 3, (int64_t[]){T, Hq, D}, 0), k = tu_alloc(LK_BF16, 3, (int64_t[]){T, Hk, D}, 0);
            memcpy(q.t.data, q0.t.data, (size_t)(T * Hq * D * 2));
            memcpy(k.t.data, k0.t.data, (size_t)(T * Hk * D * 2));
            lk_status st = lk_rotary_embedding(&pos.t, &q.t, &k.t, &cache.t, neox);
            if (ii == 0) {
                memcpy(rq.t.data, q.t.data, (size_t)(T * Hq * D * 2));
                memcpy(rk.t.data, k.t.data, (size_t)(T * Hk * D * 2));
                /* the rule itself: the NaN cos makes pair 5 of token 1 NaN in every head */
                int64_t ex = neox ? 5 : 10, ey = neox ? 64 + 5 : 11;
                tu_check(st == LK_OK && isnan(tu_get(&q, 1 * Hq * D + ex)) && isnan(tu_get(&k, 1 * Hk * D + ey)),
                         "rotary %s bf16 special values ref: a NaN cos gives NaN outputs (cache %s)",
                         neox ? "neox" : "gptj", lk_dtype_name(cdt));
            } else {
                tu_check(st == LK_OK && memcmp(q.t.data, rq.t.data, (size_t)(T * Hq * D * 2)) == 0 &&
                             memcmp(k.t.data, rk.t.data, (size_t)(T * Hk * D * 2)) == 0,
                         "rotary %s bf16 special values %s == ref bitwise (cache %s)", neox ? "neox" : "gptj",
                         lk_isa_name(isas[ii]), lk_dtype_name(cdt));
            }
            tu_free(&q);
            tu_free(&k);
        }
        tu_free(&pos), tu_free(&cache), tu_free(&q0), tu_free(&k0), tu_free(&rq), tu_free(&rk);
    }
}

int main(void) {
    tu_init();
    test_special_values();
    test_cases();
    test_threads();
    test_large_inputs();
    test_negative_stride();
    test_empty();
    test_bad_inputs();
    return tu_finish("test_rotary");
}
