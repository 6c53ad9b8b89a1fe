/*
 * concat_and_cache_mla and gather_cache, AVX2 + F16C.
 *
 *   concat: cache(slot_mapping[t]) = round([kv_c[t] | k_pe[t]]);  gather: out[t] =
 *   round(cache entry of token t) (formulas and shapes in ref/mla_cache.c).
 *
 * Fast path: unit stride along the copied dims on both sides (source / out last-dim
 * stride 1, cache dim stride 1: ND rows or NZ 16-element chunks); other layouts go to
 * the reference. The token loop, its split over threads, the grouping of tokens in
 * consecutive slots and the run table (contiguous stretches of each entry) are shared
 * with AVX-512 in mla_cache_common.c; this file copies one group's runs: same dtype =
 * 32-byte vector moves (bit copy), else 8 lanes converted through f32 with one
 * rounding (simd.h, bit-identical to half.h). Large outputs use non-temporal stores
 * where the destination is aligned.
 */
#include <string.h>

#include "../kernels.h"
#include "simd.h"

static inline int64_t esize(lk_dtype dt) { return dt == LK_F32 ? 4 : 2; }

/* bit copy of `bytes` contiguous bytes; stream: non-temporal from the first 32-byte
 * boundary of dst */
static inline void copy_bytes(char *dst, const char *src, int64_t bytes, int stream) {
    int64_t i = 0;
    if (stream) {
        int64_t head = (int64_t)((32 - ((uintptr_t)dst & 31)) & 31);
        if (head < bytes) {
            memcpy(dst, src, (size_t)head);
            for (i = head; i + 32 <= bytes; i += 32)
                _mm256_stream_si256((__m256i *)(dst + i), _mm256_loadu_si256((const __m256i *)(src + i)));
        }
    }
    for (; i + 128 <= bytes; i += 128) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(src + i));
        __m256i b = _mm256_loadu_si256((const __m256i *)(src + i + 32));
        __m256i c = _mm256_loadu_si256((const __m256i *)(src + i + 64));
        __m256i d = _mm256_loadu_si256((const __m256i *)(src + i + 96));
        _mm256_storeu_si256((__m256i *)(dst + i), a);
        _mm256_storeu_si256((__m256i *)(dst + i + 32), b);
        _mm256_storeu_si256((__m256i *)(dst + i + 64), c);
        _mm256_storeu_si256((__m256i *)(dst + i + 96), d);
    }
    for (; i + 32 <= bytes; i += 32)
        _mm256_storeu_si256((__m256i *)(dst + i), _mm256_loadu_si256((const __m256i *)(src + i)));
    if (i < bytes) memcpy(dst + i, src + i, (size_t)(bytes - i));
}

/* dst[i] = round(src[i]), i < n, contiguous; stream: non-temporal when dst is aligned */
static inline void convert(char *dst, lk_dtype dt, const char *src, lk_dtype st, int64_t n, int stream) {
    int64_t des = esize(dt), ses = esize(st), i = 0;
    if (stream && ((uintptr_t)dst & (uintptr_t)(8 * des - 1)) == 0)
        for (; i + 8 <= n; i += 8) lk8_stream(dst + i * des, dt, lk8_load(src + i * ses, st));
    for (; i + 8 <= n; i += 8) lk8_store(dst + i * des, dt, lk8_load(src + i * ses, st));
    if (i < n) lk8_store_part(dst + i * des, dt, lk8_load_part(src + i * ses, st, (int)(n - i)), (int)(n - i));
}

/* 4 runs of 16 elements (4 NZ chunks) for every token of the group, each token's loads
 * issued before its stores. The chunks of one token share their address bits 0-11
 * (chunk stride = block_size x 16 elements, 4 KiB for page 128 in 16-bit), so a
 * run-by-run loop has about a quarter of its loads 4K-alias a store still in flight
 * (3-4x slower on Zen 3); batching 4 runs cuts that to a few percent. Into an NZ
 * cache, 16-bit chunks of 2 consecutive slots make one 64-byte line: they are stored
 * back to back, so a streamed line is complete at once (about 20% faster at 16+ MiB). */
static inline void copy_4x16(const lk_copy_group *g, const lk_copy_part *q, const lk_copy_run *runs) {
    int64_t ces = esize(q->ct), res = esize(q->rt);
    lk_dtype dt = g->to_cache ? q->ct : q->rt, st = g->to_cache ? q->rt : q->ct;
    int64_t des = esize(dt), ses = esize(st);
    int64_t db = (g->to_cache ? q->cstep : q->rstep) * des, sb = (g->to_cache ? q->rstep : q->cstep) * ses;
    char *d[4];
    const char *s[4];
    int stream = g->stream && !(db & 31);
    for (int k = 0; k < 4; k++) {
        char *cp = q->cache + runs[k].coff * ces, *rp = q->row + runs[k].roff * res;
        d[k] = g->to_cache ? cp : rp;
        s[k] = g->to_cache ? rp : cp;
        stream &= !((uintptr_t)d[k] & 31);
    }
    int64_t i = 0;
    if (dt == st && des == 2 && db == 32) /* into NZ: 2 tokens fill a line, store them together */
        for (; i + 2 <= g->ntok; i += 2) {
            __m256i v[8];
            for (int k = 0; k < 4; k++)
                v[2 * k] = _mm256_loadu_si256((const __m256i *)s[k]),
                v[2 * k + 1] = _mm256_loadu_si256((const __m256i *)(s[k] + sb));
            for (int k = 0; k < 4; k++)
                if (stream) _mm256_stream_si256((__m256i *)d[k], v[2 * k]), _mm256_stream_si256((__m256i *)(d[k] + 32), v[2 * k + 1]);
                else _mm256_storeu_si256((__m256i *)d[k], v[2 * k]), _mm256_storeu_si256((__m256i *)(d[k] + 32), v[2 * k + 1]);
            for (int k = 0; k < 4; k++) d[k] += 2 * db, s[k] += 2 * sb;
        }
    for (; i < g->ntok; i++, d[0] += db, d[1] += db, d[2] += db, d[3] += db, s[0] += sb, s[1] += sb,
                        s[2] += sb, s[3] += sb) {
        if (dt != st) { /* 8 lanes through f32, one rounding */
            __m256 v[8];
            for (int k = 0; k < 4; k++) v[2 * k] = lk8_load(s[k], st), v[2 * k + 1] = lk8_load(s[k] + 8 * ses, st);
            for (int k = 0; k < 4; k++)
                if (stream) lk8_stream(d[k], dt, v[2 * k]), lk8_stream(d[k] + 8 * des, dt, v[2 * k + 1]);
                else lk8_store(d[k], dt, v[2 * k]), lk8_store(d[k] + 8 * des, dt, v[2 * k + 1]);
        } else if (des == 2) { /* 32 bytes a chunk */
            __m256i v[4];
            for (int k = 0; k < 4; k++) v[k] = _mm256_loadu_si256((const __m256i *)s[k]);
            for (int k = 0; k < 4; k++)
                if (stream) _mm256_stream_si256((__m256i *)d[k], v[k]);
                else _mm256_storeu_si256((__m256i *)d[k], v[k]);
        } else { /* f32: 64 bytes a chunk */
            __m256i v[8];
            for (int k = 0; k < 4; k++)
                v[2 * k] = _mm256_loadu_si256((const __m256i *)s[k]),
                v[2 * k + 1] = _mm256_loadu_si256((const __m256i *)(s[k] + 32));
            for (int k = 0; k < 4; k++)
                if (stream) _mm256_stream_si256((__m256i *)d[k], v[2 * k]), _mm256_stream_si256((__m256i *)(d[k] + 32), v[2 * k + 1]);
                else _mm256_storeu_si256((__m256i *)d[k], v[2 * k]), _mm256_storeu_si256((__m256i *)(d[k] + 32), v[2 * k + 1]);
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

lk_status lk_avx2_concat_and_cache_mla(const lk_mla_cache_args *a) {
    if (a->kv_c.stride[1] != 1 || a->k_pe.stride[1] != 1 || a->kv_c_cache.s3 != 1 ||
        a->k_pe_cache.s3 != 1)
        return lk_ref_concat_and_cache_mla(a);
    return lk_mla_cache_drive(a, copy_runs);
}

lk_status lk_avx2_gather_cache(const lk_gather_cache_args *a) {
    if (a->out.stride[2] != 1 || a->cache.s3 != 1) return lk_ref_gather_cache(a);
    return lk_gather_cache_drive(a, copy_runs);
}
