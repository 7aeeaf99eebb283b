"""ZeRO stage 1: stage 0 with the optimizer partitioned.

The diff from stage 0, each part a method below:
    layout: each rank owns 1/world_size of every flat buffer (the stage table gives the partition
            count); its fp32 master, optimizer states and fp32 gradient partition cover that slice.
    reduce: gradients still accumulate in full-size `param.grad` during backward (stage 1
            partitions optimizer states, not gradients) and are still collected by stage 0's
            `BoundaryPacking` (kept, as its `GradientCollection` line says); at the boundary each
            bucket is reduce-scattered (or all-reduced and scattered back, with
            `reduce_scatter: false`), so each rank keeps only its partition's average. A
            reduce-scattered bucket is divided by the world size before the sum, as official
            DeepSpeed's stage 1/2 does (the stage table's `predivides`).
    norm:   each rank squares only its partition, so the sum is completed over ranks.
    publish: after Adam updates the partitions, every rank gathers everyone's into its full
            buffer (`after_step`), one in-place `all_gather_into_tensor` per buffer (as official
            DeepSpeed); every buffer's gather is started before any is waited on. That is how
            official's `_allgather_params_coalesced` gathers stage 3's persistent parameters (one
            buffer each in nano); its stage 1/2 gathers each group in turn, which on one NCCL
            stream comes to the same.
"""

from __future__ import annotations

import torch

from zero_lab.nano.stage0 import BoundaryPacking, Stage0Optimizer


class Stage1Optimizer(Stage0Optimizer):
    stage = 1
    GradientCollection = BoundaryPacking  # stage 0's: gradients wait in param.grad until the boundary

    def _uses_reduce_scatter(self) -> bool:
        return self.config.zero_optimization.reduce_scatter

    def _sum_over_ranks(self, squares: torch.Tensor) -> None:
        self.collectives.all_reduce(squares)

    def _publish_parameters(self) -> None:
        super()._publish_parameters()
        self._gather_updated_partitions()

    def _gather_updated_partitions(self) -> None:
        """Every buffer whole again after Adam updated this rank's partition of it."""
        in_flight = [buffer.after_step(self.collectives) for buffer in self.buffers]
        for work in in_flight:
            if work is not None:
                work.wait()
