"""The streaming depth kernels' shared memory over issue 60's grid, without a GPU: for every G, d, L
and depth_grad, the item moda-overlap asks (`fa4.overlap`: 256-row forward, 64-row backward, three
stages) and the item `depth_smem.fit_fwd` / `fit_bwd` run instead, each compiled for sm_90 on this
machine (`depth.compiled_smem`; ptxas and Triton's NVIDIA backend, no device), beside the bound.

    python3 experiments/depth_smem_check.py                 # the whole grid (a few minutes on 2 cores)
    python3 experiments/depth_smem_check.py --G 32 --d 128   # one corner

Exits 1 where a compiled item uses more than its bound or a fitted item more than the limit. Run
without TRITON_INTERPRET (the interpreter's kernels are not compiled).
"""
from __future__ import annotations

import argparse
import sys

from moda_bench.kernels.launch import next_pow2
from moda_bench.kernels.moda.fa4.overlap import BWD_BLOCK_M, FWD_BLOCK_M, STAGES
from moda_bench.kernels.moda.triton.depth import compiled_smem
from moda_bench.kernels.moda.triton.depth_smem import HOPPER_SMEM, bwd_smem, fit_bwd, fit_fwd, fwd_smem


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--G", type=int, nargs="*", default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--d", type=int, nargs="*", default=[64, 128, 256])
    ap.add_argument("--L", type=int, nargs="*", default=[1, 7, 64, 256])
    ap.add_argument("--limit", type=int, default=HOPPER_SMEM)
    args = ap.parse_args()
    bad = 0
    print("kind  G    d    L grad  item(bm,stages,block_l)  compiled   bound  fits")
    for G in args.G:
        for d in args.d:
            asked = max(FWD_BLOCK_M, next_pow2(G))
            for item in sorted({(asked, STAGES, 0), fit_fwd(G, d, 2, args.limit, asked, STAGES)}):
                bm, stages, block_l = item
                used, bound = compiled_smem("fwd", G, bm, d, stages, block_l), fwd_smem(G, bm, d, stages, 2, block_l)
                fitted = item == fit_fwd(G, d, 2, args.limit, asked, STAGES)
                bad += used > bound or (fitted and used > args.limit)
                print(f"fwd  {G:2d} {d:4d}    -    -  {str(item):22s} {used:9d} {bound:7d}  "
                      f"{'fitted' if fitted else 'asked'} {'OK' if used <= args.limit else 'over'}")
            asked = max(BWD_BLOCK_M, next_pow2(G))
            for L in args.L:
                for grad in (True, False):
                    item = fit_bwd(G, d, L, 2, args.limit, asked, STAGES, grad)
                    used = compiled_smem("bwd", G, item[0], d, item[1], item[2], L, grad)
                    bound = bwd_smem(G, item[0], d, L, item[1], 2, grad, item[2])
                    bad += used > bound or used > args.limit
                    print(f"bwd  {G:2d} {d:4d} {L:4d} {int(grad):4d}  {str(item):22s} {used:9d} {bound:7d}  "
                          f"{'fitted' if item != (asked, STAGES, 0) else 'asked'} "
                          f"{'OK' if used <= args.limit else 'over'}", flush=True)
    print("all within bounds" if not bad else f"{bad} items over their bound or the limit")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
