"""MoDA on FlashAttention-4 (the "merge route"), and plain FA4 causal GQA attention.

Owns: `moda_fa4` (MoDA whose sequence part runs in FlashAttention-4's kernels and whose depth
part runs in this package's depth-only Triton launches), `fa4_attention` (sequence-only causal
GQA through `flash_attn.cute.flash_attn_func`, the `fa4` baseline), `fa4_unavailable` /
`fa4_version`, the pluggable sequence half (`SequenceBackend`, `FA4_BACKEND`, `TORCH_BACKEND`,
`check_backend_dtype`)
and the strided log-sum-exp merge kernel `fa4_merge_kernel`.

How `moda_fa4` computes (layouts as in `kernel`: q (B,T,Hq,d), k_depth (B,T,L,Hk,d)):
* forward: the sequence backend gives (o_s, lse_s) with lse in FA4's (B,Hq,T) layout; the
  split placement's depth-only launch (`moda_fwd(..., depth_only=True)`) gives the depth
  partial (o_d, lse_d), lse in our (B,T,Hq) layout; `fa4_merge_kernel` merges them into new tensors
  (never in place, see its docstring), writing the joint lse in both layouts.
* backward: FA4's backward called with the MERGED out and lse returns the sequence keys' exact
  dk, dv and their share of dq (it recomputes P = exp(S - lse) and D = rowsum(dO o) from what it
  is given). The depth part is the depth-only backward launch (`moda_bwd(..., depth_only=True,
  delta=...)`) with delta = rowsum(o * do) from `moda_bwd_delta_kernel`. dq = the sum of both.
  With `depth_grad=False` (or neither depth tensor requiring grad) that launch runs with
  DEPTH_GRAD=False: only the depth dq share, no dk_depth / dv_depth computed or allocated.
* placement: the config's `fwd_depth` / `bwd_depth` say whether the depth launch runs on a
  second CUDA stream concurrently with FA4 ("stream"; `depth_after` / `bwd_depth_after` pick
  which is issued first) or in order before it (every other value). L = 0 is FA4 alone.
flash_attn is imported lazily, so this module imports (and its torch backend runs, with the
Triton interpreter) on machines without FA4 or CUDA.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import triton
import triton.language as tl

from moda_bench.kernels.launch import CachedLaunch, aligned16, cdiv
from moda_bench.kernels.moda.config import MoDAConfig, check_config, pointer_block_l, resolve_config
from moda_bench.kernels.moda.fa4.seq_op import sequence_attention
from moda_bench.kernels.moda.triton.depth import depth_bwd, depth_fwd
from moda_bench.kernels.moda.triton.interface import (
    MERGE_BLOCK,
    Concurrent,
    launch_delta,
    moda_bwd,
    moda_fwd,
    pointer_bwd_config,
    wants_depth_grad,
)
from moda_bench.kernels.moda.triton.utils import lse_merge
from moda_bench.kernels.moda.validate import SUPPORTED_DTYPES, MoDAShape, check_inputs, cute_bwd_shape_problem
from moda_bench.kernels.oplib import register_backend, through_ops

FA4_DISTRIBUTION = "flash-attn-4"
FA4_DTYPES = (torch.float16, torch.bfloat16)
FA4_ARCH_MAJORS = (9, 10)  # sm90 (Hopper), sm100 (Blackwell)


# ------------------------------------------------------------------ availability
@functools.lru_cache(maxsize=None)
def _import_problem() -> Optional[str]:
    """Why `flash_attn.cute` (and its low-level functions) cannot be imported, or None."""
    try:
        from flash_attn.cute import flash_attn_func  # noqa: F401
        from flash_attn.cute.interface import _flash_attn_bwd, _flash_attn_fwd  # noqa: F401
    except Exception as exc:  # ImportError, or a broken CUDA/cutlass runtime underneath
        first = (str(exc).strip().splitlines() or [""])[0]
        return f"flash-attn-4 is not importable ({type(exc).__name__}: {first})"
    return None


def fa4_unavailable(device=None) -> Optional[str]:
    """One line saying why FlashAttention-4 cannot run on `device` (default: the current CUDA
    device): flash-attn-4 not installed or not importable, no CUDA, a non-CUDA device, or a GPU
    that is not sm90/sm100. None when it can run. Never raises. Answered once per device and
    process (what it reads does not change; the package metadata lookup alone is slow next to a
    short call, and moda_fa4 asks on every call)."""
    try:
        key = None if device is None else str(torch.device(device))
    except Exception as exc:  # a malformed device
        return f"cannot query the CUDA device {device!r} ({type(exc).__name__}: {exc})"
    if key is None or key == "cuda":
        key = f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cuda"
    return _fa4_unavailable_on(key)


@functools.lru_cache(maxsize=None)
def _fa4_unavailable_on(device: str) -> Optional[str]:
    from importlib import metadata
    try:
        metadata.version(FA4_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return f"{FA4_DISTRIBUTION} is not installed (pip install {FA4_DISTRIBUTION})"
    if not torch.cuda.is_available():
        return "FlashAttention-4 needs CUDA, which is not available"
    try:
        dev = torch.device(device)
        if dev.type != "cuda":
            return f"FlashAttention-4 needs a CUDA device, got {dev}"
        major, minor = torch.cuda.get_device_capability(dev)
        if major not in FA4_ARCH_MAJORS:
            return (f"FlashAttention-4 needs an sm90 or sm100 GPU; {torch.cuda.get_device_name(dev)} "
                    f"is sm{major}{minor}")
    except Exception as exc:  # a bad device index, a broken driver
        return f"cannot query the CUDA device {device!r} ({type(exc).__name__}: {exc})"
    return _import_problem()


def fa4_version() -> str:
    """The installed flash-attn-4 version (its distribution metadata; `flash_attn.cute.__version__`
    reads "0.0.0"). Raises importlib.metadata.PackageNotFoundError when it is not installed."""
    from importlib import metadata
    return metadata.version(FA4_DISTRIBUTION)


def _require_fa4(device) -> None:
    reason = fa4_unavailable(device)
    if reason is not None:
        raise RuntimeError(f"FlashAttention-4 unavailable: {reason}")


# ------------------------------------------------------------------ sequence backends
@dataclass(frozen=True)
class SequenceBackend:
    """The sequence half of `moda_fa4`: causal GQA attention over the T sequence keys.

    fwd(q, k, v, scale) -> (o, lse): o (B,T,Hq,d) in q's dtype, lse (B,Hq,T) float32 contiguous
        (natural log); `moda_fa4` merges them with the depth partial into new tensors.
    bwd(q, k, v, o, do, lse, scale) -> (dq, dk, dv): the exact gradients of the sequence keys
        given an EXTERNAL (o, lse) (the merged ones), P = exp(scale q.k - lse) and
        D = rowsum(do * o); dq is the sequence keys' share only.
    """

    name: str
    fwd: Callable
    bwd: Callable
    dtypes: tuple
    needs_fa4: bool = False

    def __post_init__(self):
        register_backend(self)   # found by name inside the custom ops (oplib.backend_of)


def _fa4_fwd(q, k, v, scale):
    from flash_attn.cute.interface import _flash_attn_fwd
    res = _flash_attn_fwd(q, k, v, softmax_scale=scale, causal=True, return_lse=True)
    return res[0], res[1]


def _fa4_bwd(q, k, v, o, do, lse, scale):
    from flash_attn.cute.interface import _flash_attn_bwd
    res = _flash_attn_bwd(q, k, v, o, do, lse, softmax_scale=scale, causal=True)
    return res[0], res[1], res[2]


def _torch_scores(q, k, scale):
    """fp32 causal scores (B,Hq,T,T) with the KV heads repeated for their G query heads."""
    G = q.shape[2] // k.shape[2]
    qh = q.float().transpose(1, 2)
    kh = k.float().repeat_interleave(G, dim=2).transpose(1, 2)
    s = torch.matmul(qh, kh.transpose(-1, -2)) * scale
    T = q.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    return s.masked_fill(~causal, float("-inf")), causal


def _torch_fwd(q, k, v, scale):
    G = q.shape[2] // k.shape[2]
    s, _ = _torch_scores(q, k, scale)
    lse = torch.logsumexp(s, dim=-1)
    vh = v.float().repeat_interleave(G, dim=2).transpose(1, 2)
    o = torch.matmul(torch.exp(s - lse[..., None]), vh)
    return o.transpose(1, 2).to(q.dtype).contiguous(), lse.contiguous()


def _torch_bwd(q, k, v, o, do, lse, scale):
    B, T, Hq, d = q.shape
    Hk = k.shape[2]
    G = Hq // Hk
    s, causal = _torch_scores(q, k, scale)
    p = torch.exp(s - lse.float()[..., None]).masked_fill(~causal, 0.0)  # B,Hq,T,T
    doh = do.float().transpose(1, 2)
    vh = v.float().repeat_interleave(G, dim=2).transpose(1, 2)
    kh = k.float().repeat_interleave(G, dim=2).transpose(1, 2)
    delta = (do.float() * o.float()).sum(-1).transpose(1, 2)  # B,Hq,T
    ds = p * (torch.matmul(doh, vh.transpose(-1, -2)) - delta[..., None])
    dq = torch.matmul(ds, kh) * scale
    dk = torch.matmul(ds.transpose(-1, -2), q.float().transpose(1, 2)) * scale  # B,Hq,T,d
    dv = torch.matmul(p.transpose(-1, -2), doh)

    def per_kv_head(x):  # B,Hq,T,d -> B,T,Hk,d summing each KV head's G query heads
        return x.view(B, Hk, G, T, d).sum(2).transpose(1, 2)

    return (dq.transpose(1, 2).to(q.dtype).contiguous(), per_kv_head(dk).to(k.dtype).contiguous(),
            per_kv_head(dv).to(v.dtype).contiguous())


FA4_BACKEND = SequenceBackend("fa4", _fa4_fwd, _fa4_bwd, FA4_DTYPES, needs_fa4=True)
# Plain-torch fp32 causal GQA with FA4's contract (materialises (B,Hq,T,T)): for tests, any device.
TORCH_BACKEND = SequenceBackend("torch", _torch_fwd, _torch_bwd, SUPPORTED_DTYPES)


# ------------------------------------------------------------------ merge kernel
@triton.jit
def fa4_merge_kernel(O1, LSE_HT1, OD, LSED, O, LSE_HT, LSE_TH, n_rows, T, Hq, HEAD_DIM: tl.constexpr,
                     BLOCK: tl.constexpr):
    """Merge the sequence partial (O1, LSE_HT1) with the depth partial (OD, LSED) by log-sum-exp
    into buffers of their own: the merged output O and lse in both layouts, LSE_HT (B,Hq,T; FA4's)
    and LSE_TH (B,T,Hq). Rows are the flattened (b, t, h) of O1/OD/O (B,T,Hq,d) and LSED, all
    contiguous. Never in place: merged into O1, a program's threads stored some rows before others
    had loaded them (Triton 3.6 gave the load and the store different thread layouts; H100,
    T=32768: 8-84 rows in groups of 4 heads differed from run to run, `experiments/overlap_check.py --lse`)."""
    rows = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)  # rows * d may pass 2**31
    ok = rows < n_rows
    b = rows // (T * Hq)
    t = (rows // Hq) % T
    h = rows % Hq
    ht = b * (Hq * T) + h * T + t
    offs_d = tl.arange(0, HEAD_DIM)
    l1 = tl.load(LSE_HT1 + ht, mask=ok, other=0.0)
    l2 = tl.load(LSED + rows, mask=ok, other=0.0)
    a1, a2, lse = lse_merge(l1, l2)
    optr = rows[:, None] * HEAD_DIM + offs_d[None, :]
    o1 = tl.load(O1 + optr, mask=ok[:, None], other=0.0).to(tl.float32)
    o2 = tl.load(OD + optr, mask=ok[:, None], other=0.0).to(tl.float32)
    o = o1 * a1[:, None] + o2 * a2[:, None]
    tl.store(O + optr, o.to(O.dtype.element_ty), mask=ok[:, None])
    tl.store(LSE_HT + ht, lse, mask=ok)
    tl.store(LSE_TH + rows, lse, mask=ok)


# Programs of the "persist" depth launches when the config leaves depth_ctas / bwd_depth_ctas at 0
PERSIST_PROGRAMS = 16


def persist_programs(ctas: int, device) -> int:
    """The "persist" placement's program count: the config's cap, else PERSIST_PROGRAMS (4 off CUDA)."""
    if ctas > 0:
        return ctas
    return PERSIST_PROGRAMS if device.type == "cuda" else 4


def _merge(o1, lse_ht1, od, lsed):
    """(o, lse (B,Hq,T), lse (B,T,Hq)): the merged output and lse, in new tensors."""
    B, T, Hq, d = o1.shape
    n_rows = B * T * Hq
    o, lse_ht, lse_th = torch.empty_like(o1), torch.empty_like(lse_ht1), torch.empty_like(lsed)
    ok = aligned16(o1, lse_ht1, od, lsed)  # the launch key's condition (every other tensor allocated here)
    key = (o1.dtype, od.dtype, lse_ht1.dtype, lsed.dtype, n_rows, T, Hq, d) if ok else None
    _FA4_MERGE(key, (cdiv(n_rows, MERGE_BLOCK),), (o1, lse_ht1, od, lsed, o, lse_ht, lse_th, n_rows, T, Hq),
               lambda: dict(HEAD_DIM=d, BLOCK=MERGE_BLOCK))
    return o, lse_ht, lse_th


_FA4_MERGE = CachedLaunch(fa4_merge_kernel)


# ------------------------------------------------------------------ side stream
def _beside(device, main_fn, side_fn, concurrent: bool, side_after: bool, high_priority: bool = False):
    """(main_fn(), side_fn()). With `concurrent` on CUDA, side_fn's launches go to a second
    stream (`kernel.side_stream`, at the highest priority with `high_priority`), ordered after
    the main stream's earlier work and concurrent with main_fn's (issued after main_fn when
    side_after, else before); on return the main stream waits for them. Otherwise both run in
    order on the current stream, side_fn first unless side_after."""
    if not concurrent or device.type != "cuda":
        if side_after:
            m = main_fn()
            return m, side_fn()
        s = side_fn()
        return main_fn(), s
    conc = Concurrent(device, high_priority)
    m = main_fn() if side_after else None
    with conc:
        s = side_fn()
    if not side_after:
        m = main_fn()
    conc.join()
    for t in s:  # allocated on the side stream, used and freed on the main one
        if isinstance(t, torch.Tensor):
            t.record_stream(conc.main)
    return m, s


# ------------------------------------------------------------------ autograd
def fused_fwd_unavailable(shape: MoDAShape, dtype, device=None) -> Optional[str]:
    """Why `MoDAConfig.fa4_fused_fwd` cannot run this shape here (None: it can): the fused
    forward (`fused_sm90`) is FA4's sm90 kernel with the depth tiles of whole positions inside
    each 64-row consumer group, so it needs FA4, an sm_90 GPU, L >= 1, G dividing 64, d 64 or
    128 and fp16/bf16."""
    return fused_shape_problem(shape, dtype) or fa4_unavailable(device) or _sm90_problem(device)


def fused_shape_problem(shape: MoDAShape, dtype) -> Optional[str]:
    """The shape or dtype part of `fused_fwd_unavailable` (what no machine changes), or None."""
    if shape.L < 1:
        return "L = 0 has no depth tiles (FA4 alone)"
    if 64 % shape.G:
        return f"G={shape.G} does not divide 64 (a consumer group's 64 rows must be whole positions)"
    if shape.d not in (64, 128):
        return f"head size d={shape.d}: the fused forward is built for d = 64 and 128"
    if dtype not in (torch.float16, torch.bfloat16):
        return f"dtype {dtype}: the fused forward takes fp16/bf16"
    return None


def cute_bwd_unavailable(shape: MoDAShape, dtype, device=None) -> Optional[str]:
    """Why the "persist" backward cannot run its depth part as the CuTe kernel
    (`depth_bwd_sm90`, `MoDAConfig.bwd_depth_kernel="cute"`) here (None: it can): it needs FA4's
    CuTe DSL, an sm_90 GPU and `cute_bwd_shape_problem`'s shapes. moda_fa4 then runs Triton's."""
    return (cute_bwd_shape_problem(shape, dtype) or fa4_unavailable(device)
            or _sm90_problem(device, "the CuTe depth backward"))


def _sm90_problem(device, kernel: str = "the fused forward") -> Optional[str]:
    idx = torch.device(device if device is not None else "cuda").index
    if torch.cuda.get_device_capability(idx if idx is not None else torch.cuda.current_device())[0] != 9:
        return f"{kernel} is an sm_90 (Hopper) kernel"
    return None


def _fused_forward(q, k, v, kd, vd, scale, shape: MoDAShape):
    """The forward as one kernel (MoDAConfig.fa4_fused_fwd): o, lse (B,Hq,T), lse (B,T,Hq).
    FA4 itself was checked by `moda_fa4` (its backend needs FA4); only the shape and the GPU
    generation are checked here, not the package metadata again on every call."""
    why = fused_shape_problem(shape, q.dtype) or _sm90_problem(q.device)
    if why is not None:
        raise ValueError(f"MoDAConfig.fa4_fused_fwd: {why}")
    from moda_bench.kernels.moda.cute.fwd_sm90 import moda_fused_sm90_fwd
    o, lse_ht = moda_fused_sm90_fwd(q, k, v, kd, vd, scale)
    return o, lse_ht, lse_ht.transpose(1, 2).contiguous()


def _forward(q, k, v, kd, vd, scale, shape: MoDAShape, cfg: MoDAConfig, backend: SequenceBackend):
    """(o, lse (B,Hq,T), lse (B,T,Hq)) of the joint softmax; the last is a view when L == 0."""
    if shape.L == 0:
        o, lse_ht = backend.fwd(q, k, v, scale)
        return o, lse_ht, lse_ht.transpose(1, 2)
    if cfg.fa4_fused_fwd:
        if not backend.needs_fa4:
            raise ValueError(f"MoDAConfig.fa4_fused_fwd runs FA4's own kernel; the {backend.name} backend cannot")
        return _fused_forward(q, k, v, kd, vd, scale, shape)
    if cfg.fwd_depth == "persist":  # the streaming depth kernel on its share of the SMs, beside the sequence
        def depth():
            return depth_fwd(q, kd, vd, scale, shape.G, persist_programs(cfg.depth_ctas, q.device),
                             block_m=cfg.depth_block_m, stages=cfg.depth_stages, num_warps=cfg.depth_warps)
        side = True
    else:
        depth_cfg = cfg.replace(fwd_depth="split")
        if cfg.fwd_depth == "tma":  # moda's descriptor forward: its block_l is per position; keep the depth
            depth_cfg = depth_cfg.replace(block_l=pointer_block_l(shape.L))  # launch's own default

        def depth():
            return moda_fwd(q, k, v, kd, vd, scale, shape, depth_cfg, depth_only=True)
        side = cfg.fwd_depth == "stream"
    (o, lse_ht), (od, lsed) = _beside(q.device, lambda: backend.fwd(q, k, v, scale), depth, side, cfg.depth_after,
                                      cfg.side_priority)
    return _merge(o, lse_ht, od, lsed)


def _backward(do, q, k, v, kd, vd, o, lse_ht, lse_th, scale, shape, cfg, backend, depth_grad=True):
    if shape.L == 0:
        dq, dk, dv = backend.bwd(q, k, v, o, do, lse_ht, scale)
        return dq, dk, dv, None, None
    if cfg.bwd_depth == "persist":  # the streaming depth kernel (delta per item) beside the sequence backward
        programs = persist_programs(cfg.bwd_depth_ctas, q.device)
        if cfg.bwd_depth_kernel == "cute" and cute_bwd_unavailable(shape, q.dtype, q.device) is None:
            from moda_bench.kernels.moda.cute.bwd_depth_sm90 import depth_bwd_sm90

            def depth():
                return depth_bwd_sm90(do, q, o, lse_th, kd, vd, scale, shape.G, programs, depth_grad=depth_grad)
        else:
            def depth():
                return depth_bwd(do, q, o, lse_th, kd, vd, scale, shape.G, programs, depth_grad=depth_grad,
                                 block_m=cfg.bwd_depth_block_m, stages=cfg.bwd_depth_stages,
                                 num_warps=cfg.bwd_depth_warps)
        side = True
    else:
        # moda's "tma" backward: the pointer default's placement, block_l and stages, not the dq pass's
        pcfg = pointer_bwd_config(cfg, shape.T, shape.L)
        depth_cfg = pcfg.replace(bwd_depth="split")
        side = pcfg.bwd_depth == "stream"

        def depth():
            delta = torch.empty_like(lse_th)
            launch_delta(o, do, delta, shape.d)
            dq_d, _, _, dkd, dvd = moda_bwd(do, q, k, v, kd, vd, o, lse_th, scale, shape, depth_cfg, depth_only=True,
                                            delta=delta, depth_grad=depth_grad)
            return dq_d, dkd, dvd

    (dq, dk, dv), (dq_d, dkd, dvd) = _beside(q.device, lambda: backend.bwd(q, k, v, o, do, lse_ht, scale), depth,
                                             side, cfg.bwd_depth_after, cfg.side_priority)
    dq.add_(dq_d)
    return dq, dk, dv, dkd, dvd


class MoDAFA4Function(torch.autograd.Function):
    """apply(q, k, v, kd, vd, scale, shape, cfg, backend[, depth_grad]) -> (o, lse (B,T,Hq)); inputs
    contiguous, kd = vd = None when L == 0. depth_grad=False: no gradients for kd, vd (None)."""

    @staticmethod
    def forward(ctx, q, k, v, kd, vd, scale, shape, cfg, backend, depth_grad=True):
        o, lse_ht, lse_th = _forward(q, k, v, kd, vd, scale, shape, cfg, backend)
        ctx.save_for_backward(q, k, v, kd, vd, o, lse_ht, lse_th)
        ctx.scale, ctx.shape, ctx.cfg, ctx.backend = scale, shape, cfg, backend
        ctx.depth_grad = depth_grad
        ctx.mark_non_differentiable(lse_th)
        ctx.set_materialize_grads(False)  # no zero-filled tensor for lse's gradient at every backward
        return o, lse_th

    @staticmethod
    def backward(ctx, do, _dlse):
        if do is None:  # only lse (not differentiable) reached the loss
            return (None,) * 10
        q, k, v, kd, vd, o, lse_ht, lse_th = ctx.saved_tensors
        grads = _backward(do.contiguous(), q, k, v, kd, vd, o, lse_ht, lse_th, ctx.scale, ctx.shape, ctx.cfg,
                          ctx.backend, wants_depth_grad(ctx, ctx.depth_grad))
        return (*grads, None, None, None, None, None)


# ------------------------------------------------------------------ public entry points
def check_backend_dtype(q, backend: SequenceBackend, what: str) -> None:
    """ValueError naming `what` when q's dtype is not one `backend` takes."""
    if q.dtype not in backend.dtypes:
        raise ValueError(f"{what}: the {backend.name} sequence backend takes "
                         f"{', '.join(str(t) for t in backend.dtypes)} inputs; q has {q.dtype}")


def moda_fa4(q, k, v, k_depth=None, v_depth=None, *, scale: float | None = None, config: MoDAConfig | None = None,
             return_lse: bool = False, backend: SequenceBackend | None = None, depth_grad: bool = True):
    """Mixture-of-Depths Attention with FlashAttention-4 for the sequence part (autograd-enabled).

    Same contract as `moda_attention`: q (B,T,Hq,d); k, v (B,T,Hk,d); k_depth, v_depth
    (B,T,L,Hk,d) or None (L = 0: causal GQA, FA4 alone). Returns out (B,T,Hq,d) in q's dtype,
    and lse (B,T,Hq) float32 (natural log) when return_lse. FA4 takes fp16/bf16 only (ValueError
    for float32). `config` sets the depth launches' tiles and placement (module docstring);
    without it, `resolve_config(op="moda-fa4")`: its own tuned entries (`moda-bench tune --op
    moda-fa4`), else what `moda_attention` would run. `backend` replaces FA4 for
    the sequence half (tests: `TORCH_BACKEND`, which also takes float32 and CPU tensors under
    TRITON_INTERPRET=1). Gradients flow to all five inputs, unless depth_grad=False: then
    k_depth, v_depth are constants (detached; .grad stays None, no dk_depth / dv_depth computed
    or allocated), exactly as for `moda_attention`; the same backward runs automatically when
    neither requires grad.
    """
    backend = FA4_BACKEND if backend is None else backend
    shape = check_inputs(q, k, v, k_depth, v_depth, need_cuda=True)
    check_backend_dtype(q, backend, "moda_fa4")
    if backend.needs_fa4:
        if q.device.type != "cuda":
            raise ValueError(f"q is on {q.device}: FlashAttention-4 needs CUDA tensors")
        _require_fa4(q.device)
    if shape.L == 0:
        k_depth = v_depth = None
    cfg = resolve_config(shape, q.dtype, config, op="moda-fa4")
    check_config(cfg, shape.G)
    scale = 1.0 / math.sqrt(shape.d) if scale is None else float(scale)
    q, k, v, k_depth, v_depth = (None if t is None else t.contiguous() for t in (q, k, v, k_depth, v_depth))
    if not depth_grad and k_depth is not None:  # constants: no graph edge back to their producers
        k_depth, v_depth = k_depth.detach(), v_depth.detach()
    o, lse = MoDAFA4Function.apply(q, k, v, k_depth, v_depth, scale, shape, cfg, backend, bool(depth_grad))
    return (o, lse) if return_lse else o


def fa4_attention(q, k, v, *, scale: float | None = None):
    """Causal GQA attention through FlashAttention-4's `flash_attn_func` (autograd-enabled):
    q (B,T,Hq,d), k, v (B,T,Hk,d), fp16/bf16 CUDA tensors, d a multiple of 8 in [8, 256].
    Returns out (B,T,Hq,d). Under torch.compile (`oplib.through_ops`) it calls the custom op
    `seq_op.sequence_attention` with FA4's raw forward and backward (dynamo cannot trace into
    `flash_attn_func`); the inputs are then checked by FA4 itself when the op runs."""
    if through_ops():
        return sequence_attention(q, k, v, FA4_BACKEND, scale=scale)
    shape = check_inputs(q, k, v, None, None, head_dims=None)
    check_backend_dtype(q, FA4_BACKEND, "fa4_attention")
    if q.device.type != "cuda":
        raise ValueError(f"q is on {q.device}: FlashAttention-4 needs CUDA tensors")
    if shape.d % 8 or not 8 <= shape.d <= 256:
        raise ValueError(f"head dim d={shape.d} (q {tuple(q.shape)}): FlashAttention-4 takes multiples of 8 "
                         "in [8, 256]")
    _require_fa4(q.device)
    from flash_attn.cute import flash_attn_func
    res = flash_attn_func(q, k, v, softmax_scale=scale, causal=True)
    return res[0] if isinstance(res, tuple) else res
