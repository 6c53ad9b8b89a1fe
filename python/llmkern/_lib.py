"""ctypes layer over libllmkern: locating and loading the library, the C prototypes, the
tensor-view structs and the error -> exception rule. No operator logic lives here.

A tensor argument (NumPy array, torch CPU tensor, or any object with
__array_interface__) becomes an lk_tensor view: data pointer, dtype, rank, shape and
strides in ELEMENTS. Nothing is copied. The struct is packed with one struct.pack call
into a bytes object, which ctypes passes as a pointer (the C side only reads it).
"""
import ctypes
import os
import struct
import sys

import numpy as np

# ---------------------------------------------------------------- locating the library

_LIBNAME = "libllmkern.so"


def _candidates():
    env = os.environ.get("LLMKERN_LIB")
    if env:  # a file, or a directory holding libllmkern.so
        return [os.path.join(env, _LIBNAME) if os.path.isdir(env) else env]
    here = os.path.dirname(os.path.abspath(__file__))
    return [
        os.path.join(here, _LIBNAME),  # installed by `pip install ./python`
        os.path.join(here, "..", "..", "build", _LIBNAME),  # source tree: python/llmkern
    ]


def _load():
    tried = []
    for path in _candidates():
        if os.path.exists(path):
            return ctypes.CDLL(os.path.abspath(path)), os.path.abspath(path)
        tried.append(path)
    raise ImportError(
        "llmkern: cannot find %s (looked at: %s). Build it (cmake -S . -B build && "
        "cmake --build build), set LLMKERN_LIB to the file or its directory, or "
        "`pip install ./python` from the repository." % (_LIBNAME, ", ".join(tried)))


lib, lib_path = _load()

# ---------------------------------------------------------------- enums (llmkern.h)

F32, F16, BF16, I32, I64, F8E4M3, F8E5M2, I8 = 0, 1, 2, 3, 4, 5, 6, 7
_ITEMSIZE = (4, 2, 2, 4, 8, 1, 1, 1)
MAX_DIMS = 8
ISAS = {"ref": 0, "avx2": 1, "avx512": 2, "avx512bf16": 3, "amx": 5, "neon": 4}
LAYOUTS = {"ND": 0, "NZ": 1}
MLA_STRATEGIES = {"auto": 0, "split_merge": 1, "concat": 2, "fused": 3, "absorbed": 4}


class LkTensor(ctypes.Structure):
    """lk_tensor, for reference and for the layout self-check; calls use _PACK."""
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int32),
                ("shape", ctypes.c_int64 * MAX_DIMS), ("stride", ctypes.c_int64 * MAX_DIMS)]


class LkAttnParams(ctypes.Structure):
    _fields_ = [("scale", ctypes.c_float), ("causal", ctypes.c_int),
                ("window_left", ctypes.c_int64), ("window_right", ctypes.c_int64),
                ("softcap", ctypes.c_float), ("kv_layout", ctypes.c_int),
                ("alibi_slopes", ctypes.c_void_p),
                # ---- fp8 attention (since 0.3): pointers to packed lk_tensor descales
                ("q_descale", ctypes.c_void_p), ("k_descale", ctypes.c_void_p),
                ("v_descale", ctypes.c_void_p)]


class LkMlaParams(ctypes.Structure):
    _fields_ = [("scale", ctypes.c_float), ("strategy", ctypes.c_int),
                ("cache_layout", ctypes.c_int), ("dedup", ctypes.c_int)]


class LkMlaDecodeParams(ctypes.Structure):
    _fields_ = [("scale", ctypes.c_float), ("causal", ctypes.c_int),
                ("cache_layout", ctypes.c_int), ("split_keys", ctypes.c_int64)]


# _PACK[nd](ptr, dtype, nd, *shape, *strides) -> the bytes of one lk_tensor (unused dims 0)
_PACK = tuple(struct.Struct("@Pii%dq%dx%dq%dx" % (n, 8 * (MAX_DIMS - n), n, 8 * (MAX_DIMS - n))).pack
              for n in range(MAX_DIMS + 1))
_PACK_PARAMS = struct.Struct("@fiqqfiPPPP").pack  # alibi, q/k/v_descale (0.3)
_PACK_MLA_PARAMS = struct.Struct("@fiiif").pack  # + k_scale (0.3)
assert struct.calcsize("@Pii8q8q") == ctypes.sizeof(LkTensor)
assert struct.calcsize("@fiqqfiPPPP") == ctypes.sizeof(LkAttnParams)
assert struct.calcsize("@fiii") == ctypes.sizeof(LkMlaParams)
_PACK_MLA_DECODE_PARAMS = struct.Struct("@fiiqf4x").pack  # + k_scale (since 0.3)
assert struct.calcsize("@fiiq") == ctypes.sizeof(LkMlaDecodeParams)

# ---------------------------------------------------------------- errors


class LlmkernError(RuntimeError):
    """A C call returned a non-OK lk_status. .status is its name ("LK_ERR_SHAPE"), .code
    the number, str(e) the C message (it names the function and the argument)."""

    def __init__(self, code, status, message):
        super().__init__(message)
        self.code = code
        self.status = status
        self.message = message


_status_str = lib.lk_status_str
_status_str.argtypes = [ctypes.c_int]
_status_str.restype = ctypes.c_char_p
_last_error = lib.lk_last_error
_last_error.argtypes = []
_last_error.restype = ctypes.c_char_p


def raise_status(code):
    """Raise the LlmkernError of status `code` (call right after the failing C call)."""
    msg = (_last_error() or b"").decode("utf-8", "replace")
    raise LlmkernError(code, _status_str(code).decode(), msg)


# ---------------------------------------------------------------- prototypes

_T = ctypes.c_char_p  # const lk_tensor * (a packed bytes object, or None for NULL)
_i, _f = ctypes.c_int, ctypes.c_float


def _missing(name):
    def stub(*args):
        raise NotImplementedError("%s is not in this build of libllmkern (%s)" % (name, lib_path))
    stub.missing = True
    return stub


def cfunc(name, argtypes, restype=ctypes.c_int):
    try:
        f = getattr(lib, name)
    except AttributeError:
        return _missing(name)
    f.argtypes = argtypes
    f.restype = restype
    return f


rms_norm = cfunc("lk_rms_norm", [_T, _T, _T, _f, _i])
fused_add_rms_norm = cfunc("lk_fused_add_rms_norm", [_T, _T, _T, _f, _i])
silu_and_mul = cfunc("lk_silu_and_mul", [_T, _T])
gelu_tanh_and_mul = cfunc("lk_gelu_tanh_and_mul", [_T, _T])
gelu_and_mul = cfunc("lk_gelu_and_mul", [_T, _T])
mul_and_silu = cfunc("lk_mul_and_silu", [_T, _T])
fatrelu_and_mul = cfunc("lk_fatrelu_and_mul", [_T, _T, _f])
swigluoai_and_mul = cfunc("lk_swigluoai_and_mul", [_T, _T, _f, _f])
gelu_new = cfunc("lk_gelu_new", [_T, _T])
gelu_fast = cfunc("lk_gelu_fast", [_T, _T])
gelu_quick = cfunc("lk_gelu_quick", [_T, _T])
rotary_embedding = cfunc("lk_rotary_embedding", [_T, _T, _T, _T, _i])
reshape_and_cache_flash = cfunc("lk_reshape_and_cache_flash", [_T, _T, _T, _T, _T])
reshape_and_cache_flash_scaled = cfunc("lk_reshape_and_cache_flash_scaled", [_T, _T, _T, _T, _T, _f, _f])
merge_attn_states = cfunc("lk_merge_attn_states", [_T, _T, _T, _T, _T, _T])
merge_attn_states_n = cfunc("lk_merge_attn_states_n", [_T, _T, _i, _T, _T])
causal_softmax = cfunc("lk_causal_softmax", [_T, _T])
concat_and_cache_mla = cfunc("lk_concat_and_cache_mla", [_T, _T, _T, _T, _T, _i])
gather_cache = cfunc("lk_gather_cache", [_T, _T, _T, _T, _i])
swap_blocks = cfunc("lk_swap_blocks", [_T, _T, _T])
copy_blocks = cfunc("lk_copy_blocks", [_i, ctypes.c_char_p, _T])
# fp8 caches (since 0.3)
reshape_and_cache_flash_fp8 = cfunc("lk_reshape_and_cache_flash_fp8", [_T, _T, _T, _T, _T, _T, _T, _i])
concat_and_cache_mla_fp8 = cfunc("lk_concat_and_cache_mla_fp8", [_T, _T, _T, _T, _T, _i, _T])
# rotary on q_pe / k_pe, then the MLA latent cache write (vLLM's concat_and_cache_mla_rope_fused):
# positions, q_pe, k_pe, kv_c, cos_sin_cache, is_neox, kv_c_cache, k_pe_cache, slot_mapping, layout, scale
concat_and_cache_mla_rope = cfunc("lk_concat_and_cache_mla_rope", [_T, _T, _T, _T, _T, _i, _T, _T, _T, _i, _T])
gather_cache_fp8 = cfunc("lk_gather_cache_fp8", [_T, _T, _T, _T, _i, _T])
gather_cache_starts = cfunc("lk_gather_cache_starts", [_T, _T, _T, _T, _T, _i, _T])
convert_fp8 = cfunc("lk_convert_fp8", [_T, _T, _f])
flash_attn_varlen = cfunc("lk_flash_attn_varlen", [_T] * 9 + [ctypes.c_char_p])
flash_attn_varlen_scaled = cfunc("lk_flash_attn_varlen_scaled", [_T] * 9 + [ctypes.c_char_p, _T])
mla_prefix_prefill = cfunc("lk_mla_prefix_prefill", [_T] * 10 + [ctypes.c_char_p])
mla_last_trace = cfunc("lk_mla_last_trace", [], ctypes.c_char_p)
mla_decode = cfunc("lk_mla_decode", [_T] * 7 + [ctypes.c_char_p])
mla_decode_plan = cfunc("lk_mla_decode_plan", [_T, ctypes.POINTER(ctypes.c_int64)])
# fp8 activations (since 0.3)
static_scaled_fp8_quant = cfunc("lk_static_scaled_fp8_quant", [_T, _T, _T])
dynamic_scaled_fp8_quant = cfunc("lk_dynamic_scaled_fp8_quant", [_T, _T, _T])
dynamic_per_token_scaled_fp8_quant = cfunc("lk_dynamic_per_token_scaled_fp8_quant", [_T, _T, _T, _T])
rms_norm_static_fp8_quant = cfunc("lk_rms_norm_static_fp8_quant", [_T, _T, _T, _T, _f])
fused_add_rms_norm_static_fp8_quant = cfunc("lk_fused_add_rms_norm_static_fp8_quant", [_T, _T, _T, _T, _T, _f])
rms_norm_dynamic_per_token_quant = cfunc("lk_rms_norm_dynamic_per_token_quant", [_T, _T, _T, _T, _f, _T, _T])
merge_attn_states_scaled = cfunc("lk_merge_attn_states_scaled", [_T] * 7)
per_token_group_fp8_quant = cfunc("lk_per_token_group_fp8_quant", [_T, _T, _T, ctypes.c_int64, _f, _i])
rms_norm_per_block_quant = cfunc("lk_rms_norm_per_block_quant", [_T, _T, _T, _T, _f, _T, _T, ctypes.c_int64])
static_group_scaled_fp8_quant = cfunc("lk_static_group_scaled_fp8_quant", [_T, _T, _T])
# SiLU-and-mul then quantization (vLLM's silu_and_mul_quant / silu_and_mul_per_block_quant)
silu_and_mul_quant = cfunc("lk_silu_and_mul_quant", [_T, _T, _T])
silu_and_mul_per_block_quant = cfunc("lk_silu_and_mul_per_block_quant", [_T, _T, _T, _T, ctypes.c_int64])
# int8 activations (since 0.3)
static_scaled_int8_quant = cfunc("lk_static_scaled_int8_quant", [_T] * 4)
dynamic_scaled_int8_quant = cfunc("lk_dynamic_scaled_int8_quant", [_T] * 4)
set_num_threads = cfunc("lk_set_num_threads", [_i], None)
get_num_threads = cfunc("lk_get_num_threads", [], _i)
isa_current = cfunc("lk_isa_current", [], _i)
isa_best = cfunc("lk_isa_best", [], _i)
set_isa = cfunc("lk_set_isa", [_i])
isa_name = cfunc("lk_isa_name", [_i], ctypes.c_char_p)
version = cfunc("lk_version", [], ctypes.c_char_p)

# ---------------------------------------------------------------- tensor views

_NP_DTYPES = {np.dtype(np.float32): F32, np.dtype(np.float16): F16,
              np.dtype(np.int32): I32, np.dtype(np.int64): I64, np.dtype(np.int8): I8}


def _np_dtype_slow(dt, name):
    # bf16 NumPy arrays (ml_dtypes.bfloat16) without importing ml_dtypes
    if dt.name == "bfloat16" and dt.itemsize == 2 and dt.isnative:
        _NP_DTYPES[dt] = BF16
        return BF16
    fp8 = {"float8_e4m3fn": F8E4M3, "float8_e5m2": F8E5M2}.get(dt.name)  # ml_dtypes
    if fp8 is not None and dt.itemsize == 1:
        _NP_DTYPES[dt] = fp8
        return fp8
    raise TypeError("%s: dtype %s is not supported by llmkern (float32, float16, bfloat16; "
                    "int32/int64 for index tensors)" % (name, dt))


# NumPy's PyArrayObject starts {PyObject_HEAD; char *data; ...}: the data pointer is read
# straight from the object (PyArray_DATA), ~10x cheaper than __array_interface__. The
# offset is checked against __array_interface__ at import; if it ever disagrees the
# slow, official route is used.
_from_address = ctypes.c_void_p.from_address
_DATA_OFFSET = 2 * ctypes.sizeof(ctypes.c_void_p)


def _np_data_fast(a):
    return _from_address(id(a) + _DATA_OFFSET).value or 0


def _np_data_slow(a):
    return a.__array_interface__["data"][0]


def _probe_ok():
    base = np.arange(7, dtype=np.float32)
    for v in (base, base[3:], base[::-2], base.reshape(7, 1).T):
        if _np_data_fast(v) != _np_data_slow(v):
            return False
    return True


_np_data = _np_data_fast if _probe_ok() else _np_data_slow


def _np_info(a, name):
    try:
        dt = _NP_DTYPES[a.dtype]
    except KeyError:
        dt = _np_dtype_slow(a.dtype, name)
    st = a.strides
    isz = _ITEMSIZE[dt]
    es = tuple([s // isz for s in st])
    if sum(es) * isz != sum(st):  # remainders are >= 0, so only all-zero sums to 0
        raise ValueError("%s: byte strides %s are not multiples of the item size %d"
                         % (name, st, isz))
    return _np_data(a), dt, a.shape, es


_TORCH_DTYPES = {}


def _torch_info(t, name):
    if not t.is_cpu:
        raise ValueError("%s: tensor is on device %s; llmkern runs on the CPU" % (name, t.device))
    try:
        dt = _TORCH_DTYPES[t.dtype]
    except KeyError:
        raise TypeError("%s: dtype %s is not supported by llmkern (float32, float16, bfloat16; "
                        "int32/int64 for index tensors)" % (name, t.dtype)) from None
    return t.data_ptr(), dt, t.shape, t.stride()


def _iface_info(x, name):
    return _np_info(np.asarray(x), name)  # zero-copy: x exposes __array_interface__


_INFO = {np.ndarray: _np_info}  # type -> info function, grows on first sight of a type


def _register(x, name):
    """The info function for type(x), found once per type and remembered."""
    if isinstance(x, np.ndarray):
        fn = _np_info
    else:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(x, torch.Tensor):
            if not _TORCH_DTYPES:
                _TORCH_DTYPES.update({torch.float32: F32, torch.float16: F16, torch.bfloat16: BF16,
                                      torch.int32: I32, torch.int64: I64, torch.int8: I8})
                for nm, dt in (("float8_e4m3fn", F8E4M3), ("float8_e5m2", F8E5M2)):
                    if hasattr(torch, nm):
                        _TORCH_DTYPES[getattr(torch, nm)] = dt
            fn = _torch_info
        elif isinstance(x, np.generic):  # np.asarray would copy it into a temporary array
            raise TypeError("%s: a NumPy scalar (%s), expected an array or a tensor (np.asarray(x) kept "
                            "alive through the call)" % (name, type(x).__name__))
        elif hasattr(x, "__array_interface__"):
            fn = _iface_info
        else:
            raise TypeError("%s: expected a NumPy array or a torch tensor, got %s"
                            % (name, type(x).__name__))
    _INFO[type(x)] = fn
    return fn


def _info_slow(x, name):
    return _register(x, name)(x, name)


def info(x, name):
    """(data pointer, lk dtype, shape, element strides) of a tensor argument."""
    return _INFO.get(type(x), _info_slow)(x, name)


def pack(ptr, dt, shape, strides, name):
    """The bytes of one lk_tensor; ctypes passes them as `const lk_tensor *`."""
    nd = len(shape)
    if nd > MAX_DIMS:
        raise ValueError("%s: %d dims, llmkern views have at most %d" % (name, nd, MAX_DIMS))
    return _PACK[nd](ptr, dt, nd, *shape, *strides)


# view() is the hot path (a few per operator call): the bytes after the data pointer
# depend only on (dtype, shape, strides), so they are packed once per such key and kept.
_PACK_PTR = struct.Struct("@P").pack
_TAILS = {}
_TAILS_MAX = 4096


def _tail(key, x, name):
    p, dt, shape, st = _INFO.get(type(x), _info_slow)(x, name)
    tail = pack(0, dt, shape, st, name)[ctypes.sizeof(ctypes.c_void_p):]
    if len(_TAILS) >= _TAILS_MAX:
        _TAILS.clear()
    _TAILS[key] = tail
    return tail


def _np_view_fast(a, name):
    key = (a.dtype, a.shape, a.strides)
    tail = _TAILS.get(key)
    if tail is None:
        tail = _tail(key, a, name)
    return _PACK_PTR(_from_address(id(a) + _DATA_OFFSET).value or 0) + tail  # _np_data_fast


def _np_view_slow(a, name):
    key = (a.dtype, a.shape, a.strides)
    tail = _TAILS.get(key)
    if tail is None:
        tail = _tail(key, a, name)
    return _PACK_PTR(_np_data_slow(a)) + tail


_np_view = _np_view_fast if _np_data is _np_data_fast else _np_view_slow


def _torch_view(t, name):
    if not t.is_cpu:
        _torch_info(t, name)  # raises the device error
    key = (0, t.dtype, t.shape, t.stride())  # the leading 0 keeps torch keys apart
    tail = _TAILS.get(key)
    if tail is None:
        tail = _tail(key, t, name)
    return _PACK_PTR(t.data_ptr()) + tail


def _generic_view(x, name):
    return pack(*_INFO.get(type(x), _info_slow)(x, name), name)


_VIEW = {np.ndarray: _np_view}  # type -> view function, grows like _INFO


def _view_slow(x, name):
    fn = _register(x, name)
    fn = _np_view if fn is _np_info else _torch_view if fn is _torch_info else _generic_view
    _VIEW[type(x)] = fn
    return fn(x, name)


def view(x, name):
    """The packed lk_tensor of a tensor argument (None -> NULL)."""
    if x is None:
        return None
    return _VIEW.get(type(x), _view_slow)(x, name)


def _writable(x, name):
    if isinstance(x, np.ndarray) and not x.flags.writeable:
        raise ValueError("%s: the array is read-only and this call writes it" % name)


def out_view(x, name):
    """view() of an argument the call writes: read-only NumPy arrays are refused."""
    _writable(x, name)
    return view(x, name)


def _is_uint8(x):
    if isinstance(x, np.ndarray):
        return x.dtype == np.uint8
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor) and x.dtype == torch.uint8


# ---- fp8 attention inputs (flash_attn over fp8 q / K / V)


def fp8_view(x, name, dt=None):
    """view() of a read-only argument that may be fp8: with dt (F8E4M3 / F8E5M2) a uint8
    buffer is viewed as dt and an fp8-typed array or tensor must be of dtype dt; without
    dt, float8 arrays / tensors are taken by their own dtype (as view() does)."""
    if x is None or dt is None:
        return view(x, name)
    if _is_uint8(x):
        if isinstance(x, np.ndarray):
            return pack(_np_data(x), dt, x.shape, x.strides, name)  # itemsize 1: byte strides
        if not x.is_cpu:
            raise ValueError("%s: tensor is on device %s; llmkern runs on the CPU" % (name, x.device))
        return pack(x.data_ptr(), dt, x.shape, x.stride(), name)
    p, got, shape, st = info(x, name)
    if got != dt:
        raise TypeError("%s: dtype %s does not match the fp8 kv_cache_dtype (%s)"
                        % (name, getattr(x, "dtype", got), "float8_e4m3fn" if dt == F8E4M3 else "float8_e5m2"))
    return pack(p, dt, shape, st, name)


def fp8_out_view(x, name, dt):
    """out_view() of an fp8 cache of lk dtype dt: a uint8 buffer (as vLLM allocates fp8
    caches) is viewed as dt; an fp8-typed array or tensor must be of dtype dt."""
    _writable(x, name)
    return fp8_view(x, name, dt)


def is_fp8_buffer(x):
    """A uint8 buffer or an fp8-typed array / tensor (ml_dtypes, torch.float8_*)."""
    if x is None:
        return False
    if _is_uint8(x):
        return True
    name = str(getattr(x, "dtype", ""))
    return "float8_e4m3fn" in name or "float8_e5m2" in name


# ---- fp8 inputs (mla_prefix_prefill's latent caches)

def fp8_in_view(x, name, dt):
    """view() of an fp8 input of lk dtype dt: a uint8 buffer (as vLLM allocates fp8 caches)
    is viewed as dt; an fp8-typed array or tensor must be of dtype dt (None -> NULL)."""
    return None if x is None else fp8_view(x, name, dt)


def transposed_view(x, name, write=False):
    """The view with reversed dims: an LSE stored [heads, tokens] passed as [tokens, heads]."""
    if x is None:
        return None
    if write:
        _writable(x, name)
    p, dt, shape, st = info(x, name)
    return pack(p, dt, tuple(shape)[::-1], tuple(st)[::-1], name)


def is_torch(x):
    fn = _INFO.get(type(x))
    if fn is None:
        try:
            fn = _register(x, "tensor")
        except TypeError:
            return False
    return fn is _torch_info


def attn_params(scale, causal, window_left, window_right, softcap, layout, alibi=None,
                q_descale=None, k_descale=None, v_descale=None):
    """The packed lk_attn_params; alibi, q/k/v_descale: packed lk_tensors or None. With
    any of them, returns (params, keep): keep holds their buffers, which must outlive the
    call."""
    tens = (alibi, q_descale, k_descale, v_descale)
    if all(t is None for t in tens):
        return _PACK_PARAMS(scale, causal, window_left, window_right, softcap, layout, 0, 0, 0, 0)
    keep = [None if t is None else ctypes.create_string_buffer(t, len(t)) for t in tens]
    ptrs = [0 if k is None else ctypes.addressof(k) for k in keep]
    return _PACK_PARAMS(scale, causal, window_left, window_right, softcap, layout, *ptrs), keep


def mla_params(scale, strategy, layout, dedup, k_scale=1.0):
    return _PACK_MLA_PARAMS(scale, strategy, layout, dedup, k_scale)


def mla_decode_params(scale, causal, layout, split_keys, k_scale=1.0):
    return _PACK_MLA_DECODE_PARAMS(scale, causal, layout, split_keys, k_scale)
