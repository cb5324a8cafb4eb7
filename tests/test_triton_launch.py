"""`ops.triton_launch.CachedLaunch`: repeated launches run the compiled kernel Triton returned for
the same key, with every parameter in signature order; anything it cannot key, the interpreter,
and a Triton that returns nothing usable take Triton's own path. The GPU test checks that the
cached path writes the same bytes as Triton's own launches for MoDA's forward and backward."""
from __future__ import annotations

import pytest
import torch

from moda_bench.ops import triton_launch as tl_mod
from moda_bench.ops.triton_launch import CachedLaunch, arg_key


def _body(X, Y, n, scale, MODE, BLOCK: int = 64, FLAG: bool = False):
    """The parameters of a stand-in kernel (constexprs MODE, BLOCK, FLAG)."""


class FakeCompiled:
    def __init__(self, log):
        self.log = log

    def __getitem__(self, grid):
        return lambda *args: self.log.append(("compiled", grid, args))


class FakeKernel:
    """Records Triton-path launches and returns a compiled stand-in (or `returns`)."""

    def __init__(self, returns="compiled"):
        self.fn, self.log, self.returns = _body, [], returns

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.log.append(("triton", grid, args, kwargs))
            return FakeCompiled(self.log) if self.returns == "compiled" else self.returns
        return run


@pytest.fixture(autouse=True)
def _compiled_mode(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def _x(offset=0):
    return torch.zeros(64, dtype=torch.uint8)[offset:]


def test_second_launch_runs_the_compiled_kernel_with_every_parameter():
    k = FakeKernel()
    launch = CachedLaunch(k)
    x, y = _x(), _x()
    launch[(3, 2)](x, y, 100, 0.5, MODE=1, num_warps=4)
    launch[(5,)](x, y, 100, 0.25, MODE=1, num_warps=4)  # a float is keyed by type only
    assert [e[0] for e in k.log] == ["triton", "compiled"]
    kind, grid, args = k.log[1]
    assert grid == (5, 1, 1)
    assert args[:5] == (x, y, 100, 0.25, 1) and args[5:] == (64, False)  # defaults filled, no launch options
    assert launch.hits == 1


@pytest.mark.parametrize("change", ["int", "alignment", "dtype", "constexpr", "option", "none"])
def test_what_changes_the_key_goes_through_triton(change):
    k = FakeKernel()
    launch = CachedLaunch(k)
    base = dict(args=(_x(), _x(), 100, 0.5), kw=dict(MODE=1, num_warps=4))
    launch[(1,)](*base["args"], **base["kw"])
    args, kw = list(base["args"]), dict(base["kw"])
    if change == "int":
        args[2] = 101
    elif change == "alignment":
        args[0] = _x(offset=1)  # not a 16-byte multiple any more
    elif change == "dtype":
        args[0] = torch.zeros(16, dtype=torch.float32)
    elif change == "constexpr":
        kw["MODE"] = 2
    elif change == "option":
        kw["num_warps"] = 8
    else:
        args[1] = None
    launch[(1,)](*args, **kw)
    assert [e[0] for e in k.log] == ["triton", "triton"] and launch.hits == 0


def test_uncacheable_arguments_interpreter_and_unusable_returns_take_tritons_path(monkeypatch):
    k = FakeKernel()
    launch = CachedLaunch(k)
    for _ in range(2):
        launch[(1,)](_x(), _x(), [1, 2], 0.5, MODE=1)  # a list: no key
    assert [e[0] for e in k.log] == ["triton", "triton"]
    k2 = FakeKernel(returns=None)
    launch2 = CachedLaunch(k2)
    for _ in range(2):
        launch2[(1,)](_x(), _x(), 1, 0.5, MODE=1)
    assert not launch2.usable and [e[0] for e in k2.log] == ["triton", "triton"]
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    k3 = FakeKernel()
    launch3 = CachedLaunch(k3)
    for _ in range(2):
        launch3[(1,)](_x(), _x(), 1, 0.5, MODE=1)
    assert [e[0] for e in k3.log] == ["triton", "triton"] and not launch3.compiled
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setattr(tl_mod, "DISABLED", True)  # MODA_BENCH_NO_LAUNCH_CACHE=1
    k4 = FakeKernel()
    launch4 = CachedLaunch(k4)
    for _ in range(2):
        launch4[(1,)](_x(), _x(), 1, 0.5, MODE=1)
    assert [e[0] for e in k4.log] == ["triton", "triton"]


def test_keys_are_bounded_and_bad_grids_refused(monkeypatch):
    monkeypatch.setattr(tl_mod, "MAX_KEYS", 3)
    k = FakeKernel()
    launch = CachedLaunch(k)
    for n in range(5):
        launch[(1,)](_x(), _x(), n, 0.5, MODE=1)
    assert len(launch.compiled) == 3
    launch[(1,)](_x(), _x(), 0, 0.5, MODE=1)  # the oldest was dropped: Triton again
    assert k.log[-1][0] == "triton"
    launch[(1,)](_x(), _x(), 4, 0.5, MODE=1)
    assert k.log[-1][0] == "compiled"
    with pytest.raises(ValueError, match="1 to 3 dimensions"):
        launch[(1, 1, 1, 1)](_x(), _x(), 4, 0.5, MODE=1)
    launch[(1,)](_x(), _x(), 4, 0.5)  # Triton's path (a real kernel would refuse it there)
    with pytest.raises(TypeError, match="missing argument 'MODE'"):
        launch[(1,)](_x(), _x(), 4, 0.5)


def test_arg_key_distinguishes_what_triton_specialises():
    a = torch.zeros(32, dtype=torch.uint8)
    assert arg_key(a) == arg_key(a.clone()) != arg_key(a[1:])
    assert arg_key(True) != arg_key(1) and arg_key(1) != arg_key(2) and arg_key(None) == ("NoneType", None)
    assert arg_key(0.5) == arg_key(3.0)
    with pytest.raises(tl_mod.Uncacheable):
        arg_key(object())


# ------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("T,G,L", [(1024, 8, 64), (777, 2, 0)])
def test_gpu_cached_launches_write_the_same_bytes(monkeypatch, T, G, L):
    """MoDA fwd+bwd through the cached launches (a second call with the same shapes) against the
    same call through Triton's own launches: identical outputs and gradients."""
    from helpers import random_inputs
    from moda_bench.ops.moda import kernel_bwd_tma, kernel_fwd_tma, moda_attention

    def run():
        ins = random_inputs(1, T, 8 * G, 8, 64, L, torch.bfloat16, seed=T + G + L)
        leaves = [t.requires_grad_(True) for t in ins[:5] if t is not None]
        out = moda_attention(*ins[:5])
        out.backward(ins[5])
        torch.cuda.synchronize()
        return [out] + [t.grad for t in leaves]

    launches = (kernel_fwd_tma._FWD_LAUNCH, kernel_bwd_tma._DQ_LAUNCH, kernel_bwd_tma._KV_LAUNCH)
    run()  # compiles, keys the shapes
    hits = [x.hits for x in launches]
    cached = run()
    assert all(x.usable for x in launches) and all(x.hits > h for x, h in zip(launches, hits))
    for x in launches:
        monkeypatch.setattr(x, "usable", False)
    plain = run()
    for a, b in zip(cached, plain):
        assert torch.equal(a, b)
