"""torch.compile(fullgraph=True) of the model of `moda-bench model` (issue 59, item 3), on the CPU
under the Triton interpreter: every variant's `Decoder.loss` traces with no graph break (the
depth buffer's reads and writes are custom ops threaded by a token, the buffer is allocated by
`Decoder.prepare` before the compiled region); the compiled loss and every parameter gradient
equal eager's (aot_eager: to 1e-6 relative; inductor, slow: to 1e-5 relative, fp32); the compiled
step's MoDA kernels read the depth buffer in place; a compiled prefill equals eager's."""
from __future__ import annotations

import json

import pytest
import torch

from moda_bench.bench.model import RUN_VARIANTS, model_variant
from moda_bench.models.config import get_config
from moda_bench.models.decoder import Decoder

# 3 layers, Depth-Attention stride 1 (every layer reads every earlier one: a slot read by several)
CFG = get_config("smoke").replace(layers=3, dattn_stride=1, seq_len=11)
CFG4 = get_config("smoke").replace(dattn_stride=1, seq_len=13)
FAST_COMPILE = ("moda", "depth-attention", "depth-attention-torch")


def _model(cfg, run_variant, seed=0):
    variant, depth_grad = model_variant(run_variant)
    torch.manual_seed(seed)
    model = Decoder(cfg, (variant,))
    tokens = torch.randint(0, cfg.vocab, (2, cfg.seq_len + 1), generator=torch.Generator().manual_seed(seed + 1))
    model.prepare(variant, 2, cfg.seq_len, depth_grad=depth_grad)
    return model, tokens, (lambda t: model.loss(t, variant, depth_grad=depth_grad))


def _loss_and_grads(model, fn, tokens):
    model.zero_grad(set_to_none=True)
    loss = fn(tokens)
    loss.backward()
    return [loss.detach()] + [p.grad.clone() for p in model.parameters() if p.grad is not None]


def _max_rel(got, want):
    assert len(got) == len(want)
    return max(float((a - b).norm() / (b.norm() + 1e-30)) for a, b in zip(got, want))


@pytest.mark.parametrize("run_variant", RUN_VARIANTS)
def test_every_variant_traces_with_no_graph_break(run_variant):
    model, tokens, fn = _model(CFG, run_variant)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(fn)(tokens)
    assert explained.graph_break_count == 0, [str(r.reason)[:300] for r in explained.break_reasons]
    assert explained.graph_count == 1


def _compiled_matches_eager(cfg, run_variant, backend, tol):
    model, tokens, fn = _model(cfg, run_variant)
    eager = _loss_and_grads(model, fn, tokens)
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    for _ in range(2):   # the second step reuses the buffer (its gradients zeroed by the step's start)
        got = _loss_and_grads(model, compiled, tokens)
        assert _max_rel(got, eager) <= tol


@pytest.mark.parametrize("run_variant", FAST_COMPILE)
def test_compiled_loss_and_gradients_equal_eager(run_variant):
    _compiled_matches_eager(CFG, run_variant, "aot_eager", 1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("run_variant", ("moda", "depth-attention"))
def test_inductor_loss_and_gradients_equal_eager(run_variant):
    """Inductor (C++ on the CPU, the ops as fallback kernels): 4 layers, every slot read by several layers.
    The variants that call the custom ops (detached MoDA takes the same ops); the plain-torch ones
    are traced (no graph break) and compared under aot_eager above, and the GPU check
    (tools/compile_check.py) runs them all."""
    _compiled_matches_eager(CFG4, run_variant, "inductor", 1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("run_variant", ("vanilla", "moda-detached", "denseformer", "attnres", "mhc"))
def test_compiled_baselines_equal_eager(run_variant):
    _compiled_matches_eager(CFG.with_layers(2), run_variant, "aot_eager", 1e-6)


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_compiled_step_reads_the_depth_buffer_in_place(monkeypatch, backend):
    """The MoDA forward launches of the compiled step get pointers into the model's depth
    buffer (layer i > 0: the buffer's first slot), as in eager."""
    from moda_bench.kernels.moda.triton import interface as kernel_mod
    model, tokens, fn = _model(CFG, "moda")
    ptrs = []
    real = kernel_mod._FWD_PTR

    def spy(key, grid, args, meta):
        ptrs.append((args[3].data_ptr(), args[4].data_ptr(), args[11]))   # kd, vd, L
        return real(key, grid, args, meta)

    monkeypatch.setattr(kernel_mod, "_FWD_PTR", spy)
    torch._dynamo.reset()
    torch.compile(fn, fullgraph=True, backend=backend)(tokens).backward()
    (buf,) = model.depth_buffers()
    with_depth = [p for p in ptrs if p[2] > 0]
    assert len(with_depth) == CFG.layers - 1
    assert all(p[:2] == (buf.k.data_ptr(), buf.v.data_ptr()) for p in with_depth)


@pytest.mark.parametrize("run_variant", ("moda", "moda-detached", "depth-attention"))
def test_eager_step_through_the_ops_equals_the_functions(monkeypatch, run_variant):
    """Eager through the custom ops (`set_eager_ops`, the path compiled code takes) and through the
    autograd Functions: the same loss and gradients, bit for bit."""
    from moda_bench.kernels import oplib
    model, tokens, fn = _model(CFG, run_variant)
    want = _loss_and_grads(model, fn, tokens)
    monkeypatch.setattr(oplib, "_EAGER_OPS", True)
    got = _loss_and_grads(model, fn, tokens)
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("variant", ("moda", "depth-attention"))
def test_compiled_prefill_equals_eager(variant):
    torch.manual_seed(0)
    model = Decoder(CFG, (variant,))
    prompt = torch.randint(0, CFG.vocab, (2, CFG.seq_len))
    with torch.no_grad():
        want = model(prompt, variant, last_only=True)
        model.prepare(variant, 2, CFG.seq_len, grad=False)
        torch._dynamo.reset()
        got = torch.compile(lambda p: model(p, variant, last_only=True), fullgraph=True, backend="aot_eager")(prompt)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_a_compiled_call_without_prepare_says_so():
    torch.manual_seed(0)
    model = Decoder(CFG, ("moda",))
    tokens = torch.randint(0, CFG.vocab, (1, CFG.seq_len + 1))
    torch._dynamo.reset()
    with pytest.raises(Exception, match="Decoder.prepare"):
        torch.compile(lambda t: model.loss(t, "moda"), fullgraph=True, backend="aot_eager")(tokens)


def test_compile_check_tool_strided_depth_is_exact():
    """tools/compile_check.py's strided check (small, fp32): a depth slice equals its contiguous copy."""
    from helpers import load_tool as tool
    assert tool("compile_check").strided_depth_check("cpu", torch.float32, T=9, Hk=2, G=2, d=16, entries=5,
                                                     L=3)["max_abs_diff"] == 0.0


@pytest.mark.slow
def test_compile_check_tool_writes_a_row_per_variant(tmp_path):
    from helpers import load_tool as tool
    rc = tool("compile_check").main(["--out", str(tmp_path), "--device", "cpu", "--dtype", "float32", "--cases",
                                     "smoke:2:8", "--variants", "moda,depth-attention-torch", "--backend", "aot_eager",
                                     "--no-strided"])
    rows = json.loads((tmp_path / "compile_check.json").read_text())["rows"]
    assert rc == 0 and [r["variant"] for r in rows] == ["moda", "depth-attention-torch"]
    assert all(r["graph_breaks"] == 0 and r["grad_max_rel_err"] <= 1e-6 for r in rows)
    assert all(r["breaks"] == [] and r["break_reasons"] == "" and r["graph_count"] == 1 for r in rows)


@pytest.mark.gpu
def test_compile_check_on_the_gpu_smoke_bf16(tmp_path):
    """The GPU check at smoke size in bf16 under inductor: no graph break, no failure, compiled loss
    within 2e-2 and every gradient within 5e-2 (relative norms; bf16 rounding of differently fused
    kernels) of eager; the strided depth slice exact."""
    from helpers import load_tool as tool
    tool("compile_check").main(["--out", str(tmp_path), "--cases", "smoke::256"])
    report = json.loads((tmp_path / "compile_check.json").read_text())
    for r in report["rows"]:
        assert not r.get("error") and r["graph_breaks"] == 0, r
        assert r["loss_rel_err"] <= 2e-2 and r["grad_max_rel_err"] <= 5e-2, r
    assert report["strided_depth"]["max_abs_diff"] == 0.0
