/*
 * Fuzz harness: SiLU-and-mul then quantization (see fuzz_common.h for the checks):
 * lk_silu_and_mul_quant (out fp8 = fp8(y / scale), a static per-tensor scale) and
 * lk_silu_and_mul_per_block_quant (scales[r, g] = max(min(absmax(y[r, block g]) / qmax,
 * scale_ub), min_scale) written per block of group_size columns, out fp8 or i8), with
 * y = silu(input[..., :d]) * input[..., d:] in f32.
 *
 * Input: op; out dtype (e4m3 / e5m2; the per-block op's i8 1 in 3; rarely an i8 out for
 * the static op: rejected); rank 1..3, leading dims, d (0 .. 70, or whole blocks of a
 * group_size; rarely "long" rows: blocks longer than the SIMD kernel's 1024-float y
 * buffer and rows of several of its 4096-column work units); the input's last dim rarely
 * odd, out's shape rarely off by one; group_size (rarely 0, < 0, INT64_MIN / MAX, a
 * non-divisor of d, 2 d + 1, or d / 2 G, which may divide: valid); dtypes and layouts of
 * every view (fz_view_new: padded, permuted, negative / zero / huge / wild strides, bad
 * rank, dtype, size, NULL data); out rarely placed in the input's buffer (overlapping:
 * rejected; in its padding only: valid); values in ranges from tiny to near f32's max,
 * across silu's clamps (exp overflow at -88.7), with fz_fill's specials (NaN, +-inf, +-0,
 * +-1), gate values at the clamps, constant rows, zero blocks and blocks of very
 * different magnitudes (scale_ub then bounds some blocks only); the static scale: [1] or
 * [] f32, rarely [2], [1, 1], f16, placed in out's or the input's buffer, its value
 * finite > 0 (FLT_TRUE_MIN, FLT_MAX included) or rarely 0, -0, < 0, NaN, +-inf; the
 * per-block scales: [..., ng], [rows, ng], vLLM's transposed (column-major) view of an
 * [ng, rows + pad] buffer, rarely a wrong shape or f16, or placed in the buffer of the
 * input, out or scale_ub; scale_ub absent, or as the static scale (also placed in out's
 * or the input's buffer); NULL tensor pointers.
 *
 * Checks, after fz_run's (each ISA against the reference: scales and an i8 out bitwise,
 * an fp8 out exactly with NaN of either sign equal, see below; every rejected call leaves
 * every buffer intact):
 *  - an input whose only faults are its group_size and / or the value of scale /
 *    scale_ub gets the status the contract gives in the library's order (group_size:
 *    LK_ERR_VALUE below 1, LK_ERR_SHAPE for a non-divisor; then LK_ERR_VALUE for the
 *    scale), its message naming the argument;
 *  - an accepted call's outputs, the SIMD ISA's and the reference's, against the contract: y is
 *    lk_silu_and_mul's SIMD form (include/llmkern.h), so lk_silu_and_mul into a
 *    contiguous f32 out on the same ISA gives y's bits; from them scales[r, g] =
 *    max(min(absmax / qmax, scale_ub), min_scale) in f32 (absmax ignoring NaN), bitwise,
 *    and every code fp8(y / s) (NaN of either sign equal: NaN signs are not specified)
 *    or i8(y / s) (round to nearest even, saturated, NaN 0), bitwise.
 * NaN signs: silu(-NaN) * +NaN is a NaN of either sign (docs/numerics.md: the sign and
 * payload of a computed NaN are not specified), and the reference's scalar product and
 * the SIMD one may pick different operands (clang-14 builds of the reference do): fp8
 * codes of NaN compare equal whatever their sign; every other bit is compared.
 */
#include <float.h>

#include "fuzz_common.h"

enum { OP_STATIC, OP_BLOCK, NOPS };
static const char *OPN[NOPS] = {"lk_silu_and_mul_quant", "lk_silu_and_mul_per_block_quant"};

typedef struct {
    int op, out, x, scale, ub; /* scale: the static scale, or the per-block scales */
    int64_t group;
} aq_attrs;

/* the status and message of the last call (fz_run calls the SIMD ISA, then the ref, and
 * checks that both statuses agree) */
static lk_status last_status;
static char last_err[512];

static lk_status call(const fz_world *w, const void *ap) {
    const aq_attrs *a = ap;
    if (a->op == OP_STATIC)
        last_status = lk_silu_and_mul_quant(fz_t(w, a->out), fz_t(w, a->x), fz_t(w, a->scale));
    else
        last_status = lk_silu_and_mul_per_block_quant(fz_t(w, a->out), fz_t(w, a->x), fz_t(w, a->scale),
                                                      fz_t(w, a->ub), a->group);
    snprintf(last_err, sizeof last_err, "%s", lk_last_error());
    return last_status;
}

/* ---------------------------------------------------------------- views */

/* an fp8 / i8 output: fz_view_new's rare wrong-kind dtype may be an fp8 dtype, which
 * both ops take (valid), so that case is not an expected failure */
static int q_out_new(fz_world *w, fz_in *in, const char *name, lk_dtype dt, int nd, const int64_t *shape) {
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

/* a view named name of dtype dt, shape [nd: shape], contiguous, placed at an offset (a
 * multiple of its element size, from the input) inside the buffer of view p; -1 when it
 * does not fit. Whether it overlaps p (or anything) is fz_overlaps' to judge; one lying in
 * an output's padding only is valid, but the library's disjointness proof may refuse it:
 * not clean. */
static int view_in_host(fz_world *w, fz_in *in, int p, const char *name, lk_dtype dt, int nd, const int64_t *shape,
                        int role) {
    if (p < 0 || !fz_usable(w, p)) return -1;
    const fz_arena *ar = &w->a[w->v[p].arena];
    int64_t n = 1, es = fz_es(dt);
    for (int d = 0; d < nd; d++) n *= shape[d];
    if (n <= 0 || (size_t)(n * es) > ar->n) return -1;
    int vi = fz_view_alias(w, p, name, role);
    fz_view *v = &w->v[vi];
    v->inplace_of = -1;
    v->bad = 0;
    v->cmp = FZ_CMP_BITS, v->atol = v->rtol = 0.0, v->nonfinite_any = 0, v->sat_any = 0.0;
    w->clean = 0;
    size_t slots = (ar->n - (size_t)(n * es)) / (size_t)es + 1, off = (size_t)es * (fz_u32(in) % slots);
    lk_tensor *t = &v->t;
    t->dtype = dt;
    t->ndim = nd;
    for (int d = 0; d < nd; d++) t->shape[d] = shape[d];
    fz_contiguous(t);
    t->data = ar->p + off;
    return vi;
}

/* a one-element f32 scale (the static scale, scale_ub): [1], rarely [] (valid), [2] or
 * [1, 1] (rejected), f16 (rejected), or (place byte < 24) a [1] / [] f32 in the buffer of
 * one of host[] (overlapping an output: rejected; an input: valid); every element one
 * value: finite > 0 (FLT_TRUE_MIN and FLT_MAX included), rarely 0, -0, < 0, NaN, +-inf.
 * *bad_value: whether the stored value is not finite > 0 (judged from what was stored:
 * host placements share bytes) */
static int scale_new(fz_world *w, fz_in *in, const char *name, const int *host, int nhost, int *bad_value) {
    static const float SV[16] = {1.0f, 0.0125f, 3.7f, 1e-30f, 1e30f, 0.5f, 0.05f, 0.2f,
                                 FLT_TRUE_MIN, FLT_MAX, 0.0f, -0.0f, -1.0f, NAN, INFINITY, -INFINITY};
    unsigned place = fz_u8(in);
    int vi = -1;
    if (place < 24) {
        int rank = (int)(fz_u8(in) & 1);
        vi = view_in_host(w, in, host[place % (unsigned)nhost], name, LK_F32, rank, (int64_t[]){1}, FZ_IN);
    }
    if (vi < 0) {
        unsigned k = fz_u8(in) % 32;
        int64_t sh[2] = {k == 2 ? 2 : 1, 1};
        vi = fz_view_new(w, in, name, fz_chance(in, 6) ? LK_F16 : LK_F32, k == 0 ? 0 : k == 1 ? 2 : 1, sh, FZ_IN);
    }
    lk_tensor *t = &w->v[vi].t;
    if (t->dtype != LK_F32) fz_fail_expected(w, "scale not f32");
    if (t->ndim > 1 || (t->ndim == 1 && t->shape[0] != 1)) fz_fail_expected(w, "scale not [] or [1]");
    unsigned vb = fz_u8(in);
    float v = SV[vb < 200 ? vb % 10 : vb % 16];
    *bad_value = 0;
    if (fz_usable(w, vi) && t->dtype == LK_F32) {
        for (int64_t i = 0, n = fz_numel(t); i < n; i++) ((float *)t->data)[fz_off(t, i)] = v;
        float got = ((const float *)t->data)[fz_off(t, 0)];
        *bad_value = !(got > 0.0f && got <= FLT_MAX);
    }
    return vi;
}

/* the contract's scales shapes for input [..., 2d] (leading dims xs[0 .. nd - 2], rows of
 * them) and ng blocks a row: [..., ng] (input's leading dims) or [rows, ng] */
static int gscales_shape_ok(int snd, const int64_t *ss, int nd, const int64_t *xs, int64_t rows, int64_t ng) {
    int lead = snd == nd && ss[nd - 1] == ng;
    for (int d = 0; lead && d < nd - 1; d++) lead = ss[d] == xs[d];
    return lead || (snd == 2 && ss[0] == rows && ss[1] == ng);
}

/* the written per-block scales, ngs a row: [..., ngs], [rows, ngs], or rarely a wrong
 * shape (per-token [..., 1] / [rows], a block too many or too few, a row too many, flat
 * 1-D) or f16; any fz_view_new layout, vLLM's column-major scales (the transposed view of
 * an [ngs, rows + pad] buffer), or (place byte < 40) placed in the buffer of one of
 * host[] (an entry < 0 or unusable: not placed) */
static int gscales_new(fz_world *w, fz_in *in, int nd, const int64_t *shape, int64_t rows, int64_t ngs,
                       const int *host, int nhost) {
    int64_t ss[4] = {0, 0, 0, 0};
    int snd;
    unsigned form = fz_u8(in) % 16;
    if (form < 8) {
        snd = nd;
        for (int d = 0; d < nd - 1; d++) ss[d] = shape[d];
        ss[nd - 1] = ngs;
    } else if (form < 14) {
        snd = 2, ss[0] = rows, ss[1] = ngs;
    } else {
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
    int vi = -1;
    if (place < 40) vi = view_in_host(w, in, host[place % (unsigned)nhost], "scales", LK_F32, snd, ss, FZ_OUT);
    if (vi >= 0) return vi;
    if (snd == 2 && place >= 176) { /* column-major: [ng, rows + pad] transposed */
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

/* ---------------------------------------------------------------- shapes and values */

/* the per-block op's d (returned) and group_size (a->group). Ordinary rows: G from
 * {1 .. 8, 16, 17, 32, 64, 128} with d = ng G (ng 0 .. 8, or 0 .. 3 for G >= 64); d in
 * 0 .. 70 with any divisor of it; or G = d (one block a row; 128 when d is 0). Long rows
 * (big): blocks longer than the SIMD kernel's y buffer (1024 floats: G 1023 .. 4100, one
 * or two a row), or many blocks over several 4096-column work units (d 4096 .. 8400).
 * Rarely a bad group_size (0, -1, -G, INT64_MIN, INT64_MAX, a non-divisor, 2 d + 1; or d
 * and 2 G, which may divide d: valid). *ngs: the scales a row to build (d / group_size;
 * for a group_size < 1, d / G; for a non-divisor d / G or d / group_size rounded down);
 * *gfail: the status of the group_size rule (LK_OK: valid) */
static int64_t block_dims(fz_in *in, aq_attrs *a, int big, int64_t *ngs, lk_status *gfail) {
    int64_t d, G;
    if (big) {
        if (fz_u8(in) & 1) {
            static const int64_t BG[8] = {1023, 1024, 1025, 1100, 2048, 2500, 4096, 4100};
            G = BG[fz_u8(in) % 8];
            d = G * (G <= 4096 && (fz_u8(in) & 1) ? 2 : 1);
        } else {
            static const int64_t MG[6] = {7, 64, 100, 128, 1000, 1024};
            G = MG[fz_u8(in) % 6];
            d = ((4096 + (int64_t)fz_u8(in) * 17) / G + 1) * G;
        }
    } else
        d = fz_group_row(in, &G);
    a->group = fz_group_size(in, d, G, ngs, gfail);
    return d;
}

/* input values [..., 2d] (gate: columns [0, d), up: [d, 2d)): uniform in a range
 * (ordinary, silu's tails, past exp's overflow, off-centre, tiny, near f32's max: y
 * overflows, f16's range, small) with fz_fill's specials; then rarely a pattern per block
 * of G output columns: constant rows, every third block's up values zero (its scale the
 * minimum, unless a gate is inf / NaN), block g's up values scaled by 2^(12 (g % 4) - 18)
 * (scale_ub bounding some blocks only), gate values at silu's clamps; and rarely one
 * element set to a special value */
static void aq_fill(fz_world *w, fz_in *in, int vi, int64_t d, int64_t G) {
    static const double LO[8] = {-4, -12, -100, 1, -1e-30, -3e38, -6e4, -1e-3},
                        HI[8] = {4, 12, 100, 9, 1e-30, 3e38, 6e4, 1e-3};
    unsigned rg = fz_u8(in) % 10;
    rg = rg < 8 ? rg : 0;
    fz_fill(w, vi, LO[rg], HI[rg]);
    if (!fz_usable(w, vi) || d < 1) return;
    lk_tensor *t = &w->v[vi].t;
    int64_t n = fz_numel(t), w2 = t->shape[t->ndim - 1]; /* 2d, or 2d + 1 (odd: rejected anyway) */
    if (G < 1) G = d;
    unsigned pat = fz_u8(in);
    if (pat < 64) {
        static const float GV[12] = {-88.75f, -88.72f, -88.7f, -87.3f, 87.3f, 88.0f,
                                     -89.0f, 89.0f, -1e30f, 1e30f, -INFINITY, INFINITY};
        for (int64_t i = 0; i < n; i++) {
            int64_t c = i % w2, up = c >= d, g = (up ? c - d : c) / G;
            float x = lk_load_f(t->data, t->dtype, fz_off(t, i));
            if (pat < 16) x = 2.5f;
            else if (pat < 32) x = up && g % 3 == 0 ? 0.0f : x;
            else if (pat < 48) x = up ? ldexpf(x, (int)(g % 4) * 12 - 18) : x;
            else if (!up && fz_next(&w->rng) % 4 == 0) x = GV[fz_next(&w->rng) % 12];
            lk_store_f(t->data, t->dtype, fz_off(t, i), x);
        }
    }
    if (fz_chance(in, 32)) {
        static const float SP[12] = {NAN, -NAN, INFINITY, -INFINITY, FLT_MAX, -FLT_MAX,
                                     FLT_TRUE_MIN, -FLT_TRUE_MIN, -0.0f, 0.0f, FLT_MIN, 65504.0f};
        lk_store_f(t->data, t->dtype, fz_off(t, fz_range(in, 0, n - 1)), SP[fz_u8(in) % 12]);
    }
}

/* ---------------------------------------------------------------- the contract */

/* an fp8 / i8 code pair equal: the same bits, or (fp8) NaN of either sign */
static int code_eq(lk_dtype dt, uint8_t a, uint8_t b) {
    return a == b || (dt != LK_I8 && isnan(lk_load_f(&a, dt, 0)) && isnan(lk_load_f(&b, dt, 0)));
}

/* an accepted call's outputs (as the ISA named who left them) against the contract, from
 * y = lk_silu_and_mul's SIMD form (a contiguous copy of the input into a contiguous f32
 * out, on the SIMD ISA in use: the reference's silu_and_mul is not that form) */
static void contract_check(fz_world *w, const aq_attrs *a, const char *who) {
    const lk_tensor *x = &w->v[a->x].t, *out = &w->v[a->out].t;
    int nd = out->ndim;
    int64_t d = out->shape[nd - 1], n = fz_numel(out);
    if (n == 0) return;
    int64_t rows = n / d, es = fz_es(x->dtype), G = a->op == OP_BLOCK ? a->group : d, ng = d / G;
    char *xc = malloc((size_t)(rows * 2 * d * es));
    float *y = malloc((size_t)n * sizeof *y);
    if (!xc || !y) abort();
    for (int64_t i = 0; i < rows * 2 * d; i++) memcpy(xc + i * es, (const char *)x->data + fz_off(x, i) * es, (size_t)es);
    int64_t xs[2] = {rows, 2 * d}, ys[2] = {rows, d};
    lk_tensor tx = lk_tensor_make(xc, x->dtype, 2, xs), ty = lk_tensor_make(y, LK_F32, 2, ys);
    lk_status st = lk_silu_and_mul(&ty, &tx);
    if (st != LK_OK) fz_report(w, "lk_silu_and_mul on the same input: %s (%s)", lk_status_str(st), lk_last_error());
    lk_dtype odt = out->dtype;
    float qmax = odt == LK_I8 ? 127.0f : odt == LK_F8E5M2 ? 57344.0f : 448.0f;
    float lo = odt == LK_I8 ? FLT_EPSILON : 1.0f / (qmax * 512.0f), ub = INFINITY, s = 0.0f;
    if (a->op == OP_STATIC) s = ((const float *)w->v[a->scale].t.data)[fz_off(&w->v[a->scale].t, 0)];
    else if (a->ub >= 0) ub = ((const float *)w->v[a->ub].t.data)[fz_off(&w->v[a->ub].t, 0)];
    for (int64_t r = 0; r < rows; r++)
        for (int64_t g = 0; g < ng; g++) {
            const float *yb = y + r * d + g * G;
            float m = 0.0f;
            if (a->op == OP_BLOCK) {
                for (int64_t i = 0; i < G; i++)
                    if (fabsf(yb[i]) > m) m = fabsf(yb[i]);
                s = m / qmax;
                s = s < ub ? s : ub;
                s = s > lo ? s : lo;
                const lk_tensor *sc = &w->v[a->scale].t;
                float got = ((const float *)sc->data)[fz_off(sc, r * ng + g)];
                if (memcmp(&got, &s, 4))
                    fz_report(w, "%s: scales[%lld, %lld] = %.9g, the contract gives %.9g (block absmax %.9g, "
                              "scale_ub %g)", who, (long long)r, (long long)g, (double)got, (double)s, (double)m,
                              (double)ub);
            }
            for (int64_t i = 0; i < G; i++) {
                int64_t k = r * d + g * G + i;
                uint8_t q, o = ((const uint8_t *)out->data)[fz_off(out, k)];
                float t = yb[i] / s;
                if (odt == LK_I8) q = (uint8_t)(int8_t)(t != t ? 0 : t >= 127.0f ? 127 : t <= -128.0f ? -128 : (int)rintf(t));
                else lk_store_f(&q, odt, 0, t);
                if (!code_eq(odt, q, o))
                    fz_report(w, "%s: out[%lld, %lld] = 0x%02x, the contract gives 0x%02x (y %.9g = silu(%.9g) * "
                              "%.9g, scale %.9g)", who, (long long)r, (long long)(g * G + i), o, q, (double)yb[i],
                              (double)lk_load_f(xc, x->dtype, r * 2 * d + g * G + i),
                              (double)lk_load_f(xc, x->dtype, r * 2 * d + d + g * G + i), (double)s);
            }
        }
    free(xc);
    free(y);
}

/* ---------------------------------------------------------------- the harness */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_in in = {data, size, 0};
    fz_world w;
    fz_init(&w, &in, "act_quant");
    aq_attrs a = {0, -1, -1, -1, -1, 0};
    a.op = (int)(fz_u8(&in) % NOPS);
    w.op = OPN[a.op];
    int block = a.op == OP_BLOCK;
    lk_dtype ot = fz_u8(&in) & 1 ? LK_F8E5M2 : LK_F8E4M3;
    int i8_bad = 0; /* an i8 out for the static op (judged once the view exists) */
    if (block && fz_chance(&in, 86)) ot = LK_I8; /* the int8 out (1 in 3) */
    else if (!block && fz_chance(&in, 8)) ot = LK_I8, i8_bad = 1;

    /* shapes: input [..., 2d], out [..., d] */
    int nd = 1 + (int)(fz_u8(&in) % 3), big = fz_u8(&in) < 16;
    int64_t xs[3] = {1, 1, 1};
    for (int k = 0; k < nd - 1; k++) xs[k] = fz_dim(&in, big ? 2 : 5);
    int64_t d, ngs = 0, rows = 1;
    lk_status gfail = LK_OK; /* the group_size rule's status */
    if (block) d = block_dims(&in, &a, big, &ngs, &gfail);
    else {
        static const int64_t BD[8] = {1024, 1025, 2047, 4096, 4097, 5000, 8192, 8200};
        d = big ? BD[fz_u8(&in) % 8] : fz_dim(&in, 70);
    }
    for (int k = 0; k < nd - 1; k++) rows *= xs[k];
    xs[nd - 1] = 2 * d;
    if (fz_chance(&in, 8)) {
        xs[nd - 1] += 1;
        fz_fail_expected(&w, "input's last dim is odd");
    }
    int64_t os[3] = {xs[0], xs[1], xs[2]};
    os[nd - 1] = d;
    if (fz_chance(&in, 8)) {
        os[fz_u8(&in) % (unsigned)nd] += 1;
        fz_fail_expected(&w, "out's shape is not input's with the last dim halved");
    }

    a.x = fz_view_new(&w, &in, "input", fz_ftype(&in), nd, xs, FZ_IN);
    aq_fill(&w, &in, a.x, d, block ? a.group : 16);
    if (fz_u8(&in) < 16) a.out = view_in_host(&w, &in, a.x, "out", ot, nd, os, FZ_OUT); /* in the input's buffer */
    if (a.out < 0) a.out = q_out_new(&w, &in, "out", ot, nd, os);
    if (i8_bad && w.v[a.out].t.dtype == LK_I8) fz_fail_expected(&w, "i8 out (the static op's out is fp8)");
    /* fp8 codes: exact, NaN of either sign equal (the product of a NaN gate's silu and a
     * NaN up value is either NaN: the reference's scalar product and the SIMD one order
     * their operands differently); the sign of zero and everything else bitwise through
     * contract_check, on both ISAs' outputs; an i8 out bitwise */
    if (fz_is_fp8(w.v[a.out].t.dtype)) fz_tol(&w, a.out, 0.0);

    int vfail = 0; /* the static scale's / scale_ub's value is not finite > 0 */
    if (block) { /* scale_ub (its host may be out), then the scales */
        if (fz_u8(&in) & 1) a.ub = scale_new(&w, &in, "scale_ub", (const int[]){a.out, a.x}, 2, &vfail);
        a.scale = gscales_new(&w, &in, nd, xs, rows, ngs, (const int[]){a.x, a.out, a.ub}, 3);
    } else
        a.scale = scale_new(&w, &in, "scale", (const int[]){a.out, a.x}, 2, &vfail);

    if (fz_chance(&in, 6)) {
        unsigned k = fz_u8(&in) % 3;
        if (k == 0) a.x = -1;
        else if (k == 1) a.out = -1;
        else a.scale = -1;
        fz_fail_expected(&w, "NULL tensor pointer");
    }

    /* valid but for its group_size and / or the scale's value (fz_overlaps: the aliasing
     * fz_run would find; it only adds expectations) -> the first of those the library
     * checks, by status and name */
    fz_overlaps(&w);
    int only = (gfail != LK_OK || vfail) && w.clean;
    lk_status want = gfail != LK_OK ? gfail : LK_ERR_VALUE;
    const char *wname = gfail != LK_OK ? "group_size" : block ? "scale_ub" : "scale";
    if (gfail == LK_ERR_VALUE) fz_fail_expected(&w, "group_size < 1");
    else if (gfail) fz_fail_expected(&w, "group_size does not divide d");
    if (vfail) fz_fail_expected(&w, "scale / scale_ub not finite > 0");

    last_status = LK_ERR_UNSUPPORTED;
    fz_run(&w, call, &a);
    if (only && (last_status != want || !strstr(last_err, wname)))
        fz_report(&w, "group_size %lld (d %lld), scale value fault %d, nothing else wrong: %s (%s), the contract gives "
                  "%s naming %s", (long long)a.group, (long long)d, vfail, lk_status_str(last_status), last_err,
                  lk_status_str(want), wname);
    if (last_status == LK_OK && lk_isa_current() != LK_ISA_REF) {
        lk_isa best = lk_isa_current();
        contract_check(&w, &a, lk_isa_name(best));
        lk_set_isa(LK_ISA_REF);
        lk_status s = call(&w, &a); /* the same call again: the reference's outputs */
        lk_set_isa(best);
        if (s != LK_OK) fz_report(&w, "the reference, called again: %s (%s)", lk_status_str(s), last_err);
        contract_check(&w, &a, "ref");
    }
    fz_free(&w);
    return 0;
}
