/*
 * Thread count and the one parallel loop every kernel uses (see core.h).
 * Built on OpenMP; without OpenMP everything runs on the calling thread.
 */
#include <stdatomic.h>
#include <stdlib.h>

#include "core.h"
#ifdef _OPENMP
#include <omp.h>
#endif

static atomic_int lk_nthreads; /* 0 = default */

static int default_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

void lk_set_num_threads(int n) { atomic_store(&lk_nthreads, n > 0 ? n : 0); }

int lk_get_num_threads(void) {
    int n = atomic_load(&lk_nthreads);
    return n > 0 ? n : default_threads();
}

/* below this much traffic a parallel region costs more than it saves */
#define LK_PAR_MIN_BYTES (64 * 1024)

int lk_plan_threads(int64_t n, int64_t bytes_per_item) {
    int nt = lk_get_num_threads();
    if (nt <= 1 || n <= 1) return 1;
    if (bytes_per_item < 1) bytes_per_item = 1;
    if (n < LK_PAR_MIN_BYTES / bytes_per_item) return 1;
    int64_t per = (LK_PAR_MIN_BYTES / 2) / bytes_per_item + 1; /* items per thread, min */
    int64_t maxt = n / per;
    if (maxt < 2) maxt = 2;
    if (nt > maxt) nt = (int)maxt;
    if (nt > n) nt = (int)n;
    return nt;
}

void lk_parallel_for(int64_t n, int64_t bytes_per_item, lk_range_fn fn, void *ctx) {
    if (n <= 0) return;
    int nt = lk_plan_threads(n, bytes_per_item);
    if (nt <= 1) {
        fn(ctx, 0, n);
        return;
    }
#ifdef _OPENMP
#pragma omp parallel num_threads(nt)
    {
        int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
        int64_t b = n * t / T, e = n * (t + 1) / T;
        if (b < e) fn(ctx, b, e);
    }
#else
    fn(ctx, 0, n);
#endif
}

int lk_plan_units(int64_t n) {
    int nt = lk_get_num_threads();
    if (n < nt) nt = (int)(n > 0 ? n : 1);
    return nt;
}

static void parallel_units(int64_t n, int nthreads, lk_unit_fn fn, void *ctx, int runs) {
    if (n <= 0) return;
    if (nthreads <= 1) {
        for (int64_t u = 0; u < n; u++) fn(ctx, u, 0);
        return;
    }
#ifdef _OPENMP
#pragma omp parallel num_threads(nthreads)
    {
        int tid = omp_get_thread_num();
        if (runs) { /* four runs per thread on average: a run's first unit is the one
                     * whose data no predecessor prefetched, and a thread that starts late
                     * (woken from sleep) or runs slow still gets its share */
            const int64_t run = n / (4 * (int64_t)nthreads) > 1 ? n / (4 * (int64_t)nthreads) : 1;
#pragma omp for schedule(dynamic, run)
            for (int64_t u = 0; u < n; u++) fn(ctx, u, tid);
        } else {
#pragma omp for schedule(dynamic, 1)
            for (int64_t u = 0; u < n; u++) fn(ctx, u, tid);
        }
    }
#else
    (void)runs;
    for (int64_t u = 0; u < n; u++) fn(ctx, u, 0);
#endif
}

void lk_parallel_units(int64_t n, int nthreads, lk_unit_fn fn, void *ctx) { parallel_units(n, nthreads, fn, ctx, 0); }
void lk_parallel_runs(int64_t n, int nthreads, lk_unit_fn fn, void *ctx) { parallel_units(n, nthreads, fn, ctx, 1); }
