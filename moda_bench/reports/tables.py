"""The report's tables as numeric frames, one `Section` per block: efficiency per (pass, sweep,
timer, GPU) (FA2 vs MoDA, depth utilisation, extra time, paper A100 columns, other providers as
ratios to FA2; where the CSVs have them, paired ratio intervals, ratios to the fastest attention,
samples, noise and each provider's distance to its floor), the kernel ablation ladder per (pass,
timer, GPU, config), eager beside graph times (`timer_sections`), the GPU state per results
folder (`gpu_states`) and per provider (`own_clocks`), and the matmul ceiling of the TFLOP/s
figure. Formatting them is `reports.markdown`'s job, drawing them `reports.figures`'; the decode
and Depth-Attention tables are `reports.workloads`'.

Which rows go where (`workload`): matmul rows are the ceiling, the `ablation` sweep the ladder,
the decode pass its own tables, a training sweep holding a Depth-Attention provider (or S > 0)
the Depth-Attention tables, every other row the efficiency tables. Each GPU's rows are kept
apart (`of_gpu`); a report of several GPUs names the GPU in every heading (`Section.heading_title`).

Columns the CSVs gained later (intervals, ratio_to_best, samples, noise, floor columns, GPU
state, health, the host columns) are optional: a block or column exists only where some row has
the data, so older files give the tables they always gave. Configuration columns added later (depth_grad, Tq, S) are
named in captions only off their default (`vocab.config_item`).
"""
from __future__ import annotations

import math
import posixpath
from dataclasses import dataclass, field

from moda_bench import schema
from moda_bench.reports.inputs import Paper, match_columns
from moda_bench.reports.vocab import (
    ABLATION_SWEEP,
    ALWAYS_SHOWN,
    CEILING_PROVIDER,
    DATTN_PROVIDERS,
    DEFAULT_CEILING_TFLOPS,
    ENV_COLUMNS,
    GPU_STATE_COLUMNS,
    LADDER,
    LEADING_OTHERS,
    PROVIDER_RANK,
    RATIO_BASELINE,
    SEQUENCE_ONLY,
    TIMER_ORDER,
    ReportError,
    config_item,
    config_text,
    gpu_suffix,
    has_text,
    pass_label,
    sort_gpus,
    sort_passes,
    sort_sweeps,
    sort_timers,
    swept_axis,
)


@dataclass
class Section:
    """One block of a table: title, varying config columns to show, numeric frame."""

    title: str
    caption: str
    frame: "object"
    show_config: list[str]
    pass_: str
    sweep: str = ""
    others: list[str] = field(default_factory=list)   # efficiency: providers shown with ms and ratio to FA2
    has_paper: bool = False                           # efficiency: paper columns present
    timer: str = ""                                   # the rows' timer, named when the results hold any but eager
    has_ci: bool = False                              # efficiency: some MoDA/FA2 ratio has a 95% interval
    best_providers: list[str] = field(default_factory=list)   # efficiency: MoDA rows with ratio_to_best
    has_samples: bool = False                         # efficiency: samples column present
    has_noise: bool = False                           # efficiency: noise column present
    floor_providers: list[str] = field(default_factory=list)  # efficiency: providers with of_floor values
    timers: list[str] = field(default_factory=list)   # decode: the timers with a time column each
    gpu: str = ""                                     # the GPU whose rows these are ('' : unnamed)
    name_gpu: bool = False                            # the report holds several GPUs: headings name it
    cross_runs: list[str] = field(default_factory=list)   # efficiency: runs of a fastest attention used across runs

    @property
    def heading_title(self) -> str:
        """The title, with ' on <GPU>' where the report holds several GPUs."""
        return self.title + (gpu_suffix(self.gpu) if self.name_gpu else "")


# ---------------------------------------------------------------------------------------------
# which rows go where: per GPU, per workload
# ---------------------------------------------------------------------------------------------
TRAIN, DECODE, DATTN, ABLATION, CEILING = "train", "decode", "dattn", "ablation", "ceiling"


def gpu_column(rows):
    """The rows' GPU names, stripped ('' where blank)."""
    return rows["gpu"].map(lambda g: str(g).strip() if has_text(g) else "")


def gpus_of(rows) -> list[str]:
    """The distinct GPU names of the rows, sorted."""
    return sort_gpus(rows["gpu"]) if len(rows) else []


def of_gpu(rows, gpu: str):
    """The rows measured on `gpu`."""
    return rows[gpu_column(rows) == gpu]


def workload(rows):
    """Per row, what it measured: CEILING (matmul rows), ABLATION (the ablation sweep), DECODE (the
    decode pass), DATTN (a training sweep holding a Depth-Attention provider or S > 0) or TRAIN."""
    import pandas as pd
    kind = pd.Series(TRAIN, index=rows.index, dtype=object)
    if rows.empty:
        return kind
    dattn_row = rows["provider"].isin(DATTN_PROVIDERS) | (rows["S"].fillna(0) > 0)
    train_pass = rows["pass"] != schema.DECODE_PASS
    dattn_sweeps = set(rows.loc[dattn_row & train_pass, "sweep"])
    kind[rows["sweep"].isin(dattn_sweeps) & train_pass] = DATTN
    kind[rows["pass"] == schema.DECODE_PASS] = DECODE
    kind[rows["sweep"] == ABLATION_SWEEP] = ABLATION
    kind[rows["provider"] == CEILING_PROVIDER] = CEILING
    return kind


def rows_of(rows, *kinds: str):
    """The rows whose `workload` is one of kinds."""
    return rows[workload(rows).isin(kinds)]


def pick_provider(present: set[str], chosen: str | None, candidates: tuple[str, ...], role: str) -> str | None:
    if chosen is not None:
        if chosen not in present:
            raise ReportError(f"{role} provider {chosen!r} not in the results "
                              f"(providers: {', '.join(sorted(present))})")
        return chosen
    return next((p for p in candidates if p in present), None)


# configuration columns named in captions beside the shown ones (new columns only off their default)
CAPTION_COLUMNS = ["B", "d", "C", "dtype", "depth_grad", "Tq", "S"]
SHAPE_COLUMNS = ["T", "G", "Hq", "Hk", "L"]


def config_caption(frame, columns: list[str]) -> str:
    """'B=1, d=64, ...' for the columns constant across frame (`config_item`: depth_grad, Tq and S
    only off their default, depth_grad=0 as 'depth detached')."""
    parts = []
    for c in columns:
        vals = frame[c].dropna().unique()
        if len(vals) == 1 and config_item(c, vals[0]):
            parts.append(config_item(c, vals[0]))
    return ", ".join(parts)


def varying(frame, columns: list[str]) -> list[str]:
    return [c for c in columns if frame[c].nunique(dropna=False) > 1]


# per-provider columns of an efficiency frame: schema column -> `<provider>:<suffix>`
PROVIDER_FIELDS = {"median_ms": "ms", "status": "status", "depth_utilization": "eta", "ratio_to_fa2": "r",
                   "ratio_to_fa2_lo": "r_lo", "ratio_to_fa2_hi": "r_hi", "ratio_to_best": "best_r",
                   "best_provider": "best", "best_run": "best_run", "best_cross": "best_x", "samples": "samples",
                   "noise_pct": "noise", "of_floor": "of_floor", "floor_ms": "floor_ms"}
MEASURED_FIELDS = ["median_ms", "ratio_to_fa2", "ratio_to_fa2_lo", "ratio_to_fa2_hi", "ratio_to_best",
                   "samples", "noise_pct", "of_floor"]   # blanked on rows that did not succeed


def order_others(providers: set[str], fa2: str | None, moda: str | None) -> list[str]:
    """Efficiency columns besides FA2 and MoDA: measured LEADING_OTHERS (moda-fa4, fa4), then
    ALWAYS_SHOWN (cudnn, flex, even unmeasured), then the rest alphabetically."""
    lead = [p for p in LEADING_OTHERS if p in providers and p not in (fa2, moda)]
    shown = [p for p in ALWAYS_SHOWN if p not in (fa2, moda) and p not in lead]
    return lead + shown + sorted(providers - set(lead) - set(shown) - {fa2, moda})


def paired_ratio(frame, prov: str, fa2: str | None, ms_ratio):
    """(ratio, lo, hi) of prov over FA2: the CSV's paired ratio_to_fa2 and its interval where one
    was measured against this FA2 (RATIO_BASELINE), else the ratio of medians without interval."""
    import pandas as pd
    nan = pd.Series(float("nan"), index=frame.index)
    if fa2 != RATIO_BASELINE or f"{prov}:r_lo" not in frame:
        return ms_ratio, nan, nan
    has = frame[f"{prov}:r"].notna() & frame[f"{prov}:r_lo"].notna() & frame[f"{prov}:r_hi"].notna()
    return (frame[f"{prov}:r"].where(has, ms_ratio), frame[f"{prov}:r_lo"].where(has), frame[f"{prov}:r_hi"].where(has))


def efficiency_sections(rows, paper: Paper, fa2: str | None, moda: str | None) -> list[Section]:
    """Per (pass, sweep, timer) a frame: config, FA2/MoDA ms, depth util., extra %, paper columns,
    other providers; where measured, paired ratios to FA2 with 95% intervals, ratios to the fastest
    sequence-only attention, samples and noise.

    Extra time % = (MoDA - FA2) / FA2 * 100 from the medians; `<p>:ratio` is provider ms / FA2 ms,
    or the paired ratio_to_fa2 where an interval was measured (then `<p>:ratio_lo/_hi` too).
    """
    from moda_bench.reports.fastest import with_fastest
    eff = with_fastest(rows_of(rows, TRAIN))   # one fastest attention per GPU and point, across runs
    sections = []
    paper_eff = paper.efficiency
    name_timer = set(eff["timer"]) != {schema.DEFAULT_TIMER}
    name_gpu = len(gpus_of(rows)) > 1
    eff = eff.assign(_gpu=gpu_column(eff))
    for pass_ in sort_passes(eff["pass"]):
        for sweep in sort_sweeps(eff.loc[eff["pass"] == pass_, "sweep"]):
            part_s = eff[(eff["pass"] == pass_) & (eff["sweep"] == sweep)]
            for timer in sort_timers(part_s["timer"]):
                for gpu in sort_gpus(part_s.loc[part_s["timer"] == timer, "_gpu"]):
                    part = part_s[(part_s["timer"] == timer) & (part_s["_gpu"] == gpu)].drop(columns="_gpu")
                    sec = efficiency_section(part, paper_eff, fa2, moda, pass_, sweep, timer if name_timer else "")
                    sec.gpu, sec.name_gpu = gpu, name_gpu
                    sections.append(sec)
    return sections


def efficiency_section(part, paper_eff, fa2: str | None, moda: str | None, pass_: str, sweep: str,
                       timer: str) -> Section:
    """The efficiency Section of one (pass, sweep, timer)'s rows (see efficiency_sections)."""
    import pandas as pd
    ok = part["status"] == schema.OK
    configs = part[schema.CONFIG_COLUMNS].drop_duplicates()
    axis = [swept_axis(part, sweep)]
    frame = configs.sort_values(axis + schema.CONFIG_COLUMNS, kind="stable").reset_index(drop=True)
    others = order_others(set(part["provider"]), fa2, moda)
    shown = [p for p in [fa2, moda] + others if p is not None]
    for prov in shown:
        sub = part[part["provider"] == prov]
        cols = sub[schema.CONFIG_COLUMNS + list(PROVIDER_FIELDS) + ENV_COLUMNS].copy()
        cols.loc[~ok[sub.index], MEASURED_FIELDS] = float("nan")
        cols = cols.rename(columns={**{c: f"{prov}:{s}" for c, s in PROVIDER_FIELDS.items()},
                                    **{c: f"{prov}:{c}" for c in ENV_COLUMNS}})
        frame = frame.merge(cols, on=schema.CONFIG_COLUMNS, how="left")
    nan = pd.Series(float("nan"), index=frame.index)
    f_ms = frame[f"{fa2}:ms"] if fa2 else nan
    m_ms = frame[f"{moda}:ms"] if moda else nan
    frame["fa2_ms"], frame["moda_ms"] = f_ms, m_ms
    frame["eta"] = frame[f"{moda}:eta"] if moda else float("nan")
    frame["extra_pct"] = (m_ms - f_ms) / f_ms * 100.0
    mixed = pd.Series(False, index=frame.index)
    if fa2 and moda:
        for c in ENV_COLUMNS:
            a, b = frame[f"{fa2}:{c}"], frame[f"{moda}:{c}"]
            mixed |= a.notna() & b.notna() & (a != b)
    frame["mixed_env"] = mixed
    frame["moda_ratio"], frame["moda_ratio_lo"], frame["moda_ratio_hi"] = \
        paired_ratio(frame, moda, fa2, m_ms / f_ms) if moda else (nan, nan, nan)
    frame["moda_best_r"] = frame[f"{moda}:best_r"] if moda else nan
    frame["moda_best"] = frame[f"{moda}:best"] if moda else ""
    frame["moda_best_x"] = frame[f"{moda}:best_x"].fillna(False).astype(bool) if moda else False
    for prov in others:
        ms = frame[f"{prov}:ms"] if f"{prov}:ms" in frame else nan
        frame[f"{prov}:ratio"], frame[f"{prov}:ratio_lo"], frame[f"{prov}:ratio_hi"] = \
            paired_ratio(frame, prov, fa2, ms / f_ms)
    frame["samples"] = frame[[f"{p}:samples" for p in shown]].min(axis=1) if shown else nan
    frame["noise_pct"] = frame[[f"{p}:noise" for p in shown]].max(axis=1) if shown else nan
    frame, has_paper = attach_paper_efficiency(frame, paper_eff, pass_)
    # the swept axis and what varies with it are columns; the rest of the shape goes to the caption
    shape = [c for c in SHAPE_COLUMNS if c in axis or frame[c].nunique(dropna=False) > 1]
    show = shape + varying(frame, CAPTION_COLUMNS)
    title = f"Sweep over {sweep}" if sweep in schema.AXES else f"Sweep '{sweep}'"
    best = [p for p in [moda] + [o for o in others if o not in SEQUENCE_ONLY]
            if p is not None and frame[f"{p}:best_r"].notna().any()]
    cross = {str(r) for p in best for r, x in zip(frame[f"{p}:best_run"], frame[f"{p}:best_x"])
             if x is not None and x == x and bool(x)}
    floor = [p for p in shown if frame[f"{p}:of_floor"].notna().any()]
    caption = config_caption(frame, [c for c in SHAPE_COLUMNS if c not in shape] + CAPTION_COLUMNS)
    return Section(title=title, caption=caption, frame=frame,
                   show_config=show, pass_=pass_, sweep=sweep, others=others, has_paper=has_paper,
                   timer=timer, has_ci=bool(frame["moda_ratio_lo"].notna().any()), best_providers=best,
                   has_samples=bool(frame["samples"].notna().any()),
                   has_noise=bool(frame["noise_pct"].notna().any()), floor_providers=floor,
                   cross_runs=sorted(cross))


def attach_paper_efficiency(frame, paper_eff, pass_: str):
    """frame + paper_* columns matched on the paper's config columns; (frame, whether paper data applies)."""
    names = {"fa2_triton_ms": "paper_fa2_ms", "moda_triton_ms": "paper_moda_ms",
             "depth_utilization": "paper_eta", "extra_time_pct": "paper_extra_pct"}
    if paper_eff is None or pass_ not in set(paper_eff["pass"]):
        for c in names.values():
            frame[c] = float("nan")
        return frame, False
    on = match_columns(paper_eff)
    ref = paper_eff[on + list(names)].drop_duplicates(on).rename(columns=names)
    return frame.assign(**{"pass": pass_}).merge(ref, on=on, how="left").drop(columns="pass"), True


def ablation_sections(rows, paper: Paper) -> list[Section]:
    """Per (pass, config) of the ablation sweep, and per timer where graph rows exist: the ladder
    with ms, speedup over previous rung, paper."""
    import pandas as pd
    abl = rows[(rows["sweep"] == ABLATION_SWEEP) & (rows["provider"] != CEILING_PROVIDER)]
    # one ladder per timer; a rung timed its own way (timer 'custom': the naive rung) joins the
    # ladder of the first timer in TIMER_ORDER present; a provider's first timer kept where it has several
    known = [t for t in sort_timers(abl["timer"]) if t in TIMER_ORDER]
    rank = {t: i for i, t in enumerate(sort_timers(abl["timer"]))}
    family = abl["timer"].where(abl["timer"].isin(TIMER_ORDER), known[0] if known else abl["timer"])
    abl = abl.assign(_family=family, _rank=abl["timer"].map(rank), _gpu=gpu_column(abl))
    abl = abl.sort_values("_rank", kind="stable").drop_duplicates(
        ["_gpu", "provider", "pass", "_family"] + schema.CONFIG_COLUMNS).sort_index()
    sections = []
    name_timer = set(abl["_family"]) - {schema.DEFAULT_TIMER} != set()
    name_gpu = len(gpus_of(rows)) > 1
    for pass_, timer, gpu in [(p, t, g) for p in sort_passes(abl["pass"])
                              for t in sort_timers(abl.loc[abl["pass"] == p, "_family"])
                              for g in sort_gpus(abl.loc[(abl["pass"] == p) & (abl["_family"] == t), "_gpu"])]:
        part_p = abl[(abl["pass"] == pass_) & (abl["_family"] == timer) & (abl["_gpu"] == gpu)]
        for _, cfg in part_p[schema.CONFIG_COLUMNS].drop_duplicates().sort_values(schema.CONFIG_COLUMNS).iterrows():
            mask = (part_p[schema.CONFIG_COLUMNS] == cfg).all(axis=1)
            part = part_p[mask]
            rank = {p: i for i, p in enumerate(LADDER)}
            provs = sorted(set(part["provider"]), key=lambda p: (rank.get(p, len(LADDER)), p))
            frame = pd.DataFrame({"provider": provs})
            by = part.set_index("provider")
            frame["ms"] = [by.at[p, "median_ms"] if by.at[p, "status"] == schema.OK else float("nan") for p in provs]
            frame["status"] = [by.at[p, "status"] for p in provs]
            frame["paper_ms"] = float("nan")
            if paper.ablation is not None:
                on = match_columns(paper.ablation)
                key = dict(cfg)
                key["pass"] = pass_
                pmask = pd.Series(True, index=paper.ablation.index)
                for c in on:
                    pmask &= paper.ablation[c] == key[c]
                pab = paper.ablation[pmask].drop_duplicates("implementation").set_index("implementation")["ms"]
                frame["paper_ms"] = frame["provider"].map(pab).astype(float)
            frame["speedup"] = ladder_speedup(frame["provider"], frame["ms"])
            frame["paper_speedup"] = ladder_speedup(frame["provider"], frame["paper_ms"])
            frame["ours_over_paper"] = frame["ms"] / frame["paper_ms"]
            caption = config_text((c, cfg[c]) for c in schema.CONFIG_COLUMNS)
            title = f"{caption}, {pass_label(pass_)}" + (f", {timer} timer" if name_timer else "")
            sections.append(Section(title=title, caption=caption, frame=frame, show_config=[], pass_=pass_,
                                    sweep=ABLATION_SWEEP, timer=timer if name_timer else "", gpu=gpu,
                                    name_gpu=name_gpu))
    return sections


def ladder_speedup(providers, ms):
    """previous ladder rung's ms / this rung's ms (rungs without a number are skipped; off-ladder: NaN)."""
    out, prev = [], float("nan")
    for p, v in zip(providers, ms):
        if p not in LADDER:
            out.append(float("nan"))
            continue
        out.append(prev / v if not math.isnan(v) else float("nan"))
        if not math.isnan(v):
            prev = v
    return out


def matmul_ceiling(rows, override: float | None) -> tuple[float, str]:
    """(TFLOP/s, where it came from): --ceiling-tflops, else the newest 'matmul' row, else 784."""
    if override is not None:
        return float(override), "--ceiling-tflops"
    import pandas as pd
    mm = rows[(rows["provider"] == CEILING_PROVIDER) & (rows["status"] == schema.OK) & rows["tflops"].notna()]
    if len(mm):
        mm = mm.assign(_ts=pd.to_datetime(mm["timestamp"], utc=True, errors="coerce", format="ISO8601"))
        last = mm.sort_values(["_ts", "tflops", "_file", "_line"], kind="stable", na_position="first").iloc[-1]
        return float(last["tflops"]), f"measured: matmul row of {last['gpu']} at {last['timestamp']}"
    return DEFAULT_CEILING_TFLOPS, "spec section 5 default (H100 bf16 matmul)"


def timer_sections(rows) -> list[Section]:
    """Per pass and GPU, the points and providers measured by both the eager and the graph timer
    (status ok; decode shows both timers in its own tables): eager_ms, graph_ms and host_share =
    1 - graph / eager, the part of the eager time that is host work (launches, Python) rather
    than GPU time. Empty when no point has both."""
    ok = rows_of(rows, TRAIN, DATTN, ABLATION)
    ok = ok[(ok["status"] == schema.OK) & ok["median_ms"].notna()].assign(gpu=lambda f: gpu_column(f))
    key = ["gpu", "sweep", "provider", "pass"] + schema.CONFIG_COLUMNS
    eager = ok[ok["timer"] == "eager"][key + ["median_ms"]].rename(columns={"median_ms": "eager_ms"})
    graph = ok[ok["timer"] == "graph"][key + ["median_ms"]].rename(columns={"median_ms": "graph_ms"})
    both = eager.merge(graph, on=key, how="inner")
    sections = []
    if both.empty:
        return sections
    both["host_share"] = 1.0 - both["graph_ms"] / both["eager_ms"]
    sweep_rank = {s: i for i, s in enumerate(sort_sweeps(both["sweep"]))}
    prov_rank = {p: i for i, p in enumerate(PROVIDER_RANK)}
    both = both.assign(_s=both["sweep"].map(sweep_rank),
                       _p=both["provider"].map(lambda p: (prov_rank.get(p, len(prov_rank)), p)))
    name_gpu = len(gpus_of(rows)) > 1
    for pass_, gpu in [(p, g) for p in sort_passes(both["pass"])
                       for g in sort_gpus(both.loc[both["pass"] == p, "gpu"])]:
        frame = both[(both["pass"] == pass_) & (both["gpu"] == gpu)]
        frame = frame.sort_values(["_s"] + schema.CONFIG_COLUMNS + ["_p"], kind="stable")
        frame = frame.drop(columns=["_s", "_p"]).reset_index(drop=True)
        show = ["T", "G", "Hq", "Hk", "L"] + varying(frame, CAPTION_COLUMNS)
        sections.append(Section(title=pass_label(pass_), caption=config_caption(frame, CAPTION_COLUMNS),
                                frame=frame, show_config=show, pass_=pass_, gpu=gpu, name_gpu=name_gpu))
    return sections


@dataclass
class GpuState:
    """What the GPU was doing while one results folder's rows were timed (GPU state columns)."""

    folder: str
    gpus: list[str]
    rows: int                                   # rows of the folder shown in the report
    sampled: int                                # of them, rows with GPU state sampled
    medians: dict                               # GPU_STATE_COLUMNS -> summary (NaN: not sampled)
    throttle: dict                              # reason -> rows it was seen on (empty: none seen)
    health: dict                                # health text -> rows (empty: no health column values)
    host: dict = field(default_factory=dict)    # schema.HOST_COLUMNS -> median over rows (empty: none measured)
    host_cpus: dict = field(default_factory=dict)   # host_cpus text -> rows (empty: none recorded)


def gpu_states(rows) -> list[GpuState]:
    """Per results folder (the folder of each row's file) whose rows have GPU state or health
    values: the median over rows of sm_clock_mhz, mem_clock_mhz and power_w, the lowest
    sm_clock_min_mhz, the highest temp_c, the throttle reasons seen and the health values; where
    rows have them, the median host canary numbers and the host_cpus values (folders with only
    those are listed too)."""
    out = []
    folders = rows["_file"].map(lambda f: posixpath.dirname(str(f)) or ".")
    for folder in sorted(set(folders)):
        part = rows[folders == folder]
        throttle = part["throttle"].map(lambda t: t.strip() if has_text(t) else "")
        sampled = part[GPU_STATE_COLUMNS].notna().any(axis=1) | (throttle != "")
        health, cpus = text_counts(part["health"]), text_counts(part["host_cpus"])
        host = {c: float(part[c].dropna().median()) for c in schema.HOST_COLUMNS if part[c].notna().any()}
        if not sampled.any() and not health and not host and not cpus:
            continue
        reasons: dict[str, int] = {}
        for text in throttle[sampled]:
            for r in sorted({r.strip() for r in text.split("|") if r.strip()}):
                reasons[r] = reasons.get(r, 0) + 1
        agg = {"sm_clock_mhz": "median", "sm_clock_min_mhz": "min", "mem_clock_mhz": "median",
               "power_w": "median", "temp_c": "max"}
        medians = {c: float(getattr(part[c].dropna(), how)()) if part[c].notna().any() else float("nan")
                   for c, how in agg.items()}
        out.append(GpuState(folder=folder, gpus=sorted(set(part["gpu"].astype(str)) - {""}), rows=len(part),
                            sampled=int(sampled.sum()), medians=medians, throttle=dict(sorted(reasons.items())),
                            health=health, host=host, host_cpus=cpus))
    return out


def text_counts(values) -> dict:
    """A text column's non-empty values (stripped) -> their row counts, in text order."""
    texts = values.map(lambda t: t.strip() if has_text(t) else "")
    counts = texts[texts != ""].value_counts()
    return {t: int(counts[t]) for t in sorted(counts.index)}


def own_clocks(rows) -> list[dict]:
    """Per GPU and provider, over the rows that carry their own GPU state (own_sm_clock_mhz: the
    polls taken while that provider's repetitions ran): rows, the median own SM clock, the median
    of own minus the point's SM clock (< 0: it ran slower clocked than its point's average), the
    median own power. [] when no row has it (files written before these columns existed)."""
    part = rows[rows["own_sm_clock_mhz"].notna()]
    out = []
    for (gpu, provider), g in part.groupby(["gpu", "provider"], sort=True):
        out.append({"gpu": gpu, "provider": provider, "rows": len(g),
                    "own_sm_clock_mhz": float(g["own_sm_clock_mhz"].median()),
                    "delta_mhz": float((g["own_sm_clock_mhz"] - g["sm_clock_mhz"]).median()),
                    "own_power_w": float(g["own_power_w"].median()) if g["own_power_w"].notna().any() else math.nan})
    return out
