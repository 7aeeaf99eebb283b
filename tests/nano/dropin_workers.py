"""Per-rank bodies for DeepSpeed's engine calls and config keys that change what a step computes,
each held to the single-process AdamW reference (tests.nano.reference)."""

from __future__ import annotations

import copy

import torch

import zero_lab.nano as nano
from tests.nano.reference import ReferenceTrainer, build_model, loss_of, max_difference, micro_batch
from tests.nano.workers import FP32_TOLERANCE, LR, MICRO_SIZE, STEPS, WEIGHT_DECAY, nano_config, parameter_groups


def _compare(failures: list, label: str, model: torch.nn.Module, reference: ReferenceTrainer) -> None:
    difference = max_difference(model, reference.model)
    if not difference <= FP32_TOLERANCE:
        failures.append(f"{label}: max |nano - reference| = {difference:.3g}")


def manual_boundary_worker(rank: int, world_size: int) -> list[str]:
    """set_gradient_accumulation_boundary(False) for two micro-steps, True for the third, one step():
    the same as three managed micro-steps of accumulation 3."""
    failures = []
    initial = build_model()
    for stage in (0, 1, 2):
        model, reference = copy.deepcopy(initial), ReferenceTrainer(initial, LR, WEIGHT_DECAY, 0.0)
        engine, *_ = nano.initialize(model=model, model_parameters=parameter_groups(model, WEIGHT_DECAY),
                                     config=nano_config(stage, accumulation=3, bucket=7))
        for step in range(STEPS):
            for micro in range(3):
                engine.set_gradient_accumulation_boundary(micro == 2)
                engine.backward(loss_of(engine, micro_batch(step, micro, rank, MICRO_SIZE)))
            engine.step()
            reference.step(step, world_size, 3, MICRO_SIZE)
            _compare(failures, f"stage {stage} step {step}", model, reference)
        if engine.global_steps != STEPS:
            failures.append(f"stage {stage}: {engine.global_steps} global steps, not {STEPS}")
    return failures


def no_sync_worker(rank: int, world_size: int) -> list[str]:
    """A backward inside no_sync() and one outside, then step(): the gradients of both micro-batches
    add up before the one reduction (accumulation 1: the loss is not divided)."""
    failures = []
    initial = build_model()
    for stage in (0, 1):
        model, reference = copy.deepcopy(initial), ReferenceTrainer(initial, LR, WEIGHT_DECAY, 0.0)
        engine, *_ = nano.initialize(model=model, model_parameters=parameter_groups(model, WEIGHT_DECAY),
                                     config=nano_config(stage, bucket=7))
        for step in range(STEPS):
            before = engine.comm_stats()
            with engine.no_sync():
                engine.backward(loss_of(engine, micro_batch(step, 0, rank, MICRO_SIZE)))
            if engine.comm_stats() != before:
                failures.append(f"stage {stage}: no_sync's backward communicated")
            engine.backward(loss_of(engine, micro_batch(step, 1, rank, MICRO_SIZE)))
            engine.step()
            reference.step(step, world_size, 2, MICRO_SIZE, loss_factor=2.0)
            _compare(failures, f"stage {stage} step {step}", model, reference)
    return failures


def gradient_sum_worker(rank: int, world_size: int) -> list[str]:
    """gradient_allreduce_op "sum": gradients are added over ranks, not averaged."""
    failures = []
    initial = build_model()
    for stage in (0, 1, 2):
        model, reference = copy.deepcopy(initial), ReferenceTrainer(initial, LR, WEIGHT_DECAY, 0.0)
        engine, *_ = nano.initialize(model=model, model_parameters=parameter_groups(model, WEIGHT_DECAY),
                                     config=nano_config(stage, bucket=9, gradient_allreduce_op="sum"))
        for step in range(STEPS):
            engine.backward(loss_of(engine, micro_batch(step, 0, rank, MICRO_SIZE)))
            engine.step()
            reference.step(step, world_size, 1, MICRO_SIZE, loss_factor=float(world_size))
            _compare(failures, f"stage {stage} step {step}", model, reference)
    return failures


def non_finite_step_outcome(deepspeed, config: dict, rank: int) -> tuple[bool, bool, int]:
    """(step applied, parameters changed, skipped steps) after one bf16 step whose loss is NaN on
    rank 0, for either engine module (nano or official DeepSpeed)."""
    model = build_model()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        before = [parameter.detach().clone() for parameter in model.parameters()]
    loss = loss_of(engine, micro_batch(0, 0, rank, MICRO_SIZE).bfloat16())
    engine.backward(loss * float("nan") if rank == 0 else loss)
    engine.step()
    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        changed = any(not torch.equal(old, new) for old, new in zip(before, model.parameters()))
    return engine.was_step_applied(), changed, engine.skipped_steps


def bf16_overflow_config(stage: int, check: bool) -> dict:
    return nano_config(stage, precision="bf16", bucket=9, bf16={"enabled": True, "check_grad_overflow": check})


def bf16_overflow_check_worker(rank: int, world_size: int) -> list[str]:
    """bf16 with check_grad_overflow false applies a step whose gradients hold a NaN at stages 1
    and 2 (official DeepSpeed's stage 1/2 optimizer); stages 0 and 3 skip it, as official's do;
    with the default every stage skips it on every rank."""
    failures = []
    for stage in (0, 1, 2, 3):
        for check in (True, False):
            applies = not check and stage in (1, 2)
            outcome = non_finite_step_outcome(nano, bf16_overflow_config(stage, check), rank)
            if outcome != (applies, applies, int(not applies)):
                failures.append(f"stage {stage} check_grad_overflow={check}: (applied, changed, skipped) = {outcome}")
    return failures


def aligned_partitions_worker(rank: int, world_size: int) -> list[str]:
    """A 66-element bf16 group: every rank's partition starts 4-byte aligned (official DeepSpeed
    pads groups to a multiple of 2 x world size for NCCL)."""
    failures = []
    for stage in (1, 2):
        torch.manual_seed(0)
        model = torch.nn.Linear(5, 11)  # 55 + 11 = 66 elements, one group
        engine, *_ = nano.initialize(model=model, config=nano_config(stage, precision="bf16"))
        for buffer in engine.optimizer.buffers:
            start = buffer.partition.data_ptr()
            if start % 4 or buffer.full.numel() % (2 * world_size):
                failures.append(f"stage {stage} rank {rank}: partition at byte offset "
                                f"{start - buffer.full.data_ptr()}, buffer of {buffer.full.numel()} elements")
    return failures
