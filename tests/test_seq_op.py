"""The sequence attention custom op (`kernels.moda.fa4.seq_op`): causal GQA attention over a named
sequence backend, the op FA4's `fa4_attention` becomes under torch.compile (dynamo cannot trace
into FA4's `flash_attn_func`). CPU, plain-torch backend (FA4's contract): opcheck, out and all
gradients against an fp64 reference at odd T, and a fullgraph compile of `fa4_attention` through
the op with no graph break. Tolerances: fp32 1e-5 relative (same math, different order)."""
from __future__ import annotations

import math

import pytest
import torch

from moda_bench.kernels import oplib
from moda_bench.kernels.moda.fa4 import merge
from moda_bench.kernels.moda.fa4.seq_op import sequence_attention, sequence_attention_op
from moda_bench.kernels.oplib import backend_key


def _inputs(B=2, T=37, Hk=2, G=3, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, Hk * G, d, generator=g, requires_grad=True)
    k = torch.randn(B, T, Hk, d, generator=g, requires_grad=True)
    v = torch.randn(B, T, Hk, d, generator=g, requires_grad=True)
    return q, k, v


def _reference(q, k, v, scale):
    """fp64 causal GQA attention (B,T,Hq,d)."""
    G = q.shape[2] // k.shape[2]
    qh, kh, vh = (x.double().transpose(1, 2) for x in (q, k.repeat_interleave(G, 2), v.repeat_interleave(G, 2)))
    s = (qh @ kh.transpose(-1, -2)) * scale
    T = q.shape[1]
    s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    return (torch.softmax(s, -1) @ vh).transpose(1, 2)


def _rel(a, b):
    """||a - b|| / ||b||, absolute where b is (near) zero (dq, dk at T = 1: one key, a constant softmax)."""
    return float((a.double() - b.double()).norm() / max(float(b.double().norm()), 1.0))


def test_opcheck_with_the_torch_backend():
    q, k, v = _inputs(T=19)
    name = backend_key(merge.TORCH_BACKEND)
    torch.library.opcheck(sequence_attention_op, (q, k, v, 0.25, name))


@pytest.mark.parametrize("T,G", [(37, 3), (1, 1), (64, 4)])
def test_out_and_gradients_against_fp64(T, G):
    q, k, v = _inputs(T=T, G=G)
    scale = 1 / math.sqrt(q.shape[-1])
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(1))
    out = sequence_attention(q, k, v, merge.TORCH_BACKEND)
    grads = torch.autograd.grad(out, (q, k, v), do)
    qr, kr, vr = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref = _reference(qr, kr, vr, scale)
    ref_grads = torch.autograd.grad(ref, (qr, kr, vr), do.double())
    assert _rel(out, ref) < 1e-5
    for got, want in zip(grads, ref_grads):
        assert _rel(got, want) < 1e-5


def test_fa4_attention_compiles_through_the_op_with_no_graph_break(monkeypatch):
    # the FA4 backend's raw functions replaced by the plain-torch ones of the same contract (no FA4 on the CPU)
    fake = merge.SequenceBackend("fa4-cpu-test", merge.TORCH_BACKEND.fwd, merge.TORCH_BACKEND.bwd,
                                 merge.TORCH_BACKEND.dtypes)
    monkeypatch.setattr(merge, "FA4_BACKEND", fake)
    q, k, v = _inputs()

    def f(q, k, v):
        return merge.fa4_attention(q, k, v).sum()

    torch._dynamo.reset()
    explain = torch._dynamo.explain(f)(q, k, v)
    assert explain.graph_break_count == 0 and explain.graph_count == 1
    loss = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v)
    grads = torch.autograd.grad(loss, (q, k, v))
    qr, kr, vr = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref = _reference(qr, kr, vr, 1 / math.sqrt(q.shape[-1])).sum()
    assert abs(float(loss) - float(ref)) / abs(float(ref)) < 1e-5
    for got, want in zip(grads, torch.autograd.grad(ref, (qr, kr, vr))):
        assert _rel(got, want) < 1e-5


def test_a_backend_is_registered_when_made_and_passes_as_its_name():
    """Made once, found by name; `backend_key` only reads the name (torch 2.11's dynamo cannot rebuild
    a frozen dataclass to run a function on it at trace time, nor replay a registry write)."""
    assert oplib.backend_of("torch") is merge.TORCH_BACKEND and oplib.backend_of("fa4") is merge.FA4_BACKEND
    made = merge.SequenceBackend("registered-on-make", merge.TORCH_BACKEND.fwd, merge.TORCH_BACKEND.bwd,
                                 merge.TORCH_BACKEND.dtypes)
    assert oplib.backend_of("registered-on-make") is made and oplib.backend_key(made) == "registered-on-make"
    assert not hasattr(oplib.backend_key, "__wrapped__")   # not an assume_constant_result function
