"""Parameters partitioned as they are built (`zero.Init`): each rank keeps a 1/N slice of each one.

Phase 1 (partition; at the end of a module's __init__): the parameter moves to the device the
         collectives communicate from (a module is built on the CPU; nccl sends only accelerator
         memory, and DeepSpeed's Init moves it there too), rank 0's values are broadcast, so every
         rank agrees; each rank keeps its slice of the flattened parameter, padded to a multiple
         of N (`zero_lab_init_partition`), in the parameter's own storage shrunk to the slice (so
         building never holds more than the module being built whole beside the slices kept);
         the parameter's data becomes an empty tensor, as in
         official DeepSpeed, so nothing (a model's own weight init included) can read or write
         the freed values; its shape is kept in `zero_lab_shape`.
Phase 2 (whole again; when an engine lays the parameter into its flat buffer): the slices are
         all-gathered into the whole parameter, one parameter at a time, so start-up never holds
         more than one parameter whole besides the flat buffer being filled.
Before an engine owns it, a use may make a partitioned parameter whole for a while, as official
DeepSpeed does (`zero.GatheredParameters`, and `Module.apply` inside `zero.Init`):
    `gather`: the slices are all-gathered into a whole tensor that becomes the parameter's data;
              the slice is kept; nested gathers count holds.
    `release(modifier_rank=r)`: rank r's whole values are broadcast and each rank copies its
              slice of them into its partition (without r, changes are dropped, as in official);
              at the last hold the whole tensor is freed and the data is empty again.
"""

from __future__ import annotations

import torch

from zero_lab.nano.collectives import Collectives


def is_partitioned(parameter: torch.Tensor) -> bool:
    return getattr(parameter, "zero_lab_init_partition", None) is not None


def numel_of(parameter: torch.Tensor) -> int:
    """Elements of the whole parameter, partitioned or not."""
    return torch.Size(parameter.zero_lab_shape).numel() if is_partitioned(parameter) else parameter.numel()


def _slice_of(numel: int, collectives: Collectives) -> tuple[int, int, int]:
    """(elements per slice, this rank's first element, how many of them are the parameter's)."""
    share = -(-numel // collectives.world_size)
    start = min(numel, collectives.rank * share)
    return share, start, max(0, min(numel, start + share) - start)


@torch.no_grad()
def partition(parameter: torch.nn.Parameter, collectives: Collectives) -> None:
    """Phase 1, in place: this rank's slice is moved to the front of the parameter's own storage,
    which then shrinks to the slice, so no second buffer ever sits beside the whole parameter."""
    data = parameter.data.to(collectives.device)  # itself where it is built on that device already
    collectives.broadcast(data, source_rank=0)
    flat = data.reshape(-1)
    numel, size = flat.numel(), flat.element_size()
    share, start, kept = _slice_of(numel, collectives)
    storage = flat.untyped_storage()
    if flat.storage_offset() == 0 and storage.nbytes() == numel * size:
        if start > 0 and kept:  # start >= share >= kept: source and destination never overlap
            flat[:kept].copy_(flat[start:start + kept])
        # Shrinking frees the rest even where gloo's broadcast work still refers to the storage.
        storage.resize_(share * size)
        piece = flat.new_empty(0).set_(storage, 0, (share,), (1,))
    else:  # a view into a storage others share (or a copy made by reshape): copy the slice out
        piece = flat.new_zeros(share)
        piece[:kept] = flat[start:start + kept]
    piece[kept:].zero_()  # the last ranks' padding
    parameter.zero_lab_shape = tuple(parameter.shape)
    parameter.zero_lab_init_partition = piece
    # Empty where it was built (the host copy is freed here); `initialize` moves the module.
    parameter.data = torch.empty(0, dtype=flat.dtype, device=parameter.device)


@torch.no_grad()
def whole_values(parameter: torch.Tensor, collectives: Collectives) -> torch.Tensor:
    """Phase 2: the parameter's values, whole, in its original shape (itself if not partitioned)."""
    if not is_partitioned(parameter):
        return parameter.data
    values = _all_gathered(parameter, collectives)
    parameter.zero_lab_init_partition = None
    return values


def _all_gathered(parameter: torch.Tensor, collectives: Collectives) -> torch.Tensor:
    piece, numel = parameter.zero_lab_init_partition, numel_of(parameter)
    gathered = torch.empty(piece.numel() * collectives.world_size, dtype=piece.dtype, device=piece.device)
    collectives.all_gather_into_tensor(gathered, piece)
    return gathered[:numel].view(parameter.zero_lab_shape)


def holds_of(parameter: torch.Tensor) -> int:
    """How many uses hold a partitioned parameter whole now (0: its data is empty)."""
    return getattr(parameter, "zero_lab_init_holds", 0)


@torch.no_grad()
def gather(parameter: torch.nn.Parameter, collectives: Collectives) -> None:
    """A use before any engine: the parameter's data is its whole value until `release`."""
    if holds_of(parameter) == 0:
        parameter.data = _all_gathered(parameter, collectives)
    parameter.zero_lab_init_holds = holds_of(parameter) + 1


@torch.no_grad()
def release(parameter: torch.nn.Parameter, collectives: Collectives, modifier_rank: int | None = None) -> None:
    """The end of a `gather`: rank `modifier_rank`'s values (if given) become every rank's slice."""
    if modifier_rank is not None:
        collectives.broadcast(parameter.data, source_rank=modifier_rank)
        flat, piece = parameter.data.reshape(-1), parameter.zero_lab_init_partition
        _, start, kept = _slice_of(flat.numel(), collectives)
        piece[:kept].copy_(flat[start:start + kept])
    parameter.zero_lab_init_holds = holds_of(parameter) - 1
    if parameter.zero_lab_init_holds == 0:
        parameter.data = torch.empty(0, dtype=parameter.dtype, device=parameter.device)


class InitPartitions:
    """Where an engine's flat buffers read parameters from when some were built under `zero.Init`
    (`initialize` hands it over in place of `flat_buffer.WholeParameters`): a partitioned
    parameter's shape is the one it was built with, its values are Phase 2's, gathered one
    parameter at a time as the flat buffer is filled."""

    def __init__(self, collectives: Collectives):
        self.collectives = collectives

    @staticmethod
    def shape(parameter: torch.Tensor) -> torch.Size:
        return torch.Size(parameter.zero_lab_shape) if is_partitioned(parameter) else parameter.shape

    def values(self, parameter: torch.Tensor) -> torch.Tensor:
        return whole_values(parameter, self.collectives)
