"""The docs speak to a user with their own GPU machine, by topic: README.md and docs/*.md (the
generated reports live in reports/ and are not checked)

- must not name the machines this project's runs were made on: the word "lent", the string
  "$OUT", a machine-kind name such as ``nvidia-h200-x2``, or other words of the place the runs were
  made in ("device tool", "lease", "budget_left", ...);
- must not read as a lab notebook: no run-date or run-sequence narrative ("session N", "the Nth
  runs", "s23"-style run ids, dates such as 2026-11-26, "run 5" / "call 4");
- stay short: README.md <= 250 lines, docs/RUNBOOK.md <= 300, docs/DESIGN.md <= 400;

and .ci/run runs the README's install and test command lines verbatim."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (name, pattern): each pattern is matched against every line of the checked files.
FORBIDDEN: list[tuple[str, re.Pattern[str]]] = [
    # the word, not "excellent", "silent", "equivalent", "prevalent", "lentil"
    ("the word 'lent'", re.compile(r"(?<![A-Za-z])lent(?![A-Za-z])", re.IGNORECASE)),
    ("'$OUT'", re.compile(r"\$OUT|\$\{OUT\b")),
    # nvidia-h(100|200)(-x\d+)?, but not the shipped tuned-config file names that
    # moda_bench/kernels/moda/tuned/README.md documents (nvidia-h200.json, nvidia-h100-80gb-hbm3.json)
    ("a machine-kind name",
     re.compile(r"nvidia-h(?:100|200)(?:-x\d+)?(?![\w-]|\.\w)", re.IGNORECASE)),
    ("'device tool'", re.compile(r"device[ _-]tools?\b", re.IGNORECASE)),
    ("'lease'", re.compile(r"(?<![A-Za-z])lease(?![A-Za-z])", re.IGNORECASE)),
    ("'budget_left'", re.compile(r"budget_left", re.IGNORECASE)),
    ("'files_at'/'files_fetch'", re.compile(r"files_(?:at|fetch|left_out)", re.IGNORECASE)),
    ("'held_s'", re.compile(r"held_s\b", re.IGNORECASE)),
    ("'warm machine'", re.compile(r"warm machine", re.IGNORECASE)),
    ("'device time was left'", re.compile(r"device time (?:was|is) (?:left|spent)", re.IGNORECASE)),
    ("'this workplace'", re.compile(r"\bworkplace\b", re.IGNORECASE)),
]


_ORDINAL = (r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
            r"thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|"
            r"thirtieth|(?:twenty|thirty)-\w+|\d+(?:st|nd|rd|th))")

# (name, pattern): the lab-notebook vocabulary; each pattern is matched against every line.
NARRATIVE: list[tuple[str, re.Pattern[str]]] = [
    ("the word 'session'", re.compile(r"\bsessions?\b", re.IGNORECASE)),
    ("'the Nth runs'", re.compile(rf"\bthe\s+{_ORDINAL}\s+(?:[\d-]+\s+)?runs\b", re.IGNORECASE)),
    # s23, s22b, paper-moda-s30: a run id numbered by sequence (not d128x64w8s3, sm_90, s_max)
    ("a run-sequence id", re.compile(r"(?<![A-Za-z0-9_])s\d{1,2}[a-z]?(?![A-Za-z0-9_])")),
    ("a run date", re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")),
    # "run 5", "calls 2, 4" (not "runs 0.69 x FA2", not a `--calls 300` option)
    ("'run N' / 'call N'", re.compile(r"(?<!--)\b(?:runs?|calls?)\s+\d+\b(?!\.\d)", re.IGNORECASE)),
]

MAX_LINES = {"README.md": 250, "docs/RUNBOOK.md": 300, "docs/DESIGN.md": 400}


def doc_files(root: Path = ROOT) -> list[Path]:
    """README.md and the hand-written docs/*.md (the generated reports/ are not checked)."""
    files = [root / "README.md"] + sorted((root / "docs").glob("*.md"))
    return [f for f in files if f.is_file()]


def find_forbidden(path: Path, root: Path | None = None,
                   patterns: list[tuple[str, re.Pattern[str]]] = FORBIDDEN) -> list[str]:
    """One ``file:line: <what> in: <the line>`` entry per match of ``patterns`` in ``path``."""
    shown = path.relative_to(root) if root is not None else path
    hits = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        for what, pat in patterns:
            for m in pat.finditer(line):
                hits.append(f"{shown}:{n}: {what} ({m.group(0)!r}) in: {line.strip()}")
    return hits


def test_docs_have_no_workplace_words():
    files = doc_files()
    assert any(f.name == "README.md" for f in files)
    assert any(f.name == "RUNBOOK.md" for f in files)
    hits = [h for f in files for h in find_forbidden(f, ROOT)]
    assert not hits, (
        "the docs name the machines the project's runs were made on; rewrite for a user's "
        "own GPU machine:\n" + "\n".join(hits))


def test_checker_flags_a_planted_line(tmp_path):
    bad = tmp_path / "planted.md"
    bad.write_text("# a doc\n\non the lent machines, $OUT comes back\n", encoding="utf-8")
    hits = find_forbidden(bad)
    assert len(hits) >= 2
    assert all(h.startswith(f"{bad}:3: ") for h in hits)
    assert any("'lent'" in h for h in hits) and any("$OUT" in h for h in hits)
    assert all("on the lent machines, $OUT comes back" in h for h in hits)


def test_checker_flags_machine_kind_names(tmp_path):
    bad = tmp_path / "kinds.md"
    names = ["nvidia-h100-x1", "nvidia-h200", "nvidia-h200-x2", "nvidia-h200-x4", "nvidia-h200-x8"]
    bad.write_text("".join(f"run it on `{k}`\n" for k in names[:4]) + f"or on {names[4]}.\n",
                   encoding="utf-8")
    hits = find_forbidden(bad)
    assert len(hits) == len(names)
    for n, (k, h) in enumerate(zip(names, hits), start=1):
        assert h.startswith(f"{bad}:{n}: a machine-kind name ({k!r})")


def test_checker_passes_clean_lines(tmp_path):
    good = tmp_path / "clean.md"
    good.write_text(
        "On one NVIDIA H200 (or an H100 80GB HBM3, or a node of two H200s) the results go to\n"
        "`--out $RESULTS/h200/paper-peers`; an excellent, silent, equivalent and prevalent check.\n"
        "Released after a lentil soup; please keep the out-folder: OUT=results (no dollar sign).\n"
        "Shipped configs: `tuned/nvidia-h200.json`, `tuned/nvidia-h100-80gb-hbm3.json`.\n",
        encoding="utf-8")
    assert find_forbidden(good) == []


def find_narrative(path: Path, root: Path | None = None) -> list[str]:
    """One entry per run-date or run-sequence phrase in ``path`` (``find_forbidden``'s format)."""
    return find_forbidden(path, root, NARRATIVE)


def test_generated_reports_are_not_checked():
    assert not any("report" in f.relative_to(ROOT).parts[:-1] for f in doc_files())


def test_docs_have_no_run_narrative():
    hits = [h for f in doc_files() for h in find_narrative(f, ROOT)]
    assert not hits, (
        "the docs read as a run log; say it by topic and cite the results folder instead:\n"
        + "\n".join(hits))


def test_docs_fit_their_length():
    long = {name: n for name, cap in MAX_LINES.items()
            if (n := len((ROOT / name).read_text(encoding="utf-8").splitlines())) > cap}
    assert not long, f"over the line limit {MAX_LINES}: {long}"


def test_narrative_checker_flags_planted_lines(tmp_path):
    lines = ["## The fourteenth session (2026-11-26)", "In session 24 the rows moved.",
             "See results/h100/paper-moda-s30 and s22b.", "## The thirtieth 2026-11-27 runs",
             "the twenty-third runs", "measured in run 5, call 4"]
    bad = tmp_path / "log.md"
    bad.write_text("\n".join(lines) + "\n", encoding="utf-8")
    hits = find_narrative(bad)
    flagged = {int(h.split(":")[1]) for h in hits}
    assert flagged == set(range(1, len(lines) + 1)), hits
    assert any("'session'" in h for h in hits) and any("run date" in h for h in hits)
    assert any("run-sequence id ('s22b')" in h for h in hits) and any("'the Nth runs'" in h for h in hits)


def test_narrative_checker_passes_topic_lines(tmp_path):
    good = tmp_path / "topic.md"
    good.write_text(
        "The variant d128x64w8s3 on sm_90 (s_max rows) ran 1.05x FA4 in results/h100/paper/.\n"
        "Rows 17-19 of the table; three runs of the same sweep; a run folder per question.\n"
        "The first run of a new shape compiles its kernels; version 0.1.0, s.t. nothing.\n"
        "At G=8 moda runs 0.69x FA2; `host_probe.py --calls 300` times 300 calls.\n",
        encoding="utf-8")
    assert find_narrative(good) == []


def _command_lines(text: str) -> set[str]:
    return {ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")}


def test_ci_runs_the_readme_commands():
    """The README's install line and test line are lines of .ci/run, so CI tests what users run."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.DOTALL)
    install = [ln.strip() for b in blocks for ln in b.splitlines() if ln.strip().endswith('-e ".[test]"')]
    test = [ln.strip() for b in blocks for ln in b.splitlines() if "pytest -q" in ln and "-m gpu" not in ln]
    assert install and test, "README has no install or test command block"
    ci = _command_lines((ROOT / ".ci" / "run").read_text(encoding="utf-8"))
    missing = [c for c in install[:1] + test[:1] if c not in ci]
    assert not missing, f".ci/run does not run the README's commands: {missing}"


def test_runbook_blocks_write_under_a_folder_the_user_sets():
    """Every run folder of the RUNBOOK's blocks (`R=...`, the `--out` of their commands) lies under
    `$RESULTS`, which the set-up block lets the user choose."""
    text = (ROOT / "docs" / "RUNBOOK.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL)
    assert any(re.search(r"^RESULTS=\$\{RESULTS:-[^}]+\}", b, flags=re.MULTILINE) for b in blocks)
    run_dirs = [m for b in blocks for m in re.findall(r"(?:^|[\s;(])R=(\S+)", b)]
    assert len(run_dirs) >= 14, run_dirs
    bad = [d for d in run_dirs if not d.startswith("$RESULTS/")]
    assert not bad, f"run folders not under $RESULTS: {bad}"
