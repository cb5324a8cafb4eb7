"""Several nodes: this torchrun rank's share of a run's pooled points (pool.plan.rank_tasks, the
same greedy plan on every rank), run on cuda:LOCAL_RANK into `<stem>.rank<RANK>.csv` beside each
sweep's CSV. Ranks never talk (no process group, no NCCL); `moda-bench merge` combines the shards.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from moda_bench.bench.pool.merge import shard_path, stamp_gpu_index
from moda_bench.bench.pool.plan import DistInfo, SweepPlan, detect_distributed, physical_gpu_index, rank_tasks
from moda_bench.bench.runner import Point


def run_distributed_pool(sweeps: Sequence[SweepPlan], spec, *, dist: DistInfo | None = None,
                         progress: bool | None = None, done: dict | None = None) -> dict:
    """Run this torchrun rank's share of the pooled points of all `sweeps` of `spec`
    (bench.spec.RunSpec) on cuda:LOCAL_RANK, pinned to item LOCAL_RANK % len of spec.pin_cpu if set;
    each sweep's rows go to `<stem>.rank<RANK>.csv` beside its CSV (none when the rank has no
    point of that sweep).

    No process group is needed: ranks never talk; combine each sweep's shards afterwards with
    `moda-bench merge <dir>/<stem>.rank*.csv --out <dir>/<stem>.csv`. Returns {sweep: rows}.

    done ({sweep: point keys}, `--resume`): those points are skipped and the rank's shard is
    continued (appended to) instead of started afresh; the share of each rank is planned over
    all the points as before, so a resumed rank runs what is left of its own share.
    """
    from moda_bench.bench import runner  # looked up at call time (tests substitute run_sweep)
    from moda_bench.bench.runstate import point_key
    dist = dist or detect_distributed()
    if dist is None:
        raise ValueError("run_distributed needs RANK and WORLD_SIZE (launch with torchrun)")
    sweeps = list(sweeps)
    mine = rank_tasks(sweeps, dist, spec.pass_, len(spec.providers))
    gpu_index = physical_gpu_index(dist.local_rank)
    from moda_bench import host
    host.pin_process(spec.pin_cpu, dist.local_rank)   # before CUDA starts its threads; the CLI did it already
    try:
        import torch
        has_cuda = torch.cuda.is_available()
        if has_cuda:
            torch.cuda.set_device(dist.local_rank)
    except ImportError:  # pragma: no cover
        has_cuda = False
    frames = {}
    for s in sweeps:
        out = shard_path(s.csv, "rank", dist.rank)
        out.parent.mkdir(parents=True, exist_ok=True)
        if done is None:
            out.unlink(missing_ok=True)
        skip = (done or {}).get(s.name, set())
        todo = [t for t in mine if t.sweep == s.name and point_key(t.point) not in skip]
        if todo:
            runner.run_sweep([t.point for t in todo], spec, out, sweep_name=s.name,
                             progress=(dist.rank == 0) if progress is None else progress,
                             device_index=dist.local_rank if has_cuda else None, pin_chunk=todo[0].pin_chunk,
                             worker=dist.local_rank)
        frames[s.name] = stamp_gpu_index(out, gpu_index)
    return frames


def run_distributed(points: Sequence[Point], spec, csv_path: Path, *, sweep_name: str,
                    dist: DistInfo | None = None, progress: bool | None = None, pin_chunk: bool | None = None):
    """Run this torchrun rank's share of one sweep into `<stem>.rank<RANK>.csv` (see
    run_distributed_pool). Returns this rank's rows (DataFrame)."""
    return run_distributed_pool([SweepPlan(sweep_name, tuple(points), Path(csv_path), pin_chunk)], spec,
                                dist=dist, progress=progress)[sweep_name]
