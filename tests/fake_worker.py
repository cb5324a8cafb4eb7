"""A stand-in for the `--gpus` pool's worker (`python -m moda_bench.bench.pool.worker --serve`),
for tests: the same command line and the same stdin/stdout protocol (it runs
`moda_bench.bench.pool.worker.serve`), but each task writes synthetic rows, without torch or a
GPU. Give it to the pool as its worker command:

    run_pool(..., worker_cmd=[sys.executable, "tests/fake_worker.py", "--delay-s", "0.05"])

Its own options: `--delay-s S` (sleep before each row), `--fail-after N` (die with exit code 3
once N rows are written over its whole life, like a worker killed by a CUDA fault), `--hang-after N
--hang-once FILE` (once N rows are written, the next point never finishes, like a hung provider;
only while FILE does not exist, which the hang creates: one hang per FILE), `--barrier
DIR --barrier-n N` (announce itself in DIR and wait until N workers have, so that all of them
ask the queue for work at about the same time). The real worker's options (--serve, --spec: the
run's RunSpec as JSON, --csv, --gpu-index, --worker-index) are read or ignored; rows carry in
`host_cpus` the CPU the real worker would pin itself to (as `host.cpu_for_worker`), not pinning.

`fake_row` is also used in-process by the tests (stand-ins for runner.run_sweep).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
import time
from pathlib import Path

from moda_bench import results, schema
from moda_bench.bench.pool import worker
from moda_bench.bench.pool.plan import point_cost
from moda_bench.bench.runner import Point, base_row

FAKE_TFLOPS = 100.0  # synthetic throughput of a fake GPU
COMMAND = [sys.executable, str(Path(__file__).resolve())]


def fake_row(point: Point, provider: str, pass_: str, sweep_name: str, gpu_index: int = 0,
             pin_chunk: bool = False, host_cpus: str = "all") -> dict:
    """One synthetic schema row (status ok, timing from the pool's cost model at FAKE_TFLOPS).

    gpu_index defaults to 0, what a real worker sees behind CUDA_VISIBLE_DEVICES; impl_detail
    records CUDA_VISIBLE_DEVICES and the process id, config whether pin_chunk reached the worker.
    """
    ms = point_cost(point, pass_) / (FAKE_TFLOPS * 1e12) * 1e3
    row = base_row(point, provider, pass_, sweep_name)
    row.update({
        "impl_detail": f"fake (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')}, pid={os.getpid()})",
        "median_ms": ms, "p20_ms": ms * 0.98, "p80_ms": ms * 1.02, "tflops": FAKE_TFLOPS, "status": schema.OK,
        "config": json.dumps({"pin_chunk": pin_chunk}),
        "gpu": "fake", "gpu_index": gpu_index, "torch_version": "fake", "triton_version": "fake",
        "git_commit": schema.git_commit(), "host_cpus": host_cpus,
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    })
    return row


def wait_for_peers(directory: Path, n: int, timeout_s: float = 60.0) -> None:
    """Announce this worker in `directory` and wait until `n` workers have."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / str(os.getpid())).touch()
    end = time.monotonic() + timeout_s
    while len(list(directory.iterdir())) < n and time.monotonic() < end:
        time.sleep(0.01)


def fake_start(args):
    """worker.serve's start(): the barrier, then a task runner writing one fake row per provider,
    in the order given (the pool puts rows in single-GPU order itself)."""
    spec = json.loads(args.spec)
    providers, pass_ = list(spec["providers"]), spec["pass"]
    pins = list(spec.get("pin_cpu", ()))   # as host.cpu_for_worker (not imported: it imports triton)
    cpus = str(pins[args.worker_index % len(pins)]) if pins else "all"
    written = 0

    def run_task(point: Point, sweep: str, pin_chunk: bool):
        nonlocal written
        hung_before = args.hang_once is not None and args.hang_once.exists()
        if args.hang_after is not None and written >= args.hang_after and not hung_before:
            if args.hang_once:
                args.hang_once.touch()
            time.sleep(3600)
        rows = []   # a point's rows go in one write, as runner.run_sweep writes them
        for provider in providers:
            if args.fail_after is not None and written >= args.fail_after:
                results.append_rows(args.csv, rows)
                print(f"fake worker: simulated crash after {written} rows "
                      "(RuntimeError: CUDA error: an illegal memory access was encountered)",
                      file=sys.stderr, flush=True)
                os._exit(3)
            time.sleep(args.delay_s)
            rows.append(fake_row(point, provider, pass_, sweep, pin_chunk=pin_chunk, host_cpus=cpus))
            written += 1
        results.append_rows(args.csv, rows)
        return None

    def start():
        if args.barrier is not None:
            wait_for_peers(args.barrier, args.barrier_n)
        return run_task

    return start


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spec", required=True)
    p.add_argument("--csv", type=Path, required=True)
    p.add_argument("--gpu-index", type=int, required=True)
    p.add_argument("--worker-index", type=int, default=0)
    p.add_argument("--delay-s", type=float, default=0.0)
    p.add_argument("--fail-after", type=int, default=None)
    p.add_argument("--hang-after", type=int, default=None)
    p.add_argument("--hang-once", type=Path, default=None)
    p.add_argument("--barrier", type=Path, default=None)
    p.add_argument("--barrier-n", type=int, default=1)
    args, _ = p.parse_known_args(argv)  # --serve: the real worker's
    worker.serve(fake_start(args), args.csv, gpu_index=args.gpu_index)


if __name__ == "__main__":
    main()
