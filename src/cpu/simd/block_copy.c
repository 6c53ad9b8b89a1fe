/*
 * swap_blocks / copy_blocks, every vector ISA (src/cpu/vec/lkv.h).
 *
 *   dst[c][map[i, 1], ...] = src[c][map[i, 0], ...]     (bits)
 *
 * Fast path: a cache pair whose blocks are dense (the dims after dim 0 row-major
 * contiguous in both) copies each block as one run of bytes (lkv_copy_bytes); other
 * pairs go to the reference. Work split: units (cache pair, mapping row), contiguous
 * ranges per thread (lk_parallel_for); the validated mapping makes every unit write
 * its own block, read blocks nobody writes, so the split cannot change the result.
 */
#include "../kernels.h"
#include "../vec/lkv.h"

/* 1 when the dims after dim 0 are row-major contiguous (a block is one run) */
static int dense_block(const lk_tensor *t) {
    int64_t want = 1;
    for (int d = t->ndim - 1; d >= 1; d--) {
        if (t->shape[d] != 1 && t->stride[d] != want) return 0;
        want *= t->shape[d];
    }
    return 1;
}

static void copy_range(void *ctx, int64_t u0, int64_t u1) {
    const lk_block_copy_args *a = ctx;
    for (int64_t u = u0; u < u1; u++) {
        int c = (int)(u / a->npairs);
        int64_t i = u % a->npairs;
        const lk_tensor *s = &a->src[c], *d = &a->dst[c];
        int64_t es = lk_esize(s->dtype), n = 1;
        for (int k = 1; k < s->ndim; k++) n *= s->shape[k];
        lkv_copy_bytes((char *)d->data + a->map[2 * i + 1] * d->stride[0] * es,
                       (const char *)s->data + a->map[2 * i] * s->stride[0] * es, (size_t)(n * es), 0);
    }
}

static lk_status block_copy(const lk_block_copy_args *a) {
    for (int c = 0; c < a->n; c++)
        if (!dense_block(&a->src[c]) || !dense_block(&a->dst[c])) return lk_ref_block_copy(a);
    int64_t n = 1;
    for (int k = 1; k < a->src[0].ndim; k++) n *= a->src[0].shape[k];
    lk_parallel_for(a->n * a->npairs, 2 * n * lk_esize(a->src[0].dtype), copy_range, (void *)a);
    return LK_OK;
}

void LKV_FN(register_block_copy)(lk_kernel_table *t) { t->block_copy = block_copy; }
