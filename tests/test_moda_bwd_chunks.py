"""The key-major pass of the "tma" backward with its key tiles' rows cut into chunks
(`MoDAConfig.bwd_kv_chunk`, `kernel_bwd_tma.kv_chunk`, `_kv_kernel`'s CHUNK): out, lse and all
gradients against the fp64 reference at odd T, G in {1, 3, 8, 16}, L in {0, 1, 5}, B = 2, with
descriptor and pointer loads; the chunked pass against the unchunked one (dq and the depth
gradients bitwise, dk and dv to fp32 rounding: only the order of the sum changes); repeat calls
bitwise equal and the arrival counters back at 0; the rule that picks the chunk; the grid's
item count against a brute-force enumeration. The depth part as items of the key-major grid
(`bwd_depth_items`, `depth_item`): against the reference, against the depth part in the dq pass,
its rule. One GPU test: chunked and unchunked (with and without depth items) agree at T=1000, and
a CUDA graph replays the default.

CPU: the Triton interpreter (conftest sets TRITON_INTERPRET=1). Tolerances: helpers.TOLERANCE
(||err|| / ||ref||: fp32 1e-4, bf16 2e-2); chunked against unchunked 1e-6 in fp32.
"""
import pytest
import torch
from helpers import bwd_tma_passes, check_against_reference, graph_replayed, random_inputs, rel_err, small_tma_config

from moda_bench.kernels.launch import cdiv
from moda_bench.kernels.moda import MoDAConfig, moda_attention
from moda_bench.kernels.moda.triton import bwd_tma as bwd_mod
from moda_bench.kernels.moda.triton import interface as kernel_mod
from moda_bench.kernels.moda.validate import MoDAShape


def _bt(**kw):
    return small_tma_config(**dict(dict(bwd_kv_beside=0), **kw))  # two launches (one: test_moda_bwd_one)


def _moda_lse(*args, **kw):
    return moda_attention(*args, return_lse=True, **kw)


# (B, T, G, L, config): chunks of 1-3 key tiles (16 keys a tile)
CASES = [
    (2, 37, 8, 5, _bt(bwd_kv_chunk=1)),                                        # 3 chunks; the tile of 5 keys
    (2, 50, 16, 0, _bt(bwd_kv_chunk=2)),                                       # L=0; chunks of 2 tiles
    (1, 33, 1, 3, _bt(bwd_kv_chunk=1)),                                        # G=1: P=32 rows a step > 16 keys
    (2, 29, 3, 1, _bt(bwd_q_block_m=16, bwd_kv_block_m=16, bwd_kv_chunk=1)),   # G=3: padding rows; L=1
]


@pytest.mark.parametrize("B,T,G,L,cfg", CASES, ids=[f"T{c[1]}-G{c[2]}-L{c[3]}" for c in CASES])
def test_kv_chunks_against_reference(B, T, G, L, cfg):
    check_against_reference(_moda_lse, B, T, G * 2, 2, 32, L, torch.float32, seed=T + G, config=cfg)


@pytest.mark.parametrize("T,G,L,chunk", [(37, 8, 5, 16), (45, 2, 0, 32), (40, 16, 1, 48)])
@pytest.mark.parametrize("aligned", [True, False], ids=["descriptors", "pointers"])
def test_kv_chunks_match_unchunked(monkeypatch, T, G, L, chunk, aligned):
    """Chunked = unchunked: dq and the depth gradients bitwise (the dq pass is not touched), dk and
    dv to fp32 rounding; also with the rows' statistics computed in the key-major pass (beside)."""
    if not aligned:
        monkeypatch.setattr(kernel_mod, "aligned", lambda *t, **kw: False)
    run = bwd_tma_passes(T, G, L)
    ref = run(kv_chunk=0)
    for extra in ({}, {"beside": lambda main, side: (main(), side())}):
        got = run(kv_chunk=chunk, **extra)
        for name, a, b in zip(("dq", "dk", "dv", "dkd", "dvd"), ref, got):
            if a is None:
                assert b is None
            elif name in ("dk", "dv"):
                assert rel_err(b, a) < 1e-6, name
            else:
                assert torch.equal(a, b), name


@pytest.mark.parametrize("chunk,sub", [(16, 1), (0, 2)], ids=["chunks", "head-sub-groups"])
def test_kv_chunks_repeatable_and_counters_back_at_zero(monkeypatch, chunk, sub):
    """Repeat calls bitwise equal, counters back at 0: chunks of a tile's rows, and the head
    sub-groups of test_moda_bwd_sub.py (kv_sub, the same partials and counters)."""
    monkeypatch.setattr(bwd_mod, "_KV_COUNTERS", {})
    run = bwd_tma_passes(53, 8, 3, seed=5)
    first, second = run(kv_chunk=chunk, kv_sub=sub), run(kv_chunk=chunk, kv_sub=sub)
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    counters = [v for v in bwd_mod._KV_COUNTERS.values() if isinstance(v, torch.Tensor)]
    partials = [v for v in bwd_mod._KV_COUNTERS.values() if isinstance(v, tuple)]
    assert {c.dtype for c in counters} == {torch.int32} and len(partials) == 1  # both from the cache
    assert all(int(c.abs().sum()) == 0 for c in counters)


def test_scratch_one_buffer_a_stream_grown_to_fit():
    """`counters.scratch`: one buffer a (device, stream, dtype), grown to the largest size asked
    for; a smaller call gets a view of its first elements; a repeat call the same view."""
    from moda_bench.kernels.counters import scratch
    cache, dev = {}, torch.device("cpu")
    a = scratch(cache, dev, 10)
    b = scratch(cache, dev, 100)
    c = scratch(cache, dev, 50)
    assert (a.numel(), b.numel(), c.numel()) == (10, 100, 50) and len(cache) == 1
    assert c.data_ptr() == b.data_ptr() and scratch(cache, dev, 50) is c
    assert scratch(cache, dev, 7, torch.int32).dtype == torch.int32 and len(cache) == 2


def test_scratch_views_share_scratch_buffer_and_are_kept():
    """`counters.scratch_views`: views of the asked shapes end to end in the `scratch` buffer of the
    same cache (grown by its rule); a repeat call returns the same view objects."""
    from moda_bench.kernels.counters import scratch, scratch_views
    cache, dev = {}, torch.device("cpu")
    a, b = scratch_views(cache, dev, ((2, 3), (2, 3)))
    assert a.shape == b.shape == (2, 3) and b.data_ptr() == a.data_ptr() + 6 * 4
    again = scratch_views(cache, dev, ((2, 3), (2, 3)))
    assert again[0] is a and again[1] is b
    assert scratch(cache, dev, 12).data_ptr() == a.data_ptr()  # the one buffer of (device, stream, dtype)
    c, = scratch_views(cache, dev, ((5, 4),))
    assert c.shape == (5, 4) and scratch(cache, dev, 20).data_ptr() == c.data_ptr()


def test_kv_items_enumerate_every_tile_chunk_pair():
    """kv_items: one program per (key tile, chunk holding some of its rows), chunks of the rows of
    positions [c*chunk, (c+1)*chunk) from the tile's own chunk on."""
    for T, bn, chunk in [(37, 16, 16), (37, 16, 32), (1024, 64, 256), (1000, 64, 192), (4099, 64, 1024), (64, 64, 64)]:
        n_tiles = cdiv(T, bn)
        pairs = [(i, c) for i in range(n_tiles) for c in range(cdiv(T, chunk)) if c >= (i * bn) // chunk]
        assert bwd_mod.kv_items(T, bn, chunk) == (len(pairs), cdiv(T, chunk))
    assert bwd_mod.kv_items(1000, 64, 0) == (16, 1)


def test_kv_chunk_rule():
    """-1 cuts rows where the heaviest key tile's steps exceed KV_CHUNK_SLACK fair shares of the
    SMs' program slots (short T), into chunks of about a fair share (a multiple of the tile) and
    at least KV_CHUNK_MIN_STEPS steps;
    0 and n >= 1 decide alone; a chunk as long as T is no chunk; negative values are refused."""
    cfg = MoDAConfig(bwd_kv_block_n=64, bwd_kv_block_m=64)
    c1024 = bwd_mod.kv_chunk(cfg, 1, 1024, 8, 8, 132)
    assert 0 < c1024 < 1024 and c1024 % 64 == 0
    n_tiles = 1024 // 64
    steps = 8 * sum(cdiv(1024 - 64 * i, 8) for i in range(n_tiles))
    fair = steps / (132 * bwd_mod.KV_CHUNK_SLOTS)
    assert abs(c1024 / 8 - fair) <= 64 / 8  # about a fair share of steps
    assert bwd_mod.kv_chunk(cfg, 1, 16384, 8, 8, 132) == 0     # long T: the tiles balance themselves
    assert bwd_mod.kv_chunk(cfg, 1, 1024, 8, 1, 132) == 0      # G=1: 16 steps a tile, under the minimum
    assert bwd_mod.kv_chunk(cfg, 1, 2048, 8, 1, 132) == 1024   # 32 steps: chunks of the minimum
    assert bwd_mod.kv_chunk(cfg, 8, 2048, 8, 8, 132) == 0      # many heads: so do they
    assert bwd_mod.kv_chunk(cfg.replace(bwd_kv_chunk=0), 1, 1024, 8, 8, 132) == 0
    assert bwd_mod.kv_chunk(cfg.replace(bwd_kv_chunk=2), 1, 16384, 8, 8, 132) == 128
    assert bwd_mod.kv_chunk(cfg.replace(bwd_kv_chunk=16), 1, 1024, 8, 8, 132) == 0  # 16 tiles: T itself
    with pytest.raises(ValueError, match="bwd_kv_chunk=-2"):
        moda_attention(*random_inputs(1, 8, 4, 2, 32, 2, torch.float32)[:5], config=_bt(bwd_kv_chunk=-2))
    with pytest.raises(ValueError, match="kv_chunk=24"):
        bwd_tma_passes(37, 8, 5)(kv_chunk=24)


# the depth part as items of the key-major grid (bwd_depth_items=1), with and without chunks
ITEMS = [
    (2, 37, 8, 19, _bt(bwd_depth_items=1)),                                    # 3 depth steps, the last masked
    (1, 33, 1, 3, _bt(bwd_depth_items=1, bwd_kv_chunk=1, bwd_block_l=32)),     # G=1, chunked key items
    (2, 29, 3, 1, _bt(bwd_q_block_m=16, bwd_kv_block_m=16, bwd_depth_items=1)),  # G=3 padding rows, L=1
]


@pytest.mark.parametrize("B,T,G,L,cfg", ITEMS, ids=[f"T{c[1]}-G{c[2]}-L{c[3]}" for c in ITEMS])
def test_depth_items_against_reference(B, T, G, L, cfg):
    check_against_reference(_moda_lse, B, T, G * 2, 2, 32, L, torch.float32, seed=T + G + 1, config=cfg)


@pytest.mark.parametrize("depth_grad", [True, False], ids=["depth-grad", "detached"])
def test_depth_items_match_the_fused_depth_part(depth_grad):
    """Depth items = the depth part in the dq pass: dk, dv bitwise (the key items are untouched),
    dq and the depth gradients to fp32 rounding (dq's depth share is added to the stored dq)."""
    run = bwd_tma_passes(45, 8, 19, seed=3)
    ref = run(kv_chunk=16, depth_grad=depth_grad)
    got = run(kv_chunk=16, depth_grad=depth_grad, depth_items=True)
    for name, a, b in zip(("dq", "dk", "dv", "dkd", "dvd"), ref, got):
        if a is None:
            assert b is None and not depth_grad
        elif name in ("dk", "dv"):
            assert torch.equal(a, b), name
        else:
            assert rel_err(b, a) < 1e-6, name
    with pytest.raises(ValueError, match="depth_items needs"):
        run(kv_chunk=0, depth_items=True, beside=lambda main, side: (main(), side()))


def test_depth_items_rule():
    """1 at L > 0 (at L = 0 there is no depth part); -1 and 0 keep the depth part in the dq pass
    (measured no faster: `kv_depth_items`); other values are refused."""
    cfg = MoDAConfig()
    assert bwd_mod.kv_depth_items(cfg.replace(bwd_depth_items=1), 65536, 64, 8)
    assert not bwd_mod.kv_depth_items(cfg.replace(bwd_depth_items=1), 1024, 0, 8)
    assert not bwd_mod.kv_depth_items(cfg, 1024, 64, 8)
    assert not bwd_mod.kv_depth_items(cfg.replace(bwd_depth_items=0), 1024, 64, 8)
    with pytest.raises(ValueError, match="bwd_depth_items=2"):
        moda_attention(*random_inputs(1, 8, 4, 2, 32, 2, torch.float32)[:5], config=_bt(bwd_depth_items=2))


@pytest.mark.gpu
def test_gpu_kv_chunks(monkeypatch):
    """T=1000, G=8, L=64, bf16 on the GPU: chunked (the rule's default there), chunked with depth
    items and unchunked gradients agree to bf16 rounding, and a CUDA graph replay of the default
    call gives them too."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    chunks = []
    real = kernel_mod.moda_bwd_tma
    monkeypatch.setattr(kernel_mod, "moda_bwd_tma",
                        lambda *a, **k: chunks.append((k["kv_chunk"], k["depth_items"])) or real(*a, **k))
    ins = list(random_inputs(1, 1000, 64, 8, 64, 64, torch.bfloat16, seed=7))
    do = ins.pop()

    def step(cfg=None):
        for x in ins:
            x.grad = None
        moda_attention(*ins, config=cfg).backward(do)
        return [x.grad.clone() for x in ins]

    chunked = step()
    base = kernel_mod.resolve_config(MoDAShape(B=1, T=1000, Hq=64, Hk=8, d=64, L=64), torch.bfloat16)
    items = step(base.replace(bwd_depth_items=1))
    plain = step(base.replace(bwd_kv_chunk=0))
    assert chunks[0][0] > 0 and not chunks[0][1] and chunks[1] == (chunks[0][0], True) and chunks[2] == (0, False)
    for a, b, c in zip(chunked, plain, items):
        assert rel_err(a, b) < 1e-2 and rel_err(c, b) < 1e-2
    graph_replayed(lambda: moda_attention(*ins).backward(do), ins, replays=3)
    for a, x in zip(chunked, ins):
        assert rel_err(x.grad, a) < 1e-2
