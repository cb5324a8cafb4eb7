"""Per-GPU sweep worker, started by `shard.run_sharded` with CUDA_VISIBLE_DEVICES set to one GPU:

    python -m moda_bench.sweeps.worker --points shard.points.json --providers moda,fa2 \\
        --pass fwdbwd --csv out.gpu3.csv --sweep-name paper --gpu-index 3

It runs `runner.run_sweep` on cuda:0 (the one visible GPU), appending a row per (provider, point)
as each finishes, then stamps the physical `--gpu-index` into its rows. `--fake` writes synthetic
rows without torch or a GPU (tests, dry runs of the sharding plumbing); `--fake-fail-after N`
makes it die after N rows, like a crashed worker.
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

from . import schema
from .runner import Point, append_row
from .shard import point_cost, points_from_json, read_shard, write_csv_atomic

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
        "impl_detail": f"fake (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')})",
        "median_ms": ms, "p20_ms": ms * 0.98, "p80_ms": ms * 1.02, "tflops": FAKE_TFLOPS,
        "status": schema.OK, "reason": "", "config": json.dumps({"pin_chunk": pin_chunk}),
        "gpu": "fake", "gpu_index": gpu_index, "torch_version": "fake", "triton_version": "fake",
        "git_commit": schema.git_commit(),
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    })
    return row


def run_fake(points: list[Point], providers: list[str], pass_: str, csv_path: Path, *, sweep_name: str,
             fail_after: int | None = None, delay_s: float = 0.0, pin_chunk: bool = False) -> None:
    """Write one fake row per (point, provider), in runner order; die with exit code 3 after
    `fail_after` rows, as a worker killed by a CUDA fault would."""
    written = 0
    for point in points:
        for provider in providers:
            if fail_after is not None and written >= fail_after:
                print(f"fake worker: simulated crash after {written} rows "
                      "(RuntimeError: CUDA error: an illegal memory access was encountered)",
                      file=sys.stderr, flush=True)
                os._exit(3)
            time.sleep(delay_s)
            append_row(csv_path, fake_row(point, provider, pass_, sweep_name, pin_chunk=pin_chunk))
            written += 1


def stamp_gpu_index(csv_path: Path, gpu_index: int) -> None:
    """Rewrite a finished shard so every row carries the physical GPU index."""
    frame = read_shard(csv_path)
    if len(frame):
        write_csv_atomic(frame.assign(gpu_index=gpu_index), csv_path)


def worker_main(
    points: Annotated[Path, typer.Option("--points", help="JSON list of sweep points (shard.points_to_json).")],
    providers: Annotated[str, typer.Option("--providers", help="Comma-separated providers.")],
    pass_: Annotated[str, typer.Option("--pass", help="fwd, bwd or fwdbwd.")],
    csv: Annotated[Path, typer.Option("--csv", help="Shard CSV to append rows to.")],
    sweep_name: Annotated[str, typer.Option("--sweep-name")],
    gpu_index: Annotated[int, typer.Option("--gpu-index", help="Physical GPU index for the rows.")],
    warmup_ms: Annotated[float, typer.Option("--warmup-ms")] = 25,
    rep_ms: Annotated[float, typer.Option("--rep-ms")] = 100,
    tuned: Annotated[bool, typer.Option("--tuned/--no-tuned")] = True,
    pin_chunk: Annotated[bool, typer.Option("--pin-chunk", help="Pin MoDA's block_m to each point's C "
                                            "(the whole sweep varies C; default: runner decides).")] = False,
    fake: Annotated[bool, typer.Option("--fake", help="Synthetic rows, no GPU (tests).")] = False,
    fake_fail_after: Annotated[Optional[int], typer.Option("--fake-fail-after")] = None,
    fake_delay_s: Annotated[float, typer.Option("--fake-delay-s")] = 0.0,
) -> None:
    """Run one shard of a sweep on the single GPU this process sees."""
    if pass_ not in ("fwd", "bwd", "fwdbwd"):
        raise typer.BadParameter(f"--pass must be fwd, bwd or fwdbwd, got {pass_!r}")
    shard_points = points_from_json(points.read_text())
    provider_list = [p.strip() for p in providers.split(",") if p.strip()]
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
        from .runner import run_sweep
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
