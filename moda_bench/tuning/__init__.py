"""Autotuning of the fused MoDA kernel, and the tuning cache that `moda_attention` consults only
when asked to.

  space   what may be tried: the five field groups, their search spaces, pruning
  tuner   timing candidates, the per-group hill climb, `tune_shape`, the device timer
  cache   the JSON cache of winners; `load` reads one, `use` / `using` / `stop_using` switch
          `resolve_config` to it and back (nothing is installed at import)

This module re-exports the names the layers above use.
"""
from moda_bench.tuning.cache import (ENV_CACHE, ENV_NO_TUNING, SCHEMA_VERSION, TuningCache, atomic_write_json,
                                     cache_key, current_gpu_name, default_cache_path, entry_config, load,
                                     resolve_cache_path, save_result, stop_using, t_bucket, use, using)
from moda_bench.tuning.tuner import CudaTimer, KernelSearch, Timer, TuneResult, search, tune_kernel, tune_shape
from moda_bench.tuning.space import (DEFAULT_BUDGET, DEPTH_GROUPS, DEPTH_WARPS, KERNEL_FIELDS, KERNELS, TILE_KERNELS,
                                     UNUSED_BY_PLACEMENT, candidate_configs, config_problems, device_smem_limit,
                                     dtype_name, fp32_regs_per_thread, neighbours, prune_candidates, prune_reason,
                                     search_space, smem_bytes)

__all__ = [
    "ENV_CACHE", "ENV_NO_TUNING", "SCHEMA_VERSION", "TuningCache", "atomic_write_json", "cache_key",
    "current_gpu_name", "default_cache_path", "entry_config", "load", "resolve_cache_path", "save_result",
    "stop_using", "t_bucket", "use", "using",
    "CudaTimer", "KernelSearch", "Timer", "TuneResult", "search", "tune_kernel", "tune_shape",
    "DEFAULT_BUDGET", "DEPTH_GROUPS", "DEPTH_WARPS", "KERNEL_FIELDS", "KERNELS", "TILE_KERNELS",
    "UNUSED_BY_PLACEMENT", "candidate_configs", "config_problems", "device_smem_limit", "dtype_name",
    "fp32_regs_per_thread", "neighbours", "prune_candidates", "prune_reason", "search_space", "smem_bytes",
]
