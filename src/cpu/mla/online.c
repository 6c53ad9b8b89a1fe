/*
 * MLA prefix prefill: the online-softmax attention engine of the fused and absorbed
 * strategies, with oneDNN's GEMMs (gemm.c) doing the two products of every key block.
 * Operands of dtype dt: f32 (Q, K, V and P f32), or bf16 (Q, K, V bf16, P rounded to
 * bf16 by the softmax step, as the bf16 flash_attn path does; S and O stay f32):
 * absorbed's latent attention over a bf16 cache (tolerance in docs/numerics.md).
 *
 *   rows: nq query rows Q [nq, Dqk] (already scaled), states (m, l), O [nq, Dv] = 0
 *   key blocks: the prefix as one logical sequence in blocks of LK_MLA_KB keys (read in
 *   place when the block lies in one run of pages, else copied into a panel: the same
 *   values and shapes, so the bits do not depend on how pages are laid out, deduped or
 *   split into waves), then the current keys (causal: the keys every row sees in blocks
 *   of LK_MLA_KB, the diagonal in chunks of LK_MLA_KD keys, each for the rows that see
 *   some of it only, so the masked triangle costs ~nq * KD / 2); for each block:
 *     S [nq, kb] = Q . Kb^T                                    (f32 GEMM)
 *     kernel table's mla_softmax_block: causal mask (segment flag), block max,
 *       alpha = lk_online_rescale, S = exp(S - shift), l += sum, O *= alpha
 *     O += S . Vb                                              (f32 GEMM, accumulate)
 * A segment is a run of keys whose rows are `ldk` / `ldv` elements apart: a run of
 * consecutive uniform pages of the prefix, or the request's own keys (causal: key c is
 * visible to row r iff c <= lim0 + r). Absorbed: V rows are the first Dv dims of the K
 * rows (V == K, ldv == ldk). The caller normalises (lk_softmax_inv(l)) and
 * stores; the engine is single-threaded (units are the caller's parallel split), and a
 * unit's arithmetic depends only on its rows and keys.
 */
#include <math.h>
#include <string.h>

#include "../../core/half.h"
#include "mla.h"

/* row r of a matrix of dt elements, rows ld apart */
static const void *row_at(lk_dtype dt, const void *p, int64_t r, int64_t ld) {
    return (const char *)p + (size_t)(r * ld) * lk_esize(dt);
}

/* 1 when one of the kb x Dv values of V (rows ldv apart) is inf or NaN */
static int nonfinite_rows(lk_dtype dt, const void *V, int64_t ldv, int64_t kb, int64_t Dv) {
    for (int64_t c = 0; c < kb; c++)
        if (lk_mla_span_nonfinite(row_at(dt, V, c, ldv), dt, Dv, 1)) return 1;
    return 0;
}

/* 1 when q . k (D dims of dt, summed again in f32) is -inf: tells a key scored -inf from
 * one whose weight exp(s - m) only underflowed to 0 */
static int scored_neginf(lk_dtype dt, const void *q, const void *k, int64_t D) {
    float s = 0.0f;
    for (int64_t d = 0; d < D; d++) s += lk_load_f(q, dt, d) * lk_load_f(k, dt, d);
    return s == -INFINITY;
}

/* one block of kb keys for rows [r0, nq): S, softmax step, O += P V. When V holds an inf
 * or NaN, P V skips the keys of weight 0 that never count (hidden by the causal mask, or
 * scored -inf): 0 * inf would make the row NaN (as flash_attn); a visible key of finite
 * score whose weight underflowed to 0 does count (0 * inf = NaN, as flash_attn's SIMD
 * path: docs/numerics.md). That block's P V is then a plain loop in f32 (rare:
 * non-finite values), blocks of finite values keep the one GEMM. */
static lk_status key_block(lk_dtype dt, const void *Q, int64_t ldq, int64_t r0, int64_t nq, int64_t Dqk,
                           int64_t Dv, const void *K, int64_t ldk, const void *V, int64_t ldv, int64_t kb,
                           int causal, int64_t lim0, float *S, uint16_t *P16, float *O, int64_t ldo,
                           lk_online_state *st) {
    int64_t n = nq - r0;
    lk_status s = lk_mla_gemm(dt, 1, n, kb, Dqk, row_at(dt, Q, r0, ldq), ldq, K, ldk, 0, S, LK_MLA_KB);
    if (s) return s;
    uint16_t *P = dt == LK_BF16 ? P16 : NULL;
    lk_mla_softmax_args sa = {S, LK_MLA_KB, n, kb, causal, lim0 + r0, st + r0, O + r0 * ldo, ldo, Dv, P, LK_MLA_KB};
    lk_kernels()->mla_softmax_block(&sa);
    if (!nonfinite_rows(dt, V, ldv, kb, Dv))
        return lk_mla_gemm(dt, 0, n, Dv, kb, P ? (const void *)P : S, LK_MLA_KB, V, ldv, 1, O + r0 * ldo, ldo);
    for (int64_t i = 0; i < n; i++) {
        float *o = O + (r0 + i) * ldo; // [Dv]
        for (int64_t c = 0; c < kb; c++) {
            float p = P ? lk_bf16_to_f32(P[i * LK_MLA_KB + c]) : S[i * LK_MLA_KB + c];
            if (p == 0.0f && ((causal && c > lim0 + r0 + i) ||
                              scored_neginf(dt, row_at(dt, Q, r0 + i, ldq), row_at(dt, K, c, ldk), Dqk)))
                continue;
            const void *vr = row_at(dt, V, c, ldv);
            for (int64_t d = 0; d < Dv; d++)
                o[d] += p * (dt == LK_BF16 ? lk_bf16_to_f32(((const uint16_t *)vr)[d]) : ((const float *)vr)[d]);
        }
    }
    return LK_OK;
}

lk_status lk_mla_online_attn(lk_dtype dt, const void *Q, int64_t ldq, int64_t nq, int64_t Dqk, int64_t Dv,
                             const lk_mla_segment *pre, int64_t npre, const lk_mla_segment *cur, float *S,
                             uint16_t *P16, void *panel, float *O, int64_t ldo, lk_online_state *st, int init) {
    size_t es = lk_esize(dt);
    for (int64_t r = 0; r < nq && init; r++) {
        st[r] = lk_online_init();
        for (int64_t d = 0; d < Dv; d++) O[r * ldo + d] = 0.0f;
    }
    /* prefix: blocks of the logical key sequence; a block spanning runs is copied into
     * the panel (rows K then V, or the shared rows once when V aliases K) */
    int64_t total = 0, ri = 0, off = 0; /* run index and offset of the next key */
    for (int64_t g = 0; g < npre; g++) total += pre[g].n;
    int shared = npre && pre[0].V == pre[0].K && pre[0].ldv == pre[0].ldk;
    int64_t W = shared ? (Dqk > Dv ? Dqk : Dv) : 0;
    for (int64_t j = 0; j < total; j += LK_MLA_KB) {
        int64_t kb = total - j < LK_MLA_KB ? total - j : LK_MLA_KB;
        while (off == pre[ri].n) ri++, off = 0;
        const lk_mla_segment *sg = &pre[ri];
        const void *K = row_at(dt, sg->K, off, sg->ldk), *V = row_at(dt, sg->V, off, sg->ldv);
        int64_t ldk = sg->ldk, ldv = sg->ldv;
        if (off + kb <= sg->n) {
            off += kb;
        } else {
            char *Kc = panel, *Vc = shared ? Kc : Kc + LK_MLA_KB * Dqk * es;
            ldk = shared ? W : Dqk, ldv = shared ? W : Dv;
            for (int64_t c = 0; c < kb; c++, off++) {
                while (off == pre[ri].n) ri++, off = 0;
                const lk_mla_segment *q = &pre[ri];
                memcpy(Kc + c * ldk * es, row_at(dt, q->K, off, q->ldk), es * (size_t)(shared ? W : Dqk));
                if (!shared) memcpy(Vc + c * ldv * es, row_at(dt, q->V, off, q->ldv), es * (size_t)Dv);
            }
            K = Kc, V = Vc;
        }
        lk_status s = key_block(dt, Q, ldq, 0, nq, Dqk, Dv, K, ldk, V, ldv, kb, 0, 0, S, P16, O, ldo, st);
        if (s) return s;
    }
    if (!cur) return LK_OK;
    /* current keys: those every row sees ([0, full)) in blocks, then the diagonal in
     * chunks of LK_MLA_KD keys, each for the rows from the first one that sees its first
     * key */
    int64_t full = cur->lim0 + 1 < 0 ? 0 : cur->lim0 + 1 < cur->n ? cur->lim0 + 1 : cur->n;
    for (int64_t j = 0; j < full; j += LK_MLA_KB) {
        int64_t kb = full - j < LK_MLA_KB ? full - j : LK_MLA_KB;
        lk_status s = key_block(dt, Q, ldq, 0, nq, Dqk, Dv, row_at(dt, cur->K, j, cur->ldk), cur->ldk,
                                row_at(dt, cur->V, j, cur->ldv), cur->ldv, kb, 0, 0, S, P16, O, ldo, st);
        if (s) return s;
    }
    for (int64_t j = full; j < cur->n; j += LK_MLA_KD) {
        int64_t kb = cur->n - j < LK_MLA_KD ? cur->n - j : LK_MLA_KD, r0 = j - cur->lim0;
        if (r0 >= nq) break;
        lk_status s = key_block(dt, Q, ldq, r0 < 0 ? 0 : r0, nq, Dqk, Dv, row_at(dt, cur->K, j, cur->ldk), cur->ldk,
                                row_at(dt, cur->V, j, cur->ldv), cur->ldv, kb, 1, cur->lim0 - j, S, P16, O, ldo,
                                st);
        if (s) return s;
    }
    return LK_OK;
}

int64_t lk_mla_prefix_segments(const lk_mla_args *a, const lk_mla_plan *p, int64_t b, lk_dtype dt, const void *K,
                               int64_t ldk, const void *V, int64_t ldv, lk_mla_segment *seg) {
    const int32_t *pt = p->ptable + b * a->max_pages;
    int64_t P = a->prefix[b], bs = p->bs, np = (P + bs - 1) / bs, n = 0;
    for (int64_t i = 0; i < np;) {
        int64_t run = 1;
        while (i + run < np && pt[i + run] == pt[i] + run) run++;
        int64_t keys = (P < (i + run) * bs ? P : (i + run) * bs) - i * bs, row0 = (int64_t)pt[i] * bs;
        seg[n++] = (lk_mla_segment){row_at(dt, K, row0, ldk), row_at(dt, V, row0, ldv), ldk, ldv, keys, 0, 0};
        i += run;
    }
    return n;
}
