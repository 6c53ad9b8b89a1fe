/*
 * MLA prefix prefill, strategy concat (the seeds' per-request BSND path).
 *
 *   Kp, Vp = project(gather(prefix pages))             uniform pages, see mla.h
 *   Kc [sum(P_b + Q_b), H, Dqk], Vc [.., H, Dv] (f32): per request b its P_b projected
 *        prefix rows (through the plan's page table) then its Q_b new rows k, v
 *   out = flash_attn(q, Kc, Vc) causal (bottom-right: the prefix is visible to all)
 * Work split: the copy over concatenated rows (lk_parallel_for), then the kernels.
 */
#include <stdlib.h>
#include <string.h>

#include "../../core/half.h"
#include "mla.h"

typedef struct {
    const lk_mla_args *a;
    const lk_mla_plan *p;
    const float *Kp, *Vp;
    float *Kc, *Vc;
    const int32_t *kstart; /* [B + 1] first concatenated row of each request */
} cat_ctx;

/* row `row` of a [T, H, D] view into dst [H * D] as f32 */
static void load_row(const lk_tensor *t, int64_t row, float *dst) {
    int64_t H = t->shape[1], D = t->shape[2];
    for (int64_t h = 0; h < H; h++)
        for (int64_t d = 0; d < D; d++)
            dst[h * D + d] = lk_load_f(t->data, t->dtype, row * t->stride[0] + h * t->stride[1] + d * t->stride[2]);
}

static void cat_rows(void *vctx, int64_t r0, int64_t r1) {
    const cat_ctx *c = vctx;
    const lk_mla_args *a = c->a;
    int64_t HK = a->H * (a->Dn + a->Dr), HV = a->H * a->Dv, bs = c->p->bs, b = 0;
    while (c->kstart[b + 1] <= r0) b++;
    for (int64_t r = r0; r < r1; r++) {
        while (c->kstart[b + 1] <= r) b++;
        int64_t j = r - c->kstart[b], P = a->prefix[b];
        float *kd = c->Kc + r * HK, *vd = c->Vc + r * HV;
        if (j < P) {
            int64_t src = (int64_t)c->p->ptable[b * a->max_pages + j / bs] * bs + j % bs;
            memcpy(kd, c->Kp + src * HK, sizeof(float) * (size_t)HK);
            memcpy(vd, c->Vp + src * HV, sizeof(float) * (size_t)HV);
        } else {
            load_row(&a->k, a->cu_q[b] + j - P, kd);
            load_row(&a->v, a->cu_q[b] + j - P, vd);
        }
    }
}

lk_status lk_mla_concat(const lk_mla_args *a, const lk_mla_plan *p) {
    float *Kp = NULL, *Vp = NULL;
    lk_status s = p->pages ? lk_mla_project_prefix(a, p, 0, &Kp, &Vp) : LK_OK;
    if (s) return s;
    int64_t B = a->B, Dqk = a->Dn + a->Dr;
    int32_t *kstart = malloc(sizeof(int32_t) * (size_t)(2 * B + 2));
    if (!kstart) return LK_ERR_NOMEM;
    int32_t *klen = kstart + B + 1;
    kstart[0] = 0;
    for (int64_t b = 0; b < B; b++) {
        int32_t ql = a->cu_q[b + 1] - a->cu_q[b];
        klen[b] = ql ? a->prefix[b] + ql : 0;
        kstart[b + 1] = kstart[b] + klen[b];
    }
    int64_t rows = kstart[B];
    float *Kc = lk_mla_ws_get(a, 3, sizeof(float) * (size_t)(rows * a->H * (Dqk + a->Dv)));
    if (!Kc) s = LK_ERR_NOMEM;
    if (!s) {
        cat_ctx c = {a, p, Kp, Vp, Kc, Kc + rows * a->H * Dqk, kstart};
        lk_parallel_for(rows, a->H * (Dqk + a->Dv) * 8, cat_rows, &c);
        lk_trace_item("concat_copy rows=%lld H=%lld D=%lld/%lld", (long long)rows, (long long)a->H,
                      (long long)Dqk, (long long)a->Dv);
        lk_attn_args fa;
        memset(&fa, 0, sizeof fa);
        fa.out = a->out;
        fa.q = a->q;
        fa.kc = (lk_paged){Kc, LK_F32, LK_KV_ND, 1, rows, a->H, Dqk, 0, a->H * Dqk, Dqk, 1, 16};
        fa.vc = (lk_paged){c.Vc, LK_F32, LK_KV_ND, 1, rows, a->H, a->Dv, 0, a->H * a->Dv, a->Dv, 1, 16};
        fa.cu_q = a->cu_q, fa.k_start = kstart, fa.k_len = klen;
        fa.B = B, fa.Hq = a->H, fa.Hk = a->H, fa.Dqk = Dqk, fa.Dv = a->Dv;
        fa.scale = a->scale, fa.wl = -1, fa.wr = 0;
        s = lk_kernels()->flash_attn(&fa);
        lk_trace_item("flash_concat causal keys=%lld H=%lld D=%lld/%lld", (long long)rows, (long long)a->H,
                      (long long)Dqk, (long long)a->Dv);
    }
    free(kstart);
    return s;
}
