"""Session 22 probe: the key-major pass's step order and grid order (`moda_bwd_tma(kv_order=)`:
bit 1 the unmasked steps from the last rows down, bit 2 a head's key tiles before the next head's),
fwd+bwd of `moda_attention` with the default config, each order against order 0, interleaved
(graph and eager), plus the backward alone (eager). Usage: python3 _s22_order.py "T,G,L;..." MAXTIME"""
import sys

import torch

import moda_bench.ops.moda.kernel as km
from moda_bench.ops.moda import moda_attention
from moda_bench.timing import RoundRule, make_inputs, make_pass_fn, time_interleaved

real = km.moda_bwd_tma
state = {"order": 0}
km.moda_bwd_tma = lambda *a, **k: real(*a, kv_order=state["order"], **k)
max_time = float(sys.argv[2]) if len(sys.argv) > 2 else 2.0
for spec in sys.argv[1].split(";"):
    T, G, L = (int(x) for x in spec.split(","))
    x = make_inputs(1, T, G * 8, 8, 64, L, seed=0)
    leaves = [t for n, t in x.items() if n != "do" and t is not None]
    grads = {}
    for order in (0, 1, 2, 3):  # the orders' gradients against order 0's (rounding only)
        state["order"] = order
        out = moda_attention(x["q"], x["k"], x["v"], x["k_depth"], x["v_depth"])
        grads[order] = torch.autograd.grad(out, leaves, x["do"])
    for order in (1, 2, 3):
        errs = [float((a.float() - b.float()).norm() / b.float().norm()) for a, b in zip(grads[order], grads[0])]
        print(f"T={T} G={G} L={L} order{order} gradients vs order0: rel err {max(errs):.2e}", flush=True)
    del grads, out
    for pass_, timers in (("fwdbwd", ("graph", "eager")), ("bwd", ("eager",))):
        fns = {}
        for order in (0, 1, 2, 3):
            def fwd():
                return moda_attention(x["q"], x["k"], x["v"], x["k_depth"], x["v_depth"])
            state["order"] = order
            inner = make_pass_fn(fwd, x, pass_)

            def fn(inner=inner, order=order):
                state["order"] = order
                inner()
            fn()
            fns[f"order{order}"] = fn
        for timer in timers:
            res = time_interleaved(fns, baseline="order0", timer=timer, grad_to_none={n: leaves for n in fns},
                                   rule=RoundRule(max_time_s=max_time))
            for name in fns:
                m = res.measurements[name]
                r, lo, hi = res.ratios.get(name, (1.0, 1.0, 1.0))
                print(f"T={T} G={G} L={L} {pass_:6s} {timer:5s} {name}: {1e3 * m.median_ms:9.1f} us  "
                      f"x order0 {r:.3f} [{lo:.3f}-{hi:.3f}]", flush=True)
