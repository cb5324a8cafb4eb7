"""MoDA's depth part alone as persistent streaming kernels (issue 20's overlap design, the
"persist" placement of `moda_fa4`): a fixed number of programs walks every (position, KV head)
item, loading its depth tiles through tensor descriptors in a software pipeline several items
deep, so that a launch of a few programs beside the sequence kernel streams the depth bytes on a
fixed share of the SMs for the whole pass.

Why: FA4's forward is not persistent; launched after a capped depth kernel on a high-priority
side stream, its programs take the SMs the depth programs leave. The pass then costs about
max(sequence time * SMs / (SMs - n), depth time on n programs) plus the merge, instead of their
sum (docs/FUSED_PROTOTYPES.md, "The overlap route"). It pays only if one program streams fast:
the row-block depth kernels of `kernel_fwd` manage ~13 GB/s a program (H100, 4 warps).

Layouts: q, o, do (B, T, Hq, d); k_depth, v_depth (B, T, L, Hk, d); lse (B, T, Hq) float32
(natural log); all contiguous. An item is (position p = b*T + t, KV head j): its RB rows are the
G query heads j*G .. j*G+G-1 of position p (RB = max(16, next_pow2(G)); rows past G are the next
heads' and are zeroed), its keys the L depth entries of (p, j), BL a step (the last step masked).

* `depth_fwd`: the normalised partial (o_d, lse_d) of every row over its L depth keys.
* `depth_bwd`: given the merged out and lse (the whole MoDA softmax), the depth keys' share of dq
  and, with depth_grad, dk_depth and dv_depth; delta = rowsum(o * do) is computed per item. Both
  orientations of the scores are computed (s and s^T) instead of transposing a computed tile.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from moda_bench.ops.launch import cdiv, next_pow2
from moda_bench.ops.moda.kernel_bwd_tma import bwd_depth_geometry, depth_desc, depth_part, rows_desc, rows_ptr, rows_tile
from moda_bench.ops.moda.kernel_fwd_tma import depth_geometry as fwd_depth_geometry
from moda_bench.ops.moda.kernel_fwd_tma import depth_phase, ensure_allocator
from moda_bench.ops.moda.triton_utils import dot_precision, mm

LOG2E = 1.4426950408889634
NEG = tl.constexpr(-1.0e30)
MAX_BL = 128  # depth entries a step (a descriptor box is at most 256 rows; 128 keeps 3 stages in smem)


@triton.jit
def _rows(desc, p, j, G, Hq, RB: tl.constexpr):
    """The item's RB rows of a (B*T*Hq, d) tensor through its descriptor, rows past G zeroed."""
    x = desc.load([p * Hq + j * G, 0])
    ok = tl.arange(0, RB) < G
    return tl.where(ok[:, None], x, 0.0).to(x.dtype), ok


@triton.jit(do_not_specialize=["n_items", "L"])
def depth_fwd_kernel(Q, KD, VD, OD, LSED, qk_scale, n_pos, n_items, L, Hk, G, Hq,
                     RB: tl.constexpr, BL: tl.constexpr, NCHUNK: tl.constexpr, HEAD_DIM: tl.constexpr,
                     STAGES: tl.constexpr, PREC: tl.constexpr):
    """Grid: any number of programs; each walks items pid, pid + programs, ... (KV head fastest)."""
    qdesc = tl.make_tensor_descriptor(Q, shape=[n_pos * Hq, HEAD_DIM], strides=[HEAD_DIM, 1],
                                      block_shape=[RB, HEAD_DIM])
    kdesc = tl.make_tensor_descriptor(KD, shape=[n_pos * L, Hk * HEAD_DIM], strides=[Hk * HEAD_DIM, 1],
                                      block_shape=[BL, HEAD_DIM])
    vdesc = tl.make_tensor_descriptor(VD, shape=[n_pos * L, Hk * HEAD_DIM], strides=[Hk * HEAD_DIM, 1],
                                      block_shape=[BL, HEAD_DIM])
    offs_d = tl.arange(0, HEAD_DIM)
    r = tl.arange(0, RB)
    for it in tl.range(tl.program_id(0), n_items, tl.num_programs(0), num_stages=STAGES):
        p = it // Hk
        j = it % Hk
        q, row_ok = _rows(qdesc, p, j, G, Hq, RB)
        m_i = tl.full([RB], NEG, tl.float32)
        l_i = tl.zeros([RB], tl.float32)
        acc = tl.zeros([RB, HEAD_DIM], tl.float32)
        for c in tl.static_range(NCHUNK):
            kd = kdesc.load([p * L + c * BL, j * HEAD_DIM])
            vd = vdesc.load([p * L + c * BL, j * HEAD_DIM])
            col_ok = c * BL + tl.arange(0, BL) < L
            s = tl.where(col_ok[None, :], mm(q, tl.trans(kd), PREC) * qk_scale, NEG)
            m_new = tl.maximum(m_i, tl.max(s, 1))
            pr = tl.math.exp2(s - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(pr, 1)
            acc = acc * alpha[:, None] + mm(pr.to(vd.dtype), vd, PREC)
            m_i = m_new
        row = p.to(tl.int64) * Hq + j * G + r
        tl.store(OD + row[:, None] * HEAD_DIM + offs_d[None, :], (acc / l_i[:, None]).to(OD.dtype.element_ty),
                 mask=row_ok[:, None])
        tl.store(LSED + row, (m_i + tl.math.log2(l_i)) / 1.4426950408889634, mask=row_ok)


@triton.jit(do_not_specialize=["n_items", "L"])
def depth_bwd_kernel(Q, DO, O, LSE, KD, VD, DQ, DKD, DVD, qk_scale, sm_scale, n_pos, n_items, L, Hk, G, Hq,
                     RB: tl.constexpr, BL: tl.constexpr, NCHUNK: tl.constexpr, HEAD_DIM: tl.constexpr,
                     STAGES: tl.constexpr, PREC: tl.constexpr, DEPTH_GRAD: tl.constexpr):
    """Grid as `depth_fwd_kernel`. LSE is the merged lse (B*T*Hq rows, natural log); DQ gets the
    depth keys' dq share (q's dtype); DKD, DVD share k_depth's layout (unused without DEPTH_GRAD)."""
    qdesc = tl.make_tensor_descriptor(Q, shape=[n_pos * Hq, HEAD_DIM], strides=[HEAD_DIM, 1],
                                      block_shape=[RB, HEAD_DIM])
    dodesc = tl.make_tensor_descriptor(DO, shape=[n_pos * Hq, HEAD_DIM], strides=[HEAD_DIM, 1],
                                       block_shape=[RB, HEAD_DIM])
    odesc = tl.make_tensor_descriptor(O, shape=[n_pos * Hq, HEAD_DIM], strides=[HEAD_DIM, 1],
                                      block_shape=[RB, HEAD_DIM])
    kdesc = tl.make_tensor_descriptor(KD, shape=[n_pos * L, Hk * HEAD_DIM], strides=[Hk * HEAD_DIM, 1],
                                      block_shape=[BL, HEAD_DIM])
    vdesc = tl.make_tensor_descriptor(VD, shape=[n_pos * L, Hk * HEAD_DIM], strides=[Hk * HEAD_DIM, 1],
                                      block_shape=[BL, HEAD_DIM])
    offs_d = tl.arange(0, HEAD_DIM)
    r = tl.arange(0, RB)
    for it in tl.range(tl.program_id(0), n_items, tl.num_programs(0), num_stages=STAGES):
        p = it // Hk
        j = it % Hk
        q, row_ok = _rows(qdesc, p, j, G, Hq, RB)
        do, _ = _rows(dodesc, p, j, G, Hq, RB)
        o, _ = _rows(odesc, p, j, G, Hq, RB)
        row = p.to(tl.int64) * Hq + j * G + r
        lse2 = tl.load(LSE + row, mask=row_ok, other=0.0) * 1.4426950408889634
        delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
        dq = tl.zeros([RB, HEAD_DIM], tl.float32)
        for c in tl.static_range(NCHUNK):
            kd = kdesc.load([p * L + c * BL, j * HEAD_DIM])
            vd = vdesc.load([p * L + c * BL, j * HEAD_DIM])
            col = c * BL + tl.arange(0, BL)
            ok = row_ok[:, None] & (col < L)[None, :]
            pr = tl.where(ok, tl.math.exp2(mm(q, tl.trans(kd), PREC) * qk_scale - lse2[:, None]), 0.0)
            ds = pr * (mm(do, tl.trans(vd), PREC) - delta[:, None])
            dq += mm(ds.to(kd.dtype), kd, PREC)
            if DEPTH_GRAD:  # the transposed scores: [BL, RB], no transpose of a computed tile
                okT = (col < L)[:, None] & row_ok[None, :]
                pT = tl.where(okT, tl.math.exp2(mm(kd, tl.trans(q), PREC) * qk_scale - lse2[None, :]), 0.0)
                dsT = pT * (mm(vd, tl.trans(do), PREC) - delta[None, :])
                dvd = mm(pT.to(do.dtype), do, PREC)
                dkd = mm(dsT.to(q.dtype), q, PREC) * sm_scale
                dptr = (p.to(tl.int64) * L + col)[:, None] * (Hk * HEAD_DIM) + j * HEAD_DIM + offs_d[None, :]
                tl.store(DKD + dptr, dkd.to(DKD.dtype.element_ty), mask=(col < L)[:, None])
                tl.store(DVD + dptr, dvd.to(DVD.dtype.element_ty), mask=(col < L)[:, None])
        tl.store(DQ + row[:, None] * HEAD_DIM + offs_d[None, :], (dq * sm_scale).to(DQ.dtype.element_ty),
                 mask=row_ok[:, None])


@triton.jit(do_not_specialize=["B", "T", "L", "n_items"])
def depth_fwd_block_kernel(Q, KD, VD, OD, LSED, qk_scale, B, T, L, G, Hk, Hq, n_items, GP: tl.constexpr,
                           BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, S: tl.constexpr, BL: tl.constexpr,
                           PREC: tl.constexpr, DEPTH_STAGES: tl.constexpr):
    """The forward over items of BLOCK_M folded rows (P = BLOCK_M/GP positions of one KV head, as
    the descriptor forward's depth phase, `kernel_fwd_tma.depth_phase`), KV head fastest."""
    P: tl.constexpr = BLOCK_M // GP
    qdesc = tl.make_tensor_descriptor(Q, shape=[B, T, Hq, HEAD_DIM],
                                      strides=[T.to(tl.int64) * Hq * HEAD_DIM, Hq * HEAD_DIM, HEAD_DIM, 1],
                                      block_shape=[1, P, GP, HEAD_DIM])
    kddesc = tl.make_tensor_descriptor(KD, shape=[B * T, L, Hk * HEAD_DIM], strides=[L * Hk * HEAD_DIM, Hk * HEAD_DIM, 1],
                                       block_shape=[P, BL, HEAD_DIM])
    vddesc = tl.make_tensor_descriptor(VD, shape=[B * T, L, Hk * HEAD_DIM], strides=[L * Hk * HEAD_DIM, Hk * HEAD_DIM, 1],
                                       block_shape=[P, BL, HEAD_DIM])
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


@triton.jit(do_not_specialize=["B", "T", "L", "n_items"])
def depth_bwd_block_kernel(Q, DO, O, LSE, KD, VD, DQ, DKD, DVD, qk_scale, sm_scale, B, T, L, G, Hk, n_items,
                           GP: tl.constexpr, BLOCK_M: tl.constexpr, D: tl.constexpr, S: tl.constexpr, BL: tl.constexpr,
                           PREC: tl.constexpr, DEPTH_STAGES: tl.constexpr, DEPTH_GRAD: tl.constexpr):
    """The backward over items of BLOCK_M folded rows (`kernel_bwd_tma.depth_part`, the depth
    part of the folded backward's query-major pass), with each row's lse2 and delta computed here."""
    P: tl.constexpr = BLOCK_M // GP
    Hq = G * Hk
    qdesc = rows_desc(Q, B, T, Hq, P, GP, D)
    dodesc = rows_desc(DO, B, T, Hq, P, GP, D)
    kddesc = depth_desc(KD, B, T, L, Hk, P, BL, D)
    vddesc = depth_desc(VD, B, T, L, Hk, P, BL, D)
    dkddesc = None
    dvddesc = None
    if DEPTH_GRAD:
        dkddesc = depth_desc(DKD, B, T, L, Hk, P, BL, D)
        dvddesc = depth_desc(DVD, B, T, L, Hk, P, BL, D)
    for it in tl.range(tl.program_id(0), n_items, tl.num_programs(0)):
        bh = it % (B * Hk)
        b = bh // Hk
        j = bh % Hk
        t0 = (it // (B * Hk)) * P
        q = rows_tile(Q, qdesc, b, j, t0, T, G, Hq, GP, BLOCK_M, D, True)
        do = rows_tile(DO, dodesc, b, j, t0, T, G, Hq, GP, BLOCK_M, D, True)
        r = t0 * GP + tl.arange(0, BLOCK_M)
        t = r // GP
        optr, ok = rows_ptr(b, j, r, T, G, Hq, GP, D)
        row_ok = (t < T) & (r % GP < G)
        lse = tl.load(LSE + ((b * T + t).to(tl.int64) * Hq + j * G + r % GP), mask=row_ok, other=0.0)
        lse2 = tl.where(row_ok, lse * 1.4426950408889634, float("inf"))
        o = tl.load(O + optr, mask=ok, other=0.0).to(tl.float32)
        delta = tl.sum(o * tl.where(ok, do.to(tl.float32), 0.0), 1)
        dq = depth_part(q, do, lse2, delta, tl.zeros([BLOCK_M, D], tl.float32), KD, VD, DKD, DVD, kddesc, vddesc,
                        dkddesc, dvddesc, b, j, t0, T, L, Hk, qk_scale, sm_scale, GP, BLOCK_M, D, S, BL, True, PREC,
                        DEPTH_STAGES, DEPTH_GRAD)
        tl.store(DQ + optr, (dq * sm_scale).to(DQ.dtype.element_ty), mask=ok)


# ----------------------------------------------------------------------------- host side

def depth_geometry(G: int, L: int):
    """(RB, BL, NCHUNK): rows of an item, depth entries a step, steps an item."""
    rb = max(16, next_pow2(G))
    bl = min(MAX_BL, max(16, next_pow2(L)))
    return rb, bl, cdiv(L, bl)


def utilization(G: int, L: int, block_m: int) -> float:
    """Useful / computed depth logits of the forward's block items (`kernel_fwd_tma.depth_phase`:
    a sub-tile of S positions scores S*BL columns a step for each of its rows, BL of them its own)."""
    gp, _, S, bl = fwd_depth_geometry(G, max(block_m, next_pow2(G)))
    return (G * L) / (gp * S * bl * cdiv(L, bl))


def default_stages(L: int, forward: bool) -> int:
    """Items in flight per program: ~4 at L <= 64, fewer for longer depth tiles (shared memory)."""
    _, bl, n = depth_geometry(1, L)
    per_item = bl * n  # depth rows an item loads
    if forward:
        return 4 if per_item <= 64 else 3 if per_item <= 128 else 2
    return 3 if per_item <= 64 else 2


def _programs(n_items: int, programs: int) -> int:
    return max(1, min(n_items, programs))


def depth_fwd(q, kd, vd, scale: float, G: int, programs: int, *, block_m: int = 0, stages: int = 0,
              num_warps: int = 4):
    """The depth partial (o_d (B,T,Hq,d) in q's dtype, lse_d (B,T,Hq) float32) on `programs`
    persistent programs; items of one position (block_m 0) or of block_m folded rows. Inputs
    contiguous and 16-byte aligned (the caller checks)."""
    B, T, Hq, d = q.shape
    L, Hk = kd.shape[2], kd.shape[3]
    od = torch.empty_like(q)
    lsed = torch.empty((B, T, Hq), device=q.device, dtype=torch.float32)
    ensure_allocator()
    if block_m:
        gp, P, S, bl = fwd_depth_geometry(G, max(block_m, next_pow2(G)))
        n_items = cdiv(T, P) * B * Hk
        depth_fwd_block_kernel[(_programs(n_items, programs),)](
            q, kd, vd, od, lsed, scale * LOG2E, B, T, L, G, Hk, Hq, n_items, GP=gp, BLOCK_M=P * gp, HEAD_DIM=d, S=S,
            BL=bl, PREC=dot_precision(q.dtype), DEPTH_STAGES=stages or 2, num_warps=num_warps)
        return od, lsed
    rb, bl, nchunk = depth_geometry(G, L)
    n_items = B * T * Hk
    depth_fwd_kernel[(_programs(n_items, programs),)](
        q, kd, vd, od, lsed, scale * LOG2E, B * T, n_items, L, Hk, G, Hq, RB=rb, BL=bl, NCHUNK=nchunk, HEAD_DIM=d,
        STAGES=stages or default_stages(L, True), PREC=dot_precision(q.dtype), num_warps=num_warps)
    return od, lsed


def depth_bwd(do, q, o, lse, kd, vd, scale: float, G: int, programs: int, *, depth_grad: bool = True,
              block_m: int = 0, stages: int = 0, num_warps: int = 4):
    """(dq share (q's dtype), dk_depth, dv_depth) given the merged o and lse (B,T,Hq); dk_depth =
    dv_depth = None without depth_grad (never allocated). Items as in `depth_fwd`."""
    B, T, Hq, d = q.shape
    L, Hk = kd.shape[2], kd.shape[3]
    dq = torch.empty_like(q)
    dkd = torch.empty_like(kd) if depth_grad else None
    dvd = torch.empty_like(vd) if depth_grad else None
    ensure_allocator()
    if block_m:
        gp, P, S, bl = bwd_depth_geometry(G, max(block_m, next_pow2(G)), L)
        n_items = cdiv(T, P) * B * Hk
        depth_bwd_block_kernel[(_programs(n_items, programs),)](
            q, do, o, lse, kd, vd, dq, kd if dkd is None else dkd, vd if dvd is None else dvd, scale * LOG2E, scale,
            B, T, L, G, Hk, n_items, GP=gp, BLOCK_M=P * gp, D=d, S=S, BL=bl, PREC=dot_precision(q.dtype),
            DEPTH_STAGES=stages or 2, DEPTH_GRAD=bool(depth_grad), num_warps=num_warps)
        return dq, dkd, dvd
    rb, bl, nchunk = depth_geometry(G, L)
    n_items = B * T * Hk
    depth_bwd_kernel[(_programs(n_items, programs),)](
        q, do, o, lse, kd, vd, dq, kd if dkd is None else dkd, vd if dvd is None else dvd, scale * LOG2E, scale,
        B * T, n_items, L, Hk, G, Hq, RB=rb, BL=bl, NCHUNK=nchunk, HEAD_DIM=d,
        STAGES=stages or default_stages(L, False), PREC=dot_precision(q.dtype), DEPTH_GRAD=bool(depth_grad),
        num_warps=num_warps)
    return dq, dkd, dvd
