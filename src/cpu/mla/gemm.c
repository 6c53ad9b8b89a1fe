/*
 * MLA prefix prefill: the GEMMs, in oneDNN (Debian libdnnl-dev, its C API).
 *
 *   C [M, N] f32 = A [M, K] . op(B)  (+ C when accumulate), all row-major,
 *   op(B) = B [K, N] rows ldb apart, or B^T with B [N, K] rows ldb apart (trans_b);
 *   A and B both f32 or both bf16 (a bf16 x bf16 product is exact in f32; oneDNN
 *   accumulates in f32, so only the order of the sums differs from an f32 GEMM).
 *
 * f32: dnnl_sgemm (no primitive; ~0.1 us per call). bf16: the matmul primitive with
 * runtime dims (M, N, K and the leading dims given per call as DNNL_RUNTIME_DIM_VAL at
 * creation), one per (trans_b, accumulate), made on first use under a mutex and kept for
 * the process (4 at most): making one costs ~16 us, reusing it ~1.2 us per call (its
 * three memory objects; measured on Zen 4). oneDNN's implementation and ISA follow the
 * CPU (avx512_core_bf16 where the CPU has it, AMX where present), not lk_set_isa; where
 * it has no bf16 kernel but its reference loops, lk_mla_gemm_bf16() says no and the
 * callers take the f32 path.
 *
 * Threading: every call runs on the calling thread only. Inside an OpenMP parallel
 * region (the strategies' lk_parallel_units workers) oneDNN already runs nested calls
 * single-threaded; outside one (a single unit, or the strategies run with one thread)
 * it would use omp_get_max_threads() threads, so around each call (and each primitive
 * creation) the calling thread's own nthreads ICV is set to 1 and then restored: an
 * OpenMP per-thread setting, nothing process-wide. No global oneDNN setting is touched
 * (ISA, primitive cache, verbosity). With one thread the bits of a call depend only on
 * its shapes and operands, never on the thread count. The primitives use the user
 * scratchpad mode, so several threads may run the same primitive at once.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <dnnl.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "mla.h"

#define RT DNNL_RUNTIME_DIM_VAL

static pthread_once_t engine_once = PTHREAD_ONCE_INIT;
static dnnl_engine_t engine; /* the CPU engine, made once, kept for the process */

static void make_engine(void) {
    if (dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success) engine = NULL;
}

/* the calling thread's OpenMP thread count for nested work set to 1; returns the old one */
static int serial_begin(void) {
#ifdef _OPENMP
    int n = omp_get_max_threads();
    if (n != 1) omp_set_num_threads(1);
    return n;
#else
    return 1;
#endif
}

static void serial_end(int n) {
#ifdef _OPENMP
    if (n != 1) omp_set_num_threads(n);
#else
    (void)n;
#endif
}

static lk_status of_dnnl(dnnl_status_t s) {
    return s == dnnl_success ? LK_OK : s == dnnl_out_of_memory ? LK_ERR_NOMEM : LK_ERR_UNSUPPORTED;
}

/* ---------------------------------------------------------------- bf16 matmul */

typedef struct {
    dnnl_primitive_t p;
    dnnl_memory_desc_t scratch_md; /* user scratchpad, size 0 with runtime dims here */
    size_t scratch_bytes;
} bf16_prim;

static pthread_mutex_t prim_mu = PTHREAD_MUTEX_INITIALIZER;
static bf16_prim prims[2][2]; /* [trans_b][accumulate], written under prim_mu */
static atomic_int prim_ready[2][2]; /* 0 not made yet, 1 usable, -1 not available; set after
                                       prims[][] is written (release / acquire) */

static void mds(dnnl_memory_desc_t *a, dnnl_memory_desc_t *b, dnnl_memory_desc_t *c, int trans_b, int64_t M,
                int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc) {
    dnnl_dims_t ad = {M, K}, as = {lda, 1}, bd = {K, N}, bn = {ldb, 1}, bt = {1, ldb}, cd = {M, N}, cs = {ldc, 1};
    dnnl_memory_desc_init_by_strides(a, 2, ad, dnnl_bf16, as);
    dnnl_memory_desc_init_by_strides(b, 2, bd, dnnl_bf16, trans_b ? bt : bn);
    dnnl_memory_desc_init_by_strides(c, 2, cd, dnnl_f32, cs);
}

/* make prims[tb][acc] (caller holds prim_mu); -1 when oneDNN has only reference loops */
static int make_prim(int tb, int acc) {
    bf16_prim *q = &prims[tb][acc];
    dnnl_memory_desc_t a, b, c;
    mds(&a, &b, &c, tb, RT, RT, RT, RT, RT, RT);
    dnnl_matmul_desc_t d;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    const char *impl = "";
    int ok = engine && dnnl_matmul_desc_init(&d, &a, &b, NULL, &c) == dnnl_success &&
             dnnl_primitive_attr_create(&attr) == dnnl_success &&
             dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) == dnnl_success;
    if (ok && acc)
        ok = dnnl_post_ops_create(&po) == dnnl_success && dnnl_post_ops_append_sum(po, 1.0f) == dnnl_success &&
             dnnl_primitive_attr_set_post_ops(attr, po) == dnnl_success;
    if (ok) ok = dnnl_primitive_desc_create(&pd, &d, attr, engine, NULL) == dnnl_success;
    if (ok) ok = dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success;
    if (ok && strncmp(impl, "ref", 3) == 0) ok = 0; /* scalar loops: the f32 path is faster */
    if (ok) {
        const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        q->scratch_bytes = sp ? dnnl_memory_desc_get_size(sp) : 0;
        if (q->scratch_bytes) q->scratch_md = *sp;
        ok = dnnl_primitive_create(&q->p, pd) == dnnl_success;
    }
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return ok ? 1 : -1;
}

/* the usable primitive for (tb, acc), or NULL */
static bf16_prim *get_prim(int tb, int acc) {
    int st = atomic_load_explicit(&prim_ready[tb][acc], memory_order_acquire);
    if (st == 0) {
        pthread_once(&engine_once, make_engine);
        pthread_mutex_lock(&prim_mu);
        st = atomic_load_explicit(&prim_ready[tb][acc], memory_order_relaxed);
        if (st == 0) {
            int n = serial_begin();
            st = make_prim(tb, acc);
            serial_end(n);
            atomic_store_explicit(&prim_ready[tb][acc], st, memory_order_release);
        }
        pthread_mutex_unlock(&prim_mu);
    }
    return st > 0 ? &prims[tb][acc] : NULL;
}

int lk_mla_gemm_bf16(void) {
    for (int tb = 0; tb < 2; tb++)
        for (int acc = 0; acc < 2; acc++)
            if (!get_prim(tb, acc)) return 0;
    return 1;
}

static lk_status gemm_bf16(int tb, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda, const void *B,
                           int64_t ldb, int acc, float *C, int64_t ldc) {
    bf16_prim *q = get_prim(tb, acc);
    if (!q) return LK_ERR_UNSUPPORTED;
    dnnl_memory_desc_t a, b, c;
    mds(&a, &b, &c, tb, M, N, K, lda, ldb, ldc);
    dnnl_memory_t m[4] = {NULL, NULL, NULL, NULL};
    dnnl_stream_t stream = NULL;
    void *scratch = q->scratch_bytes ? malloc(q->scratch_bytes) : NULL;
    dnnl_status_t s = q->scratch_bytes && !scratch ? dnnl_out_of_memory : dnnl_success;
    if (!s) s = dnnl_memory_create(&m[0], &a, engine, (void *)A);
    if (!s) s = dnnl_memory_create(&m[1], &b, engine, (void *)B);
    if (!s) s = dnnl_memory_create(&m[2], &c, engine, C);
    if (!s && scratch) s = dnnl_memory_create(&m[3], &q->scratch_md, engine, scratch);
    if (!s) s = dnnl_stream_create(&stream, engine, dnnl_stream_default_flags);
    if (!s) {
        dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, m[0]}, {DNNL_ARG_WEIGHTS, m[1]}, {DNNL_ARG_DST, m[2]},
                                   {DNNL_ARG_SCRATCHPAD, m[3]}};
        int n = serial_begin();
        s = dnnl_primitive_execute(q->p, stream, scratch ? 4 : 3, args);
        if (!s) s = dnnl_stream_wait(stream);
        serial_end(n);
    }
    if (stream) dnnl_stream_destroy(stream);
    for (int i = 0; i < 4; i++)
        if (m[i]) dnnl_memory_destroy(m[i]);
    free(scratch);
    return of_dnnl(s);
}

/* ---------------------------------------------------------------- entry */

lk_status lk_mla_gemm(lk_dtype dt, int trans_b, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda,
                      const void *B, int64_t ldb, int accumulate, float *C, int64_t ldc) {
    if (M <= 0 || N <= 0) return LK_OK;
    if (K <= 0) { /* nothing to add: C = 0 or C unchanged */
        for (int64_t i = 0; i < M && !accumulate; i++) memset(C + i * ldc, 0, sizeof(float) * (size_t)N);
        return LK_OK;
    }
    if (dt == LK_BF16) return gemm_bf16(trans_b != 0, M, N, K, A, lda, B, ldb, accumulate != 0, C, ldc);
    int n = serial_begin();
    dnnl_status_t s = dnnl_sgemm('N', trans_b ? 'T' : 'N', M, N, K, 1.0f, A, lda, B, ldb, accumulate ? 1.0f : 0.0f,
                                 C, ldc);
    serial_end(n);
    return of_dnnl(s);
}
