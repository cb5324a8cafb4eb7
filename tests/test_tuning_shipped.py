"""Shipped configs and the memoised config resolution (CPU).

Resolution order: explicit config > installed user tuning cache > this GPU's shipped configs
(package data, moda_bench/kernels/moda/tuned/<gpu-slug>.json; here a temporary directory) >
heuristic default. `resolve_config` memoises its answers per (shape, dtype, device); an
installed cache's file is looked at no more than every `recheck_s` seconds.
"""
from __future__ import annotations

import json
import os
import time
import warnings
from pathlib import Path

import pytest
import torch

from moda_bench import tuning as tu
from moda_bench.kernels.moda import config as config_mod
from moda_bench.kernels.moda.config import MoDAConfig, check_config, default_config, resolve_config
from moda_bench.kernels.moda.validate import MoDAShape
from moda_bench.tuning import cache as cache_mod

GPU = "NVIDIA Fake H900 80GB"


def shape(T=16384, G=8, L=64, d=64, B=1, Hk=2) -> MoDAShape:
    return MoDAShape(B=B, T=T, Hq=G * Hk, Hk=Hk, d=d, L=L)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    """A temporary shipped directory, a fake GPU name, no user cache installed."""
    shipped = tmp_path / "tuned"
    shipped.mkdir()
    monkeypatch.setattr(config_mod, "SHIPPED_DIR", shipped)
    monkeypatch.setattr(config_mod, "current_gpu_name", lambda: GPU)
    monkeypatch.setattr(cache_mod, "current_gpu_name", lambda: GPU)
    monkeypatch.setenv(tu.ENV_CACHE, str(tmp_path / "env-cache.json"))
    monkeypatch.delenv(tu.ENV_NO_TUNING, raising=False)
    config_mod.reset_shipped()
    tu.stop_using()
    yield shipped
    tu.stop_using()
    config_mod.reset_shipped()


def _write_shipped(directory: Path, entries: dict, gpu: str = GPU) -> Path:
    path = config_mod.shipped_path(gpu, directory)
    path.write_text(json.dumps({"schema_version": config_mod.SHIPPED_SCHEMA_VERSION, "gpu": gpu,
                                "entries": entries}))
    config_mod.reset_shipped()
    return path


def _ship(directory: Path, sh: MoDAShape, cfg: MoDAConfig, dtype="bfloat16", **kw) -> Path:
    return _write_shipped(directory, {config_mod.shipped_key(sh, dtype, **kw): {"config": cfg.to_dict()}})


def _result(sh, cfg, decision="tuned"):
    return tu.TuneResult(sh, "bfloat16", cfg, 2.0, 1.5 if decision == "tuned" else 2.0, 1.0, decision=decision,
                         candidate=cfg, candidate_ms=1.5, ratio=0.75, ratio_lo=0.7, ratio_hi=0.8)


# ----------------------------------------------------------------------------- resolution order

def test_absent_or_empty_shipped_files_give_the_default(_isolated):
    sh = shape()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_config(sh, torch.bfloat16) == default_config(sh)  # no file at all
        _write_shipped(_isolated, {})
        assert resolve_config(sh, torch.bfloat16) == default_config(sh)  # a file without entries
    assert config_mod.gpu_slug(GPU) == "nvidia-fake-h900-80gb"
    assert config_mod.shipped_path("NVIDIA H200") == _isolated / "nvidia-h200.json"


def test_shipped_config_serves_its_gpu_triton_dtype_and_T_bucket_only(_isolated, monkeypatch):
    sh = shape(T=16384)
    shipped = default_config(sh).replace(bwd_depth_after=True, depth_warps=8)
    _ship(_isolated, sh, shipped)
    assert resolve_config(sh, torch.bfloat16) == shipped
    assert resolve_config(shape(T=9000), "bfloat16") == shipped  # same bucket (8193..16384)
    for other in (shape(T=8192), shape(T=16385), shape(G=4), shape(L=128), shape(d=128)):
        assert resolve_config(other, torch.bfloat16) == default_config(other), other
    assert resolve_config(sh, torch.float16) == default_config(sh)
    # another triton minor version: not used
    _ship(_isolated, sh, shipped, triton_version="9.9.0")
    assert resolve_config(sh, torch.bfloat16) == default_config(sh)


def test_a_different_gpu_gets_nothing(_isolated, monkeypatch):
    sh = shape()
    shipped = default_config(sh).replace(depth_warps=8)
    _ship(_isolated, sh, shipped)
    monkeypatch.setattr(config_mod, "current_gpu_name", lambda: "NVIDIA H200")
    config_mod.reset_shipped()
    assert resolve_config(sh, torch.bfloat16) == default_config(sh)
    # a file whose GPU field does not match its name (a copied file) is ignored, with a warning
    path = _ship(_isolated, sh, shipped)
    os.replace(path, config_mod.shipped_path("NVIDIA H200", _isolated))
    config_mod.reset_shipped()
    with pytest.warns(UserWarning, match="made for GPU"):
        assert resolve_config(sh, torch.bfloat16) == default_config(sh)


def test_user_cache_overrides_shipped_and_explicit_overrides_both(_isolated, tmp_path):
    sh = shape()
    shipped = default_config(sh).replace(depth_warps=8)
    user = default_config(sh).replace(depth_warps=2)
    _ship(_isolated, sh, shipped)
    assert resolve_config(sh, torch.bfloat16) == shipped  # no user cache installed: shipped
    tu.save_result(_result(sh, user), tmp_path / "user.json")
    tu.use(tmp_path / "user.json")
    assert resolve_config(sh, torch.bfloat16) == user  # user cache > shipped
    other = shape(T=4096)
    other_shipped = default_config(other).replace(num_warps=8)
    _write_shipped(_isolated, {config_mod.shipped_key(sh, "bfloat16"): {"config": shipped.to_dict()},
                               config_mod.shipped_key(other, "bfloat16"): {"config": other_shipped.to_dict()}})
    assert resolve_config(other, torch.bfloat16) == other_shipped  # user cache has no entry: shipped
    explicit = MoDAConfig(block_m=32)
    assert resolve_config(sh, torch.bfloat16, explicit) is explicit
    tu.stop_using()
    assert resolve_config(sh, torch.bfloat16) == shipped


def test_no_tuned_and_the_env_switch_turn_shipped_configs_off(_isolated, monkeypatch):
    sh = shape()
    shipped = default_config(sh).replace(depth_warps=8)
    _ship(_isolated, sh, shipped)
    with tu.using(False):  # sweep --no-tuned: heuristic defaults only
        assert resolve_config(sh, torch.bfloat16) == default_config(sh)
    assert resolve_config(sh, torch.bfloat16) == shipped
    with tu.using(True):  # the sweep's default: user cache (none here), then shipped
        assert resolve_config(sh, torch.bfloat16) == shipped
    monkeypatch.setenv(tu.ENV_NO_TUNING, "1")
    with tu.using(True) as cache:
        assert cache is None and resolve_config(sh, torch.bfloat16) == default_config(sh)
    config_mod.reset_shipped()  # the variable is read when a shape is first resolved
    assert resolve_config(sh, torch.bfloat16) == default_config(sh)


def test_an_invalid_shipped_entry_is_ignored_with_a_warning(_isolated):
    sh = shape()
    bad = dict(default_config(sh).to_dict(), block_m=48)
    _write_shipped(_isolated, {config_mod.shipped_key(sh, "bfloat16"): {"config": bad}})
    with pytest.warns(UserWarning, match="invalid"):
        assert resolve_config(sh, torch.bfloat16) == default_config(sh)
    (_isolated / f"{config_mod.gpu_slug(GPU)}.json").write_text("{not json")
    config_mod.reset_shipped()
    with pytest.warns(UserWarning, match="unreadable"):
        assert resolve_config(sh, torch.bfloat16) == default_config(sh)


# ----------------------------------------------------------------------------- export

def test_export_ships_only_tuned_entries_and_merges(_isolated, tmp_path):
    cache = tmp_path / "cache.json"
    a, b, c = shape(T=1024), shape(T=16384), shape(T=65536)
    cfg_a = default_config(a).replace(depth_warps=8)
    cfg_b = default_config(b).replace(bwd_depth_after=True)
    tu.save_result(_result(a, cfg_a), cache)
    tu.save_result(_result(b, default_config(b), decision="default"), cache)
    # an entry from before the decision was recorded: not shipped
    data = json.loads(cache.read_text())
    old = dict(data["entries"][tu.cache_key(a, "bfloat16")], decision=None)
    data["entries"][tu.cache_key(c, "bfloat16")] = dict(old, T_bucket=65536)
    del data["entries"][tu.cache_key(c, "bfloat16")]["decision"]
    # another GPU's entry goes to its own file
    data["entries"][tu.cache_key(a, "bfloat16", gpu="NVIDIA H200")] = dict(
        data["entries"][tu.cache_key(a, "bfloat16")], gpu="NVIDIA H200")
    tu.atomic_write_json(cache, data)
    # the shipped file already holds a stale tuned entry for b (removed: the newest decision is
    # 'default') and one for a key the cache does not have (kept)
    d = shape(G=4)
    _write_shipped(_isolated, {config_mod.shipped_key(b, "bfloat16"): {"config": cfg_b.to_dict()},
                               config_mod.shipped_key(d, "bfloat16"): {"config": default_config(d).to_dict()}})
    summaries = {s["gpu"]: s for s in tu.export_shipped(cache, _isolated)}
    assert set(summaries) == {GPU, "NVIDIA H200"}
    mine = summaries[GPU]
    assert (mine["added"], mine["dropped"], mine["total"]) == (1, 1, 2)
    assert any("unrecorded" in why for _, why in mine["skipped"])
    written = json.loads(config_mod.shipped_path(GPU, _isolated).read_text())
    assert written["gpu"] == GPU and written["schema_version"] == config_mod.SHIPPED_SCHEMA_VERSION
    assert set(written["entries"]) == {config_mod.shipped_key(a, "bfloat16"), config_mod.shipped_key(d, "bfloat16")}
    e = written["entries"][config_mod.shipped_key(a, "bfloat16")]
    assert e["config"] == cfg_a.to_dict() and e["ratio_hi"] == 0.8 and e["tuned_ms"] == 1.5
    assert config_mod.shipped_path("NVIDIA H200", _isolated).exists()
    config_mod.reset_shipped()
    assert resolve_config(a, torch.bfloat16) == cfg_a and resolve_config(b, torch.bfloat16) == default_config(b)


def test_export_shipped_command(_isolated, tmp_path):
    import typer
    from typer.testing import CliRunner

    from moda_bench.cli.tune import tune_command
    cache = tmp_path / "cache.json"
    sh = shape(T=1024)
    cfg = default_config(sh).replace(depth_warps=8)
    tu.save_result(_result(sh, cfg), cache)
    app = typer.Typer()
    app.command()(tune_command)
    out = tmp_path / "ship"
    res = CliRunner().invoke(app, ["--cache", str(cache), "--export-shipped", str(out)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "1 tuned config(s) exported" in res.output
    assert json.loads(config_mod.shipped_path(GPU, out).read_text())["entries"]
    res = CliRunner().invoke(app, ["--cache", str(tmp_path / "none.json"), "--export-shipped", str(out)])
    assert res.exit_code == 1 and "no tuning cache" in res.output


def test_package_data_ships_the_json_files():
    import tomllib
    root = Path(__file__).resolve().parents[1]
    data = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "tuned/*.json" in data["moda_bench.kernels.moda"]
    assert config_mod.SHIPPED_DIR.name == "tuned"
    assert Path(config_mod.__file__).with_name("tuned").is_dir()


# ----------------------------------------------------------------------------- memoised resolution

class CountingSource:
    """A config source with a stamp: its answers are memoised until the stamp changes."""

    def __init__(self, cfg):
        self.cfg, self.calls, self.token = cfg, 0, 0

    def __call__(self, shape, dtype):
        self.calls += 1
        return self.cfg

    def stamp(self):
        return self.token


def test_resolve_config_asks_a_stamped_source_once_per_shape():
    sh = shape()
    src = CountingSource(default_config(sh).replace(num_warps=8))
    config_mod.set_config_source(src)
    for _ in range(100):
        assert resolve_config(sh, torch.bfloat16) == src.cfg
    assert src.calls == 1
    resolve_config(shape(T=100), torch.bfloat16)
    assert src.calls == 2
    src.token += 1  # the source changed: asked again
    resolve_config(sh, torch.bfloat16)
    assert src.calls == 3
    plain = []
    config_mod.set_config_source(lambda s, d: plain.append(1) or None)  # no stamp: asked every call
    for _ in range(3):
        assert resolve_config(sh, torch.bfloat16) == default_config(sh)
    assert len(plain) == 3


def test_no_file_access_per_call_and_changes_seen_after_recheck(tmp_path, monkeypatch):
    sh = shape()
    path = tmp_path / "c.json"
    first = default_config(sh).replace(num_warps=8)
    tu.save_result(_result(sh, first), path)
    cache = tu.use(path)
    assert resolve_config(sh, torch.bfloat16) == first
    stats = []
    real_stat = os.stat
    monkeypatch.setattr(cache_mod.os, "stat", lambda *a, **k: stats.append(a) or real_stat(*a, **k))
    for _ in range(200):
        resolve_config(sh, torch.bfloat16)
    assert stats == []  # within recheck_s: no stat, no parse
    # another process rewrites the file (not through this module): seen after recheck_s / refresh()
    second = first.replace(num_warps=2)
    data = json.loads(path.read_text())
    data["entries"][tu.cache_key(sh, "bfloat16")]["config"] = second.to_dict()
    path.write_text(json.dumps(data) + " ")
    st = real_stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert resolve_config(sh, torch.bfloat16) == first
    cache.refresh()
    assert resolve_config(sh, torch.bfloat16) == second and stats
    n = len(stats)
    for _ in range(100):
        resolve_config(sh, torch.bfloat16)
    assert len(stats) == n
    cache.recheck_s = 0.0  # look at every call
    resolve_config(sh, torch.bfloat16)
    assert len(stats) > n


def test_check_config_memoises_accepted_configs_only():
    cfg = MoDAConfig(block_m=128, bwd_q_block_m=128)
    check_config(cfg, 8)
    check_config(cfg, 8)
    with pytest.raises(ValueError):
        check_config(cfg.replace(block_m=48), 8)
    with pytest.raises(ValueError):
        check_config(cfg.replace(block_m=48), 8)  # a failure is never memoised
    with pytest.raises(ValueError):
        check_config(cfg, 256)  # memoised per (config, G)


def test_resolution_host_cost_is_small():
    """A memoised look-up is a dict access: far below the ~50-100 us it cost before (CPU)."""
    sh = shape()
    tu.use()  # the sweep's setting: the env cache (absent here), then shipped, then default
    resolve_config(sh, torch.bfloat16)
    n = 2000
    t0 = time.perf_counter()
    for _ in range(n):
        resolve_config(sh, torch.bfloat16)
    per_call_us = (time.perf_counter() - t0) / n * 1e6
    assert per_call_us < 25, per_call_us


# ----------------------------------------------------------------------------- per operator (moda-fa4)

def test_moda_fa4_has_its_own_entries_and_falls_back_to_modas(_isolated, tmp_path):
    """op="moda-fa4" keys carry their prefix in the user cache and the shipped file; moda_fa4's
    resolution takes its own entry (user cache > shipped), and without one what moda would run;
    moda's resolution never sees moda-fa4's entries. The export keeps the prefix."""
    sh = shape()
    moda_cfg = default_config(sh).replace(depth_warps=2)
    fa4_shipped = default_config(sh).replace(fwd_depth="stream", depth_block_m=32)
    fa4_user = default_config(sh).replace(bwd_depth="stream", bwd_depth_warps=8)
    assert config_mod.shipped_key(sh, "bfloat16", op="moda-fa4") == "moda-fa4|" + config_mod.shipped_key(sh, "bfloat16")
    assert tu.cache_key(sh, "bfloat16", op="moda-fa4") == "moda-fa4|" + tu.cache_key(sh, "bfloat16")
    with pytest.raises(ValueError, match="unknown operator"):
        config_mod.shipped_key(sh, "bfloat16", op="flash")
    # nothing of its own: what moda runs (here moda's shipped config)
    _ship(_isolated, sh, moda_cfg)
    assert resolve_config(sh, torch.bfloat16, op="moda-fa4") == moda_cfg
    _write_shipped(_isolated, {config_mod.shipped_key(sh, "bfloat16"): {"config": moda_cfg.to_dict()},
                               config_mod.shipped_key(sh, "bfloat16", op="moda-fa4"):
                                   {"config": fa4_shipped.to_dict()}})
    assert resolve_config(sh, torch.bfloat16, op="moda-fa4") == fa4_shipped
    assert resolve_config(sh, torch.bfloat16) == moda_cfg
    # the user cache: a moda-fa4 result is stored under the prefixed key and wins over shipped
    res = _result(sh, fa4_user)
    res.op = "moda-fa4"
    key, _ = tu.save_result(res, tmp_path / "user.json")
    assert key == tu.cache_key(sh, "bfloat16", op="moda-fa4")
    tu.use(tmp_path / "user.json")
    assert resolve_config(sh, torch.bfloat16, op="moda-fa4") == fa4_user
    assert resolve_config(sh, torch.bfloat16) == moda_cfg   # the cache has no moda entry: moda's shipped
    tu.stop_using()
    # export: the entry keeps its operator
    out = tmp_path / "export"
    out.mkdir()
    tu.export_shipped(tmp_path / "user.json", out)
    written = json.loads(config_mod.shipped_path(GPU, out).read_text())["entries"]
    assert set(written) == {config_mod.shipped_key(sh, "bfloat16", op="moda-fa4")}
    assert written[config_mod.shipped_key(sh, "bfloat16", op="moda-fa4")]["config"] == fa4_user.to_dict()


def test_tune_command_op_errors(_isolated):
    """--op: an unknown operator, moda-fa4 at L=0 or with tile groups only: one-line errors before
    anything needs a GPU."""
    import re

    from typer.testing import CliRunner

    from moda_bench.cli import app

    def run(*args):
        r = CliRunner().invoke(app, ["tune", *args])
        return r.exit_code, re.sub(r"[\s│╭╮╰╯─]+", " ", r.output)   # the message, unwrapped from its box
    code, text = run("--op", "flash")
    assert code != 0 and "unknown operator 'flash'" in text
    code, text = run("--op", "moda-fa4", "--L", "0")
    assert code != 0 and "no depth launches at L=0" in text
    code, text = run("--op", "moda-fa4", "--kernels", "fwd,bwd_q")
    assert code != 0 and "tunes only fwd_depth, bwd_depth" in text


# ----------------------------------------------------------------------------- moda-overlap's program counts

def test_overlap_groups_search_program_counts_around_the_heuristic():
    from moda_bench.kernels.moda.fa4.overlap import overlap_heuristic
    sh = shape()
    base = overlap_heuristic(sh, "bfloat16", "cpu")
    assert base.fwd_depth == "persist" and base.depth_ctas > 0 and base.bwd_depth_ctas > 0
    space = tu.search_space(sh, "fwd_ctas", base)
    counts = [c.depth_ctas for c in space]
    assert counts[0] == base.depth_ctas and len(set(counts)) == len(counts) >= 4 and min(counts) >= 2
    assert all(c.replace(depth_ctas=base.depth_ctas) == base for c in space)   # only the count moves
    assert {c.bwd_depth_ctas for c in tu.search_space(sh, "bwd_ctas", base)} >= {base.bwd_depth_ctas}
    assert all(tu.prune_reason(c, sh, "fwd_ctas") is None for c in space)
    with pytest.raises(ValueError, match="program count"):
        tu.search_space(sh, "fwd_ctas", default_config(sh))   # no count to tune around


class CtasFakeTimer(tu.Timer):
    """A depth tail below the best count, a lost SM per program above it: forward best at 20,
    backward at 40; any other field costs nothing."""

    def time(self, cfg, pass_, final=False):
        fwd = 1.0 + max(0, 20 - cfg.depth_ctas) * 0.05 + cfg.depth_ctas * 0.002
        bwd = 2.0 + max(0, 40 - cfg.bwd_depth_ctas) * 0.05 + cfg.bwd_depth_ctas * 0.002
        return {"fwd": fwd, "bwd": bwd}.get(pass_, fwd + bwd)


def test_tune_shape_moves_overlap_program_counts_from_its_default(_isolated, tmp_path):
    """op moda-overlap: starts from and compares against the given default (the heuristic), tunes
    only the counts, and its stored entry is what overlap_config answers (scaled when detached)."""
    from moda_bench.kernels.moda.fa4.overlap import overlap_config, overlap_heuristic
    sh = shape()
    base = overlap_heuristic(sh, "bfloat16", "cpu").replace(depth_ctas=10, bwd_depth_ctas=20)
    res = tu.tune_shape(sh, "bfloat16", CtasFakeTimer(), kernels=tu.OVERLAP_GROUPS, budget=12, op="moda-overlap",
                        default=base)
    assert res.decision == "tuned" and res.config.depth_ctas == 20 and res.config.bwd_depth_ctas == 40
    assert res.config.replace(depth_ctas=10, bwd_depth_ctas=20) == base
    key, _ = tu.save_result(res, tmp_path / "user.json")
    assert key == tu.cache_key(sh, "bfloat16", op="moda-overlap")
    tu.use(tmp_path / "user.json")
    assert overlap_config(sh, torch.bfloat16, "cpu") == res.config
    assert overlap_config(sh, torch.bfloat16, "cpu", depth_grad=False).bwd_depth_ctas == 24   # ceil(40 * 0.6)
    assert resolve_config(sh, torch.bfloat16) == default_config(sh)   # moda never sees it
    tu.stop_using()
    assert overlap_config(sh, torch.bfloat16, "cpu") == overlap_heuristic(sh, torch.bfloat16, "cpu")


def test_tune_command_overlap_errors(_isolated):
    """--op moda-overlap takes only its groups, needs L > 0; the others refuse its groups."""
    import re

    from typer.testing import CliRunner

    from moda_bench.cli import app

    def run(*args):
        r = CliRunner().invoke(app, ["tune", *args])
        return r.exit_code, re.sub(r"[\s│╭╮╰╯─]+", " ", r.output)
    code, text = run("--op", "moda-overlap", "--kernels", "fwd_ctas,fwd")
    assert code != 0 and "moda-overlap tunes only fwd_items, fwd_ctas, bwd_kernel, bwd_items, bwd_ctas" in text
    code, text = run("--op", "moda-overlap", "--L", "0")
    assert code != 0 and "no depth launches at L=0" in text
    code, text = run("--kernels", "bwd_ctas")
    assert code != 0 and "moda-overlap's groups" in text


def test_overlap_item_groups_search_the_streaming_items():
    """fwd_items / bwd_items: rows per item (at least GP), depth steps in flight and warps of the
    persist kernels, base first, nothing else moves; they refuse a base that is not moda-overlap's."""
    from moda_bench.kernels.moda.fa4.overlap import overlap_heuristic
    for G in (2, 8, 32):
        sh = shape(G=G)
        base = overlap_heuristic(sh, "bfloat16", "cpu")
        for group, rows_field in (("fwd_items", "depth_block_m"), ("bwd_items", "bwd_depth_block_m")):
            space = tu.search_space(sh, group, base)
            assert space[0] == base and len(space) == len(set(space)) > 6
            names = tu.KERNEL_FIELDS[group]
            assert all(c.replace(**{n: getattr(base, n) for n in names}) == base for c in space)
            gp = max(2, 1 << (G - 1).bit_length())
            assert all(getattr(c, rows_field) % gp == 0 and getattr(c, rows_field) >= gp for c in space)
            # only items the kernel would shrink to fit the shared memory are pruned (`depth_smem`)
            pruned = [c for c in space if tu.prune_reason(c, sh, group) is not None]
            assert all(tu.prune_reason(c, sh, group).startswith("shared memory:") for c in pruned)
            assert base not in pruned and (G < 32 or group == "bwd_items" or pruned)
    with pytest.raises(ValueError, match="persist"):
        tu.search_space(shape(), "fwd_items", default_config(shape()))
    # opt-in: `tune --op moda-overlap` searches the counts unless --kernels names the item groups
    assert tu.OVERLAP_DEFAULT == ("fwd_ctas", "bwd_kernel", "bwd_ctas")
    assert set(tu.OVERLAP_DEFAULT) < set(tu.OVERLAP_GROUPS)


class ItemsFakeTimer(CtasFakeTimer):
    """As CtasFakeTimer, plus: forward items of 64 rows (not the heuristic's) and backward items of
    4 stages x 8 warps stream fastest (a slower item needs more programs: its penalty shrinks as the count grows)."""

    def time(self, cfg, pass_, final=False):
        fwd = 1.0 + max(0, 20 - cfg.depth_ctas) * 0.05 + cfg.depth_ctas * 0.002
        fwd += 0.0 if cfg.depth_block_m == 64 else 4.0 / cfg.depth_ctas
        bwd = 2.0 + max(0, 40 - cfg.bwd_depth_ctas) * 0.05 + cfg.bwd_depth_ctas * 0.002
        bwd += 0.0 if (cfg.bwd_depth_stages, cfg.bwd_depth_warps) == (4, 8) else 8.0 / cfg.bwd_depth_ctas
        return {"fwd": fwd, "bwd": bwd}.get(pass_, fwd + bwd)


def test_tune_shape_overlap_tunes_items_then_counts(_isolated):
    from moda_bench.kernels.moda.fa4.overlap import overlap_heuristic
    sh = shape()
    base = overlap_heuristic(sh, "bfloat16", "cpu").replace(depth_ctas=10, bwd_depth_ctas=20)
    assert base.depth_block_m != 64 and (base.bwd_depth_stages, base.bwd_depth_warps) != (4, 8)
    res = tu.tune_shape(sh, "bfloat16", ItemsFakeTimer(), kernels=tu.OVERLAP_GROUPS, budget=24, op="moda-overlap",
                        default=base)
    c = res.config
    assert res.decision == "tuned"
    assert c.depth_block_m == 64 and (c.bwd_depth_stages, c.bwd_depth_warps) == (4, 8)
    assert c.depth_ctas == 20 and c.bwd_depth_ctas == 40
    assert c.fwd_depth == c.bwd_depth == "persist"


def test_bwd_kernel_group_offers_the_other_kernel_at_the_same_share():
    """bwd_kernel: the base's backward depth kernel first, then the other at the count that takes the
    same share of the SMs (Triton's 96 <-> CuTe's 32); CuTe only where it takes the shape; Triton's
    item group has nothing to move under CuTe."""
    from moda_bench.kernels.moda.fa4.overlap import overlap_heuristic, same_share_bwd_programs
    sh = shape()
    base = overlap_heuristic(sh, "bfloat16", "cpu").replace(bwd_depth_ctas=96)
    assert base.bwd_depth_kernel == "triton"   # no FA4 here: the heuristic keeps Triton's kernel
    space = tu.search_space(sh, "bwd_kernel", base)
    assert space == [base, base.replace(bwd_depth_kernel="cute", bwd_depth_ctas=32)]
    back = tu.search_space(sh, "bwd_kernel", space[1])
    assert back == [space[1], space[1].replace(bwd_depth_kernel="triton", bwd_depth_ctas=96)]
    assert same_share_bwd_programs(24, "cute") == 12 and same_share_bwd_programs(12, "triton") == 36
    assert tu.search_space(shape(G=32), "bwd_kernel", overlap_heuristic(shape(G=32), "bfloat16", "cpu")) == \
        [overlap_heuristic(shape(G=32), "bfloat16", "cpu")]   # G=32 does not divide 16
    assert tu.search_space(sh, "bwd_items", space[1]) == [space[1]]
    assert all(tu.prune_reason(c, sh, "bwd_kernel") is None for c in space)
    with pytest.raises(ValueError, match="bwd_kernel tunes"):
        tu.search_space(sh, "bwd_kernel", default_config(sh))


class KernelFakeTimer(CtasFakeTimer):
    """As CtasFakeTimer, but CuTe's backward programs stream 3x Triton's: its best count is a third."""

    def time(self, cfg, pass_, final=False):
        if cfg.bwd_depth_kernel != "cute" or pass_ == "fwd":
            return super().time(cfg, pass_, final)
        bwd = 1.8 + max(0, 14 - cfg.bwd_depth_ctas) * 0.05 + cfg.bwd_depth_ctas * 0.002
        return bwd if pass_ == "bwd" else super().time(cfg, "fwd") + bwd


def test_tune_shape_overlap_picks_the_backward_kernel_then_its_count(_isolated):
    from moda_bench.kernels.moda.fa4.overlap import overlap_heuristic
    sh = shape()
    base = overlap_heuristic(sh, "bfloat16", "cpu").replace(depth_ctas=20, bwd_depth_ctas=40)
    res = tu.tune_shape(sh, "bfloat16", KernelFakeTimer(), kernels=tu.OVERLAP_DEFAULT, budget=12, op="moda-overlap",
                        default=base)
    assert res.decision == "tuned" and res.config.bwd_depth_kernel == "cute"
    assert res.config.bwd_depth_ctas == 14 and res.config.depth_ctas == 20
