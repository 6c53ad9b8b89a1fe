/*
 * Determinism of every public operator (the registry in tests/opcases.c), on shapes
 * large enough for the kernels to split work over threads: for each ISA the CPU runs,
 * the call with 1 thread is the reference, and calls with 2, 3 and 4 threads, and a
 * repeated call, must give bit-identical outputs (the whole allocation of every written
 * argument, garbage around the views included). The per-operator test files check the
 * same property on their own shapes; this suite guarantees it for every operator in
 * the registry, so a new operator gets it by joining the registry.
 */
#include <stdlib.h>

#include "opcases.h"

int main(void) {
    tu_init();
    const char *small = getenv("LLMKERN_TEST_SMALL");
    /* emulated (tu_emulated): the medium shapes, which still go parallel */
    oc_size size = (small && *small && *small != '0') || tu_emulated() ? OC_MEDIUM : OC_LARGE;
    lk_isa isas[TU_MAX_ISAS];
    int ni = tu_isas(isas);
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        for (int o = 0; o < OC_NOPS; o++) {
            oc_inst base, ref;
            oc_make(&OC_OPS[o], &base, size, 900 + (uint64_t)o);
            oc_clone(&ref, &base, 1);
            lk_set_num_threads(1);
            lk_status s = oc_call(&ref);
            int same = s == LK_OK, nt_bad = 0;
            for (int nt = 1; nt <= 4; nt++) { /* nt = 1: the repeated call */
                oc_inst c;
                oc_clone(&c, &base, 1);
                lk_set_num_threads(nt);
                s = oc_call(&c);
                if (s != LK_OK || !oc_same_written(&c, &ref)) same = 0, nt_bad = nt;
                oc_free(&c);
            }
            lk_set_num_threads(0);
            tu_check(same, "%s %s: bitwise identical for 1, 2, 3, 4 threads and a repeated call%s", lk_isa_name(isas[ii]),
                     OC_OPS[o].name, nt_bad ? " (differs)" : "");
            oc_free(&ref);
            oc_free(&base);
        }
    }
    lk_set_isa(lk_isa_best());
    return tu_finish("test_determinism");
}
