"""The work of `moda-bench tune` (the command is `moda_bench.cli.tune`): which shapes to tune,
one tuning per cache key, the device run of `moda_bench.tuning.tune_shape` for a shape, and
the rows of the CSV summary.

Shapes that share a cache key (same GPU, triton, dtype, d, G, L and power-of-two bucket of T)
are tuned once, at the largest T of the group; the entry then serves that bucket only.
Presets: 'paper' = the paper's T (4096..65536), G and L sweeps; 'full' = the same with the T
sweep from 1024 (the ablation shape and the fused/split default boundary at 2048 included).

CSV columns beyond the point: default_ms (built-in default config), candidate_ms (the search's
winner), tuned_ms (the config stored: candidate_ms if decision is 'tuned', else default_ms),
ratio / ratio_lo / ratio_hi (candidate / default, geometric mean of interleaved rounds and its
95% interval), min_gain, decision ('tuned' | 'default'), speedup = default_ms / tuned_ms.
torch/triton are imported inside functions.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Optional

from moda_bench.schema import CONFIG_COLUMNS, TUNE_COLUMNS
# (axis, values) sweeps; values None = the paper's (schema.AXIS_VALUES)
PRESETS = {
    "paper": (("T", None), ("G", None), ("L", None)),  # the three sweeps of the paper's efficiency table
    "full": (("T", (1024, 2048, 4096, 8192, 16384, 32768, 65536)), ("G", None), ("L", None)),
}
DTYPES = ("bfloat16", "float16", "float32")


def plan_tuning_points(base, vary: Optional[str], values: Optional[list[int]], preset: Optional[str]) -> list:
    """Points to tune: the preset's sweeps, one `--vary` sweep, or just `base` (runner.Point)."""
    from moda_bench.bench.runner import plan_points
    if preset:
        points = [p for axis, vals in PRESETS[preset]
                  for p in plan_points(axis, list(vals) if vals is not None else None, base)]
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
    from moda_bench.kernels.moda import MoDAShape
    return MoDAShape(B=p.B, T=p.T, Hq=p.Hq, Hk=p.Hk, d=p.d, L=p.L)


def config_changes(cfg, default) -> str:
    """'field=value ...' for the fields where cfg differs from default ('default' if none)."""
    a, b = cfg.to_dict(), default.to_dict()
    diff = [f"{k}={v}" for k, v in a.items() if b.get(k) != v]
    return " ".join(diff) if diff else "default"


def _num(x) -> float:
    return float("nan") if x is None else float(x)


def tune_row(p, dtype, *, default_ms=float("nan"), tuned_ms=float("nan"), wall_s=float("nan"), status="ok",
             reason="", config=None, key="", meta=None, candidate_ms=float("nan"), ratio=float("nan"),
             ratio_lo=float("nan"), ratio_hi=float("nan"), min_gain=float("nan"), decision="",
             tuned_fields="") -> dict:
    """One row of the CSV summary (TUNE_COLUMNS) for point p."""
    row = {c: getattr(p, c, None) for c in CONFIG_COLUMNS}
    row.update(Hq=p.Hq, dtype=dtype, C=(config or {}).get("block_m", p.C))
    default_ms, tuned_ms = _num(default_ms), _num(tuned_ms)
    speedup = default_ms / tuned_ms if tuned_ms == tuned_ms and tuned_ms > 0 else float("nan")
    row.update(default_ms=default_ms, candidate_ms=_num(candidate_ms), tuned_ms=tuned_ms, ratio=_num(ratio),
               ratio_lo=_num(ratio_lo), ratio_hi=_num(ratio_hi), min_gain=_num(min_gain), decision=decision,
               speedup=speedup, wall_s=wall_s, status=status, reason=reason,
               config=json.dumps(config, sort_keys=True) if config else "", cache_key=key, tuned_fields=tuned_fields)
    row.update(meta or {})
    return row


def result_row(p, dtype, result, *, key="", meta=None, reason="", tuned_fields="") -> dict:
    """The CSV row of a freshly tuned point (a tuning.TuneResult); tuned_fields: `config_changes`
    of the stored config against the shape's default."""
    return tune_row(p, dtype, default_ms=result.default_ms, tuned_ms=result.tuned_ms, wall_s=result.wall_s,
                    config=result.config.to_dict(), key=key, meta=meta, reason=reason,
                    candidate_ms=result.candidate_ms, ratio=result.ratio, ratio_lo=result.ratio_lo,
                    ratio_hi=result.ratio_hi, min_gain=result.min_gain, decision=result.decision,
                    tuned_fields=tuned_fields)


def entry_row(p, dtype, entry: dict, *, key="", meta=None, tuned_fields="") -> dict:
    """The CSV row of a point skipped because the cache has an entry for it (status 'cached';
    entries from before the decision was recorded have an empty decision)."""
    return tune_row(p, dtype, default_ms=entry.get("default_ms"), tuned_ms=entry.get("tuned_ms"),
                    wall_s=entry.get("tuning_wall_s", 0.0), status="cached", config=entry["config"], key=key,
                    meta=meta, candidate_ms=entry.get("candidate_ms"), ratio=entry.get("ratio"),
                    ratio_lo=entry.get("ratio_lo"), ratio_hi=entry.get("ratio_hi"), min_gain=entry.get("min_gain"),
                    decision=entry.get("decision") or "", tuned_fields=tuned_fields)


def tune_point(shape, dtype: str, kernels: list[str], *, budget: int, warmup_ms: float, rep_ms: float, seed: int,
               attention: Callable, min_gain: Optional[float] = None, on_plan=None, on_done=None,
               op: str = "moda", default=None):
    """Tune `shape` on the current CUDA device (moda_bench.tuning.tune_shape with the device
    timer running `attention`, the operator `op`, starting from and compared against `default`,
    the heuristic default config unless given); on_plan / on_done report progress. Returns the
    TuneResult."""
    import torch

    from moda_bench import tuning
    timer = tuning.CudaTimer(shape, dtype, device=f"cuda:{torch.cuda.current_device()}", warmup_ms=warmup_ms,
                             rep_ms=rep_ms, seed=seed, attention=attention)
    return tuning.tune_shape(shape, dtype, timer, kernels=kernels, budget=budget, seed=seed, on_plan=on_plan,
                             on_done=on_done, min_gain=tuning.DEFAULT_MIN_GAIN if min_gain is None else min_gain,
                             op=op, default=default)


def write_summary(rows: list[dict], out: Path) -> None:
    """The CSV summary (TUNE_COLUMNS), a row per tuned, cached or failed shape; written through a
    temporary file and a rename (a killed run leaves the previous summary, never half of one)."""
    import os
    import tempfile

    import pandas as pd
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=out.name + ".", suffix=".tmp", dir=out.parent)
    try:
        with os.fdopen(fd, "w", newline="") as f:
            pd.DataFrame(rows, columns=TUNE_COLUMNS).to_csv(f, index=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class Summary:
    """The summary of one `tune` run, rewritten as each shape finishes (`add`), so a killed run
    keeps every finished shape's row. `resume`: the rows of an earlier run into the same file
    (`previous(key)`, kept in order when re-added) for the same GPU; another commit is refused
    unless `allow_commit_change` (ValueError, one line). `on_signals` makes SIGINT/SIGTERM write
    the rows so far, print the resume command and exit 130/143."""

    def __init__(self, out: Optional[Path], *, resume: bool = False, gpu: str = "", commit: str = "",
                 allow_commit_change: bool = False):
        self.out, self.rows, self.before = (Path(out) if out else None), [], {}
        if resume and self.out is not None and self.out.exists():
            from moda_bench.results import read_tuning
            old = read_tuning([self.out], warn=lambda text: None)
            for r in old.drop(columns="_file").to_dict("records"):
                if str(r.get("status")) == "error":
                    continue   # a failed shape is tuned again
                if gpu and str(r.get("gpu")) not in ("", "nan", gpu):
                    raise ValueError(f"{self.out}: its rows were tuned on {r['gpu']}, this run is on {gpu}; "
                                     "resume on that GPU or choose another --out")
                if commit and not allow_commit_change and str(r.get("git_commit")) not in ("", "nan", commit):
                    raise ValueError(f"{self.out}: its rows were tuned at commit {r['git_commit']}, this checkout "
                                     f"is {commit}; add --allow-commit-change to resume anyway")
                for c in ("T", "G", "Hq", "Hk", "L", "B", "d", "C", "depth_grad", "Tq", "S"):
                    if isinstance(r.get(c), float) and r[c] == r[c]:
                        r[c] = int(r[c])   # as the tuner wrote them: T=4096, not 4096.0
                self.before[r["cache_key"]] = r

    def previous(self, key: str) -> Optional[dict]:
        return self.before.get(key)

    def add(self, row: dict) -> None:
        self.rows.append(row)
        if self.out is not None:
            write_summary(self.rows, self.out)

    def on_signals(self, say: Callable[[str], None], command: str) -> None:
        import signal
        import sys

        def stop(signum, frame):
            if self.out is not None:
                write_summary(self.rows, self.out)
            say(f"interrupted ({signal.Signals(signum).name}): {len(self.rows)} shape(s) kept"
                + (f" in {self.out}" if self.out else "") + f"; resume with: {command}")
            sys.exit(128 + signum)

        self._old = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}

    def restore_signals(self) -> None:
        """The handlers from before `on_signals` (the run's shapes are done)."""
        import signal
        for sig, handler in getattr(self, "_old", {}).items():
            signal.signal(sig, handler)
        self._old = {}
