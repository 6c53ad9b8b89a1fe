/*
 * mla_softmax_block, AVX2 + FMA: the online-softmax step of one key block of the fused
 * MLA prefill (src/cpu/mla/fused.c), contract in kernels.h; the maths of
 * src/cpu/ref/mla_softmax.c.
 *
 * Per row: one pass for the block max that also notes NaNs (a NaN or +inf visible score
 * makes the row NaN: its block max is taken as NaN, which lk_online_rescale keeps, and
 * its probabilities are set to 0 so that only the NaN state carries it); then
 * exp(S - shift) with lk8_exp_nonpos (arguments <= 0 once NaN / +inf rows are out) and
 * four partial sums; O *= alpha. Column tails go through masked loads / stores.
 * No threads: the caller's units are the parallel split.
 */
#include <math.h>
#include <string.h>

#include "../kernels.h"
#include "simd.h"

static inline __m256i tail_mask(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

lk_status lk_avx2_mla_softmax_block(const lk_mla_softmax_args *a) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    int64_t kb = a->kb, kv = kb & ~(int64_t)7;
    __m256i tm = tail_mask(kb - kv);
    for (int64_t r = 0; r < a->nq; r++) {
        float *s = a->S + r * a->lds; // [kb]
        if (a->causal)
            for (int64_t c = a->lim0 + r + 1 < 0 ? 0 : a->lim0 + r + 1; c < kb; c++) s[c] = -INFINITY;
        __m256 mx = ninf, nan = _mm256_setzero_ps();
        for (int64_t c = 0; c < kv; c += 8) {
            __m256 x = _mm256_loadu_ps(s + c);
            mx = _mm256_max_ps(mx, x);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
        }
        if (kv < kb) {
            __m256 x = _mm256_blendv_ps(ninf, _mm256_maskload_ps(s + kv, tm), _mm256_castsi256_ps(tm));
            mx = _mm256_max_ps(mx, x);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
        }
        float bmax = lk8_hmax(mx);
        if (_mm256_movemask_ps(nan) || bmax == INFINITY) bmax = NAN;
        float alpha = lk_online_rescale(&a->st[r], bmax);
        if (isnan(a->st[r].m)) { /* NaN row: the state carries it, the weights are 0 */
            memset(s, 0, sizeof(float) * (size_t)kb);
            lk_online_add(&a->st[r], NAN);
        } else {
            __m256 shift = _mm256_set1_ps(lk_online_shift(a->st[r].m));
            __m256 s0 = _mm256_setzero_ps(), s1 = s0;
            int64_t c = 0;
            for (; c + 16 <= kv; c += 16) {
                __m256 e0 = lk8_exp_nonpos(_mm256_sub_ps(_mm256_loadu_ps(s + c), shift));
                __m256 e1 = lk8_exp_nonpos(_mm256_sub_ps(_mm256_loadu_ps(s + c + 8), shift));
                _mm256_storeu_ps(s + c, e0), _mm256_storeu_ps(s + c + 8, e1);
                s0 = _mm256_add_ps(s0, e0), s1 = _mm256_add_ps(s1, e1);
            }
            for (; c < kv; c += 8) {
                __m256 e = lk8_exp_nonpos(_mm256_sub_ps(_mm256_loadu_ps(s + c), shift));
                _mm256_storeu_ps(s + c, e);
                s0 = _mm256_add_ps(s0, e);
            }
            if (kv < kb) {
                __m256 x = _mm256_blendv_ps(ninf, _mm256_maskload_ps(s + kv, tm), _mm256_castsi256_ps(tm));
                __m256 e = lk8_exp_nonpos(_mm256_sub_ps(x, shift));
                _mm256_maskstore_ps(s + kv, tm, e);
                s1 = _mm256_add_ps(s1, e);
            }
            lk_online_add(&a->st[r], lk8_hsum(_mm256_add_ps(s0, s1)));
        }
        if (alpha != 1.0f) {
            float *o = a->O + r * a->ldo; // [Dv]
            __m256 va = _mm256_set1_ps(alpha);
            int64_t d = 0;
            for (; d + 8 <= a->Dv; d += 8) _mm256_storeu_ps(o + d, _mm256_mul_ps(_mm256_loadu_ps(o + d), va));
            for (; d < a->Dv; d++) o[d] *= alpha;
        }
    }
    return LK_OK;
}
