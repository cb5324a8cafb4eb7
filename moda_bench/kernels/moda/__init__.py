"""MoDA implementations: the exact reference, the fused Triton kernel and the ablation rungs.

This package's face is what the layers above import: `moda_attention` (the entry point that runs the
fastest implementation here, `dispatch`; the fused Triton kernel's torch custom op is
`moda_attention_op`, registered as torch.ops.moda_bench.moda_attention on import),
`moda_reference` (the fp64 oracle), `MoDAConfig` / `MoDAShape`, and how a config is chosen
and checked (`default_config`, `resolve_config`, `check_config`, `depth_utilization`).
Importing it installs no config source: a call without `config=` gets the heuristic default
until something (e.g. `moda_bench.tuning.use()`) installs one.
"""
from moda_bench.kernels.moda.config import MoDAConfig, check_config, default_config, resolve_config
from moda_bench.kernels.moda.dispatch import moda_attention
from moda_bench.kernels.moda.reference import moda_reference
from moda_bench.kernels.moda.triton.interface import depth_utilization, moda_attention_op
from moda_bench.kernels.moda.validate import MoDAShape

__all__ = ["moda_attention", "moda_attention_op", "moda_reference", "MoDAConfig", "MoDAShape", "default_config",
           "resolve_config", "check_config", "depth_utilization"]
