"""Figures of a sweep, drawn from its CSV alone (matplotlib Agg; no torch, no triton).

Left panel: median runtime (p20-p80 error bars) vs the swept parameter, one line per provider.
Right panel: extra time % vs FA2 of every non-baseline provider. Only status 'ok' rows are drawn.
"""
from __future__ import annotations

from pathlib import Path

from moda_bench import schema

_AXIS_ORDER = ["T", "G", "L", "C", "B", "d", "Hk"]  # Hq follows G; never chosen as x


def infer_x(frame) -> str:
    """The swept column: the `sweep` name when it is a config column, else the first config
    column (T, G, L, C, B, d, Hk) taking more than one value, else T."""
    names = [s for s in frame["sweep"].dropna().unique()] if "sweep" in frame else []
    if len(names) == 1 and names[0] in _AXIS_ORDER:
        return names[0]
    for col in _AXIS_ORDER:
        if col in frame and frame[col].nunique() > 1:
            return col
    return "T"


def _log_if_wide(ax, axis: str, values) -> None:
    vals = [v for v in values if v > 0]
    if vals and max(vals) / min(vals) >= 8:
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log", base=2 if axis == "x" else 10)


def plot_sweep(csv_path, out_path=None, *, x: str | None = None, title: str | None = None) -> Path:
    """Write the figure of one sweep CSV; returns its path (default: the CSV's path with .png)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    csv_path = Path(csv_path)
    out_path = Path(out_path) if out_path else csv_path.with_suffix(".png")
    frame = pd.read_csv(csv_path)
    missing = [c for c in ("provider", "median_ms", "status") if c not in frame]
    if missing:
        raise ValueError(f"{csv_path} is not a sweep CSV (missing columns {missing})")
    x = x or infer_x(frame)
    ok = frame[frame["status"] == schema.OK].sort_values(x)

    fig, (ax_t, ax_e) = plt.subplots(1, 2, figsize=(12, 4.8))
    if ok.empty:
        for ax in (ax_t, ax_e):
            ax.text(0.5, 0.5, "no successful rows", ha="center", va="center", transform=ax.transAxes)
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (provider, grp) in enumerate(ok.groupby("provider", sort=False)):
        colour = cycle[i % len(cycle)]  # same colour for a provider in both panels
        yerr = None
        if grp[["p20_ms", "p80_ms"]].notna().all().all():
            yerr = [(grp["median_ms"] - grp["p20_ms"]).clip(lower=0), (grp["p80_ms"] - grp["median_ms"]).clip(lower=0)]
        ax_t.errorbar(grp[x], grp["median_ms"], yerr=yerr, marker="o", capsize=3, label=provider, color=colour)
        if provider != "fa2" and grp["extra_time_pct"].notna().any():
            ax_e.plot(grp[x], grp["extra_time_pct"], marker="o", label=provider, color=colour)
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
    ax_e.set_ylabel("extra time vs FA2 (%)")
    for ax in (ax_t, ax_e):
        ax.grid(True, which="both", alpha=0.3)
        vals = sorted(ok[x].unique()) if not ok.empty else []
        if vals:
            ax.set_xticks(vals)
            ax.set_xticklabels([str(int(v)) for v in vals])
    fig.suptitle(title or _title(frame, x), fontsize=10)
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)
    plt.close(fig)
    return out_path


def _title(frame, x: str) -> str:
    """'<pass>, <dtype>, fixed params, <gpu>' from the CSV's columns."""
    parts = []
    for col in ("pass", "dtype"):
        if col in frame and frame[col].nunique() == 1:
            parts.append(str(frame[col].iloc[0]))
    fixed = [f"{c}={frame[c].iloc[0]}" for c in ("B", "T", "G", "Hk", "L", "d", "C")
             if c != x and c in frame and frame[c].nunique() == 1]
    parts.append(" ".join(fixed))
    if "gpu" in frame and frame["gpu"].nunique() == 1:
        parts.append(str(frame["gpu"].iloc[0]))
    return f"sweep over {x}: " + ", ".join(p for p in parts if p)
