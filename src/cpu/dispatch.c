/*
 * The kernel table: filled from ref/, then overridden by AVX2 and AVX-512 entries
 * when the CPU and OS support them. LLMKERN_ISA=ref|avx2|avx512 (read once) or
 * lk_set_isa() forces one; forcing an ISA the CPU lacks is refused.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

static lk_kernel_table tables[3];
static atomic_int current_isa;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static void fill_tables(void) {
    lk_kernel_table *r = &tables[LK_ISA_REF], *a2 = &tables[LK_ISA_AVX2];
    lk_kernel_table *a5 = &tables[LK_ISA_AVX512];
    r->isa = LK_ISA_REF;

    /* -- norms -- */
    r->rms_norm = lk_ref_rms_norm;
    r->fused_add_rms_norm = lk_ref_fused_add_rms_norm;
    /* -- activations -- */
    r->silu_and_mul = lk_ref_silu_and_mul;
    r->gelu_tanh_and_mul = lk_ref_gelu_tanh_and_mul;

    /* -- rotary -- */
    r->rotary_embedding = lk_ref_rotary_embedding;

    /* -- kv cache -- */
    r->reshape_and_cache_flash = lk_ref_reshape_and_cache_flash;

    /* -- merge -- */
    r->merge_attn_states = lk_ref_merge_attn_states;

    /* -- softmax -- */
    r->causal_softmax = lk_ref_causal_softmax;

    /* -- attention -- */
    r->flash_attn = lk_ref_flash_attn;

    /* -- mla cache -- */
    r->concat_and_cache_mla = lk_ref_concat_and_cache_mla;
    r->gather_cache = lk_ref_gather_cache;

    /* -- mla prefill -- */
    r->mla_softmax_block = lk_ref_mla_softmax_block;
    r->mla_prefix_prefill = lk_mla_prefill_drive;

    /* ================ AVX2 overrides ================ */
    *a2 = *r;
    a2->isa = LK_ISA_AVX2;
    /* -- norms -- */
    a2->rms_norm = lk_avx2_rms_norm;
    a2->fused_add_rms_norm = lk_avx2_fused_add_rms_norm;
    /* -- activations -- */
    a2->silu_and_mul = lk_avx2_silu_and_mul;
    a2->gelu_tanh_and_mul = lk_avx2_gelu_tanh_and_mul;

    /* -- rotary -- */
    a2->rotary_embedding = lk_avx2_rotary_embedding;

    /* -- kv cache -- */
    a2->reshape_and_cache_flash = lk_avx2_reshape_and_cache_flash;

    /* -- merge -- */
    a2->merge_attn_states = lk_avx2_merge_attn_states;

    /* -- softmax -- */
    a2->causal_softmax = lk_avx2_causal_softmax;

    /* -- attention -- */
    a2->flash_attn = lk_avx2_flash_attn;

    /* -- mla cache -- */
    a2->concat_and_cache_mla = lk_avx2_concat_and_cache_mla;
    a2->gather_cache = lk_avx2_gather_cache;

    /* -- mla prefill -- */
    a2->mla_softmax_block = lk_avx2_mla_softmax_block;

    /* ================ AVX-512 overrides ================ */
    *a5 = *a2;
    a5->isa = LK_ISA_AVX512;
    /* -- norms -- */
    a5->rms_norm = lk_avx512_rms_norm;
    a5->fused_add_rms_norm = lk_avx512_fused_add_rms_norm;
    /* -- activations -- */
    a5->silu_and_mul = lk_avx512_silu_and_mul;
    a5->gelu_tanh_and_mul = lk_avx512_gelu_tanh_and_mul;

    /* -- rotary -- */
    a5->rotary_embedding = lk_avx512_rotary_embedding;

    /* -- kv cache -- */
    a5->reshape_and_cache_flash = lk_avx512_reshape_and_cache_flash;

    /* -- merge -- */
    a5->merge_attn_states = lk_avx512_merge_attn_states;

    /* -- softmax -- */
    a5->causal_softmax = lk_avx512_causal_softmax;

    /* -- attention: the AVX2 kernel (inherited) -- */

    /* -- mla cache -- */
    a5->concat_and_cache_mla = lk_avx512_concat_and_cache_mla;
    a5->gather_cache = lk_avx512_gather_cache;

    /* -- mla prefill: the AVX2 softmax step (inherited) -- */

    lk_isa isa = lk_isa_best();
    const char *env = getenv("LLMKERN_ISA");
    if (env) {
        lk_isa want = isa;
        if (!strcmp(env, "ref")) want = LK_ISA_REF;
        else if (!strcmp(env, "avx2")) want = LK_ISA_AVX2;
        else if (!strcmp(env, "avx512")) want = LK_ISA_AVX512;
        if (want <= isa) isa = want; /* an unsupported request keeps the best */
    }
    atomic_store(&current_isa, (int)isa);
}

lk_isa lk_isa_best(void) {
    if (lk_cpu_has_avx512()) return LK_ISA_AVX512;
    if (lk_cpu_has_avx2()) return LK_ISA_AVX2;
    return LK_ISA_REF;
}

const lk_kernel_table *lk_kernels(void) {
    pthread_once(&init_once, fill_tables);
    return &tables[atomic_load(&current_isa)];
}

lk_isa lk_isa_current(void) { return lk_kernels()->isa; }

lk_status lk_set_isa(lk_isa isa) {
    lk_clear_error();
    lk_set_op("lk_set_isa");
    pthread_once(&init_once, fill_tables);
    if ((int)isa < LK_ISA_REF || (int)isa > LK_ISA_AVX512)
        return lk_fail(LK_ERR_VALUE, "isa: unknown value %d", (int)isa);
    if (isa > lk_isa_best())
        return lk_fail(LK_ERR_UNSUPPORTED, "isa: %s is not supported by this CPU/OS (best: %s)",
                       lk_isa_name(isa), lk_isa_name(lk_isa_best()));
    atomic_store(&current_isa, (int)isa);
    return LK_OK;
}

const char *lk_isa_name(lk_isa isa) {
    switch (isa) {
    case LK_ISA_REF: return "ref";
    case LK_ISA_AVX2: return "avx2";
    case LK_ISA_AVX512: return "avx512";
    }
    return "unknown";
}
