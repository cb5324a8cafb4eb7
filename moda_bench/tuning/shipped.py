"""Turn a tuning cache into the configs shipped with the package (`moda-bench tune
--export-shipped DIR`).

The shipped configs are package data, one JSON file per GPU model in
moda_bench/kernels/moda/tuned/ (`config.shipped_path`: <gpu-slug>.json), read by `resolve_config`
when no explicit config is given and the user's tuning cache (if one is installed) has no entry
for the shape. File: {"schema_version": 1, "gpu": <name>, "entries": {key: entry}}, key =
`config.shipped_key`: triton major.minor, dtype, d, G, L and the power-of-two bucket of T (the
user cache's key without the GPU, which the file name carries, and with triton's patch version
dropped). Entries keep the config and the evidence: default, tuned and candidate ms, the
ratio's 95% interval, the margin, the tuned shape, triton version and date.

Only entries whose decision is 'tuned' are shipped (the candidate beat the default by more than
the margin and the noise); an entry of the cache whose decision is 'default' removes the key
from the shipped file (the new measurement says the default is as good). Entries of other keys
already in the file are kept, so the H100 and H200 exports can be made on different machines.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from moda_bench.kernels.moda.config import (
    SHIPPED_SCHEMA_VERSION,
    MoDAConfig,
    op_prefix,
    read_shipped,
    shipped_path,
    triton_minor,
)
from moda_bench.tuning.cache import atomic_write_json, read_entries
from moda_bench.tuning.space import config_problems

KEPT_FIELDS = ("default_ms", "tuned_ms", "candidate_ms", "speedup", "ratio", "ratio_lo", "ratio_hi", "min_gain",
               "tuned_shape", "triton_version", "date")


def shipped_key_of(entry: dict) -> str:
    """The shipped key of a tuning-cache entry (from its recorded fields; entries from before the
    `op` field are moda's)."""
    return (f"{op_prefix(entry.get('op', 'moda'))}triton {triton_minor(entry['triton_version'])}|{entry['dtype']}"
            f"|d{entry['d']}|G{entry['G']}|L{entry['L']}|T<={entry['T_bucket']}")


def _usable(entry) -> Optional[str]:
    """Why a cache entry cannot be exported (None: it can)."""
    if not isinstance(entry, dict):
        return "not a table"
    missing = [f for f in ("gpu", "triton_version", "dtype", "d", "G", "L", "T_bucket", "config") if f not in entry]
    if missing:
        return f"missing {', '.join(missing)}"
    try:
        probs = config_problems(MoDAConfig.from_dict(entry["config"]), int(entry["G"]))
    except Exception as exc:  # noqa: BLE001
        probs = [f"{type(exc).__name__}: {exc}"]
    return f"invalid config ({probs[0]})" if probs else None


def plan_export(entries: dict, gpus: Optional[list[str]] = None) -> dict:
    """{gpu: {"set": {key: shipped entry}, "drop": set of keys, "skipped": [(cache key, why)]}}
    for the cache entries (of `gpus` only, if given). Entries are visited oldest first, so the
    newest measurement of a key wins."""
    plan: dict = {}
    ordered = sorted(entries.items(), key=lambda kv: (str(kv[1].get("date", "")) if isinstance(kv[1], dict)
                                                      else "", kv[0]))
    for ckey, entry in ordered:
        gpu = entry.get("gpu") if isinstance(entry, dict) else None
        if gpus is not None and gpu not in gpus:
            continue
        why = _usable(entry)
        p = plan.setdefault(gpu or "?", {"set": {}, "drop": set(), "skipped": []})
        if why:
            p["skipped"].append((ckey, why))
            continue
        key = shipped_key_of(entry)
        if entry.get("decision") == "tuned":
            p["set"][key] = dict({f: entry.get(f) for f in KEPT_FIELDS}, config=entry["config"], cache_key=ckey)
            p["drop"].discard(key)
        else:
            p["skipped"].append((ckey, f"decision {entry.get('decision', 'unrecorded')!r}: not shipped"))
            p["set"].pop(key, None)
            p["drop"].add(key)
    return {g: p for g, p in plan.items() if g != "?" or p["skipped"]}


def export_shipped(cache_path, out_dir, gpus: Optional[list[str]] = None) -> list[dict]:
    """Write the shipped-config files of the GPUs in the cache at `cache_path` into `out_dir`
    (merged with the files there). Returns one summary per GPU: gpu, path, added (keys set),
    dropped (keys removed), total (entries in the file now), skipped [(cache key, why)]."""
    out_dir = Path(out_dir)
    summaries = []
    for gpu, p in sorted(plan_export(read_entries(cache_path), gpus).items()):
        if gpu == "?":
            summaries.append({"gpu": "?", "path": None, "added": 0, "dropped": 0, "total": 0,
                              "skipped": p["skipped"]})
            continue
        path = shipped_path(gpu, out_dir)
        table = dict(read_shipped(path, gpu))
        dropped = sorted(k for k in p["drop"] if k in table)
        for k in dropped:
            del table[k]
        table.update(p["set"])
        if table or path.exists():
            atomic_write_json(path, {"schema_version": SHIPPED_SCHEMA_VERSION, "gpu": gpu, "entries": table})
        summaries.append({"gpu": gpu, "path": path, "added": len(p["set"]), "dropped": len(dropped),
                          "total": len(table), "skipped": p["skipped"]})
    return summaries
