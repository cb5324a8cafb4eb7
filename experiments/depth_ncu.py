"""The streaming depth kernels of `moda-overlap` (`kernel_depth.depth_fwd` / `depth_bwd`) alone, for a
profiler and for their rate per program (issue 20: that rate decides how many SMs the overlap takes
from FA4, docs/DESIGN.md "The overlap route").

Two modes:
* rates (the default, `--calls 0`): each (pass, variant, program count) timed alone (CUDA-graph replays, L2
  flushed, `moda_bench.timing.time_fn`), printed as ms, GB/s in all and GB/s a program of the bytes
  the pass must move (q, o/do, lse, depth K/V read; out, dq, depth gradients written).
* `--calls N`: N eager calls of each inside an NVTX range named `<pass>-G<G>-L<L>-n<programs>-v<variant
  index>`, for

    ncu --nvtx --nvtx-include 'fwd-G8-L64-n12-v0/' --section SpeedOfLight --section MemoryWorkloadAnalysis \\
        --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \\
        python3 experiments/depth_ncu.py --calls 1 --programs 12

A variant is `bm=<rows an item>,s=<depth steps in flight>,w=<warps>,bl=<depth columns a step>` (any
subset; ';' separates variants; `default` is 128 rows forward (the overlap heuristic's until
2026-11-26, now 256 rows on 8 warps), 64 backward, 3 stages, 4 warps, the kernels' own block_l). Shapes: B=1, Hk=8, d=64, bf16. Needs CUDA.
"""
from __future__ import annotations

import argparse
import math
import sys

import torch

from moda_bench.kernels.moda.triton.depth import depth_bwd, depth_fwd
from moda_bench.timing import StopRule, time_fn
from overlap_check import depth_reference  # tools/ is on sys.path when this file runs

KEYS = {"bm": "block_m", "s": "stages", "w": "num_warps", "bl": "block_l"}


def parse_variant(text: str, pass_: str) -> dict:
    kw = {"block_m": 128 if pass_ == "fwd" else 64, "stages": 3, "num_warps": 4, "block_l": 0}
    if text.strip() != "default":
        for item in filter(None, text.split(",")):
            k, v = item.split("=")
            kw[KEYS[k.strip()]] = int(v)
    return kw


def inputs(T: int, G: int, L: int, Hk: int = 8, d: int = 64, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    q, do = r(1, T, G * Hk, d), r(1, T, G * Hk, d)
    kd, vd = r(1, T, L, Hk, d), r(1, T, L, Hk, d)
    return q, do, kd, vd


def pass_bytes(pass_: str, q, kd, depth_grad: bool = True) -> int:
    qb, kb = q.numel() * 2, kd.numel() * 2
    lse = q.numel() // q.shape[-1] * 4
    if pass_ == "fwd":
        return qb + 2 * kb + qb + lse  # q, kd, vd read; out, lse written
    return 3 * qb + lse + 2 * kb + qb + (2 * kb if depth_grad else 0)  # q, do, o, lse, kd, vd; dq (+ dkd, dvd)


def runner(pass_: str, q, do, kd, vd, o, lse, G: int, n: int, kw: dict):
    scale = 1.0 / math.sqrt(q.shape[-1])
    if pass_ == "fwd":
        return lambda: depth_fwd(q, kd, vd, scale, G, n, **kw)
    return lambda: depth_bwd(do, q, o, lse, kd, vd, scale, G, n, **kw)


def check(a) -> bool:
    """Every forward variant at T=4099 (odd: a partial last item) against fp32, per G and L."""
    ok = True
    for G in (int(x) for x in a.G.split(",")):
        for L in (int(x) for x in a.L.split(",")):
            q, do, kd, vd = inputs(4099, G, L, seed=1)
            scale = 1.0 / math.sqrt(q.shape[-1])
            # overlap_check's fp32 depth reference; its backward half (fed placeholder o, lse) is not used
            ro, rl = depth_reference(q, kd, vd, do, q, torch.zeros(q.shape[:3], device=q.device), scale, G)[:2]
            for vtext in a.variants.split(";"):
                try:
                    o, lse = depth_fwd(q, kd, vd, scale, G, 24, **parse_variant(vtext, "fwd"))
                except Exception as exc:  # noqa: BLE001 - probe: report and go on
                    print(f"check G={G} L={L} {vtext}: failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                    continue
                eo = ((o.float() - ro).abs().max() / ro.abs().max()).item()
                el = (lse - rl).abs().max().item()
                good = eo < 2e-2 and el < 1e-2
                ok &= good
                print(f"check G={G} L={L} {vtext:24s} out {eo:.2e} lse {el:.2e} {'ok' if good else 'MISMATCH'}",
                      flush=True)
    return ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, default=16384)
    ap.add_argument("--G", default="8")
    ap.add_argument("--L", default="64")
    ap.add_argument("--passes", default="fwd,bwd")
    ap.add_argument("--programs", default="12,24")
    ap.add_argument("--variants", default="default")
    ap.add_argument("--calls", type=int, default=0, help="eager calls in NVTX ranges (profiler mode); 0: --rates")
    ap.add_argument("--max-time", type=float, default=1.0, help="seconds per timed case")
    ap.add_argument("--check", action="store_true",
                    help="only compare every variant's forward with an fp32 reference at T=4099 (exit 1 on a miss)")
    a = ap.parse_args(argv)
    if a.check:
        return 0 if check(a) else 1
    print(f"# {torch.cuda.get_device_name()} T={a.T}", flush=True)
    for G in (int(x) for x in a.G.split(",")):
        for L in (int(x) for x in a.L.split(",")):
            q, do, kd, vd = inputs(a.T, G, L)
            o, lse = depth_fwd(q, kd, vd, 1.0 / math.sqrt(q.shape[-1]), G, 132)
            for pass_ in a.passes.split(","):
                nbytes = pass_bytes(pass_, q, kd)
                for vi, vtext in enumerate(a.variants.split(";")):
                    kw = parse_variant(vtext, pass_)
                    for n in (int(x) for x in a.programs.split(",")):
                        fn = runner(pass_, q, do, kd, vd, o, lse, G, n, kw)
                        name = f"{pass_} G={G} L={L} {vtext} n={n}"
                        try:
                            fn()
                            torch.cuda.synchronize()
                        except Exception as exc:  # noqa: BLE001 - probe: report and go on
                            print(f"{name:44s} failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                            continue
                        if a.calls:
                            tag = f"{pass_}-G{G}-L{L}-n{n}-v{vi}"
                            for _ in range(a.calls):
                                with torch.cuda.nvtx.range(tag):
                                    fn()
                            torch.cuda.synchronize()
                            print(f"{name}: {a.calls} calls in NVTX range {tag}", flush=True)
                            continue
                        m = time_fn(fn, timer="graph", rule=StopRule(min_samples=5, min_time_s=0.1,
                                                                     max_time_s=a.max_time))
                        gbs = nbytes / (m.median_ms * 1e6)
                        print(f"{name:44s} {m.median_ms:8.3f} ms  {gbs:7.1f} GB/s  {gbs / n:6.1f} GB/s a program",
                              flush=True)
            del q, do, kd, vd, o, lse
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
