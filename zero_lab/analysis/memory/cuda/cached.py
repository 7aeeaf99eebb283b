"""What CUDA's caching allocator keeps reserved beyond a rank's tensors at their peak: blocks freed earlier and
cached for reuse (`caching_allocator` has its rules), which the peak's own tensors cannot use. A GPU run is
limited by what is reserved, the tensors' peak plus this (`resident.predicted_resident_bytes` on CUDA).

A freed block serves only a request of its own stream no larger than itself, and is never given back while
the run fits. So two things stay reserved beside the peak:
- **another stream's pool.** FSDP2 (`fsdp2_pools`) makes each group's reduce output and its fp32 cast, the
  gradient shards, on its reduce-scatter stream, where they live until `zero_grad`, and each group's
  all-gather output on its all-gather stream; the default stream peaks after the shards are gone, beside both
  pools;
- **blocks the peak's tensors do not fit.** Official DeepSpeed at stages 1-2 zeroes an fp32 buffer the size of
  its gradient partition when it starts (`initialize_optimizer_states`) and frees it; its gradient partition in
  the parameters' dtype later lands in it, and the rest stays free beside the step's peak
  (`initialization_buffer`). At stage 3 the step's tensors are partitions, each larger than any block the
  forward and backward freed: their activations and the loss's temporaries stay cached beside the step
  (`forward_backward_pool`).
Measured: bench/cuda_reserved.py replays each run's allocations on CPU through the allocator's rules, beside
the committed GPU reports (one GPU, qwen3-0.6b, bf16, 512 tokens).

Phase 1: each engine's terms, from the shapes and the prediction's moments.
Phase 2: `cached_bytes`: the terms of the run's impl, stage and offload.
"""

from __future__ import annotations

from zero_lab.analysis.memory.activation_memory import FP32_BYTES, ActivationBytes, DecoderShape
from zero_lab.analysis.memory.cuda.caching_allocator import pool_bytes
from zero_lab.analysis.memory.decoder_parameters import unit_parameters
from zero_lab.nano.dtypes import BYTES_OF_PRECISION

STEP_MOMENTS = ("end_of_backward", "boundary", "optimizer_step")  # after the backward has freed its activations


def partition_elements(shape: DecoderShape, world_size: int) -> int:
    layer, root = unit_parameters(shape)
    return -(-(shape.layers * layer + root) // world_size)


def initialization_buffer(shape: DecoderShape, precision: str, world_size: int) -> int:
    """Phase 1, official at stages 1-2 without offload: the fp32 buffer of its gradient partition's size it
    frees when it starts, less the gradient partition in the parameters' dtype that lands in it."""
    partition = partition_elements(shape, world_size)
    return partition * (FP32_BYTES - BYTES_OF_PRECISION[precision])


def forward_backward_pool(activations: ActivationBytes) -> int:
    """Phase 1: what the forward and backward allocate and free, cached beside a step whose tensors need
    larger blocks: the saved activations and the loss's temporaries."""
    return activations.saved + activations.loss_transient


def fsdp2_pools(shards: list[int], reduce_width: int, unsharded_root: int, unsharded_layer: int) -> int:
    """Phase 1, FSDP2: its reduce-scatter stream's pool (every group's fp32 gradient shard, `shards` in
    elements, and one reduce output in the reduce dtype when that is narrower) and its all-gather stream's
    (the root's and a layer's all-gather outputs, in bytes)."""
    reduce_pool = pool_bytes([FP32_BYTES * shard for shard in shards]
                             + ([reduce_width * max(shards)] if reduce_width != FP32_BYTES else []))
    return reduce_pool + pool_bytes([unsharded_root, unsharded_layer])


def cached_bytes(shape: DecoderShape, stage: int, precision: str, world_size: int, impl: str, offloaded: bool,
                 activations: ActivationBytes, peak_moment: str) -> int:
    """Phase 2 for nano and official (FSDP2's: `fsdp2_peak`): what stays reserved beside the peak."""
    if impl != "official" or offloaded or peak_moment not in STEP_MOMENTS:
        return 0
    if stage in (1, 2):
        return initialization_buffer(shape, precision, world_size)
    if stage == 3:
        return forward_backward_pool(activations)
    return 0
