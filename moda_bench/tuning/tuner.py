"""The MoDA tuner's search: time candidates (`search`), hill-climb one field group
(`tune_kernel`) and tune a shape group after group (`tune_shape`), against a `Timer`;
`CudaTimer` is the device timer (moda_attention with an explicit config, timed like the
sweeps, each candidate's results checked against the default config's first).

The backward passes cannot be timed apart (one `.backward()` runs both kernels), so the bwd_q,
bwd_kv and bwd_depth searches each time the whole backward while only their own fields change.
A shape's winner is kept only if it beats the default config on fwd+bwd.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

from moda_bench.ops.moda.config import MoDAConfig, default_config
from moda_bench.ops.moda.validate import MoDAShape
from moda_bench.tuning.space import (DEFAULT_BUDGET, DEFAULT_SMEM_BYTES, DEPTH_GROUPS, KERNELS, candidate_configs,
                                     device_smem_limit, dtype_name, neighbours, prune_candidates)


@dataclass
class KernelSearch:
    """Outcome of tuning one kernel: best config and ms, the base's ms, what was tried."""

    kernel: str
    best: Optional[MoDAConfig]
    best_ms: float
    base_ms: float
    tried: int = 0
    skipped: list[tuple[dict, str]] = field(default_factory=list)

    def summary(self) -> dict:
        return {"best_ms": self.best_ms, "base_ms": self.base_ms, "tried": self.tried, "skipped": len(self.skipped)}


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
            ks.base_ms = ms
        if ms < ks.best_ms:
            ks.best, ks.best_ms = cfg, ms
        if on_done:
            on_done(cfg, ms, None)
    return ks


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


class Timer:
    """What the tuner needs from a device: ms of a config for pass 'fwd' | 'bwd' | 'fwdbwd'."""

    def time(self, cfg: MoDAConfig, pass_: str, final: bool = False) -> float:  # pragma: no cover
        """final=True: the default-vs-tuned comparison (longer timing, candidates already checked)."""
        raise NotImplementedError


class CudaTimer(Timer):
    """Times `moda_attention` with an explicit config through moda_bench.timing.measure
    (`attention`, `measure_fn` and `device` are replaceable for tests on the CPU).

    Before timing, each candidate's output (fwd) or gradients (bwd) are compared with the
    default config's; a relative error above `tol` raises, so a wrong config is skipped.
    """

    def __init__(self, shape: MoDAShape, dtype, *, device="cuda", warmup_ms: float = 10, rep_ms: float = 50,
                 final_warmup_ms: float = 25, final_rep_ms: float = 100, tol: float = 2e-2, seed: int = 0,
                 attention: Optional[Callable] = None, measure_fn: Optional[Callable] = None):
        import torch

        from moda_bench.timing import make_inputs
        if attention is None:
            from moda_bench.ops.moda import moda_attention as attention
        if measure_fn is None:
            from moda_bench.timing import measure as measure_fn
        self.torch, self.attention, self.measure_fn = torch, attention, measure_fn
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


@dataclass
class TuneResult:
    """The tuned config of one shape and how it compares with the default (fwd+bwd ms)."""

    shape: MoDAShape
    dtype: str
    config: MoDAConfig
    default_ms: float
    tuned_ms: float
    wall_s: float
    kernels: dict = field(default_factory=dict)  # kernel -> KernelSearch
    notes: list[str] = field(default_factory=list)  # skipped candidates: kernels[k].skipped

    @property
    def speedup(self) -> float:
        return self.default_ms / self.tuned_ms if self.tuned_ms > 0 else float("nan")


def tune_shape(shape: MoDAShape, dtype, timer: Timer, *, kernels: Iterable[str] = KERNELS,
               budget: int = DEFAULT_BUDGET, smem_limit: Optional[int] = None, seed: int = 0,
               on_plan: Optional[Callable[[str, int, dict], None]] = None,
               on_done: Optional[Callable[[MoDAConfig, Optional[float], Optional[str]], None]] = None) -> TuneResult:
    """Tune `kernels` one after another (fwd and fwd_depth timed on 'fwd', the others on
    'bwd'; the depth groups are skipped when L = 0), then time the default and the tuned
    config on fwd+bwd. The tuned config is kept only if it is faster
    there; otherwise the default is recorded (speedup 1).
    """
    t0 = time.perf_counter()
    dtype = dtype_name(dtype)
    smem_limit = device_smem_limit() if smem_limit is None else smem_limit
    default = default_config(shape, dtype)
    cfg, results, notes = default, {}, []
    for kernel in kernels:
        if kernel in DEPTH_GROUPS and shape.L == 0:
            continue  # no depth part to place
        pass_ = "fwd" if kernel in ("fwd", "fwd_depth") else "bwd"
        ks = tune_kernel(shape, kernel, cfg, lambda c, p=pass_: timer.time(c, p), dtype=dtype, budget=budget,
                         smem_limit=smem_limit, seed=seed, on_plan=on_plan, on_done=on_done)
        results[kernel] = ks
        cfg = ks.best
    default_ms = timer.time(default, "fwdbwd", final=True)
    tuned_ms = default_ms if cfg == default else timer.time(cfg, "fwdbwd", final=True)
    if tuned_ms >= default_ms:
        if cfg != default:
            notes.append(f"tuned config not faster on fwd+bwd ({tuned_ms:.4g} >= {default_ms:.4g} ms): keeping default")
        cfg, tuned_ms = default, default_ms
    return TuneResult(shape, dtype, cfg, default_ms, tuned_ms, time.perf_counter() - t0, results, notes)
