"""Session 22 probe: Depth-Attention's mix launches from `CachedLaunch` against Triton's own path
(`set_fast_launch`), eager, interleaved: the fused mix alone (`depth_mix`) and the composed
`depth_attention`, fwd+bwd; host us a call (issued back to back) beside.
Usage: python3 _s22_dattn_launch.py "T,S;..." MAXTIME"""
import sys
import time

import torch

from moda_bench.ops.dattn import depth_attention, depth_mix
from moda_bench.ops.launch import set_fast_launch
from moda_bench.timing import RoundRule, time_interleaved

max_time = float(sys.argv[2]) if len(sys.argv) > 2 else 2.0
for spec in sys.argv[1].split(";"):
    T, S = (int(x) for x in spec.split(","))
    g = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*s):
        return torch.randn(*s, generator=g, device="cuda", dtype=torch.float32).to(torch.bfloat16).requires_grad_(True)
    q, k, v = rnd(1, T, 64, 64), rnd(1, T, 8, 64), rnd(1, T, 8, 64)
    ks, vs = rnd(1, T, S, 8, 64), rnd(1, T, S, 8, 64)
    leaves = [q, k, v, ks, vs]
    for name, op in (("mix", lambda: depth_mix(q, k, v, ks, vs)), ("dattn", lambda: depth_attention(q, k, v, ks, vs))):
        do = torch.randn_like(op())

        def call(fast, op=op, do=do):
            def fn():
                set_fast_launch(fast)
                op().backward(do)
            return fn
        fns = {"triton": call(False), "cached": call(True)}
        for fn in fns.values():
            fn()
        for n, fn in fns.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(100):
                fn()
            host = (time.perf_counter() - t0) / 100 * 1e6
            torch.cuda.synchronize()
            print(f"T={T} S={S} {name:5s} host {n:7s} {host:8.1f} us a call", flush=True)
        res = time_interleaved(fns, baseline="triton", timer="eager", grad_to_none={n: leaves for n in fns},
                               rule=RoundRule(max_time_s=max_time))
        for n in fns:
            r, lo, hi = res.ratios.get(n, (1.0, 1.0, 1.0))
            print(f"T={T} S={S} {name:5s} eager {n:7s} {1e3 * res.measurements[n].median_ms:8.1f} us  "
                  f"x triton {r:.3f} [{lo:.3f}-{hi:.3f}]", flush=True)
    set_fast_launch(True)
