/*
 * MLA prefix prefill, strategy split + merge (the seeds' two-attention path).
 *
 *   Kp, Vp = project(gather(prefix pages))           uniform pages, see mla.h
 *   (o1, lse1) = flash_attn(q, Kp, Vp) over each request's prefix, no mask (paged, the
 *                plan's page table; an empty prefix gives o1 = 0, lse1 = -inf)
 *   (o2, lse2) = flash_attn(q, k, v) causal over the request's own new tokens
 *   out = merge_attn_states((o1, lse1), (o2, lse2))  (attn_state.h rules, f32)
 * Both partial states are f32 [T, H, Dv]; the merge rounds once to out's dtype. Without
 * any prefix to attend to the causal attention writes out directly.
 * Work split: inside the kernels (projection groups, flash_attn tiles, merge rows).
 */
#include <stdlib.h>
#include <string.h>

#include "mla.h"

lk_status lk_mla_split_merge(const lk_mla_args *a, const lk_mla_plan *p) {
    if (p->pages == 0) return lk_mla_attn_current(a, &a->out, NULL);
    float *Kp, *Vp;
    lk_status s = lk_mla_project_prefix(a, p, 0, &Kp, &Vp);
    if (s) return s;
    int64_t TH = a->T * a->H, Dqk = a->Dn + a->Dr, bs = p->bs;
    float *o = lk_mla_ws_get(a, 3, sizeof(float) * (size_t)(2 * TH * a->Dv + 2 * TH));
    if (!o) return LK_ERR_NOMEM;
    float *o2 = o + TH * a->Dv, *lse1 = o2 + TH * a->Dv, *lse2 = lse1 + TH;
    int64_t oshape[3] = {a->T, a->H, a->Dv}, lshape[2] = {a->T, a->H};
    lk_attn_args fa;
    memset(&fa, 0, sizeof fa);
    fa.out = lk_tensor_make(o, LK_F32, 3, oshape);
    fa.lse = lk_tensor_make(lse1, LK_F32, 2, lshape);
    fa.has_lse = 1;
    fa.q = a->q;
    fa.kc = (lk_paged){Kp, LK_F32, LK_KV_ND, p->pages, bs, a->H, Dqk, bs * a->H * Dqk, a->H * Dqk, Dqk, 1, 16};
    fa.vc = (lk_paged){Vp, LK_F32, LK_KV_ND, p->pages, bs, a->H, a->Dv, bs * a->H * a->Dv, a->H * a->Dv, a->Dv, 1, 16};
    fa.cu_q = a->cu_q, fa.k_len = a->prefix, fa.table = p->ptable, fa.table_stride = a->max_pages;
    fa.B = a->B, fa.Hq = a->H, fa.Hk = a->H, fa.Dqk = Dqk, fa.Dv = a->Dv;
    fa.scale = a->scale, fa.wl = -1, fa.wr = -1;
    s = lk_kernels()->flash_attn(&fa);
    lk_trace_item("flash_prefix paged pages=%lld H=%lld D=%lld/%lld", (long long)p->pages, (long long)a->H,
                  (long long)Dqk, (long long)a->Dv);
    lk_tensor o2t = lk_tensor_make(o2, LK_F32, 3, oshape);
    if (!s) s = lk_mla_attn_current(a, &o2t, lse2);
    if (!s) s = lk_mla_merge(a, o, lse1, o2, lse2);
    return s;
}
