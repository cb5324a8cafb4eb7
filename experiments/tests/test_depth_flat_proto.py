"""The flat (item, depth step) prototype of moda-overlap's streaming depth forward
(experiments/depth_flat_proto.py) against `kernel_depth.depth_fwd` on the interpreter: equal results
(fp32, 1e-5 relative) at odd T, G 1/2/3/8/16, L 1/5/7/19/64, uneven program counts. Measured on
an H100 it was slower where items have many depth steps (results/h100/depth-flat); the test keeps
the prototype runnable for the next idea built on it.
"""

import torch

from conftest import load_tool



def test_flat_depth_forward_matches_the_streaming_kernel():
    m = load_tool("depth_flat_proto")
    assert m.check("cuda" if torch.cuda.is_available() else "cpu") < 1e-5
