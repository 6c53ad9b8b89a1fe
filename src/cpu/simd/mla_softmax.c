/*
 * mla_softmax_block, every vector ISA (src/cpu/vec/lkv.h, W lanes): the online-softmax
 * step of one key block of the fused MLA prefill (src/cpu/mla/fused.c), contract in
 * kernels.h; the maths of src/cpu/ref/mla_softmax.c.
 *
 * Per row: one pass for the block max that also notes NaNs (a NaN or +inf visible score
 * makes the row NaN: its block max is taken as NaN, which lk_online_rescale keeps, and
 * its probabilities are set to 0 so that only the NaN state carries it); then
 * exp(S - shift) with lkv_exp_nonpos (arguments <= 0 once NaN / +inf rows are out) and
 * two partial sums, stored as f32 in S or as bf16 in P16 (the bf16 engine); O *= alpha.
 * Column tails go through partial loads / stores.
 * No threads: the caller's units are the parallel split.
 */
#include <math.h>
#include <string.h>

#include "../kernels.h"
#include "../vec/lkv.h"

static lk_status mla_softmax_block(const lk_mla_softmax_args *a) {
    const lkv_f32 ninf = lkv_set1(-INFINITY);
    int64_t kb = a->kb, kv = kb - kb % LKV_W;
    lkv_m tm = lkv_m_first(kb - kv);
    for (int64_t r = 0; r < a->nq; r++) {
        float *s = a->S + r * a->lds; // [kb]
        uint16_t *p16 = a->P16 ? a->P16 + r * a->ldp : NULL; // [kb] or none
        if (a->causal)
            for (int64_t c = a->lim0 + r + 1 < 0 ? 0 : a->lim0 + r + 1; c < kb; c++) s[c] = -INFINITY;
        lkv_f32 mx = ninf;
        lkv_m nan = lkv_m_none();
        for (int64_t c = 0; c < kv; c += LKV_W) {
            lkv_f32 x = lkv_loadu(s + c);
            mx = lkv_max(mx, x);
            nan = lkv_m_or(nan, lkv_unord(x, x));
        }
        if (kv < kb) {
            lkv_f32 x = lkv_blend(ninf, lkv_load_part(s + kv, LK_F32, kb - kv), tm);
            mx = lkv_max(mx, x);
            nan = lkv_m_or(nan, lkv_unord(x, x));
        }
        float bmax = lkv_hmax(mx);
        if (lkv_m_any(nan) || bmax == INFINITY) bmax = NAN;
        float alpha = lk_online_rescale(&a->st[r], bmax);
        if (isnan(a->st[r].m)) { /* NaN row: the state carries it, the weights are 0 */
            if (p16) memset(p16, 0, sizeof(uint16_t) * (size_t)kb);
            else memset(s, 0, sizeof(float) * (size_t)kb);
            lk_online_add(&a->st[r], NAN);
        } else {
            lkv_f32 shift = lkv_set1(lk_online_shift(a->st[r].m)), s0 = lkv_zero(), s1 = s0;
            int64_t c = 0;
            for (; c + 2 * LKV_W <= kv; c += 2 * LKV_W) {
                lkv_f32 e0 = lkv_exp_nonpos(lkv_sub(lkv_loadu(s + c), shift));
                lkv_f32 e1 = lkv_exp_nonpos(lkv_sub(lkv_loadu(s + c + LKV_W), shift));
                if (p16) lkv_store(p16 + c, LK_BF16, e0), lkv_store(p16 + c + LKV_W, LK_BF16, e1);
                else lkv_storeu(s + c, e0), lkv_storeu(s + c + LKV_W, e1);
                s0 = lkv_add(s0, e0), s1 = lkv_add(s1, e1);
            }
            for (; c < kv; c += LKV_W) {
                lkv_f32 e = lkv_exp_nonpos(lkv_sub(lkv_loadu(s + c), shift));
                if (p16) lkv_store(p16 + c, LK_BF16, e);
                else lkv_storeu(s + c, e);
                s0 = lkv_add(s0, e);
            }
            if (kv < kb) {
                lkv_f32 x = lkv_blend(ninf, lkv_load_part(s + kv, LK_F32, kb - kv), tm);
                lkv_f32 e = lkv_exp_nonpos(lkv_sub(x, shift));
                if (p16) lkv_store_part(p16 + kv, LK_BF16, e, kb - kv);
                else lkv_store_part(s + kv, LK_F32, e, kb - kv);
                s1 = lkv_add(s1, e);
            }
            lk_online_add(&a->st[r], lkv_hsum(lkv_add(s0, s1)));
        }
        if (alpha != 1.0f) {
            float *o = a->O + r * a->ldo; // [Dv]
            lkv_f32 va = lkv_set1(alpha);
            int64_t d = 0;
            for (; d + LKV_W <= a->Dv; d += LKV_W) lkv_storeu(o + d, lkv_mul(lkv_loadu(o + d), va));
            for (; d < a->Dv; d++) o[d] *= alpha;
        }
    }
    return LK_OK;
}

void LKV_FN(register_mla_softmax)(lk_kernel_table *t) { t->mla_softmax_block = mla_softmax_block; }
