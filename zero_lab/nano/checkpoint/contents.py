"""What a checkpoint's files hold, in official DeepSpeed's keys, and the whole parameters read back.

Model states (`mp_rank_00_model_states.pt`; at stage 3 one per rank):
    module              the module's state_dict in its dtype (stage 3: parameters as empty tensors,
                        as official writes them; buffers whole)
    buffer_names, param_shapes (per group, name -> shape, in the order the partitions hold them),
    shared_params (alias -> name of a tied parameter), frozen_param_shapes, frozen_param_fragments
                        (whole below stage 3; this rank's per-parameter chunk at stage 3)
    lr_scheduler, global_steps, global_samples, skipped_steps, dp_world_size, ds_config, ds_version,
    and the caller's client_state keys beside them
Optimizer states (`[bf16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt`), under optimizer_state_dict:
    zero_stage, partition_count, loss_scaler (official's LossScaler or DynamicLossScaler object;
    nano's files before 2026-12 held a dict of its fields, still read), dynamic_loss_scale,
    single_partition_of_fp32_groups (stages 0-2: flat cut, padding dropped) or fp32_flat_groups
    (stage 3: per-parameter cut), and base_optimizer_state (stages 0-2) / optimizer_state_dict
    (stage 3): torch.optim's {"state": {group: {step, exp_avg, exp_avg_sq}}, "param_groups": [...]},
    the moments cut as the masters are.
`SavedTraining.read` turns the N optimizer files of any stage, nano's or official's, into whole
parameters by name (`reshard.whole_parameters`).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from zero_lab.nano import stages
from zero_lab.nano.checkpoint import files, reshard
from zero_lab.nano.errors import CheckpointError

FORMAT_VERSION = "0.19.8"  # the official DeepSpeed release whose file format nano writes
MOMENTS = ("exp_avg", "exp_avg_sq")
DYNAMIC_SCALER_FIELDS = ("cur_scale", "dynamic", "cur_iter", "last_overflow_iter", "scale_factor", "scale_window",
                         "min_scale", "delayed_shift", "cur_hysteresis", "consecutive_hysteresis")
ENGINE_KEYS = frozenset({"module", "buffer_names", "param_shapes", "shared_params", "frozen_param_shapes",
                         "frozen_param_fragments", "lr_scheduler", "optimizer", "global_steps", "global_samples",
                         "skipped_steps", "dp_world_size", "mp_world_size", "ds_config", "ds_version",
                         "data_sampler", "random_ltd", "checkpoint_parallel_dimensions", "zero_lab_nano"})


def fp32_key(stage: int) -> str:
    return stages.of(stage).checkpoint.fp32_key


def moments_key(stage: int) -> str:
    return stages.of(stage).checkpoint.moments_key


def optimizer_states(stage: int, world_size: int, groups: list[dict], group_of: list[int],
                     masters: list[torch.Tensor], moments: list[dict[str, torch.Tensor]], steps: list[int],
                     loss_scaler: dict) -> dict:
    """One rank's optimizer file: `masters[t]`, `moments[t]` and `steps[t]` are its stored tensor t,
    which belongs to parameter group `group_of[t]` (one tensor a group in the flat cut; one an official
    sub-group in the per-parameter cut); `groups` are the groups' hyper-parameters."""
    facts = stages.of(stage)
    partition_count = facts.partition_count(world_size)
    state = {index: {"step": torch.tensor(float(step)), **tensor_moments}
             for index, (step, tensor_moments) in enumerate(zip(steps, moments))}
    param_groups = [{**{key: value for key, value in group.items() if key != "params"},
                     "params": [index for index, owner in enumerate(group_of) if owner == group_index]}
                    for group_index, group in enumerate(groups)]
    return {"optimizer_state_dict": {
        "zero_stage": stage,
        "partition_count": [partition_count] * len(groups) if facts.checkpoint.partition_count_per_group
        else partition_count,
        "loss_scaler": official_loss_scaler(loss_scaler),
        "dynamic_loss_scale": bool(loss_scaler.get("dynamic", False)),
        "overflow": False,
        fp32_key(stage): masters,
        moments_key(stage): {"state": state, "param_groups": param_groups},
        "ds_version": FORMAT_VERSION,
    }, "ds_version": FORMAT_VERSION}


def official_loss_scaler(fields: dict) -> files.OfficialLossScaler:
    """The scaler as official pickles it, since official's load takes it as is and calls it: its
    DynamicLossScaler when scaling is dynamic (fp16), else its static LossScaler (scale 1 outside
    fp16). nano's scaler fields carry official's names."""
    if not fields.get("dynamic"):
        scaler = files.OfficialLossScaler()
        scaler.__dict__.update(cur_scale=float(fields.get("cur_scale", 1.0)), dynamic=False)
        return scaler
    scaler = files.OfficialDynamicLossScaler()
    scaler.__dict__.update({name: fields[name] for name in DYNAMIC_SCALER_FIELDS},
                           raise_error_at_min_scale=True, dtype=torch.float16)  # as official's fp16 scaler
    return scaler


def scaler_fields(scaler: object) -> dict:
    """A loss scaler's fields as plain values (nano's, or official's pickled one read as a stand-in)."""
    return {key: value for key, value in vars(scaler).items() if isinstance(value, (bool, int, float, str))}



def saved_stage(state: dict) -> int:
    """The ZeRO stage an optimizer file was written at. Official's BF16_Optimizer (stage 1 with bf16
    and `data_types.grad_accum_dtype: fp32`) writes no zero_stage and no loss scaler: its flat fp32
    partitions and torch.optim state are stage 1's cut, under stage 1's keys, so it reads as stage 1."""
    if "zero_stage" in state:
        return int(state["zero_stage"])
    if fp32_key(1) in state and moments_key(1) in state:
        return 1
    raise CheckpointError("an optimizer file holds neither zero_stage nor BF16_Optimizer's flat fp32 partitions: "
                          "it is not a DeepSpeed ZeRO checkpoint; load another tag or load_module_only=True")


@dataclass
class SavedTraining:
    """Everything the optimizer files of one tag say, with the partitions put back together."""

    stage: int
    world_size: int
    whole: dict[str, torch.Tensor] = field(default_factory=dict)  # fp32 master values, flat
    moments: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)  # name -> exp_avg, exp_avg_sq
    step_of: dict[str, int] = field(default_factory=dict)
    param_groups: list[dict] = field(default_factory=list)
    group_names: list[list[str]] = field(default_factory=list)  # each parameter group's names, in file order
    loss_scaler: dict = field(default_factory=dict)

    @classmethod
    def header(cls, optimizer_file: dict, param_shapes: list[dict]) -> "SavedTraining":
        """What any one rank's optimizer file says of the whole: stage, world size, groups, scaler."""
        first = optimizer_file["optimizer_state_dict"]
        stage = saved_stage(first)
        count = first["partition_count"]
        loss_scaler = first.get("loss_scaler")
        saved = cls(stage, max(count) if isinstance(count, list) else int(count),
                    loss_scaler=loss_scaler if isinstance(loss_scaler, dict)
                    else scaler_fields(loss_scaler) if loss_scaler is not None else {})
        saved.param_groups = list(first[moments_key(stage)].get("param_groups", []))
        saved.group_names = _group_names(param_shapes, saved.param_groups)
        return saved

    @classmethod
    def read(cls, optimizer_files: list[dict], param_shapes: list[dict], paths: list[str]) -> "SavedTraining":
        """Phase 1 of resharding for every group: N ranks' stored tensors -> whole parameters."""
        saved = cls.header(optimizer_files[0], param_shapes)
        stage, world_size = saved.stage, saved.world_size
        if len(optimizer_files) != world_size:
            raise CheckpointError(f"the checkpoint was saved by {world_size} ranks but {len(optimizer_files)} "
                                  f"optimizer files are there; load another tag")
        states = [file["optimizer_state_dict"] for file in optimizer_files]
        names = [[name for name in shapes] for shapes in param_shapes]
        numels = [[_numel(shapes[name]) for name in shapes] for shapes in param_shapes]
        # Stage 3 cuts per parameter across every group (official may split a group into several
        # sub-groups), so its groups are read as one; the flat cut is per group.
        if reshard.cut_of_stage(stage) == reshard.PER_PARAMETER:
            names, numels = [[n for group in names for n in group]], [[n for group in numels for n in group]]
        for group_index, (group_names, group_numels) in enumerate(zip(names, numels)):
            masters = [_group_tensors(state[fp32_key(stage)], group_index, stage) for state in states]
            try:
                wholes = reshard.whole_parameters(masters, group_numels, reshard.cut_of_stage(stage))
            except ValueError as error:
                raise CheckpointError(f"{paths[0]}: {error}; the files do not belong together, load another tag") \
                    from None
            saved.whole.update(zip(group_names, wholes))
            moment_states = [_group_moments(state[moments_key(stage)]["state"], group_index, stage) for state in states]
            step = max(int(float(moment_state.get("step", 0))) for moment_state in moment_states)
            saved.step_of.update(dict.fromkeys(group_names, step))
            if step == 0 or any(key not in moment_state for moment_state in moment_states for key in MOMENTS):
                continue
            per_name = {}
            for key in MOMENTS:
                cut = [moment_state[key].reshape(-1)[:master.numel()] for moment_state, master in
                       zip(moment_states, masters)]
                per_name[key] = reshard.whole_parameters(cut, group_numels, reshard.cut_of_stage(stage))
            for position, name in enumerate(group_names):
                saved.moments[name] = {key: per_name[key][position] for key in MOMENTS}
        return saved


def own_flat_partitions(own_file: dict, param_shapes: list[dict],
                        expected: list[tuple[list[str], int]]) -> list[tuple[torch.Tensor, dict, int]] | None:
    """One rank's file of a flat cut, read as that rank's partitions: per group (master without its
    end padding, moments, Adam step), when group g holds exactly the names `expected[g][0]` and its
    stored master `expected[g][1]` elements, as the loading rank's layout would cut it. None when
    the file is laid out otherwise: then every rank's file is needed."""
    state = own_file["optimizer_state_dict"]
    stage = saved_stage(state)
    masters, moments = state.get(fp32_key(stage)), state.get(moments_key(stage), {})
    param_groups = moments.get("param_groups", [])
    if masters is None or len(masters) != len(expected) or len(param_shapes) != len(expected) \
            or len(param_groups) != len(expected):
        return None
    partitions = []
    for (names, kept), shapes, master, group in zip(expected, param_shapes, masters, param_groups):
        if list(shapes) != names or master.numel() != kept or len(group.get("params", [])) != 1:
            return None
        entry = moments.get("state", {}).get(group["params"][0], {})
        partitions.append((master.detach().reshape(-1).float(),
                           {key: entry[key].reshape(-1).float() for key in MOMENTS if key in entry},
                           int(float(entry.get("step", 0)))))
    return partitions


class ChunkedFiles:
    """The N optimizer files of a per-parameter cut (stage 3), read in place: where each parameter's
    chunk lies in every rank's stored tensors (official's sub-groups), without joining anything."""

    def __init__(self, optimizer_files: list[dict], param_shapes: list[dict]):
        self.states = [file["optimizer_state_dict"] for file in optimizer_files]
        stage = saved_stage(self.states[0])
        self.masters = [state[fp32_key(stage)] for state in self.states]
        self.moments = [[entry for _, entry in sorted(state[moments_key(stage)]["state"].items())]
                        for state in self.states]
        self.world_size = len(optimizer_files)
        self.where: dict[str, tuple[int, int, int]] = {}  # name -> (stored tensor, offset, chunk)
        for stored, shapes in enumerate(param_shapes):
            offset = 0
            for name, shape in shapes.items():
                chunk = reshard.chunk_numel(_numel(shape), self.world_size)
                self.where[name] = (stored, offset, chunk)
                offset += chunk

    def has_moments(self) -> bool:
        return all(len(entries) == len(masters) and all(key in entry for entry in entries for key in MOMENTS)
                   for entries, masters in zip(self.moments, self.masters))

    def step(self) -> int:
        return max((int(float(entry.get("step", 0))) for entries in self.moments for entry in entries), default=0)

    def values(self, key: str, rank: int, stored: int) -> torch.Tensor:
        """Rank `rank`'s stored tensor `stored` of the master ("master") or a moment, flat."""
        tensor = self.masters[rank][stored] if key == "master" else self.moments[rank][stored][key]
        return tensor.detach().reshape(-1)

    def copy_range(self, key: str, name: str, start: int, out: torch.Tensor) -> None:
        """Elements [start, start + out.numel()) of parameter `name`'s whole flat values into `out`,
        taken from the ranks whose chunks hold them."""
        stored, offset, chunk = self.where[name]
        done = 0
        while done < out.numel():
            element = start + done
            rank, within = divmod(element, chunk)
            count = min(out.numel() - done, chunk - within)
            out[done:done + count] = self.values(key, rank, stored)[offset + within:offset + within + count]
            done += count


def module_parameters(model_states: dict, path: str) -> SavedTraining:
    """The parameters only, from the model states' `module` (in the model's dtype), for a load of the
    module without optimizer files, as official's load_module_only reads them."""
    zero = (model_states.get("ds_config") or {}).get("zero_optimization") or {}
    saved = SavedTraining(int(zero.get("stage", 0)), int(model_states.get("dp_world_size", 1)))
    for group in model_states["param_shapes"]:
        for name, shape in group.items():
            values = model_states["module"].get(name)
            if values is None or values.numel() != _numel(shape):
                raise CheckpointError(f"{path} holds no whole values of parameter {name} (ZeRO-3 keeps them only in "
                                      f"the *_optim_states.pt files); copy those files beside it, or load the "
                                      f"weights `zero-lab checkpoint consolidate` writes")
            saved.whole[name] = values.detach().float().reshape(-1)
    return saved


def _group_names(param_shapes: list[dict], param_groups: list[dict]) -> list[list[str]]:
    """Each parameter group's names. A file stores one tensor an entry of param_shapes, and each of
    its param_groups lists its tensors (several at official's stage 3: its sub-groups). A file that
    does not say so holds one group an entry."""
    entries = [list(shapes) for shapes in param_shapes]
    owned = [list(group.get("params", [])) for group in param_groups]
    if sorted(index for group in owned for index in group) != list(range(len(entries))):
        return entries
    return [[name for index in group for name in entries[index]] for group in owned]


def _numel(shape) -> int:
    return int(torch.Size(shape).numel())


def _group_tensors(groups: list[torch.Tensor], group_index: int, stage: int) -> torch.Tensor:
    """A rank's stored fp32 tensor of one group (stage 3: every sub-group end to end)."""
    if reshard.cut_of_stage(stage) == reshard.PER_PARAMETER:
        return torch.cat([tensor.detach().reshape(-1).float() for tensor in groups])
    return groups[group_index].detach().reshape(-1).float()  # official saves stage 3's as nn.Parameters


def _group_moments(state: dict, group_index: int, stage: int) -> dict:
    """A rank's Adam state of one group (stage 3: every sub-group's moments end to end)."""
    if reshard.cut_of_stage(stage) != reshard.PER_PARAMETER:
        return state.get(group_index, {})
    ordered = [state[index] for index in sorted(state)]
    if not ordered or any(key not in entry for entry in ordered for key in MOMENTS):
        return {"step": max((float(entry.get("step", 0)) for entry in ordered), default=0)}
    return {"step": max(float(entry["step"]) for entry in ordered),
            **{key: torch.cat([entry[key].reshape(-1).float() for entry in ordered]) for key in MOMENTS}}


def model_shapes(names_in_order: list[list[str]], shapes: dict[str, torch.Size]) -> list[OrderedDict]:
    """param_shapes: per group, name -> shape in the order its partitions hold the parameters."""
    return [OrderedDict((name, torch.Size(shapes[name])) for name in group) for group in names_in_order]
