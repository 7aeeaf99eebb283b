"""DeepSpeed's `deepspeed.zero` API: swap `deepspeed.zero` for `zero_lab.nano.zero`.

    from zero_lab.nano import zero
    with zero.Init():
        model = build_a_model_too_large_for_one_rank()   # each module partitioned as it is built
    with zero.GatheredParameters(model.embed.weight, modifier_rank=0):
        if rank == 0:
            model.embed.weight.zero_()      # every rank sees rank 0's change after the block

`Init()`: while it is active, every module partitions its own parameters at the end of its
    __init__ (`init/partitions.py`): rank 0's values are broadcast and each rank keeps a 1/N slice,
    so no rank holds more than the module being built whole besides the slices so far (those of
    parameters a constructor builds and then drops included: Hugging Face builds an untied head
    before tying it to the embedding). A weight init that runs after a child was partitioned
    still reaches it, as in official DeepSpeed: inside the block `Module.apply(fn)` gathers each
    module's partitioned parameters, runs `fn`, broadcasts rank 0's values and re-partitions them
    (a parent's `self.apply(init)` in its __init__, Hugging Face's post_init), and
    `GatheredParameters(..., modifier_rank=0)` does the same for any parameters.
    `initialize` gathers each parameter back into its flat buffer, one at a time; a frozen one
    (no engine owns it) is made whole and stays so.

`GatheredParameters(params, modifier_rank=None, fwd_module=None)`:
    Phase 1 (enter): each listed parameter is whole on every rank: at stage 3 its unit is held and
             gathered (a use like any other, so it nests with forward and backward); below stage 3,
             and for stage 3's persistent parameters, it already is; a parameter partitioned by
             `Init` that no engine owns yet is all-gathered into its data.
    Phase 2 (exit): with `modifier_rank=r`, rank r's whole buffers are broadcast, every rank keeps
             its partition of them, and the fp32 master partitions follow (mixed precision), so
             the change survives the next optimizer step; without it, changes are dropped at
             stage 3 and under `Init` (the partitions were not touched). Then the units are
             released, and `Init`'s parameters are empty again.
Whole parameters no nano engine owns and `Init` did not partition are ignored, as DeepSpeed
ignores parameters it did not partition.

`register_external_parameter(module, parameter)`, `unregister_external_parameter(module, parameter)`:
    at stage 3, gather `parameter` for every use of `module` as if `module` owned it (a parameter
    read inside the model's forward is registered so on its first read; `external_parameters.py`).
    `GatheredParameters(..., fwd_module=module)` registers its parameters so, as DeepSpeed's does.
"""

from __future__ import annotations

import functools
from typing import Any, Iterable, Optional

import torch

from zero_lab.nano.init import partitions as init_partitions
from zero_lab.nano.collectives import Collectives
from zero_lab.nano.facade.distributed import init_distributed
from zero_lab.nano.errors import NanoConfigError
from zero_lab.nano.external_parameters import register_external_parameter, unregister_external_parameter

__all__ = ["Init", "GatheredParameters", "register_external_parameter", "unregister_external_parameter"]


class GatheredParameters:
    """A context in which `params` are whole on every rank (see the module docstring)."""

    def __init__(self, params, modifier_rank: Optional[int] = None, fwd_module: Optional[torch.nn.Module] = None,
                 enabled: bool = True):
        parameters = [params] if isinstance(params, torch.Tensor) else list(params if isinstance(params, Iterable) else [])
        if fwd_module is not None:  # as official: each becomes an external parameter of fwd_module
            for parameter in parameters:
                if hasattr(parameter, "zero_lab_owner") or init_partitions.is_partitioned(parameter):
                    register_external_parameter(fwd_module, parameter)
        self.enabled = enabled
        self.modifier_rank = modifier_rank
        owners = {}
        for parameter in parameters:
            owner = getattr(parameter, "zero_lab_owner", None)
            if owner is not None:
                optimizer, index = owner
                owners[(id(optimizer), index)] = owner
        self.owners = list(owners.values())
        unique = {id(parameter): parameter for parameter in parameters if init_partitions.is_partitioned(parameter)}
        self.partitioned = list(unique.values())  # built under Init, no engine yet
        self.collectives = Collectives() if self.partitioned else None

    def __enter__(self):
        if self.enabled:
            for optimizer, index in self.owners:  # Phase 1
                optimizer.hold_whole(index)
            for parameter in self.partitioned:
                init_partitions.gather(parameter, self.collectives)
        return self

    def __exit__(self, *exc):
        if not self.enabled:
            return False
        for optimizer, index in self.owners:  # Phase 2
            if self.modifier_rank is not None:
                optimizer.adopt_values(index, self.modifier_rank)
            optimizer.let_go(index)
        for parameter in self.partitioned:
            init_partitions.release(parameter, self.collectives, self.modifier_rank)
        return False


# Init's arguments nano honours as official DeepSpeed's defaults only (its value, and the fix).
INIT_DEFAULTS = {"data_parallel_group": None, "remote_device": None, "pin_memory": False, "dtype": None,
                 "mpu": None, "zero_param_parallel_group": None, "zero_quantized_weights": False,
                 "zero_quantized_nontrainable_weights": False, "sequence_data_parallel_group": None,
                 "param_swapper": None}


class Init:
    """Partition parameters as modules are built (see the module docstring)."""

    def __init__(self, module: Optional[torch.nn.Module] = None, config_dict_or_path: Any = None, config: Any = None,
                 enabled: bool = True, mem_efficient_linear: bool = True, **others):
        for name, value in others.items():
            if name not in INIT_DEFAULTS:
                raise TypeError(f"Init() got an unexpected keyword argument {name!r}")
            if value != INIT_DEFAULTS[name]:
                raise NanoConfigError(f"zero.Init({name}={value!r}) is not implemented by nano; leave {name} out")
        self.enabled = enabled
        self.wrapped: dict[type, Any] = {}  # class -> its own __init__ before Init (None: it had none)
        self.partitioned_bytes = 0  # every slice this rank kept, of parameters kept or dropped since
        if enabled:
            init_distributed()
            self.collectives = Collectives()
        if enabled and module is not None:  # DeepSpeed's form for a module already built
            for child in module.modules():
                self._partition_own_parameters(child)

    def _partition_own_parameters(self, module: torch.nn.Module) -> None:
        for parameter in module.parameters(recurse=False):
            if not init_partitions.is_partitioned(parameter):
                init_partitions.partition(parameter, self.collectives)
                self.partitioned_bytes += parameter.zero_lab_init_partition.untyped_storage().nbytes()

    def _wrap(self, cls: type) -> None:
        if cls in self.wrapped:
            return
        self.wrapped[cls] = cls.__dict__.get("__init__")
        inner = cls.__init__
        init = self

        @functools.wraps(inner)
        def partition_after(module, *args, **kwargs):
            inner(module, *args, **kwargs)
            if type(module) is cls:  # the most derived __init__ has finished: the module is built
                init._partition_own_parameters(module)

        cls.__init__ = partition_after

    def __enter__(self):
        if not self.enabled:
            return self
        pending = [torch.nn.Module]
        while pending:  # every module class defined so far
            cls = pending.pop()
            self._wrap(cls)
            pending.extend(cls.__subclasses__())
        self.original_init_subclass = torch.nn.Module.__dict__.get("__init_subclass__")
        init = self

        def wrap_new_class(cls, **kwargs):  # and every one defined inside the block
            super(torch.nn.Module, cls).__init_subclass__(**kwargs)
            init._wrap(cls)

        torch.nn.Module.__init_subclass__ = classmethod(wrap_new_class)
        self.original_apply = torch.nn.Module.__dict__["apply"]
        torch.nn.Module.apply = self._apply_with_gather(self.original_apply)
        return self

    def _apply_with_gather(self, apply):
        """`Module.apply` inside the block: `fn` meets each module's own partitioned parameters
        whole, and rank 0's result becomes every rank's partition (official DeepSpeed's wrapper)."""
        collectives = self.collectives

        def gathered_for(fn):
            if getattr(fn, "zero_lab_gathers", False):
                return fn

            @functools.wraps(fn)
            def on_whole_parameters(module):
                own = [parameter for parameter in module.parameters(recurse=False)
                       if init_partitions.is_partitioned(parameter)]
                for parameter in own:
                    init_partitions.gather(parameter, collectives)
                fn(module)
                for parameter in own:
                    init_partitions.release(parameter, collectives, modifier_rank=0)

            on_whole_parameters.zero_lab_gathers = True
            return on_whole_parameters

        @functools.wraps(apply)
        def apply_with_gather(module, fn):
            return apply(module, gathered_for(fn))

        return apply_with_gather

    def __exit__(self, *exc):
        if not self.enabled:
            return False
        for cls, original in self.wrapped.items():
            if original is None:
                del cls.__init__
            else:
                cls.__init__ = original
        self.wrapped.clear()
        if self.original_init_subclass is None:
            del torch.nn.Module.__init_subclass__
        else:
            torch.nn.Module.__init_subclass__ = self.original_init_subclass
        torch.nn.Module.apply = self.original_apply
        return False
