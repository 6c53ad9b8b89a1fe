/*
 * Internal core: error reporting, tensor-view checks, row iteration, threading.
 *
 * Validation pattern (one check function per op, before any store):
 *     lk_status s = lk_check_float(out, "out", 1, LK_MAX_DIMS);
 *     if (s) return s;
 * Every lk_check_* / lk_fail call stores a message "<op>: <arg>: <rule>" in the
 * thread-local error buffer and returns the status, so checks chain with `if (s)`.
 */
#ifndef LK_CORE_H
#define LK_CORE_H

#include <stdint.h>

#include "llmkern.h"

/* ---- errors ---- */

/* Name of the public function being validated, for messages (thread-local). */
void lk_set_op(const char *op);
/* Record "<op>: <printf message>" as this thread's last error and return s. */
lk_status lk_fail(lk_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Clear the thread's last error (called on entry of every public op). */
void lk_clear_error(void);

/* ---- tensor views ---- */

/* Byte extent of a view: the lowest and one-past-highest byte addresses it touches
 * (lo == hi for an empty view). Requires lk_check_view to have passed. */
typedef struct {
    uintptr_t lo, hi;
} lk_extent;

int64_t lk_numel(const lk_tensor *t);
/* NULL pointer, ndim in [min_nd, max_nd], known dtype, shapes >= 0, no int64 overflow
 * of element counts or byte offsets, data != NULL when non-empty. */
lk_status lk_check_view(const lk_tensor *t, const char *name, int min_nd, int max_nd);
/* lk_check_view + dtype is f32/f16/bf16. */
lk_status lk_check_float(const lk_tensor *t, const char *name, int min_nd, int max_nd);
/* LK_F8E4M3 or LK_F8E5M2 */
static inline int lk_is_fp8(lk_dtype dt) { return dt == LK_F8E4M3 || dt == LK_F8E5M2; }
/* lk_check_float that also accepts the two fp8 dtypes (for operators that read or write
 * fp8 caches / outputs). */
lk_status lk_check_float8(const lk_tensor *t, const char *name, int min_nd, int max_nd);
/* lk_check_view + dtype is i32/i64. */
lk_status lk_check_index(const lk_tensor *t, const char *name, int min_nd, int max_nd);
/* Output views: no two indices may share an element (no 0 strides on dims > 1, ...). */
lk_status lk_check_no_self_overlap(const lk_tensor *t, const char *name);
/* a and b (one written) must touch disjoint bytes. Exact same view is reported as
 * overlap too; ops allowing in-place test lk_same_view first. */
lk_status lk_check_disjoint(const lk_tensor *a, const char *an, const lk_tensor *b,
                            const char *bn);
/* Same data, dtype, ndim, shape and strides. */
int lk_same_view(const lk_tensor *a, const lk_tensor *b);
/* shape of a equals shape of b on all dims. */
lk_status lk_check_same_shape(const lk_tensor *a, const char *an, const lk_tensor *b,
                              const char *bn);
lk_extent lk_view_extent(const lk_tensor *t);
/* Formats "[2, 3, 4]" into buf (thread-local ring of a few buffers). */
const char *lk_shape_str(const lk_tensor *t);

/* ---- fp8 scales ----
 * quantized = fp8(x / scale), dequantized = f32(q) * scale. A scale argument is NULL
 * (every value 1), or an f32 tensor (any strides) of shape [] or [1] (per tensor), [H]
 * (per head) or [B, H] (per request and head: vLLM's flash-attn q/k/v_descale; refused
 * when lk_scale_init is given B < 0). Every value must be finite and > 0. Kernels read
 * the values through p (the caller's buffer, validated once by lk_scale_init). */
typedef struct {
    const float *p;
    int64_t sb, sh; /* element strides over requests and heads (0 where broadcast) */
} lk_scale;

static inline float lk_scale_at(const lk_scale *s, int64_t b, int64_t h) { return s->p[b * s->sb + h * s->sh]; }
/* per-tensor: the one value (s->sb == s->sh == 0) */
static inline int lk_scale_is_scalar(const lk_scale *s) { return s->sb == 0 && s->sh == 0; }
/* Validate t (NULL allowed) as above and fill s; messages name `name` ("k_scale[3]: value
 * -1 must be finite and > 0"): LK_ERR_DTYPE (not f32), LK_ERR_SHAPE, LK_ERR_VALUE. */
lk_status lk_scale_init(lk_scale *s, const lk_tensor *t, int64_t B, int64_t H, const char *name);
/* A scalar float scale: finite and > 0, else LK_ERR_VALUE naming it. */
lk_status lk_scale_check_value(float v, const char *name);

/* ---- row iteration ----
 * A view is split into `inner` trailing dims (one "row") and the leading dims, which
 * are walked in row-major order. lk_rowit_init positions at leading index `row`;
 * lk_rowit_next steps to the next row without divisions. `off` is the element offset
 * of the row start. */
typedef struct {
    int nd;
    int64_t shape[LK_MAX_DIMS];
    int64_t stride[LK_MAX_DIMS];
    int64_t idx[LK_MAX_DIMS];
    int64_t off;
} lk_rowit;

void lk_rowit_init(lk_rowit *it, const lk_tensor *t, int inner, int64_t row);
static inline void lk_rowit_next(lk_rowit *it) {
    for (int d = it->nd - 1; d >= 0; d--) {
        it->off += it->stride[d];
        if (++it->idx[d] < it->shape[d]) return;
        it->off -= it->stride[d] * it->shape[d];
        it->idx[d] = 0;
    }
}
/* Number of rows (product of the leading ndim - inner dims). */
int64_t lk_rows(const lk_tensor *t, int inner);

/* For the few hot helpers whose inlining with literal arguments (dtypes, flags) is what
 * makes them fast: the compiler must not keep them out of line. */
#define LK_ALWAYS_INLINE static inline __attribute__((always_inline))

/* Element size of a dtype already validated (inlined: used inside hot loops). */
static inline int64_t lk_esize(lk_dtype dt) {
    return dt == LK_I64 ? 8 : (dt == LK_F32 || dt == LK_I32) ? 4 : (dt == LK_F8E4M3 || dt == LK_F8E5M2 || dt == LK_I8) ? 1 : 2;
}

/* Byte address of element offset off of t. */
static inline void *lk_at(const lk_tensor *t, int64_t off) {
    return (char *)t->data + off * lk_esize(t->dtype);
}

/* ---- threads ----
 * lk_parallel_for splits [0, n) into contiguous equal chunks, one per thread, and
 * calls fn(ctx, begin, end) for each. Work below ~64 KiB of traffic (`bytes_per_item`
 * times n) runs on the calling thread with no parallel region. Chunks do not depend
 * on anything but n and the thread count, and items must be independent, so results
 * never depend on the thread count. */
typedef void (*lk_range_fn)(void *ctx, int64_t begin, int64_t end);
void lk_parallel_for(int64_t n, int64_t bytes_per_item, lk_range_fn fn, void *ctx);
/* Threads lk_parallel_for would use for this much work. */
int lk_plan_threads(int64_t n, int64_t bytes_per_item);

/* Outputs larger than this are written with non-temporal stores by the SIMD kernels
 * that support them: they would not stay in the last-level cache anyway, and streaming
 * them skips the read-for-ownership of every written line. */
#ifndef LK_STREAM_MIN_BYTES
#define LK_STREAM_MIN_BYTES ((int64_t)16 << 20)
#endif

/* g[i] = w[i] (+ 1 with add_one) as f32: weights converted once per call, not once per
 * row. Returns NULL on allocation failure; free with free(). */
float *lk_weights_f32(const lk_tensor *w, int add_one);

/* Independent units of uneven cost (attention tiles): lk_plan_units gives the thread
 * count, lk_parallel_units hands units out dynamically; fn gets the unit index and the
 * thread's index in [0, nthreads) (for per-thread scratch allocated beforehand). Each
 * unit must write only its own outputs, so results do not depend on the schedule. */
typedef void (*lk_unit_fn)(void *ctx, int64_t unit, int tid);
int lk_plan_units(int64_t n);
void lk_parallel_units(int64_t n, int nthreads, lk_unit_fn fn, void *ctx);
/* lk_parallel_units with units handed out in runs of consecutive indices (n / (4
 * nthreads) units a run): for units that prefetch their successor's data, which the same
 * thread then mostly runs (decode key chunks) */
void lk_parallel_runs(int64_t n, int nthreads, lk_unit_fn fn, void *ctx);

/* ---- cpu ---- */
int lk_cpu_has_avx2(void);
int lk_cpu_has_avx512(void);
int lk_cpu_has_avx512bf16(void);
int lk_cpu_has_amx(void);
int lk_cpu_has_neon(void);
/* whether kernels with both forms take f32 FMAs rather than bf16 dot products (VDPBF16PS):
 * on Intel cores, where the dot products run at half the FMAs' rate; -1 restores the
 * CPU's choice, 0 / 1 force one (tests run both) */
int lk_cpu_prefer_fma(void);
void lk_cpu_set_prefer_fma(int p);

#endif
