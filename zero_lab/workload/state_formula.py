"""nano's model-state formula for one workload: the model, its config, its world size.

Phase 1: the flat buffers nano would build: the config's unit policy (`nano.stage3_units.choose_units`)
         applied to the model's parameter groups as the harness forms them (decayed matrices, the
         rest undecayed), as (elements, role) pairs. Works on a model built on the meta device.
Phase 2: the peak model-state bytes per rank of those buffers, per place (device, host), with the
         config's offload (`nano.memory_formula.peak_model_state_bytes_by_place`).

The harness logs Phase 2 for its own run, so a report sets the measured bytes beside the formula
at every stage and offload; `zero-lab estimate` calls Phase 1 for a preset or model directory.
"""

from __future__ import annotations

import torch

from zero_lab.nano.config import NanoConfig
from zero_lab.nano.memory_formula import peak_model_state_bytes_by_place
from zero_lab.nano.stage3_units import choose_units, flat_buffer_roles
from zero_lab.workload.models import parameter_groups


def flat_buffers(model: torch.nn.Module, settings: NanoConfig) -> list[tuple[int, str]]:
    """Phase 1: (elements, role) of every flat buffer nano makes of this model with these settings."""
    groups = parameter_groups(model, weight_decay=0.0)  # the split, not the values, decides the buffers
    trainable = [parameter for group in groups for parameter in group["params"]]
    return flat_buffer_roles(choose_units(model, trainable, settings.zero_optimization), groups)


def peak_bytes(model: torch.nn.Module, settings: NanoConfig, world_size: int) -> dict[str, int]:
    """Phase 2: {"device": bytes, "host": bytes} per rank, the larger of the backward and the step."""
    zero = settings.zero_optimization
    buffers = flat_buffers(model, settings)
    offload = {"offload_optimizer": zero.offload_optimizer.device == "cpu",
               "offload_parameters": zero.offload_param.device == "cpu"}
    if zero.stage == 3:
        return peak_model_state_bytes_by_place(3, settings.precision, sum(n for n, _ in buffers), world_size,
                                               buffers, **offload, hpz_partition_size=zero.zero_hpz_partition_size)
    # Below stage 3 each parameter group is one buffer, padded on its own.
    figures = [peak_model_state_bytes_by_place(zero.stage, settings.precision, numel, world_size,
                                               grad_accum_dtype=settings.data_types.grad_accum_dtype, **offload)
               for numel, _ in buffers]
    return {place: sum(figure[place] for figure in figures) for place in ("device", "host")}
