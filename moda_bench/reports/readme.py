"""README's headline tables: one per GPU, written by `moda-bench report` between the markers
`<!-- moda-bench:headline:<gpu> -->` and `<!-- /moda-bench:headline:<gpu> -->` (the text around
them is left alone), from the GPU's canonical paper run: `<results>/<gpu>/paper-efficiency/` (every
route and peer in one run), else the older `<results>/<gpu>/paper/`.

A table has one line per paper row (the T, G and L sweeps, fwd+bwd, the default timer): FA2's and
FA4's median ms; the MoDA column: the entry point `moda` over FA4 with the route its dispatcher
took, where the run has both (else `moda` or `moda-triton` over FA2); `moda-triton / FA2-Triton`,
the paper's like-for-like quantity, where the run has both; and, for every other provider of the
run, its time over FA4 (the paired ratio to the fastest attention where FA4 was that, else the
ratio of the medians); with no FA4 rows every ratio is to FA2. Above the table: the GPU, the
run's commit, folder and command (its run.json).
"""
from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Callable, Optional

from moda_bench import schema
from moda_bench.reports.vocab import PAPER_AXES, ReportError, sort_providers

HEADLINE_RUNS = ("paper-efficiency", "paper")   # the first that exists is the headline run
BEGIN, END = "<!-- moda-bench:headline:{name} -->", "<!-- /moda-bench:headline:{name} -->"
MARKER = re.compile(r"<!-- moda-bench:headline:([A-Za-z0-9_.-]+) -->")
FA2, FA4, FA2_TRITON = "fa2", "fa4", "fa2-triton"
MODAS = ("moda", "moda-triton")   # the MoDA column: the entry point, else the Triton kernel's (older) rows
LABEL = {"fa2": "FA2", "fa4": "FA4", "cudnn": "cuDNN", "fa2-triton": "FA2-Triton"}


def marker_names(text: str) -> list[str]:
    """The names of the headline markers in text, in order of appearance."""
    return list(dict.fromkeys(MARKER.findall(text)))


def replace_between(text: str, name: str, body: str) -> str:
    """text with what lies between marker `name`'s begin and end lines replaced by body (its own
    lines); ReportError when the begin marker is missing, or its end marker missing or before it."""
    begin, end = BEGIN.format(name=name), END.format(name=name)
    i = text.find(begin)
    if i < 0:
        raise ReportError(f"no {begin} marker")
    j = text.find(end, i + len(begin))
    if j < 0:
        raise ReportError(f"{begin} has no {end} after it")
    return text[:i + len(begin)] + "\n" + body.strip("\n") + "\n" + text[j:]


def _ratio(value, lo=math.nan, hi=math.nan) -> str:
    if value is None or math.isnan(value):
        return "-"
    if math.isnan(lo) or math.isnan(hi) or lo == hi:
        return f"{value:.3f}"
    return f"{value:.3f} [{lo:.3f}-{hi:.3f}]"


def _paired(row, baseline: Optional[object], base_name: str) -> tuple[float, float, float]:
    """(ratio, lo, hi) of an ok row to base_name at a point: paired where the CSV holds it, else the
    medians' ratio (no interval); NaNs when the baseline has no time."""
    nan = (math.nan, math.nan, math.nan)
    if base_name == FA2 and not math.isnan(row["ratio_to_fa2"]):
        return row["ratio_to_fa2"], row["ratio_to_fa2_lo"], row["ratio_to_fa2_hi"]
    if str(row["best_provider"]).strip() == base_name and not math.isnan(row["ratio_to_best"]):
        return row["ratio_to_best"], row["ratio_to_best_lo"], row["ratio_to_best_hi"]
    if baseline is None or str(baseline["status"]).strip() != "ok":
        return nan
    return row["median_ms"] / baseline["median_ms"], math.nan, math.nan


def _cell(row, baseline: Optional[object], base_name: str, mark_below_one: bool = False) -> str:
    """One provider's ratio to base_name at a point (see _paired), its status when not ok; with
    mark_below_one, " †" after a ratio under 1."""
    if row is None:
        return "-"
    if str(row["status"]).strip() != "ok":
        return str(row["status"]).strip() or "-"
    value, lo, hi = _paired(row, baseline, base_name)
    return _ratio(value, lo, hi) + (" †" if mark_below_one and value < 1 else "")


def _route(row) -> str:
    """The implementation the dispatcher ran ("auto -> fused (...)" -> "fused"), or "-"."""
    if row is None or str(row["status"]).strip() != "ok":
        return "-"
    found = re.search(r"->\s*([A-Za-z0-9_-]+)", str(row.get("impl_detail", "")))
    return found.group(1) if found else "-"


def _medians(row, base) -> str:
    ok = row is not None and base is not None and all(str(r["status"]).strip() == "ok" for r in (row, base))
    return _ratio(row["median_ms"] / base["median_ms"]) if ok else "-"


def _ms(row) -> str:
    return "-" if row is None or str(row["status"]).strip() != "ok" else f"{row['median_ms']:.3f}"


def headline_table(rows) -> str:
    """The markdown table of one GPU's paper rows (see the module docstring); ReportError when none."""
    part = rows[rows["sweep"].isin(PAPER_AXES) & (rows["pass"] == "fwdbwd")]
    timers = set(part["timer"])
    part = part[part["timer"] == (schema.DEFAULT_TIMER if schema.DEFAULT_TIMER in timers or not timers
                                  else sorted(timers)[0])]
    if part.empty:
        raise ReportError("no fwd+bwd rows of the T, G or L sweeps")
    providers = set(part["provider"])
    base = FA4 if FA4 in providers else FA2
    moda = next((m for m in MODAS if m in providers), None)
    routed = moda == "moda" and FA4 in providers           # the dispatcher against the fastest attention
    like = "moda-triton" in providers and FA2_TRITON in providers   # the paper's like-for-like pair
    shown = {FA2, FA4, moda} | ({"moda-triton", FA2_TRITON} if like else set())
    others = [p for p in sort_providers(providers) if p not in shown]
    head = ["sweep", "T", "G", "L", "FA2 ms"] + (["FA4 ms"] if FA4 in providers else []) \
        + ([f"{moda} / FA4 [95% CI]", "route"] if routed else [f"{moda} / FA2 [95% CI]"] if moda else []) \
        + (["moda-triton / FA2-Triton"] if like else []) \
        + [f"{LABEL.get(p, p)} / {LABEL[base]} [95% CI]" for p in others]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    marked = False
    for sweep in [a for a in PAPER_AXES if a in set(part["sweep"])]:
        points = part[part["sweep"] == sweep]
        for key, point in points.groupby(["T", "G", "L"], sort=True):
            by = {r["provider"]: r for _, r in point.iterrows()}
            cells = [sweep] + [str(int(v)) for v in key] + [_ms(by.get(FA2))]
            if FA4 in providers:
                cells.append(_ms(by.get(FA4)))
            if routed:
                cell = _cell(by.get(moda), by.get(FA4), FA4, mark_below_one=True)
                cells += [cell, _route(by.get(moda))]
                marked = marked or cell.endswith(" †")
            elif moda:
                cells.append(_cell(by.get(moda), by.get(FA2), FA2))
            if like:
                cells.append(_medians(by.get("moda-triton"), by.get(FA2_TRITON)))
            cells += [_cell(by.get(p), by.get(base), base) for p in others]
            lines.append("| " + " | ".join(cells) + " |")
    if marked:
        lines.append(f"\n† `{moda}` measured under FA4, which does strictly less work (the same sequence attention "
                     "without the depth part): not a gain; read it as about 1.")
    return "\n".join(lines)


def headline_markdown(folder: Path, link: str, warn: Optional[Callable[[str], None]] = None) -> str:
    """The block written between one GPU's markers: where the rows come from, then the table."""
    from moda_bench.reports.index import commands_of, read_run_json
    from moda_bench.reports.inputs import load_results
    rows = load_results([folder], warn=warn or (lambda message: None)).rows
    meta = read_run_json(folder)
    gpus = sorted({str(g) for g in rows["gpu"] if str(g).strip()})
    commit = str(meta.get("commit") or ", ".join(sorted({str(c)[:7] for c in rows["git_commit"]})))
    commit = commit[:7] if re.fullmatch(r"[0-9a-f]{8,40}", commit) else commit
    command = next(iter(commands_of(meta)), "")
    intro = (f"{', '.join(gpus) or 'unnamed GPU'} (commit `{commit}`, "
             f"[`{link}/`]({link})): `{command}`. bf16, fwd+bwd; ratios paired per round with their 95% "
             "interval where measured.")
    return intro + "\n\n" + headline_table(rows)


def headline_folder(results_root: Path, name: str) -> Path:
    """GPU name's headline run: the first of HEADLINE_RUNS under `<results_root>/<name>/` that exists
    (the last, missing, when none does)."""
    folders = [Path(results_root) / name / run for run in HEADLINE_RUNS]
    return next((f for f in folders if f.is_dir()), folders[-1])


def headline_text(readme: Path, results_root: Path, warn: Callable[[str], None]) -> tuple[str, list[str]]:
    """(readme's text with every headline block whose run folder (`headline_folder`) exists
    rewritten, the names rewritten); a marker without its run folder is left as it is, with a warning."""
    readme = Path(readme)
    text = readme.read_text(encoding="utf-8")
    done = []
    for name in marker_names(text):
        folder = headline_folder(results_root, name)
        if not folder.is_dir():
            warn(f"{readme}: headline marker '{name}' left as it is: no run folder {folder}")
            continue
        link = Path(os.path.relpath(folder.resolve(), readme.resolve().parent)).as_posix()
        text = replace_between(text, name, headline_markdown(folder, link, warn))
        done.append(name)
    return text, done


def update_readme(readme: Path, results_root: Path, warn: Callable[[str], None]) -> list[str]:
    """Rewrite readme's headline blocks (`headline_text`) where they changed; returns the names written."""
    text, done = headline_text(readme, results_root, warn)
    if done and text != Path(readme).read_text(encoding="utf-8"):
        Path(readme).write_text(text, encoding="utf-8", newline="\n")
    return done


def check_readme(readme: Path, results_root: Path, warn: Callable[[str], None]) -> list[str]:
    """One line per headline block of readme that is not what `moda-bench report` writes now."""
    text, done = headline_text(readme, results_root, warn)
    old = Path(readme).read_text(encoding="utf-8")
    return [f"{Path(readme).as_posix()}: headline table '{name}' is not what `moda-bench report` writes from "
            f"{headline_folder(results_root, name).as_posix()}" for name in done
            if _block(old, name) != _block(text, name)]


def _block(text: str, name: str) -> str:
    begin, end = BEGIN.format(name=name), END.format(name=name)
    i = text.find(begin)
    return text[i:text.find(end, i)]
