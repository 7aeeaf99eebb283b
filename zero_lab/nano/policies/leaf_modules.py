"""DeepSpeed's leaf-module API (`deepspeed.utils.set_z3_leaf_modules` and its companions): a module
marked in the model itself, as the config's `leaf_module` names one, is fetched whole at stage 3.

A leaf module's subtree is one unit (`stage3_units.fetch_modules`), gathered once for the module's
forward and once for its backward, where each module owning parameters is otherwise a unit of its
own: fewer, larger units, so fewer hooks, collectives and flat buffers a step (FSDP2's granularity
when the marked class is the decoder layer). Hugging Face marks its MoE blocks this way, so that
every rank gathers all experts whichever it routes to. The mark is official DeepSpeed's attribute,
so a model marked for either engine reads the same to both.
"""

from __future__ import annotations

import torch

LEAF_FLAG = "_z3_leaf"


def z3_leaf_module(module: torch.nn.Module) -> bool:
    """Whether `module` is marked a leaf module."""
    return bool(getattr(module, LEAF_FLAG, False))


def get_z3_leaf_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules of `model` marked leaf modules, in its order."""
    return [module for module in model.modules() if z3_leaf_module(module)]


def set_z3_leaf_modules(model: torch.nn.Module, leaf_module_classes: list, raise_if_not_found: bool = True
                        ) -> list[torch.nn.Module]:
    """Mark every module of `model` whose class is one of `leaf_module_classes` (classes, or class
    names) a leaf module; the modules marked. ValueError when none is found (unless told not to)."""
    return _mark(model, leaf_module_classes, True, raise_if_not_found)


def unset_z3_leaf_modules(model: torch.nn.Module, leaf_module_classes: list, raise_if_not_found: bool = True
                          ) -> list[torch.nn.Module]:
    """Undo `set_z3_leaf_modules` for those classes; the modules unmarked."""
    return _mark(model, leaf_module_classes, False, raise_if_not_found)


def _mark(model: torch.nn.Module, classes: list, flag: bool, raise_if_not_found: bool) -> list[torch.nn.Module]:
    types = tuple(entry for entry in classes if isinstance(entry, type))
    names = {entry for entry in classes if isinstance(entry, str)}
    found = [module for module in model.modules() if type(module) in types or type(module).__name__ in names]
    if raise_if_not_found and not found:
        wanted = sorted(names | {entry.__name__ for entry in types})
        raise ValueError(f"no module of class {', '.join(wanted)} in the model: nothing to mark as a stage-3 leaf "
                         "module; pass the class (or its name) of a module the model contains")
    for module in found:
        setattr(module, LEAF_FLAG, flag)
    return found
