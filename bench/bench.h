/*
 * Benchmark harness shared by bench/bench_<op>.c.
 *
 * Each op file defines `void bench_<op>(void)` and lists it in bench_main.c. A case:
 *   1. allocates its inputs (bench_alloc, random values),
 *   2. times the public op with bench_time (median of repetitions, each repetition
 *      long enough to time; warm-up call first),
 *   3. runs the reference kernel (LLMKERN_ISA=ref path) once on the same inputs and
 *      measures the max error of the timed output against it,
 *   4. prints a row with bench_row: median time, achieved GB/s (or GFLOP/s), the
 *      ceiling (bandwidth rows timed with bench_time_bw: the copy bandwidth probed
 *      between their repetitions; other rows: measured at start-up), their ratio and
 *      the max error.
 * Rows are also written to the --json file.
 */
#ifndef LK_BENCH_H
#define LK_BENCH_H

#include <stddef.h>
#include <stdint.h>

#include "llmkern.h"

typedef struct {
    double copy_gbs;     /* DRAM copy bandwidth, counting 1 read + 1 write per byte moved */
    double row_copy_gbs; /* the same, probed between the current row's repetitions (0: none) */
    double read_gbs;     /* DRAM read-only bandwidth */
    double fma_gflops;   /* f32 FMA peak (all threads) */
    int threads;
    int full;            /* --full: every case */
    int reps;            /* repetitions per case (median) */
} bench_env;

extern bench_env BENCH;

/* measured once at start-up */
void bench_measure_machine(void);
/* the FMA peak again, now (a quarter-length probe): for long runs on a shared machine
 * whose speed drifts, to set a row against the speed it ran at */
double bench_fma_now(void);

typedef void (*bench_fn)(void *ctx);
/* median milliseconds per call over BENCH.reps samples */
double bench_time(bench_fn fn, void *ctx);
/* the same for a bandwidth row: a copy probe (2 x 64 MiB) follows each sample, and the
 * next bench_row of kind BENCH_BW uses the probes' median as its ceiling */
double bench_time_bw(bench_fn fn, void *ctx);

typedef enum { BENCH_BW, BENCH_FLOPS, BENCH_READ_BW } bench_kind;
/* units: bytes for BENCH_BW (ratio vs copy bandwidth) and BENCH_READ_BW (vs read
 * bandwidth), flops for BENCH_FLOPS (vs FMA peak). max_err: max |out - ref| / (1 + |ref|) over the output. */
void bench_row(const char *op, const char *shape, const char *dtype, double ms, double units,
               bench_kind kind, double max_err);
void bench_section(const char *title);

/* aligned buffer of n elements of dt filled with uniform values in [lo, hi) */
void *bench_alloc(lk_dtype dt, int64_t n, double lo, double hi);
void bench_free(void *p);
/* max |a - b| / (1 + |b|) over n elements of dt */
double bench_max_err(const void *a, const void *b, lk_dtype dt, int64_t n);

/* op benches */
void bench_rms_norm(void);
void bench_activation(void);
void bench_rotary(void);
void bench_kv_cache(void);
void bench_merge(void);
void bench_softmax(void);
void bench_attention(void);
void bench_mla_cache(void);
void bench_mla_prefill(void);

#endif
