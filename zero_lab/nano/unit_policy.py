"""Stage 3's two policies as pure arithmetic over names and sizes: which parameters form a unit,
and whether a unit stays gathered until its next use. No torch: `units.py` and `unit_gathering.py`
apply them to a live model, and `zero-lab explain` to a model it never builds.

Units (the order `units.py` documents):
    Phase 1: "persistent": each parameter of at most `persistence_threshold` elements, in the
             model's order, while their total stays within `model_persistence_threshold`.
    Phase 2: one unit per block, with the block's parameters that no other block reaches and that
             are not persistent.
    Phase 3: "root": every other parameter.
When a unit is gathered and freed is `fetch_policy`'s (official DeepSpeed's rules over the recorded
trace); `forward_trace` gives that policy the trace of a model described by its parameter table.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Sequence

from zero_lab.nano.fetch_policy import TracedUse


@dataclass(frozen=True)
class ParameterEntry:
    """One trainable parameter as the policies see it: its name, shape and the blocks holding it."""

    name: str
    shape: tuple[int, ...]
    blocks: tuple[str, ...] = ()  # the blocks whose subtrees reach it (two or more: the root's)
    also_used_by: tuple[str, ...] = ()  # other modules using it after the blocks (a head tied to it)

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


def forward_trace(entries: Sequence[ParameterEntry], block_names: Sequence[str],
                  units: Sequence[UnitPlan]) -> list[TracedUse]:
    """The trace `unit_gathering` records for a model whose forward uses its modules in the
    parameter table's order: the model itself, the modules outside the blocks whose parameters
    come before the blocks (the embedding), each block, then the others (final norm, head)."""
    unit_of = {index: unit.name for unit in units if unit.sharded for index in unit.members}
    first_block = min((index for index, entry in enumerate(entries) if entry.blocks), default=len(entries))
    before: dict[str, list[int]] = {}
    after: dict[str, list[int]] = {}
    for index, entry in enumerate(entries):
        if not entry.blocks:
            module = entry.name.rpartition(".")[0]
            (before if index < first_block else after).setdefault(module, []).append(index)
    for index, entry in enumerate(entries):  # a tied head is called last
        for other in entry.also_used_by:
            after.setdefault(other, []).append(index)

    def use(module: str, members: list[int]) -> TracedUse:
        sharded = {unit_of[index] for index in members if index in unit_of}
        return TracedUse(module, next(iter(sharded)) if sharded else None, sum(entries[i].numel for i in members))

    blocks = [TracedUse(block, block if any(unit.name == block for unit in units) else None,
                        sum(entry.numel for entry in entries if block in entry.blocks)) for block in block_names]
    return ([TracedUse("", None, 0)] + [use(module, members) for module, members in before.items()] + blocks
            + [use(module, members) for module, members in after.items()])
