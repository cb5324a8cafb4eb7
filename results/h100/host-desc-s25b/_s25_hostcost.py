"""Session 25: host cost of host-side descriptors, and registers / spills of every cached descriptor
kernel after fwd+bwd calls with host-side and device-side descriptors at the given points."""
import sys
import time
import torch
import triton
from moda_bench.ops.moda import moda_attention
from moda_bench.ops.moda import descriptors as D
from moda_bench.ops.moda import kernel_fwd_tma as F, kernel_bwd_tma as Bk
from moda_bench.timing import make_inputs


def us(fn, n=2000):
    for _ in range(20):
        fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return 1e6 * (time.perf_counter() - t) / n


q = torch.randn(1, 1024, 64, 64, device="cuda", dtype=torch.bfloat16)
print("TensorDescriptor (rows_hdesc) us:", round(us(lambda: D.rows_hdesc(q, 8, 8)), 2))
try:
    fill = triton.runtime.driver.active.utils.fill_tma_descriptor
    print("fill_tma_descriptor us:", round(us(lambda: fill(q.data_ptr(), 3, 2, 10, [1, 8, 8, 64], [1, 1024, 64, 64],
                                                          [1024 * 64 * 64, 64 * 64, 64, 1], 0)), 2))
except Exception as e:
    print("fill_tma_descriptor:", type(e).__name__, e)
for spec in sys.argv[1:]:
    T, G, L = (int(x) for x in spec.split(","))
    x = make_inputs(1, T, G * 8, 8, 64, L, seed=0)
    for host in (False, True):
        D.set_host_descriptors(host)

        def fwd():
            return moda_attention(x["q"], x["k"], x["v"], x["k_depth"], x["v_depth"])
        o = fwd()
        o.backward(x["do"])
        torch.cuda.synchronize()
        print(f"T={T} G={G} L={L} host={host}: forward call host us {us(fwd, 300):.1f}")
for name, launch in (("fwd", F._FWD_LAUNCH), ("dq", Bk._DQ_LAUNCH), ("dqh", Bk._DQH_LAUNCH), ("kv", Bk._KV_LAUNCH)):
    for (dev, key), (ck, tail) in launch.kernels.items():
        print(f"{name:4s} regs {ck.n_regs:4d} spills {ck.n_spills:4d} shared {ck.metadata.shared:7d} key {str(key)[-160:]}")
D.set_host_descriptors(True)
