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
static const bench_api_table static_table = {BENCH_API(BENCH_API_STATIC) BENCH_API_OPT(BENCH_API_STATIC)};
#undef BENCH_API_STATIC

const bench_api_table *bench_api = &static_table;

void bench_linked_set_isa(lk_isa isa) { (void)lk_set_isa(isa); }

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
#define BENCH_API_LOAD_OPT(f)          \
    {                                  \
        void *p = dlsym(h, #f);        \
        memcpy(&t->f, &p, sizeof t->f); \
    }
    BENCH_API_OPT(BENCH_API_LOAD_OPT)
#undef BENCH_API_LOAD_OPT
    return 0;
}

int bench_api_has(const bench_api_table *t, const char *name) {
#define BENCH_API_HAS(f) \
    if (!strcmp(name, #f)) return t->f != NULL;
    BENCH_API_OPT(BENCH_API_HAS)
#undef BENCH_API_HAS
    return 1;
}
