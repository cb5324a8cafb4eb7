"""Rung 4 of the ablation ladder (the paper's final kernel) and rung 5 ("ours").

Both run the production kernel `moda_attention` with the query chunk pinned to C rows; rows
fold the G query heads of a KV head (r = t*GP + g, GP = next_pow2(G)), so a chunk covers
C/GP positions. They differ in one idea only, the depth tile (`MoDAConfig.depth_sub`):

  group-aware: depth_sub = C // GP, one dense masked tile over the whole chunk  (eta = G/C)
  ours:        depth_sub = 0 (auto), batched tiles of 16 rows                   (eta = G/16, <= 1)
"""
from __future__ import annotations

from .config import MoDAConfig, default_config, group_pad
from .validate import MoDAShape, check_inputs


def pinned_config(shape: MoDAShape, dtype, *, chunk: int, depth_sub: int | None) -> MoDAConfig:
    """default_config(shape) with block_m = bwd_q_block_m = chunk and the given depth_sub
    (None = chunk // GP: the group-aware dense tile; 0 = auto)."""
    gp = group_pad(shape.G)
    if chunk < gp or chunk % gp:
        raise ValueError(f"chunk={chunk} rows must be a multiple of the padded group size GP={gp} (G={shape.G})")
    sub = chunk // gp if depth_sub is None else depth_sub
    return default_config(shape, dtype).replace(block_m=chunk, bwd_q_block_m=chunk, depth_sub=sub)


def _run_pinned(q, k, v, k_depth, v_depth, scale, chunk: int, depth_sub: int | None):
    from .moda import moda_attention
    shape = check_inputs(q, k, v, k_depth, v_depth, need_cuda=True)
    cfg = pinned_config(shape, q.dtype, chunk=chunk, depth_sub=depth_sub)
    return moda_attention(q, k, v, k_depth, v_depth, scale=scale, config=cfg)


def moda_group_aware(q, k, v, k_depth=None, v_depth=None, *, scale: float | None = None, chunk: int = 64):
    """q (B,T,Hq,d); k, v (B,T,Hk,d); k_depth, v_depth (B,T,L,Hk,d) or None -> out (B,T,Hq,d)."""
    return _run_pinned(q, k, v, k_depth, v_depth, scale, chunk, depth_sub=None)


def moda_ours(q, k, v, k_depth=None, v_depth=None, *, scale: float | None = None, chunk: int = 64):
    """The production kernel at the same chunk, depth tile chosen automatically (depth_sub=0)."""
    return _run_pinned(q, k, v, k_depth, v_depth, scale, chunk, depth_sub=0)
