/*
 * The operator registry of the cross-operator suites: one entry per public operator,
 * each able to build a valid call (every tensor argument in its own allocation, with
 * deterministic values) and to make it. test_limits, test_concurrency and
 * test_determinism walk this table, so a new operator joins all three by adding one
 * entry to OC_OPS in tests/opcases.c (a builder and a caller; see the existing ones).
 *
 * An instance (oc_inst) lists the op's tensor arguments in a fixed order with the names
 * the op uses in its error messages ("x", "k_cache", "states[1]", ...), which of them it
 * writes, and its scalar attributes. Tests may change an argument's view (t) or pass it
 * as NULL (is_null) before calling; the allocation (buf) is kept for intact checks.
 */
#ifndef LK_OPCASES_H
#define LK_OPCASES_H

#include "testutil.h"

#define OC_MAXARG 12

typedef enum { OC_SMALL = 0, OC_MEDIUM = 1, OC_LARGE = 2 } oc_size;

typedef struct {
    const char *name; /* as in the op's error messages */
    tu_buf buf;       /* the allocation (views with padding, guard zones of garbage) */
    lk_tensor t;      /* the view passed to the op; starts as buf.t */
    int written;      /* the op writes through it */
    int optional;     /* may be passed as NULL */
    int is_null;      /* pass NULL instead of &t */
    int shared;       /* a clone shares buf with its source (read-only sharing) */
    int fp8;          /* takes LK_F8E4M3 / LK_F8E5M2 too (test_limits' fp8 rows skip it) */
    int i8;           /* takes LK_I8 too (test_limits' i8 row skips it) */
} oc_arg;

typedef struct oc_op oc_op;

typedef struct {
    const oc_op *op;
    int nargs;
    oc_arg arg[OC_MAXARG];
    float eps;             /* norms */
    int flag;              /* gemma, is_neox, layout, ... (per op) */
    int n;                 /* merge_attn_states_n: number of states */
    lk_attn_params params; /* flash attention */
    lk_mla_params mla;     /* MLA prefix prefill */
    lk_mla_decode_params mla_dec; /* MLA decode */
    float scale[2];        /* fp8 caches: k_scale, v_scale */
    int64_t group;         /* per_token_group_fp8_quant, rms_norm_per_block_quant: group_size */
} oc_inst;

struct oc_op {
    const char *name;                    /* the public function */
    void (*make)(oc_inst *in, oc_size);  /* allocate and fill a valid call */
    lk_status (*call)(const oc_inst *in);
};

extern const oc_op OC_OPS[];
extern const int OC_NOPS;

/* build a valid instance of op (values from tu_seed(seed)) */
void oc_make(const oc_op *op, oc_inst *in, oc_size size, uint64_t seed);
lk_status oc_call(const oc_inst *in);
void oc_free(oc_inst *in);
/* copy of an instance at new addresses, same bytes: written arguments always copied;
 * read-only ones copied too, or shared with src when share_inputs (then oc_free of the
 * clone leaves them to src) */
void oc_clone(oc_inst *dst, const oc_inst *src, int share_inputs);
/* every written argument's allocation bit-identical between a and b (same op, same
 * layouts) */
int oc_same_written(const oc_inst *a, const oc_inst *b);
/* snapshot / compare every argument's allocation */
void oc_snapshot(oc_inst *in);
int oc_intact(const oc_inst *in);
/* index of the argument named name, -1 if none */
int oc_find(const oc_inst *in, const char *name);

#endif
