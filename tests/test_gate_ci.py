"""`moda-bench gate` with the interval columns (issue 15 item 6, issue 16 item 3): SLOW / FAST /
SAME / AMBIGUOUS from the 95% intervals, `--metric ratio-best`, the re-measure of AMBIGUOUS rows
under --run, missing evidence (MISSING fails unless --allow-missing), unhealthy rows (exit 2) and
unreadable input (exit 2, one line). Synthetic CSVs built with the schema by `make_run`
(tests/test_gate.py); values are random, the tests check only the decisions."""
from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest
from test_gate import CONFIGS, _app, healthy_gpu, make_run, now_iso
from typer.testing import CliRunner

from moda_bench import schema
from moda_bench.bench import gate as gate_run
from moda_bench.reports import gate
from moda_bench.reports.gate import classify_interval, compare

ENV = {"GITHUB_STEP_SUMMARY": "", "COLUMNS": "200"}
INTERVAL = re.compile(r"\d\.\d{3} \[\d\.\d{3}-\d\.\d{3}\]")   # '1.023 [1.011-1.035]'


@pytest.fixture
def rng():
    return np.random.default_rng(20260)


def gate_cli(tmp_path, base: pd.DataFrame, cur: pd.DataFrame, *args: str):
    b, c = tmp_path / "base.csv", tmp_path / "cur.csv"
    base.to_csv(b, index=False)
    cur.to_csv(c, index=False)
    return CliRunner().invoke(_app(), ["gate", "--baseline", str(b), "--current", str(c), *args], env=ENV)


def categories(result: gate.GateResult, provider: str) -> set[str]:
    return set(result.rows[result.rows["provider"] == provider]["category"])


def lines(res) -> list[str]:
    return [line for line in res.output.splitlines() if line.strip()]


# ----------------------------------------------------------------------------- the rule itself
def brief_rule(b: float, c: float, c_lo: float, c_hi: float, t: float) -> str:
    """The issue's words, for an exact baseline value b and a current interval [c_lo, c_hi]."""
    if c_lo > b * (1 + t):
        return "SLOW"
    if c_hi < b * (1 - t):
        return "FAST"
    if abs(c / b - 1) > t or (c_lo < b * (1 - t) and c_hi > b * (1 + t)):
        return "AMBIGUOUS"
    return "SAME"


def test_interval_rule_matches_the_issue_against_an_exact_baseline(rng):
    seen = set()
    for _ in range(3000):
        b = rng.uniform(0.3, 3.0)
        c = b * math.exp(rng.normal(0, 0.08))
        c_lo, c_hi = c * math.exp(-rng.uniform(0, 0.08)), c * math.exp(rng.uniform(0, 0.08))
        t = rng.uniform(0, 0.1)
        got = classify_interval((b, b, b), (c, c_lo, c_hi), t)
        assert got["category"] == brief_rule(b, c, c_lo, c_hi, t), (b, c, c_lo, c_hi, t, got)
        assert got["change_lo"] <= got["change"] <= got["change_hi"]
        seen.add(got["category"])
    assert seen == {"SLOW", "FAST", "SAME", "AMBIGUOUS"}


def test_baseline_uncertainty_never_makes_a_decision_more_certain(rng):
    """Adding a baseline interval can only turn a decision into AMBIGUOUS, never the other way."""
    changed = {"SLOW": 0, "FAST": 0, "SAME": 0}
    for _ in range(3000):
        b = rng.uniform(0.3, 3.0)
        c = b * math.exp(rng.normal(0, 0.08))
        cur = (c, c * math.exp(-rng.uniform(0, 0.05)), c * math.exp(rng.uniform(0, 0.05)))
        wide = (b, b * math.exp(-rng.uniform(0, 0.05)), b * math.exp(rng.uniform(0, 0.05)))
        t = rng.uniform(0, 0.1)
        exact, fuzzy = (classify_interval(base, cur, t)["category"] for base in ((b, b, b), wide))
        if exact != fuzzy:
            assert fuzzy == "AMBIGUOUS", (b, cur, wide, t, exact, fuzzy)
            changed[exact] += 1
    assert all(changed.values()), changed        # the baseline interval counts on both sides


# ----------------------------------------------------------------------------- files with intervals
def scenario(rng, t: float = 0.05, spread: float | None = None):
    """Baseline and current with 95% intervals: moda SLOW, moda-chunk FAST, moda-x SAME, moda-y
    AMBIGUOUS (beyond the threshold, wide interval), moda-z AMBIGUOUS (interval wider than the band)."""
    providers = {"fa2": 1.0, "moda": 1.05, "moda-chunk": 1.6, "moda-x": 1.2, "moda-y": 1.3, "moda-z": 1.4}
    narrow = rng.uniform(0.002, 0.008)
    ci = {p: narrow for p in providers} | {"moda-y": 0.06, "moda-z": 0.09}
    clear = 2 * math.sqrt(2) * narrow + 0.015          # margin beyond the threshold + jitter
    scale = {"moda": (1 + t) * math.exp(clear + rng.uniform(0, 0.1)),
             "moda-chunk": (1 - t) * math.exp(-clear - rng.uniform(0, 0.1)),
             "moda-x": 1 + rng.uniform(-t / 3, t / 3),
             "moda-y": 1 + t + rng.uniform(0.02, 0.03),
             "moda-z": 1 + rng.uniform(-t / 3, t / 3)}
    spread = spread or rng.uniform(0.01, 0.05)
    base = make_run(rng, ci=ci, providers=providers, spread=spread)
    cur = make_run(rng, ci=ci, providers=providers, scale=scale, spread=spread)
    return base, cur


def test_interval_decisions_slow_fast_same_ambiguous(rng, tmp_path):
    base, cur = scenario(rng)
    result = compare(base, cur, 0.05)
    assert categories(result, "moda") == {"SLOW"}
    assert categories(result, "moda-chunk") == {"FAST"}
    assert categories(result, "moda-x") == {"SAME"}
    assert categories(result, "moda-y") == {"AMBIGUOUS"} and categories(result, "moda-z") == {"AMBIGUOUS"}
    assert categories(result, "fa2") == {"REFERENCE"}
    gated = result.rows[result.rows["provider"] != "fa2"]
    assert (gated["interval"] == "95% CI").all() and (gated["metric"] == "ratio").all()
    assert result.of("AMBIGUOUS").query("provider == 'moda-z'")["detail"].str.contains("wider").all()

    res = gate_cli(tmp_path, base, cur, "--summary", str(tmp_path / "s.md"))
    assert res.exit_code == 1 and "FAIL: 3 SLOW" in res.output, res.output
    assert INTERVAL.search(res.output) and "AMBIGUOUS" in res.output and "--fail-ambiguous" in res.output
    md = (tmp_path / "s.md").read_text()
    assert re.search(r"\| SLOW \| moda \| .* \| ratio \(95% CI\) \| " + INTERVAL.pattern, md), md
    assert "| AMBIGUOUS | moda-y |" in md and "| FAST | moda-chunk |" in md


def test_ambiguous_passes_unless_fail_ambiguous(rng, tmp_path):
    base, cur = scenario(rng)
    keep = ~base["provider"].isin(["moda", "moda-chunk"])
    base, cur = base[keep], cur[~cur["provider"].isin(["moda", "moda-chunk"])]
    res = gate_cli(tmp_path, base, cur)
    assert res.exit_code == 0 and "PASS (6 AMBIGUOUS not gated)" in res.output, res.output
    res = gate_cli(tmp_path, base, cur, "--fail-ambiguous")
    assert res.exit_code == 1 and "FAIL: 6 AMBIGUOUS" in res.output, res.output
    assert gate_cli(tmp_path, base, cur, "--fail-ambiguous", "--warn-only").exit_code == 0


def test_rows_without_intervals_fall_back_to_the_band_rule(rng):
    """An older current file (no _lo/_hi): the median ratio and p20-p80 bands decide."""
    base, cur = scenario(rng, spread=0.005)
    old = cur.drop(columns=["ratio_to_fa2_lo", "ratio_to_fa2_hi"])
    result = compare(base, old, 0.05)
    gated = result.rows[result.rows["provider"] != "fa2"]
    assert (gated["interval"] == "p20-p80").all() and gated["detail"].str.contains("no interval").all()
    assert categories(result, "moda") == {"SLOW"} and categories(result, "moda-chunk") == {"FAST"}
    # an older baseline with a new current: the current interval against the baseline value
    result = compare(base.drop(columns=["ratio_to_fa2_lo", "ratio_to_fa2_hi"]), cur, 0.05)
    assert (result.rows[result.rows["provider"] != "fa2"]["interval"] == "95% CI").all()
    assert categories(result, "moda") == {"SLOW"}


def test_ratio_best_normalises_by_the_fastest_sequence_only_provider(rng, tmp_path):
    """fa4 (the best sequence-only provider) gets faster: every ratio to it grows, ratios to fa2 do not."""
    providers = {"fa2": 1.0, "fa4": 0.8, "moda": 1.05, "moda-chunk": 1.6}
    ci = rng.uniform(0.002, 0.006)
    speedup = rng.uniform(0.75, 0.85)
    base = make_run(rng, ci=ci, providers=providers)
    cur = make_run(rng, ci=ci, providers=providers, scale={"fa4": speedup})
    best = compare(base, cur, 0.05, "ratio-best")
    assert categories(best, "fa4") == {"REFERENCE"}
    for prov in ("fa2", "moda", "moda-chunk"):
        assert categories(best, prov) == {"SLOW"}, best.rows
    assert (best.rows[best.rows["provider"] != "fa4"]["metric"] == "ratio-best").all()
    by_fa2 = compare(base, cur, 0.05, "ratio")
    assert categories(by_fa2, "moda") == {"SAME"} and categories(by_fa2, "fa4") == {"FAST"}
    assert gate_cli(tmp_path, base, cur, "--metric", "ratio-best").exit_code == 1
    assert gate_cli(tmp_path, base, cur).exit_code == 0
    # the best provider changes between the runs: said in the detail
    cur2 = make_run(rng, ci=ci, providers=providers, scale={"fa4": 1.5})
    moved = compare(base, cur2, 0.05, "ratio-best")
    assert moved.rows.query("provider == 'moda'")["detail"].str.contains("best: fa4 -> fa2").all()


# ----------------------------------------------------------------------------- missing evidence
@pytest.mark.parametrize("how", ["absent", "skipped", "nan"])
def test_missing_evidence_fails_unless_allowed(rng, tmp_path, how):
    base = make_run(rng, ci=0.005)
    lost = [(p, T) for p, T in zip(rng.choice(["moda", "moda-chunk"], 2, replace=False),
                                   rng.choice([c["T"] for c in CONFIGS], 2))]
    if how == "absent":
        cur = make_run(rng, ci=0.005, drop=set(lost))
    elif how == "skipped":
        cur = make_run(rng, ci=0.005, status={k: schema.SKIPPED for k in lost})
    else:                                            # status ok, but no number
        cur = make_run(rng, ci=0.005)
        for p, T in lost:
            cur.loc[(cur["provider"] == p) & (cur["T"] == T), ["median_ms", "p20_ms", "p80_ms"]] = np.nan
    result = compare(base, cur, 0.05)
    assert len(result.of("MISSING")) == 2 and result.failed
    res = gate_cli(tmp_path, base, cur)
    assert res.exit_code == 1 and "FAIL: 2 MISSING" in res.output, res.output
    listed = [line for line in res.output.splitlines() if line.startswith("│ MISSING")]
    assert len(listed) == 2 and {line.split("│")[2].strip() for line in listed} == {p for p, _ in lost}
    res = gate_cli(tmp_path, base, cur, "--allow-missing")
    assert res.exit_code == 0 and "MISSING" in res.output and "PASS (2 MISSING not gated)" in res.output


def test_current_without_any_common_row_is_not_a_pass(rng, tmp_path):
    base = make_run(rng, ci=0.005)
    cur = make_run(rng, ci=0.005, passes=("fwd",))
    for extra in ((), ("--allow-missing",)):
        res = gate_cli(tmp_path, base, cur, *extra)
        assert res.exit_code == 2 and "nothing to compare" in res.output and "9 baseline row(s)" in res.output


# ----------------------------------------------------------------------------- health
@pytest.mark.parametrize("side", ["current", "baseline"])
def test_unhealthy_rows_exit_2_with_reason_and_count(rng, tmp_path, side):
    n = int(rng.integers(2, 9))
    keys = [(p, c["T"]) for p in ("fa2", "moda", "moda-chunk") for c in CONFIGS]
    reason = f"degraded: matmul {rng.integers(200, 400)} TFLOP/s < 520 (0.6x the record)"
    marked = {keys[i]: reason for i in rng.choice(len(keys), n, replace=False)}
    clean = make_run(rng, ci=0.005, health="healthy")
    sick = make_run(rng, ci=0.005, health=marked)
    base, cur = (clean, sick) if side == "current" else (sick, clean)
    res = gate_cli(tmp_path, base, cur)
    assert res.exit_code == 2 and "Traceback" not in res.output
    (line,) = lines(res)
    assert line.startswith(f"error: {side}") and f"{n} of 9 row(s)" in line and reason in line, line
    # '', 'healthy' and 'unknown' are comparable
    ok = make_run(rng, ci=0.005, health={k: h for k, h in zip(keys, ["", "healthy", "unknown"] * 3)})
    assert gate_cli(tmp_path, clean, ok).exit_code == 0


# ----------------------------------------------------------------------------- --run: re-measure
def fake_runner(monkeypatch, rng, scales: list[dict], ci: float = 0.004):
    """runner.run_sweep stubbed: call i writes the points and providers it is given, with the
    times scaled by scales[i] (the last repeats); returns the list of calls."""
    from moda_bench.bench import runner
    calls = []

    def run_sweep(points, spec, csv_path, *, sweep_name, **kw):
        providers, pass_ = list(spec.providers), spec.pass_
        kw = dict(kw, health=spec.health, timing=spec.timing)
        scale = scales[min(len(calls), len(scales) - 1)]
        calls.append(dict(points=list(points), providers=list(providers), pass_=pass_, **kw))
        configs = [{c: p.to_dict()[c] for c in schema.CONFIG_COLUMNS} for p in points]
        rows = make_run(rng, scale=scale, ci=ci, configs=configs, passes=(pass_,), health=kw.get("health", ""),
                        providers={p: {"fa2": 1.0, "moda": 1.05, "moda-chunk": 1.6}[p] for p in providers},
                        timestamp=now_iso())
        rows.to_csv(csv_path, mode="a", header=not csv_path.exists(), index=False)

    monkeypatch.setattr(runner, "run_sweep", run_sweep)
    return calls


def run_gate(tmp_path, base, *args):
    b, cur = tmp_path / "base.csv", tmp_path / "cur.csv"
    base.to_csv(b, index=False)
    res = CliRunner().invoke(_app(), ["gate", "--run", "--baseline", str(b), "--current", str(cur), *args], env=ENV)
    return res, cur


def test_remeasure_runs_only_the_ambiguous_points_and_providers(rng, tmp_path, monkeypatch):
    base = make_run(rng, ci=0.004)
    healthy_gpu(monkeypatch)
    ambiguous_T = int(rng.choice([c["T"] for c in CONFIGS]))
    first = {"moda-chunk": 1.07}                         # +7% with a +-4% interval... made wide below
    calls = fake_runner(monkeypatch, rng, [first, {}])
    real_run_current = gate_run.run_current

    def widen_first(baseline_df, out_csv, **kw):         # the first run's moda-chunk interval at one T is wide
        real_run_current(baseline_df, out_csv, **kw)
        if len(calls) == 1:
            df = pd.read_csv(out_csv)
            sel = (df["provider"] == "moda-chunk") & (df["T"] == ambiguous_T)
            df.loc[sel, "ratio_to_fa2_lo"] = df.loc[sel, "ratio_to_fa2"] * 0.9
            df.loc[~sel & (df["provider"] == "moda-chunk"), "ratio_to_fa2"] /= 1.07   # the others: no change
            df.loc[~sel & (df["provider"] == "moda-chunk"), ["ratio_to_fa2_lo", "ratio_to_fa2_hi"]] /= 1.07
            df.to_csv(out_csv, index=False)

    monkeypatch.setattr(gate_run, "run_current", widen_first)
    res, cur = run_gate(tmp_path, base)
    assert len(calls) == 2, res.output
    assert calls[1]["providers"] == ["moda-chunk", "fa2"] and [p.T for p in calls[1]["points"]] == [ambiguous_T]
    assert "1 AMBIGUOUS row(s): measuring them again (round 1 of at most 2, up to 180 s a point)" in res.output
    assert "round 2" not in res.output                                     # decided: no second round
    assert res.exit_code == 0 and "PASS" in res.output, res.output   # decided SAME the second time
    df = pd.read_csv(cur)
    assert len(df) == 9 and not df.duplicated(schema.KEY_COLUMNS[:2] + ["T"]).any()   # replaced, not appended
    assert not list(tmp_path.glob(".gate-*"))


def test_remeasure_plan_pairs_the_ambiguous_rows_with_their_references(rng):
    """Only the AMBIGUOUS points, each with its provider, fa2 and the best provider (fa4 here)."""
    providers = {"fa2": 1.0, "fa4": 0.8, "moda": 1.05, "moda-chunk": 1.6}
    base = make_run(rng, ci=0.004, providers=providers)
    cur = make_run(rng, ci=0.004, providers=providers)
    T = int(rng.choice([c["T"] for c in CONFIGS]))
    sel = (cur["provider"] == "moda") & (cur["T"] == T)
    cur.loc[sel, "ratio_to_fa2"] *= 1.08
    cur.loc[sel, "ratio_to_fa2_hi"] *= 1.2
    result = compare(base, cur, 0.05)
    assert list(result.of("AMBIGUOUS")["provider"]) == ["moda"]
    plan = gate.remeasure_plan(result, base, cur)
    assert sorted(zip(plan["provider"], plan["T"])) == [("fa2", T), ("fa4", T), ("moda", T)]
    points = gate_run.run_plan(plan)
    assert len(points) == 1 and [p.T for p in points[0][2]] == [T] and points[0][3] == ["moda", "fa2", "fa4"]


@pytest.mark.parametrize("second,code", [("AMBIGUOUS", 0), ("SLOW", 1), ("SAME", 0)])
def test_remeasure_result_replaces_the_first(rng, tmp_path, monkeypatch, second, code):
    """First run: moda AMBIGUOUS everywhere; the re-run function (stubbed) returns new rows that
    are still ambiguous, or decided; they replace the first ones before the decision."""
    base = make_run(rng, ci=0.004)
    healthy_gpu(monkeypatch)
    fake_runner(monkeypatch, rng, [{"moda": 1.08}])
    ci_first = {"moda": 0.06, "fa2": 0.0, "moda-chunk": 0.004}
    real_run_current = gate_run.run_current

    def first_run(baseline_df, out_csv, **kw):
        real_run_current(baseline_df, out_csv, **kw)
        df = pd.read_csv(out_csv)
        rows = make_run(rng, scale={"moda": 1.08}, ci=ci_first, timestamp=now_iso(), health=kw["health"])
        rows.to_csv(out_csv, index=False)
        assert len(df) == len(rows)

    scale, ci = {"AMBIGUOUS": (1.08, 0.06), "SLOW": (1.25, 0.004), "SAME": (1.0, 0.004)}[second]
    remeasured = []

    def fake_remeasure(plan, out_csv, **kw):
        remeasured.append(plan)
        new = make_run(rng, scale={"moda": scale}, ci={"moda": ci}, timestamp=now_iso(), health=kw["health"])
        return new[new["provider"].isin(["moda", "fa2"])]

    monkeypatch.setattr(gate_run, "run_current", first_run)
    monkeypatch.setattr(gate_run, "remeasure", fake_remeasure)
    res, cur = run_gate(tmp_path, base)
    assert len(remeasured) == (2 if second == "AMBIGUOUS" else 1)   # still undecided: a second, longer round
    assert sorted(remeasured[0]["provider"]) == ["fa2"] * 3 + ["moda"] * 3   # + reference
    assert res.exit_code == code, res.output
    assert f"{6 if second == 'SAME' else 3} {second}" in res.output   # SAME: moda-chunk's too
    df = pd.read_csv(cur)
    assert len(df) == 9
    moda = df[df["provider"] == "moda"]
    assert (moda["ratio_to_fa2_hi"] / moda["ratio_to_fa2"]).apply(math.log).round(3).eq(round(ci, 3)).all()
    if second == "AMBIGUOUS":
        remeasured.clear()
        assert run_gate(tmp_path, base, "--fail-ambiguous", "--recheck-rounds", "1")[0].exit_code == 1
        assert len(remeasured) == 1


def test_run_on_unhealthy_gpu_exits_2(rng, tmp_path, monkeypatch):
    base = make_run(rng, ci=0.004)
    # healthy at the start, degraded at the end: the rows are marked and the gate refuses them
    healthy_gpu(monkeypatch, verdicts=("healthy", "degraded"))
    calls = fake_runner(monkeypatch, rng, [{}])
    res, cur = run_gate(tmp_path, base)
    assert res.exit_code == 2 and len(calls) == 1, res.output
    err = [line for line in res.output.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "9 of 9 row(s)" in err[0] and "degraded: matmul 310 TFLOP/s" in err[0]
    assert pd.read_csv(cur)["health"].str.startswith("degraded").all()
    # degraded at the start under --strict: nothing measured
    healthy_gpu(monkeypatch, verdicts=("degraded",))
    calls.clear()
    res, _ = run_gate(tmp_path, base, "--strict")
    assert res.exit_code == 2 and not calls and "--strict" in res.output
    # --no-health-check: no canary, rows unmarked, the gate judges them
    seen = healthy_gpu(monkeypatch, verdicts=("degraded",))
    res, _ = run_gate(tmp_path, base, "--no-health-check")
    assert res.exit_code == 0 and not seen, res.output


# ----------------------------------------------------------------------------- unreadable input
@pytest.mark.parametrize("case", ["missing file", "not a results CSV", "non-numeric value"])
def test_unreadable_input_exits_2_in_one_line(rng, tmp_path, case):
    good = tmp_path / "good.csv"
    make_run(rng, ci=0.005).to_csv(good, index=False)
    bad = tmp_path / "bad.csv"
    if case == "not a results CSV":
        bad.write_text("run_dir,gpus,wall_s\nx,1,2.5\n")
    elif case == "non-numeric value":
        text = good.read_text().splitlines()
        line = int(rng.integers(2, len(text) + 1))          # 1-based line in the file
        fields = text[line - 1].split(",")
        fields[schema.COLUMNS.index("ratio_to_fa2_lo")] = "n/a?"
        text[line - 1] = ",".join(fields)
        bad.write_text("\n".join(text) + "\n")
    for args, what in ((["--baseline", str(good), "--current", str(bad)], "current"),
                       (["--baseline", str(bad), "--current", str(good)], "baseline")):
        res = CliRunner().invoke(_app(), ["gate", *args], env=ENV)
        assert res.exit_code == 2 and "Traceback" not in res.output, res.output
        (msg,) = lines(res)
        assert msg.startswith(f"error: {what}: ") and "bad.csv" in msg
        if case == "missing file":
            assert "not found" in msg
        elif case == "not a results CSV":
            assert "not a moda-bench results CSV" in msg and "missing column(s)" in msg
        else:
            assert f"line {line}" in msg and "ratio_to_fa2_lo" in msg and "'n/a?'" in msg
