"""The kernel ablation ladder (spec section 3) as measurements: every rung of
`moda_bench.kernels.moda.ladder.table.RUNGS` through the sweep machinery (the rungs are registered
providers; `point.run_point` makes the inputs, checks a slice against moda_reference, times it
with at least 10 L2-flushed repetitions and fills one schema row), and the upsert of those rows
into `ablation.csv`.

`AblationSpec` is what the command hands down: the points (one per T), the rungs left out and
the timing options; `run_ablation` runs the ladder at each point.

The naive rung takes about a second per call at T=1024, so it is timed with a few CUDA-event
repetitions instead of do_bench (`few_reps_timer`); callbacks report its per-position progress
during its first (accuracy-check) call and its timed calls. Options, progress bars, the table and
the figure belong to the command (`moda_bench.cli.ablate`).
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from moda_bench import results, schema
from moda_bench.bench.point import CHECK_LEN

SWEEP_NAME = "ablation"
CSV_NAME = "ablation.csv"
FIGURE_STEM = "ablation"
NAIVE = "naive-torch"
# the paper's ablation configuration (its A100 numbers apply only there)
PAPER_POINT = dict(B=1, T=1024, G=8, Hk=8, d=64, L=64, C=64, dtype="bfloat16")
PAPER_PASS = "fwdbwd"
SEED = 0

Callback = Callable[[int], None]


def few_reps_timer(reps: int, on_rep: Callback | None = None):
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


def naive_rung(provider, naive_fn, reps: int, on_step: Callback | None = None, on_rep: Callback | None = None):
    """(provider, timer) for the naive rung: the provider's forward reports each position it
    finishes to on_step during its first (accuracy) call only; the timer makes `reps` timed calls,
    each reported to on_rep."""
    state = {"accuracy_run": True}

    def step(t: int) -> None:
        if state["accuracy_run"] and on_step is not None:
            on_step(t)

    base_prepare = provider.prepare

    def prepare(inputs, point, chunk):
        prepared = base_prepare(inputs, point, chunk)
        args = [inputs[n] for n in ("q", "k", "v", "k_depth", "v_depth")]
        return dataclasses.replace(prepared, forward=lambda: naive_fn(*args, chunk=chunk, on_step=step))

    base_timer = few_reps_timer(reps, on_rep=on_rep)

    def timer(fn, **kw):
        state["accuracy_run"] = False  # no progress callbacks inside the timed calls
        return base_timer(fn, **kw)

    return dataclasses.replace(provider, prepare=prepare), timer


@dataclass(frozen=True)
class AblationSpec:
    """What `moda-bench ablate` runs: the ladder at each point (one per T), which rungs to leave out
    (`skip`; rungs above their `max_T` too unless `all_rungs`) and the timing options."""

    points: tuple
    warmup_ms: float
    rep_ms: float
    pass_: str = PAPER_PASS
    skip: tuple = ()
    all_rungs: bool = False
    naive_reps: int = 10

    def skipped(self, rung, T: int) -> str | None:
        """Why `rung` is left out at sequence length T (None: it runs)."""
        if rung.name in self.skip:
            return "--skip" if rung.name != NAIVE else "--skip / --skip-naive"
        max_t = getattr(rung, "max_T", None)
        if not self.all_rungs and max_t is not None and T > max_t:
            return f"T > {max_t}: this rung's cost grows past the run's budget there (--all-rungs runs it)"
        return None


def run_ablation(spec: AblationSpec, meta: dict, *, on_rung: Callable | None = None, on_row: Callable | None = None,
                 naive_progress: Callable | None = None, on_point: Callable | None = None) -> list[dict]:
    """`run_ladder` at every point of the spec, in order; the rows of all points (callbacks as there;
    on_point(rows) after each point with that point's rows, e.g. to save them before the next starts)."""
    from moda_bench.kernels.moda.ladder.table import RUNGS
    rows = []
    for point in spec.points:
        skip = {r.name: why for r in RUNGS if (why := spec.skipped(r, point.T))}
        part = run_ladder(point, spec.pass_, skip=skip, naive_reps=spec.naive_reps, warmup_ms=spec.warmup_ms,
                          rep_ms=spec.rep_ms, meta=meta, on_rung=on_rung, on_row=on_row,
                          naive_progress=naive_progress)
        if on_point is not None:
            on_point(part)
        rows += part
    return rows


def run_ladder(point, pass_: str, *, skip_naive: bool = False, skip: dict | None = None, naive_reps: int = 10,
               warmup_ms: float, rep_ms: float, meta: dict, on_rung: Callable | None = None,
               on_row: Callable | None = None, naive_progress: Callable | None = None) -> list[dict]:
    """One schema row per rung (sweep 'ablation', provider = rung name, impl_detail = its label,
    config = its launch configuration) on cuda, in ladder order; a rung in `skip` (name -> reason)
    gets a 'skipped' row with that reason.

    on_rung(rung) before a rung runs, on_row(rung, row) after; naive_progress(T, reps) ->
    (on_step, on_rep) when the naive rung is about to run (not when skipped)."""
    import torch

    from moda_bench.bench.point import TimingOptions, run_point
    from moda_bench.bench.providers import get_provider
    from moda_bench.bench.runner import base_row
    from moda_bench.kernels.moda import MoDAShape
    from moda_bench.kernels.moda.ladder.table import RUNGS

    shape = MoDAShape(B=point.B, T=point.T, Hq=point.Hq, Hk=point.Hk, d=point.d, L=point.L)
    rows = []
    for rung in RUNGS:
        if on_rung is not None:
            on_rung(rung)
        provider = get_provider(rung.name)
        timer, reason = None, provider.unavailable("cuda")
        if skip_naive and rung.name == NAIVE:
            reason = "--skip-naive"
        reason = (skip or {}).get(rung.name) or reason
        if rung.name == NAIVE and not reason:
            hooks = naive_progress(point.T, naive_reps) if naive_progress is not None else (None, None)
            provider, timer = naive_rung(provider, rung.fn, naive_reps, *hooks)
        row = base_row(point, provider.name, pass_, SWEEP_NAME)
        row.update(meta or {}, timer="eager" if timer is None else "custom")
        run_point([provider], point, pass_, [row], device="cuda", chunk=point.C, seed=SEED,
                  check_len=CHECK_LEN, unavailable={provider.name: reason},
                  opts=TimingOptions(warmup_ms=warmup_ms, min_time_ms=rep_ms), timer=timer)
        row["impl_detail"] = rung.label
        row["config"] = json.dumps(rung.launch_config(shape, getattr(torch, point.dtype), point.C), sort_keys=True)
        rows.append(row)
        if on_row is not None:
            on_row(rung, row)
    return rows


def ablation_frame(rows: list[dict]):
    """Rows (dicts) -> DataFrame with exactly schema.COLUMNS."""
    import pandas as pd
    return pd.DataFrame(rows, columns=schema.COLUMNS)


def is_paper_config(point, pass_: str) -> bool:
    """Whether the paper's A100 numbers apply: its shape, dtype and pass."""
    return all(getattr(point, k) == v for k, v in PAPER_POINT.items()) and pass_ == PAPER_PASS


def write_csv(frame, out_dir: Path) -> Path:
    """Upsert the measured rows (not 'skipped') into out_dir/ablation.csv on schema.ROW_KEY (a
    re-run replaces rows with the same key, other rows stay); returns the CSV's path."""
    import pandas as pd

    from moda_bench.bench.runner import schema_rows

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / CSV_NAME
    new = frame[frame["status"] != schema.SKIPPED]
    if csv_path.exists() and csv_path.stat().st_size > 0:
        new = pd.concat([schema_rows(results.read_csv(csv_path)), schema_rows(new)], ignore_index=True)
    merged = schema_rows(new).drop_duplicates(subset=schema.ROW_KEY, keep="last")
    results.write_csv_atomic(csv_path, merged)
    return csv_path
