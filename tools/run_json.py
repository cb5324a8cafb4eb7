"""Write the provenance file `run.json` of a run folder before committing it (docs/RUNBOOK.md).

A committed run folder `results/<gpu>/<question>/` (one per GPU and question, results/INDEX.md)
holds its CSVs and figures plus `run.json`, no logs or copied scripts: {"question": what it shows,
"commands": [...], "commit", "gpu", "torch", "triton", "date", ..., "options": {...}}.
`moda-bench sweep` writes its options to `<out>/run.json`; this tool keeps them under "options",
adds the commands you give, and takes commit, GPU, versions and the first/last row timestamps
from the CSVs' own columns (git_commit, gpu, torch_version, triton_version, timestamp). Files
without those columns (tuning summaries, probes) are ignored. A run.json that already has
"commands" is updated in place (its other keys are kept). A commit "<sha>-dirty+src<digest>" (the
device's .git older than its files) is replaced by the commit whose package has that source
digest, found among the last 300 (the rows' value kept as "commit_rows"). No GPU.

    python3 tools/run_json.py results/h200/paper \
        --command "moda-bench sweep --preset paper --out results/h200/paper" \
        --set question="The paper preset ..." --set machine="one NVIDIA H200"
    moda-bench report --index    # then refresh results/INDEX.md
"""
from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

FACTS = {"commit": "git_commit", "gpu": "gpu", "torch": "torch_version", "triton": "triton_version"}


def csv_facts(run_dir: Path) -> dict:
    seen = {k: set() for k in FACTS}
    stamps = []
    for path in sorted(run_dir.glob("*.csv")):
        with open(path, newline="") as fh:
            reader = csv.DictReader(fh)
            if not set(FACTS.values()) | {"timestamp"} <= set(reader.fieldnames or ()):
                continue
            for row in reader:
                for key, col in FACTS.items():
                    seen[key].add(row[col])
                stamps.append(row["timestamp"])
    facts = {k: (sorted(v)[0] if len(v) == 1 else sorted(v)) for k, v in seen.items() if v}
    if stamps:
        facts["date"], facts["finished"] = min(stamps), max(stamps)
    return facts


def commit_of_digest(digest: str, repo: Path, depth: int = 300) -> str | None:
    """The newest of the last `depth` commits whose moda_bench/*.py have this source digest
    (moda_bench.schema.source_digest), or None."""
    import subprocess

    from moda_bench.schema import source_digest

    def git(*args, **kw):
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, check=True, **kw).stdout

    for sha in git("rev-list", f"--max-count={depth}", "HEAD", text=True).split():
        paths = [p for p in git("ls-tree", "-r", "--name-only", sha, "--", "moda_bench", text=True).split("\n")
                 if p.endswith(".py")]
        out = git("cat-file", "--batch", input="".join(f"{sha}:{p}\n" for p in paths).encode())
        files, pos = [], 0
        for p in paths:  # "<oid> blob <size>\n<bytes>\n" per path
            head_end = out.index(b"\n", pos)
            size = int(out[pos:head_end].split()[2])
            files.append((p, out[head_end + 1:head_end + 1 + size]))
            pos = head_end + 1 + size + 1
        if source_digest(files) == digest:
            return sha[:12]
    return None


def resolve_commits(facts: dict, repo: Path) -> None:
    """Rows made from a checkout whose .git was older than its files say "<sha>-dirty+src<digest>":
    "commit" becomes the commit with that code (the rows' value kept as "commit_rows")."""
    values = facts.get("commit")
    values = [values] if isinstance(values, str) else list(values or [])
    found = {v: commit_of_digest(v.rsplit("+src", 1)[1], repo) for v in values if "+src" in v}
    if found and all(found.values()):
        facts["commit_rows"] = facts["commit"]
        resolved = sorted({found.get(v, v) for v in values})
        facts["commit"] = resolved[0] if len(resolved) == 1 else resolved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--command", action="append", default=[], help="a command line that produced the folder (repeat)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra key; a dotted key (env.X=1) sets a nested one")
    a = ap.parse_args()
    path = a.run_dir / "run.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    doc = dict(old) if "commands" in old else {"options": old} if old else {}
    if a.command:
        doc["commands"] = a.command
    facts = csv_facts(a.run_dir)
    resolve_commits(facts, Path(__file__).resolve().parents[1])
    doc.update(facts)
    for item in a.set:
        key, _, value = item.partition("=")
        *parents, leaf = key.split(".")
        node = doc
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    order = ["commands", "commit", "gpu", "torch", "triton", "date", "finished"]
    doc = {**{k: doc[k] for k in order if k in doc}, **{k: v for k, v in doc.items() if k not in order}}
    if "options" in doc:  # options last, as in the committed files
        doc["options"] = doc.pop("options")
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
