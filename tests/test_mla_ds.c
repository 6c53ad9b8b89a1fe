/*
 * fp8_ds_mla caches (LK_KV_DS_MLA, include/llmkern.h "fp8_ds_mla caches"): records of
 * Dl e4m3 codes, Dl / 128 f32 tile scales and Dr bf16 rope values per token.
 *
 * Every case runs on every ISA this CPU and build run, checked against expectations
 * built here from the header's formulas with the test's own number formats (an e4m3
 * encoder / decoder and bf16 / f16 round-to-nearest-even written from the formats'
 * definitions in float64, not the library's converters):
 *  - write (lk_concat_and_cache_mla_fp8, k_pe_cache NULL): every byte of the cache's
 *    whole allocation equals the expectation: the written records (tile scale
 *    max(absmax / 448, FLT_MIN) in f32 with NaN ignored, code = e4m3(x / scale) of the
 *    f32 quotient, rope = bf16 of k_pe, a bit copy from bf16), the records of slots not
 *    written (random sentinel bytes) and the padding garbage of strided caches. Dl 128,
 *    256, 512 with Dr 0, 1, 7, 64; block sizes 1, 7, 16, 128; kv_c / k_pe f32, f16, bf16;
 *    padding slots, N < T, i32 / i64 (strided) slot_mapping; inputs contiguous, padded,
 *    column slices of wider rows (one shared row too) and transposed; caches [nb, bs, E]
 *    contiguous, padded, [nb, bs, 1, E] padded and slot-major (permuted pages), f8e4m3
 *    and i8; special tiles (NaN, +-inf, zeros and -0, exact 448 * 2^k grids with ties,
 *    values below FLT_MIN * 448, midpoints between e4m3 values) and special rope values
 *    (bf16 ties, overflow to inf, NaN payloads kept by the bf16 bit copy; f32 / f16 NaNs
 *    stored as bf16 NaNs of their sign); 1..4 threads bitwise equal; N = 0 a no-op;
 *  - gather (lk_gather_cache_fp8 and lk_gather_cache_starts, seq_starts given or NULL):
 *    out [S, Dl + Dr] f32 / f16 / bf16 = f32(code) * scale rounded once, rope bits
 *    converted once (a bit copy into bf16 / f32); records built here with random codes
 *    and scales (FLT_MIN, subnormal, 2^100, 2^121, 2^127 where products overflow, inf),
 *    any seq_starts, empty requests (S = 0 too), block_table entries outside the
 *    positions read set to -1 / 1e9, unused records poisoned (NaN codes), out
 *    contiguous, padded with garbage between rows, or transposed; 1..4 threads;
 *  - decode (lk_mla_decode, cache_layout LK_KV_DS_MLA): out and lse bit for bit those of
 *    the same call on an f32 ND cache holding the dequantized values (the documented
 *    contract), and within tolerance of float64 attention over those values; on the bf16
 *    dot-product path (avx512bf16 with bf16 q and out, run with both lk_cpu_prefer_fma
 *    answers) within that path's bound of float64 instead (2^-8 of the terms' size + 1e-5
 *    and 2^-8 of out: P s rounded to bf16 and out's rounding, unit roundoff 2^-8 each; the
 *    scores' f32 sums) and bit for bit across
 *    thread counts; s_q 1 / 2
 *    causal, H 1..16, split_keys 0 / small, empty requests, q / out f32 / bf16, lse NULL
 *    or not, Dl 128..512 with Dr 0, 7, 8, 64, tile scales of 2^121 (256 s overflows) and
 *    FLT_MIN, 1..4 threads;
 *  - lk_concat_and_cache_mla_rope with LK_KV_DS_MLA: bit for bit lk_rotary_embedding
 *    then lk_concat_and_cache_mla_fp8, and the expectation;
 *  - the bad-input catalogue (every ISA): status, the message names the argument, every
 *    buffer unchanged; the other layout-taking functions reject LK_KV_DS_MLA.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h" /* lk_cpu_prefer_fma */
#include "testutil.h"

#define TILE 128

/* ---------------------------------------------------------------- the test's number formats */

static float bitsf(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* e4m3fn (1.4.3, bias 7, no inf, S.1111.111 NaN): the grid value nearest |y| (ties to the
 * even mantissa), |y| >= 448 (beyond the largest finite, or inf) -> 448, NaN -> 0x7f;
 * the sign of y (-0 -> 0x80) */
static uint8_t enc_e4m3(float y) {
    uint8_t sign = signbit(y) ? 0x80 : 0;
    if (isnan(y)) return (uint8_t)(sign | 0x7f);
    double a = fabs((double)y);
    if (a >= 448.0) return (uint8_t)(sign | 0x7e);
    if (a < 0.015625) /* below 2^-6: subnormals m * 2^-9 (q = 8 is the smallest normal, code 0x08) */
        return (uint8_t)(sign | (uint8_t)nearbyint(a * 512.0));
    int e;
    frexp(a, &e);
    e -= 1;                                /* a in [2^e, 2^(e+1)), e in [-6, 8] */
    double q = nearbyint(ldexp(a, 3 - e)); /* 8 .. 16 */
    if (q == 16.0) e++, q = 8.0;
    int code = ((e + 7) << 3) | ((int)q - 8);
    if (code > 0x7e) code = 0x7e;
    return (uint8_t)(sign | code);
}

static float dec_e4m3(uint8_t c) {
    int e = (c >> 3) & 15, m = c & 7;
    double v = e == 15 && m == 7 ? NAN : e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
    return (float)(c & 0x80 ? -v : v);
}

/* a 16-bit float of M mantissa bits, exponent bias B (bf16: 7, 127; f16: 10, 15) of an
 * f32 value, round to nearest even, overflow to inf; NaN -> a quiet NaN with the sign
 * (the payload is not part of any contract checked with these) */
static uint16_t enc16(float f, int M, int B) {
    uint16_t sign = signbit(f) ? 0x8000 : 0, inf = (uint16_t)(((2 * B + 1) << M));
    if (isnan(f)) return (uint16_t)(sign | inf | (1 << (M - 1)));
    if (isinf(f)) return (uint16_t)(sign | inf);
    double a = fabs((double)f);
    if (a < ldexp(1, 1 - B)) return (uint16_t)(sign | (uint16_t)nearbyint(ldexp(a, B - 1 + M))); /* subnormal step */
    int e;
    frexp(a, &e);
    e -= 1;
    double q = nearbyint(ldexp(a, M - e)); /* 2^M .. 2^(M+1) */
    if (q == ldexp(1, M + 1)) e++, q = ldexp(1, M);
    if (e > B) return (uint16_t)(sign | inf);
    return (uint16_t)(sign | ((e + B) << M) | ((int)q - (1 << M)));
}

static uint16_t enc_bf16(float f) { return enc16(f, 7, 127); }
static uint16_t enc_f16(float f) { return enc16(f, 10, 15); }

static float dec_f16(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 31 ? (m ? NAN : INFINITY) : e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return (float)(h & 0x8000 ? -v : v);
}

static float dec_bf16(uint16_t h) { return bitsf((uint32_t)h << 16); }

/* element (i, j) of a 2-D float view, as f32 / as raw 16-bit pattern; stores */
static char *el2(const lk_tensor *t, int64_t i, int64_t j) {
    return (char *)t->data + (i * t->stride[0] + j * t->stride[1]) * (int64_t)lk_dtype_size(t->dtype);
}
static float ld2(const lk_tensor *t, int64_t i, int64_t j) {
    const char *p = el2(t, i, j);
    uint16_t h;
    float f;
    if (t->dtype == LK_F32) return memcpy(&f, p, 4), f;
    memcpy(&h, p, 2);
    return t->dtype == LK_BF16 ? dec_bf16(h) : dec_f16(h);
}
static void st2(const lk_tensor *t, int64_t i, int64_t j, float v) {
    char *p = el2(t, i, j);
    uint16_t h = t->dtype == LK_BF16 ? enc_bf16(v) : enc_f16(v);
    if (t->dtype == LK_F32) memcpy(p, &v, 4);
    else memcpy(p, &h, 2);
}

/* ---------------------------------------------------------------- records */

static int64_t entry_bytes(int64_t Dl, int64_t Dr) { return Dl + Dl / 32 + 2 * Dr; }

/* the record of latent values x[Dl] and rope bits rb[Dr] (bf16 patterns), as the header
 * states it */
static void encode_record(uint8_t *rec, const float *x, const uint16_t *rb, int64_t Dl, int64_t Dr) {
    for (int64_t g = 0; g < Dl / TILE; g++) {
        float m = 0.0f;
        for (int64_t d = g * TILE; d < (g + 1) * TILE; d++)
            if (fabsf(x[d]) > m) m = fabsf(x[d]); /* a NaN never compares greater */
        float s = m / 448.0f;
        if (s < FLT_MIN) s = FLT_MIN;
        memcpy(rec + Dl + 4 * g, &s, 4);
        for (int64_t d = g * TILE; d < (g + 1) * TILE; d++) rec[d] = enc_e4m3(x[d] / s);
    }
    memcpy(rec + Dl + Dl / 32, rb, (size_t)(2 * Dr));
}

static float rec_scale(const uint8_t *rec, int64_t Dl, int64_t g) {
    float s;
    memcpy(&s, rec + Dl + 4 * g, 4);
    return s;
}
static uint16_t rec_rope(const uint8_t *rec, int64_t Dl, int64_t r) {
    uint16_t h;
    memcpy(&h, rec + Dl + Dl / 32 + 2 * r, 2);
    return h;
}
/* entry dim e as the readers see it: f32(code) * scale (one f32 product), or the rope value */
static float rec_value(const uint8_t *rec, int64_t Dl, int64_t e) {
    if (e < Dl) return dec_e4m3(rec[e]) * rec_scale(rec, Dl, e / TILE);
    return dec_bf16(rec_rope(rec, Dl, e - Dl));
}

/* the expected record of token t of kv_c / k_pe views */
static void expect_record(uint8_t *rec, const lk_tensor *kv, const lk_tensor *pe, int64_t t) {
    int64_t Dl = kv->shape[1], Dr = pe->shape[1];
    float *x = malloc(sizeof(float) * (size_t)Dl);
    uint16_t *rb = malloc(sizeof(uint16_t) * (size_t)(Dr + 1));
    for (int64_t d = 0; d < Dl; d++) x[d] = ld2(kv, t, d);
    for (int64_t r = 0; r < Dr; r++) {
        if (pe->dtype == LK_BF16) memcpy(&rb[r], el2(pe, t, r), 2); /* bit copy */
        else rb[r] = enc_bf16(ld2(pe, t, r));
    }
    encode_record(rec, x, rb, Dl, Dr);
    free(x), free(rb);
}

/* ---------------------------------------------------------------- caches */

typedef struct {
    tu_buf b;
    int64_t nb, bs, Dl, Dr, E;
} dscache;

/* view: 0 [nb, bs, E] contiguous, 1 padded (even strides), 2 [nb, bs, 1, E] padded,
 * 3 slot-major [nb, bs, E] (pages interleaved: stride[0] = E, stride[1] = nb * E) */
static dscache ds_alloc(lk_dtype dt, int64_t nb, int64_t bs, int64_t Dl, int64_t Dr, int view) {
    dscache c;
    c.nb = nb, c.bs = bs, c.Dl = Dl, c.Dr = Dr, c.E = entry_bytes(Dl, Dr);
    if (view == 2) c.b = tu_alloc(dt, 4, (int64_t[]){nb, bs, 1, c.E}, 2);
    else if (view == 3) c.b = tu_alloc_perm(dt, 3, (int64_t[]){nb, bs, c.E}, (int[]){1, 0, 2}, 0);
    else c.b = tu_alloc(dt, 3, (int64_t[]){nb, bs, c.E}, view == 1 ? 2 : 0);
    return c;
}

static uint8_t *rec_at(const dscache *c, const tu_buf *b, int64_t slot) {
    int64_t p = slot / c->bs, s = slot % c->bs;
    return (uint8_t *)b->t.data + p * b->t.stride[0] + s * b->t.stride[1];
}

/* every record: random bytes (a sentinel an unwritten record must keep) */
static void fill_sentinel(dscache *c) {
    for (int64_t sl = 0; sl < c->nb * c->bs; sl++) {
        uint8_t *r = rec_at(c, &c->b, sl);
        for (int64_t i = 0; i < c->E; i++) r[i] = (uint8_t)(tu_rand() >> 33);
    }
}

/* first differing record byte, for messages */
static int64_t first_diff(const tu_buf *a, const tu_buf *b) {
    for (size_t i = 0; i < a->bytes; i++)
        if (a->base[i] != b->base[i]) return (int64_t)i - ((unsigned char *)a->t.data - a->base);
    return -1;
}

/* ---------------------------------------------------------------- write */

typedef struct {
    int64_t Dl, Dr, bs, T, N;
    lk_dtype kt, pt, ct, st; /* kv_c, k_pe, cache (f8e4m3 / i8), slot_mapping */
    int in;                  /* 0 contiguous, 1 padded, 2 column slices of wider rows, 3 transposed */
    int cv;                  /* cache view (ds_alloc) */
    int special;             /* special tiles and rope values */
} wcase;

static const char *IN_NAME[4] = {"contiguous", "padded", "slices", "transposed"};
static const char *CV_NAME[4] = {"3-D", "3-D padded", "4-D padded", "slot-major"};

typedef struct {
    tu_buf kvb, peb; /* allocations (peb unused when k_pe shares kvb's rows) */
    int shared;
    lk_tensor kv, pe;
} inputs;

static inputs make_inputs(int in, lk_dtype kt, lk_dtype pt, int64_t T, int64_t Dl, int64_t Dr) {
    inputs w;
    memset(&w, 0, sizeof w);
    if (in == 2 && kt == pt) { /* one [T, Dl + Dr + 3] row: kv_c at column 1, k_pe right after */
        w.shared = 1;
        w.kvb = tu_alloc(kt, 2, (int64_t[]){T, Dl + Dr + 3}, 0);
        w.kv = w.pe = w.kvb.t;
        w.kv.shape[1] = Dl, w.pe.shape[1] = Dr;
        w.kv.data = el2(&w.kvb.t, 0, 1), w.pe.data = el2(&w.kvb.t, 0, 1 + Dl);
        return w;
    }
    if (in == 2) { /* separate wider rows */
        w.kvb = tu_alloc(kt, 2, (int64_t[]){T, Dl + 5}, 0);
        w.peb = tu_alloc(pt, 2, (int64_t[]){T, Dr + 4}, 0);
        w.kv = w.kvb.t, w.pe = w.peb.t;
        w.kv.shape[1] = Dl, w.pe.shape[1] = Dr;
        w.kv.data = el2(&w.kvb.t, 0, 3), w.pe.data = el2(&w.peb.t, 0, 1);
        return w;
    }
    if (in == 3) {
        w.kvb = tu_alloc_perm(kt, 2, (int64_t[]){T, Dl}, (int[]){1, 0}, 0);
        w.peb = tu_alloc_perm(pt, 2, (int64_t[]){T, Dr}, (int[]){1, 0}, 0);
    } else {
        w.kvb = tu_alloc(kt, 2, (int64_t[]){T, Dl}, in);
        w.peb = tu_alloc(pt, 2, (int64_t[]){T, Dr}, in);
    }
    w.kv = w.kvb.t, w.pe = w.peb.t;
    return w;
}

static void free_inputs(inputs *w) {
    tu_free(&w->kvb);
    if (!w->shared) tu_free(&w->peb);
}

/* midpoint between e4m3 values c and c + 1 (c < 0x7e) */
static double e4m3_mid(int c) { return 0.5 * ((double)dec_e4m3((uint8_t)c) + (double)dec_e4m3((uint8_t)(c + 1))); }

/* latent values of tile g of token t; pattern 0 is plain random, 1..7 special */
static void gen_tile(float *v, int pattern, lk_dtype dt) {
    int emax = dt == LK_F16 ? 5 : 12;
    double mag = ldexp(1.0, (int)tu_randint(-emax, emax));
    for (int i = 0; i < TILE; i++) v[i] = (float)(tu_uniform(-1, 1) * mag);
    int k = (int)tu_randint(0, TILE - 1), k2 = (k + 37) % TILE;
    switch (pattern) {
    case 1: v[k] = NAN, v[k2] = -NAN; break;             /* ignored by the scale; NaN codes with the sign */
    case 2: v[k] = INFINITY, v[k2] = -3.0f; break;       /* scale inf: finite -> +-0, inf -> NaN */
    case 3: v[k] = -INFINITY; break;
    case 4: /* all zero (and -0): scale FLT_MIN, codes 0x00 / 0x80 */
        for (int i = 0; i < TILE; i++) v[i] = i % 3 == 1 ? -0.0f : 0.0f;
        break;
    case 5: { /* absmax 448 * 2^p: scale 2^p exactly, quotients on the grid and at its ties */
        int p = (int)tu_randint(-3, 3);
        const double vals[] = {448,    -448,   1.0625, 1.1875, -1.0625, 0x1p-10, 3 * 0x1p-10, -5 * 0x1p-10, 432, 424,
                               440,    -416,   240,    248,    0x1p-9,  7 * 0x1p-10, 15 * 0x1p-10, 0.0, 17 * 0x1p-10,
                               0.0175, 0.0166};
        int n = (int)(sizeof vals / sizeof vals[0]);
        for (int i = 0; i < TILE; i++)
            v[i] = (float)ldexp(i < n ? vals[i] : tu_uniform(-400, 400), p);
        break;
    }
    case 6: /* below FLT_MIN * 448: the FLT_MIN floor (f32 and bf16 hold these; f16 gets its subnormals) */
        for (int i = 0; i < TILE; i++)
            v[i] = dt == LK_F16 ? (float)(tu_uniform(-1, 1) * 0x1p-20) : (float)(tu_uniform(-1, 1) * (i & 1 ? 1e-37 : 1e-39));
        break;
    case 7: { /* midpoints of e4m3 values times a scale from a random absmax */
        float a = (float)tu_uniform(1, 100), s = a / 448.0f;
        for (int i = 0; i < TILE; i++) {
            double m = e4m3_mid((int)tu_randint(0, 0x7d));
            v[i] = (float)((tu_rand() & 1 ? -m : m) * (double)s);
        }
        v[k] = a;
        break;
    }
    default: break;
    }
}

/* rope inputs that stress the bf16 rounding: f32 ties / overflow / -0 / subnormal ties, f16
 * ties, bf16 NaN payloads (bit copy) */
static void special_rope(const lk_tensor *pe, int64_t t) {
    static const uint32_t f32s[] = {0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0xff800000u, 0x80000000u,
                                    0x00008000u, 0x00018000u, 0x3f80ffffu, 0xc0a1c000u};
    static const uint16_t f16s[] = {0x7bffu, 0x8000u, 0x0001u, 0x3c01u, 0x3c04u, 0x3c0cu, 0xfc00u, 0x03ffu};
    static const uint16_t bf16s[] = {0x7f81u, 0xffc1u, 0x8000u, 0x7f80u, 0x0001u, 0xff80u};
    for (int64_t r = 0; r < pe->shape[1]; r++) {
        int64_t k = (t + r) % 11;
        char *p = el2(pe, t, r);
        if (pe->dtype == LK_F32 && k < 9) memcpy(p, &f32s[k], 4);
        else if (pe->dtype == LK_F16 && k < 8) memcpy(p, &f16s[k], 2);
        else if (pe->dtype == LK_BF16 && k < 6) memcpy(p, &bf16s[k], 2);
    }
}

static void fill_inputs(const inputs *w, int64_t T, int special) {
    int64_t Dl = w->kv.shape[1], Dr = w->pe.shape[1];
    float v[TILE];
    for (int64_t t = 0; t < T; t++) {
        for (int64_t g = 0; g < Dl / TILE; g++) {
            gen_tile(v, special ? (int)((t * 3 + g) % 8) : 0, w->kv.dtype);
            for (int i = 0; i < TILE; i++) st2(&w->kv, t, g * TILE + i, v[i]);
        }
        for (int64_t r = 0; r < Dr; r++) st2(&w->pe, t, r, (float)tu_uniform(-3, 3));
        if (special) special_rope(&w->pe, t);
    }
}

/* the expected cache: the initial one with every token's record written */
static void expect_write(const dscache *c, tu_buf *e, const inputs *w, const tu_buf *sm) {
    int64_t N = sm->t.shape[0];
    for (int64_t t = 0; t < N; t++) {
        int64_t slot = (int64_t)tu_get(sm, t);
        if (slot >= 0) expect_record(rec_at(c, e, slot), &w->kv, &w->pe, t);
    }
}

static void run_write(const wcase *m) {
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    int64_t nb = 2 * ((m->T + m->bs - 1) / m->bs) + 1;
    inputs w = make_inputs(m->in, m->kt, m->pt, m->T, m->Dl, m->Dr);
    fill_inputs(&w, m->T, m->special);
    tu_buf sm = tu_alloc(m->st, 1, (int64_t[]){m->N}, m->in == 1);
    tu_random_slots(&sm, m->N, nb * m->bs, 1);
    dscache c = ds_alloc(m->ct, nb, m->bs, m->Dl, m->Dr, m->cv);
    fill_sentinel(&c);
    tu_buf e = tu_clone(&c.b);
    expect_write(&c, &e, &w, &sm);
    tu_snapshot(&w.kvb), tu_snapshot(&sm);
    if (!w.shared) tu_snapshot(&w.peb);
    for (int ii = 0; ii < nisa; ii++) {
        lk_set_isa(isas[ii]);
        tu_buf got = tu_clone(&c.b);
        lk_status st = lk_concat_and_cache_mla_fp8(&w.kv, &w.pe, &got.t, NULL, &sm.t, LK_KV_DS_MLA, NULL);
        int ok = st == LK_OK && tu_same_alloc(&got, &e) && tu_intact(&w.kvb) && tu_intact(&sm) &&
                 (w.shared || tu_intact(&w.peb));
        tu_check(ok, "write %s Dl=%lld Dr=%lld bs=%lld T=%lld N=%lld kv_c=%s k_pe=%s cache=%s %s in=%s slots=%s%s%s: "
                     "status %s, first differing byte %lld %s",
                 lk_isa_name(isas[ii]), (long long)m->Dl, (long long)m->Dr, (long long)m->bs, (long long)m->T,
                 (long long)m->N, lk_dtype_name(m->kt), lk_dtype_name(m->pt), lk_dtype_name(m->ct), CV_NAME[m->cv],
                 IN_NAME[m->in], lk_dtype_name(m->st), w.shared ? " shared-row" : "", m->special ? " special" : "",
                 lk_status_str(st), (long long)first_diff(&got, &e), lk_last_error());
        tu_free(&got);
    }
    lk_set_isa(lk_isa_best());
    tu_free(&e), tu_free(&c.b), tu_free(&sm);
    free_inputs(&w);
}

/* the write and gather grids: latent and rope dims, page sizes, float dtypes */
static const int64_t Dls[3] = {128, 256, 512}, Drs[4] = {0, 1, 7, 64}, bss[4] = {1, 7, 16, 128};
static const lk_dtype fl[3] = {LK_F32, LK_F16, LK_BF16};

static void test_write(void) {
    int k = 0;
    /* every Dl x Dr, the other parameters cycling; plain and special values */
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 4; b++)
            for (int sp = 0; sp <= 1; sp++, k++) {
                wcase m = {Dls[a], Drs[b], bss[k % 4], 23, 19, fl[k % 3], fl[(k / 3) % 3],
                           k % 5 == 4 ? LK_I8 : LK_F8E4M3, k & 1 ? LK_I32 : LK_I64, k % 4, (k / 4) % 4, sp};
                run_write(&m);
            }
    /* every kv_c x k_pe dtype pair, DeepSeek dims, special values, shared rows where equal */
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++, k++) {
            wcase m = {512, 64, 16, 21, 21, fl[a], fl[b], LK_F8E4M3, LK_I64, 2, k % 4, 1};
            run_write(&m);
        }
    /* every block size x cache view; a block of 128 spanning two pages of tokens */
    for (int p = 0; p < 4; p++)
        for (int v = 0; v < 4; v++, k++) {
            int64_t T = bss[p] == 128 ? 150 : 30;
            wcase m = {256, 7, bss[p], T, T - 4, fl[k % 3], LK_BF16, LK_F8E4M3, LK_I32, k % 4, v, k & 1};
            run_write(&m);
        }
}

/* N == 0 and an empty cache are no-ops */
static void test_write_empty(void) {
    inputs w = make_inputs(0, LK_F32, LK_F32, 3, 128, 2);
    fill_inputs(&w, 3, 0);
    tu_buf sm = tu_alloc(LK_I64, 1, (int64_t[]){0}, 0);
    dscache c = ds_alloc(LK_F8E4M3, 2, 2, 128, 2, 0);
    fill_sentinel(&c);
    tu_snapshot(&c.b);
    lk_status st = lk_concat_and_cache_mla_fp8(&w.kv, &w.pe, &c.b.t, NULL, &sm.t, LK_KV_DS_MLA, NULL);
    tu_check(st == LK_OK && tu_intact(&c.b), "write with N = 0 is a no-op (%s)", lk_last_error());
    tu_free(&sm), tu_free(&c.b);
    free_inputs(&w);
}

/* 1..4 threads: bitwise the same records (and the expectation) on every ISA */
static void test_write_threads(void) {
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    int64_t T = 300, Dl = 512, Dr = 64, bs = 16, nb = 2 * ((T + bs - 1) / bs);
    inputs w = make_inputs(0, LK_F32, LK_BF16, T, Dl, Dr);
    fill_inputs(&w, T, 0);
    tu_buf sm = tu_alloc(LK_I64, 1, (int64_t[]){T}, 0);
    tu_random_slots(&sm, T, nb * bs, 1);
    dscache c = ds_alloc(LK_F8E4M3, nb, bs, Dl, Dr, 1);
    fill_sentinel(&c);
    tu_buf e = tu_clone(&c.b);
    expect_write(&c, &e, &w, &sm);
    for (int ii = 0; ii < nisa; ii++) {
        lk_set_isa(isas[ii]);
        for (int th = 1; th <= 4; th++) {
            lk_set_num_threads(th);
            tu_buf got = tu_clone(&c.b);
            lk_status st = lk_concat_and_cache_mla_fp8(&w.kv, &w.pe, &got.t, NULL, &sm.t, LK_KV_DS_MLA, NULL);
            tu_check(st == LK_OK && tu_same_alloc(&got, &e), "write %s %d threads: T=%lld records as expected (%s)",
                     lk_isa_name(isas[ii]), th, (long long)T, lk_last_error());
            tu_free(&got);
        }
    }
    lk_set_num_threads(0);
    lk_set_isa(lk_isa_best());
    tu_free(&e), tu_free(&c.b), tu_free(&sm);
    free_inputs(&w);
}

/* an f32 NaN rope value becomes a bf16 NaN of the same sign (its payload is not specified) */
static void test_write_rope_nan(void) {
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    for (int di = 0; di < 2; di++) {
        lk_dtype pt = di ? LK_F16 : LK_F32;
        inputs w = make_inputs(0, LK_BF16, pt, 2, 128, 3);
        fill_inputs(&w, 2, 0);
        st2(&w.pe, 0, 0, NAN), st2(&w.pe, 0, 2, -NAN), st2(&w.pe, 1, 1, NAN);
        if (pt == LK_F32) { /* a signalling NaN with a payload in the low bits only */
            uint32_t snan = 0xff800001u;
            memcpy(el2(&w.pe, 1, 2), &snan, 4);
        }
        tu_buf sm = tu_alloc(LK_I32, 1, (int64_t[]){2}, 0);
        tu_set(&sm, 0, 3), tu_set(&sm, 1, 0);
        for (int ii = 0; ii < nisa; ii++) {
            lk_set_isa(isas[ii]);
            dscache c = ds_alloc(LK_F8E4M3, 2, 2, 128, 3, 0);
            fill_sentinel(&c);
            lk_status st = lk_concat_and_cache_mla_fp8(&w.kv, &w.pe, &c.b.t, NULL, &sm.t, LK_KV_DS_MLA, NULL);
            int ok = st == LK_OK;
            for (int64_t t = 0; t < 2 && ok; t++)
                for (int64_t r = 0; r < 3; r++) {
                    float x = ld2(&w.pe, t, r);
                    uint16_t h = rec_rope(rec_at(&c, &c.b, t ? 0 : 3), 128, r);
                    if (isnan(x)) ok &= (h & 0x7f80) == 0x7f80 && (h & 0x7f) && (h >> 15) == (fbits(x) >> 31);
                    else ok &= h == enc_bf16(x);
                }
            tu_check(ok, "write %s: %s NaN rope values stored as bf16 NaNs with their sign (%s)", lk_isa_name(isas[ii]),
                     lk_dtype_name(pt), lk_last_error());
            tu_free(&c.b);
        }
        lk_set_isa(lk_isa_best());
        tu_free(&sm);
        free_inputs(&w);
    }
}

/* ---------------------------------------------------------------- gather */

typedef struct {
    int64_t Dl, Dr, bs;
    int B;
    int64_t lens[6], starts[6];
    int use_starts;
    lk_dtype ct, ot;
    int cv, opad; /* opad: 0 contiguous out, 1 padded rows, 2 transposed (column-major) */
} gcase;

static tu_buf alloc_out(lk_dtype dt, int64_t S, int64_t C, int opad) {
    if (opad == 2) return tu_alloc_perm(dt, 2, (int64_t[]){S, C}, (int[]){1, 0}, 0);
    return tu_alloc(dt, 2, (int64_t[]){S, C}, opad);
}

static int is_nan_bits(const char *p, lk_dtype dt) {
    uint32_t u = 0;
    uint16_t h;
    if (dt == LK_F32) return memcpy(&u, p, 4), (u & 0x7fffffffu) > 0x7f800000u;
    memcpy(&h, p, 2);
    if (dt == LK_BF16) return (h & 0x7fff) > 0x7f80;
    return (h & 0x7fff) > 0x7c00;
}

/* an f32 value rounded once to out's dtype, as bits */
static void put_out(char *p, lk_dtype dt, float v) {
    uint16_t h = dt == LK_BF16 ? enc_bf16(v) : enc_f16(v);
    if (dt == LK_F32) memcpy(p, &v, 4);
    else memcpy(p, &h, 2);
}

/* got == want bit for bit outside the view (padding, guards) and inside it, except where
 * lenient[i] (a NaN wanted: any NaN) */
static int out_matches(const tu_buf *got, const tu_buf *want, const uint8_t *lenient, int64_t *bad) {
    int64_t n = tu_numel(got);
    size_t es = lk_dtype_size(got->t.dtype);
    for (size_t i = 0; i < got->bytes; i++)
        if (!got->inview[i] && got->base[i] != want->base[i]) return *bad = -1, 0;
    for (int64_t i = 0; i < n; i++) {
        const char *g = (const char *)got->t.data + tu_offset(&got->t, i) * (int64_t)es;
        const char *w = (const char *)want->t.data + tu_offset(&want->t, i) * (int64_t)es;
        if (lenient[i] ? !is_nan_bits(g, got->t.dtype) : memcmp(g, w, es) != 0) return *bad = i, 0;
    }
    return 1;
}

/* random record: codes over every non-NaN code (a NaN code at dim 5 of some), scales
 * spanning FLT_MIN .. 2^100 and inf, rope values random bf16 with specials */
static void random_record(uint8_t *rec, int64_t Dl, int64_t Dr, int64_t j) {
    for (int64_t d = 0; d < Dl; d++) {
        uint8_t c = (uint8_t)(tu_rand() >> 40);
        if ((c & 0x7f) == 0x7f) c ^= 1;
        rec[d] = c;
    }
    if (j % 3 == 0) rec[5] = j % 2 ? 0xff : 0x7f;
    for (int64_t g = 0; g < Dl / TILE; g++) {
        int64_t k = tu_randint(0, 15);
        float s = k == 0   ? FLT_MIN
                  : k == 1 ? 0x1p100f
                  : k == 2 && j % 4 == 0 ? INFINITY
                  : k == 3 ? 0x1p121f /* 256 s overflows */
                  : k == 4 ? 0x1p127f /* large codes overflow f32 */
                  : k == 5 ? 0x1p-140f /* subnormal (not from the writer) */
                           : (float)ldexp(tu_uniform(0.5, 1), (int)tu_randint(-20, 20));
        memcpy(rec + Dl + 4 * g, &s, 4);
    }
    static const uint16_t sp[] = {0x7f81u, 0xffc0u, 0x7f80u, 0x8000u, 0x0001u, 0x7f7fu, 0x477fu, 0x3f81u};
    for (int64_t r = 0; r < Dr; r++) {
        uint16_t h = tu_randint(0, 5) == 0 ? sp[tu_randint(0, 7)] : enc_bf16((float)tu_uniform(-3, 3));
        memcpy(rec + Dl + Dl / 32 + 2 * r, &h, 2);
    }
}

static void poison_record(uint8_t *rec, int64_t E) { memset(rec, 0x7f, (size_t)E); /* NaN codes */ }

static void run_gather(const gcase *g) {
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    int64_t bs = g->bs, Dl = g->Dl, Dr = g->Dr, C = Dl + Dr, S = 0, maxp = 1, used = 0;
    for (int b = 0; b < g->B; b++) {
        S += g->lens[b];
        int64_t st = g->use_starts ? g->starts[b] : 0, end = st + g->lens[b];
        int64_t p = (end + bs - 1) / bs;
        if (p + 1 > maxp) maxp = p + 1;
        if (g->lens[b]) used += (end - 1) / bs - st / bs + 1;
    }
    int64_t nb = used + 2;
    int64_t *perm = tu_permutation(nb);
    tu_buf bt = tu_alloc(LK_I32, 2, (int64_t[]){g->B, maxp}, g->opad);
    tu_buf sl = tu_alloc(LK_I32, 1, (int64_t[]){g->B}, g->opad);
    tu_buf ss = tu_alloc(LK_I32, 1, (int64_t[]){g->B}, g->opad);
    int64_t k = 0;
    for (int b = 0; b < g->B; b++) {
        int64_t st = g->use_starts ? g->starts[b] : 0, end = st + g->lens[b];
        tu_set(&sl, b, (double)g->lens[b]), tu_set(&ss, b, (double)st);
        for (int64_t p = 0; p < maxp; p++) {
            int read = g->lens[b] && p >= st / bs && p <= (end - 1) / bs;
            tu_set(&bt, b * maxp + p, read ? (double)perm[k++] : (p & 1 ? -1 : 1e9));
        }
    }
    free(perm);
    dscache c = ds_alloc(g->ct, nb, bs, Dl, Dr, g->cv);
    for (int64_t s = 0; s < nb * bs; s++) poison_record(rec_at(&c, &c.b, s), c.E);
    tu_buf want = alloc_out(g->ot, S, C, g->opad);
    uint8_t *lenient = calloc((size_t)(S * C + 1), 1);
    size_t oes = lk_dtype_size(g->ot);
    int64_t row = 0;
    for (int b = 0; b < g->B; b++) {
        int64_t st = g->use_starts ? g->starts[b] : 0;
        for (int64_t j = 0; j < g->lens[b]; j++, row++) {
            int64_t p = st + j, page = (int64_t)tu_get(&bt, b * maxp + p / bs);
            uint8_t *rec = rec_at(&c, &c.b, page * bs + p % bs);
            random_record(rec, Dl, Dr, j);
            for (int64_t e = 0; e < C; e++) {
                char *w = (char *)want.t.data + (row * want.t.stride[0] + e * want.t.stride[1]) * (int64_t)oes;
                float v = rec_value(rec, Dl, e);
                if (e >= Dl && g->ot == LK_BF16) { /* rope bits copied */
                    uint16_t h = rec_rope(rec, Dl, e - Dl);
                    memcpy(w, &h, 2);
                } else if (e >= Dl && g->ot == LK_F32) {
                    uint32_t u = (uint32_t)rec_rope(rec, Dl, e - Dl) << 16;
                    memcpy(w, &u, 4);
                } else {
                    put_out(w, g->ot, v);
                    lenient[row * C + e] = isnan(v);
                }
            }
        }
    }
    tu_snapshot(&c.b), tu_snapshot(&bt), tu_snapshot(&sl), tu_snapshot(&ss);
    for (int ii = 0; ii < nisa; ii++) {
        lk_set_isa(isas[ii]);
        for (int api = g->use_starts ? 1 : 0; api < 2; api++) {
            tu_buf o = alloc_out(g->ot, S, C, g->opad);
            tu_snapshot(&o);
            lk_status st = api == 0 ? lk_gather_cache_fp8(&o.t, &c.b.t, &bt.t, &sl.t, LK_KV_DS_MLA, NULL)
                                    : lk_gather_cache_starts(&o.t, &c.b.t, &bt.t, &sl.t, g->use_starts ? &ss.t : NULL,
                                                             LK_KV_DS_MLA, NULL);
            int64_t bad = -2;
            int ok = st == LK_OK && out_matches(&o, &want, lenient, &bad) && tu_intact(&c.b) && tu_intact(&bt) &&
                     tu_intact(&sl) && tu_intact(&ss);
            tu_check(ok, "gather %s %s Dl=%lld Dr=%lld bs=%lld B=%d S=%lld cache=%s %s out=%s%s: status %s, first bad "
                         "element %lld (-1: outside the view) %s",
                     lk_isa_name(isas[ii]), api ? (g->use_starts ? "starts" : "starts(NULL)") : "fp8", (long long)Dl,
                     (long long)Dr, (long long)bs, g->B, (long long)S, lk_dtype_name(g->ct), CV_NAME[g->cv],
                     lk_dtype_name(g->ot), g->opad == 2 ? " transposed" : g->opad ? " padded" : "", lk_status_str(st), (long long)bad, lk_last_error());
            tu_free(&o);
        }
    }
    lk_set_isa(lk_isa_best());
    free(lenient);
    tu_free(&want), tu_free(&c.b), tu_free(&bt), tu_free(&sl), tu_free(&ss);
}

/* 1..4 threads: the same out on every ISA (two long requests) */
static void test_gather_threads(void) {
    gcase g = {512, 64, 64, 2, {300, 133}, {7, 64}, 1, LK_F8E4M3, LK_BF16, 0, 0};
    for (int th = 1; th <= 4; th++) {
        lk_set_num_threads(th);
        tu_seed(777); /* the same records each time */
        run_gather(&g);
    }
    lk_set_num_threads(0);
}

static void test_gather(void) {
    int k = 0;
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 4; b++)
            for (int o = 0; o < 3; o++, k++) {
                int64_t bs = bss[k % 4];
                gcase g = {Dls[a], Drs[b], bs, 5, {3, 0, 2 * bs + 1, 1, bs}, {0}, 0, k % 5 == 2 ? LK_I8 : LK_F8E4M3,
                           fl[o], k % 4, k % 7 == 3 ? 2 : k & 1};
                if (bs == 128) g.lens[2] = 130;
                if (k % 2 == 0) { /* with seq_starts: any start, pages before it not looked at */
                    g.use_starts = 1;
                    int64_t st[5] = {bs + 2, 7, bs - 1, 0, 3 * bs};
                    memcpy(g.starts, st, sizeof st);
                }
                run_gather(&g);
            }
    /* every request empty: S = 0 */
    gcase e = {256, 64, 16, 2, {0, 0}, {5, 0}, 1, LK_F8E4M3, LK_BF16, 0, 1};
    run_gather(&e);
    /* one page exactly, a start on a page boundary */
    gcase p = {512, 64, 16, 3, {16, 32, 5}, {16, 0, 11}, 1, LK_F8E4M3, LK_F32, 1, 0};
    run_gather(&p);
}

/* ---------------------------------------------------------------- decode */

typedef struct {
    int64_t Dl, Dr, bs, s_q, H;
    int B;
    int64_t len[4];
    int causal;
    int64_t split;
    lk_dtype qt, ot, ct;
    int no_lse, cv, pad;
    int extreme; /* tile 0: scale 2^121 (256 s overflows f32) with codes |c| <= 2^-6, q's dims
                  * there times 2^-118; tile 1: scale FLT_MIN, any codes; 2: keys from 96 on
                  * only (the first block of 96 keys without them) */
} decase;

typedef struct {
    dscache c;
    tu_buf f32c, q, bt, sl;
    double *want, *want_lse, *want_mag; /* want_mag: sum_j p_j |e_j[d]| / l, the size of the terms */
    float scale;
    int64_t maxp;
} dworld;

static void build_decode(const decase *d, dworld *z) {
    int64_t Dl = d->Dl, Dr = d->Dr, E = Dl + Dr, bs = d->bs, maxlen = 1, pages = 0;
    for (int b = 0; b < d->B; b++) {
        if (d->len[b] > maxlen) maxlen = d->len[b];
        pages += (d->len[b] + bs - 1) / bs;
    }
    z->maxp = (maxlen + bs - 1) / bs + 1;
    int64_t nb = pages + 2;
    z->scale = (float)(1.0 / sqrt((double)E));
    z->c = ds_alloc(d->ct, nb, bs, Dl, Dr, d->cv);
    z->f32c = tu_alloc(LK_F32, 3, (int64_t[]){nb, bs, E}, 0);
    for (int64_t i = 0; i < tu_numel(&z->f32c); i++) ((float *)z->f32c.t.data)[i] = NAN;
    for (int64_t s = 0; s < nb * bs; s++) poison_record(rec_at(&z->c, &z->c.b, s), z->c.E);
    z->q = tu_alloc(d->qt, 4, (int64_t[]){d->B, d->s_q, d->H, E}, d->pad);
    tu_fill_uniform(&z->q, -1, 1);
    if (d->extreme)
        for (int64_t r = 0; r < d->B * d->s_q * d->H; r++)
            for (int64_t e = 0; e < TILE; e++) tu_set(&z->q, r * E + e, tu_get(&z->q, r * E + e) * 0x1p-118);
    z->bt = tu_alloc(LK_I32, 2, (int64_t[]){d->B, z->maxp}, d->pad);
    z->sl = tu_alloc(LK_I32, 1, (int64_t[]){d->B}, d->pad);
    int64_t *perm = tu_permutation(nb);
    float *x = malloc(sizeof(float) * (size_t)Dl);
    uint16_t *rb = malloc(sizeof(uint16_t) * (size_t)(Dr + 1));
    double *ent = malloc(sizeof(double) * (size_t)(d->B * maxlen * E));
    int64_t k = 0;
    for (int b = 0; b < d->B; b++) {
        tu_set(&z->sl, b, (double)d->len[b]);
        for (int64_t p = 0; p < z->maxp; p++)
            tu_set(&z->bt, b * z->maxp + p, p < (d->len[b] + bs - 1) / bs ? (double)perm[k++] : -1);
        for (int64_t j = 0; j < d->len[b]; j++) {
            for (int64_t g = 0; g < Dl / TILE; g++) {
                double mag = ldexp(1.0, (int)tu_randint(-3, 2));
                for (int64_t i = g * TILE; i < (g + 1) * TILE; i++) x[i] = (float)(tu_uniform(-1, 1) * mag);
            }
            for (int64_t r = 0; r < Dr; r++) rb[r] = enc_bf16((float)tu_uniform(-1, 1));
            int64_t page = (int64_t)tu_get(&z->bt, b * z->maxp + j / bs), slot = page * bs + j % bs;
            uint8_t *rec = rec_at(&z->c, &z->c.b, slot);
            encode_record(rec, x, rb, Dl, Dr);
            if (d->extreme == 1 || (d->extreme == 2 && j >= 96)) {
                float big = 0x1p121f, tiny = FLT_MIN;
                memcpy(rec + Dl, &big, 4), memcpy(rec + Dl + 4, &tiny, 4);
                for (int64_t i = 0; i < TILE; i++) rec[i] = (uint8_t)(tu_randint(0, 8) | (tu_rand() & 0x80));
                for (int64_t i = TILE; i < 2 * TILE; i++) rec[i] = (uint8_t)((tu_rand() >> 40) % 0x7f | (tu_rand() & 0x80));
            }
            for (int64_t e = 0; e < E; e++) {
                float v = rec_value(rec, Dl, e); /* the values an f32 cache holds */
                ((float *)z->f32c.t.data)[slot * E + e] = v;
                ent[(b * maxlen + j) * E + e] = v;
            }
        }
    }
    free(perm), free(x), free(rb);
    /* float64 attention over the dequantized entries */
    tu_mla_decode_ref(&z->q, ent, d->len, d->B, d->s_q, d->H, E, Dl, maxlen, (double)z->scale, d->causal, &z->want,
                      &z->want_lse, &z->want_mag);
    free(ent);
}

static void free_decode(dworld *z) {
    tu_free(&z->c.b), tu_free(&z->f32c), tu_free(&z->q), tu_free(&z->bt), tu_free(&z->sl);
    free(z->want), free(z->want_lse), free(z->want_mag);
}

/* max over i of |got - want| / (atol max(1, mag) + rtol |want|): the absolute part scaled
 * by the size of the summed terms (a cancelling sum of huge values keeps their error) */
static double dec_err(const double *got, const double *want, const double *mag, int64_t n, tu_tolerance tol) {
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) return INFINITY;
        double e = fabs(got[i] - want[i]) / (tol.atol * fmax(1.0, mag[i]) + tol.rtol * fabs(want[i]));
        if (e > worst) worst = e;
    }
    return worst;
}

static void run_decode(const decase *d0, int threads_too) {
    decase dd = *d0, *d = &dd;
    for (int b = 0; b < d->B; b++) /* causal: a length is 0 or >= s_q */
        if (d->causal && d->len[b] > 0 && d->len[b] < d->s_q) d->len[b] = d->s_q;
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    dworld z;
    build_decode(d, &z);
    lk_mla_decode_params p = lk_mla_decode_params_default(z.scale);
    p.causal = d->causal, p.split_keys = d->split;
    tu_snapshot(&z.c.b), tu_snapshot(&z.q), tu_snapshot(&z.bt), tu_snapshot(&z.sl);
    char name[400];
    snprintf(name, sizeof name, "decode Dl=%lld Dr=%lld bs=%lld s_q=%lld H=%lld B=%d len=%lld,%lld,%lld%s split=%lld q=%s out=%s cache=%s %s%s%s%s",
             (long long)d->Dl, (long long)d->Dr, (long long)d->bs, (long long)d->s_q, (long long)d->H, d->B,
             (long long)d->len[0], (long long)d->len[1], (long long)d->len[2], d->causal ? " causal" : "",
             (long long)d->split, lk_dtype_name(d->qt), lk_dtype_name(d->ot), lk_dtype_name(d->ct), CV_NAME[d->cv],
             d->no_lse ? " lse=NULL" : "", d->pad ? " padded" : "",
             d->extreme ? " extreme-scales" : "");
    int64_t nout = 0;
    for (int ii = 0; ii < nisa; ii++) {
        lk_set_isa(isas[ii]);
        /* the bf16 dot products: not an f32 cache's bits; the first thread count's are kept */
        int bfp = isas[ii] == LK_ISA_AVX512BF16 && d->qt == LK_BF16 && d->ot == LK_BF16 && !lk_cpu_prefer_fma();
        tu_buf k1 = {0}, kl = {0};
        for (int th = threads_too ? 1 : 0; th <= (threads_too ? 4 : 0); th++) {
            if (th) lk_set_num_threads(th);
            tu_buf o1 = tu_alloc(d->ot, 4, (int64_t[]){d->B, d->s_q, d->H, d->Dl}, d->pad);
            tu_buf l1 = tu_alloc(LK_F32, 3, (int64_t[]){d->B, d->H, d->s_q}, d->pad);
            tu_snapshot(&o1), tu_snapshot(&l1);
            tu_buf o2 = tu_clone(&o1), l2 = tu_clone(&l1);
            p.cache_layout = LK_KV_DS_MLA;
            lk_status s1 = lk_mla_decode(&o1.t, d->no_lse ? NULL : &l1.t, &z.q.t, &z.c.b.t, NULL, &z.bt.t, &z.sl.t, &p);
            char err[256];
            snprintf(err, sizeof err, "%s", lk_last_error());
            p.cache_layout = LK_KV_ND;
            lk_status s2 = lk_mla_decode(&o2.t, d->no_lse ? NULL : &l2.t, &z.q.t, &z.f32c.t, NULL, &z.bt.t, &z.sl.t, &p);
            int intact = tu_intact(&z.c.b) && tu_intact(&z.q) && tu_intact(&z.bt) && tu_intact(&z.sl);
            if (bfp && th > 1)
                tu_check(s1 == LK_OK && tu_same_alloc(&o1, &k1) && tu_same_alloc(&l1, &kl) && intact,
                         "%s [%s, threads %d]: out and lse bit for bit those of 1 thread (status %s %s)", name,
                         lk_isa_name(isas[ii]), th, lk_status_str(s1), err);
            else if (bfp)
                tu_check(s1 == LK_OK && s2 == LK_OK && intact, "%s [%s]: status %s / %s %s", name,
                         lk_isa_name(isas[ii]), lk_status_str(s1), lk_status_str(s2), err);
            else
                tu_check(s1 == LK_OK && s2 == LK_OK && tu_same_alloc(&o1, &o2) && tu_same_alloc(&l1, &l2) && intact,
                         "%s [%s%s%s]: out and lse bit for bit those of an f32 cache of the values (status %s / %s %s)",
                         name, lk_isa_name(isas[ii]), th ? ", threads " : "", th ? (char[]){(char)('0' + th), 0} : "",
                         lk_status_str(s1), lk_status_str(s2), err);
            if (bfp && th == 1) k1 = tu_clone(&o1), kl = tu_clone(&l1);
            if (th <= 1) { /* float64: f32 dot products of E <= 576 terms (|q|, |e| <= 1 after the
                             * scale 1 / sqrt(E)) err by ~E * 2^-24 * sum|q e| / sqrt(E) < 1e-6
                             * in the scores; exp / sums / the division add a few ulps: the
                             * f32 tolerance 1e-5 (abs + rel) of tu_tol is 10x that; f16 /
                             * bf16 outs add their one rounding (2^-11 / 2^-8 relative), within
                             * tu_tol's 2e-3 / 2e-2. lse: ~1e-6 relative, checked to 1e-4. */
                nout = tu_numel(&o1);
                double *got = tu_values(&o1), *gl = tu_values(&l1);
                double e = dec_err(got, z.want, z.want_mag, nout, bfp ? (tu_tolerance){0x1p-8 + 1e-5, 0x1p-8} : tu_tol(d->ot));
                double el = d->no_lse ? 0 : tu_err(gl, z.want_lse, tu_numel(&l1), (tu_tolerance){1e-4, 1e-4});
                tu_check(e <= 1 && el <= 1 && (!d->no_lse || tu_intact(&l1)) && tu_outside_intact(&o1) &&
                             tu_outside_intact(&l1),
                         "%s [%s]: vs float64 err %.3g, lse %.3g; nothing written outside out / lse", name,
                         lk_isa_name(isas[ii]), e, el);
                free(got), free(gl);
            }
            tu_free(&o1), tu_free(&o2), tu_free(&l1), tu_free(&l2);
        }
        if (k1.t.data) tu_free(&k1), tu_free(&kl);
        lk_set_num_threads(0);
    }
    lk_set_isa(lk_isa_best());
    free_decode(&z);
}

static void test_decode(void) {
    const int64_t Hs[4] = {1, 3, 16, 5}, splits[3] = {0, 16, 64};
    int k = 0;
    for (int sq = 1; sq <= 2; sq++)
        for (int h = 0; h < 4; h++)
            for (int sp = 0; sp < 3; sp++, k++) {
                if (tu_emulated() && (h == 2 || sp == 1)) continue; /* qemu: a third of the grid */
                decase d = {512, 64, 16, sq, Hs[h], 3, {37, 0, 130}, sq == 2, splits[sp],
                            k & 1 ? LK_F32 : LK_BF16, k % 3 == 1 ? LK_F32 : LK_BF16, k % 5 == 3 ? LK_I8 : LK_F8E4M3,
                            k % 4 == 2, k % 4, k % 3 == 0, 0};
                run_decode(&d, 0);
            }
    static const struct {
        decase d;
        int threads_too;
    } FIXED[] = {
        /* other dims and pages: Dr odd / 0, pages 1 and 64, one token, a request of 0 */
        {{128, 7, 1, 1, 4, 3, {1, 9, 0}, 0, 4, LK_F32, LK_F32, LK_F8E4M3, 0, 1, 1, 0}, 0},
        {{256, 0, 64, 2, 2, 2, {65, 2}, 1, 0, LK_BF16, LK_F32, LK_F8E4M3, 0, 2, 0, 0}, 0},
        {{384, 64, 7, 2, 8, 3, {0, 20, 3}, 1, 8, LK_BF16, LK_BF16, LK_F8E4M3, 1, 3, 1, 0}, 0},
        /* thread counts 1..4 with forced splits */
        {{512, 64, 16, 1, 16, 2, {300, 77}, 0, 32, LK_BF16, LK_BF16, LK_F8E4M3, 0, 0, 0, 0}, 1},
        /* extreme tile scales: the huge one past the range where 256 s is finite; from key
         * 96 on only (a request's first block of keys without them) */
        {{512, 64, 16, 2, 4, 2, {40, 17}, 1, 16, LK_F32, LK_F32, LK_F8E4M3, 0, 0, 0, 1}, 0},
        {{256, 8, 7, 1, 3, 2, {9, 30}, 0, 0, LK_BF16, LK_BF16, LK_I8, 0, 1, 1, 1}, 0},
        {{512, 64, 16, 2, 4, 2, {230, 60}, 1, 0, LK_BF16, LK_BF16, LK_F8E4M3, 0, 0, 0, 2}, 0},
        /* more rows than one panel of 2W (the bf16 path's row panels: a narrow last one), Dr 0 / odd */
        {{128, 0, 16, 1, 40, 2, {130, 7}, 0, 0, LK_BF16, LK_BF16, LK_F8E4M3, 0, 2, 1, 0}, 0},
        {{256, 7, 5, 2, 20, 2, {50, 97}, 1, 32, LK_BF16, LK_BF16, LK_I8, 0, 1, 0, 0}, 0},
    };
    for (size_t i = 0; i < sizeof FIXED / sizeof FIXED[0]; i++) run_decode(&FIXED[i].d, FIXED[i].threads_too);
}

/* ---------------------------------------------------------------- concat_and_cache_mla_rope */

typedef struct {
    int64_t T, N, Hq, Dl, Dr, rot, bs;
    int neox;
    lk_dtype qt, pt, kt, cst;
    int cv;
} rcase;

static void run_rope(const rcase *m) {
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    int64_t maxpos = 40, nb = 2 * ((m->T + m->bs - 1) / m->bs) + 1;
    tu_buf q = tu_alloc(m->qt, 3, (int64_t[]){m->T, m->Hq, m->Dr}, 1);
    inputs w = make_inputs(1, m->kt, m->pt, m->T, m->Dl, m->Dr);
    fill_inputs(&w, m->T, 0);
    tu_fill_uniform(&q, -2, 2);
    tu_buf pos = tu_alloc(LK_I64, 1, (int64_t[]){m->T + 3}, 0);
    for (int64_t i = 0; i < m->T + 3; i++) tu_set(&pos, i, i < m->T ? (double)tu_randint(0, maxpos - 1) : 1e6);
    lk_tensor posT = pos.t;
    posT.shape[0] = m->T;
    tu_buf cs = tu_cos_sin(m->cst, maxpos, m->rot, 0, 0);
    tu_buf sm = tu_alloc(LK_I32, 1, (int64_t[]){m->N}, 0);
    tu_random_slots(&sm, m->N, nb * m->bs, 1);
    dscache c = ds_alloc(LK_F8E4M3, nb, m->bs, m->Dl, m->Dr, m->cv);
    fill_sentinel(&c);
    tu_saved q0 = tu_save(&q), kv0 = tu_save(&w.kvb), pe0 = tu_save(&w.peb), c0 = tu_save(&c.b);
    for (int ii = 0; ii < nisa; ii++) {
        lk_set_isa(isas[ii]);
        /* composed: rotary_embedding (k_pe as [T, 1, Dr]), then the DS write */
        tu_restore(&q, &q0), tu_restore(&w.kvb, &kv0), tu_restore(&w.peb, &pe0), tu_restore(&c.b, &c0);
        lk_tensor k3 = w.pe;
        k3.ndim = 3, k3.shape[2] = w.pe.shape[1], k3.stride[2] = w.pe.stride[1], k3.shape[1] = 1, k3.stride[1] = 0;
        lk_status s1 = lk_rotary_embedding(&posT, &q.t, &k3, &cs.t, m->neox);
        lk_status s2 = lk_concat_and_cache_mla_fp8(&w.kv, &w.pe, &c.b.t, NULL, &sm.t, LK_KV_DS_MLA, NULL);
        tu_saved qA = tu_save(&q), peA = tu_save(&w.peb), cA = tu_save(&c.b);
        /* the expectation from the rotated k_pe */
        tu_buf e = tu_clone(&c.b);
        memcpy(e.base, c0.bytes, c0.n);
        expect_write(&c, &e, &w, &sm);
        int exp_ok = tu_same_alloc(&c.b, &e);
        tu_free(&e);
        /* fused */
        tu_restore(&q, &q0), tu_restore(&w.kvb, &kv0), tu_restore(&w.peb, &pe0), tu_restore(&c.b, &c0);
        lk_status s3 = lk_concat_and_cache_mla_rope(&pos.t, &q.t, &w.pe, &w.kv, &cs.t, m->neox, &c.b.t, NULL, &sm.t,
                                                    LK_KV_DS_MLA, NULL);
        tu_check(s1 == LK_OK && s2 == LK_OK && s3 == LK_OK && tu_same(&q, &qA) && tu_same(&w.peb, &peA) &&
                     tu_same(&c.b, &cA) && tu_same(&w.kvb, &kv0) && exp_ok,
                 "rope+write %s T=%lld N=%lld Hq=%lld Dl=%lld Dr=%lld rot=%lld bs=%lld %s q=%s k_pe=%s kv_c=%s cs=%s %s: "
                 "== rotary_embedding then concat_and_cache_mla_fp8, bit for bit (%s %s %s) %s",
                 lk_isa_name(isas[ii]), (long long)m->T, (long long)m->N, (long long)m->Hq, (long long)m->Dl,
                 (long long)m->Dr, (long long)m->rot, (long long)m->bs, m->neox ? "neox" : "gptj", lk_dtype_name(m->qt),
                 lk_dtype_name(m->pt), lk_dtype_name(m->kt), lk_dtype_name(m->cst), CV_NAME[m->cv], lk_status_str(s1),
                 lk_status_str(s2), lk_status_str(s3), lk_last_error());
        free(qA.bytes), free(peA.bytes), free(cA.bytes);
    }
    lk_set_isa(lk_isa_best());
    free(q0.bytes), free(kv0.bytes), free(pe0.bytes), free(c0.bytes);
    tu_free(&q), tu_free(&pos), tu_free(&cs), tu_free(&sm), tu_free(&c.b);
    free_inputs(&w);
}

static void test_rope(void) {
    rcase a = {9, 7, 3, 512, 64, 64, 16, 1, LK_BF16, LK_BF16, LK_BF16, LK_F32, 0};
    run_rope(&a);
    rcase b = {5, 5, 1, 128, 8, 4, 7, 0, LK_F32, LK_F32, LK_F16, LK_F32, 1};
    run_rope(&b);
    rcase c = {17, 12, 16, 256, 64, 32, 1, 0, LK_F16, LK_BF16, LK_F32, LK_BF16, 2};
    run_rope(&c);
    rcase d = {33, 33, 2, 512, 64, 64, 128, 1, LK_BF16, LK_F16, LK_BF16, LK_F16, 3};
    run_rope(&d);
}

/* ---------------------------------------------------------------- bad inputs */

#define MAXB 12
typedef struct {
    tu_buf *b[MAXB];
    int n;
} bufset;

static void snap(bufset *s) {
    for (int i = 0; i < s->n; i++) tu_snapshot(s->b[i]);
}
static int intact(const bufset *s) {
    for (int i = 0; i < s->n; i++)
        if (!tu_intact(s->b[i])) return 0;
    return 1;
}

static void expect_bad(lk_status st, lk_status want, const char *arg, const bufset *s, const char *what) {
    const char *msg = lk_last_error();
    tu_check(st == want && strstr(msg, arg) && intact(s), "bad [%s]: %s -> %s (want %s), message names \"%s\": %s",
             lk_isa_name(lk_isa_current()), what, lk_status_str(st), lk_status_str(want), arg, msg);
}

/* an error of the write part leaves q_pe and k_pe unrotated and the cache untouched */
static void test_rope_bad(void) {
    int64_t T = 3, Dl = 128, Dr = 8;
    tu_buf q = tu_alloc(LK_F32, 3, (int64_t[]){T, 2, Dr}, 0), pos = tu_alloc(LK_I32, 1, (int64_t[]){T}, 0);
    inputs w = make_inputs(0, LK_F32, LK_F32, T, Dl, Dr);
    fill_inputs(&w, T, 0);
    tu_fill_uniform(&q, -1, 1);
    for (int64_t i = 0; i < T; i++) tu_set(&pos, i, (double)(i + 1));
    tu_buf cs = tu_cos_sin(LK_F32, 8, Dr, 0, 0), sm = tu_alloc(LK_I32, 1, (int64_t[]){T}, 0);
    for (int64_t i = 0; i < T; i++) tu_set(&sm, i, (double)i);
    int64_t E = entry_bytes(Dl, Dr);
    tu_buf c16 = tu_alloc(LK_F16, 3, (int64_t[]){2, 2, E}, 0), cE = tu_alloc(LK_F8E4M3, 3, (int64_t[]){2, 2, E + 2}, 0);
    tu_buf pec = tu_alloc(LK_F8E4M3, 3, (int64_t[]){2, 2, 2 * Dr}, 0);
    dscache c = ds_alloc(LK_F8E4M3, 2, 2, Dl, Dr, 0);
    fill_sentinel(&c);
    bufset s = {{&q, &pos, &w.kvb, &w.peb, &cs, &sm, &c16, &cE, &pec, &c.b}, 10};
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    for (int ii = 0; ii < nisa; ii++) {
        lk_set_isa(isas[ii]);
        snap(&s);
#define R(cache, kpc) lk_concat_and_cache_mla_rope(&pos.t, &q.t, &w.pe, &w.kv, &cs.t, 1, cache, kpc, &sm.t, LK_KV_DS_MLA, NULL)
        expect_bad(R(&c16.t, NULL), LK_ERR_DTYPE, "kv_c_cache", &s, "rope+write f16 record cache");
        expect_bad(R(&cE.t, NULL), LK_ERR_SHAPE, "kv_c_cache", &s, "rope+write entry of E + 2 bytes");
        expect_bad(R(&c.b.t, &pec.t), LK_ERR_VALUE, "k_pe_cache", &s, "rope+write with a k_pe_cache");
#undef R
    }
    lk_set_isa(lk_isa_best());
    for (int i = 0; i < s.n; i++) tu_free(s.b[i]);
}

static void bad_write(void) {
    int64_t T = 4, Dl = 256, Dr = 8, E = entry_bytes(Dl, Dr), nb = 3, bs = 4;
    inputs w = make_inputs(0, LK_F32, LK_F32, T, Dl, Dr);
    fill_inputs(&w, T, 0);
    tu_buf kv200 = tu_alloc(LK_F32, 2, (int64_t[]){T, 200}, 0);
    tu_fill_uniform(&kv200, -1, 1);
    tu_buf sm = tu_alloc(LK_I64, 1, (int64_t[]){T}, 0);
    tu_set(&sm, 0, 0), tu_set(&sm, 1, 5), tu_set(&sm, 2, -1), tu_set(&sm, 3, 9);
    dscache c = ds_alloc(LK_F8E4M3, nb, bs, Dl, Dr, 0);
    fill_sentinel(&c);
    tu_buf wide = tu_alloc(LK_F8E4M3, 1, (int64_t[]){nb * bs * (E + 2) * 2 + 16}, 0); /* room for odd views */
    tu_buf c16 = tu_alloc(LK_F16, 3, (int64_t[]){nb, bs, E / 2}, 0), c32 = tu_alloc(LK_F32, 3, (int64_t[]){nb, bs, E / 4}, 0);
    tu_buf c52 = tu_alloc(LK_F8E5M2, 3, (int64_t[]){nb, bs, E}, 0), cbf = tu_alloc(LK_BF16, 3, (int64_t[]){nb, bs, E / 2}, 0);
    tu_buf cE = tu_alloc(LK_F8E4M3, 3, (int64_t[]){nb, bs, E + 2}, 0), c42 = tu_alloc(LK_F8E4M3, 4, (int64_t[]){nb, bs, 2, E / 2}, 0);
    tu_buf pec = tu_alloc(LK_F8E4M3, 3, (int64_t[]){nb, bs, 2 * Dr}, 0);
    tu_buf smd = tu_alloc(LK_I32, 1, (int64_t[]){T}, 0), smo = tu_alloc(LK_I32, 1, (int64_t[]){T}, 0);
    tu_set(&smd, 0, 3), tu_set(&smd, 1, 7), tu_set(&smd, 2, 3), tu_set(&smd, 3, -1);
    tu_set(&smo, 0, 3), tu_set(&smo, 1, nb * bs), tu_set(&smo, 2, 1), tu_set(&smo, 3, -1);
    bufset s = {{&w.kvb, &w.peb, &kv200, &sm, &c.b, &wide, &c16, &c32, &c52, &cbf, &cE, &c42}, 12};
    bufset s2 = {{&pec, &smd, &smo}, 3};
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    for (int ii = 0; ii < nisa; ii++) {
        lk_set_isa(isas[ii]);
        snap(&s), snap(&s2);
        lk_status st;
#define W(kv, cache, kpc, smp) lk_concat_and_cache_mla_fp8(kv, &w.pe, cache, kpc, smp, LK_KV_DS_MLA, NULL)
        st = W(&kv200.t, &c.b.t, NULL, &sm.t);
        expect_bad(st, LK_ERR_SHAPE, "kv_c", &s, "write Dl = 200 (not a multiple of 128)");
        st = W(&w.kv, &cE.t, NULL, &sm.t);
        expect_bad(st, LK_ERR_SHAPE, "kv_c_cache", &s, "write entry of E + 2 bytes");
        st = W(&w.kv, &c42.t, NULL, &sm.t);
        expect_bad(st, LK_ERR_SHAPE, "kv_c_cache", &s, "write 4-D cache with dim 2 = 2");
        const tu_buf *bad_dt[4] = {&c16, &c32, &cbf, &c52};
        for (int i = 0; i < 4; i++) {
            st = W(&w.kv, &bad_dt[i]->t, NULL, &sm.t);
            char what[80];
            snprintf(what, sizeof what, "write cache dtype %s", lk_dtype_name(bad_dt[i]->t.dtype));
            expect_bad(st, LK_ERR_DTYPE, "kv_c_cache", &s, what);
        }
        /* strides and alignment over `wide` */
        lk_tensor v = lk_tensor_make(wide.t.data, LK_F8E4M3, 3, (int64_t[]){nb, bs, E});
        lk_tensor odd1 = v, odd0 = v, oddp = v, ls2 = v;
        odd1.stride[1] = E + 1, odd1.stride[0] = bs * (E + 2);
        odd0.stride[0] = bs * E + 1;
        oddp.data = (char *)wide.t.data + 1;
        ls2.stride[2] = 2, ls2.stride[1] = 2 * E, ls2.stride[0] = 2 * E * bs;
        st = W(&w.kv, &odd1, NULL, &sm.t);
        expect_bad(st, LK_ERR_SHAPE, "kv_c_cache", &s, "write odd slot stride");
        st = W(&w.kv, &odd0, NULL, &sm.t);
        expect_bad(st, LK_ERR_SHAPE, "kv_c_cache", &s, "write odd block stride");
        st = W(&w.kv, &oddp, NULL, &sm.t);
        expect_bad(st, LK_ERR_SHAPE, "kv_c_cache", &s, "write odd data address");
        st = W(&w.kv, &ls2, NULL, &sm.t);
        expect_bad(st, LK_ERR_SHAPE, "kv_c_cache", &s, "write last-dim stride 2");
        st = W(&w.kv, &c.b.t, &pec.t, &sm.t);
        expect_bad(st, LK_ERR_VALUE, "k_pe_cache", &s, "write with a k_pe_cache");
        tu_check(intact(&s2), "bad [%s]: k_pe_cache untouched", lk_isa_name(isas[ii]));
        st = W(&w.kv, &c.b.t, NULL, &smo.t);
        expect_bad(st, LK_ERR_INDEX, "slot_mapping", &s, "write slot = num_blocks * block_size");
        st = W(&w.kv, &c.b.t, NULL, &smd.t);
        expect_bad(st, LK_ERR_INDEX, "slot_mapping", &s, "write duplicate slot");
        /* kv_c inside the cache */
        lk_tensor kvin = lk_tensor_make(c.b.t.data, LK_BF16, 2, (int64_t[]){T, Dl});
        st = W(&kvin, &c.b.t, NULL, &sm.t);
        expect_bad(st, LK_ERR_ALIAS, "kv_c", &s, "write kv_c overlapping the cache");
#undef W
        st = lk_concat_and_cache_mla(&w.kv, &w.pe, &c.b.t, NULL, &sm.t, LK_KV_DS_MLA);
        expect_bad(st, LK_ERR_VALUE, "layout", &s, "lk_concat_and_cache_mla (non-fp8) with LK_KV_DS_MLA");
        tu_check(intact(&s2), "bad [%s]: slot_mappings untouched", lk_isa_name(isas[ii]));
    }
    lk_set_isa(lk_isa_best());
    for (int i = 0; i < s.n; i++) tu_free(s.b[i]);
    for (int i = 0; i < s2.n; i++) tu_free(s2.b[i]);
}

static void bad_gather(void) {
    int64_t Dl = 256, Dr = 8, E = entry_bytes(Dl, Dr), nb = 3, bs = 4, C = Dl + Dr;
    dscache c = ds_alloc(LK_F8E4M3, nb, bs, Dl, Dr, 0);
    for (int64_t s = 0; s < nb * bs; s++) random_record(rec_at(&c, &c.b, s), Dl, Dr, 1);
    tu_buf bt = tu_alloc(LK_I32, 2, (int64_t[]){2, 3}, 0), sl = tu_alloc(LK_I32, 1, (int64_t[]){2}, 0);
    tu_buf ss = tu_alloc(LK_I32, 1, (int64_t[]){2}, 0), btx = tu_alloc(LK_I32, 2, (int64_t[]){2, 3}, 0);
    int32_t btv[6] = {2, 0, -1, 1, -1, -1}, btxv[6] = {2, 3, -1, 1, -1, -1};
    memcpy(bt.t.data, btv, sizeof btv), memcpy(btx.t.data, btxv, sizeof btxv);
    tu_set(&sl, 0, 6), tu_set(&sl, 1, 3), tu_set(&ss, 0, 0), tu_set(&ss, 1, 10); /* 10 + 3 > 12 */
    tu_buf o = tu_alloc(LK_BF16, 2, (int64_t[]){9, C}, 0), o1 = tu_alloc(LK_F32, 2, (int64_t[]){9, C + 1}, 0);
    tu_buf om = tu_alloc(LK_F32, 2, (int64_t[]){9, C - 1}, 0), o8 = tu_alloc(LK_F8E4M3, 2, (int64_t[]){9, C}, 0);
    tu_buf o3 = tu_alloc(LK_F32, 3, (int64_t[]){9, 1, C}, 0), orow = tu_alloc(LK_F32, 2, (int64_t[]){8, C}, 0);
    /* 16- / 32-bit caches of E elements (what a caller allocating E values of the wrong
     * dtype passes: out's dims fit E, the dtype is the fault) */
    tu_buf c16 = tu_alloc(LK_F16, 3, (int64_t[]){nb, bs, E}, 0), c32 = tu_alloc(LK_F32, 3, (int64_t[]){nb, bs, E}, 0);
    tu_buf wide = tu_alloc(LK_F8E4M3, 1, (int64_t[]){nb * bs * E + 16}, 0);
    bufset s = {{&c.b, &bt, &sl, &ss, &btx, &o, &o1, &om, &o8, &o3, &orow, &c16}, 12};
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    for (int ii = 0; ii < nisa; ii++) {
        lk_set_isa(isas[ii]);
        snap(&s);
        tu_snapshot(&wide);
        lk_status st;
#define G(out, cache, btp) lk_gather_cache_fp8(out, cache, btp, &sl.t, LK_KV_DS_MLA, NULL)
        st = lk_gather_cache(&o.t, &c.b.t, &bt.t, &sl.t, LK_KV_DS_MLA);
        expect_bad(st, LK_ERR_VALUE, "layout", &s, "lk_gather_cache (non-fp8) with LK_KV_DS_MLA");
        st = G(&o1.t, &c.b.t, &bt.t);
        expect_bad(st, LK_ERR_SHAPE, "out", &s, "gather out of Dl + Dr + 1 dims");
        st = G(&om.t, &c.b.t, &bt.t);
        expect_bad(st, LK_ERR_SHAPE, "out", &s, "gather out of Dl + Dr - 1 dims");
        st = G(&o8.t, &c.b.t, &bt.t);
        expect_bad(st, LK_ERR_DTYPE, "out", &s, "gather fp8 out");
        st = G(&o3.t, &c.b.t, &bt.t);
        tu_check(st != LK_OK && strstr(lk_last_error(), "out") && intact(&s), "bad [%s]: gather out [S, 1, C] -> %s: %s",
                 lk_isa_name(isas[ii]), lk_status_str(st), lk_last_error());
        st = G(&orow.t, &c.b.t, &bt.t);
        expect_bad(st, LK_ERR_SHAPE, "out", &s, "gather out rows != sum(seq_lens)");
        st = G(&o.t, &c16.t, &bt.t);
        expect_bad(st, LK_ERR_DTYPE, "cache", &s, "gather f16 cache");
        tu_snapshot(&c32);
        st = G(&o.t, &c32.t, &bt.t);
        expect_bad(st, LK_ERR_DTYPE, "cache", &s, "gather f32 cache");
        tu_check(tu_intact(&c32), "bad [%s]: f32 cache untouched", lk_isa_name(isas[ii]));
        lk_tensor oddp = lk_tensor_make((char *)wide.t.data + 1, LK_F8E4M3, 3, (int64_t[]){nb, bs, E});
        st = G(&o.t, &oddp, &bt.t);
        expect_bad(st, LK_ERR_SHAPE, "cache", &s, "gather odd cache address");
        lk_tensor odd1 = lk_tensor_make(wide.t.data, LK_F8E4M3, 3, (int64_t[]){nb, bs, E});
        odd1.stride[1] = E - 1; /* overlapping records, but the alignment rule comes first */
        st = G(&o.t, &odd1, &bt.t);
        expect_bad(st, LK_ERR_SHAPE, "cache", &s, "gather odd slot stride");
        st = G(&o.t, &c.b.t, &btx.t);
        expect_bad(st, LK_ERR_INDEX, "block_table", &s, "gather block id = num_blocks");
        st = lk_gather_cache_starts(&o.t, &c.b.t, &bt.t, &sl.t, &ss.t, LK_KV_DS_MLA, NULL);
        expect_bad(st, LK_ERR_INDEX, "seq_starts", &s, "gather seq_starts + seq_lens beyond the block table");
        tu_check(tu_intact(&wide), "bad [%s]: gather wrote no odd view", lk_isa_name(isas[ii]));
#undef G
    }
    lk_set_isa(lk_isa_best());
    for (int i = 0; i < s.n; i++) tu_free(s.b[i]);
    tu_free(&wide), tu_free(&c32);
}

static void bad_decode(void) {
    decase d = {256, 8, 4, 1, 2, 2, {5, 3}, 0, 0, LK_F32, LK_F32, LK_F8E4M3, 0, 0, 0, 0};
    dworld z;
    build_decode(&d, &z);
    int64_t E = z.c.E;
    tu_buf o = tu_alloc(LK_F32, 4, (int64_t[]){2, 1, 2, 256}, 0), l = tu_alloc(LK_F32, 3, (int64_t[]){2, 2, 1}, 0);
    tu_buf q9 = tu_alloc(LK_F32, 4, (int64_t[]){2, 1, 2, 256 + 9}, 0), q7 = tu_alloc(LK_F32, 4, (int64_t[]){2, 1, 2, 256 + 7}, 0);
    tu_buf o192 = tu_alloc(LK_F32, 4, (int64_t[]){2, 1, 2, 192}, 0), q192 = tu_alloc(LK_F32, 4, (int64_t[]){2, 1, 2, 192 + 8}, 0);
    tu_buf c32 = tu_alloc(LK_F32, 3, (int64_t[]){z.c.nb, 4, E / 4}, 0), pec = tu_alloc(LK_BF16, 3, (int64_t[]){z.c.nb, 4, 8}, 0);
    tu_buf wide = tu_alloc(LK_F8E4M3, 1, (int64_t[]){z.c.nb * 4 * (E + 2) + 16}, 0);
    tu_fill_uniform(&q9, -1, 1), tu_fill_uniform(&q7, -1, 1), tu_fill_uniform(&q192, -1, 1);
    bufset s = {{&z.c.b, &z.q, &z.bt, &z.sl, &o, &l, &q9, &q7, &o192, &q192, &c32, &pec}, 12};
    lk_mla_decode_params p = lk_mla_decode_params_default(z.scale);
    p.cache_layout = LK_KV_DS_MLA;
    lk_isa isas[TU_MAX_ISAS];
    int nisa = tu_isas(isas);
    for (int ii = 0; ii < nisa; ii++) {
        lk_set_isa(isas[ii]);
        snap(&s);
        tu_snapshot(&wide);
        lk_status st = lk_mla_decode(&o.t, &l.t, &z.q.t, &z.c.b.t, &pec.t, &z.bt.t, &z.sl.t, &p);
        expect_bad(st, LK_ERR_VALUE, "k_pe_cache", &s, "decode with a k_pe_cache");
        st = lk_mla_decode(&o.t, &l.t, &q9.t, &z.c.b.t, NULL, &z.bt.t, &z.sl.t, &p);
        expect_bad(st, LK_ERR_SHAPE, "kv_c_cache", &s, "decode q of Dl + Dr + 1 dims (entry size mismatch)");
        st = lk_mla_decode(&o.t, &l.t, &q7.t, &z.c.b.t, NULL, &z.bt.t, &z.sl.t, &p);
        expect_bad(st, LK_ERR_SHAPE, "kv_c_cache", &s, "decode q of Dl + Dr - 1 dims");
        st = lk_mla_decode(&o192.t, &l.t, &q192.t, &z.c.b.t, NULL, &z.bt.t, &z.sl.t, &p);
        expect_bad(st, LK_ERR_SHAPE, "kv_c_cache", &s, "decode out of Dl = 192 (not a multiple of 128)");
        st = lk_mla_decode(&o.t, &l.t, &z.q.t, &c32.t, NULL, &z.bt.t, &z.sl.t, &p);
        expect_bad(st, LK_ERR_DTYPE, "kv_c_cache", &s, "decode f32 record cache");
        lk_tensor odd1 = lk_tensor_make(wide.t.data, LK_F8E4M3, 3, (int64_t[]){z.c.nb, 4, E});
        odd1.stride[1] = E + 1, odd1.stride[0] = 4 * (E + 2);
        st = lk_mla_decode(&o.t, &l.t, &z.q.t, &odd1, NULL, &z.bt.t, &z.sl.t, &p);
        expect_bad(st, LK_ERR_SHAPE, "kv_c_cache", &s, "decode odd slot stride");
        lk_tensor oddp = lk_tensor_make((char *)wide.t.data + 1, LK_F8E4M3, 3, (int64_t[]){z.c.nb, 4, E});
        st = lk_mla_decode(&o.t, &l.t, &z.q.t, &oddp, NULL, &z.bt.t, &z.sl.t, &p);
        expect_bad(st, LK_ERR_SHAPE, "kv_c_cache", &s, "decode odd cache address");
        tu_check(tu_intact(&wide), "bad [%s]: decode wrote nothing into the odd views' buffer", lk_isa_name(isas[ii]));
    }
    lk_set_isa(lk_isa_best());
    for (int i = 4; i < s.n; i++) tu_free(s.b[i]);
    tu_free(&wide);
    free_decode(&z);
}

/* the other functions that take a layout reject LK_KV_DS_MLA with LK_ERR_VALUE */
static void bad_other_ops(void) {
    int64_t H = 1, D = 16, nb = 2, bs = 4;
    tu_buf k = tu_alloc(LK_BF16, 3, (int64_t[]){2, H, D}, 0), v = tu_alloc(LK_BF16, 3, (int64_t[]){2, H, D}, 0);
    tu_buf kc = tu_alloc(LK_F8E4M3, 4, (int64_t[]){nb, bs, H, D}, 0), vc = tu_alloc(LK_F8E4M3, 4, (int64_t[]){nb, bs, H, D}, 0);
    tu_buf sm = tu_alloc(LK_I64, 1, (int64_t[]){2}, 0);
    tu_fill_uniform(&k, -1, 1), tu_fill_uniform(&v, -1, 1);
    tu_set(&sm, 0, 1), tu_set(&sm, 1, 6);
    /* paged flash attention: q [2, 1, 16], k / v caches [2, 4, 1, 16] bf16 */
    tu_buf q = tu_alloc(LK_BF16, 3, (int64_t[]){2, H, D}, 0), out = tu_alloc(LK_BF16, 3, (int64_t[]){2, H, D}, 0);
    tu_buf kb = tu_alloc(LK_BF16, 4, (int64_t[]){nb, bs, H, D}, 0), vb = tu_alloc(LK_BF16, 4, (int64_t[]){nb, bs, H, D}, 0);
    tu_buf cu = tu_alloc(LK_I32, 1, (int64_t[]){2}, 0), su = tu_alloc(LK_I32, 1, (int64_t[]){1}, 0);
    tu_buf bt = tu_alloc(LK_I32, 2, (int64_t[]){1, 2}, 0);
    tu_fill_uniform(&q, -1, 1), tu_fill_uniform(&kb, -1, 1), tu_fill_uniform(&vb, -1, 1);
    tu_set(&cu, 0, 0), tu_set(&cu, 1, 2), tu_set(&su, 0, 5), tu_set(&bt, 0, 1), tu_set(&bt, 1, 0);
    /* mla_prefix_prefill: T = 2, H = 1, Dn = 16, Dr = 8, Dv = 16, Dl = 32 */
    tu_buf pq = tu_alloc(LK_F32, 3, (int64_t[]){2, 1, 24}, 0), pk = tu_alloc(LK_F32, 3, (int64_t[]){2, 1, 24}, 0);
    tu_buf pv = tu_alloc(LK_F32, 3, (int64_t[]){2, 1, 16}, 0), po = tu_alloc(LK_F32, 3, (int64_t[]){2, 1, 16}, 0);
    tu_buf pl = tu_alloc(LK_I32, 1, (int64_t[]){1}, 0), pcache = tu_alloc(LK_F32, 3, (int64_t[]){2, 4, 40}, 0);
    tu_buf wkv = tu_alloc(LK_F32, 2, (int64_t[]){32, 32}, 0);
    tu_fill_uniform(&pq, -1, 1), tu_fill_uniform(&pk, -1, 1), tu_fill_uniform(&pv, -1, 1), tu_fill_uniform(&wkv, -1, 1);
    tu_fill_uniform(&pcache, -1, 1);
    tu_set(&pl, 0, 3);
    bufset s = {{&k, &v, &kc, &vc, &sm, &q, &out, &kb, &vb, &pq, &po, &pcache}, 12};
    for (int ii = 0; ii < 1; ii++) {
        snap(&s);
        lk_status st = lk_reshape_and_cache_flash_fp8(&k.t, &v.t, &kc.t, &vc.t, &sm.t, NULL, NULL, LK_KV_DS_MLA);
        expect_bad(st, LK_ERR_VALUE, "layout", &s, "lk_reshape_and_cache_flash_fp8 with LK_KV_DS_MLA");
        st = lk_reshape_and_cache_flash_fp8(&k.t, &v.t, &kc.t, &vc.t, &sm.t, NULL, NULL, LK_KV_ND);
        tu_check(st == LK_OK, "lk_reshape_and_cache_flash_fp8 with the same arguments and LK_KV_ND succeeds (%s)",
                 lk_last_error());
        snap(&s);
        lk_attn_params ap = lk_attn_params_default(0.25f);
        ap.kv_layout = LK_KV_DS_MLA;
        st = lk_flash_attn_varlen(&out.t, NULL, &q.t, &kb.t, &vb.t, &cu.t, NULL, &su.t, &bt.t, &ap);
        expect_bad(st, LK_ERR_VALUE, "layout", &s, "lk_flash_attn_varlen paged with kv_layout LK_KV_DS_MLA");
        ap.kv_layout = LK_KV_ND;
        st = lk_flash_attn_varlen(&out.t, NULL, &q.t, &kb.t, &vb.t, &cu.t, NULL, &su.t, &bt.t, &ap);
        tu_check(st == LK_OK, "lk_flash_attn_varlen with the same arguments and LK_KV_ND succeeds (%s)", lk_last_error());
        snap(&s);
        lk_mla_params mp = lk_mla_params_default(0.2f);
        mp.cache_layout = LK_KV_DS_MLA;
        tu_set(&bt, 0, 1), tu_set(&bt, 1, -1);
        lk_tensor bt1 = bt.t;
        st = lk_mla_prefix_prefill(&po.t, &pq.t, &pk.t, &pv.t, &cu.t, &pl.t, &bt1, &pcache.t, NULL, &wkv.t, &mp);
        expect_bad(st, LK_ERR_VALUE, "layout", &s, "lk_mla_prefix_prefill with cache_layout LK_KV_DS_MLA");
        mp.cache_layout = LK_KV_ND;
        st = lk_mla_prefix_prefill(&po.t, &pq.t, &pk.t, &pv.t, &cu.t, &pl.t, &bt1, &pcache.t, NULL, &wkv.t, &mp);
        tu_check(st == LK_OK, "lk_mla_prefix_prefill with the same arguments and LK_KV_ND succeeds (%s)", lk_last_error());
    }
    for (int i = 0; i < s.n; i++) tu_free(s.b[i]);
    tu_free(&cu), tu_free(&su), tu_free(&bt), tu_free(&pk), tu_free(&pv), tu_free(&pl), tu_free(&wkv);
}

int main(void) {
    tu_init();
    test_write();
    test_write_empty();
    test_write_threads();
    test_write_rope_nan();
    test_gather();
    test_gather_threads();
    test_decode();
    tu_other_fma_form(test_decode); /* the avx512bf16 row's other path for bf16 q and out */
    test_rope();
    test_rope_bad();
    bad_write();
    bad_gather();
    bad_decode();
    bad_other_ops();
    return tu_finish("test_mla_ds");
}
