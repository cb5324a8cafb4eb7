"""GPU check of the backward's descriptor loads (MoDAConfig.bwd_tma): out and all gradients of
`moda_attention` with bwd_tma on (default tiles and wider key-major tiles) against the same call
with pointer loads, at odd T, G 1/3/8/16, L 0/5/64, bf16. Prints one line per case; exits 1 if a
relative difference exceeds 2e-2. Needs CUDA.

    PYTHONPATH=$PWD python3 experiments/bwd_tma_check.py
"""
from __future__ import annotations

import sys

import torch

from moda_bench.kernels.moda import moda_attention
from moda_bench.kernels.moda.config import default_config
from moda_bench.kernels.moda.validate import MoDAShape

CASES = [(1000, 8, 64), (4099, 3, 5), (777, 1, 0), (2049, 16, 64)]


def main() -> int:
    worst = 0.0
    for T, G, L in CASES:
        Hk, d = 8, 64
        Hq = G * Hk
        g = torch.Generator("cuda").manual_seed(T)

        def rnd(*s):
            return torch.randn(*s, device="cuda", generator=g, dtype=torch.bfloat16).requires_grad_(True)

        q, k, v = rnd(1, T, Hq, d), rnd(1, T, Hk, d), rnd(1, T, Hk, d)
        kd, vd = (rnd(1, T, L, Hk, d), rnd(1, T, L, Hk, d)) if L else (None, None)
        ins = [x for x in (q, k, v, kd, vd) if x is not None]
        base = default_config(MoDAShape(1, T, Hq, Hk, d, L), torch.bfloat16)
        outs = {}
        for name, cfg in (("ptr", base.replace(bwd_tma=False)), ("tma", base.replace(bwd_tma=True)),
                          ("tma-kv128", base.replace(bwd_tma=True, bwd_kv_block_m=64, bwd_kv_block_n=128,
                                                     bwd_kv_warps=8))):
            for x in ins:
                x.grad = None
            o = moda_attention(q, k, v, kd, vd, config=cfg)
            o.float().pow(2).sum().backward()
            outs[name] = [o.detach()] + [x.grad.clone() for x in ins]
        for name in ("tma", "tma-kv128"):
            errs = [((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()
                    for a, b in zip(outs[name], outs["ptr"])]
            worst = max(worst, *errs)
            print(f"T={T} G={G} L={L} {name}: rel diff vs pointer loads (out, dq, dk, dv[, dkd, dvd]): "
                  + " ".join(f"{e:.1e}" for e in errs), flush=True)
    print(f"worst {worst:.2e}: {'ok' if worst < 2e-2 else 'WRONG'}")
    return 0 if worst < 2e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
