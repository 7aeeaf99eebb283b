"""Stage 3's persistent buffers reduce their gradients together, in buckets spanning whole buffers.

Stage 2 cuts every flat buffer into range buckets. The buffers stage 3 has reduce together
(`Stage.reduces_whole_buffer_together`: the always-whole persistent ones, one small parameter each)
share buckets spanning them whole instead (`spanning_layout`), one reduce-scatter each, as official
DeepSpeed's `reduce_scatter_coalesced` reduces its bucket of parameters in one call. A
`SpanningBucket`'s share is every member's whole gradient partition, member after member.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from zero_lab.nano.gradient_buckets import GradientBucket, RangeBucket
from zero_lab.nano.layout import ParameterPiece
from zero_lab.nano.placement import TensorKind
from zero_lab.nano.spanning_layout import SpanningLayout, plan_buckets
from zero_lab.nano.stage2 import ArrivalPacking


@dataclass
class SpanningBucket(GradientBucket):
    """The whole buffers `members` (indices, in the layout's order), held rank-major (`layout`)."""

    members: tuple[int, ...]
    layout: SpanningLayout

    @property
    def numel(self) -> int:
        return self.layout.numel

    def flat_ranges(self) -> list[tuple[int, int, int]]:
        return [(index, 0, layout.padded_numel) for index, layout in zip(self.members, self.layout.members)]

    def slots(self, buffer_index: int, piece: ParameterPiece) -> list[tuple[int, int, int]]:
        return self.layout.positions(self.members.index(buffer_index), piece.flat_start, piece.numel)

    def launch(self, optimizer, accumulate: bool) -> None:
        """The share lands in the members' gradient partitions: added into each in a window's later
        backwards; in its first, the partitions are born as consecutive views of one tensor, the share
        itself (the reduce-scatter writes them all, nothing is copied member by member)."""
        share = self.layout.share_numel
        if accumulate:
            destinations = [optimizer.gradient_partition(index) for index in self.members]
        else:
            destinations = [optimizer.placement.empty(TensorKind.OPTIMIZER, share, torch.float32)]
            members = destinations[0].split([layout.partition_numel for layout in self.layout.members])
            for index, partition in zip(self.members, members):
                optimizer.gradient_partitions[index] = partition
        optimizer.reducer.launch_shares(self.values, [share] * self.layout.partition_count,
                                        optimizer.collectives.rank * share, destinations, accumulate=accumulate)


class SpanningArrivalPacking(ArrivalPacking):
    """Stage 2's packing whose buffers that reduce together share spanning buckets."""

    def plan_buckets(self, buffers: list, bucket_numel: int) -> list[GradientBucket]:
        """Phase 0: the range buckets of the buffers that join no group, buffer by buffer, then the
        groups of whole buffers (`spanning_layout.plan_buckets`, which `zero-lab explain` reads too)."""
        joins = [self.optimizer.stage_facts.reduces_whole_buffer_together(buffer.sharded) for buffer in buffers]
        ranges, groups = plan_buckets([buffer.layout for buffer in buffers], joins, bucket_numel)
        return ([RangeBucket(*bucket_range) for bucket_range in ranges]
                + [SpanningBucket(group, SpanningLayout(tuple(buffers[index].layout for index in group)))
                   for group in groups])
