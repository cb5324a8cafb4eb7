"""Session 20 probe: the descriptor forward at G=32 took 204 registers a thread (one 8-warp program an
SM; 125 and two at G=8, ncu). Forward alone and fwd+bwd, interleaved under the graph timer at
T=16384, Hk=8, G=32: the default (pointer "split" forward) against the descriptor forward with its
registers capped (maxnreg), by wrapping kernel.moda_fwd_tma (a probe); outputs compared."""
import functools

import torch

from moda_bench.ops.moda import kernel as km
from moda_bench.ops.moda import moda_attention
from moda_bench.ops.moda.config import resolve_config
from moda_bench.ops.moda.validate import check_inputs
from moda_bench.timing import RoundRule, make_inputs, time_interleaved

real = km.moda_fwd_tma
VARIANTS = {"default": None,
            "tma": dict(block_m=128, num_warps=8, block_l=32, maxnreg=0),
            "tma_r128": dict(block_m=128, num_warps=8, block_l=32, maxnreg=128),
            "tma_m64_r168": dict(block_m=64, num_warps=4, block_l=32, maxnreg=168)}
for L in (0, 64):
    x = make_inputs(1, 16384, 256, 8, 64, L, seed=0)
    a = [x[n] for n in ("q", "k", "v", "k_depth", "v_depth")]
    leaves = [t for t in a if t is not None]
    base = resolve_config(check_inputs(*a), a[0].dtype)
    cfgs = {}
    for name, v in VARIANTS.items():
        if v is None:
            cfgs[name] = (base, 0)
        else:
            cfgs[name] = (base.replace(fwd_depth="tma", block_m=v["block_m"], num_warps=v["num_warps"], num_stages=3,
                                       block_l=v["block_l"]), v["maxnreg"])
    outs = {}
    for name, (cfg, reg) in cfgs.items():
        km.moda_fwd_tma = functools.partial(real, maxnreg=reg)
        with torch.no_grad():
            outs[name] = moda_attention(*a, config=cfg).float()
    km.moda_fwd_tma = real
    diffs = {n: ((o - outs["default"]).norm() / outs["default"].norm()).item() for n, o in outs.items()}
    for pass_ in ("fwd", "fwdbwd"):
        fns = {}
        for name, (cfg, reg) in cfgs.items():
            def fn(cfg=cfg, reg=reg):
                km.moda_fwd_tma = functools.partial(real, maxnreg=reg)
                if pass_ == "fwd":
                    with torch.no_grad():
                        moda_attention(*a, config=cfg)
                else:
                    moda_attention(*a, config=cfg).backward(x["do"])
            fns[name] = fn
        res = time_interleaved(fns, baseline="default", timer="graph", grad_to_none={n: leaves for n in fns},
                               rule=RoundRule(max_time_s=2.5))
        km.moda_fwd_tma = real
        line = f"G=32 L={L} {pass_}: default {res.measurements['default'].median_ms:.2f} ms"
        for name in list(fns)[1:]:
            r, lo, hi = res.ratios[name]
            line += f" | {name} {r:.3f} [{lo:.3f}-{hi:.3f}] ({diffs[name]:.1e})"
        print(line, flush=True)
    del x, a, leaves, outs
    torch.cuda.empty_cache()
