"""Temporary probe (session 18): where an eager fwd+bwd's host time goes at T=1024, by stamps.
Per call (queue drained before each): forward host us, backward entry latency (out.backward called
-> Function.backward entered, on the engine's thread), Function.backward's own time, exit latency
(Function.backward returned -> out.backward returned). Also FA2 (SDPA flash) totals, and both with
the engine's device threads off. Then back-to-back calls (no sync) as the eager timer issues them."""
import sys, time, statistics as st
import torch, torch.nn.functional as F
from moda_bench.ops.moda import kernel as K
from moda_bench.ops.moda import moda_attention
from moda_bench.timing import make_inputs

T = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
x = make_inputs(1, T, 64, 8, 64, 64, seed=0)
q, k, v, kd, vd, do = (x[n] for n in ("q", "k", "v", "k_depth", "v_depth", "do"))
leaves = [t for t in (q, k, v, kd, vd)]
stamp = {}
orig = K._MoDAFunction.backward


def wrapped(ctx, do_, dl):
    stamp["in"] = time.perf_counter()
    r = orig(ctx, do_, dl)
    stamp["out"] = time.perf_counter()
    return r


K._MoDAFunction.backward = staticmethod(wrapped)
qs, ks, vs = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
ks = ks.repeat_interleave(8, 1).detach().requires_grad_(); vs = vs.repeat_interleave(8, 1).detach().requires_grad_()
dos = do.transpose(1, 2).contiguous()


def moda_call():
    for t in leaves:
        t.grad = None
    t0 = time.perf_counter()
    o = moda_attention(q, k, v, kd, vd)
    t1 = time.perf_counter()
    o.backward(do)
    t2 = time.perf_counter()
    return t0, t1, t2


def fa2_call():
    for t in (qs, ks, vs):
        t.grad = None
    t0 = time.perf_counter()
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
    t1 = time.perf_counter()
    o.backward(dos)
    t2 = time.perf_counter()
    return t0, t1, t2


def run(name, fn, n=300, sync=True):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    rows = []
    w0 = time.perf_counter()
    for _ in range(n):
        if sync:
            torch.cuda.synchronize()
        t0, t1, t2 = fn()
        r = [t1 - t0, t2 - t1]
        if "in" in stamp and fn is moda_call:
            r += [stamp["in"] - t1, stamp["out"] - stamp["in"], t2 - stamp["out"]]
        rows.append(r)
    wall = (time.perf_counter() - w0) / n
    torch.cuda.synchronize()
    med = [1e6 * st.median(c) for c in zip(*rows)]
    lab = ["fwd", "bwd call"] + (["  entry", "  Function.backward", "  exit"] if len(med) > 2 else [])
    print(f"{name:34s} " + "  ".join(f"{l} {m:6.1f}" for l, m in zip(lab, med)) + f"   | wall/call {1e6 * wall:6.1f} us")


for sync in (True, False):
    tag = "synced" if sync else "back-to-back"
    run(f"moda {tag}", moda_call, sync=sync)
    run(f"fa2 {tag}", fa2_call, sync=sync)
    with torch.autograd.set_multithreading_enabled(False):
        run(f"moda {tag}, calling thread", moda_call, sync=sync)
        run(f"fa2 {tag}, calling thread", fa2_call, sync=sync)
