/*
 * merge_attn_states (N-way; the 2-way op is n = 2), scalar reference.
 *
 * Per (token t, head h), with the rules of src/common/attn_state.h (row weights and
 * out_lse through src/cpu/merge_row.h, shared with the SIMD kernels):
 *   m   = max over states with finite lse_i[t, h]
 *   c_i = exp(lse_i - m) / sum_k exp(lse_k - m)        (0 for an empty state)
 *   out[t, h, :] = sum_i c_i * states_i[t, h, :]       (f32 FMA chain in state order, as
 *                                                       the SIMD kernels; empty states
 *                                                       are not read)
 *   out_lse[t, h] = m + log(sum_k exp(lse_k - m))
 * All LSEs empty: out 0, out_lse -inf. A NaN LSE: out NaN, out_lse NaN.
 *
 * Shapes: out, states_i [T, H, D] (each its own float dtype, any strides);
 * lses_i, out_lse [T, H] f32, any strides. One rounding to out's dtype per element; an
 * fp8 out (lk_merge_attn_states_scaled) stores fp8(value / out_scale).
 * No threads.
 */
#include <math.h>

#include "../../core/half.h"
#include "../fp8_quant.h"
#include "../merge_row.h"

lk_status lk_ref_merge_attn_states(const lk_merge_args *a) {
    const lk_tensor *out = &a->out;
    int64_t T = out->shape[0], H = out->shape[1], D = out->shape[2], os = out->stride[2];
    int fp8 = out->dtype == LK_F8E4M3 || out->dtype == LK_F8E5M2;
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++) {
            lk_merge_row row;
            lk_merge_row_init(&row, a, t, h); /* also writes out_lse[t, h] */
            if (D == 0) continue;
            void *orow = lk_merge_row_ptr(out, t, h); // [D] stride os
            for (int64_t d = 0; d < D; d++) {
                float acc = row.kind == LK_MERGE_NAN ? NAN : 0.0f;
                for (int i = 0; row.kind == LK_MERGE_NORMAL && i < a->n; i++) {
                    const lk_tensor *s = &a->states[i];
                    float lse = lk_merge_lse_at(&a->lses[i], t, h);
                    if (lk_lse_empty(lse)) continue;
                    const void *srow = lk_merge_row_ptr(s, t, h); // [D] stride s->stride[2]
                    acc = fmaf(lk_merge_row_coef(&row, i, lse), lk_load_f(srow, s->dtype, d * s->stride[2]), acc);
                }
                if (fp8) lk_q_store(orow, out->dtype, d * os, acc / a->out_scale);
                else lk_store_f(orow, out->dtype, d * os, acc);
            }
        }
    return LK_OK;
}
