"""`moda-bench report`: its options, its messages and exit codes; the command builds one
`reports.run.ReportSpec` and hands it to `reports.run.run_report`.

With no folders named it writes the reports/ tree (one report per GPU folder of results/) and,
where README.md has headline markers, the headline tables; with folders or CSVs named, one report
over them into --out. `--index` writes results/INDEX.md alone; `--check` compares the committed
reports with what the results give (exit code 1 and one line per differing file when they differ).
Warnings (a CSV that is not a results file, a malformed row) go to stderr, one line each, and
the report goes on; a `ReportError` is one line on stderr and exit code 2 (no traceback).
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from moda_bench.reports.run import ReportSpec, run_report
from moda_bench.reports.vocab import ReportError

RESULTS = Path("results")
REPORTS = Path("reports")
README = Path("README.md")


def print_line(text: str, *, stderr: bool = False, style: str | None = None) -> None:
    """One line on stdout/stderr, never wrapped or marked up (file names may hold brackets)."""
    from rich.console import Console
    Console(stderr=stderr).print(text, style=style, markup=False, highlight=False, soft_wrap=True)


def warn_line(message: str) -> None:
    """A reader's warning as one line on stderr."""
    print_line(f"warning: {message}", stderr=True, style="yellow")


def report_command(
    results_dirs: Annotated[Optional[list[Path]], typer.Argument(
        help="Directories (searched recursively) or CSV files for one report into --out. Default: the results/ "
             "tree, one report per GPU folder (reports/<gpu>/) and README's headline tables.",
        show_default=False)] = None,
    out: Annotated[Path, typer.Option("--out", help="Output directory (the reports/ tree, or one report's folder).")]
        = REPORTS,
    ceiling_tflops: Annotated[Optional[float], typer.Option(
        "--ceiling-tflops", help="Matmul ceiling for the TFLOP/s figure (default: a 'matmul' row, else 784).")]
        = None,
    paper_dir: Annotated[Optional[Path], typer.Option(
        "--paper-dir", help="Folder with paper_a100_*.csv (default: <results dir>/reference).")] = None,
    fa2_provider: Annotated[Optional[str], typer.Option(
        "--fa2-provider", help="Provider used as the FA2 baseline (default: fa2, else fa2-triton).")] = None,
    moda_provider: Annotated[Optional[str], typer.Option(
        "--moda-provider", help="Provider used as MoDA (default: moda, else ours).")] = None,
    figures: Annotated[bool, typer.Option("--figures/--no-figures", help="Also draw the PNG figures.")] = True,
    readme: Annotated[Optional[Path], typer.Option(
        "--readme", help="README whose headline markers get one table per GPU (default: README.md when present).",
        show_default=False)] = None,
    index: Annotated[bool, typer.Option("--index", help="Write results/INDEX.md (the run folders' index) only.")]
        = False,
    check: Annotated[bool, typer.Option(
        "--check", help="Write nothing; exit 1 if a committed report differs from what results/ gives.")] = False,
) -> None:
    """Regenerate the reports (REPORT.md and figures) from saved CSVs (no GPU needed)."""
    if readme is not None and not readme.is_file():
        raise typer.BadParameter(f"{readme}: no such file", param_hint="--readme")
    if results_dirs and (index or check or readme is not None):
        raise typer.BadParameter("--index, --check and --readme work on the results/ tree; name no folders with them")
    spec = ReportSpec(results_dirs=tuple(results_dirs or ()), out=out, index=index, check=check, figures=figures,
                      readme=readme if readme is not None else (README if README.is_file() else None),
                      paper_dir=paper_dir, ceiling_tflops=ceiling_tflops, fa2_provider=fa2_provider,
                      moda_provider=moda_provider)
    try:
        outcome = run_report(spec, warn_line)
    except ReportError as e:
        print_line(f"error: {e}", stderr=True, style="red")
        raise typer.Exit(2)
    for problem in outcome.problems:
        print_line(problem, stderr=True, style="red")
    for line in outcome.lines:
        print_line(line)
    if outcome.problems:
        raise typer.Exit(1)
