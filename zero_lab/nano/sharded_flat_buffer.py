"""Stage 3's flat buffer: whole only while its unit is in use (FSDP2's sharded parameters).

A `ShardedFlatBuffer` is a `flat_buffer.FlatParameterBuffer` (the same layout, the same views)
whose `partition` is storage of its own. States and verbs:
    UNSHARDED: `full` holds every element and each `param.data` is a view of it.
    SHARDED:   `full`'s storage is resized to 0 bytes; only `partition` remains. The parameters
               keep their shapes and stay views of `full`, so autograd's references to them stay
               valid across the states (FSDP2's way); touching one while sharded is an error, never
               stale values.
    GATHERING: between the two, an all-gather into `full` in flight.
`unshard()` gathers into `full`'s re-allocated storage, `reshard()` frees it again; `after_step()`
gathers nothing (the next use does). Each change of state moves a shared count (`count_in`).
"""

from __future__ import annotations

from enum import Enum
from typing import Callable

import torch

from zero_lab.nano.collectives import Collectives, free_storage
from zero_lab.nano.flat_buffer import FlatParameterBuffer, WholeParameters
from zero_lab.nano.layout import FlatLayout
from zero_lab.nano.placement import TensorKind


class BufferState(str, Enum):
    """A flat buffer's state (see the module docstring); equal to its name as a string."""

    UNSHARDED = "UNSHARDED"
    GATHERING = "GATHERING"  # an all-gather in flight
    SHARDED = "SHARDED"


class GatheredElements:  # the fetch rules' live count (official's `__n_available_params`), kept by `count_in`
    numel = 0  # elements of the buffers counted in it that are not SHARDED


class ShardedFlatBuffer(FlatParameterBuffer):
    """A flat buffer that is whole only while its unit is in use (stage 3); see the module docstring.

    `unshard(asynchronous=True)` returns at once with the gather in flight (GATHERING); `wait()`
    completes it. `synchronize()` (construction's last phase) keeps this rank's partition of rank
    0's values and leaves the buffer SHARDED.
    """

    partition_kind = TensorKind.PARTITION  # storage of its own, on the host with offload_param
    sharded = True
    gathers_with_others = True  # may share one all-gather call with other buffers (`coalesced_gather`)

    def __init__(self, parameters: list[torch.nn.Parameter], layout: FlatLayout, collectives: Collectives,
                 group_index: int, full: torch.Tensor, partition: torch.Tensor,
                 stage_in: Callable[[torch.Tensor], torch.Tensor], source=WholeParameters):
        super().__init__(parameters, layout, collectives, group_index, full, source)
        self.partition = partition
        self.stage_in = stage_in  # the partition where a gather sends it from (placement.stage_in)
        self.full_nbytes = self.full.untyped_storage().nbytes()
        self.pending = None
        self.staged: torch.Tensor | None = None
        self.counted: GatheredElements | None = None  # where its gathered elements are counted (`count_in`)
        self._state = BufferState.UNSHARDED

    state = property(lambda self: self._state)

    @state.setter
    def state(self, state: BufferState) -> None:  # a change into or out of SHARDED moves the count
        if self.counted is not None and (state == BufferState.SHARDED) != (self._state == BufferState.SHARDED):
            self.counted.numel += self.layout.padded_numel * (-1 if state == BufferState.SHARDED else 1)
        self._state = state

    def count_in(self, counted: GatheredElements) -> None:  # its elements count in `counted` while not SHARDED
        self.counted = counted
        counted.numel += 0 if self._state == BufferState.SHARDED else self.layout.padded_numel

    def synchronize(self, collectives: Collectives) -> None:
        super().synchronize(collectives)
        self.partition.copy_(self.partition_of(self.full))
        self.reshard()

    def unshard(self, collectives: Collectives, asynchronous: bool = False) -> None:
        if self.state != BufferState.SHARDED:
            return
        self.full.untyped_storage().resize_(self.full_nbytes)
        self.staged = self.stage_in(self.partition)
        self.pending = self.start_gather(collectives, self.staged, asynchronous)
        self.state = BufferState.GATHERING
        if self.pending is None:
            self.wait()

    def join_gather(self, shared) -> None:
        """Become whole through a gather of several buffers (`coalesced_gather.GatherTogether`):
        storage for `full` now, its values once `shared.wait()` has run."""
        self.full.untyped_storage().resize_(self.full_nbytes)
        self.staged, self.pending, self.state = self.partition, shared, BufferState.GATHERING

    def start_gather(self, collectives: Collectives, local: torch.Tensor, asynchronous: bool):
        """Every rank's `local` into `full`, over `collectives`: the wire format of a gather (qwZ's
        buffers send int8 blocks instead, `nano.zeropp.quantized_weights`). Returns the work handle, or
        None once done."""
        return collectives.all_gather_into_tensor(self.full, local, async_op=asynchronous)

    def wait(self) -> None:
        if self.state == BufferState.GATHERING:
            if self.pending is not None:
                self.pending.wait()
            if self.staged is not self.partition:
                free_storage(self.staged)  # the device copy of an offloaded partition
            self.pending, self.staged, self.state = None, None, BufferState.UNSHARDED

    def reshard(self) -> None:
        self.wait()
        if self.state == BufferState.UNSHARDED:
            self.full.untyped_storage().resize_(0)
            self.state = BufferState.SHARDED

    def after_step(self, collectives: Collectives) -> torch.distributed.Work | None:
        """Nothing to gather: the partitions are the parameters, and each use gathers them anew."""
        return None

    def parameter_bytes(self) -> int:
        return self.partition.untyped_storage().nbytes()

    def gathered_bytes(self) -> int:
        return self.full.untyped_storage().nbytes()
