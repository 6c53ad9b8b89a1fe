/*
 * MLA prefix prefill, strategy absorbed: attention over the prefix in latent space, the
 * prefix is never projected; the current tokens continue the same online softmax.
 *
 *   W_UK_h = kv_b_proj[h (Dn + Dv) + [0, Dn), :]      [Dn, Dl]
 *   W_UV_h = kv_b_proj[h (Dn + Dv) + Dn + [0, Dv), :] [Dv, Dl]
 *   G = gather(prefix pages)  [pages * bs, Dl + Dr] f32 (uniform pages, see mla.h)
 *   unit (request b, block of tok tokens; rows r = (head, token)):
 *     Qa [H tok, Dl + Dr] = scale * [q_nope_h . W_UK_h | q_rope_h]     (sgemm per head)
 *     Ol [H tok, Dl], states = the online engine (online.c) over the prefix entries of G,
 *        keys [c | k_pe] and values c shared by all heads (MQA). The scores equal the
 *        projected ones: q_nope . (W_UK c) + q_rope . k_pe = (q_nope W_UK) . c + ...;
 *     O_h [tok, Dv] = Ol_h . W_UV_h^T: the unnormalised prefix output in value space
 *        (W_UV is linear: sum p_j W_UV c_j = W_UV sum p_j c_j)           (sgemm per head)
 *     per head: the engine continues from (O_h, states) over the current keys k / v
 *        (causal), so no LSE merge is needed; out = O_h * lk_softmax_inv(l).
 *   Tokens of a request with a prefix go in units of about RB (head, token) rows; a
 *   request without one runs as fused does (units of one head and up to QB tokens).
 * Costs ~ Q * H * P * (2 Dl + Dr) per request instead of the projection's P * Dl * H *
 * (Dn + Dv) + Q * H * P * (Dqk + Dv): the better choice when few new tokens meet a long
 * prefix.
 * Work split: units (one parallel region) handed out dynamically, each writing its own
 * rows of out; every sgemm is single-threaded with a shape that depends only on the
 * request, so the bits depend neither on the thread count nor on the rest of the batch.
 */
#include <stdlib.h>
#include <string.h>

#include "mla.h"

#define RB 128 /* (head, token) rows per unit of a request with a prefix, at most */
#define QB 256 /* tokens per unit of a request without one, at most */

/* a request's token blocks (its tokens split evenly), their token count, and its units:
 * one per block with a prefix (all heads), one per (block, head) without (as fused) */
static int64_t n_blocks_of(const lk_mla_args *a, int64_t b) {
    int64_t ql = a->cu_q[b + 1] - a->cu_q[b];
    return a->prefix[b] > 0 ? (ql * a->H + RB - 1) / RB : (ql + QB - 1) / QB;
}
static int64_t unit_tokens(const lk_mla_args *a, int64_t b) {
    int64_t ql = a->cu_q[b + 1] - a->cu_q[b], n = n_blocks_of(a, b);
    return n ? (ql + n - 1) / n : 0;
}
static int64_t n_units_of(const lk_mla_args *a, int64_t b) {
    return n_blocks_of(a, b) * (a->prefix[b] > 0 ? 1 : a->H);
}

/* floats of the query area: the latent queries [H tok, E], later the current tokens'
 * q rows [tok, Dqk] of one head (larger when H E < Dqk, e.g. a small latent dim) */
static int64_t qa_len(int64_t rows, int64_t E, int64_t maxtok, int64_t Dqk) {
    return rows * E > maxtok * Dqk ? rows * E : maxtok * Dqk;
}

typedef struct {
    const lk_mla_args *a;
    const lk_mla_plan *p;
    const float *G, *W;        /* gathered prefix [pages * bs, E]; kv_b_proj f32, rows ldw apart */
    int64_t ldw;
    lk_tensor qf, kf, vf;      /* q, k, v as f32 views */
    int64_t *unit;             /* b * ublk + block */
    int64_t ublk, max_seg, maxtok;
    char *scratch;             /* per thread */
    size_t scratch_bytes;
} abs_ctx;

static void absorbed_unit(void *vctx, int64_t u, int tid) {
    const abs_ctx *c = vctx;
    const lk_mla_args *a = c->a;
    int64_t H = a->H, Dn = a->Dn, Dr = a->Dr, Dv = a->Dv, Dl = a->Dl, E = Dl + Dr, Dqk = Dn + Dr;
    int64_t b = c->unit[u] / c->ublk, k = c->unit[u] % c->ublk, P = a->prefix[b];
    int64_t ut = unit_tokens(a, b), q0 = a->cu_q[b], ql = a->cu_q[b + 1] - q0;
    int64_t i0 = (P > 0 ? k : k / H) * ut, tok = ql - i0 < ut ? ql - i0 : ut, t0 = q0 + i0;
    int64_t h0 = P > 0 ? 0 : k % H, h1 = P > 0 ? H : h0 + 1; /* heads of the unit */
    int64_t mt = c->maxtok, rows = H * mt;
    float *S = (float *)(c->scratch + (size_t)tid * c->scratch_bytes);  // [max(rows, mt), KB]
    float *panel = S + (rows > mt ? rows : mt) * LK_MLA_KB;              // [KB, E or Dqk + Dv]
    float *Qa = panel + LK_MLA_KB * (E > Dqk + Dv ? E : Dqk + Dv);       // [H tok, E], then Qs [tok, Dqk]
    float *Ol = Qa + qa_len(rows, E, mt, Dqk);                          // [H tok, Dl]
    float *O = Ol + rows * Dl;                                          // [H tok, Dv]
    lk_online_state *st = (lk_online_state *)(O + rows * Dv);          // [H tok]
    lk_mla_segment *seg = lk_mla_seg_align(st + rows);                  // [max_seg]
    const float *qf = c->qf.data;
    if (P > 0) {
        for (int64_t h = 0; h < H; h++) {
            const float *qh = qf + t0 * c->qf.stride[0] + h * c->qf.stride[1]; // [tok, Dqk]
            float *dst = Qa + h * tok * E;
            lk_mla_sgemm(0, tok, Dl, Dn, qh, c->qf.stride[0], c->W + h * (Dn + Dv) * c->ldw, c->ldw, 0, dst, E);
            for (int64_t t = 0; t < tok; t++) {
                for (int64_t i = 0; i < Dl; i++) dst[t * E + i] *= a->scale;
                for (int64_t i = 0; i < Dr; i++) dst[t * E + Dl + i] = a->scale * qh[t * c->qf.stride[0] + Dn + i];
            }
        }
        int64_t n = lk_mla_prefix_segments(a, c->p, b, c->G, E, c->G, E, seg);
        lk_mla_online_attn(Qa, E, H * tok, E, Dl, seg, n, NULL, S, panel, Ol, Dl, st, 1);
        for (int64_t h = 0; h < H; h++)
            lk_mla_sgemm(1, tok, Dv, Dl, Ol + h * tok * Dl, Dl, c->W + (h * (Dn + Dv) + Dn) * c->ldw, c->ldw, 0,
                         O + h * tok * Dv, Dv);
    }
    const float *kf = c->kf.data, *vf = c->vf.data;
    for (int64_t h = h0; h < h1; h++) {
        float *Qs = Qa; /* the latent rows are done with */
        lk_mla_load_q(a, t0, tok, h, Qs);
        lk_mla_segment cur = {kf + q0 * c->kf.stride[0] + h * c->kf.stride[1],
                              vf + q0 * c->vf.stride[0] + h * c->vf.stride[1], c->kf.stride[0], c->vf.stride[0],
                              i0 + tok, 1, i0};
        lk_mla_online_attn(Qs, Dqk, tok, Dqk, Dv, NULL, 0, &cur, S, panel, O + h * tok * Dv, Dv, st + h * tok, P == 0);
        lk_mla_store_rows(a, t0, tok, h, O + h * tok * Dv, Dv, st + h * tok);
    }
}

lk_status lk_mla_absorbed(const lk_mla_args *a, const lk_mla_plan *p) {
    int64_t H = a->H, Dl = a->Dl, Dr = a->Dr, Dv = a->Dv, E = Dl + Dr, Dqk = a->Dn + Dr, B = a->B;
    abs_ctx c;
    memset(&c, 0, sizeof c);
    c.a = a, c.p = p, c.W = a->w32.data, c.ldw = a->w32.stride[0];
    float *q_owned = NULL, *k_owned = NULL, *v_owned = NULL, *G = NULL;
    int64_t n_units = 0;
    for (int64_t b = 0; b < B; b++) {
        int64_t np = a->cu_q[b + 1] > a->cu_q[b] ? (a->prefix[b] + p->bs - 1) / p->bs : 0;
        n_units += n_units_of(a, b);
        if (n_units_of(a, b) > c.ublk) c.ublk = n_units_of(a, b);
        if (unit_tokens(a, b) > c.maxtok) c.maxtok = unit_tokens(a, b);
        if (np > c.max_seg) c.max_seg = np;
    }
    int nt = lk_plan_units(n_units);
    int64_t rows = H * c.maxtok, srows = rows > c.maxtok ? rows : c.maxtok;
    int64_t panel = LK_MLA_KB * (E > Dqk + Dv ? E : Dqk + Dv);
    c.scratch_bytes = sizeof(float) * (size_t)(srows * LK_MLA_KB + panel + qa_len(rows, E, c.maxtok, Dqk) +
                                               rows * (Dl + Dv)) +
                      sizeof(lk_online_state) * (size_t)rows + sizeof(lk_mla_segment) * (size_t)c.max_seg +
                      LK_MLA_SEG_SLACK;
    c.scratch_bytes = (c.scratch_bytes + 63) / 64 * 64;
    c.scratch = malloc(c.scratch_bytes * (size_t)nt);
    c.unit = malloc(sizeof(int64_t) * (size_t)(n_units + 1));
    if (p->pages) G = lk_mla_ws_get(a, 0, sizeof(float) * (size_t)(p->pages * p->bs * E));
    lk_status s = c.scratch && c.unit && (G || !p->pages) ? LK_OK : LK_ERR_NOMEM;
    if (!s && p->pages) s = lk_mla_gather(a, p, G);
    if (!s) s = lk_mla_f32_view(&a->q, &c.qf, &q_owned);
    if (!s) s = lk_mla_f32_view(&a->k, &c.kf, &k_owned);
    if (!s) s = lk_mla_f32_view(&a->v, &c.vf, &v_owned);
    if (!s) {
        c.G = G;
        int64_t n = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t k = 0; k < n_units_of(a, b); k++) c.unit[n++] = b * c.ublk + k;
        lk_mla_blas_begin();
        lk_parallel_units(n_units, nt, absorbed_unit, &c);
        lk_mla_blas_end();
        lk_trace_item("latent_attn units=%lld (absorb_q sgemm, mqa over %lld + %lld latent dims, absorb_out sgemm, "
                      "current keys causal) rows=%d kblock=%d",
                      (long long)n_units, (long long)Dl, (long long)Dr, RB, LK_MLA_KB);
    }
    free(q_owned), free(k_owned), free(v_owned), free(c.scratch), free(c.unit);
    return s;
}
