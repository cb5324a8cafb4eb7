"""Timing and input generation shared by sweep, ablate, tune, gate and the health canary.

Owns:
* MoDA inputs and the callable to time (`make_inputs`, `grad_inputs`, `make_pass_fn`,
  `max_rel_err`) and the legacy do_bench timer `measure` (median / p20 / p80, `QUANTILES`).
* The measurement core, in three layers:
  - statistics and stopping rules in pure Python, driven by any sample source and clock so they
    are tested on the CPU: `quantile`, `summarize` -> `Measurement`, `StopRule` + `collect`
    (NVBench-style: sample until min_samples AND min_time AND a stable spread, capped by
    max_time, min_samples always honoured), `RoundRule` + `interleave` (rounds of every
    callable, in a shuffled order after the first, for fair paired ratios) -> `Interleaved`, and
    `ratio_ci` (paired confidence interval of a ratio, from `moda_bench.ratios`);
  - GPU repetition samplers, `make_sampler(fn, "eager" | "graph")`: repetitions queued back
    to back, each with the L2 flushed (a 256 MB buffer zeroed) and timed by CUDA events; "eager"
    counts host launch latency where the host is slower than the GPU, "graph" replays fn captured
    once into a CUDA graph (`GraphCaptureError` when capture fails);
  - the entry points `time_fn`, `time_interleaved` and `make_timer` (the runner's
    `timer(fn, grad_to_none=, warmup_ms=, rep_ms=) -> dict` hook).

Definitions: p20 / median / p80 are linearly interpolated quantiles (numpy's default); spread =
(p80 - p20) / median, reported as noise_pct = 100 * spread. torch is imported lazily.
"""
from __future__ import annotations

import bisect
import functools
import math
import random
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

from moda_bench.ratios import ratio_ci, t_two_sided  # noqa: F401  (part of this module's API)

QUANTILES = [0.5, 0.2, 0.8]
TIMERS = ("eager", "graph")
FLUSH_BYTES = 256 * 1024 * 1024   # > L2 of every current GPU (H100/H200: 50 MB), as triton's do_bench


# ----------------------------------------------------------------------------- MoDA inputs

def make_inputs(B: int, T: int, Hq: int, Hk: int, d: int, L: int, dtype=None,
                device="cuda", requires_grad: bool = True, seed: int | None = None) -> dict:
    """Fresh random MoDA inputs in the user-facing layout (never zeros); dtype default bfloat16.
    Returns dict(q, k, v, k_depth, v_depth, do); k_depth/v_depth are None when L == 0."""
    import torch
    dtype = torch.bfloat16 if dtype is None else dtype
    g = torch.Generator(device=device)
    g.manual_seed(seed if seed is not None else torch.seed() % (2**31))

    def rnd(*shape):
        x = torch.randn(*shape, generator=g, device=device, dtype=torch.float32)
        return x.to(dtype).requires_grad_(requires_grad)

    out = {"q": rnd(B, T, Hq, d), "k": rnd(B, T, Hk, d), "v": rnd(B, T, Hk, d),
           "k_depth": rnd(B, T, L, Hk, d) if L > 0 else None,
           "v_depth": rnd(B, T, L, Hk, d) if L > 0 else None}
    out["do"] = torch.randn(B, T, Hq, d, generator=g, device=device, dtype=torch.float32).to(dtype)
    return out


def grad_inputs(inputs: dict) -> list:
    """The input tensors that receive gradients (everything but `do`)."""
    return [t for name, t in inputs.items() if name != "do" and t is not None and t.requires_grad]


def make_pass_fn(forward: Callable[[], object], inputs: dict, pass_: str) -> Callable[[], object]:
    """Wrap a forward closure into the callable to time for 'fwd' (or 'decode'), 'bwd' or 'fwdbwd'.

    For 'bwd' the forward runs once here and only the backward is timed (retain_graph).
    """
    import torch
    do = inputs["do"]
    if pass_ in ("fwd", "decode"):
        def fn():
            with torch.no_grad():
                return forward()
        return fn
    if pass_ == "fwdbwd":
        def fn():
            out = forward()
            out.backward(do)
        return fn
    if pass_ == "bwd":
        out = forward()

        def fn():
            out.backward(do, retain_graph=True)
        return fn
    raise ValueError(f"pass must be fwd, bwd, fwdbwd or decode, got {pass_!r}")


def measure(fn: Callable[[], object], grad_to_none: list | None = None, warmup_ms: float = 25,
            rep_ms: float = 100) -> dict:
    """Median / p20 / p80 milliseconds of fn through do_bench (L2 flushed each repetition)."""
    from triton.testing import do_bench
    med, p20, p80 = do_bench(fn, warmup=warmup_ms, rep=rep_ms, grad_to_none=grad_to_none, quantiles=QUANTILES)
    return {"median_ms": float(med), "p20_ms": float(p20), "p80_ms": float(p80)}


def max_rel_err(out, ref, chunk: int = 1 << 24) -> float:
    """||out - ref|| / ||ref|| in float64 (NaN if out has non-finite values), `chunk` elements
    at a time for same-shaped tensors: a multi-GB gradient (depth K/V at L=256) never gets a
    float64 copy of itself (a 16 GiB one ran the tuner out of an H100's memory)."""
    if out.shape != ref.shape:   # broadcast against each other: in one piece
        pieces = [(out, ref)]
    else:
        o, r = out.reshape(-1), ref.reshape(-1)
        pieces = ((o[i:i + chunk], r[i:i + chunk]) for i in range(0, max(o.numel(), 1), chunk))
    num = den = 0.0
    for oc, rc in pieces:
        oc, rc = oc.double(), rc.double()
        if not bool(oc.isfinite().all()):
            return float("nan")
        num, den = num + float((oc - rc).square().sum()), den + float(rc.square().sum())
    return math.sqrt(num) / max(math.sqrt(den), 1e-30)


# ----------------------------------------------------------------------------- statistics

def quantile(sorted_values: Sequence[float], q: float) -> float:
    """q-quantile (0..1) of already sorted values, linear interpolation (numpy's default)."""
    n = len(sorted_values)
    if n == 0:
        raise ValueError("quantile of no values")
    pos = q * (n - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, n - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def relative_spread(sorted_values: Sequence[float]) -> float:
    """(p80 - p20) / median of sorted values (0 for a single value; inf for a zero median)."""
    med = quantile(sorted_values, 0.5)
    width = quantile(sorted_values, 0.8) - quantile(sorted_values, 0.2)
    if med <= 0:
        return 0.0 if width == 0 else math.inf
    return width / med


@dataclass
class Measurement:
    """Repetition times of one callable and their summary.

    spread = (p80 - p20) / median. stop_reason says why sampling ended: 'noise' (spread at or
    below StopRule.max_noise), 'stable' (spread stopped changing), 'max_time' / 'max_samples'
    (the cap), or for interleaved rounds 'ci', 'rounds', 'max_time', 'max_rounds'.
    """

    samples_ms: list
    median_ms: float
    p20_ms: float
    p80_ms: float
    n_samples: int
    spread: float
    stop_reason: str = ""
    timer: str = ""
    elapsed_s: float = 0.0          # wall clock spent sampling, warm-up excluded

    def row(self) -> dict:
        """The CSV columns of this measurement (median_ms, p20_ms, p80_ms, n_samples, noise_pct,
        stop_reason, timer)."""
        return {"median_ms": self.median_ms, "p20_ms": self.p20_ms, "p80_ms": self.p80_ms,
                "n_samples": self.n_samples, "noise_pct": 100.0 * self.spread,
                "stop_reason": self.stop_reason, "timer": self.timer}


def summarize(samples_ms: Sequence[float], stop_reason: str = "", timer: str = "",
              elapsed_s: float = 0.0) -> Measurement:
    """A Measurement of the samples (milliseconds); ValueError when there are none."""
    samples = [float(x) for x in samples_ms]
    if not samples:
        raise ValueError("no samples to summarize")
    s = sorted(samples)
    return Measurement(samples_ms=samples, median_ms=quantile(s, 0.5), p20_ms=quantile(s, 0.2),
                       p80_ms=quantile(s, 0.8), n_samples=len(s), spread=relative_spread(s),
                       stop_reason=stop_reason, timer=timer, elapsed_s=elapsed_s)


# ----------------------------------------------------------------------------- stopping rule

@dataclass(frozen=True)
class StopRule:
    """When to stop sampling one callable (NVBench's stdrel criterion, on a robust spread).

    Continue while n < min_samples (always honoured, even past the cap). Then stop at the cap:
    wall time >= max_time_s or n >= max_samples. Otherwise continue until the summed sample
    (GPU) time reaches min_time_s, then stop when the spread is at most max_noise ('noise') or
    when the spreads of the last max(window, window_frac * n) samples (one spread per sample
    count) lie within stable_tol * the current spread of each other ('stable': the noise is
    characterised and further samples would not change it; a spread that keeps drifting, as
    with a sinking clock, never passes and runs to the cap).
    """

    min_samples: int = 10
    min_time_s: float = 0.5
    max_time_s: float = 10.0
    max_noise: float = 0.005
    window: int = 16
    window_frac: float = 0.25
    stable_tol: float = 0.05
    max_samples: int = 100_000

    def check(self, n: int, sample_time_s: float, wall_s: float, spreads: Sequence[float]) -> Optional[str]:
        """The stop reason after n samples, or None to continue. spreads[i] = spread of the first
        i + 1 samples."""
        if n < self.min_samples:
            return None
        if wall_s >= self.max_time_s:
            return "max_time"
        if n >= self.max_samples:
            return "max_samples"
        if sample_time_s < self.min_time_s:
            return None
        if spreads and spreads[-1] <= self.max_noise:
            return "noise"
        window = max(self.window, math.ceil(self.window_frac * n))
        if len(spreads) >= window and n % max(1, n // 64) == 0:   # checked ~64 times per doubling of n
            recent = spreads[-window:]
            if max(recent) - min(recent) <= self.stable_tol * spreads[-1]:
                return "stable"
        return None


def collect(sample: Callable[[], float], rule: StopRule | None = None, *, timer: str = "",
            clock: Callable[[], float] = time.perf_counter) -> Measurement:
    """Call sample() (one repetition, returns ms) until `rule` says stop; the Measurement."""
    rule = rule or StopRule()
    samples, ordered, spreads = [], [], []
    total_ms, t0 = 0.0, clock()
    while True:
        ms = float(sample())
        samples.append(ms)
        bisect.insort(ordered, ms)
        total_ms += ms
        spreads.append(relative_spread(ordered))
        wall = clock() - t0
        reason = rule.check(len(samples), total_ms / 1e3, wall, spreads)
        if reason:
            return summarize(samples, reason, timer, wall)


def warmup(sample: Callable[[], float], warmup_s: float = 0.025, *, min_calls: int = 2,
           clock: Callable[[], float] = time.perf_counter) -> float:
    """Call sample() at least min_calls times and for warmup_s; the median of the calls after the
    first (which may include compilation), an estimate of one repetition in ms."""
    t0, times = clock(), []
    while len(times) < min_calls or clock() - t0 < warmup_s:
        times.append(float(sample()))
    rest = sorted(times[1:] or times)
    return quantile(rest, 0.5)


# ----------------------------------------------------------------------------- interleaved rounds

@dataclass(frozen=True)
class RoundRule:
    """When to stop interleaved rounds. Rounds continue until rounds >= max(min_rounds,
    ceil(min_samples / reps)) (always honoured) and the summed sample time of the round loop
    reaches min_time_s; then stop at the cap (wall time >= max_time_s: 'max_time'; rounds >=
    max_rounds: 'max_rounds'), or when every callable's ratio CI against the baseline has a
    half-width <= ci_tol * ratio ('ci'), or without a baseline (or with one callable) at once
    ('rounds')."""

    min_rounds: int = 10            # rounds at least (and min_samples repetitions per callable)
    min_samples: int = 10
    ci_tol: float = 0.01            # stop when every ratio's interval is within +-ci_tol * ratio
    conf: float = 0.95              # confidence of the ratio intervals
    min_time_s: float = 0.0         # summed sample time of the round loop, at least
    max_time_s: float = 60.0        # the cap (wall clock)
    max_rounds: int = 1000
    method: str = "t"               # ratio_ci method: 't' or 'bootstrap'
    # The order of the callables in each round: "shuffle" (the first round in mapping order, each later
    # one a permutation drawn from a generator seeded with `seed`, so the run is reproducible) or "fixed"
    # (always mapping order). A fixed order always runs a callable after the same neighbour, so whatever
    # one call leaves for the next (clock state at the power cap, allocator state, side-stream work)
    # biases the same pair in every round; shuffled rounds spread any such effect over every pair.
    order: str = "shuffle"
    seed: int = 0

    def rounds_needed(self, reps: int) -> int:
        return max(self.min_rounds, -(-self.min_samples // max(1, reps)))


@dataclass
class Interleaved:
    """Result of `interleave`: per callable all repetition samples (a Measurement) and the median
    of each round; ratios[name] = (ratio, lo, hi) against the baseline (not for the baseline)."""

    measurements: dict
    round_medians: dict
    baseline: Optional[str]
    ratios: dict
    rounds: int
    reps: int
    stop_reason: str
    elapsed_s: float = 0.0

    def ratio_row(self, name: str) -> dict:
        """CSV columns of name's ratio to the baseline: ratio, ratio_lo, ratio_hi (NaN if none)."""
        r, lo, hi = self.ratios.get(name, (math.nan, math.nan, math.nan))
        return {"ratio": r, "ratio_lo": lo, "ratio_hi": hi}


def choose_reps(est_ms: float, target_ms: float = 50.0, max_reps: int = 5) -> int:
    """Repetitions per callable per round: about target_ms of work, between 1 and max_reps
    (a 400 ms call gets 1, a 1 ms call max_reps)."""
    if not est_ms > 0:
        return max_reps
    return int(min(max_reps, max(1, target_ms // est_ms)))


def interleave(samplers: Mapping[str, Callable[[], float]], *, baseline: Optional[str] = None,
               reps: int = 1, rule: RoundRule | None = None, timer: str = "",
               clock: Callable[[], float] = time.perf_counter, on_switch=lambda name: None) -> Interleaved:
    """Run rounds of every sampler (A B C, then as `rule.order` says: shuffled by default), each round
    `reps` repetitions of every sampler (sampler.batch(reps) where it has one, else reps calls
    returning one repetition in ms each),
    until `rule` says stop. on_switch(name) runs before a sampler's repetitions of a round and
    on_switch(None) after them (what a tagged health.GpuSampler reads)."""
    rule = rule or RoundRule()
    names = list(samplers)
    if not names:
        raise ValueError("nothing to interleave")
    if rule.order not in ("shuffle", "fixed"):
        raise ValueError(f"round order must be 'shuffle' or 'fixed', got {rule.order!r}")
    shuffler = random.Random(rule.seed)
    if baseline is not None and baseline not in samplers:
        raise ValueError(f"baseline {baseline!r} is not one of {names}")
    reps = max(1, int(reps))
    needed = rule.rounds_needed(reps)
    others = [n for n in names if n != baseline] if baseline is not None else []
    samples = {n: [] for n in names}
    medians = {n: [] for n in names}
    ratios, total_ms, t0, rounds = {}, 0.0, clock(), 0
    while True:
        order = list(names)
        if rule.order == "shuffle" and rounds > 0:
            shuffler.shuffle(order)
        for name in order:
            batch = getattr(samplers[name], "batch", None)
            on_switch(name)
            got = sorted(float(x) for x in (batch(reps) if batch else [samplers[name]() for _ in range(reps)]))
            on_switch(None)
            samples[name].extend(got)
            medians[name].append(quantile(got, 0.5))
            total_ms += sum(got)
        rounds += 1
        if rounds < needed or total_ms / 1e3 < rule.min_time_s:
            continue
        wall = clock() - t0
        ratios = {n: ratio_ci(medians[n], medians[baseline], rule.conf, method=rule.method) for n in others}
        if wall >= rule.max_time_s:
            reason = "max_time"
        elif rounds >= rule.max_rounds:
            reason = "max_rounds"
        elif not others:
            reason = "rounds"
        elif all((hi - lo) / 2 <= rule.ci_tol * r for r, lo, hi in ratios.values()):
            reason = "ci"
        else:
            continue
        ms = {n: summarize(samples[n], reason, timer, wall) for n in names}
        return Interleaved(ms, medians, baseline, ratios, rounds, reps, reason, wall)


# ----------------------------------------------------------------------------- GPU samplers

class GraphCaptureError(RuntimeError):
    """fn could not be captured into a CUDA graph (a row reason for the runner)."""


@functools.lru_cache(maxsize=None)
def flush_buffer(device_index: int):
    """The L2-flush buffer of a device (FLUSH_BYTES, allocated once)."""
    import torch
    return torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device=f"cuda:{device_index}")


class EagerSampler:
    """Repetitions of fn, each: grads set to None, L2 flushed, start event, fn(), end event.

    `batch(n)` queues `lead` untimed repetitions and then n timed ones back to back, with one
    synchronize at the end, as triton's do_bench does: host launch latency counts where the host
    is slower than the GPU, and is hidden by the queue where it is faster (the lead repetitions
    fill the queue, so the first timed one does not start on an idle GPU; a sync per repetition
    would add the Python time of a short call to its GPU time). A call returns
    one repetition (ms) from a buffer refilled by batches of about batch_ms of work (at most
    max_batch; 1 for slow calls)."""

    timer = "eager"

    def __init__(self, fn: Callable[[], object], grad_to_none: Optional[list] = None,
                 batch_ms: float = 100.0, max_batch: int = 256, lead: int = 1):
        import torch
        self.torch, self.fn, self.grads = torch, fn, list(grad_to_none or [])
        self.cache = flush_buffer(torch.cuda.current_device())
        self.events: list = []
        self.buffer: list = []
        self.batch_ms, self.max_batch, self.next_batch, self.lead = batch_ms, max_batch, 1, lead

    def run(self) -> None:
        """One untimed call of the timed work (no flush)."""
        self.fn()

    def batch(self, n: int) -> list:
        """Time n repetitions now; their times in ms."""
        torch = self.torch
        while len(self.events) < n:
            self.events.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
        for i in range(self.lead + n):
            for t in self.grads:
                t.grad = None
            self.cache.zero_()
            if i >= self.lead:
                self.events[i - self.lead][0].record()
            self.run()
            if i >= self.lead:
                self.events[i - self.lead][1].record()
        self.events[n - 1][1].synchronize()
        return [float(start.elapsed_time(end)) for start, end in self.events[:n]]

    def reset(self) -> None:
        """Drop buffered repetitions (those timed during the warm-up)."""
        self.buffer.clear()

    def __call__(self) -> float:
        if not self.buffer:
            self.buffer = self.batch(self.next_batch)
            med = quantile(sorted(self.buffer), 0.5)
            self.next_batch = int(min(self.max_batch, max(1, self.batch_ms // med if med > 0 else self.max_batch)))
        return self.buffer.pop(0)


class GraphSampler(EagerSampler):
    """Repetitions as replays of fn captured once into a CUDA graph (host launch cost drops out).

    fn runs `warmup_calls` times on a side stream first (compilation, autotuning, .grad tensors).
    grads='fresh' (default) sets the grad_to_none tensors' .grad to None before capture, so the
    captured backward writes new gradients into graph memory at every replay, as an eager
    repetition with grads set to None does; grads='accumulate' keeps the warm-up's .grad tensors
    and the captured backward adds into them in place (an extra read + write of every gradient per
    replay, large for MoDA, whose depth K/V gradients are L times the sequence K/V's). Either way
    grads are not touched between replays. GraphCaptureError if capture fails."""

    timer = "graph"

    def __init__(self, fn: Callable[[], object], grad_to_none: Optional[list] = None, warmup_calls: int = 3,
                 grads: str = "fresh", **batching):
        if grads not in ("fresh", "accumulate"):
            raise ValueError(f"grads must be 'fresh' or 'accumulate', got {grads!r}")
        super().__init__(fn, None, **{"lead": 0, **batching})
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(max(1, warmup_calls)):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        if grads == "fresh":
            for t in grad_to_none or []:
                t.grad = None
        self.graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(self.graph):
                fn()
        except Exception as exc:
            self.graph = None
            recover_from_failed_capture()
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise GraphCaptureError(f"CUDA graph capture failed: {type(exc).__name__}: {msg}"[:300]) from exc
        torch.cuda.synchronize()

    def run(self) -> None:
        self.graph.replay()


def recover_from_failed_capture() -> None:
    """Undo what a failed capture leaves behind: torch ends a failed capture before its RNG
    generators leave capture mode (the next torch.randn then fails with 'Offset increment outside
    graph capture'); one trivial successful capture resets them."""
    import torch
    try:
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            torch.empty(1, device="cuda").zero_()
        torch.cuda.synchronize()
        del g
    except Exception:   # noqa: BLE001 - best effort: the capture error is the one to report
        pass


def make_sampler(fn: Callable[[], object], timer: str = "eager", grad_to_none: Optional[list] = None,
                 graph_grads: str = "fresh"):
    """A sampler of fn on the current CUDA device: calling it times one repetition (ms), batch(n)
    times n. timer 'eager' (EagerSampler) or 'graph' (GraphSampler with grads=graph_grads; may
    raise GraphCaptureError)."""
    if timer == "eager":
        return EagerSampler(fn, grad_to_none)
    if timer == "graph":
        return GraphSampler(fn, grad_to_none, grads=graph_grads)
    raise ValueError(f"timer must be one of {', '.join(TIMERS)}, got {timer!r}")


def time_fn(fn: Callable[[], object], *, timer: str = "eager", grad_to_none: Optional[list] = None,
            rule: StopRule | None = None, warmup_s: float = 0.025, graph_grads: str = "fresh") -> Measurement:
    """Time fn on the current CUDA device: sampler, warm-up, then samples until `rule` stops."""
    sampler = make_sampler(fn, timer, grad_to_none, graph_grads)
    warmup(sampler, warmup_s)
    sampler.reset()
    return collect(sampler, rule, timer=timer)


def time_interleaved(fns: Mapping[str, Callable[[], object]], *, baseline: Optional[str] = None,
                     timer: str = "eager", grad_to_none: Optional[Mapping[str, list]] = None,
                     reps: Optional[int] = None, rule: RoundRule | None = None,
                     warmup_s: float = 0.025, graph_grads: str = "fresh") -> Interleaved:
    """Time several callables (the providers of one point) in interleaved rounds on the current
    CUDA device. reps None: `choose_reps` of the slowest warm-up estimate. An error of one
    callable (capture, OOM) ends the whole call: to drop only that provider, build the samplers
    with `make_sampler` one by one, then `warmup` each and `interleave` those that worked."""
    grad_to_none = grad_to_none or {}
    samplers = {name: make_sampler(fn, timer, grad_to_none.get(name), graph_grads) for name, fn in fns.items()}
    est = max(warmup(s, warmup_s) for s in samplers.values())
    return interleave(samplers, baseline=baseline, reps=reps or choose_reps(est), rule=rule, timer=timer)


def make_timer(timer: str = "eager", graph_grads: str = "fresh", **rule_kw) -> Callable[..., dict]:
    """A runner-compatible `timer(fn, grad_to_none=None, warmup_ms=25, rep_ms=100) -> dict` that
    uses `time_fn`: returns Measurement.row() (median_ms, p20_ms, p80_ms, n_samples, noise_pct,
    stop_reason, timer). rule_kw are StopRule fields; min_time_s defaults to rep_ms / 1000."""
    if timer not in TIMERS:
        raise ValueError(f"timer must be one of {', '.join(TIMERS)}, got {timer!r}")

    def run(fn, grad_to_none=None, warmup_ms: float = 25, rep_ms: float = 100) -> dict:
        rule = StopRule(**{"min_time_s": rep_ms / 1e3, **rule_kw})
        return time_fn(fn, timer=timer, grad_to_none=grad_to_none, rule=rule, warmup_s=warmup_ms / 1e3,
                       graph_grads=graph_grads).row()

    return run
