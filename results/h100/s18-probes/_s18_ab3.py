"""Temporary probe (session 18): the key-major pass's tiles with dp issued first at T=16384 (L=0 and
L=64), interleaved with the default in one process; backward alone; gradients against the default."""
import math
import torch
from moda_bench.ops.moda.config import resolve_config
from moda_bench.ops.moda.kernel import moda_fwd
from moda_bench.ops.moda import kernel_bwd_tma as bt
from moda_bench.ops.moda.validate import check_inputs
from moda_bench.timing import make_inputs

V = {"default": {}, "m32_dp": dict(kv_block_m=32, dp_first=(True, False)), "m32": dict(kv_block_m=32),
     "n128w8_dp": dict(kv_block_n=128, kv_warps=8, kv_maxnreg=0, dp_first=(True, False)),
     "n128w8": dict(kv_block_n=128, kv_warps=8, kv_maxnreg=0, dp_first=(False, False)),
     "n128w8_dp_cap": dict(kv_block_n=128, kv_warps=8, kv_maxnreg=168, dp_first=(True, False))}
for (T, G, L) in [(16384, 8, 0), (16384, 8, 64)]:
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
              block_l=cfg.bwd_block_l, depth_stages=cfg.bwd_depth_stages, mix=bt.dq_mix(T, L))
    kdd, vdd = (kd, vd) if L else (None, None)
    fns = {}
    for n, ov in V.items():
        f = (lambda ov=ov: bt.moda_bwd_tma(do, q, k, v, kdd, vdd, o, lse, scale, G, **dict(kw, **ov)))
        try:
            f(); f(); torch.cuda.synchronize(); fns[n] = f
        except Exception as e:  # a variant that does not compile or launch is reported, not timed
            print(f"  {n}: {type(e).__name__}: {str(e).splitlines()[0][:150]}", flush=True)
    res = {n: [] for n in fns}
    for rnd in range(12):
        order = list(fns.items()) if rnd % 2 == 0 else list(reversed(list(fns.items())))
        for n, f in order:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(3):
                f()
            e.record(); e.synchronize()
            res[n].append(s.elapsed_time(e) / 3)
    med = {n: sorted(v)[len(v) // 2] for n, v in res.items()}
    ref = fns["default"]()
    flops = 2.5 * 2 * T * T * G * 8 * 64
    print(f"T={T} G={G} L={L}: default {med['default']:.3f} ms" + (f" = {flops / med['default'] / 1e9:.1f} TFLOP/s" if L == 0 else ""), flush=True)
    for n in list(fns)[1:]:
        got = fns[n]()
        err = max((((a.float() - b.float()).norm() / b.float().norm()).item() if a is not None else 0.0) for a, b in zip(got, ref))
        r = sorted(a / b for a, b in zip(res[n], res["default"]))
        print(f"    {n:14s} {med[n]:.3f} ms  /default {med[n] / med['default']:.3f} [rounds p17-p83 {r[2]:.3f}-{r[-3]:.3f}]  rel err vs default {err:.1e}", flush=True)
