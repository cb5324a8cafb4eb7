"""Session 22 probe: the descriptor forward in 64-row programs of 4 warps (block_m=64,
num_warps=4) against the default's 128 rows of 8 warps, fwd+bwd (graph and eager) at the paper
rows and the short rows, and the forward alone at some; outputs compared. Usage:
python3 _s22_fwd64.py "T,G,L[,fwd];..." MAXTIME"""
import sys

import torch

from moda_bench.ops.moda import moda_attention
from moda_bench.ops.moda.config import resolve_config
from moda_bench.ops.moda.validate import check_inputs
from moda_bench.timing import RoundRule, make_inputs, make_pass_fn, time_interleaved

max_time = float(sys.argv[2]) if len(sys.argv) > 2 else 2.0
for spec in sys.argv[1].split(";"):
    parts = spec.split(",")
    T, G, L = (int(x) for x in parts[:3])
    pass_ = parts[3] if len(parts) > 3 else "fwdbwd"
    x = make_inputs(1, T, 8 * G, 8, 64, L, seed=0)
    leaves = [t for k_, t in x.items() if k_ != "do" and t is not None]
    args = (x["q"], x["k"], x["v"], x["k_depth"], x["v_depth"])
    base = resolve_config(check_inputs(*args), torch.bfloat16)
    if base.fwd_depth != "tma" or base.block_m != 128:
        print(f"T={T} G={G} L={L}: default forward {base.fwd_depth} m{base.block_m}: skipped", flush=True)
        continue
    cfgs = {"default": base, "m64w4": base.replace(block_m=64, num_warps=4)}
    with torch.no_grad():
        o = {n: moda_attention(*args, config=c).float() for n, c in cfgs.items()}
    diff = float((o["m64w4"] - o["default"]).norm() / o["default"].norm())
    fns = {}
    for n, c in cfgs.items():
        fns[n] = make_pass_fn(lambda c=c: moda_attention(*args, config=c), x, pass_)
        fns[n]()
    line = f"T={T} G={G} L={L} {pass_} (out diff {diff:.1e})"
    for timer in ("graph", "eager"):
        res = time_interleaved(fns, baseline="default", timer=timer, grad_to_none={n: leaves for n in fns},
                               rule=RoundRule(max_time_s=max_time))
        r, lo, hi = res.ratios["m64w4"]
        line += f" | {timer} default {1e3 * res.measurements['default'].median_ms:.1f} us, m64w4 {r:.3f} [{lo:.3f}-{hi:.3f}]"
    print(line, flush=True)
    del x, leaves, fns, o
    torch.cuda.empty_cache()
