"""FSDP2 (`torch.distributed.fsdp.fully_shard`) as zero-lab's third impl, with DeepSpeed's entry
points (`init_distributed`, `initialize`), so the harness runs it as it runs nano and official.

Vocabulary (FSDP2's own, "[Note: FSDP tensors]" in torch): the sharded parameter is a DTensor
whose local tensor is this rank's dim-0 chunk of one parameter, padded to the first chunk's size;
the unsharded parameter is the all-gather output of a whole unit, freed at reshard by resizing its
storage to 0; the sharded gradient is the reduce-scatter output, also a DTensor; the optimizer's
exp_avg and exp_avg_sq are DTensors shaped like the sharded parameter.

`initialize` runs in phases:
    Phase 1: map the DeepSpeed config (`config_map.map_config`): refusals are one line.
    Phase 2: the module on the run's device, its parameters in fp32 (FSDP2 keeps fp32 sharded
             parameters and casts them to param_dtype for compute); buffers stay as built.
    Phase 3: fully_shard each decoder block, then the root (`sharding.shard_model`).
    Phase 4: the torch optimizer over the new (sharded) parameters, in the caller's groups
             (matched by name: fully_shard replaces every parameter object), and the schedule;
             with Muon, torch.optim.Muon and AdamW (`muon.py`, its parameters named before Phase 3).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from zero_lab.fsdp2.config_map import Fsdp2ConfigError, map_config, not_applicable_message
from zero_lab.fsdp2.engine import Fsdp2Engine
from zero_lab.fsdp2.muon import MuonAndAdamW, muon_names
from zero_lab.nano.facade.distributed import init_distributed
from zero_lab.nano.facade.lr_schedules import build_scheduler

__all__ = ["Fsdp2ConfigError", "Fsdp2Engine", "init_distributed", "initialize"]


def _named_groups(model: torch.nn.Module, model_parameters: Any) -> list[dict]:
    """The caller's parameter groups with each parameter replaced by its name."""
    names = {parameter: name for name, parameter in model.named_parameters()}
    entries = list(model.parameters() if model_parameters is None else model_parameters)
    groups = entries if entries and isinstance(entries[0], dict) else [{"params": entries}]
    return [{**group, "params": [names[parameter] for parameter in group["params"] if parameter.requires_grad]}
            for group in groups]


def initialize(model: torch.nn.Module, model_parameters: Any = None, config: dict | None = None,
               **_ignored: Any) -> tuple[Fsdp2Engine, torch.optim.Optimizer, None, Any]:
    """Return (engine, optimizer, None, lr_scheduler), as deepspeed.initialize does."""
    from zero_lab.fsdp2.sharding import shard_model

    world_size = dist.get_world_size()
    plan = map_config(config or {}, world_size=world_size)  # Phase 1
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    groups = _named_groups(model, model_parameters)
    tagged = muon_names(model) if plan.optimizer == "Muon" else set()  # before fully_shard replaces them
    model.to(device)  # Phase 2
    for parameter in model.parameters():
        if parameter.is_floating_point() and parameter.dtype != torch.float32:
            parameter.data = parameter.data.float()
    shard_model(model, plan, device, world_size)  # Phase 3
    sharded = dict(model.named_parameters())  # Phase 4
    torch_groups = [{**group, "params": [sharded[name] for name in group["params"]]} for group in groups]
    torch_groups = [group for group in torch_groups if group["params"]]
    if plan.optimizer == "Muon":  # torch.optim.Muon and AdamW (`muon.py`)
        optimizer = MuonAndAdamW(torch_groups, tagged, {value: key for key, value in sharded.items()},
                                 plan.optimizer_params["muon_params"])
    else:
        optimizer = getattr(torch.optim, plan.optimizer)(torch_groups, **plan.optimizer_params)
    scheduler = build_scheduler(*plan.scheduler, optimizer) if plan.scheduler else None
    message = not_applicable_message(plan)
    samples_per_step = int((config or {}).get("train_micro_batch_size_per_gpu", 0)) \
        * plan.gradient_accumulation_steps * world_size
    engine = Fsdp2Engine(model, plan, optimizer, scheduler, device, [message] if message else [], samples_per_step)
    return engine, optimizer, None, scheduler
