/*
 * rotary_embedding, every vector ISA (src/cpu/vec/lkv.h, W lanes).
 *
 *   c = cache[pos[t], i], s = cache[pos[t], rot/2 + i]       for i in [0, rot/2)
 *   NeoX  pair (x, y) = (row[i], row[i + rot/2]);  GPT-J pair (x, y) = (row[2i], row[2i + 1])
 *   x' = x*c - y*s;  y' = y*c + x*s
 * Products are rounded to f32, then subtracted / added: no FMA (the op is memory-bound;
 * the ISO C build mode keeps the compiler from contracting), so every ISA matches
 * ref/rotary.c bit for bit and the tests compare them bitwise.
 *
 * Shapes: positions [T]; q [T, Hq, D]; k [T, Hk, D] (optional); cos_sin [max_pos, rot].
 * Fast path needs last-dim stride 1 on q, k and the cache; token and head strides are
 * free (q and k may be slices of one fused qkv buffer). Other layouts go to the reference.
 *
 * Work split: tokens, contiguous ranges per thread (lk_parallel_for). Per token the
 * cache row is converted to f32 once into a staging block of up to CHUNK pairs, then
 * every head of q and k is rotated from it (rot/2 > CHUNK is done in CHUNK pieces).
 * Rows whose rotated parts are short scattered runs (DeepSeek's q_pe = q[..., 128:192],
 * k_pe inside kv_a) are software-prefetched one token ahead: measured 2-3x on bf16.
 * Other 16-bit inputs of LK_STREAM_MIN_BYTES or more prefetch, with each row, the row
 * about PF_AHEAD bytes of work later (into L1): the loop reads and writes in place, and
 * without it the loads of the next rows wait on memory while the core computes
 * (Llama-3-8B T = 4096 bf16 at 2 threads on Zen 3: 16 -> 21 GB/s, medians of
 * alternating runs). f32 rows go without it: there it cost ~10% on Zen 4 (AVX2 and
 * AVX-512, in-process A/B) and was never measured to help.
 *
 * Variants:
 *  - NeoX: x and y are two contiguous half-rows; W pairs per step, plain vector maths.
 *    bf16 q/k whose staged cos/sin hold no NaN: 2W pairs per step in even / odd order
 *    (lkv_bf16_split; cos/sin staged a second time in that order), rounded without the
 *    NaN branch: about twice the values per instruction of the W-pair path, which left
 *    bf16 short of memory speed.
 *  - GPT-J: 2W interleaved values v0, v1 are split with lkv_deinterleave into x (even)
 *    and y (odd), in the pair order lkv_pair_order gives (AVX2 shufps: 0 1 4 5 2 3 6 7),
 *    so the staged cos/sin are stored in that same order (one permute per W pairs per
 *    token, not per head), and lkv_interleave puts x', y' back into v0, v1 order.
 *    bf16 q/k whose staged cos/sin hold no NaN: one 2W-value load is W pairs, each in
 *    one 32-bit lane; lkv_bf16_split gives x and y in plain pair order (cos/sin staged a
 *    second time in that order), and the rounded results go back with
 *    lkv_bf16_join_nonan: no shuffles, no pack.
 */
#include "../kernels.h"
#include "../vec/lkv.h"

#define CHUNK 256     /* pairs per staging block (multiple of 2W) */
#define PF_AHEAD 2048 /* bytes of work the prefetch runs ahead on large inputs */

typedef struct {
    float c[CHUNK], s[CHUNK]; /* f32 cos / sin of pairs [i0, i0 + n), zero-padded to W;
                                 GPT-J: in lkv_pair_order per W pairs */
    /* bf16 fast paths: the same values in even / odd order per 2W pairs (NeoX) or in
     * plain order (GPT-J), and whether the staged values hold no NaN */
    float cu[CHUNK], su[CHUNK];
    int nan_free;
} cs_block;

/* stage cache pairs [i0, i0 + n) of row cs (cos at [0, half), sin at [half, 2 half)) */
static void stage(cs_block *b, const char *cs, lk_dtype dt, int64_t half, int64_t i0, int64_t n, int gptj,
                  int natural) {
    int64_t es = lk_esize(dt);
    const char *pc = cs + i0 * es, *ps = cs + (half + i0) * es; // [n] each
    for (int64_t j = 0; j < n; j += LKV_W) {
        int64_t m = n - j < LKV_W ? n - j : LKV_W;
        lkv_f32 c = m == LKV_W ? lkv_load(pc + j * es, dt) : lkv_load_part(pc + j * es, dt, m);
        lkv_f32 s = m == LKV_W ? lkv_load(ps + j * es, dt) : lkv_load_part(ps + j * es, dt, m);
        if (natural) { /* GPT-J bf16: cu / su in plain pair order */
            lkv_storeu(b->cu + j, c);
            lkv_storeu(b->su + j, s);
        }
        if (gptj) {
            c = lkv_pair_order(c);
            s = lkv_pair_order(s);
        }
        lkv_storeu(b->c + j, c);
        lkv_storeu(b->s + j, s);
    }
}

/* b->nan_free: the staged cos / sin of [0, n) hold no NaN */
static void check_nan(cs_block *b, int64_t n) {
    lkv_m bad = lkv_m_none();
    for (int64_t j = 0; j < n; j += LKV_W) bad = lkv_m_or(bad, lkv_unord(lkv_loadu(b->c + j), lkv_loadu(b->s + j)));
    b->nan_free = !lkv_m_any(bad);
}

/* NeoX bf16: the even / odd order copy (cu, su) of whole 2W-pair groups */
static void stage_eo(cs_block *b, int64_t n) {
    for (int64_t j = 0; j + 2 * LKV_W <= n; j += 2 * LKV_W)
        for (int k = 0; k < LKV_W; k++) {
            b->cu[j + k] = b->c[j + 2 * k], b->cu[j + LKV_W + k] = b->c[j + 2 * k + 1];
            b->su[j + k] = b->s[j + 2 * k], b->su[j + LKV_W + k] = b->s[j + 2 * k + 1];
        }
}

/* x' = x*c - y*s, y' = y*c + x*s on W pairs */
static inline void rot(lkv_f32 *x, lkv_f32 *y, const float *c, const float *s) {
    lkv_f32 vc = lkv_loadu(c), vs = lkv_loadu(s);
    lkv_f32 xo = lkv_sub(lkv_mul(*x, vc), lkv_mul(*y, vs));
    lkv_f32 yo = lkv_add(lkv_mul(*y, vc), lkv_mul(*x, vs));
    *x = xo;
    *y = yo;
}

/* NeoX: pairs (i, half + i) for i in [i0, i0 + n) of one head row */
static inline void rot_neox(char *row, lk_dtype dt, int64_t half, int64_t i0, int64_t n, const cs_block *b) {
    int64_t es = lk_esize(dt), j = 0;
    char *px = row + i0 * es, *py = row + (half + i0) * es; // [n] each
    if (dt == LK_BF16 && b->nan_free) /* 2W pairs per step, even / odd order, no shuffles */
        for (; j + 2 * LKV_W <= n; j += 2 * LKV_W) {
            lkv_f32 x0, x1, y0, y1;
            lkv_bf16_load_eo(px + j * 2, &x0, &x1);
            lkv_bf16_load_eo(py + j * 2, &y0, &y1);
            rot(&x0, &y0, b->cu + j, b->su + j);
            rot(&x1, &y1, b->cu + j + LKV_W, b->su + j + LKV_W);
            lkv_bf16_store_eo_nonan(px + j * 2, x0, x1, 0);
            lkv_bf16_store_eo_nonan(py + j * 2, y0, y1, 0);
        }
    for (; j + LKV_W <= n; j += LKV_W) {
        lkv_f32 x = lkv_load(px + j * es, dt), y = lkv_load(py + j * es, dt);
        rot(&x, &y, b->c + j, b->s + j);
        lkv_store2(px + j * es, py + j * es, dt, x, y);
    }
    if (j < n) {
        lkv_f32 x = lkv_load_part(px + j * es, dt, n - j), y = lkv_load_part(py + j * es, dt, n - j);
        rot(&x, &y, b->c + j, b->s + j);
        lkv_store_part(px + j * es, dt, x, n - j);
        lkv_store_part(py + j * es, dt, y, n - j);
    }
}

/* GPT-J on 2W interleaved values v0 = row[0, W), v1 = row[W, 2W) (W pairs) */
static inline void rot_gptj_pairs(lkv_f32 *v0, lkv_f32 *v1, const float *c, const float *s) {
    lkv_f32 x, y;
    lkv_deinterleave(*v0, *v1, &x, &y);
    rot(&x, &y, c, s);
    lkv_interleave(x, y, v0, v1);
}

/* GPT-J: pairs (2i, 2i + 1) for i in [i0, i0 + n) of one head row */
static inline void rot_gptj(char *row, lk_dtype dt, int64_t i0, int64_t n, const cs_block *b) {
    int64_t es = lk_esize(dt), j = 0;
    char *p = row + 2 * i0 * es; // [2n]
    if (dt == LK_BF16 && b->nan_free) /* W pairs per 2W-value load: x even, y odd halves */
        for (; j + LKV_W <= n; j += LKV_W) {
            lkv_f32 x, y;
            lkv_bf16_load_eo(p + 4 * j, &x, &y);
            rot(&x, &y, b->cu + j, b->su + j);
            lkv_bf16_store_eo_nonan(p + 4 * j, x, y, 0);
        }
    for (; j + LKV_W <= n; j += LKV_W) {
        char *p0 = p + 2 * j * es, *p1 = p0 + LKV_W * es;
        lkv_f32 v0 = lkv_load(p0, dt), v1 = lkv_load(p1, dt);
        rot_gptj_pairs(&v0, &v1, b->c + j, b->s + j);
        lkv_store2(p0, p1, dt, v0, v1);
    }
    if (j < n) {
        int64_t m = 2 * (n - j); /* values left: 2 .. 2W - 2 */
        char *p0 = p + 2 * j * es, *p1 = p0 + LKV_W * es;
        lkv_f32 v0 = m >= LKV_W ? lkv_load(p0, dt) : lkv_load_part(p0, dt, m);
        lkv_f32 v1 = m > LKV_W ? lkv_load_part(p1, dt, m - LKV_W) : lkv_zero();
        rot_gptj_pairs(&v0, &v1, b->c + j, b->s + j);
        if (m >= LKV_W) lkv_store(p0, dt, v0);
        else lkv_store_part(p0, dt, v0, m);
        if (m > LKV_W) lkv_store_part(p1, dt, v1, m - LKV_W);
    }
}

/* pairs [i0, i0 + n) of every head of x[t] (x: [T, H, D]); inlined once per dtype so
 * the dtype tests in the load/store helpers fold away. `ahead`: with each row, prefetch
 * the same part of the row about PF_AHEAD bytes of work later (A heads on, in this
 * token or the next: any token and head strides) */
LK_ALWAYS_INLINE void rotate_heads_dt(const lk_tensor *x, lk_dtype dt, int64_t t, int64_t half, int64_t i0,
                                      int64_t n, const cs_block *b, int is_neox, int ahead) {
    int64_t H = x->shape[1], bytes = 2 * n * lk_esize(dt); /* this chunk's part of a row */
    if (H <= 0 || n <= 0) return;
    int64_t A = ahead ? PF_AHEAD / bytes + 1 : 0, ht = t + A / H, hh = A % H; /* row t, h + A */
    for (int64_t h = 0; h < H; h++) {
        char *row = lk_at(x, t * x->stride[0] + h * x->stride[1]); // [D]
        if (ahead && ht < x->shape[0]) {
            const char *p = (const char *)lk_at(x, ht * x->stride[0] + hh * x->stride[1]) + i0 * lk_esize(dt);
            for (int64_t o = 0; o < bytes; o += 64) lkv_prefetch(p + o);
        }
        if (++hh == H) hh = 0, ht++;
        if (is_neox) rot_neox(row, dt, half, i0, n, b);
        else rot_gptj(row, dt, i0, n, b);
    }
}

static void rotate_heads(const lk_tensor *x, int64_t t, int64_t half, int64_t i0, int64_t n, const cs_block *b,
                         int is_neox, int ahead) {
    if (x->dtype == LK_F32) rotate_heads_dt(x, LK_F32, t, half, i0, n, b, is_neox, ahead);
    else if (x->dtype == LK_F16) rotate_heads_dt(x, LK_F16, t, half, i0, n, b, is_neox, ahead);
    else rotate_heads_dt(x, LK_BF16, t, half, i0, n, b, is_neox, ahead);
}

/* Rows whose rotated bytes form short runs in memory (q_pe inside q, partial rotary,
 * a single k head in a wide kv buffer) defeat the hardware stream prefetchers and leave
 * the loop waiting on one miss after another; those get a software prefetch (into L2)
 * of the next token's rows. Long contiguous runs are left to the hardware. */
static int wants_prefetch(const lk_tensor *x, int64_t rot) {
    int64_t H = x->shape[1], run = rot;
    if (H == 1 || x->stride[1] == rot) {
        run = H * rot;
        if (x->shape[0] == 1 || x->stride[0] == run) return 0; /* one stream */
    }
    return run * lk_esize(x->dtype) < 4096;
}

static void prefetch_token(const lk_tensor *x, int64_t t, int64_t rot) {
    int64_t bytes = rot * lk_esize(x->dtype);
    for (int64_t h = 0; h < x->shape[1]; h++) {
        const char *row = lk_at(x, t * x->stride[0] + h * x->stride[1]); // [D]
        for (int64_t o = 0; o < bytes; o += 64) lkv_prefetch_l2(row + o);
        lkv_prefetch_l2(row + bytes - 1);
    }
}

typedef struct {
    const lk_rotary_args *a;
    int prefetch_q, prefetch_k;
    int bf16_neox; /* q and k are bf16, NeoX: stage the even / odd order copy too */
    int bf16_gptj; /* q and k are bf16, GPT-J: stage the plain order copy too */
    int ahead;     /* LK_STREAM_MIN_BYTES or more of q and k: prefetch PF_AHEAD ahead */
} rotary_ctx;

static void rotary_tokens(void *ctx, int64_t t0, int64_t t1) {
    const rotary_ctx *rc = ctx;
    const lk_rotary_args *a = rc->a;
    const lk_tensor *p = &a->positions, *cs = &a->cos_sin;
    int64_t half = cs->shape[1] / 2;
    cs_block b;
    for (int64_t t = t0; t < t1; t++) {
        int64_t pos = lk_load_index(p->data, p->dtype, t * p->stride[0]);
        const char *row = lk_at(cs, pos * cs->stride[0]); // [rot]
        if (t + 1 < t1 && rc->prefetch_q) prefetch_token(&a->q, t + 1, 2 * half);
        if (t + 1 < t1 && rc->prefetch_k) prefetch_token(&a->k, t + 1, 2 * half);
        for (int64_t i0 = 0; i0 < half; i0 += CHUNK) {
            int64_t n = half - i0 < CHUNK ? half - i0 : CHUNK;
            stage(&b, row, cs->dtype, half, i0, n, !a->is_neox, rc->bf16_gptj);
            b.nan_free = 0;
            if (rc->bf16_neox) stage_eo(&b, n);
            if (rc->bf16_neox || rc->bf16_gptj) check_nan(&b, n);
            rotate_heads(&a->q, t, half, i0, n, &b, a->is_neox, rc->ahead && !rc->prefetch_q);
            if (a->has_k) rotate_heads(&a->k, t, half, i0, n, &b, a->is_neox, rc->ahead && !rc->prefetch_k);
        }
    }
}

static lk_status rotary_embedding(const lk_rotary_args *a) {
    if (a->q.stride[2] != 1 || (a->has_k && a->k.stride[2] != 1) || a->cos_sin.stride[1] != 1)
        return lk_ref_rotary_embedding(a);
    int64_t rot = a->cos_sin.shape[1], cbytes = rot * lk_esize(a->cos_sin.dtype);
    int64_t bytes = cbytes + 2 * rot * a->q.shape[1] * lk_esize(a->q.dtype);
    if (a->has_k) bytes += 2 * rot * a->k.shape[1] * lk_esize(a->k.dtype);
    int bf16 = a->q.dtype == LK_BF16 && (!a->has_k || a->k.dtype == LK_BF16);
    int f32 = a->q.dtype == LK_F32 && (!a->has_k || a->k.dtype == LK_F32);
    rotary_ctx rc = {a, wants_prefetch(&a->q, rot), a->has_k && wants_prefetch(&a->k, rot),
                     a->is_neox && bf16 && rot / 2 >= 2 * LKV_W, !a->is_neox && bf16,
                     a->positions.shape[0] * (bytes - cbytes) >= LK_STREAM_MIN_BYTES && !f32};
    lk_parallel_for(a->positions.shape[0], bytes, rotary_tokens, &rc);
    return LK_OK;
}

void LKV_FN(register_rotary)(lk_kernel_table *t) { t->rotary_embedding = rotary_embedding; }
