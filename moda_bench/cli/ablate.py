"""`moda-bench ablate` (to be thinned: options here, work in bench and reports)."""
from moda_bench.bench.ablate import ablate_command

__all__ = ["ablate_command"]
