#!/usr/bin/env python3
"""Prints the fp8 -> bf16 byte tables of src/cpu/vec/x86.h (lkv__f8bf_e4m3_lo / _hi,
lkv__f8bf_e5m2_lo / _hi: the low and high bytes of the bf16 value of each fp8 magnitude
code 0..127, as lkv_f8_to_bf16 looks them up), computed as src/core/fp8.h's exact
fp8 -> f32 converters and src/core/half.h's lk_f32_to_bf16 compute them. Standard library
only.

  scripts/gen_fp8_tables.py           the four C declarations, as in x86.h
  scripts/gen_fp8_tables.py --check   exit 1 (with a diff) unless x86.h holds exactly them

tests/python/test_fp8_tables.py runs the check, so the tables and the converters cannot
drift apart.
"""
import difflib
import os
import struct
import sys

X86_H = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src", "cpu", "vec", "x86.h")


def f32_bits(v):
    return struct.unpack("<I", struct.pack("<f", v))[0]


def f8_to_f32_bits(code, e4m3):
    """The f32 bits of lk_f8e4m3_to_f32 / lk_f8e5m2_to_f32 (src/core/fp8.h)."""
    sign = (code & 0x80) << 24
    if e4m3:
        exp, man = (code >> 3) & 0xF, code & 0x7
        if exp == 0xF and man == 0x7:
            return sign | 0x7FC00000  # NaN
        if exp == 0:  # zero or subnormal: man * 2^-9, exact
            return sign | f32_bits(man * 2.0 ** -9)
        return sign | ((exp + 120) << 23) | (man << 20)
    exp, man = (code >> 2) & 0x1F, code & 0x3
    if exp == 0x1F:  # inf, NaN
        return sign | 0x7F800000 | ((0x400000 | (man << 21)) if man else 0)
    if exp == 0:  # zero or subnormal: man * 2^-16, exact
        return sign | f32_bits(man * 2.0 ** -16)
    return sign | ((exp + 112) << 23) | (man << 21)


def f32_bits_to_bf16(u):
    """lk_f32_to_bf16 (src/core/half.h): NaN quieted, else round to nearest even."""
    if (u & 0x7FFFFFFF) > 0x7F800000:
        return ((u >> 16) | 0x0040) & 0xFFFF
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFFFFFF
    return u >> 16


def tables():
    """{name: 128 bytes} in x86.h's order."""
    out = {}
    for fmt, e4m3 in (("e4m3", True), ("e5m2", False)):
        bf = [f32_bits_to_bf16(f8_to_f32_bits(c, e4m3)) for c in range(128)]
        out["lkv__f8bf_%s_lo" % fmt] = [b & 0xFF for b in bf]
        out["lkv__f8bf_%s_hi" % fmt] = [b >> 8 for b in bf]
    return out


def c_text():
    """The four declarations, formatted as in x86.h (16 bytes a line)."""
    lines = []
    for name, vals in tables().items():
        lines.append("static const uint8_t %s[128] = {" % name)
        rows = [", ".join("0x%02x" % v for v in vals[i:i + 16]) for i in range(0, 128, 16)]
        lines += ["    " + r + ("," if k < len(rows) - 1 else "};") for k, r in enumerate(rows)]
    return "\n".join(lines) + "\n"


def in_header(path=X86_H):
    """The same four declarations as x86.h holds them (from the first one's line to the
    end of the fourth), or None when they are not there."""
    with open(path) as f:
        text = f.read().splitlines()
    first = "static const uint8_t lkv__f8bf_e4m3_lo[128] = {"
    if first not in text:
        return None
    i, out, ends = text.index(first), [], 0
    while i < len(text) and ends < 4:
        out.append(text[i])
        ends += text[i].rstrip().endswith("};")
        i += 1
    return "\n".join(out) + "\n"


def main(argv):
    if argv[1:] == ["--check"]:
        want, got = c_text(), in_header()
        if got == want:
            return 0
        sys.stdout.writelines(difflib.unified_diff((got or "").splitlines(True), want.splitlines(True),
                                                   "src/cpu/vec/x86.h", "gen_fp8_tables.py"))
        return 1
    if len(argv) > 1:
        sys.stderr.write("usage: %s [--check]\n" % argv[0])
        return 2
    sys.stdout.write(c_text())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
