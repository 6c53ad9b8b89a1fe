/*
 * MLA prefix prefill hooks for tests and fuzz harnesses only (no library source
 * includes this): the cost model the auto choice is checked against (with whether the
 * bf16 GEMMs run here), and the wave budget that forces a batch into several waves.
 */
#ifndef LK_MLA_TEST_H
#define LK_MLA_TEST_H

#include <stdint.h>

#include "cost.h"

/* 1 when oneDNN runs the bf16 GEMMs on this CPU (gemm.c): with bf16 caches and weight
 * the projection is then bf16, lk_mla_shape.proj_bf16 */
int lk_mla_gemm_bf16(void);

/* scratch budget of one wave of requests (driver.c; default 24 MiB, <= 0 restores it);
 * process-wide: set it only while no other call runs */
void lk_mla_set_wave_bytes(int64_t bytes);

#endif
