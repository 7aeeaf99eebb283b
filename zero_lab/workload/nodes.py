"""Nodes: which ranks share a machine, for the intra-/inter-node split of the wire bytes.

Ranks form nodes of K consecutive global ranks, as torchrun numbers them (node n holds ranks
nK .. nK+K-1). K is `--ranks-per-node` (harness, `run`, `compare`): on one machine it simulates
nodes (W=4 with K=2 is two nodes of two), on a cluster it is the launcher's --nproc-per-node,
which is the default (torchrun's LOCAL_WORLD_SIZE). Pure functions; the harness and the CLI each
turn a problem into their own one-line error.
"""

from __future__ import annotations

RANKS_PER_NODE_FIX = "Give a --ranks-per-node that divides the world size (e.g. 2 for --gpus 4), or leave it out"


def ranks_per_node_problem(ranks_per_node: int | None, world_size: int) -> str | None:
    """Why `ranks_per_node` cannot group `world_size` ranks into equal nodes (None: it can)."""
    if ranks_per_node is None:
        return None
    if ranks_per_node < 1:
        return f"--ranks-per-node {ranks_per_node} is not a number of ranks"
    if world_size % ranks_per_node:
        return f"--ranks-per-node {ranks_per_node} does not divide the world size {world_size} into equal nodes"
    return None


def resolve_ranks_per_node(ranks_per_node: int | None, local_world_size: int | None, world_size: int) -> int:
    """The K a run's meter uses: the flag, else the launcher's ranks per node, else one node."""
    return ranks_per_node or local_world_size or world_size
