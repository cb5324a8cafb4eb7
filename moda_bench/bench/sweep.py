"""A `moda-bench sweep` run as data: its sweeps (presets or one axis around a base point, one
`SweepPlan` and one `<run dir>/sweep_<axis>.csv` each), its `run.json` record, and running them
on one GPU (runner.run_sweep, sweep after sweep) or as one pool over this node's GPUs
(pool.local.run_pool). Under torchrun the command calls pool.distributed itself.

`run.json` also records the `--pin-cpu` option and the host of each timing process (its CPUs and
host canary: `host`): the command's own process when it times, else each `--gpus` worker's, read
from its rows afterwards (`host_records`, `update_run_record`).

Options, progress messages, the summary table and the figures belong to the command
(`moda_bench.cli.sweep`); this module returns rows and paths only.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path

from moda_bench import results
from moda_bench.bench import runstate
from moda_bench.bench.pool.plan import SweepPlan
from moda_bench.bench.presets import SweepSpec
from moda_bench.bench.runner import QUICK_REP_MS, QUICK_WARMUP_MS, REP_MS, WARMUP_MS, Point, plan_points

RUN_RECORD = "run.json"


def sweep_csv(run_dir: Path, axis: str) -> Path:
    """Where the rows of the sweep over `axis` go."""
    return Path(run_dir) / f"sweep_{axis}.csv"


def plan_run(specs: Sequence[SweepSpec], base: Point, run_dir: Path, *, pin_chunk: bool,
             fixed: Sequence[str] = (), resume: bool = False) -> list[SweepPlan]:
    """One SweepPlan per spec, around `base` with the spec's own base fields (except those in
    `fixed`: the fields the command set explicitly). MoDA's block_m is pinned to C on every sweep
    with `pin_chunk` (the command's --C), on a C sweep always, else by run_sweep's rule (the
    points differ in C).

    ValueError for bad values (plan_points), FileExistsError when a sweep CSV is already there
    (a second run is not mixed into the first) unless `resume` (`resume_run` then decides)."""
    plans = []
    for spec in specs:
        own = {k: v for k, v in spec.base if k not in fixed}
        plans.append((spec.label, plan_points(spec.vary, list(spec.values) if spec.values else None,
                                              base.replace(**own))))
    for axis, _ in plans:
        if sweep_csv(run_dir, axis).exists() and not resume:
            raise FileExistsError(f"{sweep_csv(run_dir, axis)} already exists; choose another --out")
    return [SweepPlan(axis, tuple(points), sweep_csv(run_dir, axis), True if (pin_chunk or axis == "C") else None)
            for axis, points in plans]


def timing_budget(warmup_ms: float | None, rep_ms: float | None, quick: bool) -> tuple[float, float]:
    """do_bench warm-up and repetition ms: as given, else --quick's, else the defaults."""
    warmup = warmup_ms if warmup_ms is not None else (QUICK_WARMUP_MS if quick else WARMUP_MS)
    rep = rep_ms if rep_ms is not None else (QUICK_REP_MS if quick else REP_MS)
    return warmup, rep


def write_run_record(run_dir: Path, sweeps: Sequence[SweepPlan], spec, *, pin_chunk: bool, preset: str | None,
                     gpus: str | None, extra: dict | None = None) -> Path:
    """`<run_dir>/run.json`: the run's spec (providers, pass, timing, timers, tuned configs, the
    floor's rates, the CPU pinning), options and every sweep's points."""
    from moda_bench.host import format_pin_cpu
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / RUN_RECORD
    d = spec.to_dict()
    results.write_json_atomic(path, {
        "sweeps": {s.name: [p.to_dict() for p in s.points] for s in sweeps}, "providers": d["providers"],
        "pass": d["pass"], "use_tuned": d["use_tuned"], "pin_chunk": "every sweep" if pin_chunk else "C sweep only",
        "warmup_ms": d["timing"]["warmup_ms"], "rep_ms": d["timing"]["min_time_ms"], "timing": d["timing"],
        "timers": d["timers"], "floor_rates": d["rates"], "preset": preset, "gpus": gpus,
        "pin_cpu": format_pin_cpu(spec.pin_cpu), **(extra or {})})
    return path


def update_run_record(run_dir: Path, **fields) -> Path:
    """Set fields of an existing `<run_dir>/run.json` (written by write_run_record)."""
    path = Path(run_dir) / RUN_RECORD
    record = json.loads(path.read_text())
    record.update(fields)
    results.write_json_atomic(path, record)
    return path


def read_run_record(run_dir: Path) -> dict:
    """`<run_dir>/run.json` ({} when absent or unreadable)."""
    try:
        return json.loads((Path(run_dir) / RUN_RECORD).read_text())
    except (OSError, ValueError):
        return {}


def resume_run(sweeps: Sequence[SweepPlan], spec, *, gpu: str, commit: str, allow_commit_change: bool = False,
               pooled: bool = False) -> tuple[list[SweepPlan], list[str]]:
    """The sweeps of a `--resume` with only the points still to run, and notes to print. Refuses
    (runstate.ResumeRefused, one line) a run.json of other providers, pass or timers, rows of
    another GPU, or of another commit unless allowed. `pooled`: shards of a killed `--gpus` pool
    are folded into the sweep CSVs first. The CSVs are cleaned (runstate.resume_sweep)."""
    sweeps = list(sweeps)
    if not sweeps:
        return [], []
    record = read_run_record(sweeps[0].csv.parent)
    mine = spec.to_dict()
    for name in ("providers", "pass", "timers"):
        theirs, ours = record.get(name), mine[name]
        if theirs is not None and (list(theirs) if isinstance(theirs, list) else theirs) != ours:
            raise runstate.ResumeRefused(f"{sweeps[0].csv.parent}/{RUN_RECORD}: the run's {name} are {theirs}, "
                                         f"this command's {ours}; resume with the same options")
    notes = []
    if pooled:
        base = sweeps[0].csv if len(sweeps) == 1 else sweeps[0].csv.with_name("pool.csv")
        notes += runstate.fold_orphan_shards({s.name: s.csv for s in sweeps}, base)
    pairs = runstate.expected_pairs(spec.providers, spec.timer_list())
    todo = []
    for s in sweeps:
        found = runstate.resume_sweep(s.csv, s.name, pairs, gpu=gpu, commit=commit,
                                      allow_commit_change=allow_commit_change)
        notes += found.notes
        todo.append(dataclasses.replace(s, points=tuple(runstate.remaining(s.points, found.done))))
    return todo, notes


def points_left(sweeps: Sequence[SweepPlan], spec) -> dict:
    """{sweep: points without every row yet} of the sweeps' CSVs as they are now (read only)."""
    pairs = runstate.expected_pairs(spec.providers, spec.timer_list())
    left = {}
    for s in sweeps:
        try:
            _, done, _, _ = runstate.scan_sweep(s.csv, s.name, pairs)
        except runstate.ResumeRefused:
            done = set()
        n = len(runstate.remaining(s.points, done))
        if n:
            left[s.name] = n
    return left


def host_records(frames) -> list[dict]:
    """Per GPU index in rows (DataFrames), the host of the process that timed them: gpu_index,
    host_cpus and the canary numbers of its first row that has them (NaN as None)."""
    import pandas as pd

    from moda_bench import schema
    out = {}
    for frame in frames:
        if frame is None or not len(frame):
            continue
        for r in frame.to_dict("records"):
            idx, cpus = r.get("gpu_index"), r.get("host_cpus")
            if pd.isna(idx) or int(idx) in out or pd.isna(cpus) or not str(cpus).strip():
                continue
            nums = {c: None if pd.isna(r.get(c)) else float(r[c]) for c in schema.HOST_COLUMNS}
            out[int(idx)] = {"gpu_index": int(idx), "host_cpus": str(cpus).strip(), **nums}
    return [out[k] for k in sorted(out)]


def run_sweeps(sweeps: Sequence[SweepPlan], spec, *, gpus: str | None, console=None,
               on_start: Callable[[SweepPlan], None] | None = None,
               on_done: Callable[[SweepPlan, object], None] | None = None,
               point_timeout: float | None = None) -> dict:
    """Run every sweep of `spec` (bench.spec.RunSpec): without `gpus` one after the other on this
    process's GPU (on_start before each), with `gpus` as one pool of all their points, one
    worker per GPU for the whole run (`point_timeout`: seconds a worker may spend on one point
    before it is killed, the point's rows marked and a fresh worker started). on_done(sweep, rows)
    after each sweep's rows are in its CSV. Returns {sweep: rows}."""
    from moda_bench.bench import runner  # looked up at call time (tests substitute run_sweep)

    done = {}
    if gpus is not None:
        from moda_bench.bench.pool.local import run_pool
        result = run_pool(sweeps, spec, gpus=gpus, point_timeout_s=point_timeout)
        for s in sweeps:
            done[s.name] = result.rows[s.name]
            if on_done is not None:
                on_done(s, done[s.name])
        return done
    for s in sweeps:
        if on_start is not None:
            on_start(s)
        done[s.name] = runner.run_sweep(list(s.points), spec, s.csv, sweep_name=s.name, pin_chunk=s.pin_chunk,
                                        console=console)
        if on_done is not None:
            on_done(s, done[s.name])
    return done
