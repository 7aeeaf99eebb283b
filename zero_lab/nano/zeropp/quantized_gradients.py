"""qgZ, ZeRO++'s quantized gradients: stage 3 whose gradient reduce-scatter is two int4 all-to-alls.

`zero_quantized_gradients` changes one thing, how a gradient bucket reaches its owners
(`BucketReducer.scatter`). The W ranks form nodes of K consecutive ranks; rank (n, j) is the j-th
rank of node n (global rank nK + j). One bucket, as official DeepSpeed's `all_to_all_quant_reduce`
(runtime/comm/coalesced_collectives.py) sends it, in `nano.zeropp.quantization`'s int4 format:
    The bucket arrives divided by W (stage 3 predivides: `BucketReducer.launch_shares`), so what
    the phases sum is already the average.
    Phase 1 (quantize, swizzled): one row per owner, its share of the bucket padded to a common
            length, ordered so that local peer j's rows come together: the shares of ranks (n', j)
            for every node n'. Quantize every row in int4 blocks.
    Phase 2 (within the node): all-to-all among the node's K ranks, values and scales: each rank
            receives, from every peer on its node, the rows of the owners with its own local index.
    Phase 3 (reduce within the node): dequantize, sum the K peers' rows (fp32), quantize the sums
            again: one row per node n', the node's sum of owner (n', j)'s share.
    Phase 4 (across nodes): all-to-all among the ranks with the same local index (one per node),
            values and scales: each rank receives every node's sum of its own share.
    Phase 5: dequantize, sum over the nodes, into the share.
So a rank sends its bucket at 4 bits within the node and only 1/K of it (the node's sums) across
nodes, where the plain reduce-scatter sends (W-K)/W of it at full width across nodes.
Node size K (official: `get_accelerator().device_count()`, the devices per node): the harness's
`--ranks-per-node` (environment RANKS_PER_NODE_ENVIRONMENT), else torchrun's LOCAL_WORLD_SIZE.
With one node, or K not dividing W, the plain reduce-scatter runs (official: `num_nodes > 1`).
Where nano differs from official: nano quantizes every bucket (official only 2-D parameters of a
size divisible by 2W, reduce-scattering the rest), its blocks are a fixed size per share (official's
follow each parameter's shape), and it divides by W before it quantizes (official's code divides the
final sum by the node count).
"""

from __future__ import annotations

import functools
import os

import torch
import torch.distributed

from zero_lab.nano.collectives import RANKS_PER_NODE_ENVIRONMENT, Collectives, free_storage
from zero_lab.nano.gradient_reduction import BucketReducer
from zero_lab.nano.zeropp.hierarchical_partition import Stage3HierarchicalOptimizer, node_group
from zero_lab.nano.zeropp.quantization import dequantize_int4, gradient_chunk, quantize_int4
from zero_lab.nano.zeropp.quantized_weights import Stage3HierarchicalQuantizedWeightsOptimizer, Stage3QuantizedWeightsOptimizer
from zero_lab.nano.stage3 import Stage3Optimizer

def ranks_per_node(world_size: int) -> int:
    """K: the harness's --ranks-per-node, else the launcher's ranks per node, else one node."""
    return int(os.environ.get(RANKS_PER_NODE_ENVIRONMENT) or os.environ.get("LOCAL_WORLD_SIZE") or world_size)


def cross_node_group(world_size: int, rank: int, per_node: int):
    """This rank's process group of the ranks with its local index, one per node; every rank creates
    every group, in order (official's `global_{j}` groups)."""
    mine = None
    for local_index in range(per_node):
        group = torch.distributed.new_group(list(range(local_index, world_size, per_node)))
        if rank % per_node == local_index:
            mine = group
    return mine


class QuantizedGradientReducer(BucketReducer):
    """A bucket reducer whose reduce-scatter is qgZ's two quantized all-to-alls (module docstring)."""

    def __init__(self, *arguments, node: Collectives, across: Collectives, **keywords):
        self.node, self.across = node, across
        super().__init__(*arguments, **keywords)

    def scatter(self, share: torch.Tensor, bucket: torch.Tensor, share_sizes: list[int], asynchronous: bool):
        per_node, nodes = self.node.world_size, self.across.world_size
        chunk, blocks = gradient_chunk(max(share_sizes))
        # Phase 1: row j * nodes + n holds owner (n, j)'s share
        rows = torch.zeros(per_node * nodes, chunk, dtype=torch.float32, device=bucket.device)
        for owner, piece in enumerate(bucket.split(share_sizes)):
            node_index, local_index = divmod(owner, per_node)
            rows[local_index * nodes + node_index, :piece.numel()] = piece
        node_sums = self._exchange(self.node, rows, blocks).view(per_node, nodes, chunk).sum(dim=0)  # Phases 2-3
        totals = self._exchange(self.across, node_sums, blocks).sum(dim=0)  # Phases 4-5
        share.copy_(totals[:share.numel()])
        for temporary in (rows, node_sums, totals):
            free_storage(temporary)
        return None  # done: official's exchange is synchronous too

    @staticmethod
    def _exchange(collectives: Collectives, rows: torch.Tensor, blocks: int) -> torch.Tensor:
        """Quantize `rows`, all-to-all the values and the scales over `collectives`, dequantize what came."""
        packed, scales = quantize_int4(rows, blocks)
        received_packed, received_scales = torch.empty_like(packed), torch.empty_like(scales)
        collectives.all_to_all(received_packed, packed)
        collectives.all_to_all(received_scales, scales)
        arrived = dequantize_int4(received_packed, received_scales)
        for temporary in (packed, scales, received_packed, received_scales):
            free_storage(temporary)
        return arrived


class QuantizedGradients:
    """The optimizer side of qgZ: the node and cross-node groups, and the reducer that uses them."""

    def __init__(self, model, units, parameter_groups, config, collectives, placement, parameter_names, **policies):
        world_size, rank = collectives.world_size, collectives.rank
        per_node = ranks_per_node(world_size)
        if 1 <= per_node < world_size and world_size % per_node == 0:  # more than one node
            node = collectives.subgroup(node_group(world_size, rank, per_node))
            across = collectives.subgroup(cross_node_group(world_size, rank, per_node))
            self.bucket_reducer = functools.partial(QuantizedGradientReducer, node=node, across=across)
        super().__init__(model, units, parameter_groups, config, collectives, placement, parameter_names, **policies)


class Stage3QuantizedGradientsOptimizer(QuantizedGradients, Stage3Optimizer):
    """Stage 3 with qgZ."""


class Stage3HierarchicalQuantizedGradientsOptimizer(QuantizedGradients, Stage3HierarchicalOptimizer):
    """hpZ with qgZ."""


class Stage3QuantizedWeightsAndGradientsOptimizer(QuantizedGradients, Stage3QuantizedWeightsOptimizer):
    """qwZ with qgZ."""


class Stage3ZeroPlusPlusOptimizer(QuantizedGradients, Stage3HierarchicalQuantizedWeightsOptimizer):
    """All three of ZeRO++'s ideas: hpZ, qwZ and qgZ."""
