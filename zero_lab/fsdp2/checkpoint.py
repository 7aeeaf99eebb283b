"""FSDP2's checkpoints: torch.distributed.checkpoint (DCP), sharded as FSDP2 holds the model.

A DCP checkpoint is a directory: `.metadata` (every entry's global shape and where its chunks lie)
and one `__<rank>_0.distcp` file per saving rank holding that rank's shards. DCP reshards on load,
so a checkpoint saved by N ranks loads on M. The directory layout beside it is DeepSpeed's, so the
harness's `--save-dir`/`--resume` read the same way for every impl:
    <dir>/latest              the last complete tag, one line (written last)
    <dir>/<tag>/.metadata     DCP's index
    <dir>/<tag>/__<r>_0.distcp
The state saved, as DCP flattens it into dotted keys (the names `checkpoint convert --to dcp` writes):
    model.<name>                                  each parameter, fp32, FSDP2's sharded DTensor
    optimizer.state.<name>.{step,exp_avg,exp_avg_sq}     Adam's state per parameter
    optimizer.param_groups.<g>.{lr,betas,...,params}     each group's hyper-parameters and names
    train_state.{global_steps,global_samples,skipped_steps}, train_state.lr_scheduler.<key>
A save:
    Phase 1: rank 0 empties `<dir>/.<tag>.partial`; every rank writes its shards there (dcp.save).
    Phase 2: after a barrier, rank 0 renames it to `<dir>/<tag>` and then writes `latest`.
A load:
    Phase 1: the module's and optimizer's own sharded state dicts (torch's `get_state_dict`, which
             creates Adam's state when no step has run yet) are the template DCP fills in place.
    Phase 2: dcp.load reads this rank's shards of every entry; `set_state_dict` puts them in the
             module and the optimizer (the groups' hyper-parameters from the checkpoint, the
             optimizer's implementation flags, such as `fused`, from this run); the schedule and the
             counters follow.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from zero_lab.nano.checkpoint import files
from zero_lab.nano.errors import CheckpointError

MODEL, OPTIMIZER, TRAIN_STATE = "model", "optimizer", "train_state"
METADATA = ".metadata"
COUNTERS = ("global_steps", "global_samples", "skipped_steps")
# How this run's torch optimizer steps, not what it learned: kept from the run, not the checkpoint
# (a checkpoint another engine wrote names its own choices, or torch's defaults).
IMPLEMENTATION = ("foreach", "fused", "capturable", "differentiable", "maximize")


def is_dcp_directory(path: str) -> bool:
    return os.path.isfile(os.path.join(path, METADATA))


def train_state(engine) -> dict:
    """The counters and the schedule's state, as plain numbers."""
    state = {name: int(getattr(engine, name)) for name in COUNTERS}
    if engine.lr_scheduler is not None:
        state["lr_scheduler"] = dict(engine.lr_scheduler.state_dict())
    return state


def save(engine, save_dir: str, tag: str | None = None, save_latest: bool = True) -> str:
    """Every rank calls it; returns the tag's directory. `save_latest=False` (DeepSpeed's keyword)
    leaves `latest` to the caller (the harness moves it once every rank is past a barrier:
    `workload/restarts.commit_latest`)."""
    tag = tag or f"global_step{engine.global_steps}"
    rank = dist.get_rank()
    # Phase 1
    if rank == 0:
        os.makedirs(save_dir, exist_ok=True)
        files.start_directory(save_dir, tag)
    dist.barrier()
    model_state, optimizer_state = get_state_dict(engine.module, engine.optimizer)
    dcp.save({MODEL: model_state, OPTIMIZER: optimizer_state, TRAIN_STATE: train_state(engine)},
             checkpoint_id=files.partial_directory(save_dir, tag))
    # Phase 2
    files.publish(save_dir, tag, rank, save_latest, dist.barrier)
    return os.path.join(save_dir, tag)


def load(engine, load_dir: str, tag: str | None = None) -> tuple[str | None, dict | None]:
    """(path of the tag, {}) after loading, or (None, None) when `load_dir` has no `latest`."""
    resolved = files.resolve_tag(load_dir, tag)
    if resolved is None:
        return None, None
    directory = os.path.join(load_dir, resolved)
    if not is_dcp_directory(directory):
        raise CheckpointError(f"{directory} holds no DCP checkpoint ({METADATA} is missing); --impl fsdp2 resumes "
                              f"what fsdp2 saved or `zero-lab checkpoint convert SRC --to dcp OUT` wrote")
    # Phase 1
    model_state, optimizer_state = get_state_dict(engine.module, engine.optimizer)
    state = {MODEL: model_state, OPTIMIZER: optimizer_state, TRAIN_STATE: train_state(engine)}
    # Phase 2
    try:
        dcp.load(state, checkpoint_id=directory)
    except Exception as error:  # DCP wraps every rank's failure in one CheckpointException
        reason = str(error).strip().splitlines()[-1][:200] if str(error).strip() else type(error).__name__
        raise CheckpointError(f"{directory} cannot be loaded by this model ({reason}); resume a checkpoint of "
                              f"the same model, or convert it again") from None
    for loaded, own in zip(state[OPTIMIZER]["param_groups"], engine.optimizer.param_groups):
        loaded.update({key: own[key] for key in IMPLEMENTATION if key in own})
    set_state_dict(engine.module, engine.optimizer, model_state_dict=state[MODEL],
                   optim_state_dict=state[OPTIMIZER])
    counters = state[TRAIN_STATE]
    for name in COUNTERS:
        setattr(engine, name, int(counters[name]))
    engine.micro_steps = engine.global_steps * engine.plan.gradient_accumulation_steps
    if engine.lr_scheduler is not None and "lr_scheduler" in counters:
        engine.lr_scheduler.load_state_dict(counters["lr_scheduler"])
    return directory, {}

