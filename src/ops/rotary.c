/*
 * Public entry point lk_rotary_embedding: validation (before any store), then the
 * kernel of the ISA in use. Contract in include/llmkern.h and SPEC.md.
 *
 *   positions [T] i32/i64, every value in [0, max_pos)
 *   q [T, Hq, D], k [T, Hk, D] or NULL (own head count and dtype; same T and D)
 *   cos_sin_cache [max_pos, rot], rot even, rot <= D
 *
 * In place on q and k, which may be views into one fused qkv buffer (rows interleaved
 * with the same stride: lk_check_disjoint accepts that pattern). q and k must not
 * overlap each other, themselves, the cache or the positions.
 */
#include "../core/half.h"
#include "../cpu/kernels.h"

static lk_status check_head_tensor(const lk_tensor *x, const char *name, int64_t T) {
    lk_status s = lk_check_float(x, name, 3, 3);
    if (s) return s;
    if (x->shape[0] != T)
        return lk_fail(LK_ERR_SHAPE, "%s: shape %s has %lld tokens, positions has %lld", name,
                       lk_shape_str(x), (long long)x->shape[0], (long long)T);
    return lk_check_no_self_overlap(x, name);
}

/* every position in [0, max_pos) */
static lk_status check_positions(const lk_tensor *p, int64_t max_pos) {
    int64_t T = p->shape[0];
    for (int64_t t = 0; t < T; t++) {
        int64_t v = lk_load_index(p->data, p->dtype, t * p->stride[0]);
        if (v < 0 || v >= max_pos)
            return lk_fail(LK_ERR_INDEX,
                           "positions: value %lld at index %lld is outside [0, %lld) "
                           "(max_pos = rows of cos_sin_cache)",
                           (long long)v, (long long)t, (long long)max_pos);
    }
    return LK_OK;
}

lk_status lk_rotary_check(const lk_rotary_args *a, const char *qn, const char *kn) {
    lk_status s;
    if ((s = lk_check_index(&a->positions, "positions", 1, 1))) return s;
    int64_t T = a->positions.shape[0];
    if ((s = check_head_tensor(&a->q, qn, T))) return s;
    int64_t D = a->q.shape[2];
    if (a->has_k) {
        if ((s = check_head_tensor(&a->k, kn, T))) return s;
        if (a->k.shape[2] != D)
            return lk_fail(LK_ERR_SHAPE, "%s: head dim %lld (shape %s) differs from %s's %lld", kn,
                           (long long)a->k.shape[2], lk_shape_str(&a->k), qn, (long long)D);
    }
    const lk_tensor *cs = &a->cos_sin;
    if ((s = lk_check_float(cs, "cos_sin_cache", 2, 2))) return s;
    int64_t rot = cs->shape[1];
    if (rot % 2 != 0 || rot > D)
        return lk_fail(LK_ERR_SHAPE,
                       "cos_sin_cache: rotary dim %lld (shape %s) must be even and <= head dim %lld",
                       (long long)rot, lk_shape_str(cs), (long long)D);
    if ((s = lk_check_disjoint(&a->q, qn, cs, "cos_sin_cache"))) return s;
    if ((s = lk_check_disjoint(&a->q, qn, &a->positions, "positions"))) return s;
    if (a->has_k) {
        if ((s = lk_check_disjoint(&a->q, qn, &a->k, kn))) return s;
        if ((s = lk_check_disjoint(&a->k, kn, cs, "cos_sin_cache"))) return s;
        if ((s = lk_check_disjoint(&a->k, kn, &a->positions, "positions"))) return s;
    }
    return check_positions(&a->positions, cs->shape[0]);
}

lk_status lk_rotary_embedding(const lk_tensor *positions, const lk_tensor *q, const lk_tensor *k,
                              const lk_tensor *cos_sin_cache, int is_neox) {
    lk_clear_error();
    lk_set_op("lk_rotary_embedding");
    if (!positions || !q || !cos_sin_cache)
        return lk_fail(LK_ERR_NULL, "%s: tensor pointer is NULL",
                       !positions ? "positions" : !q ? "q" : "cos_sin_cache");
    lk_rotary_args a;
    a.positions = *positions;
    a.q = *q;
    a.has_k = k != NULL;
    if (k) a.k = *k;
    else a.k = (lk_tensor){0};
    a.cos_sin = *cos_sin_cache;
    a.is_neox = is_neox != 0;
    lk_status s = lk_rotary_check(&a, "q", "k");
    if (s) return s;
    int64_t heads = a.q.shape[1] + (a.has_k ? a.k.shape[1] : 0);
    if (a.positions.shape[0] == 0 || heads == 0 || a.cos_sin.shape[1] == 0) return LK_OK;
    return lk_kernels()->rotary_embedding(&a);
}
