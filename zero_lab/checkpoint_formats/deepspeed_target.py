"""Write a DeepSpeed ZeRO checkpoint (stage 0-3, any world size, official's layout: docs/checkpoints.md
"The files") from any source, one parameter at a time.

Phase 1: each rank's stored tensors are laid out (the flat cut of stages 0-2 per group, or official
         stage 3's per-parameter cut and sub-groups) as zeroed scratch tensors, mapped files
         (`common.Scratch`), with the model states' `module` beside them.
Phase 2: for each parameter and each key, the source makes its whole values once, and every rank's
         range of them is copied into that rank's scratch tensor; the values are then dropped.
Phase 3: each rank's optimizer file and the model states are written from the scratch tensors
         (`files.write_file`: a temporary name, then a rename), in nano's and official's keys
         (`contents.optimizer_states`).
"""

from __future__ import annotations

import os

import torch

from zero_lab.checkpoint_formats.common import (KEYS, MASTER, Facts, Scratch, Source, model_states, precision_of,
                                                values_or_zeros)
from zero_lab.nano import stages
from zero_lab.nano.checkpoint import files, reshard
from zero_lab.nano.checkpoint.contents import optimizer_states
from zero_lab.nano.layout import FlatLayout

OFFICIAL_SUB_GROUP_SIZE = 1_000_000_000  # official's default zero_optimization.sub_group_size


def _stored_parts(facts: Facts, stage: int, world_size: int) -> list[tuple[int, list[str]]]:
    """(group, names) of each tensor a rank's file stores: a group (flat cut), or each of official's
    stage-3 sub-groups at this world size (per-parameter cut)."""
    cut = stages.of(stage).checkpoint.cut
    sub_group_size = int(((facts.ds_config or {}).get("zero_optimization") or {})
                         .get("sub_group_size", OFFICIAL_SUB_GROUP_SIZE))
    return [(index, part) for index, group in enumerate(facts.groups) for part in reshard.stored_tensor_names(
        group["names"], [facts.shapes[name].numel() for name in group["names"]], cut, world_size, sub_group_size)]


class _RankTensors:
    """Phase 1: where each parameter's values go in every rank's stored tensors."""

    def __init__(self, facts: Facts, stage: int, world_size: int, precision: str, scratch: Scratch):
        self.parts = _stored_parts(facts, stage, world_size)
        self.per_parameter = stages.of(stage).checkpoint.cut == reshard.PER_PARAMETER
        self.ranks = stages.of(stage).partition_count(world_size)
        self.stored = {key: [[None] * len(self.parts) for _ in range(self.ranks)] for key in KEYS}
        self.places: dict[str, list[tuple[int, int, int, int, int]]] = {}  # name -> (rank, part, at, from, count)
        for part_index, (_, names) in enumerate(self.parts):
            numels = [facts.shapes[name].numel() for name in names]
            if self.per_parameter:
                self._place_per_parameter(part_index, names, numels, scratch)
            else:
                self._place_flat(part_index, names, numels, stage, precision, world_size, scratch)

    def _place_flat(self, part_index, names, numels, stage, precision, world_size, scratch) -> None:
        layout = FlatLayout.for_stage(tuple(numels), stage, precision, world_size)
        for rank in range(self.ranks):
            start, end = layout.partition_range(rank)
            self.stored[MASTER][rank][part_index] = scratch.zeros(reshard.stored_numel(layout, rank))
            for key in KEYS[1:]:  # the moments keep the padding at the buffer's end
                self.stored[key][rank][part_index] = scratch.zeros(end - start)
            for piece in layout.pieces(start, end):
                self.places.setdefault(names[piece.parameter_index], []).append(
                    (rank, part_index, piece.flat_start - start, piece.parameter_offset, piece.numel))

    def _place_per_parameter(self, part_index, names, numels, scratch) -> None:
        chunks = [reshard.chunk_numel(numel, self.ranks) for numel in numels]
        for rank in range(self.ranks):
            for key in KEYS:
                self.stored[key][rank][part_index] = scratch.zeros(sum(chunks))
            at = 0
            for name, numel, chunk in zip(names, numels, chunks):
                first = rank * chunk
                count = max(0, min(chunk, numel - first))
                if count:
                    self.places.setdefault(name, []).append((rank, part_index, at, first, count))
                at += chunk

    # Phase 2
    def scatter(self, name: str, key: str, values: torch.Tensor) -> None:
        flat = values.reshape(-1)
        for rank, part_index, at, first, count in self.places.get(name, []):
            self.stored[key][rank][part_index][at:at + count] = flat[first:first + count]


def write(source: Source, out: str, stage: int, world_size: int) -> list[str]:
    """Write `out/<tag>/` and `out/latest`; `out` is the conversion's partial directory."""
    facts = source.facts
    precision = precision_of(facts)
    tag_directory = os.path.join(out, facts.tag)
    os.makedirs(tag_directory)
    scratch = Scratch(os.path.join(out, ".scratch"))
    try:
        ranks = _RankTensors(facts, stage, world_size, precision, scratch)  # Phase 1
        per_rank_model_states = stages.of(stage).checkpoint.model_states_per_rank
        module = {} if per_rank_model_states else {name: scratch.zeros(shape.numel(), facts.model_dtype).view(shape)
                                                    for name, shape in facts.shapes.items()}
        for name in facts.shapes:  # Phase 2
            for key in KEYS:
                values = values_or_zeros(source, name, key)
                ranks.scatter(name, key, values)
                if key == MASTER and name in module:
                    module[name].copy_(values)
                del values
        written = _write_files(facts, tag_directory, ranks, module, stage, world_size, precision)  # Phase 3
    finally:
        scratch.close()
    files.write_latest(out, facts.tag)
    return written


def _write_files(facts: Facts, directory: str, ranks: _RankTensors, module: dict, stage: int, world_size: int,
                 precision: str) -> list[str]:
    facts_of_stage = stages.of(stage)
    hyper = [{key: value for key, value in group.items() if key != "names"} for group in facts.groups]
    group_of = [group for group, _ in ranks.parts]
    steps = [facts.step] * len(ranks.parts)
    written = []
    for rank in range(ranks.ranks):
        moments = [{key: ranks.stored[key][rank][part] for key in KEYS[1:]} for part in range(len(ranks.parts))]
        states = optimizer_states(stage, world_size, hyper, group_of, ranks.stored[MASTER][rank], moments, steps,
                                  facts.loss_scaler)
        if not facts.has_moments:  # no Adam state yet: torch.optim's state dict is empty
            states["optimizer_state_dict"][facts_of_stage.checkpoint.moments_key]["state"] = {}
        path = os.path.join(directory, files.optim_states_name(precision, rank))
        files.write_file(states, path)
        written.append(path)
    empty = {name: torch.empty(0, dtype=facts.model_dtype) for name in facts.shapes}
    states = {**model_states(facts, module or empty, [names for _, names in ranks.parts], world_size, stage),
              "zero_lab_nano": True}
    for rank in range(world_size if facts_of_stage.checkpoint.model_states_per_rank else 1):
        path = os.path.join(directory, files.model_states_name(facts_of_stage.checkpoint, rank))
        files.write_file(states, path)
        written.append(path)
    return written

