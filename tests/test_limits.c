/*
 * Limits of every public operator, table-driven over the registry (tests/opcases.c):
 * for each operator and each of its tensor arguments, a valid call is broken in one way
 * and must be rejected with the named status, a message "<op>: ..." naming the argument,
 * and every buffer bit-identical to before:
 *
 *   rank     ndim = LK_MAX_DIMS + 1, and ndim = -1                      LK_ERR_RANK
 *   size     a negative dim                                            LK_ERR_SHAPE
 *   dtype    an unknown dtype value                                    LK_ERR_DTYPE
 *   fp8      the argument retyped LK_F8E4M3, and LK_F8E5M2 (same shape and element
 *            strides, so a smaller span in the same allocation): no operator takes
 *            fp8 yet, each rejects it naming the argument               LK_ERR_DTYPE
 *   i8       the argument retyped LK_I8 (every argument but the int8 outs of
 *            lk_rms_norm_dynamic_per_token_quant and the int8
 *            quantizers rejects it)                                    LK_ERR_DTYPE
 *   offsets  a stride whose byte offsets overflow int64 (INT64_MAX / 2 on a dim of
 *            size >= 2), a stride of INT64_MIN (its magnitude overflows), an element
 *            count beyond int64 (dims multiplied out)                  LK_ERR_OVERFLOW
 *   data     NULL data on a non-empty view                             LK_ERR_NULL
 *   pointer  the tensor pointer itself NULL (required arguments)       LK_ERR_NULL
 *   outputs  a written argument with stride 0 on a dim of size >= 2    LK_ERR_ALIAS
 *
 * Negative strides are supported by every operator on every argument (the API allows
 * any stride sign), so the table checks the opposite: each argument re-laid out with its
 * first dim reversed in memory (negative stride, same logical contents) gives the
 * baseline's results, and the written arguments' garbage stays untouched.
 *
 * Coverage: every operator declared in include/llmkern.h (an LK_API function returning
 * lk_status that takes an lk_tensor) must have an entry in the registry, so none can be
 * added without joining the limits, concurrency and determinism suites.
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "opcases.h"

#ifndef LK_PUBLIC_HEADER
#error "LK_PUBLIC_HEADER (the path of include/llmkern.h) is set by CMakeLists.txt"
#endif

typedef struct {
    const char *what;
    lk_status want;
    int written_only; /* applies to written arguments only */
    int needs_dim2;   /* needs a dim of size >= 2 */
} mutation;

enum { M_RANK_HI, M_RANK_NEG, M_NEG_DIM, M_DTYPE, M_F8E4M3, M_F8E5M2, M_I8, M_STRIDE_OVF, M_STRIDE_MIN, M_NUMEL_OVF, M_NULL_DATA, M_NULL_PTR, M_OUT_ZERO, M_COUNT };

static const mutation MUT[M_COUNT] = {
    {"ndim = LK_MAX_DIMS + 1", LK_ERR_RANK, 0, 0},
    {"ndim = -1", LK_ERR_RANK, 0, 0},
    {"negative dim", LK_ERR_SHAPE, 0, 0},
    {"unknown dtype", LK_ERR_DTYPE, 0, 0},
    {"dtype f8e4m3", LK_ERR_DTYPE, 0, 0},
    {"dtype f8e5m2", LK_ERR_DTYPE, 0, 0},
    {"dtype i8", LK_ERR_DTYPE, 0, 0},
    {"stride with overflowing byte offsets", LK_ERR_OVERFLOW, 0, 1},
    {"stride INT64_MIN", LK_ERR_OVERFLOW, 0, 0},
    {"element count beyond int64", LK_ERR_OVERFLOW, 0, 1},
    {"NULL data, non-empty view", LK_ERR_NULL, 0, 0},
    {"NULL tensor pointer", LK_ERR_NULL, 0, 0},
    {"output with a zero stride", LK_ERR_ALIAS, 1, 1},
};

/* first dim of size >= 2, -1 if none */
static int dim2(const lk_tensor *t) {
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] >= 2) return d;
    return -1;
}

/* apply mutation m to argument k; 0 if it does not apply */
static int mutate(oc_inst *in, int k, int m) {
    oc_arg *a = &in->arg[k];
    lk_tensor *t = &a->t;
    int d = dim2(t);
    if (MUT[m].written_only && !a->written) return 0;
    if ((m == M_F8E4M3 || m == M_F8E5M2) && a->fp8) return 0; /* takes fp8 */
    if (m == M_I8 && a->i8) return 0;                          /* takes i8 */
    if (MUT[m].needs_dim2 && d < 0) return 0;
    switch (m) {
    case M_RANK_HI: t->ndim = LK_MAX_DIMS + 1; break;
    case M_RANK_NEG: t->ndim = -1; break;
    case M_NEG_DIM: t->shape[0] = -1; break;
    case M_DTYPE: t->dtype = (lk_dtype)99; break;
    case M_F8E4M3: t->dtype = LK_F8E4M3; break;
    case M_F8E5M2: t->dtype = LK_F8E5M2; break;
    case M_I8: t->dtype = LK_I8; break;
    case M_STRIDE_OVF: t->stride[d] = INT64_MAX / 2; break;
    case M_STRIDE_MIN: t->stride[0] = INT64_MIN; break;
    case M_NUMEL_OVF:
        for (int e = 0; e < t->ndim; e++) t->shape[e] = (int64_t)1 << 40;
        if (t->ndim == 1) t->shape[0] = INT64_MAX; /* one dim: count fits, offsets do not */
        break;
    case M_NULL_DATA: t->data = NULL; break;
    case M_NULL_PTR:
        if (a->optional) return 0;
        a->is_null = 1;
        break;
    case M_OUT_ZERO: t->stride[d] = 0; break;
    }
    return 1;
}

static int names_arg(const char *msg, const char *op, const char *arg, int m) {
    char opp[64];
    snprintf(opp, sizeof opp, "%s: ", op);
    if (strncmp(msg, opp, strlen(opp))) return 0;
    /* merge_attn_states_n reports a NULL array as "states" / "lses" */
    const char *name = arg;
    char base[32];
    if (m == M_NULL_PTR && strchr(arg, '[')) {
        snprintf(base, sizeof base, "%.*s", (int)(strchr(arg, '[') - arg), arg);
        name = base;
    }
    return strstr(msg + strlen(opp), name) != NULL;
}

static void test_table(void) {
    for (int o = 0; o < OC_NOPS; o++) {
        const oc_op *op = &OC_OPS[o];
        oc_inst base;
        oc_make(op, &base, OC_SMALL, 1000 + (uint64_t)o);
        lk_status s0 = oc_call(&base);
        tu_check(s0 == LK_OK, "%s: the registry's call is valid (%s %s)", op->name, lk_status_str(s0), lk_last_error());
        int nargs = base.nargs;
        oc_free(&base);
        for (int k = 0; k < nargs; k++)
            for (int m = 0; m < M_COUNT; m++) {
                oc_inst in;
                oc_make(op, &in, OC_SMALL, 1000 + (uint64_t)o);
                if (!mutate(&in, k, m)) {
                    oc_free(&in);
                    continue;
                }
                oc_snapshot(&in);
                lk_status s = oc_call(&in);
                const char *msg = lk_last_error();
                int ok = s == MUT[m].want && names_arg(msg, op->name, in.arg[k].name, m) && oc_intact(&in);
                tu_check(ok, "%s: %s: %s -> %s (want %s) \"%s\"%s", op->name, in.arg[k].name, MUT[m].what,
                         lk_status_str(s), lk_status_str(MUT[m].want), msg, oc_intact(&in) ? "" : ", buffers changed");
                oc_free(&in);
            }
    }
}

/* a copy of argument k with its first dim reversed in memory: same allocation size and
 * garbage, element [i, ...] moved to where [n - 1 - i, ...] was, data at the old last
 * row, stride negated. Logical contents unchanged. */
static void reverse_dim0(oc_arg *a) {
    lk_tensor *t = &a->t;
    tu_buf nb = a->buf;
    nb.base = malloc(a->buf.bytes);
    nb.snap = malloc(a->buf.bytes);
    nb.inview = malloc(a->buf.bytes);
    memcpy(nb.base, a->buf.base, a->buf.bytes);
    memcpy(nb.inview, a->buf.inview, a->buf.bytes);
    int64_t es = (int64_t)lk_dtype_size(t->dtype), n0 = t->shape[0];
    lk_tensor r = *t;
    r.data = nb.base + ((unsigned char *)t->data - a->buf.base) + (n0 - 1) * t->stride[0] * es;
    r.stride[0] = -t->stride[0];
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    for (int64_t i = 0; i < n; i++)
        memcpy((char *)r.data + tu_offset(&r, i) * es, (char *)t->data + tu_offset(t, i) * es, (size_t)es);
    memcpy(nb.snap, nb.base, a->buf.bytes);
    tu_free(&a->buf);
    a->buf = nb;
    a->buf.t = r;
    a->t = r;
}

/* logical contents of a written argument as bytes (element by element) */
static unsigned char *contents(const oc_arg *a, size_t *len) {
    const lk_tensor *t = &a->t;
    int64_t es = (int64_t)lk_dtype_size(t->dtype), n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    unsigned char *c = malloc((size_t)(n * es) + 1);
    for (int64_t i = 0; i < n; i++) memcpy(c + i * es, (char *)t->data + tu_offset(t, i) * es, (size_t)es);
    *len = (size_t)(n * es);
    return c;
}

static void test_negative_strides(void) {
    for (int o = 0; o < OC_NOPS; o++) {
        const oc_op *op = &OC_OPS[o];
        oc_inst base;
        oc_make(op, &base, OC_SMALL, 2000 + (uint64_t)o);
        oc_call(&base);
        for (int k = 0; k < base.nargs; k++) {
            if (base.arg[k].t.shape[0] < 2) continue;
            oc_inst in;
            oc_make(op, &in, OC_SMALL, 2000 + (uint64_t)o);
            reverse_dim0(&in.arg[k]);
            oc_snapshot(&in);
            lk_status s = oc_call(&in);
            int same = s == LK_OK;
            for (int j = 0; j < in.nargs && same; j++) {
                if (!in.arg[j].written) continue;
                size_t l1, l2;
                unsigned char *c1 = contents(&base.arg[j], &l1), *c2 = contents(&in.arg[j], &l2);
                same = l1 == l2 && !memcmp(c1, c2, l1) && tu_outside_intact(&in.arg[j].buf);
                free(c1), free(c2);
            }
            tu_check(same, "%s: %s with a negative stride on dim 0 gives the same results (%s %s)", op->name,
                     in.arg[k].name, lk_status_str(s), s ? lk_last_error() : "");
            oc_free(&in);
        }
        oc_free(&base);
    }
}

/* every public operator of the header is in OC_OPS */
static void test_registry_covers_header(void) {
    FILE *f = fopen(LK_PUBLIC_HEADER, "rb");
    if (!tu_check(f != NULL, "registry coverage: read %s", LK_PUBLIC_HEADER)) return;
    static char text[1 << 20];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    int found = 0;
    for (const char *p = text; (p = strstr(p, "LK_API lk_status ")) != NULL;) {
        p += strlen("LK_API lk_status ");
        char name[96];
        int len = 0;
        while ((isalnum((unsigned char)p[len]) || p[len] == '_') && len < (int)sizeof name - 1) name[len] = p[len], len++;
        name[len] = '\0';
        const char *close = strchr(p, ')');
        const char *tensor = strstr(p, "lk_tensor");
        if (!close || !tensor || tensor > close) continue; /* not an operator (lk_set_isa, ...) */
        found++;
        int in_registry = 0;
        for (int o = 0; o < OC_NOPS; o++) in_registry |= !strcmp(OC_OPS[o].name, name);
        tu_check(in_registry, "registry coverage: public operator %s has an entry in OC_OPS (tests/opcases.c)", name);
    }
    tu_check(found >= 13, "registry coverage: %d public operators found in %s", found, LK_PUBLIC_HEADER);
}

/* empty views whose dims multiply past int64 pass lk_check_view (no element is
 * addressed); the operators that multiply such dims together (heads x dims of an NZ
 * page or of a gather entry) must report it, naming the argument, without a signed
 * overflow (the sanitizer builds abort on one) */
static void test_empty_dims_overflow(void) {
    static float f[16];
    static unsigned char cache[1024];
    static int64_t sm[1];
    static int32_t cu[2], used[1], bt[1], sl[1];
    const int64_t g40 = (int64_t)1 << 40, g60 = (int64_t)1 << 60;
    lk_tensor k = {f, LK_F32, 3, {0, g40, g40}, {1, 1, 1}};
    lk_tensor kc = {cache, LK_F8E4M3, 4, {1, 0, 1, 32}, {32, 32, 32, 1}};
    lk_tensor slots = {sm, LK_I64, 1, {0}, {1}};
    lk_status st = lk_reshape_and_cache_flash_fp8(&k, &k, &kc, &kc, &slots, NULL, NULL, LK_KV_NZ);
    tu_check(st == LK_ERR_OVERFLOW && strstr(lk_last_error(), "k_cache: heads x dims"),
             "reshape_and_cache_flash_fp8 NZ, k [0, 2^40, 2^40]: %s (%s)", lk_status_str(st), lk_last_error());
    lk_tensor q = lk_tensor_make(f, LK_F32, 3, (int64_t[]){1, 1, 16}), o = q;
    lk_tensor kz = {f, LK_F32, 4, {0, g60, 0, 16}, {0, 0, 0, 0}};
    lk_tensor tcu = lk_tensor_make(cu, LK_I32, 1, (int64_t[]){2}), tu_ = lk_tensor_make(used, LK_I32, 1, (int64_t[]){1});
    lk_tensor tbt = lk_tensor_make(bt, LK_I32, 2, (int64_t[]){1, 1}), tsl = lk_tensor_make(sl, LK_I32, 1, (int64_t[]){1});
    lk_attn_params p = lk_attn_params_default(1.0f);
    p.kv_layout = LK_KV_NZ;
    st = lk_flash_attn_varlen(&o, NULL, &q, &kz, &kz, &tcu, NULL, &tu_, &tbt, &p);
    tu_check(st == LK_ERR_OVERFLOW && strstr(lk_last_error(), "k: NZ shape"),
             "flash_attn_varlen NZ, k [0, 2^60, 0, 16]: %s (%s)", lk_status_str(st), lk_last_error());
    lk_tensor go = {f, LK_F32, 3, {0, g40, g40}, {1, 1, 1}}, gc = lk_tensor_make(f, LK_F32, 3, (int64_t[]){1, 1, 16});
    st = lk_gather_cache(&go, &gc, &tbt, &tsl, LK_KV_ND);
    tu_check(st == LK_ERR_OVERFLOW && strstr(lk_last_error(), "out: shape"),
             "gather_cache, out [0, 2^40, 2^40]: %s (%s)", lk_status_str(st), lk_last_error());
}

int main(void) {
    tu_init();
    test_registry_covers_header();
    test_table();
    test_negative_strides();
    test_empty_dims_overflow();
    return tu_finish("test_limits");
}
