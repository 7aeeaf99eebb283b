"""ZeRO stage 0: plain data parallelism, written in the shape the higher stages share.

Every rank owns the whole flat buffer (one partition), so the master, the gradient partition and
the optimizer states are full size. Gradients are collected at the boundary (`BoundaryPacking`):
    during backward: autograd accumulates into each `param.grad` as usual, over every micro-step
             of the window (allocated as backward reaches each parameter, as in official
             DeepSpeed, so the gradients never coexist with all the activations);
    at the boundary (the first phase of the optimizer step): the static buckets (flat ranges of
             `reduce_bucket_size` elements, last parameters first) are packed from `param.grad`
             and all-reduced; every rank keeps its share, averaged, in its fp32 gradient
             partition. A rank that owns the whole buffer and sends fp32 packs a bucket straight
             into its partition and all-reduces it in place, where that partition is on the
             device; every other bucket is a compute tensor (`placement.py`), since the
             collectives run on the device (nccl refuses host tensors, which is where an
             offloaded optimizer keeps the gradient partition). Each `param.grad` is released
             once its last piece is packed.
After Adam the updated master is the parameters (fp32) or is copied into them (bf16/fp16).
"""

from __future__ import annotations

import torch

from zero_lab.nano.placement import TensorKind
from zero_lab.nano.zero_optimizer import GradientCollection, ZeroOptimizer


class BoundaryPacking(GradientCollection):
    """Gradients stay in autograd's param.grad until the boundary, then travel in buckets."""

    def after_backward(self) -> None:
        """Nothing: autograd accumulates into param.grad, which waits for the boundary."""

    def reduce_at_boundary(self) -> None:
        """Step Phase 1: pack every bucket from param.grad, reduce it, wait for all of them."""
        optimizer = self.optimizer
        bucket_numel = optimizer.config.zero_optimization.reduce_bucket_size
        for index, buffer in enumerate(optimizer.buffers):
            partition = optimizer.gradient_partition(index)
            in_place = (buffer.layout.partition_count == 1 and optimizer.communication_dtype == torch.float32
                        and optimizer.placement.place(TensorKind.OPTIMIZER) == "device")
            for start, end in buffer.layout.bucket_ranges(bucket_numel):
                bucket = partition[start:end] if in_place else optimizer.placement.zeros(
                    TensorKind.COMPUTE, end - start, optimizer.communication_dtype)
                for piece in buffer.layout.pieces(start, end):
                    parameter = buffer.parameters[piece.parameter_index]
                    if parameter.grad is not None:
                        bucket[piece.flat_start - start:piece.flat_start - start + piece.numel].copy_(
                            parameter.grad.reshape(-1)[piece.parameter_offset:piece.parameter_offset + piece.numel])
                    if piece.parameter_offset == 0:  # its last piece: buckets run back to front
                        parameter.grad = None
                optimizer.reducer.launch(buffer, bucket, start, end, partition, owns_bucket=not in_place)
        optimizer.reducer.finish_all()

    def release(self) -> None:
        for buffer in self.optimizer.buffers:
            for parameter in buffer.parameters:
                parameter.grad = None

    def gradient_bytes(self) -> int:
        return parameter_gradient_bytes(self.optimizer.buffers)


def parameter_gradient_bytes(buffers: list) -> int:
    """Bytes of the storages behind the buffers' parameters' `param.grad` (each storage once)."""
    storages = {}
    for buffer in buffers:
        for parameter in buffer.parameters:
            if parameter.grad is not None:
                storage = parameter.grad.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


class Stage0Optimizer(ZeroOptimizer):
    stage = 0
    GradientCollection = BoundaryPacking

    def _uses_reduce_scatter(self) -> bool:
        return False  # one partition: every rank needs every sum

    def _sum_over_ranks(self, squares: torch.Tensor) -> None:
        """Every rank holds every (already reduced) gradient: its sum is the global one."""

    def _publish_parameters(self) -> None:
        for index in range(len(self.buffers)):
            self.copy_master_into_partition(index)
