"""An allocation the device refused, told in one line: which rank, in which phase, with what figures.

A `torch.OutOfMemoryError` (CUDA's caching allocator), a CPU allocator's refusal (`RuntimeError:
... DefaultCPUAllocator: can't allocate memory`), Python's `MemoryError`, or CUDA's own refusal
outside the caching allocator would otherwise end a rank with a traceback wall. CUDA's own refusal
comes as a `RuntimeError` (`torch.AcceleratorError` in torch 2.8 and later) that reads "CUDA error:
out of memory" (a pinned host allocation, cuBLAS creating its handle: `CUBLAS_STATUS_ALLOC_FAILED`),
or as NCCL's `DistBackendError` ("... Last error: Cuda failure 2 'out of memory'") when NCCL could
not allocate its buffers. The harness instead:

Phase 1: the training loop marks where each rank is (`workload.step_phase`: start-up, then
         forward, backward and step for every micro-step);
Phase 2: turns the error into `OutOfMemory`, whose message is one line:
         `out of memory: rank 1 in backward: tried to allocate 2.0 GB; allocated 74.1 GB, reserved
         76.3 GB of 79.2 GB; peak live 75.0 GB this step` - the size asked (from the error's own
         text), the allocator's figures (on CPU: the live tensor bytes and the resident set) and
         the peak live bytes the memory meter saw since the last step's sample;
Phase 3: prints it on the rank's stderr and exits with EXIT_OUT_OF_MEMORY (4), which the CLI
         reports as `failure: out_of_memory` with that line.

No torch import here at module level: the launcher reads the exit code and prefix without it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from zero_lab.workload.log_contract.log_lines import size_text
from zero_lab.workload.step_phase import Phase

EXIT_OUT_OF_MEMORY = 4
MESSAGE_PREFIX = "out of memory:"
UNITS = {"B": 1, "bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
# CUDA: "Tried to allocate 20.00 MiB"; the CPU allocator: "you tried to allocate 1073741824 bytes"
REQUESTED = re.compile(r"tried to allocate\s+([\d.]+)\s*(bytes|B|KiB|MiB|GiB|TiB)", re.IGNORECASE)


# What a RuntimeError (or its subclasses AcceleratorError and NCCL's DistBackendError) says when an
# allocation was refused: the CPU allocator; CUDA and NCCL ("Cuda failure 2 'out of memory'"); cuBLAS.
REFUSED_ALLOCATION = re.compile(r"can't allocate memory|out of memory|CUBLAS_STATUS_ALLOC_FAILED", re.IGNORECASE)


def is_out_of_memory(error: BaseException) -> bool:
    """An allocation the device refused: torch's OutOfMemoryError, MemoryError, or a RuntimeError
    whose text says so (the CPU allocator, CUDA itself, NCCL, cuBLAS; the module docstring)."""
    if isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError":
        return True
    return isinstance(error, RuntimeError) and REFUSED_ALLOCATION.search(str(error)) is not None


def requested_bytes(text: str) -> int | None:
    """The size the failed allocation asked for, read from the error's text (None: not said)."""
    found = REQUESTED.search(text)
    if found is None:
        return None
    return int(float(found.group(1)) * UNITS[found.group(2) if found.group(2) in UNITS else "B"])


@dataclass(frozen=True)
class AllocatorFigures:
    """What the allocator held when it refused (bytes): live tensors, reserved (CPU: the resident
    set), the device's total (None on CPU), and the meter's peak of live bytes since its last sample."""

    allocated: int
    reserved: int
    total: int | None
    peak_live: int | None


def out_of_memory_line(rank: int, phase: Phase, error_text: str, figures: AllocatorFigures) -> str:
    """Phase 2's one line."""
    reserved = size_text(figures.reserved) + (f" of {size_text(figures.total)}" if figures.total else "")
    reserved_name = "reserved" if figures.total else "resident"
    peak = f"; peak live {size_text(figures.peak_live)} this step" if figures.peak_live is not None else ""
    asked = size_text(requested_bytes(error_text))
    return (f"{MESSAGE_PREFIX} rank {rank} in {phase.value}: tried to allocate {asked}; "
            f"allocated {size_text(figures.allocated)}, {reserved_name} {reserved}{peak}")


class OutOfMemory(Exception):
    """A refused allocation, as one line (Phase 2); the harness prints it and exits EXIT_OUT_OF_MEMORY."""


def allocator_figures(device, meter) -> AllocatorFigures:
    """The allocator's figures now on device (a torch.device), with the meter's peak (meter may be None).
    On CUDA every figure is the caching allocator's own count or the device's fixed size: nothing
    here asks the device, which may be in an error state after a refusal inside CUDA or NCCL."""
    import torch

    from zero_lab.workload.meters.memory_meter import resident_bytes

    peak = meter.peak_bytes() if meter is not None else None
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        return AllocatorFigures(torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device), total, peak)
    live = meter.live_bytes() if meter is not None else 0
    return AllocatorFigures(live, resident_bytes(), None, peak)
