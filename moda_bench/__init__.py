"""moda-bench: benchmarking and kernel autotuning for Mixture-of-Depths Attention (MoDA).

The operators load lazily so that the report and gate commands work on machines without
triton (or a GPU):
- `moda_attention` (training-time MoDA, fused Triton kernel), `moda_reference`, `MoDAConfig`;
- `moda_decode` (one decode step over a sequence KV cache plus each new token's depth entries);
- `depth_attention` (Depth-Attention, seed 002: a depth mix of values, then causal attention).

`moda_attention` runs the `config=` it is given, else the heuristic default; call
`moda_bench.tuning.use()` to have it consult the tuning cache instead (`moda-bench sweep` does,
unless `--no-tuned`).
"""
__all__ = ["moda_attention", "moda_reference", "MoDAConfig", "moda_decode", "depth_attention"]
__version__ = "0.1.0"

# public name -> the ops package that defines it
_HOMES = {"moda_attention": "moda", "moda_reference": "moda", "MoDAConfig": "moda",
          "moda_decode": "decode", "depth_attention": "dattn"}


def __getattr__(name):
    if name in _HOMES:
        import importlib
        return getattr(importlib.import_module(f"moda_bench.kernels.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'moda_bench' has no attribute {name!r}")
