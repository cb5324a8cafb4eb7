"""`moda-bench ablate`: the kernel ablation ladder on this GPU, beside the paper's A100. Options,
progress, the table in the paper's format and the figure; the measurements and the CSV upsert
are `moda_bench.bench.ablate`'s, the figure is drawn by the report's code (reports.inputs,
reports.tables, reports.figures) from the CSV.

`--T 1024,4096,16384` runs one ladder per sequence length and prints a summary (ms and gain over the
previous rung per T beside the paper's gain); rungs above their `max_T` are left out unless --all-rungs.

Outputs in --out: ablation.csv (schema.COLUMNS, sweep='ablation', provider=rung name; rows of a
re-run replace those with the same key) and ablation.png (ours vs paper, log scale). Rows carry
the process's CPUs and host canary (moda_bench.host; `--pin-cpu` pins it to one CPU first).
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from moda_bench.bench.ablate import FIGURE_STEM, NAIVE, PAPER_PASS, PAPER_POINT
from moda_bench.bench.runner import REP_MS, WARMUP_MS
from moda_bench.cli.sweep import checked

TABLE_WIDTH = 130


# ---------------------------------------------------------------------------------------------
# table, figure
# ---------------------------------------------------------------------------------------------

def _num(x) -> float:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return math.nan
    return x


def _eta_text(eta: float) -> str:
    if math.isnan(eta):
        return "-"
    inv = 1.0 / eta
    return f"1/{round(inv)}" if eta < 1 and abs(inv - round(inv)) < 1e-6 else f"{eta:.3g}"


def ablation_table(frame, *, show_paper: bool = True, title: str = "MoDA kernel ablation"):
    """Rich table in the paper's format: ms (p20-p80), speedup over previous rung and over naive,
    depth utilisation, paper A100 ms and speedup, accuracy, status."""
    from rich.table import Table

    from moda_bench import schema
    from moda_bench.kernels.moda.ladder.table import rung as find_rung

    table = Table(title=title, title_justify="left")
    for col, just in (("implementation", "left"), ("median ms (p20-p80)", "right"), ("x prev", "right"),
                      ("x naive", "right"), ("depth util.", "right"), ("paper A100 ms", "right"),
                      ("paper x prev", "right"), ("max rel err", "right"), ("status", "left")):
        table.add_column(col, justify=just)
    prev = naive = paper_prev = math.nan
    for _, r in frame.iterrows():
        ok = r["status"] == schema.OK
        ms = _num(r["median_ms"]) if ok else math.nan
        try:
            paper_ms = find_rung(r["provider"]).paper_ms if show_paper else None
        except ValueError:
            paper_ms = None
        paper_ms = math.nan if paper_ms is None else paper_ms
        if r["provider"] == NAIVE and ok:
            naive = ms
        cells = [
            str(r["provider"]),
            f"{ms:.4g} ({_num(r['p20_ms']):.4g}-{_num(r['p80_ms']):.4g})" if ok else "-",
            f"{prev / ms:.2f}x" if ok and not math.isnan(prev) else "-",
            f"{naive / ms:.1f}x" if ok and not math.isnan(naive) else "-",
            _eta_text(_num(r["depth_utilization"])),
            f"{paper_ms:.5g}" if not math.isnan(paper_ms) else "-",
            f"{paper_prev / paper_ms:.2f}x" if not math.isnan(paper_ms) and not math.isnan(paper_prev) else "-",
            f"{_num(r['max_rel_err']):.1e}" if not math.isnan(_num(r["max_rel_err"])) else "-",
            r["status"] if ok else f"[red]{r['status']}[/]: {r['reason']}",
        ]
        table.add_row(*cells)
        if ok:
            prev = ms
        if not math.isnan(paper_ms):
            paper_prev = paper_ms
    return table


def _paper_dir() -> Optional[Path]:
    """results/reference of the source checkout, when present."""
    d = Path(__file__).resolve().parents[2] / "results" / "reference"
    return d if d.is_dir() else None


def write_outputs(frame, out_dir: Path) -> tuple[Path, list[Path]]:
    """Upsert the measured rows into out_dir/ablation.csv (bench.ablate.write_csv); draw
    out_dir/ablation.png from that CSV. Returns (csv path, figure paths)."""
    from moda_bench.bench.ablate import write_csv
    from moda_bench.reports.figures import ablation_figure, save_figure
    from moda_bench.reports.inputs import load_paper, load_results
    from moda_bench.reports.tables import ablation_sections

    out_dir = Path(out_dir)
    csv_path = write_csv(frame, out_dir)
    rows = load_results([csv_path]).rows
    paper = load_paper(_paper_dir(), [out_dir])
    fig = ablation_figure(ablation_sections(rows, paper))
    figures = save_figure(fig, out_dir / FIGURE_STEM) if fig is not None else []
    return csv_path, figures


# ---------------------------------------------------------------------------------------------
# the command
# ---------------------------------------------------------------------------------------------

def _fail(console, msg: str, code: int = 1):
    console.print(f"[red]error:[/] {msg}")
    raise typer.Exit(code)


def parse_ts(text: str) -> tuple[int, ...]:
    """'1024,4096,16384' -> (1024, 4096, 16384): positive sequence lengths, duplicates dropped, order kept."""
    try:
        ts = tuple(dict.fromkeys(int(t) for t in str(text).replace(" ", "").split(",") if t))
    except ValueError:
        raise typer.BadParameter(f"--T must be sequence lengths separated by commas, got {text!r}") from None
    if not ts or min(ts) < 1:
        raise typer.BadParameter(f"--T must be sequence lengths >= 1, got {text!r}")
    return ts


def parse_skip(text: str, skip_naive: bool) -> tuple[str, ...]:
    """--skip (comma-separated rung names, checked) plus naive-torch under --skip-naive."""
    from moda_bench.kernels.moda.ladder.table import names
    skip = [s for s in (t.strip() for t in (text or "").split(",")) if s]
    unknown = [s for s in skip if s not in names()]
    if unknown:
        raise typer.BadParameter(f"--skip: unknown rung {unknown[0]!r}; rungs: {', '.join(names())}")
    return tuple(dict.fromkeys(skip + ([NAIVE] if skip_naive else [])))


def summary_table(frame, ts):
    """One row per rung: ms and gain over the previous measured rung at each T, and the paper's gain."""
    from rich.table import Table

    from moda_bench import schema
    from moda_bench.kernels.moda.ladder.table import RUNGS

    table = Table(title="ladder summary: ms and x previous rung per T (paper: A100, T=1024)", title_justify="left")
    table.add_column("rung")
    for T in ts:
        table.add_column(f"T={T} ms", justify="right")
        table.add_column("x prev", justify="right")
    table.add_column("paper x prev", justify="right")
    ms = {}
    for _, r in frame.iterrows():
        if r["status"] == schema.OK:
            ms[(r["provider"], int(r["T"]))] = _num(r["median_ms"])
    prev = {T: math.nan for T in ts}
    paper_prev = math.nan
    for rung in RUNGS:
        cells = [rung.name]
        for T in ts:
            v = ms.get((rung.name, T), math.nan)
            cells += [f"{v:.4g}" if not math.isnan(v) else "-",
                      f"{prev[T] / v:.2f}x" if not (math.isnan(v) or math.isnan(prev[T])) else "-"]
            if not math.isnan(v):
                prev[T] = v
        p = math.nan if rung.paper_ms is None else rung.paper_ms
        cells.append(f"{paper_prev / p:.2f}x" if not (math.isnan(p) or math.isnan(paper_prev)) else "-")
        if not math.isnan(p):
            paper_prev = p
        table.add_row(*cells)
    return table


def ablate_command(
    T: Annotated[str, typer.Option("--T", help="Sequence length(s), comma-separated: one ladder each "
                                   "(e.g. 1024,4096,16384).")] = str(PAPER_POINT["T"]),
    G: Annotated[int, typer.Option("--G", help="Query heads per KV head (Hq = G * Hk).")] = PAPER_POINT["G"],
    Hk: Annotated[int, typer.Option("--Hk", help="KV heads.")] = PAPER_POINT["Hk"],
    d: Annotated[int, typer.Option("--d", help="Head dim.")] = PAPER_POINT["d"],
    L: Annotated[int, typer.Option("--L", help="Depth entries per position.")] = PAPER_POINT["L"],
    B: Annotated[int, typer.Option("--B", help="Batch.")] = PAPER_POINT["B"],
    C: Annotated[int, typer.Option("--C", help="Query chunk in rows (power of two, 16..128).")] = PAPER_POINT["C"],
    dtype: Annotated[str, typer.Option("--dtype", help="bf16, fp16 or fp32.")] = "bf16",
    pass_: Annotated[str, typer.Option("--pass", help="fwd, bwd or fwdbwd.")] = PAPER_PASS,
    skip_naive: Annotated[bool, typer.Option("--skip-naive", help="Leave out the (slow) naive PyTorch rung.")] = False,
    skip: Annotated[str, typer.Option("--skip", help="Rungs to leave out, comma-separated.")] = "",
    all_rungs: Annotated[bool, typer.Option("--all-rungs", help="Also run rungs above their T limit (naive-torch "
                                            "above 1024, flash-compatible above 4096).")] = False,
    naive_reps: Annotated[int, typer.Option("--naive-reps", help="Timed calls of the naive rung (about 1 s each at "
                                            "T=1024).")] = 10,
    warmup_ms: Annotated[float, typer.Option("--warmup-ms", help="do_bench warm-up of the Triton rungs.")] = WARMUP_MS,
    rep_ms: Annotated[float, typer.Option("--rep-ms", help="do_bench repetition time of the Triton rungs.")] = REP_MS,
    out: Annotated[Path, typer.Option("--out", help="Output directory (ablation.csv, ablation.png).")] =
        Path("results/ablation"),
    pin_cpu: Annotated[str, typer.Option("--pin-cpu", help="Pin this process to one CPU: 'off' (default) or a "
                                         "CPU id (of a list, the first is used).")] = "off",
) -> None:
    """Run the cumulative kernel ablation ladder (naive -> flash-compatible -> chunk-aware -> group-aware -> the
    project's steps -> ours), each rung the previous one plus one idea, at one or more T."""
    from rich.console import Console

    from moda_bench import host, schema

    started = time.perf_counter()
    console = Console(stderr=True, soft_wrap=True)
    dtype_name = checked(schema.dtype_name, dtype, option=True)
    checked(schema.check_pass, pass_, option=True)
    ts = parse_ts(T)
    for name, value, low in (("G", G, 1), ("Hk", Hk, 1), ("B", B, 1), ("L", L, 0), ("naive-reps", naive_reps, 1)):
        if value < low:
            raise typer.BadParameter(f"--{name} must be >= {low}, got {value}")
    if d not in (16, 32, 64, 128):
        raise typer.BadParameter(f"--d must be one of 16, 32, 64, 128, got {d}")
    if C < 16 or C > 128 or C & (C - 1):
        raise typer.BadParameter(f"--C must be a power of two in 16..128, got {C}")
    from moda_bench.kernels.moda.config import group_pad
    gp = group_pad(G)
    if C % gp:
        raise typer.BadParameter(f"--C={C} must be a multiple of G rounded up to a power of two ({gp})")
    skipped = parse_skip(skip, skip_naive)
    pin = checked(host.parse_pin_cpu, pin_cpu)
    checked(host.pin_process, pin, 0)   # before CUDA starts its threads

    import torch
    if not torch.cuda.is_available():
        _fail(console, "moda-bench ablate needs a CUDA GPU (torch.cuda.is_available() is False)")

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from moda_bench.bench.ablate import AblationSpec, ablation_frame, is_paper_config, run_ablation, write_csv
    from moda_bench.bench.runner import Point
    from moda_bench.kernels.moda.ladder.table import RUNGS

    spec = AblationSpec(points=tuple(Point(T=t, G=G, Hk=Hk, L=L, B=B, d=d, C=C, dtype=dtype_name) for t in ts),
                        pass_=pass_, skip=skipped, all_rungs=all_rungs, naive_reps=naive_reps, warmup_ms=warmup_ms,
                        rep_ms=rep_ms)
    meta = schema.run_metadata()
    host_state = host.process_host(pin, 0)
    meta.update(host_state.columns())
    console.print(f"host: {host.describe(host_state.columns())}", markup=False, highlight=False)
    console.print(f"[bold]ablation[/] on {meta['gpu']}: B={B} T={','.join(map(str, ts))} G={G} Hq={G * Hk} Hk={Hk} "
                  f"d={d} L={L} C={C} {dtype_name} {pass_}")
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as progress:
        overall = progress.add_task("rungs", total=len(RUNGS) * len(ts))

        def on_rung(rung) -> None:
            progress.update(overall, description=f"rungs: {rung.name}")

        def naive_progress(n_positions: int, reps: int):
            steps = progress.add_task(f"  {NAIVE}: positions (accuracy run)", total=n_positions)
            timed = progress.add_task(f"  {NAIVE}: timed calls", total=reps)
            return (lambda t: progress.update(steps, completed=t + 1)), (lambda i: progress.advance(timed))

        def on_row(rung, row) -> None:
            progress.advance(overall)
            if row["status"] == schema.OK:
                progress.console.print(f"  T={row['T']} {rung.name}: {row['median_ms']:.3f} ms")
            else:
                progress.console.print(f"  T={row['T']} {rung.name}: [yellow]{row['status']}[/] {row['reason']}")

        def on_point(part) -> None:  # each T's rows saved before the next T starts (a long run cut short keeps them)
            try:
                write_csv(ablation_frame(part), out)
            except (OSError, ValueError) as err:
                _fail(console, f"could not write results to {out}: {err}")

        rows = run_ablation(spec, meta, on_rung=on_rung, on_row=on_row, naive_progress=naive_progress,
                            on_point=on_point)

    frame = ablation_frame(rows)
    table_console = Console(width=max(Console().width, TABLE_WIDTH))  # logs/pipes default to 80 columns
    for point in spec.points:
        part = frame[frame["T"] == point.T]
        paper_config = is_paper_config(point, pass_)
        title = (f"MoDA kernel ablation on {meta['gpu']}: B={B} T={point.T} G={G} Hk={Hk} d={d} L={L} C={C} "
                 f"{dtype_name} {pass_}")
        table_console.print(ablation_table(part, show_paper=paper_config, title=title))
        if not paper_config:
            console.print("paper A100 ms omitted: they are for B=1 T=1024 G=8 Hk=8 d=64 L=64 C=64 bf16 fwd+bwd "
                          "(its gains are in the summary)")
    if len(ts) > 1 or not is_paper_config(spec.points[0], pass_):
        table_console.print(summary_table(frame, ts))
    try:
        csv_path, figures = write_outputs(frame, out)
    except (OSError, ValueError) as err:
        _fail(console, f"could not write results to {out}: {err}")
    console.print(f"wrote {csv_path}" + (" and " + ", ".join(str(p) for p in figures) if figures else ""))
    console.print(f"total wall time {time.perf_counter() - started:.1f} s")
