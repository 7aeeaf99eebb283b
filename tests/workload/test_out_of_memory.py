"""A refused allocation as one line (zero_lab/workload/faults/out_of_memory.py): the size asked read from
CUDA's and the CPU allocator's own messages, the figures, and which errors count."""

from __future__ import annotations

import pytest
import torch

from zero_lab.workload.faults.out_of_memory import (MESSAGE_PREFIX, AllocatorFigures, is_out_of_memory, out_of_memory_line,
                                                    requested_bytes)
from zero_lab.workload.step_phase import Phase, StepPhase

GB, MB = 2**30, 2**20
# torch 2.x's CUDA caching allocator message, as it raises it
CUDA_TEXT = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
             "1.21 GiB is free. Of the allocated memory 74.12 GiB is allocated by PyTorch, and 2.20 GiB is reserved "
             "by PyTorch but unallocated.")


def the_cpu_allocators_refusal() -> RuntimeError:
    """The real error: 2^62 bytes is more than any machine's address space, refused at once, nothing touched."""
    with pytest.raises(RuntimeError) as caught:
        torch.empty(2**62, dtype=torch.uint8)
    return caught.value


def test_the_size_asked_is_read_from_cuda_and_cpu_messages():
    assert requested_bytes(CUDA_TEXT) == 2 * GB
    assert requested_bytes("Tried to allocate 20.00 MiB (GPU 0; 15.90 GiB total capacity)") == 20 * MB
    assert requested_bytes(str(the_cpu_allocators_refusal())) == 2**62
    assert requested_bytes("something else") is None


# CUDA's own refusal outside the caching allocator (a pinned host allocation), as torch raises it
CUDA_ERROR_TEXT = ("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some other "
                   "API call, so the stacktrace below might be incorrect.\nFor debugging consider passing "
                   "CUDA_LAUNCH_BLOCKING=1")
# NCCL failing to allocate its buffers, as ProcessGroupNCCL raises it
NCCL_TEXT = ("NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, unhandled cuda error "
             "(run with NCCL_DEBUG=INFO for details), NCCL version 2.27.5\nncclUnhandledCudaError: Call to CUDA "
             "function failed.\nLast error:\nCuda failure 2 'out of memory'")
NCCL_OTHER_TEXT = ("NCCL error in: ProcessGroupNCCL.cpp:3356, remote process exited or there was a network error, "
                   "NCCL version 2.27.5\nncclRemoteError: A call failed possibly due to a network error")


def test_which_errors_are_out_of_memory():
    assert is_out_of_memory(torch.OutOfMemoryError(CUDA_TEXT))
    assert is_out_of_memory(the_cpu_allocators_refusal())
    assert is_out_of_memory(MemoryError())
    assert not is_out_of_memory(RuntimeError("shape mismatch")) and not is_out_of_memory(ValueError("x"))


def test_cuda_and_nccl_refusals_outside_the_caching_allocator_are_out_of_memory():
    """Issue 31: "CUDA error: out of memory" (torch 2.8+ raises it as AcceleratorError, earlier as a
    plain RuntimeError), NCCL's DistBackendError, cuBLAS failing to allocate its handle; an NCCL
    error that is not about memory stays a failure of another kind."""
    assert is_out_of_memory(RuntimeError(CUDA_ERROR_TEXT))
    if hasattr(torch, "AcceleratorError"):
        assert is_out_of_memory(torch.AcceleratorError(CUDA_ERROR_TEXT))
    assert is_out_of_memory(torch.distributed.DistBackendError(NCCL_TEXT))
    assert is_out_of_memory(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"))
    assert not is_out_of_memory(torch.distributed.DistBackendError(NCCL_OTHER_TEXT))
    line = out_of_memory_line(0, Phase.FORWARD, NCCL_TEXT, AllocatorFigures(GB, 2 * GB, 4 * GB, None))
    assert line == f"{MESSAGE_PREFIX} rank 0 in forward: tried to allocate ?; allocated 1.0 GB, reserved 2.0 GB of 4.0 GB"


def test_the_line_on_cuda_names_rank_phase_and_allocator_figures():
    figures = AllocatorFigures(allocated=int(74.12 * GB), reserved=int(76.32 * GB), total=int(79.19 * GB),
                               peak_live=int(75.0 * GB))
    assert out_of_memory_line(1, Phase.BACKWARD, CUDA_TEXT, figures) == (
        "out of memory: rank 1 in backward: tried to allocate 2.0 GB; allocated 74.1 GB, reserved 76.3 GB of "
        "79.2 GB; peak live 75.0 GB this step")


def test_the_line_on_cpu_gives_the_resident_set_and_may_lack_a_size():
    line = out_of_memory_line(0, Phase.START_UP, "MemoryError", AllocatorFigures(300 * MB, 900 * MB, None, None))
    assert line == f"{MESSAGE_PREFIX} rank 0 in start-up: tried to allocate ?; allocated 300 MB, resident 900 MB"


def test_step_phase_starts_at_start_up_and_follows_the_loop():
    phase = StepPhase()
    assert phase.current is Phase.START_UP
    for each in (Phase.FORWARD, Phase.BACKWARD, Phase.STEP, Phase.BETWEEN_STEPS):
        phase.enter(each)
        assert phase.current is each
