/*
 * swap_blocks / copy_blocks, scalar reference.
 *
 *   dst[c][map[i, 1], ...] = src[c][map[i, 0], ...]     c < n, i < npairs (bits)
 *
 * Shapes: src[c] [NBs, ...], dst[c] [NBd, ...] with the same dims after dim 0 and the
 * same dtype (validated; copy_blocks passes each cache as both). A block is walked in
 * row-major order of its dims, any strides, one element at a time. No threads.
 */
#include <string.h>

#include "../kernels.h"

/* the view of block b of t: dim 0 dropped (a 0-dim view of one element when t is 1-D) */
static lk_tensor block_view(const lk_tensor *t, int64_t b) {
    lk_tensor v = *t;
    v.data = (char *)t->data + b * t->stride[0] * lk_esize(t->dtype);
    v.ndim = t->ndim - 1;
    memmove(v.shape, t->shape + 1, sizeof(int64_t) * (size_t)v.ndim);
    memmove(v.stride, t->stride + 1, sizeof(int64_t) * (size_t)v.ndim);
    return v;
}

/* element offset of row-major index i of view v */
static int64_t offset_of(const lk_tensor *v, int64_t i) {
    int64_t off = 0;
    for (int d = v->ndim - 1; d >= 0; d--) {
        off += (i % v->shape[d]) * v->stride[d];
        i /= v->shape[d];
    }
    return off;
}

lk_status lk_ref_block_copy(const lk_block_copy_args *a) {
    for (int c = 0; c < a->n; c++) {
        const lk_tensor *s = &a->src[c], *d = &a->dst[c];
        int64_t es = lk_esize(s->dtype), n = 1;
        for (int k = 1; k < s->ndim; k++) n *= s->shape[k];
        for (int64_t i = 0; i < a->npairs; i++) {
            lk_tensor sv = block_view(s, a->map[2 * i]), dv = block_view(d, a->map[2 * i + 1]);
            for (int64_t e = 0; e < n; e++) // block element e, row-major
                memcpy((char *)dv.data + offset_of(&dv, e) * es, (const char *)sv.data + offset_of(&sv, e) * es,
                       (size_t)es);
        }
    }
    return LK_OK;
}
