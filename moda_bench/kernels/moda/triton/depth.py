"""MoDA's depth part alone as persistent streaming kernels (the overlap design, the
"persist" placement of `moda_fa4`, provider `moda-overlap`): a fixed number of programs walks
every item (a block of folded rows of one KV head), so that a launch of a few programs beside the
sequence kernel streams the depth bytes on a fixed share of the SMs for the whole pass.

Why: FA4's forward and backward are not persistent; launched after a capped depth kernel on a
highest-priority side stream, their programs take the SMs the depth programs leave, and the pass
costs about max(sequence time * SMs / (SMs - n), depth time on n programs) plus the merge instead
of their sum (docs/DESIGN.md, "The overlap route"). It pays only if one program streams
fast: the capped row-block depth-only launches of `kernel_fwd` and items of one position (bound
by the latency of each item's chain of small products, whatever the stages or warps) streamed a
fraction of what these block items do (the rates: docs/DESIGN.md, "The overlap route").

Layouts: q, o, do (B, T, Hq, d); k_depth, v_depth (B, T, L, Hk, d); lse (B, T, Hq) float32
(natural log); all contiguous and 16-byte aligned. An item is BLOCK_M folded rows r = t*GP + g of
KV head j (P = BLOCK_M/GP positions, rows g >= G padding), KV head fastest, so programs in flight
read neighbouring heads of the same positions.

* `depth_fwd`: the normalised partial (o_d, lse_d) of every row over its L depth keys, through
  the descriptor forward's depth phase (`kernel_fwd_tma.depth_phase`).
* Between items every warp meets at a CTA barrier (`tl.debug_barrier`): the next item's
  descriptor copies land in the shared buffers this item's tiles used. It was added when the
  tuner's full-tensor check at T=32768 (H100) saw results that varied; the cause turned out to be
  the in-place merge after this kernel (`fa4._merge`, now out of place; docs/DESIGN.md, "The
  merge route"). With the barrier these kernels were checked bitwise equal across program counts
  and within fp32 rounding of every row at long T; the barrier stays, as checked.
* `depth_bwd`: given the merged out and lse (the whole MoDA softmax), the depth keys' share of dq
  and, with depth_grad, dk_depth and dv_depth, through the folded backward's `depth_part`; each
  row's lse2 and delta = rowsum(o * do) are computed here.
* Both launch through `kernels.launch.CachedLaunch`, keyed by every integer argument and constexpr
  (moda-fa4 and moda-overlap launch them at every call, where short T makes the host the limit).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from moda_bench.kernels.launch import CachedLaunch, aligned16, cdiv, next_pow2
from moda_bench.kernels.moda.triton.bwd_tma_rules import bwd_depth_geometry
from moda_bench.kernels.moda.triton.bwd_tma_tiles import depth_part
from moda_bench.kernels.moda.triton.depth_smem import fit_bwd, fit_fwd, smem_limit
from moda_bench.kernels.moda.triton.descriptors import depth_descs, rows_ptr, rows_tile
from moda_bench.kernels.moda.triton.fwd_tma import depth_geometry as fwd_depth_geometry
from moda_bench.kernels.moda.triton.fwd_tma import depth_phase, depth_rows_desc, ensure_allocator, rows_desc
from moda_bench.kernels.moda.triton.utils import dot_precision

LOG2E = 1.4426950408889634
NEG = tl.constexpr(-1.0e30)


@triton.jit(do_not_specialize=["B", "T", "L", "n_items"])
def depth_fwd_kernel(Q, KD, VD, OD, LSED, qk_scale, B, T, L, G, Hk, Hq, n_items, GP: tl.constexpr,
                           BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, S: tl.constexpr, BL: tl.constexpr,
                           PREC: tl.constexpr, DEPTH_STAGES: tl.constexpr):
    """The forward over items of BLOCK_M folded rows (P = BLOCK_M/GP positions of one KV head, as
    the descriptor forward's depth phase, `kernel_fwd_tma.depth_phase`), KV head fastest."""
    P: tl.constexpr = BLOCK_M // GP
    qdesc = rows_desc(Q, B, T, Hq, P, GP, HEAD_DIM)
    kddesc = depth_rows_desc(KD, B, T, L, Hk, P, BL, HEAD_DIM)
    vddesc = depth_rows_desc(VD, B, T, L, Hk, P, BL, HEAD_DIM)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = tl.arange(0, BLOCK_M)
    for it in tl.range(tl.program_id(0), n_items, tl.num_programs(0)):
        bh = it % (B * Hk)
        b = bh // Hk
        j = bh % Hk
        t0 = (it // (B * Hk)) * P
        t = t0 + rows // GP
        row_ok = (t < T) & (rows % GP < G)
        q = tl.reshape(qdesc.load([b, t0, j * G, 0]), (BLOCK_M, HEAD_DIM))
        acc, m_i, l_i = depth_phase(q, tl.zeros([BLOCK_M, HEAD_DIM], tl.float32), tl.full([BLOCK_M], NEG, tl.float32),
                                    tl.zeros([BLOCK_M], tl.float32), KD, VD, kddesc, vddesc, b, j, t0, T, L, Hk,
                                    qk_scale, GP, BLOCK_M, HEAD_DIM, S, BL, True, PREC, DEPTH_STAGES)
        qrow = (b * T + t).to(tl.int64) * Hq + j * G + rows % GP
        tl.store(OD + qrow[:, None] * HEAD_DIM + offs_d[None, :], (acc / l_i[:, None]).to(OD.dtype.element_ty),
                 mask=row_ok[:, None])
        tl.store(LSED + qrow, (m_i + tl.math.log2(l_i)) / 1.4426950408889634, mask=row_ok)
        tl.debug_barrier()  # every warp is done with this item's shared tiles before the next item's copies land


@triton.jit(do_not_specialize=["B", "T", "L", "n_items"])
def depth_bwd_kernel(Q, DO, O, LSE, KD, VD, DQ, DKD, DVD, qk_scale, sm_scale, B, T, L, G, Hk, n_items,
                           GP: tl.constexpr, BLOCK_M: tl.constexpr, D: tl.constexpr, S: tl.constexpr, BL: tl.constexpr,
                           PREC: tl.constexpr, DEPTH_STAGES: tl.constexpr, DEPTH_GRAD: tl.constexpr):
    """The backward over items of BLOCK_M folded rows (`kernel_bwd_parts.depth_part`, the depth
    part of the folded backward's query-major pass), with each row's lse2 and delta computed here."""
    P: tl.constexpr = BLOCK_M // GP
    Hq = G * Hk
    qdesc = rows_desc(Q, B, T, Hq, P, GP, D)
    dodesc = rows_desc(DO, B, T, Hq, P, GP, D)
    kddesc, vddesc = depth_descs(KD, VD, B, T, L, Hk, P, BL, D)
    dkddesc, dvddesc = None, None
    if DEPTH_GRAD:
        dkddesc, dvddesc = depth_descs(DKD, DVD, B, T, L, Hk, P, BL, D)
    for it in tl.range(tl.program_id(0), n_items, tl.num_programs(0)):
        bh = it % (B * Hk)
        b = bh // Hk
        j = bh % Hk
        t0 = (it // (B * Hk)) * P
        q = rows_tile(Q, qdesc, b, j, 0, t0, T, G, Hq, GP, BLOCK_M, D, True)
        do = rows_tile(DO, dodesc, b, j, 0, t0, T, G, Hq, GP, BLOCK_M, D, True)
        r = t0 * GP + tl.arange(0, BLOCK_M)
        t = r // GP
        optr, ok = rows_ptr(b, j, 0, r, T, G, Hq, GP, D)
        row_ok = (t < T) & (r % GP < G)
        lse = tl.load(LSE + ((b * T + t).to(tl.int64) * Hq + j * G + r % GP), mask=row_ok, other=0.0)
        lse2 = tl.where(row_ok, lse * 1.4426950408889634, float("inf"))
        o = tl.load(O + optr, mask=ok, other=0.0).to(tl.float32)
        delta = tl.sum(o * tl.where(ok, do.to(tl.float32), 0.0), 1)
        dq = depth_part(q, do, lse2, delta, tl.zeros([BLOCK_M, D], tl.float32), KD, VD, DKD, DVD, kddesc, vddesc,
                        dkddesc, dvddesc, b, j, t0, T, L, Hk, qk_scale, sm_scale, GP, BLOCK_M, D, S, BL, True, PREC,
                        DEPTH_STAGES, DEPTH_GRAD)
        tl.store(DQ + optr, (dq * sm_scale).to(DQ.dtype.element_ty), mask=ok)
        tl.debug_barrier()  # as in the forward


# ----------------------------------------------------------------------------- host side

def utilization(G: int, L: int, block_m: int) -> float:
    """Useful / computed depth logits of the forward's items (`kernel_fwd_tma.depth_phase`: a
    sub-tile of S positions scores S*BL columns a step for each of its rows, BL of them its own)."""
    gp, _, S, bl = fwd_depth_geometry(G, max(block_m, next_pow2(G)))
    return (G * L) / (gp * S * bl * cdiv(L, bl))


def _programs(n_items: int, programs: int) -> int:
    return max(1, min(n_items, programs))


def depth_fwd(q, kd, vd, scale: float, G: int, programs: int, *, block_m: int = 128, stages: int = 3,
              num_warps: int = 4, block_l: int = 0):
    """The depth partial (o_d (B,T,Hq,d) in q's dtype, lse_d (B,T,Hq) float32) on `programs`
    persistent programs, items of block_m folded rows (widened to GP), `stages` depth steps in
    flight, block_l depth columns a sub-tile per step (0: `depth_geometry`'s, about 256 depth rows
    a step; smaller gives an item more steps), all three shrunk where the item would not fit the
    device's shared memory (`depth_smem.fit_fwd`). Inputs contiguous and 16-byte aligned (the caller
    checks)."""
    B, T, Hq, d = q.shape
    L, Hk = kd.shape[2], kd.shape[3]
    od = torch.empty_like(q)
    lsed = torch.empty((B, T, Hq), device=q.device, dtype=torch.float32)
    block_m, stages, block_l = fit_fwd(G, d, q.element_size(), smem_limit(q.device), block_m, stages, block_l)
    gp, P, S, bl = fwd_depth_geometry(G, max(block_m, next_pow2(G)), 0, block_l)
    n_items = cdiv(T, P) * B * Hk
    ensure_allocator()
    # every integer argument and constexpr in the key; the caller's tensors' alignment checked
    key = (q.dtype, kd.dtype, B, T, L, G, Hk, Hq, n_items, gp, P, d, S, bl, stages, num_warps) \
        if aligned16(q, kd, vd) else None
    _FWD(key, (_programs(n_items, programs),), (q, kd, vd, od, lsed, scale * LOG2E, B, T, L, G, Hk, Hq, n_items),
         lambda: dict(GP=gp, BLOCK_M=P * gp, HEAD_DIM=d, S=S, BL=bl, PREC=dot_precision(q.dtype),
                      DEPTH_STAGES=stages, num_warps=num_warps))
    return od, lsed


def depth_bwd(do, q, o, lse, kd, vd, scale: float, G: int, programs: int, *, depth_grad: bool = True,
              block_m: int = 64, stages: int = 3, num_warps: int = 4, block_l: int = 0):
    """(dq share (q's dtype), dk_depth, dv_depth) given the merged o and lse (B,T,Hq); dk_depth =
    dv_depth = None without depth_grad (never allocated). Items as in `depth_fwd` (block_l 0:
    `bwd_depth_geometry`'s; shrunk to fit by `depth_smem.fit_bwd`)."""
    B, T, Hq, d = q.shape
    L, Hk = kd.shape[2], kd.shape[3]
    dq = torch.empty_like(q)
    dkd = torch.empty_like(kd) if depth_grad else None
    dvd = torch.empty_like(vd) if depth_grad else None
    block_m, stages, block_l = fit_bwd(G, d, L, q.element_size(), smem_limit(q.device), block_m, stages,
                                       bool(depth_grad), block_l)
    gp, P, S, bl = bwd_depth_geometry(G, max(block_m, next_pow2(G)), L, block_l)
    n_items = cdiv(T, P) * B * Hk
    ensure_allocator()
    key = (q.dtype, do.dtype, o.dtype, lse.dtype, kd.dtype, B, T, L, G, Hk, n_items, gp, P, d, S, bl, stages,
           bool(depth_grad), num_warps) if aligned16(q, do, o, lse, kd, vd) else None
    _BWD(key, (_programs(n_items, programs),),
         (q, do, o, lse, kd, vd, dq, kd if dkd is None else dkd, vd if dvd is None else dvd, scale * LOG2E, scale,
          B, T, L, G, Hk, n_items),
         lambda: dict(GP=gp, BLOCK_M=P * gp, D=d, S=S, BL=bl, PREC=dot_precision(q.dtype), DEPTH_STAGES=stages,
                      DEPTH_GRAD=bool(depth_grad), num_warps=num_warps))
    return dq, dkd, dvd


_FWD, _BWD = CachedLaunch(depth_fwd_kernel), CachedLaunch(depth_bwd_kernel)


def compiled_smem(kind: str, G: int, block_m: int, d: int, stages: int, block_l: int = 0, L: int = 1,
                  depth_grad: bool = True, num_warps: int = 0, arch: int = 90) -> int:
    """Shared memory in bytes that Triton allocates for `depth_fwd_kernel` (kind "fwd", 8 warps by
    default, as moda-overlap's items) or `depth_bwd_kernel` ("bwd", 4 warps) with 16-bit inputs,
    compiled for sm_`arch` on this machine (no GPU; raises where this Triton or ptxas cannot, and
    under TRITON_INTERPRET=1, whose kernels are not compiled)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler import compile as triton_compile

    if kind == "fwd":
        gp, P, S, bl = fwd_depth_geometry(G, max(block_m, next_pow2(G)), 0, block_l)
        sig = {**dict.fromkeys(("Q", "KD", "VD", "OD"), "*bf16"), "LSED": "*fp32", "qk_scale": "fp32",
               **dict.fromkeys(("B", "T", "L", "G", "Hk", "Hq", "n_items"), "i32")}
        cons = dict(GP=gp, BLOCK_M=P * gp, HEAD_DIM=d, S=S, BL=bl, PREC="tf32", DEPTH_STAGES=stages)
        kern, warps = depth_fwd_kernel, num_warps or 8
    else:
        gp, P, S, bl = bwd_depth_geometry(G, max(block_m, next_pow2(G)), L, block_l)
        sig = {**dict.fromkeys(("Q", "DO", "O"), "*bf16"), "LSE": "*fp32",
               **dict.fromkeys(("KD", "VD", "DQ", "DKD", "DVD"), "*bf16"), "qk_scale": "fp32", "sm_scale": "fp32",
               **dict.fromkeys(("B", "T", "L", "G", "Hk", "n_items"), "i32")}
        cons = dict(GP=gp, BLOCK_M=P * gp, D=d, S=S, BL=bl, PREC="tf32", DEPTH_STAGES=stages,
                    DEPTH_GRAD=bool(depth_grad))
        kern, warps = depth_bwd_kernel, num_warps or 4
    sig.update(dict.fromkeys(cons, "constexpr"))
    return triton_compile(ASTSource(kern, sig, cons), target=GPUTarget("cuda", arch, 32),
                   options=dict(num_warps=warps)).metadata.shared
