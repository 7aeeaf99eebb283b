"""Stage 3's units: which parameters are gathered together, chosen outside the model and the engine.

A unit is a set of parameters laid out (and, at stage 3, gathered) together (`units.py`; stages
0-2 use one, the whole model). Stage 3 gathers a unit whole for each use, so its units are what
official DeepSpeed fetches at once (`fetch_sub_module`):
    1. persistent: every parameter of at most `stage3_param_persistence_threshold` elements
       (in `named_parameters()` order, while their total stays within
       `stage3_model_persistence_threshold`) is a unit of its own ("persistent:" and its name),
       kept whole on every rank and published after each step in one all-gather per parameter,
       as official DeepSpeed does.
    2. one unit per module fetched as one (`fetch_modules`): each module matching
       `zero_optimization.leaf_module` (DeepSpeed's classes, names and name suffixes) or marked by
       `set_z3_leaf_modules` (`leaf_modules`) with the parameters of its subtree, and every other
       module with its own parameters (`recurse=False`: each Linear, Embedding, norm), named after
       the module.
    3. "root": every other parameter: one that two such modules own (a head tied to the
       embedding), or the model's own; gathered for the model's whole forward and backward. So
       every parameter belongs to exactly one unit and is whole wherever a module uses it.
(`find_blocks`, each ModuleList child, is the repeated block FSDP2 shards.) `choose_units` is the
policy `initialize` applies for a config: the whole model below stage 3, these units at stage 3.
"""

from __future__ import annotations

import torch

from zero_lab.nano import stages
from zero_lab.nano.init.partitions import is_partitioned, numel_of
from zero_lab.nano.policies.leaf_modules import z3_leaf_module
from zero_lab.nano.policies.unit_policy import ParameterEntry, plan_units
from zero_lab.nano.units import Unit, split_groups_by_unit, whole_model


def is_leaf(name: str, module: torch.nn.Module, classes: tuple[str, ...], names: tuple[str, ...],
            suffixes: tuple[str, ...]) -> bool:
    """Whether `module` (called `name` in the model) is a leaf module: fetched whole, its subtree one unit."""
    qualified = f"{type(module).__module__}.{type(module).__qualname__}"
    return (z3_leaf_module(module) or type(module).__name__ in classes or qualified in classes or name in names
            or any(name.endswith(suffix) for suffix in suffixes))


def is_block(name: str, module: torch.nn.Module, parent: torch.nn.Module | None, classes: tuple[str, ...],
             names: tuple[str, ...], suffixes: tuple[str, ...]) -> bool:
    """Whether `module` (called `name` in the model) is a repeated block (FSDP2 shards per block):
    a leaf module when `leaf_module` names some, else each child of a ModuleList."""
    if classes or names or suffixes:
        return is_leaf(name, module, classes, names, suffixes)
    return isinstance(parent, torch.nn.ModuleList)


def find_blocks(model: torch.nn.Module, classes: tuple[str, ...] = (), names: tuple[str, ...] = (),
                suffixes: tuple[str, ...] = ()) -> list[tuple[str, torch.nn.Module]]:
    """(name, module) of every block, outermost first, in the model's order."""
    parents = {id(child): parent for parent in model.modules() for child in parent.children()}
    blocks: list[tuple[str, torch.nn.Module]] = []
    for name, module in model.named_modules():
        inside_a_block = any(any(candidate is module for candidate in block.modules()) for _, block in blocks)
        if module is not model and not inside_a_block and is_block(name, module, parents.get(id(module)), classes,
                                                                   names, suffixes):
            blocks.append((name, module))
    return blocks


def fetch_modules(model: torch.nn.Module, classes: tuple[str, ...] = (), names: tuple[str, ...] = (),
                  suffixes: tuple[str, ...] = ()) -> list[tuple[str, torch.nn.Module, bool]]:
    """(name, module, whole) of every module fetched as one, in the model's order: each leaf module
    (whole: its subtree), then inside no leaf module, each module other than the model that owns
    parameters itself (not whole: its own parameters, as official's `recurse=False`)."""
    blocks: list[tuple[str, torch.nn.Module, bool]] = []
    inside_a_leaf: set[int] = set()
    for name, module in model.named_modules():
        if module is model or id(module) in inside_a_leaf:
            continue
        if is_leaf(name, module, classes, names, suffixes):
            blocks.append((name, module, True))
            inside_a_leaf.update(id(inner) for inner in module.modules())
        elif next(module.parameters(recurse=False), None) is not None:
            blocks.append((name, module, False))
    return blocks


def parameter_entries(model: torch.nn.Module, blocks: list[tuple[str, torch.nn.Module, bool]],
                      wanted: set | None = None) -> list[tuple[ParameterEntry, torch.nn.Parameter]]:
    """Each (wanted) parameter as the unit policy sees it, in `named_parameters()` order."""
    holders: dict[torch.nn.Parameter, list[str]] = {}
    for block_name, block, whole in blocks:
        for parameter in block.parameters(recurse=whole):
            holders.setdefault(parameter, []).append(block_name)
    return [(ParameterEntry(name, tuple(parameter.zero_lab_shape if is_partitioned(parameter) else parameter.shape),
                            tuple(holders.get(parameter, ()))), parameter)
            for name, parameter in model.named_parameters() if wanted is None or parameter in wanted]


def per_block(model: torch.nn.Module, trainable: list[torch.nn.Parameter], classes: tuple[str, ...] = (),
              names: tuple[str, ...] = (), suffixes: tuple[str, ...] = (), persistence_threshold: int = 0,
              model_persistence_threshold: int = 0) -> list[Unit]:
    """Stage 3's units, in the order listed in this module's docstring: the modules fetched as one
    are found in the module tree here, the parameters assigned by `unit_policy.plan_units`."""
    wanted = set(trainable)
    blocks = fetch_modules(model, classes, names, suffixes)
    paired = parameter_entries(model, blocks, wanted)
    entries, parameters = [entry for entry, _ in paired], [parameter for _, parameter in paired]
    module_of = {block_name: (block, whole) for block_name, block, whole in blocks}
    return [Unit(plan.name, module_of.get(plan.name, (model, True))[0], [parameters[index] for index in plan.members],
                 plan.sharded, module_of.get(plan.name, (model, True))[1])
            for plan in plan_units(entries, [block_name for block_name, _, _ in blocks], persistence_threshold,
                                   model_persistence_threshold)]


def choose_units(model: torch.nn.Module, trainable: list[torch.nn.Parameter], zero) -> list[Unit]:
    """The policy for a config's `zero_optimization` section: the whole model below stage 3;
    persistent, fetched modules and root at stage 3."""
    if not stages.of(zero.stage).partitions_parameters:
        return whole_model(model, trainable)
    leaf = zero.leaf_module
    return per_block(model, trainable, tuple(leaf.classes) if leaf else (), tuple(leaf.names) if leaf else (),
                     tuple(leaf.name_suffixes) if leaf else (), zero.stage3_param_persistence_threshold,
                     zero.stage3_model_persistence_threshold)


def role(unit: Unit) -> str:
    """The memory formula's name for what a unit's buffers do at stage 3."""
    return "persistent" if not unit.sharded else "root" if unit.name == "root" else "block"


def flat_buffer_roles(units: list[Unit], groups: list[dict]) -> list[tuple[int, str]]:
    """(elements, role) of every flat buffer the engine builds: what the memory formula needs to
    count a model at stage 3 without building the engine."""
    return [(sum(numel_of(parameter) for parameter in parameters), role(units[unit_index]))
            for unit_index, _, parameters in split_groups_by_unit(units, groups)]
