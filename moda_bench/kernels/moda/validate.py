"""Input checking shared by every MoDA implementation, and the shapes a specialised kernel takes
(`cute_bwd_shape_problem`: the CuTe depth backward, kept here so that it is known without cutlass),
and the check of a caller's depth gradient buffer (`check_depth_grad_into`, the backward's option).

Layouts (spec section 1): q (B, T, Hq, d); k, v (B, T, Hk, d);
k_depth, v_depth (B, T, L, Hk, d) or both None (L = 0).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from moda_bench.kernels.checks import (
    CheckMemo,
    check_cuda,
    check_depth_pair,
    check_dtypes_devices,
    check_head_dim,
    shape_str,
)

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
    each message naming the offending tensor, its shape and the expected one. A call with the
    shapes, dtypes, devices and options of one that passed before returns its answer from a memo
    (every operator call checks its inputs: about a third of the checks' host time).
    """
    return _MEMO.check(_check_inputs, q, k, v, k_depth, v_depth, need_cuda, dtypes, head_dims)


_MEMO = CheckMemo()  # check_inputs' passing calls


def _check_inputs(q, k, v, k_depth, v_depth, need_cuda, dtypes, head_dims) -> MoDAShape:
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
            raise ValueError(f"{name} must have rank {want} with layout {layout}, got shape {shape_str(t)}")
    B, T, Hq, d = q.shape
    Bk, Tk, Hk, dk = k.shape
    if k.shape != v.shape:
        raise ValueError(f"v must have the shape of k {shape_str(k)}, got {shape_str(v)}")
    if (Bk, Tk, dk) != (B, T, d):
        raise ValueError(f"k must have shape (B={B}, T={T}, Hk, d={d}) to match q {shape_str(q)}, got {shape_str(k)}")
    if Hk == 0 or Hq % Hk != 0:
        raise ValueError(f"q heads Hq={Hq} must be a multiple of k heads Hk={Hk} (q {shape_str(q)}, k {shape_str(k)})")
    if T < 1 or B < 1 or Hq < 1:
        raise ValueError(f"q must have B, T, Hq >= 1, got {shape_str(q)}")
    L = check_depth_pair(k_depth, v_depth, {"B": B, "T": T}, Hk, d, MAX_DEPTH)
    check_dtypes_devices(named, q, dtypes)
    check_head_dim(q, head_dims)
    check_cuda(q, need_cuda)
    return MoDAShape(B=B, T=T, Hq=Hq, Hk=Hk, d=d, L=L)


def cute_bwd_shape_problem(shape: MoDAShape, dtype) -> str | None:
    """The shapes `depth_bwd_sm90` takes: L >= 1, G dividing 16 (a warp's 16 rows are whole
    positions), d = 64, fp16/bf16, and every element offset within a signed 32-bit integer."""
    if shape.L < 1:
        return "L = 0 has no depth part"
    if shape.G > 16 or 16 % shape.G:
        return f"G={shape.G} does not divide 16 (a warp's 16 rows must be whole positions)"
    if shape.d != 64:
        return f"head size d={shape.d}: the CuTe depth backward is built for d = 64"
    if dtype not in (torch.float16, torch.bfloat16):
        return f"dtype {dtype}: the CuTe depth backward takes fp16/bf16"
    if max(shape.B * shape.T * shape.L * shape.Hk, shape.B * shape.T * shape.Hq) * shape.d > 2 ** 31:
        return "the CuTe depth backward indexes with 32-bit offsets: a tensor of more than 2^31 elements"
    return None


def check_depth_grad_into(into, kd) -> None:
    """ValueError unless `into` is a pair (gk, gv) the kernels can add kd's gradients to: kd's
    shape, dtype and device, one set of strides with a unit last stride."""
    if not (isinstance(into, (tuple, list)) and len(into) == 2 and all(isinstance(t, torch.Tensor) for t in into)):
        raise ValueError("depth_grad_into must be a pair (gk, gv) of tensors")
    gk, gv = into
    for name, t in (("gk", gk), ("gv", gv)):
        if t.shape != kd.shape or t.dtype != kd.dtype or t.device != kd.device:
            raise ValueError(f"depth_grad_into {name} must match k_depth {tuple(kd.shape)} {kd.dtype} on {kd.device}, "
                             f"got {tuple(t.shape)} {t.dtype} on {t.device}")
    if gk.stride() != gv.stride() or gk.stride(-1) != 1:
        raise ValueError(f"depth_grad_into gk, gv must share one set of strides with a unit last stride, got "
                         f"{gk.stride()} and {gv.stride()}")
