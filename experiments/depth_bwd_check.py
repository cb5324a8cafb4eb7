"""GPU check and timing of the CuTe depth backward (`moda_bench.kernels.moda.cute.bwd_depth_sm90`, issue 20)
against the Triton streaming kernel it can replace (`kernel_depth.depth_bwd`).

1. `--check`: at odd shapes (T not a multiple of a unit, G 1/2/4/8/16, L 1/3/5/64/256, B 1-2), both
   kernels against an fp64 reference of the depth share (dq share, dk_depth, dv_depth from the
   given o and lse), depth_grad on and off. A line per shape and kernel: max |err| / max |ref| of
   each output; "ok" when the CuTe kernel's errors are within 2x Triton's (+1e-3).
2. `--rates`: each kernel alone at several program counts (T, G, L from the flags), interleaved
   rounds of `moda_bench.timing.time_interleaved` against Triton at the first count; the depth
   bytes (k/v depth read, their gradients written) per program and second.
3. `--host`: host time a call (200 calls issued back to back, then with the GPU's time) of each
   kernel at the first program count (CuTe) and three times it (Triton), T, G, L from the flags.
4. `--ncu`: each kernel once at the first program count in an NVTX range ("dbwd-cute",
   "dbwd-triton") for `ncu --nvtx-include` (stage depth-bwd-sass of tools/device_session.sh).
Rows go to --out (CSV) as they come. One verdict line `DEPTH BWD: ...`; never exits non-zero.

    PYTHONPATH=$PWD python3 experiments/depth_bwd_check.py --check --rates --out /tmp/depth_bwd.csv
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time
import traceback

import torch

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SHAPES = [(1, 1000, 8, 64), (2, 777, 1, 3), (1, 999, 2, 256), (1, 517, 8, 1), (1, 1001, 16, 64), (2, 333, 4, 5),
          (1, 4099, 8, 64), (1, 130, 16, 1), (1, 1003, 4, 32), (2, 555, 1, 64), (1, 261, 16, 128)]


def inputs(B, T, G, L, Hk=2, d=64, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    Hq = G * Hk

    def r(*s):
        return torch.randn(*s, device="cuda", generator=g, dtype=torch.float32).to(torch.bfloat16)
    q, do, o = r(B, T, Hq, d), r(B, T, Hq, d), r(B, T, Hq, d)
    kd, vd = r(B, T, L, Hk, d), r(B, T, L, Hk, d)
    scale = 1.0 / math.sqrt(d)
    # lse: the depth keys' own log-sum-exp plus a positive share for the (absent) sequence keys
    s = torch.einsum("bthgd,btlhd->bthgl", q.double().view(B, T, Hk, G, d), kd.double()) * scale
    lse = (torch.logsumexp(s, -1) + torch.rand(B, T, Hk, G, device="cuda", generator=g).double())
    return q, do, o, lse.reshape(B, T, Hq).float().contiguous(), kd, vd, scale


def rel(a, b):
    if a is None or b is None:
        return float("nan")
    return ((a.double() - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def cute_config(text: str) -> dict:
    """"WARPSxSTAGESxKEYS[k][n]" -> keyword arguments of `depth_bwd_sm90` (k: keep_rows, the kernel's
    default; without it a unit's q and do operands are re-read every step; n: no TMA store, a step's
    dK / dV rows leave by vector stores from its buffers as before the fourteenth session)."""
    flags = text.split("x")[-1].lstrip("0123456789")
    warps, stages, keys = (int(x) for x in text[:len(text) - len(flags)].split("x"))
    return dict(warps=warps, stages=stages, step_keys=keys, keep_rows="k" in flags, tma_store="n" not in flags)


def check(w, verbose, configs="8x2x32k") -> bool:
    from moda_bench.kernels.moda.cute.bwd_depth_sm90 import depth_bwd_sm90
    from moda_bench.kernels.moda.triton.depth import depth_bwd
    from moda_bench.kernels.moda.reference import depth_backward_reference
    all_ok = True
    for (B, T, G, L) in SHAPES:
        q, do, o, lse, kd, vd, scale = inputs(B, T, G, L)
        ref = depth_backward_reference(q, do, o, lse, kd, vd, scale)
        for dg in (True, False):
            errs = {}
            runs = [("triton", lambda: depth_bwd(do, q, o, lse, kd, vd, scale, G, 24, depth_grad=dg))]
            for c in configs.split(","):
                runs.append((f"cute-{c}", lambda kw=cute_config(c): depth_bwd_sm90(
                    do, q, o, lse, kd, vd, scale, G, 24, depth_grad=dg, **kw)))
            for name, fn in runs:
                try:
                    out = fn()
                    torch.cuda.synchronize()
                    errs[name] = [rel(out[0], ref[0])] + ([rel(out[1], ref[1]), rel(out[2], ref[2])] if dg else [])
                except Exception as exc:  # noqa: BLE001
                    print(f"check B={B} T={T} G={G} L={L} dg={int(dg)} {name}: failed: {type(exc).__name__}: "
                          f"{str(exc)[:400]}", flush=True)
                    if verbose:
                        traceback.print_exc()
                    errs[name] = None
            ok = errs.get("triton") is not None and all(
                errs.get(n) is not None and all(c <= 2 * t + 1e-3 for c, t in zip(errs[n], errs["triton"]))
                for n, _ in runs[1:])
            all_ok &= ok
            for name, e in errs.items():
                es = " ".join(f"{x:.2e}" for x in e) if e else "failed"
                print(f"check B={B} T={T} G={G} L={L} depth_grad={int(dg)} {name:6s} {es}", flush=True)
                w.writerow(["check", B, T, G, L, int(dg), name, es, "ok" if ok else "BAD"])
    return all_ok


def rates(a, w) -> None:
    from moda_bench.kernels.moda.cute.bwd_depth_sm90 import depth_bwd_sm90
    from moda_bench.kernels.moda.triton.depth import depth_bwd
    from moda_bench.timing import RoundRule, time_interleaved
    q, do, o, lse, kd, vd, scale = inputs(1, a.T, a.G, a.L, Hk=8)
    counts = [int(x) for x in a.programs.split(",")]
    fns = {}
    for n in counts:
        fns[f"triton-{n}"] = (lambda n=n: depth_bwd(do, q, o, lse, kd, vd, scale, a.G, n))
        for c in a.configs.split(","):
            fns[f"cute-{n}-{c}"] = (lambda n=n, kw=cute_config(c): depth_bwd_sm90(
                do, q, o, lse, kd, vd, scale, a.G, n, **kw))
    for name in list(fns):
        try:
            fns[name]()
        except Exception as exc:  # noqa: BLE001
            print(f"rates {name}: failed: {type(exc).__name__}: {str(exc)[:400]}", flush=True)
            del fns[name]
    torch.cuda.synchronize()
    base = f"triton-{counts[0]}"
    res = time_interleaved(fns, baseline=base if base in fns else next(iter(fns)), timer="graph",
                           rule=RoundRule(max_time_s=a.max_time))
    gb = 4 * kd.numel() * kd.element_size() / 1e9
    for name in fns:
        m = res.measurements[name]
        r, lo, hi = res.ratios.get(name, (1.0, 1.0, 1.0))
        n = int(name.split("-")[1])
        print(f"rates T={a.T} G={a.G} L={a.L} {name:14s} {m.median_ms:8.3f} ms  x{r:.3f} [{lo:.3f}-{hi:.3f}]  "
              f"{gb / m.median_ms * 1e3 / n:6.1f} GB/s a program", flush=True)
        w.writerow(["rate", 1, a.T, a.G, a.L, 1, name, f"{m.median_ms:.4f}", f"{r:.4f} [{lo:.4f}-{hi:.4f}]"])


def host(a) -> None:
    from moda_bench.kernels.moda.cute.bwd_depth_sm90 import depth_bwd_sm90
    from moda_bench.kernels.moda.triton.depth import depth_bwd
    q, do, o, lse, kd, vd, scale = inputs(1, a.T, a.G, a.L, Hk=8)
    n = int(a.programs.split(",")[0])
    for name, fn in (("cute", lambda: depth_bwd_sm90(do, q, o, lse, kd, vd, scale, a.G, n)),
                     ("triton", lambda: depth_bwd(do, q, o, lse, kd, vd, scale, a.G, 3 * n))):
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        t, calls = time.perf_counter(), 200
        for _ in range(calls):
            fn()
        issued = (time.perf_counter() - t) / calls * 1e6
        torch.cuda.synchronize()
        total = (time.perf_counter() - t) / calls * 1e6
        print(f"host {name}: {issued:.1f} us a call issued, {total:.1f} us a call with the GPU", flush=True)


def ncu_calls(a) -> None:
    from moda_bench.kernels.moda.cute.bwd_depth_sm90 import depth_bwd_sm90
    from moda_bench.kernels.moda.triton.depth import depth_bwd
    q, do, o, lse, kd, vd, scale = inputs(1, a.T, a.G, a.L, Hk=8)
    n = int(a.programs.split(",")[0])
    kw = cute_config(a.configs.split(",")[0])
    for name, fn in (("cute", lambda: depth_bwd_sm90(do, q, o, lse, kd, vd, scale, a.G, n, **kw)),
                     ("triton", lambda: depth_bwd(do, q, o, lse, kd, vd, scale, a.G, n))):
        fn()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push(f"dbwd-{name}")
        fn()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        print(f"# NVTX dbwd-{name} at T={a.T} G={a.G} L={a.L}, {n} programs", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--rates", action="store_true")
    ap.add_argument("--host", action="store_true")
    ap.add_argument("--ncu", action="store_true")
    ap.add_argument("--T", type=int, default=16384)
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--L", type=int, default=64)
    ap.add_argument("--programs", default="24,12,48,132")
    ap.add_argument("--configs", default="8x2x32k",
                    help="the CuTe kernel's warps x stages x depth keys a step, then 'k' to hold a unit's q and do "
                         "operands in registers, 'n' for no TMA store of dK / dV; ','-separated (--check, --rates; "
                         "--ncu takes the first)")
    ap.add_argument("--max-time", type=float, default=3.0)
    ap.add_argument("--out", default="")
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("DEPTH BWD: not run: no GPU")
        return 0
    print(f"# {torch.cuda.get_device_name()}", flush=True)
    f = open(a.out, "a", newline="") if a.out else open(os.devnull, "w")
    w = csv.writer(f)
    verdict = []
    t0 = time.time()
    try:
        if a.check:
            verdict.append("check " + ("all ok" if check(w, a.verbose, a.configs) else "NOT ok"))
        if a.rates:
            rates(a, w)
            verdict.append("rates done")
        if a.host:
            host(a)
            verdict.append("host done")
        if a.ncu:
            ncu_calls(a)
            verdict.append("ncu calls done")
    except Exception as exc:  # noqa: BLE001
        verdict.append(f"failed: {type(exc).__name__}: {str(exc)[:300]}")
        traceback.print_exc()
    f.close()
    print(f"DEPTH BWD: {'; '.join(verdict)} ({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
