"""Rung 2 of the ablation ladder: flash-compatible MoDA (flat depth axis, full masked scan).

Every query block of C positions scans all T*L flat depth columns with a mask: depth
utilisation eta = 1/T. Kernel: `moda_bench.kernels.moda.ladder.ungrouped` with span 'all'.
"""
from __future__ import annotations

from moda_bench.kernels.moda.ladder.ungrouped import moda_ungrouped


def moda_flash_compatible(q, k, v, k_depth=None, v_depth=None, *, scale: float | None = None, chunk: int = 64):
    """q (B,T,Hq,d); k, v (B,T,Hk,d); k_depth, v_depth (B,T,L,Hk,d) or None -> out (B,T,Hq,d)."""
    return moda_ungrouped(q, k, v, k_depth, v_depth, scale=scale, chunk=chunk, span="all")
