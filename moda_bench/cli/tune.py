"""`moda-bench tune`: autotune the fused MoDA kernel for one shape, a one-axis sweep or a
preset, persist the result in the tuning cache (moda_bench.tuning) and report how the winner
compares with the default configuration (fwd+bwd). Options, progress bars, the summary table,
`--show` and `--export-shipped`; the work is `moda_bench.bench.tune`'s.

Candidates are timed like the sweep (moda_bench.timing.measure); the winner is then timed
against the default in interleaved rounds and kept only if the 95% upper bound of its time
ratio is below 1 - `--min-gain` (decision 'tuned'), else the default is stored ('default').
Where the search found nothing faster, its closest candidate is compared the same way, so a kept
default carries that candidate's ratio and interval. Each shape's result is saved as soon as it
is found and shapes already in the cache are skipped (--force retunes), so a long preset can be
run in several invocations; the `--out` summary is rewritten as each shape finishes and
`--resume` keeps an interrupted run's rows (`bench.tune.Summary`; SIGINT/SIGTERM exit 130/143).
`--export-shipped DIR` writes the cache's 'tuned' entries as the package's shipped configs
(DIR/<gpu-slug>.json; the package's own directory is moda_bench/kernels/moda/tuned). torch/triton
are imported inside the command.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from moda_bench.bench.tune import (DTYPES, PRESETS, Summary, config_changes, entry_row, group_by_key,
                                   plan_tuning_points, point_shape, result_row, tune_point, tune_row, write_summary)

console = Console(stderr=False)


DEFAULT_KERNELS = "fwd_depth,bwd_depth,fwd,bwd_q,bwd_kv"


def _fail(msg: str, code: int = 1):
    console.print(f"[bold red]error:[/] {msg}")
    raise typer.Exit(code)


def _parse_ints(text: str, option: str) -> list[int]:
    try:
        vals = [int(v) for v in text.replace(" ", ",").split(",") if v]
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated integers, got {text!r}", param_hint=option)
    if not vals or any(v < 0 for v in vals):
        raise typer.BadParameter(f"expected non-negative integers, got {text!r}", param_hint=option)
    return vals


def parse_gain(text: str) -> float:
    """'2%' -> 0.02, '0.02' -> 0.02; a bare number >= 1 is ambiguous (BadParameter), as is a
    negative one or a gain of 100% or more."""
    t = text.strip()
    try:
        value = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise typer.BadParameter(f"expected a fraction or a percentage such as 2%, got {text!r}",
                                 param_hint="--min-gain")
    if not t.endswith("%") and value >= 1:
        raise typer.BadParameter(f"{text!r} is ambiguous: write {text}% or a fraction below 1",
                                 param_hint="--min-gain")
    if not 0 <= value < 1:
        raise typer.BadParameter(f"the margin must be in [0, 100%), got {text!r}", param_hint="--min-gain")
    return value


def _ci(r: dict) -> str:
    lo, hi = r.get("ratio_lo"), r.get("ratio_hi")
    if lo is None or hi is None or lo != lo or hi != hi:
        return "-"
    return f"{lo:.3f}-{hi:.3f}"


def _shape_label(p) -> str:
    return f"T={p.T} G={p.G} L={p.L} Hk={p.Hk} B={p.B} d={p.d}"


def _show_cache(path) -> None:
    from moda_bench import tuning
    cache = tuning.load(path)
    p, entries = cache.path, cache.entries()
    table = Table(title=f"tuning cache {p} ({len(entries)} entries)")
    cols = ("op", "gpu", "triton", "dtype", "d", "G", "L", "T<=", "default ms", "tuned ms", "speedup",
            "ratio 95% CI", "decision", "wall s", "date")
    for col in cols:
        table.add_column(col, justify="left" if col in ("op", "gpu", "triton", "dtype", "decision", "date") else "right")

    def num(e, f, fmt):
        v = e.get(f)
        return "-" if v is None else format(v, fmt)

    for key, e in sorted(entries.items()):
        if not isinstance(e, dict):
            continue
        table.add_row(str(e.get("op", "moda")),
                      *(str(e.get(f, "?")) for f in ("gpu", "triton_version", "dtype", "d", "G", "L", "T_bucket")),
                      num(e, "default_ms", ".4g"), num(e, "tuned_ms", ".4g"), num(e, "speedup", ".3f"),
                      _ci(e), str(e.get("decision") or "-"), num(e, "tuning_wall_s", ".1f"),
                      str(e.get("date", "?"))[:10])
    console.print(table)


def _export(cache, out_dir: Path) -> None:
    from moda_bench import tuning
    path = tuning.resolve_cache_path(cache)
    if not path.exists():
        _fail(f"no tuning cache at {path} to export")
    summaries = tuning.export_shipped(path, out_dir)
    if not summaries:
        console.print(f"[yellow]the tuning cache {path} has no entries: nothing exported[/]")
    for s in summaries:
        for ckey, why in s["skipped"]:
            console.print(f"  [dim]{escape(ckey)}: {escape(why)}[/]")
        if s["path"] is not None:
            console.print(f"{s['gpu']}: {s['added']} tuned config(s) exported, {s['dropped']} removed; "
                          f"{s['total']} in {s['path']}")


def tune_command(
    T: Annotated[Optional[int], typer.Option("--T", help="Sequence length (default 16384).", min=1)] = None,
    G: Annotated[Optional[int], typer.Option("--G", help="Query heads per KV head (default 8).", min=1)] = None,
    L: Annotated[Optional[int], typer.Option("--L", help="Depth entries per position (default 64).", min=0)] = None,
    B: Annotated[Optional[int], typer.Option("--B", help="Batch size (default 1).", min=1)] = None,
    Hk: Annotated[Optional[int], typer.Option("--Hk", help="KV heads (default 8).", min=1)] = None,
    d: Annotated[Optional[int], typer.Option("--d", help="Head dim (default 64).")] = None,
    dtype: Annotated[str, typer.Option("--dtype", help="bfloat16, float16 or float32.")] = "bfloat16",
    vary: Annotated[Optional[str], typer.Option("--vary", help="Tune a one-axis sweep over T, G or L.")] = None,
    values: Annotated[Optional[str], typer.Option(
        "--values", help="Comma-separated values for --vary (default: the paper's).")] = None,
    preset: Annotated[Optional[str], typer.Option(
        "--preset", help="'paper': every shape of the paper's T, G and L sweeps; 'full': the same with "
        "T from 1024.")] = None,
    kernels: Annotated[str, typer.Option(
        "--kernels", help="Comma-separated field groups to tune, in order: fwd_depth, bwd_depth (depth "
        "placements and depth-only launches), fwd, bwd_q, bwd_kv (tiles); fwd_items, fwd_ctas, bwd_kernel, bwd_items, "
        "bwd_ctas (moda-overlap's streaming depth items, backward depth kernel and program counts; fwd_ctas, bwd_kernel, "
        "bwd_ctas by default).")] = DEFAULT_KERNELS,
    budget: Annotated[int, typer.Option(
        "--budget", "--max-candidates", min=1, help="Most candidates timed per kernel and shape.")] = 40,
    cache: Annotated[Optional[Path], typer.Option(
        "--cache", help="Tuning cache file (default: $MODA_BENCH_TUNING_CACHE or the platform cache dir).")] = None,
    out: Annotated[Optional[Path], typer.Option(
        "--out", "-o", help="CSV summary: shape, default/candidate/tuned ms, ratio and its 95% CI, decision, wall_s, config.")] = None,
    min_gain: Annotated[str, typer.Option(
        "--min-gain", help="Keep the winner only if it beats the default by more than this (its time ratio's "
        "95% upper bound below 1 - margin), e.g. 2% or 0.02.")] = "2%",
    export_shipped: Annotated[Optional[Path], typer.Option(
        "--export-shipped", help="Write the cache's 'tuned' entries as shipped configs into this directory "
        "(<gpu-slug>.json; the package's is moda_bench/kernels/moda/tuned) and exit.")] = None,
    force: Annotated[bool, typer.Option(
        "--force/--skip-cached", help="Retune shapes that already have a valid cache entry.")] = False,
    warmup_ms: Annotated[float, typer.Option("--warmup-ms", help="do_bench warm-up per candidate.")] = 10,
    rep_ms: Annotated[float, typer.Option("--rep-ms", help="do_bench repetition time per candidate.")] = 50,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the candidate sample and the inputs.")] = 0,
    device: Annotated[Optional[int], typer.Option("--device", help="CUDA device index.")] = None,
    show: Annotated[bool, typer.Option("--show", help="Print the tuning cache and exit.")] = False,
    op: Annotated[str, typer.Option(
        "--op", help="Operator to tune: moda (the Triton kernel), moda-fa4 (its depth launches beside FA4; "
        "needs FA4 and L > 0; only the fwd_depth, bwd_depth groups apply) or moda-overlap (its streaming depth kernels: "
        "fwd_items, fwd_ctas, bwd_kernel, bwd_items, bwd_ctas; needs FA4 and L > 0).")] = "moda",
    resume: Annotated[bool, typer.Option("--resume", help="Continue the run whose summary is --out: its shapes "
                                         "(same GPU and commit) are kept, the others tuned.")] = False,
    allow_commit_change: Annotated[bool, typer.Option("--allow-commit-change", help="With --resume: keep rows "
                                                      "tuned at another commit.")] = False,
) -> None:
    """Autotune the MoDA kernel's depth placements and tiles per shape; store the results in the tuning cache."""
    if show:
        _show_cache(cache)
        return
    if export_shipped is not None:
        _export(cache, export_shipped)
        return
    gain = parse_gain(min_gain)
    if resume and out is None:
        raise typer.BadParameter("--resume continues the summary given by --out", param_hint="--resume")
    from moda_bench import tuning
    from moda_bench.bench.runner import Point

    kernel_list = [k.strip() for k in kernels.split(",") if k.strip()]
    groups = tuning.KERNELS + tuning.OVERLAP_GROUPS
    bad = [k for k in kernel_list if k not in groups]
    if bad or not kernel_list:
        raise typer.BadParameter(f"unknown kernel(s) {bad or kernels!r}; choose from {', '.join(groups)}",
                                 param_hint="--kernels")
    from moda_bench.kernels.moda.config import OPS
    if op not in OPS:
        raise typer.BadParameter(f"unknown operator {op!r}; choose from {', '.join(OPS)}", param_hint="--op")
    if op == "moda-overlap":  # its knobs are the depth launches' items and program counts
        if kernels == DEFAULT_KERNELS:
            kernel_list = list(tuning.OVERLAP_DEFAULT)
        elif any(k not in tuning.OVERLAP_GROUPS for k in kernel_list):
            raise typer.BadParameter(f"moda-overlap tunes only {', '.join(tuning.OVERLAP_GROUPS)} (its depth "
                                     "kernels' items and programs; its sequence part is FA4)", param_hint="--kernels")
        if L == 0:
            raise typer.BadParameter("moda-overlap has no depth launches at L=0: nothing to tune", param_hint="--L")
    elif any(k in tuning.OVERLAP_GROUPS for k in kernel_list):
        raise typer.BadParameter(f"{', '.join(tuning.OVERLAP_GROUPS)} are moda-overlap's groups (--op moda-overlap)",
                                 param_hint="--kernels")
    elif op != "moda":  # its sequence part is FA4: only the depth launches read the config
        dropped = [k for k in kernel_list if k not in tuning.DEPTH_GROUPS]
        kernel_list = [k for k in kernel_list if k in tuning.DEPTH_GROUPS]
        if not kernel_list:
            raise typer.BadParameter(f"{op} tunes only {', '.join(tuning.DEPTH_GROUPS)} (its sequence part is FA4)",
                                     param_hint="--kernels")
        if dropped:
            console.print(f"[dim]{op}: tuning {', '.join(kernel_list)} only (its sequence part is FA4; "
                          f"{', '.join(dropped)} do not apply)[/]")
        if L == 0:
            raise typer.BadParameter(f"{op} has no depth launches at L=0: nothing to tune", param_hint="--L")
    if dtype not in DTYPES:
        raise typer.BadParameter(f"{dtype!r} is not one of {', '.join(DTYPES)}", param_hint="--dtype")
    if vary and preset:
        raise typer.BadParameter("give either --vary or --preset, not both", param_hint="--preset")
    if preset and preset not in PRESETS:
        raise typer.BadParameter(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}", param_hint="--preset")
    if vary and vary not in ("T", "G", "L"):
        hint = " (C is the chunk the tuner chooses)" if vary == "C" else ""
        raise typer.BadParameter(f"--vary must be T, G or L{hint}, got {vary!r}", param_hint="--vary")
    if values and not vary:
        raise typer.BadParameter("--values needs --vary", param_hint="--values")
    from moda_bench.kernels.moda.validate import SUPPORTED_HEAD_DIMS
    if d is not None and d not in SUPPORTED_HEAD_DIMS:
        raise typer.BadParameter(f"head dim {d} is not supported; use one of {SUPPORTED_HEAD_DIMS}", param_hint="--d")
    given = {k: v for k, v in dict(T=T, G=G, L=L, B=B, Hk=Hk, d=d).items() if v is not None}
    base = Point(**given, dtype=dtype)
    try:
        points = plan_tuning_points(base, vary, _parse_ints(values, "--values") if values else None, preset)
    except (ValueError, NotImplementedError) as exc:
        _fail(f"cannot plan the shapes to tune: {exc}")

    import torch
    if not torch.cuda.is_available():
        _fail("moda-bench tune needs a CUDA GPU and none is available", 2)
    if device is not None:
        if not 0 <= device < torch.cuda.device_count():
            raise typer.BadParameter(f"no CUDA device {device} (found {torch.cuda.device_count()})",
                                     param_hint="--device")
        torch.cuda.set_device(device)
    try:
        from moda_bench.kernels.moda import MoDAConfig, default_config, moda_attention
    except ImportError as exc:
        _fail(f"the MoDA kernel cannot be imported: {exc}")
    attention, default_fn = moda_attention, default_config
    if op in ("moda-fa4", "moda-overlap"):
        from moda_bench.kernels.moda.fa4 import merge as fa4
        from moda_bench.kernels.moda.fa4 import overlap
        why = fa4.fa4_unavailable(torch.device("cuda", torch.cuda.current_device()))
        if why:
            _fail(f"{op} cannot run here: {why}", 2)
        attention = fa4.moda_fa4 if op == "moda-fa4" else overlap.moda_overlap
        if op == "moda-overlap":
            default_fn = lambda sh, dt: overlap.overlap_heuristic(sh, dt, torch.device("cuda"))  # noqa: E731

    from moda_bench.schema import run_metadata
    cache_path = tuning.resolve_cache_path(cache)
    groups = group_by_key(points, lambda p: tuning.cache_key(point_shape(p), dtype, op=op))
    console.print(f"tuning {op}: {len(groups)} shape(s) ({len(points)} point(s)) on {tuning.current_gpu_name()}, "
                  f"kernels {', '.join(kernel_list)}, budget {budget}/kernel, min gain {gain:.1%}; cache {cache_path}")
    existing = tuning.load(cache_path).entries()
    meta = run_metadata(device)
    try:
        summary_rows = Summary(out, resume=resume, gpu=meta["gpu"], commit=meta["git_commit"],
                               allow_commit_change=allow_commit_change)
    except ValueError as exc:
        _fail(str(exc), 2)
    import shlex
    import sys
    again = shlex.join(["moda-bench", *sys.argv[1:]] + ([] if "--resume" in sys.argv else ["--resume"]))
    summary_rows.on_signals(lambda text: console.print(text, markup=False, highlight=False), again)
    rows, shown, failures, t_start = summary_rows.rows, [], 0, time.perf_counter()
    summary = Table(title="MoDA tuning (fwd+bwd median ms; ratio = candidate / default, 95% CI)")
    for col in ("shape", "default ms", "candidate ms", "ratio 95% CI", "decision", "speedup", "wall s",
                "tuned fields"):
        summary.add_column(col, justify="left" if col in ("shape", "decision", "tuned fields") else "right")

    for key, p in groups.items():
        shape = point_shape(p)
        if summary_rows.previous(key) is not None:
            console.print(f"[dim]{_shape_label(p)}: done in the run being resumed[/]")
            summary_rows.add(summary_rows.previous(key))
            shown.append("(resumed)")
            continue
        entry = existing.get(key)
        cfg = tuning.entry_config(entry, shape.G, key) if isinstance(entry, dict) and not force else None
        if cfg is not None:
            changes = config_changes(cfg, default_fn(shape, dtype))
            console.print(f"[dim]{_shape_label(p)}: cached ({changes}); --force retunes[/]")
            summary_rows.add(entry_row(p, dtype, entry, key=key, meta=meta, tuned_fields=changes))
            shown.append(changes + " (cached)")
            continue
        try:
            result = _tune_one(p, shape, dtype, kernel_list, budget, warmup_ms, rep_ms, seed, attention, gain, op,
                               default_fn(shape, dtype))
        except Exception as exc:  # OOM on the inputs, the default config failing, ...
            failures += 1
            msg = (str(exc).strip().splitlines() or [""])[0][:200]
            console.print(f"[red]{_shape_label(p)}: tuning failed: {type(exc).__name__}: {escape(msg)}[/]")
            summary_rows.add(tune_row(p, dtype, status="error", reason=f"{type(exc).__name__}: {msg}", key=key,
                                      meta=meta))
            shown.append("error")
            torch.cuda.empty_cache()
            continue
        tuning.save_result(result, cache_path)
        default = default_fn(shape, dtype)
        changes = config_changes(result.config, default)
        skipped = sum(len(ks.skipped) for ks in result.kernels.values())
        cand = (f"candidate {result.candidate_ms:.4g} ms, ratio {result.ratio:.3f} "
                f"(95% CI {result.ratio_lo:.3f}-{result.ratio_hi:.3f}); " if result.candidate is not None
                and result.ratio_hi == result.ratio_hi else "")
        console.print(f"[green]{_shape_label(p)}[/]: default {result.default_ms:.4g} ms, {cand}"
                      f"[bold]{result.decision}[/] ({result.speedup:.3f}x) in {result.wall_s:.1f} s; stored: {changes}"
                      + (f"; {skipped} candidate(s) skipped" if skipped else ""))
        for note in result.notes:
            console.print(f"  [yellow]note:[/] {escape(note)}")
        for k, ks in result.kernels.items():
            for cfg, why in ks.skipped[:3]:
                what = config_changes(MoDAConfig.from_dict(cfg), default)
                console.print(f"  [dim]{k}: skipped {what}: {escape(why)}[/]")
            if len(ks.skipped) > 3:
                console.print(f"  [dim]{k}: ... {len(ks.skipped) - 3} more skipped[/]")
        reasons = result.notes + [f"{k}: {len(ks.skipped)} skipped" for k, ks in result.kernels.items() if ks.skipped]
        summary_rows.add(result_row(p, dtype, result, key=key, meta=meta, reason="; ".join(reasons)[:500],
                                    tuned_fields=changes))
        shown.append(changes)

    summary_rows.restore_signals()
    for r, changes in zip(rows, shown):
        summary.add_row(f"T={r['T']} G={r['G']} L={r['L']}", f"{r['default_ms']:.4g}", f"{r['candidate_ms']:.4g}",
                        _ci(r), r["decision"] or "-", f"{r['speedup']:.3f}x", f"{r['wall_s']:.1f}", changes)
    console.print(summary)
    if out:
        write_summary(rows, out)
        console.print(f"wrote {out}")
    console.print(f"tuning wall time {time.perf_counter() - t_start:.1f} s; results in {cache_path}")
    if failures:
        raise typer.Exit(1)


def _tune_one(p, shape, dtype, kernel_list, budget, warmup_ms, rep_ms, seed, attention, min_gain, op="moda",
              default=None):
    """Tune one shape with a rich progress bar (one bar per kernel)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[best]}"), console=console, transient=True) as progress:
        state = {"task": None, "best": float("inf")}

        def on_plan(kernel, n, stats):
            state["best"] = float("inf")
            state["task"] = progress.add_task(
                f"{_shape_label(p)} {kernel} ({stats['pruned']}/{stats['space']} pruned)", total=n, best="")

        def on_done(cfg, ms, note):
            if ms is not None and ms < state["best"]:
                state["best"] = ms
            best = f"best {state['best']:.4g} ms" if state["best"] < float("inf") else ""
            progress.update(state["task"], advance=1, best=best)

        return tune_point(shape, dtype, kernel_list, budget=budget, warmup_ms=warmup_ms, rep_ms=rep_ms, seed=seed,
                          attention=attention, min_gain=min_gain, on_plan=on_plan, on_done=on_done, op=op,
                          default=default)
