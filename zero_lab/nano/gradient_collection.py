"""The interface between autograd's gradients and a stage's reducer, which each stage implements.

A stage collects its gradients either at the boundary, from `param.grad` (stages 0/1,
`stage0.BoundaryPacking`), or as they arrive during backward (stages 2/3, `stage2.ArrivalPacking`);
stage 1's fp32-accumulation variant moves them into fp32 after each backward and reduces those at
the boundary (`stage1_fp32_accumulation.Fp32Accumulation`).
`ZeroOptimizer` calls the same methods either way: `after_backward` after every backward,
`reduce_at_boundary` in the step's Phase 1, `release` once the window is over.
"""

from __future__ import annotations


class GradientCollection:
    """When and how a stage's gradients reach the reducer; each stage module defines its own, and
    says in both methods below where its reduction happens (during backward or at the boundary)."""

    def __init__(self, optimizer: "ZeroOptimizer"):
        self.optimizer = optimizer

    def after_backward(self) -> None:
        """After every engine.backward()."""
        raise NotImplementedError

    def reduce_at_boundary(self) -> None:
        """Step Phase 1: what is left to reduce, so that the gradient partitions are complete."""
        raise NotImplementedError

    def release(self) -> None:
        """The window is over (stepped, skipped or zero_grad): drop what it collected."""

    def gradient_bytes(self) -> int:
        """Bytes of full-size gradients this collection holds now (autograd's param.grad)."""
        return 0

    def filling_bucket_bytes(self) -> int:
        """Bytes of buckets still being filled."""
        return 0

    def destroy(self) -> None:
        self.release()
