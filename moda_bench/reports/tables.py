"""The report's tables as numeric frames, one `Section` per block: efficiency per (pass, sweep)
(FA2 vs MoDA, depth utilisation, extra time, paper A100 columns, other providers as ratios to
FA2), the kernel ablation ladder per (pass, config), and the matmul ceiling of the TFLOP/s
figure. Formatting them is `reports.markdown`'s job, drawing them `reports.figures`'.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from moda_bench import schema
from moda_bench.reports.inputs import Paper, match_columns
from moda_bench.reports.vocab import (ABLATION_SWEEP, ALWAYS_SHOWN, CEILING_PROVIDER, DEFAULT_CEILING_TFLOPS,
                                      ENV_COLUMNS, LADDER, ReportError, fmt_config, pass_label, sort_passes,
                                      sort_sweeps)


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


def pick_provider(present: set[str], chosen: str | None, candidates: tuple[str, ...], role: str) -> str | None:
    if chosen is not None:
        if chosen not in present:
            raise ReportError(f"{role} provider {chosen!r} not in the results (providers: {', '.join(sorted(present))})")
        return chosen
    return next((p for p in candidates if p in present), None)


def config_caption(frame, columns: list[str]) -> str:
    """'B=1, d=64, ...' for the columns constant across frame."""
    parts = []
    for c in columns:
        vals = frame[c].dropna().unique()
        if len(vals) == 1:
            parts.append(f"{c}={fmt_config(c, vals[0])}")
    return ", ".join(parts)


def varying(frame, columns: list[str]) -> list[str]:
    return [c for c in columns if frame[c].nunique(dropna=False) > 1]


def efficiency_sections(rows, paper: Paper, fa2: str | None, moda: str | None) -> list[Section]:
    """Per (pass, sweep) a frame: config, FA2/MoDA ms, depth util., extra %, paper columns, other providers.

    Extra time % = (MoDA - FA2) / FA2 * 100 from the medians; ratio columns are provider ms / FA2 ms.
    """
    import pandas as pd
    eff = rows[(rows["sweep"] != ABLATION_SWEEP) & (rows["provider"] != CEILING_PROVIDER)]
    sections = []
    paper_eff = paper.efficiency
    for pass_ in sort_passes(eff["pass"]):
        for sweep in sort_sweeps(eff.loc[eff["pass"] == pass_, "sweep"]):
            part = eff[(eff["pass"] == pass_) & (eff["sweep"] == sweep)]
            ok = part["status"] == schema.OK
            configs = part[schema.CONFIG_COLUMNS].drop_duplicates()
            axis = [sweep] if sweep in schema.AXES else []
            frame = configs.sort_values(axis + schema.CONFIG_COLUMNS, kind="stable").reset_index(drop=True)
            providers = set(part["provider"])
            others = [p for p in ALWAYS_SHOWN if p not in (fa2, moda)] + \
                sorted(providers - set(ALWAYS_SHOWN) - {fa2, moda})
            for prov in [fa2, moda] + others:
                if prov is None:
                    continue
                sub = part[part["provider"] == prov]
                cols = sub[schema.CONFIG_COLUMNS + ["median_ms", "status", "depth_utilization"] + ENV_COLUMNS].copy()
                cols.loc[~ok[sub.index], "median_ms"] = float("nan")
                cols = cols.rename(columns={"median_ms": f"{prov}:ms", "status": f"{prov}:status",
                                            "depth_utilization": f"{prov}:eta",
                                            **{c: f"{prov}:{c}" for c in ENV_COLUMNS}})
                frame = frame.merge(cols, on=schema.CONFIG_COLUMNS, how="left")
            f_ms = frame[f"{fa2}:ms"] if fa2 else pd.Series(float("nan"), index=frame.index)
            m_ms = frame[f"{moda}:ms"] if moda else pd.Series(float("nan"), index=frame.index)
            frame["fa2_ms"], frame["moda_ms"] = f_ms, m_ms
            frame["eta"] = frame[f"{moda}:eta"] if moda else float("nan")
            frame["extra_pct"] = (m_ms - f_ms) / f_ms * 100.0
            mixed = pd.Series(False, index=frame.index)
            if fa2 and moda:
                for c in ENV_COLUMNS:
                    a, b = frame[f"{fa2}:{c}"], frame[f"{moda}:{c}"]
                    mixed |= a.notna() & b.notna() & (a != b)
            frame["mixed_env"] = mixed
            for prov in others:
                frame[f"{prov}:ratio"] = (frame[f"{prov}:ms"] if f"{prov}:ms" in frame else float("nan")) / f_ms
            frame, has_paper = attach_paper_efficiency(frame, paper_eff, pass_)
            show = [c for c in ["T", "G", "Hq", "Hk", "L"]] + varying(frame, ["B", "d", "C", "dtype"])
            title = f"Sweep over {sweep}" if sweep in schema.AXES else f"Sweep '{sweep}'"
            sections.append(Section(title=title, caption=config_caption(frame, ["B", "d", "C", "dtype"]),
                                    frame=frame, show_config=show, pass_=pass_, sweep=sweep, others=others,
                                    has_paper=has_paper))
    return sections


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
    """Per (pass, config) of the ablation sweep: the ladder with ms, speedup over previous rung, paper."""
    import pandas as pd
    abl = rows[(rows["sweep"] == ABLATION_SWEEP) & (rows["provider"] != CEILING_PROVIDER)]
    sections = []
    for pass_ in sort_passes(abl["pass"]):
        part_p = abl[abl["pass"] == pass_]
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
            caption = ", ".join(f"{c}={fmt_config(c, cfg[c])}" for c in schema.CONFIG_COLUMNS)
            sections.append(Section(title=f"{caption}, {pass_label(pass_)}", caption=caption,
                                    frame=frame, show_config=[], pass_=pass_, sweep=ABLATION_SWEEP))
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
