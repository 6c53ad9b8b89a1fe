/*
 * llmkern_bench: the main job. Measures the machine's ceilings, then runs every op at
 * LLM shapes and prints median time, achieved rate, ceiling, ratio and max error
 * against the reference kernel.
 *
 *   llmkern_bench [--threads N] [--reps N] [--full] [--json FILE] [--only NAME]
 *                 [--isa all|LIST] [--plot FILE.png]
 *
 * --isa: the ISAs every row runs on, their repetitions interleaved: `all` (every SIMD
 * ISA the CPU runs: avx2, avx512; ref alone on a CPU without them) or a comma list of
 * ref, avx2, avx512 (names the CPU cannot run are reported and skipped). Default: the
 * ISA in use (the best, or LLMKERN_ISA's). --plot: after the run, the share of its
 * ceiling of each row per ISA as a PNG, drawn by scripts/bench_plot.py from the JSON
 * (--json's file, else FILE with .json in place of .png).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

extern FILE *bench_json;

static const struct {
    const char *name;
    void (*fn)(void);
} BENCHES[] = {
    {"rms_norm", bench_rms_norm},
    /* activations */
    {"activation", bench_activation},

    /* rotary */
    {"rotary", bench_rotary},

    /* kv cache */
    {"kv_cache", bench_kv_cache},

    /* merge */
    {"merge", bench_merge},

    /* softmax */
    {"softmax", bench_softmax},

    {"attention", bench_attention},
    {"mla_cache", bench_mla_cache},
    {"mla_prefill", bench_mla_prefill},
};

/* BENCH.isa from --isa's list; 0, or 2 on a name that is no ISA */
static int parse_isas(const char *list) {
    lk_isa best = lk_isa_best();
    BENCH.nisa = 0;
    if (!strcmp(list, "all")) {
        if (best == LK_ISA_REF) BENCH.isa[BENCH.nisa++] = LK_ISA_REF;
        for (int a = LK_ISA_AVX2; a <= (int)best; a++) BENCH.isa[BENCH.nisa++] = (lk_isa)a;
        return 0;
    }
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, ",");
        char name[16];
        snprintf(name, sizeof name, "%.*s", (int)(n < 15 ? n : 15), p);
        int a = LK_ISA_REF, seen = 0;
        while (a <= LK_ISA_AVX512 && strcmp(name, lk_isa_name((lk_isa)a))) a++;
        if (a > LK_ISA_AVX512) {
            fprintf(stderr, "bench: --isa: unknown ISA '%.*s' (ref, avx2, avx512 or all)\n", (int)n, p);
            return 2;
        }
        for (int i = 0; i < BENCH.nisa; i++) seen |= BENCH.isa[i] == (lk_isa)a;
        if (a > (int)best)
            fprintf(stderr, "bench: --isa: %s is not supported by this CPU (best: %s), skipped\n",
                    lk_isa_name((lk_isa)a), lk_isa_name(best));
        else if (!seen) BENCH.isa[BENCH.nisa++] = (lk_isa)a;
        p += n + (p[n] == ',');
    }
    return 0;
}

/* python3 scripts/bench_plot.py json png; its exit status */
static int plot(const char *json, const char *png) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        execlp("python3", "python3", LK_BENCH_PLOT_SCRIPT, json, png, (char *)NULL);
        perror("python3");
        _exit(127);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) < 0) return 1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

int main(int argc, char **argv) {
    const char *only = NULL, *json = NULL, *png = NULL, *isas = NULL;
    BENCH.threads = lk_get_num_threads();
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) BENCH.threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) BENCH.reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--isa") && i + 1 < argc) isas = argv[++i];
        else if (!strcmp(argv[i], "--plot") && i + 1 < argc) png = argv[++i];
        else if (!strcmp(argv[i], "--full")) BENCH.full = 1;
        else {
            fprintf(stderr,
                    "usage: %s [--threads N] [--reps N] [--full] [--json FILE] [--only NAME] "
                    "[--isa all|ref,avx2,avx512] [--plot FILE.png]\n", argv[0]);
            return 2;
        }
    }
    if (BENCH.threads < 1) BENCH.threads = 1;
    if (BENCH.reps < 1) BENCH.reps = 1;
    lk_set_num_threads(BENCH.threads);
    BENCH.nisa = 1;
    BENCH.isa[0] = lk_isa_current();
    if (isas && parse_isas(isas)) return 2;
    if (!BENCH.nisa) {
        fprintf(stderr, "bench: --isa %s: no ISA this CPU runs\n", isas);
        return 2;
    }
    bench_use_isa(0);
    char json_next[4096];
    if (png && !json) { /* the JSON next to the PNG */
        size_t n = strlen(png);
        if (n > 4 && !strcmp(png + n - 4, ".png")) n -= 4;
        snprintf(json_next, sizeof json_next, "%.*s.json", (int)n, png);
        json = json_next;
    }
    if (json && !(bench_json = fopen(json, "w"))) {
        perror(json);
        return 1;
    }
    printf("llmkern %s benchmark (median of %d repetitions)\n", lk_version(), BENCH.reps);
    bench_measure_machine();
    for (size_t i = 0; i < sizeof BENCHES / sizeof BENCHES[0]; i++)
        if (!only || strstr(BENCHES[i].name, only)) BENCHES[i].fn();
    if (bench_json) {
        fprintf(bench_json, "\n]\n}\n");
        fclose(bench_json);
    }
    if (png) {
        int st = plot(json, png);
        if (st) {
            fprintf(stderr, "bench: plot failed (exit %d); the rows are in %s\n", st, json);
            return 3;
        }
        printf("plot: %s (rows: %s)\n", png, json);
    }
    return 0;
}
