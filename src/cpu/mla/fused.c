/*
 * MLA prefix prefill, strategy fused: one online-softmax pass over the prefix keys and
 * then the request's own keys, per query block; no LSE merge, no concatenated copy.
 *
 *   Kp, Vp = project(gather(prefix pages))     head-major [H, pages * bs, Dqk / Dv]
 *   kf, vf = k, v as f32 head-major [H, T, Dqk / Dv] (one copy per wave)
 *   unit (request b, head h, query block [i0, i0 + nq)): a request's queries split
 *   evenly into blocks of at most QB:
 *     Qs [nq, Dqk] = scale * q rows (any dtype / strides)
 *     segments, in order: the prefix as runs of consecutive uniform pages of head h's
 *       Kp / Vp rows (visible to every query), then the current keys [0, i0 + nq) of
 *       head h's kf / vf rows, causal: key j visible to query i iff j <= i
 *     O = lk_mla_online_attn(Qs, segments)      (online.c: GEMM, softmax step, GEMM)
 *     out rows = O * lk_softmax_inv(l), rounded once.
 * Work split: units handed out dynamically (lk_parallel_units), later query blocks
 * (more keys) first; each unit writes only its rows of out; unit shapes depend only on
 * the problem, so results do not depend on the thread count.
 */
#include <stdlib.h>
#include <string.h>

#include "../../core/half.h"
#include "mla.h"

#define QB 256 /* query rows per unit, at most */

/* query blocks of a request of ql tokens and their size: ql split evenly */
static int64_t n_blocks(int64_t ql) { return (ql + QB - 1) / QB; }
static int64_t block_rows(int64_t ql) { return ql ? (ql + n_blocks(ql) - 1) / n_blocks(ql) : 0; }

typedef struct {
    const lk_mla_args *a;
    const lk_mla_plan *p;
    const float *Kp, *Vp;  /* head-major uniform pages [H, pages * bs, Dqk], [H, .., Dv] */
    int64_t rows;          /* pages * bs */
    const float *kf, *vf;  /* current k [H, T, Dqk], v [H, T, Dv] f32 */
    atomic_int status;
    int64_t *unit;         /* [n_units] (b * H + h) * nblk + query block */
    int64_t nblk;          /* query blocks per request, max */
    int64_t max_seg;
    char *scratch;         /* per thread */
    size_t scratch_bytes;
} fused_ctx;

static void fused_unit(void *vctx, int64_t u, int tid) {
    fused_ctx *c = vctx;
    const lk_mla_args *a = c->a;
    int64_t H = a->H, Dqk = a->Dn + a->Dr, Dv = a->Dv;
    int64_t b = c->unit[u] / (H * c->nblk), h = c->unit[u] / c->nblk % H;
    int64_t q0 = a->cu_q[b], ql = a->cu_q[b + 1] - q0, br = block_rows(ql), i0 = c->unit[u] % c->nblk * br;
    int64_t nq = ql - i0 < br ? ql - i0 : br;
    float *Qs = (float *)(c->scratch + (size_t)tid * c->scratch_bytes); // [QB, Dqk]
    float *S = Qs + QB * Dqk, *O = S + QB * LK_MLA_KB;                 // [QB, KB], [QB, Dv]
    float *panel = O + QB * Dv;                                        // [KB, Dqk + Dv]
    lk_online_state *st = (lk_online_state *)(panel + LK_MLA_KB * (Dqk + Dv)); // [QB]
    lk_mla_segment *seg = lk_mla_seg_align(st + QB);                   // [max_seg]
    lk_mla_load_q(a, q0 + i0, nq, h, Qs);
    int64_t n = c->Kp ? lk_mla_prefix_segments(a, c->p, b, LK_F32, c->Kp + h * c->rows * Dqk, Dqk,
                                               c->Vp + h * c->rows * Dv, Dv, seg)
                      : 0;
    lk_mla_segment cur = {c->kf + (h * a->T + q0) * Dqk, c->vf + (h * a->T + q0) * Dv, Dqk, Dv, i0 + nq, 1, i0};
    lk_status s = lk_mla_online_attn(LK_F32, Qs, Dqk, nq, Dqk, Dv, seg, n, &cur, S, NULL, panel, O, Dv, st, 1);
    if (s) lk_mla_note(&c->status, s);
    else lk_mla_store_rows(a, q0 + i0, nq, h, O, Dv, st);
}

lk_status lk_mla_fused(const lk_mla_args *a, const lk_mla_plan *p) {
    float *Kp = NULL, *Vp = NULL, *kf = NULL, *vf = NULL;
    lk_status s = p->pages ? lk_mla_project_prefix(a, p, 1, &Kp, &Vp) : LK_OK;
    if (s) return s;
    fused_ctx c;
    memset(&c, 0, sizeof c);
    atomic_init(&c.status, LK_OK);
    c.a = a, c.p = p, c.Kp = Kp, c.Vp = Vp, c.rows = p->pages * p->bs;
    int64_t H = a->H, Dqk = a->Dn + a->Dr, n_units = 0, maxq = 0;
    for (int64_t b = 0; b < a->B; b++) {
        int64_t ql = a->cu_q[b + 1] - a->cu_q[b], np = ql ? (a->prefix[b] + p->bs - 1) / p->bs : 0;
        n_units += n_blocks(ql) * H;
        if (ql > maxq) maxq = ql;
        if (np > c.max_seg) c.max_seg = np;
    }
    c.nblk = n_blocks(maxq);
    int nt = lk_plan_units(n_units);
    c.scratch_bytes = sizeof(float) * (size_t)(QB * (Dqk + LK_MLA_KB + a->Dv) + LK_MLA_KB * (Dqk + a->Dv)) +
                      sizeof(lk_online_state) * QB +
                      sizeof(lk_mla_segment) * (size_t)c.max_seg + LK_MLA_SEG_SLACK;
    c.scratch_bytes = (c.scratch_bytes + 63) / 64 * 64;
    c.unit = malloc(sizeof(int64_t) * (size_t)(n_units + 1));
    c.scratch = malloc(c.scratch_bytes * (size_t)nt);
    if (!c.unit || !c.scratch) s = LK_ERR_NOMEM;
    if (!s) s = lk_mla_heads_f32(&a->k, &kf);
    if (!s) s = lk_mla_heads_f32(&a->v, &vf);
    if (!s) {
        c.kf = kf, c.vf = vf;
        /* later query blocks (more current keys) first, per request */
        int64_t n = 0;
        for (int64_t b = 0; b < a->B; b++) {
            int64_t ql = a->cu_q[b + 1] - a->cu_q[b];
            for (int64_t blk = n_blocks(ql) - 1; blk >= 0; blk--)
                for (int64_t h = 0; h < H; h++) c.unit[n++] = (b * H + h) * c.nblk + blk;
        }
        lk_parallel_units(n_units, nt, fused_unit, &c);
        s = (lk_status)atomic_load(&c.status);
        lk_mla_zero_padding(a);
        lk_trace_item("fused_attn units=%lld qblock=%d kblock=%d H=%lld D=%lld/%lld", (long long)n_units, QB,
                      LK_MLA_KB, (long long)H, (long long)Dqk, (long long)a->Dv);
    }
    free(kf), free(vf), free(c.unit), free(c.scratch);
    return s;
}
