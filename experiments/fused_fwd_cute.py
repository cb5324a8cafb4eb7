"""Route B prototype (issue 20): MoDA's depth tiles inside FlashAttention-4's sm90 forward
pipeline (CuTe DSL, flash-attn-4 4.0.0b36 used as a dependency, never copied). Forward only.

Verdict of the study (details and the design in docs/DESIGN.md, "The fused sm90 forward"):
a subclass of `flash_attn.cute.flash_fwd_sm90.FlashAttentionForwardSm90` that adds the depth
tiles cannot be small. The kernel has no hook for a second K/V source:
  * `__call__` builds the TMA atoms/tensors of Q, K, V, O from its arguments and passes them to
    `kernel` as parameters; a depth TMA atom (k_depth, v_depth) needs a new `__call__`;
  * `kernel` (a @cute.kernel with a fixed parameter list) creates pipeline_q/k/v and splits the
    warps (warp group 0: `load`, the producer; groups 1..3: `mma`, the consumers); the depth
    atoms must become parameters, so `kernel` is re-implemented too;
  * `load` walks ONE contiguous n_block range per work tile (n_block_max-1 down to n_block_min,
    from `BlockInfo.get_n_block_min_max`), K and V interleaved for the intra-warpgroup overlap;
    `load_KV` (the only small per-block hook) receives a TMA copy function already bound to the
    sequence K/V tensor, and `page_idx` (the one source-index override) exists only with a page
    table;
  * `mma` hard-codes the loop structure (first half block with the seqlen mask, causal-masked
    blocks, unmasked blocks, last half block) and runs every consumer warp group on every
    block; a per-warp-group skip of foreign depth blocks (the thing that makes the fused
    design cheap, utilisation G/64 instead of G/tile_m) does not exist;
  * unmodified FA4 can only add depth keys as extra key blocks through `mask_mod` plus
    block-sparse tensors on a concatenated key buffer (experiments/fa4_mask_route.py). With pack_gqa
    its sparse lists are indexed by m_block // qhead_per_kvhead
    (`block_sparse_utils.sparse_tensor_m_block`), i.e. per tile_m *positions* (192), while
    a packed tile covers tile_m/G = 24 positions: every packed tile walks the depth keys of 192
    positions (96 blocks of 128 at L=64, utilisation 1/192). Measured: 4.2x FA4 fwd+bwd at
    T=16384 (results/h200/gap-t16384/mask_route.log).
So the subclass re-implements `__call__`, `kernel`, `load` and `mma` (about 700 lines of FA4's
code, which this project may not copy), and it cannot be compiled or tested on the CPU machine
(the CuTe DSL needs the GPU toolchain). This script therefore measures what CAN be measured for
the route, so that the decision A vs B rests on numbers:

  1. FA4 forward at the base point with pack_gqa=True (FA4's default for GQA) and False;
  2. the compute side of a fused FA4 kernel, by a proxy that FA4 runs unmodified: causal FA4
     over X extra keys placed before the sequence (bottom-right causal alignment: query t sees
     the X prefix keys and keys 0..t), so every packed tile does X/tile_n extra full key blocks:
       X = L      = 64:   the FLOP floor (every row's L depth logits, utilisation 1);
       X = 64*L/G = 512:  the designed subclass (each consumer warp group scores its own 8
                          positions' 512 depth keys, 4 blocks; utilisation G/64);
       X = tile_m/G*L = 1536: the subclass without the per-warp-group skip (12 blocks/tile);
     the prefix is the same for every tile (it stays in L2), so the proxy leaves out the depth
     bytes' DRAM traffic, which is measured separately:
  3. the depth bytes alone (a read of k_depth and v_depth, 2 x 1.07 GB at the base point);
  4. moda-fa4's forward (the current merge route) for reference.
The predicted forward of the subclass is [X=512 proxy, X=512 proxy + depth-read time]: the
lower end if the copy engine hides the depth tiles under the sequence blocks (they travel the
same pipeline), the upper end if none of it is hidden.

The verdict line is "ROUTE B: not runnable: <reason>" followed by the measured bound, or
"ROUTE B: ran, ..." if a future version of this file carries a runnable subclass.

    PYTHONPATH=$PWD python3 experiments/fused_fwd_cute.py            # needs CUDA + flash-attn-4 (sm90)
    PYTHONPATH=$PWD python3 experiments/fused_fwd_cute.py --T 16384,32768
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

SUBCLASS_REASON = ("FA4 4.0.0b36 sm90 forward has no hook for a second K/V source or a per-warp-group "
                   "block skip: a depth-aware subclass must re-implement __call__ (depth TMA atoms), kernel "
                   "(its parameters), load (a second n_block range) and mma (depth blocks, per-warp-group "
                   "skip, block-diagonal mask), i.e. FA4's code, which may not be copied; not written this round")


def one_line(exc: BaseException) -> str:
    msg = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {msg[:240]}"


def fa4_problem():
    """None if FA4 can run here, else why not (never raises). Accepts an FA4 that imports from
    PYTHONPATH without distribution metadata."""
    try:
        from moda_bench.kernels.moda.fa4.merge import fa4_unavailable
        reason = fa4_unavailable()
        if reason is None or "not installed" not in reason:
            return reason
        if not torch.cuda.is_available():
            return "no CUDA device"
        from flash_attn.cute.interface import _flash_attn_fwd  # noqa: F401
        return None if torch.cuda.get_device_capability()[0] in (9, 10) else "FA4 needs sm90/sm100"
    except Exception as exc:  # noqa: BLE001
        return one_line(exc)


def fa4_fwd(q, k, v, pack_gqa=None, return_lse=True):
    """FA4's forward (causal, bottom-right aligned when k is longer than q): (out, lse)."""
    from flash_attn.cute.interface import _flash_attn_fwd
    res = _flash_attn_fwd(q, k, v, causal=True, pack_gqa=pack_gqa, return_lse=return_lse)
    return res[0], res[1]


def prefix_alignment_error(device, G: int, d: int) -> float:
    """Relative error of FA4 with an X-key prefix against torch, to confirm the proxy's
    semantics (query t sees the X prefix keys and sequence keys 0..t). Same G and d as the
    timed point, so FA4 compiles no extra variant for it."""
    B, T, Hk, X = 1, 200, 1, 72
    g = torch.Generator(device="cpu").manual_seed(0)
    q = torch.randn(B, T, G * Hk, d, generator=g).to(device, torch.bfloat16)
    k = torch.randn(B, X + T, Hk, d, generator=g).to(device, torch.bfloat16)
    v = torch.randn(B, X + T, Hk, d, generator=g).to(device, torch.bfloat16)
    out, _ = fa4_fwd(q, k, v)
    qh = q.double().transpose(1, 2)
    kh = k.double().repeat_interleave(G, 2).transpose(1, 2)
    vh = v.double().repeat_interleave(G, 2).transpose(1, 2)
    s = qh @ kh.transpose(-1, -2) / math.sqrt(d)
    vis = torch.arange(X + T, device=device)[None, :] <= (torch.arange(T, device=device)[:, None] + X)
    s = s.masked_fill(~vis, float("-inf"))
    ref = (torch.softmax(s, -1) @ vh).transpose(1, 2)
    return float((out.double() - ref).norm() / ref.norm())


def bench(fn, warmup_ms, rep_ms):
    from triton.testing import do_bench
    return do_bench(fn, warmup=warmup_ms, rep=rep_ms, quantiles=[0.5, 0.2, 0.8])


def useful_flops(B, T, Hq, d, L) -> float:
    return 4.0 * B * Hq * d * (T * (T + 1) / 2 + T * L)


FIELDS = ["name", "T", "G", "Hk", "d", "L", "X", "status", "ms", "p20", "p80", "x_fa4", "note"]


def run_point(T, args, device, writer, results):
    from moda_bench.kernels.moda.fa4.merge import moda_fa4
    G, Hk, d, L = args.G, args.Hk, args.d, args.L
    Hq = G * Hk
    gen = torch.Generator(device=device).manual_seed(T)

    def rnd(*s):
        return torch.randn(*s, generator=gen, device=device, dtype=torch.bfloat16)

    q, k, v = rnd(1, T, Hq, d), rnd(1, T, Hk, d), rnd(1, T, Hk, d)
    kd = rnd(1, T, L, Hk, d) if L else None
    vd = rnd(1, T, L, Hk, d) if L else None
    tile_m = 192 if d <= 64 else 128  # FA4's sm90 forward tile for causal d<=64 / d<=128
    xs = [("floor", L), ("subclass (per-WG skip)", max(64 * L // G, L)), ("subclass (no skip)", tile_m // G * L)]
    cases = [("fa4 pack_gqa", lambda: fa4_fwd(q, k, v, pack_gqa=True), 0),
             ("fa4 no pack_gqa", lambda: fa4_fwd(q, k, v, pack_gqa=False), 0)]
    for label, X in xs:
        kx = torch.cat([rnd(1, X, Hk, d), k], 1)
        vx = torch.cat([rnd(1, X, Hk, d), v], 1)
        cases.append((f"fa4 + {X} prefix keys = {label}", (lambda kx, vx: lambda: fa4_fwd(q, kx, vx, pack_gqa=True))(kx, vx), X))
    if L:
        cases.append(("depth bytes: read k_depth + v_depth",
                      lambda: (kd.sum(dtype=torch.float32), vd.sum(dtype=torch.float32)), -1))
        cases.append(("moda-fa4 (merge route, fwd)", lambda: moda_fa4(q, k, v, kd, vd), -2))
    print(f"\nT={T} G={G} Hk={Hk} d={d} L={L} bf16, forward (ms, median of do_bench):", flush=True)
    base = None
    out = {}
    for name, fn, X in cases:
        t0 = time.time()
        row = dict(name=name, T=T, G=G, Hk=Hk, d=d, L=L, X=X if X >= 0 else "", status="error")
        try:
            with torch.no_grad():
                fn()
                torch.cuda.synchronize()
                med, p20, p80 = bench(fn, args.warmup_ms, args.rep_ms)
            if base is None:
                base = med
            row.update(status="ok", ms=f"{med:.4f}", p20=f"{p20:.4f}", p80=f"{p80:.4f}", x_fa4=f"{med / base:.4f}",
                       note=f"{time.time() - t0:.1f}s incl. compile")
            extra = ""
            if X == -1:
                gb = 2 * kd.numel() * kd.element_size() / 1e9
                extra = f"  ({gb:.2f} GB, {gb / med:.2f} TB/s)"
            elif X >= 0:
                extra = f"  {useful_flops(1, T, Hq, d, 0) / (med * 1e-3) / 1e12:6.1f} TFLOP/s (sequence FLOPs)"
            print(f"  {name:48s} {med:8.3f} ms ({p20:.3f}-{p80:.3f})  x{med / base:5.3f} FA4{extra}", flush=True)
            out[name] = med
        except Exception as exc:  # noqa: BLE001 - one failing case must not stop the others
            row["note"] = one_line(exc)
            print(f"  {name:48s} FAILED {one_line(exc)}", flush=True)
            if args.verbose:
                traceback.print_exc()
        if writer is not None:
            writer(row)
    results[T] = out
    del q, k, v, kd, vd
    torch.cuda.empty_cache()


def predict(T, out, args):
    """The subclass's predicted forward from the measured pieces (None if pieces are missing)."""
    fa4 = out.get("fa4 pack_gqa")
    skip = next((v for k, v in out.items() if "per-WG skip" in k), None)
    floor = next((v for k, v in out.items() if k.endswith("= floor")), None)
    byt = out.get("depth bytes: read k_depth + v_depth")
    merge = out.get("moda-fa4 (merge route, fwd)")
    if not (fa4 and skip and byt):
        return None
    lo, hi = skip, skip + byt
    txt = (f"T={T}: fused-FA4 subclass predicted {lo:.3f}-{hi:.3f} ms = x{lo / fa4:.3f}-{hi / fa4:.3f} FA4 "
           f"(FLOP floor x{floor / fa4:.3f}" + (f"; merge route x{merge / fa4:.3f}" if merge else "") + ")")
    return txt, lo / fa4, hi / fa4


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--T", default="16384", help="sequence lengths")
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--Hk", type=int, default=8)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--L", type=int, default=64)
    ap.add_argument("--warmup-ms", type=float, default=10)
    ap.add_argument("--rep-ms", type=float, default=40)
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    reason = fa4_problem()
    if reason is not None:
        print(f"ROUTE B: not runnable: {reason}")
        return 0
    device = torch.device("cuda")
    t_all = time.time()
    try:
        from moda_bench.kernels.moda.fa4.merge import fa4_version
        ver = fa4_version()
    except Exception:  # noqa: BLE001 - imported from PYTHONPATH without metadata
        ver = "(version unknown)"
    print(f"{torch.cuda.get_device_name()}, flash-attn-4 {ver}, torch {torch.__version__}")
    print(f"subclass: {SUBCLASS_REASON}")
    writer = None
    path = None
    if os.environ.get("OUT"):
        path = os.path.join(os.environ["OUT"], "fused_cute.csv")
        with open(path, "w", newline="") as fh:
            csv.DictWriter(fh, fieldnames=FIELDS).writeheader()

        def writer(row):
            with open(path, "a", newline="") as fh:
                csv.DictWriter(fh, fieldnames=FIELDS).writerow({f: row.get(f, "") for f in FIELDS})
    try:
        err = prefix_alignment_error(device, args.G, args.d)
        print(f"proxy semantics: FA4 with a 72-key prefix vs torch (bottom-right causal): rel err {err:.2e}"
              + ("" if err < 2e-2 else "  <-- NOT bottom-right aligned: the prefix proxies below are invalid"))
    except Exception as exc:  # noqa: BLE001
        print(f"proxy semantics check failed: {one_line(exc)}")
    results = {}
    for T in (int(x) for x in args.T.split(",") if x):
        try:
            run_point(T, args, device, writer, results)
        except Exception as exc:  # noqa: BLE001
            print(f"T={T}: {one_line(exc)}")
            if args.verbose:
                traceback.print_exc()
    preds = [p for T, out in results.items() if (p := predict(T, out, args))]
    for txt, _, _ in preds:
        print(txt)
    if path:
        print(f"wrote {path}")
    tail = f"; measured bound {preds[0][1]:.3f}-{preds[0][2]:.3f} x FA4 fwd" if preds else ""
    print(f"ROUTE B: not runnable: {SUBCLASS_REASON}{tail} ({time.time() - t_all:.0f} s in all)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
