"""Session 22 probe: the "tma" backward with its depth part as its own launch of the descriptor dq
kernel (`moda_bwd_tma(depth_beside=)`, SEQ=False) on a side stream, beside the sequence-only dq pass
and the key-major pass on the main stream, dq += the depth share after the join. Against the
default, fwd+bwd interleaved, graph then eager timer; gradients compared. Patches
kernel.moda_bwd_tma (a probe, not the package's path).

    python3 _s22_dbeside.py "T,G,L;..." [max_time]
"""
import sys

import torch

from moda_bench.ops.moda import kernel as km
from moda_bench.ops.moda import moda_attention
from moda_bench.timing import RoundRule, make_inputs, time_interleaved

real = km.moda_bwd_tma
MODE = {"v": None}


def patched(*a, **k):
    var = MODE["v"]
    if var is None:
        return real(*a, **k)
    dev = a[1].device
    k = dict(k, beside=None, depth_beside=lambda main, side: km._run_beside(dev, main, side, var["after"],
                                                                          var["prio"]))
    return real(*a, **k)


km.moda_bwd_tma = patched
VARIANTS = {"default": None, "dbeside": {"after": False, "prio": True}, "dbeside-after": {"after": True, "prio": True},
            "dbeside-noprio": {"after": False, "prio": False}}
points = [tuple(int(x) for x in p.split(",")) for p in sys.argv[1].split(";")]
max_time = float(sys.argv[2]) if len(sys.argv) > 2 else 2.0
for T, G, L in points:
    x = make_inputs(1, T, 8 * G, 8, 64, L, seed=0)
    leaves = [x[n] for n in ("q", "k", "v", "k_depth", "v_depth") if x[n] is not None]
    fns, grads = {}, {}
    for name, var in VARIANTS.items():
        def fn(var=var):
            MODE["v"] = var
            moda_attention(*leaves[:3], *(leaves[3:] or [None, None])).backward(x["do"])
        for t in leaves:
            t.grad = None
        try:
            fn()
        except Exception as e:  # a variant the kernels refuse: say so, go on
            print(f"T={T} G={G} L={L} {name}: failed {type(e).__name__}: {str(e).splitlines()[0][:150]}")
            continue
        grads[name] = [t.grad.float().clone() for t in leaves]
        fns[name] = fn
    errs = {n: max(((a - b).norm() / b.norm()).item() for a, b in zip(grads[n], grads["default"])) for n in fns}
    print(f"T={T} G={G} L={L} grad rel diff vs default: " + ", ".join(f"{n} {e:.1e}" for n, e in errs.items()))
    for timer in ("graph", "eager"):
        res = time_interleaved(fns, baseline="default", timer=timer, grad_to_none={n: leaves for n in fns},
                               rule=RoundRule(max_time_s=max_time))
        line = f"T={T} G={G} L={L} {timer}: default {1e3 * res.measurements['default'].median_ms:.1f} us"
        for n in fns:
            if n != "default":
                r, lo, hi = res.ratios[n]
                line += f" | {n} {r:.3f} [{lo:.3f}-{hi:.3f}]"
        print(line, flush=True)
    MODE["v"] = None
    del x, leaves, fns, grads
    torch.cuda.empty_cache()
