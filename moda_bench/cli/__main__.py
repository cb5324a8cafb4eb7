"""`python -m moda_bench.cli ...` runs the command line (as the `moda-bench` script does)."""
from moda_bench.cli import app

app()
