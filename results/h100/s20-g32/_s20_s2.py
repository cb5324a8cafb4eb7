"""Session 20 probe: the G=32 dq pass with its two positions in one 64-row depth sub-tile (S=2,
a block-diagonal product, 16 entries a position a step) against the default (S=1, 32 entries),
fwd+bwd interleaved under the graph timer; gradients compared. Monkeypatches
kernel_bwd_tma.bwd_depth_geometry (a probe, not a config field)."""
import torch

from moda_bench.ops.moda import moda_attention
from moda_bench.ops.moda import kernel_bwd_tma as kb
from moda_bench.timing import RoundRule, make_inputs, time_interleaved

real = kb.bwd_depth_geometry


def forced(S_new):
    def geo(G, block_m, L, block_l=0):
        gp, P, S, bl = real(G, block_m, L, block_l)
        cols = S * bl
        return gp, P, S_new, max(1, cols // S_new)
    return geo


for T in (16384, 4099):
    x = make_inputs(1, T, 256, 8, 64, 64, seed=0)
    leaves = [x[n] for n in ("q", "k", "v", "k_depth", "v_depth")]
    grads = {}
    fns = {}
    for name, S in (("S1", None), ("S2", 2)):
        def fn(S=S):
            kb.bwd_depth_geometry = forced(S) if S else real
            moda_attention(*leaves).backward(x["do"])
        for t in leaves:
            t.grad = None
        fn()
        grads[name] = [t.grad.float().clone() for t in leaves]
        fns[name] = fn
    errs = [((a - b).norm() / b.norm()).item() for a, b in zip(grads["S2"], grads["S1"])]
    print(f"T={T} G=32 L=64: S2 vs S1 gradient rel diff {['%.2e' % e for e in errs]}")
    res = time_interleaved(fns, baseline="S1", timer="graph", grad_to_none={n: leaves for n in fns},
                           rule=RoundRule(max_time_s=3.0))
    for name in fns:
        r, lo, hi = res.ratios.get(name, (1.0, 1.0, 1.0))
        print(f"  graph {name} {res.measurements[name].median_ms:8.2f} ms  x S1 {r:.3f} [{lo:.3f}-{hi:.3f}]")
    kb.bwd_depth_geometry = real
