"""Per-rank bodies for stage 3, each held to the single-process AdamW reference of TrapNet."""

from __future__ import annotations

import copy
import itertools

import torch

import zero_lab.nano as nano
from tests.nano.stage3_reference import (TokenReference, build_trapnet, decay_groups, token_batch, token_loss)
from tests.nano.workers import LR, WEIGHT_DECAY, nano_config

STEPS, MICRO_SIZE, TOLERANCE = 3, 2, 1e-5


def stage3_config(persistence: int = 10, **options) -> dict:
    """Stage 3 with the norms' biases and weights (6 elements) persistent, the rest sharded."""
    config = nano_config(3, **options)
    config["zero_optimization"].update(stage3_param_persistence_threshold=persistence, stage3_max_reuse_distance=0)
    return config


def compare_whole(model, reference, failures, label, steps_done: int):
    """Gather every parameter, as a user would read them, and compare with the reference. The spare
    block gets no gradient: DeepSpeed (and nano) count it as zero, so only AdamW's decoupled decay
    moves its matrix, where torch.optim skips a parameter without a gradient."""
    with nano.zero.GatheredParameters(model.parameters()):
        used = [(mine, theirs) for (name, mine), theirs in zip(model.named_parameters(), reference.model.parameters())
                if not name.startswith("spare.")]
        difference = max((mine.detach().float() - theirs.detach().float()).abs().max().item() for mine, theirs in used)
        spare, start = model.spare[0].linear.weight.detach().float(), reference.model.spare[0].linear.weight.float()
        decayed = (spare - start * (1 - LR * WEIGHT_DECAY) ** steps_done).abs().max().item()
    if not difference <= TOLERANCE or not decayed <= TOLERANCE:
        failures.append(f"{label}: max |nano - reference| = {difference:.3g}, spare off its decay by {decayed:.3g}")


def train(model, config, rank, world_size, reference, failures, label, between_steps=None):
    engine, *_ = nano.initialize(model=model, model_parameters=decay_groups(model, WEIGHT_DECAY), config=config)
    accumulation = config["gradient_accumulation_steps"]
    for step in range(STEPS):
        for micro in range(accumulation):
            engine.backward(token_loss(engine, token_batch(step, micro, rank, MICRO_SIZE)))
            engine.step()
        reference.step(step, world_size, accumulation, MICRO_SIZE)
        compare_whole(model, reference, failures, f"{label} step {step}", step + 1)
        if between_steps is not None:
            between_steps(engine, step)
    if engine.optimizer.gathering.live_numel():
        failures.append(f"{label}: {engine.optimizer.gathering.live_numel()} elements still gathered after training")
    return engine


def parity_cases() -> list[dict]:
    """Accumulation, clipping, both reduce paths, overlap (prefetch), buckets smaller than a
    parameter, and activation checkpointing: 16 cases."""
    cases = []
    for (accumulation, clipping), reduce_scatter, (overlap, bucket), checkpointed in itertools.product(
            ((1, 0.0), (3, 0.05)), (True, False), ((False, 500_000_000), (True, 5)), (False, True)):
        cases.append(dict(accumulation=accumulation, clipping=clipping, reduce_scatter=reduce_scatter,
                          overlap=overlap, bucket=bucket, checkpointed=checkpointed))
    return cases


def parity_worker(rank: int, world_size: int) -> list[str]:
    """Tied weights, a block called twice, a block never used, and the cases above."""
    failures = []
    for case in parity_cases():
        options = dict(case)
        checkpointed = options.pop("checkpointed")
        initial = build_trapnet(checkpointed=checkpointed)
        reference = TokenReference(initial, LR, WEIGHT_DECAY, case["clipping"])
        train(copy.deepcopy(initial), stage3_config(**options), rank, world_size, reference, failures,
              f"world size {world_size} {case}")
    return failures


def eval_forward_worker(rank: int, world_size: int) -> list[str]:
    """A forward under torch.no_grad() and one in eval mode with no backward, between steps: nothing
    stays gathered after either, and training stays exact."""
    failures = []
    initial = build_trapnet()
    reference = TokenReference(initial, LR, WEIGHT_DECAY, 0.0)

    def evaluate(engine, step):
        with torch.no_grad():
            engine(token_batch(step, 9, rank, MICRO_SIZE))
        engine.eval()
        with torch.no_grad():
            engine(token_batch(step, 8, rank, MICRO_SIZE))
        engine.train()
        if engine.optimizer.gathering.live_numel() or engine.memory_breakdown()["gathered_parameters"]:
            failures.append(f"step {step}: an evaluation left {engine.optimizer.gathering.live_numel()} elements gathered")

    train(copy.deepcopy(initial), stage3_config(), rank, world_size, reference, failures, "eval", evaluate)
    return failures


def unused_parameters_worker(rank: int, world_size: int) -> list[str]:
    """The spare block gets no gradient: AdamW's decay alone moves it (the reference agrees); with
    ignore_unused_parameters false the error names it."""
    failures = []
    model = build_trapnet()
    try:
        engine, *_ = nano.initialize(model=model, config=stage3_config(ignore_unused=False))
        engine.backward(token_loss(engine, token_batch(0, 0, rank, MICRO_SIZE)))
        failures.append("ignore_unused_parameters=false did not raise")
    except nano.NanoConfigError as error:
        if "spare" not in str(error):
            failures.append(f"the error does not name the spare block: {error}")
    return failures


def modifier_rank_worker(rank: int, world_size: int) -> list[str]:
    """GatheredParameters(modifier_rank=0): rank 0's edit reaches every rank and survives the next
    steps (the fp32 master follows in bf16 too); without modifier_rank an edit is dropped."""
    failures = []
    for precision in ("fp32", "bf16"):
        model = build_trapnet()
        engine, *_ = nano.initialize(model=model, config=stage3_config(precision=precision))
        with nano.zero.GatheredParameters(model.embed.weight, modifier_rank=0):
            if rank == 0:
                model.embed.weight.data.fill_(0.5)
        with nano.zero.GatheredParameters([model.blocks[0].linear.weight]):
            model.blocks[0].linear.weight.data.fill_(7.0)  # not kept: no modifier rank
        with nano.zero.GatheredParameters(model.parameters()):
            embed = model.embed.weight.detach().float().clone()
            linear = model.blocks[0].linear.weight.detach().float().clone()
        if not torch.all(embed == 0.5) or torch.any(linear == 7.0):
            failures.append(f"{precision}: embed all 0.5: {bool(torch.all(embed == 0.5))}, "
                            f"unkept edit dropped: {not bool(torch.any(linear == 7.0))}")
        engine.optimizer.adam.param_groups[0]["lr"] = 0.0  # a step that changes nothing but decay (none at lr 0)
        engine.backward(token_loss(engine, token_batch(0, 0, rank, MICRO_SIZE)))
        engine.step()
        with nano.zero.GatheredParameters(model.embed.weight):
            if not torch.all(model.embed.weight.float() == 0.5):
                failures.append(f"{precision}: the master did not follow the edit: a step at lr 0 moved it")
    return failures
