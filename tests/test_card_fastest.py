"""Issue 58, item 8 and the FP16 / d=128 rows: one fastest attention per GPU and point across every
run the report reads (reports.fastest), ratios from different runs marked, efficiency tables split
to at most 12 columns, dtype and d kept apart in the table keys."""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from moda_bench import schema
from moda_bench.reports.fastest import CROSS_MARK, fastest_table, with_fastest
from moda_bench.reports.inputs import Paper, load_paper
from moda_bench.reports.markdown import efficiency_markdown
from moda_bench.reports.tables import efficiency_sections

ROOT = Path(__file__).resolve().parents[1]


def row(provider, ms, run, *, T=4096, G=8, L=64, d=64, dtype="bfloat16", best="", r_best=math.nan, gpu="H100"):
    r = dict.fromkeys(schema.COLUMNS, math.nan)
    r.update(sweep="T", provider=provider, T=T, G=G, Hq=8 * G, Hk=8, L=L, B=1, d=d, C=64, dtype=dtype, depth_grad=1,
             Tq=0, S=0, median_ms=ms, status="ok", timer="eager", best_provider=best, ratio_to_best=r_best,
             ratio_to_best_lo=r_best - 0.01, ratio_to_best_hi=r_best + 0.01, gpu=gpu, reason="", impl_detail="",
             config="", stop_reason="", throttle="", health="", host_cpus="", torch_version="t", triton_version="t",
             git_commit="c", timestamp="2026-12-01T00:00:00+00:00", _file=f"{run}/sweep_T.csv", _line=1,
             **{"pass": "fwdbwd"})
    return r


def frame():
    return pd.DataFrame([
        row("moda", 3.0, "h100/a", best="fa2", r_best=1.5), row("fa2", 2.0, "h100/a", best="fa2", r_best=1.0),
        row("fa4", 1.2, "h100/b", best="fa4", r_best=1.0), row("moda-fa4", 1.5, "h100/b", best="fa4", r_best=1.26),
        row("moda-fused", 0.9, "h100/b", best="fa4", r_best=0.75),          # a MoDA variant: never "the fastest"
        row("fa4", 0.5, "h200/c", gpu="H200"), row("moda", 1.0, "h200/c", gpu="H200", best="fa4", r_best=2.0)])


def test_one_fastest_per_gpu_and_point_across_runs():
    table = fastest_table(frame())
    assert sorted(zip(table["_gpu"], table["fastest"], table["fastest_run"])) == [("H100", "fa4", "h100/b"),
                                                                                  ("H200", "fa4", "h200/c")]
    out = with_fastest(frame()).set_index(["gpu", "provider"])
    moda = out.loc[("H100", "moda")]
    assert (moda["best_provider"], moda["best_run"], bool(moda["best_cross"])) == ("fa4", "h100/b", True)
    assert moda["ratio_to_best"] == pytest.approx(3.0 / 1.2) and math.isnan(moda["ratio_to_best_lo"])
    paired = out.loc[("H100", "moda-fa4")]                       # same run, same best: the CSV's paired ratio kept
    assert paired["ratio_to_best"] == 1.26 and paired["ratio_to_best_lo"] == pytest.approx(1.25)
    assert not paired["best_cross"]
    assert out.loc[("H200", "moda")]["ratio_to_best"] == 2.0    # each GPU its own fastest


def test_efficiency_tables_mark_cross_run_ratios_and_stay_narrow():
    sec, = efficiency_sections(frame()[frame()["gpu"] == "H100"], Paper(), "fa2", "moda")
    md = efficiency_markdown(sec, "fa2", "moda")
    assert f"2.50 (fa4){CROSS_MARK}" in md and "`h100/b`" in md and "not paired" in md
    assert "1.26 (fa4)" in md and f"1.26 (fa4){CROSS_MARK}" not in md
    assert "**MoDA against FA2**" in md and "**Against the fastest attention**" in md
    assert all(len(line.split("|")) - 2 <= 12 for line in md.splitlines() if line.startswith("|"))


def test_fp16_and_d128_rows_are_lines_of_their_own():
    rows = pd.DataFrame([row(p, ms * k, "h100/a", d=d, dtype=dt)
                         for d, dt, k in ((64, "bfloat16", 1.0), (64, "float16", 1.1), (128, "bfloat16", 2.0))
                         for p, ms in (("moda", 3.0), ("fa2", 2.0))])
    paper = load_paper(ROOT / "results" / "reference", []).efficiency
    sec, = efficiency_sections(rows, Paper(efficiency=paper), "fa2", "moda")
    assert {"d", "dtype"} <= set(sec.show_config) and len(sec.frame) == 3
    f = sec.frame.set_index(["d", "dtype"])
    assert f.loc[(64, "float16"), "moda_ms"] == pytest.approx(3.3) and f.loc[(128, "bfloat16"), "fa2_ms"] == 4.0
    assert f.loc[(64, "bfloat16"), "paper_moda_ms"] == 10.750          # the paper's row 1 is bf16, d=64 only
    assert math.isnan(f.loc[(64, "float16"), "paper_moda_ms"]) and math.isnan(f.loc[(128, "bfloat16"), "paper_moda_ms"])
    md = efficiency_markdown(sec, "fa2", "moda")
    assert "| T | d | dtype | FA2 ms |" in md and "| 4096 | 128 | bfloat16 |" in md
