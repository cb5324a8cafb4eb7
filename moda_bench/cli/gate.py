"""`moda-bench gate`: its options (threshold parsing included) gathered into one
`bench.spec.GateSpec`, its console output, summary files, exit codes, and the GPU health checks of
`--run`; the comparison, its table and summary are `moda_bench.reports.gate` / `gate_text`, the
measurements of `--run` are `moda_bench.bench.gate.measure`.

`--run`: the GPU health canary at the start (`cli.checks.RunHealth`, as `sweep` does), the
baseline's points and providers measured, the AMBIGUOUS rows (`reports.gate.Recheck`) measured
again with longer sampling (up to --recheck-rounds rounds), the new rows replacing the earlier ones
in the current CSV, the canary at the end
(`cli.checks.finish` marks the rows when a check was not healthy); then the current CSV is gated
like a given one.

Exit codes: 0 pass; 1 a SLOW or FAILED row, a MISSING row (unless --allow-missing) or an
AMBIGUOUS row under --fail-ambiguous (0 with --warn-only); 2 unusable input or usage, said in one
line on stderr naming the file (and line, column) with no traceback: unreadable files, rows
measured on an unhealthy GPU (`health` column), a GPU change, nothing in common, no CUDA for --run.
"""
from __future__ import annotations

import math
import os
import shutil
from pathlib import Path
from typing import Annotated, Optional

import typer

from moda_bench.bench import gate as gate_bench
from moda_bench.bench.point import TimingOptions
from moda_bench.bench.spec import GateSpec, Metric, SpecError
from moda_bench.cli import checks
from moda_bench.cli.report import warn_line
from moda_bench.reports.gate import GateInputError, Recheck, check_columns, compare, read_run, require_overlap
from moda_bench.reports.gate_text import markdown_summary, print_report, verdict_text

METRIC_HELP = (
    "ratio: ratio_to_fa2, the provider's time / fa2's time measured in the same interleaved rounds, "
    "with its 95% interval (robust to machine speed); ratio-best: ratio_to_best, normalised by the "
    "fastest sequence-only attention of the point (e.g. FA4 on Hopper); time: median_ms with the p20-p80 "
    "band (same machine only). A row is SLOW when the whole interval of its change lies above "
    "+threshold, FAST below -threshold, AMBIGUOUS when the interval cannot decide, else SAME; rows of "
    "files without intervals use the point change and the p20-p80 bands.")


def parse_threshold(text: str) -> float:
    """'5%' -> 0.05, '0.05' -> 0.05; rejects negatives and ambiguous bare numbers >= 1."""
    s = str(text).strip()
    try:
        value = float(s[:-1]) / 100.0 if s.endswith("%") else float(s)
    except ValueError:
        raise typer.BadParameter(f"threshold must look like 5% or 0.05, got {text!r}",
                                 param_hint="--threshold") from None
    if not s.endswith("%") and value >= 1:
        raise typer.BadParameter(f"threshold {text!r} is ambiguous: write {s}% or {value / 100:g}",
                                 param_hint="--threshold")
    if not math.isfinite(value) or value < 0:
        raise typer.BadParameter(f"threshold must be a non-negative fraction, got {text!r}",
                                 param_hint="--threshold")
    return value


def _error(console, message: str) -> typer.Exit:
    """Print `error: message` as one line on the console; the Exit(2) to raise."""
    from rich.markup import escape
    console.print(f"[red]error:[/] {escape(message)}", soft_wrap=True, highlight=False)
    return typer.Exit(2)


def measure(spec: GateSpec, baseline_df, console) -> None:
    """gate --run: canary, the measurements (`bench.gate.measure`), canary again (rows marked
    when a check was not healthy). GateInputError for no CUDA, --strict on an unhealthy GPU, and
    what the comparison refuses."""
    gate_bench.require_cuda()
    check_columns(baseline_df, "baseline")
    gpu_run = checks.RunHealth(checks.device_indices(None), enabled=spec.health_check)
    gpu_run.check("start", console)
    bad = gpu_run.worst()
    if spec.strict and bad is not None:
        raise GateInputError(f"GPU {bad.status} at the start of the run ({bad.reason}): --strict, nothing measured")
    current = gate_bench.measure(spec, baseline_df, Recheck(baseline_df, spec.policy()), health=gpu_run.row_label(),
                                 rates=gpu_run.rates(), log=console.print)
    checks.finish(gpu_run, console, [current], strict=False)


def gate_command(
    baseline: Annotated[Path, typer.Option("--baseline", help="Baseline results CSV (schema.COLUMNS).")],
    current: Annotated[Optional[Path], typer.Option(
        "--current", help="Current results CSV; with --run, where the new run is written "
                          "(default gate-current.csv).")] = None,
    threshold: Annotated[str, typer.Option(
        "--threshold", help="Smallest change that counts, as 5% or 0.05 (the interval must clear it).")] = "5%",
    metric: Annotated[Metric, typer.Option("--metric", help=METRIC_HELP)] = Metric.ratio,
    run: Annotated[bool, typer.Option("--run", help="Run the baseline's points and providers on this GPU "
                                                    "first (AMBIGUOUS rows again: --recheck-rounds), then gate "
                                                    "that run.")] = False,
    update_baseline: Annotated[bool, typer.Option(
        "--update-baseline", help="After gating, copy the current CSV over the baseline (deliberate).")] = False,
    allow_gpu_change: Annotated[bool, typer.Option(
        "--allow-gpu-change", help="Compare even if the GPU names differ.")] = False,
    allow_missing: Annotated[bool, typer.Option(
        "--allow-missing", help="Report baseline rows that the current run lacks or did not measure as "
                                "MISSING without failing (default: they fail the gate).")] = False,
    fail_ambiguous: Annotated[bool, typer.Option(
        "--fail-ambiguous", help="Fail on AMBIGUOUS rows (change beyond the threshold but not beyond the "
                                 "interval, or an interval too wide to decide).")] = False,
    warn_only: Annotated[bool, typer.Option("--warn-only", help="Report regressions but exit 0.")] = False,
    summary: Annotated[Optional[Path], typer.Option(
        "--summary", help="Write a Markdown summary here (default: append to $GITHUB_STEP_SUMMARY if set).")] = None,
    all_rows: Annotated[bool, typer.Option("--all-rows", help="List SAME and REFERENCE rows too.")] = False,
    use_tuned: Annotated[bool, typer.Option(help="--run: use tuned kernel configs.")] = True,
    warmup_ms: Annotated[float, typer.Option(help="--run: warm-up per provider (ms).")] = 25,
    rep_ms: Annotated[float, typer.Option(help="--run: GPU time each provider is sampled at least (ms).")] = 100,
    min_samples: checks.MinSamplesOption = 10,
    ci_tol: checks.CiTolOption = 0.01,
    max_time: checks.MaxTimeOption = 60.0,
    strict: Annotated[bool, typer.Option(
        "--strict", help="--run: stop before measuring when the start health check is not healthy (default: "
                         "measure, mark the rows, then exit 2 all the same).")] = False,
    health_check: checks.CheckOption = True,
    recheck_rounds: Annotated[int, typer.Option(
        help="--run: rounds of measuring the AMBIGUOUS rows again (with their references); 0: none.")] = 2,
    recheck_time: Annotated[float, typer.Option(
        help="--run: each recheck round samples this many times longer than the one before (its --max-time "
             "and --rep-ms), so the intervals narrow.")] = 3.0,
) -> None:
    """Compare a results CSV with a baseline; exit 1 on a regression the intervals confirm (SLOW),
    a broken provider, or missing evidence; exit 2 on unusable input or an unhealthy GPU."""
    from rich.console import Console

    out, err = Console(), Console(stderr=True)
    timing = (checks.timing_options("eager", min_samples, ci_tol, max_time, warmup_ms, rep_ms) if run
              else TimingOptions())
    try:
        spec = GateSpec(baseline=baseline, current=current, threshold=parse_threshold(threshold), metric=metric.value,
                        run=run, update_baseline=update_baseline, allow_gpu_change=allow_gpu_change,
                        allow_missing=allow_missing, fail_ambiguous=fail_ambiguous, warn_only=warn_only,
                        summary=summary, all_rows=all_rows, use_tuned=use_tuned, timing=timing, strict=strict,
                        health_check=health_check, recheck_rounds=recheck_rounds, recheck_time=recheck_time)
    except SpecError as exc:
        raise typer.BadParameter(str(exc), param_hint=exc.option or None) from None
    try:
        baseline_df = read_run(spec.baseline, "baseline", warn=warn_line)
        if spec.run:
            measure(spec, baseline_df, out)
        current_df = read_run(spec.current_csv, "current", warn=warn_line)
        result = require_overlap(compare(baseline_df, current_df, **spec.policy()))
    except GateInputError as exc:
        raise _error(err, str(exc)) from None
    report(spec, result, len(current_df), out)


def report(spec: GateSpec, result, current_rows: int, out) -> None:
    """The table, the Markdown summary (--summary or $GITHUB_STEP_SUMMARY), --update-baseline, and
    exit 1 when the gate fails (unless --warn-only)."""
    print_report(result, out, all_rows=spec.all_rows)
    text = markdown_summary(result, str(spec.baseline), str(spec.current_csv))
    if spec.summary is not None:
        spec.summary.parent.mkdir(parents=True, exist_ok=True)
        spec.summary.write_text(text)
        out.print(f"summary written to {spec.summary}")
    elif os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a", encoding="utf-8") as fh:
            fh.write(text + "\n")
    if spec.update_baseline:
        shutil.copyfile(spec.current_csv, spec.baseline)
        out.print(f"[bold yellow]baseline updated:[/] copied {spec.current_csv} over {spec.baseline} "
                  f"({current_rows} rows; gate verdict {verdict_text(result)})")
    if result.failed:
        if spec.warn_only:
            out.print("[yellow]--warn-only: exiting 0 despite the failure[/]")
            return
        raise typer.Exit(1)
