"""The device-side descriptor builders (`kernels.moda.triton.descriptors`) compile for sm_90 on a
machine without a GPU (`triton.compile` in a process without the interpreter): the interpreter
runs code that compiled Triton rejects, as `depth_descs_at` did on the H100 (its stride list bound
to a name became a tuple of tensors, and the descriptor's last stride was no longer the constant 1:
`test_gpu_default_backward_adds_into_model_buffer[9001]`). Each builder is called from a small
kernel that loads a box through it and stores it back; skipped where this Triton cannot compile
for sm_90 here."""
import triton
import triton.language as tl
from helpers import compiled_sm90_json

from moda_bench.kernels.moda.triton import descriptors as D


@triton.jit
def _rows(X, B, T, Hq, P: tl.constexpr, GP: tl.constexpr, DD: tl.constexpr):
    x = D.rows_desc(X, B, T, Hq, P, GP, DD)
    x.store([0, 0, 0, 0], x.load([0, 0, 0, 0]))


@triton.jit
def _keys(X, B, T, Hk, BN: tl.constexpr, DD: tl.constexpr):
    x = D.keys_desc(X, B, T, Hk, BN, DD)
    x.store([0, 0], x.load([0, 0]))


@triton.jit
def _depth_rows(X, B, T, LD, Hk, P: tl.constexpr, BL: tl.constexpr, DD: tl.constexpr):
    x = D.depth_rows_desc(X, B, T, LD, Hk, P, BL, DD)
    x.store([0, 0, 0], x.load([0, 0, 0]))


@triton.jit
def _depth(X, Y, B, T, LD, Hk, P: tl.constexpr, BL: tl.constexpr, DD: tl.constexpr):
    x, y = D.depth_descs(X, Y, B, T, LD, Hk, P, BL, DD)
    y.store([0, 0, 0, 0], x.load([0, 0, 0, 0]))


@triton.jit
def _depth_at(X, Y, B, T, LD, Hk, sb, st, sl, P: tl.constexpr, BL: tl.constexpr, DD: tl.constexpr):
    x, y = D.depth_descs_at(X, Y, B, T, LD, Hk, sb, st, sl, P, BL, DD)
    y.store([0, 0, 0, 0], x.load([0, 0, 0, 0]))


KERNELS = {"_rows": ("X", "B T Hq", dict(P=16, GP=4, DD=64)), "_keys": ("X", "B T Hk", dict(BN=64, DD=64)),
           "_depth_rows": ("X", "B T LD Hk", dict(P=16, BL=16, DD=64)),
           "_depth": ("X Y", "B T LD Hk", dict(P=16, BL=16, DD=64)),
           "_depth_at": ("X Y", "B T LD Hk sb st sl", dict(P=16, BL=16, DD=64))}


def compile_all() -> dict:
    """{kernel: "ok" or the error's last line}, each compiled for sm_90 (16-bit pointers, i32 scalars)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler import compile as triton_compile
    out = {}
    for name, (ptrs, ints, cons) in KERNELS.items():
        sig = {**dict.fromkeys(ptrs.split(), "*bf16"), **dict.fromkeys(ints.split(), "i32"),
               **dict.fromkeys(cons, "constexpr")}
        try:
            triton_compile(ASTSource(globals()[name], sig, cons), target=GPUTarget("cuda", 90, 32),
                           options=dict(num_warps=4))
            out[name] = "ok"
        except Exception as exc:   # noqa: BLE001 - the report names it
            out[name] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:200]}"
    return out


def test_descriptor_builders_compile_for_sm90():
    got = compiled_sm90_json("import test_descriptors_compiled as t", "t.compile_all()", timeout=300)
    assert got == dict.fromkeys(KERNELS, "ok"), got
