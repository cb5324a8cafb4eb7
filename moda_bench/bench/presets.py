"""Named sets of one-axis sweeps (`moda-bench sweep --preset NAME`).

Each sweep varies one axis over its values (None = the paper defaults of runner.DEFAULT_VALUES)
around the base point (B=1, Hk=8, d=64, C=64, bf16; T=16384, G=8, L=64 where not varied).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class SweepSpec:
    """One sweep of a preset: the axis and its values (None: paper defaults)."""

    vary: str
    values: Optional[tuple[int, ...]] = None


PRESETS: dict[str, tuple[SweepSpec, ...]] = {
    # the three sweeps of the paper's hardware-efficiency table (13 rows, spec section 4)
    "paper": (SweepSpec("T"), SweepSpec("G"), SweepSpec("L")),
    # a minute-scale GPU smoke test of the whole pipeline
    "smoke": (SweepSpec("T", (1024, 4096)),),
}


def preset_sweeps(name: str) -> tuple[SweepSpec, ...]:
    """The sweeps of preset `name` (ValueError listing the known names otherwise)."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}") from None
