"""Per-rank bodies for CPU offload: the same math as without it, and its bytes by place."""

from __future__ import annotations

import copy
import gc
import itertools

import torch

import zero_lab.nano as nano
from tests.backend_holding import backend_holding_collective_tensors
from tests.nano.stage3_reference import TokenReference, build_trapnet, decay_groups, token_batch, token_loss
from tests.nano.stage3_workers import MICRO_SIZE, STEPS, compare_whole, stage3_config
from tests.nano.workers import LR, WEIGHT_DECAY

OFFLOADS = {"optimizer": {"offload_optimizer": {"device": "cpu", "pin_memory": True}},
            "optimizer+param": {"offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}},
            "param": {"offload_param": {"device": "cpu", "pin_memory": False}}}


def offload_config(stage: int, offload: str | None, precision: str = "fp32", **options) -> dict:
    config = stage3_config(precision=precision, **options)
    config["zero_optimization"]["stage"] = stage
    if offload:
        config["zero_optimization"].update(copy.deepcopy(OFFLOADS[offload]))
    return config


def cases() -> list[tuple[int, str]]:
    return [(1, "optimizer"), (2, "optimizer"), (3, "optimizer"), (3, "optimizer+param"), (3, "param")]


def snapshots(config: dict, rank: int) -> list[list[torch.Tensor]]:
    """The whole parameters after each of STEPS steps (accumulation 2, clipping on)."""
    model = build_trapnet()
    engine, *_ = nano.initialize(model=model, model_parameters=decay_groups(model, WEIGHT_DECAY), config=config)
    taken = []
    for step in range(STEPS):
        for micro in range(2):
            engine.backward(token_loss(engine, token_batch(step, micro, rank, MICRO_SIZE)))
            engine.step()
        with nano.zero.GatheredParameters(model.parameters()):
            taken.append([parameter.detach().clone() for parameter in model.parameters()])
    return taken


def bitwise_worker(rank: int, world_size: int) -> list[str]:
    """Offload is the same fp32 math in another place: every parameter after every step equals the
    run without offload bit for bit, at stages 1-3, in fp32 and bf16 (the run without offload is
    trained once per stage and precision: stage 3's three offloads share it)."""
    failures, plain_runs = [], {}
    for (stage, offload), precision in itertools.product(cases(), ("fp32", "bf16")):
        if (stage, precision) not in plain_runs:
            plain_runs[stage, precision] = snapshots(offload_config(stage, None, precision, accumulation=2,
                                                                    clipping=0.05), rank)
        plain = plain_runs[stage, precision]
        moved = snapshots(offload_config(stage, offload, precision, accumulation=2, clipping=0.05), rank)
        for step, (ours, theirs) in enumerate(zip(moved, plain)):
            if not all(torch.equal(a, b) for a, b in zip(ours, theirs)):
                worst = max((a.float() - b.float()).abs().max().item() for a, b in zip(ours, theirs))
                failures.append(f"stage {stage} offload {offload} {precision} step {step}: differs by {worst:.3g}")
    return failures


def reference_worker(rank: int, world_size: int) -> list[str]:
    """Against the global-batch AdamW reference (within 1e-5), optimizer and parameter offload."""
    failures = []
    for stage, offload in ((2, "optimizer"), (3, "optimizer+param")):
        initial = build_trapnet()
        reference = TokenReference(initial, LR, WEIGHT_DECAY, 0.0)
        model = copy.deepcopy(initial)
        engine, *_ = nano.initialize(model=model, model_parameters=decay_groups(model, WEIGHT_DECAY),
                                     config=offload_config(stage, offload))
        for step in range(STEPS):
            engine.backward(token_loss(engine, token_batch(step, 0, rank, MICRO_SIZE)))
            engine.step()
            reference.step(step, world_size, 1, MICRO_SIZE)
            compare_whole(model, reference, failures, f"stage {stage} offload {offload} step {step}", step + 1)
        if not any("nothing is pinned" in warning for warning in engine.warnings) and not torch.cuda.is_available():
            failures.append(f"pin_memory on a machine without CUDA was not reported: {engine.warnings}")
    return failures


def memory_worker(rank: int, world_size: int) -> list[str]:
    """Bytes by place (device, host) at the end of backward, while Adam runs and between steps equal
    the documented formula: memory_breakdown(by_device=True) per place, and the live storage
    tracked from outside in total (host and device are one memory on this CPU)."""
    from zero_lab.nano.config import load_config
    from zero_lab.nano.memory.memory_formula import model_state_bytes_by_place
    from zero_lab.nano.policies.stage3_units import choose_units
    from zero_lab.nano.units import split_groups_by_unit
    from zero_lab.workload.meters.memory_meter import LiveStorageTracker

    failures = []
    for (stage, offload), precision in itertools.product(cases(), ("fp32", "bf16")):
        config = offload_config(stage, offload, precision, bucket=11)
        with LiveStorageTracker("cpu") as tracker, backend_holding_collective_tensors():
            model = build_trapnet(spare=False)
            engine, *_ = nano.initialize(model=model, model_parameters=decay_groups(model, WEIGHT_DECAY), config=config)
            measured, batch = {}, {}

            def live():
                gc.collect()
                return tracker.live_bytes - batch["ids"].untyped_storage().nbytes()

            engine.optimizer.partition_optimizer.register_step_pre_hook(
                lambda *_: measured.__setitem__("step", (live(), engine.memory_breakdown(by_device=True))))
            for step in range(2):
                batch["ids"] = token_batch(step, 0, rank, MICRO_SIZE)
                engine.backward(token_loss(engine, batch["ids"]))
                measured["backward"] = (live(), engine.memory_breakdown(by_device=True))
                engine.step()
            measured["between_steps"] = (live(), engine.memory_breakdown(by_device=True))
        settings = load_config(config, world_size=world_size)
        units = choose_units(model, [p for group in decay_groups(model, WEIGHT_DECAY) for p in group["params"]],
                             settings.zero_optimization)
        for moment, (total_live, reported) in measured.items():
            expected = {"device": {}, "host": {}}
            for unit_index, _, parameters in split_groups_by_unit(units, decay_groups(model, WEIGHT_DECAY)):
                places = model_state_bytes_by_place(stage, precision, sum(p.numel() for p in parameters), world_size,
                                                    moment, sharded=units[unit_index].sharded,
                                                    offload_optimizer="optimizer" in offload,
                                                    offload_parameters="param" in offload)
                for place, figures in places.items():
                    for category, value in figures.items():
                        expected[place][category] = expected[place].get(category, 0) + value
            label = f"ws {world_size} stage {stage} offload {offload} {precision} {moment}"
            formula_total = sum(sum(figures.values()) for figures in expected.values())
            if total_live != formula_total:
                failures.append(f"{label}: live bytes {total_live} != formula {formula_total} ({expected})")
            for place, figures in expected.items():
                got = {key: value for key, value in reported.get(place, {}).items() if key != "total"}
                if sum(figures.values()) and got != figures:
                    failures.append(f"{label} {place}: memory_breakdown {got} != formula {figures}")
    return failures
