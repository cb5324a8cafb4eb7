"""moda-bench: benchmarking and kernel autotuning for Mixture-of-Depths Attention.

`moda_attention`, `moda_reference` and `MoDAConfig` load lazily so that the report and gate
commands work on machines without triton (or a GPU). `moda_attention` runs the `config=` it
is given, else the heuristic default; call `moda_bench.tuning.use()` to have it consult the
tuning cache instead (`moda-bench sweep` does, unless `--no-tuned`).
"""
__all__ = ["moda_attention", "moda_reference", "MoDAConfig"]
__version__ = "0.1.0"


def __getattr__(name):
    if name in __all__:
        from moda_bench.ops import moda
        return getattr(moda, name)
    raise AttributeError(f"module 'moda_bench' has no attribute {name!r}")
