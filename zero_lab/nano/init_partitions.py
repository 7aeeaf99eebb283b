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
"""

from __future__ import annotations

import torch

from zero_lab.nano.collectives import Collectives


def is_partitioned(parameter: torch.Tensor) -> bool:
    return getattr(parameter, "zero_lab_init_partition", None) is not None


def numel_of(parameter: torch.Tensor) -> int:
    """Elements of the whole parameter, partitioned or not."""
    return torch.Size(parameter.zero_lab_shape).numel() if is_partitioned(parameter) else parameter.numel()


@torch.no_grad()
def partition(parameter: torch.nn.Parameter, collectives: Collectives) -> None:
    """Phase 1, in place: this rank's slice is moved to the front of the parameter's own storage,
    which then shrinks to the slice, so no second buffer ever sits beside the whole parameter."""
    data = parameter.data.to(collectives.device)  # itself where it is built on that device already
    collectives.broadcast(data, source_rank=0)
    flat = data.reshape(-1)
    numel, size = flat.numel(), flat.element_size()
    share = -(-numel // collectives.world_size)
    start = min(numel, collectives.rank * share)
    kept = max(0, min(numel, start + share) - start)
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
    piece, numel = parameter.zero_lab_init_partition, numel_of(parameter)
    gathered = torch.empty(piece.numel() * collectives.world_size, dtype=piece.dtype, device=piece.device)
    collectives.all_gather_into_tensor(gathered, piece)
    parameter.zero_lab_init_partition = None
    return gathered[:numel].view(parameter.zero_lab_shape)
