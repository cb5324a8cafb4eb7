"""Issue 61 on a real GPU, in one go (about 3 minutes on an H100): a preset run killed part way
(SIGKILL, then SIGINT) and resumed ends with the same rows and report sections as an
uninterrupted run of the same command; a second writer into the folder is refused; each per-point
fault (provider exception, CUDA out-of-memory, NaN output) gives a marked row and a finished
sweep; in the `--gpus` pool a hung point (past --point-timeout) and a crashing worker give marked
rows and a finished run (these two with tests/fake_worker.py stand-ins, which run no kernel).

    python tools/resume_check.py --out DIR [--preset paper --only T --providers fa2,moda]

Writes DIR/full and DIR/resumed (run folders, each with report/), DIR/faults/, DIR/pool/ and
DIR/check.json (every check: ok and what was seen); prints one line per check; exit 1 if any
failed.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

CHECKS: list[dict] = []


def check(name: str, ok: bool, seen) -> bool:
    CHECKS.append({"check": name, "ok": bool(ok), "seen": seen})
    print(f"[{'ok' if ok else 'FAILED'}] {name}: {seen}", flush=True)
    return ok


def moda(*args) -> list:
    return [sys.executable, "-m", "moda_bench.cli", *map(str, args)]


def rows_in(csvs) -> int:
    n = 0
    for c in csvs:
        try:
            n += max(Path(c).read_bytes().count(b"\n") - 1, 0)
        except FileNotFoundError:
            pass
    return n


def start(cmd, log: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=open(log, "ab"), stderr=subprocess.STDOUT, cwd=ROOT)


def wait_rows(proc, run_dir: Path, n: int, timeout_s: float = 300) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and proc.poll() is None:
        if rows_in(run_dir.glob("sweep_*.csv")) >= n:
            return True
        time.sleep(0.2)
    return False


def frame_of(run_dir: Path):
    from moda_bench import results
    frames = [results.read_csv(c, warn=lambda text: None) for c in sorted(run_dir.glob("sweep_*.csv"))]
    import pandas as pd
    return pd.concat(frames, ignore_index=True)


def preset_check(out: Path, sweep_args: list, per_point: int) -> None:
    """The same preset uninterrupted and killed twice then resumed: same rows and report sections."""
    full, res = out / "full", out / "resumed"
    code = subprocess.run(moda("sweep", *sweep_args, "--out", full), cwd=ROOT,
                          stdout=open(out / "full.log", "wb"), stderr=subprocess.STDOUT).returncode
    check("uninterrupted run", code == 0, f"exit {code}")
    log = out / "resumed.log"
    p = start(moda("sweep", *sweep_args, "--out", res), log)
    hit = wait_rows(p, res, per_point)
    p.send_signal(signal.SIGKILL)
    code = p.wait()
    kept = rows_in(res.glob("sweep_*.csv"))
    check("SIGKILL part way", hit and code == -signal.SIGKILL, f"exit {code}, rows kept {kept}")
    p = start(moda("sweep", *sweep_args, "--out", res, "--resume"), log)
    end = time.monotonic() + 120
    while time.monotonic() < end and p.poll() is None:   # the resume has taken over the stale lock
        try:
            if json.loads((res / ".moda-bench.lock").read_text()).get("pid") == p.pid:
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    second = subprocess.run(moda("sweep", *sweep_args, "--out", res, "--resume"), cwd=ROOT, capture_output=True,
                            text=True)
    text = " ".join((second.stdout + second.stderr).split())
    check("second writer refused", second.returncode == 2 and f"being written by pid {p.pid}" in text,
          f"exit {second.returncode}: {text[-300:]}")
    hit = wait_rows(p, res, rows_in(res.glob("sweep_*.csv")) + per_point)
    p.send_signal(signal.SIGINT)
    code = p.wait()
    record = json.loads((res / "run.json").read_text())
    check("SIGINT part way", hit and code == 130 and record.get("status") == "interrupted",
          f"exit {code}, status {record.get('status')}, left {record.get('left')}")
    code = subprocess.run(moda("sweep", *sweep_args, "--out", res, "--resume"), cwd=ROOT,
                          stdout=open(log, "ab"), stderr=subprocess.STDOUT).returncode
    record = json.loads((res / "run.json").read_text())
    status = record.get("status")
    check("resumed to the end", code == 0 and status == "complete", f"exit {code}, {status}")
    a, b = frame_of(full), frame_of(res)
    key = ["sweep", "provider", "pass", "timer", "T", "G", "L", "C", "S", "dtype"]
    ka = sorted(map(tuple, a[key + ["status"]].astype(str).values.tolist()))
    kb = sorted(map(tuple, b[key + ["status"]].astype(str).values.tolist()))
    dup = int(b.duplicated(key).sum())
    check("same rows as uninterrupted", ka == kb and dup == 0 and list(a.columns) == list(b.columns),
          f"{len(a)} vs {len(b)} rows, duplicates {dup}")
    heads = []
    for d in (full, res):
        subprocess.run(moda("report", d, "--out", d / "report"), cwd=ROOT, capture_output=True)
        md = d / "report" / "REPORT.md"
        heads.append([ln for ln in md.read_text().splitlines() if ln.startswith("#")] if md.exists() else None)
    check("same report sections", heads[0] is not None and heads[0] == heads[1], f"{len(heads[0] or [])} headings")


def fault_check(out: Path) -> None:
    """Provider exception, OOM and NaN on the GPU: marked rows, the sweep finished."""
    import torch

    from moda_bench.bench import providers
    from moda_bench.bench.providers import register_provider
    from moda_bench.bench.runner import Point, run_sweep
    from moda_bench.bench.spec import RunSpec
    fa2 = providers.get_provider("fa2")

    @register_provider("fault-exception", uses_depth=False)
    def _exc(inputs, point, chunk):
        raise RuntimeError("injected provider exception")

    @register_provider("fault-oom", uses_depth=False)
    def _oom(inputs, point, chunk):
        torch.empty(1 << 44, dtype=torch.uint8, device="cuda")   # 16 TiB

    @register_provider("fault-nan", uses_depth=False)
    def _nan(inputs, point, chunk):
        import dataclasses
        p = fa2.prepare(inputs, point, chunk)
        return dataclasses.replace(p, forward=lambda: p.forward() * math.nan)

    points = [Point(T=1024, G=2, Hk=4, L=8, d=64), Point(T=2048, G=2, Hk=4, L=8, d=64)]
    spec = RunSpec(("fa2", "fault-exception", "fault-oom", "fault-nan"), "fwdbwd")
    frame = run_sweep(points, spec, out / "faults" / "sweep_T.csv", sweep_name="T", progress=False)
    by = {(r["T"], r["provider"]): r for r in frame.to_dict("records")}
    for name, status, reason in (("fault-exception", "error", "injected provider exception"),
                                 ("fault-oom", "oom", "out of memory"), ("fault-nan", "error", "non-finite output")):
        rows = [by[(p.T, name)] for p in points]
        check(f"fault {name}", all(r["status"] == status and reason in str(r["reason"]) for r in rows),
              "; ".join(f"{r['status']}: {str(r['reason'])[:80]}" for r in rows))
    check("sweep finished past the faults", all(by[(p.T, "fa2")]["status"] == "ok" for p in points),
          [by[(p.T, "fa2")]["status"] for p in points])


def pool_check(out: Path) -> None:
    """The --gpus pool with fake workers: a hung point (past --point-timeout) and a crash."""
    import fake_worker

    from moda_bench.bench.pool.local import run_pool
    from moda_bench.bench.pool.plan import SweepPlan
    from moda_bench.bench.runner import Point
    from moda_bench.bench.spec import RunSpec
    os.environ.setdefault("MODA_BENCH_GIT_COMMIT", "resume-check")   # the stand-ins' rows: no git call each
    points = tuple(Point(T=9 + 8 * i, G=1, Hk=1, L=2, B=1, d=8, dtype="float32") for i in range(8))
    for fault, arg in (("hang", ["--hang-after", "0", "--hang-once", str(out / "pool" / "hung")]),
                       ("crash", ["--fail-after", "2"])):
        res = run_pool([SweepPlan("T", points, out / "pool" / fault / "sweep_T.csv")], RunSpec(("fa2", "x", "y")),
                       gpus="0,1", progress=False, poll_s=0.05, point_timeout_s=5,
                       worker_cmd=lambda slot, arg=arg: fake_worker.COMMAND + (
                           ["--delay-s", "0.01", *arg] if slot.index == 1 else ["--delay-s", "0.2"]))
        rows = res.rows["T"]
        marked = rows[rows["status"] == "error"]
        want = "timeout:" if fault == "hang" else "died while running this point"
        check(f"pool {fault}", len(rows) == 24 and len(marked) > 0 and marked["reason"].str.contains(want).all(),
              f"{len(rows)}/24 rows, {len(marked)} marked: {marked['reason'].iloc[0][:80] if len(marked) else '-'}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--preset", default="paper")
    ap.add_argument("--only", default="T")
    ap.add_argument("--providers", default="fa2,moda")
    args = ap.parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    n_prov = len(args.providers.split(","))
    sweep_args = ["--preset", args.preset, "--only", args.only, "--providers", args.providers, "--quick",
                  "--max-time", "5"]
    t0 = time.monotonic()
    preset_check(out, sweep_args, n_prov)
    fault_check(out)
    pool_check(out)
    (out / "check.json").write_text(json.dumps({"checks": CHECKS, "wall_s": time.monotonic() - t0}, indent=1,
                                               default=str))
    bad = [c["check"] for c in CHECKS if not c["ok"]]
    print(f"resume_check: {len(CHECKS) - len(bad)}/{len(CHECKS)} checks ok in {time.monotonic() - t0:.0f} s"
          + (f"; FAILED: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
