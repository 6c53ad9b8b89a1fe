#!/usr/bin/env python3
"""
Compares benchmark summaries (llmkern_bench --json) row by row; rows match on op +
shape + dtype, and per variant where a row has per-variant figures (a file without them
counts as its machine's one ISA). A variant is an ISA ("avx2"), or with llmkern_bench
--lib a library and an ISA ("after:avx2").

    bench_compare.py A.json B.json [--tol 0.05]
        two builds (before / after a change): each row's median time B / A per ISA both
        files ran, then the rows where B is slower than A by more than the tolerance.
        A and B may each be a comma list of files (alternating runs of the two builds):
        a row's time is then the median over its files
    bench_compare.py A.json --isa-pair avx2,avx512 [--tol 0.05]
        two ISAs of one run: each row's time avx512 / avx2, then the rows where the
        second ISA is slower than the first by more than the tolerance
    bench_compare.py A.json --lib-pair before,after [--tol 0.05]
        two libraries of one run (llmkern_bench --lib ... --lib-names before,after): per
        ISA each row's time after / before, then the rows where after is slower than
        before by more than the tolerance; the A/B of two builds timed in one process,
        their repetitions interleaved (steadier than two runs on a shared machine)

Ends with a count line. Timings of a shared machine are noisy: read a few percent
either way as noise.
"""
import argparse
import json
import statistics
import sys


def load(path):
    with open(path) as f:
        d = json.load(f)
    m = d.get("machine", {})
    first = (m.get("isas") or [m.get("isa", "isa")])[0]
    rows, order = {}, []
    for r in d.get("rows", []):
        key = (r.get("op", ""), r.get("shape", ""), r.get("dtype", ""))
        per = r.get("isa")
        ms = {k: v["median_ms"] for k, v in per.items()} if per else {first: r["median_ms"]}
        if key not in rows:
            order.append(key)
        rows[key] = ms
    return rows, order


def load_median(paths):
    """a comma list of files: per row and ISA the median of the files' times"""
    runs = [load(p) for p in paths.split(",")]
    rows, order = {}, runs[0][1]
    for key in order:
        isas = [i for i in runs[0][0][key] if all(key in r and i in r[key] for r, _ in runs)]
        rows[key] = {i: statistics.median(r[key][i] for r, _ in runs) for i in isas}
    return rows, order


def name(key):
    return " ".join(k for k in key if k)


def report(pairs, what, tol):
    """pairs: [(label, isa, t_a, t_b)]; prints every ratio, the slow ones, the count"""
    width = max([len(p[0]) for p in pairs] + [20])
    print("%-*s %-11s %11s %11s %8s" % (width, "row", "isa", "A ms", "B ms", "B/A"))
    slow, fast = [], 0
    for label, isa, a, b in pairs:
        r = b / a if a > 0 else float("inf")
        print("%-*s %-11s %11.4f %11.4f %8.3f" % (width, label, isa, a, b, r))
        if r > 1 + tol:
            slow.append((label, isa, r))
        elif r < 1 - tol:
            fast += 1
    print("\n%s by more than %.0f%%:" % (what, 100 * tol))
    for label, isa, r in sorted(slow, key=lambda s: -s[2]):
        print("  %-*s %-11s %8.3f" % (width, label, isa, r))
    if not slow:
        print("  (none)")
    return len(slow), fast


def main():
    ap = argparse.ArgumentParser(description="compare llmkern_bench JSON summaries row by row")
    ap.add_argument("a", help="A.json (before, or the file of --isa-pair / --lib-pair)")
    ap.add_argument("b", nargs="?", help="B.json (after)")
    ap.add_argument("--tol", type=float, default=0.05, help="relative tolerance (default 0.05)")
    ap.add_argument("--isa-pair", help="X,Y: compare ISA Y with ISA X within A.json")
    ap.add_argument("--lib-pair", help="X,Y: compare library Y with library X within A.json, per ISA")
    o = ap.parse_args()
    ra, order = load_median(o.a)
    if o.isa_pair or o.lib_pair:
        if o.b or (o.isa_pair and o.lib_pair):
            ap.error("--isa-pair and --lib-pair take one file, and one of them")
        x, _, y = (o.isa_pair or o.lib_pair).partition(",")
        if o.isa_pair:  # (column, key of A, key of B) per row
            cols = lambda ms: [("%s/%s" % (y, x), x, y)]
        else:
            cols = lambda ms: [(v[len(x) + 1:], v, y + v[len(x):]) for v in ms if v.startswith(x + ":")]
        pairs = [(name(k), c, ra[k][a], ra[k][b]) for k in order for c, a, b in cols(ra[k])
                 if a in ra[k] and b in ra[k]]
        if not pairs:
            sys.exit("bench_compare: no row of %s has both %s and %s" % (o.a, x, y))
        print("A = %s, B = %s (%s)" % (x, y, o.a))
        n_slow, n_fast = report(pairs, "rows where %s is slower than %s" % (y, x), o.tol)
        print("\n%d %s: %s slower than %s in %d, faster in %d, within %.0f%% in %d"
              % (len(pairs), "rows" if o.isa_pair else "row x ISA pairs", y, x, n_slow, n_fast, 100 * o.tol,
                 len(pairs) - n_slow - n_fast))
        return
    if not o.b:
        ap.error("two files, or one with --isa-pair or --lib-pair")
    rb, order_b = load_median(o.b)
    pairs = []
    for k in order:
        if k in rb:
            pairs += [(name(k), isa, ra[k][isa], rb[k][isa]) for isa in ra[k] if isa in rb[k]]
    if not pairs:
        sys.exit("bench_compare: no row of %s matches one of %s" % (o.a, o.b))
    print("A = %s, B = %s" % (o.a, o.b))
    n_slow, n_fast = report(pairs, "rows where B is slower than A", o.tol)
    only_a = sum(1 for k in order if k not in rb)
    only_b = sum(1 for k in order_b if k not in ra)
    print("\n%d row x ISA pairs compared: B slower in %d, faster in %d, within %.0f%% in %d; rows only in A: %d, "
          "only in B: %d" % (len(pairs), n_slow, n_fast, 100 * o.tol, len(pairs) - n_slow - n_fast, only_a, only_b))


if __name__ == "__main__":
    main()
