"""`moda-bench report`: every table and figure regenerated from saved CSVs (no GPU, no torch, no triton).

Inputs: the long-format sweep / ablation CSVs (columns: `moda_bench.schema.COLUMNS`) found
recursively under the given results directories, and the paper's A100 reference tables
(`paper_a100_efficiency.csv`, `paper_a100_ablation.csv`, by default in `<results dir>/reference/`).
Outputs, byte-identical for identical inputs: `REPORT.md` and `figures/*.png|svg` in the out directory.

Row selection: rows are de-duplicated on (sweep, provider, pass, config); when several runs measured
the same key the newest `timestamp` wins (ties: later file, then later line) and the report lists
what was superseded.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Optional

import typer

from moda_bench import schema

# ---------------------------------------------------------------------------------------------
# Vocabulary
# ---------------------------------------------------------------------------------------------
INT_CONFIG_COLUMNS = [c for c in schema.CONFIG_COLUMNS if c != "dtype"]
ENV_COLUMNS = ["gpu", "torch_version", "triton_version", "git_commit"]
RUN_COLUMNS = ENV_COLUMNS + ["timestamp"]
REQUIRED_COLUMNS = ["sweep", "provider", "pass"] + schema.CONFIG_COLUMNS + ["median_ms", "status"] + RUN_COLUMNS
DEDUP_COLUMNS = ["sweep"] + schema.KEY_COLUMNS
AXES = ["T", "G", "L", "C"]                       # one-axis sweeps, in the paper's order (+ C)
PAPER_AXES = ["T", "G", "L"]
ABLATION_SWEEP = "ablation"
LADDER = ["naive-torch", "flash-compatible", "chunk-aware", "group-aware", "batched-tiles", "ours", "moda"]
FA2_PROVIDERS = ("fa2", "fa2-triton")             # first present is the FA2 baseline unless chosen
MODA_PROVIDERS = ("moda", "ours")
ALWAYS_SHOWN = ["cudnn", "flex"]                  # efficiency columns present even when not measured
CEILING_PROVIDER = "matmul"
DEFAULT_CEILING_TFLOPS = 784.0                    # bf16 matmul on the project's H100 (spec section 5)
PASS_ORDER = ["fwdbwd", "fwd", "bwd"]
PASS_LABEL = {"fwdbwd": "fwd+bwd", "fwd": "fwd", "bwd": "bwd"}
PAPER_EFFICIENCY = "paper_a100_efficiency.csv"
PAPER_ABLATION = "paper_a100_ablation.csv"
PAPER_EFFICIENCY_COLUMNS = ["T", "G", "Hq", "Hk", "L", "fa2_triton_ms", "moda_triton_ms",
                            "depth_utilization", "extra_time_pct"]
PAPER_ABLATION_COLUMNS = ["implementation", "T", "G", "Hq", "Hk", "L", "ms"]
MISSING = "-"


class ReportError(Exception):
    """A user-facing problem with the inputs (one line, no traceback)."""


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------
@dataclass
class Results:
    """De-duplicated measurement rows plus what was dropped and where it came from."""

    rows: "object"            # DataFrame: newest row per DEDUP_COLUMNS key (+ _file, _line)
    superseded: "object"      # DataFrame: older rows of a key that has a newer one
    files: list[str]          # display names of the CSVs read, sorted


def _display_name(path: Path, root: Path) -> str:
    """`<root dir name>/<path relative to root>`: stable whatever the cwd or absolute prefix."""
    root = root.resolve()
    if root.is_file():
        return root.name
    return (Path(root.name) / path.resolve().relative_to(root)).as_posix()


def find_result_csvs(results_dirs: list[Path]) -> list[tuple[Path, str]]:
    """(path, display name) of every CSV under the dirs, sorted; `reference/` folders are skipped."""
    found: dict[Path, str] = {}
    for d in results_dirs:
        d = Path(d)
        if not d.exists():
            raise ReportError(f"results directory not found: {d}")
        if d.is_file():
            candidates = [d]
        else:
            candidates = [p for p in d.rglob("*.csv") if "reference" not in p.relative_to(d).parts[:-1]]
        for p in candidates:
            found.setdefault(p.resolve(), _display_name(p, d))
    if not found:
        raise ReportError("no CSV files under " + ", ".join(str(d) for d in results_dirs))
    return sorted(((p, name) for p, name in found.items()), key=lambda pn: (pn[1], str(pn[0])))


def _read_csv_text(path: Path, display: str):
    """All cells as strings ('' for empty), so parsing is identical under pandas 2 and 3."""
    import pandas as pd
    try:
        return pd.read_csv(path, dtype=str, keep_default_na=False)
    except pd.errors.EmptyDataError:
        raise ReportError(f"{display}: empty file (no CSV header)") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as e:
        raise ReportError(f"{display}: not a readable CSV ({str(e).strip().splitlines()[0]})") from None


def _require_columns(df, required: list[str], display: str, expected: str) -> None:
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise ReportError(f"{display}: missing column(s) {', '.join(missing)} (expected {expected})")


def _to_numeric(df, columns: list[str], display: str) -> None:
    """Parse columns in place; a non-empty cell that is not a number is an error naming file/line."""
    import pandas as pd
    for c in columns:
        if c not in df.columns:
            df[c] = float("nan")
            continue
        text = df[c].astype(str).str.strip()
        num = pd.to_numeric(text.where(text != "", None), errors="coerce")
        bad = num.isna() & (text != "") & (text.str.lower() != "nan")
        if bad.any():
            i = int(bad.to_numpy().nonzero()[0][0])
            raise ReportError(f"{display}: non-numeric value {text.iloc[i]!r} in column {c} (line {i + 2})")
        df[c] = num.astype(float)


def read_results_csv(path: Path, display: str | None = None):
    """One sweep/ablation CSV as a DataFrame with numeric config/measure columns."""
    display = display or str(path)
    df = _read_csv_text(path, display)
    _require_columns(df, REQUIRED_COLUMNS, display, "moda_bench.schema.COLUMNS")
    for c in schema.COLUMNS:
        if c not in df.columns:
            df[c] = ""
    _to_numeric(df, INT_CONFIG_COLUMNS + schema.MEASURE_COLUMNS, display)
    df["_file"] = display
    df["_line"] = range(2, len(df) + 2)
    return df


def load_results(results_dirs: list[Path]) -> Results:
    """Read every CSV under results_dirs and keep the newest row of each (sweep, key)."""
    import pandas as pd
    csvs = find_result_csvs(results_dirs)
    frames = [read_results_csv(p, name) for p, name in csvs]
    files = [name for _, name in csvs]
    allrows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if allrows.empty:
        raise ReportError(f"no measurement rows in {len(files)} CSV file(s): {', '.join(files)}")
    allrows["_ts"] = pd.to_datetime(allrows["timestamp"], utc=True, errors="coerce", format="ISO8601")
    allrows = allrows.sort_values(["_ts", "_file", "_line"], kind="stable", na_position="first")
    newest = ~allrows.duplicated(DEDUP_COLUMNS, keep="last")
    order = DEDUP_COLUMNS + ["_file", "_line"]
    rows = allrows[newest].sort_values(order, kind="stable", na_position="last").reset_index(drop=True)
    old = allrows[~newest].sort_values(order, kind="stable", na_position="last").reset_index(drop=True)
    return Results(rows=rows, superseded=old, files=files)


@dataclass
class Paper:
    """The paper's A100 tables (None when not found), pass normalised to 'fwdbwd'."""

    efficiency: "object" = None
    ablation: "object" = None
    source: str = ""


def _normalise_pass(p: str) -> str:
    return str(p).replace("+", "").replace("_", "").strip()


def load_paper(paper_dir: Path | None, results_dirs: list[Path]) -> Paper:
    """Paper tables from paper_dir (must hold them) or the first `<results dir>/reference`."""
    if paper_dir is not None:
        paper_dir = Path(paper_dir)
        if not any((paper_dir / f).is_file() for f in (PAPER_EFFICIENCY, PAPER_ABLATION)):
            raise ReportError(f"paper reference directory {paper_dir} holds neither {PAPER_EFFICIENCY} "
                              f"nor {PAPER_ABLATION}")
    else:
        dirs = [Path(d) / "reference" for d in results_dirs if Path(d).is_dir()]
        paper_dir = next((d for d in dirs if (d / PAPER_EFFICIENCY).is_file() or (d / PAPER_ABLATION).is_file()),
                         None)
        if paper_dir is None:
            return Paper()
    resolved = paper_dir.resolve()
    paper = Paper(source=(Path(resolved.parent.name) / resolved.name).as_posix())
    for attr, fname, needed in (("efficiency", PAPER_EFFICIENCY, PAPER_EFFICIENCY_COLUMNS),
                                ("ablation", PAPER_ABLATION, PAPER_ABLATION_COLUMNS)):
        path = paper_dir / fname
        if not path.is_file():
            continue
        df = _read_csv_text(path, fname)
        _require_columns(df, needed, fname, "the paper reference layout")
        numeric = [c for c in INT_CONFIG_COLUMNS if c in df.columns] + \
            [c for c in ("fa2_triton_ms", "moda_triton_ms", "depth_utilization", "extra_time_pct", "ms")
             if c in df.columns]
        _to_numeric(df, numeric, fname)
        df["pass"] = df["pass"].map(_normalise_pass) if "pass" in df.columns else "fwdbwd"
        setattr(paper, attr, df)
    return paper


def _match_columns(paper_df) -> list[str]:
    """Config columns the paper file pins (T, G, Hq, Hk, L and, if present, B, d, C, dtype) + pass."""
    return [c for c in schema.CONFIG_COLUMNS if c in paper_df.columns] + ["pass"]


# ---------------------------------------------------------------------------------------------
# Tables (numeric frames; formatted to markdown below)
# ---------------------------------------------------------------------------------------------
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


def _sort_passes(passes) -> list[str]:
    return sorted(set(passes), key=lambda p: (PASS_ORDER.index(p) if p in PASS_ORDER else len(PASS_ORDER), p))


def _sort_sweeps(sweeps) -> list[str]:
    return sorted(set(sweeps), key=lambda s: (AXES.index(s) if s in AXES else len(AXES), s))


def _pick_provider(present: set[str], chosen: str | None, candidates: tuple[str, ...], role: str) -> str | None:
    if chosen is not None:
        if chosen not in present:
            raise ReportError(f"{role} provider {chosen!r} not in the results (providers: {', '.join(sorted(present))})")
        return chosen
    return next((p for p in candidates if p in present), None)


def _config_caption(frame, columns: list[str]) -> str:
    """'B=1, d=64, ...' for the columns constant across frame."""
    parts = []
    for c in columns:
        vals = frame[c].dropna().unique()
        if len(vals) == 1:
            parts.append(f"{c}={_fmt_int(vals[0]) if c in INT_CONFIG_COLUMNS else vals[0]}")
    return ", ".join(parts)


def _varying(frame, columns: list[str]) -> list[str]:
    return [c for c in columns if frame[c].nunique(dropna=False) > 1]


def efficiency_sections(rows, paper: Paper, fa2: str | None, moda: str | None) -> list[Section]:
    """Per (pass, sweep) a frame: config, FA2/MoDA ms, depth util., extra %, paper columns, other providers.

    Extra time % = (MoDA - FA2) / FA2 * 100 from the medians; ratio columns are provider ms / FA2 ms.
    """
    import pandas as pd
    eff = rows[(rows["sweep"] != ABLATION_SWEEP) & (rows["provider"] != CEILING_PROVIDER)]
    sections = []
    paper_eff = paper.efficiency
    for pass_ in _sort_passes(eff["pass"]):
        for sweep in _sort_sweeps(eff.loc[eff["pass"] == pass_, "sweep"]):
            part = eff[(eff["pass"] == pass_) & (eff["sweep"] == sweep)]
            ok = part["status"] == schema.OK
            configs = part[schema.CONFIG_COLUMNS].drop_duplicates()
            axis = [sweep] if sweep in AXES else []
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
            frame, has_paper = _attach_paper_efficiency(frame, paper_eff, pass_)
            show = [c for c in ["T", "G", "Hq", "Hk", "L"]] + _varying(frame, ["B", "d", "C", "dtype"])
            title = f"Sweep over {sweep}" if sweep in AXES else f"Sweep '{sweep}'"
            sections.append(Section(title=title, caption=_config_caption(frame, ["B", "d", "C", "dtype"]),
                                    frame=frame, show_config=show, pass_=pass_, sweep=sweep, others=others,
                                    has_paper=has_paper))
    return sections


def _attach_paper_efficiency(frame, paper_eff, pass_: str):
    """frame + paper_* columns matched on the paper's config columns; (frame, whether paper data applies)."""
    names = {"fa2_triton_ms": "paper_fa2_ms", "moda_triton_ms": "paper_moda_ms",
             "depth_utilization": "paper_eta", "extra_time_pct": "paper_extra_pct"}
    if paper_eff is None or pass_ not in set(paper_eff["pass"]):
        for c in names.values():
            frame[c] = float("nan")
        return frame, False
    on = _match_columns(paper_eff)
    ref = paper_eff[on + list(names)].drop_duplicates(on).rename(columns=names)
    return frame.assign(**{"pass": pass_}).merge(ref, on=on, how="left").drop(columns="pass"), True


def ablation_sections(rows, paper: Paper) -> list[Section]:
    """Per (pass, config) of the ablation sweep: the ladder with ms, speedup over previous rung, paper."""
    import pandas as pd
    abl = rows[(rows["sweep"] == ABLATION_SWEEP) & (rows["provider"] != CEILING_PROVIDER)]
    sections = []
    for pass_ in _sort_passes(abl["pass"]):
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
                on = _match_columns(paper.ablation)
                key = dict(cfg)
                key["pass"] = pass_
                pmask = pd.Series(True, index=paper.ablation.index)
                for c in on:
                    pmask &= paper.ablation[c] == key[c]
                pab = paper.ablation[pmask].drop_duplicates("implementation").set_index("implementation")["ms"]
                frame["paper_ms"] = frame["provider"].map(pab).astype(float)
            frame["speedup"] = _ladder_speedup(frame["provider"], frame["ms"])
            frame["paper_speedup"] = _ladder_speedup(frame["provider"], frame["paper_ms"])
            frame["ours_over_paper"] = frame["ms"] / frame["paper_ms"]
            caption = ", ".join(f"{c}={_fmt_int(cfg[c]) if c in INT_CONFIG_COLUMNS else cfg[c]}"
                                for c in schema.CONFIG_COLUMNS)
            sections.append(Section(title=f"{caption}, {PASS_LABEL.get(pass_, pass_)}", caption=caption,
                                    frame=frame, show_config=[], pass_=pass_, sweep=ABLATION_SWEEP))
    return sections


def _ladder_speedup(providers, ms):
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
    mm = rows[(rows["provider"] == CEILING_PROVIDER) & (rows["status"] == schema.OK) & rows["tflops"].notna()]
    if len(mm):
        newest = mm.sort_values(["_ts", "tflops", "_file", "_line"], kind="stable", na_position="first").iloc[-1]
        return float(newest["tflops"]), f"measured: matmul row of {newest['gpu']} at {newest['timestamp']}"
    return DEFAULT_CEILING_TFLOPS, "spec section 5 default (H100 bf16 matmul)"


# ---------------------------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------------------------
def _isnan(x) -> bool:
    try:
        return x is None or math.isnan(float(x))
    except (TypeError, ValueError):
        return False


def _fmt_int(x) -> str:
    return MISSING if _isnan(x) else str(int(x))


def _fmt(x, spec: str, suffix: str = "") -> str:
    return MISSING if _isnan(x) else f"{float(x):{spec}}{suffix}"


def _fmt_ms(ms, status="") -> str:
    """ms with 3 decimals; a measured-but-failed cell shows its status (oom, skipped, error)."""
    if _isnan(ms):
        return status if isinstance(status, str) and status and status != schema.OK else MISSING
    return f"{float(ms):.3f}"


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
        cells = [_fmt_int(r[c]) if c in INT_CONFIG_COLUMNS else str(r[c]) for c in section.show_config]
        cells += [_fmt_ms(r["fa2_ms"], r.get(f"{fa2}:status", "")), _fmt_ms(r["moda_ms"], r.get(f"{moda}:status", "")),
                  _fmt(r["eta"], ".4f"), _fmt(r["extra_pct"], ".2f") + ("*" if r["mixed_env"] else "")]
        if section.has_paper:
            cells += [_fmt(r["paper_fa2_ms"], ".3f"), _fmt(r["paper_moda_ms"], ".3f"), _fmt(r["paper_eta"], ".4f"),
                      _fmt(r["paper_extra_pct"], ".2f")]
        for p in others:
            cells += [_fmt_ms(r.get(f"{p}:ms"), r.get(f"{p}:status", "")), _fmt(r[f"{p}:ratio"], ".2f", "x")]
        body.append(cells)
    caption = f"### {section.title} ({PASS_LABEL.get(section.pass_, section.pass_)}"
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
        body.append([rung, r["provider"], _fmt_ms(r["ms"], r["status"]), _fmt(r["speedup"], ".2f", "x"),
                     _fmt(r["paper_ms"], ".3f"), _fmt(r["paper_speedup"], ".2f", "x"),
                     _fmt(r["ours_over_paper"], ".3f")])
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
                     ", ".join(_sort_sweeps(g["sweep"])), str(int(g["_kept"].sum())),
                     str(int((1 - g["_kept"]).sum())), ", ".join(sorted(set(g["_file"])))])
    body.sort(key=lambda r: (r[0], r[1:]))
    text = "## Provenance\n\n" + md_table(headers, body)
    n_old = len(results.superseded)
    if n_old:
        text += (f"\n\nSeveral runs measured the same (sweep, provider, pass, config) key: the newest timestamp is "
                 f"shown and {n_old} older row(s) were superseded:\n\n")
        winners = results.rows[DEDUP_COLUMNS + ["timestamp"]].rename(columns={"timestamp": "_newer"})
        sup = results.superseded.merge(winners, on=DEDUP_COLUMNS, how="left")   # NaN keys match NaN keys
        lines = []
        for (fname, ts), g in sup.groupby(["_file", "timestamp"], sort=True):
            newer = ", ".join(sorted(set(g["_newer"].astype(str))))
            lines.append(f"- {fname} @ {ts}: {len(g)} row(s), replaced by the run(s) at {newer}")
        text += "\n".join(lines)
    return text


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------
def generate_report(results_dirs: list[Path], out_dir: Path, *, paper_dir: Path | None = None,
                    ceiling_tflops: float | None = None, fa2_provider: str | None = None,
                    moda_provider: str | None = None, figures: bool = True) -> list[Path]:
    """Write out_dir/REPORT.md and out_dir/figures/*.png|svg from the CSVs under results_dirs.

    Deterministic: the same inputs give byte-identical files. Returns the written paths, sorted.
    Raises ReportError for missing/empty inputs or malformed CSVs.
    """
    results_dirs = [Path(d) for d in results_dirs]
    out_dir = Path(out_dir)
    results = load_results(results_dirs)
    paper = load_paper(paper_dir, results_dirs)
    rows = results.rows
    eff_rows = rows[(rows["sweep"] != ABLATION_SWEEP) & (rows["provider"] != CEILING_PROVIDER)]
    fa2 = _pick_provider(set(eff_rows["provider"]), fa2_provider, FA2_PROVIDERS, "FA2")
    moda = _pick_provider(set(eff_rows["provider"]), moda_provider, MODA_PROVIDERS, "MoDA")
    eff = efficiency_sections(rows, paper, fa2, moda)
    abl = ablation_sections(rows, paper)
    ceiling = matmul_ceiling(rows, ceiling_tflops)

    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    fig_links: dict[str, str] = {}
    if figures:
        from moda_bench.reports import figures as figs
        written += figs.write_all(out_dir / "figures", rows=eff_rows, eff_sections=eff, abl_sections=abl,
                                  paper=paper, ceiling=ceiling)
        fig_links = {p.stem: os.path.relpath(p, out_dir).replace(os.sep, "/") for p in written if p.suffix == ".png"}

    md = [f"# MoDA benchmark report\n\nGenerated by `moda-bench report` from {len(results.files)} CSV file(s): "
          f"{len(results.rows)} measurement row(s) shown, {len(results.superseded)} superseded. "
          + (f"Paper reference: A100 tables from `{paper.source}`." if paper.source else
             "Paper reference data not found (pass `--paper-dir`); paper columns are omitted.")]
    if eff:
        md.append(f"## Efficiency\n\nFA2 = `{fa2 or MISSING}`, MoDA = `{moda or MISSING}`. Extra time % = "
                  "(MoDA - FA2) / FA2 from the medians of the same table line; `<provider>/FA2` is that "
                  "provider's ms over FA2's (< 1 is faster). Depth util. is the MoDA row's reported "
                  "depth utilisation. Paper columns are the A100 bf16 numbers, matched on "
                  + ", ".join(_match_columns(paper.efficiency)[:-1] if paper.efficiency is not None else ["-"])
                  + " and pass. A failed measurement shows its status.")
        md += [efficiency_markdown(s, fa2, moda) for s in eff]
    if abl:
        md.append("## Kernel ablation\n\nSpeedup vs previous = previous rung's ms / this rung's ms. "
                  "Paper: A100, bf16, fwd+bwd.")
        md += [ablation_markdown(s) for s in abl]
    md.append(f"## Ceiling\n\nAchieved TFLOP/s are drawn against a matmul ceiling of {ceiling[0]:.1f} TFLOP/s "
              f"({ceiling[1]}).")
    if fig_links:
        md.append("## Figures\n\n" + "\n\n".join(f"![{stem}]({link})" for stem, link in sorted(fig_links.items())))
    md.append(provenance_markdown(results))
    md.append("Input files: " + ", ".join(f"`{f}`" for f in results.files) + ".")
    report = out_dir / "REPORT.md"
    report.write_text("\n\n".join(md) + "\n", encoding="utf-8", newline="\n")
    written.append(report)
    return sorted(written)


def report_command(
    results_dirs: Annotated[Optional[list[Path]], typer.Argument(
        help="Directories (searched recursively) or CSV files with sweep/ablation results. Default: results/",
        show_default=False)] = None,
    out: Annotated[Path, typer.Option("--out", help="Output directory for REPORT.md and figures/.")]
        = Path("docs/report"),
    ceiling_tflops: Annotated[Optional[float], typer.Option(
        "--ceiling-tflops", help="Matmul ceiling for the TFLOP/s figure (default: a 'matmul' row, else 784).")]
        = None,
    paper_dir: Annotated[Optional[Path], typer.Option(
        "--paper-dir", help="Folder with paper_a100_*.csv (default: <results dir>/reference).")] = None,
    fa2_provider: Annotated[Optional[str], typer.Option(
        "--fa2-provider", help="Provider used as the FA2 baseline (default: fa2, else fa2-triton).")] = None,
    moda_provider: Annotated[Optional[str], typer.Option(
        "--moda-provider", help="Provider used as MoDA (default: moda, else ours).")] = None,
    figures: Annotated[bool, typer.Option("--figures/--no-figures", help="Also draw the PNG/SVG figures.")] = True,
) -> None:
    """Regenerate REPORT.md and every figure from saved CSVs (no GPU needed)."""
    from rich.console import Console
    try:
        written = generate_report(results_dirs or [Path("results")], out, paper_dir=paper_dir,
                                  ceiling_tflops=ceiling_tflops, fa2_provider=fa2_provider,
                                  moda_provider=moda_provider, figures=figures)
    except ReportError as e:
        Console(stderr=True).print(f"error: {e}", style="red", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(2)
    n_fig = sum(p.suffix == ".png" for p in written)
    tail = f" and {n_fig} figure(s) (PNG + SVG) in {out / 'figures'}" if n_fig else ""
    Console().print(f"wrote {out / 'REPORT.md'}{tail}", markup=False, highlight=False, soft_wrap=True)
