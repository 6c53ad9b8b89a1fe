/*
 * MLA prefix prefill, strategy absorbed: attention over the prefix in latent space, the
 * prefix is never projected.
 *
 *   W_UK_h = kv_b_proj[h (Dn + Dv) + [0, Dn), :]      [Dn, Dl]
 *   W_UV_h = kv_b_proj[h (Dn + Dv) + Dn + [0, Dv), :] [Dv, Dl]
 *   Qa [T, H, Dl + Dr] = scale * [q_nope_h . W_UK_h | q_rope_h]    (sgemm per head)
 *   G = gather(prefix pages)  [pages * bs, Dl + Dr] f32 (uniform pages, see mla.h)
 *   (Ol [T, H, Dl], lse1): every (token, head) row of a request attends to the request's
 *        prefix entries, keys [c | k_pe] and values c shared by all heads (MQA): the
 *        online engine (online.c) over G's page runs; a request's (token, head) rows
 *        split evenly into units of at most RB rows. The scores equal the projected ones:
 *        q_nope . (W_UK c) + q_rope . k_pe = (q_nope W_UK) . c + q_rope . k_pe.
 *   O1 [T, H, Dv] = Ol_h . W_UV_h^T                                (sgemm per head)
 *   (O2, lse2) = flash_attn(q, k, v) causal over the new tokens; out = merge.
 * Costs ~ Q * H * P * (2 Dl + Dr) per request instead of the projection's P * Dl * H *
 * (Dn + Dv) + Q * H * P * (Dqk + Dv): the better choice when few new tokens meet a long
 * prefix.
 * Work split: sgemm units (head, block of ROWS tokens of one request) and attention
 * units (request, block of RB rows), single-threaded calls whose shapes depend only on the problem;
 * flash_attn / merge split as they do.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mla.h"

#define ROWS 256 /* token rows per sgemm unit */
#define RB 128   /* (token, head) rows per attention unit, at most */

/* attention units of a request with n (token, head) rows, and their rows: n split evenly */
static int64_t n_units_of(int64_t n) { return (n + RB - 1) / RB; }
static int64_t unit_rows(int64_t n) { return n ? (n + n_units_of(n) - 1) / n_units_of(n) : 0; }

typedef struct {
    const lk_mla_args *a;
    const lk_mla_plan *p;
    const float *W;     /* kv_b_proj f32, rows ldw apart */
    int64_t ldw;
    lk_tensor qf;       /* q as f32 view */
    float *Qa, *Ol, *O1, *lse1, *G;
    int64_t *tblk;      /* sgemm units' token blocks: first token (blocks never span requests) */
    int64_t *tend;      /* and end */
    int64_t nrb;        /* token blocks */
    int64_t *unit;      /* attention units: b * ublk + block */
    int64_t ublk, max_seg;
    char *scratch;      /* per thread: S [RB, KB], states, segments */
    size_t scratch_bytes;
} abs_ctx;

/* Qa rows of one (head, token block) */
static void absorb_q_unit(void *vctx, int64_t u, int tid) {
    (void)tid;
    const abs_ctx *c = vctx;
    const lk_mla_args *a = c->a;
    int64_t H = a->H, Dn = a->Dn, Dr = a->Dr, Dv = a->Dv, Dl = a->Dl, E = Dl + Dr;
    int64_t h = u / c->nrb, t = c->tblk[u % c->nrb], M = c->tend[u % c->nrb] - t;
    const float *q = (const float *)c->qf.data + t * c->qf.stride[0] + h * c->qf.stride[1];
    float *dst = c->Qa + (t * H + h) * E;
    lk_mla_sgemm(0, M, Dl, Dn, q, c->qf.stride[0], c->W + h * (Dn + Dv) * c->ldw, c->ldw, 0, dst, H * E);
    for (int64_t r = 0; r < M; r++) {
        float *d = dst + r * H * E;
        const float *pe = q + r * c->qf.stride[0] + Dn;
        for (int64_t i = 0; i < Dl; i++) d[i] *= a->scale;
        for (int64_t i = 0; i < Dr; i++) d[Dl + i] = a->scale * pe[i];
    }
}

/* O1 rows of one (head, token block) */
static void absorb_out_unit(void *vctx, int64_t u, int tid) {
    (void)tid;
    const abs_ctx *c = vctx;
    const lk_mla_args *a = c->a;
    int64_t H = a->H, Dn = a->Dn, Dv = a->Dv, Dl = a->Dl;
    int64_t h = u / c->nrb, t = c->tblk[u % c->nrb], M = c->tend[u % c->nrb] - t;
    lk_mla_sgemm(1, M, Dv, Dl, c->Ol + (t * H + h) * Dl, H * Dl, c->W + (h * (Dn + Dv) + Dn) * c->ldw, c->ldw, 0,
                 c->O1 + (t * H + h) * Dv, H * Dv);
}

/* latent attention of RB (token, head) rows of one request */
static void latent_unit(void *vctx, int64_t u, int tid) {
    const abs_ctx *c = vctx;
    const lk_mla_args *a = c->a;
    int64_t H = a->H, Dl = a->Dl, E = Dl + a->Dr;
    int64_t b = c->unit[u] / c->ublk, rows = (a->cu_q[b + 1] - a->cu_q[b]) * H, ur = unit_rows(rows);
    int64_t r0 = a->cu_q[b] * H + c->unit[u] % c->ublk * ur;
    int64_t nq = a->cu_q[b + 1] * H - r0 < ur ? a->cu_q[b + 1] * H - r0 : ur;
    float *S = (float *)(c->scratch + (size_t)tid * c->scratch_bytes);      // [RB, KB]
    float *panel = S + RB * LK_MLA_KB;                                     // [KB, E]
    lk_online_state *st = (lk_online_state *)(panel + LK_MLA_KB * E);     // [RB]
    lk_mla_segment *seg = (lk_mla_segment *)(st + RB);                     // [max_seg]
    int64_t n = lk_mla_prefix_segments(a, c->p, b, c->G, E, c->G, E, seg);
    float *O = c->Ol + r0 * Dl;
    lk_mla_online_attn(c->Qa + r0 * E, E, nq, E, Dl, seg, n, NULL, S, panel, O, Dl, st);
    for (int64_t r = 0; r < nq; r++) {
        float inv = lk_softmax_inv(st[r].l);
        for (int64_t d = 0; d < Dl; d++) O[r * Dl + d] *= inv;
        c->lse1[r0 + r] = lk_online_lse(st[r]);
    }
}

lk_status lk_mla_absorbed(const lk_mla_args *a, const lk_mla_plan *p) {
    int64_t T = a->T, H = a->H, Dl = a->Dl, Dr = a->Dr, Dv = a->Dv, E = Dl + Dr, TH = T * H, B = a->B;
    if (p->pages == 0) return lk_mla_attn_current(a, &a->out, NULL);
    abs_ctx c;
    memset(&c, 0, sizeof c);
    c.a = a, c.p = p;
    float *q_owned = NULL;
    float *buf = malloc(sizeof(float) * (size_t)(TH * (E + Dl + 2 * Dv + 2) + 1));
    c.G = malloc(sizeof(float) * (size_t)(p->pages * p->bs * E + 1));
    lk_status s = buf && c.G ? LK_OK : LK_ERR_NOMEM;
    if (!s) s = lk_mla_f32_view(&a->q, &c.qf, &q_owned);
    if (!s) s = lk_mla_gather(a, p, c.G);
    int64_t n_units = 0;
    for (int64_t b = 0; b < B; b++) {
        int64_t ql = a->cu_q[b + 1] - a->cu_q[b], np = ql ? (a->prefix[b] + p->bs - 1) / p->bs : 0;
        if (np) n_units += n_units_of(ql * H);
        if (n_units_of(ql * H) > c.ublk) c.ublk = n_units_of(ql * H);
        if (np > c.max_seg) c.max_seg = np;
    }
    int nt = lk_plan_units(n_units);
    c.scratch_bytes = (sizeof(float) * (RB + E) * LK_MLA_KB + sizeof(lk_online_state) * RB +
                       sizeof(lk_mla_segment) * (size_t)c.max_seg + 63) / 64 * 64;
    c.scratch = malloc(c.scratch_bytes * (size_t)nt);
    c.unit = malloc(sizeof(int64_t) * (size_t)(n_units + 1));
    for (int64_t b = 0; b < B; b++)
        if (a->prefix[b] > 0) c.nrb += (a->cu_q[b + 1] - a->cu_q[b] + ROWS - 1) / ROWS;
    c.tblk = malloc(sizeof(int64_t) * (size_t)(2 * c.nrb + 1));
    if (!s && (!c.scratch || !c.unit || !c.tblk)) s = LK_ERR_NOMEM;
    if (!s) {
        c.W = a->w32.data, c.ldw = a->w32.stride[0];
        c.Qa = buf, c.Ol = buf + TH * E, c.O1 = c.Ol + TH * Dl;
        float *O2 = c.O1 + TH * Dv, *lse2 = O2 + TH * Dv;
        c.lse1 = lse2 + TH;
        /* token blocks of at most ROWS rows inside each request with a prefix, so that a
         * request's bits do not depend on the rest of the batch (sgemm rows depend on
         * their position); requests without a prefix need no latent rows */
        c.tend = c.tblk + c.nrb;
        for (int64_t b = 0, k = 0; b < B; b++)
            for (int64_t t = a->cu_q[b]; a->prefix[b] > 0 && t < a->cu_q[b + 1]; t += ROWS, k++)
                c.tblk[k] = t, c.tend[k] = t + ROWS < a->cu_q[b + 1] ? t + ROWS : a->cu_q[b + 1];
        lk_mla_blas_begin();
        lk_parallel_units(H * c.nrb, lk_plan_units(H * c.nrb), absorb_q_unit, &c);
        lk_mla_trace("absorb_q sgemm=%lld M=%lld N=%lld K=%lld", (long long)(H * c.nrb),
                     (long long)(a->cu_q[B] - a->cu_q[0]), (long long)Dl, (long long)a->Dn);
        /* rows without a prefix: empty state (their Ol / O1 rows are never written nor
         * read: the merge does not read a state whose lse is -inf) */
        for (int64_t i = 0; i < TH; i++) c.lse1[i] = -INFINITY;
        int64_t n = 0;
        for (int64_t b = 0; b < B; b++)
            if (a->prefix[b] > 0)
                for (int64_t k = 0; k < n_units_of((a->cu_q[b + 1] - a->cu_q[b]) * H); k++) c.unit[n++] = b * c.ublk + k;
        lk_parallel_units(n_units, nt, latent_unit, &c);
        lk_mla_trace("latent_attn mqa units=%lld rows=%d kblock=%d D=%lld/%lld", (long long)n_units, RB, LK_MLA_KB,
                     (long long)E, (long long)Dl);
        lk_parallel_units(H * c.nrb, lk_plan_units(H * c.nrb), absorb_out_unit, &c);
        lk_mla_blas_end();
        lk_mla_trace("absorb_out sgemm=%lld M=%lld N=%lld K=%lld", (long long)(H * c.nrb),
                     (long long)(a->cu_q[B] - a->cu_q[0]), (long long)Dv, (long long)Dl);
        lk_tensor o2t = lk_tensor_make(O2, LK_F32, 3, (int64_t[3]){T, H, Dv});
        s = lk_mla_attn_current(a, &o2t, lse2);
        if (!s) s = lk_mla_merge(a, c.O1, c.lse1, O2, lse2);
    }
    free(c.G), free(buf), free(q_owned), free(c.scratch), free(c.unit), free(c.tblk);
    return s;
}
