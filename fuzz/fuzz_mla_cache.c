/*
 * Fuzz harness: lk_concat_and_cache_mla and lk_gather_cache (see fuzz_common.h for the
 * checks). concat: T, Dl, Dr (0 too), one cache or two, ND (3-D or 4-D) or NZ
 * physical views (widths that are and are not multiples of 16), slot_mapping i32/i64
 * with padding, out-of-range values and duplicates (re-validated here from the stored
 * values), the k_pe cache aliasing the kv_c cache. gather: batch, seq_lens (i32; i64
 * rejected) with negative / too long values, block_table (i32) entries in and outside
 * [0, num_blocks) for pages that are and are not read, empty caches (block size 0
 * too), out [S, C] or [S, H, D], ND / NZ caches, out rows not matching sum(seq_lens).
 * A third of the inputs call the _fp8 entries instead: caches of any float dtype incl.
 * e4m3 / e5m2 (NZ tiles 32 wide for them), a scale tensor ([1], [], a wrong length,
 * NULL; bad values among them), fp8 out of a cache of the same dtype (or another:
 * rejected); half of those call lk_gather_cache_starts: seq_starts i32 (i64 rejected) or
 * NULL, offsets across pages, negative ones and ones past the block table with the
 * request's length (rejected). Results are compared bit for bit.
 */
#include "fuzz_common.h"

typedef struct {
    int gather, layout;
    int fp8, scale;                     /* the _fp8 entries and their scale (-1: NULL) */
    int kv_c, k_pe, c0, c1, sm;         /* concat */
    int out, cache, table, lens;        /* gather */
    int use_starts, starts;             /* lk_gather_cache_starts and its seq_starts (-1: NULL) */
} mla_attrs;

static lk_status call(const fz_world *w, const void *ap) {
    const mla_attrs *a = ap;
    if (a->fp8 && !a->gather)
        return lk_concat_and_cache_mla_fp8(fz_t(w, a->kv_c), fz_t(w, a->k_pe), fz_t(w, a->c0), fz_t(w, a->c1),
                                           fz_t(w, a->sm), (lk_kv_layout)a->layout, fz_t(w, a->scale));
    if (a->fp8 && a->use_starts == 1)
        return lk_gather_cache_starts(fz_t(w, a->out), fz_t(w, a->cache), fz_t(w, a->table), fz_t(w, a->lens),
                                      fz_t(w, a->starts), (lk_kv_layout)a->layout, fz_t(w, a->scale));
    if (a->fp8)
        return lk_gather_cache_fp8(fz_t(w, a->out), fz_t(w, a->cache), fz_t(w, a->table), fz_t(w, a->lens),
                                   (lk_kv_layout)a->layout, fz_t(w, a->scale));
    if (!a->gather)
        return lk_concat_and_cache_mla(fz_t(w, a->kv_c), fz_t(w, a->k_pe), fz_t(w, a->c0), fz_t(w, a->c1),
                                       fz_t(w, a->sm), (lk_kv_layout)a->layout);
    return lk_gather_cache(fz_t(w, a->out), fz_t(w, a->cache), fz_t(w, a->table), fz_t(w, a->lens),
                           (lk_kv_layout)a->layout);
}

static int g_fp8; /* this input calls an _fp8 entry */

/* fz_view_new; for an argument of an _fp8 entry that takes fp8, its rare retype to fp8
 * is no error of its own (the op decides; the input is then just not clean) */
static int view8(fz_world *w, fz_in *in, const char *name, lk_dtype dt, int nd, const int64_t *shape, int role) {
    int vi = fz_view_new(w, in, name, dt, nd, shape, role);
    fz_view *v = &w->v[vi];
    if (g_fp8 && v->bad && fz_is_fp8(v->t.dtype) && !fz_view_invalid(&v->t))
        v->bad = 0, w->must_fail = 0, w->clean = 0; /* the earlier expectations assumed dt */
    return vi;
}

static int tile_of(lk_dtype dt) { return lk_dtype_size(dt) == 1 ? 32 : 16; }

/* a cache view of `width` entry dims: ND [NB, bs, width] (or [NB, bs, H, width / H]
 * with h4), NZ [NB, width / tile, bs, tile] (tile 32 for fp8, else 16); a width that
 * NZ cannot hold must be rejected */
static int cache_view(fz_world *w, fz_in *in, const char *name, lk_dtype dt, int nz, int64_t NB,
                      int64_t bs, int64_t H, int64_t width, int h4) {
    if (nz) {
        int64_t t = tile_of(dt);
        if (width % t) fz_fail_expected(w, "NZ width not a multiple of the tile");
        int64_t s[4] = {NB, width / t, bs, t};
        return view8(w, in, name, dt, 4, s, FZ_OUT);
    }
    if (h4) {
        int64_t s[4] = {NB, bs, H, H ? width / H : 0};
        return view8(w, in, name, dt, 4, s, FZ_OUT);
    }
    int64_t s[3] = {NB, bs, width};
    return view8(w, in, name, dt, 3, s, FZ_OUT);
}

/* a cache dtype: float, or (fp8 entries) fp8 as well */
static lk_dtype cache_type(fz_in *in) {
    if (g_fp8 && fz_u8(in) & 1) return fz_u8(in) & 1 ? LK_F8E5M2 : LK_F8E4M3;
    return fz_ftype(in);
}

/* random bytes in the elements of an fp8 view (fz_fill fills float views only) */
static void fill8(fz_world *w, int vi) {
    if (vi < 0 || !fz_usable(w, vi) || !fz_is_fp8(w->v[vi].t.dtype)) return;
    int64_t n = fz_numel(&w->v[vi].t);
    for (int64_t i = 0; i < n; i++) ((unsigned char *)w->v[vi].t.data)[fz_off(&w->v[vi].t, i)] = (unsigned char)fz_next(&w->rng);
}

/* the scale of an _fp8 entry: f32 [1] or [] with a value from a list (bad ones too),
 * a wrong length, or -1 (NULL) */
static int scale_view(fz_world *w, fz_in *in) {
    static const float SC[] = {1.0f, 0.03125f, 3.7f, 1e-30f, 1e30f, 0.0f, -1.0f, NAN, INFINITY};
    unsigned k = fz_u8(in) % 6;
    if (k == 0) return -1;
    int64_t n = k == 5 ? 2 : 1;
    if (n != 1) fz_fail_expected(w, "scale of 2 values");
    int vi = fz_view_new(w, in, "scale", LK_F32, 1, &n, FZ_IN);
    if (k == 1 && !w->v[vi].bad) w->v[vi].t.ndim = 0;
    if (!fz_usable(w, vi)) return vi;
    float *d = w->v[vi].t.data;
    for (int64_t i = 0; i < n; i++) d[fz_off(&w->v[vi].t, i)] = SC[fz_u8(in) % 9];
    for (int64_t i = 0; i < n; i++) { /* judged from the stored values (a view may broadcast) */
        float x = d[fz_off(&w->v[vi].t, i)];
        if (!(x > 0 && x <= 3.40282347e38f)) fz_fail_expected(w, "scale not finite > 0");
    }
    return vi;
}

static void concat(fz_world *w, fz_in *in, mla_attrs *a) {
    w->op = g_fp8 ? "lk_concat_and_cache_mla_fp8" : "lk_concat_and_cache_mla";
    int nz = a->layout == LK_KV_NZ;
    int64_t T = fz_dim(in, 6), NB = fz_dim(in, 4), bs = fz_dim(in, 4), N = fz_range(in, 0, T);
    int64_t Dl = nz ? 16 * fz_range(in, 0, 2) + (fz_chance(in, 16) ? 8 : 0) : fz_dim(in, 40);
    int64_t Dr = nz ? 16 * fz_range(in, 0, 1) + (fz_chance(in, 16) ? 8 : 0) : fz_dim(in, 20);
    if (bs == 0 && NB > 0) fz_fail_expected(w, "block_size 0");
    int64_t ks[2] = {T, Dl}, ps[2] = {T, Dr};
    if (fz_chance(in, 6)) {
        ps[0] += 1;
        fz_fail_expected(w, "k_pe's tokens differ from kv_c's");
    }
    a->kv_c = fz_view_new(w, in, "kv_c", fz_ftype(in), 2, ks, FZ_IN);
    a->k_pe = fz_view_new(w, in, "k_pe", fz_ftype(in), 2, ps, FZ_IN);
    lk_dtype ct = cache_type(in);
    unsigned two = fz_u8(in) % 4;
    if (two == 0) { /* one cache holding both parts */
        a->c0 = cache_view(w, in, "kv_c_cache", ct, nz, NB, bs, 1, Dl + Dr, fz_u8(in) & 1);
        a->c1 = -1;
    } else if (two == 1) { /* k_pe_cache is kv_c_cache */
        if (nz && (Dl % tile_of(ct) || Dr % tile_of(ct))) fz_fail_expected(w, "NZ width not a multiple of the tile");
        a->c0 = cache_view(w, in, "kv_c_cache", ct, nz, NB, bs, 1, Dl, 0);
        a->c1 = fz_view_alias(w, a->c0, "k_pe_cache", FZ_OUT);
        w->v[a->c1].inplace_of = -1;
        if (Dl != Dr) fz_fail_expected(w, "k_pe_cache's width differs");
    } else {
        if (nz && Dl % tile_of(ct)) fz_fail_expected(w, "NZ width not a multiple of the tile");
        a->c0 = cache_view(w, in, "kv_c_cache", ct, nz, NB, bs, 1, Dl, 0);
        int64_t NB1 = NB;
        if (fz_chance(in, 6)) {
            NB1 += 1;
            fz_fail_expected(w, "k_pe_cache's num_blocks differ");
        }
        a->c1 = cache_view(w, in, "k_pe_cache", cache_type(in), nz, NB1, bs, 1, Dr, 0);
    }
    a->sm = fz_view_new(w, in, "slot_mapping", fz_u8(in) & 1 ? LK_I64 : LK_I32, 1, &N, FZ_IDX);
    int64_t nslots = NB * bs, sv[6];
    fz_slot_values(w, in, sv, N, nslots);
    fz_idx_fill(w, in, a->sm, sv, N, nslots);
    fz_check_slots(w, a->sm, N, nslots);
    fz_fill(w, a->kv_c, -4, 4);
    fz_fill(w, a->k_pe, -4, 4);
    if (fz_chance(in, 4)) {
        unsigned k = fz_u8(in) % 4;
        if (k == 0) a->kv_c = -1;
        else if (k == 1) a->k_pe = -1;
        else if (k == 2) a->c0 = -1;
        else a->sm = -1;
        fz_fail_expected(w, "NULL tensor pointer");
    }
}

static void gather(fz_world *w, fz_in *in, mla_attrs *a) {
    a->use_starts = g_fp8 && (fz_u8(in) & 1); /* half of the _fp8 inputs: lk_gather_cache_starts */
    w->op = a->use_starts ? "lk_gather_cache_starts" : g_fp8 ? "lk_gather_cache_fp8" : "lk_gather_cache";
    int nz = a->layout == LK_KV_NZ;
    int64_t B = fz_range(in, 0, 3), bs = 1 + (int64_t)(fz_u8(in) % 4), NB = 1 + (int64_t)(fz_u8(in) % 6);
    if (fz_chance(in, 8)) { /* an empty cache, [0, 0, ..] (block_size 0) too */
        NB = 0;
        if (fz_u8(in) & 1) bs = 0;
    }
    int64_t H = 1 + (int64_t)(fz_u8(in) % 3), D;
    if (nz) D = H == 3 ? 16 : 16 / H * (1 + (int64_t)(fz_u8(in) % 2));
    else D = fz_dim(in, 20);
    int64_t C = H * D, len[3], st[3] = {0, 0, 0}, S = 0, maxp = 0;
    for (int64_t b = 0; b < B; b++) {
        len[b] = fz_range(in, 0, 10);
        if (a->use_starts) st[b] = fz_range(in, 0, 9); /* any offset, across pages */
        S += len[b];
        if (bs > 0 && (st[b] + len[b] + bs - 1) / bs > maxp) maxp = (st[b] + len[b] + bs - 1) / bs;
    }
    maxp += fz_range(in, 0, 1);
    if (fz_chance(in, 6)) S += 1; /* judged below from the stored seq_lens */
    lk_dtype ot = fz_ftype(in), ct = cache_type(in);
    if (g_fp8 && fz_is_fp8(ct) && fz_u8(in) % 4 == 0) ot = ct; /* bit copy */
    if (g_fp8 && fz_chance(in, 8)) {
        ot = fz_u8(in) & 1 ? LK_F8E4M3 : LK_F8E5M2;
        if (ot != ct) fz_fail_expected(w, "fp8 out of a cache of another dtype");
    }
    unsigned shape3 = fz_u8(in) % 3;
    if (shape3 == 0) { /* out [S, H, D] */
        int64_t s[3] = {S, H, D};
        a->out = view8(w, in, "out", ot, 3, s, FZ_OUT);
    } else { /* out [S, C] */
        int64_t s[2] = {S, C};
        a->out = view8(w, in, "out", ot, 2, s, FZ_OUT);
    }
    int h4 = !nz && (fz_u8(in) & 1);
    if (!nz && shape3 != 0 && !h4) H = 1, D = C; /* 2-D out and 3-D ND cache: one head of C */
    a->cache = cache_view(w, in, "cache", ct, nz, NB, bs, H, C, h4);
    w->v[a->cache].role = FZ_IN;
    int64_t ts[2] = {B, maxp};
    lk_dtype tdt = LK_I32, ldt = LK_I32;
    if (fz_chance(in, 4)) tdt = LK_I64, fz_fail_expected(w, "block_table not i32");
    if (fz_chance(in, 4)) ldt = LK_I64, fz_fail_expected(w, "seq_lens not i32");
    a->table = fz_view_new(w, in, "block_table", tdt, 2, ts, FZ_IDX);
    a->lens = fz_view_new(w, in, "seq_lens", ldt, 1, &B, FZ_IDX);
    int starts_ok = 1;
    if (a->use_starts && fz_u8(in) % 8) { /* seq_starts (else NULL: no offsets) */
        lk_dtype sdt = LK_I32;
        if (fz_chance(in, 4)) sdt = LK_I64, fz_fail_expected(w, "seq_starts not i32");
        a->starts = fz_view_new(w, in, "seq_starts", sdt, 1, &B, FZ_IDX);
        fz_idx_fill(w, in, a->starts, st, B, maxp * bs + 1);
        starts_ok = !w->v[a->starts].bad;
    } else
        for (int64_t b = 0; b < B; b++) st[b] = 0;
    int64_t tv[3 * 21]; /* B <= 3, maxp <= (9 + 10) / 1 + 1 (seq_starts up to 9) */
    for (int64_t i = 0; i < B * maxp; i++) tv[i] = NB ? (int64_t)(fz_next(&w->rng) % (uint64_t)NB) : -1;
    fz_idx_fill(w, in, a->table, tv, B * maxp, NB);
    fz_idx_fill(w, in, a->lens, len, B, maxp * bs + 1);
    if (!w->v[a->lens].bad && !w->v[a->table].bad && starts_ok) { /* from the stored values (views may broadcast) */
        int64_t sum = 0;
        for (int64_t b = 0; b < B; b++) {
            int64_t l = fz_idx_get(w, a->lens, b), s0 = a->starts >= 0 ? fz_idx_get(w, a->starts, b) : 0;
            if (l < 0 || l > maxp * bs) {
                fz_fail_expected(w, "seq_lens out of range");
                continue;
            }
            if (s0 < 0 || s0 > maxp * bs - l) {
                fz_fail_expected(w, "seq_starts out of range (with the request's length)");
                continue;
            }
            sum += l;
            for (int64_t j = l ? s0 / bs : 0; bs > 0 && l > 0 && j < (s0 + l + bs - 1) / bs; j++) {
                int64_t pg = fz_idx_get(w, a->table, b * maxp + j);
                if (pg < 0 || pg >= NB) fz_fail_expected(w, "block_table entry outside the cache");
            }
        }
        if (sum != S) fz_fail_expected(w, "out's rows differ from sum(seq_lens)");
    }
    fz_fill(w, a->cache, -4, 4);
    fill8(w, a->cache);
    if (fz_chance(in, 4)) {
        unsigned k = fz_u8(in) % 4;
        if (k == 0) a->out = -1;
        else if (k == 1) a->cache = -1;
        else if (k == 2) a->table = -1;
        else a->lens = -1;
        fz_fail_expected(w, "NULL tensor pointer");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_in in = {data, size, 0};
    fz_world w;
    fz_init(&w, &in, "mla_cache");
    mla_attrs a;
    memset(&a, 0xff, sizeof a); /* every view index -1 */
    a.gather = fz_u8(&in) & 1;
    unsigned lay = fz_u8(&in) % 16;
    a.layout = lay < 7 ? LK_KV_ND : lay < 15 ? LK_KV_NZ : 2;
    if (a.layout == 2) {
        fz_fail_expected(&w, "unknown layout");
        a.layout = fz_u8(&in) & 1 ? 2 : -1;
    }
    int lay_for_views = a.layout;
    if (lay_for_views != LK_KV_ND && lay_for_views != LK_KV_NZ) a.layout = LK_KV_ND;
    a.fp8 = g_fp8 = fz_u8(&in) % 3 == 0;
    if (a.fp8) a.scale = scale_view(&w, &in);
    if (a.gather) gather(&w, &in, &a);
    else concat(&w, &in, &a);
    a.layout = lay_for_views;
    fz_run(&w, call, &a);
    fz_free(&w);
    return 0;
}
