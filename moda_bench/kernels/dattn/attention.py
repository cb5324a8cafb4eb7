"""The composed Depth-Attention operator `depth_attention` and its sequence-attention backends.

Composition (the Depth-Attention paper's equations 2-4):
    v_mixed = DepthMix(q, k, v, k_src, v_src)     # fused Triton mix (mix="triton") or plain torch ("torch")
    out     = attention(q, k, v_mixed)            # causal GQA, queries, keys and mask unchanged
With the fused mix and a raw sequence backend (FA4's forward/backward pair, a
`SequenceBackend`: the default where FA4 runs) the two are ONE autograd node whose backward
chains them and adds the mix's dq/dk shares inside the mix kernel (`ops.dattn.chained`).
Otherwise autograd composes the two: the attention's dv is the mix's dv_mixed, q gets the
attention's dq plus the mix's dq share, k the attention's dk plus the mix's.

Sequence backends (`sequence_backend`): FlashAttention-4 (`fa4_attention`) when
`fa4_unavailable(device)` is None and the dtype is fp16/bf16, else this project's fused Triton
kernel with no depth (`moda_attention(q, k, v)`, L = 0), which also runs on the CPU under
TRITON_INTERPRET=1. `torch_causal_attention` is a plain-torch one for tests and CPU use.
"""
from __future__ import annotations

import functools
import math
from typing import Callable

import torch

from moda_bench.kernels.dattn.chained import chained_depth_attention
from moda_bench.kernels.dattn.mix_torch import depth_mix_torch
from moda_bench.kernels.dattn.mix_triton import depth_mix
from moda_bench.kernels.dattn.validate import check_dattn_inputs
from moda_bench.kernels.moda.fa4.merge import FA4_BACKEND, SequenceBackend, fa4_attention
from moda_bench.kernels.moda.triton.interface import moda_attention

MIXES = ("triton", "torch")
FA4_NAME = "fa4"
TRITON_NAME = "moda-triton"


def torch_causal_attention(q, k, v):
    """Causal GQA attention in plain torch (SDPA on (B,H,T,d) views, KV heads repeated for their G
    query heads), scale 1/sqrt(d), autograd-enabled: q (B,T,Hq,d), k, v (B,T,Hk,d) -> (B,T,Hq,d)."""
    G = q.shape[2] // k.shape[2]
    kr, vr = (x.repeat_interleave(G, dim=2).transpose(1, 2) for x in (k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), kr, vr, is_causal=True,
                                                           scale=1.0 / math.sqrt(q.shape[-1]))
    return out.transpose(1, 2)


@functools.lru_cache(maxsize=None)
def backend_for(device: torch.device, dtype: torch.dtype | None) -> tuple[Callable, str]:
    """`sequence_backend` for a normalised device (memoised: FA4's availability check reads
    package metadata and queries the driver)."""
    from moda_bench.kernels.moda import moda_attention
    from moda_bench.kernels.moda.fa4.merge import FA4_DTYPES, fa4_attention, fa4_unavailable
    if fa4_unavailable(device) is None and (dtype is None or dtype in FA4_DTYPES):
        return fa4_attention, FA4_NAME
    return moda_attention, TRITON_NAME


def chain_backend(device, dtype: torch.dtype | None = None):
    """The raw sequence backend (`SequenceBackend`) `depth_attention` chains the fused mix with by
    default: FA4's where `sequence_backend` picks FA4, else None (autograd composition)."""
    from moda_bench.kernels.moda.fa4.merge import FA4_BACKEND
    return FA4_BACKEND if sequence_backend(device, dtype)[1] == FA4_NAME else None


def sequence_backend(device=None, dtype: torch.dtype | None = None) -> tuple[Callable, str]:
    """The fastest available sequence attention for `device` (default: the current CUDA device,
    else the CPU) and, if given, the inputs' dtype: (callable (q, k, v) -> out with autograd, name).
    FA4 ("fa4") where it can run (sm90/sm100 GPU, flash-attn-4 importable, fp16/bf16), else the
    fused Triton kernel at L = 0 ("moda-triton"). The name is what the benchmark records."""
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return backend_for(device, dtype)


def depth_attention(q, k, v, k_src=None, v_src=None, *, scale: float | None = None, return_mixed: bool = False,
                    mix: str = "triton", attention: Callable | None = None):
    """Depth-Attention: a depth mix of the values across source layers, then causal GQA attention.

    q (B,T,Hq,d); k, v (B,T,Hk,d) of the current layer; k_src, v_src (B,T,S,Hk,d) the keys and
    the already mixed values of the S earlier source layers, or None (S = 0: plain causal
    attention, v_mixed = v). For each (b, t, KV head j): qbar = mean of its G query heads,
    alpha = softmax over [own, sources] of scale * <qbar, key> (scale: the depth softmax's,
    default 1/sqrt(d)), v_mixed = alpha_own v + sum_s alpha_s v_src[s]; then
    out = attention(q, k, v_mixed) (its own scale, 1/sqrt(d)).

    mix: "triton" (fused kernel, `depth_mix`) or "torch" (plain ops, `depth_mix_torch`).
    attention: a callable (q, k, v_mixed) -> out with autograd (composed with the mix by
    autograd); a `moda_bench.kernels.moda.fa4.merge.SequenceBackend` (raw forward/backward pair: with the
    Triton mix and S >= 1 one node whose backward chains the two, `ops.dattn.chained`; else its
    autograd-free pair is not usable and ValueError); or None: FA4's backend chained with the
    Triton mix where FA4 runs, else `sequence_backend(q.device, q.dtype)` composed.
    Returns out (B,T,Hq,d), or (out, v_mixed) with return_mixed (v_mixed (B,T,Hk,d) in v's
    dtype). Gradients flow to all five inputs. Bad input raises ValueError / TypeError naming
    the tensor and its shape.
    """
    if mix not in MIXES:
        raise ValueError(f"mix must be one of {', '.join(MIXES)}, got {mix!r}")
    raw = isinstance(attention, SequenceBackend)
    if attention is not None and not raw and not callable(attention):
        raise TypeError(f"attention must be a callable (q, k, v_mixed) -> out, a SequenceBackend or None, "
                        f"got {type(attention).__name__}")
    if not torch.compiler.is_compiling():  # eager: the check's one-line errors (the ops check again)
        check_dattn_inputs(q, k, v, k_src, v_src, need_cuda=mix == "triton")
    S = 0 if k_src is None else k_src.shape[2]
    if S == 0:
        k_src = v_src = None
    if raw and (mix != "triton" or S == 0):
        raise ValueError(f"attention={attention.name!r} (a raw SequenceBackend) chains with the Triton mix at "
                         f"S >= 1 only (here mix={mix!r}, S={S}); pass an autograd callable instead")
    default = default_backend_name(q.device, q.dtype) if attention is None else None
    if mix == "triton" and S > 0 and (raw or attention is None):
        backend = attention if raw else (FA4_BACKEND if default == FA4_NAME else None)
        if backend is not None:
            out, v_mixed = chained_depth_attention(q, k, v, k_src, v_src, backend, scale=scale)
            return (out, v_mixed) if return_mixed else out
    mixer = depth_mix if mix == "triton" else depth_mix_torch
    v_mixed = mixer(q, k, v, k_src, v_src, scale=scale)
    if attention is None:
        attention = fa4_attention if default == FA4_NAME else moda_attention
    out = attention(q, k, v_mixed)
    return (out, v_mixed) if return_mixed else out


@torch.compiler.assume_constant_result
def default_backend_name(device, dtype) -> str:
    """`sequence_backend`'s name for this device and dtype (a constant of a compiled graph)."""
    return sequence_backend(device, dtype)[1]
