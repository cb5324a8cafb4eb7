"""What every report figure shares (matplotlib's object API: no pyplot, no global state): fixed
colours and legend order per provider, the style of a timer's line, axes with ticks at the
measured points, series of a sweep, figure and panel-grid construction, and `save_figure` (one
PNG per figure, 256 colours, no date/software metadata, so identical inputs give byte-identical
files on one matplotlib version; the resolution steps down until the file fits `MAX_FIGURE_BYTES`).
`reports.figures` and `reports.workload_figures` draw with them.
"""
from __future__ import annotations

import contextlib
import math
from pathlib import Path

from moda_bench import schema
from moda_bench.reports.vocab import config_text

RC = {"figure.dpi": 100, "font.size": 9, "axes.grid": True, "grid.alpha": 0.3}
PNG_METADATA = {"Software": None}
PNG_DPI = (150, 120, 100, 85, 72, 60)             # tried in turn until the PNG fits MAX_FIGURE_BYTES
MAX_FIGURE_BYTES = 300_000                         # committed figures stay small (<= 300 KB each)
LOG_RANGE = 16.0                                  # use a log axis when max/min reaches this
PROVIDER_ORDER = ["moda", "ours", "fa2", "fa2-triton", "cudnn", "flex", "naive-torch", "flash-compatible",
                  "chunk-aware", "group-aware", "batched-tiles"]
# legend order; PROVIDER_ORDER (tab10 by position) and FIXED_COLORS fix the colours
SERIES_RANK = (["moda", "moda-triton", "moda-nosplit"] + PROVIDER_ORDER[1:]
               + ["moda-fused", "moda-overlap", "moda-fa4", "fa4", "flashinfer", "dattn", "dattn-torch", "dattn-mix"])
# providers added later, each clear of the colours the figures it appears in already use
# moda-triton keeps the blue the Triton kernel had when it was `moda`; the dispatcher `moda` is black
FIXED_COLORS = {"moda": "#222222", "moda-triton": "#1f77b4",
                "moda-fused": "#637939", "moda-overlap": "#393b79", "moda-fa4": "#ff7f0e", "fa4": "#17becf",
                "moda-nosplit": "#aec7e8", "flashinfer": "#e7ba52",
                "dattn": "#d6616b", "dattn-torch": "#843c39", "dattn-mix": "#7b4173"}
TIMER_STYLE = {"eager": "-", "graph": "--"}        # line style per timer where a figure draws both
AXIS_LABEL = {"T": "sequence length T", "G": "GQA group size G (Hq = G * Hk)", "L": "depth L",
              "C": "query chunk C (rows)", "B": "batch B", "S": "source layers S", "Tq": "new tokens Tq"}
GRID_COLUMNS = 4                                   # panels per row of a grid figure


def provider_color(provider: str, extra: list[str]) -> str:
    """Fixed colour per provider: FIXED_COLORS, else by PROVIDER_ORDER, others after them in sorted order."""
    if provider in FIXED_COLORS:
        return FIXED_COLORS[provider]
    from matplotlib import colormaps
    from matplotlib.colors import to_hex
    names = PROVIDER_ORDER + [p for p in sorted(extra) if p not in PROVIDER_ORDER]
    return to_hex(colormaps["tab10"](names.index(provider) % 10 if provider in names else 9))


def wants_log(values) -> bool:
    """True when the positive values span LOG_RANGE or more."""
    v = [float(x) for x in values if not math.isnan(float(x)) and float(x) > 0]
    return len(v) > 1 and max(v) / min(v) >= LOG_RANGE


def set_x(ax, axis: str, xs) -> None:
    """Ticks exactly at the measured points; log2 axis when the (positive) range spans >= LOG_RANGE."""
    xs = sorted({float(x) for x in xs if not math.isnan(float(x))})
    if wants_log(xs) and xs[0] > 0:
        ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([str(int(x)) if float(x).is_integer() else f"{x:g}" for x in xs])
    ax.minorticks_off()
    ax.set_xlabel(AXIS_LABEL.get(axis, axis))


def follows(part, axis: str, column: str) -> bool:
    """True when column takes one value per value of axis in part (Hq in a G sweep, L in an S sweep)."""
    return bool((part.groupby(axis, dropna=False)[column].nunique(dropna=False) <= 1).all())


def series(part, axis: str):
    """(label, provider, timer, rows sorted by axis) per provider (+ other config columns that vary
    inside the sweep without following the axis, + the timer where the part holds several; timer ''
    otherwise). Labels name the other columns as captions do (`vocab.config_text`)."""
    others = [c for c in schema.CONFIG_COLUMNS if c != axis and part[c].nunique(dropna=False) > 1
              and not follows(part, axis, c)]
    by_timer = part["timer"].nunique(dropna=False) > 1
    out = []
    rank = {p: i for i, p in enumerate(SERIES_RANK)}
    groups = part.groupby(["provider"] + others + (["timer"] if by_timer else []), sort=True, dropna=False)
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        provider = key[0]
        extra = config_text(zip(others, key[1:]))
        label = provider + (f" ({extra})" if extra else "")
        timer = str(key[-1]) if by_timer else ""
        label += f" [{timer}]" if timer else ""
        out.append((label, provider, timer, g.sort_values(axis)))
    out.sort(key=lambda s: (rank.get(s[1], len(rank)), s[0]))
    return out


def timer_style(timer: str) -> dict:
    """Line style keyword of a series: none for a figure of one timer (the default solid line)."""
    return {"linestyle": TIMER_STYLE.get(timer, ":")} if timer else {}


def interval_err(y, lo, hi):
    """yerr [below, above] from an interval around y (0 where the interval is missing)."""
    return [(y - lo).clip(lower=0).fillna(0).tolist(), (hi - y).clip(lower=0).fillna(0).tolist()]


def new_figure(n_panels: int, title: str, width_per_panel: float = 4.2, height: float = 3.6):
    """(figure, axes) with one row of n_panels panels under a title."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=(max(1, n_panels) * width_per_panel, height), layout="constrained")
    axes = fig.subplots(1, max(1, n_panels), squeeze=False)[0]
    fig.suptitle(title)
    return fig, list(axes)


def new_grid(n_panels: int, title: str, width_per_panel: float = 4.2, height_per_row: float = 3.4):
    """(figure, axes) with n_panels panels, GRID_COLUMNS per row (unused cells of the last row hidden)."""
    from matplotlib.figure import Figure
    n = max(1, n_panels)
    cols = min(n, GRID_COLUMNS)
    rows = -(-n // cols)
    fig = Figure(figsize=(cols * width_per_panel, rows * height_per_row + 0.4), layout="constrained")
    axes = list(fig.subplots(rows, cols, squeeze=False).ravel())
    for ax in axes[n:]:
        ax.set_visible(False)
    fig.suptitle(title)
    return fig, axes[:n]


@contextlib.contextmanager
def figure_style():
    """matplotlib's default style with RC: where every report figure is built and saved."""
    import matplotlib
    import matplotlib.style
    with matplotlib.style.context("default"), matplotlib.rc_context(RC):
        yield


def png_bytes(fig, max_bytes: int = MAX_FIGURE_BYTES) -> bytes:
    """The figure as a 256-colour PNG (Pillow, matplotlib's own dependency; plots lose nothing
    visible and shrink about threefold) at the first resolution of PNG_DPI that fits max_bytes
    (else the lowest), without dates or version strings: the same figure gives the same bytes."""
    import io

    import matplotlib
    from PIL import Image
    data = b""
    with matplotlib.rc_context(RC):
        for dpi in PNG_DPI:
            raw = io.BytesIO()
            fig.savefig(raw, format="png", dpi=dpi, metadata=PNG_METADATA)
            raw.seek(0)
            out = io.BytesIO()
            Image.open(raw).convert("RGB").quantize(256).save(out, format="png", optimize=True)
            data = out.getvalue()
            if len(data) <= max_bytes:
                break
    return data


def save_figure(fig, stem: Path) -> list[Path]:
    """stem.png (`png_bytes`: deterministic, at most MAX_FIGURE_BYTES where a resolution allows)."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    png = stem.with_suffix(".png")
    png.write_bytes(png_bytes(fig))
    return [png]
