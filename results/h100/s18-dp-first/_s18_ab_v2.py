"""Temporary probe (session 18): the order of a backward step's products (dp issued before the
exponentials, `dp_first`) and the register cap, per pass, interleaved in one process; backward
alone; gradients compared with the first variant (the default)."""
import math
import torch
from moda_bench.ops.moda.config import resolve_config
from moda_bench.ops.moda.kernel import moda_fwd
from moda_bench.ops.moda import kernel_bwd_tma as bt
from moda_bench.ops.moda.validate import check_inputs
from moda_bench.timing import make_inputs

LONG = {"default": {}, "kv_dp_uncapped": dict(kv_maxnreg=0, dp_first=(True, False)),
        "kv_dp_cap200": dict(kv_maxnreg=200, dp_first=(True, False)), "kv_dp_cap232": dict(kv_maxnreg=232, dp_first=(True, False)),
        "kv_uncapped": dict(kv_maxnreg=0, dp_first=(False, False)), "dq_dp": dict(dp_first=(False, True))}
SHORT = {"default": {}, "after": dict(dp_first=(False, False)), "kv_first": dict(dp_first=(True, False)),
         "dq_first": dict(dp_first=(False, True))}
shapes = [(16384, 8, 0, LONG), (16384, 8, 64, LONG), (8192, 8, 64, {k: LONG[k] for k in ("default", "kv_dp_uncapped", "kv_uncapped", "kv_dp_cap232")}),
          (4096, 8, 64, SHORT), (1024, 8, 64, SHORT), (2048, 8, 0, SHORT), (4096, 2, 64, SHORT), (4096, 8, 256, SHORT)]
for (T, G, L, variants) in shapes:
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
              block_l=cfg.bwd_block_l, depth_stages=cfg.bwd_depth_stages, mix=bt.dq_mix(T, L),
              kv_chunk=bt.kv_chunk(cfg, 1, T, 8, G, torch.cuda.get_device_properties(0).multi_processor_count))
    kdd, vdd = (kd, vd) if L else (None, None)
    fns = {n: (lambda ov=ov: bt.moda_bwd_tma(do, q, k, v, kdd, vdd, o, lse, scale, G, **dict(kw, **ov)))
           for n, ov in variants.items()}
    for f in fns.values():
        f(); f()
    torch.cuda.synchronize()
    res = {n: [] for n in fns}
    reps = 3 if T >= 8192 else 20
    for rnd in range(12):
        order = list(fns.items()) if rnd % 2 == 0 else list(reversed(list(fns.items())))
        for n, f in order:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(reps):
                f()
            e.record(); e.synchronize()
            res[n].append(s.elapsed_time(e) / reps)
    med = {n: sorted(v)[len(v) // 2] for n, v in res.items()}
    ref = fns["default"]()
    flops = 2.5 * 2 * T * T * G * 8 * 64  # causal sequence part: fwd 2*T^2*Hq*d, backward 2.5x
    print(f"T={T} G={G} L={L} (default: kv_maxnreg {cfg.bwd_kv_maxnreg}, q_maxnreg {cfg.bwd_q_maxnreg}, chunk {kw['kv_chunk']}): "
          f"default {med['default']:.3f} ms" + (f" = {flops / med['default'] / 1e9:.1f} TFLOP/s" if L == 0 else ""), flush=True)
    for n in list(fns)[1:]:
        got = fns[n]()
        same = all((a is None and b is None) or torch.equal(a, b) for a, b in zip(ref, got))
        lo, hi = sorted(a / b for a, b in zip(res[n], res["default"]))[2], sorted(a / b for a, b in zip(res[n], res["default"]))[-3]
        print(f"    {n:16s} {med[n]:.3f} ms  {n}/default {med[n] / med['default']:.3f} [round ratios p17-p83 {lo:.3f}-{hi:.3f}]  bitwise {same}", flush=True)
