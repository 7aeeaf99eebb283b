"""Lab zero2: ZeRO-2. Reduce-scatter the gradients into partitions during backward, bucket by bucket.

At stage 2 the engine calls `gradient_ready` from a hook each time backward has finished one
parameter's gradient. The full gradients must not outlive the bucket: after backward a rank holds
only its gradient partition, 4 B x padded / N, instead of 4 B x numel of `param.grad`.
The three functions of lab zero1 are used here too: copy your solution of zero1 in.

`comm` is nano's instrumented collectives (zero_lab/nano/collectives.py): comm.world_size, comm.rank,
comm.reduce_scatter(output, bucket, share_sizes), comm.all_gather_into_tensor(output, local),
comm.all_reduce(tensor). Every call it makes is counted and compared, byte by byte.
"""

import torch

LAB = "zero2"
STAGE = 2


def partition_bounds(padded_numel: int, world_size: int, rank: int) -> tuple[int, int]:
    """As in lab zero1: the flat range [start, end) rank `rank` owns."""
    raise NotImplementedError("lab zero2: write partition_bounds in lab.py (your zero1 solution)")


def reduce_scatter_gradients(flat_gradient: torch.Tensor, comm) -> torch.Tensor:
    """As in lab zero1: this rank's slice of the flat gradient, summed over ranks and averaged."""
    raise NotImplementedError("lab zero2: write reduce_scatter_gradients in lab.py (your zero1 solution)")


def all_gather_parameters(flat: torch.Tensor, partition: torch.Tensor, comm) -> None:
    """As in lab zero1: every rank's updated partition into `flat`."""
    raise NotImplementedError("lab zero2: write all_gather_parameters in lab.py (your zero1 solution)")


def gradient_ready(group, parameter: torch.nn.Parameter, comm) -> None:
    """Backward has finished `parameter.grad`: move it into the group's gradient bucket.

    group.bucket:         None until the first gradient of the step; then a zeroed fp32 tensor of
                          group.padded_numel elements (create it)
    group.offsets[p]:     where parameter p starts in the bucket
    group.arrived:        how many of group.parameters have landed this step (count them)
    group.grad_partition: set it when the bucket is full (every parameter arrived): the bucket
                          reduce-scattered and averaged; then release the bucket: free its storage
                          (free_storage(group.bucket), from zero_lab.nano.collectives: the backend's
                          worker may still hold the tensor after the call returns) and set it None
    Release `parameter.grad` (None) once it is in the bucket: ZeRO-2 keeps no full gradients.
    """
    raise NotImplementedError("lab zero2: write gradient_ready in lab.py")
