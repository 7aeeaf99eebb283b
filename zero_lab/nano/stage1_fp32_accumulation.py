"""ZeRO stage 1 with fp32 gradient accumulation: bf16 parameters, `data_types.grad_accum_dtype: fp32`.

This is the stage table's FP32_ACCUMULATION variant of stage 1, where official DeepSpeed runs its
BF16_Optimizer. It partitions what stage 1 partitions (the optimizer states; the fp32 master is a
1/N partition), and differs from stage 1 only in how gradients are collected
(`Fp32Accumulation`), per flat buffer:
    Phase 1 (each micro-step, after backward; with `bf16.immediate_grad_update`, as autograd
             accumulates each gradient, so that no two bf16 gradients wait at once): autograd's
             bf16 `param.grad`, which holds this micro-step's gradient alone, is added in fp32
             into its slice of the fp32 gradients, and released. The fp32 gradients are one
             full-size flat buffer per flat parameter buffer (every rank holds every element, as
             the flat layout pads it), allocated zeroed at the window's first backward. Over a
             window, micro-steps add up in fp32, not in bf16 as plain stage 1's param.grad does.
    Phase 2 (the boundary, Step Phase 1): the fp32 gradients are reduced in buckets of
             `reduce_bucket_size` elements, last first: all-reduced, not reduce-scattered, as
             official all-reduces the whole buffer. A bucket travels in the communication dtype
             (bf16 by default: a bf16 copy of the bucket, as official's; fp32: the slice
             itself, in place), and this rank's share, divided by the world size after the sum,
             lands in its gradient partition: the slice of the fp32 gradients it owns, a view
             with no storage of its own.
    Then stage 1's step: the norm over the partitions summed over ranks, a skip on a non-finite
    norm whatever `bf16.check_grad_overflow` says (as official's BF16_Optimizer), clipping, Adam
    on the fp32 master partition; Phase 5 releases the fp32 gradients (official keeps them
    allocated, zeroed, between steps) before the partitions are all-gathered into the bf16 flat buffers.
"""

from __future__ import annotations

from typing import Optional

import torch

from zero_lab.nano.gradient_reduction import optional_bytes
from zero_lab.nano.placement import TensorKind
from zero_lab.nano.stage0 import parameter_gradient_bytes
from zero_lab.nano.stage1 import Stage1Optimizer
from zero_lab.nano.stages import FP32_ACCUMULATION
from zero_lab.nano.gradient_collection import GradientCollection


class Fp32Accumulation(GradientCollection):
    """bf16 gradients move into full-size fp32 gradients every micro-step; reduced at the boundary."""

    def __init__(self, optimizer):
        super().__init__(optimizer)
        self.fp32_gradients: list[Optional[torch.Tensor]] = [None] * len(optimizer.buffers)
        # Where each parameter's gradient goes: (buffer index, flat offset, elements).
        self.slice_of = {parameter: (index, offset, numel)
                         for index, buffer in enumerate(optimizer.buffers)
                         for parameter, offset, numel in zip(buffer.parameters, buffer.layout.offsets,
                                                             buffer.layout.parameter_numels)}
        self.hook_handles = []
        if optimizer.config.bf16.immediate_grad_update:
            self.hook_handles = [parameter.register_post_accumulate_grad_hook(self._move)
                                 for parameter in self.slice_of]

    def _fp32_gradients(self, index: int) -> torch.Tensor:
        if self.fp32_gradients[index] is None:
            numel = self.optimizer.buffers[index].layout.padded_numel
            self.fp32_gradients[index] = self.optimizer.placement.zeros(TensorKind.COMPUTE, numel, torch.float32)
        return self.fp32_gradients[index]

    @torch.no_grad()
    def _move(self, parameter: torch.nn.Parameter) -> None:
        """Phase 1 for one parameter: its bf16 gradient added into its fp32 slice, then released."""
        if parameter.grad is None:
            return
        index, offset, numel = self.slice_of[parameter]
        self._fp32_gradients(index)[offset:offset + numel].add_(parameter.grad.reshape(-1))
        parameter.grad = None

    def after_backward(self) -> None:
        """Phase 1 for every parameter still holding a gradient (all of them, unless the hooks of
        immediate_grad_update moved them during backward)."""
        for index in range(len(self.fp32_gradients)):
            self._fp32_gradients(index)  # a window whose ranks all got no gradient still reduces zeros
        for parameter in self.slice_of:
            self._move(parameter)

    def partition_of(self, index: int) -> torch.Tensor:
        """Buffer `index`'s gradient partition: this rank's slice of its fp32 gradients."""
        buffer = self.optimizer.buffers[index]
        return buffer.partition_of(self._fp32_gradients(index))

    def reduce_at_boundary(self) -> None:
        """Step Phase 1 = Phase 2: all-reduce every bucket of the fp32 gradients, keep this rank's share."""
        optimizer = self.optimizer
        bucket_numel = optimizer.config.zero_optimization.reduce_bucket_size
        in_place = optimizer.communication_dtype == torch.float32
        for index, buffer in enumerate(optimizer.buffers):
            gradients, partition = self._fp32_gradients(index), self.partition_of(index)
            for start, end in buffer.layout.bucket_ranges(bucket_numel):
                bucket = gradients[start:end] if in_place else gradients[start:end].to(optimizer.communication_dtype)
                optimizer.reducer.launch(buffer, bucket, start, end, partition, owns_bucket=not in_place)
        optimizer.reducer.finish_all()

    def release(self) -> None:
        self.fp32_gradients = [None] * len(self.fp32_gradients)
        for parameter in self.slice_of:
            parameter.grad = None

    def gradient_bytes(self) -> int:
        """Full-size gradients: the fp32 gradients, and any bf16 param.grad not yet moved."""
        return (sum(optional_bytes(gradients) for gradients in self.fp32_gradients)
                + parameter_gradient_bytes(self.optimizer.buffers))

    def destroy(self) -> None:
        for handle in self.hook_handles:
            handle.remove()
        self.hook_handles = []
        self.release()


class Stage1Fp32AccumulationOptimizer(Stage1Optimizer):
    """Stage 1 whose gradients accumulate in fp32 (`Fp32Accumulation`); the rest is stage 1's."""

    variant = FP32_ACCUMULATION
    GradientCollection = Fp32Accumulation

    def _uses_reduce_scatter(self) -> bool:
        return False  # official all-reduces the fp32 gradients whole

    def gradient_partition(self, index: int) -> torch.Tensor:
        """A view of the fp32 gradients, not a tensor of its own (so not in `gradient_partitions`)."""
        return self.gradient_collection.partition_of(index)
