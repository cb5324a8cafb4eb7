"""Session 16 A/B (temporary): the dq pass's blocks heavy-first against heavy/light alternating."""
import sys
import torch
from moda_bench.ops.moda import kernel as kernel_mod, moda_attention
from moda_bench.timing import RoundRule, make_inputs, time_interleaved

orig = kernel_mod.moda_bwd_tma
state = {"mix": False}
kernel_mod.moda_bwd_tma = lambda *a, **k: orig(*a, **dict(k, mix=state["mix"]))
import os
shapes = [tuple(int(v) for v in s.split("x")) for s in os.environ.get("MIX_SHAPES", "").split(",") if s] or [
    (1024, 8, 64), (2048, 8, 64), (4096, 8, 64), (4096, 2, 64), (16384, 8, 64), (16384, 8, 256), (16384, 8, 0),
    (16384, 2, 64)]
for T, G, L in shapes:
    x = make_inputs(1, T, 8 * G, 8, 64, L, seed=T)
    ins = [x[n] for n in ("q", "k", "v", "k_depth", "v_depth") if x[n] is not None]
    kw = {} if L else {}
    grads = {}

    def make(mix):
        def fn():
            state["mix"] = mix
            for t in ins:
                t.grad = None
            moda_attention(*(ins if L else ins + [None, None])).backward(x["do"])
        return fn

    for mix in (False, True):
        make(mix)()
        grads[mix] = [t.grad.clone() for t in ins]
    same = all(torch.equal(a, b) for a, b in zip(grads[False], grads[True]))
    fns = {"heavy-first": make(False), "mixed": make(True)}
    for timer in ("graph", "eager"):
        r = time_interleaved(fns, baseline="heavy-first", timer=timer, grad_to_none={n: ins for n in fns},
                             rule=RoundRule(max_time_s=float(sys.argv[1]) if len(sys.argv) > 1 else 3.0))
        rat, lo, hi = r.ratios["mixed"]
        print(f"T={T:6d} G={G:2d} L={L:3d} {timer:5s} heavy-first {r.measurements['heavy-first'].median_ms:8.3f} ms  "
              f"mixed {r.measurements['mixed'].median_ms:8.3f} ms  mixed/heavy-first {rat:.3f} [{lo:.3f}-{hi:.3f}]  "
              f"grads bitwise equal: {same}", flush=True)
