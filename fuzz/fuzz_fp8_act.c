/*
 * Fuzz harness: the fp8 activation ops (see fuzz_common.h for the checks):
 * lk_static_scaled_fp8_quant, lk_dynamic_scaled_fp8_quant,
 * lk_dynamic_per_token_scaled_fp8_quant, lk_rms_norm_static_fp8_quant,
 * lk_fused_add_rms_norm_static_fp8_quant, lk_rms_norm_dynamic_per_token_quant,
 * lk_merge_attn_states_scaled, and the int8 quantizers lk_static_scaled_int8_quant /
 * lk_dynamic_scaled_int8_quant (symmetric or with a zero point: azp values from 0 to
 * INT32_MIN / INT32_MAX, given or written; an azp of the wrong dtype or size; a non-i8
 * out; input ranges that reach the int32 saturation or make rows constant, tiny or
 * off-centre). Input: op, rank, shape, dtypes (input, residual, weight,
 * e4m3 / e5m2 out; the per-token norm's i8 out, and an i8 out the others reject), layouts, [rows] or [..., 1] scales, scale / scale_ub / output_scale
 * values (0, < 0, NaN, inf rejected), eps, weightless norms, out aliasing the input, a
 * residual aliasing the input, shape mismatches, NULL pointers. Every written view
 * (fp8 out, scales, residual, out_lse) is compared with the ref bitwise (the kernels'
 * reductions run in a fixed order, so every ISA gives the reference's bits), except the
 * sign of a NaN computed from NaN inputs (docs/numerics.md: not specified): the norms'
 * and the merge's out, and the residual, compare values exactly with any NaN equal to any
 * NaN.
 */
#include <float.h>

#include "fuzz_common.h"

enum { OP_STATIC, OP_TENSOR, OP_TOKEN, OP_NORM, OP_FUSED, OP_NORM_TOKEN, OP_MERGE, OP_I8_STATIC, OP_I8_DYNAMIC, NOPS };
static const char *OPN[NOPS] = {"lk_static_scaled_fp8_quant", "lk_dynamic_scaled_fp8_quant",
                                "lk_dynamic_per_token_scaled_fp8_quant", "lk_rms_norm_static_fp8_quant",
                                "lk_fused_add_rms_norm_static_fp8_quant", "lk_rms_norm_dynamic_per_token_quant",
                                "lk_merge_attn_states_scaled", "lk_static_scaled_int8_quant",
                                "lk_dynamic_scaled_int8_quant"};

typedef struct {
    int op, out, x, w, res, scale, ub, lse_a, b, lse_b, out_lse, azp;
    float eps;
} q_attrs;

static lk_status call(const fz_world *w, const void *ap) {
    const q_attrs *a = ap;
    const lk_tensor *out = fz_t(w, a->out), *x = fz_t(w, a->x), *sc = fz_t(w, a->scale), *ub = fz_t(w, a->ub);
    switch (a->op) {
    case OP_STATIC: return lk_static_scaled_fp8_quant(out, x, sc);
    case OP_TENSOR: return lk_dynamic_scaled_fp8_quant(out, x, sc);
    case OP_TOKEN: return lk_dynamic_per_token_scaled_fp8_quant(out, x, sc, ub);
    case OP_NORM: return lk_rms_norm_static_fp8_quant(out, x, fz_t(w, a->w), sc, a->eps);
    case OP_FUSED: return lk_fused_add_rms_norm_static_fp8_quant(out, x, fz_t(w, a->res), fz_t(w, a->w), sc, a->eps);
    case OP_NORM_TOKEN:
        return lk_rms_norm_dynamic_per_token_quant(out, x, fz_t(w, a->w), sc, a->eps, ub, fz_t(w, a->res));
    case OP_I8_STATIC: return lk_static_scaled_int8_quant(out, x, sc, fz_t(w, a->azp));
    case OP_I8_DYNAMIC: return lk_dynamic_scaled_int8_quant(out, x, sc, fz_t(w, a->azp));
    default:
        return lk_merge_attn_states_scaled(out, fz_t(w, a->out_lse), x, fz_t(w, a->lse_a), fz_t(w, a->b),
                                           fz_t(w, a->lse_b), sc);
    }
}

/* an fp8 output: fz_view_new's rare wrong-kind dtype may be an fp8 dtype, which these
 * ops take (valid), so that case is not an expected failure */
static int fp8_out_new(fz_world *w, fz_in *in, const char *name, lk_dtype dt, int nd, const int64_t *shape) {
    int mf = w->must_fail, cl = w->clean;
    const char *why = w->why_fail;
    int vi = fz_view_new(w, in, name, dt, nd, shape, FZ_OUT);
    fz_view *v = &w->v[vi];
    if (v->bad && fz_is_fp8(v->t.dtype) && !fz_view_invalid(&v->t)) {
        v->bad = 0;
        w->must_fail = mf, w->why_fail = why, w->clean = cl;
    }
    return vi;
}

/* a one-element f32 scale view holding a value from the input; returns the view */
static int scale_new(fz_world *w, fz_in *in, const char *name, int role, int must_be_valid) {
    static const float SV[] = {1.0f, 0.0125f, 3.7f, 1e-30f, 1e30f, 0.5f, 0.0f, -1.0f, NAN, INFINITY};
    int vi = fz_view_new(w, in, name, fz_chance(in, 6) ? LK_F16 : LK_F32, 1, (int64_t[]){fz_chance(in, 6) ? 2 : 1},
                         role);
    lk_tensor *t = &w->v[vi].t;
    if (t->dtype != LK_F32) fz_fail_expected(w, "scale not f32");
    if (t->ndim == 1 && t->shape[0] != 1) fz_fail_expected(w, "scale not one element");
    float v = SV[fz_u8(in) % 10];
    if (fz_usable(w, vi) && t->dtype == LK_F32) {
        for (int64_t i = 0; i < fz_numel(t); i++) ((float *)t->data)[fz_off(t, i)] = v;
        if (must_be_valid && !(v > 0 && v <= FLT_MAX)) fz_fail_expected(w, "scale not finite > 0");
    }
    return vi;
}

/* [rows] or the leading dims and 1 (sometimes a wrong row count: rejected) */
static int rows_new(fz_world *w, fz_in *in, const char *name, lk_dtype dt, int nd, const int64_t *shape, int64_t rows) {
    int64_t ss[3] = {rows, 1, 1};
    int snd = 1;
    if (fz_u8(in) & 1) {
        snd = nd;
        for (int d = 0; d < nd - 1; d++) ss[d] = shape[d];
        ss[nd - 1] = 1;
    }
    if (fz_chance(in, 8)) {
        ss[0] += 1;
        fz_fail_expected(w, "per-row shape");
    }
    return fz_view_new(w, in, name, dt, snd, ss, FZ_OUT);
}

/* the int8 quantizers: out i8 = sat8(sat32(rn(v)) + azp); every written view bitwise */
static void int8_case(fz_world *w, fz_in *in, q_attrs *a) {
    int nd = 1 + (int)(fz_u8(in) % 3);
    int64_t shape[3] = {1, 1, 1};
    for (int d = 0; d < nd - 1; d++) shape[d] = fz_dim(in, 5);
    shape[nd - 1] = fz_dim(in, 70);
    int64_t rows = 1;
    for (int d = 0; d < nd - 1; d++) rows *= shape[d];
    a->x = fz_view_new(w, in, "input", fz_ftype(in), nd, shape, FZ_IN);
    int64_t os[3] = {shape[0], shape[1], shape[2]};
    if (fz_chance(in, 8)) {
        os[fz_u8(in) % (unsigned)nd] += 1;
        fz_fail_expected(w, "out shape differs from input");
    }
    if (fz_u8(in) % 16 == 0 && fz_usable(w, a->x)) { /* out written over the input: rejected */
        a->out = fz_view_alias(w, a->x, "out", FZ_OUT);
        w->v[a->out].inplace_of = -1;
        fz_fail_expected(w, "out aliases input");
    } else {
        a->out = fz_view_new(w, in, "out", LK_I8, nd, os, FZ_OUT);
        if (fz_chance(in, 8)) { /* retyped after placement: an element of the same size */
            w->v[a->out].t.dtype = LK_F8E4M3;
            fz_fail_expected(w, "out not i8");
        }
    }
    /* value ranges: ordinary, off-centre, tiny (scales near the subnormals), int32-saturating */
    static const double LO[5] = {-4, 1, -1e-30, -3e9, -1e38}, HI[5] = {4, 9, 1e-30, 3e9, 1e38};
    unsigned rg = fz_u8(in) % 5;
    fz_fill(w, a->x, LO[rg], HI[rg]);
    if (fz_chance(in, 24) && fz_usable(w, a->x)) /* a constant row set (every element one value) */
        for (int64_t i = 0, n = fz_numel(&w->v[a->x].t); i < n; i++)
            lk_store_f(w->v[a->x].t.data, w->v[a->x].t.dtype, fz_off(&w->v[a->x].t, i), 2.5f);
    int with_azp = fz_u8(in) & 1;
    if (a->op == OP_I8_STATIC) {
        a->scale = scale_new(w, in, "scale", FZ_IN, 1);
        if (with_azp) {
            static const int64_t ZV[8] = {0, -7, 100, -128, 127, INT32_MIN, INT32_MAX, (int64_t)1 << 30};
            int64_t n1 = fz_chance(in, 6) ? 2 : 1;
            a->azp = fz_view_new(w, in, "azp", LK_I32, 1, &n1, FZ_IN);
            lk_tensor *t = &w->v[a->azp].t;
            if (t->ndim == 1 && t->shape[0] != 1) fz_fail_expected(w, "azp not one element");
            unsigned k = fz_u8(in) % 9;
            int32_t zv = k < 8 ? (int32_t)ZV[k] : (int32_t)fz_u32(in);
            if (fz_usable(w, a->azp) && t->dtype == LK_I32)
                for (int64_t i = 0; i < fz_numel(t); i++) ((int32_t *)t->data)[fz_off(t, i)] = zv;
            if (fz_chance(in, 6)) { /* an f32 azp (same element size) */
                t->dtype = LK_F32;
                fz_fail_expected(w, "azp not i32");
            }
        }
    } else {
        a->scale = rows_new(w, in, "scales", LK_F32, nd, shape, rows);
        if (with_azp) {
            a->azp = rows_new(w, in, "azp", LK_I32, nd, shape, rows);
            if (fz_chance(in, 6)) { /* an f32 azp (same element size) */
                w->v[a->azp].t.dtype = LK_F32;
                fz_fail_expected(w, "azp not i32");
            }
        }
    }
    if (fz_chance(in, 6)) {
        a->x = -1;
        fz_fail_expected(w, "NULL tensor pointer");
    }
    fz_run(w, call, a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_in in = {data, size, 0};
    fz_world w;
    fz_init(&w, &in, "fp8_act");
    q_attrs a = {0, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 1e-6f};
    a.op = (int)(fz_u8(&in) % NOPS);
    w.op = OPN[a.op];
    if (a.op == OP_I8_STATIC || a.op == OP_I8_DYNAMIC) {
        int8_case(&w, &in, &a);
        fz_free(&w);
        return 0;
    }
    lk_dtype ot = fz_u8(&in) & 1 ? LK_F8E5M2 : LK_F8E4M3;
    int i8_bad = 0; /* an i8 out where the op takes none (judged once the view exists) */
    if (a.op == OP_NORM_TOKEN && fz_chance(&in, 86)) ot = LK_I8; /* the int8 out (1 in 3) */
    else if (a.op != OP_MERGE && a.op != OP_NORM_TOKEN && fz_chance(&in, 8)) ot = LK_I8, i8_bad = 1;
    if (a.op == OP_MERGE) {
        int64_t T = fz_dim(&in, 5), H = fz_dim(&in, 4), D = fz_dim(&in, 40), sh[3] = {T, H, D}, lsh[2] = {T, H};
        a.out = fp8_out_new(&w, &in, "out", ot, 3, sh);
        if (fz_u8(&in) % 4) a.out_lse = fz_view_new(&w, &in, "out_lse", LK_F32, 2, lsh, FZ_OUT);
        a.x = fz_view_new(&w, &in, "a", fz_ftype(&in), 3, sh, FZ_IN);
        a.b = fz_view_new(&w, &in, "b", fz_ftype(&in), 3, sh, FZ_IN);
        a.lse_a = fz_view_new(&w, &in, "lse_a", LK_F32, 2, lsh, FZ_IN);
        a.lse_b = fz_view_new(&w, &in, "lse_b", LK_F32, 2, lsh, FZ_IN);
        fz_fill(&w, a.x, -4, 4), fz_fill(&w, a.b, -4, 4);
        fz_fill(&w, a.lse_a, -6, 6), fz_fill(&w, a.lse_b, -6, 6);
        fz_tol(&w, a.out, 0.0); /* exact, NaN sign free */
        if (a.out_lse >= 0) fz_tol(&w, a.out_lse, 0.0);
        if (fz_chance(&in, 8)) a.scale = -1, fz_fail_expected(&w, "fp8 out without output_scale");
        else a.scale = scale_new(&w, &in, "output_scale", FZ_IN, 1);
        if (fz_chance(&in, 6)) a.b = -1, fz_fail_expected(&w, "NULL tensor pointer");
        fz_run(&w, call, &a);
        fz_free(&w);
        return 0;
    }
    int nd = 1 + (int)(fz_u8(&in) % 3);
    int64_t shape[3] = {1, 1, 1};
    for (int d = 0; d < nd - 1; d++) shape[d] = fz_dim(&in, 5);
    shape[nd - 1] = fz_dim(&in, 70);
    int64_t D = shape[nd - 1], rows = 1;
    for (int d = 0; d < nd - 1; d++) rows *= shape[d];
    int norm = a.op >= OP_NORM, token = a.op == OP_TOKEN || a.op == OP_NORM_TOKEN;
    unsigned alias = fz_u8(&in) % 8;
    a.x = fz_view_new(&w, &in, "input", fz_ftype(&in), nd, shape, FZ_IN);
    int64_t os[3] = {shape[0], shape[1], shape[2]};
    if (fz_chance(&in, 8)) {
        os[fz_u8(&in) % (unsigned)nd] += 1;
        fz_fail_expected(&w, "out shape differs from input");
    }
    if (alias == 0 && fz_usable(&w, a.x)) { /* out written over the input: rejected */
        a.out = fz_view_alias(&w, a.x, "out", FZ_OUT);
        w.v[a.out].inplace_of = -1;
        fz_fail_expected(&w, "out aliases input (not fp8)");
    } else {
        a.out = fp8_out_new(&w, &in, "out", ot, nd, os);
        /* still i8 (the rare retype may have made it fp8, which the op takes) */
        if (i8_bad && w.v[a.out].t.dtype == LK_I8) fz_fail_expected(&w, "i8 out (only the per-token norm takes it)");
    }
    fz_fill(&w, a.x, -4, 4);
    /* exact, NaN sign free; an i8 out bitwise (the view's own dtype: the rare retype may
     * have made a requested i8 out fp8) */
    if (norm && w.v[a.out].t.dtype != LK_I8) fz_tol(&w, a.out, 0.0);
    if (a.op == OP_FUSED || (a.op == OP_NORM_TOKEN && fz_u8(&in) & 1)) {
        if (alias == 1 && fz_usable(&w, a.x)) {
            a.res = fz_view_alias(&w, a.x, "residual", FZ_OUT);
            w.v[a.res].inplace_of = -1;
        } else {
            a.res = fz_view_new(&w, &in, "residual", fz_ftype(&in), nd, shape, FZ_OUT);
            fz_fill(&w, a.res, -4, 4);
            fz_tol(&w, a.res, 0.0);
            w.v[a.res].atol = w.v[a.res].rtol = 0.0;
        }
    }
    if (norm && !fz_chance(&in, 6)) {
        int64_t ws = D;
        if (fz_chance(&in, 8)) ws = D + 1, fz_fail_expected(&w, "weight shape differs from D");
        a.w = fz_view_new(&w, &in, "weight", fz_ftype(&in), 1, &ws, FZ_IN);
        fz_fill(&w, a.w, -2, 2);
    }
    if (norm) {
        static const float EPS[6] = {1e-6f, 1e-5f, 0.0f, 0.5f, -1e-6f, NAN};
        unsigned e = fz_u8(&in) % 6;
        a.eps = EPS[e];
        if (e >= 4) fz_fail_expected(&w, "eps out of domain");
    }
    if (token) {
        int two = fz_u8(&in) & 1;
        int64_t ss[3] = {rows, 1, 1};
        int snd = 1;
        if (two) {
            snd = nd;
            for (int d = 0; d < nd - 1; d++) ss[d] = shape[d];
            ss[nd - 1] = 1;
        }
        if (fz_chance(&in, 8)) {
            ss[0] += 1;
            fz_fail_expected(&w, "scales shape");
        }
        a.scale = fz_view_new(&w, &in, "scales", LK_F32, snd, ss, FZ_OUT);
        if (fz_u8(&in) & 1) a.ub = scale_new(&w, &in, "scale_ub", FZ_IN, 1);
    } else
        a.scale = scale_new(&w, &in, "scale", a.op == OP_TENSOR ? FZ_OUT : FZ_IN, a.op != OP_TENSOR);
    if (fz_chance(&in, 6)) {
        a.x = -1;
        fz_fail_expected(&w, "NULL tensor pointer");
    }
    fz_run(&w, call, &a);
    fz_free(&w);
    return 0;
}
