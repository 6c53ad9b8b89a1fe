/*
 * MLA prefix prefill: the online-softmax attention engine of the fused and absorbed
 * strategies, with OpenBLAS doing the two products of every key block.
 *
 *   rows: nq query rows Q [nq, Dqk] (already scaled), states (m, l), O [nq, Dv] = 0
 *   for each key segment (in order), for each block of kb <= LK_MLA_KB keys:
 *     S [nq, kb] = Q . Kb^T                                    (sgemm)
 *     kernel table's mla_softmax_block: causal mask (segment flag), block max,
 *       alpha = lk_online_rescale, S = exp(S - shift), l += sum, O *= alpha
 *     O += S . Vb                                              (sgemm, beta = 1)
 * A segment is a run of keys whose rows are `ldk` / `ldv` floats apart: a run of
 * consecutive uniform pages of the prefix, or the request's own keys (causal: key c is
 * visible to row r iff c <= lim0 + r). The caller normalises (lk_softmax_inv(l)) and
 * stores; the engine is single-threaded (units are the caller's parallel split), and a
 * unit's arithmetic depends only on its rows and keys.
 */
#include "mla.h"

void lk_mla_online_attn(const float *Q, int64_t ldq, int64_t nq, int64_t Dqk, int64_t Dv,
                        const lk_mla_segment *seg, int64_t nseg, float *S, float *O, int64_t ldo,
                        lk_online_state *st) {
    for (int64_t r = 0; r < nq; r++) {
        st[r] = lk_online_init();
        for (int64_t d = 0; d < Dv; d++) O[r * ldo + d] = 0.0f;
    }
    for (int64_t g = 0; g < nseg; g++) {
        const lk_mla_segment *sg = &seg[g];
        for (int64_t j = 0; j < sg->n; j += LK_MLA_KB) {
            int64_t kb = sg->n - j < LK_MLA_KB ? sg->n - j : LK_MLA_KB;
            lk_mla_sgemm(1, nq, kb, Dqk, Q, ldq, sg->K + j * sg->ldk, sg->ldk, 0, S, LK_MLA_KB);
            lk_mla_softmax_args sa = {S, LK_MLA_KB, nq, kb, sg->causal && j + kb - 1 > sg->lim0, sg->lim0 - j,
                                      st, O, ldo, Dv};
            lk_kernels()->mla_softmax_block(&sa);
            lk_mla_sgemm(0, nq, Dv, kb, S, LK_MLA_KB, sg->V + j * sg->ldv, sg->ldv, 1, O, ldo);
        }
    }
}

int64_t lk_mla_prefix_segments(const lk_mla_args *a, const lk_mla_plan *p, int64_t b, const float *K,
                               int64_t ldk, const float *V, int64_t ldv, lk_mla_segment *seg) {
    const int32_t *pt = p->ptable + b * a->max_pages;
    int64_t P = a->prefix[b], bs = p->bs, np = (P + bs - 1) / bs, n = 0;
    for (int64_t i = 0; i < np;) {
        int64_t run = 1;
        while (i + run < np && pt[i + run] == pt[i] + run) run++;
        int64_t keys = (P < (i + run) * bs ? P : (i + run) * bs) - i * bs, row0 = (int64_t)pt[i] * bs;
        seg[n++] = (lk_mla_segment){K + row0 * ldk, V + row0 * ldv, ldk, ldv, keys, 0, 0};
        i += run;
    }
    return n;
}
