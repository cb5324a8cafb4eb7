"""Small pieces shared by the Triton kernels.

`dot_precision(dtype)` picks the `PREC` constexpr every kernel passes to `mm`:
- "ieee" for float32 inputs (true fp32 products; tf32 would cost ~3e-4 relative error),
- "tf32" (ignored by tl.dot for 16-bit inputs) for bf16/fp16,
- "upcast" under TRITON_INTERPRET=1: the CPU interpreter of triton 3.9 returns garbage for
  bf16 `tl.dot` operands (seen here: 16x16 product off by 1e10), so operands are converted to
  fp32 first. The conversion is exact, so the interpreter still tests bf16 rounding of the
  stored operands (p, ds cast to bf16 before their products), like the GPU path.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def dot_precision(dtype: torch.dtype) -> str:
    if interpreting():
        return "upcast"
    return "ieee" if dtype == torch.float32 else "tf32"


@triton.jit
def mm(a, b, PREC: tl.constexpr):
    """tl.dot(a, b) with fp32 accumulation (2-D or batched 3-D operands)."""
    if PREC == "upcast":
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b, input_precision=PREC)
