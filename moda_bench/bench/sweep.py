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

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from moda_bench.bench.pool.plan import SweepPlan
from moda_bench.bench.presets import SweepSpec
from moda_bench.bench.runner import QUICK_REP_MS, QUICK_WARMUP_MS, REP_MS, WARMUP_MS, Point, plan_points

RUN_RECORD = "run.json"


def sweep_csv(run_dir: Path, axis: str) -> Path:
    """Where the rows of the sweep over `axis` go."""
    return Path(run_dir) / f"sweep_{axis}.csv"


def plan_run(specs: Sequence[SweepSpec], base: Point, run_dir: Path, *, pin_chunk: bool,
             fixed: Sequence[str] = ()) -> list[SweepPlan]:
    """One SweepPlan per spec, around `base` with the spec's own base fields (except those in
    `fixed`: the fields the command set explicitly). MoDA's block_m is pinned to C on every sweep
    with `pin_chunk` (the command's --C), on a C sweep always, else by run_sweep's rule (the
    points differ in C).

    ValueError for bad values (plan_points), FileExistsError when a sweep CSV is already there
    (a second run is not mixed into the first)."""
    plans = []
    for spec in specs:
        own = {k: v for k, v in spec.base if k not in fixed}
        plans.append((spec.label, plan_points(spec.vary, list(spec.values) if spec.values else None,
                                              base.replace(**own))))
    for axis, _ in plans:
        if sweep_csv(run_dir, axis).exists():
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
    path.write_text(json.dumps({
        "sweeps": {s.name: [p.to_dict() for p in s.points] for s in sweeps}, "providers": d["providers"],
        "pass": d["pass"], "use_tuned": d["use_tuned"], "pin_chunk": "every sweep" if pin_chunk else "C sweep only",
        "warmup_ms": d["timing"]["warmup_ms"], "rep_ms": d["timing"]["min_time_ms"], "timing": d["timing"],
        "timers": d["timers"], "floor_rates": d["rates"], "preset": preset, "gpus": gpus,
        "pin_cpu": format_pin_cpu(spec.pin_cpu), **(extra or {})},
        indent=1, default=str))
    return path


def update_run_record(run_dir: Path, **fields) -> Path:
    """Set fields of an existing `<run_dir>/run.json` (written by write_run_record)."""
    path = Path(run_dir) / RUN_RECORD
    record = json.loads(path.read_text())
    record.update(fields)
    path.write_text(json.dumps(record, indent=1, default=str))
    return path


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
               on_done: Callable[[SweepPlan, object], None] | None = None) -> dict:
    """Run every sweep of `spec` (bench.spec.RunSpec): without `gpus` one after the other on this
    process's GPU (on_start before each), with `gpus` as one pool of all their points, one
    worker per GPU for the whole run. on_done(sweep, rows) after each sweep's rows are in its
    CSV. Returns {sweep: rows}."""
    from moda_bench.bench import runner  # looked up at call time (tests substitute run_sweep)

    done = {}
    if gpus is not None:
        from moda_bench.bench.pool.local import run_pool
        result = run_pool(sweeps, spec, gpus=gpus)
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
