"""`moda-bench gate`: synthetic schema.COLUMNS CSVs through a local typer app wrapping gate_command
(moda_bench.cli.gate); the comparison itself is moda_bench.reports.gate.

This file: the rules that hold for files without ratio intervals (older files: point change and
p20-p80 bands), inputs, options, --run. tests/test_gate_ci.py: the interval decisions, the
re-measure of AMBIGUOUS rows, missing evidence, unhealthy rows; it imports `make_run` from here.
"""
from __future__ import annotations

import datetime as dt
import math

import numpy as np
import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

from moda_bench import schema
from moda_bench.bench import gate as gate_run
from moda_bench.cli.gate import gate_command, parse_threshold
from moda_bench.reports import gate
from moda_bench.reports.gate import compare

GPU = "NVIDIA H100 80GB HBM3"
CONFIGS = [dict(T=T, G=8, Hq=64, Hk=8, L=64, B=1, d=64, C=64, dtype="bfloat16") for T in (1024, 4096, 16384)]
PROVIDERS = {"fa2": 1.0, "moda": 1.05, "moda-chunk": 1.6}  # time relative to fa2


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("gate")(gate_command)

    @app.command("noop")  # a second command keeps typer in multi-command mode, like cli.py
    def _noop() -> None:
        pass
    return app


OLD_TIME = "2025-01-01T00:00:00+00:00"


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def make_run(rng: np.random.Generator, scale: dict | float = 1.0, spread: float = 0.02, gpu: str = GPU,
             passes=("fwdbwd",), drop=(), status: dict | None = None, ci: dict | float | None = None,
             providers: dict | None = None, configs=None, sequence_only=("fa2", "fa4"), jitter: float = 0.003,
             health: dict | str = "", timestamp: str = OLD_TIME, timer: str | None = None) -> pd.DataFrame:
    """One run: every provider on every config; base time ~ T^2, small random jitter.

    scale: factor on all times, or provider -> factor. spread: relative half-width of p20/p80.
    status: (provider, T) -> status string for rows that did not run ok. ci: None (a file from
    before the interval columns), or the half-width (log scale; a float, or provider -> float) of
    the 95% intervals of ratio_to_fa2 and ratio_to_best, which are filled like the runner does
    (best_provider: the fastest of `sequence_only`). health: the `health` cell, or
    (provider, T) -> cell.
    """
    rows = []
    for pass_ in passes:
        for cfg in configs or CONFIGS:
            point = []
            for prov, rel in (providers or PROVIDERS).items():
                if (prov, cfg["T"]) in drop:
                    continue
                factor = scale.get(prov, 1.0) if isinstance(scale, dict) else scale
                med = 27.0 * (cfg["T"] / 16384) ** 2 * rel * factor * (1 + rng.uniform(-jitter, jitter))
                st = (status or {}).get((prov, cfg["T"]), schema.OK)
                row = {c: np.nan for c in schema.COLUMNS}
                row.update(cfg, sweep="t", provider=prov, impl_detail="", **{"pass": pass_},
                           median_ms=med, p20_ms=med * (1 - spread), p80_ms=med * (1 + spread),
                           status=st, reason="boom" if st != schema.OK else "", gpu=gpu, gpu_index=0,
                           torch_version="2.11", triton_version="3.6", git_commit="abc", timestamp=timestamp,
                           health=health.get((prov, cfg["T"]), "") if isinstance(health, dict) else health)
                if timer is not None:
                    row["timer"] = timer
                if st != schema.OK:
                    row.update(median_ms=np.nan, p20_ms=np.nan, p80_ms=np.nan)
                point.append(row)
            if ci is not None:
                fill_ratios(point, ci, sequence_only)
            rows += point
    return pd.DataFrame(rows, columns=schema.COLUMNS)


def fill_ratios(point: list[dict], ci, sequence_only) -> None:
    """ratio_to_fa2 / ratio_to_best (+ log-symmetric intervals of half-width ci) of a point's rows."""
    ok = {r["provider"]: r for r in point if r["status"] == schema.OK}
    seq = [p for p in ok if p in sequence_only]
    best = min(seq, key=lambda p: ok[p]["median_ms"]) if seq else None
    for prov, r in ok.items():
        h = ci.get(prov, 0.005) if isinstance(ci, dict) else ci
        for col, den in (("ratio_to_fa2", "fa2"), ("ratio_to_best", best)):
            if den in ok:
                value = r["median_ms"] / ok[den]["median_ms"]
                hw = 0.0 if prov == den else h
                r.update({col: value, col + "_lo": value * math.exp(-hw), col + "_hi": value * math.exp(hw)})
        if best is not None:
            r["best_provider"] = best


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture
def gate_files(tmp_path):
    """Write (baseline, current) frames to CSVs, invoke the gate, return the click Result."""
    def invoke(base: pd.DataFrame, cur: pd.DataFrame, *args: str):
        b, c = tmp_path / "base.csv", tmp_path / "cur.csv"
        base.to_csv(b, index=False)
        cur.to_csv(c, index=False)
        return CliRunner().invoke(_app(), ["gate", "--baseline", str(b), "--current", str(c), *args],
                                  env={"GITHUB_STEP_SUMMARY": "", "COLUMNS": "200"})
    return invoke


def _cat(result: gate.GateResult, provider: str, T: int) -> str:
    r = result.rows
    return r[(r["provider"] == provider) & (r["T"] == T)]["category"].item()


def test_twenty_percent_slowdown_fails(rng, gate_files):
    base, cur = make_run(rng), make_run(rng, scale={"moda": 1.2})
    res = gate_files(base, cur)
    assert res.exit_code == 1, res.output
    assert "SLOW" in res.output and "FAIL" in res.output
    result = compare(base, cur, 0.05)
    assert result.counts["SLOW"] == 3  # moda at every T, nothing else
    assert set(result.of("SLOW")["provider"]) == {"moda"}
    assert result.of("SLOW")["change"].between(0.18, 0.22).all()
    # the same slowdown on the time metric also fails
    assert gate_files(base, cur, "--metric", "time").exit_code == 1


def test_warn_only_reports_but_passes(rng, gate_files):
    res = gate_files(make_run(rng), make_run(rng, scale={"moda": 1.2}), "--warn-only")
    assert res.exit_code == 0, res.output
    assert "SLOW" in res.output and "warn-only" in res.output


def test_change_within_noise_passes(rng, gate_files):
    # +8% median is over the 5% threshold, but the p20-p80 bands (+-10%) overlap: noise, not a
    # regression; with bands wider than the threshold nothing can be decided: AMBIGUOUS, which passes
    base, cur = make_run(rng, spread=0.10), make_run(rng, scale={"moda": 1.08}, spread=0.10)
    res = gate_files(base, cur, "--metric", "time")
    assert res.exit_code == 0, res.output
    result = compare(base, cur, 0.05, "time")
    assert result.counts["SLOW"] == 0 and result.counts["AMBIGUOUS"] == 9 and not result.failed
    assert result.of("AMBIGUOUS").query("provider == 'moda'")["detail"].str.contains("beyond").all()
    assert result.of("AMBIGUOUS").query("provider != 'moda'")["detail"].str.contains("wider").all()
    assert gate_files(base, cur, "--metric", "time", "--fail-ambiguous").exit_code == 1
    # a tight spread makes the same change significant
    assert compare(make_run(rng, spread=0.005), make_run(rng, scale={"moda": 1.08}, spread=0.005),
                   0.05, "time").counts["SLOW"] == 3


def test_below_threshold_passes_even_if_outside_noise(rng):
    # +3% with a 0.5% spread is measurable but under the 5% threshold
    result = compare(make_run(rng, spread=0.005), make_run(rng, scale={"moda": 1.03}, spread=0.005), 0.05, "time")
    assert result.counts["SLOW"] == 0 and not result.failed and result.counts["SAME"] == 9
    # a lower threshold catches it (the change's interval, about +-0.7% here, lies above 1%)
    assert compare(make_run(rng, spread=0.005), make_run(rng, scale={"moda": 1.03}, spread=0.005),
                   0.01, "time").counts["SLOW"] == 3


def test_improvement_passes_and_is_reported(rng, gate_files):
    base, cur = make_run(rng), make_run(rng, scale={"moda-chunk": 0.7})
    res = gate_files(base, cur)
    assert res.exit_code == 0, res.output
    assert "FAST" in res.output and "PASS" in res.output
    result = compare(base, cur, 0.05)
    assert result.counts["FAST"] == 3 and _cat(result, "moda-chunk", 4096) == "FAST"
    assert _cat(result, "moda", 4096) == "SAME"


def test_ratio_metric_ignores_uniformly_slower_machine(rng, gate_files):
    base, cur = make_run(rng), make_run(rng, scale=1.10)
    res = gate_files(base, cur)  # default --metric ratio
    assert res.exit_code == 0, res.output
    result = compare(base, cur, 0.05, "ratio")
    assert result.counts["SLOW"] == 0 and result.counts["SAME"] == 6
    assert result.counts["REFERENCE"] == 3  # fa2 rows: time shown, not gated
    assert result.of("REFERENCE")["change"].between(0.08, 0.12).all()
    # the raw time metric sees the slower machine
    assert gate_files(base, cur, "--metric", "time").exit_code == 1
    # a provider slower relative to fa2 on a slower machine still fails on ratio
    assert compare(base, make_run(rng, scale={"fa2": 1.1, "moda": 1.1 * 1.2, "moda-chunk": 1.1}),
                   0.05).counts["SLOW"] == 3


def test_ratio_falls_back_to_time_without_reference(rng):
    base = make_run(rng)
    cur = make_run(rng, scale={"moda": 1.2}, drop={("fa2", 1024)})
    result = compare(base, cur, 0.05)
    r = result.rows
    row = r[(r["provider"] == "moda") & (r["T"] == 1024)].iloc[0]
    assert row["metric"] == "time" and row["category"] == "SLOW" and "no fa2 row in current" in row["detail"]
    assert _cat(result, "fa2", 1024) == "MISSING"
    assert result.failed and not compare(base, cur, 0.05, allow_missing=True).of("MISSING").empty


def test_reference_matched_ignoring_depth_and_chunk(rng):
    # fa2 rows recorded with L=0 and no C: moda rows still find their reference
    def relabel(df):
        df = df.copy()
        df.loc[df["provider"] == "fa2", ["L", "C"]] = [0, np.nan]
        return df
    base, cur = relabel(make_run(rng)), relabel(make_run(rng, scale=1.1))
    result = compare(base, cur, 0.05)
    assert (result.rows.query("provider != 'fa2'")["metric"] == "ratio").all()
    assert not result.failed


def test_missing_new_and_failed_rows(rng, gate_files):
    base = make_run(rng, drop={("moda-chunk", 16384)})
    cur = make_run(rng, drop={("moda", 1024)}, status={("moda", 4096): schema.SKIPPED})
    result = compare(base, cur, 0.05)
    assert _cat(result, "moda", 1024) == "MISSING"
    assert _cat(result, "moda", 4096) == "MISSING"
    assert _cat(result, "moda-chunk", 16384) == "NEW"
    assert result.failed                                    # missing evidence is no pass
    assert not compare(base, cur, 0.05, allow_missing=True).failed
    res = gate_files(base, cur)
    assert res.exit_code == 1, res.output
    assert "MISSING" in res.output and "NEW" in res.output and "FAIL" in res.output
    res = gate_files(base, cur, "--allow-missing")
    assert res.exit_code == 0, res.output
    assert "MISSING" in res.output and "PASS" in res.output

    # ok in baseline, error/oom now: the provider broke -> gate fails, --allow-missing or not
    broken = make_run(rng, status={("moda", 16384): schema.OOM})
    assert _cat(compare(base, broken, 0.05), "moda", 16384) == "FAILED"
    for extra in ((), ("--allow-missing",)):
        res = gate_files(base, broken, *extra)
        assert res.exit_code == 1 and "FAILED" in res.output


def test_a_forward_that_stopped_repeating_fails_the_gate(rng, gate_files):
    """repeat_err > 0 in the current run where the baseline had 0 (or no value): FAILED, with the
    value in the detail, whatever the timing says; a baseline that already did not repeat is not
    a new failure."""
    base, cur = make_run(rng), make_run(rng)
    base["repeat_err"], cur["repeat_err"] = 0.0, 0.0
    racy = (cur["provider"] == "moda") & (cur["T"] == 4096)
    cur.loc[racy, "repeat_err"] = 0.0139
    result = compare(base, cur, 0.05)
    assert _cat(result, "moda", 4096) == "FAILED" and result.failed
    row = result.rows[(result.rows["provider"] == "moda") & (result.rows["T"] == 4096)].iloc[0]
    assert "not repeatable" in row["detail"] and "1.39e-02" in row["detail"]
    assert _cat(result, "moda", 1024) != "FAILED"
    res = gate_files(base, cur)
    assert res.exit_code == 1 and "FAILED" in res.output
    base.loc[(base["provider"] == "moda") & (base["T"] == 4096), "repeat_err"] = 0.02
    assert _cat(compare(base, cur, 0.05), "moda", 4096) != "FAILED"
    old = make_run(rng)                       # a baseline from before the column: NaN, not 0
    assert _cat(compare(old, cur, 0.05), "moda", 4096) == "FAILED"


def test_duplicate_key_last_row_wins(rng):
    base = make_run(rng)
    stale = make_run(rng, scale={"moda": 2.0})
    cur = pd.concat([stale, make_run(rng)], ignore_index=True)  # re-run appended to the same CSV
    assert not compare(base, cur, 0.05).failed
    assert compare(base, pd.concat([make_run(rng), stale]), 0.05).counts["SLOW"] == 3


def _error_lines(res) -> list[str]:
    return [line for line in res.output.splitlines() if line.strip()]


def test_schema_error_names_missing_columns(rng, gate_files):
    base = make_run(rng)
    res = gate_files(base, make_run(rng).drop(columns=["sweep", "Hk"]))
    assert res.exit_code == 2
    lines = _error_lines(res)
    assert len(lines) == 1 and "cur.csv" in lines[0], res.output
    assert "missing column(s)" in lines[0] and "Hk" in lines[0] and "sweep" in lines[0]
    assert "Traceback" not in res.output
    with pytest.raises(gate.GateInputError, match="baseline.*status"):
        compare(base.drop(columns=["status"]), base)
    with pytest.raises(gate.GateInputError, match="current.*p80_ms"):   # frames given directly
        compare(base, base.drop(columns=["p80_ms"]))


def test_unreadable_input_is_one_line_naming_the_file(rng, tmp_path):
    """Not a results CSV, a non-numeric value: exit 2, one line naming file (line, column)."""
    b = tmp_path / "base.csv"
    make_run(rng).to_csv(b, index=False)
    other = tmp_path / "wall_time.csv"
    other.write_text("run_dir,gpus,wall_s\nx,1,2.5\n")
    res = CliRunner().invoke(_app(), ["gate", "--baseline", str(b), "--current", str(other)])
    assert res.exit_code == 2 and "Traceback" not in res.output
    lines = _error_lines(res)
    assert len(lines) == 1 and "wall_time.csv" in lines[0] and "not a moda-bench results CSV" in lines[0], res.output
    text = b.read_text().splitlines()
    fields = text[3].split(",")
    fields[schema.COLUMNS.index("median_ms")] = "slow"                      # line 4 of the file
    text[3] = ",".join(fields)
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join(text) + "\n")
    res = CliRunner().invoke(_app(), ["gate", "--baseline", str(bad), "--current", str(b)])
    assert res.exit_code == 2 and "Traceback" not in res.output
    lines = _error_lines(res)
    assert len(lines) == 1, res.output
    assert "baseline" in lines[0] and "bad.csv" in lines[0] and "line 4" in lines[0] and "median_ms" in lines[0]
    assert "'slow'" in lines[0]


def test_malformed_rows_are_skipped_with_a_warning(rng, tmp_path):
    """A row with the wrong field count and a last row cut mid-line: one warning each, gate goes on."""
    b, c = tmp_path / "base.csv", tmp_path / "cur.csv"
    make_run(rng).to_csv(b, index=False)
    make_run(rng).to_csv(c, index=False)
    lines = c.read_text().splitlines()
    lines[2] = lines[2] + ",extra"                   # line 3: one field too many
    c.write_text("\n".join(lines)[:-20])            # the last row cut off, no newline at the end
    args = ["gate", "--baseline", str(b), "--current", str(c)]
    res = CliRunner().invoke(_app(), args + ["--allow-missing"], env={"GITHUB_STEP_SUMMARY": "", "COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    warnings = [line for line in res.output.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2, res.output
    assert "cur.csv: line 3 skipped" in warnings[0] and "fields" in warnings[0]
    assert f"cur.csv: line {len(lines)} skipped: cut off" in warnings[1]
    assert "2 baseline row(s) without a current measurement" in res.output   # reported, not compared
    # without --allow-missing the two rows the current file lost fail the gate
    res = CliRunner().invoke(_app(), args, env={"GITHUB_STEP_SUMMARY": "", "COLUMNS": "200"})
    assert res.exit_code == 1 and "FAIL: 2 MISSING" in res.output, res.output


def test_missing_and_empty_files_exit_2(rng, tmp_path):
    b = tmp_path / "base.csv"
    make_run(rng).to_csv(b, index=False)
    runner = CliRunner()
    res = runner.invoke(_app(), ["gate", "--baseline", str(b), "--current", str(tmp_path / "nope.csv")])
    assert res.exit_code == 2 and "not found" in res.output and "nope.csv" in res.output
    assert len(_error_lines(res)) == 1 and "Traceback" not in res.output
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    res = runner.invoke(_app(), ["gate", "--baseline", str(b), "--current", str(empty)])
    assert res.exit_code == 2 and "empty" in res.output
    header_only = tmp_path / "header.csv"
    header_only.write_text(",".join(schema.COLUMNS) + "\n")
    res = runner.invoke(_app(), ["gate", "--baseline", str(header_only), "--current", str(b)])
    assert res.exit_code == 2 and "no rows" in res.output
    res = runner.invoke(_app(), ["gate", "--baseline", str(b)])
    assert res.exit_code == 2 and "--current" in res.output


def test_nothing_in_common_exits_2(rng, gate_files):
    cur = make_run(rng, passes=("fwd",))
    res = gate_files(make_run(rng), cur)
    assert res.exit_code == 2 and "nothing to compare" in res.output


def test_gpu_change_exits_2_unless_allowed(rng, gate_files):
    base, cur = make_run(rng), make_run(rng, gpu="NVIDIA H200")
    res = gate_files(base, cur)
    assert res.exit_code == 2 and "GPU changed" in res.output and "H200" in res.output
    assert gate_files(base, cur, "--allow-gpu-change").exit_code == 0
    with pytest.raises(gate.GateInputError, match="allow-gpu-change"):
        compare(base, cur)


@pytest.mark.parametrize("text,value", [("5%", 0.05), ("0.05", 0.05), ("12.5%", 0.125), ("0", 0.0)])
def test_parse_threshold(text, value):
    assert parse_threshold(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["5", "-1%", "abc", "%"])
def test_parse_threshold_rejects(text):
    with pytest.raises(typer.BadParameter):
        parse_threshold(text)


def test_threshold_option_accepts_both_spellings(rng, gate_files):
    base, cur = make_run(rng, spread=0.005), make_run(rng, scale={"moda": 1.08}, spread=0.005)
    assert gate_files(base, cur, "--threshold", "10%").exit_code == 0
    assert gate_files(base, cur, "--threshold", "0.05").exit_code == 1
    res = gate_files(base, cur, "--threshold", "5")
    assert res.exit_code == 2 and "ambiguous" in res.output


def test_summary_writes_markdown(rng, gate_files, tmp_path):
    out = tmp_path / "sub" / "summary.md"
    res = gate_files(make_run(rng), make_run(rng, scale={"moda": 1.2}), "--summary", str(out))
    assert res.exit_code == 1
    text = out.read_text()
    assert text.startswith("## ") and "FAIL" in text
    assert "| category | provider |" in text and "| SLOW | moda |" in text
    assert "+20" in text or "+19" in text or "+21" in text
    assert "<details>" in text


def test_github_step_summary_appended(rng, tmp_path):
    b, c, step = tmp_path / "b.csv", tmp_path / "c.csv", tmp_path / "step.md"
    make_run(rng).to_csv(b, index=False)
    make_run(rng).to_csv(c, index=False)
    step.write_text("previous step\n")
    res = CliRunner().invoke(_app(), ["gate", "--baseline", str(b), "--current", str(c)],
                             env={"GITHUB_STEP_SUMMARY": str(step)})
    assert res.exit_code == 0, res.output
    text = step.read_text()
    assert text.startswith("previous step\n") and "PASS" in text


def test_update_baseline_copies_current(rng, gate_files, tmp_path):
    res = gate_files(make_run(rng), make_run(rng, scale={"moda-chunk": 0.7}), "--update-baseline")
    assert res.exit_code == 0 and "baseline updated" in res.output
    assert (tmp_path / "base.csv").read_bytes() == (tmp_path / "cur.csv").read_bytes()


def test_run_plan(rng):
    df = make_run(rng, passes=("fwd", "fwdbwd"), status={("moda", 1024): schema.ERROR})
    df["timer"] = df["timer"].astype(object)
    df.loc[(df["pass"] == "fwd") & (df["T"] == 4096), "timer"] = "graph"
    df.loc[(df["pass"] == "fwd") & (df["T"] == 16384), "timer"] = "do_bench"   # runner.LEGACY_TIMER
    plan = gate_run.run_plan(df)
    groups = {(pass_, timer, tuple(sorted(provs))): [p.T for p in points] for pass_, timer, points, provs in plan}
    everything, no_moda = ("fa2", "moda", "moda-chunk"), ("fa2", "moda-chunk")
    assert groups == {("fwd", "eager", no_moda): [1024], ("fwd", "do_bench", everything): [16384],
                      ("fwd", "graph", everything): [4096], ("fwdbwd", "eager", no_moda): [1024],
                      ("fwdbwd", "eager", everything): [4096, 16384]}
    points = [p for _, _, pts, _ in plan for p in pts]
    assert all(p.Hq == 64 and p.L == 64 and p.C == 64 and p.dtype == "bfloat16" for p in points)
    df.loc[0, "timer"] = "custom"
    with pytest.raises(gate.GateInputError, match="custom"):
        gate_run.run_plan(df)


def healthy_gpu(monkeypatch, verdicts=("healthy",)):
    """CUDA 'available' and the health canary stubbed: successive checks return these statuses
    (the last one repeats); returns the list of device indices checked."""
    import torch

    from moda_bench import health

    seen = []

    def fake_check(device_index=0, **kw):
        status = verdicts[min(len(seen), len(verdicts) - 1)]
        seen.append(device_index)
        return health.Verdict(status, "" if status == "healthy" else "matmul 310 TFLOP/s < 520 (0.6x the record)")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(health, "check_health", fake_check)
    return seen


def test_run_uses_runner_and_gates(rng, tmp_path, monkeypatch):
    """--run: the runner (stubbed) gets the baseline's points/providers, timing options and the
    health label; the canary runs at start and end; its CSV is gated."""
    from moda_bench.bench import runner

    base = make_run(rng)
    b = tmp_path / "base.csv"
    base.to_csv(b, index=False)
    calls = []

    def fake_run_sweep(points, spec, csv_path, *, sweep_name, **kw):
        calls.append((points, list(spec.providers), spec.pass_, sweep_name, dict(kw, health=spec.health,
                                                                                 timing=spec.timing)))
        make_run(rng, scale={"moda": 1.25}, health=spec.health, timestamp=now_iso()).to_csv(csv_path, index=False)

    monkeypatch.setattr(runner, "run_sweep", fake_run_sweep)
    checked = healthy_gpu(monkeypatch)
    cur = tmp_path / "new.csv"
    res = CliRunner().invoke(_app(), ["gate", "--run", "--baseline", str(b), "--current", str(cur),
                                      "--update-baseline", "--min-samples", "7"], env={"GITHUB_STEP_SUMMARY": ""})
    assert res.exit_code == 1, res.output
    assert len(calls) == 1 and calls[0][2] == "fwdbwd" and calls[0][1] == ["fa2", "moda", "moda-chunk"]
    assert len(calls[0][0]) == 3 and cur.exists()
    kw = calls[0][4]
    assert kw["health"] == "healthy" and kw["timing"].timer == "eager" and kw["timing"].min_samples == 7
    assert checked == [0, 0]                      # canary at start and end
    assert "baseline updated" in res.output and b.read_bytes() == cur.read_bytes()
    assert not list(tmp_path.glob(".gate-*"))  # the temporary file is gone


def test_run_without_cuda_exits_2(rng, tmp_path, monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    b = tmp_path / "base.csv"
    make_run(rng).to_csv(b, index=False)
    res = CliRunner().invoke(_app(), ["gate", "--run", "--baseline", str(b)])
    assert res.exit_code == 2 and "CUDA" in res.output and "Traceback" not in res.output
