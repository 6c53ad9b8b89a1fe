/*
 * flash_attn_varlen, scalar reference.
 *
 * For request b with queries [cu_q[b], cu_q[b+1]) (q_len) and k_len[b] keys, query
 * head h (KV head h / (Hq / Hk)), query i:
 *   s_j = scale * q_i . k_j             for keys j in the visible window of i
 *   s_j = softcap * tanh(s_j / softcap) if softcap > 0
 *   s_j -= slope[b, h] * |i + k_len - q_len - j|   with ALiBi slopes
 *   out_i = sum_j softmax(s)_j v_j,  lse_i = log(sum_j exp(s_j))   (natural log)
 * fp8 q / K / V (since 0.3): every value is the dequantized f32(code) * descale of its
 * (request, KV head): the dot is taken on the codes' values and multiplied by
 * q_descale * k_descale with the scale, the output sum by v_descale.
 * A row that sees no key gets out = 0 and lse = -inf; query rows outside every request
 * (padding) likewise. An fp8 out (lk_flash_attn_varlen_scaled) stores
 * fp8(value / out_scale): value the f32 a float out would round, one f32 division, then
 * the src/core/fp8.h converter (so those rows get code 0). Two passes over the scores (max, then exp-sum and PV); dot
 * products and sums in double. Keys are addressed through lk_attn_key_off, so dense,
 * paged ND and paged NZ K/V are the same loop. No threads.
 */
#include <math.h>
#include <stdlib.h>

#include "../../core/half.h"
#include "../kernels.h"

static void store_row(const lk_attn_args *a, int64_t t, int64_t h, const double *acc, double l,
                      double m, double vd) {
    const lk_tensor *o = &a->out;
    int fp8 = lk_is_fp8(o->dtype);
    for (int64_t d = 0; d < a->Dv; d++) {
        float v = l > 0 || isnan(l) ? (float)(vd * acc[d] / l) : 0.0f;
        if (fp8) v = v / a->out_scale; /* f32 division, then the fp8 conversion of the store */
        lk_store_f(o->data, o->dtype, t * o->stride[0] + h * o->stride[1] + d * o->stride[2], v);
    }
    if (a->has_lse) {
        float lse = l > 0 || isnan(l) ? (float)(m + log(l)) : -INFINITY;
        ((float *)a->lse.data)[t * a->lse.stride[0] + h * a->lse.stride[1]] = lse;
    }
}

lk_status lk_ref_flash_attn(const lk_attn_args *a) {
    int64_t maxk = 1;
    for (int64_t b = 0; b < a->B; b++)
        if (a->k_len[b] > maxk) maxk = a->k_len[b];
    double *s = malloc(sizeof(double) * (size_t)maxk);        // [k_len]
    double *acc = calloc((size_t)a->Dv, sizeof(double));        // [Dv]
    if (!s || !acc) {
        free(s);
        free(acc);
        return LK_ERR_NOMEM;
    }
    const lk_tensor *q = &a->q;
    int64_t Tq = q->shape[0], G = a->Hq / a->Hk;
    /* padding rows first: every row outside [cu_q[0], cu_q[B]) */
    for (int64_t t = 0; t < Tq; t++) {
        if (t >= a->cu_q[0] && t < a->cu_q[a->B]) continue;
        for (int64_t h = 0; h < a->Hq; h++) store_row(a, t, h, acc, 0.0, 0.0, 1.0);
    }
    for (int64_t b = 0; b < a->B; b++) {
        int64_t q0 = a->cu_q[b], q_len = a->cu_q[b + 1] - q0, k_len = a->k_len[b];
        for (int64_t i = 0; i < q_len; i++) {
            int64_t lo, hi;
            lk_attn_window(a, i, q_len, k_len, &lo, &hi);
            for (int64_t h = 0; h < a->Hq; h++) {
                int64_t kh = h / G;
                double qk_scale = (double)a->scale * (double)lk_attn_desc(&a->qd, b, kh) *
                                  (double)lk_attn_desc(&a->kd, b, kh);
                const char *qrow = (const char *)q->data; // [Dqk] at (q0 + i, h)
                int64_t qoff = (q0 + i) * q->stride[0] + h * q->stride[1];
                double m = -INFINITY, l = 0.0;
                for (int64_t j = lo; j <= hi; j++) {
                    double dot = 0.0;
                    for (int64_t d = 0; d < a->Dqk; d++)
                        dot += (double)lk_load_f(qrow, q->dtype, qoff + d * q->stride[2]) *
                               (double)lk_load_f(a->kc.data, a->kc.dtype, lk_attn_key_off(a, &a->kc, b, j, kh, d));
                    double sc = dot * qk_scale;
                    if (a->softcap > 0) sc = (double)a->softcap * tanh(sc / (double)a->softcap);
                    if (a->alibi) /* ALiBi: -slope * |i + k_len - q_len - j| */
                        sc -= (double)a->alibi[b * a->alibi_bstride + h] * (double)llabs(i + k_len - q_len - j);
                    s[j] = sc;
                    if (sc > m || isnan(sc)) m = sc; /* NaN sticks and propagates */
                }
                for (int64_t d = 0; d < a->Dv; d++) acc[d] = 0.0;
                if (lo <= hi && m != -INFINITY) {
                    for (int64_t j = lo; j <= hi; j++) {
                        double p = exp(s[j] - m);
                        l += p;
                        for (int64_t d = 0; d < a->Dv; d++)
                            acc[d] += p * (double)lk_load_f(a->vc.data, a->vc.dtype, lk_attn_key_off(a, &a->vc, b, j, kh, d));
                    }
                }
                store_row(a, q0 + i, h, acc, l, m, (double)lk_attn_desc(&a->vd, b, kh));
            }
        }
    }
    free(s);
    free(acc);
    return LK_OK;
}
