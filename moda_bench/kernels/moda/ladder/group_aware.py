"""Rungs 4-6 of the ablation ladder: the paper's final kernel and the two ideas added to it.

All run the production kernel `moda_attention` with the query chunk pinned to C rows; rows
fold the G query heads of a KV head (r = t*GP + g, GP = next_pow2(G)), so a chunk covers
C/GP positions. Each differs from the one before it in one idea:

  group-aware:   depth_sub = C // GP, one dense masked tile over the whole chunk (eta = G/C),
                 depth phase fused into the sequence kernels (one forward kernel, depth
                 gradients in the query-major backward pass), as in the paper
  batched-tiles: depth_sub = 0 (auto), batched tiles of 16 rows (eta = min(1, G/16)), still fused
  ours:          the same tiles, the depth part placed as the production default places it for
                 the shape: fused up to T = config.FUSED_DEPTH_MAX_T, beyond that a forward
                 depth-only launch whose partial the sequence kernel starts from and a backward
                 depth-only launch on a side stream beside the dk/dv pass
"""
from __future__ import annotations

from moda_bench.kernels.moda.config import MoDAConfig, default_config, group_pad
from moda_bench.kernels.moda.triton.interface import moda_attention
from moda_bench.kernels.moda.validate import MoDAShape, check_inputs


def pinned_config(shape: MoDAShape, dtype, *, chunk: int, depth_sub: int | None, fused: bool = False) -> MoDAConfig:
    """default_config(shape) with block_m = bwd_q_block_m = chunk and the given depth_sub
    (None = chunk // GP: the group-aware dense tile; 0 = auto); fused=True pins the depth
    phase inside the sequence kernels (fwd_depth = bwd_depth = "fused")."""
    gp = group_pad(shape.G)
    if chunk < gp or chunk % gp:
        raise ValueError(f"chunk={chunk} rows must be a multiple of the padded group size GP={gp} (G={shape.G})")
    sub = chunk // gp if depth_sub is None else depth_sub
    cfg = default_config(shape, dtype).replace(block_m=chunk, bwd_q_block_m=chunk, depth_sub=sub)
    return cfg.replace(fwd_depth="fused", bwd_depth="fused") if fused else cfg


def _run_pinned(q, k, v, k_depth, v_depth, scale, chunk: int, depth_sub: int | None, fused: bool):
    shape = check_inputs(q, k, v, k_depth, v_depth, need_cuda=True)
    cfg = pinned_config(shape, q.dtype, chunk=chunk, depth_sub=depth_sub, fused=fused)
    return moda_attention(q, k, v, k_depth, v_depth, scale=scale, config=cfg)


def moda_group_aware(q, k, v, k_depth=None, v_depth=None, *, scale: float | None = None, chunk: int = 64):
    """q (B,T,Hq,d); k, v (B,T,Hk,d); k_depth, v_depth (B,T,L,Hk,d) or None -> out (B,T,Hq,d)."""
    return _run_pinned(q, k, v, k_depth, v_depth, scale, chunk, depth_sub=None, fused=True)


def moda_batched_tiles(q, k, v, k_depth=None, v_depth=None, *, scale: float | None = None, chunk: int = 64):
    """group-aware with batched 16-row depth tiles (depth_sub=0), depth phase still fused."""
    return _run_pinned(q, k, v, k_depth, v_depth, scale, chunk, depth_sub=0, fused=True)


def moda_ours(q, k, v, k_depth=None, v_depth=None, *, scale: float | None = None, chunk: int = 64):
    """The production kernel at the same chunk: batched tiles, default depth placement."""
    return _run_pinned(q, k, v, k_depth, v_depth, scale, chunk, depth_sub=0, fused=False)
