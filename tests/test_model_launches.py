"""Host work per layer of a training step (forward and backward) in the model paths: the aten ops
dispatched (each a launch, or an allocation, on the GPU; views and detach not counted) and the
Triton kernels launched, per layer of MoDA, Depth-Attention and Block AttnRes against vanilla's. At B=1 an
eager step is host-bound, so each op a layer adds is time the step pays; these bounds keep the
variants' extra host work from growing back. Counted on the CPU: the Triton interpreter's own
tensor work inside a launch is not counted, the launch is (one op)."""
from __future__ import annotations

from collections import Counter

import pytest
import torch
import triton.runtime.interpreter as interpreter
from torch.utils._python_dispatch import TorchDispatchMode

from moda_bench.models import Decoder
from moda_bench.models.config import CONFIGS


class _Ops(TorchDispatchMode):
    """Counts the ops dispatched outside Triton launches (views, aliases and detach excepted) and
    the launches themselves ('triton:<kernel>')."""

    def __init__(self):
        super().__init__()
        self.counts, self.inside = Counter(), 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        schema = func._schema
        alias = any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
        if not self.inside and not alias and schema.name != "aten::detach":
            self.counts[str(func)] += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture
def counted(monkeypatch):
    modes = []
    run = interpreter.InterpretedFunction.run

    def launch(self, *args, **kw):
        mode = modes[-1] if modes else None
        if mode is not None:
            mode.counts["triton:" + self.fn.__name__] += 1
            mode.inside += 1
        try:
            return run(self, *args, **kw)
        finally:
            if mode is not None:
                mode.inside -= 1

    monkeypatch.setattr(interpreter.InterpretedFunction, "run", launch)

    def step_ops(variant: str, layers: int, depth_grad: bool = True) -> Counter:
        cfg = CONFIGS["smoke"].replace(layers=layers, seq_len=16, dattn_stride=1)
        torch.manual_seed(0)
        model = Decoder(cfg, (variant,))
        tokens = torch.randint(0, cfg.vocab, (1, cfg.seq_len + 1))
        model.loss(tokens, variant, depth_grad=depth_grad).backward()   # first call: buffers, memos
        with _Ops() as mode:
            modes.append(mode)
            model.loss(tokens, variant, depth_grad=depth_grad).backward()
            modes.pop()
        return mode.counts

    def per_layer(variant: str, depth_grad: bool = True) -> Counter:
        a, b = step_ops(variant, 3, depth_grad), step_ops(variant, 5, depth_grad)
        return Counter({k: (b[k] - a[k]) / 2 for k in set(a) | set(b) if b[k] != a[k]})

    return per_layer


def _launches(c: Counter) -> dict:
    return {k: v for k, v in c.items() if k.startswith("triton:")}


# (variant, depth_grad, most extra ops a layer over vanilla's, Triton launches a layer)
BOUNDS = [("moda", True, 32, {"triton:moda_fwd_kernel": 1, "triton:moda_bwd_q_kernel": 1,
                              "triton:moda_bwd_kv_kernel": 1}),
          ("moda", False, 18, {"triton:moda_fwd_kernel": 1, "triton:moda_bwd_q_kernel": 1,
                               "triton:moda_bwd_kv_kernel": 1}),
          ("depth-attention", True, 22, {"triton:mix_fwd_kernel": 1, "triton:mix_bwd_kernel": 1}),
          ("attnres", True, 100, {})]   # a source-count-free mix (one source a sublayer here: block size 1)


@pytest.mark.parametrize("variant, depth_grad, extra, launches", BOUNDS)
def test_a_layer_adds_few_ops_over_vanilla(counted, variant, depth_grad, extra, launches):
    vanilla = counted("vanilla")
    ops = counted(variant, depth_grad)
    assert sum(vanilla.values()) <= 150, sorted(vanilla.items())   # RMSNorm as F.rms_norm, RoPE by roll
    assert not _launches(vanilla)
    assert _launches(ops) == launches
    more = sum(ops.values()) - sum(vanilla.values())
    assert 0 < more <= extra, sorted(((k, ops[k] - vanilla[k]) for k in set(ops) | set(vanilla)
                                      if ops[k] != vanilla[k]), key=lambda kv: -kv[1])
