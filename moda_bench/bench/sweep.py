"""`moda-bench sweep`: one-axis sweeps (or a preset of them) of MoDA against FA2, cuDNN, flex.

Writes `<out>/sweep_<vary>.csv` (rows appended as they finish), `<out>/sweep_<vary>.png` and
`<out>/run.json` (the options); prints a summary table per sweep. With `--gpus` the points of
every sweep form one pool run by one worker per GPU (shard.run_pool); under torchrun each rank
runs its share of that pool (shard.run_distributed_pool).
"""
from __future__ import annotations

import datetime as _dt
import json
import math
from pathlib import Path
from typing import Annotated, Optional

import typer

DTYPE_ALIASES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16",
                 "half": "float16", "fp32": "float32", "float32": "float32"}
QUICK_WARMUP_MS, QUICK_REP_MS = 5.0, 20.0
DEFAULT_WARMUP_MS, DEFAULT_REP_MS = 25.0, 100.0


def parse_int_list(text: str, option: str) -> list[int]:
    """'4096,8192' -> [4096, 8192] (BadParameter naming the option otherwise)."""
    try:
        values = [int(tok) for tok in text.split(",") if tok.strip()]
    except ValueError:
        raise typer.BadParameter(f"{option} must be comma-separated integers, got {text!r}") from None
    if not values:
        raise typer.BadParameter(f"{option} is empty")
    return values


def _fmt(v, spec: str) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def summary_table(frame, x: str, title: str):
    """rich Table of one sweep: a row per (point, provider); the note is the reason of non-ok rows."""
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for col, justify in [(x, "right"), ("provider", "left"), ("status", "left"), ("median ms", "right"),
                         ("p20-p80 ms", "right"), ("TFLOP/s", "right"), ("extra % vs fa2", "right"),
                         ("eta", "right"), ("rel err", "right"), ("peak MB", "right")]:
        table.add_column(col, justify=justify, no_wrap=True)
    table.add_column("note", overflow="fold")
    colour = {"ok": "green", "skipped": "yellow", "oom": "magenta", "error": "red"}
    for r in frame.to_dict("records"):
        note = r["reason"] if isinstance(r["reason"], str) else ""
        table.add_row(str(r[x]), r["provider"], f"[{colour.get(r['status'], 'white')}]{r['status']}[/]",
                      _fmt(r["median_ms"], ".3f"), f"{_fmt(r['p20_ms'], '.3f')}-{_fmt(r['p80_ms'], '.3f')}",
                      _fmt(r["tflops"], ".1f"), _fmt(r["extra_time_pct"], "+.2f"),
                      _fmt(r["depth_utilization"], ".4f"), _fmt(r["max_rel_err"], ".1e"),
                      _fmt(r["peak_mem_mb"], ".0f"), note)
    return table


def sweep_command(
    vary: Annotated[Optional[str], typer.Option("--vary", help="Axis to sweep: T, G, L or C (C = query chunk "
                                                "rows = MoDA block_m).")] = None,
    values: Annotated[Optional[str], typer.Option("--values", help="Comma-separated values of the swept axis "
                                                  "(default: the paper's).")] = None,
    preset: Annotated[Optional[str], typer.Option("--preset", help="Named set of sweeps; 'paper' = the T, G "
                                                  "and L sweeps of the paper's efficiency table.")] = None,
    T: Annotated[Optional[int], typer.Option("--T", help="Sequence length (default 16384).")] = None,
    G: Annotated[Optional[int], typer.Option("--G", help="Query heads per KV head (default 8).")] = None,
    L: Annotated[Optional[int], typer.Option("--L", help="Depth entries per position (default 64).")] = None,
    B: Annotated[Optional[int], typer.Option("--B", help="Batch (default 1).")] = None,
    Hk: Annotated[Optional[int], typer.Option("--Hk", help="KV heads (default 8).")] = None,
    d: Annotated[Optional[int], typer.Option("--d", help="Head dim (default 64).")] = None,
    C: Annotated[Optional[int], typer.Option("--C", help="Query chunk rows; pins MoDA's block_m (default: "
                                             "tuned/heuristic config, recorded as 64).")] = None,
    dtype: Annotated[str, typer.Option("--dtype", help="bf16, fp16 or fp32.")] = "bf16",
    pass_: Annotated[str, typer.Option("--pass", help="fwd, bwd or fwdbwd.")] = "fwdbwd",
    providers: Annotated[str, typer.Option("--providers", help="Comma-separated providers.")] =
        "moda,fa2,fa2-triton,cudnn,flex",
    out: Annotated[Optional[Path], typer.Option("--out", help="Run directory (default results/sweep-<timestamp>).")] = None,
    no_tuned: Annotated[bool, typer.Option("--no-tuned", help="Ignore the tuning cache (heuristic configs).")] = False,
    warmup_ms: Annotated[Optional[float], typer.Option("--warmup-ms", help="do_bench warm-up (default 25).")] = None,
    rep_ms: Annotated[Optional[float], typer.Option("--rep-ms", help="do_bench repetition time (default 100).")] = None,
    quick: Annotated[bool, typer.Option("--quick", help=f"Few repetitions (warm-up {QUICK_WARMUP_MS:g} ms, "
                                        f"rep {QUICK_REP_MS:g} ms).")] = False,
    gpus: Annotated[Optional[str], typer.Option("--gpus", help="Run the points of every sweep as one pool "
                                                "over GPUs of this node (one worker per GPU): 'all', a count, "
                                                "or a list like 0,2.")] = None,
) -> None:
    """Time MoDA and the baselines over one axis (T, G, L or C) or a preset of sweeps."""
    from rich.console import Console

    from moda_bench.bench.presets import SweepSpec, preset_sweeps
    from moda_bench.bench.providers import UnknownProviderError, resolve_providers
    from moda_bench.bench.runner import VARY_AXES, Point, plan_points

    console = Console(stderr=True, soft_wrap=True)
    # ---- option checks (no GPU needed) ----
    if (vary is None) == (preset is None):
        raise typer.BadParameter("give exactly one of --vary (T, G, L, C) or --preset (e.g. paper)")
    if preset is not None:
        if values is not None:
            raise typer.BadParameter("--values applies to --vary, not to --preset")
        try:
            specs = list(preset_sweeps(preset))
        except ValueError as err:
            raise typer.BadParameter(str(err)) from None
    else:
        vary = vary.upper()
        if vary not in VARY_AXES:
            raise typer.BadParameter(f"--vary must be one of {', '.join(VARY_AXES)}, got {vary!r}")
        specs = [SweepSpec(vary, tuple(parse_int_list(values, "--values")) if values else None)]
    dtype_name = DTYPE_ALIASES.get(dtype.lower())
    if dtype_name is None:
        raise typer.BadParameter(f"--dtype must be one of bf16, fp16, fp32, got {dtype!r}")
    if pass_ not in ("fwd", "bwd", "fwdbwd"):
        raise typer.BadParameter(f"--pass must be fwd, bwd or fwdbwd, got {pass_!r}")
    try:
        provider_names = [p.name for p in resolve_providers(providers)]
    except UnknownProviderError as err:
        raise typer.BadParameter(str(err)) from None
    overrides = {k: v for k, v in dict(T=T, G=G, L=L, B=B, Hk=Hk, d=d, C=C).items() if v is not None}
    for k, v in overrides.items():
        if v < (0 if k == "L" else 1):
            raise typer.BadParameter(f"--{k} must be >= {0 if k == 'L' else 1}, got {v}")
    base = Point(dtype=dtype_name, **overrides)
    plans = []
    for spec in specs:
        try:
            plans.append((spec.vary, plan_points(spec.vary, list(spec.values) if spec.values else None, base)))
        except ValueError as err:
            raise typer.BadParameter(str(err)) from None
    warmup = warmup_ms if warmup_ms is not None else (QUICK_WARMUP_MS if quick else DEFAULT_WARMUP_MS)
    rep = rep_ms if rep_ms is not None else (QUICK_REP_MS if quick else DEFAULT_REP_MS)
    run_dir = out or Path("results") / f"sweep-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"
    for axis, _ in plans:
        if (run_dir / f"sweep_{axis}.csv").exists():
            raise typer.BadParameter(f"{run_dir / f'sweep_{axis}.csv'} already exists; choose another --out")
    from moda_bench.bench.pool.shard import SweepPlan, detect_distributed
    try:
        dist = detect_distributed()
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    if dist is not None and gpus is not None:
        raise typer.BadParameter("--gpus cannot be combined with torchrun (each rank owns one GPU)")

    # ---- GPU ----
    import torch
    if not torch.cuda.is_available():
        console.print("[red]error:[/] moda-bench sweep needs a CUDA GPU (torch.cuda.is_available() is False)")
        raise typer.Exit(1)

    from moda_bench.reports.plots import plot_sweep
    from moda_bench.bench.runner import run_sweep

    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "run.json").write_text(json.dumps({
        "sweeps": {axis: [p.to_dict() for p in pts] for axis, pts in plans}, "providers": provider_names,
        "pass": pass_, "use_tuned": not no_tuned, "pin_chunk": "every sweep" if C is not None else "C sweep only", "warmup_ms": warmup,
        "rep_ms": rep, "preset": preset, "gpus": gpus}, indent=1))
    # pin MoDA's block_m to C with --C or on a C sweep; else run_sweep's rule (points differ in C)
    sweeps = [SweepPlan(axis, tuple(pts), run_dir / f"sweep_{axis}.csv",
                        True if (C is not None or axis == "C") else None) for axis, pts in plans]

    def finish(axis: str, frame) -> None:
        csv_path = run_dir / f"sweep_{axis}.csv"
        if csv_path.exists():
            png = plot_sweep(csv_path)
            Console().print(summary_table(frame, axis, f"sweep {axis} ({pass_}, {dtype_name})"))
            console.print(f"wrote {csv_path} and {png}")

    if dist is not None:  # under torchrun: this rank's share of the pooled points -> <stem>.rank<k>.csv
        from moda_bench.bench.pool.shard import run_distributed_pool
        run_distributed_pool(sweeps, provider_names, pass_, dist=dist, use_tuned=not no_tuned,
                             warmup_ms=warmup, rep_ms=rep)
        console.print(f"rank {dist.rank}: wrote its shards beside the sweep CSVs in {run_dir}; combine each "
                      f"sweep with `moda-bench merge {run_dir}/sweep_<axis>.rank*.csv --out {run_dir}/sweep_<axis>.csv`")
        return
    if gpus is not None:  # one pool of every sweep's points; one worker per GPU for the whole run
        from moda_bench.bench.pool.shard import run_pool
        result = run_pool(sweeps, provider_names, pass_, gpus=gpus, use_tuned=not no_tuned,
                          warmup_ms=warmup, rep_ms=rep)
        for s in sweeps:
            finish(s.name, result.rows[s.name])
        return
    for s in sweeps:
        console.print(f"[bold]sweep {s.name}[/]: {len(s.points)} points x {len(provider_names)} providers -> {s.csv}")
        frame = run_sweep(list(s.points), provider_names, pass_, s.csv, sweep_name=s.name, use_tuned=not no_tuned,
                          warmup_ms=warmup, rep_ms=rep, pin_chunk=s.pin_chunk, console=console)
        finish(s.name, frame)
