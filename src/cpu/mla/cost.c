/*
 * MLA prefix prefill, the cost model of LK_MLA_AUTO: predicted single-thread seconds of
 * each strategy from the shapes (cost.h). Every term is FLOPs (2 per multiply-add) over
 * an effective rate, a fraction of the peak of the kernel family that runs it: F = one
 * core's f32 FMA peak (oneDNN's f32 GEMMs, flash_attn's f32 tiles, the online engine),
 * D = one core's bf16 dot-product peak (oneDNN's bf16 GEMMs on VDPBF16PS), or seconds
 * per element moved. Per request (Q new tokens, P prefix tokens), with Dqk = Dn + Dr,
 * rows = unique prefix rows (pages * bs), names as in lk_mla_calib:
 *   gather        rows ((Dl + Dr - f8) + f8 gather8) gather_s, f8 = entry dims in fp8 caches
 *                 (widened through a table where the gathered bf16 / f32 entries are
 *                 copied; the same for every strategy, so it never changes the pick)
 *   project       2 rows Dl H (Dn + Dv) / (proj16 D) on bf16 operands, / (proj32 F) else
 *   flash_prefix  2 H (Dqk + Dv) Q P / (fp_eff F Q / (Q + fp_q0) l3), split and concat
 *                 (projected K / V are f32); l3 = min(1, sqrt(l3_bytes / (P H (Dqk + Dv)
 *                 4))): the packed f32 K/V of one request falling out of the L3
 *   flash_current 2 H (Dqk + Dv) Q (Q + 1) / 2 / (fc_eff F Q / (Q + fc_q0)), causal;
 *                 x fc_qk16 faster with Q.K^T on bf16 dot products (cur_bf16 >= 1), and
 *                 x fc_pv16 more with P.V too (cur_bf16 = 2), which split_merge takes
 *                 only without a prefix (it writes out itself)
 *   concat copy   (P + Q) H (Dqk + Dv) copy_s
 *   engine        2 H (Dqk + Dv) Q (P + (Q + diag) / 2 / diag_eff) / (eng_eff F n / (n +
 *                 eng_n0)), n = Q: fused, and absorbed's current keys with n = the tokens
 *                 of one unit, Q / ceil(Q H / unit_rows), when it has a prefix; the causal
 *                 diagonal runs in diag-key chunks (~diag / 2 wasted keys per query, and
 *                 narrower GEMMs: diag_eff)
 *   latent        2 H (2 Dl + Dr) Q P / (lat rate r / (r + lat_r0) P / (P + lat_p0)),
 *                 r = min(Q H, unit_rows), absorbed's attention over the cached latents;
 *                 lat rate = lat16 D on bf16 operands (lat_bf16), lat32 F else
 *   absorb        2 Q H (Dn Dl + Dl Dv) / (abs_eff F), its two GEMMs (prefix requests)
 *   split_merge = gather + project + flash_prefix + flash_current
 *   concat      = split_merge + concat copy
 *   fused       = gather + project + engine
 *   absorbed    = latent + engine (current keys) + absorb + gather (when rows > 0)
 */
#include <math.h>

#include "cost.h"

/* Calibration: one machine's measured figures, as fractions of its two peaks. How to
 * re-measure: scripts/mla_calibrate.py (bf16 and --dtype f32) times every strategy's ops
 * through the trace on one thread, DeepSeek dims (H = 4 and 16, Dqk / Dv / Dl = 192 /
 * 128 / 512, page 128), 17 shapes Q 8..1024, P 0..8192, B 1..10, the strategies
 * interleaved in rounds, medians; every constant below is fitted to the op times
 * (least squares on log time), then the model's pick is checked against the fastest.
 * These: AMD EPYC Zen 4, 2 cores, F = 117 GFLOP/s and D = 233 GFLOP/s per core (the
 * bench's probes at 2 threads, halved), oneDNN 2.6, ISA avx512bf16, 3 rounds: e.g. the
 * bf16 projection 184 GFLOP/s, f32 82; flash prefix 65 at Q = 100 and 90 at Q = 1024;
 * the engine 80 at Q = 100, 93 at 1024; the latent attention on bf16 operands 140-175,
 * on f32 100-115. The pick was the fastest or within 5% of it on 31 of the 32 (shape,
 * dtype) cases and on the bench's B10 mixed batch (one request over a prefix, nine long
 * ones without); the miss: f32, Q = 256 without a prefix, fused 1.24x slower than
 * split_merge (0.3 ms). On a CPU without bf16 dot products every term is of the f32
 * family (proj_bf16 = lat_bf16 = 0). */
typedef struct {
    double F;           /* one core's f32 FMA peak, FLOP/s */
    double D;           /* one core's bf16 dot-product peak */
    double proj16;      /* projection on bf16 operands: fraction of D */
    double proj32;      /* ... on f32 operands: fraction of F */
    double gather_s;    /* s per cached element gathered */
    double gather8;     /* ... times this for an fp8 element (table widening) */
    double copy_s;      /* s per float concat copies */
    double fp_eff;      /* flash over the prefix: fraction of F ... */
    double fp_q0;       /* ... reached as Q / (Q + fp_q0) (few queries per K/V panel) */
    double l3_bytes;    /* packed K/V of one request beyond this leaves the L3 */
    double fc_eff;      /* flash over the current tokens: fraction of F ... */
    double fc_q0;       /* ... reached as Q / (Q + fc_q0) */
    double fc_qk16;     /* ... times this with Q.K^T on bf16 dot products */
    double fc_pv16;     /* ... and this with P.V too (bf16 out written by flash_attn) */
    double eng_eff;     /* online-softmax engine (online.c): fraction of F ... */
    double eng_n0;      /* ... reached as n / (n + eng_n0), n query rows per unit */
    double diag;        /* keys per causal diagonal chunk (LK_MLA_KD) */
    double diag_eff;    /* the diagonal chunks' rate over the engine's */
    double lat16;       /* absorbed's latent engine (one KV head) on bf16: fraction of D */
    double lat32;       /* ... on f32: fraction of F; both reached as ... */
    double lat_r0;      /* ... r / (r + lat_r0), r (head, token) rows per unit, and ... */
    double lat_p0;      /* ... P / (P + lat_p0) (a unit's fixed costs over its prefix) */
    double unit_rows;   /* (head, token) rows per absorbed unit (absorbed.c's RB) */
    double abs_eff;     /* absorb_q / absorb_out GEMMs (M = a unit's tokens): fraction of F */
} lk_mla_calib;

static const lk_mla_calib CAL = {
    .F = 117e9,
    .D = 233e9,
    .proj16 = 0.79,
    .proj32 = 0.70,
    .gather_s = 3e-10,
    .gather8 = 2.7, /* one thread, (8, 4, 768) entries: 0.32 ns per fp8 element, 0.12 per bf16 one */
    .copy_s = 8.7e-10,
    .fp_eff = 0.905,
    .fp_q0 = 99,
    .l3_bytes = 24e6,
    .fc_eff = 0.872,
    .fc_q0 = 317,
    .fc_qk16 = 1.236,
    .fc_pv16 = 1.138,
    .eng_eff = 0.843,
    .eng_n0 = 19.5,
    .diag = 64,
    .diag_eff = 0.75,
    .lat16 = 0.905,
    .lat32 = 0.957,
    .lat_r0 = 16,
    .lat_p0 = 122,
    .unit_rows = 128,
    .abs_eff = 0.9,
};

static double eng_rate(double n) { return CAL.eng_eff * CAL.F * n / (n + CAL.eng_n0); }

lk_mla_strategy lk_mla_choose(const lk_mla_shape *s, double cost[5]) {
    const double F = CAL.F;
    double H = (double)s->H, Dqk = (double)(s->Dn + s->Dr), Dv = (double)s->Dv, Dl = (double)s->Dl;
    double E = Dl + (double)s->Dr, rows = (double)s->unique_rows, pre_flash = 0, cur_flash = 0, fused = 0;
    double absorbed = 0, keys = 0, t_abs = 0;
    double lat = s->lat_bf16 ? CAL.lat16 * CAL.D : CAL.lat32 * F;
    double fc = CAL.fc_eff * F * (s->cur_bf16 ? CAL.fc_qk16 : 1);
    for (int64_t b = 0; b < s->B; b++) {
        double Q = s->q_len[b], P = s->prefix[b];
        if (Q <= 0) continue;
        keys += P + Q;
        double slab = P * H * (Dqk + Dv) * 4, l3 = slab > CAL.l3_bytes ? sqrt(CAL.l3_bytes / slab) : 1;
        double diag = 2 * H * (Dqk + Dv) * Q * (Q + CAL.diag) / 2 / CAL.diag_eff; /* engine's causal part */
        pre_flash += 2 * H * (Dqk + Dv) * Q * P / (CAL.fp_eff * F * Q / (Q + CAL.fp_q0) * l3);
        cur_flash += 2 * H * (Dqk + Dv) * Q * (Q + 1) / 2 / (fc * Q / (Q + CAL.fc_q0));
        fused += (2 * H * (Dqk + Dv) * Q * P + diag) / eng_rate(Q);
        if (P > 0) {
            double r = Q * H < CAL.unit_rows ? Q * H : CAL.unit_rows;
            double na = Q / ceil(Q * H / CAL.unit_rows); /* tokens per unit */
            absorbed += 2 * H * (2 * Dl + (double)s->Dr) * Q * P / (lat * r / (r + CAL.lat_r0) * P / (P + CAL.lat_p0));
            absorbed += diag / eng_rate(na);
            t_abs += Q;
        } else {
            absorbed += diag / eng_rate(Q);
        }
    }
    double gather = rows * (E - (double)s->f8_dims + (double)s->f8_dims * CAL.gather8) * CAL.gather_s;
    double proj = 2 * rows * Dl * H * (double)(s->Dn + s->Dv) / (s->proj_bf16 ? CAL.proj16 * CAL.D : CAL.proj32 * F);
    absorbed += 2 * t_abs * H * (double)(s->Dn * s->Dl + s->Dl * s->Dv) / (CAL.abs_eff * F) + (rows > 0 ? gather : 0);
    cost[0] = 0;
    cost[LK_MLA_SPLIT_MERGE] = gather + proj + pre_flash + cur_flash / (s->cur_bf16 == 2 && rows == 0 ? CAL.fc_pv16 : 1);
    cost[LK_MLA_CONCAT] = gather + proj + keys * H * (Dqk + Dv) * CAL.copy_s + pre_flash + cur_flash;
    cost[LK_MLA_FUSED] = gather + proj + fused;
    cost[LK_MLA_ABSORBED] = absorbed;
    lk_mla_strategy best = LK_MLA_SPLIT_MERGE;
    for (int i = 2; i < 5; i++)
        if (cost[i] < cost[best]) best = (lk_mla_strategy)i;
    return best;
}
