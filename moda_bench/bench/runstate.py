"""A run folder's life across kills and restarts: one writer at a time (`RunLock`), what a
`--resume` may skip (`resume_sweep`), and graceful interrupts (`interrupts`, `Interrupted`).

Lock: `<run dir>/.moda-bench.lock` holds the writer's pid, host, start time and command (JSON),
created exclusively (O_EXCL). A second writer is refused with one line naming the holder; a lock
whose process is gone (same host, dead pid) is taken over with a warning; a lock of another host
is never taken over (its pid cannot be checked from here).

Resume: a point of a sweep is done when its CSV holds a row for every (provider, timer) of the
run. Rows measured on another GPU are refused, rows of another commit too unless
`allow_commit_change`. Before the run goes on, the CSV is cleaned: malformed rows (a line cut by
a kill) are reported with their line and dropped, and the rows of incomplete points are dropped
(those points are measured again, whole), through an atomic rewrite; every other row is kept
byte-equal in meaning. Shards left by a `--gpus` pool whose parent died (`<base>.gpu<k>.csv`) are
folded into their sweep CSVs first (`fold_orphan_shards`).

Interrupts: inside `interrupts()`, SIGINT and SIGTERM raise `Interrupted` (a KeyboardInterrupt:
the point in flight is abandoned, its rows are never written); `results.append_rows` holds them
off while a point's rows are written, so a point is in the CSV whole or not at all. `exit_code`
is 128 + the signal (130, 143).

Merge: `missing_points` lists the points of a run's run.json that merged rows lack.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from moda_bench import results, schema

LOCK_NAME = ".moda-bench.lock"
INT_FIELDS = ("T", "G", "Hk", "L", "B", "d", "C", "depth_grad", "Tq", "S")
SIGNALS = (signal.SIGINT, signal.SIGTERM)


# ---------------------------------------------------------------------------------------------
# one writer per folder
# ---------------------------------------------------------------------------------------------

class LockHeld(RuntimeError):
    """Another live process writes into the run folder (message: one line naming it)."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # exists, owned by someone else
        return True
    return True


def _age_s(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def describe_holder(info: dict) -> str:
    return (f"pid {info.get('pid')} on {info.get('host')} since {info.get('started')} "
            f"({info.get('command') or 'unknown command'})")


class RunLock:
    """The run folder's lock, held from `acquire` to `release` (or the `with` block). `warn(text)`
    reports a stale lock taken over."""

    def __init__(self, run_dir: Path, command: str = "", warn=None, name: str = LOCK_NAME):
        self.path = Path(run_dir) / name
        self.info = {"pid": os.getpid(), "host": socket.gethostname(), "command": command,
                     "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
        self.warn = warn or (lambda text: None)
        self.held = False

    def _create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            json.dump(self.info, f)
        return True

    def holder(self) -> dict | None:
        try:
            return json.loads(self.path.read_text() or "{}")
        except FileNotFoundError:
            return None
        except ValueError:
            return {}   # cut while written: its writer died right away

    def acquire(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            if self._create():
                self.held = True
                return self
            info = self.holder()
            if info is None:
                continue   # released meanwhile
            if not info and _age_s(self.path) < 5:
                time.sleep(0.2)   # being written by a writer that has just created it
                continue
            pid, host = info.get("pid"), info.get("host")
            same_host = host == self.info["host"]
            if info and (not same_host or (isinstance(pid, int) and _alive(pid))):
                where = "" if same_host else f" (another host: remove {self.path} if that run is gone)"
                raise LockHeld(f"{self.path.parent} is being written by {describe_holder(info)}{where}; "
                               "wait for it to finish or choose another --out")
            self.warn(f"taking over the stale lock of {describe_holder(info)}: that process is gone")
            results.write_json_atomic(self.path, self.info)   # replaces the stale one
            if self.holder() == self.info:
                self.held = True
                return self
        raise LockHeld(f"{self.path.parent}: could not take the run folder's lock {self.path}")

    def release(self) -> None:
        if self.held and self.holder() == self.info:
            self.path.unlink(missing_ok=True)
        self.held = False

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> bool:
        self.release()
        return False


# ---------------------------------------------------------------------------------------------
# interrupts
# ---------------------------------------------------------------------------------------------

class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived: the run stops after keeping what it finished."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def exit_code_of(exc: BaseException) -> int:
    """130 for a plain KeyboardInterrupt, 128 + signal for `Interrupted`."""
    return exc.exit_code if isinstance(exc, Interrupted) else 128 + signal.SIGINT


@contextlib.contextmanager
def interrupts():
    """SIGINT / SIGTERM raise `Interrupted` inside the block (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_(signum, frame):
        raise Interrupted(signum)

    old = {s: signal.signal(s, raise_) for s in SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


# ---------------------------------------------------------------------------------------------
# resume
# ---------------------------------------------------------------------------------------------

class ResumeRefused(ValueError):
    """The folder's rows cannot be continued by this run (message: one line naming why)."""


def point_key(point) -> tuple:
    """A Point's key: its integer fields and dtype (what a row of it carries)."""
    d = point.to_dict()
    return tuple(int(d[c]) for c in INT_FIELDS) + (str(point.dtype),)


def row_point_key(row: dict) -> tuple | None:
    try:
        return tuple(int(row[c]) for c in INT_FIELDS) + (str(row["dtype"]),)
    except (TypeError, ValueError, KeyError):
        return None


@dataclass
class SweepResume:
    """What a resume found in one sweep CSV: the done points' keys, rows kept, the notes to print
    (malformed lines dropped, incomplete points to measure again)."""

    done: set = field(default_factory=set)
    kept: int = 0
    notes: list = field(default_factory=list)


def expected_pairs(providers: Iterable[str], timers: Iterable[str]) -> set:
    return {(p, t) for p in providers for t in timers}


def check_identity(frame, where: str, gpu: str, commit: str, allow_commit_change: bool) -> None:
    """ResumeRefused when the rows were measured on another GPU, or (unless allowed) another commit."""
    gpus = sorted({str(g) for g in frame["gpu"] if str(g) and str(g) != "nan"} - {gpu})
    if gpus and gpu:
        raise ResumeRefused(f"{where}: its rows were measured on {gpus[0]}, this run is on {gpu}; resume on that "
                            "GPU or choose another --out")
    commits = sorted({str(c) for c in frame["git_commit"] if str(c) and str(c) != "nan"} - {commit})
    if commits and commit and not allow_commit_change:
        raise ResumeRefused(f"{where}: its rows were measured at commit {commits[0]}, this checkout is {commit}; "
                            "add --allow-commit-change to resume anyway")


def scan_sweep(csv: Path, sweep: str, pairs: set):
    """(frame or None, done point keys, keep mask, malformed-line notes) of a sweep CSV, read only.
    A point is done when every (provider, timer) of `pairs` has a row; keep is False for the rows
    of incomplete points of `sweep` and for repeats of one (point, provider, timer). Malformed
    rows are not in the frame (their lines are in the notes)."""
    csv = Path(csv)
    if not csv.exists() or csv.stat().st_size == 0:
        return None, set(), [], []
    lines: list[str] = []
    try:
        frame = results.read_csv(csv, warn=lines.append)
    except results.ResultsError as err:
        if "empty file" in str(err):
            return None, set(), [], []
        raise ResumeRefused(f"cannot resume: {err}") from None
    recs = frame.to_dict("records")
    keys = [(r["sweep"], row_point_key(r)) for r in recs]
    have: dict = {}
    for k, r in zip(keys, recs):
        have.setdefault(k, set()).add((r["provider"], r["timer"]))
    done = {k for (s, k), got in have.items() if s == sweep and pairs <= got}
    seen, keep = set(), []
    for (s, k), r in zip(keys, recs):
        ident = (s, k, r["provider"], r["timer"])
        keep.append((s != sweep or k in done) and ident not in seen)
        seen.add(ident)
    return frame, done, keep, lines


def resume_sweep(csv: Path, sweep: str, pairs: set, *, gpu: str, commit: str,
                 allow_commit_change: bool = False) -> SweepResume:
    """Read `csv` (the sweep's rows so far), refuse another GPU/commit, drop malformed rows and the
    rows of incomplete points (atomic rewrite, only when something is dropped) and return the points
    done: every (provider, timer) of `pairs` present."""
    from moda_bench.bench.runner import schema_rows
    out = SweepResume()
    frame, done, keep, lines = scan_sweep(csv, sweep, pairs)
    if frame is None:
        return out
    out.notes.extend(f"dropped a malformed row: {w}" for w in lines)
    mine = frame[frame["sweep"] == sweep]
    if len(mine):
        check_identity(mine, str(csv), gpu, commit, allow_commit_change)
    partial = {row_point_key(r) for r, k in zip(frame.to_dict("records"), keep)
               if not k and r["sweep"] == sweep} - done
    if partial:
        out.notes.append(f"{csv}: {len(partial)} incomplete point(s) (rows cut by a kill): measured again")
    if lines or not all(keep):
        results.write_csv_atomic(csv, schema_rows(frame[keep]))
    out.done, out.kept = done, int(sum(keep))
    return out


def fold_orphan_shards(csvs: dict, base: Path) -> list[str]:
    """Rows of `--gpus` worker shards `<base>.gpu<k>.csv` left by a pool whose parent was killed:
    added to their sweep CSVs ({sweep: csv}; rows already there kept once), shards removed.
    Returns notes to print."""
    import pandas as pd

    from moda_bench.bench.pool.merge import merge_frames, read_shard
    from moda_bench.bench.runner import schema_rows
    base = Path(base)
    shards = sorted(base.parent.glob(f"{base.stem}.gpu*.csv"))
    if not shards:
        return []
    notes, frames = [], []
    for sh in shards:
        lines: list[str] = []
        k = sh.stem.rsplit(".gpu", 1)[-1]
        try:
            frame = read_shard(sh, warn=lines.append)
            frames.append(frame.assign(gpu_index=int(k)) if k.isdigit() and len(frame) else frame)
        except results.ResultsError as err:
            notes.append(f"skipped an unreadable shard: {err}")
            continue
        notes.extend(f"dropped a malformed row: {w}" for w in lines)
    rows = merge_frames(frames) if frames else None
    for sweep, csv in csvs.items():
        part = rows[rows["sweep"] == sweep] if rows is not None else []
        if not len(part):
            continue
        old = read_shard(csv, warn=notes.append) if Path(csv).exists() and Path(csv).stat().st_size else None
        both = schema_rows(pd.concat([f for f in (old, part) if f is not None], ignore_index=True))
        both = both.drop_duplicates(subset=schema.ROW_KEY + ["timestamp"], keep="first")
        results.write_csv_atomic(csv, both)
        notes.append(f"{csv}: {len(part)} row(s) recovered from the shards of an interrupted --gpus pool")
    for sh in shards:
        sh.unlink(missing_ok=True)
    return notes


def remaining(points: Sequence, done: set) -> list:
    """The points not done, in order."""
    return [p for p in points if point_key(p) not in done]


def missing_points(merged, run_dir: Path, out: Path | None = None) -> dict:
    """{sweep: [point labels]} of the points in `<run_dir>/run.json` without a row for every
    provider and timer of the run in `merged`: the sweeps whose CSV is `out`, else those with rows
    in `merged`. {} when there is no run.json."""
    import json

    from moda_bench.bench.runner import Point, point_label
    try:
        record = json.loads((Path(run_dir) / "run.json").read_text())
    except (OSError, ValueError):
        return {}
    pairs = expected_pairs(record.get("providers", ()), record.get("timers", ()))
    have: dict = {}
    for r in merged.to_dict("records"):
        have.setdefault((r["sweep"], row_point_key(r)), set()).add((r["provider"], r["timer"]))
    names = [n for n in record.get("sweeps", {}) if out is not None
             and Path(run_dir, f"sweep_{n}.csv").resolve() == Path(out).resolve()]
    names = names or sorted({s for s, _ in have} & set(record.get("sweeps", {})))
    missing = {}
    for name in names:
        points = [Point.from_dict(d) for d in record["sweeps"][name]]
        lost = [point_label(p, record.get("pass", "")) for p in points
                if not pairs <= have.get((name, point_key(p)), set())]
        if lost:
            missing[name] = lost
    return missing
