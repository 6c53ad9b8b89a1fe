/*
 * MLA prefix prefill, the steps the strategies share (see mla.h for the pipeline): GEMM
 * operand views (f32 copies only where a GEMM cannot take the caller's tensor), the
 * projection plan (groups + dedup), the gather of the unique prefix pages, their
 * projection, the causal attention of the new tokens over themselves and the final LSE
 * merge.
 *
 * Determinism: every GEMM call is single-threaded (gemm.c) and its shape depends only on
 * the problem (a unique group is always projected by the same call, M = its pages *
 * block_size rows), calls are independent units handed to threads dynamically, so the
 * bits depend neither on the thread count nor on dedup (a GEMM's result for a row may
 * depend on the row's position inside the call and on M: OpenBLAS's did, period 12
 * rows on Zen).
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/fp8.h"
#include "../../core/half.h"
#include "mla.h"

/* ---------------------------------------------------------------- special values */

/* 1 if one of the n elements of dtype dt at p (stride s elements) is inf or NaN: its
 * exponent field all ones (fp8 e4m3: its NaN code S.1111.111, e4m3 has no inf) */
#define NF_SCAN(T, M)                                                                  \
    do {                                                                               \
        const T *x = p;                                                                \
        int any = 0;                                                                   \
        if (s == 1)                                                                    \
            for (int64_t i = 0; i < n; i++) any |= (x[i] & (M)) == (M);                \
        else                                                                           \
            for (int64_t i = 0; i < n; i++) any |= (x[i * s] & (M)) == (M);            \
        return any;                                                                    \
    } while (0)
int lk_mla_span_nonfinite(const void *p, lk_dtype dt, int64_t n, int64_t s) {
    switch (dt) {
    case LK_F32: NF_SCAN(uint32_t, 0x7f800000u);
    case LK_F16: NF_SCAN(uint16_t, 0x7c00u);
    case LK_BF16: NF_SCAN(uint16_t, 0x7f80u);
    case LK_F8E4M3: NF_SCAN(uint8_t, 0x7fu);
    case LK_F8E5M2: NF_SCAN(uint8_t, 0x7cu);
    default: return 0;
    }
}

#undef NF_SCAN

/* ---------------------------------------------------------------- workspace */

void *lk_mla_ws_get(const lk_mla_args *a, int slot, size_t bytes) {
    lk_mla_ws *ws = a->ws;
    if (bytes < 64) bytes = 64;
    if (ws->n[slot] < bytes) {
        free(ws->p[slot]);
        ws->p[slot] = malloc(bytes);
        ws->n[slot] = ws->p[slot] ? bytes : 0;
    }
    return ws->p[slot];
}

void lk_mla_ws_free(lk_mla_ws *ws) {
    for (int i = 0; i < LK_MLA_WS_SLOTS; i++) free(ws->p[i]);
    memset(ws, 0, sizeof *ws);
}

/* ---------------------------------------------------------------- GEMM operands */

typedef struct {
    const lk_tensor *src;
    float *dst;   /* contiguous rows of the last dim; heads: [H, T, D] */
    int heads;    /* src [T, H, D] to head-major dst */
} conv_ctx;

/* n elements p[i * s] of dtype dt to f32 d[i] */
static void load_f32(float *d, const void *p0, lk_dtype dt, int64_t n, int64_t s) {
    if (dt == LK_F32) {
        const float *p = p0;
        for (int64_t i = 0; i < n; i++) d[i] = p[i * s];
    } else if (dt == LK_BF16) {
        const uint16_t *p = p0;
        for (int64_t i = 0; i < n; i++) d[i] = lk_bf16_to_f32(p[i * s]);
    } else {
        const uint16_t *p = p0;
        for (int64_t i = 0; i < n; i++) d[i] = lk_f16_to_f32(p[i * s]);
    }
}

static void conv_rows(void *vctx, int64_t r0, int64_t r1) {
    const conv_ctx *c = vctx;
    const lk_tensor *t = c->src;
    int64_t D = t->shape[t->ndim - 1], s = t->stride[t->ndim - 1];
    if (c->heads) {
        int64_t T = t->shape[0], H = t->shape[1];
        for (int64_t r = r0; r < r1; r++)
            for (int64_t h = 0; h < H; h++)
                load_f32(c->dst + (h * T + r) * D, lk_at(t, r * t->stride[0] + h * t->stride[1]), t->dtype, D, s);
        return;
    }
    lk_rowit it;
    lk_rowit_init(&it, t, 1, r0);
    for (int64_t r = r0; r < r1; r++, lk_rowit_next(&it)) load_f32(c->dst + r * D, lk_at(t, it.off), t->dtype, D, s);
}

int lk_mla_gemm_usable(const lk_tensor *t, lk_dtype dt) {
    int nd = t->ndim;
    int usable = t->dtype == dt && t->stride[nd - 1] == 1;
    for (int i = 0; i < nd && usable; i++)
        if (t->stride[i] < 0 || t->stride[i] > INT_MAX) usable = 0;
    for (int i = 0; i < nd - 1 && usable; i++) /* rows (and heads) do not overlap */
        if (t->stride[i] < t->shape[nd - 1]) usable = 0;
    return usable;
}

lk_status lk_mla_f32_view(const lk_tensor *t, lk_tensor *view, float **owned) {
    int nd = t->ndim;
    *owned = NULL;
    *view = *t;
    if (lk_mla_gemm_usable(t, LK_F32)) return LK_OK;
    int64_t n = lk_numel(t);
    float *buf = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    if (!buf) return LK_ERR_NOMEM;
    conv_ctx c = {t, buf, 0};
    int64_t D = t->shape[nd - 1];
    if (D > 0) lk_parallel_for(n / D, D * 6, conv_rows, &c);
    *view = lk_tensor_make(buf, LK_F32, nd, t->shape);
    *owned = buf;
    return LK_OK;
}

lk_status lk_mla_heads_f32(const lk_tensor *t, float **out) {
    int64_t T = t->shape[0], HD = t->shape[1] * t->shape[2];
    *out = malloc(sizeof(float) * (size_t)(T * HD > 0 ? T * HD : 1));
    if (!*out) return LK_ERR_NOMEM;
    conv_ctx c = {t, *out, 1};
    if (HD > 0) lk_parallel_for(T, HD * 6, conv_rows, &c);
    return LK_OK;
}

/* rows [r0, r0 + n) of each head's block of w [H * (Dn + Dv), Dl]: a [H, n, Dl] view */
static lk_tensor head_rows(const lk_mla_args *a, int64_t r0, int64_t n) {
    lk_tensor v = a->w;
    v.ndim = 3;
    v.shape[0] = a->H, v.shape[1] = n, v.shape[2] = a->Dl;
    v.stride[0] = (a->Dn + a->Dv) * a->w.stride[0], v.stride[1] = a->w.stride[0], v.stride[2] = a->w.stride[1];
    v.data = lk_at(&a->w, r0 * a->w.stride[0]);
    return v;
}

/* a cache part whose entries go into a bf16 G exactly: bf16, or fp8 (every fp8 value is
 * a bf16 value; the scale is applied after the GEMMs) */
static int bf16_exact(lk_dtype dt) { return dt == LK_BF16 || lk_is_fp8(dt); }

int lk_mla_lat_bf16(const lk_mla_args *a) {
    return a->q.dtype == LK_BF16 && bf16_exact(a->lat.dtype) && bf16_exact(a->rope.dtype) &&
           a->out.dtype == LK_BF16 && lk_mla_gemm_bf16();
}

int lk_mla_cur_bf16(const lk_mla_args *a) {
    if (lk_kernels()->isa != LK_ISA_AVX512BF16 || a->q.dtype != LK_BF16 || a->k.dtype != LK_BF16) return 0;
    return a->v.dtype == LK_BF16 && a->out.dtype == LK_BF16 ? 2 : 1;
}

int lk_mla_proj_bf16(const lk_mla_args *a) {
    return bf16_exact(a->lat.dtype) && bf16_exact(a->rope.dtype) && lk_mla_gemm_usable(&a->w, LK_BF16) &&
           lk_mla_gemm_bf16();
}

lk_status lk_mla_weights(lk_mla_args *a, lk_mla_strategy st, float *owned[2]) {
    int bf = lk_mla_gemm_usable(&a->w, LK_BF16) && lk_mla_gemm_bf16();
    owned[0] = owned[1] = NULL;
    a->gdt = LK_F32;
    if (st == LK_MLA_ABSORBED) {
        /* G feeds the f32 engine as its keys; W_UV meets the f32 latent outputs */
        lk_tensor uk = head_rows(a, 0, a->Dn), uv = head_rows(a, a->Dn, a->Dv);
        lk_status s = LK_OK;
        if (bf && lk_mla_gemm_usable(&a->q, LK_BF16))
            a->wuk = uk; /* absorb_q on the bf16 q rows as they are */
        else
            s = lk_mla_f32_view(&uk, &a->wuk, &owned[0]);
        if (!s) s = lk_mla_f32_view(&uv, &a->wuv, &owned[1]);
        return s;
    }
    if (lk_mla_proj_bf16(a)) {
        a->gdt = LK_BF16; /* the bf16 cache entries and weight as they are */
        a->wp = a->w;
        return LK_OK;
    }
    return lk_mla_f32_view(&a->w, &a->wp, &owned[0]);
}

/* ---------------------------------------------------------------- plan */

/* projection rows per GEMM call the plan aims at: the GEMM packs the whole weight (N x
 * Dl) in every call, so the call must be long enough to amortise it (oneDNN, one thread,
 * Zen 4, K = 512, N = 1024 / 4096: bf16 128 rows 207 / 200, 512 rows 214 / 209, 2048-4096
 * rows 211 / 219 GFLOP/s; f32 128 rows 99 / 63, 512 rows 94 / 92, 2048-4096 rows 109 / 111;
 * OpenBLAS f32 on Zen 3 likewise lost 9% of the step to packing with 128-row calls) */
static int64_t target_rows(int64_t N) {
    (void)N;
    return 512;
}

static uint64_t hash_ids(const int32_t *ids, int64_t n) {
    uint64_t h = 1469598103934665603ull ^ (uint64_t)n;
    for (int64_t i = 0; i < n; i++) h = (h ^ (uint32_t)ids[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

void lk_mla_plan_free(lk_mla_plan *p) {
    free(p->gp_pages);
    free(p->ptable);
    memset(p, 0, sizeof *p);
}

int64_t lk_mla_plan_g(const lk_mla_args *a) {
    int64_t bs = a->lat.block_size, total = 0;
    for (int64_t b = 0; b < a->B; b++)
        if (a->cu_q[b + 1] > a->cu_q[b]) total += (a->prefix[b] + bs - 1) / bs;
    int64_t g = (target_rows(a->H * (a->Dn + a->Dv)) + bs - 1) / bs;
    if (g > total / 8) g = total / 8;
    return g < 1 ? 1 : g;
}

lk_status lk_mla_plan_build(const lk_mla_args *a, int64_t g, lk_mla_plan *p) {
    memset(p, 0, sizeof *p);
    int64_t B = a->B, maxp = a->max_pages, bs = a->lat.block_size;
    p->bs = bs, p->g = g;
    int64_t nl = 0;
    for (int64_t b = 0; b < B; b++)
        if (a->cu_q[b + 1] > a->cu_q[b]) nl += ((a->prefix[b] + bs - 1) / bs + g - 1) / g;
    int64_t hcap = 16;
    while (hcap < 2 * nl) hcap *= 2;
    /* one allocation: the 4 final per-group arrays, 3 in discovery order, the logical ->
     * unique map (nl each) and the hash slots */
    int64_t *mem = malloc(sizeof(int64_t) * (size_t)(8 * nl + hcap + 1));
    p->ptable = malloc(sizeof(int32_t) * (size_t)(B * maxp > 0 ? B * maxp : 1));
    if (!mem || !p->ptable) {
        free(mem);
        free(p->ptable);
        p->ptable = NULL;
        return LK_ERR_NOMEM;
    }
    p->gp_pages = mem, p->gp_used = mem + nl, p->gp_page0 = mem + 2 * nl, p->gp_ids = mem + 3 * nl;
    int64_t *u_pages = mem + 4 * nl, *u_used = mem + 5 * nl, *u_ids = mem + 6 * nl;
    int64_t *lg_u = mem + 7 * nl, *slot = mem + 8 * nl;
    for (int64_t i = 0; i < hcap; i++) slot[i] = -1;
    memset(p->ptable, 0, sizeof(int32_t) * (size_t)(B * maxp));
    /* unique groups in discovery order */
    int64_t nu = 0, l = 0;
    for (int64_t b = 0; b < B; b++) {
        if (a->cu_q[b + 1] == a->cu_q[b]) continue;
        int64_t P = a->prefix[b], np = (P + bs - 1) / bs;
        for (int64_t k = 0; k * g < np; k++, l++) {
            int64_t npg = np - k * g < g ? np - k * g : g;
            int64_t used = (P < (k * g + npg) * bs ? P : (k * g + npg) * bs) - k * g * bs;
            int64_t ids = b * maxp + k * g, u = -1;
            if (a->dedup) {
                uint64_t h = hash_ids(a->table + ids, npg) & (uint64_t)(hcap - 1);
                for (; slot[h] >= 0; h = (h + 1) & (uint64_t)(hcap - 1)) {
                    int64_t c = slot[h];
                    if (u_pages[c] == npg &&
                        !memcmp(a->table + u_ids[c], a->table + ids, sizeof(int32_t) * (size_t)npg)) {
                        u = c;
                        break;
                    }
                }
                if (u < 0) slot[h] = nu;
            }
            if (u < 0) {
                u = nu++;
                u_pages[u] = npg, u_used[u] = used, u_ids[u] = ids;
            } else if (used > u_used[u]) {
                u_used[u] = used;
            }
            lg_u[l] = u;
        }
    }
    /* final order: groups of full pages first (gathered in one call), then the others */
    int64_t *rank = slot; /* the hash is no longer needed; hcap >= nu */
    int64_t nf = 0, nr = 0;
    for (int64_t u = 0; u < nu; u++)
        if (u_used[u] == u_pages[u] * bs) rank[u] = nf++;
    nr = nf;
    for (int64_t u = 0; u < nu; u++)
        if (u_used[u] != u_pages[u] * bs) rank[u] = nr++;
    for (int64_t u = 0; u < nu; u++) {
        int64_t r = rank[u];
        p->gp_pages[r] = u_pages[u], p->gp_used[r] = u_used[u], p->gp_ids[r] = u_ids[u];
    }
    int64_t pages = 0;
    for (int64_t r = 0; r < nu; r++) p->gp_page0[r] = pages, pages += p->gp_pages[r];
    l = 0;
    for (int64_t b = 0; b < B; b++) {
        if (a->cu_q[b + 1] == a->cu_q[b]) continue;
        int64_t np = (a->prefix[b] + bs - 1) / bs;
        for (int64_t k = 0; k * g < np; k++, l++) {
            int64_t r = rank[lg_u[l]];
            for (int64_t i = k * g; i < np && i < (k + 1) * g; i++)
                p->ptable[b * maxp + i] = (int32_t)(p->gp_page0[r] + i - k * g);
        }
    }
    p->n_groups = nu, p->n_full = nf, p->n_logical = nl, p->pages = pages;
    return LK_OK;
}

/* ---------------------------------------------------------------- gather */

/* gather_cache kernel call for unique groups [u0, u0 + n) into G rows from row0, cache
 * part `part` (0: the latent entries, or the whole entry in one buffer; 1: rope) */
static lk_status gather_groups(const lk_mla_args *a, const lk_mla_plan *p, int32_t *tbl, int32_t *lens, int64_t u0,
                               int64_t n, int part, lk_dtype gdt, void *G, int64_t row0) {
    int64_t E = a->Dl + a->Dr, rows = 0;
    for (int64_t u = u0; u < u0 + n; u++) rows += lens[u];
    if (rows == 0) return LK_OK;
    lk_gather_cache_args ga;
    memset(&ga, 0, sizeof ga);
    int64_t tshape[2] = {n, p->g};
    ga.block_table = lk_tensor_make(tbl + u0 * p->g, LK_I32, 2, tshape);
    ga.seq_lens = lk_tensor_make(lens + u0, LK_I32, 1, &n);
    ga.cache = part ? a->rope : a->lat;
    int64_t D = ga.cache.D, oshape[3] = {rows, 1, D};
    ga.out = lk_tensor_make((char *)G + (row0 * E + (part ? a->Dl : 0)) * lk_esize(gdt), gdt, 3, oshape);
    ga.out.stride[0] = E, ga.out.stride[1] = D;
    return lk_kernels()->gather_cache(&ga);
}

/* fp8 cache part: the codes widened exactly (f32(code), or its bf16 bits: every fp8 value
 * is a bf16 value) through a 256-entry table made from src/core/fp8.h; k_scale is applied
 * by the consumers (lk_mla_args.lat_scale / rope_scale) */
typedef struct {
    const lk_mla_args *a;
    const lk_mla_plan *p;
    const lk_paged *pc;
    int64_t col0;         /* first G column of the part */
    lk_dtype gdt;
    void *G;              /* [pages * bs, E] */
    float tf[256];        /* code -> f32 */
    uint16_t tb[256];     /* code -> bf16 bits */
} gather8_ctx;

static void gather8_groups(void *vctx, int64_t u0, int64_t u1) {
    const gather8_ctx *c = vctx;
    const lk_paged *pc = c->pc;
    const uint8_t *src = pc->data;
    int64_t E = c->a->Dl + c->a->Dr, D = pc->D, bs = c->p->bs;
    /* dims per contiguous run: the whole entry in ND, a tile row (32 codes) in NZ */
    int64_t run = pc->layout == LK_KV_NZ ? pc->tile : D;
    for (int64_t u = u0; u < u1; u++) {
        const int32_t *ids = c->a->table + c->p->gp_ids[u];
        for (int64_t r = 0; r < c->p->gp_used[u]; r++) {
            int64_t page = ids[r / bs], slot = r % bs, row = c->p->gp_page0[u] * bs + r;
            for (int64_t d = 0; d < D; d += run) {
                const uint8_t *q = src + lk_paged_off(pc, page, slot, 0, d); // [run] codes s3 apart
                int64_t n = D - d < run ? D - d : run, s3 = pc->s3;
                if (c->gdt == LK_BF16) {
                    uint16_t *o = (uint16_t *)c->G + row * E + c->col0 + d;
                    for (int64_t i = 0; i < n; i++) o[i] = c->tb[q[i * s3]];
                } else {
                    float *o = (float *)c->G + row * E + c->col0 + d;
                    for (int64_t i = 0; i < n; i++) o[i] = c->tf[q[i * s3]];
                }
            }
        }
    }
}

static void gather8(const lk_mla_args *a, const lk_mla_plan *p, int part, lk_dtype gdt, void *G) {
    gather8_ctx c;
    c.a = a, c.p = p, c.pc = part ? &a->rope : &a->lat, c.col0 = part ? a->Dl : 0, c.gdt = gdt, c.G = G;
    int e5 = c.pc->dtype == LK_F8E5M2;
    for (int i = 0; i < 256; i++) {
        c.tf[i] = e5 ? lk_f8e5m2_to_f32((uint8_t)i) : lk_f8e4m3_to_f32((uint8_t)i);
        c.tb[i] = lk_f32_to_bf16(c.tf[i]);
    }
    lk_parallel_for(p->n_groups, p->g * p->bs * c.pc->D * 3, gather8_groups, &c);
}

lk_status lk_mla_gather(const lk_mla_args *a, const lk_mla_plan *p, lk_dtype gdt, void *G) {
    int64_t nu = p->n_groups, g = p->g, bs = p->bs, E = a->Dl + a->Dr, es = lk_esize(gdt);
    int32_t *tbl = malloc(sizeof(int32_t) * (size_t)(nu * g + 1));
    int32_t *lens = malloc(sizeof(int32_t) * (size_t)(nu + 1));
    lk_status s = LK_ERR_NOMEM;
    int parts = a->one_buffer ? 1 : 2, calls = 0;
    if (tbl && lens) {
        for (int64_t u = 0; u < nu; u++) {
            for (int64_t i = 0; i < g; i++) /* unused slots repeat the first page */
                tbl[u * g + i] = a->table[p->gp_ids[u] + (i < p->gp_pages[u] ? i : 0)];
            lens[u] = (int32_t)p->gp_used[u];
        }
        s = LK_OK;
        for (int part = 0; part < parts && !s; part++) {
            if (lk_is_fp8((part ? a->rope : a->lat).dtype)) {
                gather8(a, p, part, gdt, G);
                calls++;
                continue;
            }
            s = gather_groups(a, p, tbl, lens, 0, p->n_full, part, gdt, G, 0);
            for (int64_t u = p->n_full; u < nu && !s; u++)
                s = gather_groups(a, p, tbl, lens, u, 1, part, gdt, G, p->gp_page0[u] * bs);
            calls += (p->n_full > 0) + (int)(nu - p->n_full);
        }
        for (int64_t u = p->n_full; u < nu && !s; u++) { /* rows past a group's used length */
            int64_t r0 = p->gp_page0[u] * bs, used = p->gp_used[u], end = r0 + p->gp_pages[u] * bs;
            memset((char *)G + (r0 + used) * E * es, 0, (size_t)((end - r0 - used) * E * es));
        }
        lk_trace_item("gather pages=%lld rows=%lld E=%lld %s calls=%d%s", (long long)p->pages,
                      (long long)(p->pages * bs), (long long)E, lk_dtype_name(gdt), calls,
                      lk_is_fp8(a->lat.dtype) || lk_is_fp8(a->rope.dtype) ? " (fp8 codes widened)" : "");
    }
    free(tbl);
    free(lens);
    return s;
}

/* ---------------------------------------------------------------- projection */

typedef struct {
    const lk_mla_args *a;
    const lk_mla_plan *p;
    const void *G;        /* [pages * bs, E] of dtype gdt */
    int64_t kr, kh, vr, vh; /* Kp / Vp strides of a row and of a head */
    float *Kp, *Vp, *tmp; /* tmp: per thread [g * bs, N] */
    int64_t tmp_floats;
    atomic_int status;
} proj_ctx;

static void proj_unit(void *vctx, int64_t u, int tid) {
    proj_ctx *c = vctx;
    const lk_mla_args *a = c->a;
    int64_t H = a->H, Dn = a->Dn, Dr = a->Dr, Dv = a->Dv, Dl = a->Dl, E = Dl + Dr, es = lk_esize(a->gdt);
    int64_t N = H * (Dn + Dv), row0 = c->p->gp_page0[u] * c->p->bs, M = c->p->gp_pages[u] * c->p->bs;
    const char *G = (const char *)c->G + row0 * E * es; // [M, E]
    float *C = c->tmp + (size_t)tid * (size_t)c->tmp_floats; // [M, N]
    float ls = a->lat_scale, rs = a->rope_scale; /* k_scale of fp8 parts, else 1 */
    lk_status s = lk_mla_gemm(a->gdt, 1, M, N, Dl, G, E, a->wp.data, a->wp.stride[0], 0, C, N);
    if (s) {
        lk_mla_note(&c->status, s);
        return;
    }
    for (int64_t r = 0; r < c->p->gp_used[u]; r++) {
        const float *cr = C + r * N;
        float *kr = c->Kp + (row0 + r) * c->kr, *vr = c->Vp + (row0 + r) * c->vr;
        load_f32(kr + Dn, G + (r * E + Dl) * es, a->gdt, Dr, 1); /* rope dims, head 0's copy */
        if (rs != 1.0f)
            for (int64_t i = 0; i < Dr; i++) kr[Dn + i] *= rs;
        for (int64_t h = 0; h < H; h++) {
            if (h) memcpy(kr + h * c->kh + Dn, kr + Dn, sizeof(float) * (size_t)Dr);
            if (ls == 1.0f) {
                memcpy(kr + h * c->kh, cr + h * (Dn + Dv), sizeof(float) * (size_t)Dn);
                memcpy(vr + h * c->vh, cr + h * (Dn + Dv) + Dn, sizeof(float) * (size_t)Dv);
                continue;
            }
            /* fp8 latents: G holds the codes' values, the product is scaled once here */
            const float *ck = cr + h * (Dn + Dv), *cv = ck + Dn;
            for (int64_t i = 0; i < Dn; i++) kr[h * c->kh + i] = ck[i] * ls;
            for (int64_t i = 0; i < Dv; i++) vr[h * c->vh + i] = cv[i] * ls;
        }
    }
}

lk_status lk_mla_project(const lk_mla_args *a, const lk_mla_plan *p, const void *G, int head_major, float *Kp,
                         float *Vp) {
    int64_t H = a->H, Dqk = a->Dn + a->Dr, Dv = a->Dv, N = H * (a->Dn + Dv), maxm = 0, rows = p->pages * p->bs;
    for (int64_t u = 0; u < p->n_groups; u++)
        if (p->gp_pages[u] * p->bs > maxm) maxm = p->gp_pages[u] * p->bs;
    int nt = lk_plan_units(p->n_groups);
    proj_ctx c = {a, p, G, H * Dqk, Dqk, H * Dv, Dv, Kp, Vp, NULL, maxm * N, LK_OK};
    if (head_major) c.kr = Dqk, c.kh = rows * Dqk, c.vr = Dv, c.vh = rows * Dv;
    c.tmp = malloc(sizeof(float) * (size_t)(nt * maxm * N + 1));
    if (!c.tmp) return LK_ERR_NOMEM;
    lk_parallel_units(p->n_groups, nt, proj_unit, &c);
    free(c.tmp);
    lk_trace_item("project gemm=%lld %s rows=%lld N=%lld K=%lld (groups %lld of %lld logical, %lld pages each)",
                  (long long)p->n_groups, lk_dtype_name(a->gdt), (long long)rows, (long long)N, (long long)a->Dl,
                  (long long)p->n_groups, (long long)p->n_logical, (long long)p->g);
    return (lk_status)atomic_load(&c.status);
}

lk_status lk_mla_project_prefix(const lk_mla_args *a, const lk_mla_plan *p, int head_major, float **Kp, float **Vp) {
    int64_t rows = p->pages * p->bs, E = a->Dl + a->Dr;
    void *G = lk_mla_ws_get(a, 0, (size_t)(lk_esize(a->gdt) * rows * E));
    *Kp = lk_mla_ws_get(a, 1, sizeof(float) * (size_t)(rows * a->H * (a->Dn + a->Dr)));
    *Vp = lk_mla_ws_get(a, 2, sizeof(float) * (size_t)(rows * a->H * a->Dv));
    lk_status s = LK_ERR_NOMEM;
    if (G && *Kp && *Vp && !(s = lk_mla_gather(a, p, a->gdt, G))) s = lk_mla_project(a, p, G, head_major, *Kp, *Vp);
    return s;
}

/* ---------------------------------------------------------------- attention pieces */

lk_status lk_mla_attn_current(const lk_mla_args *a, const lk_tensor *out, float *lse) {
    int32_t *len = malloc(sizeof(int32_t) * (size_t)(a->B + 1));
    if (!len) return LK_ERR_NOMEM;
    for (int64_t b = 0; b < a->B; b++) len[b] = a->cu_q[b + 1] - a->cu_q[b];
    lk_attn_args fa;
    memset(&fa, 0, sizeof fa);
    int64_t Dqk = a->Dn + a->Dr, lshape[2] = {a->T, a->H};
    fa.out = *out;
    if (lse) fa.lse = lk_tensor_make(lse, LK_F32, 2, lshape);
    fa.has_lse = lse != NULL;
    fa.q = a->q;
    const lk_tensor *k = &a->k, *v = &a->v;
    fa.kc = (lk_paged){k->data, k->dtype, LK_KV_ND, 1, a->T, a->H, Dqk, 0, k->stride[0], k->stride[1], k->stride[2], 16};
    fa.vc = (lk_paged){v->data, v->dtype, LK_KV_ND, 1, a->T, a->H, a->Dv, 0, v->stride[0], v->stride[1], v->stride[2], 16};
    /* as lk_flash_attn_varlen does for dense K/V: strides of size-1 dims are not
     * validated (any value, e.g. 2^61 on a single head) and must not enter the kernels'
     * byte-step arithmetic */
    lk_paged_drop_unit_strides(&fa.kc);
    lk_paged_drop_unit_strides(&fa.vc);
    fa.cu_q = a->cu_q, fa.k_start = a->cu_q, fa.k_len = len;
    fa.B = a->B, fa.Hq = a->H, fa.Hk = a->H, fa.Dqk = Dqk, fa.Dv = a->Dv;
    fa.scale = a->scale, fa.wl = -1, fa.wr = 0;
    lk_status s = lk_kernels()->flash_attn(&fa);
    free(len);
    lk_trace_item("flash_current causal tokens=%lld H=%lld D=%lld/%lld", (long long)(a->cu_q[a->B] - a->cu_q[0]),
                  (long long)a->H, (long long)Dqk, (long long)a->Dv);
    return s;
}

lk_status lk_mla_merge(const lk_mla_args *a, float *o1, float *lse1, float *o2, float *lse2) {
    int64_t oshape[3] = {a->T, a->H, a->Dv}, lshape[2] = {a->T, a->H};
    lk_tensor st[2] = {lk_tensor_make(o1, LK_F32, 3, oshape), lk_tensor_make(o2, LK_F32, 3, oshape)};
    lk_tensor ls[2] = {lk_tensor_make(lse1, LK_F32, 2, lshape), lk_tensor_make(lse2, LK_F32, 2, lshape)};
    lk_merge_args m;
    memset(&m, 0, sizeof m);
    m.out = a->out, m.n = 2, m.states = st, m.lses = ls;
    lk_trace_item("merge T=%lld H=%lld D=%lld", (long long)a->T, (long long)a->H, (long long)a->Dv);
    return lk_kernels()->merge_attn_states(&m);
}

void lk_mla_load_q(const lk_mla_args *a, int64_t t0, int64_t nq, int64_t h, float *Qs) {
    const lk_tensor *q = &a->q;
    int64_t Dqk = a->Dn + a->Dr;
    for (int64_t r = 0; r < nq; r++) {
        int64_t off = (t0 + r) * q->stride[0] + h * q->stride[1];
        for (int64_t d = 0; d < Dqk; d++)
            Qs[r * Dqk + d] = a->scale * lk_load_f(q->data, q->dtype, off + d * q->stride[2]);
    }
}

void lk_mla_store_rows(const lk_mla_args *a, int64_t t0, int64_t nq, int64_t h, const float *O, int64_t ldo,
                       const lk_online_state *st) {
    const lk_tensor *o = &a->out;
    for (int64_t r = 0; r < nq; r++) {
        float inv = lk_softmax_inv(st[r].l);
        int64_t off = (t0 + r) * o->stride[0] + h * o->stride[1];
        for (int64_t d = 0; d < a->Dv; d++) lk_store_f(o->data, o->dtype, off + d * o->stride[2], O[r * ldo + d] * inv);
    }
}

void lk_mla_zero_padding(const lk_mla_args *a) {
    const lk_tensor *o = &a->out;
    for (int64_t t = 0; t < a->T; t++) {
        if (t >= a->cu_q[0] && t < a->cu_q[a->B]) continue;
        for (int64_t h = 0; h < a->H; h++)
            for (int64_t d = 0; d < a->Dv; d++)
                lk_store_f(o->data, o->dtype, t * o->stride[0] + h * o->stride[1] + d * o->stride[2], 0.0f);
    }
}
