"""What one `moda-bench report` call does, from the one spec object its command builds
(`ReportSpec`): the reports/ tree from the results tree and README's headline tables (the
default), one report over the folders or files named, the results index (`--index`), or the
check that the committed reports are what the results give (`--check`). The command's options,
messages and exit codes are `moda_bench.cli.report`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from moda_bench.reports.inputs import Warn
from moda_bench.reports.report import generate_report
from moda_bench.reports.tree import check_tree, write_tree


@dataclass(frozen=True)
class ReportSpec:
    """Everything one `moda-bench report` call does."""

    results_dirs: tuple[Path, ...] = ()   # empty: the results tree `root`, one report per GPU folder
    root: Path = Path("results")
    out: Path = Path("reports")
    readme: Optional[Path] = None         # README whose headline markers to fill (tree mode)
    index: bool = False                   # write root/INDEX.md only
    check: bool = False                   # compare out/**/*.md (and readme's headlines) with a regeneration
    figures: bool = True
    paper_dir: Optional[Path] = None
    ceiling_tflops: Optional[float] = None
    fa2_provider: Optional[str] = None
    moda_provider: Optional[str] = None


@dataclass
class Outcome:
    """What the call did (`lines`, one per thing written) and, for a check, what differs."""

    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _options(spec: ReportSpec) -> dict:
    return dict(ceiling_tflops=spec.ceiling_tflops, fa2_provider=spec.fa2_provider, moda_provider=spec.moda_provider)


def _figure_line(out: Path, written) -> str:
    n_fig = sum(p.suffix == ".png" for p in written)
    if not n_fig:
        return f"wrote {out / 'REPORT.md'}"
    n_drawn = len(written.drawn)
    state = "all drawn" if n_drawn == n_fig else "all up to date" if not n_drawn else \
        f"{n_drawn} drawn, the others up to date"
    return f"wrote {out / 'REPORT.md'} and {n_fig} figure(s) in {out / 'figures'} ({state})"


def run_report(spec: ReportSpec, warn: Warn) -> Outcome:
    """Do what spec says; ReportError (one line) for unusable inputs."""
    outcome = Outcome()
    if spec.index:
        from moda_bench.reports.index import write_index
        outcome.lines.append(f"wrote {write_index(spec.root)}")
        return outcome
    if spec.check:
        outcome.problems = check_tree(spec.root, spec.out, warn=warn)
        if spec.readme is not None:
            from moda_bench.reports.readme import check_readme
            outcome.problems += check_readme(spec.readme, spec.root, warn)
        outcome.lines.append(f"{spec.out}: every report is what {spec.root} gives" if not outcome.problems else
                             f"{spec.out}: {len(outcome.problems)} report(s) differ from what {spec.root} gives")
        return outcome
    if spec.results_dirs:
        written = generate_report(list(spec.results_dirs), spec.out, paper_dir=spec.paper_dir, figures=spec.figures,
                                  warn=warn, **_options(spec))
        outcome.lines.append(_figure_line(spec.out, written))
        return outcome
    for name, written in write_tree(spec.root, spec.out, figures=spec.figures, paper_dir=spec.paper_dir, warn=warn,
                                    **_options(spec)).items():
        outcome.lines.append(_figure_line(spec.out / name, written))
    if spec.readme is not None:
        from moda_bench.reports.readme import update_readme
        names = update_readme(spec.readme, spec.root, warn)
        if names:
            outcome.lines.append(f"wrote the headline table(s) of {', '.join(names)} in {spec.readme}")
    return outcome
