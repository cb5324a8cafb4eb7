import torch
from moda_bench.ops.moda import moda_attention
from moda_bench.timing import make_inputs
x = make_inputs(1, 16384, 64, 8, 64, 0, seed=1)
ins = [x["q"], x["k"], x["v"]]
for _ in range(2):
    for t in ins:
        t.grad = None
    moda_attention(*ins).backward(x["do"])
torch.cuda.synchronize()
