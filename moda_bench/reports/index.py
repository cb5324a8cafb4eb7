"""`results/INDEX.md`: the index of the run folders of a results tree (`moda-bench report --index`).

A run folder is `<root>/<gpu>/<question>/`, one per GPU and question, holding the newest evidence
for it; its `run.json` says what it shows (`question`), the commands that wrote it (`commands`,
or the older `command`), the commit and the date. Per folder the index lists those, the GPU,
the providers and the number of measurement rows, read through `moda_bench.results` (the rows of
every results CSV under the folder; a tuning folder counts its tuned shapes, `results.read_tuning`).
The date is the newest row's timestamp, else the run.json's. `reference/` (the paper's tables)
is named, not indexed. The file is written whole by `write_index`; never edit it by hand.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from moda_bench import results as results_io
from moda_bench.reports.tree import REFERENCE
from moda_bench.reports.vocab import ReportError

INDEX = "INDEX.md"


@dataclass
class RunFolder:
    """What the index says about one run folder."""

    name: str                 # '<gpu>/<question>'
    question: str
    commands: list[str]
    commit: str
    date: str
    gpu: str
    providers: list[str]
    rows: str                 # '<n>' measurement rows, or '<n> tuned shapes'


def _text(value) -> str:
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    return "" if value is None else str(value)


def read_run_json(folder: Path) -> dict:
    """folder/run.json as a dict; ReportError naming it when it is missing or not JSON."""
    path = folder / "run.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReportError(f"{path}: missing (every run folder has a run.json with its command)") from None
    except ValueError as e:
        raise ReportError(f"{path}: not JSON ({e})") from None
    if not isinstance(data, dict):
        raise ReportError(f"{path}: not a JSON object")
    return data


def commands_of(meta: dict) -> list[str]:
    """A run.json's `commands` (or older `command`), as a list of strings."""
    commands = meta.get("commands", meta.get("command", []))
    return [str(c) for c in (commands if isinstance(commands, list) else [commands]) if c]


def describe(folder: Path, name: str) -> RunFolder:
    """The index entry of one run folder (its top run.json names every command that wrote it,
    subfolders included; a subfolder's run.json holds that sweep's options)."""
    meta = read_run_json(folder)
    commands = commands_of(meta)
    ok = results_io.read_results([folder], warn=lambda message: None)
    count, stamps = f"{len(ok)}", ok["timestamp"] if not ok.empty else []
    if ok.empty:
        tuned = results_io.read_tuning([folder], warn=lambda message: None)
        if not tuned.empty:
            count, stamps = f"{len(tuned)} tuned shapes", tuned["timestamp"]
    dates = sorted(str(t)[:10] for t in stamps if str(t).strip()[:4].isdigit())
    gpus = sorted({str(g) for g in (ok["gpu"] if not ok.empty else []) if str(g).strip()})
    return RunFolder(
        name=name, question=_text(meta.get("question")) or "-", commands=commands,
        commit=_text(meta.get("commit")) or ", ".join(sorted({str(c)[:7] for c in ok.get("git_commit", [])})) or "-",
        date=dates[-1] if dates else (_text(meta.get("date"))[:10] or "-"),
        gpu=", ".join(gpus) or _text(meta.get("gpu")) or "-",
        providers=sorted({str(p) for p in (ok["provider"] if not ok.empty else [])}),
        rows=count)


def run_folders(root: Path) -> list[RunFolder]:
    """Every run folder of root (`<gpu>/<question>/`, sorted), `reference/` aside."""
    root = Path(root)
    if not root.is_dir():
        raise ReportError(f"results directory not found: {root}")
    return [describe(q, f"{g.name}/{q.name}") for g in sorted(root.iterdir()) if g.is_dir() and g.name != REFERENCE
            for q in sorted(g.iterdir()) if q.is_dir()]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def index_markdown(root: Path) -> str:
    """The text of root/INDEX.md."""
    root = Path(root)
    folders = run_folders(root)
    md = ["# Results index", "",
          f"Written by `moda-bench report --index` from the {len(folders)} run folders under `{root.name}/`; do not "
          "edit by hand. One folder per GPU and question, holding the newest evidence for it; its `run.json` keeps "
          "the command, the commit and the machine. Superseded and exploratory runs are in the git history. "
          "`rows`: measurement rows of the folder's results CSVs (a tuning folder: its tuned shapes); `date`: the "
          "newest row's. The paper's A100 tables are in `reference/`.", "",
          "| folder | what it shows | GPU | date | commit | providers | rows |",
          "|---|---|---|---|---|---|---:|"]
    for f in folders:
        md.append(f"| [{f.name}]({f.name}) | {_cell(f.question)} | {_cell(f.gpu)} | {f.date} | {_cell(f.commit)} | "
                  f"{_cell(', '.join(f.providers)) or '-'} | {f.rows} |")
    md += ["", "## Commands", ""]
    for f in folders:
        md.append(f"### {f.name}")
        md.append("")
        md += [f"    {c}" for c in f.commands] or ["(run.json names no command)"]
        md.append("")
    return "\n".join(md)


def write_index(root: Path) -> Path:
    """Write root/INDEX.md (`index_markdown`) and return its path."""
    path = Path(root) / INDEX
    path.write_text(index_markdown(root), encoding="utf-8", newline="\n")
    return path
