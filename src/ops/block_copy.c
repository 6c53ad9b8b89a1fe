/*
 * Public entry points lk_swap_blocks and lk_copy_blocks (vLLM's swap_blocks and
 * copy_blocks / copy_blocks_mla): validation (before any store), then the block_copy
 * kernel of the ISA in use. Contract in include/llmkern.h.
 *
 *   swap:  dst[map[i, 1]] = src[map[i, 0]]
 *   copy:  caches[c][map[i, 1]] = caches[c][map[i, 0]]   for every cache c
 *
 * Rules checked: views of rank >= 1 (dim 0 = blocks), the same dtype and the same dims
 * after dim 0 between src and dst (copy: within each cache trivially); block_mapping
 * [N, 2] i32/i64 with every source index in [0, NBs) and destination in [0, NBd); no
 * destination block twice; copy: no destination block that is also a source (the
 * result would depend on the order of the copies), where a row mapping a block onto
 * itself is a no-op that is dropped before these checks (its indices are checked
 * against the range, it is never run); destinations do not overlap
 * themselves, each other, the sources or the mapping. The mapping is read once into a
 * contiguous int64 copy (scratch 16 bytes per row; LK_ERR_NOMEM without it).
 */
#include <stdio.h>
#include <stdlib.h>

#include "../core/half.h"
#include "../cpu/kernels.h"

static int cmp_i64(const void *pa, const void *pb) {
    int64_t a = *(const int64_t *)pa, b = *(const int64_t *)pb;
    return a < b ? -1 : a > b;
}

/* the mapping as int64 pairs, index ranges checked; *out is malloc'd (NULL when N == 0) */
static lk_status read_map(const lk_tensor *bm, int64_t nbs, int64_t nbd, int64_t **out) {
    lk_status s = lk_check_index(bm, "block_mapping", 2, 2);
    if (s) return s;
    if (bm->shape[1] != 2)
        return lk_fail(LK_ERR_SHAPE, "block_mapping: shape %s, expected [N, 2] (source block, destination block)",
                       lk_shape_str(bm));
    int64_t N = bm->shape[0];
    *out = NULL;
    if (N == 0) return LK_OK;
    int64_t *m = malloc(sizeof(int64_t) * 2 * (size_t)N);
    if (!m) return lk_fail(LK_ERR_NOMEM, "block_mapping: no memory for %lld rows", (long long)N);
    for (int64_t i = 0; i < N; i++) {
        int64_t sb = lk_load_index(bm->data, bm->dtype, i * bm->stride[0]);
        int64_t db = lk_load_index(bm->data, bm->dtype, i * bm->stride[0] + bm->stride[1]);
        if (sb < 0 || sb >= nbs || db < 0 || db >= nbd) {
            free(m);
            int bad_src = sb < 0 || sb >= nbs;
            return lk_fail(LK_ERR_INDEX, "block_mapping: row %lld: %s block %lld outside [0, %lld)", (long long)i,
                           bad_src ? "source" : "destination", (long long)(bad_src ? sb : db),
                           (long long)(bad_src ? nbs : nbd));
        }
        m[2 * i] = sb, m[2 * i + 1] = db;
    }
    *out = m;
    return LK_OK;
}

/* no destination twice; with `within` (copy in place) no destination that is a source */
static lk_status check_pairs(const int64_t *m, int64_t N, int within) {
    if (N <= 1 && !within) return LK_OK;
    int64_t *d = malloc(sizeof(int64_t) * 2 * (size_t)N);
    if (!d) return lk_fail(LK_ERR_NOMEM, "block_mapping: no memory for %lld rows", (long long)N);
    int64_t *sv = d + N;
    for (int64_t i = 0; i < N; i++) d[i] = m[2 * i + 1], sv[i] = m[2 * i];
    qsort(d, (size_t)N, sizeof(int64_t), cmp_i64);
    lk_status s = LK_OK;
    for (int64_t i = 1; i < N && !s; i++)
        if (d[i] == d[i - 1])
            s = lk_fail(LK_ERR_INDEX, "block_mapping: destination block %lld appears more than once", (long long)d[i]);
    if (!s && within) {
        qsort(sv, (size_t)N, sizeof(int64_t), cmp_i64);
        for (int64_t i = 0, j = 0; i < N && j < N && !s;) {
            if (d[i] == sv[j])
                s = lk_fail(LK_ERR_INDEX, "block_mapping: block %lld is both a destination and a source",
                            (long long)d[i]);
            else if (d[i] < sv[j]) i++;
            else j++;
        }
    }
    free(d);
    return s;
}

/* the copies of one cache pair (nothing to do for empty blocks or no rows) */
static lk_status run(const lk_tensor *src, const lk_tensor *dst, const int64_t *map, int64_t N) {
    int64_t n = 1;
    for (int k = 1; k < src->ndim; k++) n *= src->shape[k];
    if (N == 0 || n == 0) return LK_OK;
    lk_block_copy_args a = {1, src, dst, map, N};
    return lk_kernels()->block_copy(&a);
}

lk_status lk_swap_blocks(const lk_tensor *src, const lk_tensor *dst, const lk_tensor *block_mapping) {
    lk_clear_error();
    lk_set_op("lk_swap_blocks");
    if (!src || !dst || !block_mapping)
        return lk_fail(LK_ERR_NULL, "%s: tensor pointer is NULL", !src ? "src" : !dst ? "dst" : "block_mapping");
    lk_status s;
    if ((s = lk_check_float8(src, "src", 1, LK_MAX_DIMS))) return s;
    if ((s = lk_check_float8(dst, "dst", 1, LK_MAX_DIMS))) return s;
    if (dst->dtype != src->dtype)
        return lk_fail(LK_ERR_DTYPE, "dst: dtype %s differs from src's %s (blocks are copied as bits)",
                       lk_dtype_name(dst->dtype), lk_dtype_name(src->dtype));
    int same = dst->ndim == src->ndim;
    for (int d = 1; same && d < src->ndim; d++) same = dst->shape[d] == src->shape[d];
    if (!same)
        return lk_fail(LK_ERR_SHAPE, "dst: shape %s, expected src's %s after the block dim", lk_shape_str(dst),
                       lk_shape_str(src));
    if ((s = lk_check_no_self_overlap(dst, "dst"))) return s;
    if ((s = lk_check_disjoint(dst, "dst", src, "src"))) return s;
    if ((s = lk_check_view(block_mapping, "block_mapping", 2, 2))) return s;
    if ((s = lk_check_disjoint(dst, "dst", block_mapping, "block_mapping"))) return s;
    int64_t *map;
    if ((s = read_map(block_mapping, src->shape[0], dst->shape[0], &map))) return s;
    int64_t N = block_mapping->shape[0];
    if ((s = check_pairs(map, N, 0))) {
        free(map);
        return s;
    }
    s = run(src, dst, map, N);
    free(map);
    return s;
}

lk_status lk_copy_blocks(int n, const lk_tensor *caches, const lk_tensor *block_mapping) {
    lk_clear_error();
    lk_set_op("lk_copy_blocks");
    if (n < 1) return lk_fail(LK_ERR_VALUE, "n: %d caches, expected >= 1", n);
    if (!caches || !block_mapping)
        return lk_fail(LK_ERR_NULL, "%s: tensor pointer is NULL", !caches ? "caches" : "block_mapping");
    lk_status s;
    char name[32], other[32];
    int64_t nb = -1;
    for (int c = 0; c < n; c++) {
        snprintf(name, sizeof name, "caches[%d]", c);
        if ((s = lk_check_float8(&caches[c], name, 1, LK_MAX_DIMS))) return s;
        if (nb < 0 || caches[c].shape[0] < nb) nb = caches[c].shape[0]; /* the mapping must fit every cache */
        if ((s = lk_check_no_self_overlap(&caches[c], name))) return s;
    }
    for (int c = 0; c < n; c++) {
        snprintf(name, sizeof name, "caches[%d]", c);
        for (int e = 0; e < c; e++) {
            snprintf(other, sizeof other, "caches[%d]", e);
            if ((s = lk_check_disjoint(&caches[c], name, &caches[e], other))) return s;
        }
    }
    if ((s = lk_check_view(block_mapping, "block_mapping", 2, 2))) return s;
    for (int c = 0; c < n; c++) {
        snprintf(name, sizeof name, "caches[%d]", c);
        if ((s = lk_check_disjoint(&caches[c], name, block_mapping, "block_mapping"))) return s;
    }
    int64_t *map;
    if ((s = read_map(block_mapping, nb, nb, &map))) return s;
    int64_t N = 0; /* the rows that copy: a block onto itself is left as it is */
    for (int64_t i = 0; i < block_mapping->shape[0]; i++)
        if (map[2 * i] != map[2 * i + 1]) map[2 * N] = map[2 * i], map[2 * N + 1] = map[2 * i + 1], N++;
    if ((s = check_pairs(map, N, 1))) {
        free(map);
        return s;
    }
    for (int c = 0; c < n && !s; c++) s = run(&caches[c], &caches[c], map, N); /* each cache its own blocks */
    free(map);
    return s;
}
