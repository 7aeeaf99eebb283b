"""Resharding: partition -> whole parameter -> partition. Pure tensor arithmetic, no collectives.

A checkpoint stores, per parameter group, one fp32 tensor per rank (the master partition, and
Adam's exp_avg and exp_avg_sq cut the same way). Two cuts exist on disk:
    flat          (stages 0-2, as official DeepSpeed writes them): the group's parameters end to
                  end, padded (`layout.py`) and cut into N equal partitions; each rank stores its
                  master partition without the padding, so the N stored tensors end to end are the
                  parameters end to end (its moments keep the padding, which a read drops).
    per parameter (official stage 3's files, which nano writes at stage 3 too): every parameter is
                  padded to a multiple of N and cut into N equal chunks; rank r stores its chunk of
                  each parameter, in order.
Loading at any world size M, from any cut, is then:
    Phase 1 (partition -> whole parameter): `whole_parameters` puts the N stored tensors back
            together into each parameter's whole flat values.
    Phase 2 (whole parameter -> partition): `flat_partition` lays the whole parameters out in the
            loading engine's own `FlatLayout` and keeps its rank's range (`per_parameter_partition`
            cuts per parameter, for writing stage 3's files).
Both phases only copy elements, so a resume at the same world size is bitwise exact, and one at
another world size holds exactly the values an uninterrupted run would.
"""

from __future__ import annotations

import torch

from zero_lab.nano import stages
from zero_lab.nano.layout import FlatLayout
from zero_lab.nano.stages import FLAT, PER_PARAMETER


def cut_of_stage(stage: int) -> str:
    """How a checkpoint of `stage` stores its partitions (its checkpoint layout's cut)."""
    return stages.of(stage).checkpoint.cut


def chunk_numel(numel: int, world_size: int) -> int:
    """One rank's chunk of a parameter cut per parameter (the parameter padded to a multiple of N)."""
    return -(-numel // world_size)


# Phase 1
def whole_parameters(stored: list[torch.Tensor], numels: list[int], cut: str) -> list[torch.Tensor]:
    """The whole flat values of each parameter of one group from the N ranks' stored tensors."""
    if cut == FLAT:
        joined = torch.cat([tensor.reshape(-1) for tensor in stored])
        if joined.numel() < sum(numels):
            raise ValueError(f"the stored partitions hold {joined.numel()} elements, the parameters {sum(numels)}")
        return list(torch.split(joined[:sum(numels)], numels))
    world_size = len(stored)
    expected = sum(chunk_numel(numel, world_size) for numel in numels)
    if any(tensor.numel() < expected for tensor in stored):
        raise ValueError(f"a stored partition holds fewer than the {expected} elements its parameters need")
    wholes, offset = [], 0
    for numel in numels:
        chunk = chunk_numel(numel, world_size)
        wholes.append(torch.cat([tensor.reshape(-1)[offset:offset + chunk] for tensor in stored])[:numel])
        offset += chunk
    return wholes


# Phase 2
def flat_partition(wholes: list[torch.Tensor], layout: FlatLayout, rank: int) -> torch.Tensor:
    """Rank `rank`'s partition of `layout` (padding as zeros), filled from whole parameters."""
    start, end = layout.partition_range(rank)
    partition = torch.zeros(end - start, dtype=torch.float32)
    for piece in layout.pieces(start, end):
        values = wholes[piece.parameter_index].reshape(-1)
        partition[piece.flat_start - start:piece.flat_start - start + piece.numel] = \
            values[piece.parameter_offset:piece.parameter_offset + piece.numel]
    return partition


def per_parameter_partition(wholes: list[torch.Tensor], world_size: int, rank: int) -> torch.Tensor:
    """Rank `rank`'s chunk of every parameter, end to end (each parameter zero-padded to N chunks)."""
    chunks = []
    for whole in wholes:
        chunk = chunk_numel(whole.numel(), world_size)
        padded = torch.zeros(chunk * world_size, dtype=torch.float32)
        padded[:whole.numel()] = whole.reshape(-1)
        chunks.append(padded[rank * chunk:(rank + 1) * chunk])
    return torch.cat(chunks) if chunks else torch.zeros(0)


def official_sub_groups(chunk_numels: list[int], sub_group_size: int) -> list[list[int]]:
    """How official stage 3 splits one parameter group into optimizer sub-groups, given each
    parameter's chunk on a rank in the group's order: one sub-group when the chunks fit in
    `sub_group_size`, else parameters taken in order and a sub-group closed as soon as its chunks
    reach the size. Positions into `chunk_numels`, one list per sub-group."""
    if sub_group_size >= sum(chunk_numels):
        return [list(range(len(chunk_numels)))]
    sub_groups, current, size = [], [], 0
    for position, numel in enumerate(chunk_numels):
        current.append(position)
        size += numel
        if size >= sub_group_size or position == len(chunk_numels) - 1:
            sub_groups.append(current)
            current, size = [], 0
    return sub_groups


def stored_tensor_names(names: list[str], numels: list[int], cut: str, world_size: int,
                        sub_group_size: int) -> list[list[str]]:
    """The parameters of each tensor official's files store for one parameter group: the group (flat
    cut), or each of official's optimizer sub-groups at `world_size` (per-parameter cut)."""
    if cut == FLAT:
        return [names]
    chunks = [chunk_numel(numel, world_size) for numel in numels]
    return [[names[position] for position in part] for part in official_sub_groups(chunks, sub_group_size)]


def stored_flat(partition: torch.Tensor, layout: FlatLayout, rank: int, master: bool) -> torch.Tensor:
    """A flat partition as official's files store it: a master without the padding at the buffer's
    end (`single_partition_of_fp32_groups`), a moment whole (torch.optim's state_dict of the padded
    partition, which official's load copies as it is)."""
    return partition[:stored_numel(layout, rank)] if master else partition


def stored_numel(layout: FlatLayout, rank: int) -> int:
    """The elements of rank `rank`'s stored master: its partition less the padding at the buffer's end."""
    start, end = layout.partition_range(rank)
    return max(0, min(end, layout.numel) - start)
