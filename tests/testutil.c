/* Test helpers (see testutil.h). */
#include "testutil.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "core/half.h"

static int n_pass, n_fail;
int tu_verbose;

void tu_init(void) {
    const char *v = getenv("LLMKERN_TEST_VERBOSE");
    tu_verbose = v && *v == '1';
    setvbuf(stdout, NULL, _IOLBF, 0); /* a test stopped by a timeout shows its last line */
    tu_seed(12345);
}

int tu_emulated(void) {
    const char *e = getenv("LLMKERN_TEST_EMULATED");
    return e && *e == '1';
}

int tu_check(int ok, const char *fmt, ...) {
    if (ok) n_pass++;
    else n_fail++;
    if (!ok || tu_verbose) {
        va_list ap;
        va_start(ap, fmt);
        printf(ok ? "  ok    " : "  FAIL  ");
        vprintf(fmt, ap);
        printf("\n");
        va_end(ap);
    }
    return ok;
}

int tu_finish(const char *file) {
    lk_isa isas[TU_MAX_ISAS];
    int n = tu_isas(isas);
    char missing[128] = "";
    for (int i = LK_ISA_REF, k = 0; i <= LK_ISA_AMX; i++) {
        if (k < n && isas[k] == (lk_isa)i) {
            k++;
            continue;
        }
        snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s%s", missing[0] ? ", " : "",
                 lk_isa_name((lk_isa)i));
    }
#if defined(LLMKERN_EMULATE_AVX512)
    const char *emulated = " (avx512 and avx512bf16 emulated on AVX2)";
#else
    const char *emulated = "";
#endif
    if (missing[0])
        printf("  note: ISAs checked: %d of them%s; %s kernels not run (CPU or build lacks them)\n", n, emulated,
               missing);
    printf("%s: %d passed, %d failed\n", file, n_pass, n_fail);
    return n_fail ? 1 : 0;
}

static uint64_t rng = 88172645463325252ull;
void tu_seed(uint64_t s) { rng = s ? s : 1; }
uint64_t tu_rand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
double tu_uniform(double lo, double hi) {
    return lo + (hi - lo) * ((double)(tu_rand() >> 11) / 9007199254740992.0);
}
int64_t tu_randint(int64_t lo, int64_t hi) {
    return lo + (int64_t)(tu_rand() % (uint64_t)(hi - lo + 1));
}

#define GUARD 64 /* bytes of garbage before and after */

tu_buf tu_alloc_rows(lk_dtype dt, int64_t R, int64_t D, int layout) {
    if (layout == 2) return tu_alloc_perm(dt, 2, (int64_t[]){R, D}, (int[]){1, 0}, 0);
    return tu_alloc(dt, 2, (int64_t[]){R, D}, layout == 1);
}

tu_saved tu_save(const tu_buf *b) {
    tu_saved s = {malloc(b->bytes), b->bytes};
    memcpy(s.bytes, b->base, b->bytes);
    return s;
}
void tu_restore(tu_buf *b, const tu_saved *s) { memcpy(b->base, s->bytes, s->n); }
int tu_same(const tu_buf *b, const tu_saved *s) { return memcmp(b->base, s->bytes, s->n) == 0; }

tu_buf tu_alloc_perm(lk_dtype dt, int ndim, const int64_t *shape, const int *perm, int pad) {
    tu_buf b;
    memset(&b, 0, sizeof b);
    size_t es = lk_dtype_size(dt);
    int64_t stride[LK_MAX_DIMS], span = 1;
    /* innermost stored dim first */
    for (int i = ndim - 1; i >= 0; i--) {
        int d = perm ? perm[i] : i;
        stride[d] = span;
        span *= (shape[d] > 0 ? shape[d] : 1) + pad;
    }
    b.bytes = (size_t)span * es + 2 * GUARD;
    b.base = malloc(b.bytes);
    b.snap = malloc(b.bytes);
    b.inview = calloc(b.bytes, 1);
    /* garbage: quiet NaN in every dtype (0x7fc0 as bf16, 0x7fc07fc0 as f32, 0x7fc0 f16) */
    for (size_t i = 0; i + 1 < b.bytes; i += 2) {
        b.base[i] = 0xc0;
        b.base[i + 1] = 0x7f;
    }
    b.t.data = b.base + GUARD;
    b.t.dtype = dt;
    b.t.ndim = ndim;
    for (int d = 0; d < LK_MAX_DIMS; d++) {
        b.t.shape[d] = d < ndim ? shape[d] : 0;
        b.t.stride[d] = d < ndim ? stride[d] : 0;
    }
    int64_t n = tu_numel(&b);
    for (int64_t i = 0; i < n; i++) {
        int64_t off = tu_offset(&b.t, i);
        memset(b.inview + GUARD + off * (int64_t)es, 1, es);
    }
    return b;
}

tu_buf tu_alloc(lk_dtype dt, int ndim, const int64_t *shape, int pad) {
    return tu_alloc_perm(dt, ndim, shape, NULL, pad);
}

void tu_free(tu_buf *b) {
    free(b->base);
    free(b->snap);
    free(b->inview);
    memset(b, 0, sizeof *b);
}

tu_buf tu_clone(const tu_buf *a) {
    tu_buf b = *a;
    b.base = malloc(a->bytes);
    b.snap = malloc(a->bytes);
    b.inview = malloc(a->bytes);
    if (!b.base || !b.snap || !b.inview) abort();
    memcpy(b.base, a->base, a->bytes);
    memcpy(b.snap, a->snap, a->bytes);
    memcpy(b.inview, a->inview, a->bytes);
    b.t.data = b.base + ((unsigned char *)a->t.data - a->base);
    return b;
}

int tu_same_alloc(const tu_buf *a, const tu_buf *b) {
    return a->bytes == b->bytes && memcmp(a->base, b->base, a->bytes) == 0;
}

int64_t *tu_permutation(int64_t n) {
    int64_t *perm = malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
    if (!perm) abort();
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = tu_randint(0, i), x = perm[i];
        perm[i] = perm[j], perm[j] = x;
    }
    return perm;
}

void tu_mla_decode_ref(const tu_buf *q, const double *ent, const int64_t *len, int B, int64_t s_q, int64_t H,
                       int64_t E, int64_t Dl, int64_t maxlen, double scale, int causal, double **want, double **lse,
                       double **mag) {
    int64_t R = s_q * H;
    double *w0 = calloc((size_t)(B * R * Dl + 1), sizeof(double)), *l0 = calloc((size_t)(B * R + 1), sizeof(double));
    double *m0 = mag ? calloc((size_t)(B * R * Dl + 1), sizeof(double)) : NULL;
    double *s = malloc(sizeof(double) * (size_t)(maxlen > 0 ? maxlen : 1));
    if (!w0 || !l0 || (mag && !m0) || !s) abort();
    for (int b = 0; b < B; b++)
        for (int64_t i = 0; i < s_q; i++)
            for (int64_t h = 0; h < H; h++) {
                int64_t lim = causal ? len[b] - s_q + i + 1 : len[b];
                if (lim < 0) lim = 0;
                double m = -INFINITY, l = 0;
                for (int64_t j = 0; j < lim; j++) {
                    double d = 0;
                    for (int64_t e = 0; e < E; e++)
                        d += tu_get(q, ((b * s_q + i) * H + h) * E + e) * ent[(b * maxlen + j) * E + e];
                    s[j] = d * scale;
                    if (s[j] > m) m = s[j];
                }
                double *w = w0 + ((b * s_q + i) * H + h) * Dl, *wm = m0 ? m0 + ((b * s_q + i) * H + h) * Dl : NULL;
                for (int64_t j = 0; j < lim; j++) {
                    double p = exp(s[j] - m);
                    l += p;
                    for (int64_t d = 0; d < Dl; d++) {
                        w[d] += p * ent[(b * maxlen + j) * E + d];
                        if (wm) wm[d] += p * fabs(ent[(b * maxlen + j) * E + d]);
                    }
                }
                for (int64_t d = 0; d < Dl; d++) {
                    w[d] = lim ? w[d] / l : 0.0;
                    if (wm) wm[d] = lim ? wm[d] / l : 0.0;
                }
                l0[(b * H + h) * s_q + i] = lim ? m + log(l) : -INFINITY;
            }
    free(s);
    *want = w0, *lse = l0;
    if (mag) *mag = m0;
}

void tu_random_slots(tu_buf *sm, int64_t N, int64_t nslots, int with_padding) {
    int64_t *all = tu_permutation(nslots);
    int64_t phase = tu_randint(0, 4);
    for (int64_t i = 0; i < N; i++) tu_set(sm, i, with_padding && i % 5 == phase ? -1 : (double)all[i]);
    free(all);
}

int64_t tu_numel(const tu_buf *b) {
    int64_t n = 1;
    for (int d = 0; d < b->t.ndim; d++) n *= b->t.shape[d];
    return n;
}

int64_t tu_offset(const lk_tensor *t, int64_t i) {
    int64_t off = 0;
    for (int d = t->ndim - 1; d >= 0; d--) {
        off += (i % t->shape[d]) * t->stride[d];
        i /= t->shape[d];
    }
    return off;
}

double tu_get(const tu_buf *b, int64_t i) {
    int64_t off = tu_offset(&b->t, i);
    switch (b->t.dtype) {
    case LK_I32: return ((const int32_t *)b->t.data)[off];
    case LK_I64: return (double)((const int64_t *)b->t.data)[off];
    case LK_I8: return ((const int8_t *)b->t.data)[off];
    default: return lk_load_f(b->t.data, b->t.dtype, off);
    }
}

void tu_set(tu_buf *b, int64_t i, double v) {
    int64_t off = tu_offset(&b->t, i);
    switch (b->t.dtype) {
    case LK_I32: ((int32_t *)b->t.data)[off] = (int32_t)v; break;
    case LK_I64: ((int64_t *)b->t.data)[off] = (int64_t)v; break;
    case LK_I8: ((int8_t *)b->t.data)[off] = (int8_t)v; break;
    default: lk_store_f(b->t.data, b->t.dtype, off, (float)v);
    }
}

void tu_fill_uniform(tu_buf *b, double lo, double hi) {
    int64_t n = tu_numel(b);
    for (int64_t i = 0; i < n; i++) tu_set(b, i, tu_uniform(lo, hi));
}

void tu_snapshot(tu_buf *b) { memcpy(b->snap, b->base, b->bytes); }

int tu_intact(const tu_buf *b) { return memcmp(b->snap, b->base, b->bytes) == 0; }

int tu_outside_intact(const tu_buf *b) {
    for (size_t i = 0; i < b->bytes; i++)
        if (!b->inview[i] && b->base[i] != b->snap[i]) return 0;
    return 1;
}

double *tu_values(const tu_buf *b) {
    int64_t n = tu_numel(b);
    double *v = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    for (int64_t i = 0; i < n; i++) v[i] = tu_get(b, i);
    return v;
}

tu_tolerance tu_tol(lk_dtype dt) {
    tu_tolerance t = {1e-5, 1e-5};
    if (dt == LK_F16) t.atol = t.rtol = 2e-3;
    if (dt == LK_BF16) t.atol = t.rtol = 2e-2;
    return t;
}

double tu_err(const double *got, const double *want, int64_t n, tu_tolerance tol) {
    double worst = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double g = got[i], w = want[i];
        if (isnan(w) || isnan(g)) {
            if (!(isnan(w) && isnan(g))) return INFINITY;
            continue;
        }
        if (isinf(w) || isinf(g)) {
            if (g != w) return INFINITY;
            continue;
        }
        double e = fabs(g - w) / (tol.atol + tol.rtol * fabs(w));
        if (e > worst) worst = e;
    }
    return worst;
}

int tu_same_bits(const tu_buf *a, const tu_buf *b) {
    int64_t n = tu_numel(a);
    if (n != tu_numel(b) || a->t.dtype != b->t.dtype) return 0;
    size_t es = lk_dtype_size(a->t.dtype);
    for (int64_t i = 0; i < n; i++) {
        const char *pa = (const char *)a->t.data + tu_offset(&a->t, i) * (int64_t)es;
        const char *pb = (const char *)b->t.data + tu_offset(&b->t, i) * (int64_t)es;
        if (memcmp(pa, pb, es)) return 0;
    }
    return 1;
}

static int bf16_rows_only; /* tu_other_fma_form's second run */
int tu_isas(lk_isa *out) {
    int n = 0;
    lk_isa cur = lk_isa_current();
    for (int i = LK_ISA_REF; i < TU_MAX_ISAS; i++) {
        if (bf16_rows_only && i != LK_ISA_REF && i != LK_ISA_AVX512BF16 && i != LK_ISA_AMX) continue;
        if (lk_set_isa((lk_isa)i) == LK_OK) out[n++] = (lk_isa)i;
    }
    lk_set_isa(cur);
    return n;
}

void tu_other_fma_form(void (*fn)(void)) {
    lk_isa cur = lk_isa_current();
    if (lk_set_isa(LK_ISA_AVX512BF16) != LK_OK) return; /* no bf16 row to run */
    lk_set_isa(cur);
    int p = lk_cpu_prefer_fma();
    lk_cpu_set_prefer_fma(!p), bf16_rows_only = 1;
    fn();
    lk_cpu_set_prefer_fma(-1), bf16_rows_only = 0;
}

int tu_fp8_close(lk_dtype dt, double x, double scale, double q) {
    double y = x / scale, mx = dt == LK_F8E4M3 ? 448.0 : 57344.0;
    if (isnan(y)) return isnan(q);
    int M = dt == LK_F8E4M3 ? 3 : 2, emin = dt == LK_F8E4M3 ? -6 : -14;
    int e = y == 0 ? emin : (int)floor(log2(fabs(y)));
    if (e < emin) e = emin;
    double half = ldexp(1.0, e - M - 1) * (1 + 1e-6); /* the f32 division's rounding */
    if (fabs(y) >= mx) return fabs(q) == mx && (q < 0) == (y < 0);
    return fabs(q - y) <= half && (y == 0 || q == 0 || (q < 0) == (y < 0));
}

tu_buf tu_cos_sin(lk_dtype dt, int64_t max_pos, int64_t rot, int pad, int transposed) {
    tu_buf b = tu_alloc_perm(dt, 2, (int64_t[]){max_pos, rot}, transposed ? (int[]){1, 0} : NULL, pad);
    int64_t half = rot / 2;
    for (int64_t p = 0; p < max_pos; p++)
        for (int64_t i = 0; i < half; i++) {
            double a = (double)p * pow(10000.0, -2.0 * (double)i / (double)rot);
            tu_set(&b, p * rot + i, cos(a));
            tu_set(&b, p * rot + half + i, sin(a));
        }
    return b;
}
