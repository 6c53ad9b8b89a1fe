#!/usr/bin/env python3
"""Measurements behind the MLA cost model (src/cpu/mla/cost.c): on one thread, every
strategy of mla_prefix_prefill over a grid of DeepSeek-shaped cases (one
ND latent cache buffer; bf16 throughout or, with --dtype f32, f32; QK 192 / V 128 / latent 512, page 128), interleaved in rounds,
medians of each op's time from the call's trace (mla_last_trace). Prints, per case, the
strategies' medians, the model's predictions (the auto trace's "model ms") and each op's
time, so every rate constant of cost.c can be refitted; then the cases where the
model's pick is more than 5% slower than the best.

  PYTHONPATH=python python3 scripts/mla_calibrate.py [--rounds N] [--quick]
Needs torch (the inputs) and the binding (LLMKERN_LIB may name the library)."""
import argparse, math, re, statistics, sys, time
import torch
import llmkern as lk

STRATS = ["split_merge", "concat", "fused", "absorbed"]
DN, DR, DV, DL, PAGE = 128, 64, 128, 512, 128


def inputs(B, Q, P, H, dtype=torch.bfloat16):
    """B requests of Q new tokens over P cached ones (Q, P: numbers or lists of B)"""
    g = torch.Generator().manual_seed(1)
    bf = dtype
    r = lambda *s: torch.randn(*s, generator=g).to(bf)
    ql = Q if isinstance(Q, list) else [Q] * B
    pl = P if isinstance(P, list) else [P] * B
    npg = max((p + PAGE - 1) // PAGE for p in pl)
    T, pages = sum(ql), B * npg
    q, k, v = r(T, H, DN + DR), r(T, H, DN + DR), r(T, H, DV)
    k[:, :, DN:] = k[:, :1, DN:]
    cache = r(pages + 1, PAGE, DL + DR)
    w = (torch.randn(H * (DN + DV), DL, generator=g) / math.sqrt(DL)).to(bf)
    cu = torch.tensor([0] + [sum(ql[:i + 1]) for i in range(B)], dtype=torch.int32)
    plens = torch.tensor(pl, dtype=torch.int32)
    table = (torch.randperm(max(pages, 1), generator=g, dtype=torch.int32) + 1)[:pages].view(B, -1)
    if pages == 0:
        table = torch.ones((B, 1), dtype=torch.int32)
    out = torch.empty((T, H, DV), dtype=bf)
    return (q, k, v, cu, plens, table, cache, w, 1.0 / math.sqrt(DN + DR)), out


def ops_of(trace):
    """{op name: ms} from a trace (items '<name> ... [x ms]', repeated names summed)"""
    d = {}
    for item in trace.split("; "):
        m = re.match(r"(\S+).*\[([0-9.]+) ms\]$", item)
        if m:
            name = m.group(1).split("=")[0]
            d[name] = d.get(name, 0.0) + float(m.group(2))
    return d


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--case", type=int, default=-1, help="only this case of the grid (index)")
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16",
                    help="every tensor's dtype (f32: the f32 GEMM family throughout)")
    o = ap.parse_args()
    lk.set_num_threads(1)
    torch.set_num_threads(1)
    cases = [(1, 50, 768, 4), (1, 100, 768, 4), (4, 100, 768, 4), (1, 100, 2048, 4), (1, 150, 1024, 4),
             (1, 256, 2048, 4), (1, 256, 512, 4), (1, 512, 2048, 4), (1, 1024, 1024, 4), (1, 1024, 8192, 4),
             (1, 100, 768, 16), (1, 256, 2048, 16), (1, 32, 4096, 4), (1, 256, 0, 4), (2, 1024, 0, 4),
             (1, 8, 2048, 16),
             (10, [101, 870, 876, 874, 869, 864, 904, 863, 837, 768], [768] + [0] * 9, 4)]  # the bench's B10
    if o.quick:
        cases = cases[:4]
    if o.case >= 0:
        cases = cases[o.case:o.case + 1]
    print("isa %s, %s, 1 thread, %d rounds; per case: strategy median ms (model ms) and op ms" %
          (lk.isa(), o.dtype, o.rounds))
    misses = 0
    for (B, Q, P, H) in cases:
        args, out = inputs(B, Q, P, H, torch.float32 if o.dtype == "f32" else torch.bfloat16)
        lk.mla_prefix_prefill(*args, out=out)
        auto_tr = lk.mla_last_trace()
        choice = auto_tr.split()[0].replace("strategy=", "")
        model = dict(re.findall(r"(split_merge|concat|fused|absorbed) ([0-9.]+)", auto_tr))
        tot = {s: [] for s in STRATS}
        ops = {s: {} for s in STRATS}
        for s in STRATS:  # warm-up
            lk.mla_prefix_prefill(*args, out=out, strategy=s)
        for rnd in range(o.rounds):
            for i in range(len(STRATS)):
                s = STRATS[(i + rnd) % len(STRATS)]
                t = time.perf_counter()
                lk.mla_prefix_prefill(*args, out=out, strategy=s)
                tot[s].append(1e3 * (time.perf_counter() - t))
                for k, v in ops_of(lk.mla_last_trace()).items():
                    ops[s].setdefault(k, []).append(v)
        med = {s: statistics.median(tot[s]) for s in STRATS}
        best = min(med, key=med.get)
        f = "B=%d Q=%s P=%s H=%d  auto=%s %.2f of best (%s)" % (B, str(Q).replace(" ", ""), str(P).replace(" ", ""), H, choice, med[choice] / med[best], best)
        print(f)
        if med[choice] > 1.05 * med[best]:
            misses += 1
        for s in STRATS:
            print("  %-12s %8.2f ms  model %8s  | %s" % (s, med[s], model.get(s, "-"), "  ".join(
                "%s %.2f" % (k, statistics.median(v)) for k, v in ops[s].items() if k != "strategy")))
        sys.stdout.flush()
    print("model pick more than 5%% slower than the best on %d of %d cases" % (misses, len(cases)))


if __name__ == "__main__":
    main()
