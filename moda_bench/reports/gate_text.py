"""How a `moda-bench gate` result reads: the rich table and one-line verdict printed by the
command, and the GitHub Markdown summary (`--summary`). The comparison itself is
`moda_bench.reports.gate`.
"""
from __future__ import annotations

import math

import pandas as pd

from moda_bench import schema
from moda_bench.reports.gate import CATEGORIES, QUIET, GateResult, cell_num, cell_text, is_blank


def config_text(row, columns=("pass", "timer") + tuple(schema.CONFIG_COLUMNS)) -> str:
    """'fwdbwd eager T=4096 G=8 ... bfloat16' over the given key columns (pass, timer, dtype bare)."""
    parts = [cell_text(row[c]) if c in ("pass", "timer", "dtype") else f"{c}={cell_text(row[c]) or '-'}"
             for c in columns]
    return " ".join(p for p in parts if p) or "-"


def _split_config(rows: pd.DataFrame) -> tuple[list[str], str]:
    """(columns that vary between rows, text of the columns constant over all rows)."""
    cols = ["pass", "timer"] + schema.CONFIG_COLUMNS
    varying = [c for c in cols if rows[c].map(cell_text).nunique() > 1]
    constant = [c for c in cols if c not in varying]
    return varying, (config_text(rows.iloc[0], constant) if len(rows) and constant else "")


def _fmt(value, metric: str) -> str:
    v = cell_num(value)
    return "-" if not math.isfinite(v) else f"{v:.3f}" if metric != "time" else f"{v:.4g}"


def value_text(r, which: str, interval: bool = True) -> str:
    """'1.023 [1.011-1.035]': the value of `which` (base/current) with its interval."""
    text = _fmt(r[which], r["metric"])
    lo, hi = cell_num(r[which + "_lo"]), cell_num(r[which + "_hi"])
    if interval and text != "-" and math.isfinite(lo) and math.isfinite(hi):
        text += f" [{_fmt(lo, r['metric'])}-{_fmt(hi, r['metric'])}]"
    return text


def change_text(r, interval: bool = True) -> str:
    """'+2.3%' and, for interval decisions, the change's interval '[+1.1%, +3.5%]'."""
    change, lo, hi = cell_num(r["change"]), cell_num(r["change_lo"]), cell_num(r["change_hi"])
    text = f"{change * 100:+.1f}%" if math.isfinite(change) else "-"
    if interval and math.isfinite(change) and math.isfinite(lo) and math.isfinite(hi):
        text += f" [{lo * 100:+.1f}%, {hi * 100:+.1f}%]"
    return text


def metric_text(r) -> str:
    unit = "ms" if r["metric"] == "time" else r["metric"]
    return f"{unit} ({r['interval']})" if not is_blank(r["interval"]) else unit


def verdict_text(result: GateResult) -> str:
    counts = result.counts
    if result.failed:
        return "FAIL: " + ", ".join(f"{counts[c]} {c}" for c in CATEGORIES if c in result.gating and counts[c])
    notes = [f"{counts[c]} {c}" for c in ("MISSING", "AMBIGUOUS") if counts[c]]
    return "PASS" + (f" ({', '.join(notes)} not gated)" if notes else "")


def _rows_to_show(result: GateResult, all_rows: bool) -> tuple[pd.DataFrame, int]:
    quiet = result.rows["category"].isin(QUIET) & (not all_rows)
    return result.rows[~quiet], int(quiet.sum())


def print_report(result: GateResult, console, all_rows: bool = False) -> None:
    """Rich table of the comparison (configuration columns that vary) plus a one-line verdict.

    Values show their interval (95% CI or p20-p80) when the console is at least 110 columns wide.
    """
    from rich.markup import escape
    from rich.table import Table

    shown, hidden = _rows_to_show(result, all_rows)
    varying, constant = _split_config(result.rows)
    wide = console.width >= 110
    table = Table(title=f"moda-bench gate ({result.metric}, threshold {result.threshold * 100:g}%)",
                  caption=f"all rows: {constant}" if constant else None)
    for name, justify in [("category", "left"), ("provider", "left"), ("config", "left"), ("metric", "left"),
                          ("baseline", "right"), ("current", "right"), ("change", "right"), ("detail", "left")]:
        table.add_column(name, justify=justify, no_wrap=name == "category", overflow="fold")
    for _, r in shown.iterrows():
        table.add_row(f"[{CATEGORIES[r['category']]}]{r['category']}[/]", escape(str(r["provider"])),
                      escape(config_text(r, varying)), metric_text(r), value_text(r, "base", wide),
                      value_text(r, "current", wide), change_text(r, wide), escape(str(r["detail"])))
    if len(shown):
        console.print(table)
    counts = result.counts
    notes = [(hidden, "dim", "SAME/REFERENCE row(s) not shown (--all-rows to list them)"),
             (counts["MISSING"], "yellow", "baseline row(s) without a current measurement: " + (
                 "reported only (--allow-missing)" if result.allow_missing
                 else "the gate fails (--allow-missing accepts)")),
             (counts["AMBIGUOUS"] * (not result.fail_ambiguous), "magenta",
              "AMBIGUOUS row(s): the intervals cannot decide; not a failure (--fail-ambiguous makes it one)")]
    for n, style, text in notes:
        if n:
            console.print(f"[{style}]{n} {text}[/]")
    counts = ", ".join(f"{n} {c}" for c, n in counts.items() if n)
    style = "bold red" if result.failed else "bold green"
    console.print(f"[{style}]{verdict_text(result)}[/] ({counts})")


def markdown_summary(result: GateResult, baseline: str, current: str) -> str:
    """GitHub-flavoured Markdown: verdict, counts, the rows that are not SAME, all rows in <details>."""
    icon = ":x:" if result.failed else ":white_check_mark:"
    lines = [f"## {icon} moda-bench gate: {verdict_text(result)}", "",
             f"- baseline: `{baseline}` ({', '.join(result.baseline_gpus) or 'unknown GPU'})",
             f"- current: `{current}` ({', '.join(result.current_gpus) or 'unknown GPU'})",
             f"- metric: `{result.metric}`, threshold {result.threshold * 100:g}%: SLOW/FAST when the interval of "
             "the change (95% CI of the ratios, p20-p80 for time) lies beyond it, AMBIGUOUS when it cannot decide",
             "- " + " | ".join(f"{c}: {n}" for c, n in result.counts.items()), ""]

    def table(df: pd.DataFrame) -> list[str]:
        out = ["| category | provider | config | metric | baseline | current | change | detail |",
               "|---|---|---|---|---:|---:|---:|---|"]
        for _, r in df.iterrows():
            detail = str(r["detail"]).replace("|", "\\|")
            out.append(f"| {r['category']} | {r['provider']} | {config_text(r)} | {metric_text(r)} | "
                       f"{value_text(r, 'base')} | {value_text(r, 'current')} | {change_text(r)} | {detail} |")
        return out

    changed, _ = _rows_to_show(result, all_rows=False)
    lines += (table(changed) if len(changed) else ["No row changed beyond the threshold."]) + [""]
    lines += ["<details><summary>All rows</summary>", ""] + table(result.rows) + ["", "</details>", ""]
    return "\n".join(lines)
