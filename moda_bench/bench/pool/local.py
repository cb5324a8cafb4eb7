"""One node, several GPUs (`moda-bench sweep --gpus`): a pool of the points of a run's sweeps,
one long-lived worker process per GPU (`python -m moda_bench.bench.pool.worker --serve`, with
CUDA_VISIBLE_DEVICES set to its GPU) pulling tasks from a shared queue, most expensive first
(pool.plan), each appending its rows to its own shard (pool.merge names them).

Afterwards the shards' rows are split per sweep, ordered as a single-GPU run orders them and
written to each sweep's CSV. A worker that crashes keeps its rows; the point it was running gets
status=error rows naming the GPU and the exit; the points it never started go to the others.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Union

import typer

from moda_bench import results, schema
from moda_bench.bench.pool.merge import count_rows, merge_frames, read_shard, shard_path
from moda_bench.bench.pool.plan import GpuSlot, SweepPlan, Task, plan_tasks, queue_order, resolve_gpus
from moda_bench.bench.runner import Point, base_row, schema_rows

WORKER_MODULE = "moda_bench.bench.pool.worker"

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


def _die_with_parent() -> None:
    """In a worker before it starts (Linux): SIGKILL when the pool's process dies, so a killed run
    leaves no worker writing into a shard that a `--resume` folds in meanwhile."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))   # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


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
    task_started: float = 0.0  # time.monotonic() when `current` started
    point_timed_out: bool = False  # killed for spending more than point_timeout_s on `current`
    lost: list = dataclasses.field(default_factory=list)  # (task, reason) of points it died on, earlier lives
    restarts: int = 0


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
            msg = {"id": task.id, "sweep": task.sweep, "point": task.point.fields(), "pin_chunk": task.pin_chunk}
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
            w.task_started = time.monotonic()
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


_INT_FIELDS = ("T", "G", "Hk", "L", "B", "d", "C", "depth_grad", "Tq", "S")


def _point_key(p: Point) -> tuple:
    d = p.to_dict()
    return tuple(int(d[c]) for c in _INT_FIELDS) + (p.dtype,)


def _row_key(row: dict) -> tuple | None:
    try:
        return tuple(int(row[c]) for c in _INT_FIELDS) + (str(row["dtype"]),)
    except (TypeError, ValueError):
        return None


def _provider_rank(providers: Sequence[str]) -> dict:
    """Row order of a point in a single-GPU run: the baseline first, then the given order."""
    from moda_bench.bench.providers import BASELINE
    ordered = sorted(providers, key=lambda name: name != BASELINE)
    return {name: i for i, name in enumerate(ordered)}


def _death_reason(w: _Worker, point_timeout_s: float | None = None) -> str:
    """The reason written into the rows of the point a worker died on."""
    if w.point_timed_out:
        return (f"timeout: no result within --point-timeout {point_timeout_s:g} s; the worker on GPU "
                f"{w.slot.index} was killed and a fresh one took the next points; log {w.log}")
    if w.timed_out:
        why = "killed: timeout_s exceeded"
    else:
        last = [ln.strip() for ln in _tail(w.log, 40).splitlines() if ln.strip()]
        why = f"exit code {w.proc.returncode}" + (f": {last[-1][:200]}" if last else "")
    return f"worker on GPU {w.slot.index} died while running this point ({why}); log {w.log}"


def _lost_rows(w: _Worker, task: Task, providers: Sequence[str], pass_: str, have: set, meta: dict,
               reason: str | None = None) -> list[dict]:
    """status=error rows for the providers of the point a worker died on that have no row."""
    reason = reason or _death_reason(w)
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    rows = []
    for prov in providers:
        if prov in have:
            continue
        row = base_row(task.point, prov, pass_, task.sweep)
        row.update(meta)
        row.update(status=schema.ERROR, reason=reason, gpu_index=w.slot.index, timestamp=now)
        rows.append(row)
    return rows


def _collect(workers: Sequence[_Worker], tasks: Sequence[Task], sweeps: Sequence[SweepPlan],
             providers: Sequence[str], pass_: str, *, mark_lost: bool, per_point: int | None = None):
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
        dead = list(w.lost) + ([(w.crashed_on, None)] if w.crashed_on is not None else [])
        for t, reason in dead if mark_lost else []:
            mine = [] if frame is None else [r for r in frame.to_dict("records") if r["sweep"] == t.sweep
                                              and _row_key(r) == _point_key(t.point)]
            meta = ({c: frame.iloc[-1][c] for c in ("gpu", "torch_version", "triton_version", "git_commit")}
                    if frame is not None and len(frame) else some_meta) or {"git_commit": schema.git_commit()}
            lost = _lost_rows(w, t, providers, pass_, {r["provider"] for r in mine}, meta, reason)
            if lost:
                frames.append(pd.DataFrame(lost, columns=schema.COLUMNS))
        if rc is not None and rc != 0:
            tail = _tail(w.log) + ("\n[killed: timeout_s exceeded]" if w.timed_out else "")
            failures.append(WorkerFailure(w.slot.index, rc, 0 if frame is None else len(frame),
                                          len(w.started) * (per_point or len(providers)), tail, str(w.log),
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
            results.write_csv_atomic(s.csv, schema_rows(pd.concat(parts, ignore_index=True)))


def run_pool(sweeps: Sequence[SweepPlan], spec, *, gpus: Union[str, int] = "all", progress: bool = True,
             worker_cmd: WorkerCmd | None = None, keep_shards: bool = False, timeout_s: float | None = None,
             poll_s: float = 0.5, shard_base: Path | None = None, point_timeout_s: float | None = None,
             max_restarts: int = 2) -> PoolResult:
    """Run every point of every sweep of `spec` (bench.spec.RunSpec, handed to every worker as
    JSON) with one isolated worker process per GPU; write each sweep's rows to its CSV.

    Workers (`python -m moda_bench.bench.pool.worker --serve`, or `worker_cmd`: an argv prefix or a
    function of the GpuSlot returning one) start once for the whole run with
    CUDA_VISIBLE_DEVICES=<that GPU>, take tasks (one point of one sweep, all providers) from a
    shared queue, most expensive first, and append rows to `<base>.gpu<k>.csv` as they finish.

    A worker that crashes loses nothing already written; the point it was running gets
    status=error rows (reason: the exit and last log line) for its providers without a row; the
    points it never started go to the other workers. `timeout_s` bounds the whole run (workers
    still running are killed). `point_timeout_s` bounds one point: a worker past it is killed, the
    point's rows get status=error with a 'timeout:' reason, and a fresh worker is started on that
    GPU (at most `max_restarts` times per GPU) for the points left. Afterwards rows are split per
    sweep, ordered as a single-GPU run orders them, carry the physical GPU in gpu_index, and are
    added to each sweep's CSV (rows already there kept). Shard files are removed unless a worker
    failed or keep_shards. On Ctrl-C the workers are stopped, the rows so far are written, and the
    shards kept.
    """
    from rich.console import Console
    console = Console(stderr=True)
    sweeps = list(sweeps)
    providers, pass_ = list(spec.providers), spec.pass_
    slots = resolve_gpus(gpus)
    existing = {}
    for s in sweeps:  # fail before any work if an output file cannot take the rows
        s.csv.parent.mkdir(parents=True, exist_ok=True)
        try:
            if s.csv.exists() and s.csv.stat().st_size:
                existing[s.name] = read_shard(s.csv)
        except results.ResultsError as err:
            raise typer.BadParameter(f"{err}; write to a new file") from None
    tasks = plan_tasks(sweeps, pass_, len(providers))
    if not tasks:
        return PoolResult({s.name: merge_frames([]) for s in sweeps}, [], [], 0)
    base = Path(shard_base) if shard_base is not None else (
        sweeps[0].csv if len(sweeps) == 1 else sweeps[0].csv.with_name("pool.csv"))
    worker_cmd = worker_cmd if worker_cmd is not None else default_worker_cmd

    workers: list[_Worker] = []
    for i, slot in enumerate(slots[: len(tasks)]):  # never more workers than points
        shard_csv, log = shard_path(base, "gpu", slot.index), shard_path(base, "gpu", slot.index, ".log")
        for stale in (shard_csv, log):
            stale.unlink(missing_ok=True)  # workers append: never mix in an old run's shard
        prefix = worker_cmd(slot) if callable(worker_cmd) else worker_cmd
        argv = [*prefix, "--serve", "--spec", spec.to_json(), "--csv", str(shard_csv), "--gpu-index", str(slot.index),
                "--worker-index", str(i)]   # worker i pins itself to item i of spec.pin_cpu (if any)
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=slot.token, PYTHONUNBUFFERED="1")
        workers.append(_Worker(slot, shard_csv, log, argv, env))

    per_point = len(providers) * len(spec.timer_list())
    total = len(tasks) * per_point
    names = ", ".join(s.name for s in sweeps)
    console.print(f"{'sweeps' if len(sweeps) > 1 else 'sweep'} [bold]{names}[/]: {len(tasks)} points x "
                  f"{len(providers)} providers on {len(workers)} GPU(s) "
                  f"[{', '.join(str(w.slot.index) for w in workers)}], largest points first")
    bar, task_all, gpu_bars = None, None, {}
    if progress:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
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

    def launch(w: _Worker, mode: str = "wb") -> None:
        with open(w.log, mode) as logf:  # the child keeps its own descriptor
            w.proc = subprocess.Popen(w.argv, env=w.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=logf, text=True, bufsize=1, preexec_fn=_die_with_parent)
        w.thread = threading.Thread(target=_drive, args=(w, queue), daemon=True, name=f"moda-bench-gpu{w.slot.index}")
        w.thread.start()

    def watch_points() -> None:
        """Kill a worker past point_timeout_s; start a fresh one once a killed one is gone."""
        now = time.monotonic()
        for w in workers:
            if (point_timeout_s is not None and w.current is not None and w.proc.poll() is None
                    and not w.point_timed_out and now - w.task_started > point_timeout_s):
                w.point_timed_out = True
                w.proc.kill()
            if w.point_timed_out and w.proc.poll() is not None and not w.thread.is_alive():
                if w.crashed_on is not None:
                    w.lost.append((w.crashed_on, _death_reason(w, point_timeout_s)))
                w.crashed_on, w.current, w.point_timed_out = None, None, False
                again = bool(queue.remaining()) and w.restarts < max_restarts and not w.timed_out
                lost = w.lost[-1][0].label() if w.lost else "its point"
                console.print(f"[red]GPU {w.slot.index}: {lost} ran past --point-timeout {point_timeout_s:g} s[/]; "
                              "worker killed, its rows marked 'timeout'"
                              + ("; a fresh worker takes the next points" if again else ""), highlight=False)
                if again:
                    w.restarts += 1
                    launch(w, "ab")

    if bar is not None:
        bar.start()
    try:
        for w in workers:
            launch(w)
        while any(w.thread.is_alive() or w.proc.poll() is None or w.point_timed_out for w in workers):
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                queue.stop()
                for w in workers:
                    if w.proc.poll() is None:
                        w.proc.kill()
                        w.timed_out = True
            watch_points()
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
                               mark_lost=False, per_point=per_point)
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

    rows, failures = _collect(workers, tasks, sweeps, providers, pass_, mark_lost=True, per_point=per_point)
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
        console.print(f"sweep {s.name}: {len(rows[s.name])}/{len(s.points) * per_point} rows -> {s.csv}")
    if failures or not_run:
        console.print(f"[red]{len(failures)} worker(s) failed[/]; shards kept beside {base}")
    return PoolResult(rows, failures, not_run, sum(w.proc is not None for w in workers))


def run_sharded(points: Sequence[Point], spec, csv_path: Path, *, sweep_name: str, gpus: Union[str, int] = "all",
                progress: bool = True, worker_cmd: WorkerCmd | None = None, keep_shards: bool = False,
                timeout_s: float | None = None, poll_s: float = 0.5, pin_chunk: bool | None = None):
    """One sweep over the GPUs of this node: `run_pool` with a single sweep into csv_path.

    Returns this run's rows as a DataFrame; `.attrs["worker_failures"]` lists WorkerFailure
    records (empty when all succeeded), `.attrs["not_run"]` the points no worker ran.
    """
    result = run_pool([SweepPlan(sweep_name, tuple(points), Path(csv_path), pin_chunk)], spec, gpus=gpus,
                      progress=progress, worker_cmd=worker_cmd, keep_shards=keep_shards, timeout_s=timeout_s,
                      poll_s=poll_s)
    rows = result.rows[sweep_name]
    rows.attrs["worker_failures"] = result.failures
    rows.attrs["not_run"] = result.not_run
    return rows


# ---------------------------------------------------------------------------------------------
# several nodes: torchrun
# ---------------------------------------------------------------------------------------------
