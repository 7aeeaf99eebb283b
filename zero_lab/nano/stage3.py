"""ZeRO stage 3: stage 2, plus parameters partitioned between uses.

The diff from stage 2:
    units:   one per module fetched as one (its own parameters, or a leaf module's subtree), one
             root, one for each persistent small parameter (`stage3_units.per_block`, decided by
             `initialize`). Each such unit's and the root's parameters of each group live
             in a `ShardedFlatBuffer`: between uses a rank keeps only its partition (fp32: that
             partition is also the master; bf16/fp16: plus an fp32 master partition). The
             persistent units keep stage 2's always-whole buffers.
    gather:  `UnitGathering` gathers each sharded unit for its module's forward and, unless official
             DeepSpeed's release rule kept it (`fetch_policy`: prefetch, reuse distance), again for
             its backward, and frees it after each use (see its module for the hooks).
    publish: after Adam, the masters become the partitions (mixed precision) and the persistent
             buffers are all-gathered as at stage 2, one call each (official's one per persistent
             parameter); no sharded unit stays gathered, so the next forward gathers the new
             values.
Gradients reach their fp32 partitions as at stage 2, bucket by bucket within each sharded unit's
buffer, reduce-scattered as the unit's backward produces them; the persistent buffers' gradients
share one bucket spanning them all (`spanning_layout`; split only past `reduce_bucket_size`),
reduce-scattered in one call once the last of them has arrived, as official DeepSpeed's
`reduce_scatter_coalesced` reduces its bucket of parameters in one call. After every backward
nothing stays gathered, and between steps nothing gradient-sized lives.
"""

from __future__ import annotations

import torch

from zero_lab.nano.fetch_policy import FetchRules
from zero_lab.nano.flat_buffer import FlatParameterBuffer, ShardedFlatBuffer, WholeParameters
from zero_lab.nano.placement import TensorKind
from zero_lab.nano.stage2 import Stage2Optimizer
from zero_lab.nano.unit_gathering import GatheredUnit, UnitGathering
from zero_lab.nano.units import Unit


class Stage3Optimizer(Stage2Optimizer):
    stage = 3
    sharded_buffer = ShardedFlatBuffer  # what holds a sharded unit's parameters (hpZ's adds a secondary partition)

    def __init__(self, model, units, parameter_groups, config, collectives, placement, parameter_names,
                 parameter_source=WholeParameters):
        super().__init__(model, units, parameter_groups, config, collectives, placement, parameter_names,
                         parameter_source)
        zero = config.zero_optimization
        entries = [GatheredUnit(unit, [buffer for buffer, owner in zip(self.buffers, self.unit_of_buffer)
                                       if owner == index]) for index, unit in enumerate(units) if unit.sharded]
        self.gathering = UnitGathering(model, entries, collectives,
                                       FetchRules(zero.stage3_prefetch_bucket_size, zero.stage3_max_live_parameters,
                                                  zero.stage3_max_reuse_distance))

    def _flat_buffer(self, unit: Unit, parameters: list[torch.nn.Parameter], group_index: int) -> FlatParameterBuffer:
        if not unit.sharded:
            return super()._flat_buffer(unit, parameters, group_index)
        layout = self._layout(parameters)
        full = self.placement.empty(TensorKind.COMPUTE, layout.padded_numel, self.dtype)
        partition = self.placement.empty(TensorKind.PARTITION, layout.partition_numel, self.dtype)
        return self.sharded_buffer(parameters, layout, self.collectives, group_index, full, partition,
                                   self.placement.stage_in, self.parameter_source)

    def _entry_of(self, index: int) -> GatheredUnit | None:
        return next((entry for entry in self.gathering.entries if self.buffers[index] in entry.buffers), None)

    def hold_whole(self, index: int) -> None:
        entry = self._entry_of(index)
        if entry is not None:
            self.gathering.acquire([entry])

    def let_go(self, index: int) -> None:
        entry = self._entry_of(index)
        if entry is not None:
            self.gathering.release(entry)

    def after_backward(self) -> None:
        super().after_backward()
        self.gathering.release_all()

    def _publish_parameters(self) -> None:
        self.gathering.release_all()
        super()._publish_parameters()

    def destroy(self) -> None:
        """The model becomes a plain module again: every unit whole, no hook left."""
        self.gathering.remove()
        for buffer in self.buffers:
            if isinstance(buffer, ShardedFlatBuffer):  # the persistent buffers are always whole
                buffer.unshard(self.collectives)
                buffer.wait()
        super().destroy()
