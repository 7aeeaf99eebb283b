"""`engine.save_checkpoint`: DeepSpeed's call, DeepSpeed's files (`load.py` reads them back).

On every rank (`files.py` tells the safe-write phases):
    Phase 1: the tag (default `global_step<N>`) and an empty partial directory.
    Phase 2: the model states: rank 0's file below stage 3 (the module is whole on every rank),
             every rank's at stage 3 (parameters are partitions there).
    Phase 3: the optimizer states: each partition's fp32 master and Adam moments. Stages 0-2 cut
             them as official does (nano's own layout), so each rank writes its slices as they
             are; at stage 3 official cuts per parameter while nano cuts per unit, so each unit
             is gathered whole, one at a time, and recut (`reshard.per_parameter_partition`), in
             each group's own order and official's sub-groups (`reshard.official_sub_groups`).
    Phase 4: a barrier, the rename to `<dir>/<tag>`, then `latest`.
"""

from __future__ import annotations

import os
import time

import torch

from zero_lab.nano.checkpoint import files
from zero_lab.nano import stages
from zero_lab.nano.checkpoint import reshard
from zero_lab.nano.checkpoint.contents import (ENGINE_KEYS, FORMAT_VERSION, MOMENTS, model_shapes, optimizer_states,
                                               scaler_fields)
from zero_lab.nano.errors import CheckpointError


def buffers_of_each_group(optimizer) -> list[list[int]]:
    """Buffer indices of each parameter group, in buffer order (the load reads them so too)."""
    return [[index for index, buffer in enumerate(optimizer.buffers) if buffer.group_index == group]
            for group in range(len(optimizer.partition_optimizer.param_groups))]


def _stored_tensors(engine, stage: stages.Stage) -> list[tuple[int, list[str]]]:
    """(parameter group, names) of each tensor the optimizer files store, in order, as official
    stores them: one a group in the flat cut; in the per-parameter cut one an official sub-group
    (`sub_group_size`). Each group in its own order: official's load copies partitions by position.
    Below stage 3 one buffer holds each group in that order; at stage 3 the units reorder it, so the
    save recuts it (Phase 3)."""
    optimizer, stored = engine.optimizer, []
    for group_index, group in enumerate(optimizer.group_parameters):
        numels = [torch.Size(getattr(parameter, "zero_lab_shape", parameter.shape)).numel() for parameter in group]
        names = [optimizer.parameter_names[parameter] for parameter in group]
        stored += [(group_index, part) for part in reshard.stored_tensor_names(
            names, numels, stage.checkpoint.cut, engine.collectives.world_size,
            engine.nano_config.zero_optimization.sub_group_size)]
    return stored


def _moments_of(optimizer, index: int) -> tuple[int, dict[str, torch.Tensor]]:
    """(Adam step, exp_avg and exp_avg_sq) of buffer `index`'s master, zeros before the first step."""
    master = optimizer.master_partitions[index]
    state = optimizer.partition_optimizer.state.get(master, {})
    moments = {key: state[key] if key in state else torch.zeros_like(master) for key in MOMENTS}
    return int(state.get("step", 0)), moments


def _whole_buffer(optimizer, index: int, values: torch.Tensor) -> list[torch.Tensor]:
    """Stage 3 Phase 3: every rank's partition of buffer `index` (a master or a moment), gathered
    into the buffer's whole parameters (fp32, on the host)."""
    layout = optimizer.buffers[index].layout
    local = values.to(optimizer.placement.device, torch.float32)
    full = torch.empty(layout.padded_numel, dtype=torch.float32, device=local.device)
    optimizer.collectives.all_gather_into_tensor(full, local)
    full = full.cpu()
    return [full[offset:offset + numel] for offset, numel in zip(layout.offsets, layout.parameter_numels)]


def _flat_group(optimizer, buffer_indices: list[int]) -> tuple[list[torch.Tensor], list[dict], int]:
    """Phase 3, flat cut (stages 0-2): this rank's stored master and moments of one group, which is
    one buffer in the group's order, and its Adam step."""
    rank = optimizer.collectives.rank
    (index,) = buffer_indices
    step, moments = _moments_of(optimizer, index)
    layout = optimizer.buffers[index].layout
    # .clone(): in fp32 on the CPU the master partition is a view of the whole flat buffer (the
    # partition is the master), and torch.save writes a view's whole storage: every rank's file
    # would hold the whole model's parameters
    master = reshard.stored_flat(optimizer.master_partitions[index].detach().float().cpu(), layout, rank, True).clone()
    moments = {key: reshard.stored_flat(values.detach().float().cpu(), layout, rank, False)
               for key, values in moments.items()}
    return [master], [moments], step


def _per_parameter_group(optimizer, buffer_indices: list[int],
                         parts: list[list[str]]) -> tuple[list[torch.Tensor], list[dict], int]:
    """Phase 3, official's per-parameter cut (stage 3): each unit's master and moments gathered whole,
    one unit at a time, and this rank's chunk of every parameter kept; then one stored tensor for
    each of `parts` (the group's sub-groups), its parameters' chunks end to end."""
    rank, world_size = optimizer.collectives.rank, optimizer.collectives.world_size
    steps, chunks = [], {key: {} for key in ("master", *MOMENTS)}
    for index in buffer_indices:
        step, moments = _moments_of(optimizer, index)
        steps.append(step)
        names = [optimizer.parameter_names[parameter] for parameter in optimizer.buffers[index].parameters]
        for key, values in (("master", optimizer.master_partitions[index]), *moments.items()):
            for name, whole in zip(names, _whole_buffer(optimizer, index, values)):
                chunks[key][name] = reshard.per_parameter_partition([whole], world_size, rank)
    stored = [{key: torch.cat([chunks[key][name] for name in part]) for key in chunks} for part in parts]
    return [tensors.pop("master") for tensors in stored], stored, max(steps, default=0)


def _module_states(engine, stage: stages.Stage, stored: list[tuple[int, list[str]]]) -> dict:
    """Phase 2: the module's state_dict and the names and shapes zero_to_fp32 reads (with partitioned
    parameters the module holds them as empty tensors, and frozen ones are cut as the masters are)."""
    optimizer, module = engine.optimizer, engine.module
    named = module.state_dict(keep_vars=True)
    parameter_names = optimizer.parameter_names
    trainable = {name for _, names in stored for name in names}
    state, buffer_names, shared, frozen_shapes, frozen = {}, [], {}, {}, {}
    rank, world_size = engine.collectives.rank, engine.collectives.world_size
    for name, value in named.items():
        if not isinstance(value, torch.nn.Parameter):
            buffer_names.append(name)
            state[name] = value.detach().cpu().clone()
            continue
        canonical = parameter_names.get(value, name)
        if canonical != name:
            shared[name] = canonical
        if stage.partitions_parameters and canonical in trainable:
            state[name] = torch.empty(0, dtype=value.dtype)
        else:
            state[name] = value.detach().cpu().clone()
        if canonical == name and name not in trainable:
            frozen_shapes[name] = value.shape
            whole = value.detach().float().cpu().reshape(-1)
            frozen[name] = (reshard.per_parameter_partition([whole], world_size, rank)
                            if stage.checkpoint.cut == reshard.PER_PARAMETER else value.detach().cpu().clone())
    shapes = {name: parameter.zero_lab_shape if hasattr(parameter, "zero_lab_shape") else parameter.shape
              for parameter, name in parameter_names.items()}
    return {"module": state, "buffer_names": buffer_names,
            "param_shapes": model_shapes([names for _, names in stored], shapes),  # one entry a stored tensor
            "shared_params": shared, "frozen_param_shapes": frozen_shapes, "frozen_param_fragments": frozen,
            "lr_scheduler": engine.lr_scheduler.state_dict() if engine.lr_scheduler is not None else None,
            "global_steps": engine.global_steps, "global_samples": engine.global_samples,
            "skipped_steps": engine.skipped_steps, "dp_world_size": world_size, "mp_world_size": 1,
            "ds_config": engine.nano_config.model_dump(mode="json", by_alias=True, exclude_unset=True),
            "ds_version": FORMAT_VERSION, "zero_lab_nano": True}


@torch.no_grad()
def save_checkpoint(engine, save_dir: str, tag=None, client_state: dict | None = None,
                    save_latest: bool = True) -> dict:
    """Write one checkpoint; returns {"tag", "bytes" (this rank's files), "seconds"}."""
    started = time.perf_counter()
    optimizer, collectives = engine.optimizer, engine.collectives
    rank, stage, precision = collectives.rank, stages.of(engine.zero_optimization_stage()), engine.nano_config.precision
    # Phase 1
    tag = str(tag) if tag is not None else f"global_step{engine.global_steps}"
    reserved = ENGINE_KEYS & set(client_state or {})
    if reserved:
        raise CheckpointError(f"client_state key {sorted(reserved)[0]!r} is one the checkpoint itself uses; rename it")
    if rank == 0:
        os.makedirs(save_dir, exist_ok=True)
        files.start_directory(save_dir, tag)
    collectives.barrier()
    directory = files.partial_directory(save_dir, tag)
    written, stored_tensors = 0, _stored_tensors(engine, stage)
    # Phase 2
    if stage.checkpoint.model_states_per_rank or rank == 0:
        states = {**_module_states(engine, stage, stored_tensors), **(client_state or {})}
        written += files.write_file(states, os.path.join(directory, files.model_states_name(stage.checkpoint, rank)))
    # Phase 3
    masters, moments, steps, group_of = [], [], [], []
    for group_index, buffer_indices in enumerate(buffers_of_each_group(optimizer)):
        parts = [names for owner, names in stored_tensors if owner == group_index]
        if stage.checkpoint.cut == reshard.PER_PARAMETER:
            group_masters, group_moments, step = _per_parameter_group(optimizer, buffer_indices, parts)
        else:
            group_masters, group_moments, step = _flat_group(optimizer, buffer_indices)
        masters += group_masters
        moments += group_moments
        steps += [step] * len(parts)
        group_of += [group_index] * len(parts)
    if rank < stage.partition_count(collectives.world_size):  # each partition's owner writes its file
        hyper = [{key: value for key, value in group.items() if key != "params"}
                 for group in optimizer.partition_optimizer.param_groups]
        states = optimizer_states(stage.number, collectives.world_size, hyper, group_of, masters, moments, steps,
                                  scaler_fields(optimizer.loss_scaler))
        written += files.write_file(states, os.path.join(directory, files.optim_states_name(precision, rank)))
    # Phase 4
    files.publish(save_dir, tag, rank, save_latest, collectives.barrier)
    return {"tag": tag, "bytes": written, "seconds": time.perf_counter() - started}
