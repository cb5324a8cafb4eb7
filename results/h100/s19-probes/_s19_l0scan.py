"""Temporary probe (session 19): the L=0 backward at T=16384, G=8 (issue 21's 400 TFLOP/s target),
stage counts of each pass against the default, backward alone, interleaved rounds; gradients
compared bitwise with the default's."""
import math, sys
import torch
from moda_bench.ops.moda.config import resolve_config
from moda_bench.ops.moda.kernel import moda_fwd
from moda_bench.ops.moda import kernel_bwd_tma as bt
from moda_bench.ops.moda.validate import check_inputs
from moda_bench.timing import make_inputs

VARIANTS = {"default": {}, "kv_s2": dict(kv_stages=2), "kv_s4": dict(kv_stages=4), "q_s2": dict(q_stages=2),
            "q_s4": dict(q_stages=4), "q_uncapped": dict(q_maxnreg=0)}
T, G, L = 16384, 8, 0
for arg in sys.argv[1:]:
    T, G, L = (int(x) for x in arg.split(","))
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
    fns = {}
    for n, ov in VARIANTS.items():
        f = (lambda ov=ov: bt.moda_bwd_tma(do, q, k, v, kdd, vdd, o, lse, scale, G, **dict(kw, **ov)))
        try:
            f(); f(); torch.cuda.synchronize()
            fns[n] = f
        except Exception as e:  # a variant that does not compile or fit: say so, keep the others
            print(f"    {n}: failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}", flush=True)
    res = {n: [] for n in fns}
    reps = 3 if T >= 8192 else 20
    for rnd in range(14):
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
    flops = 2.5 * 2 * T * T * G * 8 * 64
    print(f"T={T} G={G} L={L} (stages kv {cfg.bwd_kv_stages} q {cfg.bwd_q_stages}, maxnreg kv {cfg.bwd_kv_maxnreg} "
          f"q {cfg.bwd_q_maxnreg}): default {med['default']:.3f} ms" + (f" = {flops / med['default'] / 1e9:.1f} TFLOP/s" if L == 0 else ""), flush=True)
    for n in list(fns)[1:]:
        got = fns[n]()
        same = all((a is None and b is None) or torch.equal(a, b) for a, b in zip(ref, got))
        r = sorted(a / b for a, b in zip(res[n], res["default"]))
        print(f"    {n:12s} {med[n]:.3f} ms  /default {med[n] / med['default']:.3f} [round ratios p17-p83 {r[2]:.3f}-{r[-3]:.3f}]  bitwise {same}", flush=True)
