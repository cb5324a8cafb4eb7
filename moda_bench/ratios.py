"""Paired confidence intervals of a ratio of timings: `ratio_ci` over the per-round medians of two
callables timed in the same interleaved rounds (`timing.interleave`), and the Student-t quantile
it uses (`t_two_sided`, exact, without scipy). Pure Python and numpy: tested on the CPU.
"""
from __future__ import annotations

import functools
import math
from typing import Sequence


def t_two_sided(conf: float, df: int) -> float:
    """t such that P(|T| <= t) = conf for Student's t with df (>= 1) degrees of freedom."""
    return _t_two_sided(round(float(conf), 12), int(df))


@functools.lru_cache(maxsize=256)
def _t_two_sided(conf: float, df: int) -> float:
    if not 0 < conf < 1 or df < 1:
        raise ValueError(f"need 0 < conf < 1 and df >= 1, got conf={conf}, df={df}")

    def inside(t: float) -> float:   # P(|T| <= t), exact finite series (Abramowitz & Stegun 26.7.3-4)
        th = math.atan(t / math.sqrt(df))
        c, s = math.cos(th), math.sin(th)
        if df % 2:
            total, term = 0.0, c
            for j in range(1, (df - 1) // 2 + 1):
                total += term
                term *= c * c * (2 * j) / (2 * j + 1)
            return 2 / math.pi * (th + s * total) if df > 1 else 2 * th / math.pi
        total, term = 0.0, 1.0
        for j in range(1, df // 2 + 1):
            total += term
            term *= c * c * (2 * j - 1) / (2 * j)
        return s * total

    lo, hi = 0.0, 1.0
    while inside(hi) < conf:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if inside(mid) < conf else (lo, mid)
    return (lo + hi) / 2


def ratio_ci(num_rounds: Sequence[float], den_rounds: Sequence[float], conf: float = 0.95, *,
             method: str = "t", n_boot: int = 2000, seed: int = 0) -> tuple:
    """(ratio, lo, hi): num / den with a `conf` confidence interval, from paired rounds (round i
    of num and of den ran back to back, so drift shared by the round cancels in the ratio).

    method 't' (default): Student-t interval of the mean of the paired log ratios
    log(num_i / den_i); ratio = their geometric mean. Exact for multiplicative (log-normal) noise,
    shrinks like 1/sqrt(rounds), and keeps its coverage with as few as 10 rounds, where
    a bootstrap under-covers. method 'bootstrap': ratio = median(num) / median(den), interval =
    percentiles of that statistic over n_boot resamples of the rounds (pairs kept), seeded, so
    results are reproducible; more robust to a few outlying rounds. Fewer than 2 rounds give
    (ratio, nan, nan).
    """
    import numpy as np
    num = np.asarray(num_rounds, dtype=float)
    den = np.asarray(den_rounds, dtype=float)
    if num.shape != den.shape or num.ndim != 1 or num.size == 0:
        raise ValueError(f"need two equally long, non-empty round lists, got {num.shape} and {den.shape}")
    if np.any(num <= 0) or np.any(den <= 0):
        raise ValueError("round times must be positive")
    n = num.size
    if method == "t":
        logs = np.log(num) - np.log(den)
        mean = float(logs.mean())
        if n < 2:
            return math.exp(mean), math.nan, math.nan
        half = t_two_sided(conf, n - 1) * float(logs.std(ddof=1)) / math.sqrt(n)
        return math.exp(mean), math.exp(mean - half), math.exp(mean + half)
    if method == "bootstrap":
        ratio = float(np.median(num) / np.median(den))
        if n < 2:
            return ratio, math.nan, math.nan
        idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
        boots = np.median(num[idx], axis=1) / np.median(den[idx], axis=1)
        lo, hi = np.quantile(boots, [(1 - conf) / 2, (1 + conf) / 2])
        return ratio, float(lo), float(hi)
    raise ValueError(f"method must be 't' or 'bootstrap', got {method!r}")
