"""The pointer kernels' depth offsets in 64 bits (CPU, Triton interpreter).

A depth entry's element offset is pos * sdt + l * sdl + c. At T = 65536, L = 64, Hk = 8, d = 128
(the paper preset at d = 128) pos * sdt passes 2**31; in 32 bits it wrapped and the H100 run read
out of bounds (an illegal memory access). The kernels now add `utils.depth_base` (the block's first
position times sdt, a 64-bit scalar) to their base and `utils.depth_tile`'s offsets relative to it
(32-bit: a 64-bit tensor of offsets spilled registers). A tiny kernel writes base + offsets of the
last positions of such a shape, as the kernels form them; they must equal Python's integers."""
from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")
tl = triton.language

from helpers import device  # noqa: E402

from moda_bench.kernels.moda.triton.utils import depth_base, depth_tile  # noqa: E402


@triton.jit
def _offsets_kernel(OUT, t_lo, T, L, sdt, sdl, NB: tl.constexpr, S: tl.constexpr, R: tl.constexpr,
                    GP: tl.constexpr, BLOCK_L: tl.constexpr, HEAD_DIM: tl.constexpr):
    offs, ld_ok, own = depth_tile(t_lo, 0, T, L, sdt, sdl, NB, S, R, GP, BLOCK_L, HEAD_DIM)
    i = (tl.arange(0, NB)[:, None, None] * BLOCK_L + tl.arange(0, BLOCK_L)[None, :, None]) * HEAD_DIM \
        + tl.arange(0, HEAD_DIM)[None, None, :]
    tl.store(OUT + i, tl.where(ld_ok, depth_base(t_lo, sdt) + offs, -1))


@pytest.mark.parametrize("T, L, Hk, d", [(65536, 64, 8, 128), (70001, 7, 4, 64)])
def test_depth_offsets_past_2_31_are_exact(T, L, Hk, d):
    dev = device()
    NB, S, GP, BLOCK_L, D = 2, 1, 8, 8, 16   # 2 sub-tiles of one position, 8 depth columns, 16 of d's columns
    sdl, sdt = Hk * d, L * Hk * d
    t_lo = T - NB * S                        # the last positions: the largest offsets
    out = torch.empty(NB * BLOCK_L * D, dtype=torch.int64, device=dev)
    _offsets_kernel[(1,)](out, t_lo, T, L, sdt, sdl, NB, S, S * GP, GP, BLOCK_L, D)
    want = [(t_lo + nb * S + f // L) * sdt + (f % L) * sdl + c if f < S * L else -1
            for nb in range(NB) for f in range(BLOCK_L) for c in range(D)]
    assert max(want) >= 2 ** 31 or T * sdt < 2 ** 31
    assert out.cpu().tolist() == want
