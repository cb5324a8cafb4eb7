"""`moda-bench sweep` and `moda-bench merge` (to be thinned: options here, work in bench)."""
from moda_bench.bench.pool.shard import merge_command
from moda_bench.bench.sweep import sweep_command

__all__ = ["sweep_command", "merge_command"]
