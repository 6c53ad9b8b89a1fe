/*
 * Fuzz harness: lk_flash_attn_varlen (see fuzz_common.h for the checks). Input: batch
 * (0..3 requests), per-request query and key lengths, padding rows, GQA groups, head
 * dims (0 too), dense K/V or paged ND / NZ caches (block size, pages, block table with
 * unused tail entries), lse present or NULL, params (scale, causal, windows, softcap,
 * layout; out-of-domain values too), index tensors i32/i64 with injected bad values
 * (validated here from the stored values: cu_seqlens negative / decreasing / beyond the
 * rows, seqused_k beyond the block table, block_table entries of read pages outside
 * [0, num_blocks)), empty caches (0 pages, block size 0 too), API misuse (cu_seqlens_k with a block table, seqused_k without),
 * out aliasing q, NULL params, ALiBi slopes [Hq] / [B, Hq] (wrong shapes and non-finite
 * values too), fp8 q / k / v (e4m3 / e5m2, NZ caches in 32-wide tiles) with q/k/v_descale
 * of every form ([1], [Hk], [B, Hk]; wrong shapes, dtypes and values too), and
 * lk_flash_attn_varlen_scaled (an fp8 out with output_scale [1] / []; wrong shapes, dtypes
 * and values, an fp8 out without a scale, a float out with one). out is compared with the
 * ref within the test suite's vs-ref tolerance (an fp8 out: one fp8 step relative, plus
 * the f32 tolerance divided by output_scale), lse within 1e-4 (with descales: widened by
 * the f32 error bound of the descaled scores, see below).
 */
#include "fuzz_common.h"

typedef struct {
    int out, lse, q, k, v, cuq, cuk, used, table, null_params, alibi, desc[3];
    int scaled, osc; /* lk_flash_attn_varlen_scaled; its output_scale view (-1: NULL) */
    lk_attn_params p;
} attn_attrs;


/* a dtype for q, k or v: f32 / f16 / bf16, or fp8 (e4m3 / e5m2) a third of the time */
static lk_dtype qkv_type(fz_in *in) {
    if (fz_u8(in) % 3 == 0) return fz_u8(in) & 1 ? LK_F8E5M2 : LK_F8E4M3;
    return fz_ftype(in);
}

/* fz_fill for an fp8 view (fz_fill fills f32 / f16 / bf16 ones): values in [lo, hi) as
 * fp8 codes, specials at the world's rate */
static void fill_f8(fz_world *w, int vi, double lo, double hi) {
    fz_view *v = &w->v[vi];
    if (!fz_usable(w, vi) || !fz_is_fp8(v->t.dtype)) return;
    for (int64_t i = 0, n = fz_numel(&v->t); i < n; i++) {
        float x = fz_unif(&w->rng) < w->special_rate ? fz_special(&w->rng) : (float)(lo + (hi - lo) * fz_unif(&w->rng));
        lk_store_f(v->t.data, v->t.dtype, fz_off(&v->t, i), x);
    }
}

/* fz_view_new for q / k / v, which take fp8: the wrong-kind dtype draw of fz_view_new may
 * pick an fp8 dtype (or the other fp8 dtype), which is of the right kind here (the
 * expectation it set is undone), except where it turns a 16-bit NZ cache (nz) into an fp8
 * one, whose physical shape then reads as 32-wide tiles */
static int qkv_view(fz_world *w, fz_in *in, const char *name, lk_dtype dt, int nd, const int64_t *shape, int nz) {
    int mf = w->must_fail, cl = w->clean;
    const char *why = w->why_fail;
    int vi = fz_view_new(w, in, name, dt, nd, shape, FZ_IN);
    fz_view *v = &w->v[vi];
    if (v->bad && fz_is_fp8(v->t.dtype) && (!nz || fz_is_fp8(dt)) && !fz_view_invalid(&v->t) && v->t.data)
        w->must_fail = mf, w->why_fail = why, w->clean = cl, v->bad = 0;
    return vi;
}

static lk_status call(const fz_world *w, const void *ap) {
    const attn_attrs *a = ap;
    lk_attn_params p = a->p;
    p.alibi_slopes = a->alibi < 0 ? NULL : fz_t(w, a->alibi);
    p.q_descale = a->desc[0] < 0 ? NULL : fz_t(w, a->desc[0]);
    p.k_descale = a->desc[1] < 0 ? NULL : fz_t(w, a->desc[1]);
    p.v_descale = a->desc[2] < 0 ? NULL : fz_t(w, a->desc[2]);
    if (a->scaled)
        return lk_flash_attn_varlen_scaled(fz_t(w, a->out), fz_t(w, a->lse), fz_t(w, a->q), fz_t(w, a->k),
                                           fz_t(w, a->v), fz_t(w, a->cuq), fz_t(w, a->cuk), fz_t(w, a->used),
                                           fz_t(w, a->table), a->null_params ? NULL : &p, fz_t(w, a->osc));
    return lk_flash_attn_varlen(fz_t(w, a->out), fz_t(w, a->lse), fz_t(w, a->q), fz_t(w, a->k),
                                fz_t(w, a->v), fz_t(w, a->cuq), fz_t(w, a->cuk), fz_t(w, a->used),
                                fz_t(w, a->table), a->null_params ? NULL : &p);
}

/* cu_seqlens rules from the stored values: >= 0, non-decreasing, last <= rows */
static void check_cu(fz_world *w, int vi, int64_t n1, int64_t rows) {
    if (!fz_usable(w, vi)) return;
    for (int64_t i = 0; i < n1; i++) {
        int64_t c = fz_idx_get(w, vi, i);
        if (c < 0 || (i && c < fz_idx_get(w, vi, i - 1)) || c > rows)
            fz_fail_expected(w, "bad cu_seqlens entry");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_in in = {data, size, 0};
    fz_world w;
    fz_init(&w, &in, "lk_flash_attn_varlen");
    attn_attrs a;
    memset(&a, 0, sizeof a);
    a.cuk = a.used = a.table = a.lse = a.alibi = a.desc[0] = a.desc[1] = a.desc[2] = a.osc = -1;
    int64_t B = fz_range(&in, 0, 3), ql[3], kl[3], Tq = 0, Tk = 0;
    for (int64_t b = 0; b < B; b++) {
        ql[b] = fz_range(&in, 0, 4), kl[b] = fz_range(&in, 0, 12);
        Tq += ql[b], Tk += kl[b];
    }
    Tq += fz_range(&in, 0, 2); /* padding rows: out 0, lse -inf */
    int paged = (int)(fz_u8(&in) % 3);    /* 0 dense, 1 paged ND, 2 paged NZ */
    int64_t Hk = 1 + (int64_t)(fz_u8(&in) % 2), G = 1 + (int64_t)(fz_u8(&in) % 3), Hq = Hk * G;
    int64_t Dqk, Dv;
    lk_dtype qt = qkv_type(&in), kt = qkv_type(&in), vt = qkv_type(&in), ot = fz_ftype(&in);
    int64_t tk = fz_is_fp8(kt) ? 32 : 16, tv = fz_is_fp8(vt) ? 32 : 16; /* NZ tiles: 32 wide for fp8 */
    if (paged == 2) {
        Dqk = (tk / Hk) * (1 + (int64_t)(fz_u8(&in) % 2));
        Dv = (tv / Hk) * (1 + (int64_t)(fz_u8(&in) % 2));
    } else {
        Dqk = fz_dim(&in, 24), Dv = fz_dim(&in, 24);
        if (Dqk == 0 || Dv == 0) fz_fail_expected(&w, "head dim 0");
    }
    if (fz_chance(&in, 6)) {
        Hq += 1;
        if (Hq % Hk) fz_fail_expected(&w, "query heads not a multiple of KV heads");
    }
    int64_t qs[3] = {Tq, Hq, Dqk}, os[3] = {Tq, Hq, Dv}, ls[2] = {Tq, Hq};
    a.q = qkv_view(&w, &in, "q", qt, 3, qs, 0);
    int out_is_q = 0, out_f8_draw = 0;
    if (fz_u8(&in) % 8 == 0 && Dv == Dqk && !fz_is_fp8(qt)) { /* out is q */
        a.out = fz_view_alias(&w, a.q, "out", FZ_OUT);
        w.v[a.out].inplace_of = -1;
        out_is_q = 1;
    } else {
        /* the rare wrong-kind dtype draw may make out fp8: wrong for lk_flash_attn_varlen,
         * right for the scaled call with a scale (decided at the end: the expectation is
         * set there) */
        int mf = w.must_fail, cl = w.clean;
        const char *why = w.why_fail;
        a.out = fz_view_new(&w, &in, "out", ot, 3, os, FZ_OUT);
        fz_view *o = &w.v[a.out];
        if (o->bad && fz_is_fp8(o->t.dtype) && !fz_view_invalid(&o->t) && o->t.data)
            w.must_fail = mf, w.why_fail = why, w.clean = cl, o->bad = 0, out_f8_draw = 1;
    }
    fz_tol(&w, a.out, 3e-5);
    /* a visible key with an infinite V value: the ref (double) gives +-inf where its
     * weight is tiny, the f32 kernels NaN where the weight underflows to 0 */
    w.v[a.out].nonfinite_any = 1;
    if (fz_u8(&in) % 3) {
        lk_dtype lt = LK_F32;
        if (fz_chance(&in, 4)) lt = LK_BF16, fz_fail_expected(&w, "lse not f32");
        a.lse = fz_view_new(&w, &in, "lse", lt, 2, ls, FZ_OUT);
        fz_tol(&w, a.lse, 1e-4);
    }
    int64_t nb1 = B + 1;
    a.cuq = fz_view_new(&w, &in, "cu_seqlens_q", fz_u8(&in) & 1 ? LK_I64 : LK_I32, 1, &nb1, FZ_IDX);
    int64_t cq[4] = {0}, ck[4] = {0};
    for (int64_t b = 0; b < B; b++) cq[b + 1] = cq[b] + ql[b], ck[b + 1] = ck[b] + kl[b];
    if (Tq > cq[B] && fz_u8(&in) & 1) /* padding rows first instead of last */
        for (int64_t b = 0; b <= B; b++) cq[b] += Tq - cq[B];
    fz_idx_fill(&w, &in, a.cuq, cq, nb1, Tq + 1);
    check_cu(&w, a.cuq, nb1, Tq);
    if (paged == 0) {
        Tk += fz_range(&in, 0, 2);
        int64_t ks[3] = {Tk, Hk, Dqk}, vs[3] = {Tk, Hk, Dv};
        a.k = qkv_view(&w, &in, "k", kt, 3, ks, 0);
        a.v = qkv_view(&w, &in, "v", vt, 3, vs, 0);
        a.cuk = fz_view_new(&w, &in, "cu_seqlens_k", fz_u8(&in) & 1 ? LK_I64 : LK_I32, 1, &nb1, FZ_IDX);
        fz_idx_fill(&w, &in, a.cuk, ck, nb1, Tk + 1);
        check_cu(&w, a.cuk, nb1, Tk);
    } else {
        int64_t bs = 1 + (int64_t)(fz_u8(&in) % 5), NB = 1 + (int64_t)(fz_u8(&in) % 6), maxp = 0;
        if (fz_chance(&in, 8)) { /* an empty cache, [0, 0, ..] (block_size 0) too */
            NB = 0;
            if (fz_u8(&in) & 1) bs = 0;
        }
        for (int64_t b = 0; b < B; b++)
            if (bs > 0 && (kl[b] + bs - 1) / bs > maxp) maxp = (kl[b] + bs - 1) / bs;
        maxp += fz_range(&in, 0, 1);
        if (paged == 1) {
            int64_t ks[4] = {NB, bs, Hk, Dqk}, vs[4] = {NB, bs, Hk, Dv};
            a.k = qkv_view(&w, &in, "k", kt, 4, ks, 0);
            a.v = qkv_view(&w, &in, "v", vt, 4, vs, 0);
        } else {
            int64_t ks[4] = {NB, Hk * Dqk / tk, bs, tk}, vs[4] = {NB, Hk * Dv / tv, bs, tv};
            a.k = qkv_view(&w, &in, "k", kt, 4, ks, 1);
            a.v = qkv_view(&w, &in, "v", vt, 4, vs, 1);
        }
        a.p.kv_layout = paged == 2 ? LK_KV_NZ : LK_KV_ND;
        int64_t ts[2] = {B, maxp};
        lk_dtype tdt = fz_chance(&in, 4) ? LK_I64 : LK_I32; /* i64 tables are accepted too */
        a.table = fz_view_new(&w, &in, "block_table", tdt, 2, ts, FZ_IDX);
        int64_t tv[3 * 13]; /* B <= 3, maxp <= 12 + 1 */
        for (int64_t i = 0; i < B * maxp; i++) tv[i] = NB ? (int64_t)(fz_next(&w.rng) % (uint64_t)NB) : -1;
        fz_idx_fill(&w, &in, a.table, tv, B * maxp, NB);
        a.used = fz_view_new(&w, &in, "seqused_k", fz_u8(&in) & 1 ? LK_I64 : LK_I32, 1, &B, FZ_IDX);
        fz_idx_fill(&w, &in, a.used, kl, B, maxp * bs + 1);
        if (fz_usable(&w, a.used) && !w.v[a.table].bad)
            for (int64_t b = 0; b < B; b++) {
                int64_t u = fz_idx_get(&w, a.used, b);
                if (u < 0 || u > maxp * bs) {
                    fz_fail_expected(&w, "seqused_k beyond the block table");
                    continue;
                }
                for (int64_t j = 0; bs > 0 && j < (u + bs - 1) / bs; j++) {
                    int64_t pg = fz_idx_get(&w, a.table, b * maxp + j);
                    if (pg < 0 || pg >= NB) fz_fail_expected(&w, "block_table entry outside the cache");
                }
            }
    }
    unsigned misuse = fz_u8(&in);
    if (misuse == 0 && paged) { /* cu_seqlens_k with a block table */
        a.cuk = a.cuq;
        fz_fail_expected(&w, "cu_seqlens_k given with a block table");
    } else if (misuse == 1 && !paged) { /* seqused_k without one */
        a.used = a.cuq;
        fz_fail_expected(&w, "seqused_k given without a block table");
    } else if (misuse == 2 && paged) {
        a.used = -1;
        fz_fail_expected(&w, "paged without seqused_k");
    } else if (misuse == 3 && !paged) {
        a.cuk = -1;
        fz_fail_expected(&w, "dense without cu_seqlens_k");
    }
    static const float SC[8] = {0.25f, 0.5f, 1.0f, 0.0f, -0.3f, 0.125f, NAN, INFINITY};
    unsigned si = fz_u8(&in) % 8;
    a.p.scale = SC[si];
    if (si >= 6) fz_fail_expected(&w, "scale not finite");
    a.p.causal = (int)(fz_u8(&in) % 3);
    static const int64_t WL[6] = {-1, -1, 0, 1, 3, -2}, WR[5] = {-1, -1, 0, 2, -3};
    unsigned wl = fz_u8(&in) % 6, wr = fz_u8(&in) % 5;
    a.p.window_left = WL[wl], a.p.window_right = WR[wr];
    if (wl == 5 || wr == 4) fz_fail_expected(&w, "window < -1");
    static const float CAP[6] = {0.0f, 0.0f, 5.0f, 30.0f, -1.0f, NAN};
    unsigned ci = fz_u8(&in) % 6;
    a.p.softcap = CAP[ci];
    if (ci >= 4) fz_fail_expected(&w, "softcap out of domain");
    unsigned am = fz_u8(&in) % 8; /* ALiBi slopes: 5 [Hq], 6 [B, Hq], 7 a wrong shape */
    if (am >= 5) {
        int64_t as[2] = {am == 5 ? Hq : B, Hq};
        if (am == 7) as[1] = Hq + 1, fz_fail_expected(&w, "alibi_slopes shape");
        a.alibi = fz_view_new(&w, &in, "alibi_slopes", LK_F32, am == 5 ? 1 : 2, as, FZ_IN);
        fz_fill(&w, a.alibi, 0, 1);
        if (fz_usable(&w, a.alibi))
            for (int64_t i = 0; i < fz_numel(&w.v[a.alibi].t); i++)
                if (!isfinite(fz_get(&w.v[a.alibi].t, i))) fz_fail_expected(&w, "alibi slope not finite");
    }
    /* descales: none, [1], [Hk], [B] (a shape error unless B is 1 or Hk) or [B, Hk] each;
     * a wrong shape, a wrong dtype, or a value
     * <= 0 / non-finite sometimes (validated even for tensors that are not fp8) */
    static const char *DN[3] = {"q_descale", "k_descale", "v_descale"};
    for (int i = 0; i < 3; i++) {
        unsigned dm = fz_u8(&in) % 6;
        if (dm < 2) continue;
        int64_t ds[2] = {dm == 2 ? 1 : dm == 3 ? Hk : B, Hk};
        int nd = dm == 5 ? 2 : 1;
        if (dm == 5 && fz_chance(&in, 6)) ds[1] = Hk + 1, fz_fail_expected(&w, "descale shape");
        if (dm == 4 && B != 1 && B != Hk) fz_fail_expected(&w, "descale [B]: neither [1] nor [Hk]");
        lk_dtype dd = LK_F32;
        if (fz_chance(&in, 8)) dd = LK_BF16, fz_fail_expected(&w, "descale not f32");
        a.desc[i] = fz_view_new(&w, &in, DN[i], dd, nd, ds, FZ_IN);
        fz_fill(&w, a.desc[i], 0.25, 4);
        if (fz_usable(&w, a.desc[i]) && dd == LK_F32) /* the fill's specials (NaN, inf, 0, -0) */
            for (int64_t j = 0; j < fz_numel(&w.v[a.desc[i]].t); j++) {
                float x = fz_get(&w.v[a.desc[i]].t, j);
                if (!(x > 0.0f) || !isfinite(x)) fz_fail_expected(&w, "descale value not finite > 0");
            }
        if (fz_chance(&in, 8) && fz_usable(&w, a.desc[i]) && fz_numel(&w.v[a.desc[i]].t) > 0) {
            static const float BADV[4] = {0.0f, -1.0f, NAN, INFINITY};
            lk_store_f(w.v[a.desc[i]].t.data, dd, fz_off(&w.v[a.desc[i]].t, 0), BADV[fz_u8(&in) % 4]);
            fz_fail_expected(&w, "descale value not finite > 0");
        }
    }
    if (paged && fz_chance(&in, 4)) {
        a.p.kv_layout = (lk_kv_layout)7;
        fz_fail_expected(&w, "unknown kv layout");
    }
    fz_fill(&w, a.q, -2, 2);
    fz_fill(&w, a.k, -2, 2);
    fz_fill(&w, a.v, -2, 2);
    fill_f8(&w, a.q, -2, 2), fill_f8(&w, a.k, -2, 2), fill_f8(&w, a.v, -2, 2);
    /* the scores' f32 error: the dot product's bound Dqk 2^-24 sum |q_d k_d| times the
     * descaled scale (|q|, |k| the largest finite values stored: an infinite fill saturates
     * to an fp8 cache's 448 / 57344, and the sums then cancel in f32); lse moves by as much,
     * each weight by as much relative, out by twice that times max |v| */
    double out_extra = 0; /* out's absolute tolerance beyond 3e-5 (f32 values) */
    if (a.desc[0] >= 0 || a.desc[1] >= 0 || a.desc[2] >= 0 || fz_is_fp8(qt) || fz_is_fp8(kt)) {
        double dq = a.desc[0] >= 0 ? 4 : 1, dk = a.desc[1] >= 0 ? 4 : 1, dv = a.desc[2] >= 0 ? 4 : 1;
        double ds = (double)Dqk * ldexp(1.0, -24) * fabs((double)a.p.scale) * dq * dk * fz_maxabs(&w, a.q) *
                    fz_maxabs(&w, a.k) * (double)Dqk;
        if (isfinite(ds)) {
            if (a.lse >= 0) w.v[a.lse].atol += ds;
            out_extra = 2.0 * ds * fz_maxabs(&w, a.v) * dv;
            w.v[a.out].atol += out_extra;
        }
    }
    if (fz_chance(&in, 3)) a.null_params = 1, fz_fail_expected(&w, "NULL params");
    if (fz_chance(&in, 4)) {
        unsigned k = fz_u8(&in) % 5;
        if (k == 0) a.out = -1;
        else if (k == 1) a.q = -1;
        else if (k == 2) a.k = -1;
        else if (k == 3) a.v = -1;
        else a.cuq = -1;
        fz_fail_expected(&w, "NULL tensor pointer");
    }
    /* lk_flash_attn_varlen_scaled, drawn last so that inputs made before it decode as they
     * did (past the input's end fz_u8 gives 0x80: the plain call). Modes: 0-4 an fp8 out
     * (out retyped e4m3 / e5m2 in a new exact arena) with output_scale; 5 an fp8 out
     * without one; 6 the float out with one; 7 the float out without one (= the plain
     * call) */
    unsigned sm = fz_u8(&in);
    double osc = 1;
    if (sm < 96) {
        a.scaled = 1;
        unsigned mode = sm % 8;
        if (mode <= 5 && a.out >= 0 && !out_is_q && !w.v[a.out].bad && !out_f8_draw) {
            fz_view *o = &w.v[a.out];
            o->t.dtype = fz_u8(&in) & 1 ? LK_F8E5M2 : LK_F8E4M3;
            fz_place(&w, o);
        }
        if (mode != 5 && mode != 7) {
            unsigned sh = fz_u8(&in) % 16;
            int64_t ss[2] = {sh == 14 ? 2 : 1, 1};
            int nd = sh < 4 ? 0 : sh == 15 ? 2 : 1; /* [], [1]; [2] and [1, 1] are wrong */
            if (sh >= 14) fz_fail_expected(&w, "output_scale shape");
            lk_dtype sd = LK_F32;
            if (fz_chance(&in, 8)) sd = LK_BF16, fz_fail_expected(&w, "output_scale not f32");
            a.osc = fz_view_new(&w, &in, "output_scale", sd, nd, ss, FZ_IN);
            fz_fill(&w, a.osc, 0.005, 2);
            if (fz_usable(&w, a.osc) && sd == LK_F32) {
                for (int64_t j = 0; j < fz_numel(&w.v[a.osc].t); j++) {
                    float x = fz_get(&w.v[a.osc].t, j);
                    if (!(x > 0.0f) || !isfinite(x)) fz_fail_expected(&w, "output_scale not finite > 0");
                }
                osc = fz_get(&w.v[a.osc].t, 0);
            }
        }
    }
    if (a.out >= 0) { /* the out's dtype against the call made */
        lk_dtype odt = w.v[a.out].t.dtype;
        if (fz_is_fp8(odt) && a.osc < 0) fz_fail_expected(&w, "fp8 out without output_scale");
        if (fz_is_float(odt) && a.osc >= 0) fz_fail_expected(&w, "float out with output_scale");
        if (fz_is_fp8(odt) && a.osc >= 0 && fz_usable(&w, a.out)) {
            /* one fp8 step relative (2^-3 e4m3, 2^-2 e5m2; the smallest subnormal step below
             * the normal range), plus the f32 value's tolerance in output_scale units */
            fz_view *o = &w.v[a.out];
            int e5 = odt == LK_F8E5M2;
            double s = osc > 0 && isfinite(osc) ? osc : 1;
            o->cmp = FZ_CMP_TOL;
            o->rtol = 3e-5 + (e5 ? 0x1p-2 : 0x1p-3);
            o->atol = (3e-5 + out_extra) / s + (e5 ? 0x1p-16 : 0x1p-9);
            /* an infinite V value: the corner of nonfinite_any (NaN on the SIMD path where
             * the ref's double weight is tiny but not 0), stored as NaN or +-max */
            if (a.v >= 0 && fz_usable(&w, a.v))
                for (int64_t i = 0, n = fz_numel(&w.v[a.v].t); i < n; i++)
                    if (isinf(fz_get(&w.v[a.v].t, i))) o->sat_any = e5 ? 57344.0 : 448.0;
        }
    }
    if (getenv("FZ_VERBOSE"))
        fprintf(stderr, "params: scale %g causal %d window (%lld, %lld) softcap %g layout %d null %d scaled %d "
                "output_scale %g\n", (double)a.p.scale, a.p.causal, (long long)a.p.window_left,
                (long long)a.p.window_right, (double)a.p.softcap, (int)a.p.kv_layout, a.null_params, a.scaled, osc);
    fz_run(&w, call, &a);
    fz_free(&w);
    return 0;
}
