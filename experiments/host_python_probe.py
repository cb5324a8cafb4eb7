"""The Python share of an eager MoDA call's host time, measured on a CPU (no GPU needed): runs
`moda_attention` forward and forward + backward on CPU tensors at T=1024 (G=8, L=64, d=64) with
the GPU default's descriptor ("tma") config forced, every kernel launch stubbed out
(`ops.launch.CachedLaunch.__call__` counts instead of launching) and the CUDA-only checks
bypassed. What it times is the package's Python, torch's Python and C++ dispatch and the CPU
allocator, and the autograd engine on the calling thread: a lower bound of what a GPU host pays
besides the CUDA driver calls (launches, allocations, streams, events) and the engine's hand-off to
its device thread. Prints the median microseconds per call and a cProfile by own time.

    PYTHONPATH=$PWD python3 experiments/host_python_probe.py [--T 1024] [--calls 300] [--top 25]

CI-class CPU, 2026-11-27 (commit 4fb2920): forward 18 us, fwd+bwd 113 us, where the GPU hosts spend
534-625 us of host time on the whole eager call (results/h200/short-t-s26, results/h100/host-desc-s25e).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time

import torch

import moda_bench.kernels.launch as launch
import moda_bench.kernels.moda.triton.descriptors as descriptors
import moda_bench.kernels.moda.triton.interface as kernel
import moda_bench.kernels.moda.triton.bwd_tma_rules as rules
import moda_bench.kernels.moda.triton.bwd_tma as bwd_tma
import moda_bench.kernels.moda.triton.fwd_tma as fwd_tma
import moda_bench.kernels.moda.validate as validate
from moda_bench.kernels.moda import moda_attention
from moda_bench.kernels.moda.config import default_config
from moda_bench.timing import make_inputs

LAUNCHES = {"n": 0}


def _stub() -> None:
    """Launches counted, not made; descriptor and alignment checks answered as on a Hopper GPU."""
    def fake_call(self, key, grid, args, meta):
        LAUNCHES["n"] += 1
    launch.CachedLaunch.__call__ = fake_call
    yes = lambda *a, **k: True  # noqa: E731
    kernel.tma_usable = kernel.descriptors_available = kernel.aligned = yes
    for mod in (descriptors, fwd_tma, bwd_tma, rules):
        mod.host_descriptors = yes
    bwd_tma.aligned16 = yes
    check = validate.check_inputs
    kernel.check_inputs = lambda *a, need_cuda=False, **kw: check(*a, **kw)


def median_us(fn, calls: int) -> float:
    for _ in range(20):
        fn()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e6 * statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--T", type=int, default=1024)
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args()
    _stub()
    x = make_inputs(1, a.T, 64, 8, 64, 64, dtype=torch.bfloat16, device="cpu", requires_grad=True, seed=0)
    q, k, v, kd, vd, do = (x[n] for n in ("q", "k", "v", "k_depth", "v_depth", "do"))
    shape = validate.check_inputs(q, k, v, kd, vd)
    cfg = default_config(shape).replace(fwd_depth="tma", bwd_depth="tma", block_m=64, block_n=64, num_warps=4,
                                        num_stages=3, bwd_q_block_m=64, bwd_q_block_n=64, bwd_kv_block_m=64,
                                        bwd_kv_block_n=64, bwd_kv_beside=1)
    leaves = [q, k, v, kd, vd]

    def fwd():
        return moda_attention(q, k, v, kd, vd, config=cfg)

    def fwdbwd():
        for t in leaves:
            t.grad = None
        fwd().backward(do)

    with torch.no_grad():
        print(f"forward, no graph      {median_us(fwd, a.calls):8.1f} us")
    print(f"forward, graph kept    {median_us(fwd, a.calls):8.1f} us")
    n0 = LAUNCHES["n"]
    print(f"forward + backward     {median_us(fwdbwd, a.calls):8.1f} us "
          f"({(LAUNCHES['n'] - n0) / (a.calls + 20):.0f} launches a call, stubbed)")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(a.calls):
        fwdbwd()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(a.top)
    print(out.getvalue())


if __name__ == "__main__":
    main()
