"""The committed reports/ tree, results/INDEX.md and README's headline tables are what
`moda-bench report` writes from results/; figures are PNG only, small, and redrawn only when
their inputs change (reports.tree, reports.index, reports.readme, reports.manifest)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from moda_bench.cli import app
from moda_bench.reports import manifest
from moda_bench.reports.index import INDEX, index_markdown
from moda_bench.reports.plotting import MAX_FIGURE_BYTES
from moda_bench.reports.readme import check_readme, marker_names, replace_between, update_readme
from moda_bench.reports.report import generate_report
from moda_bench.reports.tree import check_tree
from moda_bench.reports.vocab import ReportError

REPO = Path(__file__).resolve().parents[1]
RESULTS, REPORTS = REPO / "results", REPO / "reports"
FIXTURE = Path(__file__).resolve().parent / "data" / "report" / "results"
QUIET = dict(warn=lambda message: None)


def small_tree(tmp_path: Path, gpu: str = "h200x2") -> Path:
    """tmp_path/results (one GPU folder and the paper tables) and tmp_path/reports (its committed report)."""
    shutil.copytree(RESULTS / gpu, tmp_path / "results" / gpu)
    shutil.copytree(RESULTS / "reference", tmp_path / "results" / "reference")
    shutil.copytree(REPORTS / gpu, tmp_path / "reports" / gpu)
    return tmp_path


def bump_first_median(csv_path: Path) -> None:
    """Change one measured value of a results CSV, as a hand edit would."""
    frame = pd.read_csv(csv_path, dtype=str, keep_default_na=False)
    frame.loc[0, "median_ms"] = str(float(frame.loc[0, "median_ms"]) * 1.5)
    frame.to_csv(csv_path, index=False)


@pytest.mark.slow
def test_committed_reports_are_what_results_give():
    assert check_tree(RESULTS, REPORTS, **QUIET) == []


def test_changed_csv_fails_the_check_with_one_line_naming_the_report(tmp_path, monkeypatch):
    root = small_tree(tmp_path)
    monkeypatch.chdir(root)
    runner = CliRunner()
    ok = runner.invoke(app, ["report", "--check"])
    assert ok.exit_code == 0, ok.output
    assert "every report is what results gives" in ok.output
    bump_first_median(root / "results" / "h200x2" / "multi-gpu" / "2gpu" / "sweep_T.csv")
    bad = runner.invoke(app, ["report", "--check"])
    assert bad.exit_code == 1
    problems = [line for line in bad.output.splitlines() if "differs" in line and "REPORT.md" in line]
    print(problems[0])   # what a hand-edited CSV looks like to the check
    assert len(problems) == 1 and problems[0].startswith("reports/h200x2/REPORT.md: differs from what")
    assert "line " in problems[0] and "Traceback" not in bad.output


def test_committed_figures_are_small_pngs_with_a_manifest():
    pngs = sorted(REPORTS.rglob("*.png"))
    assert pngs and not list(REPORTS.rglob("*.svg"))
    too_big = [f"{p.relative_to(REPO)}: {p.stat().st_size} bytes" for p in pngs if p.stat().st_size > MAX_FIGURE_BYTES]
    assert not too_big, too_big
    for fig_dir in {p.parent for p in pngs}:
        assert sorted(manifest.load(fig_dir)) == sorted(p.name for p in fig_dir.glob("*.png")), fig_dir


def test_figures_redrawn_only_when_their_inputs_change(tmp_path):
    res = tmp_path / "results"
    shutil.copytree(FIXTURE, res)
    out = tmp_path / "out"
    first = generate_report([res], out, **QUIET)
    assert first.drawn and set(first.drawn) == {p for p in first if p.suffix == ".png"}
    before = {p: p.read_bytes() for p in first.drawn}
    again = generate_report([res], out, **QUIET)
    assert again.drawn == [] and list(again) == list(first)
    assert all(p.read_bytes() == b for p, b in before.items())
    (out / "figures" / "tflops.png").unlink()          # a missing file is drawn again
    assert [p.name for p in generate_report([res], out, **QUIET).drawn] == ["tflops.png"]
    bump_first_median(res / "sweeps" / "sweep_T.csv")  # new rows: the figures drawn from them
    changed = {p.name for p in generate_report([res], out, **QUIET).drawn}
    assert "runtime.png" in changed and "ablation.png" not in changed


@pytest.mark.slow
def test_index_is_what_the_command_writes():
    assert (RESULTS / INDEX).read_text(encoding="utf-8") == index_markdown(RESULTS)


def test_index_command_and_its_errors(tmp_path, monkeypatch):
    root = small_tree(tmp_path)
    monkeypatch.chdir(root)
    runner = CliRunner()
    done = runner.invoke(app, ["report", "--index"])
    assert done.exit_code == 0, done.output
    text = (root / "results" / INDEX).read_text(encoding="utf-8")
    assert text == index_markdown(root / "results")
    row = next(line for line in text.splitlines() if line.startswith("| [h200x2/multi-gpu]"))
    assert "| NVIDIA H200 | 2026-11-22 | 02a2c215f112 | cudnn, fa2, fa2-triton, flex, moda-triton | 130 |" in row
    assert "moda-bench sweep --preset paper --gpus all --out 2gpu" in text
    (root / "results" / "h200x2" / "multi-gpu" / "run.json").unlink()
    failed = runner.invoke(app, ["report", "--index"])
    assert failed.exit_code == 2 and "run.json: missing" in failed.output and "Traceback" not in failed.output


def test_replace_between_markers():
    text = "a\n<!-- moda-bench:headline:h100 -->\nold\n<!-- /moda-bench:headline:h100 -->\nb\n"
    new = replace_between(text, "h100", "new\ntable")
    assert new == "a\n<!-- moda-bench:headline:h100 -->\nnew\ntable\n<!-- /moda-bench:headline:h100 -->\nb\n"
    assert replace_between(new, "h100", "new\ntable") == new
    assert marker_names(new + "<!-- moda-bench:headline:h200 -->") == ["h100", "h200"]
    with pytest.raises(ReportError, match="no <!-- /moda-bench:headline:h100 --> after it"):
        replace_between("<!-- moda-bench:headline:h100 -->\nx\n", "h100", "y")


def test_readme_headline_tables(tmp_path):
    shutil.copytree(RESULTS / "h100" / "paper", tmp_path / "results" / "h100" / "paper")
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n<!-- moda-bench:headline:h100 -->\n<!-- /moda-bench:headline:h100 -->\n\n"
                      "<!-- moda-bench:headline:h200 -->\nkept\n<!-- /moda-bench:headline:h200 -->\ntail\n")
    warned = []
    assert update_readme(readme, tmp_path / "results", warned.append) == ["h100"]
    text = readme.read_text()
    assert text.startswith("# x\n\n<!-- moda-bench:headline:h100 -->\nNVIDIA H100 80GB HBM3 (commit `a98fe1b`")
    assert "[`results/h100/paper/`](results/h100/paper)" in text
    assert "| T | 16384 | 8 | 64 | 26.931 | 14.691 | 0.739 [0.723-0.756] | 1.098 [1.063-1.134] |" in text
    assert text.endswith("<!-- moda-bench:headline:h200 -->\nkept\n<!-- /moda-bench:headline:h200 -->\ntail\n")
    assert len(warned) == 1 and "'h200' left as it is" in warned[0]
    update_readme(readme, tmp_path / "results", warned.append)
    assert readme.read_text() == text and check_readme(readme, tmp_path / "results", warned.append) == []
    readme.write_text(text.replace("| 26.931 |", "| 26.000 |"))
    assert check_readme(readme, tmp_path / "results", warned.append) == [
        f"{readme.as_posix()}: headline table 'h100' is not what `moda-bench report` writes from "
        f"{(tmp_path / 'results').as_posix()}/h100/paper"]


def test_readme_headline_prefers_the_efficiency_run(tmp_path):
    """With paper-efficiency/ beside paper/, the headline is the dispatcher over FA4 with its route,
    the paper's like-for-like pair, and a mark where MoDA measured under FA4."""
    for run in ("paper", "paper-efficiency"):
        shutil.copytree(RESULTS / "h100" / run, tmp_path / "results" / "h100" / run)
    readme = tmp_path / "README.md"
    readme.write_text("<!-- moda-bench:headline:h100 -->\n<!-- /moda-bench:headline:h100 -->\n")
    assert update_readme(readme, tmp_path / "results", lambda message: None) == ["h100"]
    text = readme.read_text()
    assert "[`results/h100/paper-efficiency/`](results/h100/paper-efficiency)" in text
    head = next(line for line in text.splitlines() if line.startswith("| sweep"))
    assert "| moda / FA4 [95% CI] | route | moda-triton / FA2-Triton |" in head and "FA2-Triton / FA4" not in head
    row = next(line for line in text.splitlines() if line.startswith("| T | 4096 |"))
    assert "| fused | 1.245 |" in row
    assert "† `moda` measured under FA4" in text and " † | fused |" in text


@pytest.mark.slow
def test_readme_headline_tables_are_current():
    """README's headline blocks (where it has the markers) are what `moda-bench report` writes."""
    assert check_readme(REPO / "README.md", RESULTS, lambda message: None) == []
