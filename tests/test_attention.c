/*
 * flash_attn_varlen: every ISA against a float64 dense computation (per request:
 * scores, mask, softmax, PV) and against ref. Dense and paged K/V (ND, HND permuted,
 * NZ; page sizes 1, 7, 16, 128), GQA/MQA, head dims 64..576, causal, windows, softcap,
 * fully masked rows, empty requests, padding tokens, strided views with garbage that must
 * stay untouched (unused cache slots hold NaN: reading them would poison the output),
 * LSE (also as the transpose of a [H, T] buffer), mixed dtypes, thread-count
 * determinism, NZ == ND bit for bit, and the bad-input catalogue. fp8 outs
 * (lk_flash_attn_varlen_scaled): codes against float64 / output_scale and against ref,
 * bit for bit the unfused f32 out + lk_static_scaled_fp8_quant, zero codes for rows that
 * see no key, saturation, NaN, and their bad inputs.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/half.h"
#include "testutil.h"

typedef struct {
    int B;
    int64_t ql[12], kl[12];
    int pad_tokens;              /* extra query rows after the last request */
    int64_t Hq, Hk, Dqk, Dv;
    int causal;
    int64_t wl, wr;
    float softcap;
    lk_dtype qt, kt, ot;
    int mixv; lk_dtype vt;       /* mixv: V stored as vt (else as kt) */
    int paged, bs, hnd;          /* hnd: ND cache stored [blocks, H, bs, D] (permuted view) */
    lk_kv_layout layout;
    int pad;                     /* strided views */
    int lse_t;                   /* lse as the transpose view of a [H, T] buffer */
    int alibi;                   /* ALiBi slopes: 0 none, 1 [Hq], 2 [B, Hq] (padded view) */
    int desc;                    /* fp8 descales: 0 none, 1 [], 2 [1], 3 [Hk], 4 [B, Hk] (padded view) */
    float osc;                   /* fp8 ot: output_scale (lk_flash_attn_varlen_scaled) */
    int osc_0d;                  /* output_scale as a [] view (else [1]) */
    const char *name;
} acase;

typedef struct {
    tu_buf q, k, v, out, lse, cuq, cuk, used, table, alibi, qd, kd, vd;
    double *want, *want_lse;     /* [Tq][Hq][Dv], [Tq][Hq] */
    int64_t Tq;
} abufs;

static double frand(void) { return tu_uniform(-1, 1); }

static int is_f8(lk_dtype dt) { return dt == LK_F8E4M3 || dt == LK_F8E5M2; }

/* the descale of q (w 0), k (1) or v (2) for request b, KV head kh; 1 without descales */
static double desc_of(const acase *c, int w, int64_t b, int64_t kh) {
    const double base[3] = {0.75, 1.3, 0.4};
    if (!c->desc) return 1.0;
    double s = base[w];
    if (c->desc >= 3) s *= 1.0 + 0.25 * (double)kh;
    if (c->desc == 4) s *= 1.0 + 0.125 * (double)b;
    return (double)(float)s;
}

/* the dequantized value of a stored q / k / v element (fp8: code * descale) */
static double deq(const acase *c, lk_dtype dt, int w, int64_t b, int64_t kh, double code) {
    return is_f8(dt) ? code * desc_of(c, w, b, kh) : code;
}

static tu_buf alloc_desc(const acase *c, int w) {
    tu_buf t;
    if (c->desc == 1) t = tu_alloc(LK_F32, 0, (int64_t[]){1}, 0);
    else if (c->desc == 2) t = tu_alloc(LK_F32, 1, (int64_t[]){1}, 0);
    else if (c->desc == 3) t = tu_alloc(LK_F32, 1, (int64_t[]){c->Hk}, 0);
    else t = tu_alloc(LK_F32, 2, (int64_t[]){c->B, c->Hk}, 1);
    int64_t nb = c->desc == 4 ? c->B : 1, nh = c->desc >= 3 ? c->Hk : 1;
    for (int64_t b = 0; b < nb; b++)
        for (int64_t h = 0; h < nh; h++) tu_set(&t, b * nh + h, desc_of(c, w, b, h));
    return t;
}

/* ALiBi slope of (request b, head h): powers of 2 as in the ALiBi paper, per request
 * scaled for the [B, Hq] form */
static double slope_of(const acase *c, int64_t b, int64_t h) {
    double s = pow(2.0, -8.0 * (double)(h + 1) / (double)c->Hq);
    return c->alibi == 2 ? s * (1.0 + 0.25 * (double)b) : s;
}

static lk_dtype vt_of(const acase *c) { return c->mixv ? c->vt : c->kt; }

/* flat logical index of (page, slot, h, d) in a cache tu_buf of dtype dt */
static int64_t cache_index(const acase *c, lk_dtype dt, int64_t page, int64_t slot, int64_t h,
                           int64_t d, int64_t D) {
    if (c->layout == LK_KV_NZ) {
        int64_t C = c->Hk * D, ch = h * D + d, T = is_f8(dt) ? 32 : 16; /* fp8: 32-wide tiles */
        return ((page * (C / T) + ch / T) * c->bs + slot) * T + ch % T;
    }
    return ((page * c->bs + slot) * c->Hk + h) * D + d;
}

static tu_buf alloc_cache(const acase *c, int64_t nb, int64_t D, lk_dtype dt) {
    int64_t T = is_f8(dt) ? 32 : 16;
    if (c->layout == LK_KV_NZ)
        return tu_alloc(dt, 4, (int64_t[]){nb, c->Hk * D / T, c->bs, T}, c->pad);
    if (c->hnd) return tu_alloc_perm(dt, 4, (int64_t[]){nb, c->bs, c->Hk, D}, (int[]){0, 2, 1, 3}, c->pad);
    return tu_alloc(dt, 4, (int64_t[]){nb, c->bs, c->Hk, D}, c->pad);
}

static void build(const acase *c, abufs *z) {
    memset(z, 0, sizeof *z);
    int64_t Tq = 0, Tk = 0, B = c->B, G = c->Hq / c->Hk;
    for (int b = 0; b < B; b++) Tq += c->ql[b], Tk += c->kl[b];
    Tq += c->pad_tokens;
    z->Tq = Tq;
    z->q = tu_alloc(c->qt, 3, (int64_t[]){Tq, c->Hq, c->Dqk}, c->pad);
    tu_fill_uniform(&z->q, -1, 1);
    z->out = tu_alloc(c->ot, 3, (int64_t[]){Tq, c->Hq, c->Dv}, c->pad);
    z->lse = c->lse_t ? tu_alloc_perm(LK_F32, 2, (int64_t[]){Tq, c->Hq}, (int[]){1, 0}, c->pad)
                      : tu_alloc(LK_F32, 2, (int64_t[]){Tq, c->Hq}, c->pad);
    z->cuq = tu_alloc(LK_I32, 1, (int64_t[]){B + 1}, 0);
    /* logical K/V per request (rounded to the cache dtype) */
    double **K = calloc((size_t)B, sizeof(double *)), **V = calloc((size_t)B, sizeof(double *));
    for (int b = 0; b < B; b++) {
        K[b] = malloc(sizeof(double) * (size_t)(c->kl[b] * c->Hk * c->Dqk + 1));
        V[b] = malloc(sizeof(double) * (size_t)(c->kl[b] * c->Hk * c->Dv + 1));
        double amp = is_f8(c->kt) ? 3.0 : 1.0, vamp = is_f8(vt_of(c)) ? 3.0 : 1.0; /* fp8 codes over more binades */
        for (int64_t i = 0; i < c->kl[b] * c->Hk * c->Dqk; i++) K[b][i] = lk_round_to(c->kt, (float)(amp * frand()));
        for (int64_t i = 0; i < c->kl[b] * c->Hk * c->Dv; i++) V[b][i] = lk_round_to(vt_of(c), (float)(vamp * frand()));
    }
    int64_t acc = 0;
    for (int b = 0; b <= B; b++) {
        tu_set(&z->cuq, b, (double)acc);
        if (b < B) acc += c->ql[b];
    }
    if (!c->paged) {
        z->k = tu_alloc(c->kt, 3, (int64_t[]){Tk, c->Hk, c->Dqk}, c->pad);
        z->v = tu_alloc(vt_of(c), 3, (int64_t[]){Tk, c->Hk, c->Dv}, c->pad);
        z->cuk = tu_alloc(LK_I32, 1, (int64_t[]){B + 1}, 0);
        int64_t r = 0;
        for (int b = 0; b <= B; b++) {
            tu_set(&z->cuk, b, (double)r);
            if (b == B) break;
            for (int64_t j = 0; j < c->kl[b]; j++, r++) {
                for (int64_t i = 0; i < c->Hk * c->Dqk; i++) tu_set(&z->k, r * c->Hk * c->Dqk + i, K[b][j * c->Hk * c->Dqk + i]);
                for (int64_t i = 0; i < c->Hk * c->Dv; i++) tu_set(&z->v, r * c->Hk * c->Dv + i, V[b][j * c->Hk * c->Dv + i]);
            }
        }
    } else {
        int64_t maxp = 1, total = 0;
        for (int b = 0; b < B; b++) {
            int64_t np = (c->kl[b] + c->bs - 1) / c->bs;
            if (np > maxp) maxp = np;
            total += np;
        }
        maxp += 1; /* a spare column of garbage (-1) */
        int64_t nb = total + 3;
        int64_t *perm = malloc(sizeof(int64_t) * (size_t)nb);
        for (int64_t i = 0; i < nb; i++) perm[i] = i;
        for (int64_t i = nb - 1; i > 0; i--) {
            int64_t j = tu_randint(0, i), t = perm[i];
            perm[i] = perm[j], perm[j] = t;
        }
        z->k = alloc_cache(c, nb, c->Dqk, c->kt);
        z->v = alloc_cache(c, nb, c->Dv, vt_of(c));
        z->table = tu_alloc(LK_I32, 2, (int64_t[]){B, maxp}, 0);
        z->used = tu_alloc(LK_I32, 1, (int64_t[]){B}, 0);
        int64_t next = 0;
        for (int b = 0; b < B; b++) {
            tu_set(&z->used, b, (double)c->kl[b]);
            int64_t np = (c->kl[b] + c->bs - 1) / c->bs;
            for (int64_t p = 0; p < maxp; p++) tu_set(&z->table, b * maxp + p, p < np ? (double)perm[next + p] : -1.0);
            for (int64_t j = 0; j < c->kl[b]; j++) {
                int64_t page = perm[next + j / c->bs], slot = j % c->bs;
                for (int64_t h = 0; h < c->Hk; h++) {
                    for (int64_t d = 0; d < c->Dqk; d++)
                        tu_set(&z->k, cache_index(c, c->kt, page, slot, h, d, c->Dqk), K[b][(j * c->Hk + h) * c->Dqk + d]);
                    for (int64_t d = 0; d < c->Dv; d++)
                        tu_set(&z->v, cache_index(c, vt_of(c), page, slot, h, d, c->Dv), V[b][(j * c->Hk + h) * c->Dv + d]);
                }
            }
            next += np;
        }
        free(perm);
    }
    if (c->alibi) {
        z->alibi = c->alibi == 1 ? tu_alloc(LK_F32, 1, (int64_t[]){c->Hq}, 0)
                                 : tu_alloc(LK_F32, 2, (int64_t[]){B, c->Hq}, 1);
        for (int64_t b = 0; b < (c->alibi == 2 ? B : 1); b++)
            for (int64_t h = 0; h < c->Hq; h++) tu_set(&z->alibi, b * c->Hq + h, slope_of(c, b, h));
    }
    if (c->desc) z->qd = alloc_desc(c, 0), z->kd = alloc_desc(c, 1), z->vd = alloc_desc(c, 2);
    /* float64 dense reference (of the dequantized fp8 values) */
    z->want = calloc((size_t)(Tq * c->Hq * c->Dv + 1), sizeof(double));
    z->want_lse = malloc(sizeof(double) * (size_t)(Tq * c->Hq + 1));
    for (int64_t i = 0; i < Tq * c->Hq; i++) z->want_lse[i] = -INFINITY;
    double *s = malloc(sizeof(double) * 4096);
    int64_t q0 = 0;
    for (int b = 0; b < B; b++) {
        int64_t ql = c->ql[b], kl = c->kl[b], off = kl - ql;
        for (int64_t i = 0; i < ql; i++)
            for (int64_t h = 0; h < c->Hq; h++) {
                int64_t kh = h / G, t = q0 + i;
                double m = -INFINITY;
                for (int64_t j = 0; j < kl; j++) {
                    int vis = 1;
                    int64_t wr = c->causal ? 0 : c->wr;
                    if (c->wl >= 0 && j < i + off - c->wl) vis = 0;
                    if (wr >= 0 && j > i + off + wr) vis = 0;
                    if (!vis) {
                        s[j] = -INFINITY;
                        continue;
                    }
                    double dot = 0;
                    for (int64_t d = 0; d < c->Dqk; d++)
                        dot += deq(c, c->qt, 0, b, kh, tu_get(&z->q, (t * c->Hq + h) * c->Dqk + d)) *
                               deq(c, c->kt, 1, b, kh, K[b][(j * c->Hk + kh) * c->Dqk + d]);
                    double sc = dot * (double)(float)(1.0 / sqrt((double)c->Dqk));
                    if (c->softcap > 0) sc = c->softcap * tanh(sc / c->softcap);
                    if (c->alibi) sc -= (double)(float)slope_of(c, b, h) * fabs((double)(i + off - j));
                    s[j] = sc;
                    if (sc > m) m = sc;
                }
                if (m == -INFINITY) continue;
                double l = 0;
                for (int64_t j = 0; j < kl; j++) l += exp(s[j] - m);
                for (int64_t d = 0; d < c->Dv; d++) {
                    double o = 0;
                    for (int64_t j = 0; j < kl; j++)
                        if (s[j] > -INFINITY) o += exp(s[j] - m) * deq(c, vt_of(c), 2, b, kh, V[b][(j * c->Hk + kh) * c->Dv + d]);
                    z->want[(t * c->Hq + h) * c->Dv + d] = o / l;
                }
                z->want_lse[t * c->Hq + h] = m + log(l);
            }
        q0 += ql;
    }
    free(s);
    for (int b = 0; b < B; b++) free(K[b]), free(V[b]);
    free(K), free(V);
}

static void free_bufs(abufs *z) {
    tu_free(&z->q), tu_free(&z->k), tu_free(&z->v), tu_free(&z->out), tu_free(&z->lse);
    tu_free(&z->cuq), tu_free(&z->cuk), tu_free(&z->used), tu_free(&z->table);
    if (z->alibi.base) tu_free(&z->alibi);
    if (z->qd.base) tu_free(&z->qd), tu_free(&z->kd), tu_free(&z->vd);
    free(z->want), free(z->want_lse);
}

static lk_attn_params params_of(const acase *c) {
    lk_attn_params p = lk_attn_params_default((float)(1.0 / sqrt((double)c->Dqk)));
    p.causal = c->causal;
    p.window_left = c->wl;
    p.window_right = c->wr;
    p.softcap = c->softcap;
    p.kv_layout = c->layout;
    return p;
}

static lk_status call(const acase *c, abufs *z, int with_lse) {
    lk_attn_params p = params_of(c);
    if (c->alibi) p.alibi_slopes = &z->alibi.t;
    if (c->desc) p.q_descale = &z->qd.t, p.k_descale = &z->kd.t, p.v_descale = &z->vd.t;
    if (is_f8(c->ot)) { /* fp8 out: the scaled entry */
        float os = c->osc;
        lk_tensor tos = c->osc_0d ? lk_tensor_make(&os, LK_F32, 0, NULL) : lk_tensor_make(&os, LK_F32, 1, (int64_t[]){1});
        return lk_flash_attn_varlen_scaled(&z->out.t, with_lse ? &z->lse.t : NULL, &z->q.t, &z->k.t, &z->v.t,
                                           &z->cuq.t, c->paged ? NULL : &z->cuk.t, c->paged ? &z->used.t : NULL,
                                           c->paged ? &z->table.t : NULL, &p, &tos);
    }
    return lk_flash_attn_varlen(&z->out.t, with_lse ? &z->lse.t : NULL, &z->q.t, &z->k.t, &z->v.t,
                                &z->cuq.t, c->paged ? NULL : &z->cuk.t, c->paged ? &z->used.t : NULL,
                                c->paged ? &z->table.t : NULL, &p);
}

static tu_tolerance attn_tol(lk_dtype ot) {
    tu_tolerance t = tu_tol(ot);
    if (ot == LK_F32) t.atol = t.rtol = 3e-5; /* f32 sums over up to 10^3 keys, polynomial exp */
    return t;
}

/* ---- fp8 outs: code helpers (codes compared in sign-magnitude order) ---- */
static uint8_t f8_enc(lk_dtype dt, double x) {
    return dt == LK_F8E4M3 ? lk_f32_to_f8e4m3((float)x) : lk_f32_to_f8e5m2((float)x);
}
static double f8_dec(lk_dtype dt, uint8_t c) { return dt == LK_F8E4M3 ? lk_f8e4m3_to_f32(c) : lk_f8e5m2_to_f32(c); }
static int f8_ord(uint8_t c) { return c & 0x80 ? -(int)(c & 0x7f) : (int)(c & 0x7f); }
static int f8_nan(lk_dtype dt, uint8_t c) { return dt == LK_F8E4M3 ? (c & 0x7f) == 0x7f : (c & 0x7f) > 0x7c; }
static uint8_t f8_maxcode(lk_dtype dt) { return dt == LK_F8E4M3 ? 0x7e : 0x7b; }
/* code g for the exact value w with an absolute slack e: NaN for NaN, never an
 * infinity (the converter saturates), else within one code of the codes of [w - e, w + e] */
static int f8_close(lk_dtype dt, uint8_t g, double w, double e) {
    if (isnan(w) || f8_nan(dt, g)) return isnan(w) && f8_nan(dt, g);
    if ((g & 0x7f) > f8_maxcode(dt)) return 0;
    int o = f8_ord(g), lo = f8_ord(f8_enc(dt, w - e)), hi = f8_ord(f8_enc(dt, w + e));
    return o >= lo - 1 && o <= hi + 1;
}
/* the f32 attention's absolute slack (attn_tol f32) of a value v, in output_scale units */
static double f8_slack(double v, double osc) { return 3e-5 * (1.0 + fabs(v)) / osc; }
static uint8_t code_at(const tu_buf *b, int64_t i) { return ((const uint8_t *)b->t.data)[tu_offset(&b->t, i)]; }

/* an fp8 out on every ISA: each code against float64 (the code of want / output_scale,
 * within one code of the codes the f32 attention tolerance spans), rows that see no key
 * exactly code 0 (and lse -inf), against ref's codes (within one code of the codes of
 * ref's value +- the tolerance), lse against float64, garbage around every view intact;
 * and bit for bit the unfused form on the same ISA: the f32 out of lk_flash_attn_varlen
 * quantized by lk_static_scaled_fp8_quant. Returns the last ISA's out values. */
static double *run_case_f8(const acase *c) {
    abufs z;
    build(c, &z);
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    int64_t n = z.Tq * c->Hq * c->Dv;
    lk_dtype ot = c->ot;
    double osc = c->osc;
    uint8_t *first = malloc((size_t)n + 1);
    double *last = NULL;
    acase cf = *c;
    cf.ot = LK_F32;
    tu_buf o32 = tu_alloc(LK_F32, 3, (int64_t[]){z.Tq, c->Hq, c->Dv}, 0);
    tu_buf q8 = tu_alloc(ot, 3, (int64_t[]){z.Tq, c->Hq, c->Dv}, 0);
    float os = c->osc;
    lk_tensor tos = lk_tensor_make(&os, LK_F32, 1, (int64_t[]){1});
    for (int ii = 0; ii < nisa; ii++) {
        lk_set_isa(isas[ii]);
        tu_snapshot(&z.out), tu_snapshot(&z.lse), tu_snapshot(&z.q), tu_snapshot(&z.k), tu_snapshot(&z.v);
        lk_status st = call(c, &z, 1);
        int bad = 0, bad_ref = 0, bad_zero = 0;
        for (int64_t i = 0; i < n && st == LK_OK; i++) {
            uint8_t g = code_at(&z.out, i);
            double w = z.want[i];
            if (z.want_lse[i / c->Dv] == -INFINITY) bad_zero += g != 0x00; /* no key: +0 */
            else bad += !f8_close(ot, g, w / osc, f8_slack(w, osc));
            if (ii == 0) first[i] = g;
            else {
                double r = f8_dec(ot, first[i]);
                bad_ref += f8_nan(ot, first[i]) ? !f8_nan(ot, g) : !f8_close(ot, g, r, f8_slack(r * osc, osc));
            }
        }
        double *gl = tu_values(&z.lse);
        double el = tu_err(gl, z.want_lse, z.Tq * c->Hq, (tu_tolerance){1e-4, 1e-4});
        int intact = tu_outside_intact(&z.out) && tu_outside_intact(&z.lse) && tu_intact(&z.q) &&
                     tu_intact(&z.k) && tu_intact(&z.v);
        tu_check(st == LK_OK && !bad && !bad_ref && !bad_zero && el <= 1 && intact,
                 "attn fp8 out %s %s: B=%d Hq=%lld Hk=%lld D=%lld/%lld %s/%s/%s output_scale %g: %d codes off "
                 "float64, %d off ref, %d empty rows not 0, lse_err=%.3g intact=%d %s",
                 lk_isa_name(isas[ii]), c->name, c->B, (long long)c->Hq, (long long)c->Hk, (long long)c->Dqk,
                 (long long)c->Dv, lk_dtype_name(c->qt), lk_dtype_name(c->kt), lk_dtype_name(ot), osc, bad, bad_ref,
                 bad_zero, el, intact, st ? lk_last_error() : "");
        free(gl);
        /* the unfused form: f32 out, then static_scaled_fp8_quant, on this ISA */
        tu_buf keep = z.out;
        z.out = o32;
        lk_status s2 = call(&cf, &z, 0);
        z.out = keep;
        lk_status s3 = lk_static_scaled_fp8_quant(&q8.t, &o32.t, &tos);
        int diff = 0;
        for (int64_t i = 0; i < n; i++) diff += code_at(&q8, i) != code_at(&z.out, i);
        tu_check(s2 == LK_OK && s3 == LK_OK && diff == 0,
                 "attn fp8 out %s %s: bit for bit static_scaled_fp8_quant(f32 out, output_scale) (%d differ)",
                 lk_isa_name(isas[ii]), c->name, diff);
        if (ii == nisa - 1) last = tu_values(&z.out);
    }
    lk_set_isa(lk_isa_best());
    tu_free(&o32), tu_free(&q8);
    free(first);
    free_bufs(&z);
    return last;
}

/* runs every ISA; returns the out values of the last ISA (caller frees) */
static double *run_case(const acase *c) {
    if (is_f8(c->ot)) return run_case_f8(c);
    abufs z;
    build(c, &z);
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    int64_t n = z.Tq * c->Hq * c->Dv;
    double *first = NULL, *last = NULL;
    for (int ii = 0; ii < nisa; ii++) {
        lk_set_isa(isas[ii]);
        tu_snapshot(&z.out), tu_snapshot(&z.lse), tu_snapshot(&z.q), tu_snapshot(&z.k), tu_snapshot(&z.v);
        lk_status st = call(c, &z, 1);
        double *got = tu_values(&z.out), *gl = tu_values(&z.lse);
        double e = tu_err(got, z.want, n, attn_tol(c->ot));
        double el = tu_err(gl, z.want_lse, z.Tq * c->Hq, (tu_tolerance){1e-4, 1e-4});
        int intact = tu_outside_intact(&z.out) && tu_outside_intact(&z.lse) && tu_intact(&z.q) &&
                     tu_intact(&z.k) && tu_intact(&z.v);
        tu_check(st == LK_OK && e <= 1 && el <= 1 && intact,
                 "attn %s %s: B=%d Hq=%lld Hk=%lld D=%lld/%lld %s/%s/%s err=%.3g lse_err=%.3g intact=%d %s",
                 lk_isa_name(isas[ii]), c->name, c->B, (long long)c->Hq, (long long)c->Hk, (long long)c->Dqk,
                 (long long)c->Dv, lk_dtype_name(c->qt), lk_dtype_name(c->kt), lk_dtype_name(c->ot), e, el,
                 intact, st ? lk_last_error() : "");
        if (ii == 0) {
            first = got;
        } else {
            tu_tolerance t = attn_tol(c->ot);
            if (c->ot != LK_F32) t.atol = t.rtol = c->ot == LK_F16 ? 1e-3 : 8e-3;
            tu_check(tu_err(got, first, n, t) <= 1, "attn %s vs ref %s", lk_isa_name(isas[ii]), c->name);
        }
        free(gl);
        if (ii == nisa - 1) last = got;
        else if (ii) free(got);
    }
    if (nisa > 1) free(first);
    lk_set_isa(lk_isa_best());
    free_bufs(&z);
    return last;
}

static acase base_case(void) {
    acase c;
    memset(&c, 0, sizeof c);
    c.B = 1, c.ql[0] = 7, c.kl[0] = 7, c.Hq = 2, c.Hk = 1, c.Dqk = 64, c.Dv = 64;
    c.wl = c.wr = -1;
    c.qt = c.kt = c.ot = LK_BF16;
    c.bs = 16;
    c.name = "base";
    return c;
}

static void test_grid(void) {
    acase c;
    /* sequence lengths, causal and not, dense */
    const int64_t lens[] = {0, 1, 2, 7, 64, 257};
    for (int qi = 0; qi < 6; qi++)
        for (int ki = 0; ki < 6; ki++)
            for (int causal = 0; causal <= 1; causal++) {
                c = base_case();
                c.ql[0] = lens[qi], c.kl[0] = lens[ki], c.causal = causal;
                c.name = causal ? "lens causal" : "lens";
                free(run_case(&c));
            }
    /* long: 1000 x 1000 causal, and decode over 1000 / 1500 keys (several chunks) */
    c = base_case();
    c.ql[0] = 1000, c.kl[0] = 1000, c.causal = 1, c.Hq = 1, c.Dqk = c.Dv = 32, c.name = "1000^2 causal";
    free(run_case(&c));
    c = base_case();
    c.B = 3, c.ql[0] = 1, c.ql[1] = 1, c.ql[2] = 3, c.kl[0] = 1000, c.kl[1] = 1500, c.kl[2] = 517;
    c.causal = 1, c.paged = 1, c.Hq = 8, c.Hk = 2, c.name = "decode paged multi-chunk";
    free(run_case(&c));
    /* GQA ratios and MQA */
    const int64_t hq[] = {4, 8, 8, 8, 8}, hk[] = {4, 4, 2, 1, 8};
    for (int i = 0; i < 5; i++) {
        c = base_case();
        c.Hq = hq[i], c.Hk = hk[i], c.ql[0] = 33, c.kl[0] = 40, c.causal = 1, c.name = "gqa";
        free(run_case(&c));
    }
    /* head dims */
    const int64_t dq[] = {64, 80, 96, 128, 256, 192, 576}, dv[] = {64, 80, 96, 128, 256, 128, 512};
    for (int i = 0; i < 7; i++) {
        c = base_case();
        c.Dqk = dq[i], c.Dv = dv[i], c.ql[0] = 9, c.kl[0] = 70, c.causal = 1, c.Hq = 2, c.Hk = 1, c.name = "head dims";
        free(run_case(&c));
    }
    /* decode head dims off the 32-dim steps of the bf16 dot path (ND tails of 8 / 16 / 24,
     * NZ tails of one 16-dim chunk), GQA groups of 4 (the 4-head kernels) and 6 (4 + 1 +
     * 1), paged ND and NZ */
    const int64_t ddq[] = {40, 72, 80, 200, 576}, ddv[] = {24, 40, 80, 136, 512};
    for (int i = 0; i < 5; i++)
        for (int g = 0; g < 2; g++)
            for (int nz = 0; nz <= (ddq[i] % 16 == 0 && ddv[i] % 16 == 0); nz++) {
                c = base_case();
                c.B = 2, c.ql[0] = 1, c.ql[1] = 3, c.kl[0] = 70, c.kl[1] = 37, c.causal = 1, c.paged = 1;
                c.Dqk = ddq[i], c.Dv = ddv[i], c.Hq = g ? 6 : 8, c.Hk = g ? 1 : 2;
                c.layout = nz ? LK_KV_NZ : LK_KV_ND, c.name = "decode head dims";
                free(run_case(&c));
            }
    /* q_len > k_len causal: fully masked rows; windows */
    c = base_case();
    c.ql[0] = 20, c.kl[0] = 5, c.causal = 1, c.name = "q>k causal (masked rows)";
    free(run_case(&c));
    const int64_t wls[] = {3, 16, 0, 5}, wrs[] = {0, 4, 0, -1};
    for (int i = 0; i < 4; i++) {
        c = base_case();
        c.ql[0] = 70, c.kl[0] = 130, c.wl = wls[i], c.wr = wrs[i], c.name = "window";
        free(run_case(&c));
        c.ql[0] = 1, c.name = "window decode";
        free(run_case(&c));
    }
    c = base_case();
    c.ql[0] = 30, c.kl[0] = 10, c.wl = 2, c.wr = 1, c.name = "window excluding rows";
    free(run_case(&c));
    /* ALiBi ([Hq] and [B, Hq] slopes): prefill tiles, decode chunks, causal, windows,
     * softcap, dense and paged, q_len > k_len */
    for (int al = 1; al <= 2; al++) {
        c = base_case();
        c.B = 2, c.ql[0] = 40, c.ql[1] = 3, c.kl[0] = 90, c.kl[1] = 3, c.Hq = 4, c.Hk = 2, c.alibi = al;
        c.causal = 1, c.name = al == 1 ? "alibi [Hq] causal" : "alibi [B, Hq] causal";
        free(run_case(&c));
        c.causal = 0, c.name = "alibi non-causal";
        free(run_case(&c));
        c.wl = 7, c.wr = 2, c.softcap = 3.0f, c.qt = c.kt = c.ot = LK_F32, c.name = "alibi window softcap f32";
        free(run_case(&c));
        c = base_case();
        c.B = 3, c.ql[0] = 1, c.ql[1] = 2, c.ql[2] = 1, c.kl[0] = 700, c.kl[1] = 33, c.kl[2] = 0, c.paged = 1;
        c.Hq = 8, c.Hk = 2, c.causal = 1, c.alibi = al, c.name = "alibi decode paged";
        free(run_case(&c));
        c.ql[1] = 5, c.kl[1] = 2, c.paged = 0, c.name = "alibi q > k";
        free(run_case(&c));
    }
    /* softcap */
    c = base_case();
    c.ql[0] = 40, c.kl[0] = 90, c.softcap = 2.0f, c.causal = 1, c.name = "softcap";
    free(run_case(&c));
    c.ql[0] = 2, c.name = "softcap decode";
    free(run_case(&c));
    /* dtypes, mixed */
    const lk_dtype dts[][3] = {{LK_F32, LK_F32, LK_F32}, {LK_F16, LK_F16, LK_F16}, {LK_BF16, LK_BF16, LK_BF16},
                               {LK_F32, LK_BF16, LK_F16}, {LK_F16, LK_F32, LK_BF16}};
    for (int i = 0; i < 5; i++)
        for (int paged = 0; paged <= 1; paged++) {
            c = base_case();
            c.qt = dts[i][0], c.kt = dts[i][1], c.ot = dts[i][2], c.ql[0] = 45, c.kl[0] = 100, c.causal = 1;
            c.paged = paged, c.name = "dtypes";
            free(run_case(&c));
        }
    /* batches mixing empty requests, padding tokens, strided everything, LSE transposed */
    c = base_case();
    c.B = 5;
    int64_t ql[5] = {3, 0, 17, 1, 0}, kl[5] = {3, 9, 0, 30, 0};
    memcpy(c.ql, ql, sizeof ql), memcpy(c.kl, kl, sizeof kl);
    c.pad_tokens = 2, c.pad = 1, c.lse_t = 1, c.Hq = 4, c.Hk = 2, c.causal = 1;
    for (int paged = 0; paged <= 1; paged++) {
        c.paged = paged, c.name = paged ? "mixed batch paged strided" : "mixed batch dense strided";
        free(run_case(&c));
    }
}

/* fp8 q / K / V (e4m3, e5m2) with descales of every form, against the float64 attention
 * of the dequantized values (code * descale) on every ISA: decode and prefill, dense and
 * paged, GQA groups of 1, 4 and 6, head dims, empty requests, padded views */
static void test_fp8_grid(void) {
    const lk_dtype dts[][3] = {{LK_BF16, LK_F8E4M3, LK_BF16}, {LK_BF16, LK_F8E5M2, LK_BF16},
                               {LK_F8E4M3, LK_F8E4M3, LK_BF16}, {LK_F32, LK_F8E4M3, LK_F32},
                               {LK_BF16, LK_F8E4M3, LK_F32},    {LK_F8E5M2, LK_F8E5M2, LK_F16},
                               {LK_F16, LK_F8E5M2, LK_BF16}};
    int n = 0;
    for (int i = 0; i < 7; i++)
        for (int shape = 0; shape < 4; shape++) {
            acase c = base_case();
            c.qt = dts[i][0], c.kt = dts[i][1], c.ot = dts[i][2], c.desc = n++ % 5;
            c.Dqk = c.Dv = 128, c.causal = 1;
            if (shape == 0) { /* paged decode, GQA 4, several chunks */
                c.B = 3, c.ql[0] = 1, c.ql[1] = 1, c.ql[2] = 3, c.kl[0] = 700, c.kl[1] = 0, c.kl[2] = 37;
                c.Hq = 8, c.Hk = 2, c.paged = 1, c.name = "fp8 decode paged";
            } else if (shape == 1) { /* dense prefill */
                c.ql[0] = 40, c.kl[0] = 90, c.Hq = 4, c.Hk = 2, c.name = "fp8 prefill dense";
            } else if (shape == 2) { /* MHA decode, NZ, head dims 64 / 96 */
                c.B = 2, c.ql[0] = 1, c.ql[1] = 2, c.kl[0] = 65, c.kl[1] = 130, c.Hq = c.Hk = 3;
                c.Dqk = 64, c.Dv = 96, c.paged = 1, c.layout = LK_KV_NZ, c.name = "fp8 decode NZ MHA";
            } else { /* GQA 6, mixed batch with empty requests, padding, strided views */
                c.B = 5;
                int64_t ql[5] = {3, 0, 17, 1, 0}, kl[5] = {3, 9, 0, 30, 0};
                memcpy(c.ql, ql, sizeof ql), memcpy(c.kl, kl, sizeof kl);
                c.pad_tokens = 2, c.pad = 1, c.lse_t = 1, c.Hq = 6, c.Hk = 1, c.paged = 1, c.bs = 7;
                c.Dqk = 80, c.Dv = 48, c.name = "fp8 mixed batch strided";
            }
            free(run_case(&c));
        }
    /* softcap, window and ALiBi with fp8 */
    acase c = base_case();
    c.qt = LK_BF16, c.kt = LK_F8E4M3, c.ot = LK_BF16, c.desc = 4, c.B = 2, c.ql[0] = 1, c.ql[1] = 33;
    c.kl[0] = 300, c.kl[1] = 50, c.Hq = 8, c.Hk = 2, c.paged = 1, c.softcap = 2.5f, c.wl = 40, c.alibi = 2;
    c.Dqk = c.Dv = 128, c.causal = 1, c.name = "fp8 softcap window alibi";
    free(run_case(&c));
}

/* page sizes 1, 7, 16, 128 with fp8 caches: NZ (32-wide tiles) == ND == HND bit for bit */
static void test_fp8_paged(void) {
    const int bss[] = {1, 7, 16, 128};
    for (int i = 0; i < 4; i++)
        for (int decode = 0; decode <= 1; decode++) {
            acase c = base_case();
            c.B = 2, c.ql[0] = decode ? 1 : 19, c.ql[1] = decode ? 2 : 40, c.kl[0] = 150, c.kl[1] = 41;
            c.causal = 1, c.paged = 1, c.bs = bss[i], c.Hq = 8, c.Hk = 2, c.Dqk = 128, c.Dv = 128;
            c.kt = i % 2 ? LK_F8E5M2 : LK_F8E4M3, c.desc = 3 + i % 2;
            tu_seed(2000 + i);
            c.name = "fp8 paged ND";
            double *nd = run_case(&c);
            tu_seed(2000 + i);
            c.layout = LK_KV_NZ, c.name = "fp8 paged NZ";
            double *nz = run_case(&c);
            tu_seed(2000 + i);
            c.layout = LK_KV_ND, c.hnd = 1, c.pad = 1, c.name = "fp8 paged HND strided";
            double *hnd = run_case(&c);
            int64_t n = (c.ql[0] + c.ql[1]) * c.Hq * c.Dv;
            tu_check(memcmp(nd, nz, sizeof(double) * (size_t)n) == 0 && memcmp(nd, hnd, sizeof(double) * (size_t)n) == 0,
                     "attn fp8 page size %d %s: NZ and HND outputs bit-identical to ND", bss[i],
                     decode ? "decode" : "prefill");
            free(nd), free(nz), free(hnd);
        }
}

/* every fp8 code through K and V on every ISA, decode (paged: request r on page r, one
 * query) and prefill (dense: request r = key row r, 5 queries): key r holds code r in
 * every dim, every V row the codes 0..255 (dim d = code d), queries one-hot at dim 0
 * (bf16 1). So lse = 2 * value(code r) (k_descale 2, exact) and out = 0.5 * value(code
 * d) (v_descale 0.5; one key: P = 1) bit for bit: a wrong entry of a widening table shows
 * here. NaN codes give NaN, e5m2's infinities inf (lse); such rows are not compared. */
static void test_fp8_codes(void) {
    enum { D = 256, HQ = 4, R = 256, QL = 5 };
    static uint8_t kc[R][D], vc[R][D];
    static uint16_t q[R * QL][HQ][D];
    static float out[R * QL][HQ][D], lse[R * QL][HQ];
    static int32_t cuq[R + 1], cuk[R + 1], used[R], table[R];
    float kd = 2.0f, vd = 0.5f;
    for (int r = 0; r < R; r++)
        for (int d = 0; d < D; d++) kc[r][d] = (uint8_t)r, vc[r][d] = (uint8_t)d;
    memset(q, 0, sizeof q);
    for (int r = 0; r < R * QL; r++)
        for (int h = 0; h < HQ; h++) q[r][h][0] = 0x3f80; /* bf16 1.0 */
    for (int r = 0; r <= R; r++) cuk[r] = r;
    for (int r = 0; r < R; r++) used[r] = 1, table[r] = r;
    lk_tensor tkd = lk_tensor_make(&kd, LK_F32, 0, NULL), tvd = lk_tensor_make(&vd, LK_F32, 0, NULL);
    lk_isa isas[TU_MAX_ISAS];
    int ni = tu_isas(isas);
    for (int f = 0; f < 2; f++)
        for (int decode = 0; decode <= 1; decode++)
            for (int of = 0; of <= 1; of++) {
                lk_dtype dt = f ? LK_F8E5M2 : LK_F8E4M3, ot = of ? LK_F32 : LK_BF16;
                int ql = decode ? 1 : QL;
                lk_attn_params p = lk_attn_params_default(1.0f);
                p.k_descale = &tkd, p.v_descale = &tvd;
                for (int r = 0; r <= R; r++) cuq[r] = r * ql;
                lk_tensor tq = lk_tensor_make(q, LK_BF16, 3, (int64_t[]){R * ql, HQ, D});
                lk_tensor to = lk_tensor_make(out, ot, 3, (int64_t[]){R * ql, HQ, D});
                lk_tensor tl = lk_tensor_make(lse, LK_F32, 2, (int64_t[]){R * ql, HQ});
                lk_tensor tcq = lk_tensor_make(cuq, LK_I32, 1, (int64_t[]){R + 1});
                lk_tensor tck = lk_tensor_make(cuk, LK_I32, 1, (int64_t[]){R + 1});
                lk_tensor tu = lk_tensor_make(used, LK_I32, 1, (int64_t[]){R});
                lk_tensor tt = lk_tensor_make(table, LK_I32, 2, (int64_t[]){R, 1});
                lk_tensor tk = decode ? lk_tensor_make(kc, dt, 4, (int64_t[]){R, 1, 1, D})
                                      : lk_tensor_make(kc, dt, 3, (int64_t[]){R, 1, D});
                lk_tensor tv = decode ? lk_tensor_make(vc, dt, 4, (int64_t[]){R, 1, 1, D})
                                      : lk_tensor_make(vc, dt, 3, (int64_t[]){R, 1, D});
                for (int ii = 0; ii < ni; ii++) {
                    lk_set_isa(isas[ii]);
                    memset(out, 0x55, sizeof out);
                    lk_status st = decode ? lk_flash_attn_varlen(&to, &tl, &tq, &tk, &tv, &tcq, NULL, &tu, &tt, &p)
                                          : lk_flash_attn_varlen(&to, &tl, &tq, &tk, &tv, &tcq, &tck, NULL, NULL, &p);
                    int bad = 0;
                    for (int t = 0; t < R * ql && !st; t++) {
                        int r = t / ql;
                        float kv = dt == LK_F8E4M3 ? lk_f8e4m3_to_f32((uint8_t)r) : lk_f8e5m2_to_f32((uint8_t)r);
                        for (int h = 0; h < HQ; h++) {
                            float want = 2.0f * kv, got = lse[t][h];
                            /* an infinite score: lse inf or NaN (attn_state.h's +inf rule) */
                            if (!(isnan(want) || isinf(want) ? isnan(got) || got == want : got == want)) bad++;
                            if (!isfinite(kv)) continue; /* a NaN / inf score: a NaN row */
                            for (int d = 0; d < D; d++) {
                                float vv = dt == LK_F8E4M3 ? lk_f8e4m3_to_f32((uint8_t)d) : lk_f8e5m2_to_f32((uint8_t)d);
                                float w = 0.5f * vv;
                                float g = ot == LK_F32 ? out[t][h][d] : lk_load_f(out, LK_BF16, (t * HQ + h) * D + d);
                                if (!(isnan(w) ? isnan(g) : g == w)) bad++;
                            }
                        }
                    }
                    tu_check(st == LK_OK && bad == 0, "attn fp8 codes %s %s %s out %s: %d wrong (%s)",
                             lk_isa_name(isas[ii]), lk_dtype_name(dt), decode ? "decode" : "prefill",
                             lk_dtype_name(ot), bad, st ? lk_last_error() : "");
                }
            }
    lk_set_isa(lk_isa_best());
}

/* page sizes, ND / HND / NZ, NZ == ND bit for bit */
/* paged ND / NZ / HND, GQA 2 and 4 (4 x 128 dims: the decode's g4 path on the AVX512_BF16
 * build) */
static void test_paged(void) {
    const int bss[] = {1, 7, 16, 128};
    for (int i = 0; i < 8; i++)
        for (int decode = 0; decode <= 1; decode++) {
            acase c = base_case();
            c.B = 2, c.ql[0] = decode ? 1 : 19, c.ql[1] = decode ? 2 : 40, c.kl[0] = 150, c.kl[1] = 41;
            c.causal = 1, c.paged = 1, c.bs = bss[i % 4], c.Hq = i < 4 ? 4 : 8, c.Hk = 2, c.Dqk = 128, c.Dv = 128;
            tu_seed(1000 + i);
            c.name = "paged ND";
            double *nd = run_case(&c);
            tu_seed(1000 + i);
            c.layout = LK_KV_NZ, c.name = "paged NZ";
            double *nz = run_case(&c);
            tu_seed(1000 + i);
            c.layout = LK_KV_ND, c.hnd = 1, c.pad = 1, c.name = "paged HND strided";
            double *hnd = run_case(&c);
            int64_t n = (c.ql[0] + c.ql[1]) * c.Hq * c.Dv;
            tu_check(memcmp(nd, nz, sizeof(double) * (size_t)n) == 0 && memcmp(nd, hnd, sizeof(double) * (size_t)n) == 0,
                     "attn page size %d %s Hq %lld: NZ and HND outputs bit-identical to ND", bss[i % 4],
                     decode ? "decode" : "prefill", (long long)c.Hq);
            free(nd), free(nz), free(hnd);
        }
}

/* decode with 4 query heads per KV head x 128 dims (the g4 path on the AVX512_BF16
 * build: key-major scores, softmax over 16 heads per vector, padded head lanes when Hq
 * is not a multiple of 16, V rows paired by unpacks): bf16, e4m3 and e5m2 K / V, several
 * chunks, odd block tails, 1..4 queries, windows, strided views and padding rows */
static void test_decode_g4(void) {
    const lk_dtype kts[] = {LK_BF16, LK_F8E4M3, LK_F8E5M2};
    const int64_t hq[] = {4, 8, 20, 32}, hk[] = {1, 2, 5, 8};
    for (int t = 0; t < 3; t++)
        for (int s = 0; s < 4; s++) {
            acase c = base_case();
            c.kt = kts[t], c.desc = t ? 1 + s : 0;
            c.B = 3, c.ql[0] = 1, c.ql[1] = 4, c.ql[2] = 2, c.kl[0] = 1100, c.kl[1] = 1 + 4 * s, c.kl[2] = 37;
            c.Hq = hq[s], c.Hk = hk[s], c.Dqk = 128, c.Dv = s == 2 ? 64 : 128, c.causal = 1, c.paged = 1;
            c.bs = s % 2 ? 7 : 16, c.layout = s == 1 ? LK_KV_NZ : LK_KV_ND, c.pad = s == 3, c.pad_tokens = s == 3;
            if (s == 0) c.wl = 300;
            c.name = "decode g4";
            free(run_case(&c));
        }
}

/* decode with head dims multiples of 16 (the f32 block loop, decode_row_g4f, on AVX2, on
 * AVX-512 for dims multiples of 32, and on avx512bf16 for the fp8 K / V its bf16 loops do
 * not take: G = 3, 6, 7 below, float outs; K /
 * V converted once per group of heads, key-major scores, e4m3 read as value / 256 with
 * its NaN code put back; the AMX row's tile loop, decode_row_amx, for fp8 K and V with a
 * bf16 out): 4, 8, 12, 3 (2 + 1), 7 (4 + 2 + 1), 1 and 16 query heads per KV
 * head (1 through the f32 loop for fp8 K / V only), head dims 16 / 32 to 192 / 128, every K / V dtype and
 * mixed K / V dtypes, fp8 and f32 q, f32 / f16 / bf16 out, ND and NZ, pages 1, 7 and 16,
 * several chunks, 1..4 queries, windows, strided views and padding rows */
static void test_decode_g4f(void) {
    const lk_dtype kvt[][2] = {{LK_BF16, LK_BF16},     {LK_F8E4M3, LK_F8E4M3}, {LK_F8E5M2, LK_F8E5M2},
                               {LK_F16, LK_F16},       {LK_F32, LK_F32},       {LK_F8E4M3, LK_BF16},
                               {LK_BF16, LK_F8E5M2},   {LK_F8E5M2, LK_F8E4M3}};
    const lk_dtype qo[][2] = {{LK_BF16, LK_BF16}, {LK_F32, LK_F32}, {LK_F8E4M3, LK_F16}, {LK_F16, LK_BF16}};
    const int64_t hq[] = {8, 16, 24, 9, 14, 6, 32}, hk[] = {2, 2, 2, 3, 2, 6, 2};
    const int64_t dq[] = {128, 64, 192, 16, 64, 128, 64}, dv[] = {128, 64, 128, 32, 96, 128, 192};
    for (int t = 0; t < 8; t++)
        for (int s = 0; s < 7; s++) {
            acase c = base_case();
            c.kt = kvt[t][0], c.mixv = 1, c.vt = kvt[t][1];
            c.qt = qo[(t + s) % 4][0], c.ot = qo[(t + s) % 4][1];
            c.desc = is_f8(c.kt) || is_f8(c.vt) || is_f8(c.qt) ? 1 + (t + s) % 4 : 0;
            c.B = 3, c.ql[0] = 1, c.ql[1] = 1 + s, c.ql[2] = 2, c.kl[0] = s == 1 ? 1100 : 530, c.kl[1] = 1 + 5 * s;
            c.kl[2] = 37, c.Hq = hq[s], c.Hk = hk[s], c.Dqk = dq[s], c.Dv = dv[s], c.causal = 1, c.paged = 1;
            c.bs = s == 3 ? 1 : s % 2 ? 7 : 16;
            c.layout = (s == 1 || s == 5) && c.kt == c.vt && !(is_f8(c.kt) && c.Dqk % 32) ? LK_KV_NZ : LK_KV_ND;
            c.pad = s == 2, c.pad_tokens = s == 2;
            if (s == 0) c.wl = 300;
            c.name = "decode g4f";
            free(run_case(&c));
        }
}

/* an e4m3 NaN code in one K row (key 21 of KV head 1) makes that key's scores NaN for the
 * KV head's query heads: their outputs and LSEs are NaN, every other head's are finite
 * and match ref; 2 and 8 query heads per KV head, head dims 128 (NaN at dim 77) and 48
 * (dim 40: in the last 16 codes, after the 32-code steps), every ISA */
static void test_gqa_decode_nan_key(void) {
    enum { HK = 2, DMAX = 128, BS = 16, K = 40, NB = 3, HQMAX = 16, N = NB * BS * HK * DMAX };
    static uint16_t q[HQMAX * DMAX], out[HQMAX * DMAX], ref[HQMAX * DMAX];
    static uint8_t k8[N], v8[N];
    static float lse[HQMAX], lref[HQMAX];
    tu_seed(98);
    for (int i = 0; i < HQMAX * DMAX; i++) q[i] = lk_f32_to_bf16((float)tu_uniform(-1, 1));
    int32_t table[NB] = {2, 0, 1}, cq[2] = {0, 1}, lens[1] = {K};
    lk_tensor tb = lk_tensor_make(table, LK_I32, 2, (int64_t[]){1, NB});
    lk_tensor tcq = lk_tensor_make(cq, LK_I32, 1, (int64_t[]){2}), tl = lk_tensor_make(lens, LK_I32, 1, (int64_t[]){1});
    lk_attn_params p = lk_attn_params_default(0.08f);
    lk_isa isas[TU_MAX_ISAS];
    int ni = tu_isas(isas);
    for (int64_t D = 128; D >= 48; D -= 80)
        for (int64_t hq = 4; hq <= HQMAX; hq *= 4) {
            int64_t G = hq / HK;
            for (int i = 0; i < N; i++) k8[i] = (uint8_t)(0x30 + tu_rand() % 12), v8[i] = (uint8_t)(0xb0 + tu_rand() % 12);
            k8[((0 * BS + 5) * HK + 1) * D + (D == 128 ? 77 : 40)] = 0xff; /* table[1] = 0: slot 5 of page 0 is key 21 */
            lk_tensor tk = lk_tensor_make(k8, LK_F8E4M3, 4, (int64_t[]){NB, BS, HK, D});
            lk_tensor tv = lk_tensor_make(v8, LK_F8E4M3, 4, (int64_t[]){NB, BS, HK, D});
            lk_tensor tq = lk_tensor_make(q, LK_BF16, 3, (int64_t[]){1, hq, D});
            lk_tensor to = lk_tensor_make(out, LK_BF16, 3, (int64_t[]){1, hq, D});
            lk_tensor tr = lk_tensor_make(ref, LK_BF16, 3, (int64_t[]){1, hq, D});
            lk_tensor tlse = lk_tensor_make(lse, LK_F32, 2, (int64_t[]){1, hq}), tlr = lk_tensor_make(lref, LK_F32, 2, (int64_t[]){1, hq});
            lk_set_isa(LK_ISA_REF);
            lk_status s0 = lk_flash_attn_varlen(&tr, &tlr, &tq, &tk, &tv, &tcq, NULL, &tl, &tb, &p);
            for (int ii = 1; ii < ni; ii++) {
                lk_set_isa(isas[ii]);
                int ok = s0 == LK_OK && lk_flash_attn_varlen(&to, &tlse, &tq, &tk, &tv, &tcq, NULL, &tl, &tb, &p) == LK_OK;
                for (int64_t h = 0; h < hq; h++) {
                    int poisoned = h >= G;
                    ok &= poisoned ? isnan(lse[h]) && isnan(lref[h]) : isfinite(lse[h]) && fabsf(lse[h] - lref[h]) <= 1e-4f;
                    for (int64_t d = 0; d < D; d++) {
                        float v = lk_bf16_to_f32(out[h * D + d]), r = lk_bf16_to_f32(ref[h * D + d]);
                        ok &= poisoned ? isnan(v) && isnan(r) : isfinite(v) && fabsf(v - r) <= 0.02f;
                    }
                }
                tu_check(ok, "gqa decode %s, %lld heads per KV head, D = %lld: an e4m3 NaN code in one K row makes "
                         "its KV head's outputs and LSEs NaN, the other heads' match ref", lk_isa_name(isas[ii]),
                         (long long)G, (long long)D);
            }
        }
    lk_set_isa(lk_isa_best());
}

/* 1..4 threads bitwise identical, prefill and decode, bf16 and (scaled entry) e4m3 outs */
static void test_threads(void) {
    for (int f8 = 0; f8 <= 1; f8++)
        for (int decode = 0; decode <= 1; decode++) {
            acase c = base_case();
            c.B = 2, c.ql[0] = decode ? 2 : 150, c.ql[1] = 1, c.kl[0] = 300, c.kl[1] = 1200, c.Hq = 4, c.Hk = 2;
            c.causal = 1, c.paged = 1;
            if (f8) c.ot = LK_F8E4M3, c.osc = 0.02f, c.Hq = 8; /* 8 / 2: the GQA-4 decode loop */
            abufs z;
            build(&c, &z);
            tu_buf ref = tu_alloc(c.ot, 3, (int64_t[]){z.Tq, c.Hq, c.Dv}, 0);
            lk_set_num_threads(1);
            call(&c, &z, 1);
            double *v1 = tu_values(&z.out), *l1 = tu_values(&z.lse);
            int same = 1;
            for (int nt = 2; nt <= 4; nt++) {
                lk_set_num_threads(nt);
                call(&c, &z, 1);
                double *v = tu_values(&z.out), *l = tu_values(&z.lse);
                same &= memcmp(v, v1, sizeof(double) * (size_t)(z.Tq * c.Hq * c.Dv)) == 0;
                same &= memcmp(l, l1, sizeof(double) * (size_t)(z.Tq * c.Hq)) == 0;
                free(v), free(l);
            }
            tu_check(same, "attn %s %s out: bitwise identical for 1..4 threads", decode ? "decode" : "prefill",
                     lk_dtype_name(c.ot));
            lk_set_num_threads(0);
            free(v1), free(l1);
            tu_free(&ref);
            free_bufs(&z);
        }
}

static void test_bad_inputs(void) {
    acase c = base_case();
    c.B = 2, c.ql[0] = 3, c.ql[1] = 4, c.kl[0] = 20, c.kl[1] = 5, c.paged = 1, c.bs = 4, c.causal = 1;
    c.Hq = 4, c.Hk = 2;
    abufs z;
    build(&c, &z);
    lk_attn_params p = params_of(&c);
    struct {
        const char *what, *arg;
        lk_status want;
    } r;
#define EXPECT(W, A, S, CALL)                                                                        \
    do {                                                                                             \
        r.what = W, r.arg = A, r.want = S;                                                           \
        tu_snapshot(&z.out), tu_snapshot(&z.lse), tu_snapshot(&z.k), tu_snapshot(&z.table);          \
        lk_status st_ = CALL;                                                                        \
        tu_check(st_ == r.want && strstr(lk_last_error(), r.arg) && tu_intact(&z.out) &&             \
                     tu_intact(&z.lse) && tu_intact(&z.k) && tu_intact(&z.table),                    \
                 "attn bad input '%s' -> %s (%s)", r.what, lk_status_str(st_), lk_last_error());     \
    } while (0)
#define ATTN(OUT, Q, K, TABLE, USED, CUQ, PP) \
    lk_flash_attn_varlen(OUT, &z.lse.t, Q, K, &z.v.t, CUQ, NULL, USED, TABLE, PP)
    /* block_table entry out of range (only entries of used pages are checked) */
    int32_t *tb = (int32_t *)z.table.t.data;
    int32_t keep = tb[0];
    tb[0] = 9999;
    EXPECT("block_table entry out of range", "block_table", LK_ERR_INDEX, ATTN(&z.out.t, &z.q.t, &z.k.t, &z.table.t, &z.used.t, &z.cuq.t, &p));
    tb[0] = -5;
    EXPECT("block_table entry negative", "block_table", LK_ERR_INDEX, ATTN(&z.out.t, &z.q.t, &z.k.t, &z.table.t, &z.used.t, &z.cuq.t, &p));
    tb[0] = keep;
    int32_t *used = (int32_t *)z.used.t.data;
    int32_t ku = used[1];
    used[1] = (int32_t)(z.table.t.shape[1] * c.bs + 1);
    EXPECT("key length exceeds the table's capacity", "seqused_k", LK_ERR_INDEX, ATTN(&z.out.t, &z.q.t, &z.k.t, &z.table.t, &z.used.t, &z.cuq.t, &p));
    used[1] = ku;
    int32_t *cu = (int32_t *)z.cuq.t.data;
    int32_t k1 = cu[1];
    cu[1] = 5, cu[2] = 4;
    EXPECT("cu_seqlens_q decreasing", "cu_seqlens_q", LK_ERR_INDEX, ATTN(&z.out.t, &z.q.t, &z.k.t, &z.table.t, &z.used.t, &z.cuq.t, &p));
    cu[1] = k1, cu[2] = 7;
    cu[2] = 100;
    EXPECT("cu_seqlens_q beyond q", "cu_seqlens_q", LK_ERR_INDEX, ATTN(&z.out.t, &z.q.t, &z.k.t, &z.table.t, &z.used.t, &z.cuq.t, &p));
    cu[2] = 7;
    lk_tensor q3 = z.q.t, o3 = z.out.t, l3 = z.lse.t; /* 3 of the 4 heads vs 2 KV heads */
    q3.shape[1] = o3.shape[1] = l3.shape[1] = 3;
    EXPECT("heads not divisible", "q", LK_ERR_SHAPE, lk_flash_attn_varlen(&o3, &l3, &q3, &z.k.t, &z.v.t, &z.cuq.t, NULL, &z.used.t, &z.table.t, &p));
    lk_tensor kbad = z.k.t;
    kbad.shape[3] = 32;
    EXPECT("k head dim mismatch", "k", LK_ERR_SHAPE, ATTN(&z.out.t, &z.q.t, &kbad, &z.table.t, &z.used.t, &z.cuq.t, &p));
    lk_tensor obad = z.out.t;
    obad.shape[0] = 6;
    EXPECT("out tokens mismatch", "out", LK_ERR_SHAPE, ATTN(&obad, &z.q.t, &z.k.t, &z.table.t, &z.used.t, &z.cuq.t, &p));
    lk_tensor tbad = z.table.t;
    tbad.dtype = LK_F32;
    EXPECT("block_table float", "block_table", LK_ERR_DTYPE, ATTN(&z.out.t, &z.q.t, &z.k.t, &tbad, &z.used.t, &z.cuq.t, &p));
    lk_attn_params pb = p;
    pb.scale = NAN;
    EXPECT("scale NaN", "scale", LK_ERR_VALUE, ATTN(&z.out.t, &z.q.t, &z.k.t, &z.table.t, &z.used.t, &z.cuq.t, &pb));
    pb = p;
    pb.window_left = -3;
    EXPECT("window < -1", "window", LK_ERR_VALUE, ATTN(&z.out.t, &z.q.t, &z.k.t, &z.table.t, &z.used.t, &z.cuq.t, &pb));
    EXPECT("params NULL", "params", LK_ERR_NULL, ATTN(&z.out.t, &z.q.t, &z.k.t, &z.table.t, &z.used.t, &z.cuq.t, NULL));
    EXPECT("out aliases q", "out", LK_ERR_ALIAS, ATTN(&z.q.t, &z.q.t, &z.k.t, &z.table.t, &z.used.t, &z.cuq.t, &p));
    EXPECT("lse overlaps out", "lse", LK_ERR_ALIAS,
           lk_flash_attn_varlen(&z.out.t, &(lk_tensor){z.out.t.data, LK_F32, 2, {z.Tq, c.Hq}, {c.Hq, 1}}, &z.q.t, &z.k.t, &z.v.t, &z.cuq.t, NULL, &z.used.t, &z.table.t, &p));
    EXPECT("paged without seqused_k", "seqused_k", LK_ERR_NULL, ATTN(&z.out.t, &z.q.t, &z.k.t, &z.table.t, NULL, &z.cuq.t, &p));
    pb = p;
    pb.kv_layout = LK_KV_NZ; /* the ND cache's dims do not describe an NZ page */
    EXPECT("ND cache passed as NZ", "k", LK_ERR_SHAPE, ATTN(&z.out.t, &z.q.t, &z.k.t, &z.table.t, &z.used.t, &z.cuq.t, &pb));
#undef ATTN
#undef EXPECT
    free_bufs(&z);
}

/* q/k/v_descale of a wrong shape, dtype, rank or value (fp8 caches, and a bf16 q whose
 * descale is validated all the same): named, nothing written */
static void test_fp8_bad_descales(void) {
    acase c = base_case();
    c.B = 2, c.ql[0] = 1, c.ql[1] = 3, c.kl[0] = 20, c.kl[1] = 5, c.Hq = 4, c.Hk = 2, c.paged = 1, c.bs = 4;
    c.kt = LK_F8E4M3, c.desc = 4;
    abufs z;
    build(&c, &z);
    tu_buf bad[7] = {tu_alloc(LK_F32, 1, (int64_t[]){3}, 0),    tu_alloc(LK_F32, 2, (int64_t[]){2, 3}, 0),
                     tu_alloc(LK_F32, 2, (int64_t[]){3, 2}, 0), tu_alloc(LK_F16, 1, (int64_t[]){2}, 0),
                     tu_alloc(LK_F32, 3, (int64_t[]){2, 2, 1}, 0), tu_alloc(LK_F32, 2, (int64_t[]){2, 2}, 1),
                     tu_alloc(LK_F32, 1, (int64_t[]){1}, 0)};
    lk_status want[7] = {LK_ERR_SHAPE, LK_ERR_SHAPE, LK_ERR_SHAPE, LK_ERR_DTYPE, LK_ERR_RANK, LK_ERR_VALUE, LK_ERR_VALUE};
    for (int i = 0; i < 7; i++) tu_fill_uniform(&bad[i], 0.5, 1);
    tu_set(&bad[5], 3, NAN);
    tu_set(&bad[6], 0, -0.5);
    const char *names[3] = {"q_descale", "k_descale", "v_descale"};
    for (int w = 0; w < 3; w++)
        for (int i = 0; i < 7; i++) {
            lk_attn_params p = params_of(&c);
            p.q_descale = &z.qd.t, p.k_descale = &z.kd.t, p.v_descale = &z.vd.t;
            if (w == 0) p.q_descale = &bad[i].t;
            else if (w == 1) p.k_descale = &bad[i].t;
            else p.v_descale = &bad[i].t;
            tu_snapshot(&z.out), tu_snapshot(&z.lse);
            lk_status st = lk_flash_attn_varlen(&z.out.t, &z.lse.t, &z.q.t, &z.k.t, &z.v.t, &z.cuq.t, NULL, &z.used.t,
                                                &z.table.t, &p);
            tu_check(st == want[i] && strstr(lk_last_error(), names[w]) && tu_intact(&z.out) && tu_intact(&z.lse),
                     "attn fp8 bad %s case %d -> %s (%s)", names[w], i, lk_status_str(st), lk_last_error());
        }
    /* lse overlapping a descale (valid values in it) */
    lk_attn_params p = params_of(&c);
    float *l0 = (float *)z.lse.t.data;
    l0[0] = 1.0f;
    p.v_descale = &(lk_tensor){l0, LK_F32, 1, {1}, {1}};
    lk_status st = lk_flash_attn_varlen(&z.out.t, &z.lse.t, &z.q.t, &z.k.t, &z.v.t, &z.cuq.t, NULL, &z.used.t,
                                        &z.table.t, &p);
    tu_check(st == LK_ERR_ALIAS && strstr(lk_last_error(), "v_descale"), "attn fp8: lse overlapping v_descale -> %s (%s)",
             lk_status_str(st), lk_last_error());
    for (int i = 0; i < 7; i++) tu_free(&bad[i]);
    free_bufs(&z);
}

/* fuzz regression (fuzz_attention), prefill: a key hidden by the causal mask whose V
 * holds +inf. The AVX2 prefill tile multiplied masked keys by P = 0 (0 * inf = NaN),
 * so a future token's value turned every earlier query's output into NaN. Every ISA:
 * rows 0..6 (which cannot see key 7) are 0.5 (the mean of equal values, to rounding),
 * row 7 is +inf. */
static void test_regress_masked_inf_value(void) {
    enum { T = 8, D = 16 };
    float k[T][1][D], v[T][1][D], q[T][1][D], out[T][1][D];
    for (int t = 0; t < T; t++)
        for (int d = 0; d < D; d++) {
            k[t][0][d] = 0.1f * (float)((t + d) % 3), q[t][0][d] = 0.2f;
            v[t][0][d] = t == T - 1 ? INFINITY : 0.5f;
        }
    int32_t cu[2] = {0, T};
    lk_tensor tq = lk_tensor_make(q, LK_F32, 3, (int64_t[]){T, 1, D});
    lk_tensor tk = lk_tensor_make(k, LK_F32, 3, (int64_t[]){T, 1, D});
    lk_tensor tv = lk_tensor_make(v, LK_F32, 3, (int64_t[]){T, 1, D});
    lk_tensor to = lk_tensor_make(out, LK_F32, 3, (int64_t[]){T, 1, D});
    lk_tensor tc = lk_tensor_make(cu, LK_I32, 1, (int64_t[]){2});
    lk_attn_params p = lk_attn_params_default(0.25f);
    p.causal = 1;
    lk_isa isas[TU_MAX_ISAS];
    int ni = tu_isas(isas);
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        lk_status st = lk_flash_attn_varlen(&to, NULL, &tq, &tk, &tv, &tc, &tc, NULL, NULL, &p);
        int ok = st == LK_OK;
        for (int t = 0; t < T; t++)
            for (int d = 0; d < D; d++)
                ok &= t == T - 1 ? out[t][0][d] == INFINITY : fabsf(out[t][0][d] - 0.5f) <= 1e-6f;
        tu_check(ok, "regress %s: a masked key's +inf value does not reach earlier queries",
                 lk_isa_name(isas[ii]));
    }
    lk_set_isa(lk_isa_best());
}

/* fuzz regression (fuzz_attention), decode: visible keys whose V holds -inf. The AVX2
 * decode path padded a block's last keys to four with weight-0 copies of a visible row
 * (0 * -inf = NaN) and returned NaN where the reference returns -inf. Every ISA: -inf. */
static void test_regress_visible_inf_value(void) {
    enum { K = 5, D = 16 };
    float k[K][1][D], v[K][1][D], q[1][1][D], out[1][1][D];
    for (int j = 0; j < K; j++)
        for (int d = 0; d < D; d++) k[j][0][d] = 0.1f * (float)(d % 3), v[j][0][d] = j < 3 ? 0.5f : -INFINITY;
    for (int d = 0; d < D; d++) q[0][0][d] = 0.2f;
    int32_t cq[2] = {0, 1}, ck[2] = {0, K};
    lk_tensor tq = lk_tensor_make(q, LK_F32, 3, (int64_t[]){1, 1, D});
    lk_tensor tk = lk_tensor_make(k, LK_F32, 3, (int64_t[]){K, 1, D});
    lk_tensor tv = lk_tensor_make(v, LK_F32, 3, (int64_t[]){K, 1, D});
    lk_tensor to = lk_tensor_make(out, LK_F32, 3, (int64_t[]){1, 1, D});
    lk_tensor tcq = lk_tensor_make(cq, LK_I32, 1, (int64_t[]){2});
    lk_tensor tck = lk_tensor_make(ck, LK_I32, 1, (int64_t[]){2});
    lk_attn_params p = lk_attn_params_default(0.25f);
    lk_isa isas[TU_MAX_ISAS];
    int ni = tu_isas(isas);
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        lk_status st = lk_flash_attn_varlen(&to, NULL, &tq, &tk, &tv, &tcq, &tck, NULL, NULL, &p);
        int ok = st == LK_OK;
        for (int d = 0; d < D; d++) ok &= out[0][0][d] == -INFINITY;
        tu_check(ok, "regress %s: visible -inf values give -inf (got %g)", lk_isa_name(isas[ii]),
                 (double)out[0][0][0]);
    }
    lk_set_isa(lk_isa_best());
}

/* fuzz regression (fuzz_attention): NZ caches [1, 1, 2, 16] (one page, one 16-dim
 * chunk) whose size-1 dims have strides INT64_MAX and -INT64_MAX. The AVX2 decode dot
 * product stepped its row pointer by chunk stride * element size after the last chunk
 * (signed overflow, UBSan). lk_paged_init now drops the strides of size-1 dims: every
 * ISA gives the bits of the same call with ordinary strides. */
static void test_regress_nz_unit_dim_strides(void) {
    float kb[2 * 16], vb[2 * 16], q[2][16], o1[2][16], o2[2][16];
    for (int i = 0; i < 32; i++) kb[i] = 0.05f * (float)(i % 7), vb[i] = 0.1f * (float)(i % 5) - 0.2f;
    for (int i = 0; i < 32; i++) q[i / 16][i % 16] = 0.03f * (float)(i % 11);
    int32_t cu[2] = {0, 2}, used[1] = {2}, bt[1][1] = {{0}};
    lk_tensor tq = lk_tensor_make(q, LK_F32, 3, (int64_t[]){2, 1, 16});
    lk_tensor tk = lk_tensor_make(kb, LK_F32, 4, (int64_t[]){1, 1, 2, 16});
    lk_tensor tv = lk_tensor_make(vb, LK_F32, 4, (int64_t[]){1, 1, 2, 16});
    lk_tensor tcu = lk_tensor_make(cu, LK_I32, 1, (int64_t[]){2});
    lk_tensor tu = lk_tensor_make(used, LK_I32, 1, (int64_t[]){1});
    lk_tensor tb = lk_tensor_make(bt, LK_I32, 2, (int64_t[]){1, 1});
    lk_tensor t1 = lk_tensor_make(o1, LK_F32, 3, (int64_t[]){2, 1, 16}), t2 = lk_tensor_make(o2, LK_F32, 3, (int64_t[]){2, 1, 16});
    lk_tensor hk = tk, hv = tv;
    hk.stride[0] = hv.stride[0] = INT64_MAX;
    hk.stride[1] = hv.stride[1] = -INT64_MAX;
    lk_attn_params p = lk_attn_params_default(0.25f);
    p.kv_layout = LK_KV_NZ;
    lk_isa isas[TU_MAX_ISAS];
    int ni = tu_isas(isas);
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        lk_status s1 = lk_flash_attn_varlen(&t1, NULL, &tq, &tk, &tv, &tcu, NULL, &tu, &tb, &p);
        lk_status s2 = lk_flash_attn_varlen(&t2, NULL, &tq, &hk, &hv, &tcu, NULL, &tu, &tb, &p);
        tu_check(s1 == LK_OK && s2 == LK_OK && memcmp(o1, o2, sizeof o1) == 0,
                 "regress %s: NZ size-1 dims with strides +-INT64_MAX (%s)", lk_isa_name(isas[ii]),
                 lk_status_str(s2));
    }
    lk_set_isa(lk_isa_best());
}

/* an inf (NaN) in one dim of a visible key's V on the GQA decode path (4 query heads per
 * KV head x 128 dims, paged, bf16 out: the g4 loop, whose P . V pairs V's values): the
 * dim becomes inf (NaN) for the 4 heads of that KV head, every other dim and head stays
 * finite and within tolerance of ref (a product kernel that paired the dim with a
 * neighbour, or a head with another, would carry it there). bf16, e5m2 (its inf code)
 * and e4m3 (its NaN code) caches; every ISA. */
static void test_gqa_decode_inf_value(void) {
    enum { HQ = 8, HK = 2, D = 128, BS = 16, K = 40, NB = 3 };
    static uint16_t q[1][HQ][D], kb[NB][BS][HK][D], vb[NB][BS][HK][D], out[HQ][D], ref[HQ][D];
    static uint8_t k8[NB][BS][HK][D], v8[NB][BS][HK][D];
    tu_seed(97);
    for (int h = 0; h < HQ; h++)
        for (int d = 0; d < D; d++) q[0][h][d] = lk_f32_to_bf16((float)tu_uniform(-1, 1));
    for (int p = 0; p < NB; p++)
        for (int j = 0; j < BS; j++)
            for (int h = 0; h < HK; h++)
                for (int d = 0; d < D; d++) {
                    k8[p][j][h][d] = (uint8_t)(0x30 + tu_rand() % 12), v8[p][j][h][d] = (uint8_t)(0x30 + tu_rand() % 12);
                    kb[p][j][h][d] = lk_f32_to_bf16((float)tu_uniform(-1, 1));
                    vb[p][j][h][d] = lk_f32_to_bf16((float)tu_uniform(-1, 1));
                }
    int32_t table[NB] = {2, 0, 1}, cq[2] = {0, 1}, lens[1] = {K};
    lk_tensor tq = lk_tensor_make(q, LK_BF16, 3, (int64_t[]){1, HQ, D}), tb = lk_tensor_make(table, LK_I32, 2, (int64_t[]){1, NB});
    lk_tensor tcq = lk_tensor_make(cq, LK_I32, 1, (int64_t[]){2}), tl = lk_tensor_make(lens, LK_I32, 1, (int64_t[]){1});
    lk_attn_params p = lk_attn_params_default(0.08f);
    lk_isa isas[TU_MAX_ISAS];
    int ni = tu_isas(isas);
    for (int f = 0; f < 3; f++) { /* bf16, e5m2, e4m3 */
        lk_dtype dt = f == 0 ? LK_BF16 : f == 1 ? LK_F8E5M2 : LK_F8E4M3;
        /* key 21 (slot 5 of the second page, block 0) of KV head 1, dim 37 */
        if (f == 0) vb[0][5][1][37] = 0x7f80;
        else v8[0][5][1][37] = f == 1 ? 0x7c : 0x7f;
        void *kd = f ? (void *)k8 : (void *)kb, *vd = f ? (void *)v8 : (void *)vb;
        lk_tensor tk = lk_tensor_make(kd, dt, 4, (int64_t[]){NB, BS, HK, D}), tv = lk_tensor_make(vd, dt, 4, (int64_t[]){NB, BS, HK, D});
        lk_tensor to = lk_tensor_make(out, LK_BF16, 3, (int64_t[]){1, HQ, D}), tr = lk_tensor_make(ref, LK_BF16, 3, (int64_t[]){1, HQ, D});
        lk_set_isa(LK_ISA_REF);
        lk_status s0 = lk_flash_attn_varlen(&tr, NULL, &tq, &tk, &tv, &tcq, NULL, &tl, &tb, &p);
        for (int ii = 1; ii < ni; ii++) {
            lk_set_isa(isas[ii]);
            int ok = s0 == LK_OK && lk_flash_attn_varlen(&to, NULL, &tq, &tk, &tv, &tcq, NULL, &tl, &tb, &p) == LK_OK;
            for (int h = 0; h < HQ; h++)
                for (int d = 0; d < D; d++) {
                    float v = lk_bf16_to_f32(out[h][d]), r = lk_bf16_to_f32(ref[h][d]);
                    if (h >= 4 && d == 37) ok &= f == 2 ? isnan(v) && isnan(r) : v == INFINITY && r == INFINITY;
                    else ok &= isfinite(v) && fabsf(v - r) <= 0.02f;
                }
            tu_check(ok, "gqa decode %s %s: an %s in one V dim reaches that dim of its KV head's 4 heads only",
                     lk_isa_name(isas[ii]), lk_dtype_name(dt), f == 2 ? "NaN" : "inf");
        }
        if (f == 0) vb[0][5][1][37] = lk_f32_to_bf16(0.5f);
        else v8[0][5][1][37] = 0x38;
    }
    lk_set_isa(lk_isa_best());
}

/* fuzz regression (fuzz_attention): every visible score is -inf (q holds -inf, k > 0)
 * and a visible key's V holds +inf. The row sees no weight: out = 0 and lse = -inf by the
 * attention-state rules; AVX2 returned NaN (weight 0 * inf in the accumulator, then
 * scaled by 1/l = 0). Every ISA, decode (1 query) and prefill (8 queries). */
static void test_regress_all_neg_inf_scores(void) {
    enum { T = 8, K = 6, D = 16 };
    float k[K][1][D], v[K][1][D], q[T][1][D], out[T][1][D], lse[T][1];
    for (int j = 0; j < K; j++)
        for (int d = 0; d < D; d++) k[j][0][d] = 0.5f, v[j][0][d] = j == 2 ? INFINITY : 0.25f;
    for (int t = 0; t < T; t++)
        for (int d = 0; d < D; d++) q[t][0][d] = d == 0 ? -INFINITY : 0.1f;
    lk_isa isas[TU_MAX_ISAS];
    int ni = tu_isas(isas);
    for (int prefill = 0; prefill <= 1; prefill++) {
        int tq = prefill ? T : 1;
        int32_t cq[2] = {0, tq}, ck[2] = {0, K};
        lk_tensor ttq = lk_tensor_make(q, LK_F32, 3, (int64_t[]){tq, 1, D});
        lk_tensor ttk = lk_tensor_make(k, LK_F32, 3, (int64_t[]){K, 1, D});
        lk_tensor ttv = lk_tensor_make(v, LK_F32, 3, (int64_t[]){K, 1, D});
        lk_tensor tto = lk_tensor_make(out, LK_F32, 3, (int64_t[]){tq, 1, D});
        lk_tensor ttl = lk_tensor_make(lse, LK_F32, 2, (int64_t[]){tq, 1});
        lk_tensor tcq = lk_tensor_make(cq, LK_I32, 1, (int64_t[]){2});
        lk_tensor tck = lk_tensor_make(ck, LK_I32, 1, (int64_t[]){2});
        lk_attn_params p = lk_attn_params_default(0.25f);
        for (int ii = 0; ii < ni; ii++) {
            lk_set_isa(isas[ii]);
            lk_status st = lk_flash_attn_varlen(&tto, &ttl, &ttq, &ttk, &ttv, &tcq, &tck, NULL, NULL, &p);
            int ok = st == LK_OK;
            for (int t = 0; t < tq; t++) {
                ok &= lse[t][0] == -INFINITY;
                for (int d = 0; d < D; d++) ok &= out[t][0][d] == 0.0f;
            }
            tu_check(ok, "regress %s %s: all visible scores -inf give out 0, lse -inf (out %g)",
                     lk_isa_name(isas[ii]), prefill ? "prefill" : "decode", (double)out[0][0][0]);
        }
    }
    lk_set_isa(lk_isa_best());
}

/* fuzz regression (fuzz_attention): K/V with a negative token stride in the prefill
 * path. The AVX2 tile loaders marked rows past the last key with offset -1 and loaded
 * zeros for every negative offset, so keys stored below the view's data pointer were
 * read as zeros (silently wrong scores / values). Every ISA: the reversed layout gives
 * the bits of the ordinary one. */
static void test_regress_negative_key_offsets(void) {
    enum { T = 8, K = 20, D = 16 };
    float k[K][1][D], v[K][1][D], kr[K][1][D], vr[K][1][D], q[T][1][D], o1[T][1][D], o2[T][1][D], l1[T][1], l2[T][1];
    for (int j = 0; j < K; j++)
        for (int d = 0; d < D; d++) {
            k[j][0][d] = kr[K - 1 - j][0][d] = 0.05f * (float)((3 * j + d) % 11) - 0.2f;
            v[j][0][d] = vr[K - 1 - j][0][d] = 0.1f * (float)((j + 2 * d) % 7) - 0.3f;
        }
    for (int t = 0; t < T; t++)
        for (int d = 0; d < D; d++) q[t][0][d] = 0.07f * (float)((t * 5 + d) % 9) - 0.25f;
    int32_t cq[2] = {0, T}, ck[2] = {0, K};
    lk_tensor tq = lk_tensor_make(q, LK_F32, 3, (int64_t[]){T, 1, D});
    lk_tensor tk = lk_tensor_make(k, LK_F32, 3, (int64_t[]){K, 1, D}), tv = lk_tensor_make(v, LK_F32, 3, (int64_t[]){K, 1, D});
    lk_tensor rk = lk_tensor_make(&kr[K - 1], LK_F32, 3, (int64_t[]){K, 1, D}), rv = lk_tensor_make(&vr[K - 1], LK_F32, 3, (int64_t[]){K, 1, D});
    rk.stride[0] = rv.stride[0] = -D;
    lk_tensor to1 = lk_tensor_make(o1, LK_F32, 3, (int64_t[]){T, 1, D}), to2 = lk_tensor_make(o2, LK_F32, 3, (int64_t[]){T, 1, D});
    lk_tensor tl1 = lk_tensor_make(l1, LK_F32, 2, (int64_t[]){T, 1}), tl2 = lk_tensor_make(l2, LK_F32, 2, (int64_t[]){T, 1});
    lk_tensor tcq = lk_tensor_make(cq, LK_I32, 1, (int64_t[]){2}), tck = lk_tensor_make(ck, LK_I32, 1, (int64_t[]){2});
    lk_attn_params p = lk_attn_params_default(0.5f);
    p.causal = 1;
    lk_isa isas[TU_MAX_ISAS];
    int ni = tu_isas(isas);
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        lk_status s1 = lk_flash_attn_varlen(&to1, &tl1, &tq, &tk, &tv, &tcq, &tck, NULL, NULL, &p);
        lk_status s2 = lk_flash_attn_varlen(&to2, &tl2, &tq, &rk, &rv, &tcq, &tck, NULL, NULL, &p);
        tu_check(s1 == LK_OK && s2 == LK_OK && !memcmp(o1, o2, sizeof o1) && !memcmp(l1, l2, sizeof l1),
                 "regress %s: prefill with K/V at negative offsets (token stride -D) equals the ordinary layout",
                 lk_isa_name(isas[ii]));
    }
    lk_set_isa(lk_isa_best());
}

/* fuzz regression (fuzz_attention / fuzz_mla_prefill): an empty paged cache of block
 * size 0 ([0, 0, Hk, D] ND or [0, C/16, 0, 16] NZ) is a valid view; the page count of
 * each request, ceil(seqused_k / block_size), divided by zero (SIGFPE). The validation
 * now takes such a cache's block size as 1 once k's and v's pages are compared. Every
 * ISA: key lengths 0 give out = 0 and lse = -inf; a key length of 1 is LK_ERR_INDEX (no
 * page exists) with out untouched; k and v of block sizes 0 and 1 still differ. */
static void test_regress_empty_cache_block_size_0(void) {
    enum { T = 3, D = 16 };
    float q[T][1][D], out[T][1][D], lse[T][1], kv[D];
    for (int t = 0; t < T; t++)
        for (int d = 0; d < D; d++) q[t][0][d] = 0.1f * (float)(d % 5);
    for (int d = 0; d < D; d++) kv[d] = 1.0f;
    int32_t cq[3] = {0, 1, T}, used[2] = {0, 0}, bt[2][1] = {{-1}, {-1}};
    lk_tensor tq = lk_tensor_make(q, LK_F32, 3, (int64_t[]){T, 1, D}), to = lk_tensor_make(out, LK_F32, 3, (int64_t[]){T, 1, D});
    lk_tensor tl = lk_tensor_make(lse, LK_F32, 2, (int64_t[]){T, 1}), tcq = lk_tensor_make(cq, LK_I32, 1, (int64_t[]){3});
    lk_tensor tu = lk_tensor_make(used, LK_I32, 1, (int64_t[]){2}), tb = lk_tensor_make(bt, LK_I32, 2, (int64_t[]){2, 1});
    lk_isa isas[TU_MAX_ISAS];
    int ni = tu_isas(isas);
    for (int nz = 0; nz <= 1; nz++) {
        lk_tensor tk = nz ? lk_tensor_make(kv, LK_F32, 4, (int64_t[]){0, 1, 0, 16}) : lk_tensor_make(kv, LK_F32, 4, (int64_t[]){0, 0, 1, D});
        lk_attn_params p = lk_attn_params_default(0.25f);
        p.kv_layout = nz ? LK_KV_NZ : LK_KV_ND;
        for (int ii = 0; ii < ni; ii++) {
            lk_set_isa(isas[ii]);
            used[1] = 0;
            for (int i = 0; i < T * D; i++) (&out[0][0][0])[i] = 7.0f;
            lk_status st = lk_flash_attn_varlen(&to, &tl, &tq, &tk, &tk, &tcq, NULL, &tu, &tb, &p);
            int ok = st == LK_OK;
            for (int t = 0; t < T; t++) {
                ok &= lse[t][0] == -INFINITY;
                for (int d = 0; d < D; d++) ok &= out[t][0][d] == 0.0f;
            }
            used[1] = 1;
            for (int i = 0; i < T * D; i++) (&out[0][0][0])[i] = 7.0f;
            lk_status s2 = lk_flash_attn_varlen(&to, &tl, &tq, &tk, &tk, &tcq, NULL, &tu, &tb, &p);
            for (int i = 0; i < T * D; i++) ok &= (&out[0][0][0])[i] == 7.0f;
            tu_check(ok && s2 == LK_ERR_INDEX, "regress %s %s: empty cache with block_size 0: no keys -> 0 / -inf (%s), a key -> %s",
                     lk_isa_name(isas[ii]), nz ? "NZ" : "ND", lk_status_str(st), lk_status_str(s2));
        }
    }
    /* the block sizes of k and v must still match: [0, 0, 1, D] vs [0, 1, 1, D] */
    lk_tensor k0 = lk_tensor_make(kv, LK_F32, 4, (int64_t[]){0, 0, 1, D}), v1 = lk_tensor_make(kv, LK_F32, 4, (int64_t[]){0, 1, 1, D});
    lk_attn_params p = lk_attn_params_default(0.25f);
    used[1] = 0;
    lk_status s3 = lk_flash_attn_varlen(&to, &tl, &tq, &k0, &v1, &tcq, NULL, &tu, &tb, &p);
    tu_check(s3 == LK_ERR_SHAPE, "regress: empty k and v caches with block sizes 0 and 1 -> LK_ERR_SHAPE (%s)",
             lk_status_str(s3));
    lk_set_isa(lk_isa_best());
}

/* ALiBi slopes of a wrong shape, dtype, rank or value: named, nothing written */
static void test_alibi_bad(void) {
    acase c = base_case();
    c.B = 2, c.ql[0] = 3, c.ql[1] = 2, c.kl[0] = 5, c.kl[1] = 4, c.Hq = 4, c.Hk = 2, c.alibi = 2;
    abufs z;
    build(&c, &z);
    tu_buf bad[5] = {tu_alloc(LK_F32, 1, (int64_t[]){5}, 0), tu_alloc(LK_F32, 2, (int64_t[]){3, 4}, 0),
                     tu_alloc(LK_F16, 1, (int64_t[]){4}, 0), tu_alloc(LK_F32, 3, (int64_t[]){2, 4, 1}, 0),
                     tu_alloc(LK_F32, 1, (int64_t[]){4}, 0)};
    lk_status want[5] = {LK_ERR_SHAPE, LK_ERR_SHAPE, LK_ERR_DTYPE, LK_ERR_RANK, LK_ERR_VALUE};
    for (int i = 0; i < 5; i++) tu_fill_uniform(&bad[i], 0.1, 1);
    tu_set(&bad[4], 2, NAN);
    for (int i = 0; i < 5; i++) {
        lk_attn_params p = params_of(&c);
        p.alibi_slopes = &bad[i].t;
        tu_snapshot(&z.out), tu_snapshot(&z.lse);
        lk_status st = lk_flash_attn_varlen(&z.out.t, &z.lse.t, &z.q.t, &z.k.t, &z.v.t, &z.cuq.t, &z.cuk.t, NULL, NULL, &p);
        tu_check(st == want[i] && strstr(lk_last_error(), "alibi_slopes") && tu_intact(&z.out) && tu_intact(&z.lse),
                 "alibi bad case %d -> %s (%s)", i, lk_status_str(st), lk_last_error());
        tu_free(&bad[i]);
    }
    free_bufs(&z);
}

/* fp8 outs (lk_flash_attn_varlen_scaled), e4m3 and e5m2, output scales from 0.002 to 1
 * (values over many binades, subnormal codes at 1), every ISA through run_case_f8: decode
 * (1-4 queries, paged, GQA 4 heads per KV head: decode_row_g4f on AVX2 and AVX-512; MHA over NZ) and
 * prefill (dense and paged), bf16 / f32 / fp8 q and K / V with descales, strided out
 * with garbage padding, empty requests and rows that see no key (code 0), padding tokens,
 * output_scale as [] and [1], and a head dim the SIMD kernels hand to the reference */
static void test_fp8_out(void) {
    const lk_dtype ots[2] = {LK_F8E4M3, LK_F8E5M2};
    const float oscs[4] = {0.01f, 0.37f, 1.0f, 0.002f};
    int n = 0;
    for (int o = 0; o < 2; o++)
        for (int shape = 0; shape < 8; shape++) {
            acase c = base_case();
            c.ot = ots[o], c.osc = oscs[n % 4], c.osc_0d = n % 3 == 1, c.causal = 1;
            n++;
            if (shape == 0) { /* decode paged GQA 4, 1-4 queries, several chunks */
                c.B = 3, c.ql[0] = 1, c.ql[1] = 4, c.ql[2] = 2, c.kl[0] = 700, c.kl[1] = 9, c.kl[2] = 37;
                c.Hq = 8, c.Hk = 2, c.Dqk = c.Dv = 128, c.paged = 1, c.name = "decode paged gqa4";
            } else if (shape == 1) { /* decode GQA 4, e4m3 K / e5m2 V, descales, ND pages of 7 */
                c.B = 2, c.ql[0] = 3, c.ql[1] = 1, c.kl[0] = 530, c.kl[1] = 41, c.Hq = 8, c.Hk = 2, c.Dqk = 64;
                c.Dv = 32, c.paged = 1, c.bs = 7, c.kt = LK_F8E4M3, c.mixv = 1, c.vt = LK_F8E5M2, c.desc = 4;
                c.name = "decode gqa4 fp8 K/V";
            } else if (shape == 2) { /* decode MHA over NZ, fp8 q and K/V */
                c.B = 2, c.ql[0] = 1, c.ql[1] = 2, c.kl[0] = 65, c.kl[1] = 130, c.Hq = c.Hk = 3, c.Dqk = 64;
                c.Dv = 96, c.paged = 1, c.layout = LK_KV_NZ, c.qt = LK_F8E4M3, c.kt = LK_F8E4M3, c.desc = 3;
                c.name = "decode MHA NZ fp8";
            } else if (shape == 3) { /* prefill dense GQA 2, f32 */
                c.ql[0] = 40, c.kl[0] = 90, c.Hq = 4, c.Hk = 2, c.qt = c.kt = LK_F32, c.name = "prefill dense";
            } else if (shape == 4) { /* prefill paged, e5m2 K/V with per-head descales */
                c.B = 2, c.ql[0] = 19, c.ql[1] = 40, c.kl[0] = 150, c.kl[1] = 41, c.Hq = 8, c.Hk = 2;
                c.Dqk = c.Dv = 128, c.paged = 1, c.kt = LK_F8E5M2, c.desc = 3, c.name = "prefill paged e5m2 K/V";
            } else if (shape == 5) { /* mixed batch: empty requests, no-key rows, padding, strided */
                c.B = 5;
                int64_t ql[5] = {3, 0, 17, 1, 0}, kl[5] = {3, 9, 0, 30, 0};
                memcpy(c.ql, ql, sizeof ql), memcpy(c.kl, kl, sizeof kl);
                c.pad_tokens = 2, c.pad = 1, c.lse_t = 1, c.Hq = 4, c.Hk = 2, c.paged = o, c.name = "mixed batch strided";
            } else if (shape == 6) { /* decode with an empty request, padding tokens, strided, window */
                c.B = 3, c.ql[0] = 1, c.ql[1] = 3, c.ql[2] = 2, c.kl[0] = 0, c.kl[1] = 530, c.kl[2] = 2, c.wl = 100;
                c.Hq = 8, c.Hk = 2, c.Dqk = c.Dv = 64, c.paged = 1, c.kt = LK_F8E4M3, c.desc = 2, c.pad = 1;
                c.pad_tokens = 1, c.name = "decode empty request strided";
            } else { /* head dim 20: the reference path on every ISA; q > k causal: masked rows */
                c.ql[0] = 20, c.kl[0] = 5, c.Dqk = c.Dv = 20, c.name = "head dim 20, q > k causal";
            }
            free(run_case(&c));
        }
    /* page sizes: NZ and HND give the bits of ND with an fp8 out too */
    for (int decode = 0; decode <= 1; decode++) {
        acase c = base_case();
        c.B = 2, c.ql[0] = decode ? 1 : 19, c.ql[1] = decode ? 2 : 40, c.kl[0] = 150, c.kl[1] = 41, c.causal = 1;
        c.paged = 1, c.bs = 16, c.Hq = 8, c.Hk = 2, c.Dqk = c.Dv = 128, c.ot = LK_F8E4M3, c.osc = 0.05f;
        tu_seed(3000 + decode);
        c.name = "fp8 out paged ND";
        double *nd = run_case(&c);
        tu_seed(3000 + decode);
        c.layout = LK_KV_NZ, c.name = "fp8 out paged NZ";
        double *nz = run_case(&c);
        int64_t nv = (c.ql[0] + c.ql[1]) * c.Hq * c.Dv;
        tu_check(memcmp(nd, nz, sizeof(double) * (size_t)nv) == 0, "attn fp8 out %s: NZ bit-identical to ND",
                 decode ? "decode" : "prefill");
        free(nd), free(nz);
    }
}

/* fp8 out special values, every ISA, decode (GQA 4 x 128: g4f on AVX2, AVX-512 and, the
 * out being fp8, avx512bf16) and prefill (8 causal queries over 40 keys), e4m3 and e5m2 outs:
 *  - a tiny output_scale (1e-30): every value beyond the max saturates to +-max
 *  - an e4m3 NaN code in V (key 21, KV head 1, dim 37): that dim's code is NaN for the
 *    rows of KV head 1 that see key 21, every other code matches ref within one code
 *  - an e5m2 inf code in V (same place): that dim saturates to +max where it is seen */
static void test_fp8_out_special(void) {
    enum { HQ = 8, HK = 2, D = 128, K = 40, T = 8 };
    static uint8_t k8[K][HK][D], v8[K][HK][D], out[T][HQ][D], ref[T][HQ][D];
    static uint16_t q[T][HQ][D];
    tu_seed(99);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < HQ; h++)
            for (int d = 0; d < D; d++) q[t][h][d] = lk_f32_to_bf16((float)tu_uniform(-1, 1));
    lk_isa isas[TU_MAX_ISAS];
    int ni = tu_isas(isas);
    for (int vf = 0; vf < 2; vf++) /* V e4m3 / e5m2 */
        for (int of = 0; of < 2; of++) /* out e4m3 / e5m2 */
            for (int prefill = 0; prefill <= 1; prefill++) {
                lk_dtype vt = vf ? LK_F8E5M2 : LK_F8E4M3, ot = of ? LK_F8E5M2 : LK_F8E4M3;
                for (int j = 0; j < K; j++)
                    for (int h = 0; h < HK; h++)
                        for (int d = 0; d < D; d++)
                            k8[j][h][d] = (uint8_t)(0x30 + tu_rand() % 12), v8[j][h][d] = (uint8_t)(tu_rand() % 0x70) |
                                                                                   (uint8_t)(tu_rand() % 2 ? 0x80 : 0);
                int tq = prefill ? T : 1;
                int32_t cq[2] = {0, tq}, ck[2] = {0, K};
                lk_tensor tk = lk_tensor_make(k8, LK_F8E4M3, 3, (int64_t[]){K, HK, D});
                lk_tensor tv = lk_tensor_make(v8, vt, 3, (int64_t[]){K, HK, D});
                lk_tensor ttq = lk_tensor_make(q, LK_BF16, 3, (int64_t[]){tq, HQ, D});
                lk_tensor to = lk_tensor_make(out, ot, 3, (int64_t[]){tq, HQ, D});
                lk_tensor tr = lk_tensor_make(ref, ot, 3, (int64_t[]){tq, HQ, D});
                lk_tensor tcq = lk_tensor_make(cq, LK_I32, 1, (int64_t[]){2}), tck = lk_tensor_make(ck, LK_I32, 1, (int64_t[]){2});
                lk_attn_params p = lk_attn_params_default(0.08f);
                p.causal = 1;
                float tiny = 1e-30f, osc = 0.01f;
                lk_tensor tt = lk_tensor_make(&tiny, LK_F32, 1, (int64_t[]){1}), ts = lk_tensor_make(&osc, LK_F32, 1, (int64_t[]){1});
                uint8_t mx = f8_maxcode(ot);
                /* saturation */
                for (int ii = 0; ii < ni; ii++) {
                    lk_set_isa(isas[ii]);
                    lk_status st = lk_flash_attn_varlen_scaled(&to, NULL, &ttq, &tk, &tv, &tcq, &tck, NULL, NULL, &p, &tt);
                    int bad = 0;
                    static float ov[T][HQ][D];
                    lk_tensor tf = lk_tensor_make(ov, LK_F32, 3, (int64_t[]){tq, HQ, D});
                    lk_flash_attn_varlen(&tf, NULL, &ttq, &tk, &tv, &tcq, &tck, NULL, NULL, &p);
                    for (int t = 0; t < tq; t++)
                        for (int h = 0; h < HQ; h++)
                            for (int d = 0; d < D; d++) {
                                float v = ov[t][h][d];
                                uint8_t want = v == 0.0f ? (signbit(v) ? 0x80 : 0x00) : (uint8_t)((v < 0 ? 0x80 : 0) | mx);
                                bad += st != LK_OK || out[t][h][d] != want;
                            }
                    tu_check(bad == 0, "attn fp8 out %s %s V, %s out, %s: output_scale 1e-30 saturates every value to "
                             "+-max (%d wrong)", lk_isa_name(isas[ii]), lk_dtype_name(vt), lk_dtype_name(ot),
                             prefill ? "prefill" : "decode", bad);
                }
                /* NaN (e4m3 V) / inf (e5m2 V) at key 21, KV head 1, dim 37 */
                v8[21][1][37] = vf ? 0x7c : 0x7f;
                lk_set_isa(LK_ISA_REF);
                lk_status s0 = lk_flash_attn_varlen_scaled(&tr, NULL, &ttq, &tk, &tv, &tcq, &tck, NULL, NULL, &p, &ts);
                for (int ii = 0; ii < ni; ii++) {
                    lk_set_isa(isas[ii]);
                    memset(out, 0x55, sizeof out);
                    lk_status st = lk_flash_attn_varlen_scaled(&to, NULL, &ttq, &tk, &tv, &tcq, &tck, NULL, NULL, &p, &ts);
                    int ok = s0 == LK_OK && st == LK_OK;
                    for (int t = 0; t < tq; t++)
                        for (int h = 0; h < HQ; h++)
                            for (int d = 0; d < D; d++) {
                                /* query t sees keys j <= t + K - tq */
                                int hit = h >= HQ / HK && d == 37 && 21 <= t + K - tq;
                                uint8_t g = out[t][h][d], r = ref[t][h][d];
                                if (hit) ok &= vf ? g == mx && r == mx : f8_nan(ot, g) && f8_nan(ot, r);
                                else ok &= !f8_nan(ot, g) && f8_close(ot, g, f8_dec(ot, r), f8_slack(f8_dec(ot, r) * 0.01, 0.01));
                            }
                    tu_check(ok, "attn fp8 out %s %s, %s out: an %s V code reaches its dim of the rows that see it as %s "
                             "only", lk_isa_name(isas[ii]), prefill ? "prefill" : "decode", lk_dtype_name(ot),
                             vf ? "inf" : "NaN", vf ? "+max (saturated)" : "a NaN code");
                }
            }
    lk_set_isa(lk_isa_best());
}

/* bad output_scale / out combinations: named, status as the contract says, every buffer
 * (out, lse, K, the block table, the scale) bit-identical */
static void test_fp8_out_bad(void) {
    acase c = base_case();
    c.B = 2, c.ql[0] = 1, c.ql[1] = 3, c.kl[0] = 20, c.kl[1] = 5, c.Hq = 4, c.Hk = 2, c.paged = 1, c.bs = 4;
    c.ot = LK_F8E4M3, c.osc = 0.1f, c.pad = 1;
    abufs z;
    build(&c, &z);
    lk_attn_params p = params_of(&c);
    tu_buf fo = tu_alloc(LK_BF16, 3, (int64_t[]){z.Tq, c.Hq, c.Dv}, 1);
    tu_buf sc[10] = {tu_alloc(LK_F32, 1, (int64_t[]){1}, 0), tu_alloc(LK_F32, 1, (int64_t[]){1}, 0),
                     tu_alloc(LK_F32, 1, (int64_t[]){1}, 0), tu_alloc(LK_F32, 1, (int64_t[]){1}, 0),
                     tu_alloc(LK_F32, 1, (int64_t[]){2}, 0), tu_alloc(LK_F32, 2, (int64_t[]){1, 1}, 0),
                     tu_alloc(LK_F32, 3, (int64_t[]){1, 1, 1}, 0), tu_alloc(LK_F16, 1, (int64_t[]){1}, 0),
                     tu_alloc(LK_F8E4M3, 1, (int64_t[]){1}, 0), tu_alloc(LK_I32, 1, (int64_t[]){1}, 0)};
    const double vals[10] = {0.0, -1.0, NAN, INFINITY, 0.5, 0.5, 0.5, 0.5, 0.5, 1.0};
    const lk_status want[10] = {LK_ERR_VALUE, LK_ERR_VALUE, LK_ERR_VALUE, LK_ERR_VALUE, LK_ERR_SHAPE,
                                LK_ERR_SHAPE, LK_ERR_RANK,  LK_ERR_DTYPE, LK_ERR_DTYPE, LK_ERR_DTYPE};
    for (int i = 0; i < 10; i++)
        for (int64_t e = 0; e < tu_numel(&sc[i]); e++) tu_set(&sc[i], e, vals[i]);
    tu_buf good = tu_alloc(LK_F32, 1, (int64_t[]){1}, 0);
    tu_set(&good, 0, 0.1);
#define SNAP() tu_snapshot(&z.out), tu_snapshot(&z.lse), tu_snapshot(&z.k), tu_snapshot(&z.table), tu_snapshot(&fo)
#define INTACT() (tu_intact(&z.out) && tu_intact(&z.lse) && tu_intact(&z.k) && tu_intact(&z.table) && tu_intact(&fo))
#define SCALED(OUT, OS) \
    lk_flash_attn_varlen_scaled(OUT, &z.lse.t, &z.q.t, &z.k.t, &z.v.t, &z.cuq.t, NULL, &z.used.t, &z.table.t, &p, OS)
    for (int i = 0; i < 10; i++) {
        SNAP();
        tu_snapshot(&sc[i]);
        lk_status st = SCALED(&z.out.t, &sc[i].t);
        tu_check(st == want[i] && strstr(lk_last_error(), "lk_flash_attn_varlen_scaled: output_scale") && INTACT() &&
                 tu_intact(&sc[i]), "attn fp8 out: bad output_scale case %d -> %s (%s)", i, lk_status_str(st),
                 lk_last_error());
    }
#define EXPECT(W, A, S, CALL)                                                                               \
    do {                                                                                                    \
        SNAP();                                                                                             \
        lk_status st_ = CALL;                                                                               \
        tu_check(st_ == (S) && strstr(lk_last_error(), A) && INTACT(), "attn fp8 out: %s -> %s (%s)", W,     \
                 lk_status_str(st_), lk_last_error());                                                      \
    } while (0)
    EXPECT("fp8 out without output_scale", "lk_flash_attn_varlen_scaled: output_scale", LK_ERR_NULL,
           SCALED(&z.out.t, NULL));
    EXPECT("bf16 out with output_scale", "lk_flash_attn_varlen_scaled: out", LK_ERR_DTYPE, SCALED(&fo.t, &good.t));
    EXPECT("fp8 out through lk_flash_attn_varlen", "lk_flash_attn_varlen: out", LK_ERR_DTYPE,
           lk_flash_attn_varlen(&z.out.t, &z.lse.t, &z.q.t, &z.k.t, &z.v.t, &z.cuq.t, NULL, &z.used.t, &z.table.t, &p));
    /* output_scale inside lse and inside out (a valid value there) */
    float *l0 = (float *)z.lse.t.data;
    l0[0] = 0.5f;
    memcpy(z.out.t.data, &(float){0.5f}, sizeof(float));
    lk_tensor in_lse = lk_tensor_make(l0, LK_F32, 1, (int64_t[]){1});
    lk_tensor in_out = lk_tensor_make(z.out.t.data, LK_F32, 1, (int64_t[]){1});
    EXPECT("output_scale inside lse", "output_scale", LK_ERR_ALIAS, SCALED(&z.out.t, &in_lse));
    EXPECT("output_scale inside out", "output_scale", LK_ERR_ALIAS, SCALED(&z.out.t, &in_out));
#undef EXPECT
    /* empty work still validates output_scale */
    lk_tensor o0 = z.out.t, l0t = z.lse.t, q0 = z.q.t;
    int32_t *cu = (int32_t *)z.cuq.t.data;
    o0.shape[0] = l0t.shape[0] = q0.shape[0] = 0;
    int32_t keep[3] = {cu[0], cu[1], cu[2]};
    cu[0] = cu[1] = cu[2] = 0;
    lk_status st0 = lk_flash_attn_varlen_scaled(&o0, &l0t, &q0, &z.k.t, &z.v.t, &z.cuq.t, NULL, &z.used.t, &z.table.t,
                                                &p, &sc[2].t);
    lk_status st1 = lk_flash_attn_varlen_scaled(&o0, &l0t, &q0, &z.k.t, &z.v.t, &z.cuq.t, NULL, &z.used.t, &z.table.t,
                                                &p, &good.t);
    cu[0] = keep[0], cu[1] = keep[1], cu[2] = keep[2];
    tu_check(st0 == LK_ERR_VALUE && st1 == LK_OK, "attn fp8 out: 0 tokens validates output_scale (NaN -> %s), a good "
             "one -> %s", lk_status_str(st0), lk_status_str(st1));
#undef SCALED
#undef INTACT
#undef SNAP
    for (int i = 0; i < 10; i++) tu_free(&sc[i]);
    tu_free(&good), tu_free(&fo);
    free_bufs(&z);
}

/* the tests of the paths the bf16 rows choose by lk_cpu_prefer_fma (run once more with the
 * other choice by tu_other_fma_form) */
static void other_fma_form(void) {
    test_grid();
    test_paged();
    test_decode_g4();
    test_decode_g4f();
    test_gqa_decode_nan_key();
    test_fp8_grid();
    test_fp8_paged();
    test_fp8_codes();
}

int main(void) {
    tu_init();
    other_fma_form(); /* with the CPU's lk_cpu_prefer_fma answer here, the other at the end */
    test_fp8_bad_descales();
    test_fp8_out();
    test_fp8_out_special();
    test_fp8_out_bad();
    test_threads();
    test_bad_inputs();
    test_alibi_bad();
    test_regress_masked_inf_value();
    test_regress_visible_inf_value();
    test_regress_nz_unit_dim_strides();
    test_regress_all_neg_inf_scores();
    test_gqa_decode_inf_value();
    test_regress_negative_key_offsets();
    test_regress_empty_cache_block_size_0();
    tu_other_fma_form(other_fma_form);
    return tu_finish("test_attention");
}
