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
Always whole: `full` holds every element, each `param.data` is a view of it, and `partition` is
this rank's slice of `full`. After Adam updated the partitions, `after_step()` runs
`gather_partitions()`, which all-gathers every rank's partition into every rank's `full` (in place:
the partition is a slice of it). Stage 3's buffer, whole only while its unit is in use, is
`sharded_flat_buffer.ShardedFlatBuffer`.
"""

from __future__ import annotations

import torch

from zero_lab.nano.collectives import Collectives
from zero_lab.nano.layout import FlatLayout
from zero_lab.nano.placement import TensorKind


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
    sharded = False  # always whole (stage 3's sharded buffers are whole only while in use)

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
        self.rows = self.full.view(layout.partition_count, layout.partition_numel)  # row r: rank r's partition

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
