"""Thin, instrumented wrappers over torch.distributed: every byte nano moves passes through here.

Each wrapper records (calls, bytes) per collective type, then calls `torch.distributed.<op>` looked
up at call time (so an outside meter that wraps torch.distributed sees nano's traffic too).
Byte convention, shared with the harness's meter: all_reduce / broadcast count the tensor;
reduce_scatter and all_to_all count the whole input (every rank's share); all_gather counts the
whole output.
With one rank nothing is sent and nothing is recorded, unless `COLLECTIVES_AT_WORLD_ONE` is set
to 1 in the environment: then a world of one still runs (and records) every collective through
its backend, so one GPU exercises nano's NCCL calls (`make gpu-check`) and one CPU process its
gloo calls. Sums are SUM then divide elsewhere: gloo's AVG has had silent bugs.

A temporary handed to a collective can outlive the collective: after `wait()` the backend's
worker thread may still hold its tensors for a moment. `free_storage` releases such a temporary's
bytes at once (FSDP2's way: the storage shrinks to 0 bytes, the tensor objects stay valid), so
what a rank holds after a reduction does not depend on thread timing.
"""

from __future__ import annotations

import os
from collections import defaultdict
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Optional, Sequence

import torch
import torch.distributed


# Set to 1: a world of one still runs every collective (see the module docstring).
COLLECTIVES_AT_WORLD_ONE = "ZERO_LAB_COLLECTIVES_AT_WORLD_ONE"

# Set by the harness from --ranks-per-node: the node size of qgZ's all-to-alls (`nano.zeropp.quantized_gradients`;
# without it, torchrun's LOCAL_WORLD_SIZE).
RANKS_PER_NODE_ENVIRONMENT = "ZERO_LAB_RANKS_PER_NODE"

# The collective a call implements when nano emulates it with another (its reduce-scatter on gloo is
# an all-to-all): a meter that wraps torch.distributed counts the call under this name, so traffic
# is labelled by the algorithm, whichever function carried it.
EMULATED_COLLECTIVE: ContextVar[Optional[str]] = ContextVar("zero_lab_emulated_collective", default=None)

# What the collectives issued now are for, in nano's words: the step's phase ("reduce_gradients",
# "unscale_clip", "all_gather"), the stage-3 unit gathered, the gradient bucket reduced. A meter
# that wraps torch.distributed writes it beside each call (the harness's flight record).
COLLECTIVE_LABEL: ContextVar[Optional[str]] = ContextVar("zero_lab_collective_label", default=None)


@contextmanager
def labelled(label: str):
    """Collectives issued inside carry `label` (see COLLECTIVE_LABEL)."""
    token = COLLECTIVE_LABEL.set(label)
    try:
        yield
    finally:
        COLLECTIVE_LABEL.reset(token)


def _nbytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors)


def free_storage(tensor: torch.Tensor) -> None:
    """Release the bytes of a finished collective's temporary, whoever still refers to it."""
    storage = tensor.untyped_storage()
    if storage.nbytes() > 0:
        storage.resize_(0)


def communication_device(group: Optional[torch.distributed.ProcessGroup] = None) -> torch.device:
    """The device a process group communicates from: the local rank's CUDA device under nccl (as
    torchrun numbers them), else the CPU."""
    if torch.distributed.get_backend(group) == "nccl":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


class Collectives:
    """The collectives of one process group, with per-type call and byte counters."""

    def __init__(self, group: Optional[torch.distributed.ProcessGroup] = None):
        initialized = torch.distributed.is_available() and torch.distributed.is_initialized()
        self.group = group
        self.world_size = torch.distributed.get_world_size(group) if initialized else 1
        self.rank = torch.distributed.get_rank(group) if initialized else 0
        # Where every tensor handed to a collective must live: nccl sends only accelerator memory.
        self.device = communication_device(group) if initialized else torch.device("cpu")
        # Whether collectives are skipped: alone in the world, unless asked to run them anyway.
        self.alone = not initialized or (self.world_size == 1 and os.environ.get(COLLECTIVES_AT_WORLD_ONE) != "1")
        self._stats: dict[str, dict[str, int]] = defaultdict(lambda: {"calls": 0, "bytes": 0})

    def _record(self, operation: str, nbytes: int) -> None:
        self._stats[operation]["calls"] += 1
        self._stats[operation]["bytes"] += nbytes

    def subgroup(self, group: torch.distributed.ProcessGroup) -> "Collectives":
        """The collectives of a group of this one's ranks (hpZ's node), counted in this one's stats."""
        collectives = Collectives(group)
        collectives._stats = self._stats
        return collectives

    def stats(self) -> dict[str, dict[str, int]]:
        """Calls and bytes per collective type since the last reset."""
        return {operation: dict(counts) for operation, counts in sorted(self._stats.items())}

    def reset_stats(self) -> None:
        self._stats.clear()

    def all_reduce(self, tensor: torch.Tensor, maximum: bool = False, async_op: bool = False):
        """Sum (or max) `tensor` in place across ranks."""
        if self.alone:
            return None
        self._record("all_reduce", _nbytes([tensor]))
        operation = torch.distributed.ReduceOp.MAX if maximum else torch.distributed.ReduceOp.SUM
        return torch.distributed.all_reduce(tensor, op=operation, group=self.group, async_op=async_op)

    def reduce_scatter(self, output: torch.Tensor, bucket: torch.Tensor, share_sizes: list[int],
                       async_op: bool = False):
        """Sum over ranks of rank r's share of `bucket` into rank r's `output`: the shares are the
        consecutive slices of `share_sizes` elements (equal, uneven or empty).

        nccl reduce-scatters natively (one contiguous call when the shares are equal). gloo only
        emulates reduce-scatter, through an all-reduce of a copy it keeps beyond the call; nano
        does it directly there instead: an all-to-all sends each share to its owner, which adds
        up the N contributions it received. Each rank still sends (N-1)/N of the bucket and
        receives only its own share's parts, as a reduce-scatter does, and every buffer is nano's.
        """
        if self.alone:
            output.copy_(bucket)
            return None
        self._record("reduce_scatter", _nbytes([bucket]))
        if torch.distributed.get_backend(self.group) == "gloo":
            return self._reduce_scatter_by_all_to_all(output, bucket, share_sizes, async_op)
        if len(set(share_sizes)) == 1:
            scatter = getattr(torch.distributed, "reduce_scatter_single", None) or torch.distributed.reduce_scatter_tensor
            return scatter(output, bucket, group=self.group, async_op=async_op)
        return torch.distributed.reduce_scatter(output, list(bucket.split(share_sizes)), group=self.group,
                                                async_op=async_op)

    def _reduce_scatter_by_all_to_all(self, output, bucket, share_sizes, async_op):
        received = torch.empty(output.numel() * self.world_size, dtype=bucket.dtype, device=bucket.device)
        label = EMULATED_COLLECTIVE.set("reduce_scatter")
        try:
            work = torch.distributed.all_to_all_single(received, bucket, output_split_sizes=[output.numel()] * self.world_size,
                                                       input_split_sizes=share_sizes, group=self.group, async_op=True)
        finally:
            EMULATED_COLLECTIVE.reset(label)
        summing = _SumOnArrival(work, received, output, self.world_size)
        if async_op:
            return summing
        summing.wait()
        return None

    def all_to_all(self, output: torch.Tensor, local: torch.Tensor) -> None:
        """Equal consecutive slices of `local`, slice r to rank r; rank r's slice from every rank
        into `output`, in rank order (qgZ's exchanges)."""
        if self.alone:
            output.copy_(local)
            return
        self._record("all_to_all", _nbytes([local]))
        torch.distributed.all_to_all_single(output, local, group=self.group)

    def all_gather_into_tensor(self, output: torch.Tensor, local: torch.Tensor, async_op: bool = False):
        """Every rank's equal-sized `local` into consecutive slices of `output` (may alias: in place)."""
        if self.alone:
            if output.data_ptr() != local.data_ptr():
                output.copy_(local)
            return None
        self._record("all_gather", _nbytes([output]))
        gather = getattr(torch.distributed, "all_gather_single", None) or torch.distributed.all_gather_into_tensor
        return gather(output, local, group=self.group, async_op=async_op)

    def barrier(self) -> None:
        """Wait until every rank arrives (a checkpoint's files are all written before it is named)."""
        if not self.alone:
            torch.distributed.barrier(group=self.group)

    def broadcast(self, tensor: torch.Tensor, source_rank: int = 0) -> None:
        """Overwrite `tensor` on every rank with source_rank's copy."""
        if self.alone:
            return
        self._record("broadcast", _nbytes([tensor]))
        torch.distributed.broadcast(tensor, src=source_rank, group=self.group)


class _SumOnArrival:
    """The work handle of a reduce-scatter done by all-to-all: waiting adds the received parts."""

    def __init__(self, work, received: torch.Tensor, output: torch.Tensor, world_size: int):
        self.work, self.received, self.output, self.world_size = work, received, output, world_size

    def wait(self) -> bool:
        if self.work is not None:
            self.work.wait()
            torch.sum(self.received.view(self.world_size, -1), dim=0, out=self.output)
            free_storage(self.received)
            self.work = None
        return True
