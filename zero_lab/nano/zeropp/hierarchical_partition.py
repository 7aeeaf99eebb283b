"""hpZ, ZeRO++'s hierarchical partitioning: stage 3 plus a second copy of each sharded unit,
partitioned within a node, so that every gather after a unit's first one stays inside the node.

`zero_hpz_partition_size` K groups the ranks into nodes of K consecutive ranks (official
DeepSpeed's `zero_param_intra_parallel_group`: ranks [iK, (i+1)K)). Each sharded buffer then holds,
besides its primary partition (1/W of the unit, the one Adam updates), a secondary partition: 1/K
of the unit, this rank's share of it within its node. One step of a `HierarchicalShardedBuffer`,
in official DeepSpeed's order (`partition_parameters._partition_param_sec`, `stage3._post_step`):
    Phase 1 (a gather with no secondary): all-gather the primary partitions over the world, as
            plain stage 3 does; at a step's first forward this is every unit's first gather.
    Phase 2 (as that gather completes, `wait`): keep the whole buffer's slice
            [r S, (r+1) S), S = padded / K, for this rank's position r in the node: the secondary.
            Official copies it at the release that follows; nano copies it from the gathered
            values before anyone can touch them (an edit under GatheredParameters without a
            modifier rank must not reach it). Construction gathers once too, so the first step's
            forward already has a secondary, as official's initial partitioning leaves one.
    Phase 3 (every later gather until the step: backward, recomputation under activation
            checkpointing, the next micro-step's forward): all-gather the secondary partitions
            over the node's K ranks only. Its wire bytes never leave the node.
    Phase 4 (`after_step`: Adam changed the primaries; or new values adopted): drop the secondary
            (its storage freed), so the next gather is Phase 1 again and makes a fresh one.
The values are the same whichever partition a gather reads, so hpZ alone is exact: only where the
bytes travel, and S = padded / K more parameter bytes per rank during the step, change.
`Stage3HierarchicalOptimizer` is stage 3 with these buffers and the node groups; nothing else.
"""

from __future__ import annotations

import functools

import torch
import torch.distributed

from zero_lab.nano.collectives import Collectives, free_storage
from zero_lab.nano.sharded_flat_buffer import BufferState, ShardedFlatBuffer
from zero_lab.nano.stage3 import Stage3Optimizer


def node_group(world_size: int, rank: int, ranks_per_node: int):
    """This rank's process group of K consecutive ranks; every rank creates every group, in order
    (torch.distributed.new_group's rule)."""
    mine = None
    for first in range(0, world_size, ranks_per_node):
        group = torch.distributed.new_group(list(range(first, first + ranks_per_node)))
        if first <= rank < first + ranks_per_node:
            mine = group
    return mine


class HierarchicalShardedBuffer(ShardedFlatBuffer):
    """A sharded flat buffer with a secondary partition within the node (see the module docstring)."""

    gathers_with_others = False  # its gathers read the primaries or the secondaries: each by itself

    def __init__(self, *arguments, node_collectives: Collectives, **keywords):
        self.node_collectives = node_collectives
        self.secondary: torch.Tensor | None = None  # None: no secondary (Phases 1 and 4)
        self.from_secondary = False  # the gather in flight reads the secondary partitions (Phase 3)
        super().__init__(*arguments, **keywords)

    def _secondary_range(self) -> tuple[int, int]:
        share = self.layout.padded_numel // self.node_collectives.world_size
        start = self.node_collectives.rank * share
        return start, start + share

    def synchronize(self, collectives: Collectives) -> None:
        super().synchronize(collectives)
        self.unshard(collectives)  # Phase 1 once more at construction: official keeps a secondary from the start
        self.reshard()

    def unshard(self, collectives: Collectives, asynchronous: bool = False) -> None:
        if self.secondary is None or self.state != BufferState.SHARDED:
            self.from_secondary = False
            super().unshard(collectives, asynchronous)  # Phase 1
            return
        # Phase 3: from the secondary partitions, within the node
        self.from_secondary = True
        self.full.untyped_storage().resize_(self.full_nbytes)
        self.staged = self.partition  # nothing staged: `wait` frees only a staged copy, and the secondary stays
        self.pending = self.start_gather(self.node_collectives, self.secondary, asynchronous)
        self.state = BufferState.GATHERING
        if self.pending is None:
            self.wait()

    def wait(self) -> None:
        from_primaries = self.state == BufferState.GATHERING and not self.from_secondary
        super().wait()
        if from_primaries and self.secondary is None:  # Phase 2
            start, end = self._secondary_range()
            self.secondary = self.full[start:end].clone()

    def drop_secondary(self) -> None:
        """Phase 4."""
        if self.secondary is not None:
            free_storage(self.secondary)
            self.secondary = None

    def after_step(self, collectives: Collectives) -> torch.distributed.Work | None:
        self.drop_secondary()
        return None

    def parameter_bytes(self) -> int:
        secondary = self.secondary.untyped_storage().nbytes() if self.secondary is not None else 0
        return super().parameter_bytes() + secondary


class Stage3HierarchicalOptimizer(Stage3Optimizer):
    """Stage 3 whose sharded buffers keep a secondary partition within each node of
    `zero_hpz_partition_size` ranks (see the module docstring)."""

    hierarchical_buffer = HierarchicalShardedBuffer  # qwZ's sends its gathers quantized

    def __init__(self, model, units, parameter_groups, config, collectives, placement, parameter_names, **policies):
        ranks_per_node = min(config.zero_optimization.zero_hpz_partition_size, collectives.world_size)
        self.node_collectives = collectives.subgroup(node_group(collectives.world_size, collectives.rank, ranks_per_node))
        self.sharded_buffer = functools.partial(self.hierarchical_buffer, node_collectives=self.node_collectives)
        super().__init__(model, units, parameter_groups, config, collectives, placement, parameter_names, **policies)

    def adopt_values(self, index: int, source_rank: int) -> None:
        super().adopt_values(index, source_rank)
        buffer = self.buffers[index]
        if isinstance(buffer, HierarchicalShardedBuffer):  # Phase 4: new values
            buffer.drop_secondary()
