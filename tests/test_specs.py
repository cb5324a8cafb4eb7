"""The commands' spec objects (bench.spec.TuneSpec, GateSpec) and the bench-level functions they
are handed to (bench.tune.run_tuning, bench.gate.measure): each spec checks its values where it is
made and names the option; the functions run on a fake device. CPU only."""
from __future__ import annotations

import contextlib
import inspect

import numpy as np
import pandas as pd
import pytest
from helpers import fake_tuning_device
from test_gate import make_run, now_iso
from test_tuning import FakeTimer

from moda_bench import schema, tuning
from moda_bench.bench import gate as gate_run
from moda_bench.bench import runner
from moda_bench.bench import tune as tune_run
from moda_bench.bench.spec import DEFAULT_TUNE_KERNELS, GATE_CURRENT, GateSpec, SpecError, TuneSpec
from moda_bench.reports.gate import compare


# ----------------------------------------------------------------------------- TuneSpec
def test_tune_spec_resolves_each_operators_groups():
    assert TuneSpec().kernels == DEFAULT_TUNE_KERNELS and TuneSpec().dropped == ()
    assert TuneSpec(op="moda-overlap").kernels == tuning.OVERLAP_DEFAULT
    fa4 = TuneSpec(op="moda-fa4", kernels=("fwd_depth", "fwd", "bwd_q"))
    assert fa4.kernels == ("fwd_depth",) and fa4.dropped == ("fwd", "bwd_q")
    spec = TuneSpec(shape=(("T", 3000), ("Hk", 3)), dtype="float16", vary="G", values=[2, 6])
    assert spec.values == (2, 6) and (spec.base_point().T, spec.base_point().Hk, spec.base_point().dtype) == \
        (3000, 3, "float16")


@pytest.mark.parametrize("kw,option,words", [
    (dict(kernels=("fwd", "nope")), "--kernels", "nope"),
    (dict(kernels=()), "--kernels", "unknown kernel"),
    (dict(op="flash"), "--op", "unknown operator 'flash'"),
    (dict(op="moda-fa4", shape=(("L", 0),)), "--L", "no depth launches at L=0"),
    (dict(op="moda-overlap", kernels=("fwd_ctas", "fwd")), "--kernels", "moda-overlap tunes only"),
    (dict(kernels=("bwd_ctas",)), "--kernels", "moda-overlap's groups"),
    (dict(dtype="int8"), "--dtype", "int8"),
    (dict(vary="T", preset="paper"), "--preset", "not both"),
    (dict(preset="huge"), "--preset", "unknown preset 'huge'"),
    (dict(vary="C"), "--vary", "C is the chunk"),
    (dict(values=(1024,)), "--values", "needs --vary"),
    (dict(shape=(("d", 48),)), "--d", "head dim 48"),
    (dict(min_gain=1.5), "--min-gain", "margin"),
    (dict(shape=(("S", 2),)), "", "unknown shape field"),
])
def test_tune_spec_names_the_option_it_refuses(kw, option, words):
    with pytest.raises(SpecError, match=words) as err:
        TuneSpec(**kw)
    assert err.value.option == option


class Recorder:
    """bench.tune.TuneReporter that records what it is told."""

    def __init__(self):
        self.events = []

    def start(self, spec, gpu, shapes, points, cache_path):
        self.events.append(("start", gpu, shapes, points))

    def cached(self, p, changes):
        self.events.append(("cached", p.T))

    def failed(self, p, error):
        self.events.append(("failed", p.T, error))

    def tuned(self, p, result, changes, default):
        self.events.append(("tuned", p.T, result.decision))

    @contextlib.contextmanager
    def progress(self, p):
        yield (lambda kernel, n, stats: self.events.append(("plan", p.T, kernel)), lambda cfg, ms, note: None)


def test_run_tuning_tunes_each_bucket_once_then_reads_the_cache(tmp_path, monkeypatch):
    made = fake_tuning_device(monkeypatch, lambda shape: FakeTimer())
    spec = TuneSpec(shape=(("G", 8), ("L", 64), ("Hk", 2)), vary="T", values=(1000, 1024, 2048), kernels=("fwd",),
                    budget=4, cache=tmp_path / "c.json", out=tmp_path / "tune.csv")
    seen = Recorder()
    run = tune_run.run_tuning(spec, seen)
    assert [s.T for s in made] == [1024, 2048] and run.failures == 0 and run.cache_path == tmp_path / "c.json"
    assert seen.events == [("start", "Fake GPU", 2, 3), ("plan", 1024, "fwd"), ("tuned", 1024, "tuned"),
                           ("plan", 2048, "fwd"), ("tuned", 2048, "tuned")]
    df = pd.read_csv(spec.out)
    assert list(df["T"]) == [1024, 2048] and set(df["status"]) == {"ok"} and (df["min_gain"] == 0.02).all()
    assert (df["speedup"] == df["default_ms"] / df["tuned_ms"]).all() and len(run.changes) == 2
    again = Recorder()
    run = tune_run.run_tuning(spec, again)
    assert [e[0] for e in again.events] == ["start", "cached", "cached"] and len(made) == 2
    assert [r["status"] for r in run.rows] == ["cached", "cached"] and all(c.endswith("(cached)") for c in run.changes)


def test_run_tuning_without_cuda_is_a_tune_error(monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(tune_run.TuneError, match="needs a CUDA GPU") as err:
        tune_run.run_tuning(TuneSpec(shape=(("T", 256),)), Recorder())
    assert err.value.code == 2


# ----------------------------------------------------------------------------- GateSpec
def test_gate_spec_checks_and_policy(tmp_path):
    base = tmp_path / "b.csv"
    with pytest.raises(SpecError, match="give --current") as err:
        GateSpec(baseline=base)
    assert err.value.option == "--current"
    with pytest.raises(SpecError, match="non-negative") as err:
        GateSpec(baseline=base, current=base, threshold=-0.1)
    assert err.value.option == "--threshold"
    with pytest.raises(ValueError):
        GateSpec(baseline=base, current=base, metric="speed")
    assert GateSpec(baseline=base, run=True).current_csv == GATE_CURRENT
    spec = GateSpec(baseline=base, current=tmp_path / "c.csv", metric="ratio-best", threshold=0.03)
    assert spec.current_csv == tmp_path / "c.csv" and spec.policy()["metric"] == "ratio-best"
    assert set(spec.policy()) <= set(inspect.signature(compare).parameters)


@pytest.fixture
def rng():
    return np.random.default_rng(57)


class FixedRecheck:
    """bench.gate.Recheck answering with fixed rows; records what it was asked."""

    def __init__(self, rows):
        self.rows, self.asked = rows, []

    def plan(self, first):
        self.asked.append(("plan", len(first)))
        return f"{len(self.rows)} chosen row(s)", self.rows

    def merge(self, first, new):
        self.asked.append(("merge", len(first), len(new)))
        return pd.concat([first[first["provider"] != "moda"], new], ignore_index=True)


@pytest.mark.parametrize("again", [0, 1])
def test_measure_runs_the_baseline_then_what_the_recheck_chooses(rng, tmp_path, monkeypatch, again):
    """bench.gate.measure with the runner stubbed: one run of the baseline's points, then (when the
    recheck chooses rows) one run of those rows per recheck round, merged as the recheck says."""
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    calls = []

    def run_sweep(points, spec, csv_path, *, sweep_name, **kw):
        calls.append((sorted(spec.providers), [p.T for p in points], spec.health))
        rows = make_run(rng, providers={p: 1.0 for p in spec.providers}, timestamp=now_iso(),
                        configs=[{c: p.to_dict()[c] for c in schema.CONFIG_COLUMNS} for p in points])
        rows.to_csv(csv_path, mode="a", header=not csv_path.exists(), index=False)

    monkeypatch.setattr(runner, "run_sweep", run_sweep)
    base = make_run(rng)
    chosen = base[base["provider"].isin(["moda", "fa2"])].head(2 * again)
    recheck = FixedRecheck(chosen)
    spec = GateSpec(baseline=tmp_path / "b.csv", current=tmp_path / "cur.csv", run=True, recheck_rounds=1)
    out = gate_run.measure(spec, base, recheck, health="healthy", log=lambda m: None)
    assert out == spec.current_csv and out.exists()
    assert calls[0] == (["fa2", "moda", "moda-chunk"], sorted(set(base["T"])), "healthy")
    assert len(calls) == 1 + again and recheck.asked[0] == ("plan", len(base))
    if again:
        assert calls[1][0] == sorted(set(chosen["provider"])) and recheck.asked[1][0] == "merge"
        assert not list(tmp_path.glob(".gate-*"))
    calls.clear()
    logged = []
    spec = GateSpec(baseline=tmp_path / "b.csv", current=tmp_path / "cur.csv", run=True)   # 2 rounds, x3 each
    gate_run.measure(spec, base, FixedRecheck(chosen), health="healthy", log=logged.append)
    assert len(calls) == 1 + 2 * again
    assert [m.split("again (")[1].split(")")[0] for m in logged if "again (" in m] == \
        ["round 1 of at most 2, up to 180 s a point", "round 2 of at most 2, up to 540 s a point"][:2 * again]


def test_gate_spec_rejects_bad_recheck_settings(tmp_path):
    with pytest.raises(SpecError, match="recheck rounds"):
        GateSpec(baseline=tmp_path / "b.csv", run=True, recheck_rounds=-1)
    with pytest.raises(SpecError, match="recheck time"):
        GateSpec(baseline=tmp_path / "b.csv", run=True, recheck_time=0.5)
