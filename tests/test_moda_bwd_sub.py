"""The key-major pass of the "tma" backward split into head sub-groups (`kernel_bwd_tma`'s
kv_sub, `_kv_kernel`'s NSUB): a program takes GP // kv_sub heads of its key tile's rows and the
sub-groups' fp32 dk, dv are summed by the last to finish. Against the unsplit pass at odd T, G in
{2, 6, 8, 16} (G=6: padding heads in the last sub-group), L in {0, 1, 3, 5}, one head a position
(GS = 1), with chunks too, descriptor and pointer loads: dq and the depth gradients bitwise (the
dq pass is not touched), dk and dv to fp32 rounding (only the order of the sum changes); the
arguments it refuses (repeat calls and the arrival counters: test_moda_bwd_chunks.py). The unsplit
pass itself is checked against the fp64 reference in test_moda_bwd_tma.py. One GPU test: split
and unsplit agree in bf16 at T=1000 and T=4099.

CPU: the Triton interpreter (conftest sets TRITON_INTERPRET=1).
"""
import pytest
import torch
from helpers import bwd_tma_passes, rel_err

from moda_bench.kernels.moda.triton import interface as kernel_mod


def _same(ref, got, tol=1e-6):
    for name, a, b in zip(("dq", "dk", "dv", "dkd", "dvd"), ref, got):
        if a is None:
            assert b is None, name
        elif name in ("dk", "dv"):
            assert rel_err(b, a) < tol, name
        else:
            assert torch.equal(a, b), name


# (T, G, L, kv_sub, kv_chunk, kv_block_m, loads): pointer loads where their masks differ (padding
# heads, chunks), descriptor loads everywhere
CASES = [
    (37, 8, 5, 2, 0, 32, "descriptors"),    # 4 heads a position: a 32-row step spans 8 positions
    (45, 8, 0, 4, 0, 32, "descriptors"),    # L=0; 2 heads a position, 16 positions a step
    (40, 6, 3, 2, 0, 32, "descriptors"),    # G=6 (GP=8): heads 4..7 of the second sub-group, 6 and 7 padding
    (40, 6, 3, 2, 0, 32, "pointers"),
    (29, 2, 1, 2, 0, 16, "descriptors"),    # one head a position: 16 positions a step
    (37, 8, 5, 2, 16, 32, "descriptors"),   # with chunks of one key tile: 3 chunks x 2 sub-groups a tile
    (37, 8, 5, 2, 16, 32, "pointers"),
    (21, 16, 2, 8, 0, 16, "descriptors"),   # G=16, 2 heads a position
]


@pytest.mark.parametrize("T,G,L,sub,chunk,kv_m,loads", CASES,
                         ids=[f"T{c[0]}-G{c[1]}-L{c[2]}-s{c[3]}-c{c[4]}-{c[6]}" for c in CASES])
def test_kv_sub_matches_unsplit(monkeypatch, T, G, L, sub, chunk, kv_m, loads):
    aligned = loads == "descriptors"
    if not aligned:
        monkeypatch.setattr(kernel_mod, "aligned", lambda *t, **kw: False)
    run = bwd_tma_passes(T, G, L, kv_block_m=kv_m, use_desc=aligned)
    _same(run(kv_sub=1, kv_chunk=chunk), run(kv_sub=sub, kv_chunk=chunk))


def test_kv_sub_refused():
    run = bwd_tma_passes(21, 8, 2, B=1)
    for bad in (3, 16, 0):
        with pytest.raises(ValueError, match="kv_sub"):
            run(kv_sub=bad)
    with pytest.raises(ValueError, match="kv_sub"):
        run(kv_sub=2, beside=lambda main, side: (main(), side()))
    with pytest.raises(ValueError, match="kv_sub"):
        run(kv_sub=2, depth_items=True, kv_block_m=32)


@pytest.mark.gpu
@pytest.mark.parametrize("T,L,sub", [(1000, 64, 2), (4099, 0, 2), (4099, 64, 4)])
def test_gpu_kv_sub_matches_unsplit(T, L, sub):
    """bf16 on the GPU at the default's tiles (64 x 64, 4 warps): dq and the depth gradients
    bitwise, dk and dv to bf16 rounding of the same fp32 sums in another order."""
    run = bwd_tma_passes(T, 8, L, B=1, dtype=torch.bfloat16, d=64, q_block_m=64, q_block_n=64, kv_block_m=64,
                         kv_block_n=64, block_l=32, q_stages=3, kv_stages=3, q_warps=4, kv_warps=4)
    _same(run(kv_sub=1), run(kv_sub=sub), tol=1e-2)
