"""The fp8 operators' Python call forms as vLLM / FlashMLA make them: NumPy scalar scales,
batch_size and cu_seq_lens of the cache gathers, FlashMLA's descale_q / is_fp8_kvcache /
kv_cache_dtype against the cache's own dtype, convert_fp8's 'auto' dtypes,
scaled_fp8_quant's padded per-token scales and group_shape, one-element scales of any
rank, and error messages that name the arguments as the caller wrote them (vLLM's names,
not the C parameters'); copy_blocks' cache names and set_num_threads' range beside them."""
import numpy as np
import pytest

import llmkern as lk

ml = pytest.importorskip("ml_dtypes")
E4 = ml.float8_e4m3fn


def deq(codes, dt=E4):
    return np.asarray(codes).view(dt).astype(np.float32)


# ---- NumPy scalars as scales: taken by value (they used to be viewed through a temporary
# array freed before the C call, so a later temporary's value could be read instead)

def test_numpy_scalar_scales(rng):
    T, H, D = 3, 2, 16
    key, val = np.ones((T, H, D), np.float32), np.ones((T, H, D), np.float32)
    kc, vc = np.zeros((2, 4, H, D), np.uint8), np.zeros((2, 4, H, D), np.uint8)
    for ks, vs in ((np.float32(0.5), np.float32(0.25)), (np.float16(0.5), np.float64(0.25)), (np.int32(2), 4)):
        lk.reshape_and_cache_flash(key, val, kc, vc, np.arange(T), "fp8", ks, vs)
        assert np.all(deq(kc[0, :T]) == np.float32(1 / float(ks)))
        assert np.all(deq(vc[0, :T]) == np.float32(1 / float(vs)))
    x = rng.standard_normal((4, 32)).astype(np.float32)
    out, ref = np.zeros((4, 32), E4), np.zeros((4, 32), E4)
    lk.static_scaled_fp8_quant(out, x, np.float32(0.125))
    lk.static_scaled_fp8_quant(ref, x, 0.125)
    assert np.array_equal(out.view(np.uint8), ref.view(np.uint8))
    c = np.zeros((2, 4, 48), np.uint8)
    lk.concat_and_cache_mla(np.ones((2, 32), np.float32), np.ones((2, 16), np.float32), c, np.arange(2), "fp8",
                            np.float32(0.5))
    assert np.all(deq(c[0, :2]) == 2.0)
    # a NumPy scalar where a tensor is expected: refused, naming the argument
    with pytest.raises(TypeError, match="slot_mapping: a NumPy scalar"):
        lk.reshape_and_cache_flash(key, val, kc, vc, np.int64(0), "fp8", 1.0, 1.0)


# ---- gathers: batch_size and cu_seq_lens

def _gather_case(rng):
    cache = rng.integers(0, 120, (4, 4, 32), dtype=np.uint8)  # e4m3 codes, finite
    bt = np.array([[0, 1], [2, 3]], np.int32)
    cu = np.array([0, 5, 8], np.int32)
    return cache, bt, cu


def test_gather_batch_size(rng):
    cache, bt, cu = _gather_case(rng)
    for bad in (3, 100, -1, True):
        dst = np.full((8, 32), 7.0, np.float32)
        with pytest.raises(ValueError, match="batch_size"):
            lk.gather_and_maybe_dequant_cache(cache, dst, bt, cu, bad, "fp8", 1.0)
        assert np.all(dst == 7.0)  # nothing written
    for bad in (3, -1, 1.0, None):
        raw = np.full((8, 32), 7, np.uint8)
        with pytest.raises(ValueError, match="batch_size"):
            lk.cp_gather_cache(cache, raw, bt, cu, bad)
        assert np.all(raw == 7)
    # fewer requests than given: only the first batch_size are gathered
    dst = np.full((8, 32), 7.0, np.float32)
    lk.gather_and_maybe_dequant_cache(cache, dst, bt, cu, 1, "fp8", np.float32(0.5))
    want = deq(cache[[0, 1]].reshape(8, 32)[:5]) * np.float32(0.5)
    assert np.array_equal(dst[:5], want) and np.all(dst[5:] == 7.0)
    dst = np.full((8, 32), 7.0, np.float32)
    lk.gather_and_maybe_dequant_cache(cache, dst, bt, cu, 0, "fp8", 1.0)
    assert np.all(dst == 7.0)


def test_gather_decreasing_cu_seq_lens(rng):
    cache, bt, _ = _gather_case(rng)
    dst = np.full((8, 32), 7.0, np.float32)
    with pytest.raises(ValueError, match=r"cu_seq_lens: cu_seq_lens\[2\] = 3 < cu_seq_lens\[1\] = 5"):
        lk.gather_and_maybe_dequant_cache(cache, dst, bt, np.array([0, 5, 3], np.int32), 2, "fp8", 1.0)
    assert np.all(dst == 7.0)


# ---- FlashMLA's decode: descale_q, is_fp8_kvcache, kv_cache_dtype against typed caches

def _mla_case(rng):
    q = rng.standard_normal((1, 1, 2, 64)).astype(np.float32)
    codes = rng.integers(0, 120, (1, 4, 1, 64), dtype=np.uint8)
    return q, codes, np.array([[0]], np.int32), np.array([4], np.int32)


def test_flash_mla_descale_q(rng):
    q, codes, bt, sl = _mla_case(rng)
    out = np.full((1, 1, 2, 32), 7.0, np.float32)
    for bad in (0.0, -1.0, float("nan"), float("inf"), np.float32(0)):
        with pytest.raises(ValueError, match="descale_q: value"):
            lk.flash_mla_with_kvcache(q, codes.view(E4), bt, sl, 32, None, None, descale_q=bad, out=out)
    assert np.all(out == 7.0)
    o1, _ = lk.flash_mla_with_kvcache(q, codes.view(E4), bt, sl, 32, None, None, softmax_scale=0.2,
                                      descale_q=np.float32(2.0))
    o2, _ = lk.flash_mla_with_kvcache(q, codes.view(E4), bt, sl, 32, None, None, softmax_scale=0.4)
    assert np.array_equal(o1, o2)


def test_flash_mla_cache_dtype_checks(rng):
    q, codes, bt, sl = _mla_case(rng)
    out = np.full((1, 1, 2, 32), 7.0, np.float32)
    with pytest.raises(TypeError, match="k_cache: dtype float8_e4m3fn does not match"):
        lk.flash_mla_with_kvcache(q, codes.view(E4), bt, sl, 32, None, None, kv_cache_dtype="fp8_e5m2", out=out)
    with pytest.raises(TypeError, match="k_cache: dtype float32 with is_fp8_kvcache=True"):
        lk.flash_mla_with_kvcache(q, deq(codes), bt, sl, 32, None, None, is_fp8_kvcache=True, descale_k=2.0,
                                  out=out)
    assert np.all(out == 7.0)
    # the forms that agree give one result: uint8 + flag / + kv_cache_dtype, typed + either
    ref, _ = lk.flash_mla_with_kvcache(q, codes.view(E4), bt, sl, 32, None, None, descale_k=0.5)
    for c, kw in ((codes, dict(is_fp8_kvcache=True)), (codes, dict(kv_cache_dtype="fp8")),
                  (codes.view(E4), dict(is_fp8_kvcache=True)), (codes.view(E4), dict(kv_cache_dtype="fp8_e4m3"))):
        got, _ = lk.flash_mla_with_kvcache(q, c, bt, sl, 32, None, None, descale_k=np.float32(0.5), **kw)
        assert np.array_equal(got, ref)


# ---- convert_fp8 with kv_dtype 'auto': float tensors only

def test_convert_fp8_auto_dtypes():
    x = np.array([[1.7, -2.9, 0.4]], np.float32)
    for dt in (np.int32, np.int64, np.uint8):
        out = np.zeros(x.shape, dt)
        with pytest.raises(ValueError, match="output: dtype"):
            lk.convert_fp8(out, x, 1.0, "auto")
        assert np.all(out == 0)
        with pytest.raises(ValueError, match="input: dtype"):
            lk.convert_fp8(np.zeros(x.shape, np.float32), x.astype(dt), 1.0, "auto")
    h = np.zeros(x.shape, np.float16)
    lk.convert_fp8(h, x, 1.0, "auto")
    assert np.array_equal(h, x.astype(np.float16))


# ---- scaled_fp8_quant: vLLM's padded per-token scales and group_shape

def test_scaled_fp8_quant_padding_and_group_shape(rng):
    x = rng.standard_normal((6, 40)).astype(np.float32)
    out, s = lk.scaled_fp8_quant(x, num_token_padding=10, use_per_token_if_dynamic=True)
    ref, rs = lk.scaled_fp8_quant(x, use_per_token_if_dynamic=True)
    assert out.shape == (10, 40) and s.shape == (10, 1) and rs.shape == (6, 1)
    assert np.array_equal(s[:6], rs) and np.all(s[6:] == 0)
    assert np.array_equal(out[:6].view(np.uint8), ref.view(np.uint8))
    a, _ = lk.scaled_fp8_quant(x, np.float32(0.05), group_shape=(-1, -1))
    b, _ = lk.scaled_fp8_quant(x, 0.05)
    assert np.array_equal(a.view(np.uint8), b.view(np.uint8))
    # per-token static scales (vLLM's 1-D scale with group_shape (1, -1)): each row its own
    # scale, the same codes as the per-tensor op row by row; without group_shape a 1-D
    # scale is ambiguous (tests/python/test_fp8_static_groups.py has the full rules)
    sc = np.linspace(0.02, 0.07, 6, dtype=np.float32)
    c, s = lk.scaled_fp8_quant(x, sc, group_shape=(1, -1))
    assert s is sc
    for r in range(6):
        d, _ = lk.scaled_fp8_quant(x[r:r + 1], sc[r])
        assert np.array_equal(c[r].view(np.uint8), d[0].view(np.uint8))
    with pytest.raises(ValueError, match="group_shape"):
        lk.static_scaled_fp8_quant(np.zeros((6, 40), E4), x, np.full((6,), 0.05, np.float32))


def test_scaled_fp8_quant_padding_torch():
    torch = pytest.importorskip("torch")
    x = torch.randn(5, 32)
    out, s = lk.scaled_fp8_quant(x, num_token_padding=8, use_per_token_if_dynamic=True)
    ref, rs = lk.scaled_fp8_quant(x, use_per_token_if_dynamic=True)
    assert tuple(out.shape) == (8, 32) and tuple(s.shape) == (8, 1) and s.dtype == torch.float32
    assert torch.equal(s[:5], rs) and torch.all(s[5:] == 0)
    assert torch.equal(out[:5].view(torch.uint8), ref.view(torch.uint8))


# ---- error messages name the caller's arguments

def test_error_messages_name_python_arguments():
    x = np.ones((4, 16), np.float32)
    with pytest.raises(lk.LlmkernError, match=r"output: shape \[4, 9\] does not match input \[4, 16\]"):
        lk.convert_fp8(np.zeros((4, 9), np.uint8), x, 1.0, "fp8")
    k = np.ones((2, 2, 16), np.float32)
    with pytest.raises(lk.LlmkernError, match="key: dtype f8e4m3"):
        lk.reshape_and_cache_flash(k.astype(E4), k, np.zeros((2, 4, 2, 16), np.uint8),
                                   np.zeros((2, 4, 2, 16), np.uint8), np.array([0, 1]), "fp8", 1.0, 1.0)
    with pytest.raises(lk.LlmkernError, match=r"value_cache: shape \[3, 4, 2, 16\] does not match key_cache"):
        lk.reshape_and_cache_flash(k, k, np.zeros((2, 4, 2, 16), np.uint8), np.zeros((3, 4, 2, 16), np.uint8),
                                   np.array([0, 1]), "fp8", 1.0, 1.0)
    with pytest.raises(lk.LlmkernError, match="kv_cache: shape"):
        lk.concat_and_cache_mla(np.ones((2, 32), np.float32), np.ones((2, 32), np.float32),
                                np.zeros((2, 4, 63), np.uint8), np.array([0, 1]), "fp8", 1.0)
    cache, bt = np.zeros((2, 4, 32), np.uint8), np.array([[0, 1]], np.int32)
    with pytest.raises(lk.LlmkernError, match=r"dst: shape \[5, 32\]"):
        lk.gather_and_maybe_dequant_cache(cache, np.zeros((5, 32), np.float32), bt, np.array([0, 6], np.int32), 1,
                                          "fp8", 1.0)
    pa, la = np.ones((3, 2, 16), np.float32), np.zeros((2, 3), np.float32)
    with pytest.raises(lk.LlmkernError, match="prefix_output: dtype f8e4m3"):
        lk.merge_attn_states(np.zeros((3, 2, 16), E4), pa.astype(E4), la, pa, la, output_scale=0.5)
    with pytest.raises(lk.LlmkernError, match="output_lse"):
        lk.merge_attn_states(np.zeros((3, 2, 16), E4), pa, la, pa, la, la.astype(np.float16), output_scale=0.5)


def test_one_element_scales_of_any_rank(rng):
    """vLLM takes any one-element static scale ([1, 1] included), for fp8 and int8"""
    x = rng.standard_normal((3, 16)).astype(np.float32)
    a, b = np.zeros((3, 16), E4), np.zeros((3, 16), E4)
    lk.static_scaled_fp8_quant(a, x, np.full((1, 1), 0.25, np.float32))
    lk.static_scaled_fp8_quant(b, x, 0.25)
    assert np.array_equal(a.view(np.uint8), b.view(np.uint8))
    i, j = np.zeros((3, 16), np.int8), np.zeros((3, 16), np.int8)
    lk.static_scaled_int8_quant(i, x, np.full((1, 1, 1), 0.05, np.float32))
    lk.static_scaled_int8_quant(j, x, 0.05)
    assert np.array_equal(i, j)
    with pytest.raises(lk.LlmkernError, match=r"scale: shape \[2\]: expected \[\] or \[1\]$"):  # not "[1] or [1]"
        lk.static_scaled_int8_quant(i, x, np.full((2,), 0.25, np.float32))


def test_copy_blocks_names_the_caches():
    k0, k1 = np.zeros((4, 2, 8), np.float32), np.zeros((4, 2, 8), np.float32)
    v0, bad = np.zeros((4, 2, 8), np.float32), np.zeros((4, 2, 8), np.int32)
    m = np.array([[0, 1]], np.int64)
    with pytest.raises(lk.LlmkernError, match=r"value_caches\[1\]: dtype i32"):
        lk.copy_blocks([k0, k1], [v0, bad], m)
    with pytest.raises(lk.LlmkernError, match=r"value_caches\[0\] and key_caches\[0\] overlap"):
        lk.copy_blocks([k0, k1], [k0, v0], m)
    with pytest.raises(lk.LlmkernError, match=r"kv_caches\[1\]: dtype i32"):
        lk.copy_blocks_mla([k0, bad], m)


def test_set_num_threads_range():
    for bad in (2 ** 31, 2 ** 32 + 1, -2 ** 31 - 1, 1.9, True, "2"):
        with pytest.raises(ValueError, match="n: "):
            lk.set_num_threads(bad)
    lk.set_num_threads(np.int32(1))
    lk.set_num_threads(0)
