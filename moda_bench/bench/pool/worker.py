"""Per-GPU sweep worker, started with CUDA_VISIBLE_DEVICES set to one GPU.

Serve mode (what `shard.run_pool` starts, once per GPU for a whole run):

    python -m moda_bench.bench.pool.worker --serve --providers moda,fa2 --pass fwdbwd \
        --csv out.gpu3.csv --gpu-index 3

It sets up torch on cuda:0 (the one visible GPU), prints {"event": "ready"} on stdout, then
reads one task per stdin line ({"id", "sweep", "point", "pin_chunk"}: one point of one sweep),
prints {"event": "start", "id"}, runs `runner.run_sweep` on that point for every provider
(appending a row per provider as it finishes) and prints {"event": "done", "id"}. It exits when
stdin closes. stdout carries only these lines: anything else printed goes to stderr (the log).
Compiled Triton kernels and the CUDA context stay warm across the points of every sweep.

Batch mode (one fixed list of points of one sweep):

    python -m moda_bench.bench.pool.worker --points shard.points.json --providers moda,fa2 \
        --pass fwdbwd --csv out.gpu3.csv --sweep-name paper --gpu-index 3

Either way the physical `--gpu-index` is stamped into the rows at the end. `--fake` writes
synthetic rows without torch or a GPU (tests, dry runs of the plumbing); `--fake-fail-after N`
makes it die after N rows (over its whole life), like a crashed worker.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from moda_bench import schema
from moda_bench.bench.runner import Point, append_row
from moda_bench.bench.pool.shard import point_cost, points_from_json, read_shard, write_csv_atomic

FAKE_TFLOPS = 100.0  # synthetic throughput of a fake GPU


def fake_row(point: Point, provider: str, pass_: str, sweep_name: str, gpu_index: int = 0,
             pin_chunk: bool = False) -> dict:
    """One synthetic schema row (status ok, timing from the cost model at FAKE_TFLOPS).

    gpu_index defaults to 0, what a real worker sees behind CUDA_VISIBLE_DEVICES; the config
    column records whether --pin-chunk reached the worker.
    """
    flops = point_cost(point, pass_)
    ms = flops / (FAKE_TFLOPS * 1e12) * 1e3
    cfg = point.to_dict()
    row = {c: None for c in schema.COLUMNS}
    row.update({k: cfg[k] for k in schema.CONFIG_COLUMNS})
    row.update({
        "sweep": sweep_name, "provider": provider, "pass": pass_,
        "impl_detail": f"fake (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')}, pid={os.getpid()})",
        "median_ms": ms, "p20_ms": ms * 0.98, "p80_ms": ms * 1.02, "tflops": FAKE_TFLOPS,
        "status": schema.OK, "reason": "", "config": json.dumps({"pin_chunk": pin_chunk}),
        "gpu": "fake", "gpu_index": gpu_index, "torch_version": "fake", "triton_version": "fake",
        "git_commit": schema.git_commit(),
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    })
    return row


def run_fake(points: list[Point], providers: list[str], pass_: str, csv_path: Path, *, sweep_name: str,
             fail_after: int | None = None, delay_s: float = 0.0, pin_chunk: bool = False,
             written_before: int = 0) -> int:
    """Write one fake row per (point, provider), in runner order; die with exit code 3 once
    `fail_after` rows were written (counting `written_before`), as a worker killed by a CUDA
    fault would. Returns the rows written by this call."""
    written = 0
    for point in points:
        for provider in providers:
            if fail_after is not None and written_before + written >= fail_after:
                print(f"fake worker: simulated crash after {written_before + written} rows "
                      "(RuntimeError: CUDA error: an illegal memory access was encountered)",
                      file=sys.stderr, flush=True)
                os._exit(3)
            time.sleep(delay_s)
            append_row(csv_path, fake_row(point, provider, pass_, sweep_name, pin_chunk=pin_chunk))
            written += 1
    return written


def _fake_barrier(directory: Path, n: int, timeout_s: float = 60.0) -> None:
    """Tests: announce this worker in `directory` and wait until `n` workers have, so that all
    of them ask the queue for work at about the same time."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / str(os.getpid())).touch()
    end = time.monotonic() + timeout_s
    while len(list(directory.iterdir())) < n and time.monotonic() < end:
        time.sleep(0.01)


def stamp_gpu_index(csv_path: Path, gpu_index: int) -> None:
    """Rewrite a finished shard so every row carries the physical GPU index."""
    frame = read_shard(csv_path)
    if len(frame):
        write_csv_atomic(frame.assign(gpu_index=gpu_index), csv_path)


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


def serve(providers: list[str], pass_: str, csv: Path, *, gpu_index: int, warmup_ms: float, rep_ms: float,
          tuned: bool, fake: bool = False, fake_fail_after: int | None = None, fake_delay_s: float = 0.0,
          fake_barrier: Path | None = None, fake_barrier_n: int = 1) -> None:
    """Run tasks read from stdin until it closes (protocol: module docstring)."""
    sys.stdout.flush()
    proto = os.fdopen(os.dup(1), "w", buffering=1)  # the protocol keeps the real stdout ...
    os.dup2(2, 1)  # ... and whatever else is printed (libraries, compilers) goes to the log

    def send(event: str, **fields) -> None:
        proto.write(json.dumps({"event": event, **fields}) + "\n")
        proto.flush()

    run_sweep = None
    if fake:
        if fake_barrier is not None:
            _fake_barrier(fake_barrier, fake_barrier_n)
    else:
        import torch
        if not torch.cuda.is_available():
            print(f"worker: no CUDA device visible (CUDA_VISIBLE_DEVICES="
                  f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r})", file=sys.stderr)
            raise typer.Exit(2)
        torch.cuda.set_device(0)
        from moda_bench.bench.runner import run_sweep
    send("ready", pid=os.getpid())
    written = 0
    while True:
        line = sys.stdin.readline()
        if not line:
            break  # stdin closed: no more work
        if not line.strip():
            continue
        task = json.loads(line)
        point = Point(**task["point"])
        pin = bool(task.get("pin_chunk", False))
        send("start", id=task["id"])
        print(f"task {task['id']}: sweep {task['sweep']} {point}", file=sys.stderr, flush=True)
        if fake:
            written += run_fake([point], providers, pass_, csv, sweep_name=task["sweep"], fail_after=fake_fail_after,
                                delay_s=fake_delay_s, pin_chunk=pin, written_before=written)
        else:
            run_sweep([point], providers, pass_, csv, sweep_name=task["sweep"], use_tuned=tuned, progress=False,
                      device_index=0, warmup_ms=warmup_ms, rep_ms=rep_ms, pin_chunk=pin)
            fault = cuda_fault()
            if fault is not None:  # this point's rows are written; leave the rest to healthy workers
                send("done", id=task["id"])
                print(f"worker: CUDA context unusable after task {task['id']} ({fault}); exiting so the "
                      "other GPUs take the remaining points", file=sys.stderr, flush=True)
                if csv.exists():
                    stamp_gpu_index(csv, gpu_index)
                proto.close()
                os._exit(4)
        send("done", id=task["id"])
    if csv.exists():
        stamp_gpu_index(csv, gpu_index)


def worker_main(
    providers: Annotated[str, typer.Option("--providers", help="Comma-separated providers.")],
    pass_: Annotated[str, typer.Option("--pass", help="fwd, bwd or fwdbwd.")],
    csv: Annotated[Path, typer.Option("--csv", help="Shard CSV to append rows to.")],
    gpu_index: Annotated[int, typer.Option("--gpu-index", help="Physical GPU index for the rows.")],
    serve_: Annotated[bool, typer.Option("--serve", help="Take tasks (one point of one sweep each) from "
                                         "stdin until it closes; see the module docstring.")] = False,
    points: Annotated[Optional[Path], typer.Option("--points", help="Batch mode: JSON list of sweep points "
                                                   "(shard.points_to_json).")] = None,
    sweep_name: Annotated[Optional[str], typer.Option("--sweep-name", help="Batch mode: the rows' sweep.")] = None,
    warmup_ms: Annotated[float, typer.Option("--warmup-ms")] = 25,
    rep_ms: Annotated[float, typer.Option("--rep-ms")] = 100,
    tuned: Annotated[bool, typer.Option("--tuned/--no-tuned")] = True,
    pin_chunk: Annotated[bool, typer.Option("--pin-chunk", help="Batch mode: pin MoDA's block_m to each "
                                            "point's C (the whole sweep varies C; default: runner decides). "
                                            "Serve mode: each task says.")] = False,
    fake: Annotated[bool, typer.Option("--fake", help="Synthetic rows, no GPU (tests).")] = False,
    fake_fail_after: Annotated[Optional[int], typer.Option("--fake-fail-after")] = None,
    fake_delay_s: Annotated[float, typer.Option("--fake-delay-s")] = 0.0,
    fake_barrier: Annotated[Optional[Path], typer.Option("--fake-barrier", help="Tests: wait for "
                                                         "--fake-barrier-n workers in this folder.")] = None,
    fake_barrier_n: Annotated[int, typer.Option("--fake-barrier-n")] = 1,
) -> None:
    """Run sweep points on the single GPU this process sees (--serve: a stream of tasks)."""
    if pass_ not in ("fwd", "bwd", "fwdbwd"):
        raise typer.BadParameter(f"--pass must be fwd, bwd or fwdbwd, got {pass_!r}")
    provider_list = [p.strip() for p in providers.split(",") if p.strip()]
    if serve_:
        serve(provider_list, pass_, csv, gpu_index=gpu_index, warmup_ms=warmup_ms, rep_ms=rep_ms, tuned=tuned,
              fake=fake, fake_fail_after=fake_fail_after, fake_delay_s=fake_delay_s,
              fake_barrier=fake_barrier, fake_barrier_n=fake_barrier_n)
        return
    if points is None or sweep_name is None:
        raise typer.BadParameter("give --serve, or --points and --sweep-name")
    shard_points = points_from_json(points.read_text())
    if fake:
        run_fake(shard_points, provider_list, pass_, csv, sweep_name=sweep_name,
                 fail_after=fake_fail_after, delay_s=fake_delay_s, pin_chunk=pin_chunk)
    else:
        import torch
        if not torch.cuda.is_available():
            print(f"worker: no CUDA device visible (CUDA_VISIBLE_DEVICES="
                  f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r})", file=sys.stderr)
            raise typer.Exit(2)
        torch.cuda.set_device(0)
        from moda_bench.bench.runner import run_sweep
        run_sweep(shard_points, provider_list, pass_, csv, sweep_name=sweep_name, use_tuned=tuned,
                  progress=False, device_index=0, warmup_ms=warmup_ms, rep_ms=rep_ms,
                  **({"pin_chunk": True} if pin_chunk else {}))
    if csv.exists():
        stamp_gpu_index(csv, gpu_index)


def main() -> None:
    app = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False)
    app.command()(worker_main)
    app()


if __name__ == "__main__":
    main()
