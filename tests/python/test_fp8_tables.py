"""The fp8 -> bf16 byte tables of src/cpu/vec/x86.h (lkv_f8_to_bf16's lookups) equal
what scripts/gen_fp8_tables.py computes from the converters of src/core/fp8.h and
src/core/half.h, so an edit of one without the other fails here; the generator's fp8
values are checked against ml_dtypes' independently."""
import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SCRIPT = os.path.join(ROOT, "scripts", "gen_fp8_tables.py")


def _gen():
    spec = importlib.util.spec_from_file_location("gen_fp8_tables", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_header_tables_equal_the_generator():
    gen = _gen()
    got = gen.in_header()
    assert got is not None, "x86.h: lkv__f8bf_e4m3_lo not found"
    assert got == gen.c_text()
    r = subprocess.run([sys.executable, SCRIPT, "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


def test_check_fails_on_an_edited_table(tmp_path):
    gen = _gen()
    with open(gen.X86_H) as f:
        text = f.read()
    i = text.index("static const uint8_t lkv__f8bf_e5m2_hi[128] = {")
    j = text.index("0x47", i)  # one byte of the last table changed
    bad = tmp_path / "x86.h"
    bad.write_text(text[:j] + "0x46" + text[j + 4:])
    assert gen.in_header(str(bad)) != gen.c_text()
    assert gen.in_header(str(tmp_path / "x86.h")).count("};") == 4


def test_generator_values_match_ml_dtypes():
    ml = pytest.importorskip("ml_dtypes")
    gen = _gen()
    for dt, e4m3 in ((ml.float8_e4m3fn, True), (ml.float8_e5m2, False)):
        codes = np.arange(256, dtype=np.uint8)
        f = codes.view(dt).astype(np.float32)
        bits = f.view(np.uint32)
        for c in range(256):
            g = gen.f8_to_f32_bits(c, e4m3)
            if np.isnan(f[c]):
                assert (g & 0x7F800000) == 0x7F800000 and (g & 0x7FFFFF) != 0
            else:
                assert g == int(bits[c]), (dt, c)
    t = gen.tables()
    for fmt, dt in (("e4m3", ml.float8_e4m3fn), ("e5m2", ml.float8_e5m2)):
        bf = np.arange(128, dtype=np.uint8).view(dt).astype(np.float32).astype(ml.bfloat16).view(np.uint16)
        want = [int(b) for b in bf]
        have = [lo | hi << 8 for lo, hi in zip(t["lkv__f8bf_%s_lo" % fmt], t["lkv__f8bf_%s_hi" % fmt])]
        for c in range(128):
            if not np.isnan(np.uint8(c).view(dt).astype(np.float32)):
                assert have[c] == want[c], (fmt, c)
