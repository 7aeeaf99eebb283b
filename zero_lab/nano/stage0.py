"""ZeRO stage 0: plain data parallelism, written in the shape the higher stages share.

Every rank owns the whole flat buffer (one partition), so the master, the gradient partition and
the optimizer states are full size. Gradients:
    Phase 1 (backward): autograd accumulates straight into a full flat gradient buffer, because
             each `param.grad` is a view of it (allocated at a window's first backward and
             re-attached before every backward, in case the user set grads to None).
    Phase 2 (boundary): the buffer is all-reduced in buckets of `reduce_bucket_size` elements and
             each bucket's average lands in the fp32 gradient partition (in fp32 that partition is
             the gradient buffer itself, so nothing is copied).
    Phase 3 (after the step): the buffer is released; it exists only while gradients do.
"""

from __future__ import annotations

from typing import Optional

import torch

from zero_lab.nano.gradient_reduction import bucket_for_range, optional_bytes
from zero_lab.nano.zero_optimizer import ZeroOptimizer


class Stage0Optimizer(ZeroOptimizer):
    stage = 0
    partitioned = False

    def _build_gradients(self) -> None:
        self.full_gradients: list[Optional[torch.Tensor]] = [None] * len(self.groups)
        self.gradient_is_full_buffer = self.dtype == torch.float32

    def _full_gradient_buffer(self, index: int) -> torch.Tensor:
        if self.full_gradients[index] is None:
            self.full_gradients[index] = torch.zeros_like(self.groups[index].flat)
        return self.full_gradients[index]

    def _new_gradient_partition(self, index: int) -> torch.Tensor:
        if self.gradient_is_full_buffer:
            return self.groups[index].partition_of(self._full_gradient_buffer(index))
        return super()._new_gradient_partition(index)

    def before_backward(self) -> None:
        """Phase 1: point every param.grad into the flat gradient buffer."""
        for index, group in enumerate(self.groups):
            gradients = self._full_gradient_buffer(index)
            for parameter, offset in zip(group.parameters, group.offsets):
                view = gradients[offset:offset + parameter.numel()].view_as(parameter)
                if parameter.grad is None or parameter.grad.data_ptr() != view.data_ptr():
                    if parameter.grad is not None:
                        view.add_(parameter.grad)
                    parameter.grad = view

    def _complete_gradient_partitions(self) -> None:
        """Phase 2: reduce the full buffer, bucket by bucket, into the gradient partitions."""
        bucket_numel = self.config.zero_optimization.reduce_bucket_size
        for index, group in enumerate(self.groups):
            gradients = self._full_gradient_buffer(index)
            for start, end in group.bucket_ranges(bucket_numel):
                bucket = bucket_for_range(gradients, start, end, self.communication_dtype)
                self.reducer.launch(group, bucket, start, end, self.gradient_partition(index))
        self.reducer.finish_all()

    def _release_gradients(self) -> None:
        """Phase 3."""
        for group in self.groups:
            for parameter in group.parameters:
                parameter.grad = None
        self.full_gradients = [None] * len(self.groups)
        super()._release_gradients()

    def _gradient_bytes(self) -> dict[str, int]:
        separate_partitions = 0 if self.gradient_is_full_buffer else sum(map(optional_bytes, self.gradient_partitions))
        return {"gradients": sum(map(optional_bytes, self.full_gradients)), "gradient_partition": separate_partitions}
