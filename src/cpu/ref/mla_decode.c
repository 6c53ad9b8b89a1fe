/*
 * mla_decode, scalar reference.
 *
 * For request b (n = seqlens[b] cached tokens), query i of s_q, head h:
 *   s_j = scale * q[b, i, h, :] . e_j     for keys j < lim_i (lk_mla_dec_limit: n, or
 *                                         n - s_q + i + 1 when causal)
 *   out[b, i, h, :] = sum_j softmax(s)_j e_j[:Dl],  lse[b, h, i] = log(sum_j exp(s_j))
 * e_j = the cache entry of token j (Dl + Dr dims, one buffer or two; fp8 caches:
 * f32(code) * kscale, the scale applied to the dot products and to out; fp8_ds_mla:
 * latent dim d is f32(f32(code) * the scale of its tile of 128), kscale 1). A row that sees
 * no key gets out = 0 and lse = -inf. Two passes over the scores (max, then exp-sum and
 * P.V); dot products and sums in double. No split, no threads.
 */
#include <math.h>
#include <stdlib.h>

#include "../../core/half.h"
#include "../kernels.h"

/* entry dim e of key j of request b as a float (fp8: the code's value; fp8_ds_mla latent
 * dims times their tile's scale) */
static float dec_load(const lk_mla_decode_args *a, int64_t b, int64_t j, int64_t e) {
    const lk_paged *c = a->one_buffer || e < a->Dl ? &a->lat : &a->rope;
    int64_t off = lk_mla_dec_off(a, b, j, e);
    float v = lk_load_f(c->data, c->dtype, off);
    if (a->ds && e < a->Dl) v *= lk_ds_scale((const char *)c->data + (off - e), a->Dl, e / LK_DS_TILE);
    return v;
}

lk_status lk_ref_mla_decode(const lk_mla_decode_args *a) {
    int64_t maxk = 1, E = a->Dl + a->Dr;
    for (int64_t b = 0; b < a->B; b++)
        if (a->seqlens[b] > maxk) maxk = a->seqlens[b];
    double *s = malloc(sizeof(double) * (size_t)maxk);        // [n]
    double *acc = malloc(sizeof(double) * (size_t)a->Dl);     // [Dl]
    double *qr = malloc(sizeof(double) * (size_t)(E > 0 ? E : 1)); // [Dl + Dr]
    if (!s || !acc || !qr) {
        free(s), free(acc), free(qr);
        return LK_ERR_NOMEM;
    }
    const lk_tensor *q = &a->q, *o = &a->out;
    for (int64_t b = 0; b < a->B; b++)
        for (int64_t i = 0; i < a->s_q; i++) {
            int64_t lim = lk_mla_dec_limit(a, b, i);
            for (int64_t h = 0; h < a->H; h++) {
                int64_t qoff = b * q->stride[0] + i * q->stride[1] + h * q->stride[2];
                for (int64_t e = 0; e < E; e++) qr[e] = lk_load_f(q->data, q->dtype, qoff + e * q->stride[3]);
                double m = -INFINITY, l = 0.0;
                for (int64_t j = 0; j < lim; j++) {
                    double dot = 0.0;
                    for (int64_t e = 0; e < E; e++) dot += qr[e] * (double)dec_load(a, b, j, e);
                    s[j] = dot * (double)a->scale * (double)a->kscale;
                    if (s[j] > m || isnan(s[j])) m = s[j]; /* NaN sticks and propagates */
                }
                for (int64_t d = 0; d < a->Dl; d++) acc[d] = 0.0;
                if (lim > 0 && m != -INFINITY)
                    for (int64_t j = 0; j < lim; j++) {
                        double p = exp(s[j] - m);
                        l += p;
                        for (int64_t d = 0; d < a->Dl; d++)
                            acc[d] += p * (double)dec_load(a, b, j, d);
                    }
                int64_t ooff = b * o->stride[0] + i * o->stride[1] + h * o->stride[2];
                for (int64_t d = 0; d < a->Dl; d++) {
                    float v = l > 0 || isnan(l) ? (float)(acc[d] * (double)a->kscale / l) : 0.0f;
                    lk_store_f(o->data, o->dtype, ooff + d * o->stride[3], v);
                }
                if (a->has_lse) {
                    float lse = l > 0 || isnan(l) ? (float)(m + log(l)) : -INFINITY;
                    ((float *)a->lse.data)[b * a->lse.stride[0] + h * a->lse.stride[1] + i * a->lse.stride[2]] = lse;
                }
            }
        }
    free(s), free(acc), free(qr);
    return LK_OK;
}
