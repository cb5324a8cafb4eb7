"""What the report reads: the measurement rows (through `moda_bench.results`, the one reader
of results CSVs) and the paper's A100 reference tables.

Measurement rows: every CSV found recursively under the given results directories (a
`reference/` folder is left out), read by `results.read_csv`; a CSV that is not a results file
is skipped with a one-line warning (a tuner's summary silently: the report reads it through
`results.read_tuning`), as are malformed rows. Rows are de-duplicated on
`schema.ROW_KEY` by `results.newest`: the newest `timestamp` wins (ties: later file, then later
line) and the rows it replaced are kept to be listed. Files are named `<root dir name>/<path
under it>`, so names are stable whatever the working directory.

Paper tables: `paper_a100_efficiency.csv` and `paper_a100_ablation.csv`, by default in the
first `<results dir>/reference/` holding one. They have their own layout (not the results
schema), so `read_reference_table` reads them.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from moda_bench import results as results_io
from moda_bench import schema
from moda_bench.reports.vocab import ReportError

Warn = Callable[[str], None]

PAPER_EFFICIENCY = "paper_a100_efficiency.csv"
PAPER_ABLATION = "paper_a100_ablation.csv"
PAPER_EFFICIENCY_COLUMNS = ["T", "G", "Hq", "Hk", "L", "fa2_triton_ms", "moda_triton_ms",
                            "depth_utilization", "extra_time_pct"]
PAPER_ABLATION_COLUMNS = ["implementation", "T", "G", "Hq", "Hk", "L", "ms"]
PAPER_MEASURE_COLUMNS = ["fa2_triton_ms", "moda_triton_ms", "depth_utilization", "extra_time_pct", "ms"]


@dataclass
class Results:
    """De-duplicated measurement rows plus what was dropped and where it came from."""

    rows: "object"            # DataFrame: newest row per schema.ROW_KEY (+ _file, _line)
    superseded: "object"      # DataFrame: older rows of a key that has a newer one
    files: list[str]          # display names of the results CSVs read, sorted


@dataclass
class Paper:
    """The paper's A100 tables (None when not found), pass normalised to 'fwdbwd'."""

    efficiency: "object" = None
    ablation: "object" = None
    source: str = ""


def display_name(path: Path, root: Path) -> str:
    """`<root dir name>/<path relative to root>` (a file given directly: its name)."""
    root = Path(root).resolve()
    if root.is_file():
        return root.name
    return (Path(root.name) / Path(path).resolve().relative_to(root)).as_posix()


def find_result_csvs(results_dirs: list[Path]) -> list[tuple[Path, str]]:
    """(path, display name) of every CSV under the dirs (`results.find_csvs`), sorted by name."""
    found: dict[Path, str] = {}
    for d in map(Path, results_dirs):
        if not d.exists():
            raise ReportError(f"results directory not found: {d}")
        for path, _ in results_io.find_csvs([d]):
            found.setdefault(path, display_name(path, d))
    if not found:
        raise ReportError("no CSV files under " + ", ".join(str(d) for d in results_dirs))
    return sorted(found.items(), key=lambda pn: (pn[1], str(pn[0])))


def load_results(results_dirs: list[Path], *, warn: Optional[Warn] = None) -> Results:
    """Read every results CSV under results_dirs and keep the newest row of each schema.ROW_KEY.

    Files that are not results CSVs and malformed rows are passed to `warn` (one line each,
    naming the file and line) and skipped; a non-numeric value raises ReportError.
    """
    import pandas as pd
    warn = warn or results_io.default_warn
    csvs = find_result_csvs(results_dirs)
    frames, files = [], []
    for path, name in csvs:
        try:
            frames.append(results_io.read_csv(path, display=name, warn=warn))
        except results_io.NotResultsFile as exc:
            if not (results_io.is_tuning_csv(path) or results_io.is_model_file(path)
                    or results_io.is_profile_file(path)):   # read by results.read_tuning / reports.models
                warn(f"skipping {exc}")
            continue
        except results_io.ResultsError as exc:
            raise ReportError(str(exc)) from None
        files.append(name)
    allrows = pd.concat(frames, ignore_index=True) if frames else results_io.empty_frame()
    if allrows.empty:
        raise ReportError(f"no measurement rows in {len(csvs)} CSV file(s): {', '.join(n for _, n in csvs)}")
    rows, old = results_io.newest(allrows, schema.ROW_KEY)
    return Results(rows=rows, superseded=old, files=files)


def read_reference_table(path: Path, display: str, required: list[str]):
    """A paper reference table: text cells, its config and measure columns numeric; ReportError
    naming the file (and line, column) when it is empty, unreadable or lacks `required`."""
    import pandas as pd
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
    except pd.errors.EmptyDataError:
        raise ReportError(f"{display}: empty file (no CSV header)") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as e:
        raise ReportError(f"{display}: not a readable CSV ({str(e).strip().splitlines()[0]})") from None
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise ReportError(f"{display}: missing column(s) {', '.join(missing)} (expected the paper reference layout)")
    for c in [c for c in schema.INT_CONFIG_COLUMNS + PAPER_MEASURE_COLUMNS if c in df.columns]:
        text = df[c].str.strip()
        try:
            df[c] = pd.to_numeric(text.mask(text == ""), errors="raise").astype(float)
        except (ValueError, TypeError) as e:
            raise ReportError(f"{display}: column {c}: {e}") from None
    return df


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
        if path.is_file():
            df = read_reference_table(path, fname, needed)
            df["pass"] = df["pass"].map(_normalise_pass) if "pass" in df.columns else "fwdbwd"
            setattr(paper, attr, df)
    return paper


def match_columns(paper_df) -> list[str]:
    """Config columns the paper file pins (T, G, Hq, Hk, L and, if present, B, d, C, dtype) + pass."""
    return [c for c in schema.CONFIG_COLUMNS if c in paper_df.columns] + ["pass"]
