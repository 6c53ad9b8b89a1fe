/*
 * test_vec_<isa>: runs tests/vec_check.c, compiled for one vector ISA (LKV_CHECK names
 * its entry, LKV_ISA_NAME the ISA), where the CPU and OS support that ISA; elsewhere it
 * says so and counts nothing. This file is compiled without the ISA's flags, so the
 * check of the CPU comes before any of the ISA's instructions run.
 */
#include <stdio.h>
#include <string.h>

#include "testutil.h"

int LKV_CHECK(void);

int main(void) {
    tu_init();
    int found = 0;
    for (int i = 0; i < 8; i++)
        if (!strcmp(lk_isa_name((lk_isa)i), LKV_ISA_NAME)) found = lk_set_isa((lk_isa)i) == LK_OK;
    if (found) LKV_CHECK();
    else printf("  note: CPU without %s: its vector layer checks not run (not counted)\n", LKV_ISA_NAME);
    return tu_finish("test_vec_" LKV_ISA_NAME);
}
