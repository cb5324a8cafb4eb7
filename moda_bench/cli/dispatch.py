"""`moda-bench dispatch`: which MoDA implementation `moda_attention` picks here, one line per standard
shape (`kernels.moda.dispatch.explain`); with --rules-from, the per-GPU rules regenerated from sweep
CSVs (`tuning.dispatch_rules`) into --out (the package's rules folder by default)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer


def dispatch_command(
    rules_from: Annotated[Optional[list[Path]], typer.Option(
        "--rules-from", help="Results CSVs or folders to build the rules from (repeatable); without it, "
        "explain the choices on this machine.")] = None,
    out: Annotated[Optional[Path], typer.Option(
        "--out", help="Folder for the rules files (<gpu-slug>.json); default the package's "
        "moda_bench/kernels/moda/dispatch_rules.")] = None,
    graph: Annotated[bool, typer.Option("--graph", help="Explain calls captured into a CUDA graph.")] = False,
    inference: Annotated[bool, typer.Option("--inference", help="Explain forward-only calls (no grad).")] = False,
    detached: Annotated[bool, typer.Option("--detached", help="Explain calls with depth_grad=False.")] = False,
    gpu: Annotated[Optional[str], typer.Option(
        "--gpu", help="Explain as on this GPU (a name such as 'NVIDIA H200') with every implementation "
        "installed, by its rules.")] = None,
) -> None:
    """Show which MoDA implementation moda_attention picks here, or regenerate its per-GPU rules from CSVs."""
    from rich.console import Console

    from moda_bench.tuning.dispatch_rules import RULES_DIR, DispatchSpec, RulesError, build_rules, summary, write_rules
    spec = DispatchSpec(rules_from=tuple(rules_from or ()), out=out or RULES_DIR, graph=graph,
                        training=not inference, depth_grad=not detached, gpu=gpu)
    console = Console(highlight=False, soft_wrap=True)
    if not spec.rules_from:
        from moda_bench.kernels.moda.dispatch import explain
        for line in explain(training=spec.training, depth_grad=spec.depth_grad, gpu=spec.gpu, graph=spec.graph):
            console.print(line, markup=False)
        return
    command = "moda-bench dispatch " + " ".join(f"--rules-from {p}" for p in spec.rules_from) \
        + ("" if out is None else f" --out {out}")
    try:
        rules = build_rules(spec.rules_from, command,
                            warn=lambda m: console.print(f"[dim]warning: {m}[/]"))
    except (RulesError, ValueError) as exc:
        console.print(f"dispatch: {exc}", markup=False)
        raise typer.Exit(2) from None
    for path in write_rules(rules, spec.out):
        console.print(f"wrote {path}", markup=False)
    for line in summary(rules):
        console.print(line, markup=False)
