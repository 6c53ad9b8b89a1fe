/*
 * lk_swap_blocks and lk_copy_blocks: every ISA against the expected blocks (the source
 * values read through tu_get), dense caches (the SIMD run copy), padded and permuted
 * views (the reference), MLA caches [NB, bs, Dl + Dr] and 1-D caches, every dtype bits,
 * threads, empty mappings, and the bad-input catalogue (indices, duplicate or chained
 * destinations, shapes, dtypes, overlaps, NULL), nothing written on error.
 */
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* every element of block db of d equals block sb of s (bit for bit, via doubles of the
 * same dtype) and every block not in the mapping's destinations is unchanged (before) */
static int blocks_ok(const tu_buf *s, const double *sv, const tu_buf *d, const double *before, const int64_t *map,
                     int64_t N) {
    int64_t nbd = d->t.shape[0], per = tu_numel(d) / (nbd ? nbd : 1);
    for (int64_t b = 0; b < nbd; b++) {
        int64_t from = -1;
        for (int64_t i = 0; i < N; i++)
            if (map[2 * i + 1] == b) from = map[2 * i];
        for (int64_t e = 0; e < per; e++) {
            double got = tu_get(d, b * per + e), want = from < 0 ? before[b * per + e] : sv[from * per + e];
            if (memcmp(&got, &want, sizeof got)) return 0;
        }
    }
    (void)s;
    return 1;
}

static void test_swap(void) {
    static const lk_dtype DT[3] = {LK_F32, LK_F16, LK_BF16};
    lk_isa isas[TU_MAX_ISAS];
    int ni = tu_isas(isas);
    int64_t map[4 * 2] = {3, 0, 0, 5, 6, 2, 2, 1}; /* src -> dst */
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        for (int di = 0; di < 3; di++)
            for (int lay = 0; lay < 4; lay++) {
                /* 0: dense KV [NB, bs, H, D]; 1: padded; 2: HND permuted; 3: MLA [NB, bs, Dl + Dr] */
                int nd = lay == 3 ? 3 : 4;
                int64_t ss[4] = {7, 5, 3, 8}, ds[4] = {6, 5, 3, 8};
                if (lay == 3) ss[2] = ds[2] = 37;
                int perm[4] = {0, 2, 1, 3};
                tu_buf s = lay == 2 ? tu_alloc_perm(DT[di], nd, ss, perm, 0) : tu_alloc(DT[di], nd, ss, lay == 1);
                tu_buf d = lay == 2 ? tu_alloc_perm(DT[di], nd, ds, perm, 1) : tu_alloc(DT[di], nd, ds, lay == 1);
                tu_fill_uniform(&s, -4, 4);
                tu_fill_uniform(&d, -4, 4);
                tu_buf m = tu_alloc(di == 1 ? LK_I32 : LK_I64, 2, (int64_t[]){4, 2}, lay == 1);
                for (int k = 0; k < 8; k++) tu_set(&m, k, (double)map[k]);
                double *sv = tu_values(&s), *before = tu_values(&d);
                tu_snapshot(&s), tu_snapshot(&d);
                lk_status st = lk_swap_blocks(&s.t, &d.t, &m.t);
                tu_check(st == LK_OK && blocks_ok(&s, sv, &d, before, map, 4) && tu_intact(&s) && tu_outside_intact(&d),
                         "swap_blocks %s %s layout %d -> %s", lk_isa_name(isas[ii]), lk_dtype_name(DT[di]), lay,
                         lk_status_str(st));
                free(sv), free(before);
                tu_free(&s), tu_free(&d), tu_free(&m);
            }
    }
    lk_set_isa(lk_isa_best());
}

static void test_copy(void) {
    lk_isa isas[TU_MAX_ISAS];
    int ni = tu_isas(isas);
    int64_t map[3 * 2] = {0, 4, 1, 2, 1, 3}; /* one source copied twice (copy-on-write fork) */
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        for (int lay = 0; lay < 2; lay++) {
            enum { L = 3 };
            tu_buf c[2 * L];
            lk_tensor ct[2 * L];
            double *before[2 * L];
            for (int k = 0; k < 2 * L; k++) {
                int64_t sh[4] = {6, 4, 2, 16};
                c[k] = k == 2 * L - 1 ? tu_alloc(LK_BF16, 1, (int64_t[]){9}, lay) /* a 1-D cache */
                                      : tu_alloc(k % 2 ? LK_F16 : LK_F32, 4, sh, lay);
                tu_fill_uniform(&c[k], -2, 2);
                ct[k] = c[k].t;
                before[k] = tu_values(&c[k]);
                tu_snapshot(&c[k]);
            }
            tu_buf m = tu_alloc(LK_I64, 2, (int64_t[]){3, 2}, 0);
            for (int k = 0; k < 6; k++) tu_set(&m, k, (double)map[k]);
            lk_status st = lk_copy_blocks(2 * L, ct, &m.t);
            int ok = st == LK_OK;
            for (int k = 0; k < 2 * L; k++) ok &= blocks_ok(&c[k], before[k], &c[k], before[k], map, 3) && tu_outside_intact(&c[k]);
            tu_check(ok, "copy_blocks %s layout %d -> %s", lk_isa_name(isas[ii]), lay, lk_status_str(st));
            for (int k = 0; k < 2 * L; k++) tu_free(&c[k]), free(before[k]);
            tu_free(&m);
        }
    }
    lk_set_isa(lk_isa_best());
}

/* copy_blocks rows mapping a block onto itself: no-ops left out of the rules (so a block
 * may be a source or a destination of another row as well), never run */
static void test_copy_self(void) {
    static const int64_t maps[5][6] = {{2, 2, 0, 2}, {1, 1, 1, 3}, {5, 5}, {1, 1, 0, 1, 0, 4}, {3, 3, 3, 3, 2, 5}};
    static const int64_t rows[5] = {2, 2, 1, 3, 3};
    lk_isa isas[TU_MAX_ISAS];
    int ni = tu_isas(isas);
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        for (int k = 0; k < 5; k++) {
            tu_buf c = tu_alloc(LK_BF16, 4, (int64_t[]){6, 4, 2, 16}, k % 2);
            tu_fill_uniform(&c, -2, 2);
            double *before = tu_values(&c);
            tu_snapshot(&c);
            tu_buf m = tu_alloc(k % 2 ? LK_I32 : LK_I64, 2, (int64_t[]){rows[k], 2}, 0);
            for (int64_t i = 0; i < 2 * rows[k]; i++) tu_set(&m, i, (double)maps[k][i]);
            lk_set_num_threads(1 + k % 4);
            lk_status st = lk_copy_blocks(1, &c.t, &m.t);
            lk_set_num_threads(0);
            tu_check(st == LK_OK && blocks_ok(&c, before, &c, before, maps[k], rows[k]) && tu_outside_intact(&c),
                     "copy_blocks %s, rows with a block onto itself (map %d): the other rows' copies, the block "
                     "itself unchanged -> %s %s", lk_isa_name(isas[ii]), k, lk_status_str(st), lk_last_error());
            free(before);
            tu_free(&c), tu_free(&m);
        }
        /* the rules still hold among the other rows */
        static const int64_t bad[2][6] = {{2, 2, 0, 2, 3, 2}, {0, 2, 2, 2, 2, 4}};
        static const char *why[2] = {"more than once", "both a destination and a source"};
        for (int k = 0; k < 2; k++) {
            tu_buf c = tu_alloc(LK_F32, 2, (int64_t[]){6, 8}, 1);
            tu_fill_uniform(&c, -2, 2);
            tu_snapshot(&c);
            tu_buf m = tu_alloc(LK_I64, 2, (int64_t[]){3, 2}, 0);
            for (int64_t i = 0; i < 6; i++) tu_set(&m, i, (double)bad[k][i]);
            lk_status st = lk_copy_blocks(1, &c.t, &m.t);
            tu_check(st == LK_ERR_INDEX && strstr(lk_last_error(), why[k]) && tu_intact(&c),
                     "copy_blocks %s: a self row does not hide the other rows' conflict (%s) -> %s %s",
                     lk_isa_name(isas[ii]), why[k], lk_status_str(st), lk_last_error());
            tu_free(&c), tu_free(&m);
        }
    }
    lk_set_isa(lk_isa_best());
}

static void test_threads(void) {
    int64_t sh[4] = {256, 16, 4, 64};
    tu_buf s = tu_alloc(LK_BF16, 4, sh, 0);
    tu_fill_uniform(&s, -1, 1);
    int64_t N = 200;
    tu_buf m = tu_alloc(LK_I64, 2, (int64_t[]){N, 2}, 0);
    for (int64_t i = 0; i < N; i++) tu_set(&m, 2 * i, (double)(i % 56)), tu_set(&m, 2 * i + 1, (double)(56 + i));
    tu_buf first = tu_alloc(LK_BF16, 4, sh, 0);
    tu_fill_uniform(&first, -1, 1);
    tu_buf copy0 = tu_alloc(LK_BF16, 4, sh, 0);
    for (int64_t i = 0; i < tu_numel(&first); i++) tu_set(&copy0, i, tu_get(&first, i));
    lk_set_num_threads(1);
    lk_swap_blocks(&s.t, &first.t, &m.t);
    int same = 1;
    for (int t = 2; t <= 4; t++) {
        tu_buf o = tu_alloc(LK_BF16, 4, sh, 0);
        for (int64_t i = 0; i < tu_numel(&o); i++) tu_set(&o, i, tu_get(&copy0, i));
        lk_set_num_threads(t);
        lk_swap_blocks(&s.t, &o.t, &m.t);
        same &= tu_same_bits(&o, &first);
        tu_free(&o);
    }
    lk_set_num_threads(0);
    tu_check(same, "swap_blocks: 1..4 threads bitwise identical");
    tu_free(&s), tu_free(&m), tu_free(&first), tu_free(&copy0);
}

static void expect(lk_status st, lk_status want, const char *op, const char *arg, const char *what, tu_buf **bufs,
                   int nb) {
    const char *msg = lk_last_error();
    int ok = st == want && strstr(msg, op) && strstr(msg, arg);
    for (int i = 0; i < nb; i++) ok &= tu_intact(bufs[i]);
    tu_check(ok, "bad input '%s' -> %s (%s)", what, lk_status_str(st), msg);
}

static void test_bad(void) {
    int64_t sh[3] = {4, 3, 8};
    tu_buf s = tu_alloc(LK_F32, 3, sh, 0), d = tu_alloc(LK_F32, 3, sh, 0), d16 = tu_alloc(LK_F16, 3, sh, 0);
    tu_buf d9 = tu_alloc(LK_F32, 3, (int64_t[]){4, 3, 9}, 0), m = tu_alloc(LK_I64, 2, (int64_t[]){2, 2}, 0);
    tu_buf m3 = tu_alloc(LK_I64, 2, (int64_t[]){2, 3}, 0), mf = tu_alloc(LK_F32, 2, (int64_t[]){2, 2}, 0);
    tu_fill_uniform(&s, -1, 1), tu_fill_uniform(&d, -1, 1), tu_fill_uniform(&d16, -1, 1);
    tu_buf *all[] = {&s, &d, &d16, &d9, &m, &m3, &mf};
    for (int i = 0; i < 7; i++) tu_snapshot(all[i]);
#define SET(a, b, c, e) tu_set(&m, 0, a), tu_set(&m, 1, b), tu_set(&m, 2, c), tu_set(&m, 3, e), tu_snapshot(&m)
    SET(0, 1, 4, 2);
    expect(lk_swap_blocks(&s.t, &d.t, &m.t), LK_ERR_INDEX, "lk_swap_blocks", "block_mapping", "source 4 of 4 blocks", all, 7);
    SET(0, 1, 3, -1);
    expect(lk_swap_blocks(&s.t, &d.t, &m.t), LK_ERR_INDEX, "lk_swap_blocks", "block_mapping", "destination -1", all, 7);
    SET(0, 1, 2, 1);
    expect(lk_swap_blocks(&s.t, &d.t, &m.t), LK_ERR_INDEX, "lk_swap_blocks", "block_mapping", "destination twice", all, 7);
    SET(0, 1, 2, 3);
    expect(lk_swap_blocks(&s.t, &d16.t, &m.t), LK_ERR_DTYPE, "lk_swap_blocks", "dst", "dtype differs", all, 7);
    expect(lk_swap_blocks(&s.t, &d9.t, &m.t), LK_ERR_SHAPE, "lk_swap_blocks", "dst", "block shape differs", all, 7);
    expect(lk_swap_blocks(&s.t, &d.t, &m3.t), LK_ERR_SHAPE, "lk_swap_blocks", "block_mapping", "[N, 3] mapping", all, 7);
    expect(lk_swap_blocks(&s.t, &d.t, &mf.t), LK_ERR_DTYPE, "lk_swap_blocks", "block_mapping", "f32 mapping", all, 7);
    expect(lk_swap_blocks(&s.t, &s.t, &m.t), LK_ERR_ALIAS, "lk_swap_blocks", "dst", "src is dst", all, 7);
    expect(lk_swap_blocks(&s.t, NULL, &m.t), LK_ERR_NULL, "lk_swap_blocks", "dst", "NULL dst", all, 7);
    lk_tensor two[2] = {s.t, d.t};
    SET(0, 1, 1, 2);
    expect(lk_copy_blocks(2, two, &m.t), LK_ERR_INDEX, "lk_copy_blocks", "block_mapping", "chained copy", all, 7);
    SET(0, 1, 2, 4);
    expect(lk_copy_blocks(2, two, &m.t), LK_ERR_INDEX, "lk_copy_blocks", "block_mapping", "destination 4 of 4", all, 7);
    SET(0, 1, 2, 3);
    lk_tensor same[2] = {s.t, s.t};
    expect(lk_copy_blocks(2, same, &m.t), LK_ERR_ALIAS, "lk_copy_blocks", "caches", "one cache twice", all, 7);
    expect(lk_copy_blocks(0, two, &m.t), LK_ERR_VALUE, "lk_copy_blocks", "n", "n = 0", all, 7);
    expect(lk_copy_blocks(2, NULL, &m.t), LK_ERR_NULL, "lk_copy_blocks", "caches", "NULL caches", all, 7);
    /* empty mapping: nothing to do */
    lk_tensor e = m.t;
    e.shape[0] = 0;
    tu_check(lk_swap_blocks(&s.t, &d.t, &e) == LK_OK && lk_copy_blocks(2, two, &e) == LK_OK && tu_intact(&d) &&
                 tu_intact(&s),
             "empty mapping: OK, nothing written");
    for (int i = 0; i < 7; i++) tu_free(all[i]);
}

int main(void) {
    tu_init();
    test_swap();
    test_copy_self();
    test_copy();
    test_threads();
    test_bad();
    return tu_finish("test_block_copy");
}
