"""Launches of Triton kernels that skip Triton's per-launch binding once an argument set is known
(issue 21's launch tax).

Owns `CachedLaunch`: `CachedLaunch(kernel)[grid](*args, **kwargs)` launches a `@triton.jit`
function as `kernel[grid](...)` does. The first launch of an argument set goes through Triton
(compiling if needed) and keeps the compiled kernel it returns; later launches whose arguments
give the same key run that compiled kernel directly. What they skip is Triton's binding: a
specialisation call per argument, a cache-key computation and a dictionary look-up, about
35-50 us of a launch's host time on the H100 machines (`tools/host_probe.py`,
results/h100/host-s15: three launches of ~790 us a MoDA fwd+bwd at T=1024).

The key is at least as fine as Triton's specialisation, so a cached kernel is only reused where
Triton would pick the same one: per tensor its dtype, device and whether its address is a
16-byte multiple (what Triton specialises pointers on); every int, bool, str and None exactly
(Triton specialises ints on == 1 and divisibility by 16, and keys constexprs by value); floats by
type only (Triton passes them unspecialised); launch options (num_warps, num_stages, maxnreg) by
value. Anything else (another argument type, the interpreter, a Triton whose launch returns no
compiled kernel or whose compiled kernel cannot be indexed by a grid) takes Triton's own path
every time. At most `MAX_KEYS` argument sets are kept per kernel (then the oldest is dropped).
MODA_BENCH_NO_LAUNCH_CACHE=1 in the environment turns the cache off.
"""
from __future__ import annotations

import inspect
import os
from collections import OrderedDict

import torch

MAX_KEYS = 64
# MODA_BENCH_NO_LAUNCH_CACHE=1 (read at import): every launch takes Triton's own path (A/B timing, debugging)
DISABLED = os.environ.get("MODA_BENCH_NO_LAUNCH_CACHE", "0") == "1"


class Uncacheable(Exception):
    """An argument this module cannot key: the launch takes Triton's own path."""


def arg_key(x):
    """The part of a launch's key that one argument contributes (see the module docstring)."""
    if isinstance(x, torch.Tensor):
        return ("t", x.dtype, x.device.type, x.device.index, x.data_ptr() % 16 == 0)
    if x is None or isinstance(x, (bool, int, str)):
        return (type(x).__name__, x)
    if isinstance(x, float):
        return ("f",)
    raise Uncacheable(type(x).__name__)


def _grid3(grid) -> tuple:
    g = tuple(int(n) for n in grid)
    if not 1 <= len(g) <= 3:
        raise ValueError(f"a launch grid has 1 to 3 dimensions, got {grid!r}")
    return g + (1,) * (3 - len(g))


class CachedLaunch:
    """A `@triton.jit` function whose repeated launches skip Triton's binding (module docstring)."""

    def __init__(self, kernel):
        self.kernel = kernel
        fn = getattr(kernel, "fn", None)
        self.params = list(inspect.signature(fn).parameters.values()) if fn is not None else None
        self.compiled: OrderedDict = OrderedDict()
        self.usable = self.params is not None  # False once Triton's launch returned nothing usable
        self.hits = 0

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def full_args(self, args, kwargs) -> list:
        """Every kernel parameter's value in signature order (constexprs and defaults included), as a
        compiled kernel's launcher takes them."""
        out = list(args)
        for p in self.params[len(args):]:
            if p.name in kwargs:
                out.append(kwargs[p.name])
            elif p.default is not inspect.Parameter.empty:
                out.append(p.default)
            else:
                raise TypeError(f"{getattr(self.kernel, '__name__', 'kernel')}: missing argument {p.name!r}")
        return out

    def launch(self, grid, args, kwargs):
        if DISABLED or not self.usable or os.environ.get("TRITON_INTERPRET", "0") == "1":
            return self.kernel[grid](*args, **kwargs)
        try:
            # keyword order is the call site's: the same site always makes the same key
            key = (tuple(arg_key(a) for a in args), tuple((k, arg_key(v)) for k, v in kwargs.items()))
        except Uncacheable:
            return self.kernel[grid](*args, **kwargs)
        compiled = self.compiled.get(key)
        if compiled is not None:
            self.hits += 1
            compiled[_grid3(grid)](*self.full_args(args, kwargs))  # launch options are in the compiled kernel
            return compiled
        compiled = self.kernel[grid](*args, **kwargs)
        if compiled is None or not hasattr(compiled, "__getitem__"):
            self.usable = False  # this Triton's launch does not hand back an indexable compiled kernel
            return compiled
        self.compiled[key] = compiled
        if len(self.compiled) > MAX_KEYS:
            self.compiled.popitem(last=False)
        return compiled
