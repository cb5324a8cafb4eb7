"""MoDA implementations: the exact reference, the fused Triton kernel and the ablation rungs."""
from moda_bench.ops.moda.config import MoDAConfig, default_config, resolve_config, set_config_lookup
from moda_bench.ops.moda.kernel import moda_attention
from moda_bench.ops.moda.reference import moda_reference

__all__ = ["moda_attention", "moda_reference", "MoDAConfig", "default_config", "resolve_config",
           "set_config_lookup"]

# Tuned configurations (moda-bench tune) are consulted at every launch unless
# MODA_BENCH_NO_TUNING=1; without a cache entry the heuristic default_config is used.
from moda_bench.tuning import install_default_lookup as _install_default_lookup  # noqa: E402

_install_default_lookup()
