"""The offload placement: some kinds of tensor live on the host (FSDP2's `CPUOffloadPolicy`).

`placement.Placement` keeps every kind on the device; this one, which `initialize` chooses when a
config offloads, answers the same questions with the host for the offloaded kinds:
    optimizer: fp32 master partitions, optimizer states and fp32 gradient partitions, with
               `offload_optimizer`;
    partition: stage 3's parameter partitions between uses, with `offload_param`.
On a CPU-only machine host and device are the same memory, but an offloaded tensor takes the same
path as on a GPU: its own copy, moved by the same calls. Pinned (page-locked) host memory makes the
copies asynchronous; only a CUDA device pins.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Mapping

import torch

from zero_lab.nano.collectives import free_storage
from zero_lab.nano.placement import Placement, TensorKind

HOST = torch.device("cpu")


def host_threads(environ: Mapping[str, str] = os.environ, cores: int | None = None) -> int:
    """The CPU threads one rank's host work (Adam on an offloaded optimizer) may use: the cores
    this process may run on, shared evenly by the node's ranks. torchrun sets OMP_NUM_THREADS=1
    for several ranks, which would leave host Adam on one core; official DeepSpeed's CPU Adam
    spreads over the rank's cores too."""
    cores = len(os.sched_getaffinity(0)) if cores is None else cores
    return max(1, cores // max(1, int(environ.get("LOCAL_WORLD_SIZE", 1))))


@dataclass(frozen=True)
class OffloadPlacement(Placement):
    """The offloaded kinds on the host (`zeros` and `master_for` are `Placement`'s, asking `place`)."""

    offload_optimizer: bool = False
    offload_parameters: bool = False
    pin_memory: bool = False  # asked for; honoured only when the run's device is a CUDA device
    landings: deque = field(default_factory=deque, init=False, compare=False, repr=False)  # `land`'s queued copies

    def place(self, kind: TensorKind) -> str:
        """'device' or 'host' for a kind of tensor."""
        offloaded = {TensorKind.COMPUTE: False, TensorKind.PARTITION: self.offload_parameters,
                     TensorKind.OPTIMIZER: self.offload_optimizer}[kind]
        return "host" if offloaded else "device"

    def torch_device(self, kind: TensorKind) -> torch.device:
        return HOST if self.place(kind) == "host" else self.device

    @property
    def pins(self) -> bool:
        """Whether host tensors are page-locked (asynchronous copies): only when the run's device is
        CUDA. A `--device cpu` run on a GPU machine pins nothing: pinning would open a CUDA context on
        GPU 0 in every rank for copies that never leave the host."""
        return self.pin_memory and self.device.type == "cuda"

    def empty(self, kind: TensorKind, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A new uninitialised tensor of `kind`, where that kind lives."""
        pinned = self.pins and self.place(kind) == "host"
        return torch.empty(numel, dtype=dtype, device=self.torch_device(kind), pin_memory=pinned)

    def copy(self, destination: torch.Tensor, source: torch.Tensor) -> None:
        """destination <- source across places (asynchronous from pinned host memory).

        A dtype conversion between places happens on the host: the fp32 master published into a
        16-bit device partition is first converted into a 16-bit host temporary (pinned when
        pinning), then moved. Converting inside the copy would go through a device temporary the
        size of the partition in fp32, 4 bytes a parameter that no formula counts."""
        if source.dtype != destination.dtype and source.device != destination.device:
            if source.device.type == "cpu":  # host -> device: convert, then move the smaller tensor
                source = self.host_empty(source.shape, destination.dtype).copy_(source)
            else:  # device -> host: move as is, then convert on the host
                staged = self.host_empty(source.shape, source.dtype)
                staged.copy_(source)
                destination.copy_(staged)
                return
        destination.copy_(source, non_blocking=self.pins)

    def host_empty(self, shape, dtype: torch.dtype) -> torch.Tensor:
        """A host temporary, pinned when pinning (an asynchronous copy's other end)."""
        return torch.empty(shape, dtype=dtype, device=HOST, pin_memory=self.pins)

    def land(self, reduction, store: Callable, in_flight: int) -> None:
        """A reduced share into its gradient partitions (`store(reduction, share)`), in two phases
        where the partitions are in pinned host memory (offload_optimizer on CUDA):
            Phase 1 (here): the share's device-to-host copy is queued on the device's stream
                     (`start_landing`) and the device temporaries are freed at once (later work
                     on that stream runs after the copy);
            Phase 2 (`_land_oldest`): only when more than `in_flight` copies are queued, or at the
                     end of backward (`land_all`), is the oldest waited for and stored on the host.
        So the backward hook that completed a bucket never waits for a copy, and `overlap_comm`
        overlaps the copies with backward as official DeepSpeed's offload does."""
        share, ready = self.start_landing(reduction.share, reduction.destinations[0])
        if ready is None:
            store(reduction, share)
            return
        for temporary in reduction.temporaries:  # the copy is queued before any later use of them
            free_storage(temporary)
        reduction.temporaries = []  # the pinned host share is dropped, not shrunk, once stored
        self.landings.append((share, ready, reduction, store))
        while len(self.landings) > in_flight:
            self._land_oldest()

    def land_all(self) -> None:
        while self.landings:
            self._land_oldest()

    def _land_oldest(self) -> None:
        share, ready, reduction, store = self.landings.popleft()
        self.finish_landing(ready)
        store(reduction, share)

    def start_landing(self, source: torch.Tensor, destination: torch.Tensor) -> tuple[torch.Tensor, object]:
        """Phase 1's copy of a device tensor to the host without waiting: (the host tensor that
        will hold it, the moment it is there: a CUDA event, or None when it already is).

        With pinned memory the copy is queued on the device's stream into a pinned host buffer
        and this returns at once; `finish_landing` waits for it. Anywhere else `source` needs no
        copy: it is on the destination's device already, or the copy is synchronous anyway."""
        if not self.pins or source.device == destination.device:
            return source, None
        staged = self.host_empty(source.shape, source.dtype)
        staged.copy_(source, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return staged, ready

    @staticmethod
    def finish_landing(ready: object) -> None:
        """Phase 2: wait until `start_landing`'s copy is on the host."""
        if ready is not None:
            ready.synchronize()

    def stage_in(self, partition: torch.Tensor) -> torch.Tensor:
        """A parameter partition where a gather can send it from: itself on the device, or a device
        copy of an offloaded one (freed by the caller once the gather is done)."""
        if self.place(TensorKind.PARTITION) == "device":
            return partition
        local = torch.empty(partition.numel(), dtype=partition.dtype, device=self.device)
        self.copy(local, partition)
        return local
