"""Depth-Attention (the Depth-Attention paper, seed 002): before a layer's causal attention, each
position's query (the mean of its GQA group) attends along depth over the current key and the
keys of S earlier source layers, and mixes the current value with those layers' mixed values.

This package's face: `depth_attention` (the composed operator), `depth_mix` (the fused Triton
mix alone) and `depth_mix_torch` (the plain-PyTorch mix, the `dattn-torch` baseline),
`depth_attention_reference` / `mix_reference` (the fp64 oracles), `sequence_backend` (which
sequence attention runs by default), `chain_backend` / `chained_depth_attention` (the mix and a
raw sequence backend as one autograd node), `torch_causal_attention`, `mix_bytes` (the mix's minimum
HBM traffic) and the input check `check_dattn_inputs` / `DAttnShape`.
"""
from moda_bench.kernels.dattn.attention import chain_backend, depth_attention, sequence_backend, torch_causal_attention
from moda_bench.kernels.dattn.chained import chained_depth_attention
from moda_bench.kernels.dattn.mix_torch import depth_mix_torch
from moda_bench.kernels.dattn.mix_triton import depth_mix, mix_bytes
from moda_bench.kernels.dattn.reference import depth_attention_reference, mix_reference
from moda_bench.kernels.dattn.validate import MAX_SOURCES, DAttnShape, check_dattn_inputs

__all__ = ["depth_attention", "depth_mix", "depth_mix_torch", "depth_attention_reference", "mix_reference",
           "sequence_backend", "chain_backend", "chained_depth_attention", "torch_causal_attention", "mix_bytes",
           "check_dattn_inputs", "DAttnShape",
           "MAX_SOURCES"]
