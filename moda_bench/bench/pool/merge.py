"""Shard CSVs: their names, reading one (exactly the schema's columns, through
`moda_bench.results.read_csv`) and merging several (`moda-bench merge`).

Files:
  `<base>.gpu<k>.csv` / `.log`   worker on physical GPU k (`--gpus`, pool.local); <base> is the
                                 sweep CSV for one sweep, `<dir>/pool.csv` for several
  `<stem>.rank<r>.csv`           rank r's rows of the sweep CSV `<stem>.csv` (torchrun)

Merge semantics: every file must have exactly the schema's columns (else `ShardSchemaError`, one
line naming the file and its missing/unexpected columns); a last line cut off by a killed worker
is ignored (read_csv warns); rows repeating schema.ROW_KEY + timestamp are kept once (the first);
rows are sorted by sweep, pass, provider, configuration, timestamp and gpu_index, so the same
shards give the same file byte for byte; the output is written through a temporary file.
`bench.runstate.missing_points` lists the points of the run (its run.json) the merged rows lack.
"""
from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

from moda_bench import results, schema
from moda_bench.bench.runner import schema_rows

SORT_COLUMNS = ["sweep", "pass", "provider"] + schema.CONFIG_COLUMNS + ["timestamp", "gpu_index"]
# the same point is measured once per sweep it is in (a preset's base point: T, G and L sweeps)
DEDUPE_COLUMNS = schema.ROW_KEY + ["timestamp"]


class ShardSchemaError(results.ResultsError):
    """A shard CSV whose columns are not schema.COLUMNS (message names the file)."""


def shard_path(csv_path: Path, kind: str, k: int, suffix: str = ".csv") -> Path:
    """`<dir>/<stem>.<kind><k><suffix>`, e.g. results/paper.rank3.csv or results/paper.gpu1.log."""
    csv_path = Path(csv_path)
    return csv_path.with_name(f"{csv_path.stem}.{kind}{k}{suffix}")


def count_rows(path: Path) -> int:
    """Complete data rows in a CSV written row by row (0 if absent); cheap enough to poll."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return 0
    return max(data.count(b"\n") - 1, 0)


def empty_rows():
    """A frame of no rows with the schema's columns."""
    return schema_rows(results.empty_frame())


def read_shard(path: Path, *, warn: results.Warn = results.default_warn):
    """One shard as a DataFrame with columns exactly schema.COLUMNS (in that order), integer
    columns as integers (`runner.schema_rows`).

    A file without a complete header line (empty, or killed while writing it) gives no rows; a
    last line without a newline is skipped by read_csv with a warning. Raises ShardSchemaError
    naming the file when its columns differ from the schema's (any order is accepted), and
    results.ResultsError for other unusable content.
    """
    path = Path(path)
    text = path.read_text()
    if "\n" not in text or not text.strip():
        return empty_rows()
    header = next(csv.reader([text[: text.index("\n")]]), [])
    if set(header) != set(schema.COLUMNS) or len(header) != len(schema.COLUMNS):
        missing = [c for c in schema.COLUMNS if c not in header]
        extra = [c for c in header if c not in schema.COLUMNS]
        raise ShardSchemaError(
            f"{path}: columns differ from the moda-bench schema (missing {missing or 'none'}, "
            f"unexpected {extra or 'none'})")
    return schema_rows(results.read_csv(path, warn=warn))


def merge_frames(frames: Sequence):
    """Concatenate shard frames, drop duplicates on schema.ROW_KEY + timestamp (first kept), and
    sort deterministically by sweep, pass, provider, configuration, timestamp, gpu_index."""
    import pandas as pd
    frames = [schema_rows(f) for f in frames if len(f)]
    if not frames:
        return empty_rows()
    merged = schema_rows(pd.concat(frames, ignore_index=True))
    merged = merged.drop_duplicates(subset=DEDUPE_COLUMNS, keep="first")
    merged = merged.sort_values(SORT_COLUMNS, kind="mergesort", na_position="last")
    return merged.reset_index(drop=True)


def expand_shard_inputs(inputs: Sequence[Path], exclude: Path | None = None) -> list[Path]:
    """Files as given; a directory contributes its `*.csv` files (sorted, not recursive),
    `exclude` left out; each file once."""
    files: list[Path] = []
    skip = Path(exclude).resolve() if exclude is not None else None
    for item in inputs:
        item = Path(item)
        if item.is_dir():
            found = sorted(p for p in item.glob("*.csv") if p.is_file())
            files.extend(p for p in found if p.resolve() != skip)
        elif item.is_file():
            files.append(item)
        else:
            raise FileNotFoundError(f"{item}: no such shard file or directory")
    seen, unique = set(), []
    for f in files:
        if f.resolve() not in seen:
            seen.add(f.resolve())
            unique.append(f)
    return unique


def merge_shards(files: Sequence[Path], out: Path | None = None):
    """Read, check and merge shard CSVs; write `out` if given (nothing is written when a file
    is unusable). Returns the merged DataFrame."""
    merged = merge_frames([read_shard(f) for f in files])
    if out is not None:
        results.write_csv_atomic(out, merged)
    return merged


def stamp_gpu_index(path: Path, gpu_index: int):
    """Rewrite a finished shard so every row carries the physical GPU index (a worker or rank
    sees its GPU as cuda:0 / cuda:LOCAL_RANK); returns its rows (none if the file is absent)."""
    path = Path(path)
    frame = read_shard(path) if path.exists() else empty_rows()
    if len(frame):
        frame = frame.assign(gpu_index=gpu_index)
        results.write_csv_atomic(path, schema_rows(frame))
    return frame

