"""Where a fwd+bwd of each MoDA route and of FA4 spends its time at the short lengths (issue 60,
item 2): per provider and T, torch.profiler's device time per kernel (summed over N calls, divided
by N), the kernel count, the GPU-busy time against the wall time of a call (the gap is host, launch
and idle time) and the span from the first kernel's start to the last kernel's end. Needs a CUDA GPU.

    PYTHONPATH=$PWD python3 experiments/short_t_profile.py --T 4096,8192 \
        --providers moda-triton,moda-fused,moda-overlap,fa4 --out short_t_profile.csv

Writes two CSVs: `<out>` (one row per provider and T: wall ms, device-busy ms, span ms, kernels per
call) and `<out stem>_kernels.csv` (one row per kernel name: calls per step, device ms per step).
Not the moda-bench schema: a probe, whose figures go into the issue's note.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd
import torch

from moda_bench.bench.providers import get_provider
from moda_bench.bench.runner import Point
from moda_bench.timing import grad_inputs, make_inputs, make_pass_fn


def build(name: str, T: int, G: int, L: int, Hk: int, d: int):
    """The fwd+bwd callable of provider `name` at the point, with the same inputs as a sweep."""
    prov = get_provider(name)
    point = Point(T=T, G=G, L=L, Hk=Hk, d=d)
    inputs = make_inputs(1, T, point.Hq, Hk, d, prov.depth_entries(point), dtype=torch.bfloat16, device="cuda",
                         seed=0)
    prepared = prov.prepare(inputs, point, None)
    if prepared.do is not None:
        inputs = dict(inputs, do=prepared.do)
    step, grads = make_pass_fn(prepared.forward, inputs, "fwdbwd"), grad_inputs(inputs)

    def fn():  # gradients set to None first, as the sweep's timer does: no AccumulateGrad additions
        for t in grads:
            t.grad = None
        return step()
    return fn, prepared.impl_detail


def profile_one(fn, calls: int):
    """(wall ms per call, kernel events) of `calls` back-to-back calls after a warm-up."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) * 1e3 / calls
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return wall, kernels


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", default="4096,8192")
    ap.add_argument("--providers", default="moda-triton,moda-fused,moda-overlap,fa4")
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--L", type=int, default=64)
    ap.add_argument("--Hk", type=int, default=8)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--out", default="short_t_profile.csv")
    args = ap.parse_args()
    rows, krows = [], []
    for T in (int(t) for t in args.T.split(",")):
        for name in args.providers.split(","):
            try:
                fn, detail = build(name, T, args.G, args.L, args.Hk, args.d)
                wall, ks = profile_one(fn, args.calls)
            except Exception as exc:  # a route that cannot run here: say so and go on
                print(f"T={T} {name}: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
                continue
            busy = sum(e.device_time_total for e in ks) / 1e3 / args.calls
            span = ((max(e.time_range.end for e in ks) - min(e.time_range.start for e in ks)) / 1e3 / args.calls
                    if ks else float("nan"))
            rows.append(dict(T=T, provider=name, impl_detail=detail, wall_ms=wall, busy_ms=busy, span_ms=span,
                             kernels_per_call=len(ks) / args.calls))
            per = pd.DataFrame([dict(kernel=e.name[:90], ms=e.device_time_total / 1e3) for e in ks])
            if len(per):
                agg = per.groupby("kernel")["ms"].agg(["count", "sum"]).reset_index()
                for r in agg.itertuples(index=False):
                    krows.append(dict(T=T, provider=name, kernel=r.kernel, calls=r.count / args.calls,
                                      ms=r.sum / args.calls))
            print(f"T={T} {name:13s} wall {wall:7.3f} ms  busy {busy:7.3f}  span {span:7.3f}  "
                  f"kernels {len(ks) / args.calls:4.1f}  ({detail[:70]})")
            for r in sorted((k for k in krows if k["T"] == T and k["provider"] == name), key=lambda k: -k["ms"])[:6]:
                print(f"      {r['ms']:7.3f} ms x{r['calls']:.0f}  {r['kernel']}")
    out = Path(args.out)
    pd.DataFrame(rows).to_csv(out, index=False)
    pd.DataFrame(krows).to_csv(out.with_name(out.stem + "_kernels.csv"), index=False)


if __name__ == "__main__":
    main()
