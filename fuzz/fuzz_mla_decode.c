/*
 * Fuzz harness: lk_mla_decode and lk_mla_decode_plan (see fuzz_common.h for the
 * checks). Input: batch (0..3 requests), per-request cache lengths (0..20), s_q (1..3),
 * heads (1..5), latent / rope dims (0 too), one or two cache buffers, ND or NZ (block
 * size, pages, block table with unused tail entries, an empty cache), fp8 caches (e4m3 /
 * e5m2, the 32-wide NZ tile, k_scale with bad values; a non-fp8 k_pe_cache beside an fp8
 * kv_c_cache; latent dim 64 in ND too, the amx row's 64-code order), lse present or
 * NULL, params (scale, causal, split_keys, layout; out-of-domain values too), index
 * tensors i32/i64 with injected bad values (validated here from the stored values:
 * lengths negative or beyond the block table, block ids of read pages outside
 * [0, num_blocks), causal with 0 < length < s_q), out aliasing q, NULL pointers. out is
 * compared with the ref within the suite's vs-ref tolerance, lse within 1e-4; then the
 * plan call on the same lengths.
 */
#include "fuzz_common.h"


typedef struct {
    int out, lse, q, kv, pe, table, lens, null_params;
    lk_mla_decode_params p;
} dec_attrs;

static lk_status call(const fz_world *w, const void *ap) {
    const dec_attrs *a = ap;
    return lk_mla_decode(fz_t(w, a->out), fz_t(w, a->lse), fz_t(w, a->q), fz_t(w, a->kv), fz_t(w, a->pe),
                         fz_t(w, a->table), fz_t(w, a->lens), a->null_params ? NULL : &a->p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_in in = {data, size, 0};
    fz_world w;
    fz_init(&w, &in, "lk_mla_decode");
    dec_attrs a;
    memset(&a, 0, sizeof a);
    a.lse = a.pe = -1;
    int64_t B = fz_range(&in, 0, 3), len[3];
    for (int64_t b = 0; b < B; b++) len[b] = fz_range(&in, 0, 20);
    int64_t s_q = fz_range(&in, 1, 3), H = fz_range(&in, 1, 5);
    int nz = fz_u8(&in) & 1, two = fz_u8(&in) % 3 == 0;
    lk_dtype f8 = fz_chance(&in, 64) ? (fz_u8(&in) & 1 ? LK_F8E5M2 : LK_F8E4M3) : LK_F32; /* an fp8 cache */
    int fp8 = f8 != LK_F32;
    int64_t Dl, Dr, tl = fp8 ? 32 : 16; /* NZ tile: 32 for fp8 */
    if (nz) {
        Dl = tl * fz_range(&in, 1, 2), Dr = tl * fz_range(&in, two ? 1 : 0, 1);
    } else {
        Dl = fz_dim(&in, 24), Dr = fz_range(&in, 0, 9);
        if (fp8 && fz_chance(&in, 64)) Dl = 64; /* the amx row's 64-code widening (Dl a multiple of 64) */
        if (Dl == 0) fz_fail_expected(&w, "latent dim 0");
        if (two && Dr == 0) fz_fail_expected(&w, "two buffers without rope dims");
    }
    int64_t E = Dl + Dr;
    lk_dtype qt = fz_ftype(&in), ct = fz_ftype(&in), rt = fz_ftype(&in), ot = fz_ftype(&in);
    if (fz_chance(&in, fp8 ? 96 : 40)) qt = ct = rt = ot = LK_BF16; /* the bf16 dot-product (and tile) path */
    if (fp8) {
        ct = rt = f8;
        if (two && fz_chance(&in, 16)) rt = LK_BF16, fz_fail_expected(&w, "fp8 kv_c_cache with a non-fp8 k_pe_cache");
    }
    int64_t qs[4] = {B, s_q, H, E}, os[4] = {B, s_q, H, Dl}, ls[3] = {B, H, s_q};
    a.q = fz_view_new(&w, &in, "q", qt, 4, qs, FZ_IN);
    if (fz_u8(&in) % 10 == 0 && Dr == 0) { /* out is q */
        a.out = fz_view_alias(&w, a.q, "out", FZ_OUT);
        w.v[a.out].inplace_of = -1;
    } else {
        a.out = fz_view_new(&w, &in, "out", ot, 4, os, FZ_OUT);
    }
    fz_tol(&w, a.out, 3e-5);
    w.v[a.out].nonfinite_any = 1; /* infinite V with an underflowing weight (docs/numerics.md) */
    if (fz_u8(&in) % 3) {
        lk_dtype lt = LK_F32;
        if (fz_chance(&in, 4)) lt = LK_F16, fz_fail_expected(&w, "lse not f32");
        a.lse = fz_view_new(&w, &in, "lse", lt, 3, ls, FZ_OUT);
        fz_tol(&w, a.lse, 1e-4);
    }
    int64_t bs = 1 + (int64_t)(fz_u8(&in) % 5), NB = 1 + (int64_t)(fz_u8(&in) % 8), maxp = 0;
    if (fz_chance(&in, 8)) { /* an empty cache */
        NB = 0;
        if (fz_u8(&in) & 1) bs = 0;
    }
    for (int64_t b = 0; b < B; b++)
        if (bs > 0 && (len[b] + bs - 1) / bs > maxp) maxp = (len[b] + bs - 1) / bs;
    maxp += fz_range(&in, 0, 1);
    int64_t D0 = two ? Dl : E;
    if (nz) {
        int64_t ks[4] = {NB, D0 / tl, bs, tl}, ps[4] = {NB, Dr / tl, bs, tl};
        a.kv = fz_view_new(&w, &in, "kv_c_cache", ct, 4, ks, FZ_IN);
        if (two) a.pe = fz_view_new(&w, &in, "k_pe_cache", rt, 4, ps, FZ_IN);
    } else if (fz_u8(&in) & 1) {
        int64_t ks[3] = {NB, bs, D0}, ps[3] = {NB, bs, Dr};
        a.kv = fz_view_new(&w, &in, "kv_c_cache", ct, 3, ks, FZ_IN);
        if (two) a.pe = fz_view_new(&w, &in, "k_pe_cache", rt, 3, ps, FZ_IN);
    } else {
        int64_t ks[4] = {NB, bs, 1, D0}, ps[4] = {NB, bs, 1, Dr};
        a.kv = fz_view_new(&w, &in, "kv_c_cache", ct, 4, ks, FZ_IN);
        if (two) a.pe = fz_view_new(&w, &in, "k_pe_cache", rt, 4, ps, FZ_IN);
    }
    /* a view retyped fp8 by fz_view_new's bad-dtype draw (or an fp8 cache retyped to the
     * other fp8 format) may be a valid fp8 cache now: such inputs are left out rather
     * than expected to fail */
    if ((fz_is_fp8(w.v[a.kv].t.dtype) && w.v[a.kv].t.dtype != ct) ||
        (two && fz_is_fp8(w.v[a.pe].t.dtype) && w.v[a.pe].t.dtype != rt)) {
        fz_free(&w);
        return 0;
    }
    a.p = lk_mla_decode_params_default(0.3f);
    if (fp8) { /* k_scale: out-of-domain values too */
        static const float KS[6] = {1.0f, 0.0625f, 3.0f, 0.0f, -1.0f, NAN};
        unsigned k = fz_u8(&in) % 6;
        a.p.k_scale = KS[k];
        if (k >= 3) fz_fail_expected(&w, "k_scale not finite > 0");
    } else if (fz_chance(&in, 16)) {
        a.p.k_scale = NAN; /* not read without an fp8 cache */
    }
    a.p.cache_layout = nz ? LK_KV_NZ : LK_KV_ND;
    a.p.causal = (int)(fz_u8(&in) % 2);
    int64_t ts[2] = {B, maxp};
    a.table = fz_view_new(&w, &in, "block_table", fz_chance(&in, 4) ? LK_I64 : LK_I32, 2, ts, FZ_IDX);
    int64_t tv[3 * 21];
    for (int64_t i = 0; i < B * maxp; i++) tv[i] = NB ? (int64_t)(fz_next(&w.rng) % (uint64_t)NB) : -1;
    fz_idx_fill(&w, &in, a.table, tv, B * maxp, NB);
    a.lens = fz_view_new(&w, &in, "cache_seqlens", fz_u8(&in) & 1 ? LK_I64 : LK_I32, 1, &B, FZ_IDX);
    fz_idx_fill(&w, &in, a.lens, len, B, maxp * bs + 1);
    /* an empty block table (no pages) is not usable but still bounds the lengths */
    int tab_ok = fz_usable(&w, a.table), tab_empty = a.table >= 0 && maxp == 0 && !fz_view_invalid(&w.v[a.table].t);
    if (fz_usable(&w, a.lens) && (tab_ok || tab_empty))
        for (int64_t b = 0; b < B; b++) {
            int64_t u = fz_idx_get(&w, a.lens, b);
            if (u < 0 || u > maxp * bs) {
                fz_fail_expected(&w, "cache_seqlens beyond the block table");
                continue;
            }
            if (a.p.causal && u > 0 && u < s_q) fz_fail_expected(&w, "causal with fewer cached tokens than queries");
            for (int64_t j = 0; tab_ok && bs > 0 && j < (u + bs - 1) / bs; j++) {
                int64_t pg = fz_idx_get(&w, a.table, b * maxp + j);
                if (pg < 0 || pg >= NB) fz_fail_expected(&w, "block_table entry outside the cache");
            }
        }
    static const float SC[8] = {0.25f, 0.5f, 1.0f, 0.0f, -0.3f, 0.125f, NAN, INFINITY};
    unsigned si = fz_u8(&in) % 8;
    a.p.scale = SC[si];
    if (si >= 6) fz_fail_expected(&w, "scale not finite");
    static const int64_t SK[6] = {0, 0, 1, 3, 5, -1};
    unsigned ki = fz_u8(&in) % 6;
    a.p.split_keys = SK[ki];
    if (ki == 5) fz_fail_expected(&w, "split_keys < 0");
    if (fz_chance(&in, 4)) {
        a.p.cache_layout = (lk_kv_layout)7;
        fz_fail_expected(&w, "unknown cache layout");
    }
    fz_fill(&w, a.q, -2, 2);
    fz_fill(&w, a.kv, -2, 2);
    if (two) fz_fill(&w, a.pe, -2, 2);
    /* an fp8 cache keeps its codes (up to 448 / 57344): the scores' f32 error, E 2^-24
     * sum |q_e c_e| times scale k_scale, moves lse by as much and out by twice that times
     * max |v| k_scale (fuzz_attention's bound) */
    if (fp8 && isfinite(a.p.k_scale) && a.p.k_scale > 0) {
        double mc = fz_maxabs(&w, a.kv), mp = two ? fz_maxabs(&w, a.pe) : 0, E = (double)(Dl + Dr);
        double ds = E * ldexp(1.0, -24) * fabs((double)a.p.scale) * a.p.k_scale * fz_maxabs(&w, a.q) * (mc > mp ? mc : mp) * E;
        if (isfinite(ds)) {
            if (a.lse >= 0) w.v[a.lse].atol += ds;
            w.v[a.out].atol += 2.0 * ds * mc * a.p.k_scale;
        }
    }
    if (fz_chance(&in, 3)) a.null_params = 1, fz_fail_expected(&w, "NULL params");
    if (fz_chance(&in, 4)) {
        unsigned k = fz_u8(&in) % 5;
        if (k == 0) a.out = -1;
        else if (k == 1) a.q = -1;
        else if (k == 2) a.kv = -1;
        else if (k == 3) a.table = -1;
        else a.lens = -1;
        fz_fail_expected(&w, "NULL tensor pointer");
    }
    fz_run(&w, call, &a);
    /* the plan on the same lengths: valid iff they are all >= 0 */
    if (a.lens >= 0 && fz_usable(&w, a.lens)) {
        int64_t sk = -7, neg = 0;
        for (int64_t b = 0; b < B; b++) neg |= fz_idx_get(&w, a.lens, b) < 0;
        lk_status st = lk_mla_decode_plan(fz_t(&w, a.lens), &sk);
        if (neg ? st != LK_ERR_INDEX || sk != -7 : st != LK_OK || sk < 512 || sk % 64)
            fz_report(&w, "lk_mla_decode_plan: status %s, split %lld", lk_status_str(st), (long long)sk);
    }
    fz_free(&w);
    return 0;
}
