"""Which report figures are up to date: a digest of each figure's inputs, kept beside the figures
in `figures/manifest.json` (`{file name: digest}`), so `moda-bench report` redraws a figure only
when the rows, sections or settings it is drawn from changed, and committed PNGs stay byte-stable.

A digest covers the figure's name and title, its inputs (DataFrames as CSV text without the
reader's `_file`/`_line` columns, so moving a CSV to another folder redraws nothing; the report's
sections field by field; anything else by `repr`), matplotlib's version and `DRAWING_VERSION`.
Bump `DRAWING_VERSION` when the drawing code changes what a figure looks like.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

MANIFEST = "manifest.json"
DRAWING_VERSION = "1"


def _feed(h, part) -> None:
    """Add one input to the hash: frames as CSV text, dataclasses field by field, sequences item by item."""
    if hasattr(part, "to_csv") and hasattr(part, "columns"):
        frame = part[[c for c in part.columns if not str(c).startswith("_")]]
        h.update(b"frame\0" + frame.to_csv(index=False).encode())
    elif dataclasses.is_dataclass(part) and not isinstance(part, type):
        h.update(type(part).__name__.encode() + b"\0")
        for f in dataclasses.fields(part):
            h.update(f.name.encode() + b"=")
            _feed(h, getattr(part, f.name))
    elif isinstance(part, (list, tuple)):
        h.update(b"[%d\0" % len(part))
        for item in part:
            _feed(h, item)
        h.update(b"]")
    else:
        h.update(repr(part).encode() + b"\0")


def digest(*parts) -> str:
    """sha256 over the parts (see the module docstring), matplotlib's version and DRAWING_VERSION."""
    import matplotlib
    h = hashlib.sha256(f"moda-bench figure {DRAWING_VERSION} matplotlib {matplotlib.__version__}\0".encode())
    for part in parts:
        _feed(h, part)
    return h.hexdigest()


def load(fig_dir: Path) -> dict[str, str]:
    """The manifest of fig_dir ({} when missing or unreadable: every figure is then redrawn)."""
    try:
        data = json.loads((Path(fig_dir) / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def save(fig_dir: Path, entries: dict[str, str]) -> Path:
    """Write fig_dir/manifest.json (sorted keys, one entry a line) and return its path."""
    path = Path(fig_dir) / MANIFEST
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(sorted(entries.items())), indent=1) + "\n", encoding="utf-8", newline="\n")
    return path
