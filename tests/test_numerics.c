/*
 * The special-value rules of docs/numerics.md, checked on every ISA the CPU runs: NaN,
 * +-inf and -0 propagation per operator, the ISA-dependent corner (f32 vs wider
 * accumulation in rms_norm), conversions at the store (f16 overflow, NaN quieting), and
 * bit copies. Each case names the rule it checks; shapes are small but wide enough
 * (D = 40) for the SIMD paths' full vectors and tails.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#include "core/core.h"
#include "core/fp8.h"
#include "core/half.h"
#include "testutil.h"

#define D 40

static lk_isa isas[TU_MAX_ISAS];
static int ni;

static lk_tensor t1(void *p, lk_dtype dt, int64_t n) { return lk_tensor_make(p, dt, 1, (int64_t[]){n}); }
static lk_tensor t2(void *p, lk_dtype dt, int64_t a, int64_t b) { return lk_tensor_make(p, dt, 2, (int64_t[]){a, b}); }
static lk_tensor t3(void *p, lk_dtype dt, int64_t a, int64_t b, int64_t c) {
    return lk_tensor_make(p, dt, 3, (int64_t[]){a, b, c});
}
static int is_negzero(float v) { return v == 0.0f && signbit(v); }
static int is_poszero(float v) { return v == 0.0f && !signbit(v); }
static uint32_t bits32(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---------------------------------------------------------------- rms_norm */

static void rms_row(float *x, float *w, float eps, float *out) {
    lk_tensor tx = t2(x, LK_F32, 1, D), tw = t1(w, LK_F32, D), to = t2(out, LK_F32, 1, D);
    lk_rms_norm(&to, &tx, &tw, eps, 0);
}

static void test_rms_norm(void) {
    float x[D], w[D], out[D];
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        const char *isa = lk_isa_name(isas[ii]);
        for (int i = 0; i < D; i++) x[i] = (float)(i % 5) - 2.0f, w[i] = 1.0f;
        x[7] = NAN;
        rms_row(x, w, 1e-6f, out);
        int ok = 1;
        for (int i = 0; i < D; i++) ok &= isnan(out[i]);
        tu_check(ok, "%s rms_norm: a NaN in the row makes the whole row NaN", isa);

        x[7] = INFINITY;
        rms_row(x, w, 1e-6f, out);
        ok = isnan(out[7]);
        for (int i = 0; i < D; i++) if (i != 7) ok &= out[i] == 0.0f && signbit(out[i]) == signbit(x[i]);
        tu_check(ok, "%s rms_norm: an inf in the row: rsqrt(inf) = 0, finite elements give +-0, the inf gives NaN", isa);

        for (int i = 0; i < D; i++) x[i] = 0.0f;
        rms_row(x, w, 0.0f, out);
        ok = 1;
        for (int i = 0; i < D; i++) ok &= isnan(out[i]);
        rms_row(x, w, 1e-6f, out);
        for (int i = 0; i < D; i++) ok &= is_poszero(out[i]);
        tu_check(ok, "%s rms_norm: a zero row is NaN with eps = 0 (0 * inf), zeros with eps > 0", isa);

        for (int i = 0; i < D; i++) x[i] = (float)(i % 5) - 2.0f;
        x[0] = -0.0f, w[3] = NAN;
        rms_row(x, w, 1e-6f, out);
        ok = is_negzero(out[0]) && isnan(out[3]);
        for (int i = 1; i < D; i++) if (i != 3) ok &= isfinite(out[i]);
        tu_check(ok, "%s rms_norm: -0 keeps its sign; a NaN weight makes only its column NaN", isa);

        /* sum of squares beyond FLT_MAX, each square below it: ISA-dependent */
        for (int i = 0; i < D; i++) x[i] = 1.5e19f, w[i] = 1.0f;
        rms_row(x, w, 0.0f, out);
        int f32_acc = isas[ii] != LK_ISA_REF;
        ok = f32_acc ? out[0] == 0.0f : fabsf(out[0] - 1.0f) < 1e-5f;
        tu_check(ok, "%s rms_norm: |x| = 1.5e19 (sum of squares overflows f32): %s (got %g)", isa,
                 f32_acc ? "f32 accumulation gives 0" : "the reference's double sum gives 1", (double)out[0]);
    }
}

static void test_fused(void) {
    float x[D], r[D], w[D];
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        for (int i = 0; i < D; i++) x[i] = 1.0f, r[i] = 0.5f, w[i] = 1.0f;
        x[2] = INFINITY, r[2] = -INFINITY;
        lk_tensor tx = t2(x, LK_F32, 1, D), tr = t2(r, LK_F32, 1, D), tw = t1(w, LK_F32, D);
        lk_fused_add_rms_norm(&tx, &tr, &tw, 1e-6f, 0);
        int ok = isnan(r[2]) && r[3] == 1.5f;
        for (int i = 0; i < D; i++) ok &= isnan(x[i]);
        tu_check(ok, "%s fused_add_rms_norm: inf + -inf = NaN is stored in residual and makes the normed row NaN",
                 lk_isa_name(isas[ii]));
    }
}

/* ---------------------------------------------------------------- activations */

static void test_act(void) {
    lk_status (*ops[2])(const lk_tensor *, const lk_tensor *) = {lk_silu_and_mul, lk_gelu_tanh_and_mul};
    const char *names[2] = {"silu_and_mul", "gelu_tanh_and_mul"};
    float x[2 * D], out[D];
    for (int ii = 0; ii < ni; ii++)
        for (int k = 0; k < 2; k++) {
            lk_set_isa(isas[ii]);
            for (int i = 0; i < D; i++) x[i] = 0.5f, x[D + i] = 2.0f;
            x[0] = -INFINITY;                      /* act = -0, * 2 = -0 */
            x[1] = -INFINITY, x[D + 1] = INFINITY; /* -0 * inf = NaN */
            x[2] = INFINITY;                       /* inf * 2 = inf */
            x[3] = NAN;
            x[4] = -0.0f;                          /* act(-0) = -0 */
            x[5] = -100.0f;                        /* exp overflows: -0 */
            x[6] = 0.5f, x[D + 6] = NAN;           /* NaN up value */
            lk_tensor tx = t2(x, LK_F32, 1, 2 * D), to = t2(out, LK_F32, 1, D);
            ops[k](&to, &tx);
            int ok = is_negzero(out[0]) && isnan(out[1]) && out[2] == INFINITY && isnan(out[3]) &&
                     is_negzero(out[4]) && is_negzero(out[5]) && isnan(out[6]);
            tu_check(ok, "%s %s: act(-inf) = -0 (times 2: -0, times inf: NaN), act(inf) = inf, NaN propagates, "
                         "act(-0) = -0, exp overflow (g = -100) gives -0 (%g %g %g %g %g %g %g)",
                     lk_isa_name(isas[ii]), names[k], (double)out[0], (double)out[1], (double)out[2], (double)out[3],
                     (double)out[4], (double)out[5], (double)out[6]);
        }
}

/* the extra activations: the same limits (act(-inf) = -0, act(inf) = inf, NaN and -0
 * propagate, exp overflow gives -0); mul_and_silu's activation is on the second half,
 * fatrelu maps NaN (and everything <= threshold) to 0, swigluoai clamps +inf to limit */
static lk_status fatrelu0(const lk_tensor *o, const lk_tensor *x) { return lk_fatrelu_and_mul(o, x, 0.0f); }
static lk_status swiglu7(const lk_tensor *o, const lk_tensor *x) { return lk_swigluoai_and_mul(o, x, 1.702f, 7.0f); }
static void test_act_ext(void) {
    lk_status (*ops[5])(const lk_tensor *, const lk_tensor *) = {lk_gelu_and_mul, lk_gelu_new, lk_gelu_fast,
                                                                  lk_gelu_quick, lk_mul_and_silu};
    const char *names[5] = {"gelu_and_mul", "gelu_new", "gelu_fast", "gelu_quick", "mul_and_silu"};
    float x[2 * D], out[D];
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        for (int k = 0; k < 5; k++) {
            int gated = k == 0 || k == 4;
            float *g = k == 4 ? x + D : x; /* where the activation's inputs are */
            for (int i = 0; i < D; i++) x[i] = 2.0f, x[D + i] = 2.0f;
            g[0] = -INFINITY, g[1] = INFINITY, g[2] = NAN, g[3] = -0.0f, g[4] = -100.0f;
            lk_tensor tx = t2(x, LK_F32, 1, gated ? 2 * D : D), to = t2(out, LK_F32, 1, D);
            lk_status st = ops[k](&to, &tx);
            int ok = st == LK_OK && is_negzero(out[0]) && out[1] == INFINITY && isnan(out[2]) && is_negzero(out[3]) &&
                     is_negzero(out[4]);
            tu_check(ok, "%s %s: act(-inf) = -0, act(inf) = inf, NaN propagates, act(-0) = -0, act(-100) = -0 "
                         "(%g %g %g %g %g)",
                     lk_isa_name(isas[ii]), names[k], (double)out[0], (double)out[1], (double)out[2], (double)out[3],
                     (double)out[4]);
        }
        for (int i = 0; i < D; i++) x[i] = 2.0f, x[D + i] = 2.0f;
        x[0] = NAN, x[1] = -0.0f, x[2] = -INFINITY, x[3] = INFINITY;
        lk_tensor tx = t2(x, LK_F32, 1, 2 * D), to = t2(out, LK_F32, 1, D);
        fatrelu0(&to, &tx);
        tu_check(is_poszero(out[0]) && is_poszero(out[1]) && is_poszero(out[2]) && out[3] == INFINITY,
                 "%s fatrelu_and_mul: NaN, -0 and -inf gates give +0, +inf passes", lk_isa_name(isas[ii]));
        for (int i = 0; i < 2 * D; i++) x[i] = 1.0f;
        x[0] = INFINITY, x[2] = NAN, x[4] = -INFINITY, x[7] = INFINITY; /* pairs (g, u) interleaved */
        swiglu7(&to, &tx);
        float at7 = 2.0f * 7.0f / (1.0f + expf(-1.702f * 7.0f));
        tu_check(fabsf(out[0] - at7) <= 1e-5f * at7 && isnan(out[1]) && is_negzero(out[2]) &&
                     fabsf(out[3] - 8.0f / (1.0f + expf(-1.702f))) < 1e-5f,
                 "%s swigluoai_and_mul: gate +inf clamps to limit, NaN propagates, gate -inf gives -0, up +inf "
                 "clamps to limit (%g %g %g %g)",
                 lk_isa_name(isas[ii]), (double)out[0], (double)out[1], (double)out[2], (double)out[3]);
    }
}

/* swap_blocks / copy_blocks copy bits: NaN payloads, -0 and infinities unchanged */
static void test_block_bits(void) {
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        float src[2][D], dst[2][D];
        for (int i = 0; i < D; i++) src[0][i] = src[1][i] = 1.0f, dst[0][i] = dst[1][i] = 0.0f;
        src[1][0] = from_bits(0x7fc12345u), src[1][1] = from_bits(0xffa00001u), src[1][2] = -0.0f, src[1][3] = -INFINITY;
        int64_t map[2] = {1, 0};
        lk_tensor ts = t2(src, LK_F32, 2, D), td = t2(dst, LK_F32, 2, D), tm = t2(map, LK_I64, 1, 2);
        lk_status st = lk_swap_blocks(&ts, &td, &tm);
        int ok = st == LK_OK && !memcmp(dst[0], src[1], sizeof dst[0]);
        int64_t map2[2] = {0, 1};
        lk_tensor tm2 = t2(map2, LK_I64, 1, 2);
        st = lk_copy_blocks(1, &td, &tm2);
        ok &= st == LK_OK && !memcmp(dst[1], src[1], sizeof dst[1]);
        tu_check(ok, "%s swap_blocks / copy_blocks: bits copied (NaN payloads, signalling NaN, -0, -inf)",
                 lk_isa_name(isas[ii]));
    }
}

/* ---------------------------------------------------------------- rotary */

static void test_rotary(void) {
    float q[1][1][D], cs[1][D];
    int64_t pos[1] = {0};
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        for (int i = 0; i < D; i++) q[0][0][i] = 1.0f, cs[0][i] = i < D / 2 ? 1.0f : 0.0f; /* cos 1, sin 0 */
        q[0][0][0] = INFINITY;          /* pair (0, 20): x' = inf, y' = y + inf * 0 = NaN */
        q[0][0][1] = NAN;               /* pair (1, 21): both NaN */
        lk_tensor tq = t3(q, LK_F32, 1, 1, D), tc = t2(cs, LK_F32, 1, D), tp = t1(pos, LK_I64, 1);
        lk_rotary_embedding(&tp, &tq, NULL, &tc, 1);
        int ok = q[0][0][0] == INFINITY && isnan(q[0][0][20]) && isnan(q[0][0][1]) && isnan(q[0][0][21]) &&
                 q[0][0][2] == 1.0f && q[0][0][22] == 1.0f;
        tu_check(ok, "%s rotary: IEEE products: inf * cos 1 = inf, inf * sin 0 = NaN, NaN spreads to its pair",
                 lk_isa_name(isas[ii]));
    }
}

/* ---------------------------------------------------------------- caches: copies and conversions */

static void test_copies(void) {
    float k[1][1][4] = {{{0}}}, v[1][1][4] = {{{0}}};
    uint32_t src[4] = {0x7fa00001u /* signalling NaN, payload */, 0xff812345u /* -sNaN, payload */,
                       bits32(70000.0f), bits32(-0.0f)};
    memcpy(k, src, sizeof src), memcpy(v, src, sizeof src);
    int64_t slot[1] = {1};
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        float kc[1][2][1][4];
        uint16_t vh[1][2][1][4], vb[1][2][1][4];
        memset(kc, 0, sizeof kc), memset(vh, 0, sizeof vh), memset(vb, 0, sizeof vb);
        lk_tensor tk = t3(k, LK_F32, 1, 1, 4), tv = t3(v, LK_F32, 1, 1, 4), ts = t1(slot, LK_I64, 1);
        lk_tensor tkc = lk_tensor_make(kc, LK_F32, 4, (int64_t[]){1, 2, 1, 4});
        lk_tensor tvh = lk_tensor_make(vh, LK_F16, 4, (int64_t[]){1, 2, 1, 4});
        lk_tensor tvb = lk_tensor_make(vb, LK_BF16, 4, (int64_t[]){1, 2, 1, 4});
        lk_reshape_and_cache_flash(&tk, &tv, &tkc, &tvh, &ts);
        int same = !memcmp(kc[0][1][0], src, sizeof src);
        /* f16: NaN = sign | 0x7e00 | top mantissa bits; 70000 overflows to inf; -0 stays */
        int f16 = vh[0][1][0][0] == (0x7e00 | (0x200001u >> 13 & 0x3ff)) && vh[0][1][0][1] == (0x8000 | 0x7e00 | (0x012345u >> 13)) &&
                  vh[0][1][0][2] == 0x7c00 && vh[0][1][0][3] == 0x8000;
        lk_reshape_and_cache_flash(&tk, &tv, &tkc, &tvb, &ts);
        /* bf16: NaN = (bits >> 16) | 0x40 (quiet); 70000 rounds to nearest even */
        int bf16 = vb[0][1][0][0] == (0x7fa0 | 0x40) && vb[0][1][0][1] == 0xffc1 &&
                   vb[0][1][0][2] == (uint16_t)((bits32(70000.0f) + 0x7fff + ((bits32(70000.0f) >> 16) & 1)) >> 16) &&
                   vb[0][1][0][3] == 0x8000;
        tu_check(same && f16 && bf16,
                 "%s reshape_and_cache_flash: same dtype copies the bits (signalling NaN, payloads); f16 stores "
                 "quiet NaNs with their top payload bits and overflow as inf; bf16 quiets NaNs (%d %d %d, %04x %04x %04x)",
                 lk_isa_name(isas[ii]), same, f16, bf16, vh[0][1][0][0], vh[0][1][0][1], vb[0][1][0][0]);
        (void)from_bits;
    }
}

/* fp8 caches (docs/numerics.md, "fp8"): x / scale rounded to nearest even and saturated
 * (inf too), NaN kept with its sign, -0 kept, ties to even, values below half the
 * smallest subnormal to 0; e4m3 keys, e5m2 values */
static void test_fp8_cache(void) {
    float k[1][1][8] = {{{INFINITY, -INFINITY, NAN, -0.0f, 1e6f, 0.5f * 0.5f * 0.001953125f, 3.0f * 1.125f, -NAN}}};
    /* k_scale 0.5: x / 0.5 = 2x; 2 * 3.375 = 6.75 is the tie between 6.5 (0x4d) and 7 (0x4e): 7 */
    const uint8_t want_k[8] = {0x7e, 0xfe, 0x7f, 0x80, 0x7e, 0x00, 0x4e, 0xff};
    /* v_scale 2: x / 2; e5m2: inf -> 57344 (0x7b), NaN S.11111.11, 1e6 / 2 -> max, 2^-12 / 2 =
     * 2^-13 (normal: 0x08), 3.25 / 2 = 1.625 is the tie between 1.5 (0x3e, even) and 1.75 (0x3f) */
    float v[1][1][8] = {{{INFINITY, -INFINITY, NAN, -0.0f, 1e6f, 2.44140625e-4f, 3.25f, -NAN}}};
    const uint8_t want_v[8] = {0x7b, 0xfb, 0x7f, 0x80, 0x7b, 0x08, 0x3e, 0xff};
    int64_t slot[1] = {1};
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        uint8_t kc[1][2][1][8], vc[1][2][1][8];
        memset(kc, 0x11, sizeof kc), memset(vc, 0x11, sizeof vc);
        lk_tensor tk = t3(k, LK_F32, 1, 1, 8), tv = t3(v, LK_F32, 1, 1, 8), ts = t1(slot, LK_I64, 1);
        lk_tensor tkc = lk_tensor_make(kc, LK_F8E4M3, 4, (int64_t[]){1, 2, 1, 8});
        lk_tensor tvc = lk_tensor_make(vc, LK_F8E5M2, 4, (int64_t[]){1, 2, 1, 8});
        lk_status s = lk_reshape_and_cache_flash_scaled(&tk, &tv, &tkc, &tvc, &ts, 0.5f, 2.0f);
        int ok = s == LK_OK && !memcmp(kc[0][1][0], want_k, 8) && !memcmp(vc[0][1][0], want_v, 8) &&
                 kc[0][0][0][0] == 0x11 && vc[0][0][0][7] == 0x11;
        tu_check(ok, "%s reshape_and_cache_flash_scaled fp8: saturation (inf too), NaN and -0 kept, ties to even, "
                 "underflow to 0 (%s; k %02x %02x %02x %02x %02x %02x %02x %02x, v %02x %02x %02x %02x %02x %02x %02x %02x)",
                 lk_isa_name(isas[ii]), lk_status_str(s), kc[0][1][0][0], kc[0][1][0][1], kc[0][1][0][2], kc[0][1][0][3],
                 kc[0][1][0][4], kc[0][1][0][5], kc[0][1][0][6], kc[0][1][0][7], vc[0][1][0][0], vc[0][1][0][1],
                 vc[0][1][0][2], vc[0][1][0][3], vc[0][1][0][4], vc[0][1][0][5], vc[0][1][0][6], vc[0][1][0][7]);
    }
}

/* ---------------------------------------------------------------- fp8 cache operators (since 0.3)
 * docs/numerics.md "fp8": the rules of test_fp8_cache above through the other fp8 cache
 * paths, rows of D = 40 (full vectors and a tail on every ISA): per-head scale tensors
 * (ND and the 32-wide NZ tile), convert_fp8 both ways, gather_cache out of fp8 (f16
 * overflow of q * scale to inf, NaN / -0 kept), fp8 block copies (NaN codes as bytes) */
static void test_fp8_ops(void) {
    static const float SPK[8] = {INFINITY, -INFINITY, NAN, -0.0f, 1e6f, 0.5f * 0.5f * 0.001953125f, 3.0f * 1.125f, -NAN};
    static const uint8_t WK[8] = {0x7e, 0xfe, 0x7f, 0x80, 0x7e, 0x00, 0x4e, 0xff}; /* e4m3 of x / 0.5 */
    float x[2][D], ks[2] = {0.5f, 0.5f};
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < D; i++) x[h][i] = SPK[i % 8];
    int64_t slot[1] = {1};
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        /* per-head scales, ND [1, 2, 2, D] */
        uint8_t kc[2][2][D], vc[2][2][D];
        memset(kc, 0x11, sizeof kc), memset(vc, 0x11, sizeof vc);
        lk_tensor tx = t3(x, LK_F32, 1, 2, D), ts = t1(slot, LK_I64, 1), tks = t1(ks, LK_F32, 2);
        lk_tensor tkc = lk_tensor_make(kc, LK_F8E4M3, 4, (int64_t[]){1, 2, 2, D});
        lk_tensor tvc = lk_tensor_make(vc, LK_F8E4M3, 4, (int64_t[]){1, 2, 2, D});
        lk_status s = lk_reshape_and_cache_flash_fp8(&tx, &tx, &tkc, &tvc, &ts, &tks, &tks, LK_KV_ND);
        int ok = s == LK_OK && kc[0][0][0] == 0x11 && vc[0][1][D - 1] == 0x11;
        for (int h = 0; h < 2; h++)
            for (int i = 0; i < D; i++) ok &= kc[1][h][i] == WK[i % 8] && vc[1][h][i] == WK[i % 8];
        /* NZ [1, 2 * 16 / 32, 2, 32]: the same codes at c = h * 16 + d */
        uint8_t nz[1][1][2][32];
        memset(nz, 0x11, sizeof nz);
        lk_tensor tx16 = lk_tensor_make(x, LK_F32, 3, (int64_t[]){1, 2, 16});
        tx16.stride[1] = D;
        lk_tensor tnz = lk_tensor_make(nz, LK_F8E4M3, 4, (int64_t[]){1, 1, 2, 32});
        s = lk_reshape_and_cache_flash_fp8(&tx16, &tx16, &tnz, &tnz, &ts, &tks, &tks, LK_KV_NZ);
        ok &= s == LK_ERR_ALIAS; /* one buffer for k and v: rejected */
        uint8_t nzv[1][1][2][32];
        lk_tensor tnzv = lk_tensor_make(nzv, LK_F8E4M3, 4, (int64_t[]){1, 1, 2, 32});
        s = lk_reshape_and_cache_flash_fp8(&tx16, &tx16, &tnz, &tnzv, &ts, &tks, NULL, LK_KV_NZ);
        ok &= s == LK_OK && nz[0][0][0][0] == 0x11;
        for (int c = 0; c < 32; c++) ok &= nz[0][0][1][c] == WK[(c % 16) % 8];
        tu_check(ok, "%s reshape_and_cache_flash_fp8: per-head scales, ND and NZ (32-wide tile): saturation, NaN, -0, "
                 "ties to even, underflow (%s)", lk_isa_name(isas[ii]), lk_status_str(s));
        /* convert_fp8 both ways */
        uint8_t q[2][D];
        float back[2][D];
        lk_tensor tq = t2(q, LK_F8E4M3, 2, D), tb = t2(back, LK_F32, 2, D), tx2 = t2(x, LK_F32, 2, D);
        s = lk_convert_fp8(&tq, &tx2, 0.5f);
        ok = s == LK_OK;
        for (int i = 0; i < D; i++) ok &= q[0][i] == WK[i % 8] && q[1][i] == WK[i % 8];
        s = lk_convert_fp8(&tb, &tq, 0.5f);
        ok &= s == LK_OK && back[0][0] == 224.0f && back[0][1] == -224.0f && isnan(back[0][2]) && !signbit(back[0][2]) &&
              is_negzero(back[0][3]) && is_poszero(back[0][5]) && back[0][6] == 3.5f && isnan(back[1][7]) &&
              signbit(back[1][7]);
        tu_check(ok, "%s convert_fp8: e4m3 of x / scale as the cache write; back f32(q) * scale: NaN with its sign, -0, "
                 "+-max * scale (%s)", lk_isa_name(isas[ii]), lk_status_str(s));
        /* gather_cache out of e5m2 into f16: 57344 * 2 overflows to inf, NaN / inf codes, -0 */
        uint8_t gc[1][1][D];
        static const uint8_t GC[8] = {0x7b, 0xfb, 0x7f, 0x80, 0x7c, 0xfc, 0x3e, 0x01};
        for (int i = 0; i < D; i++) gc[0][0][i] = GC[i % 8];
        uint16_t go[1][D];
        float gsc = 2.0f;
        int32_t bt[1] = {0}, sl[1] = {1};
        lk_tensor tgc = lk_tensor_make(gc, LK_F8E5M2, 3, (int64_t[]){1, 1, D}), tgo = t2(go, LK_F16, 1, D);
        lk_tensor tbt = t2(bt, LK_I32, 1, 1), tsl = t1(sl, LK_I32, 1), tgs = t1(&gsc, LK_F32, 1);
        s = lk_gather_cache_fp8(&tgo, &tgc, &tbt, &tsl, LK_KV_ND, &tgs);
        ok = s == LK_OK;
        for (int i = 0; i < D; i += 8)
            ok &= go[0][i] == 0x7c00 && go[0][i + 1] == 0xfc00 && (go[0][i + 2] & 0x7fff) > 0x7c00 && go[0][i + 3] == 0x8000 &&
                  go[0][i + 4] == 0x7c00 && go[0][i + 5] == 0xfc00 && go[0][i + 6] == 0x4200 /* 1.5 * 2 */ &&
                  go[0][i + 7] == 0x0200 /* 2^-16 * 2 = 2^-15 = 2^9 f16 subnormal steps */;
        tu_check(ok, "%s gather_cache_fp8 e5m2 -> f16: q * scale beyond 65504 -> inf, inf and NaN codes kept, -0, "
                 "subnormal results (%s)", lk_isa_name(isas[ii]), lk_status_str(s));
        /* fp8 block copies: NaN codes and -0 as bytes */
        uint8_t bsrc[2][D], bdst[2][D];
        for (int i = 0; i < D; i++) bsrc[1][i] = (uint8_t)(0x7f + i * 0x80), bsrc[0][i] = 0, bdst[0][i] = bdst[1][i] = 0x11;
        int64_t map[2] = {1, 0};
        lk_tensor tbs = t2(bsrc, LK_F8E4M3, 2, D), tbd = t2(bdst, LK_F8E4M3, 2, D), tm = t2(map, LK_I64, 1, 2);
        s = lk_swap_blocks(&tbs, &tbd, &tm);
        tu_check(s == LK_OK && !memcmp(bdst[0], bsrc[1], D) && bdst[1][0] == 0x11,
                 "%s swap_blocks fp8: NaN codes and -0 copied as bytes (%s)", lk_isa_name(isas[ii]), lk_status_str(s));
    }
}

/* lk_concat_and_cache_mla_rope (docs/numerics.md, "Per operator"): rotary's IEEE rules on
 * q_pe and k_pe (NeoX pairs (i, i + 16), position 0: cos 1, sin 0), then the e4m3 write
 * of the stored k_pe (scale 0.5): inf * sin 0 = NaN in the pair's other element, NaN to
 * both, -0 * 1 + x * 0 = +0, saturation of +-inf, a tie to even; kv_c's codes as the
 * fp8 write's; the padding token (slot -1, position 1: cos 0, sin 1) rotated, its slot
 * untouched */
static void test_mla_rope(void) {
    enum { DR = 32, H2 = DR / 2 };
    static const float PX[5] = {INFINITY, NAN, 1e6f, 3.375f, -INFINITY}, PY[5] = {1.0f, 2.0f, -0.0f, 0.5f, 0.25f};
    static const int WX[5] = {0x7e, -1, 0x7e, 0x4e, 0xfe}, WY[5] = {-1, -1, 0x00, 0x38, -1}; /* -1: a NaN code */
    static const float SPK[8] = {INFINITY, -INFINITY, NAN, -0.0f, 1e6f, 0.5f * 0.5f * 0.001953125f, 3.0f * 1.125f, -NAN};
    static const uint8_t WK[8] = {0x7e, 0xfe, 0x7f, 0x80, 0x7e, 0x00, 0x4e, 0xff}; /* e4m3 of x / 0.5 */
    float cs[2][DR];
    for (int i = 0; i < H2; i++) cs[0][i] = 1.0f, cs[0][H2 + i] = 0.0f, cs[1][i] = 0.0f, cs[1][H2 + i] = 1.0f;
    int64_t pos[2] = {0, 1}, slot[2] = {1, -1};
    float sc = 0.5f;
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        float q[2][1][DR], k[2][DR], c[2][D];
        for (int i = 0; i < H2; i++) {
            q[0][0][i] = k[0][i] = PX[i % 5], q[0][0][H2 + i] = k[0][H2 + i] = PY[i % 5];
            q[1][0][i] = k[1][i] = 1.5f, q[1][0][H2 + i] = k[1][H2 + i] = 2.5f;
        }
        for (int i = 0; i < D; i++) c[0][i] = SPK[i % 8], c[1][i] = 7.0f;
        uint8_t cache[1][2][D + DR];
        memset(cache, 0x11, sizeof cache);
        lk_tensor tp = t1(pos, LK_I64, 2), tq = t3(q, LK_F32, 2, 1, DR), tk = t2(k, LK_F32, 2, DR);
        lk_tensor tc = t2(c, LK_F32, 2, D), tcs = t2(cs, LK_F32, 2, DR), tsl = t1(slot, LK_I64, 2);
        lk_tensor tca = t3(cache, LK_F8E4M3, 1, 2, D + DR), tsc = t1(&sc, LK_F32, 1);
        lk_status s = lk_concat_and_cache_mla_rope(&tp, &tq, &tk, &tc, &tcs, 1, &tca, NULL, &tsl, LK_KV_ND, &tsc);
        int ok = s == LK_OK;
        for (int i = 0; i < D + DR; i++) ok &= cache[0][0][i] == 0x11;
        for (int i = 0; i < D; i++) ok &= cache[0][1][i] == WK[i % 8];
        for (int i = 0; i < H2; i++) {
            uint8_t cx = cache[0][1][D + i], cy = cache[0][1][D + H2 + i];
            ok &= WX[i % 5] < 0 ? (cx & 0x7f) == 0x7f : cx == WX[i % 5];
            ok &= WY[i % 5] < 0 ? (cy & 0x7f) == 0x7f : cy == WY[i % 5];
            for (int w = 0; w < 2; w++) { /* q_pe and k_pe hold the rotated values */
                float x = w ? k[0][i] : q[0][0][i], y = w ? k[0][H2 + i] : q[0][0][H2 + i];
                float wx = PX[i % 5] - PY[i % 5] * 0.0f, wy = PY[i % 5] + PX[i % 5] * 0.0f;
                ok &= isnan(wx) ? isnan(x) : x == wx && signbit(x) == signbit(wx);
                ok &= isnan(wy) ? isnan(y) : y == wy && signbit(y) == signbit(wy);
                float px = w ? k[1][i] : q[1][0][i], py = w ? k[1][H2 + i] : q[1][0][H2 + i];
                ok &= px == -2.5f && py == 1.5f;
            }
        }
        tu_check(ok, "%s concat_and_cache_mla_rope: rotary's inf * 0 = NaN in the pair's other element, NaN to both, "
                 "+0 from -0 * 1 + x * 0, then e4m3 saturation, NaN codes and a tie to even; kv_c's codes; the "
                 "padding token rotated, its slot untouched (%s)", lk_isa_name(isas[ii]), lk_status_str(s));
    }
}

/* ---------------------------------------------------------------- fp8_ds_mla caches (since 0.3)
 * docs/numerics.md "fp8_ds_mla caches": the write (lk_concat_and_cache_mla_fp8,
 * LK_KV_DS_MLA) per tile of 128 latent dims s = max(absmax / 448, FLT_MIN) (NaN ignored),
 * codes e4m3(x / s), rope bf16(k_pe) (bit copy from bf16), every byte against the test's
 * own computation from the reference converters; the gather (lk_gather_cache_fp8 /
 * _starts) one rounding of f32(code) * s (rope: bf16 rounded once, a bit copy into bf16).
 * Tiles: scale 1 with the e4m3 saturation boundary, ties and subnormal codes; NaN
 * ignored by the absmax and coded with its sign; all-zero (s = FLT_MIN, codes +-0);
 * holding inf (s = inf, finite codes +-0, reads back NaN); huge (FLT_MAX: reads back
 * beyond f16 / bf16 range: inf at the store); tiny (absmax / 448 below FLT_MIN: s =
 * FLT_MIN); all NaN (s = FLT_MIN, NaN codes); holding -inf only. Inputs f32, f16, bf16
 * (each value as its dtype holds it); a padding token (slot -1) and the slot not written
 * keep their bytes. */
enum { DSL = 256, DSR = 40, DSE = DSL + DSL / 32 + 2 * DSR, DST = 5, DSBS = 5 };

/* the f32 value of a generated (not an input's) NaN may carry either sign: NaN-ness only */
static int ds_code_ok(uint8_t got, uint8_t want, int input_nan) {
    if ((want & 0x7f) == 0x7f) return (got & 0x7f) == 0x7f && (!input_nan || got == want);
    return got == want;
}

static int ds_same_value(float got, float want) {
    return isnan(want) ? isnan(got) : bits32(got) == bits32(want);
}

static void test_ds_mla_cache(void) {
    /* kv_c [DST, DSL] as f32 (token 2 is padding) */
    static float kv[DST][DSL], pe[DST][DSR];
    static const float PE_SP[12] = {NAN, -NAN, INFINITY, -INFINITY, -0.0f, FLT_MAX, 1.00390625f, 1.01171875f,
                                    3e38f, 1e-40f, -2.5f, 0.1f};
    tu_seed(61);
    for (int t = 0; t < DST; t++) {
        for (int d = 0; d < DSL; d++) kv[t][d] = (float)tu_uniform(-8, 8);
        for (int r = 0; r < DSR; r++) pe[t][r] = r < 12 ? PE_SP[(r + t) % 12] : (float)tu_uniform(-4, 4);
    }
    /* token 0, tile 0: absmax 448 (s = 1): saturation boundary, ties, subnormal codes */
    static const float T00[12] = {448.0f, -448.0f, 447.0f, 440.0f, 432.0f, 400.0f, 6.75f, 0.001953125f,
                                  0.0009765625f, 0.00146484375f, -0.0f, NAN};
    static const uint8_t W00[12] = {0x7e, 0xfe, 0x7e, 0x7e, 0x7e, 0x7c, 0x4e, 0x01, 0x00, 0x01, 0x80, 0x7f};
    for (int i = 0; i < 12; i++) kv[0][3 + 10 * i] = T00[i];
    kv[0][127] = -NAN;
    /* token 0, tile 1: NaN ignored by the absmax (3, at the max code) */
    for (int d = 128; d < 256; d++) kv[0][d] = (float)tu_uniform(-2, 2);
    kv[0][130] = NAN, kv[0][131] = -NAN, kv[0][200] = 3.0f, kv[0][201] = -3.0f, kv[0][255] = NAN;
    /* token 1: tile 0 all zero (+-0), tile 1 holding +inf, -inf and NaN */
    for (int d = 0; d < 128; d++) kv[1][d] = d % 3 ? 0.0f : -0.0f;
    kv[1][140] = INFINITY, kv[1][141] = -INFINITY, kv[1][142] = NAN;
    /* token 2: padding, all NaN */
    for (int d = 0; d < DSL; d++) kv[2][d] = NAN;
    /* token 3: tile 0 huge, tile 1 tiny (absmax / 448 below FLT_MIN) */
    kv[3][0] = FLT_MAX, kv[3][1] = -3e38f, kv[3][2] = 1e38f, kv[3][3] = -0.0f;
    for (int d = 128; d < 256; d++) kv[3][d] = (float)tu_uniform(-1e-38, 1e-38);
    kv[3][129] = 1e-38f, kv[3][130] = -5e-39f, kv[3][131] = 1e-45f;
    /* token 4: tile 0 all NaN (both signs), tile 1 holding -inf */
    for (int d = 0; d < 128; d++) kv[4][d] = d % 2 ? -NAN : NAN;
    kv[4][250] = -INFINITY;
    int64_t slot[DST] = {3, 0, -1, 1, 2};
    static const lk_dtype DTS[3] = {LK_F32, LK_F16, LK_BF16};
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        const char *isa = lk_isa_name(isas[ii]);
        for (int di = 0; di < 3; di++) {
            lk_dtype dt = DTS[di];
            /* the inputs in dt (bf16: a signalling NaN in k_pe, copied as bits) */
            static float xin[DST * DSL], pin[DST * DSR];
            static float xv[DST][DSL], pv[DST][DSR];
            for (int t = 0; t < DST; t++) {
                for (int d = 0; d < DSL; d++)
                    lk_store_f(xin, dt, t * DSL + d, kv[t][d]), xv[t][d] = lk_load_f(xin, dt, t * DSL + d);
                for (int r = 0; r < DSR; r++) lk_store_f(pin, dt, t * DSR + r, pe[t][r]);
            }
            if (dt == LK_BF16) ((uint16_t *)pin)[1 * DSR + 20] = 0x7f81;
            if (dt == LK_F32) ((uint32_t *)pin)[1 * DSR + 20] = 0x7f800001u;
            for (int t = 0; t < DST; t++)
                for (int r = 0; r < DSR; r++) pv[t][r] = lk_load_f(pin, dt, t * DSR + r);
            static _Alignas(16) uint8_t cache[1][DSBS][DSE];
            memset(cache, 0x11, sizeof cache);
            lk_tensor tx = t2(xin, dt, DST, DSL), tp = t2(pin, dt, DST, DSR), ts = t1(slot, LK_I64, DST);
            lk_tensor tc = t3(cache, LK_F8E4M3, 1, DSBS, DSE);
            lk_status s = lk_concat_and_cache_mla_fp8(&tx, &tp, &tc, NULL, &ts, LK_KV_DS_MLA, NULL);
            int ok = s == LK_OK, okc = ok, oks = ok, okr = ok, lit = ok;
            for (int t = 0; t < DST; t++) {
                if (slot[t] < 0) continue;
                const uint8_t *e = cache[0][slot[t]];
                for (int g = 0; g < DSL / 128; g++) {
                    float m = 0.0f;
                    for (int d = 128 * g; d < 128 * g + 128; d++)
                        if (fabsf(xv[t][d]) > m) m = fabsf(xv[t][d]);
                    float sc = fmaxf(m / 448.0f, FLT_MIN), got;
                    memcpy(&got, e + DSL + 4 * g, 4);
                    oks &= bits32(got) == bits32(sc);
                    for (int d = 128 * g; d < 128 * g + 128; d++)
                        okc &= ds_code_ok(e[d], lk_f32_to_f8e4m3(xv[t][d] / sc), isnan(xv[t][d]));
                }
                for (int r = 0; r < DSR; r++) {
                    uint16_t got, want = dt == LK_BF16 ? ((const uint16_t *)pin)[t * DSR + r] : lk_f32_to_bf16(pv[t][r]);
                    memcpy(&got, e + DSL + DSL / 32 + 2 * r, 2);
                    okr &= got == want;
                }
            }
            /* the literal codes of the scale-1 tile (f32 input: the values as written) */
            if (dt == LK_F32) {
                for (int i = 0; i < 12; i++) lit &= cache[0][3][3 + 10 * i] == W00[i];
                lit &= cache[0][3][127] == 0xff && cache[0][0][0] == 0x80 && cache[0][0][1] == 0x00;
                float s1, s01, s1i, s3t, s40, s41;
                memcpy(&s1, cache[0][3] + DSL, 4), memcpy(&s01, cache[0][0] + DSL, 4);
                memcpy(&s1i, cache[0][0] + DSL + 4, 4), memcpy(&s3t, cache[0][1] + DSL + 4, 4);
                memcpy(&s40, cache[0][2] + DSL, 4), memcpy(&s41, cache[0][2] + DSL + 4, 4);
                lit &= s1 == 1.0f && s01 == FLT_MIN && s1i == INFINITY && s3t == FLT_MIN && s40 == FLT_MIN && s41 == INFINITY;
                lit &= cache[0][2][0] == 0x7f && cache[0][2][1] == 0xff && (cache[0][2][250] & 0x7f) == 0x7f &&
                       (cache[0][2][200] & 0x7f) == 0;
                lit &= (cache[0][0][128] & 0x7f) == 0 && (cache[0][0][140] & 0x7f) == 0x7f && cache[0][0][142] == 0x7f;
                lit &= cache[0][1][0] == 0x7e; /* FLT_MAX at the max code */
            }
            int untouched = ok;
            for (int i = 0; i < DSE; i++) untouched &= cache[0][4][i] == 0x11;
            tu_check(okc && lit, "%s fp8_ds_mla write, %s kv_c: codes e4m3(x / s) bit for bit (saturation boundary, "
                     "ties to even, subnormal codes, NaN with its sign, -0, +-0 of an all-zero or inf tile) (%s)",
                     isa, lk_dtype_name(dt), lk_status_str(s));
            tu_check(oks && lit, "%s fp8_ds_mla write, %s kv_c: tile scales max(absmax / 448, FLT_MIN), NaN ignored, "
                     "inf for a tile holding inf, FLT_MIN for an all-zero or tiny tile", isa, lk_dtype_name(dt));
            tu_check(okr, "%s fp8_ds_mla write, %s k_pe: rope bf16 rounded once (NaN quiet, FLT_MAX -> inf, ties to "
                     "even, subnormals kept)%s", isa, lk_dtype_name(dt), dt == LK_BF16 ? ", bits copied (sNaN kept)" : "");
            tu_check(untouched, "%s fp8_ds_mla write, %s: the padding token and the slots not written keep their bytes",
                     isa, lk_dtype_name(dt));
            if (dt != LK_F32) continue;
            /* gather all 5 slots (slot 4: 0x11 bytes, finite codes and scale) into
             * each out dtype; then slots 1 .. 3 through seq_starts */
            int32_t bt[1] = {0}, sl[1] = {DSBS}, sl3[1] = {3}, st[1] = {1};
            lk_tensor tbt = t2(bt, LK_I32, 1, 1), tsl = t1(sl, LK_I32, 1), tsl3 = t1(sl3, LK_I32, 1), tst = t1(st, LK_I32, 1);
            for (int oi = 0; oi < 3; oi++) {
                lk_dtype ot = DTS[oi];
                static float out[DSBS * (DSL + DSR)], out2[3 * (DSL + DSR)];
                memset(out, 0x5a, sizeof out), memset(out2, 0x5a, sizeof out2);
                lk_tensor to = t2(out, ot, DSBS, DSL + DSR), to2 = t2(out2, ot, 3, DSL + DSR);
                s = lk_gather_cache_fp8(&to, &tc, &tbt, &tsl, LK_KV_DS_MLA, NULL);
                lk_status s2 = lk_gather_cache_starts(&to2, &tc, &tbt, &tsl3, &tst, LK_KV_DS_MLA, NULL);
                int okg = s == LK_OK, okb = okg, okst = s2 == LK_OK;
                for (int j = 0; j < DSBS; j++) {
                    const uint8_t *e = cache[0][j];
                    for (int d = 0; d < DSL + DSR; d++) {
                        float v, want;
                        if (d < DSL) {
                            float sc;
                            memcpy(&sc, e + DSL + 4 * (d / 128), 4);
                            v = lk_f8e4m3_to_f32(e[d]) * sc;
                        } else {
                            uint16_t h;
                            memcpy(&h, e + DSL + DSL / 32 + 2 * (d - DSL), 2);
                            v = lk_bf16_to_f32(h);
                            if (ot == LK_BF16) /* bit copy */
                                okb &= ((uint16_t *)out)[j * (DSL + DSR) + d] == h;
                        }
                        want = lk_round_to(ot, v);
                        okg &= ds_same_value(lk_load_f(out, ot, j * (DSL + DSR) + d), want);
                        if (j >= 1 && j <= 3) {
                            size_t es = lk_dtype_size(ot);
                            okst &= !memcmp((char *)out2 + ((j - 1) * (DSL + DSR) + d) * es, (char *)out + (j * (DSL + DSR) + d) * es, es);
                        }
                    }
                }
                /* the inf tile reads back NaN, the huge tile beyond f16 / bf16 range -> inf */
                okg &= isnan(lk_load_f(out, ot, 0 * (DSL + DSR) + 128)) && isnan(lk_load_f(out, ot, 0 * (DSL + DSR) + 200)) &&
                       isnan(lk_load_f(out, ot, 2 * (DSL + DSR) + 5)) && isnan(lk_load_f(out, ot, 2 * (DSL + DSR) + 130));
                okg &= ot == LK_F32 ? lk_load_f(out, ot, 1 * (DSL + DSR)) > 1e38f : lk_load_f(out, ot, 1 * (DSL + DSR)) == INFINITY;
                tu_check(okg && okb, "%s fp8_ds_mla gather -> %s: one rounding of f32(code) * s (NaN codes, an inf "
                         "tile's 0 * inf = NaN, overflow at the store -> inf), rope rounded once%s (%s)", isa,
                         lk_dtype_name(ot), ot == LK_BF16 ? " (bits copied)" : "", lk_status_str(s));
                tu_check(okst, "%s fp8_ds_mla gather_cache_starts -> %s: seq_starts 1 reads the same rows bit for bit (%s)",
                         isa, lk_dtype_name(ot), lk_status_str(s2));
            }
        }
    }
}

/* ---------------------------------------------------------------- fp8 activations */

/* the fp8 activation ops' special values (docs/numerics.md "fp8 activations"), per ISA */
static void test_fp8_act(void) {
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        const char *isa = lk_isa_name(isas[ii]);
        float x[2][D], one = 1.0f, sc = 0.25f, scs[2];
        uint8_t q[2][D];
        lk_tensor tx = t2(x, LK_F32, 2, D), tq = lk_tensor_make(q, LK_F8E4M3, 2, (int64_t[]){2, D});
        lk_tensor ts = t1(&sc, LK_F32, 1), tss = t1(scs, LK_F32, 2), t1s = t1(&one, LK_F32, 1);
        /* static quant: x / 0.25; 1.0 -> 4 (0x48); ties to even: 3.375 * 4 = 13.5 between 13 (0x55)
         * and 14 (0x56): 14; inf and 200 * 4 = 800 saturate to 448 (0x7e); NaN kept; -0 kept */
        for (int i = 0; i < D; i++) x[0][i] = x[1][i] = 1.0f;
        x[0][1] = 3.375f, x[0][2] = INFINITY, x[0][3] = -200.0f, x[0][4] = NAN, x[0][5] = -0.0f;
        lk_static_scaled_fp8_quant(&tq, &tx, &ts);
        int ok = q[0][0] == 0x48 && q[0][1] == 0x56 && q[0][2] == 0x7e && q[0][3] == 0xfe && q[0][4] == 0x7f &&
                 q[0][5] == 0x80 && q[1][D - 1] == 0x48;
        tu_check(ok, "%s static_scaled_fp8_quant: ties to even, +-inf and beyond-max saturate, NaN and -0 kept", isa);
        /* per token: NaN ignored by the absmax (row 0's scale from 200), inf makes it inf */
        x[0][2] = 2.0f;
        lk_dynamic_per_token_scaled_fp8_quant(&tq, &tx, &tss, NULL);
        ok = scs[0] == 200.0f / 448.0f && q[0][3] == 0xfe && q[0][4] == 0x7f && scs[1] == 1.0f / 448.0f &&
             q[1][0] == 0x7e;
        x[1][7] = INFINITY;
        lk_dynamic_per_token_scaled_fp8_quant(&tq, &tx, &tss, NULL);
        ok &= isinf(scs[1]) && q[1][0] == 0x00 && (q[1][7] & 0x7f) == 0x7f;
        tu_check(ok, "%s dynamic_per_token_scaled_fp8_quant: NaN ignored by the absmax, absmax at the max code, an inf "
                 "row gets scale inf (finite values 0, the inf NaN)", isa);
        /* rms_norm + quant: a NaN in the row makes the row NaN; an inf: inv = 0, the inf NaN,
         * the rest +-0 with their signs */
        for (int i = 0; i < D; i++) x[0][i] = x[1][i] = (float)(i % 5) - 2.0f;
        x[0][7] = NAN, x[1][7] = INFINITY;
        lk_rms_norm_static_fp8_quant(&tq, &tx, NULL, &t1s, 1e-6f);
        ok = 1;
        for (int i = 0; i < D; i++) {
            ok &= (q[0][i] & 0x7f) == 0x7f;
            if (i != 7) ok &= q[1][i] == (x[1][i] < 0 || (x[1][i] == 0 && signbit(x[1][i])) ? 0x80 : 0x00);
        }
        ok &= (q[1][7] & 0x7f) == 0x7f;
        tu_check(ok, "%s rms_norm_static_fp8_quant: a NaN makes the row NaN; an inf: inv 0, the inf NaN, others "
                 "signed zeros", isa);
        /* int8 out of the per-token form: a NaN row (every y NaN, absmax 0) and an inf row
         * (inv 0, the inf NaN) get scale FLT_EPSILON and all-zero codes; rows of +-1 give
         * +-127 (absmax / 127, then y * (1 / scale) rounds to 127) */
        int8_t q8[2][D];
        lk_tensor tq8 = lk_tensor_make(q8, LK_I8, 2, (int64_t[]){2, D});
        memset(q8, 0x55, sizeof q8);
        lk_rms_norm_dynamic_per_token_quant(&tq8, &tx, NULL, &tss, 1e-6f, NULL, NULL);
        ok = scs[0] == FLT_EPSILON && scs[1] == FLT_EPSILON;
        for (int i = 0; i < D; i++) ok &= q8[0][i] == 0 && q8[1][i] == 0;
        for (int i = 0; i < D; i++) x[0][i] = i % 2 ? -1.0f : 1.0f, x[1][i] = i % 3 ? 1.0f : -1.0f;
        lk_rms_norm_dynamic_per_token_quant(&tq8, &tx, NULL, &tss, 1e-6f, NULL, NULL);
        for (int i = 0; i < D; i++) ok &= q8[0][i] == (i % 2 ? -127 : 127) && q8[1][i] == (i % 3 ? 127 : -127);
        tu_check(ok, "%s rms_norm_dynamic_per_token_quant (i8 out): NaN / inf rows -> scale FLT_EPSILON, codes 0; "
                 "+-1 rows -> +-127", isa);
        /* merge with an fp8 out: NaN LSE -> NaN codes, all empty -> zeros, scale applied */
        enum { H = 3 };
        float a[1][H][D], b[1][H][D], la[1][H] = {{NAN, -INFINITY, 0.0f}}, lb[1][H] = {{0.0f, INFINITY, 0.0f}};
        uint8_t mo[1][H][D];
        for (int h = 0; h < H; h++)
            for (int i = 0; i < D; i++) a[0][h][i] = 1.0f, b[0][h][i] = 3.0f;
        lk_tensor ta = t3(a, LK_F32, 1, H, D), tb = t3(b, LK_F32, 1, H, D), tla = t2(la, LK_F32, 1, H),
                  tlb = t2(lb, LK_F32, 1, H), tmo = lk_tensor_make(mo, LK_F8E5M2, 3, (int64_t[]){1, H, D});
        lk_merge_attn_states_scaled(&tmo, NULL, &ta, &tla, &tb, &tlb, &ts);
        ok = 1;
        for (int i = 0; i < D; i++) ok &= (mo[0][0][i] & 0x7c) == 0x7c && (mo[0][0][i] & 3) && mo[0][1][i] == 0 &&
                                          mo[0][2][i] == 0x48; /* 2 / 0.25 = 8 = 0x48 in e5m2 */
        tu_check(ok, "%s merge_attn_states_scaled (e5m2 out): NaN LSE -> NaN, all empty -> 0, merged / scale", isa);
    }
}

/* lk_per_token_group_fp8_quant's special values (docs/numerics.md "Per-token-group
 * scales"), per ISA, f32 and bf16 inputs: 2 rows of D = 40 in groups of 20 (full vectors
 * and tails on every ISA) */
static void test_fp8_group(void) {
    enum { G = D / 2 };
    static const lk_dtype XT[2] = {LK_F32, LK_BF16};
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        const char *isa = lk_isa_name(isas[ii]);
        for (int xi = 0; xi < 2; xi++)
            for (int oi = 0; oi < 2; oi++) {
                lk_dtype xt = XT[xi], ot = oi ? LK_F8E5M2 : LK_F8E4M3;
                const char *xn = lk_dtype_name(xt), *on = lk_dtype_name(ot);
                float fm = oi ? 57344.0f : 448.0f, v[2][D], sc[2][2], xb[2 * D]; /* xb: [2, D] of dtype xt */
                uint8_t q[2][D], mx = oi ? 0x7b : 0x7e;
                /* group (0, 0): -2 .. 2, NaN, -NaN, 200: scale 200 / fp8_max, 200 at the max code;
                 * group (0, 1): an inf: scale inf, finite -> signed 0, the inf -> NaN;
                 * group (1, 0): +-0: scale eps / fp8_max, codes +-0; group (1, 1): all NaN */
                for (int i = 0; i < D; i++) v[0][i] = (float)(i % 5) - 2.0f, v[1][i] = i % 2 ? -0.0f : 0.0f;
                v[0][3] = NAN, v[0][4] = -NAN, v[0][5] = 200.0f, v[0][G + 7] = INFINITY;
                for (int i = G; i < D; i++) v[1][i] = NAN;
                for (int r = 0; r < 2; r++)
                    for (int i = 0; i < D; i++) lk_store_f(xb, xt, r * D + i, v[r][i]);
                lk_tensor tx = t2(xb, xt, 2, D), tq = lk_tensor_make(q, ot, 2, (int64_t[]){2, D});
                lk_tensor ts = t2(sc, LK_F32, 2, 2);
                lk_status s = lk_per_token_group_fp8_quant(&tq, &tx, &ts, G, 1e-10f, 0);
                int ok = s == LK_OK && sc[0][0] == 200.0f / fm && q[0][3] == 0x7f && q[0][4] == 0xff && q[0][5] == mx;
                tu_check(ok, "%s per_token_group_fp8_quant %s -> %s: NaN ignored by the absmax and kept (with its "
                         "sign), the absmax at the max code (%s)", isa, xn, on, lk_status_str(s));
                ok = isinf(sc[0][1]) && sc[0][1] > 0 && (q[0][G + 7] & 0x7f) == 0x7f;
                for (int i = G; i < D; i++)
                    if (i != G + 7) ok &= q[0][i] == (signbit(v[0][i]) ? 0x80 : 0x00);
                tu_check(ok, "%s per_token_group_fp8_quant %s -> %s: an inf makes its group's scale inf (finite "
                         "values signed zeros, the inf NaN)", isa, xn, on);
                ok = sc[1][0] == 1e-10f / fm && sc[1][1] == 1e-10f / fm;
                for (int i = 0; i < G; i++) ok &= q[1][i] == (i % 2 ? 0x80 : 0x00) && (q[1][G + i] & 0x7f) == 0x7f;
                tu_check(ok, "%s per_token_group_fp8_quant %s -> %s: an all-zero group and an all-NaN group get eps / "
                         "fp8_max (codes +-0, NaN)", isa, xn, on);
                /* UE8M0: 200 / 448 -> 0.5 (200 / 0.5 = 400, a tie between 384 and 416: 384, 0x7c);
                 * 200 / 57344 -> 2^-8 (51200 -> 49152, 0x7a); inf stays; eps / fp8_max < 1e-10 -> 2^-33 */
                s = lk_per_token_group_fp8_quant(&tq, &tx, &ts, G, 1e-10f, 1);
                ok = s == LK_OK && sc[0][0] == (oi ? 0x1p-8f : 0.5f) && q[0][5] == (oi ? 0x7a : 0x7c) &&
                     q[0][3] == 0x7f && isinf(sc[0][1]) && sc[1][0] == 0x1p-33f && sc[1][1] == 0x1p-33f;
                for (int i = 0; i < G; i++) ok &= q[1][i] == (i % 2 ? 0x80 : 0x00);
                tu_check(ok, "%s per_token_group_fp8_quant %s -> %s, ue8m0: scales rounded up to a power of two, "
                         "inf kept, a tiny scale clamped to 1e-10 then 2^-33 (%s)", isa, xn, on, lk_status_str(s));
                /* a power-of-two scale stays (absmax 14 = 448 2^-5, or 57344 2^-12); eps dominating:
                 * eps 1 -> scale 1 / fp8_max, the group's codes x * fp8_max */
                for (int i = 0; i < D; i++)
                    lk_store_f(xb, xt, i, (float)(i % 3) * 0.125f), lk_store_f(xb, xt, D + i, 0.0f);
                lk_store_f(xb, xt, 1, fm / 32.0f);
                s = lk_per_token_group_fp8_quant(&tq, &tx, &ts, G, 1.0f, 1);
                ok = s == LK_OK && sc[0][0] == 1.0f / 32.0f && q[0][1] == mx && sc[0][1] == ldexpf(1.0f, oi ? -15 : -8);
                s = lk_per_token_group_fp8_quant(&tq, &tx, &ts, G, 1.0f, 0);
                ok &= s == LK_OK && sc[0][1] == 1.0f / fm && sc[1][0] == 1.0f / fm;
                tu_check(ok, "%s per_token_group_fp8_quant %s -> %s: a power-of-two scale kept by ue8m0, a large eps "
                         "dominates (scale eps / fp8_max, rounded up to 2^-8 / 2^-15 by ue8m0)", isa, xn, on);
            }
    }
}

/* lk_rms_norm_per_block_quant's special values (docs/numerics.md "fp8 activations", the
 * per-token norm's rules per block; the int8 out's), per ISA, f32 and bf16 inputs, e4m3 /
 * e5m2 / i8 outs: rows of D = 40 in 2 blocks of 20 (full vectors and tails on every ISA) */
static void test_fp8_norm_block(void) {
    enum { G = D / 2, R = 3 };
    static const lk_dtype XT[2] = {LK_F32, LK_BF16}, OT[3] = {LK_F8E4M3, LK_F8E5M2, LK_I8};
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        const char *isa = lk_isa_name(isas[ii]);
        for (int xi = 0; xi < 2; xi++)
            for (int oi = 0; oi < 3; oi++) {
                lk_dtype xt = XT[xi], ot = OT[oi];
                const char *xn = lk_dtype_name(xt), *on = lk_dtype_name(ot);
                int i8 = ot == LK_I8;
                float fm = oi == 0 ? 448.0f : oi == 1 ? 57344.0f : 127.0f;
                float lo = i8 ? FLT_EPSILON : 1.0f / (fm * 512.0f), v[R][D], sc[R][2], xb[R * D], w[D], ubv = 0.5f;
                uint8_t q[R][D], mx = oi == 0 ? 0x7e : oi == 1 ? 0x7b : 127, nq = i8 ? 0x81 : mx | 0x80; /* i8 -127 */
#define NANQ(c) (i8 ? (c) == 0 : oi == 0 ? ((c) & 0x7f) == 0x7f : ((c) & 0x7c) == 0x7c && ((c) & 3))
                /* row 0: -2 .. 2 and a NaN in block 0: the row NaN (NaN codes, i8 0), both blocks'
                 * absmax 0 (NaN ignored): min_scale; row 1: an inf in block 1: inv = 0, finite
                 * values +-0, the inf NaN, both scales min_scale; row 2: block 0 +-1 (scale
                 * inv / fp8_max, codes +-max), block 1 +-0 (scale min_scale, codes +-0) */
                for (int i = 0; i < D; i++) {
                    v[0][i] = v[1][i] = (float)(i % 5) - 2.0f;
                    v[2][i] = i < G ? (i % 2 ? -1.0f : 1.0f) : (i % 2 ? -0.0f : 0.0f);
                }
                v[0][3] = NAN, v[1][G + 7] = INFINITY;
                for (int r = 0; r < R; r++)
                    for (int i = 0; i < D; i++) lk_store_f(xb, xt, r * D + i, v[r][i]);
                lk_tensor tx = t2(xb, xt, R, D), tq = lk_tensor_make(q, ot, 2, (int64_t[]){R, D});
                lk_tensor ts = t2(sc, LK_F32, R, 2), tw = t1(w, LK_F32, D), tub = t1(&ubv, LK_F32, 1);
                memset(q, 0x55, sizeof q);
                lk_status s = lk_rms_norm_per_block_quant(&tq, &tx, NULL, &ts, 1e-6f, NULL, NULL, G);
                int ok = s == LK_OK && sc[0][0] == lo && sc[0][1] == lo;
                for (int i = 0; i < D; i++) ok &= NANQ(q[0][i]);
                tu_check(ok, "%s rms_norm_per_block_quant %s -> %s: a NaN in one block makes the row NaN (%s), every "
                         "block's scale min_scale (%s)", isa, xn, on, i8 ? "codes 0" : "NaN codes", lk_status_str(s));
                ok = sc[1][0] == lo && sc[1][1] == lo && NANQ(q[1][G + 7]);
                for (int i = 0; i < D; i++)
                    if (i != G + 7) ok &= q[1][i] == (v[1][i] < 0 && !i8 ? 0x80 : 0x00);
                tu_check(ok, "%s rms_norm_per_block_quant %s -> %s: an inf in one block: inv 0, every block's scale "
                         "min_scale, finite values %s, the inf %s", isa, xn, on, i8 ? "0" : "signed zeros",
                         i8 ? "0" : "NaN");
                float inv = 1.0f / sqrtf(20.0f / 40.0f + 1e-6f); /* lk_q_inv_rms: ss 20 exact */
                ok = sc[2][0] == inv / fm && sc[2][1] == lo;
                for (int i = 0; i < G; i++)
                    ok &= q[2][i] == (i % 2 ? nq : mx) && q[2][G + i] == (i % 2 && !i8 ? 0x80 : 0x00);
                tu_check(ok, "%s rms_norm_per_block_quant %s -> %s: per block: +-1 block scale absmax / fp8_max, "
                         "codes +-max; an all-zero block min_scale, codes +-0", isa, xn, on);
                /* weights with a NaN (block 0) and an inf (block 1) over a row of +-1: y NaN there
                 * (ignored by block 0's absmax: scale inv / fp8_max, +-max codes, NaN code / i8 0);
                 * y +-inf in block 1: scale inf, finite values +-0, the inf NaN (i8: 0); with
                 * scale_ub 0.5 both blocks' scale 0.5 / fp8_max, y / scale beyond the max:
                 * +-max (i8 127 / -128), the inf too */
                for (int i = 0; i < D; i++) lk_store_f(xb, xt, i, i % 2 ? -1.0f : 1.0f), w[i] = 1.0f;
                w[5] = NAN, w[G + 2] = INFINITY;
                lk_tensor tx1 = t2(xb, xt, 1, D), tq1 = lk_tensor_make(q, ot, 2, (int64_t[]){1, D});
                lk_tensor ts1 = t2(sc, LK_F32, 1, 2);
                inv = 1.0f / sqrtf(40.0f / 40.0f + 1e-6f);
                s = lk_rms_norm_per_block_quant(&tq1, &tx1, &tw, &ts1, 1e-6f, NULL, NULL, G);
                ok = s == LK_OK && sc[0][0] == inv / fm && isinf(sc[0][1]) && sc[0][1] > 0 && NANQ(q[0][5]) &&
                     NANQ(q[0][G + 2]);
                for (int i = 0; i < G; i++) {
                    if (i != 5) ok &= q[0][i] == (i % 2 ? nq : mx);
                    if (i != 2) ok &= q[0][G + i] == (i % 2 && !i8 ? 0x80 : 0x00);
                }
                tu_check(ok, "%s rms_norm_per_block_quant %s -> %s: a NaN weight ignored by its block's absmax (%s "
                         "there), an inf weight makes its block's scale inf (finite values %s, the inf %s) (%s)", isa,
                         xn, on, i8 ? "code 0" : "NaN", i8 ? "0" : "signed zeros", i8 ? "0" : "NaN",
                         lk_status_str(s));
                s = lk_rms_norm_per_block_quant(&tq1, &tx1, &tw, &ts1, 1e-6f, &tub, NULL, G);
                ok = s == LK_OK && sc[0][0] == 0.5f / fm && sc[0][1] == 0.5f / fm && NANQ(q[0][5]);
                for (int i = 0; i < D; i++) /* i8: y * (1 / scale) = +-254: 127 / -128 */
                    if (i != 5) ok &= q[0][i] == (i % 2 ? (i8 ? 0x80 : nq) : mx);
                tu_check(ok, "%s rms_norm_per_block_quant %s -> %s, scale_ub 0.5: every block's scale 0.5 / fp8_max, "
                         "beyond-max values and the inf saturate to +-max%s", isa, xn, on, i8 ? " (127 / -128)" : "");
#undef NANQ
            }
    }
}

/* lk_silu_and_mul_quant and lk_silu_and_mul_per_block_quant's special values
 * (docs/numerics.md "SiLU-and-mul + quant"), per ISA, f32 and bf16 inputs, e4m3 / e5m2 /
 * i8 outs, rows of D = 40 in 2 blocks of 20. Gates whose silu is exact by the documented
 * limits (100, 88: beyond the 87.3 clamp the denominator is exactly 1, silu = g; -inf,
 * -100, -89: -0; -0: -0; NaN: NaN; +inf: +inf), so y is known exactly and every code is the
 * scalar converter's fp8(y / s) (i8: nearest even, saturated, NaN -> 0) with s the f32
 * formula max(min(absmax / qmax, scale_ub), min_scale) of the exact absmax (NaN ignored). */
static float aq_y(float g, float u) {
    if (isnan(g)) return g;
    float silu = g == 100.0f || g == 88.0f || g == INFINITY ? g : -0.0f; /* -inf, -100, -89, -0 */
    return silu * u;
}

static uint8_t aq_code(lk_dtype ot, float y, float s) {
    float t = y / s;
    if (ot == LK_I8) return (uint8_t)(int8_t)(t != t ? 0 : t >= 127.0f ? 127 : t <= -128.0f ? -128 : (int)rintf(t));
    return ot == LK_F8E4M3 ? lk_f32_to_f8e4m3(t) : lk_f32_to_f8e5m2(t);
}

static int aq_nan_code(lk_dtype ot, uint8_t c) {
    return ot == LK_I8 ? c == 0 : ot == LK_F8E4M3 ? (c & 0x7f) == 0x7f : (c & 0x7c) == 0x7c && (c & 3);
}

/* block b of one row (G = D / 2 columns): codes against fp8(y / s) / i8(y / s), NaN-ness
 * only where y / s is NaN (the sign of a computed NaN is unspecified) */
static int aq_codes_ok(const uint8_t *q, const float *y, int b, float s, lk_dtype ot) {
    int ok = 1;
    for (int i = b * D / 2; i < (b + 1) * D / 2; i++)
        ok &= isnan(y[i] / s) ? aq_nan_code(ot, q[i]) : q[i] == aq_code(ot, y[i], s);
    return ok;
}

static void test_act_quant(void) {
    enum { G = D / 2, R = 2 };
    static const lk_dtype XT[2] = {LK_F32, LK_BF16}, OT[3] = {LK_F8E4M3, LK_F8E5M2, LK_I8};
    /* row 0: gates 100, ups +-0.25 / +-0.75 (y +-25, +-75); block 0 an up 4 (y 400: the
     * absmax, at the max code), a NaN gate and a NaN up (ignored by the absmax), gate 88 (y
     * 88), gates -inf / -100 / -89 / -0 (y +-0 by the up's sign); block 1 gates +inf with
     * ups 1 and -1 (y +-inf: scale inf, or scale_ub), -inf with up +inf and +inf with up 0
     * (NaN). Row 1: block 0 every gate NaN; block 1 gates -inf / -100 / -89 with ups +-2 and
     * 0 (every y +-0): both blocks' absmax 0, scale min_scale. */
    float g[R][D], u[R][D];
    for (int i = 0; i < D; i++) {
        g[0][i] = 100.0f, u[0][i] = ((float)(i % 4) - 1.5f) * 0.5f;
        g[1][i] = i < G ? NAN : i % 3 == 0 ? -INFINITY : i % 3 == 1 ? -100.0f : -89.0f;
        u[1][i] = i % 5 == 0 ? 0.0f : i % 2 ? -2.0f : 2.0f;
    }
    u[0][3] = 4.0f, g[0][5] = NAN, u[0][6] = NAN, g[0][7] = 88.0f, u[0][7] = 1.0f;
    g[0][8] = -INFINITY, u[0][8] = 2.0f, g[0][9] = -100.0f, u[0][9] = -1.0f, g[0][10] = -89.0f, u[0][10] = 1.0f;
    g[0][11] = -0.0f, u[0][11] = 3.0f;
    g[0][G + 2] = INFINITY, u[0][G + 2] = 1.0f, g[0][G + 5] = INFINITY, u[0][G + 5] = -1.0f;
    g[0][G + 7] = -INFINITY, u[0][G + 7] = INFINITY, g[0][G + 9] = INFINITY, u[0][G + 9] = 0.0f;
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        const char *isa = lk_isa_name(isas[ii]);
        for (int xi = 0; xi < 2; xi++)
            for (int oi = 0; oi < 3; oi++) {
                lk_dtype xt = XT[xi], ot = OT[oi];
                const char *xn = lk_dtype_name(xt), *on = lk_dtype_name(ot);
                int i8 = ot == LK_I8;
                float qm = oi == 0 ? 448.0f : oi == 1 ? 57344.0f : 127.0f, lo = i8 ? FLT_EPSILON : 1.0f / (qm * 512.0f);
                float xb[R * 2 * D], sc[R][2], y[R][D];
                uint8_t q[R][D], mx = oi == 0 ? 0x7e : oi == 1 ? 0x7b : 127;
                for (int r = 0; r < R; r++)
                    for (int i = 0; i < D; i++) {
                        lk_store_f(xb, xt, r * 2 * D + i, g[r][i]), lk_store_f(xb, xt, r * 2 * D + D + i, u[r][i]);
                        y[r][i] = aq_y(g[r][i], u[r][i]);
                    }
#define NANQ(c) aq_nan_code(ot, c)
                lk_tensor tx = t2(xb, xt, R, 2 * D), tq = lk_tensor_make(q, ot, 2, (int64_t[]){R, D});
                lk_tensor ts = t2(sc, LK_F32, R, 2);
#define CODES_OK(r, b, s) aq_codes_ok(q[r], y[r], b, s, ot)
                /* the static op (fp8 outs): scale 0.5 */
                if (!i8) {
                    float s = 0.5f;
                    lk_tensor one = t1(&s, LK_F32, 1);
                    memset(q, 0x55, sizeof q);
                    lk_status st = lk_silu_and_mul_quant(&tq, &tx, &one);
                    int ok = st == LK_OK && CODES_OK(0, 0, s) && CODES_OK(0, 1, s) && CODES_OK(1, 0, s) &&
                             CODES_OK(1, 1, s) && q[0][G + 2] == mx && q[0][G + 5] == (0x80 | mx) &&
                             (oi || q[0][3] == mx) && q[0][8] == 0x80 && q[0][9] == 0x00 && q[0][10] == 0x80 && q[0][11] == 0x80 &&
                             NANQ(q[0][5]) && NANQ(q[0][6]) && NANQ(q[0][G + 7]) && NANQ(q[0][G + 9]);
                    tu_check(ok, "%s silu_and_mul_quant %s -> %s: NaN gate / up -> NaN code, silu(+-inf) = +inf / "
                             "-0 (inf * 0 and -0 * inf NaN), gates -100 / -89 -> -0 * u, 88 / 100 -> g * u exactly, "
                             "+-inf and beyond-max y (e4m3: 800) saturate to +-max, -0 -> 0x80 (%s)", isa, xn, on,
                             lk_status_str(st));
                }
                /* per block, scale_ub none / binding (1 / qmax) / below the floor (min_scale / 4) */
                for (int v = 0; v < 3; v++) {
                    float ubv = v == 1 ? 1.0f / qm : lo / 4, ub = v ? ubv : INFINITY, want[R][2];
                    lk_tensor tub = t1(&ubv, LK_F32, 1);
                    for (int r = 0; r < R; r++)
                        for (int b = 0; b < 2; b++) {
                            float m = 0;
                            for (int i = b * G; i < b * G + G; i++)
                                if (fabsf(y[r][i]) > m) m = fabsf(y[r][i]); /* NaN ignored */
                            float s = m / qm;
                            s = s < ub ? s : ub;
                            want[r][b] = s > lo ? s : lo;
                        }
                    memset(q, 0x55, sizeof q), memset(sc, 0x55, sizeof sc);
                    lk_status st = lk_silu_and_mul_per_block_quant(&tq, &tx, &ts, v ? &tub : NULL, G);
                    int ok = st == LK_OK && !memcmp(sc, want, sizeof sc) && CODES_OK(0, 0, want[0][0]) &&
                             CODES_OK(0, 1, want[0][1]) && CODES_OK(1, 0, want[1][0]) && CODES_OK(1, 1, want[1][1]);
                    if (v == 0) {
                        /* the absmax at the max code, NaN codes (i8 0), the inf block's scale inf */
                        ok &= want[0][0] == 400.0f / qm && q[0][3] == mx && NANQ(q[0][5]) && NANQ(q[0][6]) &&
                              isinf(sc[0][1]) && NANQ(q[0][G + 2]) && NANQ(q[0][G + 5]) &&
                              q[0][G] == (i8 ? 0 : 0x80) && q[0][G + 3] == 0 && sc[1][0] == lo && sc[1][1] == lo;
                        for (int i = 0; i < G; i++) ok &= NANQ(q[1][i]);
                        tu_check(ok, "%s silu_and_mul_per_block_quant %s -> %s: NaN ignored by the absmax (NaN codes%s), "
                                 "the absmax at the max code, an inf y makes its block's scale inf (finite codes %s, "
                                 "the inf %s), all-NaN and all-zero blocks min_scale %s (%s)", isa, xn, on,
                                 i8 ? ": 0" : "", i8 ? "0" : "signed zeros", i8 ? "0" : "NaN",
                                 i8 ? "FLT_EPSILON" : "1 / (fp8_max * 512)", lk_status_str(st));
                    } else if (v == 1) {
                        /* scale_ub bounds the scale: +-inf -> +-max (i8 127 / -128), 400 saturates */
                        ok &= sc[0][0] == ubv && sc[0][1] == ubv && q[0][G + 2] == mx &&
                              q[0][G + 5] == (i8 ? 0x80 : 0x80 | mx) && q[0][3] == mx && sc[1][0] == lo;
                        tu_check(ok, "%s silu_and_mul_per_block_quant %s -> %s, scale_ub 1 / qmax: the scale bounded "
                                 "(scale_ub exactly), +-inf and beyond-max y saturate to +-max%s, the zero blocks keep "
                                 "min_scale (%s)", isa, xn, on, i8 ? " (127 / -128)" : "", lk_status_str(st));
                    } else {
                        ok &= sc[0][0] == lo && sc[0][1] == lo && sc[1][0] == lo && sc[1][1] == lo;
                        tu_check(ok, "%s silu_and_mul_per_block_quant %s -> %s, scale_ub min_scale / 4: min_scale "
                                 "wins (max(min(absmax / qmax, ub), min_scale)) (%s)", isa, xn, on, lk_status_str(st));
                    }
                }
#undef CODES_OK
#undef NANQ
            }
    }
}

/* lk_static_group_scaled_fp8_quant's special values (docs/numerics.md "fp8 activations":
 * the fp8.h conversion of x / scale[r / gm, c / gn]), per ISA, f32 and bf16 inputs, 2 rows
 * of D = 40, on each of its SIMD paths: per-channel scales [1, D] read as vectors, the same
 * scales with column stride 2 and groups of 5 columns (element by element), groups of 20
 * and whole rows (one scale per vector): NaN kept with its sign, +-inf and beyond-max
 * saturate to +-max, -0 -> 0x80, ties to even, every element divided by its own group's
 * scale (0.25 or 0.5) */
static void test_fp8_static_grid(void) {
    static const lk_dtype XT[2] = {LK_F32, LK_BF16};
    static const char *PATH[5] = {"per-channel [1, 40] (vector path)",
                                  "per-channel [1, 40] column stride 2 (element path)",
                                  "[2, 8]: groups of 5 columns (element path)",
                                  "[1, 2]: groups of 20 columns", "[2, 1]: whole rows"};
    static const int64_t SH[5][2] = {{1, D}, {1, D}, {2, 8}, {1, 2}, {2, 1}};
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        const char *isa = lk_isa_name(isas[ii]);
        for (int xi = 0; xi < 2; xi++)
            for (int oi = 0; oi < 2; oi++)
                for (int path = 0; path < 5; path++) {
                    lk_dtype xt = XT[xi], ot = oi ? LK_F8E5M2 : LK_F8E4M3;
                    uint8_t mx = oi ? 0x7b : 0x7e, c4 = oi ? 0x44 : 0x48, c2 = 0x40, tie = oi ? 0x4a : 0x56;
                    float v[2][D], sbuf[2 * D], xb[2 * D]; /* xb: [2, D] of dtype xt */
                    uint8_t q[2][D];
                    int64_t sm = SH[path][0], sn = SH[path][1], gn = D / sn, cs = path == 1 ? 2 : 1;
                    /* the scale of (r, c): 0.25, or 0.5 on some groups (never on the tie's) */
#define SVAL(r, g) (path < 2 ? ((g) > 9 && (g) % 4 == 0) : path == 2 ? ((g) >= 2 && ((r) + (g)) % 2 == 0) \
                                                             : path == 3 ? (g) == 1 : (r) == 1)
                    for (int64_t r = 0; r < sm; r++)
                        for (int64_t g = 0; g < sn; g++) sbuf[(r * sn + g) * cs] = SVAL(r, g) ? 0.5f : 0.25f;
                    /* row 0: NaN, -NaN, +-inf, +-1e30, -0, 20000 (80000 / 40000 beyond max), the
                     * tie 13.5 (e4m3: -> 14) or 13 (e5m2: -> 12); row 1 the same at 33.. (tails) */
                    for (int r = 0; r < 2; r++)
                        for (int i = 0; i < D; i++) v[r][i] = 1.0f;
                    const float SP[9] = {NAN, -NAN, INFINITY, -INFINITY, 1e30f, -1e30f, -0.0f, 20000.0f,
                                         oi ? 3.25f : 3.375f};
                    for (int k = 0; k < 9; k++) v[0][1 + k] = SP[k];
                    for (int k = 0; k < 7; k++) v[1][33 + k] = SP[k];
                    for (int r = 0; r < 2; r++)
                        for (int i = 0; i < D; i++) lk_store_f(xb, xt, r * D + i, v[r][i]);
                    lk_tensor tx = t2(xb, xt, 2, D), tq = lk_tensor_make(q, ot, 2, (int64_t[]){2, D});
                    lk_tensor ts = t2(sbuf, LK_F32, sm, sn);
                    ts.stride[1] = cs, ts.stride[0] = sn * cs;
                    memset(q, 0x11, sizeof q);
                    lk_status s = lk_static_group_scaled_fp8_quant(&tq, &tx, &ts);
                    const uint8_t WSP[9] = {0x7f, 0xff, mx, (uint8_t)(0x80 | mx), mx, (uint8_t)(0x80 | mx), 0x80, mx,
                                            tie};
                    int ok = s == LK_OK, plain = 1;
                    for (int k = 0; k < 9; k++) ok &= q[0][1 + k] == WSP[k];
                    for (int k = 0; k < 7; k++) ok &= q[1][33 + k] == WSP[k];
                    for (int r = 0; r < 2; r++)
                        for (int i = 0; i < D; i++)
                            if (v[r][i] == 1.0f) plain &= q[r][i] == (SVAL(sm > 1 ? r : 0, i / gn) ? c2 : c4);
#undef SVAL
                    tu_check(ok && plain, "%s static_group_scaled_fp8_quant %s -> %s, %s: NaN kept with its sign, "
                             "+-inf and beyond-max -> +-max, -0 -> 0x80, ties to even%s; 1.0 / its group's scale "
                             "%s (%s)", isa, lk_dtype_name(xt), lk_dtype_name(ot), PATH[path], ok ? "" : " FAILED",
                             plain ? "ok" : "FAILED", lk_status_str(s));
                }
    }
}

/* the int8 quantizers' special values (docs/numerics.md "int8 activations"), per ISA */
static void test_int8_act(void) {
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        const char *isa = lk_isa_name(isas[ii]);
        float x[3][D], sc = 0.25f, scs[3];
        int8_t q[3][D];
        int32_t azp = -100, azs[3];
        lk_tensor tx = t2(x, LK_F32, 3, D), tq = lk_tensor_make(q, LK_I8, 2, (int64_t[]){3, D});
        lk_tensor ts = t1(&sc, LK_F32, 1), tz = t1(&azp, LK_I32, 1), tss = t1(scs, LK_F32, 3), tzs = t1(azs, LK_I32, 3);
        /* static: x / 0.25 rounded to nearest even (0.125 -> 0.5 -> 0, 0.375 -> 1.5 -> 2), saturated
         * (+-inf, 40 -> 160 -> 127), NaN -> 0, -0 -> 0 */
        for (int r = 0; r < 3; r++)
            for (int i = 0; i < D; i++) x[r][i] = 1.0f;
        x[0][1] = 0.125f, x[0][2] = 0.375f, x[0][3] = INFINITY, x[0][4] = -INFINITY, x[0][5] = 40.0f, x[0][6] = NAN,
        x[0][7] = -0.0f;
        lk_static_scaled_int8_quant(&tq, &tx, &ts, NULL);
        int ok = q[0][0] == 4 && q[0][1] == 0 && q[0][2] == 2 && q[0][3] == 127 && q[0][4] == -128 && q[0][5] == 127 &&
                 q[0][6] == 0 && q[0][7] == 0 && q[2][D - 1] == 4;
        tu_check(ok, "%s static_scaled_int8_quant: ties to even, +-inf and beyond-range saturate, NaN and -0 -> 0", isa);
        /* azp -100: codes + azp after the rounding, saturated once (NaN -> azp, inf -> 127 - no wrap) */
        lk_static_scaled_int8_quant(&tq, &tx, &ts, &tz);
        ok = q[0][0] == -96 && q[0][1] == -100 && q[0][2] == -98 && q[0][3] == 127 && q[0][4] == -128 && q[0][5] == 60 &&
             q[0][6] == -100 && q[0][7] == -100;
        tu_check(ok, "%s static_scaled_int8_quant (azp): rn(x / scale) saturated to int32, + azp, saturated; NaN -> azp",
                 isa);
        /* dynamic: NaN ignored by absmax / min / max; an all-zero row: scale 0 (azp 0), codes 0;
         * an inf: scale inf, codes 0 (symmetric) or azp (-128) */
        for (int i = 0; i < D; i++) x[0][i] = (float)(i % 5) - 1.0f, x[1][i] = 0.0f, x[2][i] = (float)(i % 3);
        x[0][6] = NAN, x[2][9] = INFINITY;
        lk_dynamic_scaled_int8_quant(&tq, &tx, &tss, NULL);
        ok = scs[0] == 3.0f / 127.0f && q[0][4] == 127 && q[0][6] == 0 && scs[1] == 0.0f && isinf(scs[2]);
        for (int i = 0; i < D; i++) ok &= q[1][i] == 0 && q[2][i] == 0;
        lk_dynamic_scaled_int8_quant(&tq, &tx, &tss, &tzs);
        ok &= scs[0] == 4.0f / 255.0f && azs[0] == -64 && q[0][0] == -128 && q[0][4] == 127 && q[0][6] == -64;
        ok &= scs[1] == 0.0f && azs[1] == 0 && isinf(scs[2]) && azs[2] == -128;
        for (int i = 0; i < D; i++) ok &= q[1][i] == 0 && q[2][i] == -128;
        tu_check(ok, "%s dynamic_scaled_int8_quant: NaN ignored (coded 0 / azp), zero row scale 0 and codes 0, an inf "
                 "makes the scale inf", isa);
    }
}

/* ---------------------------------------------------------------- merge */

static void test_merge(void) {
    enum { H = 5 };
    float a[1][H][D], b[1][H][D], la[1][H], lb[1][H], out[1][H][D], lo[1][H];
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        for (int h = 0; h < H; h++)
            for (int i = 0; i < D; i++) a[0][h][i] = 1.0f, b[0][h][i] = 3.0f;
        /* h0: a empty (+inf) and its values NaN: out = b; h1: both empty (-inf, +inf);
         * h2: NaN lse; h3: equal lses: mean; h4: a NaN value in a non-empty state */
        for (int i = 0; i < D; i++) a[0][0][i] = NAN;
        la[0][0] = INFINITY, lb[0][0] = 0.0f;
        la[0][1] = -INFINITY, lb[0][1] = INFINITY;
        la[0][2] = NAN, lb[0][2] = 0.0f;
        la[0][3] = 0.5f, lb[0][3] = 0.5f;
        la[0][4] = 0.0f, lb[0][4] = 0.0f, a[0][4][5] = NAN;
        lk_tensor ta = t3(a, LK_F32, 1, H, D), tb = t3(b, LK_F32, 1, H, D), to = t3(out, LK_F32, 1, H, D);
        lk_tensor tla = t2(la, LK_F32, 1, H), tlb = t2(lb, LK_F32, 1, H), tlo = t2(lo, LK_F32, 1, H);
        lk_merge_attn_states(&to, &tlo, &ta, &tla, &tb, &tlb);
        int ok = lo[0][0] == 0.0f && lo[0][1] == -INFINITY && isnan(lo[0][2]) && lo[0][3] == 0.5f + logf(2.0f);
        for (int i = 0; i < D; i++)
            ok &= out[0][0][i] == 3.0f && is_poszero(out[0][1][i]) && isnan(out[0][2][i]) && out[0][3][i] == 2.0f &&
                  (i == 5 ? isnan(out[0][4][i]) : out[0][4][i] == 2.0f);
        tu_check(ok, "%s merge_attn_states: +-inf LSE = empty state (values never read), all empty: out 0, lse -inf; "
                     "NaN LSE: out and lse NaN; a NaN value in a non-empty state stays in its element",
                 lk_isa_name(isas[ii]));
    }
}

/* ---------------------------------------------------------------- softmax */

static void test_softmax(void) {
    enum { Q = 4 };
    float x[Q][D], out[Q][D];
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        for (int r = 0; r < Q; r++)
            for (int j = 0; j < D; j++) x[r][j] = 0.1f * (float)(j % 7);
        /* q_len = 4, k_len = 40: row i sees keys j <= i + 36 */
        x[0][3] = -INFINITY;                                   /* weight 0 */
        for (int j = 0; j < D; j++) x[1][j] = -INFINITY;        /* all -inf: zeros */
        x[2][5] = NAN, x[2][39] = NAN;                          /* visible NaN; key 39 is masked for row 2 */
        x[3][1] = INFINITY;                                     /* +inf: NaN */
        x[0][39] = NAN;                                         /* masked for row 0: no effect */
        lk_tensor tx = t2(x, LK_F32, Q, D), to = t2(out, LK_F32, Q, D);
        lk_causal_softmax(&to, &tx);
        double sum = 0;
        int ok = is_poszero(out[0][3]) && is_poszero(out[0][39]);
        for (int j = 0; j < 37; j++) sum += out[0][j];
        ok &= fabs(sum - 1.0) < 1e-5;
        for (int j = 0; j < D; j++) ok &= is_poszero(out[1][j]);
        for (int j = 0; j < D; j++) ok &= j <= 38 ? isnan(out[2][j]) : is_poszero(out[2][j]);
        for (int j = 0; j < D; j++) ok &= isnan(out[3][j]);
        tu_check(ok, "%s causal_softmax: -inf weighs 0; all visible -inf: zeros; a visible NaN or +inf: the visible "
                     "part NaN, masked entries 0; masked NaN has no effect",
                 lk_isa_name(isas[ii]));
    }
}

/* ---------------------------------------------------------------- attention */

static void test_attention(void) {
    enum { T = 6, K = 8, H = 4, DH = 16 };
    float q[T][H][DH], k[K][1][DH], v[K][1][DH], out[T][H][DH], lse[T][H];
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        for (int j = 0; j < K; j++)
            for (int d = 0; d < DH; d++) k[j][0][d] = 0.1f * (float)((j + d) % 5), v[j][0][d] = 0.25f * (float)(j % 3);
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++)
                for (int d = 0; d < DH; d++) q[t][h][d] = 0.2f;
        /* causal, q_len 6, k_len 8: query i sees keys 0 .. i + 2 */
        for (int d = 0; d < DH; d++) {
            q[1][0][d] = NAN;                       /* NaN score: the row is NaN */
            q[2][1][d] = d == 0 ? -INFINITY : 0.2f; /* scores -inf (k >= 0, k[0][0] = 0: NaN for key 0!) */
        }
        k[7][0][0] = NAN; /* key 7 is visible only to query 5 */
        v[7][0][3] = INFINITY;
        int32_t cq[2] = {0, T}, ck[2] = {0, K};
        lk_tensor tq = t3(q, LK_F32, T, H, DH), tk = t3(k, LK_F32, K, 1, DH), tv = t3(v, LK_F32, K, 1, DH);
        lk_tensor to = t3(out, LK_F32, T, H, DH), tl = t2(lse, LK_F32, T, H);
        lk_tensor tcq = t1(cq, LK_I32, 2), tck = t1(ck, LK_I32, 2);
        lk_attn_params p = lk_attn_params_default(0.5f);
        p.causal = 1;
        lk_status st = lk_flash_attn_varlen(&to, &tl, &tq, &tk, &tv, &tcq, &tck, NULL, NULL, &p);
        int ok = st == LK_OK && isnan(lse[1][0]) && isnan(lse[5][0]);
        for (int d = 0; d < DH; d++) ok &= isnan(out[1][0][d]) && isnan(out[5][2][d]);
        /* rows 0..4 never see key 7: finite */
        for (int t = 0; t < 5; t++)
            for (int h = 0; h < H; h++) {
                if ((t == 1 && h == 0) || (t == 2 && h == 1)) continue;
                ok &= isfinite(lse[t][h]);
                for (int d = 0; d < DH; d++) ok &= isfinite(out[t][h][d]);
            }
        tu_check(ok, "%s flash_attn: a NaN score makes its row NaN (out and lse); a key the causal mask hides "
                     "(NaN k, inf v) does not reach earlier queries",
                 lk_isa_name(isas[ii]));

        /* softcap bounds scores: an infinite q . k becomes +-softcap */
        for (int d = 0; d < DH; d++) q[0][0][d] = d == 0 ? INFINITY : 0.2f, k[0][0][d] = 1.0f, k[7][0][d] = 0.5f;
        v[7][0][3] = 0.5f;
        p.softcap = 5.0f;
        for (int d = 0; d < DH; d++) q[1][0][d] = 0.2f, q[2][1][d] = 0.2f;
        st = lk_flash_attn_varlen(&to, &tl, &tq, &tk, &tv, &tcq, &tck, NULL, NULL, &p);
        ok = st == LK_OK && isfinite(lse[0][0]);
        for (int d = 0; d < DH; d++) ok &= isfinite(out[0][0][d]);
        tu_check(ok, "%s flash_attn: with a softcap an infinite score is capped (finite row)", lk_isa_name(isas[ii]));

        /* no visible key: out 0, lse -inf (window left of every key) */
        p = lk_attn_params_default(0.5f);
        int32_t ck0[2] = {0, 0};
        lk_tensor tck0 = t1(ck0, LK_I32, 2);
        st = lk_flash_attn_varlen(&to, &tl, &tq, &tk, &tv, &tcq, &tck0, NULL, NULL, &p);
        ok = st == LK_OK;
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++) {
                ok &= lse[t][h] == -INFINITY;
                for (int d = 0; d < DH; d++) ok &= is_poszero(out[t][h][d]);
            }
        tu_check(ok, "%s flash_attn: a row that sees no key gives out = 0 and lse = -inf", lk_isa_name(isas[ii]));

        /* +inf score without softcap: m = inf, exp(inf - inf) = NaN: the row is NaN */
        for (int d = 0; d < DH; d++) q[3][2][d] = d == 0 ? INFINITY : 0.2f;
        st = lk_flash_attn_varlen(&to, &tl, &tq, &tk, &tv, &tcq, &tck, NULL, NULL, &p);
        ok = st == LK_OK && isnan(lse[3][2]) && isfinite(lse[3][1]);
        for (int d = 0; d < DH; d++) ok &= isnan(out[3][2][d]);
        tu_check(ok, "%s flash_attn: a +inf score (no softcap) makes its row NaN", lk_isa_name(isas[ii]));
        for (int d = 0; d < DH; d++) q[3][2][d] = 0.2f;
    }
}

/* paged K/V: slots past seqused_k (a partial last page's tail) are never read, whatever
 * they hold (NaN here), on the decode and the prefill path */
static void test_attention_page_tail(void) {
    enum { NB = 2, BS = 16, DH = 16, KL = 5 };
    static float kc[NB][BS][1][DH], vc[NB][BS][1][DH], q[8][1][DH], out[8][1][DH], lse[8][1];
    for (int p = 0; p < NB; p++)
        for (int s = 0; s < BS; s++)
            for (int d = 0; d < DH; d++) {
                int valid = p == 1 && s < KL;
                kc[p][s][0][d] = valid ? 0.1f * (float)(d % 3) : NAN;
                vc[p][s][0][d] = valid ? 0.5f : INFINITY;
            }
    for (int t = 0; t < 8; t++)
        for (int d = 0; d < DH; d++) q[t][0][d] = 0.2f;
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        int ok = 1;
        for (int ql = 1; ql <= 8; ql += 7) {
            int32_t cq[2] = {0, ql}, used[1] = {KL}, bt[1][2] = {{1, 0}};
            lk_tensor tq = t3(q, LK_F32, ql, 1, DH), to = t3(out, LK_F32, ql, 1, DH), tl = t2(lse, LK_F32, ql, 1);
            lk_tensor tk = lk_tensor_make(kc, LK_F32, 4, (int64_t[]){NB, BS, 1, DH});
            lk_tensor tv = lk_tensor_make(vc, LK_F32, 4, (int64_t[]){NB, BS, 1, DH});
            lk_tensor tcq = t1(cq, LK_I32, 2), tu = t1(used, LK_I32, 1), tb = t2(bt, LK_I32, 1, 2);
            lk_attn_params p = lk_attn_params_default(0.25f);
            p.causal = 1;
            lk_status st = lk_flash_attn_varlen(&to, &tl, &tq, &tk, &tv, &tcq, NULL, &tu, &tb, &p);
            ok &= st == LK_OK;
            for (int t = 0; t < ql; t++) {
                int sees = t + KL - ql >= 0;
                ok &= sees ? isfinite(lse[t][0]) : lse[t][0] == -INFINITY;
                for (int d = 0; d < DH; d++) ok &= sees ? fabsf(out[t][0][d] - 0.5f) < 1e-6f : out[t][0][d] == 0.0f;
            }
        }
        tu_check(ok, "%s flash_attn: NaN / inf in the slots past seqused_k never reach the output (decode, prefill)",
                 lk_isa_name(isas[ii]));
    }
}

/* ---------------------------------------------------------------- mla_prefix_prefill */

/* Two requests over one-buffer ND latent cache pages of 4 slots: request 0 has 3 new
 * tokens over a prefix of 6 (pages 0, 1; page 1 half used), request 1 has 2 over 5 (pages
 * 2, 3; page 3 one slot); page 4 is unused; one padding row at the end. Every slot no
 * prefix uses holds NaN. Each rule on every ISA and every strategy. */
enum { MH = 2, MDN = 16, MDR = 16, MDV = 16, MDL = 32, ME = MDL + MDR, MBS = 4, MNB = 5, MT = 6 };
static float mq[MT][MH][MDN + MDR], mk[MT][MH][MDN + MDR], mv[MT][MH][MDV], mw[MH * (MDN + MDV)][MDL];
static float mc[MNB][MBS][ME], mout[MT][MH][MDV], mbase[MT][MH][MDV];

static void mla_fill(void) {
    uint32_t r = 12345;
#define MLA_RND() ((float)((r = r * 1664525u + 1013904223u) >> 8) / 16777216.0f * 2.0f - 1.0f)
    for (int i = 0; i < MT * MH * (MDN + MDR); i++) (&mq[0][0][0])[i] = MLA_RND(), (&mk[0][0][0])[i] = MLA_RND();
    for (int i = 0; i < MT * MH * MDV; i++) (&mv[0][0][0])[i] = MLA_RND();
    for (int i = 0; i < MH * (MDN + MDV) * MDL; i++) (&mw[0][0])[i] = 0.3f * MLA_RND();
    static const int used[MNB] = {4, 2, 4, 1, 0};
    for (int p = 0; p < MNB; p++)
        for (int sl = 0; sl < MBS; sl++)
            for (int d = 0; d < ME; d++) mc[p][sl][d] = sl < used[p] ? MLA_RND() : NAN;
#undef MLA_RND
}

static lk_status mla_call(lk_mla_strategy st) {
    int32_t cq[3] = {0, 3, 5}, pl[2] = {6, 5}, bt[2][3] = {{0, 1, -1}, {2, 3, -1}};
    lk_tensor tq = t3(mq, LK_F32, MT, MH, MDN + MDR), tk = t3(mk, LK_F32, MT, MH, MDN + MDR);
    lk_tensor tv = t3(mv, LK_F32, MT, MH, MDV), to = t3(mout, LK_F32, MT, MH, MDV);
    lk_tensor tcq = t1(cq, LK_I32, 3), tpl = t1(pl, LK_I32, 2), tbt = t2(bt, LK_I32, 2, 3);
    lk_tensor tc = t3(mc, LK_F32, MNB, MBS, ME), tw = t2(mw, LK_F32, MH * (MDN + MDV), MDL);
    lk_mla_params p = lk_mla_params_default(0.125f);
    p.strategy = st;
    for (int i = 0; i < MT * MH * MDV; i++) (&mout[0][0][0])[i] = -7.0f; /* garbage, padding row included */
    return lk_mla_prefix_prefill(&to, &tq, &tk, &tv, &tcq, &tpl, &tbt, &tc, NULL, &tw, &p);
}

/* rows [t0, t1) of out: every value NaN (want_nan) or equal to the baseline within 1e-5 */
static int mla_rows(int t0, int t1, int want_nan) {
    int ok = 1;
    for (int t = t0; t < t1; t++)
        for (int h = 0; h < MH; h++)
            for (int d = 0; d < MDV; d++)
                ok &= want_nan ? isnan(mout[t][h][d]) : fabsf(mout[t][h][d] - mbase[t][h][d]) <= 1e-5f;
    return ok;
}

static void test_mla(void) {
    static const lk_mla_strategy ST[5] = {LK_MLA_AUTO, LK_MLA_SPLIT_MERGE, LK_MLA_CONCAT, LK_MLA_FUSED, LK_MLA_ABSORBED};
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        for (int si = 0; si < 5; si++) {
            const char *isa = lk_isa_name(isas[ii]), *sn = lk_mla_strategy_name(ST[si]);
            mla_fill();
            lk_status st = mla_call(ST[si]);
            int ok = st == LK_OK;
            for (int t = 0; t < MT; t++)
                for (int h = 0; h < MH; h++)
                    for (int d = 0; d < MDV; d++) ok &= t < 5 ? isfinite(mout[t][h][d]) : is_poszero(mout[t][h][d]);
            memcpy(mbase, mout, sizeof mout);
            tu_check(ok, "%s mla %s: NaN in every cache slot no prefix uses never reaches the output; the padding "
                         "row is +0", isa, sn);

            mq[1][0][2] = NAN; /* q_nope of (token 1, head 0) */
            st = mla_call(ST[si]);
            ok = st == LK_OK && mla_rows(1, 2, 0) == 0 && mla_rows(0, 1, 0) && mla_rows(2, 5, 0);
            for (int d = 0; d < MDV; d++) ok &= isnan(mout[1][0][d]) && fabsf(mout[1][1][d] - mbase[1][1][d]) <= 1e-5f;
            tu_check(ok, "%s mla %s: a NaN in q makes only its (token, head) row NaN", isa, sn);
            mla_fill();

            mc[0][1][3] = NAN; /* a latent value of request 0's prefix token 1 */
            st = mla_call(ST[si]);
            tu_check(st == LK_OK && mla_rows(0, 3, 1) && mla_rows(3, 5, 0),
                     "%s mla %s: a NaN in a used cache entry makes its request's rows NaN (every head), other "
                     "requests unaffected", isa, sn);
            mla_fill();

            mc[2][0][MDL] = INFINITY; /* k_pe of request 1's prefix token 0, q_rope > 0: score +inf */
            for (int t = 3; t < 5; t++)
                for (int h = 0; h < MH; h++) mq[t][h][MDN] = 0.5f;
            st = mla_call(ST[si]);
            tu_check(st == LK_OK && mla_rows(3, 5, 1) && mla_rows(0, 3, 0),
                     "%s mla %s: a +inf score makes its rows NaN (as flash_attn), other requests unaffected", isa, sn);
            mla_fill();

            mc[2][0][MDL] = -INFINITY; /* the same key scores -inf: weight 0 */
            for (int t = 3; t < 5; t++)
                for (int h = 0; h < MH; h++) mq[t][h][MDN] = 0.5f;
            st = mla_call(ST[si]);
            ok = st == LK_OK;
            for (int t = 3; t < 5; t++)
                for (int h = 0; h < MH; h++)
                    for (int d = 0; d < MDV; d++) ok &= isfinite(mout[t][h][d]);
            tu_check(ok, "%s mla %s: a -inf score weighs 0 (finite rows)", isa, sn);
            mla_fill();

            /* request 1's current key 3 scores -inf for tokens 3 and 4 (k_rope +inf, q_rope < 0)
             * and holds a NaN in v: weight 0, its value never reaches a row (split_merge and
             * concat hand such inputs to fused; flash_attn alone would give 0 * NaN) */
            for (int h = 0; h < MH; h++) mk[3][h][MDN] = INFINITY;
            for (int t = 3; t < 5; t++)
                for (int h = 0; h < MH; h++) mq[t][h][MDN] = -0.5f;
            mv[3][0][1] = NAN, mv[3][1][4] = INFINITY;
            st = mla_call(ST[si]);
            ok = st == LK_OK && mla_rows(0, 3, 0);
            for (int t = 3; t < 5; t++)
                for (int h = 0; h < MH; h++)
                    for (int d = 0; d < MDV; d++) ok &= isfinite(mout[t][h][d]);
            tu_check(ok, "%s mla %s: a NaN / inf in v of a current key scored -inf never reaches a row", isa, sn);
            mla_fill();

            mv[2][0][1] = INFINITY; /* v of request 0's current token 2: hidden from tokens 0, 1 */
            st = mla_call(ST[si]);
            ok = st == LK_OK && mla_rows(3, 5, 0) && !isfinite(mout[2][0][1]);
            for (int t = 0; t < 2; t++)
                for (int d = 0; d < MDV; d++) ok &= fabsf(mout[t][0][d] - mbase[t][0][d]) <= 1e-5f;
            tu_check(ok, "%s mla %s: an inf in v of a current key never reaches the queries the causal mask hides "
                         "it from", isa, sn);
            mla_fill();

            /* a visible key of finite score far below the row maximum (s - m ~ -250: its weight
             * 0 in f32) with an inf in v: the element is not finite on any ISA or strategy
             * (0 * inf or tiny * inf, as flash_attn); other requests unaffected */
            mv[0][0][1] = INFINITY, mk[0][0][MDN] = -2000.0f, mq[0][0][MDN] = 1.0f;
            st = mla_call(ST[si]);
            ok = st == LK_OK && mla_rows(3, 5, 0);
            for (int t = 0; t < 3; t++) ok &= !isfinite(mout[t][0][1]);
            tu_check(ok, "%s mla %s: an inf in v of a visible key whose weight underflows makes its element "
                         "non-finite (as flash_attn)", isa, sn);
        }
    }
}

/* ---------------------------------------------------------------- mla_prefix_prefill, fp8 cache */

/* The rules of test_mla over fp8 latent caches (the same batch, entries fp8(x / k_scale)
 * by src/core/fp8.h, k_scale 0.25; unused slots hold the format's NaN code): finite rows
 * equal to an f32 cache of the dequantized entries within 1e-5; a NaN code of a used
 * entry makes its request's rows NaN; e5m2's +inf code in k_pe (q_rope > 0) makes them NaN,
 * its -inf code weighs 0; e4m3 has no inf: its largest code stays finite. Every ISA and
 * strategy. */
static uint8_t mc8[MNB][MBS][ME];

static lk_status mla8_call(lk_mla_strategy st, lk_dtype dt) {
    int32_t cq[3] = {0, 3, 5}, pl[2] = {6, 5}, bt[2][3] = {{0, 1, -1}, {2, 3, -1}};
    lk_tensor tq = t3(mq, LK_F32, MT, MH, MDN + MDR), tk = t3(mk, LK_F32, MT, MH, MDN + MDR);
    lk_tensor tv = t3(mv, LK_F32, MT, MH, MDV), to = t3(mout, LK_F32, MT, MH, MDV);
    lk_tensor tcq = t1(cq, LK_I32, 3), tpl = t1(pl, LK_I32, 2), tbt = t2(bt, LK_I32, 2, 3);
    lk_tensor tc = t3(mc8, dt, MNB, MBS, ME), tw = t2(mw, LK_F32, MH * (MDN + MDV), MDL);
    lk_mla_params p = lk_mla_params_default(0.125f);
    p.strategy = st, p.k_scale = 0.25f;
    for (int i = 0; i < MT * MH * MDV; i++) (&mout[0][0][0])[i] = -7.0f;
    return lk_mla_prefix_prefill(&to, &tq, &tk, &tv, &tcq, &tpl, &tbt, &tc, NULL, &tw, &p);
}

/* mc8 = fp8(mc / 0.25); mc = the dequantized values (the f32 baseline's cache) */
static void mla8_fill(lk_dtype dt) {
    mla_fill();
    for (int i = 0; i < MNB * MBS * ME; i++) {
        float *x = &mc[0][0][0] + i;
        uint8_t c = dt == LK_F8E5M2 ? lk_f32_to_f8e5m2(*x / 0.25f) : lk_f32_to_f8e4m3(*x / 0.25f);
        (&mc8[0][0][0])[i] = c;
        *x = (dt == LK_F8E5M2 ? lk_f8e5m2_to_f32(c) : lk_f8e4m3_to_f32(c)) * 0.25f;
    }
}

static void test_mla_fp8(void) {
    static const lk_mla_strategy ST[5] = {LK_MLA_AUTO, LK_MLA_SPLIT_MERGE, LK_MLA_CONCAT, LK_MLA_FUSED, LK_MLA_ABSORBED};
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        for (int f = 0; f < 2; f++)
            for (int si = 0; si < 5; si++) {
                lk_dtype dt = f ? LK_F8E5M2 : LK_F8E4M3;
                const char *isa = lk_isa_name(isas[ii]), *sn = lk_mla_strategy_name(ST[si]), *fn = lk_dtype_name(dt);
                mla8_fill(dt);
                lk_status st = mla_call(ST[si]); /* f32 cache of the dequantized entries */
                memcpy(mbase, mout, sizeof mout);
                st |= mla8_call(ST[si], dt);
                int ok = st == LK_OK && mla_rows(0, 5, 0);
                for (int h = 0; h < MH; h++)
                    for (int d = 0; d < MDV; d++) ok &= is_poszero(mout[5][h][d]);
                tu_check(ok, "%s mla %s %s cache: = the f32 cache of the dequantized entries; NaN codes in every "
                             "unused slot never reach the output; the padding row is +0", isa, sn, fn);

                mc8[0][1][3] = 0x7f; /* NaN code in a latent value of request 0's prefix token 1 */
                st = mla8_call(ST[si], dt);
                tu_check(st == LK_OK && mla_rows(0, 3, 1) && mla_rows(3, 5, 0),
                         "%s mla %s %s: a NaN code in a used entry makes its request's rows NaN, others unaffected",
                         isa, sn, fn);
                mla8_fill(dt);

                for (int t = 3; t < 5; t++)
                    for (int h = 0; h < MH; h++) mq[t][h][MDN] = 0.5f;
                mc8[2][0][MDL] = f ? 0x7c : 0x7e; /* k_pe: e5m2 +inf, e4m3 its max (448) */
                st = mla8_call(ST[si], dt);
                ok = st == LK_OK && mla_rows(0, 3, 0);
                for (int t = 3; t < 5; t++)
                    for (int h = 0; h < MH; h++)
                        for (int d = 0; d < MDV; d++) ok &= f ? isnan(mout[t][h][d]) : isfinite(mout[t][h][d]);
                tu_check(ok, "%s mla %s %s: %s", isa, sn, fn,
                         f ? "the +inf code (score +inf) makes its rows NaN" : "the max code (448) stays finite");
                if (f) {
                    mc8[2][0][MDL] = 0xfc; /* -inf: weight 0 */
                    st = mla8_call(ST[si], dt);
                    ok = st == LK_OK;
                    for (int t = 3; t < 5; t++)
                        for (int h = 0; h < MH; h++)
                            for (int d = 0; d < MDV; d++) ok &= isfinite(mout[t][h][d]);
                    tu_check(ok, "%s mla %s %s: the -inf code weighs 0 (finite rows)", isa, sn, fn);
                }
            }
    }
}

/* ---------------------------------------------------------------- bf16 attention */

/* flash_attn with bf16 q, k, v (the avx512bf16 ISA's bf16 dot-product path, docs/numerics.md):
 * special values as on every path (a NaN q makes its row NaN, an infinite V of a key the
 * causal mask hides stays out of earlier rows, through the bf16 P.V's NaN guard); into an
 * f32 out the products are exact and P stays f32: within the f32 attention tolerance of
 * ref; into a bf16 out P is rounded to bf16: |out - exact| <= 2^-8 max|v| */
static void test_attention_bf16(void) {
    enum { T = 70, H = 2, DH = 64 };
    static uint16_t q[T][H][DH], k[T][1][DH], v[T][1][DH], ob[TU_MAX_ISAS][T][H][DH];
    static float of[TU_MAX_ISAS][T][H][DH];
    tu_seed(99);
    for (int t = 0; t < T; t++)
        for (int d = 0; d < DH; d++) {
            for (int h = 0; h < H; h++) q[t][h][d] = lk_f32_to_bf16((float)tu_uniform(-2, 2));
            k[t][0][d] = lk_f32_to_bf16((float)tu_uniform(-2, 2));
            v[t][0][d] = lk_f32_to_bf16((float)tu_uniform(-1, 1));
        }
    for (int d = 0; d < DH; d++) q[3][1][d] = lk_f32_to_bf16(NAN); /* row (3, 1) NaN */
    v[T - 1][0][5] = lk_f32_to_bf16(INFINITY);                     /* seen by the last query only */
    int32_t cu[2] = {0, T};
    lk_tensor tq = t3(q, LK_BF16, T, H, DH), tk = t3(k, LK_BF16, T, 1, DH), tv = t3(v, LK_BF16, T, 1, DH);
    lk_tensor tc = t1(cu, LK_I32, 2);
    lk_attn_params p = lk_attn_params_default(0.125f);
    p.causal = 1;
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        lk_tensor tb = t3(ob[ii], LK_BF16, T, H, DH), tf = t3(of[ii], LK_F32, T, H, DH);
        int ok = lk_flash_attn_varlen(&tb, NULL, &tq, &tk, &tv, &tc, &tc, NULL, NULL, &p) == LK_OK &&
                 lk_flash_attn_varlen(&tf, NULL, &tq, &tk, &tv, &tc, &tc, NULL, NULL, &p) == LK_OK;
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++)
                for (int d = 0; d < DH; d++) {
                    float b = lk_bf16_to_f32(ob[ii][t][h][d]), f = of[ii][t][h][d];
                    int nan_row = t == 3 && h == 1, inf_col = t == T - 1 && d == 5;
                    ok &= nan_row ? isnan(b) && isnan(f) : inf_col ? !isfinite(b) && !isfinite(f) : isfinite(b) && isfinite(f);
                }
        tu_check(ok, "%s flash_attn bf16 q/k/v: a NaN q row is NaN, a hidden key's inf V reaches only the query "
                     "that sees it (bf16 and f32 out)", lk_isa_name(isas[ii]));
    }
    /* accuracy of every ISA against ref's f32 out (isas[0] is ref) */
    for (int ii = 1; ii < ni; ii++) {
        double ef = 0, eb = 0;
        int differ = 0;
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++)
                for (int d = 0; d < DH; d++) {
                    float r = of[0][t][h][d];
                    if (!isfinite(r)) continue;
                    double e1 = fabs(of[ii][t][h][d] - r) / (1 + fabs(r)), e2 = fabs(lk_bf16_to_f32(ob[ii][t][h][d]) - r);
                    if (e1 > ef) ef = e1;
                    if (e2 > eb) eb = e2;
                    differ += ob[ii][t][h][d] != ob[0][t][h][d];
                }
        tu_check(ef <= 3e-5, "%s flash_attn bf16 q/k/v, f32 out: within 3e-5 of ref (%.3g)", lk_isa_name(isas[ii]), ef);
        tu_check(eb <= 1.0 / 256, "%s flash_attn bf16 q/k/v, bf16 out: |out - ref's f32| <= 2^-8 max|v| (%.3g)",
                 lk_isa_name(isas[ii]), eb);
        if (isas[ii] == LK_ISA_AVX512BF16 && !lk_cpu_prefer_fma()) /* the rounded P shows: many outputs one bf16 ulp off ref's */
            tu_check(differ > T * H * DH / 20, "%s flash_attn bf16 out takes the bf16 P.V path (%d of %d differ from ref)",
                     lk_isa_name(isas[ii]), differ, T * H * DH);
        else if (isas[ii] == LK_ISA_AVX512BF16) /* lk_cpu_prefer_fma: P in f32, as ref */
            tu_check(differ <= T * H * DH / 20, "%s flash_attn bf16 out takes the f32 P.V path (%d of %d differ from ref)",
                     lk_isa_name(isas[ii]), differ, T * H * DH);
    }
}

/* the decode path on bf16 q, k, v (a few queries per request, G = 4 query heads per KV
 * head, key counts that end blocks and pairs unevenly): the same bounds as the prefill
 * tiles above, a NaN q row is NaN, and on avx512bf16 a bf16 out takes the bf16 P.V */
static void test_attention_bf16_decode(void) {
    enum { B = 3, HQ = 8, HK = 2, DH = 64, KT = 37 + 70 + 1 };
    static const int32_t kl[B] = {37, 70, 1};
    static uint16_t q[B][HQ][DH], k[KT][HK][DH], v[KT][HK][DH], ob[TU_MAX_ISAS][B][HQ][DH];
    static float of[TU_MAX_ISAS][B][HQ][DH];
    tu_seed(101);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < HQ; h++)
            for (int d = 0; d < DH; d++) q[b][h][d] = lk_f32_to_bf16((float)tu_uniform(-2, 2));
    for (int t = 0; t < KT; t++)
        for (int h = 0; h < HK; h++)
            for (int d = 0; d < DH; d++) {
                k[t][h][d] = lk_f32_to_bf16((float)tu_uniform(-2, 2));
                v[t][h][d] = lk_f32_to_bf16((float)tu_uniform(-1, 1));
            }
    for (int d = 0; d < DH; d++) q[1][5][d] = lk_f32_to_bf16(NAN); /* row (1, 5) NaN */
    int32_t cq[B + 1] = {0, 1, 2, 3}, ck[B + 1] = {0, kl[0], kl[0] + kl[1], KT};
    lk_tensor tq = t3(q, LK_BF16, B, HQ, DH), tk = t3(k, LK_BF16, KT, HK, DH), tv = t3(v, LK_BF16, KT, HK, DH);
    lk_tensor tcq = t1(cq, LK_I32, B + 1), tck = t1(ck, LK_I32, B + 1);
    lk_attn_params p = lk_attn_params_default(0.125f);
    p.causal = 1;
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        lk_tensor tb = t3(ob[ii], LK_BF16, B, HQ, DH), tf = t3(of[ii], LK_F32, B, HQ, DH);
        int ok = lk_flash_attn_varlen(&tb, NULL, &tq, &tk, &tv, &tcq, &tck, NULL, NULL, &p) == LK_OK &&
                 lk_flash_attn_varlen(&tf, NULL, &tq, &tk, &tv, &tcq, &tck, NULL, NULL, &p) == LK_OK;
        for (int b = 0; b < B; b++)
            for (int h = 0; h < HQ; h++)
                for (int d = 0; d < DH; d++) {
                    int nan_row = b == 1 && h == 5;
                    float x = lk_bf16_to_f32(ob[ii][b][h][d]), f = of[ii][b][h][d];
                    ok &= nan_row ? isnan(x) && isnan(f) : isfinite(x) && isfinite(f);
                }
        tu_check(ok, "%s flash_attn decode bf16 q/k/v: finite rows, a NaN q row is NaN", lk_isa_name(isas[ii]));
    }
    for (int ii = 1; ii < ni; ii++) {
        double ef = 0, eb = 0;
        int differ = 0;
        for (int b = 0; b < B; b++)
            for (int h = 0; h < HQ; h++)
                for (int d = 0; d < DH; d++) {
                    float r = of[0][b][h][d];
                    if (!isfinite(r)) continue;
                    double e1 = fabs(of[ii][b][h][d] - r) / (1 + fabs(r)), e2 = fabs(lk_bf16_to_f32(ob[ii][b][h][d]) - r);
                    if (e1 > ef) ef = e1;
                    if (e2 > eb) eb = e2;
                    differ += ob[ii][b][h][d] != ob[0][b][h][d];
                }
        tu_check(ef <= 3e-5, "%s flash_attn decode bf16 q/k/v, f32 out: within 3e-5 of ref (%.3g)", lk_isa_name(isas[ii]), ef);
        tu_check(eb <= 1.0 / 256, "%s flash_attn decode bf16 q/k/v, bf16 out: |out - ref's f32| <= 2^-8 max|v| (%.3g)",
                 lk_isa_name(isas[ii]), eb);
        if (isas[ii] == LK_ISA_AVX512BF16 && !lk_cpu_prefer_fma())
            tu_check(differ > B * HQ * DH / 20, "%s flash_attn decode bf16 out takes the bf16 P.V path (%d of %d differ)",
                     lk_isa_name(isas[ii]), differ, B * HQ * DH);
        else if (isas[ii] == LK_ISA_AVX512BF16)
            tu_check(differ <= B * HQ * DH / 20, "%s flash_attn decode bf16 out takes the f32 P.V path (%d of %d differ)",
                     lk_isa_name(isas[ii]), differ, B * HQ * DH);
    }
}

/* ---------------------------------------------------------------- fp8 attention */

/* flash_attn over fp8 K / V (docs/numerics.md, "fp8 attention"): K, V of values x are
 * quantized as vLLM does, code = fp8(x / s) with s = max|x| / fp8 max, and attended with
 * k_descale = v_descale = s; every ISA's f32 out is compared with the float64 attention
 * of the unquantized x, within the bound derived from the fp8 step:
 *   |dscore_j| <= delta_j = scale * sum_d |q_d| (u |k_jd| + s t),  delta = max_j delta_j
 *   |out - out_x| <= (e^(2 delta) - 1) max|v| (1 + u) + u max|v| + s t + 3e-5 (f32)
 * (u = 2^-(M+1) the unit roundoff of the format, t = half its smallest subnormal step;
 * the softmax weights move by a factor within e^(+-delta), so by at most e^(2 delta) - 1
 * in sum). Then the special values: a NaN code of a visible key makes its query rows
 * NaN (that KV head's), a NaN V code of a key the causal mask hides reaches only the
 * queries that see it (in its dim), e5m2's inf in K makes the row NaN, and descales scale exactly. */
/* flash attention into an fp8 out (lk_flash_attn_varlen_scaled), every ISA, decode (1
 * query, 4 query heads per KV head x 32 dims: the GQA decode loop of AVX2 and AVX-512) and prefill (5
 * queries), e4m3 and e5m2 outs. One key (P = 1, l = 1), so out = that key's V row
 * exactly and each code must be fp8(v / output_scale) of the reference converter:
 *  - the rounding order: a true f32 division. With output_scale 63/32, v = 2.091796875
 *    (e4m3) and 2.21484375 (e5m2) divide to the ties 1.0625 / 1.125 exactly, which round to
 *    even (0x38 / 0x3c); v * (1 / output_scale) lands one f32 ulp above the tie and would
 *    round up (0x39 / 0x3d)
 *  - beyond the max and +-inf saturate to +-max; NaN stays NaN; 0 gives code 0; the
 *    smallest subnormal is kept
 *  - no visible key (and padding rows past the last request): code 0, lse -inf */
static int f8_is_nan(int e5m2, uint8_t c) { return e5m2 ? (c & 0x7f) > 0x7c : (c & 0x7f) == 0x7f; }

static void test_attention_fp8_out(void) {
    enum { T = 6, H = 4, DH = 32 };
    static float q[T][H][DH], k[1][1][DH], v[1][1][DH], lse[T][H];
    static uint8_t out[T][H][DH];
    const float osc = 63.0f / 32.0f;
    const float vals[16] = {2.091796875f, -2.091796875f, 2.21484375f, -2.21484375f, 2e5f, -1e6f, INFINITY,
                            -INFINITY, NAN, 0.0f, 0x1p-9f * osc, 0x1p-16f * osc, 0.3f, -0.7f, 5.5f, 1e-3f};
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            for (int d = 0; d < DH; d++) q[t][h][d] = 0.1f * (float)((t + h + d) % 5) - 0.2f;
    for (int d = 0; d < DH; d++) k[0][0][d] = 0.25f, v[0][0][d] = vals[d % 16];
    lk_tensor tk = t3(k, LK_F32, 1, 1, DH), tv = t3(v, LK_F32, 1, 1, DH), tos = t1((void *)&osc, LK_F32, 1);
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        for (int of = 0; of < 2; of++)
            for (int prefill = 0; prefill <= 1; prefill++) {
                lk_dtype ot = of ? LK_F8E5M2 : LK_F8E4M3;
                uint8_t mx = of ? 0x7b : 0x7e;
                int tq = prefill ? 5 : 1; /* row tq (and up to T - 1) is padding past cu_q[B] */
                int32_t cq[2] = {0, tq}, ck[2] = {0, 1}, ck0[2] = {0, 0};
                lk_tensor tq_ = t3(q, LK_F32, T, H, DH), to = lk_tensor_make(out, ot, 3, (int64_t[]){T, H, DH});
                lk_tensor tl = t2(lse, LK_F32, T, H), tcq = t1(cq, LK_I32, 2), tck = t1(ck, LK_I32, 2), tck0 = t1(ck0, LK_I32, 2);
                lk_attn_params p = lk_attn_params_default(0.5f);
                memset(out, 0x55, sizeof out);
                lk_status st = lk_flash_attn_varlen_scaled(&to, &tl, &tq_, &tk, &tv, &tcq, &tck, NULL, NULL, &p, &tos);
                int ok = st == LK_OK, exact = 1;
                for (int t = 0; t < T; t++)
                    for (int h = 0; h < H; h++)
                        for (int d = 0; d < DH; d++) {
                            uint8_t g = out[t][h][d];
                            if (t >= tq) { /* padding row */
                                ok &= g == 0x00 && lse[t][h] == -INFINITY;
                                continue;
                            }
                            float y = vals[d % 16] / osc;
                            uint8_t w = of ? lk_f32_to_f8e5m2(y) : lk_f32_to_f8e4m3(y);
                            exact &= isnan(vals[d % 16]) ? f8_is_nan(of, g) : g == w;
                        }
                /* the hand-computed codes of row 0, head 0 */
                const uint8_t *r = out[0][0];
                ok &= of ? r[2] == 0x3c && r[3] == 0xbc : r[0] == 0x38 && r[1] == 0xb8; /* the ties */
                ok &= r[4] == mx && r[5] == (0x80 | mx) && r[6] == mx && r[7] == (0x80 | mx);
                ok &= f8_is_nan(of, r[8]) && r[9] == 0x00;
                ok &= of ? r[11] == 0x01 : r[10] == 0x01; /* 2^-16 (e5m2), 2^-9 (e4m3): the smallest subnormal */
                tu_check(ok && exact, "%s flash_attn_varlen_scaled %s out %s: fp8(v / output_scale) with a true f32 "
                         "division (ties to even where v * (1 / s) rounds up), +-max for values beyond it and +-inf, "
                         "NaN kept, 0 -> 0, subnormals kept; padding rows 0 / lse -inf", lk_isa_name(isas[ii]),
                         lk_dtype_name(ot), prefill ? "prefill" : "decode");
                /* no key: code 0, lse -inf */
                memset(out, 0x55, sizeof out);
                st = lk_flash_attn_varlen_scaled(&to, &tl, &tq_, &tk, &tv, &tcq, &tck0, NULL, NULL, &p, &tos);
                ok = st == LK_OK;
                for (int t = 0; t < T; t++)
                    for (int h = 0; h < H; h++) {
                        ok &= lse[t][h] == -INFINITY;
                        for (int d = 0; d < DH; d++) ok &= out[t][h][d] == 0x00;
                    }
                tu_check(ok, "%s flash_attn_varlen_scaled %s out %s: a row that sees no key gets code 0 and lse -inf",
                         lk_isa_name(isas[ii]), lk_dtype_name(ot), prefill ? "prefill" : "decode");
                /* a NaN score (NaN q) makes the row's codes NaN and its lse NaN */
                float keep = q[0][1][3];
                q[0][1][3] = NAN;
                st = lk_flash_attn_varlen_scaled(&to, &tl, &tq_, &tk, &tv, &tcq, &tck, NULL, NULL, &p, &tos);
                ok = st == LK_OK && isnan(lse[0][1]) && isfinite(lse[0][0]);
                for (int d = 0; d < DH; d++) ok &= f8_is_nan(of, out[0][1][d]);
                q[0][1][3] = keep;
                tu_check(ok, "%s flash_attn_varlen_scaled %s out %s: a NaN score makes the row's codes NaN (lse NaN)",
                         lk_isa_name(isas[ii]), lk_dtype_name(ot), prefill ? "prefill" : "decode");
            }
    }
    lk_set_isa(lk_isa_best());
}

static void test_attention_fp8(void) {
    enum { T = 24, HQ = 4, HK = 2, DH = 128, HQX = 8 };
    static float x_k[T][HK][DH], x_v[T][HK][DH], q[T][HQ][DH], out[T][HQ][DH], qx[T][HQX][DH], outx[T][HQX][DH];
    static uint16_t qb[T][HQX][DH], ob[T][HQX][DH]; /* qx in bf16 (its values are bf16's), a bf16 out */
    static uint8_t kc[T][HK][DH], vc[T][HK][DH];
    tu_seed(303);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < HK; h++)
            for (int d = 0; d < DH; d++) x_k[t][h][d] = (float)tu_uniform(-1, 1), x_v[t][h][d] = (float)tu_uniform(-1, 1);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < HQ; h++)
            for (int d = 0; d < DH; d++) q[t][h][d] = (float)tu_uniform(-1, 1);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < HQX; h++)
            for (int d = 0; d < DH; d++) {
                qb[t][h][d] = lk_f32_to_bf16((float)tu_uniform(-1, 1));
                qx[t][h][d] = lk_bf16_to_f32(qb[t][h][d]);
            }
    /* 2 and 4 query heads per KV head with f32 q and out (the GQA decode loop of AVX2 and
     * AVX-512 takes both, that of avx512bf16 and amx the first), then 4 with bf16 q and out
     * (avx512bf16's decode on bf16 pairs with P rounded to bf16, amx's on tiles: the bound
     * gains P's rounding and the output's, 2^-8 max|v| (1 + u) each) */
    for (int gq = 0; gq < 3; gq++)
    for (int f = 0; f < 2; f++) {
        const int nq = gq ? HQX : HQ, b16 = gq == 2;
        float (*qq)[DH] = gq ? &qx[0][0] : &q[0][0], (*oo)[DH] = gq ? &outx[0][0] : &out[0][0]; /* [T * nq][DH] */
        lk_dtype dt = f ? LK_F8E5M2 : LK_F8E4M3;
        double fpmax = f ? 57344.0 : 448.0, u = f ? 0.125 : 0.0625, tt = f ? ldexp(1, -17) : ldexp(1, -10);
        float s = (float)(1.0 / fpmax); /*  max|x| <= 1 */
        for (int t = 0; t < T; t++)
            for (int h = 0; h < HK; h++)
                for (int d = 0; d < DH; d++) {
                    kc[t][h][d] = f ? lk_f32_to_f8e5m2(x_k[t][h][d] / s) : lk_f32_to_f8e4m3(x_k[t][h][d] / s);
                    vc[t][h][d] = f ? lk_f32_to_f8e5m2(x_v[t][h][d] / s) : lk_f32_to_f8e4m3(x_v[t][h][d] / s);
                }
        for (int decode = 0; decode <= 1; decode++) {
            /* decode: T requests of one query over keys [0, t]; prefill: one causal request */
            int32_t cq[T + 1], ck[T + 1];
            for (int t = 0; t <= T; t++) cq[t] = decode ? t : (t ? T : 0), ck[t] = decode ? 0 : (t ? T : 0);
            int32_t kls[T];
            for (int t = 0; t < T; t++) kls[t] = t + 1;
            lk_tensor tq = b16 ? t3(qb, LK_BF16, T, nq, DH) : t3(qq, LK_F32, T, nq, DH);
            lk_tensor to = b16 ? t3(ob, LK_BF16, T, nq, DH) : t3(oo, LK_F32, T, nq, DH);
            lk_tensor tk = t3(kc, dt, T, HK, DH), tv = t3(vc, dt, T, HK, DH);
            lk_tensor tcq = t1(cq, LK_I32, decode ? T + 1 : 2), tck = t1(ck, LK_I32, decode ? T + 1 : 2);
            /* decode over dense K: request t sees keys [0, t]: cu_seqlens_k can't overlap,
             * so decode goes paged with one page per key */
            int32_t table[T][T], used[T];
            for (int b = 0; b < T; b++) {
                used[b] = kls[b];
                for (int j = 0; j < T; j++) table[b][j] = j;
            }
            lk_tensor pk = lk_tensor_make(kc, dt, 4, (int64_t[]){T, 1, HK, DH});
            lk_tensor pv = lk_tensor_make(vc, dt, 4, (int64_t[]){T, 1, HK, DH});
            lk_tensor tt2 = lk_tensor_make(table, LK_I32, 2, (int64_t[]){T, T}), tu = t1(used, LK_I32, T);
            float sd = s;
            lk_tensor tsd = lk_tensor_make(&sd, LK_F32, 0, NULL);
            lk_attn_params p = lk_attn_params_default(0.125f);
            p.causal = 1, p.k_descale = &tsd, p.v_descale = &tsd;
            for (int ii = 0; ii < ni; ii++) {
                lk_set_isa(isas[ii]);
                lk_status st = decode ? lk_flash_attn_varlen(&to, NULL, &tq, &pk, &pv, &tcq, NULL, &tu, &tt2, &p)
                                      : lk_flash_attn_varlen(&to, NULL, &tq, &tk, &tv, &tcq, &tck, NULL, NULL, &p);
                double worst = 0; /* max err / bound */
                for (int i = 0; i < T && !st; i++)
                    for (int h = 0; h < nq; h++) {
                        int kh = h / (nq / HK), nk = i + 1; /* query i sees keys [0, i] either way */
                        double sc[T], m = -INFINITY, l = 0, delta = 0, vmax = 0;
                        for (int j = 0; j < nk; j++) {
                            double dot = 0, dj = 0;
                            for (int d = 0; d < DH; d++) {
                                dot += (double)qq[i * nq + h][d] * x_k[j][kh][d];
                                dj += fabs(qq[i * nq + h][d]) * (u * fabs(x_k[j][kh][d]) + s * tt);
                            }
                            sc[j] = 0.125 * dot, delta = fmax(delta, 0.125 * dj);
                            m = fmax(m, sc[j]);
                        }
                        for (int j = 0; j < nk; j++) l += exp(sc[j] - m);
                        for (int d = 0; d < DH; d++) {
                            double o = 0;
                            for (int j = 0; j < nk; j++) o += exp(sc[j] - m) / l * x_v[j][kh][d], vmax = fmax(vmax, fabs(x_v[j][kh][d]));
                            double bound = (exp(2 * delta) - 1) * vmax * (1 + u) + u * vmax + s * tt + 3e-5;
                            if (b16) bound += ldexp(1, -8) * vmax * (1 + u);
                            double got = b16 ? lk_bf16_to_f32(ob[i][h][d]) : oo[i * nq + h][d];
                            double e = fabs(got - o) / bound;
                            if (!(e <= worst)) worst = e;
                        }
                    }
                if (getenv("LK_DEBUG")) fprintf(stderr, "worst %g\n", worst);
                tu_check(st == LK_OK && worst <= 1, "%s flash_attn fp8 %s %s, %d q heads per KV head: %s out vs "
                         "float64 on the unquantized values within the fp8 step bound (max err / bound %.3g)",
                         lk_isa_name(isas[ii]), lk_dtype_name(dt), decode ? "decode" : "prefill", nq / HK,
                         b16 ? "bf16 q and" : "f32", worst);
            }
        }
    }
    /* special values (e5m2 caches, per-head descales [HK]) */
    for (int t = 0; t < T; t++)
        for (int h = 0; h < HK; h++)
            for (int d = 0; d < DH; d++) kc[t][h][d] = lk_f32_to_f8e5m2(x_k[t][h][d]), vc[t][h][d] = lk_f32_to_f8e5m2(x_v[t][h][d]);
    kc[3][1][5] = 0x7f;   /* NaN in K of key 3, KV head 1: rows i >= 3 of heads 2, 3 NaN */
    vc[10][0][7] = 0xfe;  /* NaN in V of key 10, KV head 0, dim 7: hidden from queries < 10 */
    kc[20][0][0] = 0x7c;  /* +inf in K of key 20, KV head 0: q . k = +-inf or NaN: rows >= 20 NaN */
    for (int t = 0; t < T; t++) q[t][0][0] = q[t][1][0] = 0.5f; /* q[.][h][0] > 0: inf score, not NaN */
    float kds[HK] = {0.5f, 2.0f}, vds[HK] = {4.0f, 0.25f};
    lk_tensor tkd = t1(kds, LK_F32, HK), tvd = t1(vds, LK_F32, HK);
    int32_t cq[2] = {0, T};
    lk_tensor tq = t3(q, LK_F32, T, HQ, DH), to = t3(out, LK_F32, T, HQ, DH);
    lk_tensor tk = t3(kc, LK_F8E5M2, T, HK, DH), tv = t3(vc, LK_F8E5M2, T, HK, DH), tcq = t1(cq, LK_I32, 2);
    lk_attn_params p = lk_attn_params_default(0.125f);
    p.causal = 1, p.k_descale = &tkd, p.v_descale = &tvd;
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        int ok = lk_flash_attn_varlen(&to, NULL, &tq, &tk, &tv, &tcq, &tcq, NULL, NULL, &p) == LK_OK;
        for (int i = 0; i < T; i++)
            for (int h = 0; h < HQ; h++) {
                int kh = h / 2, nan_row = (kh == 1 && i >= 3) || (kh == 0 && i >= 20);
                for (int d = 0; d < DH; d++) { /* a NaN V value: its dim only */
                    int nan = nan_row || (kh == 0 && i >= 10 && d == 7);
                    int good = nan ? isnan(out[i][h][d]) : isfinite(out[i][h][d]);
                    if (!good && getenv("LK_DEBUG")) fprintf(stderr, "i %d h %d d %d: %g\n", i, h, d, (double)out[i][h][d]);
                    ok &= good;
                }
            }
        /* row 0 sees key 0 only: out = v_descale * v(key 0) exactly */
        for (int h = 0; h < HQ; h++)
            for (int d = 0; d < DH; d++) ok &= out[0][h][d] == vds[h / 2] * lk_f8e5m2_to_f32(vc[0][h / 2][d]);
        tu_check(ok, "%s flash_attn fp8: a NaN K code makes its rows NaN, a hidden key's NaN V code reaches only the "
                 "queries that see it, +inf in K makes rows NaN, the per-head v_descale scales exactly",
                 lk_isa_name(isas[ii]));
    }
}

/* ---------------------------------------------------------------- mla_decode */

/* mla_decode's rules (docs/numerics.md), bf16 (the avx512bf16 ISA's bf16 dot-product
 * path) and f32 data: a NaN q row is NaN (out and lse) and no other row is; a NaN in a
 * used cache entry reaches every row of its request only; NaN / inf in slots past
 * cache_seqlens and in pages no request uses never reach an output; an infinite V
 * value of a key the causal mask hides from query 0 reaches only query 1; 0 cached
 * tokens give out = +0 and lse = -inf; a +inf score makes its row NaN. Then the
 * accuracy of every ISA against ref's f32 out: f32 out within 3e-5, bf16 out within
 * 2^-8 max|v| (P rounded to bf16 on the bf16 path). */
static void test_mla_decode(void) {
    enum { B = 4, SQ = 2, H = 3, DL = 32, DR = 16, E = DL + DR, BS = 8, NB = 9, MAXP = 2 };
    static float qf[B][SQ][H][E], cf[NB][BS][E], of[TU_MAX_ISAS][B][SQ][H][DL], lse[TU_MAX_ISAS][B][H][SQ];
    static uint16_t qb[B][SQ][H][E], cb[NB][BS][E], ob[TU_MAX_ISAS][B][SQ][H][DL];
    int32_t lens[B] = {11, 9, 13, 0}, table[B][MAXP] = {{0, 1}, {2, 3}, {4, 5}, {-1, -1}};
    tu_seed(41);
    for (int p = 0; p < NB; p++)
        for (int j = 0; j < BS; j++)
            for (int e = 0; e < E; e++) {
                int used = p < 6 && (p % 2) * BS + j < lens[p / 2];
                cf[p][j][e] = used ? (float)tu_uniform(-1, 1) : (j % 2 ? NAN : INFINITY);
            }
    for (int b = 0; b < B; b++)
        for (int i = 0; i < SQ; i++)
            for (int h = 0; h < H; h++)
                for (int e = 0; e < E; e++) qf[b][i][h][e] = (float)tu_uniform(-1, 1);
    for (int e = 0; e < E; e++) qf[0][1][2][e] = NAN; /* row (0, 1, 2) */
    cf[2][0][7] = NAN;                                 /* key 0 of request 1 */
    cf[5][4][3] = INFINITY;                            /* last key of request 2 (12): V dim 3 */
    for (int p = 0; p < NB; p++)
        for (int j = 0; j < BS; j++)
            for (int e = 0; e < E; e++) cb[p][j][e] = lk_f32_to_bf16(cf[p][j][e]), cf[p][j][e] = lk_bf16_to_f32(cb[p][j][e]);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < SQ; i++)
            for (int h = 0; h < H; h++)
                for (int e = 0; e < E; e++) qb[b][i][h][e] = lk_f32_to_bf16(qf[b][i][h][e]), qf[b][i][h][e] = lk_bf16_to_f32(qb[b][i][h][e]);
    lk_tensor tt = lk_tensor_make(table, LK_I32, 2, (int64_t[]){B, MAXP}), tl = t1(lens, LK_I32, B);
    lk_mla_decode_params p = lk_mla_decode_params_default(0.25f);
    p.causal = 1;
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        for (int bf = 0; bf < 2; bf++) {
            lk_tensor tq = lk_tensor_make(bf ? (void *)qb : (void *)qf, bf ? LK_BF16 : LK_F32, 4, (int64_t[]){B, SQ, H, E});
            lk_tensor tc = lk_tensor_make(bf ? (void *)cb : (void *)cf, bf ? LK_BF16 : LK_F32, 3, (int64_t[]){NB, BS, E});
            lk_tensor to = lk_tensor_make(bf ? (void *)ob[ii] : (void *)of[ii], bf ? LK_BF16 : LK_F32, 4, (int64_t[]){B, SQ, H, DL});
            lk_tensor tls = lk_tensor_make(lse[ii], LK_F32, 3, (int64_t[]){B, H, SQ});
            int ok = lk_mla_decode(&to, &tls, &tq, &tc, NULL, &tt, &tl, &p) == LK_OK;
            for (int b = 0; b < B; b++)
                for (int i = 0; i < SQ; i++)
                    for (int h = 0; h < H; h++) {
                        int nan_row = (b == 0 && i == 1 && h == 2) || b == 1;
                        float l = lse[ii][b][h][i];
                        /* request 2, query 1 sees the inf entry (K = the entry: its score is
                         * +-inf too, so the row may be NaN); its dim 3 is not finite, the
                         * other dims finite where ref's are (no inf reaching a neighbouring
                         * dim, as a tile product's zero half would carry it) */
                        int inf_row = b == 2 && i == 1;
                        ok &= nan_row ? isnan(l) : b == 3 ? l == -INFINITY : inf_row || isfinite(l);
                        for (int d = 0; d < DL; d++) {
                            float v = bf ? lk_bf16_to_f32(ob[ii][b][i][h][d]) : of[ii][b][i][h][d];
                            float vr = bf ? lk_bf16_to_f32(ob[0][b][i][h][d]) : of[0][b][i][h][d]; /* ref (ii 0) */
                            ok &= nan_row  ? isnan(v)
                                  : inf_row ? (d == 3 ? !isfinite(v) : isfinite(v) == isfinite(vr))
                                  : b == 3  ? is_poszero(v)
                                            : isfinite(v);
                        }
                    }
            tu_check(ok, "%s mla_decode %s: NaN q row / NaN used entry (its request only) are NaN; slots past "
                         "cache_seqlens never read; a causally hidden inf V reaches only the later query; 0 tokens: "
                         "+0 and lse -inf", lk_isa_name(isas[ii]), bf ? "bf16" : "f32");
        }
        /* +inf score: an inf q element against a key dim that is 1 everywhere */
        static float q2[1][1][1][E], c2[1][BS][E], o2[1][1][1][DL], l2[1][1][1];
        for (int e = 0; e < E; e++) q2[0][0][0][e] = e == 0 ? INFINITY : 0.5f;
        for (int j = 0; j < BS; j++)
            for (int e = 0; e < E; e++) c2[0][j][e] = e == 0 ? 1.0f : 0.25f;
        int32_t len2[1] = {5}, tab2[1][1] = {{0}};
        lk_tensor q2t = lk_tensor_make(q2, LK_F32, 4, (int64_t[]){1, 1, 1, E}), c2t = lk_tensor_make(c2, LK_F32, 3, (int64_t[]){1, BS, E});
        lk_tensor o2t = lk_tensor_make(o2, LK_F32, 4, (int64_t[]){1, 1, 1, DL}), l2t = lk_tensor_make(l2, LK_F32, 3, (int64_t[]){1, 1, 1});
        lk_tensor t2t = lk_tensor_make(tab2, LK_I32, 2, (int64_t[]){1, 1}), s2t = t1(len2, LK_I32, 1);
        lk_mla_decode_params p2 = lk_mla_decode_params_default(0.25f);
        int ok = lk_mla_decode(&o2t, &l2t, &q2t, &c2t, NULL, &t2t, &s2t, &p2) == LK_OK && isnan(l2[0][0][0]);
        for (int d = 0; d < DL; d++) ok &= isnan(o2[0][0][0][d]);
        tu_check(ok, "%s mla_decode: a +inf score makes its row NaN", lk_isa_name(isas[ii]));
    }
    /* accuracy against ref's f32 out on the finite rows (isas[0] is ref) */
    for (int ii = 1; ii < ni; ii++) {
        double ef = 0, eb = 0;
        for (int b = 0; b < B; b++)
            for (int i = 0; i < SQ; i++)
                for (int h = 0; h < H; h++)
                    for (int d = 0; d < DL; d++) {
                        float r = of[0][b][i][h][d];
                        if (!isfinite(r) || (b == 2 && i == 1)) continue;
                        double e1 = fabs(of[ii][b][i][h][d] - r) / (1 + fabs(r)), e2 = fabs(lk_bf16_to_f32(ob[ii][b][i][h][d]) - r);
                        if (e1 > ef) ef = e1;
                        if (e2 > eb) eb = e2;
                    }
        tu_check(ef <= 3e-5, "%s mla_decode f32: within 3e-5 of ref (%.3g)", lk_isa_name(isas[ii]), ef);
        tu_check(eb <= 1.0 / 256, "%s mla_decode bf16 out: |out - ref's f32| <= 2^-8 max|v| (%.3g)", lk_isa_name(isas[ii]), eb);
    }
}

/* ---- mla_decode over fp8 latent caches (e4m3 / e5m2, k_scale 0.0625): the same rules
 * for the codes (an fp8 NaN in a used entry reaches its request only; NaN / e5m2 inf
 * codes in slots past cache_seqlens and in unused pages never reach an output; 0 cached
 * tokens: +0 and lse -inf), then every ISA against ref over the same codes: f32 out
 * within 3e-5, bf16 out (the bf16 dot path: the codes exact in bf16) within 2^-8 max|v| */
static void test_mla_decode_fp8(void) {
    enum { B = 4, SQ = 1, H = 16, DL = 32, DR = 32, E = DL + DR, BS = 8, NB = 9, MAXP = 2 };
    static float qf[B][SQ][H][E], of[TU_MAX_ISAS][B][SQ][H][DL], lse[TU_MAX_ISAS][B][H][SQ];
    static uint16_t qb[B][SQ][H][E], ob[TU_MAX_ISAS][B][SQ][H][DL];
    static uint8_t c8[NB][BS][E];
    int32_t lens[B] = {11, 9, 13, 0}, table[B][MAXP] = {{0, 1}, {2, 3}, {4, 5}, {-1, -1}};
    lk_tensor tt = lk_tensor_make(table, LK_I32, 2, (int64_t[]){B, MAXP}), tl = t1(lens, LK_I32, B);
    for (int f = 0; f < 2; f++) {
        lk_dtype dt = f ? LK_F8E5M2 : LK_F8E4M3;
        tu_seed(43 + (uint64_t)f);
        for (int p = 0; p < NB; p++)
            for (int j = 0; j < BS; j++)
                for (int e = 0; e < E; e++) {
                    int used = p < 6 && (p % 2) * BS + j < lens[p / 2];
                    float x = used ? (float)tu_uniform(-1, 1) / 0.0625f : (j % 2 || !f ? NAN : INFINITY);
                    c8[p][j][e] = f ? lk_f32_to_f8e5m2(x) : lk_f32_to_f8e4m3(x);
                }
        c8[2][0][7] = 0x7f; /* a NaN code (both formats) in key 0 of request 1 */
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++)
                for (int e = 0; e < E; e++) qb[b][0][h][e] = lk_f32_to_bf16((float)tu_uniform(-1, 1)), qf[b][0][h][e] = lk_bf16_to_f32(qb[b][0][h][e]);
        lk_mla_decode_params p = lk_mla_decode_params_default(0.25f);
        p.k_scale = 0.0625f;
        for (int ii = 0; ii < ni; ii++) {
            lk_set_isa(isas[ii]);
            for (int bf = 0; bf < 2; bf++) {
                lk_tensor tq = lk_tensor_make(bf ? (void *)qb : (void *)qf, bf ? LK_BF16 : LK_F32, 4, (int64_t[]){B, SQ, H, E});
                lk_tensor tc = lk_tensor_make(c8, dt, 3, (int64_t[]){NB, BS, E});
                lk_tensor to = lk_tensor_make(bf ? (void *)ob[ii] : (void *)of[ii], bf ? LK_BF16 : LK_F32, 4, (int64_t[]){B, SQ, H, DL});
                lk_tensor tls = lk_tensor_make(lse[ii], LK_F32, 3, (int64_t[]){B, H, SQ});
                int ok = lk_mla_decode(&to, &tls, &tq, &tc, NULL, &tt, &tl, &p) == LK_OK;
                for (int b = 0; b < B; b++)
                    for (int h = 0; h < H; h++) {
                        float l = lse[ii][b][h][0];
                        ok &= b == 1 ? isnan(l) : b == 3 ? l == -INFINITY : isfinite(l);
                        for (int d = 0; d < DL; d++) {
                            float v = bf ? lk_bf16_to_f32(ob[ii][b][0][h][d]) : of[ii][b][0][h][d];
                            ok &= b == 1 ? isnan(v) : b == 3 ? is_poszero(v) : isfinite(v);
                        }
                    }
                tu_check(ok, "%s mla_decode %s cache, %s q/out: a NaN code in a used entry reaches its request only; "
                             "codes past cache_seqlens never read; 0 tokens: +0 and lse -inf", lk_isa_name(isas[ii]),
                         lk_dtype_name(dt), bf ? "bf16" : "f32");
            }
        }
        for (int ii = 1; ii < ni; ii++) {
            double ef = 0, eb = 0;
            for (int b = 0; b < B; b++)
                for (int h = 0; h < H; h++)
                    for (int d = 0; d < DL; d++) {
                        float r = of[0][b][0][h][d];
                        if (!isfinite(r)) continue;
                        double e1 = fabs(of[ii][b][0][h][d] - r) / (1 + fabs(r)), e2 = fabs(lk_bf16_to_f32(ob[ii][b][0][h][d]) - r);
                        if (e1 > ef) ef = e1;
                        if (e2 > eb) eb = e2;
                    }
            tu_check(ef <= 3e-5, "%s mla_decode %s cache f32: within 3e-5 of ref (%.3g)", lk_isa_name(isas[ii]), lk_dtype_name(dt), ef);
            tu_check(eb <= 1.0 / 256, "%s mla_decode %s cache bf16 out: |out - ref's f32| <= 2^-8 max|v| (%.3g)",
                     lk_isa_name(isas[ii]), lk_dtype_name(dt), eb);
        }
    }
}

/* ---- mla_decode over an fp8_ds_mla cache (docs/numerics.md "fp8_ds_mla caches"): out and
 * lse bit for bit those of an f32 cache holding the entries' values e = f32(code) * s
 * (latent; one f32 product, computed here) and the bf16 rope values, on each ISA, f32 and
 * bf16 q / out, planned split and split_keys 4 (several chunks per request); on the bf16
 * dot-product path (avx512bf16, bf16 q and out, !lk_cpu_prefer_fma) the same NaN / inf /
 * -inf / +0 pattern and every other value within the path's bound of that f32 cache's
 * (P . V with P s rounded to bf16: 2^-8 max|e|, max|e| = 448 / 256, plus both outs' bf16
 * rounding, 2^-8 |out| each: |a - b| <= 2^-8 (1.75 + 2 |b|) + 1e-6; lse 1e-5 (1 + |b|)). Records: a
 * used key with an inf tile (codes +-0: the write's of a tile holding inf) reads NaN and
 * makes its request's rows NaN and no other's; an all-zero tile with s = FLT_MIN; a tile
 * at the max code; a key the causal mask hides from query 0 with a scale of 1e37 (whose
 * 256 s the x86 path cannot take: the exact load) reaches query 1 only, and so does one
 * with a NaN code (query 1's rows NaN, query 0's finite); NaN codes with
 * NaN / inf scales in slots past cache_seqlens and in pages no request uses are never
 * read; 0 cached tokens: +0 and lse -inf. Then every ISA's f32 out within 3e-5 of ref's
 * (the f32 cache's tolerance, test_mla_decode). */
static void test_ds_mla_decode(void) {
    enum { B = 4, SQ = 2, H = 3, DL = 256, DR = 40, E = DL + DR, EB = DL + DL / 32 + 2 * DR, BS = 8, NB = 9, MAXP = 2 };
    static _Alignas(16) uint8_t rec[NB][BS][EB];
    static float cf[NB][BS][E], qf[B][SQ][H][E], of[2][B][SQ][H][DL], lf[2][B][H][SQ], ref_of[B][SQ][H][DL];
    static uint16_t qb[B][SQ][H][E], ob[2][B][SQ][H][DL];
    static float lb[2][B][H][SQ];
    int32_t lens[B] = {11, 9, 13, 0}, table[B][MAXP] = {{0, 1}, {2, 3}, {4, 5}, {-1, -1}};
    tu_seed(47);
    for (int p = 0; p < NB; p++)
        for (int j = 0; j < BS; j++) {
            uint8_t *e = rec[p][j];
            int used = p < 6 && (p % 2) * BS + j < lens[p / 2];
            for (int d = 0; d < DL; d++) e[d] = used ? (uint8_t)(tu_randint(0, 0x7e) | (int64_t)(tu_rand() & 0x80)) : 0x7f;
            for (int g = 0; g < DL / 128; g++) {
                float sc = used ? (float)tu_uniform(1.0 / 4096, 1.0 / 256) : j % 2 ? NAN : INFINITY;
                memcpy(e + DL + 4 * g, &sc, 4);
            }
            for (int r = 0; r < DR; r++) {
                uint16_t h = used ? lk_f32_to_bf16((float)tu_uniform(-1, 1)) : 0x7fc0;
                memcpy(e + DL + DL / 32 + 2 * r, &h, 2);
            }
        }
    /* key 0 of request 1 (page 2, slot 0): tile 1 as the write stores a tile holding inf */
    float inf = INFINITY, fmin = FLT_MIN, big = 1e37f, sat = 1.0f / 64;
    for (int d = 128; d < 256; d++) rec[2][0][d] = d % 2 ? 0x80 : 0x00;
    memcpy(rec[2][0] + DL + 4, &inf, 4);
    /* key 3 of request 0: tile 0 all zero, s = FLT_MIN; key 4: tile 1 at the max code */
    for (int d = 0; d < 128; d++) rec[0][3][d] = d % 2 ? 0x80 : 0x00;
    memcpy(rec[0][3] + DL, &fmin, 4);
    for (int d = 128; d < 256; d++) rec[0][4][d] = d % 3 ? 0x7e : 0xfe;
    memcpy(rec[0][4] + DL + 4, &sat, 4);
    /* key 12 of request 2 (page 5, slot 4; hidden from query 0): tile 0 scaled 1e37 */
    for (int d = 0; d < 128; d++) rec[5][4][d] = (uint8_t)(tu_randint(0, 0x20) | (int64_t)(tu_rand() & 0x80));
    memcpy(rec[5][4] + DL, &big, 4);
    /* key 10 of request 0 (page 1, slot 2; hidden from query 0): a NaN code in tile 0 */
    rec[1][2][5] = 0x7f;
    /* the f32 cache of the values */
    for (int p = 0; p < NB; p++)
        for (int j = 0; j < BS; j++)
            for (int e = 0; e < E; e++) {
                const uint8_t *r = rec[p][j];
                if (e < DL) {
                    float sc;
                    memcpy(&sc, r + DL + 4 * (e / 128), 4);
                    cf[p][j][e] = lk_f8e4m3_to_f32(r[e]) * sc;
                } else {
                    uint16_t h;
                    memcpy(&h, r + DL + DL / 32 + 2 * (e - DL), 2);
                    cf[p][j][e] = lk_bf16_to_f32(h);
                }
            }
    for (int b = 0; b < B; b++)
        for (int i = 0; i < SQ; i++)
            for (int h = 0; h < H; h++)
                for (int e = 0; e < E; e++)
                    qb[b][i][h][e] = lk_f32_to_bf16((float)tu_uniform(-1, 1)), qf[b][i][h][e] = lk_bf16_to_f32(qb[b][i][h][e]);
    lk_tensor tt = lk_tensor_make(table, LK_I32, 2, (int64_t[]){B, MAXP}), tl = t1(lens, LK_I32, B);
    lk_tensor tds = t3(rec, LK_F8E4M3, NB, BS, EB), tf = t3(cf, LK_F32, NB, BS, E);
    for (int ii = 0; ii < ni; ii++) {
        lk_set_isa(isas[ii]);
        const char *isa = lk_isa_name(isas[ii]);
        for (int split = 0; split < 2; split++)
            for (int bf = 0; bf < 2; bf++) {
                lk_mla_decode_params p = lk_mla_decode_params_default(0.0625f);
                p.causal = 1;
                p.split_keys = split ? 4 : 0;
                lk_tensor tq = lk_tensor_make(bf ? (void *)qb : (void *)qf, bf ? LK_BF16 : LK_F32, 4, (int64_t[]){B, SQ, H, E});
                int st[2];
                for (int c = 0; c < 2; c++) { /* c 0: fp8_ds_mla records, 1: the f32 cache */
                    lk_tensor to = lk_tensor_make(bf ? (void *)ob[c] : (void *)of[c], bf ? LK_BF16 : LK_F32, 4,
                                                  (int64_t[]){B, SQ, H, DL});
                    lk_tensor tls = lk_tensor_make(bf ? (void *)lb[c] : (void *)lf[c], LK_F32, 3, (int64_t[]){B, H, SQ});
                    p.cache_layout = c ? LK_KV_ND : LK_KV_DS_MLA;
                    p.k_scale = c ? 1.0f : 0.0f; /* not read with fp8_ds_mla */
                    st[c] = lk_mla_decode(&to, &tls, &tq, c ? &tf : &tds, NULL, &tt, &tl, &p);
                }
                int bfp = bf && isas[ii] == LK_ISA_AVX512BF16 && !lk_cpu_prefer_fma(); /* the bf16 dot products */
                int same = st[0] == LK_OK && st[1] == LK_OK &&
                           (bf ? !memcmp(ob[0], ob[1], sizeof ob[0]) && !memcmp(lb[0], lb[1], sizeof lb[0])
                               : !memcmp(of[0], of[1], sizeof of[0]) && !memcmp(lf[0], lf[1], sizeof lf[0]));
                if (bfp) {
                    same = st[0] == LK_OK && st[1] == LK_OK;
                    for (int i = 0; i < B * SQ * H * DL; i++) {
                        float x = lk_bf16_to_f32(((uint16_t *)ob[0])[i]), y = lk_bf16_to_f32(((uint16_t *)ob[1])[i]);
                        same &= isfinite(y) ? fabsf(x - y) <= 0x1p-8f * (1.75f + 2 * fabsf(y)) + 1e-6f
                                            : !memcmp(&x, &y, 4) || (isnan(x) && isnan(y));
                    }
                    for (int i = 0; i < B * H * SQ; i++) {
                        float x = ((float *)lb[0])[i], y = ((float *)lb[1])[i];
                        same &= isfinite(y) ? fabsf(x - y) <= 1e-5f * (1 + fabsf(y)) : x == y || (isnan(x) && isnan(y));
                    }
                }
                int ok = st[0] == LK_OK;
                for (int b = 0; b < B; b++)
                    for (int i = 0; i < SQ; i++)
                        for (int h = 0; h < H; h++) {
                            float l = bf ? lb[0][b][h][i] : lf[0][b][h][i];
                            int hidden_big = b == 2 && i == 1; /* sees key 12 */
                            int nan_row = b == 1 || (b == 0 && i == 1); /* sees the inf tile / the NaN code */
                            ok &= nan_row ? isnan(l) : b == 3 ? l == -INFINITY : hidden_big || isfinite(l);
                            for (int d = 0; d < DL; d++) {
                                float v = bf ? lk_bf16_to_f32(ob[0][b][i][h][d]) : of[0][b][i][h][d];
                                ok &= nan_row ? isnan(v) : b == 3 ? is_poszero(v) : hidden_big || isfinite(v);
                            }
                        }
                tu_check(same, "%s mla_decode fp8_ds_mla, %s q / out, %s split: out and lse %s those of an "
                         "f32 cache of the values (%s, %s)", isa, bf ? "bf16" : "f32", split ? "4-key" : "planned",
                         bfp ? "within the bf16 path's bound of" : "bit for bit", lk_status_str(st[0]), lk_status_str(st[1]));
                tu_check(ok, "%s mla_decode fp8_ds_mla, %s q / out, %s split: an inf tile (0 * inf) makes its request's "
                         "rows NaN only; a hidden 1e37-scaled key and a hidden NaN code reach the later query only "
                         "(NaN there); NaN codes / scales past "
                         "cache_seqlens never read; 0 tokens: +0 and lse -inf", isa, bf ? "bf16" : "f32",
                         split ? "4-key" : "planned");
                if (!bf && !split) {
                    if (ii == 0) memcpy(ref_of, of[0], sizeof ref_of);
                    double err = 0;
                    for (int b = 0; b < B; b++)
                        for (int i = 0; i < SQ; i++)
                            for (int h = 0; h < H; h++)
                                for (int d = 0; d < DL; d++) {
                                    float r = ref_of[b][i][h][d];
                                    if (!isfinite(r) || (b == 2 && i == 1)) continue;
                                    double e1 = fabs(of[0][b][i][h][d] - r) / (1 + fabs(r));
                                    if (e1 > err) err = e1;
                                }
                    if (ii > 0)
                        tu_check(err <= 3e-5, "%s mla_decode fp8_ds_mla f32: within 3e-5 of ref (%.3g)", isa, err);
                }
            }
    }
}

/* ---------------------------------------------------------------- across ISAs */

/* "AVX2 vs AVX-512" in docs/numerics.md: the element-wise ops give the same bits on every
 * SIMD ISA (one source, the same operations per element). Random values with specials
 * sprinkled in, every dtype, a row long enough for full vectors and tails of both. */
#define XN 331
static void test_cross_isa(void) {
    if (ni < 3) {
        printf("  note: one SIMD ISA on this CPU: cross-ISA bitwise checks not run (not counted)\n");
        return;
    }
    static const float sp[6] = {NAN, INFINITY, -INFINITY, -0.0f, 1e-40f, -100.0f};
    const lk_dtype dts[3] = {LK_F32, LK_F16, LK_BF16};
    for (int di = 0; di < 3; di++) {
        lk_dtype dt = dts[di];
        int64_t es = lk_dtype_size(dt);
        static unsigned char x[4 * 2 * XN * 4], out[TU_MAX_ISAS][2][4 * XN * 4], mo[TU_MAX_ISAS][4 * 3 * XN * 4];
        static unsigned char sa[4 * 3 * XN * 4], sb[4 * 3 * XN * 4];
        static float la[4 * 3], lb[4 * 3], mlse[TU_MAX_ISAS][4 * 3];
        tu_seed(77 + (uint64_t)di);
        for (int i = 0; i < 4 * 2 * XN; i++)
            lk_store_f(x, dt, i, tu_rand() % 13 == 0 ? sp[tu_rand() % 6] : (float)tu_uniform(-12, 12));
        for (int i = 0; i < 4 * 3 * XN; i++) {
            lk_store_f(sa, dt, i, tu_rand() % 17 == 0 ? sp[tu_rand() % 6] : (float)tu_uniform(-3, 3));
            lk_store_f(sb, dt, i, (float)tu_uniform(-3, 3));
        }
        for (int i = 0; i < 12; i++) la[i] = (float)tu_uniform(-5, 5), lb[i] = i == 5 ? -INFINITY : (float)tu_uniform(-5, 5);
        for (int k = 1; k < ni; k++) {
            lk_set_isa(isas[k]);
            lk_tensor tx = t2(x, dt, 4, 2 * XN);
            for (int op = 0; op < 2; op++) {
                lk_tensor to = t2(out[k - 1][op], dt, 4, XN);
                if (op == 0) lk_silu_and_mul(&to, &tx);
                else lk_gelu_tanh_and_mul(&to, &tx);
            }
            lk_tensor ta = t3(sa, dt, 4, 3, XN), tb = t3(sb, dt, 4, 3, XN), tm = t3(mo[k - 1], dt, 4, 3, XN);
            lk_tensor tla = t2(la, LK_F32, 4, 3), tlb = t2(lb, LK_F32, 4, 3), tml = t2(mlse[k - 1], LK_F32, 4, 3);
            lk_merge_attn_states(&tm, &tml, &ta, &tla, &tb, &tlb);
        }
        for (int k = 2; k < ni; k++) {
            const char *a = lk_isa_name(isas[1]), *b = lk_isa_name(isas[k]);
            for (int op = 0; op < 2; op++) {
                int64_t bad = -1;
                for (int64_t i = 0; i < 4 * XN && bad < 0; i++)
                    if (memcmp(out[0][op] + i * es, out[k - 1][op] + i * es, (size_t)es)) bad = i;
                char why[128] = "";
                if (bad >= 0)
                    snprintf(why, sizeof why, " (element %lld: %g vs %g, gate %g)", (long long)bad,
                             lk_load_f(out[0][op], dt, bad), lk_load_f(out[k - 1][op], dt, bad),
                             lk_load_f(x, dt, bad / XN * 2 * XN + bad % XN));
                tu_check(bad < 0, "%s: %s %s and %s give the same bits%s", lk_dtype_name(dt),
                         op ? "gelu_tanh_and_mul" : "silu_and_mul", a, b, why);
            }
            tu_check(!memcmp(mo[0], mo[k - 1], (size_t)(4 * 3 * XN * es)) && !memcmp(mlse[0], mlse[k - 1], sizeof mlse[0]),
                     "%s: merge_attn_states out and out_lse, %s and %s give the same bits", lk_dtype_name(dt), a, b);
        }
    }
}

/* the bf16 rows' attention and mla_decode with lk_cpu_prefer_fma's other choice */
static void attention_other_fma_form(void) {
    ni = tu_isas(isas); /* ref and the bf16 rows */
    test_attention_bf16();
    test_attention_bf16_decode();
    test_mla_decode();
    test_mla_decode_fp8();
    test_ds_mla_decode();
}

int main(void) {
    tu_init();
    ni = tu_isas(isas);
    test_rms_norm();
    test_fused();
    test_act();
    test_act_ext();
    test_block_bits();
    test_rotary();
    test_copies();
    test_fp8_cache();
    test_fp8_ops(); /* fp8 cache operators */
    test_mla_rope();
    test_ds_mla_cache(); /* fp8_ds_mla write and gather */
    test_fp8_act();
    test_fp8_group();
    test_fp8_norm_block();
    test_act_quant();
    test_fp8_static_grid();
    test_int8_act();
    test_merge();
    test_softmax();
    test_attention();
    test_attention_page_tail();
    test_attention_bf16();
    test_attention_bf16_decode();
    tu_other_fma_form(attention_other_fma_form);
    ni = tu_isas(isas);
    test_attention_fp8();
    test_attention_fp8_out();
    test_mla();
    test_mla_fp8();
    test_mla_decode();
    test_mla_decode_fp8();
    test_ds_mla_decode();
    test_cross_isa();
    lk_set_isa(lk_isa_best());
    return tu_finish("test_numerics");
}
