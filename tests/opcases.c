/*
 * Operator registry for the cross-operator suites (see opcases.h). One builder and one
 * caller per public operator; sizes: OC_SMALL (quick, every dim >= 2 where the op
 * allows it, for the limits table), OC_MEDIUM (many concurrent calls), OC_LARGE (large
 * enough for the kernels to go parallel: the determinism suite).
 */
#include "opcases.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- helpers */

static tu_buf *add(oc_inst *in, const char *name, lk_dtype dt, int nd, const int64_t *shape,
                   int written, int pad) {
    oc_arg *a = &in->arg[in->nargs++];
    memset(a, 0, sizeof *a);
    a->name = name;
    a->buf = tu_alloc(dt, nd, shape, pad);
    a->t = a->buf.t;
    a->written = written;
    return &a->buf;
}

static const lk_tensor *T(const oc_inst *in, int k) {
    return in->arg[k].is_null ? NULL : &in->arg[k].t;
}

/* n distinct slots of [0, nslots) (n <= nslots), every 5th token padding (-1) */
static void fill_slots(tu_buf *b, int64_t n, int64_t nslots) {
    int64_t *perm = tu_permutation(nslots);
    for (int64_t i = 0; i < n; i++) tu_set(b, i, i % 5 == 4 ? -1.0 : (double)perm[i]);
    free(perm);
}

/* ---------------------------------------------------------------- norms */

static void make_rms_norm(oc_inst *in, oc_size sz) {
    int64_t R = sz == OC_LARGE ? 64 : sz == OC_MEDIUM ? 48 : 3, D = sz == OC_LARGE ? 1024 : sz ? 520 : 40;
    int64_t s[2] = {R, D};
    tu_fill_uniform(add(in, "x", LK_BF16, 2, s, 0, 1), -2, 2);
    add(in, "out", LK_BF16, 2, s, 1, 0);
    tu_fill_uniform(add(in, "w", LK_F32, 1, &s[1], 0, 0), -1, 1);
    in->arg[2].optional = 1; /* NULL: no weight */
    in->eps = 1e-6f;
}
static lk_status call_rms_norm(const oc_inst *in) { return lk_rms_norm(T(in, 1), T(in, 0), T(in, 2), in->eps, in->flag); }

static void make_fused(oc_inst *in, oc_size sz) {
    int64_t R = sz == OC_LARGE ? 64 : sz == OC_MEDIUM ? 48 : 3, D = sz == OC_LARGE ? 1024 : sz ? 520 : 40;
    int64_t s[2] = {R, D};
    tu_fill_uniform(add(in, "x", LK_F16, 2, s, 1, 0), -2, 2);
    tu_fill_uniform(add(in, "residual", LK_F32, 2, s, 1, 1), -2, 2);
    tu_fill_uniform(add(in, "w", LK_BF16, 1, &s[1], 0, 0), -1, 1);
    in->arg[2].optional = 1; /* NULL: no weight */
    in->eps = 1e-5f;
    in->flag = 1; /* gemma */
}
static lk_status call_fused(const oc_inst *in) {
    return lk_fused_add_rms_norm(T(in, 0), T(in, 1), T(in, 2), in->eps, in->flag);
}

/* ---------------------------------------------------------------- activations */

static void make_act(oc_inst *in, oc_size sz) {
    int64_t R = sz == OC_LARGE ? 64 : sz == OC_MEDIUM ? 48 : 3, d = sz == OC_LARGE ? 1024 : sz ? 520 : 20;
    int64_t xs[2] = {R, 2 * d}, os[2] = {R, d};
    add(in, "out", LK_F32, 2, os, 1, 1);
    tu_fill_uniform(add(in, "x", LK_BF16, 2, xs, 0, 0), -6, 6);
}
static lk_status call_silu(const oc_inst *in) { return lk_silu_and_mul(T(in, 0), T(in, 1)); }
static lk_status call_gelu(const oc_inst *in) { return lk_gelu_tanh_and_mul(T(in, 0), T(in, 1)); }
static lk_status call_gelu_erf(const oc_inst *in) { return lk_gelu_and_mul(T(in, 0), T(in, 1)); }
static lk_status call_mul_silu(const oc_inst *in) { return lk_mul_and_silu(T(in, 0), T(in, 1)); }
static lk_status call_fatrelu(const oc_inst *in) { return lk_fatrelu_and_mul(T(in, 0), T(in, 1), 0.25f); }
static lk_status call_swigluoai(const oc_inst *in) { return lk_swigluoai_and_mul(T(in, 0), T(in, 1), 1.702f, 7.0f); }

/* element-wise activations: out shaped like x */
static void make_act_ew(oc_inst *in, oc_size sz) {
    int64_t R = sz == OC_LARGE ? 64 : sz == OC_MEDIUM ? 48 : 3, d = sz == OC_LARGE ? 1024 : sz ? 520 : 20;
    int64_t s[2] = {R, d};
    add(in, "out", LK_BF16, 2, s, 1, 0);
    tu_fill_uniform(add(in, "x", LK_F16, 2, s, 0, 1), -6, 6);
}
static lk_status call_gelu_new(const oc_inst *in) { return lk_gelu_new(T(in, 0), T(in, 1)); }
static lk_status call_gelu_fast(const oc_inst *in) { return lk_gelu_fast(T(in, 0), T(in, 1)); }
static lk_status call_gelu_quick(const oc_inst *in) { return lk_gelu_quick(T(in, 0), T(in, 1)); }

/* ---------------------------------------------------------------- rotary */

static void make_rotary(oc_inst *in, oc_size sz) {
    int64_t Tn = sz == OC_LARGE ? 128 : sz == OC_MEDIUM ? 16 : 3, Hq = sz == OC_LARGE ? 8 : 4, Hk = 2;
    int64_t D = sz == OC_LARGE ? 128 : 32, rot = D / 2, P = 64;
    tu_buf *p = add(in, "positions", LK_I64, 1, &Tn, 0, 0);
    for (int64_t t = 0; t < Tn; t++) tu_set(p, t, (double)tu_randint(0, P - 1));
    tu_fill_uniform(add(in, "q", LK_BF16, 3, (int64_t[]){Tn, Hq, D}, 1, 1), -2, 2);
    tu_fill_uniform(add(in, "k", LK_F16, 3, (int64_t[]){Tn, Hk, D}, 1, 0), -2, 2);
    in->arg[2].optional = 1;
    tu_fill_uniform(add(in, "cos_sin_cache", LK_F32, 2, (int64_t[]){P, rot}, 0, 0), -1, 1);
    in->flag = 1; /* NeoX */
}
static lk_status call_rotary(const oc_inst *in) {
    return lk_rotary_embedding(T(in, 0), T(in, 1), T(in, 2), T(in, 3), in->flag);
}

/* ---------------------------------------------------------------- kv cache */

static void make_kv(oc_inst *in, oc_size sz) {
    int64_t Tn = sz == OC_LARGE ? 256 : sz == OC_MEDIUM ? 24 : 3, H = sz == OC_LARGE ? 4 : 2;
    int64_t D = sz == OC_LARGE ? 64 : 16, NB = sz == OC_LARGE ? 40 : 8, bs = sz == OC_LARGE ? 16 : 4;
    tu_fill_uniform(add(in, "k", LK_BF16, 3, (int64_t[]){Tn, H, D}, 0, 0), -3, 3);
    tu_fill_uniform(add(in, "v", LK_F32, 3, (int64_t[]){Tn, H, D}, 0, 1), -3, 3);
    add(in, "k_cache", LK_BF16, 4, (int64_t[]){NB, bs, H, D}, 1, 0);
    add(in, "v_cache", LK_BF16, 4, (int64_t[]){NB, bs, H, D}, 1, 1);
    fill_slots(add(in, "slot_mapping", LK_I64, 1, &Tn, 0, 0), Tn, NB * bs);
}
static lk_status call_kv(const oc_inst *in) {
    return lk_reshape_and_cache_flash(T(in, 0), T(in, 1), T(in, 2), T(in, 3), T(in, 4));
}

/* fp8 caches (e4m3 keys, e5m2 values) with per-tensor scales */
static void make_kv_fp8(oc_inst *in, oc_size sz) {
    make_kv(in, sz);
    for (int k = 2; k < 4; k++) {
        oc_arg *a = &in->arg[k];
        int64_t shape[4];
        for (int d = 0; d < 4; d++) shape[d] = a->buf.t.shape[d];
        tu_free(&a->buf);
        a->buf = tu_alloc(k == 2 ? LK_F8E4M3 : LK_F8E5M2, 4, shape, k == 3);
        a->t = a->buf.t;
        a->fp8 = 1;
    }
    in->scale[0] = 0.03125f;
    in->scale[1] = 3.0f;
}
static lk_status call_kv_fp8(const oc_inst *in) {
    return lk_reshape_and_cache_flash_scaled(T(in, 0), T(in, 1), T(in, 2), T(in, 3), T(in, 4), in->scale[0],
                                             in->scale[1]);
}

/* ---------------------------------------------------------------- merge, softmax */

static void make_merge2(oc_inst *in, oc_size sz) {
    int64_t Tn = sz == OC_LARGE ? 64 : sz == OC_MEDIUM ? 16 : 3, H = sz == OC_LARGE ? 8 : 2;
    int64_t D = sz == OC_LARGE ? 128 : 24, s[3] = {Tn, H, D};
    add(in, "out", LK_BF16, 3, s, 1, 0);
    add(in, "out_lse", LK_F32, 2, s, 1, 1);
    in->arg[1].optional = 1;
    tu_fill_uniform(add(in, "a", LK_BF16, 3, s, 0, 0), -2, 2);
    tu_fill_uniform(add(in, "lse_a", LK_F32, 2, s, 0, 0), -4, 4);
    tu_fill_uniform(add(in, "b", LK_F32, 3, s, 0, 1), -2, 2);
    tu_fill_uniform(add(in, "lse_b", LK_F32, 2, s, 0, 1), -4, 4);
}
static lk_status call_merge2(const oc_inst *in) {
    return lk_merge_attn_states(T(in, 0), T(in, 1), T(in, 2), T(in, 3), T(in, 4), T(in, 5));
}

static void make_merge_n(oc_inst *in, oc_size sz) {
    static const char *SN[3] = {"states[0]", "states[1]", "states[2]"}, *LN[3] = {"lses[0]", "lses[1]", "lses[2]"};
    int64_t Tn = sz == OC_LARGE ? 64 : sz == OC_MEDIUM ? 16 : 3, H = sz == OC_LARGE ? 8 : 2;
    int64_t D = sz == OC_LARGE ? 128 : 24, s[3] = {Tn, H, D};
    add(in, "out", LK_F16, 3, s, 1, 1);
    add(in, "out_lse", LK_F32, 2, s, 1, 0);
    in->arg[1].optional = 1;
    in->n = 3;
    for (int i = 0; i < 3; i++) {
        tu_fill_uniform(add(in, SN[i], i == 1 ? LK_F32 : LK_BF16, 3, s, 0, i & 1), -2, 2);
        tu_fill_uniform(add(in, LN[i], LK_F32, 2, s, 0, 0), -4, 4);
    }
}
static lk_status call_merge_n(const oc_inst *in) {
    lk_tensor st[3], ls[3];
    for (int i = 0; i < in->n; i++) st[i] = in->arg[2 + 2 * i].t, ls[i] = in->arg[3 + 2 * i].t;
    /* a NULL state / lse is passed as a NULL array (the N-way form takes arrays) */
    int null_st = 0, null_ls = 0;
    for (int i = 0; i < in->n; i++) null_st |= in->arg[2 + 2 * i].is_null, null_ls |= in->arg[3 + 2 * i].is_null;
    return lk_merge_attn_states_n(T(in, 0), T(in, 1), in->n, null_st ? NULL : st, null_ls ? NULL : ls);
}

static void make_softmax(oc_inst *in, oc_size sz) {
    int64_t s[3] = {sz == OC_LARGE ? 4 : 2, sz == OC_LARGE ? 64 : sz ? 48 : 3, sz == OC_LARGE ? 256 : sz ? 200 : 20};
    add(in, "out", LK_F32, 3, s, 1, 1);
    tu_fill_uniform(add(in, "x", LK_BF16, 3, s, 0, 0), -6, 6);
}
static lk_status call_softmax(const oc_inst *in) { return lk_causal_softmax(T(in, 0), T(in, 1)); }

/* ---------------------------------------------------------------- block copies */

/* mapping [N, 2]: sources in [0, NB / 2), distinct destinations in [NB / 2, NB) */
static void fill_block_map(tu_buf *m, int64_t N, int64_t NB) {
    for (int64_t i = 0; i < N; i++) {
        tu_set(m, 2 * i, (double)tu_randint(0, NB / 2 - 1));
        tu_set(m, 2 * i + 1, (double)(NB / 2 + (i * 7) % (NB - NB / 2)));
    }
}
static void make_swap(oc_inst *in, oc_size sz) {
    int64_t NB = sz == OC_LARGE ? 96 : sz == OC_MEDIUM ? 16 : 4, bs = sz == OC_LARGE ? 16 : 4, N = NB / 2;
    int64_t sh[4] = {NB, bs, 2, sz == OC_LARGE ? 128 : 16};
    tu_fill_uniform(add(in, "src", LK_BF16, 4, sh, 0, 1), -2, 2);
    tu_fill_uniform(add(in, "dst", LK_BF16, 4, sh, 1, 0), -2, 2);
    fill_block_map(add(in, "block_mapping", LK_I64, 2, (int64_t[]){N, 2}, 0, 0), N, NB);
    in->arg[0].fp8 = in->arg[1].fp8 = 1; /* fp8 blocks are copied too (since 0.3) */
}
static lk_status call_swap(const oc_inst *in) { return lk_swap_blocks(T(in, 0), T(in, 1), T(in, 2)); }
static void make_copy_blocks(oc_inst *in, oc_size sz) {
    int64_t NB = sz == OC_LARGE ? 96 : sz == OC_MEDIUM ? 16 : 4, bs = sz == OC_LARGE ? 16 : 4, N = NB / 2;
    tu_fill_uniform(add(in, "caches[0]", LK_F16, 4, (int64_t[]){NB, bs, 2, sz == OC_LARGE ? 128 : 16}, 1, 0), -2, 2);
    tu_fill_uniform(add(in, "caches[1]", LK_F32, 3, (int64_t[]){NB, bs, 48}, 1, 1), -2, 2); /* an MLA cache */
    fill_block_map(add(in, "block_mapping", LK_I32, 2, (int64_t[]){N, 2}, 0, 1), N, NB);
    in->arg[0].fp8 = in->arg[1].fp8 = 1; /* fp8 blocks are copied too (since 0.3) */
}
static lk_status call_copy_blocks(const oc_inst *in) {
    lk_tensor c[2] = {in->arg[0].t, in->arg[1].t};
    /* a NULL cache is passed as a NULL array */
    return lk_copy_blocks(2, in->arg[0].is_null || in->arg[1].is_null ? NULL : c, T(in, 2));
}

/* ---------------------------------------------------------------- MLA caches */

static void make_concat(oc_inst *in, oc_size sz) {
    int64_t Tn = sz == OC_LARGE ? 512 : sz == OC_MEDIUM ? 24 : 3, Dl = sz == OC_LARGE ? 512 : 32;
    int64_t Dr = sz == OC_LARGE ? 64 : 16, NB = sz == OC_LARGE ? 48 : 8, bs = sz == OC_LARGE ? 16 : 4;
    tu_fill_uniform(add(in, "kv_c", LK_BF16, 2, (int64_t[]){Tn, Dl}, 0, 0), -2, 2);
    tu_fill_uniform(add(in, "k_pe", LK_F32, 2, (int64_t[]){Tn, Dr}, 0, 1), -2, 2);
    add(in, "kv_c_cache", LK_BF16, 3, (int64_t[]){NB, bs, Dl}, 1, 0);
    add(in, "k_pe_cache", LK_BF16, 3, (int64_t[]){NB, bs, Dr}, 1, 1);
    in->arg[3].optional = 1;
    fill_slots(add(in, "slot_mapping", LK_I32, 1, &Tn, 0, 0), Tn, NB * bs);
    in->flag = LK_KV_ND;
}
static lk_status call_concat(const oc_inst *in) {
    return lk_concat_and_cache_mla(T(in, 0), T(in, 1), T(in, 2), T(in, 3), T(in, 4), (lk_kv_layout)in->flag);
}

static void make_gather(oc_inst *in, oc_size sz) {
    int64_t B = sz == OC_LARGE ? 4 : 2, bs = sz == OC_LARGE ? 16 : 4, NB = sz == OC_LARGE ? 80 : 6;
    int64_t C = sz == OC_LARGE ? 576 : 32, maxp = sz == OC_LARGE ? 22 : 3;
    int64_t lens_l[4] = {300, 250, 100, 340}, lens_s[2] = {5, 3}, S = 0;
    const int64_t *lens = sz == OC_LARGE ? lens_l : lens_s;
    for (int64_t b = 0; b < B; b++) S += lens[b];
    add(in, "out", LK_F32, 2, (int64_t[]){S, C}, 1, 1);
    tu_fill_uniform(add(in, "cache", LK_BF16, 3, (int64_t[]){NB, bs, C}, 0, 0), -2, 2);
    tu_buf *bt = add(in, "block_table", LK_I32, 2, (int64_t[]){B, maxp}, 0, 0);
    for (int64_t i = 0; i < B * maxp; i++) tu_set(bt, i, (double)tu_randint(0, NB - 1));
    tu_buf *sl = add(in, "seq_lens", LK_I32, 1, &B, 0, 0);
    for (int64_t b = 0; b < B; b++) tu_set(sl, b, (double)lens[b]);
    in->flag = LK_KV_ND;
}
static lk_status call_gather(const oc_inst *in) {
    return lk_gather_cache(T(in, 0), T(in, 1), T(in, 2), T(in, 3), (lk_kv_layout)in->flag);
}

/* ---------------------------------------------------------------- flash attention */

/* args: out, lse, q, k, v, cu_seqlens_q, then dense: cu_seqlens_k; paged: seqused_k,
 * block_table */
static void attn_common(oc_inst *in, oc_size sz, int64_t *B, int64_t ql[2], int64_t kl[2], int64_t *Hq,
                        int64_t *Hk, int64_t *D) {
    *B = 2, *Hq = sz == OC_LARGE ? 8 : 4, *Hk = 2, *D = sz == OC_LARGE ? 64 : 16;
    ql[0] = sz == OC_LARGE ? 40 : 2, ql[1] = sz == OC_LARGE ? 1 : 6; /* > 4 queries: the prefill path */
    kl[0] = sz == OC_LARGE ? 200 : 5, kl[1] = sz == OC_LARGE ? 300 : 7;
    int64_t Tq = ql[0] + ql[1];
    add(in, "out", LK_BF16, 3, (int64_t[]){Tq, *Hq, *D}, 1, 0);
    add(in, "lse", LK_F32, 2, (int64_t[]){Tq, *Hq}, 1, 1);
    in->arg[1].optional = 1;
    tu_fill_uniform(add(in, "q", LK_BF16, 3, (int64_t[]){Tq, *Hq, *D}, 0, 0), -2, 2);
    in->arg[2].fp8 = 1; /* q, k, v take fp8 (since 0.3) */
    in->params = lk_attn_params_default(0.125f);
    in->params.causal = 1;
}

static void make_attn_dense(oc_inst *in, oc_size sz) {
    int64_t B, ql[2], kl[2], Hq, Hk, D;
    attn_common(in, sz, &B, ql, kl, &Hq, &Hk, &D);
    int64_t Tk = kl[0] + kl[1], n1 = B + 1;
    tu_fill_uniform(add(in, "k", LK_BF16, 3, (int64_t[]){Tk, Hk, D}, 0, 1), -2, 2);
    tu_fill_uniform(add(in, "v", LK_F16, 3, (int64_t[]){Tk, Hk, D}, 0, 0), -2, 2);
    in->arg[3].fp8 = in->arg[4].fp8 = 1;
    tu_buf *cq = add(in, "cu_seqlens_q", LK_I32, 1, &n1, 0, 0), *ck = add(in, "cu_seqlens_k", LK_I64, 1, &n1, 0, 0);
    tu_set(cq, 0, 0), tu_set(cq, 1, (double)ql[0]), tu_set(cq, 2, (double)(ql[0] + ql[1]));
    tu_set(ck, 0, 0), tu_set(ck, 1, (double)kl[0]), tu_set(ck, 2, (double)Tk);
}
static lk_status call_attn_dense(const oc_inst *in) {
    return lk_flash_attn_varlen(T(in, 0), T(in, 1), T(in, 2), T(in, 3), T(in, 4), T(in, 5), T(in, 6), NULL, NULL,
                                &in->params);
}

static void make_attn_paged(oc_inst *in, oc_size sz) {
    int64_t B, ql[2], kl[2], Hq, Hk, D;
    attn_common(in, sz, &B, ql, kl, &Hq, &Hk, &D);
    int64_t bs = sz == OC_LARGE ? 16 : 4, NB = sz == OC_LARGE ? 40 : 6, maxp = (kl[1] + bs - 1) / bs, n1 = B + 1;
    tu_fill_uniform(add(in, "k", LK_BF16, 4, (int64_t[]){NB, bs, Hk, D}, 0, 0), -2, 2);
    tu_fill_uniform(add(in, "v", LK_BF16, 4, (int64_t[]){NB, bs, Hk, D}, 0, 1), -2, 2);
    in->arg[3].fp8 = in->arg[4].fp8 = 1;
    tu_buf *cq = add(in, "cu_seqlens_q", LK_I64, 1, &n1, 0, 0);
    tu_set(cq, 0, 0), tu_set(cq, 1, (double)ql[0]), tu_set(cq, 2, (double)(ql[0] + ql[1]));
    tu_buf *u = add(in, "seqused_k", LK_I32, 1, &B, 0, 0);
    tu_set(u, 0, (double)kl[0]), tu_set(u, 1, (double)kl[1]);
    tu_buf *bt = add(in, "block_table", LK_I32, 2, (int64_t[]){B, maxp}, 0, 0);
    for (int64_t i = 0; i < B * maxp; i++) tu_set(bt, i, (double)tu_randint(0, NB - 1));
    in->arg[7].optional = 1; /* NULL selects dense K/V (then seqused_k is refused: LK_ERR_VALUE) */
}
static lk_status call_attn_paged(const oc_inst *in) {
    return lk_flash_attn_varlen(T(in, 0), T(in, 1), T(in, 2), T(in, 3), T(in, 4), T(in, 5), NULL, T(in, 6), T(in, 7),
                                &in->params);
}

/* paged K/V with ALiBi slopes [B, Hq] (argument 8; NULL: no ALiBi) */
static void make_attn_alibi(oc_inst *in, oc_size sz) {
    make_attn_paged(in, sz);
    int64_t Hq = in->arg[0].t.shape[1], B = 2;
    tu_fill_uniform(add(in, "alibi_slopes", LK_F32, 2, (int64_t[]){B, Hq}, 0, 1), 0.01, 0.5);
    in->arg[8].optional = 1;
}
static lk_status call_attn_alibi(const oc_inst *in) {
    lk_attn_params p = in->params;
    p.alibi_slopes = T(in, 8);
    return lk_flash_attn_varlen(T(in, 0), T(in, 1), T(in, 2), T(in, 3), T(in, 4), T(in, 5), NULL, T(in, 6), T(in, 7),
                                &p);
}

/* ---- fp8 attention: paged e4m3 K / e5m2 V caches (the padded view for V), descales
 * q_descale [1], k_descale [Hk], v_descale [B, Hk] (padded) as arguments 8, 9, 10 (each
 * optional: NULL reads as 1) */
static void make_attn_fp8(oc_inst *in, oc_size sz) {
    make_attn_paged(in, sz);
    for (int k = 3; k < 5; k++) {
        oc_arg *a = &in->arg[k];
        int64_t shape[4];
        for (int d = 0; d < 4; d++) shape[d] = a->buf.t.shape[d];
        tu_free(&a->buf);
        a->buf = tu_alloc(k == 3 ? LK_F8E4M3 : LK_F8E5M2, 4, shape, k == 4);
        tu_fill_uniform(&a->buf, -3, 3);
        a->t = a->buf.t;
        a->fp8 = 1;
    }
    int64_t B = 2, Hk = 2;
    tu_fill_uniform(add(in, "q_descale", LK_F32, 1, (int64_t[]){1}, 0, 0), 0.5, 2);
    tu_fill_uniform(add(in, "k_descale", LK_F32, 1, &Hk, 0, 0), 0.5, 2);
    tu_fill_uniform(add(in, "v_descale", LK_F32, 2, (int64_t[]){B, Hk}, 0, 1), 0.5, 2);
    for (int k = 8; k < 11; k++) in->arg[k].optional = 1;
}
static lk_status call_attn_fp8(const oc_inst *in) {
    lk_attn_params p = in->params;
    p.q_descale = T(in, 8), p.k_descale = T(in, 9), p.v_descale = T(in, 10);
    return lk_flash_attn_varlen(T(in, 0), T(in, 1), T(in, 2), T(in, 3), T(in, 4), T(in, 5), NULL, T(in, 6), T(in, 7),
                                &p);
}

/* ---------------------------------------------------------------- MLA prefix prefill */

/* args: out, q, k, v, cu_seqlens_q, prefix_lens, block_table, kv_c_cache, then
 * k_pe_cache (two-buffer entries only), kv_b_proj. One entry per strategy (each runs its
 * own code), with the cache layouts and buffer counts spread over them. Request 1's
 * first pages are request 0's (dedup shares their projection); a request without new
 * tokens and padding rows after the last request in the larger sizes. */
#define OC_MLA_TWO 8 /* flag bit: two-buffer cache; low bits: the layout */

/* f8: 0, or the fp8 dtype of both cache buffers (k_scale 0.5; rope dims 32, so that NZ
 * entries fill 32-wide tiles) */
static void make_mla_dt(oc_inst *in, oc_size sz, lk_mla_strategy st, lk_kv_layout lay, int two, int f8) {
    int64_t B = 3, H = sz == OC_LARGE ? 8 : sz ? 4 : 2, Dn = sz == OC_LARGE ? 64 : 16, Dr = f8 ? 32 : 16;
    int64_t Dv = sz == OC_LARGE ? 64 : 16, Dl = sz == OC_LARGE ? 256 : sz ? 64 : 32, bs = sz == OC_LARGE ? 16 : 4;
    int64_t ql_s[3] = {3, 2, 2}, pl_s[3] = {5, 3, 0}, ql_m[3] = {9, 1, 0}, pl_m[3] = {21, 10, 6};
    int64_t ql_l[3] = {40, 1, 17}, pl_l[3] = {300, 120, 0}, pad = sz == OC_SMALL ? 0 : 2, share = sz == OC_SMALL ? 0 : 2;
    const int64_t *ql = sz == OC_LARGE ? ql_l : sz ? ql_m : ql_s, *pl = sz == OC_LARGE ? pl_l : sz ? pl_m : pl_s;
    int64_t Tn = pad, np[3], maxp = 1, nb = 2;
    for (int64_t b = 0; b < B; b++) {
        Tn += ql[b];
        np[b] = (pl[b] + bs - 1) / bs;
        if (np[b] > maxp) maxp = np[b];
        nb += np[b];
    }
    maxp += 1; /* a spare column (-1: never looked at) */
    int64_t Dqk = Dn + Dr, n1 = B + 1;
    add(in, "out", LK_BF16, 3, (int64_t[]){Tn, H, Dv}, 1, 1);
    tu_fill_uniform(add(in, "q", LK_BF16, 3, (int64_t[]){Tn, H, Dqk}, 0, 0), -1, 1);
    tu_fill_uniform(add(in, "k", LK_F16, 3, (int64_t[]){Tn, H, Dqk}, 0, 1), -1, 1);
    tu_fill_uniform(add(in, "v", LK_F32, 3, (int64_t[]){Tn, H, Dv}, 0, 0), -1, 1);
    tu_buf *cu = add(in, "cu_seqlens_q", two ? LK_I64 : LK_I32, 1, &n1, 0, 0);
    tu_buf *pb = add(in, "prefix_lens", LK_I32, 1, &B, 0, 0);
    tu_buf *bt = add(in, "block_table", LK_I32, 2, (int64_t[]){B, maxp}, 0, 0);
    int64_t *perm = tu_permutation(nb), acc = 0, next = 0;
    for (int64_t b = 0; b < B; b++) {
        tu_set(cu, b, (double)acc);
        acc += ql[b];
        tu_set(pb, b, (double)pl[b]);
        for (int64_t i = 0; i < maxp; i++)
            tu_set(bt, b * maxp + i, i >= np[b] ? -1.0 : b == 1 && i < share ? tu_get(bt, i) : (double)perm[next++]);
    }
    tu_set(cu, B, (double)acc);
    free(perm);
    int64_t E = two ? Dl : Dl + Dr, tl = f8 ? 32 : 16;
    lk_dtype c1 = f8 ? (lk_dtype)f8 : LK_BF16, c2 = f8 ? (lk_dtype)f8 : LK_F32;
    if (lay == LK_KV_NZ) {
        tu_fill_uniform(add(in, "kv_c_cache", c1, 4, (int64_t[]){nb, E / tl, bs, tl}, 0, 1), -1, 1);
        if (two) tu_fill_uniform(add(in, "k_pe_cache", c2, 4, (int64_t[]){nb, Dr / tl, bs, tl}, 0, 0), -1, 1);
    } else {
        tu_fill_uniform(add(in, "kv_c_cache", c1, 3, (int64_t[]){nb, bs, E}, 0, 1), -1, 1);
        if (two) tu_fill_uniform(add(in, "k_pe_cache", c2, 3, (int64_t[]){nb, bs, Dr}, 0, 0), -1, 1);
    }
    in->arg[7].fp8 = 1; /* the caches take fp8 (since 0.3) */
    if (two) in->arg[8].optional = 1, in->arg[8].fp8 = 1; /* NULL selects the one-buffer form (then a shape error) */
    double wa = 1.7 / sqrt((double)Dl);
    tu_fill_uniform(add(in, "kv_b_proj", two ? LK_F32 : LK_BF16, 2, (int64_t[]){H * (Dn + Dv), Dl}, 0, 0), -wa, wa);
    in->mla = lk_mla_params_default((float)(1.0 / sqrt((double)Dqk)));
    in->mla.strategy = st;
    in->mla.cache_layout = lay;
    if (f8) in->mla.k_scale = 0.5f;
    in->flag = (int)lay | (two ? OC_MLA_TWO : 0);
}
static void make_mla(oc_inst *in, oc_size sz, lk_mla_strategy st, lk_kv_layout lay, int two) {
    make_mla_dt(in, sz, st, lay, two, 0);
}
/* fp8 latent caches: e4m3 one buffer ND (auto), e5m2 NZ two buffers (absorbed), e4m3 NZ
 * one buffer (fused), e5m2 ND two buffers (split + merge), e4m3 ND (concat) */
static void make_mla8_auto(oc_inst *in, oc_size sz) { make_mla_dt(in, sz, LK_MLA_AUTO, LK_KV_ND, 0, LK_F8E4M3); }
static void make_mla8_absorbed(oc_inst *in, oc_size sz) {
    make_mla_dt(in, sz, LK_MLA_ABSORBED, LK_KV_NZ, 1, LK_F8E5M2);
}
static void make_mla8_fused(oc_inst *in, oc_size sz) { make_mla_dt(in, sz, LK_MLA_FUSED, LK_KV_NZ, 0, LK_F8E4M3); }
static void make_mla8_split(oc_inst *in, oc_size sz) {
    make_mla_dt(in, sz, LK_MLA_SPLIT_MERGE, LK_KV_ND, 1, LK_F8E5M2);
}
static void make_mla8_concat(oc_inst *in, oc_size sz) { make_mla_dt(in, sz, LK_MLA_CONCAT, LK_KV_ND, 0, LK_F8E4M3); }
static void make_mla_split(oc_inst *in, oc_size sz) { make_mla(in, sz, LK_MLA_SPLIT_MERGE, LK_KV_ND, 0); }
static void make_mla_concat(oc_inst *in, oc_size sz) { make_mla(in, sz, LK_MLA_CONCAT, LK_KV_NZ, 1); }
static void make_mla_fused(oc_inst *in, oc_size sz) { make_mla(in, sz, LK_MLA_FUSED, LK_KV_ND, 1); }
static void make_mla_absorbed(oc_inst *in, oc_size sz) { make_mla(in, sz, LK_MLA_ABSORBED, LK_KV_NZ, 0); }
static void make_mla_auto(oc_inst *in, oc_size sz) { make_mla(in, sz, LK_MLA_AUTO, LK_KV_ND, 0); }
static lk_status call_mla(const oc_inst *in) {
    int two = (in->flag & OC_MLA_TWO) != 0;
    return lk_mla_prefix_prefill(T(in, 0), T(in, 1), T(in, 2), T(in, 3), T(in, 4), T(in, 5), T(in, 6), T(in, 7),
                                 two ? T(in, 8) : NULL, T(in, two ? 9 : 8), &in->mla);
}

/* ---------------------------------------------------------------- mla decode */

/* out, lse (optional), q, kv_c_cache, [k_pe_cache (two buffers)], block_table,
 * cache_seqlens; s_q = 2 causal; pages a permutation, unused block_table entries -1 */

/* pages of an mla_decode pool for requests of lens[b] keys in pages of bs: returns their
 * count + 2 (unused pages), *maxp = the longest request's pages + 1 (a -1 entry past it) */
static int64_t mla_dec_pages(const int64_t *lens, int64_t B, int64_t bs, int64_t *maxp) {
    int64_t pages = 0;
    *maxp = 0;
    for (int64_t b = 0; b < B; b++) {
        int64_t np = (lens[b] + bs - 1) / bs;
        pages += np;
        if (np + 1 > *maxp) *maxp = np + 1;
    }
    return pages + 2;
}

/* mla_decode's block_table [B, maxp] i32 (each request's pages drawn from a shuffled
 * pool of nb, -1 past its last page) and cache_seqlens [B] i64 = lens */
static void mla_dec_table(oc_inst *in, int64_t B, int64_t maxp, int64_t nb, int64_t bs, const int64_t *lens) {
    tu_buf *bt = add(in, "block_table", LK_I32, 2, (int64_t[]){B, maxp}, 0, 0);
    tu_buf *sl = add(in, "cache_seqlens", LK_I64, 1, &B, 0, 0);
    int64_t *perm = tu_permutation(nb), next = 0;
    for (int64_t b = 0; b < B; b++) {
        tu_set(sl, b, (double)lens[b]);
        for (int64_t i = 0; i < maxp; i++)
            tu_set(bt, b * maxp + i, i < (lens[b] + bs - 1) / bs ? (double)perm[next++] : -1.0);
    }
    free(perm);
}

static void make_mla_dec(oc_inst *in, oc_size sz, lk_kv_layout lay, int two, lk_dtype cdt) {
    int64_t B = sz == OC_LARGE ? 3 : 2, H = sz == OC_LARGE ? 16 : sz ? 8 : 2, s_q = 2;
    int fp8 = cdt == LK_F8E4M3 || cdt == LK_F8E5M2;
    int64_t Dl = sz == OC_LARGE ? 512 : 32, Dr = sz == OC_LARGE ? 64 : fp8 ? 32 : 16, E = Dl + Dr, bs = sz == OC_LARGE ? 16 : 4;
    int64_t lens[3] = {sz == OC_LARGE ? 700 : 5, sz == OC_LARGE ? 300 : 3, 1200}, maxp = 0;
    int64_t nb = mla_dec_pages(lens, B, bs, &maxp);
    add(in, "out", LK_BF16, 4, (int64_t[]){B, s_q, H, Dl}, 1, 1);
    add(in, "lse", LK_F32, 3, (int64_t[]){B, H, s_q}, 1, 0);
    in->arg[1].optional = 1;
    tu_fill_uniform(add(in, "q", LK_BF16, 4, (int64_t[]){B, s_q, H, E}, 0, 1), -1, 1);
    int64_t D0 = two ? Dl : E;
    int64_t tl = fp8 ? 32 : 16; /* NZ tile: 32 for 1-byte caches */
    lk_dtype pdt = fp8 ? cdt : LK_F16;
    if (lay == LK_KV_NZ) {
        tu_fill_uniform(add(in, "kv_c_cache", cdt, 4, (int64_t[]){nb, D0 / tl, bs, tl}, 0, 0), -1, 1);
        if (two) tu_fill_uniform(add(in, "k_pe_cache", pdt, 4, (int64_t[]){nb, Dr / tl, bs, tl}, 0, 1), -1, 1);
    } else {
        tu_fill_uniform(add(in, "kv_c_cache", cdt, 3, (int64_t[]){nb, bs, D0}, 0, 1), -1, 1);
        if (two) tu_fill_uniform(add(in, "k_pe_cache", pdt, 3, (int64_t[]){nb, bs, Dr}, 0, 0), -1, 1);
    }
    if (two) in->arg[4].optional = 1; /* NULL selects the one-buffer form (then a shape error) */
    in->arg[3].fp8 = 1;                /* the cache buffers take fp8 (since 0.3) */
    if (two) in->arg[4].fp8 = 1;
    mla_dec_table(in, B, maxp, nb, bs, lens);
    in->mla_dec = lk_mla_decode_params_default((float)(1.0 / sqrt((double)E)));
    in->mla_dec.causal = 1;
    in->mla_dec.cache_layout = lay;
    in->mla_dec.split_keys = two ? 128 : 0;
    if (fp8) in->mla_dec.k_scale = 0.05f;
    in->flag = two;
}
static void make_mla_dec_nd(oc_inst *in, oc_size sz) { make_mla_dec(in, sz, LK_KV_ND, 0, LK_BF16); }
static void make_mla_dec_nz2(oc_inst *in, oc_size sz) { make_mla_dec(in, sz, LK_KV_NZ, 1, LK_BF16); }
/* fp8: e4m3 NZ (tile 32) one buffer, e5m2 ND two buffers (split 128), k_scale 0.05 */
static void make_mla_dec_f8nz(oc_inst *in, oc_size sz) { make_mla_dec(in, sz, LK_KV_NZ, 0, LK_F8E4M3); }
static void make_mla_dec_f8nd2(oc_inst *in, oc_size sz) { make_mla_dec(in, sz, LK_KV_ND, 1, LK_F8E5M2); }
static lk_status call_mla_dec(const oc_inst *in) {
    int two = in->flag;
    return lk_mla_decode(T(in, 0), T(in, 1), T(in, 2), T(in, 3), two ? T(in, 4) : NULL, T(in, two ? 5 : 4),
                         T(in, two ? 6 : 5), &in->mla_dec);
}

static void make_mla_plan(oc_inst *in, oc_size sz) {
    int64_t B = sz == OC_LARGE ? 64 : sz ? 16 : 3;
    tu_buf *sl = add(in, "cache_seqlens", LK_I32, 1, &B, 0, 1);
    for (int64_t b = 0; b < B; b++) tu_set(sl, b, (double)tu_randint(0, 5000));
}
static lk_status call_mla_plan(const oc_inst *in) {
    int64_t split = 0;
    return lk_mla_decode_plan(T(in, 0), &split);
}

/* ---------------------------------------------------------------- fp8 caches (since 0.3) */

static void make_scale(oc_inst *in, const char *name, int64_t n, float v0) {
    tu_buf *b = add(in, name, LK_F32, 1, &n, 0, 1);
    for (int64_t i = 0; i < n; i++) tu_set(b, i, v0 * (float)(i + 1));
    in->arg[in->nargs - 1].optional = 1; /* NULL: scale 1 */
}

/* k, v, k_cache (e4m3), v_cache (bf16 in ND, e5m2 in NZ), slot_mapping, k_scale [H],
 * v_scale [1]; flag: the layout */
static void make_kv8(oc_inst *in, oc_size sz, lk_kv_layout lay) {
    int64_t Tn = sz == OC_LARGE ? 256 : sz == OC_MEDIUM ? 24 : 3, H = sz == OC_LARGE ? 4 : 2;
    int64_t D = sz == OC_LARGE ? 64 : 16, NB = sz == OC_LARGE ? 40 : 8, bs = sz == OC_LARGE ? 16 : 4;
    tu_fill_uniform(add(in, "k", LK_BF16, 3, (int64_t[]){Tn, H, D}, 0, 0), -3, 3);
    tu_fill_uniform(add(in, "v", LK_F32, 3, (int64_t[]){Tn, H, D}, 0, 1), -3, 3);
    if (lay == LK_KV_NZ) {
        add(in, "k_cache", LK_F8E4M3, 4, (int64_t[]){NB, H * D / 32, bs, 32}, 1, 0);
        add(in, "v_cache", LK_F8E5M2, 4, (int64_t[]){NB, H * D / 32, bs, 32}, 1, 1);
    } else {
        add(in, "k_cache", LK_F8E4M3, 4, (int64_t[]){NB, bs, H, D}, 1, 1);
        add(in, "v_cache", LK_BF16, 4, (int64_t[]){NB, bs, H, D}, 1, 0);
    }
    in->arg[2].fp8 = in->arg[3].fp8 = 1;
    fill_slots(add(in, "slot_mapping", LK_I64, 1, &Tn, 0, 0), Tn, NB * bs);
    make_scale(in, "k_scale", H, 0.03125f);
    make_scale(in, "v_scale", 1, 3.0f);
    in->flag = lay;
}
static void make_kv8_nd(oc_inst *in, oc_size sz) { make_kv8(in, sz, LK_KV_ND); }
static void make_kv8_nz(oc_inst *in, oc_size sz) { make_kv8(in, sz, LK_KV_NZ); }
static lk_status call_kv8(const oc_inst *in) {
    return lk_reshape_and_cache_flash_fp8(T(in, 0), T(in, 1), T(in, 2), T(in, 3), T(in, 4), T(in, 5), T(in, 6),
                                          (lk_kv_layout)in->flag);
}

/* concat into fp8 caches. ND: two buffers (e4m3 latent, bf16 rope), args kv_c, k_pe,
 * kv_c_cache, k_pe_cache, slot_mapping, scale; NZ: one e5m2 buffer of Dl + Dr (a
 * multiple of 32), args kv_c, k_pe, kv_c_cache, slot_mapping, scale */
static void make_concat8(oc_inst *in, oc_size sz, lk_kv_layout lay) {
    int64_t Tn = sz == OC_LARGE ? 512 : sz == OC_MEDIUM ? 24 : 3, Dl = sz == OC_LARGE ? 512 : 32;
    int64_t Dr = sz == OC_LARGE ? 64 : 32, NB = sz == OC_LARGE ? 48 : 8, bs = sz == OC_LARGE ? 16 : 4;
    tu_fill_uniform(add(in, "kv_c", LK_BF16, 2, (int64_t[]){Tn, Dl}, 0, 0), -2, 2);
    tu_fill_uniform(add(in, "k_pe", LK_F32, 2, (int64_t[]){Tn, Dr}, 0, 1), -2, 2);
    if (lay == LK_KV_NZ) {
        add(in, "kv_c_cache", LK_F8E5M2, 4, (int64_t[]){NB, (Dl + Dr) / 32, bs, 32}, 1, 1);
        in->arg[2].fp8 = 1;
    } else {
        add(in, "kv_c_cache", LK_F8E4M3, 3, (int64_t[]){NB, bs, Dl}, 1, 0);
        add(in, "k_pe_cache", LK_BF16, 3, (int64_t[]){NB, bs, Dr}, 1, 1);
        in->arg[2].fp8 = in->arg[3].fp8 = 1;
        in->arg[3].optional = 1;
    }
    fill_slots(add(in, "slot_mapping", LK_I32, 1, &Tn, 0, 0), Tn, NB * bs);
    make_scale(in, "scale", 1, 0.5f);
    in->flag = lay;
}
static void make_concat8_nd(oc_inst *in, oc_size sz) { make_concat8(in, sz, LK_KV_ND); }
static void make_concat8_nz(oc_inst *in, oc_size sz) { make_concat8(in, sz, LK_KV_NZ); }
static lk_status call_concat8(const oc_inst *in) {
    if (in->flag == LK_KV_NZ) /* one buffer */
        return lk_concat_and_cache_mla_fp8(T(in, 0), T(in, 1), T(in, 2), NULL, T(in, 3), LK_KV_NZ, T(in, 4));
    return lk_concat_and_cache_mla_fp8(T(in, 0), T(in, 1), T(in, 2), T(in, 3), T(in, 4), LK_KV_ND, T(in, 5));
}

/* rotary + concat (lk_concat_and_cache_mla_rope). Args positions (two more values than
 * tokens: only the first T are used), q_pe, k_pe, kv_c, cos_sin_cache, then ND: two
 * caches (e4m3 latent, bf16 rope), slot_mapping, scale; NZ: one e5m2 buffer of Dl + Dr,
 * slot_mapping, scale */
static void make_mla_rope(oc_inst *in, oc_size sz, lk_kv_layout lay) {
    int64_t Tn = sz == OC_LARGE ? 256 : sz == OC_MEDIUM ? 24 : 3, Hq = sz == OC_LARGE ? 16 : 2;
    int64_t Dl = sz == OC_LARGE ? 512 : 32, Dr = sz == OC_LARGE ? 64 : 32, P = Tn + 2, MP = 96;
    int64_t NB = sz == OC_LARGE ? 24 : 8, bs = sz == OC_LARGE ? 16 : 4;
    tu_buf *p = add(in, "positions", LK_I64, 1, &P, 0, 0);
    for (int64_t t = 0; t < P; t++) tu_set(p, t, (double)tu_randint(0, MP - 1));
    tu_fill_uniform(add(in, "q_pe", LK_BF16, 3, (int64_t[]){Tn, Hq, Dr}, 1, 1), -2, 2);
    tu_fill_uniform(add(in, "k_pe", LK_BF16, 2, (int64_t[]){Tn, Dr}, 1, 1), -2, 2);
    tu_fill_uniform(add(in, "kv_c", LK_BF16, 2, (int64_t[]){Tn, Dl}, 0, 0), -2, 2);
    tu_fill_uniform(add(in, "cos_sin_cache", LK_F32, 2, (int64_t[]){MP, Dr}, 0, 0), -1, 1);
    if (lay == LK_KV_NZ) {
        add(in, "kv_c_cache", LK_F8E5M2, 4, (int64_t[]){NB, (Dl + Dr) / 32, bs, 32}, 1, 1);
        in->arg[5].fp8 = 1;
    } else {
        add(in, "kv_c_cache", LK_F8E4M3, 3, (int64_t[]){NB, bs, Dl}, 1, 0);
        add(in, "k_pe_cache", LK_BF16, 3, (int64_t[]){NB, bs, Dr}, 1, 1);
        in->arg[5].fp8 = in->arg[6].fp8 = 1;
        in->arg[6].optional = 1;
    }
    fill_slots(add(in, "slot_mapping", LK_I32, 1, &Tn, 0, 0), Tn, NB * bs);
    make_scale(in, "scale", 1, 0.5f);
    in->flag = lay;
}
static void make_mla_rope_nd(oc_inst *in, oc_size sz) { make_mla_rope(in, sz, LK_KV_ND); }
static void make_mla_rope_nz(oc_inst *in, oc_size sz) { make_mla_rope(in, sz, LK_KV_NZ); }
static lk_status call_mla_rope(const oc_inst *in) {
    if (in->flag == LK_KV_NZ) /* one buffer, GPT-J pairs */
        return lk_concat_and_cache_mla_rope(T(in, 0), T(in, 1), T(in, 2), T(in, 3), T(in, 4), 0, T(in, 5), NULL,
                                            T(in, 6), LK_KV_NZ, T(in, 7));
    return lk_concat_and_cache_mla_rope(T(in, 0), T(in, 1), T(in, 2), T(in, 3), T(in, 4), 1, T(in, 5), T(in, 6),
                                        T(in, 7), LK_KV_ND, T(in, 8));
}

/* gather out of an fp8 cache (e4m3 ND, e5m2 NZ) into f32 / bf16; args out, cache,
 * block_table, seq_lens, scale */
static void make_gather8(oc_inst *in, oc_size sz, lk_kv_layout lay) {
    make_gather(in, sz);
    int64_t NB = in->arg[1].buf.t.shape[0], bs = in->arg[1].buf.t.shape[1], C = in->arg[1].buf.t.shape[2];
    tu_free(&in->arg[1].buf);
    if (lay == LK_KV_NZ) in->arg[1].buf = tu_alloc(LK_F8E5M2, 4, (int64_t[]){NB, C / 32, bs, 32}, 0);
    else in->arg[1].buf = tu_alloc(LK_F8E4M3, 3, (int64_t[]){NB, bs, C}, 1);
    in->arg[1].t = in->arg[1].buf.t;
    tu_fill_uniform(&in->arg[1].buf, -2, 2);
    in->arg[1].fp8 = 1;
    in->arg[0].fp8 = 1; /* an fp8 out takes a cache of its dtype (the cache's retype is then the error) */
    make_scale(in, "scale", 1, 0.75f);
    in->flag = lay;
}
static void make_gather8_nd(oc_inst *in, oc_size sz) { make_gather8(in, sz, LK_KV_ND); }
static void make_gather8_nz(oc_inst *in, oc_size sz) { make_gather8(in, sz, LK_KV_NZ); }
static lk_status call_gather8(const oc_inst *in) {
    return lk_gather_cache_fp8(T(in, 0), T(in, 1), T(in, 2), T(in, 3), (lk_kv_layout)in->flag, T(in, 4));
}
/* lk_gather_cache_starts: the fp8 gather with seq_starts (each request's last token at
 * most in the block table's last slot) */
static void make_gather_starts(oc_inst *in, oc_size sz, lk_kv_layout lay) {
    make_gather8(in, sz, lay);
    int64_t B = in->arg[2].t.shape[0], st_l[4] = {52, 101, 7, 12}, st_s[2] = {6, 9};
    tu_buf *ss = add(in, "seq_starts", LK_I32, 1, &B, 0, 1);
    for (int64_t b = 0; b < B; b++) tu_set(ss, b, (double)(sz == OC_LARGE ? st_l[b] : st_s[b]));
    in->arg[5].optional = 1; /* NULL: no offsets */
}
static void make_gather_starts_nd(oc_inst *in, oc_size sz) { make_gather_starts(in, sz, LK_KV_ND); }
static void make_gather_starts_nz(oc_inst *in, oc_size sz) { make_gather_starts(in, sz, LK_KV_NZ); }
static lk_status call_gather_starts(const oc_inst *in) {
    return lk_gather_cache_starts(T(in, 0), T(in, 1), T(in, 2), T(in, 3), T(in, 5), (lk_kv_layout)in->flag, T(in, 4));
}

/* ---------------------------------------------------------------- fp8_ds_mla caches (since 0.3)
 * LK_KV_DS_MLA records (include/llmkern.h, "fp8_ds_mla caches"): per token Dl e4m3 codes,
 * Dl / 128 f32 tile scales, Dr bf16 rope values, E = Dl + Dl / 32 + 2 Dr bytes. The
 * cache views are padded with pad 2 (strides stay even, as the records' bf16 part
 * needs). `scale` is passed as NULL: these layouts do not read it (nor validate it), so
 * it is not a registry argument. */

static int64_t ds_entry(int64_t Dl, int64_t Dr) { return Dl + Dl / 32 + 2 * Dr; }

static uint16_t ds_bf16(float f) { /* finite f: round to nearest even */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

/* every record of a cache view [nb, bs, E] or [nb, bs, 1, E]: finite codes (no NaN
 * code), tile scales in [2^-9, 2^-5), bf16 rope values in [-1, 1) */
static void fill_ds(tu_buf *b, int64_t Dl, int64_t Dr) {
    const lk_tensor *t = &b->t;
    for (int64_t p = 0; p < t->shape[0]; p++)
        for (int64_t s = 0; s < t->shape[1]; s++) {
            unsigned char *e = (unsigned char *)t->data + p * t->stride[0] + s * t->stride[1];
            for (int64_t d = 0; d < Dl; d++) e[d] = (unsigned char)(tu_randint(0, 0x7e) | (int64_t)(tu_rand() & 0x80));
            for (int64_t g = 0; g < Dl / 128; g++) {
                float sc = (float)tu_uniform(1.0 / 512, 1.0 / 32);
                memcpy(e + Dl + 4 * g, &sc, sizeof sc);
            }
            for (int64_t r = 0; r < Dr; r++) {
                uint16_t h = ds_bf16((float)tu_uniform(-1, 1));
                memcpy(e + Dl + Dl / 32 + 2 * r, &h, sizeof h);
            }
        }
}

/* kv_c [T, Dl]: tile g of 128 dims uniform in +-2 * 8^g (each tile its own scale) */
static void fill_kv_tiles(tu_buf *b, int64_t Tn, int64_t Dl) {
    for (int64_t i = 0; i < Tn * Dl; i++) tu_set(b, i, tu_uniform(-2, 2) * (double)(1 << (3 * ((i % Dl) / 128 % 4))));
}

/* concat into an fp8_ds_mla cache (lk_concat_and_cache_mla_fp8): kv_c bf16 [T, Dl],
 * k_pe f32 [T, Dr], kv_c_cache e4m3 [NB, bs, E] (padded), slot_mapping i64; k_pe_cache
 * and scale NULL */
static void make_concat_ds(oc_inst *in, oc_size sz) {
    int64_t Tn = sz == OC_LARGE ? 512 : sz == OC_MEDIUM ? 24 : 3, Dl = sz == OC_LARGE ? 512 : 256;
    int64_t Dr = sz == OC_LARGE ? 64 : 32, NB = sz == OC_LARGE ? 48 : 8, bs = sz == OC_LARGE ? 16 : 4;
    fill_kv_tiles(add(in, "kv_c", LK_BF16, 2, (int64_t[]){Tn, Dl}, 0, 1), Tn, Dl);
    tu_fill_uniform(add(in, "k_pe", LK_F32, 2, (int64_t[]){Tn, Dr}, 0, 0), -2, 2);
    add(in, "kv_c_cache", LK_F8E4M3, 3, (int64_t[]){NB, bs, ds_entry(Dl, Dr)}, 1, 2);
    in->arg[2].fp8 = in->arg[2].i8 = 1; /* record bytes: f8e4m3 or i8 elements */
    fill_slots(add(in, "slot_mapping", LK_I64, 1, &Tn, 0, 0), Tn, NB * bs);
}
static lk_status call_concat_ds(const oc_inst *in) {
    return lk_concat_and_cache_mla_fp8(T(in, 0), T(in, 1), T(in, 2), NULL, T(in, 3), LK_KV_DS_MLA, NULL);
}

/* rotary + concat into an fp8_ds_mla cache (lk_concat_and_cache_mla_rope, NeoX): args
 * positions (two more values than tokens), q_pe, k_pe, kv_c, cos_sin_cache, kv_c_cache
 * (i8 elements, vLLM's uint8 buffer, [NB, bs, 1, E] padded), slot_mapping */
static void make_mla_rope_ds(oc_inst *in, oc_size sz) {
    int64_t Tn = sz == OC_LARGE ? 256 : sz == OC_MEDIUM ? 24 : 3, Hq = sz == OC_LARGE ? 16 : 2;
    int64_t Dl = sz == OC_LARGE ? 512 : 256, Dr = sz == OC_LARGE ? 64 : 32, P = Tn + 2, MP = 96;
    int64_t NB = sz == OC_LARGE ? 24 : 8, bs = sz == OC_LARGE ? 16 : 4;
    tu_buf *p = add(in, "positions", LK_I64, 1, &P, 0, 0);
    for (int64_t t = 0; t < P; t++) tu_set(p, t, (double)tu_randint(0, MP - 1));
    tu_fill_uniform(add(in, "q_pe", LK_BF16, 3, (int64_t[]){Tn, Hq, Dr}, 1, 1), -2, 2);
    tu_fill_uniform(add(in, "k_pe", LK_BF16, 2, (int64_t[]){Tn, Dr}, 1, 1), -2, 2);
    fill_kv_tiles(add(in, "kv_c", LK_BF16, 2, (int64_t[]){Tn, Dl}, 0, 0), Tn, Dl);
    tu_fill_uniform(add(in, "cos_sin_cache", LK_F32, 2, (int64_t[]){MP, Dr}, 0, 0), -1, 1);
    add(in, "kv_c_cache", LK_I8, 4, (int64_t[]){NB, bs, 1, ds_entry(Dl, Dr)}, 1, 2);
    in->arg[5].fp8 = in->arg[5].i8 = 1;
    fill_slots(add(in, "slot_mapping", LK_I32, 1, &Tn, 0, 0), Tn, NB * bs);
}
static lk_status call_mla_rope_ds(const oc_inst *in) {
    return lk_concat_and_cache_mla_rope(T(in, 0), T(in, 1), T(in, 2), T(in, 3), T(in, 4), 1, T(in, 5), NULL,
                                        T(in, 6), LK_KV_DS_MLA, NULL);
}

/* gather out of an fp8_ds_mla cache into bf16 (vLLM's cp_gather_and_upconvert_fp8_kv_cache):
 * args out [S, Dl + Dr] (padded), cache e4m3 [NB, bs, E] (padded), block_table, seq_lens,
 * and for lk_gather_cache_starts seq_starts (optional; the lens and starts of
 * make_gather / make_gather_starts) */
static void make_gather_ds(oc_inst *in, oc_size sz, int starts) {
    int64_t B = sz == OC_LARGE ? 4 : 2, bs = sz == OC_LARGE ? 16 : 4, NB = sz == OC_LARGE ? 80 : 6;
    int64_t Dl = sz == OC_LARGE ? 512 : 256, Dr = sz == OC_LARGE ? 64 : 32, maxp = sz == OC_LARGE ? 22 : 3;
    int64_t lens_l[4] = {300, 250, 100, 340}, lens_s[2] = {5, 3}, st_l[4] = {52, 101, 7, 12}, st_s[2] = {6, 9}, S = 0;
    const int64_t *lens = sz == OC_LARGE ? lens_l : lens_s, *st = sz == OC_LARGE ? st_l : st_s;
    for (int64_t b = 0; b < B; b++) S += lens[b];
    add(in, "out", LK_BF16, 2, (int64_t[]){S, Dl + Dr}, 1, 1);
    fill_ds(add(in, "cache", LK_F8E4M3, 3, (int64_t[]){NB, bs, ds_entry(Dl, Dr)}, 0, 2), Dl, Dr);
    in->arg[1].fp8 = in->arg[1].i8 = 1;
    tu_buf *bt = add(in, "block_table", LK_I32, 2, (int64_t[]){B, maxp}, 0, 0);
    for (int64_t i = 0; i < B * maxp; i++) tu_set(bt, i, (double)tu_randint(0, NB - 1));
    tu_buf *sl = add(in, "seq_lens", LK_I32, 1, &B, 0, 0);
    for (int64_t b = 0; b < B; b++) tu_set(sl, b, (double)lens[b]);
    if (starts) {
        tu_buf *ss = add(in, "seq_starts", LK_I32, 1, &B, 0, 1);
        for (int64_t b = 0; b < B; b++) tu_set(ss, b, (double)st[b]);
        in->arg[4].optional = 1; /* NULL: no offsets */
    }
}
static void make_gather_ds_plain(oc_inst *in, oc_size sz) { make_gather_ds(in, sz, 0); }
static void make_gather_ds_starts(oc_inst *in, oc_size sz) { make_gather_ds(in, sz, 1); }
static lk_status call_gather_ds(const oc_inst *in) {
    return lk_gather_cache_fp8(T(in, 0), T(in, 1), T(in, 2), T(in, 3), LK_KV_DS_MLA, NULL);
}
static lk_status call_gather_starts_ds(const oc_inst *in) {
    return lk_gather_cache_starts(T(in, 0), T(in, 1), T(in, 2), T(in, 3), T(in, 4), LK_KV_DS_MLA, NULL);
}

/* mla_decode over an fp8_ds_mla cache: out, lse (optional), q, kv_c_cache (e4m3, padded
 * records; [nb, bs, 1, E] in the f32 variant), block_table, cache_seqlens; s_q = 2
 * causal, the request lengths and page permutation of make_mla_dec. bf16: q / out bf16,
 * split_keys 2 (small) / 128 (several chunks per request); f32: q / out f32, planned split */
static void make_mla_dec_ds(oc_inst *in, oc_size sz, int f32) {
    int64_t B = sz == OC_LARGE ? 3 : 2, H = sz == OC_LARGE ? 16 : sz ? 8 : 3, s_q = 2;
    int64_t Dl = sz == OC_LARGE ? 512 : 256, Dr = sz == OC_LARGE ? 64 : 32, E = Dl + Dr, bs = sz == OC_LARGE ? 16 : 4;
    int64_t lens[3] = {sz == OC_LARGE ? 700 : 5, sz == OC_LARGE ? 300 : 3, 1200}, maxp = 0;
    lk_dtype dt = f32 ? LK_F32 : LK_BF16;
    int64_t nb = mla_dec_pages(lens, B, bs, &maxp);
    add(in, "out", dt, 4, (int64_t[]){B, s_q, H, Dl}, 1, 1);
    add(in, "lse", LK_F32, 3, (int64_t[]){B, H, s_q}, 1, 0);
    in->arg[1].optional = 1;
    tu_fill_uniform(add(in, "q", dt, 4, (int64_t[]){B, s_q, H, E}, 0, 1), -1, 1);
    if (f32) fill_ds(add(in, "kv_c_cache", LK_F8E4M3, 4, (int64_t[]){nb, bs, 1, ds_entry(Dl, Dr)}, 0, 2), Dl, Dr);
    else fill_ds(add(in, "kv_c_cache", LK_F8E4M3, 3, (int64_t[]){nb, bs, ds_entry(Dl, Dr)}, 0, 2), Dl, Dr);
    in->arg[3].fp8 = in->arg[3].i8 = 1;
    mla_dec_table(in, B, maxp, nb, bs, lens);
    in->mla_dec = lk_mla_decode_params_default((float)(1.0 / sqrt((double)E)));
    in->mla_dec.causal = 1;
    in->mla_dec.cache_layout = LK_KV_DS_MLA;
    in->mla_dec.split_keys = f32 ? 0 : sz == OC_LARGE ? 128 : 2;
    in->mla_dec.k_scale = 0.0f; /* not read with fp8_ds_mla (an fp8 ND cache would reject it) */
}
static void make_mla_dec_ds_bf16(oc_inst *in, oc_size sz) { make_mla_dec_ds(in, sz, 0); }
static void make_mla_dec_ds_f32(oc_inst *in, oc_size sz) { make_mla_dec_ds(in, sz, 1); }
static lk_status call_mla_dec_ds(const oc_inst *in) {
    return lk_mla_decode(T(in, 0), T(in, 1), T(in, 2), T(in, 3), NULL, T(in, 4), T(in, 5), &in->mla_dec);
}

/* convert_fp8: dst, src (quantize bf16 -> e4m3, or dequantize e5m2 -> f32) */
static void make_convert8(oc_inst *in, oc_size sz, int dequant) {
    int64_t NB = sz == OC_LARGE ? 64 : sz == OC_MEDIUM ? 12 : 3, s[4] = {NB, 16, 2, sz == OC_LARGE ? 128 : 40};
    add(in, "dst", dequant ? LK_F32 : LK_F8E4M3, 4, s, 1, 1);
    tu_fill_uniform(add(in, "src", dequant ? LK_F8E5M2 : LK_BF16, 4, s, 0, 0), -100, 100);
    in->arg[0].fp8 = in->arg[1].fp8 = 1;
    in->scale[0] = 0.25f;
}
static void make_convert8_q(oc_inst *in, oc_size sz) { make_convert8(in, sz, 0); }
static void make_convert8_dq(oc_inst *in, oc_size sz) { make_convert8(in, sz, 1); }
static lk_status call_convert8(const oc_inst *in) { return lk_convert_fp8(T(in, 0), T(in, 1), in->scale[0]); }

/* swap_blocks between fp8 caches */
static void make_swap8(oc_inst *in, oc_size sz) {
    make_swap(in, sz);
    for (int k = 0; k < 2; k++) {
        oc_arg *a = &in->arg[k];
        int64_t sh[4];
        for (int d = 0; d < 4; d++) sh[d] = a->buf.t.shape[d];
        tu_free(&a->buf);
        a->buf = tu_alloc(LK_F8E5M2, 4, sh, k);
        a->t = a->buf.t;
        tu_fill_uniform(&a->buf, -2, 2);
        a->fp8 = 1;
    }
}

/* ---------------------------------------------------------------- fp8 activations */

/* a [1] f32 scale argument holding v */
static void add_scale(oc_inst *in, const char *name, float v, int written) {
    tu_set(add(in, name, LK_F32, 1, (int64_t[]){1}, written, 0), 0, v);
}

static void make_quant(oc_inst *in, oc_size sz, lk_dtype ot, lk_dtype xt) {
    int64_t R = sz == OC_LARGE ? 64 : sz == OC_MEDIUM ? 48 : 3, D = sz == OC_LARGE ? 1024 : sz ? 520 : 40;
    int64_t s[2] = {R, D};
    add(in, "out", ot, 2, s, 1, 1);
    in->arg[0].fp8 = 1;
    tu_fill_uniform(add(in, "input", xt, 2, s, 0, 1), -3, 3);
}
static void make_quant_static(oc_inst *in, oc_size sz) {
    make_quant(in, sz, LK_F8E4M3, LK_BF16);
    add_scale(in, "scale", 0.0125f, 0);
}
static lk_status call_quant_static(const oc_inst *in) { return lk_static_scaled_fp8_quant(T(in, 0), T(in, 1), T(in, 2)); }
static void make_quant_tensor(oc_inst *in, oc_size sz) {
    make_quant(in, sz, LK_F8E5M2, LK_F16);
    add_scale(in, "scale", 0.0f, 1);
}
static lk_status call_quant_tensor(const oc_inst *in) { return lk_dynamic_scaled_fp8_quant(T(in, 0), T(in, 1), T(in, 2)); }
static void make_quant_token(oc_inst *in, oc_size sz) {
    make_quant(in, sz, LK_F8E4M3, LK_F32);
    add(in, "scales", LK_F32, 2, (int64_t[]){in->arg[1].t.shape[0], 1}, 1, 1);
    add_scale(in, "scale_ub", 2.5f, 0);
    in->arg[3].optional = 1;
}
static lk_status call_quant_token(const oc_inst *in) {
    return lk_dynamic_per_token_scaled_fp8_quant(T(in, 0), T(in, 1), T(in, 2), T(in, 3));
}
/* per token group: out, input, scales [R, D / G] written; G 8 (D 40, 520), 128 (D 1024,
 * DeepSeek-V3's); eps 1e-10, UE8M0 scales in the medium size */
static void make_quant_group(oc_inst *in, oc_size sz) {
    make_quant(in, sz, LK_F8E4M3, LK_BF16);
    in->arg[0].i8 = 1; /* the out takes LK_I8 too (per_token_group_quant_int8) */
    int64_t R = in->arg[1].t.shape[0], D = in->arg[1].t.shape[1];
    in->group = sz == OC_LARGE ? 128 : 8;
    add(in, "scales", LK_F32, 2, (int64_t[]){R, D / in->group}, 1, 1);
    in->eps = 1e-10f;
    in->flag = sz == OC_MEDIUM; /* scale_ue8m0 */
}
static lk_status call_quant_group(const oc_inst *in) {
    return lk_per_token_group_fp8_quant(T(in, 0), T(in, 1), T(in, 2), in->group, in->eps, in->flag);
}

/* static grid quant: out, input, scale [sm, sn] f32 given (read only), padded rows,
 * values in [0.01, 0.03]: small [3, 5] (groups of 1 row x 8 columns), medium [1, 520]
 * (per channel: the vector path), large [16, 8] (blocks of 4 rows x 128 columns) */
static void make_quant_grid(oc_inst *in, oc_size sz) {
    make_quant(in, sz, LK_F8E5M2, LK_F32);
    int64_t R = in->arg[1].t.shape[0], D = in->arg[1].t.shape[1];
    int64_t s[2] = {sz == OC_LARGE ? R / 4 : sz == OC_MEDIUM ? 1 : R,
                    sz == OC_LARGE ? D / 128 : sz == OC_MEDIUM ? D : D / 8};
    tu_fill_uniform(add(in, "scale", LK_F32, 2, s, 0, 1), 0.01, 0.03);
}
static lk_status call_quant_grid(const oc_inst *in) {
    return lk_static_group_scaled_fp8_quant(T(in, 0), T(in, 1), T(in, 2));
}

static void make_norm_quant(oc_inst *in, oc_size sz, lk_dtype xt, int residual) {
    make_quant(in, sz, LK_F8E4M3, xt);
    int64_t R = in->arg[1].t.shape[0], D = in->arg[1].t.shape[1];
    if (residual) tu_fill_uniform(add(in, "residual", LK_F32, 2, (int64_t[]){R, D}, 1, 0), -2, 2);
    tu_fill_uniform(add(in, "weight", LK_BF16, 1, &D, 0, 1), -1, 1);
    in->arg[in->nargs - 1].optional = 1; /* NULL: no weight */
    in->eps = 1e-6f;
}
static void make_norm_static(oc_inst *in, oc_size sz) {
    make_norm_quant(in, sz, LK_BF16, 0);
    add_scale(in, "scale", 0.01f, 0);
}
static lk_status call_norm_static(const oc_inst *in) {
    return lk_rms_norm_static_fp8_quant(T(in, 0), T(in, 1), T(in, 2), T(in, 3), in->eps);
}
static void make_norm_fused(oc_inst *in, oc_size sz) {
    make_norm_quant(in, sz, LK_F16, 1);
    add_scale(in, "scale", 0.02f, 0);
}
static lk_status call_norm_fused(const oc_inst *in) {
    return lk_fused_add_rms_norm_static_fp8_quant(T(in, 0), T(in, 1), T(in, 2), T(in, 3), T(in, 4), in->eps);
}
static void make_norm_token(oc_inst *in, oc_size sz) {
    make_norm_quant(in, sz, LK_BF16, 1); /* out, input, residual, weight */
    in->arg[2].optional = 1;            /* NULL: no residual add */
    add(in, "scales", LK_F32, 1, (int64_t[]){in->arg[1].t.shape[0]}, 1, 1);
    add_scale(in, "scale_ub", 1.5f, 0);
    in->arg[5].optional = 1;
}
static lk_status call_norm_token(const oc_inst *in) {
    return lk_rms_norm_dynamic_per_token_quant(T(in, 0), T(in, 1), T(in, 3), T(in, 4), in->eps, T(in, 5), T(in, 2));
}
static void make_norm_token_fp8(oc_inst *in, oc_size sz) {
    make_norm_token(in, sz);
    in->arg[0].i8 = 1; /* the out takes LK_I8 too */
}
/* the int8 out (vLLM's torch.int8 out of rms_norm_dynamic_per_token_quant) */
static void make_norm_token_i8(oc_inst *in, oc_size sz) {
    make_norm_token_fp8(in, sz);
    oc_arg *o = &in->arg[0];
    int64_t shape[2] = {o->t.shape[0], o->t.shape[1]};
    tu_free(&o->buf);
    o->buf = tu_alloc(LK_I8, 2, shape, 1);
    o->t = o->buf.t;
}

/* per block: out, input, residual (optional), weight (optional), scales [R, D / G]
 * written, scale_ub (optional); G 8 (D 40), 40 (D 520: the int8 out, vLLM's column-major
 * scales, the transposed view of a [13, 48] buffer), 128 (D 1024, DeepSeek-V3's) */
static void make_norm_block(oc_inst *in, oc_size sz) {
    make_norm_quant(in, sz, LK_F16, 1); /* out, input, residual, weight */
    in->arg[0].i8 = 1;                   /* the out takes LK_I8 too */
    in->arg[2].optional = 1;             /* NULL: no residual add */
    int64_t R = in->arg[1].t.shape[0], D = in->arg[1].t.shape[1];
    in->group = sz == OC_LARGE ? 128 : sz == OC_MEDIUM ? 40 : 8;
    int64_t s[2] = {R, D / in->group};
    if (sz == OC_MEDIUM) {
        oc_arg *o = &in->arg[0];
        tu_free(&o->buf);
        o->buf = tu_alloc(LK_I8, 2, (int64_t[]){R, D}, 1);
        o->t = o->buf.t;
        add(in, "scales", LK_F32, 2, s, 1, 0);
        oc_arg *sc = &in->arg[in->nargs - 1];
        tu_free(&sc->buf);
        sc->buf = tu_alloc_perm(LK_F32, 2, s, (int[]){1, 0}, 0);
        sc->t = sc->buf.t;
    } else add(in, "scales", LK_F32, 2, s, 1, 1);
    add_scale(in, "scale_ub", 1.5f, 0);
    in->arg[5].optional = 1;
}
static lk_status call_norm_block(const oc_inst *in) {
    return lk_rms_norm_per_block_quant(T(in, 0), T(in, 1), T(in, 3), T(in, 4), in->eps, T(in, 5), T(in, 2),
                                       in->group);
}

/* silu_and_mul then quantization: out [R, d] (fp8; the per-block op's takes i8 too),
 * input [R, 2d] in [-6, 6] (|y| up to ~36); d 40 (small), 520 (medium), 9216 (large: two
 * full runs of 4096 columns and a partial one per row, the SIMD kernel's work units, 16 rows
 * of them). Static: scale [1] 0.1 (codes up to ~360, below e4m3's 448) */
static void make_act_quant(oc_inst *in, oc_size sz, lk_dtype ot) {
    int64_t R = sz == OC_LARGE ? 16 : sz == OC_MEDIUM ? 48 : 3, d = sz == OC_LARGE ? 9216 : sz ? 520 : 40;
    add(in, "out", ot, 2, (int64_t[]){R, d}, 1, 1);
    in->arg[0].fp8 = 1;
    tu_fill_uniform(add(in, "input", sz == OC_MEDIUM ? LK_F32 : LK_BF16, 2, (int64_t[]){R, 2 * d}, 0, sz != OC_LARGE), -6,
                    6);
}
static void make_silu_quant(oc_inst *in, oc_size sz) {
    make_act_quant(in, sz, sz == OC_MEDIUM ? LK_F8E5M2 : LK_F8E4M3);
    add_scale(in, "scale", 0.1f, 0);
}
static lk_status call_silu_quant(const oc_inst *in) { return lk_silu_and_mul_quant(T(in, 0), T(in, 1), T(in, 2)); }
/* per block: out, input, scales [R, d / G] written, scale_ub (optional, 0.05: it bounds
 * the larger blocks' e4m3 scales); G 8 (small), 40 (medium: the int8 out, vLLM's
 * column-major scales, the transposed view of a [13, 48] buffer), 128 (large,
 * DeepSeek-V3's: 72 blocks a row, runs of 32 blocks a work unit) */
static void make_silu_block(oc_inst *in, oc_size sz) {
    make_act_quant(in, sz, sz == OC_MEDIUM ? LK_I8 : LK_F8E4M3);
    in->arg[0].i8 = 1; /* the out takes LK_I8 too */
    int64_t R = in->arg[0].t.shape[0], d = in->arg[0].t.shape[1];
    in->group = sz == OC_LARGE ? 128 : sz == OC_MEDIUM ? 40 : 8;
    int64_t s[2] = {R, d / in->group};
    if (sz == OC_MEDIUM) {
        add(in, "scales", LK_F32, 2, s, 1, 0);
        oc_arg *sc = &in->arg[in->nargs - 1];
        tu_free(&sc->buf);
        sc->buf = tu_alloc_perm(LK_F32, 2, s, (int[]){1, 0}, 0);
        sc->t = sc->buf.t;
    } else add(in, "scales", LK_F32, 2, s, 1, 1);
    add_scale(in, "scale_ub", 0.05f, 0);
    in->arg[3].optional = 1; /* NULL: no bound */
}
static lk_status call_silu_block(const oc_inst *in) {
    return lk_silu_and_mul_per_block_quant(T(in, 0), T(in, 1), T(in, 2), T(in, 3), in->group);
}

/* ---------------------------------------------------------------- int8 activations */

static void make_i8q(oc_inst *in, oc_size sz, lk_dtype xt) {
    int64_t R = sz == OC_LARGE ? 64 : sz == OC_MEDIUM ? 48 : 3, D = sz == OC_LARGE ? 1024 : sz ? 520 : 40;
    int64_t s[2] = {R, D};
    add(in, "out", LK_I8, 2, s, 1, 1);
    in->arg[0].i8 = 1;
    tu_fill_uniform(add(in, "input", xt, 2, s, 0, 1), -3, 3);
}
static void make_i8q_static(oc_inst *in, oc_size sz) { /* symmetric: no azp */
    make_i8q(in, sz, LK_BF16);
    add_scale(in, "scale", 0.0125f, 0);
}
static lk_status call_i8q_static(const oc_inst *in) {
    return lk_static_scaled_int8_quant(T(in, 0), T(in, 1), T(in, 2), in->nargs > 3 ? T(in, 3) : NULL);
}
static void make_i8q_static_azp(oc_inst *in, oc_size sz) {
    make_i8q(in, sz, LK_F32);
    add_scale(in, "scale", 0.02f, 0);
    tu_set(add(in, "azp", LK_I32, 1, (int64_t[]){1}, 0, 0), 0, -7);
    in->arg[3].optional = 1; /* NULL: symmetric */
}
static void make_i8q_dynamic(oc_inst *in, oc_size sz) { /* symmetric: no azp */
    make_i8q(in, sz, LK_F16);
    add(in, "scales", LK_F32, 2, (int64_t[]){in->arg[1].t.shape[0], 1}, 1, 1);
}
static lk_status call_i8q_dynamic(const oc_inst *in) {
    return lk_dynamic_scaled_int8_quant(T(in, 0), T(in, 1), T(in, 2), in->nargs > 3 ? T(in, 3) : NULL);
}
static void make_i8q_dynamic_azp(oc_inst *in, oc_size sz) {
    make_i8q(in, sz, LK_BF16);
    add(in, "scales", LK_F32, 1, (int64_t[]){in->arg[1].t.shape[0]}, 1, 0);
    add(in, "azp", LK_I32, 2, (int64_t[]){in->arg[1].t.shape[0], 1}, 1, 1);
    in->arg[3].optional = 1; /* NULL: symmetric */
}

static void make_merge_fp8(oc_inst *in, oc_size sz) {
    make_merge2(in, sz);
    oc_arg *o = &in->arg[0];
    int64_t shape[3] = {o->t.shape[0], o->t.shape[1], o->t.shape[2]};
    tu_free(&o->buf);
    o->buf = tu_alloc(LK_F8E5M2, 3, shape, 1);
    o->t = o->buf.t;
    o->fp8 = 1;
    add_scale(in, "output_scale", 0.05f, 0);
}
static lk_status call_merge_fp8(const oc_inst *in) {
    return lk_merge_attn_states_scaled(T(in, 0), T(in, 1), T(in, 2), T(in, 3), T(in, 4), T(in, 5), T(in, 6));
}

/* ---- flash attention into an fp8 out (lk_flash_attn_varlen_scaled): the lk_flash_attn_varlen
 * builders with out retyped fp8 and output_scale [1] appended as the last argument */
static void attn_fp8_out(oc_inst *in, lk_dtype dt, int pad, float oscale) {
    oc_arg *o = &in->arg[0];
    int64_t shape[3] = {o->t.shape[0], o->t.shape[1], o->t.shape[2]};
    tu_free(&o->buf);
    o->buf = tu_alloc(dt, 3, shape, pad);
    o->t = o->buf.t;
    o->fp8 = 1;
    add_scale(in, "output_scale", oscale, 0);
}
/* dense K/V (prefill), e5m2 out with padding; output_scale is argument 7 */
static void make_attn_scaled_dense(oc_inst *in, oc_size sz) {
    make_attn_dense(in, sz);
    attn_fp8_out(in, LK_F8E5M2, 1, 0.02f);
}
static lk_status call_attn_scaled_dense(const oc_inst *in) {
    return lk_flash_attn_varlen_scaled(T(in, 0), T(in, 1), T(in, 2), T(in, 3), T(in, 4), T(in, 5), T(in, 6), NULL,
                                       NULL, &in->params, T(in, 7));
}
/* paged fp8 K/V with descales (arguments 8-10), e4m3 out; output_scale is argument 11 */
static void make_attn_scaled_fp8(oc_inst *in, oc_size sz) {
    make_attn_fp8(in, sz);
    attn_fp8_out(in, LK_F8E4M3, 0, 0.02f);
}
static lk_status call_attn_scaled_fp8(const oc_inst *in) {
    lk_attn_params p = in->params;
    p.q_descale = T(in, 8), p.k_descale = T(in, 9), p.v_descale = T(in, 10);
    return lk_flash_attn_varlen_scaled(T(in, 0), T(in, 1), T(in, 2), T(in, 3), T(in, 4), T(in, 5), NULL, T(in, 6),
                                       T(in, 7), &p, T(in, 11));
}
/* the decode path (1 and 3 queries per request, GQA 4 query heads per KV head, paged e4m3
 * K/V; OC_LARGE: several key chunks per request), e4m3 out with padding; output_scale is
 * argument 8 */
static void make_attn_scaled_decode(oc_inst *in, oc_size sz) {
    int64_t B = 2, Hq = 8, Hk = 2, D = sz == OC_LARGE ? 64 : 16, Tq = 4, n1 = B + 1;
    int64_t kl[2] = {sz == OC_LARGE ? 700 : 5, sz == OC_LARGE ? 1100 : 9};
    int64_t bs = sz == OC_LARGE ? 16 : 4, NB = sz == OC_LARGE ? 80 : 6, maxp = (kl[1] + bs - 1) / bs;
    add(in, "out", LK_F8E4M3, 3, (int64_t[]){Tq, Hq, D}, 1, 1);
    in->arg[0].fp8 = 1;
    add(in, "lse", LK_F32, 2, (int64_t[]){Tq, Hq}, 1, 0);
    in->arg[1].optional = 1;
    tu_fill_uniform(add(in, "q", LK_BF16, 3, (int64_t[]){Tq, Hq, D}, 0, 0), -2, 2);
    tu_fill_uniform(add(in, "k", LK_F8E4M3, 4, (int64_t[]){NB, bs, Hk, D}, 0, 0), -3, 3);
    tu_fill_uniform(add(in, "v", LK_F8E4M3, 4, (int64_t[]){NB, bs, Hk, D}, 0, 1), -3, 3);
    for (int k = 2; k < 5; k++) in->arg[k].fp8 = 1;
    tu_buf *cq = add(in, "cu_seqlens_q", LK_I32, 1, &n1, 0, 0);
    tu_set(cq, 0, 0), tu_set(cq, 1, 1), tu_set(cq, 2, (double)Tq);
    tu_buf *u = add(in, "seqused_k", LK_I32, 1, &B, 0, 0);
    tu_set(u, 0, (double)kl[0]), tu_set(u, 1, (double)kl[1]);
    tu_buf *bt = add(in, "block_table", LK_I32, 2, (int64_t[]){B, maxp}, 0, 0);
    for (int64_t i = 0; i < B * maxp; i++) tu_set(bt, i, (double)tu_randint(0, NB - 1));
    in->arg[7].optional = 1; /* NULL selects dense K/V (then seqused_k is refused: LK_ERR_VALUE) */
    add_scale(in, "output_scale", 0.0125f, 0);
    in->params = lk_attn_params_default(0.25f);
    in->params.causal = 1;
}
static lk_status call_attn_scaled_decode(const oc_inst *in) {
    return lk_flash_attn_varlen_scaled(T(in, 0), T(in, 1), T(in, 2), T(in, 3), T(in, 4), T(in, 5), NULL, T(in, 6),
                                       T(in, 7), &in->params, T(in, 8));
}

/* ---------------------------------------------------------------- the table */

const oc_op OC_OPS[] = {
    {"lk_rms_norm", make_rms_norm, call_rms_norm},
    {"lk_fused_add_rms_norm", make_fused, call_fused},
    {"lk_silu_and_mul", make_act, call_silu},
    {"lk_gelu_tanh_and_mul", make_act, call_gelu},
    {"lk_gelu_and_mul", make_act, call_gelu_erf},
    {"lk_mul_and_silu", make_act, call_mul_silu},
    {"lk_fatrelu_and_mul", make_act, call_fatrelu},
    {"lk_swigluoai_and_mul", make_act, call_swigluoai},
    {"lk_gelu_new", make_act_ew, call_gelu_new},
    {"lk_gelu_fast", make_act_ew, call_gelu_fast},
    {"lk_gelu_quick", make_act_ew, call_gelu_quick},
    {"lk_rotary_embedding", make_rotary, call_rotary},
    {"lk_reshape_and_cache_flash", make_kv, call_kv},
    {"lk_reshape_and_cache_flash_scaled", make_kv_fp8, call_kv_fp8},
    {"lk_merge_attn_states", make_merge2, call_merge2},
    {"lk_merge_attn_states_n", make_merge_n, call_merge_n},
    {"lk_causal_softmax", make_softmax, call_softmax},
    {"lk_swap_blocks", make_swap, call_swap},
    {"lk_copy_blocks", make_copy_blocks, call_copy_blocks},
    {"lk_concat_and_cache_mla", make_concat, call_concat},
    {"lk_gather_cache", make_gather, call_gather},
    {"lk_flash_attn_varlen", make_attn_dense, call_attn_dense},      /* dense K/V */
    {"lk_flash_attn_varlen", make_attn_paged, call_attn_paged},      /* paged K/V */
    {"lk_flash_attn_varlen", make_attn_alibi, call_attn_alibi},      /* paged K/V, ALiBi */
    {"lk_flash_attn_varlen", make_attn_fp8, call_attn_fp8},          /* paged fp8 K/V, descales */
    {"lk_mla_prefix_prefill", make_mla_split, call_mla},             /* split + merge, ND */
    {"lk_mla_prefix_prefill", make_mla_concat, call_mla},            /* concat, NZ two buffers */
    {"lk_mla_prefix_prefill", make_mla_fused, call_mla},             /* fused, ND two buffers */
    {"lk_mla_prefix_prefill", make_mla_absorbed, call_mla},          /* absorbed, NZ */
    {"lk_mla_prefix_prefill", make_mla_auto, call_mla},              /* auto, ND */
    /* fp8 latent caches (k_scale 0.5) */
    {"lk_mla_prefix_prefill", make_mla8_auto, call_mla},             /* auto, e4m3 ND */
    {"lk_mla_prefix_prefill", make_mla8_absorbed, call_mla},         /* absorbed, e5m2 NZ two buffers */
    {"lk_mla_prefix_prefill", make_mla8_fused, call_mla},            /* fused, e4m3 NZ */
    {"lk_mla_prefix_prefill", make_mla8_split, call_mla},            /* split + merge, e5m2 ND two buffers */
    {"lk_mla_prefix_prefill", make_mla8_concat, call_mla},           /* concat, e4m3 ND */
    {"lk_mla_decode", make_mla_dec_nd, call_mla_dec},                /* ND one buffer, planned split */
    {"lk_mla_decode", make_mla_dec_nz2, call_mla_dec},               /* NZ two buffers, split 128 */
    {"lk_mla_decode", make_mla_dec_f8nz, call_mla_dec},              /* fp8 e4m3 NZ (tile 32), k_scale */
    {"lk_mla_decode", make_mla_dec_f8nd2, call_mla_dec},             /* fp8 e5m2 ND two buffers, split 128 */
    {"lk_mla_decode_plan", make_mla_plan, call_mla_plan},
    /* fp8 caches (since 0.3) */
    {"lk_reshape_and_cache_flash_fp8", make_kv8_nd, call_kv8},   /* ND, e4m3 + bf16 caches */
    {"lk_reshape_and_cache_flash_fp8", make_kv8_nz, call_kv8},   /* NZ, e4m3 + e5m2 caches */
    {"lk_concat_and_cache_mla_fp8", make_concat8_nd, call_concat8}, /* ND two buffers */
    {"lk_concat_and_cache_mla_fp8", make_concat8_nz, call_concat8}, /* NZ one buffer */
    {"lk_concat_and_cache_mla_rope", make_mla_rope_nd, call_mla_rope}, /* ND two buffers */
    {"lk_concat_and_cache_mla_rope", make_mla_rope_nz, call_mla_rope}, /* NZ one buffer */
    {"lk_gather_cache_fp8", make_gather8_nd, call_gather8},
    {"lk_gather_cache_fp8", make_gather8_nz, call_gather8},
    {"lk_gather_cache_starts", make_gather_starts_nd, call_gather_starts},
    {"lk_gather_cache_starts", make_gather_starts_nz, call_gather_starts},
    /* fp8_ds_mla caches (LK_KV_DS_MLA) */
    {"lk_concat_and_cache_mla_fp8", make_concat_ds, call_concat_ds},         /* e4m3 records, padded */
    {"lk_concat_and_cache_mla_rope", make_mla_rope_ds, call_mla_rope_ds},     /* i8 records [.., 1, E] */
    {"lk_gather_cache_fp8", make_gather_ds_plain, call_gather_ds},            /* bf16 out */
    {"lk_gather_cache_starts", make_gather_ds_starts, call_gather_starts_ds}, /* bf16 out, seq_starts */
    {"lk_mla_decode", make_mla_dec_ds_bf16, call_mla_dec_ds},                 /* bf16, split 2 / 128 */
    {"lk_mla_decode", make_mla_dec_ds_f32, call_mla_dec_ds},                  /* f32, [.., 1, E], planned */
    {"lk_convert_fp8", make_convert8_q, call_convert8},
    {"lk_convert_fp8", make_convert8_dq, call_convert8},
    {"lk_swap_blocks", make_swap8, call_swap},
    /* fp8 activations */
    {"lk_static_scaled_fp8_quant", make_quant_static, call_quant_static},
    {"lk_dynamic_scaled_fp8_quant", make_quant_tensor, call_quant_tensor},
    {"lk_dynamic_per_token_scaled_fp8_quant", make_quant_token, call_quant_token},
    {"lk_per_token_group_fp8_quant", make_quant_group, call_quant_group},
    {"lk_static_group_scaled_fp8_quant", make_quant_grid, call_quant_grid},
    {"lk_rms_norm_static_fp8_quant", make_norm_static, call_norm_static},
    {"lk_fused_add_rms_norm_static_fp8_quant", make_norm_fused, call_norm_fused},
    {"lk_rms_norm_dynamic_per_token_quant", make_norm_token_fp8, call_norm_token},
    {"lk_rms_norm_dynamic_per_token_quant", make_norm_token_i8, call_norm_token},
    {"lk_rms_norm_per_block_quant", make_norm_block, call_norm_block},
    {"lk_merge_attn_states_scaled", make_merge_fp8, call_merge_fp8},
    {"lk_silu_and_mul_quant", make_silu_quant, call_silu_quant},
    {"lk_silu_and_mul_per_block_quant", make_silu_block, call_silu_block},
    /* int8 activations */
    {"lk_static_scaled_int8_quant", make_i8q_static, call_i8q_static},          /* symmetric */
    {"lk_static_scaled_int8_quant", make_i8q_static_azp, call_i8q_static},      /* azp */
    {"lk_dynamic_scaled_int8_quant", make_i8q_dynamic, call_i8q_dynamic},       /* symmetric */
    {"lk_dynamic_scaled_int8_quant", make_i8q_dynamic_azp, call_i8q_dynamic},   /* azp written */
    /* flash attention into an fp8 out */
    {"lk_flash_attn_varlen_scaled", make_attn_scaled_dense, call_attn_scaled_dense},   /* dense K/V, e5m2 out */
    {"lk_flash_attn_varlen_scaled", make_attn_scaled_fp8, call_attn_scaled_fp8},       /* paged fp8 K/V, descales */
    {"lk_flash_attn_varlen_scaled", make_attn_scaled_decode, call_attn_scaled_decode}, /* decode, GQA 4, e4m3 K/V */
};
const int OC_NOPS = (int)(sizeof OC_OPS / sizeof OC_OPS[0]);

/* ---------------------------------------------------------------- instances */

void oc_make(const oc_op *op, oc_inst *in, oc_size size, uint64_t seed) {
    memset(in, 0, sizeof *in);
    in->op = op;
    tu_seed(seed);
    op->make(in, size);
}

lk_status oc_call(const oc_inst *in) { return in->op->call(in); }

void oc_free(oc_inst *in) {
    for (int k = 0; k < in->nargs; k++)
        if (!in->arg[k].shared) tu_free(&in->arg[k].buf);
    in->nargs = 0;
}

static tu_buf copy_buf(const tu_buf *s) {
    tu_buf b = *s;
    b.base = malloc(s->bytes);
    b.snap = malloc(s->bytes);
    b.inview = malloc(s->bytes);
    memcpy(b.base, s->base, s->bytes);
    memcpy(b.snap, s->snap, s->bytes);
    memcpy(b.inview, s->inview, s->bytes);
    b.t.data = b.base + ((const unsigned char *)s->t.data - s->base);
    return b;
}

void oc_clone(oc_inst *dst, const oc_inst *src, int share_inputs) {
    *dst = *src;
    for (int k = 0; k < src->nargs; k++) {
        const oc_arg *a = &src->arg[k];
        oc_arg *d = &dst->arg[k];
        if (share_inputs && !a->written) {
            d->shared = 1;
            continue;
        }
        d->shared = 0;
        d->buf = copy_buf(&a->buf);
        /* the argument's (maybe modified) view, moved to the copy */
        d->t = a->t;
        if (a->t.data)
            d->t.data = d->buf.base + ((const unsigned char *)a->t.data - a->buf.base);
    }
}

int oc_same_written(const oc_inst *a, const oc_inst *b) {
    for (int k = 0; k < a->nargs; k++)
        if (a->arg[k].written &&
            (a->arg[k].buf.bytes != b->arg[k].buf.bytes ||
             memcmp(a->arg[k].buf.base, b->arg[k].buf.base, a->arg[k].buf.bytes)))
            return 0;
    return 1;
}

void oc_snapshot(oc_inst *in) {
    for (int k = 0; k < in->nargs; k++) tu_snapshot(&in->arg[k].buf);
}

int oc_intact(const oc_inst *in) {
    for (int k = 0; k < in->nargs; k++)
        if (!tu_intact(&in->arg[k].buf)) return 0;
    return 1;
}

int oc_find(const oc_inst *in, const char *name) {
    for (int k = 0; k < in->nargs; k++)
        if (!strcmp(in->arg[k].name, name)) return k;
    return -1;
}
