"""Sweep planning and execution: the `Point`, one schema row per (provider, point), the sweep loop.

A sweep is a list of `Point`s; each point is run for every requested provider (fa2 first, the
baseline of extra_time_pct / ratio_to_fa2); one CSV row (schema: moda_bench.schema.COLUMNS)
is appended per (provider, point) as it finishes (`results.append_row`), so an interrupted sweep
keeps its rows. Axes, their paper values, the base point and the pass names are the schema's.

Per row: fresh random inputs (same seed for every provider of a point), an accuracy check of a
slice against moda_reference, then timing (warm-up, do_bench median/p20/p80, L2 flushed).
"""
from __future__ import annotations

import dataclasses
import gc
import json
import math
import random
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Optional

from moda_bench import results, schema

# ||out - ref|| / ||ref|| above which a row is marked 'error' (bf16/fp16 kernels vs fp64 reference)
ACCURACY_TOL = {"bfloat16": 4e-2, "float16": 1e-2, "float32": 1e-3}
CHECK_LEN = 512  # positions of batch 0 compared with the reference
# do_bench budget: the default, and --quick
WARMUP_MS, REP_MS = 25.0, 100.0
QUICK_WARMUP_MS, QUICK_REP_MS = 5.0, 20.0

_BASE = schema.BASE_POINT


@dataclass(frozen=True)
class Point:
    """One configuration (defaults: schema.BASE_POINT). Hq = G * Hk. C is the query chunk in rows
    (MoDA block_m)."""

    T: int = _BASE["T"]
    G: int = _BASE["G"]
    Hk: int = _BASE["Hk"]
    L: int = _BASE["L"]
    B: int = _BASE["B"]
    d: int = _BASE["d"]
    C: int = _BASE["C"]
    dtype: str = _BASE["dtype"]

    @property
    def Hq(self) -> int:
        return self.G * self.Hk

    def to_dict(self) -> dict:
        """The fields and Hq (run.json, CSV rows)."""
        d = asdict(self)
        d["Hq"] = self.Hq
        return d

    def fields(self) -> dict:
        """The fields only (Hq is derived): what `from_dict` takes back."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Point":
        """Inverse of `fields` / `to_dict` (other keys, such as Hq, are ignored)."""
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})

    def replace(self, **kw) -> "Point":
        return replace(self, **kw)


def plan_points(vary: str, values: list[int] | None, base: Point) -> list[Point]:
    """Points of a one-axis sweep over `vary` in schema.AXES (values None = the paper's,
    schema.AXIS_VALUES)."""
    if vary not in schema.AXIS_VALUES:
        raise ValueError(f"vary must be one of {', '.join(schema.AXIS_VALUES)}, got {vary!r}")
    values = list(schema.AXIS_VALUES[vary] if values is None else values)
    if not values:
        raise ValueError(f"no values to sweep {vary} over")
    minimum = 0 if vary == "L" else 1
    for v in values:
        if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
            raise ValueError(f"{vary} values must be integers >= {minimum}, got {v!r}")
    if len(set(values)) != len(values):
        raise ValueError(f"{vary} values repeat: {values}")
    return [base.replace(**{vary: v}) for v in values]


# ---------------------------------------------------------------------------------------------
# rows
# ---------------------------------------------------------------------------------------------

def base_row(point: Point, provider: str, pass_: str, sweep_name: str) -> dict:
    """A schema row of (sweep, provider, pass, point) with no measurement yet (measures NaN)."""
    row = {c: None for c in schema.COLUMNS}
    cfg = point.to_dict()
    row.update({c: cfg[c] for c in schema.CONFIG_COLUMNS})
    row.update({"sweep": sweep_name, "provider": provider, "pass": pass_, "impl_detail": "", "reason": "",
                "config": ""})
    for c in schema.MEASURE_COLUMNS:
        row[c] = math.nan
    return row


def schema_rows(frame):
    """Exactly schema.COLUMNS, integer columns (configuration, gpu_index) as integers: what the
    rows read back by `results.read_csv` (numbers as floats) need before they are written again,
    so a rewritten CSV reads `T=1024`, as `run_sweep` wrote it, not `1024.0`."""
    import pandas as pd
    frame = results.schema_frame(frame).copy()
    for c in schema.INT_CONFIG_COLUMNS + ["gpu_index"]:
        frame[c] = pd.to_numeric(frame[c], errors="coerce").astype("Int64")
    return frame


# ---------------------------------------------------------------------------------------------
# one row
# ---------------------------------------------------------------------------------------------

def _torch_dtype(name: str):
    import torch
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dt


def check_accuracy(forward: Callable, inputs: dict, pass_: str, n: int = CHECK_LEN) -> float:
    """Max ||err|| / ||ref|| over the output slice out[0, :n] and, unless pass_ == 'fwd', the
    gradients of that slice of every input, against moda_reference in float64.

    Exact for a prefix: causal attention of positions < n reads only keys < n and their own
    depth entries; backward uses do zeroed outside batch 0 / positions < n, so the prefix
    gradients of q, k, v, k_depth, v_depth equal the reference gradients of the sliced problem.
    Costs one extra forward (+ backward) of the provider. Leaves .grad cleared.
    """
    import torch
    from moda_bench.ops.moda import moda_reference
    from moda_bench.timing import grad_inputs, max_rel_err

    names = [k for k in ("q", "k", "v", "k_depth", "v_depth") if inputs.get(k) is not None]
    leaves = grad_inputs(inputs)
    for t in leaves:
        t.grad = None
    n = min(n, inputs["q"].shape[1])
    sl = {k: inputs[k][:1, :n].detach().double().requires_grad_(pass_ != "fwd") for k in names}
    with torch.enable_grad() if pass_ != "fwd" else torch.no_grad():
        out = forward()
        ref = moda_reference(*(sl.get(k) for k in ("q", "k", "v", "k_depth", "v_depth")),
                             out_dtype=torch.float64)
    errs = [max_rel_err(out[:1, :n].detach(), ref.detach())]
    if pass_ != "fwd":
        do = inputs["do"]
        do_slice = torch.zeros_like(do)
        do_slice[:1, :n] = do[:1, :n]
        out.backward(do_slice)
        ref.backward(do[:1, :n].double())
        for k in names:
            t = inputs[k]
            if t.requires_grad:
                errs.append(max_rel_err(t.grad[:1, :n], sl[k].grad))
        for t in leaves:
            t.grad = None
    del out, ref
    return max(errs) if not any(math.isnan(e) for e in errs) else math.nan


def _short(exc: BaseException, limit: int = 300) -> str:
    msg = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {msg[0] if msg else ''}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _release(device: str) -> None:
    gc.collect()
    if str(device).startswith("cuda"):
        import torch
        torch.cuda.empty_cache()


def _measure(provider, point: Point, pass_: str, row: dict, *, device: str, chunk: Optional[int],
             timer: Callable, warmup_ms: float, rep_ms: float, seed: int, check_len: int) -> None:
    """Inputs, prepare, accuracy check, timing: fills row in place (its locals die on return)."""
    import torch
    from moda_bench.timing import grad_inputs, make_inputs, make_pass_fn

    on_cuda = str(device).startswith("cuda")
    L_eff = point.L if provider.uses_depth else 0
    inputs = make_inputs(point.B, point.T, point.Hq, point.Hk, point.d, L_eff, dtype=_torch_dtype(point.dtype),
                         device=device, requires_grad=pass_ != "fwd", seed=seed)
    prepared = provider.prepare(inputs, point, chunk)
    row.update(impl_detail=prepared.impl_detail, depth_utilization=prepared.depth_utilization,
               config=json.dumps(prepared.config, sort_keys=True) if prepared.config else "")
    err = check_accuracy(prepared.forward, inputs, pass_, check_len)
    row["max_rel_err"] = err
    if on_cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    fn = make_pass_fn(prepared.forward, inputs, pass_)
    timing = timer(fn, grad_to_none=grad_inputs(inputs) or None, warmup_ms=warmup_ms, rep_ms=rep_ms)
    row.update({k: float(timing[k]) for k in ("median_ms", "p20_ms", "p80_ms")})
    if on_cuda:
        row["peak_mem_mb"] = torch.cuda.max_memory_allocated() / 2**20
    flops = schema.pass_flops(pass_, point.B, point.Hq, point.T, point.d, L_eff)
    row["tflops"] = flops / (row["median_ms"] * 1e9) if row["median_ms"] > 0 else math.nan
    tol = ACCURACY_TOL.get(point.dtype, 1e-3)
    if err <= tol:
        row["status"] = schema.OK
    else:
        row.update(status=schema.ERROR, reason=f"accuracy: max_rel_err={err:.3g} > {tol:g} vs moda_reference")


def run_one(provider, point: Point, pass_: str, *, sweep_name: str, device: str, chunk: Optional[int],
            timer: Callable, warmup_ms: float, rep_ms: float, seed: int, check_len: int = CHECK_LEN,
            unavailable_reason: Optional[str] = None, meta: Optional[dict] = None) -> dict:
    """Measure one provider on one point; always returns a schema row (status ok/skipped/oom/error).

    Only KeyboardInterrupt (and other BaseExceptions) escape; CUDA OOM -> 'oom', ProviderSkip ->
    'skipped', any other exception -> 'error' with its first line as the reason.
    """
    import torch
    from moda_bench.bench.providers import ProviderSkip

    row = base_row(point, provider.name, pass_, sweep_name)
    row.update(meta or {})
    if unavailable_reason:
        row.update(status=schema.SKIPPED, reason=unavailable_reason)
        return row
    try:
        _measure(provider, point, pass_, row, device=device, chunk=chunk, timer=timer, warmup_ms=warmup_ms,
                 rep_ms=rep_ms, seed=seed, check_len=check_len)
    except ProviderSkip as exc:
        row.update(status=schema.SKIPPED, reason=str(exc))
    except torch.cuda.OutOfMemoryError as exc:
        row.update(status=schema.OOM, reason=_short(exc))
    except Exception as exc:  # any failure of one provider must not stop the sweep
        row.update(status=schema.ERROR, reason=_short(exc))
    _release(device)
    return row


def fill_baseline(row: dict, fa2_ms: Optional[float]) -> None:
    """extra_time_pct = (ms - fa2) / fa2 * 100 and ratio_to_fa2 = ms / fa2 (NaN without fa2)."""
    ms = row.get("median_ms")
    if row.get("status") == schema.OK and fa2_ms and ms is not None and not math.isnan(ms):
        row["extra_time_pct"] = (ms - fa2_ms) / fa2_ms * 100.0
        row["ratio_to_fa2"] = ms / fa2_ms


# ---------------------------------------------------------------------------------------------
# the sweep
# ---------------------------------------------------------------------------------------------

class _TunedConfigs:
    """Context: `moda_bench.tuning.using(use_tuned)`, i.e. MoDA configs from the tuning cache
    ($MODA_BENCH_TUNING_CACHE or the platform default; heuristic defaults if not use_tuned or
    $MODA_BENCH_NO_TUNING=1), the previous config source restored on exit. Without triton (no
    kernel, no tuner) there is nothing to configure."""

    def __init__(self, use_tuned: bool):
        try:
            from moda_bench.tuning import using
        except ImportError:
            self.ctx = None
        else:
            self.ctx = using(use_tuned)

    def __enter__(self):
        if self.ctx is not None:
            self.ctx.__enter__()
        return self

    def __exit__(self, *exc):
        return self.ctx.__exit__(*exc) if self.ctx is not None else False


def run_sweep(points: list[Point], providers: list[str], pass_: str, csv_path: Path, *, sweep_name: str,
              use_tuned: bool = True, progress: bool = True, device_index: int | None = None,
              warmup_ms: float = WARMUP_MS, rep_ms: float = REP_MS, device: str | None = None,
              timer: Callable | None = None, pin_chunk: bool | None = None, check_len: int = CHECK_LEN,
              seed: int | None = None, console=None):
    """Run every provider on every point, appending rows to csv_path; returns a DataFrame.

    device: 'cuda' (default; cuda:device_index) or 'cpu' (tests). timer(fn, grad_to_none=,
    warmup_ms=, rep_ms=) -> dict(median_ms, p20_ms, p80_ms), default timing.measure.
    pin_chunk: pin MoDA's block_m to each point's C (None: pin when sweep_name == 'C' or the
    points differ in C). seed: base seed of the inputs (point i uses seed + i; None: random).
    """
    import pandas as pd
    from moda_bench.bench.providers import BASELINE, resolve_providers
    from moda_bench.timing import measure

    schema.check_pass(pass_)
    # baseline first (extra_time_pct needs it), the others in the given order
    provs = sorted(resolve_providers(providers), key=lambda p: p.name != BASELINE)
    points = list(points)
    timer = timer or measure
    if device is None:
        import torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and device_index is not None:
        import torch
        torch.cuda.set_device(device_index)
        device = f"cuda:{device_index}"
    if pin_chunk is None:
        pin_chunk = sweep_name == "C" or len({p.C for p in points}) > 1
    seed = random.randrange(2**30) if seed is None else seed
    csv_path = Path(csv_path)
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    unavailable = {p.name: p.unavailable(device) for p in provs}
    meta_index = device_index if str(device).startswith("cuda") else None

    rows = []
    bar = None
    if progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                       TimeElapsedColumn(), console=console, transient=False)
        task = bar.add_task(f"sweep {sweep_name}", total=len(points) * len(provs))
        bar.start()
    try:
        with _TunedConfigs(use_tuned):
            for i, point in enumerate(points):
                fa2_ms = None
                for prov in provs:
                    if bar is not None:
                        bar.update(task, description=f"sweep {sweep_name}: {prov.name} T={point.T} G={point.G} "
                                                     f"L={point.L} C={point.C}")
                    row = run_one(prov, point, pass_, sweep_name=sweep_name, device=device,
                                  chunk=point.C if pin_chunk else None, timer=timer, warmup_ms=warmup_ms,
                                  rep_ms=rep_ms, seed=seed + i, check_len=check_len,
                                  unavailable_reason=unavailable[prov.name],
                                  meta=schema.run_metadata(meta_index))
                    if prov.name == BASELINE and row["status"] == schema.OK:
                        fa2_ms = row["median_ms"]
                    fill_baseline(row, fa2_ms)
                    results.append_row(csv_path, row)
                    rows.append(row)
                    if bar is not None:
                        bar.advance(task)
    finally:
        if bar is not None:
            bar.stop()
    return pd.DataFrame(rows, columns=schema.COLUMNS)
