"""`moda_attention`, the public MoDA entry point: which implementation a call runs (impl "auto": the
fastest here) and running it.

Implementations (`IMPLS`; the benchmark provider of each in `PROVIDER_OF`):
* "triton": the fused Triton kernel (`triton.interface`), runs everywhere (CPU under TRITON_INTERPRET=1);
* "fa4": FlashAttention-4 for the sequence part + Triton depth launches, LSE merge (`fa4.merge.moda_fa4`);
* "overlap": FA4 + persistent depth kernels on a reserved share of the SMs (`fa4.overlap.moda_overlap`);
* "fused": the overlap route with the forward as one FA4 sm90 kernel with the depth tiles inside.

The choice ("auto") comes from per-GPU rules: package data in `dispatch_rules/<gpu-slug>.json` (the
slug of `config.gpu_slug`), made from committed sweep CSVs by `moda-bench dispatch --rules-from
RESULTS... --out moda_bench/kernels/moda/dispatch_rules` (`moda_bench.tuning.dispatch_rules`; the
file's "command" and "sources" name the command and CSVs it came from). A rules file lists measured
points (pass, dtype, d, G, L, T, B*Hk, depth_grad) with the implementations timed there, fastest
first. A call takes the nearest measured point (`distance`: log2 distance in T, G, L + 1, d and
B*Hk, plus penalties for another dtype, depth_grad, pass or timer: a training call's pass is
"fwdbwd", a forward-only call's "fwd"; a call captured into a CUDA graph is timed by the "graph"
timer, any other by "eager"), so between and beyond measured points the nearest one in log space
decides, and a sparsely measured pass or timer borrows the other's points; ties go to the earlier
point. A call farther than `MAX_DISTANCE` from every point is not guessed at: it runs "triton".
Of that point's ranking the first implementation available here runs (`unavailable`: no
CUDA, the interpreter, no FA4, not sm90, a dtype or shape an implementation refuses), else
"triton". No rules for this GPU: "triton". `set_rules` (or MODA_BENCH_DISPATCH_RULES=<file>) replaces the shipped rules.

The Triton kernel's own entry point (`triton.interface.moda_attention`, its custom op) is unchanged:
this module sits above it and above the FA4 routes (which import the Triton kernel's launches).
Under torch.compile "auto" is "triton" (its custom op traces as one graph node; the FA4 routes are
autograd Functions around CuTe DSL kernels). The decision is made in Python before any op, so the
custom op's signature is unchanged. Decisions are memoised per shape, dtype, device and flags.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from moda_bench.kernels.moda.config import MoDAConfig, dtype_name, gpu_slug
from moda_bench.kernels.moda.triton.interface import moda_attention as triton_moda_attention
from moda_bench.kernels.moda.validate import MoDAShape, check_inputs

IMPLS = ("triton", "fa4", "overlap", "fused")
PROVIDER_OF = {"triton": "moda-triton", "fa4": "moda-fa4", "overlap": "moda-overlap", "fused": "moda-fused"}
IMPL_OF = {p: i for i, p in PROVIDER_OF.items()}
RULES_SCHEMA_VERSION = 1
RULES_DIR = Path(__file__).with_name("dispatch_rules")  # package data; tests point it elsewhere
ENV_RULES = "MODA_BENCH_DISPATCH_RULES"
# distance weights: a doubling of T, G, L + 1 or B*Hk counts 1 (B*Hk 1/2), of d 2; another dtype 4,
# another pass 1, another depth_grad or timer 1/2
W_HEADS, W_D, W_DTYPE, W_GRAD, W_PASS, W_TIMER = 0.5, 2.0, 4.0, 0.5, 1.0, 0.5
# a call farther than this from every measured point runs "triton" (the route that runs everywhere
# and whose cost is known at every shape): one and a half doublings, e.g. T half the smallest T
# measured, or another head dim or dtype than any measured
MAX_DISTANCE = 1.5


@dataclass(frozen=True)
class Choice:
    """The implementation a call runs and why (one line, e.g. "h100 rule: nearest measured T=8192 G=8 L=64")."""

    impl: str
    reason: str

    def detail(self) -> str:
        return f"auto -> {self.impl} ({self.reason})"


_state: dict = {"override": None, "tables": {}, "memo": {}}


def read_rules(path) -> dict:
    """A rules file's dict, checked (ValueError naming the file when it is not one)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read MoDA dispatch rules ({type(exc).__name__}: {exc})") from None
    if not isinstance(data, dict) or data.get("schema_version") != RULES_SCHEMA_VERSION or "points" not in data:
        raise ValueError(f"{path}: not a MoDA dispatch rules file (schema_version {RULES_SCHEMA_VERSION})")
    return data


def set_rules(rules) -> None:
    """Use `rules` (a dict as in a rules file, a path, or None for the shipped files) for every GPU."""
    if rules is not None and not isinstance(rules, dict):
        rules = read_rules(rules)
    _state["override"] = rules
    _state["memo"].clear()


def rules_for(gpu: str) -> Optional[dict]:
    """The rules of GPU `gpu` (its name): the override, else $MODA_BENCH_DISPATCH_RULES, else the
    shipped file of its slug, else of the same model family (the slug's first two words,
    e.g. nvidia-h100-*), else None."""
    if _state["override"] is not None:
        return _state["override"]
    env = os.environ.get(ENV_RULES)
    if env:
        return _cached(Path(env))
    slug = gpu_slug(gpu)
    exact = RULES_DIR / f"{slug}.json"
    if exact.is_file():
        return _cached(exact)
    family = "-".join(slug.split("-")[:2])
    same = sorted(RULES_DIR.glob(f"{family}*.json")) if RULES_DIR.is_dir() else []
    return _cached(same[0]) if same else None


def _cached(path: Path) -> dict:
    key = str(path)
    if key not in _state["tables"]:
        _state["tables"][key] = read_rules(path)
    return _state["tables"][key]


def device_gpu(device) -> str:
    """The GPU name of a CUDA `device` (tests replace this)."""
    return torch.cuda.get_device_name(device)


def check_impl_name(impl: str, what: str = "impl") -> str:
    """impl when it is "auto" or one of IMPLS, else ValueError naming `what` (e.g. a model's moda_impl)."""
    if impl not in ("auto",) + IMPLS:
        raise ValueError(f"{what} must be auto or one of {', '.join(IMPLS)}, got {impl!r}")
    return impl


def shape_problem(impl: str, shape: MoDAShape, dtype) -> Optional[str]:
    """Why `impl` refuses this shape or dtype whatever the machine (None: it takes it)."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be 'auto' or one of {', '.join(IMPLS)}, got {impl!r}")
    if impl == "triton":
        return None
    if dtype not in (torch.float16, torch.bfloat16):
        return f"{impl}: FA4 takes fp16/bf16, not {dtype_name(dtype)}"
    if shape.d % 8 or not 8 <= shape.d <= 256:
        return f"{impl}: FA4 takes head dims that are multiples of 8 in [8, 256], not {shape.d}"
    if impl == "fused":
        from moda_bench.kernels.moda.fa4.merge import fused_shape_problem
        return fused_shape_problem(shape, dtype)
    return None


def unavailable(impl: str, shape: MoDAShape, dtype, device) -> Optional[str]:
    """Why `impl` cannot run this call here (None: it can). "triton" always can."""
    why = shape_problem(impl, shape, dtype)
    if why is not None or impl == "triton":
        return why
    if torch.device(device).type != "cuda":
        return f"{impl} needs a CUDA device (got {device})"
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        return f"{impl} does not run under TRITON_INTERPRET=1"
    from moda_bench.kernels.moda.fa4 import merge
    return merge.fused_fwd_unavailable(shape, dtype, device) if impl == "fused" else merge.fa4_unavailable(device)


def point_of(shape: MoDAShape, dtype, depth_grad: bool, training: bool = True, graph: bool = False) -> dict:
    """A call as `distance` compares it with the rules' points."""
    return {"dtype": dtype_name(dtype), "d": shape.d, "G": shape.G, "L": shape.L, "T": shape.T,
            "heads": shape.B * shape.Hk, "depth_grad": int(bool(depth_grad)),
            "pass": "fwdbwd" if training else "fwd", "timer": "graph" if graph else "eager"}


def distance(a: dict, b: dict) -> float:
    """How far measured point b is from call a (module docstring)."""
    lg = math.log2
    return (abs(lg(max(a["T"], 1)) - lg(max(b["T"], 1))) + abs(lg(max(a["G"], 1)) - lg(max(b["G"], 1)))
            + abs(lg(a["L"] + 1) - lg(b["L"] + 1)) + W_D * abs(lg(a["d"]) - lg(b["d"]))
            + W_HEADS * abs(lg(max(a["heads"], 1)) - lg(max(b["heads"], 1)))
            + W_DTYPE * (a["dtype"] != b["dtype"]) + W_GRAD * (int(a["depth_grad"]) != int(b["depth_grad"]))
            + W_PASS * (a.get("pass", "fwdbwd") != b.get("pass", "fwdbwd"))
            + W_TIMER * (a.get("timer", "eager") != b.get("timer", "eager")))


def nearest(rules: dict, call: dict) -> Optional[dict]:
    """The measured point of `rules` nearest to `call` (`point_of`; module docstring), or None."""
    points = rules.get("points", [])
    return min(points, key=lambda p: distance(call, p)) if points else None


def capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (the call will be replayed: device time
    decides, the rules' "graph" points)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _where(p: dict) -> str:
    timer = "" if p.get("timer", "eager") == "eager" else " graph"
    return (f"nearest measured {p.get('pass')}{timer} T={p['T']} G={p['G']} L={p['L']} d={p['d']} {p['dtype']}"
            + ("" if p.get("depth_grad", 1) else " detached"))


def choose(shape: MoDAShape, dtype, device, *, depth_grad: bool = True, training: bool = True,
           impl: str = "auto", gpu: Optional[str] = None, graph: bool = False) -> Choice:
    """The implementation `moda_attention(impl=impl)` runs for this call, with the reason. gpu (a GPU
    name): decide by that GPU's rules as if every implementation were installed there (only
    `shape_problem` rules one out), whatever this machine has. graph: the call is being captured
    into a CUDA graph (`capturing`): the rules' graph-timer points are the nearer ones."""
    key = (shape, dtype, str(device), bool(depth_grad), bool(training), impl, gpu, bool(graph),
           os.environ.get(ENV_RULES))
    hit = _state["memo"].get(key)
    if hit is None:
        hit = _choose(shape, dtype, device, depth_grad, training, impl, gpu, graph)
        if len(_state["memo"]) >= 1024:
            _state["memo"].clear()
        _state["memo"][key] = hit
    return hit


def _choose(shape, dtype, device, depth_grad, training, impl, gpu, graph) -> Choice:
    if gpu is None:
        def why_not(i):
            return unavailable(i, shape, dtype, device)
    else:
        def why_not(i):
            return shape_problem(i, shape, dtype)
    if impl != "auto":
        why = why_not(impl)
        return Choice(impl, "asked for") if why is None else Choice("triton", f"{impl} unavailable: {why}")
    if gpu is None:
        if torch.device(device).type != "cuda":
            return Choice("triton", f"not a CUDA device ({device})")
        gpu = device_gpu(device)
    rules = rules_for(gpu)
    words = gpu_slug(gpu).split("-")
    tag = words[1] if len(words) > 1 else words[0]
    if rules is None:
        return Choice("triton", f"no dispatch rules for {gpu}")
    call = point_of(shape, dtype, depth_grad, training, graph)
    point = nearest(rules, call)
    if point is None:
        return Choice("triton", f"{tag} rules have no points")
    if distance(call, point) > MAX_DISTANCE:
        return Choice("triton", f"{tag} rules: nothing measured near this call; {_where(point)}")
    skipped, first_why = [], None
    for entry in point["ranking"]:
        why = why_not(entry["impl"])
        if why is None:
            break
        skipped.append(entry["impl"])
        first_why = first_why or why
    else:
        entry = {"impl": "triton"}
    more = f"; {', '.join(skipped)} unavailable ({first_why})" if skipped else ""
    return Choice(entry["impl"], f"{tag} rule: {_where(point)}{more}")


def moda_attention(q, k, v, k_depth=None, v_depth=None, *, scale: float | None = None, return_lse: bool = False,
                   config: MoDAConfig | None = None, depth_grad: bool = True, impl: str = "auto"):
    """Mixture-of-Depths Attention (autograd-enabled) by the fastest implementation here.

    q (B,T,Hq,d); k, v (B,T,Hk,d); k_depth, v_depth (B,T,L,Hk,d) or None (L = 0: causal GQA). Each
    query attends causally to the sequence keys and to the L depth keys of its own position, under
    one softmax. Returns out (B,T,Hq,d) in q's dtype, and lse (B,T,Hq) float32 when return_lse.
    depth_grad=False treats k_depth, v_depth as constants. Every implementation keeps this contract
    (the Triton kernel's, `triton.interface.moda_attention`, documents it in full).

    impl: "auto" (`choose`: this GPU's rules, the module docstring), or one of `IMPLS` ("triton",
    "fa4", "overlap", "fused"); an implementation that cannot run the call here falls back to
    "triton", never an error. `config`: with impl "auto" or "triton" the Triton kernel's config (and
    then the Triton kernel runs); with another impl, that route's config (`moda_fa4`'s MoDAConfig).
    """
    if impl != "triton" and (config is None or impl != "auto") and not torch.compiler.is_compiling():
        shape = check_inputs(q, k, v, k_depth, v_depth, need_cuda=True)
        grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, k_depth, v_depth))
        choice = choose(shape, q.dtype, q.device, depth_grad=depth_grad, training=grad, impl=impl,
                        graph=q.device.type == "cuda" and capturing())
        if choice.impl != "triton":
            return run(choice, q, k, v, k_depth, v_depth, scale=scale, return_lse=return_lse, depth_grad=depth_grad,
                       config=config)
    return triton_moda_attention(q, k, v, k_depth, v_depth, scale=scale, return_lse=return_lse, config=config,
                                 depth_grad=depth_grad)


def run(choice: Choice, q, k, v, k_depth, v_depth, *, scale, return_lse: bool, depth_grad: bool, config=None):
    """Run a non-Triton `choice` (the caller runs "triton" itself). `config` goes to moda_fa4 /
    moda_overlap as their config (None: their own resolution)."""
    from moda_bench.kernels.moda.fa4.merge import moda_fa4
    from moda_bench.kernels.moda.fa4.overlap import moda_overlap, overlap_config
    kw = dict(scale=scale, return_lse=return_lse, depth_grad=depth_grad)
    if choice.impl == "fa4":
        return moda_fa4(q, k, v, k_depth, v_depth, config=config, **kw)
    if choice.impl == "overlap":
        return moda_overlap(q, k, v, k_depth, v_depth, config=config, **kw)
    if choice.impl == "fused":
        if config is None:
            shape = MoDAShape(*q.shape[:2], q.shape[2], k.shape[2], q.shape[3], k_depth.shape[2])
            config = overlap_config(shape, q.dtype, q.device, depth_grad=depth_grad)
        return moda_overlap(q, k, v, k_depth, v_depth, config=config.replace(fa4_fused_fwd=True), **kw)
    raise ValueError(f"dispatch.run: {choice.impl!r} is not an implementation it runs")


# the shapes `moda-bench dispatch` explains: B=1, Hk=8, d=64, bf16, training, depth gradients on
STANDARD_SHAPES = tuple((T, G, L) for T in (1024, 2048, 4096, 8192, 16384, 32768, 65536) for G, L in ((8, 64),)) \
    + ((4096, 2, 256), (16384, 2, 64), (16384, 8, 256))


def explain(shapes=STANDARD_SHAPES, device=None, dtype=torch.bfloat16, B: int = 1, Hk: int = 8, d: int = 64,
            depth_grad: bool = True, training: bool = True, gpu: Optional[str] = None,
            graph: bool = False) -> list[str]:
    """One line per (T, G, L) of `shapes`: the implementation `moda_attention` would pick here (gpu:
    on that GPU with every implementation installed, `choose`)."""
    if device is None:
        device = f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
    lines = [] if gpu is None else [f"as on {gpu} with flash-attn-4 installed (rules: {_source(gpu)})"]
    for T, G, L in shapes:
        shape = MoDAShape(B=B, T=T, Hq=Hk * G, Hk=Hk, d=d, L=L)
        c = choose(shape, dtype, device, depth_grad=depth_grad, training=training, gpu=gpu, graph=graph)
        lines.append(f"T={T:<6} G={G:<3} L={L:<4} d={d} {dtype_name(dtype)}: {c.detail()}")
    return lines


def _source(gpu: str) -> str:
    rules = rules_for(gpu)
    return "none" if rules is None else f"{len(rules.get('points', []))} points of {rules.get('gpu', '?')}"
