/*
 * Concurrency of every public operator (the registry in tests/opcases.c):
 *
 *  1. 8 pthreads call every operator at the same time, each thread starting at a
 *     different operator, for several rounds: on separate data (every argument copied)
 *     and on shared read-only inputs (only the written arguments copied, so all threads
 *     read the same input buffers at once). Every result must be bit-identical to the
 *     serial result of the same call, including the garbage around the output views.
 *  2. The thread-local error text: each thread provokes a different error (another
 *     operator / argument) at the same time; after a barrier, every thread must still
 *     see its own message; after a successful call its message is empty, whatever the
 *     other threads do.
 * Each ISA the CPU runs is tested (chosen before the threads start: lk_set_isa is
 * process-wide). Operators may use their OpenMP threads inside each pthread.
 * LLMKERN_TEST_SMALL=1 runs one round on small shapes (for TSan and valgrind).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "opcases.h"

#define NTHREADS 8

static int rounds = 8;
static oc_size size = OC_MEDIUM;
#define MAX_OPS 128 /* registry entries (OC_NOPS) this test has room for; checked in main */
static oc_inst base[MAX_OPS], serial[MAX_OPS];
static atomic_int n_ok[MAX_OPS], n_bad[MAX_OPS], err_ok, err_bad;
static char first_bad[MAX_OPS][256];
static pthread_barrier_t bar;

static void record(int o, int ok, const char *why) {
    if (ok) {
        atomic_fetch_add(&n_ok[o], 1);
        return;
    }
    if (atomic_fetch_add(&n_bad[o], 1) == 0) snprintf(first_bad[o], sizeof first_bad[o], "%s", why);
}

static void *calls(void *arg) {
    int tid = (int)(intptr_t)arg;
    for (int r = 0; r < rounds; r++) {
        pthread_barrier_wait(&bar); /* every round starts together */
        for (int j = 0; j < OC_NOPS; j++) {
            int o = (j + tid) % OC_NOPS, share = (r + tid) % 2;
            oc_inst c;
            oc_clone(&c, &base[o], share);
            lk_status s = oc_call(&c);
            char why[256];
            snprintf(why, sizeof why, "thread %d round %d %s inputs: %s %s", tid, r, share ? "shared" : "copied",
                     lk_status_str(s), s ? lk_last_error() : "results differ from serial");
            record(o, s == LK_OK && oc_same_written(&c, &serial[o]), why);
            oc_free(&c);
        }
    }
    return NULL;
}

/* error text: thread tid breaks argument k of operator o with an unknown dtype */
static void *errors(void *arg) {
    int tid = (int)(intptr_t)arg;
    for (int r = 0; r < rounds + 1; r++) {
        int o = (tid + 3 * r) % OC_NOPS, k = (tid + r) % base[o].nargs;
        oc_inst c;
        oc_clone(&c, &base[o], 1);
        c.arg[k].t.dtype = (lk_dtype)99;
        lk_status s = oc_call(&c);
        char mine[512];
        snprintf(mine, sizeof mine, "%s", lk_last_error());
        char want[96];
        snprintf(want, sizeof want, "%s: %s", OC_OPS[o].name, c.arg[k].name);
        int ok = s == LK_ERR_DTYPE && !strncmp(mine, want, strlen(want));
        pthread_barrier_wait(&bar); /* every thread has its error now */
        ok &= !strcmp(lk_last_error(), mine);
        pthread_barrier_wait(&bar);
        oc_free(&c);
        /* a successful call clears this thread's message only */
        oc_clone(&c, &base[(o + 1) % OC_NOPS], 1);
        s = oc_call(&c);
        ok &= s == LK_OK && lk_last_error()[0] == '\0';
        pthread_barrier_wait(&bar);
        ok &= lk_last_error()[0] == '\0';
        oc_free(&c);
        atomic_fetch_add(ok ? &err_ok : &err_bad, 1);
        pthread_barrier_wait(&bar);
    }
    return NULL;
}

static void run_threads(void *(*fn)(void *)) {
    pthread_t th[NTHREADS];
    for (int t = 0; t < NTHREADS; t++) pthread_create(&th[t], NULL, fn, (void *)(intptr_t)t);
    for (int t = 0; t < NTHREADS; t++) pthread_join(th[t], NULL);
}

int main(void) {
    tu_init();
    const char *small = getenv("LLMKERN_TEST_SMALL");
    if (small && *small && *small != '0') rounds = 1, size = OC_SMALL;
    if (!tu_check(OC_NOPS <= MAX_OPS, "registry of %d entries fits MAX_OPS %d", OC_NOPS, MAX_OPS)) return tu_finish("test_concurrency");
    pthread_barrier_init(&bar, NULL, NTHREADS);
    lk_isa isas[TU_MAX_ISAS];
    int ni = tu_isas(isas);
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        for (int o = 0; o < OC_NOPS; o++) {
            oc_make(&OC_OPS[o], &base[o], size, 500 + (uint64_t)o);
            oc_clone(&serial[o], &base[o], 0);
            lk_status s = oc_call(&serial[o]);
            tu_check(s == LK_OK, "%s %s: serial call (%s)", lk_isa_name(isas[ii]), OC_OPS[o].name, lk_status_str(s));
            atomic_store(&n_ok[o], 0), atomic_store(&n_bad[o], 0);
        }
        run_threads(calls);
        for (int o = 0; o < OC_NOPS; o++)
            tu_check(atomic_load(&n_bad[o]) == 0 && atomic_load(&n_ok[o]) == NTHREADS * rounds,
                     "%s %s: %d threads x %d rounds concurrent calls equal the serial result bitwise (%d ok%s%s)",
                     lk_isa_name(isas[ii]), OC_OPS[o].name, NTHREADS, rounds, atomic_load(&n_ok[o]),
                     atomic_load(&n_bad[o]) ? "; first failure: " : "", first_bad[o]);
        atomic_store(&err_ok, 0), atomic_store(&err_bad, 0);
        run_threads(errors);
        tu_check(atomic_load(&err_bad) == 0 && atomic_load(&err_ok) == NTHREADS * (rounds + 1),
                 "%s: %d threads provoking different errors at once each keep their own message (%d ok, %d bad)",
                 lk_isa_name(isas[ii]), NTHREADS, atomic_load(&err_ok), atomic_load(&err_bad));
        for (int o = 0; o < OC_NOPS; o++) oc_free(&base[o]), oc_free(&serial[o]);
    }
    lk_set_isa(lk_isa_best());
    pthread_barrier_destroy(&bar);
    return tu_finish("test_concurrency");
}
