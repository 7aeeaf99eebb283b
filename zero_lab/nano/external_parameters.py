"""External parameters: a parameter a module uses in its forward but does not own.

At stage 3 a module's use gathers its own unit; a parent that reads `self.linear1.weight` itself
(`F.linear(x, self.linear1.weight)`), or a head that reads the embedding's weight, uses a parameter
of another module's unit, freed outside that module's own uses. Official DeepSpeed gathers such a
parameter when it is read, and from then on treats it as the reading module's too (0.19.8:
`ZeROOrderedDict`, `register_external_parameter`). nano does the same, in phases:
    Phase 1 (watch): `watch(model, on_read)` replaces every module's `_parameters` dict by a
             `WatchedParameters`, whose lookup by name (`module.weight` goes through it) tells
             `on_read` which parameter is read. A copy or a pickle of the module gets a plain dict.
    Phase 2 (read): `unit_gathering` decides in `on_read` whether the parameter must be gathered:
             while a module's forward runs and the parameter's unit is not whole, it registers the
             parameter as external to that module (`register_external_parameter`) and gathers it
             for that module's use.
    Phase 3 (uses): each later use of the module, forward or backward, gathers its external
             parameters' units with its own and releases them under the same rules
             (`external_parameters` lists them).
    Phase 4 (unwatch): `unwatch(model)` gives back plain dicts (`engine.destroy()`).
A user can register a parameter ahead of time, as with DeepSpeed, so its first use is not a
surprise: `register_external_parameter(module, parameter)`, undone by
`unregister_external_parameter`; both keep DeepSpeed's names, arguments and errors.
"""

from __future__ import annotations

from typing import Callable

import torch

REGISTRY = "zero_lab_external_parameters"  # the attribute a module keeps its external parameters in


def external_parameters(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters registered as external to `module`, in the order they were registered."""
    return module.__dict__.get(REGISTRY, [])


def register_external_parameter(module: torch.nn.Module, parameter: torch.nn.Parameter) -> None:
    """Gather `parameter` for every use of `module`, as `module`'s own parameters (DeepSpeed's API)."""
    if not isinstance(parameter, torch.nn.Parameter):
        raise RuntimeError("Parameter is not a torch.nn.Parameter")
    registered = module.__dict__.setdefault(REGISTRY, [])
    if not any(known is parameter for known in registered):
        registered.append(parameter)


def unregister_external_parameter(module: torch.nn.Module, parameter: torch.nn.Parameter) -> None:
    """Undo `register_external_parameter` (DeepSpeed's API and errors)."""
    if not isinstance(parameter, torch.nn.Parameter):
        raise RuntimeError("Parameter is not a torch.nn.Parameter")
    registered = external_parameters(module)
    if not any(known is parameter for known in registered):
        raise RuntimeError("Parameter is not a registered external parameter of module.")
    registered[:] = [known for known in registered if known is not parameter]


class WatchedParameters(dict):
    """A module's `_parameters` that tells `on_read` of each parameter looked up by name (Phase 1)."""

    def __init__(self, parameters: dict, on_read: Callable[[torch.nn.Parameter], None]):
        super().__init__(parameters)
        self.on_read = on_read

    def __getitem__(self, name: str):
        parameter = super().__getitem__(name)
        if parameter is not None:
            self.on_read(parameter)
        return parameter

    def __reduce__(self):
        return dict, (dict(self),)  # a copy of the module is watched by no engine


def watch(model: torch.nn.Module, on_read: Callable[[torch.nn.Parameter], None]) -> None:
    for module in model.modules():
        module._parameters = WatchedParameters(module._parameters, on_read)


def unwatch(model: torch.nn.Module) -> None:
    for module in model.modules():
        if isinstance(module._parameters, WatchedParameters):
            module._parameters = dict(module._parameters)
