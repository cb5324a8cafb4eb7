"""MoDA in the CuTe DSL on Hopper: the forward with the depth tiles inside FlashAttention-4's sm90 kernel
(`fwd_sm90`, its depth steps in `fwd_depth_sm90`) and the depth part of the backward (`bwd_depth_sm90`)."""
