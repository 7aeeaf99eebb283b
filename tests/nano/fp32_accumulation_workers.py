"""Stage 1 with bf16 and `data_types.grad_accum_dtype: fp32` (the stage table's fp32-accumulation
variant) against its single-process reference and against official DeepSpeed's BF16_Optimizer.

The reference is the variant's documented semantics in one process, written from DeepSpeed's
description of gradient accumulation in fp32 (not from nano's code): a bf16 copy of the model
computes each rank's micro-batch gradient in bf16 exactly as that rank does (same inputs, same
loss / accumulation, same kernels in the same process); the gradients are added in fp32 per rank
over the window; the ranks' sums are averaged (through bf16 when the gradients travel in bf16);
torch's clip_grad_norm_ coefficient, then torch.optim.AdamW on fp32 master weights, which are
rounded to bf16 for the next forward.
"""

from __future__ import annotations

import copy

import torch

import zero_lab.nano as nano
from zero_lab.nano.facade.official_config import to_official_config
from tests.nano.official_workers import import_official_deepspeed
from tests.nano.reference import build_model, loss_of, micro_batch, parameter_groups
from tests.nano.workers import LR, MICRO_SIZE, WEIGHT_DECAY, nano_config
from tests.tolerances import ADAM_EPS

STEPS, ACCUMULATION, CLIPPING = 4, 3, 0.05
FP32_ACCUMULATION = {"data_types": {"grad_accum_dtype": "fp32"}}


def variant_config(communication: str | None = None, immediate: bool = False) -> dict:
    extra = dict(FP32_ACCUMULATION)
    if communication:
        extra["communication_data_type"] = communication
    if immediate:
        extra["bf16"] = {"enabled": True, "immediate_grad_update": True}
    return nano_config(1, accumulation=ACCUMULATION, clipping=CLIPPING, bucket=64, precision="bf16", **extra)


class Fp32AccumulationReference:
    """One process, every rank's micro-batches (see the module docstring); `accumulate` is the
    dtype the window's gradients add up in (fp32 as specified; bf16 to show the test tells them apart)."""

    def __init__(self, initial: torch.nn.Module, world_size: int, travel_dtype: torch.dtype,
                 accumulate: torch.dtype = torch.float32):
        self.model = copy.deepcopy(initial).to(torch.bfloat16)
        self.masters = [parameter.detach().float().clone().requires_grad_() for parameter in self.model.parameters()]
        decay = [master for master, parameter in zip(self.masters, self.model.parameters()) if parameter.dim() >= 2]
        no_decay = [master for master, parameter in zip(self.masters, self.model.parameters()) if parameter.dim() < 2]
        self.adam = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                                       {"params": no_decay, "weight_decay": 0.0}], lr=LR, eps=ADAM_EPS)
        self.world_size, self.travel_dtype, self.accumulate = world_size, travel_dtype, accumulate

    def step(self, step: int) -> list[list[float]]:
        """One optimizer step; returns each rank's losses, one per micro-step."""
        sums = [[torch.zeros_like(master, dtype=self.accumulate) for master in self.masters]
                for _ in range(self.world_size)]
        losses = [[] for _ in range(self.world_size)]
        for micro in range(ACCUMULATION):
            for rank in range(self.world_size):
                self.model.zero_grad(set_to_none=True)
                loss = loss_of(self.model, micro_batch(step, micro, rank, MICRO_SIZE).to(torch.bfloat16))
                losses[rank].append(loss.item())
                (loss / ACCUMULATION).backward()
                for total, parameter in zip(sums[rank], self.model.parameters()):
                    total.add_(parameter.grad.to(self.accumulate))
        for index, master in enumerate(self.masters):
            travelled = sum(rank_sums[index].to(self.travel_dtype) for rank_sums in sums)
            master.grad = travelled.float() / self.world_size
        torch.nn.utils.clip_grad_norm_(self.masters, CLIPPING)
        self.adam.step()
        with torch.no_grad():
            for master, parameter in zip(self.masters, self.model.parameters()):
                parameter.copy_(master)
        return losses


def _train_nano(initial: torch.nn.Module, config: dict, rank: int, module=nano):
    """Per-micro-step losses and the bf16 parameters after every step, nano or official."""
    model = copy.deepcopy(initial)
    engine, *_ = module.initialize(model=model, model_parameters=parameter_groups(model, WEIGHT_DECAY), config=config)
    losses, snapshots = [], []
    for step in range(STEPS):
        for micro in range(ACCUMULATION):
            loss = loss_of(engine, micro_batch(step, micro, rank, MICRO_SIZE).to(torch.bfloat16))
            losses.append(loss.item())
            engine.backward(loss)
            engine.step()
        snapshots.append([parameter.detach().float().clone() for parameter in model.parameters()])
    return losses, snapshots, engine


def _largest(first: list[list[torch.Tensor]], second: list[list[torch.Tensor]]) -> float:
    return max((a - b).abs().max().item() for step_a, step_b in zip(first, second) for a, b in zip(step_a, step_b))


def _beyond_one_bf16_rounding(first: list[list[torch.Tensor]], second: list[list[torch.Tensor]]) -> int:
    """Elements further apart than one bf16 step at their magnitude (one rounding landing the other way)."""
    return sum(int(((a - b).abs() > torch.finfo(torch.bfloat16).eps * b.abs()).sum())
               for step_a, step_b in zip(first, second) for a, b in zip(step_a, step_b))


def reference_worker(rank: int, world_size: int) -> list[str]:
    """At 1 and 2 ranks, gradients travelling in bf16 (the default) and in fp32, and with
    immediate_grad_update: every micro-step's loss and the bf16 parameters after every step equal
    the reference's exactly (every operation is the same one in the same order: a sum of two is the
    same in either order), and a reference that accumulates in bf16 instead is told apart. At 3
    ranks (uneven partitions), gradients in fp32: gloo's ring adds three ranks in its own order, an
    fp32 rounding apart from the reference's, which may land a bf16 parameter one rounding step
    away, never more."""
    failures = []
    initial = build_model(seed=5)
    exact = world_size <= 2
    cases = ((None, False), ("fp32", False), (None, True)) if exact else (("fp32", False),)
    for communication, immediate in cases:
        config = variant_config(communication, immediate)
        travel = torch.float32 if communication == "fp32" else torch.bfloat16
        losses, snapshots, engine = _train_nano(initial, config, rank)
        if type(engine.optimizer).__name__ != "Stage1Fp32AccumulationOptimizer":
            failures.append(f"the variant ran {type(engine.optimizer).__name__}")
        measured = {}
        for accumulate in (torch.float32, torch.bfloat16):
            reference = Fp32AccumulationReference(initial, world_size, travel, accumulate)
            reference_losses, reference_snapshots = [], []
            for step in range(STEPS):
                reference_losses += reference.step(step)[rank]
                reference_snapshots.append([p.detach().float().clone() for p in reference.model.parameters()])
            measured[accumulate] = (max(abs(a - b) for a, b in zip(losses, reference_losses)),
                                    _largest(snapshots, reference_snapshots),
                                    _beyond_one_bf16_rounding(snapshots, reference_snapshots))
        label = f"ws {world_size} communication {communication or 'bf16'} immediate {immediate}"
        print(f"[fp32-accumulation] rank {rank} {label}: vs reference (loss, parameter, elements beyond one "
              f"rounding) {measured[torch.float32]}, vs a bf16-accumulating reference {measured[torch.bfloat16]}",
              flush=True)
        loss_delta, parameter_delta, beyond = measured[torch.float32]
        if (exact and (loss_delta, parameter_delta) != (0.0, 0.0)) or beyond:
            failures.append(f"{label}: (loss, parameter, elements beyond one rounding) vs the reference "
                            f"{measured[torch.float32]}")
        if exact and measured[torch.bfloat16][1] == 0.0:
            failures.append(f"{label}: a bf16-accumulating reference is not told apart")
    return failures


def official_worker(rank: int, world_size: int) -> list[str]:
    """Side by side with official DeepSpeed 0.19.8, which runs its BF16_Optimizer here: every
    micro-step's loss and the bf16 parameters after every step agree (gradients travelling in bf16
    and in fp32, and with immediate_grad_update)."""
    deepspeed = import_official_deepspeed(world_size)
    failures = []
    initial = build_model(seed=5)
    for communication, immediate in ((None, False), ("fp32", False), (None, True)):
        config = variant_config(communication, immediate)
        ours, our_snapshots, _ = _train_nano(initial, config, rank)
        theirs, their_snapshots, engine = _train_nano(initial, to_official_config(config, device="cpu"), rank,
                                                      deepspeed)
        if type(engine.optimizer).__name__ != "BF16_Optimizer":
            failures.append(f"official ran {type(engine.optimizer).__name__}, not BF16_Optimizer")
        loss_delta = max(abs(a - b) for a, b in zip(ours, theirs))
        parameter_delta = _largest(our_snapshots, their_snapshots)
        label = f"ws {world_size} communication {communication or 'bf16'} immediate {immediate}"
        print(f"[fp32-accumulation] {label}: vs official max loss delta {loss_delta:.3g}, "
              f"max parameter delta {parameter_delta:.3g}", flush=True)
        if loss_delta or parameter_delta:
            failures.append(f"{label}: vs official, max loss delta {loss_delta:.3g}, parameter delta {parameter_delta:.3g}")
    return failures


def checkpoint_worker(rank: int, world_size: int, root: str, saver_name: str = "nano") -> list[str]:
    """The saver (nano's variant, or official's BF16_Optimizer) saves after two steps and trains two
    more; nano and official DeepSpeed, each built from another seed, load that checkpoint and train
    the same two steps: every loss and the final parameters equal the saver's."""
    deepspeed = import_official_deepspeed(world_size)
    config = variant_config()
    failures = []

    def engine_of(module, seed: int):
        model = build_model(seed=seed)
        received = config if module is nano else to_official_config(config, device="cpu")
        engine, *_ = module.initialize(model=model, model_parameters=parameter_groups(model, WEIGHT_DECAY),
                                       config=received)
        return engine

    def train(engine, steps: range) -> list[float]:
        losses = []
        for step in steps:
            for micro in range(ACCUMULATION):
                loss = loss_of(engine, micro_batch(step, micro, rank, MICRO_SIZE).to(torch.bfloat16))
                losses.append(loss.item())
                engine.backward(loss)
                engine.step()
        return losses

    saver = engine_of(nano if saver_name == "nano" else deepspeed, 5)
    train(saver, range(2))
    saver.save_checkpoint(root)
    expected_losses = train(saver, range(2, 4))
    expected = [parameter.detach().float().clone() for parameter in saver.module.parameters()]
    saver.destroy()
    for name, module in (("nano", nano), ("official", deepspeed)):
        resumed = engine_of(module, 9)
        resumed.load_checkpoint(root)
        losses = train(resumed, range(2, 4))
        loss_delta = max(abs(a - b) for a, b in zip(losses, expected_losses))
        parameter_delta = max((a - b.detach().float()).abs().max().item()
                              for a, b in zip(expected, resumed.module.parameters()))
        print(f"[fp32-accumulation] rank {rank} {name} resumed {saver_name}'s checkpoint: max loss delta {loss_delta:.3g}, "
              f"max parameter delta {parameter_delta:.3g}", flush=True)
        if loss_delta or parameter_delta:
            failures.append(f"{name} resumed {saver_name}'s checkpoint: loss delta {loss_delta:.3g}, "
                            f"parameter delta {parameter_delta:.3g}")
        resumed.destroy()
    return failures
