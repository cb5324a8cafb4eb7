"""Where the Depth-Attention mix's time goes on a GPU: the fused mix (`depth_mix`) forward and
backward at T=16384, Hq=32, Hk=8, d=64, bf16 for a few S, timed with CUDA events (median of
repetitions) and profiled (torch.profiler: device time per kernel), beside the bytes each pass
must move (`moda_bench.floor.mix_work`) and a device copy of the same size.

    python3 experiments/mix_probe.py [--T 16384] [--S 1,4,16]

Prints one table per S and the profiler's kernel table; writes nothing.
"""
from __future__ import annotations

import argparse

import torch

from moda_bench import floor
from moda_bench.kernels.dattn import depth_mix


def timed(fn, reps: int = 50) -> float:
    """Median ms of fn over reps, CUDA events, after a warm-up."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--T", type=int, default=16384)
    p.add_argument("--S", default="1,4,16")
    args = p.parse_args()
    B, T, Hq, Hk, d = 1, args.T, 32, 8, 64
    dev = "cuda"
    for S in [int(s) for s in args.S.split(",")]:
        g = torch.Generator(device=dev).manual_seed(S)

        def rnd(*shape):
            return torch.randn(*shape, generator=g, device=dev).to(torch.bfloat16).requires_grad_(True)

        q, k, v = rnd(B, T, Hq, d), rnd(B, T, Hk, d), rnd(B, T, Hk, d)
        ks, vs = rnd(B, T, S, Hk, d), rnd(B, T, S, Hk, d)
        dvm = torch.randn(B, T, Hk, d, device=dev).to(torch.bfloat16)
        with torch.no_grad():
            fwd_ms = timed(lambda: depth_mix(q, k, v, ks, vs))
        out = depth_mix(q, k, v, ks, vs)
        bwd_ms = timed(lambda: torch.autograd.grad(out, (q, k, v, ks, vs), dvm, retain_graph=True))
        nbytes = floor.mix_work("fwd", B, T, Hq, Hk, d, S).bytes
        src = torch.empty(int(nbytes) // 2, dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        copy_ms = timed(lambda: dst.copy_(src))
        bbytes = floor.mix_work("bwd", B, T, Hq, Hk, d, S).bytes
        print(f"S={S:3d}: fwd {fwd_ms:.3f} ms ({nbytes / fwd_ms / 1e6:.0f} GB/s), bwd {bwd_ms:.3f} ms "
              f"({bbytes / bwd_ms / 1e6:.0f} GB/s), copy of the fwd bytes {copy_ms:.3f} ms")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                o = depth_mix(q, k, v, ks, vs)
                torch.autograd.grad(o, (q, k, v, ks, vs), dvm)
            torch.cuda.synchronize()
        try:
            print(prof.key_averages().table(sort_by="device_time_total", row_limit=8))
        except (KeyError, AttributeError, ValueError):
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8))


if __name__ == "__main__":
    main()
