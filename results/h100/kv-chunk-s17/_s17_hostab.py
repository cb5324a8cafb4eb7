"""Temporary probe: host time of moda_bwd chunked vs unchunked at T=1024, and cProfile of both."""
import cProfile, io, math, pstats, sys, time
import torch
from moda_bench.ops.moda.config import resolve_config
from moda_bench.ops.moda.kernel import moda_bwd, moda_fwd
from moda_bench.ops.moda.validate import check_inputs
from moda_bench.timing import make_inputs

T = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
L = int(sys.argv[2]) if len(sys.argv) > 2 else 64
x = make_inputs(1, T, 64, 8, 64, L, seed=0)
q, k, v, kd, vd, do = (x[n] for n in ("q", "k", "v", "k_depth", "v_depth", "do"))
q, k, v = (t.detach() for t in (q, k, v))
kd, vd = (t.detach() if t is not None else None for t in (kd, vd))
shape = check_inputs(q, k, v, kd, vd, need_cuda=True)
base = resolve_config(shape, q.dtype)
scale = 1 / math.sqrt(64)
o, lse = moda_fwd(q, k, v, kd, vd, scale, shape, base)
cfgs = {"chunk=0": base.replace(bwd_kv_chunk=0), "chunk=-1": base}
fns = {n: (lambda c=c: moda_bwd(do, q, k, v, kd, vd, o, lse, scale, shape, c)) for n, c in cfgs.items()}
for f in fns.values():
    for _ in range(20):
        f()
torch.cuda.synchronize()
res = {n: [] for n in fns}
for rep in range(12):
    for n, f in (fns.items() if rep % 2 == 0 else reversed(list(fns.items()))):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(100):
            f()
        res[n].append((time.perf_counter() - t0) * 1e4)
        torch.cuda.synchronize()
for n, v_ in res.items():
    v_.sort()
    print(f"host us a moda_bwd call, {n:10s} min {v_[0]:7.1f}  median {v_[len(v_) // 2]:7.1f}")
for n, f in fns.items():
    pr = cProfile.Profile()
    torch.cuda.synchronize()
    pr.enable()
    for _ in range(100):
        f()
    pr.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(18)
    print(f"=== cProfile {n} (100 calls)")
    print("\n".join(s.getvalue().splitlines()[:40]))
