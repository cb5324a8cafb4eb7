"""Sweeps past one GPU: run the points of one or more sweeps on the GPUs of a node (one
long-lived worker process per GPU pulling from a shared queue) or over the ranks of a torchrun
launch, and merge the per-shard CSVs.

Pool: every point of every sweep of a run (a preset's T, G and L sweeps together) is one task,
tagged with its sweep. Cost model: a point costs `schema.pass_flops(pass, B, Hq, T, d, L) *
n_providers`.
  --gpus      one worker per GPU, started once per run; idle workers take the most expensive
              task left from a shared queue (largest first, ties in sweep then point order), so
              no GPU idles while another still has work and rough cost estimates do no harm.
  torchrun    ranks cannot share a queue (they never talk): every rank computes the same greedy
              longest-processing-time (LPT) plan of the whole pool and runs its share.
Rows are split back per sweep afterwards: each sweep CSV looks like a single-GPU run's.

Files:
  `<base>.gpu<k>.csv` / `.log`   worker on physical GPU k (`--gpus`); <base> is the sweep CSV
                                 for one sweep, `<dir>/pool.csv` for several
  `<stem>.rank<r>.csv`           rank r's rows of the sweep CSV `<stem>.csv` (torchrun)
Every shard CSV has exactly `schema.COLUMNS`; `merge_shards` / `moda-bench merge` combine them.
"""
from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Union

import typer

from moda_bench import schema
from moda_bench.bench.runner import Point

WORKER_MODULE = "moda_bench.bench.pool.worker"
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
    rank sees only some of its points."""
    return bool(pin_chunk) if pin_chunk is not None else (name == "C" or _sweep_varies_chunk(points))


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
# the same point is measured once per sweep it is in (a preset's base point: T, G and L sweeps)
DEDUPE_COLUMNS = ["sweep"] + schema.KEY_COLUMNS + ["timestamp"]


def merge_frames(frames: Sequence):
    """Concatenate shard frames, drop duplicates on sweep + KEY_COLUMNS + timestamp (first kept), and sort
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
    duplicates on sweep + row key + timestamp dropped, rows sorted deterministically."""
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
# one node: a pool of points, one long-lived worker process per GPU, a shared queue
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class WorkerFailure:
    """A worker that exited non-zero (or was killed): which GPU, exit code, rows it wrote out of
    the rows of the points it started, the point it was running when it died, last log lines."""

    gpu_index: int
    returncode: int
    rows_written: int
    rows_expected: int
    log_tail: str
    log_path: str
    crashed_on: str = ""  # Task.label() of the point in progress when it died ("" if none)


@dataclasses.dataclass
class PoolResult:
    """What run_pool did: this run's rows per sweep name (row order of a single-GPU run), the
    failed workers, the tasks no worker ran (every worker had exited), worker processes started."""

    rows: dict
    failures: list[WorkerFailure]
    not_run: list[Task]
    workers_started: int


WorkerCmd = Union[Sequence[str], Callable[[GpuSlot], Sequence[str]]]


def default_worker_cmd(slot: GpuSlot) -> list[str]:
    return [sys.executable, "-m", WORKER_MODULE]


def _tail(path: Path, n_lines: int = 15) -> str:
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return ""
    return "\n".join(lines[-n_lines:])


class _TaskQueue:
    """Tasks, most expensive first, shared by the worker threads.

    A task handed out but not yet acknowledged by its worker is 'pending': it may come back
    (put_back: the worker died before starting it), so `take` on an empty queue waits for the
    pending ones to settle instead of letting its worker quit early.
    """

    def __init__(self, tasks: Sequence[Task]):
        self._items = queue_order(tasks)
        self._pending = 0
        self._stopped = False
        self._cv = threading.Condition()

    def take(self) -> Task | None:
        with self._cv:
            while not self._items and self._pending and not self._stopped:
                self._cv.wait(0.5)
            if self._stopped or not self._items:
                return None
            self._pending += 1
            return self._items.pop(0)

    def started(self, task: Task) -> None:
        with self._cv:
            self._pending -= 1
            self._cv.notify_all()

    def put_back(self, task: Task) -> None:
        with self._cv:
            self._pending -= 1
            self._items = queue_order([*self._items, task])
            self._cv.notify_all()

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify_all()

    def remaining(self) -> list[Task]:
        with self._cv:
            return list(self._items)


@dataclasses.dataclass(eq=False)
class _Worker:
    slot: GpuSlot
    csv: Path
    log: Path
    argv: list
    env: dict
    proc: subprocess.Popen | None = None
    thread: threading.Thread | None = None
    current: Task | None = None  # started and not finished
    started: list = dataclasses.field(default_factory=list)  # tasks it started
    crashed_on: Task | None = None  # started, never finished: the worker died on it
    timed_out: bool = False


def _next_event(proc: subprocess.Popen, event: str, task_id: int | None = None) -> bool:
    """Read the worker's protocol stream up to `event` (for `task_id`); False at EOF (it exited)."""
    while True:
        line = proc.stdout.readline()
        if not line:
            return False
        try:
            msg = json.loads(line)
        except ValueError:
            continue  # not a protocol line
        if isinstance(msg, dict) and msg.get("event") == event and (task_id is None or msg.get("id") == task_id):
            return True


def _drive(w: _Worker, tasks: _TaskQueue) -> None:
    """Feed one worker from the shared queue until the queue is empty, stopped, or the worker dies.

    Protocol (worker.serve): the worker prints {"event": "ready"} once set up, then for each task
    line it reads on stdin {"event": "start", "id": n} and {"event": "done", "id": n}; it exits
    when stdin closes. A task the worker never started goes back to the queue; a task it started
    and never finished is recorded in crashed_on (not retried: it may well crash the next GPU too).
    """
    proc = w.proc
    try:
        if not _next_event(proc, "ready"):
            return
        while True:
            task = tasks.take()
            if task is None:
                return
            msg = {"id": task.id, "sweep": task.sweep, "point": {f: getattr(task.point, f) for f in _POINT_FIELDS},
                   "pin_chunk": task.pin_chunk}
            try:
                proc.stdin.write(json.dumps(msg) + "\n")
                proc.stdin.flush()
            except OSError:  # broken pipe: the worker is gone and never saw the task
                tasks.put_back(task)
                return
            if not _next_event(proc, "start", task.id):
                tasks.put_back(task)
                return
            tasks.started(task)
            w.current = task
            w.started.append(task)
            if not _next_event(proc, "done", task.id):
                w.crashed_on = task
                return
            w.current = None
    finally:
        try:
            proc.stdin.close()  # no more work: the worker finishes and exits
        except OSError:
            pass


def _point_key(p: Point) -> tuple:
    return (p.T, p.G, p.Hk, p.L, p.B, p.d, p.C, p.dtype)


def _row_key(row: dict) -> tuple | None:
    try:
        return tuple(int(row[c]) for c in ("T", "G", "Hk", "L", "B", "d", "C")) + (str(row["dtype"]),)
    except (TypeError, ValueError):
        return None


def _provider_rank(providers: Sequence[str]) -> dict:
    """Row order of a point in a single-GPU run: the baseline first, then the given order."""
    from moda_bench.bench.providers import BASELINE
    ordered = sorted(providers, key=lambda name: name != BASELINE)
    return {name: i for i, name in enumerate(ordered)}


def _lost_rows(w: _Worker, task: Task, providers: Sequence[str], pass_: str, have: set, meta: dict) -> list[dict]:
    """status=error rows for the providers of the point a worker died on that have no row."""
    import datetime as _dt
    from moda_bench.bench.runner import _base_row
    if w.timed_out:
        why = "killed: timeout_s exceeded"
    else:
        last = [ln.strip() for ln in _tail(w.log, 40).splitlines() if ln.strip()]
        why = f"exit code {w.proc.returncode}" + (f": {last[-1][:200]}" if last else "")
    reason = f"worker on GPU {w.slot.index} died while running this point ({why}); log {w.log}"
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    rows = []
    for prov in providers:
        if prov in have:
            continue
        row = _base_row(task.point, prov, pass_, task.sweep)
        row.update(meta)
        row.update(status=schema.ERROR, reason=reason, gpu_index=w.slot.index, timestamp=now)
        rows.append(row)
    return rows


def _collect(workers: Sequence[_Worker], tasks: Sequence[Task], sweeps: Sequence[SweepPlan],
             providers: Sequence[str], pass_: str, *, mark_lost: bool):
    """Rows of every worker shard (gpu_index = physical GPU), plus status=error rows for the
    points workers died on (mark_lost), split per sweep in single-GPU row order; and failures."""
    import pandas as pd
    by_key = {(t.sweep, _point_key(t.point)): t for t in tasks}
    frames, failures, shard_rows = [], [], {}
    for w in workers:
        frame = read_shard(w.csv) if w.csv.exists() else None
        if frame is not None and len(frame):
            frame = frame.assign(gpu_index=w.slot.index)  # physical index, not the worker's cuda:0
            frames.append(frame)
        shard_rows[id(w)] = frame
    some_meta = {}
    for f in frames:
        some_meta = {c: f.iloc[-1][c] for c in ("gpu", "torch_version", "triton_version", "git_commit")}
    for w in workers:
        frame, rc = shard_rows[id(w)], w.proc.returncode if w.proc is not None else None
        lost = []
        if mark_lost and w.crashed_on is not None:
            t = w.crashed_on
            mine = [] if frame is None else [r for r in frame.to_dict("records") if r["sweep"] == t.sweep
                                              and _row_key(r) == _point_key(t.point)]
            meta = ({c: frame.iloc[-1][c] for c in ("gpu", "torch_version", "triton_version", "git_commit")}
                    if frame is not None and len(frame) else some_meta) or {"git_commit": schema.git_commit()}
            lost = _lost_rows(w, t, providers, pass_, {r["provider"] for r in mine}, meta)
            if lost:
                frames.append(pd.DataFrame(lost, columns=schema.COLUMNS))
        if rc is not None and rc != 0:
            tail = _tail(w.log) + ("\n[killed: timeout_s exceeded]" if w.timed_out else "")
            failures.append(WorkerFailure(w.slot.index, rc, 0 if frame is None else len(frame),
                                          len(w.started) * len(providers), tail, str(w.log),
                                          w.crashed_on.label() if w.crashed_on is not None else ""))
    rank = _provider_rank(providers)
    rows = {}
    run_rows = merge_frames(frames)  # schema order, duplicates (key + timestamp) dropped
    for s in sweeps:
        part = run_rows[run_rows["sweep"] == s.name]
        if len(part):
            recs = part.to_dict("records")
            order = sorted(range(len(recs)), key=lambda i: (
                getattr(by_key.get((s.name, _row_key(recs[i]))), "index", len(s.points)),
                rank.get(recs[i]["provider"], len(rank)), str(recs[i]["timestamp"])))
            part = part.iloc[order]
        rows[s.name] = part.reset_index(drop=True)
    return rows, failures


def _write_sweeps(sweeps: Sequence[SweepPlan], rows: dict, existing: dict) -> None:
    """Each sweep CSV: its rows from before this run (kept, as run_sweep appends), then this run's."""
    import pandas as pd
    for s in sweeps:
        parts = [f for f in (existing.get(s.name), rows.get(s.name)) if f is not None and len(f)]
        if parts:
            write_csv_atomic(pd.concat(parts, ignore_index=True)[schema.COLUMNS], s.csv)


def run_pool(sweeps: Sequence[SweepPlan], providers: Sequence[str], pass_: str, *,
             gpus: Union[str, int] = "all", use_tuned: bool = True, warmup_ms: float = 25,
             rep_ms: float = 100, progress: bool = True, worker_cmd: WorkerCmd | None = None,
             keep_shards: bool = False, timeout_s: float | None = None, poll_s: float = 0.5,
             shard_base: Path | None = None) -> PoolResult:
    """Run every point of every sweep with one isolated worker process per GPU; write each
    sweep's rows to its CSV.

    Workers (`python -m moda_bench.bench.pool.worker --serve`, or `worker_cmd`: an argv prefix or a
    function of the GpuSlot returning one) start once for the whole run with
    CUDA_VISIBLE_DEVICES=<that GPU>, take tasks (one point of one sweep, all providers) from a
    shared queue, most expensive first, and append rows to `<base>.gpu<k>.csv` as they finish.

    A worker that crashes loses nothing already written; the point it was running gets
    status=error rows (reason: the exit and last log line) for its providers without a row; the
    points it never started go to the other workers. `timeout_s` bounds the whole run (workers
    still running are killed). Afterwards rows are split per sweep, ordered as a single-GPU run
    orders them, carry the physical GPU in gpu_index, and are added to each sweep's CSV (rows
    already there kept). Shard files are removed unless a worker failed or keep_shards. On
    Ctrl-C the workers are stopped, the rows so far are written, and the shards kept.
    """
    from rich.console import Console
    console = Console(stderr=True)
    sweeps = list(sweeps)
    providers = list(dict.fromkeys(providers))
    slots = resolve_gpus(gpus)
    existing = {}
    for s in sweeps:  # fail before any work if an output file cannot take the rows
        s.csv.parent.mkdir(parents=True, exist_ok=True)
        try:
            if s.csv.exists() and s.csv.stat().st_size:
                existing[s.name] = read_shard(s.csv)
        except ShardSchemaError as err:
            raise typer.BadParameter(f"{err}; write to a new file") from None
    tasks = plan_tasks(sweeps, pass_, len(providers))
    if not tasks:
        return PoolResult({s.name: merge_frames([]) for s in sweeps}, [], [], 0)
    base = Path(shard_base) if shard_base is not None else (
        sweeps[0].csv if len(sweeps) == 1 else sweeps[0].csv.with_name("pool.csv"))
    worker_cmd = worker_cmd if worker_cmd is not None else default_worker_cmd

    workers: list[_Worker] = []
    for slot in slots[: len(tasks)]:  # never more workers than points
        shard_csv, log = shard_path(base, "gpu", slot.index), shard_path(base, "gpu", slot.index, ".log")
        for stale in (shard_csv, log):
            stale.unlink(missing_ok=True)  # workers append: never mix in an old run's shard
        prefix = worker_cmd(slot) if callable(worker_cmd) else worker_cmd
        argv = [*prefix, "--serve", "--providers", ",".join(providers), "--pass", pass_, "--csv", str(shard_csv),
                "--gpu-index", str(slot.index), "--warmup-ms", str(warmup_ms), "--rep-ms", str(rep_ms),
                "--tuned" if use_tuned else "--no-tuned"]
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=slot.token, PYTHONUNBUFFERED="1")
        env[GPU_INDEX_ENV] = str(slot.index)
        workers.append(_Worker(slot, shard_csv, log, argv, env))

    total = len(tasks) * len(providers)
    names = ", ".join(s.name for s in sweeps)
    console.print(f"{'sweeps' if len(sweeps) > 1 else 'sweep'} [bold]{names}[/]: {len(tasks)} points x "
                  f"{len(providers)} providers on {len(workers)} GPU(s) "
                  f"[{', '.join(str(w.slot.index) for w in workers)}], largest points first")
    bar, task_all, gpu_bars = None, None, {}
    if progress:
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn, TimeRemainingColumn)
        bar = Progress(TextColumn("{task.description:>10}"), BarColumn(), MofNCompleteColumn(),
                       TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[now]}"),
                       console=console, transient=False)
        task_all = bar.add_task("all", total=total, now="")
        for w in workers:
            gpu_bars[id(w)] = bar.add_task(f"gpu {w.slot.index}", total=None, now="starting")

    def tick() -> None:
        done_all = 0
        for w in workers:
            done = count_rows(w.csv)
            done_all += done
            if bar is not None:
                if w.proc is not None and w.proc.poll() is not None:
                    now = "done" if w.proc.returncode == 0 else f"[red]exited ({w.proc.returncode})[/]"
                else:
                    now = w.current.label() if w.current is not None else "waiting"
                bar.update(gpu_bars[id(w)], completed=done, now=now)
        if bar is not None:
            bar.update(task_all, completed=min(done_all, total))

    queue = _TaskQueue(tasks)
    start = time.monotonic()
    if bar is not None:
        bar.start()
    try:
        for w in workers:
            with open(w.log, "wb") as logf:  # the child keeps its own descriptor
                w.proc = subprocess.Popen(w.argv, env=w.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=logf, text=True, bufsize=1)
            w.thread = threading.Thread(target=_drive, args=(w, queue), daemon=True,
                                        name=f"moda-bench-gpu{w.slot.index}")
            w.thread.start()
        while any(w.thread.is_alive() or w.proc.poll() is None for w in workers):
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                queue.stop()
                for w in workers:
                    if w.proc.poll() is None:
                        w.proc.kill()
                        w.timed_out = True
            tick()
            time.sleep(poll_s)
        tick()
    except BaseException:
        queue.stop()  # Ctrl-C or an error here: stop our own workers, keep their shards and rows
        if bar is not None:
            bar.stop()
        for w in workers:
            if w.proc is not None and w.proc.poll() is None:
                w.proc.terminate()
        for w in workers:
            if w.proc is not None:
                try:
                    w.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    w.proc.kill()
                    w.proc.wait()
            if w.thread is not None:
                w.thread.join(timeout=5)
        try:
            rows, _ = _collect([w for w in workers if w.proc is not None], tasks, sweeps, providers, pass_,
                               mark_lost=False)
            _write_sweeps(sweeps, rows, existing)
            console.print(f"interrupted: kept {sum(len(r) for r in rows.values())}/{total} rows; "
                          f"shards kept beside {base}")
        except Exception as err:  # never hide the interruption itself
            console.print(f"[red]could not write the rows so far:[/] {err}")
        raise
    finally:
        if bar is not None:
            bar.stop()
    for w in workers:
        w.thread.join()

    rows, failures = _collect(workers, tasks, sweeps, providers, pass_, mark_lost=True)
    _write_sweeps(sweeps, rows, existing)
    not_run = sorted(queue.remaining(), key=lambda t: t.id)

    for f in failures:
        console.print(f"[red]worker on GPU {f.gpu_index} failed[/] (exit code {f.returncode}); kept "
                      f"{f.rows_written}/{f.rows_expected} rows of the points it started"
                      + (f"; it died running {f.crashed_on} (its missing rows: status=error)" if f.crashed_on else "")
                      + f"; log {f.log_path}")
        if f.log_tail:
            console.print(f.log_tail, markup=False, highlight=False, soft_wrap=True)
    if not_run:
        console.print(f"[red]{len(not_run)} point(s) not run[/] (every worker had exited): "
                      + "; ".join(t.label() for t in not_run))
    if not failures and not not_run and not keep_shards:
        for w in workers:
            for p in (w.csv, w.log):
                p.unlink(missing_ok=True)
    for s in sweeps:
        console.print(f"sweep {s.name}: {len(rows[s.name])}/{len(s.points) * len(providers)} rows -> {s.csv}")
    if failures or not_run:
        console.print(f"[red]{len(failures)} worker(s) failed[/]; shards kept beside {base}")
    return PoolResult(rows, failures, not_run, sum(w.proc is not None for w in workers))


def run_sharded(points: Sequence[Point], providers: Sequence[str], pass_: str, csv_path: Path, *,
                sweep_name: str, gpus: Union[str, int] = "all", use_tuned: bool = True,
                warmup_ms: float = 25, rep_ms: float = 100, progress: bool = True,
                worker_cmd: WorkerCmd | None = None, keep_shards: bool = False,
                timeout_s: float | None = None, poll_s: float = 0.5, pin_chunk: bool | None = None):
    """One sweep over the GPUs of this node: `run_pool` with a single sweep into csv_path.

    Returns this run's rows as a DataFrame; `.attrs["worker_failures"]` lists WorkerFailure
    records (empty when all succeeded), `.attrs["not_run"]` the points no worker ran.
    """
    result = run_pool([SweepPlan(sweep_name, tuple(points), Path(csv_path), pin_chunk)], providers, pass_,
                      gpus=gpus, use_tuned=use_tuned, warmup_ms=warmup_ms, rep_ms=rep_ms, progress=progress,
                      worker_cmd=worker_cmd, keep_shards=keep_shards, timeout_s=timeout_s, poll_s=poll_s)
    rows = result.rows[sweep_name]
    rows.attrs["worker_failures"] = result.failures
    rows.attrs["not_run"] = result.not_run
    return rows


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
    """This rank's share of one sweep's points (same LPT plan on every rank)."""
    idx = assign_points(points, dist.world_size, pass_, n_providers)[dist.rank]
    return [points[i] for i in idx]


def rank_tasks(sweeps: Sequence[SweepPlan], dist: DistInfo, pass_: str, n_providers: int) -> list[Task]:
    """This rank's share of the whole pool of a run's sweeps (same LPT plan on every rank)."""
    return assign_tasks(plan_tasks(sweeps, pass_, n_providers), dist.world_size)[dist.rank]


def physical_gpu_index(local_rank: int) -> int:
    """Physical index of the GPU a local rank uses (through CUDA_VISIBLE_DEVICES if set)."""
    tokens = _visible_tokens()
    if tokens and local_rank < len(tokens) and tokens[local_rank].isdigit():
        return int(tokens[local_rank])
    return local_rank


def run_distributed_pool(sweeps: Sequence[SweepPlan], providers: Sequence[str], pass_: str, *,
                         dist: DistInfo | None = None, use_tuned: bool = True, warmup_ms: float = 25,
                         rep_ms: float = 100, progress: bool | None = None) -> dict:
    """Run this torchrun rank's share of the pooled points of all `sweeps` on cuda:LOCAL_RANK;
    each sweep's rows go to `<stem>.rank<RANK>.csv` beside its CSV (none when the rank has no
    point of that sweep).

    No process group is needed: ranks never talk; combine each sweep's shards afterwards with
    `moda-bench merge <dir>/<stem>.rank*.csv --out <dir>/<stem>.csv`. Returns {sweep: rows}.
    """
    from moda_bench.bench import runner  # looked up at call time (tests substitute run_sweep)
    dist = dist or detect_distributed()
    if dist is None:
        raise ValueError("run_distributed needs RANK and WORLD_SIZE (launch with torchrun)")
    sweeps, providers = list(sweeps), list(dict.fromkeys(providers))
    mine = rank_tasks(sweeps, dist, pass_, len(providers))
    gpu_index = physical_gpu_index(dist.local_rank)
    os.environ[GPU_INDEX_ENV] = str(gpu_index)
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
        out.unlink(missing_ok=True)
        todo = [t for t in mine if t.sweep == s.name]
        if todo:
            runner.run_sweep([t.point for t in todo], providers, pass_, out, sweep_name=s.name,
                             use_tuned=use_tuned, progress=(dist.rank == 0) if progress is None else progress,
                             device_index=dist.local_rank if has_cuda else None,
                             warmup_ms=warmup_ms, rep_ms=rep_ms, pin_chunk=todo[0].pin_chunk)
        frame = read_shard(out) if out.exists() else merge_frames([])
        if len(frame):
            frame = frame.assign(gpu_index=gpu_index)
            write_csv_atomic(frame, out)
        frames[s.name] = frame
    return frames


def run_distributed(points: Sequence[Point], providers: Sequence[str], pass_: str, csv_path: Path, *,
                    sweep_name: str, dist: DistInfo | None = None, use_tuned: bool = True,
                    warmup_ms: float = 25, rep_ms: float = 100, progress: bool | None = None,
                    pin_chunk: bool | None = None):
    """Run this torchrun rank's share of one sweep into `<stem>.rank<RANK>.csv` (see
    run_distributed_pool). Returns this rank's rows (DataFrame)."""
    return run_distributed_pool([SweepPlan(sweep_name, tuple(points), Path(csv_path), pin_chunk)], providers,
                                pass_, dist=dist, use_tuned=use_tuned, warmup_ms=warmup_ms, rep_ms=rep_ms,
                                progress=progress)[sweep_name]
