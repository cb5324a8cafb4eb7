"""What a provider is (`Provider`), what its prepare function returns (`Prepared`), and the two
exceptions of the registry (`ProviderSkip`, `UnknownProviderError`).

The registry itself and the training-time providers are `bench.providers`; the decode providers
are `bench.decode_providers`. Both build on these types, so neither imports the other's module.

A provider serves one op family:
- "train": the training passes (fwd, bwd, fwdbwd) over MoDA's training inputs
  (`timing.make_inputs`); its rows are checked against `reference` (default: `moda_reference`).
- "decode": the decode pass over a KV cache (`decode_providers.make_decode_inputs`), checked
  against the decode reference.
`kind` names its FLOP and byte model (`moda_bench.floor.KINDS`), `depth_axis` the point field
that gives its number of depth entries ("L" for MoDA, "S" for Depth-Attention's sources, None
for sequence-only attention, which runs the point with no depth).
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from typing import Callable, Optional

TRAIN, DECODE = "train", "decode"
OPS = (TRAIN, DECODE)


class ProviderSkip(Exception):
    """Raised by a provider's prepare function: this point does not apply (row status 'skipped')."""


class UnknownProviderError(ValueError):
    """A requested provider name is not registered."""


@dataclass(frozen=True)
class Prepared:
    """What a provider built for one point: the forward closure and what to record about it."""

    forward: Callable[[], object]
    impl_detail: str = ""
    config: Optional[dict] = None
    depth_utilization: float = float("nan")
    do: Optional[object] = None   # the output gradient, when forward's output is not (B, T, Hq, d)


@dataclass(frozen=True)
class Provider:
    """A named implementation. prepare(inputs, point, chunk) -> Prepared.

    uses_depth False: a sequence-only peer (no depth inputs; a candidate of `best_provider`).
    reference(q, k, v, k_depth, v_depth) -> out in float64: the oracle of its accuracy check
    (None: the op family's, i.e. moda_reference or the decode reference)."""

    name: str
    prepare: Callable[..., Prepared]
    uses_depth: bool = True
    unavailable: Callable[[str], Optional[str]] = field(default=lambda device: None)
    description: str = ""
    op: str = TRAIN
    kind: str = ""
    depth_axis: Optional[str] = "L"
    reference: Optional[Callable] = None

    def __post_init__(self):
        if self.op not in OPS:
            raise ValueError(f"provider {self.name!r}: op must be one of {', '.join(OPS)}, got {self.op!r}")
        if not self.kind:
            kinds = {(TRAIN, True): "moda", (TRAIN, False): "sequence", (DECODE, True): "decode",
                     (DECODE, False): "decode-sequence"}
            object.__setattr__(self, "kind", kinds[(self.op, self.uses_depth)])
        if not self.uses_depth:
            object.__setattr__(self, "depth_axis", None)

    def depth_entries(self, point) -> int:
        """How many depth entries per position this provider's inputs have at `point`."""
        return int(getattr(point, self.depth_axis)) if self.depth_axis else 0


def needs_cuda(device: str) -> Optional[str]:
    """None on a CUDA device, else the reason a GPU-only provider is skipped."""
    return None if str(device).startswith("cuda") else f"needs a CUDA device (running on {device})"


def needs_triton_op(module: str, label: str) -> Callable[[str], Optional[str]]:
    """The availability check of a provider built on one of our Triton operator packages: the
    package imports, and the device is CUDA (or TRITON_INTERPRET=1 runs the kernels on the CPU)."""

    def check(device: str) -> Optional[str]:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            return f"{module} ({label}) not importable: {exc}"
        if os.environ.get("TRITON_INTERPRET", "0") == "1":
            return None
        return needs_cuda(device)

    return check
