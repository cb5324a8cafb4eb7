"""Host-side arithmetic of kernel launches (grid sizes, power-of-two tile paddings) in plain
Python, for the per-call paths of every operator.

`triton.cdiv` and `triton.next_power_of_2` are also callable inside kernels, and recent Triton
versions route their Python calls through that machinery: about 2 us a call (Triton 3.9 on a
CPU), where `-(-a // b)` takes 0.03 us. A MoDA fwd+bwd makes about 16 such calls, which is
host time that an eager training step pays on every call (issue 21's launch tax).
"""
from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for ints, b > 0."""
    return -(-a // b)


def next_pow2(x: int) -> int:
    """The smallest power of two >= x (1 for x <= 1)."""
    return 1 << max(0, int(x) - 1).bit_length()
