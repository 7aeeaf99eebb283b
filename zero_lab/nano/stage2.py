"""ZeRO stage 2: stage 1 with the gradients partitioned during backward.

The diff from stage 1: there is no full gradient buffer. Gradients are collected as they arrive
(`ArrivalPacking`): each flat buffer is cut into static buckets of `reduce_bucket_size` elements
(last parameters first, the order backward produces them; a bucket may cut through a parameter;
stage 3 adds buckets spanning whole buffers, `persistent_reduction`).
Per micro-step:
    Phase 1 (hook): when autograd has accumulated a parameter's gradient, its pieces are added into
             their buckets (allocated on first use, in the communication dtype; a gradient that is a
             whole bucket becomes it) and `param.grad` is released at once.
    Phase 2 (bucket full): once every parameter of a bucket has arrived, the bucket is reduced
             (reduce-scatter, or all-reduce + scatter-back) and this rank adds its share, averaged,
             to its fp32 gradient partition (allocated at the window's first bucket, released after
             the optimizer step); the bucket is freed. With `overlap_comm` the reduction
             runs asynchronously while backward continues (at most two buckets in flight).
    Phase 3 (end of backward): buckets still waiting (parameters that got no gradient) are reduced
             with zeros in those places, and every pending reduction is finished.
Ranks must produce gradients for the same parameters in the same order (the same graph), as in
DeepSpeed; the buckets are identical on every rank because they are fixed at construction.
"""

from __future__ import annotations

import torch

from zero_lab.nano.collectives import labelled
from zero_lab.nano.errors import NanoConfigError
from zero_lab.nano.gradient_buckets import GradientBucket, RangeBucket
from zero_lab.nano.gradient_reduction import optional_bytes
from zero_lab.nano.placement import TensorKind
from zero_lab.nano.stage1 import Stage1Optimizer
from zero_lab.nano.zero_optimizer import GradientCollection


class ArrivalPacking(GradientCollection):
    """Gradients move into buckets as autograd produces them; full buckets are reduced at once."""

    def __init__(self, optimizer):
        super().__init__(optimizer)
        bucket_numel = optimizer.config.zero_optimization.reduce_bucket_size
        buffers = optimizer.buffers
        # Phase 0 (construction): the buckets, fixed for the engine's life.
        self.buckets: list[GradientBucket] = self.plan_buckets(buffers, bucket_numel)
        self.pieces_of: dict[torch.nn.Parameter, list[tuple[GradientBucket, tuple[int, int], list]]] = {}
        for bucket in self.buckets:
            expected = set()
            for buffer_index, start, end in bucket.flat_ranges():
                buffer = buffers[buffer_index]
                for piece in buffer.layout.pieces(start, end):
                    expected.add(key := (buffer_index, piece.parameter_index))
                    slots = [(at, piece.parameter_offset + inside, n) for at, inside, n in bucket.slots(buffer_index, piece)]
                    self.pieces_of.setdefault(buffer.parameters[piece.parameter_index], []).append((bucket, key, slots))
            bucket.expected = frozenset(expected)
        self.hook_handles = [parameter.register_post_accumulate_grad_hook(self._on_gradient_ready)
                             for parameter in self.pieces_of]
        self.window_reduced = False  # has a backward of this window reduced into the partitions yet?

    def plan_buckets(self, buffers: list, bucket_numel: int) -> list[GradientBucket]:
        """Phase 0: each buffer cut into range buckets (`FlatLayout.bucket_ranges`), buffer by buffer."""
        return [RangeBucket(index, start, end) for index, buffer in enumerate(buffers)
                for start, end in buffer.layout.bucket_ranges(bucket_numel)]

    def _on_gradient_ready(self, parameter: torch.nn.Parameter) -> None:
        """Phase 1 (and Phase 2 for every bucket this gradient completes)."""
        if parameter.grad is None:  # nothing accumulated (e.g. a hook fired by another engine's use)
            return
        with torch.no_grad():
            gradient = parameter.grad.reshape(-1)  # contiguous; a bucket only if all of its storage (not a view of a cat's)
            own = gradient.dtype == self.optimizer.communication_dtype and gradient.untyped_storage().nbytes() == gradient.nbytes
            for bucket, key, slots in self.pieces_of[parameter]:
                if bucket.launched:
                    raise RuntimeError(f"parameter {self.optimizer.parameter_names.get(parameter, '?')} produced a "
                                       "second gradient after its bucket was reduced in this backward; stage 2 needs "
                                       "one gradient per parameter per backward")
                if slots == [(0, 0, bucket.numel)] == [(0, 0, gradient.numel())] and own:
                    bucket.values = gradient  # stage 3's unit of one parameter: its gradient is the bucket
                else:
                    values = self._values(bucket)
                    for bucket_offset, source, numel in slots:  # a piece that is its whole gradient: no slice
                        piece = gradient if numel == gradient.numel() else gradient[source:source + numel]
                        values[bucket_offset:bucket_offset + numel].add_(piece)
                bucket.arrived.add(key)
                if len(bucket.arrived) == len(bucket.expected):  # every key arrived is an expected one
                    self._launch(bucket)
        parameter.grad = None

    def _values(self, bucket: GradientBucket) -> torch.Tensor:
        if bucket.values is None:
            bucket.values = self.optimizer.placement.zeros(TensorKind.COMPUTE, bucket.numel,
                                                           self.optimizer.communication_dtype)
        return bucket.values

    def _launch(self, bucket: GradientBucket) -> None:
        self._values(bucket)  # a bucket none of whose gradients arrived is reduced as zeros
        bucket.launched = True
        with labelled(bucket.label()):
            bucket.launch(self.optimizer, accumulate=self.window_reduced)
        bucket.values = None  # the reducer holds it until the reduction is finished

    def after_backward(self) -> None:
        """Phase 3: reduce what is left, in the fixed bucket order, and finish every reduction."""
        optimizer = self.optimizer
        for bucket in self.buckets:
            if bucket.launched:
                continue
            missing = bucket.expected - bucket.arrived
            if missing and not optimizer.config.zero_optimization.ignore_unused_parameters:
                buffer_index, parameter_index = min(missing)
                name = optimizer.parameter_names.get(optimizer.buffers[buffer_index].parameters[parameter_index], "?")
                raise NanoConfigError(f"parameter {name} got no gradient in this backward; set "
                                      "zero_optimization.ignore_unused_parameters to true or use it in the loss")
            self._launch(bucket)
        optimizer.reducer.finish_all()
        self.window_reduced = True
        for bucket in self.buckets:
            bucket.arrived.clear()
            bucket.launched = False

    def reduce_at_boundary(self) -> None:
        """Step Phase 1: nothing left to reduce: every bucket was reduced during backward (Phase 3)."""

    def release(self) -> None:
        self.window_reduced = False

    def filling_bucket_bytes(self) -> int:
        return sum(optional_bytes(bucket.values) for bucket in self.buckets)

    def destroy(self) -> None:
        for handle in self.hook_handles:
            handle.remove()
        self.hook_handles = []
        for bucket in self.buckets:
            bucket.values, bucket.launched = None, False
            bucket.arrived.clear()
        self.release()


class Stage2Optimizer(Stage1Optimizer):
    stage = 2
    GradientCollection = ArrivalPacking
