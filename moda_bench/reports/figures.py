"""Every figure moda-bench draws (PNG, matplotlib's object API: no pyplot, no global state; the
shared colours, axes and saving are `reports.plotting`).

- Report figures (`write_all`, per GPU: runtime, extra time, ablation ladder, TFLOP/s and, where
  the CSVs have it, the ratio to the fastest attention, drawn here from the training sweeps and
  the frames built by `reports.tables`; the floor, decode and Depth-Attention figures of
  `reports.workload_figures`); `ablation_figure` and `save_figure` are also used by `ablate`.
  Ratios and extra times get error bars from the paired 95% intervals where measured; rows of
  the graph timer are drawn dashed beside the eager ones. They are built and saved inside
  matplotlib's default style with no date/software metadata, so identical inputs give
  byte-identical files on one matplotlib version; a figure whose inputs' digest
  (`reports.manifest`) matches the one recorded when it was drawn is not drawn again.
- The per-sweep figure (`plot_sweep`, used by `sweep`), drawn from one sweep CSV alone (read
  through `moda_bench.results`): median runtime with p20-p80 bars and extra time % vs FA2
  (with its interval where measured) against the swept parameter (`infer_x`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from moda_bench import results as results_io
from moda_bench import schema
from moda_bench.reports.plotting import (
    figure_style,
    interval_err,
    new_figure,
    provider_color,
    save_figure,
    series,
    set_x,
    timer_style,
    wants_log,
)
from moda_bench.reports.vocab import (
    CEILING_PROVIDER,
    MODA_VARIANTS,
    PAPER_AXES,
    SEQUENCE_ONLY,
    config_text,
    has_text,
    pass_label,
    sort_passes,
    swept_axis,
)


def _short(v: float) -> str:
    """Bar label: whole numbers from 100 up, else three significant digits."""
    return f"{v:.0f}" if v >= 100 else f"{v:.3g}"


def _axis_figure(ok, title: str, draw):
    """A figure of one panel per swept axis present in the rows `ok` of the primary pass:
    draw(ax, axis, rows of that sweep, providers) fills each panel. None when there is nothing."""
    if ok.empty:
        return None
    pass_ = sort_passes(ok["pass"])[0]
    ok = ok[ok["pass"] == pass_]
    axes_present = [a for a in schema.AXES if (ok["sweep"] == a).any()]
    if not axes_present:
        return None
    fig, axs = new_figure(len(axes_present), f"{title} ({pass_label(pass_)})")
    providers = sorted(set(ok["provider"]))
    for ax, axis in zip(axs, axes_present):
        draw(ax, axis, ok[ok["sweep"] == axis], providers)
    return fig


def _measure_figure(rows, ycol: str, ylabel: str, title: str, ceiling=None):
    """One panel per swept axis: ycol of every provider against the axis (primary pass)."""
    ok = rows[(rows["status"] == schema.OK) & rows[ycol].notna() & (rows["provider"] != CEILING_PROVIDER)]

    def draw(ax, axis, part, providers):
        ys = []
        for label, provider, timer, g in series(part, axis):
            x, y = g[axis].astype(float).tolist(), g[ycol].astype(float).tolist()
            ax.plot(x, y, marker="o", label=label, color=provider_color(provider, providers), **timer_style(timer))
            ys += y
        if ceiling is not None:
            ax.axhline(ceiling[0], color="black", linestyle="--", linewidth=1,
                       label=f"matmul ceiling {ceiling[0]:.0f}")
            ax.set_ylim(0, ceiling[0] * 1.08)
        elif wants_log(ys):
            ax.set_yscale("log")
        set_x(ax, axis, part[axis])
        ax.set_ylabel(ylabel)
        ax.set_title(f"vs {axis}")
        ax.legend(fontsize=7)

    return _axis_figure(ok, title, draw)


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


def _extraseries(section, multi_timer: bool):
    """(label, colour, timer, frame with axis, y, err_lo, err_hi) of MoDA and its variants in one
    fwd+bwd efficiency section: extra time % over FA2, the paired ratio's where it has an interval."""
    f, axis, out = section.frame, section.sweep, []
    suffix = f" [{section.timer}]" if multi_timer and section.timer else ""
    cols = [("ours", "moda", "moda_ratio", "moda_ratio_lo", "moda_ratio_hi")]
    cols += [(p, p, f"{p}:ratio", f"{p}:ratio_lo", f"{p}:ratio_hi") for p in section.others if p in MODA_VARIANTS]
    for label, colour, r, lo, hi in cols:
        if r not in f:
            continue
        paired = f[lo].notna() & f[hi].notna()
        base = f["extra_pct"] if label == "ours" else (f[r] - 1) * 100
        y = ((f[r] - 1) * 100).where(paired, base)
        data = f[[axis]].assign(y=y, lo=((f[lo] - 1) * 100).where(paired), hi=((f[hi] - 1) * 100).where(paired))
        data = data.dropna(subset=["y"]).sort_values(axis)
        if not data.empty:
            out.append((label + suffix, provider_color(colour, []), section.timer if multi_timer else "", data))
    return out


def extra_time_figure(eff_sections, paper):
    """The overhead of MoDA (and its variants) over FA2, MoDA / FA2 - 1 in %, against T, G, L (C):
    ours (fwd+bwd, with the paired interval as error bars where measured) vs the paper's A100,
    whose printed extra time (M - F) / M is converted to the same quantity from its two times."""
    sections = [s for s in eff_sections if s.pass_ == "fwdbwd" and s.sweep in schema.AXES]
    multi_timer = len({s.timer for s in sections}) > 1
    ours: dict = {}
    for s in sections:
        ours.setdefault(s.sweep, []).extend(_extraseries(s, multi_timer))
    ours = {a: v for a, v in ours.items() if v}
    has_paper = paper.efficiency is not None
    axes_present = [a for a in schema.AXES if a in ours or (has_paper and a in PAPER_AXES)]
    if not ours and not has_paper:
        return None
    fig, axs = new_figure(len(axes_present), "MoDA overhead over FA2, MoDA / FA2 - 1 (fwd+bwd)")
    for ax, axis in zip(axs, axes_present):
        xs = []
        for label, colour, timer, d in ours.get(axis, []):
            if d["lo"].notna().any():
                ax.errorbar(d[axis].astype(float), d["y"], yerr=interval_err(d["y"], d["lo"], d["hi"]), marker="o",
                            capsize=3, color=colour, label=label, **timer_style(timer))
            else:
                ax.plot(d[axis].astype(float), d["y"], marker="o", color=colour, label=label, **timer_style(timer))
            xs += d[axis].tolist()
        if has_paper and axis in PAPER_AXES:
            p = _paper_axis(paper.efficiency, axis)
            # the paper prints (M - F) / M; drawn here as the same quantity as ours, M / F - 1
            over = (p["moda_triton_ms"].astype(float) / p["fa2_triton_ms"].astype(float) - 1.0) * 100.0
            ax.plot(p[axis].astype(float), over, marker="s", linestyle="--", color="gray",
                    label="paper (A100)")
            xs += p[axis].tolist()
        ax.axhline(0, color="black", linewidth=0.8)
        set_x(ax, axis, xs)
        ax.set_ylabel("overhead %  (MoDA - FA2) / FA2")
        ax.set_title(f"vs {axis}")
        ax.legend(fontsize=7)
    return fig


def ratio_to_best_figure(rows):
    """Time over the fastest sequence attention of the GPU at each point, across every run the
    report reads (`reports.fastest`: the paired ratio_to_best with its interval as error bars where
    the fastest is of the row's own run), of every provider with a depth part, one panel per swept
    axis (primary pass); the panel title names the fastest attention(s); a series with a point
    whose fastest attention was timed in another run says so in its label. None without data."""
    from moda_bench.reports.fastest import CROSS_MARK, with_fastest
    rows = with_fastest(rows[rows["provider"] != CEILING_PROVIDER])
    ok = rows[(rows["status"] == schema.OK) & rows["ratio_to_best"].notna() & ~rows["provider"].isin(SEQUENCE_ONLY)]

    def draw(ax, axis, part, providers):
        ys = []
        for label, provider, timer, g in series(part, axis):
            y = g["ratio_to_best"].astype(float)
            cross = bool(g["best_cross"].astype(bool).any())
            ax.errorbar(g[axis].astype(float), y, yerr=interval_err(y, g["ratio_to_best_lo"], g["ratio_to_best_hi"]),
                        marker="o", capsize=3,
                        label=label + (f" {CROSS_MARK} fastest from another run" if cross else ""),
                        color=provider_color(provider, providers), **timer_style(timer))
            ys += y.tolist()
        ax.axhline(1.0, color="black", linewidth=0.8)
        if wants_log(ys):
            ax.set_yscale("log")
        set_x(ax, axis, part[axis])
        best = sorted({b.strip() for b in part["best_provider"] if has_text(b)})
        ax.set_ylabel("time / fastest attention")
        ax.set_title(f"vs {axis}" + (f" (fastest: {', '.join(best)})" if best else ""))
        ax.legend(fontsize=7)

    return _axis_figure(ok, "Time over the fastest attention of the GPU", draw)


def ablation_figure(abl_sections):
    """The ablation ladder: ms per rung, ours vs paper, log scale; one panel per ablation config."""
    sections = [s for s in abl_sections if s.frame["ms"].notna().any() or s.frame["paper_ms"].notna().any()]
    if not sections:
        return None
    fig, axs = new_figure(len(sections), "Kernel ablation ladder", width_per_panel=5.5, height=4.0)
    width = 0.4
    for ax, s in zip(axs, sections):
        f = s.frame
        idx = list(range(len(f)))
        for offset, col, label, color in ((-width / 2, "ms", "ours", provider_color("moda", [])),
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


@dataclass
class FigureFile:
    """One report figure: its PNG, the digest of its inputs, and whether this call drew it."""

    path: Path
    digest: str
    drawn: bool


def write_all(fig_dir: Path, *, rows, eff_sections, abl_sections, paper, ceiling, suffix: str = "",
              gpu: str = "", known: Optional[dict] = None, draw: bool = True) -> list[FigureFile]:
    """Every figure that has data from one GPU's rows (every workload: training figures take the
    training sweeps, `reports.workload_figures` the floor, decode and Depth-Attention ones) and
    sections. `suffix` ends every file name and `gpu`, where given, every figure title (a report
    over several GPUs). A figure whose digest equals `known[file name]` (the manifest) and whose
    file exists is left as it is; the others are built and, with `draw`, saved (without `draw`
    nothing is written: the result says which figures exist)."""
    from moda_bench.reports import manifest
    from moda_bench.reports import workload_figures as wf
    from moda_bench.reports.tables import DATTN, DECODE, TRAIN, rows_of
    known = known or {}
    train = rows_of(rows, TRAIN)
    floor_rows = rows_of(rows, TRAIN, DATTN, DECODE)
    decode_rows, dattn_rows = rows_of(rows, DECODE), rows_of(rows, DATTN)
    builders = [("runtime", (train,), lambda: runtime_figure(train)),
                ("extra_time", (eff_sections, paper), lambda: extra_time_figure(eff_sections, paper)),
                ("ablation", (abl_sections,), lambda: ablation_figure(abl_sections)),
                ("tflops", (train, ceiling), lambda: tflops_figure(train, ceiling)),
                ("ratio_to_best", (train,), lambda: ratio_to_best_figure(train)),
                ("floor", (floor_rows,), lambda: wf.floor_figure(floor_rows)),
                ("decode", (decode_rows,), lambda: wf.decode_figure(decode_rows)),
                ("depth_attention", (dattn_rows,), lambda: wf.depth_attention_figure(dattn_rows))]
    out = []
    with figure_style():
        for name, inputs, build in builders:
            path = fig_dir / f"{name}{suffix}.png"
            key = manifest.digest(name, gpu, *inputs)
            if known.get(path.name) == key and path.is_file():
                out.append(FigureFile(path, key, drawn=False))
                continue
            fig = build()
            if fig is None:
                continue
            if gpu and hasattr(fig, "get_suptitle"):
                fig.suptitle(f"{fig.get_suptitle()}, {gpu}")
            if draw:
                save_figure(fig, path.with_suffix(""))
            out.append(FigureFile(path, key, drawn=draw))
    return out


# ---------------------------------------------------------------------------------------------
# The per-sweep figure (written by `moda-bench sweep` beside each sweep CSV)
# ---------------------------------------------------------------------------------------------

def infer_x(frame) -> str:
    """The swept column (`vocab.swept_axis`): the `sweep` name when it is an axis, else the first
    config column (S, T, G, L, C, B, Tq, d, Hk) taking more than one value, else T."""
    names = [s for s in frame["sweep"].dropna().unique() if s != ""] if "sweep" in frame else []
    return swept_axis(frame, names[0] if len(names) == 1 else None)


def read_sweep(csv_path, warn: Optional[Callable[[str], None]] = None):
    """One sweep CSV through `results.read_csv`; integer config columns without gaps as int64."""
    frame = results_io.read_csv(csv_path, warn=warn or results_io.default_warn)
    for c in schema.INT_CONFIG_COLUMNS:
        col = frame[c]
        if len(col) and col.notna().all() and (col == col.round()).all():
            frame[c] = col.astype("int64")
    return frame


def _log_if_wide(ax, axis: str, values) -> None:
    vals = [v for v in values if v > 0]
    if vals and max(vals) / min(vals) >= 8:
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log", base=2 if axis == "x" else 10)


def plot_sweep(csv_path, out_path=None, *, x: str | None = None, title: str | None = None,
               warn: Optional[Callable[[str], None]] = None) -> Path:
    """Write the figure of one sweep CSV; returns its path (default: the CSV's path with .png).

    Left panel: median runtime (p20-p80 error bars) vs the swept parameter, one line per provider
    (and timer, where the CSV holds both). Right panel: extra time % vs FA2 of every non-baseline
    provider, with the paired 95% interval as error bars where measured. Only status 'ok' rows are drawn.
    Raises `results.ResultsError` (a ValueError) when the CSV is not a readable sweep CSV.
    """
    from matplotlib import rcParams
    from matplotlib.figure import Figure

    csv_path = Path(csv_path)
    out_path = Path(out_path) if out_path else csv_path.with_suffix(".png")
    frame = read_sweep(csv_path, warn)
    x = x or infer_x(frame)
    ok = frame[frame["status"] == schema.OK].sort_values(x)

    fig = Figure(figsize=(12, 4.8))
    ax_t, ax_e = fig.subplots(1, 2)
    if ok.empty:
        for ax in (ax_t, ax_e):
            ax.text(0.5, 0.5, "no successful rows", ha="center", va="center", transform=ax.transAxes)
    cycle = rcParams["axes.prop_cycle"].by_key()["color"]
    timers = sorted(set(ok["timer"]))
    colours = {p: cycle[i % len(cycle)] for i, p in enumerate(ok["provider"].drop_duplicates())}
    keys = ["provider", "timer"] if len(timers) > 1 else ["provider"]
    for key, grp in ok.groupby(keys, sort=False):
        provider = key[0] if isinstance(key, tuple) else key
        timer = key[1] if len(keys) > 1 else ""
        colour = colours[provider]  # same colour for a provider in both panels
        label = provider + (f" [{timer}]" if timer else "")
        yerr = None
        if grp[["p20_ms", "p80_ms"]].notna().all().all():
            yerr = [(grp["median_ms"] - grp["p20_ms"]).clip(lower=0), (grp["p80_ms"] - grp["median_ms"]).clip(lower=0)]
        ax_t.errorbar(grp[x], grp["median_ms"], yerr=yerr, marker="o", capsize=3, label=label, color=colour,
                      **timer_style(timer))
        if provider != "fa2" and grp["extra_time_pct"].notna().any():
            lo, hi = (grp["ratio_to_fa2_lo"] - 1) * 100, (grp["ratio_to_fa2_hi"] - 1) * 100
            if (lo.notna() & hi.notna()).any():
                ax_e.errorbar(grp[x], grp["extra_time_pct"], yerr=interval_err(grp["extra_time_pct"], lo, hi),
                              marker="o", capsize=3, label=label, color=colour, **timer_style(timer))
            else:
                ax_e.plot(grp[x], grp["extra_time_pct"], marker="o", label=label, color=colour, **timer_style(timer))
    if not ok.empty:
        _log_if_wide(ax_t, "x", ok[x])
        _log_if_wide(ax_t, "y", ok["median_ms"])
        _log_if_wide(ax_e, "x", ok[x])
        ax_t.legend(fontsize=8)
        if ax_e.lines:
            ax_e.legend(fontsize=8)
    ax_e.axhline(0.0, color="grey", linewidth=0.8)
    ax_t.set_xlabel(x)
    ax_t.set_ylabel("median runtime (ms)")
    ax_e.set_xlabel(x)
    ax_e.set_ylabel("overhead vs FA2 (%), M / F - 1")
    for ax in (ax_t, ax_e):
        ax.grid(True, which="both", alpha=0.3)
        vals = sorted(ok[x].unique()) if not ok.empty else []
        if vals:
            ax.set_xticks(vals)
            ax.set_xticklabels([str(int(v)) for v in vals])
    fig.suptitle(title or _sweep_title(frame, x), fontsize=10)
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)
    return out_path


def _sweep_title(frame, x: str) -> str:
    """'<pass>, <dtype>, fixed params, <gpu>' from the CSV's columns."""
    parts = []
    for col in ("pass", "dtype"):
        if col in frame and frame[col].nunique() == 1:
            parts.append(str(frame[col].iloc[0]))
    fixed = config_text((c, frame[c].iloc[0]) for c in ("B", "T", "G", "Hk", "L", "d", "C", "depth_grad", "Tq", "S")
                        if c != x and c in frame and frame[c].nunique() == 1)
    parts.append(fixed.replace(", ", " "))
    if "gpu" in frame and frame["gpu"].nunique() == 1:
        parts.append(str(frame["gpu"].iloc[0]))
    return f"sweep over {x}: " + ", ".join(p for p in parts if p)
