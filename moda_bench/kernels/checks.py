"""Input checks every operator's validation shares (ops/moda, ops/decode, ops/dattn): one wording
for shapes, dtypes, devices, head dims and the CUDA requirement, so a user gets the same one-line
ValueError / TypeError from each operator; and the memo of passing checks (`CheckMemo`) both
training operators put in front of theirs.
"""
from __future__ import annotations

import os
from typing import Optional, Sequence

import torch


def shape_str(t: torch.Tensor) -> str:
    """A tensor's shape as '(a, b, c)'."""
    return "(" + ", ".join(str(s) for s in t.shape) + ")"


def check_dtypes_devices(named: dict, q: torch.Tensor, dtypes: Sequence) -> None:
    """Every tensor of `named` (name -> tensor) has a supported dtype, q's dtype and q's device."""
    for name, t in named.items():
        if t.dtype not in dtypes:
            raise TypeError(f"{name} has dtype {t.dtype}; supported: {', '.join(str(x) for x in dtypes)}")
        if t.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but q has {q.dtype}; all inputs must share one dtype")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")


def check_head_dim(q: torch.Tensor, head_dims: Optional[Sequence[int]]) -> None:
    """q's last axis is one of head_dims (None: any)."""
    d = q.shape[-1]
    if head_dims is not None and d not in head_dims:
        raise ValueError(f"head dim d={d} (last axis of q {shape_str(q)}) is not supported; use one of {head_dims}")


def check_cuda(q: torch.Tensor, need_cuda: bool) -> None:
    """A Triton kernel needs CUDA tensors, unless TRITON_INTERPRET=1 runs it on the CPU."""
    if need_cuda and q.device.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise ValueError(f"q is on {q.device}: the Triton kernel needs CUDA tensors "
                         "(or TRITON_INTERPRET=1 to run it on the CPU interpreter)")


def check_depth_pair(k_depth: Optional[torch.Tensor], v_depth: Optional[torch.Tensor], lead: dict, Hk: int,
                     d: int, max_depth: int) -> int:
    """k_depth, v_depth (B, <positions>, L, Hk, d) of one shape, `lead` naming the two leading
    sizes (e.g. {"B": 2, "T": 100}); returns L (0 without depth)."""
    if k_depth is None:
        return 0
    if k_depth.shape != v_depth.shape:
        raise ValueError(f"v_depth must have the shape of k_depth {shape_str(k_depth)}, got {shape_str(v_depth)}")
    Bd, Td, L, Hd, dd = k_depth.shape
    if (Bd, Td, Hd, dd) != (*lead.values(), Hk, d):
        (b, nb), (t, nt) = lead.items()
        raise ValueError(f"k_depth must have shape ({b}={nb}, {t}={nt}, L, Hk={Hk}, d={d}), got {shape_str(k_depth)}")
    if L > max_depth:
        raise ValueError(f"k_depth has L={L} depth entries; at most {max_depth} are supported")
    return L


class CheckMemo:
    """Passing input checks of one operator, by the shapes, dtypes and devices of (q, k, v) and an
    optional (a, b) pair plus the check's options: a call like one that passed before gets that
    call's answer without checking again (every layer of a model checks its inputs several times:
    host time an eager step pays on every layer). A pair given half (one None) is never looked
    up, so the check says what is wrong; off CUDA with need_cuda nothing is kept (that check reads
    the environment). At most `size` entries (then it starts over)."""

    def __init__(self, size: int = 256):
        self.size, self.table = size, {}

    def check(self, run, q, k, v, a, b, need_cuda: bool, dtypes, head_dims):
        """run(q, k, v, a, b, need_cuda, dtypes, head_dims)'s answer, from the memo where it can."""
        try:
            key = None if (a is None) != (b is None) else (
                (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device, v.device, need_cuda,
                 dtypes, head_dims) + ((None,) if a is None else (a.shape, b.shape, a.dtype, b.dtype, a.device,
                                                                   b.device)))
            got = None if key is None else self.table.get(key)
        except (AttributeError, TypeError):  # not tensors, or unhashable options: the check says what is wrong
            key = got = None
        if got is not None:
            return got
        answer = run(q, k, v, a, b, need_cuda, dtypes, head_dims)
        if key is not None and (q.device.type == "cuda" or not need_cuda):
            if len(self.table) >= self.size:
                self.table.clear()
            self.table[key] = answer
        return answer
