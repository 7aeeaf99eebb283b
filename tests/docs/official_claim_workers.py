"""Per-rank bodies that run official DeepSpeed 0.19.8 (DS_ACCELERATOR=cpu) to check what the docs say
it does; each returns failure messages (tests.spawn.run_distributed)."""

from __future__ import annotations

import copy

import torch

import zero_lab.nano as nano
from zero_lab.nano.facade.official_config import to_official_config
from tests.nano.official_workers import import_official_deepspeed
from tests.nano.reference import build_model, loss_of, micro_batch
from tests.nano.workers import MICRO_SIZE, nano_config


def official_config(stage: int, precision: str = "fp32", **extra) -> dict:
    """The config official receives for nano's test config (extra keys added after the conversion,
    so official may get what nano refuses)."""
    config = to_official_config(nano_config(stage, precision=precision), device="cpu")
    config.update(copy.deepcopy(extra))
    return config


def optimizer_wrapper(deepspeed, config: dict) -> str:
    model = build_model()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    return type(engine.optimizer).__name__


def optimizer_classes_worker(rank: int, world_size: int) -> list[str]:
    """bf16 at stage 0 runs FP16_UnfusedOptimizer (no flat buffer); BF16_Optimizer runs at stage 1
    only with grad_accum_dtype fp32; plain bf16 at stage 1 runs the ZeRO stage 1/2 optimizer."""
    deepspeed = import_official_deepspeed(world_size)
    cases = [(official_config(0, "bf16"), "FP16_UnfusedOptimizer"),
             (official_config(1, "bf16", data_types={"grad_accum_dtype": "fp32"}), "BF16_Optimizer"),
             (official_config(1, "bf16"), "DeepSpeedZeroOptimizer")]
    failures = []
    for config, expected in cases:
        found = optimizer_wrapper(deepspeed, config)
        if found != expected:
            failures.append(f"stage {config['zero_optimization']['stage']} {config.get('data_types')}: {found}, "
                            f"not {expected}")
    return failures


def trained_parameters(deepspeed, config: dict, rank: int, steps: int = 2) -> list[torch.Tensor]:
    model = build_model(seed=5)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    for step in range(steps):
        loss = loss_of(engine, micro_batch(step, 0, rank, MICRO_SIZE).bfloat16())
        engine.backward(loss)
        engine.step()
    return [parameter.detach().float().clone() for parameter in model.parameters()]


def immediate_grad_update_worker(rank: int, world_size: int) -> list[str]:
    """Official at stage 0 bf16 trains bit for bit the same with bf16.immediate_grad_update true and false."""
    deepspeed = import_official_deepspeed(world_size)
    without = trained_parameters(deepspeed, official_config(0, "bf16"), rank)
    with_key = trained_parameters(deepspeed, official_config(0, "bf16", bf16={"enabled": True,
                                                                           "immediate_grad_update": True}), rank)
    if not all(torch.equal(a, b) for a, b in zip(without, with_key)):
        return ["official stage 0 bf16: immediate_grad_update true changed the training"]
    return []


def fp32_non_finite_outcome(deepspeed, config: dict, rank: int) -> tuple[bool, bool, int]:
    """(step applied, parameters changed, skipped steps) after one fp32 step whose loss is NaN."""
    model = build_model()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        before = [parameter.detach().clone() for parameter in model.parameters()]
    loss = loss_of(engine, micro_batch(0, 0, rank, MICRO_SIZE))
    engine.backward(loss * float("nan"))
    engine.step()
    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        changed = any(not torch.equal(old, new) for old, new in zip(before, model.parameters()))
    return engine.was_step_applied(), changed, engine.skipped_steps


def fp32_non_finite_worker(rank: int, world_size: int) -> list[str]:
    """fp32 and a NaN loss: official applies the step at stage 0 (no wrapper checks it) and skips it
    at stages 1-3; nano skips it at every stage (the documented difference at stage 0)."""
    deepspeed = import_official_deepspeed(world_size)
    failures = []
    for stage in (0, 1, 2, 3):
        theirs = fp32_non_finite_outcome(deepspeed, official_config(stage), rank)
        ours = fp32_non_finite_outcome(nano, nano_config(stage), rank)
        print(f"[non-finite fp32] stage {stage}: (applied, changed, skipped) official {theirs} nano {ours}", flush=True)
        if theirs[1:] != ((True, 0) if stage == 0 else (False, 1)):
            failures.append(f"official stage {stage}: (applied, changed, skipped) {theirs}")
        if ours != (False, False, 1):
            failures.append(f"nano stage {stage}: (applied, changed, skipped) {ours}")
    return failures


def fp32_parameters(deepspeed, config: dict, rank: int, steps: int = 2) -> list[torch.Tensor]:
    model = build_model(seed=7)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    for step in range(steps):
        loss = loss_of(engine, micro_batch(step, 0, rank, MICRO_SIZE))
        engine.backward(loss)
        engine.step()
    return [parameter.detach().clone() for parameter in model.parameters()]


STAGE3_KEYS = {"sub_group_size": 1000, "stage3_prefetch_bucket_size": 10, "stage3_param_persistence_threshold": 1,
               "stage3_model_persistence_threshold": 10, "stage3_max_live_parameters": 10,
               "stage3_max_reuse_distance": 0, "stage3_gather_16bit_weights_on_model_save": True}


def stage3_keys_worker(rank: int, world_size: int) -> list[str]:
    """Below stage 3 official trains bit for bit the same with and without the stage-3 keys."""
    deepspeed = import_official_deepspeed(world_size)
    failures = []
    for stage in (1, 2):
        plain = official_config(stage)
        keyed = copy.deepcopy(plain)
        keyed["zero_optimization"].update(STAGE3_KEYS)
        if not all(torch.equal(a, b) for a, b in zip(fp32_parameters(deepspeed, plain, rank),
                                                      fp32_parameters(deepspeed, keyed, rank))):
            failures.append(f"official stage {stage}: the stage-3 keys changed the training")
    return failures


def load_without_latest_worker(rank: int, world_size: int, directory: str) -> list[str]:
    """Official's load_checkpoint on a directory without `latest` returns (None, None); so does nano's."""
    deepspeed = import_official_deepspeed(world_size)
    failures = []
    for name, module, config in (("official", deepspeed, official_config(2)), ("nano", nano, nano_config(2))):
        model = build_model()
        engine, *_ = module.initialize(model=model, model_parameters=model.parameters(), config=config)
        loaded = engine.load_checkpoint(directory)
        if tuple(loaded) != (None, None):
            failures.append(f"{name}: load_checkpoint without latest returned {loaded!r}")
    return failures


def overlap_comm_default_worker(rank: int, world_size: int) -> list[str]:
    """overlap_comm left out: official's engine and nano's config say true at stage 3, false below."""
    from zero_lab.nano.config import load_config

    deepspeed = import_official_deepspeed(world_size)
    failures = []
    for stage in (2, 3):
        config = official_config(stage)
        del config["zero_optimization"]["overlap_comm"]
        model = build_model()
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        nano_default = load_config(config, world_size=world_size).zero_optimization.overlap_comm
        if (engine.zero_overlap_comm(), nano_default) != (stage == 3, stage == 3):
            failures.append(f"stage {stage}: overlap_comm unset is {engine.zero_overlap_comm()} for official, "
                            f"{nano_default} for nano")
    return failures
