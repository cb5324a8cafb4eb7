"""Host-side changes measured in one process: the package as it is against an earlier commit's copy
of itself, interleaved with FA2 (SDPA's flash backend), eager and graph, at one point. Separate
processes do not settle a few percent of host time on the GPU hosts (FA2's eager call moved
366-452 us between processes there), so the old package is imported beside the new one under
another name and both run in the same rounds.

    python3 tools/host_ab.py --make-old REV          # here: .abold/moda_bench_old = the package at REV
    PYTHONPATH=$PWD:$PWD/.abold python3 tools/host_ab.py [--T 1024 --G 8 --L 64] [--max-time 2]

--make-old writes the package of git revision REV into .abold/ (ignored: carry it to a device
call) with every `moda_bench` import renamed `moda_bench_old`. The timing prints each callable's
host us a call (alone and back to back), then the suite's interleaved rounds: ratios to FA2, then
new against old, with 95% intervals. Gradients of both are checked equal first (bitwise where
the kernels are the same), so the comparison is of the same work.
"""
from __future__ import annotations

import argparse
import io
import os
import re
import subprocess
import sys
import tarfile

OLD = "moda_bench_old"


def make_old(rev: str, root: str = ".abold") -> str:
    """Write the package at `rev` to root/moda_bench_old with its imports renamed; returns the folder."""
    data = subprocess.run(["git", "archive", "--format=tar", rev, "moda_bench"], check=True,
                          capture_output=True).stdout
    dest = os.path.join(root, OLD)
    subprocess.run(["rm", "-rf", dest], check=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for m in tar.getmembers():
            if not m.isfile():
                continue
            path = os.path.join(root, OLD + m.name[len("moda_bench"):])
            os.makedirs(os.path.dirname(path), exist_ok=True)
            body = tar.extractfile(m).read()
            if path.endswith(".py"):
                body = re.sub(rb"\bmoda_bench\b(?=[.\s])", OLD.encode(), body)
            with open(path, "wb") as f:
                f.write(body)
    return dest


def main() -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from host_probe import drained_call_us, interleaved, per_call_us, probe_inputs, shape_args

    p = shape_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    p.add_argument("--make-old", metavar="REV", default=None, help="write .abold/moda_bench_old from git REV, exit")
    p.add_argument("--max-time", type=float, default=2.0, help="seconds of interleaved rounds a timer")
    a = p.parse_args()
    if a.make_old:
        print(make_old(a.make_old))
        return
    import importlib

    import torch
    import torch.nn.functional as F

    from moda_bench.kernels.moda import moda_attention as new_attention
    old_attention = importlib.import_module(OLD + ".ops.moda").moda_attention
    x = probe_inputs(a)
    q, k, v, kd, vd, do = (x[n] for n in ("q", "k", "v", "k_depth", "v_depth", "do"))
    leaves = [t for n, t in x.items() if n != "do" and t is not None]

    def moda(attn):
        def fn():
            for t in leaves:
                t.grad = None
            attn(q, k, v, kd, vd).backward(do)
        return fn

    def fa2():
        for t in leaves:
            t.grad = None
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                               enable_gqa=True)
        o.transpose(1, 2).backward(do)

    fns = {"old": moda(old_attention), "new": moda(new_attention), "fa2": fa2}
    grads = {}
    for name in ("old", "new"):
        fns[name]()
        torch.cuda.synchronize()
        grads[name] = [t.grad.clone() for t in leaves]
    same = all(torch.equal(g, h) for g, h in zip(grads["old"], grads["new"]))
    print(f"T={a.T} G={a.G} L={a.L}: gradients of new and old {'bitwise equal' if same else 'DIFFER'}")
    fns["fa2"]()
    for _ in range(2):
        for name, fn in fns.items():
            print(f"  host  {name:4s} {drained_call_us(fn, 100):8.1f} us a call alone, "
                  f"{per_call_us(fn, 150):8.1f} back to back")
    interleaved(fns, leaves, "fa2", ("graph", "eager"), a.max_time, 4)
    interleaved({n: fns[n] for n in ("old", "new")}, leaves, "old", ("eager",), a.max_time, 4)


if __name__ == "__main__":
    main()
