/*
 * MLA prefix prefill, strategy fused: one online-softmax pass over the prefix keys and
 * then the request's own keys, per query block; no LSE merge, no concatenated copy.
 *
 *   Kp, Vp = project(gather(prefix pages))     uniform pages [pages * bs, H, Dqk / Dv]
 *   unit (request b, head h, query block [i0, i0 + nq)): a request's queries split
 *   evenly into blocks of at most QB:
 *     Qs [nq, Dqk] = scale * q rows (any dtype / strides)
 *     segments, in order: the prefix as runs of consecutive uniform pages of Kp / Vp
 *       (visible to every query), then the current keys [0, i0 + nq) of k / v read in
 *       place (f32 views), causal: key j visible to query i iff j <= i
 *     O = lk_mla_online_attn(Qs, segments)      (online.c: sgemm, softmax step, sgemm)
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
    const float *Kp, *Vp;  /* uniform pages [pages * bs, H, Dqk], [.., H, Dv] */
    lk_tensor kf, vf;      /* current k [T, H, Dqk], v [T, H, Dv]: f32, unit last stride */
    int64_t *unit;         /* [n_units] (b * H + h) * nblk + query block */
    int64_t nblk;          /* query blocks per request, max */
    int64_t max_seg;
    char *scratch;         /* per thread */
    size_t scratch_bytes;
} fused_ctx;

static void fused_unit(void *vctx, int64_t u, int tid) {
    const fused_ctx *c = vctx;
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
    int64_t n = c->Kp ? lk_mla_prefix_segments(a, c->p, b, c->Kp + h * Dqk, H * Dqk, c->Vp + h * Dv, H * Dv, seg) : 0;
    const float *kf = c->kf.data, *vf = c->vf.data;
    lk_mla_segment cur = {kf + q0 * c->kf.stride[0] + h * c->kf.stride[1],
                          vf + q0 * c->vf.stride[0] + h * c->vf.stride[1], c->kf.stride[0], c->vf.stride[0],
                          i0 + nq, 1, i0};
    lk_mla_online_attn(Qs, Dqk, nq, Dqk, Dv, seg, n, &cur, S, panel, O, Dv, st, 1);
    lk_mla_store_rows(a, q0 + i0, nq, h, O, Dv, st);
}

lk_status lk_mla_fused(const lk_mla_args *a, const lk_mla_plan *p) {
    float *Kp = NULL, *Vp = NULL, *k_owned = NULL, *v_owned = NULL;
    lk_status s = p->pages ? lk_mla_project_prefix(a, p, &Kp, &Vp) : LK_OK;
    if (s) return s;
    fused_ctx c;
    memset(&c, 0, sizeof c);
    c.a = a, c.p = p, c.Kp = Kp, c.Vp = Vp;
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
    if (!s) s = lk_mla_f32_view(&a->k, &c.kf, &k_owned);
    if (!s) s = lk_mla_f32_view(&a->v, &c.vf, &v_owned);
    if (!s) {
        /* later query blocks (more current keys) first, per request */
        int64_t n = 0;
        for (int64_t b = 0; b < a->B; b++) {
            int64_t ql = a->cu_q[b + 1] - a->cu_q[b];
            for (int64_t blk = n_blocks(ql) - 1; blk >= 0; blk--)
                for (int64_t h = 0; h < H; h++) c.unit[n++] = (b * H + h) * c.nblk + blk;
        }
        lk_mla_blas_begin();
        lk_parallel_units(n_units, nt, fused_unit, &c);
        lk_mla_blas_end();
        lk_mla_zero_padding(a);
        lk_trace_item("fused_attn units=%lld qblock=%d kblock=%d H=%lld D=%lld/%lld", (long long)n_units, QB,
                      LK_MLA_KB, (long long)H, (long long)Dqk, (long long)a->Dv);
    }
    free(k_owned), free(v_owned), free(c.unit), free(c.scratch);
    return s;
}
