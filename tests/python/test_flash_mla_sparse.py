"""flash_mla_with_kvcache's token-level sparse decode (FlashMLA's `indices` [B, s_q, topk]
int32, DeepSeek-V3.2): query token i of request b attends the cache slots
indices[b, i, :] (page * page_block_size + offset; -1 skipped; duplicates count twice),
shared by its heads, no causal mask, block_table / cache_seqlens unread. Checked bit for
bit against the dense decode of one s_q = 1 request per query token over a cache that
lists exactly those keys in that order (its unused slots NaN: never read), and against a
float64 reference: f32 / bf16 / f16 caches, per-tensor fp8 (is_fp8_kvcache, descale_k),
fp8_ds_mla records, two buffers (k_pe_cache); page sizes 1 / 16 / 64, s_q 1 and 2, rows
with -1 padding, duplicates and no valid index; NumPy and torch (the registered op too);
split-KV metadata; strided q / out / softmax_lse; errors that leave out as it was."""
import numpy as np
import pytest

import llmkern as lk
from helpers import close, f64, ref_mla, torch_or_skip

ml = pytest.importorskip("ml_dtypes")
E4, BF16 = ml.float8_e4m3fn, ml.bfloat16
NP_BITS = {1: np.uint8, 2: np.int16, 4: np.int32}


# ---------------------------------------------------------------- helpers


def is_torch(x):
    return hasattr(x, "detach")


def to_bits(x):
    """The raw bits of x as a NumPy integer array (NumPy or torch, any dtype)."""
    if is_torch(x):
        import torch
        return x.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[x.element_size()]).numpy()
    x = np.ascontiguousarray(x)
    return x.view(NP_BITS[x.itemsize])


def from_bits(b, like):
    """to_bits' inverse: bits b as an array / tensor of like's kind and dtype."""
    if is_torch(like):
        import torch
        return torch.from_numpy(np.ascontiguousarray(b)).view(like.dtype)
    return np.ascontiguousarray(b).view(like.dtype)


def slot_count(cache):
    return int(cache.shape[0]) * int(cache.shape[1])


def make_indices(rng, b, sq, topk, valid_slots, empty_row=True):
    """indices [b, sq, topk] int32: random slots of valid_slots with about a quarter -1
    anywhere in a row, a duplicated slot in row (0, 0), row (b - 1, sq - 1) all -1."""
    idx = rng.choice(valid_slots, (b, sq, topk)).astype(np.int32)
    idx[rng.random((b, sq, topk)) < 0.25] = -1
    x = idx[0, 0, 2] if idx[0, 0, 2] >= 0 else valid_slots[0]
    idx[0, 0, :3] = [x, -1, x]
    if empty_row:
        idx[b - 1, sq - 1] = -1
    return idx


def dense_twin(cache, idx, page=16, seed=7):
    """The dense equivalent: a cache of `page`-slot pages that lists each query row's valid
    keys (idx's entries >= 0, in order, duplicates repeated) in its pages, every other
    slot all-ones bits (NaN in every float form, fp8 codes and records included), and the
    block_table [B * s_q, max_pages] / cache_seqlens [B * s_q] of the rows."""
    bits = to_bits(cache)
    nb, pg = bits.shape[:2]
    tail = bits.shape[2:]
    flat = bits.reshape((nb * pg,) + tail)
    rows = np.asarray(idx).reshape(-1, idx.shape[-1])
    keys = [r[r >= 0] for r in rows]
    pages = [max(1, -(-len(k) // page)) for k in keys]
    nbd = sum(pages) + 1
    perm = np.random.default_rng(seed).permutation(nbd)
    d = np.full((nbd, page) + tail, 255 if bits.dtype == np.uint8 else -1, bits.dtype)
    table = np.full((len(rows), max(pages)), -1, np.int32)
    p0 = 0
    for r, k in enumerate(keys):
        table[r, :pages[r]] = perm[p0:p0 + pages[r]]
        p0 += pages[r]
        for j, s in enumerate(k):
            d[table[r, j // page], j % page] = flat[s]
    lens = np.array([len(k) for k in keys], np.int32)
    return from_bits(d, cache), table, lens


def rows_q(q):
    """q [B, s_q, H, E] as [B * s_q, 1, H, E] (one request per query token)."""
    b, sq, h, e = q.shape
    return q.reshape(b * sq, 1, h, e)


def back(o, lse, b, sq):
    """The dense call's out [B * s_q, 1, H, Dl] / lse [B * s_q, H, 1] as [B, s_q, H, Dl] /
    [B, H, s_q]."""
    h, dl = o.shape[2], o.shape[3]
    if is_torch(o):
        return o.reshape(b, sq, h, dl), lse.reshape(b, sq, h).permute(0, 2, 1)
    return o.reshape(b, sq, h, dl), lse.reshape(b, sq, h).transpose(0, 2, 1)


def ref_sparse(q, vals, idx, dl, scale):
    """float64 reference: q [B, s_q, H, E], vals [slots, E] the slots' values."""
    q64 = f64(q)
    b, sq, h, e = q64.shape
    rows = np.asarray(idx).reshape(b * sq, -1)
    ent = [vals[r[r >= 0]] for r in rows]
    o, lse = ref_mla(q64.reshape(b * sq, 1, h, e), ent, [len(x) for x in ent], dl, scale, False)
    return o.reshape(b, sq, h, dl), lse.reshape(b, sq, h).transpose(0, 2, 1)


def same_bits(a, b):
    assert np.array_equal(to_bits(a), to_bits(b))


def check_lse(got, want, tol=1e-5):
    got = got.numpy() if is_torch(got) else got
    assert np.array_equal(np.isneginf(got), np.isneginf(want))
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=tol, atol=tol)


def sparse_and_dense(q, cache, idx, dl, twin_page=16, meta=None, **kw):
    """The sparse call (block_table / cache_seqlens None) and the dense one over
    dense_twin, both as [B, s_q, H, Dl] / [B, H, s_q]; asserts they are bit for bit equal."""
    b, sq = q.shape[0], q.shape[1]
    o, lse = lk.flash_mla_with_kvcache(q, cache, None, None, dl, meta, None, indices=idx, **kw)
    twin, table, lens = dense_twin(cache, idx, twin_page)
    if is_torch(q):
        import torch
        table, lens = torch.from_numpy(table), torch.from_numpy(lens)
    wo, wl = back(*lk.flash_mla_with_kvcache(rows_q(q), twin, table, lens, dl, meta, None, **kw), b, sq)
    same_bits(o, wo)
    same_bits(lse, wl)
    return o, lse


def check_empty_row(o, lse):
    """Row (B - 1, s_q - 1) has no valid index: zeros and -inf."""
    if is_torch(o):
        o, lse = o.float().numpy(), lse.numpy()
    assert (np.asarray(o[-1, -1], np.float32) == 0).all() and np.isneginf(lse[-1, :, -1]).all()


def f8_values(rng, shape):
    """e4m3 codes (uint8) of values in [-2, 2]."""
    return rng.uniform(-2, 2, shape).astype(np.float32).astype(E4).view(np.uint8)


# ---------------------------------------------------------------- float caches


@pytest.mark.parametrize("cdt,qdt", [(np.float32, np.float32), (BF16, np.float16)])
@pytest.mark.parametrize("page", [1, 16, 64])
@pytest.mark.parametrize("sq", [1, 2])
def test_float_caches_numpy(rng, cdt, qdt, page, sq):
    B, H, DL, DR, topk = 3, 4, 64, 16, 24
    nb = -(-96 // page) + 1
    shape = (nb, page, 1, DL + DR) if page != 16 else (nb, page, DL + DR)  # both ND forms
    cache = rng.uniform(-1, 1, shape).astype(cdt)
    q = rng.uniform(-1, 1, (B, sq, H, DL + DR)).astype(qdt)
    idx = make_indices(rng, B, sq, topk, np.arange(slot_count(cache)))
    o, lse = sparse_and_dense(q, cache, idx, DL, softmax_scale=0.15)
    assert o.dtype == qdt and o.shape == (B, sq, H, DL) and lse.dtype == np.float32 and lse.shape == (B, H, sq)
    check_empty_row(o, lse)
    ro, rl = ref_sparse(q, f64(cache).reshape(slot_count(cache), -1), idx, DL, 0.15)
    close(o, ro)
    check_lse(lse, rl)
    # into the caller's buffers, default scale
    out, sl = np.full_like(o, 7), np.full_like(lse, 7)
    got = lk.flash_mla_with_kvcache(q, cache, None, None, DL, None, None, indices=idx, out=out, softmax_lse=sl)
    assert got[0] is out and got[1] is sl
    want = lk.flash_mla_with_kvcache(q, cache, None, None, DL, None, None, indices=idx)
    same_bits(out, want[0])
    same_bits(sl, want[1])


def test_duplicates_count_twice(rng):
    """A slot listed twice weighs twice: the reference over the keys with the repeat, and
    not the one without it."""
    H, DL, DR = 2, 32, 16
    cache = rng.uniform(-1, 1, (4, 4, 1, DL + DR)).astype(np.float32)
    q = rng.uniform(-2, 2, (1, 1, H, DL + DR)).astype(np.float32)
    idx = np.array([[[5, 9, -1, 5, 5]]], np.int32)
    o, lse = sparse_and_dense(q, cache, idx, DL)
    vals = f64(cache).reshape(16, -1)
    ro, rl = ref_sparse(q, vals, idx, DL, (DL + DR) ** -0.5)
    close(o, ro)
    check_lse(lse, rl)
    once, _ = ref_sparse(q, vals, np.array([[[5, 9]]], np.int32), DL, (DL + DR) ** -0.5)
    assert not np.allclose(o, once, rtol=1e-3, atol=1e-3)


def test_torch_bf16_and_op(rng):
    torch = torch_or_skip()
    import llmkern.torch  # noqa: F401
    B, sq, H, DL, DR, page, topk = 2, 2, 8, 128, 32, 64, 40
    g = torch.Generator().manual_seed(3)
    cache = (torch.rand(3, page, 1, DL + DR, generator=g) * 2 - 1).to(torch.bfloat16)
    q = (torch.rand(B, sq, H, DL + DR, generator=g) * 2 - 1).to(torch.bfloat16)
    idx = torch.from_numpy(make_indices(rng, B, sq, topk, np.arange(3 * page)))
    o, lse = sparse_and_dense(q, cache, idx, DL)
    assert o.dtype == torch.bfloat16 and o.shape == (B, sq, H, DL) and lse.dtype == torch.float32
    check_empty_row(o, lse)
    ro, rl = ref_sparse(q, f64(cache).reshape(3 * page, -1), idx.numpy(), DL, (DL + DR) ** -0.5)
    close(o, ro)
    check_lse(lse, rl, 1e-4)
    oo, ll = torch.ops.llmkern.flash_mla_with_kvcache(q, cache, None, None, DL, None, None, indices=idx)
    assert torch.equal(oo.view(torch.int16), o.view(torch.int16)) and torch.equal(ll, lse)
    # positional as vLLM's wrapper orders it (..., descale_q, descale_k, is_fp8_kvcache, indices)
    o2, l2 = lk.flash_mla_with_kvcache(q, cache, None, None, DL, None, None, None, False, None, None, False, idx)
    assert torch.equal(o2.view(torch.int16), o.view(torch.int16)) and torch.equal(l2, lse)


# ---------------------------------------------------------------- fp8 caches


@pytest.mark.parametrize("page", [1, 16, 64])
def test_fp8_per_tensor(rng, page):
    B, sq, H, DL, DR, topk = 2, 2, 4, 64, 16, 20
    nb = -(-80 // page) + 1
    codes = f8_values(rng, (nb, page, 1, DL + DR))
    q = rng.uniform(-1, 1, (B, sq, H, DL + DR)).astype(np.float32)
    idx = make_indices(rng, B, sq, topk, np.arange(slot_count(codes)))
    o, lse = sparse_and_dense(q, codes, idx, DL, is_fp8_kvcache=True, descale_k=0.5, softmax_scale=0.2)
    check_empty_row(o, lse)
    vals = codes.view(E4).astype(np.float64).reshape(slot_count(codes), -1) * 0.5
    ro, rl = ref_sparse(q, vals, idx, DL, 0.2)
    close(o, ro)
    check_lse(lse, rl)
    # the other spellings of the same cache give the same bits
    for c, kw in ((codes.view(E4), dict(descale_k=np.float32(0.5))),
                  (codes, dict(kv_cache_dtype="fp8", descale_k=0.5))):
        o2, l2 = lk.flash_mla_with_kvcache(q, c, None, None, DL, None, None, softmax_scale=0.2, indices=idx, **kw)
        same_bits(o2, o)
        same_bits(l2, lse)


def test_fp8_per_tensor_torch(rng):
    torch = torch_or_skip()
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("torch without float8")
    B, sq, H, DL, DR, page = 2, 1, 4, 64, 16, 16
    codes = torch.from_numpy(f8_values(rng, (6, page, 1, DL + DR))).view(torch.float8_e4m3fn)
    q = torch.from_numpy(rng.uniform(-1, 1, (B, sq, H, DL + DR)).astype(np.float32)).to(torch.bfloat16)
    idx = torch.from_numpy(make_indices(rng, B, sq, 32, np.arange(6 * page)))
    o, lse = sparse_and_dense(q, codes, idx, DL, is_fp8_kvcache=True, descale_k=torch.tensor([0.25]))
    check_empty_row(o, lse)
    vals = codes.view(torch.uint8).numpy().view(E4).astype(np.float64).reshape(6 * page, -1) * 0.25
    ro, rl = ref_sparse(q, vals, idx.numpy(), DL, (DL + DR) ** -0.5)
    close(o, ro)
    check_lse(lse, rl, 1e-4)


def ds_cache(rng, nb, page, dl, dr, written, torch=None):
    """A record cache [nb, page, E] (uint8, all-ones bytes) with `written` random slots
    written by concat_and_cache_mla(..., "fp8_ds_mla", None) from random bf16 kv_c / k_pe.
    Returns the cache and the written slots."""
    e = dl + dl // 32 + 2 * dr
    slots = np.sort(rng.permutation(nb * page)[:written]).astype(np.int64)
    kv_c = (rng.standard_normal((written, dl)) * 10.0 ** rng.uniform(-1, 1, (written, 1))).astype(BF16)
    k_pe = rng.standard_normal((written, dr)).astype(BF16)
    if torch is None:
        cache = np.full((nb, page, e), 255, np.uint8)
        lk.concat_and_cache_mla(kv_c, k_pe, cache, slots, "fp8_ds_mla", None)
    else:
        cache = torch.full((nb, page, e), 255, dtype=torch.uint8)
        tb = lambda a: torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)  # noqa: E731
        lk.concat_and_cache_mla(tb(kv_c), tb(k_pe), cache, torch.from_numpy(slots), "fp8_ds_mla", None)
    return cache, slots


def record_values(cache, dl):
    """[slots, Dl + Dr] float64 values of a record cache's slots (f32(code) * tile scale,
    rope as bf16)."""
    r = to_bits(cache).reshape(slot_count(cache), -1)
    codes = r[:, :dl].view(E4).astype(np.float32).reshape(len(r), dl // 128, 128)
    s = np.ascontiguousarray(r[:, dl:dl + dl // 32]).view(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        lat = (codes * s[:, :, None]).reshape(len(r), dl)
    rope = np.ascontiguousarray(r[:, dl + dl // 32:]).view(BF16).astype(np.float32)
    return np.concatenate([lat, rope], axis=1).astype(np.float64)


@pytest.mark.parametrize("page", [1, 16, 64])
@pytest.mark.parametrize("sq", [1, 2])
def test_ds_mla_records(rng, page, sq):
    B, H, DL, DR, topk = 2, 4, 128, 16, 24
    nb = -(-64 // page) + 1
    cache, written = ds_cache(rng, nb, page, DL, DR, 50)
    q = rng.uniform(-1, 1, (B, sq, H, DL + DR)).astype(np.float32)
    idx = make_indices(rng, B, sq, topk, written)  # unwritten slots (NaN records) are never listed
    forms = [(cache[:, :, None, :], dict(is_fp8_kvcache=True)), (cache, dict(kv_cache_dtype="fp8_ds_mla"))]
    res = [sparse_and_dense(q, c, idx, DL, softmax_scale=0.2, **kw) for c, kw in forms]
    o, lse = res[0]
    same_bits(res[1][0], o)
    same_bits(res[1][1], lse)
    check_empty_row(o, lse)
    vals = record_values(cache, DL)
    # bit for bit the sparse decode of an f32 cache of the values
    twin = np.where(np.isnan(vals), 0, vals).astype(np.float32).reshape(nb, page, 1, DL + DR)
    fo, fl = lk.flash_mla_with_kvcache(q, twin, None, None, DL, None, None, softmax_scale=0.2, indices=idx)
    same_bits(fo, o)
    same_bits(fl, lse)
    ro, rl = ref_sparse(q, vals, idx, DL, 0.2)
    close(o, ro)
    check_lse(lse, rl)


def test_ds_mla_records_torch_v32(rng):
    """DeepSeek-V3.2's shapes: 512 + 64 dims, 656-byte records, page 64, bf16 q."""
    torch = torch_or_skip()
    import llmkern.torch  # noqa: F401
    B, sq, H, DL, DR, page, topk = 2, 1, 16, 512, 64, 64, 64
    cache, written = ds_cache(rng, 4, page, DL, DR, 200, torch=torch)
    kc = cache[:, :, None, :]  # FlashMLA's [blocks, page, 1, 656]
    q = (torch.from_numpy(rng.uniform(-1, 1, (B, sq, H, DL + DR)).astype(np.float32))).to(torch.bfloat16)
    idx = torch.from_numpy(make_indices(rng, B, sq, topk, written))
    o, lse = sparse_and_dense(q, kc, idx, DL, is_fp8_kvcache=True)
    assert o.dtype == torch.bfloat16 and o.shape == (B, sq, H, DL) and lse.shape == (B, H, sq)
    check_empty_row(o, lse)
    ro, rl = ref_sparse(q, record_values(cache, DL), idx.numpy(), DL, (DL + DR) ** -0.5)
    close(o, ro)
    check_lse(lse, rl, 1e-4)
    oo, ll = torch.ops.llmkern.flash_mla_with_kvcache(q, kc, None, None, DL, None, None, is_fp8_kvcache=True,
                                                      indices=idx)
    assert torch.equal(oo.view(torch.int16), o.view(torch.int16)) and torch.equal(ll, lse)


# ---------------------------------------------------------------- other forms


def test_two_buffers(rng):
    B, sq, H, DL, DR, page = 2, 2, 4, 64, 16, 16
    kv = rng.uniform(-1, 1, (5, page, DL)).astype(np.float32)
    pe = rng.uniform(-1, 1, (5, page, DR)).astype(np.float32)
    q = rng.uniform(-1, 1, (B, sq, H, DL + DR)).astype(np.float32)
    idx = make_indices(rng, B, sq, 20, np.arange(5 * page))
    o, lse = lk.flash_mla_with_kvcache(q, kv, None, None, DL, None, None, indices=idx, k_pe_cache=pe)
    tkv, table, lens = dense_twin(kv, idx)
    tpe, _, _ = dense_twin(pe, idx)  # the same pages (one seed)
    wo, wl = back(*lk.flash_mla_with_kvcache(rows_q(q), tkv, table, lens, DL, None, None, k_pe_cache=tpe), B, sq)
    same_bits(o, wo)
    same_bits(lse, wl)
    vals = np.concatenate([kv.reshape(-1, DL), pe.reshape(-1, DR)], axis=1).astype(np.float64)
    ro, rl = ref_sparse(q, vals, idx, DL, (DL + DR) ** -0.5)
    close(o, ro)
    check_lse(lse, rl)


def test_split_metadata(rng):
    """Long rows in split-KV chunks: tile_scheduler_metadata's split as for the dense call;
    none given: planned over the rows' valid counts, as the dense call plans them."""
    B, sq, H, DL, DR, page, topk = 2, 2, 4, 64, 16, 16, 300
    cache = rng.uniform(-1, 1, (40, page, 1, DL + DR)).astype(np.float32)
    q = rng.uniform(-1, 1, (B, sq, H, DL + DR)).astype(np.float32)
    idx = make_indices(rng, B, sq, topk, np.arange(40 * page))
    meta = np.zeros((1, 8), np.int32)
    meta[0, 0] = 64
    o, lse = sparse_and_dense(q, cache, idx, DL, meta=meta)
    o2, l2 = sparse_and_dense(q, cache, idx, DL)
    ro, rl = ref_sparse(q, f64(cache).reshape(40 * page, -1), idx, DL, (DL + DR) ** -0.5)
    for a, b in ((o, lse), (o2, l2)):
        close(a, ro)
        check_lse(b, rl)


def test_strided_q_out_lse(rng):
    """q and out whose rows cannot be merged in place (copies), softmax_lse in FlashMLA's
    [B, H, s_q] layout (a copy for s_q > 1) and as a [B, s_q, H] buffer's permuted view (in
    place): the same bits; block_table / cache_seqlens given are ignored."""
    B, sq, H, DL, DR = 3, 2, 4, 32, 16
    cache = rng.uniform(-1, 1, (6, 16, 1, DL + DR)).astype(np.float32)
    idx = make_indices(rng, B, sq, 12, np.arange(96))
    wide = rng.uniform(-1, 1, (B, sq + 1, H, DL + DR)).astype(np.float32)
    q = wide[:, :sq]  # block stride (sq + 1) rows
    want_o, want_l = lk.flash_mla_with_kvcache(np.ascontiguousarray(q), cache, None, None, DL, None, None,
                                               indices=idx)
    obuf = np.full((B, sq, H, DL + 8), 7.0, np.float32)
    lbuf = np.full((B, sq, H), 7.0, np.float32)
    bt, sl = np.zeros((B, 1), np.int32), np.zeros(B, np.int32)
    o, lse = lk.flash_mla_with_kvcache(q, cache, bt, sl, DL, None, None, indices=idx, out=obuf[..., :DL],
                                       softmax_lse=lbuf.transpose(0, 2, 1))
    same_bits(o, want_o)
    same_bits(lse, want_l)
    assert (obuf[..., DL:] == 7.0).all()
    lse2 = np.full((B, H, sq), 7.0, np.float32)
    oo = np.empty((B, sq, H, DL), np.float32)
    lk.flash_mla_with_kvcache(q, cache, None, None, DL, None, None, indices=idx, out=oo, softmax_lse=lse2)
    same_bits(oo, want_o)
    same_bits(lse2, want_l)
    torch = pytest.importorskip("torch")
    tq = torch.from_numpy(wide)[:, :sq]
    to = torch.full((B, sq, H, DL + 8), 7.0)[..., :DL]
    tl = torch.full((B, H, sq), 7.0)
    lk.flash_mla_with_kvcache(tq, torch.from_numpy(cache), None, None, DL, None, None,
                              indices=torch.from_numpy(idx), out=to, softmax_lse=tl)
    same_bits(to, want_o)
    same_bits(tl, want_l)


def test_cache_strides(rng):
    """One-slot pages need each block page_block_size slots after the previous one."""
    H, DL, DR = 2, 32, 16
    big = rng.uniform(-1, 1, (4, 8, 1, DL + DR)).astype(np.float32)
    q = rng.uniform(-1, 1, (1, 1, H, DL + DR)).astype(np.float32)
    out = np.full((1, 1, H, DL), 7.0, np.float32)
    with pytest.raises(ValueError, match="k_cache: block stride 384 is not page_block_size \\(4\\)"):
        lk.flash_mla_with_kvcache(q, big[:, :4], None, None, DL, None, None, indices=np.zeros((1, 1, 2), np.int32),
                                  out=out)
    assert (out == 7.0).all()
    # page 1: any block stride; slot = block
    gap = big[:, :1]
    idx = np.array([[[3, 0, -1, 2]]], np.int32)
    o, _ = lk.flash_mla_with_kvcache(q, gap, None, None, DL, None, None, indices=idx)
    ro, _ = ref_sparse(q, f64(gap).reshape(4, -1), idx, DL, (DL + DR) ** -0.5)
    close(o, ro)
    # padded slots (slot stride past the entry): blocks still page x slot stride apart
    pad = np.full((4, 8, 1, DL + DR + 8), np.nan, np.float32)
    pad[..., :DL + DR] = big
    o2, _ = lk.flash_mla_with_kvcache(q, pad[..., :DL + DR], None, None, DL, None, None, indices=idx)
    same_bits(o2, lk.flash_mla_with_kvcache(q, big, None, None, DL, None, None, indices=idx)[0])


# ---------------------------------------------------------------- errors


def test_errors_leave_out_untouched(rng):
    B, sq, H, DL, DR, page = 2, 2, 2, 32, 16, 16
    cache = rng.uniform(-1, 1, (3, page, 1, DL + DR)).astype(np.float32)
    q = rng.uniform(-1, 1, (B, sq, H, DL + DR)).astype(np.float32)
    idx = make_indices(rng, B, sq, 8, np.arange(3 * page))
    out = np.full((B, sq, H, DL), 7.0, np.float32)
    lse = np.full((B, H, sq), 7.0, np.float32)

    def fails(exc, match, c=cache, ix=idx, **kw):
        with pytest.raises(exc, match=match):
            lk.flash_mla_with_kvcache(q, c, None, None, DL, None, None, indices=ix, out=out, softmax_lse=lse, **kw)
        assert (out == 7.0).all() and (lse == 7.0).all()

    fails(ValueError, "causal: must be False with indices", causal=True)
    fails(ValueError, "kv_layout: 'NZ': indices need kv_layout 'ND'", c=np.zeros((3, 48 // 16, page, 16), np.float32),
          kv_layout="NZ")
    fails(TypeError, "indices: dtype int64, expected int32", ix=idx.astype(np.int64))
    fails(TypeError, "indices: dtype float32, expected int32", ix=idx.astype(np.float32))
    fails(ValueError, r"indices: shape \(2, 16\), expected \[batch_size, seq_len_q, topk\]", ix=idx.reshape(B, -1))
    fails(ValueError, r"indices: shape \(1, 2, 8\), expected \[2, 2, topk\]", ix=idx[:1])
    fails(ValueError, r"indices: shape \(2, 1, 8\), expected \[2, 2, topk\]", ix=idx[:, :1])
    bad = idx.copy()
    bad[1, 0, 3] = 3 * page
    fails(IndexError, r"indices: entry \[1, 0, 3\] = 48 outside \[-1, 48\)", ix=bad)
    bad = idx.copy()
    bad[0, 1, 0] = -2
    fails(IndexError, r"indices: entry \[0, 1, 0\] = -2 outside", ix=bad)
    fails(ValueError, "k_cache: shape .* with indices", c=cache.reshape(3 * page, DL + DR))
    fails(ValueError, "k_pe_cache: pages", c=cache[..., :DL], k_pe_cache=np.zeros((6, 8, 1, DR), np.float32))
    fails(ValueError, "k_cache: block stride", c=np.zeros((3, 2 * page, 1, DL + DR), np.float32)[:, :page])
    with pytest.raises(ValueError, match="out: shape"):
        lk.flash_mla_with_kvcache(q, cache, None, None, DL, None, None, indices=idx, out=out[:, :1])
    with pytest.raises(ValueError, match="softmax_lse: shape"):
        lk.flash_mla_with_kvcache(q, cache, None, None, DL, None, None, indices=idx, out=out, softmax_lse=lse[:1])
    with pytest.raises(TypeError, match="softmax_lse: dtype float64"):
        lk.flash_mla_with_kvcache(q, cache, None, None, DL, None, None, indices=idx, out=out,
                                  softmax_lse=lse.astype(np.float64))
    ro = out.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="out: the array is read-only"):
        lk.flash_mla_with_kvcache(q, cache, None, None, DL, None, None, indices=idx, out=ro)
    assert (out == 7.0).all() and (lse == 7.0).all()


def test_get_mla_metadata_sparse_signature():
    """FlashMLA's newer planning call (num_heads_q, is_fp8_kvcache, topk): with topk the
    plan is that of the lengths min(cache_seqlens, topk)."""
    lens = np.array([9000, 300, 70000], np.int32)
    meta, splits = lk.get_mla_metadata(lens, 64, 1, 64, True, 2048)
    ref_meta, ref_splits = lk.get_mla_metadata(np.minimum(lens, 2048).astype(np.int32), 64, 1)
    assert np.array_equal(meta, ref_meta) and np.array_equal(splits, ref_splits)
    dense_meta, _ = lk.get_mla_metadata(lens, 64, 1)
    assert meta[0, 0] != dense_meta[0, 0]  # the clipped lengths plan differently
    with pytest.raises(ValueError, match="topk"):
        lk.get_mla_metadata(lens, 64, 1, topk=-1)
