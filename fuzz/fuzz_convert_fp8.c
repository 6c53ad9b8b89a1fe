/*
 * Fuzz harness: lk_convert_fp8 (see fuzz_common.h for the checks). Input: rank 1-4 and
 * dims (0 too), the direction (quantize f32/f16/bf16 -> e4m3/e5m2, dequantize back),
 * rarely both or neither side fp8, a shape mismatch, layouts (permutations, padding,
 * negative strides), dst aliasing src, scales from a list with bad ones (0, < 0, NaN,
 * inf: rejected). Results are compared with the ref kernel bit for bit.
 */
#include "fuzz_common.h"

typedef struct {
    int dst, src;
    float scale;
} cv_attrs;


static lk_status call(const fz_world *w, const void *ap) {
    const cv_attrs *a = ap;
    return lk_convert_fp8(fz_t(w, a->dst), fz_t(w, a->src), a->scale);
}

/* fz_view_new: a retype to fp8 is no error of its own (the op decides) */
static int view8(fz_world *w, fz_in *in, const char *name, lk_dtype dt, int nd, const int64_t *shape, int role) {
    int vi = fz_view_new(w, in, name, dt, nd, shape, role);
    fz_view *v = &w->v[vi];
    if (v->bad && fz_is_fp8(v->t.dtype) && !fz_view_invalid(&v->t))
        v->bad = 0, w->must_fail = 0, w->clean = 0; /* the earlier expectations assumed dt */
    return vi;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_in in = {data, size, 0};
    fz_world w;
    fz_init(&w, &in, "lk_convert_fp8");
    static const float SC[] = {1.0f, 0.03125f, 3.7f, 1e-30f, 1e30f, 0.0f, -1.0f, NAN, INFINITY};
    cv_attrs a = {-1, -1, SC[fz_u8(&in) % 9]};
    if (!(a.scale > 0 && a.scale <= 3.40282347e38f)) fz_fail_expected(&w, "scale not finite > 0");
    int nd = 1 + (int)(fz_u8(&in) % 4);
    int64_t shape[4], dshape[4];
    for (int d = 0; d < nd; d++) shape[d] = dshape[d] = fz_dim(&in, d == nd - 1 ? 40 : 5);
    if (fz_chance(&in, 8)) {
        dshape[fz_u8(&in) % (unsigned)nd] += 1;
        fz_fail_expected(&w, "dst's shape differs from src's");
    }
    lk_dtype q = fz_u8(&in) & 1 ? LK_F8E5M2 : LK_F8E4M3, f = fz_ftype(&in);
    int dequant = fz_u8(&in) & 1;
    lk_dtype st = dequant ? q : f, dt = dequant ? f : q;
    if (fz_chance(&in, 8)) {
        unsigned k = fz_u8(&in) % 2;
        if (k == 0) st = dt = q; /* both fp8 */
        else st = dt = f;        /* neither */
        fz_fail_expected(&w, "not exactly one side fp8");
    }
    a.src = view8(&w, &in, "src", st, nd, shape, FZ_IN);
    if (fz_chance(&in, 8)) {
        a.dst = fz_view_alias(&w, a.src, "dst", FZ_OUT);
        w.v[a.dst].inplace_of = -1;
        fz_fail_expected(&w, "dst is src (same dtype: not exactly one side fp8)");
    } else a.dst = view8(&w, &in, "dst", dt, nd, dshape, FZ_OUT);
    fz_fill(&w, a.src, -600, 600);
    if (fz_usable(&w, a.src) && fz_is_fp8(w.v[a.src].t.dtype)) {
        int64_t n = fz_numel(&w.v[a.src].t);
        for (int64_t i = 0; i < n; i++)
            ((unsigned char *)w.v[a.src].t.data)[fz_off(&w.v[a.src].t, i)] = (unsigned char)fz_next(&w.rng);
    }
    if (fz_chance(&in, 6)) {
        if (fz_u8(&in) & 1) a.dst = -1;
        else a.src = -1;
        fz_fail_expected(&w, "NULL tensor pointer");
    }
    fz_run(&w, call, &a);
    fz_free(&w);
    return 0;
}
