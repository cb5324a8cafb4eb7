"""Where the host time of one eager MoDA call goes (issue 21's launch tax): issues N fwd+bwd calls of
`moda_attention` (and of SDPA's flash backend, the FA2 peer) back to back at a short T, where the
host is slower than the GPU, and prints the host microseconds per call (issue time over N; the
GPU time of the same call under a CUDA graph for scale) and a cProfile of the moda calls: the
functions with the most own time and the most cumulative time.

    python3 tools/host_probe.py [--T 1024] [--G 8] [--L 64] [--calls 200] [--top 25]

A diagnosis tool (its numbers come from Python's clock and cProfile, not the suite's timing).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch
import torch.nn.functional as F

from moda_bench.ops.moda import moda_attention
from moda_bench.timing import make_inputs, time_fn


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--T", type=int, default=1024)
    p.add_argument("--G", type=int, default=8)
    p.add_argument("--Hk", type=int, default=8)
    p.add_argument("--L", type=int, default=64)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args()
    x = make_inputs(1, a.T, a.G * a.Hk, a.Hk, 64, a.L, seed=0)
    leaves = [t for k, t in x.items() if k != "do" and t is not None]

    def moda():
        for t in leaves:
            t.grad = None
        moda_attention(x["q"], x["k"], x["v"], x["k_depth"], x["v_depth"]).backward(x["do"])

    def fa2():
        for t in leaves:
            t.grad = None
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            o = F.scaled_dot_product_attention(x["q"].transpose(1, 2), x["k"].transpose(1, 2), x["v"].transpose(1, 2),
                                               is_causal=True, enable_gqa=True)
        o.transpose(1, 2).backward(x["do"])

    for name, fn in (("moda", moda), ("fa2", fa2)):
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(a.calls):
            fn()
        issued = time.perf_counter() - t0
        torch.cuda.synchronize()
        total = time.perf_counter() - t0
        gpu = time_fn(fn, timer="graph").median_ms
        print(f"{name:5s} T={a.T}: host {1e6 * issued / a.calls:7.1f} us per fwd+bwd call issued, "
              f"{1e6 * total / a.calls:7.1f} us with the queue drained; GPU (graph) {1e3 * gpu:7.1f} us")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(a.calls):
        moda()
    torch.cuda.synchronize()
    prof.disable()
    for key in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats(key).print_stats(a.top)
        print(f"--- moda, by {key} ({a.calls} calls)\n" + "\n".join(out.getvalue().splitlines()[4:]))


if __name__ == "__main__":
    main()
