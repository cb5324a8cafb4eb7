"""`moda-bench model`: what a whole decoder step costs, per variant, as schema.MODEL_COLUMNS rows.

One `ModelSpec` (built by the command line, or a preset's) says which configuration, how many of
its layers, which variants, which mode (a training step: forward, backward, gradient clipping
and an AdamW step over grad_accum micro-batches; a prefill; a generation of new_tokens after
the prompt through a KV cache), batch, sequence length, dtype, eager or torch.compile, and which
MoDA implementation eager MoDA layers run (moda_impl: "auto", the dispatcher's choice per layer
shape, or one of `dispatch.IMPLS`; a row's impl_detail says what each layer ran).

All variants share one `models.Decoder` (one set of weights plus each variant's own
parameters) and one AdamW, so they fit side by side: each is staged (one untimed step, its
peak memory read), then on CUDA they are timed in interleaved rounds by the sweep's machinery
(`point.time_interleaved`: samplers of `timing`, paired rounds, 95% intervals, GPU state),
with the ratio of each to vanilla and its interval from the paired rounds. Off CUDA each is
timed on its own by wall clock (tests). Rows are appended as they finish.

`moda-bench model --preset NAME` runs the specs of the preset file sweeps/model/NAME.toml
(`preset_specs`).
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from moda_bench import results, schema
from moda_bench.bench.point import TimingOptions, guarded, release, torch_dtype
from moda_bench.models.config import VARIANTS, ModelConfig, get_config

DETACHED = "moda-detached"     # MoDA with detached depth (the kernels' depth_grad=False)
RUN_VARIANTS = VARIANTS + (DETACHED,)
BASELINE = "vanilla"
DEPTH_READS = ("in-place", "copy")
# --depth-grad-add -> Decoder.depth_grad_in_kernel (None: `accumulate.in_kernel_default` decides)
DEPTH_GRAD_IN_KERNEL = {"auto": None, "kernel": True, "after": False}
DEPTH_GRAD_ADDS = tuple(DEPTH_GRAD_IN_KERNEL)
ADAMW = {"lr": 1e-3, "betas": (0.9, 0.95), "weight_decay": 0.1}   # seed 002, Table 8
CLIP_NORM = 1.0


@dataclass(frozen=True)
class ModelSpec:
    """One `moda-bench model` run. layers / seq_len 0: the configuration's; dtype '': its own; health:
    the start verdict of the GPU health canary, written into every row."""

    model: str = "smoke"
    variants: tuple = RUN_VARIANTS
    mode: str = "train"
    layers: int = 0
    batch: int = 1
    grad_accum: int = 1
    seq_len: int = 0
    new_tokens: int = 32
    dtype: str = ""
    compile: bool = False
    timing: TimingOptions = field(default_factory=TimingOptions)
    seed: int = 0
    name: str = ""
    moda_impl: str = "auto"
    health: str = ""          # the GPU's verdict at the start of the run (the rows' `health`)
    depth_read: str = "in-place"   # MoDA layers read their depth slice in place, or copy it first ("copy")
    depth_grad_add: str = "auto"   # attached depth gradients added in the backward kernel, after it, or auto

    def __post_init__(self):
        from moda_bench.kernels.moda.dispatch import check_impl_name
        object.__setattr__(self, "variants", tuple(dict.fromkeys(self.variants)))
        if self.depth_read not in DEPTH_READS:
            raise ValueError(f"depth_read must be one of {', '.join(DEPTH_READS)}, got {self.depth_read!r}")
        if self.depth_grad_add not in DEPTH_GRAD_ADDS:
            raise ValueError(f"depth_grad_add must be one of {', '.join(DEPTH_GRAD_ADDS)}, got {self.depth_grad_add!r}")
        check_impl_name(self.moda_impl, "moda_impl")
        if self.mode not in schema.MODEL_MODES:
            raise ValueError(f"mode must be one of {', '.join(schema.MODEL_MODES)}, got {self.mode!r}")
        bad = [v for v in self.variants if v not in RUN_VARIANTS]
        if bad or not self.variants:
            raise ValueError(f"variants must be among {', '.join(RUN_VARIANTS)}, got {', '.join(bad) or 'none'}")
        for name in ("batch", "grad_accum", "new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        get_config(self.model)
        if self.dtype:
            schema.dtype_name(self.dtype)

    def config(self) -> ModelConfig:
        """The configuration as run (fewer layers, another sequence length where asked)."""
        cfg = get_config(self.model)
        if self.layers:
            cfg = cfg.with_layers(self.layers)
        if self.seq_len:
            cfg = cfg.replace(seq_len=self.seq_len)
        return cfg

    def dtype_name(self) -> str:
        return schema.dtype_name(self.dtype) if self.dtype else self.config().dtype

    @property
    def label(self) -> str:
        """The run's name (its CSV's, its rows' sweep "model-<label>"): name, else model-mode, with
        the pinned MoDA implementation, depth read and gradient addition where they are not the
        defaults (an A/B into one --out keeps its runs apart)."""
        pinned = "" if self.moda_impl == "auto" else f"-moda-{self.moda_impl}"
        pinned += "" if self.depth_read == "in-place" else f"-depth-{self.depth_read}"
        pinned += "" if self.depth_grad_add == "auto" else f"-grad-{self.depth_grad_add}"
        return (self.name or f"{self.model}-{self.mode}") + pinned

    def replace(self, **kw) -> "ModelSpec":
        return dataclasses.replace(self, **kw)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["variants"] = list(self.variants)
        return d


def model_variant(run_variant: str) -> tuple[str, bool]:
    """(the Decoder's variant, depth_grad) of a run variant ('moda-detached': moda, False)."""
    return ("moda", False) if run_variant == DETACHED else (run_variant, True)


def step_flops(spec: ModelSpec, cfg: ModelConfig, variant: str) -> float:
    from moda_bench.models import flops
    if spec.mode == "train":
        return flops.train_flops(cfg, variant, spec.batch, cfg.seq_len, spec.grad_accum)
    if spec.mode == "prefill":
        return flops.prefill_flops(cfg, variant, spec.batch, cfg.seq_len)
    return flops.generate_flops(cfg, variant, spec.batch, cfg.seq_len, spec.new_tokens)


def step_tokens(spec: ModelSpec, cfg: ModelConfig) -> int:
    """Tokens a step processes: trained, prefilled, or generated."""
    if spec.mode == "train":
        return spec.batch * cfg.seq_len * spec.grad_accum
    if spec.mode == "prefill":
        return spec.batch * cfg.seq_len
    return spec.batch * spec.new_tokens


def peak_tflops(gpu: str) -> float:
    """The GPU's matmul peak the doctor compares against (its KNOWN_GPUS table), NaN if unknown."""
    from moda_bench.health import known_reference
    ref = known_reference(gpu)
    return float(ref["matmul_tflops"]) if ref else math.nan


def base_row(spec: ModelSpec, cfg: ModelConfig, run_variant: str, meta: dict) -> dict:
    """A model row of one variant with no measurement yet."""
    from moda_bench.models import flops
    variant, depth_grad = model_variant(run_variant)
    row = {c: math.nan for c in schema.MODEL_MEASURE_COLUMNS}
    row.update({"sweep": f"model-{spec.label}", "provider": variant, "impl_detail": "", "pass": spec.mode,
                "model": cfg.name, "layers": cfg.layers, "layers_total": cfg.layers_total, "B": spec.batch,
                "T": cfg.seq_len, "grad_accum": spec.grad_accum if spec.mode == "train" else 1,
                "new_tokens": spec.new_tokens if spec.mode == "generate" else 0, "dtype": spec.dtype_name(),
                "depth_grad": int(depth_grad), "compiled": int(spec.compile), "status": "", "reason": "",
                "timer": spec.timing.timer, "stop_reason": "", "health": spec.health})
    row.update(meta)
    row["params"] = flops.param_count(cfg, variant)
    row["model_flops"] = step_flops(spec, cfg, variant)
    row["peak_tflops"] = peak_tflops(str(meta.get("gpu", "")))
    if flops.depth_slots(cfg, variant) and spec.mode != "generate":
        size = torch_dtype(row["dtype"]).itemsize
        row["depth_kv_gb"] = flops.depth_kv_bytes(cfg, spec.batch, cfg.seq_len, size, variant) / 1e9
    return row


class Staged:
    """A variant ready to time: its row, its step callable and no gradient leaves (the step
    sets its own gradients to None)."""

    def __init__(self, row: dict, fn: Callable[[], object], flops: float):
        self.row, self.fn, self.grads, self.flops, self.work, self.rates = row, fn, [], flops, None, None


def graph_breaks(fn, *args) -> int:
    """Graph breaks of torch.compile(fn) on args (`torch._dynamo.explain`; runs fn once)."""
    import torch
    return int(torch._dynamo.explain(fn)(*args).graph_break_count)


def make_step(spec: ModelSpec, model, optimizer, inputs, run_variant: str, row: Optional[dict] = None):
    """The timed callable of a mode for one variant. Compiled (train, prefill): the depth buffer
    is allocated first (`Decoder.prepare`), the graph breaks are counted into row["graph_breaks"]
    (a variant that breaks still runs, compiled in pieces)."""
    import torch
    from torch.profiler import record_function

    from moda_bench.models import generate, prefill
    variant, depth_grad = model_variant(run_variant)
    row = {} if row is None else row
    B, T = inputs[0].shape[0], inputs[0].shape[1] - 1
    if spec.mode == "train":
        def loss_of(tokens):
            return model.loss(tokens, variant, depth_grad=depth_grad)
        loss_fn = loss_of
        if spec.compile:
            model.prepare(variant, B, T, depth_grad=depth_grad)
            row["graph_breaks"] = graph_breaks(loss_of, inputs[0])
            loss_fn = torch.compile(loss_of)
        params = [p for p in model.parameters()]

        def train_step():
            optimizer.zero_grad(set_to_none=True)
            for micro in inputs:
                (loss_fn(micro) / len(inputs)).backward()
            with record_function("optimizer"):
                torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], CLIP_NORM)
                optimizer.step()
        return train_step
    prompt = inputs[0][:, :-1]
    if spec.mode == "prefill":
        fwd = model
        if spec.compile:
            model.prepare(variant, B, T, grad=False)
            with torch.no_grad():
                row["graph_breaks"] = graph_breaks(lambda p: model(p, variant, last_only=True), prompt)
            fwd = torch.compile(model)
        return lambda: prefill(fwd, prompt, variant)
    return lambda: generate(model, prompt, variant, spec.new_tokens)


def impl_detail(model, run_variant: str, spec: Optional[ModelSpec] = None) -> str:
    """What ran: the sequence attention of vanilla layers, and the variant's own kernels (MoDA:
    the implementation of each layer, `moda_detail`; spec None: a default ModelSpec's step)."""
    variant, depth_grad = model_variant(run_variant)
    text = f"sequence: {model.seq_attn_name}"
    if variant == "moda":
        spec = spec or ModelSpec(model.cfg.name)
        text += "; moda: " + moda_detail(model, spec, depth_grad) + ", depth " + ("attached" if depth_grad else
                                                                                  "detached")
        text += ", depth slices copied first" if spec.depth_read == "copy" else ""
        if depth_grad and spec.depth_grad_add != "auto":
            text += f", depth gradients added {'in the kernel' if spec.depth_grad_add == 'kernel' else 'after it'}"
    elif variant == "depth-attention":
        from moda_bench.kernels.dattn import chain_backend
        w = model.embed.weight
        text += "; mix: Triton" + (", chained with FA4" if chain_backend(w.device, w.dtype) is not None else "")
    elif variant == "depth-attention-torch":
        text += "; mix: plain PyTorch"
    return text


def moda_detail(model, spec: ModelSpec, depth_grad: bool) -> str:
    """The MoDA implementation(s) of a step's layers: compiled, the Triton custom op; eager, the
    model's `moda_routes` grouped by implementation, each with its depth-slot counts L, its layer
    count and the reason of its first layer (e.g. "auto -> fused for L=2..46 (23 layers; h100
    rule: ...)"); generate: the prefill's (decode steps run moda_decode)."""
    if spec.compile:
        ignored = "" if model.moda_impl in ("auto", "triton") else f"; moda_impl {model.moda_impl} not applied"
        return f"triton (custom op, compiled{ignored})"
    B, T = spec.batch, spec.config().seq_len
    routes = model.moda_routes(B, T, depth_grad=depth_grad, training=spec.mode == "train")
    groups: dict = {}
    for L, choice in routes:
        groups.setdefault(choice.impl, []).append((L, choice.reason))
    parts = []
    for impl, items in groups.items():
        Ls = [L for L, _ in items]
        where = f"L={Ls[0]}" if len(set(Ls)) == 1 else f"L={min(Ls)}..{max(Ls)}"
        count = f"{len(items)} layer" + ("s" if len(items) > 1 else "")
        parts.append(f"{impl} for {where} ({count}; {items[0][1]})")
    text = f"{model.moda_impl} -> " + ", ".join(parts)
    return text + ("; decode: moda_decode" if spec.mode == "generate" else "")


def cpu_timer(fn, grad_to_none=None, warmup_ms: float = 0.0, rep_ms: float = 0.0, samples: int = 3) -> dict:
    """Wall-clock repetitions off CUDA (one warm-up call, then `samples`): a `point` timer."""
    from moda_bench.timing import summarize
    fn()
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return summarize(times, "samples", "wall").row() | {"timer": "wall"}


def run_model(spec: ModelSpec, csv_path: Path, *, device: Optional[str] = None, progress: bool = True,
              console=None, timer: Optional[Callable] = None, on_model=None):
    """Stage and time every variant of `spec`, appending one row each to csv_path (written as
    they finish); returns the rows as a DataFrame. timer: a `point` timer (default: interleaved
    rounds on CUDA, `cpu_timer` elsewhere). on_model(model, staged): called before the model
    is freed (the profiler's hook)."""
    import pandas as pd
    import torch

    from moda_bench.bench.point import time_interleaved, time_sequential
    from moda_bench.models import Decoder

    cfg = spec.config()
    if spec.compile:   # every variant compiles the same step code: one cache entry each (plus explain's)
        torch._dynamo.reset()
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 4 * len(spec.variants))
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    on_cuda = str(device).startswith("cuda")
    dtype = torch_dtype(spec.dtype_name())
    torch.manual_seed(spec.seed)
    variants = tuple(dict.fromkeys(model_variant(v)[0] for v in spec.variants))
    model = Decoder(cfg, variants, dtype=dtype, device=device, moda_impl=spec.moda_impl)
    model.depth_copy = spec.depth_read == "copy"
    model.depth_grad_in_kernel = DEPTH_GRAD_IN_KERNEL[spec.depth_grad_add]
    optimizer = torch.optim.AdamW(model.parameters(), **ADAMW, foreach=on_cuda)
    gen = torch.Generator(device="cpu").manual_seed(spec.seed)
    micro = spec.grad_accum if spec.mode == "train" else 1
    inputs = [torch.randint(0, cfg.vocab, (spec.batch, cfg.seq_len + 1), generator=gen).to(device)
              for _ in range(micro)]
    meta = schema.run_metadata(None if not on_cuda else torch.cuda.current_device())
    order = sorted(spec.variants, key=lambda v: v != BASELINE)
    csv_path = Path(csv_path)
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    bar = task = None
    if progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                       console=console, transient=False)
        task = bar.add_task(f"model {spec.label}: staging", total=len(order) + 1)
        bar.start()
    staged, rows = {}, []
    try:
        for name in order:
            row = base_row(spec, cfg, name, meta)
            rows.append(row)
            row["impl_detail"] = impl_detail(model, name, spec)
            st = guarded(row, device, lambda name=name, row=row: stage(spec, model, optimizer, inputs, name, row,
                                                                          on_cuda))
            if st is not None:
                staged[name] = st
            if bar is not None:
                bar.update(task, advance=1, description=f"model {spec.label}: staged {name}")
        if bar is not None:
            bar.update(task, description=f"model {spec.label}: timing {len(staged)} variants")
        result = None
        if staged:
            if timer is not None or not on_cuda:
                time_sequential(staged, timer or cpu_timer, spec.timing)
            else:
                result = time_interleaved(staged, spec.timing, torch.cuda.current_device())
        fill_model_columns(staged, result, spec, cfg)
        if on_model is not None:
            on_model(model, staged)
        if bar is not None:
            bar.update(task, advance=1)
    finally:
        if bar is not None:
            bar.stop()
        staged.clear()
        model.drop_buffers()
        model = optimizer = None   # the weights, gradients and AdamW state go before the next run
        release(device)
    for row in rows:
        results.append_model_row(csv_path, row)
    return pd.DataFrame(rows, columns=schema.MODEL_COLUMNS)


def resume_state(spec: ModelSpec, csv_path: Path, *, gpu: str, commit: str, allow_commit_change: bool = False) -> str:
    """What `--resume` does with this run (its own CSV, `model_<label>.csv`): 'done' when the CSV
    holds a row of every variant, measured on this GPU and commit; else 'run' (no rows yet, or a
    cut run: its partial CSV is removed and the run starts over). ResumeRefused for rows of another
    GPU, or of another commit unless allow_commit_change."""
    from moda_bench.bench.runstate import check_identity
    csv_path = Path(csv_path)
    if not csv_path.exists() or csv_path.stat().st_size == 0:
        return "run"
    frame = results.read_models([csv_path], warn=lambda text: None)
    if not frame.empty:
        check_identity(frame, str(csv_path), gpu, commit, allow_commit_change)
        have = {(str(r["provider"]), int(r["depth_grad"])) for r in frame.to_dict("records")
                if r["depth_grad"] == r["depth_grad"]}
        want = {(name, int(grad)) for name, grad in map(model_variant, spec.variants)}
        if want <= have:
            return "done"
    csv_path.unlink()
    return "run"


def stage(spec: ModelSpec, model, optimizer, inputs, name: str, row: dict, on_cuda: bool) -> Staged:
    """The variant's step, run once (compilation, lazy optimizer state), then on CUDA once more
    with its peak memory read: the first step creates the variant's AdamW state inside it (a
    measure of it would hold no state during the forward and backward, while a later variant's
    holds all before it), the second runs as a timed step does. Eager, the other variants' depth
    buffers are dropped first (each step allocates its own again); compiled, they stay (the
    compiled steps of the variants staged before use them) and their bytes are left out of this
    variant's peak. Its depth buffers' sizes are read after the step."""
    import torch
    if not spec.compile:
        model.drop_buffers()
    fn = make_step(spec, model, optimizer, inputs, name, row)
    others, own = 0, None
    if spec.compile:
        variant, depth_grad = model_variant(name)
        own = model.prepare(variant, inputs[0].shape[0], inputs[0].shape[1] - 1, depth_grad=depth_grad,
                            grad=spec.mode == "train")
        others = sum(b.nbytes() + b.grad_nbytes() for b in model.depth_buffers() if b is not own)
    fn()
    if on_cuda:
        if not spec.compile:
            model.drop_buffers()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        row["peak_mem_gb"] = (torch.cuda.max_memory_allocated() - others) / 1e9
    if spec.mode != "generate":
        held = ([own] if own is not None else []) if spec.compile else model.depth_buffers()
        kv, grad = sum(b.nbytes() for b in held), sum(b.grad_nbytes() for b in held)
        row["depth_buffer_gb"], row["depth_grad_buffer_gb"] = kv / 1e9, grad / 1e9
    return Staged(row, fn, row["model_flops"])


def fill_model_columns(staged: dict, result, spec: ModelSpec, cfg: ModelConfig) -> None:
    """step_ms (+ p20/p80), tokens/s, MFU, peak memory over vanilla's and the ratio to vanilla
    (with its paired-round interval on CUDA) of every timed row."""
    from moda_bench.timing import ratio_ci
    tokens = step_tokens(spec, cfg)
    for name, st in staged.items():
        row = st.row
        if row.get("status") != schema.OK:
            continue
        base = staged.get(BASELINE)
        if base is not None and base.row.get("status") == schema.OK:
            row["peak_over_vanilla_gb"] = row.get("peak_mem_gb", math.nan) - base.row.get("peak_mem_gb", math.nan)
        ms = row.get("median_ms", math.nan)
        row.update(step_ms=ms, step_p20_ms=row.get("p20_ms"), step_p80_ms=row.get("p80_ms"),
                   tokens_per_s=tokens / (ms / 1e3) if ms and ms > 0 else math.nan)
        row["mfu"] = row["model_flops"] / (ms / 1e3) / (row["peak_tflops"] * 1e12) if ms and ms > 0 else math.nan
        base = staged.get(BASELINE)
        if base is None or base.row.get("status") != schema.OK:
            continue
        if result is not None and name in result.round_medians and BASELINE in result.round_medians:
            r, lo, hi = (1.0, 1.0, 1.0) if name == BASELINE else ratio_ci(result.round_medians[name],
                                                                          result.round_medians[BASELINE])
        else:
            r, lo, hi = ms / base.row["median_ms"], math.nan, math.nan
        row.update(ratio_to_vanilla=r, ratio_to_vanilla_lo=lo, ratio_to_vanilla_hi=hi)


# Named runs (`moda-bench model --preset NAME`) are TOML files in the shipped presets' `model/`
# folder (sweeps/model/ in a checkout): seed 002's training table, seed 000's MoDA sizes, seed
# 002's generation run, a smoke run. Each file: `description` and `[[run]]` tables of ModelSpec
# fields (model, variants, mode, layers, batch, grad_accum, seq_len, new_tokens, dtype, name, moda_impl,
# depth_read, depth_grad_add).
PRESET_FIELDS = ("model", "variants", "mode", "layers", "batch", "grad_accum", "seq_len", "new_tokens", "dtype",
                 "name", "moda_impl", "depth_read", "depth_grad_add")


def model_presets() -> dict[str, Path]:
    """{name: file} of the shipped model presets, sorted by name."""
    from moda_bench.bench.presets import sweeps_dir
    return {p.stem: p for p in sorted((sweeps_dir() / "model").glob("*.toml"))}


def read_model_preset(path: Path) -> tuple[ModelSpec, ...]:
    """The runs of one model preset file; ValueError naming the file and key for a bad one."""
    import tomllib
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{path}: cannot read the model preset: {exc}") from None
    runs = data.get("run")
    if not isinstance(runs, list) or not runs:
        raise ValueError(f"{path}: run: a model preset needs at least one [[run]] table")
    if extra := [k for k in data if k not in ("description", "run")]:
        raise ValueError(f"{path}: {extra[0]}: unknown key (known: description, run)")
    specs = []
    for i, run in enumerate(runs):
        if extra := [k for k in run if k not in PRESET_FIELDS]:
            raise ValueError(f"{path}: run[{i}].{extra[0]}: unknown key (known: {', '.join(PRESET_FIELDS)})")
        kw = dict(run)
        if "variants" in kw:
            kw["variants"] = tuple(kw["variants"])
        try:
            specs.append(ModelSpec(**kw))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}: run[{i}]: {exc}") from None
    return tuple(specs)


def preset_specs(name: str, **overrides) -> tuple[ModelSpec, ...]:
    """The specs of preset `name` (a shipped preset's name or a .toml path) with the given fields
    replaced (those not None), else ValueError listing the presets."""
    shipped = model_presets()
    if name.endswith(".toml") or "/" in name:
        if not Path(name).is_file():
            raise ValueError(f"{name}: no such model preset file")
        specs = read_model_preset(Path(name))
    elif name in shipped:
        specs = read_model_preset(shipped[name])
    else:
        raise ValueError(f"unknown model preset {name!r}; known: {', '.join(shipped)}, or the path of a .toml file")
    kw = {k: v for k, v in overrides.items() if v is not None}
    return tuple(s.replace(**kw) for s in specs)


def record_run(out: Path, command: str, specs, *, gpu_header: list | None = None) -> Path:
    """Write or extend `<out>/run.json` (the folder's provenance, as `sweep` writes its own): the
    command appended to `commands` (once), each spec's fields under `runs` by label, the GPU's
    health-check header, versions, commit and the time. Keys another tool added are kept."""
    from moda_bench.bench.sweep import RUN_RECORD, read_run_record
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / RUN_RECORD
    record = read_run_record(out)
    record = record if isinstance(record, dict) else {}
    commands = [str(c) for c in record.get("commands", [])] if isinstance(record.get("commands"), list) else []
    if command not in commands:
        commands.append(command)
    meta = schema.run_metadata()
    runs = dict(record.get("runs") or {})
    for spec in specs:
        d = dataclasses.asdict(spec)
        d["variants"] = list(spec.variants)
        runs[spec.label] = d
    record.update(commands=commands, runs=runs, gpu=meta["gpu"], torch=meta["torch_version"],
                  triton=meta["triton_version"], commit=meta["git_commit"], updated=meta["timestamp"])
    if gpu_header:
        record["gpu_header"] = gpu_header
    record.setdefault("date", meta["timestamp"])
    results.write_json_atomic(path, record, indent=1)
    return path
