/*
 * The bench's function tables (bench_api.h): the statically linked library's, and one
 * per --lib shared object, opened with RTLD_NOW | RTLD_LOCAL so that each build keeps
 * its own symbols and its own state (ISA, thread count, last error).
 */
#define BENCH_API_DIRECT /* the real functions, not the redirection */
#include "bench_api.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#define BENCH_API_STATIC(f) f,
static const bench_api_table static_table = {BENCH_API(BENCH_API_STATIC)};
#undef BENCH_API_STATIC

const bench_api_table *bench_api = &static_table;

int bench_api_open(const char *path, bench_api_table *t) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "bench: --lib: %s\n", dlerror());
        return -1;
    }
    int missing = 0;
    /* dlsym returns void *; a function pointer is stored through memcpy (ISO C has no
     * conversion between the two) */
#define BENCH_API_LOAD(f)                                                                  \
    {                                                                                      \
        void *p = dlsym(h, #f);                                                            \
        if (!p) fprintf(stderr, "bench: --lib: %s has no %s\n", path, #f), missing = 1;    \
        memcpy(&t->f, &p, sizeof t->f);                                                    \
    }
    BENCH_API(BENCH_API_LOAD)
#undef BENCH_API_LOAD
    if (missing) {
        dlclose(h);
        return -1;
    }
    return 0;
}
