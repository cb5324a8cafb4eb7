"""`moda-bench gate` (to be thinned: options here, work in reports.gate)."""
from moda_bench.reports.gate import gate_command

__all__ = ["gate_command"]
