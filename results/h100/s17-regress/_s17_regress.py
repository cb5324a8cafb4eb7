"""Temporary probe: the backward's two passes, old (54c5383) against new kernel_bwd_tma, interleaved."""
import math, sys, importlib.util
import torch
from moda_bench.ops.moda.config import resolve_config
from moda_bench.ops.moda.kernel import moda_fwd
from moda_bench.ops.moda.validate import check_inputs
from moda_bench.ops.moda import kernel_bwd_tma as new
from moda_bench.timing import make_inputs
spec = importlib.util.spec_from_file_location("old_bwd_tma", "tools/_old_bwd_tma.py")
old = importlib.util.module_from_spec(spec); spec.loader.exec_module(old)

for (T, G, L) in [(16384, 8, 64), (16384, 2, 64), (16384, 8, 0), (8192, 8, 64), (4096, 8, 64)]:
    x = make_inputs(1, T, G * 8, 8, 64, L, seed=0)
    q, k, v = (x[n].detach() for n in ("q", "k", "v"))
    kd, vd = ((x[n].detach() if x[n] is not None else None) for n in ("k_depth", "v_depth"))
    do = x["do"]
    shape = check_inputs(q, k, v, kd, vd, need_cuda=True)
    cfg = resolve_config(shape, q.dtype)
    scale = 1 / math.sqrt(64)
    o, lse = moda_fwd(q, k, v, kd, vd, scale, shape, cfg)
    kw = dict(q_block_m=cfg.bwd_q_block_m, q_block_n=cfg.bwd_q_block_n, q_warps=cfg.bwd_q_warps, q_stages=cfg.bwd_q_stages,
              q_maxnreg=cfg.bwd_q_maxnreg, kv_block_m=cfg.bwd_kv_block_m, kv_block_n=cfg.bwd_kv_block_n,
              kv_warps=cfg.bwd_kv_warps, kv_stages=cfg.bwd_kv_stages, kv_maxnreg=cfg.bwd_kv_maxnreg,
              block_l=cfg.bwd_block_l, depth_stages=cfg.bwd_depth_stages, mix=old.dq_mix(T, L))
    kdd, vdd = (kd, vd) if L else (None, None)
    fns = {"old": lambda: old.moda_bwd_tma(do, q, k, v, kdd, vdd, o, lse, scale, G, **kw),
           "new": lambda: new.moda_bwd_tma(do, q, k, v, kdd, vdd, o, lse, scale, G, **kw)}
    for f in fns.values():
        f(); f()
    torch.cuda.synchronize()
    res = {n: [] for n in fns}
    for rep in range(8):
        for n, f in (fns.items() if rep % 2 == 0 else reversed(list(fns.items()))):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(); f(); f(); f(); e.record(); e.synchronize()
            res[n].append(s.elapsed_time(e) / 3)
    med = {n: sorted(v)[len(v) // 2] for n, v in res.items()}
    a, b = fns["old"](), fns["new"]()
    same = all((x is None and y is None) or torch.equal(x, y) for x, y in zip(a, b))
    print(f"T={T} G={G} L={L} stages={cfg.bwd_depth_stages} maxnreg={cfg.bwd_kv_maxnreg}: bwd old {med['old']:.3f} ms new {med['new']:.3f} ms "
          f"new/old {med['new'] / med['old']:.3f}  bitwise {same}")
