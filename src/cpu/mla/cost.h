/*
 * The cost model behind LK_MLA_AUTO (cost.c): predicted seconds of each strategy from
 * the batch's shape alone (no data, never the thread count, so the choice, and with it
 * the bits, cannot depend on it). Read by the driver (driver.c) and by the tests.
 */
#ifndef LK_MLA_COST_H
#define LK_MLA_COST_H

#include <stdint.h>

#include "llmkern.h"

/* shape summary the cost model reads */
typedef struct {
    int64_t B, H, Dn, Dr, Dv, Dl, bs;
    const int32_t *q_len;     /* [B] new tokens per request */
    const int32_t *prefix;    /* [B] prefix tokens per request */
    int64_t unique_rows;      /* prefix rows to project after dedup (pages * bs) */
    int proj_bf16;            /* the projection GEMM runs on bf16 operands (bf16 cache and weight) */
    int lat_bf16;             /* absorbed's latent attention runs on bf16 operands (lk_mla_lat_bf16) */
    int cur_bf16;             /* flash_attn over the new tokens on the ISA avx512bf16: 1 Q.K^T
                                 on bf16 dot products (q, k bf16), 2 P.V too when it writes
                                 out itself (v and out bf16 as well); 0 f32 products */
    int64_t f8_dims;          /* entry dims read from fp8 caches (0, Dl, Dr or Dl + Dr) */
} lk_mla_shape;

/* cost[s] = predicted seconds of strategy s (index = lk_mla_strategy, [0] unused);
 * returns the cheapest (the first of equals, in enum order) */
lk_mla_strategy lk_mla_choose(const lk_mla_shape *s, double cost[5]);

#endif
