/*
 * Fuzz harness: lk_concat_and_cache_mla_rope (see fuzz_common.h for the checks). Input:
 * T, Hq, Dr, rot (odd / > Dr too), max_pos, NeoX or GPT-J, Dl, num_blocks, block_size
 * (0 too; rarely T up to 130 with more than 64 slots used, or entries of 64 to 272
 * dims: the cache kernel's token-major and 4 x 16 paths), N <= T slots and P >= T
 * positions (rarely N > T, P < T, q_pe's T or head dim, k_pe's T off by one, k_pe_cache's
 * num_blocks or block_size off by one); q_pe / k_pe / kv_c / cos_sin_cache f32/f16/bf16,
 * caches also e4m3 / e5m2 (a cache's rare retype to fp8 is valid in ND, rejected in NZ
 * unless it was fp8); ND (3-D or 4-D) or NZ caches, one or two (or k_pe_cache =
 * kv_c_cache: rejected), scale NULL / [] / [1] (a wrong length, bad values); layout
 * unknown; positions i32 / i64, slot_mapping i32 / i64. Views: separate,
 * k_pe and kv_c as slices of one kv_a buffer [T, Dl + Dr] (vLLM's), q_pe a slice of
 * q [T, Hq, Dn + Dr], q_pe and k_pe as slices of one [T, Hq + 1, Dr] buffer, and
 * overlapping variants of those (k_pe over kv_c, k_pe over a q_pe head, k_pe = kv_c);
 * plus a "pack" mode that moves one argument's buffer into (or next to) a written one's
 * at an offset from the input, or the written one into the other's, so that every
 * overlap pair the op checks (q_pe / k_pe / the caches against each other and against
 * positions, cos_sin_cache, kv_c, slot_mapping, scale) is reached. Index values
 * (positions' first T; slots: range and duplicates) and scale values are re-validated
 * here from what is stored, after every fill.
 *
 * Results: the ISA's run against the ref's (q_pe, k_pe, caches) bit for bit, or by value
 * (exactly, NaN = NaN) where special values are filled or buffers packed (the sign of a
 * NaN the rotation makes is not specified; it reaches the cache through k_pe); and, on
 * LK_OK, against the contract's composition on the same ISA: lk_rotary_embedding on q_pe
 * and k_pe as [T, 1, Dr] with positions[:T], then lk_concat_and_cache_mla_fp8 from the
 * rotated k_pe, on a copy of the inputs: every byte of every buffer must match (the
 * fused driver runs the same kernels; the order rope-then-cache is the contract's).
 *
 * Every written buffer (q_pe, k_pe, the caches) must be disjoint from all of positions,
 * its tail past T included, though only the first T values are read. Not required either
 * way: packed views whose extents meet without a shared byte (lk_check_disjoint is
 * conservative there).
 */
#include "fuzz_common.h"

typedef struct {
    int pos, q, k, kv, cs, c0, c1, sm, scale; /* view indices (-1: NULL) */
    int neox, layout;
} rope_attrs;

static lk_status fused(const fz_world *w, const rope_attrs *a) {
    return lk_concat_and_cache_mla_rope(fz_t(w, a->pos), fz_t(w, a->q), fz_t(w, a->k), fz_t(w, a->kv),
                                        fz_t(w, a->cs), a->neox, fz_t(w, a->c0), fz_t(w, a->c1),
                                        fz_t(w, a->sm), (lk_kv_layout)a->layout, fz_t(w, a->scale));
}

/* the view (other than a parent) holding byte b of arena ai, for reports */
static const char *view_at(const fz_world *w, int ai, size_t b) {
    for (int vi = 0; vi < w->nv; vi++) {
        const fz_view *v = &w->v[vi];
        if (v->arena != ai || !fz_usable(w, vi)) continue;
        int64_t es = fz_es(v->t.dtype);
        for (int64_t i = 0, n = fz_numel(&v->t); i < n; i++) {
            uintptr_t s = (uintptr_t)v->t.data + (uintptr_t)(fz_off(&v->t, i) * es) - (uintptr_t)w->a[ai].p;
            if (b >= s && b < s + (uintptr_t)es) return v->name;
        }
    }
    return "no view";
}

/* w after the fused call (LK_OK), c a copy of w before it: the contract's two steps on c
 * must give w's bytes exactly */
static void oracle(const fz_world *w, fz_world *c, const rope_attrs *a) {
    fz_rope_then_concat(w, c, a->pos, a->q, a->k, a->cs, a->neox, a->kv, a->c0, a->c1, a->sm, (lk_kv_layout)a->layout,
                        a->scale, view_at);
}

static lk_status call(const fz_world *w, const void *ap) {
    const rope_attrs *a = ap;
    fz_world c;
    fz_clone(w, &c);
    lk_status s = fused(w, a);
    if (s == LK_OK) oracle(w, &c, a);
    fz_free(&c);
    return s;
}

static int tile_of(lk_dtype dt) { return lk_dtype_size(dt) == 1 ? 32 : 16; }

/* a cache view (fz_view_new; its rare retype to fp8 is no bad dtype: valid in ND, and in
 * NZ only for a cache that was fp8, since the tile is 32 wide for fp8, 16 else) */
static int cache_new(fz_world *w, fz_in *in, const char *name, lk_dtype dt, int nz, int nd, const int64_t *shape) {
    int mf = w->must_fail, cl = w->clean;
    const char *why = w->why_fail;
    int vi = fz_view_new(w, in, name, dt, nd, shape, FZ_OUT);
    fz_view *v = &w->v[vi];
    if (v->bad && fz_is_fp8(v->t.dtype) && v->t.dtype != dt && !fz_view_invalid(&v->t)) {
        v->bad = 0, w->must_fail = mf, w->why_fail = why, w->clean = cl;
        if (nz && !fz_is_fp8(dt)) fz_fail_expected(w, "NZ cache retyped to fp8 keeps the 16-wide tile");
    }
    return vi;
}

/* ND [NB, bs, W] (or [NB, bs, 1, W] with h4), NZ [NB, W / tile, bs, tile] */
static int cache_view(fz_world *w, fz_in *in, const char *name, lk_dtype dt, int nz, int64_t NB, int64_t bs,
                      int64_t W, int h4) {
    if (nz) {
        int64_t t = tile_of(dt);
        if (W % t) fz_fail_expected(w, "NZ width not a multiple of the tile");
        int64_t s[4] = {NB, W / t, bs, t};
        return cache_new(w, in, name, dt, 1, 4, s);
    }
    if (h4) {
        int64_t s[4] = {NB, bs, 1, W};
        return cache_new(w, in, name, dt, 0, 4, s);
    }
    int64_t s[3] = {NB, bs, W};
    return cache_new(w, in, name, dt, 0, 3, s);
}

static lk_dtype cache_type(fz_in *in) {
    if (fz_u8(in) & 1) return fz_u8(in) & 1 ? LK_F8E5M2 : LK_F8E4M3;
    return fz_ftype(in);
}

/* scale: -1 (NULL), f32 [1] or [] (or [2]: rejected); values set by scale_fill */
static int scale_view(fz_world *w, fz_in *in) {
    unsigned k = fz_u8(in) % 6;
    if (k == 0) return -1;
    int64_t n = k == 5 ? 2 : 1;
    if (n != 1) fz_fail_expected(w, "scale of 2 values");
    int vi = fz_view_new(w, in, "scale", LK_F32, 1, &n, FZ_IN);
    if (k == 1 && !w->v[vi].bad) w->v[vi].t.ndim = 0;
    return vi;
}

static void scale_fill(fz_world *w, fz_in *in, int vi) {
    static const float SC[] = {1.0f, 0.03125f, 3.7f, 0.5f, 1e-30f, 1e30f, 0.0f, -1.0f, NAN, INFINITY};
    if (vi < 0 || !fz_usable(w, vi)) return;
    float *d = w->v[vi].t.data;
    for (int64_t i = 0, n = fz_numel(&w->v[vi].t); i < n; i++)
        d[fz_off(&w->v[vi].t, i)] = fz_chance(in, 16) ? SC[4 + fz_u8(in) % 6] : SC[fz_u8(in) % 4];
}

/* byte range [lo, hi) of a usable view inside its arena */
static void byte_range(const fz_world *w, int vi, size_t *lo, size_t *hi) {
    const lk_tensor *t = &w->v[vi].t;
    fz_ext e = fz_extent(t);
    int64_t es = fz_es(t->dtype);
    uintptr_t base = (uintptr_t)w->a[w->v[vi].arena].p;
    *lo = (size_t)((uintptr_t)t->data + (uintptr_t)((int64_t)e.lo * es) - base);
    *hi = (size_t)((uintptr_t)t->data + (uintptr_t)(((int64_t)e.hi + 1) * es) - base);
}

/* pack: arena ay (every view in it) moved into arena ax at byte offset off (a multiple
 * of 8: every element stays aligned); ay is left empty */
static void pack(fz_world *w, int ax, int ay, size_t off) {
    size_t nx = w->a[ax].n, ny = w->a[ay].n, n = nx > off + ny ? nx : off + ny;
    unsigned char *p = malloc(n);
    if (!p) abort();
    for (size_t b = 0; b < n; b++) p[b] = (unsigned char)fz_next(&w->rng);
    memcpy(p, w->a[ax].p, nx);
    memcpy(p + off, w->a[ay].p, ny);
    for (int vi = 0; vi < w->nv; vi++) {
        fz_view *v = &w->v[vi];
        if (v->arena != ax && v->arena != ay) continue;
        uintptr_t base = (uintptr_t)w->a[v->arena].p, to = (uintptr_t)p + (v->arena == ay ? off : 0);
        if (v->t.data) v->t.data = (void *)(to + ((uintptr_t)v->t.data - base)); /* NULL (a rare bad view) stays */
        v->arena = ax;
    }
    free(w->a[ax].p);
    free(w->a[ay].p);
    w->a[ax].p = p, w->a[ax].n = n;
    w->a[ay].p = malloc(1), w->a[ay].n = 0;
    if (!w->a[ay].p) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_in in = {data, size, 0};
    fz_world w;
    fz_init(&w, &in, "lk_concat_and_cache_mla_rope");
    rope_attrs a;
    memset(&a, 0xff, sizeof a); /* every view index -1 */
    unsigned lay = fz_u8(&in) % 16;
    a.layout = lay < 7 ? LK_KV_ND : lay < 15 ? LK_KV_NZ : 2;
    int bad_layout = a.layout == 2;
    if (bad_layout) fz_fail_expected(&w, "unknown layout");
    int nz = a.layout == LK_KV_NZ;
    a.neox = (int)(fz_u8(&in) % 3); /* any non-zero value means NeoX */

    /* ---- shapes */
    /* long (rare): T 64 .. 130 and blocks of 16, so that more than 64 slots are used
     * (the duplicate check's heap hash set) */
    int longm = fz_chance(&in, 6);
    int64_t T = longm ? fz_range(&in, 64, 130) : fz_dim(&in, 6), Hq = fz_dim(&in, longm ? 2 : 4), Dl, Dr;
    /* wide (not with long): the cache kernel's paths for DeepSeek-like entries (512 + 64):
     * ND token by token (an entry of 64 or more elements a run), NZ 4 chunks of 16 at once */
    int wide = !longm && fz_chance(&in, 48);
    if (nz) {
        Dl = 16 * fz_range(&in, 0, wide ? 5 : 2) + (fz_chance(&in, 16) ? 8 : 0);
        Dr = 16 * fz_range(&in, 0, wide ? 4 : 2) + (fz_chance(&in, 16) ? 8 : 0);
    } else {
        Dl = wide ? fz_range(&in, 64, 200) : fz_dim(&in, 40);
        Dr = fz_dim(&in, wide ? 72 : 24);
    }
    int64_t rot = 2 * fz_range(&in, 0, Dr / 2), max_pos = fz_dim(&in, 8);
    if (fz_chance(&in, 8)) {
        rot = fz_u8(&in) & 1 ? rot + 1 : Dr + 2;
        fz_fail_expected(&w, "rotary dim odd or > head dim");
    }
    int64_t NB = longm ? fz_range(&in, 4, 12) : fz_dim(&in, 4), bs = longm ? 16 : fz_dim(&in, 4);
    int64_t N = fz_range(&in, 0, T), P = T + fz_range(&in, 0, 3);
    if (bs == 0 && NB > 0) fz_fail_expected(&w, "block_size 0");
    int64_t Tq = T, Dq = Dr, Tk = T; /* q_pe's tokens and head dim, k_pe's tokens */
    unsigned odd = fz_u8(&in) < 40 ? fz_u8(&in) % 5 : 5;
    if (odd == 0) Tq = T + 1, fz_fail_expected(&w, "kv_c's tokens differ from q_pe's");
    if (odd == 1) {
        Dq = Dr + (fz_u8(&in) & 1 || Dr == 0 ? 1 : -1);
        fz_fail_expected(&w, "k_pe's dim differs from q_pe's head dim");
    }
    if (odd == 2) Tk = T + 1, fz_fail_expected(&w, "k_pe's tokens differ from kv_c's");
    if (odd == 3 && T > 0) P = T - 1 - fz_range(&in, 0, T - 1), fz_fail_expected(&w, "positions shorter than T");
    if (odd == 4) N = T + 1, fz_fail_expected(&w, "more slots than tokens");

    /* ---- q_pe, k_pe, kv_c */
    unsigned qmode = odd < 3 ? 0 : fz_u8(&in) % 6, kmode = odd < 3 ? 0 : fz_u8(&in) % 8;
    if (qmode == 5 && Hq > 0) { /* q_pe and k_pe: heads of one [T, Hq + 1, Dr] buffer */
        int64_t ps[3] = {T, Hq + 1, Dr};
        int p = fz_view_new(&w, &in, "q_pe|k_pe", fz_ftype(&in), 3, ps, FZ_NONE);
        a.q = fz_view_narrow(&w, p, "q_pe", 1, 0, Hq, FZ_OUT);
        int64_t h = fz_u8(&in) % 4 ? Hq : fz_range(&in, 0, Hq - 1); /* a head of q_pe: overlap */
        a.k = fz_view_select(&w, p, "k_pe", 1, h, FZ_OUT);
        int64_t ks[2] = {T, Dl};
        a.kv = fz_view_new(&w, &in, "kv_c", fz_ftype(&in), 2, ks, FZ_IN);
    } else {
        if (qmode == 4) { /* q_pe: the rope part of q [T, Hq, Dn + Dr] */
            int64_t Dn = fz_range(&in, 0, 8), ps[3] = {T, Hq, Dn + Dr};
            int p = fz_view_new(&w, &in, "q", fz_ftype(&in), 3, ps, FZ_NONE);
            a.q = fz_view_narrow(&w, p, "q_pe", 2, Dn, Dr, FZ_OUT);
        } else {
            int64_t qs[3] = {Tq, Hq, Dq};
            a.q = fz_view_new(&w, &in, "q_pe", fz_ftype(&in), 3, qs, FZ_OUT);
        }
        if (kmode >= 4 && kmode <= 6) { /* kv_a [T, Dl + Dr]: kv_c | k_pe (sometimes k_pe over kv_c) */
            int over = kmode == 6 && Dl > 0 && fz_u8(&in) < 128;
            int64_t ps[2] = {T, Dl + Dr}, k0 = over ? Dl - 1 - fz_range(&in, 0, Dl - 1) : Dl;
            int p = fz_view_new(&w, &in, "kv_a", fz_ftype(&in), 2, ps, FZ_NONE);
            a.kv = fz_view_narrow(&w, p, "kv_c", 1, 0, Dl, FZ_IN);
            a.k = fz_view_narrow(&w, p, "k_pe", 1, k0, Dr, FZ_OUT);
        } else if (kmode == 7 && fz_u8(&in) < 128) { /* k_pe is kv_c */
            Dl = Dr;
            int64_t ks[2] = {T, Dl};
            a.kv = fz_view_new(&w, &in, "kv_c", fz_ftype(&in), 2, ks, FZ_IN);
            a.k = fz_view_alias(&w, a.kv, "k_pe", FZ_OUT);
            w.v[a.k].inplace_of = -1;
        } else {
            int64_t ks[2] = {T, Dl}, ps[2] = {Tk, Dr};
            a.kv = fz_view_new(&w, &in, "kv_c", fz_ftype(&in), 2, ks, FZ_IN);
            a.k = fz_view_new(&w, &in, "k_pe", fz_ftype(&in), 2, ps, FZ_OUT);
        }
    }
    /* ---- cos_sin_cache, positions [P] (the first T values read) */
    int64_t cs_shape[2] = {max_pos, rot};
    a.cs = fz_view_new(&w, &in, "cos_sin_cache", fz_ftype(&in), 2, cs_shape, FZ_IN);
    a.pos = fz_view_new(&w, &in, "positions", fz_u8(&in) & 1 ? LK_I64 : LK_I32, 1, &P, FZ_IDX);

    /* ---- caches */
    lk_dtype ct = cache_type(&in);
    unsigned two = fz_u8(&in) % 4;
    if (two == 0) { /* one cache holding both parts */
        a.c0 = cache_view(&w, &in, "kv_c_cache", ct, nz, NB, bs, Dl + Dr, fz_u8(&in) & 1);
    } else if (two == 1) { /* k_pe_cache is kv_c_cache */
        if (nz && (Dl % tile_of(ct) || Dr % tile_of(ct))) fz_fail_expected(&w, "NZ width not a multiple of the tile");
        a.c0 = cache_view(&w, &in, "kv_c_cache", ct, nz, NB, bs, Dl, 0);
        a.c1 = fz_view_alias(&w, a.c0, "k_pe_cache", FZ_OUT);
        w.v[a.c1].inplace_of = -1;
        if (Dl != Dr) fz_fail_expected(&w, "k_pe_cache's width differs");
    } else {
        if (nz && Dl % tile_of(ct)) fz_fail_expected(&w, "NZ width not a multiple of the tile");
        a.c0 = cache_view(&w, &in, "kv_c_cache", ct, nz, NB, bs, Dl, 0);
        int64_t NB1 = NB, bs1 = bs;
        if (fz_chance(&in, 8)) {
            if (fz_u8(&in) & 1) NB1 += 1;
            else bs1 += 1;
            fz_fail_expected(&w, "k_pe_cache's num_blocks or block_size differ");
        }
        lk_dtype ct1 = cache_type(&in);
        if (nz && Dr % tile_of(ct1)) fz_fail_expected(&w, "NZ width not a multiple of the tile");
        a.c1 = cache_view(&w, &in, "k_pe_cache", ct1, nz, NB1, bs1, Dr, 0);
    }
    a.sm = fz_view_new(&w, &in, "slot_mapping", fz_u8(&in) & 1 ? LK_I64 : LK_I32, 1, &N, FZ_IDX);
    a.scale = scale_view(&w, &in);

    /* ---- pack: a buffer moved into (or next to) a written one's, or the other way */
    int packed = 0;
    if (fz_chance(&in, 56)) {
        const int outs[4] = {a.q, a.k, a.c0, a.c1};
        const int any[9] = {a.pos, a.q, a.k, a.kv, a.cs, a.sm, a.scale, a.c0, a.c1};
        int x = outs[fz_u8(&in) % 4], y = any[fz_u8(&in) % 9];
        if (x >= 0 && y >= 0 && w.v[x].arena != w.v[y].arena && w.a[w.v[x].arena].n && w.a[w.v[y].arena].n) {
            int ax = w.v[x].arena, ay = w.v[y].arena;
            if (fz_u8(&in) & 1) ax = w.v[y].arena, ay = w.v[x].arena; /* the written one moved */
            size_t nx = w.a[ax].n, k = (size_t)fz_range(&in, 0, 9);
            size_t off = k == 9 ? (nx + 7) / 8 * 8 : k * nx / 8 / 8 * 8; /* 9: right after */
            int from_y[FZ_MAX_VIEWS];
            for (int v = 0; v < w.nv; v++) from_y[v] = w.v[v].arena == ay;
            pack(&w, ax, ay, off);
            packed = 1;
            /* extents that meet (a view of each buffer): lk_check_disjoint may reject
             * disjoint bytes */
            for (int u = 0; u < w.nv; u++)
                for (int v = 0; v < w.nv; v++) {
                    if (from_y[u] || !from_y[v] || w.v[u].arena != ax || !fz_usable(&w, u) || !fz_usable(&w, v))
                        continue;
                    size_t l0, h0, l1, h1;
                    byte_range(&w, u, &l0, &h0);
                    byte_range(&w, v, &l1, &h1);
                    if (l0 < h1 && l1 < h0) w.clean = 0;
                }
        }
    }

    /* ---- values (indices and scale last: an overlapping float fill may not change them),
     * then the index and scale rules from what is stored */
    fz_fill(&w, a.q, -4, 4);
    fz_fill(&w, a.k, -4, 4);
    fz_fill(&w, a.kv, -4, 4);
    fz_fill(&w, a.cs, -1, 1);
    int64_t pv[136], sv[136], nslots = NB * bs; /* P <= 133, N <= 131 */
    for (int64_t t = 0; t < P; t++) pv[t] = max_pos ? (int64_t)(fz_next(&w.rng) % (uint64_t)max_pos) : 0;
    fz_idx_fill(&w, &in, a.pos, pv, P, max_pos);
    fz_slot_values(&w, &in, sv, N, nslots);
    fz_idx_fill(&w, &in, a.sm, sv, N, nslots);
    scale_fill(&w, &in, a.scale);
    if (fz_usable(&w, a.pos))
        for (int64_t t = 0; t < P && t < Tq; t++) {
            int64_t v = fz_idx_get(&w, a.pos, t);
            if (v < 0 || v >= max_pos) fz_fail_expected(&w, "position out of range");
        }
    fz_check_slots(&w, a.sm, N, nslots);
    if (a.scale >= 0 && fz_usable(&w, a.scale)) {
        const lk_tensor *t = &w.v[a.scale].t;
        for (int64_t i = 0, n = fz_numel(t); i < n; i++) {
            float x = ((const float *)t->data)[fz_off(t, i)];
            if (!(x > 0 && x <= 3.40282347e38f)) fz_fail_expected(&w, "scale not finite > 0");
        }
    }

    /* bit for bit where no NaN can arise (the sign of a NaN the rotation makes is not
     * specified, and reaches the cache through k_pe); else by value, exactly: NaN = NaN */
    if (w.special_rate > 0 || packed) {
        const int outs[4] = {a.q, a.k, a.c0, a.c1};
        for (int i = 0; i < 4; i++)
            if (outs[i] >= 0) {
                fz_tol(&w, outs[i], 0.0);
                w.v[outs[i]].atol = w.v[outs[i]].rtol = 0.0;
            }
    }
    if (fz_chance(&in, 4)) {
        int *req[7] = {&a.pos, &a.q, &a.k, &a.kv, &a.cs, &a.c0, &a.sm};
        *req[fz_u8(&in) % 7] = -1;
        fz_fail_expected(&w, "NULL tensor pointer");
    }
    if (bad_layout) a.layout = fz_u8(&in) & 1 ? 2 : -1;
    fz_run(&w, call, &a);
    fz_free(&w);
    return 0;
}
