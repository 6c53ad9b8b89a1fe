#!/usr/bin/env python3
"""How often llmkern's one rounding differs from the rounding points of vLLM's kernels and
PyTorch's native forms (docs/numerics.md, "Rounding points of other engines").

vLLM's activation kernels and torch's native forms round the activation to the storage
dtype and then multiply (or, for the element-wise GELUs written with torch ops, round after
every op); vLLM's native rotary rounds each product. llmkern computes in f32 and rounds once.
For each case: the share of outputs that differ, the share that differ by more than one
unit in the last place, and the share where llmkern is the closer to the float64 value
(among the differing ones). Inputs: N(0, 1) * 2 (activations), N(0, 1) (rotary), fixed
seed. Usage: PYTHONPATH=python LLMKERN_LIB=build/libllmkern.so python3 scripts/rounding_points.py
"""
import math
import sys

import numpy as np
import torch
import torch.nn.functional as F

import llmkern as lk

N = 1 << 20  # outputs per case


def ulps(a, b, dt):
    """|a - b| in units of the last place of dtype dt (a, b tensors of dtype dt)."""
    ia = a.view(torch.int16).to(torch.int32)
    ib = b.view(torch.int16).to(torch.int32)
    # sign-magnitude -> ordered integers
    ia = torch.where(ia < 0, -(ia & 0x7FFF), ia)
    ib = torch.where(ib < 0, -(ib & 0x7FFF), ib)
    return (ia - ib).abs()


def report(name, dt, ours, theirs, exact):
    u = ulps(ours, theirs, dt)
    diff = u > 0
    n = ours.numel()
    eo = (ours.double() - exact).abs()
    et = (theirs.double() - exact).abs()
    closer = (eo[diff] < et[diff]).double().mean().item() if diff.any() else float("nan")
    print("%-22s %-8s differ %6.2f %%   > 1 ulp %6.3f %%   llmkern closer in %5.1f %% of those"
          % (name, str(dt).replace("torch.", ""), 100.0 * diff.double().mean().item(),
             100.0 * (u > 1).double().mean().item(), 100.0 * closer))
    return diff.double().mean().item()


def gated(name, lk_fn, act64, torch_act, dt, gen):
    x = (torch.randn(N // 1024, 2 * 1024, generator=gen) * 2).to(dt)
    d = x.shape[-1] // 2
    out = torch.empty(x.shape[0], d, dtype=dt)
    lk_fn(out, x)
    g, u = x[..., :d], x[..., d:]
    if name == "mul_and_silu":
        theirs = g * torch_act(u)
        exact = g.double() * act64(u.double())
    else:
        theirs = torch_act(g) * u  # activation rounded to dt, then the product rounded
        exact = act64(g.double()) * u.double()
    return report(name, dt, out, theirs, exact)


def elementwise(name, lk_fn, act64, torch_act, dt, gen):
    x = (torch.randn(N // 1024, 1024, generator=gen) * 2).to(dt)
    out = torch.empty_like(x)
    lk_fn(out, x)
    return report(name, dt, out, torch_act(x), act64(x.double()))


def main():
    gen = torch.Generator().manual_seed(0)
    s2 = math.sqrt(2.0 / math.pi)
    silu64 = lambda v: v / (1 + torch.exp(-v))
    gelu_t64 = lambda v: 0.5 * v * (1 + torch.tanh(s2 * (v + 0.044715 * v ** 3)))
    gelu64 = lambda v: 0.5 * v * (1 + torch.erf(v / math.sqrt(2)))
    quick64 = lambda v: v * torch.sigmoid(1.702 * v)
    print("activations: llmkern vs round(act(g)) * u as vLLM's kernels and torch compute it")
    for dt in (torch.float16, torch.bfloat16):
        gated("silu_and_mul", lk.silu_and_mul, silu64, F.silu, dt, gen)
        gated("gelu_tanh_and_mul", lk.gelu_tanh_and_mul, gelu_t64, lambda v: F.gelu(v, approximate="tanh"), dt, gen)
        gated("gelu_and_mul", lk.gelu_and_mul, gelu64, F.gelu, dt, gen)
        gated("mul_and_silu", lk.mul_and_silu, silu64, F.silu, dt, gen)
    print("element-wise: llmkern vs torch's native forms (gelu_new written with torch ops, as vLLM's)")
    for dt in (torch.float16, torch.bfloat16):
        elementwise("gelu_new", lk.gelu_new, gelu_t64,
                    lambda v: 0.5 * v * (1.0 + torch.tanh(s2 * (v + 0.044715 * torch.pow(v, 3.0)))), dt, gen)
        elementwise("gelu_quick", lk.gelu_quick, quick64, lambda v: v * torch.sigmoid(1.702 * v), dt, gen)
    print("rotary (NeoX, cache in the query dtype): llmkern vs x1 * cos - x2 * sin with each product rounded")
    for dt in (torch.float16, torch.bfloat16):
        T, H, D, P = N // (8 * 128), 8, 128, 4096
        inv = 1.0 / 10000 ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
        ang = torch.arange(P, dtype=torch.float64)[:, None] * inv[None, :]
        cache = torch.cat([torch.cos(ang), torch.sin(ang)], dim=1).to(dt)
        pos = torch.randint(0, P, (T,), generator=gen)
        q = torch.randn(T, H, D, generator=gen).to(dt)
        ours = q.clone()
        lk.rotary_embedding(pos, ours, None, D, cache, True)
        cos, sin = cache[pos].chunk(2, dim=-1)
        cos, sin = cos[:, None, :], sin[:, None, :]
        x1, x2 = q[..., :D // 2], q[..., D // 2:]
        theirs = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
        c64, s64, a64, b64 = cos.double(), sin.double(), x1.double(), x2.double()
        exact = torch.cat([a64 * c64 - b64 * s64, b64 * c64 + a64 * s64], dim=-1)
        report("rotary_embedding", dt, ours, theirs, exact)
    return 0


if __name__ == "__main__":
    sys.exit(main())
