"""`engine.load_checkpoint`: DeepSpeed's files, nano's or official's, at any stage and world size.

    Phase 1: resolve the tag; read the model states and all N optimizer files (at the saved world
             size with the flat cut on both sides, only this rank's: it holds this rank's partitions).
             Stage 3's per-parameter cut is not nano's per-unit cut: at the saved world size the N
             files stay memory-mapped and Phase 3 copies only this rank's ranges out of them.
    Phase 2: check every trainable parameter is there with its shape (one line if not).
    Phase 3: partition -> whole parameter -> partition (`reshard.py`) into this rank's fp32
             masters and Adam moments; restore the steps, the LR schedule, the loss scaler.
    Phase 4: publish the masters as the parameters (cast to the model's dtype, gathered below
             stage 3), exactly as after an optimizer step.
"""

from __future__ import annotations

import os

import torch

from zero_lab.nano import stages
from zero_lab.nano.checkpoint import files, reshard
from zero_lab.nano.checkpoint.contents import (ENGINE_KEYS, MOMENTS, ChunkedFiles, SavedTraining, module_parameters,
                                               own_flat_partitions)
from zero_lab.nano.checkpoint.save import buffers_of_each_group
from zero_lab.nano.errors import CheckpointError


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
    for buffer_indices in buffers_of_each_group(optimizer):
        if len(buffer_indices) != 1:
            return None
        buffer = optimizer.buffers[buffer_indices[0]]
        expected.append(([optimizer.parameter_names[parameter] for parameter in buffer.parameters],
                         reshard.stored_numel(buffer.layout, rank)))
    partitions = own_flat_partitions(own, model_states["param_shapes"], expected)
    return None if partitions is None else (saved, partitions)


def _chunked_files(engine, model_states: dict, optimizer_paths: list[str]) -> tuple[SavedTraining, ChunkedFiles] | None:
    """Phase 1's short way at stage 3, at the saved world size: the N files of a per-parameter cut,
    memory-mapped and left in place (Phase 3 copies out of them only this rank's ranges). None:
    another cut or world size; then every parameter is put back whole first."""
    world_size = engine.collectives.world_size
    stage = stages.of(engine.zero_optimization_stage())
    if len(optimizer_paths) != world_size or stage.checkpoint.cut != reshard.PER_PARAMETER:
        return None
    optimizer_files = [files.read_file(path) for path in optimizer_paths]
    saved = SavedTraining.header(optimizer_files[0], model_states["param_shapes"])
    if saved.world_size != world_size or stages.of(saved.stage).checkpoint.cut != reshard.PER_PARAMETER:
        return None
    return saved, ChunkedFiles(optimizer_files, model_states["param_shapes"])


def _adopt_chunk_ranges(optimizer, chunked: ChunkedFiles, with_optimizer: bool) -> None:
    """Phase 3 by stage 3's short way: each buffer's partition (master and moments) copied piece by
    piece from the chunks that hold it, so a rank copies its 1/N of the model, never the whole."""
    rank = optimizer.collectives.rank
    keys = ["master", *MOMENTS] if with_optimizer and chunked.step() > 0 and chunked.has_moments() else ["master"]
    for index, buffer in enumerate(optimizer.buffers):
        names = [optimizer.parameter_names[parameter] for parameter in buffer.parameters]
        start, end = buffer.layout.partition_range(rank)
        partitions = {key: torch.zeros(end - start, dtype=torch.float32) for key in keys}
        for piece in buffer.layout.pieces(start, end):
            low = piece.flat_start - start
            for key in keys:
                chunked.copy_range(key, names[piece.parameter_index], piece.parameter_offset,
                                   partitions[key][low:low + piece.numel])
        master = optimizer.master_partitions[index]
        master.copy_(partitions["master"])
        optimizer.partition_optimizer.state.pop(master, None)
        if len(keys) > 1:
            optimizer.partition_optimizer.state[master] = {"step": chunked.step(),
                                            **{key: partitions[key].to(master.device) for key in MOMENTS}}


def _adopt_own_partitions(optimizer, partitions: list, with_optimizer: bool) -> None:
    """Phase 3 by the short way: each group's stored master and moments are its buffer's partition
    (the padding at the buffer's end is zeros)."""
    for buffer_indices, (stored, moments, step) in zip(buffers_of_each_group(optimizer), partitions):
        master = optimizer.master_partitions[buffer_indices[0]]
        master.zero_()
        master[:stored.numel()].copy_(stored)
        optimizer.partition_optimizer.state.pop(master, None)
        if with_optimizer and step > 0 and len(moments) == len(MOMENTS):
            optimizer.partition_optimizer.state[master] = {"step": step}
            for key, values in moments.items():
                padded = torch.zeros_like(master)
                kept = min(values.numel(), master.numel())
                padded[:kept].copy_(values[:kept])  # nano's older files dropped the padding
                optimizer.partition_optimizer.state[master][key] = padded


def _adopt_whole_parameters(optimizer, saved: SavedTraining, with_optimizer: bool) -> None:
    """Phase 3 (whole parameter -> partition): each buffer's partition cut from the whole parameters."""
    rank = optimizer.collectives.rank
    for index, buffer in enumerate(optimizer.buffers):
        names = [optimizer.parameter_names[parameter] for parameter in buffer.parameters]
        master = optimizer.master_partitions[index]
        master.copy_(reshard.flat_partition([saved.whole[name] for name in names], buffer.layout, rank))
        optimizer.partition_optimizer.state.pop(master, None)
        if with_optimizer and all(name in saved.moments for name in names) and saved.step_of[names[0]] > 0:
            optimizer.partition_optimizer.state[master] = {"step": saved.step_of[names[0]], **{
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
    chunked = _chunked_files(engine, model_states, optimizer_paths) if own is None else None
    if own is not None:
        saved, partitions = own
    elif chunked is not None:
        saved, chunked, partitions = *chunked, None
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
    elif chunked is not None:
        _adopt_chunk_ranges(optimizer, chunked, with_optimizer)
    else:
        _adopt_whole_parameters(optimizer, saved, with_optimizer)
    if with_optimizer:
        for group, saved_group in zip(optimizer.partition_optimizer.param_groups, saved.param_groups):
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
