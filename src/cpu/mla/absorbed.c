/*
 * MLA prefix prefill, strategy absorbed: attention over the prefix in latent space, the
 * prefix is never projected; the current tokens continue the same online softmax.
 *
 *   W_UK_h = kv_b_proj[h (Dn + Dv) + [0, Dn), :]      [Dn, Dl] (a->wuk: bf16 as passed
 *            when q and kv_b_proj are bf16, else f32)
 *   W_UV_h = kv_b_proj[h (Dn + Dv) + Dn + [0, Dv), :] [Dv, Dl] (a->wuv, f32)
 *   G = gather(prefix pages)  [pages * bs, Dl + Dr] (uniform pages, see mla.h): bf16 as
 *       cached when lk_mla_lat_bf16 (q, the cache and out bf16, oneDNN with bf16 GEMMs:
 *       lat16), else f32
 *   kf, vf = k, v as f32 head-major [H, T, Dqk / Dv] (one copy per wave)
 *   unit (request b, block of tok tokens; rows r = (head, token)):
 *     Qa [H tok, Dl + Dr] = scale * [q_nope_h . W_UK_h | q_rope_h]     (GEMM per head,
 *        bf16 x bf16 on q's rows and the weight as they are when both are bf16; f32,
 *        then rounded to bf16 once with lat16)
 *     Ol [H tok, Dl], states = the online engine (online.c) over the prefix entries of G,
 *        keys [c | k_pe] and values c shared by all heads (MQA), with lat16 on bf16
 *        operands (bf16 x bf16 GEMMs, P rounded to bf16). The scores equal the
 *        projected ones: q_nope . (W_UK c) + q_rope . k_pe = (q_nope W_UK) . c + ...;
 *     O_h [tok, Dv] = Ol_h . W_UV_h^T: the unnormalised prefix output in value space
 *        (W_UV is linear: sum p_j W_UV c_j = W_UV sum p_j c_j)   (f32 GEMM per head; Ol
 *        is not rounded to bf16)
 *     per head: the engine continues from (O_h, states) over the current keys k / v
 *        (causal), so no LSE merge is needed; out = O_h * lk_softmax_inv(l).
 *   Tokens of a request with a prefix go in units of about RB (head, token) rows; a
 *   request without one runs as fused does (units of one head and up to QB tokens).
 * Costs ~ Q * H * P * (2 Dl + Dr) per request instead of the projection's P * Dl * H *
 * (Dn + Dv) + Q * H * P * (Dqk + Dv): the better choice when few new tokens meet a long
 * prefix.
 * Work split: units (one parallel region) handed out dynamically, each writing its own
 * rows of out; every GEMM is single-threaded with a shape that depends only on the
 * request, so the bits depend neither on the thread count nor on the rest of the batch.
 */
#include <stdlib.h>
#include <string.h>

#include "../../core/half.h"
#include "mla.h"

#define RB 128 /* (head, token) rows per unit of a request with a prefix, at most */
#define QB 256 /* tokens per unit of a request without one, at most */

/* a request's token blocks (its tokens split evenly), their token count, and its units:
 * one per block with a prefix (all heads), one per (block, head) without (as fused) */
static int64_t n_blocks_of(const lk_mla_args *a, int64_t b) {
    int64_t ql = a->cu_q[b + 1] - a->cu_q[b];
    return a->prefix[b] > 0 ? (ql * a->H + RB - 1) / RB : (ql + QB - 1) / QB;
}
static int64_t unit_tokens(const lk_mla_args *a, int64_t b) {
    int64_t ql = a->cu_q[b + 1] - a->cu_q[b], n = n_blocks_of(a, b);
    return n ? (ql + n - 1) / n : 0;
}
static int64_t n_units_of(const lk_mla_args *a, int64_t b) {
    return n_blocks_of(a, b) * (a->prefix[b] > 0 ? 1 : a->H);
}

/* floats of the query area: the latent queries [H tok, E], later the current tokens'
 * q rows [tok, Dqk] of one head (larger when H E < Dqk, e.g. a small latent dim) */
static int64_t qa_len(int64_t rows, int64_t E, int64_t maxtok, int64_t Dqk) {
    return rows * E > maxtok * Dqk ? rows * E : maxtok * Dqk;
}

typedef struct {
    const lk_mla_args *a;
    const lk_mla_plan *p;
    const void *G;             /* gathered prefix [pages * bs, E], bf16 when lat16 else f32 */
    int lat16;                 /* latent attention on bf16 operands */
    lk_tensor qa;              /* absorb_q's A: q [T, H, Dqk] with wuk's dtype (q or an f32 view) */
    const float *kf, *vf;      /* current k [H, T, Dqk], v [H, T, Dv] f32 */
    atomic_int status;
    int64_t *unit;             /* b * ublk + block */
    int64_t ublk, max_seg, maxtok;
    char *scratch;             /* per thread */
    size_t scratch_bytes;
} abs_ctx;

static void absorbed_unit(void *vctx, int64_t u, int tid) {
    abs_ctx *c = vctx;
    const lk_mla_args *a = c->a;
    int64_t H = a->H, Dn = a->Dn, Dr = a->Dr, Dv = a->Dv, Dl = a->Dl, E = Dl + Dr, Dqk = Dn + Dr;
    int64_t b = c->unit[u] / c->ublk, k = c->unit[u] % c->ublk, P = a->prefix[b];
    int64_t ut = unit_tokens(a, b), q0 = a->cu_q[b], ql = a->cu_q[b + 1] - q0;
    int64_t i0 = (P > 0 ? k : k / H) * ut, tok = ql - i0 < ut ? ql - i0 : ut, t0 = q0 + i0;
    int64_t h0 = P > 0 ? 0 : k % H, h1 = P > 0 ? H : h0 + 1; /* heads of the unit */
    int64_t mt = c->maxtok, rows = H * mt;
    float *S = (float *)(c->scratch + (size_t)tid * c->scratch_bytes);  // [max(rows, mt), KB]
    float *panel = S + (rows > mt ? rows : mt) * LK_MLA_KB;              // [KB, E or Dqk + Dv]
    float *Qa = panel + LK_MLA_KB * (E > Dqk + Dv ? E : Dqk + Dv);       // [H tok, E], then Qs [tok, Dqk]
    float *Ol = Qa + qa_len(rows, E, mt, Dqk);                          // [H tok, Dl]
    float *O = Ol + rows * Dl;                                          // [H tok, Dv]
    uint16_t *P16 = (uint16_t *)(O + rows * Dv);                        // [H tok, KB] bf16
    uint16_t *Qa16 = P16 + rows * LK_MLA_KB;                            // [H tok, E] bf16
    lk_online_state *st = (lk_online_state *)(Qa16 + rows * E + (rows * E) % 2); // [H tok]
    lk_mla_segment *seg = lk_mla_seg_align(st + rows);                  // [max_seg]
    const lk_tensor *qa = &c->qa, *uk = &a->wuk, *uv = &a->wuv, *q = &a->q;
    lk_status s = LK_OK;
    if (P > 0) {
        /* fp8 parts of G hold the codes' values: k_scale goes into the queries' scores
         * (softmax scale x part scale) and into the latent outputs below */
        float ls = a->scale * a->lat_scale, rs = a->scale * a->rope_scale;
        for (int64_t h = 0; h < H && !s; h++) {
            const void *qh = lk_at(qa, t0 * qa->stride[0] + h * qa->stride[1]); // [tok, Dn] rows stride[0] apart
            float *dst = Qa + h * tok * E;
            s = lk_mla_gemm(uk->dtype, 0, tok, Dl, Dn, qh, qa->stride[0], lk_at(uk, h * uk->stride[0]), uk->stride[1],
                            0, dst, E);
            for (int64_t t = 0; t < tok; t++) {
                int64_t off = (t0 + t) * q->stride[0] + h * q->stride[1];
                for (int64_t i = 0; i < Dl; i++) dst[t * E + i] *= ls;
                for (int64_t i = 0; i < Dr; i++)
                    dst[t * E + Dl + i] = rs * lk_load_f(q->data, q->dtype, off + (Dn + i) * q->stride[2]);
            }
        }
        lk_dtype gdt = c->lat16 ? LK_BF16 : LK_F32;
        for (int64_t i = 0; i < H * tok * E && c->lat16; i++) Qa16[i] = lk_f32_to_bf16(Qa[i]);
        int64_t n = lk_mla_prefix_segments(a, c->p, b, gdt, c->G, E, c->G, E, seg);
        if (!s)
            s = lk_mla_online_attn(gdt, c->lat16 ? (const void *)Qa16 : Qa, E, H * tok, E, Dl, seg, n, NULL, S, P16,
                                   panel, Ol, Dl, st, 1);
        for (int64_t h = 0; h < H && !s; h++)
            s = lk_mla_gemm(LK_F32, 1, tok, Dv, Dl, Ol + h * tok * Dl, Dl, (const float *)uv->data + h * uv->stride[0],
                            uv->stride[1], 0, O + h * tok * Dv, Dv);
        for (int64_t i = 0; i < H * tok * Dv && a->lat_scale != 1.0f; i++) O[i] *= a->lat_scale;
    }
    for (int64_t h = h0; h < h1 && !s; h++) {
        float *Qs = Qa; /* the latent rows are done with */
        lk_mla_load_q(a, t0, tok, h, Qs);
        lk_mla_segment cur = {c->kf + (h * a->T + q0) * Dqk, c->vf + (h * a->T + q0) * Dv, Dqk, Dv, i0 + tok, 1, i0};
        s = lk_mla_online_attn(LK_F32, Qs, Dqk, tok, Dqk, Dv, NULL, 0, &cur, S, NULL, panel, O + h * tok * Dv, Dv,
                               st + h * tok, P == 0);
        if (!s) lk_mla_store_rows(a, t0, tok, h, O + h * tok * Dv, Dv, st + h * tok);
    }
    if (s) lk_mla_note(&c->status, s);
}

lk_status lk_mla_absorbed(const lk_mla_args *a, const lk_mla_plan *p) {
    int64_t H = a->H, Dl = a->Dl, Dr = a->Dr, Dv = a->Dv, E = Dl + Dr, Dqk = a->Dn + Dr, B = a->B;
    abs_ctx c;
    memset(&c, 0, sizeof c);
    atomic_init(&c.status, LK_OK);
    c.a = a, c.p = p, c.qa = a->q;
    float *q_owned = NULL, *kf = NULL, *vf = NULL;
    void *G = NULL;
    c.lat16 = lk_mla_lat_bf16(a);
    lk_dtype gdt = c.lat16 ? LK_BF16 : LK_F32;
    int64_t n_units = 0;
    for (int64_t b = 0; b < B; b++) {
        int64_t np = a->cu_q[b + 1] > a->cu_q[b] ? (a->prefix[b] + p->bs - 1) / p->bs : 0;
        n_units += n_units_of(a, b);
        if (n_units_of(a, b) > c.ublk) c.ublk = n_units_of(a, b);
        if (unit_tokens(a, b) > c.maxtok) c.maxtok = unit_tokens(a, b);
        if (np > c.max_seg) c.max_seg = np;
    }
    int nt = lk_plan_units(n_units);
    int64_t rows = H * c.maxtok, srows = rows > c.maxtok ? rows : c.maxtok;
    int64_t panel = LK_MLA_KB * (E > Dqk + Dv ? E : Dqk + Dv);
    c.scratch_bytes = sizeof(float) * (size_t)(srows * LK_MLA_KB + panel + qa_len(rows, E, c.maxtok, Dqk) +
                                               rows * (Dl + Dv)) +
                      sizeof(uint16_t) * (size_t)(rows * (LK_MLA_KB + E) + 1) + sizeof(lk_online_state) * (size_t)rows + sizeof(lk_mla_segment) * (size_t)c.max_seg +
                      LK_MLA_SEG_SLACK;
    c.scratch_bytes = (c.scratch_bytes + 63) / 64 * 64;
    c.scratch = malloc(c.scratch_bytes * (size_t)nt);
    c.unit = malloc(sizeof(int64_t) * (size_t)(n_units + 1));
    if (p->pages) G = lk_mla_ws_get(a, 0, lk_esize(gdt) * (size_t)(p->pages * p->bs * E));
    lk_status s = c.scratch && c.unit && (G || !p->pages) ? LK_OK : LK_ERR_NOMEM;
    if (!s && p->pages) s = lk_mla_gather(a, p, gdt, G);
    if (!s && a->wuk.dtype == LK_F32) s = lk_mla_f32_view(&a->q, &c.qa, &q_owned);
    if (!s) s = lk_mla_heads_f32(&a->k, &kf);
    if (!s) s = lk_mla_heads_f32(&a->v, &vf);
    if (!s) {
        c.G = G, c.kf = kf, c.vf = vf;
        int64_t n = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t k = 0; k < n_units_of(a, b); k++) c.unit[n++] = b * c.ublk + k;
        lk_parallel_units(n_units, nt, absorbed_unit, &c);
        s = (lk_status)atomic_load(&c.status);
        lk_trace_item("latent_attn units=%lld (absorb_q %s gemm, mqa %s over %lld + %lld latent dims, absorb_out f32 "
                      "gemm, current keys causal) rows=%d kblock=%d",
                      (long long)n_units, lk_dtype_name(a->wuk.dtype), lk_dtype_name(gdt), (long long)Dl, (long long)Dr,
                      RB, LK_MLA_KB);
    }
    free(q_owned), free(kf), free(vf), free(c.scratch), free(c.unit);
    return s;
}
