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


def family(operation: str) -> str:
    """The collective family of a function name (all_gather_into_tensor -> all_gather)."""
    if operation not in FAMILY:
        raise ValueError(f"unknown collective {operation!r}; known: {', '.join(sorted(FAMILY))}")
    return FAMILY[operation]


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


def wire_bytes(operation: str, payload_bytes: int, world_size: int) -> int:
    """Bytes one rank sends for a collective whose payload (the whole array) is `payload_bytes`."""
    numerator, denominator = wire_factor(operation, world_size)
    return payload_bytes * numerator // denominator
