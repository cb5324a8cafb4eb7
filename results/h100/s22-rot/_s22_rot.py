"""Session 22 probe: the descriptor forward's rotated unmasked loop (`moda_fwd_tma(rot=True)`: the
previous tile's p v first, the next tile's scores in flight during the current softmax) against
the default loop, the forward alone (and fwd+bwd at the first point), graph and eager timers;
outputs compared. Patches kernel.moda_fwd_tma. Usage: python3 _s22_rot.py "T,L;..." MAXTIME"""
import sys

import torch

from moda_bench.ops.moda import kernel as km
from moda_bench.ops.moda import moda_attention
from moda_bench.ops.moda.config import resolve_config
from moda_bench.ops.moda.validate import check_inputs
from moda_bench.timing import RoundRule, make_inputs, make_pass_fn, time_interleaved

real = km.moda_fwd_tma
MODE = {"rot": False}
km.moda_fwd_tma = lambda *a, **k: real(*a, rot=MODE["rot"], **k)
max_time = float(sys.argv[2]) if len(sys.argv) > 2 else 2.0
for n, spec in enumerate(sys.argv[1].split(";")):
    T, L = (int(x) for x in spec.split(","))
    x = make_inputs(1, T, 64, 8, 64, L, seed=0)
    leaves = [t for k_, t in x.items() if k_ != "do" and t is not None]
    args = (x["q"], x["k"], x["v"], x["k_depth"], x["v_depth"])
    base = resolve_config(check_inputs(*args), torch.bfloat16)
    variants = {"default": (False, base), "rot": (True, base),
                "rot-m64w4": (True, base.replace(block_m=64, num_warps=4)),
                "m64w4": (False, base.replace(block_m=64, num_warps=4)),
                "rot-m64w4-r168": (True, base.replace(block_m=64, num_warps=4, fwd_maxnreg=168))}
    outs = {}
    for name, (rot, cfg) in variants.items():
        MODE["rot"] = rot
        with torch.no_grad():
            outs[name] = moda_attention(*args, config=cfg).float()
    print(f"T={T} L={L} out rel diff vs default: " + ", ".join(
        f"{k_} {float((o - outs['default']).norm() / outs['default'].norm()):.1e}" for k_, o in outs.items()), flush=True)
    for pass_ in (("fwd", "fwdbwd") if n == 0 else ("fwd",)):
        fns = {}
        for name, (rot, cfg) in variants.items():
            inner = make_pass_fn(lambda cfg=cfg: moda_attention(*args, config=cfg), x, pass_)

            def fn(inner=inner, rot=rot):
                MODE["rot"] = rot
                inner()
            fn()
            fns[name] = fn
        for timer in ("graph", "eager"):
            res = time_interleaved(fns, baseline="default", timer=timer, grad_to_none={k_: leaves for k_ in fns},
                                   rule=RoundRule(max_time_s=max_time))
            line = f"T={T} L={L} {pass_} {timer}: default {1e3 * res.measurements['default'].median_ms:.1f} us"
            for name in fns:
                if name != "default":
                    r, lo, hi = res.ratios[name]
                    line += f" | {name} {r:.3f} [{lo:.3f}-{hi:.3f}]"
            print(line, flush=True)
