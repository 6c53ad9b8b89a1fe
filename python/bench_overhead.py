"""Per-call cost of the Python binding on a tiny operator (rms_norm on [1, 64] f32 with a
preallocated out): the whole call, the bare C call on prepacked views, and the
difference = what the binding adds (building three lk_tensor views, the ctypes call, the
status check). Each figure is the best of several runs, in wall time and in CPU time of
the process (the latter is what the binding costs when the machine is shared with other
busy processes: time spent descheduled is not counted).
Usage: python python/bench_overhead.py [--torch]"""
import sys
import time
import timeit

import numpy as np

import llmkern as lk
from llmkern import _lib as L

N, REPEAT = 20000, 9


def per_call_us(fn, timer):
    """Best of REPEAT runs of N calls (the least disturbed by other processes)."""
    return min(timeit.Timer(fn, timer=timer).repeat(number=N, repeat=REPEAT)) / N * 1e6


def measure(x, w, out, label):
    bo, bx, bw = L.view(out, "out"), L.view(x, "input"), L.view(w, "weight")
    c_fn = L.rms_norm
    for clock, timer in (("wall", time.perf_counter), ("cpu", time.process_time)):
        full = per_call_us(lambda: lk.rms_norm(out, x, w, 1e-6), timer)
        bare = per_call_us(lambda: c_fn(bo, bx, bw, 1e-6, 0), timer)
        noop = per_call_us(L.get_num_threads, timer)
        print("%-6s %-4s rms_norm [1, 64] f32: %.2f us per call; C call on prepacked views "
              "%.2f us (empty ctypes call %.2f us); binding overhead %.2f us"
              % (label, clock, full, bare, noop, full - bare))


def main():
    lk.set_num_threads(1)  # a [1, 64] row is one work unit: no thread start-up in the C time
    x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
    w = np.ones(64, np.float32)
    out = np.empty_like(x)
    measure(x, w, out, "numpy")
    if "--torch" in sys.argv:
        import torch
        measure(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(out), "torch")


if __name__ == "__main__":
    main()
