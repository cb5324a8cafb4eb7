"""MoDA on FlashAttention-4: the merge route (`merge`: FA4 for the sequence part, Triton for the depth
part, the two merged by log-sum-exp) and the overlap route (`overlap`: depth kernels on reserved SMs)."""
