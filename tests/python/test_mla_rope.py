"""concat_and_cache_mla_rope_fused (vLLM's fused rotary + MLA latent cache write,
lk_concat_and_cache_mla_rope): vLLM's own test (tests/kernels/attention/test_cache.py::
test_concat_and_cache_mla_rope_fused) against a float rotation and a scattered cache;
the per-op-rounded numerics of vLLM's kernel within their rounding bound; bit for bit
rotary_embedding then concat_and_cache_mla on copies (NumPy and torch, 'auto' and fp8
caches, ND / NZ, one or two caches, partial rotary); padding slots and a padded
positions buffer; the torch.ops form (vLLM's schema, opcheck); errors that name the
argument and leave every buffer untouched.

Where this library and vLLM's CUDA kernel differ (none of these tests asserts vLLM's
side): vLLM leaves a padding token's (slot < 0) k_pe unrotated, this library rotates
every token's k_pe (test_padding_slots asserts the library's behaviour); vLLM rounds
each product of the rotation to the element dtype, this library rounds once from f32
(test_vllm_per_op_rounding bounds the difference)."""
import functools
import random

import numpy as np
import pytest

import llmkern as lk
from helpers import c_op_missing, rand, to_nz, usable_isas


@pytest.fixture(autouse=True)
def _need_op():
    if c_op_missing("concat_and_cache_mla_rope"):
        pytest.skip("lk_concat_and_cache_mla_rope is not in this libllmkern")


def cos_sin_np(rot, max_pos, dtype, base=10000.0):
    """vLLM's RotaryEmbedding cache in f32 ([cos | sin], freqs = outer(t, inv_freq)), cast to dtype."""
    inv = (1.0 / (np.float32(base) ** (np.arange(0, rot, 2, dtype=np.float32) / np.float32(rot)))).astype(np.float32)
    freqs = np.outer(np.arange(max_pos, dtype=np.float32), inv)
    return np.concatenate([np.cos(freqs), np.sin(freqs)], axis=1).astype(np.float32).astype(dtype)


def as_f64(x):
    if hasattr(x, "detach"):
        return x.detach().double().numpy()
    return np.asarray(x, np.float64)


def rope_f64(positions, x, cos_sin, is_neox):
    """x [T, H, D] (or [T, D]) rotated in float64 over its first cos_sin.shape[1] dims
    (vLLM's RotaryEmbedding.forward_native without its per-op rounding)."""
    x = as_f64(x).copy()
    flat = x.ndim == 2
    if flat:
        x = x[:, None, :]
    cs = as_f64(cos_sin)[np.asarray(positions)[:x.shape[0]]]
    half = cs.shape[1] // 2
    c, s = cs[:, None, :half], cs[:, None, half:]
    if is_neox:
        i, j = np.arange(half), np.arange(half) + half
    else:
        i, j = 2 * np.arange(half), 2 * np.arange(half) + 1
    a, b = x[..., i].copy(), x[..., j].copy()
    x[..., i], x[..., j] = a * c - b * s, b * c + a * s
    return x[:, 0] if flat else x


# ---------------------------------------------------------------- vLLM's test

# vLLM's tests/kernels/allclose_default.py
VLLM_ATOL = {"float16": 1e-3, "bfloat16": 1e-3, "float32": 1e-5}
VLLM_RTOL = {"float16": 1e-3, "bfloat16": 1.6e-2, "float32": 1.3e-6}


@functools.lru_cache(maxsize=None)
def _torch_cos_sin(rot, max_pos, dtype_name, base=10000.0):
    """vLLM's RotaryEmbedding._compute_cos_sin_cache in torch f32, then .to(dtype)."""
    import torch
    inv_freq = 1.0 / (base ** (torch.arange(0, rot, 2, dtype=torch.float) / rot))
    t = torch.arange(max_pos, dtype=torch.float)
    freqs = torch.einsum("i,j -> ij", t, inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(getattr(torch, dtype_name))


def _vllm_case(dtype_name, is_neox, seq_len, rot, heads, kv_cache_dtype, block_size, kv_lora_rank=512,
               num_blocks=64, max_position=8192, seed=0):
    import torch
    g = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, dtype_name)
    cs = _torch_cos_sin(rot, max_position, dtype_name)
    positions = torch.randint(0, max_position, (seq_len,), generator=g)
    query = torch.randn(seq_len, heads, rot, generator=g).to(dtype)
    key = torch.randn(seq_len, 1, rot + kv_lora_rank, generator=g).to(dtype)
    k_pe = torch.flatten(key[..., :rot], start_dim=1)  # [T, rot] and [T, 512]: views of one buffer
    kv_c = torch.flatten(key[..., rot:], start_dim=1)
    slots = torch.tensor(random.Random(seed).sample(range(num_blocks * block_size), seq_len), dtype=torch.long)
    cache = torch.zeros(num_blocks, block_size, kv_lora_rank + rot,
                        dtype=torch.uint8 if kv_cache_dtype == "fp8" else dtype)
    return positions, query, key, k_pe, kv_c, cs, slots, cache


def _untouched_zero(cache, got):
    """every entry of cache but the written ones (got, at distinct slots) is still 0"""
    import torch
    assert int(torch.count_nonzero(cache)) == int(torch.count_nonzero(got))


# 128 q heads (vLLM's value) with seq_len 42 and block_size 16; 4 heads elsewhere (time)
VLLM_GRID = [(dt, neox, sl, rot, kv, bs)
             for dt in ("float16", "bfloat16", "float32") for neox in (False, True) for sl in (11, 42)
             for rot in (64, 128) for kv in ("auto", "fp8") for bs in (16, 64, 256)]


@pytest.mark.parametrize("dtype,is_neox,seq_len,rot,kv_cache_dtype,block_size", VLLM_GRID)
def test_vllm_concat_and_cache_mla_rope_fused(dtype, is_neox, seq_len, rot, kv_cache_dtype, block_size):
    torch = pytest.importorskip("torch")
    kv_lora_rank, scale = 512, 0.1
    heads = 128 if seq_len == 42 and block_size == 16 else 4
    positions, query, key, k_pe, kv_c, cs, slots, kv_cache = _vllm_case(
        dtype, is_neox, seq_len, rot, heads, kv_cache_dtype, block_size, kv_lora_rank)
    tdt = getattr(torch, dtype)
    # the reference: a float rotation (rounded once to the dtype) and the scattered entries
    ref_q = torch.from_numpy(rope_f64(positions.numpy(), query, cs, is_neox)).to(tdt)
    ref_k = torch.from_numpy(rope_f64(positions.numpy(), k_pe, cs, is_neox)).to(tdt)
    ref_entries = torch.cat((kv_c, ref_k), -1)  # [T, kv_lora_rank + rot], the dtype
    kv_cache_scale = torch.tensor([scale], dtype=torch.float32)

    lk.concat_and_cache_mla_rope_fused(positions, query, k_pe, kv_c, cs, is_neox, slots, kv_cache,
                                       kv_cache_dtype, kv_cache_scale)

    blk, off = slots // block_size, slots % block_size
    got = kv_cache[blk, off]
    if kv_cache_dtype == "fp8":  # vLLM: both through convert_fp8 to f16, atol 0.001, rtol 0.1
        ref_codes = torch.empty_like(ref_entries, dtype=torch.uint8)
        lk.convert_fp8(ref_codes, ref_entries, scale, "fp8")
        result_temp = torch.empty_like(got, dtype=torch.float16)
        lk.convert_fp8(result_temp, got.contiguous(), scale, "fp8")
        expected_temp = torch.empty_like(ref_codes, dtype=torch.float16)
        lk.convert_fp8(expected_temp, ref_codes, scale, "fp8")
        torch.testing.assert_close(result_temp, expected_temp, atol=0.001, rtol=0.1)
    else:  # vLLM: assert_close(kv_cache, ref_kv_cache) at the dtype's default tolerance
        torch.testing.assert_close(got, ref_entries)
    _untouched_zero(kv_cache, got)
    torch.testing.assert_close(query, ref_q, atol=VLLM_ATOL[dtype], rtol=VLLM_RTOL[dtype])
    torch.testing.assert_close(k_pe, ref_k)  # k_pe is rotated in place (vLLM: slot >= 0 tokens)
    assert torch.equal(key[..., rot:].flatten(1), kv_c)  # kv_c, the other half of key's buffer, is read only


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("is_neox", [False, True])
def test_vllm_per_op_rounding(dtype, is_neox):
    """vLLM's kernel (and its forward_native reference) rounds x * cos, y * sin and their
    sum to the dtype; this library rounds once from f32. The two differ at most by those
    roundings: |got - vllm| <= eps * (|x cos| + |y sin|) + eps * |vllm| (+ a subnormal ulp)."""
    torch = pytest.importorskip("torch")
    positions, query, key, k_pe, kv_c, cs, slots, kv_cache = _vllm_case(dtype, is_neox, 42, 64, 16, "auto", 16)
    tdt = getattr(torch, dtype)

    def vllm_native(x):  # apply_rotary_emb_torch, in the dtype
        cos, sin = cs.index_select(0, positions).chunk(2, dim=-1)
        cos, sin = cos.unsqueeze(-2).to(x.dtype), sin.unsqueeze(-2).to(x.dtype)
        x1, x2 = torch.chunk(x, 2, dim=-1) if is_neox else (x[..., ::2], x[..., 1::2])
        o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
        if is_neox:
            return torch.cat((o1, o2), -1), torch.cat(((x1 * cos).abs() + (x2 * sin).abs(),
                                                       (x2 * cos).abs() + (x1 * sin).abs()), -1)
        return (torch.stack((o1, o2), -1).flatten(-2),
                torch.stack(((x1 * cos).abs() + (x2 * sin).abs(), (x2 * cos).abs() + (x1 * sin).abs()), -1).flatten(-2))

    want_q, prod_q = vllm_native(query)
    want_k, prod_k = vllm_native(k_pe.unsqueeze(1))
    lk.concat_and_cache_mla_rope_fused(positions, query, k_pe, kv_c, cs, is_neox, slots, kv_cache, "auto",
                                       torch.tensor([1.0]))
    eps = torch.finfo(tdt).eps
    for got, want, prod in ((query, want_q, prod_q), (k_pe, want_k.squeeze(1), prod_k.squeeze(1))):
        diff = (got.double() - want.double()).abs()
        bound = eps * prod.double() + eps * want.double().abs() + 2.0 ** -24
        assert bool((diff <= bound).all()), float((diff - bound).max())


# ---------------------------------------------------------------- the same as the two ops in turn


def _inputs(rng, dt, T=7, H=4, Dr=32, Dl=64, P=None, pdt=np.int64, max_pos=50):
    """q_pe [T, H, Dr] a column slice of a [T, H, Dn + Dr] q; k_pe / kv_c column slices of
    one [T, Dr + Dl] buffer (DeepSeek's kv_a split), positions [P >= T]."""
    q = rand(rng, (T, H, 16 + Dr), dt)
    kv = rand(rng, (T, Dl + Dr), dt)
    positions = rng.integers(0, max_pos, P or T).astype(pdt)
    return positions, q[..., 16:], kv[:, Dl:], kv[:, :Dl], q, kv


def _split_ops(positions, q_pe, k_pe, kv_c, cs, neox, slots, cache, kvd, scale, layout="ND", k_pe_cache=None):
    """rotary_embedding then concat_and_cache_mla (what the fused op replaces)."""
    T, Dr = k_pe.shape
    lk.rotary_embedding(positions[:T], q_pe, k_pe, Dr, cs, neox)
    lk.concat_and_cache_mla(kv_c, k_pe, cache, slots, kvd, scale, layout=layout, k_pe_cache=k_pe_cache)


def _copies(*xs):
    return [x.copy() for x in xs]


@pytest.mark.parametrize("kvd", ["auto", "fp8", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("dt", [np.float32, np.float16])
@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("layout", ["ND", "NZ"])
def test_numpy_matches_rotary_then_concat(rng, kvd, dt, neox, layout):
    T, H, Dr, Dl, NB, BS = 9, 4, 32, 64, 5, 4
    positions, q_pe, k_pe, kv_c, qbuf, kvbuf = _inputs(rng, dt, T, H, Dr, Dl, pdt=np.int32 if neox else np.int64)
    cs = cos_sin_np(24, 50, np.float32 if dt == np.float32 else np.float16)  # rot 24 < Dr: partial rotary
    slots = rng.permutation(NB * BS)[:T].astype(np.int64)
    slots[[2, 5]] = -1
    fp8 = kvd != "auto"
    nd = rng.integers(0, 120, (NB, BS, Dl + Dr)).astype(np.uint8 if fp8 else dt)
    cache = (np.ascontiguousarray(nd.reshape(NB, BS, (Dl + Dr) // 32, 32).transpose(0, 2, 1, 3)) if fp8
             else to_nz(nd)) if layout == "NZ" else nd
    scale = 0.07 if fp8 else None
    q2, kv2, cache2 = _copies(qbuf, kvbuf, cache)
    _split_ops(positions, q2[..., 16:], kv2[:, Dl:], kv2[:, :Dl], cs, neox, slots, cache2, kvd, scale, layout)
    q_nope, kv0 = qbuf[..., :16].copy(), kvbuf.copy()
    lk.concat_and_cache_mla_rope_fused(positions, q_pe, k_pe, kv_c, cs, neox, slots, cache, kvd, scale,
                                       layout=layout)
    assert np.array_equal(qbuf, q2) and np.array_equal(kvbuf, kv2)  # q_pe and k_pe rotated, bit for bit
    assert np.array_equal(cache, cache2)
    assert np.array_equal(qbuf[..., :16], q_nope) and np.array_equal(kv_c, kv0[:, :Dl])  # never written
    want = rope_f64(positions, kv0[:, Dl:], cs, neox)  # and the rotation is right
    np.testing.assert_allclose(as_f64(k_pe), want, rtol=2e-3, atol=2e-3)
    assert not np.array_equal(k_pe, kv0[:, Dl:])


@pytest.mark.parametrize("kvd", ["auto", "fp8"])
def test_two_caches_and_scale_forms(rng, kvd):
    """k_pe_cache (the latent and the rotary parts in two buffers); scale as a number, a
    NumPy scalar, a 0-d and a [1] array: one result"""
    T, H, Dr, Dl, NB, BS = 6, 2, 16, 32, 3, 4
    positions, q_pe, k_pe, kv_c, qbuf, kvbuf = _inputs(rng, np.float32, T, H, Dr, Dl)
    cs = cos_sin_np(Dr, 50, np.float32)
    slots = np.array([3, 0, 11, -1, 6, 7])
    cdt = np.uint8 if kvd == "fp8" else np.float16
    lat, pe = np.zeros((NB, BS, Dl), cdt), np.zeros((NB, BS, Dr), cdt)
    q2, kv2, lat2, pe2 = _copies(qbuf, kvbuf, lat, pe)
    _split_ops(positions, q2[..., 16:], kv2[:, Dl:], kv2[:, :Dl], cs, True, slots, lat2, kvd, 0.5, k_pe_cache=pe2)
    inputs = (qbuf.copy(), kvbuf.copy())
    for scale in (0.5, np.float32(0.5), np.array(0.5, np.float32), np.array([0.5], np.float32)):
        qb, kb = inputs[0].copy(), inputs[1].copy()
        lat[...], pe[...] = 0, 0
        lk.concat_and_cache_mla_rope_fused(positions, qb[..., 16:], kb[:, Dl:], kb[:, :Dl], cs, True, slots, lat, kvd,
                                           scale, k_pe_cache=pe)
        assert np.array_equal(qb, q2) and np.array_equal(kb, kv2)
        assert np.array_equal(lat, lat2) and np.array_equal(pe, pe2)
        assert pe.any() and lat.any()


def test_ml_dtypes_fp8_caches(rng):
    ml = pytest.importorskip("ml_dtypes")
    T, H, Dr, Dl, NB, BS = 5, 2, 32, 64, 2, 4
    positions, q_pe, k_pe, kv_c, qbuf, kvbuf = _inputs(rng, np.float16, T, H, Dr, Dl)
    cs = cos_sin_np(Dr, 50, np.float16)
    slots = np.array([1, 6, 2, 7, 0])
    for kvd, f8 in (("fp8_e4m3", ml.float8_e4m3fn), ("fp8_e5m2", ml.float8_e5m2)):
        qb, kb = qbuf.copy(), kvbuf.copy()
        u8 = np.zeros((NB, BS, Dl + Dr), np.uint8)
        _split_ops(positions, qb[..., 16:], kb[:, Dl:], kb[:, :Dl], cs, False, slots, u8, kvd, 0.25)
        typed = np.zeros((NB, BS, Dl + Dr), f8)
        qb2, kb2 = qbuf.copy(), kvbuf.copy()
        lk.concat_and_cache_mla_rope_fused(positions, qb2[..., 16:], kb2[:, Dl:], kb2[:, :Dl], cs, False, slots,
                                           typed, kvd, 0.25)
        assert np.array_equal(typed.view(np.uint8), u8) and np.array_equal(qb2, qb) and np.array_equal(kb2, kb)
        with pytest.raises(TypeError, match="kv_cache"):  # an e4m3 array passed as e5m2 (or the reverse)
            lk.concat_and_cache_mla_rope_fused(positions, q_pe, k_pe, kv_c, cs, False, slots, typed,
                                               "fp8_e5m2" if kvd == "fp8_e4m3" else "fp8", 0.25)


@pytest.mark.parametrize("kvd", ["auto", "fp8"])
def test_torch_bf16_matches_rotary_then_concat(kvd):
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(3)
    T, H, Dr, Dl, NB, BS = 10, 16, 64, 128, 4, 8
    q = torch.randn(T, H, 128 + Dr, generator=g).to(torch.bfloat16)
    kv = torch.randn(T, Dl + Dr, generator=g).to(torch.bfloat16)
    positions = torch.randint(0, 300, (T,), generator=g)
    cs = _torch_cos_sin(Dr, 300, "bfloat16")
    slots = torch.randperm(NB * BS, generator=g)[:T]
    cache = torch.zeros(NB, BS, Dl + Dr, dtype=torch.uint8 if kvd == "fp8" else torch.bfloat16)
    q0, kv0 = q.clone(), kv.clone()
    q2, kv2, cache2 = q.clone(), kv.clone(), cache.clone()
    scale = torch.tensor([0.3])
    lk.rotary_embedding(positions, q2[..., 128:], kv2[:, Dl:], Dr, cs, True)
    lk.concat_and_cache_mla(kv2[:, :Dl], kv2[:, Dl:], cache2, slots, kvd, scale)
    lk.concat_and_cache_mla_rope_fused(positions, q[..., 128:], kv[:, Dl:], kv[:, :Dl], cs, True, slots, cache, kvd,
                                       scale)
    assert torch.equal(q, q2) and torch.equal(kv, kv2) and torch.equal(cache, cache2)
    if kvd == "fp8":  # a float8 tensor cache is the same as a uint8 one
        f8 = torch.zeros(NB, BS, Dl + Dr, dtype=torch.float8_e4m3fn)
        q3, kv3 = q0.clone(), kv0.clone()
        lk.concat_and_cache_mla_rope_fused(positions, q3[..., 128:], kv3[:, Dl:], kv3[:, :Dl], cs, True, slots, f8,
                                           "fp8", 0.3)
        assert torch.equal(f8.view(torch.uint8), cache) and torch.equal(q3, q) and torch.equal(kv3, kv)


@pytest.mark.parametrize("kvd", ["auto", "fp8"])
def test_every_isa_and_thread_count(rng, kvd):
    """on every ISA and thread count: rotary_embedding then concat_and_cache_mla, bit for bit"""
    T, H, Dr, Dl, NB, BS = 33, 16, 64, 512, 8, 16
    positions, q_pe, k_pe, kv_c, qbuf, kvbuf = _inputs(rng, np.float16, T, H, Dr, Dl, max_pos=100)
    cs = cos_sin_np(48, 100, np.float16)
    slots = rng.permutation(NB * BS)[:T]
    slots[3] = -1
    cache0 = np.zeros((NB, BS, Dl + Dr), np.uint8 if kvd == "fp8" else np.float16)
    prev, nthr = lk.isa(), lk.get_num_threads()
    try:
        for name in usable_isas(lk):
            lk.set_isa(name)
            for n in (1, 0):
                lk.set_num_threads(n)
                q1, kv1, c1 = qbuf.copy(), kvbuf.copy(), cache0.copy()
                _split_ops(positions, q1[..., 16:], kv1[:, Dl:], kv1[:, :Dl], cs, True, slots, c1, kvd, 0.2)
                q2, kv2, c2 = qbuf.copy(), kvbuf.copy(), cache0.copy()
                lk.concat_and_cache_mla_rope_fused(positions, q2[..., 16:], kv2[:, Dl:], kv2[:, :Dl], cs, True, slots,
                                                   c2, kvd, 0.2)
                assert np.array_equal(q1, q2) and np.array_equal(kv1, kv2) and np.array_equal(c1, c2), (name, n)
                assert c2.any()
    finally:
        lk.set_isa(prev)
        lk.set_num_threads(nthr)


# ---------------------------------------------------------------- padding


@pytest.mark.parametrize("kvd", ["auto", "fp8"])
def test_padding_slots(rng, kvd):
    """slot -1 and tokens past slot_mapping's length (N < T): the cache is untouched there,
    while every token's q_pe and k_pe is rotated (vLLM's CUDA kernel leaves a slot < 0
    token's k_pe unrotated: not asserted here)"""
    T, H, Dr, Dl, NB, BS = 8, 3, 16, 32, 4, 4
    positions, q_pe, k_pe, kv_c, qbuf, kvbuf = _inputs(rng, np.float32, T, H, Dr, Dl)
    positions[:] = rng.integers(1, 50, T)  # no position 0 (the identity rotation)
    cs = cos_sin_np(Dr, 50, np.float32)
    slots = np.array([5, -1, 9, -1, 0, 14], np.int64)  # N = 6 < T = 8
    cdt = np.uint8 if kvd == "fp8" else np.float32
    cache = np.full((NB, BS, Dl + Dr), 77, cdt)
    want_q, want_k = rope_f64(positions, q_pe, cs, False), rope_f64(positions, k_pe, cs, False)
    kv_c0 = kv_c.copy()
    lk.concat_and_cache_mla_rope_fused(positions, q_pe, k_pe, kv_c, cs, False, slots, cache, kvd, 1.0)
    np.testing.assert_allclose(q_pe, want_q, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(k_pe, want_k, rtol=1e-5, atol=1e-5)  # tokens 1, 3, 6, 7 too
    written = {int(s) for s in slots if s >= 0}
    for s in range(NB * BS):
        entry = cache[s // BS, s % BS]
        if s not in written:
            assert np.all(entry == 77), s
    for t, s in enumerate(slots):
        if s >= 0:
            got = cache[s // BS, s % BS]
            want = np.concatenate([kv_c0[t], k_pe[t]])
            if kvd == "fp8":
                ml = pytest.importorskip("ml_dtypes")
                got = got.view(ml.float8_e4m3fn).astype(np.float32)
                want = want.astype(ml.float8_e4m3fn).astype(np.float32)
            assert np.array_equal(got, want), t


def test_positions_longer_than_tokens(rng):
    """a padded positions buffer (CUDA graphs): only its first T values are used; those
    past T are never looked at (out of range here)"""
    T, H, Dr, Dl = 5, 2, 16, 32
    positions, q_pe, k_pe, kv_c, qbuf, kvbuf = _inputs(rng, np.float32, T, H, Dr, Dl)
    cs = cos_sin_np(Dr, 50, np.float32)
    padded = np.concatenate([positions, [-1, 50, 10 ** 9]]).astype(np.int64)
    cache = np.zeros((2, 4, Dl + Dr), np.float32)
    slots = np.arange(T)
    q2, kv2, cache2 = _copies(qbuf, kvbuf, cache)
    lk.concat_and_cache_mla_rope_fused(positions, q2[..., 16:], kv2[:, Dl:], kv2[:, :Dl], cs, True, slots, cache2,
                                       "auto", None)
    lk.concat_and_cache_mla_rope_fused(padded, q_pe, k_pe, kv_c, cs, True, slots, cache, "auto", None)
    assert np.array_equal(qbuf, q2) and np.array_equal(kvbuf, kv2) and np.array_equal(cache, cache2)
    assert cache.any()
    with pytest.raises(lk.LlmkernError) as e:  # fewer positions than tokens
        lk.concat_and_cache_mla_rope_fused(positions[:T - 1], q_pe, k_pe, kv_c, cs, True, slots, cache, "auto", None)
    assert e.value.status == "LK_ERR_SHAPE" and "positions" in str(e.value)


def test_empty_batch():
    T, H, Dr, Dl = 0, 2, 16, 32
    q_pe, k_pe, kv_c = np.zeros((T, H, Dr), np.float32), np.zeros((T, Dr), np.float32), np.zeros((T, Dl), np.float32)
    cache = np.full((1, 4, Dl + Dr), 3.0, np.float32)
    lk.concat_and_cache_mla_rope_fused(np.zeros(4, np.int64), q_pe, k_pe, kv_c, cos_sin_np(Dr, 8, np.float32), True,
                                       np.zeros(0, np.int64), cache, "auto", None)
    assert np.all(cache == 3.0)


# ---------------------------------------------------------------- torch.ops


VLLM_SCHEMA = ("concat_and_cache_mla_rope_fused(Tensor positions, Tensor! q_pe, Tensor! k_pe, Tensor kv_c, "
               "Tensor cos_sin_cache, bool is_neox, Tensor slot_mapping, Tensor! kv_cache, str kv_cache_dtype, "
               "Tensor kv_cache_scale) -> ()")


def _lkt():
    torch = pytest.importorskip("torch")
    import llmkern.torch as lkt  # noqa: F401  (registers torch.ops.llmkern)
    return torch, lkt


def test_torch_op_schema_as_vllm():
    torch, lkt = _lkt()
    assert "concat_and_cache_mla_rope_fused" in lkt.OPS

    def args(schema):
        return [(a.name, str(a.type), bool(a.alias_info and a.alias_info.is_write), a.default_value)
                for a in schema.arguments], [str(r.type) for r in schema.returns]

    got = torch.ops.llmkern.concat_and_cache_mla_rope_fused.default._schema
    assert args(got) == args(torch._C.parse_schema(VLLM_SCHEMA))


@pytest.mark.parametrize("kvd", ["auto", "fp8"])
def test_torch_op_matches_binding(kvd):
    torch, _ = _lkt()
    positions, query, key, k_pe, kv_c, cs, slots, cache = _vllm_case("bfloat16", True, 11, 64, 16, kvd, 16)
    scale = torch.tensor([0.1], dtype=torch.float32)
    q2, key2, cache2 = query.clone(), key.clone(), cache.clone()
    # vLLM's call, positional, as model code makes it through torch.ops._C_cache_ops
    torch.ops.llmkern.concat_and_cache_mla_rope_fused(positions, query, k_pe, kv_c, cs, True, slots, cache, kvd, scale)
    lk.concat_and_cache_mla_rope_fused(positions, q2, key2[..., :64].flatten(1), key2[..., 64:].flatten(1), cs, True,
                                       slots, cache2, kvd, scale)
    assert torch.equal(query, q2) and torch.equal(key, key2) and torch.equal(cache, cache2)
    assert bool(cache.ne(0).any())


@pytest.mark.parametrize("kvd", ["auto", "fp8"])
def test_torch_opcheck(kvd):
    torch, _ = _lkt()
    positions, query, key, k_pe, kv_c, cs, slots, cache = _vllm_case("float32", False, 5, 64, 4, kvd, 16,
                                                                       kv_lora_rank=64, num_blocks=4)
    torch.library.opcheck(torch.ops.llmkern.concat_and_cache_mla_rope_fused.default,
                          (positions, query, k_pe, kv_c, cs, False, slots, cache, kvd, torch.tensor([0.1])),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))


def test_torch_op_compiles():
    torch, _ = _lkt()

    def f(positions, q_pe, k_pe, kv_c, cs, slots, cache, scale):
        torch.ops.llmkern.concat_and_cache_mla_rope_fused(positions, q_pe, k_pe, kv_c, cs, True, slots, cache, "fp8",
                                                          scale)
        return q_pe * 2

    positions, query, key, k_pe, kv_c, cs, slots, cache = _vllm_case("float32", True, 6, 64, 4, "fp8", 16,
                                                                       kv_lora_rank=64, num_blocks=4)
    args = (positions, query, k_pe, kv_c, cs, slots, cache, torch.tensor([0.1]))
    eager = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    want = f(*eager)
    got = torch.compile(f, fullgraph=True, backend="eager")(*args)
    assert torch.equal(got, want) and torch.equal(cache, eager[6]) and torch.equal(query, eager[1])


# ---------------------------------------------------------------- errors: named, nothing written


class _Case:
    """numpy buffers of one call and a snapshot of every buffer the call may write"""

    def __init__(self, rng):
        T, H, Dr, Dl, NB, BS = 4, 2, 16, 32, 2, 4
        self.positions, self.q_pe, self.k_pe, self.kv_c, self.qbuf, self.kvbuf = _inputs(rng, np.float32, T, H, Dr,
                                                                                         Dl, max_pos=20)
        self.cs = cos_sin_np(Dr, 20, np.float32)
        self.slots = np.array([0, 5, -1, 2])
        self.cache = np.full((NB, BS, Dl + Dr), 9.0, np.float32)
        self.u8 = np.full((NB, BS, Dl + Dr), 9, np.uint8)
        self.saved = _copies(self.qbuf, self.kvbuf, self.cache, self.u8)

    def call(self, **kw):
        a = dict(positions=self.positions, q_pe=self.q_pe, k_pe=self.k_pe, kv_c=self.kv_c,
                 rope_cos_sin_cache=self.cs, rope_is_neox=True, kv_cache_slot_mapping=self.slots,
                 kv_cache=self.cache, kv_cache_dtype="auto", kv_cache_quant_scale=None)
        a.update(kw)
        lk.concat_and_cache_mla_rope_fused(**a)

    def untouched(self):
        return all(np.array_equal(a, b) for a, b in zip((self.qbuf, self.kvbuf, self.cache, self.u8), self.saved))


def _fails(c, exc, match, status=None, **kw):
    with pytest.raises(exc, match=match) as e:
        c.call(**kw)
    if status is not None:
        assert e.value.status == status, str(e.value)
    assert c.untouched(), "a failed call wrote a buffer (%s)" % e.value


def test_errors_kv_cache_dtype_and_scale(rng):
    c = _Case(rng)
    _fails(c, NotImplementedError, "kv_cache_dtype", kv_cache_dtype="int8")
    _fails(c, NotImplementedError, "kv_cache_dtype", kv_cache_dtype="fp8_ds_mla", kv_cache=c.u8,
           kv_cache_quant_scale=1.0)
    _fails(c, ValueError, "kv_cache_quant_scale: required", kv_cache_dtype="fp8", kv_cache=c.u8)
    for bad in (0.0, -1.0, float("nan"), float("inf"), np.array([0.0], np.float32)):
        _fails(c, lk.LlmkernError, r"^lk_concat_and_cache_mla_rope: kv_cache_quant_scale", "LK_ERR_VALUE",
               kv_cache_dtype="fp8", kv_cache=c.u8, kv_cache_quant_scale=bad)
    _fails(c, lk.LlmkernError, "kv_cache_quant_scale", kv_cache_dtype="fp8", kv_cache=c.u8,
           kv_cache_quant_scale=np.ones(2, np.float32))  # per tensor only
    _fails(c, lk.LlmkernError, "kv_cache_quant_scale", "LK_ERR_DTYPE", kv_cache_dtype="fp8", kv_cache=c.u8,
           kv_cache_quant_scale=np.ones(1, np.float64).astype(np.float16))
    # 'auto': the scale is ignored but must be one vLLM could pass
    _fails(c, ValueError, "kv_cache_quant_scale", kv_cache_quant_scale=np.ones(3, np.float32))
    # 'auto' takes f32/f16/bf16 caches; fp8 ones need an fp8 kv_cache_dtype
    _fails(c, TypeError, "kv_cache", kv_cache=c.u8)
    _fails(c, TypeError, "kv_cache", kv_cache_dtype="fp8", kv_cache_quant_scale=1.0)  # f32 cache with 'fp8'
    _fails(c, ValueError, "layout", layout="HND")
    ml = pytest.importorskip("ml_dtypes")
    f8 = np.zeros(c.cache.shape, ml.float8_e4m3fn)
    _fails(c, lk.LlmkernError, "kv_cache: dtype float8_e4m3fn", "LK_ERR_DTYPE", kv_cache=f8)
    assert not f8.view(np.uint8).any()


def test_errors_positions_slots_and_shapes(rng):
    c = _Case(rng)
    for bad in (20, -1):  # positions in [0, max_pos)
        pos = c.positions.copy()
        pos[2] = bad
        _fails(c, lk.LlmkernError, r"^lk_concat_and_cache_mla_rope: positions", "LK_ERR_INDEX", positions=pos)
        _fails(c, lk.LlmkernError, "positions", "LK_ERR_INDEX", positions=pos, kv_cache_dtype="fp8", kv_cache=c.u8,
               kv_cache_quant_scale=0.5)
    _fails(c, lk.LlmkernError, "positions", positions=c.positions.astype(np.float32))
    # a slot past the cache: nothing rotated either (every check before any store)
    _fails(c, lk.LlmkernError, r"kv_cache_slot_mapping", "LK_ERR_INDEX", kv_cache_slot_mapping=np.array([0, 8, 1, 2]))
    _fails(c, lk.LlmkernError, r"kv_cache_slot_mapping", kv_cache_slot_mapping=np.arange(5))  # N > T
    _fails(c, lk.LlmkernError, "rope_cos_sin_cache", "LK_ERR_SHAPE", rope_cos_sin_cache=cos_sin_np(18, 20, np.float32))
    _fails(c, lk.LlmkernError, "rope_cos_sin_cache", rope_cos_sin_cache=np.zeros((20, 15), np.float32))
    _fails(c, lk.LlmkernError, "kv_cache: shape", "LK_ERR_SHAPE", kv_cache=np.zeros((2, 4, 47), np.float32))
    _fails(c, lk.LlmkernError, "k_pe: shape", "LK_ERR_SHAPE", k_pe=c.kvbuf[:, :8],  # Dr 8, q_pe's 16
           kv_cache=np.zeros((2, 4, 40), np.float32), rope_cos_sin_cache=cos_sin_np(8, 20, np.float32))
    _fails(c, lk.LlmkernError, "kv_c", "LK_ERR_SHAPE", kv_c=c.kvbuf[:3, :32])
    _fails(c, lk.LlmkernError, "q_pe", q_pe=c.qbuf[..., 16:].reshape(4, 32))  # [T, Hq, Dr] only


def test_errors_overlaps_and_read_only(rng):
    c = _Case(rng)
    ro = c.q_pe.copy()
    ro.flags.writeable = False
    _fails(c, ValueError, "q_pe: the array is read-only", q_pe=ro)
    _fails(c, lk.LlmkernError, "q_pe", "LK_ERR_ALIAS", q_pe=c.kvbuf[:, :32].reshape(4, 2, 16))  # q_pe over kv_c
    _fails(c, lk.LlmkernError, "k_pe", "LK_ERR_ALIAS", k_pe=c.qbuf[:, 0, 16:])  # k_pe over q_pe
    big = np.zeros((4, 2, 48 * 4), np.float32)  # the cache over q_pe
    cache = big.reshape(-1)[:2 * 4 * 48].reshape(2, 4, 48)
    q_pe = big[..., 48 * 2:48 * 2 + 16]
    q_pe[...] = 1.0
    snap = big.copy()
    with pytest.raises(lk.LlmkernError) as e:
        c.call(q_pe=q_pe, kv_cache=cache)
    assert e.value.status == "LK_ERR_ALIAS" and "kv_cache" in str(e.value) and "q_pe" in str(e.value)
    assert np.array_equal(big, snap) and c.untouched()


def test_torch_errors_name_arguments():
    torch, _ = _lkt()
    positions, query, key, k_pe, kv_c, cs, slots, cache = _vllm_case("bfloat16", False, 6, 64, 4, "fp8", 16,
                                                                       kv_lora_rank=64, num_blocks=4)
    saved = [query.clone(), key.clone(), cache.clone()]

    def untouched():
        return all(torch.equal(a, b) for a, b in zip((query, key, cache), saved))

    op = torch.ops.llmkern.concat_and_cache_mla_rope_fused
    with pytest.raises(NotImplementedError, match="kv_cache_dtype"):
        op(positions, query, k_pe, kv_c, cs, False, slots, cache, "fp9", torch.tensor([0.1]))
    assert untouched()
    with pytest.raises(lk.LlmkernError, match="kv_cache_quant_scale") as e:
        op(positions, query, k_pe, kv_c, cs, False, slots, cache, "fp8", torch.tensor([-0.1]))
    assert e.value.status == "LK_ERR_VALUE" and untouched()
    bad = positions.clone()
    bad[0] = 8192
    with pytest.raises(lk.LlmkernError, match="positions") as e:
        op(bad, query, k_pe, kv_c, cs, False, slots, cache, "fp8", torch.tensor([0.1]))
    assert e.value.status == "LK_ERR_INDEX" and untouched()
    with pytest.raises(lk.LlmkernError, match="positions"):  # one-d positions
        op(positions.reshape(2, 3), query, k_pe, kv_c, cs, False, slots, cache, "fp8", torch.tensor([0.1]))
    assert untouched()
