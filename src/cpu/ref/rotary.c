/*
 * rotary_embedding, scalar reference.
 *
 *   c = cache[pos[t], i], s = cache[pos[t], rot/2 + i]       for i in [0, rot/2)
 *   NeoX  pair (x, y) = (row[i], row[i + rot/2])
 *   GPT-J pair (x, y) = (row[2i], row[2i + 1])
 *   x' = x*c - y*s;  y' = y*c + x*s
 *
 * Shapes: positions [T]; q [T, Hq, D]; k [T, Hk, D] (optional); cos_sin [max_pos, rot].
 * Every operand may have any strides. Dims [rot, D) are never read or written.
 * Each product is rounded to f32, then the difference / sum (no fused multiply-add):
 * the SIMD kernels do the same operations in the same order and match bit for bit.
 * One rounding to the row's dtype per stored value. No threads.
 */
#include "../../core/half.h"
#include "../kernels.h"

/* rotate every head of x[t] (x: [T, H, D]) with the cache row cs_row */
static void rotate_token(const lk_tensor *x, int64_t t, const void *cs_row, lk_dtype cs_dt,
                         int64_t cs_st, int64_t half, int is_neox) {
    int64_t xs = x->stride[2];
    int64_t dx = is_neox ? 1 : 2, dy = is_neox ? half : 1; /* pair i = (i*dx, i*dx + dy) */
    for (int64_t h = 0; h < x->shape[1]; h++) {
        void *row = lk_at(x, t * x->stride[0] + h * x->stride[1]); // [D] stride xs
        for (int64_t i = 0; i < half; i++) {
            float c = lk_load_f(cs_row, cs_dt, i * cs_st);
            float s = lk_load_f(cs_row, cs_dt, (half + i) * cs_st);
            int64_t ix = i * dx * xs, iy = (i * dx + dy) * xs;
            float xv = lk_load_f(row, x->dtype, ix), yv = lk_load_f(row, x->dtype, iy);
            float xc = xv * c, ys = yv * s, yc = yv * c, xs_ = xv * s;
            lk_store_f(row, x->dtype, ix, xc - ys);
            lk_store_f(row, x->dtype, iy, yc + xs_);
        }
    }
}

lk_status lk_ref_rotary_embedding(const lk_rotary_args *a) {
    const lk_tensor *p = &a->positions, *cs = &a->cos_sin;
    int64_t T = p->shape[0], half = cs->shape[1] / 2;
    for (int64_t t = 0; t < T; t++) {
        int64_t pos = lk_load_index(p->data, p->dtype, t * p->stride[0]);
        const void *cs_row = lk_at(cs, pos * cs->stride[0]); // [rot] stride cs->stride[1]
        rotate_token(&a->q, t, cs_row, cs->dtype, cs->stride[1], half, a->is_neox);
        if (a->has_k) rotate_token(&a->k, t, cs_row, cs->dtype, cs->stride[1], half, a->is_neox);
    }
    return LK_OK;
}
