"""Timing and input generation shared by sweep, ablate, tune and gate.

Timing is `triton.testing.do_bench` (CUDA events, L2 flushed before every repetition,
warm-up first) asking for the median and the 20th/80th percentiles.
"""
from __future__ import annotations

from typing import Callable

import torch

QUANTILES = [0.5, 0.2, 0.8]


def make_inputs(B: int, T: int, Hq: int, Hk: int, d: int, L: int, dtype=torch.bfloat16,
                device="cuda", requires_grad: bool = True, seed: int | None = None) -> dict:
    """Fresh random MoDA inputs in the user-facing layout (never zeros).

    Returns dict(q, k, v, k_depth, v_depth, do); k_depth/v_depth are None when L == 0.
    """
    g = torch.Generator(device=device)
    g.manual_seed(seed if seed is not None else torch.seed() % (2**31))

    def rnd(*shape):
        return torch.randn(*shape, generator=g, device=device, dtype=torch.float32).to(dtype).requires_grad_(requires_grad)

    out = {"q": rnd(B, T, Hq, d), "k": rnd(B, T, Hk, d), "v": rnd(B, T, Hk, d),
           "k_depth": rnd(B, T, L, Hk, d) if L > 0 else None,
           "v_depth": rnd(B, T, L, Hk, d) if L > 0 else None}
    out["do"] = torch.randn(B, T, Hq, d, generator=g, device=device, dtype=torch.float32).to(dtype)
    return out


def grad_inputs(inputs: dict) -> list:
    return [t for name, t in inputs.items() if name != "do" and t is not None and t.requires_grad]


def make_pass_fn(forward: Callable[[], torch.Tensor], inputs: dict, pass_: str) -> Callable[[], object]:
    """Wrap a forward closure into the callable to time for 'fwd', 'bwd' or 'fwdbwd'.

    For 'bwd' the forward runs once here and only the backward is timed (retain_graph).
    """
    do = inputs["do"]
    if pass_ == "fwd":
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
    raise ValueError(f"pass must be fwd, bwd or fwdbwd, got {pass_!r}")


def measure(fn: Callable[[], object], grad_to_none: list | None = None, warmup_ms: float = 25,
            rep_ms: float = 100) -> dict:
    """Median / p20 / p80 milliseconds of fn through do_bench (L2 flushed each repetition)."""
    from triton.testing import do_bench
    med, p20, p80 = do_bench(fn, warmup=warmup_ms, rep=rep_ms, grad_to_none=grad_to_none, quantiles=QUANTILES)
    return {"median_ms": float(med), "p20_ms": float(p20), "p80_ms": float(p80)}


def max_rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 (NaN if out has non-finite values)."""
    o, r = out.double(), ref.double()
    if not torch.isfinite(o).all():
        return float("nan")
    return float((o - r).norm() / r.norm().clamp_min(1e-30))
