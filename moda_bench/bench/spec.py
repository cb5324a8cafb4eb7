"""One run's options as one object: `RunSpec`, carried from the command line to the runner, the
`--gpus` pool's workers (as JSON) and the torchrun ranks.

What a run measures (providers, pass, the timers to time each point with), how it times
(`point.TimingOptions`), which MoDA configs it uses (tuned or heuristic), the GPU verdict its
rows carry, the two ceilings its rows' floors are computed with (`floor.Rates`, from the
run's health canary) and the CPUs its timing processes are pinned to (`--pin-cpu`, `host`).
Points (what is measured where) are not part of it: they come from the sweep plan.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Optional, Sequence

from moda_bench import schema
from moda_bench.bench.point import TimingOptions
from moda_bench.floor import Rates

# the timers a pass is timed with unless the command names them: decode is where serving engines
# capture CUDA graphs, so graph replays come first and eager (host launches included) beside them
DEFAULT_TIMERS = {schema.DECODE_PASS: ("graph", "eager")}


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
