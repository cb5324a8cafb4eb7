"""Rung 3 of the ablation ladder: chunk-aware MoDA.

A query block of C positions (one query head) visits only the C*L depth columns of the
positions it covers: depth utilisation eta = 1/C. Kernel: `moda_bench.kernels.moda.ladder.ungrouped`
with span 'chunk'.
"""
from __future__ import annotations

from moda_bench.kernels.moda.ladder.ungrouped import moda_ungrouped


def moda_chunk_aware(q, k, v, k_depth=None, v_depth=None, *, scale: float | None = None, chunk: int = 64):
    """q (B,T,Hq,d); k, v (B,T,Hk,d); k_depth, v_depth (B,T,L,Hk,d) or None -> out (B,T,Hq,d)."""
    return moda_ungrouped(q, k, v, k_depth, v_depth, scale=scale, chunk=chunk, span="chunk")
