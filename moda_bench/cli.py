"""The `moda-bench` command line. Each subcommand lives beside the code it drives; this file
only registers them. Command modules import torch/triton lazily, so `moda-bench report`
works on a machine with neither a GPU nor triton.
"""
from __future__ import annotations

import typer

app = typer.Typer(
    name="moda-bench",
    help="Benchmark and autotune Mixture-of-Depths Attention (MoDA) against FlashAttention.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)


def _register() -> None:
    from moda_bench.bench.sweep import sweep_command
    from moda_bench.bench.pool.shard import merge_command
    from moda_bench.bench.ablate import ablate_command
    from moda_bench.bench.tune import tune_command
    from moda_bench.reports.report import report_command
    from moda_bench.reports.gate import gate_command

    app.command("sweep")(sweep_command)
    app.command("ablate")(ablate_command)
    app.command("tune")(tune_command)
    app.command("report")(report_command)
    app.command("gate")(gate_command)
    app.command("merge")(merge_command)


_register()

if __name__ == "__main__":  # pragma: no cover
    app()
