/*
 * Tensor-view checks and row iteration (see core.h).
 *
 * Byte offsets are checked for int64 overflow: for every dim, (shape - 1) * |stride|
 * and the running sums of those, times the element size, must fit in int64, and so
 * must the element count. Views with any zero dim are empty and touch no memory.
 */
#include <stdio.h>
#include <stdlib.h>

#include "core.h"
#include "half.h"

const char *lk_dtype_name(lk_dtype dt) {
    switch (dt) {
    case LK_F32: return "f32";
    case LK_F16: return "f16";
    case LK_BF16: return "bf16";
    case LK_I32: return "i32";
    case LK_I64: return "i64";
    case LK_F8E4M3: return "f8e4m3";
    case LK_F8E5M2: return "f8e5m2";
    case LK_I8: return "i8";
    }
    return "unknown";
}

size_t lk_dtype_size(lk_dtype dt) {
    switch (dt) {
    case LK_F32: return 4;
    case LK_F16: return 2;
    case LK_BF16: return 2;
    case LK_I32: return 4;
    case LK_I64: return 8;
    case LK_F8E4M3: return 1;
    case LK_F8E5M2: return 1;
    case LK_I8: return 1;
    }
    return 0;
}

lk_tensor lk_tensor_make(void *data, lk_dtype dtype, int32_t ndim, const int64_t *shape) {
    lk_tensor t;
    t.data = data;
    t.dtype = dtype;
    t.ndim = ndim;
    for (int d = 0; d < LK_MAX_DIMS; d++) {
        t.shape[d] = 0;
        t.stride[d] = 0;
    }
    if (ndim < 0 || ndim > LK_MAX_DIMS) return t;
    int64_t s = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        t.shape[d] = shape[d];
        t.stride[d] = s;
        /* wrapping (unsigned) product: absurd shapes give strides lk_check_view refuses, not UB */
        s = (int64_t)((uint64_t)s * (uint64_t)(shape[d] > 0 ? shape[d] : 1));
    }
    return t;
}

int64_t lk_numel(const lk_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

const char *lk_shape_str(const lk_tensor *t) {
    static _Thread_local char bufs[4][160];
    static _Thread_local int which;
    char *b = bufs[which++ & 3];
    int n = snprintf(b, 160, "[");
    for (int d = 0; d < t->ndim && n < 140; d++)
        n += snprintf(b + n, (size_t)(160 - n), d ? ", %lld" : "%lld", (long long)t->shape[d]);
    snprintf(b + n, (size_t)(160 - n), "]");
    return b;
}

static int mul_ovf(int64_t a, int64_t b, int64_t *r) { return __builtin_mul_overflow(a, b, r); }
static int add_ovf(int64_t a, int64_t b, int64_t *r) { return __builtin_add_overflow(a, b, r); }

lk_status lk_check_view(const lk_tensor *t, const char *name, int min_nd, int max_nd) {
    if (!t) return lk_fail(LK_ERR_NULL, "%s: tensor pointer is NULL", name);
    if (t->ndim < min_nd || t->ndim > max_nd) {
        if (min_nd == max_nd)
            return lk_fail(LK_ERR_RANK, "%s: expected %d dims, got %d", name, min_nd, (int)t->ndim);
        return lk_fail(LK_ERR_RANK, "%s: expected %d..%d dims, got %d", name, min_nd, max_nd,
                       (int)t->ndim);
    }
    size_t es = lk_dtype_size(t->dtype);
    if (es == 0) return lk_fail(LK_ERR_DTYPE, "%s: unknown dtype %d", name, (int)t->dtype);
    int64_t numel = 1, span = 0;
    int empty = 0;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] < 0)
            return lk_fail(LK_ERR_SHAPE, "%s: negative size %lld in dim %d", name,
                           (long long)t->shape[d], d);
        if (t->shape[d] == 0) empty = 1;
    }
    for (int d = 0; d < t->ndim; d++) {
        int64_t ext, st = t->stride[d];
        if (st == INT64_MIN || mul_ovf(numel, t->shape[d], &numel))
            return lk_fail(LK_ERR_OVERFLOW, "%s: element count or stride overflows int64", name);
        if (empty) continue;
        if (st < 0) st = -st;
        if (mul_ovf(t->shape[d] - 1, st, &ext) || add_ovf(span, ext, &span))
            return lk_fail(LK_ERR_OVERFLOW, "%s: offsets of shape %s overflow int64", name,
                           lk_shape_str(t));
    }
    int64_t bytes;
    if (!empty && (add_ovf(span, 1, &bytes) || mul_ovf(bytes, (int64_t)es, &bytes) ||
                   bytes > (INT64_MAX >> 1)))
        return lk_fail(LK_ERR_OVERFLOW, "%s: byte offsets of shape %s overflow int64", name,
                       lk_shape_str(t));
    if (!empty && !t->data)
        return lk_fail(LK_ERR_NULL, "%s: data is NULL for a non-empty view %s", name,
                       lk_shape_str(t));
    return LK_OK;
}

lk_status lk_check_float(const lk_tensor *t, const char *name, int min_nd, int max_nd) {
    lk_status s = lk_check_view(t, name, min_nd, max_nd);
    if (s) return s;
    if (t->dtype != LK_F32 && t->dtype != LK_F16 && t->dtype != LK_BF16)
        return lk_fail(LK_ERR_DTYPE, "%s: dtype %s not supported (f32, f16, bf16)", name,
                       lk_dtype_name(t->dtype));
    return LK_OK;
}

lk_status lk_check_float8(const lk_tensor *t, const char *name, int min_nd, int max_nd) {
    lk_status s = lk_check_view(t, name, min_nd, max_nd);
    if (s) return s;
    if (t->dtype != LK_F32 && t->dtype != LK_F16 && t->dtype != LK_BF16 && !lk_is_fp8(t->dtype))
        return lk_fail(LK_ERR_DTYPE, "%s: dtype %s not supported (f32, f16, bf16, f8e4m3, f8e5m2)", name,
                       lk_dtype_name(t->dtype));
    return LK_OK;
}

lk_status lk_scale_check_value(float v, const char *name) {
    if (!(v > 0.0f) || v == __builtin_inff())
        return lk_fail(LK_ERR_VALUE, "%s: value %g must be finite and > 0", name, (double)v);
    return LK_OK;
}

lk_status lk_scale_init(lk_scale *s, const lk_tensor *t, int64_t B, int64_t H, const char *name) {
    static const float one = 1.0f;
    *s = (lk_scale){&one, 0, 0};
    if (!t) return LK_OK;
    lk_status st = lk_check_view(t, name, 0, 2);
    if (st) return st;
    if (t->dtype != LK_F32)
        return lk_fail(LK_ERR_DTYPE, "%s: dtype %s not supported (f32)", name, lk_dtype_name(t->dtype));
    int64_t nb = 1, nh = 1, sb = 0, sh = 0;
    if (t->ndim == 1 && t->shape[0] == H && H != 1)
        nh = H, sh = t->stride[0];
    else if (t->ndim == 2 && B >= 0 && t->shape[0] == B && t->shape[1] == H)
        nb = B, nh = H, sb = B > 1 ? t->stride[0] : 0, sh = H > 1 ? t->stride[1] : 0;
    else if (!(t->ndim == 0 || (t->ndim == 1 && t->shape[0] == 1))) {
        if (B >= 0)
            return H == 1 ? lk_fail(LK_ERR_SHAPE, "%s: shape %s: expected [], [1] or [%lld, 1]", name, lk_shape_str(t),
                                    (long long)B)
                          : lk_fail(LK_ERR_SHAPE, "%s: shape %s: expected [], [1], [%lld] or [%lld, %lld]", name,
                                    lk_shape_str(t), (long long)H, (long long)B, (long long)H);
        return H == 1 ? lk_fail(LK_ERR_SHAPE, "%s: shape %s: expected [] or [1]", name, lk_shape_str(t))
                      : lk_fail(LK_ERR_SHAPE, "%s: shape %s: expected [], [1] or [%lld]", name, lk_shape_str(t),
                                (long long)H);
    }
    if (nb * nh == 0) { /* an empty [B, H] / [H] scale: nothing reads it */
        s->p = &one, s->sb = s->sh = 0;
        return LK_OK;
    }
    const float *p = (const float *)t->data;
    for (int64_t b = 0; b < nb; b++)
        for (int64_t h = 0; h < nh; h++) {
            float v = p[b * sb + h * sh];
            if (!(v > 0.0f) || v == __builtin_inff()) {
                if (t->ndim == 2)
                    return lk_fail(LK_ERR_VALUE, "%s[%lld, %lld]: value %g must be finite and > 0", name,
                                   (long long)b, (long long)h, (double)v);
                return lk_fail(LK_ERR_VALUE, "%s[%lld]: value %g must be finite and > 0", name, (long long)h,
                               (double)v);
            }
        }
    *s = (lk_scale){p, sb, sh};
    return LK_OK;
}

lk_status lk_check_index(const lk_tensor *t, const char *name, int min_nd, int max_nd) {
    lk_status s = lk_check_view(t, name, min_nd, max_nd);
    if (s) return s;
    if (t->dtype != LK_I32 && t->dtype != LK_I64)
        return lk_fail(LK_ERR_DTYPE, "%s: dtype %s not supported (i32, i64)", name,
                       lk_dtype_name(t->dtype));
    return LK_OK;
}

lk_extent lk_view_extent(const lk_tensor *t) {
    lk_extent e = {(uintptr_t)t->data, (uintptr_t)t->data};
    int64_t lo = 0, hi = 0;
    for (int d = 0; d < t->ndim; d++) /* empty first: its strides were never checked */
        if (t->shape[d] == 0) return e;
    for (int d = 0; d < t->ndim; d++) {
        int64_t ext = (t->shape[d] - 1) * t->stride[d];
        if (ext < 0) lo += ext;
        else hi += ext;
    }
    int64_t es = (int64_t)lk_dtype_size(t->dtype);
    e.lo = (uintptr_t)((const char *)t->data + lo * es);
    e.hi = (uintptr_t)((const char *)t->data + (hi + 1) * es);
    return e;
}

lk_status lk_check_no_self_overlap(const lk_tensor *t, const char *name) {
    /* sufficient condition: sorted by |stride|, each stride exceeds the span of the
     * smaller dims (dims of size 1 and empty views never collide) */
    int64_t st[LK_MAX_DIMS], sh[LK_MAX_DIMS];
    int n = 0;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] == 0) return LK_OK;
        if (t->shape[d] == 1) continue;
        st[n] = t->stride[d] < 0 ? -t->stride[d] : t->stride[d];
        sh[n] = t->shape[d];
        n++;
    }
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && st[j] < st[j - 1]; j--) {
            int64_t a = st[j], b = sh[j];
            st[j] = st[j - 1], sh[j] = sh[j - 1];
            st[j - 1] = a, sh[j - 1] = b;
        }
    int64_t span = 0;
    for (int i = 0; i < n; i++) {
        if (st[i] <= span)
            return lk_fail(LK_ERR_ALIAS,
                           "%s: output view %s overlaps itself (stride %lld repeats elements)",
                           name, lk_shape_str(t), (long long)st[i]);
        span += (sh[i] - 1) * st[i];
    }
    return LK_OK;
}

int lk_same_view(const lk_tensor *a, const lk_tensor *b) {
    if (a->data != b->data || a->dtype != b->dtype || a->ndim != b->ndim) return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d] || (a->shape[d] > 1 && a->stride[d] != b->stride[d]))
            return 0;
    return 1;
}

/* Views that repeat with the same byte period P along their outermost dim, each row
 * fitting in P (q and k heads sliced out of one fused qkv buffer, K and V halves of one
 * [blocks, 2, ...] cache): rows land in windows modulo P; disjoint windows prove the
 * views disjoint. Otherwise the rows are compared recursively one dim further in, for
 * the two alignments under which they can meet (row i of a against rows i and i - 1 of
 * b, b's row origin brought within one period of a's). Ignoring the row counts only
 * makes the answer more cautious: "disjoint" is always right. */
static int views_disjoint(const lk_tensor *a, const lk_tensor *b, int depth) {
    lk_extent ea = lk_view_extent(a), eb = lk_view_extent(b);
    if (ea.lo == ea.hi || eb.lo == eb.hi || ea.hi <= eb.lo || eb.hi <= ea.lo) return 1;
    if (depth > LK_MAX_DIMS || a->ndim < 1 || b->ndim < 1) return 0;
    int64_t es_a = (int64_t)lk_dtype_size(a->dtype), es_b = (int64_t)lk_dtype_size(b->dtype);
    lk_tensor ra = *a, rb = *b; /* one row each: dims 1.. */
    ra.ndim--, rb.ndim--;
    for (int d = 0; d < LK_MAX_DIMS - 1; d++) {
        ra.shape[d] = a->shape[d + 1], ra.stride[d] = a->stride[d + 1];
        rb.shape[d] = b->shape[d + 1], rb.stride[d] = b->stride[d + 1];
    }
    if (ra.ndim == 0) ra.ndim = 1, ra.shape[0] = 1, ra.stride[0] = 1;
    if (rb.ndim == 0) rb.ndim = 1, rb.shape[0] = 1, rb.stride[0] = 1;
    /* one row each: compare the rows (a size-1 dim's stride is arbitrary, even huge) */
    if (a->shape[0] == 1 && b->shape[0] == 1) return views_disjoint(&ra, &rb, depth + 1);
    int64_t P, Pb;
    if (__builtin_mul_overflow(a->stride[0], es_a, &P) ||
        __builtin_mul_overflow(b->stride[0], es_b, &Pb) || P <= 0 || Pb != P)
        return 0;
    lk_extent fa = lk_view_extent(&ra), fb = lk_view_extent(&rb);
    int64_t la = (int64_t)(fa.hi - fa.lo), lb = (int64_t)(fb.hi - fb.lo);
    if (la > P || lb > P) return 0;
    int64_t diff = (int64_t)(fb.lo - fa.lo); /* may be negative (as a difference of addresses) */
    int64_t dy = ((diff % P) + P) % P;        /* b's row start relative to a's, in [0, P) */
    if (dy >= la && dy + lb <= P) return 1;
    lk_tensor r0 = rb, r1 = rb;
    /* b's row moved to start at fa.lo + dy (address arithmetic only, never dereferenced) */
    r0.data = (void *)((uintptr_t)rb.data - (uintptr_t)(diff - dy));
    r1.data = (void *)((uintptr_t)r0.data - (uintptr_t)P);
    return views_disjoint(&ra, &r0, depth + 1) && views_disjoint(&ra, &r1, depth + 1);
}

lk_status lk_check_disjoint(const lk_tensor *a, const char *an, const lk_tensor *b,
                            const char *bn) {
    lk_extent ea = lk_view_extent(a), eb = lk_view_extent(b);
    if (ea.lo == ea.hi || eb.lo == eb.hi) return LK_OK;
    if (ea.hi <= eb.lo || eb.hi <= ea.lo) return LK_OK;
    if (views_disjoint(a, b, 0)) return LK_OK;
    return lk_fail(LK_ERR_ALIAS, "%s and %s overlap in memory", an, bn);
}

lk_status lk_check_same_shape(const lk_tensor *a, const char *an, const lk_tensor *b,
                              const char *bn) {
    int same = a->ndim == b->ndim;
    for (int d = 0; same && d < a->ndim; d++) same = a->shape[d] == b->shape[d];
    if (!same)
        return lk_fail(LK_ERR_SHAPE, "%s: shape %s does not match %s %s", an, lk_shape_str(a), bn,
                       lk_shape_str(b));
    return LK_OK;
}

int64_t lk_rows(const lk_tensor *t, int inner) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim - inner; d++) n *= t->shape[d];
    return n;
}

void lk_rowit_init(lk_rowit *it, const lk_tensor *t, int inner, int64_t row) {
    it->nd = t->ndim - inner;
    if (it->nd < 0) it->nd = 0;
    it->off = 0;
    for (int d = it->nd - 1; d >= 0; d--) {
        it->shape[d] = t->shape[d];
        /* a size-1 dim is never stepped: its stride (which lk_check_view does not bound)
         * must not enter the offset arithmetic of lk_rowit_next */
        it->stride[d] = t->shape[d] == 1 ? 0 : t->stride[d];
        it->idx[d] = t->shape[d] ? row % t->shape[d] : 0;
        row = t->shape[d] ? row / t->shape[d] : 0;
        it->off += it->idx[d] * t->stride[d];
    }
}

float *lk_weights_f32(const lk_tensor *w, int add_one) {
    int64_t n = w->shape[0];
    float *g = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!g) return NULL;
    for (int64_t i = 0; i < n; i++)
        g[i] = lk_load_f(w->data, w->dtype, i * w->stride[0]) + (add_one ? 1.0f : 0.0f);
    return g;
}
