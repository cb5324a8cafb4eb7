"""The report's Markdown: GitHub tables from the `reports.tables` sections (efficiency with the
distance to the floor, ablation, eager beside graph) and the `reports.workloads` ones (decode,
Depth-Attention), the GPU-state block (per results folder, unhealthy runs flagged) and the
provenance block (one line per run, and which rows newer runs superseded). Headings name the GPU
where the report holds several (`Section.heading_title`).
"""
from __future__ import annotations

import math
import re

from moda_bench import health, schema
from moda_bench.reports.inputs import Results
from moda_bench.reports.tables import GpuState, Section
from moda_bench.reports.vocab import (
    HEALTHY,
    LADDER,
    MISSING,
    MIX_PROVIDER,
    RUN_COLUMNS,
    fmt_best,
    fmt_ci,
    fmt_config,
    fmt_int,
    fmt_ms,
    fmt_num,
    fmt_us,
    has_text,
    pass_label,
    sort_sweeps,
)

# a trailing ' [lo-hi]' interval or ' (name)' of a numeric cell, ignored when deciding alignment
CELL_SUFFIX = re.compile(r" (\[[^\]]*\]|\([^)]*\))$")


def is_number_cell(cell: str) -> bool:
    """'1.5', '-2.00*', '0.75x', '12.3%', also with ' [lo-hi]' / ' (name)' after it."""
    core = cell
    while CELL_SUFFIX.search(core):
        core = CELL_SUFFIX.sub("", core)
    return core.lstrip("-+").replace(".", "", 1).rstrip("x%*").isdigit()


def md_table(headers: list[str], rows: list[list[str]]) -> str:
    """GitHub markdown table; columns after the first whose cells are all numbers are right-aligned.
    A '|' inside a cell is escaped."""
    def numeric(col):
        cells = [r[col] for r in rows if r[col] not in (MISSING, schema.SKIPPED, schema.OOM, schema.ERROR)]
        return bool(cells) and all(is_number_cell(c) for c in cells)
    align = ["---:" if numeric(i) else "---" for i in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(lines)


def section_heading(section: Section) -> str:
    """'### <title> (<pass>[, <timer> timer][; <constant config>])'."""
    text = f"### {section.title} ({pass_label(section.pass_)}"
    text += f", {section.timer} timer" if section.timer else ""
    text += f"; {section.caption})" if section.caption else ")"
    return text + section.heading_title[len(section.title):]


MAX_COLUMNS = 12   # a table wider than this is split (configuration columns repeated in each part)


def best_cell(r, ratio: str, best: str, cross: str) -> str:
    """'0.93 (fa4)', with CROSS_MARK when the fastest attention's time comes from another run."""
    from moda_bench.reports.fastest import CROSS_MARK
    text = fmt_best(r[ratio], r[best])
    x = r.get(cross)
    return text + (CROSS_MARK if text != MISSING and x is not None and x == x and bool(x) else "")


def split_tables(config: list[str], config_cells, groups: list[list[tuple]], rows) -> list[str]:
    """Markdown tables of at most MAX_COLUMNS columns: the config columns, then column groups
    ((header, cell function of a row), kept together) packed in order; empty groups are dropped."""
    room = max(MAX_COLUMNS - len(config), 1)
    parts, cur = [], []
    for g in [g for g in groups if g]:
        if cur and len(cur) + len(g) > room:
            parts.append(cur)
            cur = []
        cur = cur + g
    if cur:
        parts.append(cur)
    return [md_table(config + [h for h, _ in part], [config_cells(r) + [fn(r) for _, fn in part] for r in rows])
            for part in parts]


def efficiency_markdown(section: Section, fa2: str | None, moda: str | None) -> str:
    """One efficiency section as tables split by question, each at most MAX_COLUMNS wide: MoDA
    against FA2 (and the paper's A100 numbers), every depth provider against the fastest attention
    of the GPU at the point (`reports.fastest`), the other providers' times against FA2, and the
    distance to the floor with the measurement's samples and noise. Columns that need data the
    CSVs may lack appear only when the section has it."""
    f, others = section.frame, section.others
    rows = [r for _, r in f.iterrows()]
    floor = section.floor_providers

    def stat(r, p):
        return r.get(f"{p}:status", "")

    against_fa2 = [[("FA2 ms", lambda r: fmt_ms(r["fa2_ms"], stat(r, fa2))),
                    ("MoDA ms", lambda r: fmt_ms(r["moda_ms"], stat(r, moda))),
                    ("depth util.", lambda r: fmt_num(r["eta"], ".4f")),
                    ("overhead %", lambda r: fmt_num(r["extra_pct"], ".2f") + ("*" if r["mixed_env"] else "")),
                    ("extra time %", lambda r: fmt_num(schema.extra_time_paper(r["moda_ms"], r["fa2_ms"]), ".2f"))],
                   [("MoDA/FA2 [95% CI]", lambda r: fmt_ci(r["moda_ratio"], r["moda_ratio_lo"], r["moda_ratio_hi"]))]
                   if section.has_ci else []]
    if section.has_paper:
        against_fa2.append([("paper FA2 ms", lambda r: fmt_num(r["paper_fa2_ms"], ".3f")),
                            ("paper MoDA ms", lambda r: fmt_num(r["paper_moda_ms"], ".3f")),
                            ("paper depth util.", lambda r: fmt_num(r["paper_eta"], ".4f")),
                            ("paper extra time %", lambda r: fmt_num(r["paper_extra_pct"], ".2f"))])
    fastest = [[("MoDA/fastest", lambda r: best_cell(r, "moda_best_r", "moda_best", "moda_best_x"))]
               if moda in section.best_providers else []]
    fastest += [[(f"{p}/fastest", lambda r, p=p: best_cell(r, f"{p}:best_r", f"{p}:best", f"{p}:best_x"))]
                for p in others if p in section.best_providers]
    times = [[(f"{p} ms", lambda r, p=p: fmt_ms(r.get(f"{p}:ms"), stat(r, p))),
              (f"{p}/FA2", lambda r, p=p: ratio_cell(r, p))] for p in others]
    quality = [[("MoDA floor ms", lambda r: fmt_num(r[f"{moda}:floor_ms"], ".3f")),
                ("MoDA x floor", lambda r: fmt_num(r[f"{moda}:of_floor"], ".2f", "x"))] if moda in floor else [],
               [("FA2 x floor", lambda r: fmt_num(r[f"{fa2}:of_floor"], ".2f", "x"))] if fa2 in floor else []]
    quality += [[(f"{p} x floor", lambda r, p=p: fmt_num(r[f"{p}:of_floor"], ".2f", "x"))]
                for p in others if p in floor]
    quality += [[("samples", lambda r: fmt_int(r["samples"]))] if section.has_samples else [],
                [("noise %", lambda r: fmt_num(r["noise_pct"], ".1f"))] if section.has_noise else []]
    cfg = list(section.show_config)

    def cfg_cells(r):
        return [fmt_config(c, r[c]) for c in cfg]

    text = section_heading(section)
    for title, groups in (("MoDA against FA2", against_fa2), ("Against the fastest attention", fastest),
                          ("Other providers against FA2", times), ("Floor and measurement", quality)):
        tables = split_tables(cfg, cfg_cells, groups, rows)
        if tables:
            text += f"\n\n**{title}**\n\n" + "\n\n".join(tables)
    if f["mixed_env"].any():
        text += "\n\n\\* FA2 and MoDA rows of this line come from different environments (GPU, versions or commit)."
    if section.cross_runs:
        from moda_bench.reports.fastest import CROSS_MARK
        text += (f"\n\n{CROSS_MARK} the fastest attention of that line was timed in another run ("
                 + ", ".join(f"`{r}`" for r in section.cross_runs) + "): the ratio is not paired.")
    return text


def ratio_cell(r, p: str) -> str:
    """`<p>/FA2`: '0.75x' (ratio of medians), or '0.652x [0.648-0.656]' (paired, with its interval)."""
    lo, hi = r.get(f"{p}:ratio_lo"), r.get(f"{p}:ratio_hi")
    if fmt_num(lo, ".3f") != MISSING and fmt_num(hi, ".3f") != MISSING:
        return fmt_ci(r[f"{p}:ratio"], lo, hi, ".3f", "x")
    return fmt_num(r[f"{p}:ratio"], ".2f", "x")


def timer_markdown(section: Section) -> str:
    """Eager beside graph times of the points measured by both timers, with the host share."""
    headers = ["sweep"] + list(section.show_config) + ["provider", "eager ms", "graph ms", "host share"]
    body = [[str(r["sweep"])] + [fmt_config(c, r[c]) for c in section.show_config]
            + [str(r["provider"]), fmt_ms(r["eager_ms"]), fmt_ms(r["graph_ms"]),
               fmt_num(100 * r["host_share"], ".1f", "%")]
            for _, r in section.frame.iterrows()]
    heading = f"### {section.title}" + (f" ({section.caption})" if section.caption else "")
    return heading + section.heading_title[len(section.title):] + "\n\n" + md_table(headers, body)


def unhealthy_rows(states: list[GpuState]) -> int:
    """Rows whose health value is set and not 'healthy'."""
    return sum(n for s in states for h, n in s.health.items() if h != HEALTHY)


def gpu_state_markdown(states: list[GpuState]) -> str:
    """The GPU-state block: one table line per results folder, then a loud line per folder whose
    rows carry a health value other than healthy or a hard throttle reason."""
    cols = [("SM clock MHz (median)", "sm_clock_mhz", ".0f"), ("SM clock MHz (min)", "sm_clock_min_mhz", ".0f"),
            ("memory clock MHz", "mem_clock_mhz", ".0f"), ("power W (median)", "power_w", ".0f"),
            ("temp C (max)", "temp_c", ".0f")]
    cols = [c for c in cols if any(fmt_num(s.medians[c[1]], c[2]) != MISSING for s in states)]
    has_throttle = any(s.sampled for s in states)
    has_health = any(s.health for s in states)
    headers = ["results folder", "GPU", "rows"] + [c[0] for c in cols] + (["throttle reasons seen (rows)"] if
                                                                         has_throttle else [])
    headers += ["health (rows)"] if has_health else []
    has_host = any(s.host for s in states)
    has_cpus = any(s.host_cpus for s in states)
    headers += ["host us: launch / op / autograd (median)"] if has_host else []
    headers += ["host CPUs (rows)"] if has_cpus else []
    body, warnings = [], []
    for s in states:
        cells = ([s.folder, ", ".join(s.gpus) or MISSING, str(s.rows)]
                 + [fmt_num(s.medians[c], spec) for _, c, spec in cols])
        if has_throttle:
            seen = ", ".join(f"{r} ({n})" for r, n in s.throttle.items())
            cells.append((seen or "none") if s.sampled else MISSING)
        if has_health:
            cells.append(", ".join((f"{h} ({n})" if h == HEALTHY else f"**{h} ({n})**") for h, n in s.health.items())
                         or MISSING)
        if has_host:
            cells.append(" / ".join(fmt_num(s.host.get(c, math.nan), ".1f") for c in schema.HOST_COLUMNS)
                         if s.host else MISSING)
        if has_cpus:
            cells.append(", ".join(f"{c} ({n})" for c, n in s.host_cpus.items()) or MISSING)
        body.append(cells)
        for h, n in s.health.items():
            if h != HEALTHY:
                warnings.append(f"**WARNING: `{s.folder}`: {n} of {s.rows} row(s) were measured while the GPU "
                                f"health check said `{h}`; their times are not comparable with a healthy run.**")
        hard = {r: n for r, n in s.throttle.items() if r in health.HARD_THROTTLE}
        if hard:
            warnings.append(f"**WARNING: `{s.folder}`: hard throttling seen ("
                            + ", ".join(f"{r} on {n} row(s)" for r, n in hard.items())
                            + "); the clocks were cut while these rows were timed.**")
    text = ("## GPU state\n\nSampled (NVML) while each row was timed, per results folder: the median over rows of "
            "each row's median SM clock, memory clock and mean power, the lowest SM clock and highest temperature "
            "sampled, the clock-event (throttle) reasons seen with the number of rows, and the run's GPU health "
            "check (`health` column)"
            + ("; the host canary of the processes that timed them (median host microseconds of a bare Triton "
               "launch, a tiny torch op and an autograd fwd+bwd: eager rows at short T time the host) and the "
               "CPUs they ran on" if has_host or has_cpus else "")
            + ".\n\n" + md_table(headers, body))
    if warnings:
        text += "\n\n" + "\n\n".join(warnings)
    return text


def own_clock_markdown(table: list[dict]) -> str:
    """The 'Clocks per provider' block of `tables.own_clocks` ('' without rows)."""
    if not table:
        return ""
    body = [[t["gpu"] or MISSING, t["provider"], str(t["rows"]), fmt_num(t["own_sm_clock_mhz"], ".0f"),
             fmt_num(t["delta_mhz"], "+.0f"), fmt_num(t["own_power_w"], ".0f")] for t in table]
    return ("### Clocks per provider\n\nSampled while each provider's own repetitions ran (`own_sm_clock_mhz`, "
            "`own_power_w`), against the median over the whole point (`sm_clock_mhz`): a provider whose "
            "kernels draw more power than its peers' (two kernels sharing the GPU under the power cap) runs "
            "at lower clocks and shows a negative difference. Medians over each GPU's rows of the provider.\n\n"
            + md_table(["GPU", "provider", "rows", "own SM clock MHz", "own - point MHz", "own power W"], body))


def ablation_markdown(section: Section) -> str:
    f = section.frame
    headers = ["rung", "provider", "ms", "speedup vs previous", "paper ms (A100)", "paper speedup vs previous",
               "ours / paper ms"]
    body = []
    for i, r in f.iterrows():
        rung = str(LADDER.index(r["provider"]) + 1) if r["provider"] in LADDER else MISSING
        body.append([rung, r["provider"], fmt_ms(r["ms"], r["status"]), fmt_num(r["speedup"], ".2f", "x"),
                     fmt_num(r["paper_ms"], ".3f"), fmt_num(r["paper_speedup"], ".2f", "x"),
                     fmt_num(r["ours_over_paper"], ".3f")])
    return f"### {section.heading_title}\n\n" + md_table(headers, body)


def failed_or(r, provider: str, text: str) -> str:
    """text, or the row's status where `provider`'s row of this line did not succeed (oom, error...)."""
    status = r.get(f"{provider}:status")
    return status if has_text(status) and status != schema.OK and text == MISSING else text


def table_from(frame, columns: list[tuple]) -> tuple[list[str], list[list[str]]]:
    """(headers, body) of a table whose columns are (header, cell function of a frame line)."""
    return [h for h, _ in columns], [[fn(r) for _, fn in columns] for _, r in frame.iterrows()]


def decode_markdown(section: Section) -> str:
    """One decode table: per line (B, T, Tq, L) and provider the median µs of every timer, then
    from the metric timer's rows GB/s, the share of the copy rate (1 / of_floor) and the ratio to
    the fastest sequence-only decode with its interval; columns without data are left out."""
    f = section.frame

    def has(col):
        return col in f and bool(f[col].notna().any())

    cols = [(c, lambda r, c=c: fmt_config(c, r[c])) for c in section.show_config]
    cols += [("fastest", lambda r: r["fastest"] if has_text(r["fastest"]) else MISSING)] if has("fastest") else []
    for p in section.others:
        cols += [(f"{p} {t} µs", lambda r, p=p, t=t: fmt_us(r[f"{p}:{t}:ms"], r[f"{p}:{t}:status"]))
                 for t in section.timers]
        cols += [(f"{p} GB/s", lambda r, p=p: fmt_num(r[f"{p}:gbps"], ".0f"))] if has(f"{p}:gbps") else []
        cols += [(f"{p} % of copy", lambda r, p=p: fmt_num(100 * r[f"{p}:share"], ".1f", "%"))] \
            if has(f"{p}:share") else []
        cols += [(f"{p}/fastest", lambda r, p=p: fmt_ci(r[f"{p}:best_r"], r[f"{p}:best_lo"], r[f"{p}:best_hi"]))] \
            if has(f"{p}:best_r") else []
    metric = "" if section.timer == "graph" else f", metrics from the {section.timer} timer"
    heading = f"### {section.title} ({pass_label(section.pass_)}{metric}" + (
        f"; {section.caption})" if section.caption else ")")
    return heading + section.heading_title[len(section.title):] + "\n\n" + md_table(*table_from(f, cols))


def dattn_markdown(section: Section) -> str:
    """One Depth-Attention table: per S the fastest attention (name, ms), each method's time over
    it with its interval, and the mix kernel alone (ms, GB/s, share of the copy rate)."""
    f = section.frame

    def has(col):
        return col in f and bool(f[col].notna().any())

    mix = MIX_PROVIDER
    cols = [(c, lambda r, c=c: fmt_config(c, r[c])) for c in section.show_config]
    cols += [("fastest", lambda r: r["fastest"] if has_text(r["fastest"]) else MISSING),
             ("fastest ms", lambda r: fmt_ms(r["fastest_ms"]))]
    cols += [(f"{m}/fastest", lambda r, m=m: failed_or(r, m, fmt_ci(r[f"{m}:best_r"], r[f"{m}:best_lo"],
                                                                      r[f"{m}:best_hi"])))
             for m in section.others]
    if mix in section.floor_providers:
        cols += [(f"{mix} ms", lambda r: fmt_ms(r[f"{mix}:ms"], r[f"{mix}:status"]))]
        cols += [(f"{mix} GB/s", lambda r: fmt_num(r[f"{mix}:gbps"], ".0f"))] if has(f"{mix}:gbps") else []
        cols += [(f"{mix} % of copy", lambda r: fmt_num(100 * r[f"{mix}:share"], ".1f", "%"))] \
            if has(f"{mix}:share") else []
    return section_heading(section) + "\n\n" + md_table(*table_from(f, cols))


def repeat_markdown(rows) -> str:
    """One line on the `repeat_err` column (the forward run twice on the same inputs): how many
    shown rows measured it and, loudly, the ones whose two outputs differed; '' when no row has it."""
    if "repeat_err" not in rows.columns:
        return ""
    rep = rows["repeat_err"].astype(float)
    measured = int(rep.notna().sum())
    if not measured:
        return ""
    bad = rows[rep > 0]
    text = (f"Repeat check: {measured} of {len(rows)} row(s) ran their forward twice more on the same inputs "
            f"(`repeat_err`, CUDA rows written since the column exists); ")
    if bad.empty:
        return text + "every one gave bitwise equal outputs."
    lines = [f"- `{r['provider']}` {r['sweep']} sweep, T={r['T']}, G={r['G']}, L={r['L']}, {r['pass']}: "
             f"{r['repeat_err']:.2e} ({r['_file']})" for _, r in bad.iterrows()]
    return (text + f"**WARNING: {len(bad)} of them gave two different outputs (a race or uninitialised read in "
            "that provider; its accuracy check reads only a prefix):**\n\n" + "\n".join(lines))


def provenance_markdown(results: Results) -> str:
    """One line per run (gpu, versions, commit, timestamp) and the superseded rows, if any."""
    import pandas as pd
    kept = results.rows.assign(_kept=1)
    old = results.superseded.assign(_kept=0)
    both = pd.concat([kept, old], ignore_index=True)
    for c in RUN_COLUMNS:
        both[c] = both[c].astype(str)
    headers = ["timestamp", "GPU", "torch", "triton", "commit", "sweeps", "rows used", "rows superseded", "files"]
    body = []
    for key, g in both.groupby(RUN_COLUMNS, sort=True):
        run = dict(zip(RUN_COLUMNS, key))
        body.append([run["timestamp"] or MISSING, run["gpu"] or MISSING, run["torch_version"] or MISSING,
                     run["triton_version"] or MISSING, run["git_commit"] or MISSING,
                     ", ".join(sort_sweeps(g["sweep"])), str(int(g["_kept"].sum())),
                     str(int((1 - g["_kept"]).sum())), ", ".join(sorted(set(g["_file"])))])
    body.sort(key=lambda r: (r[0], r[1:]))
    text = "## Provenance\n\n" + md_table(headers, body)
    n_old = len(results.superseded)
    if n_old:
        text += ("\n\nSeveral runs measured the same (sweep, GPU, provider, pass, timer, config) key: the newest "
                 f"timestamp is shown and {n_old} older row(s) were superseded:\n\n")
        winners = results.rows[schema.ROW_KEY + ["timestamp"]].rename(columns={"timestamp": "_newer"})
        sup = results.superseded.merge(winners, on=schema.ROW_KEY, how="left")   # NaN keys match NaN keys
        lines = []
        for (fname, ts), g in sup.groupby(["_file", "timestamp"], sort=True):
            newer = ", ".join(sorted(set(g["_newer"].astype(str))))
            lines.append(f"- {fname} @ {ts}: {len(g)} row(s), replaced by the run(s) at {newer}")
        text += "\n".join(lines)
    return text
