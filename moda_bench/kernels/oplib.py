"""What the operators' torch custom ops (namespace `moda_bench`) share: turning the Python objects a
public call takes (a frozen config dataclass, a named sequence backend) into op arguments.

A custom op's schema takes tensors, scalars and strings. A config becomes its JSON (`config_key`:
"" for None, memoised per object) and is rebuilt inside the op (`config_of`, memoised per key);
a `SequenceBackend` registers itself under its name when it is made (`register_backend`), passes
as that name (`backend_key`, a field read) and is found again by `backend_of`. `config_key` is
`torch.compiler.assume_constant_result`: under dynamo it runs once at trace time and its answer is
a constant of the graph (guarded by the object), so a compiled call with `config=` traces with no
graph break. `backend_key` does nothing a trace must replay: torch 2.11's dynamo cannot rebuild a
frozen dataclass to run a function on it at trace time ("can't reconstruct arbitrary frozen
dataclass instances"), and a registry write inside a trace would be such a replayed side effect.

Eager calls do not go through the dispatcher by default (`through_ops`): a Python custom op with
autograd costs several times the host time of the `torch.autograd.Function` that runs the same
implementation functions, and an eager training step pays that per layer and pass. Under
torch.compile (and with `set_eager_ops(True)` or MODA_BENCH_EAGER_OPS=1) the public functions call
the ops.
"""
from __future__ import annotations

import dataclasses
import json
import os

import torch

_EAGER_OPS = os.environ.get("MODA_BENCH_EAGER_OPS", "0") not in ("0", "false", "off", "")
_KEYS: dict = {}  # id(obj) -> (obj, key): the entry keeps obj alive, so its id is not reused while kept
_OBJECTS: dict = {}  # (class, key) -> obj
_BACKENDS: dict = {}  # name -> SequenceBackend


def _memo(table: dict, key, value):
    if len(table) >= 256:
        table.clear()
    table[key] = value
    return value


@torch.compiler.assume_constant_result
def config_key(config) -> str:
    """The op argument standing for `config` (a dataclass or None): "" for None, else its JSON."""
    if config is None:
        return ""
    hit = _KEYS.get(id(config))
    if hit is not None and hit[0] is config:
        return hit[1]
    return _memo(_KEYS, id(config), (config, json.dumps(dataclasses.asdict(config), sort_keys=True)))[1]


def config_of(key: str, cls):
    """The `cls` instance a `config_key` stands for (None for ""); cls.from_dict where it has one."""
    if not key:
        return None
    obj = _OBJECTS.get((cls, key))
    if obj is None:
        fields = json.loads(key)
        obj = _memo(_OBJECTS, (cls, key), cls.from_dict(fields) if hasattr(cls, "from_dict") else cls(**fields))
    return obj


def register_backend(backend) -> None:
    """Make `backend` (a `SequenceBackend`, which calls this when made) the one `backend_of` returns for
    its name (a later backend of the same name replaces it)."""
    _BACKENDS[backend.name] = backend


def backend_key(backend) -> str:
    """The op argument standing for a `SequenceBackend`: its name (registered when it was made)."""
    return backend.name


def backend_of(name: str):
    """The `SequenceBackend` registered under name (KeyError if none was made with it)."""
    return _BACKENDS[name]


def through_ops() -> bool:
    """Whether a public operator call goes through its torch custom op (always while dynamo traces;
    in eager only after `set_eager_ops(True)`), else through the autograd Function beside it."""
    return _EAGER_OPS or torch.compiler.is_compiling()


def set_eager_ops(on: bool) -> bool:
    """Route eager calls through the custom ops too (A/B of the two paths, tests); returns the old state."""
    global _EAGER_OPS
    old, _EAGER_OPS = _EAGER_OPS, bool(on)
    return old
