/*
 * Fuzz harness: fp8_ds_mla caches (LK_KV_DS_MLA, include/llmkern.h "fp8_ds_mla caches")
 * through every entry that takes them (see fuzz_common.h for the generic checks):
 *   write   lk_concat_and_cache_mla_fp8 (rarely lk_concat_and_cache_mla: LK_ERR_VALUE)
 *   gather  lk_gather_cache_fp8 (rarely lk_gather_cache: LK_ERR_VALUE)
 *   starts  lk_gather_cache_starts (seq_starts i32 or NULL)
 *   decode  lk_mla_decode with params.cache_layout LK_KV_DS_MLA
 *   rope    lk_concat_and_cache_mla_rope into a DS cache
 * Input: Dl (128 / 256 mostly, 384, and invalid 0 / 64 / 200), Dr 0..17, num_blocks,
 * block_size 1..9 (0 in an empty cache), T, N <= T, B, s_q, H; dtypes of every argument
 * (cache f8e4m3 or i8, rarely another dtype); the cache [nb, bs, E] or [nb, bs, 1, E]
 * with contiguous, padded (even and odd) strides, page-interleaved, negative, broadcast
 * (0), overlapping records, bad last-dim strides, huge strides on unit dims, odd data
 * addresses, an entry size off by one or two, or fz_view_new's layouts (wild strides,
 * bad rank / dtype / size, NULL data); slot values (valid, -1, out of range, duplicates),
 * block_table entries, seq_lens, seq_starts, positions; kv_c values with NaN / inf / huge
 * / tiny / zero tiles, tiles scaled by 2^k (s = FLT_MIN), e4m3 rounding ties; k_pe /
 * rope values; cache records random bytes (gather) or well-formed (scales ~1/448, rare
 * inf / 0 / NaN scales, NaN codes); scale tensors (NULL, bad values, wrong shape,
 * generically bad views: not read for a DS cache, so never an error);
 * decode's params.k_scale (NaN, 0, -1: not read).
 *
 * Checks, beyond fz_run's (no crash / out-of-bounds access under ASan + UBSan; on an
 * error every buffer byte-identical; the ISA's result equal to the ref ISA's: bitwise
 * for write, gather and rope, within the suite's tolerance for decode, whose reference
 * sums in double):
 *   - expected errors: every input the contract rejects must fail (must_fail) and every
 *     other one must succeed (clean); where exactly one error was planted and its kind
 *     is known (the DS rules: LK_ERR_SHAPE for entry size / Dl / strides / alignment,
 *     LK_ERR_DTYPE for the cache dtype, LK_ERR_VALUE for a non-fp8 entry / k_pe_cache /
 *     layout, LK_ERR_INDEX for slots / pages / starts), the status must be that kind;
 *   - write / rope: every record equals an independent scalar computation here
 *     (s_g = max(absmax / 448, FLT_MIN) with NaN ignored, e4m3 codes of x / s_g by this
 *     file's own encoder, rope = bf16 of k_pe, after the rotation for rope) and every
 *     record of a slot that no token maps to keeps its bytes;
 *   - rope: also equal, byte for byte, to lk_rotary_embedding followed by
 *     lk_concat_and_cache_mla_fp8 on a copy (the contract's composition, same ISA);
 *   - gather / starts: every out element equals f32(code) * s_g (own e4m3 decoder) or the
 *     rope bf16, rounded once to out's dtype (bf16 -> bf16 a bit copy);
 *   - decode: out and lse bit for bit those of lk_mla_decode on an f32 ND cache holding
 *     the entries' values (built by lk_gather_cache_fp8 of every slot, itself checked
 *     as above), same ISA, same params; on the bf16 dot-product path (avx512bf16, bf16 q
 *     and out, !lk_cpu_prefer_fma) the same NaN / inf elements and the rest within its
 *     bound: out 2^-8 (max |e| + 2 |out|) (P s rounded to bf16, both outs' rounding) plus
 *     twice the scores' allowance, lse twice the scores' allowance + 1e-6 (1 + |lse|).
 * FZ_DS_CLASS=1 prints "class <op> <status> <reason>" per input (seed selection).
 */
#include <float.h>

#include "fuzz_common.h"

int lk_cpu_prefer_fma(void); /* src/core/core.h: the avx512bf16 row's choice of path */

enum { OP_WRITE, OP_GATHER, OP_STARTS, OP_DECODE, OP_ROPE };
static const char *const OP_NAME[5] = {"write", "gather", "starts", "decode", "rope"};
#define UNK ((lk_status)-1)
#define DS LK_KV_DS_MLA

typedef struct {
    int op, plain, layout; /* plain: the non-fp8 entry (write / gather) */
    int kv_c, k_pe, cache, pe_cache, sm, scale; /* write, rope (view indices, -1: NULL) */
    int out, table, lens, starts;              /* gather */
    int q, lse, null_params;                    /* decode (out too) */
    lk_mla_decode_params p;
    int pos, q_pe, cs, neox;                    /* rope */
} ds_attrs;

static int g_nerr;         /* errors planted in this input */
static lk_status g_kind;   /* the kind of the only one (UNK: not predicted) */
static lk_status g_status; /* what the op returned */

static void expect(fz_world *w, const char *why, lk_status kind) {
    fz_fail_expected(w, why);
    g_kind = g_nerr++ ? UNK : kind;
}

/* fz_view_new; a view it made bad counts as an error of unknown kind */
static int vnew(fz_world *w, fz_in *in, const char *name, lk_dtype dt, int nd, const int64_t *shape, int role) {
    int vi = fz_view_new(w, in, name, dt, nd, shape, role);
    if (w->v[vi].bad) g_nerr++, g_kind = UNK;
    return vi;
}

/* fz_view_new for an argument that is never read (scale): its badness is no error */
static int vnew_unread(fz_world *w, fz_in *in, const char *name, lk_dtype dt, int nd, const int64_t *shape) {
    int mf = w->must_fail, cl = w->clean;
    const char *why = w->why_fail;
    int vi = fz_view_new(w, in, name, dt, nd, shape, FZ_IN);
    w->must_fail = mf, w->clean = cl, w->why_fail = why;
    return vi;
}

/* run a generic detector (fz_check_slots, fz_overlaps) and count what it finds as kind */
#define DETECT(w, kind, why, stmt)                                                                                     \
    do {                                                                                                               \
        int mf_ = (w)->must_fail, cl_ = (w)->clean;                                                                    \
        const char *why_ = (w)->why_fail;                                                                              \
        (w)->must_fail = 0;                                                                                            \
        stmt;                                                                                                          \
        int hit_ = (w)->must_fail;                                                                                     \
        (w)->must_fail = mf_, (w)->clean = cl_, (w)->why_fail = why_;                                                  \
        if (hit_) expect((w), (why), (kind));                                                                          \
    } while (0)

/* ---------------------------------------------------------------- scalar formats */

/* e4m3 (fn) code of f: round to nearest even, saturated to +-448 (inf too), NaN 0x7f | sign */
static unsigned e4m3_enc(float f) {
    unsigned s = signbit(f) ? 0x80u : 0u;
    if (isnan(f)) return s | 0x7fu;
    float a = fabsf(f);
    if (a > 448.0f) return s | 0x7eu;
    if (a < 0x1p-6f) return s | (unsigned)rintf(a * 512.0f); /* subnormals (8: 2^-6, exact) */
    int k;
    frexpf(a, &k);
    int e = k - 1;
    unsigned m = (unsigned)rintf((ldexpf(a, -e) - 1.0f) * 8.0f);
    if (m == 8) m = 0, e++;
    unsigned c = (unsigned)(e + 7) << 3 | m;
    return s | (c > 0x7e ? 0x7eu : c);
}

static float e4m3_dec(unsigned c) {
    unsigned e = (c >> 3) & 15, m = c & 7;
    float v = e == 15 && m == 7 ? NAN : e == 0 ? ldexpf((float)m, -9) : ldexpf(1.0f + (float)m / 8.0f, (int)e - 7);
    return c & 0x80 ? -v : v;
}

static uint16_t bf16_enc(float f) { /* round to nearest even; NaN: any NaN pattern */
    uint32_t u;
    memcpy(&u, &f, 4);
    if (isnan(f)) return (uint16_t)(u >> 16 | 0x40);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

static float bf16_dec(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* v rounded to dt as bits (f32, bf16 own; f16 by the library's converter) */
static uint32_t round_bits(lk_dtype dt, float v) {
    if (dt == LK_F32) {
        uint32_t u;
        memcpy(&u, &v, 4);
        return u;
    }
    if (dt == LK_BF16) return bf16_enc(v);
    uint16_t h;
    lk_store_f(&h, LK_F16, 0, v);
    return h;
}

static int bits_nan(lk_dtype dt, uint32_t b) {
    if (dt == LK_F32) return (b & 0x7f800000u) == 0x7f800000u && (b & 0x7fffffu);
    if (dt == LK_BF16) return (b & 0x7f80u) == 0x7f80u && (b & 0x7fu);
    return (b & 0x7c00u) == 0x7c00u && (b & 0x3ffu);
}

static uint32_t get_bits(const lk_tensor *t, int64_t off) {
    if (t->dtype == LK_F32) return ((const uint32_t *)t->data)[off];
    return ((const uint16_t *)t->data)[off];
}

/* ---------------------------------------------------------------- the DS cache */

static int64_t entry_bytes(int64_t Dl, int64_t Dr) { return Dl + Dl / 32 + 2 * Dr; }

/* the status lk_ds_init gives cache t for (Dl, Dr): LK_OK, its error, or UNK for a view
 * lk_check_view rejects */
static lk_status ds_rule(const lk_tensor *t, int64_t Dl, int64_t Dr) {
    if (t->ndim < 3 || t->ndim > 4 || fz_view_invalid(t)) return UNK;
    if (t->dtype != LK_F8E4M3 && t->dtype != LK_I8) return LK_ERR_DTYPE;
    if (Dl < 128 || Dl % 128) return LK_ERR_SHAPE;
    int last = t->ndim - 1;
    if (t->shape[last] != entry_bytes(Dl, Dr) || (t->ndim == 4 && t->shape[2] != 1)) return LK_ERR_SHAPE;
    int64_t nb = t->shape[0], bs = t->shape[1], s0 = nb > 1 ? t->stride[0] : 0, s1 = bs > 1 ? t->stride[1] : 0;
    int empty = nb == 0 || bs == 0;
    if (!empty && t->stride[last] != 1) return LK_ERR_SHAPE;
    if (!empty && ((s0 | s1) & 1 || (uintptr_t)t->data & 1)) return LK_ERR_SHAPE;
    if (bs < 1 && nb > 0) return LK_ERR_SHAPE;
    return LK_OK;
}

/* judge the cache view for (Dl, Dr) (fz_fail_expected where the rule rejects it) */
static lk_status judge_cache(fz_world *w, int vi, int64_t Dl, int64_t Dr) {
    lk_status k = ds_rule(&w->v[vi].t, Dl, Dr);
    if (k != LK_OK) expect(w, k == LK_ERR_DTYPE ? "cache dtype" : k == UNK ? "cache view" : "cache shape / strides",
                           k);
    return k;
}

/* address of record (page p, slot s) of a valid DS cache */
static unsigned char *rec_at(const lk_tensor *t, int64_t p, int64_t s) {
    int64_t off = (t->shape[0] > 1 ? p * t->stride[0] : 0) + (t->shape[1] > 1 ? s * t->stride[1] : 0);
    return (unsigned char *)t->data + off;
}

/* one byte more in front of the cache's arena: data at an odd address */
static void misalign(fz_world *w, int vi) {
    fz_view *v = &w->v[vi];
    fz_arena *a = &w->a[v->arena];
    unsigned char *p = malloc(a->n + 1);
    if (!p) abort();
    p[0] = (unsigned char)fz_next(&w->rng);
    memcpy(p + 1, a->p, a->n);
    v->t.data = p + 1 + ((unsigned char *)v->t.data - a->p);
    free(a->p);
    a->p = p, a->n += 1;
}

/* the cache view [nb, bs, E] (or [nb, bs, 1, E] with nd4; [nb, bs, 2, E] with bad4) */
static int cache_new(fz_world *w, fz_in *in, const char *name, int64_t nb, int64_t bs, int64_t E, int role) {
    lk_dtype dt = LK_F8E4M3;
    unsigned dk = fz_u8(in);
    if (dk >= 120) dt = LK_I8;
    if (dk >= 250) {
        static const lk_dtype BD[4] = {LK_F8E5M2, LK_BF16, LK_F32, LK_I32};
        dt = BD[fz_u8(in) % 4];
    }
    unsigned sh = fz_u8(in);
    int nd4 = sh & 1, bad4 = nd4 && sh >= 250;
    int64_t shape[4] = {nb, bs, E, 0};
    if (nd4) shape[2] = bad4 ? 2 : 1, shape[3] = E;
    int nd = nd4 ? 4 : 3;
    unsigned mode = fz_u8(in) % 16;
    if (mode >= 13) { /* fz_view_new's layouts and rare badness; judged by ds_rule */
        int mf = w->must_fail, cl = w->clean;
        const char *why = w->why_fail;
        int vi = fz_view_new(w, in, name, dt, nd, shape, role);
        w->must_fail = mf, w->clean = cl, w->why_fail = why;
        w->v[vi].bad = fz_view_invalid(&w->v[vi].t);
        return vi;
    }
    if (w->nv >= FZ_MAX_VIEWS) abort();
    int vi = w->nv++;
    fz_view *v = &w->v[vi];
    memset(v, 0, sizeof *v);
    v->name = name, v->role = role, v->inplace_of = -1, v->cmp = FZ_CMP_BITS;
    lk_tensor *t = &v->t;
    t->dtype = dt, t->ndim = nd;
    for (int d = 0; d < nd; d++) t->shape[d] = shape[d];
    int last = nd - 1;
    int64_t rec = nd4 ? shape[2] * E : E; /* bytes of a slot */
    int64_t s1 = rec, s0 = (bs > 0 ? bs : 1) * rec;
    t->stride[last] = 1;
    if (nd4) t->stride[2] = E;
    switch (mode) {
    case 5: /* padded, even */
        s1 = rec + 2 * (int64_t)(fz_u8(in) % 4);
        s0 = (bs > 0 ? bs : 1) * s1 + 2 * (int64_t)(fz_u8(in) % 8);
        break;
    case 6: /* padded, odd */
        if (fz_u8(in) & 1) s1 = rec + 1, s0 = (bs > 0 ? bs : 1) * s1;
        else s0 += 1 + 2 * (int64_t)(fz_u8(in) % 3);
        break;
    case 7: /* pages interleaved: [bs, nb, E] in memory */
        s0 = rec, s1 = (nb > 0 ? nb : 1) * rec;
        break;
    case 8: /* reversed pages and / or slots */
        if (fz_u8(in) & 1) s0 = -s0;
        if (fz_u8(in) & 1) s1 = -s1;
        break;
    case 9: { /* broadcast or overlapping records (a write must reject them) */
        unsigned k = fz_u8(in) % 3;
        if (k == 0) s0 = 0;
        else if (k == 1) s1 = 0;
        else s1 = rec - 2, s0 = (bs > 0 ? bs : 1) * s1 + 2;
        break;
    }
    case 10: { /* last-dim stride other than 1 */
        static const int64_t LS[4] = {2, -1, 0, 3};
        t->stride[last] = LS[fz_u8(in) % 4];
        s1 = rec * (t->stride[last] > 1 ? t->stride[last] : 1), s0 = (bs > 0 ? bs : 1) * s1;
        break;
    }
    case 11: /* huge strides on unit dims (nb = 1, bs = 1, the 4-D unit dim) */
        if (nb == 1) s0 = FZ_WILD[1 + fz_u8(in) % 11];
        if (bs == 1) s1 = FZ_WILD[1 + fz_u8(in) % 11];
        if (nd4) t->stride[2] = FZ_WILD[1 + fz_u8(in) % 11];
        break;
    case 12: /* slots padded to a multiple of 64 bytes (vLLM's aligned cache) */
        s1 = (rec + 63) / 64 * 64, s0 = (bs > 0 ? bs : 1) * s1;
        break;
    default: break; /* contiguous */
    }
    t->stride[0] = s0, t->stride[1] = s1;
    fz_place(w, v);
    v->bad = fz_view_invalid(t);
    if (fz_usable(w, vi) && fz_chance(in, 10)) misalign(w, vi);
    return vi;
}

/* well-formed records in every slot of cache vi: codes random (no NaN code but with
 * specials), scales ~ U(0.25, 2) / 448 (specials: inf, 0, FLT_MIN, 1e-30, NaN), rope bf16
 * in [-2, 2) (specials: fz_special) */
static void fill_records(fz_world *w, int vi, int64_t Dl, int64_t Dr) {
    if (!fz_usable(w, vi) || ds_rule(&w->v[vi].t, Dl, Dr) != LK_OK) return;
    const lk_tensor *t = &w->v[vi].t;
    static const float SS[5] = {INFINITY, 0.0f, FLT_MIN, 1e-30f, NAN};
    for (int64_t p = 0; p < t->shape[0]; p++)
        for (int64_t s = 0; s < t->shape[1]; s++) {
            unsigned char *r = rec_at(t, p, s);
            for (int64_t d = 0; d < Dl; d++) {
                unsigned c = (unsigned)(fz_next(&w->rng) & 0xff);
                if ((c & 0x7f) == 0x7f && !(fz_unif(&w->rng) < w->special_rate)) c &= 0xfe;
                r[d] = (unsigned char)c;
            }
            for (int64_t g = 0; g < Dl / 128; g++) {
                float sc = fz_unif(&w->rng) < w->special_rate ? SS[fz_next(&w->rng) % 5]
                                                               : (float)((0.25 + 1.75 * fz_unif(&w->rng)) / 448.0);
                memcpy(r + Dl + 4 * g, &sc, 4);
            }
            for (int64_t k = 0; k < Dr; k++) {
                float x = fz_unif(&w->rng) < w->special_rate ? fz_special(&w->rng)
                                                              : (float)(-2.0 + 4.0 * fz_unif(&w->rng));
                uint16_t h = bf16_enc(x);
                memcpy(r + Dl + Dl / 32 + 2 * k, &h, 2);
            }
        }
}

/* ---------------------------------------------------------------- values and indices */

/* kv_c [T, Dl] in [-4, 4) (+ specials), then per-tile patterns at a rate from the input:
 * scaled by 2^k (absmax / 448 below FLT_MIN too), zero, all NaN, one inf, one NaN, tiny
 * (subnormal), absmax 448 with e4m3 rounding ties (s = 1), huge */
static void fill_kv(fz_world *w, fz_in *in, int vi, int64_t Dl) {
    fz_fill(w, vi, -4, 4);
    unsigned rb = fz_u8(in);
    double pr = rb < 112 ? 0.0 : rb < 192 ? 0.15 : rb < 240 ? 0.5 : 1.0;
    if (!fz_usable(w, vi) || pr == 0.0) return;
    const lk_tensor *t = &w->v[vi].t;
    static const float SCL[8] = {0x1p-140f, 0x1p-133f, 0x1p-126f, 0x1p-100f, 0x1p-20f, 0x1p20f, 0x1p100f, 0x1p120f};
    static const float TIE[8] = {0x1p-10f, 3 * 0x1p-10f, 1.0625f, 1.1875f, 17.0f, 232.0f, 464.0f, 0x1.1p-6f};
    for (int64_t r = 0; r < t->shape[0]; r++)
        for (int64_t g = 0; g * 128 < Dl; g++) {
            if (fz_unif(&w->rng) >= pr) continue;
            unsigned k = (unsigned)(fz_next(&w->rng) % 8);
            int64_t d0 = g * 128, d1 = d0 + 128 < Dl ? d0 + 128 : Dl;
            int64_t one = d0 + (int64_t)(fz_next(&w->rng) % (uint64_t)(d1 - d0));
            float sc = SCL[fz_next(&w->rng) % 8];
            for (int64_t d = d0; d < d1; d++) {
                int64_t off = r * t->stride[0] + d * t->stride[1];
                float v = lk_load_f(t->data, t->dtype, off);
                switch (k) {
                case 0: v *= sc; break;
                case 1: v = fz_next(&w->rng) & 1 ? 0.0f : -0.0f; break;
                case 2: v = NAN; break;
                case 3: if (d == one) v = fz_next(&w->rng) & 1 ? INFINITY : -INFINITY; break;
                case 4: if (d == one) v = NAN; break;
                case 5: v *= 1e-40f; break;
                case 6: v = d == one ? 448.0f : TIE[fz_next(&w->rng) % 8]; if (fz_next(&w->rng) & 1) v = -v; break;
                default: v *= 1e37f; break;
                }
                lk_store_f(t->data, t->dtype, off, v);
            }
        }
}

/* slot_mapping [N]: a permutation of the slots with -1s, a duplicate, a corrupted entry;
 * re-validated from the stored values (LK_ERR_INDEX) */
static void fill_slots(fz_world *w, fz_in *in, int sm, int64_t N, int64_t nslots) {
    int64_t sv[64];
    fz_slot_values(w, in, sv, N, nslots);
    fz_idx_fill(w, in, sm, sv, N, nslots);
    DETECT(w, LK_ERR_INDEX, "slot_mapping value", fz_check_slots(w, sm, N, nslots));
}

/* Dl: 128 / 256 mostly, 384, invalid 0 / 64 / 200 */
static int64_t pick_Dl(fz_in *in) {
    unsigned k = fz_u8(in) % 32;
    if (k < 14) return 128;
    if (k < 26) return 256;
    if (k < 28) return 384;
    static const int64_t BAD[4] = {64, 200, 0, 130};
    return BAD[k % 4];
}

/* scale argument (not read with a DS cache): NULL, [1] / [] with any value, [2], or a
 * generically bad view */
static int scale_unread(fz_world *w, fz_in *in, int generic_bad_ok) {
    static const float SC[6] = {1.0f, 0.5f, 0.0f, -1.0f, NAN, INFINITY};
    unsigned k = fz_u8(in) % 5;
    if (k == 0) return -1;
    int64_t n = k == 4 ? 2 : 1;
    int vi;
    if (generic_bad_ok) vi = vnew_unread(w, in, "scale", LK_F32, 1, &n);
    else {
        if (w->nv >= FZ_MAX_VIEWS) abort();
        vi = w->nv++;
        fz_view *v = &w->v[vi];
        memset(v, 0, sizeof *v);
        v->name = "scale", v->role = FZ_IN, v->inplace_of = -1;
        v->t.dtype = LK_F32, v->t.ndim = 1, v->t.shape[0] = n, v->t.stride[0] = 1;
        fz_place(w, v);
    }
    if (k == 1 && fz_usable(w, vi)) w->v[vi].t.ndim = 0;
    if (fz_usable(w, vi))
        for (int64_t i = 0, m = fz_numel(&w->v[vi].t); i < m; i++)
            ((float *)w->v[vi].t.data)[fz_off(&w->v[vi].t, i)] = SC[fz_u8(in) % 6];
    return vi;
}

/* ---------------------------------------------------------------- oracles */

/* after a successful write (or rope: k_pe already rotated in w): each record against the
 * scalar formula; records of slots no token maps to keep their bytes (before: the cache's
 * arena before the call) */
static void check_records(const fz_world *w, const ds_attrs *a, const unsigned char *before) {
    const lk_tensor *c = &w->v[a->cache].t, *x = &w->v[a->kv_c].t, *pe = &w->v[a->k_pe].t, *sm = &w->v[a->sm].t;
    int64_t nb = c->shape[0], bs = c->shape[1], Dl = x->shape[1], Dr = pe->shape[1], E = entry_bytes(Dl, Dr);
    int64_t N = sm->shape[0];
    const unsigned char *base = w->a[w->v[a->cache].arena].p;
    const char *isa = lk_isa_name(lk_isa_current());
    for (int64_t q = 0; q < nb * bs; q++) {
        const unsigned char *r = rec_at(c, q / bs, q % bs);
        int64_t t = -1;
        for (int64_t i = 0; i < N && t < 0; i++)
            if (lk_load_index(sm->data, sm->dtype, i * sm->stride[0]) == q) t = i;
        if (t < 0) {
            if (memcmp(r, before + (r - base), (size_t)E))
                fz_report(w, "%s: record of slot %lld changed, no token maps to it", isa, (long long)q);
            continue;
        }
        for (int64_t g = 0; g < Dl / 128; g++) {
            float m = 0.0f;
            for (int64_t d = g * 128; d < g * 128 + 128; d++) {
                float v = fabsf(lk_load_f(x->data, x->dtype, t * x->stride[0] + d * x->stride[1]));
                if (v > m) m = v;
            }
            float sc = fmaxf(m / 448.0f, FLT_MIN), got;
            memcpy(&got, r + Dl + 4 * g, 4);
            if (memcmp(&got, &sc, 4))
                fz_report(w, "%s: slot %lld (token %lld) scale %lld = %.9g, expected %.9g", isa, (long long)q,
                          (long long)t, (long long)g, (double)got, (double)sc);
            for (int64_t d = g * 128; d < g * 128 + 128; d++) {
                float v = lk_load_f(x->data, x->dtype, t * x->stride[0] + d * x->stride[1]);
                unsigned want = e4m3_enc(v / sc), gc = r[d];
                int ok = (want & 0x7f) == 0x7f ? (gc & 0x7f) == 0x7f : gc == want;
                if (!ok)
                    fz_report(w, "%s: slot %lld (token %lld) code %lld = 0x%02x, expected 0x%02x (x %.9g / s %.9g)",
                              isa, (long long)q, (long long)t, (long long)d, gc, want, (double)v, (double)sc);
            }
        }
        for (int64_t k = 0; k < Dr; k++) {
            uint16_t got, want;
            memcpy(&got, r + Dl + Dl / 32 + 2 * k, 2);
            int64_t off = t * pe->stride[0] + k * pe->stride[1];
            int ok;
            if (pe->dtype == LK_BF16) want = ((const uint16_t *)pe->data)[off], ok = got == want;
            else {
                want = bf16_enc(lk_load_f(pe->data, pe->dtype, off));
                ok = bits_nan(LK_BF16, want) ? bits_nan(LK_BF16, got) : got == want;
            }
            if (!ok)
                fz_report(w, "%s: slot %lld (token %lld) rope %lld = 0x%04x, expected 0x%04x", isa, (long long)q,
                          (long long)t, (long long)k, got, want);
        }
    }
}

/* out row r against the record rec of a cache of (Dl, Dr) */
static void check_row(const fz_world *w, const char *what, const lk_tensor *out, int64_t r, const unsigned char *rec,
                      int64_t Dl, int64_t Dr) {
    for (int64_t d = 0; d < Dl + Dr; d++) {
        int64_t off = r * out->stride[0] + d * out->stride[1];
        uint32_t got = get_bits(out, off), want;
        int ok;
        if (d < Dl) {
            float sc;
            memcpy(&sc, rec + Dl + 4 * (d / 128), 4);
            want = round_bits(out->dtype, e4m3_dec(rec[d]) * sc);
            ok = bits_nan(out->dtype, want) ? bits_nan(out->dtype, got) : got == want;
        } else {
            uint16_t h;
            memcpy(&h, rec + Dl + Dl / 32 + 2 * (d - Dl), 2);
            if (out->dtype == LK_BF16) want = h, ok = got == want; /* bit copy */
            else {
                want = round_bits(out->dtype, bf16_dec(h));
                ok = bits_nan(out->dtype, want) ? bits_nan(out->dtype, got) : got == want;
            }
        }
        if (!ok)
            fz_report(w, "%s: %s row %lld dim %lld = 0x%x, expected 0x%x", lk_isa_name(lk_isa_current()), what,
                      (long long)r, (long long)d, got, want);
    }
}

/* after a successful gather: every out row against its record */
static void check_gather(const fz_world *w, const ds_attrs *a) {
    const lk_tensor *out = &w->v[a->out].t, *c = &w->v[a->cache].t, *bt = &w->v[a->table].t;
    int64_t C = out->shape[1], E = c->shape[c->ndim - 1], Dl = (2 * C - E) * 32 / 31, bs = c->shape[1];
    int64_t B = bt->shape[0], r = 0;
    for (int64_t b = 0; b < B; b++) {
        int64_t len = fz_idx_get(w, a->lens, b), st = a->starts >= 0 ? fz_idx_get(w, a->starts, b) : 0;
        for (int64_t j = 0; j < len; j++, r++) {
            int64_t p = st + j, page = fz_idx_get(w, a->table, b * bt->shape[1] + p / bs);
            check_row(w, "out", out, r, rec_at(c, page, p % bs), Dl, C - Dl);
        }
    }
}

/* after a successful decode on w (c: a copy of w before it): the same decode on an f32 ND
 * cache holding the entries' values (lk_gather_cache_fp8 of every slot, checked) must give
 * out and lse bit for bit (the bf16 dot-product path: within its bound) */
static void check_decode(const fz_world *w, fz_world *c, const ds_attrs *a) {
    const lk_tensor *kv = &w->v[a->cache].t, *q = &w->v[a->q].t, *o = &w->v[a->out].t;
    int64_t nb = kv->shape[0], bs = kv->shape[1], Dl = o->shape[3], Dr = q->shape[3] - Dl, C = Dl + Dr;
    const char *isa = lk_isa_name(lk_isa_current());
    float *f = malloc(sizeof(float) * (size_t)(nb * bs * C > 0 ? nb * bs * C : 1));
    int32_t *bt = malloc(sizeof(int32_t) * (size_t)(nb > 0 ? nb : 1)), sl = (int32_t)(nb * bs);
    if (!f || !bt) abort();
    if (nb * bs > 0) {
        for (int64_t p = 0; p < nb; p++) bt[p] = (int32_t)p;
        int64_t fs[2] = {nb * bs, C}, bts[2] = {1, nb}, one = 1;
        lk_tensor tf = lk_tensor_make(f, LK_F32, 2, fs), tb = lk_tensor_make(bt, LK_I32, 2, bts);
        lk_tensor tl = lk_tensor_make(&sl, LK_I32, 1, &one);
        lk_status s = lk_gather_cache_fp8(&tf, kv, &tb, &tl, DS, NULL);
        if (s) fz_report(w, "%s: decode accepted the cache, lk_gather_cache_fp8 of every slot: %s (%s)", isa,
                         lk_status_str(s), lk_last_error());
        for (int64_t k = 0; k < nb * bs; k++) check_row(w, "gather of every slot", &tf, k, rec_at(kv, k / bs, k % bs), Dl, Dr);
    }
    int64_t cs[3] = {nb, bs, C};
    lk_tensor fc = lk_tensor_make(f, LK_F32, 3, cs);
    lk_mla_decode_params p = a->p;
    p.cache_layout = LK_KV_ND;
    lk_status s = lk_mla_decode(fz_t(c, a->out), fz_t(c, a->lse), fz_t(c, a->q), &fc, NULL, fz_t(c, a->table),
                                fz_t(c, a->lens), &p);
    if (s) fz_report(w, "%s: decode on the f32 cache failed: %s (%s)", isa, lk_status_str(s), lk_last_error());
    int bfp = lk_isa_current() == LK_ISA_AVX512BF16 && q->dtype == LK_BF16 && o->dtype == LK_BF16 && !lk_cpu_prefer_fma();
    double emax = 0;
    for (int64_t i = 0; bfp && i < nb * bs * C; i++)
        if (isfinite(f[i]) && fabs(f[i]) > emax) emax = fabs(f[i]);
    for (int k = 0; k < 2; k++) {
        int vi = k ? a->lse : a->out;
        if (vi < 0 || !fz_usable(w, vi)) continue;
        const lk_tensor *t1 = &w->v[vi].t, *t2 = &c->v[vi].t;
        int64_t es = fz_es(t1->dtype);
        for (int64_t i = 0, n = fz_numel(t1); i < n; i++) {
            int64_t off = fz_off(t1, i);
            if (bfp) {
                double x = fz_get(t1, i), y = fz_get(t2, i);
                double tol = k ? 2 * w->v[vi].atol + 1e-6 * (1 + fabs(y)) : ldexp(emax + 2 * fabs(y), -8) + 2 * w->v[vi].atol;
                if (isfinite(y) ? !(fabs(x - y) <= tol) : !(x == y || (isnan(x) && isnan(y))))
                    fz_report(w, "%s: decode %s[%lld] = %.9g on the DS cache, %.9g on the f32 cache of its values "
                              "(bf16 path, bound %.3g)", isa, k ? "lse" : "out", (long long)i, x, y, tol);
                continue;
            }
            if (memcmp((const char *)t1->data + off * es, (const char *)t2->data + off * es, (size_t)es))
                fz_report(w, "%s: decode %s[%lld] = %.9g on the DS cache, %.9g on the f32 cache of its values", isa,
                          k ? "lse" : "out", (long long)i, fz_get(t1, i), fz_get(t2, i));
        }
    }
    free(f);
    free(bt);
}

/* the rope op's composition on c (a copy of w before the call) must give w's bytes */
static void check_rope(const fz_world *w, fz_world *c, const ds_attrs *a) {
    fz_rope_then_concat(w, c, a->pos, a->q_pe, a->k_pe, a->cs, a->neox, a->kv_c, a->cache, -1, a->sm, DS, a->scale,
                        NULL);
}

/* ---------------------------------------------------------------- the call */

static lk_status call(const fz_world *w, const void *ap) {
    const ds_attrs *a = ap;
    lk_status s;
    fz_world c;
    unsigned char *before = NULL;
    switch (a->op) {
    case OP_WRITE:
    case OP_ROPE:
        if (a->cache >= 0) {
            const fz_arena *ar = &w->a[w->v[a->cache].arena];
            before = malloc(ar->n ? ar->n : 1);
            if (!before) abort();
            memcpy(before, ar->p, ar->n);
        }
        if (a->op == OP_ROPE) {
            fz_clone(w, &c);
            s = lk_concat_and_cache_mla_rope(fz_t(w, a->pos), fz_t(w, a->q_pe), fz_t(w, a->k_pe), fz_t(w, a->kv_c),
                                             fz_t(w, a->cs), a->neox, fz_t(w, a->cache), fz_t(w, a->pe_cache),
                                             fz_t(w, a->sm), (lk_kv_layout)a->layout, fz_t(w, a->scale));
            if (s == LK_OK) check_rope(w, &c, a);
            fz_free(&c);
        } else if (a->plain)
            s = lk_concat_and_cache_mla(fz_t(w, a->kv_c), fz_t(w, a->k_pe), fz_t(w, a->cache), fz_t(w, a->pe_cache),
                                        fz_t(w, a->sm), (lk_kv_layout)a->layout);
        else
            s = lk_concat_and_cache_mla_fp8(fz_t(w, a->kv_c), fz_t(w, a->k_pe), fz_t(w, a->cache),
                                            fz_t(w, a->pe_cache), fz_t(w, a->sm), (lk_kv_layout)a->layout,
                                            fz_t(w, a->scale));
        if (s == LK_OK) check_records(w, a, before);
        free(before);
        break;
    case OP_GATHER:
    case OP_STARTS:
        if (a->op == OP_STARTS)
            s = lk_gather_cache_starts(fz_t(w, a->out), fz_t(w, a->cache), fz_t(w, a->table), fz_t(w, a->lens),
                                       fz_t(w, a->starts), (lk_kv_layout)a->layout, fz_t(w, a->scale));
        else if (a->plain)
            s = lk_gather_cache(fz_t(w, a->out), fz_t(w, a->cache), fz_t(w, a->table), fz_t(w, a->lens),
                                (lk_kv_layout)a->layout);
        else
            s = lk_gather_cache_fp8(fz_t(w, a->out), fz_t(w, a->cache), fz_t(w, a->table), fz_t(w, a->lens),
                                    (lk_kv_layout)a->layout, fz_t(w, a->scale));
        if (s == LK_OK) check_gather(w, a);
        break;
    default:
        fz_clone(w, &c);
        s = lk_mla_decode(fz_t(w, a->out), fz_t(w, a->lse), fz_t(w, a->q), fz_t(w, a->cache), fz_t(w, a->pe_cache),
                          fz_t(w, a->table), fz_t(w, a->lens), a->null_params ? NULL : &a->p);
        if (s == LK_OK) check_decode(w, &c, a);
        fz_free(&c);
        break;
    }
    g_status = s;
    return s;
}

/* ---------------------------------------------------------------- the ops' inputs */

/* the layout passed: DS, rarely an unknown value (kind: the status it gives, UNK where
 * other checks of the ND / NZ path come first) */
static int pick_layout(fz_world *w, fz_in *in, lk_status kind) {
    if (!fz_chance(in, 6)) return DS;
    expect(w, "unknown layout", kind);
    return fz_u8(in) & 1 ? 3 : -1;
}

/* write and rope: kv_c [T, Dl], k_pe [T, Dr] (rope: q_pe, positions, cos_sin_cache), the
 * cache, slot_mapping, scale */
static void build_write(fz_world *w, fz_in *in, ds_attrs *a, int rope) {
    int longm = fz_chance(in, 12);
    int64_t T = longm ? fz_range(in, 9, 40) : fz_dim(in, 8), Dl = pick_Dl(in), Dr = fz_range(in, 0, 17);
    int64_t nb = longm ? fz_range(in, 4, 9) : fz_range(in, 0, 6), bs = 1 + (int64_t)(fz_u8(in) % 9);
    if (nb == 0 && fz_u8(in) & 1) bs = 0;
    if (!longm && nb == 0 && fz_u8(in) & 1) nb = 1;
    int64_t N = fz_range(in, 0, T), Ec = entry_bytes(Dl, Dr), Tk = T;
    unsigned odd = fz_u8(in) < 24 ? fz_u8(in) % 4 : 4;
    if (odd == 0) Ec += fz_u8(in) & 1 ? 2 : -1; /* entry size off: judged by ds_rule */
    if (odd == 1) Tk = T + 1, expect(w, "k_pe's tokens differ from kv_c's", LK_ERR_SHAPE);
    if (odd == 2) N = T + 1, expect(w, "more slots than tokens", LK_ERR_SHAPE);
    a->plain = !rope && fz_chance(in, 8);
    if (a->plain) expect(w, "lk_concat_and_cache_mla with a DS cache", LK_ERR_VALUE);
    a->layout = pick_layout(w, in, LK_ERR_VALUE);
    double sr = w->special_rate;
    if (!rope && fz_u8(in) % 4 == 0 && Tk == T) { /* kv_a [T, Dl + Dr]: kv_c | k_pe (vLLM's) */
        int64_t ps[2] = {T, Dl + Dr};
        int p = fz_view_new(w, in, "kv_a", fz_ftype(in), 2, ps, FZ_NONE);
        a->kv_c = fz_view_narrow(w, p, "kv_c", 1, 0, Dl, FZ_IN);
        a->k_pe = fz_view_narrow(w, p, "k_pe", 1, Dl, Dr, FZ_IN);
    } else {
        int64_t ks[2] = {T, Dl}, ps[2] = {Tk, Dr};
        a->kv_c = vnew(w, in, "kv_c", fz_ftype(in), 2, ks, FZ_IN);
        a->k_pe = vnew(w, in, "k_pe", fz_ftype(in), 2, ps, rope ? FZ_OUT : FZ_IN);
    }
    if (rope) { /* q_pe, positions, cos_sin_cache; finite values (the sign of a NaN the
                 * rotation makes is not specified: kept out of the bitwise checks) */
        int64_t Hq = 1 + (int64_t)(fz_u8(in) % 3), qs[3] = {T, Hq, Dr}, max_pos = 1 + (int64_t)(fz_u8(in) % 8);
        int64_t rot = 2 * fz_range(in, 0, Dr / 2), P = T + fz_range(in, 0, 2), cs[2] = {max_pos, rot};
        a->neox = (int)(fz_u8(in) % 3);
        a->q_pe = vnew(w, in, "q_pe", fz_ftype(in), 3, qs, FZ_OUT);
        a->cs = vnew(w, in, "cos_sin_cache", fz_ftype(in), 2, cs, FZ_IN);
        a->pos = vnew(w, in, "positions", fz_u8(in) & 1 ? LK_I64 : LK_I32, 1, &P, FZ_IDX);
        w->special_rate = 0;
        fz_fill(w, a->q_pe, -4, 4);
        fz_fill(w, a->cs, -1, 1);
        int64_t pv[48];
        for (int64_t t = 0; t < P; t++) pv[t] = (int64_t)(fz_next(&w->rng) % (uint64_t)max_pos);
        fz_idx_fill(w, in, a->pos, pv, P, max_pos);
        if (fz_usable(w, a->pos) && !w->v[a->pos].bad)
            for (int64_t t = 0; t < T; t++) {
                int64_t v = fz_idx_get(w, a->pos, t);
                if (v < 0 || v >= max_pos) expect(w, "position out of range", LK_ERR_INDEX);
            }
    }
    fz_fill(w, a->k_pe, -4, 4);
    w->special_rate = sr;
    a->cache = cache_new(w, in, "kv_c_cache", nb, bs, Ec, FZ_OUT);
    judge_cache(w, a->cache, Dl, Dr);
    if (fz_chance(in, 6)) { /* a k_pe_cache beside the record buffer */
        int64_t ps[3] = {nb, bs, Dr};
        a->pe_cache = vnew(w, in, "k_pe_cache", LK_BF16, 3, ps, FZ_OUT);
        expect(w, "k_pe_cache with a DS cache", LK_ERR_VALUE);
    }
    a->sm = vnew(w, in, "slot_mapping", fz_u8(in) & 1 ? LK_I64 : LK_I32, 1, &N, FZ_IDX);
    fill_slots(w, in, a->sm, N, nb * bs);
    a->scale = scale_unread(w, in, 1);
    fill_kv(w, in, a->kv_c, Dl);
    if (fz_chance(in, 4)) {
        unsigned k = fz_u8(in) % 4;
        int *req[4] = {&a->kv_c, &a->k_pe, &a->cache, &a->sm};
        if (rope && k == 1) k = 4; /* q_pe */
        if (k == 4) a->q_pe = -1;
        else *req[k] = -1;
        expect(w, "NULL tensor pointer", LK_ERR_NULL);
    }
}

/* gather and starts: out [S, C], the cache, block_table [B, max_pages], seq_lens [B],
 * seq_starts [B] */
static void build_gather(fz_world *w, fz_in *in, ds_attrs *a) {
    int starts = a->op == OP_STARTS;
    a->plain = !starts && fz_chance(in, 8);
    if (a->plain) expect(w, "lk_gather_cache with a DS cache", LK_ERR_VALUE);
    a->layout = pick_layout(w, in, UNK);
    int64_t Dl = pick_Dl(in), Dr = fz_range(in, 0, 17), B = fz_range(in, 0, 3);
    int64_t bs = 1 + (int64_t)(fz_u8(in) % 9), nb = 1 + (int64_t)(fz_u8(in) % 6);
    if (fz_chance(in, 8)) { /* an empty cache, [0, 0, E] too */
        nb = 0;
        if (fz_u8(in) & 1) bs = 0;
    }
    int64_t len[3], st[3] = {0, 0, 0}, S = 0, maxp = 0;
    for (int64_t b = 0; b < B; b++) {
        len[b] = fz_range(in, 0, 10);
        if (starts) st[b] = fz_range(in, 0, 9);
        S += len[b];
        if (bs > 0 && (st[b] + len[b] + bs - 1) / bs > maxp) maxp = (st[b] + len[b] + bs - 1) / bs;
    }
    maxp += fz_range(in, 0, 1);
    if (fz_chance(in, 6)) S += 1; /* judged below from the stored seq_lens */
    int64_t C = Dl + Dr, Ec = entry_bytes(Dl, Dr);
    unsigned odd = fz_u8(in) < 24 ? fz_u8(in) % 4 : 4;
    if (odd == 0) C += fz_u8(in) & 1 ? 1 : -1; /* out's width off: the derived Dl decides */
    if (odd == 1) Ec += fz_u8(in) & 1 ? 2 : -2;
    if (odd == 2 && Dl >= 256) C -= 62; /* the same E read as Dl - 128 latent + Dr + 66 rope dims: valid */
    lk_dtype ot = fz_ftype(in);
    if (fz_chance(in, 6)) ot = LK_F8E4M3, expect(w, "fp8 out of a DS cache", LK_ERR_DTYPE);
    int64_t os[3] = {S, C, 1};
    a->out = vnew(w, in, "out", ot, fz_chance(in, 4) ? 3 : 2, os, FZ_OUT);
    if (w->v[a->out].t.ndim == 3 && !w->v[a->out].bad) expect(w, "out of rank 3", LK_ERR_RANK);
    a->cache = cache_new(w, in, "cache", nb, bs, Ec, FZ_IN);
    /* the library's view: Dl = 32 (2 C - E) / 31 from out's C and the cache's E */
    const lk_tensor *ct = &w->v[a->cache].t;
    int64_t Dld = -1;
    if (ct->ndim >= 3 && ct->ndim <= 4 && !fz_view_invalid(ct)) {
        int64_t E = ct->shape[ct->ndim - 1];
        if (2 * C >= E && (2 * C - E) * 32 % 31 == 0) Dld = (2 * C - E) * 32 / 31;
        if (Dld < 128 || Dld % 128 || Dld > C) {
            expect(w, "out's width does not fit the cache's entries", LK_ERR_SHAPE);
            if (ct->dtype != LK_F8E4M3 && ct->dtype != LK_I8) expect(w, "cache dtype", LK_ERR_DTYPE); /* checked first */
        } else
            judge_cache(w, a->cache, Dld, C - Dld);
    } else
        expect(w, "cache view", UNK);
    int64_t ts[2] = {B, maxp};
    lk_dtype tdt = LK_I32, ldt = LK_I32;
    if (fz_chance(in, 4)) tdt = LK_I64, expect(w, "block_table not i32", LK_ERR_DTYPE);
    if (fz_chance(in, 4)) ldt = LK_I64, expect(w, "seq_lens not i32", LK_ERR_DTYPE);
    a->table = vnew(w, in, "block_table", tdt, 2, ts, FZ_IDX);
    a->lens = vnew(w, in, "seq_lens", ldt, 1, &B, FZ_IDX);
    int starts_ok = 1;
    if (starts && fz_u8(in) % 8) {
        lk_dtype sdt = LK_I32;
        if (fz_chance(in, 4)) sdt = LK_I64, expect(w, "seq_starts not i32", LK_ERR_DTYPE);
        a->starts = vnew(w, in, "seq_starts", sdt, 1, &B, FZ_IDX);
        fz_idx_fill(w, in, a->starts, st, B, maxp * bs + 1);
        starts_ok = !w->v[a->starts].bad;
    }
    int64_t tv[3 * 21];
    for (int64_t i = 0; i < B * maxp; i++) tv[i] = nb ? (int64_t)(fz_next(&w->rng) % (uint64_t)nb) : -1;
    fz_idx_fill(w, in, a->table, tv, B * maxp, nb);
    fz_idx_fill(w, in, a->lens, len, B, maxp * bs + 1);
    if (!w->v[a->lens].bad && !w->v[a->table].bad && starts_ok) { /* from the stored values */
        int64_t sum = 0;
        for (int64_t b = 0; b < B; b++) {
            int64_t l = fz_idx_get(w, a->lens, b), s0 = a->starts >= 0 ? fz_idx_get(w, a->starts, b) : 0;
            if (l < 0) {
                expect(w, "seq_lens negative", LK_ERR_INDEX);
                continue;
            }
            if (l > maxp * bs) {
                expect(w, "seq_lens beyond the block table", LK_ERR_SHAPE);
                continue;
            }
            if (s0 < 0 || s0 > maxp * bs - l) {
                expect(w, "seq_starts out of range (with the request's length)", LK_ERR_INDEX);
                continue;
            }
            sum += l;
            for (int64_t j = l ? s0 / bs : 0; bs > 0 && l > 0 && j < (s0 + l + bs - 1) / bs; j++) {
                int64_t pg = fz_idx_get(w, a->table, b * maxp + j);
                if (pg < 0 || pg >= nb) expect(w, "block_table entry outside the cache", LK_ERR_INDEX);
            }
        }
        if (sum != S) expect(w, "out's rows differ from sum(seq_lens)", LK_ERR_SHAPE);
    }
    if (fz_u8(in) & 1 && Dld >= 128 && Dld % 128 == 0) fill_records(w, a->cache, Dld, C - Dld); /* else random bytes */
    a->scale = scale_unread(w, in, 1);
    if (fz_chance(in, 4)) {
        unsigned k = fz_u8(in) % 4;
        int *req[4] = {&a->out, &a->cache, &a->table, &a->lens};
        *req[k] = -1;
        expect(w, "NULL tensor pointer", LK_ERR_NULL);
    }
}

/* decode: q [B, s_q, H, Dl + Dr], out [B, s_q, H, Dl], lse [B, H, s_q], the cache,
 * block_table, cache_seqlens, params */
static void build_decode(fz_world *w, fz_in *in, ds_attrs *a) {
    int64_t B = fz_range(in, 0, 3), len[3];
    for (int64_t b = 0; b < B; b++) len[b] = fz_range(in, 0, 16);
    int64_t s_q = fz_u8(in) < 24 ? 3 : fz_range(in, 1, 2), H = fz_range(in, 1, 4);
    int64_t Dl = pick_Dl(in), Dr = fz_range(in, 0, 17), Ec = entry_bytes(Dl, Dr);
    if (Dl == 0) expect(w, "latent dim 0", LK_ERR_SHAPE);
    if (fz_chance(in, 8)) Ec += fz_u8(in) & 1 ? 2 : -2; /* the cache's Dr differs from q's */
    int64_t qs[4] = {B, s_q, H, Dl + Dr}, os[4] = {B, s_q, H, Dl}, ls[3] = {B, H, s_q};
    lk_dtype qt = fz_ftype(in), ot = fz_ftype(in);
    if (fz_u8(in) < 96) qt = ot = LK_BF16; /* the bf16 path is not taken for DS: f32 path */
    a->q = vnew(w, in, "q", qt, 4, qs, FZ_IN);
    a->out = vnew(w, in, "out", ot, 4, os, FZ_OUT);
    fz_tol(w, a->out, 3e-5);
    w->v[a->out].nonfinite_any = 1;
    a->lse = -1;
    if (fz_u8(in) % 3) {
        lk_dtype lt = LK_F32;
        if (fz_chance(in, 4)) lt = LK_F16, expect(w, "lse not f32", LK_ERR_DTYPE);
        a->lse = vnew(w, in, "lse", lt, 3, ls, FZ_OUT);
        fz_tol(w, a->lse, 1e-4);
    }
    int64_t bs = 1 + (int64_t)(fz_u8(in) % 9), nb = 1 + (int64_t)(fz_u8(in) % 6), maxp = 0;
    if (fz_chance(in, 8)) { /* an empty cache */
        nb = 0;
        if (fz_u8(in) & 1) bs = 0;
    }
    for (int64_t b = 0; b < B; b++)
        if (bs > 0 && (len[b] + bs - 1) / bs > maxp) maxp = (len[b] + bs - 1) / bs;
    maxp += fz_range(in, 0, 1);
    a->cache = cache_new(w, in, "kv_c_cache", nb, bs, Ec, FZ_IN);
    if (Dl > 0) judge_cache(w, a->cache, Dl, Dr);
    if (fz_chance(in, 6)) {
        int64_t ps[3] = {nb, bs, Dr > 0 ? Dr : 1};
        a->pe_cache = vnew(w, in, "k_pe_cache", LK_BF16, 3, ps, FZ_IN);
        expect(w, "k_pe_cache with a DS cache", LK_ERR_VALUE);
    }
    a->p = lk_mla_decode_params_default(0.3f);
    a->p.cache_layout = DS;
    static const float KS[4] = {1.0f, NAN, 0.0f, -1.0f}; /* not read */
    a->p.k_scale = KS[fz_u8(in) % 4];
    a->p.causal = (int)(fz_u8(in) % 2);
    int64_t ts[2] = {B, maxp};
    a->table = vnew(w, in, "block_table", fz_chance(in, 64) ? LK_I64 : LK_I32, 2, ts, FZ_IDX);
    int64_t tv[3 * 18];
    for (int64_t i = 0; i < B * maxp; i++) tv[i] = nb ? (int64_t)(fz_next(&w->rng) % (uint64_t)nb) : -1;
    fz_idx_fill(w, in, a->table, tv, B * maxp, nb);
    a->lens = vnew(w, in, "cache_seqlens", fz_u8(in) & 1 ? LK_I64 : LK_I32, 1, &B, FZ_IDX);
    fz_idx_fill(w, in, a->lens, len, B, maxp * bs + 1);
    int64_t bse = bs > 0 ? bs : 1; /* an empty cache's block_size 0 counts as 1 */
    int tab_ok = fz_usable(w, a->table), tab_empty = maxp == 0 && !fz_view_invalid(&w->v[a->table].t);
    if (fz_usable(w, a->lens) && (tab_ok || tab_empty))
        for (int64_t b = 0; b < B; b++) {
            int64_t u = fz_idx_get(w, a->lens, b);
            if (u < 0 || u > maxp * bse) {
                expect(w, "cache_seqlens beyond the block table", LK_ERR_INDEX);
                continue;
            }
            if (a->p.causal && u > 0 && u < s_q) expect(w, "causal with fewer cached tokens than queries", LK_ERR_INDEX);
            for (int64_t j = 0; tab_ok && j < (u + bse - 1) / bse; j++) {
                int64_t pg = fz_idx_get(w, a->table, b * maxp + j);
                if (pg < 0 || pg >= nb) expect(w, "block_table entry outside the cache", LK_ERR_INDEX);
            }
        }
    static const float SC[8] = {0.25f, 0.5f, 1.0f, 0.0f, -0.3f, 0.125f, NAN, INFINITY};
    unsigned si = fz_u8(in) % 8;
    a->p.scale = SC[si];
    if (si >= 6) expect(w, "scale not finite", LK_ERR_VALUE);
    static const int64_t SK[6] = {0, 0, 1, 3, 64, -1};
    unsigned ki = fz_u8(in) % 6;
    a->p.split_keys = SK[ki];
    if (ki == 5) expect(w, "split_keys < 0", LK_ERR_VALUE);
    if (fz_chance(in, 4)) {
        a->p.cache_layout = (lk_kv_layout)7;
        expect(w, "unknown cache layout", LK_ERR_VALUE);
    }
    fz_fill(w, a->q, -2, 2);
    fill_records(w, a->cache, Dl, Dr);
    /* entries up to ~2 (scales ~1/448): the scores' f32 error E 2^-24 sum |q e| scale
     * moves lse by as much, out by twice that times max |e| (fuzz_mla_decode's bound) */
    double mq = fz_maxabs(w, a->q), E = (double)(Dl + Dr), mc = 2.0;
    double ds = E * ldexp(1.0, -24) * fabs((double)a->p.scale) * mq * mc * E;
    if (isfinite(ds)) {
        if (a->lse >= 0) w->v[a->lse].atol += ds;
        w->v[a->out].atol += 2.0 * ds * mc;
    }
    if (fz_chance(in, 3)) a->null_params = 1, expect(w, "NULL params", LK_ERR_NULL);
    if (fz_chance(in, 4)) {
        unsigned k = fz_u8(in) % 5;
        int *req[5] = {&a->out, &a->q, &a->cache, &a->table, &a->lens};
        *req[k] = -1;
        expect(w, "NULL tensor pointer", LK_ERR_NULL);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_in in = {data, size, 0};
    fz_world w;
    fz_init(&w, &in, "fp8_ds_mla");
    ds_attrs a;
    memset(&a, 0xff, sizeof a); /* every view index -1 */
    a.plain = 0, a.null_params = 0;
    g_nerr = 0, g_kind = LK_OK, g_status = LK_OK;
    a.op = (int)(fz_u8(&in) % 5);
    static const char *const OPS[5] = {"lk_concat_and_cache_mla_fp8 (DS)", "lk_gather_cache_fp8 (DS)",
                                       "lk_gather_cache_starts (DS)", "lk_mla_decode (DS)",
                                       "lk_concat_and_cache_mla_rope (DS)"};
    w.op = OPS[a.op];
    if (a.op == OP_WRITE || a.op == OP_ROPE) build_write(&w, &in, &a, a.op == OP_ROPE);
    else if (a.op == OP_DECODE) build_decode(&w, &in, &a);
    else build_gather(&w, &in, &a);
    DETECT(&w, LK_ERR_ALIAS, "an output overlaps itself or another view", fz_overlaps(&w));
    fz_run(&w, call, &a);
    if (w.must_fail && g_nerr == 1 && g_kind != UNK && g_status != g_kind)
        fz_report(&w, "status %s, expected %s (%s): %s", lk_status_str(g_status), lk_status_str(g_kind), w.why_fail,
                  lk_last_error());
    if (getenv("FZ_DS_CLASS"))
        fprintf(stderr, "class %s %s %s\n", OP_NAME[a.op], lk_status_str(g_status), w.must_fail ? w.why_fail : "valid");
    fz_free(&w);
    return 0;
}
