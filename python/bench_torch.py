"""llmkern vs PyTorch CPU, side by side on the same tensors, both at the same thread count
(default 2): RMSNorm (F.rms_norm), SwiGLU (F.silu(x1) * x2), attention
(F.scaled_dot_product_attention, GQA through repeated K/V, against
flash_attn_varlen_func), RoPE and the LSE merge written in torch (vLLM's native forms),
and MLA prefix prefill (per request: gather the latent pages, F.linear through kv_b_proj,
SDPA over [prefix | current] with a bottom-right causal mask, against
mla_prefix_prefill). Prints both medians, torch / llmkern, the largest difference of the
outputs (MLA: the largest difference over the largest output magnitude) and whether they
agree within the dtype's tolerance; exits 1 when one does not.

Usage: python python/bench_torch.py [--threads N] [--quick]   (`make bench-torch`)
Notes on fairness: llmkern writes into preallocated outputs (that is its API) while the
torch expressions allocate theirs; torch's SDPA gets K/V already repeated to the query
heads and laid out contiguously as [B, H, L, D] (neither is timed); the RoPE and merge
baselines are the plain torch code vLLM falls back to on CPU, not fused kernels. The MLA
composition builds the gather indices, the projection, the key / value concatenation and
the SDPA layout inside the timed call; only the boolean masks (they depend on the lengths
alone) are built once beforehand; its repetitions are interleaved with llmkern's.
On a machine shared with other busy processes the 2-thread figures are unreliable: a
parallel region waits for a descheduled thread (multiples of ~4-12 ms scheduler slices
appear); the load average is printed for that reason.
"""
import argparse
import math
import os
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F

import llmkern as lk

BF16, F32 = torch.bfloat16, torch.float32
TOL = {BF16: 2e-2, F32: 1e-4}  # rtol = atol on outputs of magnitude ~1


def medians_s(fns, min_time, max_reps=50, min_reps=5):
    """Median seconds per call of each of fns, their repetitions interleaved (one call of
    each per round, the order rotated from round to round) when there are several."""
    for fn in fns:
        fn()
        fn()  # warm-up: first-touch of outputs, thread pools spinning up
    times = [[] for _ in fns]
    t_end = time.perf_counter() + min_time * len(fns)
    r = 0
    while r < min_reps or (r < max_reps and time.perf_counter() < t_end):
        for j in range(len(fns)):
            i = (j + r) % len(fns)
            t0 = time.perf_counter()
            fns[i]()
            times[i].append(time.perf_counter() - t0)
        r += 1
    return [statistics.median(t) for t in times]


def median_s(fn, min_time):
    return medians_s([fn], min_time)[0]


ROWS = []


def row(name, lk_fn, torch_fn, lk_out, torch_out, tol, min_time):
    """Time both (each in its own block of repetitions), then compare the outputs of one
    more call of each on the same inputs."""
    t_lk = median_s(lk_fn, min_time)
    t_th = median_s(torch_fn, min_time)
    a = lk_out().float()
    b = torch_out().float()
    diff = (a - b).abs()
    finite = bool(torch.isfinite(a).all() and torch.isfinite(b).all())
    ok = finite and bool((diff <= tol + tol * b.abs()).all())
    mx = float(diff.max()) if diff.numel() else 0.0
    ROWS.append(ok)
    print("%-44s %10.3f %10.3f %8.2fx %10.2e  %s" % (name, t_lk * 1e3, t_th * 1e3, t_th / t_lk, mx,
                                                     "ok" if ok else "MISMATCH"))


def rnd(shape, dtype, scale=1.0):
    return (torch.randn(shape, dtype=F32) * scale).to(dtype)


# ---------------------------------------------------------------- cases


def bench_rms_norm(T, D, dt, mt):
    x, w = rnd((T, D), dt), rnd((D,), dt)
    out = torch.empty_like(x)
    row("rms_norm [%d, %d] %s" % (T, D, _n(dt)), lambda: lk.rms_norm(out, x, w, 1e-6),
        lambda: F.rms_norm(x, (D,), w, 1e-6),
        lambda: (lk.rms_norm(out, x, w, 1e-6), out)[1], lambda: F.rms_norm(x, (D,), w, 1e-6),
        TOL[dt], mt)


def bench_silu(T, d, dt, mt):
    x = rnd((T, 2 * d), dt, 2.0)
    out = torch.empty((T, d), dtype=dt)

    def th():
        return F.silu(x[:, :d]) * x[:, d:]
    row("silu_and_mul [%d, 2x%d] %s" % (T, d, _n(dt)), lambda: lk.silu_and_mul(out, x), th,
        lambda: (lk.silu_and_mul(out, x), out)[1], th, TOL[dt], mt)


def bench_attention(name, B, Lq, Lk, Hq, Hk, D, dt, mt):
    """B requests of Lq queries over Lk keys each, bottom-right causal (decode: Lq = 1)."""
    q, k, v = rnd((B * Lq, Hq, D), dt), rnd((B * Lk, Hk, D), dt), rnd((B * Lk, Hk, D), dt)
    cu_q = torch.arange(0, B * Lq + 1, Lq, dtype=torch.int32)
    cu_k = torch.arange(0, B * Lk + 1, Lk, dtype=torch.int32)
    out = torch.empty((B * Lq, Hq, D), dtype=dt)
    scale = 1.0 / math.sqrt(D)
    # torch: contiguous [B, H, L, D] with K/V repeated to the query heads (done once, not
    # timed; transposed views instead of copies make torch's CPU SDPA ~3x slower)
    tq = q.view(B, Lq, Hq, D).transpose(1, 2).contiguous()
    tk = k.view(B, Lk, Hk, D).repeat_interleave(Hq // Hk, dim=2).transpose(1, 2).contiguous()
    tv = v.view(B, Lk, Hk, D).repeat_interleave(Hq // Hk, dim=2).transpose(1, 2).contiguous()
    causal = Lq > 1
    assert not causal or Lq == Lk  # torch's is_causal is top-left aligned: equal lengths only

    def lk_call():
        return lk.flash_attn_varlen_func(q, k, v, cu_q, cu_k, Lq, Lk, softmax_scale=scale,
                                         causal=causal, out=out)

    def th():
        return F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal, scale=scale)

    row("%s [%dx%d q, %d k, %d/%d heads, %d] %s" % (name, B, Lq, Lk, Hq, Hk, D, _n(dt)), lk_call, th,
        lambda: lk_call(), lambda: th().transpose(1, 2).reshape(B * Lq, Hq, D), TOL[dt], mt)


def rope_torch(positions, q, k, head_size, cache, hq, hk):
    """vLLM's RotaryEmbedding.forward_native (NeoX, rot = head_size), math in q's dtype."""
    cos, sin = cache.index_select(0, positions).chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)

    def rot(x, h):
        x = x.view(x.shape[0], h, head_size)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(1)
    return rot(q, hq), rot(k, hk)


def bench_rope(T, Hq, Hk, D, dt, mt):
    pos = torch.arange(T, dtype=torch.int64) % 4096
    inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    ang = torch.arange(4096, dtype=torch.float64)[:, None] * inv[None, :]
    cache32 = torch.cat((ang.cos(), ang.sin()), dim=1).float()
    cache = cache32.to(dt)  # vLLM converts the cache to the activations' dtype
    q0, k0 = rnd((T, Hq * D), dt), rnd((T, Hk * D), dt)
    q, k = q0.clone(), k0.clone()

    def lk_fresh():  # one call on the original values, for the comparison
        q.copy_(q0)
        lk.rotary_embedding(pos, q, None, D, cache, True)
        return q
    # timing: in place on q and k (rotating again each repetition keeps the values bounded)
    row("rope neox q [%d, %dx%d] + k %d heads %s" % (T, Hq, D, Hk, _n(dt)),
        lambda: lk.rotary_embedding(pos, q, k, D, cache, True),
        lambda: rope_torch(pos, q0, k0, D, cache, Hq, Hk),
        lk_fresh, lambda: rope_torch(pos, q0, k0, D, cache, Hq, Hk)[0], 2 * TOL[dt], mt)


def merge_torch(prefix_output, prefix_lse, suffix_output, suffix_lse):
    """vLLM's torch merge (LSE [H, T]); +inf LSEs count as empty."""
    p_lse = torch.where(prefix_lse == math.inf, -math.inf, prefix_lse)
    s_lse = torch.where(suffix_lse == math.inf, -math.inf, suffix_lse)
    m = torch.maximum(p_lse, s_lse)
    p_se, s_se = torch.exp(p_lse - m), torch.exp(s_lse - m)
    tot = p_se + s_se
    out = (prefix_output.float() * (p_se / tot).T.unsqueeze(-1)
           + suffix_output.float() * (s_se / tot).T.unsqueeze(-1))
    return out.to(prefix_output.dtype), torch.log(tot) + m


def bench_merge(T, H, D, dt, mt):
    a, b = rnd((T, H, D), dt), rnd((T, H, D), dt)
    la, lb = rnd((H, T), F32, 3.0), rnd((H, T), F32, 3.0)
    out = torch.empty((T, H, D), dtype=dt)
    out_lse = torch.empty((H, T), dtype=F32)
    row("merge_attn_states [%d, %d, %d] %s" % (T, H, D, _n(dt)),
        lambda: lk.merge_attn_states(out, a, la, b, lb, out_lse),
        lambda: merge_torch(a, la, b, lb),
        lambda: (lk.merge_attn_states(out, a, la, b, lb, out_lse), out)[1],
        lambda: merge_torch(a, la, b, lb)[0], TOL[dt], mt)


def mla_torch(q, k, v, cu, prefix_lens, block_table, cache, w, scale, masks, dl, dv, page):
    """MLA prefix prefill composed of torch ops, request by request: the latent pages of
    the prefix gathered from the cache (kv_c [P, Dl], k_pe [P, Dr]), projected by
    F.linear through kv_b_proj into k_nope and v per head, the prefix keys
    [k_nope | k_pe broadcast over the heads] and values concatenated with the request's
    current k / v, one SDPA over [prefix | current] under masks[b] (query i sees every
    prefix key and current keys j <= i) with the explicit scale."""
    H = v.shape[1]
    dn = w.shape[0] // H - dv
    flat = cache.view(-1, cache.shape[-1])  # [blocks * page, Dl + Dr]
    outs = []
    for b in range(len(prefix_lens)):
        s, e, P = int(cu[b]), int(cu[b + 1]), int(prefix_lens[b])
        t = torch.arange(P)
        lat = flat.index_select(0, block_table[b, t // page].long() * page + t % page)
        kv_c, k_pe = lat[:, :dl], lat[:, dl:]
        kv = F.linear(kv_c, w).view(P, H, dn + dv)
        k_nope, v_pre = kv[..., :dn], kv[..., dn:]
        k_pre = torch.cat((k_nope, k_pe[:, None, :].expand(P, H, k_pe.shape[1])), dim=-1)
        keys = torch.cat((k_pre, k[s:e])).transpose(0, 1).contiguous()  # [H, P + Q, Dqk]
        vals = torch.cat((v_pre, v[s:e])).transpose(0, 1).contiguous()
        o = F.scaled_dot_product_attention(q[s:e].transpose(0, 1).contiguous(), keys, vals,
                                           attn_mask=masks[b], scale=scale)
        outs.append(o.transpose(0, 1))
    return torch.cat(outs)


def bench_mla_prefill(B, Q, P, mt, H=4, dn=128, dr=64, dv=128, dl=512, page=128):
    """B requests of Q new tokens over P cached prefix tokens each, every request on its
    own pages scattered over a one-buffer ND latent cache [blocks, page, Dl + Dr] (block
    0 unused), bf16 throughout; llmkern's auto strategy. The outputs are compared before
    the timing."""
    T, pages = B * Q, B * ((P + page - 1) // page)
    q, k, v = rnd((T, H, dn + dr), BF16), rnd((T, H, dn + dr), BF16), rnd((T, H, dv), BF16)
    k[:, :, dn:] = k[:, :1, dn:]  # k_rope is shared by the heads
    cache = rnd((pages + 1, page, dl + dr), BF16)
    w = rnd((H * (dn + dv), dl), BF16, 1.0 / math.sqrt(dl))
    cu = torch.arange(0, T + 1, Q, dtype=torch.int32)
    plens = torch.full((B,), P, dtype=torch.int32)
    table = (torch.randperm(pages, dtype=torch.int32) + 1).view(B, -1)
    out = torch.empty((T, H, dv), dtype=BF16)
    scale = 1.0 / math.sqrt(dn + dr)
    j, i = torch.arange(P + Q)[None, :], torch.arange(Q)[:, None]
    masks = [j <= P + i] * B  # [Q, P + Q]: every prefix key, current keys up to the query's

    def lk_call():
        return lk.mla_prefix_prefill(q, k, v, cu, plens, table, cache, w, scale, out=out)

    def th():
        return mla_torch(q, k, v, cu, plens, table, cache, w, scale, masks, dl, dv, page)

    a, ref = lk_call().float(), th().float()
    choice = lk.mla_last_trace().split()[0].replace("strategy=", "")
    rel = float((a - ref).abs().max() / ref.abs().max())
    ok = bool(torch.isfinite(a).all() and torch.isfinite(ref).all()) and rel <= TOL[BF16]
    ROWS.append(ok)
    t_lk, t_th = medians_s([lk_call, th], mt)
    print("%-44s %10.3f %10.3f %8.2fx %10.2e  %s" % (
        "mla prefill (%d,%d,%d) %dh bf16 [%s]" % (B, Q, P, H, choice), t_lk * 1e3, t_th * 1e3,
        t_th / t_lk, rel, "ok" if ok else "MISMATCH"))


def _n(dt):
    return str(dt).replace("torch.", "")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="shorter timing windows")
    args = ap.parse_args()
    mt = 0.15 if args.quick else 0.5
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    lk.set_num_threads(args.threads)
    print("llmkern %s (isa %s, %s) vs torch %s, %d threads each; load average %.2f on %d CPUs"
          % (lk.version(), lk.isa(), lk.lib_path, torch.__version__, args.threads,
             os.getloadavg()[0], os.cpu_count()))
    print("%-44s %10s %10s %9s %10s  %s" % ("case", "llmkern ms", "torch ms", "torch/lk", "max|diff|", "agree"))
    bench_rms_norm(16, 4096, BF16, mt)
    bench_rms_norm(4096, 4096, BF16, mt)
    bench_rms_norm(4096, 4096, F32, mt)
    bench_silu(16, 14336, BF16, mt)
    bench_silu(1024, 14336, BF16, mt)
    bench_silu(1024, 14336, F32, mt)
    bench_attention("sdpa prefill causal", 1, 2048, 2048, 16, 4, 128, BF16, mt)
    bench_attention("sdpa prefill causal", 1, 2048, 2048, 16, 4, 128, F32, mt)
    bench_attention("sdpa decode", 16, 1, 2048, 32, 8, 128, BF16, mt)
    bench_rope(16, 32, 8, 128, BF16, mt)
    bench_rope(4096, 32, 8, 128, BF16, mt)
    bench_merge(16, 16, 128, BF16, mt)
    bench_merge(4096, 16, 128, BF16, mt)
    bench_merge(4096, 16, 128, F32, mt)
    print("mla_prefix_prefill vs the torch composition (repetitions interleaved; last column: "
          "max|diff| / max|torch|)")
    for B, Q, P in ((1, 100, 768), (8, 100, 768), (32, 100, 768), (1, 1024, 8192)):
        bench_mla_prefill(B, Q, P, mt)
    bad = ROWS.count(False)
    print("%d cases, %d agree, %d mismatch" % (len(ROWS), len(ROWS) - bad, bad))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
