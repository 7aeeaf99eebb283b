"""nano's model-state formula for one workload: the model, its config, its world size.

Phase 1: the flat buffers nano would build: the config's unit policy (`nano.stage3_units.choose_units`)
         applied to the model's parameter groups as the harness forms them (decayed matrices, the
         rest undecayed), as (elements, role) pairs. Works on a model built on the meta device.
Phase 2: the peak model-state bytes per rank of those buffers, per place (device, host), with the
         config's offload (`nano.memory_formula.peak_model_state_bytes_by_place`); with Muon, each
         Muon buffer's momentum on the rank that keeps the most (`nano.muon.memory`).

The harness logs Phase 2 for its own run, so a report sets the measured bytes beside the formula
at every stage and offload; `zero-lab estimate` calls Phase 1 for a preset or model directory.
"""

from __future__ import annotations

import torch

from zero_lab.nano.config import NanoConfig
from zero_lab.nano.memory.memory_formula import peak_model_state_bytes_by_place
from zero_lab.nano.policies.stage3_units import choose_units, flat_buffer_roles
from zero_lab.workload.models import parameter_groups


def flat_buffers(model: torch.nn.Module, settings: NanoConfig) -> list[tuple[int, str]]:
    """Phase 1: (elements, role) of every flat buffer nano makes of this model with these settings."""
    groups = parameter_groups(model, weight_decay=0.0)  # the split, not the values, decides the buffers
    trainable = [parameter for group in groups for parameter in group["params"]]
    return flat_buffer_roles(choose_units(model, trainable, settings.zero_optimization), muon_halves(model, settings, groups))


def muon_halves(model: torch.nn.Module, settings: NanoConfig, groups: list[dict]) -> list[dict]:
    """With Muon, the groups split into their Muon and AdamW halves, as `initialize` splits them."""
    if settings.optimizer is None or settings.optimizer.type != "Muon":
        return groups
    from zero_lab.nano.muon.groups import split_groups, tag_parameters

    tag_parameters(model)
    return split_groups(groups, settings.optimizer.params)


def momentum_numels(model: torch.nn.Module, settings: NanoConfig, world_size: int) -> list | None:
    """Per flat buffer, the most momentum elements a rank keeps for it (None: an Adam buffer), or None
    without Muon (`nano.muon.memory`)."""
    if settings.optimizer is None or settings.optimizer.type != "Muon":
        return None
    from zero_lab.nano.layout import FlatLayout
    from zero_lab.nano.muon.memory import momentum_numel
    from zero_lab.nano.units import split_groups_by_unit

    groups = muon_halves(model, settings, parameter_groups(model, weight_decay=0.0))
    trainable = [parameter for group in groups for parameter in group["params"]]
    units = choose_units(model, trainable, settings.zero_optimization)
    found = []
    for _, group_index, parameters in split_groups_by_unit(units, groups):
        if not groups[group_index]["use_muon"]:
            found.append(None)
            continue
        layout = FlatLayout.for_stage(tuple(parameter.numel() for parameter in parameters),
                                      settings.zero_optimization.stage, settings.precision, world_size)
        partitioned = settings.stage_facts.partitions_parameters  # stage 3: the momentum's partition
        found.append(max(momentum_numel(layout, rank, partitioned) for rank in range(world_size)))
    return found


def peak_bytes(model: torch.nn.Module, settings: NanoConfig, world_size: int) -> dict[str, int]:
    """Phase 2: {"device": bytes, "host": bytes} per rank, the larger of the backward and the step."""
    zero = settings.zero_optimization
    buffers = flat_buffers(model, settings)
    offload = {"offload_optimizer": zero.offload_optimizer.device == "cpu",
               "offload_parameters": zero.offload_param.device == "cpu"}
    momentum = momentum_numels(model, settings, world_size) or [None] * len(buffers)
    if zero.stage == 3:
        return peak_model_state_bytes_by_place(3, settings.precision, sum(n for n, _ in buffers), world_size,
                                               buffers, **offload, hpz_partition_size=zero.zero_hpz_partition_size,
                                               momentum_numels=momentum)
    # Below stage 3 each parameter group is one buffer, padded on its own.
    figures = [peak_model_state_bytes_by_place(zero.stage, settings.precision, numel, world_size,
                                               grad_accum_dtype=settings.data_types.grad_accum_dtype, **offload,
                                               momentum_numels=[momentum[index]])
               for index, (numel, _) in enumerate(buffers)]
    return {place: sum(figure[place] for figure in figures) for place in ("device", "host")}
