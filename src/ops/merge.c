/*
 * Public entry points lk_merge_attn_states (2-way) and lk_merge_attn_states_n (N-way):
 * validation (before any store), then the merge kernel of the ISA in use. The 2-way
 * form is the N-way kernel with n = 2. Contract in include/llmkern.h, maths and the
 * -inf / NaN rules in src/common/attn_state.h.
 *
 *   out[T, H, D] (+ out_lse[T, H]) = merge of n states (states[i] [T, H, D],
 *   lses[i] [T, H] f32); states may each have their own float dtype and any strides;
 *   LSE views any strides (a [H, T] buffer passed as its transpose view).
 *   out must not overlap any input; out_lse must not overlap anything.
 *
 * Zero-sized work: T * H == 0 does nothing; D == 0 writes only out_lse (if given).
 * lk_merge_attn_states_scaled (since 0.3): the 2-way form with an fp8 out, stored
 * fp8(merged / output_scale) (out_scale of the kernel arguments; 1 and unused otherwise).
 */
#include <string.h>

#include "../cpu/fp8_quant.h"
#include "../cpu/kernels.h"

typedef struct {
    char state[24], lse[24];
} merge_names;

/* "<prefix>[i]" into buf (no printf: this runs on every call, decode included) */
static void indexed_name(char *buf, const char *prefix, int i) {
    char digits[12];
    int nd = 0;
    do digits[nd++] = (char)('0' + i % 10), i /= 10;
    while (i > 0);
    while (*prefix) *buf++ = *prefix++;
    *buf++ = '[';
    while (nd > 0) *buf++ = digits[--nd];
    *buf++ = ']';
    *buf = '\0';
}

/* argument names for messages: "a"/"lse_a", "b"/"lse_b" for the 2-way form,
 * "states[i]"/"lses[i]" for the N-way form */
static merge_names names_of(int two_way, int i) {
    merge_names nm;
    if (two_way) {
        memcpy(nm.state, i ? "b" : "a", 2);
        memcpy(nm.lse, i ? "lse_b" : "lse_a", 6);
    } else {
        indexed_name(nm.state, "states", i);
        indexed_name(nm.lse, "lses", i);
    }
    return nm;
}

static lk_status check_lse(const lk_tensor *t, const char *name, const lk_tensor *out) {
    lk_status s = lk_check_view(t, name, 2, 2);
    if (s) return s;
    if (t->dtype != LK_F32)
        return lk_fail(LK_ERR_DTYPE, "%s: dtype %s not supported (LSE is f32)", name,
                       lk_dtype_name(t->dtype));
    if (t->shape[0] != out->shape[0] || t->shape[1] != out->shape[1])
        return lk_fail(LK_ERR_SHAPE, "%s: shape %s does not match out's [T, H] = [%lld, %lld]",
                       name, lk_shape_str(t), (long long)out->shape[0], (long long)out->shape[1]);
    return LK_OK;
}

/* out: f32/f16/bf16, or with output_scale (scaled != 0) fp8 */
static lk_status check_out(const lk_tensor *out, int scaled) {
    if (!scaled) return lk_check_float(out, "out", 3, 3);
    lk_status s = lk_check_view(out, "out", 3, 3);
    if (s) return s;
    if (out->dtype != LK_F8E4M3 && out->dtype != LK_F8E5M2)
        return lk_fail(LK_ERR_DTYPE, "out: dtype %s with output_scale (only an fp8 out is scaled: f8e4m3, f8e5m2)",
                       lk_dtype_name(out->dtype));
    return LK_OK;
}

static lk_status check_merge(const lk_merge_args *a, int two_way, int scaled) {
    lk_status s;
    const lk_tensor *out = &a->out;
    if ((s = check_out(out, scaled))) return s;
    for (int i = 0; i < a->n; i++) {
        merge_names nm = names_of(two_way, i);
        if ((s = lk_check_float(&a->states[i], nm.state, 3, 3))) return s;
        if ((s = lk_check_same_shape(&a->states[i], nm.state, out, "out"))) return s;
        if ((s = check_lse(&a->lses[i], nm.lse, out))) return s;
    }
    if (a->has_out_lse && (s = check_lse(&a->out_lse, "out_lse", out))) return s;
    if ((s = lk_check_no_self_overlap(out, "out"))) return s;
    if (a->has_out_lse) {
        if ((s = lk_check_no_self_overlap(&a->out_lse, "out_lse"))) return s;
        if ((s = lk_check_disjoint(&a->out_lse, "out_lse", out, "out"))) return s;
    }
    for (int i = 0; i < a->n; i++) {
        merge_names nm = names_of(two_way, i);
        if ((s = lk_check_disjoint(out, "out", &a->states[i], nm.state))) return s;
        if ((s = lk_check_disjoint(out, "out", &a->lses[i], nm.lse))) return s;
        if (a->has_out_lse) {
            if ((s = lk_check_disjoint(&a->out_lse, "out_lse", &a->states[i], nm.state))) return s;
            if ((s = lk_check_disjoint(&a->out_lse, "out_lse", &a->lses[i], nm.lse))) return s;
        }
    }
    return LK_OK;
}

static lk_status merge_run(const lk_tensor *out, const lk_tensor *out_lse, int n,
                           const lk_tensor *states, const lk_tensor *lses, int two_way,
                           const lk_tensor *out_scale) {
    lk_merge_args a;
    a.out_scale = 1.0f;
    a.out = *out;
    a.has_out_lse = out_lse != NULL;
    if (out_lse) a.out_lse = *out_lse;
    else a.out_lse = lk_tensor_make(NULL, LK_F32, 0, NULL);
    a.n = n;
    a.states = states;
    a.lses = lses;
    lk_status s = check_merge(&a, two_way, out_scale != NULL);
    if (!s && out_scale) s = lk_q_scale_in(out_scale, "output_scale", &a.out_scale);
    if (s) return s;
    if (out->shape[0] * out->shape[1] == 0) return LK_OK;
    if (out->shape[2] == 0 && !out_lse) return LK_OK;
    return lk_kernels()->merge_attn_states(&a);
}

lk_status lk_merge_attn_states(const lk_tensor *out, const lk_tensor *out_lse, const lk_tensor *a,
                               const lk_tensor *lse_a, const lk_tensor *b, const lk_tensor *lse_b) {
    lk_clear_error();
    lk_set_op("lk_merge_attn_states");
    if (!out || !a || !lse_a || !b || !lse_b)
        return lk_fail(LK_ERR_NULL, "%s: tensor pointer is NULL",
                       !out ? "out" : !a ? "a" : !lse_a ? "lse_a" : !b ? "b" : "lse_b");
    lk_tensor states[2] = {*a, *b}, lses[2] = {*lse_a, *lse_b};
    return merge_run(out, out_lse, 2, states, lses, 1, NULL);
}

lk_status lk_merge_attn_states_n(const lk_tensor *out, const lk_tensor *out_lse, int n,
                                 const lk_tensor *states, const lk_tensor *lses) {
    lk_clear_error();
    lk_set_op("lk_merge_attn_states_n");
    if (!out) return lk_fail(LK_ERR_NULL, "out: tensor pointer is NULL");
    if (n < 1) return lk_fail(LK_ERR_VALUE, "n: must be >= 1, got %d", n);
    if (!states || !lses)
        return lk_fail(LK_ERR_NULL, "%s: array pointer is NULL", !states ? "states" : "lses");
    return merge_run(out, out_lse, n, states, lses, 0, NULL);
}

/* ---- fp8 output (since 0.3): vLLM's merge_attn_states(..., output_scale) ---- */
lk_status lk_merge_attn_states_scaled(const lk_tensor *out, const lk_tensor *out_lse, const lk_tensor *a,
                                      const lk_tensor *lse_a, const lk_tensor *b, const lk_tensor *lse_b,
                                      const lk_tensor *output_scale) {
    lk_clear_error();
    lk_set_op("lk_merge_attn_states_scaled");
    if (!out || !a || !lse_a || !b || !lse_b)
        return lk_fail(LK_ERR_NULL, "%s: tensor pointer is NULL",
                       !out ? "out" : !a ? "a" : !lse_a ? "lse_a" : !b ? "b" : "lse_b");
    if (!output_scale && out->ndim >= 0 && (out->dtype == LK_F8E4M3 || out->dtype == LK_F8E5M2))
        return lk_fail(LK_ERR_NULL, "output_scale: tensor pointer is NULL (an fp8 out needs its scale)");
    lk_tensor states[2] = {*a, *b}, lses[2] = {*lse_a, *lse_b};
    return merge_run(out, out_lse, 2, states, lses, 1, output_scale);
}
