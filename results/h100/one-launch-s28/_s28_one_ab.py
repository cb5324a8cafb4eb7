"""Session 28: the one-launch backward's variants against the two launches and FA2, interleaved in one
process (graph and eager): the WAIT order (dq row blocks first, key-major items waiting for their stored
row statistics; `ONE_WAIT`, the default of bwd_kv_beside=2) chunked and not, and the key-major items first
computing their statistics themselves."""
import argparse
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, "tools")
import moda_bench.ops.moda.kernel_bwd_rules as r  # noqa: E402
import moda_bench.ops.moda.kernel_bwd_tma as bt  # noqa: E402
from host_probe import interleaved, probe_inputs, shape_args  # noqa: E402
from moda_bench.ops.moda import moda_attention  # noqa: E402
from moda_bench.ops.moda.config import resolve_config  # noqa: E402
from moda_bench.ops.moda.validate import check_inputs  # noqa: E402
from moda_bench.timing import make_pass_fn  # noqa: E402

memo = {}


def plan(key):
    k2 = (key, r.ONE_WAIT)
    if k2 not in memo:
        memo[k2] = r._make_plan(*key)
    return memo[k2]


bt.bwd_plan = plan
p = shape_args(argparse.ArgumentParser())
p.add_argument("--max-time", type=float, default=2.0)
a = p.parse_args()
x = probe_inputs(a)
q, k, v, kd, vd, do = (x[n] for n in ("q", "k", "v", "k_depth", "v_depth", "do"))
leaves = [t for n, t in x.items() if n != "do" and t is not None]
base = resolve_config(check_inputs(q, k, v, kd, vd, need_cuda=True), q.dtype)


def moda(cfg, wait=True):
    """fwd+bwd with the order switch set for the whole call (the backward reads it)."""
    f = make_pass_fn(lambda: moda_attention(q, k, v, kd, vd, config=cfg), x, "fwdbwd")

    def run():
        r.ONE_WAIT = wait
        try:
            return f()
        finally:
            r.ONE_WAIT = True
    return run


def fa2():
    for t in leaves:
        t.grad = None
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                           enable_gqa=True)
    o.transpose(1, 2).backward(do)


one = base.replace(bwd_kv_beside=2)
fns = {"two launches": moda(base), "one, wait": moda(one), "one, wait, unchunked": moda(one.replace(bwd_kv_chunk=0)),
       "one, kv first, stats": moda(one, False),
       "fa2": fa2}
for f in fns.values():
    f()
torch.cuda.synchronize()
print(f"T={a.T} G={a.G} L={a.L}: fwd+bwd, interleaved, ratios to FA2 (and below: to the two launches)")
interleaved(fns, leaves, "fa2", ("graph", "eager"), a.max_time, 28)
interleaved({n: f for n, f in fns.items() if n != "fa2"}, leaves, "two launches", ("graph", "eager"), a.max_time, 28)
