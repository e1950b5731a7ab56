"""Parallel training on a device mesh, one file per parallelism: ``mesh`` (the (pp, dp, tp)
DeviceMesh), ``tensor_parallel`` (Megatron-style TP + sequence parallelism), ``pipeline``
(stages and schedules of ``torch.distributed.pipelining``), ``data_parallel`` (DDP, ZeRO-1,
FSDP2), ``checkpointing`` (activation checkpointing), ``clipping`` (gradient clipping across
meshes) and the thin ``engine`` that builds a point's model with them and steps it."""
