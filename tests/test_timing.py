"""The measurement core of moda_bench.timing: statistics, the stopping rule, interleaved rounds and
ratio intervals on the CPU with fake sample sources and a fake clock; the CUDA timers under `gpu`."""
from __future__ import annotations

import math

import numpy as np
import pytest

from moda_bench import timing
from moda_bench.timing import RoundRule, StopRule


class FakeClock:
    """A clock that only moves when a fake sample says so."""

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def source(values, clock: FakeClock, overhead_s: float = 0.0):
    """A sample function returning the given values in turn (cycling), advancing the clock by each
    sample plus overhead_s; .calls counts the calls."""
    values = list(values)

    def sample():
        v = values[sample.calls % len(values)]
        sample.calls += 1
        clock.t += v / 1e3 + overhead_s
        return v
    sample.calls = 0
    return sample


# ----------------------------------------------------------------------------- statistics

def test_quantile_matches_numpy_linear():
    rng = np.random.default_rng(1)
    for n in (1, 2, 5, 10, 37):
        x = sorted(rng.lognormal(size=n))
        for q in (0.0, 0.2, 0.5, 0.8, 1.0):
            assert timing.quantile(x, q) == pytest.approx(float(np.quantile(x, q)), rel=1e-12)
    with pytest.raises(ValueError):
        timing.quantile([], 0.5)


def test_summarize_reports_quantiles_and_spread():
    m = timing.summarize([5.0, 1.0, 2.0, 4.0, 3.0], stop_reason="noise", timer="eager")
    assert (m.median_ms, m.p20_ms, m.p80_ms, m.n_samples) == (3.0, 1.8, 4.2, 5)
    assert m.spread == pytest.approx((4.2 - 1.8) / 3.0)
    assert m.samples_ms == [5.0, 1.0, 2.0, 4.0, 3.0]   # kept in the order measured
    row = m.row()
    assert row["noise_pct"] == pytest.approx(80.0) and row["stop_reason"] == "noise" and row["timer"] == "eager"
    assert set(row) == {"median_ms", "p20_ms", "p80_ms", "n_samples", "noise_pct", "stop_reason", "timer"}
    assert timing.summarize([2.0, 2.0]).spread == 0.0
    with pytest.raises(ValueError):
        timing.summarize([])


# ----------------------------------------------------------------------------- stopping rule

def test_constant_samples_stop_at_min_samples_when_min_time_is_spent():
    clock = FakeClock()
    m = timing.collect(source([1.0], clock), StopRule(min_samples=10, min_time_s=0.0), clock=clock)
    assert m.n_samples == 10 and m.stop_reason == "noise" and m.spread == 0.0
    clock = FakeClock()
    m = timing.collect(source([1.0], clock), StopRule(min_samples=10, min_time_s=0.05), clock=clock)
    assert m.n_samples == 50 and m.stop_reason == "noise"        # 50 x 1 ms of sample time


def test_a_slow_call_still_gets_min_samples_past_the_cap():
    clock = FakeClock()
    m = timing.collect(source([400.0], clock, overhead_s=0.01), StopRule(min_samples=10, max_time_s=1.0), clock=clock)
    assert m.n_samples == 10 and m.stop_reason == "max_time"
    assert m.elapsed_s == pytest.approx(10 * 0.41)


def test_very_noisy_samples_run_to_the_cap():
    clock = FakeClock()
    noisy = np.random.default_rng(3).lognormal(0.0, 1.0, size=5000)
    rule = StopRule(min_samples=10, min_time_s=0.01, max_time_s=0.2)
    m = timing.collect(source(noisy, clock), rule, clock=clock)
    assert m.stop_reason == "max_time"
    assert m.elapsed_s >= 0.2 and m.elapsed_s - 0.2 < noisy.max() / 1e3 + 1e-12
    assert m.spread > 0.5


def test_samples_whose_spread_keeps_growing_run_to_the_cap():
    clock = FakeClock()
    drift = [1.002 ** i for i in range(100_000)]           # a clock that keeps sinking: the spread grows
    m = timing.collect(source(drift, clock), StopRule(max_time_s=5.0, min_time_s=0.1), clock=clock)
    assert m.stop_reason == "max_time"


def test_noisy_but_stationary_samples_stop_when_the_spread_is_stable():
    clock = FakeClock()
    noisy = np.random.default_rng(0).normal(1.0, 0.05, size=100_000).clip(0.5)
    rule = StopRule(min_samples=10, min_time_s=0.05, max_time_s=1e6)
    m = timing.collect(source(noisy, clock), rule, clock=clock)
    assert m.stop_reason == "stable"
    assert 50 <= m.n_samples < 100_000
    assert m.spread == pytest.approx(2 * 0.8416 * 0.05, rel=0.35)   # p80 - p20 of a normal: 1.683 sigma


def test_stop_rule_order_of_conditions():
    r = StopRule(min_samples=3, min_time_s=1.0, max_time_s=5.0, max_noise=0.01, window=2, stable_tol=0.1,
                 max_samples=100)
    assert r.check(2, 10.0, 10.0, [0.0, 0.0]) is None                # min_samples first, even past the cap
    assert r.check(3, 10.0, 5.0, [0.0] * 3) == "max_time"
    assert r.check(100, 0.0, 0.0, [0.5] * 100) == "max_samples"
    assert r.check(3, 0.5, 0.0, [0.0] * 3) is None                   # min time not yet spent
    assert r.check(3, 1.0, 0.0, [0.3, 0.2, 0.005]) == "noise"
    assert r.check(3, 1.0, 0.0, [0.9, 0.50, 0.52]) == "stable"
    assert r.check(3, 1.0, 0.0, [0.5, 0.20, 0.5]) is None


def test_warmup_estimate_skips_the_first_compiling_call():
    clock = FakeClock()
    sample = source([500.0] + [2.0] * 1000, clock)
    est = timing.warmup(sample, warmup_s=0.02, clock=clock)
    assert est == 2.0
    assert sample.calls >= 2 and clock.t >= 0.02


# ----------------------------------------------------------------------------- ratio CIs

def test_t_quantiles_match_tables():
    for df, want in ((1, 12.7062047), (2, 4.3026527), (9, 2.2621572), (30, 2.0422725), (200, 1.9718962)):
        assert timing.t_two_sided(0.95, df) == pytest.approx(want, rel=1e-6)
    assert timing.t_two_sided(0.99, 9) == pytest.approx(3.2498355, rel=1e-6)
    stats = pytest.importorskip("scipy.stats")
    for df in (3, 4, 7, 10, 51):
        for conf in (0.8, 0.9, 0.95):
            assert timing.t_two_sided(conf, df) == pytest.approx(stats.t.ppf((1 + conf) / 2, df), rel=1e-8)


def _pair(ratio, n, sigma, seed, drift=0.0):
    rng = np.random.default_rng(seed)
    base = 2.0 * np.exp(drift * rng.standard_normal(n))          # shared by num and den of a round
    den = base * np.exp(sigma * rng.standard_normal(n))
    num = ratio * base * np.exp(sigma * rng.standard_normal(n))
    return num, den


@pytest.mark.parametrize("method", ["t", "bootstrap"])
def test_ratio_ci_contains_the_ratio_and_shrinks_like_one_over_sqrt_n(method):
    widths = {50: [], 800: []}
    for n in widths:
        for seed in range(8):
            num, den = _pair(1.25, n, 0.02, seed=seed)
            r, lo, hi = timing.ratio_ci(num, den, method=method)
            assert lo < 1.25 < hi and lo <= r <= hi
            widths[n].append(hi - lo)
    assert np.mean(widths[800]) / np.mean(widths[50]) == pytest.approx(0.25, rel=0.2)   # sqrt(50 / 800)


@pytest.mark.parametrize("method", ["t", "bootstrap"])
def test_identical_rounds_give_a_degenerate_interval_at_one(method):
    x = [1.0, 1.3, 0.9, 2.0, 1.1]
    assert timing.ratio_ci(x, x, method=method) == (1.0, 1.0, 1.0)


def test_paired_rounds_cancel_shared_drift():
    num, den = _pair(1.25, 20, 0.005, seed=2, drift=0.3)          # 30% drift between rounds, 0.5% noise
    r, lo, hi = timing.ratio_ci(num, den)
    assert lo < 1.25 < hi and (hi - lo) / r < 0.01
    unpaired = timing.ratio_ci(num, np.roll(den, 7))               # pairs broken: the drift shows
    assert unpaired[2] - unpaired[1] > 10 * (hi - lo)


def test_t_interval_coverage_matches_the_confidence():
    hits = sum(lo <= 1.25 <= hi for lo, hi in
               (timing.ratio_ci(*_pair(1.25, 10, 0.03, seed=s), conf=0.9)[1:] for s in range(600)))
    assert 0.86 <= hits / 600 <= 0.94


def test_bootstrap_is_reproducible_per_seed():
    num, den = _pair(1.1, 15, 0.05, seed=4)
    a = timing.ratio_ci(num, den, method="bootstrap", seed=1)
    assert a == timing.ratio_ci(num, den, method="bootstrap", seed=1)
    assert a[1:] != timing.ratio_ci(num, den, method="bootstrap", seed=2)[1:]
    assert a[0] == pytest.approx(np.median(num) / np.median(den))


def test_ratio_ci_rejects_bad_input():
    with pytest.raises(ValueError):
        timing.ratio_ci([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        timing.ratio_ci([1.0, -2.0], [1.0, 1.0])
    with pytest.raises(ValueError):
        timing.ratio_ci([1.0, 2.0], [1.0, 1.0], method="magic")
    r, lo, hi = timing.ratio_ci([2.0], [1.0])
    assert r == pytest.approx(2.0) and math.isnan(lo) and math.isnan(hi)


# ----------------------------------------------------------------------------- interleaving

def _recording(order: list, clock: FakeClock, ms: dict):
    def make(name):
        vals = ms[name] if isinstance(ms[name], list) else [ms[name]]

        def sample():
            v = vals[sum(1 for o in order if o == name) % len(vals)]
            order.append(name)
            clock.t += v / 1e3
            return v
        return sample
    return {name: make(name) for name in ms}


def test_interleave_runs_rounds_in_order_and_keeps_round_medians():
    order, clock = [], FakeClock()
    samplers = _recording(order, clock, {"A": 1.0, "B": [1.2, 1.3, 1.25], "C": 2.0})
    res = timing.interleave(samplers, baseline="A", reps=3, rule=RoundRule(min_rounds=4, min_samples=10), clock=clock)
    assert order[:9] == ["A"] * 3 + ["B"] * 3 + ["C"] * 3
    assert res.rounds == 4 and res.reps == 3                       # ceil(10 / 3) = 4 rounds
    assert res.stop_reason == "ci"
    assert res.round_medians["B"] == [1.25] * 4 and res.round_medians["A"] == [1.0] * 4
    assert res.measurements["B"].n_samples == 12 and sorted(res.measurements["B"].samples_ms)[:4] == [1.2] * 4
    assert res.ratios["C"] == pytest.approx((2.0, 2.0, 2.0))
    assert "A" not in res.ratios
    assert res.ratio_row("B")["ratio"] == pytest.approx(1.25) and math.isnan(res.ratio_row("A")["ratio"])


def test_interleave_honours_min_samples_with_one_rep_for_slow_calls():
    order, clock = [], FakeClock()
    samplers = _recording(order, clock, {"slow": 400.0, "slower": [480.0, 520.0]})
    res = timing.interleave(samplers, baseline="slow", reps=1,
                            rule=RoundRule(min_rounds=3, max_time_s=1.0, order="fixed"), clock=clock)
    assert res.rounds == 10 and res.stop_reason == "max_time"
    assert order == ["slow", "slower"] * 10
    assert res.measurements["slower"].n_samples == 10


def test_interleave_shuffles_later_rounds_so_no_callable_always_follows_the_same_one():
    order, clock = [], FakeClock()
    names = ["A", "B", "C", "D"]
    res = timing.interleave(_recording(order, clock, {n: 1.0 for n in names}), baseline="A",
                            rule=RoundRule(min_rounds=40, min_samples=1, max_time_s=1e9, ci_tol=1.0), clock=clock)
    rounds = [order[i:i + 4] for i in range(0, len(order), 4)]
    assert rounds[0] == names and all(sorted(r) == names for r in rounds) and len(rounds) == res.rounds == 40
    follows = {(r[i - 1], r[i]) for r in rounds for i in range(1, 4)}
    assert follows == {(a, b) for a in names for b in names if a != b}      # every pair, both ways
    again = []
    timing.interleave(_recording(again, FakeClock(), {n: 1.0 for n in names}), baseline="A",
                      rule=RoundRule(min_rounds=40, min_samples=1, max_time_s=1e9, ci_tol=1.0), clock=FakeClock())
    assert again == order                                                   # seeded: the same run twice
    with pytest.raises(ValueError, match="round order"):
        timing.interleave(_recording([], FakeClock(), {"A": 1.0}), rule=RoundRule(order="random"))


def test_interleave_keeps_going_until_the_ratio_ci_is_narrow():
    clock = FakeClock()
    rng = np.random.default_rng(5)
    noisy = list(1.5 * np.exp(0.03 * rng.standard_normal(10_000)))
    samplers = _recording([], clock, {"base": 1.0, "new": noisy})
    res = timing.interleave(samplers, baseline="base", rule=RoundRule(ci_tol=0.01, max_time_s=1e9), clock=clock)
    r, lo, hi = res.ratios["new"]
    assert res.stop_reason == "ci" and res.rounds > 10
    assert (hi - lo) / 2 <= 0.01 * r and lo < 1.5 < hi
    capped = timing.interleave(_recording([], FakeClock(), {"base": 1.0, "new": noisy}), baseline="base",
                               rule=RoundRule(ci_tol=1e-6, max_rounds=40))
    assert capped.stop_reason == "max_rounds" and capped.rounds == 40


def test_interleave_times_each_rounds_reps_as_one_batch():
    class Batched:
        def __init__(self, ms):
            self.ms, self.sizes = ms, []

        def batch(self, n):
            self.sizes.append(n)
            return [self.ms] * n

        def __call__(self):
            raise AssertionError("interleave must use batch(reps)")
    a, b = Batched(1.0), Batched(3.0)
    res = timing.interleave({"a": a, "b": b}, baseline="a", reps=4, rule=RoundRule(min_rounds=3, min_samples=1))
    assert a.sizes == [4, 4, 4] and b.sizes == [4, 4, 4]
    assert res.ratios["b"] == pytest.approx((3.0, 3.0, 3.0))


def test_interleave_without_baseline_and_bad_baseline():
    clock = FakeClock()
    res = timing.interleave(_recording([], clock, {"A": 1.0}), rule=RoundRule(min_rounds=5, min_samples=1), clock=clock)
    assert res.stop_reason == "rounds" and res.rounds == 5 and res.ratios == {}
    with pytest.raises(ValueError):
        timing.interleave(_recording([], clock, {"A": 1.0}), baseline="Z")
    with pytest.raises(ValueError):
        timing.interleave({})


def test_choose_reps():
    assert timing.choose_reps(400.0) == 1
    assert timing.choose_reps(20.0) == 2
    assert timing.choose_reps(1.0) == 5
    assert timing.choose_reps(0.0) == 5


def test_timer_names_are_checked_before_touching_cuda():
    with pytest.raises(ValueError, match="eager, graph"):
        timing.make_sampler(lambda: None, "cupti")
    with pytest.raises(ValueError):
        timing.make_timer("cupti")


def test_make_inputs_still_defaults_to_bf16():
    import torch
    x = timing.make_inputs(1, 8, 4, 2, 16, 2, device="cpu", seed=0)
    y = timing.make_inputs(1, 8, 4, 2, 16, 2, device="cpu", seed=0)
    assert x["q"].dtype == torch.bfloat16 and x["k_depth"].shape == (1, 8, 2, 2, 16)
    assert torch.equal(x["q"], y["q"]) and len(timing.grad_inputs(x)) == 5


# ----------------------------------------------------------------------------- GPU

@pytest.mark.gpu
@pytest.mark.parametrize("timer", ["eager", "graph"])
def test_time_fn_on_the_gpu(timer):
    import torch
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    m = timing.time_fn(lambda: a @ a, timer=timer, rule=StopRule(min_time_s=0.05, max_time_s=2.0))
    assert m.n_samples >= 10 and m.timer == timer and 0 < m.p20_ms <= m.median_ms <= m.p80_ms
    tflops = 2 * 4096 ** 3 / (m.median_ms * 1e-3) / 1e12
    assert 10 < tflops < 5000


@pytest.mark.gpu
def test_graph_timer_grads_fresh_or_accumulated():
    import torch
    w = torch.randn(1024, 1024, device="cuda", requires_grad=True)
    x = torch.randn(256, 1024, device="cuda")

    def fn():
        (x @ w).sum().backward()
    fn()
    want = w.grad.clone()                                            # one eager backward
    w.grad = None
    fresh = timing.make_sampler(fn, "graph", grad_to_none=[w])
    assert all(ms > 0 for ms in fresh.batch(3))
    torch.testing.assert_close(w.grad, want, rtol=1e-4, atol=1e-3)   # rewritten each replay, not summed
    acc = timing.make_sampler(fn, "graph", grad_to_none=[w], graph_grads="accumulate")
    g = w.grad
    before = g.clone()
    acc()
    assert w.grad is g and not torch.equal(g, before)               # same tensor, added into
    torch.testing.assert_close(g - before, want, rtol=1e-4, atol=1e-3)


@pytest.mark.gpu
def test_graph_capture_failure_is_a_clear_error():
    import torch
    a = torch.randn(256, device="cuda")

    def fn():
        return (a * 2).sum().item()                                  # a host sync: not capturable
    with pytest.raises(timing.GraphCaptureError, match="CUDA graph capture failed"):
        timing.make_sampler(fn, "graph")
    assert timing.time_fn(fn, rule=StopRule(min_time_s=0.0)).n_samples >= 10   # eager still works


@pytest.mark.gpu
def test_time_interleaved_ratio_of_two_matmuls():
    import torch
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    res = timing.time_interleaved({"small": lambda: a @ a, "big": lambda: b @ b}, baseline="small",
                                  timer="graph", rule=RoundRule(ci_tol=0.02, max_time_s=10))
    r, lo, hi = res.ratios["big"]
    assert 4 < r < 12 and lo <= r <= hi and res.rounds >= 10


def test_max_rel_err_in_chunks():
    """The chunked reduction (large same-shaped tensors) equals the one-shot float64 norm, and a
    non-finite value in any chunk gives NaN."""
    import torch
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(301, 17, generator=g)
    out = ref + 1e-3 * torch.randn(301, 17, generator=g)
    whole = timing.max_rel_err(out, ref)
    assert whole == pytest.approx(float((out.double() - ref.double()).norm() / ref.double().norm()), rel=1e-12)
    for chunk in (1, 100, 5116, 10**6):
        assert timing.max_rel_err(out, ref, chunk=chunk) == pytest.approx(whole, rel=1e-9)
    out[300, 16] = float("inf")
    assert math.isnan(timing.max_rel_err(out, ref, chunk=100))
    assert math.isnan(timing.max_rel_err(out, ref))


def test_interleave_announces_each_samplers_repetitions():
    """on_switch(name) before a sampler's repetitions of a round, on_switch(None) after them: what
    was announced while each repetition ran is its own name."""
    clock, seen, during = FakeClock(), [], []
    now = [None]

    def sampler(name, ms):
        def call():
            during.append((name, now[0]))
            clock.t += ms / 1e3
            return ms
        return call

    def switch(name):
        now[0] = name
        seen.append(name)
    res = timing.interleave({"A": sampler("A", 1.0), "B": sampler("B", 2.0)}, baseline="A", reps=2,
                            rule=RoundRule(min_rounds=3, min_samples=1), clock=clock, on_switch=switch)
    assert res.rounds >= 3 and all(name == announced for name, announced in during)
    assert seen[:4] == ["A", None, "B", None] and len(seen) == 4 * res.rounds and now[0] is None
