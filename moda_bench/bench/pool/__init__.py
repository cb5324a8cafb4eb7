"""Local and torchrun pools that shard a sweep over GPUs and merge the shards."""
