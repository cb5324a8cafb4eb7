"""`moda-bench tune`: autotune the fused MoDA kernel for one shape, a one-axis sweep or a
preset, persist the result in the tuning cache (moda_bench.tuning) and report how the winner
compares with the default configuration (fwd+bwd). The options become one
`bench.spec.TuneSpec`, run by `moda_bench.bench.tune.run_tuning`; this module prints what it
reports (progress bars, one line per shape, the summary table) and does `--show` and
`--export-shipped`.

Candidates are timed like the sweep (moda_bench.timing.measure); the winner is then timed
against the default in interleaved rounds and kept only if the 95% upper bound of its time
ratio is below 1 - `--min-gain` (decision 'tuned'), else the default is stored ('default').
Where the search found nothing faster, its closest candidate is compared the same way, so a kept
default carries that candidate's ratio and interval. Each shape's result is saved as soon as it
is found and shapes already in the cache are skipped (--force retunes), so a long preset can be
run in several invocations.
`--export-shipped DIR` writes the cache's 'tuned' entries as the package's shipped configs
(DIR/<gpu-slug>.json; the package's own directory is moda_bench/kernels/moda/tuned). torch/triton
are imported inside the command.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from moda_bench.bench.spec import DEFAULT_TUNE_KERNELS, SpecError, TuneSpec
from moda_bench.bench.tune import TuneError, config_changes, run_tuning

console = Console(stderr=False)


DEFAULT_KERNELS = ",".join(DEFAULT_TUNE_KERNELS)


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
        left = col in ("op", "gpu", "triton", "dtype", "decision", "date")
        table.add_column(col, justify="left" if left else "right")

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
    Console(width=None if sys.stdout.isatty() else 200).print(table)   # a pipe or log keeps every column


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
        "placements and depth-only launches), fwd, bwd_q, bwd_kv (tiles); fwd_items, fwd_ctas, bwd_kernel, "
        "bwd_items, bwd_ctas (moda-overlap's streaming depth items, backward depth kernel and program counts; "
        "fwd_ctas, bwd_kernel, bwd_ctas by default).")] = DEFAULT_KERNELS,
    budget: Annotated[int, typer.Option(
        "--budget", "--max-candidates", min=1, help="Most candidates timed per kernel and shape.")] = 40,
    cache: Annotated[Optional[Path], typer.Option(
        "--cache", help="Tuning cache file (default: $MODA_BENCH_TUNING_CACHE or the platform cache dir).")] = None,
    out: Annotated[Optional[Path], typer.Option(
        "--out", "-o", help="CSV summary: shape, default/candidate/tuned ms, ratio and its 95% CI, decision, "
        "wall_s, config.")] = None,
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
        "needs FA4 and L > 0; only the fwd_depth, bwd_depth groups apply) or moda-overlap (its streaming depth "
        "kernels: fwd_items, fwd_ctas, bwd_kernel, bwd_items, bwd_ctas; needs FA4 and L > 0).")] = "moda",
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
    given = dict(T=T, G=G, L=L, B=B, Hk=Hk, d=d)
    requested = [k.strip() for k in kernels.split(",") if k.strip()]
    try:
        spec = TuneSpec(shape=tuple((k, v) for k, v in given.items() if v is not None), dtype=dtype, vary=vary,
                        values=tuple(_parse_ints(values, "--values")) if values else None, preset=preset, op=op,
                        kernels=None if kernels == DEFAULT_KERNELS else tuple(requested), budget=budget,
                        min_gain=parse_gain(min_gain), warmup_ms=warmup_ms, rep_ms=rep_ms, seed=seed, cache=cache,
                        out=out, force=force, device=device, resume=resume,
                        allow_commit_change=allow_commit_change)
        if spec.dropped:
            console.print(f"[dim]{op}: tuning {', '.join(spec.kernels)} only (its sequence part is FA4; "
                          f"{', '.join(spec.dropped)} do not apply)[/]")
        from moda_bench.cli.lifecycle import resume_command
        run = run_tuning(spec, RichReporter(resume_command=resume_command(out, True)))
    except SpecError as exc:
        raise typer.BadParameter(str(exc), param_hint=exc.option or None) from None
    except TuneError as exc:
        _fail(str(exc), exc.code)

    summary = Table(title="MoDA tuning (fwd+bwd median ms; ratio = candidate / default, 95% CI)")
    for col in ("shape", "default ms", "candidate ms", "ratio 95% CI", "decision", "speedup", "wall s",
                "tuned fields"):
        summary.add_column(col, justify="left" if col in ("shape", "decision", "tuned fields") else "right")
    for r, changes in zip(run.rows, run.changes):
        summary.add_row(f"T={r['T']} G={r['G']} L={r['L']}", f"{r['default_ms']:.4g}", f"{r['candidate_ms']:.4g}",
                        _ci(r), r["decision"] or "-", f"{r['speedup']:.3f}x", f"{r['wall_s']:.1f}", changes)
    console.print(summary)
    if spec.out:
        console.print(f"wrote {spec.out}")
    console.print(f"tuning wall time {run.wall_s:.1f} s; results in {run.cache_path}")
    if run.failures:
        raise typer.Exit(1)


class RichReporter:
    """bench.tune.TuneReporter printing to the console: a line per shape, a progress bar per
    field group while a shape is tuned; `interrupted` prints what a SIGINT/SIGTERM kept and the
    command (`resume_command`) that resumes the run."""

    def __init__(self, resume_command: str = "moda-bench tune --resume"):
        self.resume_command = resume_command

    def interrupted(self, text: str) -> None:
        console.print(text, markup=False, highlight=False)

    def start(self, spec, gpu: str, shapes: int, points: int, cache_path) -> None:
        console.print(f"tuning {spec.op}: {shapes} shape(s) ({points} point(s)) on {gpu}, kernels "
                      f"{', '.join(spec.kernels)}, budget {spec.budget}/kernel, min gain {spec.min_gain:.1%}; "
                      f"cache {cache_path}")

    def cached(self, p, changes: str) -> None:
        console.print(f"[dim]{_shape_label(p)}: cached ({changes}); --force retunes[/]")

    def failed(self, p, error: str) -> None:
        console.print(f"[red]{_shape_label(p)}: tuning failed: {escape(error)}[/]")

    def tuned(self, p, result, changes: str, default) -> None:
        from moda_bench.kernels.moda import MoDAConfig
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

    @contextmanager
    def progress(self, p):
        """One bar per field group of shape p, with the best time so far."""
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

            yield on_plan, on_done
