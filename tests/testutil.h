/*
 * Test helpers shared by every tests/test_<op>.c.
 *
 *  - counters: tu_check() records one case; tu_finish() prints "<file>: N passed,
 *    N failed" and returns the exit code. tests/run.sh adds the files up.
 *  - tu_buf: a tensor view inside a larger allocation. pad > 0 widens every stride so
 *    the view is strided, and all bytes outside the view (the padding and guard
 *    zones before and after) hold a NaN garbage pattern; tu_outside_intact() checks
 *    that no op wrote there, tu_intact() that nothing at all changed.
 *  - element access by logical flat index (row-major over the view's shape), values
 *    as double.
 *  - one tolerance table by dtype (tu_tol).
 */
#ifndef LK_TESTUTIL_H
#define LK_TESTUTIL_H

#include <stdint.h>
#include <stdio.h>

#include "llmkern.h"

/* ---- counters ---- */
int tu_check(int ok, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
int tu_finish(const char *file);
extern int tu_verbose; /* LLMKERN_TEST_VERBOSE=1 prints every case */
void tu_init(void);

/* ---- random ---- */
void tu_seed(uint64_t s);
uint64_t tu_rand(void);
double tu_uniform(double lo, double hi);
int64_t tu_randint(int64_t lo, int64_t hi); /* inclusive */

/* ---- buffers ---- */
typedef struct {
    lk_tensor t;              /* the view                                   */
    unsigned char *base;      /* allocation                                 */
    size_t bytes;             /* allocation size                            */
    unsigned char *snap;      /* snapshot for intact checks                 */
    unsigned char *inview;    /* per byte: 1 if inside the view             */
} tu_buf;

/* Row-major view of `shape`, every dim's stride padded by `pad` elements of the next
 * inner extent (pad = 0: contiguous). Garbage everywhere, then tu_fill_* the view. */
tu_buf tu_alloc(lk_dtype dt, int ndim, const int64_t *shape, int pad);
/* Same but with the dims stored in `perm` order (perm[i] = logical dim stored as the
 * i-th outermost), e.g. perm {1, 0} for a transposed 2-D view. */
tu_buf tu_alloc_perm(lk_dtype dt, int ndim, const int64_t *shape, const int *perm, int pad);
void tu_free(tu_buf *b);
/* a second allocation with the same layout, bytes, snapshot and view map (tu_free it) */
tu_buf tu_clone(const tu_buf *a);
/* the two whole allocations (padding included) hold the same bytes */
int tu_same_alloc(const tu_buf *a, const tu_buf *b);
/* slot_mapping sm[0, N) = distinct random slots of [0, nslots) (N <= nslots), every 5th
 * (from a random phase) -1 when with_padding */
void tu_random_slots(tu_buf *sm, int64_t N, int64_t nslots, int with_padding);
/* a random permutation of [0, n) (Fisher-Yates by tu_randint; malloc'd, at least one
 * element: free it) */
int64_t *tu_permutation(int64_t n);
/* float64 absorbed MLA decode (K = an entry, V = its first Dl dims): q [B, s_q, H, E] read
 * by tu_get in logical order, ent [B][maxlen][E] request b's entries, len[b] its keys;
 * causal: query i sees keys < len[b] - s_q + i + 1. Allocates *want [B, s_q, H, Dl], *lse
 * [B, H, s_q] (-inf with no key) and, where mag is not NULL, *mag [B, s_q, H, Dl] =
 * sum_j p_j |e_j[d]| / l (the size of the summed terms); free them */
void tu_mla_decode_ref(const tu_buf *q, const double *ent, const int64_t *len, int B, int64_t s_q, int64_t H,
                       int64_t E, int64_t Dl, int64_t maxlen, double scale, int causal, double **want, double **lse,
                       double **mag);
/* a [R, D] view: layout 0 contiguous, 1 padded strides, 2 last-dim stride != 1 (stored
 * transposed) */
tu_buf tu_alloc_rows(lk_dtype dt, int64_t R, int64_t D, int layout);
/* a copy of a buffer's whole allocation (padding included), to restore before each
 * ISA's call and to tell that a call wrote nothing; tu_save's copy is malloc'ed (free
 * .bytes) */
typedef struct {
    unsigned char *bytes;
    size_t n;
} tu_saved;
tu_saved tu_save(const tu_buf *b);
void tu_restore(tu_buf *b, const tu_saved *s);
int tu_same(const tu_buf *b, const tu_saved *s);
int64_t tu_numel(const tu_buf *b);
/* element offset (in elements) of logical flat index i */
int64_t tu_offset(const lk_tensor *t, int64_t i);
double tu_get(const tu_buf *b, int64_t i);
void tu_set(tu_buf *b, int64_t i, double v); /* rounds to the dtype */
/* fill the view with uniform values in [lo, hi) (representable in the dtype) */
void tu_fill_uniform(tu_buf *b, double lo, double hi);
void tu_snapshot(tu_buf *b);
int tu_intact(const tu_buf *b);         /* every byte equals the snapshot */
int tu_outside_intact(const tu_buf *b); /* bytes outside the view equal the snapshot */
/* copy the view's values (as double) to a new array of tu_numel doubles */
double *tu_values(const tu_buf *b);

/* ---- comparison ---- */
typedef struct {
    double atol, rtol;
} tu_tolerance;
tu_tolerance tu_tol(lk_dtype dt); /* f32 1e-5, f16 2e-3, bf16 2e-2 (atol = rtol) */
/* max over i of |got - want| / (atol + rtol |want|); <= 1 passes. NaN positions must
 * match; infinities must match exactly. */
double tu_err(const double *got, const double *want, int64_t n, tu_tolerance tol);
/* bitwise equality of two views' logical contents */
int tu_same_bits(const tu_buf *a, const tu_buf *b);
/* an fp8 cache element q (its f32 value, LK_F8E4M3 / LK_F8E5M2) against float64 x stored
 * with `scale`: q within half an fp8 step of x / scale (the step of |x / scale|: 2^(e - 3)
 * e4m3, 2^(e - 2) e5m2, subnormal 2^-9 / 2^-16; widened by the f32 division's rounding),
 * or +-max where x / scale is beyond it, NaN for NaN, the sign of x unless either is 0
 * (docs/numerics.md "fp8") */
int tu_fp8_close(lk_dtype dt, double x, double scale, double q);

/* ---- inputs ---- */
/* rotary cos / sin cache [max_pos, rot]: [p, i] = cos(p theta_i), [p, rot/2 + i] =
 * sin(p theta_i), theta_i = 10000^(-2i/rot); pad as tu_alloc, transposed: stored with
 * stride 1 along max_pos */
tu_buf tu_cos_sin(lk_dtype dt, int64_t max_pos, int64_t rot, int pad, int transposed);

/* ---- emulation ----
 * LLMKERN_TEST_EMULATED=1 (make test-arm: the binaries run under qemu, tens of times
 * slower): the large-shape cases (non-temporal store and prefetch paths, long rows) run
 * one representative of their dtype grid instead of all of it; every operator, dtype and
 * code path stays covered by the rest of the grid. */
int tu_emulated(void);

/* ---- isa ---- */
#define TU_MAX_ISAS 8
/* ISAs this CPU and build run, in order (ref first; at most TU_MAX_ISAS); returns count */
int tu_isas(lk_isa *out);
/* the bf16 dot-product rows (avx512bf16, amx) take f32 FMA paths where lk_cpu_prefer_fma
 * says so (Intel), dot products elsewhere: tu_other_fma_form(fn) runs fn once more with
 * the other choice forced, tu_isas then giving ref and those rows only */
void tu_other_fma_form(void (*fn)(void));

static const lk_dtype TU_FLOAT_DTYPES[3] = {LK_F32, LK_F16, LK_BF16};

#endif
