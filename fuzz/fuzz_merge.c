/*
 * Fuzz harness: lk_merge_attn_states (2-way) and lk_merge_attn_states_n (n = 0..5) (see
 * fuzz_common.h for the checks). Input: T, H, D (0 too: only out_lse is written),
 * dtypes of every state and of out, LSE layouts (transposed views), out_lse present or
 * NULL, LSE values with specials (+-inf: empty state, NaN), a non-f32 LSE, out aliasing a
 * state, out_lse aliasing an input LSE, two states sharing one buffer (valid), NULL
 * pointers. out is compared with the ref within the vs-ref tolerance, out_lse exactly.
 */
#include "fuzz_common.h"

#define MAXN 5

typedef struct {
    int nway, n, out, out_lse, st[MAXN], ls[MAXN], null_arrays;
} merge_attrs;

static lk_status call(const fz_world *w, const void *ap) {
    const merge_attrs *a = ap;
    if (!a->nway)
        return lk_merge_attn_states(fz_t(w, a->out), fz_t(w, a->out_lse), fz_t(w, a->st[0]),
                                    fz_t(w, a->ls[0]), fz_t(w, a->st[1]), fz_t(w, a->ls[1]));
    lk_tensor st[MAXN], ls[MAXN];
    for (int i = 0; i < a->n && i < MAXN; i++) st[i] = w->v[a->st[i]].t, ls[i] = w->v[a->ls[i]].t;
    return lk_merge_attn_states_n(fz_t(w, a->out), fz_t(w, a->out_lse), a->n,
                                  a->null_arrays == 1 ? NULL : st, a->null_arrays == 2 ? NULL : ls);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_in in = {data, size, 0};
    fz_world w;
    fz_init(&w, &in, "merge");
    merge_attrs a;
    memset(&a, 0, sizeof a);
    a.nway = fz_u8(&in) & 1;
    w.op = a.nway ? "lk_merge_attn_states_n" : "lk_merge_attn_states";
    a.n = a.nway ? (int)fz_range(&in, -1, MAXN) : 2;
    if (a.n < 1) fz_fail_expected(&w, "n < 1");
    int nb = a.n < 1 ? 1 : a.n; /* views built (n < 1: never read) */
    int64_t T = fz_dim(&in, 5), H = fz_dim(&in, 4), D = fz_dim(&in, 40);
    int64_t sh[3] = {T, H, D}, lsh[2] = {T, H};
    lk_dtype ot = fz_ftype(&in);
    a.out = fz_view_new(&w, &in, "out", ot, 3, sh, FZ_OUT);
    fz_tol(&w, a.out, 1e-5);
    a.out_lse = -1;
    if (fz_u8(&in) % 4) {
        a.out_lse = fz_view_new(&w, &in, "out_lse", LK_F32, 2, lsh, FZ_OUT);
        fz_tol(&w, a.out_lse, 0.0);
    }
    unsigned alias = fz_u8(&in) % 8;
    for (int i = 0; i < nb; i++) {
        static const char *SN[MAXN] = {"states[0]", "states[1]", "states[2]", "states[3]", "states[4]"};
        static const char *LN[MAXN] = {"lses[0]", "lses[1]", "lses[2]", "lses[3]", "lses[4]"};
        int64_t s2[3] = {T, H, D};
        if (i == 0 && alias == 0) { /* out is state 0 */
            a.st[i] = fz_view_alias(&w, a.out, SN[i], FZ_IN), w.v[a.st[i]].inplace_of = -1;
        } else if (i == 1 && alias == 1) { /* state 1 shares state 0's buffer (read only: fine) */
            a.st[i] = fz_view_alias(&w, a.st[0], SN[i], FZ_IN), w.v[a.st[i]].inplace_of = -1;
        } else {
            if (i == nb - 1 && fz_chance(&in, 6)) {
                s2[fz_u8(&in) % 3] += 1;
                fz_fail_expected(&w, "a state's shape differs from out's");
            }
            a.st[i] = fz_view_new(&w, &in, SN[i], fz_ftype(&in), 3, s2, FZ_IN);
        }
        if (i == 0 && alias == 2 && a.out_lse >= 0) /* out_lse is lse 0 */
            a.ls[i] = fz_view_alias(&w, a.out_lse, LN[i], FZ_IN), w.v[a.ls[i]].inplace_of = -1;
        else {
            lk_dtype lt = LK_F32;
            if (fz_chance(&in, 4)) lt = LK_F16, fz_fail_expected(&w, "LSE not f32");
            a.ls[i] = fz_view_new(&w, &in, LN[i], lt, 2, lsh, FZ_IN);
        }
    }
    for (int i = 0; i < nb; i++) {
        if (w.v[a.st[i]].inplace_of < 0 && w.v[a.st[i]].t.data != w.v[a.out].t.data) fz_fill(&w, a.st[i], -4, 4);
        fz_fill(&w, a.ls[i], -6, 6);
    }
    if (a.nway && fz_chance(&in, 4)) {
        a.null_arrays = 1 + (int)(fz_u8(&in) & 1);
        fz_fail_expected(&w, "NULL states / lses array");
    }
    if (fz_chance(&in, 4)) {
        if (fz_u8(&in) & 1 || a.nway) a.out = -1;
        else a.ls[1] = -1;
        fz_fail_expected(&w, "NULL tensor pointer");
    }
    fz_run(&w, call, &a);
    fz_free(&w);
    return 0;
}
