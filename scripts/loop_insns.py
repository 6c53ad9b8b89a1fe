#!/usr/bin/env python3
"""Instructions per iteration of the loops of one SIMD source, as the compiler emits them.

    scripts/loop_insns.py ISA SOURCE [LINE ...]

ISA is avx2, avx512 or neon (neon: aarch64-linux-gnu-gcc, scripts/install_arm_deps.sh);
SOURCE a file of src/cpu/simd/. The source is compiled with the library's flags for that
ISA (-O3 and the ISA's flags, as CMakeLists.txt sets them) plus -g, disassembled with
line numbers, and every loop (a backward branch within a function) is listed with the
source line of its branch (the `for` line of the loop in SOURCE, or the line of the
inlined helper that closes it), its instruction count and its counts of vector FMAs,
loads and stores. With LINE arguments only the loops whose branch is on one of those
lines of SOURCE are listed. Instructions per element = instructions / (elements the
source handles per iteration), which the caller reads off the source (W = 8 on avx2,
4 on neon). No timings: a static count of what one iteration executes.

    scripts/loop_insns.py ISA --probes

compiles each probe below (a source of src/cpu/simd/ included whole, plus a wrapper
that calls one of its loops with literal dtypes, so that exactly one specialisation is
emitted) and prints, per probe, the main loop's instructions, the elements one iteration
handles and their ratio: the figures of the closing notes of the NEON backend.
"""
import collections
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ISAS = {
    "avx2": ("gcc", ["-mavx2", "-mfma", "-mf16c", "-DLKV_AVX2"], "objdump"),
    "avx512": ("gcc", ["-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-mavx2", "-mfma", "-mf16c",
                       "-DLKV_AVX512"], "objdump"),
    "neon": ("aarch64-linux-gnu-gcc", ["-march=armv8-a", "-DLKV_NEON"], "aarch64-linux-gnu-objdump"),
}
FLAGS = ["-O3", "-DNDEBUG", "-fPIC", "-fno-strict-aliasing", "-fvisibility=hidden", "-fopenmp", "-std=c11",
         "-D_POSIX_C_SOURCE=200809L", "-DLLMKERN_SHARED_BUILD", "-g", "-I" + os.path.join(ROOT, "include")]


def disassemble(isa, src):
    cc, isa_flags, objdump = ISAS[isa]
    with tempfile.TemporaryDirectory() as d:
        obj = os.path.join(d, "x.o")
        subprocess.run([cc] + FLAGS + isa_flags + ["-c", src, "-o", obj], check=True)
        return subprocess.run([objdump, "-d", "-l", "--no-show-raw-insn", obj], check=True,
                              capture_output=True, text=True).stdout


def parse(text):
    """[(function, address, mnemonic, operands, (file, line))]"""
    out, func, loc = [], None, ("?", 0)
    for line in text.splitlines():
        m = re.match(r"^[0-9a-f]+ <(.+)>:$", line)
        if m:
            func = m.group(1)
            continue
        m = re.match(r"^(/.*):(\d+)( \(discriminator \d+\))?$", line)
        if m:
            loc = (os.path.basename(m.group(1)), int(m.group(2)))
            continue
        m = re.match(r"^\s+([0-9a-f]+):\s+(\S+)\s*(.*)$", line)
        if m and func:
            out.append((func, int(m.group(1), 16), m.group(2), m.group(3), loc))
    return out


BRANCH = re.compile(r"^(j[a-z]+|b|b\.[a-z]+|cbn?z|tbn?z)$")


def loops(insns):
    by_func = collections.defaultdict(list)
    for i in insns:
        by_func[i[0]].append(i)
    for func, body in by_func.items():
        for k, (f, addr, mn, ops, loc) in enumerate(body):
            if not BRANCH.match(mn):
                continue
            m = re.search(r"\b([0-9a-f]+) <", ops)
            if not m:
                continue
            target = int(m.group(1), 16)
            if target >= addr:
                continue
            seg = [i for i in body if target <= i[1] <= addr]
            yield func, loc, seg


def kind_counts(seg):
    fma = sum(1 for i in seg if re.match(r"^(v?fmadd|v?fnmadd|v?fmsub|vfmadd\d+ps|vfnmadd\d+ps|fmla|fmls)", i[2]))
    ld = sum(1 for i in seg if re.match(r"^(ld[1-4r]?|ldp|ldr|ldur)", i[2]) or
             (i[2].startswith("v") and "(" in i[3].split(",")[0] + "" and False) or
             (re.match(r"^v", i[2]) and re.search(r"\(.*\)", i[3]) and not i[3].rstrip().endswith(")")))
    st = sum(1 for i in seg if re.match(r"^(st[1-4]|stp|str|stur|stnp)", i[2]) or
             (re.match(r"^v", i[2]) and i[3].rstrip().endswith(")")))
    return fma, ld, st


# name: (source, wrapper, loop line in the source, elements per iteration as a function
# of W, what an element is)
PROBES = [
    ("rms_norm pass 1 (sum of squares), bf16 x", "rms_norm.c",
     "float probe(const char *x, int64_t D) { return sumsq(x, LK_BF16, D); }", "sumsq_bf16", lambda w: 4 * w, "value"),
    ("rms_norm pass 1 (sum of squares), f32 x", "rms_norm.c",
     "float probe(const char *x, int64_t D) { return sumsq(x, LK_F32, D); }", "sumsq_f32", lambda w: 4 * w, "value"),
    ("rms_norm pass 2 (scale), bf16 x / out, f32 weights", "rms_norm.c",
     "int64_t probe(char *o, const char *x, const char *g, int64_t D, float inv) "
     "{ return scale_row_bf16(o, x, g, 0, 0.0f, D, inv, 0, NULL, 0); }", "scale_bf16", lambda w: 2 * w, "value"),
    ("rms_norm pass 2 (scale), f32", "rms_norm.c",
     "void probe(char *o, const char *x, const char *w, int64_t D, float inv) "
     "{ scale_row_any(o, LK_F32, x, LK_F32, w, LK_F32, 0.0f, D, inv, 0, NULL, 0); }", "scale_f32", lambda w: w, "value"),
    ("silu_and_mul, bf16", "activation.c",
     "void probe(char *o, const char *g, const char *u, int64_t n) { act_seg_bf16(o, g, u, n, 0, 0); }",
     "silu_bf16", lambda w: 2 * w, "output"),
    ("silu_and_mul, f32", "activation.c",
     "void probe(char *o, const char *g, const char *u, int64_t n) { act_seg(o, LK_F32, g, u, LK_F32, n, 0, 0); }",
     "silu_f32", lambda w: 2 * w, "output"),
    ("rotary NeoX, bf16 (NaN-free cache block)", "rotary.c",
     "void probe(char *row, int64_t half, int64_t n, const cs_block *b) { rot_neox(row, LK_BF16, half, 0, n, b); }",
     "neox_bf16", lambda w: 4 * w, "rotated value (x or y of a pair)"),
    ("rotary NeoX, f32", "rotary.c",
     "void probe(char *row, int64_t half, int64_t n, const cs_block *b) { rot_neox(row, LK_F32, half, 0, n, b); }",
     "neox_f32", lambda w: 2 * w, "rotated value (x or y of a pair)"),
    ("flash_attn prefill micro-kernel (S += Q K^T and O += P V), per k step", "attention.c",
     "void probe(int64_t K, const float *A, int64_t lda, const float *B, float *C, int64_t ldc) "
     "{ mk(K, A, lda, B, C, ldc, 1); }", "mk", lambda w: (12 if w == 4 else 6 if w == 8 else 12) * 2 * w,
     "multiply-add (MR x PW per k)"),
    ("flash_attn decode q . k, 4 GQA heads, bf16 K", "attention.c",
     "void probe(const float *q, int64_t qs, const char *p, int64_t D, float *out) "
     "{ dot_rows4(q, qs, p, 16, D, LK_BF16, out); }", "dot_rows4", lambda w: 4 * 2 * w, "multiply-add (head x dim)"),
    ("flash_attn decode P . V, 4 keys x 4 GQA heads, bf16 V", "attention.c",
     "void probe(float *o, const float *w, const char *const *v, int64_t D) "
     "{ axpy4_rows4(o, w, v, 16, D, LK_BF16); }", "axpy4_rows4", lambda w: 4 * 4 * w,
     "multiply-add (head x key x dim)"),
    ("MLA softmax block (max pass + exp pass, bf16 P)", "mla_softmax.c",
     "lk_status probe(const lk_mla_softmax_args *a) { return mla_softmax_block(a); }", "mla_softmax", lambda w: w, "score"),
]


def probe_loops(isa, src_name, wrapper):
    cc, isa_flags, objdump = ISAS[isa]
    with tempfile.TemporaryDirectory() as d:
        c = os.path.join(d, "probe.c")
        with open(c, "w") as f:
            f.write('#include "%s"\n%s\n' % (os.path.join(ROOT, "src/cpu/simd", src_name), wrapper.replace(
                "probe(", "lk_probe(", 1)))
        obj = os.path.join(d, "probe.o")
        subprocess.run([cc] + FLAGS + isa_flags + ["-Wno-unused-function", "-c", c, "-o", obj], check=True)
        text = subprocess.run([objdump, "-d", "-l", "--no-show-raw-insn", obj], check=True,
                              capture_output=True, text=True).stdout
    # the wrapper's loops, or those of the helper it calls when GCC kept that out of line
    want = {"mk(": "mk.", "mla_softmax_block(": "mla_softmax_block"}
    prefix = next((v for k, v in want.items() if k in wrapper), None)
    return [(loc, seg) for func, loc, seg in loops(parse(text))
            if (func.startswith(prefix) if prefix else func == "lk_probe") and loc[0] == src_name]


def run_probes(isa):
    w = {"avx2": 8, "avx512": 16, "neon": 4}[isa]
    for name, src, wrapper, _key, elems, what in PROBES:
        found = probe_loops(isa, src, wrapper)
        print("%s [%s]" % (name, isa))
        for loc, seg in found:
            fma, ld, st = kind_counts(seg)
            n = len(seg)
            per = " = %.2f per %s (%d per iteration)" % (n / elems(w), what, elems(w)) if elems else ""
            print("   loop %s:%-4d %4d insns (%d fma)%s" % (loc[0], loc[1], n, fma, per))


def main():
    if len(sys.argv) == 3 and sys.argv[2] == "--probes" and sys.argv[1] in ISAS:
        return run_probes(sys.argv[1])
    if len(sys.argv) < 3 or sys.argv[1] not in ISAS:
        sys.exit(__doc__)
    isa, src = sys.argv[1], sys.argv[2]
    lines = {int(a) for a in sys.argv[3:]}
    base = os.path.basename(src)
    for func, loc, seg in loops(parse(disassemble(isa, src))):
        if lines and not (loc[0] == base and loc[1] in lines):
            continue
        fma, ld, st = kind_counts(seg)
        print("%-40s %s:%-4d %4d insns  (%d fma, %d vector/scalar loads, %d stores)" %
              (func[:40], loc[0], loc[1], len(seg), fma, ld, st))


if __name__ == "__main__":
    main()
