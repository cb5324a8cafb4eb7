"""MoDA implementations: the exact reference, the fused Triton kernel and the ablation rungs."""
from .config import MoDAConfig, default_config, resolve_config, set_config_lookup
from .moda import moda_attention
from .reference import moda_reference

__all__ = ["moda_attention", "moda_reference", "MoDAConfig", "default_config", "resolve_config",
           "set_config_lookup"]
