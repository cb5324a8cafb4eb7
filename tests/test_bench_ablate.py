"""`moda-bench ablate` on the CPU: the CSV upsert (bench.ablate), the table and the figure (the
command, cli.ablate), the naive rung's progress callbacks, and the command's error paths."""
from __future__ import annotations

import dataclasses
import math

import pandas as pd
import pytest
import torch
import typer
from typer.testing import CliRunner

from moda_bench import schema
from moda_bench.bench import ablate
from moda_bench.bench.providers import Prepared, Provider
from moda_bench.bench.runner import Point
from moda_bench.cli.ablate import ablate_command, ablation_table, write_outputs

RUNGS = ["naive-torch", "flash-compatible", "chunk-aware", "group-aware", "depth-bwd-in-dq", "shipped-kernel",
         "batched-tiles", "tma-fwd", "tma-bwd", "ours"]


def fake_rows(ms=(812.0, 11.0, 5.5, 1.2, 1.1, 1.05, 1.0, 0.95, 0.92, 0.9)) -> list[dict]:
    rows = []
    for name, t in zip(RUNGS, ms):
        row = {c: math.nan for c in schema.COLUMNS}
        row.update(sweep=ablate.SWEEP_NAME, provider=name, impl_detail=f"rung {name}", status=schema.OK, reason="",
                   config="{}", median_ms=t, p20_ms=0.9 * t, p80_ms=1.1 * t, max_rel_err=1e-3, depth_utilization=1 / 64,
                   gpu="H200", gpu_index=0, torch_version="2", triton_version="3", git_commit="abc",
                   timestamp="2025-01-01T00:00:00+00:00", **{"pass": ablate.PAPER_PASS}, **ablate.PAPER_POINT, Hq=64)
        rows.append(row)
    return rows


def test_write_csv_upserts_on_the_row_key_and_keeps_integers(tmp_path):
    csv_path = ablate.write_csv(ablate.ablation_frame(fake_rows()), tmp_path)
    assert csv_path == tmp_path / ablate.CSV_NAME
    first = pd.read_csv(csv_path)
    assert list(first.columns) == schema.COLUMNS and first["provider"].tolist() == RUNGS
    rows = fake_rows()
    rows[0].update(status=schema.SKIPPED, reason="--skip-naive", median_ms=math.nan)  # not upserted
    rows[1]["median_ms"] = 10.0  # replaces the old row of that key
    rows[2]["T"] = 2048  # another key: added
    ablate.write_csv(ablate.ablation_frame(rows), tmp_path)
    again = pd.read_csv(csv_path)
    assert len(again) == len(RUNGS) + 1
    by = again[again["T"] == 1024].set_index("provider")
    assert by.loc["flash-compatible", "median_ms"] == 10.0 and by.loc["naive-torch", "status"] == "ok"
    # integers stay integers when the file is rewritten (read back through moda_bench.results)
    line = csv_path.read_text().splitlines()[1].split(",")
    assert line[4:12] == ["1024", "8", "64", "8", "64", "1", "64", "64"]


def test_write_csv_refuses_a_file_that_is_not_a_results_csv(tmp_path):
    (tmp_path / ablate.CSV_NAME).write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not a moda-bench results CSV"):
        ablate.write_csv(ablate.ablation_frame(fake_rows()), tmp_path)


def test_table_and_figure(tmp_path):
    frame = ablate.ablation_frame(fake_rows())
    assert ablation_table(frame).row_count == len(RUNGS)
    csv_path, figures = write_outputs(frame, tmp_path)
    assert csv_path.exists()
    png = [p for p in figures if p.suffix == ".png"]
    assert png and png[0].parent == tmp_path and png[0].stat().st_size > 1000


def test_paper_config():
    assert ablate.is_paper_config(Point(**ablate.PAPER_POINT), "fwdbwd")
    assert not ablate.is_paper_config(Point(**ablate.PAPER_POINT), "fwd")
    assert not ablate.is_paper_config(Point(**{**ablate.PAPER_POINT, "T": 2048}), "fwdbwd")


def test_naive_rung_reports_positions_of_the_accuracy_run_only(monkeypatch):
    steps, reps = [], []

    def cpu_timer(n, on_rep=None):  # few_reps_timer without CUDA events
        def timer(fn, **kw):
            for i in range(n):
                fn()
                on_rep(i)
            return {"median_ms": 1.0, "p20_ms": 1.0, "p80_ms": 1.0}
        return timer

    def naive_fn(*args, chunk, on_step):
        for t in range(3):
            on_step(t)
        return chunk

    monkeypatch.setattr(ablate, "few_reps_timer", cpu_timer)
    provider = Provider("naive-torch", lambda inputs, point, chunk: Prepared(lambda: None))
    wrapped, timer = ablate.naive_rung(provider, naive_fn, 2, on_step=steps.append, on_rep=reps.append)
    assert dataclasses.replace(wrapped, prepare=provider.prepare) == provider  # only prepare changed
    prepared = wrapped.prepare({n: None for n in ("q", "k", "v", "k_depth", "v_depth")}, Point(), 16)
    assert prepared.forward() == 16 and steps == [0, 1, 2]  # the accuracy run
    assert timer(prepared.forward)["median_ms"] == 1.0
    assert steps == [0, 1, 2] and reps == [0, 1]  # timed calls: counted, positions not reported


def _invoke(*args):
    app = typer.Typer()
    app.command()(ablate_command)
    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize("args, message", [
    (["--dtype", "int8"], "--dtype must be one of"),
    (["--pass", "both"], "--pass must be"),
    (["--d", "48"], "--d must be one of"),
    (["--C", "24"], "--C must be a power of two"),
    (["--G", "32", "--C", "16"], "must be a multiple of G"),
    (["--naive-reps", "0"], "--naive-reps must be >= 1"),
    (["--T", "1024,abc"], "--T must be sequence lengths"),
    (["--T", "0"], "--T must be sequence lengths >= 1"),
    (["--skip", "group-aware,fastest"], "unknown rung 'fastest'"),
])
def test_ablate_user_errors(args, message):
    res = _invoke(*args)
    assert res.exit_code == 2 and message in " ".join(res.output.split()), res.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error path")
def test_ablate_without_cuda_exits_nonzero(tmp_path):
    res = _invoke("--T", "64", "--out", str(tmp_path / "abl"))
    assert res.exit_code == 1
    assert "needs a CUDA GPU" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "abl").exists()


def test_spec_skips_listed_rungs_and_rungs_above_their_max_t():
    from moda_bench.kernels.moda.ladder.table import rung
    spec = ablate.AblationSpec(points=(Point(T=1024), Point(T=16384)), warmup_ms=1.0, rep_ms=1.0, skip=("tma-fwd",))
    assert spec.skipped(rung("tma-fwd"), 1024) == "--skip"
    assert spec.skipped(rung("naive-torch"), 1024) is None and spec.skipped(rung("group-aware"), 16384) is None
    assert "T > 1024" in spec.skipped(rung("naive-torch"), 4096)
    assert spec.skipped(rung("flash-compatible"), 4096) is None and "T > 4096" in spec.skipped(rung("flash-compatible"),
                                                                                               16384)
    assert dataclasses.replace(spec, all_rungs=True).skipped(rung("flash-compatible"), 16384) is None


def test_run_ablation_runs_each_point_with_its_skips(monkeypatch):
    seen = []

    def fake_ladder(point, pass_, *, skip, **kw):
        seen.append((point.T, sorted(skip)))
        return [{"T": point.T}]

    monkeypatch.setattr(ablate, "run_ladder", fake_ladder)
    spec = ablate.AblationSpec(points=(Point(T=1024), Point(T=4096), Point(T=16384)), warmup_ms=1.0, rep_ms=1.0)
    saved = []
    rows = ablate.run_ablation(spec, {}, on_point=saved.append)
    assert [r["T"] for r in rows] == [1024, 4096, 16384] and saved == [[r] for r in rows]
    assert seen == [(1024, []), (4096, ["naive-torch"]), (16384, ["flash-compatible", "naive-torch"])]


def test_parse_ts_and_summary_table():
    from moda_bench.cli.ablate import parse_ts, summary_table
    assert parse_ts("1024, 4096,16384,1024") == (1024, 4096, 16384)
    rows = fake_rows() + [dict(r, T=4096, median_ms=4 * r["median_ms"]) for r in fake_rows()[1:]]
    table = summary_table(ablate.ablation_frame(rows), (1024, 4096))
    assert table.row_count == len(RUNGS) and len(table.columns) == 1 + 2 * 2 + 1
    cells = {c.header: list(c._cells) for c in table.columns}
    assert cells["rung"] == RUNGS
    assert cells["T=4096 ms"][0] == "-" and cells["paper x prev"][3] == "4.31x"
    assert cells["x prev"][2] == "2.00x"  # 11.0 -> 5.5 at T=1024


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the rung's own reason where no Hopper GPU is present")
def test_descriptor_rungs_say_why_they_cannot_run(monkeypatch):
    from moda_bench.bench import providers
    monkeypatch.setattr(providers, "_needs_moda_kernel", lambda device: None)  # as on a GPU machine
    assert "Hopper" in providers.get_provider("tma-fwd").unavailable("cuda")
    assert "Hopper" in providers.get_provider("tma-bwd").unavailable("cuda")
    assert providers.get_provider("group-aware").unavailable("cuda") is None
    assert providers.get_provider("naive-torch").unavailable("cuda") is None
