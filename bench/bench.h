/*
 * Benchmark harness shared by bench/bench_<op>.c.
 *
 * Each op file defines `void bench_<op>(void)` and lists it in bench_main.c. A row runs
 * on every variant: a (library, ISA) pair, the ISAs of --isa on each library of --lib
 * (default: the statically linked library alone, on the ISA in use). A case:
 *   1. allocates its inputs (bench_alloc, random values),
 *   2. times the public op with bench_time (median of repetitions, each repetition
 *      long enough to time; warm-up call first) on every variant, the repetitions of
 *      the variants interleaved (one sample of each per round, the order rotated) so
 *      that drift of a shared machine hits them alike; each variant's median is kept,
 *   3. runs the reference kernel (LLMKERN_ISA=ref path) of the first library once on
 *      the same inputs and measures the max error of the op's output on each variant
 *      against it (bench_err_variants, or a bench_use_variant loop),
 *   4. prints a row with bench_row: per variant the median time, achieved GB/s (or
 *      GFLOP/s), the ceiling (bandwidth rows timed with bench_time_bw: the copy
 *      bandwidth probed between their repetitions; read-bandwidth rows: measured at
 *      start-up; FLOPS rows: the FMA peak of the variant's ISA, or the bf16 dot-product
 *      peak for rows on the bf16 dot path (bench_flops_kind), measured at start-up)
 *      and their ratio; then time ratios: with one library and several ISAs, the last
 *      ISA's time over the first's; with several libraries, per ISA each library's time
 *      over the first library's (an A/B of two builds: after / before); then the max
 *      error over the variants.
 * Rows are also written to the --json file (bench_json_row); --plot draws them.
 *
 * Libraries (--lib A.so,B.so): each build is dlopen'ed and the bench calls it through a
 * table of function pointers (bench_api.h), so two builds are timed in one process, on
 * the same heap, alternating within each row: what two separate runs cannot give on a
 * shared machine. Each library has its own state: the thread count is set in every one
 * at start-up, the ISA in the variant's library before each sample. With one library
 * the variants are named by their ISA ("avx2"), with several "LIB:ISA" ("after:avx2").
 * JSON: a row's per-variant figures under "isa", keyed by those names (machine.isas
 * lists them, machine.libs the libraries; machine.bf16_dot_gflops is the bf16 dot peak,
 * 0 without AVX512_BF16, machine.bf16_dot_rows whether bf16 FLOPS rows were set
 * against it); with several libraries "lib_ratio" (each later library's variant over
 * the first library's on its ISA) replaces "time_ratio".
 */
#ifndef LK_BENCH_H
#define LK_BENCH_H

#include <stddef.h>
#include <stdint.h>

#include "llmkern.h"
#include "bench_api.h"

#define BENCH_MAX_ISA 4
#define BENCH_MAX_LIB 4
#define BENCH_MAX_VAR (BENCH_MAX_ISA * BENCH_MAX_LIB)

typedef struct {
    char name[16];              /* --lib-names, default lib0, lib1, ... */
    const char *path;           /* NULL: the statically linked library */
    const bench_api_table *api;
} bench_lib;

typedef struct {
    int lib, isa;  /* indices into BENCH.lib and BENCH.isa */
    char name[32]; /* columns and JSON keys: "avx2"; with several libraries "after:avx2" */
} bench_variant;

typedef struct {
    double copy_gbs;     /* DRAM copy bandwidth, counting 1 read + 1 write per byte moved */
    double row_copy_gbs; /* the same, probed between the current row's repetitions (0: none) */
    double read_gbs;     /* DRAM read-only bandwidth */
    double fma_gflops;   /* f32 FMA peak of the first listed ISA (all threads; 0 on ref) */
    double bf16_gflops;  /* bf16 dot-product peak, VDPBF16PS (all threads; 0 without AVX512_BF16) */
    double amx_gflops;   /* bf16 tile-product peak, TDPBF16PS (all threads; 0 unless amx is listed) */
    int nisa;            /* the ISAs every row runs on (--isa; default: the one in use) */
    lk_isa isa[BENCH_MAX_ISA];
    double isa_fma[BENCH_MAX_ISA]; /* f32 FMA peak per listed ISA (0 on ref) */
    int nlib;            /* the libraries (--lib; default: the statically linked one) */
    bench_lib lib[BENCH_MAX_LIB];
    int nvar;            /* the variants: every ISA on every library, ISA by ISA */
    bench_variant var[BENCH_MAX_VAR];
    double row_ms[BENCH_MAX_VAR];  /* per-variant medians of the last bench_time(_bw) */
    int threads;
    int full;            /* --full: every case */
    int reps;            /* repetitions per case (median) */
} bench_env;

extern bench_env BENCH;

/* measured once at start-up */
void bench_measure_machine(void);

/* i < BENCH.nvar: makes variant i current (its library's table, and its ISA in that
 * library) and returns 1; otherwise makes the first current again and returns 0:
 *   for (int i = 0; bench_use_variant(i); i++) ... */
int bench_use_variant(int i);
/* whether every --lib library has the function `name` (bench_api.h's BENCH_API_OPT);
 * where one lacks it, 0 after a line saying which rows are skipped */
int bench_libs_have(const char *name, const char *rows);
/* the variant that variant i's time is set against in the ratio columns: with one
 * library the first variant, with several the first library's on the same ISA */
int bench_base_variant(int i);

typedef void (*bench_fn)(void *ctx);
/* median milliseconds per call over BENCH.reps samples, on each variant (interleaved);
 * returns the first variant's, all of them in BENCH.row_ms */
double bench_time(bench_fn fn, void *ctx);
/* the same for a bandwidth row: a copy probe (2 x 64 MiB) follows each sample, and the
 * next bench_row of kind BENCH_BW uses the probes' median as its ceiling */
double bench_time_bw(bench_fn fn, void *ctx);

typedef enum { BENCH_BW, BENCH_FLOPS, BENCH_READ_BW, BENCH_FLOPS_BF16 } bench_kind;
/* the kind of a FLOPS row whose inputs are of dtype dt: BENCH_FLOPS_BF16 where the row
 * counts as done on the bf16 dot-product path, else BENCH_FLOPS (the choice and its
 * rule: bench_harness.c) */
bench_kind bench_flops_kind(lk_dtype dt);
/* the start-up peak a FLOPS row of `kind` is set against on variant i: the f32 FMA
 * peak of its ISA; BENCH_FLOPS_BF16 on an AVX-512 variant: the bf16 dot-product peak */
double bench_peak(bench_kind kind, int i);
/* the read bandwidth now: one pass of the start-up read probe (256 MiB), in GB/s; 0 on
 * a CPU without a SIMD ISA. For rows that take it between their own repetitions */
double bench_read_probe(void);
/* the bf16 tile-product peak where variant var runs on the amx ISA, else 0 (mla_decode's
 * bf16 rows there: both products on AMX tiles) */
double bench_tile_peak(int var);
/* that peak of `isa` again, now (a quarter-length probe): for long runs on a shared
 * machine whose speed drifts, to set a row against the speed it ran at */
double bench_peak_now(bench_kind kind, lk_isa isa);
/* units: bytes for BENCH_BW (ratio vs copy bandwidth) and BENCH_READ_BW (vs read
 * bandwidth), flops for BENCH_FLOPS and BENCH_FLOPS_BF16 (vs bench_peak of each
 * variant). ms: the first variant's median (bench_time's result); the others' come from
 * BENCH.row_ms. max_err: max |out - ref| / (1 + |ref|) over the output, the max over
 * the variants. */
void bench_row(const char *op, const char *shape, const char *dtype, double ms, double units,
               bench_kind kind, double max_err);
/* prints a section's title and column heads; its name (the title up to " (") goes with
 * the JSON rows that follow */
void bench_section(const char *title);
/* only sets that name, for tables printed by their own code */
void bench_section_name(const char *title);
/* one JSON row (no-op without --json): ms[i], ceil[i] per variant, units as for
 * bench_row, unit "GB/s" or "GFLOP/s", max_err < 0: not measured (null); extra: more
 * ", \"key\": value" fields or NULL */
void bench_json_row(const char *op, const char *shape, const char *dtype, const char *unit,
                    const double *ms, double units, const double *ceil, double max_err,
                    const char *extra);

/* aligned buffer of n elements of dt filled with uniform values in [lo, hi) */
void *bench_alloc(lk_dtype dt, int64_t n, double lo, double hi);
void bench_free(void *p);
/* max |a - b| / (1 + |b|) over n elements of dt */
double bench_max_err(const void *a, const void *b, lk_dtype dt, int64_t n);
/* one call of fn on each variant, the max error of its output out against ref */
double bench_err_variants(bench_fn fn, void *ctx, const void *out, const void *ref, lk_dtype dt,
                          int64_t n);

/* op benches */
void bench_rms_norm(void);
void bench_fp8_act(void); /* fp8 activations */
void bench_activation(void);
void bench_rotary(void);
void bench_kv_cache(void);
void bench_merge(void);
void bench_softmax(void);
void bench_attention(void);
void bench_mla_cache(void);
void bench_mla_prefill(void);
void bench_mla_decode(void);

#endif
