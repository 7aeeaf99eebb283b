"""Where every element of a flat buffer lives and which rank owns it: pure arithmetic, no tensors.

The engine (flat buffers, buckets), the memory formula and checkpoints all read this one layout.

Phase 1 (order): parameters are laid end to end in the order given; `offsets[i]` is where
         parameter i starts.
Phase 2 (padding): the length is padded with zeros up to a multiple of `alignment`, which is a
         multiple of `partition_count`, so every partition has the same length.
Phase 3 (ownership): rank r owns [r * partition_numel, (r + 1) * partition_numel). A partition
         may cut through a parameter; `owner_ranges` and `pieces` answer "who owns which part of
         this range" and "which parameter pieces does this range hold".

Alignment and partition count are facts of the stage (`stages.Stage.flat_alignment`,
`partition_count`), which follow official DeepSpeed so that partitions line up rank for rank with
its files.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from zero_lab.nano import stages


def flat_alignment(stage: int, precision: str, world_size: int) -> int:
    """The multiple a group's flat buffer is padded to, as official DeepSpeed pads it (the stage says)."""
    return stages.of(stage).flat_alignment(precision, world_size)


def partition_count(stage: int, world_size: int) -> int:
    """Stage 0 keeps the whole buffer as one partition; the higher stages cut it in world_size."""
    return stages.of(stage).partition_count(world_size)


@dataclass(frozen=True)
class ParameterPiece:
    """The part of one parameter that falls inside a flat range."""

    parameter_index: int
    parameter_offset: int  # first element of the piece inside the flattened parameter
    flat_start: int  # where the piece starts in the flat buffer
    numel: int


@dataclass(frozen=True)
class FlatLayout:
    """The layout of one flat buffer: its parameters' sizes, its padding and its partitions."""

    parameter_numels: tuple[int, ...]
    partition_count: int
    alignment: int

    def __post_init__(self):
        if self.alignment % self.partition_count:
            raise ValueError(f"alignment {self.alignment} is not a multiple of {self.partition_count} partitions")

    @classmethod
    def for_stage(cls, parameter_numels: tuple[int, ...], stage: int, precision: str, world_size: int) -> "FlatLayout":
        return cls(tuple(parameter_numels), partition_count(stage, world_size),
                   flat_alignment(stage, precision, world_size))

    # Phase 1
    @cached_property
    def offsets(self) -> tuple[int, ...]:
        starts, running = [], 0
        for numel in self.parameter_numels:
            starts.append(running)
            running += numel
        return tuple(starts)

    @cached_property
    def numel(self) -> int:
        """Elements of the parameters themselves, padding excluded."""
        return sum(self.parameter_numels)

    # Phase 2
    @cached_property
    def padded_numel(self) -> int:
        return -(-self.numel // self.alignment) * self.alignment

    # Phase 3
    @cached_property
    def partition_numel(self) -> int:
        return self.padded_numel // self.partition_count

    def partition_range(self, rank: int) -> tuple[int, int]:
        """The flat range rank `rank` owns (the whole buffer when there is one partition)."""
        owner = rank if self.partition_count > 1 else 0
        return owner * self.partition_numel, (owner + 1) * self.partition_numel

    def owner_ranges(self, start: int, end: int) -> list[tuple[int, int]]:
        """For each partition, the sub-range of [start, end) inside it (empty ranges as (x, x))."""
        ranges = []
        for owner in range(self.partition_count):
            low = max(start, owner * self.partition_numel)
            high = min(end, (owner + 1) * self.partition_numel)
            ranges.append((low, max(low, high)))
        return ranges

    def pieces(self, start: int, end: int) -> list[ParameterPiece]:
        """The parameter pieces inside the flat range [start, end), in flat order."""
        found = []
        for index, (numel, offset) in enumerate(zip(self.parameter_numels, self.offsets)):
            low, high = max(start, offset), min(end, offset + numel)
            if low < high:
                found.append(ParameterPiece(index, low - offset, low, high - low))
        return found

    def bucket_ranges(self, bucket_numel: int) -> list[tuple[int, int]]:
        """Flat ranges of at most `bucket_numel` elements, last range first (the order backward
        produces gradients in); the padding rides in the first range returned."""
        ranges = []
        end = self.padded_numel
        while end > 0:
            start = max(0, end - bucket_numel)
            ranges.append((start, end))
            end = start
        return ranges
