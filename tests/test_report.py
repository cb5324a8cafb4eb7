"""`moda-bench report` from the small synthetic CSVs in tests/data/report (no GPU, no torch needed).

The sample data: a T sweep (fa2/moda/cudnn/flex, flex OOM at T=16384), a G sweep, an older run of
two T=4096 keys that must be superseded, an ablation ladder at the paper's config and a matmul
ceiling row (700 TFLOP/s). Paper numbers come from results/reference/.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from moda_bench.cli.report import report_command
from moda_bench.reports.report import ReportError, generate_report

REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data" / "report" / "results"
PAPER = REPO / "results" / "reference"
FIGURES = ["ablation", "extra_time", "runtime", "tflops"]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """Results copied to a tmp dir with the paper tables in <dir>/reference (default discovery)."""
    root = tmp_path_factory.mktemp("rep")
    results = root / "results"
    shutil.copytree(DATA, results)
    shutil.copytree(PAPER, results / "reference")
    out = root / "out"
    written = generate_report([results], out)
    return results, out, written, (out / "REPORT.md").read_text()


def table_rows(md: str, heading: str) -> tuple[list[str], list[list[str]]]:
    """Header and body cells of the first markdown table after the heading line starting with `heading`."""
    lines = md.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith(heading))
    tab = []
    for l in lines[start + 1:]:
        if l.startswith("|"):
            tab.append([c.strip() for c in l.strip("|").split("|")])
        elif tab:
            break
    return tab[0], tab[2:]


def cell(header, body, first_col_value: str, column: str) -> str:
    row = next(r for r in body if r[0] == first_col_value)
    return row[header.index(column)]


def test_expected_files(report):
    _, out, written, _ = report
    expected = [out / "REPORT.md"] + [out / "figures" / f"{n}.{ext}" for n in FIGURES for ext in ("png", "svg")]
    assert written == sorted(expected)
    for p in expected:
        assert p.stat().st_size > 0
    assert (out / "figures" / "runtime.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = (out / "figures" / "runtime.svg").read_text()
    assert "<svg" in svg and "<dc:date>" not in svg and "Matplotlib v" not in svg


def test_efficiency_table_cells(report):
    *_, md = report
    header, body = table_rows(md, "### Sweep over T")
    assert header[:9] == ["T", "G", "Hq", "Hk", "L", "FA2 ms", "MoDA ms", "depth util.", "extra time %"]
    for col in ("paper FA2 ms", "paper MoDA ms", "paper extra time %", "cudnn ms", "cudnn/FA2", "flex ms", "flex/FA2"):
        assert col in header
    assert [r[0] for r in body] == ["4096", "8192", "16384"]
    # newest run wins: 2.0 / 2.5 ms, not the superseded 8.888 / 9.999 of the older run
    assert cell(header, body, "4096", "FA2 ms") == "2.000"
    assert cell(header, body, "4096", "MoDA ms") == "2.500"
    assert cell(header, body, "4096", "extra time %") == "25.00"          # (2.5 - 2) / 2
    assert cell(header, body, "8192", "extra time %") == "10.00"          # (7.7 - 7) / 7
    assert cell(header, body, "16384", "extra time %") == "5.00"          # (28.35 - 27) / 27
    assert cell(header, body, "4096", "depth util.") == "0.1250"
    assert cell(header, body, "4096", "cudnn/FA2") == "0.75x"
    assert cell(header, body, "4096", "flex/FA2") == "1.50x"
    assert cell(header, body, "16384", "flex ms") == "oom"                 # failed rows show their status
    assert cell(header, body, "16384", "flex/FA2") == "-"
    # paper A100 columns matched on the config (paper rows 1 and 3)
    assert cell(header, body, "4096", "paper FA2 ms") == "7.970"
    assert cell(header, body, "4096", "paper extra time %") == "25.86"
    assert cell(header, body, "16384", "paper MoDA ms") == "127.661"
    assert cell(header, body, "8192", "paper extra time %") == "18.99"

    header, body = table_rows(md, "### Sweep over G")
    assert [r[1] for r in body] == ["2", "8", "32"]
    g2 = body[0]
    assert g2[header.index("Hq")] == "16"
    assert g2[header.index("extra time %")] == "20.00"                    # (8.4 - 7) / 7
    assert g2[header.index("paper extra time %")] == "27.07"
    assert g2[header.index("flex ms")] == "-"                              # never measured
    assert "### Sweep 'ceiling'" not in md                                 # matmul rows are not a table


def test_ablation_table(report):
    *_, md = report
    header, body = table_rows(md, "### T=1024, G=8")
    assert [r[1] for r in body] == ["naive-torch", "flash-compatible", "chunk-aware", "group-aware", "ours"]
    assert cell(header, body, "1", "ms") == "1000.000"
    assert cell(header, body, "2", "speedup vs previous") == "100.00x"
    assert cell(header, body, "4", "speedup vs previous") == "4.00x"
    assert cell(header, body, "6", "speedup vs previous") == "1.25x"  # rung 6 (ours) after 4: no batched-tiles row
    assert cell(header, body, "1", "paper ms (A100)") == "2128.900"
    assert cell(header, body, "2", "paper speedup vs previous") == "162.49x"   # 2128.9 / 13.102
    assert cell(header, body, "4", "ours / paper ms") == "0.856"               # 1.25 / 1.46
    assert cell(header, body, "6", "paper ms (A100)") == "-"


def test_provenance_and_ceiling(report):
    *_, md = report
    header, body = table_rows(md, "## Provenance")
    by_ts = {r[0]: r for r in body}
    old = by_ts["2025-05-01T08:00:00+00:00"]
    assert old[header.index("commit")] == "0000oldcommit"
    assert old[header.index("rows used")] == "0" and old[header.index("rows superseded")] == "2"
    new = by_ts["2025-06-01T12:00:00+00:00"]
    assert new[header.index("GPU")] == "NVIDIA H100 80GB HBM3"
    assert new[header.index("torch")] == "2.11.0" and new[header.index("triton")] == "3.6.0"
    assert "2 older row(s) were superseded" in md
    assert "results/old/sweep_T_old.csv @ 2025-05-01T08:00:00+00:00: 2 row(s)" in md
    assert "ceiling of 700.0 TFLOP/s (measured: matmul row" in md
    assert "![runtime](figures/runtime.png)" in md


def test_ceiling_override_and_default(tmp_path):
    md = lambda out: (out / "REPORT.md").read_text()
    generate_report([DATA], tmp_path / "a", paper_dir=PAPER, ceiling_tflops=900, figures=False)
    assert "ceiling of 900.0 TFLOP/s (--ceiling-tflops)" in md(tmp_path / "a")
    generate_report([DATA / "sweeps"], tmp_path / "b", figures=False)   # no matmul row, no paper data
    text = md(tmp_path / "b")
    assert "ceiling of 784.0 TFLOP/s (spec section 5 default" in text
    assert "paper FA2 ms" not in text and "Paper reference data not found" in text


def test_deterministic_bytes(report, tmp_path):
    """Same inputs -> identical bytes: in-process, and in a fresh interpreter with another hash seed
    (which must not import torch or triton)."""
    results, out, written, _ = report
    out2 = tmp_path / "again"
    generate_report([results], out2)
    out3 = tmp_path / "fresh"
    code = ("import sys; from pathlib import Path; from moda_bench.reports.report import generate_report; "
            f"generate_report([Path({str(results)!r})], Path({str(out3)!r})); "
            "bad = [m for m in ('torch', 'triton') if m in sys.modules]; assert not bad, bad")
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=tmp_path)
    for p in written:
        rel = p.relative_to(out)
        assert (out2 / rel).read_bytes() == p.read_bytes(), rel
        assert (out3 / rel).read_bytes() == p.read_bytes(), rel


def _cli(args: list[str]):
    app = typer.Typer()
    app.command()(report_command)
    return CliRunner().invoke(app, args)


def test_cli_writes_report(tmp_path):
    res = _cli([str(DATA), "--out", str(tmp_path / "o"), "--paper-dir", str(PAPER), "--no-figures"])
    assert res.exit_code == 0, res.output
    text = (tmp_path / "o" / "REPORT.md").read_text()
    assert "paper extra time %" in text and not (tmp_path / "o" / "figures").exists()
    res = _cli([str(DATA), "--out", str(tmp_path / "o"), "--fa2-provider", "nope", "--no-figures"])
    assert res.exit_code == 2 and "FA2 provider 'nope' not in the results" in res.output, res.output


def _warnings(output: str) -> list[str]:
    return [l for l in output.splitlines() if l.startswith("warning:")]


def test_non_results_csv_is_skipped_with_a_warning(tmp_path):
    """A CSV lacking schema columns (e.g. a wall-time table) is skipped with one line naming it."""
    res_dir = tmp_path / "res" / "sub"
    res_dir.mkdir(parents=True)
    shutil.copy(DATA / "sweeps" / "sweep_G.csv", res_dir / "sweep_G.csv")
    src = (DATA / "sweeps" / "sweep_G.csv").read_text().splitlines()
    header = src[0].split(",")
    drop = [header.index("median_ms"), header.index("pass")]
    keep = lambda line: ",".join(c for i, c in enumerate(line.split(",")) if i not in drop)
    (res_dir / "broken.csv").write_text("\n".join(keep(l) for l in src) + "\n")
    (res_dir / "wall_time.csv").write_text("run_dir,gpus,command,wall_s\nx,1,sweep,2.5\n")
    seen = []
    generate_report([tmp_path / "res"], tmp_path / "out", figures=False, warn=seen.append)
    assert len(seen) == 2 and "res/sub/broken.csv" in seen[0] and "pass, median_ms" in seen[0], seen
    assert "res/sub/wall_time.csv" in seen[1], seen
    text = (tmp_path / "out" / "REPORT.md").read_text()
    assert "Input files: `res/sub/sweep_G.csv`." in text and "from 1 CSV file(s)" in text
    res = _cli([str(tmp_path / "res"), "--out", str(tmp_path / "o2"), "--no-figures"])
    assert res.exit_code == 0, res.output
    warned = _warnings(res.output)
    assert len(warned) == 2 and "broken.csv" in warned[0] and "wall_time.csv" in warned[1], res.output
    assert "Traceback" not in res.output
    # nothing readable left: one error line
    (res_dir / "sweep_G.csv").unlink()
    res = _cli([str(tmp_path / "res"), "--out", str(tmp_path / "o3")])
    assert res.exit_code == 2 and "Traceback" not in res.output
    errors = [l for l in res.output.splitlines() if l.startswith("error:")]
    assert len(errors) == 1 and "no measurement rows" in errors[0], res.output


def test_malformed_rows_are_skipped_with_a_warning(tmp_path):
    """A row with the wrong field count and a last row cut mid-line: skipped, each named with its line."""
    lines = (DATA / "sweeps" / "sweep_G.csv").read_text().splitlines()
    n = len(lines)
    assert n >= 5
    lines[2] = lines[2] + ",surplus"                                   # line 3
    (tmp_path / "res").mkdir()
    (tmp_path / "res" / "cut.csv").write_text("\n".join(lines)[:-7])   # line n loses its end and newline
    res = _cli([str(tmp_path / "res"), "--out", str(tmp_path / "out"), "--no-figures"])
    assert res.exit_code == 0, res.output
    warned = _warnings(res.output)
    assert len(warned) == 2, res.output
    assert "res/cut.csv: line 3 skipped" in warned[0] and "fields" in warned[0]
    assert f"res/cut.csv: line {n} skipped: cut off" in warned[1]
    text = (tmp_path / "out" / "REPORT.md").read_text()
    assert f"{n - 1 - 2} measurement row(s) shown" in text


def test_non_numeric_value_is_reported(tmp_path):
    src = (DATA / "sweeps" / "sweep_G.csv").read_text().replace(",7.0,", ",seven,", 1)
    (tmp_path / "x.csv").write_text(src)
    with pytest.raises(ReportError, match=r"x\.csv: line 2: non-numeric value 'seven' in column median_ms"):
        generate_report([tmp_path], tmp_path / "out")
    res = _cli([str(tmp_path), "--out", str(tmp_path / "out")])
    lines = [l for l in res.output.splitlines() if l.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and "x.csv: line 2" in lines[0], res.output


def test_empty_and_missing_dirs(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    res = _cli([str(empty), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and re.search(r"no CSV files under .*empty", res.output), res.output
    res = _cli([str(tmp_path / "nope"), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "results directory not found" in res.output, res.output
    (empty / "header_only.csv").write_text((DATA / "sweeps" / "sweep_G.csv").read_text().splitlines()[0] + "\n")
    with pytest.raises(ReportError, match="no measurement rows"):
        generate_report([empty], tmp_path / "o")
    assert not (tmp_path / "o").exists()
