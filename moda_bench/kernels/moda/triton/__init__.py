"""MoDA in Triton: the fused kernel (`interface.moda_attention`), its forward and backward launches
(`fwd`, `bwd`, the descriptor-load `fwd_tma` / `bwd_tma`) and the persistent depth kernels (`depth`)."""
