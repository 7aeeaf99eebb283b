"""What Muon holds and sends on one rank, from a flat buffer's layout alone (`layout.py`): the
arithmetic `PartitionedMuon` allocates by, `explain` predicts with, and the tests measure against.

Per Muon flat buffer and rank, the momentum kept as official DeepSpeed keeps it at the stage:
    whole (stages 0-2): 4 B per element of every matrix the rank's partition touches (a matrix cut
               by a partition boundary counts on both ranks); one all-gather per step, of the whole
               buffer's fp32 gradient;
    partitioned (stage 3, `partitioned=True`): 4 B per element of the rank's partition, the ZeRO
               way; two all-gathers per step, the gradient's and the momentum's, since each matrix
               must be whole to be updated;
    each all-gather 4 B per padded element (counted as nano counts an all-gather: its output), where
    the buffer is cut in partitions and there is more than one rank; each a temporary of that size.
Per AdamW flat buffer: 8 B per partition element (exp_avg and exp_avg_sq), as for Adam.
"""

from __future__ import annotations

FP32_BYTES = 4


def touched_matrices(layout, rank: int) -> list[int]:
    """Positions, in the buffer, of the matrices rank `rank`'s partition touches."""
    start, end = layout.partition_range(rank)
    return [piece.parameter_index for piece in layout.pieces(start, end)]


def momentum_numel(layout, rank: int, partitioned: bool = False) -> int:
    if partitioned:
        return layout.partition_numel
    return sum(layout.parameter_numels[position] for position in touched_matrices(layout, rank))


def gathers(layout, world_size: int, partitioned: bool = False) -> int:
    """All-gathers per step of one Muon buffer: 0, 1 (the gradient), or 2 (and the momentum)."""
    return int(layout.partition_count > 1 and world_size > 1) * (2 if partitioned else 1)


def predicted_bytes(layouts: list, use_muon: list[bool], rank: int, world_size: int,
                    partitioned: bool = False) -> dict[str, int]:
    """The module docstring's figures for a rank's flat buffers, one layout each."""
    momentum = adam = gathered = calls = 0
    for layout, muon in zip(layouts, use_muon):
        if not muon:
            adam += 2 * FP32_BYTES * layout.partition_numel
            continue
        momentum += FP32_BYTES * momentum_numel(layout, rank, partitioned)
        calls += gathers(layout, world_size, partitioned)
        gathered += gathers(layout, world_size, partitioned) * FP32_BYTES * layout.padded_numel
    return {"momentum": momentum, "adam_states": adam, "gather_bytes_per_step": gathered, "gathers_per_step": calls}
