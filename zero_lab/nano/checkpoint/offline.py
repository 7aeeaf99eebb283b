"""Checkpoints without an engine or processes: describe one, consolidate its weights, reshard it.

All three read a tag as `load_checkpoint` does (`files.read_file`, then
`SavedTraining.read`: partition -> whole parameter), nano's or official DeepSpeed's alike.
`reshard` then cuts the whole parameters for M ranks (whole parameter -> partition) and writes a
new checkpoint directory in the same stage's files, through the same safe write as a save.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from zero_lab.nano.checkpoint import files
from zero_lab.nano import stages
from zero_lab.nano.checkpoint import reshard
from zero_lab.nano.checkpoint.contents import MOMENTS, SavedTraining, model_shapes, optimizer_states
from zero_lab.nano.errors import CheckpointError
from zero_lab.nano.layout import FlatLayout

OFFICIAL_SUB_GROUP_SIZE = 1_000_000_000  # official's default zero_optimization.sub_group_size


@dataclass
class OpenCheckpoint:
    """One tag of a checkpoint directory, read whole."""

    directory: str
    tag: str
    model_path: str
    model_states: dict
    optimizer_files: list[dict]
    optimizer_paths: list[str]
    saved: SavedTraining

    @classmethod
    def open(cls, directory: str, tag: str | None = None) -> "OpenCheckpoint":
        if not os.path.isdir(directory):
            raise CheckpointError(f"checkpoint directory {directory} does not exist; pass the directory a save wrote")
        resolved = files.resolve_tag(directory, tag)
        if resolved is None:
            raise CheckpointError(f"{directory} has no `latest` file; pass --tag with one of: "
                                  f"{', '.join(files.list_tags(directory)) or 'none saved'}")
        model_path, model_states, optimizer_files, paths = files.read_tag(directory, resolved)
        saved = SavedTraining.read(optimizer_files, model_states["param_shapes"], paths)
        return cls(directory, resolved, model_path, model_states, optimizer_files, paths, saved)

    @property
    def precision(self) -> str:
        config = self.model_states.get("ds_config") or {}
        for name in ("fp16", "bf16", "bfloat16"):
            if (config.get(name) or {}).get("enabled"):
                return "bf16" if name == "bfloat16" else name
        return "bf16" if os.path.basename(self.optimizer_paths[0]).startswith("bf16_") else "fp32"

    def shapes(self) -> dict[str, torch.Size]:
        return {name: torch.Size(shape) for group in self.model_states["param_shapes"]
                for name, shape in group.items()}


def describe(checkpoint: OpenCheckpoint) -> dict:
    """`zero-lab checkpoint inspect`: what the tag holds and how much each rank's file weighs."""
    states = checkpoint.model_states
    frozen = states.get("frozen_param_shapes") or {}
    directory = os.path.join(checkpoint.directory, checkpoint.tag)
    return {"directory": checkpoint.directory, "tag": checkpoint.tag,
            "written_by": "nano" if states.get("zero_lab_nano") else "official DeepSpeed",
            "stage": checkpoint.saved.stage, "world_size": checkpoint.saved.world_size,
            "precision": checkpoint.precision, "global_steps": states.get("global_steps"),
            "global_samples": states.get("global_samples"), "skipped_steps": states.get("skipped_steps"),
            "parameters": sum(shape.numel() for shape in checkpoint.shapes().values())
            + sum(torch.Size(shape).numel() for shape in frozen.values()),
            "file_bytes": {name: os.path.getsize(os.path.join(directory, name))
                           for name in sorted(os.listdir(directory))},
            "ds_version": states.get("ds_version"), "config": states.get("ds_config")}


def consolidate(checkpoint: OpenCheckpoint) -> dict[str, torch.Tensor]:
    """Whole fp32 weights by state_dict name: trainable masters, frozen parameters, buffers, and
    every tied alias (as official's zero_to_fp32 returns them)."""
    shapes, states = checkpoint.shapes(), checkpoint.model_states
    weights = {name: states["module"][name].float() if states["module"][name].is_floating_point()
               else states["module"][name] for name in states.get("buffer_names", [])}
    layout = stages.of(checkpoint.saved.stage).checkpoint
    for name, shape in (states.get("frozen_param_shapes") or {}).items():
        if layout.model_states_per_rank:  # frozen parameters are cut per rank there
            fragments = [files.read_file(os.path.join(checkpoint.directory, checkpoint.tag,
                                                      files.model_states_name(layout, rank)))["frozen_param_fragments"][name]
                         for rank in range(checkpoint.saved.world_size)]
            weights[name] = torch.cat([part.reshape(-1) for part in fragments])[:torch.Size(shape).numel()] \
                .view(shape).float()
        else:
            weights[name] = states["frozen_param_fragments"][name].float()
    for name, values in checkpoint.saved.whole.items():
        weights[name] = values.reshape(shapes[name]).clone()
    for alias, name in (states.get("shared_params") or {}).items():
        if name in weights:
            weights[alias] = weights[name]
    return weights


def _cut(wholes: list[torch.Tensor], stage: int, precision: str, world_size: int, rank: int,
         master: bool) -> torch.Tensor:
    """Phase 2 for one group of a resharded file (a master, or a moment when not `master`)."""
    if reshard.cut_of_stage(stage) == reshard.PER_PARAMETER:
        return reshard.per_parameter_partition(wholes, world_size, rank)
    layout = FlatLayout.for_stage(tuple(whole.numel() for whole in wholes), stage, precision, world_size)
    return reshard.stored_flat(reshard.flat_partition(wholes, layout, rank), layout, rank, master)


def reshard_checkpoint(checkpoint: OpenCheckpoint, world_size: int, out: str) -> dict:
    """Write `out/<tag>/` (and `out/latest`) for `world_size` ranks; returns describe() of it."""
    saved, stage, precision = checkpoint.saved, checkpoint.saved.stage, checkpoint.precision
    facts = stages.of(stage)
    if not facts.partitions_optimizer_states:
        raise CheckpointError("a stage-0 checkpoint has one partition at any world size; load it directly")
    if os.path.exists(os.path.join(out, checkpoint.tag)):
        raise CheckpointError(f"{os.path.join(out, checkpoint.tag)} exists; choose another --out (nothing was written)")
    groups = saved.group_names
    hyper = [{key: value for key, value in group.items() if key != "params"} for group in saved.param_groups]
    hyper = hyper if len(hyper) == len(groups) else [{} for _ in groups]
    os.makedirs(out, exist_ok=True)
    partial = files.start_directory(out, checkpoint.tag)
    shapes = checkpoint.shapes()
    sub_group_size = int(((checkpoint.model_states.get("ds_config") or {}).get("zero_optimization") or {})
                         .get("sub_group_size", OFFICIAL_SUB_GROUP_SIZE))
    parts = [(group_index, part) for group_index, group in enumerate(groups) for part in reshard.stored_tensor_names(
        group, [shapes[name].numel() for name in group], facts.checkpoint.cut, world_size, sub_group_size)]
    model_states = {**checkpoint.model_states, "dp_world_size": world_size,  # one entry a stored tensor
                    "param_shapes": model_shapes([part for _, part in parts], shapes)}
    for rank in range(world_size if facts.checkpoint.model_states_per_rank else 1):
        if facts.checkpoint.model_states_per_rank:  # each holds its rank's cut of the frozen parameters
            model_states["frozen_param_fragments"] = {
                name: reshard.per_parameter_partition([values.reshape(-1).float()], world_size, rank)
                for name, values in consolidate(checkpoint).items()
                if name in (checkpoint.model_states.get("frozen_param_shapes") or {})}
        files.write_file(model_states, os.path.join(partial, files.model_states_name(facts.checkpoint, rank)))
    for rank in range(world_size):
        masters, moments, steps, group_of = [], [], [], []
        for group_index, part in parts:
            have_moments = all(name in saved.moments for name in part)
            masters.append(_cut([saved.whole[name] for name in part], stage, precision, world_size, rank, True))
            moments.append({key: _cut([saved.moments[name][key] if have_moments else
                                       torch.zeros_like(saved.whole[name]) for name in part], stage, precision,
                                      world_size, rank, False) for key in MOMENTS})
            steps.append(max((saved.step_of.get(name, 0) for name in groups[group_index]), default=0))
            group_of.append(group_index)
        states = optimizer_states(stage, world_size, hyper, group_of, masters, moments, steps, saved.loss_scaler)
        files.write_file(states, os.path.join(partial, files.optim_states_name(precision, rank)))
    files.finish_directory(out, checkpoint.tag)
    files.write_latest(out, checkpoint.tag)
    return describe(OpenCheckpoint.open(out, checkpoint.tag))
