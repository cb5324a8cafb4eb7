"""Named sets of one-axis sweeps (`moda-bench sweep --preset NAME`).

Each sweep varies one axis of schema.AXES over its values (None = the paper's,
schema.AXIS_VALUES) around the base point (schema.BASE_POINT, with the command's overrides, then
the sweep's own `base` fields) and writes `sweep_<name>.csv` (name: the axis unless given).
A preset may name the pass it is meant for (`PRESET_PASS`), its default providers
(`PRESET_PROVIDERS`) and its default timers (`PRESET_TIMERS`).
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Optional

# the axes of the paper's efficiency table, in its order (the C axis is ours)
PAPER_AXES = ("T", "G", "L")


@dataclass(frozen=True)
class SweepSpec:
    """One sweep of a preset: the axis and its values (None: paper defaults), its name (None: the
    axis) and the base point fields it sets, as (field, value) pairs."""

    vary: str
    values: Optional[tuple[int, ...]] = None
    name: Optional[str] = None
    base: tuple = ()

    @property
    def label(self) -> str:
        return self.name or self.vary


# decode (issue 22): B x T at G=8, Hk=8, d=64, L=64, one new token; one B sweep per context length
DECODE_T = (2048, 8192, 32768, 131072)
# Depth-Attention (issue 23): the seed's two head configurations (both G=4), S sweeps per T
# the longest T first: the rows the target is about are measured before any time limit
DATTN_HEADS = {"3B": 8, "1.5B": 6}          # Hk; Hq = 4 * Hk
DATTN_T = (16384, 8192, 4096, 2048)


def _decode_sweeps() -> tuple[SweepSpec, ...]:
    return tuple(SweepSpec("B", None, f"decode-T{t}", (("T", t), ("Tq", 1), ("G", 8), ("Hk", 8), ("d", 64), ("L", 64)))
                 for t in DECODE_T)


def _dattn_sweeps() -> tuple[SweepSpec, ...]:
    return tuple(SweepSpec("S", None, f"dattn-{model}-T{t}", (("T", t), ("G", 4), ("Hk", hk), ("d", 64)))
                 for model, hk in DATTN_HEADS.items() for t in DATTN_T)


PRESETS: dict[str, tuple[SweepSpec, ...]] = {
    # the three sweeps of the paper's hardware-efficiency table (13 rows, spec section 4)
    "paper": tuple(SweepSpec(axis) for axis in PAPER_AXES),
    # a minute-scale GPU smoke test of the whole pipeline
    "smoke": (SweepSpec("T", (1024, 4096)),),
    "decode": _decode_sweeps(),
    "depth-attention": _dattn_sweeps(),
}
PRESET_PASS = {"decode": "decode"}
# the timers a preset's points are timed with unless --timer says otherwise: at T <= 4096 the eager
# timer measures host launch time (FA4's, the mix's), so Depth-Attention gets graph replays beside it
PRESET_TIMERS = {"depth-attention": ("graph", "eager")}
PRESET_PROVIDERS = {
    "decode": "moda,moda-nosplit,fa2,cudnn,fa4,flashinfer",
    "depth-attention": "dattn,dattn-torch,dattn-mix,fa4,fa2,moda,moda-fa4",
}


def preset_sweeps(name: str, only: Optional[str] = None) -> tuple[SweepSpec, ...]:
    """The sweeps of preset `name` (ValueError listing the known names otherwise); `only`: a
    comma-separated list of sweep names or shell patterns ('dattn-3B-*') selecting some of them,
    in the preset's order (ValueError naming a pattern that selects none, with the known names)."""
    try:
        specs = PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}") from None
    if only is None:
        return specs
    patterns = [p.strip() for p in only.split(",") if p.strip()]
    if not patterns:
        raise ValueError(f"no sweep names given to select from preset {name!r}")
    for pat in patterns:
        if not any(fnmatch.fnmatchcase(s.label, pat) for s in specs):
            raise ValueError(f"no sweep of preset {name!r} matches {pat!r}; its sweeps: "
                             f"{', '.join(s.label for s in specs)}")
    return tuple(s for s in specs if any(fnmatch.fnmatchcase(s.label, p) for p in patterns))
