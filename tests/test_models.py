"""`moda-bench model`'s decoders (moda_bench.models) against an fp64 plain-PyTorch reference.

The reference below is written apart from the decoder: explicit softmax attention, MoDA's
`moda_reference` over torch.stack'ed depth K/V, Depth-Attention's `depth_attention_reference`,
and the cross-layer baselines as loops. Each variant's fp32 decoder (its Triton kernels under
the interpreter, the depth-KV buffer and its gradient routing) must match it in the logits and
in every parameter's gradient (relative error <= 2e-3; float32 against float64).
"""
import math

import pytest
import torch

from moda_bench.kernels.dattn import depth_attention_reference
from moda_bench.kernels.dattn.reference import causal_gqa_reference
from moda_bench.kernels.moda import moda_reference
from moda_bench.models import Decoder, ModelConfig, generate
from moda_bench.models.config import VARIANTS, attnres_block_size, dattn_sources
from moda_bench.models.depth import DepthKVBuffer
from moda_bench.models.flops import param_count, train_flops

TINY = ModelConfig("tiny", hidden=64, intermediate=96, layers=3, heads=4, kv_heads=2, vocab=37, seq_len=11,
                   dtype="float32", tie_embeddings=False, dattn_stride=1)
TOL = 2e-3


def _norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x, pos, theta):
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.cat([pos[:, None] * inv] * 2, dim=-1)[:, None, :]
    half = d // 2
    return x * ang.cos() + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * ang.sin()


def reference_logits(m: Decoder, tokens, variant: str, depth_grad: bool = True):
    """The decoder's forward in float64 from its parameters (m is a float64 copy)."""
    cfg = m.cfg
    B, T = tokens.shape
    pos = torch.arange(T, dtype=torch.float64)
    heads = lambda x, H: x.view(B, T, H, cfg.head_dim)  # noqa: E731
    keys, vals, ffn_keys, ffn_vals, mixed = [], [], [], [], []

    def attn(i, x):
        ly = m.layers[i]
        q = _rope(_norm(heads(x @ ly.q_proj.weight.T, cfg.heads), ly.q_norm.weight, cfg.rms_eps), pos, cfg.rope_theta)
        k = _rope(_norm(heads(x @ ly.k_proj.weight.T, cfg.kv_heads), ly.k_norm.weight, cfg.rms_eps), pos,
                  cfg.rope_theta)
        v = heads(x @ ly.v_proj.weight.T, cfg.kv_heads)
        keys.append(k)
        vals.append(v)
        if variant == "moda" and i > 0:
            kd = torch.stack([t for j in range(i) for t in (keys[j], ffn_keys[j])], dim=2)
            vd = torch.stack([t for j in range(i) for t in (vals[j], ffn_vals[j])], dim=2)
            if not depth_grad:
                kd, vd = kd.detach(), vd.detach()
            o = moda_reference(q, k, v, kd, vd)
        elif variant.startswith("depth-attention") and dattn_sources(i, cfg.dattn_stride):
            src = dattn_sources(i, cfg.dattn_stride)
            o, vm = depth_attention_reference(q, k, v, torch.stack([keys[j] for j in src], 2),
                                              torch.stack([mixed[j] for j in src], 2), return_mixed=True)
            mixed.append(vm)
        else:
            o = causal_gqa_reference(q, k, v)
            mixed.append(v)
        return o.reshape(B, T, -1) @ ly.o_proj.weight.T

    def ffn(i, x):
        ly = m.layers[i]
        if variant == "moda" and ly.ffn_kv is not None:
            kv = (x @ ly.ffn_kv.weight.T).view(B, T, 2, cfg.kv_heads, cfg.head_dim)
            ffn_keys.append(_rope(kv[:, :, 0], pos, cfg.rope_theta))
            ffn_vals.append(kv[:, :, 1])
        f = ly.ffn
        return (torch.nn.functional.silu(x @ f.gate.weight.T) * (x @ f.up.weight.T)) @ f.down.weight.T

    sub = [lambda i, u: attn(i, _norm(u, m.layers[i].attn_norm.weight, cfg.rms_eps)),
           lambda i, u: ffn(i, _norm(u, m.layers[i].ffn_norm.weight, cfg.rms_eps))]
    h = m.embed.weight[tokens]
    L = cfg.layers
    if variant == "denseformer":
        outs = [h]
        for i in range(L):
            y = h + sub[0](i, h)
            outs.append(y + sub[1](i, y))
            h = sum(m.dense.alphas[i][j] * outs[j] for j in range(i + 2))
    elif variant == "attnres":
        size, blocks, partial = attnres_block_size(L), [h], None

        def agg(s):
            src = blocks + ([partial] if partial is not None else [])
            w = torch.softmax(torch.stack([(_norm(x, 1.0, 1e-6) * m.attnres.queries[s]).sum(-1) for x in src]), 0)
            return sum(w[r, ..., None] * src[r] for r in range(len(src)))
        for s in range(2 * L):
            out = sub[s % 2](s // 2, agg(s))
            partial = out if partial is None else partial + out
            if (s + 1) % size == 0:
                blocks, partial = blocks + [partial], None
        h = agg(2 * L)
    elif variant == "mhc":
        n = m.mhc.n
        x = torch.stack([h] * n, dim=-2)
        for s in range(2 * L):
            c = _norm(x.flatten(-2), 1.0, 1e-6) @ m.mhc.maps[s].weight.T + m.mhc.maps[s].bias
            a = m.mhc.scales[s]
            pre, post = torch.sigmoid(a[0] * c[..., :n]), 2 * torch.sigmoid(a[1] * c[..., n:2 * n])
            res = torch.exp(a[2] * c[..., 2 * n:]).unflatten(-1, (n, n))
            for _ in range(20):
                res = res / res.sum(-1, keepdim=True)
                res = res / res.sum(-2, keepdim=True)
            y = sub[s % 2](s // 2, sum(pre[..., j, None] * x[..., j, :] for j in range(n)))
            x = torch.stack([sum(res[..., r, j, None] * x[..., j, :] for j in range(n)) + post[..., r, None] * y
                             for r in range(n)], dim=-2)
        h = x.sum(-2)
    else:
        for i in range(L):
            h = h + sub[0](i, h)
            h = h + sub[1](i, h)
    return _norm(h, m.norm.weight, cfg.rms_eps) @ m.lm_head.weight.T


def _rel(a, b):
    return float((a.detach().double() - b.detach()).norm() / b.detach().norm().clamp_min(1e-30))


def _check_variant(variant, depth_grad=True, moda_impl="auto"):
    torch.manual_seed(0)
    model = Decoder(TINY, (variant,), init_std=0.2, moda_impl=moda_impl)
    with torch.no_grad():   # non-trivial norms, DWA, AttnRes queries and mHC scales
        for name, p in model.named_parameters():
            if p.dim() == 1 or "alphas" in name or "queries" in name or "scales" in name:
                p.add_(0.3 * torch.randn_like(p))
    ref = Decoder(TINY, (variant,))
    ref.load_state_dict(model.state_dict())
    ref = ref.double()
    tokens = torch.randint(0, TINY.vocab, (2, TINY.seq_len))
    weight = torch.randn(2, TINY.seq_len, TINY.vocab, dtype=torch.float64)
    out = model(tokens, variant, depth_grad=depth_grad)
    (out.double() * weight).sum().backward()
    expect = reference_logits(ref, tokens, variant, depth_grad)
    (expect * weight).sum().backward()
    assert _rel(out, expect) <= TOL, (variant, _rel(out, expect))
    grads = dict(ref.named_parameters())
    checked = 0
    for name, p in model.named_parameters():
        g_ref = grads[name].grad
        if g_ref is None or not g_ref.abs().max() > 0:
            assert p.grad is None or p.grad.abs().max() == 0, name
            continue
        assert p.grad is not None, f"{variant}: no gradient for {name}"
        assert _rel(p.grad, g_ref) <= TOL, (variant, name, _rel(p.grad, g_ref))
        checked += 1
    return checked


@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_forward_and_backward_match_the_fp64_reference(variant):
    assert _check_variant(variant) >= 4 * TINY.layers


def test_moda_detached_depth_gets_no_gradient_through_depth():
    """Detached: the reference's depth K/V are detached too; the gradients still match."""
    assert _check_variant("moda", depth_grad=False) >= 4 * TINY.layers


@pytest.mark.parametrize("depth_grad", [True, False])
def test_moda_on_a_non_triton_route_matches_the_reference(monkeypatch, depth_grad):
    """A model pinned to a non-Triton route (its auto keeps the in-place Triton kernel), the dispatcher choosing
    "fa4" for every layer (`dispatch.choose` mocked; the route's function
    `merge.moda_fa4` run on its plain-torch sequence backend, CPU-runnable): each layer runs the
    route (attached: `moda_route_into`, its depth gradients added into the buffer's gradient
    slots; detached: depth_grad=False), once per shape decided, and the logits and every
    parameter's gradient still match the fp64 reference."""
    from moda_bench.kernels.moda import dispatch
    from moda_bench.kernels.moda.fa4 import merge
    real, calls, chosen = merge.moda_fa4, [], []

    def route(q, k, v, kd=None, vd=None, *, depth_grad=True, **kw):
        calls.append((0 if kd is None else kd.shape[2], depth_grad))
        return real(q, k, v, kd, vd, depth_grad=depth_grad, backend=merge.TORCH_BACKEND, **kw)

    def choose(shape, *a, **kw):
        chosen.append(shape.L)
        return dispatch.Choice("fa4", "test")
    monkeypatch.setattr(merge, "moda_fa4", route)
    monkeypatch.setattr(dispatch, "choose", choose)
    assert _check_variant("moda", depth_grad=depth_grad, moda_impl="fa4") >= 4 * TINY.layers
    assert calls == [(2 * i, depth_grad) for i in range(TINY.layers)]
    assert chosen == [2 * i for i in range(TINY.layers)]   # each layer shape decided once, by the model


@pytest.mark.parametrize("ops", [False, True])
def test_depth_buffer_reads_are_views_of_one_buffer_and_route_gradients(monkeypatch, ops):
    """Eager (autograd Functions) and through the custom ops (`oplib.set_eager_ops`): reads are
    views of the one buffer, and the gradients equal those of stacked copies."""
    from moda_bench.kernels import oplib
    monkeypatch.setattr(oplib, "_EAGER_OPS", ops)
    B, T, E, H, d = 2, 3, 5, 2, 4
    buf = DepthKVBuffer(B, T, E, H, d, dtype=torch.float64, device="cpu", attached=True)
    ks = [torch.randn(B, T, H, d, dtype=torch.float64, requires_grad=True) for _ in range(E)]
    vs = [torch.randn(B, T, H, d, dtype=torch.float64, requires_grad=True) for _ in range(E)]

    def run(use_buffer):
        loss = 0.0
        if use_buffer:
            token = buf.start(ks[0])
        for e in range(E):
            if e:
                if use_buffer:
                    kd, vd = buf.read(token, slice((e - 1) % 2, e, 2))   # every other slot: a strided view
                    assert kd.untyped_storage().data_ptr() == buf.k.untyped_storage().data_ptr()
                    assert kd.data_ptr() == buf.k[:, :, (e - 1) % 2].data_ptr()
                    assert kd.stride() == buf.k[:, :, ::2].stride()
                else:
                    kd, vd = torch.stack(ks[(e - 1) % 2:e:2], 2), torch.stack(vs[(e - 1) % 2:e:2], 2)
                loss = loss + (kd * vd.sin()).sum() * (e + 1)
            if use_buffer:
                token = buf.write(token, e, ks[e], vs[e])
        return loss

    got = run(True)
    got.backward()
    g1 = [t.grad for t in ks + vs]
    for t in ks + vs:
        t.grad = None
    want = run(False)
    want.backward()
    assert float(got.detach()) == pytest.approx(float(want.detach()), rel=1e-12)
    for a, t in zip(g1, ks + vs):
        assert (a is None) == (t.grad is None)
        if a is not None:
            assert torch.allclose(a, t.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("variant", ["vanilla", "moda", "depth-attention", "depth-attention-torch", "mhc"])
def test_generation_with_the_kv_cache_matches_recomputing_the_whole_sequence(variant):
    torch.manual_seed(1)
    model = Decoder(TINY, (variant,), init_std=0.3)
    prompt = torch.randint(0, TINY.vocab, (2, 6))
    got = generate(model, prompt, variant, 4)
    seq = prompt
    with torch.no_grad():
        for _ in range(4):
            nxt = model(seq, variant)[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], dim=1)
    assert torch.equal(got, seq[:, 6:])


def test_param_count_is_the_modules_and_flops_match_a_hand_count():
    for variant in VARIANTS:
        built = sum(p.numel() for p in Decoder(TINY, (variant,)).parameters())
        assert built == param_count(TINY, variant), variant
    cfg = ModelConfig("hand", hidden=8, intermediate=16, layers=2, heads=2, kv_heads=1, vocab=10, seq_len=4,
                      dtype="float32", tie_embeddings=False, dattn_stride=1)
    # per layer: q, o 8x8 each; k, v 8x4 each; FFN 3 x 8x16 -> 576; two layers + the 10x8 head = 1232
    # attention forward per layer: 4 * B * Hq * d * T(T+1)/2 = 4 * 1 * 2 * 4 * 10 = 320
    assert train_flops(cfg, "vanilla", 1, 4) == 6 * 1232 * 4 + 3 * 2 * 320
    # MoDA: + the FFN K/V projection of layer 0 (2 x 8x4 = 64 parameters); layer 1 reads L = 2 depth
    # entries: 4 * B * Hq * d * T * L = 4 * 1 * 2 * 4 * 4 * 2 = 256
    assert train_flops(cfg, "moda", 1, 4) == 6 * (1232 + 64) * 4 + 3 * 2 * 320 + 3 * 256
    assert train_flops(cfg, "moda", 1, 4, grad_accum=3) == 3 * train_flops(cfg, "moda", 1, 4)
    assert math.isclose(train_flops(cfg, "depth-attention", 1, 4) - train_flops(cfg, "vanilla", 1, 4),
                        3 * 4.0 * 2 * 4 * 4)   # layer 1 mixes S = 1 source: 4 (S + 1) Hk d per token


@pytest.mark.parametrize("copy, in_kernel", [(True, False), (False, False), (True, True)])
def test_moda_with_copied_depth_slices_or_gradients_added_after_matches_the_reference(monkeypatch, copy, in_kernel):
    """The A/B knobs of `moda-bench model` (--depth-read copy, --depth-grad-add after/kernel) change
    where the depth bytes go, not the numbers: logits and every gradient against fp64."""
    monkeypatch.setattr(Decoder, "depth_copy", copy)
    monkeypatch.setattr(Decoder, "depth_grad_in_kernel", in_kernel)
    assert _check_variant("moda") >= 4 * TINY.layers


def test_model_spec_names_and_checks_the_depth_knobs():
    from moda_bench.bench.model import ModelSpec
    spec = ModelSpec("smoke", ("vanilla", "moda"), depth_read="copy", depth_grad_add="after")
    assert spec.label == "smoke-train-depth-copy-grad-after" and ModelSpec("smoke").label == "smoke-train"
    with pytest.raises(ValueError, match="depth_read must be one of in-place, copy"):
        ModelSpec("smoke", depth_read="strided")
    with pytest.raises(ValueError, match="depth_grad_add must be one of auto, kernel, after"):
        ModelSpec("smoke", depth_grad_add="later")
