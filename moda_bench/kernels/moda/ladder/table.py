"""The kernel ablation ladder (spec section 3): six implementations of the same MoDA function,
each adding one idea, with their depth utilisation and the paper's A100 timings.

Depth utilisation eta = useful depth logits / depth logits computed (spec section 2).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from moda_bench.kernels.moda.config import auto_depth_sub, default_config, group_pad
from moda_bench.kernels.moda.ladder.chunk_aware import moda_chunk_aware
from moda_bench.kernels.moda.ladder.flash_compatible import moda_flash_compatible
from moda_bench.kernels.moda.ladder.group_aware import moda_batched_tiles, moda_group_aware, moda_ours, pinned_config
from moda_bench.kernels.moda.ladder.naive import moda_naive
from moda_bench.kernels.moda.ladder.ungrouped import tiles as ungrouped_tiles
from moda_bench.kernels.moda.validate import MoDAShape


def eta_naive(T: int, G: int, C: int, L: int) -> float:
    """The loop computes exactly the L depth logits of each query."""
    return 1.0 if L > 0 else float("nan")


def eta_flash_compatible(T: int, G: int, C: int, L: int) -> float:
    """Each query row scores all T*L flat depth columns, L of them its own."""
    return 1.0 / T if L > 0 else float("nan")


def eta_chunk_aware(T: int, G: int, C: int, L: int) -> float:
    """Each query row scores the C*L columns of its chunk (fewer when T < C)."""
    return 1.0 / min(C, T) if L > 0 else float("nan")


def _tile_eta(T: int, G: int, L: int, positions: int) -> float:
    """A depth tile of P positions has P*GP rows (G of each GP real) and P*L columns, padded
    to the config's block_l; P*G*L of those logits are useful."""
    if L == 0:
        return float("nan")
    block_l = default_config(MoDAShape(B=1, T=T, Hq=G, Hk=1, d=64, L=L)).block_l
    cols = -(-positions * L // block_l) * block_l
    return (positions * G * L) / (positions * group_pad(G) * cols)


def eta_group_aware(T: int, G: int, C: int, L: int) -> float:
    """One dense tile over a chunk of C rows = C // GP positions: G/C."""
    return _tile_eta(T, G, L, max(1, C // group_pad(G)))


def eta_ours(T: int, G: int, C: int, L: int) -> float:
    """Batched sub-tiles of auto_depth_sub(G, C) positions (>= 16 rows): min(1, G/16)."""
    return _tile_eta(T, G, L, auto_depth_sub(G, C))


def _naive_launch(shape: MoDAShape, dtype, C: int) -> dict:
    return {"loop": "positions", "compute_dtype": "float32"}


def _ungrouped_launch(span: str) -> Callable[[MoDAShape, object, int], dict]:
    def launch(shape: MoDAShape, dtype, C: int) -> dict:
        return {"span": span, **ungrouped_tiles(C, shape.d)}
    return launch


def _pinned_launch(depth_sub: Optional[int], fused: bool) -> Callable[[MoDAShape, object, int], dict]:
    def launch(shape: MoDAShape, dtype, C: int) -> dict:
        return pinned_config(shape, dtype, chunk=C, depth_sub=depth_sub, fused=fused).to_dict()
    return launch


@dataclass(frozen=True)
class Rung:
    """One implementation: `fn(q, k, v, k_depth, v_depth, *, scale=None, chunk=C) -> out`.

    depth_utilization(T, G, C, L) -> eta; launch_config(shape, dtype, C) -> the tile/launch
    settings it runs with (recorded in the CSV's config column).
    """

    name: str
    label: str
    fn: Callable
    depth_utilization: Callable[[int, int, int, int], float]
    paper_ms: Optional[float]  # A100, bf16, B=1, T=1024, G=8, Hk=8, d=64, L=64, C=64, fwd+bwd
    launch_config: Callable[[MoDAShape, object, int], dict]


RUNGS: list[Rung] = [
    Rung("naive-torch", "PyTorch for-loop over positions and their depth KV", moda_naive, eta_naive, 2128.9,
         _naive_launch),
    Rung("flash-compatible", "fused Triton, flat depth axis scanned by every query block",
         moda_flash_compatible, eta_flash_compatible, 13.102, _ungrouped_launch("all")),
    Rung("chunk-aware", "fused Triton, a chunk of C positions visits its C*L depth columns",
         moda_chunk_aware, eta_chunk_aware, 6.286, _ungrouped_launch("chunk")),
    Rung("group-aware", "G query heads folded into rows, one dense depth tile per chunk (paper final)",
         moda_group_aware, eta_group_aware, 1.460, _pinned_launch(None, True)),
    Rung("batched-tiles", "group-aware rows, batched 16-row depth tiles, depth phase still fused",
         moda_batched_tiles, eta_ours, None, _pinned_launch(0, True)),
    Rung("ours", "production kernel: batched tiles, default depth placement (fused for T<=2048, else "
                 "depth-only launches: fwd first, bwd on a side stream)",
         moda_ours, eta_ours, None, _pinned_launch(0, False)),
]


def rung(name: str) -> Rung:
    """The rung called `name` (ValueError listing the names otherwise)."""
    for r in RUNGS:
        if r.name == name:
            return r
    raise ValueError(f"unknown rung {name!r}; one of: {', '.join(r.name for r in RUNGS)}")
