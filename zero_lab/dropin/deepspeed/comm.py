"""`deepspeed.comm`: torch.distributed under DeepSpeed's names, joined the way nano joins it.

`init_distributed` is nano's (torchrun's environment; nccl on CUDA, gloo on CPU). The rest call
torch.distributed on the default group unless given one. nano's engine does not go through these:
its own collectives (`zero_lab.nano.collectives`) count every byte they move.
"""

from __future__ import annotations

import os

import torch
import torch.distributed

from zero_lab.nano.facade.distributed import init_distributed

ReduceOp = torch.distributed.ReduceOp

__all__ = ["init_distributed", "is_initialized", "is_available", "get_rank", "get_world_size", "get_local_rank",
           "get_backend", "barrier", "all_reduce", "broadcast", "all_gather", "all_gather_into_tensor",
           "reduce_scatter_tensor", "new_group", "destroy_process_group", "ReduceOp"]


def is_available() -> bool:
    return torch.distributed.is_available()


def is_initialized() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def get_rank(group=None) -> int:
    return torch.distributed.get_rank(group)


def get_world_size(group=None) -> int:
    return torch.distributed.get_world_size(group)


def get_local_rank() -> int:
    """This process's rank on its machine, as torchrun sets LOCAL_RANK (0 without torchrun)."""
    return int(os.environ.get("LOCAL_RANK", 0))


def get_backend(group=None) -> str:
    return torch.distributed.get_backend(group)


def barrier(group=None, async_op: bool = False, device_ids=None):
    return torch.distributed.barrier(group=group, async_op=async_op, device_ids=device_ids)


def all_reduce(tensor: torch.Tensor, op=ReduceOp.SUM, group=None, async_op: bool = False):
    return torch.distributed.all_reduce(tensor, op=op, group=group, async_op=async_op)


def broadcast(tensor: torch.Tensor, src: int, group=None, async_op: bool = False):
    return torch.distributed.broadcast(tensor, src=src, group=group, async_op=async_op)


def all_gather(tensor_list: list, tensor: torch.Tensor, group=None, async_op: bool = False):
    return torch.distributed.all_gather(tensor_list, tensor, group=group, async_op=async_op)


def all_gather_into_tensor(output_tensor: torch.Tensor, input_tensor: torch.Tensor, group=None,
                           async_op: bool = False):
    return torch.distributed.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)


def reduce_scatter_tensor(output_tensor: torch.Tensor, input_tensor: torch.Tensor, op=ReduceOp.SUM, group=None,
                          async_op: bool = False):
    return torch.distributed.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group,
                                                   async_op=async_op)


def new_group(ranks=None, **kwargs):
    return torch.distributed.new_group(ranks, **kwargs)


def destroy_process_group(group=None) -> None:
    torch.distributed.destroy_process_group(group)
