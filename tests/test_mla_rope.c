/*
 * concat_and_cache_mla_rope (vLLM's concat_and_cache_mla_rope_fused): q_pe [T, Hq, Dr]
 * and k_pe [T, Dr] rotated in place, then [kv_c | rotated k_pe] written to the MLA
 * latent cache(s).
 *
 * Every case runs on every ISA and is checked three ways:
 *  (a) against an expectation built here: the rotation emulated in f32 the way the
 *      contract states it (each product rounded to f32, then the difference / sum, one
 *      rounding to the row's dtype) for EVERY token (padding tokens and tokens t >= N
 *      included), the cache entries of tokens t < N with slot >= 0 from the header's
 *      layout formulas (ND 3-D / 4-D, NZ with the 16-wide tile, 32-wide for fp8; one
 *      cache or two), as a bit copy for the same dtype, one rounding otherwise, and
 *      fp8(x / scale) for fp8 caches. Every byte of every allocation (padding garbage,
 *      guard zones, the parts of a wider buffer outside the views, dims past rot, unused
 *      slots, the positions, cos_sin_cache, slot_mapping and scale) is compared. The
 *      results are also checked against float64: the rotated dims of q_pe / k_pe within
 *      the dtype's tolerance (tu_tol), the cache entries within one rounding of the
 *      values they hold (fp8: half an fp8 step of x / scale, or +-max beyond it,
 *      docs/numerics.md "fp8");
 *  (b) bit for bit against the composition lk_rotary_embedding (q = q_pe, k = k_pe viewed
 *      as [T, 1, Dr], positions narrowed to T) then lk_concat_and_cache_mla_fp8 on the
 *      same starting bytes;
 *  (c) bit for bit against the ref ISA.
 * Grid: T 0, 1, 5, 6, 7, 9, 12, 17, 33, 200; Hq 0, 1, 2, 3, 4, 16, 128; Dr 2, 8, 32, 64;
 * rot == Dr and rot < Dr; Dl 0, 5, 14, 16, 24, 32, 64, 512; page sizes 1, 7, 16, 128; N < T
 * and N = 0; padding slots; positions longer than T whose extra values are out of range
 * (never read); i32 / i64 positions and slot_mapping (strided when padded); NeoX and
 * GPT-J; q_pe / k_pe / kv_c / cos_sin_cache f32 / f16 / bf16 mixed; caches bf16, f16,
 * f32, f8e4m3, f8e5m2 (mixed between the two caches); scale NULL, [] and [1] (a
 * saturating one among them); ND and NZ, one and two caches; inputs as separate
 * padded views, kv_c / k_pe as slices of one [T, Dl + Dr] row and q_pe of a wider q, all
 * three in one row, or transposed (the SIMD kernels' reference fallback) with a
 * transposed cos_sin_cache and permuted caches. Plus: the contract on one small call
 * (padding tokens and tokens past N rotated but not cached, positions past T ignored,
 * the error text cleared by a successful call), rot = 0, thread-count independence
 * (T = 2048, 512 emulated; 1..4 threads bitwise identical and equal to ref), and the bad-input
 * catalogue on every ISA (status, the message names the op and the argument, every
 * buffer bit-identical afterwards: q_pe and k_pe not rotated either), incl. every
 * overlap the op rejects and each NULL argument.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "core/half.h"
#include "testutil.h"

#define MAXPOS 61 /* rows of cos_sin_cache in the grid */
#define NBUF 9

/* ---------------------------------------------------------------- one case */

enum { IN_SEP, IN_KV, IN_ALL, IN_TR, NIN };
static const char *IN_NAME[NIN] = {"separate", "kv-split", "one-row", "transposed"};

typedef struct {
    int64_t T, N, Hq, Dr, rot, Dl, bs;
    int neox;
    lk_dtype qt, pt, kt, cst; /* q_pe, k_pe, kv_c, cos_sin_cache */
    lk_dtype ct, ct2;         /* kv_c_cache (the only one, or the latent one), k_pe_cache */
    lk_dtype post, smt;       /* positions, slot_mapping */
    lk_kv_layout L;
    int two, nd4;   /* two caches; ND caches as [nb, bs, 1, C] */
    int scale_kind; /* 0 NULL, 1 [], 2 [1] */
    float scale;
    int pad; /* padded strides, garbage in the gaps */
    int in;  /* IN_*: where q_pe, kv_c and k_pe live */
} mcase;

/* the buffers of a case and the views passed */
typedef struct {
    tu_buf b[NBUF];  /* 0 q, 1 kv (kv_c; IN_KV: kv_c | k_pe; IN_ALL: q_pe | kv_c | k_pe), 2 pe,
                        3 positions, 4 cos_sin, 5 slot_mapping, 6 cache, 7 k_pe_cache, 8 scale */
    lk_tensor q, kv, pe, pos, posT, cs, sm, c1, c2, sc;
    int64_t nb;
} world;

static const char *BUF_NAME[NBUF] = {"q buf",        "kv buf",     "k_pe buf",   "positions", "cos_sin_cache",
                                     "slot_mapping", "kv_c_cache", "k_pe_cache", "scale"};

/* a 1-D index vector of n values: contiguous, or a column of [n, 2] (stride 2) */
static tu_buf index_vec(lk_dtype dt, int64_t n, int strided, lk_tensor *view) {
    if (!strided) {
        tu_buf b = tu_alloc(dt, 1, &n, 0);
        *view = b.t;
        return b;
    }
    tu_buf b = tu_alloc(dt, 2, (int64_t[]){n, 2}, 0);
    *view = (lk_tensor){b.t.data, dt, 1, {n}, {2}};
    return b;
}

static void set_index(const lk_tensor *v, int64_t i, int64_t x) {
    if (v->dtype == LK_I32) ((int32_t *)v->data)[i * v->stride[0]] = (int32_t)x;
    else ((int64_t *)v->data)[i * v->stride[0]] = x;
}
static int64_t get_index(const lk_tensor *v, int64_t i) { return lk_load_index(v->data, v->dtype, i * v->stride[0]); }

static char *el(const lk_tensor *t, int64_t off) { return (char *)t->data + off * (int64_t)lk_dtype_size(t->dtype); }

/* ND [nb, bs, C] / [nb, bs, 1, C] or NZ [nb, C / tile, bs, tile] (tile 32 for fp8);
 * perm: stored as [nb, C, bs] / NZ [nb, C / tile, tile, bs] */
static tu_buf make_cache(lk_kv_layout L, lk_dtype dt, int64_t nb, int64_t bs, int64_t C, int nd4, int pad,
                         int perm) {
    int64_t tile = lk_is_fp8(dt) ? 32 : 16;
    tu_buf b;
    if (L == LK_KV_NZ)
        b = tu_alloc_perm(dt, 4, (int64_t[]){nb, C / tile, bs, tile}, perm ? (int[]){0, 1, 3, 2} : NULL, pad);
    else if (nd4)
        b = tu_alloc_perm(dt, 4, (int64_t[]){nb, bs, 1, C}, perm ? (int[]){0, 2, 3, 1} : NULL, pad);
    else b = tu_alloc_perm(dt, 3, (int64_t[]){nb, bs, C}, perm ? (int[]){0, 2, 1} : NULL, pad);
    tu_fill_uniform(&b, -4, 4);
    return b;
}

/* element e of the entry (page p, slot s) of a cache view, from the header's formulas */
static char *cache_at(const lk_tensor *c, lk_kv_layout L, int64_t p, int64_t s, int64_t e) {
    const int64_t *st = c->stride;
    int64_t off;
    if (L == LK_KV_NZ) {
        int64_t tile = c->shape[3];
        off = p * st[0] + (e / tile) * st[1] + s * st[2] + (e % tile) * st[3];
    } else if (c->ndim == 4) off = p * st[0] + s * st[1] + e * st[3];
    else off = p * st[0] + s * st[1] + e * st[2];
    return el(c, off);
}

static int nz_fits(const mcase *m) {
    int64_t t1 = lk_is_fp8(m->ct) ? 32 : 16, t2 = lk_is_fp8(m->ct2) ? 32 : 16;
    if (m->two) return m->Dl % t1 == 0 && m->Dr % t2 == 0;
    return (m->Dl + m->Dr) % t1 == 0;
}

static void build(world *w, const mcase *m) {
    memset(w, 0, sizeof *w);
    int64_t T = m->T, Hq = m->Hq, Dr = m->Dr, Dl = m->Dl, pad = m->pad;
    w->nb = 2 * ((T + m->bs - 1) / m->bs) + 2;
    if (m->in == IN_SEP || m->in == IN_TR) {
        int tr = m->in == IN_TR;
        w->b[0] = tu_alloc_perm(m->qt, 3, (int64_t[]){T, Hq, Dr}, tr ? (int[]){2, 0, 1} : NULL, (int)pad);
        w->b[1] = tu_alloc_perm(m->kt, 2, (int64_t[]){T, Dl}, tr ? (int[]){1, 0} : NULL, (int)pad);
        w->b[2] = tu_alloc_perm(m->pt, 2, (int64_t[]){T, Dr}, tr ? (int[]){1, 0} : NULL, (int)pad);
        w->q = w->b[0].t, w->kv = w->b[1].t, w->pe = w->b[2].t;
    } else if (m->in == IN_KV) {
        /* q [T, Hq, 8 + Dr] (q_pe = q[..., 8:]), kv_a [T, Dl + Dr] (kv_c | k_pe) */
        w->b[0] = tu_alloc(m->qt, 3, (int64_t[]){T, Hq, 8 + Dr}, (int)pad);
        w->q = w->b[0].t;
        w->q.shape[2] = Dr;
        w->q.data = el(&w->b[0].t, 8);
        w->b[1] = tu_alloc(m->kt, 2, (int64_t[]){T, Dl + Dr}, (int)pad);
        w->kv = w->pe = w->b[1].t;
        w->kv.shape[1] = Dl;
        w->pe.shape[1] = Dr;
        w->pe.data = el(&w->b[1].t, Dl);
    } else { /* one row [T, Hq Dr + Dl + Dr]: q_pe heads, then kv_c, then k_pe */
        w->b[1] = tu_alloc(m->kt, 2, (int64_t[]){T, Hq * Dr + Dl + Dr}, (int)pad);
        int64_t ld = w->b[1].t.stride[0];
        w->q = (lk_tensor){w->b[1].t.data, m->qt, 3, {T, Hq, Dr}, {ld, Dr, 1}};
        w->kv = (lk_tensor){el(&w->b[1].t, Hq * Dr), m->kt, 2, {T, Dl}, {ld, 1}};
        w->pe = (lk_tensor){el(&w->b[1].t, Hq * Dr + Dl), m->pt, 2, {T, Dr}, {ld, 1}};
    }
    for (int i = 0; i < 3; i++)
        if (w->b[i].base) tu_fill_uniform(&w->b[i], -3, 3);
    if (T > 0 && Dl > 0) /* a NaN in kv_c: copied / quantized as NaN */
        lk_store_f(el(&w->kv, (T > 1) * w->kv.stride[0] + (Dl / 2) * w->kv.stride[1]), m->kt, 0, NAN);
    /* positions [T + 3]: the first T in range, the rest out of range (never read) */
    int64_t P = T + 3;
    w->b[3] = index_vec(m->post, P, (int)pad, &w->pos);
    for (int64_t t = 0; t < P; t++)
        set_index(&w->pos, t, t < T ? tu_randint(0, MAXPOS - 1) : t == T ? MAXPOS : t == T + 1 ? -1 : 1000000);
    w->posT = w->pos;
    w->posT.shape[0] = T;
    w->b[4] = tu_cos_sin(m->cst, MAXPOS, m->rot, (int)pad, m->in == IN_TR);
    w->cs = w->b[4].t;
    /* slot_mapping [N]: distinct slots, every 5th (from a random phase) padding */
    int64_t ns = w->nb * m->bs, *all = malloc(sizeof(int64_t) * (size_t)ns);
    for (int64_t i = 0; i < ns; i++) all[i] = i;
    for (int64_t i = ns - 1; i > 0; i--) {
        int64_t j = tu_randint(0, i), x = all[i];
        all[i] = all[j], all[j] = x;
    }
    w->b[5] = index_vec(m->smt, m->N, (int)pad, &w->sm);
    int64_t phase = tu_randint(0, 4);
    for (int64_t t = 0; t < m->N; t++) set_index(&w->sm, t, t % 5 == phase ? -1 : all[t]);
    free(all);
    int perm = m->in == IN_TR;
    w->b[6] = make_cache(m->L, m->ct, w->nb, m->bs, m->two ? Dl : Dl + Dr, m->nd4, (int)pad, perm);
    w->c1 = w->b[6].t;
    if (m->two) {
        w->b[7] = make_cache(m->L, m->ct2, w->nb, m->bs, Dr, m->nd4, (int)pad, perm);
        w->c2 = w->b[7].t;
    }
    if (m->scale_kind) {
        w->b[8] = tu_alloc(LK_F32, 1, (int64_t[]){1}, 0);
        tu_set(&w->b[8], 0, m->scale);
        w->sc = w->b[8].t;
        if (m->scale_kind == 1) w->sc.ndim = 0; /* [] */
    }
}

static void free_world(world *w) {
    for (int i = 0; i < NBUF; i++)
        if (w->b[i].base) tu_free(&w->b[i]);
}

typedef struct {
    tu_saved s[NBUF];
} state;

static state save_all(const world *w) {
    state s;
    memset(&s, 0, sizeof s);
    for (int i = 0; i < NBUF; i++)
        if (w->b[i].base) s.s[i] = tu_save(&w->b[i]);
    return s;
}
static void restore_all(world *w, const state *s) {
    for (int i = 0; i < NBUF; i++)
        if (w->b[i].base) tu_restore(&w->b[i], &s->s[i]);
}
/* index of the first buffer that differs, -1 if none */
static int diff_all(const world *w, const state *s) {
    for (int i = 0; i < NBUF; i++)
        if (w->b[i].base && !tu_same(&w->b[i], &s->s[i])) return i;
    return -1;
}
static void free_state(state *s) {
    for (int i = 0; i < NBUF; i++) free(s->s[i].bytes);
}
static void snapshot_all(world *w) {
    for (int i = 0; i < NBUF; i++)
        if (w->b[i].base) tu_snapshot(&w->b[i]);
}
static int outside_intact_all(const world *w) {
    for (int i = 0; i < NBUF; i++)
        if (w->b[i].base && !tu_outside_intact(&w->b[i])) return 0;
    return 1;
}

/* k_pe [T, Dr] as the one-head [T, 1, Dr] rotary_embedding takes */
static lk_tensor as_heads(const lk_tensor *pe) {
    return (lk_tensor){pe->data, pe->dtype, 3, {pe->shape[0], 1, pe->shape[1]}, {pe->stride[0], 0, pe->stride[1]}};
}

/* the contract's rotation of x [T, H, D] in place: products rounded to f32, then the
 * difference / sum, one rounding to x's dtype (the test is built without FP
 * contraction: ISO C mode) */
static void rope_emulate(const lk_tensor *x, const lk_tensor *pos, const lk_tensor *cs, int neox) {
    int64_t half = cs->shape[1] / 2;
    for (int64_t t = 0; t < x->shape[0]; t++) {
        int64_t p = get_index(pos, t);
        for (int64_t h = 0; h < x->shape[1]; h++)
            for (int64_t i = 0; i < half; i++) {
                float c = lk_load_f(cs->data, cs->dtype, p * cs->stride[0] + i * cs->stride[1]);
                float s = lk_load_f(cs->data, cs->dtype, p * cs->stride[0] + (half + i) * cs->stride[1]);
                int64_t ix = neox ? i : 2 * i, iy = neox ? i + half : 2 * i + 1;
                int64_t ox = t * x->stride[0] + h * x->stride[1] + ix * x->stride[2];
                int64_t oy = t * x->stride[0] + h * x->stride[1] + iy * x->stride[2];
                float xv = lk_load_f(x->data, x->dtype, ox), yv = lk_load_f(x->data, x->dtype, oy);
                float xc = xv * c, ys = yv * s, yc = yv * c, xs = xv * s;
                lk_store_f(x->data, x->dtype, ox, xc - ys);
                lk_store_f(x->data, x->dtype, oy, yc + xs);
            }
    }
}

/* float64 rotation of the rotated dims of x [T, H, D]: [T, H, rot] values */
static double *rope64(const lk_tensor *x, const lk_tensor *pos, const lk_tensor *cs, int neox) {
    int64_t T = x->shape[0], H = x->shape[1], rot = cs->shape[1], half = rot / 2;
    double *o = malloc(sizeof(double) * (size_t)(T * H * rot > 0 ? T * H * rot : 1));
    for (int64_t t = 0; t < T; t++) {
        int64_t p = get_index(pos, t);
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < half; i++) {
                double c = lk_load_f(cs->data, cs->dtype, p * cs->stride[0] + i * cs->stride[1]);
                double s = lk_load_f(cs->data, cs->dtype, p * cs->stride[0] + (half + i) * cs->stride[1]);
                int64_t ix = neox ? i : 2 * i, iy = neox ? i + half : 2 * i + 1;
                int64_t r = t * x->stride[0] + h * x->stride[1];
                double xv = lk_load_f(x->data, x->dtype, r + ix * x->stride[2]);
                double yv = lk_load_f(x->data, x->dtype, r + iy * x->stride[2]);
                o[(t * H + h) * rot + ix] = xv * c - yv * s;
                o[(t * H + h) * rot + iy] = yv * c + xv * s;
            }
    }
    return o;
}

/* worst |got - want| / (atol + rtol |want|) over the rotated dims (<= 1 passes) */
static double rope_err(const lk_tensor *x, const double *want, int64_t rot) {
    int64_t T = x->shape[0], H = x->shape[1];
    tu_tolerance tol = tu_tol(x->dtype);
    double worst = 0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t d = 0; d < rot; d++) {
                double g = lk_load_f(x->data, x->dtype, t * x->stride[0] + h * x->stride[1] + d * x->stride[2]);
                double wv = want[(t * H + h) * rot + d];
                double e = isnan(g) || isnan(wv) ? INFINITY : fabs(g - wv) / (tol.atol + tol.rtol * fabs(wv));
                if (e > worst) worst = e;
            }
    return worst;
}

/* *dst = the cache's value of the input element *src: same dtype a bit copy, fp8
 * fp8(x / scale), else one rounding */
static void put(char *dst, lk_dtype dt, const char *src, lk_dtype st, float scale) {
    if (dt == st) memcpy(dst, src, lk_dtype_size(dt));
    else if (lk_is_fp8(dt)) lk_store_f(dst, dt, 0, lk_load_f(src, st, 0) / scale);
    else lk_store_f(dst, dt, 0, lk_load_f(src, st, 0));
}

/* write the expected cache entries (from kv_c and the current, rotated, k_pe) */
static void cache_emulate(world *w, const mcase *m, float scale) {
    for (int64_t t = 0; t < m->N; t++) {
        int64_t slot = get_index(&w->sm, t);
        if (slot < 0) continue;
        int64_t p = slot / m->bs, s = slot % m->bs;
        for (int64_t d = 0; d < m->Dl; d++)
            put(cache_at(&w->c1, m->L, p, s, d), m->ct, el(&w->kv, t * w->kv.stride[0] + d * w->kv.stride[1]), m->kt,
                scale);
        for (int64_t d = 0; d < m->Dr; d++)
            put(m->two ? cache_at(&w->c2, m->L, p, s, d) : cache_at(&w->c1, m->L, p, s, m->Dl + d),
                m->two ? m->ct2 : m->ct, el(&w->pe, t * w->pe.stride[0] + d * w->pe.stride[1]), m->pt, scale);
    }
}

/* cache entries vs the values they were made of (kv_c, rotated k_pe as they are now), in
 * float64: fp8 within half a step of x / scale, others within the cache dtype's rounding */
static int cache_close(const world *w, const mcase *m, float scale) {
    for (int64_t t = 0; t < m->N; t++) {
        int64_t slot = get_index(&w->sm, t);
        if (slot < 0) continue;
        int64_t p = slot / m->bs, s = slot % m->bs;
        for (int64_t e = 0; e < m->Dl + m->Dr; e++) {
            int lat = e < m->Dl;
            const lk_tensor *src = lat ? &w->kv : &w->pe;
            int64_t d = lat ? e : e - m->Dl;
            double x = lk_load_f(src->data, src->dtype, t * src->stride[0] + d * src->stride[1]);
            lk_dtype dt = m->two && !lat ? m->ct2 : m->ct;
            const char *at = m->two && !lat ? cache_at(&w->c2, m->L, p, s, d) : cache_at(&w->c1, m->L, p, s, e);
            double q = lk_load_f(at, dt, 0);
            int ok;
            if (lk_is_fp8(dt)) ok = tu_fp8_close(dt, x, scale, q);
            else if (isnan(x)) ok = isnan(q);
            else {
                tu_tolerance tol = tu_tol(dt);
                ok = fabs(q - x) <= 0.5 * (tol.atol + tol.rtol * fabs(x));
            }
            if (!ok) return 0;
        }
    }
    return 1;
}

static lk_status call_fused(world *w, const mcase *m) {
    return lk_concat_and_cache_mla_rope(&w->pos, &w->q, &w->pe, &w->kv, &w->cs, m->neox, &w->c1,
                                        m->two ? &w->c2 : NULL, &w->sm, m->L, m->scale_kind ? &w->sc : NULL);
}

static lk_status call_composed(world *w, const mcase *m) {
    lk_tensor k3 = as_heads(&w->pe);
    lk_status s = lk_rotary_embedding(&w->posT, &w->q, &k3, &w->cs, m->neox);
    if (s) return s;
    return lk_concat_and_cache_mla_fp8(&w->kv, &w->pe, &w->c1, m->two ? &w->c2 : NULL, &w->sm, m->L,
                                       m->scale_kind ? &w->sc : NULL);
}

static int ncases;

static void run_case(const mcase *m) {
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    world w;
    build(&w, m);
    float scale = m->scale_kind ? m->scale : 1.0f;
    char what[320];
    snprintf(what, sizeof what,
             "%s %s %s%s T=%lld N=%lld Hq=%lld Dr=%lld rot=%lld Dl=%lld bs=%lld q=%s k_pe=%s kv_c=%s cs=%s "
             "cache=%s/%s pos=%s sm=%s scale=%s%g pad=%d in=%s",
             m->neox ? "neox" : "gptj", m->L == LK_KV_NZ ? "NZ" : "ND", m->two ? "two" : "one",
             m->nd4 ? " 4-D" : "", (long long)m->T, (long long)m->N, (long long)m->Hq, (long long)m->Dr,
             (long long)m->rot, (long long)m->Dl, (long long)m->bs, lk_dtype_name(m->qt), lk_dtype_name(m->pt),
             lk_dtype_name(m->kt), lk_dtype_name(m->cst), lk_dtype_name(m->ct),
             m->two ? lk_dtype_name(m->ct2) : "-", lk_dtype_name(m->post), lk_dtype_name(m->smt),
             m->scale_kind == 0 ? "NULL " : m->scale_kind == 1 ? "[] " : "[1] ", (double)scale, m->pad,
             IN_NAME[m->in]);
    /* float64 rotations of the starting values, then the expected state */
    lk_tensor k3 = as_heads(&w.pe);
    double *wq = rope64(&w.q, &w.posT, &w.cs, m->neox), *wk = rope64(&k3, &w.posT, &w.cs, m->neox);
    state s0 = save_all(&w);
    rope_emulate(&w.q, &w.posT, &w.cs, m->neox);
    rope_emulate(&k3, &w.posT, &w.cs, m->neox);
    cache_emulate(&w, m, scale);
    state ex = save_all(&w), ref;
    memset(&ref, 0, sizeof ref);
    for (int ii = 0; ii < nisa; ii++) {
        lk_set_isa(isas[ii]);
        restore_all(&w, &s0);
        snapshot_all(&w);
        lk_status st = call_fused(&w, m);
        int bad = diff_all(&w, &ex);
        double eq = rope_err(&w.q, wq, m->rot), ek = rope_err(&k3, wk, m->rot);
        int close = cache_close(&w, m, scale), outside = outside_intact_all(&w);
        tu_check(st == LK_OK && bad < 0 && outside && eq <= 1 && ek <= 1 && close,
                 "mla_rope %s %s: status %s, first buffer off the expectation: %s, outside views intact %d, "
                 "float64 err q_pe %.3g k_pe %.3g, cache entries close %d (%s)",
                 lk_isa_name(isas[ii]), what, lk_status_str(st), bad < 0 ? "none" : BUF_NAME[bad], outside, eq, ek,
                 close, lk_last_error());
        state fused = save_all(&w);
        if (ii == 0) ref = fused;
        else {
            int d = diff_all(&w, &ref);
            tu_check(d < 0, "mla_rope %s == ref bit for bit (%s differs): %s", lk_isa_name(isas[ii]),
                     d < 0 ? "none" : BUF_NAME[d], what);
        }
        /* (b) rotary_embedding then concat_and_cache_mla_fp8 on the same bytes */
        restore_all(&w, &s0);
        lk_status sc = call_composed(&w, m);
        int d = diff_all(&w, &fused);
        tu_check(sc == LK_OK && d < 0,
                 "mla_rope %s == rotary_embedding + concat_and_cache_mla_fp8 bit for bit (%s differs; %s): %s",
                 lk_isa_name(isas[ii]), d < 0 ? "none" : BUF_NAME[d], lk_status_str(sc), what);
        if (ii > 0) free_state(&fused);
    }
    lk_set_isa(lk_isa_best());
    ncases++;
    free_state(&s0), free_state(&ex), free_state(&ref);
    free(wq), free(wk);
    free_world(&w);
}

static void test_grid(void) {
    /* T, N, Hq, Dr, rot, Dl, bs */
    static const int64_t shapes[][7] = {
        {1, 1, 128, 64, 64, 512, 16},    /* DeepSeek-V3 decode: 128 heads, 512 + 64 */
        {5, 5, 16, 64, 64, 512, 1},      /* DeepSeek-V2-Lite, page size 1 */
        {33, 30, 3, 64, 32, 512, 7},     /* partial rotary, N < T, page 7 */
        {33, 33, 1, 8, 8, 24, 16},       /* Dl + Dr = 32 (NZ one buffer for fp8 too) */
        {17, 11, 16, 2, 2, 14, 7},       /* one pair; Dl + Dr = 16 */
        {200, 150, 16, 64, 64, 512, 128},/* spans pages of 128 */
        {9, 9, 3, 8, 6, 5, 7},           /* odd Dl, rot < Dr (ND only) */
        {0, 0, 3, 8, 8, 16, 16},         /* T = 0 */
        {6, 4, 0, 64, 64, 64, 16},       /* Hq = 0: k_pe alone rotated */
        {7, 7, 2, 32, 32, 0, 16},        /* Dl = 0 */
        {12, 0, 4, 32, 32, 32, 16},      /* N = 0: rotation only, no cache write */
    };
    /* q_pe, k_pe, kv_c, cos_sin_cache, cache, k_pe_cache */
    static const lk_dtype dts[][6] = {
        {LK_BF16, LK_BF16, LK_BF16, LK_F32, LK_BF16, LK_BF16},
        {LK_F32, LK_F32, LK_F32, LK_F32, LK_F32, LK_F32},
        {LK_F16, LK_F16, LK_F16, LK_F16, LK_F16, LK_F16},
        {LK_BF16, LK_BF16, LK_BF16, LK_BF16, LK_F8E4M3, LK_F8E4M3},
        {LK_F32, LK_BF16, LK_F16, LK_F16, LK_F8E5M2, LK_F32},
        {LK_F16, LK_F32, LK_BF16, LK_BF16, LK_F32, LK_F8E4M3},
        {LK_BF16, LK_F16, LK_F32, LK_F32, LK_F16, LK_BF16},
        {LK_F32, LK_F16, LK_F16, LK_BF16, LK_F8E4M3, LK_F8E5M2},
    };
    static const float scales[3] = {0.5f, 3.7f, 0.00390625f}; /* 1/256: e4m3 saturates beyond |x| = 1.75 */
    int k = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int neox = 0; neox <= 1; neox++)
            for (int d = 0; d < 8; d++)
                for (int L = 0; L <= 1; L++)
                    for (int two = 0; two <= 1; two++) {
                        const int64_t *sh = shapes[s];
                        mcase m = {sh[0], sh[1], sh[2], sh[3], sh[4], sh[5], sh[6], neox,
                                   dts[d][0], dts[d][1], dts[d][2], dts[d][3], dts[d][4], dts[d][5],
                                   LK_I64, LK_I64, L ? LK_KV_NZ : LK_KV_ND, two, 0, 0, 1.0f, 0, IN_SEP};
                        if (L && !nz_fits(&m)) continue;
                        /* the shapes whose calls go parallel (each region costs ms on a busy
                         * machine): a third of the grid; the big one: a sixth (time) */
                        if ((s == 0 || s == 2) && (d + neox + 2 * two + L) % 3 != 0) continue;
                        if (s == 5 && (d + neox + 2 * two + 3 * L) % 6 != 0) continue;
                        if (tu_emulated() && s == 5 && d != 0) continue; /* emulated: one of those */
                        k++;
                        m.post = k & 1 ? LK_I32 : LK_I64;
                        m.smt = k & 2 ? LK_I32 : LK_I64;
                        m.nd4 = !L && (k % 5 == 1);
                        m.scale_kind = k % 3;
                        m.scale = scales[(k / 3) % 3];
                        m.pad = (k >> 2) & 1;
                        m.in = (k / 3) % NIN;
                        if (m.in == IN_KV && m.kt != m.pt) m.in = IN_SEP;
                        if (m.in == IN_ALL && (m.kt != m.pt || m.qt != m.kt)) m.in = IN_SEP;
                        if (m.in == IN_TR && k % 4 != 3) m.in = IN_SEP; /* the fallback path: a few */
                        tu_seed(1000 + (uint64_t)k);
                        run_case(&m);
                    }
}

/* ---------------------------------------------------------------- rot = 0, explicit contract checks */

/* rot = 0 (cos_sin_cache [max_pos, 0]): q_pe and k_pe untouched, the cache written as
 * lk_concat_and_cache_mla_fp8 writes it; positions still validated */
static void test_rot0(void) {
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    mcase m = {6, 5, 2, 16, 0, 16, 4, 1, LK_BF16, LK_F32, LK_F16, LK_F32, LK_F8E4M3, LK_BF16,
               LK_I64, LK_I32, LK_KV_ND, 0, 0, 2, 0.5f, 1, IN_SEP};
    world w;
    build(&w, &m);
    state s0 = save_all(&w);
    cache_emulate(&w, &m, 0.5f);
    state ex = save_all(&w);
    for (int ii = 0; ii < nisa; ii++) {
        lk_set_isa(isas[ii]);
        restore_all(&w, &s0);
        lk_status st = call_fused(&w, &m);
        int d = diff_all(&w, &ex);
        tu_check(st == LK_OK && d < 0, "mla_rope %s rot = 0: q_pe, k_pe untouched, cache written (%s; %s)",
                 lk_isa_name(isas[ii]), d < 0 ? "as expected" : BUF_NAME[d], lk_last_error());
        restore_all(&w, &s0);
        set_index(&w.pos, 2, MAXPOS);
        state sb = save_all(&w);
        st = call_fused(&w, &m);
        d = diff_all(&w, &sb);
        free_state(&sb);
        tu_check(st == LK_ERR_INDEX && strstr(lk_last_error(), ": positions:") && d < 0,
                 "mla_rope %s rot = 0 still checks positions, writes nothing -> %s (%s)", lk_isa_name(isas[ii]),
                 lk_status_str(st), lk_last_error());
    }
    lk_set_isa(lk_isa_best());
    free_state(&s0), free_state(&ex);
    free_world(&w);
}

/* the contract spelled out on one small call: a padding token (slot -1) and the tokens
 * past N are rotated exactly as rotary_embedding rotates them, their cache entries are not
 * written; only the first T positions are read (the rest out of range); a successful call
 * after a failing one clears the error text */
static void test_contract(void) {
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    int64_t T = 4, Hq = 2, Dr = 8, Dl = 8, bs = 4;
    float q0[4][2][8], k0[4][8], kv[4][8], cs[8][8];
    for (int t = 0; t < 4; t++)
        for (int d = 0; d < 8; d++) {
            q0[t][0][d] = (float)(t + 1) + 0.125f * (float)d, q0[t][1][d] = -(float)(t + 1) + 0.25f * (float)d;
            k0[t][d] = 0.5f * (float)(t + 1) - 0.0625f * (float)d, kv[t][d] = (float)(10 * t + d);
        }
    for (int p = 0; p < 8; p++)
        for (int i = 0; i < 4; i++) cs[p][i] = cosf(0.3f * (float)(p * (i + 1))), cs[p][4 + i] = sinf(0.3f * (float)(p * (i + 1)));
    int64_t pos[6] = {3, 1, 7, 2, 8, -1}; /* [T + 2]: the last two out of range */
    int64_t slots[2] = {-1, 5};           /* N = 2 < T; token 0 padding */
    for (int ii = 0; ii < nisa; ii++) {
        lk_set_isa(isas[ii]);
        for (int neox = 0; neox <= 1; neox++) {
            float q[4][2][8], k[4][8], qr[4][2][8], kr[4][8], cache[2][4][16];
            memcpy(q, q0, sizeof q), memcpy(k, k0, sizeof k), memcpy(qr, q0, sizeof q), memcpy(kr, k0, sizeof k);
            for (int i = 0; i < 2 * 4 * 16; i++) (&cache[0][0][0])[i] = -7.0f;
            lk_tensor tp = lk_tensor_make(pos, LK_I64, 1, (int64_t[]){6}), tq = lk_tensor_make(q, LK_F32, 3, (int64_t[]){T, Hq, Dr});
            lk_tensor tk = lk_tensor_make(k, LK_F32, 2, (int64_t[]){T, Dr}), tkv = lk_tensor_make(kv, LK_F32, 2, (int64_t[]){T, Dl});
            lk_tensor tcs = lk_tensor_make(cs, LK_F32, 2, (int64_t[]){8, 8}), tsm = lk_tensor_make(slots, LK_I64, 1, (int64_t[]){2});
            lk_tensor tc = lk_tensor_make(cache, LK_F32, 3, (int64_t[]){2, bs, 16});
            lk_tensor tpT = lk_tensor_make(pos, LK_I64, 1, &T), tqr = lk_tensor_make(qr, LK_F32, 3, (int64_t[]){T, Hq, Dr});
            lk_tensor tkr = lk_tensor_make(kr, LK_F32, 3, (int64_t[]){T, 1, Dr});
            lk_tensor bad = tsm; /* first a failing call: slot 8 beyond the 2 x 4 slots */
            int64_t badslots[2] = {8, 1};
            bad.data = badslots;
            lk_status s1 = lk_concat_and_cache_mla_rope(&tp, &tq, &tk, &tkv, &tcs, neox, &tc, NULL, &bad, LK_KV_ND, NULL);
            int untouched = !memcmp(q, q0, sizeof q) && !memcmp(k, k0, sizeof k);
            lk_status s2 = lk_concat_and_cache_mla_rope(&tp, &tq, &tk, &tkv, &tcs, neox, &tc, NULL, &tsm, LK_KV_ND, NULL);
            const char *msg = lk_last_error();
            lk_status s3 = lk_rotary_embedding(&tpT, &tqr, &tkr, &tcs, neox);
            int ok = s1 == LK_ERR_INDEX && untouched && s2 == LK_OK && msg[0] == 0 && s3 == LK_OK &&
                     !memcmp(q, qr, sizeof q) && !memcmp(k, kr, sizeof k);
            /* every token rotated (the padding token 0 and tokens 2, 3 past N too) */
            for (int t = 0; t < 4; t++) ok &= memcmp(k[t], k0[t], sizeof k[t]) != 0 && memcmp(q[t], q0[t], sizeof q[t]) != 0;
            /* slot 5 = page 1, slot 1: [kv_c[1] | k_pe[1] rotated]; every other entry untouched */
            for (int p = 0; p < 2; p++)
                for (int s = 0; s < 4; s++)
                    for (int e = 0; e < 16; e++) {
                        float want = p == 1 && s == 1 ? (e < 8 ? kv[1][e] : k[1][e - 8]) : -7.0f;
                        ok &= cache[p][s][e] == want;
                    }
            tu_check(ok, "mla_rope %s %s: padding token and tokens past N rotated as rotary_embedding, not cached; "
                         "positions past T ignored; a failing call wrote nothing, the next one cleared the error "
                         "(%s, %s)", lk_isa_name(isas[ii]), neox ? "neox" : "gptj", lk_status_str(s1), lk_status_str(s2));
        }
    }
    lk_set_isa(lk_isa_best());
}

/* ---------------------------------------------------------------- threads */

static void test_threads(void) {
    for (int v = 0; v < 2; v++) {
        /* bf16 everywhere, ND one cache; and f16 q / bf16 k_pe into an fp8 NZ cache with scale */
        int64_t T = tu_emulated() ? 512 : 2048;
        mcase m = {T, T - 48, 16, 64, 64, 512, 16, v == 0, LK_BF16, LK_BF16, LK_BF16, LK_F32, LK_BF16, LK_BF16,
                   LK_I64, LK_I32, LK_KV_ND, 0, 0, 0, 1.0f, 0, IN_KV};
        if (v == 1) {
            m.qt = LK_F16, m.ct = LK_F8E4M3, m.ct2 = LK_F8E5M2, m.L = LK_KV_NZ, m.two = 1, m.scale_kind = 2;
            m.scale = 0.25f, m.in = IN_SEP, m.pad = 1;
        }
        tu_seed(77 + (uint64_t)v);
        world w;
        build(&w, &m);
        state s0 = save_all(&w), first;
        memset(&first, 0, sizeof first);
        for (int nt = 1; nt <= 4; nt++) {
            lk_set_num_threads(nt);
            restore_all(&w, &s0);
            lk_status st = call_fused(&w, &m);
            if (nt == 1) {
                first = save_all(&w);
                tu_check(st == LK_OK && diff_all(&w, &s0) >= 0, "mla_rope threads case %d runs (%s)", v, lk_last_error());
                continue;
            }
            int d = diff_all(&w, &first);
            tu_check(st == LK_OK && d < 0, "mla_rope case %d (%s %s) bitwise identical with %d threads (%s differs)", v,
                     m.L == LK_KV_NZ ? "NZ" : "ND", lk_dtype_name(m.ct), nt, d < 0 ? "none" : BUF_NAME[d]);
        }
        lk_set_num_threads(0);
        /* and the parallel call equals ref */
        lk_set_isa(LK_ISA_REF);
        restore_all(&w, &s0);
        call_fused(&w, &m);
        lk_set_isa(lk_isa_best());
        int d = diff_all(&w, &first);
        tu_check(d < 0, "mla_rope threads case %d: ref equals the threaded calls (%s differs)", v,
                 d < 0 ? "none" : BUF_NAME[d]);
        free_state(&s0), free_state(&first);
        free_world(&w);
    }
}

/* ---------------------------------------------------------------- bad inputs */

typedef struct {
    const char *what, *needle;
    lk_status want;
    lk_tensor pos, q, pe, kv, cs, c1, c2, sm, sc;
    int has_c2, has_sc;
    lk_kv_layout L;
} bad_case;

/* a view of n values of dtype dt at float offset off of big */
static lk_tensor in_big(const tu_buf *big, int64_t off, lk_dtype dt, int ndim, const int64_t *shape) {
    lk_tensor t = lk_tensor_make((float *)big->t.data + off, dt, ndim, shape);
    return t;
}

static int within(const tu_buf *b, const lk_tensor *t) {
    return (const unsigned char *)t->data >= b->base && (const unsigned char *)t->data < b->base + b->bytes;
}

static void test_bad(void) {
    const int64_t T = 6, Hq = 2, Dr = 16, rot = 16, Dl = 16, bs = 4, nb = 3, MP = 32;
    tu_buf pos = tu_alloc(LK_I64, 1, (int64_t[]){T + 2}, 0);
    tu_buf q = tu_alloc(LK_F32, 3, (int64_t[]){T, Hq, Dr}, 0), pe = tu_alloc(LK_BF16, 2, (int64_t[]){T, Dr}, 0);
    tu_buf kv = tu_alloc(LK_F32, 2, (int64_t[]){T, Dl}, 0);
    tu_buf cs = tu_cos_sin(LK_F32, MP, rot, 0, 0);
    tu_buf c = tu_alloc(LK_BF16, 3, (int64_t[]){nb, bs, Dl + Dr}, 0), nz = tu_alloc(LK_BF16, 4, (int64_t[]){nb, 2, bs, 16}, 0);
    tu_buf c8 = tu_alloc(LK_F8E4M3, 3, (int64_t[]){nb, bs, Dl + Dr}, 0);
    tu_buf ckv = tu_alloc(LK_F16, 3, (int64_t[]){nb, bs, Dl}, 0), cpe = tu_alloc(LK_F32, 3, (int64_t[]){nb, bs, Dr}, 0);
    tu_buf sm = tu_alloc(LK_I64, 1, (int64_t[]){T}, 0), sc = tu_alloc(LK_F32, 1, (int64_t[]){1}, 0);
    tu_buf scv = tu_alloc(LK_F32, 1, (int64_t[]){8}, 0); /* bad scale values */
    tu_buf posb = tu_alloc(LK_I32, 1, (int64_t[]){T}, 0), smb = tu_alloc(LK_I64, 1, (int64_t[]){T}, 0);
    tu_buf big = tu_alloc(LK_F32, 1, (int64_t[]){4096}, 0);
    tu_fill_uniform(&q, -1, 1), tu_fill_uniform(&pe, -1, 1), tu_fill_uniform(&kv, -1, 1);
    tu_fill_uniform(&c, -1, 1), tu_fill_uniform(&nz, -1, 1), tu_fill_uniform(&c8, -1, 1);
    tu_fill_uniform(&ckv, -1, 1), tu_fill_uniform(&cpe, -1, 1), tu_fill_uniform(&big, -1, 1);
    static const int64_t PV[8] = {0, 3, 6, 9, 12, 15, 99, -5}; /* values past T out of range: never read */
    for (int i = 0; i < 8; i++) tu_set(&pos, i, (double)PV[i]);
    static const int64_t SV[6] = {0, 5, -1, 7, 2, 9};
    for (int i = 0; i < 6; i++) tu_set(&sm, i, (double)SV[i]);
    tu_set(&sc, 0, 0.5);
    static const float BADS[5] = {0.0f, -1.0f, NAN, INFINITY, -INFINITY};
    for (int i = 0; i < 5; i++) tu_set(&scv, i, BADS[i]);
    tu_set(&scv, 5, 1.0), tu_set(&scv, 6, 1.0);
    bad_case base = {"", "", LK_OK, pos.t, q.t, pe.t, kv.t, cs.t, c.t, c.t, sm.t, sc.t, 0, 1, LK_KV_ND};
    bad_case cases[120];
    int n = 0;
#define ADD(W, N, S, EDIT)                                                                                            \
    do {                                                                                                              \
        bad_case b_ = base;                                                                                           \
        b_.what = W, b_.needle = N, b_.want = S;                                                                      \
        EDIT;                                                                                                         \
        cases[n++] = b_;                                                                                              \
    } while (0)
    /* positions */
    ADD("positions rank 2", ": positions:", LK_ERR_RANK, b_.pos.ndim = 2; b_.pos.shape[1] = 1; b_.pos.stride[1] = 1);
    ADD("positions f32", ": positions:", LK_ERR_DTYPE, b_.pos.dtype = LK_F32);
    ADD("positions bf16", ": positions:", LK_ERR_DTYPE, b_.pos.dtype = LK_BF16);
    ADD("positions shorter than T", ": positions:", LK_ERR_SHAPE, b_.pos.shape[0] = T - 1);
    ADD("positions NULL data", ": positions:", LK_ERR_NULL, b_.pos.data = NULL);
    ADD("position == max_pos on the last token", ": positions:", LK_ERR_INDEX, b_.pos = posb.t);
    ADD("position -1 on token 0", ": positions:", LK_ERR_INDEX, b_.pos = posb.t);
    ADD("position beyond a shorter cos_sin_cache", ": positions:", LK_ERR_INDEX, b_.cs.shape[0] = 15);
    /* q_pe */
    ADD("q_pe rank 2", ": q_pe:", LK_ERR_RANK, b_.q.ndim = 2);
    ADD("q_pe rank 4", ": q_pe:", LK_ERR_RANK, b_.q.ndim = 4; b_.q.shape[3] = 1; b_.q.stride[3] = 1);
    ADD("q_pe i32", ": q_pe:", LK_ERR_DTYPE, b_.q.dtype = LK_I32);
    ADD("q_pe f8e4m3", ": q_pe:", LK_ERR_DTYPE, b_.q.dtype = LK_F8E4M3);
    ADD("q_pe NULL data", ": q_pe:", LK_ERR_NULL, b_.q.data = NULL);
    ADD("q_pe negative size", ": q_pe:", LK_ERR_SHAPE, b_.q.shape[1] = -1);
    ADD("q_pe stride overflow", ": q_pe:", LK_ERR_OVERFLOW, b_.q.stride[0] = INT64_MAX / 2);
    ADD("q_pe heads overlap", ": q_pe:", LK_ERR_ALIAS, b_.q.stride[1] = Dr / 2);
    ADD("q_pe token stride 0", ": q_pe:", LK_ERR_ALIAS, b_.q.stride[0] = 0);
    ADD("q_pe T < kv_c's T", ": kv_c:", LK_ERR_SHAPE, b_.q.shape[0] = T - 1);
    ADD("q_pe T > kv_c's T", ": kv_c:", LK_ERR_SHAPE, b_.q.shape[0] = T + 1; b_.pos.shape[0] = T + 2);
    ADD("q_pe head dim != k_pe's dim", ": k_pe:", LK_ERR_SHAPE, b_.q.shape[2] = Dr - 2);
    /* k_pe */
    ADD("k_pe dim != q_pe head dim (cache sized for it)", ": k_pe:", LK_ERR_SHAPE,
        b_.pe.shape[1] = Dr - 2; b_.c1.shape[2] = Dl + Dr - 2; b_.c1.stride[1] = Dl + Dr - 2;
        b_.c1.stride[0] = bs * (Dl + Dr - 2));
    ADD("k_pe rank 3", ": k_pe:", LK_ERR_RANK, b_.pe.ndim = 3; b_.pe.shape[2] = 1; b_.pe.stride[2] = 1);
    ADD("k_pe i64", ": k_pe:", LK_ERR_DTYPE, b_.pe.dtype = LK_I64);
    ADD("k_pe f8e5m2", ": k_pe:", LK_ERR_DTYPE, b_.pe.dtype = LK_F8E5M2);
    ADD("k_pe NULL data", ": k_pe:", LK_ERR_NULL, b_.pe.data = NULL);
    ADD("k_pe T != kv_c's T", ": k_pe:", LK_ERR_SHAPE, b_.pe.shape[0] = T - 1);
    ADD("k_pe token stride 0", ": k_pe:", LK_ERR_ALIAS, b_.pe.stride[0] = 0);
    /* kv_c */
    ADD("kv_c rank 1", ": kv_c:", LK_ERR_RANK, b_.kv.ndim = 1);
    ADD("kv_c i32", ": kv_c:", LK_ERR_DTYPE, b_.kv.dtype = LK_I32);
    ADD("kv_c f8e4m3", ": kv_c:", LK_ERR_DTYPE, b_.kv.dtype = LK_F8E4M3);
    ADD("kv_c NULL data", ": kv_c:", LK_ERR_NULL, b_.kv.data = NULL);
    ADD("kv_c stride overflow", ": kv_c:", LK_ERR_OVERFLOW, b_.kv.stride[0] = INT64_MAX / 2);
    /* cos_sin_cache */
    ADD("cos_sin_cache rank 1", ": cos_sin_cache:", LK_ERR_RANK, b_.cs.ndim = 1);
    ADD("cos_sin_cache rank 3", ": cos_sin_cache:", LK_ERR_RANK, b_.cs.ndim = 3; b_.cs.shape[2] = 1; b_.cs.stride[2] = 1);
    ADD("cos_sin_cache i64", ": cos_sin_cache:", LK_ERR_DTYPE, b_.cs.dtype = LK_I64);
    ADD("cos_sin_cache f8e4m3", ": cos_sin_cache:", LK_ERR_DTYPE, b_.cs.dtype = LK_F8E4M3);
    ADD("cos_sin_cache NULL data", ": cos_sin_cache:", LK_ERR_NULL, b_.cs.data = NULL);
    ADD("odd rot", ": cos_sin_cache:", LK_ERR_SHAPE, b_.cs.shape[1] = rot - 1);
    ADD("rot > Dr", ": cos_sin_cache:", LK_ERR_SHAPE, b_.cs.shape[0] = 16; b_.cs.shape[1] = Dr + 2; b_.cs.stride[0] = Dr + 2);
    /* slot_mapping */
    ADD("slot_mapping f32", ": slot_mapping:", LK_ERR_DTYPE, b_.sm.dtype = LK_F32);
    ADD("slot_mapping rank 2", ": slot_mapping:", LK_ERR_RANK, b_.sm.ndim = 2; b_.sm.shape[1] = 1; b_.sm.stride[1] = 1);
    ADD("slot_mapping NULL data", ": slot_mapping:", LK_ERR_NULL, b_.sm.data = NULL);
    ADD("slot_mapping N > T", ": slot_mapping:", LK_ERR_SHAPE,
        b_.q.shape[0] = T - 1; b_.pe.shape[0] = T - 1; b_.kv.shape[0] = T - 1);
    ADD("slot beyond the cache", ": slot_mapping:", LK_ERR_INDEX, b_.sm = smb.t);
    ADD("duplicate slot", ": slot_mapping:", LK_ERR_INDEX, b_.sm = smb.t);
    /* caches, layout */
    ADD("cache last dim != Dl + Dr", ": kv_c_cache:", LK_ERR_SHAPE, b_.c1.shape[2] = Dl + Dr - 1);
    ADD("cache i32", ": kv_c_cache:", LK_ERR_DTYPE, b_.c1.dtype = LK_I32);
    ADD("cache rank 2", ": kv_c_cache:", LK_ERR_RANK, b_.c1.ndim = 2);
    ADD("cache NULL data", ": kv_c_cache:", LK_ERR_NULL, b_.c1.data = NULL);
    ADD("cache pages overlap themselves", ": kv_c_cache:", LK_ERR_ALIAS, b_.c1.stride[0] = 0);
    ADD("bad layout", ": layout:", LK_ERR_VALUE, b_.L = (lk_kv_layout)7);
    ADD("ND cache passed as NZ", ": kv_c_cache:", LK_ERR_RANK, b_.L = LK_KV_NZ);
    ADD("NZ cache C/16 mismatch", ": kv_c_cache:", LK_ERR_SHAPE, b_.L = LK_KV_NZ; b_.c1 = nz.t; b_.c1.shape[1] = 1);
    ADD("NZ fp8 cache with the 16-wide tile", ": kv_c_cache:", LK_ERR_SHAPE,
        b_.L = LK_KV_NZ; b_.c1 = nz.t; b_.c1.dtype = LK_F8E4M3);
    ADD("two caches: num_blocks differ", ": k_pe_cache:", LK_ERR_SHAPE,
        b_.c1 = ckv.t; b_.c2 = cpe.t; b_.has_c2 = 1; b_.c2.shape[0] = nb - 1);
    ADD("two caches: block_size differs", ": k_pe_cache:", LK_ERR_SHAPE,
        b_.c1 = ckv.t; b_.c2 = cpe.t; b_.has_c2 = 1; b_.c2.shape[1] = bs - 1);
    ADD("k_pe_cache dim != Dr", ": k_pe_cache:", LK_ERR_SHAPE,
        b_.c1 = ckv.t; b_.c2 = cpe.t; b_.has_c2 = 1; b_.c2.shape[2] = Dr - 1);
    ADD("k_pe_cache i32", ": k_pe_cache:", LK_ERR_DTYPE, b_.c1 = ckv.t; b_.c2 = cpe.t; b_.has_c2 = 1; b_.c2.dtype = LK_I32);
    ADD("kv_c_cache dim != Dl (two caches)", ": kv_c_cache:", LK_ERR_SHAPE, b_.c2 = cpe.t; b_.has_c2 = 1);
    ADD("two caches overlap", "kv_c_cache and k_pe_cache overlap", LK_ERR_ALIAS,
        b_.c1 = cpe.t; b_.c1.dtype = LK_F32; b_.c2 = cpe.t; b_.has_c2 = 1);
    /* scale */
    for (int i = 0; i < 5; i++) {
        static const char *W[5] = {"scale 0", "scale -1", "scale NaN", "scale inf", "scale -inf"};
        ADD(W[i], ": scale[0]:", LK_ERR_VALUE, b_.c1 = c8.t; b_.sc = scv.t; b_.sc.shape[0] = 1;
            b_.sc.data = (float *)scv.t.data + i);
    }
    ADD("scale NaN with a bf16 cache (still validated)", ": scale[0]:", LK_ERR_VALUE,
        b_.sc = scv.t; b_.sc.shape[0] = 1; b_.sc.data = (float *)scv.t.data + 2);
    ADD("scale [2]", ": scale:", LK_ERR_SHAPE, b_.c1 = c8.t; b_.sc = scv.t; b_.sc.shape[0] = 2; b_.sc.data = (float *)scv.t.data + 5);
    ADD("scale bf16", ": scale:", LK_ERR_DTYPE, b_.c1 = c8.t; b_.sc.dtype = LK_BF16);
    ADD("scale rank 3", ": scale:", LK_ERR_RANK, b_.c1 = c8.t; b_.sc.ndim = 3; b_.sc.shape[1] = b_.sc.shape[2] = 1;
        b_.sc.stride[1] = b_.sc.stride[2] = 1);
    /* overlaps: tensors placed in one f32 buffer (big); positions / slot_mapping / scale
     * placed there get valid values before the call */
    {
        const int64_t qsh[3] = {T, Hq, Dr}, k2[2] = {T, Dr}, kv2[2] = {T, Dl}, csh[2] = {MP, rot}, one = 1;
        const int64_t csh8[2] = {8, rot}, p8[1] = {T + 2}, s6[1] = {T}, c3[3] = {nb, bs, Dl + Dr}, cs3[3] = {nb, bs, Dr};
        lk_tensor qb = in_big(&big, 0, LK_F32, 3, qsh); /* floats [0, 192) */
        lk_tensor cb = in_big(&big, 2000, LK_BF16, 3, c3); /* floats [2000, 2192) */
        lk_tensor cb2 = in_big(&big, 2000, LK_F32, 3, cs3);  /* k_pe_cache f32: floats [2000, 2192) */
        ADD("q_pe overlaps kv_c", "q_pe and kv_c overlap", LK_ERR_ALIAS, b_.q = qb; b_.kv = in_big(&big, 100, LK_F32, 2, kv2));
        ADD("q_pe overlaps k_pe", "q_pe and k_pe overlap", LK_ERR_ALIAS, b_.q = qb; b_.pe = in_big(&big, 150, LK_BF16, 2, k2));
        ADD("k_pe is q_pe's memory", "q_pe and k_pe overlap", LK_ERR_ALIAS,
            b_.q = qb; b_.pe = in_big(&big, 0, LK_F32, 2, k2); b_.pe.stride[0] = Hq * Dr);
        ADD("q_pe overlaps cos_sin_cache", "q_pe and cos_sin_cache overlap", LK_ERR_ALIAS,
            b_.q = qb; b_.cs = in_big(&big, 180, LK_F32, 2, csh8));
        ADD("q_pe overlaps positions", "q_pe and positions overlap", LK_ERR_ALIAS,
            b_.q = qb; b_.pos = in_big(&big, 190, LK_I64, 1, p8));
        ADD("q_pe overlaps positions past T", "q_pe and positions overlap", LK_ERR_ALIAS,
            b_.q = in_big(&big, 2 * T + 2, LK_F32, 3, qsh); b_.pos = in_big(&big, 0, LK_I64, 1, p8));
        ADD("q_pe overlaps slot_mapping", "q_pe and slot_mapping overlap", LK_ERR_ALIAS,
            b_.q = qb; b_.sm = in_big(&big, 184, LK_I64, 1, s6));
        ADD("q_pe overlaps scale", "q_pe and scale overlap", LK_ERR_ALIAS, b_.q = qb; b_.sc = in_big(&big, 7, LK_F32, 1, &one));
        ADD("q_pe overlaps kv_c_cache", "kv_c_cache and q_pe overlap", LK_ERR_ALIAS,
            b_.q = in_big(&big, 2100, LK_F32, 3, qsh); b_.c1 = cb);
        ADD("q_pe overlaps k_pe_cache", "k_pe_cache and q_pe overlap", LK_ERR_ALIAS,
            b_.q = in_big(&big, 2100, LK_F32, 3, qsh); b_.c1 = ckv.t; b_.c2 = cb2; b_.has_c2 = 1);
        ADD("k_pe overlaps kv_c", "k_pe and kv_c overlap", LK_ERR_ALIAS,
            b_.kv = in_big(&big, 400, LK_F32, 2, kv2); b_.pe = in_big(&big, 420, LK_BF16, 2, k2));
        ADD("k_pe overlaps positions", "k_pe and positions overlap", LK_ERR_ALIAS,
            b_.pe = in_big(&big, 400, LK_BF16, 2, k2); b_.pos = in_big(&big, 420, LK_I64, 1, p8));
        ADD("k_pe overlaps cos_sin_cache", "k_pe and cos_sin_cache overlap", LK_ERR_ALIAS,
            b_.pe = in_big(&big, 400, LK_BF16, 2, k2); b_.cs = in_big(&big, 440, LK_F32, 2, csh8));
        ADD("k_pe overlaps slot_mapping", "k_pe and slot_mapping overlap", LK_ERR_ALIAS,
            b_.pe = in_big(&big, 400, LK_BF16, 2, k2); b_.sm = in_big(&big, 430, LK_I64, 1, s6));
        ADD("k_pe overlaps scale", "k_pe and scale overlap", LK_ERR_ALIAS,
            b_.pe = in_big(&big, 400, LK_BF16, 2, k2); b_.sc = in_big(&big, 401, LK_F32, 1, &one));
        ADD("k_pe overlaps kv_c_cache", "kv_c_cache and k_pe overlap", LK_ERR_ALIAS,
            b_.c1 = cb; b_.pe = in_big(&big, 2190, LK_BF16, 2, k2));
        ADD("kv_c overlaps kv_c_cache", "kv_c_cache and kv_c overlap", LK_ERR_ALIAS,
            b_.c1 = cb; b_.kv = in_big(&big, 1950, LK_F32, 2, kv2));
        ADD("kv_c_cache overlaps positions", "kv_c_cache and positions overlap", LK_ERR_ALIAS,
            b_.c1 = cb; b_.pos = in_big(&big, 2050, LK_I64, 1, p8));
        ADD("kv_c_cache overlaps positions past T", "kv_c_cache and positions overlap", LK_ERR_ALIAS,
            b_.c1 = cb; b_.pos = in_big(&big, 1988, LK_I64, 1, p8));
        ADD("kv_c_cache overlaps cos_sin_cache", "kv_c_cache and cos_sin_cache overlap", LK_ERR_ALIAS,
            b_.c1 = cb; b_.cs = in_big(&big, 1500, LK_F32, 2, csh));
        ADD("kv_c_cache overlaps slot_mapping", "kv_c_cache and slot_mapping overlap", LK_ERR_ALIAS,
            b_.c1 = cb; b_.sm = in_big(&big, 2180, LK_I64, 1, s6));
        ADD("kv_c_cache overlaps scale", "kv_c_cache and scale overlap", LK_ERR_ALIAS,
            b_.c1 = cb; b_.sc = in_big(&big, 2191, LK_F32, 1, &one));
        ADD("k_pe_cache overlaps positions", "k_pe_cache and positions overlap", LK_ERR_ALIAS,
            b_.c1 = ckv.t; b_.c2 = cb2; b_.has_c2 = 1; b_.pos = in_big(&big, 2010, LK_I64, 1, p8));
        ADD("k_pe_cache overlaps cos_sin_cache", "k_pe_cache and cos_sin_cache overlap", LK_ERR_ALIAS,
            b_.c1 = ckv.t; b_.c2 = cb2; b_.has_c2 = 1; b_.cs = in_big(&big, 2150, LK_F32, 2, csh));
        ADD("k_pe_cache overlaps k_pe", "k_pe_cache and k_pe overlap", LK_ERR_ALIAS,
            b_.c1 = ckv.t; b_.c2 = cb2; b_.has_c2 = 1; b_.pe = in_big(&big, 2020, LK_BF16, 2, k2));
    }
#undef ADD
    tu_buf *all[] = {&pos, &q, &pe, &kv, &cs, &c, &nz, &c8, &ckv, &cpe, &sm, &sc, &scv, &posb, &smb, &big};
    const int nall = (int)(sizeof all / sizeof all[0]);
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    for (int ii = 0; ii < nisa; ii++) {
        lk_set_isa(isas[ii]);
        for (int i = 0; i < n; i++) {
            bad_case *b = &cases[i];
            /* per-case values */
            for (int t = 0; t < T; t++) {
                tu_set(&posb, t, !strcmp(b->what, "position -1 on token 0") ? (t == 0 ? -1 : t)
                                                                             : (t == T - 1 ? (double)MP : t));
                tu_set(&smb, t, (double)SV[t]);
            }
            if (!strcmp(b->what, "slot beyond the cache")) tu_set(&smb, 3, (double)(nb * bs));
            if (!strcmp(b->what, "duplicate slot")) tu_set(&smb, 4, 7);
            if (within(&big, &b->pos))
                for (int t = 0; t < T + 2; t++) ((int64_t *)b->pos.data)[t] = PV[t];
            if (within(&big, &b->sm))
                for (int t = 0; t < T; t++) ((int64_t *)b->sm.data)[t] = SV[t];
            if (within(&big, &b->sc)) *(float *)b->sc.data = 1.0f;
            for (int k = 0; k < nall; k++) tu_snapshot(all[k]);
            lk_status st = lk_concat_and_cache_mla_rope(&b->pos, &b->q, &b->pe, &b->kv, &b->cs, i & 1, &b->c1,
                                                        b->has_c2 ? &b->c2 : NULL, &b->sm, b->L,
                                                        b->has_sc ? &b->sc : NULL);
            const char *msg = lk_last_error();
            int intact = 1;
            for (int k = 0; k < nall; k++) intact &= tu_intact(all[k]);
            tu_check(st == b->want && strstr(msg, "lk_concat_and_cache_mla_rope: ") == msg && strstr(msg, b->needle) &&
                         intact,
                     "%s mla_rope bad input '%s' -> %s, every buffer intact %d (%s)", lk_isa_name(isas[ii]), b->what,
                     lk_status_str(st), intact, msg);
        }
    }
    lk_set_isa(lk_isa_best());
    /* NULL pointers, each required argument */
    static const char *names[7] = {"positions", "q_pe", "k_pe", "kv_c", "cos_sin_cache", "kv_c_cache", "slot_mapping"};
    for (int i = 0; i < 7; i++) {
        const lk_tensor *a[7] = {&pos.t, &q.t, &pe.t, &kv.t, &cs.t, &c.t, &sm.t};
        a[i] = NULL;
        for (int k = 0; k < nall; k++) tu_snapshot(all[k]);
        lk_status st = lk_concat_and_cache_mla_rope(a[0], a[1], a[2], a[3], a[4], 1, a[5], NULL, a[6], LK_KV_ND, &sc.t);
        char needle[64];
        snprintf(needle, sizeof needle, "lk_concat_and_cache_mla_rope: %s:", names[i]);
        int intact = 1;
        for (int k = 0; k < nall; k++) intact &= tu_intact(all[k]);
        tu_check(st == LK_ERR_NULL && strstr(lk_last_error(), needle) && intact,
                 "mla_rope NULL %s pointer -> %s (%s)", names[i], lk_status_str(st), lk_last_error());
    }
    /* the same arguments, valid: positions past T out of range, scale with a bf16 cache,
     * and an interleaved k_pe / kv_c pair in one buffer are all fine */
    {
        lk_tensor kvb = in_big(&big, 3000, LK_F32, 2, (int64_t[]){T, Dl}), peb = kvb;
        kvb.stride[0] = peb.stride[0] = Dl + Dr;
        peb.data = (float *)kvb.data + Dl;
        peb.shape[1] = Dr;
        for (int k = 0; k < nall; k++) tu_snapshot(all[k]);
        lk_status st = lk_concat_and_cache_mla_rope(&pos.t, &q.t, &peb, &kvb, &cs.t, 1, &c.t, NULL, &sm.t, LK_KV_ND, &sc.t);
        tu_check(st == LK_OK && lk_last_error()[0] == 0 && !tu_intact(&q) && !tu_intact(&c) && !tu_intact(&big) &&
                     tu_intact(&pos) && tu_intact(&sm) && tu_intact(&cs),
                 "mla_rope valid call after the bad ones: succeeds, clears the error, writes (%s)", lk_last_error());
    }
    for (int k = 0; k < nall; k++) tu_free(all[k]);
}

int main(void) {
    tu_init();
    test_contract();
    test_rot0();
    test_grid();
    test_threads();
    test_bad();
    printf("  (%d grid cases)\n", ncases);
    return tu_finish("test_mla_rope");
}
