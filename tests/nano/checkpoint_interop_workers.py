"""Per-rank bodies: checkpoints crossing between nano and official DeepSpeed (see
tests/nano/test_checkpoint_interop.py). The model, data and schedule are checkpoint_workers'."""

from __future__ import annotations

import torch

import zero_lab.nano as nano
from tests.nano.checkpoint_workers import (ACCUMULATION, MICRO_SIZE, SAVED_AT, checkpoint_config, directory_of,
                                           snapshot_any)
from tests.nano.reference import max_difference
from tests.nano.stage3_reference import build_trapnet, decay_groups, token_batch, token_loss
from tests.nano.workers import WEIGHT_DECAY

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
    from zero_lab.nano.official_config import to_official_config
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
