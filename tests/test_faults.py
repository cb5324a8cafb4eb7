"""Fault injection on the CPU (issue 61): randomized SIGKILL / SIGINT / SIGTERM of small fake runs
of `sweep` (one process and the `--gpus` pool of fake workers) and `tune`, second writers, stale
locks, and per-point faults (provider exception, out-of-memory, NaN output, a crashing or hung
pool worker), each followed by `--resume` until the run completes.

Every run is the real command: forked from this process (torch, pandas and the command already
imported, so a run costs milliseconds to start) with a fake GPU (fake providers timed by a
sleeping timer; the pool's workers are tests/fake_worker.py). After each fault it checks the
exit code (SIGKILL: killed; SIGINT 130; SIGTERM 143; a second writer 2); after the final resume:
no row that was finished before a fault is lost, no row key appears twice, every file reads
without a malformed line, run.json says complete. A fixed seed picks the faults; the last test
prints one line: faults injected, rows lost, duplicates.
"""
from __future__ import annotations

import json
import math
import os
import random
import signal
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

import fake_worker
import pandas as pd
import pytest
import torch

from moda_bench import results, schema
from moda_bench.bench import providers
from moda_bench.bench.providers import Prepared, register_provider
from moda_bench.bench.runstate import LOCK_NAME
from moda_bench.kernels.moda.reference import moda_reference

SEED = 61
TALLY = Counter()   # faults injected by kind, rows lost, duplicates
META = {"gpu": "fake", "gpu_index": 0, "torch_version": "fake", "triton_version": "fake",
        "git_commit": schema.git_commit()}
SLEEP_S = 0.01   # fake timing per provider and point
FLAKY = {0: "exception", 1: "oom", 2: "nan"}   # the fault of fake-flaky at a point (T // 8 % 4; 3: none)


def _meta(device_index=None):
    import datetime as _dt
    return dict(META, timestamp=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds"))


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    """A registry with fa2, fake-moda and fake-flaky (moda_reference on the CPU), a timer that
    sleeps, CUDA 'available', fixed run metadata, no figures; the pool's workers are fake ones."""
    from moda_bench.bench import runner
    from moda_bench.bench.pool import local
    from moda_bench.reports import figures
    monkeypatch.setattr(providers, "_REGISTRY", dict(providers._REGISTRY))
    monkeypatch.setitem(providers._optional_state, "loaded", True)

    def reference(name, flaky=False):
        def prepare(inputs, point, chunk):
            fault = FLAKY.get(point.T // 8 % 4) if flaky else None
            if fault == "exception":
                raise RuntimeError("injected provider exception")
            if fault == "oom":
                raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")

            def forward():
                out = moda_reference(inputs["q"], inputs["k"], inputs["v"], inputs["k_depth"], inputs["v_depth"])
                return out * math.nan if fault == "nan" else out
            return Prepared(forward, impl_detail=f"{name} on cpu")
        return prepare

    register_provider("fa2", uses_depth=False, replace=True)(reference("fa2"))
    register_provider("fake-moda")(reference("fake-moda"))
    register_provider("fake-flaky")(reference("fake-flaky", flaky=True))

    def timer(fn, grad_to_none=None, warmup_ms=None, rep_ms=None):
        fn()
        time.sleep(SLEEP_S)
        return {"median_ms": 1.0, "p20_ms": 0.9, "p80_ms": 1.1, "timer": "eager"}

    timer.timer_name = "eager"   # the label of every row of a point, failed ones too
    real_run = runner.run_sweep

    def cpu_run_sweep(points, spec, csv_path, **kw):
        kw.update(device="cpu", timer=timer, progress=False, seed=0)
        return real_run(points, spec, csv_path, **kw)

    monkeypatch.setattr(runner, "run_sweep", cpu_run_sweep)
    from moda_bench.bench import point
    monkeypatch.setattr(point, "release", lambda device: None)   # gc.collect of this big process: slow
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(schema, "run_metadata", _meta)
    monkeypatch.setattr(figures, "plot_sweep", lambda csv, *a, **k: Path(csv).with_suffix(".png"))
    monkeypatch.setattr(local, "default_worker_cmd", lambda slot: WORKER["cmd"](slot))
    import moda_bench.host as host
    monkeypatch.setattr(host, "host_canary", lambda: {c: float("nan") for c in schema.HOST_COLUMNS})
    monkeypatch.setenv("MODA_BENCH_GIT_COMMIT", META["git_commit"])   # workers: no git call on their first row
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)   # forked children must not inherit a busy OpenMP pool
    warm_up(tmp_path)
    yield
    import gc
    gc.unfreeze()
    torch.set_num_threads(torch_threads)


WORKER = {"cmd": lambda slot: fake_worker.COMMAND + ["--delay-s", "0.01"]}   # the pool's worker command


def _app():
    import importlib

    import typer
    for name in ("moda_bench.bench.sweep", "moda_bench.bench.presets", "moda_bench.bench.decode_providers",
                 "moda_bench.bench.pool.local", "moda_bench.bench.pool.merge", "moda_bench.timing", "moda_bench.host",
                 "moda_bench.health", "moda_bench.floor", "moda_bench.cli.lifecycle", "moda_bench.tuning",
                 "moda_bench.kernels.moda", "rich.table", "rich.progress", "rich.console",
                 "torch.fx.experimental.symbolic_shapes"):
        importlib.import_module(name)   # imported once here, not in every forked run

    from moda_bench.cli.sweep import sweep_command
    from moda_bench.cli.tune import tune_command
    app = typer.Typer()
    app.command("sweep")(sweep_command)
    app.command("tune")(tune_command)
    return typer.main.get_command(app)


def warm_up(tmp_path: Path) -> None:
    """One small run in this process: what the command imports and caches on first use is then
    inherited by every forked run."""
    import gc
    import io
    from contextlib import redirect_stderr, redirect_stdout
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        try:
            _app().main(args=sweep_args(tmp_path / "warm-up", "9"), prog_name="moda-bench", standalone_mode=False)
        except SystemExit:
            pass
    gc.freeze()   # the children's collections skip what this process holds


def fork_run(args: list, log: Path) -> int:
    """The command `args` in a forked child (stdout/stderr to `log`); returns its pid."""
    cmd = _app()
    pid = os.fork()
    if pid:
        return pid
    code = 70
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        sys.stdout = sys.__stdout__ = open(1, "w", buffering=1, closefd=False)
        sys.stderr = sys.__stderr__ = open(2, "w", buffering=1, closefd=False)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        sys.argv = ["moda-bench", *args]
        cmd.main(args=args, prog_name="moda-bench", standalone_mode=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported through the log and exit code 70
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def wait_code(pid: int, timeout_s: float = 30.0) -> int:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.005)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError(f"run {pid} did not finish within {timeout_s} s")


def holds_lock(path: Path, pid: int) -> bool:
    try:
        return json.loads(path.read_text()).get("pid") == pid
    except (OSError, ValueError):
        return False


def wait_for(path: Path, pid: int, timeout_s: float = 20.0, lock: bool = True) -> bool:
    """True once `path` exists (lock: and names `pid`); False if the child ended first."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if holds_lock(path, pid) if lock else path.exists():
            return True
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            wait_for.status[pid] = os.waitstatus_to_exitcode(status)
            return False
        time.sleep(0.002)
    return False


wait_for.status = {}
# exit codes as os.waitstatus_to_exitcode gives them: 143 from the command, -15 (the shell's 143 too)
# when SIGTERM lands after the run's bookkeeping, where the default action ends the process
EXPECTED = {signal.SIGKILL: (-signal.SIGKILL,), signal.SIGINT: (130,), signal.SIGTERM: (143, -signal.SIGTERM)}


def inject(args, log, start_marker: Path, sig, delay_s: float, kind: str, done_codes=(0,)) -> int:
    """Run, wait for its start (the lock naming it, or a marker file), signal it after delay_s; the
    exit code (checked: the signal's, or one of done_codes when the run finished first)."""
    pid = fork_run(args, log)
    if not wait_for(start_marker, pid, lock=start_marker.name == LOCK_NAME):
        code = wait_for.status.pop(pid)
        assert code in done_codes, f"{kind}: run ended with {code} before the fault:\n{log.read_text()[-3000:]}"
        return code
    time.sleep(delay_s)
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
    code = wait_code(pid)
    name = signal.Signals(sig).name
    assert code in (*EXPECTED[sig], *done_codes), f"{kind} {name}: exit {code}\n{log.read_text()[-3000:]}"
    if code in EXPECTED[sig]:
        TALLY[f"{kind} {signal.Signals(sig).name}"] += 1
    return code


KEY = ("sweep", "provider", "timer", "T", "G", "L")


def row_ids(run_dir: Path) -> set:
    """The finished rows in the run folder's sweep CSVs and shards (malformed lines skipped): rows
    of a point with all its rows as (key, timestamp, status); rows of a point cut short by a kill
    (measured again on resume) as their key alone."""
    out = set()
    for csv in sorted(run_dir.glob("*.csv")):
        try:
            frame = results.read_csv(csv, warn=lambda text: None)
        except results.ResultsError:
            continue
        recs = frame.to_dict("records")
        per_point = Counter((r["sweep"], r["T"]) for r in recs)
        for r in recs:
            key = tuple(str(r[c]) for c in KEY)
            out.add(key + (str(r["timestamp"]), str(r["status"])) if per_point[(r["sweep"], r["T"])] >= 3 else key)
    return out


def check_final(run_dir: Path, finished: set, expect_rows: int, kind: str, flaky_rows: bool = True) -> None:
    """No finished row lost, no duplicate row key, nothing malformed, run.json complete."""
    warned = []
    frames = [results.read_csv(c, warn=warned.append) for c in sorted(run_dir.glob("sweep_*.csv"))
              if ".gpu" not in c.name]
    assert not warned, warned
    rows = pd.concat(frames, ignore_index=True)
    keys = rows[schema.ROW_KEY].astype(str).agg("|".join, axis=1)
    dup = int(keys.duplicated().sum())
    now = row_ids(run_dir)
    now |= {r[:len(KEY)] for r in now}
    lost = finished - now
    TALLY["rows lost"] += len(lost)
    TALLY["duplicates"] += dup
    assert not lost and not dup, f"{kind}: lost {sorted(lost)[:3]}, duplicates {dup}"
    assert len(rows) == expect_rows, f"{kind}: {len(rows)} rows, expected {expect_rows}"
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "complete" and not record.get("left"), record.get("left")
    assert not (run_dir / LOCK_NAME).exists()
    flaky = rows[rows["provider"] == "fake-flaky"] if flaky_rows else rows[:0]
    for r in flaky.to_dict("records"):   # each provider fault is a marked row, and the run went on
        fault = FLAKY.get(int(r["T"]) // 8 % 4)
        want = {"exception": ("error", "injected provider exception"), "oom": ("oom", "out of memory"),
                "nan": ("error", "non-finite output"), None: ("ok", "")}[fault]
        assert r["status"] == want[0] and want[1] in str(r["reason"]), (fault, r["status"], r["reason"])
        if fault:
            TALLY[f"provider {fault}"] += 1


def sweep_args(run_dir: Path, values: str, *extra) -> list:
    return ["sweep", "--vary", "T", "--values", values, "--providers", "fa2,fake-moda,fake-flaky", "--G", "1",
            "--Hk", "1", "--L", "2", "--d", "8", "--B", "1", "--dtype", "fp32", "--quick", "--no-tuned",
            "--no-health-check", "--out", str(run_dir), *extra]


def _campaign(tmp_path, rng, name, n_points, extra=(), faults=3, sigs=None, span_s=0.4, kind="sweep"):
    """One run folder: up to `faults` signals, each followed by a resume, then a resume to the end."""
    run_dir = tmp_path / name
    values = ",".join(str(8 * (i + 1) + 1) for i in range(n_points))   # T = 9, 17, ...: odd sizes
    log = tmp_path / f"{name}.log"
    args = sweep_args(run_dir, values, *extra)
    finished: set = set()
    resume = []
    for k in range(faults):
        sig = rng.choice(sigs or [signal.SIGKILL, signal.SIGINT, signal.SIGTERM])
        code = inject(args + resume, log, run_dir / LOCK_NAME, sig, rng.uniform(0.0, span_s), kind)
        finished |= row_ids(run_dir)
        if code == -signal.SIGKILL and json.loads((run_dir / "run.json").read_text())["status"] == "running":
            assert (run_dir / LOCK_NAME).exists()   # left behind: the next run takes it over
        elif code in (130, 143):
            record = json.loads((run_dir / "run.json").read_text())
            if record["status"] != "complete":   # else the signal came after the last row and the record
                assert record["status"] == "interrupted" and "--resume" in record["resume"]
                assert "resume with:" in log.read_text()
        resume = ["--resume"]
        if code == 0:
            break
    pid = fork_run(args + ["--resume"], log)
    code = wait_code(pid)
    assert code == 0, log.read_text()[-3000:]
    return run_dir, finished


def test_sweep_faults(tmp_path, fake_gpu):
    rng = random.Random(SEED)
    for i in range(5):
        n = rng.choice([5, 6, 8])
        run_dir, finished = _campaign(tmp_path, rng, f"s{i}", n, span_s=0.05 * n)
        check_final(run_dir, finished, 3 * n, f"sweep s{i}")
    # a stale lock (its process gone) is taken over with a warning
    stale = "".join(p.read_text() for p in tmp_path.glob("s*.log")).count("taking over the stale lock")
    assert stale
    TALLY["stale lock taken over"] += stale


def test_second_writer_is_refused(tmp_path, fake_gpu):
    rng = random.Random(SEED + 1)
    for i in range(3):
        run_dir, log = tmp_path / f"w{i}", tmp_path / f"w{i}.log"
        first = fork_run(sweep_args(run_dir, "9,17,25,33,41,49,57,65"), log)
        assert wait_for(run_dir / LOCK_NAME, first)
        time.sleep(rng.uniform(0.0, 0.05))
        other_log = tmp_path / f"w{i}-second.log"
        code = wait_code(fork_run(sweep_args(run_dir, "9,17,25,33,41,49,57,65", "--resume"), other_log))
        assert code == 2, other_log.read_text()
        text = " ".join(other_log.read_text().split())
        assert f"being written by pid {first} on" in text, text
        TALLY["second writer"] += 1
        assert wait_code(first) == 0
        check_final(run_dir, row_ids(run_dir), 24, f"writer w{i}")


def test_lock_names_the_holder_and_takes_over_a_dead_one(tmp_path):
    from moda_bench.bench.runstate import LockHeld, RunLock
    held = RunLock(tmp_path, "moda-bench sweep --out x").acquire()
    with pytest.raises(LockHeld, match=rf"being written by pid {os.getpid()} on .* \(moda-bench sweep --out x\)"):
        RunLock(tmp_path, "second").acquire()
    held.release()
    assert not (tmp_path / LOCK_NAME).exists()
    dead = os.fork()
    if not dead:
        os._exit(0)
    os.waitpid(dead, 0)   # a pid that is surely gone
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": dead, "host": os.uname().nodename, "started": "t",
                                                  "command": "old"}))
    warned = []
    lock = RunLock(tmp_path, "new", warn=warned.append).acquire()
    assert lock.held and "taking over the stale lock of pid" in warned[0]
    lock.release()
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": 1, "host": "elsewhere", "started": "t", "command": "c"}))
    with pytest.raises(LockHeld, match="another host"):
        RunLock(tmp_path, "new").acquire()


def test_resume_refuses_another_gpu_and_commit(tmp_path, fake_gpu, monkeypatch):
    run_dir, log = tmp_path / "g", tmp_path / "g.log"
    assert wait_code(fork_run(sweep_args(run_dir, "9,17"), log)) == 0
    monkeypatch.setitem(META, "gpu", "Other GPU")
    assert wait_code(fork_run(sweep_args(run_dir, "9,17,25", "--resume"), log)) == 2
    assert "measured on fake, this run is on Other GPU" in " ".join(log.read_text().split())
    monkeypatch.setitem(META, "gpu", "fake")
    monkeypatch.setitem(META, "git_commit", "abc123")
    assert wait_code(fork_run(sweep_args(run_dir, "9,17,25", "--resume"), log)) == 2
    assert "add --allow-commit-change" in " ".join(log.read_text().split())
    assert wait_code(fork_run(sweep_args(run_dir, "9,17,25", "--resume", "--allow-commit-change"), log)) == 0
    assert len(row_ids(run_dir)) == 9


def test_corrupt_csv_is_reported_and_good_rows_kept(tmp_path, fake_gpu):
    run_dir, log = tmp_path / "c", tmp_path / "c.log"
    assert wait_code(fork_run(sweep_args(run_dir, "9,17,25"), log)) == 0
    csv = run_dir / "sweep_T.csv"
    lines = csv.read_text().splitlines(keepends=True)
    csv.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])   # the last row cut mid-write
    kept = row_ids(run_dir)
    assert wait_code(fork_run(sweep_args(run_dir, "9,17,25", "--resume"), log)) == 0
    text = " ".join(log.read_text().split())
    assert "line 10 skipped: cut off mid-row" in text and "1 incomplete point(s)" in text
    TALLY["corrupt csv"] += 1
    check_final(run_dir, kept, 9, "corrupt")


def test_pool_faults(tmp_path, fake_gpu, monkeypatch):
    rng = random.Random(SEED + 2)
    for i in range(2):
        worker_fault = ["--fail-after", "--hang-after"][i]
        at = rng.randint(1, 4)

        def cmd(slot, fault=worker_fault, at=at, once=tmp_path / f"hung{i}"):
            extra = [fault, str(at), "--hang-once", str(once)] if fault and slot.index == 1 else []
            return fake_worker.COMMAND + ["--delay-s", "0.01", *extra]

        monkeypatch.setitem(WORKER, "cmd", cmd)
        n = 8
        run_dir, finished = _campaign(tmp_path, rng, f"p{i}", n, extra=("--gpus", "0,1", "--point-timeout", "4"),
                                      faults=2, span_s=0.8, kind="pool")
        check_final(run_dir, finished, 3 * n, f"pool p{i}", flaky_rows=False)
        rows = pd.concat([pd.read_csv(c) for c in run_dir.glob("sweep_*.csv")])
        if worker_fault == "--fail-after":
            died = rows[rows["reason"].astype(str).str.contains("died while running this point")]
            TALLY["worker crash"] += int(len(died) > 0)
        if worker_fault == "--hang-after":
            hung = rows[rows["reason"].astype(str).str.startswith("timeout:")]
            assert len(hung) or not any("hang" in p.read_text() for p in [tmp_path / f"p{i}.log"])
            TALLY["point timeout"] += int(len(hung) > 0)


def test_pool_point_timeout_marks_the_point_and_goes_on(tmp_path, fake_gpu, monkeypatch):
    """A worker hangs on its first point: past --point-timeout it is killed, that point's rows say
    'timeout:', a fresh worker takes GPU 1's share again, the run completes."""
    once = tmp_path / "hung"
    monkeypatch.setitem(WORKER, "cmd", lambda slot: fake_worker.COMMAND + (   # GPU 0 slow: points are left
        ["--delay-s", "0.01", "--hang-after", "0", "--hang-once", str(once)] if slot.index == 1 else
        ["--delay-s", "0.3"]))
    run_dir, log = tmp_path / "t", tmp_path / "t.log"
    values = "9,17,25,33,41,49,57,65"
    code = wait_code(fork_run(sweep_args(run_dir, values, "--gpus", "0,1", "--point-timeout", "3"), log))
    assert code == 0, log.read_text()[-3000:]
    rows = pd.read_csv(run_dir / "sweep_T.csv")
    hung = rows[rows["reason"].astype(str).str.startswith("timeout: no result within --point-timeout 3 s")]
    assert once.exists() and len(hung) == 3 and (hung["status"] == "error").all() and hung["T"].nunique() == 1
    assert len(rows) == 24 and not rows.duplicated(["T", "provider"]).any()
    text = " ".join(log.read_text().split())
    assert "ran past --point-timeout 3 s; worker killed, its rows marked 'timeout'; a fresh worker takes" in text
    TALLY["point timeout"] += 1
    check_final(run_dir, set(), 24, "timeout", flaky_rows=False)


def test_torchrun_rank_resumes_its_own_shard(tmp_path, monkeypatch):
    """A rank killed part way (its run_sweep stops after k points) continues its own
    `<stem>.rank<r>.csv` with --resume: the rows before are kept, the rest of its share is run,
    no point twice; the merge of the shards then has every point and `missing_points` none."""
    from moda_bench.bench import runner
    from moda_bench.bench.pool import distributed, merge
    from moda_bench.bench.pool.plan import DistInfo, SweepPlan
    from moda_bench.bench.runner import Point
    from moda_bench.bench.runstate import SweepResume, missing_points, resume_sweep
    from moda_bench.bench.spec import RunSpec
    rng = random.Random(SEED + 4)
    spec = RunSpec(("fa2", "fake-moda"), "fwdbwd")
    points = tuple(Point(T=9 + 8 * i, G=1, Hk=1, L=2, B=1, d=8, dtype="float32") for i in range(10))
    sweep = SweepPlan("T", points, tmp_path / "sweep_T.csv")
    budget = {"points": 0}

    def dying_run_sweep(pts, spec, csv_path, *, sweep_name, **_):
        for p in pts:
            if budget["points"] <= 0:
                raise KeyboardInterrupt   # the rank is stopped here
            budget["points"] -= 1
            results.append_rows(csv_path, [fake_worker.fake_row(p, prov, spec.pass_, sweep_name)
                                           for prov in spec.providers])

    monkeypatch.setattr(runner, "run_sweep", dying_run_sweep)
    pairs = {(p, "eager") for p in spec.providers}
    for rank in range(2):
        dist = DistInfo(rank, 2, rank)
        shard = merge.shard_path(sweep.csv, "rank", rank)
        budget["points"] = rng.randint(1, 3)
        with pytest.raises(KeyboardInterrupt):
            distributed.run_distributed_pool([sweep], spec, dist=dist, progress=False)
        before = set(map(tuple, pd.read_csv(shard)[["T", "provider", "timestamp"]].values.tolist()))
        found: SweepResume = resume_sweep(shard, "T", pairs, gpu="fake", commit=META["git_commit"])
        budget["points"] = 100
        distributed.run_distributed_pool([sweep], spec, dist=dist, progress=False, done={"T": found.done})
        after = pd.read_csv(shard)
        assert before <= set(map(tuple, after[["T", "provider", "timestamp"]].values.tolist()))
        assert not after.duplicated(["T", "provider"]).any()
        TALLY["torchrun rank stopped"] += 1
    merged = merge.merge_shards(sorted(tmp_path.glob("sweep_T.rank*.csv")), sweep.csv)
    assert len(merged) == 20
    (tmp_path / "run.json").write_text(json.dumps({"sweeps": {"T": [p.to_dict() for p in points]},
                                                   "providers": list(spec.providers), "timers": ["eager"],
                                                   "pass": "fwdbwd"}))
    assert missing_points(merged, tmp_path, sweep.csv) == {}
    assert list(missing_points(merged[merged["T"] != 17], tmp_path, sweep.csv)["T"]) == [
        "T=17 G=1 L=2 C=64"]


def test_tune_faults(tmp_path, monkeypatch):
    from helpers import fake_tuning_device

    from moda_bench import tuning
    from moda_bench.bench import tune as tune_bench
    from moda_bench.kernels.moda import config as config_mod
    from moda_bench.kernels.moda import default_config
    fake_tuning_device(monkeypatch, lambda shape: None)
    monkeypatch.setattr(config_mod, "_capability", lambda idx=0: 9)   # an H100's, not asked of torch
    marker = tmp_path / "started"

    def fake_tune_point(shape, dtype, *args, **kw):
        marker.touch()
        time.sleep(0.03)
        if shape.T == 4096:
            raise RuntimeError("injected tuning failure")
        cfg = default_config(shape, dtype)
        return tuning.TuneResult(shape, dtype, cfg, default_ms=2.0, tuned_ms=1.5, wall_s=0.03, decision="tuned",
                                 candidate=cfg, candidate_ms=1.5, ratio=0.75, ratio_lo=0.7, ratio_hi=0.8)

    monkeypatch.setattr(tune_bench, "tune_point", fake_tune_point)
    rng = random.Random(SEED + 3)
    values = "1024,2048,4096,8192,16384,32768,65536"
    for i in range(4):
        cache, out, log = tmp_path / f"c{i}.json", tmp_path / f"t{i}.csv", tmp_path / f"t{i}.log"
        args = ["tune", "--vary", "T", "--values", values, "--G", "8", "--L", "64", "--Hk", "2", "--budget", "2",
                "--cache", str(cache), "--out", str(out)]
        finished, resume = [], []
        for _ in range(2):
            marker.unlink(missing_ok=True)
            sig = rng.choice([signal.SIGKILL, signal.SIGINT, signal.SIGTERM])
            code = inject(args + resume, log, marker, sig, rng.uniform(0.0, 0.2), "tune", done_codes=(1,))
            if out.exists():
                finished += pd.read_csv(out).query("status != 'error'")[["cache_key", "timestamp"]].values.tolist()
            if cache.exists():
                json.loads(cache.read_text())   # never half-written
            resume = ["--resume"]
        code = wait_code(fork_run(args + ["--resume"], log))
        assert code == 1, log.read_text()[-2000:]   # one shape fails (injected), the others are tuned
        final = pd.read_csv(out)
        assert final["cache_key"].is_unique and len(final) == 7
        have = set(map(tuple, final[["cache_key", "timestamp"]].values.tolist()))
        lost = [r for r in finished if tuple(r) not in have]
        TALLY["rows lost"] += len(lost)
        assert not lost, lost
        assert final.set_index("T").loc[4096, "status"] == "error"
        TALLY["tune exception"] += 1


def test_fault_summary(capsys):
    faults = sum(v for k, v in TALLY.items() if k not in ("rows lost", "duplicates"))
    line = (f"fault injection (seed {SEED}): {faults} faults injected "
            f"({', '.join(f'{k} {v}' for k, v in sorted(TALLY.items()) if k not in ('rows lost', 'duplicates'))}); "
            f"rows lost {TALLY['rows lost']}, duplicates {TALLY['duplicates']}")
    with capsys.disabled():
        print("\n" + line)
    assert TALLY["rows lost"] == 0 and TALLY["duplicates"] == 0
    assert faults >= 50, line
