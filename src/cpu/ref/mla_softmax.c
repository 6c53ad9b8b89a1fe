/*
 * mla_softmax_block, scalar reference: the online-softmax step of one key block of the
 * fused MLA prefill (src/cpu/mla/fused.c), contract in kernels.h.
 *
 * For each of the nq rows r (scores S[r, 0:kb]):
 *   causal: S[r, c] = -inf for c > lim0 + r
 *   m_b = max_c S[r, c] (NaN sticks), alpha = lk_online_rescale(&st[r], m_b)
 *   S[r, c] = exp(S[r, c] - lk_online_shift(st[r].m)), l += sum_c S[r, c]
 *   O[r, 0:Dv] *= alpha
 *   P16 given: P16[r, c] = bf16(S[r, c]) (RNE), the sum taken over the f32 values
 * Special values follow from the arithmetic: a NaN score or a +inf one (inf - inf)
 * makes l and so the row NaN; -inf scores (masked) get weight 0. No threads.
 */
#include <math.h>

#include "../../core/half.h"
#include "../kernels.h"

lk_status lk_ref_mla_softmax_block(const lk_mla_softmax_args *a) {
    for (int64_t r = 0; r < a->nq; r++) {
        float *s = a->S + r * a->lds; // [kb]
        if (a->causal)
            for (int64_t c = a->lim0 + r + 1 < 0 ? 0 : a->lim0 + r + 1; c < a->kb; c++) s[c] = -INFINITY;
        float bmax = -INFINITY;
        for (int64_t c = 0; c < a->kb; c++) bmax = lk_nanmax(bmax, s[c]);
        float alpha = lk_online_rescale(&a->st[r], bmax), shift = lk_online_shift(a->st[r].m), sum = 0.0f;
        for (int64_t c = 0; c < a->kb; c++) {
            s[c] = expf(s[c] - shift);
            sum += s[c];
            if (a->P16) a->P16[r * a->ldp + c] = lk_f32_to_bf16(s[c]);
        }
        lk_online_add(&a->st[r], sum);
        if (alpha != 1.0f) {
            float *o = a->O + r * a->ldo; // [Dv]
            for (int64_t d = 0; d < a->Dv; d++) o[d] *= alpha;
        }
    }
    return LK_OK;
}
