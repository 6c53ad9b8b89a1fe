/*
 * The kernel tables, one per ISA, and the choice of the one in use.
 *
 * One registration row per ISA {isa, name, detect, register}, in increasing order within
 * its architecture and guarded by the target architecture (x86: avx2, avx512,
 * avx512bf16, amx; aarch64: neon): the reference table is filled from ref/, then
 * each row's table starts as a copy of the previous row's and the row's register
 * function (src/cpu/simd/register.c compiled for that ISA) overrides the entries its
 * SIMD sources provide. An ISA is usable when its row is built and its detect() (CPU +
 * OS support) is true; the best usable one is the default. LLMKERN_ISA=<name> (read
 * once) or lk_set_isa() forces one; a request for an unusable ISA is refused.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

typedef struct {
    lk_isa isa;
    const char *name;
    int (*detect)(void);                  /* NULL: always usable */
    void (*reg)(lk_kernel_table *t);      /* NULL: the reference table */
} isa_row;

#if defined(__x86_64__) || defined(__i386__)
void lk_avx2_register(lk_kernel_table *t);
void lk_avx512_register(lk_kernel_table *t);
void lk_avx512bf16_register(lk_kernel_table *t);
void lk_avx512bf16_register_mla_decode(lk_kernel_table *t);
void lk_amx_register(lk_kernel_table *t);
void lk_amx_register_mla_decode(lk_kernel_table *t);
/* the AVX512_BF16 row: flash_attn's registration, then mla_decode's bf16 build */
static void avx512bf16_register(lk_kernel_table *t) {
    lk_avx512bf16_register(t);
    lk_avx512bf16_register_mla_decode(t);
}
/* the AMX row: flash_attn's and mla_decode's tile builds */
static void amx_register(lk_kernel_table *t) {
    lk_amx_register(t);
    lk_amx_register_mla_decode(t);
}
#endif
#if defined(__aarch64__)
void lk_neon_register(lk_kernel_table *t);
#endif

static const isa_row ROWS[] = {
    {LK_ISA_REF, "ref", NULL, NULL},
#if defined(__x86_64__) || defined(__i386__)
    {LK_ISA_AVX2, "avx2", lk_cpu_has_avx2, lk_avx2_register},
    {LK_ISA_AVX512, "avx512", lk_cpu_has_avx512, lk_avx512_register},
    {LK_ISA_AVX512BF16, "avx512bf16", lk_cpu_has_avx512bf16, avx512bf16_register},
    {LK_ISA_AMX, "amx", lk_cpu_has_amx, amx_register},
#endif
#if defined(__aarch64__)
    {LK_ISA_NEON, "neon", lk_cpu_has_neon, lk_neon_register},
#endif
};
#define N_ROWS ((int)(sizeof ROWS / sizeof ROWS[0]))
#define N_ISAS (LK_ISA_AMX + 1) /* the last value of lk_isa */

static lk_kernel_table tables[N_ISAS];
static int usable[N_ISAS];
static lk_isa best_isa;
static atomic_int current_isa;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static void fill_ref(lk_kernel_table *r) {
    r->isa = LK_ISA_REF;
    r->rms_norm = lk_ref_rms_norm;
    r->fused_add_rms_norm = lk_ref_fused_add_rms_norm;
    r->silu_and_mul = lk_ref_silu_and_mul;
    r->gelu_tanh_and_mul = lk_ref_gelu_tanh_and_mul;
    r->act_ext = lk_ref_act_ext;
    r->block_copy = lk_ref_block_copy;
    r->rotary_embedding = lk_ref_rotary_embedding;
    r->reshape_and_cache_flash = lk_ref_reshape_and_cache_flash;
    r->merge_attn_states = lk_ref_merge_attn_states;
    r->causal_softmax = lk_ref_causal_softmax;
    r->flash_attn = lk_ref_flash_attn;
    r->concat_and_cache_mla = lk_ref_concat_and_cache_mla;
    r->gather_cache = lk_ref_gather_cache;
    r->mla_softmax_block = lk_ref_mla_softmax_block;
    r->mla_prefix_prefill = lk_mla_prefill_drive;
    r->mla_decode = lk_ref_mla_decode;
    /* fp8 caches */
    r->reshape_and_cache_paged = lk_ref_reshape_and_cache_paged;
    r->convert_fp8 = lk_ref_convert_fp8;
    /* fp8 activations */
    r->fp8_quant = lk_ref_fp8_quant;
    r->rms_norm_quant = lk_ref_rms_norm_quant;
    r->int8_quant = lk_ref_int8_quant; /* int8 activations */
    r->act_quant = lk_ref_act_quant;
    r->concat_and_cache_mla_rope = lk_mla_cache_rope_drive;
    r->concat_and_cache_mla_ds = lk_ref_concat_and_cache_mla_ds; /* fp8_ds_mla caches */
    r->gather_cache_ds = lk_ref_gather_cache_ds;
}

static void fill_tables(void) {
    const lk_kernel_table *prev = NULL;
    for (int i = 0; i < N_ROWS; i++) {
        lk_kernel_table *t = &tables[ROWS[i].isa];
        if (prev) *t = *prev;
        else fill_ref(t);
        t->isa = ROWS[i].isa;
        if (ROWS[i].reg) ROWS[i].reg(t);
        prev = t;
        usable[ROWS[i].isa] = !ROWS[i].detect || ROWS[i].detect();
        if (usable[ROWS[i].isa]) best_isa = ROWS[i].isa;
    }
    lk_isa isa = best_isa;
    const char *env = getenv("LLMKERN_ISA");
    for (int i = 0; env && i < N_ROWS; i++)
        if (!strcmp(env, ROWS[i].name) && usable[ROWS[i].isa]) isa = ROWS[i].isa; /* else: the best */
    atomic_store(&current_isa, (int)isa);
}

lk_isa lk_isa_best(void) {
    pthread_once(&init_once, fill_tables);
    return best_isa;
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
    if ((int)isa < 0 || (int)isa >= N_ISAS) return lk_fail(LK_ERR_VALUE, "isa: unknown value %d", (int)isa);
    if (!usable[isa])
        return lk_fail(LK_ERR_UNSUPPORTED, "isa: %s is not supported by this CPU/OS or build (best: %s)",
                       lk_isa_name(isa), lk_isa_name(best_isa));
    atomic_store(&current_isa, (int)isa);
    return LK_OK;
}

const char *lk_isa_name(lk_isa isa) {
    switch (isa) {
    case LK_ISA_REF: return "ref";
    case LK_ISA_AVX2: return "avx2";
    case LK_ISA_AVX512: return "avx512";
    case LK_ISA_AVX512BF16: return "avx512bf16";
    case LK_ISA_NEON: return "neon";
    case LK_ISA_AMX: return "amx";
    }
    return "unknown";
}
