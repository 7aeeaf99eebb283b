"""Which parameters share a flat buffer: the unit, and the policy of stages 0-2 (the whole model).

A unit is a set of parameters laid out together; the engine makes one flat buffer per unit and
parameter group (a group's hyper-parameters apply to its buffers). Which parameters form a unit is
a policy decided outside the model and the engine, as torchtitan applies its parallelism per layer
from outside the model: stages 0-2 use one unit, the whole model, so each parameter group is one
flat buffer; stage 3's units are `stage3_units.py`'s, and `initialize` chooses between the two.
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
    sharded: bool = False  # whole only while in use (stage 3's blocks and root), else always whole
    whole_module: bool = True  # the unit is its module's subtree (a leaf module), not its own parameters


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
