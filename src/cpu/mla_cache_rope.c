/*
 * concat_and_cache_mla_rope (vLLM's concat_and_cache_mla_rope_fused): one driver for
 * every ISA over the table's own kernels.
 *
 *   q_pe[t, h, :rot], k_pe[t, :rot] <- rope(positions[t])      for every t < T (in place)
 *   cache[slot_mapping[t]] = q([kv_c[t] | k_pe[t]])              for t < N, slot >= 0
 *
 * Shapes: positions [T] (the front-end's view of the first T values), q_pe [T, Hq, Dr],
 * k_pe [T, Dr] (passed to the rotary kernel as [T, 1, Dr]), kv_c [T, Dl], cache(s) as
 * concat_and_cache_mla's; rope and q() exactly as those kernels (rotary: products
 * rounded to f32, one rounding to the row's dtype; cache: one rounding, or fp8(x / scale)).
 *
 * Work split: the two kernels' own (each over tokens, contiguous ranges per thread), one
 * after the other: the cache step reads k_pe after every token is rotated. Neither
 * depends on the thread count, so neither does the result.
 *
 * The fusion is in the call, not in a pass: the rotation reads and writes q_pe (Hq x Dr
 * values a token, 128 x 64 in DeepSeek-V3) and the cache step reads kv_c and k_pe once,
 * so one pass over both would save only the second read of k_pe's Dr values (about
 * 0.4 % of a bf16 token's 35 KB).
 */
#include "kernels.h"

lk_status lk_mla_cache_rope_drive(const lk_mla_cache_rope_args *a) {
    const lk_kernel_table *k = lk_kernels();
    lk_status s = LK_OK;
    if (a->do_rope && (s = k->rotary_embedding(&a->rope))) return s;
    if (a->do_cache) s = a->cache.ds ? k->concat_and_cache_mla_ds(&a->cache) : k->concat_and_cache_mla(&a->cache);
    return s;
}
