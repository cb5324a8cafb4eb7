"""The report's figures of the floor and of the workloads beside MoDA training, per GPU (drawn
with `reports.plotting`, saved by `figures.write_all`):

- `floor_figure` (floor.png): every provider's distance to its own floor (`of_floor` = median /
  floor_ms) against the swept value, one panel per (pass, sweep), one line per provider (the
  graph timer's rows where a sweep has several timers), the floor drawn at 1;
- `decode_figure` (decode.png): the bytes per second each decode provider reached (`gbps`)
  against the batch B (log2 axis), one panel per context length T, graph timer (else the decode
  rows' first timer), with the copy rate of the run's canary where the rows give it
  (gbps * of_floor: decode's floor is its bytes at the copy rate);
- `depth_attention_figure` (depth_attention.png): the overhead of each depth method (dattn,
  dattn-torch, moda, moda-fa4) over the fastest attention of the point (`ratio_to_best`, its
  paired interval as error bars) against the number of source layers S, one panel per (T, heads).

Rows without the columns a figure draws (older runs) are left out; a figure without rows is None.
"""
from __future__ import annotations

from moda_bench import schema
from moda_bench.reports.plotting import interval_err, new_grid, provider_color, series, set_x, timer_style, wants_log
from moda_bench.reports.tables import DATTN, DECODE, rows_of
from moda_bench.reports.vocab import (
    ABLATION_SWEEP,
    CEILING_PROVIDER,
    DATTN_METHODS,
    pass_label,
    sort_passes,
    sort_sweeps,
    swept_axis,
)
from moda_bench.reports.workloads import decode_timers


def ok_rows(rows, column: str):
    """Rows that succeeded and have `column` (matmul rows left out)."""
    return rows[(rows["status"] == schema.OK) & rows[column].notna() & (rows["provider"] != CEILING_PROVIDER)]


def draw_series(ax, part, axis: str, ycol: str, providers: list[str], *, errors: bool = False) -> list[float]:
    """One line per `plotting.series` of part: ycol against axis (with the ratio_to_best interval as
    error bars where `errors`); returns the y values drawn."""
    ys: list[float] = []
    for label, provider, timer, g in series(part, axis):
        x, y = g[axis].astype(float), g[ycol].astype(float)
        style = dict(marker="o", label=label, color=provider_color(provider, providers), **timer_style(timer))
        if errors:
            ax.errorbar(x, y, yerr=interval_err(y, g["ratio_to_best_lo"], g["ratio_to_best_hi"]), capsize=3, **style)
        else:
            ax.plot(x, y, **style)
        ys += y.tolist()
    return ys


def floor_figure(rows):
    """Median over floor of every provider, one panel per (pass, sweep) with of_floor values (one
    timer per panel: graph where measured, else the first of the others)."""
    ok = ok_rows(rows, "of_floor")
    ok = ok[ok["sweep"] != ABLATION_SWEEP]
    if ok.empty:
        return None
    panels = [(p, s) for p in sort_passes(ok["pass"]) for s in sort_sweeps(ok.loc[ok["pass"] == p, "sweep"])]
    fig, axs = new_grid(len(panels), "Distance to the floor: median / max(FLOPs / matmul rate, bytes / copy rate)")
    providers = sorted(set(ok["provider"]))
    for ax, (pass_, sweep) in zip(axs, panels):
        part = ok[(ok["pass"] == pass_) & (ok["sweep"] == sweep)]
        timers = decode_timers(part["timer"])
        part = part[part["timer"] == timers[0]]
        axis = swept_axis(part, sweep)
        ys = draw_series(ax, part, axis, "of_floor", providers)
        ax.axhline(1.0, color="black", linewidth=0.8, label="floor")
        if wants_log(ys + [1.0]):
            ax.set_yscale("log")
        set_x(ax, axis, part[axis])
        ax.set_ylabel("median / floor")
        ax.set_title((f"vs {sweep}" if sweep == axis else sweep) + f" ({pass_label(pass_)}"
                     + (f", {timers[0]} timer)" if len(timers) > 1 else ")"), fontsize=8)
        ax.legend(fontsize=6)
    return fig


def decode_figure(rows):
    """GB/s of every decode provider against B, one panel per T (graph timer where measured)."""
    ok = ok_rows(rows_of(rows, DECODE), "gbps")
    if ok.empty:
        return None
    timer = decode_timers(ok["timer"])[0]
    ok = ok[ok["timer"] == timer]
    Ts = sorted(set(ok["T"]))
    fig, axs = new_grid(len(Ts), f"Decode: bytes per second reached ({timer} timer)")
    providers = sorted(set(ok["provider"]))
    for ax, T in zip(axs, Ts):
        part = ok[ok["T"] == T]
        draw_series(ax, part, "B", "gbps", providers)
        copy = (part["gbps"] * part["of_floor"]).dropna()
        if len(copy):
            rate = float(copy.median())
            ax.axhline(rate, color="black", linestyle="--", linewidth=1, label=f"copy rate {rate:.0f} GB/s")
        if part["B"].min() > 0 and part["B"].nunique() > 1:
            ax.set_xscale("log", base=2)
        set_x(ax, "B", part["B"])
        ax.set_ylim(bottom=0)
        ax.set_ylabel("GB/s")
        ax.set_title(f"T={int(T)}")
        ax.legend(fontsize=6)
    return fig


def depth_attention_figure(rows):
    """Time over the fastest attention of each depth method against S, one panel per (pass, heads, T)."""
    ok = ok_rows(rows_of(rows, DATTN), "ratio_to_best")
    ok = ok[ok["provider"].isin(DATTN_METHODS)]
    if ok.empty:
        return None
    keys = ok[["pass", "Hk", "Hq", "T"]].drop_duplicates()
    rank = {p: i for i, p in enumerate(sort_passes(keys["pass"]))}
    keys = keys.assign(_p=keys["pass"].map(rank)).sort_values(["_p", "Hk", "Hq", "T"], kind="stable")
    many_passes = len(rank) > 1
    fig, axs = new_grid(len(keys), "Depth-Attention and MoDA: time over the fastest attention")
    providers = sorted(set(ok["provider"]))
    for ax, (_, k) in zip(axs, keys.iterrows()):
        part = ok[(ok["pass"] == k["pass"]) & (ok["Hk"] == k["Hk"]) & (ok["Hq"] == k["Hq"]) & (ok["T"] == k["T"])]
        ys = draw_series(ax, part, "S", "ratio_to_best", providers, errors=True)
        ax.axhline(1.0, color="black", linewidth=0.8)
        if wants_log(ys):
            ax.set_yscale("log")
        set_x(ax, "S", part["S"])
        best = sorted({b.strip() for b in part["best_provider"] if isinstance(b, str) and b.strip()})
        ax.set_ylabel("time / fastest attention" + (f" ({', '.join(best)})" if best else ""))
        ax.set_title(f"T={int(k['T'])}, Hq={int(k['Hq'])}, Hk={int(k['Hk'])}"
                     + (f" ({pass_label(k['pass'])})" if many_passes else ""), fontsize=8)
        ax.legend(fontsize=6)
    return fig
