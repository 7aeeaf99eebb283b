"""Lab zero1: ZeRO-1. Partition Adam's states; all-gather the parameters after the step.

engine.py calls these three functions at stage 1 (its docstring tells the whole step). Each rank
keeps the whole flat buffer of parameters, but Adam updates only its partition of it, so Adam's two
states take 2 x 4 B x padded / N per rank instead of 2 x 4 B x padded.

`comm` is nano's instrumented collectives (zero_lab/nano/collectives.py): comm.world_size, comm.rank,
comm.reduce_scatter(output, bucket, share_sizes), comm.all_gather_into_tensor(output, local),
comm.all_reduce(tensor). Every call it makes is counted and compared, byte by byte.
"""

import torch

LAB = "zero1"
STAGE = 1


def partition_bounds(padded_numel: int, world_size: int, rank: int) -> tuple[int, int]:
    """The flat range [start, end) rank `rank` owns: the rank-th of `world_size` equal slices.

    padded_numel is a multiple of world_size. Rank 0 owns the first slice, rank N-1 the last.
    """
    raise NotImplementedError("lab zero1: write partition_bounds in lab.py")


def reduce_scatter_gradients(flat_gradient: torch.Tensor, comm) -> torch.Tensor:
    """This rank's gradient partition: its slice of the flat gradient, summed over ranks and averaged.

    A reduce-scatter sends (N-1)/N of the buffer; return a new tensor of padded / N elements.
    """
    raise NotImplementedError("lab zero1: write reduce_scatter_gradients in lab.py")


def all_gather_parameters(flat: torch.Tensor, partition: torch.Tensor, comm) -> None:
    """After Adam updated this rank's `partition` (a view of `flat`), every rank's partition into `flat`.

    An all-gather sends this rank's partition to every other rank: (N-1)/N of the buffer on the wire.
    """
    raise NotImplementedError("lab zero1: write all_gather_parameters in lab.py")
