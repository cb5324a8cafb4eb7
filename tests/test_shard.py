"""Multi-GPU / multi-node sharding on CPU: LPT plan, pooled multi-sweep runs with fake per-GPU
workers (tests/fake_worker.py, the pool's worker_cmd) pulling from a shared queue (one crashes),
per-sweep CSVs, schema and gpu_index, rank shards + `moda-bench merge`, torchrun environment
detection."""
from __future__ import annotations

import json
import os
import random
import re
import sys

import fake_worker
import pandas as pd
import pytest
import typer
from fake_worker import fake_row
from typer.testing import CliRunner

from moda_bench import schema
from moda_bench.bench import runner
from moda_bench.bench.pool import distributed, local, merge
from moda_bench.bench.pool import plan as planning
from moda_bench.bench.runner import Point
from moda_bench.bench.spec import RunSpec
from moda_bench.cli.sweep import merge_command, sweep_command
from moda_bench.results import append_row

PROVIDERS = ["moda", "fa2"]
FAKE_WORKER = fake_worker.COMMAND


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
    return {key_of({**p.to_dict(), "provider": prov, "pass": pass_, "dtype": p.dtype, "timer": "eager"})
            for p in points for prov in providers}


# ---------------------------------------------------------------------------------------------
# planning
# ---------------------------------------------------------------------------------------------

def test_assignment_covers_every_point_once_and_is_deterministic():
    points = random_points(57, seed=1)
    for n_shards in (1, 2, 3, 8, 64):
        plan = planning.assign_points(points, n_shards, "fwdbwd", n_providers=3)
        assert len(plan) == n_shards
        flat = [i for s in plan for i in s]
        assert sorted(flat) == list(range(len(points)))  # every point exactly once
        assert plan == planning.assign_points(list(points), n_shards, "fwdbwd", n_providers=3)
        # the provider count scales every cost equally: same plan
        assert plan == planning.assign_points(points, n_shards, "fwdbwd", n_providers=1)


def test_assignment_is_balanced_by_cost():
    points = random_points(80, seed=7)
    m = 4
    costs = [planning.point_cost(p, "fwd", 2) for p in points]
    plan = planning.assign_points(points, m, "fwd", n_providers=2)
    loads = [sum(costs[i] for i in s) for s in plan]
    total, biggest = sum(costs), max(costs)
    # list-scheduling bound (holds for any greedy order): makespan <= total/m + (1 - 1/m) * max cost
    assert max(loads) <= total / m + (1 - 1 / m) * biggest + 1e-6 * total
    # cost-aware beats splitting by point count on this skewed sweep
    by_count = [points[k::m] for k in range(m)]
    count_makespan = max(sum(planning.point_cost(p, "fwd", 2) for p in s) for s in by_count)
    assert max(loads) < count_makespan


def test_assignment_exact_small_case():
    # T=1 makes the cost proportional to (1 + L): costs 2, 3, 4, 2, 2, 3 units; LPT splits 8 / 8
    points = [Point(T=1, L=l) for l in (1, 2, 3, 1, 1, 2)]
    plan = planning.assign_points(points, 2, "fwd")
    costs = [1 + p.L for p in points]
    assert [sum(costs[i] for i in s) for s in plan] == [8, 8]
    assert plan == [[0, 2, 3], [1, 4, 5]]  # pinned: ties go to the lower point / lower shard
    with pytest.raises(ValueError):
        planning.assign_points(points, 0, "fwd")


def test_point_dict_roundtrip():
    """What the pool sends a worker (Point.fields) and what run.json holds (to_dict, with Hq)."""
    points = random_points(9, seed=3) + [Point(dtype="float16")]
    assert [Point.from_dict(json.loads(json.dumps(p.fields()))) for p in points] == points
    assert [Point.from_dict(p.to_dict()) for p in points] == points
    assert Point().fields() == schema.BASE_POINT  # one spelling of the base point


def test_resolve_gpus(monkeypatch):
    monkeypatch.setattr(planning, "_cuda_device_count", lambda: 4)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert [s.index for s in planning.resolve_gpus("all")] == [0, 1, 2, 3]
    assert [s.index for s in planning.resolve_gpus(2)] == [0, 1]
    assert [(s.token, s.index) for s in planning.resolve_gpus("5,7")] == [("5", 5), ("7", 7)]
    assert [s.index for s in planning.resolve_gpus("3,")] == [3]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5,7")  # physical indices survive the remap
    assert [s.index for s in planning.resolve_gpus("all")] == [2, 5, 7]
    assert [s.token for s in planning.resolve_gpus("2")] == ["2", "5"]
    for bad in ("0", "4", "two", "1,x", "1,1"):
        with pytest.raises(typer.BadParameter):
            planning.resolve_gpus(bad)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(planning, "_cuda_device_count", lambda: 0)
    with pytest.raises(typer.BadParameter, match="no CUDA GPU"):
        planning.resolve_gpus("all")


# ---------------------------------------------------------------------------------------------
# one node: a pool of points, long-lived worker processes, a shared queue
# ---------------------------------------------------------------------------------------------

def three_sweeps(run_dir, base=Point(T=1024, G=2, Hk=2, L=16, d=64)) -> list[planning.SweepPlan]:
    """A small preset: T, G and L sweeps around one base point (the base point is in all three)."""
    return [planning.SweepPlan("T", tuple(base.replace(T=t) for t in (256, 1024, 4096, 8192)), run_dir / "sweep_T.csv"),
            planning.SweepPlan("G", tuple(base.replace(G=g) for g in (1, 2, 4)), run_dir / "sweep_G.csv"),
            planning.SweepPlan("L", tuple(base.replace(L=l) for l in (16, 64, 256)), run_dir / "sweep_L.csv")]


def fake_pool_cmd(barrier, n_workers, delay_s=0.02, fail=None, calls=None):
    """worker_cmd: fake workers that all wait for each other before taking work (so that every
    worker gets some), optionally one GPU's worker dying after `fail[1]` rows; counts its calls."""
    def cmd(slot):
        if calls is not None:
            calls.append(slot.index)
        extra = ["--fail-after", str(fail[1])] if fail and slot.index == fail[0] else []
        return FAKE_WORKER + ["--delay-s", str(delay_s), "--barrier", str(barrier),
                              "--barrier-n", str(n_workers), *extra]
    return cmd


def pid_of(impl_detail: str) -> int:
    return int(re.search(r"pid=(\d+)", impl_detail).group(1))


def single_gpu_order(points, providers):
    """(point index, provider) in the order a single-GPU run writes its rows: fa2 (the baseline) first."""
    ordered = sorted(providers, key=lambda p: p != "fa2")
    return [(i, prov) for i in range(len(points)) for prov in ordered]


def row_order(frame, points):
    index = {(p.T, p.G, p.Hk, p.L, p.B, p.d, p.C): i for i, p in enumerate(points)}
    return [(index[(r.T, r.G, r.Hk, r.L, r.B, r.d, r.C)], r.provider) for r in frame.itertuples()]


def test_pool_tasks_queue_order_and_pinning(tmp_path):
    sweeps = three_sweeps(tmp_path) + [planning.SweepPlan("C", (Point(T=256, C=16), Point(T=256, C=32)),
                                                       tmp_path / "sweep_C.csv"),
                                       planning.SweepPlan("X", (Point(T=64, C=16),), tmp_path / "x.csv", True)]
    tasks = planning.plan_tasks(sweeps, "fwdbwd", 2)
    assert [t.id for t in tasks] == list(range(4 + 3 + 3 + 2 + 1))
    assert [(t.sweep, t.index) for t in tasks[:5]] == [("T", 0), ("T", 1), ("T", 2), ("T", 3), ("G", 0)]
    assert {t.sweep: t.pin_chunk for t in tasks} == {"T": False, "G": False, "L": False, "C": True, "X": True}
    order = planning.queue_order(tasks)
    assert [t.cost for t in order] == sorted((t.cost for t in tasks), reverse=True)
    assert order[0].point.T == 8192 and order[0].sweep == "T"
    # equal costs (the base point is in all three sweeps) keep pool order: T before G before L
    base = [t for t in order if t.point == Point(T=1024, G=2, Hk=2, L=16, d=64)]
    assert [t.sweep for t in base] == ["T", "G", "L"]
    with pytest.raises(ValueError, match="repeat"):
        planning.plan_tasks(sweeps + sweeps[:1], "fwd")


def test_pooled_plan_beats_per_sweep_sharding_on_the_paper_preset(tmp_path):
    """Pooling removes the per-sweep barrier: with the paper's points on 2 GPUs, the greedy plan
    of the whole pool ends sooner than the sum of each sweep's own best split."""
    base = Point()
    sweeps = [planning.SweepPlan(a, tuple(runner.plan_points(a, None, base)), tmp_path / f"sweep_{a}.csv")
              for a in ("T", "G", "L")]
    tasks = planning.plan_tasks(sweeps, "fwdbwd", 5)
    plan = planning.assign_tasks(tasks, 2)
    assert sorted(t.id for s in plan for t in s) == [t.id for t in tasks]
    pooled = max(sum(t.cost for t in s) for s in plan)
    per_sweep = sum(max(sum(planning.point_cost(s.points[i], "fwdbwd", 5) for i in idx)
                        for idx in planning.assign_points(list(s.points), 2, "fwdbwd", 5)) for s in sweeps)
    biggest = max(t.cost for t in tasks)
    assert pooled == pytest.approx(max(biggest, sum(t.cost for t in tasks) / 2), rel=0.01)  # optimal here
    assert pooled < 0.8 * per_sweep


def test_pool_runs_every_sweep_on_workers_started_once(tmp_path):
    run_dir = tmp_path / "run"
    sweeps = three_sweeps(run_dir)
    calls = []
    result = local.run_pool(sweeps, RunSpec(PROVIDERS, "fwdbwd"), gpus="0,1", progress=True, poll_s=0.02,
                            keep_shards=True, worker_cmd=fake_pool_cmd(tmp_path / "barrier", 2, calls=calls))
    assert result.failures == [] and result.not_run == []
    assert sorted(calls) == [0, 1] and result.workers_started == 2  # once per run, not once per sweep

    pids_by_sweep = {}
    all_rows = []
    for s in sweeps:
        frame = pd.read_csv(s.csv)
        assert list(frame.columns) == schema.COLUMNS
        assert (frame.sweep == s.name).all()  # rows landed in their own sweep's CSV
        assert {key_of(r) for _, r in frame.iterrows()} == expected_keys(s.points, PROVIDERS)
        assert len(frame) == len(s.points) * len(PROVIDERS)
        assert row_order(frame, s.points) == single_gpu_order(s.points, PROVIDERS)
        assert (frame.status == "ok").all()
        # rows from both sweeps' GPUs carry the GPU's physical index and ran behind its CUDA_VISIBLE_DEVICES
        for r in frame.itertuples():
            assert r.impl_detail.startswith(f"fake (CUDA_VISIBLE_DEVICES={r.gpu_index}, ")
        pids_by_sweep[s.name] = {pid_of(d) for d in frame.impl_detail}
        all_rows.append(frame)
        # the rows returned are the rows in the CSV (both as the one reader gives them)
        pd.testing.assert_frame_equal(result.rows[s.name].reset_index(drop=True), merge.read_shard(s.csv),
                                      check_dtype=False)
    rows = pd.concat(all_rows)
    assert set(rows.gpu_index) == {0, 1}  # the pool was spread over both GPUs
    pids = set().union(*pids_by_sweep.values())
    assert len(pids) == 2  # two processes served all three sweeps
    assert any(len([s for s in pids_by_sweep if pid in pids_by_sweep[s]]) >= 2 for pid in pids)

    # both workers asked for work at the same moment: they got the two most expensive points
    order = planning.queue_order(planning.plan_tasks(sweeps, "fwdbwd", len(PROVIDERS)))
    firsts = []
    for gpu in (0, 1):
        log = merge.shard_path(run_dir / "pool.csv", "gpu", gpu, ".log").read_text()
        firsts.append(int(re.search(r"^task (\d+):", log, re.M).group(1)))
    assert sorted(firsts) == sorted(t.id for t in order[:2])


def test_pool_dying_worker_keeps_everyone_elses_rows(tmp_path):
    run_dir = tmp_path / "run"
    sweeps = three_sweeps(run_dir)
    result = local.run_pool(sweeps, RunSpec(PROVIDERS, "fwdbwd"), gpus="0,1,3", progress=False, poll_s=0.02,
                            worker_cmd=fake_pool_cmd(tmp_path / "barrier", 3, delay_s=0.05, fail=(1, 3)))
    (failure,) = result.failures
    assert (failure.gpu_index, failure.returncode, failure.rows_written) == (1, 3, 3)
    assert failure.rows_expected == 2 * len(PROVIDERS)  # it started two points, finished one
    assert "simulated crash" in failure.log_tail and failure.crashed_on
    assert result.not_run == []  # the points it never started went to the other workers

    frames = {s.name: pd.read_csv(s.csv) for s in sweeps}
    rows = pd.concat(frames.values())
    errors = rows[rows.status == "error"]
    (lost,) = errors.itertuples()  # one provider of the point it died on; nothing else missing
    assert lost.gpu_index == 1 and "died while running this point" in lost.reason
    assert "simulated crash" in lost.reason and "exit code 3" in lost.reason
    assert failure.crashed_on.startswith(f"{lost.sweep}: T={lost.T} G={lost.G} ")
    for s in sweeps:  # every row of every sweep is there, once, in its own CSV
        frame = frames[s.name]
        assert (frame.sweep == s.name).all()
        assert {key_of(r) for _, r in frame.iterrows()} == expected_keys(s.points, PROVIDERS)
        assert len(frame) == len(s.points) * len(PROVIDERS)
        assert row_order(frame, s.points) == single_gpu_order(s.points, PROVIDERS)
    ok = rows[rows.status == "ok"]
    assert (ok[ok.gpu_index == 1].shape[0]) == 3  # the rows it wrote before dying survive
    assert {0, 3} <= set(ok.gpu_index)
    # shards of a failed run are kept for inspection
    base = run_dir / "pool.csv"
    assert merge.shard_path(base, "gpu", 1).exists() and merge.shard_path(base, "gpu", 1, ".log").exists()


def test_worker_dying_before_it_starts_a_point_gives_the_point_back(tmp_path):
    quitter = [sys.executable, "-c", "import json, sys; print(json.dumps({'event': 'ready'}), flush=True); "
                                     "sys.stdin.readline(); sys.exit(5)"]
    points = random_points(6, seed=4)
    csv = tmp_path / "s.csv"
    rows = local.run_sharded(points, RunSpec(PROVIDERS, "fwd"), csv, sweep_name="t", gpus="0,1", progress=False,
                             poll_s=0.02, worker_cmd=lambda slot: quitter if slot.index == 1 else
                             FAKE_WORKER + ["--delay-s", "0.05"])
    (failure,) = rows.attrs["worker_failures"]
    assert (failure.gpu_index, failure.returncode, failure.rows_written, failure.crashed_on) == (1, 5, 0, "")
    assert rows.attrs["not_run"] == []
    frame = pd.read_csv(csv)
    assert (frame.status == "ok").all() and (frame.gpu_index == 0).all()
    assert {key_of(r) for _, r in frame.iterrows()} == expected_keys(points, PROVIDERS, "fwd")


def test_run_sharded_fake_workers_one_crashes(tmp_path):
    points = random_points(10, seed=11)
    gpus = [0, 1, 3]
    csv = tmp_path / "res" / "sweep.csv"
    rows = local.run_sharded(points, RunSpec(PROVIDERS, "fwdbwd"), csv, sweep_name="t", gpus="0,1,3", progress=False,
                             worker_cmd=fake_pool_cmd(tmp_path / "barrier", 3, delay_s=0.05, fail=(1, 1)),
                             poll_s=0.05)

    failures = rows.attrs["worker_failures"]
    assert [(f.gpu_index, f.returncode, f.rows_written) for f in failures] == [(1, 3, 1)]
    assert failures[0].rows_expected == len(PROVIDERS)  # died on its first point
    assert "simulated crash" in failures[0].log_tail

    merged = pd.read_csv(csv)
    assert list(merged.columns) == schema.COLUMNS
    assert len(merged) == len(rows) == len(points) * len(PROVIDERS)
    assert {key_of(r) for _, r in merged.iterrows()} == expected_keys(points, PROVIDERS)
    assert not merged.duplicated(subset=schema.KEY_COLUMNS).any()
    # every worker's rows carry the physical GPU index and ran on their own device
    ok = merged[merged.status == "ok"]
    for gpu in gpus:
        mine = ok[ok.gpu_index == gpu]
        assert len(mine) >= 1
        assert mine.impl_detail.str.startswith(f"fake (CUDA_VISIBLE_DEVICES={gpu}, ").all()
    assert len(ok[ok.gpu_index == 1]) == 1  # the row written before the crash survives
    (err,) = merged[merged.status == "error"].itertuples()
    assert err.gpu_index == 1 and "simulated crash" in err.reason
    # shards of a failed run are kept for inspection
    assert merge.shard_path(csv, "gpu", 1).exists() and merge.shard_path(csv, "gpu", 1, ".log").exists()


def test_run_sharded_success_merges_and_appends(tmp_path):
    points = random_points(7, seed=5)
    csv = tmp_path / "sweep.csv"
    old = fake_row(Point(T=64), "moda", "fwdbwd", "older-run", gpu_index=0)
    old["timestamp"] = "2020-01-01T00:00:00+00:00"
    append_row(csv, old)

    rows = local.run_sharded(points, RunSpec(PROVIDERS, "fwdbwd"), csv, sweep_name="t", gpus="0,1", progress=True,
                             worker_cmd=fake_pool_cmd(tmp_path / "barrier", 2), poll_s=0.05)
    assert rows.attrs["worker_failures"] == []
    assert {key_of(r) for _, r in rows.iterrows()} == expected_keys(points, PROVIDERS)
    assert len(rows) == len(points) * len(PROVIDERS)
    merged = pd.read_csv(csv)
    assert list(merged.columns) == schema.COLUMNS
    assert len(merged) == len(rows) + 1 and merged.sweep.iloc[0] == "older-run"  # kept, first
    this_run = merged[merged.sweep == "t"]
    assert row_order(this_run, points) == single_gpu_order(points, PROVIDERS)
    assert set(this_run.gpu_index) == {0, 1}
    for r in this_run.itertuples():
        assert r.impl_detail.startswith(f"fake (CUDA_VISIBLE_DEVICES={r.gpu_index}, ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["barrier", "sweep.csv"]  # shards cleaned up


def test_real_worker_without_gpu_fails_cleanly(tmp_path):
    csv = tmp_path / "s.csv"
    rows = local.run_sharded([Point(T=128)], RunSpec(["moda"], "fwd"), csv, sweep_name="t", gpus="0,",
                             progress=False, poll_s=0.05)
    (failure,) = rows.attrs["worker_failures"]
    assert failure.returncode == 2 and "no CUDA device visible" in failure.log_tail
    assert len(rows) == 0 and not csv.exists()
    assert [t.point for t in rows.attrs["not_run"]] == [Point(T=128)]


def test_pool_timeout_kills_workers_and_marks_their_points(tmp_path):
    points = [Point(T=256), Point(T=512)]
    rows = local.run_sharded(points, RunSpec(["moda"], "fwd"), tmp_path / "s.csv", sweep_name="t", gpus="0,",
                             progress=False, poll_s=0.05, timeout_s=6.0,  # well past worker start-up
                             worker_cmd=FAKE_WORKER + ["--delay-s", "120"])
    (failure,) = rows.attrs["worker_failures"]
    assert failure.returncode != 0 and "timeout_s exceeded" in failure.log_tail
    (err,) = rows.itertuples()
    assert err.T == 512 and err.status == "error" and "timeout_s exceeded" in err.reason
    assert [t.point for t in rows.attrs["not_run"]] == [Point(T=256)]


def test_sweep_command_preset_on_gpus_uses_one_pool(tmp_path, monkeypatch):
    """`moda-bench sweep --preset paper --gpus 0,1`: one worker per GPU for all three sweeps,
    the same files as a single-GPU run, rows in their own sweep's CSV."""
    import torch
    calls = []
    monkeypatch.setattr(local, "default_worker_cmd", fake_pool_cmd(tmp_path / "barrier", 2, delay_s=0.01,
                                                                   calls=calls))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(schema, "AXIS_VALUES", {"T": (256, 1024, 4096), "G": (1, 2, 4), "L": (8, 32),
                                                "C": (16,)})
    app = typer.Typer()
    app.command("sweep")(sweep_command)
    app.command("noop")(lambda: None)
    out = tmp_path / "run"
    allowed = sorted(os.sched_getaffinity(0))
    pins = [allowed[-1], allowed[0]] if len(allowed) > 1 else allowed   # worker i takes pins[i % len]
    res = CliRunner().invoke(app, ["sweep", "--preset", "paper", "--gpus", "0,1", "--providers", "moda,fa2",
                                   "--T", "512", "--Hk", "2", "--C", "32", "--quick", "--out", str(out),
                                   "--pin-cpu", ",".join(map(str, pins))],
                             env={"COLUMNS": "160"})
    assert res.exit_code == 0, res.output
    assert os.sched_getaffinity(0) == set(allowed)   # with --gpus the command itself is not pinned
    assert sorted(calls) == [0, 1]  # two workers for the whole preset, not two per sweep
    assert sorted(p.name for p in out.iterdir()) == ["run.json", "sweep_G.csv", "sweep_G.png", "sweep_L.csv",
                                                      "sweep_L.png", "sweep_T.csv", "sweep_T.png"]
    run = json.loads((out / "run.json").read_text())
    assert run["gpus"] == "0,1" and list(run["sweeps"]) == ["T", "G", "L"]
    want_cpus = {g: str(pins[g % len(pins)]) for g in (0, 1)}   # worker i runs GPU i here
    assert run["pin_cpu"] == ",".join(map(str, pins))
    assert [(h["gpu_index"], h["host_cpus"]) for h in run["host"]] == sorted(want_cpus.items())
    pids = set()
    for axis in ("T", "G", "L"):
        frame = pd.read_csv(out / f"sweep_{axis}.csv")
        assert list(frame.columns) == schema.COLUMNS and (frame.sweep == axis).all()
        want = [Point.from_dict(p) for p in run["sweeps"][axis]]
        assert frame[axis].tolist() == [getattr(p, axis) for p in want for _ in range(2)]
        assert {key_of(r) for _, r in frame.iterrows()} == expected_keys(want, ["moda", "fa2"])
        assert (frame.C == 32).all() and all(json.loads(c) == {"pin_chunk": True} for c in frame.config)
        assert all(str(r.host_cpus) == want_cpus[r.gpu_index] for r in frame.itertuples())
        pids |= {pid_of(d) for d in frame.impl_detail}
        assert f"sweep {axis} (fwdbwd, bfloat16)" in res.output
    assert len(pids) == 2
    assert "sweeps T, G, L: 8 points x 2 providers on 2 GPU(s)" in " ".join(res.output.split())


# ---------------------------------------------------------------------------------------------
# several nodes: torchrun ranks + merge
# ---------------------------------------------------------------------------------------------

def test_detect_distributed():
    assert planning.detect_distributed({}) is None
    assert planning.detect_distributed({"LOCAL_RANK": "0"}) is None
    info = planning.detect_distributed({"RANK": "9", "WORLD_SIZE": "16", "LOCAL_RANK": "1"})
    assert (info.rank, info.world_size, info.local_rank) == (9, 16, 1)
    assert planning.detect_distributed({"RANK": "2", "WORLD_SIZE": "4"}).local_rank == 2
    for bad in ({"RANK": "4", "WORLD_SIZE": "4"}, {"RANK": "x", "WORLD_SIZE": "4"},
                {"RANK": "0", "WORLD_SIZE": "0"}):
        with pytest.raises(ValueError):
            planning.detect_distributed(bad)


def fake_run_sweep(points, spec, csv_path, *, sweep_name, device_index=None, pin_chunk=None, **_):
    """Stand-in for runner.run_sweep: rows with gpu_index = the device index it was given."""
    for p in points:
        for prov in spec.providers:
            append_row(csv_path, fake_row(p, prov, spec.pass_, sweep_name, gpu_index=device_index or 0,
                                          pin_chunk=bool(pin_chunk)))


def test_rank_shards_then_merge(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "run_sweep", fake_run_sweep)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")  # restored after the test
    points = random_points(11, seed=2)
    csv = tmp_path / "shards" / "paper.csv"
    world, per_node = 6, 3
    for rank in range(world):
        dist = planning.detect_distributed({"RANK": str(rank), "WORLD_SIZE": str(world),
                                         "LOCAL_RANK": str(rank % per_node)})
        frame = distributed.run_distributed(points, RunSpec(PROVIDERS, "fwdbwd"), csv, sweep_name="paper", dist=dist,
                                      progress=False)
        assert (frame.gpu_index == 4 + rank % per_node).all()  # physical index behind CUDA_VISIBLE_DEVICES
        mine = planning.rank_points(points, dist, "fwdbwd", len(PROVIDERS))
        assert len(frame) == len(mine) * len(PROVIDERS)
    assert sorted(p.name for p in csv.parent.iterdir()) == [f"paper.rank{r}.csv" for r in range(world)]

    app = typer.Typer()
    app.command()(merge_command)
    out = tmp_path / "merged.csv"
    # the directory and one of its files again: duplicates on key + timestamp are dropped
    res = CliRunner().invoke(app, [str(csv.parent), str(merge.shard_path(csv, "rank", 0)), "--out", str(out)])
    assert res.exit_code == 0, res.output
    merged = pd.read_csv(out)
    assert list(merged.columns) == schema.COLUMNS
    assert len(merged) == len(points) * len(PROVIDERS)
    assert {key_of(r) for _, r in merged.iterrows()} == expected_keys(points, PROVIDERS)
    # deterministic: merging the files in another order gives the same bytes
    files = sorted(csv.parent.glob("*.csv"), reverse=True)
    out2 = tmp_path / "merged2.csv"
    merge.merge_shards(files, out2)
    assert out.read_bytes() == out2.read_bytes()
    sort_keys = list(merged[merge.SORT_COLUMNS].itertuples(index=False))
    assert sort_keys == sorted(sort_keys)


def test_rank_shards_of_a_pooled_preset_then_merge_per_sweep(tmp_path, monkeypatch):
    """torchrun with several sweeps: each rank runs its LPT share of the whole pool and writes one
    rank shard per sweep it has points of; merging each sweep's shards gives that sweep's CSV."""
    calls = []

    def recording_run_sweep(points, spec, csv_path, *, sweep_name, **kw):
        calls.append((sweep_name, len(points)))
        fake_run_sweep(points, spec, csv_path, sweep_name=sweep_name, **kw)

    monkeypatch.setattr(runner, "run_sweep", recording_run_sweep)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    run_dir = tmp_path / "run"
    sweeps = three_sweeps(run_dir)
    world = 3
    tasks = planning.plan_tasks(sweeps, "fwdbwd", len(PROVIDERS))
    plan = planning.assign_tasks(tasks, world)
    for rank in range(world):
        dist = planning.DistInfo(rank, world, rank)
        frames = distributed.run_distributed_pool(sweeps, RunSpec(PROVIDERS, "fwdbwd"), dist=dist, progress=False)
        mine = planning.rank_tasks(sweeps, dist, "fwdbwd", len(PROVIDERS))
        assert mine == plan[rank]
        for s in sweeps:
            want = [t.point for t in mine if t.sweep == s.name]
            assert merge.shard_path(s.csv, "rank", rank).exists() == bool(want)
            assert {key_of(r) for _, r in frames[s.name].iterrows()} == expected_keys(want, PROVIDERS)
            assert (frames[s.name].gpu_index == rank).all() and (frames[s.name].sweep == s.name).all()
    assert {name for name, _ in calls} == {"T", "G", "L"}
    # the pool was split, not each sweep: some rank ran points of two sweeps, and loads are LPT-balanced
    assert any(len({t.sweep for t in share}) >= 2 for share in plan)
    loads = [sum(t.cost for t in share) for share in plan]
    costs = [t.cost for t in tasks]
    assert max(loads) <= sum(costs) / world + (1 - 1 / world) * max(costs) + 1e-6 * sum(costs)
    for s in sweeps:
        merged = merge.merge_shards(sorted(run_dir.glob(f"sweep_{s.name}.rank*.csv")), s.csv)
        assert {key_of(r) for _, r in merged.iterrows()} == expected_keys(s.points, PROVIDERS)
        assert len(merged) == len(s.points) * len(PROVIDERS) and (merged.sweep == s.name).all()


def test_merge_rejects_mismatched_shard_and_drops_torn_line(tmp_path):
    good = tmp_path / "a.rank0.csv"
    for l in (0, 8):
        append_row(good, fake_row(Point(T=128, L=l), "moda", "fwd", "s"))
    with open(good, "a") as fh:  # a worker killed mid-write leaves a torn last line
        fh.write("s,moda,fake,fwd,12")
    with pytest.warns(UserWarning, match="cut off"):
        assert len(merge.read_shard(good)) == 2

    bad = tmp_path / "b.rank1.csv"
    pd.read_csv(good).drop(columns=["tflops"]).to_csv(bad, index=False)
    app = typer.Typer()
    app.command()(merge_command)
    with pytest.warns(UserWarning, match="cut off"):  # the good file is read before the bad one
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
    points = [Point(T=1024, C=32), Point(T=1024, C=64)]
    for pts, want in ((points, True), (points[:1], False)):
        rows = local.run_sharded(pts, RunSpec(["moda"], "fwd"), tmp_path / f"s{want}.csv", sweep_name="paper",
                                 gpus="0,1", progress=False, worker_cmd=FAKE_WORKER, poll_s=0.05)
        assert len(rows) == len(pts)
        assert all(json.loads(c) == {"pin_chunk": want} for c in rows.config)
        for rank in range(2):
            frame = distributed.run_distributed(pts, RunSpec(["moda"], "fwd"), tmp_path / f"d{want}.csv",
                                                sweep_name="paper", dist=planning.DistInfo(rank, 2, rank),
                                                progress=False)
            assert all(json.loads(c) == {"pin_chunk": want} for c in frame.config)


def test_run_sharded_refuses_an_output_with_another_schema(tmp_path):
    csv = tmp_path / "old.csv"
    csv.write_text("a,b\n1,2\n")
    with pytest.raises(typer.BadParameter, match="old.csv"):
        local.run_sharded([Point(T=128)], RunSpec(["moda"], "fwd"), csv, sweep_name="t", gpus="0,", progress=False,
                          worker_cmd=FAKE_WORKER)
    assert not list(tmp_path.glob("old.gpu*"))  # nothing was started
