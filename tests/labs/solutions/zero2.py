"""The reference solution of lab zero2 (kept in the tests, not in the package a learner gets)."""

import torch

from zero_lab.nano.collectives import free_storage

LAB = "zero2"
STAGE = 2


def partition_bounds(padded_numel, world_size, rank):
    share = padded_numel // world_size
    return rank * share, (rank + 1) * share


def reduce_scatter_gradients(flat_gradient, comm):
    share = flat_gradient.numel() // comm.world_size
    partition = torch.empty(share, dtype=flat_gradient.dtype)
    comm.reduce_scatter(partition, flat_gradient, [share] * comm.world_size)
    return partition.div_(comm.world_size)


def all_gather_parameters(flat, partition, comm):
    comm.all_gather_into_tensor(flat, partition)


def gradient_ready(group, parameter, comm):
    if group.bucket is None:
        group.bucket = torch.zeros(group.padded_numel, dtype=torch.float32)
    offset = group.offsets[parameter]
    group.bucket[offset:offset + parameter.numel()].copy_(parameter.grad.reshape(-1))
    parameter.grad = None
    group.arrived += 1
    if group.arrived == len(group.parameters):
        group.grad_partition = reduce_scatter_gradients(group.bucket, comm)
        free_storage(group.bucket)
        group.bucket = None
