"""Where fully_shard is applied: each decoder block, then the root (as torchtitan does).

The policy is decided here, outside the model and the engine. A decoder block is a child of a
`torch.nn.ModuleList` (`nano.stage3_units.find_blocks`; nano's stage 3 gathers finer units, each module's
own parameters, as official DeepSpeed fetches them); the root's
own `fully_shard` takes what no block holds (embeddings, final norm, LM head) as one more unit.
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from zero_lab.fsdp2.config_map import Fsdp2Plan
from zero_lab.nano.policies.stage3_units import find_blocks


def _dtype(name: str | None) -> torch.dtype | None:
    return getattr(torch, name) if name else None


def shard_model(model: torch.nn.Module, plan: Fsdp2Plan, device: torch.device, world_size: int) -> list[str]:
    """Apply fully_shard to every block and the root, in place; returns the blocks' names."""
    mesh = init_device_mesh(device.type, (world_size,))
    options = {
        "mesh": mesh,
        "reshard_after_forward": plan.reshard_after_forward,
        "mp_policy": MixedPrecisionPolicy(param_dtype=_dtype(plan.param_dtype), reduce_dtype=_dtype(plan.reduce_dtype)),
        "offload_policy": CPUOffloadPolicy(pin_memory=plan.pin_memory) if plan.cpu_offload else OffloadPolicy(),
    }
    blocks = find_blocks(model)
    for _, block in blocks:
        fully_shard(block, **options)
    fully_shard(model, **options)
    return [name for name, _ in blocks]
