"""Reducing one gradient bucket across ranks and keeping this rank's share in fp32.

A bucket is a flat range [start, end) of one flat buffer's gradients (`launch`), or several whole
buffers laid out rank-major (`launch_shares`, `spanning_layout`), held in a tensor of the
communication dtype. Reducing it runs in two phases:
    Phase 1 (launch): either reduce-scatter, where the bucket is cut at partition boundaries and
             each rank receives only the sum of its own share (see `Collectives.reduce_scatter`
             for how nccl and gloo do it), or all-reduce, where every rank receives the whole sum
             and keeps its share ("scatter-back"). With one partition (stage 0) every rank owns
             the whole bucket and all-reduces it.
    Phase 2 (finish): wait for the collective, divide the sum by the world size (SUM then divide;
             not with `gradient_allreduce_op: sum`, which keeps the sum; with `predivide`, as
             official DeepSpeed's stage 1-3 reduce-scatter does, every rank divides its bucket by
             the world size before Phase 1 instead, so N half-precision gradients that each fit
             do not overflow when summed), and copy the share into the fp32 gradient partition (a
             window's first reduction) or add it (later ones); a spanning bucket's share is cut
             into its members' partitions, in order. When copying, a reduce-scatter in fp32 lands
             straight in the partition: no temporary share at all. Temporaries the reducer was
             handed (the bucket, a separate share) are freed here.
With overlap, Phase 1 is asynchronous and at most `max_in_flight` buckets wait for Phase 2.
The share lands where its gradient partition is (`Placement.land`): on the device at once; in
pinned host memory, CPU offload queues the copy (`OffloadPlacement.land`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Optional

import torch

from zero_lab.nano.collectives import Collectives, free_storage
from zero_lab.nano.flat_buffer import FlatParameterBuffer
from zero_lab.nano.placement import Placement


@dataclass
class PendingReduction:
    work: Any  # the async handle, or None once finished
    share: torch.Tensor  # this rank's summed share (comm dtype)
    destinations: list[torch.Tensor]  # the matching slices of fp32 gradient partitions, in share order
    bucket: torch.Tensor  # kept alive until the collective is done
    accumulate: bool  # add into the destination (True) or overwrite it
    temporaries: list[torch.Tensor]  # freed once the share has landed


class BucketReducer:
    """Launches bucket reductions and lands each rank's share in its gradient partition."""

    def __init__(self, collectives: Collectives, use_reduce_scatter: bool, max_in_flight: int, average: bool = True,
                 predivide: bool = False, placement: Optional[Placement] = None):
        self.collectives = collectives
        self.placement = placement or Placement(collectives.device)
        self.use_reduce_scatter = use_reduce_scatter
        self.max_in_flight = max_in_flight
        divisor = collectives.world_size if average else 1
        # Divide each bucket before the sum (predivide) or the sum after it: never both.
        self.divisor_before, self.divisor = (divisor, 1) if predivide else (1, divisor)
        self.pending: deque[PendingReduction] = deque()

    def launch(self, buffer: FlatParameterBuffer, bucket: torch.Tensor, start: int, end: int,
               gradient_partition: torch.Tensor, accumulate: bool = False, owns_bucket: bool = True) -> None:
        """Phase 1 for the bucket holding flat range [start, end) of `buffer`; with `owns_bucket` the
        bucket is a temporary of its own, freed in Phase 2 (not a view of a lasting buffer)."""
        own_low, own_high = buffer.own_range(start, end)
        inside_low, inside_high = own_low - buffer.partition_start, own_high - buffer.partition_start  # all: no slice
        destination = (gradient_partition if inside_high - inside_low == gradient_partition.numel()
                       else gradient_partition[inside_low:inside_high])
        share_sizes = ([high - low for low, high in buffer.layout.owner_ranges(start, end)]
                       if self.use_reduce_scatter else [])  # an all-reduce has no shares to size
        self.launch_shares(bucket, share_sizes, own_low - start, [destination], accumulate, owns_bucket)

    def launch_shares(self, bucket: torch.Tensor, share_sizes: list[int], own_start: int,
                      destinations: list[torch.Tensor], accumulate: bool = False, owns_bucket: bool = True) -> None:
        """Phase 1 for any bucket: rank r's share is the r-th consecutive slice of `share_sizes`
        elements (for a reduce-scatter); this rank's share starts at `own_start` and lands in
        `destinations`, one after another (one slice of a gradient partition, or, for a bucket
        spanning whole buffers, `spanning_layout`, every member's whole gradient partition)."""
        own_numel = sum(destination.numel() for destination in destinations)
        asynchronous = self.max_in_flight > 0
        if self.divisor_before != 1:
            bucket.div_(self.divisor_before)
        if self.use_reduce_scatter:
            only = destinations[0] if len(destinations) == 1 else None
            direct = (only is not None and not accumulate and bucket.dtype == only.dtype
                      and bucket.device == only.device)
            share = only if direct else torch.empty(own_numel, dtype=bucket.dtype, device=bucket.device)
            work = self.scatter(share, bucket, share_sizes, asynchronous)
        else:
            work = self.collectives.all_reduce(bucket, async_op=asynchronous)
            share = bucket[own_start:own_start + own_numel]
        temporaries = ([bucket] if owns_bucket else []) + ([share] if not same_storage(share, bucket) and not any(
            same_storage(share, destination) for destination in destinations) else [])
        self.pending.append(PendingReduction(work, share, destinations, bucket, accumulate, temporaries))
        while len(self.pending) > self.max_in_flight:
            self._finish_oldest()

    def scatter(self, share: torch.Tensor, bucket: torch.Tensor, share_sizes: list[int], asynchronous: bool):
        """Phase 1's reduce-scatter: the sum over ranks of this rank's share of `bucket` into `share`
        (qgZ's reducer sends it quantized instead: `nano.zeropp.quantized_gradients`)."""
        return self.collectives.reduce_scatter(share, bucket, share_sizes, async_op=asynchronous)

    def _finish_oldest(self) -> None:
        """Phase 2 for the oldest launched bucket."""
        reduction = self.pending.popleft()
        if reduction.work is not None:
            reduction.work.wait()
        self.placement.land(reduction, self._store, self.max_in_flight)

    def _store(self, reduction: PendingReduction, share: torch.Tensor) -> None:
        """The share, summed over ranks, into (or onto) its slices of the fp32 gradient partitions."""
        reduction.share = share
        sizes = [destination.numel() for destination in reduction.destinations]
        pieces = share.split(sizes) if len(sizes) > 1 else [share]
        for piece, destination in zip(pieces, reduction.destinations):
            if reduction.accumulate:
                destination.add_(piece.to(destination.device, torch.float32).div_(self.divisor))
            elif piece.data_ptr() != destination.data_ptr():  # else a reduce-scatter into the partition has landed
                destination.copy_(piece)
            if not reduction.accumulate and self.divisor != 1:
                destination.div_(self.divisor)
        for temporary in reduction.temporaries:
            free_storage(temporary)

    def finish_all(self) -> None:
        while self.pending:
            self._finish_oldest()
        self.placement.land_all()

    def in_flight_bytes(self) -> int:
        """Bytes of the temporary buckets and shares still waiting for Phase 2 (on the device)."""
        return sum(temporary.untyped_storage().nbytes() for item in self.pending for temporary in item.temporaries)


def same_storage(first: torch.Tensor, second: torch.Tensor) -> bool:
    return first.untyped_storage().data_ptr() == second.untyped_storage().data_ptr()


def optional_bytes(tensor: Optional[torch.Tensor]) -> int:
    return 0 if tensor is None else tensor.numel() * tensor.element_size()
