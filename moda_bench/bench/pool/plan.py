"""Where the points of a run go: the cost model, the plan of a pool of sweeps (tasks, queue
order, the greedy longest-processing-time split), the GPUs of this node and the torchrun
environment.

A run is one or more sweeps (`SweepPlan`); every point of every sweep is one `Task`, tagged with
its sweep. A point costs `schema.pass_flops(pass, B, Hq, T, d, L) * n_providers`.
  --gpus      (pool.local) idle workers take the most expensive task left from a shared queue
              (`queue_order`: largest first, ties in sweep then point order).
  torchrun    (pool.distributed) ranks never talk, so every rank computes the same greedy LPT
              plan of the whole pool (`assign_tasks`) and runs its share (`rank_tasks`).
Nothing here imports torch at module level or starts a process.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Union

import typer

from moda_bench import schema
from moda_bench.bench.runner import Point

# ---------------------------------------------------------------------------------------------
# cost model and plans
# ---------------------------------------------------------------------------------------------

def point_cost(point: Point, pass_: str, n_providers: int = 1) -> float:
    """Estimated cost of one point: useful FLOPs of the pass times the number of providers."""
    return schema.pass_flops(pass_, point.B, point.Hq, point.T, point.d, point.L) * max(n_providers, 1)


def assign_costs(costs: Sequence[float], n_shards: int) -> list[list[int]]:
    """Greedy LPT: indices into `costs` for each of `n_shards` shards (each list in index order).

    Items are taken by decreasing cost (ties: lower index first) and each goes to the shard with
    the least load so far (ties: lower shard). Pure function of its inputs: identical on all ranks.
    """
    if n_shards < 1:
        raise ValueError(f"n_shards must be >= 1, got {n_shards}")
    order = sorted(range(len(costs)), key=lambda i: (-costs[i], i))
    loads = [0.0] * n_shards
    shards: list[list[int]] = [[] for _ in range(n_shards)]
    for i in order:
        k = min(range(n_shards), key=lambda s: (loads[s], s))
        shards[k].append(i)
        loads[k] += costs[i]
    return [sorted(s) for s in shards]


def assign_points(points: Sequence[Point], n_shards: int, pass_: str, n_providers: int = 1) -> list[list[int]]:
    """Greedy LPT of one sweep's points by `point_cost` (see assign_costs)."""
    return assign_costs([point_cost(p, pass_, n_providers) for p in points], n_shards)


def resolve_pin_chunk(name: str, points: Sequence[Point], pin_chunk: bool | None = None) -> bool:
    """Whether MoDA's block_m is pinned to each point's C: as asked, else run_sweep's own rule
    (a C sweep, or points that differ in C) decided over the whole sweep, since a worker or a
    rank sees only some of its points (a shard may hold a single C)."""
    return bool(pin_chunk) if pin_chunk is not None else (name == "C" or len({p.C for p in points}) > 1)


@dataclasses.dataclass(frozen=True)
class SweepPlan:
    """One sweep of a run: its name (the rows' `sweep`), its points (duplicates dropped), the CSV
    its rows go to, and MoDA chunk pinning (None: resolve_pin_chunk's rule)."""

    name: str
    points: tuple[Point, ...]
    csv: Path
    pin_chunk: bool | None = None

    def __post_init__(self):
        object.__setattr__(self, "points", tuple(dict.fromkeys(self.points)))
        object.__setattr__(self, "csv", Path(self.csv))


@dataclasses.dataclass(frozen=True)
class Task:
    """One point of one sweep, every provider of it: the unit a worker (or rank) runs."""

    id: int  # position in the pool: sweeps in order, then points in order
    sweep: str
    index: int  # position of the point in its sweep
    point: Point
    pin_chunk: bool
    cost: float

    def label(self) -> str:
        p = self.point
        return f"{self.sweep}: T={p.T} G={p.G} Hk={p.Hk} L={p.L} B={p.B} d={p.d} C={p.C}"


def plan_tasks(sweeps: Sequence[SweepPlan], pass_: str, n_providers: int = 1) -> list[Task]:
    """Every point of every sweep as a Task (in sweep order, then point order), with its cost."""
    names = [s.name for s in sweeps]
    if len(set(names)) != len(names):
        raise ValueError(f"sweep names repeat: {names}")
    tasks: list[Task] = []
    for s in sweeps:
        pin = resolve_pin_chunk(s.name, s.points, s.pin_chunk)
        for i, p in enumerate(s.points):
            tasks.append(Task(len(tasks), s.name, i, p, pin, point_cost(p, pass_, n_providers)))
    return tasks


def queue_order(tasks: Sequence[Task]) -> list[Task]:
    """The order a shared queue hands tasks out: most expensive first, ties by pool position."""
    return sorted(tasks, key=lambda t: (-t.cost, t.id))


def assign_tasks(tasks: Sequence[Task], n_shards: int) -> list[list[Task]]:
    """Greedy LPT plan of a whole pool (torchrun ranks): the tasks of each shard, in pool order."""
    return [[tasks[i] for i in idx] for idx in assign_costs([t.cost for t in tasks], n_shards)]


# ---------------------------------------------------------------------------------------------
# GPUs of this node
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class GpuSlot:
    """One GPU a worker is pinned to: `token` goes into CUDA_VISIBLE_DEVICES, `index` into rows."""

    token: str
    index: int


def _cuda_device_count() -> int:
    import torch  # lazy: planning and merging work without torch initialising CUDA
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def visible_devices() -> list[str] | None:
    """Entries of this process's CUDA_VISIBLE_DEVICES, or None when it is unset."""
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    return [t.strip() for t in raw.split(",") if t.strip()]


def _slots_from_tokens(tokens: list[str]) -> list[GpuSlot]:
    # Integer tokens are physical indices; UUID/MIG tokens have none, so their position stands in.
    return [GpuSlot(t, int(t) if t.isdigit() else pos) for pos, t in enumerate(tokens)]


def resolve_gpus(gpus: Union[str, int]) -> list[GpuSlot]:
    """'all', a count N, or a comma list of physical indices ('0,2,5') -> the GPUs to use.

    'all' and N honour the parent's CUDA_VISIBLE_DEVICES (its entries, in order); an explicit
    list names physical GPUs directly.
    """
    text = str(gpus).strip().lower()
    if "," in text:  # explicit list; one named GPU is written "3," (or use CUDA_VISIBLE_DEVICES)
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items or not all(t.isdigit() for t in items):
            raise typer.BadParameter(f"--gpus list must be comma-separated GPU indices, got {gpus!r}")
        if len(set(items)) != len(items):
            raise typer.BadParameter(f"--gpus list repeats a GPU: {gpus!r}")
        return [GpuSlot(t, int(t)) for t in items]
    tokens = visible_devices()
    if tokens is None:
        tokens = [str(i) for i in range(_cuda_device_count())]
    if text == "all":
        if not tokens:
            raise typer.BadParameter("--gpus all: no CUDA GPU is visible on this machine")
        return _slots_from_tokens(tokens)
    if not text.isdigit() or int(text) < 1:
        raise typer.BadParameter(f"--gpus must be 'all', a GPU count >= 1 or a list like 0,2; got {gpus!r}")
    n = int(text)
    if n > len(tokens):
        raise typer.BadParameter(f"--gpus {n}: only {len(tokens)} GPU(s) visible on this machine")
    return _slots_from_tokens(tokens)[:n]


# ---------------------------------------------------------------------------------------------
# several nodes: the torchrun environment
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class DistInfo:
    """This process's place in a torchrun launch."""

    rank: int
    world_size: int
    local_rank: int


def detect_distributed(env: dict | None = None) -> DistInfo | None:
    """RANK / WORLD_SIZE / LOCAL_RANK from the environment (torchrun sets them), else None.

    LOCAL_RANK defaults to RANK when absent. Raises ValueError for inconsistent values.
    """
    env = os.environ if env is None else env
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    try:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        local = int(env.get("LOCAL_RANK", rank))
    except ValueError:
        raise ValueError(f"RANK/WORLD_SIZE/LOCAL_RANK must be integers, got RANK={env.get('RANK')!r} "
                         f"WORLD_SIZE={env.get('WORLD_SIZE')!r} LOCAL_RANK={env.get('LOCAL_RANK')!r}") from None
    if world < 1 or not 0 <= rank < world or local < 0:
        raise ValueError(f"inconsistent torchrun environment: RANK={rank} WORLD_SIZE={world} LOCAL_RANK={local}")
    return DistInfo(rank, world, local)


def rank_points(points: Sequence[Point], dist: DistInfo, pass_: str, n_providers: int) -> list[Point]:
    """This rank's share of one sweep's points (same LPT plan on every rank)."""
    idx = assign_points(points, dist.world_size, pass_, n_providers)[dist.rank]
    return [points[i] for i in idx]


def rank_tasks(sweeps: Sequence[SweepPlan], dist: DistInfo, pass_: str, n_providers: int) -> list[Task]:
    """This rank's share of the whole pool of a run's sweeps (same LPT plan on every rank)."""
    return assign_tasks(plan_tasks(sweeps, pass_, n_providers), dist.world_size)[dist.rank]


def physical_gpu_index(local_rank: int) -> int:
    """Physical index of the GPU a local rank uses (through CUDA_VISIBLE_DEVICES if set)."""
    tokens = visible_devices()
    if tokens and local_rank < len(tokens) and tokens[local_rank].isdigit():
        return int(tokens[local_rank])
    return local_rank
