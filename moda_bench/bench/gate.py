"""The GPU work of `moda-bench gate --run` (the command is `moda_bench.cli.gate`; the comparison
that decides is `moda_bench.reports.gate`, which needs no GPU).

`measure(spec, baseline)`: the baseline's ok points and providers measured on this GPU into
`spec.current` (one runner group per pass, timer and provider set: `run_plan`, `run_current`),
then the rows the caller's comparison cannot decide (a `Recheck`: the AMBIGUOUS ones with their
reference providers) measured again (`remeasure`, into a temporary CSV) and merged over the
earlier ones, for up to `spec.recheck_rounds` rounds, each sampling `spec.recheck_time` times
longer than the one before (`recheck_timing`): a row undecided at a short sampling time is
decided by a longer one, and the rows that are decided are not measured again. The GPU health
canary around it is the command's, as for `sweep`; its verdict and the floor's rates come in as
arguments and go into every row.

`GateInputError` (exit code 2 in the command) is shared with the comparison: input the gate can
neither judge nor measure.
"""
from __future__ import annotations

import math
import os
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Callable, Protocol

import pandas as pd

from moda_bench import results, schema


class GateInputError(ValueError):
    """Input the gate cannot judge or measure (exit code 2)."""


class Recheck(Protocol):
    """What `measure` asks the comparison after the first run (reports.gate.Recheck)."""

    def plan(self, first: pd.DataFrame) -> tuple[str, pd.DataFrame]:
        """(what, rows): the rows (key columns) to measure once more, and what they are in words
        ('2 AMBIGUOUS row(s)'); no rows when the first run decides everything."""

    def merge(self, first: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
        """The first run's rows with the re-measured ones in place of theirs."""


def _int_cell(value, default: int) -> int:
    """A configuration cell as an integer (64, 64.0 and '64' alike); default when blank."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return default
    return int(number) if math.isfinite(number) else default


def _text_cell(value) -> str:
    """A text cell stripped ('' when blank; 'torch.bfloat16' reads 'bfloat16')."""
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return ""
    return str(value).strip().removeprefix("torch.")


def run_plan(df: pd.DataFrame) -> list[tuple[str, str, list, list[str]]]:
    """(pass, timer, runner.Point list, providers) groups covering the ok rows of df: points of one
    pass and timer that have the same providers share a group."""
    from moda_bench.bench.runner import LEGACY_TIMER, Point
    from moda_bench.timing import TIMERS

    default, by_point, timers = Point().fields(), {}, TIMERS + (LEGACY_TIMER,)
    for _, r in df[df["status"] == schema.OK].iterrows():
        timer = _text_cell(r.get("timer")) or schema.DEFAULT_TIMER
        if timer not in timers:
            raise GateInputError(f"baseline rows timed with timer {timer!r} cannot be re-measured "
                                 f"(gate --run knows {', '.join(timers)})")
        cfg = {c: _int_cell(r[c], v) for c, v in default.items() if c != "dtype"}
        p = Point(dtype=_text_cell(r["dtype"]) or default["dtype"], **cfg)
        provs = by_point.setdefault((str(r["pass"]), timer, p), [])
        provs += [] if str(r["provider"]) in provs else [str(r["provider"])]
    groups: dict[tuple, list] = {}
    for (pass_, timer, p), provs in by_point.items():
        groups.setdefault((pass_, timer, tuple(provs)), []).append(p)
    return [(pass_, timer, points, list(provs)) for (pass_, timer, provs), points in groups.items()]


def run_current(baseline_df: pd.DataFrame, out_csv: Path, *, use_tuned: bool, timing=None, health: str = "",
                rates=None, log: Callable[[str], None] = print) -> None:
    """Run the baseline's ok points and providers on this GPU into out_csv (replaced), each group
    with the baseline's pass and timer; `timing` (bench.point.TimingOptions), `health` and the
    floor's `rates` go into the run's bench.spec.RunSpec."""
    from moda_bench.bench import runner
    from moda_bench.bench.point import TimingOptions
    from moda_bench.bench.spec import RunSpec
    from moda_bench.floor import Rates

    plan = run_plan(baseline_df)
    opts = timing or TimingOptions()
    out_csv = Path(out_csv)
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".gate-", suffix=".csv", dir=out_csv.parent)
    os.close(fd)
    os.unlink(tmp)  # run_sweep appends: start from no file
    try:
        for pass_, timer, points, providers in plan:
            log(f"gate --run: {pass_} ({timer}): {len(points)} point(s) x {len(providers)} provider(s) "
                f"({', '.join(providers)})")
            spec = RunSpec(providers=tuple(providers), pass_=pass_, timing=replace(opts, timer=timer), timers=(timer,),
                           use_tuned=use_tuned, health=health, rates=rates or Rates())
            runner.run_sweep(points, spec, Path(tmp), sweep_name="gate")
        if not Path(tmp).exists():
            raise GateInputError("the gate run wrote no rows")
        os.replace(tmp, out_csv)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def read_measured(path: Path, what: str) -> pd.DataFrame:
    """The rows a gate run wrote (`results.read_csv`); GateInputError naming `what` otherwise."""
    try:
        df = results.read_csv(path, warn=lambda m: None)
    except results.ResultsError as exc:
        raise GateInputError(f"{what}: {exc}") from None
    if df.empty:
        raise GateInputError(f"{what}: {path}: file has no rows")
    return df


def remeasure(plan: pd.DataFrame, out_csv: Path, **run_kw) -> pd.DataFrame:
    """Measure the rows of `plan` (key columns, status ok) once more, through `run_current` into
    a temporary CSV beside out_csv; their new rows."""
    fd, tmp = tempfile.mkstemp(prefix=".gate-remeasure-", suffix=".csv", dir=Path(out_csv).parent)
    os.close(fd)
    try:
        run_current(plan, Path(tmp), **run_kw)
        return read_measured(Path(tmp), "re-measured")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def require_cuda() -> None:
    """GateInputError unless a CUDA GPU is available (gate --run measures on it)."""
    import torch
    if not torch.cuda.is_available():
        raise GateInputError("gate --run needs a CUDA GPU and none is available "
                             "(compare two existing CSVs with --current instead)")


def recheck_timing(timing, factor: float):
    """timing (point.TimingOptions) with its per-point cap and sampled GPU time multiplied by factor."""
    return replace(timing, max_time_s=timing.max_time_s * factor, min_time_ms=timing.min_time_ms * factor)


def measure(spec, baseline_df: pd.DataFrame, recheck: Recheck, *, health: str = "", rates=None,
            log: Callable[[str], None] = print) -> Path:
    """gate --run (spec: bench.spec.GateSpec): the baseline's points into spec.current, then, for up
    to spec.recheck_rounds rounds, the rows `recheck` cannot decide measured again with longer
    sampling (`recheck_timing`) and merged in place of the earlier ones. GateInputError without
    CUDA; returns spec.current."""
    from moda_bench.bench.runner import schema_rows

    require_cuda()
    current = spec.current_csv
    run_kw = dict(use_tuned=spec.use_tuned, timing=spec.timing, health=health, rates=rates, log=log)
    run_current(baseline_df, current, **run_kw)
    log(f"gate --run: wrote {current}")
    rows = read_measured(current, "current")
    timing = spec.timing
    for n in range(1, spec.recheck_rounds + 1):
        what, again = recheck.plan(rows)
        if not len(again):
            break
        timing = recheck_timing(timing, spec.recheck_time)
        log(f"gate --run: {what}: measuring them again (round {n} of at most {spec.recheck_rounds}, "
            f"up to {timing.max_time_s:g} s a point)")
        new = remeasure(again, current, **{**run_kw, "timing": timing})
        rows = recheck.merge(rows, new)
        results.write_csv_atomic(current, schema_rows(rows))
        log(f"gate --run: {len(new)} re-measured row(s) replace the earlier ones in {current}")
    return current
