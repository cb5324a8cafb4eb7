"""`moda-bench report`: its options, its messages and exit codes; the work is
`moda_bench.reports.report.generate_report`.

Warnings (a CSV that is not a results file, a malformed row) go to stderr, one line each, and
the report goes on; a `ReportError` is one line on stderr and exit code 2 (no traceback).
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from moda_bench.reports.report import ReportError, generate_report


def print_line(text: str, *, stderr: bool = False, style: str | None = None) -> None:
    """One line on stdout/stderr, never wrapped or marked up (file names may hold brackets)."""
    from rich.console import Console
    Console(stderr=stderr).print(text, style=style, markup=False, highlight=False, soft_wrap=True)


def warn_line(message: str) -> None:
    """A reader's warning as one line on stderr."""
    print_line(f"warning: {message}", stderr=True, style="yellow")


def report_command(
    results_dirs: Annotated[Optional[list[Path]], typer.Argument(
        help="Directories (searched recursively) or CSV files with sweep/ablation results. Default: results/",
        show_default=False)] = None,
    out: Annotated[Path, typer.Option("--out", help="Output directory for REPORT.md and figures/.")]
        = Path("docs/report"),
    ceiling_tflops: Annotated[Optional[float], typer.Option(
        "--ceiling-tflops", help="Matmul ceiling for the TFLOP/s figure (default: a 'matmul' row, else 784).")]
        = None,
    paper_dir: Annotated[Optional[Path], typer.Option(
        "--paper-dir", help="Folder with paper_a100_*.csv (default: <results dir>/reference).")] = None,
    fa2_provider: Annotated[Optional[str], typer.Option(
        "--fa2-provider", help="Provider used as the FA2 baseline (default: fa2, else fa2-triton).")] = None,
    moda_provider: Annotated[Optional[str], typer.Option(
        "--moda-provider", help="Provider used as MoDA (default: moda, else ours).")] = None,
    figures: Annotated[bool, typer.Option("--figures/--no-figures", help="Also draw the PNG/SVG figures.")] = True,
) -> None:
    """Regenerate REPORT.md and every figure from saved CSVs (no GPU needed)."""
    try:
        written = generate_report(results_dirs or [Path("results")], out, paper_dir=paper_dir,
                                  ceiling_tflops=ceiling_tflops, fa2_provider=fa2_provider,
                                  moda_provider=moda_provider, figures=figures, warn=warn_line)
    except ReportError as e:
        print_line(f"error: {e}", stderr=True, style="red")
        raise typer.Exit(2)
    n_fig = sum(p.suffix == ".png" for p in written)
    tail = f" and {n_fig} figure(s) (PNG + SVG) in {out / 'figures'}" if n_fig else ""
    print_line(f"wrote {out / 'REPORT.md'}{tail}")
