"""Where one eager MoDA fwd+bwd's host time goes, stamp by stamp, on a GPU host: the package's own
functions are wrapped with clock stamps (no profiler), so the gaps between them are the parts no
profiler names: the autograd Function's apply before and after the forward, the engine's start and
its hand-off to the device thread, the saved tensors' unpacking, AccumulateGrad and the return to
the caller. Each gap's median over N calls is printed, with the engine's device threads (PyTorch's
default) and, with --threads-off, without (`set_multithreading_enabled(False)`: every node on the
calling thread), each one call at a time on an idle GPU (synchronized before the call, outside the
stamps) and back to back.

    PYTHONPATH=$PWD python3 experiments/host_timeline.py [--T 1024] [--calls 300] [--threads-off] [--gc-off]

Summed as their own rows: each kernel's launch (`ops.launch.CachedLaunch.__call__`, by kernel), of
which the descriptor launches' `TensorMaps.launch` (and of that Triton's C launcher), the stream and
hook questions (`_current_stream`, `_hooks_idle`), the allocations (`torch.empty`,
`torch.empty_like`), the forward's and backward's launch functions (`moda_fwd_tma`, `moda_bwd_tma`),
the descriptor check `tma_usable` and the side stream's `run_beside`.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch

import moda_bench.kernels.launch as launch
import moda_bench.kernels.moda.triton.interface as kernel
from moda_bench.kernels.moda import moda_attention
from host_probe import probe_inputs, shape_args  # tools/ is on sys.path when this file runs

CLOCK = time.perf_counter
STAMPS: dict = {}
SUMS: dict = {}


def _stamped(name: str, fn):
    def wrapper(*a, **k):
        STAMPS[name + ">"] = CLOCK()
        out = fn(*a, **k)
        STAMPS[name + "<"] = CLOCK()
        return out
    return wrapper


def _summed(name: str, fn):
    def wrapper(*a, **k):
        t0 = CLOCK()
        out = fn(*a, **k)
        SUMS[name] = SUMS.get(name, 0.0) + CLOCK() - t0
        return out
    return wrapper


def install() -> None:
    """Wrap the forward and backward of `EagerMoDA` (eager moda_attention's autograd Function),
    `moda_fwd`, `moda_bwd`, the cached launches and the allocations (module globals and class
    attributes are looked up at call time)."""
    from moda_bench.kernels.moda.triton.interface import EagerMoDA
    F = EagerMoDA
    fwd, bwd = F.forward, F.backward
    F.forward = staticmethod(_stamped("Function.forward", fwd))
    F.backward = staticmethod(_stamped("Function.backward", bwd))
    kernel.moda_fwd = _stamped("moda_fwd", kernel.moda_fwd)
    kernel.moda_bwd = _stamped("moda_bwd", kernel.moda_bwd)
    call = launch.CachedLaunch.__call__

    def by_kernel(self, *a, **k):
        t0 = CLOCK()
        out = call(self, *a, **k)
        name = "launch " + getattr(self.fn, "__name__", "?")
        SUMS[name] = SUMS.get(name, 0.0) + CLOCK() - t0
        return out
    launch.CachedLaunch.__call__ = by_kernel
    tm_launch = launch.TensorMaps.launch

    def maps_launch(self, *a, **k):  # its C launcher summed apart (a slot of each kept launch, wrapped once)
        if not getattr(self.raw, "stamped", False):
            self.raw = _summed("C launcher (in TensorMaps.launch)", self.raw)
            self.raw.stamped = True
        return tm_launch(self, *a, **k)
    launch.TensorMaps.launch = _summed("TensorMaps.launch (in the launches)", maps_launch)
    launch._current_stream = _summed("launch._current_stream", launch._current_stream)
    launch._hooks_idle = _summed("launch._hooks_idle", launch._hooks_idle)
    torch.empty = _summed("torch.empty / empty_like", torch.empty)
    torch.empty_like = _summed("torch.empty / empty_like", torch.empty_like)
    for name in ("moda_fwd_tma", "moda_bwd_tma", "tma_usable", "run_beside"):
        setattr(kernel, name, _summed(name, getattr(kernel, name)))


GAPS = [  # (label, from stamp, to stamp)
    ("call -> Function.forward (checks, config, apply)", "call", "Function.forward>"),
    ("Function.forward -> moda_fwd", "Function.forward>", "moda_fwd>"),
    ("moda_fwd", "moda_fwd>", "moda_fwd<"),
    ("moda_fwd -> end of Function.forward (save)", "moda_fwd<", "Function.forward<"),
    ("Function.forward end -> output returned (apply)", "Function.forward<", "returned"),
    ("backward() -> Function.backward (engine start)", "returned", "Function.backward>"),
    ("Function.backward -> moda_bwd (saved tensors)", "Function.backward>", "moda_bwd>"),
    ("moda_bwd", "moda_bwd>", "moda_bwd<"),
    ("moda_bwd -> end of Function.backward", "moda_bwd<", "Function.backward<"),
    ("Function.backward end -> backward() returns", "Function.backward<", "done"),
    ("whole call", "call", "done"),
]


def run(x, leaves, calls: int, drained: bool) -> dict:
    q, k, v, kd, vd, do = (x[n] for n in ("q", "k", "v", "k_depth", "v_depth", "do"))
    rows: dict = {g[0]: [] for g in GAPS}
    sums: dict = {}
    for i in range(calls + 10):
        for t in leaves:
            t.grad = None
        if drained:
            torch.cuda.synchronize()
        STAMPS.clear()
        SUMS.clear()
        STAMPS["call"] = CLOCK()
        o = moda_attention(q, k, v, kd, vd)
        STAMPS["returned"] = CLOCK()
        o.backward(do)
        STAMPS["done"] = CLOCK()
        if i < 10:
            continue
        for label, a, b in GAPS:
            if a in STAMPS and b in STAMPS:
                rows[label].append(1e6 * (STAMPS[b] - STAMPS[a]))
        for name, s in SUMS.items():
            sums.setdefault(name, []).append(1e6 * s)
    torch.cuda.synchronize()
    out = {k_: statistics.median(v_) for k_, v_ in rows.items() if v_}
    out.update({f"  of which {k_}": statistics.median(v_) for k_, v_ in sums.items()})
    return out


def main() -> None:
    p = shape_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--threads-off", action="store_true", help="also without autograd's device threads")
    p.add_argument("--gc-off", action="store_true", help="Python's cyclic garbage collector off (gc.disable)")
    a = p.parse_args()
    x = probe_inputs(a)
    leaves = [t for n, t in x.items() if n != "do" and t is not None]
    install()
    if a.gc_off:
        gc.disable()
    cols = {}
    for threads in ((True, False) if a.threads_off else (True,)):
        with torch.autograd.set_multithreading_enabled(threads):
            for drained in (True, False):
                cols[(threads, drained)] = run(x, leaves, a.calls, drained)
    names = list(dict.fromkeys(n for c in cols.values() for n in c))
    heads = [f"{'threads' if t else 'no threads'} {'idle' if d else 'b2b'}" for t, d in cols]
    print(f"host us, median of {a.calls} eager fwd+bwd calls at T={a.T}, G={a.G}, L={a.L} (columns: autograd's "
          "device threads on/off, one call on an idle GPU/back to back)")
    print(f"  {'':52s} " + " ".join(f"{h:>15s}" for h in heads))
    for n in names:
        print(f"  {n:52s} " + " ".join(f"{c.get(n, float('nan')):15.1f}" for c in cols.values()))


if __name__ == "__main__":
    main()
