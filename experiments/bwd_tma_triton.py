"""Issue 21 prototype of the folded-row Triton backward of MoDA, with its variants, correctness grid
and timing; its design became the package's `kernel_bwd_tma` (read that docstring for the passes).
Besides the package's form it keeps an atomic-dQ variant ("at-": dq^T = k^T ds^T reduced by TMA
into a transposed fp32 buffer, no dQ pass; slower on the H100) and a separate row-statistics
launch (`_rows_kernel`). CPU tests: tests/test_bwd_tma_proto.py.

    moda_tma_bwd(q, k, v, o, lse, do, k_depth=None, v_depth=None, scale=None, **variant) -> (dq, dk, dv, dkd, dvd)

Variants: kv<BN>x<BM> keys per program x rows per step, dq<BM>x<BN>, w warps, s stages (3 unless
named), r<N> registers per thread, "p-" pointer loads, "at-" atomic dq. A GPU run prints the
correctness grid (fp64 autograd of moda_reference), backward-alone timings with each pass's time
and regs/spills/smem, next to FA4, SDPA flash, the package default and (--package) the package's
kernel with the same tiles; one line `BWD TMA: ...`; never exits non-zero; rows go to
$OUT/bwd_tma.csv when OUT is set:

    PYTHONPATH=$PWD python3 experiments/bwd_tma_triton.py --quick    # T=16384, L 0/64, 5 variants, ~2 min
    PYTHONPATH=$PWD python3 experiments/bwd_tma_triton.py --no-check --variants V --package V --T 16384,4096
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
import triton.language as tl

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from moda_bench.kernels.moda.triton.bwd_tma import (depth_desc, depth_part, dq_step, keys_tile, rows_desc,  # noqa: E402
                                                rows_ptr, rows_tile)
from moda_bench.kernels.moda.triton.utils import mm_acc  # noqa: E402
from moda_bench.kernels.moda.validate import check_inputs  # noqa: E402

LOG2E = 1.4426950408889634
INTERP = os.environ.get("TRITON_INTERPRET", "0") == "1"  # the CPU interpreter (read by Triton at import too)


# ----------------------------------------------------------------------------- kernels
@triton.jit(do_not_specialize=["T", "G", "Hk"])
def _rows_kernel(O, DO, LSE, LSE2, DELTA, DQA, sm_scale, T, G, Hk, RP, GP: tl.constexpr, BLK: tl.constexpr,
                 D: tl.constexpr, POST: tl.constexpr):
    """Folded rows r of (b, j). Before the passes: LSE2 = lse*log2(e) (+inf on padding rows), DELTA =
    rowsum(o*do). POST (atomic variant): O = dq = scale * the fp32 transposed buffer DQA."""
    bh, r = tl.program_id(0), tl.program_id(1) * BLK + tl.arange(0, BLK)
    ptr, ok = rows_ptr(bh // Hk, bh % Hk, 0, r, T, G, G * Hk, GP, D)
    if POST:
        a = tl.load(DQA + (bh * D + tl.arange(0, D)).to(tl.int64)[None, :] * RP + r[:, None], mask=ok, other=0.0)
        tl.store(O + ptr, (a * sm_scale).to(O.dtype.element_ty), mask=ok)
    else:
        o = tl.load(O + ptr, mask=ok, other=0.0).to(tl.float32)
        do = tl.load(DO + ptr, mask=ok, other=0.0).to(tl.float32)
        ok1 = (r // GP < T) & (r % GP < G)
        lse = tl.load(LSE + ((bh // Hk) * T + r // GP).to(tl.int64) * (G * Hk) + (bh % Hk) * G + r % GP, mask=ok1)
        tl.store(LSE2 + bh * RP + r, tl.where(ok1, lse * 1.4426950408889634, float("inf")))
        tl.store(DELTA + bh * RP + r, tl.sum(o * do, 1))


@triton.jit
def _kv_step(k, v, dk, dv, kn, t0, Q, DO, qdesc, dodesc, LSE2, DELTA, DQA, dqdesc, b, j, bh, T, G, Hk, RP,
             qk_scale, GP: tl.constexpr, BM: tl.constexpr, D: tl.constexpr, MASK: tl.constexpr,
             USE_DESC: tl.constexpr, ATOMIC: tl.constexpr, TMA_REDUCE: tl.constexpr, PREC: tl.constexpr):
    """dk, dv (+ the atomic dq share) of the key tile from the BM folded rows at position t0."""
    q, do = rows_tile(Q, qdesc, b, j, 0, t0, T, G, G * Hk, GP, BM, D, USE_DESC), \
        rows_tile(DO, dodesc, b, j, 0, t0, T, G, G * Hk, GP, BM, D, USE_DESC)
    r = t0 * GP + tl.arange(0, BM)
    lse2, delta = tl.load(LSE2 + bh * RP + r), tl.load(DELTA + bh * RP + r)
    pT = tl.math.exp2(mm_acc(k, tl.trans(q), None, PREC) * qk_scale - lse2[None, :])  # [BN, BM]
    if MASK:
        pT = tl.where(kn[:, None] <= (r // GP)[None, :], pT, 0.0)
    dv = mm_acc(pT.to(do.dtype), do, dv, PREC)
    dsT = (pT * (mm_acc(v, tl.trans(do), None, PREC) - delta[None, :])).to(q.dtype)
    dk = mm_acc(dsT, q, dk, PREC)
    if ATOMIC:
        dqT = mm_acc(tl.trans(k), dsT, None, PREC)  # [D, BM]: the transposed buffer takes it as it is
        if TMA_REDUCE:
            dqdesc.atomic_add([bh * D, t0 * GP], dqT)
        else:
            tl.atomic_add(DQA + (bh * D + tl.arange(0, D)).to(tl.int64)[:, None] * RP + r[None, :], dqT,
                          sem="relaxed")
    return dk, dv


@triton.jit(do_not_specialize=["B", "T", "G", "Hk"])
def _kv_kernel(Q, K, V, DO, LSE2, DELTA, DK, DV, DQA, qk_scale, sm_scale, B, T, G, Hk, RP,
               GP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr, ATOMIC: tl.constexpr,
               USE_DESC: tl.constexpr, TMA_REDUCE: tl.constexpr, PREC: tl.constexpr):
    """Key-major pass: dk, dv of BN keys of (batch, KV head); grid (B*Hk, cdiv(T, BN))."""
    P: tl.constexpr = BM // GP
    NDIAG: tl.constexpr = (BN + P - 1) // P
    bh, n0 = tl.program_id(0), tl.program_id(1) * BN
    b, j = bh // Hk, bh % Hk
    qdesc, dodesc, kdesc, vdesc, dqdesc = None, None, None, None, None
    if USE_DESC:
        qdesc = rows_desc(Q, B, T, G * Hk, P, GP, D)
        dodesc = rows_desc(DO, B, T, G * Hk, P, GP, D)
        kdesc = tl.make_tensor_descriptor(K, [B * T, Hk * D], [Hk * D, 1], [BN, D])
        vdesc = tl.make_tensor_descriptor(V, [B * T, Hk * D], [Hk * D, 1], [BN, D])
    if TMA_REDUCE:
        dqdesc = tl.make_tensor_descriptor(DQA, shape=[B * Hk * D, RP], strides=[RP, 1], block_shape=[D, BM])
    k = keys_tile(K, kdesc, b, j, n0, T, Hk, BN, D, USE_DESC)
    v = keys_tile(V, vdesc, b, j, n0, T, Hk, BN, D, USE_DESC)
    kn = n0 + tl.arange(0, BN)
    dk, dv = tl.zeros([BN, D], tl.float32), tl.zeros([BN, D], tl.float32)
    diag_end = tl.minimum(n0 + NDIAG * P, T)
    for t0 in range(n0, diag_end, P):  # positions whose rows see only part of the tile
        dk, dv = _kv_step(k, v, dk, dv, kn, t0, Q, DO, qdesc, dodesc, LSE2, DELTA, DQA, dqdesc, b, j, bh, T, G, Hk,
                          RP, qk_scale, GP, BM, D, True, USE_DESC, ATOMIC, TMA_REDUCE, PREC)
    for t0 in tl.range(diag_end, T, P):
        dk, dv = _kv_step(k, v, dk, dv, kn, t0, Q, DO, qdesc, dodesc, LSE2, DELTA, DQA, dqdesc, b, j, bh, T, G, Hk,
                          RP, qk_scale, GP, BM, D, False, USE_DESC, ATOMIC, TMA_REDUCE, PREC)
    ptr = ((b * T + kn).to(tl.int64) * Hk + j)[:, None] * D + tl.arange(0, D)[None, :]
    tl.store(DK + ptr, (dk * sm_scale).to(DK.dtype.element_ty), mask=(kn < T)[:, None])
    tl.store(DV + ptr, dv.to(DV.dtype.element_ty), mask=(kn < T)[:, None])


@triton.jit(do_not_specialize=["B", "T", "L", "LD", "G", "Hk", "n_m"])
def _dq_kernel(Q, K, V, KD, VD, DO, LSE2, DELTA, DQ, DQA, DKD, DVD, qk_scale, sm_scale, B, T, L, LD, G, Hk, RP, n_m,
               GP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr, S: tl.constexpr,
               BL: tl.constexpr, SEQ: tl.constexpr, DEPTH: tl.constexpr, ACC_OUT: tl.constexpr,
               USE_DESC: tl.constexpr, PREC: tl.constexpr, DEPTH_STAGES: tl.constexpr):
    """Query-major pass: dq of BM folded rows from the sequence keys (SEQ) and the depth keys,
    with dk_depth, dv_depth (DEPTH). ACC_OUT: the unscaled dq goes to the fp32 transposed buffer
    DQA (the atomic variant's depth launch). Grid (B*Hk, n_m), last row block first."""
    P: tl.constexpr = BM // GP
    bh, t0 = tl.program_id(0), (n_m - 1 - tl.program_id(1)) * P
    b, j = bh // Hk, bh % Hk
    qdesc, dodesc, kdesc, vdesc, kddesc, vddesc, dkddesc, dvddesc = None, None, None, None, None, None, None, None
    if USE_DESC:
        qdesc = rows_desc(Q, B, T, G * Hk, P, GP, D)
        dodesc = rows_desc(DO, B, T, G * Hk, P, GP, D)
        if SEQ:
            kdesc = tl.make_tensor_descriptor(K, [B * T, Hk * D], [Hk * D, 1], [BN, D])
            vdesc = tl.make_tensor_descriptor(V, [B * T, Hk * D], [Hk * D, 1], [BN, D])
        if DEPTH:
            kddesc = depth_desc(KD, B, T, LD, Hk, P, BL, D)
            vddesc = depth_desc(VD, B, T, LD, Hk, P, BL, D)
            dkddesc = depth_desc(DKD, B, T, LD, Hk, P, BL, D)
            dvddesc = depth_desc(DVD, B, T, LD, Hk, P, BL, D)
    q, do = rows_tile(Q, qdesc, b, j, 0, t0, T, G, G * Hk, GP, BM, D, USE_DESC), \
        rows_tile(DO, dodesc, b, j, 0, t0, T, G, G * Hk, GP, BM, D, USE_DESC)
    r = t0 * GP + tl.arange(0, BM)
    lse2, delta = tl.load(LSE2 + bh * RP + r), tl.load(DELTA + bh * RP + r)
    dq = tl.zeros([BM, D], tl.float32)
    if SEQ:
        n_full = (t0 // BN) * BN  # key tiles wholly below the block's first position
        for n0 in tl.range(0, n_full, BN):
            dq = dq_step(q, do, lse2, delta, r // GP, dq, K, V, kdesc, vdesc, b, j, n0, T, Hk, qk_scale, BN, D,
                         False, USE_DESC, PREC, False, 0)
        for n0 in range(n_full, tl.minimum(t0 + P, T), BN):
            dq = dq_step(q, do, lse2, delta, r // GP, dq, K, V, kdesc, vdesc, b, j, n0, T, Hk, qk_scale, BN, D,
                         True, USE_DESC, PREC, False, 0)
    if DEPTH:
        dq = depth_part(q, do, lse2, delta, dq, KD, VD, DKD, DVD, kddesc, vddesc, dkddesc, dvddesc, b, j, t0, T, L,
                        Hk, qk_scale, sm_scale, GP, BM, D, S, BL, USE_DESC, PREC, DEPTH_STAGES, True)
    if ACC_OUT:
        tl.store(DQA + (bh * D + tl.arange(0, D)).to(tl.int64)[None, :] * RP + r[:, None], dq)
    else:
        ptr, ok = rows_ptr(b, j, 0, r, T, G, G * Hk, GP, D)
        tl.store(DQ + ptr, (dq * sm_scale).to(DQ.dtype.element_ty), mask=ok)


# ----------------------------------------------------------------------------- launcher
DEFAULT_VARIANT = dict(kv_bn=128, kv_bm=64, kv_warps=8, kv_stages=3, dq_bm=128, dq_bn=64, dq_warps=8, dq_stages=3,
                       use_desc=True, atomic=False, depth_stages=2, depth_rows=256, kv_maxnreg=None, dq_maxnreg=None)
_W4 = dict(kv_bn=64, kv_bm=64, kv_warps=4)  # 4-warp kv tiles: 2 CTAs per SM
_DQ4 = dict(dq_bm=64, dq_warps=4, depth_rows=128)  # 4-warp dq tiles: 3 CTAs per SM at L = 0
VARIANTS = {
    "kv128x64w8-dq128x64w8": {},  # first H100 run (T=16K): dropped kv128x128s2, dq128x128s2, dst3, p-at
    "kv64x64w4-dq128x64w8": dict(_W4),
    "kv64x64w4-dq64x64w4": dict(_W4, **_DQ4),
    "at-kv128x64w8": dict(atomic=True),
    "at-kv64x64w4": dict(_W4, atomic=True, **_DQ4),
    "p-kv128x64w8-dq128x64w8": dict(use_desc=False),
    # around the first GPU run's best (kv64x64w4-dq64x64w4: 2+ CTAs an SM in both passes); dropped after
    # the second (all slower): kv128x64-dq64, kv64x128-dq128, 2 or 4 stages, kv32, dq32 rows
    "kv64x32w4-dq64x64w4": dict(_W4, kv_bm=32, **_DQ4),
    "kv64x64w4-dq64x32w4": dict(_W4, dq_bn=32, **_DQ4),
    "kv64x64w4-dq64x128w4": dict(_W4, dq_bn=128, **_DQ4),
    "kv64x64w4-dq64x64w4-dr64": dict(_W4, **dict(_DQ4, depth_rows=64)),
    "kv64x64w4-dq64x64w4-dr256": dict(_W4, **dict(_DQ4, depth_rows=256)),
    "kv64x64w4-dq64x64w4-dst3": dict(_W4, depth_stages=3, **_DQ4),
    "kv64x64w4r168-dq64x64w4": dict(_W4, kv_maxnreg=168, **_DQ4),  # 3 CTAs an SM by registers
    "kv64x64w4r168-dq64x64w4r168": dict(_W4, kv_maxnreg=168, dq_maxnreg=168, **_DQ4),
    "kv64x64w4r160-dq64x64w4": dict(_W4, kv_maxnreg=160, **_DQ4),
    "kv64x32w4r128-dq64x64w4": dict(_W4, kv_bm=32, kv_maxnreg=128, **_DQ4),  # 4 programs an SM
    "kv128x64w8r128-dq64x64w4": dict(kv_maxnreg=128, **_DQ4),  # 2 programs of 8 warps
    "kv64x64w4r168s2-dq64x64w4": dict(_W4, kv_maxnreg=168, kv_stages=2, **_DQ4),
}
QUICK = ["kv128x64w8-dq128x64w8", "kv64x64w4-dq64x64w4", "at-kv128x64w8", "at-kv64x64w4", "p-kv128x64w8-dq128x64w8"]
STATS: dict = {}  # kernel name -> "regs/spills/smem" of its latest launch (GPU only)
PASS_EVENTS: list | None = None  # set to a list: each launch appends (kernel name, start event, end event)


def depth_geometry(G: int, bm: int, L: int, depth_rows: int = 256):
    """(GP, P, S, BL) of a dQ program of bm rows: S positions a depth sub-tile (S*GP >= 16 rows or
    the block), BL entries a position a step (P*BL ~ depth_rows, <= 64 and next_pow2(L), S*BL >= 16)."""
    gp = 1 << max(0, G - 1).bit_length()
    P = max(1, bm // gp)  # (bm < GP is refused by the caller)
    S = min(P, max(1, 16 // gp))
    return gp, P, S, max(-(-16 // S), min(64, 1 << max(0, L - 1).bit_length(), max(1, depth_rows // P)))


def _launch(kernel, grid, *args, maxnreg=None, **meta):
    if maxnreg and not INTERP:
        meta["maxnreg"] = maxnreg
    if PASS_EVENTS is not None:
        ev = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        ev[0].record()
    ck = kernel[grid](*args, **meta)
    if PASS_EVENTS is not None:
        ev[1].record()
        PASS_EVENTS.append((kernel.__name__.strip("_").replace("_kernel", ""), *ev))
    if not INTERP:  # the compiled kernel's resources, for the timing rows
        STATS[kernel.__name__] = f"{getattr(ck, 'n_regs', '?')}r/{getattr(ck, 'n_spills', '?')}sp/" \
            f"{getattr(getattr(ck, 'metadata', None), 'shared', 0) // 1024}KB"


def moda_tma_bwd(q, k, v, o, lse, do, k_depth=None, v_depth=None, scale=None, **variant):
    """MoDA backward (module docstring): (dq, dk, dv, dkd, dvd); `variant` overrides DEFAULT_VARIANT."""
    if set(variant) - set(DEFAULT_VARIANT):
        raise ValueError(f"unknown variant options {sorted(set(variant) - set(DEFAULT_VARIANT))}")
    cfg = dict(DEFAULT_VARIANT, **variant)
    shape = check_inputs(q, k, v, k_depth, v_depth, need_cuda=True)
    (B, T, Hq, d), Hk, G, L = q.shape, shape.Hk, shape.G, shape.L
    for name, x, want in (("o", o, q.shape), ("do", do, q.shape), ("lse", lse, (B, T, Hq))):
        if not isinstance(x, torch.Tensor) or x.shape != want or (name == "lse" and x.dtype != torch.float32):
            raise ValueError(f"{name} must be a {'float32 ' if name == 'lse' else ''}tensor of shape {tuple(want)}, "
                             f"got {(tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else type(x).__name__}")
    gp, P, S, BL = depth_geometry(G, cfg["dq_bm"], L, cfg["depth_rows"])
    for name in ("kv_bn", "kv_bm", "dq_bm", "dq_bn"):
        x = cfg[name]
        if x < 16 or x > 256 or x & (x - 1) or (name.endswith("_bm") and x % gp):
            raise ValueError(f"{name}={x} must be a power of two in [16, 256]"
                             + (f" and a multiple of GP={gp} (G={G})" if name.endswith("_bm") else ""))
    q, k, v, o, do, lse = (x.contiguous() for x in (q, k, v, o, do, lse))
    kd, vd = (k_depth.contiguous(), v_depth.contiguous()) if L else (k, v)  # dummies at L = 0
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    RP = -(-(T * gp + 256) // 128) * 128  # row pitch of the folded buffers: covers every row step
    lse2, delta = (torch.empty((B * Hk, RP), device=q.device, dtype=torch.float32) for _ in range(2))
    _launch(_rows_kernel, (B * Hk, RP // 128), o, do, lse, lse2, delta, lse2, scale, T, G, Hk, RP, GP=gp, BLK=128,
            D=d, POST=False)
    use_desc, atomic = bool(cfg["use_desc"]), bool(cfg["atomic"])
    if use_desc and not INTERP:  # device-side descriptors need a scratch allocator
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dkd, dvd = (torch.empty_like(kd), torch.empty_like(vd)) if L else (None, None)
    prec = "upcast" if INTERP else ("ieee" if q.dtype == torch.float32 else "tf32")
    dqa = torch.empty((B * Hk * d, RP) if atomic else (1, 16), device=q.device, dtype=torch.float32)
    n_m = -(-T // P)
    if not atomic or L:  # the atomic variant's depth launch writes every row of dqa (no zeroing)
        _launch(_dq_kernel, (B * Hk, n_m), q, k, v, kd, vd, do, lse2, delta, dq, dqa, dkd if L else dk,
                dvd if L else dv, scale * LOG2E, scale, B, T, L, max(L, 1), G, Hk, RP, n_m, GP=gp, BM=cfg["dq_bm"],
                BN=cfg["dq_bn"], D=d, S=S, BL=BL, SEQ=not atomic, DEPTH=L > 0, ACC_OUT=atomic, USE_DESC=use_desc,
                PREC=prec, DEPTH_STAGES=cfg["depth_stages"], num_warps=cfg["dq_warps"], num_stages=cfg["dq_stages"],
                maxnreg=cfg["dq_maxnreg"])
    else:
        dqa.zero_()
    _launch(_kv_kernel, (B * Hk, -(-T // cfg["kv_bn"])), q, k, v, do, lse2, delta, dk, dv, dqa, scale * LOG2E,
            scale, B, T, G, Hk, RP, GP=gp, BM=cfg["kv_bm"], BN=cfg["kv_bn"], D=d, ATOMIC=atomic, USE_DESC=use_desc,
            TMA_REDUCE=atomic and use_desc and not INTERP, PREC=prec, num_warps=cfg["kv_warps"],
            num_stages=cfg["kv_stages"], maxnreg=cfg["kv_maxnreg"])
    if atomic:
        _launch(_rows_kernel, (B * Hk, RP // 128), dq, dq, lse, lse2, delta, dqa, scale, T, G, Hk, RP, GP=gp, BLK=128,
                D=d, POST=True)
    return dq, dk, dv, dkd, dvd


# ----------------------------------------------------------------------------- checks
GRAD_NAMES = ("dq", "dk", "dv", "dkd", "dvd")
FULL_GRID = ([(1000, G, L, 64, torch.bfloat16) for G in (1, 2, 8, 16) for L in (0, 1, 64)]
             + [(1000, 8, 64, 128, torch.bfloat16), (333, 3, 5, 64, torch.bfloat16),
                (333, 8, 64, 64, torch.float32), (333, 2, 0, 64, torch.float32)])
SHORT_GRID = [(1000, 8, 0, 64, torch.bfloat16), (1000, 8, 64, 64, torch.bfloat16), (333, 3, 5, 64, torch.bfloat16)]


def one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:240]}"


def rel_err(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30)) if torch.isfinite(a).all() else float("inf")


def random_inputs(B, T, Hq, Hk, d, L, dtype, device, seed=0):
    """q, k, v, kd, vd (None at L = 0), do: standard normal, generated on the device."""
    g = torch.Generator(device=torch.device(device)).manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g, device=device, dtype=torch.float32).to(dtype)  # noqa: E731
    q, k, v = rnd(B, T, Hq, d), rnd(B, T, Hk, d), rnd(B, T, Hk, d)
    kd, vd = (rnd(B, T, L, Hk, d), rnd(B, T, L, Hk, d)) if L else (None, None)
    return q, k, v, kd, vd, rnd(B, T, Hq, d)


def check_case(variant, B, T, G, Hk, d, L, dtype, device, seed=0, scale=None) -> dict:
    """{gradient: ||got - ref|| / ||ref||} of moda_tma_bwd(**variant) against fp64 autograd of
    moda_reference; o and lse (the kernel's inputs) are the reference forward's."""
    from moda_bench.kernels.moda.reference import moda_reference
    q, k, v, kd, vd, do = random_inputs(B, T, G * Hk, Hk, d, L, dtype, device, seed)
    ins = [x.detach().double().requires_grad_(True) for x in (q, k, v, kd, vd) if x is not None]
    out, lse = moda_reference(*ins[:3], *(ins[3:] or (None, None)), scale=scale, return_lse=True,
                              out_dtype=torch.float64)
    ref = torch.autograd.grad(out, ins, do.double())
    got = moda_tma_bwd(q, k, v, out.detach().to(dtype), lse, do, kd, vd, scale=scale, **variant)
    return {n: rel_err(a, r) for n, a, r in zip(GRAD_NAMES, got, ref)}


class Rows:
    """Result rows, appended to a CSV (when given) one by one, so a crash loses nothing."""
    FIELDS = ["section", "name", "T", "G", "Hk", "d", "L", "dtype", "status", "ms", "p20", "p80", "tflops", "x_fa4",
              "x_current", "max_err"] + [f"err_{n}" for n in GRAD_NAMES] + ["note"]

    def __init__(self, path=None):
        self.rows, self.path = [], path
        if path and not os.path.exists(path):
            with open(path, "w", newline="") as fh:
                csv.DictWriter(fh, fieldnames=self.FIELDS).writeheader()

    def add(self, **kw):
        self.rows.append({f: kw.get(f, "") for f in self.FIELDS})
        if self.path:
            with open(self.path, "a", newline="") as fh:
                csv.DictWriter(fh, fieldnames=self.FIELDS).writerow(
                    {k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in self.rows[-1].items()})


def correctness(rows: Rows, names, args, device) -> dict:
    """FULL_GRID on the first variant (all with --full-check), SHORT_GRID (the timed shape's odd twins,
    a padded G) on the others: {variant: timeable} (nothing wrong, no error at d = 64 bf16)."""
    ok = {}
    for vi, name in enumerate(names):
        ok[name] = True
        for (T, G, L, d, dtype) in (FULL_GRID if vi == 0 or args.full_check else SHORT_GRID):
            var, tol, dn, t0 = dict(VARIANTS[name]), 2e-2, str(dtype)[6:], time.time()
            if dtype == torch.float32:  # twice the bytes a tile: 2 stages; ieee products
                var, tol = dict(var, kv_stages=2, dq_stages=2), 1e-3
            head = f"  check {name:28s} T={T:4d} G={G:2d} L={L:2d} d={d:3d} {dn:8s}:"
            base = dict(section="check", name=name, T=T, G=G, Hk=2, d=d, L=L, dtype=dn)
            try:
                errs = check_case(var, 2, T, G, 2, d, L, dtype, device, seed=T + G + L + d)
                status = "ok" if max(errs.values()) < tol else "wrong"
                rows.add(status=status, max_err=max(errs.values()), note=f"{time.time() - t0:.1f}s incl. compile",
                         **base, **{f"err_{n}": e for n, e in errs.items()})
                print(f"{head} " + " ".join(f"{n} {e:.1e}" for n, e in errs.items())
                      + f"  {status} ({time.time() - t0:.1f}s)", flush=True)
            except Exception as exc:  # noqa: BLE001 - a variant's compile failure is a result
                status = "error"
                rows.add(status=status, note=one_line(exc), **base)
                print(f"{head} FAILED {one_line(exc)}", flush=True)
                if args.verbose:
                    traceback.print_exc()
            if status == "wrong" or (status == "error" and d == 64 and dtype == torch.bfloat16):
                ok[name] = False
    return ok


# ----------------------------------------------------------------------------- timing
def bwd_flops(B, T, Hq, d, L) -> float:
    return 2.5 * 4.0 * B * Hq * d * (T * (T + 1) / 2 + T * L)  # 2.5 x the forward's (the FA2/FA3 convention)


if __name__ == "__main__":
    raise SystemExit("run experiments/bwd_tma_timing.py (its main checks and times these variants)")
