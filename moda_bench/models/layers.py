"""The decoder's building blocks in plain PyTorch and the attention calls every variant shares.

RMSNorm, rotary embeddings (`rope_tables`, `apply_rope`), the SwiGLU FFN, the profiler ranges
the decoder labels its work with (`label`: free when no profiler records), and the sequence
attention of vanilla layers: `sequence_attention(device, dtype)` picks the fastest causal
attention that runs here (FlashAttention-4 where it runs, else SDPA: flash / cuDNN / efficient
kernels on the GPU, the math path on the CPU) and names it; `decode_attention` is its
counterpart over a KV cache (FA4's decode, else SDPA with the bottom-right causal mask).
"""
from __future__ import annotations

import contextlib
import functools
import math
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F
from torch.profiler import record_function


class RMSNorm(nn.Module):
    """x / rms(x) * weight over the last dimension: torch's `F.rms_norm` (one fused kernel where
    torch has one, its float accumulation for 16-bit inputs), not the eight elementwise ops and
    their backward nodes a hand-written form launches per norm, six norms a layer."""

    def __init__(self, dim: int, eps: float = 1e-5, dtype=None, device=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype, device=device))

    def forward(self, x):
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


RMS_EPS = 1e-6   # the parameter-free norms' eps (rms, Block AttnRes's key norm)


def rms(x, eps: float = RMS_EPS):
    """Parameter-free RMS normalisation over the last dimension (`F.rms_norm`)."""
    return F.rms_norm(x, x.shape[-1:], None, eps)


_QUIET = contextlib.nullcontext()


def label(name: str):
    """torch.profiler's record_function(name) while a profiler records (and under torch.compile),
    else a no-op context: a range is two dispatcher calls, host time an eager step would pay on
    every labelled range of every layer with nobody recording."""
    if torch.compiler.is_compiling() or torch.autograd._profiler_enabled():
        return record_function(name)
    return _QUIET


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x))."""

    def __init__(self, dim: int, hidden: int, dtype=None, device=None):
        super().__init__()
        kw = {"bias": False, "dtype": dtype, "device": device}
        self.gate = nn.Linear(dim, hidden, **kw)
        self.up = nn.Linear(dim, hidden, **kw)
        self.down = nn.Linear(hidden, dim, **kw)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


def rope_tables(positions: torch.Tensor, d: int, theta: float, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, signed sin (T, 1, d) of rotary embeddings (half-split layout) at the given positions:
    sin's first half negated, so that `apply_rope` rotates by a roll instead of rotate_half."""
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=positions.device, dtype=torch.float32) / d))
    ang = positions.float()[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)[:, None, :]
    sign = torch.ones(d, device=positions.device)
    sign[: d // 2] = -1
    return ang.cos().to(dtype), (ang.sin() * sign).to(dtype)


def apply_rope(x, cos, sin):
    """x (B, T, H, d) rotated: x * cos + rotate_half(x) * sin, with rotate_half(x) * sin written as
    roll(x, d/2) * signed sin (`rope_tables`): four kernels forward and four backward, where
    rotate_half's slices, negation and concatenation take five forward and nine backward."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin


def sdpa_causal(q, k, v):
    """Causal GQA attention through torch's SDPA on (B, H, T, d) views; q (B,T,Hq,d), k, v (B,T,Hk,d)."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                         scale=1.0 / math.sqrt(q.shape[-1]), enable_gqa=q.shape[2] != k.shape[2])
    return out.transpose(1, 2)


@functools.lru_cache(maxsize=None)
def _sequence_attention(device: torch.device, dtype: torch.dtype) -> tuple[Callable, str]:
    if device.type == "cuda":
        from moda_bench.kernels.moda.fa4.merge import FA4_DTYPES, fa4_attention, fa4_unavailable
        if dtype in FA4_DTYPES and fa4_unavailable(device) is None:
            return fa4_attention, "fa4"
        return sdpa_causal, "sdpa"
    return sdpa_causal, "sdpa-math"


def sequence_attention(device, dtype) -> tuple[Callable, str]:
    """(attention (q, k, v) -> out with autograd, its name) for vanilla layers on `device`."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return _sequence_attention(device, dtype)


def decode_attention(q, k_cache, v_cache, n: int):
    """The Tq new tokens q (B, Tq, Hq, d) against the first n cache positions (their own among
    them), bottom-right causal: FA4's decode where it runs, else SDPA."""
    from moda_bench.kernels.decode import fa4_decode, fa4_decode_unavailable, sdpa_decode
    kc, vc = k_cache[:, :n], v_cache[:, :n]
    if q.device.type == "cuda":
        if q.dtype in (torch.float16, torch.bfloat16) and fa4_decode_unavailable(q.device) is None:
            return fa4_decode(q, kc, vc)
        return sdpa_decode(q, kc, vc, "FLASH_ATTENTION" if q.dtype != torch.float32 else "EFFICIENT_ATTENTION")
    return sdpa_decode(q, kc, vc, "MATH")
