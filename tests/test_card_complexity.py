"""Issue 58, item 3: the complexity tables (reports.complexity) agree with the floor model's FLOP
and byte counts for the same shapes, and with the numbers the seeds print."""
from __future__ import annotations

import pytest

from moda_bench import floor
from moda_bench.reports import complexity as cx

SHAPES = [(1, 37, 4, 2, 16, 3), (2, 129, 8, 8, 64, 5), (1, 4096, 16, 8, 64, 35)]   # B, T, Hq, Hk, d, L


@pytest.mark.parametrize("B,T,Hq,Hk,d,L", SHAPES)
def test_depth_read_and_cache_match_the_floor_model(B, T, Hq, Hk, d, L):
    with_depth = floor.moda_work("fwd", B, T, Hq, Hk, d, L)
    without = floor.moda_work("fwd", B, T, Hq, Hk, d, 0)
    assert B * cx.depth_read_flops(T, Hq, d, L) == with_depth.flops - without.flops
    assert B * cx.depth_cache_elements(T, Hk, d, L) * cx.BYTES == with_depth.bytes - without.bytes


@pytest.mark.parametrize("B,T,Hq,Hk,d,S", SHAPES)
def test_depth_attention_layer_matches_the_floor_mix(B, T, Hq, Hk, d, S):
    mix = floor.mix_work("fwd", B, T, Hq, Hk, d, S)
    M = S + 1                               # the seed's sources: the current layer and S earlier ones
    assert B * T * 4.0 * M * Hk * d == mix.flops
    # the floor also reads q (which vanilla attention reads anyway); the seed's extra I/O does not
    assert B * cx.depth_attention_layer_io(T, Hk, d, M) == mix.bytes - B * T * Hq * d * cx.BYTES


def test_seed000_moda_table_and_its_printed_numbers():
    m700 = cx.MODELS[0]
    assert (m700.D, m700.G, m700.L, m700.T, m700.dkv) == (1024, 2, 36, 4096, 512)
    # 705.7M - 669.0M: the FFN depth K/V projection of the 700M model (seed 000, MoDA variants table)
    assert cx.seed000_value("Parameters", "MoDA", m700) == pytest.approx(36.7e6, rel=2e-3)
    # 8.02T - 8.01T FLOPs (depth KV read, no new parameters) at T = 4096: about 0.01T
    reads = sum(cx.depth_read_flops(m700.T, m700.Hq, m700.d, l) for l in range(1, m700.L + 1))
    assert 0.005e12 <= reads <= 0.015e12
    for q in cx.QUANTITIES:     # the paper's orders: Depth Dense >= Depth Attention >= MoDA everywhere
        for m in (cx.MODELS[0], cx.MODELS[2], cx.MODELS[3]):
            dd, da, mo = (cx.seed000_value(q, meth, m) for meth in cx.METHODS)
            assert dd >= da >= mo > 0, (q, m)
    assert cx.seed000_value("Prefilling FLOPs", "MoDA", m700) == m700.T * cx.seed000_value("Decoding FLOPs", "MoDA",
                                                                                           m700)
    assert cx.seed000_value("Parameters", "MoDA", cx.MODELS[1]) != cx.seed000_value("Parameters", "MoDA",
                                                                                   cx.MODELS[1])   # L not printed


def test_seed002_table2_reproduces_the_printed_3b_numbers():
    m3b = cx.MODELS[3]
    assert (m3b.D, m3b.L, m3b.dkv) == (2048, 48, 512)
    MiB, GiB = 2 ** 20, 2 ** 30
    printed = {"Depth-Attention": (2.40e5, 282 * 2 ** 10, 0.0), "DenseFormer": (5.01e6, 4.97 * MiB, 24 * GiB),
               "Attention Residuals": (4.26e6, 4.44 * MiB, 4 * GiB), "mHC": (4.72e7, 8.63 * MiB, 1.5 * GiB)}
    for meth, (flops, io, mem) in printed.items():
        r = cx.table2_row(meth, m3b)
        assert r["flops"] == pytest.approx(flops, rel=5e-3), meth
        assert r["io"] == pytest.approx(io, rel=5e-3), meth
        assert r["memory"] == pytest.approx(mem, rel=1e-9, abs=0), meth
    assert cx.table2_row("Depth-Attention", m3b)["io"] == 288768        # seed 002 eq. (6), exactly


def test_markdown_tables_have_a_readable_width():
    md = cx.complexity_markdown()
    assert "O(L D^2 / G)" in md and "O(N^3 d_model)" in md and "24 GiB" in md
    assert all(len(line.split("|")) - 2 <= 12 for line in md.splitlines() if line.startswith("|"))


def test_card_blocks_read_superseded_rows_too():
    import pandas as pd

    from moda_bench.reports.card import card_blocks
    from moda_bench.reports.inputs import Paper, Results
    empty = pd.DataFrame(columns=["provider"])
    blocks = card_blocks(Results(rows=empty, superseded=empty, files=[]), Paper(), "moda")
    assert len(blocks) == 1 and blocks[0].startswith("## Complexity")
