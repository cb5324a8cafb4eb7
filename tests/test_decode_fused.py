"""The decode operator's fused combine (`DecodeConfig(fused_combine=True)`: the last split
program of each row block merges the partials, one launch per call) against the float64
reference and the two-launch path.

On a CPU machine (TRITON_INTERPRET=1) the programs run one after another, so the last-arrival
path runs: odd Tk, ragged cache_seqlens with empty later splits, Tq in {1, 2, 4}, L in {0, 1, 5,
64}, G in {1, 4, 8}, d 64 and 128, several splits and row blocks, with TMA tiles; the programs
also in reversed and shuffled order (the merging program then is not the last split); the
combine kernel never launched; the counters back at 0 and cached as `_counters` says. GPU-marked
tests race real programs for the counters and capture a CUDA graph. Shared helpers come from
tests/test_decode.py.
"""
import os
from dataclasses import replace

import pytest
import torch
from helpers import rel_err
from test_decode import SMALL, check, make_inputs

from moda_bench.kernels.decode import DecodeConfig, moda_decode

# (Tq, G, L, d, lens, S, tma): ragged lengths where later splits of a sequence are empty (n = 9
# at S = 4: span 16, splits 1-3 hold no key; n = 1 at S = 5), R = Tq*G beyond max_rows = 16 (two
# row blocks, one counter each), R below 16 (padded rows), depth over several BLOCK_L tiles (L = 64)
FUSED_CASES = [(1, 8, 0, 64, None, 3, False), (2, 1, 1, 64, [53, 9], 4, False), (4, 4, 5, 64, [40, 17], 3, False),
               (1, 8, 5, 64, [53, 1], 5, False), (2, 4, 0, 128, [20, 53], 2, False), (4, 8, 1, 64, [31, 50], 3, True),
               (2, 8, 5, 64, [50, 7], 4, True), (2, 4, 64, 64, [53, 30], 3, False)]


@pytest.mark.parametrize("Tq,G,L,d,lens,S,tma", FUSED_CASES, ids=[f"Tq{c[0]}-G{c[1]}-L{c[2]}-d{c[3]}-S{c[5]}"
                                                                 f"{'-ragged' if c[4] else ''}{'-tma' if c[6] else ''}"
                                                                 for c in FUSED_CASES])
def test_fused_combine(monkeypatch, Tq, G, L, d, lens, S, tma):
    """DecodeConfig(fused_combine=True): the last split program of each row block merges the
    partials (under the interpreter programs run one after another, so the last-arrival path runs);
    within tolerance of fp64 at odd Tk = 53 and equal to the two-launch path bit for bit (the
    same `merge_row`), the combine kernel never launched, and the counters back at 0 (a second
    call in a row gives the same answer)."""
    import moda_bench.kernels.decode.interface as kmod
    kw = make_inputs(2, Tq, G * 2, 2, d, L, 53, seed=Tq + G + L + d + S, lens=lens)
    base = DecodeConfig(block_n=16, block_l=16, tma=tma, max_rows=16)
    two = moda_decode(**kw, num_splits=S, config=base)
    launches = []

    class NoCombine:
        def __getitem__(self, grid):
            launches.append(grid)
            raise AssertionError("the combine kernel ran")

    monkeypatch.setattr(kmod._COMBINE_LAUNCH, "fn", NoCombine())  # the kernel the combine's launches use
    monkeypatch.setattr(kmod, "_COUNTERS", {})
    cfg = replace(base, fused_combine=True)
    check(kw, num_splits=S, config=cfg)
    first = moda_decode(**kw, num_splits=S, config=cfg)
    again = moda_decode(**kw, num_splits=S, config=cfg)
    assert not launches
    assert torch.equal(again, first) and torch.equal(first, two)
    n_rb = -(-Tq * G // 16)
    assert {k[1:] for k in kmod._COUNTERS} == {(0, 2 * 2 * n_rb), ("graph", 2 * 2 * n_rb)}
    assert all(int(buf.abs().sum()) == 0 for buf in kmod._COUNTERS.values())


@pytest.mark.parametrize("order", ["reversed", "shuffled"])
def test_fused_combine_any_arrival_order(monkeypatch, order):
    """The last program to arrive at a counter need not be the last split (the one that took the
    depth) nor hold keys: under the interpreter, run the programs of grid axis 1 (split x row
    block) in reverse or shuffled order, so the merge runs in split 0, a middle split or an
    empty one, at ragged lengths with empty later splits, two row blocks, depth."""
    if not os.environ.get("TRITON_INTERPRET"):
        pytest.skip("reorders the interpreter's programs")
    from triton.runtime import interpreter

    import moda_bench.kernels.decode.interface as kmod
    kw = make_inputs(2, 2, 32, 2, 64, 3, 53, seed=5, lens=[53, 9])
    base = DecodeConfig(block_n=16, block_l=16, max_rows=16)
    two = moda_decode(**kw, num_splits=4, config=base)
    builder = interpreter.interpreter_builder
    real = builder.set_grid_idx

    def reorder(x, y, z):
        ny = builder.grid_dim[1]
        if order == "reversed":
            perm = list(range(ny))[::-1]
        else:
            perm = torch.randperm(ny, generator=torch.Generator().manual_seed(ny + x)).tolist()
        return real(x, perm[y], z)

    monkeypatch.setattr(kmod, "_COUNTERS", {})
    monkeypatch.setattr(builder, "set_grid_idx", reorder)
    cfg = replace(base, fused_combine=True)
    check(kw, num_splits=4, config=cfg)
    assert torch.equal(moda_decode(**kw, num_splits=4, config=cfg), two)
    assert all(int(buf.abs().sum()) == 0 for buf in kmod._COUNTERS.values())


def test_fused_combine_bf16_splits_per_step():
    """bf16, the merge taking several splits a step and one (combine_block_s auto and 1):
    against fp64 and equal to the two-launch path of the same combine_block_s."""
    kw = make_inputs(2, 2, 8, 2, 64, 3, 53, torch.bfloat16, seed=11, lens=[53, 40])
    for block_s in (None, 1):
        two = moda_decode(**kw, num_splits=5, config=replace(SMALL, combine_block_s=block_s))
        cfg = replace(SMALL, fused_combine=True, combine_block_s=block_s)
        check(kw, num_splits=5, config=cfg)
        assert torch.equal(moda_decode(**kw, num_splits=5, config=cfg), two)


def test_fused_combine_counters_and_graphs(monkeypatch):
    """`counters.arrival_counters` (decode's `_counters` keeps its buffers in `_COUNTERS`): one
    buffer per (device, stream, size) for eager calls, reused; the first eager call of a size also
    makes the buffer captures take ("graph"), so a capture allocates nothing (no fill node in the
    graph); a capture with no such buffer gets a fresh zeroed one, not cached."""
    import moda_bench.kernels.counters as cmod
    import moda_bench.kernels.decode.interface as kmod
    monkeypatch.setattr(kmod, "_COUNTERS", {})
    state = {"stream": 7, "capturing": False}
    monkeypatch.setattr(cmod, "stream_state", lambda device: (state["stream"], state["capturing"]))
    cpu = torch.device("cpu")
    state["capturing"] = True
    fresh = kmod._counters(cpu, 6)
    assert fresh.shape == (6,) and int(fresh.abs().sum()) == 0 and not kmod._COUNTERS
    state["capturing"] = False
    a = kmod._counters(cpu, 6)
    assert kmod._counters(cpu, 6) is a
    assert set(kmod._COUNTERS) == {("cpu", 7, 6), ("cpu", "graph", 6)}
    state["stream"] = 9
    b = kmod._counters(cpu, 6)
    assert b is not a and b is not kmod._COUNTERS[("cpu", "graph", 6)]
    state["capturing"] = True
    g = kmod._counters(cpu, 6)
    assert g is kmod._COUNTERS[("cpu", "graph", 6)] and g is not a and g is not b
    assert len(kmod._COUNTERS) == 3
    own = {}
    assert cmod.arrival_counters(own, cpu, 6) is not g and len(kmod._COUNTERS) == 3  # each kernel its own cache


def test_fused_combine_one_split_unchanged(monkeypatch):
    """With S = 1 the split kernel writes the output itself: fused_combine changes nothing (no
    counters, no combine launch)."""
    import moda_bench.kernels.decode.interface as kmod
    kw = make_inputs(2, 2, 8, 2, 64, 1, 53, seed=7, lens=[53, 20])
    plain = moda_decode(**kw, num_splits=1, config=SMALL)
    monkeypatch.setattr(kmod, "_COUNTERS", {})
    fused = moda_decode(**kw, num_splits=1, config=replace(SMALL, fused_combine=True))
    assert torch.equal(fused, plain) and not kmod._COUNTERS


@pytest.mark.gpu
@pytest.mark.parametrize("B,Tq,ragged", [(1, 1, False), (8, 4, True)], ids=["B1-Tq1", "B8-Tq4-ragged"])
def test_gpu_fused_combine_bf16(B, Tq, ragged):
    """fused_combine=True on the GPU (programs really race for the counter) at Tk = 32768 + 7,
    Hk = 8, G = 8, L = 64, bf16, auto splits, against the fp64 reference and the two-launch path,
    several calls in a row."""
    Tk = 32775
    lens = [Tk - 1000 * b for b in range(B)] if ragged else None
    kw = make_inputs(B, Tq, 64, 8, 64, 64, Tk, torch.bfloat16, seed=B + Tq, lens=lens)
    cfg = DecodeConfig(fused_combine=True)
    check(kw, config=cfg)
    two = moda_decode(**kw)
    for _ in range(5):
        assert rel_err(moda_decode(**kw, config=cfg), two) < 1e-2


@pytest.mark.gpu
def test_gpu_fused_combine_graph():
    """fused_combine captured as the graph timer does it (warm-up on a side stream, capture on
    torch's own capture stream): the capture allocates no counters (it takes those the warm-up
    made), replays give the two-launch answer and leave every counter at 0."""
    import moda_bench.kernels.decode.interface as kmod
    kw = make_inputs(1, 1, 64, 8, 64, 64, 32775, torch.bfloat16, seed=4)
    cfg = DecodeConfig(fused_combine=True)
    two = moda_decode(**kw)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        moda_decode(**kw, config=cfg)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    before = dict(kmod._COUNTERS)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = moda_decode(**kw, config=cfg)
    assert kmod._COUNTERS.keys() == before.keys() and all(kmod._COUNTERS[k] is v for k, v in before.items())
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(out, two) < 1e-2
    assert all(int(buf.abs().sum()) == 0 for buf in kmod._COUNTERS.values())
