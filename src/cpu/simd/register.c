/*
 * The registration function of one vector ISA (LKV_FN(register), e.g. lk_avx2_register,
 * the function src/cpu/dispatch.c's row for that ISA calls): every SIMD source of
 * src/cpu/simd/ sets its kernel-table entries through its own LKV_FN(register_<op>).
 * Compiled once per ISA like the sources. A new op's source adds its line here.
 */
#include "../kernels.h"
#include "../vec/lkv.h"

void LKV_FN(register_rms_norm)(lk_kernel_table *t);
void LKV_FN(register_activation)(lk_kernel_table *t);
void LKV_FN(register_softmax)(lk_kernel_table *t);
void LKV_FN(register_mla_softmax)(lk_kernel_table *t);
void LKV_FN(register_kv_cache)(lk_kernel_table *t);
void LKV_FN(register_mla_cache)(lk_kernel_table *t);
void LKV_FN(register_merge)(lk_kernel_table *t);
void LKV_FN(register_rotary)(lk_kernel_table *t);
void LKV_FN(register_attention)(lk_kernel_table *t);
void LKV_FN(register_act_ext)(lk_kernel_table *t);
void LKV_FN(register_block_copy)(lk_kernel_table *t);
void LKV_FN(register_mla_decode)(lk_kernel_table *t);
void LKV_FN(register_convert_fp8)(lk_kernel_table *t); /* fp8 caches */
void LKV_FN(register_fp8_quant)(lk_kernel_table *t); /* fp8 activations */
void LKV_FN(register_int8_quant)(lk_kernel_table *t); /* int8 activations */
void LKV_FN(register_act_quant)(lk_kernel_table *t);

void LKV_FN(register)(lk_kernel_table *t);
void LKV_FN(register)(lk_kernel_table *t) {
    LKV_FN(register_rms_norm)(t);
    LKV_FN(register_activation)(t);
    LKV_FN(register_softmax)(t);
    LKV_FN(register_mla_softmax)(t);
    LKV_FN(register_kv_cache)(t);
    LKV_FN(register_mla_cache)(t);
    LKV_FN(register_merge)(t);
    LKV_FN(register_rotary)(t);
    LKV_FN(register_attention)(t);
    LKV_FN(register_act_ext)(t);
    LKV_FN(register_block_copy)(t);
    LKV_FN(register_mla_decode)(t);
    LKV_FN(register_convert_fp8)(t); /* fp8 caches */
    LKV_FN(register_fp8_quant)(t); /* fp8 activations */
    LKV_FN(register_int8_quant)(t); /* int8 activations */
    LKV_FN(register_act_quant)(t);
}
