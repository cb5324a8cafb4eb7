"""Report figures (PNG + SVG), drawn with matplotlib's object API (no pyplot, no global state).

Every figure is built and saved inside matplotlib's default style with a fixed SVG hash salt and
no date/software metadata, so identical inputs give byte-identical files on one matplotlib version.
Inputs are the frames built by `moda_bench.reports.report` (rows, efficiency and ablation sections).
"""
from __future__ import annotations

import math
from pathlib import Path

from moda_bench import schema
from moda_bench.reports.report import AXES, CEILING_PROVIDER, INT_CONFIG_COLUMNS, LADDER, PAPER_AXES, PASS_LABEL, _sort_passes

RC = {"svg.hashsalt": "moda-bench", "svg.fonttype": "path", "figure.dpi": 100, "font.size": 9,
      "axes.grid": True, "grid.alpha": 0.3}
PNG_METADATA = {"Software": None}
SVG_METADATA = {"Date": None, "Creator": None}
PNG_DPI = 150
LOG_RANGE = 16.0                                  # use a log axis when max/min reaches this
PROVIDER_ORDER = ["moda", "ours", "fa2", "fa2-triton", "cudnn", "flex", "naive-torch", "flash-compatible",
                  "chunk-aware", "group-aware", "batched-tiles"]
AXIS_LABEL = {"T": "sequence length T", "G": "GQA group size G (Hq = G * Hk)", "L": "depth L",
              "C": "query chunk C (rows)"}


def _color(provider: str, extra: list[str]) -> str:
    """Fixed colour per provider: known ones by PROVIDER_ORDER, others after them in sorted order."""
    from matplotlib import colormaps
    names = PROVIDER_ORDER + [p for p in sorted(extra) if p not in PROVIDER_ORDER]
    cmap = colormaps["tab10"]
    from matplotlib.colors import to_hex
    return to_hex(cmap(names.index(provider) % 10 if provider in names else 9))


def _wants_log(values) -> bool:
    v = [float(x) for x in values if not math.isnan(float(x)) and float(x) > 0]
    return len(v) > 1 and max(v) / min(v) >= LOG_RANGE


def _set_x(ax, axis: str, xs) -> None:
    """Ticks exactly at the measured points; log2 axis when the range spans >= LOG_RANGE."""
    xs = sorted({float(x) for x in xs if not math.isnan(float(x))})
    if _wants_log(xs):
        ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([str(int(x)) if float(x).is_integer() else f"{x:g}" for x in xs])
    ax.minorticks_off()
    ax.set_xlabel(AXIS_LABEL.get(axis, axis))


def _series(part, axis: str, ycol: str):
    """(label, provider, x, y) per provider (+ other config columns that vary inside the sweep)."""
    others = [c for c in schema.CONFIG_COLUMNS if c != axis and not (axis == "G" and c == "Hq")
              and part[c].nunique(dropna=False) > 1]
    out = []
    rank = {p: i for i, p in enumerate(PROVIDER_ORDER)}
    groups = part.groupby(["provider"] + others, sort=True, dropna=False)
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        provider = key[0]
        label = provider + ("" if not others else " (" + ", ".join(
            f"{c}={int(v) if c in INT_CONFIG_COLUMNS else v}" for c, v in zip(others, key[1:])) + ")")
        g = g.sort_values(axis)
        out.append((label, provider, g[axis].astype(float).tolist(), g[ycol].astype(float).tolist()))
    out.sort(key=lambda s: (rank.get(s[1], len(rank)), s[0]))
    return out


def _short(v: float) -> str:
    """Bar label: whole numbers from 100 up, else three significant digits."""
    return f"{v:.0f}" if v >= 100 else f"{v:.3g}"


def _new_figure(n_panels: int, title: str, width_per_panel: float = 4.2, height: float = 3.6):
    from matplotlib.figure import Figure
    fig = Figure(figsize=(max(1, n_panels) * width_per_panel, height), layout="constrained")
    axes = fig.subplots(1, max(1, n_panels), squeeze=False)[0]
    fig.suptitle(title)
    return fig, list(axes)


def _measure_figure(rows, ycol: str, ylabel: str, title: str, ceiling=None):
    """One panel per swept axis: ycol of every provider against the axis (primary pass)."""
    ok = rows[(rows["status"] == schema.OK) & rows[ycol].notna() & (rows["provider"] != CEILING_PROVIDER)]
    if ok.empty:
        return None
    pass_ = _sort_passes(ok["pass"])[0]
    ok = ok[ok["pass"] == pass_]
    axes_present = [a for a in AXES if (ok["sweep"] == a).any()]
    if not axes_present:
        return None
    providers = sorted(set(ok["provider"]))
    fig, axs = _new_figure(len(axes_present), f"{title} ({PASS_LABEL.get(pass_, pass_)})")
    for ax, axis in zip(axs, axes_present):
        part = ok[ok["sweep"] == axis]
        ys = []
        for label, provider, x, y in _series(part, axis, ycol):
            ax.plot(x, y, marker="o", label=label, color=_color(provider, providers))
            ys += y
        if ceiling is not None:
            ax.axhline(ceiling[0], color="black", linestyle="--", linewidth=1,
                       label=f"matmul ceiling {ceiling[0]:.0f}")
            ax.set_ylim(0, ceiling[0] * 1.08)
        elif _wants_log(ys):
            ax.set_yscale("log")
        _set_x(ax, axis, part[axis])
        ax.set_ylabel(ylabel)
        ax.set_title(f"vs {axis}")
        ax.legend(fontsize=7)
    return fig


def runtime_figure(rows):
    """Median runtime (ms) per provider against T, G, L (and C), log axes where the range demands."""
    return _measure_figure(rows, "median_ms", "median ms", "Runtime")


def tflops_figure(rows, ceiling: tuple[float, str]):
    """Achieved TFLOP/s (tflops column) per provider against the matmul ceiling."""
    return _measure_figure(rows, "tflops", "TFLOP/s", "Achieved TFLOP/s", ceiling=ceiling)


def _paper_axis(paper_eff, axis: str):
    """Paper rows of the one-axis sweep over `axis`: the other paper axes at their most common value."""
    base = {a: paper_eff[a].mode().iloc[0] for a in PAPER_AXES}
    mask = paper_eff["pass"] == "fwdbwd"
    for a in PAPER_AXES:
        if a != axis:
            mask &= paper_eff[a] == base[a]
    return paper_eff[mask].drop_duplicates(axis).sort_values(axis)


def extra_time_figure(eff_sections, paper):
    """Extra time % of MoDA over FA2 against T, G, L (C): ours (fwd+bwd) vs the paper's A100."""
    ours = {s.sweep: s.frame for s in eff_sections if s.pass_ == "fwdbwd" and s.sweep in AXES
            and s.frame["extra_pct"].notna().any()}
    has_paper = paper.efficiency is not None
    axes_present = [a for a in AXES if a in ours or (has_paper and a in PAPER_AXES)]
    if not ours and not has_paper:
        return None
    fig, axs = _new_figure(len(axes_present), "MoDA extra time over FA2 (fwd+bwd)")
    for ax, axis in zip(axs, axes_present):
        xs = []
        if axis in ours:
            f = ours[axis].dropna(subset=["extra_pct"]).sort_values(axis)
            ax.plot(f[axis].astype(float), f["extra_pct"], marker="o", color=_color("moda", []), label="ours")
            xs += f[axis].tolist()
        if has_paper and axis in PAPER_AXES:
            p = _paper_axis(paper.efficiency, axis)
            ax.plot(p[axis].astype(float), p["extra_time_pct"], marker="s", linestyle="--", color="gray",
                    label="paper (A100)")
            xs += p[axis].tolist()
        ax.axhline(0, color="black", linewidth=0.8)
        _set_x(ax, axis, xs)
        ax.set_ylabel("extra time %  (MoDA - FA2) / FA2")
        ax.set_title(f"vs {axis}")
        ax.legend(fontsize=7)
    return fig


def ablation_figure(abl_sections):
    """The ablation ladder: ms per rung, ours vs paper, log scale; one panel per ablation config."""
    sections = [s for s in abl_sections if s.frame["ms"].notna().any() or s.frame["paper_ms"].notna().any()]
    if not sections:
        return None
    fig, axs = _new_figure(len(sections), "Kernel ablation ladder", width_per_panel=5.5, height=4.0)
    width = 0.4
    for ax, s in zip(axs, sections):
        f = s.frame
        idx = list(range(len(f)))
        for offset, col, label, color in ((-width / 2, "ms", "ours", _color("moda", [])),
                                          (width / 2, "paper_ms", "paper (A100)", "gray")):
            vals = f[col].astype(float).tolist()
            if not any(not math.isnan(v) for v in vals):
                continue
            bars = ax.bar([i + offset for i in idx], [0 if math.isnan(v) else v for v in vals], width,
                          label=label, color=color)
            ax.bar_label(bars, labels=["" if math.isnan(v) else _short(v) for v in vals], fontsize=6)
        ax.set_yscale("log")
        ax.set_xticks(idx)
        ax.set_xticklabels([p for p in f["provider"]], rotation=20, ha="right")
        ax.set_ylabel("ms (log)")
        ax.set_title(s.title, fontsize=7)
        ax.legend(fontsize=7)
    return fig


def save_figure(fig, stem: Path) -> list[Path]:
    """stem.png and stem.svg, without dates or version strings (deterministic bytes)."""
    import matplotlib
    stem.parent.mkdir(parents=True, exist_ok=True)
    png, svg = stem.with_suffix(".png"), stem.with_suffix(".svg")
    with matplotlib.rc_context(RC):
        fig.savefig(png, dpi=PNG_DPI, metadata=PNG_METADATA)
        fig.savefig(svg, metadata=SVG_METADATA)
    return [png, svg]


def write_all(fig_dir: Path, *, rows, eff_sections, abl_sections, paper, ceiling) -> list[Path]:
    """Draw and save every figure that has data; returns the written paths."""
    import matplotlib
    import matplotlib.style
    builders = [("runtime", lambda: runtime_figure(rows)),
                ("extra_time", lambda: extra_time_figure(eff_sections, paper)),
                ("ablation", lambda: ablation_figure(abl_sections)),
                ("tflops", lambda: tflops_figure(rows, ceiling))]
    written = []
    with matplotlib.style.context("default"), matplotlib.rc_context(RC):
        for name, build in builders:
            fig = build()
            if fig is not None:
                written += save_figure(fig, fig_dir / name)
    return written
