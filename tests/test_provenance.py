"""Rows name the code they were made with: the source digest in `git_commit` when the checkout
differs from its .git, and `tools/run_json.py` finding the commit a digest belongs to."""
from __future__ import annotations

import subprocess

import pytest
from helpers import load_tool

from moda_bench import schema


def test_source_digest_depends_on_paths_and_contents_not_order():
    a = [("moda_bench/a.py", b"x = 1\n"), ("moda_bench/b.py", b"y = 2\n")]
    d = schema.source_digest(a)
    assert len(d) == 10 and int(d, 16) >= 0
    assert schema.source_digest(list(reversed(a))) == d
    assert schema.source_digest([("moda_bench/a.py", b"x = 2\n"), a[1]]) != d
    assert schema.source_digest([("moda_bench/c.py", b"x = 1\n"), a[1]]) != d
    # the path/contents boundary is part of the digest
    assert schema.source_digest([("moda_bench/a.p", b"yx = 1\n"), a[1]]) != d


def test_package_sources_are_this_package():
    files = dict(schema.package_sources())
    assert "moda_bench/schema.py" in files and files["moda_bench/schema.py"].startswith(b'"""')
    assert all(p.startswith("moda_bench/") and p.endswith(".py") for p in files)


def test_git_commit_names_dirty_code_by_its_digest(monkeypatch):
    schema.git_commit.cache_clear()
    try:
        value = schema.git_commit()
        if value.startswith("unknown") or "-dirty" in value:
            assert value.endswith("+src" + schema.source_digest(schema.package_sources()))
        else:
            assert "+src" not in value and len(value) == 12
        monkeypatch.setenv("MODA_BENCH_GIT_COMMIT", "given")
        schema.git_commit.cache_clear()
        assert schema.git_commit() == "given"
    finally:
        schema.git_commit.cache_clear()


def _git(repo, *args):
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    try:
        _git(tmp_path, "init", "-q")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("git not available")
    _git(tmp_path, "config", "user.email", "t@example.com")
    _git(tmp_path, "config", "user.name", "t")
    (tmp_path / "moda_bench").mkdir()
    shas = []
    for i, text in enumerate((b"v = 1\n", b"v = 2\n")):
        (tmp_path / "moda_bench" / "m.py").write_bytes(text)
        (tmp_path / "moda_bench" / "notes.txt").write_text(f"not code {i}\n")
        _git(tmp_path, "add", "-A")
        _git(tmp_path, "commit", "-qm", f"c{i}")
        shas.append(_git(tmp_path, "rev-parse", "--short=12", "HEAD"))
    return tmp_path, shas


def test_run_json_finds_the_commit_of_a_digest(repo):
    path, (first, second) = repo
    run_json = load_tool("run_json")
    digest = schema.source_digest([("moda_bench/m.py", b"v = 1\n")])
    assert run_json.commit_of_digest(digest, path) == first
    assert run_json.commit_of_digest(schema.source_digest([("moda_bench/m.py", b"v = 2\n")]), path) == second
    assert run_json.commit_of_digest("0000000000", path) is None
    facts = {"commit": f"{second}-dirty+src{digest}"}
    run_json.resolve_commits(facts, path)
    assert facts == {"commit": first, "commit_rows": f"{second}-dirty+src{digest}"}
    unknown = {"commit": [f"{second}-dirty+src0000000000", first]}
    run_json.resolve_commits(unknown, path)
    assert unknown == {"commit": [f"{second}-dirty+src0000000000", first]}  # not all found: left as it is
