/*
 * llmkern_bench: the main job. Measures the machine's ceilings, then runs every op at
 * LLM shapes and prints median time, achieved rate, ceiling, ratio and max error
 * against the reference kernel.
 *
 *   llmkern_bench [--threads N] [--reps N] [--full] [--json FILE] [--only NAME]
 *                 [--isa all|LIST] [--lib A.so[,B.so...]] [--lib-names A,B] [--plot FILE.png]
 *
 * --isa: the ISAs every row runs on, their repetitions interleaved: `all` (every SIMD
 * ISA the CPU runs: avx2, avx512; ref alone on a CPU without them) or a comma list of
 * ref, avx2, avx512 (names the CPU cannot run are reported and skipped). Default: the
 * ISA in use (the best, or LLMKERN_ISA's). --plot: after the run, the share of its
 * ceiling of each row per ISA as a PNG, drawn by scripts/bench_plot.py from the JSON
 * (--json's file, else FILE with .json in place of .png).
 *
 * --lib: libllmkern.so files of different builds (before / after a change), loaded into
 * this process; every row runs each ISA of --isa on each of them, all the repetitions
 * interleaved, so that the builds are compared under the same drift and the same heap
 * (two separate runs of a shared machine differ by more than most changes). Variants
 * are named LIB:ISA after --lib-names (one name per library; default lib0, lib1, ...).
 * Without --lib the bench times the library it is linked with.
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
    {"mla_decode", bench_mla_decode},
    /* fp8 activations */
    {"fp8_act", bench_fp8_act},
};

/* BENCH.isa from --isa's list; 0, or 2 on a name that is no ISA */
static int parse_isas(const char *list) {
    lk_isa best = lk_isa_best();
    BENCH.nisa = 0;
    if (!strcmp(list, "all")) { /* every SIMD ISA this CPU and build run, else ref */
        for (int a = LK_ISA_AVX2; a <= LK_ISA_AMX; a++)
            if (lk_set_isa((lk_isa)a) == LK_OK) BENCH.isa[BENCH.nisa++] = (lk_isa)a;
        if (!BENCH.nisa) BENCH.isa[BENCH.nisa++] = LK_ISA_REF;
        lk_set_isa(best);
        return 0;
    }
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, ",");
        char name[16];
        snprintf(name, sizeof name, "%.*s", (int)(n < 15 ? n : 15), p);
        int a = LK_ISA_REF, seen = 0;
        while (a <= LK_ISA_AMX && strcmp(name, lk_isa_name((lk_isa)a))) a++;
        if (a > LK_ISA_AMX) {
            fprintf(stderr, "bench: --isa: unknown ISA '%.*s' (ref, avx2, avx512, avx512bf16, amx, neon or all)\n", (int)n, p);
            return 2;
        }
        for (int i = 0; i < BENCH.nisa; i++) seen |= BENCH.isa[i] == (lk_isa)a;
        int ok = lk_set_isa((lk_isa)a) == LK_OK;
        lk_set_isa(best);
        if (!ok)
            fprintf(stderr, "bench: --isa: %s is not supported by this CPU (best: %s), skipped\n",
                    lk_isa_name((lk_isa)a), lk_isa_name(best));
        else if (!seen) BENCH.isa[BENCH.nisa++] = (lk_isa)a;
        p += n + (p[n] == ',');
    }
    return 0;
}

/* BENCH.lib from --lib's comma list of paths and --lib-names' list (may be NULL); 0, or
 * 2 after a message */
static int open_libs(const char *paths, const char *names) {
    static bench_api_table tables[BENCH_MAX_LIB];
    BENCH.nlib = 0;
    for (const char *p = paths; *p;) {
        size_t n = strcspn(p, ",");
        if (BENCH.nlib == BENCH_MAX_LIB) {
            fprintf(stderr, "bench: --lib: at most %d libraries\n", BENCH_MAX_LIB);
            return 2;
        }
        bench_lib *l = &BENCH.lib[BENCH.nlib];
        l->path = strndup(p, n);
        snprintf(l->name, sizeof l->name, "lib%d", BENCH.nlib);
        if (bench_api_open(l->path, &tables[BENCH.nlib])) return 2;
        l->api = &tables[BENCH.nlib];
        for (int k = 0; k < BENCH.nlib; k++)
            if (!memcmp(&tables[k], l->api, sizeof tables[k]))
                fprintf(stderr, "bench: --lib: %s and %s are one loaded object (one state); for an A/A "
                        "test load two copies of the file\n", BENCH.lib[k].path, l->path);
        BENCH.nlib++;
        p += n + (p[n] == ',');
    }
    if (!BENCH.nlib) {
        fprintf(stderr, "bench: --lib: no library given\n");
        return 2;
    }
    int k = 0, bad = 0;
    for (const char *p = names; p && *p && !bad; k++) {
        size_t n = strcspn(p, ",");
        bad = k >= BENCH.nlib || !n || n >= sizeof BENCH.lib[k].name || memchr(p, ':', n);
        if (bad) break;
        snprintf(BENCH.lib[k].name, sizeof BENCH.lib[k].name, "%.*s", (int)n, p);
        for (int j = 0; j < k; j++) bad |= !strcmp(BENCH.lib[j].name, BENCH.lib[k].name);
        p += n + (p[n] == ',');
    }
    if (names && (bad || k != BENCH.nlib)) {
        fprintf(stderr, "bench: --lib-names %s: one distinct name per library of --lib (%d), 1 to %d "
                "characters, no ':'\n", names, BENCH.nlib, (int)sizeof BENCH.lib[0].name - 1);
        return 2;
    }
    return 0;
}

/* BENCH.var: every listed ISA on every library, ISA by ISA; 0, or 2 after a message */
static int make_variants(void) {
    BENCH.nvar = 0;
    for (int i = 0; i < BENCH.nisa; i++)
        for (int k = 0; k < BENCH.nlib; k++) {
            bench_variant *v = &BENCH.var[BENCH.nvar++];
            v->lib = k, v->isa = i;
            bench_api = BENCH.lib[k].api;
            if (BENCH.nlib > 1) snprintf(v->name, sizeof v->name, "%s:%s", BENCH.lib[k].name, lk_isa_name(BENCH.isa[i]));
            else snprintf(v->name, sizeof v->name, "%s", lk_isa_name(BENCH.isa[i]));
            if (lk_set_isa(BENCH.isa[i]) != LK_OK) {
                fprintf(stderr, "bench: %s: %s\n", v->name, lk_last_error());
                return 2;
            }
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
    const char *only = NULL, *json = NULL, *png = NULL, *isas = NULL, *libs = NULL, *lib_names = NULL;
    BENCH.threads = lk_get_num_threads();
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) BENCH.threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) BENCH.reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--isa") && i + 1 < argc) isas = argv[++i];
        else if (!strcmp(argv[i], "--lib") && i + 1 < argc) libs = argv[++i];
        else if (!strcmp(argv[i], "--lib-names") && i + 1 < argc) lib_names = argv[++i];
        else if (!strcmp(argv[i], "--plot") && i + 1 < argc) png = argv[++i];
        else if (!strcmp(argv[i], "--full")) BENCH.full = 1;
        else {
            fprintf(stderr,
                    "usage: %s [--threads N] [--reps N] [--full] [--json FILE] [--only NAME] "
                    "[--isa all|ref,avx2,avx512,avx512bf16,amx] [--lib A.so[,B.so...]] [--lib-names A,B] [--plot FILE.png]\n",
                    argv[0]);
            return 2;
        }
    }
    if (BENCH.threads < 1) BENCH.threads = 1;
    if (BENCH.reps < 1) BENCH.reps = 1;
    if (lib_names && !libs) {
        fprintf(stderr, "bench: --lib-names needs --lib\n");
        return 2;
    }
    if (libs && open_libs(libs, lib_names)) return 2;
    if (!libs) BENCH.nlib = 1, BENCH.lib[0] = (bench_lib){"lib0", NULL, bench_api};
    for (int k = 0; k < BENCH.nlib; k++) { /* each library has its own thread count */
        bench_api = BENCH.lib[k].api;
        lk_set_num_threads(BENCH.threads);
    }
    bench_api = BENCH.lib[0].api;
    BENCH.nisa = 1;
    BENCH.isa[0] = lk_isa_current();
    if (isas && parse_isas(isas)) return 2;
    if (!BENCH.nisa) {
        fprintf(stderr, "bench: --isa %s: no ISA this CPU runs\n", isas);
        return 2;
    }
    if (make_variants()) return 2;
    bench_use_variant(0);
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
