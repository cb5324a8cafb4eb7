"""Autotuning: pruning rules, the search, the JSON tuning cache and the explicit switch that
makes `resolve_config` consult it (CPU).

The cache tests use temporary files only; no config source is left installed after a test.
"""
from __future__ import annotations

import json
import os
import sys
import time
import warnings

import pytest
import torch
from helpers import H100_SMEM, fake_tuning_device

from moda_bench import tuning as tu
from moda_bench.kernels.moda import config as config_mod
from moda_bench.kernels.moda.config import MoDAConfig, default_config, group_pad, resolve_config
from moda_bench.kernels.moda.triton import bwd_tma_rules as rules
from moda_bench.kernels.moda.validate import MoDAShape
from moda_bench.tuning import cache as cache_mod


def shape(T=1024, G=8, L=64, d=64, B=1, Hk=2) -> MoDAShape:
    return MoDAShape(B=B, T=T, Hq=G * Hk, Hk=Hk, d=d, L=L)


pytestmark = pytest.mark.usefixtures("isolated_tuning")  # conftest: no user cache, no shipped configs


# ----------------------------------------------------------------------------- pruning

@pytest.mark.parametrize("G", [1, 3, 8, 16, 64])
def test_row_blocks_are_multiples_of_group_pad(G):
    sh = shape(G=G)
    gp = group_pad(G)
    base = default_config(sh)
    for kernel, field in (("fwd", "block_m"), ("bwd_q", "bwd_q_block_m")):
        space = tu.search_space(sh, kernel, base)
        assert {getattr(c, field) for c in space} == {m for m in (32, 64, 128) if m % gp == 0 and m >= gp}
    if gp > 32:  # a chunk smaller than one position's rows is invalid
        why = tu.prune_reason(base.replace(block_m=32), sh, "fwd", smem_limit=10**9)
        assert why is not None and why.startswith("invalid") and "block_m=32" in why
    else:
        assert tu.prune_reason(base.replace(block_m=32, depth_sub=0), sh, "fwd", smem_limit=10**9) is None


def test_dense_depth_sub_candidates_stay_valid_for_the_dq_pass():
    sh = shape(G=8, L=64)
    space = tu.search_space(sh, "fwd", default_config(sh))
    dense = [c for c in space if c.depth_sub == c.block_m // group_pad(8)]
    assert dense, "the paper's dense group-aware tile must be in the space"
    assert all(c.bwd_q_block_m >= c.block_m for c in dense)
    assert all(tu.config_problems(c, 8) == [] for c in dense)
    # the same dense depth_sub with a smaller dq block is invalid (positions not divisible)
    bad = dense[0].replace(block_m=128, depth_sub=16, bwd_q_block_m=64)
    assert tu.config_problems(bad, 8)


def test_shared_memory_estimate_and_limit():
    sh = shape(d=128, L=64, G=8)
    cfg = MoDAConfig(block_m=64, block_n=128, num_stages=4, depth_sub=8, block_l=16, num_warps=8,
                     bwd_q_block_m=64)
    # fwd: q (64x128) + 3 buffers x max(k+v 2*128*128, depth 2*NB(=1)*16*128) bf16
    assert tu.smem_bytes(cfg, sh, "fwd", elem=2) == 2 * (64 * 128 + 3 * 2 * 128 * 128)
    a100_smem = 166912
    why = tu.prune_reason(cfg, sh, "fwd", smem_limit=a100_smem)
    assert why is not None and why.startswith("shared memory")
    assert tu.prune_reason(cfg, sh, "fwd", smem_limit=H100_SMEM) is None
    assert tu.prune_reason(cfg.replace(num_stages=2), sh, "fwd", smem_limit=a100_smem) is None
    # fp32 inputs double the footprint
    assert tu.smem_bytes(cfg, sh, "fwd", elem=4) == 2 * tu.smem_bytes(cfg, sh, "fwd", elem=2)


def test_register_estimate_prunes_big_tiles_on_few_warps():
    sh = shape(d=128, L=0)
    cfg = MoDAConfig(block_m=128, block_n=128, num_warps=4, num_stages=1)
    assert tu.fp32_regs_per_thread(cfg, sh, "fwd") == (128 * 128 + 128 * 128) / 128
    why = tu.prune_reason(cfg, sh, "fwd", smem_limit=10**9)
    assert why is not None and why.startswith("registers")
    assert tu.prune_reason(cfg.replace(num_warps=8), sh, "fwd", smem_limit=10**9) is None
    kv = MoDAConfig(bwd_kv_block_m=128, bwd_kv_block_n=128, bwd_kv_warps=4)
    assert tu.prune_reason(kv, sh, "bwd_kv", smem_limit=10**9).startswith("registers")


def test_dq_pass_estimates_use_its_own_depth_columns():
    """The dq pass's depth steps are bwd_block_l columns, not the forward's block_l."""
    sh = shape(d=64, L=64, G=32)
    cfg = MoDAConfig(bwd_q_block_m=64, bwd_q_block_n=32, bwd_q_warps=4, bwd_q_stages=3, block_l=16, bwd_block_l=64)
    assert tu.fp32_regs_per_thread(cfg, sh, "bwd_q") == (64 * 64 + 2 * 64 * 64) / 128
    assert tu.fp32_regs_per_thread(cfg.replace(block_l=128), sh, "bwd_q") == tu.fp32_regs_per_thread(cfg, sh, "bwd_q")
    nb = 2  # depth sub-tiles of a 64-row block at G=32: 2 positions, one a sub-tile
    assert tu.smem_bytes(cfg, sh, "bwd_q") == 2 * (2 * 64 * 64 + 2 * max(2 * 32 * 64, 2 * nb * 64 * 64))
    assert tu.smem_bytes(cfg.replace(block_l=128), sh, "bwd_q") == tu.smem_bytes(cfg, sh, "bwd_q")


def test_tiles_larger_than_the_problem_are_pruned():
    base = default_config(shape(T=40, L=10))
    sh = shape(T=40, L=10)
    assert tu.prune_reason(base.replace(block_n=128), sh, "fwd").startswith("oversized")  # next_pow2(40) = 64
    assert tu.prune_reason(base.replace(block_n=64, block_l=16), sh, "fwd") is None
    assert tu.prune_reason(base.replace(block_l=32), sh, "fwd").startswith("oversized")  # next_pow2(10) = 16
    tiny = shape(T=5, L=3, G=1)
    cands, _ = tu.candidate_configs(tiny, "fwd", default_config(tiny), budget=1000, smem_limit=H100_SMEM)
    assert {c.block_n for c in cands[1:]} == {32} and {c.block_l for c in cands[1:]} == {16}  # smallest kept
    assert {c.block_m for c in cands[1:]} == {32}  # 5 positions x GP 1 rows -> smallest row block


@pytest.mark.parametrize("T,G,L,d", [(1024, 8, 64, 64), (4096, 1, 64, 128), (300, 32, 7, 64), (2048, 4, 0, 64)])
def test_every_candidate_is_accepted_by_the_kernel(T, G, L, d):
    from moda_bench.kernels.moda import check_config
    sh = shape(T=T, G=G, L=L, d=d)
    base = default_config(sh)
    for kernel in tu.KERNELS:
        cands, stats = tu.candidate_configs(sh, kernel, base, budget=10**6, smem_limit=H100_SMEM)
        assert cands[0] == base and len(set(cands)) == len(cands)
        assert stats["space"] >= len(cands) - 1
        for c in cands:
            check_config(c, G)
            if c != base:
                assert tu.prune_reason(c, sh, kernel, smem_limit=H100_SMEM) is None
            # only this kernel's fields move (fwd's dense depth_sub may raise the dq block)
            other = {f for k, fs in tu.KERNEL_FIELDS.items() if k != kernel and k in tu.KERNELS
                     for f in fs} - {"bwd_q_block_m"}
            assert all(getattr(c, f) == getattr(base, f) for f in other)


def test_budget_limits_timed_candidates_and_sampling_is_reproducible():
    sh = shape(T=16384, G=8, L=64)
    base = default_config(sh)
    a, stats = tu.candidate_configs(sh, "fwd", base, budget=12, seed=3)
    b, _ = tu.candidate_configs(sh, "fwd", base, budget=12, seed=3)
    assert a == b and a[0] == base and len(a) == 6 and stats["survivors"] > 12
    calls = []
    tu.tune_kernel(sh, "fwd", base, lambda c: calls.append(c) or 1.0 + c.block_n / 1000, budget=12)
    assert 6 < len(calls) <= 12 and len(set(calls)) == len(calls)
    # later rounds only try one-field neighbours of a config tried before them
    fields_ = tu.KERNEL_FIELDS["fwd"]
    for i, c in enumerate(calls[6:], start=6):
        assert any(sum(getattr(c, f) != getattr(e, f) for f in fields_) == 1 for e in calls[:i])


def test_depth_groups_cover_every_placement_and_keep_unused_fields():
    from moda_bench.kernels.moda.config import BWD_DEPTH_MODES, FWD_DEPTH_MODES
    sh = shape(T=4096, G=2, L=64)
    base = default_config(sh)
    for kernel, unused in (("fwd_depth", tu.UNUSED_BY_PLACEMENT["fwd_depth"]),
                           ("bwd_depth", tu.UNUSED_BY_PLACEMENT["bwd_depth"])):
        modes = FWD_DEPTH_MODES if kernel == "fwd_depth" else BWD_DEPTH_MODES  # both add "tma" and "persist"
        assert "tma" in modes and "persist" in modes
        place = tu.KERNEL_FIELDS[kernel][0]
        space = tu.search_space(sh, kernel, base)
        # every placement moda_attention can run; "persist" is moda-overlap's (it refuses it)
        modes = tuple(m for m in modes if m != "persist")
        assert {getattr(c, place) for c in space} == set(modes)
        for c in space:
            for f in unused.get(getattr(c, place), ()):
                assert getattr(c, f) == getattr(base, f), (kernel, getattr(c, place), f)
        # split/stream vary the depth-only launch's rows and warps
        split = [c for c in space if getattr(c, place) == "split"]
        assert {getattr(c, tu.KERNEL_FIELDS[kernel][2]) for c in split} == set(tu.DEPTH_WARPS)
        # first round: the base, then one candidate per other placement with the base's other fields
        cands, _ = tu.candidate_configs(sh, kernel, base, budget=8)
        n_lead = len(tu.neighbours(base, cands[1:], kernel, only=place))
        assert n_lead >= len(modes) - 1
        assert cands[0] == base and {getattr(c, place) for c in cands[:1 + n_lead]} == set(modes)
        for c in cands[1:1 + n_lead]:  # only the placement and fields one of the two ignores differ
            ignored = set(unused.get(getattr(c, place), ())) | set(unused.get(getattr(base, place), ()))
            assert all(getattr(c, f) == getattr(base, f) for f in tu.KERNEL_FIELDS[kernel][1:] if f not in ignored)


def test_depth_groups_are_empty_and_skipped_without_depth():
    sh = shape(L=0)
    for kernel in tu.DEPTH_GROUPS:
        assert tu.search_space(sh, kernel, default_config(sh)) == []
    timer = DepthFakeTimer()
    res = tu.tune_shape(sh, "bfloat16", timer, budget=4, smem_limit=H100_SMEM)
    assert set(res.kernels) == set(tu.TILE_KERNELS)


def test_depth_group_pruning_rejects_oversized_and_register_hungry_launches():
    sh = shape(T=3, G=1, L=5)  # 3 rows, 5 depth entries
    base = default_config(sh)
    why = tu.prune_reason(base.replace(bwd_depth_block_m=128), sh, "bwd_depth", smem_limit=H100_SMEM)
    assert why is not None and why.startswith("oversized") and "bwd_depth_block_m=128" in why
    why = tu.prune_reason(base.replace(bwd_depth_block_m=32, bwd_block_l=64), sh, "bwd_depth", smem_limit=H100_SMEM)
    assert why is not None and why.startswith("oversized") and "bwd_block_l=64" in why
    big = shape(T=4096, G=8, L=64, d=128)
    why = tu.prune_reason(default_config(big).replace(depth_block_m=128, depth_warps=2), big, "fwd_depth",
                          smem_limit=H100_SMEM)
    assert why is not None and why.startswith("registers")
    # the same tile is fine where the placement does not use the depth-only launch
    assert tu.prune_reason(default_config(big).replace(fwd_depth="fused", depth_block_m=128, depth_warps=2), big,
                           "fwd_depth", smem_limit=H100_SMEM) is None
    assert tu.prune_reason(base.replace(depth_warps=3), sh, "fwd_depth").startswith("invalid")


# ----------------------------------------------------------------------------- search

def test_search_skips_failing_candidates_and_picks_the_fastest():
    base = MoDAConfig()
    cands = [base, base.replace(block_n=32), base.replace(block_n=128), base.replace(num_warps=8)]
    cost = {32: 0.7, 128: RuntimeError("out of resource: shared memory")}

    def time_fn(c):
        v = cost.get(c.block_n, 2.0 if c.num_warps == 8 else 1.0)
        if isinstance(v, Exception):
            raise v
        return v

    seen = []
    ks = tu.search("fwd", cands, time_fn, on_done=lambda c, ms, note: seen.append((ms, note)))
    assert ks.best == cands[1] and ks.best_ms == 0.7 and ks.base_ms == 1.0
    assert ks.tried == 3 and len(ks.skipped) == 1 and "out of resource" in ks.skipped[0][1]
    assert [ms for ms, _ in seen] == [1.0, 0.7, None, 2.0]
    with pytest.raises(RuntimeError, match="base configuration fails"):
        tu.search("fwd", cands[2:], time_fn)


def test_search_keeps_the_runner_up_as_evidence_for_a_kept_base():
    base = MoDAConfig()
    cands = [base, base.replace(block_n=32), base.replace(num_warps=8), base.replace(block_n=128)]
    cost = {32: 1.03, 128: 1.10}
    ks = tu.search("fwd", cands, lambda c: 1.2 if c.num_warps == 8 else cost.get(c.block_n, 1.0))
    assert ks.best == base and ks.best_ms == ks.base_ms == 1.0 and ks.base == base
    assert ks.runner_up == cands[1] and ks.runner_up_ms == pytest.approx(1.03)
    assert ks.runner_up_fields() == {"block_n": 32}
    s = ks.summary()
    assert s["runner_up_ratio"] == pytest.approx(1.03) and s["runner_up_fields"] == {"block_n": 32}
    assert ks.closest() == "fwd: block_n=32 1.030x"
    alone = tu.search("fwd", [base], lambda c: 1.0)
    assert alone.runner_up is None and "runner_up_ms" not in alone.summary() and alone.closest() == ""


class SlowerTimer(tu.Timer):
    """Every config but the default is 2% slower on every pass: nothing beats the default."""

    def time(self, cfg, pass_, final=False):
        return 1.0 if cfg == default_config(shape()) else 1.02


def test_tune_shape_names_the_closest_candidates_when_the_default_stays():
    res = tu.tune_shape(shape(), torch.bfloat16, SlowerTimer(), kernels=("fwd", "bwd_q"), budget=3,
                        smem_limit=H100_SMEM)
    assert res.decision == "default" and res.config == default_config(shape())
    assert res.candidate is not None and res.ratio == pytest.approx(1.02) and res.compare_rounds >= 10
    note = next(n for n in res.notes if n.startswith("the search found nothing faster"))
    assert "closest candidates" in note and "fwd: " in note and "bwd_q: " in note and "1.020x" in note
    assert all(res.kernels[k].summary()["runner_up_ratio"] == pytest.approx(1.02) for k in ("fwd", "bwd_q"))


class FakeTimer(tu.Timer):
    """Deterministic cost model: fwd prefers block_m=128/block_n=32, bwd prefers 8 warps."""

    def __init__(self, final_penalty=0.0):
        self.calls = []
        self.final_penalty = final_penalty

    def time(self, cfg, pass_, final=False):
        self.calls.append((pass_, final))
        fwd = 1.0 + (128 - cfg.block_m) / 100 + (cfg.block_n - 32) / 200
        bwd = 2.0 + (8 - cfg.bwd_q_warps) / 10 + (8 - cfg.bwd_kv_warps) / 10
        if pass_ == "fwd":
            return fwd
        if pass_ == "bwd":
            return bwd
        return fwd + bwd + (self.final_penalty if cfg != default_config(shape()) else 0.0)


def test_tune_shape_finds_the_cost_model_optimum():
    sh = shape()
    timer = FakeTimer()
    res = tu.tune_shape(sh, torch.bfloat16, timer, budget=200, smem_limit=H100_SMEM)
    assert res.config.block_m == 128 and res.config.block_n == 32
    assert res.config.bwd_q_warps == 8 and res.config.bwd_kv_warps == 8
    assert res.tuned_ms < res.default_ms and res.speedup > 1 and res.dtype == "bfloat16"
    assert set(res.kernels) == set(tu.KERNELS) and res.wall_s >= 0
    assert {p for p, final in timer.calls if not final} == {"fwd", "bwd"}
    # the final comparison: candidate and default in interleaved rounds, fwd+bwd only
    finals = [p for p, final in timer.calls if final]
    assert set(finals) == {"fwdbwd"} and len(finals) == 2 * res.compare_rounds >= 20
    assert res.decision == "tuned" and res.candidate == res.config and res.candidate_ms == res.tuned_ms
    assert res.ratio_hi == pytest.approx(res.ratio) and res.ratio < 1 - tu.DEFAULT_MIN_GAIN  # no noise: CI of width 0


class DepthFakeTimer(tu.Timer):
    """Cost model of the depth part: fwd prefers 'stream' launched after the sequence kernel
    with 2 warps and 32-row launches, bwd prefers 'overlap' with bwd_block_l=32 and one stage; tile
    fields cost nothing."""

    def time(self, cfg, pass_, final=False):
        fwd = 1.0 + {"stream": 0.0, "split": 0.2, "fused": 0.5, "overlap": 0.4}[cfg.fwd_depth]
        if cfg.fwd_depth in ("split", "stream"):
            fwd += (cfg.depth_warps - 2) / 50 + (cfg.depth_block_m - 32) / 1000
        if cfg.fwd_depth == "stream" and cfg.depth_after:
            fwd -= 0.05
        bwd = 2.0 + {"overlap": 0.0, "stream": 0.1, "split": 0.3, "fused": 0.6}[cfg.bwd_depth]
        bwd += (cfg.bwd_block_l - 32) ** 2 / 1e4 + (cfg.bwd_depth_stages - 1) / 20
        return {"fwd": fwd, "bwd": bwd}.get(pass_, fwd + bwd)


def test_tune_shape_finds_the_depth_placement_optimum():
    sh = shape(T=4096, G=8, L=64)
    res = tu.tune_shape(sh, "bfloat16", DepthFakeTimer(), kernels=tu.DEPTH_GROUPS, budget=24,
                        smem_limit=H100_SMEM)
    c = res.config
    assert (c.fwd_depth, c.depth_warps, c.depth_block_m, c.depth_after) == ("stream", 2, 32, True)
    assert (c.bwd_depth, c.bwd_block_l, c.bwd_depth_stages) == ("overlap", 32, 1)
    assert res.speedup > 1 and set(res.kernels) == set(tu.DEPTH_GROUPS)
    assert all(ks.tried <= 24 for ks in res.kernels.values())
    # tile fields untouched by the depth groups
    base = default_config(sh)
    assert all(getattr(c, f) == getattr(base, f) for k in tu.TILE_KERNELS for f in tu.KERNEL_FIELDS[k])


def test_tune_shape_keeps_default_when_tuned_is_not_faster_end_to_end():
    res = tu.tune_shape(shape(), "bfloat16", FakeTimer(final_penalty=10.0), budget=20, smem_limit=H100_SMEM)
    assert res.config == default_config(shape()) and res.tuned_ms == res.default_ms
    assert any("keeping default" in n for n in res.notes)
    assert res.decision == "default" and res.candidate is not None and res.candidate_ms > res.default_ms


def _buggy_attention(q, k, v, k_depth=None, v_depth=None, *, config=None, **kw):
    """Exact reference in fp32, wrong (scaled output) whenever block_n == 32."""
    from moda_bench.kernels.moda.reference import moda_reference
    out = moda_reference(q, k, v, k_depth, v_depth, compute_dtype=torch.float32, **kw)
    return out * 1.5 if config is not None and config.block_n == 32 else out


def _wall_measure(fn, grad_to_none=None, warmup_ms=0, rep_ms=0):
    t0 = time.perf_counter()
    fn()
    return {"median_ms": (time.perf_counter() - t0) * 1e3 + 1e-6}


def _wall_sampler(fn, timer="eager", grad_to_none=None):
    """A CPU stand-in for timing.make_sampler: one call of fn per sample, wall-clock ms."""
    def sample():
        for t in grad_to_none or []:
            t.grad = None
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3 + 1e-6
    return sample


def test_timer_skips_configs_with_wrong_results():
    sh = shape(T=12, G=2, L=3, d=16, Hk=1)
    timer = tu.CudaTimer(sh, "float32", device="cpu", attention=_buggy_attention, measure_fn=_wall_measure)
    base = default_config(sh)
    assert timer.time(base, "fwd") > 0
    with pytest.raises(ValueError, match="wrong result"):
        timer.time(base.replace(block_n=32), "fwd")
    ks = tu.search("fwd", [base, base.replace(block_n=32), base.replace(num_warps=8)],
                   lambda c: timer.time(c, "fwd"))
    assert len(ks.skipped) == 1 and ks.skipped[0][0]["block_n"] == 32 and ks.tried == 2
    assert timer.time(base, "bwd") > 0  # gradients of the default config are the reference


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                    reason="needs TRITON_INTERPRET=1 or CUDA")
def test_tune_shape_with_the_real_kernel_tiny():
    """End to end through moda_attention (interpreter on CPU): every tried config must run and
    match the default config's output and gradients."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    sh = shape(T=20, G=2, L=3, d=16, Hk=1)
    from moda_bench.timing import RoundRule
    timer = tu.CudaTimer(sh, "float32", device=dev, measure_fn=_wall_measure, final_warmup_ms=0,
                         sampler_fn=None if dev == "cuda" else _wall_sampler,
                         rule=RoundRule(min_rounds=2, max_rounds=2, min_samples=2))
    res = tu.tune_shape(sh, "float32", timer, budget=2, smem_limit=H100_SMEM)
    for ks in res.kernels.values():
        assert ks.skipped == [] and ks.tried == 2
    assert tu.config_problems(res.config, 2) == []
    assert res.decision in tu.DECISIONS and (res.candidate is None) == (res.compare_rounds == 0)


# ----------------------------------------------------------------------------- cache keys and paths

def test_cache_key_buckets_T_to_powers_of_two():
    k = lambda T: tu.cache_key(shape(T=T), torch.bfloat16, gpu="H100", triton_version="3.6.0")  # noqa: E731
    assert tu.t_bucket(1000) == 1024 and tu.t_bucket(1024) == 1024 and tu.t_bucket(1025) == 2048
    assert tu.t_bucket(1) == 1 and tu.t_bucket(3) == 4
    assert k(600) == k(1000) == k(1024) != k(1025) == k(2048)
    assert k(4096) != k(8192)
    assert "T<=1024" in k(700)


def test_cache_key_separates_dtype_gpu_triton_and_model_dims_but_not_batch_or_heads():
    base = dict(gpu="NVIDIA H100 80GB HBM3", triton_version="3.6.0")
    k0 = tu.cache_key(shape(), torch.bfloat16, **base)
    assert k0 == tu.cache_key(shape(), "bfloat16", **base)
    assert k0 != tu.cache_key(shape(), torch.float16, **base)
    assert k0 != tu.cache_key(shape(), torch.bfloat16, gpu="NVIDIA H200", triton_version="3.6.0")
    assert k0 != tu.cache_key(shape(), torch.bfloat16, gpu=base["gpu"], triton_version="3.4.0")
    for other in (shape(d=128), shape(G=4), shape(L=32)):
        assert k0 != tu.cache_key(other, torch.bfloat16, **base)
    assert k0 == tu.cache_key(shape(B=4, Hk=8), torch.bfloat16, **base)
    assert tu.cache_key(shape(), "bfloat16").startswith(tu.current_gpu_name() + "|triton ")


def test_cache_path_env_override_and_platform_defaults(monkeypatch, tmp_path):
    monkeypatch.setenv(tu.ENV_CACHE, str(tmp_path / "x.json"))
    assert tu.resolve_cache_path() == tmp_path / "x.json"
    assert tu.resolve_cache_path(tmp_path / "explicit.json") == tmp_path / "explicit.json"
    monkeypatch.delenv(tu.ENV_CACHE)
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert tu.resolve_cache_path() == tmp_path / "xdg" / "moda-bench" / "tuning.json"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert tu.default_cache_path() == tmp_path / "home" / ".cache" / "moda-bench" / "tuning.json"
    monkeypatch.setattr(sys, "platform", "darwin")
    assert tu.default_cache_path() == tmp_path / "home" / "Library" / "Caches" / "moda-bench" / "tuning.json"
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setenv("LOCALAPPDATA", str(tmp_path / "local"))
    assert tu.default_cache_path() == tmp_path / "local" / "moda-bench" / "tuning.json"


# ----------------------------------------------------------------------------- cache files

def _result(sh, cfg, default_ms=2.0, tuned_ms=1.5):
    return tu.TuneResult(sh, "bfloat16", cfg, default_ms, tuned_ms, wall_s=12.5, candidate=cfg, candidate_ms=tuned_ms,
                         ratio=tuned_ms / default_ms, ratio_lo=0.7, ratio_hi=0.8)


def test_save_and_load_round_trip(tmp_path):
    path = tmp_path / "sub" / "tuning.json"
    sh = shape(T=3000)
    cfg = default_config(sh).replace(block_m=128, num_warps=8, bwd_q_block_m=128)
    key, written = tu.save_result(_result(sh, cfg), path)
    assert written == path and path.exists()
    data = json.loads(path.read_text())
    assert data["schema_version"] == tu.SCHEMA_VERSION
    entry = data["entries"][key]
    assert entry["config"] == cfg.to_dict() and entry["T_bucket"] == 4096
    assert entry["default_ms"] == 2.0 and entry["tuned_ms"] == 1.5 and entry["speedup"] == pytest.approx(4 / 3)
    assert entry["tuning_wall_s"] == 12.5 and entry["date"][:2] == "20" and entry["dtype"] == "bfloat16"
    assert entry["decision"] == "tuned" and entry["candidate_config"] == cfg.to_dict()
    assert (entry["ratio"], entry["ratio_lo"], entry["ratio_hi"], entry["min_gain"]) == (0.75, 0.7, 0.8, 0.02)
    cache = tu.load(path)
    assert cache.path == path and cache(shape(T=2049), torch.bfloat16) == cfg  # same bucket
    assert cache(shape(T=2048), torch.bfloat16) is None  # other bucket
    assert cache(sh, torch.float16) is None
    # a second entry is merged, not overwriting the first
    key2, _ = tu.save_result(_result(shape(T=100), default_config(shape(T=100))), path)
    assert set(tu.load(path).entries()) == {key, key2}


@pytest.mark.parametrize("content", ["{not json", "[]", '{"schema_version": 1}', ""])
def test_corrupt_file_warns_and_is_ignored(tmp_path, content):
    path = tmp_path / "tuning.json"
    path.write_text(content)
    with pytest.warns(UserWarning, match="tuning cache"):
        assert tu.load(path)(shape(), torch.bfloat16) is None
    with pytest.warns(UserWarning):
        key, _ = tu.save_result(_result(shape(), default_config(shape())), path)  # replaced, not a crash
    assert key in json.loads(path.read_text())["entries"]


def test_other_schema_version_is_ignored(tmp_path):
    path = tmp_path / "tuning.json"
    sh = shape()
    key, _ = tu.save_result(_result(sh, default_config(sh).replace(num_warps=8)), path)
    data = json.loads(path.read_text())
    data["schema_version"] = tu.SCHEMA_VERSION + 1
    path.write_text(json.dumps(data))
    with pytest.warns(UserWarning, match="schema version"):
        assert tu.load(path)(sh, "bfloat16") is None


@pytest.mark.parametrize("bad_config", [{"block_m": 48}, {"block_m": 32, "bogus_field": 1}, {"num_warps": "4"}])
def test_stale_entry_warns_and_falls_back(tmp_path, bad_config):
    path = tmp_path / "tuning.json"
    sh = shape(G=8)
    key = tu.cache_key(sh, "bfloat16")
    cfg = dict(default_config(sh).to_dict(), **bad_config)
    tu.atomic_write_json(path, {"schema_version": tu.SCHEMA_VERSION, "entries": {key: {"config": cfg}}})
    tu.use(path)
    with pytest.warns(UserWarning, match="stale"):
        assert resolve_config(sh, torch.bfloat16) == default_config(sh)


def test_env_var_selects_the_cache_in_use(monkeypatch, tmp_path):
    sh = shape()
    cfg_a = default_config(sh).replace(num_warps=8)
    cfg_b = default_config(sh).replace(block_n=32)
    tu.save_result(_result(sh, cfg_a), tmp_path / "a.json")
    tu.save_result(_result(sh, cfg_b), tmp_path / "b.json")
    monkeypatch.setenv(tu.ENV_CACHE, str(tmp_path / "a.json"))
    cache = tu.use()  # path from the environment, looked at every cache.recheck_s seconds
    assert resolve_config(sh, torch.bfloat16) == cfg_a
    monkeypatch.setenv(tu.ENV_CACHE, str(tmp_path / "b.json"))
    cache.refresh()  # or wait recheck_s
    assert resolve_config(sh, torch.bfloat16) == cfg_b
    monkeypatch.setenv(tu.ENV_CACHE, str(tmp_path / "a.json"))
    cache.recheck_s = 0.0  # look at every call
    assert resolve_config(sh, torch.bfloat16) == cfg_a


def test_cache_in_use_changes_resolve_config_and_reloads_on_change(tmp_path, monkeypatch):
    path = tmp_path / "tuning.json"
    sh = shape(T=5000, G=4, L=16)
    assert resolve_config(sh, torch.bfloat16) == default_config(sh)
    tuned = default_config(sh).replace(block_n=128, num_stages=3, bwd_kv_warps=8)
    tu.save_result(_result(sh, tuned), path)
    cache = tu.use(path)
    assert config_mod.config_source() is cache
    assert resolve_config(sh, torch.bfloat16) == tuned
    assert resolve_config(sh, torch.float16) == default_config(sh)  # not tuned for fp16
    explicit = MoDAConfig(block_m=32)
    assert resolve_config(sh, torch.bfloat16, explicit) is explicit  # explicit still wins
    # memoised: repeated calls do not re-read the file
    parses = []
    orig = cache_mod._parse
    monkeypatch.setattr(cache_mod, "_parse", lambda *a: parses.append(1) or orig(*a))
    for _ in range(50):
        resolve_config(sh, torch.bfloat16)
    assert parses == []
    # a rewrite (new mtime/size) is picked up
    tuned2 = tuned.replace(num_warps=8)
    tu.atomic_write_json(path, {"schema_version": tu.SCHEMA_VERSION,
                                "entries": {tu.cache_key(sh, "bfloat16"): {"config": tuned2.to_dict(), "x": 1}}})
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert resolve_config(sh, torch.bfloat16) == tuned2 and parses == [1]
    tu.stop_using()
    assert resolve_config(sh, torch.bfloat16) == default_config(sh)


def test_missing_file_is_silent(tmp_path):
    tu.use(tmp_path / "nope.json")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_config(shape(), torch.bfloat16) == default_config(shape())


def test_nothing_consults_the_cache_until_use(tmp_path):
    """Importing the kernel (and the tuner) installs no config source: a direct caller gets the
    heuristic default even with a tuned entry at $MODA_BENCH_TUNING_CACHE."""
    import subprocess
    sh = shape()
    path = tmp_path / "c.json"
    tu.save_result(_result(sh, default_config(sh).replace(num_warps=8)), path)
    code = ("import torch, moda_bench, moda_bench.tuning\n"
            "from moda_bench.kernels.moda import resolve_config, default_config, MoDAShape\n"
            "from moda_bench.kernels.moda import config as c\n"
            "from moda_bench.kernels.moda.config import config_source\n"
            f"c.SHIPPED_DIR = c.Path({str(tmp_path / 'no-shipped')!r})  # this GPU's shipped configs aside\n"
            f"sh = MoDAShape(B={sh.B}, T={sh.T}, Hq={sh.Hq}, Hk={sh.Hk}, d={sh.d}, L={sh.L})\n"
            "assert config_source() is None\n"
            "assert resolve_config(sh, torch.bfloat16) == default_config(sh)\n"
            "moda_bench.tuning.use()\n"
            "assert resolve_config(sh, torch.bfloat16).num_warps == 8\n")
    env = dict(os.environ, **{tu.ENV_CACHE: str(path)})
    env.pop(tu.ENV_NO_TUNING, None)
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_using_restores_the_previous_source_and_honours_opt_out(monkeypatch, tmp_path):
    sh = shape()
    tuned = default_config(sh).replace(num_warps=8)
    tu.save_result(_result(sh, tuned), tmp_path / "env-cache.json")  # the fixture's $MODA_BENCH_TUNING_CACHE
    with tu.using(True) as cache:
        assert isinstance(cache, tu.TuningCache) and resolve_config(sh, torch.bfloat16) == tuned
        with tu.using(False) as none:
            assert none is None and resolve_config(sh, torch.bfloat16) == default_config(sh)
        assert config_mod.config_source() is cache
    assert config_mod.config_source() is None
    monkeypatch.setenv(tu.ENV_NO_TUNING, "1")  # the escape hatch: heuristic defaults, also for sweeps
    with tu.using(True) as cache:
        assert cache is None and resolve_config(sh, torch.bfloat16) == default_config(sh)
    assert tu.use() is None and config_mod.config_source() is None
    monkeypatch.setenv(tu.ENV_NO_TUNING, "0")
    assert tu.use(tu.load(tmp_path / "env-cache.json")) is config_mod.config_source()
    assert resolve_config(sh, torch.bfloat16) == tuned


def test_atomic_write_never_leaves_a_half_written_file(tmp_path, monkeypatch):
    path = tmp_path / "tuning.json"
    sh = shape()
    key, _ = tu.save_result(_result(sh, default_config(sh)), path)
    before = path.read_text()

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        tu.save_result(_result(shape(T=99), default_config(shape(T=99))), path)
    assert path.read_text() == before
    monkeypatch.undo()
    with pytest.raises(TypeError):  # not JSON-serialisable: fails while writing the temp file
        tu.atomic_write_json(path, {"schema_version": 1, "entries": {"k": object()}})
    assert path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tuning.json"]  # no temp files left


# ----------------------------------------------------------------------------- command

def test_group_by_key_tunes_each_T_bucket_once():
    from moda_bench.bench.runner import Point
    from moda_bench.bench.tune import group_by_key, point_shape
    pts = [Point(T=t) for t in (1000, 1024, 700, 2048, 1500)]
    groups = group_by_key(pts, lambda p: tu.cache_key(point_shape(p), "bfloat16", gpu="g"))
    assert [p.T for p in groups.values()] == [1024, 2048]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_tune_command_without_cuda_fails_cleanly(tmp_path):
    import typer
    from typer.testing import CliRunner

    from moda_bench.cli.tune import tune_command
    app = typer.Typer()
    app.command()(tune_command)
    res = CliRunner().invoke(app, ["--T", "256", "--cache", str(tmp_path / "c.json")])
    assert res.exit_code != 0 and "CUDA" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(app, ["--kernels", "fwd,nope"])
    assert res.exit_code == 2 and "nope" in res.output


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_tune_command_on_gpu(tmp_path):
    import pandas as pd
    import typer
    from typer.testing import CliRunner

    from moda_bench.cli.tune import tune_command
    app = typer.Typer()
    app.command()(tune_command)
    cache, out = tmp_path / "c.json", tmp_path / "tune.csv"
    res = CliRunner().invoke(app, ["--T", "512", "--G", "8", "--L", "16", "--budget", "3", "--cache", str(cache),
                                   "--out", str(out), "--rep-ms", "10", "--warmup-ms", "5"])
    assert res.exit_code == 0, res.output
    df = pd.read_csv(out)
    assert len(df) == 1 and df["status"][0] == "ok" and df["tuned_ms"][0] <= df["default_ms"][0]
    assert len(tu.load(cache).entries()) == 1


def test_tune_command_flow_with_a_fake_device(tmp_path, monkeypatch):
    """The command's CPU-testable path: plan a T sweep, tune each T bucket once with a fake
    timer, persist winners, write the CSV, then skip cached shapes on a second run."""
    import pandas as pd
    import typer
    from typer.testing import CliRunner

    from moda_bench.bench.tune import TUNE_COLUMNS
    from moda_bench.cli.tune import tune_command
    made = fake_tuning_device(monkeypatch, lambda shape: FakeTimer())
    app = typer.Typer()
    app.command()(tune_command)
    cache, out = tmp_path / "c.json", tmp_path / "tune.csv"
    args = ["--vary", "T", "--values", "1000,1024,2048", "--G", "8", "--L", "64", "--Hk", "2", "--budget", "6",
            "--cache", str(cache), "--out", str(out)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert [s.T for s in made] == [1024, 2048]  # one tuning per T bucket
    assert "tuning wall time" in res.output and "tuned (" in res.output
    df = pd.read_csv(out)
    assert list(df.columns) == TUNE_COLUMNS and len(df) == 2 and set(df["status"]) == {"ok"}
    assert (df["tuned_ms"] < df["default_ms"]).all() and set(df["decision"]) == {"tuned"}
    assert df["ratio"].tolist() == pytest.approx((df["tuned_ms"] / df["default_ms"]).tolist())  # noise-free timer
    assert (df["ratio_hi"] < 1 - df["min_gain"]).all() and (df["candidate_ms"] == df["tuned_ms"]).all()
    entries = tu.load(cache).entries()
    assert len(entries) == 2 and all(k.startswith("Fake GPU|") for k in entries)
    made.clear()
    res = CliRunner().invoke(app, args + ["--out", str(tmp_path / "again.csv")])
    assert res.exit_code == 0 and made == [] and "cached" in res.output
    again = pd.read_csv(tmp_path / "again.csv")
    assert set(again["status"]) == {"cached"} and set(again["decision"]) == {"tuned"}


def test_default_placement_is_fused_for_short_sequences_only():
    from moda_bench.kernels.moda.config import FUSED_DEPTH_MAX_T
    short, long_ = default_config(shape(T=FUSED_DEPTH_MAX_T)), default_config(shape(T=FUSED_DEPTH_MAX_T + 1))
    assert (short.fwd_depth, short.bwd_depth) == ("fused", "fused")
    assert (long_.fwd_depth, long_.bwd_depth) == ("split", "stream")
    # only the placement differs; both are valid kernel configs
    assert short == long_.replace(fwd_depth="fused", bwd_depth="fused")
    assert tu.config_problems(short, 8) == [] and tu.config_problems(long_, 8) == []


def test_tma_backward_tile_groups_try_the_register_cap():
    from moda_bench.tuning import space as space_mod
    """With a "tma" backward base the bwd_q / bwd_kv groups also try maxnreg 0 and 168; with a
    pointer backward they keep the base's value (the pointer kernels do not read it)."""
    sh = shape(T=4096, G=8, L=64)
    tma = default_config(sh).replace(bwd_depth="tma", bwd_block_l=32)
    for kernel, field in (("bwd_q", "bwd_q_maxnreg"), ("bwd_kv", "bwd_kv_maxnreg")):
        assert {getattr(c, field) for c in tu.search_space(sh, kernel, tma)} == set(space_mod.MAXNREG)
        assert {getattr(c, field) for c in tu.search_space(sh, kernel, default_config(sh))} == {0}
    assert tu.config_problems(tma.replace(bwd_kv_maxnreg=168), 8) == []
    assert tu.config_problems(tma.replace(bwd_kv_maxnreg=-1), 8)


def test_bwd_kv_space_tries_the_key_major_pass_beside_the_dq_pass():
    """With the "tma" backward as base, bwd_kv's space holds the base's bwd_kv_beside (-1: by
    shape) and both explicit choices, the base's bwd_kv_chunk and none, all valid; the pointer
    passes keep the base's values."""
    sh = shape(G=8, L=64)
    tma = default_config(sh).replace(bwd_depth="tma")
    space = tu.search_space(sh, "bwd_kv", tma)
    assert {c.bwd_kv_beside for c in space} == {-1, 0, 1, 2}
    assert all(not rules.kv_one_fits(*rules.pass_options(c)) for c in space if c.bwd_kv_beside == 2)
    assert {c.bwd_kv_chunk for c in space} == {-1, 0}
    assert all(tu.config_problems(c, 8) == [] for c in space)
    ptr = tu.search_space(sh, "bwd_kv", default_config(sh).replace(bwd_depth="fused"))
    assert {c.bwd_kv_beside for c in ptr} == {-1} and {c.bwd_kv_chunk for c in ptr} == {-1}
    assert tu.config_problems(tma.replace(bwd_kv_beside=3), 8) == [
        "bwd_kv_beside=3 must be -1 (by shape) or in (0, 1, 2)"]
    assert tu.config_problems(tma.replace(bwd_kv_beside=2, bwd_kv_warps=8), 8) == [
        "bwd_kv_beside=2 (both backward passes in one launch) needs: bwd_q_warps=4 != bwd_kv_warps=8"]


def test_bwd_q_space_tries_the_other_dq_pass_at_l0():
    """With the "tma" backward as base, bwd_q's space at L = 0 (G a power of two above 1) holds the
    base's bwd_dq_heads and the other dq pass (by the rule: per head at T=16384, folded at 512),
    all valid; with depth, G = 3 or the pointer passes only the base's."""
    for T, other in ((16384, 0), (512, 1)):
        sh = shape(G=8, L=0, T=T)
        space = tu.search_space(sh, "bwd_q", default_config(sh).replace(bwd_depth="tma"))
        assert {c.bwd_dq_heads for c in space} == {-1, other}
        assert all(tu.config_problems(c, 8) == [] for c in space)
    for sh in (shape(G=8, L=64), shape(G=3, L=0)):
        space = tu.search_space(sh, "bwd_q", default_config(sh).replace(bwd_depth="tma"))
        assert {c.bwd_dq_heads for c in space} == {-1}
    sh = shape(G=8, L=0)
    assert {c.bwd_dq_heads for c in tu.search_space(sh, "bwd_q", default_config(sh).replace(bwd_depth="fused"))} == {-1}
