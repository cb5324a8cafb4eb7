"""Sweeps past one GPU: shard the points of a sweep over the GPUs of a node (one worker process
per GPU) or over the ranks of a torchrun launch, and merge the per-shard CSVs.

Cost model: a point costs `schema.pass_flops(pass, B, Hq, T, d, L) * n_providers`; points go to
shards by greedy longest-processing-time (LPT) assignment, deterministic for a given point list
(ties broken by point order, then by shard number), so every torchrun rank computes the same plan.

Files, next to the sweep CSV `<dir>/<stem>.csv`:
  `<stem>.gpu<k>.csv` / `.log` / `.points.json`  one worker per physical GPU k (`--gpus`)
  `<stem>.rank<r>.csv`                            one shard per torchrun rank r
Every shard CSV has exactly `schema.COLUMNS`; `merge_shards` / `moda-bench merge` combine them.
"""
from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Union

import typer

from . import schema
from .runner import Point

WORKER_MODULE = "moda_bench.sweeps.worker"
GPU_INDEX_ENV = "MODA_BENCH_GPU_INDEX"  # physical GPU index of a worker, for its rows' gpu_index
_POINT_FIELDS = [f.name for f in dataclasses.fields(Point)]


# ---------------------------------------------------------------------------------------------
# planning
# ---------------------------------------------------------------------------------------------

def _sweep_varies_chunk(points: Sequence[Point]) -> bool:
    """Whether the whole sweep varies C. A shard may hold a single C, so run_sweep's own
    'pin block_m when the points differ in C' rule must see this answer, not its shard's."""
    return len({p.C for p in points}) > 1


def point_cost(point: Point, pass_: str, n_providers: int = 1) -> float:
    """Estimated cost of one point: useful FLOPs of the pass times the number of providers."""
    return schema.pass_flops(pass_, point.B, point.Hq, point.T, point.d, point.L) * max(n_providers, 1)


def assign_points(points: Sequence[Point], n_shards: int, pass_: str, n_providers: int = 1) -> list[list[int]]:
    """Greedy LPT: indices into `points` for each of `n_shards` shards (each list in point order).

    Points are taken by decreasing cost (ties: lower index first) and each goes to the shard with
    the least load so far (ties: lower shard). Pure function of its inputs: identical on all ranks.
    """
    if n_shards < 1:
        raise ValueError(f"n_shards must be >= 1, got {n_shards}")
    costs = [point_cost(p, pass_, n_providers) for p in points]
    order = sorted(range(len(points)), key=lambda i: (-costs[i], i))
    loads = [0.0] * n_shards
    shards: list[list[int]] = [[] for _ in range(n_shards)]
    for i in order:
        k = min(range(n_shards), key=lambda s: (loads[s], s))
        shards[k].append(i)
        loads[k] += costs[i]
    return [sorted(s) for s in shards]


def points_to_json(points: Sequence[Point]) -> str:
    """JSON list of point fields (T, G, Hk, L, B, d, C, dtype); Hq is derived, not stored."""
    return json.dumps([{f: getattr(p, f) for f in _POINT_FIELDS} for p in points])


def points_from_json(text: str) -> list[Point]:
    """Inverse of `points_to_json` (extra keys such as Hq are ignored)."""
    return [Point(**{f: item[f] for f in _POINT_FIELDS if f in item}) for item in json.loads(text)]


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


def _visible_tokens() -> list[str] | None:
    """Entries of the parent's CUDA_VISIBLE_DEVICES, or None when it is unset."""
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
    tokens = _visible_tokens()
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
# reading and merging shard CSVs
# ---------------------------------------------------------------------------------------------

class ShardSchemaError(ValueError):
    """A shard CSV whose columns are not schema.COLUMNS (message names the file)."""


def shard_path(csv_path: Path, kind: str, k: int, suffix: str = ".csv") -> Path:
    """`<dir>/<stem>.<kind><k><suffix>`, e.g. results/paper.rank3.csv or results/paper.gpu1.log."""
    csv_path = Path(csv_path)
    return csv_path.with_name(f"{csv_path.stem}.{kind}{k}{suffix}")


def count_rows(path: Path) -> int:
    """Complete data rows in a CSV written row by row (0 if absent); cheap enough to poll."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return 0
    return max(data.count(b"\n") - 1, 0)


def read_shard(path: Path):
    """One shard as a DataFrame with columns exactly schema.COLUMNS (in that order).

    A last line without a newline (worker killed mid-write) is dropped; an empty file gives an
    empty frame. Raises ShardSchemaError naming the file when the columns differ.
    """
    import pandas as pd
    path = Path(path)
    text = path.read_text()
    if text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
    if not text.strip():
        return pd.DataFrame(columns=schema.COLUMNS)
    try:
        frame = pd.read_csv(io.StringIO(text), keep_default_na=True)
    except (pd.errors.ParserError, UnicodeDecodeError) as err:
        raise ShardSchemaError(f"{path}: not a readable CSV ({err})") from None
    got = list(frame.columns)
    if set(got) != set(schema.COLUMNS) or len(got) != len(schema.COLUMNS):
        missing = [c for c in schema.COLUMNS if c not in got]
        extra = [c for c in got if c not in schema.COLUMNS]
        raise ShardSchemaError(
            f"{path}: columns differ from the moda-bench schema (missing {missing or 'none'}, "
            f"unexpected {extra or 'none'})")
    return frame[schema.COLUMNS]


SORT_COLUMNS = ["sweep", "pass", "provider"] + schema.CONFIG_COLUMNS + ["timestamp", "gpu_index"]
DEDUPE_COLUMNS = schema.KEY_COLUMNS + ["timestamp"]


def merge_frames(frames: Sequence):
    """Concatenate shard frames, drop duplicates on KEY_COLUMNS + timestamp (first kept), and sort
    deterministically by sweep, pass, provider, configuration, timestamp, gpu_index."""
    import pandas as pd
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame(columns=schema.COLUMNS)
    merged = pd.concat(frames, ignore_index=True)[schema.COLUMNS]
    merged = merged.drop_duplicates(subset=DEDUPE_COLUMNS, keep="first")
    merged = merged.sort_values(SORT_COLUMNS, kind="mergesort", na_position="last")
    return merged.reset_index(drop=True)


def expand_shard_inputs(inputs: Sequence[Path], exclude: Path | None = None) -> list[Path]:
    """Files as given; a directory contributes its `*.csv` files (sorted), `exclude` left out."""
    files: list[Path] = []
    skip = Path(exclude).resolve() if exclude is not None else None
    for item in inputs:
        item = Path(item)
        if item.is_dir():
            found = sorted(p for p in item.glob("*.csv") if p.is_file())
            files.extend(p for p in found if p.resolve() != skip)
        elif item.is_file():
            files.append(item)
        else:
            raise FileNotFoundError(f"{item}: no such shard file or directory")
    seen, unique = set(), []
    for f in files:
        if f.resolve() not in seen:
            seen.add(f.resolve())
            unique.append(f)
    return unique


def write_csv_atomic(frame, path: Path) -> None:
    """Write a frame to path through a temporary file (no half-written result on interruption)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    frame.to_csv(tmp, index=False)
    os.replace(tmp, path)


def merge_shards(files: Sequence[Path], out: Path | None = None):
    """Read, check and merge shard CSVs; write `out` if given. Returns the merged DataFrame."""
    merged = merge_frames([read_shard(f) for f in files])
    if out is not None:
        write_csv_atomic(merged, out)
    return merged


def merge_command(
    inputs: Annotated[list[Path], typer.Argument(help="Shard CSV files and/or directories of shard CSVs.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Merged CSV to write.")],
) -> None:
    """Merge shard CSVs (from --gpus workers or torchrun ranks) into one CSV: schema checked,
    duplicates on the row key + timestamp dropped, rows sorted deterministically."""
    from rich.console import Console
    console = Console(stderr=True, soft_wrap=True)
    try:
        files = expand_shard_inputs(inputs, exclude=out)
    except FileNotFoundError as err:
        console.print(f"[red]error:[/] {err}")
        raise typer.Exit(2)
    if not files:
        console.print(f"[red]error:[/] no CSV files found in {', '.join(map(str, inputs))}")
        raise typer.Exit(2)
    try:
        merged = merge_shards(files, out)
    except ShardSchemaError as err:
        console.print(f"[red]error:[/] {err}")
        raise typer.Exit(1)
    console.print(f"merged {len(files)} file(s) -> {out} ({len(merged)} rows)")


# ---------------------------------------------------------------------------------------------
# one node, one worker process per GPU
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class WorkerFailure:
    """A worker that exited non-zero (or was killed): which GPU, exit code, last stderr lines."""

    gpu_index: int
    returncode: int
    rows_written: int
    rows_expected: int
    log_tail: str
    log_path: str


WorkerCmd = Union[Sequence[str], Callable[[GpuSlot], Sequence[str]]]


def default_worker_cmd(slot: GpuSlot) -> list[str]:
    return [sys.executable, "-m", WORKER_MODULE]


def _tail(path: Path, n_lines: int = 15) -> str:
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return ""
    return "\n".join(lines[-n_lines:])


def _tick_progress(bar, task_all, gpu_tasks: dict, jobs: list) -> None:
    done_all = 0
    for job in jobs:
        done = min(count_rows(job["csv"]), job["expected"])
        done_all += done
        if bar is not None:
            bar.update(gpu_tasks[job["slot"].index], completed=done)
    if bar is not None:
        bar.update(task_all, completed=done_all)


def run_sharded(points: Sequence[Point], providers: Sequence[str], pass_: str, csv_path: Path, *,
                sweep_name: str, gpus: Union[str, int] = "all", use_tuned: bool = True,
                warmup_ms: float = 25, rep_ms: float = 100, progress: bool = True,
                worker_cmd: WorkerCmd | None = None, keep_shards: bool = False,
                timeout_s: float | None = None, poll_s: float = 0.5):
    """Run a sweep with one isolated worker process per GPU; merge the shards into csv_path.

    Each worker (`python -m moda_bench.sweeps.worker`, or `worker_cmd`: an argv prefix or a
    function of the GpuSlot returning one) runs with CUDA_VISIBLE_DEVICES=<that GPU> on its
    LPT share of the points and appends rows to `<stem>.gpu<k>.csv` as they finish. Rows of a
    worker that crashes are kept; its failure is printed (exit code, stderr tail). The merged
    rows carry the physical GPU index in gpu_index and are added to csv_path (existing rows kept,
    as run_sweep appends). `timeout_s` bounds the whole run (workers still running are killed).
    Shard files are removed afterwards unless a worker failed or keep_shards. Returns this run's rows as a DataFrame; `.attrs["worker_failures"]` lists
    WorkerFailure records (empty when all succeeded).
    """
    from rich.console import Console
    console = Console(stderr=True)
    csv_path = Path(csv_path)
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    points, providers = list(dict.fromkeys(points)), list(dict.fromkeys(providers))  # each once
    slots = resolve_gpus(gpus)
    try:  # fail before any work if the output file cannot take the merged rows
        existing = [read_shard(csv_path)] if csv_path.exists() and csv_path.stat().st_size else []
    except ShardSchemaError as err:
        raise typer.BadParameter(f"{err}; write to a new file") from None
    plan = assign_points(points, len(slots), pass_, len(providers))
    worker_cmd = worker_cmd if worker_cmd is not None else default_worker_cmd
    pin_flag = ["--pin-chunk"] if _sweep_varies_chunk(points) else []

    jobs = []
    for slot, idx in zip(slots, plan):
        if not idx:
            continue  # more GPUs than points
        shard_csv = shard_path(csv_path, "gpu", slot.index)
        log = shard_path(csv_path, "gpu", slot.index, ".log")
        pts_file = shard_path(csv_path, "gpu", slot.index, ".points.json")
        for stale in (shard_csv, log):
            stale.unlink(missing_ok=True)  # run_sweep appends: never mix in an old run's shard
        pts_file.write_text(points_to_json([points[i] for i in idx]))
        prefix = worker_cmd(slot) if callable(worker_cmd) else worker_cmd
        argv = [*prefix, "--points", str(pts_file), "--providers", ",".join(providers), "--pass", pass_,
                "--csv", str(shard_csv), "--sweep-name", sweep_name, "--gpu-index", str(slot.index),
                "--warmup-ms", str(warmup_ms), "--rep-ms", str(rep_ms),
                "--tuned" if use_tuned else "--no-tuned", *pin_flag]
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=slot.token, PYTHONUNBUFFERED="1")
        env[GPU_INDEX_ENV] = str(slot.index)
        jobs.append({"slot": slot, "csv": shard_csv, "log": log, "points_file": pts_file, "argv": argv,
                     "env": env, "expected": len(idx) * len(providers), "proc": None})

    total = sum(j["expected"] for j in jobs)
    console.print(f"sweep [bold]{sweep_name}[/]: {len(points)} points x {len(providers)} providers on "
                  f"{len(jobs)} GPU(s) [{', '.join(str(j['slot'].index) for j in jobs)}]")
    bar, task_all, gpu_tasks = None, None, {}
    if progress:
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn, TimeRemainingColumn)
        bar = Progress(TextColumn("{task.description:>10}"), BarColumn(), MofNCompleteColumn(),
                       TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=False)
        task_all = bar.add_task("all", total=total)
        for j in jobs:
            gpu_tasks[j["slot"].index] = bar.add_task(f"gpu {j['slot'].index}", total=j["expected"])
        bar.start()

    start = time.monotonic()
    try:
        for j in jobs:
            logf = open(j["log"], "wb")
            j["proc"] = subprocess.Popen(j["argv"], env=j["env"], stdout=logf, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
            logf.close()  # the child holds its own descriptor
        while any(j["proc"].poll() is None for j in jobs):
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                for j in jobs:
                    if j["proc"].poll() is None:
                        j["proc"].kill()
                        j["timed_out"] = True
            _tick_progress(bar, task_all, gpu_tasks, jobs)
            time.sleep(poll_s)
        _tick_progress(bar, task_all, gpu_tasks, jobs)
    except BaseException:
        for j in jobs:  # Ctrl-C or an error here: stop our own workers, keep their shards
            if j["proc"] is not None and j["proc"].poll() is None:
                j["proc"].terminate()
        for j in jobs:
            if j["proc"] is not None:
                try:
                    j["proc"].wait(timeout=10)
                except subprocess.TimeoutExpired:
                    j["proc"].kill()
        raise
    finally:
        if bar is not None:
            bar.stop()

    failures: list[WorkerFailure] = []
    frames = []
    for j in jobs:
        slot, rc = j["slot"], j["proc"].returncode
        frame = read_shard(j["csv"]) if j["csv"].exists() else None
        if frame is not None and len(frame):
            frame = frame.assign(gpu_index=slot.index)  # physical index, not the worker's cuda:0
            frames.append(frame)
        if rc != 0:
            tail = _tail(j["log"]) + ("\n[killed: timeout_s exceeded]" if j.get("timed_out") else "")
            failures.append(WorkerFailure(slot.index, rc, 0 if frame is None else len(frame), j["expected"],
                                          tail, str(j["log"])))

    run_rows = merge_frames(frames)
    write_csv_atomic(merge_frames(existing + [run_rows]), csv_path)

    for f in failures:
        console.print(f"[red]worker on GPU {f.gpu_index} failed[/] (exit code {f.returncode}); "
                      f"kept {f.rows_written}/{f.rows_expected} rows; log {f.log_path}")
        if f.log_tail:
            console.print(f.log_tail, markup=False, highlight=False, soft_wrap=True)
    if not failures and not keep_shards:
        for j in jobs:
            for p in (j["csv"], j["log"], j["points_file"]):
                p.unlink(missing_ok=True)
    console.print(f"{len(run_rows)}/{total} rows -> {csv_path}"
                  + (f" ([red]{len(failures)} worker(s) failed[/]; shards kept)" if failures else ""))
    run_rows.attrs["worker_failures"] = failures
    return run_rows


# ---------------------------------------------------------------------------------------------
# several nodes: torchrun
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
    """This rank's share of the points (same LPT plan on every rank)."""
    idx = assign_points(points, dist.world_size, pass_, n_providers)[dist.rank]
    return [points[i] for i in idx]


def physical_gpu_index(local_rank: int) -> int:
    """Physical index of the GPU a local rank uses (through CUDA_VISIBLE_DEVICES if set)."""
    tokens = _visible_tokens()
    if tokens and local_rank < len(tokens) and tokens[local_rank].isdigit():
        return int(tokens[local_rank])
    return local_rank


def run_distributed(points: Sequence[Point], providers: Sequence[str], pass_: str, csv_path: Path, *,
                    sweep_name: str, dist: DistInfo | None = None, use_tuned: bool = True,
                    warmup_ms: float = 25, rep_ms: float = 100, progress: bool | None = None):
    """Run this torchrun rank's share of a sweep on cuda:LOCAL_RANK into `<stem>.rank<RANK>.csv`.

    No process group is needed: ranks never talk; combine the shards afterwards with
    `moda-bench merge <dir> --out <csv>`. Returns this rank's rows (DataFrame).
    """
    from . import runner  # looked up at call time (tests substitute run_sweep)
    dist = dist or detect_distributed()
    if dist is None:
        raise ValueError("run_distributed needs RANK and WORLD_SIZE (launch with torchrun)")
    points, providers = list(dict.fromkeys(points)), list(dict.fromkeys(providers))
    mine = rank_points(points, dist, pass_, len(providers))
    out = shard_path(Path(csv_path), "rank", dist.rank)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    gpu_index = physical_gpu_index(dist.local_rank)
    os.environ[GPU_INDEX_ENV] = str(gpu_index)
    try:
        import torch
        has_cuda = torch.cuda.is_available()
        if has_cuda:
            torch.cuda.set_device(dist.local_rank)
    except ImportError:  # pragma: no cover
        has_cuda = False
    if mine:
        runner.run_sweep(mine, providers, pass_, out, sweep_name=sweep_name, use_tuned=use_tuned,
                         progress=(dist.rank == 0) if progress is None else progress,
                         device_index=dist.local_rank if has_cuda else None,
                         warmup_ms=warmup_ms, rep_ms=rep_ms,
                         **({"pin_chunk": True} if _sweep_varies_chunk(points) else {}))
    frame = read_shard(out) if out.exists() else merge_frames([])
    if len(frame):
        frame = frame.assign(gpu_index=gpu_index)
        write_csv_atomic(frame, out)
    return frame
