"""Depth-KV memory accounting of `moda-bench model`: seed 004's formula for the slots each variant
keeps, the buffers the decoder allocates (they are the formula, the gradient buffer as large when
attached), the model row's memory columns and the MODELS report's "measured vs formula" table."""
import math

import pandas as pd
import pytest
import torch

from moda_bench import schema
from moda_bench.bench import model as bm
from moda_bench.models import Decoder, ModelConfig
from moda_bench.models.config import CONFIGS, dattn_buffer_entries, dattn_sources
from moda_bench.models.flops import depth_kv_bytes, depth_slots, param_count
from moda_bench.reports.models import memory_markdown, memory_row

SMALL = ModelConfig("small", hidden=32, intermediate=48, layers=5, heads=2, kv_heads=1, vocab=29, seq_len=7,
                    dtype="float32", tie_embeddings=False, dattn_stride=2)


def test_the_formula_counts_the_slots_each_variant_keeps():
    moda = CONFIGS["moda-700m"].with_layers(12)
    # B x T x (2 slots a layer but the last: 22) x Hk x d x bytes x 2
    assert depth_kv_bytes(moda, 1, 4096, 2, "moda") == 1 * 4096 * 22 * 8 * 64 * 2 * 2 == 184_549_376
    dattn = CONFIGS["dattn-1.5b"]   # 48 layers, stride 24: layers 0..23 are read by a later one
    assert depth_slots(dattn, "depth-attention") == depth_slots(dattn, "depth-attention-torch") == 24
    assert depth_kv_bytes(dattn, 8, 2048, 2, "depth-attention") == 8 * 2048 * 24 * 6 * 64 * 2 * 2
    assert depth_slots(dattn, "vanilla") == depth_slots(dattn, "mhc") == 0
    # seed 001's worked example (T=128000, 32 contributing layers, 8 KV heads, d=128, 2 bytes): 16.8 GB
    ex = ModelConfig("ex", hidden=4096, intermediate=64, layers=17, heads=32, kv_heads=8, vocab=8, seq_len=1,
                     dtype="bfloat16", tie_embeddings=False, dattn_stride=1)
    assert depth_slots(ex, "moda") == 32 and round(depth_kv_bytes(ex, 1, 128000, 2) / 1e9, 1) == 16.8


@pytest.mark.parametrize("layers, stride", [(5, 2), (7, 3), (4, 4), (6, 1)])
def test_depth_attention_keeps_only_the_layers_a_later_layer_reads(layers, stride):
    read = {s for i in range(layers) for s in dattn_sources(i, stride)}
    assert read == set(range(dattn_buffer_entries(layers, stride)))


@pytest.mark.parametrize("variant, attached", [("moda", True), ("moda", False), ("depth-attention-torch", True)])
def test_the_decoders_buffers_are_the_formula(variant, attached):
    model = Decoder(SMALL, (variant,))
    B, T = 2, SMALL.seq_len
    tokens = torch.randint(0, SMALL.vocab, (B, T + 1))
    with torch.set_grad_enabled(attached):
        model.loss(tokens, variant, depth_grad=attached)
    kv, grad = model.depth_buffer_bytes()
    assert kv == depth_kv_bytes(SMALL, B, T, 4, variant) > 0
    assert grad == (kv if attached else 0)
    model.drop_buffers()
    assert model.depth_buffer_bytes() == (0, 0)


def test_model_rows_carry_the_memory_columns(tmp_path):
    spec = bm.ModelSpec("smoke", ("vanilla", "depth-attention-torch"), layers=3, seq_len=8, batch=2)
    frame = bm.run_model(spec, tmp_path / "model_memory.csv", device="cpu", progress=False,
                         timer=lambda fn, **kw: bm.cpu_timer(fn, samples=1))
    for c in ("peak_over_vanilla_gb", "depth_kv_gb", "depth_buffer_gb", "depth_grad_buffer_gb"):
        assert c in schema.MODEL_COLUMNS and c in schema.MODEL_NUMERIC
    rows = {r["provider"]: r for r in frame.to_dict("records")}
    cfg = spec.config()   # 3 layers, stride 1 (2 x 3 // 4): layers 0 and 1 are kept
    want = depth_kv_bytes(cfg, 2, 8, 4, "depth-attention-torch") / 1e9
    assert want == pytest.approx(2 * 8 * 2 * 2 * 32 * 4 * 2 / 1e9)
    dattn = rows["depth-attention-torch"]
    assert dattn["depth_kv_gb"] == pytest.approx(want) and dattn["depth_buffer_gb"] == pytest.approx(want)
    assert dattn["depth_grad_buffer_gb"] == pytest.approx(want)
    assert math.isnan(rows["vanilla"]["depth_kv_gb"]) and rows["vanilla"]["depth_buffer_gb"] == 0
    assert math.isnan(dattn["peak_over_vanilla_gb"])   # no CUDA peak off CUDA


def _row(provider, depth_grad, peak, params, formula=math.nan, buffer=math.nan, grad=math.nan):
    return {"gpu": "H100", "model": "moda-700m", "layers": 12, "layers_total": 36, "B": 1, "T": 4096,
            "grad_accum": 1, "new_tokens": 0, "dtype": "bfloat16", "compiled": 0, "pass": "train",
            "provider": provider, "depth_grad": depth_grad, "peak_mem_gb": peak, "peak_over_vanilla_gb": math.nan,
            "depth_kv_gb": formula, "depth_buffer_gb": buffer, "depth_grad_buffer_gb": grad, "params": params}


def test_the_report_sets_measured_beside_formula_and_what_the_run_held():
    cfg = CONFIGS["moda-700m"].with_layers(12)
    f = depth_kv_bytes(cfg, 1, 4096, 2) / 1e9
    pv, pm = param_count(cfg, "vanilla"), param_count(cfg, "moda")
    extra = 3 * (pm - pv) * 2 / 1e9     # gradients + two AdamW moments, bf16
    frame = pd.DataFrame([_row("vanilla", 1, 8.0, pv, buffer=0.0, grad=0.0),
                          _row("moda", 1, 8.0 + 2 * f + extra + 0.1, pm, f, f, f),
                          _row("moda", 0, 8.0 + f, pm, f, f, 0.0)])
    m = memory_row(frame.iloc[1].to_dict(), frame.iloc[0].to_dict())
    assert m["accounted"] == pytest.approx(2 * f + extra) and m["measured"] == pytest.approx(2 * f + extra + 0.1)
    d = memory_row(frame.iloc[2].to_dict(), frame.iloc[0].to_dict())
    assert d["params"] == 0 and d["accounted"] == pytest.approx(d["measured"])
    text = "\n".join(memory_markdown(frame))
    assert "measured vs formula" in text and "16.8 GB" in text
    assert f"| moda | {f:.3f} | {f:.3f} | {f:.3f} | {extra:.3f} |" in text
    assert "| moda (detached) |" in text and "| +0.100 |" in text and "| +0.000 |" in text


def test_the_seed_presets_train_gpu_bound_batches_within_their_layers():
    """A training micro-batch of at least 8192 tokens (B=1 steps are host-bound at these widths),
    a depth the configuration has, and the generation run at the seed's batch and lengths."""
    train = [s for name in ("seed002-train", "seed000-moda") for s in bm.preset_specs(name)]
    assert {s.model for s in train} == {"dattn-1.5b", "dattn-3b", "moda-700m", "moda-1.5b"}
    for s in train:
        cfg = s.config()
        assert s.mode == "train" and s.batch > 1 and s.batch * cfg.seq_len >= 8192, s
        assert 1 <= cfg.layers <= cfg.layers_total
    gen = bm.preset_specs("seed002-generate")[0]
    assert (gen.batch, gen.config().seq_len, gen.new_tokens) == (64, 2048, 2048)
    assert bm.preset_specs("seed002-train", layers=48)[0].config().layers == 48   # --layers still overrides


def test_depth_traffic_counts_each_layers_reads_and_gradients():
    """MoDA: sum over layers of 2 l entries, K and V, read forward and backward (+ gradient read and
    write attached); Depth-Attention: its source layers; vanilla and the residual variants: none.
    The detached part equals the floor model's depth reads of a fwd+bwd call summed over layers."""
    from moda_bench.floor import moda_work
    from moda_bench.models.flops import depth_entries_read, depth_traffic_bytes
    cfg = CONFIGS["smoke"]
    B, T, e = 2, 37, 2
    L = cfg.layers
    assert depth_entries_read(cfg, "moda") == sum(2 * layer for layer in range(L)) == L * (L - 1)
    row = B * T * cfg.kv_heads * cfg.head_dim * e * 2
    assert depth_traffic_bytes(cfg, "moda", B, T, e) == 4 * L * (L - 1) * row
    assert depth_traffic_bytes(cfg, "moda", B, T, e, depth_grad=False) == 2 * L * (L - 1) * row
    hq, hk, d = cfg.heads, cfg.kv_heads, cfg.head_dim
    reads = sum(moda_work("fwdbwd", B, T, hq, hk, d, 2 * layer, depth_grad=False).bytes
                - moda_work("fwdbwd", B, T, hq, hk, d, 0, depth_grad=False).bytes for layer in range(L))
    assert depth_traffic_bytes(cfg, "moda", B, T, e, depth_grad=False) == reads
    sources = sum(len(dattn_sources(layer, cfg.dattn_stride)) for layer in range(L))
    assert depth_traffic_bytes(cfg, "depth-attention", B, T, e) == 4 * sources * row
    for variant in ("vanilla", "denseformer", "attnres", "mhc"):
        assert depth_traffic_bytes(cfg, variant, B, T, e) == 0


def test_the_report_sets_the_depth_traffic_beside_the_measured_overhead():
    """One run (12 layers of the 700M, B=1, T=4096) on an H100: MoDA attached and detached get their
    traffic (132 entries a position), its ms at the table copy rate and its share of vanilla's step."""
    from moda_bench.health import known_reference
    from moda_bench.models.flops import depth_traffic_bytes
    from moda_bench.reports.models import traffic_markdown
    cfg = CONFIGS["moda-700m"].with_layers(12)
    rows = [dict(_row(p, g, 8.0, 1), gpu="NVIDIA H100 80GB HBM3", status="ok", step_ms=ms, sweep="model-x")
            for p, g, ms in (("vanilla", 1, 100.0), ("moda", 1, 130.0), ("moda", 0, 110.0))]
    text = "\n".join(traffic_markdown(pd.DataFrame(rows)))
    rate = known_reference("NVIDIA H100 80GB HBM3")["copy_gbps"]
    for grad, extra in ((True, "30.0"), (False, "10.0")):
        gb = depth_traffic_bytes(cfg, "moda", 1, 4096, 2, grad) / 1e9
        ms = gb / rate * 1e3
        name = "moda" if grad else "moda (detached)"
        assert f"| {name} | 132 | {gb:.2f} | {ms:.1f} | {ms:.1f} | {extra} | {extra} |" in text
    assert "| vanilla |" not in text and traffic_markdown(pd.DataFrame(rows[1:])) == []
