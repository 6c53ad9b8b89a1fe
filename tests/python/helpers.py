"""Helpers of the llmkern Python tests: dtypes, tolerances, float64 views of inputs, the
NZ page layout."""
import numpy as np
import pytest

# NumPy storage dtypes; bf16 is tested through torch
NP_DTYPES = [np.float32, np.float16]
# |got - ref| <= ATOL + RTOL * |ref| per output dtype (one rounding to the output dtype,
# plus f32 arithmetic)
TOL = {np.dtype(np.float32): (1e-5, 1e-5), np.dtype(np.float16): (2e-3, 2e-3)}
TORCH_TOL = {"float32": (1e-5, 1e-5), "float16": (2e-3, 2e-3), "bfloat16": (1.6e-2, 1.6e-2)}


def close(got, ref, scale=1.0):
    """Assert got (NumPy array or torch tensor) matches the float64 reference ref."""
    if hasattr(got, "detach"):  # torch
        name = str(got.dtype).replace("torch.", "")
        rtol, atol = TORCH_TOL[name]
        got = got.float().numpy()
    else:
        rtol, atol = TOL[got.dtype]
    np.testing.assert_allclose(np.asarray(got, np.float64), ref, rtol=rtol * scale,
                               atol=atol * scale)


def rand(rng, shape, dtype, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def f64(x):
    """float64 copy of the values as stored (NumPy array or torch tensor)."""
    if hasattr(x, "detach"):
        return x.detach().double().numpy()
    return np.asarray(x, np.float64)


def rope_ref(x, pos, cos, sin, interleaved):
    """x [n, H, D] as float64 rotated at positions pos [n] (flash-attention's rotary of the
    first 2 * cos.shape[1] dims; GPT-J pairs when interleaved, else NeoX)"""
    x = f64(x).copy()
    rot = 2 * cos.shape[1]
    c, s_ = f64(cos)[pos][:, None, :], f64(sin)[pos][:, None, :]
    if interleaved:
        a, b = x[..., 0:rot:2].copy(), x[..., 1:rot:2].copy()
        x[..., 0:rot:2], x[..., 1:rot:2] = a * c - b * s_, b * c + a * s_
    else:
        a, b = x[..., :rot // 2].copy(), x[..., rot // 2:rot].copy()
        x[..., :rot // 2], x[..., rot // 2:rot] = a * c - b * s_, b * c + a * s_
    return x


def to_nz(nd):
    """Logical ND page cache [num_blocks, block_size, C] (or [.., H, D]) -> the physical
    NZ buffer [num_blocks, C/16, block_size, 16] (SPEC: element c of slot s of page p at
    [p, c / 16, s, c % 16])."""
    nb, bs = nd.shape[:2]
    c = int(np.prod(nd.shape[2:]))
    return np.ascontiguousarray(nd.reshape(nb, bs, c // 16, 16).transpose(0, 2, 1, 3))


def from_nz(nz, entry_shape):
    nb, c16, bs, _ = nz.shape
    return nz.transpose(0, 2, 1, 3).reshape((nb, bs) + tuple(entry_shape))


def torch_or_skip():
    return pytest.importorskip("torch")


def c_op_missing(name):
    """True when the loaded libllmkern lacks the C function (its branch not merged yet)."""
    from llmkern import _lib
    return getattr(getattr(_lib, name), "missing", False)


def usable_isas(lk):
    """The ISAs lk.set_isa takes on this machine, ref first (x86: each needs the ones
    before it; aarch64: neon)."""
    chains = [["ref", "avx2", "avx512", "avx512bf16", "amx"], ["ref", "neon"]]
    chain = [c for c in chains if lk.best_isa() in c][0]
    return chain[:chain.index(lk.best_isa()) + 1]


def ref_mla(q, entries, lens, dl, scale, causal):
    """q [B, s_q, H, E] float64, entries[b] [len_b, E] -> out [B, s_q, H, Dl], lse [B, H, s_q]"""
    b_, sq, h, _ = q.shape
    out = np.zeros((b_, sq, h, dl))
    lse = np.full((b_, h, sq), -np.inf)
    for b in range(b_):
        for i in range(sq):
            lim = max(0, lens[b] - sq + i + 1) if causal else lens[b]
            if lim == 0:
                continue
            e = entries[b][:lim]
            s = q[b, i] @ e.T * scale  # [H, lim]
            m = s.max(axis=1, keepdims=True)
            p = np.exp(s - m)
            out[b, i] = p @ e[:, :dl] / p.sum(axis=1, keepdims=True)
            lse[b, :, i] = (m[:, 0] + np.log(p.sum(axis=1)))
    return out, lse
