"""Where each kind of tensor lives, decided once per engine (FSDP2's offload policy, nano's size).

The mechanism (flat buffers, reducer, Adam) asks the placement for a device; it never tests a flag
itself. Without offload everything lives on the compute device: the GPU under nccl, the CPU under
gloo. Kinds:
    compute:   flat parameter buffers, gradients and communication buckets (used by forward/backward);
    optimizer: fp32 master partitions, optimizer-state partitions, and the gradient partitions Adam
               reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Placement:
    compute: torch.device
    optimizer: torch.device
    pin_memory: bool = False  # host tensors page-locked, for asynchronous copies to and from a GPU

    @classmethod
    def on(cls, device: torch.device) -> "Placement":
        """Everything on one device: nano's placement without offload."""
        return cls(compute=device, optimizer=device)

    def empty(self, kind: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A new uninitialised tensor of `kind` ('compute' or 'optimizer'), where that kind lives."""
        device = getattr(self, kind)
        pin = self.pin_memory and device.type == "cpu" and torch.cuda.is_available()
        return torch.empty(numel, dtype=dtype, device=device, pin_memory=pin)

    def zeros(self, kind: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return self.empty(kind, numel, dtype).zero_()
