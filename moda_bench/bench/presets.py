"""Named sets of one-axis sweeps (`moda-bench sweep --preset NAME`).

Each sweep varies one axis of schema.AXES over its values (None = the paper's,
schema.AXIS_VALUES) around the base point (schema.BASE_POINT, with the command's overrides).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

# the axes of the paper's efficiency table, in its order (the C axis is ours)
PAPER_AXES = ("T", "G", "L")


@dataclass(frozen=True)
class SweepSpec:
    """One sweep of a preset: the axis and its values (None: paper defaults)."""

    vary: str
    values: Optional[tuple[int, ...]] = None


PRESETS: dict[str, tuple[SweepSpec, ...]] = {
    # the three sweeps of the paper's hardware-efficiency table (13 rows, spec section 4)
    "paper": tuple(SweepSpec(axis) for axis in PAPER_AXES),
    # a minute-scale GPU smoke test of the whole pipeline
    "smoke": (SweepSpec("T", (1024, 4096)),),
}


def preset_sweeps(name: str) -> tuple[SweepSpec, ...]:
    """The sweeps of preset `name` (ValueError listing the known names otherwise)."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}") from None
