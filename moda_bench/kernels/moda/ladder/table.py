"""The kernel ablation ladder (spec section 3): implementations of the same MoDA function, each the one
before it plus one idea, with their depth utilisation and the paper's A100 timings.

Rungs 2-5 are one Triton kernel (`ladder.kernel`) with one more constexpr switch on at each rung;
rungs 6-10 are one config of the shipped kernel each (`ladder.shipped`), every config the one before
it plus one change. Rung 6 adds no idea: it moves the same ideas onto the shipped code, so its gain
is that code's (the bridge between the two kernels). Depth utilisation eta = useful depth logits /
depth logits computed (spec section 2).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from moda_bench.kernels.launch import cdiv
from moda_bench.kernels.moda.config import group_pad
from moda_bench.kernels.moda.ladder import shipped
from moda_bench.kernels.moda.ladder.kernel import Ideas, moda_ladder, tiles
from moda_bench.kernels.moda.ladder.naive import moda_naive
from moda_bench.kernels.moda.triton.interface import depth_utilization as shipped_eta
from moda_bench.kernels.moda.validate import MoDAShape

NAN = float("nan")
FLASH = Ideas(span_all=True)
CHUNK = Ideas()
GROUP = Ideas(grouped=True)
GROUP_BWD = Ideas(grouped=True, depth_in_dq=True)


def _shape(T: int, G: int, L: int) -> MoDAShape:
    """A one-KV-head shape for the eta formulas (they depend on T, G, L and the tiles only)."""
    return MoDAShape(B=1, T=T, Hq=G, Hk=1, d=64, L=L)


def eta_naive(T: int, G: int, C: int, L: int) -> float:
    """The loop computes exactly the L depth logits of each query."""
    return 1.0 if L > 0 else NAN


def eta_flash_compatible(T: int, G: int, C: int, L: int) -> float:
    """Each query row scores all T*L flat depth columns, L of them its own."""
    return 1.0 / T if L > 0 else NAN


def eta_chunk_aware(T: int, G: int, C: int, L: int) -> float:
    """Each query row scores the C*L columns of its chunk (fewer when T < C)."""
    return 1.0 / min(C, T) if L > 0 else NAN


def eta_group_aware(T: int, G: int, C: int, L: int) -> float:
    """A block of C rows = P = C // GP positions scores their P*L columns, padded to the kernel's depth
    step: G/C where the step divides P*L."""
    if L == 0:
        return NAN
    P = max(1, C // group_pad(G))
    step = tiles(C, 64)["BLOCK_L"]
    return (P * G * L) / (C * cdiv(P * L, step) * step)


def _eta_step(step: str) -> Callable[[int, int, int, int], float]:
    def eta(T: int, G: int, C: int, L: int) -> float:
        if L == 0:
            return NAN
        return shipped_eta(T, G, C, L, shipped.step_config(step, _shape(T, G, L), C))
    eta.__doc__ = f"What the shipped kernel's forward computes at rung {step!r} (`interface.depth_utilization`)."
    return eta


def eta_ours(T: int, G: int, C: int, L: int) -> float:
    """What the production config for the shape computes (on the current device; bf16, d = 64: the eta
    signature carries no d)."""
    if L == 0:
        return NAN
    shape = _shape(T, G, L)
    cfg = shipped.ours_config(shape, "bfloat16")
    return shipped_eta(T, G, cfg.block_m, L, cfg)


def _naive_launch(shape: MoDAShape, dtype, C: int) -> dict:
    return {"loop": "positions", "compute_dtype": "float32"}


def _ladder_fn(ideas: Ideas) -> Callable:
    def fn(q, k, v, k_depth=None, v_depth=None, *, scale: float | None = None, chunk: int = 64):
        return moda_ladder(q, k, v, k_depth, v_depth, scale=scale, chunk=chunk, ideas=ideas)
    fn.__doc__ = f"MoDA through the ladder kernel with {ideas}."
    return fn


def _ladder_launch(ideas: Ideas) -> Callable[[MoDAShape, object, int], dict]:
    def launch(shape: MoDAShape, dtype, C: int) -> dict:
        return {"kernel": "ladder", "span_all": ideas.span_all, "grouped": ideas.grouped,
                "depth_in_dq": ideas.depth_in_dq, **tiles(C, shape.d)}
    return launch


def _step_launch(step: str) -> Callable[[MoDAShape, object, int], dict]:
    def launch(shape: MoDAShape, dtype, C: int) -> dict:
        return shipped.step_config(step, shape, C).to_dict()
    return launch


def _ours_launch(shape: MoDAShape, dtype, C: int) -> dict:
    return shipped.ours_config(shape, dtype).to_dict()


@dataclass(frozen=True)
class Rung:
    """One implementation: `fn(q, k, v, k_depth, v_depth, *, scale=None, chunk=C) -> out`.

    idea: what it adds to the rung before it; depth_utilization(T, G, C, L) -> eta; launch_config(shape,
    dtype, C) -> the tile/launch settings it runs with (the CSV's config column); unavailable(device) -> why
    it cannot run as itself there (None: it can), beside the registry's own check for the MoDA kernel.
    max_T: the naive loop is timed only up to the paper's T = 1024 (about a second a call there, growing
    as T^2); the flash-compatible full scan up to 4096 (its depth work grows as T^2 * L: seconds a call at
    T = 16384).
    """

    name: str
    label: str
    fn: Callable
    depth_utilization: Callable[[int, int, int, int], float]
    paper_ms: Optional[float]  # A100, bf16, B=1, T=1024, G=8, Hk=8, d=64, L=64, C=64, fwd+bwd
    launch_config: Callable[[MoDAShape, object, int], dict]
    idea: str = ""
    unavailable: Optional[Callable[[str], Optional[str]]] = None
    max_T: Optional[int] = None  # `moda-bench ablate` leaves the rung out above this T unless --all-rungs


def _step(name: str, label: str, idea: str, unavailable=None) -> Rung:
    return Rung(name, label, shipped.step_fn(name), _eta_step(name), None, _step_launch(name), idea, unavailable)


RUNGS: list[Rung] = [
    Rung("naive-torch", "PyTorch for-loop over positions and their depth KV", moda_naive, eta_naive, 2128.9,
         _naive_launch, "the function itself, one position at a time", max_T=1024),
    Rung("flash-compatible", "ladder kernel: flat depth axis scanned by every query block",
         _ladder_fn(FLASH), eta_flash_compatible, 13.102, _ladder_launch(FLASH),
         "one fused Triton kernel, one online softmax; depth cache as one flat T*L axis, full masked scan",
         max_T=4096),
    Rung("chunk-aware", "ladder kernel: a chunk of C positions visits only its C*L depth columns",
         _ladder_fn(CHUNK), eta_chunk_aware, 6.286, _ladder_launch(CHUNK),
         "each row block scans only the depth columns of its own positions"),
    Rung("group-aware", "ladder kernel: the G query heads of a KV head folded into the rows (paper final)",
         _ladder_fn(GROUP), eta_group_aware, 1.460, _ladder_launch(GROUP),
         "rows r = t*GP + g: K/V and depth tiles read once per group, C/G positions a block"),
    Rung("depth-bwd-in-dq", "ladder kernel: depth gradients in the query-major backward pass",
         _ladder_fn(GROUP_BWD), eta_group_aware, None, _ladder_launch(GROUP_BWD),
         "dk_depth, dv_depth from the dq pass's probabilities (no depth-major pass)"),
    _step("shipped-kernel", "shipped pointer kernel at the same ideas (dense depth tile, fused depth)",
          "none: the same ideas on the shipped code (unmasked interior tiles, 3-stage pipelining)"),
    _step("batched-tiles", "shipped kernel: batched 16-row depth sub-tiles, depth still fused",
          "depth sub-tiles of the fewest positions filling 16 rows (eta min(1, G/16))"),
    _step("tma-fwd", "shipped kernel: forward through tensor descriptors (TMA)",
          "descriptor (TMA) loads in the forward", shipped.tma_unavailable),
    _step("tma-bwd", "shipped kernel: folded-row descriptor backward",
          "folded-row backward with descriptor loads, heaviest key tiles first", shipped.tma_unavailable),
    Rung("ours", "production call: tuned/shipped config for the GPU and shape, its depth placement",
         shipped.moda_ours, eta_ours, None, _ours_launch,
         "the production config (tuned tiles, depth placement by T)"),
]


def rung(name: str) -> Rung:
    """The rung called `name` (ValueError listing the names otherwise)."""
    for r in RUNGS:
        if r.name == name:
            return r
    raise ValueError(f"unknown rung {name!r}; one of: {', '.join(r.name for r in RUNGS)}")


def names() -> list[str]:
    """Rung names in ladder order."""
    return [r.name for r in RUNGS]
