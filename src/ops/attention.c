/*
 * Public entry lk_flash_attn_varlen: validation of every argument (shapes, dtypes,
 * index values, overlaps) before any store, contiguous int32 copies of the index
 * tensors for the kernels, then the kernel of the ISA in use. Contract in
 * include/llmkern.h; maths in docs/ops.md. fp8 (since 0.3): q, k, v may be
 * f8e4m3 / f8e5m2 (paged fp8 caches through lk_paged_init8: NZ tiles 32 wide), with
 * params.q/k/v_descale validated by lk_scale_init ([], [1], [Hk], [B, Hk]) into the
 * kernel arguments (1 for a tensor that is not fp8). lk_flash_attn_varlen_scaled (since
 * 0.3): the same with an fp8 out and output_scale (validated here like
 * lk_merge_attn_states_scaled's: one f32 element, finite and > 0), passed to the kernels
 * as out_scale.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/half.h"
#include "../cpu/fp8_quant.h"
#include "../cpu/kernels.h"

lk_attn_params lk_attn_params_default(float scale) {
    lk_attn_params p = {scale, 0, -1, -1, 0.0f, LK_KV_ND, NULL, NULL, NULL, NULL};
    return p;
}

/* contiguous int32 copy of a 1-D or 2-D index view (row-major); NULL on OOM */
static int32_t *copy_index(const lk_tensor *t) {
    int64_t n = lk_numel(t), cols = t->ndim == 2 ? t->shape[1] : n;
    int32_t *c = malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    if (!c) return NULL;
    for (int64_t i = 0; i < n; i++) {
        int64_t off = t->ndim == 2 ? (i / cols) * t->stride[0] + (i % cols) * t->stride[1]
                                   : i * t->stride[0];
        int64_t v = lk_load_index(t->data, t->dtype, off);
        c[i] = v > INT32_MAX ? INT32_MAX : v < INT32_MIN ? INT32_MIN : (int32_t)v;
    }
    return c;
}

typedef struct {
    int32_t *cu_q, *cu_k, *used, *table;
    float *alibi;
} idx_copies;

static void free_copies(idx_copies *c) {
    free(c->cu_q);
    free(c->cu_k);
    free(c->used);
    free(c->table);
    free(c->alibi);
}

/* ALiBi slopes [Hq] or [B, Hq] f32, finite: a contiguous copy (bstride 0 or Hq) */
static lk_status check_alibi(const lk_tensor *t, int64_t B, int64_t Hq, idx_copies *cp, int64_t *bstride) {
    lk_status s = lk_check_view(t, "alibi_slopes", 1, 2);
    if (s) return s;
    if (t->dtype != LK_F32)
        return lk_fail(LK_ERR_DTYPE, "alibi_slopes: must be f32, got %s", lk_dtype_name(t->dtype));
    if (t->shape[t->ndim - 1] != Hq || (t->ndim == 2 && t->shape[0] != B))
        return lk_fail(LK_ERR_SHAPE, "alibi_slopes: shape %s, expected [%lld] or [%lld, %lld] (query heads)",
                       lk_shape_str(t), (long long)Hq, (long long)B, (long long)Hq);
    int64_t rows = t->ndim == 2 ? B : 1;
    if (!(cp->alibi = malloc(sizeof(float) * (size_t)(rows * Hq > 0 ? rows * Hq : 1)))) return LK_ERR_NOMEM;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t h = 0; h < Hq; h++) {
            float v = ((const float *)t->data)[(t->ndim == 2 ? r * t->stride[0] : 0) + h * t->stride[t->ndim - 1]];
            if (!isfinite(v))
                return lk_fail(LK_ERR_VALUE, "alibi_slopes: entry [%lld, %lld] is not finite (%g)", (long long)r,
                               (long long)h, (double)v);
            cp->alibi[r * Hq + h] = v;
        }
    *bstride = t->ndim == 2 ? Hq : 0;
    return LK_OK;
}

static lk_status check_cu(const int32_t *cu, int64_t n1, int64_t total, const char *name,
                          const char *tname) {
    for (int64_t i = 0; i < n1; i++) {
        if (cu[i] < 0)
            return lk_fail(LK_ERR_INDEX, "%s: entry %lld is negative (%d)", name, (long long)i, cu[i]);
        if (i && cu[i] < cu[i - 1])
            return lk_fail(LK_ERR_INDEX, "%s: not non-decreasing at entry %lld (%d after %d)", name,
                           (long long)i, cu[i], cu[i - 1]);
    }
    if (n1 && cu[n1 - 1] > total)
        return lk_fail(LK_ERR_INDEX, "%s: last entry %d exceeds the %lld rows of %s", name,
                       cu[n1 - 1], (long long)total, tname);
    return LK_OK;
}

static lk_status check_overlaps(const lk_tensor *w, const char *wn, const lk_tensor *const *in,
                                const char *const *names, int n) {
    lk_status s;
    for (int i = 0; i < n; i++)
        if (in[i] && (s = lk_check_disjoint(w, wn, in[i], names[i]))) return s;
    return LK_OK;
}

/* out: f32/f16/bf16, or with an output_scale fp8 (and only fp8) */
static lk_status check_out(const lk_tensor *out, const lk_tensor *oscale) {
    if (!oscale) return lk_check_float(out, "out", 3, 3);
    lk_status s = lk_check_view(out, "out", 3, 3);
    if (s) return s;
    if (!lk_is_fp8(out->dtype))
        return lk_fail(LK_ERR_DTYPE, "out: dtype %s with output_scale (only an fp8 out is scaled: f8e4m3, f8e5m2)",
                       lk_dtype_name(out->dtype));
    return LK_OK;
}

static lk_status check_attn(lk_attn_args *a, idx_copies *cp, const lk_tensor *out,
                            const lk_tensor *lse, const lk_tensor *q, const lk_tensor *k,
                            const lk_tensor *v, const lk_tensor *cu_q, const lk_tensor *cu_k,
                            const lk_tensor *used, const lk_tensor *table,
                            const lk_attn_params *p, const lk_tensor *oscale) {
    lk_status s;
    if (!p) return lk_fail(LK_ERR_NULL, "params: NULL");
    if (!isfinite(p->scale)) return lk_fail(LK_ERR_VALUE, "params.scale: must be finite, got %g", (double)p->scale);
    if (!(p->softcap >= 0.0f) || isinf(p->softcap))
        return lk_fail(LK_ERR_VALUE, "params.softcap: must be finite and >= 0, got %g", (double)p->softcap);
    if (p->window_left < -1 || p->window_right < -1)
        return lk_fail(LK_ERR_VALUE, "params.window: values must be >= -1, got (%lld, %lld)",
                       (long long)p->window_left, (long long)p->window_right);
    if ((s = lk_check_float8(q, "q", 3, 3))) return s;
    if ((s = check_out(out, oscale))) return s;
    if ((s = lk_check_index(cu_q, "cu_seqlens_q", 1, 1))) return s;
    int64_t Tq = q->shape[0], Hq = q->shape[1], Dqk = q->shape[2], Dv = out->shape[2];
    if (out->shape[0] != Tq || out->shape[1] != Hq)
        return lk_fail(LK_ERR_SHAPE, "out: shape %s does not match q %s in tokens and heads",
                       lk_shape_str(out), lk_shape_str(q));
    if (Dqk < 1 || Dv < 1) return lk_fail(LK_ERR_SHAPE, "q/out: head dims must be >= 1");
    if (cu_q->shape[0] < 1) return lk_fail(LK_ERR_SHAPE, "cu_seqlens_q: needs B + 1 >= 1 entries");
    int64_t B = cu_q->shape[0] - 1;
    if (lse) {
        if ((s = lk_check_view(lse, "lse", 2, 2))) return s;
        if (lse->dtype != LK_F32) return lk_fail(LK_ERR_DTYPE, "lse: must be f32, got %s", lk_dtype_name(lse->dtype));
        if (lse->shape[0] != Tq || lse->shape[1] != Hq)
            return lk_fail(LK_ERR_SHAPE, "lse: shape %s, expected [%lld, %lld]", lk_shape_str(lse),
                           (long long)Tq, (long long)Hq);
    }
    int paged = table != NULL;
    int64_t Hk;
    if (!paged) {
        if (used) return lk_fail(LK_ERR_VALUE, "seqused_k: only with a block_table (paged K/V)");
        if (!cu_k) return lk_fail(LK_ERR_NULL, "cu_seqlens_k: required for dense K/V");
        if ((s = lk_check_float8(k, "k", 3, 3)) || (s = lk_check_float8(v, "v", 3, 3))) return s;
        if ((s = lk_check_index(cu_k, "cu_seqlens_k", 1, 1))) return s;
        if (cu_k->shape[0] != B + 1)
            return lk_fail(LK_ERR_SHAPE, "cu_seqlens_k: %lld entries, cu_seqlens_q has %lld",
                           (long long)cu_k->shape[0], (long long)(B + 1));
        Hk = k->shape[1];
        if (k->shape[2] != Dqk)
            return lk_fail(LK_ERR_SHAPE, "k: head dim %lld does not match q's %lld", (long long)k->shape[2], (long long)Dqk);
        if (v->shape[0] != k->shape[0] || v->shape[1] != Hk || v->shape[2] != Dv)
            return lk_fail(LK_ERR_SHAPE, "v: shape %s, expected [%lld, %lld, %lld]", lk_shape_str(v),
                           (long long)k->shape[0], (long long)Hk, (long long)Dv);
    } else {
        if (cu_k) return lk_fail(LK_ERR_VALUE, "cu_seqlens_k: must be NULL with a block_table (use seqused_k)");
        if (!used) return lk_fail(LK_ERR_NULL, "seqused_k: required with a block_table");
        if ((s = lk_check_index(table, "block_table", 2, 2))) return s;
        if ((s = lk_check_index(used, "seqused_k", 1, 1))) return s;
        if (table->shape[0] != B || used->shape[0] != B)
            return lk_fail(LK_ERR_SHAPE, "block_table %s / seqused_k %s: need %lld requests",
                           lk_shape_str(table), lk_shape_str(used), (long long)B);
        if ((s = lk_check_float8(k, "k", 4, 4)) || (s = lk_check_float8(v, "v", 4, 4))) return s;
        if (p->kv_layout == LK_KV_NZ) {
            int64_t tile = lk_is_fp8(k->dtype) ? 32 : 16, C; /* 1-byte caches: 32-wide tiles */
            if (__builtin_mul_overflow(k->shape[1], tile, &C))
                return lk_fail(LK_ERR_OVERFLOW, "k: NZ shape %s: %lld tiles of %lld overflow int64", lk_shape_str(k),
                               (long long)k->shape[1], (long long)tile);
            if (C % Dqk)
                return lk_fail(LK_ERR_SHAPE, "k: NZ page of %lld values is not a whole number of %lld-dim heads",
                               (long long)C, (long long)Dqk);
            Hk = C / Dqk;
        } else {
            Hk = k->shape[2];
        }
    }
    if (Hk < 1 || Hq % Hk)
        return lk_fail(LK_ERR_SHAPE, "q: %lld query heads are not a multiple of %lld KV heads",
                       (long long)Hq, (long long)Hk);
    lk_kv_layout lay = paged ? p->kv_layout : LK_KV_ND;
    if (paged) {
        if ((s = lk_paged_init8(&a->kc, k, lay, Hk, Dqk, "k"))) return s;
        if ((s = lk_paged_init8(&a->vc, v, lay, Hk, Dv, "v"))) return s;
        if (a->kc.num_blocks != a->vc.num_blocks || a->kc.block_size != a->vc.block_size)
            return lk_fail(LK_ERR_SHAPE, "v: cache pages (%lld x %lld) differ from k's (%lld x %lld)",
                           (long long)a->vc.num_blocks, (long long)a->vc.block_size,
                           (long long)a->kc.num_blocks, (long long)a->kc.block_size);
        /* an empty cache may have block_size 0 ([0, 0, Hk, D] is valid): no page exists,
         * and 1 keeps the page counts ceil(seqused_k / block_size) defined */
        if (a->kc.block_size < 1) a->kc.block_size = a->vc.block_size = 1;
    } else {
        /* a dense [Tk, Hk, D] view is one page of Tk slots */
        a->kc = (lk_paged){.data = k->data, .dtype = k->dtype, .layout = LK_KV_ND, .num_blocks = 1,
                           .block_size = k->shape[0], .H = Hk, .D = Dqk, .s0 = 0, .s1 = k->stride[0],
                           .s2 = k->stride[1], .s3 = k->stride[2], .tile = 16};
        a->vc = (lk_paged){.data = v->data, .dtype = v->dtype, .layout = LK_KV_ND, .num_blocks = 1,
                           .block_size = v->shape[0], .H = Hk, .D = Dv, .s0 = 0, .s1 = v->stride[0],
                           .s2 = v->stride[1], .s3 = v->stride[2], .tile = 16};
        lk_paged_drop_unit_strides(&a->kc);
        lk_paged_drop_unit_strides(&a->vc);
    }
    /* outputs: no self overlap, disjoint from every input and from each other */
    if ((s = lk_check_no_self_overlap(out, "out"))) return s;
    /* fp8 descales (since 0.3): [], [1], [Hk] or [B, Hk], finite and > 0; 1 for a q,
     * k or v that is not fp8 (validated all the same) */
    if ((s = lk_scale_init(&a->qd, p->q_descale, B, Hk, "q_descale")) ||
        (s = lk_scale_init(&a->kd, p->k_descale, B, Hk, "k_descale")) ||
        (s = lk_scale_init(&a->vd, p->v_descale, B, Hk, "v_descale")))
        return s;
    if (!lk_is_fp8(q->dtype)) lk_scale_init(&a->qd, NULL, B, Hk, "q_descale");
    if (!lk_is_fp8(k->dtype)) lk_scale_init(&a->kd, NULL, B, Hk, "k_descale");
    if (!lk_is_fp8(v->dtype)) lk_scale_init(&a->vd, NULL, B, Hk, "v_descale");
    /* fp8 out (lk_flash_attn_varlen_scaled): output_scale [1] / [] f32, finite and > 0 */
    a->out_scale = 1.0f;
    if (oscale && (s = lk_q_scale_in(oscale, "output_scale", &a->out_scale))) return s;
    const lk_tensor *ins[11] = {q, k, v, cu_q, cu_k, used, table, p->q_descale, p->k_descale, p->v_descale, oscale};
    const char *names[11] = {"q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "seqused_k", "block_table",
                             "q_descale", "k_descale", "v_descale", "output_scale"};
    if ((s = check_overlaps(out, "out", ins, names, 11))) return s;
    if (lse) {
        if ((s = lk_check_no_self_overlap(lse, "lse"))) return s;
        if ((s = check_overlaps(lse, "lse", ins, names, 11))) return s;
        if ((s = lk_check_disjoint(lse, "lse", out, "out"))) return s;
    }
    if (p->alibi_slopes) {
        if ((s = check_alibi(p->alibi_slopes, B, Hq, cp, &a->alibi_bstride))) return s;
        if ((s = lk_check_disjoint(out, "out", p->alibi_slopes, "alibi_slopes"))) return s;
        if (lse && (s = lk_check_disjoint(lse, "lse", p->alibi_slopes, "alibi_slopes"))) return s;
        a->alibi = cp->alibi;
    }
    /* index values */
    if (!(cp->cu_q = copy_index(cu_q))) return LK_ERR_NOMEM;
    if ((s = check_cu(cp->cu_q, B + 1, Tq, "cu_seqlens_q", "q"))) return s;
    if (!paged) {
        if (!(cp->cu_k = copy_index(cu_k))) return LK_ERR_NOMEM;
        if ((s = check_cu(cp->cu_k, B + 1, k->shape[0], "cu_seqlens_k", "k"))) return s;
        if (!(cp->used = malloc((size_t)(B > 0 ? B : 1) * sizeof(int32_t)))) return LK_ERR_NOMEM;
        for (int64_t b = 0; b < B; b++) cp->used[b] = cp->cu_k[b + 1] - cp->cu_k[b];
    } else {
        if (!(cp->used = copy_index(used)) || !(cp->table = copy_index(table))) return LK_ERR_NOMEM;
        int64_t maxp = table->shape[1], bs = a->kc.block_size;
        for (int64_t b = 0; b < B; b++) {
            if (cp->used[b] < 0 || cp->used[b] > maxp * bs)
                return lk_fail(LK_ERR_INDEX, "seqused_k: request %lld has %d keys, block_table holds %lld",
                               (long long)b, cp->used[b], (long long)(maxp * bs));
            int64_t pages = (cp->used[b] + bs - 1) / bs;
            for (int64_t j = 0; j < pages; j++) {
                int32_t pg = cp->table[b * maxp + j];
                if (pg < 0 || pg >= a->kc.num_blocks)
                    return lk_fail(LK_ERR_INDEX, "block_table: entry [%lld, %lld] = %d outside [0, %lld)",
                                   (long long)b, (long long)j, pg, (long long)a->kc.num_blocks);
            }
        }
        a->table_stride = maxp;
    }
    a->out = *out;
    if (lse) a->lse = *lse;
    a->has_lse = lse != NULL;
    a->q = *q;
    a->cu_q = cp->cu_q;
    a->k_start = paged ? NULL : cp->cu_k;
    a->k_len = cp->used;
    a->table = cp->table;
    a->B = B, a->Hq = Hq, a->Hk = Hk, a->Dqk = Dqk, a->Dv = Dv;
    a->scale = p->scale;
    a->softcap = p->softcap;
    a->wl = p->window_left;
    a->wr = p->causal ? 0 : p->window_right;
    if (p->causal && p->window_right > 0) a->wr = 0;
    return LK_OK;
}

static lk_status attn_run(const lk_tensor *out, const lk_tensor *lse, const lk_tensor *q, const lk_tensor *k,
                          const lk_tensor *v, const lk_tensor *cu_seqlens_q, const lk_tensor *cu_seqlens_k,
                          const lk_tensor *seqused_k, const lk_tensor *block_table, const lk_attn_params *params,
                          const lk_tensor *output_scale) {
    if (!out || !q || !k || !v || !cu_seqlens_q)
        return lk_fail(LK_ERR_NULL, "%s: tensor pointer is NULL",
                       !out ? "out" : !q ? "q" : !k ? "k" : !v ? "v" : "cu_seqlens_q");
    lk_attn_args a;
    memset(&a, 0, sizeof a);
    idx_copies cp = {0};
    lk_status s = check_attn(&a, &cp, out, lse, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k,
                             block_table, params, output_scale);
    if (s == LK_OK && lk_numel(out) > 0) s = lk_kernels()->flash_attn(&a);
    else if (s == LK_OK && lse && lk_numel(lse) > 0) s = lk_kernels()->flash_attn(&a);
    free_copies(&cp);
    if (s == LK_ERR_NOMEM && !lk_last_error()[0]) lk_fail(s, "out of memory for scratch buffers");
    return s;
}

lk_status lk_flash_attn_varlen(const lk_tensor *out, const lk_tensor *lse, const lk_tensor *q,
                               const lk_tensor *k, const lk_tensor *v, const lk_tensor *cu_seqlens_q,
                               const lk_tensor *cu_seqlens_k, const lk_tensor *seqused_k,
                               const lk_tensor *block_table, const lk_attn_params *params) {
    lk_clear_error();
    lk_set_op("lk_flash_attn_varlen");
    return attn_run(out, lse, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, params, NULL);
}

/* ---- fp8 output (since 0.3): vLLM's attention forward with output_scale ---- */
lk_status lk_flash_attn_varlen_scaled(const lk_tensor *out, const lk_tensor *lse, const lk_tensor *q,
                                      const lk_tensor *k, const lk_tensor *v, const lk_tensor *cu_seqlens_q,
                                      const lk_tensor *cu_seqlens_k, const lk_tensor *seqused_k,
                                      const lk_tensor *block_table, const lk_attn_params *params,
                                      const lk_tensor *output_scale) {
    lk_clear_error();
    lk_set_op("lk_flash_attn_varlen_scaled");
    if (!output_scale && out && out->ndim >= 0 && lk_is_fp8(out->dtype))
        return lk_fail(LK_ERR_NULL, "output_scale: tensor pointer is NULL (an fp8 out needs its scale)");
    return attn_run(out, lse, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, params, output_scale);
}
