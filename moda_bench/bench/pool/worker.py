"""Per-GPU sweep worker of the `--gpus` pool (pool.local), started with CUDA_VISIBLE_DEVICES set
to one GPU, once per run:

    python -m moda_bench.bench.pool.worker --serve --spec '<RunSpec JSON>' --csv out.gpu3.csv --gpu-index 3 \
        --worker-index 1

Protocol (`serve`): it pins itself to its CPU when the spec asks (`--pin-cpu`: item
`--worker-index` % len of the spec's pin_cpu, before torch starts any thread), sets up torch on
cuda:0 (the one visible GPU), prints {"event": "ready"}
on stdout, then reads one task per stdin line ({"id", "sweep", "point", "pin_chunk"}: one point
of one sweep), prints {"event": "start", "id"}, runs `runner.run_sweep` on that point for every
provider (appending a row per provider as it finishes) and prints {"event": "done", "id"}. It
exits when stdin closes, after stamping the physical `--gpu-index` into its rows. stdout carries
only these lines: anything else printed goes to stderr (the log). Compiled Triton kernels and
the CUDA context stay warm across the points of every sweep.

`serve` takes the setup and the per-task work as a function, so a stand-in worker (the tests'
`tests/fake_worker.py`) speaks the same protocol without a GPU.
"""
from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Optional

import typer

from moda_bench.bench.pool.merge import stamp_gpu_index
from moda_bench.bench.runner import Point

# run_task(point, sweep, pin_chunk) runs every provider of one point and returns None, or the
# error of a CUDA context left unusable (the worker then quits: see cuda_fault)
RunTask = Callable[[Point, str, bool], Optional[str]]
FAULT_EXIT_CODE = 4


def cuda_fault() -> str | None:
    """The error of a CUDA context that a fault (e.g. an illegal memory access) has left unusable,
    None when it still works. run_one turns such a fault into an error row and carries on, which
    a one-sweep worker could afford; a worker serving a whole run would turn every later point it
    takes from the shared queue into an error row, so it checks after each point and quits."""
    import torch
    try:
        torch.cuda.synchronize()
        torch.ones(1, device="cuda").add_(1).item()
        return None
    except Exception as exc:  # noqa: BLE001 - any failure here means the context is gone
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"


def serve(start: Callable[[], RunTask], csv: Path, *, gpu_index: int) -> None:
    """Run tasks read from stdin until it closes (protocol: module docstring). `start()` sets the
    worker up (after stdout is redirected to the log) and returns the function that runs a task."""
    sys.stdout.flush()
    proto = os.fdopen(os.dup(1), "w", buffering=1)  # the protocol keeps the real stdout ...
    os.dup2(2, 1)  # ... and whatever else is printed (libraries, compilers) goes to the log

    def send(event: str, **fields) -> None:
        proto.write(json.dumps({"event": event, **fields}) + "\n")
        proto.flush()

    run_task = start()
    send("ready", pid=os.getpid())
    while True:
        line = sys.stdin.readline()
        if not line:
            break  # stdin closed: no more work
        if not line.strip():
            continue
        task = json.loads(line)
        point = Point.from_dict(task["point"])
        send("start", id=task["id"])
        print(f"task {task['id']}: sweep {task['sweep']} {point}", file=sys.stderr, flush=True)
        fault = run_task(point, task["sweep"], bool(task.get("pin_chunk", False)))
        send("done", id=task["id"])
        if fault is not None:  # this point's rows are written; leave the rest to healthy workers
            print(f"worker: CUDA context unusable after task {task['id']} ({fault}); exiting so the "
                  "other GPUs take the remaining points", file=sys.stderr, flush=True)
            stamp_gpu_index(csv, gpu_index)
            proto.close()
            os._exit(FAULT_EXIT_CODE)
    stamp_gpu_index(csv, gpu_index)


def gpu_start(spec, csv: Path, worker: int = 0) -> Callable[[], RunTask]:
    """The real worker's setup: its CPU pinned (spec.pin_cpu, item worker % len; exit code 2 when
    that fails), torch on the one visible GPU (exit code 2 without one); each task is
    `runner.run_sweep` on one point (the first also runs the host canary), then a check of the
    CUDA context."""

    def start() -> RunTask:
        from moda_bench import host
        try:
            host.pin_process(spec.pin_cpu, worker)
        except (ValueError, OSError) as err:
            print(f"worker: {err}", file=sys.stderr)
            raise typer.Exit(2)
        import torch
        if not torch.cuda.is_available():
            print(f"worker: no CUDA device visible (CUDA_VISIBLE_DEVICES="
                  f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r})", file=sys.stderr)
            raise typer.Exit(2)
        torch.cuda.set_device(0)
        from moda_bench.bench.runner import run_sweep

        def run_task(point: Point, sweep: str, pin_chunk: bool) -> Optional[str]:
            run_sweep([point], spec, csv, sweep_name=sweep, progress=False, device_index=0, pin_chunk=pin_chunk,
                      worker=worker)
            return cuda_fault()

        return run_task

    return start


def worker_main(
    spec: Annotated[str, typer.Option("--spec", help="The run's RunSpec (bench.spec) as JSON.")],
    csv: Annotated[Path, typer.Option("--csv", help="Shard CSV to append rows to.")],
    gpu_index: Annotated[int, typer.Option("--gpu-index", help="Physical GPU index for the rows.")],
    worker_index: Annotated[int, typer.Option("--worker-index", help="This worker's place among the run's "
                                              "workers: picks its CPU of the spec's pin_cpu.")] = 0,
    serve_: Annotated[bool, typer.Option("--serve", help="Take tasks (one point of one sweep each) from "
                                         "stdin until it closes; see the module docstring.")] = False,
) -> None:
    """Run sweep points on the single GPU this process sees, as tasks from stdin (--serve)."""
    from moda_bench.bench.spec import RunSpec
    try:
        run_spec = RunSpec.from_json(spec)
    except (ValueError, TypeError) as err:
        raise typer.BadParameter(f"--spec: {err}") from None
    if not serve_:
        raise typer.BadParameter("give --serve: the worker takes its tasks from stdin")
    serve(gpu_start(run_spec, csv, worker_index), csv, gpu_index=gpu_index)


def main() -> None:
    app = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False)
    app.command()(worker_main)
    app()


if __name__ == "__main__":
    main()
