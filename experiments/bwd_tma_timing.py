"""Timing half of experiments/bwd_tma_triton.py (the issue-21 backward prototype): backward-alone
timings of its variants next to FA4, SDPA flash (FA2), the package default and the package's
`kernel_bwd_tma` with a variant's tiles, each pass's own time, and the one-line verdict. Imported
`main` checks the variants against fp64 autograd and times them (the prototype module itself
imports nothing from here: no import cycle):

    PYTHONPATH=$PWD:experiments python3 experiments/bwd_tma_timing.py --quick
"""
from __future__ import annotations

import argparse
import os
import time
import traceback

import torch
import triton

import bwd_tma_triton as proto
from bwd_tma_triton import (DEFAULT_VARIANT, QUICK, STATS, VARIANTS, Rows, bwd_flops, correctness, moda_tma_bwd, one_line,
                            random_inputs)


def _autograd_bwd(fwd, ins, do):
    """A closure running only the backward of out = fwd(*ins) (graph retained)."""
    ins = [x.detach().requires_grad_(True) for x in ins]
    out = fwd(*ins)
    return lambda: torch.autograd.grad(out, ins, do, retain_graph=True)


def _fa4(q, k, v, do):
    from moda_bench.kernels.moda.fa4.merge import fa4_unavailable
    if fa4_unavailable() is not None:
        raise RuntimeError(f"skipped: {fa4_unavailable()}")
    from flash_attn.cute.interface import _flash_attn_bwd, _flash_attn_fwd
    o4, lse4 = _flash_attn_fwd(q, k, v, softmax_scale=q.shape[-1] ** -0.5, causal=True, return_lse=True)[:2]
    return lambda: _flash_attn_bwd(q, k, v, o4, do, lse4, softmax_scale=q.shape[-1] ** -0.5, causal=True)


def _sdpa(q, k, v):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True).transpose(1, 2)


def pass_split(variant, *ins, reps=5) -> str:
    """Each launch's median CUDA-event time over `reps` calls: "rows 0.05 dq 6.1 kv 8.9 ms"."""
    per = {}
    for _ in range(reps):
        proto.PASS_EVENTS = []
        moda_tma_bwd(*ins, **variant)
        torch.cuda.synchronize()
        for i, (n, a, b) in enumerate(proto.PASS_EVENTS):
            per.setdefault(f"{n}{i}" if n == "rows" else n, []).append(a.elapsed_time(b))
    proto.PASS_EVENTS = None
    return " ".join(f"{n.rstrip('0123456789')} {sorted(ms)[len(ms) // 2]:.3f}" for n, ms in per.items()) + " ms"


def _package(q, k, v, o, lse, do, kd, vd, variant):
    """The package's kernel_bwd_tma with a variant's tiles (the same launch the default makes)."""
    from moda_bench.kernels.moda.triton.bwd_tma import moda_bwd_tma
    c = dict(DEFAULT_VARIANT, **variant)
    return moda_bwd_tma(do, q, k, v, kd, vd, o, lse, q.shape[-1] ** -0.5, q.shape[2] // k.shape[2],
                        q_block_m=c["dq_bm"], q_block_n=c["dq_bn"], q_warps=c["dq_warps"], q_stages=c["dq_stages"],
                        q_maxnreg=c["dq_maxnreg"] or 0, kv_block_m=c["kv_bm"], kv_block_n=c["kv_bn"],
                        kv_warps=c["kv_warps"], kv_stages=c["kv_stages"], kv_maxnreg=c["kv_maxnreg"] or 0,
                        depth_stages=c["depth_stages"], use_desc=c["use_desc"])


def timing(rows: Rows, names, ok: dict, args, device):
    """Backward alone, bf16, B=1, Hk=8 at each (T, L): FA4 and SDPA flash (L = 0), the package
    kernel (autograd backward, default config), each variant that passed its checks (do_bench:
    median of CUDA-event timed calls after warm-up; the note has its kernels' regs/spills/smem)."""
    from triton.testing import do_bench

    from moda_bench.kernels.moda import moda_attention
    G, Hk, d, fa4_ms = args.G, 8, args.d, {}
    for T in args.T:
        for L in args.L:
            q, k, v, kd, vd, do = random_inputs(1, T, G * Hk, Hk, d, L, torch.bfloat16, device, seed=T + L)
            ins = [x for x in (q, k, v, kd, vd) if x is not None]
            try:
                o, lse, onote = *moda_attention(*ins, return_lse=True), ""
            except Exception as exc:  # noqa: BLE001 - stand-ins (o random, lse ~ log(t + 1 + L)) keep it meaningful
                o, onote = torch.randn_like(q), f"o, lse stand-ins ({one_line(exc)})"
                lse = torch.log(torch.arange(1, T + 1, device=device) + L + 0.5)[None, :, None].expand(1, T, G * Hk)
            print(f"\nT={T} G={G} Hk={Hk} d={d} L={L} bf16, backward alone (median of CUDA events):", flush=True)
            provs = [("fa4", lambda: _fa4(q, k, v, do)), ("sdpa-flash (FA2)", lambda: _autograd_bwd(
                _sdpa, (q, k, v), do))] if L == 0 else []
            provs.append(("current moda_attention", lambda: _autograd_bwd(moda_attention, ins, do)))
            provs += [(f"pkg {n}", (lambda n=n: lambda: lambda: _package(q, k, v, o, lse, do, kd, vd, VARIANTS[n]))())
                      for n in args.package if ok.get(n, True)]
            provs += [(n, (lambda n=n: lambda: lambda: moda_tma_bwd(q, k, v, o, lse, do, kd, vd, **VARIANTS[n]))())
                      for n in names if ok.get(n)]
            cur_ms, base = None, dict(section="time", T=T, G=G, Hk=Hk, d=d, L=L, dtype="bfloat16")
            for name, setup in provs:
                t_start = time.time()
                STATS.clear()
                try:
                    med, p20, p80 = do_bench(setup(), warmup=25, rep=100, quantiles=[.5, .2, .8])
                except Exception as exc:  # noqa: BLE001
                    skip = str(exc).startswith("skipped")
                    rows.add(name=name, status="skipped" if skip else "error", note=one_line(exc), **base)
                    print(f"  {name:30s} {'' if skip else 'FAILED '}{one_line(exc)}", flush=True)
                    if args.verbose and not skip:
                        traceback.print_exc()
                    continue
                res = (pass_split(VARIANTS[name], q, k, v, o, lse, do, kd, vd) + "; ") if name in VARIANTS else ""
                fa4_ms[T] = med if name == "fa4" else fa4_ms.get(T)
                cur_ms = med if name.startswith("current") else cur_ms
                tf = bwd_flops(1, T, G * Hk, d, L) / (med * 1e-3) / 1e12
                xf, xc = med / (fa4_ms.get(T) or float("nan")), med / (cur_ms or float("nan"))
                res += " ".join(f"{kn.strip('_').replace('_kernel', '')} {st}" for kn, st in STATS.items()
                                if kn in ("_kv_kernel", "_dq_kernel"))
                rows.add(name=name, status="ok", ms=med, p20=p20, p80=p80, tflops=tf, x_fa4=xf, x_current=xc,
                         note=f"{time.time() - t_start:.1f}s incl. compile; {res} {onote}".strip(), **base)
                print(f"  {name:30s} {med:8.3f} ms ({p20:.3f}-{p80:.3f}) {tf:6.1f} TFLOP/s  x{xf:5.3f} FA4(L=0) "
                      f" x{xc:5.3f} current  {res}", flush=True)
            del q, k, v, kd, vd, do, o, lse, ins, provs
            torch.cuda.empty_cache()


def verdict(rows: Rows, t_all: float) -> str:
    parts = []
    for L in sorted({r["L"] for r in rows.rows if r["section"] == "time"}):
        ours = [r for r in rows.rows if r["section"] == "time" and r["status"] == "ok" and r["T"] == 16384
                and r["L"] == L and r["name"] in VARIANTS]
        if ours:
            b = min(ours, key=lambda r: r["ms"])
            parts.append(f"L={L} best {b['name']} {b['ms']:.3f} ms {b['tflops']:.0f} TFLOP/s x{b['x_fa4']:.3f} FA4 "
                         f"x{b['x_current']:.3f} current"
                         + (f" (target 400: {'met' if b['tflops'] >= 400 else 'not met'})" if L == 0 else ""))
    return (f"BWD TMA: ran at T=16384, {'; '.join(parts)}" if parts else "BWD TMA: no variant timed at T=16384") \
        + f" ({time.time() - t_all:.0f} s in all)"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--T", default="16384,4096,32768", help="timing sequence lengths (B=1, Hk=8)")
    ap.add_argument("--L", default="0,64", help="timing depth lengths")
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--variants", default="all", help=f"'all' or a comma list of {','.join(VARIANTS)}")
    ap.add_argument("--quick", action="store_true", help=f"T=16384 only, variants {','.join(QUICK)}")
    ap.add_argument("--full-check", action="store_true", help="the full grid on every variant")
    ap.add_argument("--no-time", action="store_true")
    ap.add_argument("--no-check", action="store_true", help="time without the checks (an earlier run made them)")
    ap.add_argument("--package", default="", help="variants also timed through the package's kernel_bwd_tma")
    ap.add_argument("--verbose", action="store_true", help="full tracebacks")
    args = ap.parse_args(argv)
    if args.quick:
        args.T, args.variants = "16384", ",".join(QUICK)
    names = list(VARIANTS) if args.variants == "all" else [n for n in args.variants.split(",") if n]
    if any(n not in VARIANTS for n in names):
        print(f"BWD TMA: not run: unknown variants {[n for n in names if n not in VARIANTS]}; known: {list(VARIANTS)}")
        return 0
    args.T, args.L = ([int(x) for x in a.split(",") if x] for a in (args.T, args.L))
    args.package = [n for n in args.package.split(",") if n in VARIANTS]
    if not torch.cuda.is_available():
        print("BWD TMA: not run: no CUDA device (the CPU interpreter path is tested by tests/test_bwd_tma_proto.py)")
        return 0
    print(f"{torch.cuda.get_device_name()} (sm{''.join(map(str, torch.cuda.get_device_capability()))}), "
          f"torch {torch.__version__}, triton {triton.__version__}")
    path = os.path.join(os.environ["OUT"], "bwd_tma.csv") if os.environ.get("OUT") else None
    rows, t_all = Rows(path), time.time()
    try:
        print("correctness vs fp64 autograd of moda_reference (B=2, Hk=2; ||err||/||ref|| per gradient):")
        ok = {n: True for n in names} if args.no_check else correctness(rows, names, args, "cuda")
        if not args.no_time:
            timing(rows, names, ok, args, "cuda")
    except Exception as exc:  # noqa: BLE001 - report, never exit non-zero
        print(f"aborted: {one_line(exc)}")
        traceback.print_exc()
    if path:
        print(f"rows appended to {path}")
    print(verdict(rows, t_all))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
