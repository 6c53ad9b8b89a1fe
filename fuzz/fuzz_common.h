/*
 * Shared machinery of the libFuzzer harnesses (fuzz/fuzz_<family>.c), one header
 * included by each harness (every function is static: a harness is one translation
 * unit linked with the library objects built with the same sanitizer flags).
 *
 * A harness decodes the fuzz input into a "world": arenas (heap allocations of EXACTLY
 * the bytes their views touch, so ASan reports any access outside a view) and views
 * (lk_tensor + role) placed in them, plus the op's scalar attributes. fz_run() then
 *   1. snapshots every arena and clones the world (same layouts, same aliasing),
 *   2. calls the op with one SIMD ISA on the world (the input picks one of those the CPU
 *      runs: every ISA's build of the shared SIMD sources gets fuzzed) and with
 *      LK_ISA_REF on the clone,
 *   3. checks: same status; on error every arena bit-identical to the snapshot and a
 *      non-empty lk_last_error(); on LK_OK every byte outside the written views
 *      unchanged and each written view equal to the ref result (bitwise or within the
 *      per-view tolerance); plus the expectations the harness derived independently:
 *      must_fail (an invalid input that the library has to reject: overflowing view,
 *      bad rank, NULL data, bad dtype, an actual overlap of an output with anything,
 *      an out-of-range index the harness injected) and clean (a fully valid input that
 *      the library has to accept).
 * Any violated check prints a report and aborts, which libFuzzer records as a crash.
 *
 * View layouts come from the input: contiguous, padded, permuted, negative strides,
 * zero (broadcast) strides, huge strides on size-1 dims, and "wild" strides (INT64_MIN,
 * INT64_MAX, 2^62, ...) whose byte extent overflows; plus rare bad ranks, dtypes and
 * NULL data. Values: uniform in a range given by the harness, with specials (0, -0,
 * +-inf, NaN) at a rate taken from the input.
 */
#ifndef LK_FUZZ_COMMON_H
#define LK_FUZZ_COMMON_H

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmkern.h"
#include "../src/core/half.h"

#define FZ_MAX_VIEWS 24
#define FZ_MAX_ARENAS 24
#define FZ_MAX_BYTES ((int64_t)1 << 20) /* larger valid views are re-made contiguous */
#define FZ_MAX_NUMEL ((int64_t)1 << 15)

/* ---------------------------------------------------------------- input decoding */

typedef struct {
    const uint8_t *p;
    size_t n, i;
} fz_in;

/* past the end of the input: 0x80, a neutral byte (no rare event, contiguous layout) */
static inline unsigned fz_u8(fz_in *in) { return in->i < in->n ? in->p[in->i++] : 0x80u; }
static inline uint32_t fz_u32(fz_in *in) {
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) v = v << 8 | fz_u8(in);
    return v;
}
static inline uint64_t fz_u64(fz_in *in) { return (uint64_t)fz_u32(in) << 32 | fz_u32(in); }
/* value in [lo, hi] from one or two bytes */
static inline int64_t fz_range(fz_in *in, int64_t lo, int64_t hi) {
    uint64_t span = (uint64_t)(hi - lo) + 1;
    uint64_t v = span > 256 ? (fz_u8(in) << 8 | fz_u8(in)) : fz_u8(in);
    return lo + (int64_t)(v % span);
}
/* 1 with probability about k/256 */
static inline int fz_chance(fz_in *in, unsigned k) { return fz_u8(in) < k; }

/* a dimension: mostly in [1, max], sometimes 0, sometimes exactly max */
static inline int64_t fz_dim(fz_in *in, int64_t max) {
    unsigned b = fz_u8(in);
    if (b < 8) return 0;
    if (b < 24) return max;
    if (b < 40) return 1;
    return 1 + (int64_t)(b % (unsigned)max);
}

/* ---- group sizes of the block-scaled quantizers (fuzz_fp8_act, fuzz_act_quant) ---- */

/* a non-divisor of n (>= 1): the smallest in [2, n), else n + 1 */
static inline int64_t fz_non_divisor(int64_t n) {
    for (int64_t d = 2; d < n; d++)
        if (n % d) return d;
    return n + 1;
}

/* a divisor of n >= 1, picked by b */
static inline int64_t fz_divisor_of(int64_t n, unsigned b) {
    int64_t dv[64], k = 0;
    for (int64_t d = 1; d <= n && k < 64; d++)
        if (n % d == 0) dv[k++] = d;
    return dv[b % (unsigned)k];
}

/* a row length D (returned) and its group G (*G): G from {1 .. 8, 16, 17, 32, 64, 128}
 * with D = ng G (ng 0 .. 8, or 0 .. 3 for G >= 64); D in 0 .. 70 with any divisor of it;
 * or G = D (one group a row; 128 when D is 0) */
static inline int64_t fz_group_row(fz_in *in, int64_t *G) {
    static const int64_t GS[12] = {1, 2, 3, 4, 5, 7, 8, 16, 17, 32, 64, 128};
    int64_t D;
    unsigned k = fz_u8(in) % 8;
    if (k < 5) {
        *G = GS[fz_u8(in) % 12];
        D = fz_dim(in, *G >= 64 ? 3 : 8) * *G;
    } else if (k < 7) {
        D = fz_dim(in, 70);
        *G = D ? fz_divisor_of(D, fz_u8(in)) : 1 + (int64_t)(fz_u8(in) % 8);
    } else {
        D = fz_dim(in, 70);
        *G = D ? D : 128;
    }
    return D;
}

/* the group_size passed for rows of D in groups of G (returned): G, or rarely a bad one (0,
 * -1, -G, INT64_MIN, INT64_MAX, a non-divisor, 2 D + 1; or D and 2 G, which may divide D:
 * valid). *ngs: the scales a row to build (D / group_size; for a group_size < 1, D / G;
 * for a non-divisor D / G or D / group_size rounded down); *gfail: the status the
 * group_size rule gives (LK_OK: valid) */
static inline int64_t fz_group_size(fz_in *in, int64_t D, int64_t G, int64_t *ngs, lk_status *gfail) {
    int64_t gs = G;
    if (fz_chance(in, 20)) {
        const int64_t BG[10] = {0, -1, -G, INT64_MIN, INT64_MAX, fz_non_divisor(D), 2 * D + 1, D, 2 * G, G + 1};
        gs = BG[fz_u8(in) % 10];
    }
    *ngs = D / G;
    *gfail = LK_OK;
    if (gs < 1) *gfail = LK_ERR_VALUE;
    else if (D % gs) {
        *gfail = LK_ERR_SHAPE;
        if (fz_u8(in) & 1) *ngs = D / gs;
    } else
        *ngs = D / gs;
    return gs;
}

/* ---------------------------------------------------------------- rng for bulk values */

static inline uint64_t fz_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static inline double fz_unif(uint64_t *s) { return (double)(fz_next(s) >> 11) * 0x1.0p-53; }

/* ---------------------------------------------------------------- world */

static inline int fz_is_float(lk_dtype dt) { return dt == LK_F32 || dt == LK_F16 || dt == LK_BF16; }
static inline int fz_is_fp8(lk_dtype dt) { return dt == LK_F8E4M3 || dt == LK_F8E5M2; }
static inline int fz_is_index(lk_dtype dt) { return dt == LK_I32 || dt == LK_I64; }

/* FZ_NONE: a parent buffer whose slices are the op's views; not passed to the op */
enum { FZ_IN = 0, FZ_OUT = 1, FZ_IDX = 2, FZ_NONE = 3 };
enum { FZ_CMP_TOL = 0, FZ_CMP_BITS = 1 };

typedef struct {
    unsigned char *p; /* malloc'd, exactly n bytes (a 0-byte block for views touching nothing) */
    size_t n;
} fz_arena;

typedef struct {
    lk_tensor t;
    const char *name;
    int arena;
    int role;       /* FZ_IN, FZ_OUT (written by the op; in place counts), FZ_IDX */
    int bad;        /* invalid on its own: must be rejected */
    int inplace_of; /* view it may be identical to (in place allowed by the op), else -1 */
    int cmp;        /* FZ_CMP_TOL or FZ_CMP_BITS for written views */
    double atol, rtol;
    int nonfinite_any; /* NaN and +-inf count as equal (where the ref's double arithmetic
                        * and the f32 kernels legitimately differ on non-finite inputs) */
    double sat_any;    /* > 0, an fp8 out: NaN and +-sat_any (its saturated max, where an
                        * infinite value was stored) count as equal, nonfinite_any's rule
                        * through a saturating conversion */
} fz_view;

typedef struct {
    fz_arena a[FZ_MAX_ARENAS];
    int na;
    fz_view v[FZ_MAX_VIEWS];
    int nv;
    int must_fail;        /* the input is invalid: the op must return an error */
    const char *why_fail; /* first reason */
    int clean;            /* everything valid: the op must return LK_OK */
    int threads;
    int isa_pick;         /* which of the CPU's SIMD ISAs runs the op */
    uint64_t rng;
    double special_rate;  /* fraction of special values in fills */
    const char *op;       /* for reports */
} fz_world;

static inline int fz_usable(const fz_world *w, int vi);
static inline int64_t fz_off(const lk_tensor *t, int64_t i);
static inline int64_t fz_numel(const lk_tensor *t);

static void fz_dump(const fz_world *w) {
    fprintf(stderr, "  isa %s, threads %d, must_fail %d (%s), clean %d\n",
            lk_isa_name(lk_isa_current()), w->threads, w->must_fail,
            w->why_fail ? w->why_fail : "-", w->clean);
    for (int i = 0; i < w->nv; i++) {
        const lk_tensor *t = &w->v[i].t;
        fprintf(stderr, "  view %-14s role %d bad %d arena %d (%zu bytes) dtype %d ndim %d shape [",
                w->v[i].name, w->v[i].role, w->v[i].bad, w->v[i].arena, w->a[w->v[i].arena].n,
                (int)t->dtype, (int)t->ndim);
        for (int d = 0; d < t->ndim && d < LK_MAX_DIMS && d >= 0; d++)
            fprintf(stderr, d ? ", %lld" : "%lld", (long long)t->shape[d]);
        fprintf(stderr, "] stride [");
        for (int d = 0; d < t->ndim && d < LK_MAX_DIMS && d >= 0; d++)
            fprintf(stderr, d ? ", %lld" : "%lld", (long long)t->stride[d]);
        fprintf(stderr, "] data %s", t->data ? "set" : "NULL");
        if (fz_usable(w, i) && (fz_numel(t) <= 64 || (getenv("FZ_VERBOSE") && getenv("FZ_VERBOSE")[0] == '2'))) { /* small views: the values */
            fprintf(stderr, "\n    values:");
            for (int64_t k = 0; k < fz_numel(t); k++) {
                if (fz_is_index(t->dtype))
                    fprintf(stderr, " %lld", (long long)lk_load_index(t->data, t->dtype, fz_off(t, k)));
                else if (fz_is_float(t->dtype) || fz_is_fp8(t->dtype))
                    fprintf(stderr, " %g", (double)lk_load_f(t->data, t->dtype, fz_off(t, k)));
            }
        }
        fprintf(stderr, "\n");
    }
}

static void fz_report(const fz_world *w, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "\n==== llmkern fuzz failure in %s: ", w->op);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    fz_dump(w);
    abort();
}

static void fz_fail_expected(fz_world *w, const char *why) {
    if (!w->must_fail) w->why_fail = why;
    w->must_fail = 1;
    w->clean = 0;
}

static void fz_init(fz_world *w, fz_in *in, const char *op) {
    memset(w, 0, sizeof *w);
    w->op = op;
    w->clean = 1;
    w->rng = fz_u64(in);
    unsigned sp = fz_u8(in);
    w->special_rate = sp < 160 ? 0.0 : sp < 224 ? 0.02 : sp < 248 ? 0.2 : 1.0;
    unsigned tb = fz_u8(in);
    w->threads = 1 + (int)(tb % 3);
    w->isa_pick = (int)(tb / 3);
}

static void fz_free(fz_world *w) {
    for (int i = 0; i < w->na; i++) free(w->a[i].p);
    w->na = 0;
}

static int fz_arena_new(fz_world *w, size_t n) {
    if (w->na >= FZ_MAX_ARENAS) abort(); /* harness bug */
    fz_arena *a = &w->a[w->na];
    a->p = malloc(n ? n : 1);
    if (!a->p) abort();
    a->n = n;
    for (size_t i = 0; i < n; i++) a->p[i] = (unsigned char)fz_next(&w->rng); /* garbage */
    return w->na++;
}

static inline int64_t fz_es(lk_dtype dt) { return (int64_t)lk_dtype_size(dt); }

/* element offset of logical (row-major) flat index i */
static inline int64_t fz_off(const lk_tensor *t, int64_t i) {
    int64_t off = 0;
    for (int d = t->ndim - 1; d >= 0; d--) {
        int64_t s = t->shape[d];
        off += (i % s) * t->stride[d];
        i /= s;
    }
    return off;
}

static inline int64_t fz_numel(const lk_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

/* exact extent in elements relative to element 0, in 128-bit arithmetic */
typedef struct {
    __int128 lo, hi, numel; /* numel saturates at 2^100 */
    int empty;
} fz_ext;

static fz_ext fz_extent(const lk_tensor *t) {
    fz_ext e = {0, 0, 1, 0};
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] == 0) e.empty = 1;
        e.numel *= t->shape[d];
        if (e.numel > ((__int128)1 << 100)) e.numel = (__int128)1 << 100;
    }
    if (e.empty) return e;
    for (int d = 0; d < t->ndim; d++) {
        __int128 x = (__int128)(t->shape[d] - 1) * t->stride[d];
        if (x < 0) e.lo += x;
        else e.hi += x;
    }
    return e;
}

/* what the library must do with a view on its own: 1 = must reject */
static int fz_view_invalid(const lk_tensor *t) {
    if (t->ndim < 0 || t->ndim > LK_MAX_DIMS) return 1;
    if (lk_dtype_size(t->dtype) == 0) return 1;
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] < 0 || t->stride[d] == INT64_MIN) return 1; /* |INT64_MIN| overflows */
    fz_ext e = fz_extent(t);
    if (e.empty) return 0;
    if (e.numel > INT64_MAX) return 1;
    /* byte offsets beyond 2^62 are rejected (lk_check_view keeps pointer differences
     * representable) */
    if ((e.hi - e.lo + 1) * fz_es(t->dtype) > ((__int128)1 << 62)) return 1;
    if (!t->data) return 1;
    return 0;
}

static const int64_t FZ_WILD[] = {INT64_MIN, INT64_MAX, INT64_MAX / 2, INT64_MAX / 3,
                                  (int64_t)1 << 62, -((int64_t)1 << 62), (int64_t)1 << 61,
                                  (int64_t)1 << 40, -((int64_t)1 << 40), INT64_MIN + 1,
                                  (int64_t)1 << 31, -1, 0, 1};

/* fill strides of t (shape set) from the layout byte `mode` */
static void fz_layout(fz_in *in, lk_tensor *t, unsigned mode) {
    int nd = t->ndim;
    int order[LK_MAX_DIMS];
    for (int d = 0; d < nd; d++) order[d] = d;
    unsigned kind = mode % 16;
    if (kind == 10 || kind == 11) /* permuted: Fisher-Yates from the input */
        for (int d = nd - 1; d > 0; d--) {
            int j = (int)(fz_u8(in) % (unsigned)(d + 1)), x = order[d];
            order[d] = order[j], order[j] = x;
        }
    int64_t s = 1;
    for (int k = nd - 1; k >= 0; k--) {
        int d = order[k];
        t->stride[d] = s;
        int64_t ext = t->shape[d] > 0 ? t->shape[d] : 1;
        int64_t pad = (kind == 8 || kind == 9 || kind == 12) ? (int64_t)(fz_u8(in) % 4) : 0;
        s *= ext + pad;
        if (s > FZ_MAX_BYTES) s = FZ_MAX_BYTES; /* fallback below re-makes it */
    }
    if (kind == 12) /* negative strides on a subset of dims */
        for (int d = 0; d < nd; d++)
            if (fz_u8(in) & 1) t->stride[d] = -t->stride[d];
    if (kind == 13) /* broadcast: zero strides on a subset of dims */
        for (int d = 0; d < nd; d++)
            if (fz_u8(in) & 1) t->stride[d] = 0;
    if (kind == 14) /* huge strides on size-1 dims: valid, but overflow-prone arithmetic */
        for (int d = 0; d < nd; d++)
            if (t->shape[d] == 1) t->stride[d] = FZ_WILD[fz_u8(in) % 12];
    if (kind == 15) { /* wild: one or more dims get an extreme stride */
        int n = 1 + (int)(fz_u8(in) % 2);
        for (int k = 0; k < n && nd > 0; k++) t->stride[fz_u8(in) % (unsigned)nd] = FZ_WILD[fz_u8(in) % 14];
    }
}

/* make a contiguous version of t's strides */
static void fz_contiguous(lk_tensor *t) {
    int64_t s = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        t->stride[d] = s;
        if (__builtin_mul_overflow(s, t->shape[d] > 0 ? t->shape[d] : 1, &s)) s = INT64_MAX;
    }
}

/* Place t (shape, strides, dtype set) in a new arena of exactly its extent. */
static void fz_place(fz_world *w, fz_view *v) {
    lk_tensor *t = &v->t;
    int neg = 0;
    for (int d = 0; d < t->ndim && d < LK_MAX_DIMS; d++) neg |= t->shape[d] < 0;
    if (t->ndim < 0 || t->ndim > LK_MAX_DIMS || lk_dtype_size(t->dtype) == 0 || neg) {
        v->arena = fz_arena_new(w, 0);
        t->data = w->a[v->arena].p;
        return;
    }
    t->data = (void *)1; /* non-NULL for the validity test */
    fz_ext e = fz_extent(t);
    int64_t es = fz_es(t->dtype);
    if (!e.empty && !fz_view_invalid(t) &&
        ((e.hi - e.lo + 1) * es > FZ_MAX_BYTES || e.numel > FZ_MAX_NUMEL)) {
        fz_contiguous(t); /* valid but too large to allocate: re-made contiguous */
        e = fz_extent(t);
    }
    if (e.empty || fz_view_invalid(t)) {
        v->arena = fz_arena_new(w, 0);
        t->data = w->a[v->arena].p;
        return;
    }
    size_t bytes = (size_t)((e.hi - e.lo + 1) * es);
    v->arena = fz_arena_new(w, bytes);
    t->data = w->a[v->arena].p - (int64_t)e.lo * es; /* element 0 lies inside the arena */
}

/* A new view in its own arena; the layout, and rarely a bad rank / dtype / size / NULL
 * data, from the input. role FZ_OUT marks written views; FZ_NONE makes a parent buffer
 * (valid, never wild) to slice views from. Returns the view index. */
static int fz_view_new(fz_world *w, fz_in *in, const char *name, lk_dtype dt, int nd,
                       const int64_t *shape, int role) {
    int parent = role == FZ_NONE;
    if (w->nv >= FZ_MAX_VIEWS) abort();
    int vi = w->nv++;
    fz_view *v = &w->v[vi];
    memset(v, 0, sizeof *v);
    v->name = name;
    v->role = role;
    v->inplace_of = -1;
    v->cmp = FZ_CMP_BITS;
    lk_tensor *t = &v->t;
    t->dtype = dt;
    t->ndim = nd;
    for (int d = 0; d < nd; d++) t->shape[d] = shape[d];
    unsigned mode = fz_u8(in);
    if (parent && mode % 16 >= 14) mode = 0; /* a parent's slices must stay placeable */
    /* slices of a permuted / reversed / broadcast parent interleave element by element;
     * the library's disjointness proof (lk_check_disjoint) is conservative there and may
     * reject such views although they do not overlap, so they are not "clean" */
    if (parent && mode % 16 >= 10) w->clean = 0;
    fz_layout(in, t, mode);
    unsigned rare = parent ? 0 : fz_u8(in);
    if (rare == 255) { /* bad rank */
        t->ndim = fz_u8(in) & 1 ? LK_MAX_DIMS + 1 + (int)(fz_u8(in) % 3) : -1;
    } else if (rare == 254) { /* dtype unknown or of the wrong kind for the argument */
        /* fp8 is of the wrong kind for every argument until an operator takes it */
        static const int bad_float[] = {LK_I32, LK_I64, LK_F8E4M3, LK_F8E5M2, 77};
        static const int bad_index[] = {LK_F32, LK_F16, LK_BF16, LK_F8E5M2, -1};
        int k = (int)(fz_u8(in) % 5);
        t->dtype = (lk_dtype)(role == FZ_IDX ? bad_index[k] : bad_float[k]);
    } else if (rare == 253 && nd > 0) { /* negative size */
        t->shape[fz_u8(in) % (unsigned)nd] = fz_u8(in) & 1 ? -1 : INT64_MIN;
    } else if (rare == 252 && nd > 0) { /* element count / byte offsets overflow */
        t->shape[0] = INT64_MAX;
        for (int d = 1; d < nd; d++) t->shape[d] = 2;
        fz_contiguous(t);
    }
    fz_place(w, v);
    if (rare == 251) t->data = NULL;
    v->bad = fz_view_invalid(t) || (rare == 254 && t->dtype != dt); /* a draw of dt itself is no bad dtype */
    if (v->bad) fz_fail_expected(w, name);
    return vi;
}

/* child view of parent p: [start, start + len) of dim d (a slice sharing the arena) */
static int fz_view_narrow(fz_world *w, int p, const char *name, int d, int64_t start, int64_t len,
                          int role) {
    if (w->nv >= FZ_MAX_VIEWS) abort();
    int vi = w->nv++;
    fz_view *v = &w->v[vi];
    *v = w->v[p];
    v->name = name;
    v->role = role;
    v->inplace_of = -1;
    v->t.shape[d] = len;
    if (v->t.data) /* a rare NULL-data parent stays NULL (no offset on a null pointer) */
        v->t.data = (char *)v->t.data + start * v->t.stride[d] * fz_es(v->t.dtype);
    return vi;
}

/* child view of parent p with dim d removed, at index idx */
static int fz_view_select(fz_world *w, int p, const char *name, int d, int64_t idx, int role) {
    int vi = fz_view_narrow(w, p, name, d, idx, 1, role);
    lk_tensor *t = &w->v[vi].t;
    for (int k = d; k < t->ndim - 1; k++) t->shape[k] = t->shape[k + 1], t->stride[k] = t->stride[k + 1];
    t->ndim--;
    return vi;
}

/* a second handle on view p (identical tensor), e.g. out = x in place */
static int fz_view_alias(fz_world *w, int p, const char *name, int role) {
    if (w->nv >= FZ_MAX_VIEWS) abort();
    int vi = w->nv++;
    w->v[vi] = w->v[p];
    w->v[vi].name = name;
    w->v[vi].role = role;
    w->v[vi].inplace_of = p;
    return vi;
}

static inline const lk_tensor *fz_t(const fz_world *w, int vi) { return vi < 0 ? NULL : &w->v[vi].t; }

static inline int fz_usable(const fz_world *w, int vi) {
    const fz_view *v = &w->v[vi];
    return !v->bad && v->t.data && v->t.ndim >= 0 && v->t.ndim <= LK_MAX_DIMS &&
           lk_dtype_size(v->t.dtype) != 0 && !fz_extent(&v->t).empty;
}

/* ---------------------------------------------------------------- values */

static float fz_special(uint64_t *r) {
    static const float sp[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 1.0f, -1.0f};
    return sp[fz_next(r) % 8];
}

/* fill a float view's elements with uniform values in [lo, hi) (+ specials) */
static void fz_fill(fz_world *w, int vi, double lo, double hi) {
    fz_view *v = &w->v[vi];
    if (!fz_usable(w, vi) || !fz_is_float(v->t.dtype)) return;
    int64_t n = fz_numel(&v->t);
    for (int64_t i = 0; i < n; i++) {
        float x = fz_unif(&w->rng) < w->special_rate ? fz_special(&w->rng)
                                                       : (float)(lo + (hi - lo) * fz_unif(&w->rng));
        lk_store_f(v->t.data, v->t.dtype, fz_off(&v->t, i), x);
    }
}

/* store index value x at logical i (truncated to i32 for i32 views) */
static void fz_set_idx(fz_world *w, int vi, int64_t i, int64_t x) {
    fz_view *v = &w->v[vi];
    if (!fz_usable(w, vi) || !fz_is_index(v->t.dtype)) return;
    int64_t off = fz_off(&v->t, i);
    if (v->t.dtype == LK_I64) ((int64_t *)v->t.data)[off] = x;
    else ((int32_t *)v->t.data)[off] = (int32_t)x;
}

/* boundary values for corrupting index tensors, around a valid range [0, hi) */
static int64_t fz_bad_index(fz_in *in, int64_t hi) {
    switch (fz_u8(in) % 8) {
    case 0: return hi;
    case 1: return hi + 1;
    case 2: return INT32_MAX;
    case 3: return INT32_MIN;
    case 4: return INT64_MAX;
    case 5: return INT64_MIN;
    case 6: return hi + ((int64_t)1 << 32); /* wraps to a valid value in i32 */
    default: return (int64_t)fz_u32(in) - ((int64_t)1 << 31);
    }
}

/* value an index view holds at logical i after the store (i32 truncation) */
static inline int64_t fz_stored(const fz_world *w, int vi, int64_t x) {
    return w->v[vi].t.dtype == LK_I32 ? (int64_t)(int32_t)x : x;
}

/* index value stored at logical i of an index view (0 for an unusable view) */
static int64_t fz_idx_get(const fz_world *w, int vi, int64_t i) {
    const fz_view *v = &w->v[vi];
    if (!fz_usable(w, vi) || !fz_is_index(v->t.dtype)) return 0;
    return lk_load_index(v->t.data, v->t.dtype, fz_off(&v->t, i));
}

/* slot_mapping's first n stored values re-validated as the cache writes require: each
 * < nslots, no slot >= 0 twice (fz_fail_expected otherwise) */
static void fz_check_slots(fz_world *w, int sm, int64_t n, int64_t nslots) {
    if (!fz_usable(w, sm)) return;
    for (int64_t i = 0; i < n; i++) {
        int64_t s = fz_idx_get(w, sm, i);
        if (s >= nslots) fz_fail_expected(w, "slot beyond the cache");
        for (int64_t j = 0; j < i && s >= 0; j++)
            if (fz_idx_get(w, sm, j) == s) fz_fail_expected(w, "slot used twice");
    }
}

/* sv[0, N) = a latent-cache write's slots: distinct slots of a shuffled [0, nslots) with
 * about a quarter -1 (padding), then maybe one slot copied over another (a duplicate) */
static void fz_slot_values(fz_world *w, fz_in *in, int64_t *sv, int64_t N, int64_t nslots) {
    int64_t *perm = malloc(sizeof(int64_t) * (size_t)(nslots > 0 ? nslots : 1));
    if (!perm) abort();
    for (int64_t i = 0; i < nslots; i++) perm[i] = i;
    for (int64_t i = nslots - 1; i > 0; i--) {
        int64_t j = (int64_t)(fz_next(&w->rng) % (uint64_t)(i + 1)), x = perm[i];
        perm[i] = perm[j], perm[j] = x;
    }
    for (int64_t i = 0; i < N; i++) sv[i] = i < nslots && fz_next(&w->rng) % 4 ? perm[i] : -1;
    if (N >= 2 && fz_chance(in, 16)) sv[fz_range(in, 0, N - 1)] = sv[fz_range(in, 0, N - 1)];
    free(perm);
}

/* c a copy of w before a successful lk_concat_and_cache_mla_rope: its contract's two
 * steps (lk_rotary_embedding of q_pe and k_pe as [T, 1, Dr] with positions[:T], then
 * lk_concat_and_cache_mla_fp8) run on c must give w's bytes; at(w, arena, byte) names
 * where a difference lies (NULL: nothing) */
static void fz_rope_then_concat(const fz_world *w, fz_world *c, int pos_v, int q_v, int k_v, int cs_v, int neox,
                                int kv_v, int c0_v, int c1_v, int sm_v, lk_kv_layout layout, int scale_v,
                                const char *(*at)(const fz_world *, int, size_t)) {
    lk_tensor pos = c->v[pos_v].t, k3 = c->v[k_v].t;
    pos.shape[0] = c->v[q_v].t.shape[0]; /* positions[:T] */
    k3.ndim = 3;                         /* k_pe [T, Dr] as [T, 1, Dr] */
    k3.shape[2] = k3.shape[1], k3.stride[2] = k3.stride[1];
    k3.shape[1] = 1, k3.stride[1] = 0;
    lk_status s = lk_rotary_embedding(&pos, fz_t(c, q_v), &k3, fz_t(c, cs_v), neox);
    if (s) fz_report(w, "accepted, but lk_rotary_embedding rejects its rope step: %s (%s)", lk_status_str(s),
                     lk_last_error());
    s = lk_concat_and_cache_mla_fp8(fz_t(c, kv_v), fz_t(c, k_v), fz_t(c, c0_v), fz_t(c, c1_v),
                                    fz_t(c, sm_v), layout, fz_t(c, scale_v));
    if (s) fz_report(w, "accepted, but lk_concat_and_cache_mla_fp8 rejects its cache step: %s (%s)",
                     lk_status_str(s), lk_last_error());
    for (int ai = 0; ai < w->na; ai++)
        for (size_t b = 0; b < w->a[ai].n; b++)
            if (w->a[ai].p[b] != c->a[ai].p[b])
                fz_report(w, "%s differs from lk_rotary_embedding + lk_concat_and_cache_mla_fp8 at byte %zu "
                          "of arena %d (%s): 0x%02x vs 0x%02x", lk_isa_name(lk_isa_current()), b, ai,
                          at ? at(w, ai, b) : "", w->a[ai].p[b], c->a[ai].p[b]);
}

/* store n values (a valid pattern), then maybe corrupt one entry from the input
 * (fz_bad_index around [0, hi)); callers re-validate from the stored values */
static void fz_idx_fill(fz_world *w, fz_in *in, int vi, const int64_t *vals, int64_t n, int64_t hi) {
    for (int64_t i = 0; i < n; i++) fz_set_idx(w, vi, i, vals[i]);
    if (n > 0 && fz_chance(in, 24)) fz_set_idx(w, vi, fz_range(in, 0, n - 1), fz_bad_index(in, hi));
}

/* a dtype for a float argument */
static inline lk_dtype fz_ftype(fz_in *in) {
    static const lk_dtype FT[3] = {LK_F32, LK_F16, LK_BF16};
    return FT[fz_u8(in) % 3];
}

/* ---------------------------------------------------------------- overlap analysis */

/* the same view: data, dtype, rank, shape, and strides of dims longer than 1 */
static int fz_same_view(const lk_tensor *a, const lk_tensor *b) {
    if (a->data != b->data || a->dtype != b->dtype || a->ndim != b->ndim) return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d] || (a->shape[d] > 1 && a->stride[d] != b->stride[d])) return 0;
    return 1;
}

/* Exact byte-level overlap of every written view with itself and with any other view
 * (an identical in-place pair excepted): each such input must be rejected. */
static void fz_overlaps(fz_world *w) {
    for (int ai = 0; ai < w->na; ai++) {
        size_t n = w->a[ai].n;
        if (!n) continue;
        uint32_t *m = NULL;
        for (int vi = 0; vi < w->nv; vi++) {
            fz_view *v = &w->v[vi];
            if (v->arena != ai || !fz_usable(w, vi) || v->role == FZ_NONE) continue;
            if (!m) m = calloc(n, sizeof *m);
            lk_tensor *t = &v->t;
            int64_t num = fz_numel(t), es = fz_es(t->dtype);
            uintptr_t base = (uintptr_t)w->a[ai].p;
            for (int64_t i = 0; i < num; i++) {
                uintptr_t b = (uintptr_t)t->data + (uintptr_t)(fz_off(t, i) * es) - base;
                for (int64_t k = 0; k < es; k++) {
                    if ((m[b + k] >> vi) & 1u) {
                        if (v->role == FZ_OUT) fz_fail_expected(w, "output overlaps itself");
                    }
                    m[b + k] |= 1u << vi;
                }
            }
        }
        if (!m) continue;
        for (size_t b = 0; b < n; b++) {
            uint32_t bits = m[b];
            if (!(bits & (bits - 1))) continue;
            for (int vi = 0; vi < w->nv; vi++) {
                if (!((bits >> vi) & 1u) || w->v[vi].role != FZ_OUT) continue;
                for (int vj = 0; vj < w->nv; vj++) {
                    if (vj == vi || !((bits >> vj) & 1u)) continue;
                    int pair = (w->v[vi].inplace_of == vj || w->v[vj].inplace_of == vi) &&
                               fz_same_view(&w->v[vi].t, &w->v[vj].t);
                    if (!pair) fz_fail_expected(w, "output overlaps another view");
                }
            }
        }
        free(m);
    }
}

/* ---------------------------------------------------------------- run + compare */

typedef lk_status (*fz_call_fn)(const fz_world *w, const void *attrs);

/* FZ_STATS=1: print how many calls succeeded / failed per status at exit */
static long fz_count[16];
static void fz_print_stats(void) {
    fprintf(stderr, "fz stats:");
    for (int i = 0; i < 16; i++)
        if (fz_count[i]) fprintf(stderr, " %s %ld", lk_status_str((lk_status)i), fz_count[i]);
    fprintf(stderr, "\n");
}

static void fz_clone(const fz_world *w, fz_world *c) {
    *c = *w;
    for (int i = 0; i < w->na; i++) {
        c->a[i].p = malloc(w->a[i].n ? w->a[i].n : 1);
        if (!c->a[i].p) abort();
        memcpy(c->a[i].p, w->a[i].p, w->a[i].n);
    }
    for (int i = 0; i < w->nv; i++) {
        const fz_view *v = &w->v[i];
        if (!v->t.data) continue;
        intptr_t rel = (intptr_t)((uintptr_t)v->t.data - (uintptr_t)w->a[v->arena].p);
        c->v[i].t.data = (void *)((uintptr_t)c->a[v->arena].p + (uintptr_t)rel);
    }
}

static double fz_get(const lk_tensor *t, int64_t i) {
    if (t->dtype == LK_I8) return (double)((const int8_t *)t->data)[fz_off(t, i)]; /* the int8 quantizers' out */
    return (double)lk_load_f(t->data, t->dtype, fz_off(t, i));
}

static int fz_close(double got, double want, double atol, double rtol) {
    if (isnan(got) || isnan(want)) return isnan(got) && isnan(want);
    if (isinf(got) || isinf(want)) return got == want;
    return fabs(got - want) <= atol + rtol * fabs(want);
}

/* the largest finite |value| of a float or fp8 view (0 when unusable) */
static double fz_maxabs(const fz_world *w, int vi) {
    if (vi < 0 || !fz_usable(w, vi)) return 0;
    const lk_tensor *t = &w->v[vi].t;
    if (!fz_is_float(t->dtype) && !fz_is_fp8(t->dtype)) return 0;
    double m = 0;
    for (int64_t i = 0, n = fz_numel(t); i < n; i++) {
        double x = fabs((double)lk_load_f(t->data, t->dtype, fz_off(t, i)));
        if (isfinite(x) && x > m) m = x;
    }
    return m;
}

/* per-dtype tolerance of a SIMD result against the reference kernel (the test suite's
 * vs-ref tolerances): f32 1e-5 (the caller may widen), f16 1e-3, bf16 8e-3 */
static void fz_tol(fz_world *w, int vi, double f32_tol) {
    fz_view *v = &w->v[vi];
    v->cmp = FZ_CMP_TOL;
    double t = v->t.dtype == LK_F16 ? 1e-3 : v->t.dtype == LK_BF16 ? 8e-3 : f32_tol;
    v->atol = v->rtol = t;
}

static void fz_run(fz_world *w, fz_call_fn call, const void *attrs) {
    fz_overlaps(w);
    fz_world r;
    fz_clone(w, &r);
    unsigned char *snap[FZ_MAX_ARENAS];
    for (int i = 0; i < w->na; i++) {
        snap[i] = malloc(w->a[i].n ? w->a[i].n : 1);
        memcpy(snap[i], w->a[i].p, w->a[i].n);
    }
    lk_isa simd[8], best = LK_ISA_REF; /* best: the SIMD ISA this input runs */
    int ns = 0;
    for (int i = 1; i <= (int)lk_isa_best() && ns < 8; i++)
        if (lk_set_isa((lk_isa)i) == LK_OK) simd[ns++] = (lk_isa)i;
    if (ns) best = simd[w->isa_pick % ns];
    const char *force = getenv("FZ_ISA"); /* replay an input on another ISA: FZ_ISA=avx2 */
    for (int i = 0; force && i < ns; i++)
        if (!strcmp(lk_isa_name(simd[i]), force)) best = simd[i];
    lk_set_num_threads(w->threads);
    lk_set_isa(best);
    if (getenv("FZ_VERBOSE")) fz_dump(w);
    lk_status s1 = call(w, attrs);
    char err1[512];
    snprintf(err1, sizeof err1, "%s", lk_last_error());
    lk_set_isa(LK_ISA_REF);
    lk_status s2 = call(&r, attrs);
    lk_set_isa(best);
    static int stats_on = -1;
    if (stats_on < 0 && (stats_on = getenv("FZ_STATS") != NULL)) atexit(fz_print_stats);
    if (stats_on && (unsigned)s1 < 16) fz_count[s1]++;
    if (s1 != s2) fz_report(w, "status %s with %s but %s with ref (%s)", lk_status_str(s1),
                            lk_isa_name(best), lk_status_str(s2), err1);
    if (w->must_fail && s1 == LK_OK) fz_report(w, "invalid input accepted (%s)", w->why_fail);
    if (w->clean && s1 != LK_OK) fz_report(w, "valid input rejected: %s (%s)", lk_status_str(s1), err1);
    if (s1 != LK_OK) {
        if (!err1[0] || !strstr(err1, "lk_")) fz_report(w, "error %s without a message", lk_status_str(s1));
        for (int i = 0; i < w->na; i++)
            if (memcmp(w->a[i].p, snap[i], w->a[i].n) || memcmp(r.a[i].p, snap[i], w->a[i].n))
                fz_report(w, "%s returned but arena %d changed", lk_status_str(s1), i);
    } else {
        for (int ai = 0; ai < w->na; ai++) {
            size_t n = w->a[ai].n;
            if (!n) continue;
            unsigned char *m = calloc(n, 1); /* bytes inside written views */
            for (int vi = 0; vi < w->nv; vi++) {
                const fz_view *v = &w->v[vi];
                if (v->arena != ai || v->role != FZ_OUT || !fz_usable(w, vi)) continue;
                int64_t num = fz_numel(&v->t), es = fz_es(v->t.dtype);
                uintptr_t base = (uintptr_t)w->a[ai].p;
                for (int64_t i = 0; i < num; i++)
                    memset(m + ((uintptr_t)v->t.data + (uintptr_t)(fz_off(&v->t, i) * es) - base), 1,
                           (size_t)es);
            }
            for (size_t b = 0; b < n; b++)
                if (!m[b] && (w->a[ai].p[b] != snap[ai][b] || r.a[ai].p[b] != snap[ai][b]))
                    fz_report(w, "byte %zu of arena %d outside every output view changed (%s %s)", b,
                              ai, w->a[ai].p[b] != snap[ai][b] ? lk_isa_name(best) : "",
                              r.a[ai].p[b] != snap[ai][b] ? "ref" : "");
            free(m);
        }
        for (int vi = 0; vi < w->nv; vi++) {
            const fz_view *v = &w->v[vi];
            if (v->role != FZ_OUT || !fz_usable(w, vi)) continue;
            int64_t num = fz_numel(&v->t), es = fz_es(v->t.dtype);
            for (int64_t i = 0; i < num; i++) {
                int64_t off = fz_off(&v->t, i);
                const char *pg = (const char *)v->t.data + off * es;
                const char *pr = (const char *)r.v[vi].t.data + off * es;
                if (v->cmp == FZ_CMP_BITS) {
                    if (memcmp(pg, pr, (size_t)es))
                        fz_report(w, "%s[%lld] differs from ref bitwise (%.9g vs %.9g)", v->name,
                                  (long long)i, fz_get(&v->t, i), fz_get(&r.v[vi].t, i));
                } else {
                    double g = fz_get(&v->t, i), want = fz_get(&r.v[vi].t, i);
                    if (v->nonfinite_any && !isfinite(g) && !isfinite(want)) continue;
                    if (v->sat_any > 0 && (isnan(g) || fabs(g) == v->sat_any) &&
                        (isnan(want) || fabs(want) == v->sat_any))
                        continue;
                    if (!fz_close(g, want, v->atol, v->rtol))
                        fz_report(w, "%s[%lld] = %.9g, ref %.9g (tol %g)", v->name, (long long)i, g,
                                  want, v->atol);
                }
            }
        }
    }
    for (int i = 0; i < w->na; i++) free(snap[i]);
    fz_free(&r);
}

#endif
