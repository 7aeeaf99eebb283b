"""The gradient buckets stages 2 and 3 fill during backward (`stage2.ArrivalPacking`).

    RangeBucket:    a flat range [start, end) of one buffer's gradients, held as it lies in the
                    buffer; reduced with `BucketReducer.launch`, its share lands in a slice of the
                    buffer's gradient partition.
Every kind (stage 3 adds `persistent_reduction.SpanningBucket`, several whole buffers) answers the
same questions for the packing: which flat ranges it holds (`flat_ranges`, whose parameter pieces
it then expects, keyed (buffer index, parameter index)), where a piece's elements go in its values
(`slots`), and how it is reduced (`launch`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from zero_lab.nano.layout import ParameterPiece


@dataclass
class GradientBucket:
    """What both kinds share: the pieces expected and arrived, the values being filled."""

    expected: frozenset[tuple[int, int]] = field(default=frozenset(), init=False)  # (buffer index, parameter index) of its pieces
    arrived: set = field(default_factory=set, init=False)
    values: Optional[torch.Tensor] = field(default=None, init=False)
    launched: bool = field(default=False, init=False)

    @property
    def numel(self) -> int:
        raise NotImplementedError

    def flat_ranges(self) -> list[tuple[int, int, int]]:
        """What it holds: (buffer index, start, end) for each buffer it takes a flat range of."""
        raise NotImplementedError

    def slots(self, buffer_index: int, piece: ParameterPiece) -> list[tuple[int, int, int]]:
        """Where `piece` of buffer `buffer_index` goes: (offset in the values, offset in the piece, elements)."""
        raise NotImplementedError

    def launch(self, optimizer, accumulate: bool) -> None:
        """Hand the filled values to the optimizer's reducer (which frees them once reduced)."""
        raise NotImplementedError

    def label(self) -> str:
        """What its reduction is called in a collective record: the buffers and ranges it holds."""
        return "bucket " + " ".join(f"{index}[{start}:{end})" for index, start, end in self.flat_ranges())


@dataclass
class RangeBucket(GradientBucket):
    """Flat range [start, end) of buffer `buffer_index`, held as it lies in the buffer."""

    buffer_index: int
    start: int
    end: int

    @property
    def numel(self) -> int:
        return self.end - self.start

    def flat_ranges(self) -> list[tuple[int, int, int]]:
        return [(self.buffer_index, self.start, self.end)]

    def slots(self, buffer_index: int, piece: ParameterPiece) -> list[tuple[int, int, int]]:
        return [(piece.flat_start - self.start, 0, piece.numel)]

    def launch(self, optimizer, accumulate: bool) -> None:
        buffer = optimizer.buffers[self.buffer_index]
        whole = not accumulate and self.numel == buffer.layout.padded_numel  # a window's first share of all of it
        optimizer.reducer.launch(buffer, self.values, self.start, self.end,
                                 optimizer.gradient_partition(self.buffer_index, whole), accumulate=accumulate)
