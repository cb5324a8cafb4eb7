"""GPU probe of the depth-only kernels (fwd_depth="split", bwd_depth="split") timed alone:
median ms and achieved bandwidth (bytes they must move / time, in TB/s) over a grid of depth
tile shapes (depth_block_m, block_l, warps, stages), for several (G, L). It chose the depth
defaults of `default_config` and is how the "fraction of the byte floor" of the depth kernels in
docs/PERFORMANCE.md is measured; rerun it when changing the depth-only kernels. Compare the
TB/s with the device copy bandwidth (about 4.3 TB/s read+write on an H200). Writes its own CSV
(not the moda-bench schema) and prints the three fastest tiles per (G, L, kernel). Needs a CUDA GPU.

    PYTHONPATH=$PWD MODA_BENCH_NO_TUNING=1 python3 experiments/depth_probe.py --T 8192 \
        --shapes 8:64,2:64,8:256 --block-m 32,64,128 --block-l 32,64 --warps 4,8 --stages 1,2 \
        --out depth_probe.csv

It calls the kernel module's forward/backward launchers with depth_only=True (the timing hook
they keep for this probe).
"""
from __future__ import annotations

import argparse
import itertools
import math

import pandas as pd
import torch

from moda_bench.kernels.moda.config import default_config
from moda_bench.kernels.moda.triton.interface import moda_bwd, moda_fwd
from moda_bench.kernels.moda.validate import MoDAShape
from moda_bench.timing import measure


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--shapes", default="8:64,2:64,8:256", help="G:L pairs")
    ap.add_argument("--block-m", default="32,64,128")
    ap.add_argument("--block-l", default="32,64")
    ap.add_argument("--warps", default="4,8")
    ap.add_argument("--stages", default="1,2")
    ap.add_argument("--out", default="depth_probe.csv")
    a = ap.parse_args()
    B, Hk, d, T = 1, 8, 64, a.T
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    rows = []
    for gl in a.shapes.split(","):
        G, L = (int(x) for x in gl.split(":"))
        Hq = G * Hk
        shape = MoDAShape(B, T, Hq, Hk, d, L)
        g = torch.Generator(device="cuda").manual_seed(0)
        rnd = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=g)  # noqa: E731
        q, k, v, do = rnd(B, T, Hq, d), rnd(B, T, Hk, d), rnd(B, T, Hk, d), rnd(B, T, Hq, d)
        kd, vd = rnd(B, T, L, Hk, d), rnd(B, T, L, Hk, d)
        scale = 1 / math.sqrt(d)
        base = default_config(shape).replace(fwd_depth="split", bwd_depth="split")
        o, lse = moda_fwd(q, k, v, kd, vd, scale, shape, base)  # a valid lse for the backward
        qbytes, dbytes = B * T * Hq * d * 2, B * T * L * Hk * d * 2
        need = {"fwd": qbytes * 2 + 2 * dbytes + B * T * Hq * 4,  # q, kd, vd in; o, lse out
                "bwd": qbytes * 3 + 4 * dbytes + 2 * B * T * Hq * 4}  # q, do, kd, vd, lse, delta in; dq, dkd, dvd out
        for bm, bl, w, st in itertools.product(ints(a.block_m), ints(a.block_l), ints(a.warps), ints(a.stages)):
            if bm % triton_next_pow2(G) or bl > max(16, triton_next_pow2(L)):
                continue
            cfg = base.replace(depth_block_m=bm, block_l=bl, depth_warps=w, depth_stages=st,
                               bwd_depth_block_m=bm, bwd_block_l=bl, bwd_depth_warps=w, bwd_depth_stages=st)
            for kernel in ("fwd", "bwd"):
                if kernel == "fwd":
                    fn = lambda: moda_fwd(q, k, v, kd, vd, scale, shape, cfg, depth_only=True)  # noqa: E731
                else:
                    fn = lambda: moda_bwd(do, q, k, v, kd, vd, o, lse, scale, shape, cfg, depth_only=True)  # noqa: E731
                try:
                    r = measure(fn)
                    status = "ok"
                except Exception as e:  # noqa: BLE001 - probe: record and go on
                    r = {"median_ms": float("nan"), "p20_ms": float("nan"), "p80_ms": float("nan")}
                    status = f"error: {type(e).__name__}: {str(e)[:120]}"
                tbs = need[kernel] / (r["median_ms"] * 1e-3) / 1e12
                rows.append(dict(T=T, G=G, L=L, kernel=kernel, block_m=bm, block_l=bl, warps=w, stages=st, **r,
                                 tb_per_s=tbs, status=status))
                print(f"G={G:2d} L={L:3d} {kernel} bm={bm:3d} bl={bl:3d} w={w} st={st}  {r['median_ms']:8.4f} ms"
                      f"  {tbs:5.2f} TB/s  {status}", flush=True)
        pd.DataFrame(rows).to_csv(a.out, index=False)
    df = pd.DataFrame(rows)
    best = df[df.status == "ok"].sort_values("median_ms").groupby(["G", "L", "kernel"]).head(3)
    print(best.to_string(index=False))


def triton_next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


if __name__ == "__main__":
    main()
