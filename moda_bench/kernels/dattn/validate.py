"""Input checking shared by every Depth-Attention implementation (reference, Triton mix, torch mix,
the composed operator).

Layouts: q (B, T, Hq, d); k, v (B, T, Hk, d); k_src, v_src (B, T, S, Hk, d) or both None
(S = 0). Bad input gets one ValueError / TypeError naming the tensor, its shape and the
expected layout, before any kernel is launched.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from moda_bench.kernels.checks import CheckMemo, check_cuda, check_dtypes_devices, check_head_dim, shape_str
from moda_bench.kernels.moda.validate import SUPPORTED_DTYPES, SUPPORTED_HEAD_DIMS

MAX_SOURCES = 64
REFERENCE_DTYPES = SUPPORTED_DTYPES + (torch.float64,)


@dataclass(frozen=True)
class DAttnShape:
    """The sizes of one Depth-Attention call (S = number of earlier source layers)."""

    B: int
    T: int
    Hq: int
    Hk: int
    d: int
    S: int

    @property
    def G(self) -> int:
        return self.Hq // self.Hk


LAYOUTS = {"q": "(B, T, Hq, d)", "k": "(B, T, Hk, d)", "v": "(B, T, Hk, d)", "k_src": "(B, T, S, Hk, d)",
           "v_src": "(B, T, S, Hk, d)"}


def check_dattn_inputs(q, k, v, k_src=None, v_src=None, *, need_cuda: bool = False,
                       dtypes: tuple = SUPPORTED_DTYPES, head_dims: tuple | None = SUPPORTED_HEAD_DIMS) -> DAttnShape:
    """Validate a Depth-Attention call and return its sizes.

    TypeError: a non-tensor, an unsupported dtype, mixed dtypes. ValueError: k_src without
    v_src (or the reverse), a wrong rank, Hq not a multiple of Hk, B/T/Hk/d mismatches, k_src
    and v_src with different S, more than MAX_SOURCES sources, an unsupported head dim, mixed
    devices, and (need_cuda, the Triton mix) CPU tensors without TRITON_INTERPRET=1.
    A call with the shapes, dtypes, devices and options of one that passed before returns its
    answer from a memo: a model layer's call is checked by the wrapper, the mix and its backward
    (four times a layer), host time an eager step pays on every layer.
    """
    return _MEMO.check(_check, q, k, v, k_src, v_src, need_cuda, dtypes, head_dims)


_MEMO = CheckMemo()  # check_dattn_inputs' passing calls


def _check(q, k, v, k_src, v_src, need_cuda, dtypes, head_dims) -> DAttnShape:
    if (k_src is None) != (v_src is None):
        raise ValueError("k_src and v_src must both be given or both be None "
                         f"(got k_src={'None' if k_src is None else 'tensor'}, "
                         f"v_src={'None' if v_src is None else 'tensor'})")
    named = {"q": q, "k": k, "v": v}
    if k_src is not None:
        named.update(k_src=k_src, v_src=v_src)
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in named.items():
        want = 5 if name.endswith("_src") else 4
        if t.dim() != want:
            raise ValueError(f"{name} must have rank {want} with layout {LAYOUTS[name]}, got shape {shape_str(t)}")
    B, T, Hq, d = q.shape
    if B < 1 or T < 1 or Hq < 1 or d < 1:
        raise ValueError(f"q {shape_str(q)} must have B, T, Hq, d >= 1")
    Bk, Tk, Hk, dk = k.shape
    if (Bk, Tk, dk) != (B, T, d):
        raise ValueError(f"k must have shape (B={B}, T={T}, Hk, d={d}) to match q {shape_str(q)}, got {shape_str(k)}")
    if v.shape != k.shape:
        raise ValueError(f"v must have the shape of k {shape_str(k)}, got {shape_str(v)}")
    if Hk < 1 or Hq % Hk != 0:
        raise ValueError(f"q heads Hq={Hq} must be a multiple of k heads Hk={Hk} (q {shape_str(q)}, k {shape_str(k)})")
    S = 0
    if k_src is not None:
        Bs, Ts, S, Hs, ds = k_src.shape
        if (Bs, Ts, Hs, ds) != (B, T, Hk, d):
            raise ValueError(f"k_src must have shape (B={B}, T={T}, S, Hk={Hk}, d={d}), got {shape_str(k_src)}")
        if v_src.shape != k_src.shape:
            what = (f"v_src has S={v_src.shape[2]} sources but k_src has S={S}"
                    if v_src.shape[:2] + v_src.shape[3:] == k_src.shape[:2] + k_src.shape[3:]
                    else "v_src must have the shape of k_src")
            raise ValueError(f"{what}: k_src {shape_str(k_src)}, v_src {shape_str(v_src)}")
        if S > MAX_SOURCES:
            raise ValueError(f"k_src {shape_str(k_src)} has S={S} source layers; at most {MAX_SOURCES} are supported")
    check_dtypes_devices(named, q, dtypes)
    check_head_dim(q, head_dims)
    check_cuda(q, need_cuda)
    return DAttnShape(B=B, T=T, Hq=Hq, Hk=Hk, d=d, S=S)
