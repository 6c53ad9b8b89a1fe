/*
 * Harness: timing, machine ceilings, row printing, JSON (see bench.h).
 *
 * Ceilings are measured in the same run with the same thread count:
 *  - copy bandwidth: b[i] = a[i] over 2 x 256 MiB, counting read + write bytes, the
 *    way the op rows count theirs; the better of plain stores and non-temporal stores.
 *    Bandwidth rows (bench_time_bw) measure it again between their repetitions, over
 *    2 x 64 MiB with the store kind that won, and set the row against the median of
 *    those probes: on a shared machine the bandwidth drifts during a run, and a row is
 *    compared with what the memory gave while it ran;
 *  - read bandwidth: a vectorised sum over 256 MiB;
 *  - FMA peak, per listed ISA: independent FMA chains in registers (AVX2 or AVX-512
 *    FMAs for those ISAs, NEON FMLA on aarch64; none for ref), 2 flops per lane per FMA;
 *  - bf16 dot-product peak, where the CPU has AVX512_BF16 (the bench's own cpuid check:
 *    it reaches the library through its public API only): independent VDPBF16PS chains
 *    on zmm registers, 2 flops per bf16 product (32 multiply-adds, 64 flops, per
 *    instruction). FLOPS rows are set against one of the two peaks: bench_flops_kind
 *    and bench_peak below are where that is chosen.
 *
 * With several variants (--isa, --lib) a timing interleaves them: each round takes one
 * sample on every variant, in an order rotated from round to round, so that a shared
 * machine's drift hits them alike; rows print one column group per variant and the time
 * ratios (bench.h). The FMA peaks are measured once per ISA, not per library: they are
 * the machine's.
 */
#include "bench.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

#include "core/core.h"
#include "core/half.h"

bench_env BENCH = {.threads = 1, .reps = 7};
FILE *bench_json;
static int json_rows;
static char section[64]; /* the current section's name, for the JSON rows */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double copy_probe(void);

int bench_use_variant(int i) {
    int more = i < BENCH.nvar;
    const bench_variant *v = &BENCH.var[more ? i : 0];
    bench_api = BENCH.lib[v->lib].api;
    lk_set_isa(BENCH.isa[v->isa]);
    bench_linked_set_isa(BENCH.isa[v->isa]); /* the linked build too: the calls made to it directly */
    return more;
}

int bench_libs_have(const char *name, const char *rows) {
    for (int k = 0; k < BENCH.nlib; k++)
        if (!bench_api_has(BENCH.lib[k].api, name)) {
            printf("  (%s skipped: --lib %s has no %s)\n", rows, BENCH.lib[k].path, name);
            return 0;
        }
    return 1;
}

int bench_base_variant(int i) { return BENCH.nlib > 1 ? i - BENCH.var[i].lib : 0; }

/* median ms per call on each variant (BENCH.row_ms; returns the first's); with
 * `probe`, a copy probe after each round, whose median goes to BENCH.row_copy_gbs */
static double time_reps(bench_fn fn, void *ctx, int probe) {
    int inner[BENCH_MAX_VAR], k = BENCH.nvar;
    for (int i = 0; bench_use_variant(i); i++) {
        fn(ctx); /* warm-up */
        double t0 = now_s();
        fn(ctx);
        double one = now_s() - t0;
        inner[i] = one > 2e-3 ? 1 : (int)(2e-3 / (one > 1e-8 ? one : 1e-8)) + 1;
    }
    double samples[BENCH_MAX_VAR][64], probes[64];
    int reps = BENCH.reps > 64 ? 64 : BENCH.reps;
    for (int r = 0; r < reps; r++) {
        for (int j = 0; j < k; j++) {
            int i = (j + r) % k; /* rotate the order: no variant always runs first */
            bench_use_variant(i);
            double t0 = now_s();
            for (int n = 0; n < inner[i]; n++) fn(ctx);
            samples[i][r] = (now_s() - t0) / inner[i];
        }
        if (probe) probes[r] = copy_probe();
    }
    bench_use_variant(k);
    if (probe) BENCH.row_copy_gbs = median(probes, reps);
    for (int i = 0; i < k; i++) BENCH.row_ms[i] = 1e3 * median(samples[i], reps);
    return BENCH.row_ms[0];
}

double bench_time(bench_fn fn, void *ctx) { return time_reps(fn, ctx, 0); }

double bench_time_bw(bench_fn fn, void *ctx) { return time_reps(fn, ctx, BENCH.copy_gbs > 0); }

void *bench_alloc(lk_dtype dt, int64_t n, double lo, double hi) {
    size_t es = lk_dtype_size(dt), bytes = (size_t)(n > 0 ? n : 1) * es;
    void *p = NULL;
    if (posix_memalign(&p, 64, (bytes + 63) & ~(size_t)63)) {
        fprintf(stderr, "bench: out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    uint64_t s = 0x9e3779b97f4a7c15ull ^ (uint64_t)n;
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        double u = lo + (hi - lo) * ((double)(s >> 11) / 9007199254740992.0);
        if (dt == LK_I32) ((int32_t *)p)[i] = (int32_t)u;
        else if (dt == LK_I64) ((int64_t *)p)[i] = (int64_t)u;
        else lk_store_f(p, dt, i, (float)u);
    }
    return p;
}

void bench_free(void *p) { free(p); }

double bench_max_err(const void *a, const void *b, lk_dtype dt, int64_t n) {
    double m = 0;
    size_t es = lk_dtype_size(dt);
    for (int64_t i = 0; i < n; i++) {
        /* the same bits are no error (NaN included: fp8_ds_mla records hold scale and rope
         * bytes that read as fp8 NaN codes) */
        if (!memcmp((const char *)a + (size_t)i * es, (const char *)b + (size_t)i * es, es)) continue;
        double x = lk_load_f(a, dt, i), y = lk_load_f(b, dt, i);
        double e = fabs(x - y) / (1.0 + fabs(y));
        if (e != e) return INFINITY;
        if (e > m) m = e;
    }
    return m;
}

double bench_err_variants(bench_fn fn, void *ctx, const void *out, const void *ref, lk_dtype dt,
                          int64_t n) {
    double err = 0;
    for (int i = 0; bench_use_variant(i); i++) {
        fn(ctx);
        double e = bench_max_err(out, ref, dt, n);
        if (e > err) err = e;
    }
    return err;
}

/* ---- ceilings ---- */

/* one pass of each stream kernel over n floats per array, split across threads */
#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx2"))) static void copy_pass(float *b, const float *a, size_t n, int nt) {
#pragma omp parallel for num_threads(nt) schedule(static)
    for (size_t i = 0; i < n; i += 32) {
        _mm256_store_ps(b + i, _mm256_load_ps(a + i));
        _mm256_store_ps(b + i + 8, _mm256_load_ps(a + i + 8));
        _mm256_store_ps(b + i + 16, _mm256_load_ps(a + i + 16));
        _mm256_store_ps(b + i + 24, _mm256_load_ps(a + i + 24));
    }
}

__attribute__((target("avx2"))) static void copy_nt_pass(float *b, const float *a, size_t n, int nt) {
#pragma omp parallel for num_threads(nt) schedule(static)
    for (size_t i = 0; i < n; i += 32) {
        _mm256_stream_ps(b + i, _mm256_load_ps(a + i));
        _mm256_stream_ps(b + i + 8, _mm256_load_ps(a + i + 8));
        _mm256_stream_ps(b + i + 16, _mm256_load_ps(a + i + 16));
        _mm256_stream_ps(b + i + 24, _mm256_load_ps(a + i + 24));
    }
    _mm_sfence();
}

__attribute__((target("avx2"))) static float read_pass(const float *a, size_t n, int nt) {
    float total = 0;
#pragma omp parallel num_threads(nt) reduction(+ : total)
    {
        __m256 x0 = _mm256_setzero_ps(), x1 = x0, x2 = x0, x3 = x0;
#pragma omp for schedule(static)
        for (size_t i = 0; i < n; i += 32) {
            x0 = _mm256_add_ps(x0, _mm256_load_ps(a + i));
            x1 = _mm256_add_ps(x1, _mm256_load_ps(a + i + 8));
            x2 = _mm256_add_ps(x2, _mm256_load_ps(a + i + 16));
            x3 = _mm256_add_ps(x3, _mm256_load_ps(a + i + 24));
        }
        __m256 s = _mm256_add_ps(_mm256_add_ps(x0, x1), _mm256_add_ps(x2, x3));
        float v[8];
        _mm256_storeu_ps(v, s);
        total += v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
    }
    return total;
}
#elif defined(__aarch64__) /* NEON: 128-bit loads and stores (no streaming-store variant) */
static void copy_pass(float *b, const float *a, size_t n, int nt) {
#pragma omp parallel for num_threads(nt) schedule(static)
    for (size_t i = 0; i < n; i += 16) {
        vst1q_f32(b + i, vld1q_f32(a + i)), vst1q_f32(b + i + 4, vld1q_f32(a + i + 4));
        vst1q_f32(b + i + 8, vld1q_f32(a + i + 8)), vst1q_f32(b + i + 12, vld1q_f32(a + i + 12));
    }
}

static void copy_nt_pass(float *b, const float *a, size_t n, int nt) { copy_pass(b, a, n, nt); }

static float read_pass(const float *a, size_t n, int nt) {
    float total = 0;
#pragma omp parallel num_threads(nt) reduction(+ : total)
    {
        float32x4_t x0 = vdupq_n_f32(0), x1 = x0, x2 = x0, x3 = x0;
#pragma omp for schedule(static)
        for (size_t i = 0; i < n; i += 16) {
            x0 = vaddq_f32(x0, vld1q_f32(a + i)), x1 = vaddq_f32(x1, vld1q_f32(a + i + 4));
            x2 = vaddq_f32(x2, vld1q_f32(a + i + 8)), x3 = vaddq_f32(x3, vld1q_f32(a + i + 12));
        }
        total += vaddvq_f32(vaddq_f32(vaddq_f32(x0, x1), vaddq_f32(x2, x3)));
    }
    return total;
}
#else /* no vector ISA: measure_bandwidth returns before these run */
static void copy_pass(float *b, const float *a, size_t n, int nt) { (void)nt, memcpy(b, a, n * 4); }
static void copy_nt_pass(float *b, const float *a, size_t n, int nt) { copy_pass(b, a, n, nt); }
static float read_pass(const float *a, size_t n, int nt) { return (void)nt, n ? a[0] : 0; }
#endif

/* the start-up arrays, kept for the probes between a bandwidth row's repetitions */
static float *probe_a, *probe_b;
static int probe_nt;
#define START_N ((size_t)64 << 20) /* floats per start-up array: 256 MiB */

/* Copy ceiling = the better of plain and non-temporal stores (plain stores also pay a
 * read-for-ownership that is not counted), both counted as 1 read + 1 write. */
static void measure_bandwidth(void) {
    if (lk_isa_best() == LK_ISA_REF) return; /* ref-only CPU: no ceiling printed */
    size_t n = START_N;
    float *a = NULL, *b = NULL;
    if (posix_memalign((void **)&a, 64, n * 4) || posix_memalign((void **)&b, 64, n * 4)) exit(1);
    int nt = BENCH.threads;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (size_t i = 0; i < n; i++) a[i] = (float)(i & 1023), b[i] = 0;
    double sc[5], snt[5], sread[5];
    float sink = 0;
    for (int r = 0; r < 5; r++) {
        double t0 = now_s();
        copy_pass(b, a, n, nt);
        double t1 = now_s();
        copy_nt_pass(b, a, n, nt);
        double t2 = now_s();
        sink += read_pass(a, n, nt);
        double t3 = now_s();
        sc[r] = 2.0 * (double)n * 4 / (t1 - t0) / 1e9;
        snt[r] = 2.0 * (double)n * 4 / (t2 - t1) / 1e9;
        sread[r] = (double)n * 4 / (t3 - t2) / 1e9;
    }
    double c = median(sc, 5), cnt = median(snt, 5);
    BENCH.copy_gbs = c > cnt ? c : cnt;
    BENCH.read_gbs = median(sread, 5) + (sink == 42.0f ? 1e-9 : 0);
    probe_a = a, probe_b = b, probe_nt = cnt >= c;
}

#define PROBE_N ((size_t)16 << 20) /* floats per array: 64 MiB, twice the L3 */

/* one copy pass over 2 x 64 MiB with the start-up's better store kind, in GB/s */
static double copy_probe(void) {
    double t0 = now_s();
    if (probe_nt) copy_nt_pass(probe_b, probe_a, PROBE_N, BENCH.threads);
    else copy_pass(probe_b, probe_a, PROBE_N, BENCH.threads);
    return 2.0 * (double)PROBE_N * 4 / (now_s() - t0) / 1e9;
}

/* one pass of the read ceiling's kernel over the start-up's 256 MiB array, in GB/s (0
 * where no ceiling was measured) */
double bench_read_probe(void) {
    if (!probe_a) return 0;
    double t0 = now_s();
    float sink = read_pass(probe_a, START_N, BENCH.threads);
    return (double)START_N * 4 / (now_s() - t0) / 1e9 + (sink == 42.0f ? 1e-9 : 0);
}

/* FMA peak: independent FMA chains per thread (10 ymm / 12 zmm accumulators: more than
 * latency x throughput on current cores), written with the FMA intrinsics (the ISO C
 * build mode does not contract a * b + c into an FMA) */
#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx2,fma"))) static double fma_avx2(long iters) {
    __m256 acc[10], m = _mm256_set1_ps(1.0000001f), c = _mm256_set1_ps(1e-7f);
    for (int k = 0; k < 10; k++) acc[k] = _mm256_set1_ps(1e-7f * (float)k);
    for (long i = 0; i < iters; i++)
        for (int k = 0; k < 10; k++) acc[k] = _mm256_fmadd_ps(acc[k], m, c);
    __m256 s = acc[0];
    for (int k = 1; k < 10; k++) s = _mm256_add_ps(s, acc[k]);
    float v[8];
    _mm256_storeu_ps(v, s);
    return (double)(v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7]);
}

__attribute__((target("avx512f"))) static double fma_avx512(long iters) {
    __m512 acc[12], m = _mm512_set1_ps(1.0000001f), c = _mm512_set1_ps(1e-7f);
    for (int k = 0; k < 12; k++) acc[k] = _mm512_set1_ps(1e-7f * (float)k);
    for (long i = 0; i < iters; i++)
        for (int k = 0; k < 12; k++) acc[k] = _mm512_fmadd_ps(acc[k], m, c);
    __m512 s = acc[0];
    for (int k = 1; k < 12; k++) s = _mm512_add_ps(s, acc[k]);
    return (double)_mm512_reduce_add_ps(s);
}
#else
static double fma_avx2(long iters) { return (double)iters; }
static double fma_avx512(long iters) { return (double)iters; }
#endif

#if defined(__aarch64__)
/* NEON: 16 FMLA chains on v registers (4 FMA pipes x 4 cycles on Neoverse V1 / N2) */
static double fma_neon(long iters) {
    float32x4_t acc[16], m = vdupq_n_f32(1.0000001f), c = vdupq_n_f32(1e-7f);
    for (int k = 0; k < 16; k++) acc[k] = vdupq_n_f32(1e-7f * (float)k);
    for (long i = 0; i < iters; i++)
        for (int k = 0; k < 16; k++) acc[k] = vfmaq_f32(c, acc[k], m);
    float32x4_t s = acc[0];
    for (int k = 1; k < 16; k++) s = vaddq_f32(s, acc[k]);
    return (double)vaddvq_f32(s);
}
#else
static double fma_neon(long iters) { return (double)iters; }
#endif

/* bf16 dot-product peak: 12 independent VDPBF16PS accumulators per thread, as many as
 * the AVX-512 FMA probe's chains; the products are small, the sums stay finite */
#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx512bf16,avx512f"))) static double dot_bf16(long iters) {
    __m512 acc[12];
    __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.0009765625f), _mm512_set1_ps(0.0009765625f));
    __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.001f), _mm512_set1_ps(0.001f));
    for (int k = 0; k < 12; k++) acc[k] = _mm512_set1_ps(1e-7f * (float)k);
    for (long i = 0; i < iters; i++)
        for (int k = 0; k < 12; k++) acc[k] = _mm512_dpbf16_ps(acc[k], a, b);
    __m512 s = acc[0];
    for (int k = 1; k < 12; k++) s = _mm512_add_ps(s, acc[k]);
    return (double)_mm512_reduce_add_ps(s);
}

/* AVX-512F and AVX512_BF16 (cpuid leaf 7 subleaf 1, EAX bit 5) with the OS saving the
 * ZMM and opmask state (XCR0, read once OSXSAVE says xgetbv is there) */
__attribute__((target("xsave"))) static int cpu_has_avx512bf16(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0; /* OSXSAVE */
    if ((_xgetbv(0) & 0xe6) != 0xe6) return 0; /* XMM, YMM, opmask, ZMM hi256, hi16 ZMM */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((b >> 16) & 1) || a < 1) return 0;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return 0;
    return (a >> 5) & 1;
}

/* bf16 tile-product peak: 4 independent TDPBF16PS accumulators (16 x 16 f32 each, 16 x 32
 * bf16 operands: 16384 flops per product) per thread; the tiles configured and released
 * here (the thread's tile state). Run only where the library's amx ISA is usable, so the
 * OS has granted the tile state. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_cfg;
__attribute__((target("amx-tile,amx-bf16"))) static double tile_bf16(long iters) {
    static const uint16_t ops[2][512]; /* zeros: the sums stay 0 */
    tile_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) cfg.colsb[t] = 64, cfg.rows[t] = 16;
    _tile_loadconfig(&cfg);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, ops[0], 64);
    _tile_loadd(5, ops[1], 64);
    _tile_loadd(6, ops[0], 64);
    _tile_loadd(7, ops[1], 64);
    for (long i = 0; i < iters; i++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 5, 6);
        _tile_dpbf16ps(2, 4, 7);
        _tile_dpbf16ps(3, 5, 7);
    }
    float c[256];
    _tile_stored(0, c, 64);
    _tile_release();
    return (double)c[0];
}
#else
static double dot_bf16(long iters) { return (double)iters; }
static int cpu_has_avx512bf16(void) { return 0; }
static double tile_bf16(long iters) { return (double)iters; }
#endif

/* median GFLOP/s of `reps` (<= 5) samples of `iters` iterations of fn on every thread,
 * fn doing flops_per_iter per iteration */
static double chains_median(double (*fn)(long), double flops_per_iter, long iters, int reps) {
    double samples[5];
    for (int r = 0; r < reps; r++) {
        double sink = 0, t0 = now_s();
        int nt = BENCH.threads;
#pragma omp parallel num_threads(nt) reduction(+ : sink)
        sink += fn(iters);
        double t = now_s() - t0;
        samples[r] = flops_per_iter * (double)iters * nt / t / 1e9 + (sink == 42.0 ? 1e-9 : 0);
    }
    return median(samples, reps);
}

/* the f32 FMA peak of isa (0 on ref) */
static double fma_median(lk_isa isa, long iters, int reps) {
    if (isa == LK_ISA_REF) return 0;
    if (isa == LK_ISA_NEON) return chains_median(fma_neon, 16 * 4 * 2, iters, reps);
    if (isa >= LK_ISA_AVX512) return chains_median(fma_avx512, 12 * 16 * 2, iters, reps);
    return chains_median(fma_avx2, 10 * 8 * 2, iters, reps);
}

/* the bf16 dot-product peak (0 without AVX512_BF16) */
static double bf16_median(long iters, int reps) {
    return cpu_has_avx512bf16() ? chains_median(dot_bf16, 12 * 32 * 2, iters, reps) : 0;
}

static void measure_fma(void) {
    for (int i = 0; i < BENCH.nisa; i++) BENCH.isa_fma[i] = fma_median(BENCH.isa[i], 20000000, 5);
    BENCH.fma_gflops = BENCH.isa_fma[0];
    BENCH.bf16_gflops = bf16_median(20000000, 5);
    BENCH.amx_gflops = 0;
    for (int i = 0; i < BENCH.nisa; i++)
        if (BENCH.isa[i] == LK_ISA_AMX) BENCH.amx_gflops = chains_median(tile_bf16, 4 * 16384, 200000, 5);
}

/*
 * The one place that chooses a FLOPS row's peak. A row whose inputs are bf16 is set
 * against the bf16 dot-product peak on the ISA whose attention kernels use the bf16 dot
 * products (avx512bf16), else against the f32 FMA peak of its ISA.
 */
bench_kind bench_flops_kind(lk_dtype dt) { return dt == LK_BF16 && BENCH.bf16_gflops > 0 ? BENCH_FLOPS_BF16 : BENCH_FLOPS; }

static int bf16_peak_on(bench_kind kind, lk_isa isa) {
    return kind == BENCH_FLOPS_BF16 && (isa == LK_ISA_AVX512BF16 || isa == LK_ISA_AMX) && BENCH.bf16_gflops > 0;
}

double bench_tile_peak(int var) { return BENCH.isa[BENCH.var[var].isa] == LK_ISA_AMX ? BENCH.amx_gflops : 0; }

double bench_peak(bench_kind kind, int var) {
    int i = BENCH.var[var].isa;
    return bf16_peak_on(kind, BENCH.isa[i]) ? BENCH.bf16_gflops : BENCH.isa_fma[i];
}

double bench_peak_now(bench_kind kind, lk_isa isa) {
    return bf16_peak_on(kind, isa) ? bf16_median(5000000, 3) : fma_median(isa, 5000000, 3);
}

/* s as a JSON string */
static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20) fprintf(f, "\\u%04x", (unsigned char)*s);
        else fputc(*s, f);
    }
    fputc('"', f);
}

void bench_measure_machine(void) {
    measure_bandwidth();
    measure_fma();
    char isas[64] = "", peaks[128] = "", vars[BENCH_MAX_VAR * 33] = "";
    for (int i = 0; i < BENCH.nisa; i++) {
        size_t a = strlen(isas), b = strlen(peaks);
        snprintf(isas + a, sizeof isas - a, "%s%s", i ? "," : "", lk_isa_name(BENCH.isa[i]));
        if (BENCH.nisa == 1) snprintf(peaks, sizeof peaks, "%.1f", BENCH.isa_fma[0]);
        else snprintf(peaks + b, sizeof peaks - b, "%s%s %.1f", i ? ", " : "", lk_isa_name(BENCH.isa[i]),
                      BENCH.isa_fma[i]);
    }
    for (int i = 0; i < BENCH.nvar; i++) {
        size_t a = strlen(vars);
        snprintf(vars + a, sizeof vars - a, "%s%s", i ? "," : "", BENCH.var[i].name);
    }
    char bf16[96] = "- (no AVX512_BF16)";
    if (BENCH.bf16_gflops > 0) snprintf(bf16, sizeof bf16, "%.1f GFLOP/s", BENCH.bf16_gflops);
    if (BENCH.amx_gflops > 0)
        snprintf(bf16 + strlen(bf16), sizeof bf16 - strlen(bf16), " | amx bf16 tile peak %.1f GFLOP/s", BENCH.amx_gflops);
    printf("machine: %d threads, isa %s | copy bandwidth %.1f GB/s (read+write) | read bandwidth "
           "%.1f GB/s | f32 FMA peak %s GFLOP/s | bf16 dot peak %s\n",
           BENCH.threads, isas, BENCH.copy_gbs, BENCH.read_gbs, peaks, bf16);
    if (bench_flops_kind(LK_BF16) == BENCH_FLOPS_BF16)
        printf("bf16-input FLOPS rows on avx512bf16 are set against the bf16 dot peak%s\n",
               lk_cpu_prefer_fma() ? " (flash_attn's and mla_decode's rows excepted: on this CPU, whose dot products "
                                     "run at about half the f32 FMA rate, their kernels take FMAs, lk_cpu_prefer_fma)"
                                   : "");
    if (BENCH.copy_gbs > 0)
        printf("bandwidth rows: ceiling = copy bandwidth probed between the row's repetitions "
               "(2 x 64 MiB; it drifts on a shared machine)\n");
    const char *version[BENCH_MAX_LIB];
    for (int k = 0; k < BENCH.nlib; k++) {
        bench_api = BENCH.lib[k].api;
        version[k] = lk_version();
        if (BENCH.lib[k].path) printf("library %s: %s (llmkern %s)\n", BENCH.lib[k].name, BENCH.lib[k].path, version[k]);
    }
    bench_use_variant(0);
    if (BENCH.nlib > 1)
        printf("variants %s: each row's repetitions alternate between them; errors against the first library's ref "
               "kernel; FLOPS rows set against each ISA's own peak\n", vars);
    else if (BENCH.nisa > 1)
        printf("isas %s: each row's repetitions alternate between them; FLOPS rows set against each "
               "ISA's own peak\n", isas);
    if (bench_json) {
        fprintf(bench_json,
                "{\n\"machine\": {\"threads\": %d, \"isa\": \"%s\", \"copy_gbs\": %.3f, "
                "\"read_gbs\": %.3f, \"fma_gflops\": %.3f, \"isas\": [",
                BENCH.threads, lk_isa_name(BENCH.isa[0]), BENCH.copy_gbs, BENCH.read_gbs,
                BENCH.fma_gflops);
        for (int i = 0; i < BENCH.nvar; i++) fprintf(bench_json, "%s\"%s\"", i ? ", " : "", BENCH.var[i].name);
        fprintf(bench_json, "], \"fma_gflops_isa\": {");
        for (int i = 0; i < BENCH.nisa; i++)
            fprintf(bench_json, "%s\"%s\": %.3f", i ? ", " : "", lk_isa_name(BENCH.isa[i]), BENCH.isa_fma[i]);
        fprintf(bench_json, "}, \"bf16_dot_gflops\": %.3f, \"bf16_dot_rows\": %s", BENCH.bf16_gflops,
                bench_flops_kind(LK_BF16) == BENCH_FLOPS_BF16 ? "true" : "false");
        if (BENCH.lib[0].path) { /* --lib */
            fprintf(bench_json, ", \"libs\": [");
            for (int k = 0; k < BENCH.nlib; k++) {
                fprintf(bench_json, "%s{\"name\": ", k ? ", " : "");
                json_str(bench_json, BENCH.lib[k].name);
                fprintf(bench_json, ", \"path\": ");
                json_str(bench_json, BENCH.lib[k].path);
                fprintf(bench_json, ", \"version\": ");
                json_str(bench_json, version[k]);
                fprintf(bench_json, "}");
            }
            fprintf(bench_json, "]");
        }
        fprintf(bench_json, "},\n\"rows\": [\n");
    }
}

void bench_section_name(const char *title) {
    size_t n = strcspn(title, "(");
    while (n > 0 && title[n - 1] == ' ') n--;
    snprintf(section, sizeof section, "%.*s", (int)n, title);
}

/* the width of variant i's time column (its head: "NAME us") */
static int time_width(int i) {
    int n = (int)strlen(BENCH.var[i].name) + 3;
    return n > 10 ? n : 10;
}

/* the ratio columns: their heads (t NULL) or the ratios of the variants' times t. One
 * library: the last variant over the first; several: each variant of a library after the
 * first over the first library's on the same ISA */
static void print_ratios(const double *t) {
    printf(" |");
    for (int i = 1; i < BENCH.nvar; i++) {
        const bench_variant *v = &BENCH.var[i];
        if (BENCH.nlib == 1 ? i < BENCH.nvar - 1 : !v->lib) continue;
        char head[48];
        if (BENCH.nlib == 1) snprintf(head, sizeof head, "%s/%s", v->name, BENCH.var[0].name);
        else snprintf(head, sizeof head, "%s/%s:%s", BENCH.lib[v->lib].name, BENCH.lib[0].name,
                      lk_isa_name(BENCH.isa[v->isa]));
        int w = (int)strlen(head) > 11 ? (int)strlen(head) : 11;
        if (t) printf(" %*.2f", w, t[i] / t[bench_base_variant(i)]);
        else printf(" %*s", w, head);
    }
}

void bench_section(const char *title) {
    bench_section_name(title);
    printf("\n== %s\n", title);
    if (BENCH.nvar == 1) {
        printf("%-22s %-26s %-6s %10s %10s %10s %7s %10s\n", "op", "shape", "dtype", "median us",
               "achieved", "ceiling", "ratio", "max err");
    } else {
        printf("%-22s %-26s %-6s %-7s", "op", "shape", "dtype", "unit");
        for (int i = 0; i < BENCH.nvar; i++) {
            char us[40];
            snprintf(us, sizeof us, "%s us", BENCH.var[i].name);
            printf(" | %*s %6s %6s %4s", time_width(i), us, "rate", "ceil", "%");
        }
        print_ratios(NULL);
        printf(" %10s\n", "max err");
    }
    fflush(stdout);
}

void bench_json_row(const char *op, const char *shape, const char *dtype, const char *unit,
                    const double *ms, double units, const double *ceil, double max_err,
                    const char *extra) {
    if (!bench_json) return;
    double rate[BENCH_MAX_VAR];
    for (int i = 0; i < BENCH.nvar; i++) rate[i] = ms[i] > 0 ? units / (ms[i] * 1e-3) / 1e9 : 0;
    fprintf(bench_json,
            "%s  {\"op\": \"%s\", \"shape\": \"%s\", \"dtype\": \"%s\", \"section\": \"%s\", "
            "\"median_ms\": %.6f, \"rate\": %.3f, \"unit\": \"%s\", \"ceiling\": %.3f, "
            "\"ratio\": %.4f, \"max_err\": ",
            json_rows++ ? ",\n" : "", op, shape, dtype, section, ms[0], rate[0], unit, ceil[0],
            ceil[0] > 0 ? rate[0] / ceil[0] : 0);
    if (max_err < 0) fprintf(bench_json, "null, \"isa\": {");
    else if (!(max_err < INFINITY)) fprintf(bench_json, "1e999, \"isa\": {"); /* JSON has no inf; this reads as inf */
    else fprintf(bench_json, "%.3e, \"isa\": {", max_err);
    for (int i = 0; i < BENCH.nvar; i++)
        fprintf(bench_json,
                "%s\"%s\": {\"median_ms\": %.6f, \"rate\": %.3f, \"ceiling\": %.3f, \"ratio\": %.4f}",
                i ? ", " : "", BENCH.var[i].name, ms[i], rate[i], ceil[i],
                ceil[i] > 0 ? rate[i] / ceil[i] : 0);
    fprintf(bench_json, "}");
    if (BENCH.nlib > 1) { /* each later library's variant over the first library's, same ISA */
        fprintf(bench_json, ", \"lib_ratio\": {");
        for (int i = 0, n = 0; i < BENCH.nvar; i++) {
            double base = ms[bench_base_variant(i)];
            if (BENCH.var[i].lib)
                fprintf(bench_json, "%s\"%s\": %.4f", n++ ? ", " : "", BENCH.var[i].name, base > 0 ? ms[i] / base : 0);
        }
        fprintf(bench_json, "}");
    } else if (BENCH.nvar > 1) {
        fprintf(bench_json, ", \"time_ratio\": %.4f", ms[0] > 0 ? ms[BENCH.nvar - 1] / ms[0] : 0);
    }
    fprintf(bench_json, "%s}", extra ? extra : "");
}

void bench_row(const char *op, const char *shape, const char *dtype, double ms, double units,
               bench_kind kind, double max_err) {
    int flops = kind == BENCH_FLOPS || kind == BENCH_FLOPS_BF16;
    double bw = kind == BENCH_BW ? (BENCH.row_copy_gbs > 0 ? BENCH.row_copy_gbs : BENCH.copy_gbs)
                                 : BENCH.read_gbs;
    BENCH.row_copy_gbs = 0;
    double t[BENCH_MAX_VAR], ceil[BENCH_MAX_VAR];
    for (int i = 0; i < BENCH.nvar; i++) {
        t[i] = i ? BENCH.row_ms[i] : ms;
        ceil[i] = flops ? bench_peak(kind, i) : bw;
    }
    const char *u = flops ? "GFLOP/s" : "GB/s";
    if (BENCH.nvar == 1) {
        double rate = units / (ms * 1e-3) / 1e9;
        printf("%-22s %-26s %-6s %10.2f %5.1f %-4s %5.1f %-4s %6.0f%% %10.2e\n", op, shape, dtype,
               ms * 1e3, rate, u, ceil[0], u, ceil[0] > 0 ? 100 * rate / ceil[0] : 0, max_err);
    } else {
        printf("%-22s %-26s %-6s %-7s", op, shape, dtype, u);
        for (int i = 0; i < BENCH.nvar; i++) {
            double rate = units / (t[i] * 1e-3) / 1e9;
            printf(" | %*.2f %6.1f %6.1f %3.0f%%", time_width(i), t[i] * 1e3, rate, ceil[i],
                   ceil[i] > 0 ? 100 * rate / ceil[i] : 0);
        }
        print_ratios(t);
        printf(" %10.2e\n", max_err);
    }
    fflush(stdout);
    bench_json_row(op, shape, dtype, u, t, units, ceil, max_err, NULL);
}
