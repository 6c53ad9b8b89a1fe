/*
 * Core: f16/bf16 conversions (scalar exact vs float64 maths), status strings, error
 * text, ISA forcing, thread control, the parallel unit loops, view checks and the
 * overlap rule. The vector
 * layer of each ISA (SIMD conversions bit-identical to these, exp, shuffles) is
 * checked by test_vec_<isa> (tests/vec_check.c).
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "core/half.h"
#include "core/paged.h"
#include "testutil.h"

/* f16 bits -> value computed in double from the definition */
static double f16_value(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 31) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexp(m, -24);
    else v = ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

static void test_f16_decode(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        double want = f16_value((uint16_t)h);
        float got = lk_f16_to_f32((uint16_t)h);
        if (isnan(want) ? !isnan(got) : ((double)got != want || !!signbit(got) != !!signbit(want))) bad++;
    }
    tu_check(bad == 0, "f16 -> f32 all 65536 patterns vs definition (%d bad)", bad);
}

/* expected f16 of f32 x by exhaustive nearest search among neighbours (ties to even) */
static uint16_t f16_round_ref(float x) {
    if (isnan(x)) return 0; /* not used */
    double v = x;
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    double a = fabs(v);
    if (a >= 65520.0) return sign | 0x7c00;
    /* magnitude bits in [0, 0x7bff]; binary search the last value <= a */
    int lo = 0, hi = 0x7bff;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (f16_value((uint16_t)mid) <= a) lo = mid;
        else hi = mid - 1;
    }
    double below = f16_value((uint16_t)lo), above = lo < 0x7bff ? f16_value((uint16_t)(lo + 1)) : 65536.0;
    int pick = lo;
    if (a - below > above - a) pick = lo + 1;
    else if (a - below == above - a) pick = (lo & 1) ? lo + 1 : lo;
    return sign | (uint16_t)pick;
}

static void test_f16_encode(void) {
    int bad = 0, n = 0;
    /* every f16 value, the midpoints to its neighbours and one ulp either side of them */
    for (uint32_t h = 0; h < 0x7c00; h++) {
        float v = (float)f16_value((uint16_t)h);
        float nxt = (float)(h < 0x7bff ? f16_value((uint16_t)(h + 1)) : 65536.0);
        float mid = (float)(((double)v + (double)nxt) / 2);
        float cand[5] = {v, mid, nextafterf(mid, 0), nextafterf(mid, INFINITY), -mid};
        for (int c = 0; c < 5; c++, n++)
            if (lk_f32_to_f16(cand[c]) != f16_round_ref(cand[c])) bad++;
    }
    tu_check(bad == 0, "f32 -> f16 %d values at and around every rounding midpoint (%d bad)", n, bad);
    float specials[] = {INFINITY, -INFINITY, 1e30f, -1e30f, 65504.0f, 65519.99f, 65520.0f, 0.0f, -0.0f,
                        5.9604645e-8f, 2.9802322e-8f, 2.98023259e-8f, 1e-30f};
    bad = 0;
    for (size_t i = 0; i < sizeof specials / sizeof *specials; i++)
        if (lk_f32_to_f16(specials[i]) != f16_round_ref(specials[i])) bad++;
    tu_check(bad == 0, "f32 -> f16 specials (inf, overflow edge, subnormal edges, signed zero)");
    uint16_t qn = lk_f32_to_f16(lk_bits_f32(0x7f800001u)), nn = lk_f32_to_f16(lk_bits_f32(0xffc00000u));
    tu_check((qn & 0x7c00) == 0x7c00 && (qn & 0x3ff) && (qn & 0x200) && (nn & 0x8000),
             "f32 -> f16 NaN stays NaN, quiet, sign kept (0x%04x 0x%04x)", qn, nn);
}

static void test_bf16(void) {
    int bad = 0;
    for (uint32_t hi = 0; hi < 65536; hi++) {
        uint32_t lows[6] = {0, 1, 0x7fff, 0x8000, 0x8001, 0xffff};
        for (int k = 0; k < 6; k++) {
            uint32_t u = (hi << 16) | lows[k];
            float f = lk_bits_f32(u);
            uint16_t got = lk_f32_to_bf16(f);
            uint16_t want;
            if (isnan(f)) want = (uint16_t)(hi | 0x40);
            else if (isinf(f)) want = (uint16_t)hi;
            else {
                /* nearest of hi and hi + 1 (as magnitudes; sign in hi), ties to even */
                double a = fabs((double)f), dn = fabs((double)lk_bits_f32(hi << 16));
                double up = fabs((double)lk_bits_f32(((hi + 1) & 0xffff) << 16));
                if ((hi & 0x7fff) == 0x7f7f) up = ldexp(1.0, 128); /* next is inf */
                if (a - dn < up - a || (a - dn == up - a && !(hi & 1))) want = (uint16_t)hi;
                else want = (uint16_t)(hi + 1);
            }
            if (got != want && bad++ < 3) printf("    bf16 %08x: got %04x want %04x\n", u, got, want);
        }
    }
    tu_check(bad == 0, "f32 -> bf16 all 2^16 high halves x {0,1,7fff,8000,8001,ffff} low halves (%d bad)", bad);
}

static void test_runtime(void) {
    tu_check(!strcmp(lk_status_str(LK_ERR_SHAPE), "LK_ERR_SHAPE") &&
                 !strcmp(lk_status_str((lk_status)999), "LK_ERR_UNKNOWN"),
             "lk_status_str names");
    tu_check(!strcmp(lk_version(), LLMKERN_VERSION_STRING), "lk_version");
    lk_isa best = lk_isa_best();
    tu_check(lk_set_isa(LK_ISA_REF) == LK_OK && lk_isa_current() == LK_ISA_REF, "force ref");
    lk_status s = lk_set_isa((lk_isa)7);
    tu_check(s == LK_ERR_VALUE && strstr(lk_last_error(), "isa"), "unknown isa rejected (%s)", lk_last_error());
    if (best < LK_ISA_AVX512) {
        s = lk_set_isa(LK_ISA_AVX512);
        tu_check(s == LK_ERR_UNSUPPORTED && lk_isa_current() == LK_ISA_REF,
                 "unsupported isa refused, current kept (%s)", lk_last_error());
    }
#if defined(__aarch64__)
    const lk_isa foreign = LK_ISA_AVX2;
#else
    const lk_isa foreign = LK_ISA_NEON;
#endif
    s = lk_set_isa(foreign);
    tu_check(s == LK_ERR_UNSUPPORTED && lk_isa_current() == LK_ISA_REF,
             "the other architecture's isa (%s) refused, current kept (%s)", lk_isa_name(foreign), lk_last_error());
    tu_check(lk_set_isa(best) == LK_OK && lk_isa_current() == best, "restore best (%s)", lk_isa_name(best));
    lk_set_num_threads(3);
    tu_check(lk_get_num_threads() == 3, "set_num_threads(3)");
    lk_set_num_threads(0);
    tu_check(lk_get_num_threads() >= 1, "set_num_threads(0) restores default (%d)", lk_get_num_threads());
    tu_check(lk_dtype_size(LK_BF16) == 2 && lk_dtype_size(LK_I64) == 8 && lk_dtype_size((lk_dtype)9) == 0,
             "dtype sizes");
}

/* lk_parallel_units / lk_parallel_runs: every unit run exactly once, on a thread index
 * below nthreads; lk_parallel_runs hands units out in runs of n / (4 nthreads) consecutive
 * indices, so the units split into at most ceil(n / run) stretches of one thread */
typedef struct {
    _Atomic int *count;
    int *tid;
    int nthreads, bad_tid;
} units_ctx;

static void units_fn(void *vctx, int64_t u, int tid) {
    units_ctx *c = vctx;
    atomic_fetch_add(&c->count[u], 1);
    c->tid[u] = tid;
    if (tid < 0 || tid >= c->nthreads) c->bad_tid = 1;
}

static void test_units(void) {
    const int64_t ns[] = {0, 1, 3, 7, 64, 1000};
    for (int runs = 0; runs < 2; runs++)
        for (int nt = 1; nt <= 4; nt++)
            for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
                int64_t n = ns[k];
                units_ctx c = {calloc((size_t)n + 1, sizeof(_Atomic int)), calloc((size_t)n + 1, sizeof(int)), nt, 0};
                if (runs) lk_parallel_runs(n, nt, units_fn, &c);
                else lk_parallel_units(n, nt, units_fn, &c);
                int64_t once = 0, stretches = 0;
                for (int64_t u = 0; u < n; u++) {
                    once += atomic_load(&c.count[u]) == 1;
                    stretches += u == 0 || c.tid[u] != c.tid[u - 1];
                }
                int64_t run = n / (4 * nt) > 1 ? n / (4 * nt) : 1, most = runs ? (n + run - 1) / run : n;
                tu_check(once == n && !c.bad_tid && stretches <= most,
                         "lk_parallel_%s n=%lld threads=%d: each unit once (%lld of %lld), thread index in range, "
                         "%lld stretches (at most %lld)",
                         runs ? "runs" : "units", (long long)n, nt, (long long)once, (long long)n, (long long)stretches,
                         (long long)most);
                free((void *)c.count), free(c.tid);
            }
}

static void test_views(void) {
    float buf[64];
    lk_tensor t = lk_tensor_make(buf, LK_F32, 2, (int64_t[]){4, 8});
    tu_check(t.stride[0] == 8 && t.stride[1] == 1, "lk_tensor_make row-major strides");
    lk_set_op("test");
    tu_check(lk_check_view(&t, "t", 2, 2) == LK_OK, "valid view");
    lk_tensor u = t;
    u.stride[1] = -1;
    u.data = buf + 7;
    tu_check(lk_check_view(&u, "u", 2, 2) == LK_OK && lk_check_no_self_overlap(&u, "u") == LK_OK,
             "negative stride view accepted");
    lk_extent e = lk_view_extent(&u);
    tu_check(e.lo == (uintptr_t)buf && e.hi == (uintptr_t)(buf + 32), "extent of a negative-stride view");
    u = t;
    u.stride[0] = INT64_MIN;
    tu_check(lk_check_view(&u, "u", 2, 2) == LK_ERR_OVERFLOW, "INT64_MIN stride rejected");
    u = t;
    u.shape[0] = INT64_MAX;
    u.shape[1] = 2;
    tu_check(lk_check_view(&u, "u", 2, 2) == LK_ERR_OVERFLOW, "element count overflow rejected (%s)", lk_last_error());
    u = t;
    u.shape[0] = 0;
    u.data = NULL;
    u.stride[0] = INT64_MAX;
    tu_check(lk_check_view(&u, "u", 2, 2) == LK_OK, "empty view with NULL data and huge stride is valid");
    /* overlap rule: q/k head slices of one qkv row buffer are disjoint; a shifted copy is not */
    float qkv[4 * 48];
    lk_tensor q = {qkv, LK_F32, 3, {4, 2, 8}, {48, 8, 1}};
    lk_tensor k = {qkv + 16, LK_F32, 3, {4, 1, 8}, {48, 8, 1}};
    lk_tensor k2 = {qkv + 12, LK_F32, 3, {4, 1, 8}, {48, 8, 1}};
    tu_check(lk_check_disjoint(&q, "q", &k, "k") == LK_OK, "interleaved q/k slices are disjoint");
    tu_check(lk_check_disjoint(&q, "q", &k2, "k") == LK_ERR_ALIAS, "overlapping slices rejected");
    lk_tensor vv = {qkv + 40, LK_F32, 3, {4, 1, 8}, {48, 8, 1}};
    tu_check(lk_check_disjoint(&vv, "v", &q, "q") == LK_OK, "slice at the end of the row is disjoint");
    /* per-slot K/V interleave [NB, bs, 2, H, D] and a last-dim split [.., Dk | Dv] */
    static float kv[3 * 4 * 2 * 2 * 8];
    lk_tensor kk = {kv, LK_F32, 4, {3, 4, 2, 8}, {128, 32, 8, 1}};
    lk_tensor vv2 = {kv + 16, LK_F32, 4, {3, 4, 2, 8}, {128, 32, 8, 1}};
    lk_tensor vbad = {kv + 8, LK_F32, 4, {3, 4, 2, 8}, {128, 32, 8, 1}};
    tu_check(lk_check_disjoint(&kk, "k_cache", &vv2, "v_cache") == LK_OK, "per-slot K/V interleave is disjoint");
    tu_check(lk_check_disjoint(&kk, "k_cache", &vbad, "v_cache") == LK_ERR_ALIAS, "per-slot interleave off by one head overlaps");
    lk_tensor lo = {kv, LK_F32, 2, {12, 5}, {8, 1}}, hi = {kv + 5, LK_F32, 2, {12, 3}, {8, 1}};
    lk_tensor hi2 = {kv + 4, LK_F32, 2, {12, 3}, {8, 1}};
    tu_check(lk_check_disjoint(&lo, "a", &hi, "b") == LK_OK, "last-dim split [5 | 3] is disjoint");
    tu_check(lk_check_disjoint(&lo, "a", &hi2, "b") == LK_ERR_ALIAS, "last-dim split sharing a column overlaps");
    lk_tensor b = t;
    b.stride[0] = 0;
    tu_check(lk_check_no_self_overlap(&b, "b") == LK_ERR_ALIAS, "broadcast output rejected");
    b = t;
    b.shape[0] = 1;
    b.stride[0] = 0;
    tu_check(lk_check_no_self_overlap(&b, "b") == LK_OK, "size-1 dim with stride 0 is fine");
    /* rowit walks a permuted view in row-major order */
    lk_tensor p = {buf, LK_F32, 3, {2, 3, 4}, {1, 8, 2}};
    lk_rowit it;
    lk_rowit_init(&it, &p, 1, 0);
    int ok = 1;
    for (int r = 0; r < 6; r++, lk_rowit_next(&it)) ok &= it.off == (r / 3) * 1 + (r % 3) * 8;
    lk_rowit_init(&it, &p, 1, 4);
    ok &= it.off == 1 + 8;
    tu_check(ok, "lk_rowit offsets on a permuted view");
}

/* fp8 scale arguments (lk_scale_init) and the fp8 forms of the paged-cache checks */
static void test_fp8_args(void) {
    lk_set_op("test");
    lk_scale sc;
    tu_check(lk_scale_init(&sc, NULL, 2, 3, "k_scale") == LK_OK && lk_scale_at(&sc, 1, 2) == 1.0f &&
                 lk_scale_is_scalar(&sc), "scale NULL: every value 1");
    float v[12] = {0.5f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f, 9.0f, 10.0f, 11.0f, 12.0f};
    lk_tensor t0 = {v, LK_F32, 0, {0}, {0}}, t1 = {v, LK_F32, 1, {1}, {1}};
    tu_check(lk_scale_init(&sc, &t0, 2, 3, "s") == LK_OK && lk_scale_at(&sc, 1, 2) == 0.5f, "scale []: per tensor");
    tu_check(lk_scale_init(&sc, &t1, 2, 3, "s") == LK_OK && lk_scale_at(&sc, 1, 2) == 0.5f, "scale [1]: per tensor");
    lk_tensor th = {v, LK_F32, 1, {3}, {2}};
    tu_check(lk_scale_init(&sc, &th, 2, 3, "s") == LK_OK && lk_scale_at(&sc, 1, 2) == 5.0f && lk_scale_at(&sc, 0, 1) == 3.0f,
             "scale [H] strided: per head");
    lk_tensor tb = {v, LK_F32, 2, {2, 3}, {1, 4}}; /* a transposed view */
    tu_check(lk_scale_init(&sc, &tb, 2, 3, "s") == LK_OK && lk_scale_at(&sc, 1, 2) == 10.0f && lk_scale_at(&sc, 0, 1) == 5.0f,
             "scale [B, H] (any strides): per request and head");
    tu_check(lk_scale_init(&sc, &tb, -1, 3, "s") == LK_ERR_SHAPE, "scale [B, H] refused where B < 0: %s", lk_last_error());
    lk_tensor tw = {v, LK_F32, 1, {4}, {1}};
    tu_check(lk_scale_init(&sc, &tw, 2, 3, "k_scale") == LK_ERR_SHAPE && strstr(lk_last_error(), "k_scale"),
             "scale of a wrong shape: %s", lk_last_error());
    uint16_t hv[3] = {0};
    lk_tensor td = {hv, LK_BF16, 1, {3}, {1}};
    tu_check(lk_scale_init(&sc, &td, 2, 3, "v_scale") == LK_ERR_DTYPE, "scale of dtype bf16: %s", lk_last_error());
    const float bad[4] = {0.0f, -1.0f, NAN, INFINITY};
    int ok = 1;
    for (int i = 0; i < 4; i++) {
        float w[3] = {1.0f, 1.0f, bad[i]};
        lk_tensor tt = {w, LK_F32, 1, {3}, {1}};
        ok &= lk_scale_init(&sc, &tt, 2, 3, "q_descale") == LK_ERR_VALUE && strstr(lk_last_error(), "q_descale[2]") != NULL;
        ok &= lk_scale_check_value(bad[i], "k_scale") == LK_ERR_VALUE && strstr(lk_last_error(), "k_scale") != NULL;
    }
    tu_check(ok, "scales 0, < 0, NaN, inf rejected naming the argument and the index");
    tu_check(lk_scale_check_value(0.25f, "k_scale") == LK_OK, "scale 0.25 accepted");
    /* paged caches: fp8 refused by lk_paged_init, accepted by lk_paged_init8; NZ tile 32 */
    static uint8_t c8[2 * 4 * 3 * 32];
    lk_paged pc;
    lk_tensor nd8 = {c8, LK_F8E4M3, 4, {2, 3, 4, 32}, {384, 128, 32, 1}};
    tu_check(lk_paged_init(&pc, &nd8, LK_KV_ND, 4, 32, "k_cache") == LK_ERR_DTYPE, "lk_paged_init refuses fp8");
    tu_check(lk_paged_init8(&pc, &nd8, LK_KV_ND, 4, 32, "k_cache") == LK_OK, "lk_paged_init8 takes an fp8 ND cache");
    lk_tensor nz8 = {c8, LK_F8E5M2, 4, {2, 4, 3, 32}, {384, 96, 32, 1}};
    ok = lk_paged_init8(&pc, &nz8, LK_KV_NZ, 4, 32, "k_cache") == LK_OK && pc.tile == 32;
    ok &= lk_paged_off(&pc, 1, 2, 1, 5) == 384 + 1 * 96 + 2 * 32 + 5;  /* c = 37: tile 1, lane 5 */
    ok &= lk_paged_off(&pc, 0, 1, 3, 31) == 3 * 96 + 32 + 31;          /* c = 127: tile 3, lane 31 */
    tu_check(ok, "fp8 NZ [blocks, C/32, block_size, 32]: tile 32 offsets");
    lk_tensor nz16 = {c8, LK_F8E5M2, 4, {2, 8, 3, 16}, {384, 48, 16, 1}};
    tu_check(lk_paged_init8(&pc, &nz16, LK_KV_NZ, 4, 32, "k_cache") == LK_ERR_SHAPE, "fp8 NZ with 16-wide tiles refused: %s",
             lk_last_error());
    lk_tensor nz24 = {c8, LK_F8E4M3, 4, {2, 1, 3, 32}, {96, 96, 32, 1}};
    tu_check(lk_paged_init8(&pc, &nz24, LK_KV_NZ, 3, 8, "k_cache") == LK_ERR_SHAPE, "fp8 NZ needs H*D %% 32 == 0: %s",
             lk_last_error());
    static uint16_t c16[2 * 8 * 3 * 16];
    lk_tensor nzb = {c16, LK_BF16, 4, {2, 8, 3, 16}, {384, 48, 16, 1}};
    tu_check(lk_paged_init8(&pc, &nzb, LK_KV_NZ, 4, 32, "k_cache") == LK_OK && pc.tile == 16 &&
                 lk_paged_off(&pc, 1, 2, 1, 5) == 384 + 2 * 48 + 2 * 16 + 5, "bf16 NZ keeps the 16-wide tile");
    lk_tensor f8 = {c8, LK_F8E4M3, 1, {4}, {1}};
    lk_tensor i8 = {c8, LK_I32, 1, {4}, {1}};
    tu_check(lk_check_float(&f8, "x", 1, 1) == LK_ERR_DTYPE && lk_check_float8(&f8, "x", 1, 1) == LK_OK &&
                 lk_check_float8(&i8, "x", 1, 1) == LK_ERR_DTYPE && strstr(lk_last_error(), "f8e4m3, f8e5m2"),
             "lk_check_float refuses fp8, lk_check_float8 takes it (and refuses i32: %s)", lk_last_error());
}

int main(void) {
    tu_init();
    test_fp8_args();
    test_f16_decode();
    test_f16_encode();
    test_bf16();
    test_runtime();
    test_units();
    test_views();
    return tu_finish("test_core");
}
