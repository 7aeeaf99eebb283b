"""A gradient bucket that spans whole flat buffers: which buffers go together, and where each element lies.

Most buckets are a flat range of one buffer (`FlatLayout.bucket_ranges`). Stage 3's persistent
buffers are each small (one persistent parameter), and reducing each by itself costs one call
apiece; official DeepSpeed's `reduce_scatter_coalesced` (runtime/comm/coalesced_collectives.py)
reduces them all in one call. So a bucket may also span several whole buffers, laid out rank-major:
    Phase 1 (grouping, `spanning_groups`): the buffers that join (a policy of the stage), in buffer
             order, packed into groups of at most `reduce_bucket_size` elements; a buffer larger than
             that alone keeps its own range buckets.
    Phase 2 (rank-major layout, `SpanningLayout`): rank r's share of the bucket is every member's
             r-th partition, member after member; the shares follow each other in rank order. Every
             share has the same length (a buffer's partitions are equal), so one reduce-scatter
             hands rank r exactly its own partitions of every member, in order: the share is
             the members' gradient partitions (`persistent_reduction` makes them views of it).
Pure arithmetic: the engine (`persistent_reduction`) and `zero-lab explain` read the same layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from zero_lab.nano.layout import FlatLayout


def spanning_groups(padded_numels: list[int], joins: list[bool], bucket_numel: int) -> list[tuple[int, ...]]:
    """Phase 1: the indices of the buffers that join, in order, packed into groups whose padded
    elements add up to at most `bucket_numel`; a joining buffer larger than `bucket_numel` joins none."""
    groups: list[tuple[int, ...]] = []
    current: list[int] = []
    filled = 0
    for index, (numel, joining) in enumerate(zip(padded_numels, joins)):
        if not joining or numel > bucket_numel:
            continue
        if current and filled + numel > bucket_numel:
            groups.append(tuple(current))
            current, filled = [], 0
        current.append(index)
        filled += numel
    if current:
        groups.append(tuple(current))
    return groups


def plan_buckets(layouts: list[FlatLayout], joins: list[bool],
                 bucket_numel: int) -> tuple[list[tuple[int, int, int]], list[tuple[int, ...]]]:
    """Every gradient bucket of a list of buffers, in the order they are built: (buffer index,
    start, end) of each range bucket of the buffers that join no group, buffer by buffer
    (`FlatLayout.bucket_ranges`), then the groups of whole buffers (`spanning_groups`). The engine
    (`persistent_reduction.SpanningArrivalPacking`) and `zero-lab explain` both read this plan."""
    groups = spanning_groups([layout.padded_numel for layout in layouts], joins, bucket_numel)
    spanned = {index for group in groups for index in group}
    ranges = [(index, start, end) for index, layout in enumerate(layouts) if index not in spanned
              for start, end in layout.bucket_ranges(bucket_numel)]
    return ranges, groups


@dataclass(frozen=True)
class SpanningLayout:
    """Phase 2: the rank-major layout of a bucket made of whole buffers (`members`, in order)."""

    members: tuple[FlatLayout, ...]

    @cached_property
    def member_offsets(self) -> tuple[int, ...]:
        """Where each member's partition starts inside a rank's share."""
        starts, running = [], 0
        for layout in self.members:
            starts.append(running)
            running += layout.partition_numel
        return tuple(starts)

    @cached_property
    def share_numel(self) -> int:
        """Elements of one rank's share: one partition of every member."""
        return sum(layout.partition_numel for layout in self.members)

    @property
    def partition_count(self) -> int:
        return self.members[0].partition_count

    @cached_property
    def numel(self) -> int:
        return self.share_numel * self.partition_count

    def positions(self, member: int, flat_start: int, numel: int) -> list[tuple[int, int, int]]:
        """Where member `member`'s flat range [flat_start, flat_start + numel) lies in the bucket:
        (bucket offset, offset inside the range, elements), one per partition it crosses."""
        layout = self.members[member]
        found = []
        position, end = flat_start, flat_start + numel
        while position < end:
            owner = position // layout.partition_numel
            high = min(end, (owner + 1) * layout.partition_numel)
            inside_partition = position - owner * layout.partition_numel
            bucket_offset = owner * self.share_numel + self.member_offsets[member] + inside_partition
            found.append((bucket_offset, position - flat_start, high - position))
            position = high
        return found
