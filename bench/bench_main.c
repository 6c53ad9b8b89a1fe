/*
 * llmkern_bench: the main job. Measures the machine's ceilings, then runs every op at
 * LLM shapes and prints median time, achieved rate, ceiling, ratio and max error
 * against the reference kernel.
 *
 *   llmkern_bench [--threads N] [--reps N] [--full] [--json FILE] [--only NAME]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int main(int argc, char **argv) {
    const char *only = NULL, *json = NULL;
    BENCH.threads = lk_get_num_threads();
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) BENCH.threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) BENCH.reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--full")) BENCH.full = 1;
        else {
            fprintf(stderr, "usage: %s [--threads N] [--reps N] [--full] [--json FILE] [--only NAME]\n", argv[0]);
            return 2;
        }
    }
    if (BENCH.threads < 1) BENCH.threads = 1;
    if (BENCH.reps < 1) BENCH.reps = 1;
    lk_set_num_threads(BENCH.threads);
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
    return 0;
}
