"""Sweeps past one GPU: `plan` (cost model, task plan, GPUs of this node, torchrun detection),
`local` (the `--gpus` pool of worker processes), `worker` (the per-GPU worker it starts),
`distributed` (this torchrun rank's share) and `merge` (shard CSVs and `moda-bench merge`)."""
