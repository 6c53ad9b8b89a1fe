"""The binding itself: runtime functions, the lk_tensor views (pointer, strides in
elements, dtypes), the checks only Python can make (device, dtype, byte strides,
read-only outputs), the error class, and that nothing is copied."""
import ctypes
import struct

import numpy as np
import pytest

import llmkern as lk
from llmkern import _lib as L
from helpers import rand, torch_or_skip

EPS = 1e-6


def unpack(b):
    """(data, dtype, ndim, shape, strides) of a packed lk_tensor."""
    f = struct.unpack("@Pii8q8q", b)
    nd = f[2]
    return f[0], f[1], nd, f[3:3 + nd], f[11:11 + nd]


def test_version_and_runtime():
    assert lk.version() == "0.3.0" == lk.__version__
    assert lk.isa() in ("ref", "avx2", "avx512", "avx512bf16", "amx", "neon")
    best = lk.best_isa()
    prev = lk.isa()
    try:
        lk.set_isa("ref")
        assert lk.isa() == "ref"
        x = np.ones((2, 8), np.float32)
        lk.rms_norm(x, x, np.ones(8, np.float32), EPS)  # runs on the ref kernels
        lk.set_isa("best")
        assert lk.isa() == best
        # x86: each needs the ones before; aarch64: neon; the other architecture's: none
        chains = [["ref", "avx2", "avx512", "avx512bf16", "amx"], ["ref", "neon"]]
        chain = [c for c in chains if best in c][0]
        others = [n for c in chains for n in c if n not in chain]
        for name in chain[chain.index(best) + 1:] + others:
            with pytest.raises(lk.LlmkernError) as e:
                lk.set_isa(name)
            assert e.value.status == "LK_ERR_UNSUPPORTED" and "lk_set_isa" in str(e.value)
        with pytest.raises(ValueError):
            lk.set_isa("sse2")
    finally:
        lk.set_isa(prev)
    n = lk.get_num_threads()
    try:
        lk.set_num_threads(1)
        assert lk.get_num_threads() == 1
        lk.set_num_threads(3)
        assert lk.get_num_threads() == 3
    finally:
        lk.set_num_threads(n)


def test_struct_layout_matches_ctypes():
    t = L.LkTensor()
    a = np.zeros((3, 5), np.float16)[:, 1::2]
    b = L.view(a, "a")
    ctypes.memmove(ctypes.addressof(t), b, len(b))
    assert t.data == a.__array_interface__["data"][0]
    assert (t.dtype, t.ndim) == (L.F16, 2)
    assert list(t.shape[:2]) == [3, 2] and list(t.stride[:2]) == [5, 2]
    p = L.LkAttnParams()
    pb = L.attn_params(0.5, 1, 7, -1, 2.5, 1)
    ctypes.memmove(ctypes.addressof(p), pb, len(pb))
    assert (p.scale, p.causal, p.window_left, p.window_right, p.softcap, p.kv_layout) == (0.5, 1, 7, -1, 2.5, 1)


@pytest.mark.parametrize("make", [
    lambda b: b, lambda b: b[1:, 2:], lambda b: b[::-1], lambda b: b.T, lambda b: b[:, ::-3],
    lambda b: b[2], lambda b: b[None, :, 1], lambda b: np.broadcast_to(b[0], (4, 6)),
    lambda b: b[:0],
])
def test_views_are_pointer_shape_element_strides(make):
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    a = make(base)
    p, dt, nd, shape, strides = unpack(L.view(a, "a"))
    if a.size:
        assert p == a.__array_interface__["data"][0]
    assert (dt, nd, shape) == (L.F32, a.ndim, a.shape)
    assert strides == tuple(s // 4 for s in a.strides)


def test_view_cache_keeps_strides_apart():
    # same shape and dtype, different strides: distinct descriptors from the tail cache
    b = np.zeros((8, 8), np.float32)
    assert unpack(L.view(b[:4, :4], "x"))[4] == (8, 1)
    assert unpack(L.view(b[::2, ::2], "x"))[4] == (16, 2)
    assert unpack(L.view(b[:4, :4].copy(), "x"))[4] == (4, 1)
    assert unpack(L.view(b[:4, :4].astype(np.float16), "x"))[1] == L.F16


def test_index_dtypes_and_bad_dtypes():
    assert unpack(L.view(np.zeros(3, np.int32), "i"))[1] == L.I32
    assert unpack(L.view(np.zeros(3, np.int64), "i"))[1] == L.I64
    x = np.ones((2, 8), np.float64)
    with pytest.raises(TypeError, match="input: dtype float64"):
        lk.rms_norm(np.empty((2, 8), np.float32), x, np.ones(8, np.float32), EPS)
    with pytest.raises(TypeError, match="weight: expected a NumPy array"):
        lk.rms_norm(np.empty((2, 8), np.float32), x.astype(np.float32), [1.0] * 8, EPS)
    with pytest.raises(TypeError):
        L.view(np.ones(3, ">f4"), "big_endian")


def test_byte_strides_not_multiple_of_itemsize():
    rec = np.zeros(6, dtype=[("a", np.float32), ("b", np.int8)])  # 5-byte records
    with pytest.raises(ValueError, match="not multiples of the item size"):
        L.view(rec["a"], "x")


def test_too_many_dims():
    with pytest.raises(ValueError, match="at most 8"):
        L.view(np.zeros((1,) * 9, np.float32), "x")


def test_read_only_output_refused():
    x = np.ones((2, 8), np.float32)
    ro = np.zeros((2, 8), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="out: the array is read-only"):
        lk.rms_norm(ro, x, np.ones(8, np.float32), EPS)
    assert not ro.any()
    lk.rms_norm(np.empty_like(x), ro, np.ones(8, np.float32), EPS)  # read-only input is fine


def test_array_interface_objects_zero_copy():
    class Wrapped:  # any object exposing __array_interface__ (no copy)
        def __init__(self, a):
            self.a = a
            self.__array_interface__ = a.__array_interface__

    out = np.zeros((2, 8), np.float32)
    lk.rms_norm(Wrapped(out), np.ones((2, 8), np.float32), Wrapped(np.ones(8, np.float32)), EPS)
    np.testing.assert_allclose(out, 1.0, rtol=1e-6)


def test_error_class():
    assert issubclass(lk.LlmkernError, RuntimeError)
    with pytest.raises(lk.LlmkernError) as e:
        lk.silu_and_mul(np.empty((2, 3), np.float32), np.empty((2, 5), np.float32))
    err = e.value
    assert err.status == "LK_ERR_SHAPE" and err.code == 3
    assert str(err) == err.message and err.message.startswith("lk_silu_and_mul: ")


def test_out_is_written_in_place_numpy(rng):
    x = rand(rng, (3, 40), np.float32)
    out = np.zeros((3, 20), np.float32)
    alias = out  # the same object
    view = out[1:]  # and a view of it
    lk.silu_and_mul(out, x)
    assert alias is out and np.shares_memory(view, out)
    assert np.all(view != 0) and np.array_equal(view, out[1:])


def test_torch_zero_copy_and_device(rng):
    torch = torch_or_skip()
    x = torch.randn(4, 32, dtype=torch.bfloat16)
    out = torch.zeros(4, 16, dtype=torch.bfloat16)
    ptr = out.data_ptr()
    lk.silu_and_mul(out, x)
    assert out.data_ptr() == ptr and bool((out != 0).any())
    p, dt, nd, shape, strides = unpack(L.view(x.t(), "x"))  # strides already in elements
    assert (p, dt, shape, strides) == (x.data_ptr(), L.BF16, (32, 4), (1, 32))
    meta = torch.empty(4, 16, device="meta")  # any non-CPU device (CUDA where there is one)
    with pytest.raises(ValueError, match="out: tensor is on device meta"):
        lk.silu_and_mul(meta, x.float())
    with pytest.raises(TypeError, match="float64"):
        lk.silu_and_mul(out, x.double())
    param = torch.nn.Parameter(torch.ones(16))  # tensor subclasses pass too
    o2 = torch.empty(2, 16)
    lk.rms_norm(o2, torch.ones(2, 16), param, EPS)
    torch.testing.assert_close(o2, torch.ones(2, 16), rtol=1e-5, atol=1e-5)


def test_numpy_bf16_via_ml_dtypes():
    ml = pytest.importorskip("ml_dtypes")
    x = np.ones((2, 8), ml.bfloat16)
    out = np.zeros((2, 8), ml.bfloat16)
    lk.rms_norm(out, x, np.ones(8, np.float32), EPS)
    assert np.all(out.astype(np.float32) == 1.0)
