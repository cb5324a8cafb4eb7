"""Autotuning of the fused MoDA kernel, the tuning cache that `moda_attention` consults only
when asked to, and the export of a cache into the configs shipped with the package.

  space    what may be tried: the five field groups, their search spaces, pruning
  tuner    timing candidates, the per-group hill climb, `tune_shape` (the winner is kept only
           if it beats the default by more than a margin and the noise, timed in interleaved
           rounds), the device timer
  cache    the JSON cache of winners; `load` reads one, `use` / `using` / `stop_using` switch
           `resolve_config` to it and back (nothing is installed at import)
  shipped  a cache's 'tuned' entries -> moda_bench/kernels/moda/tuned/<gpu-slug>.json (package data)

This module re-exports the names the layers above use.
"""
from moda_bench.tuning.cache import (
    DECISIONS,
    ENV_CACHE,
    ENV_NO_TUNING,
    RECHECK_S,
    SCHEMA_VERSION,
    TuningCache,
    atomic_write_json,
    cache_key,
    current_gpu_name,
    default_cache_path,
    entry_config,
    load,
    read_entries,
    resolve_cache_path,
    save_result,
    stop_using,
    t_bucket,
    use,
    using,
)
from moda_bench.tuning.shipped import export_shipped, plan_export, shipped_key_of
from moda_bench.tuning.space import (
    DEFAULT_BUDGET,
    DEPTH_GROUPS,
    DEPTH_WARPS,
    KERNEL_FIELDS,
    KERNELS,
    OVERLAP_DEFAULT,
    OVERLAP_GROUPS,
    TILE_KERNELS,
    UNUSED_BY_PLACEMENT,
    candidate_configs,
    config_problems,
    device_smem_limit,
    dtype_name,
    fp32_regs_per_thread,
    neighbours,
    prune_candidates,
    prune_reason,
    search_space,
    smem_bytes,
)
from moda_bench.tuning.tuner import (
    COMPARE_RULE,
    DEFAULT_MIN_GAIN,
    Comparison,
    CudaTimer,
    KernelSearch,
    Timer,
    TuneResult,
    search,
    tune_kernel,
    tune_shape,
)

__all__ = [
    "DECISIONS", "ENV_CACHE", "ENV_NO_TUNING", "RECHECK_S", "SCHEMA_VERSION", "TuningCache", "atomic_write_json",
    "cache_key", "current_gpu_name", "default_cache_path", "entry_config", "load", "read_entries",
    "resolve_cache_path", "save_result", "stop_using", "t_bucket", "use", "using",
    "export_shipped", "plan_export", "shipped_key_of",
    "COMPARE_RULE", "DEFAULT_MIN_GAIN", "Comparison", "CudaTimer", "KernelSearch", "Timer", "TuneResult", "search",
    "tune_kernel", "tune_shape",
    "DEFAULT_BUDGET", "DEPTH_GROUPS", "DEPTH_WARPS", "KERNEL_FIELDS", "KERNELS", "OVERLAP_DEFAULT", "OVERLAP_GROUPS",
    "TILE_KERNELS",
    "UNUSED_BY_PLACEMENT", "candidate_configs", "config_problems", "device_smem_limit", "dtype_name",
    "fp32_regs_per_thread", "neighbours", "prune_candidates", "prune_reason", "search_space", "smem_bytes",
]
