"""Session 16 A/B (temporary): the dq pass's block order, heaviest first (0) against the quarter
pairing (2) and full alternation (1)."""
import os
import sys
import torch
from moda_bench.ops.moda import kernel as kernel_mod, moda_attention
from moda_bench.timing import RoundRule, make_inputs, time_interleaved

orig = kernel_mod.moda_bwd_tma
state = {"mix": 0}
kernel_mod.moda_bwd_tma = lambda *a, **k: orig(*a, **dict(k, mix=state["mix"]))
shapes = [tuple(int(v) for v in s.split("x")) for s in os.environ.get("MIX_SHAPES", "16384x8x64").split(",")]
for T, G, L in shapes:
    x = make_inputs(1, T, 8 * G, 8, 64, L, seed=T)
    ins = [x[n] for n in ("q", "k", "v", "k_depth", "v_depth") if x[n] is not None]

    def make(mix):
        def fn():
            state["mix"] = mix
            for t in ins:
                t.grad = None
            moda_attention(*(ins if L else ins + [None, None])).backward(x["do"])
        return fn

    fns = {"heavy-first": make(0), "quarter-pairs": make(2), "alternate": make(1)}
    for timer in ("graph",):
        r = time_interleaved(fns, baseline="heavy-first", timer=timer, grad_to_none={n: ins for n in fns},
                             rule=RoundRule(max_time_s=float(sys.argv[1]) if len(sys.argv) > 1 else 3.0))
        line = " ".join(f"{n} {r.ratios[n][0]:.3f} [{r.ratios[n][1]:.3f}-{r.ratios[n][2]:.3f}]" for n in fns if n in r.ratios)
        print(f"T={T:6d} G={G:2d} L={L:3d} {timer}: heavy-first {r.measurements['heavy-first'].median_ms:.3f} ms; x heavy-first: {line}",
              flush=True)
