"""`moda-bench gate`: its options (threshold parsing included), its console output, summary
files and exit codes; the work (reading, comparing, rendering, `--run`) is `moda_bench.reports.gate`.

Exit codes: 0 pass; 1 a `regressed` or `failed` row (0 with --warn-only); 2 unusable input, said
in one line on stderr naming the file (and line, column) with no traceback.
"""
from __future__ import annotations

import math
import os
import shutil
from pathlib import Path
from typing import Annotated, Optional

import typer

from moda_bench.cli.report import warn_line
from moda_bench.reports.gate import (GateInputError, Metric, check_columns, compare, markdown_summary,
                                     print_report, read_run, require_overlap, run_current, verdict_text)


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


def gate_command(
    baseline: Annotated[Path, typer.Option("--baseline", help="Baseline results CSV (schema.COLUMNS).")],
    current: Annotated[Optional[Path], typer.Option(
        "--current", help="Current results CSV; with --run, where the new run is written "
                          "(default gate-current.csv).")] = None,
    threshold: Annotated[str, typer.Option(
        "--threshold", help="Smallest change that counts, as 5% or 0.05 (and it must exceed the noise).")] = "5%",
    metric: Annotated[Metric, typer.Option(
        "--metric", help="ratio: time / fa2 time of the same run and config (robust to machine speed); "
                         "time: raw median_ms.")] = Metric.ratio,
    run: Annotated[bool, typer.Option("--run", help="Run the baseline's points and providers on this GPU "
                                                    "first, then gate that run.")] = False,
    update_baseline: Annotated[bool, typer.Option(
        "--update-baseline", help="After gating, copy the current CSV over the baseline (deliberate).")] = False,
    allow_gpu_change: Annotated[bool, typer.Option(
        "--allow-gpu-change", help="Compare even if the GPU names differ.")] = False,
    warn_only: Annotated[bool, typer.Option("--warn-only", help="Report regressions but exit 0.")] = False,
    summary: Annotated[Optional[Path], typer.Option(
        "--summary", help="Write a Markdown summary here (default: append to $GITHUB_STEP_SUMMARY if set).")] = None,
    all_rows: Annotated[bool, typer.Option("--all-rows", help="List unchanged rows too.")] = False,
    use_tuned: Annotated[bool, typer.Option(help="--run: use tuned kernel configs.")] = True,
    warmup_ms: Annotated[float, typer.Option(help="--run: do_bench warm-up per measurement (ms).")] = 25,
    rep_ms: Annotated[float, typer.Option(help="--run: do_bench repetition time per measurement (ms).")] = 100,
) -> None:
    """Compare a results CSV with a baseline; exit 1 on a regression beyond threshold and noise."""
    from rich.console import Console

    out, err = Console(), Console(stderr=True)
    threshold_value = parse_threshold(threshold)
    try:
        baseline_df = read_run(baseline, "baseline", warn=warn_line)
        if run:
            import torch
            if not torch.cuda.is_available():
                raise _error(err, "gate --run needs a CUDA GPU and none is available "
                                  "(compare two existing CSVs with --current instead)")
            current = current or Path("gate-current.csv")
            check_columns(baseline_df, "baseline")
            run_current(baseline_df, current, use_tuned=use_tuned, warmup_ms=warmup_ms, rep_ms=rep_ms,
                        log=out.print)
            out.print(f"gate --run: wrote {current}")
        elif current is None:
            raise typer.BadParameter("give --current NEW.csv, or --run to measure it now", param_hint="--current")
        current_df = read_run(current, "current", warn=warn_line)
        result = require_overlap(compare(baseline_df, current_df, threshold_value, metric.value, allow_gpu_change))
    except GateInputError as exc:
        raise _error(err, str(exc)) from None

    print_report(result, out, all_rows=all_rows)
    text = markdown_summary(result, str(baseline), str(current))
    if summary is not None:
        summary.parent.mkdir(parents=True, exist_ok=True)
        summary.write_text(text)
        out.print(f"summary written to {summary}")
    elif os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a", encoding="utf-8") as fh:
            fh.write(text + "\n")
    if update_baseline:
        shutil.copyfile(current, baseline)
        out.print(f"[bold yellow]baseline updated:[/] copied {current} over {baseline} "
                  f"({len(current_df)} rows; gate verdict {verdict_text(result)})")
    if result.failed:
        if warn_only:
            out.print("[yellow]--warn-only: exiting 0 despite the regression[/]")
            return
        raise typer.Exit(1)
