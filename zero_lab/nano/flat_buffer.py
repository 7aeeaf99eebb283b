"""The flat parameter buffer of one parameter group, and the arithmetic of its partitions.

Phase 1 (layout): parameters are laid end to end in registration order; the length is padded with
         zeros up to a multiple of `partition_count` (1 at stage 0, world size above).
Phase 2 (move in): each parameter's values are copied into its slice and `param.data` becomes a
         view of it, so each original storage is freed as soon as it is copied. Start-up holds the
         flat buffer beside the not-yet-moved originals (as official DeepSpeed's flattening does),
         never a further copy; parameters are marked, so a second engine cannot adopt them.
Phase 3 (partitions): rank r owns elements [r * partition_numel, (r + 1) * partition_numel).
         A partition may cut through a parameter; `owner_ranges` and `pieces` answer "who owns
         which part of this range" and "which parameter pieces does this range hold".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ParameterPiece:
    """The part of one parameter that falls inside a flat range."""

    parameter_index: int
    parameter_offset: int  # first element of the piece inside the flattened parameter
    flat_start: int  # where the piece starts in the flat buffer
    numel: int


class FlatParameterGroup:
    """One parameter group's parameters as views into a single padded flat buffer."""

    def __init__(self, parameters: list[torch.nn.Parameter], partition_count: int, rank: int,
                 dtype: torch.dtype, device: torch.device):
        # Phase 1: layout.
        self.parameters = parameters
        self.offsets: list[int] = []
        running = 0
        for parameter in parameters:
            self.offsets.append(running)
            running += parameter.numel()
        self.numel = running
        self.partition_count = partition_count
        self.padded_numel = -(-running // partition_count) * partition_count
        self.partition_numel = self.padded_numel // partition_count
        self.rank = rank
        self.partition_start = rank * self.partition_numel if partition_count > 1 else 0
        self.partition_end = self.partition_start + self.partition_numel
        # Phase 2: move the parameters in.
        self.flat = torch.zeros(self.padded_numel, dtype=dtype, device=device)
        for parameter, offset in zip(parameters, self.offsets):
            view = self.flat[offset:offset + parameter.numel()]
            view.copy_(parameter.data.reshape(-1))
            parameter.data = view.view_as(parameter)
            parameter.zero_lab_flat_buffer = True

    # Phase 3: partition arithmetic.
    def partition_of(self, buffer: torch.Tensor) -> torch.Tensor:
        """This rank's partition of a full-length flat buffer (parameters or gradients)."""
        return buffer[self.partition_start:self.partition_end]

    def owner_ranges(self, start: int, end: int) -> list[tuple[int, int]]:
        """For each rank, the sub-range of [start, end) inside its partition (empty ranges as (x, x))."""
        if self.partition_count == 1:
            return [(start, end)]
        ranges = []
        for owner in range(self.partition_count):
            low = max(start, owner * self.partition_numel)
            high = min(end, (owner + 1) * self.partition_numel)
            ranges.append((low, max(low, high)))
        return ranges

    def pieces(self, start: int, end: int) -> list[ParameterPiece]:
        """The parameter pieces inside the flat range [start, end), in flat order."""
        found = []
        for index, (parameter, offset) in enumerate(zip(self.parameters, self.offsets)):
            low, high = max(start, offset), min(end, offset + parameter.numel())
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
