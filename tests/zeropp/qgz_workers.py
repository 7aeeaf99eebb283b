"""Per-rank bodies for qgZ (zero_quantized_gradients) at W=4 in nodes of 2, alone and with hpZ and qwZ:
50 steps whose reduced gradients stay within the int4 bound of the exact average, and whose losses
stay within Adam's reach of plain stage 3's."""

from __future__ import annotations

import copy
import os

import torch
import torch.distributed

import zero_lab.nano as nano
from tests.nano.stage3_reference import build_trapnet, decay_groups, token_batch, token_loss
from tests.nano.workers import MICRO_SIZE, WEIGHT_DECAY
from tests.zeropp.qwz_workers import LR_FOR_NUMERICS, RANKS_PER_NODE, STEPS, config
from zero_lab.nano.collectives import RANKS_PER_NODE_ENVIRONMENT
from zero_lab.nano.zeropp.quantization import GRADIENT_LEVELS, LEVELS
from zero_lab.nano.zeropp.quantized_gradients import QuantizedGradientReducer

KEYS = {"qgZ": {"zero_quantized_gradients": True},
        "qgZ+qwZ+hpZ": {"zero_quantized_gradients": True, "zero_quantized_weights": True,
                        "zero_hpz_partition_size": RANKS_PER_NODE}}


def gradient_bound(local_absmax: float, world_size: int, per_node: int) -> float:
    """What qgZ's two quantizations can change an averaged gradient element by, for local gradients of
    at most M = `local_absmax` in absolute value (`nano.zeropp.quantized_gradients`, `nano.zeropp.quantization`):
    each of the W local gradients is off by at most M / 8 (int4: absmax / 8); each of the W / K node
    sums is at most K (M + M / 8) and is off by at most that / 8. Summed and divided by W:
    M / 8 + (9 / 8) M / 8 = 17 M / 64."""
    nodes = world_size // per_node
    total = world_size * local_absmax / GRADIENT_LEVELS + nodes * per_node * local_absmax * (1 + 1 / GRADIENT_LEVELS) / GRADIENT_LEVELS
    return total / world_size


def adam_reach(betas: tuple[float, float]) -> float:
    """The most one AdamW step moves a weight, in units of lr, besides the decay: |m^ / sqrt(v^)| <=
    (1 - beta1) / sqrt(1 - beta2) when 1 - beta1 > sqrt(1 - beta2) (Kingma and Ba, section 2.1), else 1."""
    beta1, beta2 = betas
    return max(1.0, (1 - beta1) / (1 - beta2) ** 0.5)


def exact_average(engine, probe: torch.nn.Module, index: int) -> torch.Tensor:
    """This rank's partition of buffer `index`'s gradient, averaged exactly over ranks from the probe's."""
    buffer = engine.optimizer.buffers[index]
    names = {parameter: name for name, parameter in engine.module.named_parameters()}
    probes = dict(probe.named_parameters())
    flat = torch.zeros(buffer.layout.padded_numel)
    for parameter, offset in zip(buffer.parameters, buffer.layout.offsets):
        gradient = probes[names[parameter]].grad
        if gradient is not None:
            flat[offset:offset + parameter.numel()] = gradient.reshape(-1)
    torch.distributed.all_reduce(flat)
    return flat[buffer.partition_start:buffer.partition_end] / torch.distributed.get_world_size()


def run(keys: dict, initial, rank: int, world_size: int, failures: list[str], name: str) -> list[tuple[float, float, float, float]]:
    """Per step: (the engine's loss, sum |dL/dw| at its weights, `adam_reach` of its betas, max |w|); with qgZ, each step's reduced gradient
    partitions are checked against the exact average within `gradient_bound`."""
    model, probe = copy.deepcopy(initial), copy.deepcopy(initial)
    settings = config(keys)
    settings["optimizer"]["params"]["lr"] = LR_FOR_NUMERICS
    engine, *_ = nano.initialize(model=model, model_parameters=decay_groups(model, WEIGHT_DECAY), config=settings)
    quantized = isinstance(engine.optimizer.reducer, QuantizedGradientReducer)
    if quantized != bool(keys):
        failures.append(f"{name}: the reducer is {type(engine.optimizer.reducer).__name__}")
    found, largest_ratio = [], 0.0
    for step in range(STEPS):
        batch = token_batch(step, 0, rank, MICRO_SIZE)
        with nano.zero.GatheredParameters(list(model.parameters())), torch.no_grad():
            for mine, theirs in zip(probe.parameters(), model.parameters()):
                mine.copy_(theirs)
        probe.zero_grad()
        token_loss(probe, batch).backward()  # exact weights: qwZ's quantized gathers are not in the probe
        loss = token_loss(engine, batch)
        engine.backward(loss)
        gradient_l1 = torch.tensor(sum(p.grad.abs().sum().item() for p in probe.parameters() if p.grad is not None))
        torch.distributed.all_reduce(gradient_l1)
        largest = max(parameter.detach().abs().max().item() for parameter in probe.parameters())
        found.append((loss.item(), gradient_l1.item() / world_size, adam_reach(engine.nano_config.optimizer.params.betas),
                      largest))
        if quantized and not keys.get("zero_quantized_weights"):  # with qwZ the engine's weights are not the probe's
            local_absmax = torch.tensor(max(p.grad.abs().max().item() for p in probe.parameters() if p.grad is not None))
            torch.distributed.all_reduce(local_absmax, op=torch.distributed.ReduceOp.MAX)
            bound = gradient_bound(local_absmax.item(), world_size, RANKS_PER_NODE) * (1 + 1e-5)
            differences = [(engine.optimizer.gradient_partitions[index] - exact_average(engine, probe, index)).abs().max().item()
                           for index in range(len(engine.optimizer.buffers))]
            if not 0 < max(differences) <= bound:
                failures.append(f"{name} step {step}: reduced gradients differ by {max(differences):.3g} "
                                f"(quantized: 0 < it <= {bound:.3g})")
            largest_ratio = max(largest_ratio, max(differences) / bound)
        engine.step()
    if rank == 0 and os.environ.get("QGZ_NUMERICS_REPORT") and quantized and not keys.get("zero_quantized_weights"):
        print(f"[qgz numerics] {name}: max |g - exact| / bound {largest_ratio:.3f}")
    return found


def tolerance_at(step: int, plain: tuple, gathered_error: float) -> float:
    """|L - plain stage 3's L| at `step`, to first order: sum |dL/dw| times the furthest the weights
    can be apart, 2 x step x lr x `adam_reach`, plus, with qwZ, its gathered weights' error (max |w| /
    128, as tests/zeropp/qwz_workers.py bounds it)."""
    _, gradient_l1, reach, _ = plain
    return gradient_l1 * (2 * step * LR_FOR_NUMERICS * reach + gathered_error) + 1e-6


def numerics_worker(rank: int, world_size: int) -> list[str]:
    """With qgZ on (alone, and with qwZ and hpZ), at each of 50 steps:
    - qgZ alone: every element of the reduced gradient partitions differs from the exact average of
      the ranks' gradients at the same weights by at most `gradient_bound` (17/64 of the largest local
      gradient element), and by more than nothing (the quantization is on);
    - both: the loss differs from plain stage 3's at that step by at most the first-order effect of
      the furthest the two runs' weights can be apart (`tolerance_at`; with qwZ plus its gathers' error).
      That bound holds for any gradient error (Adam normalizes it away), so it only catches a broken
      run (NaN, a lost step); the gradient check above is the one that catches a wrong exchange.
    And in one node of all W ranks, qgZ keeps the plain reduce-scatter."""
    failures: list[str] = []
    initial = build_trapnet(spare=False)
    os.environ[RANKS_PER_NODE_ENVIRONMENT] = str(world_size)  # one node: the plain reduce-scatter, as official
    model = copy.deepcopy(initial)
    engine, *_ = nano.initialize(model=model, model_parameters=decay_groups(model, WEIGHT_DECAY), config=config(KEYS["qgZ"]))
    if isinstance(engine.optimizer.reducer, QuantizedGradientReducer):
        failures.append("qgZ in one node quantizes (official reduce-scatters with one node)")
    os.environ[RANKS_PER_NODE_ENVIRONMENT] = str(RANKS_PER_NODE)
    plain = run({}, initial, rank, world_size, failures, "plain")
    for name, keys in KEYS.items():
        steps = run(keys, initial, rank, world_size, failures, name)
        for step, (mine, theirs) in enumerate(zip(steps, plain)):
            tolerance = tolerance_at(step, theirs, mine[3] / LEVELS if keys.get("zero_quantized_weights") else 0.0)
            loss, theirs = mine[0], theirs[0]
            if abs(loss - theirs) > tolerance:
                failures.append(f"{name} step {step}: loss {loss:.7f}, plain stage 3 {theirs:.7f}, tolerance {tolerance:.3g}")
        if not any(mine[0] != theirs[0] for mine, theirs in zip(steps, plain)):
            failures.append(f"{name}: every loss equals plain stage 3's (no quantization?)")
        if rank == 0 and os.environ.get("QGZ_NUMERICS_REPORT"):
            print(f"[qgz numerics] {name}: max |L - plain| {max(abs(a[0] - b[0]) for a, b in zip(steps, plain)):.3g}, "
                  f"max |L - plain| / tolerance "
                  f"{max(abs(a[0] - b[0]) / tolerance_at(i, b, a[3] / LEVELS if keys.get('zero_quantized_weights') else 0.0) for i, (a, b) in enumerate(zip(steps, plain))):.3f}")
    return failures
