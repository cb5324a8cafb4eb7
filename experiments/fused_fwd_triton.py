"""Route A prototype (issue 20): a Triton MoDA forward whose depth tiles go through the same
program as the sequence loop, loaded with TMA tensor descriptors. Forward only (out, lse).
The kernel now lives in the package (`moda_bench/kernels/moda/triton/fwd_tma.py`, what
`fwd_depth="tma"` runs); this script keeps its variants and the benchmark.

    moda_fused_fwd(q, k, v, k_depth, v_depth, scale=None, **variant) -> (out, lse)

q (B,T,Hq,d); k, v (B,T,Hk,d); k_depth, v_depth (B,T,L,Hk,d) or None (L = 0). out (B,T,Hq,d)
in q's dtype, lse (B,T,Hq) float32, natural log (the layout of `moda_reference(return_lse=True)`).

Design (docs/DESIGN.md, route A):
* Rows are group-aware: for KV head j the G query heads are folded into the row axis,
  r = t*GP + g (GP = next_pow2(G); rows g >= G are padding, never stored). A program owns
  BLOCK_M rows = P = BLOCK_M/GP positions [t0, t0+P) of one (batch, KV head).
* Loads: device-side tensor descriptors (`tl.make_tensor_descriptor`, TMA on Hopper) for
  Q (a [1, P, GP, d] box of the (B,T,Hq,d) tensor, reshaped to [BLOCK_M, d]), the sequence
  K/V tiles ([BLOCK_N, d] boxes of the (B*T, Hk*d) view) and the depth tiles ([P, BL, d] boxes
  of the (B*T, L, Hk*d) view of k_depth: the P positions' depth entries l0..l0+BL-1). Out of
  range boxes are zero-filled by the copy engine; the masks below make them harmless.
  USE_DESC=False is the pointer path (same arithmetic, masked tl.load), kept as the baseline
  that shows what the descriptors buy, and as a fallback.
* Sequence phase: keys [0, n_full) lie wholly below the block's first position (no mask; this
  loop carries `warp_specialize` when asked), then the one or two diagonal tiles with the
  causal mask.
* Depth phase (the same online softmax): the P positions are cut into NB = P/S sub-tiles of
  S = max(1, 16/GP) positions (R = S*GP >= 16 rows, the smallest tensor-core tile), and a
  batched product [NB, R, d] x [NB, d, S*BL] scores each sub-tile's rows against its own
  positions' BL depth columns of this step only (utilisation 1/S: 1/2 at G=8, 1 at G >= 16);
  a block-diagonal mask keeps each row's own position. It runs after the sequence loop
  (default) or before it (DEPTH_FIRST), pipelined over the L/BL steps (DEPTH_STAGES).
* Schedule: one program per (row block, batch*KV head), heaviest row blocks first; or
  PERSISTENT: a grid of #SMs programs walking the same heaviest-first tile order.

`main()` (needs CUDA): correctness against the fp64 `moda_reference` at odd shapes, then
forward timing of the variants next to `moda_attention`, FA4 and `moda_fa4`; see --help.
Under TRITON_INTERPRET=1 (CPU) the function runs for tests (tests/test_fused_proto.py).

    PYTHONPATH=$PWD python3 experiments/fused_fwd_triton.py                 # all checks + timings
    PYTHONPATH=$PWD python3 experiments/fused_fwd_triton.py --T 16384 --variants d128x128w8s3,p128x128w8s3
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
import triton

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from moda_bench.kernels.moda.triton.fwd_tma import depth_geometry as tma_geometry  # noqa: E402
from moda_bench.kernels.moda.triton.fwd_tma import moda_fwd_tma  # noqa: E402
from moda_bench.kernels.moda.validate import check_inputs  # noqa: E402

# ----------------------------------------------------------------------------- launcher
DEFAULT_VARIANT = dict(block_m=128, block_n=128, num_warps=8, num_stages=3, use_desc=True, ws=False,
                       persistent=False, depth_first=False, depth_stages=2, depth_rows=256)

# name -> overrides of DEFAULT_VARIANT ("d": descriptors, "p": pointers; BLOCK_MxBLOCK_N, warps,
# stages). main() runs RUN_DEFAULT in this order, the riskiest (persistent, warp-specialised) last.
VARIANTS = {
    "d128x128w8s3": {},
    "d128x128w8s2": dict(num_stages=2),
    "d128x64w4s3": dict(block_n=64, num_warps=4),
    "d128x64w8s3": dict(block_n=64),
    "d64x64w4s3": dict(block_m=64, block_n=64, num_warps=4),
    "d64x128w4s2": dict(block_m=64, num_warps=4, num_stages=2),
    "p128x64w4s3": dict(block_n=64, num_warps=4, use_desc=False),
    "p128x128w8s3": dict(use_desc=False),
    "d128x128w8s3-dfirst": dict(depth_first=True),
    "d128x128w8s3-dst3": dict(depth_stages=3),
    "d128x128w8s3-persist": dict(persistent=True),
    "d128x128w8s3-ws": dict(ws=True),
    "d128x64w4s3-ws": dict(block_n=64, num_warps=4, ws=True),
}
RUN_DEFAULT = ["d128x128w8s3", "d128x64w8s3", "d128x128w8s2", "d128x64w4s3", "d64x64w4s3", "p128x128w8s3",
               "d128x128w8s3-dfirst", "d128x128w8s3-dst3", "d128x128w8s3-persist", "d128x128w8s3-ws",
               "d128x64w4s3-ws"]
QUICK = ["d128x128w8s3", "d128x64w8s3", "d64x64w4s3", "d128x128w8s3-dst3", "d128x128w8s3-ws"]

def depth_geometry(G: int, block_m: int, depth_rows: int = 256):
    """(GP, P, S, BL) of a program of block_m rows with about depth_rows depth rows (P*BL) a step."""
    gp, P, S, _ = tma_geometry(G, block_m)
    return gp, P, S, max(triton.cdiv(16, S), min(64, max(1, depth_rows // P)))


def moda_fused_fwd(q, k, v, k_depth=None, v_depth=None, scale=None, **variant):
    """MoDA forward through the package's descriptor kernel (`kernel_fwd_tma.moda_fwd_tma`):
    returns (out (B,T,Hq,d), lse (B,T,Hq) float32). `variant` overrides DEFAULT_VARIANT
    (block_m, block_n, num_warps, num_stages, use_desc, ws, persistent, depth_first,
    depth_stages, depth_rows)."""
    cfg = dict(DEFAULT_VARIANT, **variant)
    unknown = set(variant) - set(DEFAULT_VARIANT)
    if unknown:
        raise ValueError(f"unknown variant options {sorted(unknown)}")
    shape = check_inputs(q, k, v, k_depth, v_depth, need_cuda=True)
    d, L = q.shape[-1], shape.L
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    _, _, S, bl = depth_geometry(shape.G, cfg["block_m"], cfg["depth_rows"])
    kd = k_depth.contiguous() if L else None
    vd = v_depth.contiguous() if L else None
    return moda_fwd_tma(q.contiguous(), k.contiguous(), v.contiguous(), kd, vd, scale, shape.G,
                        block_m=cfg["block_m"], block_n=cfg["block_n"], num_warps=cfg["num_warps"],
                        num_stages=cfg["num_stages"], block_l=S * bl, depth_stages=cfg["depth_stages"],
                        use_desc=cfg["use_desc"], ws=cfg["ws"], persistent=cfg["persistent"],
                        depth_first=cfg["depth_first"])


# ----------------------------------------------------------------------------- benchmark
def useful_flops(B, T, Hq, d, L) -> float:
    """Forward FLOPs of MoDA that must be done: 4*B*Hq*d*(T(T+1)/2 + T*L)."""
    return 4.0 * B * Hq * d * (T * (T + 1) / 2 + T * L)


def one_line(exc: BaseException) -> str:
    msg = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {msg[:240]}"


def rel_err(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    if not torch.isfinite(a).all():
        return float("inf")
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def random_inputs(B, T, Hq, Hk, d, L, dtype, device, seed=0):
    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(seed)  # on the device: GB-sized depth tensors in ms

    def rnd(*s):
        return torch.randn(*s, generator=g, device=dev, dtype=torch.float32).to(dtype)

    q, k, v = rnd(B, T, Hq, d), rnd(B, T, Hk, d), rnd(B, T, Hk, d)
    kd = rnd(B, T, L, Hk, d) if L else None
    vd = rnd(B, T, L, Hk, d) if L else None
    return q, k, v, kd, vd


def check_case(fn, B, T, G, Hk, d, L, dtype, device, seed=0):
    """(out rel err, lse rel err) of fn against the fp64 moda_reference."""
    from moda_bench.kernels.moda import moda_reference
    q, k, v, kd, vd = random_inputs(B, T, G * Hk, Hk, d, L, dtype, device, seed)
    out, lse = fn(q, k, v, kd, vd)
    ref, ref_lse = moda_reference(q, k, v, kd, vd, return_lse=True, out_dtype=torch.float64)
    return rel_err(out, ref), rel_err(lse, ref_lse)


class Rows:
    """Result rows, printed as they come and appended to a CSV (when given) as each one is added,
    so a crash later in the run loses nothing."""
    FIELDS = ["section", "name", "T", "G", "Hk", "d", "L", "status", "ms", "p20", "p80", "tflops", "x_fa4",
              "rel_err", "lse_err", "note"]

    def __init__(self, path=None):
        self.rows = []
        self.path = path
        if path:
            with open(path, "w", newline="") as fh:
                csv.DictWriter(fh, fieldnames=self.FIELDS).writeheader()

    def add(self, **kw):
        row = {f: kw.get(f, "") for f in self.FIELDS}
        self.rows.append(row)
        if self.path:
            with open(self.path, "a", newline="") as fh:
                csv.DictWriter(fh, fieldnames=self.FIELDS).writerow(
                    {k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
        return row


def bench(fn, warmup_ms, rep_ms):
    from triton.testing import do_bench
    return do_bench(fn, warmup=warmup_ms, rep=rep_ms, quantiles=[0.5, 0.2, 0.8])


def correctness(rows: Rows, variants: dict, args, device) -> dict:
    """The odd-shape grid (T=1000; G 1, 2, 8, 16; L 0, 1, 64; d=64; plus d=128 and G=3, L=5, T=333)
    on the first variant, the timed shape's odd twin (T=1000, args.G, args.L, args.d) on every
    other. Returns {variant: error of that twin, or None (failed or too wrong: not timed)};
    the other cases are reported, they do not stop a variant from being timed."""
    names = list(variants)
    ok = {}
    twin = (1000, args.G, args.L, args.d)
    grid = [(1000, G, L, 64) for G in (1, 2, 8, 16) for L in (0, 1, 64)] + [(1000, 8, 64, 128), (333, 3, 5, 64)]
    for vi, name in enumerate(names):
        cases = ([twin] + [c for c in grid if c != twin]) if vi == 0 else [twin]
        ok[name] = None
        for (T, G, L, d) in cases:
            t0 = time.time()
            try:
                e_out, e_lse = check_case(lambda *a: moda_fused_fwd(*a, **variants[name]), args.check_B, T, G, 2, d, L,
                                          torch.bfloat16, device, seed=T + G + L + d)
                status = "ok" if e_out < args.tol and e_lse < args.tol else "wrong"
                rows.add(section="check", name=name, T=T, G=G, Hk=2, d=d, L=L, status=status, rel_err=e_out,
                         lse_err=e_lse, note=f"{time.time() - t0:.1f}s incl. compile")
                print(f"  check {name:22s} T={T:4d} G={G:2d} L={L:2d} d={d:3d}: out {e_out:.2e} lse {e_lse:.2e} "
                      f"{status} ({time.time() - t0:.1f}s)", flush=True)
                if (T, G, L, d) == twin and status == "ok":
                    ok[name] = max(e_out, e_lse)
            except Exception as exc:  # noqa: BLE001 - a variant's compile failure is a result
                rows.add(section="check", name=name, T=T, G=G, Hk=2, d=d, L=L, status="error", note=one_line(exc))
                print(f"  check {name:22s} T={T:4d} G={G:2d} L={L:2d} d={d:3d}: FAILED {one_line(exc)}", flush=True)
                if args.verbose:
                    traceback.print_exc()
                if (T, G, L, d) == twin:
                    break  # the variant does not run at the timed shape: skip its other cases
    return ok


def timing(rows: Rows, variants: dict, ok: dict, args, device):
    from moda_bench.kernels.moda import moda_attention
    fa4_fn = moda_fa4_fn = None
    try:
        from fused_fwd_cute import fa4_problem  # same folder: FA4 availability, PYTHONPATH installs too
    except ImportError:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from fused_fwd_cute import fa4_problem
    reason = fa4_problem()
    if reason is None:
        from flash_attn.cute import flash_attn_func

        from moda_bench.kernels.moda.fa4.merge import moda_fa4

        def fa4_fn(q, k, v, kd, vd):
            return flash_attn_func(q, k, v, causal=True)

        def moda_fa4_fn(q, k, v, kd, vd):
            return moda_fa4(q, k, v, kd, vd)
    else:
        print(f"  FA4 not timed: {reason}")

    G, Hk, d, L = args.G, args.Hk, args.d, args.L
    for T in args.T:
        q, k, v, kd, vd = random_inputs(1, T, G * Hk, Hk, d, L, torch.bfloat16, device, seed=T)
        providers = []
        if fa4_fn is not None:
            providers.append(("fa4 (seq only)", fa4_fn, 0))
        providers += [(f"fused {n}", (lambda n: lambda *a: moda_fused_fwd(*a, **variants[n]))(n), L)
                      for n in variants if ok.get(n) is not None]
        if T == args.seq_only_T:  # the sequence part alone: our kernel with L = 0 against FA4
            providers += [(f"fused {n} L=0", (lambda n: lambda q, k, v, kd, vd: moda_fused_fwd(q, k, v, **variants[n]))(n),
                           0) for n in variants if ok.get(n) is not None]
        providers.append(("moda_attention", lambda *a: moda_attention(*a), L))
        if moda_fa4_fn is not None:
            providers.append(("moda-fa4", moda_fa4_fn, L))
        fa4_ms = None
        print(f"\nT={T} G={G} Hk={Hk} d={d} L={L} bf16, forward (median of do_bench, ms):", flush=True)
        for name, fn, Lp in providers:
            t_start = time.time()
            try:
                with torch.no_grad():
                    fn(q, k, v, kd, vd)  # compile outside the timing
                    torch.cuda.synchronize()
                    med, p20, p80 = bench(lambda: fn(q, k, v, kd, vd), args.warmup_ms, args.rep_ms)
                tf = useful_flops(1, T, G * Hk, d, Lp) / (med * 1e-3) / 1e12
                if name.startswith("fa4"):
                    fa4_ms = med
                x = med / fa4_ms if fa4_ms else float("nan")
                rows.add(section="time", name=name, T=T, G=G, Hk=Hk, d=d, L=Lp, status="ok", ms=med, p20=p20,
                         p80=p80, tflops=tf, x_fa4=x, note=f"{time.time() - t_start:.1f}s incl. compile")
                print(f"  {name:34s} {med:8.3f} ms ({p20:.3f}-{p80:.3f})  {tf:6.1f} TFLOP/s  x{x:5.3f} FA4", flush=True)
            except Exception as exc:  # noqa: BLE001
                rows.add(section="time", name=name, T=T, G=G, Hk=Hk, d=d, L=Lp, status="error", note=one_line(exc))
                print(f"  {name:34s} FAILED {one_line(exc)}", flush=True)
                if args.verbose:
                    traceback.print_exc()
        del q, k, v, kd, vd
        torch.cuda.empty_cache()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--T", default="16384,4096,32768", help="timing sequence lengths")
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--Hk", type=int, default=8)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--L", type=int, default=64)
    ap.add_argument("--variants", default=",".join(RUN_DEFAULT), help=f"comma list from {','.join(VARIANTS)}")
    ap.add_argument("--seq-only-T", type=int, default=16384, help="T at which each variant is also timed with L=0")
    ap.add_argument("--check-B", type=int, default=2)
    ap.add_argument("--tol", type=float, default=2e-2, help="max rel. error vs the fp64 reference (bf16)")
    ap.add_argument("--warmup-ms", type=float, default=10)
    ap.add_argument("--rep-ms", type=float, default=40)
    ap.add_argument("--quick", action="store_true", help=f"T=16384 only, variants {','.join(QUICK)}")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--no-time", action="store_true")
    ap.add_argument("--verbose", action="store_true", help="full tracebacks")
    args = ap.parse_args(argv)
    if args.quick:
        args.T, args.variants = "16384", ",".join(QUICK)
    args.T = [int(x) for x in args.T.split(",") if x]
    names = [n for n in args.variants.split(",") if n]
    bad = [n for n in names if n not in VARIANTS]
    if bad:
        print(f"unknown variants {bad}; known: {list(VARIANTS)}")
        return 2
    variants = {n: VARIANTS[n] for n in names}
    if not torch.cuda.is_available():
        print("ROUTE A: not run: no CUDA device (the CPU interpreter path is tested by tests/test_fused_proto.py)")
        return 0
    device = torch.device("cuda")
    cap = torch.cuda.get_device_capability()
    print(f"{torch.cuda.get_device_name()} (sm{cap[0]}{cap[1]}), torch {torch.__version__}, triton {triton.__version__}")
    out = os.environ.get("OUT")
    path = os.path.join(out, "fused_triton.csv") if out else None
    rows = Rows(path)
    t_all = time.time()
    if args.no_check:
        ok = {n: 0.0 for n in variants}
    else:
        print("correctness vs moda_reference (fp64), bf16 inputs:")
        ok = correctness(rows, variants, args, device)
    if not args.no_time:
        timing(rows, variants, ok, args, device)
    if path:
        print(f"wrote {path}")
    timed = [r for r in rows.rows if r["section"] == "time" and r["status"] == "ok" and r["name"].startswith("fused")
             and not r["name"].endswith("L=0") and r["T"] == 16384]
    if timed:
        best = min(timed, key=lambda r: r["ms"])
        print(f"ROUTE A: ran, best {best['name']} at T=16384: {best['ms']:.3f} ms, {best['tflops']:.0f} TFLOP/s, "
              f"x{best['x_fa4']:.3f} FA4 ({time.time() - t_all:.0f} s in all)")
    else:
        print(f"ROUTE A: no variant timed at T=16384 ({time.time() - t_all:.0f} s in all)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
