"""reshape_and_cache_flash into fp8 caches (kv_cache_dtype "fp8" / "fp8_e4m3" / "fp8_e5m2"):
uint8 caches as vLLM allocates them, ml_dtypes float8 arrays and torch float8 tensors,
against ml_dtypes' / torch's own f32 -> fp8 conversion of x / scale (round to nearest
even: bitwise within the finite range) and against float64; saturation, NaN, bad scales."""
import numpy as np
import pytest

import llmkern as lk
from helpers import torch_or_skip

MAX = {"fp8": 448.0, "fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}
MAXCODE = {"fp8": 0x7E, "fp8_e4m3": 0x7E, "fp8_e5m2": 0x7B}


def ml_or_skip():
    return pytest.importorskip("ml_dtypes")


def np_fp8(kv):
    ml = ml_or_skip()
    return ml.float8_e5m2 if kv == "fp8_e5m2" else ml.float8_e4m3fn


def expect_codes(x, scale, kv):
    """uint8 codes of fp8(f32(x) / f32(scale)) (values inside the finite range)."""
    y = np.asarray(x, np.float32) / np.float32(scale)
    return y.astype(np_fp8(kv)).view(np.uint8)


@pytest.mark.parametrize("kv", ["fp8", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("bs", [1, 7, 16])
def test_numpy_uint8_caches(rng, kv, bs):
    T, H, D, NB = 9, 3, 40, 4
    ks, vs = 0.05, 2.5
    key = np.clip(rng.standard_normal((T, H, D)) * 4, -20, 20).astype(np.float32)
    value = (rng.standard_normal((T, H, D)) * 40).astype(np.float16)
    kc = rng.integers(0, 256, (NB, bs, H, D), dtype=np.uint8)
    vc = rng.integers(0, 256, (NB, bs, H, D), dtype=np.uint8)
    slots = rng.permutation(NB * bs)[:T].astype(np.int64)
    slots[2] = -1
    kc0, vc0 = kc.copy(), vc.copy()
    lk.reshape_and_cache_flash(key, value, kc, vc, slots, kv, ks, vs)
    wk, wv = kc0.copy(), vc0.copy()
    for t, s in enumerate(slots):
        if s >= 0:
            wk[s // bs, s % bs] = expect_codes(key[t], ks, kv)
            wv[s // bs, s % bs] = expect_codes(value[t], vs, kv)
            # float64: dequantized within half an fp8 step (relative 2^-4 e4m3, 2^-3 e5m2)
            deq = kc[s // bs, s % bs].view(np_fp8(kv)).astype(np.float64) * ks
            rel = 2.0 ** -4 if kv != "fp8_e5m2" else 2.0 ** -3
            np.testing.assert_allclose(deq, key[t].astype(np.float64), rtol=rel * 1.0001, atol=ks * 2.0 ** -9)
    assert np.array_equal(kc, wk) and np.array_equal(vc, wv)


@pytest.mark.parametrize("kv", ["fp8_e4m3", "fp8_e5m2"])
def test_numpy_fp8_dtype_caches_and_specials(kv):
    fp8 = np_fp8(kv)
    T, H, D, NB, BS = 2, 1, 6, 1, 2
    key = np.array([[[1e9, -np.inf, np.nan, -0.0, 1e-30, 3.0]]] * T, np.float32)
    value = key.copy()
    kc = np.zeros((NB, BS, H, D), fp8)
    vc = np.zeros((NB, BS, H, D), fp8)
    lk.reshape_and_cache_flash(key, value, kc, vc, np.array([1, 0], np.int32), kv, 1.0, 0.5)
    codes = kc.view(np.uint8)[0, 1, 0]
    m = MAXCODE[kv]
    assert codes[0] == m and codes[1] == 0x80 | m  # saturated, inf too
    assert np.isnan(kc[0, 1, 0, 2].astype(np.float32))
    assert codes[3] == 0x80 and codes[4] == 0 and kc[0, 1, 0, 5].astype(np.float32) == 3.0
    assert vc[0, 0, 0, 5].astype(np.float32) == 6.0  # 3.0 / 0.5
    with pytest.raises(TypeError, match="key_cache"):  # e4m3 cache for e5m2 (or back)
        other = np.zeros((NB, BS, H, D), np_fp8("fp8_e5m2" if kv == "fp8_e4m3" else "fp8_e4m3"))
        lk.reshape_and_cache_flash(key, value, other, vc, np.array([1, 0]), kv, 1.0, 1.0)


def test_bad_scales_nothing_written(rng):
    T, H, D, NB, BS = 3, 2, 8, 2, 4
    key = rng.standard_normal((T, H, D)).astype(np.float32)
    kc = np.zeros((NB, BS, H, D), np.uint8)
    vc = np.zeros((NB, BS, H, D), np.uint8)
    slots = np.array([0, 5, 2])
    for ks, vs, name in ((0.0, 1.0, "k_scale"), (-1.0, 1.0, "k_scale"), (1.0, float("nan"), "v_scale"),
                         (1.0, float("inf"), "v_scale")):
        with pytest.raises(lk.LlmkernError, match=name):
            lk.reshape_and_cache_flash(key, key, kc, vc, slots, "fp8", ks, vs)
    with pytest.raises(ValueError, match="k_scale"):  # per-head fp8 scales: not yet
        lk.reshape_and_cache_flash(key, key, kc, vc, slots, "fp8", np.ones(H, np.float32), 1.0)
    with pytest.raises(ValueError, match="v_scale"):
        lk.reshape_and_cache_flash(key, key, kc, vc, slots, "fp8", 1.0, None)
    assert not kc.any() and not vc.any()


@pytest.mark.parametrize("kv", ["fp8", "fp8_e5m2"])
def test_torch_caches(rng, kv):
    torch = torch_or_skip()
    T, H, D, NB, BS = 7, 4, 32, 3, 16
    tdt = torch.float8_e5m2 if kv == "fp8_e5m2" else torch.float8_e4m3fn
    key = torch.randn(T, H, D, dtype=torch.bfloat16) * 3
    value = torch.randn(T, H, D)
    slots = torch.tensor([3, 0, 17, -1, 9, 8, 40])
    ks, vs = torch.tensor([0.125]), torch.tensor(0.75)
    for typed in (False, True):  # vLLM's uint8 buffers, then float8 tensors
        kc = torch.zeros(NB, BS, H, D, dtype=torch.uint8)
        vc = torch.zeros(NB, BS, H, D, dtype=torch.uint8)
        lk.reshape_and_cache_flash(key, value, kc.view(tdt) if typed else kc, vc.view(tdt) if typed else vc,
                                   slots, kv, ks, vs)
        for t, s in enumerate(slots.tolist()):
            if s < 0:
                continue
            wk = (key[t].float() / ks.float()).to(tdt).view(torch.uint8)
            wv = (value[t] / vs).to(tdt).view(torch.uint8)
            assert torch.equal(kc[s // BS, s % BS], wk) and torch.equal(vc[s // BS, s % BS], wv)
        assert not kc[0, 1].any() and not vc[0, 1].any()  # slot 1: no token
