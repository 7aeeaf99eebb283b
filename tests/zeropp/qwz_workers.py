"""Per-rank bodies for qwZ (zero_quantized_weights) at W=4 in nodes of 2: 50 steps of per-step
losses against plain stage 3 within the quantization's bound, and the gathers that stay exact."""

from __future__ import annotations

import copy
import os

import torch

import zero_lab.nano as nano
from tests.nano.stage3_reference import build_trapnet, decay_groups, token_batch, token_loss
from tests.nano.stage3_workers import stage3_config
from tests.nano.workers import MICRO_SIZE, WEIGHT_DECAY
from zero_lab.nano.zeropp.quantization import LEVELS
from zero_lab.nano.zeropp.quantized_weights import QuantizedGathers

RANKS_PER_NODE, STEPS = 2, 50
KEYS = {"qwZ": {"zero_quantized_weights": True},
        "qwZ+hpZ": {"zero_quantized_weights": True, "zero_hpz_partition_size": RANKS_PER_NODE}}


def config(keys: dict) -> dict:
    settings = stage3_config()
    settings["zero_optimization"].update(keys)
    return settings


LR_FOR_NUMERICS = 1e-3  # at the tests' 1e-2 this 300-parameter model's Adam trajectories amplify any 0.03 of
# difference chaotically (to 0.66 over 50 steps, measured), which would say nothing about quantization


def first_order_bound(probe: torch.nn.Module, batch: torch.Tensor) -> tuple[float, float]:
    """(the exact loss at the probe's weights, the bound on what one quantized gather can change it
    by): |L(w + e) - L(w)| <= sum |dL/dw| |e| to first order, and every gathered element's error
    |e| <= absmax(its block) / 128 <= max |w| / 128 (`nano.zeropp.quantization`)."""
    probe.zero_grad()
    exact = token_loss(probe, batch)
    exact.backward()
    largest = max(parameter.detach().abs().max().item() for parameter in probe.parameters())
    gradient_l1 = sum(parameter.grad.abs().sum().item() for parameter in probe.parameters() if parameter.grad is not None)
    return exact.item(), gradient_l1 * largest / LEVELS


def losses(keys: dict, initial, rank: int) -> list[tuple[float, float, float]]:
    """Per step: (the engine's loss, the exact loss at the engine's weights, the bound)."""
    model, probe = copy.deepcopy(initial), copy.deepcopy(initial)
    settings = config(keys)
    settings["optimizer"]["params"]["lr"] = LR_FOR_NUMERICS
    engine, *_ = nano.initialize(model=model, model_parameters=decay_groups(model, WEIGHT_DECAY), config=settings)
    found = []
    for step in range(STEPS):
        batch = token_batch(step, 0, rank, MICRO_SIZE)
        with nano.zero.GatheredParameters(list(model.parameters())), torch.no_grad():  # exact (official's rule)
            for mine, theirs in zip(probe.parameters(), model.parameters()):
                mine.copy_(theirs)
        loss = token_loss(engine, batch)
        found.append((loss.item(), *first_order_bound(probe, batch)))
        engine.backward(loss)
        engine.step()
    return found


def numerics_worker(rank: int, world_size: int) -> list[str]:
    """With the keys on, at each of 50 steps, on this rank's batch:
    - the loss the engine computes from quantized gathers differs from the exact loss at the same
      weights by at most the first-order bound of one quantized gather (`first_order_bound`), and
      by more than nothing (the quantization is on);
    - the loss differs from plain stage 3's at that step by at most the same bound. The masters stay
      exact and each gather quantizes them afresh, so the error does not pile up in the weights; the
      two runs drift apart only through gradients computed from quantized weights (measured: under
      5% of the bound over 50 steps).
    The bound is loose (global absmax, every error aligned with its gradient): the measured
    per-step effect is about 2% of it, so this test catches a gross error (a scale lost, blocks
    misaligned, no dequantization); the round-trip test against the reference catches the fine ones."""
    failures = []
    initial = build_trapnet(spare=False)
    plain = [loss for loss, _, _ in losses({}, initial, rank)]
    for name, keys in KEYS.items():
        steps = losses(keys, initial, rank)
        for step, ((loss, exact, bound), theirs) in enumerate(zip(steps, plain)):
            if not 0 < abs(loss - exact) <= bound:
                failures.append(f"{name} step {step}: quantized loss {loss:.7f}, exact {exact:.7f}, bound {bound:.3g}")
            if abs(loss - theirs) > bound:
                failures.append(f"{name} step {step}: loss {loss:.7f}, plain stage 3 {theirs:.7f}, bound {bound:.3g}")
        if rank == 0 and os.environ.get("QWZ_NUMERICS_REPORT"):
            print(f"[qwz numerics] {name}: max |L - exact| / bound "
                  f"{max(abs(loss - exact) / bound for loss, exact, bound in steps):.3f}, max |L - plain| / bound "
                  f"{max(abs(step[0] - theirs) / step[2] for step, theirs in zip(steps, plain)):.3f}, max |L - plain| "
                  f"{max(abs(step[0] - theirs) for step, theirs in zip(steps, plain)):.3g}, "
                  f"bounds {min(step[2] for step in steps):.3g}-{max(step[2] for step in steps):.3g}, "
                  f"rank 0 CPU so far {sum(os.times()[:2]):.1f} s")
    return failures


def exact_gathers_worker(rank: int, world_size: int) -> list[str]:
    """GatheredParameters and the consolidated state dict read the exact partitions, as official's
    GatheredParameters does; the forward's gathers are quantized."""
    failures = []
    for name, keys in KEYS.items():
        initial = build_trapnet(spare=False)
        model = copy.deepcopy(initial)
        engine, *_ = nano.initialize(model=model, model_parameters=decay_groups(model, WEIGHT_DECAY),
                                     config=config(keys))
        if not any(isinstance(buffer, QuantizedGathers) for buffer in engine.optimizer.buffers):
            failures.append(f"{name}: no buffer gathers quantized")
        with nano.zero.GatheredParameters(list(model.parameters())):
            for (parameter_name, mine), theirs in zip(model.named_parameters(), initial.parameters()):
                if not torch.equal(mine, theirs):
                    failures.append(f"{name} {parameter_name}: GatheredParameters is not exact")
        state = engine._zero3_consolidated_16bit_state_dict()
        if rank == 0:
            for key, value in initial.state_dict().items():
                if not torch.equal(state[key], value):
                    failures.append(f"{name} {key}: the consolidated state dict is not exact")
        captured = {}
        def capture(module, args):  # after nano's own pre-forward hook: gathered; returns None, the input stays
            captured.setdefault("weight", module.weight.detach().clone())

        handle = model.blocks[0].linear.register_forward_pre_hook(capture)
        with torch.no_grad():
            engine(token_batch(0, 0, rank, MICRO_SIZE)[:, :-1])
        handle.remove()
        difference = (captured["weight"] - initial.blocks[0].linear.weight).abs().max().item()
        bound = initial.blocks[0].linear.weight.abs().max().item() / LEVELS
        if not 0 < difference <= bound:
            failures.append(f"{name}: the forward's weight differs by {difference:.3g} (quantized: 0 < it <= {bound:.3g})")
    return failures
