"""Where each kind of tensor lives, decided once per engine from the config (FSDP2's offload policy).

The mechanism (flat buffers, reducer, Adam) asks the placement where to put a kind of tensor and
how to move it; it never tests an offload flag itself. The kinds: compute (flat parameter buffers,
gathered units, full gradients, buckets), partition (stage 3's parameter partitions between uses)
and optimizer (fp32 master, optimizer-state and gradient partitions). `Placement` keeps every kind
on the device, where forward and backward run (the GPU under nccl, the CPU under gloo): a run that
offloads nothing. `offload/placement.py`'s `OffloadPlacement` puts the offloaded kinds on the host
(FSDP2's `CPUOffloadPolicy`); `initialize` picks one, and both answer the same questions.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Callable

import torch


class TensorKind(str, Enum):
    """The kinds of tensor the module docstring places; equal to its old string names."""

    COMPUTE = "compute"
    PARTITION = "partition"
    OPTIMIZER = "optimizer"


@dataclass(frozen=True)
class Placement:
    device: torch.device

    def place(self, kind: TensorKind) -> str:
        """'device' or 'host' for a kind of tensor: every kind on the device."""
        return "device"

    def torch_device(self, kind: TensorKind) -> torch.device:
        return self.device

    def empty(self, kind: TensorKind, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A new uninitialised tensor of `kind`, where that kind lives."""
        return torch.empty(numel, dtype=dtype, device=self.torch_device(kind))

    def zeros(self, kind: TensorKind, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return self.empty(kind, numel, dtype).zero_()

    def master_for(self, partition: torch.Tensor, partition_kind: TensorKind) -> torch.Tensor:
        """The fp32 master Adam updates: the partition itself when it is fp32 and lives where
        optimizer tensors live (no copy), else an fp32 copy in the optimizer's place."""
        if partition.dtype == torch.float32 and self.place(partition_kind) == self.place(TensorKind.OPTIMIZER):
            return partition
        return self.empty(TensorKind.OPTIMIZER, partition.numel(), torch.float32).copy_(partition)

    def copy(self, destination: torch.Tensor, source: torch.Tensor) -> None:
        """destination <- source (within the device: one copy)."""
        destination.copy_(source)

    def land(self, reduction, store: Callable, in_flight: int) -> None:
        """A reduced share into its gradient partitions (`store(reduction, share)`): here at once, on
        the device; an offloaded partition's copy may be queued (`OffloadPlacement.land`)."""
        store(reduction, reduction.share)

    def land_all(self) -> None:
        """Store every share `land` queued: none here."""

    def stage_in(self, partition: torch.Tensor) -> torch.Tensor:
        """A parameter partition where a gather can send it from: on the device, itself."""
        return partition
