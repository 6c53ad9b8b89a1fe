"""rotary_embedding (vLLM's 2-D [T, H * head_size] query/key), reshape_and_cache_flash,
concat_and_cache_mla and gather_cache against NumPy references."""
import numpy as np
import pytest

import llmkern as lk
from helpers import NP_DTYPES, c_op_missing, close, f64, from_nz, rand, to_nz, torch_or_skip


def cos_sin(max_pos, rot, dtype, base=10000.0):
    inv = 1.0 / base ** (np.arange(0, rot, 2) / rot)
    ang = np.arange(max_pos)[:, None] * inv[None, :]
    return np.concatenate([np.cos(ang), np.sin(ang)], axis=1).astype(dtype)


def ref_rope(pos, x, head_size, cache, neox):
    """x [T, H * head_size] or [T, H, head_size] -> rotated float64 copy, same shape."""
    shape = x.shape
    x = f64(x).reshape(shape[0], -1, head_size).copy()
    cache = f64(cache)
    rot = cache.shape[1]
    half = rot // 2
    c = cache[np.asarray(pos), :half][:, None, :]
    s = cache[np.asarray(pos), half:][:, None, :]
    if neox:
        i, j = np.arange(half), np.arange(half) + half
    else:
        i, j = np.arange(half) * 2, np.arange(half) * 2 + 1
    a, b = x[..., i].copy(), x[..., j].copy()
    x[..., i] = a * c - b * s
    x[..., j] = b * c + a * s
    return x.reshape(shape)


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("dt", NP_DTYPES)
@pytest.mark.parametrize("pdt", [np.int64, np.int32])
def test_rotary_2d_fused_qkv(rng, neox, dt, pdt):
    # vLLM: q, k are [T, H * D] column slices of one fused qkv buffer
    T, Hq, Hk, D, rot, P = 5, 4, 2, 16, 12, 40
    qkv = rand(rng, (T, (Hq + 2 * Hk) * D), dt)
    q, k, v = qkv[:, :Hq * D], qkv[:, Hq * D:(Hq + Hk) * D], qkv[:, (Hq + Hk) * D:]
    v0 = v.copy()
    pos = rng.integers(0, P, T).astype(pdt)
    cache = cos_sin(P, rot, np.float32)
    want_q, want_k = ref_rope(pos, q, D, cache, neox), ref_rope(pos, k, D, cache, neox)
    lk.rotary_embedding(pos, q, k, D, cache, neox)
    close(q, want_q)
    close(k, want_k)
    assert np.array_equal(v, v0)
    assert np.shares_memory(q, qkv)


def test_rotary_2d_element_strided(rng):
    # every other element of a wider buffer: the [T, H, D] view keeps the element stride
    T, H, D = 3, 2, 8
    buf = rand(rng, (T, 2 * H * D), np.float32)
    q = buf[:, ::2]
    other = buf[:, 1::2].copy()
    pos = np.array([1, 0, 2])
    cache = cos_sin(3, D, np.float32)
    want = ref_rope(pos, q, D, cache, False)
    lk.rotary_embedding(pos, q, None, D, cache, False)
    close(q, want)
    assert np.array_equal(buf[:, 1::2], other)


def test_rotary_3d_key_none_and_errors(rng):
    T, H, D = 3, 2, 8
    q = rand(rng, (T, H, D), np.float32)
    pos = np.array([0, 5, 2])
    cache = cos_sin(6, D, np.float16)
    want = ref_rope(pos, q, D, cache, True)
    lk.rotary_embedding(pos, q, None, D, cache, True)
    close(q, want)
    with pytest.raises(lk.LlmkernError) as e:
        lk.rotary_embedding(np.array([0, 6, 1]), q, None, D, cache, True)
    assert e.value.status == "LK_ERR_INDEX" and "positions" in str(e.value)
    with pytest.raises(ValueError, match="head_size"):
        lk.rotary_embedding(pos, q.reshape(T, H * D), None, 5, cache, True)
    with pytest.raises(ValueError, match="head_size"):
        lk.rotary_embedding(pos, q, None, D // 2, cache, True)
    # vLLM's batched [B, S, H * D] form is accepted (tests in test_compat.py)
    with pytest.raises(lk.LlmkernError) as e:  # positions [B, S] with q [B * S, H, D]
        lk.rotary_embedding(pos.reshape(1, T), q, None, D, cache, True)
    assert "lk_rotary_embedding" in str(e.value) and "positions" in str(e.value)


def test_rotary_torch_bf16(rng):
    torch = torch_or_skip()
    T, H, D = 4, 3, 32
    q = torch.from_numpy(rand(rng, (T, H * D), np.float32)).to(torch.bfloat16)
    k = torch.from_numpy(rand(rng, (T, H * D), np.float32)).to(torch.bfloat16)
    pos = torch.tensor([3, 0, 7, 1])
    cache = torch.from_numpy(cos_sin(8, D, np.float32))
    want_q, want_k = ref_rope(pos.numpy(), q, D, cache, True), ref_rope(pos.numpy(), k, D, cache, True)
    lk.rotary_embedding(pos, q, k, D, cache, True)
    close(q, want_q)
    close(k, want_k)


# ---------------------------------------------------------------- reshape_and_cache_flash


@pytest.mark.parametrize("dt", NP_DTYPES)
@pytest.mark.parametrize("cdt", NP_DTYPES)
def test_reshape_and_cache_flash(rng, dt, cdt):
    T, H, D, NB, BS = 6, 2, 8, 4, 3
    k = rand(rng, (T, H, D), dt)
    v = rand(rng, (T, H, D), dt)
    kc = np.full((NB, BS, H, D), 9.0, cdt)
    # value cache as an HND buffer passed as its [NB, BS, H, D] permuted view
    vc_hnd = np.full((NB, H, BS, D), 9.0, cdt)
    vc = vc_hnd.transpose(0, 2, 1, 3)
    slots = np.array([4, 0, -1, 11, 7], np.int64)  # N = 5 < T; -1 is padding
    want_k, want_v = f64(kc).copy(), f64(vc).copy()
    for t, s in enumerate(slots):
        if s >= 0:
            want_k[s // BS, s % BS] = f64(k[t]).astype(cdt)
            want_v[s // BS, s % BS] = f64(v[t]).astype(cdt)
    lk.reshape_and_cache_flash(k, v, kc, vc, slots, "auto", None, None)
    assert np.array_equal(f64(kc), want_k) and np.array_equal(f64(vc), want_v)


def test_reshape_and_cache_flash_args(rng):
    k = rand(rng, (2, 1, 4), np.float32)
    kc = np.zeros((2, 2, 1, 4), np.float32)
    vc = np.zeros((2, 2, 1, 4), np.float32)
    slots = np.array([1, 2], np.int32)
    with pytest.raises(NotImplementedError, match="kv_cache_dtype"):
        lk.reshape_and_cache_flash(k, k, kc, vc, slots, "int8", 1.0, 1.0)
    with pytest.raises(TypeError, match="key_cache"):  # fp8 wants uint8 or float8 caches
        lk.reshape_and_cache_flash(k, k, kc, vc, slots, "fp8", 1.0, 1.0)
    with pytest.raises(ValueError, match="k_scale"):  # 'auto' ignores scales of a valid shape only
        lk.reshape_and_cache_flash(k, k, kc, vc, slots, "auto", np.ones(3, np.float32), 1.0)
    with pytest.raises(ValueError, match="v_scale"):
        lk.reshape_and_cache_flash(k, k, kc, vc, slots, "auto", 1.0, np.ones((1, 2), np.float32))
    assert not kc.any() and not vc.any()
    lk.reshape_and_cache_flash(k, k, kc, vc, slots, "auto", np.array([1.0], np.float32), 1.0)
    assert np.array_equal(kc[0, 1], k[0]) and np.array_equal(vc[1, 0], k[1])
    with pytest.raises(lk.LlmkernError) as e:
        lk.reshape_and_cache_flash(k, k, kc, vc, np.array([0, 4]), "auto", None, None)
    assert e.value.status == "LK_ERR_INDEX" and "slot_mapping" in str(e.value)
    assert "lk_reshape_and_cache_flash" in str(e.value)


def test_reshape_and_cache_flash_torch(rng):
    torch = torch_or_skip()
    k = torch.from_numpy(rand(rng, (3, 2, 16), np.float32)).to(torch.bfloat16)
    kc = torch.zeros((2, 4, 2, 16), dtype=torch.bfloat16)
    vc = torch.zeros((2, 4, 2, 16), dtype=torch.float32)
    slots = torch.tensor([5, 0, 2])
    lk.reshape_and_cache_flash(k, k, kc, vc, slots, "auto", torch.tensor(1.0), torch.tensor(1.0))
    assert torch.equal(kc[1, 1], k[0]) and torch.equal(kc[0, 0], k[1]) and torch.equal(kc[0, 2], k[2])
    assert torch.equal(vc[1, 1], k[0].float())


# ---------------------------------------------------------------- MLA cache ops


def _mla_present(name):
    if c_op_missing(name):
        pytest.skip("%s is not in this libllmkern yet" % name)


def test_missing_c_function_raises_not_implemented():
    """A binding whose C function is not in the loaded library (an older build) raises
    NotImplementedError naming it, instead of failing at import."""
    from llmkern import _lib
    stub = _lib.cfunc("lk_no_such_operator", [])
    with pytest.raises(NotImplementedError, match="lk_no_such_operator"):
        stub()


@pytest.mark.parametrize("layout", ["ND", "NZ"])
@pytest.mark.parametrize("dt", NP_DTYPES)
def test_concat_and_cache_mla(rng, layout, dt):
    _mla_present("concat_and_cache_mla")
    T, DL, DR, NB, BS = 5, 32, 16, 3, 4
    kv_c = rand(rng, (T, DL), dt)
    k_pe = rand(rng, (T, DR), dt)
    slots = np.array([0, 9, -1, 6, 11], np.int64)
    nd = np.full((NB, BS, DL + DR), 5.0, dt)
    cache = to_nz(nd) if layout == "NZ" else nd
    want = nd.copy()
    for t, s in enumerate(slots):
        if s >= 0:
            want[s // BS, s % BS] = np.concatenate([kv_c[t], k_pe[t]])
    lk.concat_and_cache_mla(kv_c, k_pe, cache, slots, "auto", None, layout=layout)
    got = from_nz(cache, (DL + DR,)) if layout == "NZ" else cache
    assert np.array_equal(got, want)
    with pytest.raises(TypeError, match="kv_cache"):  # fp8 wants uint8 or float8 caches
        lk.concat_and_cache_mla(kv_c, k_pe, cache, slots, "fp8_e4m3", 1.0, layout=layout)
    with pytest.raises(ValueError, match="scale"):  # 'auto': a scale of one element, ignored
        lk.concat_and_cache_mla(kv_c, k_pe, cache, slots, "auto", np.ones(2, np.float32), layout=layout)
    with pytest.raises(ValueError, match="layout"):
        lk.concat_and_cache_mla(kv_c, k_pe, cache, slots, "auto", 1.0, layout="HND")


def test_concat_and_cache_mla_two_buffers_and_errors(rng):
    _mla_present("concat_and_cache_mla")
    kv_c = rand(rng, (3, 32), np.float32)
    k_pe = rand(rng, (3, 16), np.float32)
    lat = np.zeros((2, 4, 32), np.float16)
    pe = np.zeros((2, 4, 16), np.float32)
    slots = np.array([7, -1, 2], np.int32)
    lk.concat_and_cache_mla(kv_c, k_pe, lat, slots, "auto", None, k_pe_cache=pe)
    assert np.array_equal(lat[1, 3], kv_c[0].astype(np.float16)) and np.array_equal(pe[0, 2], k_pe[2])
    assert not lat[0, :2].any() and not pe[1, :3].any()
    with pytest.raises(lk.LlmkernError) as e:
        lk.concat_and_cache_mla(kv_c, k_pe, np.zeros((2, 4, 47), np.float32), slots, "auto", None)
    assert "lk_concat_and_cache_mla" in str(e.value) and e.value.status == "LK_ERR_SHAPE"
    with pytest.raises(lk.LlmkernError) as e:
        lk.concat_and_cache_mla(kv_c, k_pe, np.zeros((2, 4, 48), np.float32), np.array([0, 1, 8]), "auto", None)
    assert e.value.status == "LK_ERR_INDEX" and "slot_mapping" in str(e.value)


@pytest.mark.parametrize("layout", ["ND", "NZ"])
@pytest.mark.parametrize("dt", NP_DTYPES)
def test_gather_cache(rng, layout, dt):
    _mla_present("gather_cache")
    NB, BS, C = 6, 4, 48
    nd = rand(rng, (NB, BS, C), dt)
    cache = to_nz(nd) if layout == "NZ" else nd
    block_table = np.array([[5, 1, 0], [2, 0, 0], [3, 4, 0]], np.int32)
    seq_lens = np.array([7, 0, 5])
    cu = np.concatenate([[0], np.cumsum(seq_lens)]).astype(np.int32)
    dst = np.full((int(cu[-1]) + 2, C), -1.0, dt)  # vLLM's dst may be longer
    lk.gather_cache(cache, dst, block_table, cu, 3, layout=layout)
    want = np.concatenate([nd[block_table[b, np.arange(n) // BS], np.arange(n) % BS]
                           for b, n in enumerate(seq_lens)])
    assert np.array_equal(dst[:cu[-1]], want)
    assert np.all(dst[cu[-1]:] == -1.0)
    # seq_starts: token j of request b at position seq_starts[b] + j of its block table
    starts = np.array([3, 9, 6], np.int32)
    lens2 = np.array([5, 2, 4])
    cu2 = np.concatenate([[0], np.cumsum(lens2)]).astype(np.int32)
    dst2 = np.full((int(cu2[-1]), C), -1.0, dt)
    lk.gather_cache(cache, dst2, block_table, cu2, 3, seq_starts=starts, layout=layout)
    want = np.concatenate([nd[block_table[b, (starts[b] + np.arange(n)) // BS], (starts[b] + np.arange(n)) % BS]
                           for b, n in enumerate(lens2)])
    assert np.array_equal(dst2, want)
    dst2[...] = -1.0
    with pytest.raises(lk.LlmkernError) as e:  # start + len beyond the block table's 3 pages
        lk.gather_cache(cache, dst2, block_table, cu2, 3, seq_starts=np.array([3, 11, 6], np.int32), layout=layout)
    assert e.value.status == "LK_ERR_INDEX" and "seq_starts" in str(e.value)
    assert np.all(dst2 == -1.0)  # nothing written
    with pytest.raises(lk.LlmkernError, match="seq_starts"):  # vLLM's int32 only
        lk.gather_cache(cache, dst2, block_table, cu2, 3, seq_starts=starts.astype(np.int64), layout=layout)


def test_gather_cache_offset_cu_and_batch_size(rng):
    _mla_present("gather_cache")
    nd = rand(rng, (4, 2, 16), np.float32)
    block_table = np.array([[3, 2], [1, 0], [0, 0]], np.int32)
    cu = np.array([2, 5, 6, 99], np.int32)  # starts at 2; batch_size 2 ignores the rest
    dst = np.zeros((8, 16), np.float32)
    lk.gather_cache(nd, dst, block_table, cu, 2)
    want = np.concatenate([nd[[3, 3, 2], [0, 1, 0]], nd[[1], [0]]])
    assert np.array_equal(dst[2:6], want)
    assert not dst[:2].any() and not dst[6:].any()


def test_mla_cache_torch_bf16_nz(rng):
    torch = torch_or_skip()
    _mla_present("concat_and_cache_mla")
    _mla_present("gather_cache")
    T, DL, DR, NB, BS = 6, 32, 16, 3, 4
    kv_c = torch.from_numpy(rand(rng, (T, DL), np.float32)).to(torch.bfloat16)
    k_pe = torch.from_numpy(rand(rng, (T, DR), np.float32)).to(torch.bfloat16)
    cache = torch.zeros((NB, (DL + DR) // 16, BS, 16), dtype=torch.bfloat16)  # NZ physical
    slots = torch.tensor([4, 5, 6, 0, 1, 2])  # request 0: page 1 slots 0-2, request 1: page 0
    lk.concat_and_cache_mla(kv_c, k_pe, cache, slots, "auto", torch.tensor(1.0), layout="NZ")
    dst = torch.empty((T, DL + DR), dtype=torch.bfloat16)
    table = torch.tensor([[1], [0]], dtype=torch.int32)
    lk.gather_cache(cache, dst, table, torch.tensor([0, 3, 6], dtype=torch.int32), 2, layout="NZ")
    assert torch.equal(dst, torch.cat([kv_c, k_pe], dim=1))
