"""The sweep presets: TOML data files (`sweeps/*.toml` at the top of the repository, shipped in
the wheel as `moda_bench/sweeps/`), read and validated here.

`moda-bench sweep --preset NAME` reads the shipped `NAME.toml`; `--preset path/to/file.toml`
reads a user's own file in the same format (sweeps/README.md). A preset is a list of one-axis
sweeps: each varies one axis of schema.AXES over its values (absent = the paper's,
schema.AXIS_VALUES) around the base point (schema.BASE_POINT, with the command's overrides, then
the sweep's own `base` fields) and writes `sweep_<name>.csv` (name: the axis unless given). A
preset may name the pass it is meant for, its default providers and its default timers.

Every mistake in a file (TOML syntax, an unknown key, a bad axis or value) is one `PresetError`
line naming the file and the key.
"""
from __future__ import annotations

import fnmatch
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from moda_bench import schema
from moda_bench.timing import TIMERS

# the point fields a sweep's `base` table may set (integers)
BASE_FIELDS = tuple(k for k, v in schema.BASE_POINT.items() if isinstance(v, int) and k != "depth_grad")
PRESET_KEYS = ("description", "pass", "providers", "timers", "sweep")
SWEEP_KEYS = ("vary", "values", "name", "base")
LEGACY_TIMERS = ("do_bench",)   # runner.LEGACY_TIMER: the pre-interval method, still accepted


class PresetError(ValueError):
    """A preset that cannot be found or read: one line naming the file and the key."""


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


@dataclass(frozen=True)
class Preset:
    """A preset file, read: its name (the file's stem), path, one-line description, sweeps (in
    the file's order), and the pass, providers (comma-separated, as --providers takes them) and
    timers a run of it uses unless the command says otherwise (None / empty: the command's
    defaults)."""

    name: str
    path: Path
    description: str
    sweeps: tuple[SweepSpec, ...]
    pass_: Optional[str] = None
    providers: Optional[str] = None
    timers: tuple[str, ...] = ()

    def select(self, only: Optional[str] = None) -> tuple[SweepSpec, ...]:
        """The sweeps named by `only` (comma-separated names or shell patterns such as
        'dattn-3B-*'), in the preset's order; all of them when None. ValueError for a pattern
        that selects none (with the known names) or an empty list."""
        if only is None:
            return self.sweeps
        patterns = [p.strip() for p in only.split(",") if p.strip()]
        if not patterns:
            raise ValueError(f"no sweep names given to select from preset {self.name!r}")
        for pat in patterns:
            if not any(fnmatch.fnmatchcase(s.label, pat) for s in self.sweeps):
                raise ValueError(f"no sweep of preset {self.name!r} matches {pat!r}; its sweeps: "
                                 f"{', '.join(s.label for s in self.sweeps)}")
        return tuple(s for s in self.sweeps if any(fnmatch.fnmatchcase(s.label, p) for p in patterns))


def sweeps_dir() -> Path:
    """The directory of the shipped presets: `moda_bench/sweeps` in an installed wheel, else the
    repository's top-level `sweeps/` (a source checkout or an editable install)."""
    package = Path(__file__).resolve().parents[1]
    installed = package / "sweeps"
    return installed if installed.is_dir() else package.parent / "sweeps"


def shipped_presets() -> dict[str, Path]:
    """{name: file} of the shipped presets, sorted by name."""
    return {p.stem: p for p in sorted(sweeps_dir().glob("*.toml"))}


def load_preset(name_or_path: str | Path) -> Preset:
    """The preset `name_or_path`: a shipped preset's name, or the path of a .toml file.
    PresetError for an unknown name (listing the known ones), a missing file or a bad file."""
    text = str(name_or_path)
    if text.endswith(".toml") or "/" in text or "\\" in text:
        path = Path(text)
        if not path.is_file():
            raise PresetError(f"{path}: no such preset file")
        return read_preset(path)
    shipped = shipped_presets()
    if text not in shipped:
        raise PresetError(f"unknown preset {text!r}; known: {', '.join(shipped) or 'none'} "
                          f"(in {sweeps_dir()}), or give the path of a .toml file")
    return read_preset(shipped[text])


def read_preset(path: Path) -> Preset:
    """Read and validate one preset file (format: sweeps/README.md)."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise PresetError(f"{path}: cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise PresetError(f"{path}: not valid TOML: {exc}") from None
    return parse_preset(data, path)


def _fail(path: Path, key: str, message: str) -> PresetError:
    return PresetError(f"{path}: {key}: {message}")


def _unknown(path: Path, where: str, table: dict, known: tuple) -> None:
    extra = [k for k in table if k not in known]
    if extra:
        raise _fail(path, f"{where}{extra[0]}", f"unknown key (known: {', '.join(known)})")


def _names(path: Path, key: str, value) -> tuple[str, ...]:
    """A list of names, or one comma-separated string of them."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
        raise _fail(path, key, f"must be a list of names, got {value!r}")
    names = tuple(v.strip() for v in items if v.strip())
    if not names:
        raise _fail(path, key, "is empty")
    return names


def _int(path: Path, key: str, value, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise _fail(path, key, f"must be an integer >= {minimum}, got {value!r}")
    return value


def _sweep(path: Path, i: int, table) -> SweepSpec:
    where = f"sweep[{i}]"
    if not isinstance(table, dict):
        raise _fail(path, where, "must be a table ([[sweep]])")
    _unknown(path, where + ".", table, SWEEP_KEYS)
    vary = table.get("vary")
    if vary not in schema.AXES:
        raise _fail(path, where + ".vary", f"must be one of {', '.join(schema.AXES)}, got {vary!r}")
    values = table.get("values")
    if values is not None:
        if not isinstance(values, list) or not values:
            raise _fail(path, where + ".values", f"must be a non-empty list of integers, got {values!r}")
        minimum = 0 if vary in ("L", "S") else 1
        values = tuple(_int(path, where + ".values", v, minimum) for v in values)
        if len(set(values)) != len(values):
            raise _fail(path, where + ".values", f"repeat a value: {list(values)}")
    name = table.get("name")
    if name is not None and (not isinstance(name, str) or not name.strip() or "/" in name):
        raise _fail(path, where + ".name", f"must be a non-empty name without '/', got {name!r}")
    base = table.get("base", {})
    if not isinstance(base, dict):
        raise _fail(path, where + ".base", f"must be a table such as {{ T = 2048 }}, got {base!r}")
    _unknown(path, where + ".base.", base, BASE_FIELDS)
    pairs = tuple((k, _int(path, f"{where}.base.{k}", v, 0 if k in ("L", "S", "Tq") else 1)) for k, v in base.items())
    return SweepSpec(vary, values, name, pairs)


def parse_preset(data: dict, path: Path) -> Preset:
    """A Preset from a TOML file's table (PresetError naming `path` and the key otherwise)."""
    path = Path(path)
    _unknown(path, "", data, PRESET_KEYS)
    description = data.get("description", "")
    if not isinstance(description, str):
        raise _fail(path, "description", f"must be a string, got {description!r}")
    pass_ = data.get("pass")
    if pass_ is not None and pass_ not in schema.PASSES:
        raise _fail(path, "pass", f"must be one of {', '.join(schema.PASSES)}, got {pass_!r}")
    providers = ",".join(_names(path, "providers", data["providers"])) if "providers" in data else None
    timers = _names(path, "timers", data["timers"]) if "timers" in data else ()
    bad = [t for t in timers if t not in TIMERS + LEGACY_TIMERS]
    if bad or len(set(timers)) != len(timers):
        raise _fail(path, "timers", f"must be distinct names among {', '.join(TIMERS + LEGACY_TIMERS)}, "
                                    f"got {list(timers)}")
    tables = data.get("sweep")
    if not isinstance(tables, list) or not tables:
        raise _fail(path, "sweep", "a preset needs at least one [[sweep]] table")
    sweeps = tuple(_sweep(path, i, t) for i, t in enumerate(tables))
    labels = [s.label for s in sweeps]
    if dup := next((x for x in labels if labels.count(x) > 1), None):
        raise _fail(path, "sweep", f"two sweeps are named {dup!r} (they would write the same CSV); name them")
    if pass_ != schema.DECODE_PASS and any(s.vary == "Tq" for s in sweeps):
        raise _fail(path, "sweep", "a Tq sweep needs pass = \"decode\"")
    return Preset(path.stem, path, description.strip(), sweeps, pass_, providers, timers)


def preset_sweeps(name: str, only: Optional[str] = None) -> tuple[SweepSpec, ...]:
    """The sweeps of preset `name` (a shipped name or a .toml path), selected by `only`
    (`Preset.select`)."""
    return load_preset(name).select(only)
