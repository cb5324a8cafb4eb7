"""The tables of the workloads beside MoDA training, as numeric frames (`tables.Section`), per GPU:

- decode (`decode_sections`): per (sweep, GPU), one line per point (B, T, Tq, L) and per provider
  the median of every timer (graph first), and from the graph rows (else the first timer's) the
  bytes per second reached (`gbps`), the share of the copy rate 1 / `of_floor` (decode is
  memory-bound, so its floor is the bytes' time at the copy rate) and the paired ratio to the
  fastest sequence-only decode (`ratio_to_best`, with its interval);
- Depth-Attention (`dattn_sections`): per (pass, timer, head configuration (Hq, Hk), T, GPU and
  sweep), one line per number of source layers S and per method (dattn, dattn-composed,
  dattn-torch, moda, moda-fa4) its overhead over the fastest attention of the point
  (`ratio_to_best` with its interval), plus the depth mix kernel alone (dattn-mix): its GB/s and 1 / `of_floor`.

Rows of older files (no floor columns) leave those cells empty. `reports.markdown` writes them,
`reports.workload_figures` draws them.
"""
from __future__ import annotations

from moda_bench import schema
from moda_bench.reports.tables import (
    CAPTION_COLUMNS,
    DATTN,
    DECODE,
    Section,
    config_caption,
    gpu_column,
    gpus_of,
    rows_of,
    varying,
)
from moda_bench.reports.vocab import (
    DATTN_METHODS,
    DECODE_PROVIDERS,
    DECODE_TIMERS,
    MIX_PROVIDER,
    has_text,
    sort_gpus,
    sort_passes,
    sort_providers,
    sort_sweeps,
    sort_timers,
    swept_axis,
)

DECODE_SHOWN = ["B", "T", "Tq", "L"]                       # decode table lines: always these columns
DECODE_CAPTION = ["Hq", "Hk", "d", "dtype", "depth_grad", "S"]
DATTN_GROUP = [c for c in schema.CONFIG_COLUMNS if c not in ("S", "L")]   # one table per value of these
# per provider, from the rows of the metric timer: schema column -> `<provider>:<suffix>`
METRIC_FIELDS = {"gbps": "gbps", "of_floor": "of_floor", "ratio_to_best": "best_r", "ratio_to_best_lo": "best_lo",
                 "ratio_to_best_hi": "best_hi", "median_ms": "ms", "status": "status"}


def decode_timers(timers) -> list[str]:
    """The distinct timers in DECODE_TIMERS order (graph first), others after."""
    known = [t for t in DECODE_TIMERS if t in set(timers)]
    return known + [t for t in sort_timers(timers) if t not in known]


def decode_providers(providers) -> list[str]:
    """The distinct providers in DECODE_PROVIDERS order, others after (report order)."""
    known = [p for p in DECODE_PROVIDERS if p in set(providers)]
    return known + [p for p in sort_providers(providers) if p not in known]


def provider_metrics(frame, part, provider: str, *, on: list[str]):
    """frame + `<provider>:<suffix>` columns (METRIC_FIELDS) from part's rows of provider, merged on
    `on`; numbers blanked where the row did not succeed; `<provider>:share` = 1 / of_floor."""
    sub = part[part["provider"] == provider]
    cols = sub[on + list(METRIC_FIELDS)].copy()
    bad = sub["status"] != schema.OK
    cols.loc[bad, [c for c in METRIC_FIELDS if c != "status"]] = float("nan")
    cols = cols.rename(columns={c: f"{provider}:{s}" for c, s in METRIC_FIELDS.items()})
    frame = frame.merge(cols, on=on, how="left")
    frame[f"{provider}:share"] = 1.0 / frame[f"{provider}:of_floor"]
    return frame


def fastest(frame, part, *, on: list[str]):
    """frame + `fastest` (the point's best_provider) and `fastest_ms` (its median) from part's rows."""
    best = part[part["best_provider"].map(has_text) & (part["status"] == schema.OK)]
    names = best.sort_values("provider", kind="stable").drop_duplicates(on)[on + ["best_provider"]]
    frame = frame.merge(names.rename(columns={"best_provider": "fastest"}), on=on, how="left")
    ms = part[part["status"] == schema.OK][on + ["provider", "median_ms"]].rename(
        columns={"provider": "fastest", "median_ms": "fastest_ms"})
    return frame.merge(ms, on=on + ["fastest"], how="left")


def decode_sections(rows) -> list[Section]:
    """One Section per (decode sweep, GPU): see the module docstring. Empty without decode rows."""
    dec = rows_of(rows, DECODE)
    if dec.empty:
        return []
    dec = dec.assign(_gpu=gpu_column(dec))
    name_gpu = len(gpus_of(rows)) > 1
    sections = []
    for sweep in sort_sweeps(dec["sweep"]):
        for gpu in sort_gpus(dec.loc[dec["sweep"] == sweep, "_gpu"]):
            part = dec[(dec["sweep"] == sweep) & (dec["_gpu"] == gpu)].drop(columns="_gpu")
            sec = decode_section(part, sweep)
            sec.gpu, sec.name_gpu = gpu, name_gpu
            sections.append(sec)
    return sections


def decode_section(part, sweep: str) -> Section:
    """The decode Section of one (sweep, GPU)'s rows."""
    axis = swept_axis(part, sweep)
    frame = part[schema.CONFIG_COLUMNS].drop_duplicates().sort_values([axis] + schema.CONFIG_COLUMNS, kind="stable")
    frame = frame.reset_index(drop=True)
    timers = decode_timers(part["timer"])
    metric = timers[0]
    providers = decode_providers(part["provider"])
    on = list(schema.CONFIG_COLUMNS)
    for p in providers:
        for t in timers:
            sub = part[(part["provider"] == p) & (part["timer"] == t)]
            cols = sub[on + ["median_ms", "status"]].copy()
            cols.loc[sub["status"] != schema.OK, "median_ms"] = float("nan")
            frame = frame.merge(cols.rename(columns={"median_ms": f"{p}:{t}:ms", "status": f"{p}:{t}:status"}),
                                on=on, how="left")
        frame = provider_metrics(frame, part[part["timer"] == metric], p, on=on)
    frame = fastest(frame, part[part["timer"] == metric], on=on)
    shown = DECODE_SHOWN + [c for c in varying(frame, ["G", "Hq", "Hk", "d", "C", "dtype", "depth_grad", "S"])
                            if c not in DECODE_SHOWN]
    title = f"Sweep over {sweep}" if sweep in schema.AXES else f"Sweep '{sweep}'"
    return Section(title=title, caption=config_caption(frame, DECODE_CAPTION), frame=frame, show_config=shown,
                   pass_=schema.DECODE_PASS, sweep=sweep, others=providers, timer=metric, timers=timers,
                   floor_providers=[p for p in providers if frame[f"{p}:of_floor"].notna().any()])


def dattn_sections(rows) -> list[Section]:
    """One Section per (pass, timer, heads, T, other config, GPU) of the Depth-Attention sweeps:
    see the module docstring. Empty without such rows."""
    da = rows_of(rows, DATTN)
    if da.empty:
        return []
    da = da.assign(_gpu=gpu_column(da))
    name_gpu = len(gpus_of(rows)) > 1
    name_timer = set(da["timer"]) != {schema.DEFAULT_TIMER}
    order = ["Hk", "Hq", "T"] + [c for c in DATTN_GROUP if c not in ("Hk", "Hq", "T")]
    sections = []
    for pass_ in sort_passes(da["pass"]):
        part_p = da[da["pass"] == pass_]
        for timer in sort_timers(part_p["timer"]):
            part_t = part_p[part_p["timer"] == timer]
            groups = part_t[DATTN_GROUP].drop_duplicates().sort_values(order, kind="stable")
            for _, cfg in groups.iterrows():
                mask = (part_t[DATTN_GROUP] == cfg).all(axis=1)
                for gpu in sort_gpus(part_t.loc[mask, "_gpu"]):
                    at = mask & (part_t["_gpu"] == gpu)
                    sweeps = sort_sweeps(part_t.loc[at, "sweep"])
                    for sweep in sweeps:  # runs of other sweeps at the same point: tables of their own
                        part = part_t[at & (part_t["sweep"] == sweep)].drop(columns="_gpu")
                        sec = dattn_section(part, pass_, timer if name_timer else "", named=len(sweeps) > 1)
                        sec.gpu, sec.name_gpu = gpu, name_gpu
                        sections.append(sec)
    return sections


def dattn_section(part, pass_: str, timer: str, named: bool = False) -> Section:
    """The Depth-Attention Section of one group's rows (one pass, timer, heads, T, GPU and sweep;
    named: the title names the sweep, where other sweeps measured the same point)."""
    on = list(schema.CONFIG_COLUMNS)
    frame = part[on].drop_duplicates().sort_values(["S", "L"], kind="stable").reset_index(drop=True)
    methods = [m for m in DATTN_METHODS if (part["provider"] == m).any()]
    for p in methods + ([MIX_PROVIDER] if (part["provider"] == MIX_PROVIDER).any() else []):
        frame = provider_metrics(frame, part, p, on=on)
    frame = fastest(frame, part, on=on)
    shown = ["S"] + (["L"] if (frame["L"] != frame["S"]).any() else [])
    first = frame.iloc[0]
    title = "Depth-Attention, " + ", ".join(f"{c}={int(first[c])}" for c in ("T", "Hq", "Hk"))
    title += f" (sweep '{part['sweep'].iloc[0]}')" if named else ""
    # floor_providers: the mix kernel, where it was timed (its GB/s and share of the copy rate shown)
    return Section(title=title, caption=config_caption(frame, [c for c in CAPTION_COLUMNS if c != "S"]),
                   frame=frame, show_config=shown, pass_=pass_, sweep=sorted(set(part["sweep"]))[0],
                   others=methods, timer=timer,
                   floor_providers=[MIX_PROVIDER] if f"{MIX_PROVIDER}:of_floor" in frame else [])
