"""Host-side tensor descriptors of the descriptor kernels (`ops.moda.descriptors`): the forward and
both backward passes give the same answers with descriptors built on the host as with descriptors
built by every program on the device, bitwise, at odd shapes (T not a multiple of any block, G = 1
/ 2 / 3 / 8 / 16, L = 0 / 1 / 5, B = 2, depth_grad off, the per-head dq pass, the key-major pass in
chunks, in head sub-groups and beside the dq pass); against the fp64 reference through
`moda_attention`; each host builder describes its device twin's view and box; the backward's rule;
`CachedLaunch` keeps a launch whose first argument is a descriptor.

CPU: the Triton interpreter (conftest sets TRITON_INTERPRET=1) takes both kinds of descriptor.
Tolerances: helpers.TOLERANCE (||err|| / ||ref||: fp32 1e-4); host vs device: bitwise equal.
"""
import pytest
import torch
from helpers import check_against_reference, random_inputs

from moda_bench.kernels import launch as launch_mod
from moda_bench.kernels.moda import MoDAConfig, moda_attention
from moda_bench.kernels.moda.triton import descriptors as D
from moda_bench.kernels.moda.triton.bwd_tma import moda_bwd_tma
from moda_bench.kernels.moda.triton.bwd_tma_rules import HOST_DESC_BWD_MAX_T, host_desc_bwd
from moda_bench.kernels.moda.triton.fwd_tma import moda_fwd_tma
from moda_bench.kernels.moda.triton.interface import moda_fwd
from moda_bench.kernels.moda.validate import MoDAShape

pytestmark = pytest.mark.skipif(D.TensorDescriptor is None, reason="this Triton has no host-side descriptors")


@pytest.fixture
def host_switch():
    """Restores the process switch after a test that flips it."""
    old = D.host_descriptors()
    yield D.set_host_descriptors
    D.set_host_descriptors(old)


def _both(fn, host_switch):
    """fn() with device-side descriptors, then with host-side ones."""
    out = []
    for host in (False, True):
        host_switch(host)
        out.append(fn())
    return out


def _assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert (x is None) == (y is None)
        if x is not None:
            assert torch.equal(x, y), f"max |diff| {(x.float() - y.float()).abs().max().item()}"


# (B, T, G, L, kwargs of moda_bwd_tma)
CASES = [
    (2, 37, 8, 5, {}),                                   # odd T, L not a multiple of the depth step, B=2
    (1, 29, 1, 1, {}),                                   # G=1 (padded to no heads), L=1
    (1, 41, 3, 4, {}),                                   # G=3: padding heads in every box
    (1, 50, 16, 3, dict(depth_grad=False)),              # G=16, detached depth
    (2, 70, 2, 0, dict(heads=True)),                     # L=0, the per-head dq pass
    (1, 45, 4, 0, {}),                                   # L=0 folded
    (1, 77, 8, 2, dict(kv_chunk=32)),                    # key-major rows in chunks
    (1, 53, 8, 2, dict(kv_sub=2)),                       # key-major pass in head sub-groups
    (1, 39, 4, 3, dict(beside=lambda main, side: (main(), side()))),  # key-major pass with its own statistics
]


@pytest.mark.parametrize("B,T,G,L,kw", CASES)
def test_host_and_device_descriptors_agree(B, T, G, L, kw, host_switch):
    d = 32
    q, k, v, kd, vd, do = (x.detach() if x is not None else None
                           for x in random_inputs(B, T, 2 * G, 2, d, L, torch.float32, seed=T))

    def run():
        o, lse = moda_fwd_tma(q, k, v, kd, vd, d ** -0.5, G, block_m=max(16, 2 * _pow2(G)), block_n=16,
                              num_warps=4, num_stages=2)
        g = moda_bwd_tma(do, q, k, v, kd, vd, o, lse, d ** -0.5, G, q_block_m=32, q_block_n=16, kv_block_m=32,
                         kv_block_n=16, block_l=16, q_stages=2, kv_stages=2, **kw)
        return (o, lse) + tuple(g)

    dev, host = _both(run, host_switch)
    _assert_same(dev, host)


def _pow2(G):
    return 1 << max(0, G - 1).bit_length()


@pytest.mark.parametrize("T,G,L", [(37, 8, 5), (33, 2, 0), (20, 1, 1)])
def test_moda_attention_with_host_descriptors_matches_reference(T, G, L, host_switch):
    """The user's path on the "tma" kernels (their `use_desc` follows the inputs' alignment) with the
    switch on: out, lse and all five gradients against the fp64 reference."""
    host_switch(True)
    cfg = MoDAConfig(fwd_depth="tma", bwd_depth="tma", block_m=32, block_n=16, num_stages=2, bwd_q_block_m=32,
                     bwd_q_block_n=16, bwd_kv_block_m=32, bwd_kv_block_n=16, bwd_q_stages=2, bwd_kv_stages=2)
    check_against_reference(lambda *a, **kw: moda_attention(*a, config=cfg, return_lse=True, **kw),
                            2, T, 2 * G, 2, 32, L, torch.float32, seed=T)


def test_host_builders_describe_the_device_views():
    """Each *_hdesc holds its device twin's shape, strides (elements) and box, on the tensor itself."""
    B, T, Hq, Hk, L, d = 2, 9, 8, 2, 3, 16
    q = torch.zeros(B, T, Hq, d)
    k = torch.zeros(B, T, Hk, d)
    kd = torch.zeros(B, T, L, Hk, d)
    r = D.rows_hdesc(q, 4, 2)
    assert (r.base is q, r.shape, r.strides, r.block_shape) == (True, [B, T, Hq, d], [T * Hq * d, Hq * d, d, 1],
                                                                [1, 4, 2, d])
    kk = D.keys_hdesc(k, 16)
    assert (kk.shape, kk.strides, kk.block_shape) == ([B * T, Hk * d], [Hk * d, 1], [16, d])
    dr = D.depth_rows_hdesc(kd, B, T, L, Hk, d, 4, 8)
    assert (dr.shape, dr.strides, dr.block_shape) == ([B * T, L, Hk * d], [L * Hk * d, Hk * d, 1], [4, 8, d])
    dd = D.depth_hdesc(kd, B, T, L, Hk, d, 4, 8)
    assert (dd.shape, dd.strides, dd.block_shape) == ([B, T, L, Hk * d], [T * L * Hk * d, L * Hk * d, Hk * d, 1],
                                                      [1, 4, 8, d])
    assert dd.padding == "zero"  # the class default, as the constructor would set it
    z = D.depth_rows_hdesc(k, B, T, 1, Hk, d, 4, 8)  # L = 0: k stands in, LD = 1
    assert (z.shape, z.strides) == ([B * T, 1, Hk * d], [Hk * d, Hk * d, 1])


def test_backward_rule_and_switch(host_switch):
    host_switch(True)
    assert host_desc_bwd(1024) and host_desc_bwd(HOST_DESC_BWD_MAX_T)
    assert not host_desc_bwd(HOST_DESC_BWD_MAX_T + 1) and not host_desc_bwd(16384)
    host_switch(False)
    assert not D.host_descriptors() and not host_desc_bwd(1024)
    assert host_switch(True) is False and D.host_descriptors()


def test_backward_takes_host_descriptors_by_its_rule(monkeypatch, host_switch):
    """moda_bwd_tma builds host descriptors at T <= HOST_DESC_BWD_MAX_T only (counted through the builder)."""
    host_switch(True)
    built = []
    real = D._desc
    monkeypatch.setattr(D, "_desc", lambda *a: built.append(a[1]) or real(*a))
    B, T, G, L, d = 1, 21, 2, 2, 32
    q, k, v, kd, vd, do = (x.detach() for x in random_inputs(B, T, 2 * G, 2, d, L, torch.float32))
    o, lse = moda_fwd(q, k, v, kd, vd, d ** -0.5, MoDAShape(B=B, T=T, Hq=2 * G, Hk=2, d=d, L=L), MoDAConfig())
    built.clear()
    moda_bwd_tma(do, q, k, v, kd, vd, o, lse, d ** -0.5, G, q_block_m=32, q_block_n=16, kv_block_m=32, kv_block_n=16,
                 block_l=16, q_stages=2, kv_stages=2)
    assert len(built) == 12  # dq pass: q, do, k, v and four depth tensors; key-major: q, do, k, v
    monkeypatch.setattr("moda_bench.kernels.moda.triton.bwd_tma.host_desc_bwd", lambda T: False)
    built.clear()
    moda_bwd_tma(do, q, k, v, kd, vd, o, lse, d ** -0.5, G, q_block_m=32, q_block_n=16, kv_block_m=32, kv_block_n=16,
                 block_l=16, q_stages=2, kv_stages=2)
    assert built == []


def test_cached_launch_reads_a_descriptors_tensor(monkeypatch):
    """A launch whose first argument is a descriptor is judged by its tensor: a CPU tensor's takes
    Triton's own path (the interpreter), whatever the key."""
    calls = []

    class Fn:
        def __getitem__(self, grid):
            return lambda *args, **kw: calls.append((grid, args, kw))

    cl = launch_mod.CachedLaunch(Fn())
    desc = D.rows_hdesc(torch.zeros(1, 4, 2, 16), 4, 2)
    cl(("key",), (1,), (desc, 3), lambda: dict(N=1))
    cl(("key",), (1,), (desc, 3), lambda: dict(N=1))
    assert len(calls) == 2 and cl.entries == 0 and calls[0][1][0] is desc


def _fake_compiled(seen: list, pdl: bool = False):
    """A compiled kernel's class laid out as Triton 3.6's (its run's launch closes over `launcher`),
    whose launcher records its arguments in `seen`; two descriptor parameters (boxes 1 and 2)."""
    def make_inner(launcher):
        def inner(*a):
            return launcher(*a)
        return inner

    class Run:
        launch = make_inner(lambda *a: seen.append(a))
        global_scratch_size = profile_scratch_size = 0
        launch_cooperative_grid, launch_pdl = False, pdl

    class Meta:
        tensordesc_meta = [{"box": 1}, {"box": 2}]

    class Ck:
        run, metadata, function, packed_metadata = Run(), Meta(), "fn", "packed"
    return Ck


def test_tensor_maps_encode_once_and_expand_in_place(monkeypatch):
    """`TensorMaps` (Triton 3.6's launcher layout, faked here): a descriptor argument is replaced by
    its encoded map, shape and strides in place, encoded once per (metadata, pointer, shape,
    strides): a kernel whose metadata differs for the same tensor and view gets its own map (the
    GPU found a kept map shared across two kernels' swizzles); the launcher Triton's wrapper would
    call gets the 13 base arguments first."""
    import triton.backends.nvidia.driver as drv
    encoded = []

    def fake_encode(arg, metadata):
        encoded.append((arg.base.data_ptr(), metadata))
        return [("map", arg.base.data_ptr()), *arg.shape, *arg.strides]

    monkeypatch.setattr(drv, "make_tensordesc_arg", fake_encode)
    seen = []
    Ck = _fake_compiled(seen, pdl=True)

    x, y = torch.zeros(1, 4, 2, 16), torch.zeros(1, 8, 2, 16)
    args = (D.rows_hdesc(x, 4, 2), 7, D.keys_hdesc(y, 16), 9)
    maps = launch_mod.TensorMaps.of(Ck(), args)
    assert maps is not None and maps.pos == (0, 2)
    launch_mod.TensorMaps._MAPS.clear()
    for _ in range(2):
        maps.launch(3, 1, 1, 123, Ck(), args, ("tail",))
    assert len(encoded) == 2 and [m for _, m in encoded] == [{"box": 2}, {"box": 1}]
    a = seen[-1]
    assert a[:13] == (3, 1, 1, 123, "fn", False, True, None, None, "packed", None, None, None)
    assert a[13:] == (("map", x.data_ptr()), 1, 4, 2, 16, 128, 32, 16, 1, 7, ("map", y.data_ptr()), 8, 32, 32, 1,
                      9, "tail")
    class Meta2:  # another kernel: the same views with another swizzle for the first
        tensordesc_meta = [{"box": 1, "swizzle": 2}, {"box": 2}]

    class Ck2(Ck):
        metadata = Meta2()

    launch_mod.TensorMaps.of(Ck2(), args).launch(3, 1, 1, 123, Ck2(), args, ())
    assert len(encoded) == 3 and encoded[-1] == (x.data_ptr(), {"box": 1, "swizzle": 2})  # its own map
    assert launch_mod.TensorMaps.of(Ck(), (x, 7)) is None  # no descriptor among the arguments

    class Ck3(Ck):  # descriptors without metadata: a kept map would hold the tensor itself
        metadata = type("M", (), {"tensordesc_meta": [None, None]})()

    assert launch_mod.TensorMaps.of(Ck3(), args) is None
    monkeypatch.setattr(drv, "make_tensordesc_arg", lambda arg, metadata, extra: [])
    assert launch_mod.TensorMaps.of(Ck(), args) is None  # another launcher layout: Triton's own path


def test_tensor_maps_by_pointers_match_descriptor_launches(monkeypatch):
    """`TensorMaps.launch_by_pointers` (`CachedLaunch`'s descs callers): the arguments hold tensors
    where the kernel takes descriptors; the launcher gets what `launch` gives it for the descriptors
    descs() builds, descs() is called only for pointers not seen before, and one encoding a
    descriptor is kept per pointer set."""
    import triton.backends.nvidia.driver as drv
    encoded, seen = [], []

    def fake_encode(arg, metadata):
        encoded.append(arg.base.data_ptr())
        return [("map", arg.base.data_ptr(), metadata["box"]), *arg.shape, *arg.strides]

    monkeypatch.setattr(drv, "make_tensordesc_arg", fake_encode)
    Ck = _fake_compiled(seen)

    x, y, z = torch.zeros(1, 4, 2, 16), torch.zeros(1, 8, 2, 16), torch.zeros(1, 8, 2, 16)
    built = []

    def descs_of(a, b):
        def descs():
            built.append(1)
            return (D.rows_hdesc(a, 4, 2), 7, D.keys_hdesc(b, 16), 9)
        return descs

    maps = launch_mod.TensorMaps.of(Ck(), descs_of(x, y)())
    launch_mod.TensorMaps._MAPS.clear()
    maps.launch(3, 1, 1, 5, Ck(), descs_of(x, y)(), ("tail",))
    want = seen[-1]
    built.clear()
    for _ in range(3):
        maps.launch_by_pointers(3, 1, 1, 5, Ck(), (x, 7, y, 9), ("tail",), descs_of(x, y))
        assert seen[-1] == want
    assert built == [1] and len(maps.by_ptrs) == 1
    maps.launch_by_pointers(3, 1, 1, 5, Ck(), (x, 7, z, 9), ("tail",), descs_of(x, z))  # a new pointer
    assert built == [1, 1] and seen[-1][13:] == want[13:23] + (("map", z.data_ptr(), 2), *want[24:])


def test_cached_launch_with_descs_on_triton_path():
    """With descs, Triton's own path (here: CPU tensors, the interpreter's) gets the descriptors
    descs() builds, not the tensors, at every call."""
    calls = []

    class Fn:
        def __getitem__(self, grid):
            return lambda *args, **kw: calls.append(args)

    cl = launch_mod.CachedLaunch(Fn())
    x = torch.zeros(1, 4, 2, 16)
    for _ in range(2):
        cl(("key",), (1,), (x, 3), lambda: dict(N=1), lambda: (D.rows_hdesc(x, 4, 2), 3))
    assert len(calls) == 2 and all(hasattr(c[0], "block_shape") and c[0].base is x for c in calls)
