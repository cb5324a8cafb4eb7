"""Issue 58, item 1: the paper's extra time (M - F) / M in one place (schema), and the report's
table of the paper's 13 efficiency rows beside one run per GPU (reports.paper_efficiency)."""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from moda_bench import schema
from moda_bench.reports.inputs import load_paper
from moda_bench.reports.paper_efficiency import paper_efficiency_markdown, paper_runs

ROOT = Path(__file__).resolve().parents[1]


def test_extra_time_is_the_papers_and_overhead_is_the_old_column():
    assert schema.extra_time_paper(10.750, 7.970) == pytest.approx(25.86, abs=5e-3)   # the paper's row 1
    assert schema.overhead_pct(10.750, 7.970) == pytest.approx(34.88, abs=5e-3)
    e = schema.extra_time_paper(3.0, 2.0)
    assert schema.overhead_pct(3.0, 2.0) == pytest.approx(100 * e / (100 - e))
    assert math.isnan(schema.extra_time_paper(float("nan"), 1.0)) and math.isnan(schema.extra_time_paper(1.0, 0))
    assert set(schema.EXTRA_TIME_PAPER) <= set(schema.MEASURE_COLUMNS) <= set(schema.COLUMNS)


def test_fill_extra_time_per_baseline():
    rows = [dict(provider="moda", status="ok", median_ms=4.0), dict(provider="fa2-triton", status="ok", median_ms=3.0),
            dict(provider="fa2", status="ok", median_ms=2.0), dict(provider="fa4", status="error", median_ms=1.0)]
    schema.fill_extra_time(rows)
    assert rows[0]["extra_time_paper_pct"] == pytest.approx(25.0)
    assert rows[0]["extra_time_paper_fa2_pct"] == pytest.approx(50.0)
    assert math.isnan(rows[0]["extra_time_paper_fa4_pct"])          # fa4's row did not succeed
    assert rows[1]["extra_time_paper_pct"] == 0.0 and rows[2]["extra_time_paper_pct"] < 0


def _rows(folder: str, gpu: str, stamp: str, providers: dict) -> list[dict]:
    out = []
    for T, G, L in [(4096, 8, 64), (16384, 2, 64)]:
        for prov, ms in providers.items():
            out.append(dict(provider=prov, **{"pass": "fwdbwd"}, timer="eager", T=T, G=G, Hq=8 * G, Hk=8, L=L, B=1,
                            d=64, C=64, dtype="bfloat16", depth_grad=1, Tq=0, S=0, status="ok",
                            median_ms=ms * T / 4096, gpu=gpu, timestamp=stamp, _file=f"{folder}/sweep_T.csv"))
    return out


def test_one_run_per_gpu_and_a_missing_baseline_said_plainly():
    paper = load_paper(ROOT / "results" / "reference", []).efficiency
    rows = pd.DataFrame(_rows("h100/old", "H100", "2026-11-01T00:00:00+00:00", {"moda": 4.0, "fa2-triton": 3.0})
                        + _rows("h100/new", "H100", "2026-12-01T00:00:00+00:00", {"moda": 2.0, "fa2": 1.0})
                        + _rows("h200/run", "H200", "2026-12-01T00:00:00+00:00",
                                {"moda": 4.0, "fa2-triton": 3.0, "fa4": 2.0}))
    runs = {r.gpu: r for r in paper_runs(rows, paper)}
    assert runs["H100"].folder == "h100/new" and runs["H100"].baseline_rows == 0   # the newest run, whole
    assert runs["H200"].folder == "h200/run" and runs["H200"].baseline_rows == 2
    assert [ln["row"] for ln in runs["H200"].lines] == list(range(1, 14))
    first = runs["H200"].lines[0]
    assert (first["paper_extra_pct"], first["m_ms"], first["f_ms"]) == (25.86, 4.0, 3.0)
    assert first["extra_pct"] == pytest.approx(25.0) and first["extra_fa4_pct"] == pytest.approx(50.0)
    assert math.isnan(runs["H200"].lines[1]["m_ms"])                 # T=8192 was not measured
    assert runs["H100"].lines[0]["extra_fa2_pct"] == pytest.approx(50.0)
    md = paper_efficiency_markdown(rows, paper)
    assert "**This run has no `fa2-triton` rows" in md and md.count("### The paper's efficiency table") == 2
    assert all(len(line.split("|")) - 2 <= 13 for line in md.splitlines() if line.startswith("|"))


def test_the_canonical_run_is_the_table_and_a_gates_rows_never_are():
    paper = load_paper(ROOT / "results" / "reference", []).efficiency
    gate = pd.DataFrame(_rows("h100/gate-baseline", "H100", "2026-12-09T00:00:00+00:00", {"moda": 9.0}))
    rows = pd.concat([pd.DataFrame(_rows("h100/paper-efficiency", "H100", "2026-11-01T00:00:00+00:00",
                                         {"moda": 4.0, "fa2-triton": 3.0})),
                      pd.DataFrame(_rows("h100/newer", "H100", "2026-12-01T00:00:00+00:00", {"moda": 2.0})),
                      gate.assign(sweep="gate")])
    run = paper_runs(rows, paper)[0]
    assert run.folder == "h100/paper-efficiency" and run.lines[0]["m_ms"] == 4.0   # canonical beats newer
    only_gate = paper_runs(gate.assign(sweep="gate"), paper)
    assert only_gate == []                                                          # re-measured rows: no table


def test_extra_time_figure_draws_the_papers_times_as_overhead():
    from moda_bench.reports.figures import extra_time_figure
    from moda_bench.reports.inputs import Paper
    paper = Paper(efficiency=load_paper(ROOT / "results" / "reference", []).efficiency)
    fig = extra_time_figure([], paper)
    line = next(ln for ln in fig.axes[0].get_lines() if ln.get_label() == "paper (A100)")
    assert list(line.get_xdata())[0] == 4096
    assert line.get_ydata()[0] == pytest.approx((10.750 / 7.970 - 1) * 100)   # not the printed 25.86
    assert "overhead" in fig.axes[0].get_ylabel()


def test_the_triton_kernel_alone_gets_the_papers_like_for_like_column():
    paper = load_paper(ROOT / "results" / "reference", []).efficiency
    rows = pd.DataFrame(_rows("h100/paper-efficiency", "H100", "2026-12-01T00:00:00+00:00",
                              {"moda": 4.0, "moda-triton": 5.0, "fa2-triton": 3.0}))
    run = paper_runs(rows, paper)[0]
    assert run.triton_rows == 2 and run.lines[0]["m_ms"] == 4.0          # the entry point is M
    assert run.lines[0]["extra_triton_pct"] == pytest.approx(40.0)       # (5 - 3) / 5
    md = paper_efficiency_markdown(rows, paper)
    assert "moda-triton extra % vs fa2-triton" in md
    without = paper_efficiency_markdown(rows[rows["provider"] != "moda-triton"], paper)
    assert "moda-triton extra %" not in without                           # no column when it was not timed


def test_moda_faster_than_fa4_is_flagged_as_noise():
    paper = load_paper(ROOT / "results" / "reference", []).efficiency
    rows = pd.DataFrame(_rows("h100/paper-efficiency", "H100", "2026-12-01T00:00:00+00:00",
                              {"moda": 2.0, "fa2-triton": 3.0, "fa4": 2.5}))
    md = paper_efficiency_markdown(rows, paper)
    assert "At row(s) 1, 6 `moda` measured faster than fa4" in md
    fine = paper_efficiency_markdown(rows.assign(median_ms=rows["median_ms"].where(rows["provider"] != "fa4", 1.0)),
                                     paper)
    assert "measured faster than fa4" not in fine
