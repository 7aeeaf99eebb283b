"""Per-rank bodies: checkpoints crossing between nano and official DeepSpeed (see
tests/nano/test_checkpoint_interop.py). The model, data and schedule are checkpoint_workers'."""

from __future__ import annotations

import os

import torch

import zero_lab.nano as nano
from tests.nano.checkpoint_workers import (ACCUMULATION, CLIPPING, MICRO_SIZE, SAVED_AT, checkpoint_config,
                                           directory_of, snapshot_any)
from tests.nano.reference import max_difference
from tests.nano.stage3_reference import TokenReference, build_trapnet, decay_groups, token_batch, token_loss
from tests.nano.stage3_workers import compare_whole
from tests.nano.workers import LR, WEIGHT_DECAY

MORE = 2


def initialized(module, config: dict, seed: int):
    """An engine of either implementation (`module` is zero_lab.nano or official deepspeed)."""
    model = build_trapnet(seed)
    engine, *_ = module.initialize(model=model, model_parameters=decay_groups(model, WEIGHT_DECAY), config=config)
    return engine


def losses_of(engine, steps: range, rank: int) -> list[float]:
    """Train `steps` of the global schedule; the loss of every micro-step."""
    losses = []
    for step in steps:
        for micro in range(ACCUMULATION):
            loss = token_loss(engine, token_batch(step, micro, rank, MICRO_SIZE))
            losses.append(loss.item())
            engine.backward(loss)
            engine.step()
    return losses


def nano_to_official_worker(rank: int, world_size: int, root: str, cases: list) -> list[str]:
    """nano saves after SAVED_AT steps and trains MORE; official, built from another seed, loads
    that checkpoint and trains the same MORE steps. Right after the load official holds nano's
    parameters and its loss scale is nano's; every later loss and the final parameters equal nano's
    within 1e-6 in fp32, and within bf16's resolution in bf16. (Official cannot run fp16 on CPU:
    test_checkpoint_files checks the dynamic scaler's object instead.)"""
    from tests.nano.official_workers import import_official_deepspeed
    from zero_lab.nano.facade.official_config import to_official_config
    deepspeed = import_official_deepspeed(world_size)
    failures = []
    for stage, precision in cases:
        label = f"stage {stage} {precision}"
        config = checkpoint_config(stage, precision)
        directory = directory_of(root, stage, f"nano_{precision}")
        saver = initialized(nano, config, 0)
        losses_of(saver, range(SAVED_AT), rank)
        saver.save_checkpoint(directory)
        saved, saved_scale = snapshot_any(saver, nano), saver.current_loss_scale()
        nano_losses = losses_of(saver, range(SAVED_AT, SAVED_AT + MORE), rank)
        nano_final = snapshot_any(saver, nano)
        saver.destroy()
        official = initialized(deepspeed, to_official_config(config, device="cpu"), 1)
        official.load_checkpoint(directory)
        at_load = max_difference(saved, snapshot_any(official, deepspeed))
        official_scale = getattr(official.optimizer.loss_scaler, "cur_scale", None)  # a dict has none
        official_losses = losses_of(official, range(SAVED_AT, SAVED_AT + MORE), rank)
        official_final = snapshot_any(official, deepspeed)
        after = max_difference(nano_final, official_final)
        official.destroy()
        loss_gap = max(abs(mine - theirs) for mine, theirs in zip(nano_losses, official_losses))
        print(f"[nano->official] rank {rank} {label}: at load {at_load:.3g}, losses {loss_gap:.3g}, "
              f"parameters after {MORE} steps {after:.3g}, scale {official_scale} (nano {saved_scale})", flush=True)
        if at_load > 1e-6 or official_scale != saved_scale:
            failures.append(f"{label}: after loading nano's checkpoint official differs by {at_load:.3g}, "
                            f"loss scale {official_scale} against nano's {saved_scale}")
        if precision == "fp32":
            close = loss_gap <= 1e-6 and after <= 1e-6
        else:  # the two engines' bf16 steps round differently even from a common start
            close = all(abs(mine - theirs) <= 2 ** -7 * abs(mine) for mine, theirs in zip(nano_losses, official_losses)) \
                and all(torch.allclose(mine, theirs, rtol=2 ** -7, atol=1e-6)
                        for mine, theirs in zip(nano_final.parameters(), official_final.parameters()))
        if not close:
            failures.append(f"{label}: official resumed from nano's checkpoint: losses differ from nano's by "
                            f"{loss_gap:.3g}, parameters by {after:.3g}")
    return failures


def interop_config(stage: int, sub_group_size: int | None) -> dict:
    """checkpoint_workers' config without a schedule (the reference steps at one LR), and stage 3's
    optimizer sub-groups of `sub_group_size` elements when given."""
    config = checkpoint_config(stage, scheduler=False)
    if sub_group_size is not None:
        config["zero_optimization"]["sub_group_size"] = sub_group_size
    return config


def case_directory(root: str, stage: int, sub_group_size: int | None) -> str:
    return os.path.join(root, f"stage{stage}_sub{sub_group_size or 'default'}")


def engine_module(implementation: str, world_size: int):
    """zero_lab.nano, or official DeepSpeed on CPU."""
    if implementation == "nano":
        return nano
    from tests.nano.official_workers import import_official_deepspeed
    return import_official_deepspeed(world_size)


def engine_config(implementation: str, config: dict) -> dict:
    from zero_lab.nano.facade.official_config import to_official_config
    return config if implementation == "nano" else to_official_config(config, device="cpu")


def trained_against(engine, module, steps: range, rank: int, world_size: int, reference: TokenReference,
                    failures: list, label: str) -> None:
    """Steps of the global schedule, each held to the single-process reference on the global batch."""
    for step in steps:
        losses_of(engine, range(step, step + 1), rank)
        reference.step(step, world_size, ACCUMULATION, MICRO_SIZE)
        compare_whole(engine.module, reference, failures, f"{label} step {step}", step + 1, module.zero)


def save_worker(rank: int, world_size: int, root: str, implementation: str, cases: list, steps: int) -> list[str]:
    """Train `steps` steps at this world size against the reference, then save. With a sub_group_size,
    official's stage 3 must really hold more than one optimizer sub-group per parameter group."""
    module, failures = engine_module(implementation, world_size), []
    for stage, sub_group_size in cases:
        label = f"{implementation} W={world_size} stage {stage} sub-groups {sub_group_size}"
        engine = initialized(module, engine_config(implementation, interop_config(stage, sub_group_size)), 0)
        if implementation == "official" and sub_group_size is not None and len(engine.optimizer.fp16_groups) <= 2:
            failures.append(f"{label}: official holds {len(engine.optimizer.fp16_groups)} sub-groups, not more "
                            f"than its 2 parameter groups; lower sub_group_size")
        trained_against(engine, module, range(steps), rank, world_size,
                        TokenReference(build_trapnet(0), LR, WEIGHT_DECAY, CLIPPING), failures, label)
        engine.save_checkpoint(case_directory(root, stage, sub_group_size))
        engine.destroy()
    return failures


def resume_worker(rank: int, world_size: int, root: str, implementation: str, cases: list, history: list[int],
                  more: int) -> list[str]:
    """Load, into a model built from another seed, a checkpoint saved after the steps of `history`
    (the world size of each step); right after the load and after each of `more` steps at this world
    size, every parameter must equal the reference's that took the same global batches."""
    module, failures = engine_module(implementation, world_size), []
    for stage, sub_group_size in cases:
        label = f"{implementation} resumed at W={world_size} stage {stage} sub-groups {sub_group_size}"
        reference = TokenReference(build_trapnet(0), LR, WEIGHT_DECAY, CLIPPING)
        for step, size in enumerate(history):
            reference.step(step, size, ACCUMULATION, MICRO_SIZE)
        engine = initialized(module, engine_config(implementation, interop_config(stage, sub_group_size)), 1)
        engine.load_checkpoint(case_directory(root, stage, sub_group_size))
        compare_whole(engine.module, reference, failures, f"{label}, at the load", len(history), module.zero)
        trained_against(engine, module, range(len(history), len(history) + more), rank, world_size, reference,
                        failures, label)
        engine.destroy()
    return failures
