"""`moda-bench report` (to be thinned: options here, work in reports)."""
from moda_bench.reports.report import report_command

__all__ = ["report_command"]
