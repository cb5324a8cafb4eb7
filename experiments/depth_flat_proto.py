"""Prototype (issue 20): moda-overlap's streaming depth forward with ONE flat loop over a program's
(item, depth step) pairs, so that the software pipeline prefetches across items.

Why: `kernel_depth.depth_fwd_kernel` walks its items in an outer loop and pipelines only the inner
loop over an item's depth steps. At L=64 an item has 4 steps (BL=16), so every item starts with an
empty pipeline and ends with a drain: about two memory latencies per four steps of data. That may
be why a program streams only ~45 GB/s (results/h100/overlap-probe) and why moda-overlap needs
many programs, taking SMs from FA4, where the depth bytes are large (G=2, L=256: 1.34x FA4).
Here the loop index f runs over this program's items x steps; the tiles of f+1, f+2 (the next
item's included) are in flight while f computes. Each step reloads the item's q tile (an L2 hit
after the first step), resets the running softmax on an item's first step and stores o_d, lse_d
on its last (masked stores, no branches in the pipelined loop).

Same contract and item order as `kernel_depth.depth_fwd` (results bitwise comparable in fp32 on
the interpreter). Not in the package until measured:

    PYTHONPATH=$PWD python3 experiments/depth_flat_proto.py --check                    # against depth_fwd
    PYTHONPATH=$PWD python3 experiments/depth_flat_proto.py --T 16384 --G 8,2 --L 64,256 --programs 8,16,32 \\
        --out flat.csv                                                          # GB/s a program, CUDA
"""
from __future__ import annotations

import argparse
import csv
import sys

import torch
import triton
import triton.language as tl

from moda_bench.kernels.launch import cdiv, next_pow2
from moda_bench.kernels.moda.triton.depth import LOG2E, NEG, depth_fwd
from moda_bench.kernels.moda.triton.fwd_tma import depth_geometry, depth_rows_desc, ensure_allocator, rows_desc
from moda_bench.kernels.moda.triton.utils import dot_precision, mm


@triton.jit(do_not_specialize=["B", "T", "L", "n_items"])
def depth_fwd_flat_kernel(Q, KD, VD, OD, LSED, qk_scale, B, T, L, G, Hk, Hq, n_items, GP: tl.constexpr,
                          BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, S: tl.constexpr, BL: tl.constexpr,
                          PREC: tl.constexpr, DEPTH_STAGES: tl.constexpr):
    P: tl.constexpr = BLOCK_M // GP
    NB: tl.constexpr = P // S
    R: tl.constexpr = S * GP
    C: tl.constexpr = S * BL
    qdesc = rows_desc(Q, B, T, Hq, P, GP, HEAD_DIM)
    kddesc = depth_rows_desc(KD, B, T, L, Hk, P, BL, HEAD_DIM)
    vddesc = depth_rows_desc(VD, B, T, L, Hk, P, BL, HEAD_DIM)
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    n_steps = tl.cdiv(L, BL)
    mine = tl.cdiv(n_items - pid, nprog)  # items pid, pid + nprog, ...
    rows = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rr = tl.arange(0, R)[None, :, None]
    cc = tl.arange(0, C)[None, None, :]
    same_pos = (rr // GP) == (cc // BL)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    m_i = tl.full([BLOCK_M], NEG, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    for f in tl.range(0, mine * n_steps, num_stages=DEPTH_STAGES):
        k_item = f // n_steps
        step = f - k_item * n_steps
        it = pid + k_item * nprog
        bh = it % (B * Hk)
        b = bh // Hk
        j = bh % Hk
        t0 = (it // (B * Hk)) * P
        l0 = step * BL
        q = tl.reshape(qdesc.load([b, t0, j * G, 0]), (BLOCK_M, HEAD_DIM))
        kd = kddesc.load([b * T + t0, l0, j * HEAD_DIM])
        vd = vddesc.load([b * T + t0, l0, j * HEAD_DIM])
        first = step == 0
        acc = tl.where(first, 0.0, acc)
        m_i = tl.where(first, NEG, m_i)
        l_i = tl.where(first, 0.0, l_i)
        q3 = tl.reshape(q, (NB, R, HEAD_DIM))
        kd3 = tl.reshape(kd, (NB, C, HEAD_DIM))
        s3 = mm(q3, tl.trans(kd3, 0, 2, 1), PREC) * qk_scale
        s3 = tl.where(same_pos & ((l0 + cc % BL) < L), s3, NEG)
        s = tl.reshape(s3, (BLOCK_M, C))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        vd3 = tl.reshape(vd, (NB, C, HEAD_DIM))
        pv = tl.reshape(mm(tl.reshape(p.to(vd3.dtype), (NB, R, C)), vd3, PREC), (BLOCK_M, HEAD_DIM))
        acc = acc * alpha[:, None] + pv
        m_i = m_new
        t = t0 + rows // GP
        ok = (t < T) & (rows % GP < G) & ((rows * 0 + step) == n_steps - 1)  # a vector: the interpreter's masks
        qrow = (b * T + t).to(tl.int64) * Hq + j * G + rows % GP
        tl.store(OD + qrow[:, None] * HEAD_DIM + offs_d[None, :], (acc / l_i[:, None]).to(OD.dtype.element_ty),
                 mask=ok[:, None])
        tl.store(LSED + qrow, (m_i + tl.math.log2(l_i)) / 1.4426950408889634, mask=ok)


def depth_fwd_flat(q, kd, vd, scale: float, G: int, programs: int, *, block_m: int = 128, stages: int = 3,
                   num_warps: int = 4):
    """(o_d, lse_d) as `kernel_depth.depth_fwd`, with the flat (item, step) loop."""
    B, T, Hq, d = q.shape
    L, Hk = kd.shape[2], kd.shape[3]
    od = torch.empty_like(q)
    lsed = torch.empty((B, T, Hq), device=q.device, dtype=torch.float32)
    gp, P, S, bl = depth_geometry(G, max(block_m, next_pow2(G)))
    n_items = cdiv(T, P) * B * Hk
    ensure_allocator()
    depth_fwd_flat_kernel[(max(1, min(n_items, programs)),)](
        q, kd, vd, od, lsed, scale * LOG2E, B, T, L, G, Hk, Hq, n_items, GP=gp, BLOCK_M=P * gp, HEAD_DIM=d, S=S,
        BL=bl, PREC=dot_precision(q.dtype), DEPTH_STAGES=stages, num_warps=num_warps)
    return od, lsed


def inputs(B, T, G, Hk, L, d, dtype, device, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(B, T, G * Hk, d, generator=g, device=device).to(dtype)
    kd = torch.randn(B, T, L, Hk, d, generator=g, device=device).to(dtype)
    vd = torch.randn(B, T, L, Hk, d, generator=g, device=device).to(dtype)
    return q, kd, vd


def check(device: str) -> float:
    """Largest relative difference to `depth_fwd` over a grid of odd shapes (fp32)."""
    worst = 0.0
    for (B, T, G, L, d, bm, n) in [(2, 21, 8, 64, 32, 64, 3), (1, 37, 3, 5, 32, 32, 2), (1, 19, 1, 1, 16, 16, 4),
                                   (2, 13, 2, 19, 32, 32, 1), (1, 33, 16, 7, 16, 64, 5)]:
        q, kd, vd = inputs(B, T, G, 2, L, d, torch.float32, device, seed=T + L)
        ref = depth_fwd(q, kd, vd, 0.3, G, n, block_m=bm)
        got = depth_fwd_flat(q, kd, vd, 0.3, G, n, block_m=bm)
        for a, r in zip(got, ref):
            worst = max(worst, float((a - r).norm() / r.norm()))
    return worst


def time_rates(args) -> list[dict]:
    from moda_bench.timing import RoundRule, time_interleaved
    rows = []
    for G in [int(v) for v in args.G.split(",")]:
        for L in [int(v) for v in args.L.split(",")]:
            q, kd, vd = inputs(1, args.T, G, args.Hk, L, args.d, torch.bfloat16, "cuda")
            gbytes = 2 * kd.numel() * kd.element_size() / 1e9
            for n in [int(v) for v in args.programs.split(",")]:
                fns = {"persist": lambda: depth_fwd(q, kd, vd, 0.125, G, n, block_m=args.block_m),
                       "flat": lambda: depth_fwd_flat(q, kd, vd, 0.125, G, n, block_m=args.block_m,
                                                      stages=args.stages)}
                a, b = fns["persist"](), fns["flat"]()
                same = bool(torch.equal(a[0], b[0]))
                res = time_interleaved(fns, baseline="persist", rule=RoundRule(max_time_s=args.max_time))
                for name in fns:
                    ms = res.measurements[name].median_ms
                    r, lo, hi = res.ratios.get(name, (1.0, 1.0, 1.0))
                    rows.append(dict(T=args.T, G=G, L=L, programs=n, kernel=name, ms=round(ms, 4),
                                     gbps_per_program=round(gbytes / (ms / 1e3) / n, 2),
                                     ratio_to_persist=round(r, 4), lo=round(lo, 4), hi=round(hi, 4), same_output=same))
                    print(rows[-1], flush=True)
                del fns, a, b
            del q, kd, vd
            torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with kernel_depth.depth_fwd and exit")
    ap.add_argument("--T", type=int, default=16384)
    ap.add_argument("--G", default="8,2")
    ap.add_argument("--L", default="64,256")
    ap.add_argument("--Hk", type=int, default=8)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--programs", default="8,16,32")
    ap.add_argument("--block-m", type=int, default=128)
    ap.add_argument("--stages", type=int, default=3)
    ap.add_argument("--max-time", type=float, default=3.0)
    ap.add_argument("--out", default="depth_flat.csv")
    args = ap.parse_args(argv)
    if args.check or not torch.cuda.is_available():
        worst = check("cuda" if torch.cuda.is_available() else "cpu")
        print(f"flat vs depth_fwd: largest relative difference {worst:.3g}")
        return 0 if worst < 1e-5 else 1
    rows = time_rates(args)
    with open(args.out, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
