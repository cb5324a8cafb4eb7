"""Input checking shared by every MoDA implementation.

Layouts (spec section 1): q (B, T, Hq, d); k, v (B, T, Hk, d);
k_depth, v_depth (B, T, L, Hk, d) or both None (L = 0).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)
MAX_DEPTH = 512


@dataclass(frozen=True)
class MoDAShape:
    """The sizes of one MoDA call."""

    B: int
    T: int
    Hq: int
    Hk: int
    d: int
    L: int

    @property
    def G(self) -> int:
        return self.Hq // self.Hk


def _shape(t: torch.Tensor) -> str:
    return "(" + ", ".join(str(s) for s in t.shape) + ")"


def check_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_depth: torch.Tensor | None,
    v_depth: torch.Tensor | None,
    *,
    need_cuda: bool = False,
    dtypes: tuple = SUPPORTED_DTYPES,
    head_dims: tuple | None = SUPPORTED_HEAD_DIMS,
) -> MoDAShape:
    """Validate a MoDA call and return its sizes.

    Raises TypeError for non-tensors / unsupported dtypes and ValueError for bad shapes,
    each message naming the offending tensor, its shape and the expected one.
    """
    named = {"q": q, "k": k, "v": v}
    if (k_depth is None) != (v_depth is None):
        raise ValueError("k_depth and v_depth must both be given or both be None "
                         f"(got k_depth={'None' if k_depth is None else 'tensor'}, "
                         f"v_depth={'None' if v_depth is None else 'tensor'})")
    if k_depth is not None:
        named["k_depth"] = k_depth
        named["v_depth"] = v_depth
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in named.items():
        want = 5 if name.endswith("_depth") else 4
        layout = "(B, T, L, Hk, d)" if want == 5 else ("(B, T, Hq, d)" if name == "q" else "(B, T, Hk, d)")
        if t.dim() != want:
            raise ValueError(f"{name} must have rank {want} with layout {layout}, got shape {_shape(t)}")
    B, T, Hq, d = q.shape
    Bk, Tk, Hk, dk = k.shape
    if k.shape != v.shape:
        raise ValueError(f"v must have the shape of k {_shape(k)}, got {_shape(v)}")
    if (Bk, Tk, dk) != (B, T, d):
        raise ValueError(f"k must have shape (B={B}, T={T}, Hk, d={d}) to match q {_shape(q)}, got {_shape(k)}")
    if Hk == 0 or Hq % Hk != 0:
        raise ValueError(f"q heads Hq={Hq} must be a multiple of k heads Hk={Hk} (q {_shape(q)}, k {_shape(k)})")
    if T < 1 or B < 1 or Hq < 1:
        raise ValueError(f"q must have B, T, Hq >= 1, got {_shape(q)}")
    L = 0
    if k_depth is not None:
        if k_depth.shape != v_depth.shape:
            raise ValueError(f"v_depth must have the shape of k_depth {_shape(k_depth)}, got {_shape(v_depth)}")
        Bd, Td, L, Hd, dd = k_depth.shape
        if (Bd, Td, Hd, dd) != (B, T, Hk, d):
            raise ValueError(f"k_depth must have shape (B={B}, T={T}, L, Hk={Hk}, d={d}), got {_shape(k_depth)}")
        if L > MAX_DEPTH:
            raise ValueError(f"k_depth has L={L} depth entries; at most {MAX_DEPTH} are supported")
    for name, t in named.items():
        if t.dtype not in dtypes:
            raise TypeError(f"{name} has dtype {t.dtype}; supported: {', '.join(str(x) for x in dtypes)}")
        if t.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but q has {q.dtype}; all inputs must share one dtype")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
    if head_dims is not None and d not in head_dims:
        raise ValueError(f"head dim d={d} (last axis of q {_shape(q)}) is not supported; use one of {head_dims}")
    if need_cuda and q.device.type != "cuda":
        import os
        if os.environ.get("TRITON_INTERPRET", "0") != "1":
            raise ValueError(f"q is on {q.device}: the Triton kernel needs CUDA tensors "
                             "(or TRITON_INTERPRET=1 to run it on the CPU interpreter)")
    return MoDAShape(B=B, T=T, Hq=Hq, Hk=Hk, d=d, L=L)
