"""DeepSpeed's universal checkpoint: one directory per parameter, whole values, any world size.

The layout `ds_to_universal` writes and official DeepSpeed loads with
`"checkpoint": {"load_universal": true}` in its config:
    <dir>/latest_universal                       the tag, one line (official's load reads it)
    <dir>/<tag>/mp_rank_00_model_states.pt       model states as a stage 0-2 save writes them
    <dir>/<tag>/zero/optimizer_state.pt          the loss scaler, clipping, the groups' hyper-parameters
    <dir>/<tag>/zero/<name>/fp32.pt              {"param": whole fp32 values, "cat_dim": 0}
    <dir>/<tag>/zero/<name>/exp_avg.pt, exp_avg_sq.pt   the same for Adam's moments
    <dir>/<tag>/zero/<name>/step.pt              Adam's step, a tensor
Reading and writing are both one parameter at a time: each file holds one tensor; the module's whole weights are assembled in scratch files (`common.Scratch`).
"""

from __future__ import annotations

import os
import zipfile

import torch

from zero_lab.checkpoint_formats.common import (FLOAT_BYTES, KEYS, MASTER, Facts, Scratch, Source, model_states,
                                                values_or_zeros)
from zero_lab.nano.checkpoint import files
from zero_lab.nano.checkpoint.contents import FORMAT_VERSION, official_loss_scaler
from zero_lab.nano.errors import CheckpointError

LATEST = "latest_universal"
ZERO = "zero"
OPTIMIZER_STATE = "optimizer_state.pt"
FILE_OF_KEY = {MASTER: "fp32.pt", "exp_avg": "exp_avg.pt", "exp_avg_sq": "exp_avg_sq.pt"}
MODEL_STATES = "mp_rank_00_model_states.pt"
UNIVERSAL_INFO = {"universal_checkpoint_version": 0.4}  # official's UNIVERSAL_CHECKPOINT_VERSION_VALUE


def is_universal_directory(directory: str) -> bool:
    return os.path.isfile(os.path.join(directory, ZERO, OPTIMIZER_STATE))


def resolve_tag(directory: str, tag: str | None) -> str:
    if tag is not None:
        return tag
    with open(os.path.join(directory, LATEST)) as handle:
        return handle.read().strip()


class UniversalSource:
    def __init__(self, directory: str, tag: str):
        self.directory = os.path.join(directory, tag)
        model_states = files.read_file(os.path.join(self.directory, MODEL_STATES))
        optimizer = files.read_file(os.path.join(self.directory, ZERO, OPTIMIZER_STATE))
        shapes = {name: torch.Size(shape) for group in model_states["param_shapes"] for name, shape in group.items()}
        missing = [name for name in shapes if not os.path.isfile(self._path(name, MASTER))]
        if missing:
            raise CheckpointError(f"{self._path(missing[0], MASTER)} is missing ({len(missing)} parameters lack their "
                                  f"fp32.pt); convert the checkpoint again or point at a complete one")
        # A torch.save file is a zip whose index is at its end: a file cut short has none. Checked
        # for every file before anything is written (reading only each file's last bytes).
        cut = [path for name in shapes for path in (self._path(name, key) for key in KEYS)
               if os.path.isfile(path) and not zipfile.is_zipfile(path)]
        if cut:
            raise CheckpointError(f"checkpoint file {cut[0]} is truncated or corrupt ({len(cut)} such files); "
                                  f"convert the checkpoint again")
        hyper = [{key: value for key, value in group.items() if key != "params"}
                 for group in optimizer.get("param_groups", [])]
        names = [list(group) for group in model_states["param_shapes"]]
        hyper = hyper if len(hyper) == len(names) else [{} for _ in names]
        first = next(iter(shapes), None)
        step_path = os.path.join(self.directory, ZERO, first, "step.pt") if first else ""
        step = _read_step(step_path) if os.path.isfile(step_path) else 0
        scaler = optimizer.get("loss_scaler")
        buffers = {name: model_states["module"][name] for name in model_states.get("buffer_names", [])
                   if name in model_states["module"]}
        module_dtype = next((model_states["module"][name].dtype for name in shapes if name in model_states["module"]),
                            torch.float32)
        self.facts = Facts("universal", tag, shapes, [{**h, "names": n} for h, n in zip(hyper, names)], step,
                           model_states.get("global_steps"), model_states.get("global_samples"),
                           model_states.get("skipped_steps"), model_states.get("lr_scheduler"),
                           dict(vars(scaler)) if scaler is not None and not isinstance(scaler, dict) else scaler or {},
                           model_states.get("ds_config"), module_dtype, buffers,
                           dict(model_states.get("shared_params") or {}))

    def _path(self, name: str, key: str) -> str:
        return os.path.join(self.directory, ZERO, name, FILE_OF_KEY[key])

    def read(self, name: str, key: str) -> torch.Tensor | None:
        if key != MASTER and not self.facts.has_moments:
            return None
        values = files.read_file(self._path(name, key), mmap=False)["param"]
        if values.shape != self.facts.shapes[name]:
            raise CheckpointError(f"{self._path(name, key)} holds shape {tuple(values.shape)}, param_shapes says "
                                  f"{tuple(self.facts.shapes[name])} (mismatched shapes); convert again")
        return values.float()  # fp32 already: no copy

    def read_bytes(self, name: str, key: str) -> int:
        return 0 if key != MASTER and not self.facts.has_moments else self.facts.shapes[name].numel() * FLOAT_BYTES


def _read_step(path: str) -> int:
    try:
        return int(float(torch.load(path, map_location="cpu", weights_only=True)))
    except Exception as error:  # torch.load's errors on a damaged file vary by how it is damaged
        raise CheckpointError(f"checkpoint file {path} is truncated or corrupt ({type(error).__name__}); "
                              f"convert the checkpoint again") from None


def write(source: Source, out: str, clip_grad: float | None = None) -> list[str]:
    """Write `out/<tag>/` and `out/latest_universal`; `out` is the conversion's partial directory."""
    facts = source.facts
    directory = os.path.join(out, facts.tag)
    os.makedirs(os.path.join(directory, ZERO))
    written = []
    scratch = Scratch(os.path.join(out, ".scratch"))
    try:
        module = {name: scratch.zeros(shape.numel(), facts.model_dtype).view(shape)
                  for name, shape in facts.shapes.items()}
        for name in facts.shapes:
            os.makedirs(os.path.join(directory, ZERO, name))
            for key in KEYS:
                values = values_or_zeros(source, name, key)
                if key == MASTER:
                    module[name].copy_(values)
                path = os.path.join(directory, ZERO, name, FILE_OF_KEY[key])
                files.write_file({"param": values, "cat_dim": 0}, path)
                written.append(path)
                del values
            path = os.path.join(directory, ZERO, name, "step.pt")
            files.write_file(torch.tensor(float(facts.step)), path)
            written.append(path)
        written.append(_write_model_states(facts, directory, module))
    finally:
        scratch.close()
    written.append(_write_optimizer_state(facts, directory, clip_grad))
    with open(os.path.join(out, LATEST), "w") as handle:
        handle.write(facts.tag)
    return written


def _write_model_states(facts: Facts, directory: str, module: dict) -> str:
    """As a stage 0-2 save writes them (the stage the source was saved at, else 1), marked universal."""
    stage = facts.stage if facts.stage in (0, 1, 2) else 1
    path = os.path.join(directory, MODEL_STATES)
    files.write_file({**model_states(facts, module, [group["names"] for group in facts.groups], facts.world_size or 1,
                                     stage), "universal_checkpoint_info": dict(UNIVERSAL_INFO)}, path)
    return path


def _write_optimizer_state(facts: Facts, directory: str, clip_grad: float | None) -> str:
    """What ds_to_universal keeps of rank 0's optimizer file, plus the step where official's stage-3
    universal load looks for it."""
    param_groups = [{**{key: value for key, value in group.items() if key != "names"}, "params": [index]}
                    for index, group in enumerate(facts.groups)]
    clip = clip_grad if clip_grad is not None else float((facts.ds_config or {}).get("gradient_clipping", 0.0))
    path = os.path.join(directory, ZERO, OPTIMIZER_STATE)
    files.write_file({"loss_scaler": official_loss_scaler(facts.loss_scaler),
                      "dynamic_loss_scale": bool(facts.loss_scaler.get("dynamic", False)), "overflow": False,
                      "clip_grad": clip, "partition_count": [facts.world_size or 1] * len(param_groups),
                      "ds_version": FORMAT_VERSION, "param_groups": param_groups,
                      "optimizer_state_dict": {"state": {0: {"step": facts.step}}, "param_groups": param_groups}},
                     path)
    return path

