"""Session 21 probe: the "tma" backward with its depth part as its own launch on a side stream
(pointer depth-only kernel, after a delta launch there), beside the sequence-only dq and key-major
passes on the main stream, and dq += the depth partial after the join. Against the default (depth
in the dq pass), fwd+bwd interleaved, graph then eager timer; gradients compared. Patches
kernel.moda_bwd (a probe, not the package's path).

    python3 tools/_s21_beside.py "T,G,L;..." [max_time]
"""
import sys

import torch

from moda_bench.ops.launch import cdiv
from moda_bench.ops.moda import kernel as km
from moda_bench.ops.moda import moda_attention
from moda_bench.ops.moda.config import pointer_block_l
from moda_bench.ops.moda.kernel_bwd_rules import kv_chunk
from moda_bench.timing import RoundRule, make_inputs, time_interleaved

real_bwd = km.moda_bwd
MODE = {"v": None}


def beside_bwd(do, q, k, v, kd, vd, o, lse, scale, shape, cfg, depth_only=False, delta=None, depth_grad=True):
    var = MODE["v"]
    if var is None or depth_only or delta is not None or shape.L == 0 or cfg.bwd_depth != "tma":
        return real_bwd(do, q, k, v, kd, vd, o, lse, scale, shape, cfg, depth_only=depth_only, delta=delta,
                        depth_grad=depth_grad)
    B, T, Hq, d = q.shape
    do, o, lse = do.contiguous(), o.contiguous(), lse.contiguous()
    out = {}
    dcfg = cfg.replace(bwd_depth="split", bwd_block_l=pointer_block_l(shape.L), **var.get("depth", {}))

    def side():
        dl = torch.empty_like(lse)
        km.moda_bwd_delta_kernel[(cdiv(B * T * Hq, 128),)](o, do, dl, B * T * Hq, HEAD_DIM=d, BLOCK=128)
        out["d"] = real_bwd(do, q, k, v, kd, vd, o, lse, scale, shape, dcfg, depth_only=True, delta=dl,
                            depth_grad=depth_grad)

    def main():
        out["s"] = km.moda_bwd_tma(
            do, q, k, v, None, None, o, lse, scale, shape.G, q_block_m=cfg.bwd_q_block_m,
            q_block_n=cfg.bwd_q_block_n, q_warps=cfg.bwd_q_warps, q_stages=cfg.bwd_q_stages,
            q_maxnreg=cfg.bwd_q_maxnreg, kv_block_m=cfg.bwd_kv_block_m, kv_block_n=cfg.bwd_kv_block_n,
            kv_warps=cfg.bwd_kv_warps, kv_stages=cfg.bwd_kv_stages, kv_maxnreg=cfg.bwd_kv_maxnreg,
            kv_chunk=kv_chunk(cfg, B, T, shape.Hk, shape.G, km.num_sms(q.device)))

    km._run_beside(q.device, main, side, var.get("after", False), var.get("prio", True))
    dq, dk, dv, _, _ = out["s"]
    dq_d, _, _, dkd, dvd = out["d"]
    dq.add_(dq_d)
    return dq, dk, dv, dkd, dvd


km.moda_bwd = beside_bwd
VARIANTS = {
    "default": None,
    "beside": {},
    "beside-after": {"after": True},
    "beside-noprio": {"prio": False},
    "beside-dw8": {"depth": {"bwd_depth_warps": 8}},
    "beside-dm32": {"depth": {"bwd_depth_block_m": 32}},
}
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
    for timer in ("graph", "eager"):
        res = time_interleaved(fns, baseline="default", timer=timer, grad_to_none={n: leaves for n in fns},
                               rule=RoundRule(max_time_s=max_time))
        line = f"T={T} G={G} L={L} {timer}: default {1e3 * res.measurements['default'].median_ms:.1f} us"
        for n in fns:
            if n != "default":
                r, lo, hi = res.ratios[n]
                line += f" | {n} {r:.3f} [{lo:.3f}-{hi:.3f}]"
        print(line, flush=True)
    print(f"T={T} G={G} L={L} grad rel diff vs default: " + ", ".join(f"{n} {e:.1e}" for n, e in errs.items()))
    MODE["v"] = None
    del x, leaves, fns, grads
    torch.cuda.empty_cache()
