"""Registry of the implementations a sweep can time ("providers").

Adding one is one small function:

    @register_provider("my-impl", uses_depth=True, unavailable=needs_cuda)
    def _my_impl(inputs, point, chunk):
        q, k, v = inputs["q"], inputs["k"], inputs["v"]
        return Prepared(lambda: my_attention(q, k, v, inputs["k_depth"], inputs["v_depth"]),
                        impl_detail="what actually ran", depth_utilization=...)

`inputs` is `timing.make_inputs(...)` for the point (with L = 0 when uses_depth is False:
sequence-only baselines such as fa2 and cudnn run the same T, G, Hk, d without depth), `chunk`
is the query chunk C to pin (None: let the implementation choose). The function builds whatever
is reused across calls (configs, masks, compiled functions) and returns a `Prepared` whose
`forward()` returns out (B, T, Hq, d). Raise `ProviderSkip(reason)` when the point does not
apply; `unavailable(device)` returns a reason when the provider cannot run at all.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

from moda_bench.bench import decode_providers
from moda_bench.bench.provider_types import (
    DECODE,
    OPS,
    TRAIN,
    Prepared,
    Provider,
    ProviderSkip,
    UnknownProviderError,
    needs_cuda,
    needs_triton_op,
)

# fa4 / moda-fa4 / moda-fused need the optional flash-attn-4 (Hopper, Blackwell; moda-fused an sm90
# GPU): elsewhere their rows are skipped with the reason. moda-fused is here because it is the
# fastest MoDA at long T: the first command a user runs should show it.
DEFAULT_PROVIDERS = ["moda", "moda-fa4", "moda-fused", "fa2", "fa4", "fa2-triton", "cudnn", "flex"]
BASELINE = "fa2"


# training providers by name (tests swap in a copy); decode providers by name
_REGISTRY: dict[str, Provider] = {}
_DECODE_REGISTRY: dict[str, Provider] = {}
_optional_state: dict = {"loaded": False, "ladder_error": None}


def _table(op: str) -> dict:
    """The registry of op family `op` (read at call time, so a test's copy is the one used)."""
    if op not in OPS:
        raise ValueError(f"op must be one of {', '.join(OPS)}, got {op!r}")
    return _REGISTRY if op == TRAIN else _DECODE_REGISTRY


def op_of_pass(pass_: str) -> str:
    """The op family whose providers a pass times: decode for 'decode', else train."""
    return DECODE if pass_ == "decode" else TRAIN


def add_provider(provider: Provider, replace: bool = False) -> Provider:
    """Register a Provider object in its op family's registry."""
    table = _table(provider.op)
    if provider.name in table and not replace:
        raise ValueError(f"provider {provider.name!r} is already registered ({provider.op})")
    table[provider.name] = provider
    return provider


def register_provider(name: str, *, uses_depth: bool = True,
                      unavailable: Optional[Callable[[str], Optional[str]]] = None,
                      description: str = "", replace: bool = False, op: str = TRAIN, kind: str = "",
                      depth_axis: Optional[str] = "L", reference: Optional[Callable] = None):
    """Decorator registering `prepare(inputs, point, chunk) -> Prepared` under `name` (see
    provider_types.Provider for op, kind, depth_axis and reference)."""

    def deco(prepare):
        add_provider(Provider(name=name, prepare=prepare, uses_depth=uses_depth,
                              unavailable=unavailable or (lambda device: None),
                              description=description or (prepare.__doc__ or "").strip().split("\n")[0],
                              op=op, kind=kind, depth_axis=depth_axis, reference=reference), replace=replace)
        return prepare

    return deco


def unregister_provider(name: str, op: str = TRAIN) -> None:
    """Remove a provider (tests inject fakes and remove them again)."""
    _table(op).pop(name, None)


def _load_optional() -> None:
    """Register the ablation rungs of moda_bench.kernels.moda.ladder.table when that module is importable."""
    if _optional_state["loaded"]:
        return
    _optional_state["loaded"] = True
    try:
        from moda_bench.kernels.moda.ladder import table as ladder
    except ImportError as exc:
        _optional_state["ladder_error"] = f"{type(exc).__name__}: {exc}"
        return
    for rung in ladder.RUNGS:
        if rung.name not in _REGISTRY:
            _register_rung(rung)


def provider_names(op: str = TRAIN) -> list[str]:
    """All registered names of an op family (training: fixed providers first, then the ablation rungs)."""
    _load_optional()
    return list(_table(op))


def get_provider(name: str, op: str = TRAIN) -> Provider:
    _load_optional()
    table = _table(op)
    try:
        return table[name]
    except KeyError:
        hint = ""
        if op == TRAIN and _optional_state["ladder_error"]:
            hint = f" (ablation rungs not loaded: {_optional_state['ladder_error']})"
        what = "provider" if op == TRAIN else "decode provider"
        raise UnknownProviderError(f"unknown {what} {name!r}; known: {', '.join(table)}{hint}") from None


def resolve_providers(names, op: str = TRAIN) -> list[Provider]:
    """Providers of op family `op` for a list or comma string of names, in the given order
    (duplicates dropped)."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",")]
    names = [n for n in dict.fromkeys(n.strip() for n in names) if n]
    if not names:
        raise UnknownProviderError("no provider given")
    return [get_provider(n, op) for n in names]


# ---------------------------------------------------------------------------------------------
# availability checks
# ---------------------------------------------------------------------------------------------

_needs_moda_kernel = needs_triton_op("moda_bench.kernels.moda", "the MoDA kernel")


def _needs_sdpa_backend(backend: str) -> Callable[[str], Optional[str]]:
    def check(device: str) -> Optional[str]:
        try:
            from torch.nn.attention import SDPBackend  # noqa: F401
        except ImportError:
            return "torch.nn.attention.SDPBackend not available in this torch"
        if not hasattr(SDPBackend, backend):
            return f"SDPBackend.{backend} not available in this torch"
        if backend == "CUDNN_ATTENTION":
            import torch
            if not torch.backends.cudnn.is_available():
                return "cuDNN not available"
        return needs_cuda(device)
    return check


def _needs_flex(device: str) -> Optional[str]:
    try:
        from torch.nn.attention.flex_attention import BlockMask, flex_attention  # noqa: F401
    except ImportError as exc:
        return f"torch.nn.attention.flex_attention not available: {exc}"
    return needs_cuda(device)


# ---------------------------------------------------------------------------------------------
# providers
# ---------------------------------------------------------------------------------------------

def _moda_config(point, L: int, dtype, chunk: Optional[int], op: str = "moda"):
    """Config for moda_attention (op "moda") or moda_fa4 ("moda-fa4"): tuned/default via
    resolve_config, block_m (and the backward's q-major block, which chunks the depth pass of dq)
    pinned to `chunk` when given."""
    from moda_bench.kernels.moda import MoDAShape, check_config, resolve_config

    shape = MoDAShape(B=point.B, T=point.T, Hq=point.Hq, Hk=point.Hk, d=point.d, L=L)
    cfg = resolve_config(shape, dtype, op=op)
    if chunk is not None and (cfg.block_m, cfg.bwd_q_block_m) != (chunk, chunk):
        cfg = cfg.replace(block_m=chunk, bwd_q_block_m=chunk, depth_sub=0)  # depth_sub re-derived for C
    try:
        check_config(cfg, point.G)
    except ValueError as exc:
        raise ProviderSkip(f"C={chunk} not valid for G={point.G}: {exc}") if chunk is not None else exc
    return cfg


def depth_kw(point, L: int) -> dict:
    """The depth_grad argument of a MoDA call at `point`: none (the default, gradients on) unless
    the point detaches its depth K/V."""
    return {} if (point.depth_grad or not L) else {"depth_grad": False}


def _detail_depth(point, L: int) -> str:
    return ", depth detached" if (L and not point.depth_grad) else ""


def _moda_prepared(inputs, point, chunk, with_depth: bool) -> Prepared:
    from moda_bench.kernels.moda import depth_utilization, moda_attention

    q = inputs["q"]
    L = point.L if with_depth else 0
    cfg = _moda_config(point, L, q.dtype, chunk)
    kd, vd = (inputs["k_depth"], inputs["v_depth"]) if with_depth else (None, None)
    eta = depth_utilization(point.T, point.G, cfg.block_m, L, cfg) if L else float("nan")
    pinned = "pinned" if chunk is not None else "resolved"
    kw = depth_kw(point, L)
    return Prepared(lambda: moda_attention(q, inputs["k"], inputs["v"], kd, vd, config=cfg, **kw),
                    impl_detail=f"moda_attention block_m={cfg.block_m} ({pinned})" + ("" if L else ", L=0")
                    + _detail_depth(point, L), config=cfg.to_dict(), depth_utilization=eta)


@register_provider("moda-triton", unavailable=_needs_moda_kernel, description="fused Triton MoDA kernel")
def _moda_triton(inputs, point, chunk):
    return _moda_prepared(inputs, point, chunk, with_depth=True)


@register_provider("moda", unavailable=_needs_moda_kernel,
                   description="moda_attention as a user calls it: the fastest implementation for the shape and GPU")
def _moda(inputs, point, chunk):
    """The dispatcher (`moda_attention(impl="auto")`, kernels.moda.dispatch): its row's impl_detail
    names the implementation chosen and why, then that implementation's own detail, config and
    depth utilisation. A pinned C is the Triton kernel's block_m, so it runs Triton."""
    import torch

    from moda_bench.kernels.moda import MoDAShape, moda_attention
    from moda_bench.kernels.moda.dispatch import PROVIDER_OF, Choice, choose
    q = inputs["q"]
    shape = MoDAShape(B=point.B, T=point.T, Hq=point.Hq, Hk=point.Hk, d=point.d, L=point.L)
    kw = depth_kw(point, point.L)
    if chunk is not None:   # the Triton provider's forward: moda_attention with the pinned config
        choice = Choice("triton", f"C={chunk} pinned: the Triton kernel's block_m")
    else:
        choice = choose(shape, q.dtype, q.device, depth_grad=kw.get("depth_grad", True),
                        training=torch.is_grad_enabled() and q.requires_grad)
    inner = get_provider(PROVIDER_OF[choice.impl]).prepare(inputs, point, chunk)
    kd, vd = inputs["k_depth"], inputs["v_depth"]
    forward = inner.forward if chunk is not None else (
        lambda: moda_attention(q, inputs["k"], inputs["v"], kd, vd, **kw))
    return Prepared(forward, impl_detail=f"{choice.detail()}; {inner.impl_detail}",
                    config=dict(inner.config or {}, impl=choice.impl), depth_utilization=inner.depth_utilization)


def _sdpa_prepared(inputs, backend_name: str, label: str) -> Prepared:
    """SDPA restricted to one backend on (B, H, T, d) transposed views; GQA through enable_gqa,
    or repeat_interleave of k/v inside the timed call when the backend refuses enable_gqa."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, backend_name)
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    G = q.shape[2] // k.shape[2]

    def make(expand: bool):
        def forward():
            qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            kw = {}
            if G > 1 and expand:
                kt, vt = kt.repeat_interleave(G, dim=1), vt.repeat_interleave(G, dim=1)
            elif G > 1:
                kw["enable_gqa"] = True
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, **kw).transpose(1, 2)
        return forward

    forward, gqa = make(False), "enable_gqa" if G > 1 else "MHA"
    try:
        forward()  # probe (with autograd on, as timed): does the backend take this call?
    except (RuntimeError, TypeError):
        forward, gqa = make(True), "repeat_interleave (in timed call)"
        forward()  # a genuine failure raises here
    return Prepared(forward, impl_detail=f"{label}; GQA via {gqa}; sequence-only (no depth)")


@register_provider("fa2", uses_depth=False, unavailable=needs_cuda,
                   description="FlashAttention-2 (flash_attn package, else SDPA flash backend), no depth")
def _fa2(inputs, point, chunk):
    try:
        import flash_attn
        from flash_attn import flash_attn_func
    except ImportError:
        return _sdpa_prepared(inputs, "FLASH_ATTENTION", "SDPA FLASH_ATTENTION backend")
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    return Prepared(lambda: flash_attn_func(q, k, v, causal=True),
                    impl_detail=f"flash_attn.flash_attn_func {flash_attn.__version__}; sequence-only (no depth)")


@register_provider("fa2-triton", uses_depth=False, unavailable=_needs_moda_kernel,
                   description="the MoDA kernel with L=0 (its FlashAttention-2 Triton path)")
def _fa2_triton(inputs, point, chunk):
    return _moda_prepared(inputs, point, chunk, with_depth=False)


@register_provider("cudnn", uses_depth=False, unavailable=_needs_sdpa_backend("CUDNN_ATTENTION"),
                   description="SDPA cuDNN backend, no depth")
def _cudnn(inputs, point, chunk):
    return _sdpa_prepared(inputs, "CUDNN_ATTENTION", "SDPA CUDNN_ATTENTION backend")


@register_provider("flex", unavailable=_needs_flex,
                   description="MoDA through torch.compile'd flex_attention with a block mask")
def _flex(inputs, point, chunk):
    from moda_bench.kernels.moda.flex import block_mask_depth_utilization, make_moda_flex

    q = inputs["q"]
    block = 128
    # flex's Triton kernel addresses each batch's (Hk, T + T*L, d) key tensor with 32-bit
    # offsets: past 2**31 elements it reads out of bounds (seen on the H200 at T=65536, L=64:
    # an illegal memory access that kills the CUDA context), so such points are skipped.
    n_keys = point.T * (1 + point.L)
    if n_keys * point.Hk * point.d >= 2**31:
        raise ProviderSkip(f"flex_attention uses 32-bit offsets: Hk*(T+T*L)*d = {n_keys * point.Hk * point.d:,} "
                           ">= 2^31 elements per batch overflows them")
    fn = make_moda_flex(point.T, point.L, device=q.device, block_size=block)
    return Prepared(lambda: fn(q, inputs["k"], inputs["v"], inputs["k_depth"], inputs["v_depth"]),
                    impl_detail=f"flex_attention compiled, BlockMask {block}x{block} over T+T*L keys",
                    config={"block_size": block},
                    depth_utilization=block_mask_depth_utilization(point.T, point.L, block))


def _needs_fa4(device: str) -> Optional[str]:
    from moda_bench.kernels.moda.fa4 import merge as fa4
    return fa4.fa4_unavailable(device)


@register_provider("fa4", uses_depth=False, unavailable=_needs_fa4,
                   description="FlashAttention-4 (flash-attn-4, CuTe DSL), no depth")
def _fa4(inputs, point, chunk):
    from moda_bench.kernels.moda.fa4 import merge as fa4
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    return Prepared(lambda: fa4.fa4_attention(q, k, v),
                    impl_detail=f"flash_attn.cute.flash_attn_func {fa4.fa4_version()}; sequence-only (no depth)")


@register_provider("moda-fa4", unavailable=_needs_fa4,
                   description="MoDA on FlashAttention-4: FA4 sequence part + Triton depth part, LSE merge")
def _moda_fa4(inputs, point, chunk):
    from moda_bench.kernels.moda.fa4 import merge as fa4
    from moda_bench.kernels.moda.triton import interface as kernel
    q = inputs["q"]
    cfg = _moda_config(point, point.L, q.dtype, chunk, op="moda-fa4")
    eta = kernel.depth_utilization(point.T, point.G, cfg.depth_block_m, point.L, cfg.replace(fwd_depth="split")) \
        if point.L else math.nan
    kw = depth_kw(point, point.L)
    return Prepared(lambda: fa4.moda_fa4(q, inputs["k"], inputs["v"], inputs["k_depth"], inputs["v_depth"], config=cfg,
                                         **kw),
                    impl_detail=f"FA4 {fa4.fa4_version()} sequence + Triton depth-only kernel, LSE merge"
                    + _detail_depth(point, point.L), config=cfg.to_dict(), depth_utilization=eta)


def _overlap_prepared(inputs, point, chunk, fused: bool) -> Prepared:
    """moda-overlap (fused=False) or moda-fused (its forward as one FA4 sm90 kernel, fused_sm90)."""
    from moda_bench.kernels.moda import MoDAShape
    from moda_bench.kernels.moda.fa4 import merge as fa4
    from moda_bench.kernels.moda.fa4 import overlap
    from moda_bench.kernels.moda.triton import depth as kernel_depth
    if chunk is not None:
        raise ProviderSkip("C (block_m) does not apply: the depth items' rows are the overlap heuristic's"
                           + (", the fused forward's rows FA4's tiles" if fused else ""))
    q = inputs["q"]
    shape = MoDAShape(B=point.B, T=point.T, Hq=point.Hq, Hk=point.Hk, d=point.d, L=point.L)
    why = fa4.fused_fwd_unavailable(shape, q.dtype, q.device) if fused else None
    if why is not None:
        raise ProviderSkip(f"fused forward: {why}")
    kw = depth_kw(point, point.L)
    cfg = overlap.overlap_config(shape, q.dtype, q.device, depth_grad=kw.get("depth_grad", True)) if point.L else None
    if fused:
        cfg = cfg.replace(fa4_fused_fwd=True)
        eta = point.G / 64  # a depth product's useful rows: one position's G of a group's 64
        detail = (f"FA4 {fa4.fa4_version()} sm90 forward with the depth tiles inside (fused_sm90); backward FA4 + "
                  f"{cfg.bwd_depth_ctas} persistent depth programs ({cfg.bwd_depth_kernel})")
    else:
        eta = kernel_depth.utilization(point.G, point.L, cfg.depth_block_m) if point.L else math.nan
        progs = (f", {cfg.depth_ctas}/{cfg.bwd_depth_ctas} depth programs (backward: {cfg.bwd_depth_kernel})"
                 if cfg is not None else "")
        detail = f"FA4 {fa4.fa4_version()} sequence + persistent depth kernels beside it{progs}"
    return Prepared(lambda: overlap.moda_overlap(q, inputs["k"], inputs["v"], inputs["k_depth"], inputs["v_depth"],
                                                 config=cfg, **kw),
                    impl_detail=detail + _detail_depth(point, point.L), config=cfg.to_dict() if cfg is not None else {},
                    depth_utilization=eta)


@register_provider("moda-overlap", unavailable=_needs_fa4,
                   description="MoDA: FA4 sequence part + persistent depth kernels on a reserved share of the SMs")
def _moda_overlap(inputs, point, chunk):
    return _overlap_prepared(inputs, point, chunk, fused=False)


@register_provider("moda-fused", unavailable=_needs_fa4,
                   description="MoDA: one FA4 sm90 forward kernel with the depth tiles inside; moda-overlap's backward")
def _moda_fused(inputs, point, chunk):
    return _overlap_prepared(inputs, point, chunk, fused=True)


def _depth_sep_reference(q, k, v, k_depth, v_depth):
    import torch

    from moda_bench.kernels.moda.depth_sep import depth_sep_reference
    return depth_sep_reference(q, k, v, k_depth, v_depth, out_dtype=torch.float64)


@register_provider("depth-sep", unavailable=_needs_moda_kernel, reference=_depth_sep_reference,
                   description="variant (c): the fastest sequence attention + a separate Triton softmax over the "
                               "depth entries, added")
def _depth_sep(inputs, point, chunk):
    from moda_bench.kernels.dattn import sequence_backend
    from moda_bench.kernels.launch import next_pow2
    from moda_bench.kernels.moda.depth_sep import depth_sep_attention
    if chunk is not None:
        raise ProviderSkip("C (block_m) does not apply: the depth part reads one position per program, the "
                           "sequence part is the backend's own")
    if point.L and not point.depth_grad:
        raise ProviderSkip("depth detached (depth_grad off) is not implemented by depth-sep")
    q = inputs["q"]
    attention, name = sequence_backend(q.device, q.dtype)
    eta = point.G / max(16, next_pow2(point.G)) if point.L else math.nan   # useful rows of a depth product
    return Prepared(lambda: depth_sep_attention(q, inputs["k"], inputs["v"], inputs["k_depth"], inputs["v_depth"],
                                                attention=attention),
                    impl_detail=f"{name} sequence attention + Triton depth softmax (one position per program), "
                    "outputs added", config={"attention": name}, depth_utilization=eta)


# ---------------------------------------------------------------------------------------------
# Depth-Attention (seed 002): the depth entries of a point are its S source layers
# ---------------------------------------------------------------------------------------------

def _dattn_reference(q, k, v, k_src, v_src):
    from moda_bench.kernels.dattn import depth_attention_reference
    return depth_attention_reference(q, k, v, k_src, v_src)


def _mix_reference(q, k, v, k_src, v_src):
    from moda_bench.kernels.dattn import mix_reference
    return mix_reference(q, k, v, k_src, v_src)


_needs_dattn = needs_triton_op("moda_bench.kernels.dattn", "the Depth-Attention kernels")


def _dattn_prepared(inputs, point, mix: str, chain: bool = False) -> Prepared:
    """Depth-Attention with the given mix; chain: the Triton mix and the sequence backward in one
    autograd node where FA4 runs (the operator's default), else composed by autograd."""
    from moda_bench.kernels.dattn import chain_backend, depth_attention, sequence_backend
    q = inputs["q"]
    attention, name = sequence_backend(q.device, q.dtype)
    backend = chain_backend(q.device, q.dtype) if chain and point.S > 0 else None
    how = "one node, backward chained" if backend is not None else "composed by autograd"
    ks, vs = inputs["k_depth"], inputs["v_depth"]
    att = backend if backend is not None else attention
    return Prepared(lambda: depth_attention(q, inputs["k"], inputs["v"], ks, vs, mix=mix, attention=att),
                    impl_detail=f"depth mix ({'fused Triton kernel' if mix == 'triton' else 'plain PyTorch'}, "
                    f"S={point.S}) + {name}, {how}",
                    config={"mix": mix, "attention": name, "chained": backend is not None})


@register_provider("dattn", unavailable=_needs_dattn, kind="dattn", depth_axis="S", reference=_dattn_reference,
                   description="Depth-Attention: fused Triton depth mix + the fastest causal attention")
def _dattn(inputs, point, chunk):
    return _dattn_prepared(inputs, point, "triton", chain=True)


@register_provider("dattn-composed", unavailable=_needs_dattn, kind="dattn", depth_axis="S",
                   reference=_dattn_reference,
                   description="Depth-Attention: fused Triton depth mix + the fastest attention, composed by "
                               "autograd (what `dattn` chains into one node)")
def _dattn_composed(inputs, point, chunk):
    return _dattn_prepared(inputs, point, "triton")


@register_provider("dattn-torch", unavailable=_needs_dattn, kind="dattn", depth_axis="S",
                   reference=_dattn_reference,
                   description="Depth-Attention the seed's way: plain PyTorch depth mix + the same attention")
def _dattn_torch(inputs, point, chunk):
    return _dattn_prepared(inputs, point, "torch")


@register_provider("dattn-mix", unavailable=_needs_dattn, kind="mix", depth_axis="S", reference=_mix_reference,
                   description="the Depth-Attention mix kernel alone (mixed values out), against the copy rate")
def _dattn_mix(inputs, point, chunk):
    import torch

    from moda_bench.kernels.dattn import depth_mix
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    g = torch.Generator(device=q.device)
    g.manual_seed(12345)
    dv = torch.randn(v.shape, generator=g, device=q.device, dtype=torch.float32).to(v.dtype)
    return Prepared(lambda: depth_mix(q, k, v, inputs["k_depth"], inputs["v_depth"]),
                    impl_detail=f"fused Triton depth mix alone, S={point.S}", config={"mix": "triton"}, do=dv)


for _p in decode_providers.PROVIDERS:
    add_provider(_p)


def _register_rung(rung) -> None:
    """One ablation rung of moda_bench.kernels.moda.ladder.table as a provider named rung.name."""

    def prepare(inputs, point, chunk):
        C = point.C if chunk is None else chunk
        args = [inputs[n] for n in ("q", "k", "v", "k_depth", "v_depth")]
        eta = rung.depth_utilization(point.T, point.G, C, point.L) if point.L else math.nan
        return Prepared(lambda: rung.fn(*args, chunk=C), impl_detail=f"ladder rung {rung.name}, chunk={C}",
                        config={"chunk": C}, depth_utilization=float(eta))

    triton_rung = getattr(rung, "needs_cuda", rung.name != "naive-torch")
    own = getattr(rung, "unavailable", None) or (lambda device: None)

    def unavailable(device: str) -> Optional[str]:  # the MoDA kernel's check first, then the rung's own
        return (_needs_moda_kernel(device) if triton_rung else None) or own(device)

    register_provider(rung.name, unavailable=unavailable, description=f"ablation rung {rung.name}")(prepare)
