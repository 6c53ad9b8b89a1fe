#!/usr/bin/env python3
"""
Draws a benchmark summary (llmkern_bench --json) as a PNG: each row's share of its
ceiling (copy or read bandwidth, or the ISA's FMA peak) as horizontal bars, one bar per
ISA per row, rows grouped by section, the sections laid out in up to three columns.
Shares above the axis limit are clipped and their value written at the bar's end.

    python3 scripts/bench_plot.py in.json out.png

llmkern_bench --plot runs it after the run. Installs matplotlib with pip when missing
(`python3 -m pip install matplotlib`, else with --break-system-packages); draws with the
Agg backend (no display needed).
"""
import json
import os
import subprocess
import sys

XMAX = 200.0  # percent of the ceiling at the axis end (cache-resident rows go far above)


def need_matplotlib():
    try:
        import matplotlib  # noqa: F401
        return
    except ImportError:
        pass
    pip = [sys.executable, "-m", "pip", "install", "-q", "matplotlib"]
    if subprocess.call(pip) != 0 and subprocess.call(pip + ["--break-system-packages"]) != 0:
        sys.exit("bench_plot: matplotlib is missing and pip could not install it")
    os.execv(sys.executable, [sys.executable] + sys.argv)  # start again with it on the path


def isa_list(machine):
    return machine.get("isas") or [machine.get("isa", "isa")]


def share(row, isa, first):
    """percent of the ceiling of row on isa (files without per-ISA figures: the first's)"""
    per = row.get("isa")
    if per is not None:
        return 100.0 * per[isa]["ratio"] if isa in per else 0.0
    return 100.0 * row.get("ratio", 0.0) if isa == first else 0.0


def lines_of(rows):
    """[("section", name) | ("row", row)] in the file's order"""
    out, cur = [], None
    for r in rows:
        sec = r.get("section") or "rows"
        if sec != cur:
            out.append(("section", sec))
            cur = sec
        out.append(("row", r))
    return out


def columns(lines, ncol):
    """lines cut into at most ncol runs of about equal length; a run that starts inside
    a section repeats its name, none ends on a section's name"""
    per = -(-len(lines) // ncol)
    cols, cur, sec = [], [], None
    for kind, v in lines:
        full = len(cur) >= (per - 1 if kind == "section" else per)
        if cur and full and len(cols) < ncol - 1:
            cols.append(cur)
            cur = [] if kind == "section" else [("section", sec + " (cont.)")]
        if kind == "section":
            sec = v
        cur.append((kind, v))
    return cols + [cur]


def label(r):
    s = "%s %s %s" % (r.get("op", ""), r.get("shape", ""), r.get("dtype", ""))
    return s if len(s) <= 52 else s[:51] + "~"


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: bench_plot.py in.json out.png")
    need_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(sys.argv[1]) as f:
        d = json.load(f)
    m, rows = d.get("machine", {}), d.get("rows", [])
    if not rows:
        sys.exit("bench_plot: %s has no rows" % sys.argv[1])
    isas = isa_list(m)
    lines = lines_of(rows)
    ncol = 1 if len(lines) <= 50 else 2 if len(lines) <= 110 else 3
    cols = columns(lines, ncol)
    height = max(len(c) for c in cols) * 0.16 + 1.6
    fig, axes = plt.subplots(1, len(cols), figsize=(7.2 * len(cols), height), squeeze=False)
    colors = ["C0", "C1", "C2", "C3"]
    bar = 0.8 / len(isas)
    for ax, col in zip(axes[0], cols):
        ticks, names = [], []
        for k, (kind, v) in enumerate(col):
            y = -k
            ticks.append(y)
            if kind == "section":
                names.append(v)
                ax.axhspan(y - 0.5, y + 0.5, color="0.92", zorder=0)
                continue
            names.append(label(v))
            for j, isa in enumerate(isas):
                p = share(v, isa, isas[0])
                yy = y + 0.4 - bar * (j + 0.5)
                ax.barh(yy, min(p, XMAX), height=bar, color=colors[j % len(colors)], zorder=2)
                if p > XMAX:
                    ax.text(XMAX, yy, "%.0f%% " % p, va="center", ha="right", fontsize=5.5, color="white",
                            zorder=3)
        ax.set_yticks(ticks)
        ax.set_yticklabels(names, fontsize=6.5)
        for t, (kind, _) in zip(ax.get_yticklabels(), col):
            if kind == "section":
                t.set_fontweight("bold")
        ax.set_ylim(-len(col) + 0.5, 0.5)
        ax.set_xlim(0, XMAX)
        ax.axvline(100, color="0.3", lw=0.8, ls="--", zorder=1)
        ax.grid(axis="x", color="0.85", lw=0.5, zorder=0)
        ax.tick_params(axis="y", length=0)
        ax.tick_params(axis="x", labelsize=7)
        ax.set_xlabel("% of the row's ceiling", fontsize=8)
    peaks = m.get("fma_gflops_isa") or {isas[0]: m.get("fma_gflops", 0)}
    fig.suptitle("llmkern_bench: each row's share of its ceiling, per ISA\n%s threads; copy %.1f GB/s, read %.1f GB/s; "
                 "f32 FMA peak %s" % (m.get("threads", "?"), m.get("copy_gbs", 0), m.get("read_gbs", 0),
                                      ", ".join("%s %.0f GFLOP/s" % (k, v) for k, v in peaks.items())),
                 fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[j % len(colors)]) for j in range(len(isas))]
    fig.legend(handles, isas, loc="lower center", ncol=len(isas), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.25 / height, 1, 1 - 0.1 / height))
    fig.savefig(sys.argv[2], dpi=100)
    print("bench_plot: %d rows x %d ISAs -> %s" % (len(rows), len(isas), sys.argv[2]))


if __name__ == "__main__":
    main()
