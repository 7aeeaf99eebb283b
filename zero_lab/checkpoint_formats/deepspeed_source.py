"""A DeepSpeed ZeRO checkpoint (nano's or official's, stage 0-3, any world size) read one
parameter at a time.

Phase 1 (`open_source`): the tag's files are opened memory-mapped (`files.read_tag`); nothing is
         copied. The header says the stage and world size; every rank's file must be there, and the
         stored tensors must hold exactly the elements `param_shapes` names.
Phase 2 (`read`): one key of one parameter is copied out of the ranks' stored tensors into one new
         whole tensor: for the flat cut (stages 0-2) from the N partitions end to end, for the
         per-parameter cut (stage 3) from each rank's chunk (`contents.ChunkedFiles`).
"""

from __future__ import annotations

import os

import torch

from zero_lab.checkpoint_formats.common import FLOAT_BYTES, MASTER, Facts, copy_range
from zero_lab.nano.checkpoint import files, reshard
from zero_lab.nano.checkpoint.contents import ChunkedFiles, SavedTraining, fp32_key, moments_key
from zero_lab.nano.errors import CheckpointError


def is_deepspeed_directory(directory: str) -> bool:
    return os.path.isdir(directory) and any(name.endswith("_optim_states.pt") or name.endswith("_model_states.pt")
                                            for name in os.listdir(directory))


class DeepSpeedSource:
    def __init__(self, directory: str, tag: str):
        # Phase 1
        model_path, model_states, optimizer_files, paths = files.read_tag(directory, tag)
        param_shapes = model_states["param_shapes"]
        header = SavedTraining.header(optimizer_files[0], param_shapes)
        self.stage, self.world_size = header.stage, header.world_size
        if len(optimizer_files) != self.world_size:
            raise CheckpointError(f"{os.path.join(directory, tag)} was saved by {self.world_size} ranks but holds "
                                  f"{len(optimizer_files)} optimizer files (a rank's shard is missing); "
                                  f"copy every rank's file, or convert another tag")
        self.states = [file["optimizer_state_dict"] for file in optimizer_files]
        self.per_parameter = reshard.cut_of_stage(self.stage) == reshard.PER_PARAMETER
        shapes = {name: torch.Size(shape) for group in param_shapes for name, shape in group.items()}
        if self.per_parameter:
            self.chunks = ChunkedFiles(optimizer_files, param_shapes)
            step = self.chunks.step() if self.chunks.has_moments() else 0
        else:
            self.where = {}  # name -> (group, start in the group's flat values)
            for group_index, group in enumerate(param_shapes):
                start = 0
                for name, shape in group.items():
                    self.where[name] = (group_index, start)
                    start += torch.Size(shape).numel()
            step = max((int(float(state[moments_key(self.stage)]["state"].get(group, {}).get("step", 0)))
                        for state in self.states for group in range(len(param_shapes))), default=0)
        self._check_sizes(param_shapes, paths[0])
        self.facts = Facts("deepspeed", tag, shapes, _groups(header, param_shapes), step,
                           model_states.get("global_steps"), model_states.get("global_samples"),
                           model_states.get("skipped_steps"), model_states.get("lr_scheduler"), header.loss_scaler,
                           model_states.get("ds_config"), _module_dtype(model_states, shapes),
                           {name: model_states["module"][name] for name in model_states.get("buffer_names", [])
                            if name in model_states["module"]},
                           dict(model_states.get("shared_params") or {}), self.stage, self.world_size)
        frozen = model_states.get("frozen_param_shapes") or {}
        if frozen:
            self.facts.left_behind.append(f"{len(frozen)} frozen parameters (without gradients, e.g. "
                                          f"{next(iter(frozen))}) are not converted: only trained ones are")

    def _check_sizes(self, param_shapes: list[dict], path: str) -> None:
        """Mismatched shapes: the stored masters must hold exactly the elements the names say."""
        stored = sum(tensor.numel() for state in self.states for tensor in state[fp32_key(self.stage)])
        if self.per_parameter:
            expected = sum(reshard.chunk_numel(torch.Size(shape).numel(), self.world_size) * self.world_size
                           for group in param_shapes for shape in group.values())
        else:
            expected = sum(torch.Size(shape).numel() for group in param_shapes for shape in group.values())
        if stored != expected:
            raise CheckpointError(f"{path}: the optimizer files hold {stored} fp32 elements but param_shapes names "
                                  f"{expected} (mismatched shapes); the files do not belong together, "
                                  f"convert another tag")

    # Phase 2
    def read(self, name: str, key: str) -> torch.Tensor | None:
        shape = self.facts.shapes[name]
        if key != MASTER and not self.facts.has_moments:
            return None
        out = torch.empty(shape.numel())
        if self.per_parameter:
            self.chunks.copy_range(key, name, 0, out)
        else:
            group, start = self.where[name]
            copy_range(self._pieces(group, key), start, out)
        return out.view(shape)

    def read_bytes(self, name: str, key: str) -> int:
        return 0 if key != MASTER and not self.facts.has_moments else self.facts.shapes[name].numel() * FLOAT_BYTES

    def _pieces(self, group: int, key: str) -> list[torch.Tensor]:
        """The N ranks' stored tensors of one group's `key`, each as long as that rank's master
        (a moment keeps the padding at the buffer's end, which the master drops)."""
        masters = [state[fp32_key(self.stage)][group].detach().reshape(-1) for state in self.states]
        if key == MASTER:
            return masters
        return [state[moments_key(self.stage)]["state"][group][key].reshape(-1)[:master.numel()]
                for state, master in zip(self.states, masters)]


def _groups(header: SavedTraining, param_shapes: list[dict]) -> list[dict]:
    hyper = [{key: value for key, value in group.items() if key != "params"} for group in header.param_groups]
    names = header.group_names
    if len(hyper) != len(names):
        hyper = [hyper[0] if hyper else {} for _ in names]
    return [{**group_hyper, "names": group_names} for group_hyper, group_names in zip(hyper, names)]


def _module_dtype(model_states: dict, shapes: dict) -> torch.dtype:
    for name in shapes:
        values = model_states["module"].get(name)
        if values is not None:
            return values.dtype
    return torch.float32


