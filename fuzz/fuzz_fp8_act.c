/*
 * Fuzz harness: the fp8 activation ops (see fuzz_common.h for the checks):
 * lk_static_scaled_fp8_quant, lk_dynamic_scaled_fp8_quant,
 * lk_dynamic_per_token_scaled_fp8_quant, lk_rms_norm_static_fp8_quant,
 * lk_fused_add_rms_norm_static_fp8_quant, lk_rms_norm_dynamic_per_token_quant,
 * lk_merge_attn_states_scaled, lk_per_token_group_fp8_quant (see group_case),
 * lk_static_group_scaled_fp8_quant (see grid_case), lk_rms_norm_per_block_quant (the
 * per-token norm's case with the group op's scales: see OP_NORM_BLOCK), and the int8 quantizers
 * lk_static_scaled_int8_quant / lk_dynamic_scaled_int8_quant (symmetric or with a zero
 * point: azp values from 0 to INT32_MIN / INT32_MAX, given or written; an azp of the wrong
 * dtype or size; a non-i8 out; input ranges that reach the int32 saturation or make rows
 * constant, tiny or off-centre). Input: op, rank, shape, dtypes (input, residual, weight,
 * e4m3 / e5m2 out; the i8 out of the per-token norm and of the per-token-group op, and an
 * i8 out the others reject), layouts, [rows] or [..., 1] scales, scale / scale_ub /
 * output_scale values (0, < 0, NaN, inf rejected), eps, weightless norms, out aliasing the input, a
 * residual aliasing the input, shape mismatches, NULL pointers. Every written view
 * (fp8 out, scales, residual, out_lse) is compared with the ref bitwise (the kernels'
 * reductions run in a fixed order, so every ISA gives the reference's bits), except the
 * sign of a NaN computed from NaN inputs (docs/numerics.md: not specified): the norms'
 * and the merge's out, and the residual, compare values exactly with any NaN equal to any
 * NaN.
 */
#include <float.h>

#include "fuzz_common.h"

enum {
    OP_STATIC, OP_TENSOR, OP_TOKEN, OP_NORM, OP_FUSED, OP_NORM_TOKEN, OP_MERGE, OP_I8_STATIC, OP_I8_DYNAMIC, OP_GROUP,
    OP_GRID, OP_NORM_BLOCK, NOPS
};
static const char *OPN[NOPS] = {"lk_static_scaled_fp8_quant", "lk_dynamic_scaled_fp8_quant",
                                "lk_dynamic_per_token_scaled_fp8_quant", "lk_rms_norm_static_fp8_quant",
                                "lk_fused_add_rms_norm_static_fp8_quant", "lk_rms_norm_dynamic_per_token_quant",
                                "lk_merge_attn_states_scaled", "lk_static_scaled_int8_quant",
                                "lk_dynamic_scaled_int8_quant", "lk_per_token_group_fp8_quant",
                                "lk_static_group_scaled_fp8_quant", "lk_rms_norm_per_block_quant"};

typedef struct {
    int op, out, x, w, res, scale, ub, lse_a, b, lse_b, out_lse, azp;
    float eps;
    int64_t group; /* OP_GROUP, OP_NORM_BLOCK: group_size */
    int ue8m0;     /* OP_GROUP: scale_ue8m0 */
} q_attrs;

/* OP_NORM_BLOCK: the status and message of its last call (fz_run calls the SIMD ISA, then
 * the ref, and checks that both statuses agree) */
static lk_status block_status;
static char block_err[512];

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
    case OP_GROUP: return lk_per_token_group_fp8_quant(out, x, sc, a->group, a->eps, a->ue8m0);
    case OP_GRID: return lk_static_group_scaled_fp8_quant(out, x, sc);
    case OP_NORM_BLOCK:
        block_status = lk_rms_norm_per_block_quant(out, x, fz_t(w, a->w), sc, a->eps, ub, fz_t(w, a->res), a->group);
        snprintf(block_err, sizeof block_err, "%s", lk_last_error());
        return block_status;
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

/* input [nd: shape] (a float dtype) and its fp8 out (the shape rarely off by one; out over
 * the input one time in alias_chance; an i8 out rejected when i8_bad) */
static void quant_io_new(fz_world *w, fz_in *in, q_attrs *a, int nd, const int64_t *shape, lk_dtype ot, int i8_bad,
                         int alias_chance) {
    a->x = fz_view_new(w, in, "input", fz_ftype(in), nd, shape, FZ_IN);
    int64_t os[3] = {shape[0], shape[1], shape[2]};
    if (fz_chance(in, 8)) {
        os[fz_u8(in) % (unsigned)nd] += 1;
        fz_fail_expected(w, "out shape differs from input");
    }
    if (fz_chance(in, alias_chance) && fz_usable(w, a->x)) { /* out written over the input: rejected */
        a->out = fz_view_alias(w, a->x, "out", FZ_OUT);
        w->v[a->out].inplace_of = -1;
        fz_fail_expected(w, "out aliases input (not fp8)");
    } else {
        a->out = fp8_out_new(w, in, "out", ot, nd, os);
        if (i8_bad && w->v[a->out].t.dtype == LK_I8) fz_fail_expected(w, "i8 out");
    }
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

/* the contract's scales shapes for input [..., D] (leading dims xs[0 .. nd - 2], rows of
 * them) and ng groups a row: [..., ng] (input's leading dims) or [rows, ng] */
static int gscales_shape_ok(int snd, const int64_t *ss, int nd, const int64_t *xs, int64_t rows, int64_t ng) {
    int lead = snd == nd && ss[nd - 1] == ng;
    for (int d = 0; lead && d < nd - 1; d++) lead = ss[d] == xs[d];
    return lead || (snd == 2 && ss[0] == rows && ss[1] == ng);
}

/* scales placed in the buffer of view p (out, input, or OP_NORM_BLOCK's weight, residual,
 * scale_ub): a contiguous f32 view of shape ss at a 4-byte aligned offset inside p's arena
 * from the input, else (too big) p's own tensor. Overlapping bytes of p (fz_overlaps
 * decides) must be rejected; one lying in p's padding only is valid, but the library's
 * disjointness proof may refuse it: not clean. Compared bitwise (not p's comparison). */
static int gscales_in(fz_world *w, fz_in *in, int p, int snd, const int64_t *ss) {
    int vi = fz_view_alias(w, p, "scales", FZ_OUT);
    fz_view *v = &w->v[vi];
    v->inplace_of = -1;
    v->cmp = FZ_CMP_BITS, v->atol = v->rtol = 0.0, v->nonfinite_any = 0, v->sat_any = 0.0;
    w->clean = 0;
    int64_t n = 1;
    for (int d = 0; d < snd; d++) n *= ss[d];
    const fz_arena *ar = &w->a[v->arena];
    if (n > 0 && (size_t)n * 4 <= ar->n) {
        size_t slots = (ar->n - (size_t)n * 4) / 4 + 1, off = 4 * (size_t)(fz_u32(in) % slots);
        lk_tensor *t = &v->t;
        t->dtype = LK_F32;
        t->ndim = snd;
        for (int d = 0; d < snd; d++) t->shape[d] = ss[d];
        fz_contiguous(t);
        t->data = ar->p + off;
    }
    return vi;
}

/* written per-(row, group) scales for input [..., D] (rank nd, leading dims shape[0 ..
 * nd - 2], rows of them) and ngs scales a row: [..., ngs], [rows, ngs], or rarely a wrong
 * shape (per-token [..., 1] / [rows], a group too many or too few, a row too many, flat
 * 1-D) or f16; any fz_view_new layout, vLLM's column-major scales (the transposed view of
 * an [ngs, rows + pad] buffer), or (place byte < rate) placed in the buffer of one of the
 * nhost views host[] (an entry < 0 or unusable: not placed). Returns the view. */
static int gscales_new(fz_world *w, fz_in *in, int nd, const int64_t *shape, int64_t rows, int64_t ngs,
                       const int *host, int nhost, unsigned rate) {
    /* scales' shape: [..., ngs], [rows, ngs], or rarely a wrong one */
    int64_t ss[4] = {0, 0, 0, 0};
    int snd;
    unsigned form = fz_u8(in) % 16;
    if (form < 8) {
        snd = nd;
        for (int d = 0; d < nd - 1; d++) ss[d] = shape[d];
        ss[nd - 1] = ngs;
    } else if (form < 14) {
        snd = 2, ss[0] = rows, ss[1] = ngs;
    } else { /* per-token [..., 1] / [rows], a group too many or too few, a row too many, flat 1-D */
        unsigned k = fz_u8(in) % 6;
        snd = k == 1 || k == 5 ? 1 : nd;
        for (int d = 0; d < nd - 1; d++) ss[d] = shape[d];
        ss[nd - 1] = ngs;
        if (k == 0) ss[nd - 1] = 1;
        if (k == 1) ss[0] = rows;
        if (k == 2) ss[nd - 1] = ngs + 1;
        if (k == 3 && ngs > 0) ss[nd - 1] = ngs - 1;
        if (k == 4) snd = 2, ss[0] = rows + 1, ss[1] = ngs;
        if (k == 5) ss[0] = rows * ngs;
    }
    if (!gscales_shape_ok(snd, ss, nd, shape, rows, ngs)) fz_fail_expected(w, "scales shape");
    lk_dtype sdt = fz_chance(in, 6) ? LK_F16 : LK_F32;
    unsigned place = fz_u8(in);
    int p = host[place % (unsigned)nhost], vi;
    if (place < rate && p >= 0 && fz_usable(w, p)) { /* in a host's buffer */
        vi = gscales_in(w, in, p, snd, ss);
        const lk_tensor *t = &w->v[vi].t; /* p's own tensor when the scales did not fit */
        if (t->ndim != snd || !gscales_shape_ok(t->ndim, t->shape, nd, shape, rows, ngs))
            fz_fail_expected(w, "scales (aliased) shape");
    } else if (snd == 2 && place >= 176) { /* column-major: [ng, rows + pad] transposed */
        int64_t pad = fz_u8(in) & 1 ? (4 - ss[0] % 4) % 4 : (int64_t)(fz_u8(in) % 5); /* TMA: rows % 4 */
        int64_t ps[2] = {ss[1], ss[0] + pad};
        int par = fz_view_new(w, in, "scales_buf", sdt, 2, ps, FZ_NONE);
        vi = fz_view_narrow(w, par, "scales", 1, 0, ss[0], FZ_OUT);
        lk_tensor *t = &w->v[vi].t;
        int64_t sh = t->shape[0], st = t->stride[0];
        t->shape[0] = t->shape[1], t->stride[0] = t->stride[1];
        t->shape[1] = sh, t->stride[1] = st;
    } else
        vi = fz_view_new(w, in, "scales", sdt, snd, ss, FZ_OUT);
    if (w->v[vi].t.dtype != LK_F32) fz_fail_expected(w, "scales not f32");
    return vi;
}

/* the contract, independently of the kernels (which share their scale rule): after an
 * accepted call, every scales[r, g] = max(absmax(group), eps) / fp8_max (absmax ignoring
 * NaN; ue8m0: the smallest power of two >= max(that, 1e-10)) and every out[r, i] =
 * fp8(input[r, i] / scales[r, g]), bitwise. An i8 out (vLLM's per_token_group_quant_int8):
 * fp8_max 127 and out[r, i] = trunc(clamp(input[r, i] / scales[r, g], -128, 127)) (the f32
 * division, then toward zero), NaN -> 0 */
static void group_check(fz_world *w, const q_attrs *a) {
    const lk_tensor *x = &w->v[a->x].t, *out = &w->v[a->out].t, *sc = &w->v[a->scale].t;
    int64_t G = a->group, n = fz_numel(x);
    int i8 = out->dtype == LK_I8;
    float fmax = i8 ? 127.0f : out->dtype == LK_F8E5M2 ? 57344.0f : 448.0f;
    for (int64_t i0 = 0; i0 < n; i0 += G) { /* group (r, g) = element i0 / G of scales */
        float m = 0.0f;
        for (int64_t i = i0; i < i0 + G; i++) {
            float v = fabsf(lk_load_f(x->data, x->dtype, fz_off(x, i)));
            if (v > m) m = v;
        }
        float s = (m > a->eps ? m : a->eps) / fmax;
        if (a->ue8m0) {
            if (s < 1e-10f) s = 1e-10f;
            uint32_t b;
            memcpy(&b, &s, 4);
            if (s < INFINITY && (b & 0x7fffffu)) b = (b | 0x7fffffu) + 1u; /* next binade */
            memcpy(&s, &b, 4);
        }
        float got = ((const float *)sc->data)[fz_off(sc, i0 / G)];
        if (memcmp(&got, &s, 4))
            fz_report(w, "scales[%lld] = %.9g, the contract gives %.9g (group absmax %.9g, eps %g, ue8m0 %d)",
                      (long long)(i0 / G), (double)got, (double)s, (double)m, (double)a->eps, a->ue8m0);
        for (int64_t i = i0; i < i0 + G; i++) {
            uint8_t q, o = ((const uint8_t *)out->data)[fz_off(out, i)];
            float xv = lk_load_f(x->data, x->dtype, fz_off(x, i));
            if (i8) {
                volatile float t = xv / s; /* one f32 division */
                float c = t != t ? 0.0f : t > 127.0f ? 127.0f : t < -128.0f ? -128.0f : truncf(t);
                q = (uint8_t)(int8_t)c;
                if (q != o)
                    fz_report(w, "out[%lld] = %d, the contract gives trunc(%.9g / %.9g) = %d (i8)", (long long)i,
                              (int)(int8_t)o, (double)xv, (double)s, (int)(int8_t)q);
                continue;
            }
            lk_store_f(&q, out->dtype, 0, xv / s);
            if (q != o)
                fz_report(w, "out[%lld] = 0x%02x, the contract gives fp8(%.9g / %.9g) = 0x%02x", (long long)i, o,
                          (double)xv, (double)s, q);
        }
    }
}

/* lk_per_token_group_fp8_quant: input [..., D] (rank 1..3), D = ng * G; group_size G
 * (rarely 0, < 0, a non-divisor of D, D itself, INT64_MAX); eps (mostly vLLM's 1e-10;
 * rarely 0, -0, < 0, NaN, +-inf, subnormal, FLT_MIN, and fp8_max * FLT_MIN, the smallest
 * accepted, exactly and one ulp below, for out's dtype: 448, 57344, or 127 for i8); ue8m0
 * 0 / 1; scales [..., ng] or [rows, ng] (any fz_view_new layout; or vLLM's column-major
 * scales: the transposed view of an [ng, rows + pad] buffer; rarely f16, a wrong shape, or
 * placed in the buffer of out or input); out e4m3 / e5m2, i8 one time in 8 (vLLM's
 * per_token_group_quant_int8: valid), rarely the input itself or of another shape.
 * out and scales are compared with the ref bitwise, then with the contract (group_check). */
static void group_case(fz_world *w, fz_in *in, q_attrs *a) {
    lk_dtype ot = fz_u8(in) & 1 ? LK_F8E5M2 : LK_F8E4M3;
    if (fz_chance(in, 8)) ot = LK_I8; /* the int8 out (valid) */
    int nd = 1 + (int)(fz_u8(in) % 3);
    int64_t shape[3] = {1, 1, 1};
    for (int d = 0; d < nd - 1; d++) shape[d] = fz_dim(in, 5);
    static const int64_t GS[12] = {1, 2, 3, 4, 5, 7, 8, 16, 17, 32, 64, 128};
    int64_t G = GS[fz_u8(in) % 12], ng = fz_dim(in, G >= 64 ? 3 : 8), D = ng * G, rows = 1;
    shape[nd - 1] = D;
    for (int d = 0; d < nd - 1; d++) rows *= shape[d];
    /* the group_size passed: rarely not G (some of these still divide D: valid) */
    int64_t gs = G;
    if (fz_chance(in, 20)) {
        const int64_t BG[8] = {0, -1, INT64_MIN, G + 1, 2 * D + 1, D, INT64_MAX, G * 2};
        gs = BG[fz_u8(in) % 8];
    }
    /* scales per row: D / group_size when group_size is valid; for a non-divisor either
     * ng or D / group_size rounded down (only the group_size rule rejects it then) */
    int64_t ngs = ng;
    if (gs < 1) fz_fail_expected(w, "group_size < 1");
    else if (D % gs) {
        fz_fail_expected(w, "group_size does not divide D");
        if (fz_u8(in) & 1) ngs = D / gs;
    } else
        ngs = D / gs;
    a->group = gs;
    a->ue8m0 = (int)(fz_u8(in) & 1);

    quant_io_new(w, in, a, nd, shape, ot, 0, 12);

    /* values: ordinary (also past the input's end), off-centre, below eps, near f32's max,
     * f16's range */
    static const double LO[6] = {-4, 1, -1e-12, -3e38, -1e-30, -7e4}, HI[6] = {4, 9, 1e-12, 3e38, 1e-30, 7e4};
    unsigned rg = fz_u8(in) % 8;
    rg = rg < 6 ? rg : 0;
    fz_fill(w, a->x, LO[rg], HI[rg]);
    unsigned pat = fz_u8(in);
    if (pat < 16 && fz_usable(w, a->x)) { /* constant rows, or every third group zero */
        pat &= 1;
        lk_tensor *t = &w->v[a->x].t;
        for (int64_t i = 0, n = fz_numel(t); i < n; i++)
            if (pat == 0) lk_store_f(t->data, t->dtype, fz_off(t, i), 2.5f);
            else if ((i % D) / G % 3 == 0) lk_store_f(t->data, t->dtype, fz_off(t, i), 0.0f);
    }

    /* eps, judged against out's fp8_max: 448 * FLT_MIN = 0x1.cp-118 (e4m3),
     * 57344 * FLT_MIN = 0x1.cp-111 (e5m2), 127 * FLT_MIN = 0x1.fcp-120 (i8) */
    lk_dtype odt = w->v[a->out].t.dtype;
    float lo = odt == LK_F8E5M2 ? 0x1.cp-111f : odt == LK_I8 ? 0x1.fcp-120f : 0x1.cp-118f;
    unsigned eb = fz_u8(in);
    if (eb < 192) a->eps = 1e-10f;
    else {
        const float EPS[19] = {1e-6f, 1e-4f, 0.5f, 3.0f, 1e30f, FLT_MAX, lo, 0x1.cp-118f, 0x1.cp-111f,
                               nextafterf(lo, 0.0f), 0.0f, -0.0f, -1e-6f, NAN, INFINITY, -INFINITY,
                               FLT_MIN, FLT_TRUE_MIN, 1e-37f};
        a->eps = EPS[eb % 19];
    }
    if (!(a->eps >= lo && a->eps < INFINITY)) fz_fail_expected(w, "eps not finite >= fp8_max * FLT_MIN");

    a->scale = gscales_new(w, in, nd, shape, rows, ngs, (const int[]){a->x, a->out}, 2, 12);

    if (fz_chance(in, 6)) {
        unsigned k = fz_u8(in) % 3;
        if (k == 0) a->x = -1;
        else if (k == 1) a->out = -1;
        else a->scale = -1;
        fz_fail_expected(w, "NULL tensor pointer");
    }
    fz_run(w, call, a);
    /* accepted (the ISA fz_run used; the call repeated: same outputs): the contract's values */
    if (!w->must_fail && fz_usable(w, a->x) && call(w, a) == LK_OK) group_check(w, a);
}

/* scale of OP_GRID placed in the buffer of view p (out or input): a contiguous f32 [sm, sn]
 * at a 4-byte aligned offset inside p's arena from the input; -1 when it does not fit.
 * Overlapping bytes of out (fz_overlaps decides) must be rejected; bytes of out's padding
 * only are valid but the library's disjointness proof may refuse them: not clean. Bytes of
 * the input are fine (the scale is read only; the op checks it against out only). */
static int grid_scale_in(fz_world *w, fz_in *in, int p, int64_t sm, int64_t sn) {
    const fz_arena *ar = &w->a[w->v[p].arena];
    int64_t n = sm * sn;
    if (n <= 0 || (size_t)n * 4 > ar->n) return -1;
    int vi = fz_view_alias(w, p, "scale", FZ_IN);
    fz_view *v = &w->v[vi];
    v->inplace_of = -1;
    if (w->v[p].role == FZ_OUT) w->clean = 0;
    size_t slots = (ar->n - (size_t)n * 4) / 4 + 1, off = 4 * (size_t)(fz_u32(in) % slots);
    lk_tensor *t = &v->t;
    t->dtype = LK_F32;
    t->ndim = 2;
    t->shape[0] = sm, t->shape[1] = sn;
    fz_contiguous(t);
    t->data = ar->p + off;
    return vi;
}

/* the contract, independently of the kernels: after an accepted call every out[r, c] =
 * fp8(input[r, c] / scale[r / gm, c / gn]) (one f32 division, the library's converter),
 * bitwise, with gm = M / sm, gn = N / sn from the scale's shape */
static void grid_check(fz_world *w, const q_attrs *a) {
    const lk_tensor *x = &w->v[a->x].t, *out = &w->v[a->out].t, *sc = &w->v[a->scale].t;
    int64_t N = x->shape[x->ndim - 1], n = fz_numel(x), M = N ? n / N : 0;
    int64_t sm = sc->shape[0], sn = sc->shape[1], gm = M / sm, gn = N / sn;
    for (int64_t i = 0; i < n; i++) {
        int64_t r = i / N, c = i % N, k = r / gm * sn + c / gn;
        float xv = lk_load_f(x->data, x->dtype, fz_off(x, i)), s = ((const float *)sc->data)[fz_off(sc, k)];
        uint8_t q, o = ((const uint8_t *)out->data)[fz_off(out, i)];
        lk_store_f(&q, out->dtype, 0, xv / s);
        if (q != o)
            fz_report(w, "out[%lld] (row %lld, col %lld) = 0x%02x, the contract gives fp8(%.9g / scale[%lld, %lld] = "
                      "%.9g) = 0x%02x (groups %lld x %lld)", (long long)i, (long long)r, (long long)c, o, (double)xv,
                      (long long)(r / gm), (long long)(c / gn), (double)s, q, (long long)gm, (long long)gn);
    }
}

/* lk_static_group_scaled_fp8_quant: input [..., N] (rank 1..3, M rows), out e4m3 / e5m2
 * (rarely i8, another shape, or the input itself); scale [sm, sn] with gm = M / sm rows by
 * gn = N / sn columns a group: per tensor, whole rows (sn = 1), per channel (gn = 1, the
 * kernels' vector-of-scales path when the columns are contiguous), small groups (2..5),
 * groups around the vector widths (6..64), any divisor; sm any divisor of M (any sm >= 1
 * when M == 0), rarely 0 or a non-divisor, and sn likewise; rarely rank 0 / 1 / 3, or f16.
 * Layouts: fz_view_new's, a column stride (every 2nd / 3rd column of a wider buffer),
 * column-major (vLLM's transposed [sn, sm + pad] buffer), or placed in the buffer of the
 * input (read only: valid) or of out (rejected where it overlaps). Values positive finite
 * in ranges from subnormal to FLT_MAX; rarely one 0, -0, < 0, NaN, +-inf at a random
 * position (every value is checked: rejected). out is compared with the ref bitwise, then
 * with the contract (grid_check). */
static void grid_case(fz_world *w, fz_in *in, q_attrs *a) {
    lk_dtype ot = fz_u8(in) & 1 ? LK_F8E5M2 : LK_F8E4M3;
    int i8_bad = fz_chance(in, 8);
    if (i8_bad) ot = LK_I8;
    int nd = 1 + (int)(fz_u8(in) % 3);
    int64_t shape[3] = {1, 1, 1}, M = 1, N, sn;
    for (int d = 0; d < nd - 1; d++) shape[d] = fz_dim(in, 6), M *= shape[d];
    /* the column groups */
    static const int64_t GN[16] = {6, 7, 8, 9, 12, 15, 16, 17, 24, 31, 32, 33, 40, 48, 63, 64};
    unsigned gk = fz_u8(in) % 8;
    if (gk < 2) { /* per channel: gn = 1 */
        N = fz_dim(in, 70);
        sn = N ? N : 1 + (int64_t)(fz_u8(in) % 3);
    } else if (gk == 2) { /* whole rows (per token / per tensor) */
        N = fz_dim(in, 70), sn = 1;
    } else if (gk == 3) { /* small groups */
        int64_t gn = 2 + (int64_t)(fz_u8(in) % 4);
        sn = fz_dim(in, 16), N = gn * sn;
        if (!sn) sn = 1 + (int64_t)(fz_u8(in) % 3);
    } else if (gk < 6) { /* around the vector widths */
        int64_t gn = GN[fz_u8(in) % 16];
        sn = fz_dim(in, 6), N = gn * sn;
        if (!sn) sn = 1 + (int64_t)(fz_u8(in) % 3);
    } else { /* any divisor of N */
        N = fz_dim(in, 70), sn = 1 + (int64_t)(fz_u8(in) % 4);
        if (N) {
            int64_t dv[70], k = 0;
            for (int64_t d = 1; d <= N; d++)
                if (N % d == 0) dv[k++] = d;
            sn = dv[fz_u8(in) % (unsigned)k];
        }
    }
    shape[nd - 1] = N;
    int64_t sm = 1 + (int64_t)(fz_u8(in) % 4); /* M == 0: any sm >= 1 divides it */
    if (M) {
        int64_t dv[36], k = 0;
        for (int64_t d = 1; d <= M; d++)
            if (M % d == 0) dv[k++] = d;
        sm = dv[fz_u8(in) % (unsigned)k];
    }
    unsigned bs = fz_u8(in); /* rarely a grid that does not split the input */
    if (bs < 4) sm = 0;
    else if (bs < 10) sm = fz_non_divisor(M);
    else if (bs < 14) sn = 0;
    else if (bs < 20) sn = fz_non_divisor(N);
    if (sm < 1 || sn < 1 || M % sm || N % sn) fz_fail_expected(w, "scale does not split the input into groups");

    quant_io_new(w, in, a, nd, shape, ot, i8_bad, 10);
    /* input values: ordinary, off-centre, tiny (subnormal f32), near f32's max, f16's range */
    static const double LO[6] = {-4, 1, -1e-39, -3e38, -1e-30, -7e4}, HI[6] = {4, 9, 1e-39, 3e38, 1e-30, 7e4};
    unsigned rg = fz_u8(in) % 8;
    fz_fill(w, a->x, LO[rg < 6 ? rg : 0], HI[rg < 6 ? rg : 0]);

    /* the scale view */
    lk_dtype sdt = fz_chance(in, 6) ? LK_F16 : LK_F32;
    unsigned place = fz_u8(in);
    int64_t ss[2] = {sm, sn};
    a->scale = -1;
    if (place < 6) { /* rank 0, 1 ([sm * sn]) or 3 ([sm, sn, 1] / [1, sm, sn]) */
        static const int RK[4] = {0, 1, 3, 3};
        unsigned k = fz_u8(in) % 4;
        int64_t s3[3] = {k == 3 ? 1 : sm * (k == 1 ? sn : 1), k == 3 ? sm : sn, k == 3 ? sn : 1};
        if (k == 2) s3[0] = sm;
        a->scale = fz_view_new(w, in, "scale", sdt, RK[k], s3, FZ_IN);
        fz_fail_expected(w, "scale rank not 2");
    } else if (place < 30 && sdt == LK_F32) { /* in the buffer of out (6..13) or of the input */
        int p = place < 14 ? a->out : a->x;
        if (fz_usable(w, p)) a->scale = grid_scale_in(w, in, p, sm, sn);
    } else if (place < 70 && sm > 0 && sn > 0) { /* every cs-th column of [sm, sn * cs] */
        int64_t cs = 2 + (int64_t)(fz_u8(in) % 2), ps[2] = {sm, sn * cs}, c0 = (int64_t)(fz_u8(in) % (unsigned)cs);
        int cl = w->clean;
        int par = fz_view_new(w, in, "scale_buf", sdt, 2, ps, FZ_NONE);
        w->clean = cl; /* one slice, checked against out only (another buffer) */
        a->scale = fz_view_narrow(w, par, "scale", 1, c0, sn, FZ_IN);
        w->v[a->scale].t.stride[1] *= cs;
    } else if (place < 100 && sm > 0 && sn > 0) { /* column-major: [sn, sm + pad] transposed */
        int64_t pad = (int64_t)(fz_u8(in) % 5), ps[2] = {sn, sm + pad};
        int cl = w->clean;
        int par = fz_view_new(w, in, "scale_buf", sdt, 2, ps, FZ_NONE);
        w->clean = cl;
        a->scale = fz_view_narrow(w, par, "scale", 1, 0, sm, FZ_IN);
        lk_tensor *t = &w->v[a->scale].t;
        int64_t sh0 = t->shape[0], st0 = t->stride[0];
        t->shape[0] = t->shape[1], t->stride[0] = t->stride[1];
        t->shape[1] = sh0, t->stride[1] = st0;
    }
    if (a->scale < 0) a->scale = fz_view_new(w, in, "scale", sdt, 2, ss, FZ_IN);
    fz_view *sv = &w->v[a->scale];
    if (sv->t.dtype != LK_F32) fz_fail_expected(w, "scale not f32");
    /* values: positive finite in a range (rarely f32's extremes at one position), rarely
     * one invalid value at a random position; then judged from what was stored (zero
     * strides store several elements at one address: the last store wins) */
    if (fz_usable(w, a->scale) && (sv->t.dtype == LK_F32 || sv->t.dtype == LK_F16)) {
        static const double SLO[6] = {0.01, 1.0, 1e-3, 100, 1e-30, 1e25}, SHI[6] = {2, 1.0, 0.1, 1e4, 1e-20, 1e30};
        unsigned sr = fz_u8(in) % 8;
        sr = sr < 6 ? sr : 0;
        lk_tensor *t = &sv->t;
        int64_t n = fz_numel(t);
        for (int64_t i = 0; i < n; i++)
            lk_store_f(t->data, t->dtype, fz_off(t, i), (float)(SLO[sr] + (SHI[sr] - SLO[sr]) * fz_unif(&w->rng)));
        unsigned bv = fz_u8(in);
        if (bv < 40 && n > 0) {
            static const float BV[12] = {0.0f, -0.0f, -1.0f, -FLT_TRUE_MIN, NAN, -NAN, INFINITY, -INFINITY,
                                         FLT_TRUE_MIN, FLT_MIN, FLT_MAX, 0x1p-140f};
            lk_store_f(t->data, t->dtype, fz_off(t, fz_range(in, 0, n - 1)), BV[bv % 12]);
        }
        for (int64_t i = 0; i < n; i++) {
            float v = lk_load_f(t->data, t->dtype, fz_off(t, i));
            if (!(v > 0.0f && v <= FLT_MAX)) {
                fz_fail_expected(w, "scale value not finite > 0");
                break;
            }
        }
    }

    if (fz_chance(in, 6)) {
        unsigned k = fz_u8(in) % 3;
        if (k == 0) a->x = -1;
        else if (k == 1) a->out = -1;
        else a->scale = -1;
        fz_fail_expected(w, "NULL tensor pointer");
    }
    fz_run(w, call, a);
    /* accepted (the ISA fz_run used; the call repeated: same outputs): the contract's values */
    if (!w->must_fail && fz_usable(w, a->x) && call(w, a) == LK_OK) grid_check(w, a);
}

/* ---------------------------------------------------------------- OP_NORM_BLOCK
 * lk_rms_norm_per_block_quant goes through the per-token norm's case (LLVMFuzzerTestOneInput:
 * input, out e4m3 / e5m2 / i8 (1 in 3), residual or NULL, weight or NULL, out or residual
 * aliasing the input, NULL pointers) with: D and group_size from block_dims; values from
 * block_fill; eps from a wider list (-0, subnormal, FLT_MAX valid; < 0, NaN, +-inf not);
 * scale_ub from block_ub_new; the group op's scales (gscales_new: [..., ng], [rows, ng],
 * column-major, wrong shapes, f16), placed rarely in the buffer of out, input, weight,
 * residual or scale_ub. After fz_run: an accepted call's outputs against the contract
 * (block_check) and, with group_size == D, against lk_rms_norm_dynamic_per_token_quant
 * (block_vs_token); an input whose only fault is its group_size must fail with the
 * contract's status (LK_ERR_VALUE below 1, LK_ERR_SHAPE for a non-divisor) naming it. */

/* the row length D (returned) and group_size (a->group): G from the group op's list (1,
 * small, 16, 17, 32, 64, 128) with D = ng * G (ng 0 .. 8, or 0 .. 3 for G >= 64); D in
 * 0 .. 70 with any divisor of it; or G = D (whole rows, the per-token scales; 128 when D is
 * 0); rarely a bad group_size (0, -1, -G, INT64_MIN, INT64_MAX, a non-divisor, 2 D + 1; or
 * D and 2 G, which may divide D: valid). *ngs: the scales a row to build (D / group_size;
 * for a group_size < 1, D / G; for a non-divisor D / G or D / group_size rounded down);
 * *gfail: the status the group_size rule gives (LK_OK: valid; judged from the value). */
static int64_t block_dims(fz_in *in, q_attrs *a, int64_t *ngs, lk_status *gfail) {
    int64_t G, D = fz_group_row(in, &G);
    a->group = fz_group_size(in, D, G, ngs, gfail);
    return D;
}

/* input values: ordinary, off-centre, tiny (the sum of squares underflows: eps decides),
 * near f32's max (it overflows: inv 0), f16's range, small; then rarely constant rows,
 * every third block of G zero (its scale the minimum), or block g scaled by 2^(12 (g % 4)
 * - 18) (scale_ub bounding some blocks only) */
static void block_fill(fz_world *w, fz_in *in, int vi, int64_t D, int64_t G) {
    static const double LO[6] = {-4, 1, -1e-30, -3e38, -6e4, -1e-3}, HI[6] = {4, 9, 1e-30, 3e38, 6e4, 1e-3};
    unsigned rg = fz_u8(in) % 8;
    rg = rg < 6 ? rg : 0;
    fz_fill(w, vi, LO[rg], HI[rg]);
    unsigned pat = fz_u8(in);
    if (pat >= 48 || !fz_usable(w, vi) || G < 1 || D < 1) return;
    lk_tensor *t = &w->v[vi].t;
    for (int64_t i = 0, n = fz_numel(t); i < n; i++) {
        int64_t g = (i % D) / G;
        float x = lk_load_f(t->data, t->dtype, fz_off(t, i));
        if (pat < 16) x = 2.5f;
        else if (pat < 32) x = g % 3 ? x : 0.0f;
        else x = ldexpf(x, (int)(g % 4) * 12 - 18);
        lk_store_f(t->data, t->dtype, fz_off(t, i), x);
    }
}

/* scale_ub: [1] f32 (rarely [], [2], [1, 1] or f16; or a [1] / [] f32 at a 4-byte aligned
 * offset in the buffer of one of host[]: overlapping an output it must be rejected, in an
 * output's padding only it is valid but not clean; overlapping an input valid); every
 * element one value: finite > 0 (FLT_TRUE_MIN and FLT_MAX included), rarely 0, -0, < 0,
 * NaN, +-inf; judged from what was stored */
static int block_ub_new(fz_world *w, fz_in *in, const int *host, int nhost) {
    static const float UV[16] = {1.0f, 0.0125f, 3.7f, 1e-30f, 1e30f, 0.5f, 0.05f, 0.2f,
                                 FLT_TRUE_MIN, FLT_MAX, 0.0f, -0.0f, -1.0f, NAN, INFINITY, -INFINITY};
    unsigned place = fz_u8(in);
    int vi = -1, p = host[place % (unsigned)nhost];
    if (place < 24 && p >= 0 && fz_usable(w, p) && w->a[w->v[p].arena].n >= 4) {
        vi = fz_view_alias(w, p, "scale_ub", FZ_IN);
        fz_view *v = &w->v[vi];
        v->inplace_of = -1;
        v->cmp = FZ_CMP_BITS, v->atol = v->rtol = 0.0, v->nonfinite_any = 0, v->sat_any = 0.0;
        if (w->v[p].role == FZ_OUT) w->clean = 0;
        const fz_arena *ar = &w->a[v->arena];
        lk_tensor *t = &v->t;
        t->dtype = LK_F32;
        t->ndim = (int)(fz_u8(in) & 1);
        t->shape[0] = 1, t->stride[0] = 1;
        t->data = ar->p + 4 * (size_t)(fz_u32(in) % ((ar->n - 4) / 4 + 1));
    } else {
        unsigned k = fz_u8(in) % 32;
        int64_t sh[2] = {k == 2 ? 2 : 1, 1};
        vi = fz_view_new(w, in, "scale_ub", fz_chance(in, 6) ? LK_F16 : LK_F32, k == 0 ? 0 : k == 1 ? 2 : 1, sh,
                         FZ_IN);
    }
    lk_tensor *t = &w->v[vi].t;
    if (t->dtype != LK_F32) fz_fail_expected(w, "scale_ub not f32");
    if (t->ndim > 1 || (t->ndim == 1 && t->shape[0] != 1)) fz_fail_expected(w, "scale_ub not [] or [1]");
    float v = UV[fz_u8(in) % 16];
    if (fz_usable(w, vi) && t->dtype == LK_F32) {
        for (int64_t i = 0, n = fz_numel(t); i < n; i++) ((float *)t->data)[fz_off(t, i)] = v;
        float got = ((const float *)t->data)[fz_off(t, 0)];
        if (!(got > 0.0f && got <= FLT_MAX)) fz_fail_expected(w, "scale_ub not finite > 0");
    }
    return vi;
}

/* an fp8 / i8 code pair equal: the same bits, or (fp8) NaN of either sign */
static int block_code_eq(lk_dtype dt, uint8_t a, uint8_t b) {
    return a == b || (dt != LK_I8 && isnan(lk_load_f(&a, dt, 0)) && isnan(lk_load_f(&b, dt, 0)));
}

/* the contract, independently of the kernels, on an accepted call's outputs (as fz_run left
 * them: the SIMD ISA's). res0: the residual before the call (NULL without one); the
 * residual must now hold round(input + residual) (NaN of either sign equal), and v (the
 * norm's input) is that, else the input. Per row r:
 *   ss = sum v^2 in the contract's order (element i in lane i % 16, each lane an fmaf chain,
 *        then halved 8, 4, 2, 1); inv = 1 / sqrtf(ss / D + eps); y = (v * inv) * weight
 *   scales[r, g] = max(min(absmax(y[block g]), scale_ub) / qmax, min_scale) (absmax ignoring
 *        NaN; qmax 448 / 57344, min_scale 1 / (qmax * 512); i8: 127, FLT_EPSILON)
 *   out[r, i] = fp8(y / scales[r, g]); i8: y * (1 / scales[r, g]) rounded to nearest even,
 *        saturated to [-128, 127], NaN 0
 * scales bitwise, out by block_code_eq */
static void block_check(fz_world *w, const q_attrs *a, const float *res0) {
    const lk_tensor *x = &w->v[a->x].t, *out = &w->v[a->out].t, *sc = &w->v[a->scale].t;
    const lk_tensor *res = a->res >= 0 ? &w->v[a->res].t : NULL, *wt = a->w >= 0 ? &w->v[a->w].t : NULL;
    int64_t D = x->shape[x->ndim - 1], G = a->group, n = fz_numel(x);
    if (D == 0 || n == 0) return;
    float ub = INFINITY;
    if (a->ub >= 0) ub = ((const float *)w->v[a->ub].t.data)[fz_off(&w->v[a->ub].t, 0)];
    lk_dtype odt = out->dtype;
    float qmax = odt == LK_I8 ? 127.0f : odt == LK_F8E5M2 ? 57344.0f : 448.0f;
    float lo = odt == LK_I8 ? FLT_EPSILON : 1.0f / (qmax * 512.0f);
    float *v = malloc((size_t)D * sizeof *v), *y = malloc((size_t)D * sizeof *y);
    if (!v || !y) abort();
    for (int64_t r = 0; r < n / D; r++) {
        float ss[16] = {0};
        for (int64_t i = 0; i < D; i++) {
            int64_t k = r * D + i;
            v[i] = lk_load_f(x->data, x->dtype, fz_off(x, k));
            if (res) {
                float want = lk_round_to(res->dtype, v[i] + res0[k]);
                v[i] = lk_load_f(res->data, res->dtype, fz_off(res, k));
                if (memcmp(&v[i], &want, 4) && !(isnan(v[i]) && isnan(want)))
                    fz_report(w, "residual[%lld] = %.9g, the contract gives round(%.9g + %.9g) = %.9g", (long long)k,
                              (double)v[i], (double)lk_load_f(x->data, x->dtype, fz_off(x, k)), (double)res0[k],
                              (double)want);
            }
            ss[i % 16] = fmaf(v[i], v[i], ss[i % 16]);
        }
        for (int h = 8; h >= 1; h /= 2)
            for (int k = 0; k < h; k++) ss[k] = ss[k] + ss[k + h];
        float inv = 1.0f / sqrtf(ss[0] / (float)D + a->eps);
        for (int64_t i = 0; i < D; i++) y[i] = v[i] * inv * (wt ? lk_load_f(wt->data, wt->dtype, fz_off(wt, i)) : 1.0f);
        for (int64_t g = 0; g < D / G; g++) {
            float m = 0.0f;
            for (int64_t i = g * G; i < g * G + G; i++)
                if (fabsf(y[i]) > m) m = fabsf(y[i]);
            float s = (m < ub ? m : ub) / qmax;
            if (!(s > lo)) s = lo;
            float got = ((const float *)sc->data)[fz_off(sc, r * (D / G) + g)];
            if (memcmp(&got, &s, 4))
                fz_report(w, "scales[%lld, %lld] = %.9g, the contract gives %.9g (block absmax %.9g, scale_ub %g, "
                          "inv rms %.9g)", (long long)r, (long long)g, (double)got, (double)s, (double)m, (double)ub,
                          (double)inv);
            for (int64_t i = g * G; i < g * G + G; i++) {
                uint8_t q, o = ((const uint8_t *)out->data)[fz_off(out, r * D + i)];
                if (odt == LK_I8) {
                    float t = y[i] * (1.0f / s);
                    q = (uint8_t)(int8_t)(t != t ? 0 : t >= 127.0f ? 127 : t <= -128.0f ? -128 : (int)rintf(t));
                } else
                    lk_store_f(&q, odt, 0, y[i] / s);
                if (!block_code_eq(odt, q, o))
                    fz_report(w, "out[%lld, %lld] = 0x%02x, the contract gives 0x%02x (y %.9g, scale %.9g)",
                              (long long)r, (long long)i, o, q, (double)y[i], (double)s);
            }
        }
    }
    free(v);
    free(y);
}

/* group_size == D (one block a row): lk_rms_norm_dynamic_per_token_quant on the norm's
 * input (the residual as the call left it, else the input; no residual), the same weight,
 * eps and scale_ub, into fresh contiguous out / [rows] scales, must give the same bits
 * (fp8 NaN of either sign equal) */
static void block_vs_token(fz_world *w, const q_attrs *a) {
    const lk_tensor *out = &w->v[a->out].t, *sc = &w->v[a->scale].t;
    lk_tensor v = w->v[a->res >= 0 ? a->res : a->x].t;
    int64_t n = fz_numel(out), rows = a->group ? n / a->group : 0;
    if (n == 0) return;
    uint8_t *o2 = malloc((size_t)n);
    float *s2 = malloc((size_t)rows * sizeof *s2);
    if (!o2 || !s2) abort();
    lk_tensor to = lk_tensor_make(o2, out->dtype, v.ndim, v.shape), ts = lk_tensor_make(s2, LK_F32, 1, &rows);
    lk_status st = lk_rms_norm_dynamic_per_token_quant(&to, &v, fz_t(w, a->w), &ts, a->eps, fz_t(w, a->ub), NULL);
    if (st != LK_OK)
        fz_report(w, "lk_rms_norm_dynamic_per_token_quant on the same rows: %s (%s)", lk_status_str(st),
                  lk_last_error());
    for (int64_t r = 0; r < rows; r++) {
        float got = ((const float *)sc->data)[fz_off(sc, r)];
        if (memcmp(&got, &s2[r], 4))
            fz_report(w, "group_size == D: scales[%lld] = %.9g, the per-token op gives %.9g", (long long)r,
                      (double)got, (double)s2[r]);
    }
    for (int64_t i = 0; i < n; i++) {
        uint8_t o = ((const uint8_t *)out->data)[fz_off(out, i)];
        if (!block_code_eq(out->dtype, o, o2[i]))
            fz_report(w, "group_size == D: out[%lld] = 0x%02x, the per-token op gives 0x%02x", (long long)i, o, o2[i]);
    }
    free(o2);
    free(s2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_in in = {data, size, 0};
    fz_world w;
    fz_init(&w, &in, "fp8_act");
    q_attrs a = {0, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 1e-6f, 0, 0};
    a.op = (int)(fz_u8(&in) % NOPS);
    w.op = OPN[a.op];
    if (a.op == OP_I8_STATIC || a.op == OP_I8_DYNAMIC || a.op == OP_GROUP || a.op == OP_GRID) {
        if (a.op == OP_GROUP) group_case(&w, &in, &a);
        else if (a.op == OP_GRID) grid_case(&w, &in, &a);
        else int8_case(&w, &in, &a);
        fz_free(&w);
        return 0;
    }
    lk_dtype ot = fz_u8(&in) & 1 ? LK_F8E5M2 : LK_F8E4M3;
    int i8_bad = 0; /* an i8 out where the op takes none (judged once the view exists) */
    int block = a.op == OP_NORM_BLOCK, dyn = a.op == OP_NORM_TOKEN || block; /* the dynamic norms */
    if (dyn && fz_chance(&in, 86)) ot = LK_I8; /* the int8 out (1 in 3) */
    else if (a.op != OP_MERGE && !dyn && fz_chance(&in, 8)) ot = LK_I8, i8_bad = 1;
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
    int64_t ngs = 0; /* OP_NORM_BLOCK: scales a row; gfail: the group_size rule's status */
    lk_status gfail = LK_OK;
    shape[nd - 1] = block ? block_dims(&in, &a, &ngs, &gfail) : fz_dim(&in, 70);
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
        if (i8_bad && w.v[a.out].t.dtype == LK_I8) fz_fail_expected(&w, "i8 out (only the dynamic norms take it)");
    }
    if (block) block_fill(&w, &in, a.x, D, a.group);
    else fz_fill(&w, a.x, -4, 4);
    /* exact, NaN sign free; an i8 out bitwise (the view's own dtype: the rare retype may
     * have made a requested i8 out fp8) */
    if (norm && w.v[a.out].t.dtype != LK_I8) fz_tol(&w, a.out, 0.0);
    if (a.op == OP_FUSED || (dyn && fz_u8(&in) & 1)) {
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
    if (norm && !fz_chance(&in, block ? 40 : 6)) { /* weightless: rarely (OP_NORM_BLOCK 1 in 6) */
        int64_t ws = D;
        if (fz_chance(&in, 8)) ws = D + 1, fz_fail_expected(&w, "weight shape differs from D");
        a.w = fz_view_new(&w, &in, "weight", fz_ftype(&in), 1, &ws, FZ_IN);
        fz_fill(&w, a.w, -2, 2);
    }
    if (block) { /* mostly the first six; judged from the value */
        static const float EPS[16] = {1e-6f, 1e-5f, 0.0f, 0.5f, 1e-6f, 1e-5f, -0.0f, FLT_TRUE_MIN,
                                      FLT_MAX, 1e30f, -1e-6f, -FLT_TRUE_MIN, NAN, -NAN, INFINITY, -INFINITY};
        unsigned e = fz_u8(&in);
        a.eps = EPS[e < 208 ? e % 6 : e % 16];
        if (!(a.eps >= 0.0f) || isinf(a.eps)) fz_fail_expected(&w, "epsilon not finite >= 0");
    } else if (norm) {
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
    } else if (block) { /* scale_ub (its host may be an output), then the group op's scales */
        if (fz_u8(&in) & 1) a.ub = block_ub_new(&w, &in, (const int[]){a.out, a.res, a.x, a.w}, 4);
        a.scale = gscales_new(&w, &in, nd, shape, rows, ngs, (const int[]){a.x, a.out, a.w, a.res, a.ub}, 5, 40);
    } else
        a.scale = scale_new(&w, &in, "scale", a.op == OP_TENSOR ? FZ_OUT : FZ_IN, a.op != OP_TENSOR);
    if (fz_chance(&in, 6)) {
        unsigned k = block ? fz_u8(&in) % 3 : 0;
        if (k == 0) a.x = -1;
        else if (k == 1) a.out = -1;
        else a.scale = -1;
        fz_fail_expected(&w, "NULL tensor pointer");
    }
    if (!block) {
        fz_run(&w, call, &a);
        fz_free(&w);
        return 0;
    }
    /* OP_NORM_BLOCK: valid but for its group_size (fz_overlaps: the aliasing fz_run would
     * find; it only adds expectations) -> the group_size rule's status and name */
    fz_overlaps(&w);
    int only_group = gfail != LK_OK && w.clean;
    if (gfail == LK_ERR_VALUE) fz_fail_expected(&w, "group_size < 1");
    else if (gfail) fz_fail_expected(&w, "group_size does not divide D");
    float *res0 = NULL; /* the residual before the call */
    if (a.res >= 0 && fz_usable(&w, a.res)) {
        const lk_tensor *t = &w.v[a.res].t;
        int64_t n = fz_numel(t);
        if (!(res0 = malloc((size_t)n * sizeof *res0))) abort();
        for (int64_t i = 0; i < n; i++) res0[i] = lk_load_f(t->data, t->dtype, fz_off(t, i));
    }
    block_status = LK_ERR_UNSUPPORTED;
    fz_run(&w, call, &a);
    if (only_group && (block_status != gfail || !strstr(block_err, "group_size")))
        fz_report(&w, "group_size %lld (D %lld), the only fault: %s (%s), the contract gives %s naming group_size",
                  (long long)a.group, (long long)D, lk_status_str(block_status), block_err, lk_status_str(gfail));
    if (block_status == LK_OK) { /* accepted: the outputs fz_run compared, against the contract */
        block_check(&w, &a, res0);
        if (a.group == D) block_vs_token(&w, &a);
    }
    free(res0);
    fz_free(&w);
    return 0;
}
