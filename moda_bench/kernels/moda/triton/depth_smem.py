"""Shared memory of the streaming depth kernels (`triton.depth`: `depth_fwd_kernel`, `depth_bwd_kernel`,
whose loops are the descriptor forward's `depth_phase` and the folded backward's `depth_part`) and the
rule that fits their items into a multiprocessor's shared memory.

Owns: `fwd_smem` / `bwd_smem` (an upper bound of one program's shared memory in bytes, a pure function
of the item's geometry, head size, stages and element size), `fit_fwd` / `fit_bwd` (the largest item
at most the asked one that fits a limit: fewer stages first, then fewer depth columns a step, then
fewer rows) and `smem_limit` (a device's opt-in shared memory a block, looked up once a device). The
bound is checked against `depth.compiled_smem` (what Triton allocates for an item, compiled for sm_90
without a GPU; `tests/test_depth_smem.py`, `experiments/depth_smem_check.py`).

Why: a program's depth tiles grow with the head size, and at d = 128 the forward's 256-row items with
three stages need more than Hopper's 227 KiB (Triton's OutOfResources at launch). The tuned items at
d = 64 fit and are kept as they are: the rule changes an item only where the bound exceeds the limit.

The bound counts every shared buffer Triton allocates for these loops as if all were live at once
(what `triton.compile` for sm_90 reports stays at or below it over the grid the tests check):
* the depth K and V tiles, [P, BL, d] each, max(1, stages - 1) buffers of each (the software
  pipeliner's ring; one staging buffer without pipelining);
* the backward with depth gradients: one more tile, the staging of the dk_depth / dv_depth stores;
* row tiles, [BLOCK_M, d] each: in the backward two (q and do); in the forward q, and where a
  sub-tile is one position (S = 1: the reshape to sub-tiles moves no data, so q stays in shared
  memory as a dot operand) one more for the output tile's layout conversion;
* the barriers (a few bytes a stage), inside BARRIER_SLACK.
"""
from __future__ import annotations

import functools

import torch

from moda_bench.kernels.launch import cdiv, next_pow2
from moda_bench.kernels.moda.triton.bwd_tma_rules import bwd_depth_geometry
from moda_bench.kernels.moda.triton.fwd_tma import depth_geometry

HOPPER_SMEM = 232448  # sm_90's opt-in shared memory a block (227 KiB): the default off CUDA
BARRIER_SLACK = 2048


def _buffers(stages: int) -> int:
    return max(1, stages - 1)


def fwd_smem(G: int, block_m: int, d: int, stages: int, elem: int, block_l: int = 0) -> int:
    """Upper bound of `depth_fwd_kernel`'s shared memory in bytes (items of block_m folded rows,
    block_l as `depth_fwd`'s: 0 is `depth_geometry`'s choice)."""
    gp, P, S, bl = depth_geometry(G, max(block_m, next_pow2(G)), 0, block_l)
    bm = P * gp
    rows = 2 if S == 1 else 1
    return elem * d * (2 * _buffers(stages) * P * bl + rows * bm) + BARRIER_SLACK


def bwd_smem(G: int, block_m: int, d: int, L: int, stages: int, elem: int, depth_grad: bool = True,
             block_l: int = 0) -> int:
    """Upper bound of `depth_bwd_kernel`'s shared memory in bytes (block_l as `depth_bwd`'s: 0 is
    `bwd_depth_geometry`'s choice, which depends on L)."""
    gp, P, S, bl = bwd_depth_geometry(G, max(block_m, next_pow2(G)), L, block_l)
    bm = P * gp
    tiles = 2 * _buffers(stages) + bool(depth_grad)
    return elem * d * (tiles * P * bl + 2 * bm) + BARRIER_SLACK


def _block_ls(S: int, bl: int) -> list[int]:
    """block_l values (S * BL columns a sub-tile step) from S*bl down to the 16-column minimum."""
    out, b = [], bl
    while b >= cdiv(16, S):
        out.append(S * b)
        b //= 2
    return out


def _fit(est, geometry, G: int, block_m: int, stages: int, block_l: int, limit: int) -> tuple:
    """(block_m, stages, block_l) of the first item, in the order below, whose bound `est` fits
    `limit`: the asked one; fewer stages down to 2 (double buffering); then, a step at a time, half
    the depth columns (BL) with the stages tried again; then half the rows (down to max(16, GP))
    with BL back at the geometry's choice; and only where none fits, one stage. block_l comes back
    as asked where the columns did not shrink (0 stays "the geometry's choice")."""
    gp = next_pow2(G)
    bm = max(block_m, gp)
    if est(bm, stages, block_l) <= limit:
        return bm, stages, block_l
    low = min(stages, 2)
    for one_stage in (False, True):
        m = bm
        while m >= max(16, gp):
            _, _, S, bl = geometry(m, block_l if m == bm else 0)
            for i, cols in enumerate(_block_ls(S, bl)):
                for s in ((1,) if one_stage else range(stages, low - 1, -1)):
                    arg = (block_l if m == bm else 0) if i == 0 else cols
                    if est(m, s, arg) <= limit:
                        return m, s, arg
            m //= 2
    raise ValueError(f"no streaming depth item fits {limit} bytes of shared memory (G={G}, block_m={block_m})")


@functools.lru_cache(maxsize=4096)
def fit_fwd(G: int, d: int, elem: int, limit: int, block_m: int, stages: int, block_l: int = 0) -> tuple:
    """(block_m, stages, block_l) of `depth_fwd`'s items: the asked ones where `fwd_smem` fits
    `limit`, else the largest that fits (`_fit`'s order)."""
    return _fit(lambda m, s, b: fwd_smem(G, m, d, s, elem, b), lambda m, b: depth_geometry(G, m, 0, b),
                G, block_m, stages, block_l, limit)


@functools.lru_cache(maxsize=4096)
def fit_bwd(G: int, d: int, L: int, elem: int, limit: int, block_m: int, stages: int, depth_grad: bool,
            block_l: int = 0) -> tuple:
    """(block_m, stages, block_l) of `depth_bwd`'s items, as `fit_fwd` with `bwd_smem`."""
    return _fit(lambda m, s, b: bwd_smem(G, m, d, L, s, elem, depth_grad, b),
                lambda m, b: bwd_depth_geometry(G, m, L, b), G, block_m, stages, block_l, limit)


@functools.lru_cache(maxsize=None)
def smem_limit(device) -> int:
    """Opt-in shared memory a block of a CUDA device (its properties, looked up once a device);
    HOPPER_SMEM off CUDA (the interpreter runs what the H100 would)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return HOPPER_SMEM
    props = torch.cuda.get_device_properties(dev)
    return int(getattr(props, "shared_memory_per_block_optin", 0) or HOPPER_SMEM)
