/*
 * Attention-state maths: THE one place for log-sum-exp (LSE) arithmetic and its
 * -inf / +inf / NaN rules. Shared by the merge kernels, causal softmax, and later flash
 * attention and MLA prefill; header-only scalar code, usable from C and (through
 * LK_HOSTDEV, empty in C) from CUDA device code.
 *
 * An attention state of one (token, head) is (o, lse): o = sum_j p_j v_j / sum_j p_j
 * over the keys it saw, lse = log(sum_j exp(s_j)) (natural log, f32). A state that saw no
 * key is EMPTY: o = 0, lse = -inf.
 *
 * 1. Merging n states (merge_attn_states, split-KV / cascade / MLA split + merge):
 *
 *      m   = max over states with finite lse          (lk_lse_fold_max)
 *      w_i = exp(lse_i - m), 0 for an empty state      (lk_lse_weight)
 *      out = sum_i w_i o_i / sum_i w_i                 (coefficients lk_merge_coef)
 *      lse = m + log(sum_i w_i)                        (lk_merge_lse)
 *
 *    Rules: a state whose lse is +inf or -inf counts as empty (weight 0; its o is never
 *    read, so garbage there cannot leak). All states empty: out = 0, lse = -inf. A NaN
 *    lse anywhere: out = NaN, lse = NaN (lk_merge_classify tells the three cases apart).
 *    No overflow for any finite lse: w_i <= 1, the max state has w = 1 exactly, so
 *    sum w_i is in [1, n]; lse_i - m may round to -inf, whose exp is 0.
 *
 * 2. Softmax over one row of scores / online softmax (flash attention):
 *
 *      state (m, l): m = running max of the scores seen, l = sum exp(s - shift(m))
 *      lk_online_rescale folds a block with max bmax: m' = max(m, bmax) (NaN sticks),
 *        returns alpha = exp(m - m') by which the caller rescales its accumulator
 *        (l is rescaled here); alpha = 1 when m does not change (also -inf -> -inf).
 *      lk_online_shift(m): what to subtract from scores before exp: m, or 0 while
 *        m = -inf (no visible key so far: exp(-inf - 0) = 0 instead of exp(NaN)).
 *      lk_softmax_inv(l): 1 / l, or 0 when l = 0 (no visible key: output zeros).
 *      lk_online_lse(m, l): m + log(l), or -inf when l = 0.
 *
 *    Rules: -inf scores get weight 0; a row whose visible scores are all -inf (or that
 *    sees no key) gives zeros and lse -inf, never NaN. A NaN score makes the row NaN
 *    (through the sum l, even where the max skipped it). A +inf score makes the row
 *    NaN (+inf - +inf), as torch.softmax does.
 */
#ifndef LK_ATTN_STATE_H
#define LK_ATTN_STATE_H

#include <math.h>

#ifndef LK_HOSTDEV
#if defined(__CUDACC__)
#define LK_HOSTDEV __host__ __device__
#else
#define LK_HOSTDEV
#endif
#endif

/* ---------------------------------------------------------------- merge */

/* 1 if a state with this lse is empty (lse = +inf or -inf). */
LK_HOSTDEV static inline int lk_lse_empty(float lse) { return isinf(lse); }

/* One step of m = max over finite lses, started at -INFINITY: empty lses are skipped,
 * a NaN makes (and keeps) m NaN. Result: NaN if any lse is NaN, -inf if all states are
 * empty, else the largest finite lse. Order-independent. */
LK_HOSTDEV static inline float lk_lse_fold_max(float m, float lse) {
    if (isnan(m) || isnan(lse)) return NAN;
    if (isinf(lse)) return m;
    return lse > m ? lse : m;
}

/* Weight exp(lse - m) of a state relative to the fold max m (finite); 0 if empty.
 * In [0, 1]; exactly 1 for the max state (expf(0), without the call). */
LK_HOSTDEV static inline float lk_lse_weight(float lse, float m) {
    return isinf(lse) ? 0.0f : lse == m ? 1.0f : expf(lse - m);
}

typedef enum { LK_MERGE_NORMAL = 0, LK_MERGE_EMPTY = 1, LK_MERGE_NAN = 2 } lk_merge_kind;

/* What a merged row is, from its fold max m: NaN (out = NaN, lse = NaN), all empty
 * (out = 0, lse = -inf), or normal (weights below). */
LK_HOSTDEV static inline lk_merge_kind lk_merge_classify(float m) {
    if (isnan(m)) return LK_MERGE_NAN;
    if (m == -INFINITY) return LK_MERGE_EMPTY;
    return LK_MERGE_NORMAL;
}

/* Coefficient of state i in out = sum_i c_i o_i for a NORMAL row with fold max m and
 * wsum = sum_i lk_lse_weight(lse_i, m) (>= 1): c_i = w_i / wsum, 0 for an empty state. */
LK_HOSTDEV static inline float lk_merge_coef(float lse, float m, float wsum) {
    return lk_lse_weight(lse, m) / wsum;
}

/* Merged lse: m + log(wsum); NaN if m is NaN; -inf if all states are empty. */
LK_HOSTDEV static inline float lk_merge_lse(float m, float wsum) {
    lk_merge_kind k = lk_merge_classify(m);
    if (k == LK_MERGE_NAN) return NAN;
    if (k == LK_MERGE_EMPTY) return -INFINITY;
    return m + logf(wsum);
}

/* The whole rule for n LSEs in a contiguous array: fold max, weight sum, merged lse,
 * and (if c != NULL) the n coefficients c_i (all 0 unless the row is NORMAL).
 * Returns the row kind. For callers whose LSEs are not strided (CUDA, MLA prefill);
 * the CPU merge kernels walk strided LSE views with the step functions above. */
LK_HOSTDEV static inline lk_merge_kind lk_merge_weights(const float *lse, int n, float *c,
                                                        float *lse_out) {
    float m = -INFINITY, wsum = 0.0f;
    for (int i = 0; i < n; i++) m = lk_lse_fold_max(m, lse[i]);
    lk_merge_kind k = lk_merge_classify(m);
    if (k == LK_MERGE_NORMAL)
        for (int i = 0; i < n; i++) wsum += lk_lse_weight(lse[i], m);
    if (c)
        for (int i = 0; i < n; i++) c[i] = k == LK_MERGE_NORMAL ? lk_merge_coef(lse[i], m, wsum) : 0.0f;
    if (lse_out) *lse_out = lk_merge_lse(m, wsum);
    return k;
}

/* ---------------------------------------------------------------- softmax / online */

/* max(a, b) where a NaN in either gives NaN. */
LK_HOSTDEV static inline float lk_nanmax(float a, float b) {
    if (isnan(a) || isnan(b)) return NAN;
    return a > b ? a : b;
}

/* Value subtracted from scores before exp: m, or 0 while m = -inf. */
LK_HOSTDEV static inline float lk_online_shift(float m) { return m == -INFINITY ? 0.0f : m; }

/* 1 / l, or 0 when l = 0 (the row saw no key or only -inf scores); NaN stays NaN. */
LK_HOSTDEV static inline float lk_softmax_inv(float l) { return l == 0.0f ? 0.0f : 1.0f / l; }

/* A softmax row (over its visible scores) is NaN when a score is NaN, or +inf
 * (+inf - +inf): every visible output is then NaN. m = max of the scores with NaNs
 * skipped, any_nan = whether one was NaN. Kernels that test this up front may use an
 * exp for arguments <= 0 only. */
LK_HOSTDEV static inline int lk_softmax_row_nan(float m, int any_nan) {
    return any_nan || m == INFINITY;
}

/* Online softmax state of one query row. */
typedef struct {
    float m; /* running max of the scores seen (-inf: none visible yet) */
    float l; /* sum of exp(s - lk_online_shift(m)) over the scores seen */
} lk_online_state;

LK_HOSTDEV static inline lk_online_state lk_online_init(void) {
    lk_online_state s = {-INFINITY, 0.0f};
    return s;
}

/* Start a block whose max score is bmax (-inf if fully masked): updates m, rescales l,
 * returns alpha for the caller's output accumulator (acc *= alpha). Then the caller
 * adds p_j = exp(s_j - lk_online_shift(st->m)) into l (lk_online_add) and p_j v_j into
 * acc. */
LK_HOSTDEV static inline float lk_online_rescale(lk_online_state *st, float bmax) {
    float mn = lk_nanmax(st->m, bmax);
    float alpha = mn == st->m ? 1.0f : expf(st->m - mn); /* -inf -> finite: 0; NaN: NaN */
    st->m = mn;
    st->l *= alpha;
    return alpha;
}

LK_HOSTDEV static inline void lk_online_add(lk_online_state *st, float psum) { st->l += psum; }

/* LSE of the row: m + log(l), -inf when the row saw no key, NaN if any score was NaN. */
LK_HOSTDEV static inline float lk_online_lse(lk_online_state st) {
    if (isnan(st.l) || isnan(st.m)) return NAN;
    if (st.l == 0.0f) return -INFINITY;
    return lk_online_shift(st.m) + logf(st.l);
}

#endif
