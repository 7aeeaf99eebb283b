"""Per-rank bodies that train the same model, data and seed with nano and with official DeepSpeed."""

from __future__ import annotations

import copy
import os
import sys

import torch

import zero_lab.nano as nano
from zero_lab.nano.facade.official_config import to_official_config
from tests.nano.reference import build_model, loss_of, max_difference, micro_batch, parameter_groups
from tests.nano.workers import MICRO_SIZE, WEIGHT_DECAY, nano_config

STEPS = 5


def import_official_deepspeed(world_size: int):
    """DeepSpeed on CPU: the CPU accelerator, and no JIT build of the shared-memory op training never uses."""
    os.environ.update(DS_ACCELERATOR="cpu", LOCAL_SIZE=str(world_size))
    import deepspeed
    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo")
    return deepspeed


def _losses_and_models(module, initial, config, rank, grouped=True, bf16=False):
    """Per-micro-step losses, the model after every step, and the engine; `grouped` hands the engine
    two parameter groups with explicit weight decay, else model.parameters() (the config decides);
    `bf16` feeds bf16 inputs to the bf16 module."""
    model = copy.deepcopy(initial)
    parameters = parameter_groups(model, WEIGHT_DECAY) if grouped else model.parameters()
    engine, *_ = module.initialize(model=model, model_parameters=parameters, config=config)
    losses, snapshots = [], []
    for step in range(STEPS):
        for micro in range(config["gradient_accumulation_steps"]):
            inputs = micro_batch(step, micro, rank, MICRO_SIZE)
            loss = loss_of(engine, inputs.to(torch.bfloat16) if bf16 else inputs)
            losses.append(loss.item())
            engine.backward(loss)
            engine.step()
        snapshots.append(copy.deepcopy(engine.module))
    return losses, snapshots, engine


def without_weight_decay(config: dict) -> dict:
    """The config with weight_decay left to each engine's default (DeepSpeed's: 0)."""
    config = copy.deepcopy(config)
    del config["optimizer"]["params"]["weight_decay"]
    return config


def official_parity_worker(rank: int, world_size: int) -> list[str]:
    """Stages 1 and 2 (both reduce-scatter settings, accumulation and clipping on), and stage 2 with
    weight_decay left out: per-step losses and parameters of nano and official DeepSpeed agree within
    1e-5, and every rank's fp32 partition has the length of official's."""
    deepspeed = import_official_deepspeed(world_size)
    failures = []
    initial = build_model(seed=3)
    cases = [(stage, reduce_scatter, True) for stage in (1, 2) for reduce_scatter in (True, False)] + [(2, True, False)]
    for stage, reduce_scatter, grouped in cases:
        config = nano_config(stage, accumulation=2, clipping=0.5, reduce_scatter=reduce_scatter, bucket=64)
        if not grouped:
            config = without_weight_decay(config)
        nano_losses, nano_models, nano_engine = _losses_and_models(nano, initial, config, rank, grouped)
        official_losses, official_models, official_engine = _losses_and_models(
            deepspeed, initial, to_official_config(config, device="cpu"), rank, grouped)
        ours = [buffer.layout.partition_numel for buffer in nano_engine.optimizer.buffers]
        theirs = [partition.numel() for partition in official_engine.optimizer.single_partition_of_fp32_groups]
        if ours != theirs:
            failures.append(f"stage {stage}: partitions of {ours} elements, official's of {theirs}")
        worst_loss = max(abs(a - b) for a, b in zip(nano_losses, official_losses))
        worst_parameter = max(max_difference(a, b) for a, b in zip(nano_models, official_models))
        if worst_loss > 1e-5 or worst_parameter > 1e-5:
            failures.append(f"stage {stage} reduce_scatter={reduce_scatter} grouped={grouped}: max loss delta "
                            f"{worst_loss:.3g}, max parameter delta {worst_parameter:.3g}")
        print(f"[parity] rank {rank} stage {stage} reduce_scatter={reduce_scatter} grouped={grouped} "
              f"max_loss_delta={worst_loss:.3g} max_param_delta={worst_parameter:.3g}", flush=True)
    return failures


def official_stage3_worker(rank: int, world_size: int) -> list[str]:
    """Stage 3 on TrapNet (tied weights, a block called twice, an unused block; accumulation 2,
    clipping): per-step losses and the gathered parameters of nano and official agree within 1e-5
    (measured: bit for bit at two ranks)."""
    from tests.nano.stage3_reference import build_trapnet, decay_groups, token_batch, token_loss
    from tests.nano.stage3_workers import stage3_config

    deepspeed = import_official_deepspeed(world_size)
    config = stage3_config(accumulation=2, clipping=0.5, bucket=64)
    initial = build_trapnet()
    results = {}
    for name, module, received, gather in (
            ("nano", nano, config, nano.zero.GatheredParameters),
            ("official", deepspeed, to_official_config(config, device="cpu"), deepspeed.zero.GatheredParameters)):
        model = copy.deepcopy(initial)
        engine, *_ = module.initialize(model=model, model_parameters=decay_groups(model, WEIGHT_DECAY), config=received)
        losses = []
        for step in range(STEPS):
            for micro in range(2):
                loss = token_loss(engine, token_batch(step, micro, rank, MICRO_SIZE))
                losses.append(loss.item())
                engine.backward(loss)
                engine.step()
        with gather(list(model.parameters())):
            results[name] = (losses, [parameter.detach().float().clone() for parameter in model.parameters()])
    (nano_losses, nano_parameters), (official_losses, official_parameters) = results["nano"], results["official"]
    worst_loss = max(abs(a - b) for a, b in zip(nano_losses, official_losses))
    worst_parameter = max((a - b).abs().max().item() for a, b in zip(nano_parameters, official_parameters))
    print(f"[parity] rank {rank} stage 3 max_loss_delta={worst_loss:.3g} max_param_delta={worst_parameter:.3g}", flush=True)
    if worst_loss > 1e-5 or worst_parameter > 1e-5:
        return [f"stage 3: max loss delta {worst_loss:.3g}, max parameter delta {worst_parameter:.3g}"]
    return []


def non_finite_steps_worker(rank: int, world_size: int) -> list[str]:
    """bf16 and a NaN loss, at stages 0-3 with check_grad_overflow true and false: nano's step is
    applied or skipped, moves the parameters or not, and counts a skipped step exactly as
    official DeepSpeed's does."""
    from tests.nano.dropin_workers import bf16_overflow_config, non_finite_step_outcome

    deepspeed = import_official_deepspeed(world_size)
    failures = []
    for stage in (0, 1, 2, 3):
        for check in (True, False):
            config = bf16_overflow_config(stage, check)
            ours = non_finite_step_outcome(nano, config, rank)
            theirs = non_finite_step_outcome(deepspeed, to_official_config(config, device="cpu"), rank)
            print(f"[non-finite] stage {stage} check_grad_overflow={check}: (applied, changed, skipped) "
                  f"nano {ours} official {theirs}", flush=True)
            if ours != theirs:
                failures.append(f"stage {stage} check_grad_overflow={check}: (applied, changed, skipped) nano {ours}, "
                                f"official {theirs}")
    return failures


def stage0_bf16_worker(rank: int, world_size: int) -> list[str]:
    """Stage 0 in bf16 (accumulation 2, clipping), with bf16.immediate_grad_update false and true:
    official DeepSpeed ignores the key there (its stage-0 bf16 optimizer, FP16_UnfusedOptimizer,
    never reads it), and so does nano: each engine's losses and parameters are the same with either
    value. The two engines do not train alike at stage 0 bf16, for another reason this pins down:
    official's FP16_UnfusedOptimizer steps its Adam once with zero gradients while it is built, so
    Adam's step count is 1 before training (bias correction one step ahead, weight decay applied
    once); nano's Adam starts at 0 (docs/nano.md, "Where nano differs")."""
    deepspeed = import_official_deepspeed(world_size)
    failures, losses_of = [], {}
    initial = build_model(seed=3)
    for name, module in (("nano", nano), ("official", deepspeed)):
        runs = {}
        for immediate in (False, True):
            config = nano_config(0, accumulation=2, clipping=0.5, bucket=64, precision="bf16")
            config["bf16"]["immediate_grad_update"] = immediate
            received = config if module is nano else to_official_config(config, device="cpu")
            runs[immediate] = _losses_and_models(module, initial, received, rank, bf16=True)
        (off_losses, off_models, _), (on_losses, on_models, engine) = runs[False], runs[True]
        parameter_delta = max(max_difference(a, b) for a, b in zip(off_models, on_models))
        print(f"[stage0-bf16] rank {rank} {name}: immediate_grad_update true vs false: losses equal "
              f"{off_losses == on_losses}, max parameter delta {parameter_delta:.3g}", flush=True)
        if off_losses != on_losses or parameter_delta:
            failures.append(f"{name}'s stage 0 bf16 trains differently with immediate_grad_update true")
        if name == "official":
            model = copy.deepcopy(initial)
            fresh, *_ = deepspeed.initialize(model=model, model_parameters=parameter_groups(model, WEIGHT_DECAY),
                                             config=received)
            counts = {int(state["step"]) for state in fresh.optimizer.optimizer.state.values()}
            if type(fresh.optimizer).__name__ != "FP16_UnfusedOptimizer" or counts != {1}:
                failures.append(f"official's stage 0 bf16 runs {type(fresh.optimizer).__name__}, Adam step counts "
                                f"{counts} before training (docs/nano.md says FP16_UnfusedOptimizer, 1)")
        losses_of[name] = off_losses
    loss_delta = max(abs(a - b) for a, b in zip(losses_of["nano"], losses_of["official"]))
    print(f"[stage0-bf16] rank {rank} nano vs official (Adam one step apart): max loss delta {loss_delta:.3g}",
          flush=True)
    return failures
