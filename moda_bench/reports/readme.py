"""README's headline tables: one per GPU, written by `moda-bench report` between the markers
`<!-- moda-bench:headline:<gpu> -->` and `<!-- /moda-bench:headline:<gpu> -->` (the text around
them is left alone), from the GPU's canonical paper run `<results>/<gpu>/paper/`.

A table has one line per paper row (the T, G and L sweeps, fwd+bwd, the default timer): FA2's and
FA4's median ms, `moda / FA2` (the paired ratio with its 95% interval) and, for every other
provider of the run, its time over FA4 (the paired ratio to the fastest attention where FA4 was
that, else the ratio of the medians); with no FA4 rows every ratio is to FA2. Above the table:
the GPU, the run's commit, date, folder and command (its run.json).
"""
from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Callable, Optional

from moda_bench import schema
from moda_bench.reports.vocab import PAPER_AXES, ReportError, sort_providers

HEADLINE_RUN = "paper"
BEGIN, END = "<!-- moda-bench:headline:{name} -->", "<!-- /moda-bench:headline:{name} -->"
MARKER = re.compile(r"<!-- moda-bench:headline:([A-Za-z0-9_.-]+) -->")
FA2, FA4 = "fa2", "fa4"
MODAS = ("moda", "moda-triton")   # the MoDA column: the entry point, else the Triton kernel's (older) rows
LABEL = {"fa2": "FA2", "fa4": "FA4", "cudnn": "cuDNN"}


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


def _cell(row, baseline: Optional[object], base_name: str) -> str:
    """One provider's ratio to base_name at a point: paired where the CSV holds it, else medians."""
    if row is None:
        return "-"
    if str(row["status"]).strip() != "ok":
        return str(row["status"]).strip() or "-"
    if base_name == FA2 and not math.isnan(row["ratio_to_fa2"]):
        return _ratio(row["ratio_to_fa2"], row["ratio_to_fa2_lo"], row["ratio_to_fa2_hi"])
    if str(row["best_provider"]).strip() == base_name and not math.isnan(row["ratio_to_best"]):
        return _ratio(row["ratio_to_best"], row["ratio_to_best_lo"], row["ratio_to_best_hi"])
    if baseline is None or str(baseline["status"]).strip() != "ok":
        return "-"
    return _ratio(row["median_ms"] / baseline["median_ms"])


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
    others = [p for p in sort_providers(providers) if p not in (FA2, FA4, moda)]
    head = ["sweep", "T", "G", "L", "FA2 ms"] + (["FA4 ms"] if FA4 in providers else []) \
        + ([f"{moda} / FA2 [95% CI]"] if moda in providers else []) \
        + [f"{LABEL.get(p, p)} / {LABEL[base]} [95% CI]" for p in others]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for sweep in [a for a in PAPER_AXES if a in set(part["sweep"])]:
        points = part[part["sweep"] == sweep]
        for key, point in points.groupby(["T", "G", "L"], sort=True):
            by = {r["provider"]: r for _, r in point.iterrows()}
            cells = [sweep] + [str(int(v)) for v in key] + [_ms(by.get(FA2))]
            if FA4 in providers:
                cells.append(_ms(by.get(FA4)))
            if moda in providers:
                cells.append(_cell(by.get(moda), by.get(FA2), FA2))
            cells += [_cell(by.get(p), by.get(base), base) for p in others]
            lines.append("| " + " | ".join(cells) + " |")
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


def headline_text(readme: Path, results_root: Path, warn: Callable[[str], None]) -> tuple[str, list[str]]:
    """(readme's text with every headline block whose folder `<results_root>/<name>/paper` exists
    rewritten, the names rewritten); a marker without its run folder is left as it is, with a warning."""
    readme = Path(readme)
    text = readme.read_text(encoding="utf-8")
    done = []
    for name in marker_names(text):
        folder = Path(results_root) / name / HEADLINE_RUN
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
            f"{Path(results_root).as_posix()}/{name}/{HEADLINE_RUN}" for name in done
            if _block(old, name) != _block(text, name)]


def _block(text: str, name: str) -> str:
    begin, end = BEGIN.format(name=name), END.format(name=name)
    i = text.find(begin)
    return text[i:text.find(end, i)]
