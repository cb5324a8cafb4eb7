"""`moda-bench sweep` and `moda-bench merge`: options, messages, the summary table and the
figure of each sweep. The work is in bench (bench.sweep plans and runs, bench.pool.* for
`--gpus`, torchrun and merging); the figure is `reports.figures.plot_sweep`.

Writes `<out>/sweep_<vary>.csv` (rows appended as they finish), `<out>/sweep_<vary>.png` and
`<out>/run.json` (the options, and each timing process's CPUs and host canary); prints a summary
table per sweep. `--pin-cpu` pins each timing process to one CPU (moda_bench.host).
"""
from __future__ import annotations

import datetime as _dt
import math
from pathlib import Path
from typing import Annotated, Optional

import typer

from moda_bench.bench.runner import QUICK_REP_MS, QUICK_WARMUP_MS, REP_MS, WARMUP_MS
from moda_bench.cli import checks, lifecycle
from moda_bench.schema import BASE_POINT


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
    for col, justify in [(x, "right"), ("provider", "left"), ("timer", "left"), ("status", "left"),
                         ("median ms", "right"), ("p20-p80 ms", "right"), ("n", "right"), ("TFLOP/s", "right"),
                         ("GB/s", "right"), ("x floor", "right"), ("x fa2 [95% CI]", "right"),
                         ("x best [95% CI]", "right"), ("eta", "right"), ("rel err", "right"), ("peak MB", "right")]:
        table.add_column(col, justify=justify, no_wrap=True)
    table.add_column("note", overflow="fold")
    colour = {"ok": "green", "skipped": "yellow", "oom": "magenta", "error": "red"}
    for r in frame.to_dict("records"):
        note = r["reason"] if isinstance(r["reason"], str) else ""
        rep = r.get("repeat_err")
        if isinstance(rep, float) and rep > 0:   # the forward gave two different outputs
            note = f"[red]not repeatable: {rep:.1e}[/] " + note
        table.add_row(str(r[x]), r["provider"], str(r.get("timer") or ""),
                      f"[{colour.get(r['status'], 'white')}]{r['status']}[/]",
                      _fmt(r["median_ms"], ".3f"), f"{_fmt(r['p20_ms'], '.3f')}-{_fmt(r['p80_ms'], '.3f')}",
                      _fmt(r.get("samples"), ".0f"), _fmt(r["tflops"], ".1f"), _fmt(r.get("gbps"), ".0f"),
                      _fmt(r.get("of_floor"), ".2f"),
                      ratio_cell(r, "ratio_to_fa2"), ratio_cell(r, "ratio_to_best", r.get("best_provider")),
                      _fmt(r["depth_utilization"], ".4f"), _fmt(r["max_rel_err"], ".1e"),
                      _fmt(r["peak_mem_mb"], ".0f"), note)
    return table


def ratio_cell(r: dict, col: str, den=None) -> str:
    """'1.023 [1.011-1.035]' (interval when measured), with the denominator's name if given."""
    v = r.get(col)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    lo, hi = r.get(col + "_lo"), r.get(col + "_hi")
    ci = f" [{lo:.3f}-{hi:.3f}]" if isinstance(lo, float) and not math.isnan(lo) and lo != hi else ""
    name = f" {den}" if isinstance(den, str) and den and den != r.get("provider") else ""
    return f"{v:.3f}{ci}{name}"


def checked(check, *args, option: bool = False):
    """check(*args), its ValueError turned into a BadParameter; option=True when the message
    starts with the option's name ('pass must be ...' -> '--pass must be ...')."""
    try:
        return check(*args)
    except ValueError as err:
        raise typer.BadParameter(f"--{err}" if option else str(err)) from None


def unavailable_required(require: str, requested: list[str], op: str, device: str) -> list[str]:
    """'name: reason' for each provider of `require` ('all': every requested one; else a comma list,
    each of which must be among the requested providers) that cannot run on `device`."""
    from moda_bench.bench.providers import get_provider
    names = list(requested) if require.strip() == "all" else [n.strip() for n in require.split(",") if n.strip()]
    extra = [n for n in names if n not in requested]
    if extra:
        raise typer.BadParameter(f"--require names {', '.join(extra)}, not among the providers of this run "
                                 f"({', '.join(requested)})")
    out = []
    for name in names:
        reason = get_provider(name, op).unavailable(device)
        if reason:
            out.append(f"{name} cannot run here: {reason}")
    return out


def presets_table():
    """rich Table of the shipped presets: name, file, description."""
    from rich.table import Table

    from moda_bench.bench.presets import load_preset, shipped_presets
    table = Table(title="sweep presets (--preset NAME, or --preset path/to/file.toml)")
    for col in ("name", "file", "description"):
        table.add_column(col, overflow="fold")
    for name in shipped_presets():
        p = checked(load_preset, name)
        table.add_row(name, str(p.path), p.description)
    return table


def sweep_command(
    vary: Annotated[Optional[str], typer.Option("--vary", help="Axis to sweep: T, G, L, C (query chunk rows = "
                                                "MoDA block_m), B, S (Depth-Attention sources; sets L = S) or Tq "
                                                "(decode's new tokens).")] = None,
    values: Annotated[Optional[str], typer.Option("--values", help="Comma-separated values of the swept axis "
                                                  "(default: the paper's).")] = None,
    preset: Annotated[Optional[str], typer.Option("--preset", help="A set of sweeps: the name of a shipped "
                                                  "preset (sweeps/NAME.toml: paper, decode, depth-attention, "
                                                  "smoke, ...; --list-presets) or the path of your own .toml "
                                                  "file (format: sweeps/README.md).")] = None,
    list_presets: Annotated[bool, typer.Option("--list-presets", help="List the shipped presets (name, file, "
                                               "description) and exit.")] = False,
    only: Annotated[Optional[str], typer.Option("--only", help="With --preset: run only the sweeps named here, "
                                                "comma-separated names or patterns (e.g. 'dattn-3B-*').")] = None,
    T: Annotated[Optional[int], typer.Option("--T", help="Sequence length; decode: cache length "
                                             f"(default {BASE_POINT['T']}).")] = None,
    G: Annotated[Optional[int], typer.Option("--G", help="Query heads per KV head "
                                             f"(default {BASE_POINT['G']}).")] = None,
    L: Annotated[Optional[int], typer.Option("--L", help="Depth entries per position "
                                             f"(default {BASE_POINT['L']}).")] = None,
    B: Annotated[Optional[int], typer.Option("--B", help=f"Batch (default {BASE_POINT['B']}).")] = None,
    Hk: Annotated[Optional[int], typer.Option("--Hk", help=f"KV heads (default {BASE_POINT['Hk']}).")] = None,
    d: Annotated[Optional[int], typer.Option("--d", help=f"Head dim (default {BASE_POINT['d']}).")] = None,
    C: Annotated[Optional[int], typer.Option("--C", help="Query chunk rows; pins MoDA's block_m (default: "
                                             f"tuned/heuristic config, recorded as {BASE_POINT['C']}).")] = None,
    S: Annotated[Optional[int], typer.Option("--S", help="Depth-Attention source layers (default 0).")] = None,
    Tq: Annotated[Optional[int], typer.Option("--Tq", help="Decode: new tokens per sequence (default 1).")] = None,
    depth_grad: Annotated[str, typer.Option("--depth-grad", help="on: the backward writes depth K/V gradients; "
                                            "off: depth detached, as production stacks run it.")] = "on",
    dtype: Annotated[str, typer.Option("--dtype", help="bf16, fp16 or fp32.")] = "bf16",
    pass_: Annotated[Optional[str], typer.Option("--pass", help="fwd, bwd, fwdbwd (default) or decode (the "
                                                 "decode preset's).")] = None,
    providers: Annotated[Optional[str], typer.Option("--providers", help="Comma-separated providers (default: "
                                                     "the preset's, else the pass's).")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="Run directory "
                                                "(default results/sweep-<timestamp>).")] = None,
    no_tuned: Annotated[bool, typer.Option("--no-tuned", help="Ignore the tuning cache (heuristic configs).")] = False,
    warmup_ms: Annotated[Optional[float], typer.Option("--warmup-ms", help="Warm-up per provider "
                                                       f"(default {WARMUP_MS:g}).")] = None,
    rep_ms: Annotated[Optional[float], typer.Option("--rep-ms", help=f"GPU time each provider is sampled at least "
                                                    f"(default {REP_MS:g}).")] = None,
    quick: Annotated[bool, typer.Option("--quick", help=f"Short budget (warm-up {QUICK_WARMUP_MS:g} ms, "
                                        f"rep {QUICK_REP_MS:g} ms).")] = False,
    gpus: Annotated[Optional[str], typer.Option("--gpus", help="Run the points of every sweep as one pool "
                                                "over GPUs of this node (one worker per GPU): 'all', a count, "
                                                "or a list like 0,2.")] = None,
    timer: Annotated[Optional[str], typer.Option(
        "--timer", help="eager, graph, do_bench, or several comma-separated (each point timed with each): "
        "eager counts host launches, graph replays a CUDA graph (device time), do_bench is the pre-interval "
        "method. Default: graph,eager for decode, else eager.")] = None,
    min_samples: checks.MinSamplesOption = 10,
    ci_tol: checks.CiTolOption = 0.01,
    max_time: checks.MaxTimeOption = 60.0,
    strict: checks.StrictOption = False,
    health_check: checks.CheckOption = True,
    require: Annotated[Optional[str], typer.Option("--require", help="Providers that must be able to run here "
                                                   "(comma-separated, or 'all' for every requested one): exit 2 "
                                                   "before timing anything if one cannot, with its reason.")] = None,
    pin_cpu: Annotated[str, typer.Option("--pin-cpu", help="Pin each timing process to one CPU: 'off' (default) "
                                         "or CPU ids like 3 or 3,5,7,9 (GPU worker or torchrun local rank i takes "
                                         "item i % count). Eager rows at short T time the host, whose speed "
                                         "varies by CPU core; rows record it (host_cpus, host_*_us).")] = "off",
    resume: Annotated[bool, typer.Option("--resume", help="Continue the run in --out: points whose rows are all "
                                         "there (same providers, timers, GPU, commit) are skipped; cut rows are "
                                         "dropped and their points measured again.")] = False,
    allow_commit_change: Annotated[bool, typer.Option("--allow-commit-change", help="With --resume: continue rows "
                                                      "measured at another commit.")] = False,
    point_timeout: Annotated[Optional[float], typer.Option(
        "--point-timeout", help="With --gpus: seconds a worker may spend on one point; past it the worker is killed, "
                                "the point's rows marked and a fresh worker goes on.")] = None,
) -> None:
    """Time MoDA and the baselines over one axis or a preset of sweeps (training passes or decode)."""
    from rich.console import Console

    from moda_bench import host, schema
    from moda_bench.bench import sweep as run
    from moda_bench.bench.decode_providers import DEFAULT_DECODE_PROVIDERS
    from moda_bench.bench.pool.plan import detect_distributed
    from moda_bench.bench.presets import SweepSpec, load_preset
    from moda_bench.bench.providers import DEFAULT_PROVIDERS, UnknownProviderError, op_of_pass, resolve_providers
    from moda_bench.bench.runner import LEGACY_TIMER, Point
    from moda_bench.bench.spec import RunSpec, parse_timers
    from moda_bench.timing import TIMERS

    console = Console(stderr=True, soft_wrap=True)
    if list_presets:
        Console().print(presets_table())
        return
    # ---- option checks (no GPU needed) ----
    if (vary is None) == (preset is None):
        raise typer.BadParameter("give exactly one of --vary (T, G, L, C, B, S, Tq) or --preset (e.g. paper)")
    chosen = None
    if preset is not None:
        if values is not None:
            raise typer.BadParameter("--values applies to --vary, not to --preset")
        chosen = checked(load_preset, preset)
        specs = list(checked(chosen.select, only))
        want = chosen.pass_
        if want and pass_ not in (None, want):
            raise typer.BadParameter(f"--preset {preset} is a {want} preset; drop --pass {pass_}")
        pass_ = pass_ or want
    else:
        vary = {"TQ": "Tq"}.get(vary.upper(), vary.upper())
        if vary not in schema.AXES:
            raise typer.BadParameter(f"--vary must be one of {', '.join(schema.AXES)}, got {vary!r}")
        if only is not None:
            raise typer.BadParameter("--only selects sweeps of a --preset")
        specs = [SweepSpec(vary, tuple(parse_int_list(values, "--values")) if values else None)]
    pass_ = pass_ or "fwdbwd"
    dtype_name = checked(schema.dtype_name, dtype, option=True)
    checked(schema.check_pass, pass_, option=True)
    if depth_grad not in ("on", "off"):
        raise typer.BadParameter(f"--depth-grad must be on or off, got {depth_grad!r}")
    decode = pass_ == schema.DECODE_PASS
    default_providers = ((chosen and chosen.providers)
                         or ",".join(DEFAULT_DECODE_PROVIDERS if decode else DEFAULT_PROVIDERS))
    try:
        provider_names = [p.name for p in resolve_providers(providers or default_providers, op_of_pass(pass_))]
    except UnknownProviderError as err:
        raise typer.BadParameter(str(err)) from None
    timers = (checked(parse_timers, timer, pass_, TIMERS + (LEGACY_TIMER,), option=True)
              or (chosen.timers if chosen else ()))
    overrides = {k: v for k, v in dict(T=T, G=G, L=L, B=B, Hk=Hk, d=d, C=C, S=S, Tq=Tq).items() if v is not None}
    for k, v in overrides.items():
        if v < (0 if k in ("L", "S") else 1):
            raise typer.BadParameter(f"--{k} must be >= {0 if k in ('L', 'S') else 1}, got {v}")
    if decode:
        overrides.setdefault("Tq", 1)
    elif overrides.get("Tq") or any(s.vary == "Tq" for s in specs):
        raise typer.BadParameter("--Tq and --vary Tq apply to --pass decode")
    base = Point(dtype=dtype_name, depth_grad=depth_grad == "on", **overrides)
    run_dir = out or Path("results") / f"sweep-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"
    if resume and out is None:
        raise typer.BadParameter("--resume needs the --out of the run to continue")
    if allow_commit_change and not resume:
        raise typer.BadParameter("--allow-commit-change applies to --resume")
    if point_timeout is not None and (gpus is None or point_timeout <= 0):
        raise typer.BadParameter("--point-timeout applies to --gpus runs and must be > 0")
    try:
        sweeps = run.plan_run(specs, base, run_dir, pin_chunk=C is not None, fixed=tuple(overrides), resume=resume)
    except (ValueError, FileExistsError) as err:
        raise typer.BadParameter(str(err)) from None
    warmup, rep = run.timing_budget(warmup_ms, rep_ms, quick)
    first_timer = (timers or (("graph",) if decode else ("eager",)))[0]
    timing = checks.timing_options(first_timer, min_samples, ci_tol, max_time, warmup, rep)
    dist = checked(detect_distributed)
    if dist is not None and gpus is not None:
        raise typer.BadParameter("--gpus cannot be combined with torchrun (each rank owns one GPU)")
    pin = checked(host.parse_pin_cpu, pin_cpu)
    checked(host.check_pin_cpu, pin)
    worker = dist.local_rank if dist is not None else 0
    if gpus is None:   # this process times: pinned before CUDA starts its threads (--gpus: each worker pins itself)
        checked(host.pin_process, pin, worker)

    # ---- GPU ----
    import torch
    if not torch.cuda.is_available():
        console.print("[red]error:[/] moda-bench sweep needs a CUDA GPU (torch.cuda.is_available() is False)")
        raise typer.Exit(1)

    if require:
        missing = unavailable_required(require, provider_names, op_of_pass(pass_), "cuda")
        if missing:
            for line in missing:
                console.print(f"[red]error:[/] --require: {line}")
            raise typer.Exit(2)
    gpu_run = checks.RunHealth(checks.device_indices(gpus) if dist is None else [dist.local_rank],
                               enabled=health_check)
    gpu_run.check("start", console)
    spec = RunSpec(providers=tuple(provider_names), pass_=pass_, timing=timing, timers=timers,
                   use_tuned=not no_tuned, health=gpu_run.row_label(), rates=gpu_run.rates(), pin_cpu=pin)
    hosts = []
    if gpus is None:   # this process times: its host canary now (the runner reuses it), for run.json
        state = host.process_host(pin, worker)
        hosts = [dict(state.as_dict(), gpu_index=dist.local_rank if dist is not None else 0)]
        console.print(f"host: {host.describe(state.columns())}", markup=False, highlight=False)
    lock = lifecycle.take_lock(run_dir, dist, console)   # one writer per folder (a rank: per rank)
    life = lifecycle.Lifecycle(run_dir, sweeps, spec, lock, console, resume=resume, run_dir_given=out is not None)

    def start(s) -> None:
        console.print(f"[bold]sweep {s.name}[/]: {len(s.points)} points x {len(provider_names)} providers -> {s.csv}")

    def finish(s, frame) -> None:
        if s.csv.exists():
            if resume:   # the summary of the whole sweep, rows of the earlier attempts included
                from moda_bench import results
                frame = results.read_csv(s.csv, warn=lambda text: None)
            from moda_bench.reports.figures import plot_sweep
            png = plot_sweep(s.csv)
            x = next(sp.vary for sp in specs if sp.label == s.name)
            Console().print(summary_table(frame, x, f"sweep {s.name} ({pass_}, {dtype_name})"))
            console.print(f"wrote {s.csv} and {png}")

    with life.running():   # SIGINT/SIGTERM from here on: rows kept, run.json 'interrupted', exit 130/143
        todo = life.plan(gpu_index=0 if gpus is None else None, pooled=gpus is not None, dist=dist,
                         allow_commit_change=allow_commit_change)
        run.write_run_record(run_dir, sweeps, spec, pin_chunk=C is not None, preset=preset, gpus=gpus,
                             extra={"gpu_header": gpu_run.header(), "host": hosts, **life.record()})
        if dist is not None:  # under torchrun: this rank's share of the pooled points -> <stem>.rank<k>.csv
            from moda_bench.bench.pool.distributed import run_distributed_pool
            run_distributed_pool(sweeps, spec, dist=dist, done=life.done if resume else None)
        else:
            done = run.run_sweeps(todo, spec, gpus=gpus, console=console, on_start=start, on_done=finish,
                                  point_timeout=point_timeout)
    if dist is not None:
        checks.finish(gpu_run, console, [], strict)
        console.print(f"rank {dist.rank}: wrote its shards beside the sweep CSVs in {run_dir}; combine each sweep "
                      f"with `moda-bench merge {run_dir}/sweep_<axis>.rank*.csv --out {run_dir}/sweep_<axis>.csv`")
        return
    if gpus is not None:   # each worker's CPUs and host canary, from its rows
        run.update_run_record(run_dir, host=run.host_records(done.values()))
    checks.finish(gpu_run, console, [s.csv for s in sweeps], strict)


def merge_command(
    inputs: Annotated[list[Path], typer.Argument(help="Shard CSV files and/or directories of shard CSVs.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Merged CSV to write.")],
) -> None:
    """Merge shard CSVs (from --gpus workers or torchrun ranks) into one CSV: schema checked,
    duplicates on sweep + row key + timestamp dropped, rows sorted deterministically."""
    from rich.console import Console

    from moda_bench.bench.pool.merge import expand_shard_inputs, merge_shards
    from moda_bench.results import ResultsError

    console = Console(stderr=True, soft_wrap=True)
    try:
        files = expand_shard_inputs(inputs, exclude=out)
    except FileNotFoundError as err:
        console.print(f"[red]error:[/] {err}")
        raise typer.Exit(2)
    if not files:
        console.print(f"[red]error:[/] no CSV files found in {', '.join(map(str, inputs))}")
        raise typer.Exit(2)
    try:
        merged = merge_shards(files, out)
    except ResultsError as err:
        console.print(f"[red]error:[/] {err}")
        raise typer.Exit(1)
    console.print(f"merged {len(files)} file(s) -> {out} ({len(merged)} rows)")
    from moda_bench.bench.runstate import missing_points
    for sweep, labels in missing_points(merged, Path(out).parent, out).items():
        console.print(f"[yellow]warning:[/] sweep {sweep}: {len(labels)} point(s) of run.json have no complete rows: "
                      + "; ".join(labels), highlight=False, soft_wrap=True)
