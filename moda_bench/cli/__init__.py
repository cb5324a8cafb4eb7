"""The `moda-bench` command line: one Typer app, one thin module per command.

Each command module parses options and calls the layers below (bench for measurements,
reports for tables and figures). torch and triton are imported lazily inside the commands, so
`moda-bench report` and `moda-bench gate` work on a machine with neither a GPU nor triton.
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


def register() -> None:
    from moda_bench.cli.ablate import ablate_command
    from moda_bench.cli.dispatch import dispatch_command
    from moda_bench.cli.doctor import doctor_command
    from moda_bench.cli.gate import gate_command
    from moda_bench.cli.model import model_command
    from moda_bench.cli.report import report_command
    from moda_bench.cli.sweep import merge_command, sweep_command
    from moda_bench.cli.tune import tune_command

    app.command("sweep")(sweep_command)
    app.command("ablate")(ablate_command)
    app.command("tune")(tune_command)
    app.command("report")(report_command)
    app.command("gate")(gate_command)
    app.command("merge")(merge_command)
    app.command("doctor")(doctor_command)
    app.command("dispatch")(dispatch_command)
    app.command("model")(model_command)


register()
