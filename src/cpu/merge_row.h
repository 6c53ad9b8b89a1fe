/*
 * The per-(token, head) part of merge_attn_states, shared by the ref kernel and the
 * SIMD source (src/cpu/simd/merge.c) so that every ISA agrees bit for bit on it: the row's weights and out_lse (maths and
 * -inf / NaN rules from src/common/attn_state.h), and the list of non-empty states with
 * their coefficients. Only the D-long weighted sum differs per ISA.
 *
 *   m = max finite lse_i[t, h]; w_i = exp(lse_i - m) (0 if empty); wsum = sum w_i
 *   c_i = w_i / wsum; out_lse[t, h] = m + log(wsum)
 */
#ifndef LK_MERGE_ROW_H
#define LK_MERGE_ROW_H

#include <math.h>

#include "../common/attn_state.h"
#include "kernels.h"

/* states gathered per group (SIMD kernels sum one group in registers); also the number
 * of weights kept from the wsum pass so that their expf is not evaluated twice */
#define LK_MERGE_GROUP 16

typedef struct {
    float m, wsum;
    lk_merge_kind kind;
    float w0[LK_MERGE_GROUP]; /* w_i of states [0, min(n, LK_MERGE_GROUP)) */
} lk_merge_row;

typedef struct {
    int n;
    const char *p[LK_MERGE_GROUP]; /* start of the state's row [D] */
    lk_dtype dt[LK_MERGE_GROUP];
    int64_t es[LK_MERGE_GROUP];    /* element size */
    float c[LK_MERGE_GROUP];       /* coefficient c_i */
} lk_merge_group;

static inline float lk_merge_lse_at(const lk_tensor *l, int64_t t, int64_t h) {
    return ((const float *)l->data)[t * l->stride[0] + h * l->stride[1]]; // [T, H]
}

/* row start of tensor v ([T, H, D]) at (t, h) */
static inline char *lk_merge_row_ptr(const lk_tensor *v, int64_t t, int64_t h) {
    return (char *)v->data + (t * v->stride[0] + h * v->stride[1]) * lk_esize(v->dtype);
}

/* weights of row (t, h); writes out_lse[t, h] when requested */
static inline void lk_merge_row_init(lk_merge_row *r, const lk_merge_args *a, int64_t t, int64_t h) {
    r->m = -INFINITY;
    r->wsum = 0.0f;
    for (int i = 0; i < a->n; i++) r->m = lk_lse_fold_max(r->m, lk_merge_lse_at(&a->lses[i], t, h));
    r->kind = lk_merge_classify(r->m);
    if (r->kind == LK_MERGE_NORMAL)
        for (int i = 0; i < a->n; i++) {
            float w = lk_lse_weight(lk_merge_lse_at(&a->lses[i], t, h), r->m);
            if (i < LK_MERGE_GROUP) r->w0[i] = w;
            r->wsum += w;
        }
    if (a->has_out_lse) {
        float *ol = a->out_lse.data; // [T, H]
        ol[t * a->out_lse.stride[0] + h * a->out_lse.stride[1]] = lk_merge_lse(r->m, r->wsum);
    }
}

/* c_i = lk_merge_coef(lse_i, m, wsum) of a NORMAL row, reusing the stored weight */
static inline float lk_merge_row_coef(const lk_merge_row *r, int i, float lse) {
    return (i < LK_MERGE_GROUP ? r->w0[i] : lk_lse_weight(lse, r->m)) / r->wsum;
}

/* gather the next up to LK_MERGE_GROUP non-empty states of a NORMAL row, from state *i
 * on, into g (*i advances past them); g->n == 0 when none is left */
static inline void lk_merge_next_group(const lk_merge_args *a, const lk_merge_row *r, int64_t t,
                                       int64_t h, int *i, lk_merge_group *g) {
    g->n = 0;
    for (; *i < a->n && g->n < LK_MERGE_GROUP; (*i)++) {
        float lse = lk_merge_lse_at(&a->lses[*i], t, h);
        if (lk_lse_empty(lse)) continue;
        const lk_tensor *s = &a->states[*i];
        g->p[g->n] = lk_merge_row_ptr(s, t, h);
        g->dt[g->n] = s->dtype;
        g->es[g->n] = lk_esize(s->dtype);
        g->c[g->n] = lk_merge_row_coef(r, *i, lse);
        g->n++;
    }
}

#endif
