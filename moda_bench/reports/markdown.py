"""The report's Markdown: GitHub tables from the `reports.tables` sections (efficiency,
ablation) and the provenance block (one line per run, and which rows newer runs superseded).
"""
from __future__ import annotations

from moda_bench import schema
from moda_bench.reports.inputs import Results
from moda_bench.reports.tables import Section
from moda_bench.reports.vocab import (LADDER, MISSING, RUN_COLUMNS, fmt_config, fmt_ms, fmt_num, pass_label,
                                      sort_sweeps)


def md_table(headers: list[str], rows: list[list[str]]) -> str:
    """GitHub markdown table; columns after the first whose cells are all numbers are right-aligned."""
    def numeric(col):
        cells = [r[col] for r in rows if r[col] not in (MISSING, schema.SKIPPED, schema.OOM, schema.ERROR)]
        return bool(cells) and all(c.lstrip("-+").replace(".", "", 1).rstrip("x%*").isdigit() for c in cells)
    align = ["---:" if numeric(i) else "---" for i in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def efficiency_markdown(section: Section, fa2: str | None, moda: str | None) -> str:
    f, others = section.frame, section.others
    headers = list(section.show_config) + ["FA2 ms", "MoDA ms", "depth util.", "extra time %"]
    if section.has_paper:
        headers += ["paper FA2 ms", "paper MoDA ms", "paper depth util.", "paper extra time %"]
    for p in others:
        headers += [f"{p} ms", f"{p}/FA2"]
    body = []
    for _, r in f.iterrows():
        cells = [fmt_config(c, r[c]) for c in section.show_config]
        cells += [fmt_ms(r["fa2_ms"], r.get(f"{fa2}:status", "")), fmt_ms(r["moda_ms"], r.get(f"{moda}:status", "")),
                  fmt_num(r["eta"], ".4f"), fmt_num(r["extra_pct"], ".2f") + ("*" if r["mixed_env"] else "")]
        if section.has_paper:
            cells += [fmt_num(r["paper_fa2_ms"], ".3f"), fmt_num(r["paper_moda_ms"], ".3f"), fmt_num(r["paper_eta"], ".4f"),
                      fmt_num(r["paper_extra_pct"], ".2f")]
        for p in others:
            cells += [fmt_ms(r.get(f"{p}:ms"), r.get(f"{p}:status", "")), fmt_num(r[f"{p}:ratio"], ".2f", "x")]
        body.append(cells)
    caption = f"### {section.title} ({pass_label(section.pass_)}"
    caption += f"; {section.caption})" if section.caption else ")"
    text = caption + "\n\n" + md_table(headers, body)
    if f["mixed_env"].any():
        text += "\n\n\\* FA2 and MoDA rows of this line come from different environments (GPU, versions or commit)."
    return text


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
    return f"### {section.title}\n\n" + md_table(headers, body)


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
        text += (f"\n\nSeveral runs measured the same (sweep, provider, pass, config) key: the newest timestamp is "
                 f"shown and {n_old} older row(s) were superseded:\n\n")
        winners = results.rows[schema.ROW_KEY + ["timestamp"]].rename(columns={"timestamp": "_newer"})
        sup = results.superseded.merge(winners, on=schema.ROW_KEY, how="left")   # NaN keys match NaN keys
        lines = []
        for (fname, ts), g in sup.groupby(["_file", "timestamp"], sort=True):
            newer = ", ".join(sorted(set(g["_newer"].astype(str))))
            lines.append(f"- {fname} @ {ts}: {len(g)} row(s), replaced by the run(s) at {newer}")
        text += "\n".join(lines)
    return text
