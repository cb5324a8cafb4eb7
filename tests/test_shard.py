"""Multi-GPU / multi-node sharding on CPU: LPT plan, fake per-GPU workers (one crashes), merged
CSV schema and gpu_index, rank shards + `moda-bench merge`, torchrun environment detection."""
from __future__ import annotations

import json
import random
import sys

import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

from moda_bench.sweeps import runner, schema, shard
from moda_bench.sweeps.runner import Point
from moda_bench.sweeps.runner import append_row
from moda_bench.sweeps.worker import fake_row

PROVIDERS = ["moda", "fa2"]
FAKE_WORKER = [sys.executable, "-m", shard.WORKER_MODULE, "--fake"]


def random_points(n: int, seed: int) -> list[Point]:
    """n distinct random points (a fixed seed gives a fixed list)."""
    rng = random.Random(seed)
    points: dict[Point, None] = {}
    while len(points) < n:
        points[Point(T=rng.choice([256, 1024, 2048, 4096, 8192]), G=rng.choice([1, 2, 4, 8]),
                     Hk=rng.choice([2, 8]), L=rng.choice([0, 16, 64, 256]), B=rng.choice([1, 2]),
                     d=rng.choice([64, 128]), C=64)] = None
    return list(points)


def key_of(row) -> tuple:
    return tuple(row[c] for c in schema.KEY_COLUMNS)


def expected_keys(points, providers, pass_="fwdbwd") -> set:
    return {key_of({**p.to_dict(), "provider": prov, "pass": pass_, "dtype": p.dtype})
            for p in points for prov in providers}


# ---------------------------------------------------------------------------------------------
# planning
# ---------------------------------------------------------------------------------------------

def test_assignment_covers_every_point_once_and_is_deterministic():
    points = random_points(57, seed=1)
    for n_shards in (1, 2, 3, 8, 64):
        plan = shard.assign_points(points, n_shards, "fwdbwd", n_providers=3)
        assert len(plan) == n_shards
        flat = [i for s in plan for i in s]
        assert sorted(flat) == list(range(len(points)))  # every point exactly once
        assert plan == shard.assign_points(list(points), n_shards, "fwdbwd", n_providers=3)
        # the provider count scales every cost equally: same plan
        assert plan == shard.assign_points(points, n_shards, "fwdbwd", n_providers=1)


def test_assignment_is_balanced_by_cost():
    points = random_points(80, seed=7)
    m = 4
    costs = [shard.point_cost(p, "fwd", 2) for p in points]
    plan = shard.assign_points(points, m, "fwd", n_providers=2)
    loads = [sum(costs[i] for i in s) for s in plan]
    total, biggest = sum(costs), max(costs)
    # list-scheduling bound (holds for any greedy order): makespan <= total/m + (1 - 1/m) * max cost
    assert max(loads) <= total / m + (1 - 1 / m) * biggest + 1e-6 * total
    # cost-aware beats splitting by point count on this skewed sweep
    by_count = [points[k::m] for k in range(m)]
    count_makespan = max(sum(shard.point_cost(p, "fwd", 2) for p in s) for s in by_count)
    assert max(loads) < count_makespan


def test_assignment_exact_small_case():
    # T=1 makes the cost proportional to (1 + L): costs 2, 3, 4, 2, 2, 3 units; LPT splits 8 / 8
    points = [Point(T=1, L=l) for l in (1, 2, 3, 1, 1, 2)]
    plan = shard.assign_points(points, 2, "fwd")
    costs = [1 + p.L for p in points]
    assert [sum(costs[i] for i in s) for s in plan] == [8, 8]
    assert plan == [[0, 2, 3], [1, 4, 5]]  # pinned: ties go to the lower point / lower shard
    with pytest.raises(ValueError):
        shard.assign_points(points, 0, "fwd")


def test_points_json_roundtrip():
    points = random_points(9, seed=3) + [Point(dtype="float16")]
    assert shard.points_from_json(shard.points_to_json(points)) == points


def test_resolve_gpus(monkeypatch):
    monkeypatch.setattr(shard, "_cuda_device_count", lambda: 4)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert [s.index for s in shard.resolve_gpus("all")] == [0, 1, 2, 3]
    assert [s.index for s in shard.resolve_gpus(2)] == [0, 1]
    assert [(s.token, s.index) for s in shard.resolve_gpus("5,7")] == [("5", 5), ("7", 7)]
    assert [s.index for s in shard.resolve_gpus("3,")] == [3]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5,7")  # physical indices survive the remap
    assert [s.index for s in shard.resolve_gpus("all")] == [2, 5, 7]
    assert [s.token for s in shard.resolve_gpus("2")] == ["2", "5"]
    for bad in ("0", "4", "two", "1,x", "1,1"):
        with pytest.raises(typer.BadParameter):
            shard.resolve_gpus(bad)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(shard, "_cuda_device_count", lambda: 0)
    with pytest.raises(typer.BadParameter, match="no CUDA GPU"):
        shard.resolve_gpus("all")


# ---------------------------------------------------------------------------------------------
# one node: worker processes
# ---------------------------------------------------------------------------------------------

def test_run_sharded_fake_workers_one_crashes(tmp_path):
    points = random_points(10, seed=11)
    gpus = [0, 1, 3]
    csv = tmp_path / "res" / "sweep.csv"

    def worker_cmd(slot):
        return FAKE_WORKER + (["--fake-fail-after", "1"] if slot.index == 1 else [])

    plan = shard.assign_points(points, len(gpus), "fwdbwd", len(PROVIDERS))
    assert all(len(s) >= 1 for s in plan) and len(plan[1]) >= 1
    rows = shard.run_sharded(points, PROVIDERS, "fwdbwd", csv, sweep_name="t", gpus="0,1,3",
                             progress=False, worker_cmd=worker_cmd, poll_s=0.05)

    failures = rows.attrs["worker_failures"]
    assert [(f.gpu_index, f.returncode, f.rows_written) for f in failures] == [(1, 3, 1)]
    assert failures[0].rows_expected == len(plan[1]) * len(PROVIDERS)
    assert "simulated crash" in failures[0].log_tail

    merged = pd.read_csv(csv)
    assert list(merged.columns) == schema.COLUMNS
    assert len(merged) == len(rows)
    # the healthy workers' rows are all there, with the physical GPU index and their own device
    for gpu, idx in zip(gpus, plan):
        mine = merged[merged.gpu_index == gpu]
        assert (mine.impl_detail == f"fake (CUDA_VISIBLE_DEVICES={gpu})").all()
        got = {key_of(r) for _, r in mine.iterrows()}
        want = expected_keys([points[i] for i in idx], PROVIDERS)
        if gpu == 1:
            assert len(got) == 1 and got <= want  # the row written before the crash survives
        else:
            assert got == want
    assert not merged.duplicated(subset=schema.KEY_COLUMNS).any()
    # shards of a failed run are kept for inspection
    assert shard.shard_path(csv, "gpu", 1).exists() and shard.shard_path(csv, "gpu", 1, ".log").exists()


def test_run_sharded_success_merges_and_appends(tmp_path):
    points = random_points(7, seed=5)
    csv = tmp_path / "sweep.csv"
    old = fake_row(Point(T=64), "moda", "fwdbwd", "older-run", gpu_index=0)
    old["timestamp"] = "2020-01-01T00:00:00+00:00"
    append_row(csv, old)

    rows = shard.run_sharded(points, PROVIDERS, "fwdbwd", csv, sweep_name="t", gpus="0,1", progress=True,
                             worker_cmd=FAKE_WORKER, poll_s=0.05)
    assert rows.attrs["worker_failures"] == []
    assert {key_of(r) for _, r in rows.iterrows()} == expected_keys(points, PROVIDERS)
    assert len(rows) == len(points) * len(PROVIDERS)
    merged = pd.read_csv(csv)
    assert list(merged.columns) == schema.COLUMNS
    assert len(merged) == len(rows) + 1 and (merged.sweep == "older-run").sum() == 1
    plan = shard.assign_points(points, 2, "fwdbwd", len(PROVIDERS))
    this_run = merged[merged.sweep == "t"]
    for gpu, idx in enumerate(plan):
        assert {key_of(r) for _, r in this_run[this_run.gpu_index == gpu].iterrows()} == \
            expected_keys([points[i] for i in idx], PROVIDERS)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.csv"]  # shards cleaned up


def test_real_worker_without_gpu_fails_cleanly(tmp_path):
    csv = tmp_path / "s.csv"
    rows = shard.run_sharded([Point(T=128)], ["moda"], "fwd", csv, sweep_name="t", gpus="0,",
                             progress=False, poll_s=0.05)
    (failure,) = rows.attrs["worker_failures"]
    assert failure.returncode == 2 and "no CUDA device visible" in failure.log_tail
    assert len(rows) == 0


# ---------------------------------------------------------------------------------------------
# several nodes: torchrun ranks + merge
# ---------------------------------------------------------------------------------------------

def test_detect_distributed():
    assert shard.detect_distributed({}) is None
    assert shard.detect_distributed({"LOCAL_RANK": "0"}) is None
    info = shard.detect_distributed({"RANK": "9", "WORLD_SIZE": "16", "LOCAL_RANK": "1"})
    assert (info.rank, info.world_size, info.local_rank) == (9, 16, 1)
    assert shard.detect_distributed({"RANK": "2", "WORLD_SIZE": "4"}).local_rank == 2
    for bad in ({"RANK": "4", "WORLD_SIZE": "4"}, {"RANK": "x", "WORLD_SIZE": "4"},
                {"RANK": "0", "WORLD_SIZE": "0"}):
        with pytest.raises(ValueError):
            shard.detect_distributed(bad)


def fake_run_sweep(points, providers, pass_, csv_path, *, sweep_name, device_index=None, pin_chunk=None, **_):
    """Stand-in for runner.run_sweep: rows with gpu_index = the device index it was given."""
    for p in points:
        for prov in providers:
            append_row(csv_path, fake_row(p, prov, pass_, sweep_name, gpu_index=device_index or 0,
                                          pin_chunk=bool(pin_chunk)))


def test_rank_shards_then_merge(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "run_sweep", fake_run_sweep)
    monkeypatch.setenv(shard.GPU_INDEX_ENV, "unset")  # restored after the test
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")
    points = random_points(11, seed=2)
    csv = tmp_path / "shards" / "paper.csv"
    world, per_node = 6, 3
    for rank in range(world):
        dist = shard.detect_distributed({"RANK": str(rank), "WORLD_SIZE": str(world),
                                         "LOCAL_RANK": str(rank % per_node)})
        frame = shard.run_distributed(points, PROVIDERS, "fwdbwd", csv, sweep_name="paper", dist=dist,
                                      progress=False)
        assert (frame.gpu_index == 4 + rank % per_node).all()  # physical index behind CUDA_VISIBLE_DEVICES
        mine = shard.rank_points(points, dist, "fwdbwd", len(PROVIDERS))
        assert len(frame) == len(mine) * len(PROVIDERS)
    assert sorted(p.name for p in csv.parent.iterdir()) == [f"paper.rank{r}.csv" for r in range(world)]

    app = typer.Typer()
    app.command()(shard.merge_command)
    out = tmp_path / "merged.csv"
    # the directory and one of its files again: duplicates on key + timestamp are dropped
    res = CliRunner().invoke(app, [str(csv.parent), str(shard.shard_path(csv, "rank", 0)), "--out", str(out)])
    assert res.exit_code == 0, res.output
    merged = pd.read_csv(out)
    assert list(merged.columns) == schema.COLUMNS
    assert len(merged) == len(points) * len(PROVIDERS)
    assert {key_of(r) for _, r in merged.iterrows()} == expected_keys(points, PROVIDERS)
    # deterministic: merging the files in another order gives the same bytes
    files = sorted(csv.parent.glob("*.csv"), reverse=True)
    out2 = tmp_path / "merged2.csv"
    shard.merge_shards(files, out2)
    assert out.read_bytes() == out2.read_bytes()
    sort_keys = list(merged[shard.SORT_COLUMNS].itertuples(index=False))
    assert sort_keys == sorted(sort_keys)


def test_merge_rejects_mismatched_shard_and_drops_torn_line(tmp_path):
    good = tmp_path / "a.rank0.csv"
    for l in (0, 8):
        append_row(good, fake_row(Point(T=128, L=l), "moda", "fwd", "s"))
    with open(good, "a") as fh:  # a worker killed mid-write leaves a torn last line
        fh.write("s,moda,fake,fwd,12")
    assert len(shard.read_shard(good)) == 2

    bad = tmp_path / "b.rank1.csv"
    pd.read_csv(good).drop(columns=["tflops"]).to_csv(bad, index=False)
    app = typer.Typer()
    app.command()(shard.merge_command)
    res = CliRunner().invoke(app, [str(good), str(bad), "--out", str(tmp_path / "m.csv")])
    assert res.exit_code == 1
    text = "".join(res.output.split())
    assert str(bad) in text and "tflops" in text and "Traceback" not in res.output
    assert not (tmp_path / "m.csv").exists()

    res = CliRunner().invoke(app, [str(tmp_path / "nope"), "--out", str(tmp_path / "m.csv")])
    assert res.exit_code == 2 and "nope" in res.output


def test_chunk_pinning_follows_the_whole_sweep(tmp_path, monkeypatch):
    """Each shard below holds a single C; block_m must still be pinned since the sweep varies C."""
    monkeypatch.setattr(runner, "run_sweep", fake_run_sweep)
    monkeypatch.setenv(shard.GPU_INDEX_ENV, "unset")
    points = [Point(T=1024, C=32), Point(T=1024, C=64)]
    for pts, want in ((points, True), (points[:1], False)):
        rows = shard.run_sharded(pts, ["moda"], "fwd", tmp_path / f"s{want}.csv", sweep_name="paper",
                                 gpus="0,1", progress=False, worker_cmd=FAKE_WORKER, poll_s=0.05)
        assert len(rows) == len(pts)
        assert all(json.loads(c) == {"pin_chunk": want} for c in rows.config)
        for rank in range(2):
            frame = shard.run_distributed(pts, ["moda"], "fwd", tmp_path / f"d{want}.csv", sweep_name="paper",
                                          dist=shard.DistInfo(rank, 2, rank), progress=False)
            assert all(json.loads(c) == {"pin_chunk": want} for c in frame.config)


def test_run_sharded_refuses_an_output_with_another_schema(tmp_path):
    csv = tmp_path / "old.csv"
    csv.write_text("a,b\n1,2\n")
    with pytest.raises(typer.BadParameter, match="old.csv"):
        shard.run_sharded([Point(T=128)], ["moda"], "fwd", csv, sweep_name="t", gpus="0,", progress=False,
                          worker_cmd=FAKE_WORKER)
    assert not list(tmp_path.glob("old.gpu*"))  # nothing was started
