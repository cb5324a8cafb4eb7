"""The fused Triton depth mix of Depth-Attention (its forward and backward kernels, their launches,
the torch custom ops `depth_mix_op` / `depth_mix_bwd_op` (moda_bench::depth_mix, its autograd) and the
eager autograd Function `EagerMix` over the same implementation,
`depth_mix`) and its HBM traffic model `mix_bytes`.

What it computes, per (b, t, KV head j) "row" (layouts q (B,T,Hq,d), k/v (B,T,Hk,d),
k_src/v_src (B,T,S,Hk,d)):
    qbar = mean_g q[b,t,j*G+g];  l_0 = scale <qbar, k>,  l_s = scale <qbar, k_src[s]>  (s = 1..S)
    alpha = softmax(l);  v_mixed = alpha_0 v + sum_s alpha_s v_src[s]

Design (memory-bound: every byte is read or written once):
* Grid: one program per BLOCK_R consecutive rows r = (b*T + t)*Hk + j, a 1-D grid of
  cdiv(B*T*Hk, BLOCK_R). For contiguous k, v, v_mixed a program's tile is one contiguous
  BLOCK_R*d run; for k_src[:, :, s] it is runs of Hk*d. Every tensor is a 2-D [BLOCK_R, d] tile
  (d in {16, 32, 64, 128} is the whole head, rows masked past B*T*Hk, so any T works); loads are
  vectorised along d (last stride 1, the launch makes it so); all math in fp32.
* Forward: qbar from the G query rows (loop unrolled, G is a constexpr, so the G loads are in
  flight together; scale and 1/G folded in), the own logit, then ONE runtime loop over the S
  sources with an online softmax (running max m, denominator, rescaled accumulator), so each
  source is read once and no logit tile is kept. The loop is software-pipelined by hand: source
  s+1's k/v tiles are loaded before source s is used (Triton does not pipeline loads that feed
  no dot), which doubles the bytes in flight per program. Writes v_mixed once (v's dtype) and
  lse = m + log(den) per row (fp32).
* Saved for the backward: the inputs and lse (4 bytes per row, 1/(32 (G+3+2S)) of the
  forward's traffic at d=64 bf16). With lse, alpha_s = exp(l_s - lse) is recomputed from the k_s
  tile the backward reads anyway; without it the backward would need a second pass over k_src.
  The S alphas are not saved: S*4 bytes per row written + read for nothing gained.
* Backward, one program per BLOCK_R rows, one pass over the sources (reads q, k, v, k_src,
  v_src, dv_mixed, lse, each once, prefetched one source ahead as in the forward; v_mixed is
  not read). Per source: alpha_s, dalpha_s = <dv_mixed, v_s>; dv_s = alpha_s dv_mixed is
  written at once; delta = sum alpha_s dalpha_s (= <dv_mixed, v_mixed>)
  and the two sums A = sum alpha_s dalpha_s k_s, Kbar = sum alpha_s k_s accumulate in [BLOCK_R, d]
  registers; alpha_s and alpha_s dalpha_s go into [BLOCK_R, SP] register tiles (SP =
  next_pow2(S)). Only then is delta known: dlogit_s = alpha_s (dalpha_s - delta), and a second
  loop over the sources, which reads nothing, writes dk_s = dlogit_s * scale * qbar.
  dqbar = scale (A - delta Kbar) = scale sum_s dlogit_s k_s, and dq-share = dqbar / G is written
  to each of the G query heads. Chained after the sequence attention's backward (`mix_bwd`'s
  dq_into / dk_into, used by `ops.dattn.chained`), the kernel instead adds its dq share and dk to
  that backward's dq and dk (read, add in fp32, write): no separate gradient-sum kernels, and
  1.5 fewer q-sized passes over HBM than writing the share for autograd to add.
* S = 0 is not launched: `depth_mix` returns v itself (alpha_own = 1).
* Launches: both go through `kernels.launch.CachedLaunch` (`_FWD_LAUNCH`, `_BWD_LAUNCH`), keyed by
  `launch_key`: the dtypes of every tensor argument, every integer argument's value (rows, T,
  Hk, S, all strides), the constexprs and num_warps, or None (Triton's own path) unless every
  pointer is 16-byte aligned. A repeated key skips Triton's per-call binding and specialisation
  (host time that bounds short calls; docs/DESIGN.md, "Depth-Attention") and calls the same
  compiled kernel.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from moda_bench import floor
from moda_bench.kernels.dattn.validate import DAttnShape, check_dattn_inputs
from moda_bench.kernels.launch import CachedLaunch, aligned16, cdiv, next_pow2
from moda_bench.kernels.oplib import through_ops

MIX_PASSES = ("fwd", "bwd", "fwdbwd")


def mix_bytes(B: int, T: int, Hq: int, Hk: int, S: int, d: int, dtype_bytes: int, pass_: str) -> int:
    """Minimum HBM bytes of the depth mix (each tensor it must touch read or written once).

    fwd: read q (Hq heads), k, v, k_src, v_src (S sources each); write v_mixed:
         B*T*d * (Hq + Hk*(3 + 2S)) elements.
    bwd: read q, k, v, k_src, v_src, dv_mixed; write the dq-share, dk, dv, dk_src, dv_src:
         B*T*d * (2*Hq + Hk*(5 + 4S)) elements.
    fwdbwd: the sum. S = 0 is 0 bytes (v_mixed = v, nothing to move). Not counted: the kernel's
    lse statistic (4 bytes per row written by fwd, read by bwd) and the autograd sum of the two
    dq shares (outside the mix)."""
    if pass_ not in MIX_PASSES:
        raise ValueError(f"pass_ must be one of {', '.join(MIX_PASSES)}, got {pass_!r}")
    if S == 0:
        return 0
    return int(floor.mix_work(pass_, B, T, Hq, Hk, d, S, dtype=dtype_bytes).bytes)   # the one byte model


def mix_tiles(d: int, S: int, pass_: str) -> tuple[int, int]:
    """(BLOCK_R rows, num_warps) of a launch (8 warps; untuned heuristic, `mix_fwd` / `mix_bwd`
    take overrides). Forward: 4 live [BLOCK_R, d] fp32 tiles (qbar, acc, k_s, v_s) plus the
    prefetched raw tiles, BLOCK_R * d = 4096. Backward: 6 [BLOCK_R, d] tiles (qbar, dv_mixed,
    two sums, k_s, v_s), the prefetched ones and two [BLOCK_R, SP] ones: BLOCK_R = the power of
    two at most 16384 / (6d + 2SP), within [16, 256]. Compiled offline for sm_90a (bf16, ptxas
    13.4) these use 76-80 registers a thread in the forward and 74-117 in the backward, no
    spills, all loads 16-byte vectors (d 16..128, S 1..64, G 1..8)."""
    if pass_ == "fwd":
        return max(16, 4096 // d), 8
    sp = sources_pad(S)
    rows = 16384 // (6 * d + 2 * sp)
    return min(256, max(16, 1 << (rows.bit_length() - 1))), 8


def sources_pad(S: int) -> int:
    """SP: the width of the backward's per-source register tiles (a power of two >= S, >= 2)."""
    return max(2, next_pow2(max(S, 1)))


# ------------------------------------------------------------------ kernels
@triton.jit
def row_offsets(rows, T, Hk, sb, st, sh):
    """Element offsets of (b, t, j) for rows r = (b*T + t)*Hk + j in a tensor with batch, time and
    head strides sb, st, sh (rows int64)."""
    bt = rows // Hk
    return (bt // T) * sb + (bt % T) * st + (rows % Hk) * sh


@triton.jit
def scaled_qbar(Q, rows, m2, offs_d, T, Hk, qscale, sqb, sqt, sqh, G: tl.constexpr, BLOCK_R: tl.constexpr,
                HEAD_DIM: tl.constexpr):
    """qscale * sum of the G query rows j*G .. j*G+G-1 of each row's position: [BLOCK_R, d] fp32.
    Unrolled over G, so the G loads are in flight together."""
    qp = Q + row_offsets(rows, T, Hk, sqb, sqt, G * sqh)[:, None] + offs_d   # head j*G of row j
    acc = tl.zeros([BLOCK_R, HEAD_DIM], dtype=tl.float32)
    for g in tl.static_range(G):
        acc += tl.load(qp + g * sqh, mask=m2, other=0.0).to(tl.float32)
    return acc * qscale


@triton.jit
def next_source(ks_next, vs_next, ksp, vsp, s, S, skss, svss, m2):
    """One step of the loop over the sources, software-pipelined by hand (Triton does not pipeline
    loads that feed no dot): source s's k/v tiles, loaded one step earlier, as fp32, and the loads
    of source s+1 issued now (the last step reloads source S-1, a cache hit).
    Returns (k_s, v_s, k_next, v_next)."""
    nxt = tl.minimum(s + 1, S - 1).to(tl.int64)  # times a source stride: may pass 2**31
    return (ks_next.to(tl.float32), vs_next.to(tl.float32),
            tl.load(ksp + nxt * skss, mask=m2, other=0.0), tl.load(vsp + nxt * svss, mask=m2, other=0.0))


@triton.jit
def mix_fwd_kernel(Q, K, V, KS, VS, VM, LSE, n_rows, T, Hk, S, qscale,
                   sqb, sqt, sqh, skb, skt, skh, svb, svt, svh,
                   sksb, skst, skss, sksh, svsb, svst, svss, svsh,
                   G: tl.constexpr, BLOCK_R: tl.constexpr, HEAD_DIM: tl.constexpr):
    """v_mixed and lse of BLOCK_R rows. qscale = scale / G. VM (B,T,Hk,d) and LSE (B*T*Hk,)
    contiguous; the inputs strided with unit last stride (row j's first query head is j*G)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = rows < n_rows
    m2 = ok[:, None]
    offs_d = tl.arange(0, HEAD_DIM)[None, :]
    qs = scaled_qbar(Q, rows, m2, offs_d, T, Hk, qscale, sqb, sqt, sqh, G, BLOCK_R, HEAD_DIM)
    kk = tl.load(K + row_offsets(rows, T, Hk, skb, skt, skh)[:, None] + offs_d, mask=m2, other=0.0).to(tl.float32)
    acc = tl.load(V + row_offsets(rows, T, Hk, svb, svt, svh)[:, None] + offs_d, mask=m2, other=0.0).to(tl.float32)
    m = tl.sum(qs * kk, 1)  # running max of the logits, starting with the own one
    den = tl.full([BLOCK_R], 1.0, dtype=tl.float32)
    ksp = KS + row_offsets(rows, T, Hk, sksb, skst, sksh)[:, None] + offs_d
    vsp = VS + row_offsets(rows, T, Hk, svsb, svst, svsh)[:, None] + offs_d
    # source 0 prefetched, then one source ahead (`next_source`); for S = 0 KS/VS stand for k/v,
    # loaded and unused
    ks_next = tl.load(ksp, mask=m2, other=0.0)
    vs_next = tl.load(vsp, mask=m2, other=0.0)
    for s in range(S):
        ks, vs, ks_next, vs_next = next_source(ks_next, vs_next, ksp, vsp, s, S, skss, svss, m2)
        logit = tl.sum(qs * ks, 1)
        m_new = tl.maximum(m, logit)
        c = tl.exp(m - m_new)
        p = tl.exp(logit - m_new)
        acc = acc * c[:, None] + p[:, None] * vs
        den = den * c + p
        m = m_new
    tl.store(VM + rows[:, None] * HEAD_DIM + offs_d, (acc / den[:, None]).to(VM.dtype.element_ty), mask=m2)
    tl.store(LSE + rows, m + tl.log(den), mask=ok)


@triton.jit
def mix_bwd_kernel(Q, K, V, KS, VS, DVM, LSE, DQ, DK, DV, DKS, DVS, n_rows, T, Hk, S, qscale,
                   sqb, sqt, sqh, skb, skt, skh, svb, svt, svh,
                   sksb, skst, skss, sksh, svsb, svst, svss, svsh, sdb, sdt, sdh,
                   sdqb, sdqt, sdqh, sdkb, sdkt, sdkh,
                   G: tl.constexpr, BLOCK_R: tl.constexpr, HEAD_DIM: tl.constexpr, SP: tl.constexpr,
                   ACCUM: tl.constexpr):
    """Gradients of BLOCK_R rows given dv_mixed (DVM, strided) and the forward's lse. DQ (B,T,Hq,d)
    and DK (B,T,Hk,d) strided (sdq*, sdk*): with ACCUM the mix's dq share and dk are added (in
    fp32, rounded once) to what they hold (the sequence attention's dq, dk), else written. DV
    (B,T,Hk,d), DKS/DVS (B,T,S,Hk,d) contiguous."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = rows < n_rows
    m2 = ok[:, None]
    offs_d = tl.arange(0, HEAD_DIM)[None, :]
    qs = scaled_qbar(Q, rows, m2, offs_d, T, Hk, qscale, sqb, sqt, sqh, G, BLOCK_R, HEAD_DIM)  # = scale * qbar
    lse = tl.load(LSE + rows, mask=ok, other=0.0)
    dvm = tl.load(DVM + row_offsets(rows, T, Hk, sdb, sdt, sdh)[:, None] + offs_d, mask=m2, other=0.0)
    dvm = dvm.to(tl.float32)
    kk = tl.load(K + row_offsets(rows, T, Hk, skb, skt, skh)[:, None] + offs_d, mask=m2, other=0.0).to(tl.float32)
    vv = tl.load(V + row_offsets(rows, T, Hk, svb, svt, svh)[:, None] + offs_d, mask=m2, other=0.0).to(tl.float32)
    own = rows[:, None] * HEAD_DIM + offs_d  # contiguous (B,T,Hk,d) offsets
    a0 = tl.exp(tl.sum(qs * kk, 1) - lse)
    ad0 = a0 * tl.sum(dvm * vv, 1)
    tl.store(DV + own, (a0[:, None] * dvm).to(DV.dtype.element_ty), mask=m2)
    delta = ad0
    acc_a = ad0[:, None] * kk  # sum_s alpha_s dalpha_s k_s
    acc_k = a0[:, None] * kk  # sum_s alpha_s k_s
    cols = tl.arange(0, SP)[None, :]
    al = tl.zeros([BLOCK_R, SP], dtype=tl.float32)
    adal = tl.zeros([BLOCK_R, SP], dtype=tl.float32)
    ksp = KS + row_offsets(rows, T, Hk, sksb, skst, sksh)[:, None] + offs_d
    vsp = VS + row_offsets(rows, T, Hk, svsb, svst, svsh)[:, None] + offs_d
    # contiguous (B,T,S,Hk,d): ((b*T + t)*S + s)*Hk*d + j*d
    src = ((rows // Hk) * S * Hk + rows % Hk)[:, None] * HEAD_DIM + offs_d
    ks_next = tl.load(ksp, mask=m2, other=0.0)  # prefetched one source ahead, as in the forward
    vs_next = tl.load(vsp, mask=m2, other=0.0)
    for s in range(S):
        ks, vs, ks_next, vs_next = next_source(ks_next, vs_next, ksp, vsp, s, S, skss, svss, m2)
        a = tl.exp(tl.sum(qs * ks, 1) - lse)
        ad = a * tl.sum(dvm * vs, 1)
        tl.store(DVS + src + s * Hk * HEAD_DIM, (a[:, None] * dvm).to(DVS.dtype.element_ty), mask=m2)
        delta += ad
        acc_a += ad[:, None] * ks
        acc_k += a[:, None] * ks
        sel = cols == s
        al = tl.where(sel, a[:, None], al)
        adal = tl.where(sel, ad[:, None], adal)
    dlog = adal - al * delta[:, None]  # [BLOCK_R, SP]: dlogit_s = alpha_s (dalpha_s - delta)
    dk = (ad0 - a0 * delta)[:, None] * qs
    dkp = DK + row_offsets(rows, T, Hk, sdkb, sdkt, sdkh)[:, None] + offs_d
    if ACCUM:
        dk += tl.load(dkp, mask=m2, other=0.0).to(tl.float32)
    tl.store(dkp, dk.to(DK.dtype.element_ty), mask=m2)
    for s in range(S):
        dl = tl.sum(tl.where(cols == s, dlog, 0.0), 1)
        tl.store(DKS + src + s * Hk * HEAD_DIM, (dl[:, None] * qs).to(DKS.dtype.element_ty), mask=m2)
    dq = (acc_a - delta[:, None] * acc_k) * qscale  # scale/G * sum_s dlogit_s k_s
    dqp = DQ + row_offsets(rows, T, Hk, sdqb, sdqt, G * sdqh)[:, None] + offs_d   # head j*G of row j
    for g in tl.static_range(G):
        dq_g = dq
        if ACCUM:
            dq_g += tl.load(dqp + g * sdqh, mask=m2, other=0.0).to(tl.float32)
        tl.store(dqp + g * sdqh, dq_g.to(DQ.dtype.element_ty), mask=m2)


# ------------------------------------------------------------------ launches
def unit_last_stride(t: torch.Tensor) -> torch.Tensor:
    """t itself when its last axis is contiguous (the kernels' vectorised loads need it), else a copy."""
    return t if t.stride(-1) == 1 else t.contiguous()


def source_args(k, v, k_src, v_src):
    """(k_src, v_src, their 8 strides) for a launch; k and v stand in (never read) when S = 0."""
    if k_src is None:
        k_src, v_src = k.unsqueeze(2), v.unsqueeze(2)
    return k_src, v_src, (*k_src.stride()[:4], *v_src.stride()[:4])


def mix_fwd(q, k, v, k_src, v_src, scale: float, shape: DAttnShape, block_r: int | None = None,
            num_warps: int | None = None):
    """The forward launch: (v_mixed (B,T,Hk,d) contiguous in v's dtype, lse (B*T*Hk,) float32).
    Inputs need a unit last stride; k_src = v_src = None for S = 0 (v_mixed is then a copy of v).
    block_r (a power of two) and num_warps override `mix_tiles` (for tile probes and tests)."""
    n_rows = shape.B * shape.T * shape.Hk
    vm = torch.empty((shape.B, shape.T, shape.Hk, shape.d), device=v.device, dtype=v.dtype)
    lse = torch.empty(n_rows, device=v.device, dtype=torch.float32)
    _FWD_LAUNCH(*fwd_launch(q, k, v, k_src, v_src, vm, lse, scale, shape, block_r, num_warps))
    return vm, lse


def fwd_launch(q, k, v, k_src, v_src, vm, lse, scale: float, shape: DAttnShape, block_r: int | None = None,
               num_warps: int | None = None):
    """(key, grid, args, meta) of `mix_fwd_kernel`'s launch for `CachedLaunch` (`launch_key`)."""
    n_rows = shape.B * shape.T * shape.Hk
    ks, vs, src_strides = source_args(k, v, k_src, v_src)
    tiles = mix_tiles(shape.d, shape.S, "fwd")
    block_r, warps = block_r or tiles[0], num_warps or tiles[1]
    tensors = (q, k, v, ks, vs, vm, lse)
    ints = (n_rows, shape.T, shape.Hk, shape.S, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *src_strides)
    meta = dict(G=shape.G, BLOCK_R=block_r, HEAD_DIM=shape.d, num_warps=warps)
    return (launch_key(tensors, ints, tuple(meta.values())), (cdiv(n_rows, block_r),),
            (*tensors, *ints[:4], scale / shape.G, *ints[4:]), lambda: meta)


def mix_bwd(dvm, q, k, v, k_src, v_src, lse, scale: float, shape: DAttnShape, block_r: int | None = None,
            num_warps: int | None = None, dq_into=None, dk_into=None):
    """The backward launch: (dq share (B,T,Hq,d), dk, dv, dk_src, dv_src), contiguous, in the
    inputs' dtype; dk_src = dv_src = None for S = 0. block_r / num_warps as in `mix_fwd`.
    dq_into, dk_into (both or neither; q's and k's shape and dtype, unit last stride): the mix's
    dq share and dk are added to them in place (the sequence attention's dq and dk: no separate
    gradient sum) and they are what is returned."""
    dvm = unit_last_stride(dvm)
    accum = dq_into is not None
    if accum != (dk_into is not None):
        raise ValueError("mix_bwd: give both dq_into and dk_into, or neither")
    if accum:
        for name, t, like in (("dq_into", dq_into, q), ("dk_into", dk_into, k)):
            if t.shape != like.shape or t.dtype != like.dtype or t.device != like.device or t.stride(-1) != 1:
                raise ValueError(f"mix_bwd: {name} must match {tuple(like.shape)} {like.dtype} on {like.device} "
                                 f"with a unit last stride, got {tuple(t.shape)} {t.dtype} stride {t.stride()}")
        dq, dk = dq_into, dk_into
    else:
        dq = torch.empty(q.shape, device=q.device, dtype=q.dtype)
        dk = torch.empty(k.shape, device=k.device, dtype=k.dtype)
    dv = torch.empty(v.shape, device=v.device, dtype=v.dtype)
    if k_src is None:
        dks = dvs = None
    else:
        dks = torch.empty(k_src.shape, device=k.device, dtype=k_src.dtype)
        dvs = torch.empty(v_src.shape, device=v.device, dtype=v_src.dtype)
    _BWD_LAUNCH(*bwd_launch(dvm, q, k, v, k_src, v_src, lse, dq, dk, dv, dks, dvs, scale, shape, block_r, num_warps,
                            accum))
    return dq, dk, dv, dks, dvs


def bwd_launch(dvm, q, k, v, k_src, v_src, lse, dq, dk, dv, dks, dvs, scale: float, shape: DAttnShape,
               block_r: int | None = None, num_warps: int | None = None, accum: bool = False):
    """(key, grid, args, meta) of `mix_bwd_kernel`'s launch for `CachedLaunch` (`launch_key`);
    dvm with a unit last stride; dks = dvs = None for S = 0 (dk, dv stand in, never written)."""
    n_rows = shape.B * shape.T * shape.Hk
    ks, vs, src_strides = source_args(k, v, k_src, v_src)
    if dks is None:
        dks, dvs = dk, dv
    tiles = mix_tiles(shape.d, shape.S, "bwd")
    block_r, warps = block_r or tiles[0], num_warps or tiles[1]
    tensors = (q, k, v, ks, vs, dvm, lse, dq, dk, dv, dks, dvs)
    ints = (n_rows, shape.T, shape.Hk, shape.S, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *src_strides,
            *dvm.stride()[:3], *dq.stride()[:3], *dk.stride()[:3])
    meta = dict(G=shape.G, BLOCK_R=block_r, HEAD_DIM=shape.d, SP=sources_pad(shape.S), ACCUM=accum, num_warps=warps)
    return (launch_key(tensors, ints, tuple(meta.values())), (cdiv(n_rows, block_r),),
            (*tensors, *ints[:4], scale / shape.G, *ints[4:]), lambda: meta)


def launch_key(tensors: tuple, ints: tuple, consts: tuple):
    """A `CachedLaunch` key fixing every specialisation Triton makes of a mix launch, or None
    (Triton's own path) unless every pointer is 16-byte aligned: the dtypes of all tensor
    arguments, the integer arguments' values (which fix their type, i32 or i64, and their
    classes: 1, a multiple of 16, other) and the constexprs and launch options. The one float
    argument (scale / G) is not specialised. With S = 0 the stand-in source tensors and their
    strides (k's and v's) are in it like any others, and S = 0 itself."""
    if not aligned16(*tensors):
        return None
    return tuple(t.dtype for t in tensors), ints, consts


_FWD_LAUNCH, _BWD_LAUNCH = CachedLaunch(mix_fwd_kernel), CachedLaunch(mix_bwd_kernel)


@torch.library.custom_op("moda_bench::depth_mix", mutates_args=())
def depth_mix_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_src: torch.Tensor, v_src: torch.Tensor,
                 scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused mix's forward as a torch custom op: (v_mixed (B,T,Hk,d), lse (B*T*Hk,) float32);
    S >= 1 (the S = 0 mix is v itself: no op)."""
    return _mix_forward(q, k, v, k_src, v_src, scale)


def _mix_forward(q, k, v, k_src, v_src, scale):
    shape = check_dattn_inputs(q, k, v, k_src, v_src, need_cuda=True)
    q, k, v, k_src, v_src = (unit_last_stride(t) for t in (q, k, v, k_src, v_src))
    return mix_fwd(q, k, v, k_src, v_src, scale, shape)


@depth_mix_op.register_fake
def _(q, k, v, k_src, v_src, scale):
    B, T, Hk, d = k.shape
    return v.new_empty((B, T, Hk, d)), v.new_empty((B * T * Hk,), dtype=torch.float32)


@torch.library.custom_op("moda_bench::depth_mix_bwd", mutates_args=())
def depth_mix_bwd_op(dvm: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_src: torch.Tensor,
                     v_src: torch.Tensor, lse: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor,
                                                                                    torch.Tensor, torch.Tensor,
                                                                                    torch.Tensor]:
    """The fused mix's backward as a torch custom op: (dq share, dk, dv, dk_src, dv_src), contiguous."""
    return _mix_grads(dvm, q, k, v, k_src, v_src, lse, scale)


def _mix_grads(dvm, q, k, v, k_src, v_src, lse, scale):
    shape = check_dattn_inputs(q, k, v, k_src, v_src, need_cuda=True)
    q, k, v, k_src, v_src = (unit_last_stride(t) for t in (q, k, v, k_src, v_src))
    return mix_bwd(dvm, q, k, v, k_src, v_src, lse, scale, shape)


@depth_mix_bwd_op.register_fake
def _(dvm, q, k, v, k_src, v_src, lse, scale):
    return tuple(torch.empty(t.shape, device=t.device, dtype=t.dtype) for t in (q, k, v, k_src, v_src))


def _mix_setup(ctx, inputs, output):
    q, k, v, k_src, v_src, scale = inputs
    ctx.save_for_backward(q, k, v, k_src, v_src, output[1])
    ctx.scale = scale
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)


def _mix_backward(ctx, dvm, _dlse):
    if dvm is None:
        return (None,) * 6
    q, k, v, k_src, v_src, lse = ctx.saved_tensors
    bwd = _mix_grads if getattr(ctx, "eager", False) else depth_mix_bwd_op
    return (*bwd(dvm, q, k, v, k_src, v_src, lse, ctx.scale), None)


depth_mix_op.register_autograd(_mix_backward, setup_context=_mix_setup)


class EagerMix(torch.autograd.Function):
    """The eager path of `depth_mix` (`oplib.through_ops`): the ops' implementations in an
    autograd Function. apply(q, k, v, k_src, v_src, scale) -> (v_mixed, lse), as `depth_mix_op`."""

    @staticmethod
    def forward(ctx, q, k, v, k_src, v_src, scale):
        out = _mix_forward(q, k, v, k_src, v_src, scale)
        _mix_setup(ctx, (q, k, v, k_src, v_src, scale), out)
        ctx.eager = True
        return out

    @staticmethod
    def backward(ctx, dvm, dlse):
        return _mix_backward(ctx, dvm, dlse)


def depth_mix(q, k, v, k_src=None, v_src=None, scale: float | None = None):
    """The depth mix alone through the fused Triton kernels (autograd-enabled): returns v_mixed
    (B,T,Hk,d) in v's dtype. q (B,T,Hq,d); k, v (B,T,Hk,d); k_src, v_src (B,T,S,Hk,d) or None;
    scale defaults to 1/sqrt(d). S = 0 returns v itself (no launch). Gradients flow to all five
    inputs; q's is the mix's share dqbar / G on each head of the group. CUDA tensors (or CPU ones
    under TRITON_INTERPRET=1); any strides (a non-unit last stride costs a copy): sources that are
    slices of one model-wide buffer are read in place. Under torch.compile it is the torch custom
    op `torch.ops.moda_bench.depth_mix` (fake implementation, autograd through `depth_mix_bwd`);
    eager calls take `EagerMix`, the same implementation (`oplib.through_ops`)."""
    if not torch.compiler.is_compiling():  # eager: the check's one-line errors (the op checks again)
        check_dattn_inputs(q, k, v, k_src, v_src, need_cuda=True)
    if k_src is None or k_src.shape[2] == 0:
        return v
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if through_ops():
        return depth_mix_op(q, k, v, k_src, v_src, scale)[0]
    return EagerMix.apply(q, k, v, k_src, v_src, scale)[0]
