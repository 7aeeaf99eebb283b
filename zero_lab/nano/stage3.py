"""ZeRO stage 3: stage 2, plus parameters partitioned between uses.

The diff from stage 2:
    units:   one per module fetched as one (its own parameters, or a leaf module's subtree), one
             root, one for each persistent small parameter (`stage3_units.per_block`, decided by
             `initialize`). Each such unit's and the root's parameters of each group live
             in a `ShardedFlatBuffer`: between uses a rank keeps only its partition (fp32: that
             partition is also the master; bf16/fp16: plus an fp32 master partition). The
             persistent units keep stage 2's always-whole buffers.
    gather:  `UnitGathering` gathers each sharded unit for its module's forward and, unless official
             DeepSpeed's release rule kept it (`fetch_policy`: prefetch, reuse distance; the rules
             `initialize` hands over), again for its backward, and frees it after each use (see its
             module for the hooks).
    publish: after Adam, the masters become the partitions (mixed precision) and the persistent
             buffers are all-gathered in one call (`coalesced_gather`; official makes one per
             persistent parameter); no sharded unit stays gathered, so the next forward
             gathers the new values.
Gradients reach their fp32 partitions as at stage 2, bucket by bucket within each sharded unit's
buffer, reduce-scattered as the unit's backward produces them; the persistent buffers' gradients
share one bucket spanning them all (`persistent_reduction`; split only past `reduce_bucket_size`),
reduce-scattered in one call once the last of them has arrived, as official DeepSpeed's
`reduce_scatter_coalesced` reduces its bucket of parameters in one call. After every backward
nothing stays gathered, and between steps nothing gradient-sized lives.

Stage 3's rows of the step route (`zero_optimizer.py`'s docstring), besides stage 2's:
    engine(batch)                   unit_gathering   `pre_forward` gathers each unit (and what
                                                     fetch_policy prefetches), `post_forward` frees
                                                     it unless fetch_policy keeps it
    engine.backward(loss)           unit_gathering   `pre_backward` gathers the unit again if it was
                                                     freed; `post_backward` frees it once the unit's
                                                     gradients are produced
      optimizer.after_backward()    stage3.py        after stage 2's, releases every unit
      Phase 6 publish               stage3.py        releases every unit first; the persistent buffers
                                                     in one all-gather (`coalesced_gather`);
                                                     a sharded buffer gathers nothing (its next use does)
"""

from __future__ import annotations

import torch

from zero_lab.nano.coalesced_gather import gather_persistent
from zero_lab.nano.flat_buffer import FlatParameterBuffer, WholeParameters
from zero_lab.nano.persistent_reduction import SpanningArrivalPacking
from zero_lab.nano.placement import TensorKind
from zero_lab.nano.sharded_flat_buffer import ShardedFlatBuffer
from zero_lab.nano.stage2 import Stage2Optimizer
from zero_lab.nano.unit_gathering import GatheredUnit, UnitGathering
from zero_lab.nano.units import Unit


class Stage3Optimizer(Stage2Optimizer):
    stage = 3
    GradientCollection = SpanningArrivalPacking  # stage 2's, the persistent buffers' buckets spanning them
    sharded_buffer = ShardedFlatBuffer  # what holds a sharded unit's parameters (hpZ's adds a secondary partition)

    def __init__(self, model, units, parameter_groups, config, collectives, placement, parameter_names,
                 parameter_source=WholeParameters, fetch_rules=None):
        super().__init__(model, units, parameter_groups, config, collectives, placement, parameter_names,
                         parameter_source)
        entries = [GatheredUnit(unit, [buffer for buffer, owner in zip(self.buffers, self.unit_of_buffer)
                                       if owner == index]) for index, unit in enumerate(units) if unit.sharded]
        self.gathering = UnitGathering(model, entries, collectives, fetch_rules)  # the rules initialize chose

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

    def _gather_updated_partitions(self) -> None:
        for buffer in [buffer for buffer in self.buffers if buffer.sharded]:  # gathered at its next use, not now
            buffer.after_step(self.collectives)  # nothing moves (hpZ's drops its secondary partition)
        gather_persistent([buffer for buffer in self.buffers if not buffer.sharded], self.collectives)

    def destroy(self) -> None:
        """The model becomes a plain module again: every unit whole, no hook left."""
        self.gathering.remove()
        for buffer in self.buffers:
            if isinstance(buffer, ShardedFlatBuffer):  # the persistent buffers are always whole
                buffer.unshard(self.collectives)
                buffer.wait()
        super().destroy()
