"""What DeepSpeed clients (the HF Trainer, accelerate) ask of an engine, run with nano and with official
DeepSpeed in the same spawned ranks, same model, data and seed (issue 18, engine items 2-4, 6, 8)."""

from __future__ import annotations

import copy

import torch

import zero_lab.nano as nano
from zero_lab.nano.facade.official_config import to_official_config
from tests.nano.official_workers import import_official_deepspeed
from tests.nano.reference import build_model, loss_of, max_difference, micro_batch, parameter_groups
from tests.nano.workers import MICRO_SIZE, WEIGHT_DECAY, nano_config

STEPS = 4
FP32_TOLERANCE = 1e-6


def _train(module, model, config, rank, optimizer=None, scheduler=None, steps=STEPS):
    """Per-micro-step losses and learning rates; `scheduler` (built on the client's optimizer) is
    stepped by the loop after each engine.step(), as accelerate's loop does."""
    engine, *_ = module.initialize(model=model, optimizer=optimizer, config=config,
                                   model_parameters=None if optimizer is not None else model.parameters())
    losses, lrs = [], []
    for step in range(steps):
        for micro in range(config.get("gradient_accumulation_steps", 1)):
            loss = loss_of(engine, micro_batch(step, micro, rank, MICRO_SIZE))
            losses.append(loss.item())
            engine.backward(loss)
            engine.step()
        if scheduler is not None:
            scheduler.step()
        lrs.append([group["lr"] for group in engine.optimizer.param_groups])
    return losses, lrs, engine


def _both(deepspeed, config, rank, make_optimizer=None, official_config=None):
    """(nano's, official's) results of `_train` on copies of one model; `make_optimizer(model)` builds a
    client optimizer and its LambdaLR on each copy."""
    results = []
    initial = build_model(seed=5)
    for module, impl_config in ((nano, config), (deepspeed, official_config or config)):
        model = copy.deepcopy(initial)
        optimizer, scheduler = make_optimizer(model) if make_optimizer else (None, None)
        results.append(_train(module, model, copy.deepcopy(impl_config), rank, optimizer, scheduler))
    return results


def _compare(name, nano_result, official_result, failures, tolerance=FP32_TOLERANCE):
    (nano_losses, nano_lrs, nano_engine), (official_losses, official_lrs, official_engine) = nano_result, official_result
    worst = max(abs(a - b) for a, b in zip(nano_losses, official_losses))
    worst_parameter = max_difference(nano_engine.module, official_engine.module)
    print(f"[client-surface] {name}: max_loss_delta={worst:.3g} max_param_delta={worst_parameter:.3g} "
          f"lrs={nano_lrs[-1]}", flush=True)
    if worst > tolerance or worst_parameter > tolerance:
        failures.append(f"{name}: nano and official differ by {worst:.3g} (loss), {worst_parameter:.3g} (parameters)")
    if nano_lrs != official_lrs:
        failures.append(f"{name}: learning rates {nano_lrs} (nano) != {official_lrs} (official)")


def _client_adamw(model):
    """Two groups with their own decay and lr, and a LambdaLR halving the lr every step."""
    groups = parameter_groups(model, WEIGHT_DECAY)
    groups[1]["lr"] = 5e-3
    optimizer = torch.optim.AdamW(groups, lr=1e-2, betas=(0.8, 0.99), eps=1e-7)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5 ** step)


def client_optimizer_worker(rank: int, world_size: int) -> list[str]:
    """Item 4: a client's torch AdamW (two groups, own betas/eps/lr) driven by its LambdaLR, at stages
    2 and 3, and torch's Adam with L2 decay at stage 1; item 2's accelerate keys ride along."""
    deepspeed = import_official_deepspeed(world_size)
    failures = []
    for stage in (2, 3):
        config = nano_config(stage, accumulation=2)
        del config["optimizer"]
        config.update(steps_per_print=float("inf"), zero_allow_untested_optimizer=True,
                      zero_force_ds_cpu_optimizer=True)
        _compare(f"stage {stage} client AdamW + LambdaLR", *_both(deepspeed, config, rank, _client_adamw), failures)
    config = nano_config(1)
    del config["optimizer"]

    def client_adam(model):
        return torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=0.05), None

    _compare("stage 1 client Adam (L2 decay)", *_both(deepspeed, config, rank, client_adam), failures)
    return failures


def legacy_keys_worker(rank: int, world_size: int) -> list[str]:
    """Item 8: `cpu_offload: true` (offload_optimizer), and `torch_adam: true` without weight_decay
    (torch.optim.AdamW's 0.01), each against official."""
    deepspeed = import_official_deepspeed(world_size)
    failures = []
    config = nano_config(2)
    config["optimizer"]["params"] = {"lr": 1e-2, "torch_adam": True}
    nano_result, official_result = _both(deepspeed, config, rank)
    _compare("torch_adam without weight_decay", nano_result, official_result, failures)
    if nano_result[2].optimizer.param_groups[0]["weight_decay"] != 0.01:
        failures.append(f"torch_adam: nano decays by {nano_result[2].optimizer.param_groups[0]['weight_decay']}")
    config = nano_config(2, zero_force_ds_cpu_optimizer=False)
    config["zero_optimization"]["cpu_offload"] = True
    official = copy.deepcopy(config)
    official["optimizer"]["params"]["torch_adam"] = True  # torch's AdamW on the host, not the C++ op
    nano_result, official_result = _both(deepspeed, config, rank, official_config=official)
    _compare("cpu_offload true", nano_result, official_result, failures)
    placed = nano_result[2].memory_breakdown(by_device=True)
    if not placed.get("host", {}).get("fp32_master_partition"):
        failures.append(f"cpu_offload: nano's masters are not on the host: {placed}")
    if not official_result[2].zero_cpu_offload():
        failures.append("cpu_offload: official does not offload (the test's premise)")
    return failures


class WithBuffer(torch.nn.Module):
    """A model with a float buffer in its forward, as RoPE's inv_freq is."""

    def __init__(self):
        super().__init__()
        self.body = build_model(seed=7)
        self.register_buffer("inv_freq", 1.0 / (10_000 ** (torch.arange(0, 8, 2).float() / 8)), persistent=False)

    def forward(self, inputs):
        return self.body(inputs) * self.inv_freq.sum().to(inputs.dtype)


def bf16_and_saving_worker(rank: int, world_size: int) -> list[str]:
    """Item 6: bf16 casts parameters, not buffers. Item 3: engine.config is the dict given;
    zero_gather_16bit_weights_on_model_save(); _zero3_consolidated_16bit_state_dict() equal to
    official's after training (rank 0; None elsewhere), refused below stage 3 by both."""
    deepspeed = import_official_deepspeed(world_size)
    failures = []
    initial = WithBuffer()
    for stage in (2, 3):
        config = nano_config(stage, precision="bf16")
        config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = True
        seen = {}
        for impl, module, impl_config in (("nano", nano, config),
                                          ("official", deepspeed, to_official_config(config, device="cpu"))):
            engine, *_ = module.initialize(model=copy.deepcopy(initial), config=copy.deepcopy(impl_config),
                                           model_parameters=None)
            dtypes = sorted({str(parameter.dtype) for parameter in engine.module.parameters()})
            seen[impl] = {"parameters": dtypes, "buffer": str(engine.module.inv_freq.dtype),
                          "config": engine.config.get("zero_optimization", {}).get("stage") == stage,
                          "gather": engine.zero_gather_16bit_weights_on_model_save()}
            for step in range(2):
                loss = loss_of(engine, micro_batch(step, 0, rank, MICRO_SIZE).bfloat16())
                engine.backward(loss)
                engine.step()
            if stage == 3:
                seen[impl]["state"] = engine._zero3_consolidated_16bit_state_dict()
            else:
                try:
                    engine._zero3_consolidated_16bit_state_dict()
                    seen[impl]["refused"] = False
                except ValueError:
                    seen[impl]["refused"] = True
        nano_seen, official_seen = seen["nano"], seen["official"]
        states = nano_seen.pop("state", None), official_seen.pop("state", None)
        if nano_seen != official_seen:
            failures.append(f"stage {stage}: nano {nano_seen} != official {official_seen}")
        if nano_seen["buffer"] != "torch.float32" or nano_seen["parameters"] != ["torch.bfloat16"]:
            failures.append(f"stage {stage}: nano's dtypes {nano_seen}")
        if stage == 3:
            if rank != 0 and states != (None, None):
                failures.append(f"rank {rank}: a consolidated state dict off rank 0")
            if rank == 0:
                ours, theirs = states
                if list(ours) != list(theirs):
                    failures.append(f"consolidated keys {list(ours)} != official's {list(theirs)}")
                worst = max((ours[key].float() - theirs[key].float()).abs().max().item() for key in theirs)
                dtypes = {str(tensor.dtype) for tensor in ours.values()}
                print(f"[client-surface] stage 3 bf16 consolidated state dict: max delta {worst:.3g}", flush=True)
                if worst > 0 or dtypes != {"torch.bfloat16"}:
                    failures.append(f"consolidated weights differ from official's by {worst:.3g} ({dtypes})")
    return failures
