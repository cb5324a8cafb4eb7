"""depth-sep's depth part in Triton: each query's own softmax over the L depth entries of its
position (`depth_softmax`), with its autograd Function, and the operator `depth_sep_attention`
(sequence attention + that depth part, the seeds' variant (c); `reference.py` defines it).

Layouts (as MoDA's): q, o, do (B, T, Hq, d); k_depth, v_depth (B, T, L, Hk, d); lse (B, T, Hq)
float32 (natural log). Every tensor is made contiguous by the launch.

Design: one program per (b, t, KV head j) item: its G query rows (padded to GP >= 16 rows, so
the products are `tl.dot`s) against the L depth keys and values of position t (padded to LP >= 16
columns, masked to -inf). The depth softmax of a row never sees another position, so items are
independent: the backward writes dk_depth and dv_depth of its own position with no atomics, and
dq of its own rows. The forward saves lse (4 bytes per row) so the backward recomputes p from the
keys it reads anyway. The work is a stream over the depth K/V (read once per pass); this kernel
does not try to share a tile between positions (the paper's chunk-aware layout is MoDA's, whose
single softmax needs it; here each position's read is whole and contiguous, L x d per head).
Under TRITON_INTERPRET=1 the same kernels run on the CPU (the tests).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from moda_bench.kernels.launch import next_pow2
from moda_bench.kernels.moda.triton.utils import dot_precision, mm
from moda_bench.kernels.moda.validate import check_inputs

NEG = tl.constexpr(-1.0e30)  # finite "minus infinity"; a jit function reads only constexpr globals
MAX_TILE = 256 * 128   # padded L x d of one position's keys (and values) held at once: L = 256 at d = 128


@triton.jit
def _load_item(Q, KD, VD, item, T, L, Hk, Hq, G, GP: tl.constexpr, LP: tl.constexpr, D: tl.constexpr):
    """This item's (b, t, j) query rows, depth keys and values, their masks and row offsets."""
    bt = item // Hk
    j = item % Hk
    g = tl.arange(0, GP)
    ell = tl.arange(0, LP)
    e = tl.arange(0, D)
    row_ok = g < G
    col_ok = ell < L
    qrow = (bt * Hq + j * G + g).to(tl.int64)
    drow = ((bt * L + ell) * Hk + j).to(tl.int64)
    q = tl.load(Q + qrow[:, None] * D + e[None, :], mask=row_ok[:, None], other=0.0)
    kd = tl.load(KD + drow[:, None] * D + e[None, :], mask=col_ok[:, None], other=0.0)
    vd = tl.load(VD + drow[:, None] * D + e[None, :], mask=col_ok[:, None], other=0.0)
    return q, kd, vd, row_ok, col_ok, qrow, drow


@triton.jit
def depth_softmax_fwd(Q, KD, VD, O, LSE, scale, T, L, Hk, Hq, G, GP: tl.constexpr, LP: tl.constexpr,
                      D: tl.constexpr, PREC: tl.constexpr):
    """o = softmax(scale q kd^T) vd per query row over its position's L entries; lse saved."""
    item = tl.program_id(0)
    q, kd, vd, row_ok, col_ok, qrow, drow = _load_item(Q, KD, VD, item, T, L, Hk, Hq, G, GP, LP, D)
    s = mm(q, tl.trans(kd), PREC) * scale
    s = tl.where(col_ok[None, :], s, NEG)
    m = tl.max(s, axis=1)
    p = tl.exp(s - m[:, None])
    den = tl.sum(p, axis=1)
    o = mm(p.to(vd.dtype), vd, PREC) / den[:, None]
    e = tl.arange(0, D)
    tl.store(O + qrow[:, None] * D + e[None, :], o.to(O.dtype.element_ty), mask=row_ok[:, None])
    tl.store(LSE + qrow, m + tl.log(den), mask=row_ok)


@triton.jit
def depth_softmax_bwd(Q, KD, VD, O, DO, LSE, DQ, DKD, DVD, scale, T, L, Hk, Hq, G, GP: tl.constexpr,
                      LP: tl.constexpr, D: tl.constexpr, PREC: tl.constexpr):
    """dq, dk_depth, dv_depth of one item: p from lse, delta = rowsum(do * o) over the depth output."""
    item = tl.program_id(0)
    q, kd, vd, row_ok, col_ok, qrow, drow = _load_item(Q, KD, VD, item, T, L, Hk, Hq, G, GP, LP, D)
    e = tl.arange(0, D)
    do = tl.load(DO + qrow[:, None] * D + e[None, :], mask=row_ok[:, None], other=0.0)
    o = tl.load(O + qrow[:, None] * D + e[None, :], mask=row_ok[:, None], other=0.0).to(tl.float32)
    lse = tl.load(LSE + qrow, mask=row_ok, other=0.0)
    s = mm(q, tl.trans(kd), PREC) * scale
    p = tl.exp(s - lse[:, None])
    p = tl.where(row_ok[:, None] & col_ok[None, :], p, 0.0)
    dp = mm(do, tl.trans(vd), PREC)
    delta = tl.sum(do.to(tl.float32) * o, axis=1)
    ds = p * (dp - delta[:, None])
    dq = mm(ds.to(kd.dtype), kd, PREC) * scale
    dkd = mm(tl.trans(ds).to(q.dtype), q, PREC) * scale
    dvd = mm(tl.trans(p).to(do.dtype), do, PREC)
    tl.store(DQ + qrow[:, None] * D + e[None, :], dq.to(DQ.dtype.element_ty), mask=row_ok[:, None])
    tl.store(DKD + drow[:, None] * D + e[None, :], dkd.to(DKD.dtype.element_ty), mask=col_ok[:, None])
    tl.store(DVD + drow[:, None] * D + e[None, :], dvd.to(DVD.dtype.element_ty), mask=col_ok[:, None])


def _meta(q, k_depth) -> dict:
    B, T, Hq, d = q.shape
    L, Hk = k_depth.shape[2], k_depth.shape[3]
    LP = max(16, next_pow2(L))
    # a deep tile (L x d keys and values in registers) spreads over 8 warps instead of 4
    return dict(T=T, L=L, Hk=Hk, Hq=Hq, G=Hq // Hk, GP=max(16, next_pow2(Hq // Hk)), LP=LP, D=d,
                PREC=dot_precision(q.dtype), num_warps=8 if LP * d >= 128 * 64 else 4)


class DepthSoftmaxFunction(torch.autograd.Function):
    """Autograd of the depth part: forward saves (q, k_depth, v_depth, o, lse)."""

    @staticmethod
    def forward(ctx, q, k_depth, v_depth, scale: float):
        q, kd, vd = (x.contiguous() for x in (q, k_depth, v_depth))
        meta = _meta(q, kd)
        B, T, Hq, d = q.shape
        o = torch.empty_like(q)
        lse = torch.empty(B, T, Hq, dtype=torch.float32, device=q.device)
        depth_softmax_fwd[(B * T * meta["Hk"],)](q, kd, vd, o, lse, scale, **meta)
        ctx.save_for_backward(q, kd, vd, o, lse)
        ctx.scale = scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, kd, vd, o, lse = ctx.saved_tensors
        meta = _meta(q, kd)
        dq, dkd, dvd = torch.empty_like(q), torch.empty_like(kd), torch.empty_like(vd)
        B, T = q.shape[:2]
        depth_softmax_bwd[(B * T * meta["Hk"],)](q, kd, vd, o, do.contiguous(), lse, dq, dkd, dvd, ctx.scale, **meta)
        return dq, dkd, dvd, None


def depth_softmax(q, k_depth, v_depth, *, scale: float | None = None):
    """The depth part of depth-sep: (B, T, Hq, d) in q's dtype, with autograd to all three inputs.
    Inputs are checked as MoDA's (`check_inputs`, CUDA or TRITON_INTERPRET=1); L must be >= 1."""
    if not (torch.is_tensor(k_depth) and k_depth.dim() == 5 and k_depth.shape[2] >= 1):
        got = tuple(k_depth.shape) if torch.is_tensor(k_depth) else type(k_depth).__name__
        raise ValueError(f"k_depth must be a (B, T, L, Hk, d) tensor with L >= 1, got {got}")
    own = k_depth[:, :, 0]          # stands in for k and v: the check then covers q and the depth pair
    s = check_inputs(q, own, own, k_depth, v_depth, need_cuda=True)
    if max(16, next_pow2(s.L)) * s.d > MAX_TILE:
        raise ValueError(f"depth_softmax holds a position's L x d depth keys in one tile: L={s.L}, d={s.d} "
                         f"(padded {max(16, next_pow2(s.L))} x {s.d}) exceeds {MAX_TILE} elements")
    return DepthSoftmaxFunction.apply(q, k_depth, v_depth, 1.0 / math.sqrt(s.d) if scale is None else float(scale))


def depth_sep_attention(q, k, v, k_depth=None, v_depth=None, *, scale: float | None = None, attention=None):
    """depth-sep (variant (c)): attention(q, k, v) + `depth_softmax(q, k_depth, v_depth)`.

    q (B,T,Hq,d); k, v (B,T,Hk,d); k_depth, v_depth (B,T,L,Hk,d) or None (L = 0: the sequence
    attention alone). attention: a callable (q, k, v) -> out with autograd, causal GQA at scale
    1/sqrt(d) (default: `dattn.sequence_backend`, FA4 where it runs, else the Triton kernel at
    L = 0); scale: the depth softmax's (default 1/sqrt(d)). Returns out (B,T,Hq,d) in q's dtype;
    gradients flow to all five inputs. Bad input: one ValueError / TypeError naming the tensor."""
    shape = check_inputs(q, k, v, k_depth, v_depth, need_cuda=True)
    if attention is None:
        from moda_bench.kernels.dattn import sequence_backend
        attention = sequence_backend(q.device, q.dtype)[0]
    out = attention(q, k, v)
    if shape.L == 0:
        return out
    return out + depth_softmax(q, k_depth, v_depth, scale=scale)
