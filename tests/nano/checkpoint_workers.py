"""Per-rank bodies for checkpoints: exact resume, another world size, official's files and tools.

Every case trains TrapNet (a tied embedding and head, a block called twice, a spare block) with
two parameter groups, gradient accumulation 2, clipping and a WarmupLR schedule, so a checkpoint
must carry partitions cut through parameters, Adam's moments and steps, the schedule, the loss
scaler and the engine's counters.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import torch

import zero_lab.nano as nano
from zero_lab.nano import stages
from zero_lab.nano.checkpoint import files as checkpoint_files
from tests.nano.reference import max_difference
from tests.nano.stage3_reference import TokenReference, build_trapnet, decay_groups, token_batch, token_loss
from tests.nano.stage3_workers import compare_whole
from tests.nano.workers import LR, WEIGHT_DECAY, nano_config

MICRO_SIZE, ACCUMULATION, CLIPPING = 2, 2, 0.5
SAVED_AT, MORE = 3, 3
RESUME_CASES = [(stage, precision) for stage in (0, 1, 2, 3) for precision in ("fp32", "bf16")] + \
               [(2, "fp16"), (3, "fp16")]


def checkpoint_config(stage: int, precision: str = "fp32", scheduler: bool = True) -> dict:
    """fp16 starts at a scale that overflows, with a short window, so the scaler moves both ways."""
    extra = {"fp16": {"initial_scale_power": 17, "loss_scale_window": 2}} if precision == "fp16" else {}
    if scheduler:
        extra["scheduler"] = {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": LR,
                                                             "warmup_num_steps": 4, "warmup_type": "linear"}}
    config = nano_config(stage, accumulation=ACCUMULATION, clipping=CLIPPING, precision=precision, **extra)
    if stage == 3:
        config["zero_optimization"].update(stage3_param_persistence_threshold=10, stage3_max_reuse_distance=0)
    return config


def start(config: dict, seed: int = 0):
    model = build_trapnet(seed)
    engine, *_ = nano.initialize(model=model, model_parameters=decay_groups(model, WEIGHT_DECAY), config=config)
    return engine


def train(engine, steps: range, rank: int, world_size: int = 0, reference: TokenReference | None = None,
          failures: list | None = None, label: str = "") -> None:
    """Steps `steps` of the global schedule; with a reference, compare after each."""
    for step in steps:
        for micro in range(ACCUMULATION):
            engine.backward(token_loss(engine, token_batch(step, micro, rank, MICRO_SIZE)))
            engine.step()
        if reference is not None:
            reference.step(step, world_size, ACCUMULATION, MICRO_SIZE)
            compare_whole(engine.module, reference, failures, f"{label} step {step}", step + 1)


def snapshot(engine) -> dict[str, torch.Tensor]:
    """Every parameter whole, as a user reads it."""
    with nano.zero.GatheredParameters(list(engine.module.parameters())):
        return {name: parameter.detach().clone() for name, parameter in engine.module.named_parameters()}


def counters(engine) -> tuple:
    return (engine.global_steps, engine.global_samples, engine.skipped_steps, engine.current_loss_scale(),
            engine.get_lr(), engine.lr_scheduler.state_dict())


def directory_of(root: str, stage: int, precision: str) -> str:
    return os.path.join(root, f"stage{stage}_{precision}")


def save_worker(rank: int, world_size: int, root: str, cases: list) -> list[str]:
    """Train SAVED_AT steps of each case and save, with a client_state to carry."""
    for stage, precision in cases:
        engine = start(checkpoint_config(stage, precision))
        train(engine, range(SAVED_AT), rank)
        engine.save_checkpoint(directory_of(root, stage, precision), client_state={"epoch": 7, "counters":
                                                                                 list(counters(engine)[:3])})
        engine.destroy()
    return []


def resume_worker(rank: int, world_size: int, root: str, cases: list) -> list[str]:
    """In fresh processes, from a model initialized differently: load, train MORE steps; every
    parameter must equal an uninterrupted run's bit for bit, and so must every counter."""
    failures = []
    for stage, precision in cases:
        label = f"stage {stage} {precision}"
        straight = start(checkpoint_config(stage, precision))
        train(straight, range(SAVED_AT + MORE), rank)
        resumed = start(checkpoint_config(stage, precision), seed=1)
        with files_read() as read:
            path, client_state = resumed.load_checkpoint(directory_of(root, stage, precision))
        optimizer_files = [name for name in read if name.endswith("_optim_states.pt")]
        if stages.of(stage).partitions_optimizer_states and stages.of(stage).checkpoint.cut == stages.FLAT \
                and optimizer_files != [checkpoint_files.optim_states_name(precision, rank)]:
            failures.append(f"{label}: at the saved world size rank {rank} read {optimizer_files}, not only its own")
        if path is None or client_state.get("epoch") != 7:
            failures.append(f"{label}: load_checkpoint returned ({path}, {client_state})")
        elif list(counters(resumed)[:3]) != client_state["counters"]:
            failures.append(f"{label}: counters after load {counters(resumed)[:3]}, saved {client_state['counters']}")
        train(resumed, range(SAVED_AT, SAVED_AT + MORE), rank)
        expected, got = snapshot(straight), snapshot(resumed)
        unequal = [name for name in expected if not torch.equal(expected[name], got[name])]
        if unequal:
            worst = max((expected[name].float() - got[name].float()).abs().max().item() for name in unequal)
            failures.append(f"{label}: {unequal[0]} (and {len(unequal) - 1} more) differ from the uninterrupted "
                            f"run, by up to {worst:.3g}")
        if counters(straight) != counters(resumed):
            failures.append(f"{label}: counters {counters(resumed)}, uninterrupted {counters(straight)}")
        if precision == "fp16" and straight.skipped_steps == 0:
            failures.append(f"{label}: no step was skipped, so the loss scaler's state went untested")
        straight.destroy()
        resumed.destroy()
    return failures


@contextmanager
def files_read():
    """The names of the checkpoint files read inside the block, in order."""
    read, original = [], checkpoint_files.read_file

    def recorded(path: str) -> dict:
        read.append(os.path.basename(path))
        return original(path)
    checkpoint_files.read_file = recorded
    try:
        yield read
    finally:
        checkpoint_files.read_file = original


def reshard_save_worker(rank: int, world_size: int, root: str, stages: list[int], steps: int) -> list[str]:
    """Train `steps` steps at this world size against the global-batch reference, then save."""
    failures = []
    for stage in stages:
        engine = start(checkpoint_config(stage, scheduler=False))
        train(engine, range(steps), rank, world_size, TokenReference(build_trapnet(0), LR, WEIGHT_DECAY, CLIPPING),
              failures, f"W={world_size} stage {stage}")
        engine.save_checkpoint(directory_of(root, stage, "fp32"))
        engine.destroy()
    return failures


def reshard_resume_worker(rank: int, world_size: int, root: str, stages: list[int], history: list[int],
                          more: int) -> list[str]:
    """Load a checkpoint saved after steps run at the world sizes in `history` (one entry a step),
    train `more` steps at this world size, and hold every step to the reference that took the same
    global batches; then save again, for the next hop."""
    failures = []
    for stage in stages:
        reference = TokenReference(build_trapnet(0), LR, WEIGHT_DECAY, CLIPPING)
        for step, size in enumerate(history):
            reference.step(step, size, ACCUMULATION, MICRO_SIZE)
        engine = start(checkpoint_config(stage, scheduler=False), seed=1)
        engine.load_checkpoint(directory_of(root, stage, "fp32"))
        compare_whole(engine.module, reference, failures, f"stage {stage} loaded at W={world_size}", len(history))
        train(engine, range(len(history), len(history) + more), rank, world_size, reference, failures,
              f"stage {stage} resumed at W={world_size}")
        engine.save_checkpoint(directory_of(root, stage, "fp32"))
        engine.destroy()
    return failures


def whole_masters(engine) -> dict[str, torch.Tensor]:
    """nano's fp32 master values of every trainable parameter, gathered here without the checkpoint
    code: each buffer's master partitions all-gathered and cut at the layout's offsets."""
    optimizer, values = engine.optimizer, {}
    for buffer, master in zip(optimizer.buffers, optimizer.master_partitions):
        layout = buffer.layout
        full = torch.empty(layout.padded_numel)
        optimizer.collectives.all_gather_into_tensor(full, master.detach().float().contiguous()) \
            if layout.partition_count > 1 else full.copy_(master.detach().float())
        for parameter, offset, numel in zip(buffer.parameters, layout.offsets, layout.parameter_numels):
            values[optimizer.parameter_names[parameter]] = full[offset:offset + numel].view(parameter.shape)
    return values


def zero_to_fp32_worker(rank: int, world_size: int, root: str) -> list[str]:
    """Official DeepSpeed's get_fp32_state_dict_from_zero_checkpoint reads nano's checkpoints of
    stages 1-3, fp32 and bf16, and returns exactly nano's fp32 master values (tied names too)."""
    from tests.nano.official_workers import import_official_deepspeed
    import_official_deepspeed(world_size)
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    failures = []
    for stage in (1, 2, 3):
        for precision in ("fp32", "bf16"):
            engine = start(checkpoint_config(stage, precision))
            train(engine, range(2), rank)
            directory = directory_of(root, stage, precision)
            engine.save_checkpoint(directory)
            expected = whole_masters(engine)
            if rank == 0:
                read = get_fp32_state_dict_from_zero_checkpoint(directory)
                if "head.weight" not in read or not torch.equal(read["head.weight"], read["embed.weight"]):
                    failures.append(f"stage {stage} {precision}: the tied head.weight is not embed.weight's values")
                unequal = [name for name, values in expected.items() if not torch.equal(read.get(name), values)]
                if unequal:
                    failures.append(f"stage {stage} {precision}: zero_to_fp32's {unequal[0]} differs from nano's "
                                    f"fp32 master ({len(unequal)} parameters differ)")
            engine.destroy()
    return failures


def official_cross_load_worker(rank: int, world_size: int, root: str) -> list[str]:
    """Official DeepSpeed saves at step 3; official and nano both resume it and train two more
    steps. Right after the load their parameters agree within 1e-6, and after two steps too in
    fp32 (stages 1-3). In bf16 the two engines' own steps round differently (they differ by bf16
    ulps from a common start without any checkpoint), so after two steps bf16 is held to bf16's
    resolution instead."""
    from tests.nano.official_workers import import_official_deepspeed
    from zero_lab.nano.facade.official_config import to_official_config
    deepspeed = import_official_deepspeed(world_size)
    failures = []
    for stage, precision in ((1, "fp32"), (2, "fp32"), (3, "fp32"), (2, "bf16")):
        config = checkpoint_config(stage, precision)
        official_config = to_official_config(config, device="cpu")
        directory = directory_of(root, stage, f"official_{precision}")
        model = build_trapnet(0)
        saver, *_ = deepspeed.initialize(model=model, model_parameters=decay_groups(model, WEIGHT_DECAY),
                                         config=official_config)
        train(saver, range(SAVED_AT), rank)
        saver.save_checkpoint(directory)
        saver.destroy()
        loaded, finals = {}, {}
        for name, module, options in (("official", deepspeed, official_config), ("nano", nano, config)):
            model = build_trapnet(1)
            engine, *_ = module.initialize(model=model, model_parameters=decay_groups(model, WEIGHT_DECAY),
                                           config=options)
            engine.load_checkpoint(directory)
            loaded[name] = snapshot_any(engine, module)
            train(engine, range(SAVED_AT, SAVED_AT + 2), rank)
            finals[name] = snapshot_any(engine, module)
            engine.destroy()
        at_load, after = max_difference(loaded["official"], loaded["nano"]), max_difference(finals["official"],
                                                                                             finals["nano"])
        print(f"[cross-load] rank {rank} stage {stage} {precision} max |official - nano| at load {at_load:.3g}, "
              f"after two steps {after:.3g}", flush=True)
        close = after <= 1e-6 if precision == "fp32" else all(
            torch.allclose(mine, theirs, rtol=2 ** -7, atol=1e-6)
            for mine, theirs in zip(finals["nano"].parameters(), finals["official"].parameters()))
        if not at_load <= 1e-6 or not close:
            failures.append(f"stage {stage} {precision}: from official's checkpoint nano and official differ by "
                            f"{at_load:.3g} at load and {after:.3g} after two steps")
    return failures


def snapshot_any(engine, module) -> torch.nn.Module:
    """A whole copy of the engine's module, with either implementation's GatheredParameters."""
    import copy
    with module.zero.GatheredParameters(list(engine.module.parameters())):
        return copy.deepcopy(engine.module).float()


def killed_mid_save_worker(rank: int, world_size: int, root: str) -> list[str]:
    """Save global_step1 whole; during global_step2 the job is killed as torchrun kills it when
    one rank dies: rank 1 by SIGKILL halfway through writing its optimizer file, rank 0 by SIGKILL
    once it has written all of its own files, before the rename."""
    import signal
    engine = start(checkpoint_config(2, scheduler=False))
    train(engine, range(1), rank)
    engine.save_checkpoint(root)
    train(engine, range(1, 2), rank)
    write_whole = checkpoint_files.write_file

    def killed_while_writing(state, path):
        if rank == 1:
            with open(f"{path}.tmp{os.getpid()}", "wb") as handle:
                handle.write(b"PK\x03\x04 half of a zip archive")
        else:
            write_whole(state, path)
            if not path.endswith("_optim_states.pt"):
                return 0
        os.kill(os.getpid(), signal.SIGKILL)
    checkpoint_files.write_file = killed_while_writing
    engine.save_checkpoint(root)
    return [f"rank {rank} survived its SIGKILL"]


def resume_after_kill_worker(rank: int, world_size: int, root: str) -> list[str]:
    """After the killed save: `latest` still names global_step1, which loads; saving global_step2
    again replaces the partial directory."""
    failures = []
    engine = start(checkpoint_config(2, scheduler=False), seed=1)
    path, _ = engine.load_checkpoint(root)
    if path is None or engine.global_steps != 1 or "global_step1" not in path:
        failures.append(f"after the killed save, load_checkpoint gave {path} at step {engine.global_steps}")
    train(engine, range(1, 2), rank)
    engine.save_checkpoint(root)
    if os.path.exists(checkpoint_files.partial_directory(root, "global_step2")):
        failures.append("the partial directory of the killed save is still there after a complete save")
    return failures
