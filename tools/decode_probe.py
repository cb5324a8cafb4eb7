"""Which split count and tile the decode kernel wants where it is short of the copy rate (issue 22):
`moda_decode` at a few (B, T) points, over num_splits and DecodeConfig variants, timed like the suite
(CUDA-graph replays, L2 flushed before each), as GB/s of the bytes it must move and as a share of
a device copy's rate measured in the same process.

    python3 tools/decode_probe.py [--points 1x32768,1x8192,8x8192,8x2048,32x2048] [--budget-s 100]

Prints one line per (point, variant) and the best variant per point; writes nothing.
"""
from __future__ import annotations

import argparse
import time

import torch

from moda_bench import floor
from moda_bench.ops.decode import DecodeConfig, choose_num_splits, moda_decode
from moda_bench.timing import StopRule, time_fn

G, HK, D, L = 8, 8, 64, 64
VARIANTS = [DecodeConfig(), DecodeConfig(block_n=64), DecodeConfig(num_warps=8), DecodeConfig(num_stages=4),
            DecodeConfig(block_n=64, num_stages=4)]


def copy_gbps() -> float:
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    m = time_fn(lambda: dst.copy_(src), rule=StopRule(min_samples=10, min_time_s=0.05, max_time_s=0.5))
    return 2 * 2**30 / (m.median_ms * 1e6)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--points", default="1x32768,1x8192,8x8192,8x2048,32x2048")
    p.add_argument("--budget-s", type=float, default=100.0)
    args = p.parse_args()
    rate = copy_gbps()
    print(f"copy rate {rate:.0f} GB/s")
    t0 = time.time()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rule = StopRule(min_samples=20, min_time_s=0.02, max_time_s=0.3)
    for text in args.points.split(","):
        B, T = (int(x) for x in text.split("x"))
        g = torch.Generator(device="cuda").manual_seed(B * T)
        q = torch.randn(B, 1, G * HK, D, generator=g, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(B, T, HK, D, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        kd, vd = (torch.randn(B, 1, L, HK, D, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        nbytes = floor.decode_work(B, T, 1, G * HK, HK, D, L).bytes
        auto = choose_num_splits(B, HK, T, sms, 128)
        splits = sorted({1, auto, max(1, auto // 2), auto * 2, max(1, sms // (B * HK)), max(1, 4 * sms // (B * HK))})
        best = None
        for cfg in VARIANTS:
            for s in splits:
                if time.time() - t0 > args.budget_s:
                    print("budget spent")
                    return
                try:
                    m = time_fn(lambda: moda_decode(q, k, v, kd, vd, num_splits=s, config=cfg), timer="graph", rule=rule)
                except Exception as exc:  # noqa: BLE001 - a variant that fails is reported, not fatal
                    print(f"B={B} T={T} splits={s} {cfg}: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
                    continue
                gbps = nbytes / (m.median_ms * 1e6)
                tag = f"B={B:3d} T={T:6d} splits={s:4d} bn={cfg.block_n} w={cfg.num_warps} st={cfg.num_stages}"
                print(f"{tag}: {m.median_ms * 1e3:8.1f} us {gbps:6.0f} GB/s {gbps / rate:5.0%}" + (" (auto)" if s == auto and cfg == VARIANTS[0] else ""))
                if best is None or gbps > best[0]:
                    best = (gbps, tag)
        print(f"best at B={B} T={T}: {best[1]}: {best[0]:.0f} GB/s ({best[0] / rate:.0%})")


if __name__ == "__main__":
    main()
