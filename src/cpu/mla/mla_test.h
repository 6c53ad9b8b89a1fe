/*
 * MLA prefix prefill hooks for tests and fuzz harnesses only (no library source
 * includes this): the cost model the auto choice is checked against, and the wave
 * budget that forces a batch into several waves.
 */
#ifndef LK_MLA_TEST_H
#define LK_MLA_TEST_H

#include <stdint.h>

#include "cost.h"

/* scratch budget of one wave of requests (driver.c; default 24 MiB, <= 0 restores it);
 * process-wide: set it only while no other call runs */
void lk_mla_set_wave_bytes(int64_t bytes);

#endif
