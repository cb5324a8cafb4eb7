"""`moda-bench tune` (to be thinned: options here, work in bench.tune and tuning)."""
from moda_bench.bench.tune import tune_command

__all__ = ["tune_command"]
