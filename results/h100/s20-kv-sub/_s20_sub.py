"""Session 20 probe: the key-major pass in head sub-groups (kernel_bwd_tma's kv_sub) against the
unsplit pass, fwd+bwd interleaved under the graph timer (a backward alone on a forward made outside
the capture cannot be captured: autograd's stream sync),
at several (T, G, L); gradients compared. Sets kv_sub by wrapping kernel.moda_bwd_tma (a probe)."""
import functools
import sys

import torch

from moda_bench.ops.moda import kernel as km
from moda_bench.ops.moda import moda_attention
from moda_bench.timing import RoundRule, make_inputs, time_interleaved

real = km.moda_bwd_tma
points = [tuple(int(x) for x in p.split(",")) for p in sys.argv[1].split(";")]  # T,G,L,subs...
for T, G, L, *subs in points:
    x = make_inputs(1, T, 8 * G, 8, 64, L, seed=0)
    leaves = [x[n] for n in ("q", "k", "v", "k_depth", "v_depth") if x[n] is not None]
    fns, grads = {}, {}
    for sub in [1] + subs:
        def fn(sub=sub):
            km.moda_bwd_tma = functools.partial(real, kv_sub=sub)
            moda_attention(*leaves[:3], *(leaves[3:] or [None, None])).backward(x["do"])
        for t in leaves:
            t.grad = None
        fn()
        grads[sub] = [t.grad.float().clone() for t in leaves]
        fns[f"sub{sub}"] = fn
    errs = {s: max(((a - b).norm() / b.norm()).item() for a, b in zip(grads[s], grads[1])) for s in subs}
    res = time_interleaved(fns, baseline="sub1", timer="graph", grad_to_none={n: leaves for n in fns},
                           rule=RoundRule(max_time_s=2.5))
    line = f"T={T} G={G} L={L} fwd+bwd: sub1 {res.measurements['sub1'].median_ms:.3f} ms"
    for s in subs:
        r, lo, hi = res.ratios[f"sub{s}"]
        line += f" | sub{s} {r:.3f} [{lo:.3f}-{hi:.3f}] (grad diff {errs[s]:.1e})"
    print(line, flush=True)
    km.moda_bwd_tma = real
    del x, leaves, fns, grads
    torch.cuda.empty_cache()
