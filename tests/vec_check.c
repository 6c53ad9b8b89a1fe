/*
 * The vector layer (src/cpu/vec/lkv.h) of one ISA against the scalar code: compiled once
 * per vector ISA with that ISA's flags and macro, like the SIMD sources, into the test
 * binary test_vec_<isa> (tests/vec_main.c runs it only where the CPU has the ISA).
 *
 *  - typed stores (f16, bf16: round to nearest even, NaN quieted) equal src/core/half.h
 *    on 17M f32 patterns, and the hardware F16C conversion; loads on every 16-bit pattern
 *  - fp8 (e4m3fn, e5m2): lkv_load on all 256 codes, lkv_store on 17M f32 patterns, on every
 *    rounding midpoint between adjacent codes and its two f32 neighbours, and on the
 *    specials, all bit-identical to src/core/fp8.h
 *  - tails: lkv_store_part writes exactly n elements, lkv_load_part zero-fills
 *  - exp, exp_nonan, exp_nonpos: accuracy over the f32 range, special values, and
 *    exp_nonpos bit-identical to exp for x <= 0
 *  - bf16 even / odd split and join, the _nonan rounding
 *  - deinterleave / interleave / pair_order, store2, transpose, reductions, masks
 *  - x86's fp8 pieces through f16 words: lkv_load2_f8_raw on all 256 codes at every
 *    position of its 2W, its NaN fold / lkv_e4m3_nan_found on every byte value,
 *    lkv_hsum4_store
 *  - builds with bf16 dot products (LKV_BF16DOT): lkv_dot2 against exact products,
 *    lkv_bf16_pack_rne against the scalar rounding, lkv_zip16, lkv_bits_load16
 *  - AMX builds (LKV_AMX): lkv_amx_load_config's rows and bytes per row reach the tiles
 *    (a tile store writes exactly rows x colsb bytes) and TDPBF16PS of such tiles equals
 *    the exact products
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/fp8.h"
#include "cpu/vec/lkv.h"
#include "testutil.h"

#define W LKV_W

static float randf(void) { return lk_bits_f32((uint32_t)tu_rand()); }

static void conversions(void) {
    int bad_bf = 0, bad_f16 = 0, bad_hw = 0, bad_nonan = 0;
    for (uint64_t k = 0; k < (1ull << 32); k += (uint64_t)W * 251) {
        float v[W];
        for (int j = 0; j < W; j++) v[j] = lk_bits_f32((uint32_t)(k + (uint64_t)j * 0x2000003u));
        lkv_f32 x = lkv_loadu(v);
        uint16_t hb[W], hf[W];
        uint32_t nb[W];
        lkv_store(hb, LK_BF16, x);
        lkv_store(hf, LK_F16, x);
        lkv_storeu((float *)nb, lkv_as_f32(lkv_bf16_bits_nonan(x)));
        for (int j = 0; j < W; j++) {
            if (hb[j] != lk_f32_to_bf16(v[j])) bad_bf++;
            if (hf[j] != lk_f32_to_f16(v[j])) bad_f16++;
            if (!isnan(v[j]) && nb[j] != lk_f32_to_bf16(v[j])) bad_nonan++;
        }
        uint16_t hw[W];
        lkv_store_f16(hw, x); /* the F16C / AVX-512 converter itself */
        for (int j = 0; j < W; j++) bad_hw += hw[j] != lk_f32_to_f16(v[j]);
    }
    tu_check(bad_hw == 0, "f16 hardware conversion equals the scalar f32 -> f16 on 17M patterns (%d bad)", bad_hw);
    tu_check(bad_f16 == 0, "lkv_store f16 equals scalar (%d bad)", bad_f16);
    tu_check(bad_bf == 0, "lkv_store bf16 equals scalar, NaNs quieted (%d bad)", bad_bf);
    tu_check(bad_nonan == 0, "lkv_bf16_bits_nonan equals scalar on every non-NaN (%d bad)", bad_nonan);
    int bad_load = 0;
    for (uint32_t h = 0; h < 65536; h += W) {
        uint16_t in[W];
        float out[W];
        for (int j = 0; j < W; j++) in[j] = (uint16_t)(h + (uint32_t)j);
        lkv_storeu(out, lkv_load(in, LK_F16));
        for (int j = 0; j < W; j++) {
            float s = lk_f16_to_f32(in[j]);
            bad_load += memcmp(&s, &out[j], 4) != 0; /* bit-exact, NaNs included */
        }
        lkv_storeu(out, lkv_load(in, LK_BF16));
        for (int j = 0; j < W; j++) {
            float s = lk_bf16_to_f32(in[j]);
            bad_load += memcmp(&s, &out[j], 4) != 0;
        }
    }
    tu_check(bad_load == 0, "lkv_load f16 / bf16 equal scalar on all 16-bit patterns (%d bad)", bad_load);
}

static uint8_t f8_ref(float v, lk_dtype dt) { return dt == LK_F8E4M3 ? lk_f32_to_f8e4m3(v) : lk_f32_to_f8e5m2(v); }
static float f8_val(uint8_t c, lk_dtype dt) { return dt == LK_F8E4M3 ? lk_f8e4m3_to_f32(c) : lk_f8e5m2_to_f32(c); }

/* stores of W values (v[0, W)) compared with the scalar converter; the count of bad lanes */
static int f8_store_bad(const float *v, lk_dtype dt) {
    uint8_t q[W];
    if (dt == LK_F8E4M3) lkv_store(q, LK_F8E4M3, lkv_loadu(v)); /* literal dtypes, as kernels call it */
    else lkv_store(q, LK_F8E5M2, lkv_loadu(v));
    int bad = 0;
    for (int j = 0; j < W; j++) bad += q[j] != f8_ref(v[j], dt);
    return bad;
}

static void fp8(void) {
    const lk_dtype dts[2] = {LK_F8E4M3, LK_F8E5M2};
    for (int t = 0; t < 2; t++) {
        lk_dtype dt = dts[t];
        const char *nm = dt == LK_F8E4M3 ? "e4m3fn" : "e5m2";
        int bad_load = 0, bad_sweep = 0, bad_mid = 0, bad_spec = 0;
        for (int c = 0; c < 256; c += W) {
            uint8_t in[W];
            float out[W];
            for (int j = 0; j < W; j++) in[j] = (uint8_t)(c + j);
            lkv_storeu(out, dt == LK_F8E4M3 ? lkv_load(in, LK_F8E4M3) : lkv_load(in, LK_F8E5M2));
            for (int j = 0; j < W; j++) {
                float s = f8_val(in[j], dt);
                bad_load += memcmp(&s, &out[j], 4) != 0; /* bit-exact, NaN payloads included */
            }
        }
        for (uint64_t k = 0; k < (1ull << 32); k += (uint64_t)W * 251) {
            float v[W];
            for (int j = 0; j < W; j++) v[j] = lk_bits_f32((uint32_t)(k + (uint64_t)j * 0x2000003u));
            bad_sweep += f8_store_bad(v, dt);
        }
        /* every midpoint between adjacent non-negative finite codes (and beyond the max:
         * the midpoint to the next step), both signs, and its f32 neighbours */
        float buf[W];
        int n = 0;
        uint8_t maxc = dt == LK_F8E4M3 ? 0x7e : 0x7b;
        for (int c = 0; c <= maxc; c++) {
            float lo = f8_val((uint8_t)c, dt);
            float hi = c < maxc ? f8_val((uint8_t)(c + 1), dt) : lo + (lo - f8_val((uint8_t)(c - 1), dt));
            float mid = (float)(((double)lo + (double)hi) / 2);
            const float cand[6] = {mid, nextafterf(mid, 0.0f), nextafterf(mid, INFINITY), -mid,
                                   -nextafterf(mid, 0.0f), -nextafterf(mid, INFINITY)};
            for (int i = 0; i < 6; i++) {
                buf[n++] = cand[i];
                if (n == W) bad_mid += f8_store_bad(buf, dt), n = 0;
            }
        }
        for (; n > 0 && n < W; n++) buf[n] = 0.0f;
        if (n) bad_mid += f8_store_bad(buf, dt);
        const float spec[16] = {0.0f,     -0.0f,     INFINITY,  -INFINITY,    NAN,     -NAN,     FLT_MAX, -FLT_MAX,
                                FLT_MIN,  -FLT_MIN,  1e-45f,    -1e-45f,      448.0f,  464.0f,   57344.0f, 61440.0f};
        for (int i = 0; i < 16; i += W < 16 ? W : 16) bad_spec += f8_store_bad(spec + i, dt);
        tu_check(bad_load == 0, "lkv_load %s equals the scalar converter on all 256 codes (%d bad)", nm, bad_load);
        tu_check(bad_sweep == 0, "lkv_store %s equals the scalar converter on 17M f32 patterns (%d bad)", nm, bad_sweep);
        tu_check(bad_mid == 0, "lkv_store %s: every rounding midpoint and its f32 neighbours (%d bad)", nm, bad_mid);
        tu_check(bad_spec == 0, "lkv_store %s: zeros, inf, NaN, FLT_MAX, FLT_MIN, f32 subnormals, saturation (%d bad)",
                 nm, bad_spec);
    }
}

static void tails(void) {
    int ok = 1;
    const lk_dtype dts[5] = {LK_F32, LK_F16, LK_BF16, LK_F8E4M3, LK_F8E5M2};
    for (int t = 0; t < 5; t++)
        for (int n = 0; n <= W; n++) {
            unsigned char buf[4 * W + 8], in[4 * W];
            memset(buf, 0xab, sizeof buf);
            int64_t es = lk_esize(dts[t]);
            lkv_store_part(buf, dts[t], lkv_set1(1.0f), n);
            for (int64_t j = 0; j < (int64_t)sizeof buf; j++)
                if (j >= n * es) ok &= buf[j] == 0xab;
            for (int j = 0; j < n; j++) ok &= lk_load_f(buf, dts[t], j) == 1.0f;
            for (int j = 0; j < 4 * W; j++) in[j] = (unsigned char)(0x3c + (j & 1));
            float out[W];
            lkv_storeu(out, lkv_load_part(in, dts[t], n));
            for (int j = 0; j < W; j++) ok &= j < n ? out[j] == lk_load_f(in, dts[t], j) : out[j] == 0.0f;
        }
    tu_check(ok, "lkv_store_part writes exactly n elements, lkv_load_part zero-fills (every dtype, n = 0..W)");
}

static void exps(void) {
    double worst = 0, worst_nonan = 0;
    int bitdiff = 0;
    for (double x = -87.0; x <= 88.5; x += 0.0137) {
        float v[W], u[W], xs = (float)x;
        lkv_storeu(v, lkv_exp(lkv_set1(xs)));
        lkv_storeu(u, lkv_exp_nonan(lkv_set1(xs)));
        double want = exp((double)xs), e = fabs(v[0] - want) / want, en = fabs(u[0] - want) / want;
        if (e > worst) worst = e;
        if (en > worst_nonan) worst_nonan = en;
        if (xs <= 0) {
            float p[W];
            lkv_storeu(p, lkv_exp_nonpos(lkv_set1(xs)));
            bitdiff += memcmp(p, v, sizeof p) != 0;
        }
    }
    tu_check(worst < 4e-7, "lkv_exp max relative error %.3g over [-87, 88.5]", worst);
    tu_check(worst_nonan < 4e-7, "lkv_exp_nonan max relative error %.3g over [-87, 88.5]", worst_nonan);
    tu_check(bitdiff == 0, "lkv_exp_nonpos bit-identical to lkv_exp on [-87, 0] (%d differ)", bitdiff);
    float sp[8] = {-INFINITY, INFINITY, NAN, -100.0f, 100.0f, 0.0f, -0.0f, 88.72f}, in[W], v[W > 8 ? W : 8], t[W];
    for (int c = 0; c < 8; c += W) { /* the 8 values W at a time (W = 4: two vectors) */
        for (int j = 0; j < W; j++) in[j] = sp[(c + j) % 8];
        lkv_storeu(t, lkv_exp(lkv_loadu(in)));
        memcpy(v + c, t, sizeof t);
    }
    int bad = (v[0] != 0.0f) + (v[1] != INFINITY) + !isnan(v[2]) + (v[3] != 0.0f) + (v[4] != INFINITY) +
              (v[5] != 1.0f || v[6] != 1.0f) + !(fabs(v[7] - exp((double)sp[7])) / exp((double)sp[7]) < 1e-6);
    tu_check(bad == 0, "lkv_exp specials: exp(-inf)=0 exp(inf)=inf NaN, under/overflow (%g %g %g %g %g %g)", v[0],
             v[1], v[2], v[3], v[4], v[7]);
    float np[4] = {-INFINITY, -87.4f, -0.0f, -200.0f};
    for (int j = 0; j < W; j++) in[j] = np[j % 4];
    lkv_storeu(v, lkv_exp_nonpos(lkv_loadu(in)));
    tu_check(v[0] == 0.0f && v[1] == 0.0f && v[2] == 1.0f && v[3] == 0.0f, "lkv_exp_nonpos: -inf and < -87.3 give 0");
}

static void bf16_orders(void) {
    int ok_split = 1, ok_join = 1, ok_exact = 1;
    for (int rep = 0; rep < 2000; rep++) {
        uint16_t h[2 * W], back[2 * W];
        for (int j = 0; j < 2 * W; j++) h[j] = (uint16_t)tu_rand();
        lkv_f32 e, o;
        lkv_bf16_load_eo(h, &e, &o);
        float ev[W], ov[W];
        lkv_storeu(ev, e), lkv_storeu(ov, o);
        for (int j = 0; j < W; j++)
            ok_split &= lk_f32_bits(ev[j]) == (uint32_t)h[2 * j] << 16 && lk_f32_bits(ov[j]) == (uint32_t)h[2 * j + 1] << 16;
        lkv_bf16_store_eo_nonan(back, e, o, 0); /* bf16 values, NaNs of bf16 inputs included */
        ok_exact &= !memcmp(back, h, sizeof h);
        /* any f32 values but NaN: the join rounds them like lk_f32_to_bf16 */
        float fe[W], fo[W];
        for (int j = 0; j < W; j++) {
            do fe[j] = randf(); while (isnan(fe[j]));
            do fo[j] = randf(); while (isnan(fo[j]));
        }
        lkv_bf16_store_eo_nonan(back, lkv_loadu(fe), lkv_loadu(fo), 0);
        for (int j = 0; j < W; j++) ok_join &= back[2 * j] == lk_f32_to_bf16(fe[j]) && back[2 * j + 1] == lk_f32_to_bf16(fo[j]);
    }
    tu_check(ok_split, "lkv_bf16_split: element 2i / 2i + 1 in lane i of even / odd");
    tu_check(ok_exact, "lkv_bf16_join_nonan inverts the split bit for bit (random bf16 bits, NaNs included)");
    tu_check(ok_join, "lkv_bf16_join_nonan rounds like lk_f32_to_bf16 (non-NaN values)");
}

static void shuffles(void) {
    float v[2 * W], x[W], y[W], xo[W], yo[W], b0[W], b1[W];
    for (int j = 0; j < 2 * W; j++) v[j] = (float)j;
    for (int j = 0; j < W; j++) xo[j] = (float)(2 * j), yo[j] = (float)(2 * j + 1);
    lkv_f32 vx, vy;
    lkv_deinterleave(lkv_loadu(v), lkv_loadu(v + W), &vx, &vy);
    lkv_storeu(x, vx), lkv_storeu(y, vy);
    lkv_storeu(b0, lkv_pair_order(lkv_loadu(xo)));
    lkv_storeu(b1, lkv_pair_order(lkv_loadu(yo)));
    int ok = !memcmp(x, b0, sizeof x) && !memcmp(y, b1, sizeof y);
    tu_check(ok, "lkv_deinterleave gives the even / odd elements in lkv_pair_order");
    lkv_f32 w0, w1;
    lkv_interleave(vx, vy, &w0, &w1);
    float r[2 * W];
    lkv_storeu(r, w0), lkv_storeu(r + W, w1);
    tu_check(!memcmp(r, v, sizeof r), "lkv_interleave inverts lkv_deinterleave");
    const lk_dtype dts[3] = {LK_F32, LK_F16, LK_BF16};
    int ok2 = 1;
    for (int t = 0; t < 3; t++) {
        float a[W], b[W];
        for (int j = 0; j < W; j++) a[j] = randf(), b[j] = randf();
        unsigned char p1[8 * W], p2[8 * W];
        memset(p1, 0, sizeof p1), memset(p2, 0, sizeof p2);
        int64_t es = lk_esize(dts[t]);
        lkv_store2(p1, p1 + 4 * W, dts[t], lkv_loadu(a), lkv_loadu(b));
        lkv_store(p2, dts[t], lkv_loadu(a));
        lkv_store(p2 + 4 * W, dts[t], lkv_loadu(b));
        ok2 &= !memcmp(p1, p2, sizeof p1) && es > 0;
    }
    tu_check(ok2, "lkv_store2 equals two lkv_store (every dtype)");
    float m[W][W];
    lkv_f32 rows[W];
    for (int i = 0; i < W; i++) {
        for (int j = 0; j < W; j++) m[i][j] = (float)(i * W + j);
        rows[i] = lkv_loadu(m[i]);
    }
    lkv_transpose(rows);
    int ok3 = 1;
    for (int i = 0; i < W; i++) {
        float t[W];
        lkv_storeu(t, rows[i]);
        for (int j = 0; j < W; j++) ok3 &= t[j] == m[j][i];
    }
    tu_check(ok3, "lkv_transpose (%d x %d)", W, W);
}

static void lanes(void) {
    float v[W], s = 0, mx = -INFINITY;
    for (int j = 0; j < W; j++) v[j] = (float)(j * 3 % 7) - 2.5f, s += v[j], mx = v[j] > mx ? v[j] : mx;
    lkv_f32 x = lkv_loadu(v);
    tu_check(lkv_hsum(x) == s && lkv_hmax(x) == mx, "lkv_hsum / lkv_hmax");
    int ok = 1;
    for (int n = 0; n <= W; n++) {
        float t[W], z[W];
        lkv_storeu(t, lkv_blend(lkv_zero(), lkv_set1(1.0f), lkv_m_first(n)));
        lkv_storeu(z, lkv_zero_where(lkv_m_first(n), lkv_set1(2.0f)));
        for (int j = 0; j < W; j++) ok &= t[j] == (j < n ? 1.0f : 0.0f) && z[j] == (j < n ? 0.0f : 2.0f);
        ok &= lkv_m_any(lkv_m_first(n)) == (n > 0);
    }
    tu_check(ok, "lkv_m_first / lkv_blend / lkv_zero_where / lkv_m_any");
    float nn[W];
    for (int j = 0; j < W; j++) nn[j] = j == W - 1 ? NAN : 1.0f;
    tu_check(lkv_m_any(lkv_unord(lkv_loadu(nn), lkv_loadu(nn))) && !lkv_m_any(lkv_unord(x, x)), "lkv_unord");
    float mm[W];
    lkv_storeu(mm, lkv_max(lkv_loadu(nn), lkv_set1(-1.0f)));
    tu_check(mm[W - 1] == -1.0f && mm[0] == 1.0f, "lkv_max(a, b) returns b where a is NaN");
#if defined(LKV_AVX512)
    /* lkv_hsum's tree (halves, quarters, pairs) and lkv_hsum4 = four lkv_hsum, bit for bit,
     * on values of mixed magnitude (where the order of the additions shows) */
    int ok_tree = 1, ok4 = 1;
    for (int it = 0; it < 2000; it++) {
        float a[4][16], r[4];
        for (int g = 0; g < 4; g++)
            for (int j = 0; j < 16; j++) a[g][j] = ldexpf((float)(tu_rand() % 2001) - 1000.0f, (int)(tu_rand() % 40) - 20);
        float t[8], u[4];
        for (int j = 0; j < 8; j++) t[j] = a[0][j] + a[0][j + 8];
        for (int j = 0; j < 4; j++) u[j] = t[j] + t[j + 4];
        ok_tree &= lkv_hsum(lkv_loadu(a[0])) == (u[0] + u[2]) + (u[1] + u[3]);
        _mm_storeu_ps(r, lkv_hsum4(lkv_loadu(a[0]), lkv_loadu(a[1]), lkv_loadu(a[2]), lkv_loadu(a[3])));
        for (int g = 0; g < 4; g++) ok4 &= r[g] == lkv_hsum(lkv_loadu(a[g]));
    }
    tu_check(ok_tree, "lkv_hsum adds halves, then quarters, then pairs");
    tu_check(ok4, "lkv_hsum4 gives four lkv_hsum bit for bit");
#endif
}

#if defined(LKV_BF16DOT)
/* a random normal bf16 value (no denormals: the dot-product instructions read them as 0) */
static uint16_t rand_bf16(void) {
    uint16_t h;
    do h = (uint16_t)tu_rand();
    while (((h >> 7) & 0xff) == 0 || ((h >> 7) & 0xff) > 0x8f || ((h >> 7) & 0xff) < 0x70);
    return h;
}

static void bf16_dot(void) {
    int ok_dot = 1, ok_pack = 1, ok_zip = 1, ok_part = 1;
    for (int rep = 0; rep < 4000; rep++) {
        uint16_t a[2 * W], b[2 * W];
        float acc[W], got[W];
        for (int j = 0; j < 2 * W; j++) a[j] = rand_bf16(), b[j] = rand_bf16();
        for (int j = 0; j < W; j++) acc[j] = (float)tu_uniform(-4, 4);
        lkv_storeu(got, lkv_dot2(lkv_loadu(acc), lkv_bits_loadu(a), lkv_bits_loadu(b)));
        for (int j = 0; j < W; j++) {
            double p0 = (double)lk_bf16_to_f32(a[2 * j]) * lk_bf16_to_f32(b[2 * j]);
            double p1 = (double)lk_bf16_to_f32(a[2 * j + 1]) * lk_bf16_to_f32(b[2 * j + 1]);
            double want = acc[j] + p0 + p1, mag = fabs(acc[j]) + fabs(p0) + fabs(p1);
            ok_dot &= fabs(got[j] - want) <= 2.4e-7 * mag; /* two f32 roundings at most */
        }
        float lo[W], hi[W];
        for (int j = 0; j < W; j++) {
            do lo[j] = randf(); while (!isnormal(lo[j]));
            do hi[j] = randf(); while (!isnormal(hi[j]));
        }
        uint16_t pk[2 * W];
        lkv_bits_storeu(pk, lkv_bf16_pack_rne(lkv_loadu(lo), lkv_loadu(hi)));
        for (int j = 0; j < W; j++) {
            uint16_t wl = lk_f32_to_bf16(lo[j]), wh = lk_f32_to_bf16(hi[j]);
            /* a value that rounds into the subnormals is flushed by the instruction */
            if ((wl & 0x7f80) && (wl & 0x7f80) != 0x7f80) ok_pack &= pk[j] == wl;
            if ((wh & 0x7f80) && (wh & 0x7f80) != 0x7f80) ok_pack &= pk[W + j] == wh;
        }
        uint16_t z[4 * W];
        lkv_bits zl, zh;
        lkv_zip16(lkv_bits_loadu(a), lkv_bits_loadu(b), &zl, &zh);
        lkv_bits_storeu(z, zl), lkv_bits_storeu(z + 2 * W, zh);
        for (int j = 0; j < 2 * W; j++) ok_zip &= z[2 * j] == a[j] && z[2 * j + 1] == b[j];
        int n = (int)(tu_rand() % (2 * W + 1));
        uint16_t part[2 * W];
        lkv_bits_storeu(part, lkv_bits_load16(a, n));
        for (int j = 0; j < 2 * W; j++) ok_part &= part[j] == (j < n ? a[j] : 0);
    }
    tu_check(ok_dot, "lkv_dot2 = acc + two exact bf16 products, within two f32 roundings");
    tu_check(ok_pack, "lkv_bf16_pack_rne rounds like lk_f32_to_bf16 (normal results), in order lo | hi");
    int bad_f8 = 0;
    for (int t = 0; t < 2; t++)
        for (int c0 = 0; c0 < 256; c0 += 32) {
            uint8_t codes[32];
            uint16_t got[32];
            for (int j = 0; j < 32; j++) codes[j] = (uint8_t)(c0 + ((j * 7) & 31)); /* a permuted block */
            __m256i cv = _mm256_loadu_si256((const __m256i *)codes);
            lkv_bits_storeu(got, t ? lkv_f8_to_bf16(cv, LK_F8E5M2) : lkv_f8_to_bf16(cv, LK_F8E4M3));
            for (int j = 0; j < 32; j++)
                bad_f8 += got[j] != lk_f32_to_bf16(t ? lk_f8e5m2_to_f32(codes[j]) : lk_f8e4m3_to_f32(codes[j]));
        }
    int bad_x2 = 0;
    for (int t = 0; t < 2; t++)
        for (int c0 = 0; c0 < 256; c0 += 64) {
            uint8_t codes[64];
            uint16_t got[64];
            for (int j = 0; j < 64; j++) codes[j] = (uint8_t)(c0 + ((j * 23) & 63));
            lkv_bits w0, w1;
            lkv_f8_to_bf16_x2(_mm512_loadu_si512(codes), t ? LK_F8E5M2 : LK_F8E4M3, &w0, &w1);
            lkv_bits_storeu(got, w0), lkv_bits_storeu(got + 32, w1);
            for (int v = 0; v < 2; v++)
                for (int L = 0; L < 4; L++)
                    for (int i = 0; i < 8; i++) {
                        uint8_t code = codes[16 * L + 8 * v + i];
                        bad_x2 += got[32 * v + 8 * L + i] !=
                                  lk_f32_to_bf16(t ? lk_f8e5m2_to_f32(code) : lk_f8e4m3_to_f32(code));
                    }
        }
    tu_check(bad_x2 == 0, "lkv_f8_to_bf16_x2 gives the exact bf16 values of 64 codes in the in-lane unpack "
             "order, all 256 codes of both formats (%d bad)", bad_x2);
    tu_check(bad_f8 == 0, "lkv_f8_to_bf16 equals lk_f32_to_bf16 of the scalar fp8 converters on all 256 codes of "
             "e4m3fn and e5m2, in order (%d bad)", bad_f8);
    tu_check(ok_zip, "lkv_zip16 interleaves the 16-bit values of two vectors");
    tu_check(ok_part, "lkv_bits_load16 loads n 16-bit values and zeroes the rest");
}
#endif

#if defined(LKV_AVX2) || defined(LKV_AVX512)
/* x86's fp8 pieces through f16 words: lkv_load2_f8_raw on all 256 codes at every position of its 2W
 * (e5m2 exact, e4m3 value / 256, its NaN code as +-1.875), lkv_load2_f8_raw's NaN fold
 * and lkv_e4m3_nan_found on every byte value at every position, lkv_hsum4_store */
static void f8_f16c(void) {
    int bad_raw = 0, bad_nan = 0, any_ok = 1;
    for (int t = 0; t < 2; t++)
        for (int c = 0; c < 256; c++) { /* code c + 37 j at position j: every code at every position */
            uint8_t in[2 * W];
            float out[2 * W];
            for (int j = 0; j < 2 * W; j++) in[j] = (uint8_t)(c + 37 * j);
            lkv_f32 x, y;
            lkv_load2_f8_raw(in, t ? LK_F8E5M2 : LK_F8E4M3, &x, &y, NULL);
            lkv_storeu(out, x), lkv_storeu(out + W, y);
            for (int j = 0; j < 2 * W; j++) {
                float want = t ? lk_f8e5m2_to_f32(in[j]) : lk_f8e4m3_to_f32(in[j]) / 256.0f;
                if (!t && (in[j] & 0x7f) == 0x7f) want = in[j] & 0x80 ? -1.875f : 1.875f;
                bad_raw += isnan(want) ? !isnan(out[j]) : memcmp(&want, &out[j], 4) != 0;
            }
        }
    for (int c = 0; c < 256; c += 2 * W) { /* each group of 2W codes alone, and folded after a clean one */
        uint8_t in[2 * W], clean[2 * W];
        int any = 0;
        for (int j = 0; j < 2 * W; j++) {
            in[j] = (uint8_t)(c + ((j * 13) & (2 * W - 1)));
            clean[j] = (uint8_t)(j * 7 % 0x7f); /* never 0x7f */
            any |= (in[j] & 0x7f) == 0x7f;
        }
        lkv_f32 x, y;
        lkv_c32 alone = lkv_c32_zero(), after = lkv_c32_zero(), none = lkv_c32_zero();
        lkv_load2_f8_raw(in, LK_F8E4M3, &x, &y, &alone);
        lkv_load2_f8_raw(clean, LK_F8E4M3, &x, &y, &after);
        lkv_load2_f8_raw(in, LK_F8E4M3, &x, &y, &after);
        lkv_load2_f8_raw(clean, LK_F8E4M3, &x, &y, &none);
        bad_nan += lkv_e4m3_nan_found(alone) != any;
        bad_nan += lkv_e4m3_nan_found(after) != any;
        bad_nan += lkv_e4m3_nan_found(none) != 0;
    }
    for (int b = 0; b < 256; b++) { /* every byte value at every position, values as without the fold */
        uint8_t in[2 * W] = {0};
        in[b % (2 * W)] = (uint8_t)b;
        lkv_f32 x, y, x0, y0;
        lkv_c32 acc = lkv_c32_zero();
        lkv_load2_f8_raw(in, LK_F8E4M3, &x, &y, &acc);
        lkv_load2_f8_raw(in, LK_F8E4M3, &x0, &y0, NULL);
        float v[4][W];
        lkv_storeu(v[0], x), lkv_storeu(v[1], y), lkv_storeu(v[2], x0), lkv_storeu(v[3], y0);
        any_ok &= lkv_e4m3_nan_found(acc) == ((b & 0x7f) == 0x7f) && memcmp(v[0], v[2], sizeof v[0] * 2) == 0;
    }
    float a[4][W], s[4];
    for (int g = 0; g < 4; g++)
        for (int j = 0; j < W; j++) a[g][j] = (float)(tu_rand() % 1000) - 500.0f; /* exact sums */
    lkv_hsum4_store(s, 0.5f, lkv_loadu(a[0]), lkv_loadu(a[1]), lkv_loadu(a[2]), lkv_loadu(a[3]));
    int ok_h = 1;
    for (int g = 0; g < 4; g++) {
        float want = 0;
        for (int j = 0; j < W; j++) want += a[g][j];
        ok_h &= s[g] == 0.5f * want;
    }
    tu_check(bad_raw == 0, "lkv_load2_f8_raw: e5m2 exact, e4m3 value / 256 and its NaN code +-1.875, all 256 codes "
             "at every position (%d bad)", bad_raw);
    tu_check(bad_nan == 0 && any_ok,
             "lkv_load2_f8_raw's fold / lkv_e4m3_nan_found find exactly the codes 0x7f and 0xff, the "
             "values the same with and without the fold (%d bad)",
             bad_nan);
    tu_check(ok_h, "lkv_hsum4_store: s times the lane sums of four vectors, in order");
}
#endif

#if defined(LKV_AMX)
/* tiles configured in a function of their own, as the kernels do (cfg a local): for
 * rows r and bytes per row cb, tile 0 = tile 1 . tile 2 (A: r x cb, B: cb / 4 pairs x 16
 * columns, C: r x 64 bytes) stored over a sentinel, and tile 1 stored back alone */
static void amx_config(int r, int cb) {
    lkv_amx_cfg cfg;
    lkv_amx_cfg_init(&cfg);
    cfg.rows[0] = cfg.rows[1] = (uint8_t)r, cfg.colsb[1] = (uint16_t)cb, cfg.rows[2] = (uint8_t)(cb / 4);
    lkv_amx_load_config(&cfg);
}

static void amx_product(int r, int cb, const uint16_t *a, const uint16_t *b, float *c, uint16_t *a_back) {
    amx_config(r, cb);
    _tile_zero(0);
    _tile_loadd(1, a, 64);
    _tile_loadd(2, b, 64);
    _tile_dpbf16ps(0, 1, 2);
    _tile_stored(0, c, 64);
    _tile_stored(1, a_back, 64);
    _tile_release();
}

static void amx_tiles(void) {
    int bad_shape = 0, bad_val = 0;
    uint16_t a[16 * 32], b[16 * 32], a_back[16 * 32];
    float c[16 * 16];
    for (int i = 0; i < 16 * 32; i++) /* small integers: every product and sum exact in f32 */
        a[i] = lk_f32_to_bf16((float)((int)(tu_rand() % 17) - 8)), b[i] = lk_f32_to_bf16((float)((int)(tu_rand() % 9) - 4));
    for (int r = 1; r <= 16; r += 3)
        for (int cb = 4; cb <= 64; cb += 12) {
            for (int i = 0; i < 16 * 16; i++) c[i] = -1.5f;
            for (int i = 0; i < 16 * 32; i++) a_back[i] = 0xabcd;
            amx_product(r, cb, a, b, c, a_back);
            for (int i = 0; i < 16; i++)
                for (int j = 0; j < 32; j++) /* A's row i, word j: copied back only inside r x cb */
                    bad_shape += a_back[i * 32 + j] != (i < r && 2 * j < cb ? a[i * 32 + j] : 0xabcd);
            for (int i = 0; i < 16; i++)
                for (int j = 0; j < 16; j++) {
                    float want = -1.5f;
                    if (i < r) {
                        want = 0.0f;
                        for (int k = 0; k < cb / 4; k++)
                            for (int e = 0; e < 2; e++)
                                want += lk_bf16_to_f32(a[i * 32 + 2 * k + e]) * lk_bf16_to_f32(b[k * 32 + 2 * j + e]);
                    }
                    bad_val += c[i * 16 + j] != want;
                }
        }
    tu_check(bad_shape == 0, "lkv_amx_load_config: a tile store writes exactly its configured rows x bytes (%d bad)",
             bad_shape);
    tu_check(bad_val == 0, "TDPBF16PS on tiles of configured rows and pairs: exact products (%d bad)", bad_val);
}
#endif

int LKV_FN(vec_check)(void);
int LKV_FN(vec_check)(void) {
    conversions();
    fp8();
    tails();
    exps();
    bf16_orders();
    shuffles();
    lanes();
#if defined(LKV_BF16DOT)
    bf16_dot();
#endif
#if defined(LKV_AVX2) || defined(LKV_AVX512)
    f8_f16c();
#endif
#if defined(LKV_AMX)
    amx_tiles();
#endif
    return 0;
}
