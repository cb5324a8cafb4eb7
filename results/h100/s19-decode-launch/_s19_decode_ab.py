"""Temporary probe (session 19): decode steps with the cached launches (ops.launch.CachedLaunch)
against Triton's own launch path, eager and graph timers interleaved in one process (the suite's
timing: ratios with 95% intervals), at decode preset points; host us a step for each."""
import time
import torch
from moda_bench.ops.decode import moda_decode
from moda_bench.ops.launch import set_fast_launch
from moda_bench.timing import RoundRule, time_interleaved

for B, T in ((1, 2048), (8, 2048), (1, 32768), (8, 32768)):
    g = torch.Generator(device="cuda").manual_seed(B * T)
    q = torch.randn(B, 1, 64, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(B, T, 8, 64, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    kd, vd = (torch.randn(B, 1, 64, 8, 64, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))

    def step(fast):
        def fn():
            set_fast_launch(fast)
            return moda_decode(q, k, v, kd, vd)
        return fn

    fns = {"triton": step(False), "cached": step(True)}
    outs = {n: f() for n, f in fns.items()}
    same = torch.equal(outs["triton"], outs["cached"])
    for n, f in fns.items():
        for _ in range(50):
            f()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(300):
            f()
        host = (time.perf_counter() - t0) / 300 * 1e6
        torch.cuda.synchronize()
        print(f"B={B} T={T} host {n:7s} {host:7.1f} us a step", flush=True)
    for timer in ("eager", "graph"):
        res = time_interleaved(fns, baseline="triton", timer=timer, rule=RoundRule(max_time_s=2))
        for n in fns:
            m = res.measurements[n]
            r, lo, hi = res.ratios.get(n, (1.0, 1.0, 1.0))
            print(f"B={B} T={T} {timer:5s} {n:7s} {1e3 * m.median_ms:8.1f} us  x triton's path {r:.3f} "
                  f"[{lo:.3f}-{hi:.3f}]  bitwise {same}", flush=True)
    set_fast_launch(True)
