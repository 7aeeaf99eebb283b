"""Stage 3's two policies as pure arithmetic over names and sizes: which parameters form a unit,
and whether a unit stays gathered until its next use. No torch: `stage3_units.py` and `unit_gathering.py`
apply them to a live model, and `zero-lab explain` to a model it never builds.

Units (the order `stage3_units.py` documents). A "block" here is a module fetched as one, as official
DeepSpeed fetches (`fetch_sub_module`): each module's own parameters (`recurse=False`), or a leaf
module's (`leaf_module`) whole subtree.
    Phase 1: persistent: each parameter of at most `persistence_threshold` elements, in the
             model's order, while their total stays within `model_persistence_threshold`, is a
             unit of its own, named "persistent:" and its name (official DeepSpeed partitions each
             persistent parameter on its own; after every step it gathers them one call per
             parameter, `stage3.py` `_post_step`, and nano in one call, `coalesced_gather`).
    Phase 2: one unit per block, with the block's parameters that no other block reaches and that
             are not persistent.
    Phase 3: "root": every other parameter (one owned by two modules, as a tied head's, or by
             the model itself).
When a unit is gathered and freed is `fetch_policy`'s (official DeepSpeed's rules over the recorded
trace); `forward_trace` gives that policy the trace of a model described by its parameter table.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Sequence

from zero_lab.nano.fetch_trace import TracedUse


PERSISTENT_PREFIX = "persistent:"  # a persistent unit's name: this, then its parameter's name


@dataclass(frozen=True)
class ParameterEntry:
    """One trainable parameter as the policies see it: its name, shape and the blocks holding it."""

    name: str
    shape: tuple[int, ...]
    blocks: tuple[str, ...] = ()  # the blocks that fetch it (two or more, as a tied head's: the root's)

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
    units = [UnitPlan(f"{PERSISTENT_PREFIX}{entries[index].name}", (index,), False) for index in persistent]
    for block in block_names:  # Phase 2
        members = tuple(index for index, entry in enumerate(entries)
                        if entry.blocks == (block,) and index not in taken)
        taken.update(members)
        units.append(UnitPlan(block, members, True))
    units.append(UnitPlan("root", tuple(index for index in range(len(entries)) if index not in taken), True))  # Phase 3
    return [unit for unit in units if unit.members]


def traced_calls(calls: Sequence[str], entries: Sequence[ParameterEntry],
                 units: Sequence[UnitPlan]) -> list[TracedUse]:
    """The uses of the modules named in `calls`, in that order (the model itself is ""): each
    touches the parameters it fetches (`ParameterEntry.blocks`; none for a container) and needs
    their sharded unit whole (the root, if they are the root's)."""
    unit_of = {index: unit.name for unit in units if unit.sharded for index in unit.members}

    def use(module: str) -> TracedUse:
        members = [index for index, entry in enumerate(entries) if module in entry.blocks]
        sharded = {unit_of[index] for index in members if index in unit_of}
        return TracedUse(module, next(iter(sharded)) if sharded else None, sum(entries[index].numel for index in members))

    return [use(module) for module in calls]


def forward_trace(entries: Sequence[ParameterEntry], block_names: Sequence[str],
                  units: Sequence[UnitPlan]) -> list[TracedUse]:
    """The trace `unit_gathering` records for a model whose forward calls its blocks in the order of
    the parameter table, each inside the containers its name passes through (a ModuleList, never
    called, is left out): the model itself, then each block after the containers entered before it;
    a block whose parameters another block owns (a tied head) comes last. Modules without
    parameters that the forward also calls (an activation, rotary embeddings) are not in the table:
    a trace recorded from the model has them too (`model_shapes.preset_module_calls` knows the
    presets' calls)."""
    owners = [entry.name.rpartition(".")[0] for entry in entries]
    order = [block for block in dict.fromkeys(owners) if block in block_names]
    order += [block for block in block_names if block not in order]
    calls, entered = [""], set()
    for block in order:
        parts = block.split(".")
        for depth in range(1, len(parts)):
            container = ".".join(parts[:depth])
            if container not in entered and not parts[depth].isdigit():
                entered.add(container)
                calls.append(container)
        calls.append(block)
    return traced_calls(calls, entries, units)
