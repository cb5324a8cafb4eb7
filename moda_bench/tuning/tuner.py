"""The MoDA tuner's search: time candidates (`search`), hill-climb one field group
(`tune_kernel`) and tune a shape group after group (`tune_shape`), against a `Timer`;
`CudaTimer` is the device timer (moda_attention with an explicit config, timed like the
sweeps, each candidate's results checked against the default config's first).

The backward passes cannot be timed apart (one `.backward()` runs both kernels), so the bwd_q,
bwd_kv and bwd_depth searches each time the whole backward while only their own fields change.

The decision: the search's winner (the candidate) and the built-in default config are timed
again on fwd+bwd in interleaved rounds (`Timer.compare`: candidate, default, candidate, ...;
moda_bench.timing's `interleave` and `ratio_ci`), and the candidate is kept only if the upper
end of the 95% interval of its time ratio to the default is below 1 - min_gain (2% by
default): it must beat the default by more than the margin and by more than the measured
noise. Otherwise the default is stored (decision 'default').
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

from moda_bench.kernels.moda.config import MoDAConfig, default_config
from moda_bench.kernels.moda.validate import MoDAShape
from moda_bench.timing import RoundRule, interleave
from moda_bench.tuning.space import (
    DEFAULT_BUDGET,
    DEFAULT_SMEM_BYTES,
    DEPTH_GROUPS,
    KERNELS,
    OVERLAP_GROUPS,
    candidate_configs,
    device_smem_limit,
    dtype_name,
    neighbours,
    prune_candidates,
)

DEFAULT_MIN_GAIN = 0.02  # the candidate must be at least this much faster (upper 95% bound)
# Rounds of the candidate-vs-default comparison: at least 10, until the ratio's 95% interval is
# within +-0.5% or 10 s have passed (a round of a 0.5 s call is ~1 s: 10 rounds then).
COMPARE_RULE = RoundRule(min_rounds=10, ci_tol=0.005, conf=0.95, max_time_s=10.0, max_rounds=400)


@dataclass
class KernelSearch:
    """Outcome of tuning one kernel: best config and ms, the base's ms, what was tried, and the
    fastest candidate other than the base (`runner_up`): where nothing beats the base, how close
    the search came, the evidence a kept default needs."""

    kernel: str
    best: Optional[MoDAConfig]
    best_ms: float
    base_ms: float
    tried: int = 0
    skipped: list[tuple[dict, str]] = field(default_factory=list)
    base: Optional[MoDAConfig] = None
    runner_up: Optional[MoDAConfig] = None
    runner_up_ms: float = float("inf")

    def runner_up_fields(self) -> dict:
        """The fields in which the runner-up differs from the base ({} without either)."""
        if self.runner_up is None or self.base is None:
            return {}
        a, b = self.base.to_dict(), self.runner_up.to_dict()
        return {k: v for k, v in b.items() if a.get(k) != v}

    def runner_up_ratio(self) -> Optional[float]:
        """The runner-up's time over the base's, or None without a runner-up (or a base time)."""
        if self.runner_up is None or not self.base_ms > 0:
            return None
        return self.runner_up_ms / self.base_ms

    def summary(self) -> dict:
        out = {"best_ms": self.best_ms, "base_ms": self.base_ms, "tried": self.tried, "skipped": len(self.skipped)}
        ratio = self.runner_up_ratio()
        if ratio is not None:
            out.update(runner_up_ms=self.runner_up_ms, runner_up_ratio=ratio, runner_up_fields=self.runner_up_fields())
        return out

    def closest(self) -> str:
        """'kernel: field=value,... 1.034x' for the runner-up (timed on the kernel's pass), or ''."""
        ratio = self.runner_up_ratio()
        if ratio is None:
            return ""
        fields = ",".join(f"{k}={v}" for k, v in sorted(self.runner_up_fields().items()))
        return f"{self.kernel}: {fields or 'same config'} {ratio:.3f}x"


def search(kernel: str, candidates: list[MoDAConfig], time_fn: Callable[[MoDAConfig], float],
           on_done: Optional[Callable[[MoDAConfig, Optional[float], Optional[str]], None]] = None,
           into: Optional[KernelSearch] = None) -> KernelSearch:
    """Time every candidate with time_fn(cfg) -> ms; exceptions skip the candidate (noted).

    Without `into`, candidates[0] is the base configuration and if it fails the search fails
    (RuntimeError). With `into`, results are merged into that earlier search.
    """
    ks = into or KernelSearch(kernel, None, float("inf"), float("nan"))
    for i, cfg in enumerate(candidates):
        try:
            ms = float(time_fn(cfg))
            if not ms > 0 or ms == float("inf"):  # NaN / nonsense timing
                raise RuntimeError(f"invalid time {ms}")
        except Exception as exc:  # compile errors, out of resources, wrong results
            msg = str(exc).strip().splitlines()
            note = f"{type(exc).__name__}: {msg[0] if msg else ''}"[:200]
            if i == 0 and into is None:
                raise RuntimeError(f"{kernel}: the base configuration fails ({note})") from exc
            ks.skipped.append((cfg.to_dict(), note))
            if on_done:
                on_done(cfg, None, note)
            _free_cuda_memory()
            continue
        ks.tried += 1
        if i == 0 and into is None:
            ks.base_ms, ks.base = ms, cfg
        elif ms < ks.runner_up_ms:
            ks.runner_up, ks.runner_up_ms = cfg, ms
        if ms < ks.best_ms:
            ks.best, ks.best_ms = cfg, ms
        if on_done:
            on_done(cfg, ms, None)
    return ks


def closest_candidate(searches) -> Optional[MoDAConfig]:
    """The runner-up (`KernelSearch.runner_up`) with the smallest time ratio to its base among
    the searches, or None where no search timed a candidate besides its base."""
    near = [ks for ks in searches if ks.runner_up_ratio() is not None]
    return min(near, key=KernelSearch.runner_up_ratio).runner_up if near else None


def tune_kernel(shape: MoDAShape, kernel: str, base: MoDAConfig, time_fn: Callable[[MoDAConfig], float], *,
                dtype="bfloat16", budget: int = DEFAULT_BUDGET, smem_limit: int = DEFAULT_SMEM_BYTES,
                seed: int = 0, on_plan: Optional[Callable[[str, int, dict], None]] = None,
                on_done: Optional[Callable[[MoDAConfig, Optional[float], Optional[str]], None]] = None
                ) -> KernelSearch:
    """Tune one kernel's fields on top of `base` with at most `budget` timed candidates:
    round 1 times `candidate_configs`; then, while budget is left (the space exceeds it), each
    further round times the untried pruned configs one field away from the best so far (a hill
    climb that stops when the best has no untried neighbour)."""
    survivors, _ = prune_candidates(shape, kernel, base, dtype=dtype, smem_limit=smem_limit)
    first, stats = candidate_configs(shape, kernel, base, dtype=dtype, budget=budget, smem_limit=smem_limit,
                                     seed=seed)
    planned = min(max(1, budget), len(survivors))
    if on_plan:
        on_plan(kernel, planned, stats)
    ks = search(kernel, first, time_fn, on_done=on_done)
    seen = set(first)
    left = planned - len(first)
    while left > 0:
        batch = [c for c in neighbours(ks.best, survivors, kernel) if c not in seen][:left]
        if not batch:
            break
        seen.update(batch)
        left -= len(batch)
        search(kernel, batch, time_fn, on_done=on_done, into=ks)
    return ks


def _free_cuda_memory() -> None:
    try:
        import torch
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # pragma: no cover
        pass


@dataclass
class Comparison:
    """Candidate vs default in interleaved rounds: each one's median ms, the candidate/default
    ratio (geometric mean of the paired round ratios) with its interval, rounds, stop reason."""

    default_ms: float
    candidate_ms: float
    ratio: float
    lo: float
    hi: float
    rounds: int
    stop_reason: str = ""

    def keeps_candidate(self, min_gain: float) -> bool:
        """True if the ratio's upper bound is below 1 - min_gain (a NaN bound keeps the default)."""
        return self.hi == self.hi and self.hi < 1.0 - min_gain


class Timer:
    """What the tuner needs from a device: ms of a config for pass 'fwd' | 'bwd' | 'fwdbwd'
    (`time`), and a candidate-vs-default comparison (`compare`). `rule` sets the rounds."""

    rule: RoundRule = COMPARE_RULE

    def time(self, cfg: MoDAConfig, pass_: str, final: bool = False) -> float:  # pragma: no cover
        """final=True: a timing outside the search (longer, candidates already checked)."""
        raise NotImplementedError

    def compare(self, candidate: MoDAConfig, default: MoDAConfig, pass_: str = "fwdbwd") -> Comparison:
        """Interleaved rounds of `time(cfg, pass_, final=True)`, one call per config a round."""
        res = interleave({"candidate": lambda: self.time(candidate, pass_, final=True),
                          "default": lambda: self.time(default, pass_, final=True)},
                         baseline="default", reps=1, rule=self.rule)
        return _comparison(res)


def _comparison(res) -> Comparison:
    ratio, lo, hi = res.ratios["candidate"]
    return Comparison(res.measurements["default"].median_ms, res.measurements["candidate"].median_ms,
                      ratio, lo, hi, res.rounds, res.stop_reason)


class CudaTimer(Timer):
    """Times `moda_attention` with an explicit config through moda_bench.timing.measure
    (`attention`, `measure_fn`, `sampler_fn` and `device` are replaceable for tests on the CPU).

    Before timing, each candidate's output (fwd) or gradients (bwd) are compared with the
    default config's; a relative error above `tol` raises, so a wrong config is skipped.
    `compare` times candidate and default in interleaved rounds of CUDA-event repetitions
    (timing.make_sampler, 'eager': L2 flushed, launches queued as a training loop does), after
    `final_warmup_ms` of warm-up each; `rule` (COMPARE_RULE) decides how many rounds.
    """

    def __init__(self, shape: MoDAShape, dtype, *, device="cuda", warmup_ms: float = 10, rep_ms: float = 50,
                 final_warmup_ms: float = 25, final_rep_ms: float = 100, tol: float = 2e-2, seed: int = 0,
                 attention: Optional[Callable] = None, measure_fn: Optional[Callable] = None,
                 sampler_fn: Optional[Callable] = None, rule: Optional[RoundRule] = None):
        import torch

        from moda_bench.timing import make_inputs
        if attention is None:
            from moda_bench.kernels.moda import moda_attention as attention
        if measure_fn is None:
            from moda_bench.timing import measure as measure_fn
        if sampler_fn is None:
            from moda_bench.timing import make_sampler as sampler_fn
        self.torch, self.attention, self.measure_fn, self.sampler_fn = torch, attention, measure_fn, sampler_fn
        self.rule = rule or COMPARE_RULE
        self.shape, self.tol = shape, tol
        self.warmup_ms, self.rep_ms = warmup_ms, rep_ms
        self.final_warmup_ms, self.final_rep_ms = final_warmup_ms, final_rep_ms
        tdtype = getattr(torch, dtype_name(dtype))
        self.inputs = make_inputs(shape.B, shape.T, shape.Hq, shape.Hk, shape.d, shape.L, dtype=tdtype,
                                  device=device, requires_grad=True, seed=seed)
        self._ref: dict[str, list] = {}
        self._ref_cfg = default_config(shape, dtype)

    def _forward(self, cfg: MoDAConfig):
        x = self.inputs
        return lambda: self.attention(x["q"], x["k"], x["v"], x["k_depth"], x["v_depth"], config=cfg)

    def _results(self, cfg: MoDAConfig, kind: str) -> list:
        from moda_bench.timing import grad_inputs
        torch = self.torch
        if kind == "fwd":
            with torch.no_grad():
                return [self._forward(cfg)().detach()]
        leaves = grad_inputs(self.inputs)
        for t in leaves:
            t.grad = None
        self._forward(cfg)().backward(self.inputs["do"])
        grads = [t.grad.detach().clone() for t in leaves]
        for t in leaves:
            t.grad = None
        return grads

    def check(self, cfg: MoDAConfig, kind: str) -> None:
        """Raise ValueError if cfg's fwd output / gradients differ from the default config's."""
        from moda_bench.timing import max_rel_err
        if kind not in self._ref:
            self._ref[kind] = self._results(self._ref_cfg, kind)
        if cfg == self._ref_cfg:
            return
        for got, ref in zip(self._results(cfg, kind), self._ref[kind]):
            err = max_rel_err(got, ref)
            if not err <= self.tol:
                raise ValueError(f"wrong result: relative error {err:.3g} vs default config > {self.tol}")

    def time(self, cfg: MoDAConfig, pass_: str, final: bool = False) -> float:
        from moda_bench.timing import grad_inputs, make_pass_fn
        if not final:
            self.check(cfg, "fwd" if pass_ == "fwd" else "bwd")
        fn = make_pass_fn(self._forward(cfg), self.inputs, pass_)
        grads = None if pass_ == "fwd" else grad_inputs(self.inputs)
        res = self.measure_fn(fn, grad_to_none=grads, warmup_ms=self.final_warmup_ms if final else self.warmup_ms,
                      rep_ms=self.final_rep_ms if final else self.rep_ms)
        return res["median_ms"]

    def compare(self, candidate: MoDAConfig, default: MoDAConfig, pass_: str = "fwdbwd") -> Comparison:
        from moda_bench.timing import choose_reps, grad_inputs, make_pass_fn, warmup
        grads = None if pass_ == "fwd" else grad_inputs(self.inputs)
        samplers = {name: self.sampler_fn(make_pass_fn(self._forward(cfg), self.inputs, pass_), "eager", grads)
                    for name, cfg in (("candidate", candidate), ("default", default))}
        est = 0.0
        for s in samplers.values():
            est = max(est, warmup(s, self.final_warmup_ms / 1e3))
            getattr(s, "reset", lambda: None)()
        res = interleave(samplers, baseline="default", reps=choose_reps(est), rule=self.rule, timer="eager")
        return _comparison(res)


@dataclass
class TuneResult:
    """The config to use for one shape and how the search's candidate compared with the
    default (fwd+bwd ms). config is the candidate if decision == 'tuned', else the default;
    tuned_ms is config's time (= default_ms for 'default'); candidate_ms, ratio, ratio_lo and
    ratio_hi come from the interleaved comparison (candidate None, ratio 1 and NaN bounds when
    the search found nothing but the default)."""

    shape: MoDAShape
    dtype: str
    config: MoDAConfig
    default_ms: float
    tuned_ms: float
    wall_s: float
    kernels: dict = field(default_factory=dict)  # kernel -> KernelSearch
    notes: list[str] = field(default_factory=list)  # skipped candidates: kernels[k].skipped
    decision: str = "tuned"
    candidate: Optional[MoDAConfig] = None
    candidate_ms: float = float("nan")
    ratio: float = float("nan")
    ratio_lo: float = float("nan")
    ratio_hi: float = float("nan")
    min_gain: float = DEFAULT_MIN_GAIN
    compare_rounds: int = 0
    op: str = "moda"  # the operator tuned (config.OPS): its cache and shipped keys

    @property
    def speedup(self) -> float:
        return self.default_ms / self.tuned_ms if self.tuned_ms > 0 else float("nan")


def tune_shape(shape: MoDAShape, dtype, timer: Timer, *, kernels: Iterable[str] = KERNELS,
               budget: int = DEFAULT_BUDGET, smem_limit: Optional[int] = None, seed: int = 0,
               min_gain: float = DEFAULT_MIN_GAIN, op: str = "moda", default: Optional[MoDAConfig] = None,
               on_plan: Optional[Callable[[str, int, dict], None]] = None,
               on_done: Optional[Callable[[MoDAConfig, Optional[float], Optional[str]], None]] = None,
               confirm_closest: bool = True) -> TuneResult:
    """Tune `kernels` one after another (fwd and fwd_depth timed on 'fwd', the others on
    'bwd'; the depth groups are skipped when L = 0), then compare the winner with the default
    config on fwd+bwd in interleaved rounds (`timer.compare`). The winner is kept (decision
    'tuned') only if the 95% upper bound of its time ratio to the default is below 1 - min_gain;
    otherwise the default is recorded (decision 'default', speedup 1). `op` (config.OPS) names
    the operator the timer runs, recorded in the result for its cache key; `default` is the
    config to beat and to start from (the heuristic `default_config` unless given: moda-overlap
    passes its own, `overlap.overlap_heuristic`). Where no group found anything faster than the
    default on its own pass, the closest candidate (`closest_candidate`) goes through the same
    check and comparison (confirm_closest; False skips it): a default kept then carries that
    candidate's fwd+bwd ratio and interval as its evidence, and a candidate that does clear the
    margin on fwd+bwd is kept as any winner would be.
    """
    t0 = time.perf_counter()
    dtype = dtype_name(dtype)
    smem_limit = device_smem_limit() if smem_limit is None else smem_limit
    default = default_config(shape, dtype) if default is None else default
    cfg, results, notes = default, {}, []
    for kernel in kernels:
        if kernel in DEPTH_GROUPS + OVERLAP_GROUPS and shape.L == 0:
            continue  # no depth part to place
        pass_ = "fwd" if kernel in ("fwd", "fwd_depth", "fwd_ctas", "fwd_items") else "bwd"
        ks = tune_kernel(shape, kernel, cfg, lambda c, p=pass_: timer.time(c, p), dtype=dtype, budget=budget,
                         smem_limit=smem_limit, seed=seed, on_plan=on_plan, on_done=on_done)
        results[kernel] = ks
        cfg = ks.best
    done = dict(kernels=results, notes=notes, min_gain=min_gain, op=op)
    if cfg == default:
        near = [c for c in (ks.closest() for ks in results.values()) if c]
        notes.append("the search found nothing faster than the default config"
                     + (f" (closest candidates, each on its pass: {'; '.join(near)})" if near else ""))
        closest = closest_candidate(results.values()) if confirm_closest else None
        if closest is None:
            default_ms = timer.time(default, "fwdbwd", final=True)
            return TuneResult(shape, dtype, default, default_ms, default_ms, time.perf_counter() - t0,
                              decision="default", ratio=1.0, **done)
        cfg = closest  # compared with the default like a winner: the kept default's evidence, with its interval
    check = getattr(timer, "check", None)  # the device timer re-checks the combined winner's results
    try:
        if check is not None:
            check(cfg, "fwd")
            check(cfg, "bwd")
    except Exception as exc:  # noqa: BLE001 - a wrong or failing winner keeps the default
        default_ms = timer.time(default, "fwdbwd", final=True)
        notes.append(f"candidate rejected: {type(exc).__name__}: {str(exc)[:200]}")
        return TuneResult(shape, dtype, default, default_ms, default_ms, time.perf_counter() - t0,
                          decision="default", candidate=cfg, **done)
    cmp = timer.compare(cfg, default, "fwdbwd")
    kept = cmp.keeps_candidate(min_gain)
    if not kept:
        notes.append(f"candidate {cmp.ratio:.3f}x the default's time (95% CI {cmp.lo:.3f}-{cmp.hi:.3f}, "
                     f"{cmp.rounds} rounds) does not beat it by more than {min_gain:.1%} and the noise: "
                     "keeping default")
    return TuneResult(shape, dtype, cfg if kept else default, cmp.default_ms,
                      cmp.candidate_ms if kept else cmp.default_ms, time.perf_counter() - t0,
                      decision="tuned" if kept else "default", candidate=cfg, candidate_ms=cmp.candidate_ms,
                      ratio=cmp.ratio, ratio_lo=cmp.lo, ratio_hi=cmp.hi, compare_rounds=cmp.rounds, **done)
