"""Bytes one rank puts on the wire for a collective: NCCL-tests' bus-bytes convention.

A collective's payload bytes (the log's `bytes`: the whole array, docs/log-format.md) say how big
the array is; its wire bytes say how much each rank must send with a bandwidth-optimal (ring)
algorithm. That is what ZeRO's communication argument counts: with P gradient bytes, a
reduce-scatter and an all-gather send about 2P per rank, an all-reduce and an all-gather 3P.
For N ranks and an array of S bytes (NCCL-tests, doc/PERFORMANCE.md, "bus bandwidth"):

    all-reduce                   2(N-1)/N x S    a reduce-scatter, then an all-gather
    reduce-scatter, all-gather    (N-1)/N x S    S is the whole array, every rank's share
    all-to-all                    (N-1)/N x S    every rank sends every share but its own
    broadcast, reduce                   S

nano reduce-scatters with an all-to-all on gloo (each rank sends its N-1 foreign shares and adds
up what it receives); the meter counts that call as the `reduce_scatter` it implements, at a
reduce-scatter's factor. With one rank nothing moves.
These are the algorithm's bytes, not a backend's: gloo implements some collectives differently
(its reduce-scatter is an all-reduce of a copy; its all-reduce and all-gather need not be rings),
so on gloo they are the cost the algorithm needs, not the traffic gloo made. Results are rounded
down to whole bytes.

Intra- and inter-node (`wire_split`). Ranks form nodes of K consecutive global ranks (rank r is on
node r // K; `--ranks-per-node K`, on a cluster the launcher's --nproc-per-node). Of the n ranks of
a collective's group, k share this rank's node. The convention is the direct (pairwise) exchange:
in a reduce-scatter, an all-gather or an all-to-all each rank owes each of its n-1 peers one 1/n
share of S, so it sends

    to ranks on its own node      (k-1)/n x S     intra-node
    to ranks on other nodes       (n-k)/n x S     inter-node

which add up to the (n-1)/n x S above; an all-reduce (a reduce-scatter, then an all-gather) sends
twice each, and a broadcast or reduce splits its S in the same proportion, (k-1) : (n-k). So the
inter-node bytes are exactly what this rank sends to ranks on other nodes, whichever node it is
on; a group inside one node (k = n: stage 3's secondary partition under hpZ) sends none. Example,
W=4, K=2, an all-gather of S over all four ranks: S/4 to the rank beside it, S/2 to the other
node. Other algorithms cut the same bytes differently: a ring in rank order sends everything a
rank sends to one neighbour (so only the rank at a node's edge crosses), and ZeRO++'s paper counts
the whole volume of any collective that spans nodes as cross-node. The ratios between ZeRO
variants are the same in all three, because every spanning collective of stage 3 spans the
whole world.
"""

from __future__ import annotations

# Every name a collective is counted under (torch.distributed's functions, nano's comm_stats()),
# and the family whose factor it takes.
FAMILY = {
    "all_reduce": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter",
    "all_gather": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "all_gather_single": "all_gather",
    "all_gather_coalesced": "all_gather",
    "all_to_all": "all_to_all",
    "all_to_all_single": "all_to_all",
    "broadcast": "broadcast",
    "reduce": "reduce",
}


FAMILIES = tuple(dict.fromkeys(FAMILY.values()))  # the six families, each once


def family(operation: str) -> str:
    """The collective family of a function name (all_gather_into_tensor -> all_gather)."""
    if operation not in FAMILY:
        raise ValueError(f"unknown collective {operation!r}; known: {', '.join(sorted(FAMILY))}")
    return FAMILY[operation]


def family_of_name(operation: str) -> str | None:
    """The family of any name a trace records: a name of the table, or a variant it does not list
    by its prefix (`all_gather_into_tensor_coalesced` -> all_gather); None: not a collective."""
    if operation in FAMILY:
        return FAMILY[operation]
    prefixes = sorted(FAMILIES, key=len, reverse=True)  # reduce_scatter before reduce
    return next((name for name in prefixes if operation.startswith(name + "_")), None)


def wire_factor(operation: str, world_size: int) -> tuple[int, int]:
    """(numerator, denominator): wire bytes = payload bytes x numerator / denominator."""
    kind = family(operation)
    if world_size <= 1:
        return 0, 1
    if kind == "all_reduce":
        return 2 * (world_size - 1), world_size
    if kind in ("reduce_scatter", "all_gather", "all_to_all"):
        return world_size - 1, world_size
    return 1, 1  # broadcast, reduce


def bus_factor(operation: str, world_size: int) -> float:
    """NCCL-tests' bus bandwidth over algorithm bandwidth (busbw = algbw x factor) for any name a
    trace records: the wire factor above, and 1 for a broadcast, a reduce or a name of no family."""
    kind = family_of_name(operation)
    if kind is None or kind in ("broadcast", "reduce"):
        return 1.0
    numerator, denominator = wire_factor(kind, world_size)
    return numerator / denominator


def wire_bytes(operation: str, payload_bytes: int, world_size: int) -> int:
    """Bytes one rank sends for a collective whose payload (the whole array) is `payload_bytes`."""
    numerator, denominator = wire_factor(operation, world_size)
    return payload_bytes * numerator // denominator


def wire_split(operation: str, payload_bytes: int, group_size: int, on_my_node: int) -> tuple[int, int]:
    """(intra-node, inter-node) wire bytes of one rank, for a group of `group_size` ranks of which
    `on_my_node` (this rank included) share its node; they add up to `wire_bytes`."""
    wire = wire_bytes(operation, payload_bytes, group_size)
    if group_size <= 1:
        return 0, 0
    numerator, denominator = wire_factor(operation, group_size)
    inter = payload_bytes * numerator * (group_size - on_my_node) // (denominator * (group_size - 1))
    return wire - inter, inter


def ranks_on_node(group_ranks: list[int], rank: int, ranks_per_node: int) -> int:
    """How many of a group's (global) ranks share `rank`'s node, nodes being `ranks_per_node` consecutive ranks."""
    node = rank // ranks_per_node
    return sum(1 for member in group_ranks if member // ranks_per_node == node)
