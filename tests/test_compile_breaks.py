"""Graph breaks of the compiled model step across torch releases and devices (issue 59, item 3).

Some torch releases' dynamo does not trace the builtin `slice.indices` (it is a skipped function
there: a graph break wherever traced code calls it), while others do; the depth buffer's reads
under torch.compile therefore turn a slice into slot numbers with plain int arithmetic
(`depth.slot_range`). The CPU tests here make this torch's dynamo refuse `slice.indices` as
those releases do, check that the refusal bites (and that tools/compile_check.py names the
function and the frame), and that every depth-reading variant still traces with no break. The
GPU test asserts no break for every variant on CUDA in bf16.
"""
from __future__ import annotations

import pytest
import torch

from moda_bench.bench.model import RUN_VARIANTS, model_variant
from moda_bench.models.config import get_config
from moda_bench.models.decoder import Decoder
from moda_bench.models.depth import slot_range

DEPTH_VARIANTS = ("moda", "moda-detached", "depth-attention", "depth-attention-torch")


def _tool():
    from helpers import load_tool
    return load_tool("compile_check")


def _explain(cfg, run_variant, *, dtype=torch.float32, device="cpu"):
    """torch._dynamo.explain of one variant's `Decoder.loss` on (1, T + 1) tokens."""
    variant, depth_grad = model_variant(run_variant)
    torch.manual_seed(0)
    model = Decoder(cfg, (variant,), dtype=dtype, device=device)
    tokens = torch.randint(0, cfg.vocab, (1, cfg.seq_len + 1), device=device)
    model.prepare(variant, 1, cfg.seq_len, depth_grad=depth_grad)
    torch._dynamo.reset()
    try:
        return torch._dynamo.explain(lambda t: model.loss(t, variant, depth_grad=depth_grad))(tokens)
    finally:
        torch._dynamo.reset()


@pytest.fixture
def dynamo_skips_slice_indices(monkeypatch):
    """This torch's dynamo, made to treat `slice.indices` as a skipped builtin (as releases without
    its support do: "Attempted to call function marked as skipped")."""
    lists = pytest.importorskip("torch._dynamo.variables.lists")
    functions = pytest.importorskip("torch._dynamo.variables.functions")
    if not hasattr(lists, "SliceVariable") or not hasattr(functions, "SkipFunctionVariable"):
        pytest.skip("this torch's dynamo has no SliceVariable / SkipFunctionVariable to patch")
    real = lists.SliceVariable.call_method

    def call_method(self, tx, name, args, kwargs):
        if name == "indices":
            return functions.SkipFunctionVariable(slice.indices).call_function(tx, [self, *args], kwargs)
        return real(self, tx, name, args, kwargs)

    monkeypatch.setattr(lists.SliceVariable, "call_method", call_method)


@pytest.mark.parametrize("sl", [slice(0, 4), slice(0, 0), slice(1, 7, 2), slice(None), slice(3, None, 3),
                                slice(-4, None), slice(-20, 2), slice(2, 50), slice(None, -1, 2), slice(6, 2)])
def test_slot_range_is_slice_indices(sl):
    assert slot_range(sl, 9) == sl.indices(9)


def test_slot_range_refuses_a_non_positive_step():
    with pytest.raises(ValueError, match="positive step"):
        slot_range(slice(5, 0, -1), 9)


def test_the_simulated_release_breaks_on_slice_indices_and_the_tool_says_where(dynamo_skips_slice_indices):
    """The patch bites: a call of `slice.indices` is a graph break, and `break_details` gives the
    refused function (debug context) and the user frame of this file."""
    tool = _tool()

    def f(x, sl):
        y = x + 1
        start = sl.indices(x.shape[0])[0]
        return y[start:] * 2

    torch._dynamo.reset()
    explained = torch._dynamo.explain(f)(torch.ones(5), slice(1, 4))
    torch._dynamo.reset()
    breaks = tool.break_details(explained)
    assert explained.graph_break_count >= 1 and breaks
    first = breaks[0]
    assert first["reason"] == "Attempted to call function marked as skipped"
    assert "slice.indices" in first["context"] + first["explanation"]
    assert first["frame"].startswith("tests/test_compile_breaks.py:") and first["frame"].endswith(" f")
    assert "sl.indices" in first["source"] and first["stack"][-1] == first["frame"]
    summary = tool.break_summary(breaks)
    assert summary.startswith(f"{len(breaks)} x {first['frame']}: Attempted to call") and "slice.indices" in summary


@pytest.mark.parametrize("run_variant", DEPTH_VARIANTS)
def test_depth_variants_trace_with_no_break_where_slice_indices_is_skipped(dynamo_skips_slice_indices,
                                                                           run_variant):
    cfg = get_config("smoke").replace(dattn_stride=1, seq_len=9)
    explained = _explain(cfg, run_variant)
    assert explained.graph_break_count == 0, _tool().break_summary(_tool().break_details(explained))
    assert explained.graph_count == 1


@pytest.mark.gpu
@pytest.mark.parametrize("run_variant", RUN_VARIANTS)
def test_every_variant_traces_with_no_break_on_cuda_bf16(run_variant):
    """On the GPU (the CUDA code paths, this machine's torch release), smoke at T = 64 in bf16: one
    graph, no break; a failure lists every break with its frame and refused function."""
    explained = _explain(get_config("smoke").replace(seq_len=64), run_variant, dtype=torch.bfloat16, device="cuda")
    tool = _tool()
    assert explained.graph_break_count == 0, tool.break_summary(tool.break_details(explained))
    assert explained.graph_count == 1
