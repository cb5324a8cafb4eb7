"""`moda-bench ablate`: the kernel ablation ladder (spec section 3) on this GPU, beside the paper's A100.

Every rung of `moda_bench.ops.moda.ladder.table.RUNGS` runs through the sweep machinery (the rungs are
registered providers; `runner.run_one` makes the inputs, checks a slice against moda_reference,
times with do_bench and fills one schema row). The naive rung takes about a second per call at
T=1024, so it is timed with a few CUDA-event repetitions instead of do_bench, and shows its
per-position progress during its first (accuracy-check) call.

Outputs in --out: ablation.csv (schema.COLUMNS, sweep='ablation', provider=rung name; rows of a
re-run replace those with the same key) and ablation.png/.svg (ours vs paper, log scale, drawn by
the report's figure code from that CSV).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from moda_bench import schema

SWEEP_NAME = "ablation"
CSV_NAME = "ablation.csv"
FIGURE_STEM = "ablation"
PASSES = ("fwd", "bwd", "fwdbwd")
DTYPE_ALIASES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16",
                 "fp32": "float32", "float32": "float32"}
# the paper's ablation configuration (its A100 numbers apply only there)
PAPER_POINT = dict(B=1, T=1024, G=8, Hk=8, d=64, L=64, C=64, dtype="bfloat16")
PAPER_PASS = "fwdbwd"
SEED = 0
TABLE_WIDTH = 130


# ---------------------------------------------------------------------------------------------
# timing of the naive rung
# ---------------------------------------------------------------------------------------------

class _Stepper:
    """on_step callback of moda_naive driving a progress task while `active`."""

    def __init__(self, progress, task):
        self.progress, self.task, self.active = progress, task, True

    def __call__(self, t: int) -> None:
        if self.active:
            self.progress.update(self.task, completed=t + 1)


def _naive_with_progress(provider, naive_fn, progress, T: int, reps: int):
    """The naive provider with per-position progress during its first (accuracy) call, and a
    few-repetition timer that switches that progress off and counts its timed calls."""
    stepper = _Stepper(progress, progress.add_task("  naive-torch: positions (accuracy run)", total=T))
    rep_task = progress.add_task("  naive-torch: timed calls", total=reps)
    base_prepare = provider.prepare

    def prepare(inputs, point, chunk):
        prepared = base_prepare(inputs, point, chunk)
        args = [inputs[n] for n in ("q", "k", "v", "k_depth", "v_depth")]
        return dataclasses.replace(prepared, forward=lambda: naive_fn(*args, chunk=chunk, on_step=stepper))

    base_timer = few_reps_timer(reps, on_rep=lambda i: progress.advance(rep_task))

    def timer(fn, **kw):
        stepper.active = False  # no progress callbacks inside the timed calls
        return base_timer(fn, **kw)

    return dataclasses.replace(provider, prepare=prepare), timer


def few_reps_timer(reps: int, on_rep=None):
    """A `timer` for runner.run_one: `reps` CUDA-event timed calls (no extra warm-up: the accuracy
    check before it already ran the pass once); median/p20/p80 of those."""

    def timer(fn, grad_to_none=None, warmup_ms=None, rep_ms=None) -> dict:
        import torch
        from moda_bench.timing import QUANTILES
        times = []
        for i in range(reps):
            for t in grad_to_none or []:
                t.grad = None
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
            if on_rep is not None:
                on_rep(i)
        med, p20, p80 = torch.tensor(times, dtype=torch.float64).quantile(torch.tensor(QUANTILES, dtype=torch.float64))
        return {"median_ms": float(med), "p20_ms": float(p20), "p80_ms": float(p80)}

    return timer


# ---------------------------------------------------------------------------------------------
# table, CSV, figure
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


def ablation_frame(rows: list[dict]):
    """Rows (dicts) -> DataFrame with exactly schema.COLUMNS."""
    import pandas as pd
    return pd.DataFrame(rows, columns=schema.COLUMNS)


def ablation_table(frame, *, show_paper: bool = True, title: str = "MoDA kernel ablation"):
    """Rich table in the paper's format: ms (p20-p80), speedup over previous rung and over naive,
    depth utilisation, paper A100 ms and speedup, accuracy, status."""
    from rich.table import Table
    from moda_bench.ops.moda.ladder.table import rung as find_rung

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
        if r["provider"] == "naive-torch" and ok:
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
    """Upsert the measured rows (not 'skipped') into out_dir/ablation.csv on (sweep, row key);
    draw out_dir/ablation.png/.svg from that CSV. Returns (csv path, figure paths)."""
    import pandas as pd
    from moda_bench.reports.figures import ablation_figure, save_figure
    from moda_bench.reports.report import ablation_sections, load_paper, load_results

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / CSV_NAME
    new = frame[frame["status"] != schema.SKIPPED]
    if csv_path.exists() and csv_path.stat().st_size > 0:
        old = pd.read_csv(csv_path, keep_default_na=False, na_values=[""])
        if list(old.columns) != schema.COLUMNS:
            raise ValueError(f"{csv_path} does not have the schema.COLUMNS header; choose another --out")
        new = pd.concat([old, new], ignore_index=True)
    key = ["sweep"] + schema.KEY_COLUMNS
    new = new.astype({c: str for c in key}).drop_duplicates(subset=key, keep="last")
    tmp = csv_path.with_suffix(".csv.tmp")
    new.to_csv(tmp, index=False, columns=schema.COLUMNS)
    os.replace(tmp, csv_path)

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


def ablate_command(
    T: Annotated[int, typer.Option("--T", help="Sequence length.")] = 1024,
    G: Annotated[int, typer.Option("--G", help="Query heads per KV head (Hq = G * Hk).")] = 8,
    Hk: Annotated[int, typer.Option("--Hk", help="KV heads.")] = 8,
    d: Annotated[int, typer.Option("--d", help="Head dim.")] = 64,
    L: Annotated[int, typer.Option("--L", help="Depth entries per position.")] = 64,
    B: Annotated[int, typer.Option("--B", help="Batch.")] = 1,
    C: Annotated[int, typer.Option("--C", help="Query chunk in rows (power of two, 16..128).")] = 64,
    dtype: Annotated[str, typer.Option("--dtype", help="bf16, fp16 or fp32.")] = "bf16",
    pass_: Annotated[str, typer.Option("--pass", help="fwd, bwd or fwdbwd.")] = "fwdbwd",
    skip_naive: Annotated[bool, typer.Option("--skip-naive", help="Leave out the (slow) naive PyTorch rung.")] = False,
    naive_reps: Annotated[int, typer.Option("--naive-reps", help="Timed calls of the naive rung.")] = 3,
    warmup_ms: Annotated[float, typer.Option("--warmup-ms", help="do_bench warm-up of the Triton rungs.")] = 25.0,
    rep_ms: Annotated[float, typer.Option("--rep-ms", help="do_bench repetition time of the Triton rungs.")] = 100.0,
    out: Annotated[Path, typer.Option("--out", help="Output directory (ablation.csv, ablation.png).")] =
        Path("results/ablation"),
) -> None:
    """Run the kernel ablation ladder (naive -> flash-compatible -> chunk-aware -> group-aware -> batched-tiles -> ours)."""
    from rich.console import Console

    started = time.perf_counter()
    console = Console(stderr=True, soft_wrap=True)
    dtype_name = DTYPE_ALIASES.get(dtype.lower())
    if dtype_name is None:
        raise typer.BadParameter(f"--dtype must be one of bf16, fp16, fp32, got {dtype!r}")
    if pass_ not in PASSES:
        raise typer.BadParameter(f"--pass must be fwd, bwd or fwdbwd, got {pass_!r}")
    for name, value, low in (("T", T, 1), ("G", G, 1), ("Hk", Hk, 1), ("B", B, 1), ("L", L, 0),
                             ("naive-reps", naive_reps, 1)):
        if value < low:
            raise typer.BadParameter(f"--{name} must be >= {low}, got {value}")
    if d not in (16, 32, 64, 128):
        raise typer.BadParameter(f"--d must be one of 16, 32, 64, 128, got {d}")
    if C < 16 or C > 128 or C & (C - 1):
        raise typer.BadParameter(f"--C must be a power of two in 16..128, got {C}")
    from moda_bench.ops.moda.config import group_pad
    gp = group_pad(G)
    if C % gp:
        raise typer.BadParameter(f"--C={C} must be a multiple of G rounded up to a power of two ({gp})")

    import torch
    if not torch.cuda.is_available():
        _fail(console, "moda-bench ablate needs a CUDA GPU (torch.cuda.is_available() is False)")

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from moda_bench.ops.moda.ladder.table import RUNGS
    from moda_bench.ops.moda.validate import MoDAShape
    from moda_bench.bench.providers import get_provider
    from moda_bench.bench.runner import Point, run_one
    from moda_bench.timing import measure

    point = Point(T=T, G=G, Hk=Hk, L=L, B=B, d=d, C=C, dtype=dtype_name)
    shape = MoDAShape(B=B, T=T, Hq=G * Hk, Hk=Hk, d=d, L=L)
    meta = schema.run_metadata()
    console.print(f"[bold]ablation[/] on {meta['gpu']}: B={B} T={T} G={G} Hq={G * Hk} Hk={Hk} d={d} L={L} C={C} "
                  f"{dtype_name} {pass_}")
    rows = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as progress:
        overall = progress.add_task("rungs", total=len(RUNGS))
        for rung in RUNGS:
            progress.update(overall, description=f"rungs: {rung.name}")
            provider = get_provider(rung.name)
            timer, reason = measure, provider.unavailable("cuda")
            if rung.name == "naive-torch":
                if skip_naive:
                    reason = "--skip-naive"
                else:
                    provider, timer = _naive_with_progress(provider, rung.fn, progress, T, naive_reps)
            row = run_one(provider, point, pass_, sweep_name=SWEEP_NAME, device="cuda", chunk=C, timer=timer,
                          warmup_ms=warmup_ms, rep_ms=rep_ms, seed=SEED, unavailable_reason=reason, meta=meta)
            row["impl_detail"] = rung.label
            row["config"] = json.dumps(rung.launch_config(shape, getattr(torch, dtype_name), C), sort_keys=True)
            rows.append(row)
            progress.advance(overall)
            if row["status"] == schema.OK:
                progress.console.print(f"  {rung.name}: {row['median_ms']:.3f} ms")
            else:
                progress.console.print(f"  {rung.name}: [yellow]{row['status']}[/] {row['reason']}")

    frame = ablation_frame(rows)
    is_paper_config = all(getattr(point, k) == v for k, v in PAPER_POINT.items()) and pass_ == PAPER_PASS
    title = (f"MoDA kernel ablation on {meta['gpu']}: B={B} T={T} G={G} Hk={Hk} d={d} L={L} C={C} "
             f"{dtype_name} {pass_}")
    table_console = Console(width=max(Console().width, TABLE_WIDTH))  # logs/pipes default to 80 columns
    table_console.print(ablation_table(frame, show_paper=is_paper_config, title=title))
    if not is_paper_config:
        console.print("paper A100 numbers omitted: they are for B=1 T=1024 G=8 Hk=8 d=64 L=64 C=64 bf16 fwd+bwd")
    try:
        csv_path, figures = write_outputs(frame, out)
    except (OSError, ValueError) as err:
        _fail(console, f"could not write results to {out}: {err}")
    console.print(f"wrote {csv_path}" + (" and " + ", ".join(str(p) for p in figures) if figures else ""))
    console.print(f"total wall time {time.perf_counter() - started:.1f} s")
