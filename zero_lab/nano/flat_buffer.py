"""The flat parameter buffer of one parameter group: the tensor its parameters are views of.

Phase 1 (layout): `layout.FlatLayout` says where each parameter goes, how much padding follows and
         which range this rank owns.
Phase 2 (move in): each parameter's values are copied into its slice and `param.data` becomes a
         view of it, so each original storage is freed as soon as it is copied. Start-up holds the
         flat buffer beside the not-yet-moved originals (as official DeepSpeed's flattening does),
         never a further copy; parameters are marked, so a second engine cannot adopt them.
"""

from __future__ import annotations

import torch

from zero_lab.nano.layout import FlatLayout


class FlatParameterGroup:
    """One parameter group's parameters as views into a single padded flat buffer."""

    def __init__(self, parameters: list[torch.nn.Parameter], layout: FlatLayout, rank: int,
                 dtype: torch.dtype, device: torch.device):
        # Phase 1
        self.parameters = parameters
        self.layout = layout
        self.rank = rank
        self.partition_start, self.partition_end = layout.partition_range(rank)
        # Phase 2
        self.flat = torch.zeros(layout.padded_numel, dtype=dtype, device=device)
        for parameter, offset in zip(parameters, layout.offsets):
            view = self.flat[offset:offset + parameter.numel()]
            view.copy_(parameter.data.reshape(-1))
            parameter.data = view.view_as(parameter)
            parameter.zero_lab_flat_buffer = True

    @property
    def partition_count(self) -> int:
        return self.layout.partition_count

    @property
    def partition_numel(self) -> int:
        return self.layout.partition_numel

    def partition_of(self, buffer: torch.Tensor) -> torch.Tensor:
        """This rank's partition of a full-length flat buffer (parameters or gradients)."""
        return buffer[self.partition_start:self.partition_end]
