"""Where each kind of tensor lives, decided once per engine from the config (FSDP2's offload policy).

The mechanism (flat buffers, reducer, Adam) asks the placement where to put a tensor and how to
move it; it never tests an offload flag itself. There are two places:
    device: where forward and backward run (the GPU under nccl, the CPU under gloo);
    host:   CPU memory for offloaded tensors. On a CPU-only machine host and device are the same
            memory, but an offloaded tensor takes the same path as on a GPU: its own copy, moved
            by the same calls.
Kinds of tensor and their place:
    compute:   flat parameter buffers, gathered units, full gradients and buckets: the device.
    partition: stage 3's parameter partitions between uses: the host with `offload_param`.
    optimizer: fp32 master partitions, optimizer states and fp32 gradient partitions: the host
               with `offload_optimizer`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

HOST = torch.device("cpu")


@dataclass(frozen=True)
class Placement:
    device: torch.device
    offload_optimizer: bool = False
    offload_parameters: bool = False
    pin_memory: bool = False  # asked for; honoured only where CUDA can use page-locked memory

    def place(self, kind: str) -> str:
        """'device' or 'host' for a kind of tensor."""
        offloaded = {"compute": False, "partition": self.offload_parameters, "optimizer": self.offload_optimizer}[kind]
        return "host" if offloaded else "device"

    def torch_device(self, kind: str) -> torch.device:
        return HOST if self.place(kind) == "host" else self.device

    @property
    def pins(self) -> bool:
        """Whether host tensors are page-locked (asynchronous copies); never without CUDA."""
        return self.pin_memory and torch.cuda.is_available()

    def empty(self, kind: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A new uninitialised tensor of `kind`, where that kind lives."""
        pinned = self.pins and self.place(kind) == "host"
        return torch.empty(numel, dtype=dtype, device=self.torch_device(kind), pin_memory=pinned)

    def zeros(self, kind: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return self.empty(kind, numel, dtype).zero_()

    def master_for(self, partition: torch.Tensor, partition_kind: str) -> torch.Tensor:
        """The fp32 master Adam updates: the partition itself when it is fp32 and lives where
        optimizer tensors live (no copy), else an fp32 copy in the optimizer's place."""
        if partition.dtype == torch.float32 and self.place(partition_kind) == self.place("optimizer"):
            return partition
        return self.empty("optimizer", partition.numel(), torch.float32).copy_(partition)

    def copy(self, destination: torch.Tensor, source: torch.Tensor) -> None:
        """destination <- source across places (asynchronous from pinned host memory)."""
        destination.copy_(source, non_blocking=self.pins)

    def stage_in(self, partition: torch.Tensor) -> torch.Tensor:
        """A parameter partition where a gather can send it from: itself on the device, or a device
        copy of an offloaded one (freed by the caller once the gather is done)."""
        if self.place("partition") == "device":
            return partition
        local = torch.empty(partition.numel(), dtype=partition.dtype, device=self.device)
        self.copy(local, partition)
        return local
