"""Each command's options as one object, built by the command line and handed down: `RunSpec`
(a sweep's run, carried to the runner, the `--gpus` pool's workers as JSON and the torchrun
ranks), `TuneSpec` (`moda-bench tune`, run by `bench.tune.run_tuning`) and `GateSpec`
(`moda-bench gate`: the comparison's policy for `reports.gate` and the measurements of `--run`
for `bench.gate`). Each checks its own values where it is made (`SpecError` names the option).

What a run measures (providers, pass, the timers to time each point with), how it times
(`point.TimingOptions`), which MoDA configs it uses (tuned or heuristic), the GPU verdict its
rows carry, the two ceilings its rows' floors are computed with (`floor.Rates`, from the
run's health canary) and the CPUs its timing processes are pinned to (`--pin-cpu`, `host`).
Points (what is measured where) are not part of it: they come from the sweep plan.
"""
from __future__ import annotations

import dataclasses
import enum
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from moda_bench import schema
from moda_bench.bench.point import TimingOptions
from moda_bench.floor import Rates

# the timers a pass is timed with unless the command names them: decode is where serving engines
# capture CUDA graphs, so graph replays come first and eager (host launches included) beside them
DEFAULT_TIMERS = {schema.DECODE_PASS: ("graph", "eager")}


class SpecError(ValueError):
    """An option value a spec refuses; `option` names the option ('--kernels'), or is ''."""

    def __init__(self, message: str, option: str = ""):
        super().__init__(message)
        self.option = option


@dataclass(frozen=True)
class RunSpec:
    """providers: names, in the order given (the runner puts the baseline first).
    pass_: one of schema.PASSES. timing: how a point is timed; timers: the timers each point is
    timed with, one set of rows per timer (empty: DEFAULT_TIMERS of the pass, else timing.timer).
    use_tuned: MoDA configs from the tuning cache and shipped files (else heuristic).
    health: the run's GPU verdict, written into every row. rates: the floor's ceilings.
    pin_cpu: CPU ids (`host.parse_pin_cpu`; empty: not pinned); timing process i (GPU worker
    index, torchrun local rank, 0 alone) pins itself to pin_cpu[i % len]."""

    providers: tuple = ()
    pass_: str = "fwdbwd"
    timing: TimingOptions = field(default_factory=TimingOptions)
    timers: tuple = ()
    use_tuned: bool = True
    health: str = ""
    rates: Rates = field(default_factory=Rates)
    pin_cpu: tuple = ()

    def __post_init__(self):
        object.__setattr__(self, "providers", tuple(dict.fromkeys(self.providers)))
        object.__setattr__(self, "timers", tuple(self.timers))
        object.__setattr__(self, "pin_cpu", tuple(int(c) for c in self.pin_cpu))
        schema.check_pass(self.pass_)

    def timer_list(self) -> tuple:
        """The timers each point is timed with, in order."""
        if self.timers:
            return self.timers
        return DEFAULT_TIMERS.get(self.pass_, (self.timing.timer,))

    def replace(self, **kw) -> "RunSpec":
        return dataclasses.replace(self, **kw)

    def to_dict(self) -> dict:
        return {"providers": list(self.providers), "pass": self.pass_, "timing": dataclasses.asdict(self.timing),
                "timers": list(self.timer_list()), "use_tuned": self.use_tuned, "health": self.health,
                "rates": self.rates.as_dict(), "pin_cpu": list(self.pin_cpu)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> "RunSpec":
        return cls(providers=tuple(d.get("providers", ())), pass_=d.get("pass", "fwdbwd"),
                   timing=TimingOptions(**d.get("timing", {})), timers=tuple(d.get("timers", ())),
                   use_tuned=bool(d.get("use_tuned", True)), health=d.get("health", ""),
                   rates=Rates(**d.get("rates", {})), pin_cpu=tuple(d.get("pin_cpu", ())))

    @classmethod
    def from_json(cls, text: str) -> "RunSpec":
        return cls.from_dict(json.loads(text))


def parse_timers(text: Optional[str], pass_: str, allowed: Sequence[str]) -> tuple:
    """'graph,eager' -> ('graph', 'eager'); None -> () (the pass's default). ValueError naming the
    option for an unknown or repeated timer."""
    if text is None:
        return ()
    names = [t.strip() for t in str(text).split(",") if t.strip()]
    bad = [t for t in names if t not in allowed]
    if not names or bad:
        raise ValueError(f"timer must be one or more of {', '.join(allowed)} (comma-separated), got {text!r}")
    if len(set(names)) != len(names):
        raise ValueError(f"timer repeats a name: {text!r}")
    return tuple(names)


def rates_from_verdicts(verdicts: Sequence, gpu_name: Optional[str] = None) -> Rates:
    """The floor's ceilings: the first start canary that measured both numbers, else the
    approximate KNOWN_GPUS entry of the GPU (source 'table: ...'), else unknown."""
    for v in verdicts:
        if getattr(v, "matmul_tflops", None) and getattr(v, "copy_gbps", None):
            return Rates(float(v.matmul_tflops), float(v.copy_gbps), "canary")
    from moda_bench.health import known_reference
    ref = known_reference(gpu_name) if gpu_name else None
    if ref:
        return Rates(float(ref["matmul_tflops"]), float(ref["copy_gbps"]), f"table: {ref['label']}")
    return Rates()


# ----------------------------------------------------------------------------- tune
TUNE_AXES = ("T", "G", "L")
TUNE_DTYPES = ("bfloat16", "float16", "float32")
# tune's presets: (axis, values) sweeps; values None = the paper's (schema.AXIS_VALUES)
TUNE_PRESETS = {
    "paper": (("T", None), ("G", None), ("L", None)),  # the three sweeps of the paper's efficiency table
    "full": (("T", (1024, 2048, 4096, 8192, 16384, 32768, 65536)), ("G", None), ("L", None)),
}
TUNE_SHAPE_FIELDS = ("T", "G", "L", "B", "Hk", "d")
DEFAULT_TUNE_KERNELS = ("fwd_depth", "bwd_depth", "fwd", "bwd_q", "bwd_kv")


@dataclass(frozen=True)
class TuneSpec:
    """One `moda-bench tune` run. shape: the base point's fields given on the command line, as
    (field, value) pairs of TUNE_SHAPE_FIELDS (the rest: schema.BASE_POINT); what to tune: that
    point alone, a `vary` sweep over `values` (None: the paper's) or a `preset` of TUNE_PRESETS.
    op: the operator (kernels.moda.config.OPS); kernels: its field groups, in tuning order, as
    requested (None: the operator's default); after checking, `kernels` holds the groups tuned and
    `dropped` those that do not apply to the operator (moda-fa4 tunes its depth launches only).
    budget: most candidates per group and shape; min_gain: the margin the winner must clear;
    warmup_ms / rep_ms / seed: the candidates' timing; cache: the tuning cache file (None: the
    default); out: the CSV summary (None: none); force: retune cached shapes; device: CUDA index;
    resume: keep the shapes of an interrupted run whose summary is `out` (same GPU; another commit
    only with allow_commit_change)."""

    shape: tuple = ()
    dtype: str = "bfloat16"
    vary: Optional[str] = None
    values: Optional[tuple] = None
    preset: Optional[str] = None
    op: str = "moda"
    kernels: Optional[tuple] = None
    budget: int = 40
    min_gain: float = 0.02
    warmup_ms: float = 10.0
    rep_ms: float = 50.0
    seed: int = 0
    cache: Optional[Path] = None
    out: Optional[Path] = None
    force: bool = False
    device: Optional[int] = None
    resume: bool = False
    allow_commit_change: bool = False
    dropped: tuple = field(default=(), init=False)

    def __post_init__(self):
        from moda_bench import tuning
        from moda_bench.kernels.moda.config import OPS
        from moda_bench.kernels.moda.validate import SUPPORTED_HEAD_DIMS

        shape = dict(self.shape)
        if bad := [k for k in shape if k not in TUNE_SHAPE_FIELDS]:
            raise SpecError(f"unknown shape field(s) {', '.join(bad)}; tune takes {', '.join(TUNE_SHAPE_FIELDS)}")
        object.__setattr__(self, "shape", tuple(shape.items()))
        requested = None if self.kernels is None else tuple(self.kernels)
        groups = tuning.KERNELS + tuning.OVERLAP_GROUPS
        bad = [k for k in requested or () if k not in groups]
        if bad or requested == ():
            raise SpecError(f"unknown kernel(s) {bad or requested!r}; choose from {', '.join(groups)}", "--kernels")
        if self.op not in OPS:
            raise SpecError(f"unknown operator {self.op!r}; choose from {', '.join(OPS)}", "--op")
        kernels, dropped = requested or DEFAULT_TUNE_KERNELS, ()
        if self.op == "moda-overlap":  # its knobs are the depth launches' items and program counts
            if requested is None:
                kernels = tuple(tuning.OVERLAP_DEFAULT)
            elif any(k not in tuning.OVERLAP_GROUPS for k in kernels):
                raise SpecError(f"moda-overlap tunes only {', '.join(tuning.OVERLAP_GROUPS)} (its depth kernels' "
                                "items and programs; its sequence part is FA4)", "--kernels")
        elif any(k in tuning.OVERLAP_GROUPS for k in kernels):
            raise SpecError(f"{', '.join(tuning.OVERLAP_GROUPS)} are moda-overlap's groups (--op moda-overlap)",
                            "--kernels")
        elif self.op != "moda":  # its sequence part is FA4: only the depth launches read the config
            dropped = tuple(k for k in kernels if k not in tuning.DEPTH_GROUPS)
            kernels = tuple(k for k in kernels if k in tuning.DEPTH_GROUPS)
            if not kernels:
                raise SpecError(f"{self.op} tunes only {', '.join(tuning.DEPTH_GROUPS)} (its sequence part is FA4)",
                                "--kernels")
        if self.op != "moda" and shape.get("L") == 0:
            raise SpecError(f"{self.op} has no depth launches at L=0: nothing to tune", "--L")
        object.__setattr__(self, "kernels", tuple(kernels))
        object.__setattr__(self, "dropped", dropped)
        if self.resume and self.out is None:
            raise SpecError("--resume continues the summary given by --out", "--resume")
        if self.dtype not in TUNE_DTYPES:
            raise SpecError(f"{self.dtype!r} is not one of {', '.join(TUNE_DTYPES)}", "--dtype")
        if self.vary and self.preset:
            raise SpecError("give either --vary or --preset, not both", "--preset")
        if self.preset and self.preset not in TUNE_PRESETS:
            raise SpecError(f"unknown preset {self.preset!r}; choose from {', '.join(TUNE_PRESETS)}", "--preset")
        if self.vary and self.vary not in TUNE_AXES:
            hint = " (C is the chunk the tuner chooses)" if self.vary == "C" else ""
            raise SpecError(f"--vary must be T, G or L{hint}, got {self.vary!r}", "--vary")
        if self.values is not None:
            if not self.vary:
                raise SpecError("--values needs --vary", "--values")
            object.__setattr__(self, "values", tuple(self.values))
        if shape.get("d") is not None and shape["d"] not in SUPPORTED_HEAD_DIMS:
            raise SpecError(f"head dim {shape['d']} is not supported; use one of {SUPPORTED_HEAD_DIMS}", "--d")
        if not 0 <= self.min_gain < 1:
            raise SpecError(f"the margin must be in [0, 100%), got {self.min_gain!r}", "--min-gain")
        if self.budget < 1:
            raise SpecError(f"--budget must be >= 1, got {self.budget}", "--budget")

    def base_point(self):
        """The base runner.Point: the given shape fields at this dtype."""
        from moda_bench.bench.runner import Point
        return Point(**dict(self.shape), dtype=self.dtype)


# ----------------------------------------------------------------------------- gate
class Metric(str, enum.Enum):
    """What `moda-bench gate` compares per row (reports.gate.METRIC_COLUMNS)."""

    ratio = "ratio"
    ratio_best = "ratio-best"
    time = "time"


GATE_CURRENT = Path("gate-current.csv")   # where gate --run writes without --current


@dataclass(frozen=True)
class GateSpec:
    """One `moda-bench gate`. baseline / current: the results CSVs (with `run`, current is where
    the new run is written, default GATE_CURRENT). The comparison (`policy`, reports.gate.compare):
    threshold (a fraction), metric, allow_gpu_change, allow_missing, fail_ambiguous. The exit:
    warn_only. The outputs: summary (Markdown file; None: $GITHUB_STEP_SUMMARY if set), all_rows,
    update_baseline. `run` (bench.gate.measure): use_tuned, timing (point.TimingOptions; each row
    group keeps the baseline's timer), strict (stop before measuring on an unhealthy GPU),
    health_check, recheck_rounds (how often the rows the comparison cannot decide are measured
    again) and recheck_time (each such round's sampling time over the one before: its max_time_s
    and min_time_ms multiplied by it, so the intervals narrow)."""

    baseline: Path
    current: Optional[Path] = None
    threshold: float = 0.05
    metric: str = "ratio"
    run: bool = False
    update_baseline: bool = False
    allow_gpu_change: bool = False
    allow_missing: bool = False
    fail_ambiguous: bool = False
    warn_only: bool = False
    summary: Optional[Path] = None
    all_rows: bool = False
    use_tuned: bool = True
    timing: TimingOptions = field(default_factory=TimingOptions)
    strict: bool = False
    health_check: bool = True
    recheck_rounds: int = 2
    recheck_time: float = 3.0

    def __post_init__(self):
        object.__setattr__(self, "metric", Metric(self.metric).value)
        if not isinstance(self.recheck_rounds, int) or self.recheck_rounds < 0:
            raise SpecError(f"recheck rounds must be a whole number >= 0, got {self.recheck_rounds!r}",
                            "--recheck-rounds")
        if not isinstance(self.recheck_time, (int, float)) or not self.recheck_time >= 1:
            raise SpecError(f"recheck time must be a factor >= 1, got {self.recheck_time!r}", "--recheck-time")
        if not isinstance(self.threshold, (int, float)) or not math.isfinite(self.threshold) or self.threshold < 0:
            raise SpecError(f"threshold must be a non-negative fraction, got {self.threshold!r}", "--threshold")
        if self.current is None and not self.run:
            raise SpecError("give --current NEW.csv, or --run to measure it now", "--current")

    @property
    def current_csv(self) -> Path:
        """The current CSV: --current, else (with --run) GATE_CURRENT."""
        return Path(self.current) if self.current is not None else GATE_CURRENT

    def policy(self) -> dict:
        """The keywords of reports.gate.compare."""
        return dict(threshold=self.threshold, metric=self.metric, allow_gpu_change=self.allow_gpu_change,
                    allow_missing=self.allow_missing, fail_ambiguous=self.fail_ambiguous)
