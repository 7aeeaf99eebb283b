"""Stage 3's two policies as pure arithmetic over names and sizes: which parameters form a unit,
and whether a unit stays gathered until its next use. No torch: `units.py` and `unit_gathering.py`
apply them to a live model, and `zero-lab explain` to a model it never builds.

Units (the order `units.py` documents):
    Phase 1: "persistent": each parameter of at most `persistence_threshold` elements, in the
             model's order, while their total stays within `model_persistence_threshold`.
    Phase 2: one unit per block, with the block's parameters that no other block reaches and that
             are not persistent.
    Phase 3: "root": every other parameter.
Reuse (`stage3_max_reuse_distance`, as official DeepSpeed reads it): walking the recorded order of
uses on from a use, a unit is used again soon when it comes back before the units passed add up
to the distance in elements (a distance of 0 keeps nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Callable, Sequence, TypeVar


@dataclass(frozen=True)
class ParameterEntry:
    """One trainable parameter as the policies see it: its name, shape and the blocks holding it."""

    name: str
    shape: tuple[int, ...]
    blocks: tuple[str, ...] = ()  # the blocks whose subtrees reach it (two or more: the root's)

    @property
    def numel(self) -> int:
        return prod(self.shape)


@dataclass(frozen=True)
class UnitPlan:
    """A unit: its name, its parameters (indices into the entries) and whether it is sharded."""

    name: str
    members: tuple[int, ...]
    sharded: bool


def plan_units(entries: Sequence[ParameterEntry], block_names: Sequence[str], persistence_threshold: int,
               model_persistence_threshold: int) -> list[UnitPlan]:
    """Stage 3's units for parameters in the model's order and its blocks in the model's order;
    units without parameters are left out."""
    persistent, total = [], 0  # Phase 1
    for index, entry in enumerate(entries):
        if entry.numel <= persistence_threshold and total + entry.numel <= model_persistence_threshold:
            persistent.append(index)
            total += entry.numel
    taken = set(persistent)
    units = [UnitPlan("persistent", tuple(persistent), False)]
    for block in block_names:  # Phase 2
        members = tuple(index for index, entry in enumerate(entries)
                        if entry.blocks == (block,) and index not in taken)
        taken.update(members)
        units.append(UnitPlan(block, members, True))
    units.append(UnitPlan("root", tuple(index for index in range(len(entries)) if index not in taken), True))  # Phase 3
    return [unit for unit in units if unit.members]


Use = TypeVar("Use")


def used_again_soon(unit: Use, order: Sequence[Use], position: int, numel_of: Callable[[Use], int],
                    max_reuse_distance: int) -> bool:
    """Whether `unit`, used at `position` of the order, comes again before the units after that
    position add up to the distance."""
    between = 0
    for other in order[position + 1:]:
        if between >= max_reuse_distance:
            return False
        if other is unit:
            return True
        between += numel_of(other)
    return False
