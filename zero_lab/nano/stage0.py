"""ZeRO stage 0: plain data parallelism, written in the shape the higher stages share.

Every rank owns the whole flat buffer (one partition), so the master, the gradient partition and
the optimizer states are full size. Gradients:
    Phase 1 (backward): autograd accumulates straight into a full flat gradient buffer, because
             each `param.grad` is a view of it (re-attached before every backward, in case the
             user set grads to None).
    Phase 2 (boundary): the buffer is all-reduced in buckets of `reduce_bucket_size` elements and
             each bucket's average lands in the fp32 gradient partition (in fp32 that partition is
             the gradient buffer itself, so nothing is copied).
"""

from __future__ import annotations

import torch

from zero_lab.nano.gradient_reduction import bucket_for_range, optional_bytes
from zero_lab.nano.zero_optimizer import ZeroOptimizer


class Stage0Optimizer(ZeroOptimizer):
    stage = 0
    partitioned = False

    def _build_gradients(self) -> list[torch.Tensor]:
        self.full_gradients = [torch.zeros_like(group.flat) for group in self.groups]
        self.gradient_is_full_buffer = self.dtype == torch.float32
        if self.gradient_is_full_buffer:
            return [group.partition_of(gradients) for group, gradients in zip(self.groups, self.full_gradients)]
        return [torch.zeros(group.partition_numel, dtype=torch.float32, device=group.flat.device)
                for group in self.groups]

    def before_backward(self) -> None:
        """Phase 1: point every param.grad into the flat gradient buffer."""
        for group, gradients in zip(self.groups, self.full_gradients):
            for parameter, offset in zip(group.parameters, group.offsets):
                view = gradients[offset:offset + parameter.numel()].view_as(parameter)
                if parameter.grad is None or parameter.grad.data_ptr() != view.data_ptr():
                    if parameter.grad is not None:
                        view.add_(parameter.grad)
                    parameter.grad = view

    def _complete_gradient_partitions(self) -> None:
        """Phase 2: reduce the full buffer, bucket by bucket, into the gradient partitions."""
        bucket_numel = self.config.zero_optimization.reduce_bucket_size
        for group, gradients, partition in zip(self.groups, self.full_gradients, self.gradient_partitions):
            for start, end in group.bucket_ranges(bucket_numel):
                bucket = bucket_for_range(gradients, start, end, self.communication_dtype)
                self.reducer.launch(group, bucket, start, end, partition)
        self.reducer.finish_all()

    def _zero_gradients(self) -> None:
        for gradients in self.full_gradients:
            gradients.zero_()
        if not self.gradient_is_full_buffer:
            super()._zero_gradients()

    def _gradient_bytes(self) -> dict[str, int]:
        return {
            "gradients": sum(map(optional_bytes, self.full_gradients)),
            "gradient_partition": 0 if self.gradient_is_full_buffer else sum(map(optional_bytes, self.gradient_partitions)),
        }
