"""The ladder's rungs on the shipped kernel (`moda_attention`): the project's own steps after the paper's
group-aware kernel, each a config that differs from the one before it in one idea.

  shipped-kernel  the shipped pointer kernel pinned to the ideas of the ladder kernel's last rung: C rows a
                  program, one dense masked depth tile over the chunk (depth_sub = C // GP, eta = G/C), depth
                  phase fused into the forward and into the query-major backward pass. No new idea: its gain
                  over the ladder kernel is the shipped code itself (mask-free tiles below the diagonal,
                  software-pipelined loops of 3 stages, delta stored by the query-major pass).
  batched-tiles   + depth sub-tiles of the fewest positions that fill a 16-row tensor-core tile (depth_sub = 0,
                  eta = min(1, G/16)).
  tma-fwd         + the forward through tensor descriptors (`kernel_fwd_tma`; fwd_depth = "tma", its tiles as
                  `config.default_config` sets them on Hopper).
  tma-bwd         + the folded-row descriptor backward (`kernel_bwd_tma`; bwd_depth = "tma", its tiles as the
                  default sets them): query-major pass first, key-major pass heaviest tiles first.
  ours            the production call: no pinned config (`resolve_config`: tuned / shipped tiles for this GPU
                  and shape, else the heuristic, with its depth placement for the shape).
The tma rungs need a Hopper-or-newer GPU with device-side descriptors (`tma_unavailable`); elsewhere
(and under the interpreter) their calls run the same arithmetic through pointer loads.
"""
from __future__ import annotations

from typing import Optional

from moda_bench.kernels.moda.config import (
    BWD_TMA_MAXNREG,
    BWD_TMA_MAXNREG_MIN_T,
    TMA_BLOCK_N,
    TMA_STAGES,
    TMA_WARPS,
    MoDAConfig,
    bwd_tma_default,
    group_pad,
    pointer_block_l,
    resolve_config,
    tma_block_l,
)
from moda_bench.kernels.moda.triton.interface import moda_attention
from moda_bench.kernels.moda.validate import MoDAShape, check_inputs

STEPS = ("shipped-kernel", "batched-tiles", "tma-fwd", "tma-bwd")


def _pointer_fused(shape: MoDAShape, chunk: int) -> MoDAConfig:
    """The pointer kernel's heuristic tiles (as `default_config` sets them off Hopper) at C = chunk rows,
    the dense group-aware depth tile, depth fused in both passes."""
    gp = group_pad(shape.G)
    if chunk < gp or chunk % gp:
        raise ValueError(f"chunk={chunk} rows must be a multiple of the padded group size GP={gp} (G={shape.G})")
    bl = pointer_block_l(shape.L)
    cfg = MoDAConfig(block_m=chunk, bwd_q_block_m=chunk, block_l=bl, bwd_block_l=bl, depth_sub=chunk // gp,
                     fwd_depth="fused", bwd_depth="fused")
    if shape.d > 64:
        cfg = cfg.replace(num_stages=2, bwd_q_stages=2, bwd_kv_stages=2, bwd_q_block_n=32, bwd_kv_block_m=32)
    return cfg


def _tma_fwd(shape: MoDAShape, chunk: int) -> dict:
    """The descriptor forward's fields as `default_config` sets them on Hopper (G <= 16), at C = chunk rows."""
    return dict(fwd_depth="tma", block_n=TMA_BLOCK_N, num_warps=TMA_WARPS, num_stages=TMA_STAGES,
                block_l=tma_block_l(shape.G, chunk, 256, 32))


def _tma_bwd(shape: MoDAShape, chunk: int) -> dict:
    """The folded descriptor backward's fields as `default_config` sets them on Hopper, at C = chunk rows."""
    gp = group_pad(shape.G)
    reg = BWD_TMA_MAXNREG if shape.T > BWD_TMA_MAXNREG_MIN_T else 0
    return dict(bwd_depth="tma", bwd_q_block_n=64, bwd_q_warps=4, bwd_q_stages=3, bwd_kv_block_m=max(64, gp),
                bwd_kv_block_n=64, bwd_kv_warps=4, bwd_kv_stages=3, bwd_block_l=tma_block_l(shape.G, chunk, 128, 32),
                bwd_depth_stages=3 - bool(reg), bwd_kv_maxnreg=reg, bwd_q_maxnreg=reg)


def step_config(step: str, shape: MoDAShape, chunk: int) -> MoDAConfig:
    """The pinned config of rung `step` (one of STEPS): each adds its fields to the one before it."""
    if step not in STEPS:
        raise ValueError(f"unknown shipped-kernel step {step!r}; one of {', '.join(STEPS)}")
    cfg = _pointer_fused(shape, chunk)
    upto = STEPS.index(step)
    if upto >= 1:
        cfg = cfg.replace(depth_sub=0)
    if upto >= 2:
        cfg = cfg.replace(**_tma_fwd(shape, chunk))
    if upto >= 3:
        cfg = cfg.replace(**_tma_bwd(shape, chunk))
    return cfg


def tma_unavailable(device: str) -> Optional[str]:
    """Why the descriptor rungs cannot run as themselves here (None where they can)."""
    # the heuristic's own test at d = 64, bf16: a Hopper-or-newer GPU and a Triton with device-side descriptors
    if device != "cuda" or not bwd_tma_default(MoDAShape(B=1, T=1, Hq=1, Hk=1, d=64, L=0), "bfloat16"):
        return "needs a Hopper-or-newer GPU and a Triton with device-side tensor descriptors"
    return None


def step_fn(step: str):
    """fn(q, k, v, k_depth, v_depth, *, scale=None, chunk=64) running rung `step` on the shipped kernel."""
    def run(q, k, v, k_depth=None, v_depth=None, *, scale: float | None = None, chunk: int = 64):
        shape = check_inputs(q, k, v, k_depth, v_depth, need_cuda=True)
        return moda_attention(q, k, v, k_depth, v_depth, scale=scale, config=step_config(step, shape, chunk))
    run.__name__ = f"moda_{step.replace('-', '_')}"
    run.__doc__ = f"MoDA through the shipped kernel at rung {step!r} (`step_config`)."
    return run


def moda_ours(q, k, v, k_depth=None, v_depth=None, *, scale: float | None = None, chunk: int = 64):
    """The production call (`moda_attention` without a config); `chunk` is accepted and not used."""
    return moda_attention(q, k, v, k_depth, v_depth, scale=scale)


def ours_config(shape: MoDAShape, dtype) -> MoDAConfig:
    """The config the production call resolves for this shape on the current device."""
    return resolve_config(shape, dtype)
