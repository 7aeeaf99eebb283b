"""`engine.save_checkpoint` and `engine.load_checkpoint`: DeepSpeed's calls, DeepSpeed's files.

Save, on every rank (`files.py` tells the safe-write phases):
    Phase 1: the tag (default `global_step<N>`) and an empty partial directory.
    Phase 2: the model states: rank 0's file below stage 3 (the module is whole on every rank),
             every rank's at stage 3 (parameters are partitions there).
    Phase 3: the optimizer states: each partition's fp32 master and Adam moments. Stages 0-2 cut
             them as official does (nano's own layout), so each rank writes its slices as they
             are; at stage 3 official cuts per parameter while nano cuts per unit, so each unit
             is gathered whole, one at a time, and recut (`reshard.per_parameter_partition`), in
             each group's own order and official's sub-groups (`reshard.official_sub_groups`).
    Phase 4: a barrier, the rename to `<dir>/<tag>`, then `latest`.
Load (any stage, any world size, nano's or official's files):
    Phase 1: resolve the tag; read the model states and all N optimizer files (at the saved world
             size with the flat cut on both sides, only this rank's: it holds this rank's partitions).
    Phase 2: check every trainable parameter is there with its shape (one line if not).
    Phase 3: partition -> whole parameter -> partition (`reshard.py`) into this rank's fp32
             masters and Adam moments; restore the steps, the LR schedule, the loss scaler.
    Phase 4: publish the masters as the parameters (cast to the model's dtype, gathered below
             stage 3), exactly as after an optimizer step.
"""

from __future__ import annotations

import os
import time

import torch

from zero_lab.nano.checkpoint import files
from zero_lab.nano import stages
from zero_lab.nano.checkpoint import reshard
from zero_lab.nano.checkpoint.contents import (ENGINE_KEYS, FORMAT_VERSION, MOMENTS, SavedTraining, model_shapes,
                                               module_parameters, optimizer_states, own_flat_partitions,
                                               scaler_fields)
from zero_lab.nano.errors import CheckpointError


def _groups(optimizer) -> list[list[int]]:
    """Buffer indices of each parameter group, in buffer order."""
    return [[index for index, buffer in enumerate(optimizer.buffers) if buffer.group_index == group]
            for group in range(len(optimizer.adam.param_groups))]


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
    state = optimizer.adam.state.get(master, {})
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
    master = reshard.stored_flat(optimizer.master_partitions[index].detach().float().cpu(), layout, rank, True)
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
    for group_index, buffer_indices in enumerate(_groups(optimizer)):
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
                 for group in optimizer.adam.param_groups]
        states = optimizer_states(stage.number, collectives.world_size, hyper, group_of, masters, moments, steps,
                                  scaler_fields(optimizer.loss_scaler))
        written += files.write_file(states, os.path.join(directory, files.optim_states_name(precision, rank)))
    # Phase 4
    collectives.barrier()
    if rank == 0:
        files.finish_directory(save_dir, tag)
        if save_latest:
            files.write_latest(save_dir, tag)
    collectives.barrier()
    return {"tag": tag, "bytes": written, "seconds": time.perf_counter() - started}


def _own_partitions(engine, model_states: dict, optimizer_paths: list[str]) -> tuple[SavedTraining, list] | None:
    """Phase 1's short way, at the saved world size: with the flat cut in the files and in this
    stage, and each group one buffer laid out as the file's, this rank's optimizer file holds
    exactly its partitions, so it is the one optimizer file read. None: read every rank's."""
    optimizer, rank, world_size = engine.optimizer, engine.collectives.rank, engine.collectives.world_size
    stage = stages.of(engine.zero_optimization_stage())
    if len(optimizer_paths) != world_size or stage.checkpoint.cut != reshard.FLAT \
            or stage.partition_count(world_size) != world_size:
        return None
    own = files.read_file(optimizer_paths[rank])
    saved = SavedTraining.header(own, model_states["param_shapes"])
    if saved.world_size != world_size or stages.of(saved.stage).checkpoint.cut != reshard.FLAT:
        return None
    expected = []
    for buffer_indices in _groups(optimizer):
        if len(buffer_indices) != 1:
            return None
        buffer = optimizer.buffers[buffer_indices[0]]
        expected.append(([optimizer.parameter_names[parameter] for parameter in buffer.parameters],
                         reshard.stored_numel(buffer.layout, rank)))
    partitions = own_flat_partitions(own, model_states["param_shapes"], expected)
    return None if partitions is None else (saved, partitions)


def _adopt_own_partitions(optimizer, partitions: list, with_optimizer: bool) -> None:
    """Phase 3 by the short way: each group's stored master and moments are its buffer's partition
    (the padding at the buffer's end is zeros)."""
    for buffer_indices, (stored, moments, step) in zip(_groups(optimizer), partitions):
        master = optimizer.master_partitions[buffer_indices[0]]
        master.zero_()
        master[:stored.numel()].copy_(stored)
        optimizer.adam.state.pop(master, None)
        if with_optimizer and step > 0 and len(moments) == len(MOMENTS):
            optimizer.adam.state[master] = {"step": step}
            for key, values in moments.items():
                padded = torch.zeros_like(master)
                kept = min(values.numel(), master.numel())
                padded[:kept].copy_(values[:kept])  # nano's older files dropped the padding
                optimizer.adam.state[master][key] = padded


def _adopt_whole_parameters(optimizer, saved: SavedTraining, with_optimizer: bool) -> None:
    """Phase 3 (whole parameter -> partition): each buffer's partition cut from the whole parameters."""
    rank = optimizer.collectives.rank
    for index, buffer in enumerate(optimizer.buffers):
        names = [optimizer.parameter_names[parameter] for parameter in buffer.parameters]
        master = optimizer.master_partitions[index]
        master.copy_(reshard.flat_partition([saved.whole[name] for name in names], buffer.layout, rank))
        optimizer.adam.state.pop(master, None)
        if with_optimizer and all(name in saved.moments for name in names) and saved.step_of[names[0]] > 0:
            optimizer.adam.state[master] = {"step": saved.step_of[names[0]], **{
                key: reshard.flat_partition([saved.moments[name][key] for name in names], buffer.layout,
                                            rank).to(master.device) for key in MOMENTS}}


def _check_shapes(engine, shapes: dict[str, torch.Size], path: str) -> None:
    """Phase 2: every trainable parameter is in the checkpoint with its shape."""
    for parameter, name in engine.optimizer.parameter_names.items():
        if not parameter.requires_grad:
            continue
        if name not in shapes:
            raise CheckpointError(f"parameter {name} is not in {path}; load a checkpoint of this model")
        ours = tuple(getattr(parameter, "zero_lab_shape", parameter.shape))
        if tuple(shapes[name]) != ours:
            raise CheckpointError(f"parameter {name} has shape {list(ours)} but the checkpoint's is "
                                  f"{list(shapes[name])}; load a checkpoint of this model")


@torch.no_grad()
def load_checkpoint(engine, load_dir: str, tag=None, load_module_strict: bool = True,
                    load_optimizer_states: bool = True, load_lr_scheduler_states: bool = True,
                    load_module_only: bool = False) -> tuple:
    """(path of the model-states file, client_state), or (None, None) with nothing to load."""
    optimizer = engine.optimizer
    # Phase 1
    tag = files.resolve_tag(load_dir, tag)
    if tag is None:
        return None, None
    optimizer_paths = files.optimizer_paths(load_dir, tag, parameters_only=load_module_only or not load_optimizer_states)
    model_path, model_states = files.read_model_states(load_dir, tag)
    own = _own_partitions(engine, model_states, optimizer_paths)
    if own is not None:
        saved, partitions = own
    elif optimizer_paths:
        saved, partitions = SavedTraining.read([files.read_file(path) for path in optimizer_paths],
                                               model_states["param_shapes"], optimizer_paths), None
    else:  # the module only, from the model states (a ZeRO-3 file holds no values: refused there)
        saved, partitions = module_parameters(model_states, model_path), None
    shapes = {name: shape for group in model_states["param_shapes"] for name, shape in group.items()}
    # Phase 2
    _check_shapes(engine, shapes, model_path)
    if load_module_strict:
        ours = set(optimizer.parameter_names.values())
        extra = [name for name in shapes if name not in ours]
        if extra:
            raise CheckpointError(f"the checkpoint has parameter {extra[0]}, which this model lacks; load a "
                                  f"checkpoint of this model or pass load_module_strict=False")
    # Phase 3
    with_optimizer = load_optimizer_states and not load_module_only
    if partitions is not None:
        _adopt_own_partitions(optimizer, partitions, with_optimizer)
    else:
        _adopt_whole_parameters(optimizer, saved, with_optimizer)
    if with_optimizer:
        for group, saved_group in zip(optimizer.adam.param_groups, saved.param_groups):
            if "lr" in saved_group:
                group["lr"] = saved_group["lr"]
        for key, value in saved.loss_scaler.items():  # whether scaling is dynamic is the config's to say
            if key != "dynamic" and hasattr(optimizer.loss_scaler, key):
                setattr(optimizer.loss_scaler, key, value)
    _restore_module_extras(engine, model_states, load_dir, tag, stages.of(saved.stage).checkpoint)
    if load_lr_scheduler_states and not load_module_only and engine.lr_scheduler is not None \
            and model_states.get("lr_scheduler") is not None:
        engine.lr_scheduler.load_state_dict(model_states["lr_scheduler"])
    if not load_module_only:
        engine.global_steps = int(model_states.get("global_steps", 0))
        engine.global_samples = int(model_states.get("global_samples",
                                                     engine.global_steps * engine.train_batch_size()))
        engine.skipped_steps = int(model_states.get("skipped_steps", 0))
        engine.micro_steps = engine.global_steps * engine.gradient_accumulation_steps()
    # Phase 4
    optimizer.adopt_masters()
    client_state = {key: value for key, value in model_states.items() if key not in ENGINE_KEYS}
    return model_path, client_state


@torch.no_grad()
def _restore_module_extras(engine, model_states: dict, load_dir: str, tag: str,
                           layout: stages.CheckpointLayout) -> None:
    """Buffers and frozen parameters, which live outside the optimizer's partitions."""
    module = engine.module
    buffers = dict(module.named_buffers())
    for name in model_states.get("buffer_names", []):
        if name in buffers and name in model_states["module"]:
            buffers[name].copy_(model_states["module"][name])
    frozen = model_states.get("frozen_param_fragments") or {}
    if not frozen:
        return
    parameters = dict(module.named_parameters())
    count = int(model_states.get("dp_world_size", 1))
    per_rank = None
    if layout.model_states_per_rank:  # each rank's file holds its cut of the frozen parameters
        per_rank = [files.read_file(os.path.join(load_dir, tag, files.model_states_name(layout, rank)))
                    ["frozen_param_fragments"] for rank in range(count)]
    for name, shape in (model_states.get("frozen_param_shapes") or {}).items():
        if name not in parameters:
            continue
        if per_rank is None:
            values = frozen[name]
        else:
            values = torch.cat([fragments[name].reshape(-1) for fragments in per_rank])[:torch.Size(shape).numel()]
        parameters[name].copy_(values.reshape(parameters[name].shape))
