"""`moda-bench report` from the small synthetic CSVs in tests/data/report (no GPU, no torch needed).

The sample data: a T sweep (fa2/moda/cudnn/flex, flex OOM at T=16384), a G sweep, an older run of
two T=4096 keys that must be superseded, an ablation ladder at the paper's config and a matmul
ceiling row (700 TFLOP/s). Paper numbers come from results/reference/.
"""
from __future__ import annotations

import csv
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from helpers import markdown_table
from typer.testing import CliRunner

from moda_bench import schema
from moda_bench.cli.report import report_command
from moda_bench.reports.report import ReportError, generate_report

REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data" / "report" / "results"
PAPER = REPO / "results" / "reference"
FIGURES = ["ablation", "extra_time", "ratio_to_best", "runtime", "tflops"]


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
    """Header and body cells of the markdown table after the heading line starting with `heading`;
    a section split into several tables (same lines, its configuration columns repeated in each)
    is joined back into one, up to the next heading."""
    lines = md.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith(heading))
    return markdown_table(lines[start + 1:])


def cell(header, body, first_col_value: str, column: str) -> str:
    row = next(r for r in body if r[0] == first_col_value)
    return row[header.index(column)]


def test_expected_files(report):
    _, out, written, _ = report
    expected = ([out / "REPORT.md", out / "figures" / "manifest.json"]
                + [out / "figures" / f"{n}.png" for n in FIGURES])
    assert written == sorted(expected)
    for p in expected:
        assert p.stat().st_size > 0
    assert (out / "figures" / "runtime.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(out.rglob("*.svg"))   # one figure format


def test_efficiency_table_cells(report):
    *_, md = report
    header, body = table_rows(md, "### Sweep over T")
    # the swept axis is the only shape column (G, Hq, Hk, L are constant: in the heading)
    assert header[:7] == ["T", "FA2 ms", "MoDA ms", "depth util.", "overhead %", "extra time %", "paper FA2 ms"]
    assert "G=8, Hq=64, Hk=8, L=64" in next(l for l in md.splitlines() if l.startswith("### Sweep over T"))
    for col in ("paper FA2 ms", "paper MoDA ms", "paper extra time %", "cudnn ms", "cudnn/FA2", "flex ms", "flex/FA2"):
        assert col in header
    assert [r[0] for r in body] == ["4096", "8192", "16384"]
    # newest run wins: 2.0 / 2.5 ms, not the superseded 8.888 / 9.999 of the older run
    assert cell(header, body, "4096", "FA2 ms") == "2.000"
    assert cell(header, body, "4096", "MoDA ms") == "2.500"
    assert cell(header, body, "4096", "overhead %") == "25.00"            # (2.5 - 2) / 2
    assert cell(header, body, "8192", "overhead %") == "10.00"            # (7.7 - 7) / 7
    assert cell(header, body, "16384", "overhead %") == "5.00"            # (28.35 - 27) / 27
    assert cell(header, body, "4096", "extra time %") == "20.00"          # the paper's (2.5 - 2) / 2.5
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
    assert [r[0] for r in body] == ["2", "8", "32"]
    g2 = body[0]
    assert g2[header.index("Hq")] == "16"
    assert g2[header.index("overhead %")] == "20.00"                      # (8.4 - 7) / 7
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
    assert cell(header, body, "10", "speedup vs previous") == "1.25x"  # rung 10 (ours) after 4: no rows between
    assert cell(header, body, "1", "paper ms (A100)") == "2128.900"
    assert cell(header, body, "2", "paper speedup vs previous") == "162.49x"   # 2128.9 / 13.102
    assert cell(header, body, "4", "ours / paper ms") == "0.856"               # 1.25 / 1.46
    assert cell(header, body, "10", "paper ms (A100)") == "-"


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
    def md(out):
        return (out / "REPORT.md").read_text()

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
    def keep(line):
        return ",".join(c for i, c in enumerate(line.split(",")) if i not in drop)

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


# ---------------------------------------------------------------------------------------------
# Newer CSVs: paired ratio intervals, ratio_to_best, samples/noise, fa4 + moda-fa4, eager and
# graph timers, GPU state and health. Written here from the schema, seeded random-ish values.
# ---------------------------------------------------------------------------------------------

SEQ_ONLY = ("fa2", "fa4", "cudnn")
NEW_PROVIDERS = ("moda", "moda-fa4", "fa2", "fa4", "cudnn")
# fwd+bwd ms at T=4096 relative to fa2, scaled by (T/4096)^2
SPEED = {"fa2": 1.0, "fa4": 0.55, "cudnn": 0.66, "moda": 1.02, "moda-fa4": 0.62}


def _point_rows(rng, sweep, T, G, timer, *, gpu, health, throttle_pool, ts):
    """Rows of one point: every provider, paired ratios with intervals against fa2 and the
    fastest sequence-only provider (fa4 by construction), GPU state, samples, noise."""
    Hk, L = 8, 64
    fa2_ms = round(2.0 * (T / 4096) ** 2 * (G / 8) * rng.uniform(0.97, 1.03), 4)
    # graph = device time; eager adds a host part that matters at small T
    if timer == "eager":
        fa2_ms = round(fa2_ms + 0.4 * 4096 / T, 4)
    ms = {p: round(fa2_ms * SPEED[p] * rng.uniform(0.98, 1.02), 4) if p != "fa2" else fa2_ms for p in NEW_PROVIDERS}
    best = min(SEQ_ONLY, key=lambda p: ms[p])
    rows = []
    for p in NEW_PROVIDERS:
        r_fa2 = round(ms[p] / ms["fa2"] * rng.uniform(0.998, 1.002), 4) if p != "fa2" else 1.0
        half = round(rng.uniform(0.004, 0.02), 4) if p != "fa2" else 0.0
        r_best = round(ms[p] / ms[best] * rng.uniform(0.998, 1.002), 4) if p != best else 1.0
        hb = round(rng.uniform(0.004, 0.02), 4) if p != best else 0.0
        throttle = rng.choice(throttle_pool)
        row = dict.fromkeys(schema.COLUMNS, "")
        row.update(sweep=sweep, provider=p, impl_detail="", T=T, G=G, Hq=G * Hk, Hk=Hk, L=L,
                   B=1, d=64, C=64, dtype="bfloat16", median_ms=ms[p], p20_ms=round(ms[p] * 0.99, 4),
                   p80_ms=round(ms[p] * 1.01, 4), tflops=100.0, extra_time_pct=round((r_fa2 - 1) * 100, 4),
                   ratio_to_fa2=r_fa2, ratio_to_fa2_lo=round(r_fa2 - half, 4), ratio_to_fa2_hi=round(r_fa2 + half, 4),
                   ratio_to_best=r_best, ratio_to_best_lo=round(r_best - hb, 4), ratio_to_best_hi=round(r_best + hb, 4),
                   best_provider=best, samples=rng.randint(10, 80), noise_pct=round(rng.uniform(0.2, 3.0), 3),
                   sm_clock_mhz=float(rng.choice([1950, 1965, 1980])), sm_clock_min_mhz=float(rng.choice([1755, 1830])),
                   mem_clock_mhz=3201.0, power_w=round(rng.uniform(420, 650), 1), temp_c=float(rng.randint(50, 75)),
                   throttle=throttle, timer=timer, health=health, status="ok", stop_reason="ci", gpu=gpu,
                   gpu_index=0, torch_version="2.11.0", triton_version="3.6.0", git_commit="newcommit0001",
                   timestamp=ts, **{"pass": "fwdbwd"})
        if p in ("moda", "moda-fa4"):
            row["depth_utilization"] = 0.5
        rows.append(row)
    return rows


def write_schema_csv(path, rows) -> None:
    """rows (dicts of schema columns) as a results CSV at path, header first."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=schema.COLUMNS)
        w.writeheader()
        w.writerows(rows)


def write_new_results(root: Path, seed: int = 7, sweeps=("T", "G"), gpu: str = "NVIDIA H200") -> dict:
    """root/run-a: T sweep (T=4096, 8192), eager and graph timers, healthy, sw_power_cap now and
    then; root/run-b: G sweep (G=4, 16), eager, health 'degraded' with hard throttling; all on
    `gpu`. Returns the rows written per folder."""
    rng = random.Random(seed)
    written = {}
    plan = {"run-a": [], "run-b": []}
    if "T" in sweeps:
        plan["run-a"] = [("T", T, 8, timer) for T in (4096, 8192) for timer in ("eager", "graph")]
    if "G" in sweeps:
        plan["run-b"] = [("G", 16384 // 4, G, "eager") for G in (4, 16)]
    for folder, points in plan.items():
        if not points:
            continue
        healthy = folder == "run-a"
        rows = []
        for sweep, T, G, timer in points:
            rows += _point_rows(rng, sweep, T, G, timer, gpu=gpu,
                                health="healthy" if healthy else "degraded: clocks throttled: hw_slowdown|hw_thermal",
                                throttle_pool=["", "", "sw_power_cap"] if healthy else ["hw_slowdown|hw_thermal", ""],
                                ts="2026-01-02T03:04:05+00:00" if healthy else "2026-01-03T03:04:05+00:00")
        (root / folder).mkdir(parents=True, exist_ok=True)
        write_schema_csv(root / folder / f"sweep_{points[0][0]}.csv", rows)
        written[folder] = rows
    return written


@pytest.fixture(scope="module")
def new_report(tmp_path_factory):
    root = tmp_path_factory.mktemp("newrep")
    rows = write_new_results(root / "results")
    out = root / "out"
    written = generate_report([root / "results"], out)
    return root, rows, out, written, (out / "REPORT.md").read_text()


def _row(rows, provider, timer="eager", **cfg):
    return next(r for r in rows if r["provider"] == provider and r["timer"] == timer
                and all(r[k] == v for k, v in cfg.items()))


def test_new_columns_in_efficiency_table(new_report):
    _, rows, _, _, md = new_report
    a = rows["run-a"]
    header, body = table_rows(md, "### Sweep over T (fwd+bwd, eager timer")
    for col in ("MoDA/FA2 [95% CI]", "MoDA/fastest", "moda-fa4 ms", "moda-fa4/FA2", "moda-fa4/fastest",
                "fa4 ms", "fa4/FA2", "cudnn ms", "cudnn/FA2", "samples", "noise %"):
        assert col in header, (col, header)
    assert "fa4/fastest" not in header and "paper FA2 ms" not in header   # sequence-only; no paper data here
    # moda-fa4 and fa4 lead the other providers, before cudnn and flex
    assert header.index("moda-fa4 ms") < header.index("fa4 ms") < header.index("cudnn ms") < header.index("flex ms")
    assert [r[0] for r in body] == ["4096", "8192"]
    for T in (4096, 8192):
        moda, mf4, fa4, fa2 = (_row(a, p, T=T) for p in ("moda", "moda-fa4", "fa4", "fa2"))
        line = str(T)
        assert cell(header, body, line, "MoDA/FA2 [95% CI]") == \
            f"{moda['ratio_to_fa2']:.3f} [{moda['ratio_to_fa2_lo']:.3f}-{moda['ratio_to_fa2_hi']:.3f}]"
        assert cell(header, body, line, "MoDA/fastest") == f"{moda['ratio_to_best']:.2f} ({moda['best_provider']})"
        assert moda["best_provider"] == "fa4"
        assert cell(header, body, line, "moda-fa4/fastest") == f"{mf4['ratio_to_best']:.2f} (fa4)"
        assert cell(header, body, line, "fa4/FA2") == \
            f"{fa4['ratio_to_fa2']:.3f}x [{fa4['ratio_to_fa2_lo']:.3f}-{fa4['ratio_to_fa2_hi']:.3f}]"
        assert cell(header, body, line, "fa4 ms") == f"{fa4['median_ms']:.3f}"
        assert cell(header, body, line, "overhead %") == \
            f"{(moda['median_ms'] - fa2['median_ms']) / fa2['median_ms'] * 100:.2f}"   # still from the medians
        assert cell(header, body, line, "extra time %") == \
            f"{(moda['median_ms'] - fa2['median_ms']) / moda['median_ms'] * 100:.2f}"  # the paper's definition
        point = [r for r in a if r["T"] == T and r["timer"] == "eager"]
        assert cell(header, body, line, "samples") == str(min(r["samples"] for r in point))
        assert cell(header, body, line, "noise %") == f"{max(r['noise_pct'] for r in point):.1f}"
        assert cell(header, body, line, "flex ms") == "-"
    # the graph timer has its own table, with its own numbers
    header_g, body_g = table_rows(md, "### Sweep over T (fwd+bwd, graph timer")
    moda_g = _row(a, "moda", "graph", T=4096)
    assert cell(header_g, body_g, "4096", "MoDA ms") == f"{moda_g['median_ms']:.3f}"
    assert cell(header_g, body_g, "4096", "MoDA/FA2 [95% CI]").startswith(f"{moda_g['ratio_to_fa2']:.3f} [")
    assert "Each timer has its own tables" in md and "MoDA/FA2 [95% CI] is the paired ratio" in md
    assert "MoDA/fastest` (`moda-fa4/fastest`) is the time over the fastest" in md
    # numeric cells with an interval stay right-aligned
    lines = md.splitlines()
    i = next(k for k, l in enumerate(lines) if l.startswith("| T |") and "MoDA/FA2 [95% CI]" in l)
    part = [c.strip() for c in lines[i].strip()[1:-1].split("|")]
    assert lines[i + 1].split("|")[part.index("MoDA/FA2 [95% CI]") + 1] == "---:"
    # split by question: no table wider than 12 columns
    assert all(len(l.split("|")) - 2 <= 12 for l in lines if l.startswith("| T |"))


def test_eager_vs_graph_table(new_report):
    _, rows, _, _, md = new_report
    a = rows["run-a"]
    assert "## Eager vs graph timer" in md
    header, body = table_rows(md, "### fwd+bwd")
    assert header == ["sweep", "T", "G", "Hq", "Hk", "L", "provider", "eager ms", "graph ms", "host share"]
    assert len(body) == 2 * len(NEW_PROVIDERS)                 # both T values, every provider; G sweep has no graph
    assert [r[6] for r in body[:5]] == ["moda", "moda-fa4", "fa2", "fa4", "cudnn"]
    for r in body:
        e = _row(a, r[6], "eager", T=int(r[1]))
        g = _row(a, r[6], "graph", T=int(r[1]))
        assert r[7] == f"{e['median_ms']:.3f}" and r[8] == f"{g['median_ms']:.3f}"
        assert r[9] == f"{100 * (1 - g['median_ms'] / e['median_ms']):.1f}%"
    # the host share of fa2 falls with T (the fixed host part matters less)
    share = {int(r[1]): float(r[9].rstrip("%")) for r in body if r[6] == "fa2"}
    assert share[4096] > share[8192] > 0


def test_gpu_state_note_and_health_warning(new_report):
    _, rows, _, _, md = new_report
    header, body = table_rows(md, "## GPU state")
    assert header[:3] == ["results folder", "GPU", "rows"]
    by = {r[0]: r for r in body}
    assert set(by) == {"results/run-a", "results/run-b"}
    a, b = rows["run-a"], rows["run-b"]
    ra = by["results/run-a"]
    assert ra[header.index("rows")] == str(len(a))
    assert ra[header.index("SM clock MHz (median)")] == f"{statistics.median(r['sm_clock_mhz'] for r in a):.0f}"
    assert ra[header.index("SM clock MHz (min)")] == f"{min(r['sm_clock_min_mhz'] for r in a):.0f}"
    assert ra[header.index("power W (median)")] == f"{statistics.median(r['power_w'] for r in a):.0f}"
    assert ra[header.index("temp C (max)")] == f"{max(r['temp_c'] for r in a):.0f}"
    n_cap = sum(r["throttle"] == "sw_power_cap" for r in a)
    assert ra[header.index("throttle reasons seen (rows)")] == (f"sw_power_cap ({n_cap})" if n_cap else "none")
    assert ra[header.index("health (rows)")] == f"healthy ({len(a)})"
    rb = by["results/run-b"]
    n_hard = sum(r["throttle"] != "" for r in b)
    assert rb[header.index("throttle reasons seen (rows)")] == f"hw_slowdown ({n_hard}), hw_thermal ({n_hard})"
    # the '|' of the health text is escaped inside the table, and the value is bold
    assert rb[header.index("health (rows)")] == f"**degraded: clocks throttled: hw_slowdown\\|hw_thermal ({len(b)})**"
    assert (f"**WARNING: `results/run-b`: {len(b)} of {len(b)} row(s) were measured while the GPU health check said "
            "`degraded: clocks throttled: hw_slowdown|hw_thermal`") in md
    assert f"**WARNING: `results/run-b`: hard throttling seen (hw_slowdown on {n_hard} row(s)" in md
    assert f"**WARNING: {len(b)} row(s) shown were measured while the GPU health check said something" in md
    assert "WARNING: `results/run-a`" not in md
    assert md.index("## GPU state") < md.index("## Efficiency")


def test_new_figures_and_determinism(new_report, tmp_path):
    root, _, out, written, _ = new_report
    names = sorted({p.stem for p in written if p.suffix == ".png"})
    assert names == ["extra_time", "ratio_to_best", "runtime", "tflops"]
    assert "![ratio_to_best](figures/ratio_to_best.png)" in (out / "REPORT.md").read_text()
    from moda_bench.reports.figures import ratio_to_best_figure
    from moda_bench.reports.inputs import load_results
    fig = ratio_to_best_figure(load_results([root / "results"], warn=lambda m: None).rows)
    assert [ax.get_title() for ax in fig.axes] == ["vs T (fastest: fa4)", "vs G (fastest: fa4)"]
    moda = _row(new_report[1]["run-a"], "moda", T=4096)
    bars = fig.axes[0].containers[0]                          # moda [eager]: ratio_to_best with its interval
    assert bars.lines[0].get_ydata()[0] == pytest.approx(moda["ratio_to_best"])
    seg = bars.lines[2][0].get_segments()[0]
    assert [y for _, y in seg] == pytest.approx([moda["ratio_to_best_lo"], moda["ratio_to_best_hi"]])
    again, fresh = tmp_path / "again", tmp_path / "fresh"
    generate_report([root / "results"], again)
    code = ("from pathlib import Path; from moda_bench.reports.report import generate_report; "
            f"generate_report([Path({str(root / 'results')!r})], Path({str(fresh)!r}))")
    env = {**os.environ, "PYTHONHASHSEED": "4242", "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=tmp_path)
    for p in written:
        rel = p.relative_to(out)
        assert (again / rel).read_bytes() == p.read_bytes(), rel
        assert (fresh / rel).read_bytes() == p.read_bytes(), rel
    # the same rows written again with another seed give other numbers (the test data is not constant)
    other = write_new_results(tmp_path / "other", seed=8)
    assert other["run-a"][0]["median_ms"] != new_report[1]["run-a"][0]["median_ms"]


def test_extra_time_figure_has_interval_error_bars(new_report):
    """The extra-time figure's MoDA series carry the paired interval (error bars), moda-fa4 too."""
    from moda_bench.reports.figures import extra_time_figure
    from moda_bench.reports.inputs import Paper, load_results
    from moda_bench.reports.tables import efficiency_sections
    root = new_report[0]
    rows = load_results([root / "results"], warn=lambda m: None).rows
    fig = extra_time_figure(efficiency_sections(rows, Paper(), "fa2", "moda"), Paper())
    ax = fig.axes[0]
    labels = ax.get_legend_handles_labels()[1]
    assert labels == ["ours [eager]", "moda-fa4 [eager]", "ours [graph]", "moda-fa4 [graph]"]
    assert len(ax.containers) == 4                           # one errorbar container per series
    moda = _row(new_report[1]["run-a"], "moda", T=4096)
    line = ax.containers[0].lines[0]
    assert line.get_ydata()[0] == pytest.approx((moda["ratio_to_fa2"] - 1) * 100)


def test_plot_sweep_with_new_columns(new_report, tmp_path):
    from moda_bench.reports.figures import plot_sweep
    csv_path = new_report[0] / "results" / "run-a" / "sweep_T.csv"
    out = plot_sweep(csv_path, tmp_path / "fig.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


NEW_HEADERS = ("MoDA/FA2 [95% CI]", "MoDA/fastest", "/fastest", "samples", "noise %", "host share",
               "eager timer", "graph timer", "## GPU state", "## Eager vs graph", "ratio_to_best", "WARNING",
               "### Clocks per provider", "host us", "host CPUs")



def test_clocks_per_provider(tmp_path):
    """Rows with their own GPU state (own_sm_clock_mhz, own_power_w) get a 'Clocks per provider'
    table: per GPU and provider, the rows, the median own clock, the median of own minus the
    point's clock, the median own power. Rows without the columns (older files) are left out, and
    a report without any such row has no table (test_old_csvs_get_no_new_columns, new_report)."""
    rows = write_new_results(tmp_path / "results", sweeps=("T",))["run-a"]
    own = {"moda-fa4": -120.0, "fa4": 15.0}
    for r in rows:
        if r["provider"] in own:
            r["own_sm_clock_mhz"] = r["sm_clock_mhz"] + own[r["provider"]]
            r["own_power_w"] = 690.0 if r["provider"] == "moda-fa4" else 640.0
    write_schema_csv(tmp_path / "results" / "run-a" / "sweep_T.csv", rows)
    generate_report([tmp_path / "results"], tmp_path / "out", figures=False)
    md = (tmp_path / "out" / "REPORT.md").read_text()
    header, body = table_rows(md, "### Clocks per provider")
    assert header == ["GPU", "provider", "rows", "own SM clock MHz", "own - point MHz", "own power W"]
    by = {r[1]: r for r in body}
    assert set(by) == {"moda-fa4", "fa4"}                      # the other providers have no own state
    mf4 = [r for r in rows if r["provider"] == "moda-fa4"]
    assert by["moda-fa4"][2] == str(len(mf4)) and by["moda-fa4"][4] == "-120" and by["fa4"][4] == "+15"
    assert by["moda-fa4"][3] == f"{statistics.median(r['own_sm_clock_mhz'] for r in mf4):.0f}"
    assert by["moda-fa4"][5] == "690" and by["moda-fa4"][0] == "NVIDIA H200"
    assert md.index("## GPU state") < md.index("### Clocks per provider") < md.index("## Efficiency")


def test_old_csvs_get_no_new_columns(report):
    """The committed-style CSVs (tests/data, no new columns): none of the new headers, blocks or
    figures, and every table column that is all '-' is one the report always had (flex, G sweep)."""
    *_, md = report
    for text in NEW_HEADERS:
        if "/fastest" not in text and text != "ratio_to_best":   # the fastest attention is the report's own,
            # from any run's medians (its table column and figure exist for old files too)
            assert text not in md, text
    for heading in ("### Sweep over T", "### Sweep over G"):
        header, body = table_rows(md, heading)
        empty = [h for i, h in enumerate(header) if all(r[i] == "-" for r in body)]
        assert set(empty) <= {"flex ms", "flex/FA2"}, (heading, empty)


def test_mixed_old_and_new_csvs(tmp_path):
    """Old and new files of one GPU in one report: the new columns appear only in the sections with
    the data (the old rows' cells of those columns are empty)."""
    res = tmp_path / "results"
    shutil.copytree(DATA, res)
    write_new_results(res / "new", sweeps=("G",), gpu="NVIDIA H100 80GB HBM3")
    generate_report([res], tmp_path / "out", paper_dir=PAPER, figures=False)
    md = (tmp_path / "out" / "REPORT.md").read_text()
    header, _ = table_rows(md, "### Sweep over T")
    assert "MoDA/FA2 [95% CI]" not in header and "samples" not in header and "fa4 ms" not in header
    header, body = table_rows(md, "### Sweep over G")
    assert "MoDA/FA2 [95% CI]" in header and "noise %" in header and "moda-fa4/fastest" in header
    old_g2 = next(r for r in body if r[1] == "2")              # an old G point: its new cells show '-'
    assert old_g2[header.index("MoDA/FA2 [95% CI]")] == "1.200"   # ratio of medians, no interval
    assert old_g2[header.index("samples")] == "-"
    header, body = table_rows(md, "## GPU state")
    assert [r[0] for r in body] == ["results/new/run-b"]       # old folders have no GPU state


def test_ablation_ladder_keeps_custom_timed_rung_and_splits_graph(tmp_path):
    """The naive rung is timed its own way (timer 'custom'): it stays in the eager ladder; graph
    rows of the ladder get a ladder of their own, each titled with its timer."""
    rng = random.Random(11)
    rows = []
    for timer in ("eager", "graph"):
        for rung in ("naive-torch", "flash-compatible", "chunk-aware", "ours"):
            if timer == "graph" and rung == "naive-torch":
                continue
            row = dict.fromkeys(schema.COLUMNS, "")
            row.update(sweep="ablation", provider=rung, T=1024, G=8, Hq=64, Hk=8, L=64, B=1, d=64, C=64,
                       dtype="bfloat16", median_ms=round(rng.uniform(1, 20), 3), status="ok",
                       timer="custom" if rung == "naive-torch" else timer, gpu="NVIDIA H200", torch_version="2.11.0",
                       triton_version="3.6.0", git_commit="abc", timestamp="2026-01-01T00:00:00+00:00",
                       **{"pass": "fwdbwd"})
            rows.append(row)
    (tmp_path / "res").mkdir()
    write_schema_csv(tmp_path / "res" / "ablation.csv", rows)
    generate_report([tmp_path / "res"], tmp_path / "out", figures=False)
    md = (tmp_path / "out" / "REPORT.md").read_text()
    header, body = table_rows(md, "### T=1024, G=8, Hq=64, Hk=8, L=64, B=1, d=64, C=64, dtype=bfloat16, fwd+bwd, "
                                  "eager timer")
    assert [r[1] for r in body] == ["naive-torch", "flash-compatible", "chunk-aware", "ours"]
    naive = next(r for r in rows if r["provider"] == "naive-torch")
    assert cell(header, body, "1", "ms") == f"{naive['median_ms']:.3f}"
    header, body = table_rows(md, "### T=1024, G=8, Hq=64, Hk=8, L=64, B=1, d=64, C=64, dtype=bfloat16, fwd+bwd, "
                                  "graph timer")
    assert [r[1] for r in body] == ["flash-compatible", "chunk-aware", "ours"]
    graph_ours = next(r for r in rows if r["provider"] == "ours" and r["timer"] == "graph")
    assert cell(header, body, "10", "ms") == f"{graph_ours['median_ms']:.3f}"
    # without graph rows the ladder is one table titled as before (no timer named)
    write_schema_csv(tmp_path / "res" / "ablation.csv", [r for r in rows if r["timer"] != "graph"])
    generate_report([tmp_path / "res"], tmp_path / "out2", figures=False)
    md = (tmp_path / "out2" / "REPORT.md").read_text()
    header, body = table_rows(md, "### T=1024, G=8, Hq=64, Hk=8, L=64, B=1, d=64, C=64, dtype=bfloat16, fwd+bwd")
    assert [r[1] for r in body] == ["naive-torch", "flash-compatible", "chunk-aware", "ours"]
    assert "timer" not in md.split("## Kernel ablation")[1].split("## Ceiling")[0]
