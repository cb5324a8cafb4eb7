"""The work of `moda-bench tune` (the command, which builds the run's `bench.spec.TuneSpec` and
prints, is `moda_bench.cli.tune`): which shapes to tune, one tuning per cache key, the device run
of `moda_bench.tuning.tune_shape` for a shape, and the rows of the CSV summary (`run_tuning`).

Shapes that share a cache key (same GPU, triton, dtype, d, G, L and power-of-two bucket of T)
are tuned once, at the largest T of the group; the entry then serves that bucket only.
Presets: 'paper' = the paper's T (4096..65536), G and L sweeps; 'full' = the same with the T
sweep from 1024 (the ablation shape and the fused/split default boundary at 2048 included).

CSV columns beyond the point: default_ms (built-in default config), candidate_ms (the search's
winner), tuned_ms (the config stored: candidate_ms if decision is 'tuned', else default_ms),
ratio / ratio_lo / ratio_hi (candidate / default, geometric mean of interleaved rounds and its
95% interval), min_gain, decision ('tuned' | 'default'), speedup = default_ms / tuned_ms.
torch/triton are imported inside functions.
"""
from __future__ import annotations

import json
import math
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Protocol

from moda_bench.bench.spec import TUNE_PRESETS as PRESETS
from moda_bench.bench.spec import SpecError
from moda_bench.schema import CONFIG_COLUMNS, TUNE_COLUMNS


def plan_tuning_points(base, vary: Optional[str], values: Optional[list[int]], preset: Optional[str]) -> list:
    """Points to tune: the preset's sweeps, one `--vary` sweep, or just `base` (runner.Point)."""
    from moda_bench.bench.runner import plan_points
    if preset:
        points = [p for axis, vals in PRESETS[preset]
                  for p in plan_points(axis, list(vals) if vals is not None else None, base)]
    elif vary:
        points = plan_points(vary, values, base)
    else:
        points = [base]
    return list(dict.fromkeys(points))


def group_by_key(points: list, key_fn) -> dict:
    """{cache key: point with the largest T among the points sharing it} (first-seen order)."""
    groups: dict = {}
    for p in points:
        k = key_fn(p)
        if k not in groups or p.T > groups[k].T:
            groups[k] = p
    return groups


def point_shape(p):
    """MoDAShape of a runner.Point."""
    from moda_bench.kernels.moda import MoDAShape
    return MoDAShape(B=p.B, T=p.T, Hq=p.Hq, Hk=p.Hk, d=p.d, L=p.L)


def config_changes(cfg, default) -> str:
    """'field=value ...' for the fields where cfg differs from default ('default' if none)."""
    a, b = cfg.to_dict(), default.to_dict()
    diff = [f"{k}={v}" for k, v in a.items() if b.get(k) != v]
    return " ".join(diff) if diff else "default"


NAN = math.nan


def _num(x) -> float:
    return NAN if x is None else float(x)


@dataclass(frozen=True)
class TuneTimes:
    """The numbers of one shape's tuning (CSV columns of the same names): default, candidate and
    stored times (ms), the candidate / default ratio with its 95% interval, the margin it had to
    clear, the decision ('tuned' | 'default' | '' before decisions were recorded), wall seconds."""

    default_ms: float = NAN
    candidate_ms: float = NAN
    tuned_ms: float = NAN
    ratio: float = NAN
    ratio_lo: float = NAN
    ratio_hi: float = NAN
    min_gain: float = NAN
    decision: str = ""
    wall_s: float = NAN

    @classmethod
    def of_result(cls, result) -> "TuneTimes":
        """Of a fresh tuning (tuning.TuneResult)."""
        return cls(*(_num(getattr(result, f)) for f in ("default_ms", "candidate_ms", "tuned_ms", "ratio",
                                                         "ratio_lo", "ratio_hi", "min_gain")),
                   decision=result.decision, wall_s=_num(result.wall_s))

    @classmethod
    def of_entry(cls, entry: dict) -> "TuneTimes":
        """Of a tuning cache entry (entries from before decisions were recorded: decision '')."""
        return cls(*(_num(entry.get(f)) for f in ("default_ms", "candidate_ms", "tuned_ms", "ratio", "ratio_lo",
                                                   "ratio_hi", "min_gain")),
                   decision=entry.get("decision") or "", wall_s=_num(entry.get("tuning_wall_s", 0.0)))


def tune_row(p, dtype, times: TuneTimes = TuneTimes(), *, status="ok", reason="", config=None, key="", meta=None,
             tuned_fields="") -> dict:
    """One row of the CSV summary (TUNE_COLUMNS) for point p: its times, its status ('ok',
    'cached', 'error') and why, the stored config (dict), cache key, run metadata and the fields
    the stored config changes (`config_changes`)."""
    row = {c: getattr(p, c, None) for c in CONFIG_COLUMNS}
    row.update(Hq=p.Hq, dtype=dtype, C=(config or {}).get("block_m", p.C))
    t = times
    speedup = t.default_ms / t.tuned_ms if t.tuned_ms == t.tuned_ms and t.tuned_ms > 0 else NAN
    row.update(default_ms=t.default_ms, candidate_ms=t.candidate_ms, tuned_ms=t.tuned_ms, ratio=t.ratio,
               ratio_lo=t.ratio_lo, ratio_hi=t.ratio_hi, min_gain=t.min_gain, decision=t.decision,
               speedup=speedup, wall_s=t.wall_s, status=status, reason=reason,
               config=json.dumps(config, sort_keys=True) if config else "", cache_key=key, tuned_fields=tuned_fields)
    row.update(meta or {})
    return row


def tune_point(shape, dtype: str, kernels: list[str], *, budget: int, warmup_ms: float, rep_ms: float, seed: int,
               attention: Callable, min_gain: Optional[float] = None, on_plan=None, on_done=None,
               op: str = "moda", default=None):
    """Tune `shape` on the current CUDA device (moda_bench.tuning.tune_shape with the device
    timer running `attention`, the operator `op`, starting from and compared against `default`,
    the heuristic default config unless given); on_plan / on_done report progress. Returns the
    TuneResult."""
    import torch

    from moda_bench import tuning
    timer = tuning.CudaTimer(shape, dtype, device=f"cuda:{torch.cuda.current_device()}", warmup_ms=warmup_ms,
                             rep_ms=rep_ms, seed=seed, attention=attention)
    return tuning.tune_shape(shape, dtype, timer, kernels=kernels, budget=budget, seed=seed, on_plan=on_plan,
                             on_done=on_done, min_gain=tuning.DEFAULT_MIN_GAIN if min_gain is None else min_gain,
                             op=op, default=default)


def write_summary(rows: list[dict], out: Path) -> None:
    """The CSV summary (TUNE_COLUMNS), a row per tuned, cached or failed shape; written through a
    temporary file and a rename (a killed run leaves the previous summary, never half of one)."""
    import os
    import tempfile

    import pandas as pd
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=out.name + ".", suffix=".tmp", dir=out.parent)
    try:
        with os.fdopen(fd, "w", newline="") as f:
            pd.DataFrame(rows, columns=TUNE_COLUMNS).to_csv(f, index=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class Summary:
    """The summary of one `tune` run, rewritten as each shape finishes (`add`), so a killed run
    keeps every finished shape's row. `resume`: the rows of an earlier run into the same file
    (`previous(key)`, kept in order when re-added) for the same GPU; another commit is refused
    unless `allow_commit_change` (ValueError, one line). `on_signals` makes SIGINT/SIGTERM write
    the rows so far, print the resume command and exit 130/143."""

    def __init__(self, out: Optional[Path], *, resume: bool = False, gpu: str = "", commit: str = "",
                 allow_commit_change: bool = False):
        self.out, self.rows, self.before = (Path(out) if out else None), [], {}
        if resume and self.out is not None and self.out.exists():
            from moda_bench.results import read_tuning
            old = read_tuning([self.out], warn=lambda text: None)
            for r in old.drop(columns="_file").to_dict("records"):
                if str(r.get("status")) == "error":
                    continue   # a failed shape is tuned again
                if gpu and str(r.get("gpu")) not in ("", "nan", gpu):
                    raise ValueError(f"{self.out}: its rows were tuned on {r['gpu']}, this run is on {gpu}; "
                                     "resume on that GPU or choose another --out")
                if commit and not allow_commit_change and str(r.get("git_commit")) not in ("", "nan", commit):
                    raise ValueError(f"{self.out}: its rows were tuned at commit {r['git_commit']}, this checkout "
                                     f"is {commit}; add --allow-commit-change to resume anyway")
                for c in ("T", "G", "Hq", "Hk", "L", "B", "d", "C", "depth_grad", "Tq", "S"):
                    if isinstance(r.get(c), float) and r[c] == r[c]:
                        r[c] = int(r[c])   # as the tuner wrote them: T=4096, not 4096.0
                self.before[r["cache_key"]] = r

    def previous(self, key: str) -> Optional[dict]:
        return self.before.get(key)

    def add(self, row: dict) -> None:
        self.rows.append(row)
        if self.out is not None:
            write_summary(self.rows, self.out)

    def on_signals(self, say: Callable[[str], None], command: str) -> None:
        import signal
        import sys

        def stop(signum, frame):
            if self.out is not None:
                write_summary(self.rows, self.out)
            say(f"interrupted ({signal.Signals(signum).name}): {len(self.rows)} shape(s) kept"
                + (f" in {self.out}" if self.out else "") + f"; resume with: {command}")
            sys.exit(128 + signum)

        self._old = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}

    def restore_signals(self) -> None:
        """The handlers from before `on_signals` (the run's shapes are done)."""
        import signal
        for sig, handler in getattr(self, "_old", {}).items():
            signal.signal(sig, handler)
        self._old = {}


# ----------------------------------------------------------------------------- the run
class TuneError(Exception):
    """A tuning run that cannot start (no GPU, the kernel not importable, ...): its exit code."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


class TuneReporter(Protocol):
    """What `run_tuning` tells the command as it goes (the command prints it)."""

    def start(self, spec, gpu: str, shapes: int, points: int, cache_path: Path) -> None: ...

    def cached(self, p, changes: str) -> None: ...

    def progress(self, p) -> AbstractContextManager:
        """A context whose value is (on_plan, on_done), tuning.tune_shape's progress callbacks."""

    def tuned(self, p, result, changes: str, default) -> None: ...

    def failed(self, p, error: str) -> None: ...


@dataclass
class TuneRun:
    """What a tuning run did: a CSV row per shape, the stored config's changes per row (as shown),
    the shapes that failed, the cache written and the wall time."""

    rows: list = field(default_factory=list)
    changes: list = field(default_factory=list)
    failures: int = 0
    cache_path: Optional[Path] = None
    wall_s: float = 0.0


def operator(op: str):
    """(attention function, default-config function (shape, dtype) -> MoDAConfig) of an operator
    on the current CUDA device; TuneError when it cannot run here."""
    import torch
    try:
        from moda_bench.kernels.moda import default_config, moda_attention
    except ImportError as exc:
        raise TuneError(f"the MoDA kernel cannot be imported: {exc}") from None
    if op not in ("moda-fa4", "moda-overlap"):
        return moda_attention, default_config
    from moda_bench.kernels.moda.fa4 import merge as fa4
    from moda_bench.kernels.moda.fa4 import overlap
    why = fa4.fa4_unavailable(torch.device("cuda", torch.cuda.current_device()))
    if why:
        raise TuneError(f"{op} cannot run here: {why}", 2)
    if op == "moda-fa4":
        return fa4.moda_fa4, default_config
    return overlap.moda_overlap, lambda sh, dt: overlap.overlap_heuristic(sh, dt, torch.device("cuda"))


def run_tuning(spec, reporter: TuneReporter) -> TuneRun:
    """Tune every shape of `spec` (bench.spec.TuneSpec) on this GPU, one per cache key; each
    result is saved to the cache as soon as found, shapes with a cache entry are skipped unless
    spec.force; the CSV summary goes to spec.out if set. TuneError when the run cannot start,
    bench.spec.SpecError for a CUDA device that does not exist."""
    from moda_bench import schema, tuning

    try:
        points = plan_tuning_points(spec.base_point(), spec.vary, list(spec.values) if spec.values else None,
                                    spec.preset)
    except (ValueError, NotImplementedError) as exc:
        raise TuneError(f"cannot plan the shapes to tune: {exc}") from None
    import torch
    if not torch.cuda.is_available():
        raise TuneError("moda-bench tune needs a CUDA GPU and none is available", 2)
    if spec.device is not None:
        if not 0 <= spec.device < torch.cuda.device_count():
            raise SpecError(f"no CUDA device {spec.device} (found {torch.cuda.device_count()})", "--device")
        torch.cuda.set_device(spec.device)
    attention, default_fn = operator(spec.op)
    dtype, t_start = spec.dtype, time.perf_counter()
    run = TuneRun(cache_path=tuning.resolve_cache_path(spec.cache))
    groups = group_by_key(points, lambda p: tuning.cache_key(point_shape(p), dtype, op=spec.op))
    reporter.start(spec, tuning.current_gpu_name(), len(groups), len(points), run.cache_path)
    existing = tuning.load(run.cache_path).entries()
    meta = schema.run_metadata(spec.device)
    try:
        summary = Summary(spec.out, resume=spec.resume, gpu=meta["gpu"], commit=meta["git_commit"],
                          allow_commit_change=spec.allow_commit_change)
    except ValueError as exc:
        raise TuneError(str(exc), 2) from None
    run.rows = summary.rows
    if reporter_stop := getattr(reporter, "interrupted", None):
        summary.on_signals(reporter_stop, getattr(reporter, "resume_command", "moda-bench tune --resume"))
    for key, p in groups.items():
        shape = point_shape(p)
        if summary.previous(key) is not None:
            summary.add(summary.previous(key))
            run.changes.append("(resumed)")
            continue
        entry = existing.get(key)
        cfg = tuning.entry_config(entry, shape.G, key) if isinstance(entry, dict) and not spec.force else None
        if cfg is not None:
            changes = config_changes(cfg, default_fn(shape, dtype))
            reporter.cached(p, changes)
            summary.add(tune_row(p, dtype, TuneTimes.of_entry(entry), status="cached", config=entry["config"],
                                 key=key, meta=meta, tuned_fields=changes))
            run.changes.append(changes + " (cached)")
            continue
        try:
            default = default_fn(shape, dtype)
            with reporter.progress(p) as (on_plan, on_done):
                result = tune_point(shape, dtype, list(spec.kernels), budget=spec.budget, warmup_ms=spec.warmup_ms,
                                    rep_ms=spec.rep_ms, seed=spec.seed, attention=attention, min_gain=spec.min_gain,
                                    on_plan=on_plan, on_done=on_done, op=spec.op, default=default)
        except Exception as exc:  # noqa: BLE001 - OOM on the inputs, the default config failing, ...: a row
            run.failures += 1
            error = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"
            reporter.failed(p, error)
            summary.add(tune_row(p, dtype, status="error", reason=error, key=key, meta=meta))
            run.changes.append("error")
            torch.cuda.empty_cache()
            continue
        tuning.save_result(result, run.cache_path)
        changes = config_changes(result.config, default)
        reporter.tuned(p, result, changes, default)
        reasons = result.notes + [f"{k}: {len(ks.skipped)} skipped" for k, ks in result.kernels.items() if ks.skipped]
        summary.add(tune_row(p, dtype, TuneTimes.of_result(result), config=result.config.to_dict(), key=key,
                             meta=meta, reason="; ".join(reasons)[:500], tuned_fields=changes))
        run.changes.append(changes)
    summary.restore_signals()
    if spec.out and not run.rows:   # Summary.add wrote every row as it came; an empty run still leaves its file
        write_summary(run.rows, spec.out)
    run.wall_s = time.perf_counter() - t_start
    return run
