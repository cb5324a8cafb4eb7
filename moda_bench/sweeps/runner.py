"""Sweep planning and execution (CONTRACT STUB: signatures fixed, bodies being written).

A sweep is a list of `Point`s; each point is run for every requested provider; one CSV row
(schema: moda_bench.sweeps.schema.COLUMNS) is appended per (provider, point) as it finishes.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path


@dataclass(frozen=True)
class Point:
    """One configuration. Hq = G * Hk. C is the query chunk in rows (MoDA block_m)."""

    T: int = 16384
    G: int = 8
    Hk: int = 8
    L: int = 64
    B: int = 1
    d: int = 64
    C: int = 64
    dtype: str = "bfloat16"

    @property
    def Hq(self) -> int:
        return self.G * self.Hk

    def to_dict(self) -> dict:
        d = asdict(self)
        d["Hq"] = self.Hq
        return d

    def replace(self, **kw) -> "Point":
        return replace(self, **kw)


def plan_points(vary: str, values: list[int] | None, base: Point) -> list[Point]:
    """Points of a one-axis sweep over `vary` in {T, G, L, C} (values None = paper defaults)."""
    raise NotImplementedError


def run_sweep(points: list[Point], providers: list[str], pass_: str, csv_path: Path, *, sweep_name: str,
              use_tuned: bool = True, progress: bool = True, device_index: int | None = None,
              warmup_ms: float = 25, rep_ms: float = 100):
    """Run every provider on every point, appending rows to csv_path; returns a DataFrame."""
    raise NotImplementedError
