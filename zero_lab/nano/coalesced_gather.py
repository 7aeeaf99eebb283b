"""Stage 3's all-gather calls: what one fetch or one prefetch starts moves in one call per dtype, and
the persistent parameters after each step in one call.

Official DeepSpeed hands the parameters one fetch (a module's own, not yet whole) or one prefetch
(every parameter it reaches) starts to one `all_gather_coalesced`, which sends them in one
all-gather per communication dtype (`partition_parameters.py`, `_all_gather_coalesced`), a single
parameter by itself. nano's sharded buffers follow the same rule (`call_groups`), and a group of
several buffers is gathered by `GatherTogether`:
    Phase 1 (start): this rank's partitions of the group's buffers, side by side in the row of a
             staging tensor that is this rank's (rows are ranks), each buffer's full storage
             re-allocated; one `all_gather_into_tensor` fills every rank's row.
    Phase 2 (wait, the first buffer of the group that is waited for): the call completes, and each
             buffer's `full` is filled from its columns of every row (rank r's partition is the
             r-th slice of `full`); the staging tensor is freed.
The staging tensor is the group's full size, as official's flat tensor is; official then copies
each parameter out of it too (`AllGatherCoalescedHandle.wait`). A group of one buffer needs no
staging: it gathers straight into its `full`. A buffer with a wire format of its own (hpZ's
secondary partitions, qwZ's int8 blocks: `gathers_with_others` False) is gathered by itself.

After Adam, `gather_persistent` gathers the persistent parameters' always-whole buffers the same
way, in one call; official makes one call per persistent parameter (`_allgather_params_coalesced`),
each output allocated before any is waited on: the same bytes.
"""

from __future__ import annotations

import torch

from zero_lab.nano.collectives import Collectives, free_storage
from zero_lab.nano.flat_buffer import FlatParameterBuffer
from zero_lab.nano.sharded_flat_buffer import BufferState, ShardedFlatBuffer


def call_groups(buffers: list[ShardedFlatBuffer]) -> list[list[ShardedFlatBuffer]]:
    """The all-gather calls that move `buffers` (the still-sharded ones of one fetch or prefetch),
    in order: one per dtype, each buffer with a wire format of its own in a call by itself."""
    groups: dict[object, list[ShardedFlatBuffer]] = {}
    for buffer in buffers:
        if buffer.state != BufferState.SHARDED:
            continue
        key = (buffer.full.dtype, buffer.full.device) if buffer.gathers_with_others else id(buffer)
        groups.setdefault(key, []).append(buffer)
    return list(groups.values())


class GatherTogether:
    """One all-gather for several sharded buffers of one dtype (see the module docstring)."""

    def __init__(self, buffers: list[ShardedFlatBuffer], collectives: Collectives, asynchronous: bool):
        self.buffers = buffers
        self.world_size = collectives.world_size
        self.sizes = [buffer.layout.partition_numel for buffer in buffers]
        self.staging = buffers[0].full.new_empty(self.world_size * sum(self.sizes))
        mine = self.staging.view(self.world_size, -1)[collectives.rank]  # Phase 1
        for buffer, piece in zip(buffers, mine.split(self.sizes)):  # (an offloaded partition staged one at a time)
            piece.copy_(buffer.stage_in(buffer.partition))
        self.work = collectives.all_gather_into_tensor(self.staging, mine, async_op=asynchronous)
        for buffer in buffers:
            buffer.join_gather(self)

    def wait(self) -> None:
        """Phase 2, once for the whole group."""
        if self.staging is None:
            return
        if self.work is not None:
            self.work.wait()
        rows = self.staging.view(self.world_size, -1).split(self.sizes, dim=1)
        torch._foreach_copy_([buffer.rows for buffer in self.buffers], rows)
        free_storage(self.staging)  # shrunk, not just dropped: the backend's worker may still hold it
        self.staging = self.work = None


def start_gathers(buffers: list[ShardedFlatBuffer], collectives: Collectives, asynchronous: bool = False) -> None:
    """Start gathering the still-sharded `buffers` that one fetch or prefetch needs, a call per group."""
    for group in call_groups(buffers):
        if len(group) == 1:
            group[0].unshard(collectives, asynchronous)
        else:
            GatherTogether(group, collectives, asynchronous)  # each buffer holds it as its pending gather
            if not asynchronous:
                for buffer in group:
                    buffer.wait()


def gather_persistent(buffers: list[FlatParameterBuffer], collectives: Collectives) -> None:
    """After Adam: stage 3's always-whole buffers (one dtype) whole again, in one call (Phases 1-2)."""
    if collectives.alone or not buffers:
        return
    sizes = [buffer.layout.partition_numel for buffer in buffers]
    staging = buffers[0].full.new_empty(collectives.world_size * sum(sizes))
    rows = staging.view(collectives.world_size, -1)
    torch.cat([buffer.partition for buffer in buffers], out=rows[collectives.rank])  # Phase 1
    collectives.all_gather_into_tensor(staging, rows[collectives.rank])
    torch._foreach_copy_([buffer.rows for buffer in buffers], rows.split(sizes, dim=1))  # Phase 2
    free_storage(staging)  # shrunk, not just dropped: the backend's worker may still hold it
