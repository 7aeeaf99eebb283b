"""Per-rank test bodies, run by tests.spawn.run_distributed; each returns failure messages."""

from __future__ import annotations

import copy
import gc
import itertools

import torch

import zero_lab.nano as nano
from zero_lab.nano.memory.memory_formula import model_state_bytes
from zero_lab.workload.meters.memory_meter import LiveStorageTracker
from tests.backend_holding import backend_holding_collective_tensors
from tests.tolerances import ADAM_EPS, adam_parity_bound
from tests.nano.reference import (ReferenceTrainer, build_model, loss_of, max_difference, micro_batch,
                                  parameter_groups)

LR, WEIGHT_DECAY, MICRO_SIZE, STEPS = 1e-2, 0.1, 2, 3
FP32_TOLERANCE = adam_parity_bound(LR, STEPS)  # tests/tolerances.py: 3.7e-6


def nano_config(stage: int, accumulation: int = 1, clipping: float = 0.0, reduce_scatter: bool = True,
                overlap: bool = False, bucket: int = 500_000_000, gather_bucket: int = 500_000_000,
                precision: str = "fp32", ignore_unused: bool = True, **extra) -> dict:
    config = {
        "train_micro_batch_size_per_gpu": MICRO_SIZE, "gradient_accumulation_steps": accumulation,
        "gradient_clipping": clipping, "steps_per_print": 10_000,
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "eps": ADAM_EPS, "weight_decay": WEIGHT_DECAY}},
        "zero_optimization": {"stage": stage, "reduce_scatter": reduce_scatter, "overlap_comm": overlap,
                              "reduce_bucket_size": bucket, "allgather_bucket_size": gather_bucket,
                              "ignore_unused_parameters": ignore_unused},
    }
    if precision == "bf16":
        config["bf16"] = {"enabled": True}
    if precision == "fp16":
        config["fp16"] = {"enabled": True, **extra.pop("fp16", {})}
    config.update(extra)
    return config


def parity_cases() -> list[dict]:
    """Every stage x accumulation 1/3 x clipping off/on x reduce-scatter paths x overlap x bucket sizes (80)."""
    cases = []
    for stage, accumulation, clipping, (bucket, gather_bucket) in itertools.product(
            (0, 1, 2), (1, 3), (0.0, 0.05), ((500_000_000, 500_000_000), (5, 4))):
        for reduce_scatter in ((True,) if stage == 0 else (True, False)):
            for overlap in (False, True):
                cases.append(dict(stage=stage, accumulation=accumulation, clipping=clipping, bucket=bucket,
                                  gather_bucket=gather_bucket, reduce_scatter=reduce_scatter, overlap=overlap))
    return cases


def train_nano(model: torch.nn.Module, config: dict, rank: int, steps: int, on_step=None) -> nano.NanoEngine:
    engine, _, _, _ = nano.initialize(model=model, model_parameters=parameter_groups(model, WEIGHT_DECAY),
                                      config=config)
    accumulation = config["gradient_accumulation_steps"]
    for step in range(steps):
        for micro in range(accumulation):
            inputs = micro_batch(step, micro, rank, MICRO_SIZE).to(engine.device, next(model.parameters()).dtype)
            engine.backward(loss_of(engine, inputs))
            engine.step()
        if on_step is not None:
            on_step(step, engine)
    return engine


def parity_worker(rank: int, world_size: int) -> list[str]:
    """After every step every parameter matches the single-process AdamW reference."""
    failures = []
    initial = build_model()
    for case in parity_cases():
        reference = ReferenceTrainer(initial, LR, WEIGHT_DECAY, case["clipping"])
        model = copy.deepcopy(initial)

        def compare(step: int, engine: nano.NanoEngine) -> None:
            reference.step(step, world_size, case["accumulation"], MICRO_SIZE)
            difference = max_difference(model, reference.model)
            if not difference <= FP32_TOLERANCE:
                failures.append(f"world size {world_size} {case} step {step}: max |nano - reference| = {difference:.3g}")

        train_nano(model, nano_config(**case), rank, STEPS, compare)
    return failures


def stages_agree_worker(rank: int, world_size: int) -> list[str]:
    """Stages 0, 1 and 2 reach the same parameters from the same start (clipping and accumulation on):
    within 1e-6 in fp32; in bf16 and fp16 (static scale), with gradients travelling in fp32, within
    4e-3 (a few roundings of the 16-bit parameters; measured: at most 1e-3), having moved 0.03."""
    failures = []
    for precision, tolerance in (("fp32", 1e-6), ("bf16", 4e-3), ("fp16", 4e-3)):
        extra = {} if precision == "fp32" else {"communication_data_type": "fp32"}
        if precision == "fp16":
            extra["fp16"] = {"loss_scale": 1024.0}
        initial, results = build_model(), []
        for stage in (0, 1, 2):
            model = copy.deepcopy(initial)
            train_nano(model, nano_config(stage, accumulation=2, clipping=0.05, bucket=7, gather_bucket=4,
                                          precision=precision, **extra), rank, STEPS)
            results.append(model)
        moved = max_difference(initial, results[0])
        if moved < 5 * tolerance:
            failures.append(f"{precision}: stage 0 moved only {moved:.3g} from the start")
        for stage, other in ((1, results[1]), (2, results[2])):
            difference = max_difference(results[0], other)
            if difference > tolerance:
                failures.append(f"{precision}: stage {stage} differs from stage 0 by {difference:.3g}")
    return failures


def nonfinite_worker(rank: int, world_size: int) -> list[str]:
    """A NaN gradient on one rank in fp32 makes every rank skip the step and keep its parameters."""
    failures = []
    for stage in (0, 1, 2):
        model = build_model()
        engine, *_ = nano.initialize(model=model, config=nano_config(stage, bucket=9))
        before = [parameter.detach().clone() for parameter in model.parameters()]
        loss = loss_of(engine, micro_batch(0, 0, rank, MICRO_SIZE))
        engine.backward(loss * float("nan") if rank == 0 else loss)
        engine.step()
        unchanged = all(torch.equal(old, new) for old, new in zip(before, model.parameters()))
        if not unchanged or engine.was_step_applied() or engine.skipped_steps != 1 or \
                engine.get_global_grad_norm() != float("inf"):
            failures.append(f"stage {stage}: unchanged={unchanged} applied={engine.was_step_applied()} "
                            f"skipped={engine.skipped_steps} norm={engine.get_global_grad_norm()}")
        engine.backward(loss_of(engine, micro_batch(1, 0, rank, MICRO_SIZE)))
        engine.step()
        if not engine.was_step_applied():
            failures.append(f"stage {stage}: the step after a skipped one was not applied")
    return failures


def _live_bytes(tracker: LiveStorageTracker) -> int:
    """Bytes of tensor storage alive now, as the harness's external tracker sees them."""
    gc.collect()
    return tracker.live_bytes


def memory_worker(rank: int, world_size: int) -> list[str]:
    """Bytes alive after backward, while Adam runs, and between steps equal the documented per-group
    formula for each stage and precision, and for stage 1's fp32-accumulation variant (bf16 with
    grad_accum_dtype fp32, with and without immediate_grad_update); memory_breakdown() reports the
    same categories."""
    failures = []
    fp32_accumulation = {"data_types": {"grad_accum_dtype": "fp32"}}
    cases = [(precision, stage, None, {}) for precision, stage in itertools.product(("fp32", "bf16"), (0, 1, 2))]
    cases += [("bf16", 1, "fp32", fp32_accumulation),
              ("bf16", 1, "fp32", {**fp32_accumulation, "bf16": {"enabled": True, "immediate_grad_update": True}})]
    for precision, stage, grad_accum_dtype, extra in cases:
        tracker = LiveStorageTracker("cpu")
        # entered before the model exists, so every storage it and nano make is seen; every tensor a
        # collective was handed stays referenced, as a slow gloo thread may keep it
        with tracker, backend_holding_collective_tensors():
            model = build_model()
            group_sizes = [sum(p.numel() for p in group["params"]) for group in parameter_groups(model, 0.0)]
            engine, _, _, _ = nano.initialize(model=model, model_parameters=parameter_groups(model, WEIGHT_DECAY),
                                              config=nano_config(stage, precision=precision, bucket=11, **extra))
            moments = {}

            def measure_step(optimizer, args, kwargs):  # the moment Adam runs
                moments["step"] = (_live_bytes(tracker), engine.memory_breakdown())

            hook = engine.optimizer.partition_optimizer.register_step_pre_hook(measure_step)
            for step in range(2):  # Adam's states exist from the first step on: measure the second
                dtype = next(model.parameters()).dtype  # no input tensor may outlive backward here
                engine.backward(loss_of(engine, micro_batch(step, 0, rank, MICRO_SIZE).to(dtype)))
                moments["backward"] = (_live_bytes(tracker), engine.memory_breakdown())
                engine.step()
            moments["between_steps"] = (_live_bytes(tracker), engine.memory_breakdown())
            hook.remove()
        for moment, (measured, reported) in moments.items():
            formulas = [model_state_bytes(stage, precision, numel, world_size, moment, grad_accum_dtype=grad_accum_dtype)
                        for numel in group_sizes]
            expected = {key: sum(formula[key] for formula in formulas) for key in formulas[0]}
            label = f"ws {world_size} {precision} stage {stage} {extra} {moment}"
            if measured != sum(expected.values()):
                failures.append(f"{label}: live bytes {measured} != formula {sum(expected.values())} ({expected})")
            mismatched = {key: (reported[key], expected[key]) for key in expected if reported[key] != expected[key]}
            if mismatched:
                failures.append(f"{label}: memory_breakdown vs formula {mismatched}")
    return failures


def fp16_overflow_worker(rank: int, world_size: int) -> list[str]:
    """An inf gradient on the last rank alone makes every rank skip, keep its parameters, and lower the
    scale per hysteresis; overflow-free steps grow it again after the window."""
    failures = []
    for stage in (0, 1, 2):
        model = build_model()
        config = nano_config(stage, precision="fp16", bucket=9,
                             fp16={"initial_scale_power": 8, "hysteresis": 2, "loss_scale_window": 2})
        engine, optimizer, _, _ = nano.initialize(model=model, model_parameters=parameter_groups(model, WEIGHT_DECAY),
                                                  config=config)
        poisoned_steps = {1, 2}
        expected_scales = [256, 256, 256, 128, 128, 128, 256]  # hysteresis 2, then window 2 after the overflow
        for step, expected_scale in enumerate(expected_scales):
            if engine.current_loss_scale() != expected_scale:
                failures.append(f"stage {stage} step {step}: scale {engine.current_loss_scale()} != {expected_scale}")
            before = [parameter.detach().clone() for parameter in model.parameters()]
            loss = loss_of(engine, micro_batch(step, 0, rank, MICRO_SIZE).half())
            if step in poisoned_steps and rank == world_size - 1:
                loss = loss * float("inf")
            engine.backward(loss)
            engine.step()
            changed = any(not torch.equal(old, new) for old, new in zip(before, model.parameters()))
            skipped = step in poisoned_steps
            if changed == skipped or engine.was_step_applied() == skipped or optimizer.overflow != skipped:
                failures.append(f"stage {stage} step {step}: skipped={skipped} but parameters changed={changed}, "
                                f"was_step_applied={engine.was_step_applied()}")
        if engine.skipped_steps != 2 or engine.global_steps != len(expected_scales):
            failures.append(f"stage {stage}: skipped_steps {engine.skipped_steps}, global_steps {engine.global_steps}")
    return failures


class WithUnusedLayer(torch.nn.Module):
    """The reference model plus a layer the loss never touches."""

    def __init__(self):
        super().__init__()
        self.used = build_model()
        self.unused = torch.nn.Linear(3, 3)

    def forward(self, inputs):
        return self.used(inputs)


def unused_parameters_worker(rank: int, world_size: int) -> list[str]:
    """Parameters with no gradient count as zero (their bucket is still reduced, on every rank, in the
    same order); with ignore_unused_parameters false stage 2 names the parameter."""
    failures = []
    for stage in (0, 1, 2):
        model = WithUnusedLayer()
        reference = ReferenceTrainer(model.used, LR, WEIGHT_DECAY, clipping=0.0)
        unused_before = model.unused.weight.detach().clone()
        engine, *_ = nano.initialize(model=model, model_parameters=parameter_groups(model, WEIGHT_DECAY),
                                     config=nano_config(stage, bucket=8))
        for step in range(2):
            engine.backward(loss_of(engine, micro_batch(step, 0, rank, MICRO_SIZE)))
            engine.step()
            reference.step(step, world_size, 1, MICRO_SIZE)
        difference = max_difference(model.used, reference.model)
        if difference > FP32_TOLERANCE:
            failures.append(f"stage {stage}: the used layers differ from the reference by {difference:.3g}")
        # zero gradients: AdamW's decoupled decay is all that moves the unused weight
        expected = unused_before * (1 - LR * WEIGHT_DECAY) ** 2
        if not torch.allclose(model.unused.weight, expected, atol=1e-7):
            failures.append(f"stage {stage}: the unused weight moved other than by weight decay")
    model = WithUnusedLayer()
    engine, *_ = nano.initialize(model=model, config=nano_config(2, ignore_unused=False))
    try:
        engine.backward(loss_of(engine, micro_batch(0, 0, rank, MICRO_SIZE)))
        failures.append("ignore_unused_parameters=false did not raise")
    except nano.NanoConfigError as error:
        if "unused.weight" not in str(error) and "unused.bias" not in str(error):
            failures.append(f"the error does not name the unused parameter: {error}")
    return failures
