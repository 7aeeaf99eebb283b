"""Thin, instrumented wrappers over torch.distributed: every byte nano moves passes through here.

Each wrapper records (calls, bytes) per collective type, then calls `torch.distributed.<op>` looked
up at call time (so an outside meter that wraps torch.distributed sees nano's traffic too).
Byte convention, shared with the harness's meter: all_reduce / broadcast count the tensor;
reduce_scatter counts the whole input (every rank's share); all_gather counts the whole output.
With one rank nothing is sent and nothing is recorded. Sums are SUM then divide elsewhere: gloo's
AVG has had silent bugs.

A temporary handed to a collective can outlive the collective: after `wait()` the backend's
worker thread may still hold its tensors for a moment. `free_storage` releases such a temporary's
bytes at once (FSDP2's way: the storage shrinks to 0 bytes, the tensor objects stay valid), so
what a rank holds after a reduction does not depend on thread timing.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Optional, Sequence

import torch
import torch.distributed


def _nbytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors)


def free_storage(tensor: torch.Tensor) -> None:
    """Release the bytes of a finished collective's temporary, whoever still refers to it."""
    storage = tensor.untyped_storage()
    if storage.nbytes() > 0:
        storage.resize_(0)


class Collectives:
    """The collectives of one process group, with per-type call and byte counters."""

    def __init__(self, group: Optional[torch.distributed.ProcessGroup] = None):
        initialized = torch.distributed.is_available() and torch.distributed.is_initialized()
        self.group = group
        self.world_size = torch.distributed.get_world_size(group) if initialized else 1
        self.rank = torch.distributed.get_rank(group) if initialized else 0
        self._stats: dict[str, dict[str, int]] = defaultdict(lambda: {"calls": 0, "bytes": 0})

    def _record(self, operation: str, nbytes: int) -> None:
        self._stats[operation]["calls"] += 1
        self._stats[operation]["bytes"] += nbytes

    def stats(self) -> dict[str, dict[str, int]]:
        """Calls and bytes per collective type since the last reset."""
        return {operation: dict(counts) for operation, counts in sorted(self._stats.items())}

    def reset_stats(self) -> None:
        self._stats.clear()

    def all_reduce(self, tensor: torch.Tensor, maximum: bool = False, async_op: bool = False):
        """Sum (or max) `tensor` in place across ranks."""
        if self.world_size == 1:
            return None
        self._record("all_reduce", _nbytes([tensor]))
        operation = torch.distributed.ReduceOp.MAX if maximum else torch.distributed.ReduceOp.SUM
        return torch.distributed.all_reduce(tensor, op=operation, group=self.group, async_op=async_op)

    def reduce_scatter(self, output: torch.Tensor, inputs: list[torch.Tensor], async_op: bool = False):
        """Sum inputs[r] over ranks into rank r's `output`; shares may differ in size (or be empty)."""
        if self.world_size == 1:
            output.copy_(inputs[0])
            return None
        self._record("reduce_scatter", _nbytes(inputs))
        return torch.distributed.reduce_scatter(output, inputs, group=self.group, async_op=async_op)

    def reduce_scatter_even(self, output: torch.Tensor, input: torch.Tensor, async_op: bool = False):
        """Sum input's r-th of world_size equal slices over ranks into rank r's `output`: one
        contiguous call (gloo emulates the list form above, several times slower on CPU)."""
        if self.world_size == 1:
            output.copy_(input)
            return None
        self._record("reduce_scatter", _nbytes([input]))
        scatter = getattr(torch.distributed, "reduce_scatter_single", None) or torch.distributed.reduce_scatter_tensor
        return scatter(output, input, group=self.group, async_op=async_op)

    def all_gather(self, outputs: list[torch.Tensor], local: torch.Tensor, async_op: bool = False):
        """Copy every rank's equal-sized `local` into outputs[rank] on all ranks."""
        if self.world_size == 1:
            outputs[0].copy_(local)
            return None
        self._record("all_gather", _nbytes(outputs))
        return torch.distributed.all_gather(outputs, local, group=self.group, async_op=async_op)

    def all_gather_into_tensor(self, output: torch.Tensor, local: torch.Tensor, async_op: bool = False):
        """Every rank's equal-sized `local` into consecutive slices of `output` (may alias: in place)."""
        if self.world_size == 1:
            if output.data_ptr() != local.data_ptr():
                output.copy_(local)
            return None
        self._record("all_gather", _nbytes([output]))
        gather = getattr(torch.distributed, "all_gather_single", None) or torch.distributed.all_gather_into_tensor
        return gather(output, local, group=self.group, async_op=async_op)

    def broadcast(self, tensor: torch.Tensor, source_rank: int = 0) -> None:
        """Overwrite `tensor` on every rank with source_rank's copy."""
        if self.world_size == 1:
            return
        self._record("broadcast", _nbytes([tensor]))
        torch.distributed.broadcast(tensor, src=source_rank, group=self.group)
