"""The fused Triton MoDA kernel: its launches (`moda_fwd`, `moda_bwd`), the torch custom ops
`moda_bench::moda_attention` / `moda_attention_bwd` and the eager autograd Function `EagerMoDA`,
`moda_attention`, and what the forward computes of the depth logits (`depth_utilization`).
The Triton kernels themselves live in `kernel_fwd` and `kernel_bwd`; a config's validity and
its choice per call in `config`.

Layouts (user-facing, spec section 1): q (B, T, Hq, d); k, v (B, T, Hk, d);
k_depth, v_depth (B, T, L, Hk, d); out (B, T, Hq, d); lse (B, T, Hq) float32.

Design (group-aware, then batched depth tiles):
* Rows. For KV head j the G query heads h = j*G + g are folded into the row axis through
  strides, r = t*GP + g with GP = next_pow2(G) (rows with g >= G are masked). A block of
  BLOCK_M rows covers P = BLOCK_M // GP whole positions, so K/V tiles are shared by the G
  heads and the causal diagonal is only P positions wide.
* Sequence phase: causal flash-attention loop over key tiles; unmasked below the diagonal.
* Depth phase: the P positions are cut into NB = P // S sub-tiles of S positions. A
  batched (3-D) matmul computes, for each sub-tile, its S*GP rows against the flat S*L depth
  columns of *its own* positions only, BLOCK_L columns a step, masked to the block diagonal.
  S = P is the paper's dense group-aware tile (utilisation G/C); the default S is the fewest
  positions that fill a 16-row tensor-core tile (utilisation min(1, G/16) for L >= BLOCK_L).
  Sequence and depth logits share one online softmax; where the depth phase runs is a config
  choice (`fwd_depth`): fused after the sequence loop; "split" (the default above
  config.FUSED_DEPTH_MAX_T), a depth-only launch
  first whose normalised partial (o_d, lse_d) the sequence kernel loads as its starting state
  (m, l, acc) = (lse_d, 1, o_d), so the sequence loop is the L = 0 kernel's; or "overlap",
  depth-only programs inside the sequence grid and a log-sum-exp merge of the two partials;
  or "tma" (the default on Hopper at T > 2048, G <= 16, d <= 64, 16-bit inputs, and then at L = 0
  too), the
  fused placement as its own kernel with every tile loaded through a tensor descriptor
  (`kernel_fwd_tma`).
* Backward, "tma" (the default on Hopper; `kernel_bwd_tma`): the query-major pass first (dq, the
  depth part, and each row's lse and delta stored in flat buffers), then the key-major pass
  (dk, dv), heaviest key tiles first; descriptor loads where usable, else pointers; at L = 0
  too. A caller's own delta or a depth-only launch (moda-fa4) takes the pointer passes below.
* Backward, pointer passes: a query-major pass computes dq and a key-major pass dk, dv; delta = rowsum(o * do)
  comes from a small preprocessing kernel, or, where the query-major pass runs first (L = 0 and
  the "fused" depth placement, the default up to T = 2048), from that pass itself, which stores
  it for the key-major pass (one launch fewer where launches cost the most). The depth part
  (its dq share, dk_depth, dv_depth; a depth entry is read only by the rows of its own
  position, so no atomics) runs fused in the
  query-major pass, as its own launch ("split"), as extra programs of the key-major grid
  ("overlap"), or (`bwd_depth="stream"`, default for long T) as its own launch on a second CUDA stream,
  concurrent with the key-major pass, so its memory traffic overlaps the dk/dv compute; the
  q-major pass adds the depth dq partial it finds in dq.
* Detached depth (`depth_grad=False`, or neither depth tensor requiring grad): the backward
  kernels get DEPTH_GRAD=False, which compiles out the dk_depth / dv_depth products and
  stores in every placement; no dkd/dvd buffers are allocated and autograd returns None for
  them. The depth part still reads k_depth and v_depth for its share of dq. It saves the
  2 * B*T*L*Hk*d * bytes(dtype) of gradient writes (and that much memory) and 2 of the depth
  part's 5 matmuls.
* Custom ops: `torch.ops.moda_bench.moda_attention(q, k, v, k_depth?, v_depth?, scale, depth_grad,
  config) -> (out, lse)` runs `moda_fwd`; `moda_attention_bwd` the backward launches, wired as
  its autograd formula. Both have fake implementations, so torch.compile(fullgraph=True) sees
  single graph nodes and AOTAutograd traces the backward through the second op. A config travels
  as `oplib.config_key`'s string and is resolved inside the op (`resolved`: installed source,
  shipped configs, heuristic), so tuning works in compiled code. depth_grad is a forward argument
  the forward ignores: the autograd formula reads it. Eager calls take `EagerMoDA` over the same
  implementation (`oplib.through_ops`).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from moda_bench.kernels.counters import stream_state
from moda_bench.kernels.launch import CachedLaunch, aligned16, cdiv
from moda_bench.kernels.moda.config import (
    MoDAConfig,
    check_config,
    depth_only_sub,
    fused_depth_sub,
    group_pad,
    pointer_block_l,
    pointer_bwd_depth,
    resolve_config,
)
from moda_bench.kernels.moda.triton.bwd import (
    BWDQ_ADD,
    BWDQ_FUSED,
    BWDQ_SEQ,
    moda_bwd_delta_kernel,
    moda_bwd_kv_kernel,
    moda_bwd_q_kernel,
)
from moda_bench.kernels.moda.triton.bwd_tma import depth_layout, heads_merged, moda_bwd_tma
from moda_bench.kernels.moda.triton.bwd_tma_rules import dq_heads, dq_mix, kv_beside, kv_chunk, kv_depth_items, kv_one
from moda_bench.kernels.moda.triton.fwd import (
    FWD_BOTH,
    FWD_DEPTH,
    FWD_FUSED,
    FWD_SEQ,
    FWD_SEQ_INIT,
    moda_fwd_kernel,
    moda_merge_kernel,
)
from moda_bench.kernels.moda.triton.fwd_tma import (
    aligned,
    descriptors_available,
    ensure_allocator,
    moda_fwd_tma,
    num_sms,
)
from moda_bench.kernels.moda.triton.streams import Concurrent, depth_grid, run_beside, side_stream  # noqa: F401 (re-exported)
from moda_bench.kernels.moda.triton.utils import dot_precision, exp_poly_share
from moda_bench.kernels.moda.validate import MoDAShape, check_depth_grad_into, check_inputs
from moda_bench.kernels.oplib import config_key, config_of, through_ops

LOG2E = 1.4426950408889634
MERGE_BLOCK = 64  # rows per program of the log-sum-exp merges

def depth_utilization(T: int, G: int, C: int, L: int, config: MoDAConfig | None = None) -> float:
    """Useful depth logits / depth logits this kernel computes in the forward (spec section 2).

    A sub-tile of S positions has S*GP rows and computes ceil(S*L/BLOCK_L)*BLOCK_L columns
    for each of them; S*G*L of those logits are needed.
    """
    if L == 0:
        return float("nan")
    cfg = config or MoDAConfig(block_m=max(C, group_pad(G)), fwd_depth="fused")
    if cfg.fwd_depth == "tma":  # S positions x block_l // S entries a step, cdiv(L, that) steps
        S = fused_depth_sub(cfg, G, cfg.block_m)
        return (S * G * L) / (S * group_pad(G) * cdiv(L, cfg.block_l // S) * cfg.block_l)
    if cfg.fwd_depth == "fused":
        S = fused_depth_sub(cfg, G, cfg.block_m)
    else:  # rows of a depth-only program, as `moda_fwd` launches them
        S = depth_only_sub(cfg, G, cfg.depth_block_m if cfg.fwd_depth in ("split", "stream") else cfg.block_m)
    cols = cdiv(S * L, cfg.block_l) * cfg.block_l
    return (S * G * L) / (S * group_pad(G) * cols)


def _strides(q, k, v, kd, o, lse):
    """The stride arguments shared by every kernel launch, in kernel-signature order."""
    return (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), kd.stride(0), kd.stride(1), kd.stride(2), kd.stride(3),
            o.stride(0), o.stride(1), o.stride(2), lse.stride(0), lse.stride(1), lse.stride(2))


def depth_views(kd, vd):
    """The depth K/V as the pointer kernels read them: in place when both share one set of strides
    with a unit last stride (e.g. slices kd = buf_k[:, :, :l], vd = buf_v[:, :, :l] of one
    model-wide depth buffer per K and V), else contiguous copies of both."""
    if kd is None or (kd.stride() == vd.stride() and kd.stride(-1) == 1):
        return kd, vd
    return kd.contiguous(), vd.contiguous()


def tma_usable(q, k, v, kd, vd, L: int) -> bool:
    """Whether the descriptor forward can take these tensors: this Triton builds descriptors and
    every tensor it reads is contiguous (the caller's `.contiguous()`; a strided depth slice is not,
    and takes the pointer kernel in place) and 16-byte aligned."""
    return descriptors_available() and aligned(q, k, v, *((kd, vd) if L > 0 else ()), contiguous=True)


def moda_fwd(q, k, v, kd, vd, scale, shape: MoDAShape, cfg: MoDAConfig, depth_only: bool = False, usable=None):
    """The forward's launches for `cfg`: returns (o, lse). depth_only (fwd_depth "split" only, for
    timing the depth kernel alone, experiments/depth_probe.py) stops after the depth-only launch and
    returns its partial (o_d, lse_d). usable: `tma_usable` of these tensors where the caller has it
    (None: asked here)."""
    B, T, Hq, d = q.shape
    Hk, G, L = shape.Hk, shape.G, shape.L
    gp = group_pad(G)
    if cfg.fwd_depth == "tma" and not depth_only:
        if tma_usable(q, k, v, kd, vd, L) if usable is None else usable:
            return moda_fwd_tma(q, k, v, kd if L > 0 else None, vd if L > 0 else None, scale, G,
                                block_m=cfg.block_m, block_n=cfg.block_n, num_warps=cfg.num_warps,
                                num_stages=cfg.num_stages, depth_sub=cfg.depth_sub, block_l=cfg.block_l,
                                depth_stages=cfg.depth_stages, maxnreg=cfg.fwd_maxnreg,
                                poly=exp_poly_share(cfg.exp_poly, 1, q.dtype))
        cfg = cfg.replace(fwd_depth="fused")  # same arithmetic, pointer loads
    o = torch.empty_like(q)
    lse = torch.empty((B, T, Hq), device=q.device, dtype=torch.float32)
    mode = cfg.fwd_depth if L > 0 else "none"
    kd_, vd_ = (kd, vd) if L > 0 else (k.unsqueeze(2), v.unsqueeze(2))
    st = _strides(q, k, v, kd_, o, lse)
    prec = dot_precision(q.dtype)
    n_seq = cdiv(T * gp, cfg.block_m)
    seq_meta = dict(GP=gp, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, HEAD_DIM=d, BLOCK_L=cfg.block_l, PREC=prec,
                    DEPTH_STAGES=cfg.depth_stages, REVERSE=cfg.reverse, num_warps=cfg.num_warps,
                    num_stages=cfg.num_stages)

    key = _shape_key(q, kd_, shape, st, q, k, v, kd_, vd_)  # o, lse, od, lsed: allocated here

    def launch(grid, od, lsed, n, MODE, S, **meta):
        _FWD_PTR(key and (key, n, grid, MODE, S, tuple(meta.values())), grid,
                 (q, k, v, kd_, vd_, o, lse, od, lsed, scale * LOG2E, T, L, G, Hk, n, B * Hk, *st),
                 lambda: dict(MODE=MODE, S=S, **meta))

    if mode == "none":
        launch((n_seq, B * Hk), o, lse, n_seq, FWD_SEQ, 1, **seq_meta)
    elif mode == "fused":
        launch((n_seq, B * Hk), o, lse, n_seq, FWD_FUSED, fused_depth_sub(cfg, G, cfg.block_m), **seq_meta)
    elif mode == "stream":  # depth-only kernel on a side stream, concurrent with the L=0 kernel
        od, lsed = torch.empty_like(o), torch.empty_like(lse)
        dbm = cfg.depth_block_m
        n_d = B * Hk * cdiv(T * gp, dbm)
        run_beside(q.device,
                    lambda: launch((n_seq, B * Hk), o, lse, n_seq, FWD_SEQ, 1, **seq_meta),
                    lambda: launch((depth_grid(n_d, cfg.depth_ctas),), od, lsed, n_d, FWD_DEPTH,
                                   depth_only_sub(cfg, G, dbm),
                                   **dict(seq_meta, BLOCK_M=dbm, num_warps=cfg.depth_warps, num_stages=1)),
                    cfg.depth_after, cfg.side_priority)
        o, lse = merge_partials(o, lse, od, lsed)
    elif mode == "split":
        dbm = cfg.depth_block_m
        n_d = B * Hk * cdiv(T * gp, dbm)
        launch((depth_grid(n_d, cfg.depth_ctas),), o, lse, n_d, FWD_DEPTH, depth_only_sub(cfg, G, dbm),
               **dict(seq_meta, BLOCK_M=dbm, num_warps=cfg.depth_warps, num_stages=1))
        if depth_only:
            return o, lse
        launch((n_seq, B * Hk), o, lse, n_seq, FWD_SEQ_INIT, 1, **seq_meta)
    else:  # overlap
        od, lsed = torch.empty_like(o), torch.empty_like(lse)
        launch((2 * n_seq, B * Hk), od, lsed, n_seq, FWD_BOTH, depth_only_sub(cfg, G, cfg.block_m), **seq_meta)
        o, lse = merge_partials(o, lse, od, lsed)
    return o, lse


def _shape_key(q, kd_, shape: MoDAShape, st: tuple, *tensors):
    """The pointer kernels' launch key for `CachedLaunch`: dtypes, shape and strides (which fix
    every integer specialisation), or None unless every caller-owned tensor is 16-byte aligned
    (Triton specialises pointers on that; the buffers allocated here always are)."""
    if not aligned16(*tensors):
        return None
    return q.dtype, kd_.dtype, shape.B, shape.T, shape.Hq, shape.Hk, shape.d, shape.L, shape.G, st


_FWD_PTR, _BWD_Q_PTR, _BWD_KV_PTR = (CachedLaunch(moda_fwd_kernel), CachedLaunch(moda_bwd_q_kernel),
                                     CachedLaunch(moda_bwd_kv_kernel))


def merge_partials(o1, lse1, o2, lse2):
    """The log-sum-exp merge of two normalised partials (o (B,T,Hq,d), lse (B,T,Hq), contiguous)
    into new tensors (`moda_merge_kernel`; never in place: see its docstring)."""
    o, lse = torch.empty_like(o1), torch.empty_like(lse1)
    n_rows, d = lse1.numel(), o1.shape[-1]
    key = (o1.dtype, o2.dtype, lse1.dtype, lse2.dtype, n_rows, d) if aligned16(o1, lse1, o2, lse2) else None
    _MERGE(key, (cdiv(n_rows, MERGE_BLOCK),), (o1, lse1, o2, lse2, o, lse, n_rows),
           lambda: dict(HEAD_DIM=d, BLOCK=MERGE_BLOCK))
    return o, lse


def launch_delta(o, do, delta, d: int) -> None:
    """delta <- rowsum(o * do) over the flattened (rows, d) views (`moda_bwd_delta_kernel`; o, do
    contiguous, delta allocated by the caller, one float32 a row)."""
    n_rows = delta.numel()
    key = (o.dtype, do.dtype, delta.dtype, n_rows, d) if aligned16(o, do, delta) else None
    _DELTA(key, (cdiv(n_rows, DELTA_BLOCK),), (o, do, delta, n_rows), lambda: dict(HEAD_DIM=d, BLOCK=DELTA_BLOCK))


DELTA_BLOCK = 128  # rows per program of the delta kernel
_MERGE, _DELTA = CachedLaunch(moda_merge_kernel), CachedLaunch(moda_bwd_delta_kernel)


# The pointer backward's depth stages: MoDAConfig's default, not the 3 `default_config` gives the
# "tma" dq pass at T <= 4096: the pointer depth-only launch is faster at 2, alone and beside the
# sequence backward (docs/PERFORMANCE.md, change 38).
POINTER_DEPTH_STAGES = MoDAConfig.bwd_depth_stages


def pointer_bwd_config(cfg: MoDAConfig, T: int, L: int) -> MoDAConfig:
    """cfg for the pointer backward kernels: a "tma" backward config takes the pointer default's
    placement (`pointer_bwd_depth`), depth columns (`pointer_block_l`) and depth stages
    (POINTER_DEPTH_STAGES); any other config is returned as it is."""
    if cfg.bwd_depth != "tma":
        return cfg
    return cfg.replace(bwd_depth=pointer_bwd_depth(T), bwd_block_l=pointer_block_l(L),
                       bwd_depth_stages=POINTER_DEPTH_STAGES)


_ROUTES: dict = {}  # (id(cfg), sizes, device, capturing) -> (cfg, route): `tma_route`'s memo


def tma_route(cfg: MoDAConfig, B: int, T: int, Hk: int, G: int, L: int, device, capturing: bool) -> tuple:
    """The "tma" backward's shape for these sizes: (kv_chunk, depth items, a dq pass a head a program,
    one launch, key-major pass beside the dq pass), by `kernel_bwd_rules`. Memoised by the config's
    identity (the entry keeps the config, so its id is not reused while kept): an eager call hashes
    no 40-field config and asks none of the rules again."""
    key = (id(cfg), B, T, Hk, G, L, device, capturing)
    hit = _ROUTES.get(key)
    if hit is not None and hit[0] is cfg:
        return hit[1]
    n_sms = num_sms(device)
    chunk, items = kv_chunk(cfg, B, T, Hk, G, n_sms), kv_depth_items(cfg, T, L, G)
    heads = dq_heads(cfg, T, L, G) and cfg.bwd_kv_beside != 2
    one = kv_one(cfg, T, L, heads, items, capturing)
    beside = not (items or one) and kv_beside(cfg, B, T, Hk, G, L, n_sms, capturing, chunk=chunk)
    if len(_ROUTES) >= 256:
        _ROUTES.clear()
    _ROUTES[key] = (cfg, (chunk, items, heads, one, beside))
    return _ROUTES[key][1]


def moda_bwd(do, q, k, v, kd, vd, o, lse, scale, shape: MoDAShape, cfg: MoDAConfig, depth_only: bool = False,
             delta=None, depth_grad: bool = True, usable=None, depth_grad_into=None):
    """The backward's launches for `cfg`: returns (dq, dk, dv, dkd, dvd). delta: rowsum(o * do),
    (B, T, Hq) float32, where the caller has it (else computed here). depth_only (bwd_depth
    "split" only) runs the depth-only launch alone and returns (dq partial, None, None, dkd, dvd);
    without a delta it is left uninitialised then, which only timing may do. depth_grad=False
    treats kd, vd as constants: dkd = dvd = None, never allocated nor computed (the depth part
    still adds its share of dq). usable: the forward's `tma_usable` of q, k, v, kd, vd (None: asked here).
    depth_grad_into (off by default): (gk, gv) of kd's shape, e.g. slices of a model's depth
    gradient buffer (strided, unit last stride, one set of strides for both): the depth gradients
    are added to them in the kernel (`DEPTH_ACC`, pointer and descriptor passes alike) and they are
    returned as dkd, dvd, so no gradient tensor is allocated and none is read and added again by
    the caller. Strided depth K/V (and buffers) are read in place by both (`bwd_tma.depth_layout`)."""
    B, T, Hq, d = q.shape
    Hk, G, L = shape.Hk, shape.G, shape.L
    gp = group_pad(G)
    do = do.contiguous()
    acc = depth_grad_into is not None and bool(depth_grad) and L > 0
    if acc:
        check_depth_grad_into(depth_grad_into, kd)
    if cfg.bwd_depth == "tma" and not depth_only and delta is None and (not acc or heads_merged(depth_grad_into[0])):
        o, into = o.contiguous(), depth_grad_into if acc else ()
        kd, vd, usable = depth_layout(kd, vd, L, usable)  # a strided slice in place (the forward's usable: contiguous)
        state = stream_state(q.device)
        chunk, items, heads, one, beside = tma_route(cfg, B, T, Hk, G, L, q.device, state[1])
        use_desc = (descriptors_available() and aligned(q, k, v, contiguous=True) and (L == 0 or aligned(kd, vd))
                    if usable is None else usable) and aligned(o, do, *into)
        return moda_bwd_tma(do, q, k, v, kd if L > 0 else None, vd if L > 0 else None, o, lse.contiguous(), scale, G,
                            q_block_m=cfg.bwd_q_block_m, q_block_n=cfg.bwd_q_block_n, q_warps=cfg.bwd_q_warps,
                            q_stages=cfg.bwd_q_stages, q_maxnreg=cfg.bwd_q_maxnreg, kv_block_m=cfg.bwd_kv_block_m,
                            kv_block_n=cfg.bwd_kv_block_n, kv_warps=cfg.bwd_kv_warps, kv_stages=cfg.bwd_kv_stages,
                            kv_maxnreg=cfg.bwd_kv_maxnreg, block_l=cfg.bwd_block_l,
                            depth_stages=cfg.bwd_depth_stages, use_desc=use_desc, depth_grad=depth_grad,
                            beside=(lambda main, side: run_beside(q.device, main, side, False, True))
                            if beside else None, mix=dq_mix(T, L), kv_chunk=chunk, depth_items=items,
                            poly=cfg.exp_poly, heads=heads, one=one, state=state, depth_into=into or None)
    cfg = pointer_bwd_config(cfg, T, L)  # a caller's delta or a depth-only launch: the pointer passes
    mode = cfg.bwd_depth if L > 0 else "none"
    # the q-major pass runs first in "none"/"fused": it computes delta itself (one launch fewer)
    inline = delta is None and not depth_only and mode in ("none", "fused")
    if inline and o.stride() != do.stride():
        o = o.contiguous()  # the q-major pass reads o with do's strides
    if delta is None:
        delta = torch.empty_like(lse)
        if not depth_only and not inline:
            launch_delta(o, do, delta, d)
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    depth_grad = bool(depth_grad) and L > 0
    kd_, vd_ = (kd, vd) if L > 0 else (k.unsqueeze(2), v.unsqueeze(2))
    if acc:  # the caller's buffers, added to in place
        dkd_, dvd_ = dkd, dvd = depth_grad_into
    elif depth_grad:  # contiguous buffers of the slice's shape, whatever kd's strides
        dkd = torch.empty(kd.shape, device=kd.device, dtype=kd.dtype)
        dvd = torch.empty(vd.shape, device=vd.device, dtype=vd.dtype)
        dkd_, dvd_ = dkd, dvd
    else:
        dkd = dvd = None
        dkd_, dvd_ = kd_, vd_  # never written (no depth work, or DEPTH_GRAD=False)
    st = _strides(q, k, v, kd_, do, lse)
    st = (*st[:13], *dkd_.stride()[:4], *st[13:])  # the depth gradients' strides after the depth K/V's
    prec = dot_precision(q.dtype)
    args = (scale * LOG2E, scale, T, L, G, Hk)
    # descriptor loads of the sequence tiles: k, v for the q-major pass, q, do for the key-major one
    q_desc = kv_desc = False
    if cfg.bwd_tma and descriptors_available():
        q_desc = all(t.is_contiguous() for t in (k, v)) and aligned(k, v)
        kv_desc = (cfg.bwd_kv_block_m % gp == 0 and all(t.is_contiguous() for t in (q, do))
                   and q.stride() == do.stride() and aligned(q, do))
        if q_desc or kv_desc:
            ensure_allocator()

    # dq, dk, dv, dkd, dvd and delta (unless the caller's) are allocated here; the rest must be aligned
    key = _shape_key(q, kd_, shape, st, q, k, v, kd_, vd_, do, lse, o, delta, *((dkd_, dvd_) if acc else ()))
    key = key and (key, cfg, depth_grad, inline, q_desc, kv_desc, acc)

    def kv_launch(KV, DEPTH, **meta):
        dbm = cfg.bwd_depth_block_m
        n_d = cdiv(T * gp, dbm) if DEPTH else 0
        if KV:
            n_kv = cdiv(T, cfg.bwd_kv_block_n)
            grid = (n_kv + n_d, B * Hk)
        else:  # depth-only: n_kv carries the number of work items, the grid may be persistent
            n_kv = B * Hk * n_d
            grid = (depth_grid(n_kv, cfg.bwd_depth_ctas),)
        _BWD_KV_PTR(key and (key, grid, KV, DEPTH, tuple(meta.values())), grid,
                    (q, k, v, kd_, vd_, do, lse, delta, dk, dv, dq, dkd_, dvd_, *args, n_kv, B * Hk, B, *st),
                    lambda: dict(GP=gp, BLOCK_M=cfg.bwd_kv_block_m, BLOCK_N=cfg.bwd_kv_block_n, HEAD_DIM=d, KV=KV,
                                 DEPTH=DEPTH, DBLOCK_M=dbm, S=depth_only_sub(cfg, G, dbm), BLOCK_L=cfg.bwd_block_l,
                                 PREC=prec, DEPTH_STAGES=cfg.bwd_depth_stages, DEPTH_GRAD=depth_grad or not DEPTH,
                                 DESC=kv_desc and KV, DEPTH_ACC=acc and DEPTH, **meta))

    def q_launch(MODE):
        grid = (cdiv(T * gp, cfg.bwd_q_block_m), B * Hk)
        _BWD_Q_PTR(key and (key, MODE), grid, (q, k, v, kd_, vd_, do, lse, delta, dq, dkd_, dvd_, o, *args, B, *st),
                   lambda: dict(GP=gp, BLOCK_M=cfg.bwd_q_block_m, BLOCK_N=cfg.bwd_q_block_n, HEAD_DIM=d, MODE=MODE,
                                S=fused_depth_sub(cfg, G, cfg.bwd_q_block_m) if MODE == BWDQ_FUSED else 1,
                                BLOCK_L=cfg.bwd_block_l, PREC=prec, DEPTH_STAGES=cfg.bwd_depth_stages,
                                REVERSE=cfg.reverse, DEPTH_GRAD=depth_grad or MODE != BWDQ_FUSED,
                                DELTA_INLINE=inline, DESC=q_desc, DEPTH_ACC=acc and MODE == BWDQ_FUSED,
                                num_warps=cfg.bwd_q_warps,
                                num_stages=cfg.bwd_q_stages))

    # DEPTH_GRAD is pinned True where a launch has no depth work, so those share one compiled variant
    kv_meta = dict(num_warps=cfg.bwd_kv_warps, num_stages=cfg.bwd_kv_stages)
    if mode in ("none", "fused"):
        q_launch(BWDQ_SEQ if mode == "none" else BWDQ_FUSED)
        kv_launch(True, False, **kv_meta)
    elif mode == "split":
        kv_launch(False, True, num_warps=cfg.bwd_depth_warps, num_stages=1)
        if depth_only:
            return dq, None, None, dkd, dvd
        q_launch(BWDQ_ADD)
        kv_launch(True, False, **kv_meta)
    elif mode == "stream":  # depth-only kernel on a side stream, concurrent with the dk/dv pass
        run_beside(q.device, lambda: kv_launch(True, False, **kv_meta),
                    lambda: kv_launch(False, True, num_warps=cfg.bwd_depth_warps, num_stages=1),
                    cfg.bwd_depth_after, cfg.side_priority)
        q_launch(BWDQ_ADD)
    else:  # overlap: depth programs ride in the kv-major grid, the q-major pass adds their dq
        kv_launch(True, True, **kv_meta)
        q_launch(BWDQ_ADD)
    return dq, dk, dv, dkd, dvd


def wants_depth_grad(ctx, depth_grad: bool, kd_index: int = 3) -> bool:
    """Whether an autograd backward must compute dk_depth, dv_depth: asked for (depth_grad) and
    needed (the depth inputs at kd_index, kd_index + 1 of the Function's apply require grad)."""
    return bool(depth_grad) and (ctx.needs_input_grad[kd_index] or ctx.needs_input_grad[kd_index + 1])


def moda_attention(q, k, v, k_depth=None, v_depth=None, *, scale: float | None = None, return_lse: bool = False,
                   config: MoDAConfig | None = None, depth_grad: bool = True):
    """Mixture-of-Depths Attention (fused Triton kernel, autograd-enabled).

    q (B,T,Hq,d); k, v (B,T,Hk,d); k_depth, v_depth (B,T,L,Hk,d) or None (L = 0: causal GQA).
    Each query attends causally to the sequence keys and to the L depth keys of its own
    position, under one softmax. Returns out (B,T,Hq,d) in q's dtype, and lse (B,T,Hq) float32
    (natural log) when return_lse. `config` pins the tile shapes; without it `resolve_config`
    answers: the installed config source (the tuning cache after `moda_bench.tuning.use()`),
    else this GPU's shipped configs, else the heuristic `default_config`. Gradients flow to all
    five inputs, unless depth_grad=False.

    depth_grad=False: k_depth and v_depth are treated as constants (detached, as production
    stacks keep the depth K/V out of autograd): no gradient is computed, stored or allocated
    for them, their .grad stays None even if they require grad, and nothing flows back to
    whatever produced them. The forward and the gradients of q, k, v are unchanged (the depth
    part still contributes to dq). The backward takes the same path automatically when
    neither k_depth nor v_depth requires grad.

    Host work per call besides the launches: memoised input checks, config look-up and config
    check (no file access, no JSON), and the backward's memoised launch plan.

    Under torch.compile the call is the torch custom op `torch.ops.moda_bench.moda_attention`
    (fake implementation and autograd: `moda_attention_op`), so `torch.compile(..., fullgraph=True)`
    traces it with no graph break; eager calls run the same implementation through `EagerMoDA`
    (`oplib.through_ops`). The config goes to the op as its JSON key (`oplib.config_key`), resolved
    in the op.
    k_depth, v_depth may be strided views (a slice of one model-wide depth buffer): read in place
    when they share strides with a unit last stride (`depth_views`); their gradients are
    contiguous tensors of the slice's shape.
    """
    if not torch.compiler.is_compiling():  # one-line errors before any layout work (a memo hit when seen before)
        check_inputs(q, k, v, k_depth, v_depth, need_cuda=True)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if k_depth is None or k_depth.shape[2] == 0:
        k_depth = v_depth = None
    else:
        k_depth, v_depth = depth_views(k_depth, v_depth)
        if not depth_grad:  # constants: no graph edge back to their producers
            k_depth, v_depth = k_depth.detach(), v_depth.detach()
    call = moda_attention_op if through_ops() else EagerMoDA.apply
    o, lse = call(q.contiguous(), k.contiguous(), v.contiguous(), k_depth, v_depth, scale, bool(depth_grad),
                  config_key(config))
    return (o, lse) if return_lse else o


# ------------------------------------------------------------------ the torch custom ops
def resolved(shape, dtype, key: str) -> MoDAConfig:
    """The config a call runs (`resolve_config` of the key's config), checked."""
    cfg = resolve_config(shape, dtype, config_of(key, MoDAConfig))
    check_config(cfg, shape.G)
    if "persist" in (cfg.fwd_depth, cfg.bwd_depth):
        raise ValueError("config placement 'persist' is moda_fa4's (a sequence kernel beside the streaming depth "
                         "kernels); moda_attention takes split, stream, fused, overlap or tma")
    return cfg


def prepared(q, k, v, kd, vd, key: str, plan=None):
    """(q, k, v, kd, vd, plan) as the launches take them, plan = (shape, cfg, `tma_usable`): the
    wrapper's layout rules again, so the op is right for any strides it is handed (e.g. by
    opcheck). A plan given (the eager Function's forward kept it) is reused: the backward reads
    the tensors the forward saved, so no check nor config look-up is repeated."""
    if plan is None:
        shape = check_inputs(q, k, v, kd, vd, need_cuda=True)
        cfg = resolved(shape, q.dtype, key)
    else:
        shape, cfg = plan[:2]
    kd, vd = depth_views(kd, vd) if shape.L > 0 else (None, None)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    if plan is None:
        usable = (cfg.fwd_depth == "tma" or cfg.bwd_depth == "tma") and tma_usable(q, k, v, kd, vd, shape.L)
        plan = (shape, cfg, usable)
    return q, k, v, kd, vd, plan


def _forward(q, k, v, k_depth, v_depth, scale: float, config: str, ctx=None):
    """out, lse of one call (`moda_fwd`): the op's implementation and the eager Function's forward
    (ctx: that Function's, which keeps the plan for its backward)."""
    q, k, v, kd, vd, plan = prepared(q, k, v, k_depth, v_depth, config)
    if ctx is not None:
        ctx.plan = plan
    return moda_fwd(q, k, v, kd, vd, scale, plan[0], plan[1], usable=plan[2])


def _gradients(do, q, k, v, k_depth, v_depth, o, lse, scale: float, depth_grad: bool, config: str, plan=None):
    """(dq, dk, dv, dkd, dvd) of one call (`moda_bwd`); dkd = dvd = None without depth_grad or at L = 0."""
    q, k, v, kd, vd, (shape, cfg, usable) = prepared(q, k, v, k_depth, v_depth, config, plan)
    return moda_bwd(do, q, k, v, kd, vd, o, lse, scale, shape, cfg, depth_grad=depth_grad and shape.L > 0,
                    usable=usable)


@torch.library.custom_op("moda_bench::moda_attention", mutates_args=())
def moda_attention_op(q: Tensor, k: Tensor, v: Tensor, k_depth: Optional[Tensor], v_depth: Optional[Tensor],
                      scale: float, depth_grad: bool, config: str) -> tuple[Tensor, Tensor]:
    """out (B,T,Hq,d) in q's dtype and lse (B,T,Hq) float32 of one MoDA call (`moda_fwd`)."""
    return _forward(q, k, v, k_depth, v_depth, scale, config)


@moda_attention_op.register_fake
def _(q, k, v, k_depth, v_depth, scale, depth_grad, config):
    B, T, Hq, _d = q.shape
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty((B, T, Hq), dtype=torch.float32)


@torch.library.custom_op("moda_bench::moda_attention_bwd", mutates_args=())
def moda_attention_bwd_op(do: Tensor, q: Tensor, k: Tensor, v: Tensor, k_depth: Optional[Tensor],
                          v_depth: Optional[Tensor], o: Tensor, lse: Tensor, scale: float, depth_grad: bool,
                          config: str) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, dk_depth, dv_depth) of one MoDA call (`moda_bwd`); the depth gradients are
    contiguous of k_depth's shape with depth_grad, else empty (0,) tensors (detached depth, L = 0)."""
    dq, dk, dv, dkd, dvd = _gradients(do, q, k, v, k_depth, v_depth, o, lse, scale, depth_grad, config)
    if dkd is None:
        dkd, dvd = q.new_empty((0,)), q.new_empty((0,))
    return dq, dk, dv, dkd, dvd


@moda_attention_bwd_op.register_fake
def _(do, q, k, v, k_depth, v_depth, o, lse, scale, depth_grad, config):
    grads = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v)]
    for t in (k_depth, v_depth):
        grads.append(torch.empty_like(t, memory_format=torch.contiguous_format) if depth_grad and t is not None
                     and t.shape[2] > 0 else q.new_empty((0,)))
    return tuple(grads)


def _setup_context(ctx, inputs, output):
    q, k, v, kd, vd, scale, depth_grad, config = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, kd, vd, o, lse)
    ctx.call = (scale, depth_grad, config)
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)  # no zero-filled tensor for lse's (or an unused out's) gradient


def _backward(ctx, do, dlse):
    """The autograd formula of both paths (looked up here at each call so tests can wrap it): the
    backward op under the op path, `_gradients` with the forward's plan under the eager Function."""
    if do is None:  # only lse (not differentiable) reached the loss
        return (None,) * 8
    q, k, v, kd, vd, o, lse = ctx.saved_tensors
    scale, depth_grad, config = ctx.call
    grad_depth = kd is not None and wants_depth_grad(ctx, depth_grad)
    if getattr(ctx, "plan", None) is not None:  # the eager Function: its forward's plan, no op
        dq, dk, dv, dkd, dvd = _gradients(do, q, k, v, kd, vd, o, lse, scale, grad_depth, config, ctx.plan)
    else:
        dq, dk, dv, dkd, dvd = moda_attention_bwd_op(do, q, k, v, kd, vd, o, lse, scale, grad_depth, config)
    return dq, dk, dv, dkd if grad_depth else None, dvd if grad_depth else None, None, None, None


moda_attention_op.register_autograd(lambda ctx, do, dlse: _backward(ctx, do, dlse), setup_context=_setup_context)


class EagerMoDA(torch.autograd.Function):
    """The eager path (`oplib.through_ops` False): the op's implementation and autograd formula in
    an autograd Function, without the dispatcher's host time. apply(q, k, v, kd, vd, scale,
    depth_grad, config key) -> (out, lse), as the op."""

    @staticmethod
    def forward(ctx, q, k, v, kd, vd, scale, depth_grad, config):
        out = _forward(q, k, v, kd, vd, scale, config, ctx)
        _setup_context(ctx, (q, k, v, kd, vd, scale, depth_grad, config), out)
        return out

    @staticmethod
    def backward(ctx, do, dlse):
        return _backward(ctx, do, dlse)
