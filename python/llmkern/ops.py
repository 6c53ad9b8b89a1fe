"""The operators, with vLLM's custom-op and flash-attention signatures (argument names and
order). Each function maps its arguments onto one C call; the C side validates shapes,
dtypes, index values and overlaps and its message becomes an LlmkernError (where a C
parameter's name differs from the Python argument's, e.g. convert_fp8's dst / output, the
message names the Python one). Python checks
only what C cannot see: the device, the Python-only arguments (kv_cache_dtype, scales,
head_size reshapes) and read-only NumPy outputs. Nothing is copied.
"""
import math
import re
import struct

import numpy as np

from . import _lib as L
from ._lib import LlmkernError  # noqa: F401  (re-exported)

_view, _out, _tview = L.view, L.out_view, L.transposed_view
_raise = L.raise_status


def _is_number(x):
    """A Python or NumPy number (np.float32(0.5)): scale arguments take them by value."""
    return isinstance(x, (int, float, np.generic)) and not isinstance(x, (bool, np.bool_))


def _is_int(x):
    """A Python or NumPy integer, not a bool."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _raise_as(code, names):
    """_raise, the C message's argument names given as the caller's (vLLM's) names:
    names maps a C name (as the message writes it: "dst", "params.k_scale") to the Python
    argument's. A name is replaced where the message uses it as one: followed by ':',
    '[', ' [', "'s", ' (', a dtype (" f32", " bf16", " i32"), " and " or " overlap"."""
    try:
        _raise(code)
    except L.LlmkernError as e:
        alt = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
        pat = r"(?<![\w.])(%s)(?=:|\[| \[|'s| b?f\d| i\d| and | overlap| \()" % alt
        msg = re.sub(pat, lambda m: names[m.group(1)], e.message)
        raise L.LlmkernError(e.code, e.status, msg) from None


# ---------------------------------------------------------------- normalisation

_NORM_NAMES = {"x": "input", "w": "weight", "eps": "epsilon"}  # C -> vLLM
_ACT_NAMES = {"x": "input"}


def rms_norm(out, input, weight, epsilon):
    """out = input * rsqrt(mean(input^2) + epsilon) * weight (last dim); out may be input.
    weight None: no weight (vLLM's `Tensor? weight`)."""
    s = L.rms_norm(_out(out, "out"), _view(input, "input"), _view(weight, "weight"), epsilon, 0)
    if s:
        _raise_as(s, _NORM_NAMES)


def fused_add_rms_norm(input, residual, weight, epsilon):
    """residual = input + residual; input = rms_norm(residual) (both in place); weight
    may be None (no weight)."""
    s = L.fused_add_rms_norm(_out(input, "input"), _out(residual, "residual"),
                             _view(weight, "weight"), epsilon, 0)
    if s:
        _raise_as(s, _NORM_NAMES)


def gemma_rms_norm(out, input, weight, epsilon):
    """Gemma's form: out = input * rsqrt(mean(input^2) + epsilon) * (1 + weight)."""
    s = L.rms_norm(_out(out, "out"), _view(input, "input"), _view(weight, "weight"), epsilon, 1)
    if s:
        _raise_as(s, _NORM_NAMES)


def gemma_fused_add_rms_norm(input, residual, weight, epsilon):
    s = L.fused_add_rms_norm(_out(input, "input"), _out(residual, "residual"),
                             _view(weight, "weight"), epsilon, 1)
    if s:
        _raise_as(s, _NORM_NAMES)


# ---------------------------------------------------------------- activations


def silu_and_mul(out, input):
    """out[..., d] = silu(input[..., :d]) * input[..., d:]."""
    s = L.silu_and_mul(_out(out, "out"), _view(input, "input"))
    if s:
        _raise_as(s, _ACT_NAMES)


def gelu_tanh_and_mul(out, input):
    """out[..., d] = gelu_tanh(input[..., :d]) * input[..., d:]."""
    s = L.gelu_tanh_and_mul(_out(out, "out"), _view(input, "input"))
    if s:
        _raise_as(s, _ACT_NAMES)


def gelu_and_mul(out, input):
    """out[..., d] = gelu(input[..., :d]) * input[..., d:], exact (erf) GELU."""
    s = L.gelu_and_mul(_out(out, "out"), _view(input, "input"))
    if s:
        _raise_as(s, _ACT_NAMES)


def mul_and_silu(out, input):
    """out[..., d] = input[..., :d] * silu(input[..., d:]) (the activation on the second half)."""
    s = L.mul_and_silu(_out(out, "out"), _view(input, "input"))
    if s:
        _raise_as(s, _ACT_NAMES)


def fatrelu_and_mul(out, input, threshold=0.0):
    """out[..., d] = (g > threshold ? g : 0) * input[..., d:], g = input[..., :d]."""
    s = L.fatrelu_and_mul(_out(out, "out"), _view(input, "input"), threshold)
    if s:
        _raise_as(s, _ACT_NAMES)


def swigluoai_and_mul(out, input, alpha=1.702, limit=7.0):
    """gpt-oss: g = min(input[..., 0::2], limit), u = clamp(input[..., 1::2], -limit, limit),
    out[..., d] = (u + 1) * g * sigmoid(alpha * g)."""
    s = L.swigluoai_and_mul(_out(out, "out"), _view(input, "input"), alpha, limit)
    if s:
        _raise_as(s, _ACT_NAMES)


def gelu_new(out, input):
    """out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), element-wise."""
    s = L.gelu_new(_out(out, "out"), _view(input, "input"))
    if s:
        _raise_as(s, _ACT_NAMES)


def gelu_fast(out, input):
    """out = 0.5 x (1 + tanh(0.7978845608 x (1 + 0.044715 x^2))), element-wise."""
    s = L.gelu_fast(_out(out, "out"), _view(input, "input"))
    if s:
        _raise_as(s, _ACT_NAMES)


def gelu_quick(out, input):
    """out = x * sigmoid(1.702 x), element-wise."""
    s = L.gelu_quick(_out(out, "out"), _view(input, "input"))
    if s:
        _raise_as(s, _ACT_NAMES)


# ---------------------------------------------------------------- rotary


def _merge_lead(shape, st, name):
    """[B, S, ...] -> [B * S, ...] without a copy: needs stride[0] == S * stride[1] (what a
    contiguous batch, or a column slice of one, has); else ValueError naming the argument."""
    if shape[0] > 1 and shape[1] > 1 and st[0] != shape[1] * st[1]:
        raise ValueError("%s: shape %s with strides %s: the [batch, seq] dims cannot be viewed "
                         "as one token dim without a copy" % (name, tuple(shape), tuple(st)))
    return (shape[0] * shape[1],) + tuple(shape[2:]), (st[1] if shape[1] > 1 else st[0],) + tuple(st[2:])


def _heads_view(x, head_size, name, batched):
    """vLLM passes q/k as [T, H * head_size] (the [T, H, head_size] view of the same memory)
    or batched as [B, S, H * head_size] / [B, S, H, head_size] (batched: positions [B, S];
    B and S merge into one token dim). [T, H, head_size] passes as it is; anything else
    goes to C to judge."""
    L._writable(x, name)
    p, dt, shape, st = L.info(x, name)
    shape, st = tuple(shape), tuple(st)
    if batched:
        if len(shape) not in (3, 4):
            raise ValueError("%s: shape %s; with positions [B, S] expected [B, S, H * head_size] "
                             "or [B, S, H, head_size]" % (name, shape))
        shape, st = _merge_lead(shape, st, name)
    if len(shape) == 2:
        if shape[1] % head_size:
            raise ValueError("%s: last dim %d is not a multiple of head_size %d"
                             % (name, shape[1], head_size))
        shape = (shape[0], shape[1] // head_size, head_size)
        st = (st[0], st[1] * head_size, st[1])
    elif len(shape) == 3 and shape[2] != head_size:
        raise ValueError("%s: head dim %d (shape %s) is not head_size %d"
                         % (name, shape[2], tuple(shape), head_size))
    return L.pack(p, dt, shape, st, name)


def rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox):
    """In place. positions [T]; query [T, Hq * head_size] or [T, Hq, head_size]; key likewise
    or None; batched (vLLM): positions [B, S], query/key [B, S, H * head_size] or
    [B, S, H, head_size]; cos_sin_cache [max_pos, rot] = [cos | sin]; is_neox: NeoX or
    GPT-J pairs."""
    if head_size < 1:
        raise ValueError("head_size: must be >= 1, got %r" % (head_size,))
    pp, pdt, pshape, pst = L.info(positions, "positions")
    batched = len(pshape) == 2
    if batched:
        pshape, pst = _merge_lead(tuple(pshape), tuple(pst), "positions")
    pos = L.pack(pp, pdt, pshape, pst, "positions")
    k = None if key is None else _heads_view(key, head_size, "key", batched)
    s = L.rotary_embedding(pos, _heads_view(query, head_size, "query", batched),
                           k, _view(cos_sin_cache, "cos_sin_cache"), is_neox)
    if s:
        _raise_as(s, {"q": "query", "k": "key"})


# ---------------------------------------------------------------- fp8 activations
# vLLM's names and argument order: the raw custom ops write into `out` (and the scale
# tensors) in place; scaled_fp8_quant, rms_norm_dynamic_per_token_quant,
# rms_norm_per_block_quant and silu_and_mul_per_block_quant allocate and return (output,
# scale) as vLLM's Python wrappers do. An fp8 output is a float8_e4m3fn / float8_e5m2 tensor or array (ml_dtypes for
# NumPy), or a uint8 buffer taken as e4m3.


def _fp8_out(x, name):
    if L._is_uint8(x):
        return L.fp8_out_view(x, name, L.F8E4M3)
    return _out(x, name)


def _scale_in(scale, name):
    """A per-tensor scale: a number becomes a one-element f32 array, a one-element tensor of
    any rank (vLLM takes [1, 1]) its [1] view; validated in C."""
    if _is_number(scale):
        return np.array([scale], dtype=np.float32)
    shape = tuple(getattr(scale, "shape", ()))
    if len(shape) > 1 and all(int(d) == 1 for d in shape):
        return scale.reshape(1)
    return scale


def _group_shape_arg(group_shape):
    """vLLM's group_shape: two ints (group_m, group_n), each -1 (the whole dim) or >= 1."""
    try:
        gs = tuple(group_shape)
    except TypeError:
        gs = None
    if gs is None or not all(_is_int(g) for g in gs):
        raise TypeError("group_shape: %r, expected two ints (group_m, group_n), -1 for a whole dim"
                        % (group_shape,))
    if len(gs) != 2 or any(g != -1 and g < 1 for g in gs):
        raise ValueError("group_shape: %r, expected two ints (group_m, group_n), each -1 (the whole dim) "
                         "or >= 1" % (group_shape,))
    return int(gs[0]), int(gs[1])


# a [1, 1] grid of 1.0 for the calls whose scale grid is empty (an empty input: nothing is
# read or written; C still validates out and input)
_ONE_GRID = np.ones((1, 1), np.float32)
_ONE_GRID.flags.writeable = False


def _grid_scale(input, scale, group_shape):
    """The packed [sm, sn] lk_tensor of a static scale with more than one element (vLLM's
    1-D / 2-D rules, static_scaled_fp8_quant's docstring); shape errors C cannot see
    (rank, group_shape) raise ValueError here."""
    p, dt, sshape, sst = L.info(scale, "scale")
    sshape = tuple(int(d) for d in sshape)
    if len(sshape) > 2:
        raise ValueError("scale: shape %s; a static scale is one value (per tensor), 1-D or 2-D, not %d-D"
                         % (list(sshape), len(sshape)))
    xshape = tuple(int(d) for d in L.info(input, "input")[2])
    if not xshape:
        return _view(_ONE_GRID, "scale")  # C refuses the 0-D input
    M, N = int(np.prod(xshape[:-1], dtype=np.int64)), xshape[-1]
    gs = None if group_shape is None else _group_shape_arg(group_shape)
    if len(sshape) == 2:
        s0, s1 = sshape
        rows_ok = M % s0 == 0 if s0 >= 1 else M == 0
        cols_ok = N % s1 == 0 if s1 >= 1 else N == 0
        if s0 * s1 == 0 and rows_ok and cols_ok:
            return _view(_ONE_GRID, "scale")  # an empty input's empty grid: nothing to read
        if gs is not None and rows_ok and cols_ok:  # else C refuses the shape
            gm, gn = (M if gs[0] == -1 else gs[0]), (N if gs[1] == -1 else gs[1])
            if (gm, gn) != (M // s0, N // s1):
                raise ValueError("group_shape: %r does not match the groups of scale %s over input %s "
                                 "(%d rows x %d columns): groups of %d x %d"
                                 % (group_shape, list(sshape), list(xshape), M, N, M // s0, N // s1))
        return _view(scale, "scale")  # C checks that [s0, s1] splits the [M, N] rows x columns
    # 1-D: group_shape says along which dim the scales vary
    n = sshape[0]
    if gs is None:
        raise ValueError("scale: shape %s; a 1-D scale needs group_shape to tell per-channel from per-token "
                         "scales: (-1, 1) per channel, (1, -1) per token" % (list(sshape),))
    for g, dim, what in ((gs[0], M, "rows"), (gs[1], N, "columns")):
        if g != -1 and dim % g:
            raise ValueError("group_shape: %r; groups of %d %s do not divide input %s (%d rows x %d columns)"
                             % (group_shape, g, what, list(xshape), M, N))
    em = 1 if gs[0] == -1 else M // gs[0]
    en = 1 if gs[1] == -1 else N // gs[1]
    if n != em * en:
        raise ValueError("scale: %d values, group_shape %r over input %s (%d rows x %d columns) makes %d x %d "
                         "= %d groups" % (n, group_shape, list(xshape), M, N, em, en, em * en))
    if n == 0:
        return _view(_ONE_GRID, "scale")  # an empty input: nothing to read
    if em == 1:  # per channel (groups of columns): [1, n]
        return L.pack(p, dt, (1, n), (0, sst[0]), "scale")
    if en == 1:  # per token (groups of rows): [n, 1]
        return L.pack(p, dt, (n, 1), (sst[0], 0), "scale")
    raise ValueError("scale: 1-D, but group_shape %r over input %s makes a %d x %d grid of groups; a 1-D scale "
                     "is one row or one column of groups, pass a 2-D [%d, %d] scale"
                     % (group_shape, list(xshape), em, en, em, en))


def static_scaled_fp8_quant(out, input, scale, group_shape=None):
    """vLLM's static_scaled_fp8_quant: out = fp8(input / s) in f32 (round to nearest even,
    saturated, NaN kept), input [..., N] seen as M = numel / N rows of N. scale f32 (any
    strides; values finite and > 0, else LlmkernError naming the element):
      one element (a number, 0-D, [1], [1, 1], ...): per tensor; group_shape is ignored as
        in vLLM (only its form is checked);
      1-D [n]: group_shape (group_m, group_n) required, -1 meaning the whole dim, each
        group size dividing its dim; n must be (M / group_m) * (N / group_n) with one of the
        two factors 1: per-channel style (M / group_m == 1, s = scale[c / group_n]; (-1, 1)
        per channel) or per-token style (N / group_n == 1, s = scale[r / group_m]; (1, -1)
        per token);
      2-D [sm, sn]: sm dividing M and sn dividing N (LlmkernError), groups of M / sm rows by
        N / sn columns, s = scale[r / (M / sm), c / (N / sn)] (e.g. [M / 1, N / 128] blocks);
        a group_shape given must be those groups (-1: the whole dim);
      3-D and more: ValueError.
    Python-side shape errors (the 1-D rules, a mismatched group_shape, the rank) raise
    ValueError, a malformed group_shape TypeError / ValueError. An empty input with an
    empty scale (0 groups along an empty dim) writes nothing."""
    if _is_number(scale) or int(np.prod(tuple(getattr(scale, "shape", ())), dtype=np.int64)) == 1:
        if group_shape is not None:
            _group_shape_arg(group_shape)  # its form only: vLLM ignores it for one scale
        scale = _scale_in(scale, "scale")
        s = L.static_scaled_fp8_quant(_fp8_out(out, "out"), _view(input, "input"), _view(scale, "scale"))
    else:
        sv = _grid_scale(input, scale, group_shape)
        s = L.static_group_scaled_fp8_quant(_fp8_out(out, "out"), _view(input, "input"), sv)
    if s:
        _raise(s)


def dynamic_scaled_fp8_quant(out, input, scale):
    """scale[0] = max(absmax(input) / fp8_max, 1 / (fp8_max * 512)); out = fp8(input / scale)."""
    s = L.dynamic_scaled_fp8_quant(_fp8_out(out, "out"), _view(input, "input"), _out(scale, "scale"))
    if s:
        _raise(s)


def dynamic_per_token_scaled_fp8_quant(out, input, scales, scale_ub=None):
    """Per row r: scales[r] = max(min(absmax(input[r]), scale_ub) / fp8_max, min_scale),
    out[r] = fp8(input[r] / scales[r]); scales [rows] or [rows, 1] f32."""
    if scale_ub is not None:
        scale_ub = _scale_in(scale_ub, "scale_ub")
    s = L.dynamic_per_token_scaled_fp8_quant(_fp8_out(out, "out"), _view(input, "input"), _out(scales, "scales"),
                                             _view(scale_ub, "scale_ub"))
    if s:
        _raise(s)


def _fp8_like(x, shape, dtype=None):
    """A new fp8 output of `shape` beside x (torch: float8_e4m3fn unless dtype; NumPy:
    ml_dtypes' float8_e4m3fn / float8_e5m2 when installed, else uint8 taken as e4m3).
    dtype int8 (torch.int8 / np.int8): an int8 output."""
    if L.is_torch(x):
        import torch
        return torch.empty(shape, dtype=dtype or torch.float8_e4m3fn)
    if dtype is not None and np.dtype(dtype) == np.int8:
        return np.empty(shape, dtype=np.int8)
    try:
        import ml_dtypes
        return np.empty(shape, dtype=dtype or ml_dtypes.float8_e4m3fn)
    except ImportError:
        if dtype is not None:
            raise ValueError("quant_dtype: %r needs ml_dtypes for NumPy inputs" % (dtype,)) from None
        return np.empty(shape, dtype=np.uint8)


def _f32_like(x, shape, zero=False):
    if L.is_torch(x):
        import torch
        return (torch.zeros if zero else torch.empty)(shape, dtype=torch.float32)
    return np.zeros(shape, dtype=np.float32)


def scaled_fp8_quant(input, scale=None, num_token_padding=None, scale_ub=None, use_per_token_if_dynamic=False,
                     output=None, group_shape=None):
    """vLLM's scaled_fp8_quant: returns (output, scale). scale given: static, per tensor
    or with a 1-D / 2-D scale and group_shape as static_scaled_fp8_quant; else
    dynamic, per token ([rows, 1] scales, scale_ub bounds the absmax) with
    use_per_token_if_dynamic, per tensor ([1]) otherwise. num_token_padding: output has
    max(num_token_padding, rows) rows of which the first rows are written; the per-token
    scales have as many rows, as in vLLM (the padding rows' scales are 0)."""
    shape = tuple(input.shape)
    if num_token_padding:
        if output is not None:
            raise ValueError("num_token_padding: not with an output given")
        if len(shape) != 2:
            raise ValueError("num_token_padding: input must be 2-D, got shape %s" % (shape,))
        shape = (max(int(num_token_padding), shape[0]), shape[1])
    if output is None:
        output = _fp8_like(input, shape)
    out = output[:input.shape[0]] if num_token_padding else output
    if scale is None:
        if use_per_token_if_dynamic:
            n = int(np.prod(input.shape[:-1])) if len(input.shape) else 1
            if num_token_padding:  # [padded rows, 1], the first n written
                scale = _f32_like(input, (shape[0], 1), zero=True)
                dynamic_per_token_scaled_fp8_quant(out, input, scale[:n], scale_ub)
            else:
                scale = _f32_like(input, (n, 1))
                dynamic_per_token_scaled_fp8_quant(out, input, scale, scale_ub)
        else:
            scale = _f32_like(input, (1,), zero=True)
            dynamic_scaled_fp8_quant(out, input, scale)
    else:
        static_scaled_fp8_quant(out, input, scale, group_shape)
    return output, scale


def rms_norm_static_fp8_quant(out, input, weight, scale, epsilon):
    """out = fp8(rms_norm(input, weight, epsilon) / scale) (weight None: no weight)."""
    scale = _scale_in(scale, "scale")
    s = L.rms_norm_static_fp8_quant(_fp8_out(out, "out"), _view(input, "input"), _view(weight, "weight"),
                                    _view(scale, "scale"), epsilon)
    if s:
        _raise(s)


def fused_add_rms_norm_static_fp8_quant(out, input, residual, weight, scale, epsilon):
    """residual = input + residual (in place; input is not written), then
    out = fp8(rms_norm(residual, weight, epsilon) / scale)."""
    scale = _scale_in(scale, "scale")
    s = L.fused_add_rms_norm_static_fp8_quant(_fp8_out(out, "out"), _view(input, "input"),
                                              _out(residual, "residual"), _view(weight, "weight"),
                                              _view(scale, "scale"), epsilon)
    if s:
        _raise(s)


def _quant_dtype(x, quant_dtype):
    """The output dtype for quant_dtype (torch.float8_e4m3fn / float8_e5m2 / int8,
    ml_dtypes' float8 types, np.int8, or their names)."""
    name = str(quant_dtype).replace("torch.", "")
    if not name.startswith("float8"):
        try:
            name = np.dtype(quant_dtype).name
        except TypeError:
            pass
    if name not in ("float8_e4m3fn", "float8_e5m2", "int8"):
        raise NotImplementedError("quant_dtype: %r, only float8_e4m3fn, float8_e5m2 and int8 are supported"
                                  % (quant_dtype,))
    if L.is_torch(x):
        import torch
        return getattr(torch, name)
    if name == "int8":
        return np.int8
    import ml_dtypes
    return getattr(ml_dtypes, name)


def rms_norm_dynamic_per_token_quant_into(result, input, weight, scale, epsilon, scale_ub=None, residual=None):
    """The raw custom op (torch.ops._C.rms_norm_dynamic_per_token_quant): result (fp8, or
    int8: i8(y * (1 / scale)) with scale = max(absmax / 127, FLT_EPSILON)) and scale
    [rows, 1] (or [rows]) f32 written in place."""
    if scale_ub is not None:
        scale_ub = _scale_in(scale_ub, "scale_ub")
    s = L.rms_norm_dynamic_per_token_quant(_fp8_out(result, "result"), _view(input, "input"), _view(weight, "weight"),
                                           _out(scale, "scale"), epsilon, _view(scale_ub, "scale_ub"),
                                           None if residual is None else _out(residual, "residual"))
    if s:
        _raise_as(s, {"out": "result", "scales": "scale"})


def rms_norm_dynamic_per_token_quant(input, weight, epsilon, quant_dtype, scale_ub=None, residual=None):
    """vLLM's rms_norm_dynamic_per_token_quant: returns (out, scales [rows, 1]); with
    residual, residual = input + residual (in place) and the norm is over it. quant_dtype
    float8_e4m3fn / float8_e5m2, or int8 (torch.int8, np.int8)."""
    out = _fp8_like(input, tuple(input.shape), _quant_dtype(input, quant_dtype))
    n = int(np.prod(input.shape[:-1])) if len(input.shape) else 1
    scales = _f32_like(input, (n, 1))
    rms_norm_dynamic_per_token_quant_into(out, input, weight, scales, epsilon, scale_ub, residual)
    return out, scales


# ---- per-token-group quantization (vLLM's per_token_group_fp8_quant custom op and its
# Python per_token_group_quant_fp8; block-fp8 activations such as DeepSeek-V3's, groups of
# 128): a scale per (row, group of group_size elements of the last dim)

_FP8_MAX = {L.F8E4M3: 448.0, L.F8E5M2: 57344.0}
_FP8_CODE = {"float8_e4m3fn": L.F8E4M3, "float8_e5m2": L.F8E5M2}


def _group_size_arg(group_size):
    """An int (not a bool) within int64; its value (the range rules are C's)."""
    if not _is_int(group_size) or not -2**63 <= group_size < 2**63:
        raise TypeError("group_size: %r, expected an int" % (group_size,))
    return int(group_size)


def _fp8_lk_dtype(x, name):
    """The lk dtype of an fp8 output as the C call sees it (a uint8 buffer: e4m3)."""
    return L.F8E4M3 if L._is_uint8(x) else L.info(x, name)[1]


_Q8_RANGE = {L.F8E4M3: ("float8_e4m3fn", -448.0, 448.0), L.F8E5M2: ("float8_e5m2", -57344.0, 57344.0),
             L.I8: ("int8", -128.0, 127.0)}


def _q8_range(output_q, dt, lo, hi, names):
    """vLLM's (min, max) pair of the 8-bit output (argument names `names`, e.g. "fp8_min,
    fp8_max"): it must be output_q's own range (the C op quantizes to the dtype's range and
    has no such parameters), else ValueError; not numbers: TypeError."""
    try:
        flo, fhi = float(lo), float(hi)
    except (TypeError, ValueError):
        flo = fhi = None
    if flo is None or isinstance(lo, (str, bytes)) or isinstance(hi, (str, bytes)):
        raise TypeError("%s: (%r, %r), expected two floats" % (names, lo, hi))
    r = _Q8_RANGE.get(dt)
    if r is not None and (flo != r[1] or fhi != r[2]):
        raise ValueError("%s: (%r, %r); only the range of output_q's dtype is supported: %s (%r, %r)%s"
                         % (names, lo, hi, r[0], r[1], r[2],
                            ", a uint8 buffer is taken as e4m3" if L._is_uint8(output_q) else ""))


def _eps_arg(eps):
    """eps as a float (a Python / NumPy number, or anything float() takes but a string);
    its range is C's (LlmkernError naming eps)."""
    if isinstance(eps, (str, bytes, bool, np.bool_)):
        raise TypeError("eps: %r, expected a float" % (eps,))
    try:
        return float(eps)
    except (TypeError, ValueError):
        raise TypeError("eps: %r, expected a float" % (eps,)) from None


def per_token_group_fp8_quant(input, output_q, output_s, group_size, eps, fp8_min, fp8_max, scale_ue8m0=False,
                              dummy_is_scale_transposed=False, dummy_is_tma_aligned=False):
    """vLLM's custom op (torch.ops._C.per_token_group_fp8_quant), written in place: per row r
    of input [..., D] and group g (elements g * group_size .. + group_size - 1 of the last
    dim), output_s[r, g] = s = max(absmax(group), eps) / fp8_max in f32 (scale_ue8m0: the
    smallest power of two >= max(s, 1e-10), DeepGEMM's UE8M0 scales) and
    output_q[r, i] = fp8(input[r, i] / s). output_q: float8_e4m3fn / float8_e5m2 (torch,
    ml_dtypes) or a uint8 buffer taken as e4m3; output_s f32 [..., D / group_size] (input's
    leading dims) or [rows, D / group_size], any strides (vLLM's column-major and
    TMA-aligned scales: transposed views of a [D / group_size, rows (padded)] buffer).
    fp8_min / fp8_max must be output_q's own range (-448 / 448 e4m3fn, -57344 / 57344
    e5m2): the C op quantizes to the dtype's range and has no such parameters, any other
    pair raises ValueError. An int8 output_q is taken too, as vLLM's kernel does (the codes
    of per_token_group_quant_int8_into: scale max(absmax, eps) / 127, truncated toward
    zero), fp8_min / fp8_max then -128 / 127. eps must be finite and >= fp8_max * FLT_MIN
    (LlmkernError). dummy_is_scale_transposed / dummy_is_tma_aligned: the two trailing bools
    of newer vLLM's schema, ignored as there (output_s's strides give its layout)."""
    g = _group_size_arg(group_size)
    ov = _fp8_out(output_q, "output_q")
    dt = _fp8_lk_dtype(output_q, "output_q")
    _q8_range(output_q, dt, fp8_min, fp8_max, "fp8_min, fp8_max")
    s = L.per_token_group_fp8_quant(ov, _view(input, "input"), _out(output_s, "output_s"), g, _eps_arg(eps),
                                    1 if scale_ue8m0 else 0)
    if s:
        _raise_as(s, {"out": "output_q", "scales": "output_s"})


def _fp8_dtype_name(dtype):
    """'float8_e4m3fn' or 'float8_e5m2' for dtype (torch / ml_dtypes types or their names;
    None: float8_e4m3fn)."""
    if dtype is None:
        return "float8_e4m3fn"
    name = str(dtype).replace("torch.", "")
    if name not in _FP8_CODE:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            pass
    if name not in _FP8_CODE:
        raise NotImplementedError("dtype: %r, only float8_e4m3fn and float8_e5m2 are supported" % (dtype,))
    return name


def _fp8_empty(x, shape, name):
    """A new fp8 output of `shape` beside x: torch's / ml_dtypes' `name` dtype (NumPy without
    ml_dtypes: a uint8 buffer for e4m3)."""
    if L.is_torch(x):
        import torch
        return torch.empty(shape, dtype=getattr(torch, name))
    try:
        import ml_dtypes
    except ImportError:
        if name != "float8_e4m3fn":
            raise ValueError("dtype: %s NumPy outputs need ml_dtypes (or pass out_q, a uint8 buffer)" % name) from None
        return np.empty(shape, dtype=np.uint8)
    return np.empty(shape, dtype=getattr(ml_dtypes, name))


def per_token_group_quant_fp8(x, group_size, eps=1e-10, dtype=None, column_major_scales=False,
                              tma_aligned_scales=False, out_q=None, use_ue8m0=None):
    """vLLM's per_token_group_quant_fp8 (fp8_utils): returns (x_q, x_s), x_q = fp8(x / scale)
    of x's shape, x_s f32 with shape x.shape[:-1] + (D // group_size,), one scale per
    group as per_token_group_fp8_quant (use_ue8m0: power-of-two scales; None: False).
    dtype: float8_e4m3fn (None) or float8_e5m2. out_q: the fp8 output to write (its own
    float8 dtype, or a uint8 buffer taken as dtype), else a new one. x_s layouts as vLLM
    allocates them: row-major; column_major_scales: the transposed view of an
    x.shape[:-2] + (D // group_size, M) buffer (M = x.shape[-2]; stride 1 along M);
    with tma_aligned_scales too, M padded to a multiple of 4 (DeepGEMM's TMA alignment, 2-D
    strides (1, padded M); the padding is zeros, never written). tma_aligned_scales without
    column_major_scales is row-major, as in vLLM. NumPy arrays or torch tensors, results of
    the same kind."""
    g = _group_size_arg(group_size)
    name = _fp8_dtype_name(dtype)
    shape = tuple(x.shape)
    D = shape[-1] if shape else 0
    ng = D // g if g >= 1 and D % g == 0 else 0  # else C refuses group_size before looking at x_s
    if out_q is None:
        out_q = _fp8_empty(x, shape, name)
    if L._is_uint8(out_q):
        ov = L.fp8_out_view(out_q, "out_q", _FP8_CODE[name])
    else:
        ov = _out(out_q, "out_q")
        got = L.info(out_q, "out_q")[1]
        if dtype is not None and got in _FP8_MAX and got != _FP8_CODE[name]:
            raise TypeError("out_q: dtype %s, not the dtype asked for (%s)" % (out_q.dtype, name))
    if column_major_scales:
        if len(shape) < 2:
            raise ValueError("column_major_scales: x has shape %s, expected at least 2 dims" % (shape,))
        m = shape[-2]
        mp = (m + 3) // 4 * 4 if tma_aligned_scales else m
        buf = _f32_like(x, shape[:-2] + (ng, mp), zero=True)
        x_s = buf[..., :m].transpose(-1, -2) if L.is_torch(x) else np.swapaxes(buf[..., :m], -1, -2)
    else:
        x_s = _f32_like(x, shape[:-1] + (ng,))
    s = L.per_token_group_fp8_quant(ov, _view(x, "x"), _out(x_s, "x_s"), g, float(eps), 1 if use_ue8m0 else 0)
    if s:
        _raise_as(s, {"out": "out_q", "input": "x", "scales": "x_s"})
    return out_q, x_s


# ---- DeepGEMM's UE8M0-packed scales (vLLM's per_token_group_fp8_quant_packed custom op, its
# C++ per_token_group_quant_8bit_packed, and the Python per_token_group_quant_fp8_packed_for_deepgemm):
# the per-token-group op with scale_ue8m0, the scales' 8-bit exponents packed four to an int32


def _packed_scales_out(x, mn, kp, name):
    """Checks output_s_packed as vLLM's op does, before anything is written: an int32 2-D
    NumPy array or CPU tensor of shape [mn, kp] (kp None: group_size does not divide the
    last dim, C refuses it; the shape is then not checked), writable; else TypeError (not
    an array / tensor, dtype) or ValueError (device, dims, shape, read-only)."""
    if L.is_torch(x):
        import torch
        if not x.is_cpu:
            raise ValueError("%s: tensor is on device %s; llmkern runs on the CPU" % (name, x.device))
        ok = x.dtype == torch.int32
    elif isinstance(x, np.ndarray):
        ok = x.dtype == np.dtype(np.int32)  # native byte order
    else:
        raise TypeError("%s: expected a NumPy array or a torch tensor, got %s" % (name, type(x).__name__))
    if not ok:
        raise TypeError("%s: dtype %s, expected int32 (four UE8M0 scale exponents per word)" % (name, x.dtype))
    shape = tuple(int(d) for d in x.shape)
    if len(shape) != 2:
        raise ValueError("%s: %d dims (shape %s), expected 2: [%d, %s]"
                         % (name, len(shape), shape, mn, "ceil(groups / 4)" if kp is None else kp))
    if kp is not None and shape != (mn, kp):
        raise ValueError("%s: shape %s, expected [%d, %d] (rows, ceil(groups per row / 4))" % (name, shape, mn, kp))
    L._writable(x, name)


def _ue8m0_words(s, kp):
    """int32 [mn, kp] of f32 scales s [mn, G]: word [r, j] holds the biased exponents
    (bits 23..30) of s[r, 4 j .. 4 j + 3] in bytes 0..3 (group 4 j in the low byte), the
    bytes past the last group 0."""
    mn, G = s.shape
    e = np.zeros((mn, 4 * kp), np.uint32)
    e[:, :G] = (s.view(np.uint32) >> np.uint32(23)) & np.uint32(0xFF)
    b = e.reshape(mn, kp, 4)
    w = b[..., 0] | (b[..., 1] << np.uint32(8)) | (b[..., 2] << np.uint32(16)) | (b[..., 3] << np.uint32(24))
    return w.view(np.int32)


def _group_quant_packed(input, ov, packed, g, eps, names):
    """The packed op's body: input's [mn, K] rows, UE8M0 scales into a temporary f32
    [mn, K / g] (C validates input, the out view and group_size and writes nothing on
    error), then their exponents into packed (checked beforehand). names: C's argument
    names -> the caller's, for C's messages; names["scales"] is packed's name."""
    shape = tuple(L.info(input, names.get("input", "input"))[2])
    if not shape:
        raise ValueError("%s: a 0-d input, expected [..., K]" % names.get("input", "input"))
    K, mn = int(shape[-1]), int(np.prod(shape[:-1], dtype=np.int64))
    ng = K // g if g >= 1 and K % g == 0 else None  # None: C refuses group_size
    kp = None if ng is None else (ng + 3) // 4
    _packed_scales_out(packed, mn, kp, names["scales"])
    tmp = np.empty((mn, ng or 0), np.float32)
    s = L.per_token_group_fp8_quant(ov, _view(input, "input"), _out(tmp, "scales"), g, eps, 1)
    if s:  # (the temporary scales are never the cause: names["scales"] is not C's "scales")
        _raise_as(s, {k: v for k, v in names.items() if k != "scales"})
    words = _ue8m0_words(tmp, kp)
    if L.is_torch(packed):
        import torch
        packed.copy_(torch.from_numpy(words))
    else:
        packed[...] = words


def _byte_extent(x):
    """[lo, hi) of the bytes a NumPy array's or a torch tensor's elements span (lo == hi:
    empty)."""
    if L.is_torch(x):
        p, es, st = x.data_ptr(), x.element_size(), [d * x.element_size() for d in x.stride()]
    else:
        p, es, st = x.__array_interface__["data"][0], x.itemsize, list(x.strides)
    shape = tuple(int(d) for d in x.shape)
    if 0 in shape:
        return p, p
    lo = hi = p
    for n, sb in zip(shape, st):
        (lo, hi) = (lo + (n - 1) * sb, hi) if sb < 0 else (lo, hi + (n - 1) * sb)
    return lo, hi + es


def _check_apart(out, oname, others):
    """LlmkernError LK_ERR_ALIAS naming out and the first of others (name, array) whose
    bytes out's span meets (spans: a conservative test, as no sane caller interleaves an
    int32 scale buffer with its codes)."""
    lo, hi = _byte_extent(out)
    for name, x in others:
        xl, xh = _byte_extent(x)
        if lo < hi and xl < xh and lo < xh and xl < hi:
            raise L.LlmkernError(7, "LK_ERR_ALIAS", "per_token_group_fp8_quant_packed: %s and %s overlap in memory"
                                 % (oname, name))


def per_token_group_fp8_quant_packed(input, output_q, output_s_packed, group_size, eps, fp8_min, fp8_max):
    """vLLM's custom op torch.ops._C.per_token_group_fp8_quant_packed (its C++
    per_token_group_quant_8bit_packed; DeepGEMM's UE8M0 activation scales), written in
    place. input [..., K] (f32 / f16 / bf16, any strides), K a multiple of group_size,
    mn = numel / K rows of G = K / group_size groups: the codes of
    per_token_group_fp8_quant(..., scale_ue8m0=True) (s = the smallest power of two >=
    max(max(absmax, eps) / fp8_max, 1e-10), output_q = fp8(input / s)) into output_q
    (float8_e4m3fn or a uint8 buffer taken as e4m3; or int8, as vLLM's kernel takes it:
    fp8_max 127, truncated toward zero), and for each row r the scales' 8-bit biased
    exponents (f32 bits 23..30) packed into output_s_packed, an int32 [mn, ceil(G / 4)]:
    word [r, j] holds groups 4 j .. 4 j + 3 in bytes 0..3 (group 4 j in the low byte), the
    bytes past the last group 0. output_s_packed may have any strides (vLLM allocates
    torch.empty_strided((mn, ceil(G / 4)), (1, ceil(mn / 4) * 4)): TMA-aligned columns);
    only the view's elements are written (the padding rows of such a buffer are left as
    they are). fp8_min / fp8_max must be output_q's own range (-448 / 448; int8 -128 /
    127), else ValueError; eps finite and >= fp8_max * FLT_MIN. Errors name the argument
    (output_s_packed not int32: TypeError; not 2-D or not [mn, ceil(G / 4)]: ValueError;
    group_size not dividing K: LlmkernError naming group_size; output_s_packed's bytes
    meeting input's or output_q's: LlmkernError LK_ERR_ALIAS); everything is checked
    before anything is written."""
    g = _group_size_arg(group_size)
    dt = _fp8_lk_dtype(output_q, "output_q")
    if dt not in (L.F8E4M3, L.I8):
        raise TypeError("output_q: dtype %s, expected float8_e4m3fn (or a uint8 buffer taken as e4m3) or int8, "
                        "the packed kernel's outputs" % (output_q.dtype,))
    ov = _fp8_out(output_q, "output_q")
    _q8_range(output_q, dt, fp8_min, fp8_max, "fp8_min, fp8_max")
    if isinstance(output_s_packed, np.ndarray) or L.is_torch(output_s_packed):  # (else a TypeError below)
        _check_apart(output_s_packed, "output_s_packed", (("input", input), ("output_q", output_q)))
    _group_quant_packed(input, ov, output_s_packed, g, _eps_arg(eps),
                        {"out": "output_q", "scales": "output_s_packed"})


def _reshaped(a, shape, name):
    """a viewed with `shape` (same elements, no copy) as torch's view_as; ValueError naming
    the argument where that needs a copy or the sizes differ."""
    if tuple(a.shape) == shape:
        return a
    try:
        if L.is_torch(a):
            return a.view(shape)
        try:
            return np.reshape(a, shape, copy=False)
        except TypeError:  # NumPy < 2.1: no copy argument
            v = a.view()
            v.shape = shape
            return v
    except (RuntimeError, ValueError, AttributeError):
        raise ValueError("%s: shape %s cannot be viewed as x's shape %s without a copy"
                         % (name, tuple(a.shape), shape)) from None


def per_token_group_quant_fp8_packed_for_deepgemm(x, group_size, eps=1e-10, use_ue8m0=None, out_q=None):
    """vLLM's per_token_group_quant_fp8_packed_for_deepgemm (fp8_utils): returns (x_q,
    x_s_packed), the results of per_token_group_fp8_quant_packed: x_q float8_e4m3fn of x's
    shape (out_q given: out_q, float8_e4m3fn or a uint8 buffer taken as e4m3, viewed as x's
    shape when it has x's elements in another shape, as vLLM's view_as), x_s_packed int32
    with shape [mn, ceil(G / 4)] (mn = x.numel() / K rows, G = K / group_size groups) and
    strides (1, tma_aligned_mn), tma_aligned_mn = mn rounded up to a multiple of 4, as vLLM
    allocates it (torch.empty_strided; NumPy: the transposed view of a [ceil(G / 4),
    tma_aligned_mn] buffer); the padding rows are zeros, never written. use_ue8m0: None ->
    True (vLLM asks DeepGEMM; this layout needs UE8M0 scales), False raises ValueError as
    vLLM's assert does. x: any strides. NumPy arrays or torch tensors, results of the same
    kind."""
    if use_ue8m0 is None:
        use_ue8m0 = True
    if not use_ue8m0:
        raise ValueError("use_ue8m0: %r; the DeepGEMM packed layout requires UE8M0 scales "
                         "(per_token_group_quant_fp8_packed_for_deepgemm)" % (use_ue8m0,))
    g = _group_size_arg(group_size)
    shape = tuple(int(d) for d in x.shape)
    if not shape:
        raise ValueError("x: a 0-d input, expected [..., K]")
    K, mn = shape[-1], int(np.prod(shape[:-1], dtype=np.int64))
    kp = (K // g + 3) // 4 if g >= 1 and K % g == 0 else 0  # else C refuses group_size
    tma = (mn + 3) // 4 * 4
    if out_q is None:
        out_q = _fp8_empty(x, shape, "float8_e4m3fn")
    elif not L._is_uint8(out_q) and L.info(out_q, "out_q")[1] != L.F8E4M3:
        raise TypeError("out_q: dtype %s, expected float8_e4m3fn (or a uint8 buffer taken as e4m3)" % (out_q.dtype,))
    x_q = _reshaped(out_q, shape, "out_q")
    if L.is_torch(x):
        import torch
        x_s = torch.empty_strided((mn, kp), (1, tma), dtype=torch.int32)
        x_s.untyped_storage().fill_(0)
    else:
        x_s = np.zeros((kp, tma), np.int32)[:, :mn].T
    _group_quant_packed(x, _fp8_out(x_q, "out_q"), x_s, g, _eps_arg(eps),
                        {"out": "out_q", "input": "x", "scales": "x_s_packed"})
    return x_q, x_s


# ---- per-token-group int8 quantization (vLLM's per_token_group_quant_int8: the custom op
# torch.ops._C.per_token_group_quant_int8 and the Python function of the same name in
# int8_utils; block-int8 activations): the per-token-group op with an int8 output


def _i8_output_q(output_q, name):
    """The out view of an int8 output (any other dtype: TypeError naming it; fp8 outputs
    belong to per_token_group_fp8_quant)."""
    dt = None if L._is_uint8(output_q) else L.info(output_q, name)[1]
    if dt != L.I8:
        raise TypeError("%s: dtype %s, expected int8 (per_token_group_quant_int8's codes; fp8 outputs: "
                        "per_token_group_fp8_quant)" % (name, getattr(output_q, "dtype", dt)))
    return _out(output_q, name)


def per_token_group_quant_int8_into(input, output_q, output_s, group_size, eps, int8_min, int8_max):
    """vLLM's custom op torch.ops._C.per_token_group_quant_int8(input, output_q, output_s,
    group_size, eps, int8_min, int8_max) (here _into: the Python function of vLLM's
    int8_utils has the op's name), written in place: per row r of input [..., D] (f32 /
    f16 / bf16, any strides) and group g (elements g * group_size .. + group_size - 1 of
    the last dim), in f32:
      output_s[r, g] = s = max(absmax(group), eps) / 127     (absmax ignoring NaN)
      output_q[r, i] = trunc(clamp(input[r, i] / s, -128, 127))
    toward zero, as vLLM's int8_t(q) cast of the clamped quotient (its CUDA and Triton
    kernels; 2.7 -> 2, -2.7 -> -2; not rounded as the other int8 quantizers), NaN -> 0
    (vLLM's fminf / fmaxf clamp gives -128 there); an inf element makes its group's scale
    inf (finite values -> 0, inf -> NaN -> 0). output_q: int8 of input's shape (any other
    dtype: TypeError); output_s: f32 [..., D / group_size] (input's leading dims) or
    [rows, D / group_size], any strides (a column-major scale: the transposed view of a
    [D / group_size, rows] buffer). int8_min / int8_max must be -128 / 127, output_q's own
    range: the C op quantizes to it and has no such parameters, any other pair raises
    ValueError. group_size an int >= 1 dividing D, eps finite and >= 127 * FLT_MIN (else
    LlmkernError naming group_size / eps). Everything is validated before any store."""
    g = _group_size_arg(group_size)
    ov = _i8_output_q(output_q, "output_q")
    _q8_range(output_q, L.I8, int8_min, int8_max, "int8_min, int8_max")
    s = L.per_token_group_fp8_quant(ov, _view(input, "input"), _out(output_s, "output_s"), g, _eps_arg(eps), 0)
    if s:
        _raise_as(s, {"out": "output_q", "scales": "output_s"})


def _int8_dtype(dtype):
    """vLLM's dtype argument of per_token_group_quant_int8: int8 only (torch.int8, np.int8
    or "int8"), else NotImplementedError naming dtype (vLLM: "only torch.int8 is supported
    for now"); None: int8."""
    if dtype is None:
        return
    name = str(dtype).replace("torch.", "")
    if name != "int8":
        try:
            name = np.dtype(dtype).name
        except TypeError:
            pass
    if name != "int8":
        raise NotImplementedError("dtype: %r, only int8 is supported (as vLLM's per_token_group_quant_int8)"
                                  % (dtype,))


def per_token_group_quant_int8(x, group_size, eps=1e-10, dtype=None):
    """vLLM's per_token_group_quant_int8 (int8_utils): returns (x_q, x_s), x_q int8 of x's
    shape (contiguous), x_s f32 x.shape[:-1] + (D // group_size,) (row-major), the values of
    per_token_group_quant_int8_into: s = max(absmax(group), eps) / 127, x_q =
    trunc(clamp(x / s, -128, 127)) toward zero, NaN -> 0. dtype: int8 (None, torch.int8,
    np.int8, "int8"; vLLM's default torch.int8), any other raises NotImplementedError.
    group_size must divide D: a last dim it does not divide raises LlmkernError naming
    group_size (as vLLM's version here asserts; no padding of a last group). x: any
    strides (vLLM asserts a contiguous x). NumPy arrays or torch tensors, results of the
    same kind."""
    g = _group_size_arg(group_size)
    _int8_dtype(dtype)
    shape = tuple(x.shape)
    D = shape[-1] if shape else 0
    ng = D // g if g >= 1 and D % g == 0 else 0  # else C refuses group_size before looking at x_s
    x_q = _like(x, shape, np.int8)
    x_s = _f32_like(x, shape[:-1] + (ng,))
    s = L.per_token_group_fp8_quant(_out(x_q, "x_q"), _view(x, "x"), _out(x_s, "x_s"), g, _eps_arg(eps), 0)
    if s:
        _raise_as(s, {"out": "x_q", "input": "x", "scales": "x_s"})
    return x_q, x_s


# ---- RMSNorm with per-block dynamic scales (vLLM's rms_norm_per_block_quant custom op and
# its _custom_ops wrapper of the same name: the norm before block-fp8 GEMMs, DeepSeek-V3's
# groups of 128): the per-token op's rules with a scale per (row, block of group_size columns)


def _block_scale_view(scale, input, group_size, is_scale_transposed, name="scale", gated=False):
    """The packed lk_tensor of the raw op's scale (argument `name`). is_scale_transposed
    set: a 2-D scale shaped [D / group_size, rows] (and not [rows, D / group_size]) is taken
    as its transposed view, any other shape as it is (the C op reads any strides). Not set:
    the last dim's stride must be 1 where it has more than one element and the scale is not
    empty (vLLM refuses an outer scale stride > 1 without the flag), else ValueError.
    gated: input is [..., 2 D] (gate || up; the silu ops), the blocks are of its half D."""
    if scale is None:
        return None  # C's LK_ERR_NULL
    L._writable(scale, name)
    p, dt, shape, st = L.info(scale, name)
    shape, st = tuple(int(d) for d in shape), tuple(int(s) for s in st)
    if is_scale_transposed:
        if len(shape) == 2 and group_size >= 1:
            xshape = tuple(int(d) for d in L.info(input, "input")[2])
            D = xshape[-1] if xshape else -1
            if gated:  # an odd last dim: C refuses input
                D = D // 2 if D >= 0 and D % 2 == 0 else -1
            if D >= 0 and D % group_size == 0:
                rows, ng = int(np.prod(xshape[:-1], dtype=np.int64)), D // group_size
                if shape == (ng, rows) and shape != (rows, ng):
                    shape, st = shape[::-1], st[::-1]
    elif len(shape) >= 1 and shape[-1] > 1 and st[-1] != 1 and 0 not in shape:  # empty: no layout
        raise ValueError("%s: shape %s with strides %s: the last dim's stride is not 1; column-major "
                         "(transposed) scales need is_scale_transposed=True, as in vLLM"
                         % (name, list(shape), list(st)))
    return L.pack(p, dt, shape, st, name)


def rms_norm_per_block_quant_into(result, input, weight, scale, epsilon, scale_ub, residual, group_size,
                                  is_scale_transposed=False):
    """The raw custom op (torch.ops._C.rms_norm_per_block_quant), written in place: with
    residual, residual = round(input + residual) (in place, its dtype) and the norm is over
    it; y = RMSNorm(.) * weight in f32 (weight None: no weight), then per row r and block g
    (columns g * group_size .. + group_size - 1):
      scale[r, g] = max(min(absmax(y[r, block g]), scale_ub) / fp8_max, 1 / (fp8_max * 512))
      result = fp8(y / scale[r, g])
    int8 result: scale = max(min(absmax, scale_ub) / 127, FLT_EPSILON), result =
    i8(y * (1 / scale)) (round to nearest even, saturated; vLLM refuses scale_ub with int8,
    here it bounds the absmax as for fp8). result: float8_e4m3fn / float8_e5m2 (torch,
    ml_dtypes), a uint8 buffer taken as e4m3, or int8; input [..., D]; group_size >= 1
    dividing D (vLLM's kernels take 64 and 128 only; LlmkernError naming group_size
    otherwise); scale_ub None or one f32 element (a number too).
    scale: f32, logically [rows, D / group_size] (rows = numel / D), or input's leading
    dims then D / group_size, any strides: vLLM's column-major scales
    (is_scale_transposed: the transposed view of a [D / group_size, rows] buffer, outer
    stride > 1) and row-major ones. is_scale_transposed is a hint, the strides decide:
    with it, either layout is accepted, and a [D / group_size, rows] buffer itself (not
    its transposed view; not when rows == D / group_size, which is taken as
    [rows, D / group_size]) is taken as the transposed view; without it, a scale whose
    last dim has a stride other than 1 (and more than one element) raises ValueError, as
    vLLM refuses it, so that a call accepted here means the same in vLLM. Scale shape /
    dtype errors are the C op's (LlmkernError naming scale)."""
    g = _group_size_arg(group_size)
    sv = _block_scale_view(scale, input, g, is_scale_transposed)
    if scale_ub is not None:
        scale_ub = _scale_in(scale_ub, "scale_ub")
    s = L.rms_norm_per_block_quant(_fp8_out(result, "result"), _view(input, "input"), _view(weight, "weight"), sv,
                                   epsilon, _view(scale_ub, "scale_ub"),
                                   None if residual is None else _out(residual, "residual"), g)
    if s:
        _raise_as(s, {"out": "result", "scales": "scale"})


def _block_group_size(group_size):
    """vLLM's group_size of the wrapper: a block shape [1, G] (one row, G columns); G."""
    try:
        gs = tuple(group_size)
    except TypeError:
        gs = None
    if gs is None or len(gs) != 2 or not all(_is_int(g) for g in gs):
        raise TypeError("group_size: %r, expected a block shape [1, group_size] (two ints, as vLLM's "
                        "group_shape)" % (group_size,))
    if gs[0] != 1:
        raise ValueError("group_size: %r; the blocks are parts of one row, expected [1, group_size]"
                         % (group_size,))
    return _group_size_arg(gs[1])


def rms_norm_per_block_quant(input, weight, epsilon, quant_dtype, group_size, scale_ub=None, residual=None,
                             is_scale_transposed=False, tma_alignment=0):
    """vLLM's rms_norm_per_block_quant (_custom_ops): returns (out, scales), out of input's
    shape and quant_dtype (float8_e4m3fn / float8_e5m2 / int8, torch's or ml_dtypes' / NumPy's
    types or their names), scales f32 [rows, D / G] (rows = numel / D; any input rank), as
    vLLM allocates them: row-major, or with is_scale_transposed the transposed view of a
    [D / G, rows] buffer (strides (1, rows)); with is_scale_transposed and tma_alignment 4
    (DeepGEMM's TMA-aligned scales; input of 2 dims or more, m = input.shape[-2]) scales
    input.shape[:-2] + (m, D / G), each [m, D / G] matrix column-major with its columns
    padded to m rounded up to a multiple of 4 (vLLM's strides (1, m4), or (m4 D / G, 1, m4)
    for 3-D input). tma_alignment 0 or 4 (else ValueError, as vLLM's assert), ignored
    without is_scale_transposed. group_size: vLLM's block shape [1, G] (a sequence of two
    ints, the first 1, else TypeError / ValueError). Values as the raw op
    rms_norm_per_block_quant_into (residual updated in place). NumPy arrays or torch
    tensors, results of the same kind."""
    if isinstance(tma_alignment, bool) or tma_alignment not in (0, 4):
        raise ValueError("tma_alignment: %r, expected 0 or 4 (as vLLM's)" % (tma_alignment,))
    g = _block_group_size(group_size)
    shape = tuple(input.shape)
    D = shape[-1] if shape else 0
    rows = int(np.prod(shape[:-1], dtype=np.int64)) if shape else 1
    ng = D // g if g >= 1 and D % g == 0 else 0  # else C refuses group_size before looking at the scales
    out = _fp8_like(input, shape, _quant_dtype(input, quant_dtype))
    if is_scale_transposed and tma_alignment and len(shape) >= 2:
        m = shape[-2]
        m4 = (m + tma_alignment - 1) // tma_alignment * tma_alignment
        lead = shape[:-2]
        nb = int(np.prod(lead, dtype=np.int64))
        st, acc = [], m4 * ng  # elements: each [m, ng] matrix m4 * ng apart, lead dims row-major
        for d in reversed(lead):
            st.insert(0, acc)
            acc *= d
        size, stride = lead + (m, ng), tuple(st) + (1, m4)
        buf = _f32_like(input, (max(nb * m4 * ng, 1),))
        if L.is_torch(input):
            scales = buf.as_strided(size, stride)
        else:
            scales = np.lib.stride_tricks.as_strided(buf, size, tuple(4 * e for e in stride))
    elif is_scale_transposed:
        buf = _f32_like(input, (ng, rows))
        scales = buf.transpose(0, 1) if L.is_torch(input) else buf.T
    else:
        scales = _f32_like(input, (rows, ng))
    rms_norm_per_block_quant_into(out, input, weight, scales, epsilon, scale_ub, residual, g, is_scale_transposed)
    return out, scales


# ---- SiLU-and-mul then quantization (vLLM's silu_and_mul_quant: a static per-tensor fp8
# scale, and silu_and_mul_per_block_quant with its _custom_ops wrapper of the same name:
# dynamic fp8 / int8 scales per block of group_size columns, the activation in front of
# block-fp8 / int8 GEMMs). input [..., 2 d] = gate || up, out [..., d]; per element, in f32,
# y = silu(gate) * up, silu(g) = g / (1 + exp(-g)) (the same bits on every ISA).


def silu_and_mul_quant(out, input, scale):
    """The raw custom op (torch.ops._C.silu_and_mul_quant(result, input, scale)), written in
    place: out[..., d] = fp8(y / scale), y = silu(input[..., :d]) * input[..., d:] in f32
    (round to nearest even, saturated, NaN kept). out: float8_e4m3fn / float8_e5m2 (torch,
    ml_dtypes) or a uint8 buffer taken as e4m3 (vLLM's out is e4m3); input f32 / f16 / bf16
    [..., 2 d], any strides (vLLM: f16 / bf16, contiguous); scale the static per-tensor
    scale: a number, or one f32 element ([1], [], [1, 1]), finite and > 0 (LlmkernError
    naming scale). Differs from vLLM's CUDA kernel, which rounds silu(g) and the product to
    the input dtype and multiplies by 1 / scale: here y stays f32 and is divided by scale
    (include/llmkern.h)."""
    scale = _scale_in(scale, "scale")  # kept alive through the call
    s = L.silu_and_mul_quant(_fp8_out(out, "out"), _view(input, "input"), _view(scale, "scale"))
    if s:
        _raise(s)


def silu_and_mul_per_block_quant_into(out, input, scales, group_size, scale_ub=None, is_scale_transposed=False):
    """The raw custom op (torch.ops._C.silu_and_mul_per_block_quant(out, input, scales,
    group_size, scale_ub, is_scale_transposed)), written in place: y = silu(input[..., :d])
    * input[..., d:] in f32, then per row r and block g (columns g * group_size .. +
    group_size - 1 of out):
      scales[r, g] = max(min(absmax(y[r, block g]) / qmax, scale_ub), min_scale)
      out = fp8(y / scales[r, g])    qmax = fp8_max, min_scale = 1 / (fp8_max * 512)
      out = i8(y / scales[r, g])     int8 out: qmax = 127, min_scale = FLT_EPSILON (round to
                                     nearest even, saturated to [-128, 127], NaN -> 0)
    (scale_ub bounds the scale, as in vLLM's silu kernel; the RMSNorm ops bound the absmax).
    out: float8_e4m3fn / float8_e5m2 (torch, ml_dtypes), a uint8 buffer taken as e4m3, or
    int8, [..., d]; input f32 / f16 / bf16 [..., 2 d], any strides; group_size an int >= 1
    dividing d (vLLM: 64 or 128; LlmkernError naming group_size otherwise); scale_ub None,
    a number or one f32 element, finite and > 0 (vLLM takes it with an fp8 out only; here
    with int8 too). scales: f32, logically [rows, d / group_size] (rows = numel / (2 d)),
    or input's leading dims then d / group_size, any strides; is_scale_transposed as in
    rms_norm_per_block_quant_into: with it, vLLM's transposed view of a [d / group_size,
    rows] buffer, a row-major scale (the strides decide), or that [d / group_size, rows]
    buffer itself (taken as its transposed view; not when rows == d / group_size); without
    it, a scale whose last dim has a stride other than 1 (and more than one element) raises
    ValueError, as vLLM would write it row-major. Validated before any store."""
    g = _group_size_arg(group_size)
    sv = _block_scale_view(scales, input, g, is_scale_transposed, "scales", gated=True)
    if scale_ub is not None:
        scale_ub = _scale_in(scale_ub, "scale_ub")  # kept alive through the call
    s = L.silu_and_mul_per_block_quant(_fp8_out(out, "out"), _view(input, "input"), sv, _view(scale_ub, "scale_ub"),
                                       g)
    if s:
        _raise(s)


def silu_and_mul_per_block_quant(input, group_size, quant_dtype, scale_ub=None, is_scale_transposed=False):
    """vLLM's silu_and_mul_per_block_quant (_custom_ops): returns (out, scales), out
    [..., d] of quant_dtype (float8_e4m3fn / float8_e5m2 / int8, torch's or ml_dtypes' /
    NumPy's types or their names) for input [..., 2 d] (gate || up; vLLM: 2-D [num_tokens,
    2 d], here any rank), scales f32 [rows, d / group_size] (rows = numel / (2 d)) as vLLM
    allocates them: row-major, or with is_scale_transposed the transposed view of a
    [d / group_size, rows] buffer (strides (1, rows)). group_size: an int (vLLM's wrapper
    takes an int here, not the [1, G] block shape of rms_norm_per_block_quant). Values as
    the raw op silu_and_mul_per_block_quant_into. NumPy arrays or torch tensors, results of
    the same kind."""
    g = _group_size_arg(group_size)
    shape = tuple(input.shape)
    d = shape[-1] // 2 if shape else 0  # an odd last dim: C refuses input before looking at out
    rows = int(np.prod(shape[:-1], dtype=np.int64)) if shape else 1
    ng = d // g if g >= 1 and d % g == 0 else 0  # else C refuses group_size before looking at the scales
    out = _fp8_like(input, shape[:-1] + (d,) if shape else (), _quant_dtype(input, quant_dtype))
    if is_scale_transposed:
        buf = _f32_like(input, (ng, rows))
        scales = buf.transpose(0, 1) if L.is_torch(input) else buf.T
    else:
        scales = _f32_like(input, (rows, ng))
    silu_and_mul_per_block_quant_into(out, input, scales, g, scale_ub, is_scale_transposed)
    return out, scales


# ---------------------------------------------------------------- int8 activations
# vLLM's static_scaled_int8_quant / dynamic_scaled_int8_quant (written in place) and the
# scaled_int8_quant wrapper that allocates (out int8, scale, azp) as vLLM's does.


def _azp_in(azp):
    """A static zero point: an int becomes a one-element int32 array (validated in C)."""
    if isinstance(azp, (int, np.integer)) and not isinstance(azp, bool):
        return np.array([azp], dtype=np.int32)
    return azp


def static_scaled_int8_quant(out, input, scale, azp=None):
    """out = sat8(round(input / scale)) (symmetric), or with azp (int32, one element)
    sat8(sat32(round(input * (1 / scale))) + azp); round to nearest even, NaN -> 0."""
    scale, azp = _scale_in(scale, "scale"), _azp_in(azp)  # kept alive through the call
    s = L.static_scaled_int8_quant(_out(out, "out"), _view(input, "input"), _view(scale, "scale"), _view(azp, "azp"))
    if s:
        _raise(s)


def dynamic_scaled_int8_quant(out, input, scales, azp=None):
    """Per row r, symmetric (azp None): scales[r] = absmax / 127, out = sat8(round(input *
    (127 / absmax))) (0 where absmax is 0); asymmetric: s = (max - min) / 255 = scales[r],
    azp[r] = round(-128 - min / s), out = sat8(round(input * (1 / s)) + azp[r]) (a row with
    s = 0: scale 0, azp 0, codes 0). scales [rows] or [rows, 1] f32, azp the same in int32."""
    s = L.dynamic_scaled_int8_quant(_out(out, "out"), _view(input, "input"), _out(scales, "scales"),
                                    None if azp is None else _out(azp, "azp"))
    if s:
        _raise(s)


def _like(x, shape, dtype):
    """A new contiguous array / tensor beside x; dtype a NumPy dtype (torch: the same name)."""
    if L.is_torch(x):
        import torch
        return torch.empty(shape, dtype=getattr(torch, np.dtype(dtype).name))
    return np.empty(shape, dtype=dtype)


def scaled_int8_quant(input, scale=None, azp=None, symmetric=True):
    """vLLM's scaled_int8_quant: returns (out int8, scale, azp). scale given: static
    per-tensor (azp must be given exactly when not symmetric; scale and azp are returned as
    passed); else dynamic per token: scales [rows, 1] float32 and, when not symmetric, azp
    [rows, 1] int32 (None when symmetric). out has input's shape."""
    out = _like(input, tuple(input.shape), np.int8)
    if scale is not None:
        if symmetric != (azp is None):
            raise ValueError("azp: must be given exactly for asymmetric static quantization (symmetric=%r, azp %s)"
                             % (symmetric, "None" if azp is None else "given"))
        static_scaled_int8_quant(out, input, scale, azp)
        return out, scale, azp
    n = int(np.prod(input.shape[:-1])) if len(input.shape) else 1
    scales = _like(input, (n, 1), np.float32)
    azps = None if symmetric else _like(input, (n, 1), np.int32)
    dynamic_scaled_int8_quant(out, input, scales, azps)
    return out, scales, azps


# ---------------------------------------------------------------- KV cache


def _check_auto(kv_cache_dtype):
    if kv_cache_dtype != "auto":
        raise NotImplementedError("kv_cache_dtype=%r: expected 'auto', 'fp8', 'fp8_e4m3' or 'fp8_e5m2'"
                                  % (kv_cache_dtype,))


def _check_scale(scale, name, heads=None):
    """With kv_cache_dtype 'auto' the cache holds values as they are and vLLM ignores the
    scales; they must still be a scale vLLM could pass: None, a number, or a float tensor of
    one element or (per head, reshape_and_cache_flash) [H]."""
    if scale is None or _is_number(scale):
        return
    shape = tuple(getattr(scale, "shape", ()))
    n = int(np.prod(shape)) if shape else 1
    if n == 1 or (heads is not None and shape == (heads,)):
        return
    want = "one element" + (" or [%d] (per head)" % heads if heads is not None else "")
    raise ValueError("%s: shape %s, expected %s" % (name, shape, want))


def _layout(layout):
    try:
        return L.LAYOUTS[layout]
    except (KeyError, TypeError):
        raise ValueError("layout: %r, expected 'ND' or 'NZ'" % (layout,)) from None


_FP8_KV = {"fp8": L.F8E4M3, "fp8_e4m3": L.F8E4M3, "fp8_e5m2": L.F8E5M2}

# ---- fp8_ds_mla: FlashMLA's "FP8 with scale" MLA latent cache (DeepSeek-V3.2; vLLM's
# kv_cache_dtype "fp8_ds_mla"). One record of E = Dl + Dl / 32 + 2 Dr bytes per token
# (656 for DeepSeek's 512 + 64): Dl e4m3 codes, Dl / 128 f32 tile scales (host byte
# order), Dr bf16 rope values; entry value f32(code) * scale of its 128-dim tile, rope as
# it is. The cache is a 1-byte buffer [num_blocks, block_size, E] (or [.., 1, E]): vLLM's
# uint8, or a float8_e4m3fn / int8 array or tensor. C layout LK_KV_DS_MLA.

_DS_MLA = 2  # lk_kv_layout LK_KV_DS_MLA
_DS_NAME = "fp8_ds_mla"


def _ds_record_bytes(dl, dr):
    """E = Dl + Dl / 32 + 2 Dr: the bytes of one fp8_ds_mla record."""
    return dl + dl // 32 + 2 * dr


def _is_ds_bytes(x):
    """A 1-byte buffer an fp8_ds_mla cache may be: uint8, int8 or float8_e4m3fn."""
    if x is None:
        return False
    if L._is_uint8(x):
        return True
    name = str(getattr(x, "dtype", ""))
    return "float8_e4m3fn" in name or name in ("int8", "torch.int8")


def _ds_view(x, name, write=False):
    """The packed view of an fp8_ds_mla record cache: a uint8 buffer (as vLLM allocates
    it) viewed as e4m3 bytes, a float8_e4m3fn or int8 array / tensor as it is; any other
    dtype is a TypeError naming it. C checks the shape, strides and alignment."""
    if x is None:
        raise ValueError("%s: required with kv_cache_dtype 'fp8_ds_mla'" % name)
    if write:
        L._writable(x, name)
    if L._is_uint8(x):
        return L.fp8_view(x, name, L.F8E4M3)
    if not _is_ds_bytes(x):
        raise TypeError("%s: dtype %s with kv_cache_dtype 'fp8_ds_mla': expected a 1-byte record buffer "
                        "(uint8, float8_e4m3fn or int8)" % (name, getattr(x, "dtype", type(x).__name__)))
    return _view(x, name)


def _ds_nd_only(layout, name="layout"):
    if layout != "ND":
        raise ValueError("%s: %r with kv_cache_dtype 'fp8_ds_mla': the record cache has one layout, 'ND' "
                         "([num_blocks, block_size, E] or [num_blocks, block_size, 1, E])" % (name, layout))


def _scale_arg(scale, name, required=True, scalar=False):
    """A scale argument, for both kinds of operators:
    scalar=False (the C parameter is an lk_tensor): (keep-alive object, packed f32 view); a
    Python number becomes a 0-d f32 array, arrays / tensors ([], [1], per head [H]) go to C
    as they are, which checks their dtype (f32), shape and values (finite, > 0);
    scalar=True (the C parameter is one f32: MLA prefill and decode): the value as a float,
    from a number or a one-element array / tensor, finite and > 0 (ValueError naming it).
    NumPy scalars count as numbers (taken by value).
    None: an error when required, else NULL ((None, None); scalar: 1.0)."""
    if scale is None:
        if required:
            raise ValueError("%s: required with an fp8 kv_cache_dtype" % name)
        return 1.0 if scalar else (None, None)
    if _is_number(scale):
        if scalar:
            return _finite_positive(float(scale), name)
        scale = np.array(scale, np.float32)
    if not scalar:
        return scale, _view(scale, name)
    shape = tuple(getattr(scale, "shape", ()))
    if int(np.prod(shape)) != 1:
        raise ValueError("%s: shape %s, expected one element (a per-tensor scale)" % (name, shape))
    return _finite_positive(float(scale.reshape(-1)[0]), name)


def _finite_positive(v, name):
    if not (math.isfinite(v) and v > 0):
        raise ValueError("%s: value %g must be finite and > 0" % (name, v))
    return v


_CACHE_NAMES = {"k": "key", "v": "value", "k_cache": "key_cache", "v_cache": "value_cache"}  # C -> vLLM


def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
                            k_scale=None, v_scale=None, layout="ND"):
    """key, value [T, H, D] -> key_cache, value_cache [num_blocks, block_size, H, D] at
    slot_mapping [N <= T] (slot < 0 skipped). kv_cache_dtype 'auto': the cache is in
    its own dtype and k_scale / v_scale (scalars or per-head [H]) are ignored, as in vLLM.
    'fp8' / 'fp8_e4m3' / 'fp8_e5m2': the caches are uint8 buffers (as vLLM allocates
    them) or float8_e4m3fn / float8_e5m2 arrays, each element stored as
    fp8(x / scale) with k_scale / v_scale per tensor (numbers, [] or [1] f32) or per head
    ([H] f32), saturated to the finite range. layout 'NZ' (fp8 caches, and 'auto' as
    well): physical [num_blocks, H*D/32, block_size, 32] for fp8 (16 wide otherwise)."""
    if kv_cache_dtype in _FP8_KV or layout != "ND":
        if kv_cache_dtype in _FP8_KV:
            dt = _FP8_KV[kv_cache_dtype]
            ks, ksv = _scale_arg(k_scale, "k_scale")
            vs, vsv = _scale_arg(v_scale, "v_scale")
            kc, vc = L.fp8_out_view(key_cache, "key_cache", dt), L.fp8_out_view(value_cache, "value_cache", dt)
        elif kv_cache_dtype == "auto":
            heads = key.shape[1] if len(key.shape) == 3 else None
            _check_scale(k_scale, "k_scale", heads)
            _check_scale(v_scale, "v_scale", heads)
            ksv = vsv = None
            kc, vc = _out(key_cache, "key_cache"), _out(value_cache, "value_cache")
        else:
            raise NotImplementedError("kv_cache_dtype=%r: expected 'auto', 'fp8', 'fp8_e4m3' or 'fp8_e5m2'"
                                      % (kv_cache_dtype,))
        s = L.reshape_and_cache_flash_fp8(_view(key, "key"), _view(value, "value"), kc, vc,
                                          _view(slot_mapping, "slot_mapping"), ksv, vsv, _layout(layout))
        if s:
            _raise_as(s, _CACHE_NAMES)
        return
    if kv_cache_dtype != "auto":
        raise NotImplementedError("kv_cache_dtype=%r: expected 'auto', 'fp8', 'fp8_e4m3' or 'fp8_e5m2'"
                                  % (kv_cache_dtype,))
    heads = key.shape[1] if len(key.shape) == 3 else None
    _check_scale(k_scale, "k_scale", heads)
    _check_scale(v_scale, "v_scale", heads)
    s = L.reshape_and_cache_flash(_view(key, "key"), _view(value, "value"),
                                  _out(key_cache, "key_cache"), _out(value_cache, "value_cache"),
                                  _view(slot_mapping, "slot_mapping"))
    if s:
        _raise_as(s, _CACHE_NAMES)


def concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale=None,
                         layout="ND", k_pe_cache=None):
    """MLA latent cache write: kv_c [T, Dl] and k_pe [T, Dr] -> kv_cache, one buffer
    ND [num_blocks, block_size, Dl + Dr] or NZ physical [num_blocks, (Dl + Dr)/16,
    block_size, 16]. With k_pe_cache given, kv_cache holds only the latent part.
    kv_cache_dtype 'fp8' / 'fp8_e4m3' / 'fp8_e5m2': uint8 or float8 caches (NZ tile 32
    wide), each element fp8(x / scale), scale a number or an f32 [] / [1] tensor.
    kv_cache_dtype 'fp8_ds_mla' (DeepSeek-V3.2, FlashMLA's "FP8 with scale"): kv_cache is
    a 1-byte buffer (uint8 as vLLM allocates it, or float8_e4m3fn / int8) [num_blocks,
    block_size, E] or [.., 1, E], E = Dl + Dl / 32 + 2 Dr bytes (656 for 512 + 64, Dl a
    multiple of 128), each token one record: per 128-dim tile g of kv_c the f32 scale
    s_g = max(absmax / 448, FLT_MIN) and the codes e4m3(kv_c / s_g), then the Dl / 128
    scales, then k_pe as bf16. layout must be 'ND', k_pe_cache None; scale is not used
    (vLLM passes k_scale and ignores it: None, a number or a one-element tensor)."""
    if kv_cache_dtype == _DS_NAME:
        _ds_nd_only(layout)
        if k_pe_cache is not None:
            raise ValueError("k_pe_cache: must be None with kv_cache_dtype 'fp8_ds_mla' (k_pe is part of each "
                             "record of kv_cache)")
        _check_scale(scale, "scale")
        s = L.concat_and_cache_mla_fp8(_view(kv_c, "kv_c"), _view(k_pe, "k_pe"), _ds_view(kv_cache, "kv_cache", True),
                                       None, _view(slot_mapping, "slot_mapping"), _DS_MLA, None)
        if s:
            _raise_as(s, {"kv_c_cache": "kv_cache"})
        return
    if kv_cache_dtype in _FP8_KV:
        dt = _FP8_KV[kv_cache_dtype]
        keep, sv = _scale_arg(scale, "scale")
        kpc = None if k_pe_cache is None else L.fp8_out_view(k_pe_cache, "k_pe_cache", dt)
        s = L.concat_and_cache_mla_fp8(_view(kv_c, "kv_c"), _view(k_pe, "k_pe"),
                                       L.fp8_out_view(kv_cache, "kv_cache", dt), kpc,
                                       _view(slot_mapping, "slot_mapping"), _layout(layout), sv)
        if s:
            _raise_as(s, {"kv_c_cache": "kv_cache"})
        return
    _check_auto(kv_cache_dtype)
    _check_scale(scale, "scale")
    s = L.concat_and_cache_mla(_view(kv_c, "kv_c"), _view(k_pe, "k_pe"), _out(kv_cache, "kv_cache"),
                               _out(k_pe_cache, "k_pe_cache"), _view(slot_mapping, "slot_mapping"),
                               _layout(layout))
    if s:
        _raise_as(s, {"kv_c_cache": "kv_cache"})


# C -> vLLM's Python names (vllm._custom_ops.concat_and_cache_mla_rope_fused)
_MLA_ROPE_NAMES = {"kv_c_cache": "kv_cache", "cos_sin_cache": "rope_cos_sin_cache",
                   "slot_mapping": "kv_cache_slot_mapping", "scale": "kv_cache_quant_scale"}


def concat_and_cache_mla_rope_fused(positions, q_pe, k_pe, kv_c, rope_cos_sin_cache, rope_is_neox,
                                    kv_cache_slot_mapping, kv_cache, kv_cache_dtype, kv_cache_quant_scale=None,
                                    layout="ND", k_pe_cache=None):
    """vLLM's fused rotary + MLA latent cache write, in place: q_pe [T, Hq, Dr] and k_pe
    [T, Dr] are rotated at positions [P >= T] (int32/int64, the first T used) with
    rope_cos_sin_cache [max_pos, rot] = [cos | sin] (rope_is_neox: NeoX or GPT-J pairs;
    every token's q_pe and k_pe, a padding token's too), then kv_c [T, Dl] and the rotated
    k_pe are written to kv_cache at kv_cache_slot_mapping [N <= T] (slot < 0 skipped) as
    concat_and_cache_mla writes them: ND [num_blocks, block_size, Dl + Dr] or NZ physical
    [num_blocks, (Dl + Dr)/16, block_size, 16]; with k_pe_cache given, kv_cache holds only
    the latent part. kv_cache_dtype 'auto': the cache in its own dtype (f32/f16/bf16),
    kv_cache_quant_scale ignored (None, a number or a one-element tensor); 'fp8' /
    'fp8_e4m3' / 'fp8_e5m2': uint8 or float8 caches (NZ tile 32 wide), each element
    fp8(x / scale), kv_cache_quant_scale a number or an f32 [] / [1] tensor. Every check is
    made before anything is written: an error leaves q_pe, k_pe and the caches untouched."""
    if kv_cache_dtype in _FP8_KV:
        dt = _FP8_KV[kv_cache_dtype]
        keep, sv = _scale_arg(kv_cache_quant_scale, "kv_cache_quant_scale")
        kvc = L.fp8_out_view(kv_cache, "kv_cache", dt)
        kpc = None if k_pe_cache is None else L.fp8_out_view(k_pe_cache, "k_pe_cache", dt)
    else:
        _check_auto(kv_cache_dtype)
        _check_scale(kv_cache_quant_scale, "kv_cache_quant_scale")
        for c, name in ((kv_cache, "kv_cache"), (k_pe_cache, "k_pe_cache")):
            if _fp8_code(c) is not None:  # as concat_and_cache_mla's C check: 'auto' caches are f32/f16/bf16
                raise LlmkernError(4, "LK_ERR_DTYPE", "lk_concat_and_cache_mla_rope: %s: dtype %s with "
                                   "kv_cache_dtype 'auto' not supported (f32, f16, bf16; an fp8 cache needs "
                                   "kv_cache_dtype 'fp8' / 'fp8_e4m3' / 'fp8_e5m2')" % (name, c.dtype))
        keep = sv = None
        kvc, kpc = _out(kv_cache, "kv_cache"), _out(k_pe_cache, "k_pe_cache")
    s = L.concat_and_cache_mla_rope(_view(positions, "positions"), _out(q_pe, "q_pe"), _out(k_pe, "k_pe"),
                                    _view(kv_c, "kv_c"), _view(rope_cos_sin_cache, "rope_cos_sin_cache"),
                                    1 if rope_is_neox else 0, kvc, kpc,
                                    _view(kv_cache_slot_mapping, "kv_cache_slot_mapping"), _layout(layout), sv)
    del keep  # the scale's buffer lived through the call
    if s:
        _raise_as(s, _MLA_ROPE_NAMES)


def _to_numpy(x, name="cu_seq_lens"):
    if L.is_torch(x):
        L.info(x, name)  # device / dtype check
        return x.numpy()
    return np.asarray(x)


def gather_cache(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts=None,
                 layout="ND"):
    """vLLM's gather_cache: request b's first cu_seq_lens[b+1] - cu_seq_lens[b] tokens,
    read through block_table[b], go to dst[cu_seq_lens[b]:cu_seq_lens[b+1]]. seq_starts
    [batch_size] int32 (optional): token j of request b is read at position
    seq_starts[b] + j of its block table (vLLM's chunked-context gather)."""
    cp_gather_cache(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts, layout)


def _gather(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts, layout, kv_cache_dtype, scale):
    cu = _to_numpy(cu_seq_lens)
    nreq = min(len(cu) - 1, len(block_table)) if len(cu.shape) == 1 and len(block_table.shape) == 2 else 0
    if not _is_int(batch_size) or not 0 <= batch_size <= nreq:
        raise ValueError("batch_size: %r, expected an int in [0, %d] (cu_seq_lens has %d entries, block_table "
                         "%d rows)" % (batch_size, nreq, len(cu), len(block_table)))
    batch_size = int(batch_size)
    cu = cu[:batch_size + 1]
    seq_lens = np.ascontiguousarray(np.diff(cu), dtype=np.int32)
    if (seq_lens < 0).any():
        i = int(np.argmax(seq_lens < 0))
        raise ValueError("cu_seq_lens: cu_seq_lens[%d] = %d < cu_seq_lens[%d] = %d (must not decrease)"
                         % (i + 1, int(cu[i + 1]), i, int(cu[i])))
    first, last = (int(cu[0]), int(cu[-1])) if len(cu) else (0, 0)
    out = dst[first:last]
    # seq_starts [B] int32 (vLLM's dtype; others are rejected by C naming it)
    ssv = None if seq_starts is None else _view(seq_starts[:batch_size], "seq_starts")
    lay = _DS_MLA if kv_cache_dtype == _DS_NAME else None
    if lay is not None:  # fp8_ds_mla records: the scales are in the records
        _ds_nd_only(layout)
        _check_scale(scale, "scale")
        sv, ov, cv = None, _out(out, "dst"), _ds_view(src_cache, "src_cache")
    elif kv_cache_dtype in _FP8_KV:
        dt = _FP8_KV[kv_cache_dtype]
        keep, sv = _scale_arg(scale, "scale", required=False)
        ov = L.fp8_out_view(out, "dst", dt) if L.is_fp8_buffer(out) else _out(out, "dst")
        cv = L.fp8_view(src_cache, "src_cache", dt)
    elif kv_cache_dtype == "auto":
        _check_scale(scale, "scale")
        sv, ov, cv = None, _out(out, "dst"), _view(src_cache, "src_cache")
    else:
        raise NotImplementedError("kv_cache_dtype=%r: expected 'auto', 'fp8', 'fp8_e4m3', 'fp8_e5m2' or "
                                  "'fp8_ds_mla'" % (kv_cache_dtype,))
    if lay is None:
        lay = _layout(layout)
    bt, sl = _view(block_table[:batch_size], "block_table"), _view(seq_lens, "seq_lens")
    if ssv is not None:
        s = L.gather_cache_starts(ov, cv, bt, sl, ssv, lay, sv)
    elif kv_cache_dtype in _FP8_KV or kv_cache_dtype == _DS_NAME:
        s = L.gather_cache_fp8(ov, cv, bt, sl, lay, sv)
    else:
        s = L.gather_cache(ov, cv, bt, sl, lay)
    if s:
        _raise_as(s, {"out": "dst", "cache": "src_cache"})


def gather_and_maybe_dequant_cache(src_cache, dst, block_table, cu_seq_lens, batch_size, kv_cache_dtype,
                                   scale, seq_starts=None, *rest, layout="ND"):
    """vLLM's gather_and_maybe_dequant_cache: request b's tokens (cu_seq_lens[b + 1] -
    cu_seq_lens[b] of them, read through block_table[b]) go to dst[cu_seq_lens[b]:
    cu_seq_lens[b + 1]], dequantized as f32(q) * scale with an fp8 kv_cache_dtype (src_cache
    uint8 or float8, scale [] / [1] f32 or a number). Both of vLLM's signatures:
    (..., cu_seq_lens, batch_size, kv_cache_dtype, scale, seq_starts) and
    (..., cu_seq_lens, token_to_seq, num_tokens, kv_cache_dtype, scale, seq_starts).
    kv_cache_dtype 'fp8_ds_mla' (an llmkern extension; vLLM gathers these caches with
    cp_gather_and_upconvert_fp8_kv_cache): src_cache holds fp8_ds_mla records (see
    concat_and_cache_mla), dst [tokens, Dl + Dr] f32/f16/bf16 gets each entry's values
    (f32(code) * its tile's scale, the rope dims as stored) rounded once to dst's dtype;
    scale is not used; seq_starts as for the other dtypes; layout 'ND' only."""
    if not isinstance(batch_size, (int, np.integer)):  # token_to_seq, num_tokens, ...
        batch_size, kv_cache_dtype, scale, seq_starts = (len(_to_numpy(cu_seq_lens)) - 1, scale, seq_starts,
                                                         rest[0] if rest else None)
    _gather(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts, layout, kv_cache_dtype, scale)


def cp_gather_cache(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts=None, layout="ND"):
    """vLLM's cp_gather_cache: gather_cache as a plain copy (uint8 fp8 caches: bytes)."""
    if L.is_fp8_buffer(src_cache) and L.is_fp8_buffer(dst):
        kv = "fp8_e5m2" if "e5m2" in str(getattr(src_cache, "dtype", "")) else "fp8"
        _gather(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts, layout, kv, None)
    else:
        _gather(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts, layout, "auto", None)


def _i32_values(x, name, ndim):
    """The values of an int32 index tensor (vLLM's kernels take int32 only) as a NumPy
    array (no copy); TypeError / ValueError naming it for another dtype or rank."""
    a = _to_numpy(x, name)
    if a.dtype != np.int32:
        raise TypeError("%s: dtype %s, expected int32" % (name, getattr(x, "dtype", a.dtype)))
    if a.ndim != ndim:
        raise ValueError("%s: shape %s, expected %d dims" % (name, tuple(a.shape), ndim))
    return a


_UPCONVERT = "cp_gather_and_upconvert_fp8_kv_cache"


def cp_gather_and_upconvert_fp8_kv_cache(src_cache, dst, block_table, seq_lens, workspace_starts, batch_size):
    """vLLM's cp_gather_and_upconvert_fp8_kv_cache (DeepSeek-V3.2's fp8_ds_mla caches): for
    each request b < batch_size, its seq_lens[b] tokens (token j at page
    block_table[b, j // block_size], slot j % block_size of src_cache) are dequantized into
    dst rows workspace_starts[b] + j. src_cache: fp8_ds_mla records (see
    concat_and_cache_mla; uint8 [num_blocks, block_size, 656] in vLLM, float8_e4m3fn /
    int8 and [.., 1, E] also taken); dst [tot_tokens, Dl + Dr] (vLLM: bf16 [.., 576]; also
    f32 / f16, and any Dl, Dr the records allow) = f32(code) * its tile's scale, the rope
    dims as stored, rounded once to dst's dtype. block_table [B, max_pages], seq_lens [B],
    workspace_starts [B]: int32 (TypeError otherwise), batch_size <= B. Rows of dst no
    request covers are left as they are. Checked before anything is written (an error
    leaves dst untouched): each request's rows inside dst and no two requests' rows
    overlapping (IndexError / ValueError naming workspace_starts), seq_lens >= 0 and within
    the block table, the block ids of the pages read (LlmkernError). workspace_starts that
    are the running sum of seq_lens from workspace_starts[0] (vLLM's) take one C call,
    other starts one call per request."""
    bt = _i32_values(block_table, "block_table", 2)
    sl = _i32_values(seq_lens, "seq_lens", 1)
    ws = _i32_values(workspace_starts, "workspace_starts", 1)
    nreq = min(len(sl), len(ws), len(bt))
    if not _is_int(batch_size) or not 0 <= batch_size <= nreq:
        raise ValueError("batch_size: %r, expected an int in [0, %d] (seq_lens has %d entries, workspace_starts %d, "
                         "block_table %d rows)" % (batch_size, nreq, len(sl), len(ws), len(bt)))
    B = int(batch_size)
    L._writable(dst, "dst")
    dshape = tuple(int(d) for d in getattr(dst, "shape", ()))
    if len(dshape) != 2:
        raise ValueError("dst: shape %s, expected [tot_tokens, Dl + Dr] (vLLM: [tot_tokens, 576])" % (dshape,))
    cv = _ds_view(src_cache, "src_cache")
    lens, starts = sl[:B].astype(np.int64), ws[:B].astype(np.int64)
    ends = starts + lens
    if (lens < 0).any():
        b = int(np.argmax(lens < 0))
        raise L.LlmkernError(6, "LK_ERR_INDEX", "%s: seq_lens[%d] = %d < 0" % (_UPCONVERT, b, lens[b]))
    out_of = (starts < 0) | (ends > dshape[0])
    if out_of.any():
        b = int(np.argmax(out_of))
        raise IndexError("workspace_starts: workspace_starts[%d] = %d: request %d's rows [%d, %d) are outside dst's "
                         "%d rows" % (b, starts[b], b, starts[b], ends[b], dshape[0]))
    full = np.nonzero(lens > 0)[0]
    order = full[np.argsort(starts[full], kind="stable")]
    meet = starts[order[1:]] < ends[order[:-1]]
    if meet.any():
        i = int(np.argmax(meet))
        a, b = sorted((int(order[i]), int(order[i + 1])))
        raise ValueError("workspace_starts: the rows of requests %d [%d, %d) and %d [%d, %d) overlap (workspace_starts"
                         "[%d] = %d, workspace_starts[%d] = %d)" % (a, starts[a], ends[a], b, starts[b], ends[b],
                                                                    a, starts[a], b, starts[b]))
    # what C checks per request, checked for all of them first (the per-request calls
    # below must not fail after an earlier one has written)
    cshape = tuple(int(d) for d in getattr(src_cache, "shape", ()))
    if len(cshape) >= 2 and cshape[1] > 0:
        nb, bsz, maxp = cshape[0], cshape[1], bt.shape[1]
        over = lens > maxp * bsz
        if over.any():
            b = int(np.argmax(over))
            raise L.LlmkernError(3, "LK_ERR_SHAPE", "%s: seq_lens[%d] = %d exceeds the block table's %d pages of %d "
                                 "slots" % (_UPCONVERT, b, lens[b], maxp, bsz))
        used = np.arange(maxp)[None, :] < ((lens + bsz - 1) // bsz)[:, None]
        bad = used & ((bt[:B] < 0) | (bt[:B] >= nb))
        if bad.any():
            b, p = (int(i) for i in np.argwhere(bad)[0])
            raise L.LlmkernError(6, "LK_ERR_INDEX", "%s: block_table[%d, %d] = %d is outside [0, %d) (src_cache's "
                                 "blocks)" % (_UPCONVERT, b, p, bt[b, p], nb))
    names = {"out": "dst", "cache": "src_cache"}
    if B == 0:
        return
    first = int(starts[0])
    if np.array_equal(starts, first + np.concatenate([[0], np.cumsum(lens[:-1])])):
        # vLLM's workspace: the requests' rows one after another, one call
        s = L.gather_cache_fp8(_out(dst[first:first + int(lens.sum())], "dst"), cv, _view(bt[:B], "block_table"),
                               _view(np.ascontiguousarray(sl[:B]), "seq_lens"), _DS_MLA, None)
        if s:
            _raise_as(s, names)
        return
    # any other starts: one call per request on its rows (requests with rows first: the
    # first call makes every check that does not depend on the request)
    lo, hi = _byte_extent(dst)
    for name, x in (("src_cache", src_cache), ("block_table", block_table), ("seq_lens", seq_lens),
                    ("workspace_starts", workspace_starts)):
        xl, xh = _byte_extent(x)
        if lo < hi and xl < xh and lo < xh and xl < hi:
            raise L.LlmkernError(7, "LK_ERR_ALIAS", "%s: dst and %s overlap in memory" % (_UPCONVERT, name))
    for b in list(full) + [i for i in range(B) if lens[i] == 0]:
        b = int(b)
        s = L.gather_cache_fp8(_out(dst[int(starts[b]):int(ends[b])], "dst"), cv, _view(bt[b:b + 1], "block_table"),
                               _view(np.array([lens[b]], np.int32), "seq_lens"), _DS_MLA, None)
        if s:
            _raise_as(s, names)


def convert_fp8(output, input, scale=1.0, kv_dtype="fp8"):
    """vLLM's convert_fp8: the fp8 side (uint8 buffer or float8 array / tensor) is
    dequantized into a f32/f16/bf16 output (output = f32(q) * scale) or quantized from a
    float input (output = fp8(x / scale)), element by element over one shape.
    kv_dtype 'fp8' / 'fp8_e4m3' / 'fp8_e5m2' names the fp8 format of uint8 buffers;
    'auto' copies between two float tensors (one rounding)."""
    if kv_dtype == "auto":
        for x, name in ((output, "output"), (input, "input")):
            if L.is_fp8_buffer(x) or L.info(x, name)[1] not in (L.F32, L.F16, L.BF16):
                raise ValueError("%s: dtype %s; kv_dtype='auto' copies between f32/f16/bf16 tensors"
                                 % (name, getattr(x, "dtype", "?")))
        if tuple(output.shape) != tuple(input.shape):
            raise ValueError("output: shape %s, input %s" % (tuple(output.shape), tuple(input.shape)))
        _copy_into(output, input)
        return
    if kv_dtype not in _FP8_KV:
        raise NotImplementedError("kv_dtype=%r: expected 'auto', 'fp8', 'fp8_e4m3' or 'fp8_e5m2'" % (kv_dtype,))
    dt = _FP8_KV[kv_dtype]
    if L.is_fp8_buffer(input):
        d, x = _out(output, "output") if not L.is_fp8_buffer(output) else L.fp8_out_view(output, "output", dt), \
            L.fp8_view(input, "input", dt)
    else:
        d, x = L.fp8_out_view(output, "output", dt) if L.is_fp8_buffer(output) else _out(output, "output"), \
            _view(input, "input")
    s = L.convert_fp8(d, x, float(scale))
    if s:
        _raise_as(s, {"dst": "output", "src": "input"})


def _block_view(x, name, write):
    """A cache for the block copies: uint8 buffers (vLLM's fp8 caches) as bytes (f8e4m3)."""
    if L._is_uint8(x):
        return (L.fp8_out_view if write else L.fp8_view)(x, name, L.F8E4M3)
    return _out(x, name) if write else _view(x, name)


def swap_blocks(src, dst, block_mapping):
    """vLLM's swap_blocks: dst[block_mapping[i, 1]] = src[block_mapping[i, 0]] for every
    row of block_mapping [N, 2] (int64 or int32); whole blocks (dim 0), bits (fp8 caches:
    uint8 or float8 buffers, as bytes)."""
    s = L.swap_blocks(_block_view(src, "src", False), _block_view(dst, "dst", True),
                      _view(block_mapping, "block_mapping"))
    if s:
        _raise(s)


def _caches_array(groups):
    """(count, packed views) of the caches of groups [(name, caches), ...], each view named
    name[i] as the caller passed it; and the C -> Python names of their positions."""
    views, names = [], {}
    for name, caches in groups:
        for i, c in enumerate(caches):
            names["caches[%d]" % len(views)] = "%s[%d]" % (name, i)
            views.append(_block_view(c, "%s[%d]" % (name, i), True))
    return len(views), b"".join(views), names


def copy_blocks(key_caches, value_caches, block_mapping):
    """vLLM's copy_blocks: for every layer's key and value cache,
    cache[block_mapping[i, 1]] = cache[block_mapping[i, 0]] (block_mapping [N, 2])."""
    if len(key_caches) != len(value_caches):
        raise ValueError("value_caches: %d caches, key_caches has %d" % (len(value_caches), len(key_caches)))
    n, arr, names = _caches_array((("key_caches", key_caches), ("value_caches", value_caches)))
    if n == 0:
        return
    s = L.copy_blocks(n, arr, _view(block_mapping, "block_mapping"))
    if s:
        _raise_as(s, names)


def copy_blocks_mla(kv_caches, block_mapping):
    """vLLM's copy_blocks_mla: the same on MLA latent caches [num_blocks, block_size, Dl + Dr]."""
    n, arr, names = _caches_array((("kv_caches", kv_caches),))
    if n == 0:
        return
    s = L.copy_blocks(n, arr, _view(block_mapping, "block_mapping"))
    if s:
        _raise_as(s, names)


# ---------------------------------------------------------------- attention


def _copy_into(dst, src):
    """dst[...] = src, rounded once to dst's dtype (NumPy or torch on both sides)."""
    if L.is_torch(dst):
        import torch
        dst.copy_(src if L.is_torch(src) else torch.from_numpy(np.ascontiguousarray(src)))
    else:
        dst[...] = src.numpy() if L.is_torch(src) else src


# C's names -> vLLM's (the LSEs as C sees them: [T, H], the transposes of vLLM's [H, T])
_MERGE_NAMES = {"out": "output", "out_lse": "output_lse (transposed)", "a": "prefix_output",
                "lse_a": "prefix_lse (transposed)", "b": "suffix_output", "lse_b": "suffix_lse (transposed)"}


def merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse,
                      output_lse=None, prefill_tokens_with_context=None, output_scale=None):
    """output [T, H, D] = LSE merge of (prefix_output, prefix_lse) and (suffix_output,
    suffix_lse); LSEs [H, T] f32 as in vLLM (passed to C as their [T, H] transposes).
    prefill_tokens_with_context = N (vLLM): only tokens < N have a prefix state; tokens
    >= N take the suffix as it is (output = suffix_output rounded to output's dtype,
    output_lse = suffix_lse), their prefix state is not read. output_scale (a one-element
    f32 tensor or a number): output is fp8 (float8_e4m3fn / float8_e5m2, or uint8 taken
    as e4m3) and holds fp8(merged / output_scale)."""
    scaled = output_scale is not None
    if scaled:  # fp8 output = fp8(merged / output_scale)
        output_scale = _scale_in(output_scale, "output_scale")
        merge = (lambda o, ol, a, la, b, lb: L.merge_attn_states_scaled(
            _fp8_out(o, "output"), ol, a, la, b, lb, _view(output_scale, "output_scale")))
    else:
        merge = (lambda o, ol, a, la, b, lb: L.merge_attn_states(_out(o, "output"), ol, a, la, b, lb))
    n = prefill_tokens_with_context
    T = output.shape[0] if len(output.shape) else 0
    if n is not None:
        if not _is_int(n) or not 0 <= n <= T:
            raise ValueError("prefill_tokens_with_context: %r, expected an int in [0, %d] "
                             "(output's tokens)" % (n, T))
        n = int(n)
        for x, name, dim in ((prefix_output, "prefix_output", 0), (suffix_output, "suffix_output", 0),
                             (prefix_lse, "prefix_lse", -1), (suffix_lse, "suffix_lse", -1),
                             (output_lse, "output_lse", -1)):
            if x is not None and (len(x.shape) < 1 or x.shape[dim] != T):
                raise ValueError("%s: shape %s, expected %d tokens like output"
                                 % (name, tuple(x.shape), T))
    if n is None or n == T:
        s = merge(output, _tview(output_lse, "output_lse", True),
                  _view(prefix_output, "prefix_output"), _tview(prefix_lse, "prefix_lse"),
                  _view(suffix_output, "suffix_output"), _tview(suffix_lse, "suffix_lse"))
        if s:
            _raise_as(s, _MERGE_NAMES)
        return
    # tokens [0, n): the merge (validates everything the copies below rely on: dtypes,
    # heads, head size, overlaps) over views of the first n tokens; then the copies
    lse_head = (lambda x: None if x is None else x[:, :n])
    s = merge(output[:n], _tview(lse_head(output_lse), "output_lse", True),
              _view(prefix_output[:n], "prefix_output"), _tview(lse_head(prefix_lse), "prefix_lse"),
              _view(suffix_output[:n], "suffix_output"), _tview(lse_head(suffix_lse), "suffix_lse"))
    if s:
        _raise_as(s, _MERGE_NAMES)
    if scaled:  # the suffix quantized as it is
        s = L.static_scaled_fp8_quant(_fp8_out(output[n:], "output"), _view(suffix_output[n:], "suffix_output"),
                                      _view(output_scale, "output_scale"))
        if s:
            _raise(s)
    else:
        _copy_into(output[n:], suffix_output[n:])
    if output_lse is not None:
        _copy_into(output_lse[:, n:], suffix_lse[:, n:])


def causal_softmax(out, x):
    """out[..., q, k] = softmax of x over the last dim with the bottom-right causal mask."""
    s = L.causal_softmax(_out(out, "out"), _view(x, "x"))
    if s:
        _raise(s)


def _empty(like, shape, f32=False):
    """A new array on the same side (NumPy or torch) as `like`."""
    if L.is_torch(like):
        import torch
        return torch.empty(shape, dtype=torch.float32 if f32 else like.dtype)
    return np.empty(shape, dtype=np.float32 if f32 else like.dtype)


# ---- fp8 attention (q / K / V in f8e4m3 / f8e5m2 with q/k/v_descale)


def _fp8_code(x):
    """L.F8E4M3 / L.F8E5M2 for a float8-typed array or tensor, else None."""
    name = str(getattr(x, "dtype", ""))
    if "float8_e4m3fn" in name:
        return L.F8E4M3
    if "float8_e5m2" in name:
        return L.F8E5M2
    return None


def _kv_fp8(kv_cache_dtype):
    """The lk fp8 dtype uint8 K/V buffers are viewed as (None for 'auto')."""
    if kv_cache_dtype in (None, "auto"):
        return None
    if kv_cache_dtype in _FP8_KV:
        return _FP8_KV[kv_cache_dtype]
    raise ValueError("kv_cache_dtype: %r, expected 'auto', 'fp8', 'fp8_e4m3' or 'fp8_e5m2'" % (kv_cache_dtype,))


def _descale_view(x, name, keep):
    """A descale as a packed f32 lk_tensor (None stays None): a Python number becomes a
    0-d f32 array (kept alive in keep); arrays / tensors of shape [], [1], [Hk] or
    [B, Hk] (vLLM's expanded [num_seqs, num_kv_heads], any strides) are passed as they are."""
    if x is None:
        return None
    if isinstance(x, (int, float, np.generic)) and not isinstance(x, (bool, np.bool_)):
        x = np.array(x, dtype=np.float32)  # numbers and NumPy scalars (np.float32(0.5))
        keep.append(x)
    return _view(x, name)


def _fp8_out_like(q, v):
    """An out dtype for an fp8 q: v's when v is not fp8, else bf16 (torch) / f32 (NumPy)."""
    if _fp8_code(v) is None and not L._is_uint8(v):
        return v.dtype
    if L.is_torch(q):
        import torch
        return torch.bfloat16
    return np.float32


# C's names -> flash-attention's (lse: the [Tq, Hq] transpose of softmax_lse [Hq, Tq])
_ATTN_NAMES = {"params.scale": "softmax_scale", "params.softcap": "softcap", "params.window": "window_size",
               "lse": "softmax_lse (transposed)"}


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None, *,
                           return_softmax_lse=False, out=None, seqused_k=None, kv_layout="ND",
                           scheduler_metadata=None, num_splits=0, fa_version=None, q_v=None,
                           q_descale=None, k_descale=None, v_descale=None, s_aux=None,
                           kv_cache_dtype="auto", output_scale=None):
    """flash-attention's varlen attention. q [Tq, Hq, Dqk]; dense k [Tk, Hk, Dqk],
    v [Tk, Hk, Dv] with cu_seqlens_k, or paged caches with block_table [B, pages] and
    seqused_k [B] (cu_seqlens_k None; kv_layout 'ND' or 'NZ'). Returns out [Tq, Hq, Dv]
    (allocated like q when None), or (out, lse [Hq, Tq] f32) with return_softmax_lse, or
    (out, lse, None) with return_attn_probs (dropout 0: no probabilities are formed).
    Paged K/V take the key lengths from seqused_k (vLLM) or, without it, from
    cu_seqlens_k (flash-attention 2). alibi_slopes: f32 [Hq] or [B, Hq], a bias of
    -slope * |i + k_len - q_len - j| on the scaled (and softcapped) score.
    max_seqlen_* are accepted for compatibility and not needed; deterministic,
    scheduler_metadata, num_splits and fa_version are ignored (results never depend on the
    thread count); q_v and s_aux raise NotImplementedError.
    fp8: q, k and v may be float8_e4m3fn / float8_e5m2 (torch or ml_dtypes) with
    q_descale, k_descale, v_descale (f32 numbers or tensors of shape [], [1], [Hk] or
    [num_seqs, Hk] as vLLM expands them; dequantized = fp8 * descale, applied to the
    scores and outputs inside the kernel; ignored for a q, k or v that is not fp8).
    kv_cache_dtype 'fp8' / 'fp8_e4m3' / 'fp8_e5m2' views uint8 K/V buffers (as vLLM
    allocates caches) as that fp8 type. An fp8 NZ cache is [blocks, Hk*D/32, bs, 32].
    output_scale (vLLM's fused output quantization; a number or a one-element f32
    tensor): out is fp8 and holds fp8(attention / output_scale) (one f32 division,
    saturated to the finite range, NaN kept; rows that see no key 0). out may be given as
    float8_e4m3fn / float8_e5m2 (torch, ml_dtypes) or a uint8 buffer taken as e4m3, as
    merge_attn_states(output_scale=) takes its output; None allocates an e4m3 out
    (torch.float8_e4m3fn; NumPy: ml_dtypes.float8_e4m3fn, or uint8 without ml_dtypes).
    lse stays f32."""
    if dropout_p:
        raise NotImplementedError("dropout_p: only 0.0 (inference) is supported")
    # vLLM's vllm_flash_attn keywords: scheduling hints are ignored, the rest refused
    for name, val in (("q_v", q_v), ("s_aux", s_aux)):
        if val is not None:
            raise NotImplementedError("%s: not supported (%s)" % (
                name, "attention sinks" if name == "s_aux" else "FlashAttention-3's MLA q_v"))
    lay = _layout(kv_layout)
    f8 = _kv_fp8(kv_cache_dtype)
    if block_table is not None and seqused_k is None and cu_seqlens_k is not None:
        # flash-attention 2's paged form: the key lengths come from cu_seqlens_k
        seqused_k = _seqlens_from_cu(cu_seqlens_k, "cu_seqlens_k")
    if block_table is not None:
        cu_seqlens_k = None  # with seqused_k given, flash-attention reads the lengths there
    if return_attn_probs:
        return_softmax_lse = True  # dropout 0: (out, lse, None) as flash-attention returns
    dqk = q.shape[-1]
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(dqk)
    if out is None or return_softmax_lse:
        if len(q.shape) != 3:
            raise ValueError("q: shape %s, expected [total_q, num_heads, head_dim]" % (tuple(q.shape),))
        tq, hq = q.shape[0], q.shape[1]
    dv = v.shape[-1]
    if block_table is not None and lay == 1 and len(k.shape) == 4 and len(v.shape) == 4:
        # NZ: [blocks, C/T, bs, T], C = Hk * D
        kt = 32 if (f8 is not None or _fp8_code(k) is not None) else 16  # fp8: 32-wide tiles
        vt = 32 if (f8 is not None or _fp8_code(v) is not None) else 16
        hk = k.shape[1] * kt // dqk
        dv = v.shape[1] * vt // hk if hk else dqk
    if out is not None and len(out.shape) == 3 and out.shape[-1] != dv:
        raise ValueError("out: shape %s, last dim must be v's head dim %d" % (tuple(out.shape), dv))
    if out is None:
        if output_scale is not None:  # the fp8 out of vLLM's fused output quantization
            out = _fp8_like(q, (tq, hq, dv))
        elif _fp8_code(q) is not None:
            out = (__import__("torch").empty((tq, hq, dv), dtype=_fp8_out_like(q, v)) if L.is_torch(q)
                   else np.empty((tq, hq, dv), dtype=_fp8_out_like(q, v)))
        else:
            out = _empty(q, (tq, hq, dv))
    lse = _empty(q, (hq, tq), f32=True) if return_softmax_lse else None
    wl, wr = (-1, -1) if window_size is None else window_size
    alive = []
    params = L.attn_params(softmax_scale, 1 if causal else 0, wl, wr, softcap, lay,
                           _view(alibi_slopes, "alibi_slopes"), _descale_view(q_descale, "q_descale", alive),
                           _descale_view(k_descale, "k_descale", alive),
                           _descale_view(v_descale, "v_descale", alive))
    keep = None
    if isinstance(params, tuple):
        params, keep = params
    args = (_tview(lse, "lse"), _view(q, "q"), L.fp8_view(k, "k", f8), L.fp8_view(v, "v", f8),
            _view(cu_seqlens_q, "cu_seqlens_q"), _view(cu_seqlens_k, "cu_seqlens_k"), _view(seqused_k, "seqused_k"),
            _view(block_table, "block_table"), params)
    if output_scale is not None:
        output_scale = _scale_in(output_scale, "output_scale")
        s = L.flash_attn_varlen_scaled(_fp8_out(out, "out"), *args, _view(output_scale, "output_scale"))
    else:
        s = L.flash_attn_varlen(_out(out, "out"), *args)
    del keep
    if s:
        _raise_as(s, _ATTN_NAMES)
    if return_attn_probs:
        return out, lse, None
    return (out, lse) if return_softmax_lse else out


def _side(like, a):
    """NumPy array a as an array on like's side (a torch tensor when like is one)."""
    if L.is_torch(like):
        import torch
        return torch.from_numpy(np.ascontiguousarray(a))
    return a


def _fresh_copy(x):
    """A contiguous copy of x (never x itself): rotary is applied to it, not to x."""
    if L.is_torch(x):
        return x.clone(memory_format=__import__("torch").contiguous_format)
    return np.array(x, order="C", copy=True)


def _tokens_view(x, name, writable=False, uint8_e4m3=False):
    """[B, S, H, D] -> the packed [B * S, H, D] view (ValueError naming x if the batch
    and sequence dims cannot merge without a copy). uint8_e4m3: a uint8 buffer is taken
    as e4m3 (an fp8 out, as _fp8_out takes one)."""
    if writable:
        L._writable(x, name)
    if uint8_e4m3 and L._is_uint8(x):
        if isinstance(x, np.ndarray):
            p, shape, st = L._np_data(x), x.shape, x.strides  # itemsize 1: byte strides
        else:
            if not x.is_cpu:
                raise ValueError("%s: tensor is on device %s; llmkern runs on the CPU" % (name, x.device))
            p, shape, st = x.data_ptr(), x.shape, x.stride()
        dt = L.F8E4M3
    else:
        p, dt, shape, st = L.info(x, name)
    if len(shape) != 4:
        raise ValueError("%s: shape %s, expected [batch, seqlen, heads, head_dim]" % (name, tuple(shape)))
    shape, st = _merge_lead(tuple(shape), tuple(st), name)
    return L.pack(p, dt, shape, st, name)


def _cache_bytes(c):
    """An fp8 cache as its bytes (a uint8 view of the same shape and strides), any other
    cache as itself: the slots of an append are saved and put back through it (torch
    indexes no float8 tensors)."""
    if _fp8_code(c) is None:
        return c
    if L.is_torch(c):
        import torch
        return c.view(torch.uint8)
    return c.view(np.uint8)


_KV_STATUS = {"LK_ERR_SHAPE": 3, "LK_ERR_DTYPE": 4, "LK_ERR_VALUE": 9}


def _kv_fail(status, msg):
    raise LlmkernError(_KV_STATUS[status], status, "flash_attn_with_kvcache: " + msg)


def _append_scales(x, name, B, Hk):
    """The scales an append to an fp8 cache quantizes with: the cache's descale x (None: 1).
    Checked as the attention checks a descale (f32; [], [1], [Hk] or [B, Hk]; finite > 0),
    since the write comes before the attention. Returns one scale for every request (x, a
    0-d array for a number, or row 0 of a [B, Hk] x whose rows are all equal), or the B rows
    of a [B, Hk] x (each request's tokens quantized with its own row)."""
    if x is None:
        return [None]
    if isinstance(x, (int, float, np.generic)) and not isinstance(x, (bool, np.bool_)):
        x = np.array(x, dtype=np.float32)
    a = x.detach().cpu().numpy() if L.is_torch(x) else np.asarray(x)
    if a.dtype != np.float32:
        _kv_fail("LK_ERR_DTYPE", "%s: dtype %s not supported (f32)" % (name, getattr(x, "dtype", a.dtype)))
    if a.shape not in ((), (1,), (Hk,), (B, Hk)):
        _kv_fail("LK_ERR_SHAPE", "%s: shape %s: expected [], [1], [%d] or [%d, %d]" % (name, a.shape, Hk, B, Hk))
    bad = ~(np.isfinite(a) & (a > 0))
    if bad.any():
        i = tuple(int(j) for j in np.argwhere(bad)[0]) if a.ndim else ()
        _kv_fail("LK_ERR_VALUE", "%s%s: value %g must be finite and > 0" % (name, list(i) if i else "", float(a[i])))
    if a.ndim < 2:
        return [x]
    if (a == a[:1]).all():
        return [x[0]]
    return [x[b] for b in range(B)]


def _append_fp8(k, v, k_cache, v_cache, slots, f8, k_descale, v_descale):
    """k, v [B, s_new, Hk, D] into fp8 caches at slots [B, s_new] (int64), quantized
    fp8(x / descale) by lk_reshape_and_cache_flash_fp8: one call, or one per request when
    a [B, Hk] descale's rows differ."""
    B, Hk = int(slots.shape[0]), int(k.shape[2])
    kc = L.fp8_out_view(k_cache, "k_cache", f8) if f8 is not None else _out(k_cache, "k_cache")
    vc = L.fp8_out_view(v_cache, "v_cache", f8) if f8 is not None else _out(v_cache, "v_cache")
    ks, vs = _append_scales(k_descale, "k_descale", B, Hk), _append_scales(v_descale, "v_descale", B, Hk)
    nd = _layout("ND")
    if len(ks) == 1 and len(vs) == 1:
        sl = _side(k, slots.reshape(-1))
        s = L.reshape_and_cache_flash_fp8(_tokens_view(k, "k"), _tokens_view(v, "v"), kc, vc, _view(sl, "slot_mapping"),
                                          _view(ks[0], "k_descale"), _view(vs[0], "v_descale"), nd)
        if s:
            _raise(s)
        return
    for b in range(B):
        sl = _side(k, slots[b])
        kb, vb = ks[b if len(ks) > 1 else 0], vs[b if len(vs) > 1 else 0]
        s = L.reshape_and_cache_flash_fp8(_view(k[b], "k"), _view(v[b], "v"), kc, vc, _view(sl, "slot_mapping"),
                                          _view(kb, "k_descale"), _view(vb, "v_descale"), nd)
        if s:
            _raise(s)


# C's names -> flash_attn_with_kvcache's (C attends over k_cache / v_cache as k / v)
_KVCACHE_NAMES = dict(_ATTN_NAMES, k="k_cache", v="v_cache")


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None,
                            block_table=None, softmax_scale=None, causal=False, window_size=(-1, -1),
                            softcap=0.0, rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False, *, out=None, q_descale=None, k_descale=None,
                            v_descale=None, kv_cache_dtype="auto", output_scale=None):
    """flash-attention's decode entry point. q [B, s_q, Hq, D]; k_cache, v_cache dense
    [B_cache, S, Hk, D] (request b uses row cache_batch_idx[b], default b) or paged
    [num_blocks, block_size, Hk, D] with block_table [B, max_blocks]; cache_seqlens (int or
    [B]): keys already cached (None: the whole cache; required with k, v). k, v [B, s_new,
    Hk, D] (optional) are appended at positions cache_seqlens[b] .. + s_new before
    attending; with rotary_cos / rotary_sin [seqlen_ro >= cache_seqlens + s_new, rot / 2]
    (only with k, v, as flash-attention) the new k is rotated at those positions (and q at
    cache_seqlens + i when causal or local, else at cache_seqlens), GPT-J pairs when
    rotary_interleaved, else NeoX; q and k themselves are not modified. Attention over
    cache_seqlens + s_new keys per request, bottom-right aligned (causal, window_size,
    softcap, alibi_slopes [Hq] / [B, Hq] as flash_attn_varlen_func). Returns out
    [B, s_q, Hq, Dv] (allocated like q when None), or (out, lse [B, Hq, s_q]) with
    return_softmax_lse. On any error nothing is written: the cache slots of the append
    are put back. num_splits is ignored; cache_leftpad is not supported.
    fp8 caches (float8 types, or uint8 with kv_cache_dtype 'fp8' / 'fp8_e4m3' /
    'fp8_e5m2') and an fp8 q with q/k/v_descale as flash_attn_varlen_func. New k, v
    (f32 / f16 / bf16, rotated first when asked) appended to an fp8 cache are quantized
    as flash-attention and vLLM do, with the cache's dequantization scales:
    fp8(k / k_descale), fp8(v / v_descale) (round to nearest even, saturated; None: 1),
    by lk_reshape_and_cache_flash_fp8. A descale per tensor or per KV head [Hk] applies to
    every request; a [B, Hk] descale quantizes request b's new tokens with its row b, the
    row its attention dequantizes them with (one write per request where the rows differ).
    Those descales are checked before the append (f32; [], [1], [Hk] or [B, Hk]; finite
    and > 0: LlmkernError LK_ERR_DTYPE / LK_ERR_SHAPE / LK_ERR_VALUE naming them), and an
    error after it puts the slots' old bytes back, as for 16/32-bit caches.
    output_scale (a number or a one-element f32 tensor): an fp8 out holding
    fp8(attention / output_scale), as flash_attn_varlen_func (out given as float8 or a
    uint8 buffer taken as e4m3; None allocates e4m3)."""
    if cache_leftpad is not None:
        raise NotImplementedError("cache_leftpad: left-padded caches are not supported")
    if (k is None) != (v is None):
        raise ValueError("k, v: pass both new keys and new values, or neither")
    if rotary_cos is not None and k is None:  # flash-attention rotates q only with an append
        raise ValueError("rotary_cos: with rotary cos / sin the new k and v to append must be passed too")
    if k is not None and cache_seqlens is None:
        raise ValueError("cache_seqlens: required with new k and v (where to append them)")
    f8 = _kv_fp8(kv_cache_dtype)
    cache_f8 = f8 is not None or _fp8_code(k_cache) is not None or _fp8_code(v_cache) is not None
    if len(q.shape) != 4:
        raise ValueError("q: shape %s, expected [batch, seqlen, heads, head_dim]" % (tuple(q.shape),))
    if len(k_cache.shape) != 4 or len(v_cache.shape) != 4:
        raise ValueError("k_cache / v_cache: shapes %s / %s, expected 4-D caches"
                         % (tuple(k_cache.shape), tuple(v_cache.shape)))
    B, sq, Hq, D = (int(d) for d in q.shape)
    nb, bs = int(k_cache.shape[0]), int(k_cache.shape[1])
    s_new = 0
    if k is not None:
        if len(k.shape) != 4 or int(k.shape[0]) != B:
            raise ValueError("k: shape %s, expected [%d, seqlen_new, heads, head_dim]" % (tuple(k.shape), B))
        if tuple(v.shape[:2]) != tuple(k.shape[:2]):
            raise ValueError("v: shape %s, expected [%d, %d, heads, head_dim] like k"
                             % (tuple(v.shape), B, int(k.shape[1])))
        s_new = int(k.shape[1])
    # the cache as pages: a dense cache is one page of S slots per batch row
    if block_table is None:
        bidx = (np.arange(B, dtype=np.int64) if cache_batch_idx is None
                else _to_numpy(cache_batch_idx, "cache_batch_idx").astype(np.int64).reshape(-1))
        if bidx.shape != (B,) or ((bidx < 0) | (bidx >= nb)).any():
            raise ValueError("cache_batch_idx: %s, expected %d entries in [0, %d)" % (bidx.tolist(), B, nb))
        table = bidx.reshape(B, 1).astype(np.int32)
    else:
        if cache_batch_idx is not None:
            raise ValueError("cache_batch_idx: not with a block_table (paged caches are addressed by it)")
        table = _to_numpy(block_table, "block_table")
        if table.ndim != 2 or table.shape[0] != B:
            raise ValueError("block_table: shape %s, expected [%d, max_blocks]" % (tuple(table.shape), B))
        table = table.astype(np.int32)
    cap = table.shape[1] * bs
    if cache_seqlens is None:
        lens = np.full(B, cap - s_new, np.int64)
    elif _is_int(cache_seqlens):
        lens = np.full(B, int(cache_seqlens), np.int64)
    else:
        lens = _to_numpy(cache_seqlens, "cache_seqlens").astype(np.int64).reshape(-1)
    total = lens + s_new
    if lens.shape != (B,) or (lens < 0).any() or (total > cap).any():
        raise ValueError("cache_seqlens: %s with %d new tokens, expected %d lengths in [0, %d]"
                         % (lens.tolist(), s_new, B, cap - s_new))
    used_pages = [table[b, :(int(total[b]) + bs - 1) // bs] for b in range(B)]
    if any(((p < 0) | (p >= nb)).any() for p in used_pages):
        raise ValueError("block_table: a page of the used keys is outside [0, %d)" % nb)
    # rotary on copies of q and the new k
    wl, wr = (-1, -1) if window_size is None else window_size
    qq = q
    if rotary_cos is not None:
        if rotary_sin is None or tuple(rotary_sin.shape) != tuple(rotary_cos.shape):
            raise ValueError("rotary_sin: shape %s, expected rotary_cos's %s"
                             % (None if rotary_sin is None else tuple(rotary_sin.shape), tuple(rotary_cos.shape)))
        if L.is_torch(rotary_cos):
            import torch
            cs = torch.cat([rotary_cos, rotary_sin], dim=1).contiguous()
        else:
            cs = np.ascontiguousarray(np.concatenate([rotary_cos, rotary_sin], axis=1))
        qq = _fresh_copy(q)
        local = causal or (wl, wr) != (-1, -1)
        # q at cache_seqlens + i (causal / local), else every query at cache_seqlens
        qpos = (lens[:, None] + (np.arange(sq)[None, :] if local else np.zeros((1, sq), np.int64))).reshape(-1)
        reach = int(total.max(initial=0))
        if int(rotary_cos.shape[0]) < reach:
            raise ValueError("rotary_cos: %d rows, the rotary positions reach %d (cache_seqlens + new tokens)"
                             % (int(rotary_cos.shape[0]), reach))
        rotary_embedding(_side(q, qpos.astype(np.int64)),
                         qq.reshape(B * sq, Hq, D), None, D, cs, not rotary_interleaved)
        if k is not None:
            kk = _fresh_copy(k)
            kpos = (lens[:, None] + np.arange(s_new)[None, :]).reshape(-1).astype(np.int64)
            rotary_embedding(_side(k, kpos), kk.reshape(B * s_new, -1, D), None, D, cs, not rotary_interleaved)
            k = kk
    # the append, with the old bytes of its slots kept to put back on an error
    saved = None
    try:
        if s_new:
            pos = lens[:, None] + np.arange(s_new)[None, :]
            pages = np.take_along_axis(table.astype(np.int64), pos // bs, axis=1)
            offs = pos % bs
            pg, of = pages.reshape(-1), offs.reshape(-1)
            slots = (pg * bs + of).astype(np.int64)
            rk, rv = _cache_bytes(k_cache), _cache_bytes(v_cache)
            ipg, iof = _side(k_cache, pg), _side(k_cache, of)
            saved = (rk, rv, ipg, iof, rk[ipg, iof].clone() if L.is_torch(rk) else rk[pg, of].copy(),
                     rv[ipg, iof].clone() if L.is_torch(rv) else rv[pg, of].copy())
            if cache_f8:
                _append_fp8(k, v, k_cache, v_cache, slots.reshape(B, s_new), f8, k_descale, v_descale)
            else:
                sl = _side(k, slots)  # alive through the call
                s = L.reshape_and_cache_flash(_tokens_view(k, "k"), _tokens_view(v, "v"), _out(k_cache, "k_cache"),
                                              _out(v_cache, "v_cache"), _view(sl, "slot_mapping"))
                if s:
                    _raise(s)
        if softmax_scale is None:
            softmax_scale = 1.0 / math.sqrt(D)
        dv = int(v_cache.shape[-1])
        if out is not None and len(out.shape) == 4 and int(out.shape[-1]) != dv:
            raise ValueError("out: shape %s, last dim must be v_cache's head dim %d" % (tuple(out.shape), dv))
        if out is None:
            if output_scale is not None:  # the fp8 out of vLLM's fused output quantization
                out = _fp8_like(q, (B, sq, Hq, dv))
            elif _fp8_code(q) is not None:
                out = (__import__("torch").empty((B, sq, Hq, dv), dtype=_fp8_out_like(q, v_cache)) if L.is_torch(q)
                       else np.empty((B, sq, Hq, dv), dtype=_fp8_out_like(q, v_cache)))
            else:
                out = _empty(q, (B, sq, Hq, dv))
        lse = _empty(q, (B, sq, Hq), f32=True) if return_softmax_lse else None
        alive = []
        params = L.attn_params(softmax_scale, 1 if causal else 0, wl, wr, softcap, 0,
                               _view(alibi_slopes, "alibi_slopes"), _descale_view(q_descale, "q_descale", alive),
                               _descale_view(k_descale, "k_descale", alive),
                               _descale_view(v_descale, "v_descale", alive))
        keep = None
        if isinstance(params, tuple):
            params, keep = params
        # index tensors in locals: a view holds a pointer, not a reference
        cu_q = _side(q, (np.arange(B + 1) * sq).astype(np.int32))
        used, tab = _side(q, total.astype(np.int32)), _side(q, table)
        lse2 = None if lse is None else lse.reshape(B * sq, Hq)
        args = (None if lse2 is None else _view(lse2, "lse"),
                _tokens_view(qq, "q"), L.fp8_view(k_cache, "k_cache", f8), L.fp8_view(v_cache, "v_cache", f8),
                _view(cu_q, "cu_seqlens_q"), None, _view(used, "cache_seqlens"), _view(tab, "block_table"), params)
        if output_scale is not None:
            output_scale = _scale_in(output_scale, "output_scale")
            st = L.flash_attn_varlen_scaled(_tokens_view(out, "out", True, uint8_e4m3=True), *args,
                                            _view(output_scale, "output_scale"))
        else:
            st = L.flash_attn_varlen(_tokens_view(out, "out", True), *args)
        del keep
        if st:
            _raise_as(st, _KVCACHE_NAMES)
    except BaseException:
        if saved is not None:  # put the appended slots' bytes back
            rk, rv, ipg, iof, ok, ov = saved
            rk[ipg, iof] = ok
            rv[ipg, iof] = ov
        raise
    if return_softmax_lse:
        return out, (lse.transpose(1, 2) if L.is_torch(lse) else lse.transpose(0, 2, 1))
    return out


def _seqlens_from_cu(cu, name):
    """[B] int32 lengths cu[b + 1] - cu[b] of a cumulative [B + 1] index tensor (a new
    array on cu's side); ValueError naming cu where it is not [B + 1] non-decreasing."""
    c = _to_numpy(cu, name)
    if c.ndim != 1 or c.shape[0] < 1 or c.dtype.kind not in "iu":
        raise ValueError("%s: shape %s dtype %s, expected [batch + 1] int32"
                         % (name, tuple(c.shape), c.dtype))
    d = np.diff(c.astype(np.int64))
    if (d < 0).any():
        raise ValueError("%s: not non-decreasing" % name)
    d = np.ascontiguousarray(d, dtype=np.int32)
    if L.is_torch(cu):
        import torch
        return torch.from_numpy(d)
    return d


def mla_prefix_prefill(q, k, v, cu_seqlens_q, prefix_lens, block_table, kv_cache, kv_b_proj,
                       softmax_scale, out=None, kv_layout="ND", strategy="auto",
                       k_pe_cache=None, dedup=True, kv_cache_dtype="auto", k_scale=None):
    """MLA prefill of new tokens over a cached prefix (DeepSeek-V2/V3 attention).
    q, k [T, H, Dn + Dr] (k = [k_nope | k_rope broadcast]), v [T, H, Dv] of the new
    tokens; cu_seqlens_q [B + 1]; prefix_lens [B]; block_table [B, max_pages];
    kv_cache: the latent cache, one buffer of [Dl + Dr] entries (ND [blocks, block_size,
    Dl + Dr] or NZ physical [blocks, (Dl + Dr)/16, block_size, 16]) or, with k_pe_cache,
    the [.., Dl] part; kv_b_proj [H * (Dn + Dv), Dl] (torch Linear weight); softmax_scale
    explicit. strategy: 'auto', 'split_merge', 'concat', 'fused', 'absorbed'. Returns
    out [T, H, Dv] (allocated like q when None). mla_last_trace() tells what ran.
    fp8 latent caches (vLLM's kv_cache_dtype and per-tensor k_scale, a number or a
    one-element tensor): kv_cache_dtype 'fp8' / 'fp8_e4m3' / 'fp8_e5m2' takes uint8 caches
    (as vLLM allocates them) viewed as that format, or float8 arrays / tensors of it;
    'auto' takes the caches in their own dtype (ml_dtypes float8_e4m3fn / float8_e5m2,
    torch.float8_e4m3fn / float8_e5m2 included). Entries are f32(code) * k_scale (default
    1); NZ fp8 caches are [blocks, (Dl + Dr)/32, block_size, 32]. k_scale is ignored for
    16/32-bit caches.
    NotImplementedError where the loaded library lacks lk_mla_prefix_prefill."""
    try:
        strat = L.MLA_STRATEGIES[strategy]
    except (KeyError, TypeError):
        raise ValueError("strategy: %r, expected one of %s"
                         % (strategy, ", ".join(L.MLA_STRATEGIES))) from None
    lay = _layout(kv_layout)
    if out is None:
        if len(q.shape) != 3:
            raise ValueError("q: shape %s, expected [num_tokens, num_heads, head_dim]" % (tuple(q.shape),))
        out = _empty(q, (q.shape[0], q.shape[1], v.shape[-1]))
    if kv_cache_dtype in _FP8_KV:  # fp8 caches, uint8 buffers viewed as the format
        dt = _FP8_KV[kv_cache_dtype]
        cache_v = L.fp8_in_view(kv_cache, "kv_cache", dt)
        pe_v = L.fp8_in_view(k_pe_cache, "k_pe_cache", dt)
    elif kv_cache_dtype == "auto":
        cache_v, pe_v = _view(kv_cache, "kv_cache"), _view(k_pe_cache, "k_pe_cache")
    else:
        raise NotImplementedError("kv_cache_dtype=%r: expected 'auto', 'fp8', 'fp8_e4m3' or 'fp8_e5m2'"
                                  % (kv_cache_dtype,))
    ks = _scale_arg(k_scale, "k_scale", required=False, scalar=True)
    params = L.mla_params(softmax_scale, strat, lay, 1 if dedup else 0, ks)
    s = L.mla_prefix_prefill(_out(out, "out"), _view(q, "q"), _view(k, "k"), _view(v, "v"),
                             _view(cu_seqlens_q, "cu_seqlens_q"), _view(prefix_lens, "prefix_lens"),
                             _view(block_table, "block_table"), cache_v, pe_v,
                             _view(kv_b_proj, "kv_b_proj"), params)
    if s:
        _raise(s)
    return out


def mla_last_trace():
    """What the last mla_prefix_prefill call on this thread ran ("strategy=... ; ...")."""
    return L.mla_last_trace().decode()


# ---------------------------------------------------------------- MLA decode (FlashMLA)


def get_mla_metadata(cache_seqlens, num_heads_per_head_k, num_heads_k, num_heads_q=None, is_fp8_kvcache=False,
                     topk=None):
    """FlashMLA's planning call for flash_mla_with_kvcache. Returns
    (tile_scheduler_metadata, num_splits), int32 arrays like cache_seqlens (NumPy or
    torch): tile_scheduler_metadata [1, 8] holds the keys per split-KV chunk at [0, 0]
    (what lk_mla_decode_plan picks for these lengths; the rest is 0), num_splits [B + 1]
    the cumulative chunk counts (request b has num_splits[b + 1] - num_splits[b]). The
    split depends only on the lengths, never on the thread count; the head counts and
    is_fp8_kvcache (FlashMLA's newer signature) are accepted for compatibility and do not
    change it. topk (sparse decode with indices): each request's keys are at most topk,
    so the plan is made for the lengths min(cache_seqlens, topk)."""
    del num_heads_per_head_k, num_heads_k, num_heads_q, is_fp8_kvcache
    as_torch = L.is_torch(cache_seqlens)
    if topk is not None:
        if not _is_int(topk) or topk < 0:
            raise ValueError("topk: %r, expected an int >= 0 (or None)" % (topk,))
        cache_seqlens = np.minimum(np.asarray(_to_numpy(cache_seqlens, "cache_seqlens"), np.int64), int(topk))
    split = L.ctypes.c_int64(0)
    s = L.mla_decode_plan(_view(cache_seqlens, "cache_seqlens"), L.ctypes.byref(split))
    if s:
        _raise(s)
    lens = np.asarray(cache_seqlens.cpu() if L.is_torch(cache_seqlens) else cache_seqlens, np.int64)
    chunks = np.maximum(1, (lens + split.value - 1) // split.value)
    meta = np.zeros((1, 8), np.int32)
    meta[0, 0] = split.value
    splits = np.concatenate([[0], np.cumsum(chunks)]).astype(np.int32)
    if as_torch:
        import torch
        return torch.from_numpy(meta), torch.from_numpy(splits)
    return meta, splits


def _mla_cache_view(x, name, fp8_dt, is_fp8):
    """A latent cache's view: with an fp8 kv_cache_dtype (fp8_dt) a uint8 buffer (as vLLM
    allocates fp8 caches) is viewed as fp8_dt and an fp8-typed array / tensor must be of
    it; else with is_fp8 (FlashMLA's is_fp8_kvcache) the cache must be fp8 (a uint8 buffer
    is e4m3), and fp8-typed (torch float8, ml_dtypes) and f32/f16/bf16 caches are taken as
    they are."""
    if fp8_dt is not None:
        return L.fp8_in_view(x, name, fp8_dt)
    if is_fp8 and x is not None and not L.is_fp8_buffer(x):
        raise TypeError("%s: dtype %s with is_fp8_kvcache=True: expected an fp8 cache (uint8 buffer, "
                        "float8_e4m3fn / float8_e5m2)" % (name, getattr(x, "dtype", "?")))
    if x is None or not L._is_uint8(x):
        return _view(x, name)
    if not is_fp8:
        raise TypeError("%s: a uint8 cache needs kv_cache_dtype 'fp8' / 'fp8_e4m3' / 'fp8_e5m2' (or "
                        "is_fp8_kvcache=True: e4m3)" % name)
    return L.fp8_view(x, name, L.F8E4M3)


# ---- FlashMLA's token-level sparse decode (indices [B, s_q, topk]; DeepSeek-V3.2): a
# composition over lk_mla_decode. The paged cache [blocks, page, (1,) E] is seen as a cache
# of one-slot pages [blocks * page, 1, (1,) E] (a view: the block stride must be page x the
# slot stride), every query row (b, i) as a request of its own with s_q = 1 whose block
# table lists its valid indices in order (entries past its count are never read).

_LK_TENSOR = struct.Struct("@Pii%dq%dq" % (L.MAX_DIMS, L.MAX_DIMS))  # the bytes L.pack makes


def _unpack(v):
    """(data pointer, lk dtype, shape, element strides) of a packed lk_tensor."""
    f = _LK_TENSOR.unpack(v)
    nd, m = f[2], L.MAX_DIMS
    return f[0], f[1], tuple(f[3:3 + nd]), tuple(f[3 + m:3 + m + nd])


def _merge_rows(v, name):
    """A packed [A, S, ...] as [A * S, 1, ...] over the same memory (row a * S + s at
    (a, s)), or None when the strides do not allow it."""
    p, dt, shape, st = _unpack(v)
    a, s = shape[0], shape[1]
    if s == 1:
        return v
    if a > 1 and s > 0 and st[0] != s * st[1]:
        return None
    return L.pack(p, dt, (a * s, 1) + shape[2:], (st[1], st[1]) + st[2:], name)


def _merge_lse(v, name):
    """A packed lse [B, H, S] as [B * S, H, 1] (row b * S + i at (b, :, i)), or None."""
    p, dt, (b, h, s), st = _unpack(v)
    if s == 1:
        return v
    if b > 1 and st[0] != s * st[2]:
        return None
    return L.pack(p, dt, (b * s, h, 1), (st[2], st[1], st[2]), name)


def _sparse_rows(indices, b, sq, slots):
    """indices [b, sq, topk] int32 -> (block_table [b * sq, max(topk, 1)], cache_seqlens
    [b * sq]) int32 of one-slot pages: row r = b * sq + i lists its entries >= 0 in order,
    -1 past them. Entries < -1 or >= slots are an IndexError."""
    _, dt, shape, _ = L.info(indices, "indices")  # device / type errors name indices
    if dt != L.I32:
        raise TypeError("indices: dtype %s, expected int32 (FlashMLA's)" % (indices.dtype,))
    if len(shape) != 3:
        raise ValueError("indices: shape %s, expected [batch_size, seq_len_q, topk]" % (tuple(shape),))
    if (int(shape[0]), int(shape[1])) != (b, sq):
        raise ValueError("indices: shape %s, expected [%d, %d, topk] (q's batch_size and seq_len_q)"
                         % (tuple(shape), b, sq))
    topk = int(shape[2])
    idx = np.asarray(indices.numpy() if L.is_torch(indices) else indices).reshape(b * sq, topk)
    bad = np.argwhere((idx < -1) | (idx >= slots))
    if len(bad):
        r, k = (int(x) for x in bad[0])
        raise IndexError("indices: entry [%d, %d, %d] = %d outside [-1, %d) (-1: invalid; else a cache slot "
                         "page * page_block_size + offset < num_blocks x page_block_size)"
                         % (r // max(sq, 1), r % max(sq, 1), k, int(idx[r, k]), slots))
    valid = idx >= 0
    if topk == 0:
        table = np.full((b * sq, 1), -1, np.int32)
    else:
        table = np.take_along_axis(idx, np.argsort(~valid, axis=1, kind="stable"), axis=1)
    return np.ascontiguousarray(table, np.int32), valid.sum(axis=1, dtype=np.int64).astype(np.int32)


def _sparse_cache(v, x, name):
    """The one-slot-page view [blocks * page, 1, (1,) E] of a packed ND cache x."""
    if v is None:
        return None
    if len(x.shape) not in (3, 4):
        raise ValueError("%s: shape %s, expected [num_blocks, page_block_size, (1,) E] with indices"
                         % (name, tuple(x.shape)))
    m = _merge_rows(v, name)
    if m is None:
        _, _, shape, st = _unpack(v)
        raise ValueError("%s: block stride %d is not page_block_size (%d) x the slot stride (%d): indices "
                         "address the cache by slot (page * page_block_size + offset) and need its pages "
                         "contiguous, one after another (vLLM's layout)" % (name, st[0], shape[1], st[1]))
    return m


def _flash_mla_sparse(indices, q, kc, pc, k_cache, k_pe_cache, out, lse, dl, causal, nz):
    """The arguments of the lk_mla_decode call of a sparse decode: the views (out, lse, q,
    kv_c_cache, k_pe_cache, block_table, cache_seqlens), the arrays they point into that
    must outlive the call, and finish(), which copies the results into out / lse where
    they could not be viewed (after a successful call). Every check is made here, before
    anything is written."""
    if causal:
        raise ValueError("causal: must be False with indices (each query token attends exactly to its indices)")
    if nz:
        raise ValueError("kv_layout: 'NZ': indices need kv_layout 'ND' (the cache is addressed by slot)")
    b, sq, h = (int(n) for n in q.shape[:3])
    if tuple(out.shape) != (b, sq, h, dl):
        raise ValueError("out: shape %s, expected [%d, %d, %d, %d]" % (tuple(out.shape), b, sq, h, dl))
    if tuple(lse.shape) != (b, h, sq):
        raise ValueError("softmax_lse: shape %s, expected [%d, %d, %d]" % (tuple(lse.shape), b, h, sq))
    if k_pe_cache is not None and tuple(k_pe_cache.shape[:2]) != tuple(k_cache.shape[:2]):
        raise ValueError("k_pe_cache: pages %s differ from k_cache's %s"
                         % (tuple(k_pe_cache.shape[:2]), tuple(k_cache.shape[:2])))
    kc1, pc1 = _sparse_cache(kc, k_cache, "k_cache"), _sparse_cache(pc, k_pe_cache, "k_pe_cache")
    slots = int(k_cache.shape[0]) * int(k_cache.shape[1])
    table, lens = _sparse_rows(indices, b, sq, slots)
    qc = q
    qv = _merge_rows(_view(q, "q"), "q")
    if qv is None:  # a strided q: its rows copied together
        qc = q.contiguous() if L.is_torch(q) else np.ascontiguousarray(q)
        qv = _merge_rows(_view(qc, "q"), "q")
    ov, lv = _merge_rows(_out(out, "out"), "out"), _merge_lse(_out(lse, "softmax_lse"), "softmax_lse")
    if lv is None and L.info(lse, "softmax_lse")[1] != L.F32:
        raise TypeError("softmax_lse: dtype %s, expected float32" % (lse.dtype,))
    tmp_o = _empty(out, (b * sq, 1, h, dl)) if ov is None else None
    tmp_l = _empty(lse, (b * sq, h, 1), f32=True) if lv is None else None
    if tmp_o is not None:
        ov = _view(tmp_o, "out")
    if tmp_l is not None:
        lv = _view(tmp_l, "softmax_lse")

    def finish():
        if tmp_o is not None:
            if L.is_torch(out):
                out.copy_(tmp_o.view(b, sq, h, dl))
            else:
                out[...] = tmp_o.reshape(b, sq, h, dl)
        if tmp_l is not None:
            if L.is_torch(lse):
                lse.copy_(tmp_l.view(b, sq, h).permute(0, 2, 1))
            else:
                lse[...] = tmp_l.reshape(b, sq, h).transpose(0, 2, 1)

    return (ov, lv, qv, kc1, pc1, _view(table, "block_table"), _view(lens, "cache_seqlens")), (table, lens, qc), finish


def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                           num_splits, softmax_scale=None, causal=False, descale_q=None, descale_k=None,
                           is_fp8_kvcache=False, indices=None, *, out=None, softmax_lse=None, kv_layout="ND",
                           k_pe_cache=None, kv_cache_dtype="auto"):
    """FlashMLA's decode: absorbed MLA attention in latent space over the paged latent
    cache, every head sharing each entry (K = the entry, V = its first head_dim_v dims).
    q [B, s_q, H, Dl + Dr] (q_nope W_UK | q_rope); k_cache [blocks, page, 1, Dl + Dr]
    (FlashMLA's layout; also [blocks, page, Dl + Dr], or NZ physical [blocks,
    (Dl + Dr)/16, page, 16] with kv_layout='NZ'; with k_pe_cache: the [.., Dl] part,
    k_pe_cache the [.., Dr] part); block_table [B, max_pages] and cache_seqlens [B]
    int32/int64; head_dim_v = Dl; tile_scheduler_metadata, num_splits from
    get_mla_metadata (None: planned here); softmax_scale default q.shape[-1] ** -0.5;
    causal for s_q > 1 (query i sees keys < cache_seqlens - s_q + i + 1). Returns
    (out [B, s_q, H, Dl] like q, softmax_lse [B, H, s_q] f32), allocated when not given.
    Entries past cache_seqlens are never read (they may hold NaN); a request with 0
    cached tokens gives zeros and lse -inf. Results are bitwise identical for any thread
    count.
    fp8 latent caches (FlashMLA's fp8 path): k_cache (and k_pe_cache) as torch
    float8_e4m3fn / float8_e5m2 tensors, ml_dtypes arrays, or uint8 buffers with
    kv_cache_dtype 'fp8' / 'fp8_e4m3' / 'fp8_e5m2' (vLLM's names) or is_fp8_kvcache=True
    (e4m3); NZ fp8 caches have 32-wide tiles [blocks, (Dl + Dr)/32, page, 32]. A typed
    cache must agree: of the fp8 kv_cache_dtype's format, and an fp8 one with
    is_fp8_kvcache=True (TypeError otherwise). descale_k (a number or a one-element
    tensor; default 1): an element c stands for c * descale_k, dequantized in the
    kernel's registers; descale_q multiplies the scores (q's dequantization scale; q
    itself is f32/f16/bf16); both finite and > 0 (ValueError naming them).
    FlashMLA's "FP8 with scale" cache (DeepSeek-V3.2, vLLM's kv_cache_dtype 'fp8_ds_mla'):
    one record of E = Dl + Dl / 32 + 2 Dr bytes per token (Dl = head_dim_v, Dr =
    q.shape[-1] - Dl; 656 for 512 + 64): Dl e4m3 codes, Dl / 128 f32 scales (one per
    128-dim tile), Dr bf16 rope values (see concat_and_cache_mla); entry = f32(code) *
    its tile's scale, the rope dims as stored. k_cache is read so when
    kv_cache_dtype='fp8_ds_mla', or when is_fp8_kvcache=True (kv_cache_dtype 'auto') and
    k_cache is a 1-byte buffer (uint8, float8_e4m3fn, int8) whose last dim is E and not
    q's head dim (a last dim equal to q.shape[-1] keeps the per-tensor e4m3 meaning
    above). The record cache is [blocks, page, 1, E] or [blocks, page, E], kv_layout 'ND';
    k_pe_cache and descale_k must be None (ValueError naming them: the scales are in the
    records); descale_q still scales the scores. out and softmax_lse are bit for bit those
    of an f32 cache holding the entries' values, except with bf16 q and out on the
    avx512bf16 ISA (its bf16 dot products: each tile's scores scaled, P times the tile's
    scale rounded to bf16), within that path's bound of them (docs/numerics.md).
    Token-level sparse decode (FlashMLA's `indices`, DeepSeek-V3.2): indices int32
    [B, s_q, topk] lists for query token i of request b the cache slots it attends,
    page * page_block_size + offset (-1: skipped; a duplicate counts twice; < -1 or
    >= num_blocks * page_block_size: IndexError), shared by its heads, with causal=False
    (no mask), block_table and cache_seqlens unread (may be None), any cache form above in
    kv_layout 'ND' whose blocks lie page_block_size slots apart (ValueError otherwise), a
    token without a valid index getting zeros and lse -inf, and out / softmax_lse bit for
    bit those of the dense decode of one s_q = 1 request per query token over a cache
    holding its listed keys in order."""
    if kv_cache_dtype != _DS_NAME:
        lay = _layout(kv_layout)
    fp8_dt = _FP8_KV.get(kv_cache_dtype)
    if fp8_dt is None and kv_cache_dtype not in ("auto", _DS_NAME):
        raise ValueError("kv_cache_dtype: %r, expected 'auto', 'fp8', 'fp8_e4m3', 'fp8_e5m2' or 'fp8_ds_mla'"
                         % (kv_cache_dtype,))
    if len(q.shape) != 4:
        raise ValueError("q: shape %s, expected [batch, seq_len_q, num_heads, head_dim]" % (tuple(q.shape),))
    dl = int(head_dim_v)
    ds_e = _ds_record_bytes(dl, int(q.shape[-1]) - dl)
    ds = kv_cache_dtype == _DS_NAME or (
        is_fp8_kvcache and kv_cache_dtype == "auto" and _is_ds_bytes(k_cache) and len(k_cache.shape) >= 1
        and int(k_cache.shape[-1]) == ds_e != int(q.shape[-1]) and 0 < dl <= int(q.shape[-1]))
    if ds:
        _ds_nd_only(kv_layout, "kv_layout")
        for arg, name in ((k_pe_cache, "k_pe_cache"), (descale_k, "descale_k")):
            if arg is not None:
                raise ValueError("%s: must be None with an fp8_ds_mla cache (each record of k_cache holds its "
                                 "rope values and tile scales)" % name)
        kc, pc = _ds_view(k_cache, "k_cache"), None  # dtype first (TypeError naming k_cache)
        last = int(k_cache.shape[-1]) if len(k_cache.shape) else None
        if last != ds_e:
            raise ValueError("k_cache: last dim %s, expected E = Dl + Dl / 32 + 2 Dr = %d bytes for fp8_ds_mla records "
                             "(Dl = head_dim_v = %d, Dr = q.shape[-1] - Dl = %d)"
                             % (last, ds_e, dl, int(q.shape[-1]) - dl))
        lay = _DS_MLA
    # FlashMLA's descale_q / descale_k: None (1), a number or a one-element array / tensor
    k_scale = _scale_arg(descale_k, "descale_k", required=False, scalar=True)
    q_scale = _scale_arg(descale_q, "descale_q", required=False, scalar=True)
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    b, sq, h = q.shape[0], q.shape[1], q.shape[2]
    if out is None:
        out = _empty(q, (b, sq, h, head_dim_v))
    elif len(out.shape) != 4 or int(out.shape[-1]) != int(head_dim_v):
        raise ValueError("out: shape %s, expected [%d, %d, %d, head_dim_v = %d]"
                         % (tuple(out.shape), b, sq, h, int(head_dim_v)))
    if softmax_lse is None:
        softmax_lse = _empty(q, (b, h, sq), f32=True)
    split = 0
    if tile_scheduler_metadata is not None:
        split = int(tile_scheduler_metadata[0][0])
    params = L.mla_decode_params(softmax_scale * q_scale, 1 if causal else 0, lay, split, k_scale)
    if not ds:
        kc = _mla_cache_view(k_cache, "k_cache", fp8_dt, is_fp8_kvcache)
        pc = _mla_cache_view(k_pe_cache, "k_pe_cache", fp8_dt, is_fp8_kvcache)
    if indices is None:
        s = L.mla_decode(_out(out, "out"), _out(softmax_lse, "softmax_lse"), _view(q, "q"), kc, pc,
                         _view(block_table, "block_table"), _view(cache_seqlens, "cache_seqlens"), params)
    else:
        views, keep, finish = _flash_mla_sparse(indices, q, kc, pc, k_cache, k_pe_cache, out, softmax_lse, dl,
                                                causal, not ds and lay == L.LAYOUTS["NZ"])
        s = L.mla_decode(*views, params)
        if not s:
            finish()
        del keep
    if s:
        _raise_as(s, {"kv_c_cache": "k_cache", "lse": "softmax_lse", "params.scale": "softmax_scale * descale_q",
                      "params.k_scale": "descale_k",
                      "params.split_keys": "tile_scheduler_metadata[0][0] (split_keys)"})
    return out, softmax_lse


# ---------------------------------------------------------------- runtime


def set_num_threads(n):
    """Threads used by the operators; n <= 0 restores the default. Results never depend on it."""
    if not _is_int(n) or not -2**31 <= n < 2**31:
        raise ValueError("n: %r, expected an int (32-bit; <= 0: the default)" % (n,))
    L.set_num_threads(int(n))


def get_num_threads():
    return L.get_num_threads()


def isa():
    """Name of the instruction set in use: 'ref', 'avx2', 'avx512', 'avx512bf16', 'amx' (x86) or
    'neon' (aarch64)."""
    return L.isa_name(L.isa_current()).decode()


def best_isa():
    return L.isa_name(L.isa_best()).decode()


def set_isa(name):
    """Force an instruction set ('ref', 'avx2', 'avx512', 'avx512bf16', 'amx', 'neon' or 'best'); LlmkernError
    (LK_ERR_UNSUPPORTED) where this CPU lacks it."""
    if name == "best":
        code = L.isa_best()
    else:
        try:
            code = L.ISAS[name]
        except (KeyError, TypeError):
            raise ValueError("isa: %r, expected one of %s or 'best'" % (name, ", ".join(map(repr, L.ISAS)))) from None
    s = L.set_isa(code)
    if s:
        _raise(s)


def version():
    """Version of the loaded C library."""
    return L.version().decode()
