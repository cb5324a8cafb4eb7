"""The ablation ladder's Triton rungs under Nsight Compute (`tools/ladder_profile.sh` runs it), and the
summary of what ncu measured: one row per rung.

Profile mode (needs CUDA): every rung's forward+backward is called once to compile and warm it, then,
between cudaProfilerStart/Stop (ncu `--profile-from-start off`), once more per rung, each call preceded
by a one-program marker kernel (`_ladder_marker`) and wrapped in an NVTX range `rung:<name>`. The rung
order goes to --order (JSON). The markers cut ncu's kernel list into the rungs' calls without relying
on NVTX columns in ncu's CSV.

    ncu --profile-from-start off --metrics $METRICS -f -o T4096 \\
        python3 experiments/ladder_ncu.py --T 4096 --order T4096_order.json
    ncu --import T4096.ncu-rep --csv --page raw --print-units base > T4096_raw.csv
    python3 experiments/ladder_ncu.py --summarize T4096_raw.csv --order T4096_order.json --out T4096_per_rung.csv

Summary per rung: kernels, GPU time (ms), DRAM bytes read and written (MB), and the L2 hit rate and
achieved occupancy (%) of its kernels, weighted by their time. Shape: the paper's ablation shape
(B=1, G=8, Hk=8, d=64, L=64, C=64, bf16) at --T; naive-torch and rungs above their max_T are left out.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from pathlib import Path

import triton
import triton.language as tl

MARKER = "_ladder_marker"
METRICS = {"time_ns": "gpu__time_duration.sum", "dram_read": "dram__bytes_read.sum",
           "dram_write": "dram__bytes_write.sum", "l2_hit": "lts__t_sector_hit_rate.pct",
           "occupancy": "sm__warps_active.avg.pct_of_peak_sustained_active", "regs": "launch__registers_per_thread"}


@triton.jit
def _ladder_marker(X):
    """One store: a kernel whose name cuts ncu's kernel list between two rungs' calls."""
    tl.store(X, 1.0)


def profile(T: int, order_path: Path, rungs: list[str] | None) -> None:
    import torch

    from moda_bench.kernels.moda.ladder.table import RUNGS

    chosen = [r for r in RUNGS if r.name != "naive-torch" and (r.max_T is None or T <= r.max_T)
              and (rungs is None or r.name in rungs)]
    g = torch.Generator(device="cuda").manual_seed(0)
    B, G, Hk, d, L, C = 1, 8, 8, 64, 64, 64

    def rnd(*shape):
        return torch.randn(*shape, generator=g, device="cuda", dtype=torch.bfloat16).requires_grad_()

    ins = [rnd(B, T, G * Hk, d), rnd(B, T, Hk, d), rnd(B, T, Hk, d), rnd(B, T, L, Hk, d), rnd(B, T, L, Hk, d)]
    do = torch.randn(B, T, G * Hk, d, generator=g, device="cuda", dtype=torch.bfloat16)
    flag = torch.zeros(1, device="cuda")

    def call(r):
        for t in ins:
            t.grad = None
        r.fn(*ins, chunk=C).backward(do)

    for r in chosen:  # compile and warm up outside the profiled window
        call(r)
    torch.cuda.synchronize()
    order_path.write_text(json.dumps({"T": T, "rungs": [r.name for r in chosen]}))
    torch.cuda.profiler.start()
    for r in chosen:
        _ladder_marker[(1,)](flag)
        torch.cuda.nvtx.range_push(f"rung:{r.name}")
        call(r)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
    _ladder_marker[(1,)](flag)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def _number(text: str) -> float:
    try:
        return float(str(text).replace(",", ""))
    except ValueError:
        return float("nan")


def read_raw(text: str) -> list[dict]:
    """ncu's raw CSV page (`--csv --page raw`) -> one dict per kernel, in launch order (lines that are
    not CSV, such as ==PROF== messages, and the units row are dropped)."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    return [r for r in rows if str(r.get("ID", "")).strip().isdigit()]


def summarize(raw: list[dict], rung_names: list[str]) -> list[dict]:
    """Kernels between the k-th and (k+1)-th marker belong to rung k: one summary row per rung."""
    out, current = [], None
    k = -1
    for row in raw:
        name = row.get("Kernel Name", "")
        if MARKER in name:
            k += 1
            current = None
            if k < len(rung_names):
                current = {"rung": rung_names[k], "kernels": 0, "time_ms": 0.0, "dram_read_MB": 0.0,
                           "dram_write_MB": 0.0, "_l2": 0.0, "_occ": 0.0, "max_regs": 0.0}
                out.append(current)
            continue
        if current is None:
            continue
        v = {k2: _number(row.get(m, "nan")) for k2, m in METRICS.items()}
        t = v["time_ns"] if v["time_ns"] == v["time_ns"] else 0.0
        current["kernels"] += 1
        current["time_ms"] += t / 1e6
        current["dram_read_MB"] += v["dram_read"] / 1e6
        current["dram_write_MB"] += v["dram_write"] / 1e6
        current["_l2"] += v["l2_hit"] * t
        current["_occ"] += v["occupancy"] * t
        current["max_regs"] = max(current["max_regs"], v["regs"]) if v["regs"] == v["regs"] else current["max_regs"]
    for s in out:
        ns = s["time_ms"] * 1e6
        s["l2_hit_pct"] = s.pop("_l2") / ns if ns else float("nan")
        s["achieved_occupancy_pct"] = s.pop("_occ") / ns if ns else float("nan")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--order", type=Path, required=True, help="JSON of the profiled rungs, in order")
    ap.add_argument("--rungs", default="", help="comma-separated rung names (default: every Triton rung)")
    ap.add_argument("--summarize", type=Path, help="ncu raw CSV to summarize instead of profiling")
    ap.add_argument("--out", type=Path, help="summary CSV (with --summarize; default stdout)")
    a = ap.parse_args(argv)
    if a.summarize is None:
        profile(a.T, a.order, [s for s in a.rungs.split(",") if s] or None)
        return 0
    order = json.loads(a.order.read_text())
    rows = summarize(read_raw(a.summarize.read_text(errors="replace")), order["rungs"])
    if not rows:
        print(f"no marker kernels in {a.summarize}: was it profiled with --profile-from-start off?", file=sys.stderr)
        return 1
    cols = ["T", "rung", "kernels", "time_ms", "dram_read_MB", "dram_write_MB", "l2_hit_pct", "achieved_occupancy_pct",
            "max_regs"]
    fh = a.out.open("w", newline="") if a.out else sys.stdout
    w = csv.DictWriter(fh, fieldnames=cols)
    w.writeheader()
    for r in rows:
        w.writerow({"T": order["T"], **{c: (f"{r[c]:.4g}" if isinstance(r[c], float) else r[c]) for c in cols[1:]}})
    if a.out:
        fh.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
