"""The GPU health checks a measuring command (sweep, ablate, tune, gate --run) runs at its start
and end, and the options they share.

At the start: the run header (GPU, driver, power limit, max clocks, ECC, other processes) and
the health canary (`moda_bench.health.check_health`) on every GPU the run uses; its verdict is
written into every row's `health` column ('healthy', else '<status>: <reason>'). At the end the
canary runs again; if either check was not healthy the command warns loudly, the rows written
since the start are re-marked with the worst verdict, and `--strict` turns that into exit code
3. Without CUDA (or NVML) the verdict is 'unknown' and nothing is enforced.
"""
from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Optional, Sequence

import typer

STRICT_EXIT = 3

StrictOption = Annotated[bool, typer.Option(
    "--strict", help="Exit 3 when the GPU health check at the start or end of the run is not healthy "
    "(a degraded or shared GPU); rows are marked in the `health` column either way.")]
CheckOption = Annotated[bool, typer.Option(
    "--health-check/--no-health-check", help="Run the health canary (about 2 s) at the start and end.")]
TimerOption = Annotated[str, typer.Option(
    "--timer", help="eager: host-inclusive times (launch overhead counts); graph: CUDA-graph replays "
    "(device time only); do_bench: each provider alone through triton's do_bench, as runs before "
    "interleaved timing did (for comparing with them; no intervals).")]
MinSamplesOption = Annotated[int, typer.Option(
    "--min-samples", help="Repetitions every row gets at least (L2 flushed before each).")]
CiTolOption = Annotated[float, typer.Option(
    "--ci-tol", help="Stop a point's interleaved rounds once every ratio's 95% interval is within "
    "+- this fraction.")]
MaxTimeOption = Annotated[float, typer.Option(
    "--max-time", help="Per-point cap in seconds on the interleaved rounds (min-samples still honoured).")]


def label(verdict) -> str:
    """The `health` column's text of a verdict."""
    return verdict.status if verdict.ok else f"{verdict.status}: {verdict.reason}"


@dataclass
class RunHealth:
    """The start and end verdicts of one run on some GPUs."""

    devices: Sequence[int]
    enabled: bool = True
    started: str = field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    start: list = field(default_factory=list)
    end: list = field(default_factory=list)

    def check(self, stage: str, console) -> list:
        from moda_bench import health
        if not self.enabled:
            return []
        verdicts = []
        for i in self.devices:
            try:
                v = health.check_health(i)
            except Exception as exc:  # noqa: BLE001 - a failing canary is a verdict
                v = health.Verdict("degraded", f"health canary failed: {type(exc).__name__}: {exc}")
            verdicts.append(v)
            say(console, stage, i, v)
        (self.start if stage == "start" else self.end).extend(verdicts)
        return verdicts

    def row_label(self) -> str:
        bad = [v for v in self.start if not v.ok and v.status != "unknown"]
        if bad:
            return label(bad[0])
        return self.start[0].status if self.start else ""

    def rates(self):
        """The floor's ceilings (floor.Rates) from the start canary, else the GPU's table entry."""
        from moda_bench.bench.spec import rates_from_verdicts
        name = None
        if not self.start:   # no canary ran: the GPU's table entry, by name
            try:
                import torch
                name = torch.cuda.get_device_name(self.devices[0]) if torch.cuda.is_available() else None
            except Exception:  # noqa: BLE001 - no name, no table entry
                name = None
        return rates_from_verdicts(self.start, name)

    def header(self) -> list:
        return [dict(v.header, status=v.status, reason=v.reason, matmul_tflops=v.matmul_tflops,
                     copy_gbps=v.copy_gbps) for v in self.start]

    def worst(self):
        bad = [v for v in self.start + self.end if not v.ok and v.status != "unknown"]
        return bad[0] if bad else None


def say(console, stage: str, device: int, v) -> None:
    g = v.gpu or {}
    nums = ""
    if v.matmul_tflops:
        nums = (f" (matmul {v.matmul_tflops:.0f} TFLOP/s, copy {v.copy_gbps:.0f} GB/s,"
                f" SM {g.get('sm_clock_mhz') or '-'} MHz, {g.get('power_w') or 0:.0f} W,"
                f" throttle: {g.get('throttle') or 'none'})")
    if v.ok or v.status == "unknown":
        console.print(f"GPU {device} health ({stage}): {v.status}{nums}", markup=False, highlight=False)
    else:
        console.print(f"[bold red]WARNING: GPU {device} is {v.status.upper()} ({stage} of run):[/] ", end="")
        console.print(f"{v.reason}{nums}; its rows are marked in the `health` column and are not comparable "
                      "with a healthy run", markup=False, highlight=False, soft_wrap=True)


def finish(run: RunHealth, console, csvs: Sequence[Path], strict: bool) -> None:
    """End-of-run check: re-mark this run's rows when a check failed; exit 3 under --strict."""
    if not run.enabled:
        return
    run.check("end", console)
    bad = run.worst()
    if bad is None:
        return
    mark_rows(csvs, run.started, label(bad))
    if strict:
        console.print(f"--strict: exiting with code {STRICT_EXIT}: the GPU was {bad.status} during this run",
                      markup=False, highlight=False)
        raise typer.Exit(STRICT_EXIT)


def mark_rows(csvs: Sequence[Path], since: str, text: str) -> None:
    """Set `health` = text on every row of csvs measured at or after `since` (ISO time); sweep files
    and `moda-bench model` files (schema.MODEL_COLUMNS) alike."""
    import pandas as pd

    from moda_bench import results, schema
    from moda_bench.bench.runner import schema_rows
    t0 = pd.Timestamp(since)
    quiet = lambda message: None  # noqa: E731
    for csv in csvs:
        csv = Path(csv)
        if not csv.exists():
            continue
        model = results.is_model_file(csv)
        df = results.read_model_rows(csv, warn=quiet) if model else results.read_csv(csv, warn=quiet)
        ts = pd.to_datetime(df["timestamp"], utc=True, errors="coerce", format="ISO8601")
        df["health"] = df["health"].astype(object)
        df.loc[ts >= t0, "health"] = text
        if model:
            results.write_csv_atomic(csv, df, columns=schema.MODEL_COLUMNS)
        else:
            results.write_csv_atomic(csv, schema_rows(df))


def timing_options(timer: str, min_samples: int, ci_tol: float, max_time: float, warmup_ms: float,
                   rep_ms: float):
    """TimingOptions from the shared options (BadParameter for bad values)."""
    from moda_bench.bench.point import TimingOptions
    from moda_bench.bench.runner import LEGACY_TIMER
    from moda_bench.timing import TIMERS
    if timer not in TIMERS + (LEGACY_TIMER,):
        raise typer.BadParameter(f"--timer must be one of {', '.join(TIMERS + (LEGACY_TIMER,))}, got {timer!r}")
    if min_samples < 2:
        raise typer.BadParameter(f"--min-samples must be >= 2 (a single repetition has no spread), got {min_samples}")
    if not 0 < ci_tol < 1:
        raise typer.BadParameter(f"--ci-tol must be a fraction in (0, 1), got {ci_tol}")
    if max_time <= 0:
        raise typer.BadParameter(f"--max-time must be > 0 seconds, got {max_time}")
    return TimingOptions(timer=timer, min_samples=min_samples, warmup_ms=warmup_ms, min_time_ms=rep_ms,
                         ci_tol=ci_tol, max_time_s=max_time)


def device_indices(gpus: Optional[str]) -> list[int]:
    """The GPUs a run uses: 0, or those --gpus names (resolved like the pool does)."""
    if gpus is None:
        return [0]
    from moda_bench.bench.pool.plan import resolve_gpus
    return [slot.index for slot in resolve_gpus(gpus)]
