"""Every @triton.jit function under moda_bench.kernels reads only globals Triton compiles on a GPU:
constexprs, other jit functions, modules and callables. A plain Python number read inside a
kernel passes under TRITON_INTERPRET=1 but fails to compile on the GPU ("Cannot access global
variable ... annotated as constexpr"), so the CPU suite has to catch it."""
from __future__ import annotations

import importlib
import pkgutil
import types

import pytest
import triton
import triton.language as tl

import moda_bench.kernels

SKIP = ("moda_bench.kernels.moda.cute",)   # CuTe DSL modules need cutlass, and are no Triton


def _modules():
    for info in pkgutil.walk_packages(moda_bench.kernels.__path__, "moda_bench.kernels."):
        if info.name.startswith(SKIP):
            continue
        try:
            mod = importlib.import_module(info.name)
        except ImportError:
            continue
        if getattr(mod, "triton", None) is triton:
            yield mod


def _jit_functions(mod):
    for name, obj in vars(mod).items():
        fn = getattr(obj, "fn", None)
        if isinstance(fn, types.FunctionType) and fn.__module__ == mod.__name__:
            yield name, fn


def _bad_globals(fn):
    bad = []
    for name in fn.__code__.co_names:
        if name not in fn.__globals__:
            continue
        value = fn.__globals__[name]
        if isinstance(value, (bool, int, float, str, tuple, list, dict)) and not isinstance(value, tl.constexpr):
            bad.append(f"{name}={value!r}")
    return bad


def test_the_walk_finds_the_kernels():
    found = {f"{m.__name__}.{n}" for m in _modules() for n, _ in _jit_functions(m)}
    assert "moda_bench.kernels.moda.triton.fwd.moda_fwd_kernel" in found, sorted(found)[:20]
    assert len(found) > 20


@pytest.mark.parametrize("mod", list(_modules()), ids=lambda m: m.__name__)
def test_jit_functions_read_only_constexpr_globals(mod):
    problems = [f"{name}: {', '.join(b)}" for name, fn in _jit_functions(mod) if (b := _bad_globals(fn))]
    assert not problems, f"{mod.__name__}: wrap these globals in tl.constexpr(...): " + "; ".join(problems)
