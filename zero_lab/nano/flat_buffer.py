"""The flat parameter buffer: the storage one unit's parameters of one group are views of.

Construction:
    Phase 1 (layout): `layout.FlatLayout` says where each parameter goes, how much padding follows
             and which range this rank owns.
    Phase 2 (move in): each parameter's values are copied into its slice and `param.data` becomes
             a view of it, so each original storage is freed as soon as it is copied. Start-up holds
             the flat buffer beside the not-yet-moved originals (as official DeepSpeed's flattening
             does), never a further copy; parameters are marked, so a second engine cannot adopt them.
             The values come from the parameters themselves (`WholeParameters`), or, for a model
             built under `zero.Init`, from the source `initialize` gives (`init.partitions`).
States and verbs:
    UNSHARDED: `full` holds every element and each `param.data` is a view of it. In a
               `FlatParameterBuffer` (stages 0-2, and stage 3's persistent parameters) it stays
               so, and `partition` is this rank's slice of `full`.
    SHARDED:   only in a `ShardedFlatBuffer` (stage 3): `partition` is storage of its own and
               `full`'s storage is resized to 0 bytes. The parameters keep their shapes and stay
               views of `full`, so autograd's references to them stay valid across the states
               (FSDP2's way); touching one while sharded is an error, never stale values.
    A `FlatParameterBuffer` is always UNSHARDED: after Adam, `after_step()` runs
               `gather_partitions()`, which all-gathers every rank's updated partition into every
               rank's `full` (in place: the partition is a slice of it). A `ShardedFlatBuffer`
               moves between the states: `unshard()` gathers into `full`'s re-allocated storage,
               `reshard()` frees it again; its `after_step()` gathers nothing (its next use does).
"""

from __future__ import annotations

from enum import Enum
from typing import Callable

import torch

from zero_lab.nano.collectives import Collectives, free_storage
from zero_lab.nano.layout import FlatLayout
from zero_lab.nano.placement import TensorKind


class BufferState(str, Enum):
    """A flat buffer's state (see the module docstring); equal to its name as a string."""

    UNSHARDED = "UNSHARDED"
    GATHERING = "GATHERING"  # a ShardedFlatBuffer's all-gather in flight
    SHARDED = "SHARDED"


class WholeParameters:
    """Where Phase 2 reads a parameter from: the parameter itself, whole."""

    @staticmethod
    def shape(parameter: torch.nn.Parameter) -> torch.Size:
        return parameter.shape

    @staticmethod
    def values(parameter: torch.nn.Parameter) -> torch.Tensor:
        return parameter.data


class FlatParameterBuffer:
    """One unit's parameters of one parameter group, as views into a single padded flat buffer."""

    partition_kind = TensorKind.COMPUTE  # the partition is a slice of `full`

    def __init__(self, parameters: list[torch.nn.Parameter], layout: FlatLayout, collectives: Collectives,
                 group_index: int, full: torch.Tensor, source=WholeParameters):
        # Phase 1
        self.parameters = parameters
        self.layout = layout
        self.rank = rank = collectives.rank
        self.group_index = group_index  # the optimizer parameter group whose hyper-parameters apply
        self.partition_start, self.partition_end = layout.partition_range(rank)
        # Phase 2
        self.full = full.zero_()
        for parameter, offset, numel in zip(parameters, layout.offsets, layout.parameter_numels):
            shape = source.shape(parameter)
            view = self.full[offset:offset + numel]
            view.copy_(source.values(parameter).reshape(-1))  # built under zero.Init: gathered here
            parameter.data = view.view(shape)
            parameter.zero_lab_flat_buffer = True
        self.partition = self.partition_of(self.full)

    def partition_of(self, buffer: torch.Tensor) -> torch.Tensor:
        """This rank's partition of a full-length flat buffer (parameters or gradients)."""
        return buffer[self.partition_start:self.partition_end]

    def own_range(self, start: int, end: int) -> tuple[int, int]:
        """The part of flat range [start, end) inside this rank's partition (empty as (x, x))."""
        low = max(start, self.partition_start)
        return low, max(low, min(end, self.partition_end))

    def gather_partitions(self, collectives: Collectives,
                          asynchronous: bool = False) -> torch.distributed.Work | None:
        """Every rank's partition into every rank's `full`, in place: one `all_gather_into_tensor`
        from this rank's partition (a view of `full`) into `full` itself, so no temporary at all.
        (The buffer stays UNSHARDED: this refreshes `full` after the partitions changed.)

        Official DeepSpeed does the same wherever the backend has all_gather_into_tensor (nccl and
        gloo do); its `allgather_bucket_size` pieces exist only for backends without it, and there
        the list form gathers through a flat temporary per piece, which no memory formula counts,
        so nano gathers whole buffers everywhere. A buffer with one partition is whole already
        (stage 0), unless a world of one is asked to run its collectives anyway. `asynchronous`:
        returns the work handle (None when nothing was sent), for the caller to wait on."""
        if self.layout.partition_count < collectives.world_size or collectives.alone:
            return None
        return collectives.all_gather_into_tensor(self.full, self.partition, async_op=asynchronous)

    def synchronize(self, collectives: Collectives) -> None:
        """Rank 0's values on every rank, so all ranks start equal."""
        collectives.broadcast(self.full, source_rank=0)

    def after_step(self, collectives: Collectives) -> torch.distributed.Work | None:
        """After Adam updated the partitions: every rank's parameters whole again, once the
        returned work handle (None: nothing in flight) has been waited on."""
        return self.gather_partitions(collectives, asynchronous=True)

    def parameter_bytes(self) -> int:
        """Bytes of parameter storage this rank keeps between uses."""
        return self.full.untyped_storage().nbytes()

    def gathered_bytes(self) -> int:
        """Bytes of parameter storage gathered for a use, on top of `parameter_bytes`."""
        return 0


class ShardedFlatBuffer(FlatParameterBuffer):
    """A flat buffer that is whole only while its unit is in use (stage 3); see the module docstring.

    `unshard(asynchronous=True)` returns at once with the gather in flight (GATHERING); `wait()`
    completes it. `synchronize()` (construction's last phase) keeps this rank's partition of rank
    0's values and leaves the buffer SHARDED.
    """

    partition_kind = TensorKind.PARTITION  # storage of its own, on the host with offload_param
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
        self.state = BufferState.UNSHARDED

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
        buffers send int8 blocks instead, `nano.quantized_weights`). Returns the work handle, or
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
