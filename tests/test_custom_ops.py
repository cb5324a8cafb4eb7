"""The operators as torch custom ops (namespace moda_bench): `torch.library.opcheck` of each op
(schema, fake implementation, autograd registration, AOT dispatch) at small odd sizes under the
Triton interpreter, and `torch.compile(fullgraph=True)` of a tiny model calling them: no graph
break, and the compiled run equals the eager one (fp32: to 1e-5)."""
from __future__ import annotations

import pytest
import torch
from helpers import random_inputs

from moda_bench.kernels.dattn import depth_attention, depth_mix
from moda_bench.kernels.dattn.chained import depth_attention_op
from moda_bench.kernels.dattn.mix_triton import depth_mix_op
from moda_bench.kernels.decode import moda_decode
from moda_bench.kernels.decode.interface import DecodeConfig, moda_decode_op
from moda_bench.kernels.moda import MoDAConfig, moda_attention
from moda_bench.kernels.moda.fa4.merge import TORCH_BACKEND
from moda_bench.kernels.moda.triton.interface import moda_attention_bwd_op, moda_attention_op
from moda_bench.kernels.oplib import backend_key, config_key

# small tiles: the interpreter's cost grows with them
CFG = MoDAConfig(block_m=16, block_n=16, depth_block_m=16, bwd_q_block_m=16, bwd_kv_block_m=16, bwd_kv_block_n=16,
                 block_l=16, bwd_block_l=16, fwd_depth="fused", bwd_depth="fused")
# opcheck's utilities; test_aot_dispatch_dynamic re-traces with symbolic shapes (slow, and the same
# fake functions): the static one covers the AOT path
CHECKS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_static")


def _close(a, b, tol=1e-5):
    assert (a is None) == (b is None)
    if a is not None:
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("L,depth_grad", [(3, True), (3, False), (0, True)])
def test_opcheck_moda_attention(L, depth_grad):
    q, k, v, kd, vd, _ = random_inputs(1, 7, 4, 2, 16, L, torch.float32, seed=L)
    if kd is not None and not depth_grad:
        kd, vd = kd.detach(), vd.detach()
    torch.library.opcheck(moda_attention_op, (q, k, v, kd, vd, 0.25, depth_grad, config_key(CFG)), test_utils=CHECKS)


def test_opcheck_moda_attention_bwd():
    q, k, v, kd, vd, do = random_inputs(1, 5, 2, 1, 16, 2, torch.float32, seed=7)
    o, lse = moda_attention_op(q, k, v, kd, vd, 0.25, True, config_key(CFG))
    args = [t.detach() for t in (do, q, k, v, kd, vd, o, lse)]
    torch.library.opcheck(moda_attention_bwd_op, (*args, 0.25, True, config_key(CFG)), test_utils=CHECKS)
    torch.library.opcheck(moda_attention_bwd_op, (*args, 0.25, False, config_key(CFG)), test_utils=CHECKS)


def test_opcheck_moda_decode():
    g = torch.Generator().manual_seed(2)
    q, kc, vc = (torch.randn(2, 1, 4, 16, generator=g), torch.randn(2, 11, 2, 16, generator=g),
                 torch.randn(2, 11, 2, 16, generator=g))
    kd, vd = torch.randn(2, 1, 3, 2, 16, generator=g), torch.randn(2, 1, 3, 2, 16, generator=g)
    seqlens = torch.tensor([11, 6], dtype=torch.int32)
    torch.library.opcheck(moda_decode_op, (q, kc, vc, kd, vd, seqlens, None, None, 2, config_key(DecodeConfig()),
                                           None), test_utils=CHECKS)


def test_opcheck_depth_mix_and_chained_depth_attention():
    q, k, v, ks, vs, _ = random_inputs(1, 5, 4, 2, 16, 3, torch.float32, seed=3)
    torch.library.opcheck(depth_mix_op, (q, k, v, ks, vs, 0.25), test_utils=CHECKS)
    torch.library.opcheck(depth_attention_op, (q, k, v, ks, vs, 0.25, 0.25, backend_key(TORCH_BACKEND)),
                          test_utils=CHECKS)


def _fwd_bwd(fn, inputs, do):
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = fn(*leaves)
    out = out[0] if isinstance(out, tuple) else out
    out.backward(do)
    return [out] + [x.grad for x in leaves]


def test_eager_function_path_equals_op_path(monkeypatch):
    """Eager calls run the autograd Functions beside the ops (`oplib.through_ops`); through the ops
    (`set_eager_ops(True)`) moda_attention, depth_mix and the chained depth_attention give the same
    outputs and gradients bit for bit."""
    from moda_bench.kernels import oplib
    q, k, v, kd, vd, do = random_inputs(1, 7, 4, 2, 16, 3, torch.float32, seed=9)
    cases = [(lambda *t: moda_attention(*t, config=CFG), (q, k, v, kd, vd), do),
             (depth_mix, (q, k, v, kd, vd), do[:, :, :2]),
             (lambda *t: depth_attention(*t, attention=TORCH_BACKEND), (q, k, v, kd, vd), do)]
    for fn, inputs, grad in cases:
        eager = _fwd_bwd(fn, inputs, grad)
        monkeypatch.setattr(oplib, "_EAGER_OPS", True)
        via_ops = _fwd_bwd(fn, inputs, grad)
        monkeypatch.setattr(oplib, "_EAGER_OPS", False)
        for a, b in zip(eager, via_ops):
            assert torch.equal(a, b)


def test_ops_are_registered():
    for name in ("moda_attention", "moda_attention_bwd", "moda_decode", "depth_mix", "depth_mix_bwd",
                 "depth_attention", "depth_attention_bwd"):
        assert hasattr(torch.ops.moda_bench, name)


class TinyMoDA(torch.nn.Module):
    """Two decoder-ish layers with one depth-KV buffer: layer i reads the slice [:i] of it in place
    (MoDA, attached depth) and writes its own K/V to entry i; then a Depth-Attention mix of the two
    layers' values and a decode step over the last layer's cache with its depth slice."""

    def __init__(self, D=32, Hq=4, Hk=2, d=16):
        super().__init__()
        self.Hq, self.Hk, self.d = Hq, Hk, d
        g = torch.Generator().manual_seed(0)
        self.qkv = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(D, (Hq + 2 * Hk) * d, generator=g) / D ** 0.5) for _ in range(2)])

    def forward(self, x):
        B, T, _ = x.shape
        bufk = x.new_zeros(B, T, 2, self.Hk, self.d)
        bufv = x.new_zeros(B, T, 2, self.Hk, self.d)
        for i, w in enumerate(self.qkv):
            q, k, v = (x @ w).split([self.Hq * self.d, self.Hk * self.d, self.Hk * self.d], dim=-1)
            q, k, v = (t.reshape(B, T, -1, self.d) for t in (q, k, v))
            kd, vd = (bufk[:, :, :i], bufv[:, :, :i]) if i else (None, None)
            x = x + moda_attention(q, k, v, kd, vd, config=CFG).reshape(B, T, -1)[..., :x.shape[-1]]
            bufk = bufk.index_copy(2, torch.tensor([i]), k.unsqueeze(2))
            bufv = bufv.index_copy(2, torch.tensor([i]), v.unsqueeze(2))
        mixed = depth_mix(q, k, v, bufk[:, :, :1], bufv[:, :, :1])
        out = depth_attention(q, k, v, bufk[:, :, :1], bufv[:, :, :1])
        step = moda_decode(q[:, -1:].detach(), k.detach(), v.detach(), bufk[:, -1:].detach(), bufv[:, -1:].detach(),
                           num_splits=2)
        return x.sum() + mixed.sum() + out.sum(), step


def test_compiled_tiny_model_has_no_graph_break_and_matches_eager():
    model = TinyMoDA()
    x = torch.randn(1, 9, 32, generator=torch.Generator().manual_seed(1))
    explained = torch._dynamo.explain(model)(x)
    assert explained.graph_break_count == 0, explained.break_reasons
    loss, step = model(x)
    loss.backward()
    eager = [loss, step] + [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    loss, step = compiled(x)
    loss.backward()
    for a, b in zip([loss, step] + [p.grad for p in model.parameters()], eager):
        _close(a, b, 1e-4)


def test_opcheck_depth_buffer_ops():
    """The depth buffer's ops (moda_bench.models.depth): schema, fake layouts (strided slices of the
    buffer), autograd registration and AOT dispatch, at odd sizes."""
    from moda_bench.models.depth import DepthKVBuffer, depth_read_op, depth_write_bwd_op, depth_write_op
    buf = DepthKVBuffer(1, 5, 7, 2, 4, dtype=torch.float32, device="cpu", attached=True)
    g = torch.Generator().manual_seed(4)
    buf.k.copy_(torch.randn(buf.k.shape, generator=g))
    buf.v.copy_(torch.randn(buf.v.shape, generator=g))
    token = torch.zeros(1, requires_grad=True)
    k, v = (torch.randn(1, 5, 2, 4, generator=g, requires_grad=True) for _ in range(2))
    torch.library.opcheck(depth_write_op, (k, v, token, buf.handle, 6), test_utils=CHECKS)
    for start, stop, step in ((0, 3, 1), (1, 6, 2)):
        torch.library.opcheck(depth_read_op, (token, buf.handle, start, stop, step), test_utils=CHECKS)
    torch.library.opcheck(depth_write_bwd_op, (torch.zeros(1), buf.handle, 3), test_utils=CHECKS[:3])
