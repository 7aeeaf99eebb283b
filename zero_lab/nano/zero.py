"""DeepSpeed's `deepspeed.zero` API for whole parameters: swap `deepspeed.zero` for `zero_lab.nano.zero`.

    from zero_lab.nano import zero
    with zero.GatheredParameters(model.embed.weight, modifier_rank=0):
        if rank == 0:
            model.embed.weight.zero_()      # every rank sees rank 0's change after the block

`GatheredParameters(params, modifier_rank=None)`:
    Phase 1 (enter): each listed parameter is whole on every rank: at stage 3 its unit is held and
             gathered (a use like any other, so it nests with forward and backward); below stage 3,
             and for stage 3's persistent parameters, it already is.
    Phase 2 (exit): with `modifier_rank=r`, rank r's whole buffers are broadcast, every rank keeps
             its partition of them, and the fp32 master partitions follow (mixed precision), so
             the change survives the next optimizer step; without it, changes are dropped at
             stage 3 (the partitions were not touched). Then the units are released.
Parameters no nano engine owns are ignored, as DeepSpeed ignores parameters it did not partition.
"""

from __future__ import annotations

from typing import Iterable, Optional

import torch

from zero_lab.nano.errors import NanoConfigError


class GatheredParameters:
    """A context in which `params` are whole on every rank (see the module docstring)."""

    def __init__(self, params, modifier_rank: Optional[int] = None, fwd_module: Optional[torch.nn.Module] = None,
                 enabled: bool = True):
        if fwd_module is not None:
            raise NanoConfigError("GatheredParameters(fwd_module=...) is not implemented by nano; name the module's "
                                  "class in zero_optimization.leaf_module so its unit holds the parameter")
        parameters = [params] if isinstance(params, torch.Tensor) else list(params if isinstance(params, Iterable) else [])
        self.enabled = enabled
        self.modifier_rank = modifier_rank
        owners = {}
        for parameter in parameters:
            owner = getattr(parameter, "zero_lab_owner", None)
            if owner is not None:
                optimizer, index = owner
                owners[(id(optimizer), index)] = owner
        self.owners = list(owners.values())

    def __enter__(self):
        if self.enabled:
            for optimizer, index in self.owners:  # Phase 1
                optimizer.hold_whole(index)
        return self

    def __exit__(self, *exc):
        if not self.enabled:
            return False
        for optimizer, index in self.owners:  # Phase 2
            if self.modifier_rank is not None:
                optimizer.adopt_values(index, self.modifier_rank)
            optimizer.let_go(index)
        return False
