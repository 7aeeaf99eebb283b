"""`deepspeed.accelerator.get_accelerator()`: the device nano computes on, under DeepSpeed's names.

nano runs where its collectives communicate: CUDA with nccl when torch sees a GPU, else the CPU
with gloo (`zero_lab.nano.facade.distributed.default_backend`). Clients ask this object for device names
(transformers, to place the buffers it broadcasts while loading a ZeRO-3 model).
"""

from __future__ import annotations

import os
from typing import Optional

import torch

from zero_lab.nano.facade.distributed import default_backend


class Accelerator:
    """CUDA or CPU, whichever nano's backend uses; the subset of DeepSpeed's accelerator clients call."""

    def __init__(self):
        self._name = "cuda" if default_backend() == "nccl" else "cpu"

    def device_name(self, device_index: Optional[int] = None) -> str:
        if self._name == "cpu" or device_index is None:
            return self._name
        return f"{self._name}:{device_index}"

    def current_device(self) -> int:
        return torch.cuda.current_device() if self._name == "cuda" else int(os.environ.get("LOCAL_RANK", 0))

    def current_device_name(self) -> str:
        return self.device_name(torch.cuda.current_device()) if self._name == "cuda" else "cpu"

    def device_count(self) -> int:
        return torch.cuda.device_count() if self._name == "cuda" else 1

    def is_available(self) -> bool:
        return True

    def communication_backend_name(self) -> str:
        return default_backend()

    def synchronize(self, device_index: Optional[int] = None) -> None:
        if self._name == "cuda":
            torch.cuda.synchronize(device_index)

    def empty_cache(self) -> None:
        if self._name == "cuda":
            torch.cuda.empty_cache()

    def is_bf16_supported(self) -> bool:
        return torch.cuda.is_bf16_supported() if self._name == "cuda" else True

    def is_fp16_supported(self) -> bool:
        return True

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)


_ACCELERATOR: Optional[Accelerator] = None


def get_accelerator() -> Accelerator:
    global _ACCELERATOR
    if _ACCELERATOR is None:
        _ACCELERATOR = Accelerator()
    return _ACCELERATOR
