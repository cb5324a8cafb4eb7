"""The tuner's decision (CPU, fake timers): the search's winner is timed against the built-in
default in interleaved rounds and kept only if its time ratio's 95% upper bound is below
1 - min_gain; the decision, both times and the interval land in the cache entry and the CSV.
Also: T buckets do not lend entries to each other, and `tune` plans T=1024 and T=65536."""
from __future__ import annotations

import json
import math
import time

import pytest
import torch
from helpers import H100_SMEM, fake_tuning_device

from moda_bench import tuning as tu
from moda_bench.kernels.moda.config import default_config, resolve_config
from moda_bench.kernels.moda.validate import MoDAShape
from moda_bench.timing import RoundRule

TEN_ROUNDS = RoundRule(min_rounds=10, max_rounds=10)


def shape(T=1024, G=8, L=64, d=64, B=1, Hk=2) -> MoDAShape:
    return MoDAShape(B=B, T=T, Hq=G * Hk, Hk=Hk, d=d, L=L)


pytestmark = pytest.mark.usefixtures("isolated_tuning")  # conftest: no user cache, no shipped configs


class NoisyTimer(tu.Timer):
    """Search (final=False): block_n=32 is the best fwd config, deterministically. Final timings
    (rounds of candidate, default): the default takes drift(round), the candidate true_ratio x
    drift(round) x exp(+-noise), the sign alternating by round. The drift (up to +-30%, a clock
    that wanders) is shared by the round and cancels in the paired ratios; the noise does not:
    the log ratios are log(true_ratio) +- noise."""

    def __init__(self, true_ratio: float, noise: float, rule: RoundRule = TEN_ROUNDS, sh: MoDAShape = shape()):
        self.true_ratio, self.noise, self.rule = true_ratio, noise, rule
        self.default = default_config(sh)
        self.finals = []

    def time(self, cfg, pass_, final=False):
        if not final:
            return 1.0 + (cfg.block_n - 32) / 1000 + (cfg.num_warps != self.default.num_warps) / 100
        rnd = len(self.finals) // 2
        self.finals.append(cfg == self.default)
        drift = 1.0 + 0.3 * math.sin(rnd)
        if cfg == self.default:
            return drift
        return self.true_ratio * drift * math.exp(self.noise if rnd % 2 else -self.noise)


def _tune(timer, **kw):
    return tu.tune_shape(shape(), "bfloat16", timer, kernels=("fwd",), budget=8, smem_limit=H100_SMEM, **kw)


def test_a_candidate_faster_only_within_the_noise_is_rejected():
    timer = NoisyTimer(true_ratio=0.97, noise=0.10)
    res = _tune(timer)
    # the point estimate says faster than the margin, the interval does not
    assert res.ratio < 1 - tu.DEFAULT_MIN_GAIN < res.ratio_hi
    assert res.decision == "default" and res.config == default_config(shape())
    assert res.candidate is not None and res.candidate.block_n == 32 and res.ratio == pytest.approx(0.97)
    assert res.tuned_ms == res.default_ms and res.speedup == 1.0 and res.compare_rounds == 10
    assert any("keeping default" in n and "95% CI" in n for n in res.notes)
    # paired rounds: the first candidate then default, each later one both in a shuffled order (timing.RoundRule)
    rounds = [timer.finals[i:i + 2] for i in range(0, len(timer.finals), 2)]
    assert len(rounds) == 10 and rounds[0] == [False, True] and all(sorted(r) == [False, True] for r in rounds)
    assert [True, False] in rounds                                   # the order does change


def test_a_candidate_inside_the_margin_is_rejected_even_without_noise():
    res = _tune(NoisyTimer(true_ratio=0.99, noise=0.0))
    assert res.ratio == pytest.approx(0.99) and res.ratio_hi == pytest.approx(0.99)
    assert res.decision == "default"
    assert _tune(NoisyTimer(true_ratio=0.99, noise=0.0), min_gain=0.005).decision == "tuned"  # smaller margin


def test_a_clearly_faster_candidate_is_kept():
    res = _tune(NoisyTimer(true_ratio=0.80, noise=0.10))
    assert res.decision == "tuned" and res.config == res.candidate and res.config.block_n == 32
    assert res.ratio_lo < res.ratio < res.ratio_hi < 1 - tu.DEFAULT_MIN_GAIN
    assert res.tuned_ms == res.candidate_ms < res.default_ms and res.speedup > 1


class Flat(NoisyTimer):
    """Every candidate but the default takes twice its time, on every pass."""

    def time(self, cfg, pass_, final=False):
        if final:
            self.finals.append(cfg == self.default)
        return 1.0 if cfg == self.default else 2.0


def test_nothing_better_than_the_default_compares_the_closest_candidate():
    timer = Flat(1.0, 0.0)
    res = _tune(timer)
    # the evidence for the kept default: its closest candidate's fwd+bwd ratio, with an interval
    assert res.decision == "default" and res.config == default_config(shape())
    assert res.candidate is not None and res.candidate != res.config and res.compare_rounds == 10
    assert res.ratio == pytest.approx(2.0) and res.ratio_lo == pytest.approx(2.0) == res.ratio_hi
    assert res.tuned_ms == res.default_ms and res.speedup == 1.0
    assert any(n.startswith("the search found nothing faster") and "closest candidates" in n for n in res.notes)
    assert any("keeping default" in n for n in res.notes)


def test_nothing_better_without_the_confirmation_skips_the_comparison():
    timer = Flat(1.0, 0.0)
    res = _tune(timer, confirm_closest=False)
    assert res.decision == "default" and res.candidate is None and res.compare_rounds == 0
    assert res.ratio == 1.0 and math.isnan(res.ratio_hi)
    assert timer.finals == [True]  # the default's fwd+bwd time, once


def test_a_closest_candidate_that_clears_the_margin_on_fwdbwd_is_kept():
    class SlowFwdFastBoth(NoisyTimer):  # slower on its own pass, faster over fwd+bwd: the comparison decides
        def time(self, cfg, pass_, final=False):
            if cfg == self.default:
                return 1.0
            return 0.8 if final else 1.01

    res = _tune(SlowFwdFastBoth(1.0, 0.0))
    assert res.decision == "tuned" and res.config == res.candidate != default_config(shape())
    assert res.ratio == pytest.approx(0.8)


def test_the_decision_and_the_interval_are_stored_in_the_cache_entry(tmp_path):
    path = tmp_path / "c.json"
    rejected = _tune(NoisyTimer(true_ratio=0.97, noise=0.10))
    key, _ = tu.save_result(rejected, path)
    entry = json.loads(path.read_text())["entries"][key]
    assert entry["decision"] == "default" and entry["config"] == default_config(shape()).to_dict()
    assert entry["candidate_config"] == rejected.candidate.to_dict()
    assert entry["candidate_ms"] == pytest.approx(rejected.candidate_ms) and entry["tuned_ms"] == entry["default_ms"]
    assert entry["ratio_lo"] < entry["ratio"] < entry["ratio_hi"] and entry["min_gain"] == 0.02
    assert entry["compare_rounds"] == 10
    # the stored default is what a look-up gets
    assert tu.load(path)(shape(), "bfloat16") == default_config(shape())
    none_found = tu.TuneResult(shape(), "bfloat16", default_config(shape()), 1.0, 1.0, 0.0, decision="default")
    key2, _ = tu.save_result(none_found, tmp_path / "d.json")
    e2 = json.loads((tmp_path / "d.json").read_text())["entries"][key2]
    assert e2["candidate_config"] is None and e2["ratio_hi"] is None  # NaN is not written (strict JSON)


def test_cuda_timer_compare_interleaves_candidate_and_default():
    """The device timer's comparison path on the CPU: samplers from `sampler_fn` (the GPU build
    uses timing.make_sampler), warm-up, then interleaved rounds."""
    def attention(q, k, v, k_depth=None, v_depth=None, *, config=None):
        time.sleep(0.008 if config.block_n == 64 else 0.002)  # the candidate (block_n=32) is 4x faster
        return q * 1.0

    made = []

    def sampler_fn(fn, timer="eager", grad_to_none=None):
        made.append(timer)

        def sample():
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3

        return sample

    sh = shape(T=8, G=2, L=2, d=16, Hk=1)
    timer = tu.CudaTimer(sh, "float32", device="cpu", attention=attention, sampler_fn=sampler_fn,
                         final_warmup_ms=1, rule=RoundRule(min_rounds=4, max_rounds=4, min_samples=1))
    base = default_config(sh)
    cmp = timer.compare(base.replace(block_n=32), base)
    assert made == ["eager", "eager"] and cmp.rounds == 4
    assert cmp.ratio < 0.7 and cmp.candidate_ms < cmp.default_ms and cmp.keeps_candidate(0.02)


# ----------------------------------------------------------------------------- buckets

def test_an_entry_serves_only_its_own_T_bucket(tmp_path):
    path = tmp_path / "c.json"
    sh = shape(T=4096)
    tuned = default_config(sh).replace(num_warps=8)
    key, _ = tu.save_result(tu.TuneResult(sh, "bfloat16", tuned, 2.0, 1.5, 1.0), path)
    assert key.endswith("T<=4096")
    tu.use(path)
    assert resolve_config(shape(T=3000), torch.bfloat16) == tuned
    for T in (1024, 2048, 8192, 65536):  # neighbours of the bucket get the default, not the 4096 entry
        assert resolve_config(shape(T=T), torch.bfloat16) == default_config(shape(T=T)), T


# ----------------------------------------------------------------------------- command

def test_tune_plans_T_1024_and_65536_and_the_full_preset():
    from moda_bench.bench.runner import Point
    from moda_bench.bench.tune import PRESETS, group_by_key, plan_tuning_points, point_shape
    pts = plan_tuning_points(Point(), "T", [1024, 65536], None)
    assert [p.T for p in pts] == [1024, 65536]
    groups = group_by_key(pts, lambda p: tu.cache_key(point_shape(p), "bfloat16", gpu="g"))
    assert [k.split("|")[-1] for k in groups] == ["T<=1024", "T<=65536"]
    full = plan_tuning_points(Point(), None, None, "full")
    Ts = sorted({p.T for p in full if p.G == 8 and p.L == 64})
    assert Ts == [1024, 2048, 4096, 8192, 16384, 32768, 65536]
    assert {p.G for p in full} >= {2, 4, 8, 16, 32} and {p.L for p in full} >= {64, 128, 256}
    paper = plan_tuning_points(Point(), None, None, "paper")
    assert {p.T for p in paper} >= {4096, 65536} and set(PRESETS) >= {"paper", "full"}


def test_min_gain_option_parsing():
    import typer

    from moda_bench.cli.tune import parse_gain
    assert parse_gain("2%") == pytest.approx(0.02) and parse_gain("0.05") == 0.05 and parse_gain("0") == 0
    for bad in ("5", "-1%", "100%", "x"):
        with pytest.raises(typer.BadParameter):
            parse_gain(bad)





def test_tune_command_records_the_decision_in_the_csv(tmp_path, monkeypatch):
    """--vary T --values 1024,65536 with a fake device: T=1024's candidate is faster only within
    the noise (kept default), T=65536's clearly (tuned); --min-gain is passed through."""
    import pandas as pd
    import typer
    from typer.testing import CliRunner

    from moda_bench.cli.tune import tune_command

    def factory(sh):
        return NoisyTimer(true_ratio=0.97 if sh.T == 1024 else 0.8, noise=0.1, sh=sh)

    made = fake_tuning_device(monkeypatch, factory)
    app = typer.Typer()
    app.command()(tune_command)
    cache, out = tmp_path / "c.json", tmp_path / "tune.csv"
    res = CliRunner().invoke(app, ["--vary", "T", "--values", "1024,65536", "--kernels", "fwd", "--budget", "6",
                                   "--min-gain", "1%", "--cache", str(cache), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert [s.T for s in made] == [1024, 65536] and "1.0%" in res.output
    df = pd.read_csv(out).set_index("T")
    assert df.loc[1024, "decision"] == "default" and df.loc[65536, "decision"] == "tuned"
    assert df.loc[1024, "tuned_ms"] == df.loc[1024, "default_ms"] and df.loc[1024, "speedup"] == 1.0
    assert df.loc[1024, "ratio"] == pytest.approx(0.97)  # faster, but not beyond the noise
    assert df.loc[1024, "ratio_hi"] > 0.99 > df.loc[65536, "ratio_hi"]
    assert (df["min_gain"] == 0.01).all() and "keeping default" in df.loc[1024, "reason"]
    entries = tu.load(cache).entries()
    assert sorted(e["decision"] for e in entries.values()) == ["default", "tuned"]
    res = CliRunner().invoke(app, ["--show", "--cache", str(cache)], env={"COLUMNS": "300"})
    assert res.exit_code == 0 and "tuned" in res.output and "default" in res.output


def test_tune_command_rejects_an_ambiguous_min_gain(tmp_path):
    import typer
    from typer.testing import CliRunner

    from moda_bench.cli.tune import tune_command
    app = typer.Typer()
    app.command()(tune_command)
    res = CliRunner().invoke(app, ["--T", "256", "--min-gain", "5", "--cache", str(tmp_path / "c.json")])
    assert res.exit_code == 2 and "ambiguous" in res.output
