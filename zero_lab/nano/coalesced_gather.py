"""Stage 3's all-gather calls: what one fetch or one prefetch starts moves in one call per dtype.

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
"""

from __future__ import annotations

import torch

from zero_lab.nano.collectives import Collectives, free_storage
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
        first = buffers[0].full
        self.staging = torch.empty(self.world_size * sum(self.sizes), dtype=first.dtype, device=first.device)
        mine = self.staging.view(self.world_size, -1)[collectives.rank]  # Phase 1
        offset = 0
        for buffer, size in zip(buffers, self.sizes):
            local = buffer.stage_in(buffer.partition)
            mine[offset:offset + size].copy_(local)
            offset += size
        self.work = collectives.all_gather_into_tensor(self.staging, mine, async_op=asynchronous)
        for buffer in buffers:
            buffer.join_gather(self)

    def wait(self) -> None:
        """Phase 2, once for the whole group."""
        if self.staging is None:
            return
        if self.work is not None:
            self.work.wait()
        rows, offset = self.staging.view(self.world_size, -1), 0
        for buffer, size in zip(self.buffers, self.sizes):
            buffer.full.view(self.world_size, size).copy_(rows[:, offset:offset + size])
            offset += size
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
