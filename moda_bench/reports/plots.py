"""Old import path of the per-sweep figure, kept only until its last callers (bench/sweep.py,
tests/test_sweep.py) import `plot_sweep` and `infer_x` from `moda_bench.reports.figures`, which
owns them; then delete this file."""
from moda_bench.reports.figures import infer_x, plot_sweep

__all__ = ["infer_x", "plot_sweep"]
