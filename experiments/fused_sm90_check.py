"""GPU check and timing of route B (issue 20): MoDA's forward with the depth tiles inside FA4's
sm90 kernel (`moda_bench.kernels.moda.cute.fwd_sm90`), against the fp64 reference and beside FA4,
moda-fa4 and moda-overlap.

1. `--check`: out and lse of the fused kernel against `moda_reference` in float64 at odd shapes
   (T not a multiple of the 192-row tile or the 128-key block; G 1, 2, 8, 16; L 1, 3, 64, 256;
   d 64 and 128; B 2), and moda-fa4's error at the same inputs as the yardstick. A shape passes
   when the fused error is at most max(2 x moda-fa4's, 1e-2) for out and 1e-3 for lse.
2. `--T`: forward times, interleaved rounds of `moda_bench.timing.time_interleaved` (L2
   flushed, ratios to FA4 with 95% intervals), for each `--variants` entry
   (depth_tile x depth_stages[:placement], e.g. "64x2;128x1;64x2:first") plus moda-fa4 and
   moda-overlap.
3. `--ncu`: each variant once in an NVTX range "fused<i>", for `ncu --nvtx-include` (stage fused-ncu).
CSV rows to $OUT/fused_sm90.csv (appended as they come). Needs CUDA and FA4.

    PYTHONPATH=$PWD python3 experiments/fused_sm90_check.py --check --T 16384,32768 --variants "64x2;128x1"
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from functools import partial

import torch

CHECK_SHAPES = [  # B, T, G, L, d, Hk
    (2, 1000, 8, 64, 64, 2), (1, 4099, 8, 64, 64, 2), (2, 777, 1, 3, 64, 2), (2, 777, 2, 1, 64, 2),
    (1, 1001, 16, 64, 64, 1), (1, 999, 2, 256, 64, 2), (1, 517, 8, 1, 64, 2), (1, 700, 8, 64, 128, 2),
    (1, 1003, 4, 32, 64, 2), (1, 2051, 8, 48, 64, 2), (2, 333, 8, 16, 64, 3), (1, 1111, 8, 256, 64, 1),
]


def parse_variant(text: str) -> dict:
    """"TILExSTAGES[:placement[:lead[:probe]]]" (placement offset, first or spread, lead the L2 prefetch's
    blocks ahead, default 0 (none); probe one of fused_sm90_depth.PROBES, timing only) -> the keyword
    arguments of `moda_fused_sm90_fwd` (depth_tile, depth_stages, placement, prefetch_lead, probe)."""
    head, place, lead, probe = (text.split(":") + ["", "", ""])[:4]
    tile, stages = (int(x) for x in head.split("x"))
    return dict(depth_tile=tile, depth_stages=stages, placement=place or "offset",
                prefetch_lead=int(lead) if lead else 0, probe=probe)


def err(a, b):
    return (a.double() - b.double()).abs().max().item()


def check(w, placement: str) -> bool:
    """out and lse at CHECK_SHAPES against fp64; placement "NAME" or "NAME:probe" (a probe whose
    results are correct, e.g. "spread:late")."""
    from moda_bench.kernels.moda.fa4.merge import moda_fa4
    from moda_bench.kernels.moda.cute.fwd_sm90 import moda_fused_sm90_fwd, placement_unavailable
    from moda_bench.kernels.moda.reference import moda_reference
    from moda_bench.timing import make_inputs
    ok_all = True
    placement, _, probe = placement.partition(":")
    for B, T, G, L, d, Hk in CHECK_SHAPES:
        if placement_unavailable(placement, d):
            print(f"CHECK {placement} B={B} T={T} G={G} L={L} d={d}: skipped: {placement_unavailable(placement, d)}")
            continue
        ins = make_inputs(B, T, G * Hk, Hk, d, L, requires_grad=False, seed=T + G + L)
        q, k, v, kd, vd = (ins[n] for n in ("q", "k", "v", "k_depth", "v_depth"))
        try:
            t0 = time.time()
            out, lse = moda_fused_sm90_fwd(q, k, v, kd, vd, placement=placement, probe=probe)
            torch.cuda.synchronize()
            dt = time.time() - t0
        except Exception as exc:  # noqa: BLE001 - report the shape and go on
            print(f"CHECK {placement} B={B} T={T} G={G} L={L} d={d}: FAILED to run: {type(exc).__name__}: {str(exc)[:400]}",
                  flush=True)
            w.writerow(["check", B, T, G, L, d, "", "", "", "", "error"])
            ok_all = False
            continue
        ref, ref_lse = moda_reference(q, k, v, kd, vd, return_lse=True)
        o_fa4 = moda_fa4(q, k, v, kd, vd)
        e_out, e_fa4 = err(out, ref), err(o_fa4, ref)
        e_lse = err(lse, ref_lse.permute(0, 2, 1))
        ok = e_out <= max(2 * e_fa4, 1e-2) and e_lse <= 1e-3 and bool(torch.isfinite(out).all())
        ok_all &= ok
        print(f"CHECK {placement} B={B} T={T} G={G} L={L} d={d}: out err {e_out:.2e} (moda-fa4 {e_fa4:.2e}), "
              f"lse err {e_lse:.2e}, first call {dt:.1f} s: {'ok' if ok else 'WRONG'}", flush=True)
        w.writerow(["check-" + placement + (":" + probe if probe else ""), B, T, G, L, d, f"{e_out:.3e}", f"{e_fa4:.3e}",
                    f"{e_lse:.3e}", "", "ok" if ok else "wrong"])
    return ok_all


def timing(a, w) -> None:
    from moda_bench.kernels.moda.fa4.merge import fa4_attention, moda_fa4
    from moda_bench.kernels.moda.cute.fwd_sm90 import moda_fused_sm90_fwd
    from moda_bench.kernels.moda.fa4.overlap import overlap_config
    from moda_bench.kernels.moda.validate import MoDAShape
    from moda_bench.timing import RoundRule, make_inputs, time_interleaved
    dev = torch.device("cuda")
    for T in (int(x) for x in a.T.split(",")):
        ins = make_inputs(1, T, a.G * a.Hk, a.Hk, 64, a.L, requires_grad=False)
        q, k, v, kd, vd = (ins[n] for n in ("q", "k", "v", "k_depth", "v_depth"))
        shape = MoDAShape(1, T, a.G * a.Hk, a.Hk, 64, a.L)
        ocfg = overlap_config(shape, torch.bfloat16, dev)
        fns = {"fa4": lambda: fa4_attention(q, k, v),
               "moda-fa4": lambda: moda_fa4(q, k, v, kd, vd),
               "moda-overlap": lambda: moda_fa4(q, k, v, kd, vd, config=ocfg)}
        for var in a.variants.split(";"):
            fns[f"fused[{var}]"] = partial(moda_fused_sm90_fwd, q, k, v, kd, vd, **parse_variant(var))
        for name in list(fns):
            try:
                fns[name]()
            except Exception as exc:  # noqa: BLE001
                print(f"T={T} {name}: failed: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                del fns[name]
        torch.cuda.synchronize()
        t0 = time.time()
        res = time_interleaved(fns, baseline="fa4", timer=a.timer, rule=RoundRule(max_time_s=a.max_time))
        for name in fns:
            m = res.measurements[name]
            r, lo, hi = res.ratios.get(name, (1.0, 1.0, 1.0))
            print(f"T={T:6d} G={a.G} L={a.L} fwd {name:16s} {m.median_ms:8.3f} ms  x{r:.3f} [{lo:.3f}-{hi:.3f}]",
                  flush=True)
            w.writerow(["time", 1, T, a.G, a.L, 64, f"{m.median_ms:.4f}", f"{r:.4f}", f"{lo:.4f}", f"{hi:.4f}", name])
        print(f"# T={T}: {res.rounds} rounds, {time.time() - t0:.1f} s, {res.stop_reason}", flush=True)
        del fns, ins
        torch.cuda.empty_cache()


def ncu_calls(a) -> None:
    """For `ncu --nvtx-include 'fusedI/'`: per variant I (0, 1, ... in --variants order) one warm
    call, then one call inside the NVTX range "fusedI" (first T of --T only)."""
    from moda_bench.kernels.moda.cute.fwd_sm90 import moda_fused_sm90_fwd
    from moda_bench.timing import make_inputs
    T = int(a.T.split(",")[0])
    ins = make_inputs(1, T, a.G * a.Hk, a.Hk, 64, a.L, requires_grad=False)
    q, k, v, kd, vd = (ins[n] for n in ("q", "k", "v", "k_depth", "v_depth"))
    for i, var in enumerate(a.variants.split(";")):
        kw = parse_variant(var)
        moda_fused_sm90_fwd(q, k, v, kd, vd, **kw)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push(f"fused{i}")
        moda_fused_sm90_fwd(q, k, v, kd, vd, **kw)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        print(f"# NVTX fused{i} = {var} at T={T} G={a.G} L={a.L}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--ncu", action="store_true", help="only the NVTX-ranged calls for ncu (see ncu_calls)")
    ap.add_argument("--placements", default="offset,first", help="placements the check covers (offset, first, spread)")
    ap.add_argument("--T", default="")
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--L", type=int, default=64)
    ap.add_argument("--Hk", type=int, default=8)
    ap.add_argument("--variants", default="64x2")
    ap.add_argument("--timer", default="eager")
    ap.add_argument("--max-time", type=float, default=6.0)
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "fused_sm90.csv"))
    a = ap.parse_args()
    print(f"# {torch.cuda.get_device_name()}", flush=True)
    if a.ncu:
        ncu_calls(a)
        return 0
    with open(a.out, "a", newline="") as f:
        w = csv.writer(f)
        w.writerow(["kind", "B", "T", "G", "L", "d", "a", "b", "c", "d2", "e"])
        ok = all([check(w, p) for p in a.placements.split(",")]) if a.check else True
        f.flush()
        if a.T:
            timing(a, w)
    print(f"ROUTE B check: {'all ok' if ok else 'FAILURES'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
