"""ZeRO stage 0: plain data parallelism, written in the shape the higher stages share.

Every rank owns the whole flat buffer (one partition), so the master, the gradient partition and
the optimizer states are full size. Gradients:
    Phase 1 (backward): autograd accumulates into each `param.grad` as usual, over every
             micro-step of the window (allocated as backward reaches each parameter, as in
             official DeepSpeed, so the gradients never coexist with all the activations).
    Phase 2 (boundary): the static buckets (flat ranges of `reduce_bucket_size` elements, last
             parameters first) are packed from `param.grad` and reduced; every rank keeps its
             share, averaged, in its fp32 gradient partition. Stage 0 keeps everything, so when the
             gradients travel in fp32 a bucket is packed straight into the partition and
             all-reduced in place. Each `param.grad` is released once its last piece is packed.
"""

from __future__ import annotations

import torch

from zero_lab.nano.gradient_reduction import same_storage, optional_bytes
from zero_lab.nano.zero_optimizer import ZeroOptimizer


class Stage0Optimizer(ZeroOptimizer):
    stage = 0
    partitioned = False

    def _bucket_buffer(self, index: int, start: int, end: int) -> torch.Tensor:
        """Where bucket [start, end) is packed: the partition itself, or a buffer in the comm dtype."""
        if not self.partitioned and self.communication_dtype == torch.float32:
            return self.gradient_partition(index)[start:end]
        return torch.zeros(end - start, dtype=self.communication_dtype, device=self.groups[index].flat.device)

    def _complete_gradient_partitions(self) -> None:
        """Phase 2."""
        bucket_numel = self.config.zero_optimization.reduce_bucket_size
        for index, group in enumerate(self.groups):
            partition = self.gradient_partition(index)
            for start, end in group.layout.bucket_ranges(bucket_numel):
                bucket = self._bucket_buffer(index, start, end)
                for piece in group.layout.pieces(start, end):
                    gradient = group.parameters[piece.parameter_index].grad
                    if gradient is not None:
                        bucket[piece.flat_start - start:piece.flat_start - start + piece.numel].copy_(
                            gradient.reshape(-1)[piece.parameter_offset:piece.parameter_offset + piece.numel])
                    if piece.parameter_offset == 0:  # its last piece: buckets run back to front
                        group.parameters[piece.parameter_index].grad = None
                self.reducer.launch(group, bucket, start, end, partition,
                                    owns_bucket=not same_storage(bucket, partition))
        self.reducer.finish_all()

    def _release_gradients(self) -> None:
        for group in self.groups:
            for parameter in group.parameters:
                parameter.grad = None
        super()._release_gradients()

    def _gradient_bytes(self) -> dict[str, int]:
        full = {}
        for group in self.groups:
            for parameter in group.parameters:
                if parameter.grad is not None:
                    full[parameter.grad.untyped_storage().data_ptr()] = parameter.grad.untyped_storage().nbytes()
        return {"gradients": sum(full.values()), "gradient_partition": sum(map(optional_bytes, self.gradient_partitions))}
