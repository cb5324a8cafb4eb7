"""Shared test utilities: random MoDA inputs and error metrics."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import torch

# ||err|| / ||ref|| tolerances vs the fp64 reference, per input dtype
TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2}


def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def bwd_tma_passes(T, G, L, B=2, seed=0, dtype=torch.float32, d=32, **tiles):
    """run(**kw) -> `kernel_bwd_tma.moda_bwd_tma(...)` (dq, dk, dv, dkd, dvd) on fixed random inputs
    (2 KV heads, 2*G query heads) and their forward: small tiles (32-row blocks, 16 keys, 16 depth
    columns, 2 stages) unless `tiles` or kw set others; kw (kv_chunk, kv_sub, depth_items, ...) per call."""
    from moda_bench.kernels.moda import MoDAConfig
    from moda_bench.kernels.moda.triton.bwd_tma import moda_bwd_tma
    from moda_bench.kernels.moda.triton.interface import moda_fwd
    from moda_bench.kernels.moda.validate import MoDAShape
    q, k, v, kd, vd, do = (x.detach() if x is not None else None
                           for x in random_inputs(B, T, 2 * G, 2, d, L, dtype, seed=seed))
    o, lse = moda_fwd(q, k, v, kd, vd, d ** -0.5, MoDAShape(B=B, T=T, Hq=2 * G, Hk=2, d=d, L=L), MoDAConfig())
    base = dict(dict(q_block_m=32, q_block_n=16, kv_block_m=32, kv_block_n=16, block_l=16, q_stages=2, kv_stages=2),
                **tiles)
    return lambda **kw: moda_bwd_tma(do, q, k, v, kd, vd, o, lse, d ** -0.5, G, **dict(base, **kw))


def small_tma_config(**kw):
    """A "tma" backward config with small tiles (32-row blocks, 16 keys, 16 depth columns, 2 stages):
    several row blocks, key tiles, diagonal and depth steps at test sizes; kw sets other fields."""
    from moda_bench.kernels.moda import MoDAConfig
    base = dict(bwd_depth="tma", bwd_q_block_m=32, bwd_q_block_n=16, bwd_kv_block_m=32, bwd_kv_block_n=16,
                bwd_block_l=16, bwd_q_stages=2, bwd_kv_stages=2)
    return MoDAConfig(**dict(base, **kw))


def grads_of(cfg, inputs, do, depth_grad=True):
    """(out, [each input's gradient]) of a `moda_attention` fwd+bwd under cfg on fresh leaf copies of
    inputs (None where an input gets none: detached depth)."""
    from moda_bench.kernels.moda import moda_attention
    ins = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = moda_attention(*ins, config=cfg, depth_grad=depth_grad)
    out.backward(do)
    return out, [x.grad for x in ins]


def random_inputs(B, T, Hq, Hk, d, L, dtype, seed=0, dev=None):
    """Random (never zero) q, k, v, k_depth, v_depth, do; depth tensors None when L == 0."""
    g = torch.Generator().manual_seed(seed)
    dev = dev or device()

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(dev, dtype).requires_grad_(True)

    q, k, v = rnd(B, T, Hq, d), rnd(B, T, Hk, d), rnd(B, T, Hk, d)
    kd = rnd(B, T, L, Hk, d) if L else None
    vd = rnd(B, T, L, Hk, d) if L else None
    do = torch.randn(B, T, Hq, d, generator=g).to(dev, dtype)
    return q, k, v, kd, vd, do


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64; inf if a has a NaN/inf.

    Where the exact answer is zero (||b|| < 1e-8 sqrt(n): dq and dk at T=1, L=0, where the
    softmax has a single entry) it is the RMS of a - b instead, so rounding noise is judged
    against the O(1) scale of the inputs rather than divided by zero."""
    a, b = a.detach().double(), b.detach().double()
    if not torch.isfinite(a).all():
        return float("inf")
    n = max(b.numel(), 1)
    denom = b.norm()
    if denom < 1e-8 * n ** 0.5:
        denom = torch.tensor(float(n) ** 0.5, dtype=torch.float64)
    return float((a - b).norm() / denom)


def check_against_reference(fn, B, T, Hq, Hk, d, L, dtype, seed=0, tol=None, ref_dtype=torch.float64, **kw):
    """Run fn (moda_attention-like) fwd+bwd and compare out, lse (if returned) and all five
    gradients with moda_reference. Returns the dict of relative errors (asserted < tol)."""
    from moda_bench.kernels.moda import moda_reference

    tol = tol or TOLERANCE[dtype]
    q, k, v, kd, vd, do = random_inputs(B, T, Hq, Hk, d, L, dtype, seed)
    inputs = [x for x in (q, k, v, kd, vd) if x is not None]
    names = ["q", "k", "v", "k_depth", "v_depth"][: len(inputs)]
    res = fn(q, k, v, kd, vd, **kw)
    out, lse = res if isinstance(res, tuple) else (res, None)
    assert out.shape == q.shape and out.dtype == q.dtype
    grads = torch.autograd.grad(out, inputs, do)
    ref_out, ref_lse = moda_reference(q, k, v, kd, vd, return_lse=True, compute_dtype=ref_dtype, out_dtype=ref_dtype)
    ref_grads = torch.autograd.grad(ref_out, inputs, do.to(ref_dtype))
    errs = {"out": rel_err(out, ref_out)}
    if lse is not None:
        assert lse.shape == (B, T, Hq) and lse.dtype == torch.float32
        errs["lse"] = rel_err(lse, ref_lse)
    for n, gk, gr in zip(names, grads, ref_grads):
        assert gk.shape == gr.shape and gk.dtype == dtype, n
        errs["d" + n] = rel_err(gk, gr)
    bad = {k_: e for k_, e in errs.items() if not e < tol}
    assert not bad, f"errors above {tol:g}: {bad} (all: {errs})"
    return errs


H100_SMEM = 232448  # opt-in shared memory per block of an H100, bytes


def fake_tuning_device(monkeypatch, timer_factory):
    """Make the tuner believe a CUDA GPU ('Fake GPU', H100 shared memory) is present and build its
    timers with timer_factory(shape); returns the list of shapes a timer was made for."""
    from moda_bench import schema
    from moda_bench import tuning as tu
    from moda_bench.tuning import cache as cache_mod
    from moda_bench.tuning import tuner as tuner_mod
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(tu, "current_gpu_name", lambda: "Fake GPU")
    monkeypatch.setattr(cache_mod, "current_gpu_name", lambda: "Fake GPU")
    monkeypatch.setattr(tuner_mod, "device_smem_limit", lambda *a, **k: H100_SMEM)
    # the kernels' own defaults still see no GPU (else their first look would ask torch for one and
    # remember the answer for the whole session)
    from moda_bench.kernels.moda import config as config_mod
    monkeypatch.setattr(config_mod, "_cuda_ok", False)
    monkeypatch.setattr(schema, "run_metadata", lambda device_index=None: {c: "x" for c in schema.META_COLUMNS})
    made = []
    monkeypatch.setattr(tu, "CudaTimer", lambda shape, dtype, **kw: made.append(shape) or timer_factory(shape))
    return made


TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools")


def load_tool(name: str):
    """The product tool tools/<name>.py, imported as a module (tools/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(TOOLS, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def cute_import_problem(*modules: str) -> str | None:
    """Why the CuTe DSL kernels cannot be compiled here (cutlass or one of `modules` does not
    import), or None; the compile-only tests skip with it."""
    try:
        import cutlass.cute  # noqa: F401
        for name in modules:
            importlib.import_module(name)
        return None
    except Exception as exc:  # noqa: BLE001 - any import failure means: skip
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def cute_sm90_env(monkeypatch) -> None:
    """Compile for sm_90a without a GPU (FA4's and the DSL's arch variables, unless set)."""
    for name, value in (("FLASH_ATTENTION_ARCH", "sm_90a"), ("CUTE_DSL_ARCH", "sm_90a")):
        if name not in os.environ:
            monkeypatch.setenv(name, value)


def graph_replayed(step, leaves, replays: int = 1) -> None:
    """Capture step() (a fwd+bwd writing the leaves' .grad) into a CUDA graph and replay it: one
    warm-up call on a side stream first (the usual pattern), grads set to None before the capture so
    that replays write them; on return the leaves' .grad hold the replayed gradients."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    for x in leaves:
        x.grad = None
    with torch.cuda.graph(graph):
        step()
    for _ in range(replays):
        graph.replay()
    torch.cuda.synchronize()


def cached_against_tritons(monkeypatch, step):
    """step() (returning tensors) through Triton's own launch path, then twice with the
    `ops.launch.CachedLaunch` cache on: (launches the second cached call took from the cache,
    whether its results are bitwise the first's). GPU tests only (the interpreter never caches)."""
    from moda_bench.kernels import launch
    hits = []
    idle = launch._hooks_idle   # asked only when a launch repeats from the cache
    monkeypatch.setattr(launch, "_hooks_idle", lambda: hits.append(1) or idle())

    def run():
        res = [x.detach().clone() for x in step()]
        torch.cuda.synchronize()
        return res

    old = launch.set_fast_launch(False)
    try:
        ref = run()
    finally:
        launch.set_fast_launch(old)
    monkeypatch.setattr(launch, "_FAST", True)
    run()
    n = len(hits)
    got = run()
    monkeypatch.setattr(launch, "_hooks_idle", idle)
    same = len(ref) == len(got) and all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(ref, got))
    return len(hits) - n, same


def markdown_table(lines) -> tuple[list[str], list[list[str]]]:
    """Header and body cells of the markdown table(s) in `lines` (the lines after a heading), up to
    the next heading; a section split into several tables (its configuration columns repeated in
    each) is joined back into one."""
    import re
    tables, tab = [], []
    for line in lines:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            tab.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip()[1:-1])])   # '\|' is in a cell
        elif tab:
            tables.append(tab)
            tab = []
    if tab:
        tables.append(tab)
    header, body = tables[0][0], [list(r) for r in tables[0][2:]]
    for t in tables[1:]:
        if len(t) - 2 != len(body):
            break
        n = 0
        while n < min(len(header), len(t[0])) and t[0][n] == header[n]:
            n += 1
        header = header + t[0][n:]
        body = [r + extra[n:] for r, extra in zip(body, t[2:])]
    return header, body


def compiled_sm90_json(imports: str, expression: str, timeout: int = 600):
    """json.loads of `expression` evaluated after `imports` in a fresh process without the Triton
    interpreter (the tests' kernels are interpreted functions; compiling for sm_90 needs the real
    ones), with tests/ and the checkout first on sys.path; pytest.skip with the error's last line
    where this machine's Triton cannot compile for sm_90."""
    import pytest
    here = os.path.dirname(os.path.abspath(__file__))
    code = f"import json, sys; sys.path[:0] = sys.argv[1:3]; {imports}; print(json.dumps({expression}))"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", code, here, os.path.dirname(here)], env=env, capture_output=True,
                         text=True, timeout=timeout)
    if run.returncode:
        pytest.skip(f"cannot compile for sm_90 here: {(run.stderr.strip().splitlines() or ['?'])[-1][:160]}")
    return json.loads(run.stdout.strip().splitlines()[-1])
