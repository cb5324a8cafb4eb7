"""The MoDA decode operator (moda_bench.kernels.decode) against its float64 dense reference.

On a CPU machine the Triton kernels run under TRITON_INTERPRET=1 (conftest.py) at small sizes:
odd Tk, ragged cache_seqlens, Tq in {1, 2, 4}, L in {0, 1, 64}, G in {1, 4, 8, 16}, num_splits in
{1, 2, 3, auto}, dense and paged caches, with small key tiles (block_n=16) so that the loops,
the split spans and the causal tail tiles all run. Tolerances: ||out - ref|| / ||ref|| below
helpers.TOLERANCE (fp32 1e-4, fp16 5e-3, bf16 2e-2). GPU-marked tests run real sizes on CUDA.
The fused combine (`DecodeConfig(fused_combine=True)`) has its tests in tests/test_decode_fused.py.
`DecodeConfig(pdl=True)` (the combine under Programmatic Dependent Launch, sm_90+ only): a no-op
under the interpreter, bitwise the output of pdl=False on the GPU, eager and in a CUDA graph.
"""
import math
from dataclasses import replace

import pytest
import torch
from helpers import TOLERANCE, device, rel_err

from moda_bench.kernels.decode import (
    DecodeConfig,
    DecodeShape,
    choose_num_splits,
    decode_bytes,
    decode_reference,
    fa4_decode,
    fa4_decode_unavailable,
    flashinfer_decode,
    flashinfer_unavailable,
    moda_decode,
    sdpa_decode,
    sdpa_unavailable,
)
from moda_bench.kernels.decode.interface import sm_count

SMALL = DecodeConfig(block_n=16, block_l=16)


def make_inputs(B, Tq, Hq, Hk, d, L, Tk, dtype=torch.float32, seed=0, lens=None, page_size=0, dev=None):
    """Random q, caches, depth (None when L = 0), cache_seqlens (None unless lens) and, with
    page_size, the caches as shuffled pages plus their block table. Returns a kwargs dict."""
    g = torch.Generator().manual_seed(seed)
    dev = dev or device()

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(dev, dtype)

    q, k, v = rnd(B, Tq, Hq, d), rnd(B, Tk, Hk, d), rnd(B, Tk, Hk, d)
    kw = dict(q=q, k_cache=k, v_cache=v, k_depth=rnd(B, Tq, L, Hk, d) if L else None,
              v_depth=rnd(B, Tq, L, Hk, d) if L else None)
    if lens is not None:
        kw["cache_seqlens"] = torch.tensor(lens, dtype=torch.int32, device=dev)
    if page_size:
        per_seq = -(-Tk // page_size)
        n_pages = B * per_seq + 3  # a few pages nobody uses
        perm = torch.randperm(n_pages, generator=g)[: B * per_seq]
        table = perm.view(B, per_seq).to(torch.int32)
        kp = torch.zeros(n_pages, page_size, Hk, d, dtype=dtype, device=dev)
        vp = torch.zeros_like(kp)
        t = torch.arange(Tk)
        pages = table[:, t // page_size].reshape(-1).to(dev).long()  # (B*Tk,) page of each (b, t)
        slots = (t % page_size).repeat(B).to(dev)
        kp[pages, slots] = k.reshape(B * Tk, Hk, d)
        vp[pages, slots] = v.reshape(B * Tk, Hk, d)
        kw.update(k_cache=kp, v_cache=vp, block_table=table.to(dev))
        kw.setdefault("cache_seqlens", torch.full((B,), Tk, dtype=torch.int32, device=dev))
        kw["dense"] = (k, v)
    return kw


def check(kw, tol=None, ref_dtype=torch.float64, **call):
    """moda_decode(**kw, **call) against decode_reference; returns the relative error."""
    kw = dict(kw)
    dense = kw.pop("dense", None)
    q = kw["q"]
    out = moda_decode(**kw, **call)
    assert out.shape == q.shape and out.dtype == q.dtype and out.device == q.device
    assert torch.isfinite(out).all(), "non-finite values in the output"
    ref = decode_reference(**kw, scale=call.get("scale"), out_dtype=ref_dtype, compute_dtype=ref_dtype)
    if dense is not None:  # the paged reference agrees with the dense one on the same data
        dkw = dict(kw, k_cache=dense[0], v_cache=dense[1], block_table=None)
        assert rel_err(decode_reference(**dkw, out_dtype=torch.float64), ref) < 1e-12
    err = rel_err(out, ref)
    tol = tol or TOLERANCE[q.dtype]
    assert err < tol, f"relative error {err:.3e} >= {tol:g}"
    return err


# ------------------------------------------------------------------ the grid (interpreter)
# (Tq, L, G, num_splits): every value of each axis, most pairs of values; "auto" = None
GRID = [
    (1, 0, 1, 1), (1, 1, 4, 2), (1, 64, 8, 3), (1, 0, 16, None),
    (2, 1, 1, 3), (2, 64, 4, None), (2, 0, 8, 1), (2, 1, 16, 2),
    (4, 64, 1, 2), (4, 0, 4, 3), (4, 1, 8, None), (4, 64, 16, 1),
]


@pytest.mark.parametrize("Tq,L,G,S", GRID, ids=[f"Tq{a}-L{b}-G{c}-S{d}" for a, b, c, d in GRID])
def test_grid_fp32(Tq, L, G, S):
    """Odd Tk (131 where the chooser has to pick > 1 split, else 53); every other case ragged:
    one sequence ending on a tile boundary (the causal tail inside an otherwise whole tile), one
    at the minimum n_b = Tq."""
    Hk = 2 if G <= 4 else 1
    Tk = 131 if S is None else 53
    lens = None if (Tq + G) % 2 else [16 * (Tk // 16), Tq]
    kw = make_inputs(2, Tq, G * Hk, Hk, 32 if G <= 4 else 16, L, Tk, seed=Tq * 100 + L + G, lens=lens)
    check(kw, num_splits=S, config=SMALL)


def test_auto_splits_really_split():
    """The GRID's auto cases (Tk=131, 9 tiles of 16) get 2 splits; bigger caches more."""
    assert choose_num_splits(2, 1, 131, sm_count(torch.device("cpu")), 16) == 2
    assert choose_num_splits(2, 2, 131, 132, 16) == 2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_precision_d64(dtype):
    kw = make_inputs(2, 2, 16, 2, 64, 5, 77, dtype, seed=1, lens=[77, 40])
    check(kw, num_splits=3, config=SMALL)


def test_head_dim_128_bf16():
    kw = make_inputs(1, 1, 8, 1, 128, 64, 45, torch.bfloat16, seed=2)
    check(kw, num_splits=2, config=SMALL)


def test_default_config_and_scale():
    """The default tiles (BLOCK_N 128 at d <= 64: one tile holds the whole cache) and scale=."""
    kw = make_inputs(1, 2, 8, 2, 32, 3, 70, seed=3, lens=[66])
    check(kw, scale=0.3)
    check(kw, num_splits=2, scale=0.3)


def test_default_config_per_gpu():
    """The tiles a call runs without config=: the GPU_TILES entry of the device's name where the
    call has enough (sequence, KV head) pairs (the H100: always 2 warps, 2 stages; the H200 from
    B*Hk = 1024; both launch the combine with PDL), DEFAULT_CONFIG elsewhere and off CUDA; its run
    matches the reference."""
    from moda_bench.kernels.decode import default_config
    from moda_bench.kernels.decode.interface import DEFAULT_CONFIG, _gpu_config
    h100 = _gpu_config("NVIDIA H100 80GB HBM3", 8)
    assert (h100.num_warps, h100.num_stages, h100.pdl) == (2, 2, True) and h100.block_n == DEFAULT_CONFIG.block_n
    assert _gpu_config("NVIDIA H200", 256) == replace(DEFAULT_CONFIG, tma=True, pdl=True)   # B=32, Hk=8
    assert _gpu_config("NVIDIA H200", 1024) == replace(h100, tma=True, pdl=True)            # B=128, Hk=8
    assert not DEFAULT_CONFIG.tma and not h100.tma and not DEFAULT_CONFIG.pdl
    assert _gpu_config("NVIDIA A100-SXM4-80GB", 4096) == DEFAULT_CONFIG
    assert default_config(torch.device("cpu")) == DEFAULT_CONFIG
    kw = make_inputs(1, 2, 8, 2, 32, 3, 45, seed=4)
    check(kw, num_splits=3, config=replace(h100, block_n=16, block_l=16))


def test_splits_beyond_the_sequence():
    """More splits than a short sequence has tiles: the empty splits store nothing and the
    combine skips them; the depth still rides in the last split."""
    kw = make_inputs(3, 2, 4, 1, 16, 2, 60, seed=4, lens=[2, 17, 60])
    check(kw, num_splits=5, config=SMALL)
    check(kw, num_splits=1, config=SMALL)
    check(kw, num_splits=5, config=DecodeConfig(block_n=16, block_l=16, combine_block_s=2))  # 3 merge steps


def test_rows_cut_into_row_blocks():
    """Tq*G above max_rows: the rows run in several programs (each reads the cache)."""
    kw = make_inputs(1, 4, 16, 1, 16, 3, 41, seed=5, lens=[39])
    check(kw, num_splits=2, config=DecodeConfig(block_n=16, block_l=16, max_rows=16))


def test_noncontiguous_inputs():
    """q as a transposed view, K and V as slices of one packed (B, Tk, 2, Hk, d) cache (their
    strides differ from a plain cache's), depth from a packed tensor too, cache_seqlens a
    strided view."""
    kw = make_inputs(2, 2, 8, 2, 32, 3, 37, seed=6, lens=[37, 20])
    q = kw["q"].transpose(1, 2).contiguous().transpose(1, 2)
    kv = torch.stack([kw["k_cache"], kw["v_cache"]], dim=2)
    dkv = torch.stack([kw["k_depth"], kw["v_depth"]], dim=0)
    assert not q.is_contiguous() and not kv[:, :, 0].is_contiguous()
    lens = torch.tensor([37, -1, 20, -1], dtype=torch.int32, device=q.device)[::2]  # a strided view
    kw2 = dict(kw, q=q, k_cache=kv[:, :, 0], v_cache=kv[:, :, 1], k_depth=dkv[0], v_depth=dkv[1], cache_seqlens=lens)
    check(kw2, num_splits=2, config=SMALL)


# ------------------------------------------------------------------ paged
@pytest.mark.parametrize("Tq,L,S", [(1, 0, 1), (2, 3, 3), (4, 64, None)],
                         ids=["Tq1-L0-S1", "Tq2-L3-S3", "Tq4-L64-auto"])
def test_paged(Tq, L, S):
    """page_size 16, a shuffled block table, ragged lengths (one ending mid-page)."""
    Tk = 131 if S is None else 61
    kw = make_inputs(2, Tq, 8, 2, 16, L, Tk, seed=7 + Tq, lens=[Tk, 23], page_size=16)
    check(kw, num_splits=S, config=SMALL)


def test_paged_page_larger_than_tile():
    """page_size 32 > BLOCK_N 16: a tile sits inside one page."""
    kw = make_inputs(2, 1, 4, 1, 16, 1, 70, seed=8, lens=[70, 33], page_size=32)
    check(kw, num_splits=2, config=SMALL)


# ------------------------------------------------------------------ poisoned memory, unchecked values
def test_poisoned_scratch_and_output(monkeypatch):
    """torch.empty returning NaN-filled memory (output and partial buffers): every value the
    result depends on is written before it is read, and nothing else is read."""
    real_empty = torch.empty

    def poisoned(*a, **k):
        t = real_empty(*a, **k)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    kw = make_inputs(3, 2, 8, 2, 16, 2, 50, seed=9, lens=[50, 2, 19])
    monkeypatch.setattr(torch, "empty", poisoned)
    check(kw, num_splits=4, config=SMALL)
    check(kw, num_splits=1, config=SMALL)


@pytest.mark.parametrize("S", [1, 3])
def test_unchecked_bad_seqlens_give_nan_rows(S):
    """With check_values=False (the GPU default) a length outside [Tq, Tk] reads nothing and
    gives NaN rows for that sequence only; the others stay exact."""
    kw = make_inputs(3, 2, 4, 2, 16, 1, 40, seed=10, lens=[40, 1, 41])
    out = moda_decode(**kw, num_splits=S, config=SMALL, check_values=False)
    assert torch.isnan(out[1]).all() and torch.isnan(out[2]).all()
    good = {k: (v[:1] if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    ref = decode_reference(**good, out_dtype=torch.float64)
    assert rel_err(out[:1], ref) < TOLERANCE[torch.float32]


@pytest.mark.filterwarnings("ignore:All-NaN slice")
def test_unchecked_bad_page_gives_nan_rows():
    kw = make_inputs(2, 1, 4, 1, 16, 0, 40, seed=11, lens=[40, 40], page_size=16)
    kw.pop("dense")
    kw["block_table"] = kw["block_table"].clone()
    kw["block_table"][1, 1] = 10_000
    out = moda_decode(**kw, num_splits=2, config=SMALL, check_values=False)
    assert torch.isnan(out[1]).all() and torch.isfinite(out[0]).all()


# ------------------------------------------------------------------ the split chooser, bytes
def test_choose_num_splits():
    assert choose_num_splits(1, 8, 32768, 132, 64) == 33  # 264 programs = 2 waves
    assert choose_num_splits(8, 8, 32768, 132, 64) == 4
    assert choose_num_splits(16, 8, 32768, 132, 64) == 2
    assert choose_num_splits(64, 8, 32768, 132, 64) == 1  # B*Hk fills the GPU already
    assert choose_num_splits(1, 8, 1024, 132, 64) == 4  # 16 tiles: at least 4 per split
    assert choose_num_splits(1, 1, 10**7, 132, 64) == 256  # capped at MAX_SPLITS
    assert choose_num_splits(1, 1, 1, 132, 64) == 1
    with pytest.raises(ValueError, match="n_sm"):
        choose_num_splits(1, 8, 1024, 0, 64)


def test_decode_bytes():
    s = DecodeShape(B=2, Tq=1, Hq=8, Hk=2, d=64, L=4, Tk=100)
    cache, depth, qo = 2 * 200 * 2 * 64, 2 * 2 * 4 * 2 * 64, 2 * 2 * 8 * 64
    assert decode_bytes(s, 2) == 2 * (cache + depth + qo)
    assert decode_bytes(s, 2, cache_tokens=150) == 2 * (2 * 150 * 2 * 64 + depth + qo)


# ------------------------------------------------------------------ errors
def _good(**over):
    kw = make_inputs(2, 2, 4, 2, 32, 3, 20, seed=12, lens=[20, 9])
    kw.update(over)
    return kw


def _paged(**over):
    kw = make_inputs(2, 1, 4, 2, 16, 0, 32, seed=13, lens=[32, 9], page_size=16)
    kw.pop("dense")
    kw.update(over)
    return kw


def _drop_depth(kw):
    return dict(kw, k_depth=None, v_depth=None)


BAD = [
    ("q-rank", lambda: _good(q=_good()["q"][0]), ValueError, r"q must have rank 4 with layout \(B, Tq, Hq, d\)"),
    ("cache-rank", lambda: _good(k_cache=_good()["k_cache"][0]), ValueError, "k_cache must have rank 4"),
    ("depth-rank", lambda: _good(k_depth=_good()["k_depth"][0]), ValueError, "k_depth must have rank 5"),
    ("not-tensor", lambda: _good(q="q"), TypeError, "q must be a torch.Tensor"),
    ("seqlens-not-tensor", lambda: _good(cache_seqlens=[20, 9]), TypeError, "cache_seqlens must be a torch.Tensor"),
    ("dtype", lambda: _good(**{n: t.double() for n, t in _good().items() if n != "cache_seqlens"}), TypeError,
     "q has dtype torch.float64"),
    ("mixed-dtype", lambda: _good(k_cache=_good()["k_cache"].half()), TypeError, "k_cache has dtype torch.float16"),
    ("head-dim", lambda: _drop_depth({n: (t[..., :24] if n != "cache_seqlens" and t is not None else t)
                                      for n, t in _good().items()}), ValueError, "head dim d=24"),
    ("heads", lambda: _drop_depth(_good(q=_good()["q"][:, :, :3])), ValueError, "multiple of the cache's KV heads"),
    ("batch", lambda: _good(k_cache=_good()["k_cache"][:1], v_cache=_good()["v_cache"][:1]), ValueError,
     r"k_cache must have shape \(B=2, Tk, Hk, d=32\)"),
    ("cache-d", lambda: _drop_depth(_good(k_cache=_good()["k_cache"][..., :16], v_cache=_good()["v_cache"][..., :16])),
     ValueError, r"k_cache must have shape \(B=2, Tk, Hk, d=32\)"),
    ("v-shape", lambda: _good(v_cache=_good()["v_cache"][:, :10]), ValueError,
     "v_cache must have the shape of k_cache"),
    ("depth-Tq", lambda: _good(k_depth=_good()["k_depth"][:, :1], v_depth=_good()["v_depth"][:, :1]), ValueError,
     r"k_depth must have shape \(B=2, Tq=2, L, Hk=2, d=32\)"),
    ("depth-Hk", lambda: _good(k_depth=_good()["k_depth"][:, :, :, :1], v_depth=_good()["v_depth"][:, :, :, :1]),
     ValueError, r"k_depth must have shape"),
    ("depth-half", lambda: _good(v_depth=None), ValueError, "both be given"),
    ("Tq>Tk", lambda: _good(k_cache=_good()["k_cache"][:, :1], v_cache=_good()["v_cache"][:, :1],
                            cache_seqlens=None), ValueError, "Tq=2 new tokens but the cache holds at most Tk=1"),
    ("seqlens-shape", lambda: _good(cache_seqlens=torch.tensor([20], dtype=torch.int32, device=device())),
     ValueError, r"cache_seqlens must have shape \(B,\) = \(2,\), got \(1\)"),
    ("seqlens-dtype", lambda: _good(cache_seqlens=torch.tensor([20, 9], device=device())), TypeError,
     "cache_seqlens must have dtype torch.int32, got torch.int64"),
    ("seqlens-high", lambda: _good(cache_seqlens=torch.tensor([21, 9], dtype=torch.int32, device=device())),
     ValueError, r"cache_seqlens\[0\] = 21.*more than the cache holds \(Tk=20\)"),
    ("seqlens<Tq", lambda: _good(cache_seqlens=torch.tensor([20, 1], dtype=torch.int32, device=device())),
     ValueError, r"cache_seqlens\[1\] = 1.*Tq > n_b"),
    ("table-shape", lambda: _paged(block_table=_paged()["block_table"][:1]), ValueError,
     r"block_table must have shape \(B=2, max_blocks\), got \(1, 2\)"),
    ("table-dtype", lambda: _paged(block_table=_paged()["block_table"].long()), TypeError,
     "block_table must have dtype torch.int32"),
    ("table-no-seqlens", lambda: _paged(cache_seqlens=None), ValueError,
     "cache_seqlens .* is required with a block_table"),
    ("table-bad-page", lambda: _paged(block_table=_paged()["block_table"] * 0 + 99), ValueError,
     r"block_table\[0, 0\] = 99 is not a page of k_cache \(num_blocks=7\)"),
    ("paged-cache-d", lambda: _paged(k_cache=_paged()["k_cache"][..., :8], v_cache=_paged()["v_cache"][..., :8]),
     ValueError, r"k_cache must have shape \(num_blocks, page_size, Hk, d=16\)"),
]


@pytest.mark.parametrize("name,make,exc,words", BAD, ids=[b[0] for b in BAD])
def test_bad_input_errors(name, make, exc, words):
    """check_values=True: the value errors are raised on CUDA tensors too (one host copy)."""
    kw = make()
    with pytest.raises(exc, match=words):
        moda_decode(**kw, check_values=True)
    if name not in ("head-dim", "dtype"):  # the reference takes any head dim, and float64
        with pytest.raises(exc, match=words):
            decode_reference(**kw)


def test_values_checked_by_default_on_cpu_tensors(monkeypatch):
    """The default (check_values=None) reads the values where that needs no device sync."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # CPU tensors pass the CUDA check even on a GPU machine
    kw = {n: (t.cpu() if isinstance(t, torch.Tensor) else t) for n, t in _good().items()}
    kw["cache_seqlens"] = torch.tensor([21, 9], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"cache_seqlens\[0\] = 21"):
        moda_decode(**kw)


@pytest.mark.gpu
def test_gpu_values_unchecked_by_default():
    """On CUDA the default does not read cache_seqlens (no sync): a bad length gives NaN rows."""
    kw = _good(cache_seqlens=torch.tensor([21, 9], dtype=torch.int32, device="cuda"))
    out = moda_decode(**kw)
    assert torch.isnan(out[0]).all() and torch.isfinite(out[1]).all()


@pytest.mark.parametrize("S,exc,words", [(0, ValueError, r"num_splits=0 must be in \[1, 256\]"),
                                         (257, ValueError, "num_splits=257"),
                                         ("2", TypeError, "num_splits must be an int"),
                                         (True, TypeError, "num_splits must be an int")])
def test_bad_num_splits(S, exc, words):
    with pytest.raises(exc, match=words):
        moda_decode(**_good(), num_splits=S)


@pytest.mark.parametrize("cfg,words", [(DecodeConfig(block_n=48), "block_n=48"), (DecodeConfig(block_l=8), "block_l=8"),
                                       (DecodeConfig(num_warps=3), "num_warps=3"),
                                       (DecodeConfig(num_stages=0), "num_stages=0")])
def test_bad_config(cfg, words):
    with pytest.raises(ValueError, match=words):
        moda_decode(**_good(), config=cfg)


def test_cpu_tensors_rejected_without_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    kw = {n: (t.cpu() if isinstance(t, torch.Tensor) else t) for n, t in _good().items()}
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        moda_decode(**kw)


# ------------------------------------------------------------------ peers
def test_sdpa_peer_math_backend_matches_reference():
    """The SDPA peer's GQA and bottom-right mask logic, run on the MATH backend (any device)."""
    for Tq, G in ((1, 4), (3, 4), (2, 1)):
        kw = make_inputs(2, Tq, 2 * G, 2, 32, 0, 29, seed=20 + Tq)
        out, detail = sdpa_decode(kw["q"], kw["k_cache"], kw["v_cache"], "MATH", return_detail=True)
        ref = decode_reference(kw["q"], kw["k_cache"], kw["v_cache"], out_dtype=torch.float64)
        assert rel_err(out, ref) < 1e-5, (Tq, G, detail)
        assert ("causal_lower_right" in detail) == (Tq > 1)


def test_peer_reasons():
    assert "unknown SDPA backend" in sdpa_unavailable(None, "FAST")
    assert sdpa_unavailable(None, "MATH") is None
    with pytest.raises(ValueError, match="rank-4"):
        sdpa_decode(torch.zeros(2, 3), torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4), "MATH")
    if torch.cuda.is_available():
        return
    assert "needs CUDA" in sdpa_unavailable(None, "FLASH_ATTENTION")
    assert "needs CUDA" in sdpa_unavailable(None, "CUDNN_ATTENTION")
    for reason in (fa4_decode_unavailable(None), flashinfer_unavailable(None)):
        assert isinstance(reason, str) and reason and "\n" not in reason
    kw = make_inputs(1, 1, 4, 1, 32, 0, 16, torch.bfloat16, seed=21)
    args = (kw["q"], kw["k_cache"], kw["v_cache"])
    with pytest.raises(RuntimeError, match="sdpa_decode unavailable: SDPA FLASH_ATTENTION needs CUDA"):
        sdpa_decode(*args, "FLASH_ATTENTION")
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        fa4_decode(*args)
    with pytest.raises(RuntimeError, match="flashinfer_decode unavailable"):
        flashinfer_decode(*args)


# ------------------------------------------------------------------ GPU, real sizes
GPU_CASES = [  # (B, Tq, G, L, d, paged, ragged)
    (1, 1, 8, 0, 128, False, False), (1, 1, 8, 64, 128, False, False), (1, 4, 16, 64, 64, False, False),
    (8, 1, 8, 64, 128, False, True), (8, 2, 16, 0, 64, False, True), (8, 4, 8, 64, 128, True, True),
    (1, 2, 8, 64, 64, True, False),
]


@pytest.mark.gpu
@pytest.mark.parametrize("B,Tq,G,L,d,paged,ragged", GPU_CASES,
                         ids=[f"B{c[0]}-Tq{c[1]}-G{c[2]}-L{c[3]}-d{c[4]}{'-paged' if c[5] else ''}"
                              f"{'-ragged' if c[6] else ''}" for c in GPU_CASES])
def test_gpu_real_sizes_bf16(B, Tq, G, L, d, paged, ragged):
    """Tk = 32768 + 7, Hk = 8, bf16, auto splits and num_splits=1, against the fp64 reference."""
    Tk, Hk = 32775, 8
    lens = [Tk - 1000 * b for b in range(B)] if ragged else None
    kw = make_inputs(B, Tq, G * Hk, Hk, d, L, Tk, torch.bfloat16, seed=B + Tq + G + L, lens=lens,
                     page_size=16 if paged else 0)
    kw.pop("dense", None)
    e_auto = check(kw)
    e_one = check(kw, num_splits=1)
    print(f"rel err auto={e_auto:.2e} one-split={e_one:.2e}")


TMA_CASES = [(1, 8, 0, 32, None, 1), (2, 1, 1, 32, [45, 30], 3), (4, 4, 3, 64, [44, 13], 2), (2, 8, 3, 128, None, 5)]


@pytest.mark.parametrize("Tq,G,L,d,lens,S", TMA_CASES, ids=[f"Tq{c[0]}-G{c[1]}-L{c[2]}-d{c[3]}-S{c[5]}"
                                                           f"{'-ragged' if c[4] else ''}" for c in TMA_CASES])
def test_tma_tiles(monkeypatch, Tq, G, L, d, lens, S):
    """DecodeConfig(tma=True): a dense cache's tiles through tensor descriptors, at odd Tk (45:
    the last tile runs past the cache), ragged lengths whose unused rows hold NaN (the masked tile
    must not let them in), Tq > 1, L = 0/1/3, one and several splits; a paged cache ignores it."""
    import moda_bench.kernels.decode.interface as kmod
    made = []
    real = kmod._descriptors
    monkeypatch.setattr(kmod, "_descriptors", lambda *a: made.append(1) or real(*a))
    kw = make_inputs(2, Tq, G * 2, 2, d, L, 45, seed=Tq + G + L + d, lens=lens)
    if lens:
        for b, n in enumerate(lens):
            kw["k_cache"][b, n:] = float("nan")
            kw["v_cache"][b, n:] = float("nan")
    cfg = DecodeConfig(block_n=16, block_l=16, tma=True)
    check(kw, num_splits=S, config=cfg)
    assert made and all(x is not None for x in real(kw["k_cache"], kw["v_cache"], 16))
    paged = make_inputs(2, Tq, G * 2, 2, d, L, 45, seed=1, page_size=16)
    made.clear()
    check(paged, num_splits=S, config=cfg)
    assert not made   # pointer loads: no descriptors for a paged cache


@pytest.mark.gpu
@pytest.mark.parametrize("B,Tq,ragged", [(1, 1, False), (8, 4, True)], ids=["B1-Tq1", "B8-Tq4-ragged"])
def test_gpu_tma_bf16(B, Tq, ragged):
    """tma=True on the GPU (TMA bulk copies on Hopper) at Tk = 32768 + 7, Hk = 8, G = 8, L = 64,
    bf16, auto splits and one split, against the fp64 reference."""
    Tk = 32775
    lens = [Tk - 1000 * b for b in range(B)] if ragged else None
    kw = make_inputs(B, Tq, 64, 8, 64, 64, Tk, torch.bfloat16, seed=B + Tq, lens=lens)
    cfg = DecodeConfig(tma=True)
    print(f"rel err auto={check(kw, config=cfg):.2e} one-split={check(kw, num_splits=1, config=cfg):.2e}")


# ------------------------------------------------------------------ Programmatic Dependent Launch
def test_pdl_rejected_with_fused_combine():
    """pdl overlaps the combine's launch with the split kernel; the fused combine has no such launch."""
    cfg = DecodeConfig(pdl=True, fused_combine=True)
    for call in (lambda: cfg.resolved(32), lambda: moda_decode(**_good(), config=cfg)):
        with pytest.raises(ValueError, match=r"DecodeConfig.pdl=True needs fused_combine=False"):
            call()


def test_pdl_is_a_no_op_under_the_interpreter(monkeypatch):
    """The knob takes effect only on CUDA at compute capability >= 9 outside the interpreter, so here
    (TRITON_INTERPRET=1) pdl=True launches exactly what pdl=False does (PDL=False, no launch_pdl) and
    gives bitwise the same output, at an odd shape (Tk=61, ragged, Tq=2, G=4, L=3, 3 splits)."""
    import moda_bench.kernels.decode.interface as kmod
    seen, real = [], kmod.decode_combine_kernel

    class Recorder:
        def __getitem__(self, grid):
            return lambda *a, **k: seen.append((k["PDL"], "launch_pdl" in k)) or real[grid](*a, **k)

    monkeypatch.setattr(kmod._COMBINE_LAUNCH, "fn", Recorder())  # the kernel the combine's launches use,
    monkeypatch.setattr(kmod._COMBINE_LAUNCH, "kernels", {})      # none kept from earlier tests (on a GPU)
    kw = make_inputs(2, 2, 8, 2, 32, 3, 61, seed=14, lens=[61, 29])
    off = moda_decode(**kw, num_splits=3, config=SMALL)
    on = moda_decode(**kw, num_splits=3, config=replace(SMALL, pdl=True))
    assert torch.equal(on, off)
    active = kmod._pdl_active(kw["q"].device)
    assert seen == [(False, False), (active, active)]
    if kmod.interpreting():
        assert not active
    monkeypatch.setattr(kmod, "interpreting", lambda: False)  # the gate itself, on a made-up GPU
    for cap, want in (((9, 0), True), ((10, 0), True), ((8, 9), False)):
        monkeypatch.setattr(kmod, "_capability", lambda i, cap=cap: cap)
        assert kmod._pdl_active(torch.device("cuda", 0)) is want and not kmod._pdl_active(torch.device("cpu"))


@pytest.mark.gpu
def test_gpu_pdl_bitwise():
    """pdl=True on the GPU (PDL on sm_90+, else the same launches) against pdl=False, both on the
    device's default tiles otherwise: bitwise equal at B=1, Tk=4099, n_b=4001, bf16, G=8, L=64, auto and 5
    splits, eager and as CUDA graphs (warmed up on a side stream, captured, replayed 3 times)."""
    import moda_bench.kernels.decode.interface as kmod
    kw = make_inputs(1, 1, 64, 8, 64, 64, 4099, torch.bfloat16, seed=60, lens=[4001])
    base = kmod.default_config(kw["q"].device, 8)  # on the H100 and H200 it has pdl=True itself
    cfgs = (replace(base, pdl=False), replace(base, pdl=True))
    print(f"pdl active: {kmod._pdl_active(kw['q'].device)}")
    for S in (None, 5):
        off, on = (moda_decode(**kw, num_splits=S, config=c) for c in cfgs)
        assert torch.equal(on, off), f"num_splits={S}"
    check(kw, config=cfgs[1])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for c in cfgs:
            moda_decode(**kw, config=c)
    torch.cuda.current_stream().wait_stream(side)
    graphs = []
    for c in cfgs:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = moda_decode(**kw, config=c)
        graphs.append((graph, out))
    eager = moda_decode(**kw, config=cfgs[0])
    for _ in range(3):
        for graph, out in graphs:
            out.fill_(float("nan"))
            graph.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(out, eager) for _, out in graphs)


def _peer_inputs(Tq, dtype=torch.bfloat16):
    return make_inputs(2, Tq, 64, 8, 128, 0, 4097, dtype, seed=30 + Tq)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["FLASH_ATTENTION", "CUDNN_ATTENTION"])
@pytest.mark.parametrize("Tq", [1, 3])
def test_gpu_sdpa_peer(backend, Tq):
    reason = sdpa_unavailable(None, backend)
    if reason:
        pytest.skip(reason)
    kw = _peer_inputs(Tq)
    try:
        out, detail = sdpa_decode(kw["q"], kw["k_cache"], kw["v_cache"], backend, return_detail=True)
    except RuntimeError as exc:
        pytest.skip(str(exc))
    ref = decode_reference(kw["q"], kw["k_cache"], kw["v_cache"], out_dtype=torch.float64)
    assert rel_err(out, ref) < TOLERANCE[torch.bfloat16], detail
    print(detail)


@pytest.mark.gpu
@pytest.mark.parametrize("Tq", [1, 3])
@pytest.mark.parametrize("num_splits", [1, None, 8])
def test_gpu_fa4_peer(Tq, num_splits):
    reason = fa4_decode_unavailable(None)
    if reason:
        pytest.skip(reason)
    kw = _peer_inputs(Tq)
    out, detail = fa4_decode(kw["q"], kw["k_cache"], kw["v_cache"], num_splits, return_detail=True)
    ref = decode_reference(kw["q"], kw["k_cache"], kw["v_cache"], out_dtype=torch.float64)
    assert rel_err(out, ref) < TOLERANCE[torch.bfloat16], detail
    print(detail)


@pytest.mark.gpu
@pytest.mark.parametrize("Tq,paged", [(1, False), (1, True), (3, False)])
def test_gpu_flashinfer_peer(Tq, paged):
    reason = flashinfer_unavailable(None)
    if reason:
        pytest.skip(reason)
    kw = make_inputs(2, Tq, 64, 8, 128, 0, 4097, torch.bfloat16, seed=40 + Tq, lens=[4097, 3000],
                     page_size=16 if paged else 0)
    kw.pop("dense", None)
    if not paged:
        kw.pop("cache_seqlens")
    out, detail = flashinfer_decode(kw["q"], kw["k_cache"], kw["v_cache"], cache_seqlens=kw.get("cache_seqlens"),
                                    block_table=kw.get("block_table"), return_detail=True)
    ref = decode_reference(**kw, out_dtype=torch.float64)
    assert rel_err(out, ref) < TOLERANCE[torch.bfloat16], detail
    print(detail)


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 8])
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_bandwidth_report(B, d):
    """Prints (no assertion: timing belongs to the benchmark) the time and the fraction of the
    device copy rate at T=32K, G=8, L=64, auto splits vs one split; run with -s to see it."""
    from triton.testing import do_bench
    Tk, Hk = 32768, 8
    kw = make_inputs(B, 1, 8 * Hk, Hk, d, 64, Tk, torch.bfloat16, seed=50)
    buf = torch.empty(2 ** 28, dtype=torch.float32, device="cuda")
    copy_ms = do_bench(lambda: buf.clone())
    copy_rate = 2 * buf.numel() * 4 / copy_ms  # bytes per ms, read + write
    need = decode_bytes(DecodeShape(B=B, Tq=1, Hq=8 * Hk, Hk=Hk, d=d, L=64, Tk=Tk), 2)
    for S in (None, 1):
        ms = do_bench(lambda: moda_decode(**kw, num_splits=S))
        print(f"B={B} d={d} splits={'auto' if S is None else S}: {ms * 1e3:.1f} us, "
              f"{need / ms / copy_rate:.1%} of the copy rate ({copy_rate / 1e9:.2f} TB/s)")
    assert math.isfinite(ms)
