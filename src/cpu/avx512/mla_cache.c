/*
 * concat_and_cache_mla and gather_cache, AVX-512 (F/BW/DQ/VL).
 *
 * Same formulas, shapes, fast-path conditions, work split, grouping and rounding as
 * avx2/mla_cache.c (token loop and run table shared in mla_cache_common.c); 64-byte
 * moves with a masked byte tail for same-dtype copies, 16 lanes with masked tails for
 * conversions, non-temporal stores for large outputs where the destination is aligned.
 */
#include "../kernels.h"
#include "simd.h"

static inline int64_t esize(lk_dtype dt) { return dt == LK_F32 ? 4 : 2; }

/* first n (< 64) bytes */
static inline void copy_tail(char *dst, const char *src, int64_t n) {
    __mmask64 m = ((__mmask64)1 << n) - 1;
    _mm512_mask_storeu_epi8(dst, m, _mm512_maskz_loadu_epi8(m, src));
}

/* bit copy of `bytes` contiguous bytes; stream: non-temporal from the first 64-byte
 * boundary of dst */
static inline void copy_bytes(char *dst, const char *src, int64_t bytes, int stream) {
    int64_t i = 0;
    if (stream) {
        int64_t head = (int64_t)((64 - ((uintptr_t)dst & 63)) & 63);
        if (head < bytes) {
            if (head) copy_tail(dst, src, head);
            for (i = head; i + 64 <= bytes; i += 64) _mm512_stream_si512((void *)(dst + i), _mm512_loadu_si512(src + i));
        }
    }
    for (; i + 256 <= bytes; i += 256) {
        __m512i a = _mm512_loadu_si512(src + i), b = _mm512_loadu_si512(src + i + 64);
        __m512i c = _mm512_loadu_si512(src + i + 128), d = _mm512_loadu_si512(src + i + 192);
        _mm512_storeu_si512(dst + i, a);
        _mm512_storeu_si512(dst + i + 64, b);
        _mm512_storeu_si512(dst + i + 128, c);
        _mm512_storeu_si512(dst + i + 192, d);
    }
    for (; i + 64 <= bytes; i += 64) _mm512_storeu_si512(dst + i, _mm512_loadu_si512(src + i));
    if (i < bytes) copy_tail(dst + i, src + i, bytes - i);
}

/* dst[i] = round(src[i]), i < n, contiguous; stream: non-temporal when dst is aligned */
static inline void convert(char *dst, lk_dtype dt, const char *src, lk_dtype st, int64_t n, int stream) {
    int64_t des = esize(dt), ses = esize(st), i = 0;
    if (stream && ((uintptr_t)dst & (uintptr_t)(16 * des - 1)) == 0)
        for (; i + 16 <= n; i += 16) lk16_stream(dst + i * des, dt, lk16_load(src + i * ses, st, 16));
    for (; i < n; i += 16) lk16_store(dst + i * des, dt, lk16_load(src + i * ses, st, n - i), n - i);
}

/* 4 runs of 16 elements (4 NZ chunks) for every token of the group, each token's loads
 * issued before its stores (4K aliasing, see avx2/mla_cache.c); into an NZ cache, the
 * 16-bit chunks of 2 consecutive slots are one 64-byte store */
static inline void copy_4x16(const lk_copy_group *g, const lk_copy_part *q, const lk_copy_run *runs) {
    int64_t ces = esize(q->ct), res = esize(q->rt);
    lk_dtype dt = g->to_cache ? q->ct : q->rt, st = g->to_cache ? q->rt : q->ct;
    int64_t des = esize(dt), ses = esize(st), align = 16 * des - 1; /* one chunk: 32 or 64 bytes */
    int64_t db = (g->to_cache ? q->cstep : q->rstep) * des, sb = (g->to_cache ? q->rstep : q->cstep) * ses;
    char *d[4];
    const char *s[4];
    int stream = g->stream && !(db & align);
    for (int k = 0; k < 4; k++) {
        char *cp = q->cache + runs[k].coff * ces, *rp = q->row + runs[k].roff * res;
        d[k] = g->to_cache ? cp : rp;
        s[k] = g->to_cache ? rp : cp;
        stream &= !((uintptr_t)d[k] & (uintptr_t)align);
    }
    int64_t i = 0;
    if (dt == st && des == 2 && db == 32) /* into NZ: 2 tokens fill a line, one 64-byte store */
        for (; i + 2 <= g->ntok; i += 2) {
            __m512i v[4];
            for (int k = 0; k < 4; k++)
                v[k] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)s[k])),
                                          _mm256_loadu_si256((const __m256i *)(s[k] + sb)), 1);
            for (int k = 0; k < 4; k++)
                if (stream && !((uintptr_t)d[k] & 63)) _mm512_stream_si512((void *)d[k], v[k]);
                else _mm512_storeu_si512(d[k], v[k]);
            for (int k = 0; k < 4; k++) d[k] += 2 * db, s[k] += 2 * sb;
        }
    for (; i < g->ntok; i++, d[0] += db, d[1] += db, d[2] += db, d[3] += db, s[0] += sb, s[1] += sb,
                        s[2] += sb, s[3] += sb) {
        if (dt != st) { /* 16 lanes through f32, one rounding */
            __m512 v[4];
            for (int k = 0; k < 4; k++) v[k] = lk16_load(s[k], st, 16);
            for (int k = 0; k < 4; k++)
                if (stream) lk16_stream(d[k], dt, v[k]);
                else lk16_store(d[k], dt, v[k], 16);
        } else if (des == 2) { /* 32 bytes a chunk */
            __m256i v[4];
            for (int k = 0; k < 4; k++) v[k] = _mm256_loadu_si256((const __m256i *)s[k]);
            for (int k = 0; k < 4; k++)
                if (stream) _mm256_stream_si256((__m256i *)d[k], v[k]);
                else _mm256_storeu_si256((__m256i *)d[k], v[k]);
        } else { /* f32: 64 bytes a chunk */
            __m512i v[4];
            for (int k = 0; k < 4; k++) v[k] = _mm512_loadu_si512(s[k]);
            for (int k = 0; k < 4; k++)
                if (stream) _mm512_stream_si512((void *)d[k], v[k]);
                else _mm512_storeu_si512(d[k], v[k]);
        }
    }
}

/* one run of n elements of one token */
static inline void copy_run(char *cp, lk_dtype ct, char *rp, lk_dtype rt, int64_t n, int to_cache, int stream) {
    if (ct == rt) copy_bytes(to_cache ? cp : rp, to_cache ? rp : cp, n * esize(ct), stream);
    else if (to_cache) convert(cp, ct, rp, rt, n, stream);
    else convert(rp, rt, cp, ct, n, stream);
}

/* one group of tokens (see lk_copy_group) */
static void copy_runs(const lk_copy_group *g) {
    if (g->token_major)
        for (int64_t i = 0; i < g->ntok; i++)
            for (int p = 0; p < g->nparts; p++) {
                const lk_copy_part *q = &g->part[p];
                int64_t ces = esize(q->ct), res = esize(q->rt);
                char *cp = q->cache + i * q->cstep * ces, *rp = q->row + i * q->rstep * res;
                for (int64_t r = 0; r < q->nruns; r++)
                    copy_run(cp + q->runs[r].coff * ces, q->ct, rp + q->runs[r].roff * res, q->rt, q->runs[r].len,
                             g->to_cache, g->stream);
            }
    else
        for (int p = 0; p < g->nparts; p++) {
            const lk_copy_part *q = &g->part[p];
            const lk_copy_run *runs = q->runs;
            int64_t ces = esize(q->ct), res = esize(q->rt), cb = q->cstep * ces, rb = q->rstep * res;
            for (int64_t r = 0; r < q->nruns; r++) {
                if (runs[r].len == 16 && r + 4 <= q->nruns && runs[r + 1].len == 16 && runs[r + 2].len == 16 &&
                    runs[r + 3].len == 16) {
                    copy_4x16(g, q, runs + r);
                    r += 3;
                    continue;
                }
                char *cp = q->cache + runs[r].coff * ces, *rp = q->row + runs[r].roff * res;
                for (int64_t i = 0; i < g->ntok; i++, cp += cb, rp += rb)
                    copy_run(cp, q->ct, rp, q->rt, runs[r].len, g->to_cache, g->stream);
            }
        }
    if (g->fence) _mm_sfence();
}

lk_status lk_avx512_concat_and_cache_mla(const lk_mla_cache_args *a) {
    if (a->kv_c.stride[1] != 1 || a->k_pe.stride[1] != 1 || a->kv_c_cache.s3 != 1 ||
        a->k_pe_cache.s3 != 1)
        return lk_ref_concat_and_cache_mla(a);
    return lk_mla_cache_drive(a, copy_runs);
}

lk_status lk_avx512_gather_cache(const lk_gather_cache_args *a) {
    if (a->out.stride[2] != 1 || a->cache.s3 != 1) return lk_ref_gather_cache(a);
    return lk_gather_cache_drive(a, copy_runs);
}
