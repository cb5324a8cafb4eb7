"""Sweep planning and execution: the `Point`, one schema row per (provider, point), the sweep loop.

A sweep is a list of `Point`s; each point is run for every requested provider (fa2 first, the
baseline of extra_time_pct / ratio_to_fa2); one CSV row (schema: moda_bench.schema.COLUMNS)
is written per (provider, point), a point's rows in one write as the point finishes
(`results.append_rows`, SIGINT/SIGTERM held off meanwhile), so an interrupted or
killed sweep keeps every finished point whole. Axes, their paper values, the base point and the
pass names are the schema's.

Per row: fresh random inputs (same seed for every provider of a point), an accuracy check of a
slice against the reference, then timing (`point.run_point`: interleaved rounds, L2 flushed),
the ratios and the floor columns. What to run and how is one `bench.spec.RunSpec`. Before
anything is timed the process pins itself to its CPU if the spec asks (`--pin-cpu`) and runs the
host canary once (`host.process_host`); every row carries its numbers and CPUs.
"""
from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

from moda_bench import results, schema
from moda_bench.bench.point import CHECK_LEN, run_point

# `--timer do_bench`: each provider on its own through triton's do_bench (median/p20/p80 of
# rep_ms of repetitions), as every run before the interleaved timing did: for comparing with them
LEGACY_TIMER = "do_bench"
# warm-up and minimum sampled time per provider (ms): the default, and --quick
WARMUP_MS, REP_MS = 25.0, 100.0
QUICK_WARMUP_MS, QUICK_REP_MS = 5.0, 20.0

_BASE = schema.BASE_POINT


@dataclass(frozen=True)
class Point:
    """One configuration (defaults: schema.BASE_POINT). Hq = G * Hk. C is the query chunk in rows
    (MoDA block_m). depth_grad: the backward writes depth K/V gradients (False: detached depth).
    Tq: new tokens per sequence of a decode point (T is then the cache length; 0 for training).
    S: earlier source layers of a Depth-Attention point."""

    T: int = _BASE["T"]
    G: int = _BASE["G"]
    Hk: int = _BASE["Hk"]
    L: int = _BASE["L"]
    B: int = _BASE["B"]
    d: int = _BASE["d"]
    C: int = _BASE["C"]
    dtype: str = _BASE["dtype"]
    depth_grad: bool = bool(_BASE["depth_grad"])
    Tq: int = _BASE["Tq"]
    S: int = _BASE["S"]

    def __post_init__(self):
        object.__setattr__(self, "depth_grad", bool(self.depth_grad))

    @property
    def Hq(self) -> int:
        return self.G * self.Hk

    def to_dict(self) -> dict:
        """The fields and Hq (run.json, CSV rows; depth_grad as 1 / 0)."""
        d = asdict(self)
        d["Hq"] = self.Hq
        d["depth_grad"] = int(self.depth_grad)
        return d

    def fields(self) -> dict:
        """The fields only (Hq is derived): what `from_dict` takes back."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Point":
        """Inverse of `fields` / `to_dict` (other keys, such as Hq, are ignored)."""
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})

    def replace(self, **kw) -> "Point":
        return replace(self, **kw)


def plan_points(vary: str, values: list[int] | None, base: Point) -> list[Point]:
    """Points of a one-axis sweep over `vary` in schema.AXES (values None = the paper's,
    schema.AXIS_VALUES)."""
    if vary not in schema.AXIS_VALUES:
        raise ValueError(f"vary must be one of {', '.join(schema.AXIS_VALUES)}, got {vary!r}")
    values = list(schema.AXIS_VALUES[vary] if values is None else values)
    if not values:
        raise ValueError(f"no values to sweep {vary} over")
    minimum = 0 if vary in ("L", "S") else 1
    for v in values:
        if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
            raise ValueError(f"{vary} values must be integers >= {minimum}, got {v!r}")
    if len(set(values)) != len(values):
        raise ValueError(f"{vary} values repeat: {values}")
    # an S sweep compares both depth methods at the same number of depth entries: MoDA's L = S
    return [base.replace(**({"S": v, "L": v} if vary == "S" else {vary: v})) for v in values]


# ---------------------------------------------------------------------------------------------
# rows
# ---------------------------------------------------------------------------------------------

def base_row(point: Point, provider: str, pass_: str, sweep_name: str) -> dict:
    """A schema row of (sweep, provider, pass, point) with no measurement yet (measures NaN)."""
    row = {c: None for c in schema.COLUMNS}
    cfg = point.to_dict()
    row.update({c: cfg[c] for c in schema.CONFIG_COLUMNS})
    row.update({"sweep": sweep_name, "provider": provider, "pass": pass_, "impl_detail": "", "reason": "",
                "config": "", "timer": schema.DEFAULT_TIMER})
    for c in schema.MEASURE_COLUMNS:
        row[c] = math.nan
    return row


def schema_rows(frame):
    """Exactly schema.COLUMNS, integer columns (configuration, gpu_index) as integers: what the
    rows read back by `results.read_csv` (numbers as floats) need before they are written again,
    so a rewritten CSV reads `T=1024`, as `run_sweep` wrote it, not `1024.0`."""
    import pandas as pd
    frame = results.schema_frame(frame).copy()
    for c in schema.INT_CONFIG_COLUMNS + ["gpu_index"]:
        frame[c] = pd.to_numeric(frame[c], errors="coerce").astype("Int64")
    timer = frame["timer"].astype(object).where(frame["timer"].notna(), "").astype(str).str.strip()
    frame["timer"] = timer.where(timer != "", schema.DEFAULT_TIMER)
    frame["gpu"] = frame["gpu"].astype(object).where(frame["gpu"].notna(), "").astype(str)   # in the row key
    for c, default in schema.CONFIG_DEFAULTS.items():
        frame[c] = frame[c].fillna(default).astype("Int64")
    return frame


# ---------------------------------------------------------------------------------------------
# the sweep
# ---------------------------------------------------------------------------------------------

class _TunedConfigs:
    """Context: `moda_bench.tuning.using(use_tuned)`, i.e. MoDA configs from the tuning cache
    ($MODA_BENCH_TUNING_CACHE or the platform default; heuristic defaults if not use_tuned or
    $MODA_BENCH_NO_TUNING=1), the previous config source restored on exit. Without triton (no
    kernel, no tuner) there is nothing to configure."""

    def __init__(self, use_tuned: bool):
        try:
            from moda_bench.tuning import using
        except ImportError:
            self.ctx = None
        else:
            self.ctx = using(use_tuned)

    def __enter__(self):
        if self.ctx is not None:
            self.ctx.__enter__()
        return self

    def __exit__(self, *exc):
        return self.ctx.__exit__(*exc) if self.ctx is not None else False


def run_sweep(points: list[Point], spec, csv_path: Path, *, sweep_name: str, progress: bool = True,
              device_index: int | None = None, device: str | None = None, timer: Callable | None = None,
              pin_chunk: bool | None = None, check_len: int = CHECK_LEN, seed: int | None = None, console=None,
              worker: int = 0):
    """Run every provider of `spec` (bench.spec.RunSpec: providers, pass, timing, timers, tuned
    configs, health, floor rates) on every point, appending rows to csv_path; returns a DataFrame.

    device: 'cuda' (default; cuda:device_index) or 'cpu' (tests, with an injected `timer(fn,
    grad_to_none=, warmup_ms=, rep_ms=) -> dict(median_ms, p20_ms, p80_ms)`). On CUDA without a
    `timer` the providers of each point are timed in interleaved rounds (`point.run_point`) under
    spec.timing, once per timer of spec.timer_list() (one row per provider and timer; a point's
    providers are staged once for all its timers).
    pin_chunk: pin MoDA's block_m to each point's C (None: pin when sweep_name == 'C' or the
    points differ in C). seed: base seed of the inputs (point i uses seed + i; None: random).
    worker: this timing process's index among the run's (GPU worker, torchrun local rank; 0
    alone): the CPU of spec.pin_cpu it pins itself to before timing (`host.process_host`, once
    per process, with the host canary whose columns every row carries).
    """
    import pandas as pd

    from moda_bench.bench.providers import BASELINE, op_of_pass, resolve_providers

    pass_ = schema.check_pass(spec.pass_)
    # baseline first (extra_time_pct needs it), the others in the given order
    provs = sorted(resolve_providers(list(spec.providers), op_of_pass(pass_)), key=lambda p: p.name != BASELINE)
    points = list(points)
    base_opts = spec.timing
    if device is None:
        import torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and device_index is not None:
        import torch
        torch.cuda.set_device(device_index)
        device = f"cuda:{device_index}"
    timers = [None] if timer is not None else list(spec.timer_list())
    if timer is None and not str(device).startswith("cuda"):
        raise ValueError(f"timing needs a CUDA device (running on {device}); pass timer= to time otherwise")
    if pin_chunk is None:
        pin_chunk = sweep_name == "C" or len({p.C for p in points}) > 1
    seed = random.randrange(2**30) if seed is None else seed
    csv_path = Path(csv_path)
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    unavailable = {p.name: p.unavailable(device) for p in provs}
    meta_index = device_index if str(device).startswith("cuda") else None
    from moda_bench import host
    host_columns = host.process_host(spec.pin_cpu, worker).columns()

    all_rows = []
    bar = None
    if progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                       TimeElapsedColumn(), console=console, transient=False)
        task = bar.add_task(f"sweep {sweep_name}", total=len(points) * len(provs) * len(timers))
        bar.start()

    def staged(prov):
        if bar is not None:
            bar.advance(task, len(timers))   # a provider is staged once for all the timers of a point

    try:
        with _TunedConfigs(spec.use_tuned):
            for i, point in enumerate(points):
                timings = []   # (opts, timer, rows) per timer; the point is staged once for all of them
                for timer_name in timers:
                    opts, point_timer = base_opts, timer
                    if timer_name is not None:
                        opts = replace(base_opts, timer=timer_name)
                        if timer_name == LEGACY_TIMER:  # the legacy do_bench method, for comparisons
                            from moda_bench.timing import measure as point_timer
                    # a custom timer's rows: its own name if it has one (every row of the point alike)
                    label = timer_name if timer_name is not None else getattr(timer, "timer_name", "custom")
                    meta = schema.run_metadata(meta_index)
                    rows = []
                    for prov in provs:
                        row = base_row(point, prov.name, pass_, sweep_name)
                        row.update(meta, timer=label, health=spec.health)
                        row.update(host_columns)
                        rows.append(row)
                    timings.append((opts, point_timer, rows))
                if bar is not None:
                    labels = ", ".join(t if t is not None else "custom" for t in timers)
                    bar.update(task, description=f"sweep {sweep_name}: {point_label(point, pass_)} "
                                                 f"({len(provs)} providers, {labels} timer)")
                (opts, point_timer, rows), *others = timings
                run_point(provs, point, pass_, rows, device=device, chunk=point.C if pin_chunk else None,
                          seed=seed + i, check_len=check_len, unavailable=unavailable, opts=opts,
                          timer=point_timer, device_index=meta_index, on_staged=staged, rates=spec.rates,
                          also=tuple(others))
                point_rows = [row for _, _, rows in timings for row in rows]
                results.append_rows(csv_path, point_rows)   # whole (one write, signals held off) or not at all
                all_rows.extend(point_rows)
    finally:
        if bar is not None:
            bar.stop()
    return pd.DataFrame(all_rows, columns=schema.COLUMNS)


def point_label(point: Point, pass_: str) -> str:
    """A short text of the point's varying fields for progress lines."""
    if pass_ == schema.DECODE_PASS:
        return f"B={point.B} T={point.T} Tq={max(point.Tq, 1)} L={point.L} G={point.G}"
    text = f"T={point.T} G={point.G} L={point.L} C={point.C}"
    if point.S:
        text += f" S={point.S}"
    return text + ("" if point.depth_grad else " depth detached")
