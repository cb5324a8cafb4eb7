"""Decode kernels under a profiler (issue 22): runs `moda_decode` and, beside it, SDPA's cuDNN and
flash backends at L=0 on a few (B, T) points, a few eager calls each, inside NVTX ranges named
`<provider> B=.. T=..`, so that `ncu --nvtx` (or nsys) can attribute every kernel to its point.

    ncu --nvtx --nvtx-include 'moda B=1 T=32768/' --section SpeedOfLight \
        --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
        python3 experiments/decode_ncu.py --points 1x32768 --calls 2

Without a profiler it prints each point's eager time per call (CUDA events, warm L2: a sanity
line, not a benchmark). Shapes as the decode preset: Tq=1, Hk=8, G=8, d=64, L=64 for moda.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from decode_probe import point_inputs  # tools/ is on sys.path when this file runs
from moda_bench.kernels.decode import DecodeConfig, moda_decode


def sdpa(backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    be = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]

    def run(q, k, v):
        with sdpa_kernel(be):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  enable_gqa=True)
    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--points", default="1x32768,8x2048")
    p.add_argument("--calls", type=int, default=2)
    p.add_argument("--splits", default="auto", help="comma list of num_splits for moda (auto = the chooser)")
    p.add_argument("--block-n", type=int, default=None)
    p.add_argument("--warps", type=int, default=4)
    p.add_argument("--stages", type=int, default=3)
    p.add_argument("--peers", default="cudnn,flash")
    args = p.parse_args()
    cfg = DecodeConfig(block_n=args.block_n, num_warps=args.warps, num_stages=args.stages)
    for text in args.points.split(","):
        B, T, q, k, v, kd, vd = point_inputs(text)
        runs = {}
        for s in args.splits.split(","):
            ns = None if s == "auto" else int(s)
            runs[f"moda S={s}"] = lambda ns=ns: moda_decode(q, k, v, kd, vd, num_splits=ns, config=cfg)
        for peer in filter(None, args.peers.split(",")):
            runs[peer] = lambda f=sdpa(peer): f(q, k, v)
        for name, fn in runs.items():
            fn()  # compile / plan outside the ranges
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(args.calls):
                with torch.cuda.nvtx.range(f"{name} B={B} T={T}"):
                    fn()
            end.record()
            torch.cuda.synchronize()
            print(f"{name:12s} B={B:4d} T={T:7d}: {1e3 * start.elapsed_time(end) / args.calls:8.1f} us per eager call")


if __name__ == "__main__":
    main()
