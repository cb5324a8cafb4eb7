"""The work of `moda-bench tune` (the command is `moda_bench.cli.tune`): which shapes to tune,
one tuning per cache key, the device run of `moda_bench.tuning.tune_shape` for a shape, and
the rows of the CSV summary.

Shapes that share a cache key (same GPU, triton, dtype, d, G, L and power-of-two bucket of T)
are tuned once, at the largest T of the group. torch/triton are imported inside functions.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Optional

from moda_bench.schema import CONFIG_COLUMNS, META_COLUMNS

TUNE_COLUMNS = CONFIG_COLUMNS + ["default_ms", "tuned_ms", "ratio", "speedup", "wall_s", "status", "reason",
                                 "config", "cache_key"] + META_COLUMNS
PRESETS = {"paper": ("T", "G", "L")}  # the three sweeps of the paper's efficiency table
DTYPES = ("bfloat16", "float16", "float32")


def plan_tuning_points(base, vary: Optional[str], values: Optional[list[int]], preset: Optional[str]) -> list:
    """Points to tune: the preset's sweeps, one `--vary` sweep, or just `base` (runner.Point)."""
    from moda_bench.bench.runner import plan_points
    if preset:
        points = [p for axis in PRESETS[preset] for p in plan_points(axis, None, base)]
    elif vary:
        points = plan_points(vary, values, base)
    else:
        points = [base]
    return list(dict.fromkeys(points))


def group_by_key(points: list, key_fn) -> dict:
    """{cache key: point with the largest T among the points sharing it} (first-seen order)."""
    groups: dict = {}
    for p in points:
        k = key_fn(p)
        if k not in groups or p.T > groups[k].T:
            groups[k] = p
    return groups


def point_shape(p):
    """MoDAShape of a runner.Point."""
    from moda_bench.ops.moda import MoDAShape
    return MoDAShape(B=p.B, T=p.T, Hq=p.Hq, Hk=p.Hk, d=p.d, L=p.L)


def config_changes(cfg, default) -> str:
    """'field=value ...' for the fields where cfg differs from default ('default' if none)."""
    a, b = cfg.to_dict(), default.to_dict()
    diff = [f"{k}={v}" for k, v in a.items() if b.get(k) != v]
    return " ".join(diff) if diff else "default"


def tune_row(p, dtype, *, default_ms=float("nan"), tuned_ms=float("nan"), wall_s=float("nan"), status="ok",
             reason="", config=None, key="", meta=None) -> dict:
    """One row of the CSV summary (TUNE_COLUMNS) for point p."""
    row = {c: getattr(p, c, None) for c in CONFIG_COLUMNS}
    row.update(Hq=p.Hq, dtype=dtype, C=(config or {}).get("block_m", p.C))
    ratio = tuned_ms / default_ms if default_ms == default_ms and default_ms > 0 else float("nan")
    row.update(default_ms=default_ms, tuned_ms=tuned_ms, ratio=ratio,
               speedup=(1 / ratio if ratio and ratio == ratio else float("nan")), wall_s=wall_s, status=status,
               reason=reason, config=json.dumps(config, sort_keys=True) if config else "", cache_key=key)
    row.update(meta or {})
    return row


def tune_point(shape, dtype: str, kernels: list[str], *, budget: int, warmup_ms: float, rep_ms: float, seed: int,
               attention: Callable, on_plan=None, on_done=None):
    """Tune `shape` on the current CUDA device (moda_bench.tuning.tune_shape with the device
    timer); on_plan / on_done report progress. Returns the TuneResult."""
    import torch

    from moda_bench import tuning
    timer = tuning.CudaTimer(shape, dtype, device=f"cuda:{torch.cuda.current_device()}", warmup_ms=warmup_ms,
                             rep_ms=rep_ms, seed=seed, attention=attention)
    return tuning.tune_shape(shape, dtype, timer, kernels=kernels, budget=budget, seed=seed, on_plan=on_plan,
                             on_done=on_done)


def write_summary(rows: list[dict], out: Path) -> None:
    """The CSV summary (TUNE_COLUMNS), a row per tuned, cached or failed shape."""
    import pandas as pd
    out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows, columns=TUNE_COLUMNS).to_csv(out, index=False)
