"""The reports/ tree that `moda-bench report` writes by default: one report per GPU folder of the
results tree (`results/<gpu>/` -> `reports/<gpu>/REPORT.md` and `figures/`), with the paper's
tables from `results/reference/`; and `check_tree`, which says whether a committed reports/
tree is what the results give now (every `*.md` byte for byte; figures are kept up to date by
their manifest, `reports.manifest`).

`check_tree` regenerates the reports into a temporary folder that starts with a copy of the
committed figures, so an unchanged figure is recognised by its digest and nothing is drawn; a
difference is one line per file naming it.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Iterable, Optional

from moda_bench.reports.inputs import Warn
from moda_bench.reports.report import Written, generate_report
from moda_bench.reports.vocab import ReportError

REFERENCE = "reference"
REPORT = "REPORT.md"


def gpu_folders(root: Path, only: Optional[Iterable[str]] = None) -> list[Path]:
    """The GPU folders of a results tree: its subfolders holding a CSV, `reference/` aside
    (`only`: these names alone; an unknown name is a ReportError)."""
    root = Path(root)
    if not root.is_dir():
        raise ReportError(f"results directory not found: {root}")
    found = [d for d in sorted(root.iterdir())
             if d.is_dir() and d.name != REFERENCE and next(d.rglob("*.csv"), None) is not None]
    if only is not None:
        names = list(only)
        unknown = sorted(set(names) - {d.name for d in found})
        if unknown:
            raise ReportError(f"no GPU folder {', '.join(unknown)} under {root} (there: "
                              f"{', '.join(d.name for d in found) or 'none'})")
        found = [d for d in found if d.name in names]
    if not found:
        raise ReportError(f"no GPU folders with CSVs under {root}")
    return found


def write_tree(root: Path, out: Path, *, figures: bool = True, draw: bool = True, only: Optional[Iterable[str]] = None,
               paper_dir: Optional[Path] = None, warn: Optional[Warn] = None, **options) -> dict[str, Written]:
    """out/<gpu>/REPORT.md (+ figures) for every GPU folder of root, the paper's tables from
    paper_dir (default root/reference); `options` go to `generate_report`."""
    root, out = Path(root), Path(out)
    if paper_dir is None and (root / REFERENCE).is_dir():
        paper_dir = root / REFERENCE
    return {d.name: generate_report([d], out / d.name, paper_dir=paper_dir, figures=figures, draw=draw,
                                    warn=warn, **options)
            for d in gpu_folders(root, only)}


def _first_difference(want: list[str], got: list[str]) -> str:
    for i, (a, b) in enumerate(zip(want, got), start=1):
        if a != b:
            return f"line {i}: committed {a[:60]!r}, regenerated {b[:60]!r}"
    return f"committed {len(want)} lines, regenerated {len(got)}"


def check_tree(root: Path, committed: Path, *, only: Optional[Iterable[str]] = None,
               warn: Optional[Warn] = None) -> list[str]:
    """One line per `*.md` of committed (under the GPU folders checked) that differs from, is
    missing from, or is not in the reports regenerated from root; [] when they all match."""
    root, committed = Path(root), Path(committed)
    folders = [d.name for d in gpu_folders(root, only)]
    problems = []
    with tempfile.TemporaryDirectory(prefix="moda-bench-check-") as tmp:
        fresh = Path(tmp)
        for name in folders:
            if (committed / name / "figures").is_dir():
                shutil.copytree(committed / name / "figures", fresh / name / "figures")
        write_tree(root, fresh, draw=False, only=folders, warn=warn)
        for name in folders:
            want = {p.relative_to(committed): p for p in (committed / name).rglob("*.md")} \
                if (committed / name).is_dir() else {}
            got = {p.relative_to(fresh): p for p in (fresh / name).rglob("*.md")}
            for rel in sorted(set(want) | set(got)):
                shown = (committed / rel).as_posix()
                if rel not in got:
                    problems.append(f"{shown}: not written by `moda-bench report` from {root.as_posix()}/ (stale?)")
                elif rel not in want:
                    problems.append(f"{shown}: missing; `moda-bench report` writes it from {root.as_posix()}/")
                elif want[rel].read_bytes() != got[rel].read_bytes():
                    diff = _first_difference(want[rel].read_text(encoding="utf-8").splitlines(),
                                             got[rel].read_text(encoding="utf-8").splitlines())
                    problems.append(f"{shown}: differs from what `moda-bench report` writes from "
                                    f"{root.as_posix()}/ now ({diff})")
    return problems
