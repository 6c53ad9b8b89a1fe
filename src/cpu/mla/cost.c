/*
 * MLA prefix prefill, the cost model of LK_MLA_AUTO: predicted single-thread seconds of
 * each strategy from the shapes (cost.h). Every term is FLOPs (2 per multiply-add) over
 * an effective rate, a fraction of R = the prefix projection's f32 rate (GEMM + scatter;
 * proj_bf16 R when it runs on bf16 operands), or seconds per element moved. Per request (Q new tokens, P prefix tokens), with
 * Dqk = Dn + Dr, rows = unique prefix rows (pages * bs), names as in lk_mla_calib:
 *   gather        rows (Dl + Dr) gather_s
 *   project       2 rows Dl H (Dn + Dv) / R   (/ (proj_bf16 R) on bf16 operands)
 *   flash_prefix  2 H (Dqk + Dv) Q P / (fp_eff R Q / (Q + fp_q0) l3), split and concat;
 *                 l3 = min(1, sqrt(l3_bytes / (P H (Dqk + Dv) 4))): the packed f32 K/V
 *                 of one request falling out of the L3
 *   flash_current 2 H (Dqk + Dv) Q (Q + 1) / 2 / (R Q / (Q + fc_q0)), causal
 *   concat copy   (P + Q) H (Dqk + Dv) copy_s
 *   engine        2 H (Dqk + Dv) Q (P + (Q + diag) / 2) / (eng_eff R n / (n + eng_n0)),
 *                 n = Q: fused, and absorbed's current keys with n = the tokens of one
 *                 unit, Q / ceil(Q H / unit_rows), when it has a prefix; the causal
 *                 diagonal runs in diag-key chunks (~diag / 2 wasted keys per query)
 *   latent        2 H (2 Dl + Dr) Q P / (lat_eff R r / (r + lat_r0)),
 *                 r = min(Q H, unit_rows), absorbed's attention over the cached latents
 *   absorb        2 Q H (Dn Dl + Dl Dv) / (abs_eff R), its two GEMMs (prefix requests)
 *   split_merge = gather + project + flash_prefix + flash_current
 *   concat      = split_merge + concat copy
 *   fused       = gather + project + engine
 *   absorbed    = latent + engine (current keys) + absorb + gather (when rows > 0)
 */
#include <math.h>

#include "cost.h"

/* Calibration: one machine's measured figures. How to re-measure: time every
 * strategy's ops through the trace (lk_mla_last_trace) on one thread, DeepSeek dims
 * (H = 4 and 16, Dqk / Dv / Dl = 192 / 128 / 512, page 128, bf16), over shapes
 * Q 50..1024, P 0..8192, B 1..16, the strategies interleaved in rounds and medians
 * taken (a shared machine's speed drifts: use ratios within a round only); R is the
 * projection's FLOP rate, every other rate is fitted as a fraction of it over the
 * shapes, then check that the model picks the fastest strategy or one within 5%.
 * These: AMD EPYC Zen 3, 2 cores, OpenBLAS 0.3.21 Zen kernels, 14 shapes, rounds of 5;
 * measured e.g. flash prefix 0.30 R at Q = 50, 0.45-0.6 R at 100, 0.7 R at 256,
 * 0.86-0.92 R at 1024; latent 0.94-1.10 R everywhere; engine 0.52 R at Q = 50, 0.7 R
 * at 100, 0.9 R at 256+. The model's pick was the fastest or within 5% of it on 13 of
 * the 14 shapes (the miss: 9% at Q = 150, P = 1024, the absorbed / fused crossover).
 * proj_bf16 (the projection on bf16 operands, oneDNN) was measured on Zen 4 with the
 * other fractions kept: it moved the Q = 100, P = 768 cases from absorbed to fused,
 * which the bench measured 15-20% faster there (bench --only mla_prefill, /bst). */
typedef struct {
    double R;           /* FLOP/s of the prefix projection in f32 (GEMM + scatter) */
    double proj_bf16;   /* the projection's rate on bf16 operands, over R (oneDNN, single
                           thread on Zen 4, N = 1024 / 4096: 132 / 141 GFLOP/s bf16 against
                           61 / 64 f32 and OpenBLAS's 63 / 66: 2.1) */
    double gather_s;    /* s per cached element gathered */
    double copy_s;      /* s per float concat copies */
    double fp_eff;      /* flash over the prefix: peak fraction of R ... */
    double fp_q0;       /* ... reached as Q / (Q + fp_q0) (few queries per K/V panel) */
    double l3_bytes;    /* packed K/V of one request beyond this leaves the L3 (0.69 R
                           at Q = 1024, P = 8192 against 0.92 R at P = 2048) */
    double fc_q0;       /* flash over the current tokens: R Q / (Q + fc_q0) */
    double eng_eff;     /* online-softmax engine (online.c): peak fraction of R ... */
    double eng_n0;      /* ... reached as n / (n + eng_n0), n query rows per unit */
    double diag;        /* keys per causal diagonal chunk (LK_MLA_KD) */
    double lat_eff;     /* absorbed's latent engine (one KV head): peak fraction of R ... */
    double lat_r0;      /* ... reached as r / (r + lat_r0), r (head, token) rows per unit */
    double unit_rows;   /* (head, token) rows per absorbed unit (absorbed.c's RB) */
    double abs_eff;     /* absorb_q / absorb_out sgemms (M = a unit's tokens): fraction of R */
} lk_mla_calib;

static const lk_mla_calib CAL = {
    .R = 58e9,
    .proj_bf16 = 2.1,
    .gather_s = 6e-10,
    .copy_s = 3e-9,
    .fp_eff = 0.95,
    .fp_q0 = 110,
    .l3_bytes = 24e6,
    .fc_q0 = 250,
    .eng_eff = 0.95,
    .eng_n0 = 40,
    .diag = 64,
    .lat_eff = 1.05,
    .lat_r0 = 16,
    .unit_rows = 128,
    .abs_eff = 0.6,
};

static double eng_rate(double R, double n) { return CAL.eng_eff * R * n / (n + CAL.eng_n0); }

lk_mla_strategy lk_mla_choose(const lk_mla_shape *s, double cost[5]) {
    const double R = CAL.R;
    double H = (double)s->H, Dqk = (double)(s->Dn + s->Dr), Dv = (double)s->Dv, Dl = (double)s->Dl;
    double E = Dl + (double)s->Dr, rows = (double)s->unique_rows, pre_flash = 0, cur_flash = 0, fused = 0;
    double absorbed = 0, keys = 0, t_abs = 0;
    for (int64_t b = 0; b < s->B; b++) {
        double Q = s->q_len[b], P = s->prefix[b];
        if (Q <= 0) continue;
        keys += P + Q;
        double slab = P * H * (Dqk + Dv) * 4, l3 = slab > CAL.l3_bytes ? sqrt(CAL.l3_bytes / slab) : 1;
        pre_flash += 2 * H * (Dqk + Dv) * Q * P / (CAL.fp_eff * R * Q / (Q + CAL.fp_q0) * l3);
        cur_flash += 2 * H * (Dqk + Dv) * Q * (Q + 1) / 2 / (R * Q / (Q + CAL.fc_q0));
        fused += 2 * H * (Dqk + Dv) * Q * (P + (Q + CAL.diag) / 2) / eng_rate(R, Q);
        if (P > 0) {
            double r = Q * H < CAL.unit_rows ? Q * H : CAL.unit_rows;
            double na = Q / ceil(Q * H / CAL.unit_rows); /* tokens per unit */
            absorbed += 2 * H * (2 * Dl + (double)s->Dr) * Q * P / (CAL.lat_eff * R * r / (r + CAL.lat_r0));
            absorbed += 2 * H * (Dqk + Dv) * Q * (Q + CAL.diag) / 2 / eng_rate(R, na);
            t_abs += Q;
        } else {
            absorbed += 2 * H * (Dqk + Dv) * Q * (Q + CAL.diag) / 2 / eng_rate(R, Q);
        }
    }
    double gather = rows * E * CAL.gather_s;
    double proj = 2 * rows * Dl * H * (double)(s->Dn + s->Dv) / (s->proj_bf16 ? CAL.proj_bf16 * R : R);
    absorbed += 2 * t_abs * H * (double)(s->Dn * s->Dl + s->Dl * s->Dv) / (CAL.abs_eff * R) + (rows > 0 ? gather : 0);
    cost[0] = 0;
    cost[LK_MLA_SPLIT_MERGE] = gather + proj + pre_flash + cur_flash;
    cost[LK_MLA_CONCAT] = gather + proj + keys * H * (Dqk + Dv) * CAL.copy_s + pre_flash + cur_flash;
    cost[LK_MLA_FUSED] = gather + proj + fused;
    cost[LK_MLA_ABSORBED] = absorbed;
    lk_mla_strategy best = LK_MLA_SPLIT_MERGE;
    for (int i = 2; i < 5; i++)
        if (cost[i] < cost[best]) best = (lk_mla_strategy)i;
    return best;
}
