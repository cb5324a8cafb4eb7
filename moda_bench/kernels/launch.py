"""Host-side arithmetic and host cost of kernel launches, for the per-call paths of every operator.

Owns plain-Python grid arithmetic (`cdiv`, `next_pow2`) and `CachedLaunch`, a Triton launch
whose per-call specialisation is done once per caller key.

`triton.cdiv` and `triton.next_power_of_2` are also callable inside kernels, and recent Triton
versions route their Python calls through that machinery, a hundred times slower than
`-(-a // b)`; a MoDA fwd+bwd makes about 16 such calls, host time that an eager training step
would pay on every call.

`CachedLaunch`: on every `kernel[grid](*args, **meta)` Triton binds all arguments, specialises
each one (dtype, 16-byte alignment, value 1, divisibility by 16), hashes the result into its
cache key, builds a launch-metadata dict for the profiling hooks and only then calls the C
launcher, tens of microseconds a launch (`experiments/host_probe.py --phases` measures it).
The operators here know what determines the specialisation (their inputs' shapes, dtype and
tile configuration, all pointers 16-byte aligned), so a caller names that as a key: the first
launch of a key goes through Triton and keeps the compiled kernel it returns; later launches of
the key call that kernel's launcher directly with the same arguments, in the order Triton passes
them. A key of None, a Triton without that launcher interface, the interpreter, a profiling
hook installed, or `MODA_BENCH_FAST_LAUNCH=0` in the environment all take Triton's own path.
Users: MoDA's descriptor forward, dq pass and key-major pass (`kernel_fwd_tma`, `kernel_bwd_tma`),
its pointer kernels' forward, q-major, key-major and depth-only launches (`kernel`: keyed by
strides too), its merge and delta kernels (`kernel.merge_partials`, `kernel.launch_delta`),
moda-fa4's merge and the streaming depth kernels of moda-fa4 and moda-overlap (`fa4._merge`,
`kernel_depth`), decode's split and combine kernels (`ops.decode.kernel`) and Depth-Attention's
mix forward and backward (`ops.dattn.mix_kernel`); those without strides among their arguments
are keyed by every integer argument's value and every tensor's dtype.
Host-side tensor descriptors among the arguments (MoDA's descriptor kernels, decode's cache tiles)
keep their encoded tensor maps (`TensorMaps`); MoDA's descriptor kernels pass the tensors and a
callable that builds the descriptors (`descs`), so a kept launch finds its maps by the tensors'
pointers and builds no descriptor objects. The stream and device questions of every kept launch
go to torch's C functions directly (`cuda_calls`).
"""
from __future__ import annotations

import os

_FAST = os.environ.get("MODA_BENCH_FAST_LAUNCH", "1") not in ("0", "false", "off")


def aligned16(*tensors) -> bool:
    """Whether every tensor's data pointer is 16-byte aligned: the one pointer specialisation
    Triton makes, so what a caller checks of the tensors it did not allocate before giving
    `CachedLaunch` a key (else key=None, Triton's own path)."""
    return not any(t.data_ptr() % 16 for t in tensors)


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for ints, b > 0."""
    return -(-a // b)


def next_pow2(x: int) -> int:
    """The smallest power of two >= x (1 for x <= 1)."""
    return 1 << max(0, int(x) - 1).bit_length()


def set_fast_launch(on: bool) -> bool:
    """Turn the cached launch path on or off for this process (A/B timing); returns the old state."""
    global _FAST
    old, _FAST = _FAST, bool(on)
    return old


def fast_launch() -> bool:
    """Whether `CachedLaunch` may launch from its cache in this process."""
    return _FAST


_RUNTIME = []  # triton.knobs.runtime, looked up once


def _hooks_idle() -> bool:
    """No launch hook installed (a profiler such as proton installs them): Triton's launch
    metadata is then unused and the launcher may get None for both hooks. Triton >= 3.5 keeps the
    hooks as chains of callables, earlier versions as a callable or None."""
    if not _RUNTIME:
        try:
            from triton import knobs
            _RUNTIME.append(knobs.runtime)
        except (ImportError, AttributeError):  # pragma: no cover - a Triton without knobs
            _RUNTIME.append(None)
    rt = _RUNTIME[0]
    if rt is None:  # pragma: no cover
        return False
    enter, leave = rt.launch_enter_hook, rt.launch_exit_hook  # no generator: asked at every kept launch
    return (enter is None or not getattr(enter, "calls", True)) and (leave is None or not getattr(leave, "calls", True))


_CUDA_CALLS: list = []  # torch's C entry points: (current device index, raw stream of an index, capturing?)


def cuda_calls() -> tuple:
    """(current device's index, an index's current raw stream, whether the current stream is capturing a
    CUDA graph): torch's own C functions, looked up once CUDA is initialised, for the per-call paths
    (their Python wrappers ask `_lazy_init` at every call, a few us each of an eager call's host time).
    Only for callers that hold CUDA tensors."""
    if not _CUDA_CALLS:
        import torch
        torch.cuda.current_device()  # initialises CUDA here if nothing has yet
        C = torch._C
        _CUDA_CALLS.append((getattr(C, "_cuda_getDevice", None) or torch.cuda.current_device,
                            getattr(C, "_cuda_getCurrentRawStream", None)
                            or (lambda i: torch.cuda.current_stream(i).cuda_stream),
                            getattr(C, "_cuda_isCurrentStreamCapturing", None)
                            or torch.cuda.is_current_stream_capturing))
    return _CUDA_CALLS[0]


def _current_stream() -> tuple:
    """(device index, raw handle of its current stream, read as Triton's launcher reads it): what it
    launches on."""
    device, raw, _ = cuda_calls()
    dev = device()
    return dev, raw(dev)


class CachedLaunch:
    """`kernel[grid](*args, **meta())` with Triton's binding and specialisation done once per key.

    key: hashable, and the caller's promise that it fixes every specialisation of the launch:
    the tensors' dtypes, every integer argument's value class (1, a multiple of 16, other),
    every constexpr and option in meta, and that all pointer arguments are 16-byte aligned
    (callers check alignment where it is not given, else pass key=None). The CUDA device is
    added to the key here; a launch whose first argument is not a CUDA tensor nor a descriptor of
    one (the interpreter's CPU tensors) takes Triton's path. args: the runtime arguments,
    positionally, in signature order (host-side descriptors among them: `TensorMaps`); meta: a
    callable returning the constexprs and launch options (num_warps, ...) by
    name, called only where Triton's own path runs. `entries` counts the kept kernels.

    descs: a callable returning args with host-side descriptors in place of some of its tensors, for
    callers whose key also fixes those descriptors' shapes, strides and boxes (MoDA's descriptor
    kernels: contiguous tensors, views and boxes from the key's sizes and tiles). args then holds
    the tensors themselves there; a kept launch finds their tensor maps by the tensors' pointers
    alone (`TensorMaps.launch_by_pointers`) and descs() is called only on Triton's path or for
    pointers not seen before, so an eager call builds no descriptor objects."""

    __slots__ = ("fn", "kernels")

    def __init__(self, fn):
        self.fn = fn
        self.kernels: dict = {}

    @property
    def entries(self) -> int:
        return len(self.kernels)

    def __call__(self, key, grid: tuple, args: tuple, meta, descs=None) -> None:
        first = getattr(args[0], "base", args[0])  # a host-side tensor descriptor: its tensor
        if key is None or not _FAST or not getattr(first, "is_cuda", False):
            self.fn[grid](*(descs() if descs is not None else args), **meta())
            return
        dev, stream = _current_stream()
        hit = self.kernels.get((dev, key))
        if hit is not None and _hooks_idle():
            ck, tail, maps = hit
            gx, gy, gz = grid if len(grid) == 3 else (tuple(grid) + (1, 1))[:3]
            if maps is None:
                ck.run(gx, gy, gz, stream, ck.function, ck.packed_metadata, None, None, None,
                       *(descs() if descs is not None else args), *tail)
            elif descs is not None:
                maps.launch_by_pointers(gx, gy, gz, stream, ck, args, tail, descs)
            else:
                maps.launch(gx, gy, gz, stream, ck, args, tail)
            return
        kw = meta()
        if descs is not None:
            args = descs()
        ck = self.fn[grid](*args, **kw)
        if hit is None:
            entry = self._entry(ck, args, kw)
            if entry is not None:
                self.kernels[(dev, key)] = entry

    def _entry(self, ck, args: tuple, kw: dict):
        """(compiled kernel, the constexpr values after args in signature order, its `TensorMaps` or
        None), or None where the launch cannot be repeated from them: no launcher interface (the
        interpreter, another Triton), or a parameter neither in args nor in kw (a default Triton
        would fill in)."""
        if not all(hasattr(ck, a) for a in ("run", "function", "packed_metadata")):
            return None
        names = list(getattr(self.fn, "arg_names", ()))
        rest = names[len(args):]
        if len(names) < len(args) or any(n not in kw for n in rest):
            return None
        return ck, tuple(kw[n] for n in rest), TensorMaps.of(ck, args)


class TensorMaps:
    """The launch of a kernel with host-side tensor descriptor arguments, their encoded tensor maps
    kept. Triton's launcher encodes every descriptor at every launch (`make_tensordesc_arg`:
    `cuTensorMapEncodeTiled` and the arguments' expansion in Python), microseconds a descriptor;
    a map depends only on the pointer, shape, strides and the kernel's box and swizzle (its
    `tensordesc_meta` entry, which two kernels may choose differently for the same view and box),
    so it is encoded once per (metadata, pointer, shape, strides) and the expanded arguments go
    straight to the launcher Triton's wrapper calls. `of` answers None (Triton's `ck.run` then)
    where the launcher is not laid out as Triton 3.6's (its wrapper's `launcher`,
    `make_tensordesc_arg(arg, metadata)`, metadata for every descriptor, no global or profile
    scratch): a map kept without metadata would hold the tensor itself."""

    __slots__ = ("raw", "encode", "pos", "rpos", "metas", "mkeys", "coop", "pdl", "by_ptrs")
    _MAPS: dict = {}  # (metadata's items, pointer, shape..., strides...) -> expanded arguments

    def __init__(self, raw, encode, pos, metas, coop, pdl):
        self.raw, self.encode, self.pos, self.metas, self.coop, self.pdl = raw, encode, pos, metas, coop, pdl
        self.mkeys = tuple(_META_IDS.setdefault(_frozen(m), len(_META_IDS)) for m in metas)  # small ints: cheap keys
        self.rpos = tuple(reversed(pos))
        self.by_ptrs: dict = {}  # the descriptors' tensors' pointers -> their expanded arguments, last first

    @classmethod
    def of(cls, ck, args: tuple):
        pos = tuple(i for i, a in enumerate(args) if hasattr(a, "block_shape") and hasattr(a, "base"))
        if not pos:
            return None
        try:
            from triton.backends.nvidia.driver import make_tensordesc_arg
            run = ck.run
            inner = run.launch
            raw = inner.__closure__[inner.__code__.co_freevars.index("launcher")].cell_contents
            metas = getattr(ck.metadata, "tensordesc_meta", None)
            if (make_tensordesc_arg.__code__.co_argcount != 2 or not metas or len(metas) != len(pos)
                    or any(m is None for m in metas) or run.global_scratch_size or run.profile_scratch_size):
                return None
            return cls(raw, make_tensordesc_arg, pos, tuple(metas), run.launch_cooperative_grid, run.launch_pdl)
        except (ImportError, AttributeError, ValueError, TypeError):
            return None

    def launch(self, gx, gy, gz, stream, ck, args: tuple, tail: tuple) -> None:
        out = list(args)
        for i, meta, mkey in zip(reversed(self.pos), reversed(self.metas), reversed(self.mkeys)):
            d = args[i]
            key = (mkey, d.base.data_ptr(), *d.shape, *d.strides)
            enc = self._MAPS.get(key)
            if enc is None:
                if len(self._MAPS) >= 4096:
                    self._MAPS.clear()
                enc = self._MAPS[key] = self.encode(d, meta)
            out[i:i + 1] = enc
        self.raw(gx, gy, gz, stream, ck.function, self.coop, self.pdl, None, None, ck.packed_metadata, None, None,
                 None, *out, *tail)

    def launch_by_pointers(self, gx, gy, gz, stream, ck, args: tuple, tail: tuple, descs) -> None:
        """`launch` for `CachedLaunch`'s descs callers: args holds tensors where the kernel takes
        descriptors, whose shapes, strides and boxes the launch's key fixes, so their pointers name
        the maps (one look-up a launch); descs() builds the descriptors for pointers not seen."""
        ptrs = tuple([args[i].data_ptr() for i in self.pos])
        encs = self.by_ptrs.get(ptrs)
        if encs is None:
            full = descs()
            encs = tuple(self.encode(full[i], meta) for i, meta in zip(self.rpos, reversed(self.metas)))
            if len(self.by_ptrs) >= 64:
                self.by_ptrs.clear()
            self.by_ptrs[ptrs] = encs
        out = list(args)
        for i, enc in zip(self.rpos, encs):
            out[i:i + 1] = enc
        self.raw(gx, gy, gz, stream, ck.function, self.coop, self.pdl, None, None, ck.packed_metadata, None, None,
                 None, *out, *tail)


_META_IDS: dict = {}  # a descriptor's frozen metadata -> its number in this process (`TensorMaps` keys)


def _frozen(meta):
    """A hashable copy of a descriptor's metadata (dicts and lists as sorted tuples)."""
    if isinstance(meta, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in meta.items()))
    if isinstance(meta, (list, tuple)):
        return tuple(_frozen(v) for v in meta)
    return meta
