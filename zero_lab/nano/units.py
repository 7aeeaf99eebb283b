"""Which parameters share a flat buffer: the unit policy, chosen outside the model and the engine.

A unit is a set of parameters laid out together; the engine makes one flat buffer per unit and
parameter group (a group's hyper-parameters apply to its buffers). Stages 0-2 use one unit, the
whole model, so each parameter group is one flat buffer. The policy lives here, apart from the
mechanism, as torchtitan applies its parallelism per layer from outside the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Unit:
    """Parameters laid out (and, at stage 3, gathered) together."""

    name: str
    module: torch.nn.Module
    parameters: list[torch.nn.Parameter] = field(default_factory=list)


def whole_model(model: torch.nn.Module, trainable: list[torch.nn.Parameter]) -> list[Unit]:
    """Stages 0-2: one unit holding every trainable parameter."""
    return [Unit("model", model, list(trainable))]


def split_groups_by_unit(units: list[Unit], groups: list[dict]) -> list[tuple[int, int, list[torch.nn.Parameter]]]:
    """(unit index, group index, parameters in the group's order) for every non-empty pair: the
    flat buffers to build, unit by unit."""
    member_of = {parameter: index for index, unit in enumerate(units) for parameter in unit.parameters}
    pairs = []
    for unit_index in range(len(units)):
        for group_index, group in enumerate(groups):
            parameters = [parameter for parameter in group["params"] if member_of.get(parameter) == unit_index]
            if parameters:
                pairs.append((unit_index, group_index, parameters))
    return pairs
