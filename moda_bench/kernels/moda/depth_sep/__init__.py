"""depth-sep: the seeds' variant (c), "Depth Attention" beside sequence attention with a separate
softmax over each position's depth entries (MoDA's inputs, two normalisations instead of one).

Face: `depth_sep_attention` (the operator), `depth_softmax` (its Triton depth part, with autograd),
`depth_sep_reference` / `depth_softmax_reference` (the fp64 oracles)."""
from moda_bench.kernels.moda.depth_sep.kernel import depth_sep_attention, depth_softmax
from moda_bench.kernels.moda.depth_sep.reference import depth_sep_reference, depth_softmax_reference

__all__ = ["depth_sep_attention", "depth_softmax", "depth_sep_reference", "depth_softmax_reference"]
